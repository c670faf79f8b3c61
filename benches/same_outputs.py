#!/usr/bin/env python3
"""Runs two `outcore` binaries on the same commands and compares every
output file byte for byte: a refactoring must not change a result.

    python3 benches/same_outputs.py --old OLD/outcore --new target/release/outcore
    python3 benches/same_outputs.py --old A --new B --mpi 2   # also on 2 ranks

Cases: `gen`; `kmeans` (mini-batch and Lloyd, capped and uncapped, labels,
sample weights, n_init, --init file, synthetic and file input); `train`
(SGD and L-BFGS, capped and uncapped, synthetic and file input, holdout);
`predict` (centroids with distances, model); `plot` of one timeline. Every output (.npy) of the old
binary must equal the new one's; statistics and timelines hold timings, so
only their keys are compared. With --mpi N, each MPI case also runs on N
ranks of the new binary and must equal one process.

Exit status 0 when everything is equal, 1 otherwise; one line per case.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def cases(data, weights, init, targets):
    """(name, args, outputs): `{out}` in args is the run's own directory."""
    km = ["kmeans", "--k", "12", "--task-points", "500", "--shards", "4"]
    syn = ["--synthetic", "12MiB", "--dims", "24", "--true-k", "12"]
    return [
        ("kmeans minibatch capped", km + syn + ["--mem-cap", "6MiB", "--epochs", "2"],
         ["c.npy", "l.npy"]),
        ("kmeans minibatch uncapped", km + syn + ["--mem-cap", "none", "--epochs", "2"],
         ["c.npy", "l.npy"]),
        ("kmeans lloyd capped", km + syn + ["--algorithm", "lloyd", "--mem-cap", "6MiB",
                                            "--iterations", "4"], ["c.npy", "l.npy"]),
        ("kmeans lloyd uncapped", km + syn + ["--algorithm", "lloyd", "--mem-cap", "none",
                                              "--iterations", "4"], ["c.npy", "l.npy"]),
        ("kmeans n-init 2 random", km + syn + ["--n-init", "2", "--init", "random",
                                               "--mem-cap", "8MiB"], ["c.npy", "l.npy"]),
        ("kmeans file, weights", km + ["--input", data, "--sample-weight", weights,
                                       "--mem-cap", "4MiB", "--tol", "0.01"],
         ["c.npy", "l.npy"]),
        ("kmeans lloyd file, init", ["kmeans", "--input", data, "--init", init,
                                     "--algorithm", "lloyd", "--mem-cap", "4MiB",
                                     "--task-points", "500", "--shards", "4"],
         ["c.npy", "l.npy"]),
        ("train sgd capped", ["train", "--synthetic", "8MiB", "--dims", "16", "--classes", "5",
                              "--solver", "sgd", "--rounds", "3", "--mem-cap", "4MiB",
                              "--holdout", "0.1", "--shards", "4"], ["m.npy"]),
        ("train lbfgs uncapped", ["train", "--synthetic", "8MiB", "--dims", "16",
                                  "--classes", "5", "--solver", "lbfgs", "--max-iter", "15",
                                  "--mem-cap", "none", "--shards", "4"], ["m.npy"]),
        ("train lbfgs file capped", ["train", "--input", data, "--targets", targets,
                                     "--solver", "lbfgs", "--max-iter", "10",
                                     "--mem-cap", "4MiB", "--holdout", "0.2",
                                     "--shards", "4"], ["m.npy"]),
    ]


def outputs_args(args, outs, out):
    """The output flags for a case's outputs, in `out`."""
    flag = {"c.npy": "--output", "l.npy": "--labels", "m.npy": "--output"}
    extra = []
    for o in outs:
        extra += [flag[o], os.path.join(out, o)]
    return args + extra + ["--stats", os.path.join(out, "s.json")]


def run(binary, args, out, ranks=0):
    os.makedirs(out, exist_ok=True)
    cmd = [binary] + args
    env = dict(os.environ)
    if ranks:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
        env.update(MPI_ENV)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")


def same(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def keys(path):
    with open(path) as f:
        return sorted(json.load(f).keys())


def compare(name, outs, da, db, stats=True):
    bad = [o for o in outs if not same(os.path.join(da, o), os.path.join(db, o))]
    note = ""
    if stats:
        ka, kb = keys(os.path.join(da, "s.json")), keys(os.path.join(db, "s.json"))
        if ka != kb:
            note = f" (stats keys: -{sorted(set(ka) - set(kb))} +{sorted(set(kb) - set(ka))})"
    print(f"{'same' if not bad else 'DIFFERENT'}  {name}: {', '.join(outs)}"
          + (f"; differ: {bad}" if bad else "") + note, flush=True)
    return not bad


def prepare(old, new, tmp):
    """Input files, from `gen` (compared too) and an old kmeans run."""
    ok = True
    for b, d in ((old, "gen-old"), (new, "gen-new")):
        run(b, ["gen", "--synthetic", "6MiB", "--dims", "24", "--true-k", "12", "--seed", "7",
                "--output", os.path.join(tmp, d, "x.npy")], os.path.join(tmp, d))
    ok &= compare("gen", ["x.npy"], os.path.join(tmp, "gen-old"),
                  os.path.join(tmp, "gen-new"), stats=False)
    data = os.path.join(tmp, "gen-old", "x.npy")
    rows = (os.path.getsize(data) - 128) // (24 * 4)
    weights = os.path.join(tmp, "w.npy")
    init = os.path.join(tmp, "init.npy")
    targets = os.path.join(tmp, "t.npy")
    write_npy(weights, "<f4", [rows], [((i * 37) % 11) / 5.0 for i in range(rows)], "f")
    pre = os.path.join(tmp, "pre")
    run(old, ["kmeans", "--input", data, "--k", "5", "--epochs", "1", "--output", init,
              "--labels", targets, "--mem-cap", "none"], pre)
    return ok, data, weights, init, targets


def write_npy(path, descr, shape, values, fmt):
    import struct
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s,), }" % (
        descr, ", ".join(map(str, shape)))
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))


def predicts(old, new, tmp, data, init):
    ok = True
    model = os.path.join(tmp, "new", "train lbfgs file capped", "m.npy")
    runs = [
        ("predict centroids", ["predict", "--input", data, "--centroids", init,
                               "--mem-cap", "2MiB"], ["l.npy", "d.npy"]),
        ("predict model", ["predict", "--input", data, "--model", model], ["l.npy"]),
    ]
    for name, args, outs in runs:
        dirs = []
        for b, side in ((old, "old"), (new, "new")):
            d = os.path.join(tmp, side, name)
            extra = ["--labels", os.path.join(d, "l.npy")]
            if "d.npy" in outs:
                extra += ["--distances", os.path.join(d, "d.npy")]
            run(b, args + extra + ["--stats", os.path.join(d, "s.json")], d)
            dirs.append(d)
        ok &= compare(name, outs, *dirs)
    return ok


def plots(old, new, tmp):
    """`plot` of one timeline (the new binary's) by both binaries."""
    d = os.path.join(tmp, "plot")
    csv = os.path.join(d, "t.csv")
    run(new, ["kmeans", "--synthetic", "8MiB", "--dims", "16", "--k", "4", "--mem-cap", "4MiB",
              "--timeline", csv], d)
    for b, side in ((old, "old"), (new, "new")):
        run(b, ["plot", csv, "--output", os.path.join(d, side, "p.png")], os.path.join(d, side))
    return compare("plot", ["p.png"], os.path.join(d, "old"), os.path.join(d, "new"), stats=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--mpi", type=int, default=0, metavar="N",
                    help="also run the MPI-capable cases on N ranks of --new")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="outcore-same-")
    try:
        ok, data, weights, init, targets = prepare(a.old, a.new, tmp)
        for name, args, outs in cases(data, weights, init, targets):
            dirs = []
            for b, side in ((a.old, "old"), (a.new, "new")):
                d = os.path.join(tmp, side, name)
                run(b, outputs_args(args, outs, d), d)
                dirs.append(d)
            ok &= compare(name, outs, *dirs)
            if a.mpi:
                d = os.path.join(tmp, f"mpi{a.mpi}", name)
                run(a.new, outputs_args(args, outs, d), d, ranks=a.mpi)
                ok &= compare(f"{name} on {a.mpi} ranks", outs, dirs[1], d, stats=False)
        ok &= predicts(a.old, a.new, tmp, data, init)
        ok &= plots(a.old, a.new, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("all outputs equal" if ok else "SOME OUTPUTS DIFFER")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
