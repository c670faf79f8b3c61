"""How the estimators hand data to the engine: a file it reads itself.

A path, or a ``np.memmap`` / ``np.load(..., mmap_mode="r")`` of a whole
``.npy`` file, is read from the file (by name and offset), the way the
command line reads ``--input``: the file's pages do not pile up in the
process. Anything else is written to a temporary ``.npy`` of float32,
converted and checked block by block (never as a whole copy), inside a
private directory made and locked as a runtime's spill directory
(``_core.ScratchDir``): a copy left by a process that was killed is
removed by the next run that spills into the same directory.
"""
import os
import tempfile

import numpy as np

from . import _core

# Rows converted at a time: about 16 MiB of float32.
_BLOCK_BYTES = 16 << 20


class Data:
    """A data file for the engine: its path, rows and columns, and, for a
    temporary copy of ours, the scratch directory holding it (removed by
    ``close``)."""

    def __init__(self, path, rows, cols, scratch=None):
        self.path = os.fspath(path)
        self.rows = rows
        self.cols = cols
        self.scratch = scratch

    def close(self):
        if self.scratch is not None:
            self.scratch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def is_file_input(X):
    """Whether ``X`` is read by the engine from a file: a path or a memmap
    of a whole ``.npy``."""
    return isinstance(X, (str, os.PathLike)) or _whole_npy(X) is not None


def model_dtype(X):
    """The dtype of a model fitted to ``X``, as scikit-learn's: float32 for
    a float32 array (a memmap too), float64 otherwise (and for a path,
    which scikit-learn does not take: the engine's full precision)."""
    dt = getattr(X, "dtype", None)
    return np.float32 if dt == np.float32 else np.float64


def dtype_of(X):
    """The dtype of ``X``'s values: an array's, a ``.npy`` file's, float32
    for other files (the engine's)."""
    if isinstance(X, (str, os.PathLike)):
        h = _npy_header(os.fspath(X))
        return h[2] if h is not None else np.dtype(np.float32)
    return getattr(X, "dtype", None)


def _npy_header(path):
    """Shape, Fortran order, dtype and data offset of a ``.npy`` file, or
    None when it is not one."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            return shape, fortran, dtype, f.tell()
    except (OSError, ValueError):
        return None


def _whole_npy(X):
    """The ``.npy`` file ``X`` maps as a whole, if it does."""
    if not isinstance(X, np.memmap) or getattr(X, "filename", None) is None:
        return None
    h = _npy_header(X.filename)
    if h is None:
        return None
    shape, fortran, dtype, offset = h
    whole = (
        X.offset == offset
        and tuple(X.shape) == tuple(shape)
        and X.dtype == dtype
        and not fortran
        and X.flags.c_contiguous
        and X.ndim == 2
        and dtype.kind == "f"
    )
    return X.filename if whole else None


def _first_bad(block):
    """Row and column of the first value that is not finite."""
    r, c = np.argwhere(~np.isfinite(block))[0]
    return int(r), int(c)


def write_npy(X, directory=None, dtype=np.float32, what="X"):
    """``X`` (2-D, or 1-D for ``dtype`` int32/float64 vectors) into a
    temporary ``.npy`` of ``dtype``, converted block by block; a value that
    is not finite is a ValueError naming its row and column."""
    X = X if hasattr(X, "shape") and hasattr(X, "dtype") else np.asarray(X)
    shape = tuple(int(s) for s in X.shape)
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * 4)
    step = max(1, _BLOCK_BYTES // row_bytes)
    fd, path = tempfile.mkstemp(suffix=".npy", prefix="outcore-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
            np.lib.format.write_array_header_2_0(f, header)
            for start in range(0, shape[0], step):
                src = np.asarray(X[start:start + step])
                # A value too large for the dtype becomes infinity here and
                # is named below: not a warning, nor FloatingPointError
                # under np.errstate(all="raise").
                with np.errstate(over="ignore", invalid="ignore"):
                    block = np.ascontiguousarray(src, dtype=dtype)
                if block.dtype.kind == "f" and not np.isfinite(block).all():
                    r, c = _first_bad(block.reshape(block.shape[0], -1))
                    v = src.reshape(src.shape[0], -1)[r, c]
                    kind = "NaN" if np.isnan(v) else "infinity"
                    if np.isfinite(v):
                        kind = f"infinity or a value too large for {np.dtype(dtype).name} ({v!r})"
                    raise ValueError(
                        f"Input {what} contains {kind} at row {start + r}, column {c}"
                    )
                f.write(block.tobytes())
    except BaseException:
        os.unlink(path)
        raise
    return path


def _copy(X, spill_dir, rows, cols, **kw):
    """A :class:`Data` for a temporary copy of ``X`` (``write_npy``'s
    ``kw``), in a scratch directory of its own inside ``spill_dir``."""
    scratch = _core.ScratchDir(None if spill_dir is None else os.fspath(spill_dir))
    try:
        path = write_npy(X, scratch.path, **kw)
    except BaseException:
        scratch.close()
        raise
    return Data(path, rows, cols, scratch)


def vector(v, directory=None, dtype=np.float64, what="sample_weight"):
    """A :class:`Data` for the 1-D array ``v`` (weights, class indices):
    a temporary ``.npy`` of ``dtype``, removed by ``close``. None for
    None."""
    if v is None:
        return Data(os.devnull, 0, 0)
    return _copy(v, directory, len(v), 1, dtype=dtype, what=what)


def as_data(X, directory=None):
    """A :class:`Data` for ``X``: its own file when the engine can read it,
    else a temporary copy (float32)."""
    if isinstance(X, (str, os.PathLike)):
        rows, cols = _core.shape(os.fspath(X))
        return Data(X, rows, cols)
    whole = _whole_npy(X)
    if whole is not None:
        return Data(whole, X.shape[0], X.shape[1])
    return _copy(X, directory, X.shape[0], X.shape[1])


def blocks(X, rows=None):
    """``X`` in blocks of rows (arrays), for work done in numpy. A path or a
    memmap of a whole ``.npy`` is read from the file, block by block (not
    through a mapping, whose pages would pile up in the process)."""
    path = os.fspath(X) if isinstance(X, (str, os.PathLike)) else _whole_npy(X)
    if path is None:
        n, d = X.shape
        step = rows or max(1, _BLOCK_BYTES // max(1, 8 * d))
        for start in range(0, n, step):
            yield np.asarray(X[start:start + step])
        return
    h = _npy_header(path)
    if h is None or h[1] or len(h[0]) != 2:
        raise ValueError(f"{path}: a 2-D .npy file in C order is needed here")
    (n, d), _, dtype, offset = h
    step = rows or max(1, _BLOCK_BYTES // max(1, 8 * d))
    with open(path, "rb") as f:
        for start in range(0, n, step):
            count = min(step, n - start)
            f.seek(offset + start * d * dtype.itemsize)
            yield np.fromfile(f, dtype=dtype, count=count * d).reshape(count, d)
