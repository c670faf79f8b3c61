"""Run by test_mpi.py: ``sys.argv[1]`` ("KMeans", "KMeans-unseeded",
"LogisticRegression", "Ridge", "PCA", "SGDClassifier" or
"SGDClassifier-unseeded") with ``max_ranks="auto"`` as the script's first
fit, then a KMeans fit on the ranks the first one grew to; writes each
rank's digests, ranks and growth to ``sys.argv[4]/rank-R.json``."""
import hashlib
import json
import os
import sys

import numpy as np

import outcore
from outcore import _core

which, X, y, out_dir = sys.argv[1], np.load(sys.argv[2], mmap_mode="r"), np.load(sys.argv[3]), sys.argv[4]
cap = "4MiB"


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


if which.startswith("KMeans"):
    # Unseeded: each process draws its own seed, and the growth hands
    # rank 0's over to the spawned ranks.
    seed = None if which == "KMeans-unseeded" else 0
    first = outcore.KMeans(n_clusters=5, random_state=seed, n_init=1, mem_cap=cap, max_ranks="auto").fit(X)
    fitted = {"first": digest(first.cluster_centers_, first.labels_)}
elif which == "Ridge":
    first = outcore.Ridge(alpha=0.5, mem_cap=cap, max_ranks="auto").fit(X, y.astype(np.float64))
    fitted = {"first": digest(first.coef_, [first.intercept_])}
elif which == "PCA":
    first = outcore.PCA(n_components=3, mem_cap=cap, max_ranks="auto").fit(X)
    fitted = {"first": digest(first.components_, first.explained_variance_)}
elif which.startswith("SGDClassifier"):
    seed = None if which.endswith("-unseeded") else 0
    first = outcore.SGDClassifier(random_state=seed, max_iter=3, tol=None, mem_cap=cap, max_ranks="auto").fit(X, y)
    fitted = {"first": digest(first.coef_, first.intercept_)}
else:
    first = outcore.LogisticRegression(max_iter=20, mem_cap=cap, max_ranks="auto").fit(X, y)
    fitted = {"first": digest(first.coef_, first.intercept_)}
later = outcore.KMeans(n_clusters=4, random_state=1, n_init=1, mem_cap=cap).fit(X)
fitted["later"] = digest(later.cluster_centers_, later.labels_)
fitted["growth"] = first.stats_.get("growth")
rank, size = _core.mpi_rank()
fitted["ranks"] = size
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(fitted, f)
