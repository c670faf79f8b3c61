#!/usr/bin/env bash
# Soak test (not in CI): K-means under a memory cap, over and over for
# DURATION seconds (default 1800), with random fault injection:
#   - random caps, policies and worker counts;
#   - OUTCORE_FAULT_WRITE_EVERY=N: every Nth spill write fails as if the
#     disk were full (the executors must stay in memory, intact);
#   - now and then a Ctrl-C in the middle of a run (the spill files must be
#     removed).
# Every completed run must produce centroids byte-identical to the uncapped
# reference. Prints one line per run; exits non-zero at the first failure.
#
#   bash benches/soak.sh            # 30 minutes
#   DURATION=300 bash benches/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin outcore >&2
bin=$PWD/target/release/outcore
work=$(mktemp -d /var/tmp/outcore-soak.XXXXXX)
trap 'rm -rf "$work"' EXIT
duration=${DURATION:-1800}
common=(kmeans --synthetic 192MiB --dims 48 --k 16 --true-k 16 --epochs 2 --seed 9 --partitions 24)
"$bin" "${common[@]}" --mem-cap none --workers 2 --output "$work/ref.npy" 2>/dev/null
end=$((SECONDS + duration))
runs=0
while [ $SECONDS -lt $end ]; do
  runs=$((runs + 1))
  cap=$((16 + RANDOM % 96))MiB
  policy=$([ $((RANDOM % 2)) -eq 0 ] && echo priority || echo lru)
  fault=$([ $((RANDOM % 3)) -eq 0 ] && echo 0 || echo $((2 + RANDOM % 15)))
  spill="$work/spill"; mkdir -p "$spill"
  rm -f "$work/out.npy"
  if [ $((runs % 5)) -eq 0 ]; then
    # Interrupt this one part-way through.
    OUTCORE_FAULT_WRITE_EVERY=$fault "$bin" "${common[@]}" --mem-cap "$cap" --policy "$policy" \
      --workers 2 --spill-dir "$spill" --output "$work/out.npy" 2>/dev/null &
    pid=$!
    sleep "0.$((2 + RANDOM % 7))"
    kill -INT "$pid" 2>/dev/null || true
    code=0; wait "$pid" || code=$?
    left=$(find "$spill" -mindepth 1 | wc -l)
    if [ "$code" -ne 0 ] && [ "$code" -ne 130 ]; then echo "run $runs: interrupted run exited $code" >&2; exit 1; fi
    if [ "$left" -ne 0 ]; then echo "run $runs: $left spill files left after Ctrl-C" >&2; exit 1; fi
    echo "run $runs: cap $cap, $policy, fault every $fault: interrupted (exit $code), spill directory clean"
    continue
  fi
  OUTCORE_FAULT_WRITE_EVERY=$fault "$bin" "${common[@]}" --mem-cap "$cap" --policy "$policy" \
    --workers 2 --spill-dir "$spill" --output "$work/out.npy" --stats "$work/s.json" 2>"$work/err.txt" \
    || { echo "run $runs: failed:" >&2; cat "$work/err.txt" >&2; exit 1; }
  if ! cmp -s "$work/ref.npy" "$work/out.npy"; then
    echo "run $runs: cap $cap, $policy, fault every $fault: centroids differ from the reference" >&2
    exit 1
  fi
  stats=$(python3 -c "import json; s=json.load(open('$work/s.json'))['runtime']; print(f\"evictions {s['evictions']}, failed writes {s['failed_writes']}, loads {s['loads']}\")")
  echo "run $runs: cap $cap, $policy, fault every $fault: identical centroids; $stats"
done
echo "soak: $runs runs in $duration s, all correct"
