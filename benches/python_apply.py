#!/usr/bin/env python3
"""After the fit, on a memmap: outcore's predict, transform and
predict_proba against scikit-learn's, from the disk and from the page
cache.

    sudo python3 benches/python_apply.py [--path /work/apply_X.npy] [--mib 256]

The data (float32 Gaussian blobs, 64 columns) is written once to --path
(on a disk: not tmpfs). Both estimators get the same centres and
coefficients (outcore's, fitted on the first 4,096 rows, `mem_cap=64MiB`).
"cold": the page cache is dropped before the call (root); "warm": the
call is made once before the one timed.
"""
import argparse
import os
import subprocess
import sys
import time
import warnings

import numpy as np


def write_npy(path, rows, cols, seed=0, spread=4):
    """A float32 .npy written block by block: eight Gaussian blobs, their
    means `spread` apart on every column."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, cols)})
        for start in range(0, rows, 65536):
            n = min(65536, rows - start)
            f.write((rng.normal(size=(n, cols)) + (np.arange(n) % 8)[:, None] * spread).astype("<f4").tobytes())


def drop_caches():
    subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default="/work/apply_X.npy")
    ap.add_argument("--mib", type=int, default=256, help="size of the data written when --path is missing")
    args = ap.parse_args()
    if not os.path.exists(args.path):
        write_npy(args.path, (args.mib << 20) // 256, 64)

    import outcore
    from sklearn.cluster import KMeans
    from sklearn.linear_model import LogisticRegression

    warnings.simplefilter("ignore")
    X = np.load(args.path, mmap_mode="r")
    sample = np.asarray(X[:4096])
    km = outcore.KMeans(8, n_init=1, random_state=0, mem_cap="64MiB", n_jobs=2).fit(sample)
    lr = outcore.LogisticRegression(mem_cap="64MiB", n_jobs=2, max_iter=20).fit(sample, km.labels_ % 3)
    sk = KMeans(8, n_init=1, random_state=0).fit(sample)
    sk.cluster_centers_ = km.cluster_centers_.astype(np.float32)
    sl = LogisticRegression(max_iter=20).fit(sample, km.labels_ % 3)
    sl.coef_, sl.intercept_ = lr.coef_.copy(), lr.intercept_.copy()
    cases = [("KMeans.predict", km.predict, sk.predict), ("KMeans.transform", km.transform, sk.transform),
             ("LogisticRegression.predict_proba", lr.predict_proba, sl.predict_proba)]
    print(f"{'call':34} {'cache':5} {'outcore s':>10} {'sklearn s':>10}")
    for name, ours, theirs in cases:
        for cold in (True, False):
            times = []
            for f in (ours, theirs):
                if cold:
                    drop_caches()
                else:
                    f(X)
                X = np.load(args.path, mmap_mode="r")
                t = time.perf_counter()
                f(X)
                times.append(time.perf_counter() - t)
            print(f"{name:34} {'cold' if cold else 'warm':5} {times[0]:10.2f} {times[1]:10.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
