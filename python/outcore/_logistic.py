"""Logistic regression (L-BFGS) that runs under a memory cap."""
import json
import numbers
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

from . import _base, _core, _data
from ._kmeans import _ENGINE_DOC


_SOLVERS = ("lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga")


def _not_converged(solver, n_iter, max_iter):
    """scikit-learn's warning when ``solver`` reaches ``max_iter``, and what ran."""
    first = {
        "lbfgs": f"lbfgs failed to converge after {n_iter} iteration(s) (status=1): "
                 "STOP: TOTAL NO. OF ITERATIONS REACHED LIMIT.",
        "newton-cg": f"newton-cg failed to converge after {n_iter} iteration(s). "
                     "Increase the number of iterations.",
        "liblinear": "Liblinear failed to converge, increase the number of iterations.",
        "sag": "The max_iter was reached which means the coef_ did not converge.",
        "saga": "The max_iter was reached which means the coef_ did not converge.",
        "newton-cholesky": f"Newton solver did not converge after {n_iter} iterations.",
    }[solver]
    return (f"{first}\n\nIncrease the number of iterations to improve the convergence "
            f"(max_iter={max_iter}). outcore fits every solver's objective by L-BFGS "
            "(OWL-QN with an L1 penalty).")


class LogisticRegression(ClassifierMixin, BaseEstimator):
    """Logistic regression (L-BFGS or OWL-QN) that runs under a memory cap.

    Minimises ``C * sum(sample_weight * log-loss) + 0.5 * ||coef||^2`` (the
    intercepts are not penalised), as scikit-learn's ``LogisticRegression``:
    the multinomial model for three classes or more, the binary model for
    two. The data is split into shards that the engine evicts to disk and
    reads back as each pass needs them; sample and class weights are
    applied by the engine.

    Every ``solver`` scikit-learn names is accepted, with its rules on
    penalties, and runs L-BFGS on the same objective (OWL-QN with an L1
    share): the minimum is the same, the iterations differ.

    Parameters
    ----------
    penalty : {'l1', 'l2', 'elasticnet', None}, default='deprecated'
        Deprecated in scikit-learn 1.8; use ``l1_ratio`` and ``C``.
    C : float, default=1.0
        Inverse of regularization strength; ``np.inf`` for no penalty.
    l1_ratio : float, default=0.0
        The elastic-net mixing parameter: 0 is the L2 penalty, 1 the L1
        penalty (``solver='saga'`` or ``'liblinear'``, as scikit-learn).
    dual : bool, default=False
        Only with ``solver='liblinear'``, as scikit-learn; the primal is
        solved either way (the same minimum).
    tol : float, default=1e-4
        Stop when the largest component of the objective's gradient,
        divided by ``C * sum(sample_weight)``, is at most this.
    fit_intercept : bool, default=True
    intercept_scaling : float, default=1
        Accepted for ``solver='liblinear'``; the intercept is never
        penalised here.
    class_weight : dict or 'balanced', default=None
        Weights of the classes, multiplied into the sample weights.
    random_state : int, RandomState instance or None, default=None
        Accepted; the fit is deterministic.
    solver : str, default='lbfgs'
    max_iter : int, default=100
        Iterations of L-BFGS.
    warm_start : bool, default=False
        Start from the previous fit's ``coef_`` and ``intercept_``.
    ENGINE
    max_ranks : None, "auto" or int, default=None
        As :class:`outcore.KMeans`: grow onto free MPI slots under
        ``mpirun`` when the data does not fit the ranks' caps.
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The class labels (any type ``numpy.unique`` sorts).
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
    intercept_ : ndarray of shape (1,) or (n_classes,)
    n_iter_ : ndarray of shape (1,)
        Iterations run.
    n_features_in_ : int
    stats_ : dict
        What the engine did (the command line's --stats).
    """

    def __init__(self, penalty="deprecated", *, C=1.0, l1_ratio=0.0, dual=False, tol=1e-4,
                 fit_intercept=True, intercept_scaling=1, class_weight=None, random_state=None,
                 solver="lbfgs", max_iter=100, verbose=0, warm_start=False, n_jobs=None,
                 mem_cap=None, spill_dir=None, timeline=None, max_ranks=None):
        self.penalty = penalty
        self.C = C
        self.l1_ratio = l1_ratio
        self.dual = dual
        self.tol = tol
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.class_weight = class_weight
        self.random_state = random_state
        self.solver = solver
        self.max_iter = max_iter
        self.verbose = verbose
        self.warm_start = warm_start
        self.n_jobs = n_jobs
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.timeline = timeline
        self.max_ranks = max_ranks

    def _penalty(self):
        """The penalty as scikit-learn resolves ``penalty``, ``l1_ratio`` and
        ``C`` (with its warnings and errors)."""
        l1 = self.l1_ratio
        if l1 is not None and not (isinstance(l1, numbers.Real) and 0 <= l1 <= 1):
            raise ValueError(f"The 'l1_ratio' parameter of LogisticRegression must be a float in the range [0, 1] or None. Got {l1!r} instead.")
        if self.penalty == "deprecated":
            if l1 == 0 or l1 is None:
                penalty = "l2"
                if l1 is None:
                    warnings.warn("'l1_ratio=None' was deprecated in version 1.8 and will trigger an "
                                  "error in 1.10. Use 0<=l1_ratio<=1 instead.", FutureWarning)
            elif l1 == 1:
                penalty = "l1"
            else:
                penalty = "elasticnet"
            if self.C == np.inf:
                penalty = None
        else:
            if self.penalty not in ("l1", "l2", "elasticnet", None):
                raise ValueError(f"The 'penalty' parameter of LogisticRegression must be a str among "
                                 f"{{'l1', 'l2', 'elasticnet'}} or None. Got {self.penalty!r} instead.")
            penalty = self.penalty
            warnings.warn(
                "'penalty' was deprecated in version 1.8 and will be removed in 1.10. To avoid this "
                "warning, leave 'penalty' set to its default value and use 'l1_ratio' or 'C' instead. "
                "Use l1_ratio=0 instead of penalty='l2', l1_ratio=1 instead of penalty='l1', l1_ratio "
                "set to a float between 0 and 1 instead of penalty='elasticnet', and C=np.inf instead "
                "of penalty=None.", FutureWarning)
        solver = self.solver
        if solver not in _SOLVERS:
            raise ValueError(f"The 'solver' parameter of LogisticRegression must be a str among "
                             f"{{{', '.join(repr(s) for s in sorted(_SOLVERS))}}}. Got {solver!r} instead.")
        if solver not in ("liblinear", "saga") and penalty not in ("l2", None):
            raise ValueError(f"Solver {solver} supports only 'l2' or None penalties, got {penalty} penalty.")
        if solver != "liblinear" and self.dual:
            raise ValueError(f"Solver {solver} supports only dual=False, got dual={self.dual}")
        if penalty == "elasticnet" and solver != "saga":
            raise ValueError(f"Only 'saga' solver supports elasticnet penalty, got solver={solver}.")
        if solver == "liblinear" and penalty is None:
            raise ValueError("C=np.inf as well as penalty=None is not supported for the liblinear solver")
        if penalty != "elasticnet" and l1 is not None and 0 < l1 < 1:
            warnings.warn(f"l1_ratio parameter is only used when penalty is 'elasticnet'. Got (penalty={penalty})")
        if (self.penalty == "l2" and l1 != 0) or (self.penalty == "l1" and l1 != 1):
            warnings.warn(f"Inconsistent values: penalty={self.penalty} with l1_ratio={l1}. penalty is "
                          f"deprecated. Please use l1_ratio only.")
        if penalty == "elasticnet" and l1 is None:
            raise ValueError("l1_ratio must be specified when penalty is elasticnet.")
        if self.penalty is None:
            if self.C != 1.0:
                warnings.warn("Setting penalty=None will ignore the C and l1_ratio parameters")
            return None
        if self.C == np.inf:
            return None
        return penalty

    def _check_params(self):
        C, tol = self.C, self.tol
        if not (isinstance(C, numbers.Real) and not isinstance(C, bool) and C > 0):
            raise ValueError(f"The 'C' parameter of LogisticRegression must be a float in the range (0.0, inf]. Got {C!r} instead.")
        if not (isinstance(tol, numbers.Real) and not isinstance(tol, bool) and tol >= 0):
            raise ValueError(f"The 'tol' parameter of LogisticRegression must be a float in the range [0.0, inf). Got {tol!r} instead.")
        mi = self.max_iter
        if not isinstance(mi, numbers.Integral) or isinstance(mi, bool) or mi < 0:
            raise ValueError(f"The 'max_iter' parameter of LogisticRegression must be an int in the range [0, inf). Got {mi!r} instead.")
        for name in ("fit_intercept", "dual", "warm_start"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"The '{name}' parameter of LogisticRegression must be an instance of 'bool'. Got {v!r} instead.")
        cw = self.class_weight
        if cw is not None and cw != "balanced" and not isinstance(cw, dict):
            raise ValueError(f"The 'class_weight' parameter of LogisticRegression must be an instance of 'dict', a str among {{'balanced'}} or None. Got {cw!r} instead.")
        return self._penalty()

    def _start(self, classes, d, dtype):
        """The warm start point: the previous fit's weights, as the engine's
        rows (float64), or None."""
        if not self.warm_start or getattr(self, "coef_", None) is None:
            return None
        rows = 1 if len(classes) == 2 else len(classes)
        coef = np.asarray(self.coef_, dtype=np.float64)
        if coef.shape != (rows, d):
            raise ValueError(
                f"Initialization coef is of shape {coef.shape}, expected shape ({rows}, {d}) "
                f"or ({rows}, {d + 1})"
            )
        b = np.asarray(self.intercept_, dtype=np.float64).reshape(rows) if self.fit_intercept else np.zeros(rows)
        return np.ascontiguousarray(np.column_stack([coef, b]), dtype="<f8").tobytes()

    def fit(self, X, y, sample_weight=None):
        """Fit the model to the training data.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
            Training data; a path or a memmap of a whole .npy is read by the
            engine from its file.
        y : array-like of shape (n_samples,)
            Target labels, of any type ``numpy.unique`` sorts.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sample (1 each by default).

        Returns
        -------
        self : object
        """
        penalty = self._check_params()
        settings = _base.settings(self)
        if _data.is_file_input(X):
            y = np.asarray(y)
            dtype = np.float64
        else:
            X, y = _base.validate_data(self, X, y, dtype=[np.float64, np.float32], ensure_all_finite=False)
            dtype = X.dtype
        check_classification_targets(y)
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D, not of shape {y.shape}")
        classes, codes = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(
                "This solver needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {classes[0]!r}"
            )
        if self.solver == "liblinear" and len(classes) > 2:
            raise ValueError(
                "The 'liblinear' solver does not support multiclass classification (n_classes >= 3). "
                "Either use another solver or wrap the estimator in a OneVsRestClassifier to keep "
                "applying a one-versus-rest scheme."
            )
        weights = self._weights(sample_weight, classes, y, codes)
        binary = len(classes) == 2
        with _base.fit_data(self, X) if _data.is_file_input(X) else _base.copy_of(self, X) as data:
            if len(codes) != data.rows:
                raise ValueError(f"Found input variables with inconsistent numbers of samples: [{data.rows}, {len(codes)}]")
            d = data.cols
            l1_ratio = {"l1": 1.0, "elasticnet": float(self.l1_ratio or 0.0)}.get(penalty, 0.0)
            params = dict(
                classes=len(classes), c=None if penalty is None else float(self.C), l1_ratio=l1_ratio,
                tol=float(self.tol),
                max_iter=int(self.max_iter), shards=8, fit_intercept=bool(self.fit_intercept),
                binary=binary, start=self._start(classes, d, dtype),
            )
            with _base.vector_of(self, codes, dtype=np.int32, what="y") as lab, \
                    _base.vector_of(self, weights) as sw:
                out = _core.logistic_fit(settings, data.path, lab.path,
                                         None if weights is None else sw.path, params)
        w = np.frombuffer(out["w"], dtype="<f8").reshape(-1, d + 1)
        out_dtype = np.float32 if dtype == np.float32 else np.float64
        self.classes_ = classes
        self.coef_ = w[:, :d].astype(out_dtype)
        self.intercept_ = w[:, d].astype(out_dtype)
        self.n_iter_ = np.array([int(out["n_iter"])], dtype=np.int32)
        self.stats_ = json.loads(out["stats"])
        if out["stop"] == "iteration limit reached" and self.max_iter > 0:
            warnings.warn(_not_converged(self.solver, int(out["n_iter"]), self.max_iter), ConvergenceWarning)
        return self

    def _weights(self, sample_weight, classes, y, codes):
        """Each row's weight: the sample weight times its class's weight;
        None when both are unset."""
        if sample_weight is None and self.class_weight is None:
            return None
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, np.empty((len(codes), 0)), dtype=np.float64)
        if self.class_weight is None:
            return sample_weight
        cw = compute_class_weight(self.class_weight, classes=classes, y=y, sample_weight=sample_weight)
        w = cw[codes]
        return w if sample_weight is None else sample_weight * w

    def decision_function(self, X):
        """Confidence scores: ``X @ coef_.T + intercept_``.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)

        Returns
        -------
        scores : ndarray of shape (n_samples,) or (n_samples, n_classes)
        """
        check_is_fitted(self)
        # In the precision of X and coef_ together, as scikit-learn's
        # product gives it (float32 for both float32).
        x32 = _data.dtype_of(X) == np.float32
        dtype = np.result_type(np.float32 if x32 else np.float64, self.coef_.dtype)
        s = _base.apply_rows(self, X, "affine", self.coef_, self.intercept_, dtype=dtype)
        return s.ravel() if s.shape[1] == 1 else s

    def predict_proba(self, X):
        """Probability estimates, one column per class in ``classes_``.

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
        """
        s = self.decision_function(X)
        if s.ndim == 1:
            p = 1 / (1 + np.exp(-s))
            return np.column_stack([1 - p, p])
        # In place, in the scores' memory (no copies of n x classes).
        s -= s.max(axis=1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=1, keepdims=True)
        return s

    def predict_log_proba(self, X):
        """Logarithm of the probability estimates."""
        return np.log(self.predict_proba(X))

    def predict(self, X):
        """Predict class labels for samples in X.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,)
        """
        s = self.decision_function(X)
        idx = (s > 0).astype(int) if s.ndim == 1 else s.argmax(axis=1)
        return self.classes_[idx]


LogisticRegression.__doc__ = LogisticRegression.__doc__.replace("    ENGINE\n", _ENGINE_DOC.lstrip("\n") + "\n")
