#!/usr/bin/env python3
"""outcore's Ridge, LinearRegression, PCA and SGDRegressor against their
peers (scikit-learn in memory, scikit-learn's out-of-core ways over a
memmap, dask-ml on a memory-limited LocalCluster) on a .npy 4x the cap,
side by side in one run.

    pip install ./python dask-ml distributed
    sudo python3 benches/fit_peers.py                      # 1 GiB float32 (8,388,608 x 32), 256 MiB cap
    sudo python3 benches/fit_peers.py --quick              # 1/16 the size (64 MiB under 16 MiB): a smoke test
    sudo python3 benches/fit_peers.py --rows 4194304 --dims 64 --cap 256MiB --only "outcore PCA,dask-ml PCA"

The data (float32, --rows x --dims, Gaussian with column scales from 3
down to 0.3 under a random rotation, so that PCA has a spectrum to find;
y = X w + 0.5 noise, w of magnitudes 0.5 to 2) is written block by block
to --dir (default a temporary directory), with a held-out test set of
65,536 rows; all of it is removed at the end. Each contender runs in a
fresh interpreter, page cache dropped first (when root, unless
--no-drop-caches):

1. least squares: outcore `Ridge(alpha=1.0)` and `LinearRegression` from
   the .npy path under the cap; scikit-learn's `LinearRegression` and
   `Ridge(alpha=1.0)` on the data loaded whole (`np.load`); dask-ml's
   `LinearRegression` (an iterative GLM solver, --dask-solver, default
   lbfgs, its default l2 penalty with C = 1.0) on a dask array of the
   file on a `LocalCluster(n_workers=--dask-workers,
   memory_limit=cap / workers)`. Quality: R^2 on the test set, and the
   largest relative difference of a coefficient from scikit-learn's
   (`LinearRegression`'s, or `Ridge`'s for the Ridges).
2. PCA(n_components=8): outcore from the path under the cap;
   scikit-learn `PCA(8, svd_solver="covariance_eigh")` in memory (the
   reference); scikit-learn `IncrementalPCA(8)` with `partial_fit` over
   --batch-row blocks of `np.load(path, mmap_mode="r")`; dask-ml
   `PCA(8, svd_solver=--dask-pca-solver)` on the cluster. Quality: the
   largest relative difference of `explained_variance_` from the
   reference's, and the explained variance ratio's sum.
3. SGDRegressor(max_iter=5, tol=None, random_state=0): outcore from the
   path under the cap; scikit-learn's `fit` in memory, and its
   `partial_fit` over memmap blocks of --batch rows, 5 epochs. Quality:
   R^2 on the test set.

The dask array is `da.from_array` over a reader that opens
`np.load(path, mmap_mode="r")` in the task that reads a chunk (--chunk
rows), so the workers read the file themselves: a `np.memmap` itself
in the graph would be pickled whole to the scheduler and the workers
(numpy pickles a memmap as an in-memory array of all its data).

Seconds: from the file to the fitted model (the in-memory contenders'
`np.load` is counted; dask's cluster start-up is not). Peak resident
set: the larger of the child's `ru_maxrss` (from `wait4`) and the sum of
the resident sets of the child and all its descendants, sampled every
0.1 s (for dask: the client, in-process scheduler, nannies and
workers), as `top` would show them. "x outcore" is the time against
outcore's same estimator. A contender that fails (an exception, a
killed worker, --timeout) is printed as "failed: <its last line>".
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wholerun import drop_caches, size  # noqa: E402

import numpy as np  # noqa: E402

TEST_ROWS = 1 << 16
PAGE = os.sysconf("SC_PAGE_SIZE")

# The reader dask's arrays read a .npy with (a child's source text).
NPY_READER = '''
class NpyReader:
    """What da.from_array needs of an array, reading rows from the .npy
    through a memmap opened by the task itself (pickled as its path)."""
    def __init__(self, path):
        m = np.load(path, mmap_mode="r")
        self.path, self.shape, self.dtype, self.ndim = path, m.shape, m.dtype, m.ndim
    def __getitem__(self, key):
        m = np.load(self.path, mmap_mode="r")
        out = np.array(m[key])
        del m
        return out
'''

# The child's prelude: settings, the dask reader and cluster, the result.
PRELUDE = '''
import json, os, sys, time, traceback
import numpy as np
''' + NPY_READER + '''

def dask_array(path, chunk):
    import dask.array as da
    r = NpyReader(path)
    chunks = (chunk,) + r.shape[1:]
    return da.from_array(r, chunks=chunks, name="npy-" + os.path.basename(path) + str(chunk), asarray=False)

def cluster():
    from dask.distributed import Client, LocalCluster
    c = LocalCluster(n_workers=WORKERS, threads_per_worker=max(1, (os.cpu_count() or 1) // WORKERS),
                     memory_limit=DASK_LIMIT // WORKERS, processes=True, dashboard_address=None)
    return Client(c)

def blocks(X, batch):
    for s in range(0, len(X), batch):
        yield s, X[s:s + batch]

def main():
    OUT = {}
    try:
        BODY
        OUT["seconds"] = time.perf_counter() - t
        for k in ("coef_", "intercept_", "explained_variance_", "explained_variance_ratio_", "stats_"):
            if hasattr(est, k):
                v = getattr(est, k)
                OUT[k] = v if isinstance(v, dict) else np.asarray(v, dtype=np.float64).tolist()
    except BaseException as e:
        traceback.print_exc()
        line = (str(e).strip().splitlines() or [""])[0]
        OUT = {"error": f"{type(e).__name__}: {line}"[:200]}
    with open(RESULT, "w") as f:
        json.dump(OUT, f)
    sys.stdout.flush()
    os._exit(0)  # no waiting on a cluster's shutdown

if __name__ == "__main__":
    main()
'''

# name: (section, outcore contender it is timed against, body). The body
# sets `t` (time.perf_counter() at the start of the fit) and `est`.
CONTENDERS = {
    "Python, numpy, scikit-learn and outcore imported (baseline)": (0, None, """
import outcore, sklearn.linear_model, sklearn.decomposition
t = time.perf_counter()
est = None
"""),
    "dask LocalCluster started, idle (baseline)": (0, None, """
import dask.array, dask_ml.linear_model, dask_ml.decomposition
client = cluster()
t = time.perf_counter()
est = None
"""),
    # 1. Least squares.
    "outcore LinearRegression (path)": (1, None, """
import outcore
y = np.load(YPATH)
t = time.perf_counter()
est = outcore.LinearRegression(mem_cap=CAP, n_jobs=JOBS, spill_dir=SPILL).fit(PATH, y)
"""),
    "outcore Ridge(alpha=1.0) (path)": (1, None, """
import outcore
y = np.load(YPATH)
t = time.perf_counter()
est = outcore.Ridge(alpha=1.0, mem_cap=CAP, n_jobs=JOBS, spill_dir=SPILL).fit(PATH, y)
"""),
    "scikit-learn LinearRegression (in memory)": (1, "outcore LinearRegression (path)", """
from sklearn.linear_model import LinearRegression
y = np.load(YPATH)
t = time.perf_counter()
X = np.load(PATH)
est = LinearRegression().fit(X, y)
"""),
    "scikit-learn Ridge(alpha=1.0) (in memory)": (1, "outcore Ridge(alpha=1.0) (path)", """
from sklearn.linear_model import Ridge
y = np.load(YPATH)
t = time.perf_counter()
X = np.load(PATH)
est = Ridge(alpha=1.0).fit(X, y)
"""),
    "dask-ml LinearRegression (LocalCluster)": (1, "outcore LinearRegression (path)", """
from dask_ml.linear_model import LinearRegression
client = cluster()
X, y = dask_array(PATH, CHUNK), dask_array(YPATH, CHUNK)
t = time.perf_counter()
est = LinearRegression(solver=DASK_SOLVER).fit(X, y)
"""),
    # 2. PCA.
    "outcore PCA(8) (path)": (2, None, """
import outcore
t = time.perf_counter()
est = outcore.PCA(NCOMP, mem_cap=CAP, n_jobs=JOBS, spill_dir=SPILL).fit(PATH)
"""),
    "scikit-learn PCA(8, covariance_eigh) (in memory)": (2, "outcore PCA(8) (path)", """
from sklearn.decomposition import PCA
t = time.perf_counter()
X = np.load(PATH)
est = PCA(NCOMP, svd_solver="covariance_eigh").fit(X)
"""),
    "scikit-learn IncrementalPCA(8) (partial_fit over memmap)": (2, "outcore PCA(8) (path)", """
from sklearn.decomposition import IncrementalPCA
t = time.perf_counter()
X = np.load(PATH, mmap_mode="r")
est = IncrementalPCA(NCOMP, batch_size=BATCH)
for s, b in blocks(X, BATCH):
    if len(b) >= NCOMP:
        est.partial_fit(b)
"""),
    "dask-ml PCA(8) (LocalCluster)": (2, "outcore PCA(8) (path)", """
from dask_ml.decomposition import PCA
client = cluster()
X = dask_array(PATH, CHUNK)
t = time.perf_counter()
est = PCA(NCOMP, svd_solver=DASK_PCA_SOLVER, random_state=0).fit(X)
"""),
    # 3. SGD.
    "outcore SGDRegressor (path)": (3, None, """
import outcore
y = np.load(YPATH)
t = time.perf_counter()
est = outcore.SGDRegressor(max_iter=EPOCHS, tol=None, random_state=0, mem_cap=CAP, n_jobs=JOBS,
                           spill_dir=SPILL).fit(PATH, y)
"""),
    "scikit-learn SGDRegressor (in memory)": (3, "outcore SGDRegressor (path)", """
from sklearn.linear_model import SGDRegressor
y = np.load(YPATH)
t = time.perf_counter()
X = np.load(PATH)
est = SGDRegressor(max_iter=EPOCHS, tol=None, random_state=0).fit(X, y)
"""),
    "scikit-learn SGDRegressor (partial_fit over memmap, 5 epochs)": (3, "outcore SGDRegressor (path)", """
from sklearn.linear_model import SGDRegressor
y = np.load(YPATH)
t = time.perf_counter()
X = np.load(PATH, mmap_mode="r")
est = SGDRegressor(random_state=0)
for _ in range(EPOCHS):
    for s, b in blocks(X, BATCH):
        est.partial_fit(b, y[s:s + len(b)])
"""),
}

SECTIONS = {
    0: "Baselines (the interpreter; an idle dask cluster)",
    1: "Least squares",
    2: "PCA(n_components=8)",
    3: "SGDRegressor(max_iter=5, tol=None)",
}


def write_data(d, rows, dims, seed=0):
    """x.npy, y.npy (float32) and the test set; returns their paths."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(dims, dims)))
    mix = np.linspace(3.0, 0.3, dims)[:, None] * q  # row i of Z scaled, rotated
    w = rng.uniform(0.5, 2.0, dims) * rng.choice([-1.0, 1.0], dims)
    paths = {k: os.path.join(d, f"{k}.npy") for k in ("x", "y", "test_x", "test_y")}

    def write(xp, yp, n):
        with open(xp, "wb") as fx, open(yp, "wb") as fy:
            np.lib.format.write_array_header_2_0(fx, {"descr": "<f4", "fortran_order": False, "shape": (n, dims)})
            np.lib.format.write_array_header_2_0(fy, {"descr": "<f4", "fortran_order": False, "shape": (n,)})
            for start in range(0, n, 1 << 16):
                m = min(1 << 16, n - start)
                x = (rng.normal(size=(m, dims)) @ mix).astype("<f4")
                y = x.astype(np.float64) @ w + 3.0 + 0.5 * rng.normal(size=m)
                fx.write(x.tobytes())
                fy.write(y.astype("<f4").tobytes())

    write(paths["x"], paths["y"], rows)
    write(paths["test_x"], paths["test_y"], TEST_ROWS)
    return paths


def tree_rss(root):
    """Resident bytes of `root` and all its descendants (0 once gone)."""
    parent = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
            parent[int(p)] = int(s[s.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in tree and p not in tree}
        tree |= new
        grew = bool(new)
    total = 0
    for p in tree:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            pass
    return total


def run(name, paths, a, work):
    """Runs one contender in a fresh interpreter; returns (result dict or
    None, peak resident bytes, error line)."""
    settings = {
        "PATH": paths["x"], "YPATH": paths["y"], "CAP": a.cap, "CAPB": size(a.cap), "JOBS": a.jobs,
        "SPILL": os.path.join(work, "spill"), "BATCH": a.batch, "CHUNK": a.chunk, "EPOCHS": a.epochs,
        "NCOMP": a.components, "WORKERS": a.dask_workers, "DASK_LIMIT": size(a.dask_memory_limit), "DASK_SOLVER": a.dask_solver,
        "DASK_PCA_SOLVER": a.dask_pca_solver, "RESULT": os.path.join(work, "result.json"),
    }
    body = textwrap.indent(CONTENDERS[name][2].strip(), " " * 8)
    code = "".join(f"{k} = {v!r}\n" for k, v in settings.items()) + PRELUDE.replace("        BODY", body)
    runner = os.path.join(work, "runner.py")
    with open(runner, "w") as f:
        f.write(code)
    if os.path.exists(settings["RESULT"]):
        os.remove(settings["RESULT"])
    os.makedirs(settings["SPILL"], exist_ok=True)
    if a.drop_caches:
        drop_caches()
    err_path = os.path.join(work, "stderr.txt")
    with open(err_path, "w") as err:
        p = subprocess.Popen([sys.executable, runner], stdout=subprocess.DEVNULL, stderr=err,
                             cwd=work, start_new_session=True)
    peak, start, timed_out = 0, time.monotonic(), False
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, tree_rss(p.pid))
        if time.monotonic() - start > a.timeout and not timed_out:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)
        time.sleep(0.1)
    p.returncode = 0  # reaped above
    try:  # what the child's session left behind (dask workers)
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    peak = max(peak, usage.ru_maxrss * 1024)
    shutil.rmtree(settings["SPILL"], ignore_errors=True)
    if timed_out:
        restarts = open(err_path).read().count("memory budget. Restarting")
        why = f"; a worker restarted {restarts} times at 95% of its memory limit" if restarts else ""
        return None, peak, f"timed out after {a.timeout:.0f} s{why}"
    try:
        with open(settings["RESULT"]) as f:
            out = json.load(f)
    except (OSError, ValueError):
        lines = [ln for ln in open(err_path).read().splitlines() if ln.strip()]
        why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
        return None, peak, (lines[-1].strip() if lines else why)[:200] + f" ({why})"
    if "error" in out:
        return None, peak, out["error"]
    return out, peak, ""


def r2(out, tx, ty):
    pred = tx @ np.asarray(out["coef_"]).ravel() + np.ravel(out["intercept_"])[0]
    return 1 - ((ty - pred) ** 2).sum() / ((ty - ty.mean()) ** 2).sum()


def max_rel(v, ref):
    v, ref = np.asarray(v, dtype=np.float64).ravel(), np.asarray(ref, dtype=np.float64).ravel()
    if v.shape != ref.shape:
        return float("nan")
    return float(np.max(np.abs(v - ref) / np.abs(ref)))


def quality(name, out, results, tx, ty):
    """The quality cell: R^2 and coefficient agreement, or explained
    variance agreement."""
    if out is None:
        return ""
    section = CONTENDERS[name][0]
    if section in (1, 3):
        q = f"R^2 {r2(out, tx, ty):.5f}"
        if section == 1:
            ref = ("scikit-learn Ridge(alpha=1.0) (in memory)" if "Ridge" in name
                   else "scikit-learn LinearRegression (in memory)")
            if name == ref:
                q += "; coef: the reference"
            elif results.get(ref):
                q += f"; coef max rel diff {max_rel(out['coef_'], results[ref]['coef_']):.1e}"
        return q
    if section == 2:
        ref = "scikit-learn PCA(8, covariance_eigh) (in memory)"
        q = f"EV ratio sum {sum(out['explained_variance_ratio_']):.4f}"
        if name == ref:
            return q + "; EV: the reference"
        if results.get(ref):
            q += f"; EV max rel diff {max_rel(out['explained_variance_'], results[ref]['explained_variance_']):.1e}"
        return q
    return ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8_388_608)
    p.add_argument("--dims", type=int, default=32)
    p.add_argument("--cap", default="256MiB", help="outcore's mem_cap, and the dask cluster's memory limit")
    p.add_argument("--quick", action="store_true", help="1/16 the rows and the cap (a smoke test)")
    p.add_argument("--jobs", type=int, default=None, help="outcore's n_jobs")
    p.add_argument("--components", type=int, default=8)
    p.add_argument("--epochs", type=int, default=5, help="SGD epochs")
    p.add_argument("--batch", type=int, default=None,
                   help="rows per partial_fit block (default: 1/64 of the cap's worth of rows)")
    p.add_argument("--chunk", type=int, default=None,
                   help="rows per dask chunk (default: 1/16 of the cap's worth of rows)")
    p.add_argument("--dask-workers", type=int, default=1, help="LocalCluster workers (the cap split between them)")
    p.add_argument("--dask-solver", default="lbfgs", help="dask-ml LinearRegression solver (admm, lbfgs, ...)")
    p.add_argument("--dask-pca-solver", default="tsqr", help="dask-ml PCA svd_solver (tsqr, randomized)")
    p.add_argument("--dask-memory-limit", default=None,
                   help="the dask cluster's memory limit, split between its workers (default: the cap)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per contender (default 3600, --quick 90)")
    p.add_argument("--dir", default=None, help="where the data goes (default: a temporary directory)")
    p.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                   help="do not drop the page cache before each contender (it is dropped only as root)")
    p.add_argument("--only", help="comma-separated contenders (prefixes)")
    a = p.parse_args()
    if a.quick:
        a.rows //= 16
        q = size(a.cap) // 16
        a.cap = f"{q >> 20}MiB" if q % (1 << 20) == 0 else str(q)
    a.timeout = a.timeout or (90 if a.quick else 3600)
    a.dask_memory_limit = a.dask_memory_limit or a.cap
    a.drop_caches = a.drop_caches and os.geteuid() == 0
    capb = size(a.cap)
    row_bytes = 4 * a.dims
    a.batch = a.batch or max(a.components + 1, capb // 64 // row_bytes)
    a.chunk = a.chunk or max(a.dims + 1, capb // 16 // row_bytes)
    if a.only:
        want = [o.strip() for o in a.only.split(",")]
        names = [n for n in CONTENDERS if any(n.startswith(o) for o in want)]
    else:
        names = list(CONTENDERS)

    work = tempfile.mkdtemp(prefix="outcore-fit-peers-", dir=a.dir)
    try:
        t = time.perf_counter()
        paths = write_data(work, a.rows, a.dims)
        data = a.rows * row_bytes
        print(f"data: {paths['x']} ({data / 2**20:.0f} MiB float32, {a.rows:,} x {a.dims}, "
              f"{data / capb:.1f}x the cap), written in {time.perf_counter() - t:.1f} s; cap {capb / 2**20:.0f} MiB; "
              f"partial_fit blocks of {a.batch:,} rows, dask chunks of {a.chunk:,} rows on "
              f"{a.dask_workers} worker(s) with {size(a.dask_memory_limit) / 2**20:.0f} MiB in all; page cache {'dropped' if a.drop_caches else 'not dropped'} "
              f"before each run", flush=True)
        tx = np.load(paths["test_x"]).astype(np.float64)
        ty = np.load(paths["test_y"]).astype(np.float64)
        results, rows = {}, []
        for name in names:
            out, rss, err = run(name, paths, a, work)
            results[name] = out
            rows.append((name, out, rss, err))
            took = "failed: " + err if out is None else f"{out['seconds']:.2f} s"
            print(f"{name}: {took}, peak resident {rss / 2**20:.0f} MiB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{a.rows:,} x {a.dims} float32 ({data / 2**20:.0f} MiB), cap {capb / 2**20:.0f} MiB")
    section = None
    for name, out, rss, err in rows:
        sec, ref = CONTENDERS[name][0], CONTENDERS[name][1]
        if sec != section:
            section = sec
            print(f"\n{SECTIONS[sec]}\n\n| method | seconds | peak RSS MiB | RSS/cap | quality | time / outcore's |")
            print("|---|---|---|---|---|---|")
        secs = f"failed: {err}" if out is None else f"{out['seconds']:.2f}"
        ratio = ""
        if out is not None and sec != 0:
            base = results.get(ref or name)
            ratio = f"{out['seconds'] / base['seconds']:.2f}" if base else "n/a"
        print(f"| {name} | {secs} | {rss / 2**20:,.0f} | {rss / capb:.2f} | "
              f"{quality(name, out, results, tx, ty)} | {ratio} |")
    stats = [(n, o["stats_"]) for n, o, _, _ in rows if o and isinstance(o.get("stats_"), dict)]
    if stats:
        print("\noutcore's stats_:")
        for n, s in stats:
            keys = ("peak_bytes", "peak_resident_bytes", "evictions", "bytes_read", "wall_seconds")
            print(f"- {n}: " + ", ".join(
                f"{k} {s[k] / 2**20:,.0f} MiB" if "bytes" in k and isinstance(s[k], (int, float))
                else f"{k} {s[k]}" for k in keys if k in s))


if __name__ == "__main__":
    main()
