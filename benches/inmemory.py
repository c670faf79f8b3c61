#!/usr/bin/env python3
"""In-memory speed, side by side on the same data, init and cores: an
outcore Lloyd iteration against faiss.Kmeans (pip faiss-cpu) and, when
it is installed, scikit-learn-intelex's KMeans (pip
scikit-learn-intelex: oneDAL; per iteration, the difference between a
fit of all the iterations and a fit of one, so that its input checks
and conversion are left out), and the
distance step's arithmetic rate against OpenBLAS sgemm (numpy's matmul) on
the K-means shape (task rows x D times D x k).

The distance step's rate is given two ways: over the whole iteration
(which also adds every row to its centre's sums and folds the tasks'
partial sums), and over the time the tasks spent in the distance kernel
itself (`epoch_kernel_seconds` in the run's stats, summed over the worker
threads, so divided by their number: the kernel's share of the
iteration's wall time when the workers run side by side).

    python3 benches/inmemory.py                  # 512 MiB, k = 100, 1000-D, 5 iterations, 3 rounds
    python3 benches/inmemory.py --data 1GiB --k 256 --iterations 8 --rounds 5

Each round runs outcore, faiss and sgemm one after the other; the table
gives each one's median over the rounds, and the faiss / outcore ratio is
also given round by round (on a shared virtual machine the speed of a
core swings by a third from minute to minute, so one pair of runs can land
on either side of a target).

Needs numpy and faiss-cpu, and a release build of outcore
(cargo build --release -p outcore-jobs --bin outcore). Prints a markdown
table; nothing is asserted (the machine is shared and noisy: compare the
ratios, measured in the same run).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTCORE = os.path.join(ROOT, "target", "release", "outcore")


def size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def run(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{args[0]} failed: {r.stderr.strip()}")
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="512MiB")
    p.add_argument("--dims", type=int, default=1000)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--task-points", type=int, default=1100)
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of outcore, faiss and sgemm, one after the other")
    p.add_argument("--outcore", default=OUTCORE,
                   help="the outcore binary (another build, for a before/after run)")
    a = p.parse_args()
    import faiss

    threads = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        x_path = os.path.join(tmp, "x.npy")
        run([a.outcore, "gen", "--synthetic", a.data, "--dims", str(a.dims), "--output", x_path])
        x = np.load(x_path)
        n, d = x.shape
        rng = np.random.default_rng(0)
        init = x[rng.choice(n, a.k, replace=False)].copy()
        init_path = os.path.join(tmp, "init.npy")
        np.save(init_path, init)

        stats = os.path.join(tmp, "s.json")
        blk = x[: a.task_points]
        c = init
        flops_blk = 2.0 * blk.shape[0] * d * a.k
        flops = 2.0 * n * d * a.k
        oc_iters, oc_kernels, fa_iters, sg_blks, sg_alls = [], [], [], [], []
        ex_iters = []
        try:
            from sklearnex.cluster import KMeans as ExKMeans
        except ImportError:
            ExKMeans = None
        for _ in range(max(1, a.rounds)):
            # outcore: Lloyd, every iteration, no cap.
            run([a.outcore, "kmeans", "--input", x_path, "--init", init_path, "--algorithm", "lloyd",
                 "--iterations", str(a.iterations), "--tol", "0", "--mem-cap", "none",
                 "--task-points", str(a.task_points), "--stats", stats])
            s = json.load(open(stats))
            oc = sorted(s["epoch_seconds"][1:] or s["epoch_seconds"])
            oc_iters.append(oc[len(oc) // 2])
            kern = sorted(s["epoch_kernel_seconds"][1:] or s["epoch_kernel_seconds"])
            oc_kernels.append(kern[len(kern) // 2] / s["workers"])

            # faiss: the same init, no subsampling, the same number of iterations.
            km = faiss.Kmeans(d, a.k, niter=a.iterations, verbose=False,
                              max_points_per_centroid=n, seed=1)
            t = time.perf_counter()
            km.train(x, init_centroids=init)
            fa_iters.append((time.perf_counter() - t) / a.iterations)

            # scikit-learn-intelex: the same init, Lloyd, no tolerance; a
            # fit of one iteration taken from one of them all (its input
            # checks and conversion).
            if ExKMeans is not None:
                fits = []
                for m in (1, a.iterations):
                    ex = ExKMeans(a.k, init=init, n_init=1, max_iter=m, tol=0, algorithm="lloyd")
                    t = time.perf_counter()
                    ex.fit(x)
                    fits.append((time.perf_counter() - t, ex.n_iter_))
                (t1, n1), (tn, nn) = fits
                # A fit that converged early ran other iterations than
                # asked: its difference would mean nothing.
                if n1 == 1 and nn == a.iterations:
                    ex_iters.append((tn - t1) / (nn - n1))
                else:
                    print(f"sklearnex converged after {nn} of {a.iterations} iterations: not timed",
                          file=sys.stderr)

            # OpenBLAS sgemm on the distance step's shape, one task block at
            # a time as outcore computes it, and on the whole data at once.
            reps = max(20, int(2e10 / flops_blk))
            blk @ c.T
            t = time.perf_counter()
            for _ in range(reps):
                blk @ c.T
            sg_blks.append(flops_blk * reps / (time.perf_counter() - t) / 1e9)
            t = time.perf_counter()
            x @ c.T
            sg_alls.append(flops / (time.perf_counter() - t) / 1e9)

        def median(v):
            v = sorted(v)
            return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

        oc_iter, oc_kernel, fa_iter = median(oc_iters), median(oc_kernels), median(fa_iters)
        sg_blk, sg_all = median(sg_blks), median(sg_alls)
        oc_rate = flops / oc_iter / 1e9
        kernel_rate = flops / oc_kernel / 1e9
        pairs = [f / o for f, o in zip(fa_iters, oc_iters)]

    rounds = len(oc_iters)
    print(f"| {a.data} ({n} x {d}), k = {a.k}, {threads} threads, median of {rounds} rounds | seconds per Lloyd iteration | GFLOP/s (2 n d k / time) |")
    print("|---|---|---|")
    print(f"| outcore (median of iterations 2..{a.iterations}) | {oc_iter:.3f} | {oc_rate:.1f} |")
    print(f"| outcore's distance kernel alone (its seconds per iteration / {s['workers']} workers) | {oc_kernel:.3f} | {kernel_rate:.1f} |")
    print(f"| faiss.Kmeans {faiss.__version__} | {fa_iter:.3f} | {2.0 * n * d * a.k / fa_iter / 1e9:.1f} |")
    if ex_iters:
        ex_iter = median(ex_iters)
        print(f"| sklearnex KMeans (oneDAL; iterations 2..n) | {ex_iter:.3f} | {flops / ex_iter / 1e9:.1f} |")
    print(f"| OpenBLAS sgemm, {a.task_points}-row blocks | | {sg_blk:.1f} |")
    print(f"| OpenBLAS sgemm, all rows at once | | {sg_all:.1f} |")
    print()
    if ex_iters:
        print(f"sklearnex / outcore per iteration: {median(ex_iters) / oc_iter:.2f} (round by round: "
              f"{', '.join(f'{e / o:.2f}' for e, o in zip(ex_iters, oc_iters))})")
    print(f"faiss / outcore per iteration: {fa_iter / oc_iter:.2f} (round by round: "
          f"{', '.join(f'{r:.2f}' for r in pairs)}); outcore / sgemm (blocks): "
          f"{oc_rate / sg_blk:.2f} per iteration, {kernel_rate / sg_blk:.2f} for the kernel alone")
    # The same work: the objective of each assignment (before the update),
    # iteration by iteration. They part when a cluster empties: faiss
    # splits a large cluster to refill it, outcore (as scikit-learn) keeps
    # the empty centre where it is.
    oc_obj = s["epoch_inertia"]
    both = min(len(oc_obj), len(km.obj))
    print("objective per iteration (outcore / faiss):",
          ", ".join(f"{oc_obj[i]:.6e} / {km.obj[i]:.6e}" for i in range(both)))


if __name__ == "__main__":
    main()
