"""scikit-learn MiniBatchKMeans.partial_fit over np.memmap: the baseline
run by benches/compare.py. Prints one JSON object.

usage: python sklearn_kmeans.py DATA.npy K EPOCHS BATCH
"""
import json
import resource
import sys
import time

import numpy as np
from sklearn.cluster import MiniBatchKMeans


def io_read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def main():
    path, k, epochs, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    t0 = time.time()
    x = np.load(path, mmap_mode="r")
    n = x.shape[0]
    km = MiniBatchKMeans(n_clusters=k, batch_size=batch, n_init=1, random_state=0)
    read0 = io_read_bytes()
    epoch_seconds = []
    for _ in range(epochs):
        t = time.time()
        for start in range(0, n, batch):
            km.partial_fit(np.asarray(x[start:start + batch], dtype=np.float32))
        epoch_seconds.append(time.time() - t)
    print(json.dumps({
        "epoch_seconds": epoch_seconds,
        "inertia_estimate": float(km.inertia_) if hasattr(km, "inertia_") else None,
        "bytes_read": io_read_bytes() - read0,
        "bytes_written": 0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "wall_seconds": time.time() - t0,
    }))


if __name__ == "__main__":
    main()
