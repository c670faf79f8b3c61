//! The jobs' error type: the runtime's errors, plus bad input and files
//! that cannot be read or written.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Everything that can go wrong in a job. Messages name the file, the
/// parameter and the values involved.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The runtime failed (spill files, a task, the cap).
    Runtime(outcore::Error),
    /// Bad input: malformed data, or parameters that do not fit it.
    Input(String),
    /// The job's working memory (its model, sums, sample and one task)
    /// does not fit the memory cap, or the machine's memory without one:
    /// the message says what it needs and the cap. Refused at the start.
    Memory(String),
    /// Bad input found by a collective check, so that every MPI rank has
    /// this same error at once (the ranks disagree on the data or the
    /// flags): rank 0 alone says it.
    Collective(String),
    /// A file could not be opened, read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done: `cannot open`, `read failed`, ...
        action: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// A value of the input is NaN or infinite, found where the rows are
    /// read: loading, rebuilding an evicted partition, or applying a model
    /// to new rows.
    NotFinite {
        /// Its row (from 0).
        row: u64,
        /// Its column (from 0).
        col: usize,
        /// NaN, not infinite.
        nan: bool,
        /// The file it is in, when it comes from one.
        path: Option<PathBuf>,
    },
    /// An output file cannot be written (other than an I/O error): the path
    /// is a directory, or the data does not match what was announced.
    Output {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, action: &'static str, source: io::Error) -> Error {
        Error::Io {
            path: path.into(),
            action,
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Runtime(e) => e.fmt(f),
            Error::Input(msg) | Error::Collective(msg) | Error::Memory(msg) => f.write_str(msg),
            Error::Io {
                path,
                action,
                source,
            } => write!(f, "{}: {action}: {source}", path.display()),
            Error::Output { path, reason } => write!(f, "{}: {reason}", path.display()),
            Error::NotFinite {
                row,
                col,
                nan,
                path,
            } => {
                if let Some(p) = path {
                    write!(f, "{}: ", p.display())?;
                }
                let what = if *nan { "NaN" } else { "infinite" };
                write!(
                    f,
                    "row {row}, column {col} is {what} (the data must be finite)"
                )
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the runtime's error is shown as itself.
            Error::Runtime(e) => e.source(),
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<outcore::Error> for Error {
    fn from(e: outcore::Error) -> Error {
        match e {
            // The input read again by an executor's lineage is malformed
            // or changed: bad input, named by the reader's message (a value
            // that is not finite as such).
            outcore::Error::Rebuild { source, .. }
                if matches!(
                    source.kind(),
                    io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
                ) =>
            {
                crate::npy::BadValue::of_read(&source)
            }
            e => Error::Runtime(e),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_refusal_by_the_cap_is_its_own_kind_and_says_its_line() {
        let line = "labelling with 8 centres on 4 dimensions needs 6.0 MiB at once (a task \
                    5.0 MiB, the centres 1.0 MiB), more than the memory cap of 4.0 MiB";
        let e = Error::Memory(line.into());
        assert_eq!(e.to_string(), line);
        assert!(std::error::Error::source(&e).is_none());
        assert!(!matches!(e, Error::Input(_) | Error::Collective(_)));
    }
}
