"""How the estimators hand data to the engine: a file it reads itself.

A path, or a ``np.memmap`` / ``np.load(..., mmap_mode="r")`` of a whole
``.npy`` file, is read from the file (by name and offset), the way the
command line reads ``--input``: the file's pages do not pile up in the
process. Anything else is converted to a ``.npy`` of float32 block by
block (never as a whole copy) and checked:

- a small array (at most ``limit`` bytes once converted: 16 MiB, and a
  16th of the cap) goes into an anonymous file in memory (``memfd``),
  which the engine reads as ``/proc/self/fd/N``: nothing on disk, nothing
  to remove, and gone with the process however it ends;
- a larger one goes to a temporary ``.npy`` inside a private directory
  made and locked as a runtime's spill directory (``_core.ScratchDir``):
  a copy left by a process that was killed is removed by the next run
  that spills into the same directory.
"""
import os
import tempfile

import numpy as np

from . import _core

# Rows converted at a time: about 16 MiB of float32.
_BLOCK_BYTES = 16 << 20

# The largest copy kept in memory (a memfd) rather than on disk.
SMALL_BYTES = 16 << 20


def handover_limit(mem_cap):
    """The largest copy handed over in memory under ``mem_cap`` (the
    estimators' parameter): 16 MiB, and at most a 16th of the cap."""
    if mem_cap is None or isinstance(mem_cap, str) and mem_cap == "auto":
        return SMALL_BYTES
    try:
        cap = _core.parse_size(mem_cap) if isinstance(mem_cap, str) else int(mem_cap)
    except (TypeError, ValueError):
        return 0  # refused with its own error by the settings
    return max(0, min(SMALL_BYTES, cap // 16))


class _MemFile:
    """An anonymous file in memory, closed by ``close``."""

    def __init__(self):
        self.fd = os.memfd_create("outcore-copy", os.MFD_CLOEXEC)
        self.path = f"/proc/self/fd/{self.fd}"

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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


def write_npy(X, directory=None, dtype=np.float32, what="X", memfile=None):
    """``X`` (2-D, or 1-D for ``dtype`` int32/float64 vectors) into a
    temporary ``.npy`` of ``dtype`` (or into ``memfile``), converted block
    by block; a value that is not finite is a ValueError naming its row and
    column."""
    X = X if hasattr(X, "shape") and hasattr(X, "dtype") else np.asarray(X)
    shape = tuple(int(s) for s in X.shape)
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * 4)
    step = max(1, _BLOCK_BYTES // row_bytes)
    if memfile is not None:
        fd, path = os.dup(memfile.fd), memfile.path
    else:
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
                # The block's own buffer: no copy of it as bytes first.
                f.write(memoryview(block.reshape(-1)).cast("B"))
    except BaseException:
        if memfile is None:
            os.unlink(path)
        raise
    return path


def _copy(X, spill_dir, rows, cols, limit=0, **kw):
    """A :class:`Data` for a temporary copy of ``X`` (``write_npy``'s
    ``kw``): in memory when it takes at most ``limit`` bytes, else in a
    scratch directory of its own inside ``spill_dir``."""
    if rows * max(cols, 1) * 8 <= limit:
        scratch = _MemFile()
        try:
            return Data(write_npy(X, memfile=scratch, **kw), rows, cols, scratch)
        except BaseException:
            scratch.close()
            raise
    scratch = _core.ScratchDir(None if spill_dir is None else os.fspath(spill_dir))
    try:
        path = write_npy(X, scratch.path, **kw)
    except BaseException:
        scratch.close()
        raise
    return Data(path, rows, cols, scratch)


def vector(v, directory=None, dtype=np.float64, what="sample_weight", limit=0):
    """A :class:`Data` for the 1-D array ``v`` (weights, class indices):
    a temporary ``.npy`` of ``dtype`` (in memory up to ``limit`` bytes),
    removed by ``close``. None for None."""
    if v is None:
        return Data(os.devnull, 0, 0)
    return _copy(v, directory, len(v), 1, limit=limit, dtype=dtype, what=what)


def as_data(X, directory=None, limit=0):
    """A :class:`Data` for ``X``: its own file when the engine can read it,
    else a temporary copy (float32; in memory up to ``limit`` bytes)."""
    if isinstance(X, (str, os.PathLike)):
        rows, cols = _core.shape(os.fspath(X))
        return Data(X, rows, cols)
    whole = _whole_npy(X)
    if whole is not None:
        return Data(whole, X.shape[0], X.shape[1])
    return _copy(X, directory, X.shape[0], X.shape[1], limit=limit)
