#!/usr/bin/env python3
"""The experiment outcore comes from, on this machine: mini-batch K-means
at the seed's shape (10,000 dimensions, k = 1000, batches of 40 tasks x
1,100 rows) on data 2x and 3x a memory cgroup, three ways:

  swap     the job given the whole dataset in memory (`--mem-cap none`),
           the kernel swapping to a swap file past the cgroup's limit
           (the seed's baseline);
  outcore  `outcore kmeans --mem-cap auto` in the same cgroup (the cap
           comes from the cgroup's limit; no swap);
  ulimit   the seed's own way: `ulimit -v` at the cgroup's size and the
           allocation trap alone (`--mem-cap none`), in the cgroup.

For each: seconds per epoch (the first one reads the input; the later
ones are the steady state), the peak resident set (`VmHWM`) and the
cgroup's peak, and the bytes read per epoch (outcore: its stats; swap:
pages swapped in, from /proc/vmstat). Needs root, cgroup v1's memory
controller and room for the data and the swap file in --dir.

    python3 benches/seed_experiment.py --outcore target/release/outcore \\
        --cgroup 1GiB --multiples 2,3 --epochs 3 --dir /var/tmp/seed

Prints one JSON line per run and a table; results go in
benches/RESULTS.md ("The seed's experiment").
"""

import argparse
import json
import os
import subprocess
import sys
import time

CG_ROOT = "/sys/fs/cgroup/memory"
NAME = "outcore_seed"
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size(s):
    for u, m in UNITS.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


def vmstat(key):
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k == key:
                return int(v)
    return 0


def cgroup(limit):
    path = os.path.join(CG_ROOT, NAME)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    with open(os.path.join(path, "memory.max_usage_in_bytes"), "w") as f:
        f.write("0")
    return path


def swap(dir_, bytes_, on):
    path = os.path.join(dir_, "swapfile")
    if on:
        if not os.path.exists(path):
            subprocess.run(["fallocate", "-l", str(bytes_), path], check=True)
            os.chmod(path, 0o600)
            subprocess.run(["mkswap", path], check=True, capture_output=True)
        subprocess.run(["swapon", path], check=True)
    else:
        subprocess.run(["swapoff", path], capture_output=True)


def run(args, label, data, extra, vlimit, cg):
    stats = os.path.join(args.dir, f"{label}.json")
    cmd = [args.outcore, "kmeans", "--input", data, "--k", "1000",
           "--epochs", str(args.epochs), "--stats", stats,
           "--workers", str(args.workers)] + extra
    ulimit = f"ulimit -v {vlimit // 1024}; " if vlimit else ""
    shell = f"echo $$ > {cg}/cgroup.procs; {ulimit}exec \"$@\""
    swapped = vmstat("pswpin")
    t = time.time()
    try:
        p = subprocess.run(["sh", "-c", shell, "sh"] + cmd, capture_output=True,
                           text=True, timeout=args.timeout)
        code, err = p.returncode, p.stderr.strip().splitlines()[-1:]
    except subprocess.TimeoutExpired:
        code, err = None, [f"did not finish in {args.timeout} s"]
    wall = time.time() - t
    out = {"run": label, "exit": code, "wall_seconds": round(wall, 1),
           "swapped_in_bytes": (vmstat("pswpin") - swapped) * 4096}
    with open(os.path.join(cg, "memory.max_usage_in_bytes")) as f:
        out["cgroup_peak_bytes"] = int(f.read())
    if code == 0:
        with open(stats) as f:
            s = json.load(f)
        for k in ("epoch_seconds", "epoch_bytes_read", "peak_bytes",
                  "peak_resident_bytes", "bytes_read", "mem_cap_bytes", "init_seconds"):
            out[k] = s.get(k)
    else:
        out["error"] = err
    print(json.dumps(out), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outcore", default="target/release/outcore")
    ap.add_argument("--cgroup", default="4GiB", help="the cgroup's memory limit")
    ap.add_argument("--multiples", default="2,3", help="data sizes, times the cgroup's")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--dir", default="/var/tmp/outcore-seed")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    ap.add_argument("--ways", default="outcore,ulimit,swap")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    limit = size(args.cgroup)
    cg = cgroup(limit)
    results = []
    try:
        for m in [float(x) for x in args.multiples.split(",")]:
            data = os.path.join(args.dir, f"x{m:g}.npy")
            if not os.path.exists(data):
                subprocess.run([args.outcore, "gen", "--synthetic", str(int(m * limit)),
                                "--dims", "10000", "--true-k", "1000", "--output", data],
                               check=True, capture_output=True)
            for way in args.ways.split(","):
                cgroup(limit)
                label = f"{way}-{m:g}x"
                # The page cache holds none of the input at the start.
                subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
                if way == "swap":
                    swap(args.dir, int(m * limit) + (1 << 30), True)
                    try:
                        r = run(args, label, data, ["--mem-cap", "none"], None, cg)
                    finally:
                        swap(args.dir, 0, False)
                elif way == "outcore":
                    r = run(args, label, data, ["--mem-cap", "auto"], None, cg)
                else:
                    r = run(args, label, data, ["--mem-cap", "none"], limit, cg)
                r["multiple"] = m
                results.append(r)
    finally:
        swap(args.dir, 0, False)
        try:
            os.rmdir(cg)
        except OSError:
            pass
    table(results)


def table(results):
    print("\n| data | way | epoch seconds | steady epoch | read per steady epoch | resident peak | cgroup peak |")
    print("|---|---|---|---|---|---|---|")
    steady = {}
    for r in results:
        es = r.get("epoch_seconds") or []
        st = sum(es[1:]) / len(es[1:]) if len(es) > 1 else None
        steady[(r["multiple"], r["run"].split("-")[0])] = st
        rd = r.get("epoch_bytes_read") or []
        if r["run"].startswith("swap"):
            read = f"{r['swapped_in_bytes'] / 2**30:.2f} GiB swapped in (all epochs)"
        else:
            read = f"{sum(rd[1:]) / max(len(rd) - 1, 1) / 2**30:.2f} GiB" if rd else "-"
        print(f"| {r['multiple']:g}x | {r['run'].split('-')[0]} | "
              f"{[round(x, 1) for x in es] if es else r.get('error')} | "
              f"{st and round(st, 1)} | {read} | "
              f"{(r.get('peak_resident_bytes') or 0) / 2**30:.2f} GiB | "
              f"{r['cgroup_peak_bytes'] / 2**30:.2f} GiB |")
    for m in sorted({k[0] for k in steady}):
        s, o = steady.get((m, "swap")), steady.get((m, "outcore"))
        if s and o:
            print(f"{m:g}x: outcore's steady epoch is {s / o:.1f}x faster than OS swap")


if __name__ == "__main__":
    sys.exit(main())
