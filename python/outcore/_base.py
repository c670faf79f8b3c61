"""What every outcore estimator shares: the engine settings (``mem_cap``,
``spill_dir``, ``n_jobs``, ``verbose``, ``timeline``) and the data
handed to it."""
import numbers
import os

import numpy as np
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _core, _data


def settings(est):
    """The engine's settings from the estimator's parameters."""
    cap = est.mem_cap
    if cap is not None and not isinstance(cap, str):
        if not isinstance(cap, numbers.Integral) or isinstance(cap, bool) or cap <= 0:
            raise ValueError(f"mem_cap must be None, 'auto', a size such as '1GiB' or a positive int of bytes, not {cap!r}")
        cap = str(int(cap))
    n_jobs = est.n_jobs
    if n_jobs is not None:
        if not isinstance(n_jobs, numbers.Integral) or n_jobs == 0:
            raise ValueError(f"n_jobs must be None, a positive int or -1, not {n_jobs!r}")
        n_jobs = os.cpu_count() + 1 + n_jobs if n_jobs < 0 else n_jobs
        n_jobs = max(1, int(n_jobs))
    timeline = None if est.timeline is None else os.fspath(est.timeline)
    spill = None if est.spill_dir is None else os.fspath(est.spill_dir)
    # Estimators that grow onto free MPI slots have it.
    max_ranks = getattr(est, "max_ranks", None)
    if max_ranks is not None:
        if isinstance(max_ranks, str) and max_ranks == "auto":
            pass
        elif isinstance(max_ranks, numbers.Integral) and not isinstance(max_ranks, bool) and max_ranks >= 1:
            max_ranks = str(int(max_ranks))
        else:
            raise ValueError(f"max_ranks must be None, 'auto' or a positive int, not {max_ranks!r}")
    return _core.Settings(cap, spill, n_jobs, int(est.verbose), timeline, max_ranks)


def copy_of(est, X):
    """``X`` handed to the engine under ``est``'s settings: its own file,
    or a copy in memory or in ``spill_dir`` (see ``_data``)."""
    return _data.as_data(X, est.spill_dir, _data.handover_limit(est.mem_cap))


def vector_of(est, v, **kw):
    """The 1-D array ``v`` handed to the engine under ``est``'s settings
    (``_data.vector``'s ``kw``)."""
    return _data.vector(v, est.spill_dir, limit=_data.handover_limit(est.mem_cap), **kw)


def fit_data(est, X, *, dtype="numeric"):
    """Data for a fit: a file the engine reads (``X`` a path or a memmap of
    a whole ``.npy``) or a temporary copy; sets ``n_features_in_``."""
    if _data.is_file_input(X):
        d = copy_of(est, X)
        est.n_features_in_ = d.cols
        if hasattr(est, "feature_names_in_"):
            del est.feature_names_in_
        return d
    X = validate_data(est, X, dtype=dtype, ensure_all_finite=False, ensure_min_samples=1)
    return copy_of(est, X)


def wrong_width(est, cols):
    """scikit-learn's error for data of the wrong number of features."""
    return ValueError(
        f"X has {cols} features, but {type(est).__name__} is expecting "
        f"{est.n_features_in_} features as input."
    )


def new_data(est, X, *, dtype="numeric"):
    """Data after the fit (predict, transform): as ``fit_data``, checked
    against the fitted number of features."""
    check_is_fitted(est)
    if _data.is_file_input(X):
        d = copy_of(est, X)
        if d.cols != est.n_features_in_:
            d.close()
            raise wrong_width(est, d.cols)
        return d, None
    X = validate_data(est, X, dtype=dtype, ensure_all_finite=False, reset=False)
    return copy_of(est, X), X


def apply_rows(est, X, kind, model, bias=None, dtype=None):
    """A fitted model applied to the rows of ``X`` by the engine, in one
    pass: ``kind`` "nearest" gives each row's nearest row of ``model`` and
    the squared distance to it, "distances" the distances to every row of
    ``model``, "affine" ``X @ model.T + bias``. A path or a memmap of a
    whole ``.npy`` is read from its file in blocks; an array is read where
    it is (no copy, no temporary file). The results are in ``dtype``
    (``X``'s float dtype when None); a value of ``X`` that is not finite is
    a ValueError naming its row and column."""
    check_is_fitted(est)
    if _data.is_file_input(X):
        path = os.fspath(X) if isinstance(X, (str, os.PathLike)) else _data._whole_npy(X)
        rows, cols = _core.shape(path)
        if cols != est.n_features_in_:
            raise wrong_width(est, cols)
        src, xdtype = path, _data.dtype_of(X)
    else:
        src = validate_data(est, X, dtype=[np.float64, np.float32], order="C",
                            ensure_all_finite=False, reset=False)
        rows, xdtype = src.shape[0], src.dtype
    dtype = np.dtype(dtype or (np.float32 if xdtype == np.float32 else np.float64))
    model = np.ascontiguousarray(model, dtype=dtype)
    width = 1 if kind == "nearest" else model.shape[0]
    out = np.empty((rows, width) if kind != "nearest" else rows, dtype=dtype)
    job = dict(kind=kind, model=model, out=out, labels=None, bias=None)
    if kind == "nearest":
        job["labels"] = np.empty(rows, dtype=np.int32)
    if bias is not None:
        job["bias"] = np.ascontiguousarray(np.broadcast_to(bias, (width,)), dtype=dtype)
    _core.apply_rows(settings(est), src, job)
    return (job["labels"], out) if kind == "nearest" else out
