"""Lend this process's memory to the ranks of a job beside it under mpirun.

    mpirun -np 2 python fit.py : -np 1 python -m outcore.lend --mem-cap 16GiB

The job's ranks evict their data to the lender's memory before their
disk, and load it back from there (docs/mpi.md, "Lenders"). The lender
ends when the ranks do, with one line on stderr. Needs outcore built with
MPI and an MPI library that gives MPI_THREAD_MULTIPLE.
"""

import argparse
import sys

from outcore import _core


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m outcore.lend",
        description="Lend this process's memory to the ranks of a job beside it under mpirun.",
    )
    p.add_argument(
        "--mem-cap",
        default="auto",
        metavar="SIZE|auto",
        help="the most memory this process holds for the job (default: auto, its "
        "share of the node's memory among the processes mpirun started there)",
    )
    a = p.parse_args(argv)
    try:
        _core.lend(a.mem_cap)
    except (ValueError, RuntimeError) as e:
        print(f"outcore: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
