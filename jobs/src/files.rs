//! Files in and out: opening an input with its length, and writing an
//! output atomically.
//!
//! Every output (`.npy` arrays, the JSON statistics) goes through
//! [`AtomicFile`]: the bytes are written to a temporary file in the
//! target's directory, which is renamed over the target only once it is
//! complete. A run that fails or is interrupted leaves no file that looks
//! valid, and no temporary file either (it is removed when dropped).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use tempfile::NamedTempFile;

use crate::error::{Error, Result};

/// Opens an input file: the file and its length in bytes.
pub(crate) fn open_input(path: &Path) -> Result<(File, u64)> {
    if path.is_dir() {
        return Err(Error::Input(format!("{}: is a directory", path.display())));
    }
    let file = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "cannot read its size", e))?
        .len();
    Ok((file, len))
}

/// An output file written in full or not at all.
///
/// Bytes go to a temporary file next to the target (same directory, so the
/// final rename stays on one filesystem); [`AtomicFile::commit`] syncs it
/// and renames it over the target. Dropped without a commit, the temporary
/// file is removed and the target is untouched.
#[derive(Debug)]
pub(crate) struct AtomicFile {
    out: BufWriter<NamedTempFile>,
    path: PathBuf,
}

impl AtomicFile {
    /// Starts writing `path`. Fails when `path` is a directory or its
    /// directory cannot hold a new file.
    pub(crate) fn create(path: &Path) -> Result<AtomicFile> {
        if path.is_dir() {
            return Err(Error::Output {
                path: path.to_path_buf(),
                reason: "is a directory".into(),
            });
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".outcore-partial-")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(|e| Error::io(path, "cannot write", e))?;
        Ok(AtomicFile {
            out: BufWriter::with_capacity(1 << 20, tmp),
            path: path.to_path_buf(),
        })
    }

    /// The file being written.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends bytes.
    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(|e| Error::io(&self.path, "cannot write", e))
    }

    /// Flushes and syncs the temporary file and renames it over the
    /// target.
    pub(crate) fn commit(self) -> Result<()> {
        let path = self.path;
        let err = |e| Error::io(&path, "cannot write", e);
        let tmp = self.out.into_inner().map_err(|e| err(e.into_error()))?;
        tmp.as_file().sync_all().map_err(err)?;
        tmp.persist(&path).map_err(|e| err(e.error))?;
        Ok(())
    }
}

/// Checks that `path` can be written (it is not a directory, and its
/// directory takes a new file) before any work is done. Nothing is left
/// behind.
pub fn check_writable(path: &Path) -> Result<()> {
    AtomicFile::create(path).map(drop)
}

/// Writes `value` as pretty-printed JSON to `path`, atomically.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Output {
        path: path.to_path_buf(),
        reason: format!("cannot encode as JSON: {e}"),
    })?;
    let mut f = AtomicFile::create(path)?;
    f.write_all(text.as_bytes())?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncommitted_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"{}").unwrap();
        drop(f);
        assert!(!p.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_committed_file_replaces_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        std::fs::write(&p, "old").unwrap();
        write_json(&p, &[1, 2]).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "[\n  1,\n  2\n]");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn check_writable_names_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_writable(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = check_writable(Path::new("/nonexistent-dir/x.npy"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent-dir/x.npy"), "{e}");
        assert!(check_writable(&dir.path().join("ok.npy")).is_ok());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
