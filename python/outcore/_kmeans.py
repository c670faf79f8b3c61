"""K-means (Lloyd) and mini-batch K-means that run under a memory cap."""
import json
import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

from . import _base, _core, _data

_ENGINE_DOC = """
    mem_cap : None, "auto", str or int, default=None
        Memory cap of the engine: None for no cap, "auto" for the machine's
        (or the cgroup's) memory, a size such as "1GiB", or bytes. Over it,
        parts of the data are evicted to disk and read back when needed.
    spill_dir : str or path-like, default=None
        Directory for the evicted data and for temporary copies of
        in-memory inputs (default: the system's temporary directory).
    n_jobs : int, default=None
        Worker threads; None for one per core, -1 for all cores.
    verbose : int, default=0
        Progress lines on standard error.
    timeline : str or path-like, default=None
        Write the engine's memory timeline (the command line's
        ``--timeline`` CSV) to this file.
"""


def _seed(random_state):
    """A 64-bit seed from ``random_state`` (None: fresh)."""
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _check_int(name, v, low):
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < low:
        raise ValueError(f"{name} must be an int >= {low}, not {v!r}")
    return int(v)


class _KMeansBase(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """Fit, predict, transform and score shared by both estimators."""

    _lloyd = True

    #: scikit-learn checks these estimators are expected to fail, and why
    #: (the same as for scikit-learn's own KMeans and MiniBatchKMeans).
    _expected_failed_checks = {
        "check_sample_weight_equivalence_on_dense_data": (
            "sample_weight is not equivalent to repeating samples: the k-means++ draw "
            "and the shards of rows depend on the number of rows"
        ),
    }

    def _init_params(self, n_features):
        """The engine's init setting and the number of runs."""
        init = self.init
        if isinstance(init, str):
            if init not in ("k-means++", "random"):
                raise ValueError(f"init must be 'k-means++', 'random' or an array of centres, not {init!r}")
            n_init = self.n_init
            if n_init == "auto":
                n_init = 1 if init == "k-means++" else (10 if self._lloyd else 3)
            return init, None, _check_int("n_init", n_init, 1)
        if callable(init):
            raise TypeError("init as a callable is not supported: give 'k-means++', 'random' or an array")
        c = np.asarray(init, dtype=np.float64)
        if c.shape != (self.n_clusters, n_features):
            raise ValueError(
                f"The shape of the initial centers {c.shape} does not match the number of "
                f"clusters {self.n_clusters} and features {n_features}"
            )
        if not np.isfinite(c).all():
            raise ValueError("init contains NaN or infinity")
        return "given", c.astype("<f4").tobytes(), 1

    def _fit(self, X, sample_weight, params):
        k = _check_int("n_clusters", self.n_clusters, 1)
        settings = _base.settings(self)
        dtype = _data.dtype_of(X)
        with _base.fit_data(self, X) as data:
            if k > data.rows:
                raise ValueError(f"n_samples={data.rows} should be >= n_clusters={k}.")
            init, centers, n_init = self._init_params(data.cols)
            if sample_weight is not None:
                sample_weight = _check_sample_weight(sample_weight, np.empty((data.rows, 0)), dtype=np.float64)
            params.update(
                k=k, init=init, centers=centers, n_init=n_init,
                seed=_seed(self.random_state), shards=8,
            )
            with _data.vector(sample_weight, self.spill_dir) as weights:
                path = None if sample_weight is None else weights.path
                out = _core.kmeans_fit(settings, data.path, path, params)
        out_dtype = np.float32 if dtype == np.float32 else np.float64
        c = np.frombuffer(out["centers"], dtype="<f4").reshape(k, -1)
        self.cluster_centers_ = c.astype(out_dtype)
        self.labels_ = np.frombuffer(out["labels"], dtype="<u4").astype(np.int32)
        self.inertia_ = float(out["inertia"])
        self.n_iter_ = int(out["n_iter"])
        self._n_features_out = k
        self.stats_ = json.loads(out["stats"])
        return out

    def _nearest(self, X):
        """Labels and squared distances of the nearest centres."""
        data, _ = _base.new_data(self, X)
        with data:
            labels, d2 = _core.kmeans_predict(
                _base.settings(self), data.path,
                np.ascontiguousarray(self.cluster_centers_, dtype="<f4").tobytes(),
                self.n_clusters,
            )
        return (np.frombuffer(labels, dtype="<u4").astype(np.int32), np.frombuffer(d2, dtype="<f4"))

    def predict(self, X):
        """Predict the closest cluster each sample in X belongs to.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
            New data; a path or memmap of a ``.npy`` is read from its file.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Index of the cluster each sample belongs to.
        """
        return self._nearest(X)[0]

    def fit_predict(self, X, y=None, sample_weight=None):
        """Compute cluster centers and predict the cluster index of each sample.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
            Training data.
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return self.fit(X, sample_weight=sample_weight).labels_

    def transform(self, X):
        """Transform X to a cluster-distance space.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_clusters)
            Euclidean distances to each centre.
        """
        check_is_fitted(self)
        if not _data.is_file_input(X):
            X = _base.validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        out = []
        c = self.cluster_centers_.astype(np.float64)
        cn = (c * c).sum(axis=1)
        for b in _base.finite_blocks(self, X):
            b64 = b.astype(np.float64)
            d2 = (b64 * b64).sum(axis=1)[:, None] - 2 * b64 @ c.T + cn[None, :]
            out.append(np.sqrt(np.maximum(d2, 0)))
        res = np.concatenate(out) if out else np.empty((0, self.n_clusters))
        return res.astype(np.float32 if _data.dtype_of(X) == np.float32 else np.float64)

    def fit_transform(self, X, y=None, sample_weight=None):
        """Compute clustering and transform X to cluster-distance space."""
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the value of X on the K-means objective.

        Returns
        -------
        score : float
            Minus the (weighted) sum of squared distances to the nearest centre.
        """
        _, d2 = self._nearest(X)
        w = np.ones(len(d2)) if sample_weight is None else _check_sample_weight(sample_weight, np.empty((len(d2), 0)))
        return -float(np.dot(w, d2.astype(np.float64)))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags


class KMeans(_KMeansBase):
    """K-Means clustering (Lloyd's algorithm) that runs under a memory cap.

    The data is split into parts that the engine evicts to disk and reads
    back as the passes need them, so a fit works on data larger than
    memory. The results do not depend on the cap or on ``n_jobs``.

    Parameters
    ----------
    n_clusters : int, default=8
        The number of clusters to form.
    init : {"k-means++", "random"} or array-like of shape (n_clusters, n_features), default="k-means++"
        How the initial centres are chosen.
    n_init : "auto" or int, default="auto"
        Runs from different initial centres; the best (lowest inertia) is
        kept. "auto": 1 for "k-means++" and given centres, 10 for "random".
    max_iter : int, default=300
        Iterations of Lloyd's algorithm for one run.
    tol : float, default=1e-4
        Relative tolerance on the centres' shift (relative to the mean
        per-feature variance of the data) to declare convergence.
    random_state : int, RandomState instance or None, default=None
        Seed of the initialisation.
    ENGINE
    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
    labels_ : ndarray of shape (n_samples,)
    inertia_ : float
        Sum of squared distances of samples to their closest centre.
    n_iter_ : int
        Iterations run.
    n_features_in_ : int
    stats_ : dict
        What the engine did: evictions, loads, bytes read and written,
        peaks, seconds, per-iteration figures (the command line's --stats).

    Examples
    --------
    >>> import numpy as np, outcore
    >>> X = np.load("data.npy", mmap_mode="r")          # doctest: +SKIP
    >>> km = outcore.KMeans(n_clusters=100, mem_cap="1GiB").fit(X)  # doctest: +SKIP
    >>> km.cluster_centers_.shape                       # doctest: +SKIP
    (100, 64)
    """

    def __init__(self, n_clusters=8, *, init="k-means++", n_init="auto", max_iter=300, tol=1e-4,
                 verbose=0, random_state=None, mem_cap=None, spill_dir=None, n_jobs=None, timeline=None):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.n_jobs = n_jobs
        self.timeline = timeline

    def fit(self, X, y=None, sample_weight=None):
        """Compute k-means clustering.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
            Training data. A path (.npy, .npz, .fvecs) or a memmap of a
            whole .npy is read by the engine from its file.
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each sample.

        Returns
        -------
        self : object
        """
        tol = float(self.tol)
        if not np.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a float >= 0, not {self.tol!r}")
        params = dict(lloyd=True, max_iter=_check_int("max_iter", self.max_iter, 1), tol=tol,
                      batch_tasks=1, task_points=1100, max_no_improvement=None)
        self._fit(X, sample_weight, params)
        return self


class MiniBatchKMeans(_KMeansBase):
    """Mini-batch K-Means clustering that runs under a memory cap.

    Batches are drawn from fixed shards of the data, in an order that does
    not depend on the cap or on ``n_jobs``; the centres move after each
    batch with per-centre learning rates, as scikit-learn's.

    Parameters
    ----------
    n_clusters : int, default=8
    init : {"k-means++", "random"} or array-like of shape (n_clusters, n_features), default="k-means++"
    max_iter : int, default=100
        Passes (epochs) over the data.
    batch_size : int, default=1024
        Rows per mini-batch.
    compute_labels : bool, default=True
        Compute ``labels_`` and ``inertia_`` with a final pass.
    random_state : int, RandomState instance or None, default=None
    tol : float, default=0.0
        Tolerance on the centres' shift between batches (0: off).
    max_no_improvement : int or None, default=10
        Stop after this many batches without improvement of the smoothed
        batch inertia (None: off).
    n_init : "auto" or int, default="auto"
        Runs; "auto": 1 for "k-means++" and given centres, 3 for "random".
    mem_cap, spill_dir, n_jobs, verbose, timeline
        As :class:`outcore.KMeans`.

    Attributes
    ----------
    cluster_centers_, labels_, inertia_, n_iter_, n_features_in_, stats_
        As :class:`outcore.KMeans`; ``n_iter_`` counts epochs and
        ``n_steps_`` the batches.
    """

    _lloyd = False

    def __init__(self, n_clusters=8, *, init="k-means++", max_iter=100, batch_size=1024, verbose=0,
                 compute_labels=True, random_state=None, tol=0.0, max_no_improvement=10, n_init="auto",
                 mem_cap=None, spill_dir=None, n_jobs=None, timeline=None):
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.verbose = verbose
        self.compute_labels = compute_labels
        self.random_state = random_state
        self.tol = tol
        self.max_no_improvement = max_no_improvement
        self.n_init = n_init
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.n_jobs = n_jobs
        self.timeline = timeline

    def fit(self, X, y=None, sample_weight=None):
        """Compute the centroids on X by chunking it into mini-batches.

        Parameters
        ----------
        X : {array-like, np.memmap, str, os.PathLike} of shape (n_samples, n_features)
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        batch = _check_int("batch_size", self.batch_size, 1)
        task = min(batch, 1100)
        tol = float(self.tol)
        if not np.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a float >= 0, not {self.tol!r}")
        mni = self.max_no_improvement
        if mni is not None:
            mni = _check_int("max_no_improvement", mni, 1)
        params = dict(lloyd=False, max_iter=_check_int("max_iter", self.max_iter, 1), tol=tol,
                      batch_tasks=-(-batch // task), task_points=task, max_no_improvement=mni)
        out = self._fit(X, sample_weight, params)
        self.n_steps_ = int(out["n_steps"])
        return self


KMeans.__doc__ = KMeans.__doc__.replace("    ENGINE\n", _ENGINE_DOC.lstrip("\n") + "\n")
