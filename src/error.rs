//! The library's one error type.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::units::format_bytes;

/// Executors are identified by a small number, shown as `executor #N` (and
/// by the name given at insertion, when there is one).
pub type ExecutorId = u64;

/// Everything that can go wrong in outcore. Messages name the executor, the
/// file, the sizes and the cap involved.
///
/// `Debug` prints the same message as `Display`, so that
/// `fn main() -> Result<(), outcore::Error>` (which prints the error with
/// `Debug`) shows it as it reads, with the advice it gives. Match on the
/// variant to tell errors apart.
#[non_exhaustive]
pub enum Error {
    /// A memory size or cap could not be parsed.
    BadSize {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An eviction policy name could not be parsed.
    UnknownPolicy {
        /// The text given.
        input: String,
    },
    /// A runtime with a memory cap was built, but
    /// [`TrapAlloc`](crate::TrapAlloc) is not the process's global
    /// allocator, so the cap could not be enforced.
    AllocatorNotInstalled {
        /// The cap asked for, in bytes.
        cap: u64,
    },
    /// The spill directory could not be created or is not usable.
    SpillDir {
        /// The directory.
        dir: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The directory given for spill files is one where other users could
    /// remove, rename or replace them: a symbolic link, a directory owned
    /// by another user than this one or root, or one writable by everyone
    /// without the sticky bit.
    SpillDirUnsafe {
        /// The directory.
        dir: PathBuf,
        /// Why it is refused.
        reason: String,
    },
    /// Writing an executor to its spill file failed (the executor stays in
    /// memory, intact). The source keeps the I/O error's kind, so a full
    /// disk ([`io::ErrorKind::StorageFull`]) can be told apart.
    SpillWrite {
        /// The executor.
        executor: String,
        /// The spill file.
        file: PathBuf,
        /// Bytes the executor holds in memory.
        bytes: usize,
        /// What failed.
        source: io::Error,
    },
    /// Loading an executor back failed: the file is missing, damaged or
    /// belongs to something else (kind [`io::ErrorKind::InvalidData`]). No
    /// data is handed back.
    SpillRead {
        /// The executor.
        executor: String,
        /// The spill file.
        file: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// Building an executor from its [`Lineage`](crate::Lineage) failed
    /// or panicked: the executor is damaged. No data is handed back.
    Rebuild {
        /// The executor.
        executor: String,
        /// What failed.
        source: io::Error,
    },
    /// A task panicked. If it had `&mut` access, its executor is poisoned
    /// (see [`Error::Poisoned`]).
    TaskPanicked {
        /// The executor the task ran on.
        executor: String,
        /// The panic message, when it was a string.
        message: String,
    },
    /// An earlier task panicked while it had `&mut` access to this executor,
    /// so its state may be half-updated; no further task runs on it.
    Poisoned {
        /// The executor.
        executor: String,
    },
    /// The handle does not belong to this runtime (it is another's, or
    /// its runtime was dropped), or the executor was removed: its last
    /// handle was dropped, or taken by
    /// [`Handle::into_inner`](crate::Handle::into_inner) or
    /// [`Handle::into_bytes`](crate::Handle::into_bytes), before the task
    /// could have it.
    UnknownExecutor {
        /// The executor.
        executor: String,
        /// The executor belonged to this runtime and was removed (else it
        /// belongs to another runtime, or to one dropped).
        removed: bool,
    },
    /// A task asked for the executor it runs on (a task of its own batch
    /// on it, or [`Handle::into_inner`](crate::Handle::into_inner)): it
    /// holds that executor until it returns, so the request would wait for
    /// itself.
    Reentrant {
        /// The executor.
        executor: String,
    },
    /// A task over several executors names executors that together (their
    /// sizes as last measured) are more than the memory cap: they could
    /// never be in memory at once, so the task does not run.
    TooLargeTogether {
        /// The executors and their sizes in bytes.
        executors: Vec<(String, usize)>,
        /// The memory cap in bytes.
        cap: u64,
    },
    /// The runtime was used in a child process created by `fork()`: its
    /// worker threads and spill files belong to the parent. The child may
    /// drop it (that leaves the parent's files alone) or start a runtime of
    /// its own.
    Forked {
        /// The process that started the runtime.
        owner: u32,
    },
    /// [`Handle::into_bytes`](crate::Handle::into_bytes) could not encode
    /// the executor (its `Serialize` failed or panicked); the handle was
    /// consumed, so the value is gone.
    ExportFailed {
        /// The executor.
        executor: String,
        /// Bytes it held in memory.
        bytes: usize,
        /// What failed.
        reason: String,
    },
    /// Bytes given to [`Runtime::insert_bytes`](crate::Runtime::insert_bytes)
    /// are not an exported executor of that type (damaged, cut short, or
    /// another type's).
    BadBytes {
        /// The executor the bytes were for.
        executor: String,
        /// How many bytes were given.
        bytes: u64,
        /// What is wrong with them.
        reason: String,
    },
    /// The runtime could not start (threads, registration with the
    /// allocator).
    Runtime(String),
    /// The runtime was asked to stop ([`Interrupter::interrupt`]): tasks
    /// not started by then do not run.
    ///
    /// [`Interrupter::interrupt`]: crate::Interrupter::interrupt
    Interrupted,
    /// Spill writes kept failing (a full or read-only spill filesystem)
    /// while the memory in use grew past the cap by more than an eighth:
    /// the runtime stopped, so that tasks not started by then do not run,
    /// rather than go on over its cap. The executors stay as they were.
    /// See [`Builder::stop_when_cap_lost`](crate::Builder::stop_when_cap_lost).
    CapLost {
        /// The cap, in bytes.
        cap: u64,
        /// Bytes in use when the runtime stopped.
        in_memory: u64,
        /// Spill writes that had failed by then.
        failed_writes: u64,
        /// The last failure: the spill file and the reason.
        last_error: String,
        /// Whether that failure was in the executor's own encoding (its
        /// `Serialize` returned an error or panicked), not in the file.
        by_value: bool,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadSize { input, reason } => write!(f, "invalid size '{input}': {reason}"),
            Error::UnknownPolicy { input } => write!(
                f,
                "unknown eviction policy '{input}' (expected 'priority' or 'lru')"
            ),
            Error::AllocatorNotInstalled { cap } => write!(
                f,
                "a memory cap of {} needs outcore::TrapAlloc as the global allocator, and this \
                 process uses another one; add \
                 `#[global_allocator] static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();` \
                 to the program",
                format_bytes(*cap)
            ),
            Error::SpillDir { dir, source } => {
                write!(f, "spill directory {}: {source}", dir.display())
            }
            Error::SpillDirUnsafe { dir, reason } => {
                write!(f, "spill directory {} refused: it {reason}", dir.display())
            }
            Error::SpillWrite {
                executor,
                file,
                bytes,
                source,
            } => write!(
                f,
                "could not write {executor} ({}) to {}: {source}; it stays in memory",
                format_bytes(*bytes as u64),
                file.display()
            ),
            Error::SpillRead {
                executor,
                file,
                source,
            } => {
                write!(
                    f,
                    "could not load {executor} from {}: {source}",
                    file.display()
                )
            }
            Error::Rebuild { executor, source } => {
                write!(f, "could not rebuild {executor} from its lineage: {source}")
            }
            Error::TaskPanicked { executor, message } => {
                write!(f, "task on {executor} panicked: {message}")
            }
            Error::Poisoned { executor } => write!(
                f,
                "{executor} is poisoned: an earlier task panicked while modifying it"
            ),
            Error::UnknownExecutor {
                executor,
                removed: true,
            } => write!(
                f,
                "{executor} was removed from the runtime (its last handle was dropped or taken) \
                 before the task could have it"
            ),
            Error::UnknownExecutor { executor, .. } => {
                write!(f, "{executor} does not belong to this runtime")
            }
            Error::Reentrant { executor } => write!(
                f,
                "a task on {executor} asked for {executor} itself, which it holds until it returns"
            ),
            Error::TooLargeTogether { executors, cap } => too_large(f, executors, *cap),
            Error::Forked { owner } => write!(
                f,
                "the runtime of process {owner} was used in process {}, a child created by fork(): its threads and spill files are the parent's",
                std::process::id()
            ),
            Error::ExportFailed { .. } | Error::BadBytes { .. } => moved(f, self),
            Error::Runtime(msg) => write!(f, "runtime: {msg}"),
            Error::Interrupted => write!(f, "interrupted: the runtime was asked to stop"),
            Error::CapLost { .. } => cap_lost(f, self),
        }
    }
}

/// The message of [`Error::CapLost`].
fn cap_lost(f: &mut fmt::Formatter<'_>, e: &Error) -> fmt::Result {
    let Error::CapLost {
        cap,
        in_memory,
        failed_writes,
        last_error,
        by_value,
    } = e
    else {
        return Ok(());
    };
    let hint = if *by_value {
        "the executors' type could not be encoded: its Serialize failed; no spill \
         directory can help"
    } else {
        "free space in the spill directory, or choose another"
    };
    write!(
        f,
        "cannot keep the cap of {}: {failed_writes} spill write(s) failed (the last: \
         {last_error}), and {} is in memory; the runtime stopped before the next task \
         ({hint})",
        format_bytes(*cap),
        format_bytes(*in_memory)
    )
}

/// The messages of [`Error::ExportFailed`] and [`Error::BadBytes`].
fn moved(f: &mut fmt::Formatter<'_>, e: &Error) -> fmt::Result {
    match e {
        Error::ExportFailed {
            executor,
            bytes,
            reason,
        } => write!(
            f,
            "{executor} ({}) could not be exported as bytes: {reason}",
            crate::units::format_bytes(*bytes as u64)
        ),
        Error::BadBytes {
            executor,
            bytes,
            reason,
        } => write!(
            f,
            "{executor}: the {} given are not an exported executor of its type: {reason}",
            crate::units::format_bytes(*bytes)
        ),
        _ => Ok(()),
    }
}

/// The message of [`Error::TooLargeTogether`].
fn too_large(f: &mut fmt::Formatter<'_>, executors: &[(String, usize)], cap: u64) -> fmt::Result {
    let total: u64 = executors.iter().map(|(_, b)| *b as u64).sum();
    let each: Vec<String> = executors
        .iter()
        .map(|(e, b)| format!("{e} ({})", format_bytes(*b as u64)))
        .collect();
    write!(
        f,
        "a task needs {} in memory together: {}, more than the memory cap of {}",
        each.join(", "),
        format_bytes(total),
        format_bytes(cap)
    )
}

/// The message, as [`Display`](fmt::Display) writes it: this is what
/// `main` and `unwrap` print.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::SpillDir { source, .. }
            | Error::SpillWrite { source, .. }
            | Error::SpillRead { source, .. }
            | Error::Rebuild { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
