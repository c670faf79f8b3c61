"""What may hang or use too much memory, in child processes with a
watchdog: a memmap larger than the cap keeps the resident set within it,
and Ctrl-C raises KeyboardInterrupt promptly and removes the spill."""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np

MiB = 1 << 20


def write_npy(path, rows, cols, seed=0):
    """A float32 .npy written block by block (the writer's memory stays
    small)."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_2_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, cols)})
        step = 65536
        for start in range(0, rows, step):
            n = min(step, rows - start)
            f.write((rng.normal(size=(n, cols)) + (np.arange(n) % 8)[:, None] * 4).astype("<f4").tobytes())


def default_sigint():
    """In the child: SIGINT's default action, whatever the test runner's
    (a background shell ignores it, and Python keeps an ignored SIGINT
    ignored instead of raising KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def child(code):
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint,
    )


# In the children: a field of /proc/self/status, in KiB.
KIB = """
def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
"""

MEMMAP_FIT = KIB + """
import numpy as np, outcore
X = np.load({path!r}, mmap_mode="r")
est = outcore.{est}(8, max_iter=1, random_state=0, mem_cap="64MiB", n_jobs=2)
est.fit(np.zeros((64, X.shape[1]), np.float32) + np.arange(64)[:, None])  # warm up the engine
base = kib("VmRSS")
est.fit(X)
print(base, kib("VmHWM"), est.stats_["evictions"], flush=True)
"""


def test_a_memmap_four_times_the_cap_keeps_the_resident_set_within_the_cap(tmp_path):
    path = tmp_path / "X.npy"
    write_npy(path, 1 << 20, 64)  # 256 MiB
    for est in ("MiniBatchKMeans", "KMeans"):
        p = child(MEMMAP_FIT.format(path=str(path), est=est))
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        base, peak, evictions = (int(v) for v in out.split())
        grew = (peak - base) * 1024
        # The cap, with the allocator's 5% and the labels (4 MiB) and
        # Python's copies of them beside it.
        assert grew <= 64 * MiB * 1.05 + 24 * MiB, f"{est}: resident set grew by {grew / MiB:.0f} MiB"
        assert evictions > 0


MEMMAP_APPLY = KIB + """
import numpy as np, outcore
X = np.load({path!r}, mmap_mode="r")
sample = np.asarray(X[:4096])
km = outcore.KMeans(8, n_init=1, random_state=0, mem_cap="64MiB", n_jobs=2).fit(sample)
lr = outcore.LogisticRegression(mem_cap="64MiB", n_jobs=2).fit(sample, km.labels_ % 3)
base = kib("VmRSS")
out = [km.predict(X), km.transform(X), km.score(X), lr.decision_function(X), lr.predict_proba(X)]
assert (out[0][:4096] == km.predict(sample)).all()
assert np.allclose(out[1][:4096], km.transform(sample), rtol=1e-5, atol=1e-4)
outputs = sum(getattr(o, "nbytes", 0) for o in out)
peak = kib("VmHWM")
del out
print(base, peak, kib("VmRSS"), outputs // 1024, flush=True)
"""


def test_predict_and_transform_on_a_memmap_hold_the_cap_and_nothing_after(tmp_path):
    """predict, transform, score, decision_function and predict_proba on a
    memmap four times the cap: the resident set grows by at most the cap
    and the results, and is back where it was once they are dropped."""
    path = tmp_path / "X.npy"
    write_npy(path, 1 << 20, 64)  # 256 MiB
    p = child(MEMMAP_APPLY.format(path=str(path)))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    base, peak, after, outputs = (int(v) * 1024 for v in out.split())
    grew = peak - base
    assert grew <= 64 * MiB + outputs + 24 * MiB, f"grew by {grew / MiB:.0f} MiB ({outputs / MiB:.0f} MiB of results)"
    assert after - base <= 16 * MiB, f"{(after - base) / MiB:.0f} MiB still held"


FORK_AFTER_FIT = """
import os, signal, sys, numpy as np, outcore
X = np.arange(40000, dtype=np.float32).reshape(10000, 4) % 97
codes = []
for _ in range(6):
    outcore.KMeans(2, n_init=1, random_state=0, spill_dir={spill!r}, mem_cap="64MiB").fit(X)
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # a child that waits for ever dies here
        outcore.KMeans(2, n_init=1, random_state=0, spill_dir={spill!r}, mem_cap="64MiB").fit(X[:100])
        sys.exit(0)
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(*codes, flush=True)
"""


def test_a_fork_after_a_fit_and_the_exit_wait_for_its_runtime_to_end(tmp_path):
    """A fit's runtime ends on a thread of its own after the fit returns:
    a child forked right after must still be able to fit (it would wait
    for ever for an engine no thread of its own ends), and the exit of
    either process leaves nothing in the spill directory."""
    spill = tmp_path / "spill"
    spill.mkdir()
    p = child(FORK_AFTER_FIT.format(spill=str(spill)))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert out.split() == ["0"] * 6, (out, err)
    assert os.listdir(spill) == []


INTERRUPTED_FIT = """
import time, outcore
print("ready", flush=True)
try:
    outcore.KMeans(64, max_iter=100000, tol=0, mem_cap="16MiB", spill_dir={spill!r}, n_jobs=2).fit({path!r})
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), flush=True)
"""


def interrupt(p, started, timeout):
    """Sends SIGINT to the child `p` once it has said "ready" and
    `started()` has returned, and checks that it raised
    KeyboardInterrupt within a second."""
    try:
        assert p.stdout.readline().strip() == "ready"
        started()
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=timeout)
    finally:
        p.kill()
    word, at = out.split()
    assert word == "interrupted", out + err
    assert float(at) - sent < 1.0, f"KeyboardInterrupt came {float(at) - sent:.2f} s after the signal"


def test_ctrl_c_raises_keyboard_interrupt_within_a_second_and_removes_the_spill(tmp_path):
    path, spill = tmp_path / "X.npy", tmp_path / "spill"
    spill.mkdir()
    write_npy(path, 1 << 18, 64)  # 64 MiB
    p = child(INTERRUPTED_FIT.format(path=str(path), spill=str(spill)))

    def started():
        deadline = time.monotonic() + 60
        while not os.listdir(spill) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(spill), "the fit never started"
        time.sleep(2)  # into the iterations

    interrupt(p, started, timeout=60)
    assert os.listdir(spill) == [], "the spill directory was left behind"


INTERRUPTED_PREDICT = """
import time, numpy as np, outcore
X = np.load({path!r}, mmap_mode="r")
km = outcore.KMeans(2, n_init=1, random_state=0, mem_cap="64MiB", n_jobs=2).fit(np.asarray(X[:1000]))
km.cluster_centers_ = np.random.default_rng(0).normal(size=(4096, X.shape[1])).astype(np.float32)
print("ready", flush=True)
try:
    t = time.monotonic()
    km.predict(X)  # tens of seconds: 4,096 centres
    print("finished", time.monotonic() - t, flush=True)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), flush=True)
"""


def test_ctrl_c_stops_a_long_predict_within_a_second(tmp_path):
    """predict, transform and the other passes after the fit answer Ctrl-C
    as a fit does: they used to run to their end with the GIL released."""
    path = tmp_path / "X.npy"
    write_npy(path, 1 << 20, 64)  # 256 MiB
    p = child(INTERRUPTED_PREDICT.format(path=str(path)))
    interrupt(p, lambda: time.sleep(1.5), timeout=300)  # into the pass


KILLED_FIT = """
import numpy as np, outcore
X = np.random.default_rng(0).normal(size=(1 << 18, 64)).astype(np.float32)  # 64 MiB, in memory
print("ready", flush=True)
outcore.KMeans(64, max_iter=100000, tol=0, mem_cap="16MiB", spill_dir={spill!r}, n_jobs=2, verbose=1).fit(X)
print("finished", flush=True)
"""

LATER_FIT = """
import numpy as np, outcore
X = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
outcore.KMeans(2, max_iter=2, mem_cap="16MiB", spill_dir={spill!r}).fit(X)
"""


def test_a_killed_fit_leaves_nothing_after_the_next_fit(tmp_path):
    """A fit on an in-memory array writes a temporary copy beside the spill;
    SIGKILLed mid-fit, it leaves the copy and the spill directory, and the
    next fit in another process removes both."""
    spill = tmp_path / "spill"
    spill.mkdir()
    p = child(KILLED_FIT.format(spill=str(spill)))
    watchdog = threading.Timer(120, p.kill)
    watchdog.start()
    try:
        assert p.stdout.readline().strip() == "ready"
        # Its first pass over the data is done (a line on standard error).
        line = p.stderr.readline()
        while line and "pass 1:" not in line:
            line = p.stderr.readline()
        assert "pass 1:" in line, "the fit never got to its first pass"
        p.kill()
        p.wait(timeout=60)
    finally:
        watchdog.cancel()
        p.kill()
    assert len(os.listdir(spill)) >= 2, os.listdir(spill)  # the copy and the spill
    q = child(LATER_FIT.format(spill=str(spill)))
    out, err = q.communicate(timeout=120)
    assert q.returncode == 0, err
    assert os.listdir(spill) == [], "left behind: " + ", ".join(os.listdir(spill))


TWO_FITS = """
import threading, time, numpy as np, outcore
def kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
base = kib()
big = {{}}
def fit_big():
    X = np.load({big!r}, mmap_mode="r")
    big["est"] = outcore.KMeans(8, n_init=1, max_iter=2, tol=0, random_state=0, mem_cap="1GiB", n_jobs=1).fit(X)
t = threading.Thread(target=fit_big)
t.start()
# Until the big fit holds most of its data (or has finished).
while t.is_alive() and kib() - base < 160 * 1024:
    time.sleep(0.01)
X = np.load({small!r}, mmap_mode="r")
small = outcore.KMeans(8, n_init=1, max_iter=5, tol=0, random_state=0, mem_cap="64MiB", n_jobs=1).fit(X)
t.join()
print(small.stats_["evictions"], small.stats_["bytes_read"], big["est"].stats_["evictions"], flush=True)
"""


def test_a_small_fit_beside_a_big_one_does_not_pay_for_it(tmp_path):
    """A 64 MiB fit on 16 MiB of data, started while a 1 GiB fit holds
    256 MiB in another thread of the process, evicts nothing and reads its
    data once; neither does the big fit evict (the allocator's count is
    the process's, so the engines run one at a time)."""
    big, small = tmp_path / "big.npy", tmp_path / "small.npy"
    write_npy(big, 1 << 20, 64)  # 256 MiB
    write_npy(small, 1 << 16, 64)  # 16 MiB
    p = child(TWO_FITS.format(big=str(big), small=str(small)))
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    evictions, read, big_evictions = (int(v) for v in out.split())
    assert (evictions, big_evictions) == (0, 0), f"small fit: {evictions} evictions, {read} bytes read; big fit: {big_evictions} evictions"
    assert read <= 16 * MiB, f"the small fit read {read} bytes of its 16 MiB"
