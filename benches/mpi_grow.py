#!/usr/bin/env python3
"""Growth onto free MPI slots (issue 42): one rank out of core, grown from
1 to 4 ranks, and started on 4, side by side in one run.

    cargo build --release -p outcore-jobs --features mpi
    sudo python3 benches/mpi_grow.py                    # 1 GiB, 256 MiB per rank
    sudo python3 benches/mpi_grow.py --data 256MiB --cap 64MiB --nodes 2

The data is a `.npy` file written by `outcore gen`, 4x one rank's cap.
Every run is `outcore kmeans --input x.npy` with the same flags, one worker
per rank, the page cache dropped first (root), ranks yielding their core
while they wait (OMPI_MCA_mpi_yield_when_idle=1: this machine has fewer
cores than slots): (a) `mpirun -np 1`, out of
core; (b) `mpirun -np 1 --host localhost:4 ... --max-ranks auto`, which
grows; (c) `mpirun -np 4 --host localhost:4`. With `--nodes 2` the grown and the started-on-4
runs also run on two simulated nodes (jobs/tests/mpi/netns.sh: network
namespaces joined by a veth pair, TCP between them), starting on node A.

Printed, per run: wall seconds, load seconds (for the grown run: the first
load, the growth and the second load), the growth's own seconds, the
median steady epoch (after the first), and the bytes read per steady epoch
summed over the ranks. The centroids must be the same bytes in every run.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NETNS = os.path.join(ROOT, "jobs", "tests", "mpi", "netns.sh")
# 4 slots on a machine of 2 cores: without yielding, every rank waiting in
# a collective spins on a core the working ranks need (measured: steady
# epochs 4.5-5.0 s instead of 1.3 s, grown or started on 4 alike).
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_mpi_yield_when_idle="1")


def drop_caches():
    """Drops the page cache (root only; silently skipped otherwise)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def run(name, launcher, binary, args, workdir):
    """One run in its own directory: its --stats, its stderr, its centroids."""
    d = os.path.join(workdir, name)
    os.makedirs(d)
    drop_caches()
    cmd = [*launcher, binary, *args, "--stats", "s.json", "--output", "c.npy"]
    p = subprocess.run(cmd, cwd=d, env=ENV, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{name} failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
    with open(os.path.join(d, "s.json")) as f:
        stats = json.load(f)
    with open(os.path.join(d, "c.npy"), "rb") as f:
        centroids = f.read()
    return stats, p.stderr, centroids


def row(name, s):
    """The table row of run `name` from its stats."""
    epochs = s["epoch_seconds"]
    steady = epochs[1:] if len(epochs) > 1 else epochs
    reads = s["epoch_bytes_read"][1:] if len(epochs) > 1 else s["epoch_bytes_read"]
    growth = s.get("growth") or []
    return {
        "run": name,
        "ranks": s.get("ranks", s.get("processes")),
        "wall_s": round(s["wall_seconds"], 2),
        "load_s": round(s["load_seconds"], 2),
        "growth_s": round(growth[0]["seconds"], 2) if growth else None,
        "steady_epoch_s": round(statistics.median(steady), 3),
        "read_per_steady_epoch_mib": round(statistics.median(reads) / 2**20, 1),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="1GiB", help="data size (default 1GiB)")
    ap.add_argument("--cap", default="256MiB", help="cap per rank (default 256MiB)")
    ap.add_argument("--dims", default="64")
    ap.add_argument("--k", default="64")
    ap.add_argument("--epochs", default="4")
    ap.add_argument("--nodes", type=int, default=1, choices=[1, 2])
    ap.add_argument("--slots", type=int, default=4, help="slots of the allocation (default 4)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "outcore"))
    ap.add_argument("--dir", default="/var/tmp", help="where the data and runs go")
    a = ap.parse_args()
    if shutil.which("mpirun") is None:
        sys.exit("mpirun is needed")
    work = tempfile.mkdtemp(prefix="outcore-grow-", dir=a.dir)
    try:
        x = os.path.join(work, "x.npy")
        subprocess.run([a.binary, "gen", "--synthetic", a.data, "--dims", a.dims,
                        "--true-k", "16", "--output", x], check=True, capture_output=True)
        args = ["kmeans", "--input", x, "--k", a.k, "--epochs", a.epochs,
                "--mem-cap", a.cap, "--workers", "1"]
        mpirun = ["mpirun", "--bind-to", "none", "--oversubscribe"]
        host = f"localhost:{a.slots}"
        half = f"{(a.slots + 1) // 2} {a.slots // 2}"
        # (c) starts on as many ranks as (b) grew to: {n} is filled in.
        runs = [
            ("a: 1 rank, out of core", [*mpirun, "-np", "1"], args),
            (f"b: grown from 1 rank ({a.slots} slots)",
             [*mpirun, "-np", "1", "--host", host], [*args, "--max-ranks", "auto"]),
            ("c: started on {n} ranks", [*mpirun, "-np", "{n}", "--host", host], args),
        ]
        if a.nodes == 2:
            runs += [
                (f"b2: grown from 1 rank on node A ({half.replace(' ', '+')} slots)",
                 ["env", f"NETNS_SLOTS={half}", "bash", NETNS, "1"],
                 [*args, "--max-ranks", "auto"]),
                ("c2: started on {n} ranks over 2 nodes", ["bash", NETNS, "{n}"], args),
            ]
        rows, reference, grown = [], None, 1
        for i, (name, launcher, run_args) in enumerate(runs):
            name = name.replace("{n}", str(grown))
            launcher = [x.replace("{n}", str(grown)) for x in launcher]
            s, err, c = run(f"run{i}", launcher, a.binary, run_args, work)
            grew = [l for l in err.splitlines() if l.startswith("grew from")]
            r = row(name, s)
            if "growth" in s and s["growth"]:
                grown = s["ranks"]
            r["said"] = grew[0] if grew else ""
            rows.append(r)
            print(json.dumps(r), flush=True)
            if reference is None:
                reference = c
            elif c != reference:
                sys.exit(f"{name}: the centroids differ from run a")
        print(f"\ndata {a.data} (float32, {a.dims} dims), cap {a.cap} per rank, k {a.k}, "
              f"{a.epochs} epochs, 1 worker per rank; centroids identical in every run\n")
        keys = ["run", "ranks", "wall_s", "load_s", "growth_s", "steady_epoch_s",
                "read_per_steady_epoch_mib"]
        print("| " + " | ".join(keys) + " |")
        print("|" + "---|" * len(keys))
        for r in rows:
            print("| " + " | ".join("" if r[k] is None else str(r[k]) for k in keys) + " |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
