#!/usr/bin/env python3
"""After the fit, at the rate of a fit's pass: on a memmap under a cap,
each estimator's prediction (or transform) against one pass of its own
fit over the same rows.

    python3 benches/pass_rates.py [--path /var/tmp/pass_X.npy] [--mib 512] [--cap 128MiB] [--repeat 3] [--peers]

The data (float32 Gaussian blobs, 128 columns) is written once to
--path. Every call reads the same file with the page cache warm (the
file is read once first). A fit's pass is its steady one: K-means's
Lloyd iterations after the first, logistic regression's evaluations of
the objective (seconds of its iterations over their evaluations), PCA's
Gram pass. Each figure is the median of --repeat calls. With --peers,
logistic regression's whole fit in memory (10 L-BFGS iterations) against
scikit-learn's and scikit-learn-intelex's, per iteration.
"""
import argparse
import json
import os
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_apply import write_npy  # noqa: E402


def timed(f, repeat):
    """The median seconds of `repeat` calls of f, and its last result."""
    secs, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        secs.append(time.perf_counter() - t)
    return statistics.median(secs), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", default="/var/tmp/pass_X.npy")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--cap", default="128MiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peers", action="store_true", help="also logistic regression in memory against scikit-learn(-intelex)")
    args = ap.parse_args()
    if not os.path.exists(args.path):
        write_npy(args.path, (args.mib << 20) // 512, 128, spread=2)
    import outcore

    warnings.simplefilter("ignore")
    X = np.load(args.path, mmap_mode="r")
    with open(args.path, "rb") as f:
        while f.read(64 << 20):
            pass
    y = (np.arange(X.shape[0]) % 8 % 3).astype(np.int64)
    opts = dict(mem_cap=args.cap, n_jobs=2)
    rows = []

    km = outcore.KMeans(8, n_init=1, max_iter=6, tol=0.0, random_state=0, **opts).fit(X)
    epochs = km.stats_["epoch_seconds"][1:]
    kpass = statistics.median(epochs)
    for name, f in (("KMeans.predict", km.predict), ("KMeans.transform", km.transform)):
        s, _ = timed(lambda: f(X), args.repeat)
        rows.append((name, "Lloyd iteration", kpass, s))

    lr = outcore.LogisticRegression(max_iter=8, tol=0.0, **opts).fit(X, y)
    its = lr.stats_["iterations"]
    lpass = sum(i["seconds"] for i in its[1:]) / max(1, sum(i["evaluations"] for i in its[1:]))
    for name, f in (("LogisticRegression.predict_proba", lr.predict_proba),
                    ("LogisticRegression.decision_function", lr.decision_function)):
        s, _ = timed(lambda: f(X), args.repeat)
        rows.append((name, "objective evaluation", lpass, s))

    pca = outcore.PCA(8, **opts).fit(X)
    ppass = pca.stats_["passes"][-1]["seconds"]
    s, _ = timed(lambda: pca.transform(X), args.repeat)
    rows.append(("PCA.transform", "Gram pass", ppass, s))

    peers = logistic_peers(X, y, args.repeat) if args.peers else []

    gib = X.nbytes / 2**30
    print(f"{X.shape[0]} x {X.shape[1]} float32 ({gib:.2f} GiB), cap {args.cap}, 2 workers")
    print("| call | fit's pass | pass s | call s | call / pass |")
    print("|---|---|---|---|---|")
    for name, what, p, s in rows:
        print(f"| {name} | {what} | {p:.3f} | {s:.3f} | {s / p:.2f} |")
    print(json.dumps({n: {"pass": p, "call": s} for n, _, p, s in rows}))
    if peers:
        print("\nLogistic regression in memory (float32 rows, 3 classes), seconds per iteration:")
        print("| who | iterations | seconds | per iteration |")
        print("|---|---|---|---|")
        for who, n, secs in peers:
            print(f"| {who} | {n} | {secs:.3f} | {secs / max(n, 1):.4f} |")


def logistic_peers(X, y, repeat):
    """Logistic regression by L-BFGS in memory: outcore's, scikit-learn's
    and scikit-learn-intelex's (if installed), the same rows, 10
    iterations, no tolerance: (who, iterations, median seconds)."""
    import outcore
    from sklearn.linear_model import LogisticRegression

    A = np.ascontiguousarray(X)
    out = []
    cases = [("outcore", lambda: outcore.LogisticRegression(max_iter=10, tol=0.0, mem_cap="none", n_jobs=2)),
             ("scikit-learn", lambda: LogisticRegression(max_iter=10, tol=0.0))]
    try:
        from sklearnex.linear_model import LogisticRegression as ExLR
        cases.append(("scikit-learn-intelex", lambda: ExLR(max_iter=10, tol=0.0)))
    except ImportError:
        pass
    for who, make in cases:
        secs, m = timed(lambda: make().fit(A, y), repeat)
        out.append((who, int(np.max(m.n_iter_)), secs))
    return out


if __name__ == "__main__":
    main()
