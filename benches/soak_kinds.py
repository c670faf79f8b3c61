"""The soak's other kinds of run (`benches/soak.py`): the PageRank example,
Python fits of `outcore.KMeans`, and spill directories on a small tmpfs
turned read-only mid-run. What is kind-specific lives here: commands,
references, how an output is compared, the tmpfs."""
import collections
import filecmp
import json
import os
import shutil
import signal
import subprocess

MIB = 1 << 20

# argv: the command without the run's own flags (binary first); data: bytes
# the caps are drawn around; out_flag: the output's flag (None: standard
# output); runtime: whether it builds a runtime (which removes dead ones'
# spill directories in its spill parent); kind: "cli", "pagerank" or
# "python".
Config = collections.namedtuple("Config", "argv data out_flag runtime kind")

# Each kind's refusal line: a run refused (cap too small, spill directory
# read-only at the start) ends with exactly one.
ERROR_PREFIX = {"cli": "outcore: error:", "pagerank": "pagerank: error:",
                "python": "python: error:"}

# Python fits are killed (SIGKILL, SIGTERM: the spill and the temporary copy
# stay for the next fit to remove) or interrupted (SIGINT: KeyboardInterrupt,
# which the fit turns into a removal of both).
PY_SIGNALS = [(signal.SIGKILL, 40), (signal.SIGTERM, 40), (signal.SIGINT, 20)]

# The signals PageRank's `remove_spill_on_signal` catches: it removes the
# spill directory and ends by the same signal (-sig, not 128 + sig).
PAGERANK_CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# A fit of `outcore.KMeans` in a child interpreter, with the command
# line's flags.
PY_FIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak_fit.py")


def extra_configs(work, pagerank, python):
    """PageRank (when its binary is there) and the Python fits on a memmap
    and on an in-memory array of the 96 MiB file (when `python` imports
    outcore)."""
    cfgs = {}
    if pagerank:
        cfgs["pagerank"] = Config([pagerank, "--edges", "128MiB", "--nodes", "512K",
                                   "--iters", "6", "--seed", "7"], 128 * MIB, None, True,
                                  "pagerank")
    if python:
        for mode in ("memmap", "array"):
            cfgs[f"py-{mode}"] = Config([python, PY_FIT, "--input", f"{work}/data96.npy",
                                         "--mode", mode], 96 * MIB, "--output", True, "python")
    return cfgs


def python_with_outcore(candidates):
    """The first interpreter of `candidates` that imports outcore, numpy and
    scikit-learn, or None."""
    for py in candidates:
        if py and os.path.exists(py):
            p = subprocess.run([py, "-c", "import outcore, numpy, sklearn"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if p.returncode == 0:
                return py
    return None


def outputs(cfg, base):
    """A run's output flags, output files and standard output file, for the
    outputs' base path `base` (no extension)."""
    if cfg.kind == "cli":
        return [cfg.out_flag, base + ".npy"], [base + ".npy"], None
    if cfg.kind == "pagerank":
        return [], [base + ".json"], base + ".json"
    return ([cfg.out_flag, base], [base + "-centers.npy", base + "-labels.npy"],
            base + ".json")


def last_json(path):
    """The last line of a run's standard output, as JSON (None if none)."""
    try:
        with open(path) as f:
            lines = f.read().strip().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def same_outputs(cfg, got, ref):
    """Whether an exit 0's outputs are the reference's: the same bytes, or
    for PageRank the same digest of the ranks' bits and the same sum."""
    if cfg.kind == "pagerank":
        a, b = last_json(got[0]), last_json(ref[0])
        keys = ("iterations", "digest", "rank_sum", "edges", "nodes", "blocks")
        return a is not None and all(a.get(k) == b.get(k) for k in keys)
    return all(os.path.exists(g) and filecmp.cmp(g, r, shallow=False)
               for g, r in zip(got, ref))


def job_rss_kib(run, cfg):
    """The resident set the cap should hold: the child's peak, or for a
    Python fit the growth during the fit."""
    if cfg.kind != "python":
        return run.get("rss_kib")
    d = last_json(run["stdout"]) if run.get("stdout") else None
    return None if d is None else d["peak_kib"] - d["base_kib"]


def python_refs_agree(refs):
    """Whether the memmap's and the array's uncapped fits gave the same
    bytes (they should: the data are the same)."""
    a, b = refs.get("py-memmap"), refs.get("py-array")
    if not (a and b):
        return None
    return all(filecmp.cmp(x, y, shallow=False) for x, y in zip(a[0], b[0]))


class SpillFs:
    """A small tmpfs (root only) for the spill directories of read-only runs:
    remounted read-only mid-run, read-write after it. `close` unmounts it."""

    def __init__(self, path, size="320m"):
        self.path = path
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700",
                        "outcore-soak", path], check=True)
        self.mounted = True

    def remount(self, mode):
        """`mode` is "ro" or "rw"; False when refused (EBUSY: a file open
        for writing)."""
        p = subprocess.run(["mount", "-o", f"remount,{mode}", self.path],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return p.returncode == 0

    def close(self):
        if not self.mounted:
            return
        if subprocess.run(["umount", self.path]).returncode != 0:
            subprocess.run(["umount", "-l", self.path])
        self.mounted = False


def mount_spill_fs(path, log):
    """The tmpfs, or None (not root, or the mount failed)."""
    if os.geteuid() != 0:
        log("not root: no read-only spill runs")
        return None
    try:
        return SpillFs(path)
    except (subprocess.CalledProcessError, OSError) as e:
        log(f"no tmpfs for read-only spill runs: {e}")
        return None


def said_left(err_lines):
    """The spill directories a run said it left (one warning line each)."""
    said = []
    for ln in err_lines:
        if ln.startswith("outcore: warning: the spill directory ") and "could not be removed" in ln:
            said.append(ln.split("outcore: warning: the spill directory ", 1)[1].split(" could not")[0])
    return said


def after_read_only(run, fs, entries, sweep_cmd, err_lines):
    """After a read-only run: writable again, what it left (each left
    directory must have been said), then one run on the same tmpfs, after
    which nothing may be left. Returns what is still there then ({path:
    bytes}), removed."""
    if not fs.remount("rw"):
        raise RuntimeError(f"cannot remount {fs.path} read-write")
    left = entries(fs.path)
    said = said_left(err_lines)
    run["ro_left"] = {"entries": len(left), "bytes": sum(left.values())}
    run["ro_said"] = len(said)
    unsaid = [p for p in left if not any(os.path.basename(p) == os.path.basename(s)
                                         for s in said)]
    if unsaid and run["result"] == "ok":
        run["result"] = "unsaid"
        run["ro_unsaid"] = sorted(map(os.path.basename, unsaid))
    if not left:
        return {}
    p = subprocess.run(sweep_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       env=dict(os.environ, TMPDIR=fs.path))
    run["ro_next_run_exit"] = p.returncode
    still = entries(fs.path)
    for path in still:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    return still
