#!/usr/bin/env python3
"""Soak of whole `outcore` runs under random caps, address-space limits,
signals and shared temporary directories (issue 37; not in CI), of the
PageRank example, of Python fits, and of spill filesystems turned
read-only mid-run (issue 52).

    cargo build --release -p outcore-jobs --bin outcore
    cargo build --release --example pagerank
    python3 -m venv /tmp/soakvenv
    /tmp/soakvenv/bin/pip install -q ./python numpy scikit-learn
    python3 benches/soak.py                      # 500 runs, about 30 min on 2 cores
    python3 benches/soak.py --short              # 30 runs, a quick check
    python3 benches/soak.py --runs 200 --seed 7 --out soak.json

Data is made once in the work directory (`--work`, default a new
directory under /var/tmp, removed at the end unless `--keep`): two `.npy`
files written by `outcore gen` (256 MiB and 96 MiB) and the centroids
`predict` uses. Each of nine configurations is run once uncapped for its
reference output and time: six of the command line (K-means mini-batch
and Lloyd from the files, mini-batch on synthetic data, `train` on
synthetic data, `predict` with centroids, `gen`), the PageRank example
(`--edges 128MiB --nodes 512K --iters 6`: its JSON line's digest of the
ranks' bits and their sum), and a fit of `outcore.KMeans` (16 centres, 6
Lloyd iterations) from Python on the 96 MiB file, as a memmap and as an
in-memory array (`cluster_centers_` and `labels_`, saved as `.npy`;
`benches/soak_fit.py`).
PageRank needs `--pagerank` (default `target/release/examples/pagerank`),
Python an interpreter that imports outcore (`--python`; default the first
of this one and `/tmp/soakvenv/bin/python` that does): without them those
configurations are left out, and the summary says so. Then each run
picks a configuration and at random:

- `--mem-cap` (Python: `mem_cap`): `none`, or from an eighth of the data
  to twice it (log-uniform), with a random `--policy` (K-means);
- command line only: one run in five, an address-space limit
  (`RLIMIT_AS`, as `ulimit -v`, set in the child only) from 16 MiB to
  1 GiB, log-uniform: limits too small for the run included; one run in
  ten, an open-file limit (`ulimit -n`) from 5 to 64, and one in ten a
  file-size limit (`ulimit -f`) from 64 KiB to 64 MiB: a run under either
  may also end with exit 2 and one `outcore: error:` line;
- `--workers` (Python: `n_jobs`): 1 or 2 in most runs, else 1 to 512
  (log-uniform);
- one run in four, a signal at a random time up to 1.2 x the reference
  time: SIGKILL, SIGTERM or SIGINT, now and then SIGQUIT or SIGHUP
  (Python: SIGKILL, SIGTERM or SIGINT, which the fit raises as
  `KeyboardInterrupt` and the child turns into exit 130; from 0.3 x the
  reference time, about when the imports are done and the fit starts);
- one iteration in five is a pair: two such runs started at once.

Read-only spill (root only): one iteration in twelve (not a pair) is one
run of `kmeans` on synthetic data, `train`, `kmeans` from the 256 MiB
file or `predict`, under a cap from an eighth to half of its data, with
`--spill-dir` on a 320 MiB tmpfs the script mounts, remounted read-only
(`mount -o remount,ro`, retried while busy) at a random time up to
1.5 x the reference time; no signal and no limit. Afterwards it is remounted
read-write, and the run is judged: exit 0 with the reference's bytes, or
exit 2 with one `outcore: error:` line; every spill directory it left
must be named in its `could not be removed` warning line ("left without
saying"), and after one more run on the tmpfs (`kmeans --synthetic 1MiB`,
which must remove them) nothing may be left ("left after the next run:
read-only spill"). The tmpfs is unmounted at the end, also on Ctrl-C,
SIGTERM or an error.

Every run and pair of one iteration share one TMPDIR, which is also the
parent of `--spill-dir` (given explicitly to about half the runs);
outputs go to a directory next to it. In the child, core dumps are off
and the signals sent have their default dispositions.

Each run is judged:

- **wrong result**: exit 0 with an output not byte-identical to the
  configuration's uncapped reference (centroids, model, labels or data);
- **hang**: still running after max(60 s, 10 x the reference time); it
  is then killed with SIGKILL;
- **unexpected ending**: any other outcome than exit 0, a death by the
  signal sent (-sig) or the exit 128 + sig of a caught one, or, under an
  address-space limit, a non-zero exit whose stderr has an
  `outcore: error:` or `outcore: out of memory` line (the out-of-memory
  abort, SIGABRT, is allowed there). Command-line runs with neither a
  signal nor a limit must exit 0; PageRank and Python runs may also be
  refused with one line (`pagerank: error:`, or the child's
  `python: error: MemoryError: ...`), as may read-only runs
  (`outcore: error:`). PageRank ends by the signal itself (-sig) after
  removing its spill directory on SIGINT, SIGTERM and SIGHUP: a caught
  signal for what is left.

What is left on disk is measured after each iteration, when no run is
alive: entries in the shared TMPDIR (a dead runtime's `outcore-spill-*`
directory, anything else) and `.outcore-partial-*` files beside the
outputs, with their bytes. "Left right after" (by how the runs ended) is
informational, except when every run of the iteration ended by itself
(exit 0 or an error exit) or by a signal it caught (128 + sig): then
nothing may be left. "Left after the next run" counts what is still
there after the next iteration that had a runtime run exit 0 spilling
into the same TMPDIR (not a read-only run's tmpfs; the runtime removes
dead runtimes' spill directories when it starts), or after one last uncapped run at the end. What is counted
there is then removed, so it counts once.

Resident set: the peak (`ru_maxrss` of the child, from `wait4`) of every
capped run that exited 0, over its cap; for a Python fit, the growth of
the interpreter's resident set during `fit` (its peak, reset just
before, less the resident set then: the interpreter and an in-memory
array are not the fit's). The largest ratio, and the runs above
1.05 x cap + 32 MiB, with the warnings they printed (an address-space
limit's cap warning, failed spill writes).

(`benches/soak.sh` is the other soak: injected spill-write failures and
Ctrl-C in one configuration, for a given duration.)

Prints a summary table and writes every run to the JSON file (`--out`).
Exits 1 when any run gave a wrong result, hung or ended unexpectedly, when
a clean ending left anything, when a read-only run left a spill directory
without saying so, or when anything was left after the next run.
"""
import argparse
import json
import math
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak_kinds as kinds  # noqa: E402
from soak_kinds import Config  # noqa: E402

MIB = 1 << 20
SIGNALS = [(signal.SIGKILL, 35), (signal.SIGTERM, 25), (signal.SIGINT, 25),
           (signal.SIGQUIT, 8), (signal.SIGHUP, 7)]
# The configurations a read-only run draws from: two that write spill
# files (synthetic data), two that read theirs back from the input.
RO_CONFIGS = ("kmeans-synth", "train", "kmeans-file", "predict")
# Children alive, killed (by pid) if the soak itself is stopped.
LIVE = {}


def configs(work, binary):
    """The command line's configurations."""
    big, small = f"{work}/data256.npy", f"{work}/data96.npy"
    cli = lambda argv, data, flag="--output", runtime=True: Config(
        [binary] + argv, data, flag, runtime, "cli")
    return {
        "kmeans-file": cli(["kmeans", "--input", big, "--k", "32", "--epochs", "2",
                            "--seed", "3"], 256 * MIB),
        "kmeans-lloyd": cli(["kmeans", "--input", small, "--k", "16", "--algorithm", "lloyd",
                             "--iterations", "6", "--tol", "0", "--seed", "4"], 96 * MIB),
        "kmeans-synth": cli(["kmeans", "--synthetic", "192MiB", "--dims", "48", "--true-k", "16",
                             "--k", "16", "--epochs", "2", "--seed", "9"], 192 * MIB),
        "train": cli(["train", "--synthetic", "128MiB", "--classes", "5", "--dims", "64",
                      "--max-iter", "8", "--seed", "5"], 128 * MIB),
        "predict": cli(["predict", "--centroids", f"{work}/centroids.npy", "--input", big],
                       256 * MIB, "--labels"),
        "gen": cli(["gen", "--synthetic", "128MiB", "--dims", "32", "--true-k", "8",
                    "--seed", "6"], 128 * MIB, runtime=False),
    }


def prepare(binary, work):
    """Writes the data files and the centroids `predict` uses."""
    steps = [
        ["gen", "--synthetic", "256MiB", "--dims", "64", "--true-k", "32", "--seed", "1",
         "--output", f"{work}/data256.npy"],
        ["gen", "--synthetic", "96MiB", "--dims", "16", "--true-k", "16", "--seed", "2",
         "--output", f"{work}/data96.npy"],
        ["kmeans", "--input", f"{work}/data256.npy", "--k", "24", "--epochs", "1",
         "--mem-cap", "none", "--output", f"{work}/centroids.npy"],
    ]
    for argv in steps:
        subprocess.run([binary] + argv, check=True, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, TMPDIR=work))


def preexec(limit, nofile=None, fsize=None):
    def f():
        # Default dispositions whatever launched the soak (`nohup` ignores
        # SIGHUP, a shell's `&` SIGINT and SIGQUIT; an ignored signal
        # stays ignored in outcore, as documented).
        for s in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        if fsize is not None:
            # Past it a write fails with EFBIG, not the signal.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return f


def pick_signal(rng, table):
    total = sum(w for _, w in table)
    x = rng.uniform(0, total)
    for s, w in table:
        x -= w
        if x <= 0:
            return s
    return table[0][0]


def log_uniform(rng, lo, hi):
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def runtime_flags(rng, name, cfg, run, spill, cap_range):
    """The cap, workers, policy and spill directory of a run that builds a
    runtime."""
    lo, hi = cap_range
    cap = None if lo is None else max(MIB, log_uniform(rng, lo, hi) // MIB * MIB)
    # Worker counts from 1 to 512, log-uniform (issue 52: the worker
    # count is in the plan); most runs keep 1 or 2.
    workers = rng.choice([1, 2]) if rng.random() < 0.6 else log_uniform(rng, 1, 512)
    run["cap"], run["workers"] = cap, workers
    extra = ["--mem-cap", "none" if cap is None else f"{cap // MIB}MiB",
             "--workers", str(workers)]
    if name.startswith("kmeans"):
        extra += ["--policy", rng.choice(["priority", "lru"])]
    if spill:
        extra += ["--spill-dir", spill]
        run["spill_dir"] = spill
    return extra


def draw_limits(rng, run):
    """The command line's limits: address space, open files, file size."""
    if rng.random() < 0.2:
        run["rlimit_as"] = log_uniform(rng, 16 * MIB, 1024 * MIB)
    # One run in ten, an open-file limit from 5 to 64 (log-uniform); one in
    # ten, a file-size limit from 64 KiB to 64 MiB: limits too small for the
    # run included (it must refuse in one line).
    run["rlimit_nofile"] = log_uniform(rng, 5, 64) if rng.random() < 0.1 else None
    run["rlimit_fsize"] = (log_uniform(rng, 64 << 10, 64 * MIB)
                           if rng.random() < 0.1 else None)


def plan_run(rng, name, cfg, ref_time, slot, tag, ro_fs=None):
    """One run's random settings and command line; `ro_fs`: the tmpfs of a
    read-only run."""
    run = {"config": name, "kind": cfg.kind, "cap": None, "rlimit_as": None,
           "signal": None, "at": None}
    extra = []
    if ro_fs is not None:
        extra = runtime_flags(rng, name, cfg, run, ro_fs.path, (cfg.data / 8, cfg.data / 2))
        run["ro_at"] = round(rng.uniform(0, 1.5 * ref_time), 3)
    else:
        if cfg.runtime:
            cap_range = (None, None) if rng.random() < 0.2 else (cfg.data / 8, cfg.data * 2)
            spill = f"{slot}/tmp" if rng.random() < 0.5 else None
            extra = runtime_flags(rng, name, cfg, run, spill, cap_range)
        if cfg.kind == "cli":
            draw_limits(rng, run)
        if rng.random() < 0.25:
            run["signal"] = int(pick_signal(rng, kinds.PY_SIGNALS if cfg.kind == "python"
                                            else SIGNALS))
            # A Python child spends its first 0.3 x or so importing.
            lo = 0.3 if cfg.kind == "python" else 0
            run["at"] = round(rng.uniform(lo * ref_time, 1.2 * ref_time), 3)
    flags, run["outputs"], run["stdout"] = kinds.outputs(cfg, f"{slot}/out/{tag}")
    run["cmd"] = cfg.argv + extra + flags
    return run


def parent_rss_kib():
    """This script's resident set: a forked child starts its peak there
    (the kernel keeps the larger of the peaks before and after exec), so
    it is the floor of every `ru_maxrss`; kept small (outputs are
    compared from their files)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start(run, slot, tag):
    err = open(f"{slot}/err-{tag}.txt", "wb")
    out = open(run["stdout"], "wb") if run["stdout"] else subprocess.DEVNULL
    env = dict(os.environ, TMPDIR=f"{slot}/tmp")
    p = subprocess.Popen(run["cmd"], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                         env=env,
                         preexec_fn=preexec(run["rlimit_as"], run.get("rlimit_nofile"),
                                            run.get("rlimit_fsize")))
    err.close()
    if run["stdout"]:
        out.close()
    LIVE[p.pid] = p
    run["parent_rss_kib"] = parent_rss_kib()
    run["_pid"], run["_t0"], run["_err"] = p.pid, time.monotonic(), f"{slot}/err-{tag}.txt"
    run["_popen"] = p
    return p


def reap(pid, r):
    """Whether `pid` has ended; if so, fills status, rss_kib, seconds."""
    got, status, ru = os.wait4(pid, os.WNOHANG)
    if got != pid:
        return False
    r["status"] = os.waitstatus_to_exitcode(status)
    r["rss_kib"] = ru.ru_maxrss
    r["seconds"] = round(time.monotonic() - r["_t0"], 3)
    r["_popen"].returncode = r["status"]
    LIVE.pop(pid, None)
    return True


def supervise(runs, timeouts, fs=None):
    """Waits for the runs, sending their signals and turning the tmpfs
    read-only on time, and killing those past their watchdog; fills
    status, rss_kib, seconds, hung."""
    alive = {r["_pid"]: r for r in runs}
    while alive:
        now = time.monotonic()
        for pid, r in list(alive.items()):
            if reap(pid, r):
                del alive[pid]
                continue
            t = now - r["_t0"]
            if r["signal"] is not None and not r.get("sent") and t >= r["at"]:
                os.kill(pid, r["signal"])
                r["sent"] = round(t, 3)
            if r.get("ro_at") is not None and r.get("ro_sent") is None and t >= r["ro_at"]:
                r["ro_tries"] = r.get("ro_tries", 0) + 1
                if fs.remount("ro"):
                    r["ro_sent"] = round(time.monotonic() - r["_t0"], 3)
            if t > timeouts[id(r)] and not r.get("hung"):
                r["hung"] = True
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def entries(path):
    """Entries directly in `path` with their bytes (files under them)."""
    found = {}
    for name in os.listdir(path):
        full = os.path.join(path, name)
        total = 0
        if os.path.isdir(full) and not os.path.islink(full):
            for root, _, files in os.walk(full):
                for f in files:
                    try:
                        total += os.lstat(os.path.join(root, f)).st_size
                    except FileNotFoundError:
                        pass
        else:
            total = os.lstat(full).st_size
        found[full] = total
    return found


def leftovers(slot):
    """What is on disk in the slot that no run should leave: everything in
    the TMPDIR and the partial outputs beside the outputs."""
    left = entries(f"{slot}/tmp")
    for path, size in entries(f"{slot}/out").items():
        if os.path.basename(path).startswith(".outcore-partial-"):
            left[path] = size
    return left


def stderr_tail(path, lines=6):
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    return text.strip().splitlines()[-lines:]


def judge(run, cfg, ref, err):
    """Classifies one finished run: ok, wrong, hang or unexpected."""
    st, sig, sent = run["status"], run["signal"], run.get("sent") is not None
    ours = [ln for ln in err if ln.startswith(("outcore: error:", "outcore: out of memory"))]
    refusals = [ln for ln in err if ln.startswith(kinds.ERROR_PREFIX[cfg.kind])]
    if run.get("hung"):
        return "hang"
    if st == 0:
        return "ok" if kinds.same_outputs(cfg, run["outputs"], ref) else "wrong"
    if sent and st in (-sig, 128 + sig):
        return "ok"
    if run["rlimit_as"] is not None and ours and (st > 0 or st == -signal.SIGABRT):
        return "ok"
    limited = (run.get("rlimit_nofile") is not None or run.get("rlimit_fsize") is not None
               or cfg.kind != "cli" or run.get("ro_at") is not None)
    if limited and st > 0 and len(refusals) == 1:
        return "ok"
    return "unexpected"


def clean_ending(run):
    """Ended by itself (exit 0 or an error exit) or by a signal it caught:
    nothing may be left."""
    if run.get("hung"):
        return False
    st = run["status"]
    return (st >= 0 and run["ending"] != "uncaught signal") or run["ending"] == "caught signal"


def ending(run):
    st, sig, sent = run["status"], run["signal"], run.get("sent") is not None
    if run.get("hung"):
        return "hang"
    if st == 0:
        return "exit 0"
    if sent and st == -sig:
        if sig == signal.SIGKILL:
            return "killed by SIGKILL"
        caught = run["kind"] == "pagerank" and sig in kinds.PAGERANK_CAUGHT
        return "caught signal" if caught else "uncaught signal"
    if sent and st == 128 + sig:
        return "caught signal"
    if run["rlimit_as"] is not None:
        return "refused or out of memory (RLIMIT_AS)"
    if run.get("rlimit_nofile") is not None or run.get("rlimit_fsize") is not None:
        return "refused (open-file or file-size limit)"
    if run.get("ro_at") is not None and st > 0:
        return "error (read-only spill)"
    if run["kind"] != "cli" and st > 0:
        return f"refused ({run['kind']})"
    return f"other ({st})"


def build_refs(cfgs, work, log):
    refs = {}
    slot = f"{work}/ref"
    os.makedirs(f"{slot}/tmp"), os.makedirs(f"{slot}/out")
    for name, cfg in cfgs.items():
        flags, outs, stdout = kinds.outputs(cfg, f"{slot}/out/{name}")
        cmd = cfg.argv + (["--mem-cap", "none"] if cfg.runtime else []) + flags
        t = time.monotonic()
        with open(stdout or os.devnull, "wb") as out:
            subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.DEVNULL,
                           env=dict(os.environ, TMPDIR=f"{slot}/tmp"))
        seconds = time.monotonic() - t
        refs[name] = (outs, seconds)
        log(f"reference {name}: {seconds:.2f} s, {sum(map(os.path.getsize, outs))} bytes")
    return refs


class Tally:
    def __init__(self):
        self.runs, self.pairs = [], 0
        self.after = {}          # ending -> [entries, bytes] right after
        self.clean_left = [0, 0]
        self.next_left = {"spill": [0, 0], "partial": [0, 0], "other": [0, 0],
                          "read-only spill": [0, 0]}
        self.next_left_items = []
        self.pending_from = {}   # leftover path -> iteration that left it

    def add_after(self, endings, left):
        key = " + ".join(sorted(endings))
        a = self.after.setdefault(key, [0, 0, 0])
        a[0] += 1
        a[1] += len(left)
        a[2] += sum(left.values())

    def count_next_left(self, what, path, size, i, judged):
        k = self.next_left[what]
        k[0] += 1
        k[1] += size
        self.next_left_items.append({"path": os.path.basename(path), "bytes": size,
                                     "kind": what, "from_iteration": i,
                                     "judged_after": judged})


def kind(path):
    base = os.path.basename(path)
    if base.startswith("outcore-spill-"):
        return "spill"
    if base.startswith(".outcore-partial-"):
        return "partial"
    return "other"


def judge_pending(i, pending, tally):
    """Counts what earlier iterations left and a runtime run since has
    not removed, then removes it (so that it counts once)."""
    for path in list(pending):
        if os.path.lexists(path):
            tally.count_next_left(kind(path), path, pending[path], tally.pending_from[path], i)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
        del pending[path]


def final_sweep(cfgs, slot, i, pending, tally, log):
    """One last uncapped run of the smallest K-means in the slot, so that
    the last iterations' leftovers are judged too."""
    argv = cfgs["kmeans-lloyd"].argv + ["--mem-cap", "none", "--output", f"{slot}/out/final.npy"]
    p = subprocess.run(argv, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, TMPDIR=f"{slot}/tmp"))
    log(f"final run in the same TMPDIR: exit {p.returncode}")
    if p.returncode == 0:
        os.remove(f"{slot}/out/final.npy")
        judge_pending(i, pending, tally)


def plan_iteration(i, rng, ctx):
    """One iteration's runs: one, a pair, or one read-only run."""
    names = list(ctx.cfgs)
    pair = rng.random() < 0.2
    ro = not pair and ctx.fs is not None and rng.random() < 1 / 12
    runs = []
    for j in range(2 if pair else 1):
        name = rng.choice(RO_CONFIGS if ro else names)
        run = plan_run(rng, name, ctx.cfgs[name], ctx.refs[name][1], ctx.slot, f"r{i}-{j}",
                       ctx.fs if ro else None)
        run["iteration"] = i
        runs.append(run)
    return runs, pair


def finish(run, i, ctx, tally, log):
    """Judges a finished run, removes its files and logs it."""
    cfg = ctx.cfgs[run["config"]]
    err = stderr_tail(run["_err"], 40)
    run["result"] = judge(run, cfg, ctx.refs[run["config"]][0], err)
    run["cap_warning"] = any("outcore: warning: the cap of" in ln for ln in err)
    run["write_warning"] = any("spill write(s) to" in ln for ln in err)
    run["ending"] = ending(run)
    if run["status"] == 0 and run["cap"]:
        run["job_rss_kib"] = kinds.job_rss_kib(run, cfg)
    if run.get("ro_at") is not None:
        still = kinds.after_read_only(run, ctx.fs, entries, ctx.sweep_cmd, err)
        for path, size in still.items():
            tally.count_next_left("read-only spill", path, size, i, i)
    if run["result"] != "ok":
        run["stderr"] = stderr_tail(run["_err"])
    for path in run["outputs"] + [run["stdout"], ctx.sweep_out]:
        if path and os.path.exists(path):
            os.remove(path)
    os.remove(run["_err"])
    for k in [k for k in run if k.startswith("_")]:
        del run[k]
    tally.runs.append(run)
    ro = "" if run.get("ro_at") is None else f" ro@{run.get('ro_sent')}"
    log(f"{i:4d} {run['config']:13s} cap {fmt_mib(run['cap']):>9s} "
        f"as {fmt_mib(run['rlimit_as']):>9s} "
        f"sig {signame(run['signal']):8s} {run['ending']:24s} {run['result']}{ro}")


def iteration(i, rng, ctx, pending, tally, log):
    runs, pair = plan_iteration(i, rng, ctx)
    tally.pairs += pair
    timeouts = {}
    for j, run in enumerate(runs):
        start(run, ctx.slot, f"r{i}-{j}")
        timeouts[id(run)] = max(60.0, 10 * ctx.refs[run["config"]][1])
    supervise(runs, timeouts, ctx.fs)
    for run in runs:
        finish(run, i, ctx, tally, log)
    # Leftovers of earlier iterations, judged once a runtime run spilling
    # into the slot (not the tmpfs) exited 0.
    if any(ctx.cfgs[r["config"]].runtime and r["status"] == 0 and r.get("ro_at") is None
           for r in runs):
        judge_pending(i, pending, tally)
    # New leftovers only: earlier ones not judged yet (no runtime run
    # exited 0 since) are still pending.
    left = {p: b for p, b in leftovers(ctx.slot).items() if p not in pending}
    tally.add_after([r["ending"] for r in runs], left)
    if all(clean_ending(r) for r in runs):
        tally.clean_left[0] += len(left)
        tally.clean_left[1] += sum(left.values())
        if left:
            for r in runs:
                r["left_after_clean_ending"] = sorted(map(os.path.basename, left))
    for path, size in left.items():
        if path not in pending:
            pending[path] = size
            tally.pending_from[path] = i


def fmt_mib(b):
    return "none" if b is None else f"{b / MIB:.0f}MiB"


def signame(s):
    return "-" if s is None else signal.Signals(s).name


def rss_figures(runs):
    """The resident set of capped runs that exited 0, over their caps."""
    capped = [r for r in runs if r.get("job_rss_kib") is not None]
    ratios = [(r["job_rss_kib"] * 1024 / r["cap"], r) for r in capped]
    worst = max(ratios, key=lambda x: x[0]) if ratios else (0, None)
    over = [r for _, r in ratios if r["job_rss_kib"] * 1024 > 1.05 * r["cap"] + 32 * MIB]
    quiet = [x for x in ratios if not (x[1]["cap_warning"] or x[1]["write_warning"])]
    worst_quiet = max(quiet, key=lambda x: x[0]) if quiet else (0, None)
    keys = ("iteration", "config", "cap", "job_rss_kib", "cap_warning", "write_warning",
            "ro_sent", "cmd")
    pick = lambda r: {k: r.get(k) for k in keys}
    return {
        "capped_runs_exit_0": len(capped),
        "max_rss_over_cap": round(worst[0], 3),
        "max_rss_over_cap_without_warning": round(worst_quiet[0], 3),
        "max_rss_run": None if worst[1] is None else pick(worst[1]),
        "max_rss_run_without_warning": None if worst_quiet[1] is None else pick(worst_quiet[1]),
        "max_rss_over_cap_by_kind": {
            k: round(max((x for x, r in ratios if r["kind"] == k), default=0), 3)
            for k in ("cli", "pagerank", "python")},
        "runs_over_1.05cap_plus_32MiB": [pick(r) for r in over],
    }


def read_only_figures(runs):
    ro = [r for r in runs if r.get("ro_at") is not None]
    return {
        "runs": len(ro),
        "turned_read_only_while_running": sum(r.get("ro_sent") is not None for r in ro),
        "remount_retries": sum(max(0, r.get("ro_tries", 0) - 1) for r in ro),
        "left_a_spill_directory": sum(r["ro_left"]["entries"] > 0 for r in ro),
        "left_bytes": sum(r["ro_left"]["bytes"] for r in ro),
        "said_left": sum(r["ro_said"] for r in ro),
        "next_run_exits": sorted({r["ro_next_run_exit"] for r in ro if "ro_next_run_exit" in r}),
    }


def summary(tally, refs, args, elapsed, ctx):
    runs = tally.runs
    count = lambda res: sum(r["result"] == res for r in runs)
    s = {
        "runs": len(runs), "pairs": tally.pairs, "seconds": round(elapsed, 1),
        "seed": args.seed, "binary": args.binary, "pagerank": ctx.pagerank,
        "python": ctx.python, "python_refs_agree": kinds.python_refs_agree(refs),
        "wrong_results": count("wrong"), "hangs": count("hang"),
        "unexpected_endings": count("unexpected"), "left_without_saying": count("unsaid"),
        "runs_by_config": {}, "endings": {},
        "left_right_after": {k: {"iterations": v[0], "entries": v[1], "bytes": v[2]}
                             for k, v in sorted(tally.after.items())},
        "left_after_clean_ending": {"entries": tally.clean_left[0],
                                    "bytes": tally.clean_left[1]},
        "left_after_next_run": {k: {"entries": v[0], "bytes": v[1]}
                                for k, v in tally.next_left.items()},
        "left_after_next_run_items": tally.next_left_items,
        "read_only": read_only_figures(runs),
        "parent_rss_kib_max": max((r["parent_rss_kib"] for r in runs), default=0),
        "references": {k: {"seconds": round(v[1], 3),
                           "bytes": sum(map(os.path.getsize, v[0]))}
                       for k, v in refs.items()},
    }
    s.update(rss_figures(runs))
    for r in runs:
        s["endings"][r["ending"]] = s["endings"].get(r["ending"], 0) + 1
        s["runs_by_config"][r["config"]] = s["runs_by_config"].get(r["config"], 0) + 1
    s["runs_detail"] = runs
    return s


def print_rows(s):
    nl = s["left_after_next_run"]
    over = s["runs_over_1.05cap_plus_32MiB"]
    ro = s["read_only"]
    left = lambda k: f"{nl[k]['entries']} entries, {nl[k]['bytes']} bytes"
    rows = [
        ("runs (pairs)", f"{s['runs']} ({s['pairs']})"),
        ("wrong results", s["wrong_results"]),
        ("hangs", s["hangs"]),
        ("unexpected endings", s["unexpected_endings"]),
        ("spill directories left without saying", s["left_without_saying"]),
    ] + [(f"left after the next run: {k}", left(k)) for k in nl] + [
        ("left right after a clean ending",
         f"{s['left_after_clean_ending']['entries']} entries, "
         f"{s['left_after_clean_ending']['bytes']} bytes"),
        ("largest resident set / cap", f"{s['max_rss_over_cap']} "
                                       f"(of {s['capped_runs_exit_0']} capped runs, exit 0)"),
        ("  the same, runs without a warning", s["max_rss_over_cap_without_warning"]),
        ("  by kind", s["max_rss_over_cap_by_kind"]),
        ("runs over 1.05 x cap + 32 MiB (with a warning)",
         f"{len(over)} ({sum(r['cap_warning'] or r['write_warning'] for r in over)})"),
        ("read-only runs (turned read-only while running)",
         f"{ro['runs']} ({ro['turned_read_only_while_running']})"),
        ("  left a spill directory (said; bytes)",
         f"{ro['left_a_spill_directory']} ({ro['said_left']}; {ro['left_bytes']})"),
        ("python references agree (memmap, array)", s["python_refs_agree"]),
        ("floor of ru_maxrss (this script's RSS)", f"{s['parent_rss_kib_max'] / 1024:.1f} MiB"),
        ("left at the end, not judged", s["left_pending_at_end"]),
        ("wall time", f"{s['seconds']} s"),
    ]
    print()
    for k, v in rows:
        print(f"  {k:50s} {v}")


def print_summary(s):
    print_rows(s)
    for title, d in (("runs by configuration", s["runs_by_config"]), ("endings", s["endings"])):
        print(f"\n  {title}:")
        for k, v in sorted(d.items()):
            print(f"    {k:40s} {v}")
    print("\n  left right after (iterations, entries, bytes), by how the runs ended:")
    for k, v in s["left_right_after"].items():
        print(f"    {k:60s} {v['iterations']:4d} {v['entries']:4d} {v['bytes']:12d}")
    for r in s["runs_over_1.05cap_plus_32MiB"]:
        print(f"\n  over 1.05 x cap + 32 MiB: iteration {r['iteration']}, "
              f"peak {r['job_rss_kib'] / 1024:.0f} MiB, cap warning {r['cap_warning']}, "
              f"failed spill writes {r['write_warning']}, read-only at {r['ro_sent']}")
        print("    " + " ".join(r["cmd"]))
    for r in [r for r in s["runs_detail"] if r["result"] != "ok"]:
        print(f"\n  {r['result']}: iteration {r['iteration']}, exit {r['status']}, "
              f"signal {signame(r['signal'])} sent at {r.get('sent')}, "
              f"RLIMIT_AS {r['rlimit_as']}, read-only at {r.get('ro_sent')}")
        print("    " + " ".join(r["cmd"]))
        for ln in r.get("stderr", []):
            print("    | " + ln)


class Context:
    """What the iterations share: configurations, references, the slot,
    the tmpfs and its sweep run."""

    def __init__(self, args, work, log):
        self.pagerank = args.pagerank if os.path.exists(args.pagerank) else None
        self.python = kinds.python_with_outcore([args.python] if args.python else
                                                [sys.executable, "/tmp/soakvenv/bin/python"])
        log(f"pagerank: {self.pagerank or 'left out'}; python: {self.python or 'left out'}")
        self.cfgs = configs(work, args.binary)
        self.cfgs.update(kinds.extra_configs(work, self.pagerank, self.python))
        self.refs = build_refs(self.cfgs, work, log)
        self.slot = f"{work}/slot"
        os.makedirs(f"{self.slot}/tmp", mode=0o700), os.makedirs(f"{self.slot}/out")
        self.fs = None if args.no_read_only else kinds.mount_spill_fs(f"{work}/spillfs", log)
        self.sweep_out = f"{self.slot}/out/sweep.npy"
        self.sweep_cmd = [args.binary, "kmeans", "--synthetic", "1MiB", "--dims", "8", "--k", "2",
                          "--spill-dir", self.fs.path if self.fs else "",
                          "--output", self.sweep_out]


def stop_everything(ctx, work, keep):
    """Kills the runs still alive (the soak was stopped), unmounts the
    tmpfs, removes the work directory."""
    for pid, p in list(LIVE.items()):
        p.kill()
        p.wait()
    if ctx is not None and ctx.fs is not None:
        ctx.fs.remount("rw")
        ctx.fs.close()
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def on_term(sig, _frame):
    raise KeyboardInterrupt(f"signal {sig}")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=None, help="runs (default 500; 30 with --short)")
    ap.add_argument("--short", action="store_true", help="a quick check: 30 runs")
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--binary", default="target/release/outcore")
    ap.add_argument("--pagerank", default="target/release/examples/pagerank")
    ap.add_argument("--python", default=None, help="an interpreter that imports outcore")
    ap.add_argument("--no-read-only", action="store_true", help="no read-only spill runs")
    ap.add_argument("--out", default=None, help="JSON summary file")
    ap.add_argument("--work", default=None, help="work directory (default: new, under /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    args.runs = args.runs if args.runs is not None else (30 if args.short else 500)
    args.binary = os.path.abspath(args.binary)
    args.pagerank = os.path.abspath(args.pagerank)
    return args


def soak(args, work, log):
    t0 = time.monotonic()
    ctx = None
    try:
        prepare(args.binary, work)
        ctx = Context(args, work, log)
        rng = random.Random(args.seed)
        tally, pending, i = Tally(), {}, 0
        while len(tally.runs) < args.runs:
            iteration(i, rng, ctx, pending, tally, log)
            i += 1
        final_sweep(ctx.cfgs, ctx.slot, i, pending, tally, log)
        s = summary(tally, ctx.refs, args, time.monotonic() - t0, ctx)
        s["left_pending_at_end"] = len(pending)
        return s
    finally:
        stop_everything(ctx, work, args.keep)


def main():
    args = parse_args()
    work = args.work or tempfile.mkdtemp(prefix="outcore-soak-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    s = soak(args, work, lambda m: print(m, flush=True))
    print_summary(s)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(s, f, indent=1)
    nl = s["left_after_next_run"]
    failed = (s["wrong_results"] or s["hangs"] or s["unexpected_endings"]
              or s["left_without_saying"] or s["left_after_clean_ending"]["entries"]
              or any(v["entries"] for v in nl.values()))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
