//! `outcore._core`: the engine behind the Python package `outcore` (see
//! `python/outcore`). The estimators are written in Python; this module
//! runs the jobs on files (`.npy`, `.npz`, `.fvecs`) the Python side names
//! or writes, with the GIL released while the engine works.

use pyo3::exceptions::{PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

mod apply;
mod fit;
mod kmeans;
mod ranks;
mod run;
mod scratch;
mod train;

/// Everything the engine allocates counts against the cap.
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

/// A job's error as the Python exception scikit-learn users expect: bad
/// input a `ValueError`, a cap too small for the model a `MemoryError`,
/// a file an `OSError`, the rest a `RuntimeError`. The message is the
/// command line's.
pub(crate) fn to_py(e: outcore_jobs::Error) -> PyErr {
    use outcore_jobs::Error;
    let msg = e.to_string();
    match e {
        Error::NotFinite { row, col, nan, .. } => PyValueError::new_err(format!(
            "Input X contains {} at row {row}, column {col}",
            if nan { "NaN" } else { "infinity" }
        )),
        Error::Memory(_) => PyMemoryError::new_err(msg),
        Error::Input(_) | Error::Collective(_) => PyValueError::new_err(msg),
        Error::Io { .. } | Error::Output { .. } => PyOSError::new_err(msg),
        Error::Runtime(
            outcore::Error::TooLargeTogether { .. } | outcore::Error::CapLost { .. },
        ) => PyMemoryError::new_err(msg),
        Error::Runtime(outcore::Error::BadSize { .. }) => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// The rows and columns of a data file.
#[pyfunction]
fn shape(path: std::path::PathBuf) -> PyResult<(u64, usize)> {
    outcore_jobs::Source::from_path(&path, None)
        .and_then(|s| s.shape())
        .map_err(to_py)
}

/// Bytes in a size such as `"512MiB"` (the command line's units).
#[pyfunction]
fn parse_size(s: &str) -> PyResult<u64> {
    outcore::parse_size(s).map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(shape, m)?)?;
    m.add_function(wrap_pyfunction!(apply::apply_rows, m)?)?;
    m.add_function(wrap_pyfunction!(run::finish, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(kmeans::kmeans_fit, m)?)?;
    m.add_function(wrap_pyfunction!(train::logistic_fit, m)?)?;
    m.add_function(wrap_pyfunction!(fit::linear_fit, m)?)?;
    m.add_function(wrap_pyfunction!(fit::pca_fit, m)?)?;
    m.add_function(wrap_pyfunction!(fit::sgd_fit, m)?)?;
    m.add_function(wrap_pyfunction!(ranks::mpi_rank, m)?)?;
    m.add_function(wrap_pyfunction!(ranks::mpi_built, m)?)?;
    m.add_function(wrap_pyfunction!(ranks::mpi_end, m)?)?;
    m.add_function(wrap_pyfunction!(ranks::lend, m)?)?;
    m.add_class::<run::Settings>()?;
    m.add_class::<scratch::ScratchDir>()?;
    Ok(())
}
