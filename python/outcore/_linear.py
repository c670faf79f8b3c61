"""Linear and ridge regression (least squares) that run under a memory cap."""
import json
import numbers

import numpy as np
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

from . import _base, _core, _data
from ._kmeans import _ENGINE_DOC


class _LeastSquares(MultiOutputMixin, RegressorMixin, BaseEstimator):
    """Fit and predict shared by LinearRegression and Ridge: two passes of
    the engine over the data (the means, then the centred Gram matrix in
    float64), then the normal equations solved by Cholesky."""

    def _alphas(self, n_targets):
        return [0.0]

    def _fit(self, X, y, sample_weight):
        settings = _base.settings(self)
        dtype = _data.model_dtype(X)
        if _data.is_file_input(X):
            y = np.asarray(y)
            data = _base.fit_data(self, X)
        else:
            X, y = _base.validate_data(
                self, X, y, dtype=[np.float64, np.float32], multi_output=True, y_numeric=True,
                ensure_all_finite=False,
            )
            dtype = _data.model_dtype(X)
            data = _base.copy_of(self, X)
        with data:
            y = np.asarray(y, dtype=np.float64)
            if y.ndim not in (1, 2):
                raise ValueError(f"y must be 1-D or 2-D, not of shape {y.shape}")
            if len(y) != data.rows:
                raise ValueError(
                    f"Found input variables with inconsistent numbers of samples: [{data.rows}, {len(y)}]"
                )
            if not np.isfinite(y).all():
                raise ValueError("Input y contains NaN or infinity.")
            n_targets = 1 if y.ndim == 1 else y.shape[1]
            alphas = self._alphas(n_targets)
            w = None
            if sample_weight is not None:
                w = _check_sample_weight(sample_weight, np.empty((data.rows, 0)), dtype=np.float64)
            with _base.vector_of(self, y, dtype=np.float32, what="y") as ys, \
                    _base.vector_of(self, w, dtype=np.float64) as ws:
                out = _core.linear_fit(
                    settings, data.path, ys.path, None if w is None else ws.path,
                    (bool(self.fit_intercept), alphas, bool(self.positive)),
                )
        d = data.cols
        # float32 data: a float32 model, as scikit-learn's.
        coef = np.frombuffer(out["coef"], dtype="<f8").reshape(n_targets, d).astype(dtype)
        intercept = np.asarray(out["intercept"], dtype=np.float64).astype(dtype)
        if y.ndim == 1:
            self.coef_ = coef[0]
            self.intercept_ = intercept[0] if self.fit_intercept else dtype(0.0)
        else:
            self.coef_ = coef
            self.intercept_ = intercept if self.fit_intercept else 0.0
        self.stats_ = json.loads(out["stats"])
        return out

    def predict(self, X):
        """Predict using the linear model.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)

        Returns
        -------
        C : ndarray of shape (n_samples,) or (n_samples, n_targets)
        """
        check_is_fitted(self)
        if not _data.is_file_input(X):
            X = _base.validate_data(self, X, dtype=[np.float64, np.float32], reset=False,
                                    ensure_all_finite=False)
        dtype = np.result_type(_data.model_dtype(X), self.coef_.dtype)
        coef = np.atleast_2d(self.coef_)
        out = _base.apply_rows(self, X, "affine", coef, self.intercept_, dtype=np.float64)
        out = out.astype(dtype, copy=False)
        return out.reshape((-1,) + np.shape(self.coef_)[:-1])


def _check_flag(name, v):
    if not isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool, not {v!r}")


class LinearRegression(_LeastSquares):
    """Ordinary least squares that runs under a memory cap.

    The data is read in two passes (the column means, then the Gram matrix
    of the centred data, summed in float64 in a fixed order: the same
    result under any cap); the normal equations are solved by Cholesky,
    or for a singular system by the pseudo-inverse (the least-norm
    solution, as scikit-learn's ``lstsq`` gives).

    Parameters
    ----------
    fit_intercept : bool, default=True
        Whether to fit an intercept (the data is centred first).
    copy_X : bool, default=True
        Kept for compatibility: the engine never changes X.
    tol : float, default=1e-6
        Kept for compatibility: scikit-learn uses it for sparse input only,
        which outcore refuses; the normal equations are solved directly.
    positive : bool, default=False
        Coefficients constrained to be >= 0: non-negative least squares on
        the same normal equations (Lawson and Hanson's active sets), as
        scikit-learn's ``scipy.optimize.nnls``.
    ENGINE
    max_ranks : None, "auto" or int, default=None
        As :class:`outcore.KMeans`: grow onto free MPI slots under
        ``mpirun`` when the data does not fit the ranks' caps.
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        float32 for a float32 array, as scikit-learn's; float64 otherwise.
    intercept_ : float or ndarray of shape (n_targets,)
    rank_ : int
        Rank of the centred data.
    singular_ : ndarray of shape (n_features,)
        Singular values of the centred (weighted) data.
    n_features_in_ : int
    stats_ : dict
        What the engine did (the command line's --stats).
    """

    def __init__(self, *, fit_intercept=True, copy_X=True, tol=1e-6, n_jobs=None, positive=False,
                 verbose=0, mem_cap=None, spill_dir=None, timeline=None,
                 max_ranks=None):
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.tol = tol
        self.n_jobs = n_jobs
        self.positive = positive
        self.verbose = verbose
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.timeline = timeline
        self.max_ranks = max_ranks

    def fit(self, X, y, sample_weight=None):
        """Fit the linear model.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        _check_flag("fit_intercept", self.fit_intercept)
        _check_flag("positive", self.positive)
        out = self._fit(X, y, sample_weight)
        self.rank_ = int(out["rank"])
        self.singular_ = np.frombuffer(out["singular"], dtype="<f8").copy()
        return self


class Ridge(_LeastSquares):
    """Linear least squares with l2 regularization, under a memory cap.

    Minimises ``||y - Xw||^2 + alpha * ||w||^2`` (the intercept is not
    penalised), as scikit-learn's ``Ridge``: two passes of the engine over
    the data, then the normal equations solved by Cholesky.

    Parameters
    ----------
    alpha : float or array-like of shape (n_targets,), default=1.0
        Regularization strength, >= 0; one per target if an array.
    fit_intercept : bool, default=True
    copy_X : bool, default=True
        Kept for compatibility: the engine never changes X.
    max_iter, tol, random_state :
        Kept for compatibility: the solver is direct.
    solver : str, default="auto"
        Any of scikit-learn's names is accepted; the system is solved by
        Cholesky (the pseudo-inverse when it is singular).
    positive : bool, default=False
        Coefficients constrained to be >= 0 (active sets on the penalised
        normal equations: the exact solution scikit-learn's "lbfgs"
        approaches). Needs ``solver`` "auto" or "lbfgs", as scikit-learn's.
    ENGINE
    max_ranks : None, "auto" or int, default=None
        As :class:`outcore.KMeans`: grow onto free MPI slots under
        ``mpirun`` when the data does not fit the ranks' caps.
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : float or ndarray of shape (n_targets,)
    n_iter_ : None
    solver_ : str
    n_features_in_ : int
    stats_ : dict
    """

    #: The scikit-learn check this estimator is expected to fail, as
    #: scikit-learn's own Ridge does.
    _expected_failed_checks = {
        "check_non_transformer_estimators_n_iter": (
            "n_iter_ is None: the solver is direct (scikit-learn's Ridge with its "
            "direct solvers, listed as expected to fail there too)"
        ),
    }

    _SOLVERS = ("auto", "svd", "cholesky", "lsqr", "sparse_cg", "sag", "saga", "lbfgs")

    def __init__(self, alpha=1.0, *, fit_intercept=True, copy_X=True, max_iter=None, tol=1e-4,
                 solver="auto", positive=False, random_state=None, n_jobs=None, verbose=0,
                 mem_cap=None, spill_dir=None, timeline=None,
                 max_ranks=None):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.max_iter = max_iter
        self.tol = tol
        self.solver = solver
        self.positive = positive
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.timeline = timeline
        self.max_ranks = max_ranks

    def _alphas(self, n_targets):
        a = np.asarray(self.alpha, dtype=np.float64).ravel()
        if a.size not in (1, n_targets):
            raise ValueError(
                f"Number of targets and number of penalties do not correspond: {a.size} != {n_targets}"
            )
        return [float(v) for v in a]

    def fit(self, X, y, sample_weight=None):
        """Fit the ridge model.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : float or array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        _check_flag("fit_intercept", self.fit_intercept)
        a = np.asarray(self.alpha)
        if a.dtype.kind not in "iuf" or not np.isfinite(a).all() or (a < 0).any():
            raise ValueError(f"alpha must be a float >= 0 or an array of them, not {self.alpha!r}")
        if self.solver not in self._SOLVERS:
            raise ValueError(f"solver must be one of {self._SOLVERS}, not {self.solver!r}")
        _check_flag("positive", self.positive)
        if self.solver == "lbfgs" and not self.positive:
            raise ValueError(
                "'lbfgs' solver can be used only when positive=True. Please use another solver."
            )
        if self.positive and self.solver not in ("auto", "lbfgs"):
            raise ValueError(
                f"solver='{self.solver}' does not support positive fitting. Please"
                " set the solver to 'auto' or 'lbfgs', or set `positive=False`"
            )
        if isinstance(sample_weight, numbers.Number):
            sample_weight = None if sample_weight == 1 else sample_weight
        out = self._fit(X, y, sample_weight)
        self.n_iter_ = None
        # scikit-learn's name of the method that gives the same solution.
        self.solver_ = {"cholesky": "cholesky", "nnls": "lbfgs"}.get(out["solver"], "svd")
        return self


for _cls in (LinearRegression, Ridge):
    _cls.__doc__ = _cls.__doc__.replace("    ENGINE\n", _ENGINE_DOC.lstrip("\n") + "\n")
