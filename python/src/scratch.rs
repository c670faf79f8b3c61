//! `ScratchDir`: where the estimators write their temporary copies of
//! in-memory arrays. It is made, locked and removed as a runtime's spill
//! directory (`outcore::ScratchDir`), so that a copy left by a process
//! that was killed (SIGKILL, the OOM killer) is removed by the next run,
//! of the command line or of Python, that spills into the same directory.

use std::path::PathBuf;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

/// A private directory inside `spill_dir` (or the system's temporary
/// directory), removed by `close` (or when collected).
#[pyclass(module = "outcore._core")]
pub(crate) struct ScratchDir {
    dir: Option<outcore::ScratchDir>,
}

#[pymethods]
impl ScratchDir {
    #[new]
    #[pyo3(signature = (spill_dir=None))]
    fn new(spill_dir: Option<PathBuf>) -> PyResult<ScratchDir> {
        let dir = outcore::ScratchDir::create(spill_dir.as_deref())
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        Ok(ScratchDir { dir: Some(dir) })
    }

    /// Its path (a `ValueError` once closed).
    #[getter]
    fn path(&self) -> PyResult<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .ok_or_else(|| PyValueError::new_err("the scratch directory is closed"))
    }

    /// Removes it with what it holds (again: nothing).
    fn close(&mut self) {
        self.dir = None;
    }
}
