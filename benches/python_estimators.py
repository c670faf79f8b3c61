#!/usr/bin/env python3
"""outcore's Python estimators against scikit-learn, scikit-learn-intelex
and faiss on a .npy memmap larger than the cap, side by side in one run
(issue 41).

    pip install ./python faiss-cpu scikit-learn-intelex
    sudo python3 benches/python_estimators.py                  # 2 GiB, 1 GiB cap
    sudo python3 benches/python_estimators.py --data 512MiB --cap 256MiB

The data (float32 Gaussian blobs, --dims columns) is written once, block
by block, to --dir. Each contender runs in a fresh interpreter, page cache
dropped first (root), on `np.load(path, mmap_mode="r")`:

- outcore MiniBatchKMeans and KMeans (Lloyd) with `mem_cap=--cap`;
- scikit-learn's MiniBatchKMeans, `partial_fit` over the memmap in
  batches (its out-of-core way), and its KMeans (which reads the whole
  memmap);
- scikit-learn-intelex's KMeans (`sklearnex.cluster.KMeans`);
- faiss.Kmeans (which needs the data as one in-memory float32 array);
- LogisticRegression (L-BFGS, --lr-iters iterations, tol 0) from outcore
  (`mem_cap=--cap`), scikit-learn and scikit-learn-intelex
  (`sklearnex.linear_model.LogisticRegression`), on the same memmap with
  integer labels (blob index mod --classes, a small .npy beside the data).

All k-means use k = --k, --iters Lloyd iterations (tol 0) or --epochs
passes of batches of --batch rows. Printed: wall seconds of the fit and the
child's peak resident set up to the end of the fit (`ru_maxrss`), for
logistic regression also the iterations run and the training accuracy
(scored after the peak is taken), and the tables for benches/RESULTS.md.
A contender whose modules cannot be imported is reported as skipped.
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

# sklearnex logs, per call, whether oneDAL ran it or scikit-learn did
# (a fallback); the run prints those lines.
SKLEARNEX_LOG = """
import logging
logging.basicConfig(format="sklearnex: %(message)s")
logging.getLogger("sklearnex").setLevel(logging.INFO)
"""

# name: (imports, fit). The imports run before the timer; when they raise,
# the contender is skipped with the reason.
CONTENDERS = {
    "Python, numpy, scikit-learn and outcore imported (baseline)": ("""
import outcore
from sklearn.cluster import KMeans
""", ""),
    "outcore MiniBatchKMeans": ("import outcore", """
est = outcore.MiniBatchKMeans(K, max_iter=EPOCHS, batch_size=BATCH, max_no_improvement=None,
                              random_state=0, mem_cap=CAP)
est.fit(X)
"""),
    "outcore KMeans": ("import outcore", """
est = outcore.KMeans(K, max_iter=ITERS, tol=0, n_init=1, random_state=0, mem_cap=CAP)
est.fit(X)
"""),
    "scikit-learn MiniBatchKMeans (partial_fit)": ("from sklearn.cluster import MiniBatchKMeans", """
est = MiniBatchKMeans(K, batch_size=BATCH, random_state=0, n_init=1)
for _ in range(EPOCHS):
    for s in range(0, len(X), BATCH):
        est.partial_fit(X[s:s + BATCH])
"""),
    "scikit-learn KMeans": ("from sklearn.cluster import KMeans", """
est = KMeans(K, max_iter=ITERS, tol=0, n_init=1, random_state=0, algorithm="lloyd").fit(X)
"""),
    "sklearnex KMeans": ("from sklearnex.cluster import KMeans" + SKLEARNEX_LOG, """
est = KMeans(K, max_iter=ITERS, tol=0, n_init=1, random_state=0, algorithm="lloyd").fit(X)
"""),
    "faiss.Kmeans": ("import faiss", """
x = np.ascontiguousarray(X, dtype=np.float32)
est = faiss.Kmeans(x.shape[1], K, niter=ITERS, seed=0)
est.train(x)
"""),
    "outcore LogisticRegression": ("import outcore", """
est = outcore.LogisticRegression(max_iter=LR_ITERS, tol=0, mem_cap=CAP).fit(X, y)
"""),
    "scikit-learn LogisticRegression": ("from sklearn.linear_model import LogisticRegression", """
est = LogisticRegression(max_iter=LR_ITERS, tol=0).fit(X, y)
"""),
    "sklearnex LogisticRegression": ("from sklearnex.linear_model import LogisticRegression" + SKLEARNEX_LOG, """
est = LogisticRegression(max_iter=LR_ITERS, tol=0).fit(X, y)
"""),
}


def write_data(path, labels_path, nbytes, dims, classes, seed=0):
    """The blobs to `path`, and each row's blob index mod `classes` to
    `labels_path` (int64)."""
    rows = nbytes // (4 * dims)
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4, size=(100, dims))
    labels = np.empty(rows, dtype=np.int64)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, dims)})
        for start in range(0, rows, 1 << 16):
            n = min(1 << 16, rows - start)
            blob = rng.integers(0, 100, n)
            block = centres[blob] + rng.normal(size=(n, dims))
            f.write(block.astype("<f4").tobytes())
            labels[start:start + n] = blob % classes
    np.save(labels_path, labels)


def child_code(name, path, labels_path, a):
    imports, fit = CONTENDERS[name]
    return (
        "import resource, sys, time, numpy as np\n"
        "try:\n" + "".join(f"    {line}\n" for line in imports.strip().splitlines()) +
        "except Exception as e:\n"
        "    print('SKIP', f'{type(e).__name__}: {e}'.splitlines()[0])\n"
        "    sys.exit(0)\n"
        f"X = np.load({str(path)!r}, mmap_mode='r')\n"
        f"y = np.load({str(labels_path)!r})\n"
        f"K, ITERS, EPOCHS, BATCH, CAP, LR_ITERS = {a.k}, {a.iters}, {a.epochs}, {a.batch}, {a.cap!r}, {a.lr_iters}\n"
        "t = time.perf_counter()\n" + fit + "\n"
        "t = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
        "est = globals().get('est')\n"
        "n_iter = int(np.max(est.n_iter_)) if hasattr(est, 'predict_proba') else -1\n"
        "acc = float(est.score(X, y)) if hasattr(est, 'predict_proba') else -1.0\n"
        "print('RESULT', t, rss, n_iter, acc)\n"
    )


def run(name, path, labels_path, a):
    """(seconds or None, peak resident bytes, iterations, accuracy, note):
    seconds None with the note the reason when it failed or was skipped."""
    drop_caches()
    p = subprocess.Popen([sys.executable, "-c", child_code(name, path, labels_path, a)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    for line in err.splitlines():
        if line.startswith("sklearnex: "):
            print(f"  {line}", flush=True)
    words = out.split()
    if "SKIP" in words:
        return None, 0, None, None, "skipped: " + out[out.index("SKIP") + 5:].strip()
    if p.returncode != 0 or "RESULT" not in words:
        tail = err.strip().splitlines()[-1] if err.strip() else f"status {p.returncode}"
        return None, 0, None, None, "failed: " + tail
    r = out[out.rindex("RESULT"):].split()
    n_iter, acc = int(r[3]), float(r[4])
    return float(r[1]), int(r[2]), (None if n_iter < 0 else n_iter), (None if acc < 0 else acc), ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=size, default=2 << 30)
    p.add_argument("--cap", default="1GiB")
    p.add_argument("--dims", type=int, default=100)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--lr-iters", type=int, default=30, help="L-BFGS iterations of the logistic regressions")
    p.add_argument("--classes", type=int, default=10, help="logistic labels: blob index mod this")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--only", help="comma-separated contenders (prefixes)")
    a = p.parse_args()
    path = os.path.join(a.dir, f"outcore-py-bench-{a.data}-{a.dims}.npy")
    labels_path = os.path.join(a.dir, f"outcore-py-bench-{a.data}-{a.dims}-labels{a.classes}.npy")
    if not (os.path.exists(path) and os.path.exists(labels_path)):
        write_data(path, labels_path, a.data, a.dims, a.classes)
    print(f"data: {path} ({a.data / 2**30:.2f} GiB, {a.dims} columns), cap {a.cap}, k = {a.k}, "
          f"{a.iters} Lloyd iterations, {a.epochs} mini-batch epochs of {a.batch} rows; "
          f"logistic: {a.classes} classes, {a.lr_iters} L-BFGS iterations", flush=True)
    rows = []
    for name in CONTENDERS:
        if a.only and not any(name.startswith(o) for o in a.only.split(",")):
            continue
        t, rss, n_iter, acc, note = run(name, path, labels_path, a)
        rows.append((name, t, rss, n_iter, acc, note))
        extra = "" if acc is None else f", {n_iter} iterations, training accuracy {acc:.4f}"
        print(f"{name}: {note}" if t is None else f"{name}: {t:.1f} s, peak resident {rss / 2**20:.0f} MiB{extra}",
              flush=True)
    print("\n| contender | seconds | peak resident set |\n|---|---|---|")
    for name, t, rss, n_iter, acc, note in rows:
        if "LogisticRegression" not in name:
            print(f"| {name} | {note} | |" if t is None else f"| {name} | {t:.1f} | {rss / 2**20:,.0f} MiB |")
    print("\n| contender | seconds | peak resident set | iterations | training accuracy |\n|---|---|---|---|---|")
    for name, t, rss, n_iter, acc, note in rows:
        if "LogisticRegression" in name:
            if t is None:
                print(f"| {name} | {note} | | | |")
            else:
                print(f"| {name} | {t:.1f} | {rss / 2**20:,.0f} MiB | {n_iter} | {acc:.4f} |")


if __name__ == "__main__":
    main()
