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

The device's read bandwidth B is fio reading a 1 GiB file in the spill
directory with `O_DIRECT`, 1 MiB requests, 8 in flight (`dd iflag=direct`
where fio is missing), page cache dropped, before and after the runs. The
physical bound of a capped iteration is the larger of the uncapped
iteration (2 workers) and the bytes it read at B. Printed: each figure, the
capped iteration over its bound (target: at most 1.25), and 2 workers
over 1 uncapped (target: at least 1.8). Needs root to drop the page cache.
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


def device_bandwidth(spill_dir):
    """fio's (or dd's) direct reads of a 1 GiB file in the spill directory,
    bytes/s each run."""
    with tempfile.NamedTemporaryFile(dir=spill_dir, suffix=".bw") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(1024):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
        runs = fio_bandwidth(f.name)
        return runs if runs else dd_bandwidth(f.name), "fio" if runs else "dd"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="target/release/examples/pagerank")
    p.add_argument("--edges", type=size, default=1 << 30)
    p.add_argument("--nodes", default="2M")
    p.add_argument("--blocks", help="node blocks (default: the example's)")
    p.add_argument("--cap", default="128MiB")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--spill-dir", default="/var/tmp")
    a = p.parse_args()
    args = ["--edges", str(a.edges), "--nodes", a.nodes, "--iters", str(a.iters)]
    if a.blocks:
        args += ["--blocks", a.blocks]
    with tempfile.TemporaryDirectory(dir=a.spill_dir, prefix="pagerank-bench-") as spill:
        bws, tool = device_bandwidth(spill)
        rows = {"uncapped, 1 worker": [], "uncapped, 2 workers": [], f"{a.cap}, 2 workers": []}
        digests = set()
        for r in range(a.repeat):
            for name, cap, workers in (("uncapped, 1 worker", "none", 1),
                                       ("uncapped, 2 workers", "none", 2),
                                       (f"{a.cap}, 2 workers", a.cap, 2)):
                drop_caches()
                d = run(a.bin, args, cap, workers, spill)
                digests.add(d["digest"])
                rows[name].append(summary(d))
                steady, read, demand = rows[name][-1]
                print(f"repeat {r + 1}, {name}: steady iteration {steady:.3f} s, "
                      f"read {read / 2**20:.0f} MiB per iteration, {demand} demand loads", flush=True)
        bws += device_bandwidth(spill)[0]
    bw = statistics.median(bws)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
               statistics.median(x[2] for x in v)) for k, v in rows.items()}
    one, two, capped = (med[k] for k in rows)
    bound = max(two[0], capped[1] / bw)
    result = {
        "edges_bytes": a.edges, "nodes": a.nodes, "blocks": a.blocks, "cap": a.cap, "iters": a.iters, "repeat": a.repeat,
        "device_read_bytes_per_s": bw, "device_tool": tool, "device_runs": bws,
        "uncapped_1_worker_s": one[0], "uncapped_2_workers_s": two[0],
        "capped_s": capped[0], "capped_read_bytes_per_iteration": capped[1],
        "capped_demand_loads": capped[2], "bound_s": bound,
        "capped_over_bound": capped[0] / bound, "workers_speedup": one[0] / two[0],
        "same_digest": len(digests) == 1,
    }
    print(f"device: {bw / 1e6:.0f} MB/s ({tool}, median of {len(bws)} runs)")
    print(f"bound: max(uncapped {two[0]:.3f} s, {capped[1] / 2**20:.0f} MiB at {bw / 1e6:.0f} MB/s "
          f"= {capped[1] / bw:.3f} s) = {bound:.3f} s")
    print(f"capped {capped[0]:.3f} s = {capped[0] / bound:.2f}x the bound (target <= 1.25); "
          f"2 workers {one[0] / two[0]:.2f}x 1 worker uncapped (target >= 1.8); "
          f"digests {'all equal' if len(digests) == 1 else 'DIFFER'}")
    print(json.dumps(result))
    if len(digests) != 1:
        sys.exit(1)


if __name__ == "__main__":
    main()
