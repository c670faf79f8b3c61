"""LogisticRegression as a drop-in for scikit-learn's: its parameters, the
weights and penalties fitted by the engine, against scikit-learn's."""
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression as SkLogistic
from sklearn.preprocessing import StandardScaler

import outcore


def _data(name):
    if name == "iris":
        return load_iris(return_X_y=True)
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _both(X, y, fit=None, **kw):
    fit = fit or {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk = SkLogistic(tol=1e-10, max_iter=20000, **kw).fit(X, y, **fit)
        oc = outcore.LogisticRegression(tol=1e-9, max_iter=3000, **kw).fit(X, y, **fit)
    return sk, oc


def _close(sk, oc, rtol):
    assert oc.coef_.shape == sk.coef_.shape
    assert oc.intercept_.shape == sk.intercept_.shape
    scale = np.abs(sk.coef_).max()
    assert np.abs(oc.coef_ - sk.coef_).max() <= rtol * scale
    assert np.abs(oc.intercept_ - sk.intercept_).max() <= rtol * max(scale, 1.0)


@pytest.mark.parametrize("name", ["iris", "breast_cancer"])
def test_sample_and_class_weights_match_scikit_learn(name):
    X, y = _data(name)
    w = np.random.default_rng(0).uniform(0.1, 3.0, len(y))
    _close(*_both(X, y, fit={"sample_weight": w}, C=0.5), 1e-4)
    _close(*_both(X, y, class_weight="balanced"), 1e-4)
    cw = {c: 1.0 + i for i, c in enumerate(np.unique(y))}
    _close(*_both(X, y, fit={"sample_weight": w}, class_weight=cw), 1e-4)


@pytest.mark.parametrize("name", ["iris", "breast_cancer"])
def test_no_intercept_matches_scikit_learn(name):
    X, y = _data(name)
    sk, oc = _both(X, y, fit_intercept=False, C=0.3)
    assert np.all(oc.intercept_ == 0)
    _close(sk, oc, 1e-4)


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
def test_l1_and_elastic_net_find_scikit_learns_zeros(l1_ratio):
    X, y = _data("breast_cancer")
    sk, oc = _both(X, y, l1_ratio=l1_ratio, solver="saga", C=0.5)
    assert (oc.coef_ == 0).sum() > 0
    np.testing.assert_array_equal(oc.coef_ == 0, sk.coef_ == 0)
    _close(sk, oc, 1e-4)


def test_l1_with_a_solver_that_cannot_is_refused_as_scikit_learn():
    X, y = _data("iris")
    with pytest.raises(ValueError, match="Solver lbfgs supports only 'l2' or None penalties"):
        outcore.LogisticRegression(l1_ratio=1.0).fit(X, y)


def test_no_penalty_ignores_C():
    X, y = _data("iris")
    a = outcore.LogisticRegression(C=np.inf, max_iter=50).fit(X, y)
    with pytest.warns(UserWarning, match="ignore the C"):
        b = outcore.LogisticRegression(penalty=None, C=3.0, max_iter=50).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_warm_start_continues_from_the_last_fit():
    X, y = _data("breast_cancer")
    m = outcore.LogisticRegression(warm_start=True, max_iter=3)
    with pytest.warns(ConvergenceWarning, match="lbfgs failed to converge"):
        m.fit(X, y)
    first = m.coef_.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        m.fit(X, y)
        cold = outcore.LogisticRegression(max_iter=3).fit(X, y)
    assert not np.array_equal(m.coef_, first)
    np.testing.assert_array_equal(cold.coef_, first)
    # Three more iterations from the last point are closer to the minimum.
    full = outcore.LogisticRegression(max_iter=1000).fit(X, y)
    assert np.abs(m.coef_ - full.coef_).max() < np.abs(first - full.coef_).max()


@pytest.mark.parametrize(
    "solver, message",
    [("newton-cg", "newton-cg failed to converge"), ("sag", "The max_iter was reached"),
     ("newton-cholesky", "Newton solver did not converge after 1 iterations")],
)
def test_each_solver_warns_in_its_own_words(solver, message):
    X, y = _data("iris")
    with pytest.warns(ConvergenceWarning, match=message):
        m = outcore.LogisticRegression(solver=solver, max_iter=1, tol=1e-15).fit(X, y)
    assert m.n_iter_[0] == 1


def test_a_nan_in_predict_names_its_row_and_column():
    X, y = _data("iris")
    m = outcore.LogisticRegression().fit(X, y)
    bad = X.copy()
    bad[7, 2] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN at row 7, column 2"):
        m.predict(bad)
    k = outcore.KMeans(3, n_init=1, random_state=0).fit(X)
    bad[7, 2] = np.inf
    with pytest.raises(ValueError, match="Input X contains infinity at row 7, column 2"):
        k.transform(bad)
