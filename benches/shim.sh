#!/usr/bin/env bash
# malloc/free throughput with and without the LD_PRELOAD shim (pass-through:
# no runtime in the process, no cap), side by side, best of 5 runs each,
# interleaved. Prints ns per malloc+free pair and the ratio.
#   bash benches/shim.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p outcore-shim >/dev/null
so="$PWD/target/release/liboutcore_shim.so"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -pthread -o "$tmp/bench" alloc-shim/bench/malloc_bench.c
for threads in 1 2; do
  best_plain=999999; best_shim=999999
  for _ in 1 2 3 4 5; do
    p=$("$tmp/bench" "$threads"); s=$(LD_PRELOAD="$so" "$tmp/bench" "$threads")
    best_plain=$(python3 -c "print(min($best_plain, $p))")
    best_shim=$(python3 -c "print(min($best_shim, $s))")
  done
  python3 -c "print(f'threads {$threads}: glibc {$best_plain:.2f} ns/op, with shim {$best_shim:.2f} ns/op, ratio {$best_shim/$best_plain:.3f}')"
done
