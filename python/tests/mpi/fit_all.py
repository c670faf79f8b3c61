"""Run by test_mpi.py, on one process or under mpirun: fits every
estimator to the memmap ``sys.argv[1]`` (targets ``sys.argv[2]``) under
the cap ``sys.argv[3]``, and writes this rank's fitted attributes'
bytes, as hex digests, to ``sys.argv[4]/rank-R.json``."""
import hashlib
import json
import os
import sys

import numpy as np

import outcore
from outcore import _core

X = np.load(sys.argv[1], mmap_mode="r")
y = np.load(sys.argv[2])
cap, out_dir = sys.argv[3], sys.argv[4]


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


fitted = {}
km = outcore.KMeans(n_clusters=5, random_state=0, n_init=1, mem_cap=cap).fit(X)
fitted["KMeans"] = digest(km.cluster_centers_, km.labels_, [km.inertia_, km.n_iter_])
mb = outcore.MiniBatchKMeans(n_clusters=5, random_state=0, batch_size=4096, max_iter=3,
                             mem_cap=cap).fit(X)
fitted["MiniBatchKMeans"] = digest(mb.cluster_centers_, mb.labels_)
lr = outcore.LogisticRegression(max_iter=20, mem_cap=cap).fit(X, y)
fitted["LogisticRegression"] = digest(lr.coef_, lr.intercept_, lr.n_iter_)
lin = outcore.Ridge(alpha=0.5, mem_cap=cap).fit(X, y.astype(np.float64))
fitted["Ridge"] = digest(lin.coef_, [lin.intercept_])
pca = outcore.PCA(n_components=3, mem_cap=cap).fit(X)
fitted["PCA"] = digest(pca.components_, pca.explained_variance_, pca.mean_)
sgd = outcore.SGDClassifier(random_state=0, max_iter=3, tol=None, mem_cap=cap).fit(X, y)
fitted["SGDClassifier"] = digest(sgd.coef_, sgd.intercept_)
fitted["stats_evictions"] = km.stats_["evictions"]

rank, size = _core.mpi_rank()
fitted["ranks"] = size
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(fitted, f)
