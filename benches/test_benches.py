#!/usr/bin/env python3
"""Checks the benchmark scripts' own plumbing, quickly (run by .ci/run, as
root: the device reads drop the page cache).

compare.py takes its device reads from wholerun.py; when wholerun's
functions came to return several runs each, compare.py nested those lists
and failed at its very end, after five minutes of runs. Here the real
functions read a small file, and compare.py's bound line is built from
what they return. wholerun's reads into memory of a given size run too.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import pagerank  # noqa: E402
import wholerun  # noqa: E402


def main():
    # Not on tmpfs, which refuses O_DIRECT.
    with tempfile.NamedTemporaryFile(dir="/var/tmp", suffix=".bin") as f:
        f.write(os.urandom(8 << 20))
        f.flush()
        os.fsync(f.fileno())
        bws, fios = compare.device_reads(f.name)
        # wholerun's reads into memory of a given size: whole pieces, any region.
        lands = [wholerun.landing(f.name, region) for region in (8 << 20, 3 << 20)]
    assert all(isinstance(x, float) and x > 0 for x in lands), lands
    for name, v in (("dd", bws), ("fio", fios)):
        assert isinstance(v, list) and all(isinstance(b, (int, float)) and b > 0 for b in v), (name, v)
    assert bws, "dd gave no run"
    bw, text = compare.bound_text(bws, fios)
    assert bw == (max(fios) if fios else max(bws)), (bw, bws, fios)
    assert f"{bw / 1e9:.2f} GB/s" in text, text
    # Without fio the bound falls back to dd.
    bw2, text2 = compare.bound_text(bws, [])
    assert bw2 == max(bws) and "dd iflag=direct" in text2, text2
    # pagerank.py's figures from a run's JSON line: the steady iteration
    # leaves out the first.
    d = {"iterations": 4, "iteration_seconds": [2.0, 1.0, 1.2, 1.1],
         "stats": {"bytes_read": 4 << 20, "demand_loads": 3}}
    assert pagerank.summary(d) == (1.1, float(1 << 20), 3), pagerank.summary(d)
    # A repeat's bound: its device runs' mean, and the uncapped iteration
    # when that is longer than the reads.
    assert pagerank.judge(0.5, 1e9, [1e9, 2e9]) == (1e9 / 1.5e9, 1.5e9)
    assert pagerank.judge(0.9, 1e9, [2e9, 2e9]) == (0.9, 2e9)
    print(f"benches ok: dd {len(bws)} runs, fio {len(fios)} runs, bound {bw / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
