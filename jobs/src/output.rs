//! Output files written whole or not at all: the data goes to a temporary
//! file in the target's directory, which is synced and renamed over the
//! target only when complete. A failed or interrupted run never leaves a
//! file that looks valid.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A file being written; [`AtomicFile::commit`] moves it into place, and
/// dropping it uncommitted removes the temporary file.
#[derive(Debug)]
pub struct AtomicFile {
    tmp: tempfile::NamedTempFile,
    out: BufWriter<File>,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`.
    ///
    /// # Errors
    ///
    /// [`Error::Output`] when no temporary file can be made beside `path`.
    pub fn create(path: &Path) -> Result<AtomicFile> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let err = output_error(path);
        let tmp = tempfile::Builder::new()
            .prefix(".outcore-partial-")
            .suffix(".tmp")
            .tempfile_in(&dir)
            .map_err(&err)?;
        let out = BufWriter::with_capacity(1 << 20, tmp.as_file().try_clone().map_err(&err)?);
        Ok(AtomicFile {
            tmp,
            out,
            path: path.to_path_buf(),
        })
    }

    /// The target path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends bytes.
    ///
    /// # Errors
    ///
    /// [`Error::Output`] naming the target when the write fails.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(output_error(&self.path))
    }

    /// Flushes, syncs and renames the file into place.
    ///
    /// # Errors
    ///
    /// [`Error::Output`] naming the target when any step fails (the
    /// temporary file is then removed).
    pub fn commit(mut self) -> Result<()> {
        let err = output_error(&self.path);
        self.out.flush().map_err(&err)?;
        self.tmp.as_file().sync_all().map_err(&err)?;
        self.tmp.persist(&self.path).map_err(|e| err(e.error))?;
        Ok(())
    }
}

/// Writes `bytes` to `path` whole or not at all.
///
/// # Errors
///
/// [`Error::Output`] naming `path`.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.commit()
}

/// The error for a failed write of `path`.
fn output_error(path: &Path) -> impl Fn(io::Error) -> Error + '_ {
    move |e| Error::Output(format!("{}: cannot write: {e}", path.display()))
}
