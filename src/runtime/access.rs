//! How a task holds one of its executors: read side by side, read alone,
//! or written. Its own file so that the queue (which orders tasks) and
//! the pins (which count what running tasks hold) can both name it
//! without depending on each other.

/// How a task holds one of its executors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Access {
    /// Reads it side by side with other tasks that do (a read of a task
    /// over several executors: the executor's type is `Sync`).
    Shared,
    /// Reads it alone (a task on one executor: its type need not be
    /// `Sync`).
    Alone,
    /// Writes it (alone).
    Write,
}

impl Access {
    pub fn writes(self) -> bool {
        self == Access::Write
    }
}
