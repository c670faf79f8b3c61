"""LinearRegression, Ridge and PCA against scikit-learn on real and
synthetic data, the same bytes under any cap, a memmap 4x the cap, and
bad inputs."""
import subprocess

import numpy as np
import pytest
from sklearn import datasets, decomposition, linear_model

import outcore


def california_like(n=20_000, d=8, seed=0):
    """Data shaped like California housing: 8 skewed positive features of
    different scales, a target from a nonlinear function plus noise."""
    rng = np.random.default_rng(seed)
    scales = np.array([2.0, 12.0, 5.0, 1.0, 1400.0, 3.0, 35.0, 120.0])[:d]
    X = rng.gamma(2.0, 1.0, size=(n, d)) * scales
    y = 0.4 * np.log1p(X[:, 0]) + 0.01 * X[:, 1] - 0.002 * X[:, 4] ** 0.5 + rng.normal(scale=0.3, size=n)
    return X, y


def relative(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(b).max(), 1e-300)


@pytest.mark.parametrize("name", ["diabetes", "breast_cancer", "california_like"])
def test_linear_and_ridge_coefficients_match_scikit_learn(name):
    if name == "california_like":
        X, y = california_like()
    else:
        X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
        y = y.astype(np.float64)
    # The engine holds rows as float32: compare with scikit-learn on the
    # same values.
    X = X.astype(np.float32).astype(np.float64)
    rng = np.random.default_rng(1)
    w = rng.uniform(0.5, 2.0, len(y))
    for ours, theirs, kw in [
        (outcore.LinearRegression, linear_model.LinearRegression, {}),
        (outcore.Ridge, linear_model.Ridge, {"alpha": 0.7}),
    ]:
        a = ours(mem_cap="64MiB", **kw).fit(X, y, sample_weight=w)
        b = theirs(**kw).fit(X, y, sample_weight=w)
        assert relative(a.coef_, b.coef_) < 1e-5, (name, ours.__name__)
        assert abs(a.intercept_ - b.intercept_) <= 1e-5 * max(1.0, abs(b.intercept_))
        assert abs(a.score(X, y) - b.score(X, y)) < 1e-8
        # The engine's R^2 on the rows fitted, from the Gram matrix.
        assert abs(a.stats_["r2"][0] - b.score(X, y, sample_weight=w)) < 1e-6


def test_linear_regression_rank_singular_values_and_a_singular_system():
    X, y = datasets.load_diabetes(return_X_y=True)
    X = X.astype(np.float32).astype(np.float64)
    a, b = outcore.LinearRegression().fit(X, y), linear_model.LinearRegression().fit(X, y)
    assert a.rank_ == b.rank_ == 10
    assert relative(a.singular_, b.singular_) < 1e-7
    # A repeated column: the least-norm solution, as lstsq's.
    X2 = np.column_stack([X, X[:, 3]])
    a, b = outcore.LinearRegression().fit(X2, y), linear_model.LinearRegression().fit(X2, y)
    assert a.rank_ == b.rank_ == 10
    assert relative(a.coef_, b.coef_) < 1e-5
    assert a.stats_["solver"] == "pseudo-inverse"


def test_several_targets_each_with_its_alpha():
    X, y = datasets.load_diabetes(return_X_y=True)
    X = X.astype(np.float32).astype(np.float64)
    Y = np.column_stack([y, np.sqrt(y), -y]).astype(np.float32).astype(np.float64)
    alpha = [0.1, 1.0, 10.0]
    a = outcore.Ridge(alpha=alpha).fit(X, Y)
    b = linear_model.Ridge(alpha=alpha).fit(X, Y)
    assert a.coef_.shape == (3, 10) and a.intercept_.shape == (3,)
    assert relative(a.coef_, b.coef_) < 1e-5
    assert relative(a.intercept_, b.intercept_) < 1e-5
    assert a.predict(X).shape == (len(X), 3)
    c = outcore.LinearRegression(fit_intercept=False).fit(X, Y)
    d = linear_model.LinearRegression(fit_intercept=False).fit(X, Y)
    assert relative(c.coef_, d.coef_) < 1e-5 and c.intercept_ == 0.0


@pytest.mark.parametrize("n_components", [None, 5, 0.9, "mle"])
@pytest.mark.parametrize("whiten", [False, True])
def test_pca_matches_scikit_learn_on_digits(n_components, whiten):
    X, _ = datasets.load_digits(return_X_y=True)
    # Without the three columns that are 0 in every row: their variances
    # are 0 and their directions arbitrary.
    X = X[:, X.std(axis=0) > 0]
    a = outcore.PCA(n_components, whiten=whiten, mem_cap="64MiB").fit(X)
    b = decomposition.PCA(n_components, whiten=whiten, svd_solver="full").fit(X)
    assert a.n_components_ == b.n_components_
    assert np.abs(a.components_ - b.components_).max() < 1e-8
    assert relative(a.explained_variance_, b.explained_variance_) < 1e-5
    assert np.allclose(a.explained_variance_ratio_, b.explained_variance_ratio_, rtol=1e-5)
    assert np.allclose(a.singular_values_, b.singular_values_, rtol=1e-5)
    assert np.allclose(a.mean_, b.mean_) and np.isclose(a.noise_variance_, b.noise_variance_, rtol=1e-5)
    T = a.transform(X)
    assert np.allclose(T, b.transform(X), atol=1e-7)
    assert np.allclose(a.inverse_transform(T), b.inverse_transform(T), atol=1e-7)
    if n_components not in (None, "mle"):
        assert np.isclose(a.score(X), b.score(X), rtol=1e-7)


def test_same_bytes_under_any_cap_and_from_a_memmap_four_times_the_cap(tmp_path):
    X, y = california_like(n=300_000, d=8)
    path = tmp_path / "X.npy"
    np.save(path, X.astype(np.float32))
    big = np.load(path, mmap_mode="r")
    cap = "2MiB"
    assert big.nbytes >= 4 * (2 << 20)
    fits = [
        outcore.Ridge(alpha=2.0, mem_cap=c, n_jobs=w).fit(x, y)
        for c, w, x in [(None, 2, np.load(path)), (cap, 1, big), ("5MiB", 1, str(path))]
    ]
    # float32 arrays give a float32 model (scikit-learn's rule), a path the
    # engine's float64: the same model, rounded.
    assert fits[0].coef_.dtype == np.float32 and fits[2].coef_.dtype == np.float64
    for f in fits[1:]:
        assert f.coef_.astype(np.float32).tobytes() == fits[0].coef_.tobytes()
    assert fits[1].stats_["evictions"] > 0
    pcas = [outcore.PCA(3, mem_cap=c, n_jobs=1).fit(x) for c, x in [(None, np.load(path)), (cap, big)]]
    assert pcas[0].components_.tobytes() == pcas[1].components_.tobytes()
    assert pcas[1].stats_["evictions"] > 0
    ref = decomposition.PCA(3, svd_solver="covariance_eigh").fit(np.load(path).astype(np.float64))
    assert np.abs(pcas[1].components_ - ref.components_).max() < 1e-6


def test_the_command_line_gives_the_estimators_bytes(cli, tmp_path):
    X, y = datasets.load_diabetes(return_X_y=True)
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    np.save(tmp_path / "y.npy", y.astype(np.float32))
    m, c = tmp_path / "m.npy", tmp_path / "c.npy"
    subprocess.run([cli, "linear", "--input", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"),
                    "--alpha", "0.5", "--output", str(m)], check=True, capture_output=True)
    subprocess.run([cli, "pca", "--input", str(tmp_path / "x.npy"), "--n-components", "4",
                    "--output", str(c)], check=True, capture_output=True)
    r = outcore.Ridge(alpha=0.5).fit(tmp_path / "x.npy", y.astype(np.float32))
    model = np.load(m)
    assert model[0, :-1].tobytes() == r.coef_.tobytes() and model[0, -1] == r.intercept_
    p = outcore.PCA(4).fit(tmp_path / "x.npy")
    assert np.load(c).tobytes() == p.components_.tobytes()


def test_bad_inputs_raise_scikit_learns_exceptions():
    X, y = datasets.load_diabetes(return_X_y=True)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        outcore.LinearRegression().fit(X, y[:-1])
    with pytest.raises(ValueError, match="NaN"):
        outcore.Ridge().fit(X, np.where(np.arange(len(y)) == 5, np.nan, y))
    with pytest.raises(ValueError, match="penalties"):
        outcore.Ridge(alpha=[1.0, 2.0]).fit(X, y)
    with pytest.raises(ValueError, match="alpha"):
        outcore.Ridge(alpha=-1.0).fit(X, y)
    with pytest.raises(ValueError, match="n_components=11 must be between 1"):
        outcore.PCA(11).fit(X)
    with pytest.raises(MemoryError, match="PCA on 1200 columns needs"):
        outcore.PCA(2, svd_solver="full", mem_cap="16MiB", n_jobs=1).fit(np.zeros((10, 1200)))


def separable(n=40_000, d=20, classes=3, seed=0):
    X, y = datasets.make_classification(n, d, n_informative=10, n_classes=classes, class_sep=2.0,
                                        random_state=seed)
    return X.astype(np.float32).astype(np.float64), y


@pytest.mark.parametrize("loss", ["hinge", "log_loss", "modified_huber"])
@pytest.mark.parametrize("penalty", ["l2", "l1", "elasticnet"])
def test_sgd_classifier_accuracy_matches_scikit_learn(loss, penalty):
    X, y = separable()
    Xtr, Xte, ytr, yte = X[:30_000], X[30_000:], y[:30_000], y[30_000:]
    kw = dict(loss=loss, penalty=penalty, max_iter=5, tol=None)
    # SGD's accuracy varies by about 0.01 with the seed: the mean of 8.
    seeds = range(8)
    ours = np.mean([outcore.SGDClassifier(random_state=s, **kw).fit(Xtr, ytr).score(Xte, yte) for s in seeds])
    theirs = np.mean([linear_model.SGDClassifier(random_state=s, **kw).fit(Xtr, ytr).score(Xte, yte)
                      for s in seeds])
    assert abs(ours - theirs) < 0.01, (ours, theirs)


@pytest.mark.parametrize("loss", ["squared_error", "huber", "epsilon_insensitive"])
def test_sgd_regressor_r2_matches_scikit_learn(loss):
    X, y = datasets.make_regression(30_000, 20, noise=5.0, random_state=0)
    X = X.astype(np.float32).astype(np.float64)
    kw = dict(loss=loss, max_iter=5, tol=None, random_state=0)
    if loss != "squared_error":
        kw.update(epsilon=1.0, learning_rate="constant", eta0=0.001)
    a = outcore.SGDRegressor(**kw).fit(X[:20_000], y[:20_000]).score(X[20_000:], y[20_000:])
    b = linear_model.SGDRegressor(**kw).fit(X[:20_000], y[:20_000]).score(X[20_000:], y[20_000:])
    assert abs(a - b) < 0.01, (a, b)


@pytest.mark.parametrize("average", [False, 2_000])
def test_sgd_partial_fit_over_chunks_is_one_epoch_over_all_of_them(cli, tmp_path, average):
    X, y = separable(n=20_000, d=12)
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    np.save(tmp_path / "y.npy", y.astype(np.float32))
    kw = dict(loss="log_loss", shuffle=False, max_iter=1, tol=None, learning_rate="invscaling", eta0=0.05,
              average=average)
    chunks = outcore.SGDClassifier(**kw)
    for start in range(0, len(y), 3_000):
        chunks.partial_fit(X[start:start + 3_000], y[start:start + 3_000], classes=np.unique(y))
    whole = outcore.SGDClassifier(**kw).fit(X, y)
    assert chunks.coef_.tobytes() == whole.coef_.tobytes()
    assert chunks.intercept_.tobytes() == whole.intercept_.tobytes() and chunks.t_ == whole.t_
    out = tmp_path / "m.npy"
    subprocess.run([cli, "sgd", "--input", str(tmp_path / "x.npy"), "--targets", str(tmp_path / "y.npy"),
                    "--classes", "3", "--loss", "log_loss", "--no-shuffle", "--max-iter", "1", "--tol", "none",
                    "--learning-rate", "invscaling", "--eta0", "0.05", "--average", str(int(average)),
                    "--output", str(out)],
                   check=True, capture_output=True)
    model = np.load(out)
    assert model[:, :-1].tobytes() == whole.coef_.tobytes()
    assert model[:, -1].tobytes() == whole.intercept_.tobytes()


def test_averaged_sgd_matches_scikit_learn():
    X, y = separable()
    Xtr, Xte, ytr, yte = X[:30_000], X[30_000:], y[:30_000], y[30_000:]
    for loss in ["hinge", "log_loss"]:
        kw = dict(loss=loss, max_iter=5, tol=None, average=True)
        ours = np.mean([outcore.SGDClassifier(random_state=s, **kw).fit(Xtr, ytr).score(Xte, yte)
                        for s in range(4)])
        theirs = np.mean([linear_model.SGDClassifier(random_state=s, **kw).fit(Xtr, ytr).score(Xte, yte)
                          for s in range(4)])
        assert abs(ours - theirs) < 0.01, (loss, ours, theirs)
    X, y = datasets.make_regression(30_000, 20, noise=5.0, random_state=0)
    kw = dict(max_iter=5, tol=None, random_state=0, average=1_000)
    a = outcore.SGDRegressor(**kw).fit(X[:20_000], y[:20_000])
    b = linear_model.SGDRegressor(**kw).fit(X[:20_000], y[:20_000])
    assert abs(a.score(X[20_000:], y[20_000:]) - b.score(X[20_000:], y[20_000:])) < 0.01
    # The mean, not the last weights: they differ, and the last are kept.
    assert not np.array_equal(a.coef_, a._standard_coef)
    with pytest.raises(ValueError, match="average"):
        outcore.SGDRegressor(average=-1).fit(X[:100], y[:100])


def test_sgd_same_bytes_under_a_cap_from_a_memmap_and_early_stopping(tmp_path):
    X, y = separable(n=120_000, d=16, classes=2)
    path = tmp_path / "X.npy"
    np.save(path, X.astype(np.float32))
    kw = dict(loss="log_loss", max_iter=4, tol=None, random_state=3)
    a = outcore.SGDClassifier(**kw).fit(np.load(path), y)
    b = outcore.SGDClassifier(mem_cap="2MiB", n_jobs=1, **kw).fit(np.load(path, mmap_mode="r"), y)
    assert a.coef_.tobytes() == b.coef_.tobytes() and b.stats_["evictions"] > 0
    assert a.predict_proba(X[:5]).shape == (5, 2)
    es = outcore.SGDClassifier(loss="hinge", early_stopping=True, n_iter_no_change=2, random_state=0).fit(X, y)
    assert 3 <= es.n_iter_ < 1000
    with pytest.raises(AttributeError):
        outcore.SGDClassifier(loss="hinge").fit(X[:100], y[:100]).predict_proba(X[:2])


def test_incremental_pca_is_the_exact_pca_of_every_row_seen(tmp_path):
    X, _ = datasets.load_digits(return_X_y=True)
    X = X[:, X.std(axis=0) > 0]
    exact = decomposition.PCA(10, svd_solver="full").fit(X)
    np.save(tmp_path / "X.npy", X.astype(np.float32))
    whole = outcore.IncrementalPCA(10, mem_cap="64MiB").fit(np.load(tmp_path / "X.npy", mmap_mode="r"))
    batches = outcore.IncrementalPCA(10)
    for start in range(0, len(X), 300):
        batches.partial_fit(X[start:start + 300])
    for m in (whole, batches):
        assert m.n_samples_seen_ == len(X)
        assert np.abs(m.components_ - exact.components_).max() < 1e-8
        assert np.allclose(m.explained_variance_, exact.explained_variance_, rtol=1e-5)
        assert np.allclose(m.var_, X.var(axis=0), rtol=1e-5)
    # Going on from fit with a batch: the moments of all the rows.
    whole.partial_fit(X[:100])
    both = decomposition.PCA(10, svd_solver="full").fit(np.vstack([X, X[:100]]))
    assert np.abs(whole.components_ - both.components_).max() < 1e-8
    with pytest.raises(ValueError, match="must be less or equal to the batch number of samples"):
        outcore.IncrementalPCA(20).partial_fit(X[:10])


def test_randomized_pca_finds_the_leading_components(tmp_path):
    X, _ = datasets.load_digits(return_X_y=True)
    X = X[:, X.std(axis=0) > 0]
    exact = decomposition.PCA(5, svd_solver="full").fit(X)
    a = outcore.PCA(5, svd_solver="randomized", random_state=0).fit(X)
    assert np.abs(a.components_ - exact.components_).max() < 1e-4
    assert relative(a.explained_variance_, exact.explained_variance_) < 1e-6
    assert np.allclose(a.explained_variance_ratio_, exact.explained_variance_ratio_, rtol=1e-6)
    ref = decomposition.PCA(5, svd_solver="randomized", random_state=0).fit(X)
    assert np.isclose(a.noise_variance_, ref.noise_variance_, rtol=1e-5)
    # Passes: the means, then 7 power iterations ("auto": 5 components,
    # under a tenth of the 61 columns) and two, as scikit-learn counts.
    assert len(a.stats_["passes"]) == 1 + 7 + 2
    # The same bytes under a cap that evicts.
    np.save(tmp_path / "X.npy", np.ascontiguousarray(X, dtype=np.float32))
    b = outcore.PCA(5, svd_solver="randomized", random_state=0, mem_cap="1MiB", n_jobs=1).fit(tmp_path / "X.npy")
    assert b.components_.tobytes() == a.components_.tobytes()


@pytest.mark.parametrize("X", [[[1.0, 0.0], [0.0, 1.0]], np.outer(np.arange(5.0), [1.0, 1.0, 1.0])])
def test_randomized_pca_on_data_of_exactly_low_rank(X):
    # Found by scikit-learn's test_pca_check_projection_list: the solver
    # filled its subspace with unit vectors not orthogonal to the rest,
    # and gave components of norm sqrt(2) or sqrt(3), the variance times as much.
    X = np.asarray(X)
    full = outcore.PCA(n_components=1, svd_solver="full").fit(X)
    rnd = outcore.PCA(n_components=1, svd_solver="randomized", random_state=0).fit(X)
    np.testing.assert_allclose(np.linalg.norm(rnd.components_, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(rnd.explained_variance_, full.explained_variance_, rtol=1e-6)
    np.testing.assert_allclose(np.abs(rnd.components_), np.abs(full.components_), atol=1e-6)


def test_scikit_learns_loose_settings_are_accepted():
    # Each found by scikit-learn's own tests (benches/sklearn_suite.py).
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    y = (X[:, 0] > 0).astype(int)
    # l1_ratio=None when the penalty is not elasticnet; refused when it is.
    outcore.SGDClassifier(penalty="l1", l1_ratio=None, max_iter=2, tol=None).fit(X, y)
    with pytest.raises(ValueError, match="l1_ratio must be set"):
        outcore.SGDClassifier(penalty="elasticnet", l1_ratio=None).fit(X, y)
    # A later partial_fit batch smaller than n_components.
    ipca = outcore.IncrementalPCA(n_components=3).partial_fit(X[:10])
    ipca.partial_fit(X[10:12])
    exact = decomposition.PCA(n_components=3).fit(X[:12])
    np.testing.assert_allclose(ipca.explained_variance_, exact.explained_variance_, rtol=1e-9)
    # A value too large for float32 is the ValueError naming it, even
    # when numpy raises on overflow.
    big = X.copy()
    big[3, 1] = 1e300
    with np.errstate(all="raise"), pytest.raises(ValueError, match="row 3, column 1"):
        outcore.PCA(n_components=2).fit(big)


def test_float32_arrays_give_float32_models_as_scikit_learns(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 5))
    y = X @ rng.normal(size=5)
    for dt in (np.float32, np.float64):
        Xd = X.astype(dt)
        sk, ours = linear_model.Ridge(alpha=1.0).fit(Xd, y.astype(dt)), outcore.Ridge(alpha=1.0).fit(Xd, y.astype(dt))
        assert ours.coef_.dtype == sk.coef_.dtype == dt
        assert ours.predict(Xd).dtype == sk.predict(Xd).dtype
        skp, p = decomposition.PCA(2).fit(Xd), outcore.PCA(2).fit(Xd)
        for attr in ("components_", "explained_variance_", "singular_values_", "mean_"):
            assert getattr(p, attr).dtype == getattr(skp, attr).dtype == dt, attr
        assert p.transform(Xd).dtype == skp.transform(Xd).dtype == dt
    # A path is not scikit-learn's input: the model keeps the engine's float64.
    np.save(tmp_path / "x.npy", X.astype(np.float32))
    assert outcore.PCA(2).fit(tmp_path / "x.npy").components_.dtype == np.float64


@pytest.mark.parametrize("shape, k, solver", [
    ((1000, 50), 5, "covariance_eigh"), ((10, 50), 5, "full"),
    ((1000, 500), 10, "randomized"), ((1000, 500), 400, "full"),
])
def test_auto_picks_scikit_learns_solver(shape, k, solver):
    X = np.random.RandomState(0).uniform(size=shape)
    ours, sk = outcore.PCA(k, random_state=0).fit(X), decomposition.PCA(k, random_state=0).fit(X)
    assert ours._fit_svd_solver == sk._fit_svd_solver == solver
    # arpack keeps one component fewer than min(shape) by default.
    assert outcore.PCA(svd_solver="arpack").fit(X[:20, :8]).n_components_ == 7


def test_positive_coefficients_match_scikit_learn():
    X, y = datasets.load_diabetes(return_X_y=True)
    X = X.astype(np.float32).astype(np.float64)
    w = np.random.default_rng(2).uniform(0.5, 2.0, len(y))
    for sw in (None, w):
        sk = linear_model.LinearRegression(positive=True).fit(X, y, sample_weight=sw)
        ours = outcore.LinearRegression(positive=True).fit(X, y, sample_weight=sw)
        assert (ours.coef_ >= 0).all() and (sk.coef_ == 0).any()
        np.testing.assert_allclose(ours.coef_, sk.coef_, rtol=1e-6, atol=1e-6 * np.abs(sk.coef_).max())
        assert ours.intercept_ == pytest.approx(sk.intercept_, rel=1e-7)
    sk = linear_model.Ridge(alpha=0.01, positive=True, tol=1e-10).fit(X, y)
    ours = outcore.Ridge(alpha=0.01, positive=True).fit(X, y)
    np.testing.assert_allclose(ours.coef_, sk.coef_, atol=1e-3 * np.abs(sk.coef_).max())
    assert ours.solver_ == "lbfgs"
    with pytest.raises(ValueError, match="does not support positive fitting"):
        outcore.Ridge(positive=True, solver="cholesky").fit(X, y)


def test_sgd_refuses_what_scikit_learn_refuses_with_its_words():
    X, y = separable(n=200, d=12)
    with pytest.raises(ValueError, match="early_stopping should be False with partial_fit"):
        outcore.SGDRegressor(early_stopping=True).partial_fit(X, y.astype(float))
    with pytest.raises(ValueError, match="class_weight 'balanced' is not supported for partial_fit"):
        outcore.SGDClassifier(class_weight="balanced").partial_fit(X, y, classes=np.unique(y))
    with pytest.raises(ValueError, match="Provided coef_init does not match dataset"):
        outcore.SGDClassifier().fit(X, y, coef_init=np.zeros((3,)))
    with pytest.raises(ValueError, match="Provided intercept_init does not match dataset"):
        outcore.SGDClassifier().fit(X, y, intercept_init=np.zeros((2,)))
    with pytest.raises(ValueError, match="led to an empty set"):
        outcore.SGDClassifier(early_stopping=True, validation_fraction=0.999).fit(X[:10], y[:10])
    with pytest.warns(FutureWarning, match="Negative values for `power_t`"):
        outcore.SGDRegressor(power_t=-1.0, max_iter=2, tol=None).fit(X, y.astype(float))
    # A binary model takes coef_init of d values in any shape, and a scalar intercept.
    b = y < 1
    outcore.SGDClassifier(max_iter=2, tol=None).fit(X, b, coef_init=np.zeros((1, 12)), intercept_init=0)
