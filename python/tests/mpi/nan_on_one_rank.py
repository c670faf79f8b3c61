"""Run by test_mpi.py under mpirun: a K-means fit of the memmap
``sys.argv[1]``, which holds a NaN in the last rank's rows only."""
import sys

import numpy as np

import outcore

X = np.load(sys.argv[1], mmap_mode="r")
outcore.KMeans(n_clusters=5, random_state=0, n_init=1, mem_cap="4MiB").fit(X)
print("fitted")
