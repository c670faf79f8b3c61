#!/usr/bin/env python3
"""Soak of whole `outcore` runs under random caps, address-space limits,
signals and shared temporary directories (issue 37; not in CI).

    cargo build --release -p outcore-jobs --bin outcore
    python3 benches/soak.py                      # 500 runs, about 30 min on 2 cores
    python3 benches/soak.py --short              # 30 runs, a quick check
    python3 benches/soak.py --runs 200 --seed 7 --out soak.json

Data is made once in the work directory (`--work`, default a new
directory under /var/tmp, removed at the end unless `--keep`): two `.npy`
files written by `outcore gen` (256 MiB and 96 MiB) and the centroids
`predict` uses. Each of six configurations (K-means mini-batch and Lloyd
from the files, mini-batch on synthetic data, `train` on synthetic data,
`predict` with centroids, `gen`) is run once uncapped for its reference
output and time. Then each run picks a configuration and at random:

- `--mem-cap`: `none`, or from an eighth of the data to twice it
  (log-uniform), with a random `--policy` and 1 or 2 `--workers`;
- one run in five, an address-space limit (`RLIMIT_AS`, as `ulimit -v`,
  set in the child only) from 16 MiB to 1 GiB, log-uniform: limits too
  small for the run included;
- `--workers`: 1 or 2 in most runs, else 1 to 512 (log-uniform);
- one run in ten, an open-file limit (`ulimit -n`) from 5 to 64, and one
  in ten a file-size limit (`ulimit -f`) from 64 KiB to 64 MiB: a run
  under either may also end with exit 2 and one `outcore: error:` line;
- one run in four, a signal at a random time up to 1.2 x the reference
  time: SIGKILL, SIGTERM or SIGINT, now and then SIGQUIT or SIGHUP;
- one iteration in five is a pair: two such runs started at once.

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
  abort, SIGABRT, is allowed there). Runs with neither a signal nor a
  limit must exit 0.

What is left on disk is measured after each iteration, when no run is
alive: entries in the shared TMPDIR (a dead runtime's `outcore-spill-*`
directory, anything else) and `.outcore-partial-*` files beside the
outputs, with their bytes. "Left right after" (by how the runs ended) is
informational, except when every run of the iteration ended by itself
(exit 0 or an error exit) or by a signal it caught (128 + sig): then
nothing may be left. "Left after the next run" counts what is still
there after the next iteration that had a runtime run exit 0 in the
same TMPDIR (the runtime removes dead runtimes' spill directories when
it starts), or after one last uncapped run at the end. What is counted
there is then removed, so it counts once.

Resident set: the peak (`ru_maxrss` of the child, from `wait4`) of every
capped run that exited 0, over its cap; the largest ratio, and the runs
above 1.05 x cap + 32 MiB.

(`benches/soak.sh` is the other soak: injected spill-write failures and
Ctrl-C in one configuration, for a given duration.)

Prints a summary table and writes every run to the JSON file (`--out`).
Exits 1 when any run gave a wrong result, hung or ended unexpectedly, when
a clean ending left anything, or when anything was left after the next
run.
"""
import argparse
import filecmp
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

MIB = 1 << 20
SIGNALS = [(signal.SIGKILL, 35), (signal.SIGTERM, 25), (signal.SIGINT, 25),
           (signal.SIGQUIT, 8), (signal.SIGHUP, 7)]


def configs(work):
    """The configurations: name -> (argv without cap flags, data bytes,
    output flag, whether it runs a runtime)."""
    big, small = f"{work}/data256.npy", f"{work}/data96.npy"
    return {
        "kmeans-file": (["kmeans", "--input", big, "--k", "32", "--epochs", "2",
                         "--seed", "3"], 256 * MIB, "--output", True),
        "kmeans-lloyd": (["kmeans", "--input", small, "--k", "16", "--algorithm", "lloyd",
                          "--iterations", "6", "--tol", "0", "--seed", "4"],
                         96 * MIB, "--output", True),
        "kmeans-synth": (["kmeans", "--synthetic", "192MiB", "--dims", "48", "--true-k", "16",
                          "--k", "16", "--epochs", "2", "--seed", "9"],
                         192 * MIB, "--output", True),
        "train": (["train", "--synthetic", "128MiB", "--classes", "5", "--dims", "64",
                   "--max-iter", "8", "--seed", "5"], 128 * MIB, "--output", True),
        "predict": (["predict", "--centroids", f"{work}/centroids.npy", "--input", big],
                    256 * MIB, "--labels", True),
        "gen": (["gen", "--synthetic", "128MiB", "--dims", "32", "--true-k", "8", "--seed", "6"],
                128 * MIB, "--output", False),
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


def pick_signal(rng):
    total = sum(w for _, w in SIGNALS)
    x = rng.uniform(0, total)
    for s, w in SIGNALS:
        x -= w
        if x <= 0:
            return s
    return SIGNALS[0][0]


def plan_run(rng, name, cfg, ref_time, slot, tag):
    """One run's random settings and command line."""
    argv, data, out_flag, runtime = cfg
    run = {"config": name, "cap": None, "rlimit_as": None, "signal": None, "at": None}
    extra = []
    if runtime:
        if rng.random() < 0.2:
            cap = None
        else:
            cap = int(math.exp(rng.uniform(math.log(data / 8), math.log(data * 2))))
            cap = max(MIB, cap // MIB * MIB)
        run["cap"] = cap
        # Worker counts from 1 to 512, log-uniform (issue 52: the worker
        # count is in the plan); most runs keep 1 or 2.
        workers = rng.choice([1, 2]) if rng.random() < 0.6 else int(math.exp(rng.uniform(0, math.log(512))))
        run["workers"] = workers
        extra += ["--mem-cap", "none" if cap is None else f"{cap // MIB}MiB",
                  "--workers", str(workers)]
        if name.startswith("kmeans"):
            extra += ["--policy", rng.choice(["priority", "lru"])]
        if rng.random() < 0.5:
            extra += ["--spill-dir", f"{slot}/tmp"]
    if rng.random() < 0.2:
        run["rlimit_as"] = int(math.exp(rng.uniform(math.log(16 * MIB), math.log(1024 * MIB))))
    # One run in ten, an open-file limit from 5 to 64 (log-uniform); one in
    # ten, a file-size limit from 64 KiB to 64 MiB: limits too small for the
    # run included (it must refuse in one line).
    run["rlimit_nofile"] = int(math.exp(rng.uniform(math.log(5), math.log(64)))) if rng.random() < 0.1 else None
    run["rlimit_fsize"] = (int(math.exp(rng.uniform(math.log(64 << 10), math.log(64 * MIB))))
                           if rng.random() < 0.1 else None)
    if rng.random() < 0.25:
        run["signal"] = int(pick_signal(rng))
        run["at"] = round(rng.uniform(0, 1.2 * ref_time), 3)
    out = f"{slot}/out/{tag}.npy"
    run["output"] = out
    run["argv"] = argv + extra + [out_flag, out]
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


def start(binary, run, slot, tag):
    err = open(f"{slot}/err-{tag}.txt", "wb")
    env = dict(os.environ, TMPDIR=f"{slot}/tmp")
    p = subprocess.Popen([binary] + run["argv"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=err, env=env,
                         preexec_fn=preexec(run["rlimit_as"], run.get("rlimit_nofile"),
                                            run.get("rlimit_fsize")))
    err.close()
    run["parent_rss_kib"] = parent_rss_kib()
    run["_pid"], run["_t0"], run["_err"] = p.pid, time.monotonic(), f"{slot}/err-{tag}.txt"
    run["_popen"] = p
    return p


def supervise(runs, timeouts):
    """Waits for the runs, sending their signals on time and killing
    those past their watchdog; fills status, rss_kib, seconds, hung."""
    alive = {r["_pid"]: r for r in runs}
    while alive:
        now = time.monotonic()
        for pid, r in list(alive.items()):
            got, status, ru = os.wait4(pid, os.WNOHANG)
            if got == pid:
                r["status"] = os.waitstatus_to_exitcode(status)
                r["rss_kib"] = ru.ru_maxrss
                r["seconds"] = round(time.monotonic() - r["_t0"], 3)
                r["_popen"].returncode = r["status"]
                del alive[pid]
                continue
            t = now - r["_t0"]
            if r["signal"] is not None and not r.get("sent") and t >= r["at"]:
                os.kill(pid, r["signal"])
                r["sent"] = round(t, 3)
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


def judge(run, ref):
    """Classifies one finished run: ok, wrong, hang or unexpected."""
    st, sig, sent = run["status"], run["signal"], run.get("sent") is not None
    err = stderr_tail(run["_err"], 40)
    ours = [ln for ln in err if ln.startswith(("outcore: error:", "outcore: out of memory"))]
    if run.get("hung"):
        return "hang"
    if st == 0:
        if not os.path.exists(run["output"]):
            return "wrong"
        return "ok" if filecmp.cmp(run["output"], ref, shallow=False) else "wrong"
    if sent and st in (-sig, 128 + sig):
        return "ok"
    if run["rlimit_as"] is not None and ours and (st > 0 or st == -signal.SIGABRT):
        return "ok"
    limited = run.get("rlimit_nofile") is not None or run.get("rlimit_fsize") is not None
    if limited and st > 0 and len([ln for ln in err if ln.startswith("outcore: error:")]) == 1:
        return "ok"
    return "unexpected"


def clean_ending(run):
    """Ended by itself (exit 0 or an error exit) or by a signal it caught:
    nothing may be left."""
    if run.get("hung"):
        return False
    st = run["status"]
    return st >= 0 and run["ending"] != "uncaught signal"


def ending(run):
    st, sig = run["status"], run["signal"]
    if run.get("hung"):
        return "hang"
    if st == 0:
        return "exit 0"
    if run.get("sent") is not None and st == -sig:
        return "killed by SIGKILL" if sig == signal.SIGKILL else "uncaught signal"
    if run.get("sent") is not None and st == 128 + sig:
        return "caught signal"
    if run["rlimit_as"] is not None:
        return "refused or out of memory (RLIMIT_AS)"
    if run.get("rlimit_nofile") is not None or run.get("rlimit_fsize") is not None:
        return "refused (open-file or file-size limit)"
    return f"other ({st})"


def build_refs(binary, cfgs, work, log):
    refs = {}
    slot = f"{work}/ref"
    os.makedirs(f"{slot}/tmp"), os.makedirs(f"{slot}/out")
    for name, (argv, _, out_flag, runtime) in cfgs.items():
        out = f"{slot}/out/{name}.npy"
        cmd = [binary] + argv + (["--mem-cap", "none"] if runtime else []) + [out_flag, out]
        t = time.monotonic()
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, TMPDIR=f"{slot}/tmp"))
        seconds = time.monotonic() - t
        refs[name] = (out, seconds)
        log(f"reference {name}: {seconds:.2f} s, {os.path.getsize(out)} bytes")
    return refs


class Tally:
    def __init__(self):
        self.runs, self.pairs = [], 0
        self.after = {}          # ending -> [entries, bytes] right after
        self.clean_left = [0, 0]
        self.next_left = {"spill": [0, 0], "partial": [0, 0], "other": [0, 0]}
        self.next_left_items = []
        self.pending_from = {}   # leftover path -> iteration that left it

    def add_after(self, endings, left):
        key = " + ".join(sorted(endings))
        a = self.after.setdefault(key, [0, 0, 0])
        a[0] += 1
        a[1] += len(left)
        a[2] += sum(left.values())


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
            size = pending[path]
            k = tally.next_left[kind(path)]
            k[0] += 1
            k[1] += size
            tally.next_left_items.append({"path": os.path.basename(path), "bytes": size,
                                          "from_iteration": tally.pending_from[path],
                                          "judged_after": i})
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
        del pending[path]


def final_sweep(binary, cfgs, slot, i, pending, tally, log):
    """One last uncapped run of the smallest K-means in the slot, so that
    the last iterations' leftovers are judged too."""
    argv = cfgs["kmeans-lloyd"][0] + ["--mem-cap", "none", "--output", f"{slot}/out/final.npy"]
    p = subprocess.run([binary] + argv, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, TMPDIR=f"{slot}/tmp"))
    log(f"final run in the same TMPDIR: exit {p.returncode}")
    if p.returncode == 0:
        os.remove(f"{slot}/out/final.npy")
        judge_pending(i, pending, tally)


def iteration(i, rng, args, cfgs, refs, slot, pending, tally, log):
    names = list(cfgs)
    pair = rng.random() < 0.2
    runs = []
    for j in range(2 if pair else 1):
        name = rng.choice(names)
        run = plan_run(rng, name, cfgs[name], refs[name][1], slot, f"r{i}-{j}")
        run["iteration"] = i
        runs.append(run)
    tally.pairs += pair
    timeouts = {}
    for j, run in enumerate(runs):
        start(args.binary, run, slot, f"r{i}-{j}")
        timeouts[id(run)] = max(60.0, 10 * refs[run["config"]][1])
    supervise(runs, timeouts)
    for run in runs:
        run["result"] = judge(run, refs[run["config"]][0])
        run["cap_warning"] = any("outcore: warning: the cap of" in ln
                                 for ln in stderr_tail(run["_err"], 40))
        run["ending"] = ending(run)
        if run["result"] != "ok":
            run["stderr"] = stderr_tail(run["_err"])
        if os.path.exists(run["output"]):
            os.remove(run["output"])
        os.remove(run["_err"])
        for k in [k for k in run if k.startswith("_")]:
            del run[k]
        tally.runs.append(run)
        line = (f"{i:4d} {run['config']:13s} cap {fmt_mib(run['cap']):>9s} "
                f"as {fmt_mib(run['rlimit_as']):>9s} "
                f"sig {signame(run['signal']):8s} {run['ending']:24s} {run['result']}")
        log(line)
    # Leftovers of earlier iterations, judged once a runtime run exited 0.
    if any(cfgs[r["config"]][3] and r["status"] == 0 for r in runs):
        judge_pending(i, pending, tally)
    # New leftovers only: earlier ones not judged yet (no runtime run
    # exited 0 since) are still pending.
    left = {p: b for p, b in leftovers(slot).items() if p not in pending}
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


def summary(tally, refs, args, elapsed):
    runs = tally.runs
    count = lambda res: sum(r["result"] == res for r in runs)
    capped = [r for r in runs if r["cap"] and r["status"] == 0 and "rss_kib" in r]
    ratios = [(r["rss_kib"] * 1024 / r["cap"], r) for r in capped]
    worst = max(ratios, key=lambda x: x[0]) if ratios else (0, None)
    over = [r for _, r in ratios if r["rss_kib"] * 1024 > 1.05 * r["cap"] + 32 * MIB]
    quiet = [x for x in ratios if not x[1]["cap_warning"]]
    worst_quiet = max(quiet, key=lambda x: x[0]) if quiet else (0, None)
    s = {
        "runs": len(runs), "pairs": tally.pairs, "seconds": round(elapsed, 1),
        "seed": args.seed, "binary": args.binary,
        "wrong_results": count("wrong"), "hangs": count("hang"),
        "unexpected_endings": count("unexpected"),
        "endings": {},
        "left_right_after": {k: {"iterations": v[0], "entries": v[1], "bytes": v[2]}
                             for k, v in sorted(tally.after.items())},
        "left_after_clean_ending": {"entries": tally.clean_left[0],
                                    "bytes": tally.clean_left[1]},
        "left_after_next_run": {k: {"entries": v[0], "bytes": v[1]}
                                for k, v in tally.next_left.items()},
        "left_after_next_run_items": tally.next_left_items,
        "capped_runs_exit_0": len(capped),
        "max_rss_over_cap": round(worst[0], 3),
        "max_rss_over_cap_without_cap_warning": round(worst_quiet[0], 3),
        "parent_rss_kib_max": max((r["parent_rss_kib"] for r in runs), default=0),
        "max_rss_run": None if worst[1] is None else
        {k: worst[1][k] for k in ("iteration", "config", "cap", "rss_kib", "argv")},
        "runs_over_1.05cap_plus_32MiB": [
            {k: r[k] for k in ("iteration", "config", "cap", "rss_kib", "cap_warning", "argv")}
            for r in over],
        "references": {k: {"seconds": round(v[1], 3), "bytes": os.path.getsize(v[0])}
                       for k, v in refs.items()},
        "runs_detail": runs,
    }
    for r in runs:
        s["endings"][r["ending"]] = s["endings"].get(r["ending"], 0) + 1
    return s


def print_summary(s):
    nl = s["left_after_next_run"]
    over = s["runs_over_1.05cap_plus_32MiB"]
    rows = [
        ("runs (pairs)", f"{s['runs']} ({s['pairs']})"),
        ("wrong results", s["wrong_results"]),
        ("hangs", s["hangs"]),
        ("unexpected endings", s["unexpected_endings"]),
        ("left after the next run: spill", f"{nl['spill']['entries']} entries, "
                                            f"{nl['spill']['bytes']} bytes"),
        ("left after the next run: partial outputs", f"{nl['partial']['entries']} entries, "
                                                     f"{nl['partial']['bytes']} bytes"),
        ("left after the next run: other", f"{nl['other']['entries']} entries, "
                                           f"{nl['other']['bytes']} bytes"),
        ("left right after a clean ending",
         f"{s['left_after_clean_ending']['entries']} entries, "
         f"{s['left_after_clean_ending']['bytes']} bytes"),
        ("largest resident set / cap", f"{s['max_rss_over_cap']} "
                                       f"(of {s['capped_runs_exit_0']} capped runs, exit 0)"),
        ("  the same, runs without the cap warning", s["max_rss_over_cap_without_cap_warning"]),
        ("runs over 1.05 x cap + 32 MiB (with cap warning)",
         f"{len(over)} ({sum(r['cap_warning'] for r in over)})"),
        ("floor of ru_maxrss (this script's RSS)", f"{s['parent_rss_kib_max'] / 1024:.1f} MiB"),
        ("left at the end, not judged", s["left_pending_at_end"]),
        ("wall time", f"{s['seconds']} s"),
    ]
    print()
    for k, v in rows:
        print(f"  {k:50s} {v}")
    print("\n  endings:")
    for k, v in sorted(s["endings"].items()):
        print(f"    {k:40s} {v}")
    print("\n  left right after (iterations, entries, bytes), by how the runs ended:")
    for k, v in s["left_right_after"].items():
        print(f"    {k:60s} {v['iterations']:4d} {v['entries']:4d} {v['bytes']:12d}")
    for r in over:
        print(f"\n  over 1.05 x cap + 32 MiB: iteration {r['iteration']}, "
              f"peak {r['rss_kib'] / 1024:.0f} MiB, cap warning {r['cap_warning']}")
        print("    outcore " + " ".join(r["argv"]))
    bad = [r for r in s["runs_detail"] if r["result"] != "ok"]
    for r in bad:
        print(f"\n  {r['result']}: iteration {r['iteration']}, exit {r['status']}, "
              f"signal {signame(r['signal'])} sent at {r.get('sent')}, "
              f"RLIMIT_AS {r['rlimit_as']}")
        print("    outcore " + " ".join(r["argv"]))
        for ln in r.get("stderr", []):
            print("    | " + ln)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=None, help="runs (default 500; 30 with --short)")
    ap.add_argument("--short", action="store_true", help="a quick check: 30 runs")
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--binary", default="target/release/outcore")
    ap.add_argument("--out", default=None, help="JSON summary file")
    ap.add_argument("--work", default=None, help="work directory (default: new, under /var/tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    runs = args.runs if args.runs is not None else (30 if args.short else 500)
    args.binary = os.path.abspath(args.binary)
    work = args.work or tempfile.mkdtemp(prefix="outcore-soak-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    log = lambda m: print(m, flush=True)
    t0 = time.monotonic()
    try:
        prepare(args.binary, work)
        cfgs = configs(work)
        refs = build_refs(args.binary, cfgs, work, log)
        rng = random.Random(args.seed)
        slot = f"{work}/slot"
        os.makedirs(f"{slot}/tmp", mode=0o700), os.makedirs(f"{slot}/out")
        tally, pending, i = Tally(), {}, 0
        while len(tally.runs) < runs:
            iteration(i, rng, args, cfgs, refs, slot, pending, tally, log)
            i += 1
        final_sweep(args.binary, cfgs, slot, i, pending, tally, log)
        s = summary(tally, refs, args, time.monotonic() - t0)
        s["left_pending_at_end"] = len(pending)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_summary(s)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(s, f, indent=1)
    nl = s["left_after_next_run"]
    failed = (s["wrong_results"] or s["hangs"] or s["unexpected_endings"]
              or s["left_after_clean_ending"]["entries"]
              or any(v["entries"] for v in nl.values()))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
