#!/usr/bin/env python3
"""outcore's Python estimators against scikit-learn and faiss on a .npy
memmap larger than the cap, side by side in one run (issue 41).

    pip install ./python faiss-cpu
    sudo python3 benches/python_estimators.py                  # 2 GiB, 1 GiB cap
    sudo python3 benches/python_estimators.py --data 512MiB --cap 256MiB

The data (float32 Gaussian blobs, --dims columns) is written once, block
by block, to --dir. Each contender runs in a fresh interpreter, page cache
dropped first (root), on `np.load(path, mmap_mode="r")`:

- outcore MiniBatchKMeans and KMeans (Lloyd) with `mem_cap=--cap`;
- scikit-learn's MiniBatchKMeans, `partial_fit` over the memmap in
  batches (its out-of-core way), and its KMeans (which reads the whole
  memmap);
- faiss.Kmeans (which needs the data as one in-memory float32 array).

All use k = --k, --iters Lloyd iterations (tol 0) or --epochs passes of
batches of --batch rows. Printed: wall seconds and the child's peak
resident set (`ru_maxrss`), and the table for benches/RESULTS.md.
"""
import argparse
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wholerun import drop_caches, size  # noqa: E402

import numpy as np  # noqa: E402

CONTENDERS = {
    "Python, numpy, scikit-learn and outcore imported (baseline)": """
from sklearn.cluster import KMeans
""",
    "outcore MiniBatchKMeans": """
est = outcore.MiniBatchKMeans(K, max_iter=EPOCHS, batch_size=BATCH, max_no_improvement=None,
                              random_state=0, mem_cap=CAP)
est.fit(X)
""",
    "outcore KMeans": """
est = outcore.KMeans(K, max_iter=ITERS, tol=0, n_init=1, random_state=0, mem_cap=CAP)
est.fit(X)
""",
    "scikit-learn MiniBatchKMeans (partial_fit)": """
from sklearn.cluster import MiniBatchKMeans
est = MiniBatchKMeans(K, batch_size=BATCH, random_state=0, n_init=1)
for _ in range(EPOCHS):
    for s in range(0, len(X), BATCH):
        est.partial_fit(X[s:s + BATCH])
""",
    "scikit-learn KMeans": """
from sklearn.cluster import KMeans
est = KMeans(K, max_iter=ITERS, tol=0, n_init=1, random_state=0, algorithm="lloyd").fit(X)
""",
    "faiss.Kmeans": """
import faiss
x = np.ascontiguousarray(X, dtype=np.float32)
est = faiss.Kmeans(x.shape[1], K, niter=ITERS, seed=0)
est.train(x)
""",
}


def write_data(path, nbytes, dims, seed=0):
    rows = nbytes // (4 * dims)
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4, size=(100, dims))
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, dims)})
        for start in range(0, rows, 1 << 16):
            n = min(1 << 16, rows - start)
            block = centres[rng.integers(0, 100, n)] + rng.normal(size=(n, dims))
            f.write(block.astype("<f4").tobytes())


def run(name, path, a):
    code = (
        "import time, numpy as np\n"
        "import outcore\n"
        f"X = np.load({str(path)!r}, mmap_mode='r')\n"
        f"K, ITERS, EPOCHS, BATCH, CAP = {a.k}, {a.iters}, {a.epochs}, {a.batch}, {a.cap!r}\n"
        "t = time.perf_counter()\n" + CONTENDERS[name] + "\nprint(time.perf_counter() - t)\n"
    )
    drop_caches()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    out, err = p.stdout.read(), p.stderr.read()
    if status != 0:
        return None, usage.ru_maxrss * 1024, err.strip().splitlines()[-1] if err.strip() else f"status {status}"
    return float(out.split()[-1]), usage.ru_maxrss * 1024, ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=size, default=2 << 30)
    p.add_argument("--cap", default="1GiB")
    p.add_argument("--dims", type=int, default=100)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--only", help="comma-separated contenders (prefixes)")
    a = p.parse_args()
    path = os.path.join(a.dir, f"outcore-py-bench-{a.data}-{a.dims}.npy")
    if not os.path.exists(path):
        write_data(path, a.data, a.dims)
    print(f"data: {path} ({a.data / 2**30:.2f} GiB, {a.dims} columns), cap {a.cap}, k = {a.k}, "
          f"{a.iters} Lloyd iterations, {a.epochs} mini-batch epochs of {a.batch} rows", flush=True)
    rows = []
    for name in CONTENDERS:
        if a.only and not any(name.startswith(o) for o in a.only.split(",")):
            continue
        t, rss, err = run(name, path, a)
        rows.append((name, t, rss, err))
        print(f"{name}: {'failed: ' + err if t is None else f'{t:.1f} s'}, peak resident {rss / 2**20:.0f} MiB", flush=True)
    print("\n| contender | seconds | peak resident set |\n|---|---|---|")
    for name, t, rss, err in rows:
        print(f"| {name} | {'failed' if t is None else f'{t:.1f}'} | {rss / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
