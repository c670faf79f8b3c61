"""Multinomial logistic regression (L-BFGS) that runs under a memory cap."""
import json
import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from . import _base, _core, _data
from ._kmeans import _ENGINE_DOC


class LogisticRegression(ClassifierMixin, BaseEstimator):
    """Logistic regression (L2, multinomial, L-BFGS) that runs under a memory cap.

    Minimises ``C * sum(log-loss) + 0.5 * ||coef||^2`` (the intercepts are
    not penalised), as scikit-learn's ``LogisticRegression`` with its
    defaults; with two classes, its binary model. The data is split into
    shards that the engine evicts to disk and reads back as each pass needs
    them.

    Parameters
    ----------
    C : float, default=1.0
        Inverse of regularization strength; must be a positive float.
    tol : float, default=1e-4
        Stop when the largest component of the objective's gradient,
        divided by ``C * n_samples``, is at most this.
    max_iter : int, default=100
        Iterations of L-BFGS.
    ENGINE
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

    def __init__(self, C=1.0, *, tol=1e-4, max_iter=100, verbose=0, mem_cap=None, spill_dir=None,
                 n_jobs=None, timeline=None):
        self.C = C
        self.tol = tol
        self.max_iter = max_iter
        self.verbose = verbose
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.n_jobs = n_jobs
        self.timeline = timeline

    def fit(self, X, y):
        """Fit the model to the training data.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
            Training data; a path or a memmap of a whole .npy is read by the
            engine from its file.
        y : array-like of shape (n_samples,)
            Target labels, of any type ``numpy.unique`` sorts.

        Returns
        -------
        self : object
        """
        C, tol = float(self.C), float(self.tol)
        if not (np.isfinite(C) and C > 0):
            raise ValueError(f"C must be a positive float, not {self.C!r}")
        if not (np.isfinite(tol) and tol >= 0):
            raise ValueError(f"tol must be a float >= 0, not {self.tol!r}")
        mi = self.max_iter
        if not isinstance(mi, numbers.Integral) or isinstance(mi, bool) or mi < 1:
            raise ValueError(f"max_iter must be an int >= 1, not {mi!r}")
        settings = _base.settings(self)
        if _data.is_file_input(X):
            y = np.asarray(y)
        else:
            X, y = _base.validate_data(self, X, y, dtype="numeric", ensure_all_finite=False)
        check_classification_targets(y)
        if y.ndim != 1:
            raise ValueError(f"y must be 1-D, not of shape {y.shape}")
        classes, codes = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(
                "This solver needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {classes[0]!r}"
            )
        with _base.fit_data(self, X) if _data.is_file_input(X) else _data.as_data(X, self.spill_dir) as data:
            if len(codes) != data.rows:
                raise ValueError(f"Found input variables with inconsistent numbers of samples: [{data.rows}, {len(codes)}]")
            with _data.vector(codes, self.spill_dir, dtype=np.int32, what="y") as lab:
                # Two classes: scikit-learn's binary model with C is the
                # two-row softmax with C / 2 (its rows end opposite).
                c = C / 2 if len(classes) == 2 else C
                out = _core.logistic_fit(settings, data.path, lab.path, len(classes), c, tol, int(mi), 8)
        d = data.cols
        w = np.frombuffer(out["w"], dtype="<f4").reshape(len(classes), d + 1).astype(np.float64)
        coef, b = w[:, :d], w[:, d]
        if len(classes) == 2:
            coef, b = coef[1:] - coef[:1], b[1:] - b[:1]
        self.classes_ = classes
        self.coef_ = coef
        self.intercept_ = b
        self.n_iter_ = np.array([int(out["n_iter"])])
        self.stats_ = json.loads(out["stats"])
        return self

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
        if not _data.is_file_input(X):
            X = _base.validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        out = []
        for b in _base.finite_blocks(self, X):
            out.append(b.astype(np.float64) @ self.coef_.T + self.intercept_)
        s = np.concatenate(out) if out else np.empty((0, len(self.coef_)))
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
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)

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
