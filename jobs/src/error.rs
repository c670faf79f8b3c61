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
                BadValue::of_read(&source)
            }
            e => Error::Runtime(e),
        }
    }
}

/// A value `npy::check_finite` refuses: not finite, or too large to square
/// in float32. As an `io::Error`'s payload it keeps its kind through the
/// readers, and [`BadValue::into_error`] makes it the jobs' error.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BadValue {
    /// The file, once known.
    pub(crate) path: Option<std::path::PathBuf>,
    pub(crate) row: u64,
    pub(crate) col: usize,
    pub(crate) value: f32,
}

impl BadValue {
    /// `self` in the file at `path`.
    pub(crate) fn at(mut self, path: &std::path::Path) -> BadValue {
        self.path = Some(path.to_path_buf());
        self
    }

    /// The jobs' error: [`Error::NotFinite`] for NaN and the infinities,
    /// else bad input.
    pub(crate) fn into_error(self) -> Error {
        if self.value.is_finite() {
            return Error::Input(self.to_string());
        }
        Error::NotFinite {
            row: self.row,
            col: self.col,
            nan: self.value.is_nan(),
            path: self.path,
        }
    }

    /// The jobs' error for a read error `e`: its [`BadValue`] when it
    /// carries one (as its payload, or further down: the runtime hands a
    /// failed load's error on inside its own), else bad input named by its
    /// message.
    pub(crate) fn of_read(e: &std::io::Error) -> Error {
        let mut at: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(x) = at {
            if let Some(b) = x.downcast_ref::<BadValue>() {
                return b.clone().into_error();
            }
            // An io::Error's source skips its payload: look at the payload.
            at = match x
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(p) => Some(p),
                None => x.source(),
            };
        }
        Error::Input(e.to_string())
    }
}

impl std::fmt::Display for BadValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (row, col, v) = (self.row, self.col, self.value);
        if !v.is_finite() {
            // Error::NotFinite's words.
            return self.clone().into_error().fmt(f);
        }
        if let Some(p) = &self.path {
            write!(f, "{}: ", p.display())?;
        }
        write!(
            f,
            "row {row}, column {col} is {v:e}, too large: its square overflows float32 (values must be below about 1.8e19 in magnitude; scale the data)"
        )
    }
}

impl std::error::Error for BadValue {}

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
