//! The jobs' error type.

use std::fmt;

/// What can go wrong in a job: the runtime's errors, bad input, and
/// outputs that cannot be written. Messages speak of files, shapes and
/// parameters, never of command-line flags (the command line adds those).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The runtime failed (see [`outcore::Error`]).
    Runtime(outcore::Error),
    /// Bad input: a malformed or unreadable file, inconsistent parameters.
    Input(String),
    /// An output file could not be written.
    Output(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Runtime(e) => e.fmt(f),
            Error::Input(msg) | Error::Output(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Runtime(e) => Some(e),
            _ => None,
        }
    }
}

impl From<outcore::Error> for Error {
    fn from(e: outcore::Error) -> Error {
        Error::Runtime(e)
    }
}

/// `Result` with the jobs' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
