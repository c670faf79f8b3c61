#!/usr/bin/env python3
"""Per-call cost of outcore's estimators on small data, against scikit-learn's.

Each call (a fit, or a predict of one row) is timed many times, outcore's
and scikit-learn's alternating, and the medians are reported with their
difference (and the difference of the fastest calls, which other work on
the machine disturbs least): the fixed cost of going through the engine (starting a runtime,
handing the data over, its threads' start and end). Small data is where it
shows: cross-validation, grid searches, serving.

Usage::

    python benches/python_overhead.py [--repeat 30] [--rows 150,20000] [--block 8]

The sizes are iris (150 x 4) and a few MiB of blobs (rows x 32). The
calls alternate in blocks of ``--block`` (8) calls of one library, then
of the other, with ``--pause`` (0.25 s) between blocks: scikit-learn's
OpenMP and OpenBLAS threads spin for a while after its call, so a call
made right after one shares the two cores with them (an outcore fit of
iris took 2-10 ms so, against 2.0-2.6 ms after its own calls).
``--block 1 --pause 0`` alternates call by call.
"""
import argparse
import statistics
import time
import warnings

import numpy as np
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import load_iris, make_blobs
from sklearn.linear_model import LogisticRegression as SkLogistic

import outcore


def _time(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def _cases(rows):
    if rows == 150:
        X, y = load_iris(return_X_y=True)
    else:
        X, y = make_blobs(rows, n_features=32, centers=4, random_state=0)
    X = X.astype(np.float64)
    ok = outcore.KMeans(3, n_init=1, random_state=0).fit(X)
    sk = SkKMeans(3, n_init=1, random_state=0).fit(X)
    one = X[:1]
    return [
        ("KMeans.fit", lambda: outcore.KMeans(3, n_init=1, random_state=0).fit(X),
         lambda: SkKMeans(3, n_init=1, random_state=0).fit(X)),
        ("KMeans.predict(1 row)", lambda: ok.predict(one), lambda: sk.predict(one)),
        ("LogisticRegression.fit", lambda: outcore.LogisticRegression().fit(X, y),
         lambda: SkLogistic().fit(X, y)),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--rows", default="150,20000")
    ap.add_argument("--block", type=int, default=8, help="calls of one library in a row")
    ap.add_argument("--pause", type=float, default=0.25, help="seconds between blocks")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"{'data':>14}  {'call':24} {'outcore ms':>11} {'sklearn ms':>11} {'over ms':>8}"
          f" {'min over':>9}")
    for rows in (int(r) for r in args.rows.split(",")):
        for name, ours, theirs in _cases(rows):
            ours(), theirs()
            a, b = [], []
            block = max(1, args.block)
            while len(a) < args.repeat:
                n = min(block, args.repeat - len(a))
                for calls, f in ((a, ours), (b, theirs)):
                    time.sleep(args.pause)
                    calls.extend(_time(f) for _ in range(n))
            ma, mb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
            # The fastest calls: the fixed cost with the least noise from
            # other work on the machine.
            least = (min(a) - min(b)) * 1e3
            size = f"{rows} rows"
            print(f"{size:>14}  {name:24} {ma:11.2f} {mb:11.2f} {ma - mb:8.2f} {least:9.2f}")


if __name__ == "__main__":
    main()
