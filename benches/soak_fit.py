"""One fit of `outcore.KMeans` for `benches/soak.py`, with the command
line's flags (run by an interpreter that imports outcore):

    python soak_fit.py --input X.npy --mode memmap|array [--mem-cap SIZE|none]
        [--workers N] [--spill-dir DIR] --output PREFIX

Writes PREFIX-centers.npy and PREFIX-labels.npy, and on standard output
one JSON line: the resident set before the fit and its peak during it
(VmHWM reset first), so that the interpreter and an in-memory array are
not counted against the cap. A cap too small is one line,
`python: error: MemoryError: ...`, and exit 2; Ctrl-C (SIGINT) exit 130.
"""
import json
import sys

try:
    import numpy as np
    import outcore

    def kib(field):
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith(field))

    a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    X = np.load(a["--input"], mmap_mode="r" if a["--mode"] == "memmap" else None)
    cap = a.get("--mem-cap", "none")
    est = outcore.KMeans(16, n_init=1, max_iter=6, tol=0, random_state=4,
                         mem_cap=None if cap == "none" else cap,
                         n_jobs=int(a.get("--workers", "2")), spill_dir=a.get("--spill-dir"))
    base = kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    try:
        est.fit(X)
    except MemoryError as e:
        print("python: error: MemoryError: " + " ".join(str(e).split()), file=sys.stderr)
        sys.exit(2)
    peak = kib("VmHWM")
    np.save(a["--output"] + "-centers.npy", est.cluster_centers_)
    np.save(a["--output"] + "-labels.npy", est.labels_)
    print(json.dumps({"base_kib": base, "peak_kib": peak,
                      "evictions": est.stats_["evictions"]}), flush=True)
except KeyboardInterrupt:
    sys.exit(130)
