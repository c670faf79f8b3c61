"""K-means (Lloyd) and mini-batch K-means that run under a memory cap.

``fit`` runs in the engine, on data of any size. What scikit-learn does on
data in memory besides is done here in numpy, as scikit-learn does it:
``MiniBatchKMeans.partial_fit`` (one mini-batch step over the array it is
given), a callable ``init`` (called on the data, or for
``MiniBatchKMeans`` on ``init_size`` rows of it), and ``_init_centroids``.
"""
import json
import numbers
import os
import sys
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, TransformerMixin
from sklearn.cluster import kmeans_plusplus
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_array, check_random_state
from sklearn.utils.extmath import row_norms
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from . import _base, _core, _data

#: The engine's parameters, as every estimator documents them (its
#: docstring's "ENGINE" line); KMeans documents its own ``verbose``.
_VERBOSE_DOC = """    verbose : int, default=0
        Progress lines on standard error.
"""
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
""" + _VERBOSE_DOC + """    timeline : str or path-like, default=None
        Write the engine's memory timeline (the command line's
        ``--timeline`` CSV) to this file.
"""


def _seed(random_state):
    """A 64-bit seed from ``random_state`` (None: fresh)."""
    return int(check_random_state(random_state).randint(np.iinfo(np.int32).max))


def _echo(line, stdout):
    """A verbose line of the engine's: scikit-learn's words on
    ``sys.stdout`` (where scikit-learn prints them), the engine's own
    (``outcore: ...``) on ``sys.stderr``."""
    print(line, file=sys.stdout if stdout else sys.stderr, flush=True)


def _warn(message, category):
    """``warnings.warn``, attributed to the first caller outside this module."""
    f, level = sys._getframe(0), 1
    while f is not None and f.f_globals.get("__name__") == __name__:
        f, level = f.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _bad(est, name, expected, value):
    """scikit-learn's error for a parameter out of its constraints."""
    return ValueError(f"The {name!r} parameter of {type(est).__name__} must be {expected}. Got {value!r} instead.")


def _int_param(est, name, low, none=False):
    """The int parameter ``name`` (>= ``low``, or None when ``none``)."""
    v = getattr(est, name)
    if v is None and none:
        return None
    if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)) or v < low:
        raise _bad(est, name, f"an int in the range [{low}, inf){' or None' if none else ''}", v)
    return int(v)


def _real_param(est, name):
    """The float parameter ``name``, >= 0."""
    v = getattr(est, name)
    if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)) or not 0 <= v < np.inf:
        raise _bad(est, name, "a float in the range [0.0, inf)", v)
    return float(v)


def _bool_param(est, name):
    v = getattr(est, name)
    if not isinstance(v, (bool, np.bool_)):
        raise _bad(est, name, "an instance of 'bool' or an instance of 'numpy.bool'", v)
    return bool(v)


def _is_arraylike_not_scalar(x):
    """scikit-learn's test for array-like centres (not a string)."""
    return (hasattr(x, "__len__") or hasattr(x, "shape") or hasattr(x, "__array__")) and not np.isscalar(x)


def _whole_array(X):
    """``X`` as an array for numpy work on rows anywhere in it (a callable
    init): an array as given, a ``.npy`` mapped from its file."""
    if not _data.is_file_input(X):
        return check_array(X, dtype=[np.float64, np.float32], order="C")
    if isinstance(X, np.memmap):
        return X
    if _data._npy_header(os.fspath(X)) is None:
        raise TypeError(f"a callable init needs X as an array or a .npy file, not {os.fspath(X)!r}")
    return np.load(os.fspath(X), mmap_mode="r")


def _labels_inertia(X, sample_weight, centers, block=4096):
    """Each row's nearest centre (the lowest on ties) and the weighted sum
    of squared distances, in numpy by blocks of rows."""
    c = np.asarray(centers, dtype=np.float64)
    cn = (c * c).sum(axis=1)
    labels = np.empty(X.shape[0], dtype=np.int32)
    inertia = 0.0
    for s in range(0, X.shape[0], block):
        b = np.asarray(X[s:s + block], dtype=np.float64)
        d2 = (b * b).sum(axis=1)[:, None] - 2 * b @ c.T + cn[None, :]
        lab = d2.argmin(axis=1)
        labels[s:s + block] = lab
        best = np.maximum(d2[np.arange(len(b)), lab], 0)
        inertia += float(np.dot(np.asarray(sample_weight[s:s + block], dtype=np.float64), best))
    return labels, inertia


def _mini_batch_step(X, sample_weight, centers, weight_sums, random_state, random_reassign, reassignment_ratio,
                     verbose):
    """scikit-learn's ``_mini_batch_step`` on a batch in memory, in place:
    each centre moves to the weighted running mean of the points it has
    been given (``weight_sums`` their weights so far); with
    ``random_reassign``, centres of little weight move onto random points
    of the batch. Returns the batch's inertia before the update."""
    labels, inertia = _labels_inertia(X, sample_weight, centers)
    k, n = centers.shape[0], X.shape[0]
    onehot = sp.csr_matrix((np.asarray(sample_weight, dtype=np.float64), (labels, np.arange(n))), shape=(k, n))
    wsum = np.asarray(onehot.sum(axis=1)).ravel()
    sums = onehot @ np.asarray(X, dtype=np.float64)
    moved = wsum > 0
    old = weight_sums[moved].astype(np.float64)
    new = old + wsum[moved]
    centers[moved] = (centers[moved] * old[:, None] + sums[moved]) / new[:, None]
    weight_sums[moved] = new
    if random_reassign and reassignment_ratio > 0:
        to_reassign = weight_sums < reassignment_ratio * weight_sums.max()
        # At most half the batch's points become centres.
        if to_reassign.sum() > 0.5 * n:
            to_reassign[np.argsort(weight_sums)[int(0.5 * n):]] = False
        n_reassigns = int(to_reassign.sum())
        if n_reassigns:
            new_centers = random_state.choice(n, replace=False, size=n_reassigns)
            if verbose:
                print(f"[MiniBatchKMeans] Reassigning {n_reassigns} cluster centers.")
            centers[to_reassign] = X[new_centers]
        # Not reset to zero: they would be reassigned again at once.
        weight_sums[to_reassign] = np.min(weight_sums[~to_reassign])
    return inertia


class _KMeansBase(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """Fit, predict, transform and score shared by both estimators."""

    #: scikit-learn's n_init for "random" and callable inits under "auto".
    _default_n_init = 10

    #: scikit-learn checks these estimators are expected to fail, and why
    #: (the same as for scikit-learn's own KMeans and MiniBatchKMeans).
    _expected_failed_checks = {
        "check_sample_weight_equivalence_on_dense_data": (
            "sample_weight is not equivalent to repeating samples: the k-means++ draw "
            "and the shards of rows depend on the number of rows"
        ),
    }

    def _check_params(self):
        """The parameters both estimators share, checked as scikit-learn's."""
        _int_param(self, "n_clusters", 1)
        init = self.init
        if isinstance(init, str):
            if init not in ("k-means++", "random", "k-means||"):
                raise _bad(self, "init", "a str among {'k-means++', 'random', 'k-means||'}, a callable or an "
                           "array-like", init)
        elif not callable(init) and not _is_arraylike_not_scalar(init):
            raise _bad(self, "init", "a str among {'k-means++', 'random', 'k-means||'}, a callable or an "
                       "array-like", init)
        if not (isinstance(self.n_init, str) and self.n_init == "auto"):
            _int_param(self, "n_init", 1)
        _int_param(self, "max_iter", 1)
        _real_param(self, "tol")

    def _check_params_vs_input(self, n_samples):
        """scikit-learn's checks against the data's rows; sets ``_n_init``."""
        if n_samples < self.n_clusters:
            raise ValueError(f"n_samples={n_samples} should be >= n_clusters={self.n_clusters}.")
        init = self.init
        if isinstance(self.n_init, str):
            self._n_init = 1 if isinstance(init, str) and init in ("k-means++", "k-means||") \
                else self._default_n_init
            if _is_arraylike_not_scalar(init):
                self._n_init = 1
        else:
            self._n_init = int(self.n_init)
        if _is_arraylike_not_scalar(init) and self._n_init != 1:
            _warn(
                "Explicit initial center position passed: performing only one init in "
                f"{type(self).__name__} instead of n_init={self._n_init}.",
                RuntimeWarning,
            )
            self._n_init = 1

    def _check_center_shape(self, centers, n_features, n_centroids=None):
        """scikit-learn's errors for initial centres of the wrong shape."""
        n_centroids = self.n_clusters if n_centroids is None else n_centroids
        if centers.shape[0] != n_centroids:
            raise ValueError(
                f"The shape of the initial centers {centers.shape} does not match the number of clusters "
                f"{n_centroids}."
            )
        if centers.shape[1] != n_features:
            raise ValueError(
                f"The shape of the initial centers {centers.shape} does not match the number of features of "
                f"the data {n_features}."
            )

    def _init_centroids(self, X, x_squared_norms, init, random_state, sample_weight, init_size=None,
                        n_centroids=None):
        """Initial centres drawn in numpy from ``X`` in memory, as
        scikit-learn's: greedy k-means++ (scikit-learn's
        ``kmeans_plusplus``) or random rows, drawn in proportion to
        ``sample_weight``, on ``init_size`` rows drawn with replacement
        when fewer than ``X``'s; a callable is called as ``init(X,
        n_clusters, random_state=random_state)``; an array is returned as
        given. Used by ``partial_fit`` and for a callable ``init``;
        ``fit``'s "k-means++" and "random" are drawn by the engine, on a
        sample of its own.

        Returns
        -------
        centers : ndarray of shape (n_centroids, n_features)
        """
        n_samples = X.shape[0]
        k = self.n_clusters if n_centroids is None else n_centroids
        if init_size is not None and init_size < n_samples:
            idx = random_state.randint(0, n_samples, init_size)
            X = np.asarray(X[idx])
            x_squared_norms = None if x_squared_norms is None else x_squared_norms[idx]
            sample_weight = sample_weight[idx]
            n_samples = X.shape[0]
        if isinstance(init, str) and init in ("k-means++", "k-means||"):
            # k-means|| is for data too big for one sample; a batch in
            # memory takes k-means++, as dask-ml's partial_fit does.
            centers, _ = kmeans_plusplus(X, k, x_squared_norms=x_squared_norms, sample_weight=sample_weight,
                                         random_state=random_state)
        elif isinstance(init, str) and init == "random":
            seeds = random_state.choice(n_samples, size=k, replace=False, p=sample_weight / sample_weight.sum())
            centers = np.asarray(X[seeds])
        elif callable(init):
            centers = init(X, k, random_state=random_state)
            centers = check_array(centers, dtype=X.dtype, copy=True, order="C")
            self._check_center_shape(centers, X.shape[1], k)
        else:
            centers = init
        if sp.issparse(centers):
            centers = centers.toarray()
        return centers

    def _starts(self, X, cols, sample_weight, random_state):
        """The engine's runs: ``(init, centres or None, n_init)``; a callable
        is called (lazily, run by run) on ``X`` as an array."""
        init = self.init
        if isinstance(init, str):
            yield init, None, self._n_init
            return
        dtype = np.float32 if _data.dtype_of(X) == np.float32 else np.float64
        if not callable(init):
            c = check_array(init, dtype=dtype, copy=True, order="C")
            self._check_center_shape(c, cols)
            yield "given", c, 1
            return
        Xa = _whole_array(X)
        w = np.ones(Xa.shape[0]) if sample_weight is None else sample_weight
        yield from self._callable_starts(Xa, w, random_state)

    def _callable_starts(self, X, sample_weight, random_state):
        """KMeans: one run from each of ``_n_init`` calls of the callable."""
        for _ in range(self._n_init):
            yield "given", self._init_centroids(X, None, self.init, random_state, sample_weight), 1

    def _fit(self, X, sample_weight, params):
        """The engine's fit, from each start in turn, keeping the lowest
        inertia: sets the centres, inertia, ``n_iter_`` and ``stats_``;
        returns the engine's output and the labels."""
        k = self.n_clusters
        settings = _base.settings(self)
        dtype = _data.dtype_of(X)
        random_state = check_random_state(self.random_state)
        best = None
        with _base.fit_data(self, X) as data:
            self._check_params_vs_input(data.rows)
            if sample_weight is not None:
                sample_weight = _check_sample_weight(sample_weight, np.empty((data.rows, 0)), dtype=np.float64)
            params.update(k=k, seed=int(random_state.randint(np.iinfo(np.int32).max)), shards=8)
            with _base.vector_of(self, sample_weight) as weights:
                path = None if sample_weight is None else weights.path
                for init, centers, n_init in self._starts(X, data.cols, sample_weight, random_state):
                    if centers is not None:
                        centers = np.ascontiguousarray(centers, dtype="<f4").tobytes()
                    run = dict(params, init=init, centers=centers, n_init=n_init)
                    out = _core.kmeans_fit(settings, data.path, path, run, _echo)
                    if best is None or out["inertia"] < best["inertia"]:
                        best = out
        out_dtype = np.float32 if dtype == np.float32 else np.float64
        c = np.frombuffer(best["centers"], dtype="<f4").reshape(k, -1)
        self.cluster_centers_ = c.astype(out_dtype)
        self.inertia_ = float(best["inertia"])
        self.n_iter_ = int(best["n_iter"])
        self._n_features_out = k
        self.stats_ = json.loads(best["stats"])
        return best, np.frombuffer(best["labels"], dtype="<u4").astype(np.int32)

    def _nearest(self, X):
        """Labels and squared distances of the nearest centres."""
        check_is_fitted(self)
        return _base.apply_rows(self, X, "nearest", self.cluster_centers_)

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
        return _base.apply_rows(self, X, "distances", self.cluster_centers_)

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
    init : {"k-means++", "random", "k-means||"}, callable or array-like of shape (n_clusters, n_features), default="k-means++"
        How the initial centres are chosen: by the engine, on a sample of
        the rows ("k-means++", "random") or over five passes of all of them
        ("k-means||", dask-ml's and Spark's default: two rounds drawing
        about ``2 * n_clusters`` candidates each, then a weighted k-means++
        over the candidates); given; or ``init(X, n_clusters,
        random_state=...)``, called on X as an array (a ``.npy`` file
        mapped from disk) with a ``RandomState`` (unlike scikit-learn's,
        X is not centred first, so the centres it returns are in X's
        coordinates).
    n_init : "auto" or int, default="auto"
        Runs from different initial centres; the best (lowest inertia) is
        kept. "auto": 1 for "k-means++", "k-means||" and given centres, 10
        for "random" and a callable.
    max_iter : int, default=300
        Iterations of Lloyd's algorithm for one run.
    tol : float, default=1e-4
        Relative tolerance on the centres' shift (relative to the mean
        per-feature variance of the data) to declare convergence.
    verbose : int, default=0
        Progress: scikit-learn's lines on ``sys.stdout``, the engine's
        (loading, seconds per pass) on ``sys.stderr``.
    random_state : int, RandomState instance or None, default=None
        Seed of the initialisation.
    copy_x : bool, default=True
        Accepted for scikit-learn's API: X is never modified (the engine
        works on its own copy or reads X's file).
    algorithm : {"lloyd", "elkan"}, default="lloyd"
        Accepted for scikit-learn's API: both run Lloyd's algorithm, which
        gives the results Elkan's would (Elkan's only skips distances).
    ENGINE
    max_ranks : None, "auto" or int, default=None
        Under ``mpirun`` (a package built with MPI), grow the fit onto the
        allocation's free slots when its data does not fit the ranks'
        caps, up to this many ranks ("auto": as many as there are slots).
        The ranks spawned run the same script from its start and join
        this fit, which gives the same bytes as on one process; only a
        script's first fit can grow. None: never grow.
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
                 verbose=0, random_state=None, copy_x=True, algorithm="lloyd", mem_cap=None, spill_dir=None,
                 n_jobs=None, timeline=None, max_ranks=None):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.copy_x = copy_x
        self.algorithm = algorithm
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.n_jobs = n_jobs
        self.timeline = timeline
        self.max_ranks = max_ranks

    def _check_params_vs_input(self, n_samples):
        super()._check_params_vs_input(n_samples)
        self._algorithm = self.algorithm
        if self._algorithm == "elkan" and self.n_clusters == 1:
            _warn(
                "algorithm='elkan' doesn't make sense for a single cluster. Using 'lloyd' instead.",
                RuntimeWarning,
            )
            self._algorithm = "lloyd"

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
        self._check_params()
        if not (isinstance(self.algorithm, str) and self.algorithm in ("lloyd", "elkan")):
            raise _bad(self, "algorithm", "a str among {'elkan', 'lloyd'}", self.algorithm)
        _bool_param(self, "copy_x")
        params = dict(lloyd=True, max_iter=int(self.max_iter), tol=float(self.tol), batch_tasks=1,
                      task_points=1100, max_no_improvement=None, reassignment_ratio=0.0)
        _, self.labels_ = self._fit(X, sample_weight, params)
        distinct = len(np.unique(self.labels_))
        if distinct < self.n_clusters:
            _warn(
                f"Number of distinct clusters ({distinct}) found smaller than n_clusters ({self.n_clusters}). "
                "Possibly due to duplicate points in X.",
                ConvergenceWarning,
            )
        return self


class MiniBatchKMeans(_KMeansBase):
    """Mini-batch K-Means clustering that runs under a memory cap.

    Batches are drawn from fixed shards of the data, in an order that does
    not depend on the cap or on ``n_jobs``; the centres move after each
    batch with per-centre learning rates, as scikit-learn's.

    Parameters
    ----------
    n_clusters : int, default=8
    init : {"k-means++", "random", "k-means||"}, callable or array-like of shape (n_clusters, n_features), default="k-means++"
        As :class:`outcore.KMeans`; a callable is called on ``init_size``
        rows drawn from X, as scikit-learn's. ``partial_fit`` draws
        "k-means||" as "k-means++" on its first batch.
    max_iter : int, default=100
        Passes (epochs) over the data.
    batch_size : int, default=1024
        Rows per mini-batch.
    verbose : int, default=0
        As :class:`outcore.KMeans`.
    compute_labels : bool, default=True
        Set ``labels_`` (the engine labels the rows in its final pass,
        which also gives ``inertia_``, in any case).
    random_state : int, RandomState instance or None, default=None
    tol : float, default=0.0
        Tolerance on the centres' shift between batches (0: off).
    max_no_improvement : int or None, default=10
        Stop after this many batches without improvement of the smoothed
        batch inertia (None: off).
    init_size : int or None, default=None
        Rows drawn for a callable ``init`` and for ``partial_fit``'s
        initialisation, as scikit-learn's (None: ``3 * batch_size``, at
        least ``3 * n_clusters``; at most the rows). ``fit``'s "k-means++"
        and "random" are drawn by the engine on its own sample (at least
        10,000 rows and 20 per cluster, when there are that many).
    n_init : "auto" or int, default="auto"
        Runs; "auto": 1 for "k-means++", "k-means||" and given centres, 3 for "random"
        and a callable. Each "k-means++" or "random" init is a whole run
        (the best final inertia is kept); callable inits are compared on
        ``init_size`` rows before one run, as scikit-learn's.
    reassignment_ratio : float, default=0.01
        Centres whose accumulated weight is below this fraction of the
        largest are moved onto rows of the batch, checked every
        ``10 * n_clusters`` rows and after every step while a centre has
        no weight, as scikit-learn's. ``partial_fit`` draws the rows at
        random; ``fit`` (the engine) takes the rows whose hash of the
        seed, the step and the row index is smallest, so the centres are
        the same under any cap and on any number of processes.
    mem_cap, spill_dir, n_jobs, timeline, max_ranks
        As :class:`outcore.KMeans`.

    Attributes
    ----------
    cluster_centers_, labels_, inertia_, n_iter_, n_features_in_, stats_
        As :class:`outcore.KMeans`; ``n_iter_`` counts epochs and
        ``n_steps_`` the batches.
    """

    _default_n_init = 3

    def __init__(self, n_clusters=8, *, init="k-means++", max_iter=100, batch_size=1024, verbose=0,
                 compute_labels=True, random_state=None, tol=0.0, max_no_improvement=10, init_size=None,
                 n_init="auto", reassignment_ratio=0.01, mem_cap=None, spill_dir=None, n_jobs=None,
                 timeline=None, max_ranks=None):
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.verbose = verbose
        self.compute_labels = compute_labels
        self.random_state = random_state
        self.tol = tol
        self.max_no_improvement = max_no_improvement
        self.init_size = init_size
        self.n_init = n_init
        self.reassignment_ratio = reassignment_ratio
        self.mem_cap = mem_cap
        self.spill_dir = spill_dir
        self.n_jobs = n_jobs
        self.timeline = timeline
        self.max_ranks = max_ranks

    def _check_params(self):
        super()._check_params()
        _int_param(self, "batch_size", 1)
        _bool_param(self, "compute_labels")
        _int_param(self, "max_no_improvement", 0, none=True)
        _int_param(self, "init_size", 1, none=True)
        _real_param(self, "reassignment_ratio")

    def _check_params_vs_input(self, n_samples):
        """As the base's; sets ``_batch_size`` and ``_init_size`` as
        scikit-learn does."""
        super()._check_params_vs_input(n_samples)
        self._batch_size = min(self.batch_size, n_samples)
        self._init_size = self.init_size
        if self._init_size is None:
            self._init_size = 3 * self._batch_size
            if self._init_size < self.n_clusters:
                self._init_size = 3 * self.n_clusters
        elif self._init_size < self.n_clusters:
            _warn(
                f"init_size={self._init_size} should be larger than n_clusters={self.n_clusters}. "
                "Setting it to min(3*n_clusters, n_samples)",
                RuntimeWarning,
            )
            self._init_size = 3 * self.n_clusters
        self._init_size = min(self._init_size, n_samples)

    def _callable_starts(self, X, sample_weight, random_state):
        """scikit-learn's choice among ``_n_init`` calls of the callable:
        the centres of least inertia on ``init_size`` random rows."""
        valid = random_state.randint(0, X.shape[0], self._init_size)
        X_valid, w_valid = np.asarray(X[valid]), sample_weight[valid]
        best, best_inertia = None, None
        for i in range(self._n_init):
            if self.verbose:
                print(f"Init {i + 1}/{self._n_init} with method {self.init}")
            c = self._init_centroids(X, None, self.init, random_state, sample_weight, init_size=self._init_size)
            _, inertia = _labels_inertia(X_valid, w_valid, c)
            if self.verbose:
                print(f"Inertia for init {i + 1}/{self._n_init}: {inertia}")
            if best is None or inertia < best_inertia:
                best, best_inertia = c, inertia
        yield "given", best, 1

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
        self._check_params()
        batch = int(self.batch_size)
        task = min(batch, 1100)
        mni = self.max_no_improvement
        params = dict(lloyd=False, max_iter=int(self.max_iter), tol=float(self.tol),
                      batch_tasks=-(-batch // task), task_points=task,
                      max_no_improvement=None if mni is None else int(mni),
                      reassignment_ratio=float(self.reassignment_ratio))
        out, labels = self._fit(X, sample_weight, params)
        self.n_steps_ = int(out["n_steps"])
        if self.compute_labels:
            self.labels_ = labels
        # The engine keeps each centre's accumulated weight to itself: a
        # partial_fit after fit starts from an estimate, the weight of the
        # rows each centre holds now times the epochs run.
        w = None if sample_weight is None else _check_sample_weight(sample_weight, np.empty((len(labels), 0)))
        counts = np.bincount(labels, weights=w, minlength=self.n_clusters) * self.n_iter_
        self._counts = counts.astype(self.cluster_centers_.dtype)
        self._n_since_last_reassign = 0
        return self

    def partial_fit(self, X, y=None, sample_weight=None):
        """Update the centres with one mini-batch step over X, as
        scikit-learn's.

        Done in numpy on X in memory (not by the engine): the first call
        draws the initial centres from X (``init``, ``init_size``,
        ``random_state``); each call then assigns every row of X to its
        nearest centre and moves each centre to the weighted running mean
        of the rows it has been given (the weights so far kept in
        ``_counts``), and every ``10 * n_clusters`` rows seen, or while a
        centre has none, moves centres of little weight onto random rows
        (``reassignment_ratio``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            The mini-batch, in memory (a memmap too).
        y : Ignored
        sample_weight : array-like of shape (n_samples,), default=None

        Returns
        -------
        self : object
        """
        if _data.is_file_input(X) and not isinstance(X, np.memmap):
            raise TypeError("partial_fit takes the mini-batch as an array (in memory or a memmap), not a path")
        self._check_params()
        has_centers = hasattr(self, "cluster_centers_")
        X = validate_data(self, X, dtype=[np.float64, np.float32], order="C", reset=not has_centers)
        self._random_state = getattr(self, "_random_state", check_random_state(self.random_state))
        sample_weight = _check_sample_weight(sample_weight, X, dtype=X.dtype)
        self.n_steps_ = getattr(self, "n_steps_", 0)
        if not has_centers:
            self._check_params_vs_input(X.shape[0])
            init = self.init
            if _is_arraylike_not_scalar(init):
                init = check_array(init, dtype=X.dtype, copy=True, order="C")
                self._check_center_shape(init, X.shape[1])
            centers = self._init_centroids(X, row_norms(X, squared=True), init, self._random_state, sample_weight,
                                           init_size=self._init_size)
            self.cluster_centers_ = np.array(centers, dtype=X.dtype, order="C")
            self._counts = np.zeros(self.n_clusters, dtype=X.dtype)
            self._n_since_last_reassign = 0
        _mini_batch_step(X, sample_weight, self.cluster_centers_, self._counts, self._random_state,
                         self._random_reassign(), self.reassignment_ratio, self.verbose)
        if self.compute_labels:
            self.labels_, self.inertia_ = _labels_inertia(X, sample_weight, self.cluster_centers_)
        self.n_steps_ += 1
        self._n_features_out = self.cluster_centers_.shape[0]
        return self

    def _random_reassign(self):
        """scikit-learn's: reassign every ``10 * n_clusters`` rows seen, and
        whenever a centre has no weight yet."""
        self._n_since_last_reassign += self._batch_size
        if (self._counts == 0).any() or self._n_since_last_reassign >= 10 * self.n_clusters:
            self._n_since_last_reassign = 0
            return True
        return False


KMeans.__doc__ = KMeans.__doc__.replace("    ENGINE\n", _ENGINE_DOC.lstrip("\n").replace(_VERBOSE_DOC, "") + "\n")
