"""Principal component analysis that runs under a memory cap."""
import json
import numbers

import numpy as np
from scipy import linalg
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_array, check_is_fitted

from . import _base, _core, _data
from ._kmeans import _ENGINE_DOC, _seed


def _infer_dimension(spectrum, n_samples):
    """The number of components by Minka's MLE (Minka, "Automatic choice
    of dimensionality for PCA", NIPS 2000), as scikit-learn's
    ``n_components="mle"``: the rank whose log-likelihood is largest."""
    from math import lgamma, log

    n_features = len(spectrum)
    eps = 1e-15
    best, best_ll = 0, -np.inf
    for rank in range(1, n_features):
        if spectrum[rank - 1] < eps:
            continue
        pu = -rank * log(2.0)
        for i in range(1, rank + 1):
            pu += lgamma((n_features - i + 1) / 2.0) - log(np.pi) * (n_features - i + 1) / 2.0
        pl = np.sum(np.log(spectrum[:rank]))
        pl = -pl * n_samples / 2.0
        v = max(eps, np.sum(spectrum[rank:]) / (n_features - rank))
        pv = -np.log(v) * n_samples * (n_features - rank) / 2.0
        m = n_features * rank - rank * (rank + 1.0) / 2.0
        pp = log(2.0 * np.pi) * (m + rank) / 2.0
        pa = 0.0
        spectrum_ = spectrum.copy()
        spectrum_[rank:n_features] = v
        for i in range(rank):
            for j in range(i + 1, len(spectrum)):
                pa += log((spectrum[i] - spectrum[j]) * (1.0 / spectrum_[j] - 1.0 / spectrum_[i])) + log(n_samples)
        ll = pu + pl + pv + pp - pa / 2.0 - rank * log(n_samples) / 2.0
        if ll > best_ll:
            best, best_ll = rank, ll
    return best


class PCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Principal component analysis that runs under a memory cap.

    The engine reads the data in two passes (the column means, then the
    Gram matrix of the centred data, summed in float64 in a fixed order:
    the same result under any cap) and takes the covariance's
    eigenvectors: scikit-learn's ``svd_solver="covariance_eigh"``, whose
    results the other exact solvers match. Each component's sign makes
    its largest entry in absolute value positive, as scikit-learn's.

    Parameters
    ----------
    n_components : int, float, "mle" or None, default=None
        Components to keep: all (``min(n_samples, n_features)``) for None;
        a count; a share of the variance in (0, 1) (the fewest components
        explaining more); or "mle" (Minka's estimate).
    copy : bool, default=True
        Kept for compatibility: the engine never changes X.
    whiten : bool, default=False
        Scale the transformed components to unit variance.
    svd_solver : {"auto", "full", "covariance_eigh", "arpack", "randomized"}, default="auto"
        "randomized": subspace iteration on the covariance over passes of
        the data (Halko et al.), for an int ``n_components``; the others
        compute the exact decomposition of the covariance. "auto" picks as
        scikit-learn's does (``_fit_svd_solver``): the covariance for tall
        data (at most 1,000 features and 10 times as many samples),
        randomized for a count under 80% of the smaller dimension on
        larger data, else the exact one.
    iterated_power : int or "auto", default="auto"
        Randomized: power iterations as scikit-learn counts them ("auto": 7
        when ``n_components`` is under a tenth of the smaller dimension,
        else 4), each a pass over the data, plus two.
    n_oversamples : int, default=10
        Randomized: directions beyond ``n_components``.
    random_state : int, RandomState instance or None, default=None
        Randomized: the starting subspace.
    tol, power_iteration_normalizer :
        Kept for compatibility (the power passes orthonormalise by
        Gram-Schmidt).
    ENGINE
    max_ranks : None, "auto" or int, default=None
        As :class:`outcore.KMeans`: grow onto free MPI slots under
        ``mpirun`` when the data does not fit the ranks' caps.
    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
    explained_variance_ : ndarray of shape (n_components,)
    explained_variance_ratio_ : ndarray of shape (n_components,)
    singular_values_ : ndarray of shape (n_components,)
    mean_ : ndarray of shape (n_features,)
    n_components_ : int
    n_samples_ : int
    noise_variance_ : float
    n_features_in_ : int
    stats_ : dict
        What the engine did (the command line's --stats).
    """

    _SOLVERS = ("auto", "full", "covariance_eigh", "arpack", "randomized")

    def __init__(self, n_components=None, *, copy=True, whiten=False, svd_solver="auto", tol=0.0,
                 iterated_power="auto", n_oversamples=10, power_iteration_normalizer="auto",
                 random_state=None, n_jobs=None, verbose=0, mem_cap=None, spill_dir=None, timeline=None,
                 max_ranks=None):
        self.n_components = n_components
        self.copy = copy
        self.whiten = whiten
        self.svd_solver = svd_solver
        self.tol = tol
        self.iterated_power = iterated_power
        self.n_oversamples = n_oversamples
        self.power_iteration_normalizer = power_iteration_normalizer
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.timeline = timeline
        self.max_ranks = max_ranks

    def _solver(self, rows, cols):
        """The solver scikit-learn's PCA would pick (``_fit_svd_solver``):
        "randomized" runs the engine's randomized solver, the others its
        exact decomposition of the covariance (the same components)."""
        if self.svd_solver != "auto":
            return self.svd_solver
        k = self.n_components
        if cols <= 1000 and rows >= 10 * cols:
            return "covariance_eigh"
        if max(rows, cols) <= 500 or k == "mle":
            return "full"
        count = isinstance(k, numbers.Integral) and not isinstance(k, bool)
        if count and 1 <= k < 0.8 * min(rows, cols):
            return "randomized"
        return "full"

    def _components_spec(self, rows, cols, solver):
        """The engine's (count, share) from ``n_components``, with
        scikit-learn's rules for ``solver``."""
        k = self.n_components
        most = min(rows, cols)
        if k is None and solver == "arpack":
            # scikit-learn's arpack keeps one component fewer.
            k = most - 1
        if k is None or k == "mle":
            if k == "mle" and rows < cols:
                raise ValueError("n_components='mle' is only supported if n_samples >= n_features")
            return None, None
        if isinstance(k, numbers.Integral) and not isinstance(k, bool):
            if not 1 <= k <= most:
                raise ValueError(
                    f"n_components={k} must be between 1 and min(n_samples, n_features)={most} "
                    f"with svd_solver='{solver}'"
                )
            if solver == "arpack" and k == most:
                raise ValueError(
                    f"n_components={k} must be strictly less than min(n_samples, n_features)={most} "
                    "with svd_solver='arpack'"
                )
            return int(k), None
        if isinstance(k, numbers.Real) and not isinstance(k, bool) and 0 < k < 1:
            return None, float(k)
        raise ValueError(f"n_components must be None, 'mle', an int >= 1 or a float in (0, 1), not {k!r}")

    def _randomized(self, count, rows, cols, solver):
        """The engine's randomized settings for ``solver`` "randomized" and
        a count of components, or None for the exact solver."""
        if count is None or solver != "randomized":
            return None
        it = self.iterated_power
        if it == "auto":
            it = 7 if count < 0.1 * min(rows, cols) else 4
        elif not isinstance(it, numbers.Integral) or it < 0:
            raise ValueError(f"iterated_power must be an int >= 0 or 'auto', not {it!r}")
        over = self.n_oversamples
        if not isinstance(over, numbers.Integral) or over < 1:
            raise ValueError(f"n_oversamples must be an int >= 1, not {over!r}")
        return (int(over), int(it), _seed(self.random_state))

    def fit(self, X, y=None):
        """Fit the model with X.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
        y : Ignored

        Returns
        -------
        self : object
        """
        if self.svd_solver not in self._SOLVERS:
            raise ValueError(f"svd_solver must be one of {self._SOLVERS}, not {self.svd_solver!r}")
        settings = _base.settings(self)
        dtype = _data.model_dtype(X)
        with _base.fit_data(self, X, dtype=[np.float64, np.float32]) as data:
            if data.rows < 2:
                raise ValueError(f"n_samples={data.rows}: PCA needs at least 2 samples")
            solver = self._solver(data.rows, data.cols)
            count, share = self._components_spec(data.rows, data.cols, solver)
            out = _core.pca_fit(settings, data.path, count, share, False,
                                self._randomized(count, data.rows, data.cols, solver))
        d = data.cols
        k = int(out["n_components"])
        comps = np.frombuffer(out["components"], dtype="<f8").reshape(k, d).copy()
        var = np.asarray(out["explained_variance"], dtype=np.float64)
        ratio = np.asarray(out["explained_variance_ratio"], dtype=np.float64)
        sv = np.asarray(out["singular_values"], dtype=np.float64)
        noise = float(out["noise_variance"])
        if self.n_components == "mle":
            k = _infer_dimension(var, data.rows)
            noise = float(var[k:].mean()) if k < len(var) else 0.0
            comps, var, ratio, sv = comps[:k], var[:k], ratio[:k], sv[:k]
        # float32 data: a float32 model, as scikit-learn's.
        self.components_ = comps.astype(dtype, copy=False)
        self.explained_variance_ = var.astype(dtype, copy=False)
        self.explained_variance_ratio_ = ratio.astype(dtype, copy=False)
        self.singular_values_ = sv.astype(dtype, copy=False)
        self.mean_ = np.asarray(out["mean"], dtype=np.float64).astype(dtype, copy=False)
        self.n_components_ = k
        self.n_samples_ = data.rows
        self.noise_variance_ = noise
        self.stats_ = json.loads(out["stats"])
        self._fit_svd_solver = solver
        return self

    def fit_transform(self, X, y=None):
        """Fit the model with X and apply the dimensionality reduction on X.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components)
        """
        return self.fit(X).transform(X)

    def transform(self, X):
        """Project X on the components (block by block for a file or memmap).

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components)
        """
        check_is_fitted(self)
        if not _data.is_file_input(X):
            X = _base.validate_data(self, X, dtype=[np.float64, np.float32], reset=False,
                                    ensure_all_finite=False)
        scale = None
        if self.whiten:
            # Components of (near) zero variance: no infinities.
            scale = np.maximum(np.sqrt(self.explained_variance_), np.finfo(np.float64).eps)
        dtype = np.result_type(_data.model_dtype(X), self.components_.dtype)
        if self.n_components_ == 0:
            rows = _base.new_data(self, X)[0].rows if _data.is_file_input(X) else len(X)
            return np.empty((rows, 0), dtype=dtype)
        # As scikit-learn's: X @ C.T - mean @ C.T (divided by the
        # deviations when whitening), in one pass.
        comps = self.components_ if scale is None else self.components_ / scale[:, None]
        shift = -(self.mean_ @ comps.T)
        out = _base.apply_rows(self, X, "affine", comps, shift, dtype=np.float64)
        return out.astype(dtype, copy=False)

    def inverse_transform(self, X):
        """Data back in the original space (whitening undone).

        Returns
        -------
        X_original : ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self)
        X = check_array(X, input_name="X", dtype=[np.float64, np.float32])
        return X @ self._scaled_components() + self.mean_

    def _scaled_components(self):
        """The components, scaled by their deviations when whitening."""
        if self.whiten:
            return np.sqrt(self.explained_variance_)[:, None] * self.components_
        return self.components_

    def _variance_over_noise(self):
        d = self.explained_variance_ - self.noise_variance_
        return np.where(self.explained_variance_ > self.noise_variance_, d, 0.0)

    def get_covariance(self):
        """The data's covariance under the model: ``components_.T @
        diag(explained_variance_ - noise) @ components_ + noise * I``."""
        check_is_fitted(self)
        comps = self._scaled_components()
        cov = (comps.T * self._variance_over_noise()) @ comps
        cov.flat[:: len(cov) + 1] += self.noise_variance_
        return cov

    def get_precision(self):
        """The inverse of :meth:`get_covariance` (by the matrix inversion
        lemma when there is noise)."""
        check_is_fitted(self)
        noise = self.noise_variance_
        if self.n_components_ == 0:
            return np.eye(self.components_.shape[1]) / noise
        if noise == 0.0:
            return linalg.inv(self.get_covariance())
        comps = self._scaled_components()
        inner = comps @ comps.T / noise
        with np.errstate(divide="ignore"):
            inner.flat[:: len(inner) + 1] += 1.0 / self._variance_over_noise()
        precision = comps.T @ linalg.inv(inner) @ comps
        precision /= -(noise**2)
        precision.flat[:: len(precision) + 1] += 1.0 / noise
        return precision

    def score_samples(self, X):
        """The log-likelihood of each sample under the model."""
        check_is_fitted(self)
        X = _base.validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        Xr = X - self.mean_
        n_features = X.shape[1]
        precision = self.get_precision()
        log_like = -0.5 * (Xr * (Xr @ precision)).sum(axis=1)
        log_like -= 0.5 * (n_features * np.log(2.0 * np.pi) - np.linalg.slogdet(precision)[1])
        return log_like

    def score(self, X, y=None):
        """The average log-likelihood of the samples."""
        return float(np.mean(self.score_samples(X)))

    @property
    def _n_features_out(self):
        return self.components_.shape[0]


PCA.__doc__ = PCA.__doc__.replace("    ENGINE\n", _ENGINE_DOC.lstrip("\n") + "\n")


class IncrementalPCA(PCA):
    """Incremental principal component analysis that runs under a memory cap.

    ``fit`` reads the data through the engine in two passes, as
    :class:`PCA`; ``partial_fit`` adds a batch. Both keep the exact
    moments of every row seen (the count, the means and the Gram matrix of
    the centred rows, merged batch by batch in float64), so the components
    are those of an exact PCA of all the rows seen, whatever the batches:
    scikit-learn's ``IncrementalPCA`` approximates them by an incremental
    SVD, to which these agree up to its approximation.

    Parameters
    ----------
    n_components : int or None, default=None
        Components to keep; None: ``min(n_samples_seen, n_features)``.
    whiten : bool, default=False
    copy : bool, default=True
        Kept for compatibility: the engine never changes X.
    batch_size : int or None, default=None
        Kept for scikit-learn's attribute ``batch_size_`` (``5 *
        n_features`` by default): ``fit`` reads the data whole through
        the engine, not in batches.
    ENGINE
    Attributes
    ----------
    components_, explained_variance_, explained_variance_ratio_,
    singular_values_, mean_, n_components_, noise_variance_ : as PCA's
    var_ : ndarray of shape (n_features,)
        Per-feature variance of the rows seen.
    n_samples_seen_ : int
    batch_size_ : int
    """

    def __init__(self, n_components=None, *, whiten=False, copy=True, batch_size=None, n_jobs=None,
                 verbose=0, mem_cap=None, spill_dir=None, timeline=None):
        self.n_components = n_components
        self.whiten = whiten
        self.copy = copy
        self.batch_size = batch_size
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.timeline = timeline

    def _check_components(self, n_features):
        k = self.n_components
        if k is None:
            return
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise ValueError(f"n_components must be an int or None, not {k!r}")
        if not 1 <= k <= n_features:
            raise ValueError(
                f"n_components={k!r} invalid for n_features={n_features}, need more rows than "
                "n_components or fewer components"
            )

    def fit(self, X, y=None):
        """Fit the model with X, through the engine (exactly).

        Returns
        -------
        self : object
        """
        settings = _base.settings(self)
        with _base.fit_data(self, X, dtype=[np.float64, np.float32]) as data:
            if data.rows < 2:
                raise ValueError(f"n_samples={data.rows}: IncrementalPCA needs at least 2 samples")
            self._check_components(data.cols)
            if self.n_components is not None and self.n_components > data.rows:
                raise ValueError(
                    f"n_components={self.n_components} must be less or equal to the batch number "
                    f"of samples {data.rows}."
                )
            out = _core.pca_fit(settings, data.path, None, None, True)
        d = data.cols
        self.stats_ = json.loads(out["stats"])
        self.batch_size_ = self.batch_size or 5 * d
        gram = np.frombuffer(out["gram"], dtype="<f8").reshape(d, d).copy()
        self._moments = (int(out["rows"]), np.asarray(out["mean"], dtype=np.float64), gram)
        self._decompose()
        return self

    def partial_fit(self, X, y=None, check_input=True):
        """Add a batch of rows (held in memory) to the moments and decompose.

        Returns
        -------
        self : object
        """
        first = not hasattr(self, "_moments")
        if check_input:
            X = _base.validate_data(self, X, dtype=[np.float64, np.float32], reset=first)
        X = np.asarray(X, dtype=np.float64)
        n_b, d = X.shape
        self._check_components(d)
        # Only the first batch (scikit-learn's rule): the moments are exact,
        # so a later batch may be of any size.
        if first and self.n_components is not None and self.n_components > n_b:
            raise ValueError(
                f"n_components={self.n_components} must be less or equal to the batch number of "
                f"samples {n_b}."
            )
        if not np.isfinite(X).all():
            raise ValueError("Input X contains NaN or infinity.")
        mean_b = X.mean(axis=0)
        Xc = X - mean_b
        gram_b = Xc.T @ Xc
        if first:
            self._moments = (n_b, mean_b, gram_b)
            self.batch_size_ = self.batch_size or 5 * d
        else:
            n_a, mean_a, gram_a = self._moments
            n = n_a + n_b
            delta = mean_b - mean_a
            mean = mean_a + delta * (n_b / n)
            gram = gram_a + gram_b + np.outer(delta, delta) * (n_a * n_b / n)
            self._moments = (n, mean, gram)
        self._decompose()
        return self

    def _decompose(self):
        n, mean, gram = self._moments
        d = len(mean)
        if n < 2:
            raise ValueError("IncrementalPCA needs at least 2 samples seen")
        vals, vecs = np.linalg.eigh(gram / (n - 1))
        vals, vecs = np.maximum(vals[::-1], 0.0), vecs[:, ::-1].T
        most = min(n, d)
        vals, vecs = vals[:most], vecs[:most]
        k = most if self.n_components is None else self.n_components
        signs = np.sign(vecs[np.arange(len(vecs)), np.abs(vecs).argmax(axis=1)])
        vecs = vecs * np.where(signs == 0, 1.0, signs)[:, None]
        total = vals.sum()
        self.components_ = vecs[:k]
        self.explained_variance_ = vals[:k]
        self.explained_variance_ratio_ = vals[:k] / total if total > 0 else np.zeros(k)
        self.singular_values_ = np.sqrt(vals[:k] * (n - 1))
        self.mean_ = mean
        self.var_ = np.diag(gram) / n
        self.n_components_ = k
        self.n_samples_seen_ = n
        self.n_samples_ = n
        self.noise_variance_ = float(vals[k:].mean()) if k < most else 0.0


IncrementalPCA.__doc__ = IncrementalPCA.__doc__.replace("    ENGINE\n", _ENGINE_DOC.lstrip("\n") + "\n")
