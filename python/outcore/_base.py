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
    return _core.Settings(cap, spill, n_jobs, int(est.verbose), timeline)


def fit_data(est, X, *, dtype="numeric"):
    """Data for a fit: a file the engine reads (``X`` a path or a memmap of
    a whole ``.npy``) or a temporary copy; sets ``n_features_in_``."""
    if _data.is_file_input(X):
        d = _data.as_data(X, est.spill_dir)
        est.n_features_in_ = d.cols
        if hasattr(est, "feature_names_in_"):
            del est.feature_names_in_
        return d
    X = validate_data(est, X, dtype=dtype, ensure_all_finite=False, ensure_min_samples=1)
    return _data.as_data(X, est.spill_dir)


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
        d = _data.as_data(X, est.spill_dir)
        if d.cols != est.n_features_in_:
            d.close()
            raise wrong_width(est, d.cols)
        return d, None
    X = validate_data(est, X, dtype=dtype, ensure_all_finite=False, reset=False)
    return _data.as_data(X, est.spill_dir), X


def finite_blocks(est, X):
    """Blocks of ``X`` for numpy work after the fit, each checked to be
    finite and as wide as the fitted data."""
    start = 0
    for b in _data.blocks(X):
        if b.shape[1] != est.n_features_in_:
            raise wrong_width(est, b.shape[1])
        if b.dtype.kind == "f" and not np.isfinite(b).all():
            r, c = _data._first_bad(b)
            kind = "NaN" if np.isnan(b[r, c]) else "infinity"
            raise ValueError(f"Input X contains {kind} at row {start + r}, column {c}")
        start += len(b)
        yield b
