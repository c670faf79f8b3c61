#!/usr/bin/env python3
"""k-means|| initialisation: outcore's (in memory, and under a cap from
disk with the page cache dropped) against k-means++ (outcore's, on its
sample) and dask-ml's k-means|| on the same rows in memory.

    python3 benches/kmeans_parallel.py --data /var/tmp/x2g.npy --k 100 --cap 512MiB \
        --dask-python /path/to/venv-with-dask-ml/bin/python

The data file is made with `outcore gen --synthetic 2GiB --dims 128
--true-k 100` when missing. Prints one line per run: the
initialisation's seconds, the bytes it read, the final inertia after
three Lloyd iterations. Dropping the page cache needs root (skipped
otherwise). Nothing is asserted: compare the lines of one run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

DASK = r'''
import sys, time, numpy as np, dask, dask.array as da
from dask_ml.cluster.k_means import k_init
from dask_ml.utils import check_random_state
dask.config.set(scheduler="threads", num_workers=2)
X = np.load(sys.argv[1])
k, rounds = int(sys.argv[2]), sys.argv[3]
Xd = da.from_array(X, chunks=(262144, X.shape[1])).persist()
for r in range(2):
    t = time.time()
    c = np.asarray(k_init(Xd, k, init="k-means||", random_state=check_random_state(r),
                          max_iter=None if rounds == "auto" else int(rounds), oversampling_factor=2))
    print(f"dask-ml k-means|| ({rounds} rounds), in memory: init {time.time() - t:.2f} s", flush=True)
'''


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def outcore(binary, data, k, init, cap):
    with tempfile.TemporaryDirectory() as d:
        stats = os.path.join(d, "s.json")
        subprocess.run([binary, "kmeans", "--algorithm", "lloyd", "--input", data, "--k", str(k),
                        "--init", init, "--mem-cap", cap, "--iterations", "3", "--stats", stats],
                       check=True, capture_output=True)
        s = json.load(open(stats))
    where = "in memory" if cap == "none" else f"under {cap}"
    print(f"outcore {init}, {where}: init {s['init_seconds']:.2f} s, read "
          f"{s['init_bytes_read'] / 2**30:.2f} GiB, inertia {s['inertia']:.6e}, "
          f"peak {s['peak_resident_bytes'] / 2**20:.0f} MiB", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/var/tmp/x2g.npy")
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--cap", default="512MiB")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--outcore", default="target/release/outcore")
    p.add_argument("--dask-python", default=None, help="a Python with dask-ml (skipped without)")
    p.add_argument("--dask-rounds", default="2", help="dask-ml's init_max_iter: a number or auto")
    a = p.parse_args()
    if not os.path.exists(a.data):
        subprocess.run([a.outcore, "gen", "--synthetic", "2GiB", "--dims", "128", "--true-k", str(a.k),
                        "--output", a.data], check=True)
    for _ in range(a.rounds):
        for init in ("k-means++", "k-means||"):
            outcore(a.outcore, a.data, a.k, init, "none")
            drop_caches()
            outcore(a.outcore, a.data, a.k, init, a.cap)
    if a.dask_python:
        subprocess.run([a.dask_python, "-c", DASK, a.data, str(a.k), a.dask_rounds], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
