"""Linear models by stochastic gradient descent that run under a memory cap."""
import json
import numbers
import os
import warnings

import numpy as np
from scipy.special import expit
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

from . import _base, _core, _data
from ._kmeans import _ENGINE_DOC, _seed

_CLASSIFY = ("hinge", "log_loss", "modified_huber", "squared_hinge", "perceptron")
_REGRESS = ("squared_error", "huber", "epsilon_insensitive", "squared_epsilon_insensitive")
_RATES = ("constant", "optimal", "invscaling", "adaptive")


def _width(X):
    """Columns of ``X``: an array's, or a file's."""
    if hasattr(X, "shape"):
        return X.shape[1]
    return _core.shape(os.fspath(X))[1]


class _SGD(BaseEstimator):
    """What both estimators share: the checks, the engine's run, the model
    carried from one ``partial_fit`` to the next."""

    #: The scikit-learn check these estimators are expected to fail, as
    #: scikit-learn's own SGD estimators do.
    _expected_failed_checks = {
        "check_sample_weight_equivalence_on_dense_data": (
            "sample_weight is not equivalent to removing or repeating samples: SGD visits "
            "each row once per epoch, whatever its weight (listed by scikit-learn for its "
            "own SGD estimators too)"
        ),
    }

    def _check_params(self, losses, partial=False):
        if self.early_stopping and partial:
            raise ValueError("early_stopping should be False with partial_fit")
        if isinstance(self.power_t, numbers.Real) and self.power_t < 0:
            warnings.warn(
                "Negative values for `power_t` are deprecated in version 1.8 and will raise an error in 1.10. "
                "Use values in the range [0.0, inf) instead.",
                FutureWarning,
            )
        if self.loss not in losses:
            raise ValueError(f"loss must be one of {losses}, not {self.loss!r}")
        if self.penalty not in ("l2", "l1", "elasticnet", None):
            raise ValueError(f"penalty must be 'l2', 'l1', 'elasticnet' or None, not {self.penalty!r}")
        if self.learning_rate not in _RATES:
            raise ValueError(f"learning_rate must be one of {_RATES}, not {self.learning_rate!r}")
        for name, low in (("max_iter", 1), ("n_iter_no_change", 1)):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, not {v!r}")
        if not (isinstance(self.alpha, numbers.Real) and self.alpha >= 0):
            raise ValueError(f"alpha must be a float >= 0, not {self.alpha!r}")
        if self.learning_rate == "optimal" and self.alpha == 0:
            raise ValueError("alpha must be > 0 since learning_rate is 'optimal'")
        if self.learning_rate != "optimal" and not self.eta0 > 0:
            raise ValueError("eta0 must be > 0")
        if self.l1_ratio is None:
            # scikit-learn's rule: unused unless the penalty is elasticnet.
            if self.penalty == "elasticnet":
                raise ValueError("l1_ratio must be set when penalty is 'elasticnet'")
        elif not (isinstance(self.l1_ratio, numbers.Real) and 0 <= self.l1_ratio <= 1):
            raise ValueError(f"l1_ratio must be in [0, 1], not {self.l1_ratio!r}")
        if self.early_stopping and not 0 < self.validation_fraction < 1:
            raise ValueError("validation_fraction must be in range (0, 1)")
        a = self.average
        if not (isinstance(a, (bool, np.bool_)) or (isinstance(a, numbers.Integral) and a > 0)):
            raise ValueError(f"average must be a bool or an int > 0, not {a!r}")

    def _params(self, classes, max_iter, class_weight, early_stopping):
        tol = None if self.tol is None else float(self.tol)
        return {
            "classes": classes, "loss": self.loss, "penalty": self.penalty, "alpha": float(self.alpha),
            "l1_ratio": 0.0 if self.l1_ratio is None else float(self.l1_ratio), "fit_intercept": bool(self.fit_intercept),
            "max_iter": int(max_iter), "tol": tol, "shuffle": bool(self.shuffle),
            "seed": _seed(self.random_state), "learning_rate": self.learning_rate,
            "eta0": float(self.eta0), "power_t": float(self.power_t), "early_stopping": early_stopping,
            "validation_fraction": float(self.validation_fraction),
            "n_iter_no_change": int(self.n_iter_no_change), "epsilon": float(self.epsilon),
            "class_weight": [float(c) for c in class_weight],
            "average": int(self.average),
        }

    def _run(self, X, codes, sample_weight, params, warm, reset):
        """Fits on ``X`` with the targets ``codes``; sets the model."""
        settings = _base.settings(self)
        if _data.is_file_input(X):
            data = _base.fit_data(self, X) if reset else _base.new_data(self, X)[0]
        else:
            data = _base.copy_of(self, X)
        with data:
            if len(codes) != data.rows:
                raise ValueError(
                    f"Found input variables with inconsistent numbers of samples: [{data.rows}, {len(codes)}]"
                )
            if params["early_stopping"]:
                # scikit-learn's split sizes (the engine holds out rows by
                # a hash of their index, about as many).
                n_val = int(np.ceil(params["validation_fraction"] * data.rows))
                if n_val == 0 or n_val == data.rows:
                    raise ValueError(
                        f"Splitting {data.rows} samples into a train set and a validation set with "
                        f"validation_fraction={params['validation_fraction']!r} led to an empty set "
                        f"({data.rows - n_val} and {n_val} samples). Please either change validation_fraction, "
                        "increase number of samples, or disable early_stopping."
                    )
            w = None
            if sample_weight is not None:
                w = _check_sample_weight(sample_weight, np.empty((data.rows, 0)), dtype=np.float64)
            with _base.vector_of(self, codes, dtype=np.float32, what="y") as ys, \
                    _base.vector_of(self, w, dtype=np.float64) as ws:
                out = _core.sgd_fit(settings, data.path, ys.path, None if w is None else ws.path,
                                    params, warm)
        d = data.cols
        coef = np.frombuffer(out["coef"], dtype="<f8").reshape(-1, d).copy()
        self._state = {k: out[k] for k in ("q", "u", "eta", "w", "b", "aw", "ab")}
        self._keep_average(d)
        self.t_ = float(out["t"])
        self.n_iter_ = int(out["n_iter"])
        self.stats_ = json.loads(out["stats"])
        if params["tol"] is not None and not out["converged"] and params["max_iter"] > 1:
            warnings.warn(
                "Maximum number of iteration reached before convergence. Consider increasing "
                "max_iter to improve the fit.", ConvergenceWarning,
            )
        return coef, np.asarray(out["intercept"], dtype=np.float64)

    def _keep_average(self, d):
        """scikit-learn's private ``_standard_coef``, ``_average_coef`` and
        their intercepts, present exactly when ``average`` is on."""
        names = ("_standard_coef", "_standard_intercept", "_average_coef", "_average_intercept")
        if not self.average:
            for n in names:
                self.__dict__.pop(n, None)
            return
        st = self._state
        shape = (-1,) if isinstance(self, RegressorMixin) else (-1, d)
        for n, (w, b) in zip(names[::2], ((st["w"], st["b"]), (st["aw"], st["ab"]))):
            setattr(self, n, np.frombuffer(w, dtype="<f8").reshape(shape).copy())
            setattr(self, n.replace("coef", "intercept"), np.asarray(b, dtype=np.float64))

    def _warm(self, coef_init, intercept_init, models, d):
        """The model to go on from: given, kept (``warm_start``), or none."""
        if coef_init is None and intercept_init is None:
            if not (self.warm_start and hasattr(self, "coef_")):
                return None
            coef_init, intercept_init = self.coef_, self.intercept_
        coef = np.zeros((models, d)) if coef_init is None else np.asarray(coef_init, dtype=np.float64)
        b = np.zeros(models) if intercept_init is None else np.asarray(intercept_init, dtype=np.float64)
        # scikit-learn's shapes: (models, d) with several models, else d
        # values in any shape, and one intercept or a scalar.
        if coef.size != models * d or (models > 1 and coef.shape != (models, d)):
            raise ValueError("Provided coef_init does not match dataset.")
        if b.size != models or (models > 1 and b.shape != (models,)):
            raise ValueError("Provided intercept_init does not match dataset.")
        coef, b = coef.reshape(models, d), b.reshape(models)
        # As scikit-learn's fit: the averages start again from zeros.
        return {"coef": coef.tobytes(), "intercept": [float(v) for v in b], "q": b"", "u": 0.0,
                "t": 1.0, "eta": float(self.eta0), "aw": b"", "ab": []}

    def _carried(self):
        """The model after the last fit, for ``partial_fit``: with
        ``average``, the last weights (``coef_`` may be their mean) and the
        running means."""
        s = self._state
        if self.average:
            coef, b = s["w"], list(s["b"])
        else:
            coef = np.ascontiguousarray(np.atleast_2d(self.coef_), dtype=np.float64).tobytes()
            b = [float(v) for v in np.atleast_1d(self.intercept_)]
        return {"coef": coef, "intercept": b, "q": s["q"], "u": s["u"], "t": self.t_, "eta": s["eta"],
                "aw": s["aw"], "ab": list(s["ab"])}

    def _decision(self, X):
        check_is_fitted(self)
        if not _data.is_file_input(X):
            X = _base.validate_data(self, X, dtype=[np.float64, np.float32], reset=False,
                                    ensure_all_finite=False)
        coef = np.atleast_2d(self.coef_)
        return _base.apply_rows(self, X, "affine", coef, np.atleast_1d(self.intercept_), dtype=np.float64)


_PARAMS_DOC = """
    penalty : {"l2", "l1", "elasticnet", None}, default="l2"
    alpha : float, default=0.0001
        Strength of the penalty (and the optimal schedule's rate).
    l1_ratio : float, default=0.15
        The elastic net's L1 share.
    fit_intercept : bool, default=True
    max_iter : int, default=1000
        Epochs at most.
    tol : float or None, default=1e-3
        Stop when ``n_iter_no_change`` epochs in a row improve the
        objective (or the held-out score) by less than this.
    shuffle : bool, default=True
        Shuffle the rows each epoch: the order of blocks of 4,096 rows and
        of the rows in each (the engine's unit of work).
    random_state : int, RandomState instance or None, default=None
    learning_rate : {"constant", "optimal", "invscaling", "adaptive"}
    eta0, power_t : float
        The schedules' initial rate and invscaling's exponent.
    early_stopping : bool, default=False
        Stop on the score of ``validation_fraction`` of the rows, held out.
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=5
    warm_start : bool, default=False
    average : bool or int, default=False
        Averaged SGD: ``coef_`` and ``intercept_`` are the mean of the
        weights over the updates from the ``average``-th on (``True``: all),
        once there has been one.
    epsilon : float, default=0.1
        Huber's and the epsilon-insensitive losses' epsilon."""


class SGDClassifier(ClassifierMixin, _SGD):
    """Linear classifiers by SGD, under a memory cap: scikit-learn's
    ``SGDClassifier``, the rows held by the engine (spilled to disk over
    the cap) and the model updated row by row in an order fixed by
    ``random_state``, whatever the cap.

    Parameters
    ----------
    loss : {"hinge", "log_loss", "modified_huber", "squared_hinge", "perceptron"}, default="hinge"
    PARAMS
    class_weight : dict, "balanced" or None, default=None
    ENGINE
    max_ranks : None, "auto" or int, default=None
        As :class:`outcore.KMeans`: grow onto free MPI slots under
        ``mpirun`` when the data does not fit the ranks' caps.
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_iter_ : int
    t_ : float
    n_features_in_ : int
    stats_ : dict
    """

    def __init__(self, loss="hinge", *, penalty="l2", alpha=0.0001, l1_ratio=0.15, fit_intercept=True,
                 max_iter=1000, tol=1e-3, shuffle=True, verbose=0, epsilon=0.1, n_jobs=None,
                 random_state=None, learning_rate="optimal", eta0=0.0, power_t=0.5, early_stopping=False,
                 validation_fraction=0.1, n_iter_no_change=5, class_weight=None, warm_start=False,
                 average=False, mem_cap=None, spill_dir=None, timeline=None,
                 max_ranks=None):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.epsilon = epsilon
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.class_weight = class_weight
        self.warm_start = warm_start
        self.average = average
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.timeline = timeline
        self.max_ranks = max_ranks

    def _codes(self, X, y, reset):
        if _data.is_file_input(X):
            y = np.asarray(y)
        else:
            X, y = _base.validate_data(self, X, y, dtype=[np.float64, np.float32], reset=reset,
                                       ensure_all_finite=False)
        check_classification_targets(y)
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D, not of shape {y.shape}")
        return X, y

    def _class_weights(self, y):
        if self.class_weight is None:
            return []
        return compute_class_weight(self.class_weight, classes=self.classes_, y=y)

    def _fit_codes(self, X, y, sample_weight, max_iter, warm, reset, early_stopping):
        codes = np.searchsorted(self.classes_, y)
        if (codes >= len(self.classes_)).any() or (self.classes_[np.minimum(codes, len(self.classes_) - 1)] != y).any():
            raise ValueError("y has labels not in classes_")
        params = self._params(len(self.classes_), max_iter, self._class_weights(y), early_stopping)
        coef, b = self._run(X, codes, sample_weight, params, warm, reset)
        self.coef_, self.intercept_ = coef, b
        return self

    def fit(self, X, y, coef_init=None, intercept_init=None, sample_weight=None):
        """Fit the model by SGD.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
        y : ndarray of shape (n_samples,)
        coef_init, intercept_init : arrays, default=None
            The model to start from.
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        self._check_params(_CLASSIFY + _REGRESS)
        X, y = self._codes(X, y, reset=True)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(
                f"The number of classes has to be greater than one; got {len(self.classes_)} class"
            )
        models = 1 if len(self.classes_) == 2 else len(self.classes_)
        warm = self._warm(coef_init, intercept_init, models, _width(X))
        return self._fit_codes(X, y, sample_weight, self.max_iter, warm, True, bool(self.early_stopping))

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One epoch of SGD over ``X``, going on from the model so far: the
        same model as one epoch over all the chunks together when
        ``shuffle=False``.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
        y : ndarray of shape (n_samples,)
        classes : array of shape (n_classes,), default=None
            Every class; needed on the first call.
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        self._check_params(_CLASSIFY + _REGRESS, partial=True)
        if self.class_weight == "balanced":
            raise ValueError(
                "class_weight 'balanced' is not supported for partial_fit. In order to use 'balanced' weights, "
                "use compute_class_weight('balanced', classes=classes, y=y). In place of y you can use a large "
                "enough sample of the full training set target to properly estimate the class frequency "
                "distributions. Pass the resulting weights as the class_weight parameter."
            )
        first = not hasattr(self, "classes_")
        if first:
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            self.classes_ = np.unique(classes)
            if len(self.classes_) < 2:
                raise ValueError("The number of classes has to be greater than one")
        elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError(
                f"`classes={np.unique(classes)!r}` is not the same as on last call to "
                f"partial_fit, was: {self.classes_!r}"
            )
        X, y = self._codes(X, y, reset=first)
        warm = None if first else self._carried()
        return self._fit_codes(X, y, sample_weight, 1, warm, first, False)

    def decision_function(self, X):
        """Confidence scores: ``X @ coef_.T + intercept_``.

        Returns
        -------
        scores : ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        s = self._decision(X)
        return s.ravel() if s.shape[1] == 1 else s

    def predict(self, X):
        """The class of each sample."""
        s = self.decision_function(X)
        idx = (s > 0).astype(int) if s.ndim == 1 else s.argmax(axis=1)
        return self.classes_[idx]

    def _has_proba(self):
        if self.loss not in ("log_loss", "modified_huber"):
            raise AttributeError(f"probability estimates are not available for loss={self.loss!r}")
        return True

    @available_if(_has_proba)
    def predict_proba(self, X):
        """Probability estimates (log_loss: the logistic of the scores;
        modified_huber: clipped scores), normalised over the classes."""
        s = self.decision_function(X)
        if self.loss == "log_loss":
            p = expit(s)
        else:
            p = (np.clip(s, -1, 1) + 1) / 2
        if s.ndim == 1:
            return np.column_stack([1 - p, p])
        total = p.sum(axis=1, keepdims=True)
        uniform = total[:, 0] == 0
        p[uniform] = 1.0
        total[uniform] = p.shape[1]
        return p / total

    @available_if(_has_proba)
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`."""
        return np.log(self.predict_proba(X))


class SGDRegressor(RegressorMixin, _SGD):
    """Linear regression by SGD, under a memory cap: scikit-learn's
    ``SGDRegressor``, the rows held by the engine and the model updated
    row by row in an order fixed by ``random_state``, whatever the cap.

    Parameters
    ----------
    loss : {"squared_error", "huber", "epsilon_insensitive", "squared_epsilon_insensitive"}, default="squared_error"
    PARAMS
    ENGINE
    max_ranks : None, "auto" or int, default=None
        As :class:`outcore.KMeans`: grow onto free MPI slots under
        ``mpirun`` when the data does not fit the ranks' caps.
    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
    intercept_ : ndarray of shape (1,)
    n_iter_ : int
    t_ : float
    n_features_in_ : int
    stats_ : dict
    """

    def __init__(self, loss="squared_error", *, penalty="l2", alpha=0.0001, l1_ratio=0.15, fit_intercept=True,
                 max_iter=1000, tol=1e-3, shuffle=True, verbose=0, epsilon=0.1, random_state=None,
                 learning_rate="invscaling", eta0=0.01, power_t=0.25, early_stopping=False,
                 validation_fraction=0.1, n_iter_no_change=5, warm_start=False, average=False,
                 n_jobs=None, mem_cap=None, spill_dir=None, timeline=None,
                 max_ranks=None):
        self.loss = loss
        self.penalty = penalty
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.shuffle = shuffle
        self.verbose = verbose
        self.epsilon = epsilon
        self.random_state = random_state
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.power_t = power_t
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.warm_start = warm_start
        self.average = average
        self.n_jobs = n_jobs
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.timeline = timeline
        self.max_ranks = max_ranks

    def _targets(self, X, y, reset):
        if _data.is_file_input(X):
            y = np.asarray(y, dtype=np.float64)
        else:
            X, y = _base.validate_data(self, X, y, dtype=[np.float64, np.float32], y_numeric=True,
                                       reset=reset, ensure_all_finite=False)
            y = np.asarray(y, dtype=np.float64)
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D, not of shape {y.shape}")
        if not np.isfinite(y).all():
            raise ValueError("Input y contains NaN or infinity.")
        return X, y

    def _fit_targets(self, X, y, sample_weight, max_iter, warm, reset, early_stopping):
        params = self._params(0, max_iter, [], early_stopping)
        coef, b = self._run(X, y, sample_weight, params, warm, reset)
        self.coef_, self.intercept_ = coef[0], b
        return self

    def fit(self, X, y, coef_init=None, intercept_init=None, sample_weight=None):
        """Fit the model by SGD.

        Returns
        -------
        self : object
        """
        self._check_params(_REGRESS)
        X, y = self._targets(X, y, reset=True)
        warm = self._warm(coef_init, intercept_init, 1, _width(X))
        return self._fit_targets(X, y, sample_weight, self.max_iter, warm, True, bool(self.early_stopping))

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch of SGD over ``X``, going on from the model so far.

        Returns
        -------
        self : object
        """
        self._check_params(_REGRESS, partial=True)
        first = not hasattr(self, "coef_")
        X, y = self._targets(X, y, reset=first)
        warm = None if first else self._carried()
        return self._fit_targets(X, y, sample_weight, 1, warm, first, False)

    def predict(self, X):
        """Predict using the linear model."""
        return self._decision(X)[:, 0]


for _cls in (SGDClassifier, SGDRegressor):
    _cls.__doc__ = _cls.__doc__.replace("    PARAMS\n", _PARAMS_DOC.lstrip("\n") + "\n").replace(
        "    ENGINE\n", _ENGINE_DOC.lstrip("\n") + "\n")
