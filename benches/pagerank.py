#!/usr/bin/env python3
"""The out-of-core PageRank example against its physical bound, side by
side in one run (issue 40).

    cargo build --release --example pagerank
    sudo python3 benches/pagerank.py                      # 1 GiB of edges under 128 MiB
    sudo python3 benches/pagerank.py --edges 256MiB --cap 48MiB --repeat 3

Each repeat runs, one after another: uncapped with 1 worker, uncapped with
2 workers, and capped with 2 workers (page cache dropped first). From each
it takes the steady iteration (the median of the iterations after the
first), the bytes read per iteration, the demand loads and the digest of
the final ranks, which must be the same in every run.

The device's read bandwidth is fio reading a 1 GiB file in the spill
directory with `O_DIRECT`, 1 MiB requests, 8 in flight (`dd iflag=direct`
where fio is missing), page cache dropped, right before and right after
each capped run: on a shared virtual disk the rate swings by 2x between
minutes, so each capped run is judged against the device as it was
around it. A repeat's bound is the larger of its uncapped iteration
(2 workers) and the bytes its capped run read per iteration at the mean
of the two device runs around it. Printed: each repeat's figures and
capped / bound (target: at most 1.25), the median over repeats, and
2 workers over 1 uncapped (target: at least 1.8). Needs root to drop the
page cache.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wholerun import dd_bandwidth, drop_caches, fio_bandwidth, size  # noqa: E402


def run(binary, args, cap, workers, spill_dir):
    """One run of the example: its JSON line."""
    cmd = [binary, *args, "--mem-cap", cap, "--workers", str(workers), "--spill-dir", spill_dir]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def summary(d):
    """Steady iteration seconds, bytes read per iteration, demand loads."""
    it = d["iteration_seconds"]
    steady = statistics.median(it[1:] if len(it) > 1 else it)
    s = d["stats"]
    return steady, s["bytes_read"] / d["iterations"], s["demand_loads"]


def bandwidth_file(spill_dir):
    """A 1 GiB file of random bytes in the spill directory, for the device
    reads."""
    f = tempfile.NamedTemporaryFile(dir=spill_dir, suffix=".bw")
    chunk = os.urandom(1 << 20)
    for _ in range(1024):
        f.write(chunk)
    f.flush()
    os.fsync(f.fileno())
    return f


def device_bandwidth(path):
    """One fio (or, without fio, dd) direct read of `path`: bytes/s and the
    tool's name."""
    runs = fio_bandwidth(path, runs=1)
    return (runs[0], "fio") if runs else (dd_bandwidth(path)[0], "dd")


def judge(two, capped_read, bws):
    """A repeat's bound and its capped iteration's ratio to it: `two` is the
    uncapped steady iteration (2 workers), `capped_read` the capped run's
    bytes per iteration, `bws` the device runs around it."""
    bw = statistics.mean(bws)
    return max(two, capped_read / bw), bw


def repeat_once(a, args, spill, bwfile, digests):
    """One repeat: the three runs and the device around the capped one."""
    fig = {}
    for name, cap, workers in (("one", "none", 1), ("two", "none", 2), ("capped", a.cap, 2)):
        if name == "capped":
            before, tool = device_bandwidth(bwfile)
        drop_caches()
        d = run(a.bin, args, cap, workers, spill)
        digests.add(d["digest"])
        fig[name] = summary(d)
    after, _ = device_bandwidth(bwfile)
    bound, bw = judge(fig["two"][0], fig["capped"][1], [before, after])
    return {
        "uncapped_1_worker_s": fig["one"][0], "uncapped_2_workers_s": fig["two"][0],
        "capped_s": fig["capped"][0], "capped_read_bytes_per_iteration": fig["capped"][1],
        "capped_demand_loads": fig["capped"][2], "device_runs": [before, after], "device_tool": tool,
        "device_read_bytes_per_s": bw, "bound_s": bound, "capped_over_bound": fig["capped"][0] / bound,
        "workers_speedup": fig["one"][0] / fig["two"][0],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/examples/pagerank")
    p.add_argument("--edges", type=size, default=1 << 30)
    p.add_argument("--nodes", default="2M")
    p.add_argument("--blocks", help="node blocks (default: the example's)")
    p.add_argument("--cap", default="128MiB")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--spill-dir", default="/var/tmp")
    a = p.parse_args()
    args = ["--edges", str(a.edges), "--nodes", a.nodes, "--iters", str(a.iters)]
    if a.blocks:
        args += ["--blocks", a.blocks]
    reps, digests = [], set()
    with tempfile.TemporaryDirectory(dir=a.spill_dir, prefix="pagerank-bench-") as spill:
        with bandwidth_file(spill) as bwfile:
            for r in range(a.repeat):
                x = repeat_once(a, args, spill, bwfile.name, digests)
                reps.append(x)
                print(f"repeat {r + 1}: uncapped {x['uncapped_1_worker_s']:.3f} s (1 worker), "
                      f"{x['uncapped_2_workers_s']:.3f} s (2); capped {x['capped_s']:.3f} s, "
                      f"{x['capped_read_bytes_per_iteration'] / 2**20:.0f} MiB read per iteration, "
                      f"{x['capped_demand_loads']} demand loads; device "
                      f"{'/'.join(f'{b / 1e6:.0f}' for b in x['device_runs'])} MB/s ({x['device_tool']}) "
                      f"before/after; bound {x['bound_s']:.3f} s; capped / bound "
                      f"{x['capped_over_bound']:.2f}", flush=True)
    ratio = statistics.median(x["capped_over_bound"] for x in reps)
    speedup = statistics.median(x["workers_speedup"] for x in reps)
    result = {
        "edges_bytes": a.edges, "nodes": a.nodes, "blocks": a.blocks, "cap": a.cap, "iters": a.iters,
        "repeats": reps, "capped_over_bound_median": ratio,
        "capped_over_bound_max": max(x["capped_over_bound"] for x in reps),
        "workers_speedup_median": speedup, "same_digest": len(digests) == 1,
    }
    each = ", ".join(f"{x['capped_over_bound']:.2f}" for x in reps)
    print(f"capped / bound: median {ratio:.2f} over {len(reps)} repeats, each {each} (target <= 1.25); "
          f"2 workers {speedup:.2f}x 1 worker uncapped (target >= 1.8); "
          f"digests {'all equal' if len(digests) == 1 else 'DIFFER'}")
    print(json.dumps(result))
    if len(digests) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
