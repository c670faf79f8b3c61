"""The estimators under ``mpirun``: the same bytes on 1, 2 and 3 ranks as
in one process, on a memmap 4x each rank's cap, and a fit that fails on
one rank ending every rank with one exception.

They need the module built with MPI (``MATURIN_PEP517_ARGS="--features
mpi" pip install ./python``) and ``mpirun``; without them they are
skipped, unless ``OUTCORE_REQUIRE_MPI=1`` (CI), which makes that a
failure."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from outcore import _core

HERE = Path(__file__).resolve().parent / "mpi"
# Each rank's cap; the data is 4x what a rank holds of it on 3 ranks.
CAP = "4MiB"
ROWS, DIMS = 200_000, 64


def _need_mpi():
    mpirun = shutil.which("mpirun")
    if _core.mpi_built() and mpirun:
        return mpirun
    why = "outcore was built without MPI" if mpirun else "mpirun is missing"
    if os.environ.get("OUTCORE_REQUIRE_MPI") == "1":
        pytest.fail(f"{why} (OUTCORE_REQUIRE_MPI=1)")
    pytest.skip(why)


def _env(tmp):
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TMPDIR=str(tmp), PYTHONWARNINGS="ignore")
    # A single process, not one of the test runner's ranks.
    for v in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]:
        env.pop(v, None)
    return env


def _run(cmd, env, timeout=300):
    """`cmd` with a watchdog: a hang is a failure, not a stuck CI."""
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not end within {timeout} s: {e.stderr}")


def _mpirun(mpirun, n):
    return [mpirun, "-np", str(n), "--oversubscribe", "--mca", "btl", "self,vader,tcp"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("mpi-data")
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=4, size=(5, DIMS))
    X = np.lib.format.open_memmap(d / "X.npy", mode="w+", dtype=np.float32, shape=(ROWS, DIMS))
    for a in range(0, ROWS, 50_000):
        n = min(50_000, ROWS - a)
        X[a:a + n] = centres[rng.integers(0, 5, n)] + rng.normal(size=(n, DIMS))
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    X.flush()
    del X
    np.save(d / "y.npy", y)
    return d / "X.npy", d / "y.npy"


def _fitted(out):
    return {p.name: json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))}


def test_every_rank_gets_one_process_bytes(data, tmp_path):
    mpirun = _need_mpi()
    X, y = data
    script = str(HERE / "fit_all.py")
    one = tmp_path / "one"
    one.mkdir()
    r = _run([sys.executable, script, str(X), str(y), CAP, str(one)], _env(tmp_path))
    assert r.returncode == 0, r.stderr
    base = _fitted(one)["rank-0.json"]
    assert base["ranks"] == 1
    # The data is 4x a rank's cap on 3 ranks: every run evicts.
    assert base["stats_evictions"] > 0
    keys = [k for k in base if k not in ("ranks", "stats_evictions")]
    for n in (1, 2, 3):
        out = tmp_path / f"np{n}"
        out.mkdir()
        r = _run(_mpirun(mpirun, n) + [sys.executable, script, str(X), str(y), CAP, str(out)],
                 _env(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        ranks = _fitted(out)
        assert sorted(ranks) == [f"rank-{i}.json" for i in range(n)], ranks
        for name, got in ranks.items():
            assert got["ranks"] == n, (name, got)
            differ = [k for k in keys if got[k] != base[k]]
            assert not differ, f"{n} ranks, {name}: {differ} differ from one process"
    # Nothing left behind: spill directories, copies.
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("outcore")]
    assert not left, left


def test_seeds_each_process_draws_are_rank_0s_on_every_rank(data, tmp_path):
    mpirun = _need_mpi()
    X, _ = data
    out = tmp_path / "out"
    out.mkdir()
    r = _run(_mpirun(mpirun, 2) + [sys.executable, str(HERE / "unseeded.py"), str(X), str(out)],
             _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = _fitted(out)
    assert len(ranks) == 2, ranks
    assert ranks["rank-0.json"] == ranks["rank-1.json"], ranks


def test_a_nan_on_one_rank_ends_every_rank_with_one_exception(data, tmp_path):
    mpirun = _need_mpi()
    X, _ = data
    bad = tmp_path / "Xnan.npy"
    Xn = np.load(X)
    # Rank 1's rows (the second half on 2 ranks) only.
    Xn[ROWS - 10, 3] = np.nan
    np.save(bad, Xn)
    del Xn
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    r = _run(_mpirun(mpirun, 2) + [sys.executable, str(HERE / "nan_on_one_rank.py"), str(bad)],
             _env(scratch), timeout=120)
    assert r.returncode != 0
    assert "fitted" not in r.stdout
    raised = [ln for ln in r.stderr.splitlines() if ln.startswith("ValueError:")]
    assert len(raised) == 1, r.stderr
    assert f"rank 1 of 2: Input X contains NaN at row {ROWS - 10}, column 3" in raised[0], raised
    left = list(scratch.iterdir())
    assert not left, left


def test_mpi4py_initialised_first_shares_its_world(data, tmp_path):
    mpirun = _need_mpi()
    pytest.importorskip("mpi4py")
    X, _ = data
    code = (
        "from mpi4py import MPI\n"
        "import sys, numpy as np, outcore\n"
        "from outcore import _core\n"
        "X = np.load(sys.argv[1], mmap_mode='r')\n"
        "km = outcore.KMeans(n_clusters=5, random_state=0, n_init=1, mem_cap='4MiB').fit(X)\n"
        "c = MPI.COMM_WORLD\n"
        "assert _core.mpi_rank() == (c.rank, c.size)\n"
        "got = c.allgather(km.cluster_centers_.tobytes())\n"
        "assert all(g == got[0] for g in got)\n"
        "if c.rank == 0: print('same', c.size, np.frombuffer(got[0], np.float32)[:2])\n"
    )
    r = _run(_mpirun(mpirun, 2) + [sys.executable, "-c", code, str(X)], _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "same 2" in r.stdout


@pytest.mark.parametrize("which", ["KMeans", "KMeans-unseeded", "LogisticRegression", "Ridge", "PCA",
                                   "SGDClassifier", "SGDClassifier-unseeded"])
def test_a_script_on_one_rank_grows_onto_free_slots_with_the_same_bytes(data, tmp_path, which):
    mpirun = _need_mpi()
    X, y = data
    script = str(HERE / "grow.py")
    one = tmp_path / "one"
    one.mkdir()
    env = _env(tmp_path)
    r = _run([sys.executable, script, which, str(X), str(y), str(one)], env)
    assert r.returncode == 0, r.stderr
    base = _fitted(one)["rank-0.json"]
    assert base["ranks"] == 1 and not base["growth"], base
    grown = tmp_path / "grown"
    grown.mkdir()
    # One rank started, 4 slots in the allocation (MPI_UNIVERSE_SIZE).
    cmd = [mpirun, "-np", "1", "--host", "localhost:4", "--mca", "btl", "self,vader,tcp"]
    r = _run(cmd + [sys.executable, script, which, str(X), str(y), str(grown)], env)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = _fitted(grown)
    assert len(ranks) >= 3, (ranks, r.stderr[-2000:])
    for name, got in ranks.items():
        assert got["ranks"] == len(ranks), (name, got)
        assert got["growth"] and got["growth"][0]["from"] == 1, got
        assert got["growth"][0]["to"] == len(ranks), got
        if which.endswith("-unseeded"):
            # A seed of its own: every rank's the same, not one process's.
            assert got["first"] == ranks["rank-0.json"]["first"], f"{name} differs from rank 0"
            continue
        assert got["first"] == base["first"], f"{name}: the grown fit differs from one process"
        assert got["later"] == base["later"], f"{name}: the later fit differs from one process"
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("outcore")]
    assert not left, left


def _long_fit_under_way(X, tmp_path):
    """mpirun -np 2 of a long K-means fit, once both ranks have their
    spill directory in a TMPDIR of its own: mpirun's process, the
    directories, the TMPDIR, and a marker in the ranks' command lines."""
    mpirun = _need_mpi()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    marker = f"long-fit-{os.getpid()}-{tmp_path.name}"
    code = (
        f"# {marker}\n"
        "import sys, numpy as np, outcore\n"
        "X = np.load(sys.argv[1], mmap_mode='r')\n"
        "outcore.KMeans(n_clusters=50, n_init=1, max_iter=100000, tol=0, random_state=0,\n"
        "               mem_cap='4MiB').fit(X)\n"
    )
    p = subprocess.Popen(_mpirun(mpirun, 2) + [sys.executable, "-c", code, str(X)],
                         env=_env(scratch), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        spills = [q for q in scratch.iterdir() if q.name.startswith("outcore-spill")]
        if len(spills) == 2:
            time.sleep(0.5)
            return p, spills, scratch, marker
        if p.poll() is not None:
            pytest.fail(f"the fit ended early: {p.communicate()}")
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    pytest.fail(f"no fit under way after 120 s: {list(scratch.iterdir())}")


def _ended(p, marker, what):
    """Waits for mpirun's end (60 s at most), then checks that no rank is
    left."""
    try:
        p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"mpirun did not end within 60 s of {what}")
    assert p.returncode != 0
    time.sleep(0.5)
    ranks = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert not ranks, f"ranks left after {what}: {ranks}"


def test_ctrl_c_on_mpirun_leaves_no_rank_and_no_file(data, tmp_path):
    p, _, scratch, marker = _long_fit_under_way(data[0], tmp_path)
    p.send_signal(signal.SIGINT)
    _ended(p, marker, "Ctrl-C")
    left = list(scratch.iterdir())
    assert not left, left


def test_a_killed_rank_ends_the_others_and_they_leave_no_file(data, tmp_path):
    p, spills, scratch, marker = _long_fit_under_way(data[0], tmp_path)
    # The spill directory's name holds its process's id.
    pids = sorted(int(q.name.split("-")[-2]) for q in spills)
    os.kill(pids[-1], signal.SIGKILL)
    _ended(p, marker, "SIGKILL to one rank")
    # The killed rank's directory stays (no process can act on SIGKILL:
    # the next runtime in the same directory removes it); the other
    # rank, ended by mpirun's SIGTERM, removed its own.
    left = sorted(q.name for q in scratch.iterdir())
    assert left == [q.name for q in spills if int(q.name.split("-")[-2]) == pids[-1]], left


def test_a_missing_mpi_library_is_one_clear_import_error(tmp_path):
    _need_mpi()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("hiding the MPI library needs root and unshare(1)")
    ldd = subprocess.run(["ldd", _core.__file__], capture_output=True, text=True).stdout
    lib = next((ln.split("=>")[1].split()[0] for ln in ldd.splitlines() if "libmpi.so" in ln), None)
    assert lib, ldd
    lib = os.path.realpath(lib)
    # The library replaced by an empty file, in a mount namespace of the
    # child's own.
    script = f"mount --bind /dev/null {lib} && exec {sys.executable} -c 'import outcore'"
    r = _run(["unshare", "-m", "sh", "-c", script], _env(tmp_path), timeout=60)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: outcore was built with MPI, but the MPI library cannot be loaded"), r.stderr
    assert "reinstall outcore without MPI" in last, last


def test_outcore_mpi_off_keeps_each_rank_to_itself(data, tmp_path):
    mpirun = _need_mpi()
    X, _ = data
    code = (
        "import sys, numpy as np, outcore\n"
        "from outcore import _core\n"
        "X = np.load(sys.argv[1], mmap_mode='r')[:5000]\n"
        "km = outcore.KMeans(n_clusters=3, n_init=1, random_state=0).fit(X)\n"
        # One file per rank: two ranks' prints share mpirun's stdout, and an
        # unbuffered Python writes a print's pieces one by one.
        "import os\n"
        "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
        "with open(os.path.join(sys.argv[2], 'alone.' + rank), 'w') as f:\n"
        "    f.write(f\"alone {_core.mpi_rank()} {km.stats_['ranks']}\")\n"
    )
    env = _env(tmp_path)
    env["OUTCORE_MPI"] = "off"
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-c", code, str(X), str(out)]
    r = _run(_mpirun(mpirun, 2) + ["-x", "OUTCORE_MPI"] + cmd, env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = sorted((f.name, f.read_text()) for f in out.iterdir())
    assert got == [("alone.0", "alone (0, 1) 1"), ("alone.1", "alone (0, 1) 1")], got


# A K-means fit of argv[1] under the cap argv[3]; rank 0 writes its centres
# and statistics into the directory argv[2].
_KMEANS_TO = (
    "import sys, json, numpy as np, outcore\n"
    "from outcore import _core\n"
    "X = np.load(sys.argv[1], mmap_mode='r')\n"
    "km = outcore.KMeans(n_clusters=5, n_init=1, random_state=0, algorithm='lloyd',\n"
    "                    max_iter=4, tol=0, mem_cap=sys.argv[3]).fit(X)\n"
    "if _core.mpi_rank()[0] == 0:\n"
    "    np.save(sys.argv[2] + '/c.npy', km.cluster_centers_)\n"
    "    with open(sys.argv[2] + '/s.json', 'w') as f:\n"
    "        json.dump(km.stats_, f)\n"
)


def _one_process(X, tmp_path):
    """`_KMEANS_TO` on one process, without mpirun: its directory."""
    one = tmp_path / "one"
    one.mkdir()
    r = _run([sys.executable, "-c", _KMEANS_TO, str(X), str(one), CAP], _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    return one


def test_a_lender_beside_two_ranks_gives_one_process_centres(data, tmp_path):
    """``python -m outcore.lend`` beside the ranks: their evictions go to
    its memory and come back from it, and the centres are one process's."""
    mpirun = _need_mpi()
    X, _ = data
    code = _KMEANS_TO
    one = _one_process(X, tmp_path)
    out = tmp_path / "lent"
    out.mkdir()
    lend = [":", "-np", "1", sys.executable, "-m", "outcore.lend", "--mem-cap", "256MiB"]
    r = _run(_mpirun(mpirun, 2) + [sys.executable, "-c", code, str(X), str(out), CAP] + lend,
             _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "s.json").read_text())
    assert s["lenders"] == 1, s
    assert s["remote_bytes_loaded"] > 0 and s["remote_fallbacks"] == 0, s
    assert [l for l in r.stderr.splitlines() if l.startswith("outcore lend:")], r.stderr
    assert np.array_equal(np.load(out / "c.npy"), np.load(one / "c.npy"))


def test_a_rank_with_room_to_spare_keeps_another_ranks_evictions(data, tmp_path):
    """Two ranks given different caps (``mpirun``'s ``:``): the first's
    evictions go to the second's spare memory and come back from it, and
    the centres are one process's."""
    mpirun = _need_mpi()
    X, _ = data
    code = _KMEANS_TO
    one = _one_process(X, tmp_path)
    out = tmp_path / "shared"
    out.mkdir()
    rank = [sys.executable, "-c", code, str(X), str(out)]
    cmd = [mpirun, "--oversubscribe", "--mca", "btl", "self,vader,tcp", "-np", "1", *rank, CAP,
           ":", "-np", "1", *rank, "512MiB"]
    r = _run(cmd, _env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "s.json").read_text())
    p = s["per_process"]
    assert s["lenders"] == 0, s
    assert p[1]["remote_bytes_kept"] > 0 and p[0]["remote_bytes_kept"] == 0, p
    assert p[0]["remote_bytes_loaded"] > 0 and s["remote_fallbacks"] == 0, s
    assert np.array_equal(np.load(out / "c.npy"), np.load(one / "c.npy"))


def test_a_lender_needs_mpirun(tmp_path):
    """Started on its own, a lender says why in one line and exits 2."""
    env = _env(tmp_path)
    r = _run([sys.executable, "-m", "outcore.lend"], env, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("outcore: error:"), r.stderr
