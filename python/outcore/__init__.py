"""outcore: scikit-learn estimators that run under a memory cap.

K-means (:class:`KMeans`, :class:`MiniBatchKMeans`), logistic
regression (:class:`LogisticRegression`), least squares
(:class:`LinearRegression`, :class:`Ridge`), SGD (:class:`SGDClassifier`,
:class:`SGDRegressor`) and :class:`PCA` on data
larger than memory: the
engine keeps parts of the data on disk and reads them back as its passes
need them, within ``mem_cap``. A path or a ``np.memmap`` of a ``.npy`` is
read from its file, so its pages do not pile up in the process.

>>> import numpy as np, outcore
>>> X = np.random.default_rng(0).normal(size=(1000, 8)).astype(np.float32)
>>> km = outcore.KMeans(n_clusters=4, random_state=0, mem_cap="64MiB").fit(X)
>>> km.cluster_centers_.shape
(4, 8)
"""
import atexit
import os

try:
    from . import _core
except ImportError as e:  # a module built with MPI, and no MPI library here
    if "libmpi" not in str(e):
        raise
    raise ImportError(
        f"outcore was built with MPI, but the MPI library cannot be loaded ({e}); "
        "install it (Open MPI: libopenmpi), or reinstall outcore without MPI: pip install ./python"
    ) from None
from ._kmeans import KMeans, MiniBatchKMeans
from ._linear import LinearRegression, Ridge
from ._logistic import LogisticRegression
from ._pca import PCA, IncrementalPCA
from ._sgd import SGDClassifier, SGDRegressor

__all__ = [
    "KMeans", "MiniBatchKMeans", "IncrementalPCA", "LinearRegression", "LogisticRegression", "PCA", "Ridge",
    "SGDClassifier", "SGDRegressor",
]
__version__ = "0.1.0"

# A fit's runtime ends on a thread of its own after the fit returns; the
# interpreter's exit waits for it, so that its spill directory is gone, and
# so does a fork (a child must not inherit an engine that no thread of its
# own will end).
#
# Under mpirun, MPI is finalised (or, when a fit failed on some ranks only,
# every rank is ended) once the engine has ended: registered first, so it
# runs after ``finish``.
atexit.register(_core.mpi_end)
atexit.register(_core.finish)
os.register_at_fork(before=_core.finish)
