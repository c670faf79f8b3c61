"""KMeans and MiniBatchKMeans as drop-ins for scikit-learn's: the
parameters, attributes, warnings, errors and verbose lines its own tests
(sklearn/cluster/tests/test_k_means.py) rely on, and partial_fit and
_init_centroids step for step against scikit-learn's."""
import re
import warnings

import numpy as np
import pytest
from sklearn import cluster as sk
from sklearn.datasets import make_blobs
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.extmath import row_norms

import outcore


@pytest.fixture
def X():
    return make_blobs(n_samples=300, centers=4, n_features=3, random_state=0)[0]


def test_elkan_runs_lloyd_and_bad_algorithms_are_refused(X):
    lloyd = outcore.KMeans(4, random_state=0, algorithm="lloyd").fit(X)
    elkan = outcore.KMeans(4, random_state=0, algorithm="elkan").fit(X)
    np.testing.assert_array_equal(lloyd.cluster_centers_, elkan.cluster_centers_)
    assert lloyd.n_iter_ == elkan.n_iter_
    with pytest.raises(ValueError, match=r"'algorithm' parameter of KMeans must be a str among"):
        outcore.KMeans(4, algorithm="auto").fit(X)
    with pytest.warns(RuntimeWarning, match="algorithm='elkan' doesn't make sense for a single cluster"):
        km = outcore.KMeans(1, algorithm="elkan").fit(X)
    assert km._algorithm == "lloyd"


def test_copy_x_is_accepted_and_x_is_never_modified(X):
    before = X.copy()
    outcore.KMeans(4, copy_x=False, random_state=0).fit(X)
    np.testing.assert_array_equal(X, before)
    with pytest.raises(ValueError, match="'copy_x' parameter"):
        outcore.KMeans(4, copy_x="no").fit(X)


def test_a_callable_init_is_called_with_x_k_and_the_random_state(X):
    calls = []

    def init(data, k, random_state):
        calls.append((data.shape, k, type(random_state)))
        return data[random_state.choice(len(data), k, replace=False)]

    km = outcore.KMeans(4, init=init, random_state=0).fit(X)
    assert km._n_init == 10 and len(calls) == 10
    assert calls[0] == (X.shape, 4, np.random.RandomState)
    # The best of the ten runs is kept.
    one = outcore.KMeans(4, init=init, n_init=1, random_state=0).fit(X)
    assert km.inertia_ <= one.inertia_ + 1e-6
    # MiniBatchKMeans calls it on init_size rows, as scikit-learn's.
    calls.clear()
    mb = outcore.MiniBatchKMeans(4, init=init, batch_size=50, random_state=0).fit(X)
    assert mb._n_init == 3 and len(calls) == 3 and calls[0][0] == (150, 3)


def test_a_callable_init_reads_a_npy_path_as_a_memmap(X, tmp_path):
    np.save(tmp_path / "X.npy", X.astype(np.float32))
    seen = []

    def init(data, k, random_state):
        seen.append(type(data))
        return np.asarray(data[:k])

    km = outcore.KMeans(4, init=init, n_init=1).fit(tmp_path / "X.npy")
    assert seen == [np.memmap] and km.cluster_centers_.shape == (4, 3)


@pytest.mark.parametrize("Est", [outcore.KMeans, outcore.MiniBatchKMeans])
def test_initial_centres_of_the_wrong_shape_are_scikit_learns_errors(Est, X):
    clusters = r"The shape of the initial centers \(2, 3\) does not match the number of clusters 4\."
    features = r"The shape of the initial centers \(4, 2\) does not match the number of features of the data 3\."
    with pytest.raises(ValueError, match=clusters):
        Est(4, init=X[:2], n_init=1).fit(X)
    with pytest.raises(ValueError, match=clusters):
        Est(4, init=lambda d, k, random_state: d[:2], n_init=1).fit(X)
    with pytest.raises(ValueError, match=features):
        Est(4, init=X[:4, :2], n_init=1).fit(X)
    with pytest.raises(ValueError, match=r"n_samples=300 should be >= n_clusters=301\."):
        Est(301).fit(X)


@pytest.mark.parametrize("Est, default", [(outcore.KMeans, 10), (outcore.MiniBatchKMeans, 3)])
def test_n_init_as_scikit_learn_sets_it(Est, default, X):
    assert Est(4, n_init="auto", init="k-means++").fit(X)._n_init == 1
    assert Est(4, n_init="auto", init="random").fit(X)._n_init == default
    assert Est(4, n_init="auto", init=X[:4]).fit(X)._n_init == 1
    assert Est(4, n_init=2, init="random").fit(X)._n_init == 2
    with pytest.warns(RuntimeWarning, match="Explicit initial center position passed: performing only one init"):
        km = Est(4, n_init=5, init=X[:4]).fit(X)
    assert km._n_init == 1


def test_init_size_as_scikit_learn_sets_it(X):
    assert outcore.MiniBatchKMeans(10, batch_size=5, n_init=1).fit(X)._init_size == 15
    assert outcore.MiniBatchKMeans(10, batch_size=1, n_init=1).fit(X)._init_size == 30
    assert outcore.MiniBatchKMeans(10, batch_size=5, init_size=1000).fit(X)._init_size == 300
    with pytest.warns(RuntimeWarning, match=r"init_size=3 should be larger than n_clusters=10"):
        km = outcore.MiniBatchKMeans(10, init_size=3).fit(X)
    assert km._init_size == 30


@pytest.mark.parametrize(
    "params, name",
    [
        (dict(reassignment_ratio=-1.0), "reassignment_ratio"),
        (dict(init_size=0), "init_size"),
        (dict(compute_labels="yes"), "compute_labels"),
        (dict(max_no_improvement=-1), "max_no_improvement"),
        (dict(batch_size=0), "batch_size"),
        (dict(init="kmeans"), "init"),
        (dict(n_init=0), "n_init"),
        (dict(tol=-1.0), "tol"),
    ],
)
def test_bad_parameters_are_scikit_learns_errors(params, name, X):
    with pytest.raises(ValueError, match=rf"The '{name}' parameter of MiniBatchKMeans must be"):
        outcore.MiniBatchKMeans(4, **params).fit(X)


def test_fewer_distinct_clusters_than_asked_is_a_convergence_warning():
    X = np.asarray([[0, 0], [0, 1], [1, 0], [1, 0]])
    msg = r"Number of distinct clusters \(3\) found smaller than n_clusters \(4\)"
    with pytest.warns(ConvergenceWarning, match=msg):
        km = outcore.KMeans(4, random_state=0).fit(X)
    assert set(km.labels_) == {0, 1, 2}


@pytest.mark.parametrize("init", ["k-means++", "random", "array"])
def test_partial_fit_steps_as_scikit_learns(init, X):
    # The same draws from the same RandomState, the same updates and
    # reassignments: the same centres, to rounding.
    init = X[:4].copy() if init == "array" else init
    ours = outcore.MiniBatchKMeans(4, init=init, n_init=1, random_state=3)
    theirs = sk.MiniBatchKMeans(4, init=init, n_init=1, random_state=3)
    rng = np.random.RandomState(0)
    for _ in range(30):
        batch = X[rng.choice(len(X), 40, replace=False)]
        w = rng.uniform(0.5, 2, size=len(batch))
        ours.partial_fit(batch, sample_weight=w)
        theirs.partial_fit(batch, sample_weight=w)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ours._counts, theirs._counts)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)
    assert ours.inertia_ == pytest.approx(theirs.inertia_, rel=1e-9)
    assert ours.n_steps_ == theirs.n_steps_ == 30


def test_partial_fit_reassigns_centres_as_scikit_learns():
    X = make_blobs(n_samples=100, centers=5, random_state=1)[0]
    X[::2] = 0
    ours = outcore.MiniBatchKMeans(20, init="random", random_state=1, verbose=1)
    theirs = sk.MiniBatchKMeans(20, init="random", random_state=1)
    for _ in range(20):
        ours.partial_fit(X)
        theirs.partial_fit(X)
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-9, atol=1e-9)
    assert ours.cluster_centers_.any(axis=1).sum() > 9


def test_partial_fit_after_fit_and_compute_labels(X):
    km = outcore.MiniBatchKMeans(4, random_state=0, compute_labels=False).fit(X.astype(np.float32))
    assert not hasattr(km, "labels_")
    assert km._counts.sum() == pytest.approx(len(X) * km.n_iter_)
    steps = km.n_steps_
    km.partial_fit(X[:10].astype(np.float32))
    assert km.cluster_centers_.dtype == np.float32 and km.n_steps_ == steps + 1
    assert not hasattr(km, "labels_")
    km = outcore.MiniBatchKMeans(4, random_state=0).partial_fit(X.astype(np.int64))
    assert km.cluster_centers_.dtype == np.float64 and km.labels_.shape == (300,)
    assert list(km.get_feature_names_out()) == [f"minibatchkmeans{i}" for i in range(4)]
    with pytest.raises(ValueError, match="features"):
        km.partial_fit(X[:, :2])
    with pytest.raises(TypeError, match="partial_fit takes the mini-batch as an array"):
        km.partial_fit("X.npy")


@pytest.mark.parametrize("init", ["k-means++", "random"])
def test_init_centroids_draws_as_scikit_learns(init, X):
    w = np.random.RandomState(0).uniform(size=len(X))
    w[::2] = 0
    args = dict(X=X, x_squared_norms=row_norms(X, squared=True), init=init, sample_weight=w, n_centroids=6)
    ours = outcore.KMeans()._init_centroids(random_state=np.random.RandomState(1), **args)
    theirs = sk.KMeans()._init_centroids(random_state=np.random.RandomState(1), **args)
    np.testing.assert_array_equal(ours, theirs)
    # A row of zero weight is never drawn.
    assert not (np.abs(X[::2, None, :] - ours[None]).sum(axis=2) == 0).any()


def test_kmeans_verbose_lines_are_scikit_learns_on_stdout(capsys):
    X = np.random.RandomState(0).normal(size=(2000, 5))
    outcore.KMeans(3, init="random", n_init=1, tol=0, random_state=0, verbose=1).fit(X)
    out, err = capsys.readouterr()
    assert "Initialization complete" in out
    assert re.search(r"Iteration 0, inertia [0-9.e+]+\.", out)
    assert re.search(r"Converged at iteration [0-9]+: strict convergence\.", out)
    assert "outcore: loaded 2000 rows of 5" in err and "outcore: pass 1:" in err
    outcore.KMeans(3, init="random", n_init=1, tol=1e-2, random_state=0, verbose=1).fit(X)
    assert re.search(r"center shift .* within tolerance", capsys.readouterr().out)
    outcore.KMeans(3, n_init=1, random_state=0).fit(X)
    assert capsys.readouterr() == ("", "")


def test_minibatch_verbose_tells_why_it_stopped(capsys):
    X, _, centers = make_blobs(centers=3, random_state=0, return_centers=True)
    km = outcore.MiniBatchKMeans(3, init=centers, batch_size=20, tol=1e-4, max_iter=10, n_init=1, verbose=1,
                                 max_no_improvement=None).fit(X)
    assert 1 < km.n_iter_ < 10
    out = capsys.readouterr().out
    assert "Minibatch epoch 1/10: mean batch inertia: " in out
    assert re.search(r"Converged \(small centers change\) at step [0-9]+", out)
    outcore.MiniBatchKMeans(3, init=centers, batch_size=20, max_iter=100, n_init=1, verbose=1,
                            max_no_improvement=0).fit(X)
    assert "Converged (lack of improvement in inertia) at step 2" in capsys.readouterr().out


def test_no_warning_for_a_plain_fit(X):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcore.KMeans(4, random_state=0).fit(X)
        outcore.MiniBatchKMeans(4, random_state=0).fit(X).partial_fit(X)


def test_k_means_parallel_init_is_the_same_under_a_cap_and_as_good_as_k_means_plus_plus(tmp_path):
    X, _ = make_blobs(60_000, 16, centers=12, cluster_std=1.0, random_state=3)
    X = X.astype(np.float32)
    path = tmp_path / "X.npy"
    np.save(path, X)
    kw = dict(n_clusters=12, init="k-means||", random_state=5, max_iter=20)
    a = outcore.KMeans(**kw).fit(X)
    b = outcore.KMeans(mem_cap="2MiB", n_jobs=1, **kw).fit(np.load(path, mmap_mode="r"))
    assert a.cluster_centers_.tobytes() == b.cluster_centers_.tobytes()
    assert b.stats_["evictions"] > 0 and a.n_iter_ >= 1
    plus = outcore.KMeans(n_clusters=12, random_state=5, max_iter=20).fit(X)
    theirs = sk.KMeans(n_clusters=12, random_state=5, max_iter=20, n_init=1).fit(X)
    assert a.inertia_ <= 1.02 * min(plus.inertia_, theirs.inertia_), (a.inertia_, plus.inertia_, theirs.inertia_)
    mb = outcore.MiniBatchKMeans(n_clusters=12, init="k-means||", random_state=5).fit(X)
    assert mb.inertia_ <= 1.05 * theirs.inertia_
    # partial_fit's first batch is in memory: k-means++ on it.
    pf = outcore.MiniBatchKMeans(n_clusters=12, init="k-means||", random_state=5).partial_fit(X[:5_000])
    assert pf.cluster_centers_.shape == (12, 16)
    with pytest.raises(ValueError, match="k-means\\|\\|"):
        outcore.KMeans(n_clusters=2, init="k-means|").fit(X[:100])
