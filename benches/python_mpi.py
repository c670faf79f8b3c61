#!/usr/bin/env python3
"""outcore's Python KMeans under mpirun against dask-ml's KMeans on a
LocalCluster of the same processes and memory (issue 56).

Both fit the same .npy (float32, --rows x --dims, about 4x one process's
--cap) from the same initial centres, with tol=0:

- outcore: `mpirun -np P python -c ...` with `outcore.KMeans(init=C,
  n_init=1, max_iter=N, tol=0, mem_cap=CAP).fit(np.load(path,
  mmap_mode="r"))`; each rank has its own cap. Time per iteration: the
  median of the steady passes (`stats_["epoch_seconds"]` from the second
  on).
- dask-ml: `LocalCluster(n_workers=P, threads_per_worker=1,
  memory_limit=CAP)` and `dask_ml.cluster.KMeans(init=C, max_iter=N,
  tol=0)` on `da.from_array` over a reader that opens the memmap inside
  each task (chunks of --chunk rows). Time per iteration: (fit of N
  iterations - fit of 1) / (N - 1), so the set-up is not counted.

Peak RSS per process: `ru_maxrss` of each rank (outcore) or each worker
(dask, `client.run`), the largest reported. Page caches are dropped before
each fit, which needs root.

    python3 -m venv /tmp/daskvenv && /tmp/daskvenv/bin/pip install numpy scikit-learn dask-ml distributed
    sudo python3 benches/python_mpi.py --python /path/to/venv-with-outcore/bin/python \\
        --dask-python /tmp/daskvenv/bin/python --rows 2097152 --dims 64 --cap 128MiB --procs 2,4
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fit_peers import NPY_READER  # noqa: E402
from wholerun import drop_caches, size  # noqa: E402

OUTCORE = r'''
import json, resource, sys
import numpy as np, outcore
from outcore import _core
path, init, cap, iters, out = sys.argv[1:6]
rank, ranks = _core.mpi_rank()
idle = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
X = np.load(path, mmap_mode="r")
C = np.load(init)
km = outcore.KMeans(n_clusters=len(C), init=C, n_init=1, max_iter=int(iters), tol=0,
                    mem_cap=cap).fit(X)
res = {"rank": rank, "ranks": ranks, "epochs": km.stats_["epoch_seconds"], "idle": idle,
       "inertia": float(km.inertia_), "n_iter": int(km.n_iter_),
       "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
with open(f"{out}.{rank}", "w") as f:
    json.dump(res, f)
'''

DASK = r'''
import json, os, resource, sys, time
import numpy as np
''' + NPY_READER + r'''
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

path, init, cap, iters, out, procs, chunk = sys.argv[1:8]
import dask.array as da
from dask.distributed import Client, LocalCluster
from dask_ml.cluster import KMeans
cluster = LocalCluster(n_workers=int(procs), threads_per_worker=1, memory_limit=int(cap),
                       processes=True, dashboard_address=None)
client = Client(cluster)
r = NpyReader(path)
X = da.from_array(r, chunks=(int(chunk), r.shape[1]), name="npy", asarray=False)
C = np.load(init)
res = {"idle": max(client.run(rss).values())}
try:
    t = time.perf_counter()
    km = KMeans(n_clusters=len(C), init=C, max_iter=int(iters), tol=0).fit(X)
    res["seconds"] = time.perf_counter() - t
    # dask-ml's own inertia_ is not the sum of squared distances (16.7x
    # smaller than scikit-learn's on blobs): its centres scored here.
    from dask_ml.metrics.pairwise import pairwise_distances_argmin_min
    _, d = pairwise_distances_argmin_min(X, km.cluster_centers_.astype(np.float32))
    res["inertia"] = float((d.astype(np.float64) ** 2).sum().compute())
    res["n_iter"] = int(km.n_iter_)
    res["rss"] = max(client.run(rss).values())
except Exception as e:
    res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
with open(out, "w") as f:
    json.dump(res, f)
sys.stdout.flush()
os._exit(0)
'''


def make_data(d, rows, dims, k):
    """Blobs around k centres, written in blocks, and k of its rows."""
    path, init = os.path.join(d, "X.npy"), os.path.join(d, "C.npy")
    rng = np.random.default_rng(5)
    centres = rng.normal(scale=4, size=(k, dims)).astype(np.float32)
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dims))
    step = 1 << 16
    for a in range(0, rows, step):
        n = min(step, rows - a)
        X[a:a + n] = centres[rng.integers(0, k, n)] + rng.normal(size=(n, dims)).astype(np.float32)
    np.save(init, np.array(X[rng.choice(rows, k, replace=False)]))
    X.flush()
    del X
    return path, init


def run_outcore(a, path, init, procs, work):
    drop_caches()
    out = os.path.join(work, f"oc{procs}")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONWARNINGS="ignore")
    cmd = ["mpirun", "-np", str(procs), "--oversubscribe", a.python, "-c", OUTCORE,
           path, init, a.cap, str(a.iters), out]
    subprocess.run(cmd, env=env, check=True, timeout=a.timeout)
    ranks = [json.load(open(f"{out}.{r}")) for r in range(procs)]
    steady = sorted(ranks[0]["epochs"][1:]) or ranks[0]["epochs"]
    return {
        "per_iteration": steady[len(steady) // 2],
        "rss": max(r["rss"] for r in ranks),
        "idle": max(r["idle"] for r in ranks),
        "inertia": ranks[0]["inertia"],
        "n_iter": ranks[0]["n_iter"],
    }


def run_dask(a, path, init, procs, work, iters):
    drop_caches()
    out = os.path.join(work, f"dask{procs}-{iters}")
    cmd = [a.dask_python, "-c", DASK, path, init, str(size(a.cap)), str(iters), out, str(procs),
           str(a.chunk)]
    try:
        subprocess.run(cmd, timeout=a.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {a.timeout} s"}
    try:
        return json.load(open(out))
    except (OSError, ValueError):
        return {"error": "no result"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=sys.executable, help="a Python with outcore built with MPI")
    p.add_argument("--dask-python", required=True, help="a Python with dask-ml and distributed")
    p.add_argument("--rows", type=int, default=2 << 20)
    p.add_argument("--dims", type=int, default=64)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--cap", default="128MiB", help="each process's memory")
    p.add_argument("--procs", default="2,4")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--chunk", type=int, default=65536, help="dask's chunk rows")
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--dir", default=None, help="where the data goes (a disk, not tmpfs)")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="python-mpi-", dir=a.dir)
    try:
        path, init = make_data(work, a.rows, a.dims, a.k)
        data = a.rows * a.dims * 4
        print(f"data {data / 2**20:.0f} MiB = {data / size(a.cap):.1f}x one process's cap of {a.cap}; "
              f"k = {a.k}, {a.iters} iterations", flush=True)
        print("| processes | outcore s/iteration | dask-ml s/iteration | dask / outcore | "
              "outcore peak RSS / process (before the fit) | dask peak RSS / worker (idle) | "
              "inertia outcore / dask |")
        print("|---|---|---|---|---|---|---|")
        for procs in [int(x) for x in a.procs.split(",")]:
            oc = run_outcore(a, path, init, procs, work)
            d1 = run_dask(a, path, init, procs, work, 1)
            dn = run_dask(a, path, init, procs, work, a.iters)
            idle = f" ({dn['idle'] / 2**20:.0f} MiB)" if "idle" in dn else ""
            if "error" in d1 or "error" in dn:
                dask, ratio, drss, di = (d1.get("error") or dn.get("error"))[:60], "-", "-", "-"
            else:
                per = (dn["seconds"] - d1["seconds"]) / (a.iters - 1)
                dask, ratio = f"{per:.2f}", f"{per / oc['per_iteration']:.1f}"
                drss, di = f"{dn['rss'] / 2**20:.0f} MiB", f"{oc['inertia'] / dn['inertia']:.6f}"
            print(f"| {procs} | {oc['per_iteration']:.3f} | {dask} | {ratio} | "
                  f"{oc['rss'] / 2**20:.0f} MiB ({oc['idle'] / 2**20:.0f} MiB) | {drss}{idle} | {di} |",
                  flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
