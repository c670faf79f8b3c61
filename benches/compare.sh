#!/usr/bin/env bash
# K-means under a memory limit, side by side on the same data and the same
# limit C: outcore (no cap, dispatch-priority cap, LRU cap), OS swap (outcore
# with no cap in a cgroup limited to C, with a swap file), and scikit-learn
# MiniBatchKMeans.partial_fit over np.memmap (in the cgroup and without).
# Every run is set against the physical bound measured in the same run (the
# device's direct-read bandwidth on the data file: fio, O_DIRECT, 1 MiB, 8 in flight,
# or dd iflag=direct bs=1M where fio is missing).
# Then a sweep over overcommit (data / C = 1, 2, 4) for the outcore cap and
# OS swap, and the in-memory comparison (benches/inmemory.py: an outcore
# Lloyd iteration against faiss.Kmeans, the kernel against OpenBLAS sgemm).
# Writes a markdown table and a PNG chart, prints the table.
#
#   sudo bash benches/compare.sh                      # 4 GiB, C = 2 GiB, k = 100, 1000-D
#   sudo bash benches/compare.sh --data 8GiB --cap 4GiB --epochs 4
#   sudo bash benches/compare.sh --no-sweep --out /tmp/results.md
#
# Needs root (swap file, cgroup v1 memory controller, dropping caches,
# installing fio with apt-get when it is missing); it
# creates and removes its own swap file and cgroup. Installs numpy,
# scikit-learn, matplotlib and faiss-cpu in a virtual environment (cached
# under ~/.cache/outcore-bench-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  echo "compare.sh: run as root (it creates a swap file and a cgroup)" >&2
  exit 2
fi
cargo build --release --bin outcore >&2
# fio measures the bound (several reads in flight, as outcore reads);
# without it the bound falls back to dd, one request at a time, which
# this kind of disk serves at a third of the speed.
if ! command -v fio >/dev/null && command -v apt-get >/dev/null; then
  apt-get install -y -qq fio >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq fio) >/dev/null 2>&1 ||
    echo "compare.sh: fio not installed; the bound falls back to dd" >&2
fi
venv="${OUTCORE_BENCH_VENV:-$HOME/.cache/outcore-bench-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import sklearn, matplotlib, numpy, faiss" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q numpy scikit-learn matplotlib faiss-cpu >&2
fi
exec "$venv/bin/python" benches/compare.py "$@"
