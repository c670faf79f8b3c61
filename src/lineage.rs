//! Lineage: how to rebuild an executor's value from where it came from,
//! instead of writing it to a spill file and reading it back.

use std::io;

/// How to rebuild an executor's value from its source (a region of an
/// input file, a generator's seed): its *lineage*.
///
/// An executor inserted with a lineage
/// ([`Runtime::insert_lazy`](crate::Runtime::insert_lazy),
/// [`Runtime::insert_with_lineage`](crate::Runtime::insert_with_lineage))
/// is never written to a spill file while it stays clean: eviction drops
/// it, and the next task that needs it calls [`Lineage::rebuild`] (on the
/// thread that loads it: a worker, or the prefetcher ahead of the sweep).
/// Once a `write` task (or a read task that calls
/// [`TaskContext::mark_dirty`](crate::TaskContext::mark_dirty)) changes it,
/// its value no longer matches the lineage, and it is spilled like any
/// other executor.
///
/// Closures `Fn() -> io::Result<T>` are lineages.
///
/// # Contract
///
/// - `rebuild` returns a value equal to the one the executor was inserted
///   with (or first built with), every time. A lineage that reads a file
///   should check that the file has not changed since the first read and
///   return an error if it has ([`Checksum`](crate::Checksum) of the bytes
///   at the first read, compared at each rebuild, costs about a memory
///   read of them).
/// - An error or a panic makes the executor *damaged*: the task gets
///   [`Error::Rebuild`](crate::Error::Rebuild) naming the executor, and the
///   runtime goes on.
/// - It may allocate (its memory is the executor's), and may use
///   threads, but must not call back into the runtime that owns the
///   executor.
pub trait Lineage<T>: Send + Sync + 'static {
    /// Builds the value again.
    ///
    /// # Errors
    ///
    /// When the source can no longer give the same value (a file that
    /// changed or disappeared, a read error).
    fn rebuild(&self) -> io::Result<T>;

    /// Whether the lineage is used again after an eviction (the default).
    /// A lineage that costs more than a spill write and a read back (a
    /// generator that keeps the CPU busy) returns `false`: it then only
    /// spares the first build (no load phase), and the executor is spilled
    /// from its first eviction on.
    fn repeatable(&self) -> bool {
        true
    }
}

impl<T, F> Lineage<T> for F
where
    F: Fn() -> io::Result<T> + Send + Sync + 'static,
{
    fn rebuild(&self) -> io::Result<T> {
        self()
    }
}
