#!/usr/bin/env python3
"""Run scikit-learn's own test files against outcore's estimators.

For each test file the script runs pytest twice on scikit-learn's installed
test file:

* **baseline** -- unmodified, with scikit-learn's classes;
* **outcore**  -- with outcore's classes substituted for scikit-learn's,

and reports, per file, how many of the tests that pass in the baseline
(N) also pass with outcore's classes (M), M/N, and the failures grouped by
the first line of their exception message (plus a coarse category:
sparse input refused, unsupported parameter, numerical mismatch, ...).
Parametrized tests count individually (they are compared by node id).

Usage::

    cd /tmp && OUTCORE_BIN=/work/main/target/debug/outcore \\
        /tmp/soakvenv/bin/python /work/main/benches/sklearn_suite.py \\
        --out /tmp/sklearn_suite.json [--files pca,ridge] [--timeout 120]

Substitutions (``--list`` prints them)
--------------------------------------
* ``decomposition/tests/test_pca.py``: ``PCA`` -> ``outcore.PCA``.
* ``decomposition/tests/test_incremental_pca.py``: ``IncrementalPCA`` ->
  ``outcore.IncrementalPCA`` only.  Every use of ``PCA`` in that file is as
  the reference that ``IncrementalPCA``'s results are compared against
  (``PCA(n_components=2).fit_transform(X)`` next to the incremental fit), so
  scikit-learn's ``PCA`` is kept: substituting it too would compare outcore
  with itself and hide differences.  ``test_pca.py`` covers outcore's PCA.
* ``linear_model/tests/test_base.py``: ``LinearRegression`` ->
  ``outcore.LinearRegression``.
* ``linear_model/tests/test_ridge.py``: ``Ridge`` -> ``outcore.Ridge`` only;
  ``RidgeCV``, ``RidgeClassifier``, ``LinearRegression`` (used there as a
  reference), ``ridge_regression`` stay scikit-learn's.
* ``linear_model/tests/test_sgd.py``: ``SGDClassifier``, ``SGDRegressor`` ->
  outcore's (``SGDOneClassSVM`` stays scikit-learn's).

Mechanism
---------
The test files are run in place (read-only) from the installed scikit-learn,
not copied, so that scikit-learn's ``sklearn/conftest.py`` (fixtures such as
``global_random_seed``, ``global_dtype``) applies to both runs alike.  This
file doubles as a pytest plugin (loaded through a tiny shim in the work
directory).  In the outcore run it wraps pytest's import of the target test
module:

1. first it imports every module the test file imports at top level, so that
   those modules bind scikit-learn's classes as usual;
2. then, for the duration of the test module's import only, it sets e.g.
   ``sklearn.linear_model.SGDClassifier = outcore.SGDClassifier``.  Thus
   ``from sklearn.linear_model import Ridge``, parametrize lists evaluated at
   import time, and class statements such as test_sgd.py's
   ``class _SparseSGDClassifier(linear_model.SGDClassifier)`` all see
   outcore's class;
3. after the import it restores scikit-learn's module attributes (so the rest
   of scikit-learn, e.g. ``RidgeCV`` internally, is untouched) and replaces
   any global of the test module that *is* a patched scikit-learn module
   (test_sgd.py's ``linear_model``) with a proxy that answers outcore's class
   for the substituted names and delegates everything else, so helpers that
   look the class up at call time (``linear_model.SGDClassifier(**kwargs)``)
   also get outcore's.

Timeouts and crashes
--------------------
pytest-timeout is used (``--timeout``) if it is installed; it is not
installed in the reference venv, so the plugin then sets its own soft
per-test timeout with ``SIGALRM`` (raises ``Failed`` in the test; only
effective when control returns to Python).  In both cases a hard watchdog
(``faulthandler.dump_traceback_later(exit=True)``, at 2x the timeout + 30 s)
kills pytest if a test is stuck in native code; the script then records the
test that was running as ``crash`` (with the exit code) and reruns pytest on
the remaining tests (up to ``--max-restarts`` times).  A segfault or abort
is handled the same way.

Categories
----------
Each failure (a test that passes in the baseline but not with outcore's
classes) is grouped by the first line of its exception message, numbers
blanked, and put in a coarse category by keyword heuristics (sparse input
refused, unsupported parameter, numerical mismatch small/large by the
"Max absolute/relative difference" numpy reports, error message differs,
...). The categories are a guide; read the messages in the JSON.
``--reuse all --workdir DIR`` re-categorises an earlier run without
running pytest again.

Output
------
A readable summary on stdout and, with ``--out``, a JSON file::

    {"files": {"<short>": {"baseline_passed": N, "outcore_passed": M,
                          "rate": M/N, "failures": [{"nodeid", "outcome",
                          "category", "group", "message", "where"}...],
                          "groups": {...}, "seconds": {...}}...},
     "categories": {...}, "wall_seconds": ..., "timeout_mechanism": ...}
"""
import argparse
import ast
import collections
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ENV_CFG = "OUTCORE_SKLEARN_SUITE_CFG"

# short name -> (path under the sklearn package, [(sklearn module, attribute, outcore attribute)])
FILES = {
    "pca": ("decomposition/tests/test_pca.py", [("sklearn.decomposition", "PCA", "PCA")]),
    "incremental_pca": (
        "decomposition/tests/test_incremental_pca.py",
        [("sklearn.decomposition", "IncrementalPCA", "IncrementalPCA")],
    ),
    "base": ("linear_model/tests/test_base.py", [("sklearn.linear_model", "LinearRegression", "LinearRegression")]),
    "ridge": ("linear_model/tests/test_ridge.py", [("sklearn.linear_model", "Ridge", "Ridge")]),
    "sgd": (
        "linear_model/tests/test_sgd.py",
        [
            ("sklearn.linear_model", "SGDClassifier", "SGDClassifier"),
            ("sklearn.linear_model", "SGDRegressor", "SGDRegressor"),
        ],
    ),
    "k_means": (
        "cluster/tests/test_k_means.py",
        [
            ("sklearn.cluster", "KMeans", "KMeans"),
            ("sklearn.cluster", "MiniBatchKMeans", "MiniBatchKMeans"),
        ],
    ),
    "logistic": (
        "linear_model/tests/test_logistic.py",
        [("sklearn.linear_model", "LogisticRegression", "LogisticRegression")],
    ),
}


# --------------------------------------------------------------------------
# pytest plugin part (active only when ENV_CFG names a config file)
# --------------------------------------------------------------------------

def _plugin_cfg():
    path = os.environ.get(ENV_CFG)
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


_CFG = None
_REPORTS = {}
_STATE = {}


class _Proxy:
    """A stand-in for a scikit-learn module inside the test module's
    namespace: the substituted names give outcore's classes, the rest
    scikit-learn's."""

    def __init__(self, module, overrides):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_overrides", dict(overrides))

    def __getattr__(self, name):
        ov = object.__getattribute__(self, "_overrides")
        if name in ov:
            return ov[name]
        return getattr(object.__getattribute__(self, "_module"), name)

    def __dir__(self):
        return dir(object.__getattribute__(self, "_module"))

    def __repr__(self):
        return f"<outcore-substituted proxy of {object.__getattribute__(self, '_module').__name__}>"


def _preimport(path):
    """Import every module ``path`` imports at top level, so they are loaded
    (with scikit-learn's classes) before the substitution window opens."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            try:
                importlib.import_module(n)
            except Exception:
                pass


def _install_substitution(target, subs):
    import _pytest.python
    import outcore

    orig_getobj = _pytest.python.Module._getobj

    def _getobj(self):
        if os.path.realpath(str(self.path)) != os.path.realpath(target):
            return orig_getobj(self)
        _preimport(target)
        saved = []
        by_module = collections.defaultdict(dict)
        for modname, attr, oc_attr in subs:
            mod = importlib.import_module(modname)
            new = getattr(outcore, oc_attr)
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, new)
            by_module[modname][attr] = new
        try:
            module = orig_getobj(self)
        finally:
            for mod, attr, old in reversed(saved):
                setattr(mod, attr, old)
        for gname, gval in list(vars(module).items()):
            name = getattr(gval, "__name__", None)
            if type(gval).__name__ == "module" and name in by_module:
                setattr(module, gname, _Proxy(gval, by_module[name]))
        # sanity: the names the test module binds directly are outcore's
        for modname, attr, oc_attr in subs:
            if attr in vars(module) and isinstance(vars(module)[attr], type):
                if vars(module)[attr] is not getattr(outcore, oc_attr):
                    raise RuntimeError(f"substitution of {attr} did not take")
        module.__outcore_substituted__ = [a for _, a, _ in subs]
        return module

    _pytest.python.Module._getobj = _getobj


def pytest_configure(config):
    global _CFG
    _CFG = _plugin_cfg()
    if not _CFG:
        return
    if _CFG["mode"] == "outcore":
        _install_substitution(_CFG["target"], _CFG["subs"])


def pytest_collection_modifyitems(session, config, items):
    if not _CFG or not _CFG.get("deselect_file"):
        return
    try:
        with open(_CFG["deselect_file"]) as f:
            skip = set(json.load(f))
    except FileNotFoundError:
        return
    keep = [it for it in items if it.nodeid not in skip]
    gone = [it for it in items if it.nodeid in skip]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = keep


def _alarm(signum, frame):
    import pytest
    pytest.fail(f"outcore-suite soft timeout: test exceeded {_CFG['timeout']}s", pytrace=False)


def pytest_runtest_logstart(nodeid, location):
    if not _CFG:
        return
    _REPORTS[nodeid] = []
    with open(_CFG["state_file"], "w") as f:
        f.write(nodeid)
    t = _CFG.get("timeout")
    if t:
        import faulthandler
        faulthandler.dump_traceback_later(2 * t + 30, exit=True)
        if _CFG.get("soft_timeout"):
            signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, t)
    _STATE["t0"] = time.monotonic()


def pytest_runtest_logreport(report):
    if _CFG:
        _REPORTS.setdefault(report.nodeid, []).append(report)


def _crash_info(report):
    lr = report.longrepr
    msg, where = None, None
    crash = getattr(lr, "reprcrash", None)
    if crash is not None:
        msg, where = crash.message, f"{crash.path}:{crash.lineno}"
    elif isinstance(lr, tuple) and len(lr) == 3:  # skip
        msg, where = str(lr[2]), f"{lr[0]}:{lr[1]}"
    elif lr is not None:
        msg = str(lr).strip().splitlines()[-1] if str(lr).strip() else ""
    # the innermost traceback frame in outcore's package, if any
    in_outcore = False
    chain = getattr(lr, "chain", None)
    if chain:
        for tb, _, _ in chain:
            for entry in getattr(tb, "reprentries", []):
                loc = getattr(getattr(entry, "reprfileloc", None), "path", "") or ""
                if "/outcore/" in loc:
                    in_outcore = True
    return msg, where, in_outcore


def pytest_runtest_logfinish(nodeid, location):
    if not _CFG:
        return
    if _CFG.get("timeout"):
        import faulthandler
        faulthandler.cancel_dump_traceback_later()
        if _CFG.get("soft_timeout"):
            signal.setitimer(signal.ITIMER_REAL, 0)
    reps = _REPORTS.pop(nodeid, [])
    outcome, msg, where, in_outcore = "passed", None, None, False
    failed = [r for r in reps if r.failed]
    if failed:
        r = failed[0]
        outcome = "failed" if r.when == "call" else "error"
        msg, where, in_outcore = _crash_info(r)
    else:
        for r in reps:
            if hasattr(r, "wasxfail"):
                outcome = "xpassed" if r.passed else "xfailed"
                msg = r.wasxfail
                break
            if r.skipped:
                outcome = "skipped"
                msg, where, _ = _crash_info(r)
                break
    rec = {"nodeid": nodeid, "outcome": outcome, "message": msg, "where": where,
           "in_outcore": in_outcore, "seconds": round(time.monotonic() - _STATE.get("t0", 0), 3)}
    with open(_CFG["results_file"], "a") as f:
        f.write(json.dumps(rec) + "\n")
    with open(_CFG["state_file"], "w") as f:
        f.write("")


# --------------------------------------------------------------------------
# driver part
# --------------------------------------------------------------------------

def _have_pytest_timeout(python):
    r = subprocess.run([python, "-c", "import pytest_timeout"], capture_output=True)
    return r.returncode == 0


def _run_pytest(python, site, target, mode, subs, workdir, tag, timeout, use_pt_timeout, max_restarts, log):
    """Run pytest on ``target`` until every collected test has a result;
    returns {nodeid: record}."""
    results_file = os.path.join(workdir, f"{tag}.results.jsonl")
    state_file = os.path.join(workdir, f"{tag}.state")
    deselect_file = os.path.join(workdir, f"{tag}.deselect.json")
    cfg_file = os.path.join(workdir, f"{tag}.cfg.json")
    for p in (results_file, state_file, deselect_file):
        if os.path.exists(p):
            os.remove(p)
    cfg = {"mode": mode, "target": target, "subs": subs, "results_file": results_file,
           "state_file": state_file, "deselect_file": deselect_file, "timeout": timeout,
           "soft_timeout": bool(timeout) and not use_pt_timeout}
    with open(cfg_file, "w") as f:
        json.dump(cfg, f)
    ini = os.path.join(workdir, "pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")
    env = dict(os.environ)
    env[ENV_CFG] = cfg_file
    env["PYTHONPATH"] = workdir + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    cmd = [python, "-m", "pytest", "-p", "_outcore_suite_plugin", "-p", "no:cacheprovider",
           "-c", ini, "--rootdir", site, "-q", "-o", "console_output_style=classic", "-p", "no:randomly",
           target]
    if use_pt_timeout and timeout:
        cmd[5:5] = [f"--timeout={timeout}"]
    results = {}
    crashes = []
    for attempt in range(max_restarts + 1):
        with open(os.path.join(workdir, f"{tag}.log"), "a") as lf:
            lf.write(f"\n=== attempt {attempt}: {' '.join(cmd)}\n")
            lf.flush()
            rc = subprocess.run(cmd, cwd=workdir, env=env, stdout=lf, stderr=subprocess.STDOUT).returncode
        if os.path.exists(results_file):
            with open(results_file) as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        results[rec["nodeid"]] = rec
        running = ""
        if os.path.exists(state_file):
            with open(state_file) as f:
                running = f.read().strip()
        if not running:
            break
        # pytest died inside a test: record it and go on with the rest
        how = "hard timeout (watchdog) or exit" if rc == 1 else f"pytest process died (exit code {rc})"
        if rc < 0:
            how = f"pytest process killed by signal {-rc} ({signal.Signals(-rc).name})"
        rec = {"nodeid": running, "outcome": "crash", "message": f"Crash: {how}", "where": None,
               "in_outcore": True, "seconds": None}
        results[running] = rec
        crashes.append(running)
        with open(results_file, "a") as f:
            f.write(json.dumps(rec) + "\n")
        with open(deselect_file, "w") as f:
            json.dump(sorted(results), f)
        log(f"    [{tag}] {running}: {how}; restarting on the remaining tests")
    else:
        log(f"    [{tag}] gave up after {max_restarts} restarts")
    if rc not in (0, 1) and not results:
        log(f"    [{tag}] pytest exited with {rc} and produced no results; see {tag}.log")
    return results


_NUM = re.compile(r"(?<![\w.])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_QUOTED = re.compile(r"'[^']{41,300}'|\"[^\"]{41,300}\"")


def _first_line(msg):
    """The exception's first line; if that is only 'AssertionError:' etc.,
    the first non-empty line after it too."""
    if not msg:
        return ""
    lines = [l.strip() for l in msg.strip().splitlines() if l.strip()]
    if not lines:
        return ""
    first = lines[0]
    if re.fullmatch(r"[\w.]+:?", first) and len(lines) > 1:
        first = f"{first.rstrip(':')}: {lines[1]}"
    return first[:300]


def _group(msg):
    """First line with numbers and quoted values blanked, to group alike."""
    g = _first_line(msg)
    g = _QUOTED.sub("'…'", g)
    g = _NUM.sub("#", g)
    return g[:200]


def _category(rec):
    m = rec.get("message") or ""
    first = _first_line(m)
    low = m.lower()
    if rec["outcome"] == "crash":
        return "crash / hang (process died or watchdog)"
    if "soft timeout" in low or "timeout" in first.lower() and "Failed" in first:
        return "timeout"
    if rec["outcome"] == "missing":
        return "not collected with outcore's classes"
    if rec["outcome"] == "skipped":
        return "skipped with outcore's classes"
    if rec["outcome"] in ("xfailed",):
        return "xfailed with outcore's classes"
    if any(k in low for k in ("sparse data", "sparse input", "sparse matrix", "sparse array",
                              "dense data is required")):
        return "sparse input refused"
    if first.startswith("TypeError") and "not supported between instances" in first:
        return "crash (TypeError) on a parameter value scikit-learn accepts"
    if re.search(r"dtype\('float64'\) == .*float32", first):
        return "float32 dtype not preserved (float64 out)"
    if "array api" in low or "array_api" in low or "namespace" in first.lower():
        return "array API input unsupported"
    if first.startswith("TypeError") and ("unexpected keyword" in low or "got an unexpected" in low):
        return "unsupported parameter / method argument"
    if "not supported" in low or "unsupported" in low or "is not implemented" in low:
        return "unsupported parameter / feature"
    if first.startswith(("AttributeError",)):
        return "missing attribute / method"
    if first.startswith("InvalidParameterError") or "parameter of" in low:
        return "parameter validation differs"
    if "DID NOT RAISE" in m:
        return "expected exception not raised"
    if "DID NOT WARN" in m or "No warnings of type" in m or "Warning" in first.split(":")[0]:
        return "warning behaviour differs"
    if "Regex pattern did not match" in m or "Regex: " in m:
        return "error message differs"
    ma = re.search(r"Max absolute difference(?: among violations)?: *([-+.\deE]+|inf|nan)", m)
    mr = re.search(r"Max relative difference(?: among violations)?: *([-+.\deE]+|inf|nan)", m)
    if ma or mr:
        a = float(ma.group(1)) if ma else float("inf")
        r = float(mr.group(1)) if mr else float("inf")
        if a < 1e-6 or r < 1e-4:
            return "numerical mismatch, small (abs < 1e-6 or rel < 1e-4: precision)"
        return "numerical mismatch, large (abs >= 1e-6 and rel >= 1e-4)"
    if first.startswith("AssertionError") or "assert " in first.lower() or "Not equal to tolerance" in m \
            or "not almost equal" in m or "Arrays are not equal" in m or "approx" in m:
        return "assertion failed (other behavioural / numerical mismatch)"
    if rec.get("in_outcore"):
        return "other exception raised in outcore"
    return "other exception"


def _short(nodeid):
    return nodeid.split("::", 1)[-1]


_SPARSE = ("sparse", "csr", "csc", "coo", "bsr", "dok", "lil")


def _is_sparse(nodeid):
    """Whether a test is about sparse input (its name or parameters say so)."""
    test = _short(nodeid).lower()
    return any(w in test for w in _SPARSE)


def _goals(text):
    """``k_means=0.9,logistic=0.8`` as a dict."""
    out = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        k, _, v = part.partition("=")
        out[k.strip()] = float(v)
    return out


def _cached_baseline(path, version, short):
    """The passing node ids of ``short``'s baseline recorded in ``path`` for
    scikit-learn ``version``, or None."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        cache = json.load(f)
    passed = cache.get(version, {}).get(short)
    if passed is None:
        return None
    return {n: {"nodeid": n, "outcome": "passed"} for n in passed}


def _record_baseline(path, version, short, runs):
    cache = {}
    if os.path.exists(path):
        with open(path) as f:
            cache = json.load(f)
    cache.setdefault(version, {})[short] = sorted(n for n, r in runs.items() if r["outcome"] == "passed")
    with open(path, "w") as f:
        json.dump(cache, f, indent=0, sort_keys=True)
        f.write("\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", default=",".join(FILES),
                    help=f"comma-separated subset of: {', '.join(FILES)} (default: all)")
    ap.add_argument("--out", help="write the JSON report here")
    ap.add_argument("--python", default=sys.executable, help="the Python (venv) to run pytest with")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="per-test timeout in seconds (0: none); hard watchdog at 2x+30s")
    ap.add_argument("--max-restarts", type=int, default=20, help="pytest restarts after crashes, per run")
    ap.add_argument("--workdir", help="keep pytest logs and raw results here (default: a temp dir)")
    ap.add_argument("--reuse", choices=("none", "baseline", "all"), default="none",
                    help="reuse raw results in --workdir from an earlier run instead of running pytest: "
                         "the baseline only, or both runs (to re-categorise)")
    ap.add_argument("--examples", type=int, default=2, help="example tests shown per failure group")
    ap.add_argument("--list", action="store_true", help="print the substitutions and exit")
    ap.add_argument("--baseline-cache", metavar="FILE",
                    help="JSON of the tests that pass with scikit-learn's classes, per scikit-learn "
                         "version and file: used instead of the baseline run when it has the installed "
                         "version's, else the baseline runs and is recorded there")
    ap.add_argument("--goal", metavar="FILE=RATE,...",
                    help="fail (exit 1) when a file's non-sparse rate is under its goal, "
                         "e.g. k_means=0.9,logistic=0.8")
    args = ap.parse_args(argv)

    if args.list:
        for k, (p, subs) in FILES.items():
            print(f"{k:16} sklearn/{p}: " + ", ".join(f"{m}.{a} -> outcore.{o}" for m, a, o in subs))
        return 0
    chosen = [f.strip() for f in args.files.split(",") if f.strip()]
    bad = [f for f in chosen if f not in FILES]
    if bad:
        ap.error(f"unknown --files {bad}; choose from {list(FILES)}")

    site_sklearn = subprocess.run(
        [args.python, "-c", "import os, sklearn; print(os.path.dirname(sklearn.__file__))"],
        capture_output=True, text=True, check=True).stdout.strip()
    site = os.path.dirname(site_sklearn)
    versions = subprocess.run(
        [args.python, "-c", "import sklearn, outcore, pytest; print(sklearn.__version__, outcore.__version__, "
         "pytest.__version__, outcore.__file__)"], capture_output=True, text=True, check=True).stdout.split()
    use_pt = _have_pytest_timeout(args.python)
    timeout = args.timeout or None
    tmech = ("pytest-timeout --timeout" if use_pt else "own SIGALRM soft timeout (pytest-timeout not installed)") \
        if timeout else "none"
    if timeout:
        tmech += f", {timeout:g}s per test; hard watchdog at {2 * timeout + 30:g}s"

    workdir = args.workdir or tempfile.mkdtemp(prefix="sklearn_suite.")
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "_outcore_suite_plugin.py"), "w") as f:
        f.write("# shim: load benches/sklearn_suite.py as a pytest plugin\n"
                "import importlib.util as _u\n"
                f"_s = _u.spec_from_file_location('_outcore_sklearn_suite', {os.path.abspath(__file__)!r})\n"
                "_m = _u.module_from_spec(_s); _s.loader.exec_module(_m)\n"
                "for _k in dir(_m):\n"
                "    if _k.startswith('pytest_'):\n"
                "        globals()[_k] = getattr(_m, _k)\n")

    def log(s):
        print(s, flush=True)

    log(f"scikit-learn {versions[0]}, outcore {versions[1]} ({versions[3]}), pytest {versions[2]}")
    log(f"OUTCORE_BIN={os.environ.get('OUTCORE_BIN', '(unset)')}; timeout: {tmech}; workdir {workdir}")
    t_start = time.monotonic()
    report = {"sklearn": versions[0], "outcore": versions[1], "pytest": versions[2],
              "outcore_bin": os.environ.get("OUTCORE_BIN"), "timeout_mechanism": tmech,
              "workdir": workdir, "files": {}}
    all_cats = collections.Counter()
    cat_examples = collections.defaultdict(list)

    for short in chosen:
        rel, subs = FILES[short]
        target = os.path.join(site_sklearn, rel)
        log(f"\n== sklearn/{rel}  ({', '.join(a + ' -> outcore.' + o for _, a, o in subs)})")
        secs = {}
        t0 = time.monotonic()
        runs = {}
        for mode in ("baseline", "outcore"):
            t0 = time.monotonic()
            cached = _cached_baseline(args.baseline_cache, versions[0], short) if mode == "baseline" else None
            if cached is not None:
                runs[mode], secs[mode] = cached, "cached"
                continue
            raw = os.path.join(workdir, f"{short}.{mode}.results.jsonl")
            if (args.reuse == "all" or (args.reuse == "baseline" and mode == "baseline")) \
                    and os.path.exists(raw):
                with open(raw) as f:
                    runs[mode] = {r["nodeid"]: r for r in map(json.loads, filter(str.strip, f))}
                secs[mode] = "reused"
                continue
            runs[mode] = _run_pytest(args.python, site, target, mode, subs, workdir, f"{short}.{mode}",
                                     timeout, use_pt, args.max_restarts, log)
            secs[mode] = round(time.monotonic() - t0, 1)
        base, oc = runs["baseline"], runs["outcore"]
        if args.baseline_cache and secs["baseline"] != "cached":
            _record_baseline(args.baseline_cache, versions[0], short, base)

        base_pass = [n for n, r in base.items() if r["outcome"] == "passed"]
        both = [n for n in base_pass if oc.get(n, {}).get("outcome") == "passed"]
        failures = []
        for n in base_pass:
            r = oc.get(n)
            if r is None:
                r = {"nodeid": n, "outcome": "missing", "message": "not collected with outcore's classes",
                     "where": None, "in_outcore": False}
            if r["outcome"] == "passed":
                continue
            cat = _category(r)
            failures.append({"nodeid": n, "test": _short(n), "outcome": r["outcome"], "category": cat,
                             "group": _group(r["message"]), "message": (r["message"] or "")[:2000],
                             "where": r.get("where"), "in_outcore": r.get("in_outcore")})
        groups = collections.defaultdict(list)
        for fl in failures:
            groups[(fl["category"], fl["group"])].append(fl["test"])
        cats = collections.Counter(fl["category"] for fl in failures)
        for fl in failures:
            all_cats[fl["category"]] += 1
            if len(cat_examples[fl["category"]]) < 3:
                cat_examples[fl["category"]].append(f"{short}:{fl['test']}")
        n, m = len(base_pass), len(both)
        dense_n = sum(1 for x in base_pass if not _is_sparse(x))
        dense_m = sum(1 for x in both if not _is_sparse(x))
        counts_b = collections.Counter(r["outcome"] for r in base.values())
        counts_o = collections.Counter(r["outcome"] for r in oc.values())
        only_outcore = sorted(x for x, r in oc.items() if r["outcome"] == "passed" and x not in set(base_pass))
        report["files"][short] = {
            "path": f"sklearn/{rel}", "substitutions": [f"{m_}.{a} -> outcore.{o}" for m_, a, o in subs],
            "baseline_passed": n, "outcore_passed": m, "rate": (m / n) if n else None,
            "non_sparse_baseline_passed": dense_n, "non_sparse_outcore_passed": dense_m,
            "non_sparse_rate": (dense_m / dense_n) if dense_n else None,
            "baseline_outcomes": dict(counts_b), "outcore_outcomes": dict(counts_o),
            "passed_only_with_outcore": only_outcore, "categories": dict(cats.most_common()),
            "groups": [{"category": c, "group": g, "count": len(t), "tests": t}
                       for (c, g), t in sorted(groups.items(), key=lambda kv: -len(kv[1]))],
            "failures": failures, "seconds": secs,
        }
        pct = f"{100 * m / n:.1f}%" if n else "n/a"
        log(f"   passed with scikit-learn's classes N={n}; also with outcore's M={m}  ->  {pct}"
            f"   (seconds: baseline {secs['baseline']}, outcore {secs['outcore']})")
        log(f"   non-sparse: {dense_m} of {dense_n}"
            f"  ->  {100 * dense_m / dense_n if dense_n else 0:.1f}%")
        log(f"   baseline outcomes {dict(counts_b)}; outcore outcomes {dict(counts_o)}")
        for c, k in cats.most_common():
            log(f"   {k:5d}  {c}")
            for (c2, g), tests in sorted(groups.items(), key=lambda kv: -len(kv[1])):
                if c2 != c:
                    continue
                ex = ", ".join(tests[:args.examples])
                log(f"          {len(tests):4d}  {g[:150]}")
                log(f"                e.g. {ex[:220]}")

    wall = round(time.monotonic() - t_start, 1)
    report["wall_seconds"] = wall
    report["categories"] = {c: {"count": k, "examples": cat_examples[c]} for c, k in all_cats.most_common()}
    log("\n== summary")
    log(f"   {'file':18} {'N':>6} {'M':>6} {'M/N':>7}   {'non-sparse':>16}")
    tn = tm = 0
    below = []
    goals = _goals(args.goal)
    for short, d in report["files"].items():
        n, m = d["baseline_passed"], d["outcore_passed"]
        dn, dm, rate = d["non_sparse_baseline_passed"], d["non_sparse_outcore_passed"], d["non_sparse_rate"]
        tn, tm = tn + n, tm + m
        goal = goals.get(short)
        mark = ""
        if goal is not None:
            ok = rate is not None and rate >= goal
            mark = f"   goal {100 * goal:.0f}%: {'met' if ok else 'NOT MET'}"
            if not ok:
                below.append(short)
        log(f"   {short:18} {n:6d} {m:6d} {(100 * m / n if n else 0):6.1f}%   "
            f"{dm:5d}/{dn:<5d} {(100 * rate if rate else 0):5.1f}%{mark}")
    log(f"   {'total':18} {tn:6d} {tm:6d} {(100 * tm / tn if tn else 0):6.1f}%")
    log("   failure categories (all files):")
    for c, k in all_cats.most_common():
        log(f"   {k:6d}  {c}   e.g. {', '.join(cat_examples[c][:2])[:160]}")
    log(f"   wall time {wall}s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        log(f"   JSON report: {args.out}")
    unknown = sorted(set(goals) - set(report["files"]))
    if unknown:
        log(f"   goals for files not run: {', '.join(unknown)}")
        return 1
    if below:
        log(f"   below goal: {', '.join(below)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
