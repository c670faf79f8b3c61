"""Run by test_mpi.py under mpirun: fits whose seed each process draws
itself (``random_state=None``, a callable init); writes this rank's
digests to ``sys.argv[2]/rank-R.json``."""
import hashlib
import json
import os
import sys

import numpy as np

import outcore
from outcore import _core

X = np.load(sys.argv[1], mmap_mode="r")
y = (np.asarray(X[:, 0]) > 0).astype(np.int64)


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def rows_of_own_choice(X, k, random_state):
    # Each process's own draw: np.random, not random_state.
    return np.asarray(X[np.sort(np.random.default_rng().choice(len(X), k, replace=False))])


fitted = {}
km = outcore.KMeans(n_clusters=5, n_init=2, mem_cap="4MiB").fit(X)
fitted["KMeans"] = digest(km.cluster_centers_, km.labels_)
km = outcore.KMeans(n_clusters=5, init=rows_of_own_choice, n_init=1, mem_cap="4MiB").fit(X)
fitted["KMeans(init=callable)"] = digest(km.cluster_centers_, km.labels_)
sgd = outcore.SGDClassifier(max_iter=2, tol=None, mem_cap="4MiB").fit(X, y)
fitted["SGDClassifier"] = digest(sgd.coef_)
pca = outcore.PCA(n_components=2, svd_solver="randomized", mem_cap="4MiB").fit(X)
fitted["PCA(randomized)"] = digest(pca.components_)
rank, size = _core.mpi_rank()
with open(os.path.join(sys.argv[2], f"rank-{rank}.json"), "w") as f:
    json.dump(fitted, f)
