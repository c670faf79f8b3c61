"""The estimators against scikit-learn and the command line, inputs by
path and memmap, and bad inputs."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from sklearn.cluster import KMeans as SkKMeans
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

import outcore


def python(code, timeout=120):
    """Runs `code` in a fresh interpreter; its completed process."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_import_works_before_and_after_numpy_scipy_and_sklearn():
    for code in (
        "import numpy, scipy, sklearn; import outcore; outcore.KMeans(2).fit([[0.0], [1.0], [2.0]])",
        "import outcore; import numpy, scipy, sklearn; outcore.KMeans(2).fit([[0.0], [1.0], [2.0]])",
    ):
        r = python(code)
        assert r.returncode == 0, r.stderr


def test_same_centres_and_labels_as_the_command_line(blobs, cli, tmp_path):
    X, C = blobs
    out, labels = tmp_path / "out.npy", tmp_path / "labels.npy"
    subprocess.run(
        [cli, "kmeans", "--input", str(X), "--algorithm", "lloyd", "--init", str(C), "--iterations", "3",
         "--tol", "0", "--mem-cap", "128MiB", "--output", str(out), "--labels", str(labels),
         "--stats", str(tmp_path / "stats.json")],
        check=True, capture_output=True,
    )
    km = outcore.KMeans(n_clusters=5, init=np.load(C), n_init=1, max_iter=3, tol=0, mem_cap="128MiB")
    km.fit(np.load(X, mmap_mode="r"))
    assert km.cluster_centers_.dtype == np.float32
    assert km.cluster_centers_.tobytes() == np.load(out).tobytes()
    assert np.array_equal(km.labels_, np.load(labels))
    # One statistics type: `stats_` has the command line's `--stats` keys,
    # with the same figures where they do not depend on time or traffic.
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert sorted(km.stats_) == sorted(stats)
    for key in ("algorithm", "k", "rows", "dims", "iterations", "inertia", "epoch_inertia", "shards"):
        assert km.stats_[key] == stats[key], key


def test_logistic_regression_stats_have_the_command_lines_keys(cli, tmp_path):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2000, 6)).astype(np.float32)
    y = (X @ rng.normal(size=6) > 0).astype(np.int64)
    np.save(tmp_path / "X.npy", X.astype(np.float32))
    np.save(tmp_path / "y.npy", y.astype(np.int64))
    subprocess.run(
        [cli, "train", "--input", str(tmp_path / "X.npy"), "--targets", str(tmp_path / "y.npy"),
         "--solver", "lbfgs", "--holdout", "0", "--mem-cap", "128MiB",
         "--stats", str(tmp_path / "stats.json")],
        check=True, capture_output=True,
    )
    est = outcore.LogisticRegression(mem_cap="128MiB").fit(X, y)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert sorted(est.stats_) == sorted(stats)
    assert est.stats_["solver"] == "lbfgs" and len(est.stats_["iterations"]) == est.n_iter_[0]


def test_capped_uncapped_path_and_array_give_the_same_bytes(tmp_path):
    rng = np.random.default_rng(7)
    X = (rng.normal(scale=6, size=(5, 16))[rng.integers(0, 5, 100_000)] + rng.normal(size=(100_000, 16)))
    np.save(tmp_path / "X.npy", X.astype(np.float32))
    path = tmp_path / "X.npy"
    fits = [
        outcore.KMeans(5, random_state=3, mem_cap=cap, n_jobs=w).fit(x)
        for cap, w, x in [(None, 1, np.load(path)), ("3MiB", 2, path), ("auto", 2, np.load(path, mmap_mode="r"))]
    ]
    for f in fits[1:]:
        assert f.cluster_centers_.tobytes() == fits[0].cluster_centers_.tobytes()
        assert np.array_equal(f.labels_, fits[0].labels_)
    assert fits[1].stats_["evictions"] > 0
    mb = outcore.MiniBatchKMeans(5, batch_size=256, max_iter=3, random_state=0, mem_cap="3MiB").fit(path)
    s = mb.stats_
    assert s["algorithm"] == "minibatch" and s["iterations"] == mb.n_iter_
    assert s["evictions"] > 0 and s["bytes_read"] > 0 and len(s["epoch_seconds"]) == mb.n_iter_
    assert s["peak_bytes"] > 0 and "runtime" in s


def test_lloyd_matches_scikit_learn_from_the_same_centres(blobs):
    X, C = np.load(blobs[0]).astype(np.float64), np.load(blobs[1]).astype(np.float64)
    w = np.random.default_rng(1).uniform(0.5, 2, len(X))
    for sw in (None, w):
        ours = outcore.KMeans(5, init=C, max_iter=20, tol=0).fit(X, sample_weight=sw)
        sk = SkKMeans(5, init=C, n_init=1, max_iter=20, tol=0, algorithm="lloyd").fit(X, sample_weight=sw)
        assert ours.cluster_centers_.dtype == np.float64
        np.testing.assert_allclose(ours.cluster_centers_, sk.cluster_centers_, rtol=1e-4, atol=1e-4)
        assert np.array_equal(ours.labels_, sk.labels_)
        assert ours.inertia_ == pytest.approx(sk.inertia_, rel=1e-4)
        assert ours.score(X, sample_weight=sw) == pytest.approx(sk.score(X, sample_weight=sw), rel=1e-4)
        np.testing.assert_allclose(ours.transform(X[:50]), sk.transform(X[:50]), rtol=1e-4, atol=1e-4)
        assert np.array_equal(ours.predict(X), sk.predict(X))


@pytest.mark.parametrize("classes", [["cat", "dog"], [3, 7, 11]])
def test_logistic_regression_matches_scikit_learn(classes):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(3000, 10))
    W = rng.normal(size=(10, len(classes)))
    y = np.asarray(classes)[(X @ W + rng.gumbel(size=(3000, len(classes)))).argmax(axis=1)]
    ours = outcore.LogisticRegression(C=0.5, mem_cap="64MiB").fit(X, y)
    sk = SkLogisticRegression(C=0.5).fit(X, y)
    assert list(ours.classes_) == list(sk.classes_)
    assert ours.coef_.shape == sk.coef_.shape and ours.intercept_.shape == sk.intercept_.shape
    np.testing.assert_allclose(ours.coef_, sk.coef_, rtol=0.02, atol=0.02)
    assert ours.score(X, y) == pytest.approx(sk.score(X, y), abs=0.002)
    np.testing.assert_allclose(ours.predict_proba(X[:100]), sk.predict_proba(X[:100]), atol=0.01)
    assert ours.predict(X[:5]).dtype == sk.predict(X[:5]).dtype


def test_a_nan_is_a_value_error_naming_its_row_and_column(blobs):
    """In scikit-learn's words, whether the rows come from an array, a
    path or a memmap, in a fit or after it."""
    X = np.load(blobs[0])
    X[1234, 5] = np.nan
    bad = blobs[0].parent / "bad.npy"
    np.save(bad, X)
    words = "Input X contains NaN at row 1234, column 5"
    y = np.arange(len(X)) % 2
    fitted = outcore.KMeans(3, n_init=1).fit(np.load(blobs[0]))
    for data in (X, bad, np.load(bad, mmap_mode="r")):
        with pytest.raises(ValueError, match=words):
            outcore.KMeans(3).fit(data)
        with pytest.raises(ValueError, match=words):
            outcore.MiniBatchKMeans(3).fit(data)
        with pytest.raises(ValueError, match=words):
            outcore.LogisticRegression().fit(data, y)
        with pytest.raises(ValueError, match=words):
            fitted.predict(data)


def test_bad_inputs_raise_scikit_learns_exceptions(blobs):
    X = np.load(blobs[0])
    km = outcore.KMeans(3).fit(X)
    with pytest.raises(ValueError, match="features"):
        km.predict(X[:, :4])
    with pytest.raises(ValueError, match="n_clusters"):
        outcore.KMeans(5000).fit(X)
    with pytest.raises(ValueError, match="mem_cap"):
        outcore.KMeans(3, mem_cap="lots").fit(X)
    with pytest.raises(MemoryError, match="memory cap"):
        outcore.KMeans(1000, mem_cap="4MiB").fit(np.zeros((2000, 2000), np.float32) + np.arange(2000)[:, None])
    # Training's model check: a MemoryError too, by the error's kind.
    with pytest.raises(MemoryError, match=r"more than half of the memory cap \(4\.0 MiB\)"):
        outcore.LogisticRegression(mem_cap="4MiB", n_jobs=1).fit(X, np.arange(len(X)) % 300)
    with pytest.raises(ValueError, match="2 classes"):
        outcore.LogisticRegression().fit(X, np.zeros(len(X)))


def test_npz_and_fvecs_paths_give_the_same_centres_as_the_array(blobs, tmp_path):
    X = np.load(blobs[0])
    np.savez(tmp_path / "X.npz", X)
    rows = np.hstack([np.full((len(X), 1), X.shape[1], np.int32).view(np.float32), X])
    rows.tofile(tmp_path / "X.fvecs")
    ref = outcore.KMeans(5, random_state=1).fit(X)
    for name in ("X.npz", "X.fvecs"):
        km = outcore.KMeans(5, random_state=1).fit(tmp_path / name)
        assert km.n_features_in_ == 16
        np.testing.assert_array_equal(km.cluster_centers_.astype(np.float32), ref.cluster_centers_)


def test_timeline_and_verbose(blobs, tmp_path, capfd):
    tl = tmp_path / "memory.csv"
    outcore.MiniBatchKMeans(5, max_iter=2, verbose=1, timeline=tl, mem_cap="64MiB").fit(blobs[0])
    lines = tl.read_text().splitlines()
    assert len(lines) > 1 and "," in lines[0]
    err = capfd.readouterr().err
    assert "outcore: pass 2:" in err, err


def test_verbose_lines_go_through_pythons_streams(blobs):
    """Every estimator's progress lines reach ``sys.stderr`` (and
    scikit-learn's own wording ``sys.stdout``), so that
    ``contextlib.redirect_stderr`` and notebooks capture them: they used to
    be written to descriptor 2, which neither sees."""
    import contextlib
    import io

    X = np.load(blobs[0])
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    fits = [
        (lambda: outcore.LogisticRegression(verbose=1, max_iter=3).fit(X, y), "err", "outcore: iteration 1"),
        (lambda: outcore.Ridge(verbose=1).fit(X, X[:, 0]), "err", "outcore: pass"),
        (lambda: outcore.KMeans(3, n_init=1, max_iter=2, verbose=1).fit(X), "out", "Initialization complete"),
    ]
    for fit, stream, text in fits:
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit()
        got = {"err": err.getvalue(), "out": out.getvalue()}
        assert text in got[stream], got


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_spill_directory_in_memory_is_warned_about(tmp_path):
    # A capped fit spilling to tmpfs keeps what it evicts in memory; it
    # used to say nothing.
    rng = np.random.default_rng(12)
    X = rng.normal(size=(20_000, 8)).astype(np.float32)
    with pytest.warns(UserWarning, match="is in memory") as rec:
        outcore.KMeans(2, random_state=0, max_iter=2, mem_cap="16MiB", spill_dir="/dev/shm").fit(X)
    assert len([w for w in rec if "is in memory" in str(w.message)]) == 1
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        outcore.KMeans(2, random_state=0, max_iter=2, mem_cap="16MiB", spill_dir=tmp_path).fit(X)
    assert not [w for w in rec if "is in memory" in str(w.message)]


def test_more_workers_than_the_cap_holds_run_fewer_with_one_warning(tmp_path):
    rng = np.random.default_rng(11)
    path = tmp_path / "X.npy"
    np.save(path, rng.normal(size=(200_000, 16)).astype(np.float32))
    with pytest.warns(UserWarning, match="64 workers asked for") as rec:
        many = outcore.KMeans(4, random_state=0, max_iter=3, mem_cap="16MiB", n_jobs=64).fit(path)
    assert len([w for w in rec if "workers asked for" in str(w.message)]) == 1
    assert 1 <= many.stats_["workers"] < 64
    one = outcore.KMeans(4, random_state=0, max_iter=3, mem_cap="16MiB", n_jobs=1).fit(path)
    assert many.cluster_centers_.tobytes() == one.cluster_centers_.tobytes()
