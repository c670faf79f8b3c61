//! Ranks: the jobs on several processes under MPI (the `mpi` feature), each
//! with its own outcore runtime, cap and spill directory, with results
//! that do not depend on the number of processes.
//!
//! Floating-point addition is not associative, so a plain
//! `MPI_Allreduce(SUM)` of per-rank sums changes the last bits of the
//! result with the number of ranks. The jobs instead cut their work into a
//! fixed number of *shards* (contiguous runs of tasks, independent of the
//! number of ranks), give each rank a contiguous run of shards, and add
//! the shards' partial sums in global shard order with
//! [`Ranks::ordered_sum`]: the result is bit for bit what one process
//! adding the same vectors in the same order gets.
//!
//! [`Ranks::single`] is the one-process case (no MPI needed); with the
//! `mpi` feature, `Ranks::init` initialises MPI (`MPI_THREAD_MULTIPLE` where
//! the library gives it, for the lenders' tier; at least `SERIALIZED`),
//! or takes the MPI another library of the process (mpi4py) initialised.
//! A `Ranks` may move between threads (a Python fit runs on a thread of
//! its own), and its calls are serialised by a lock; they are made from
//! the thread that calls the methods, never from the runtime's workers
//! or its allocator.
//!
//! Every method but [`Ranks::rank`], [`Ranks::size`] and the like is
//! collective: all ranks call it, in the same order. A rank that meets an
//! error the others do not must end the job with [`Ranks::abort`] (the
//! `outcore` command does): returning from `main` instead finalises MPI,
//! which waits for ranks that wait in a collective for it. A panic on
//! the thread that owns the `Ranks` aborts the job (`MPI_Abort`) for the
//! same reason.
//!
//! Results are the same bit for bit on any number of ranks when the ranks
//! run the same code on CPUs with the same features (the GEMM kernels are
//! chosen at run time by CPU features).
//!
//! ```
//! use outcore_jobs::ranks::{Ranks, Shards};
//! # #[global_allocator]
//! # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
//!
//! let ranks = Ranks::single();
//! // 10 tasks in 4 shards; this rank's shards and their tasks.
//! let shards = Shards::new(10, 4);
//! let mine = shards.of_rank(ranks.rank(), ranks.size());
//! let local: Vec<Vec<f64>> = mine
//!     .map(|s| shards.tasks(s).map(|t| t as f64).collect::<Vec<_>>())
//!     .map(|v| vec![v.iter().sum::<f64>(), v.len() as f64])
//!     .collect();
//! // The shards' vectors added in global shard order, on every rank.
//! let total = ranks.ordered_sum(&local, 2)?;
//! assert_eq!(total, vec![45.0, 10.0]);
//! # Ok::<(), outcore_jobs::Error>(())
//! ```

use std::ops::Range;

use crate::error::{Error, Result};

mod sums;
use sums::add;
pub(crate) use sums::ShardSums;

/// A fixed split of `tasks` tasks into shards of consecutive tasks (sizes
/// differing by at most one), and of the shards among ranks: rank `r` of
/// `n` owns a contiguous run of shards, so ranks hold contiguous runs of
/// tasks, in rank order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shards {
    tasks: u64,
    count: usize,
}

impl Shards {
    /// `tasks` tasks in `shards` shards (at most one per task, at least
    /// one).
    pub fn new(tasks: u64, shards: usize) -> Shards {
        let count = (shards.max(1) as u64).min(tasks.max(1)) as usize;
        Shards { tasks, count }
    }

    /// Number of shards.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Number of tasks.
    pub fn task_count(&self) -> u64 {
        self.tasks
    }

    /// The tasks of shard `s`.
    pub fn tasks(&self, s: usize) -> Range<u64> {
        let at = |j: usize| (j as u128 * self.tasks as u128 / self.count as u128) as u64;
        at(s)..at(s + 1)
    }

    /// The shards of rank `rank` among `ranks` (empty when there are more
    /// ranks than shards).
    pub fn of_rank(&self, rank: usize, ranks: usize) -> Range<usize> {
        let at = |r: usize| r * self.count / ranks.max(1);
        at(rank)..at(rank + 1)
    }

    /// The tasks of rank `rank` among `ranks`.
    pub fn tasks_of_rank(&self, rank: usize, ranks: usize) -> Range<u64> {
        let s = self.of_rank(rank, ranks);
        if s.is_empty() {
            let t = self.tasks(s.start.min(self.count - 1)).start;
            return t..t;
        }
        self.tasks(s.start).start..self.tasks(s.end - 1).end
    }
}

/// A 64-bit hash of `value`'s `Debug` text (FNV-1a): the same settings
/// give the same hash on every rank, whatever the platform.
pub fn hash_of(value: &impl std::fmt::Debug) -> u64 {
    format!("{value:?}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// `all` holds every rank's `n` values in rank order: the first value in
/// which a rank differs from rank 0, as an error naming the first such
/// rank and, when there are more, every rank that differs on it (see
/// [`Ranks::agree`]).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn check_agreement(names: &[&str], n: usize, all: &[u64]) -> Result<()> {
    let first = all.get(..n).unwrap_or_default();
    let value = |r: &[u64], i: usize| r.get(i).copied().unwrap_or_default();
    let differs = |i: usize| {
        all.chunks(n.max(1))
            .enumerate()
            .skip(1)
            .filter(move |(_, theirs)| value(theirs, i) != value(first, i))
    };
    let Some((i, (r, theirs))) = (0..n).find_map(|i| differs(i).next().map(|d| (i, d))) else {
        return Ok(());
    };
    let name = names.get(i).copied().unwrap_or("a value");
    let ranks: Vec<String> = differs(i).map(|(r, _)| r.to_string()).collect();
    let all_of = match ranks.len() {
        1 => String::new(),
        _ => format!("ranks {} differ from rank 0; ", ranks.join(", ")),
    };
    Err(Error::Collective(format!(
        "the ranks disagree on {name}: rank 0 has {}, rank {r} has {} ({all_of}every rank must be given the same data and flags)",
        value(first, i),
        value(theirs, i)
    )))
}

#[cfg(feature = "mpi")]
pub use mpi_impl::Role;

/// What [`Ranks::grow`] spawns, when set ([`Ranks::spawn_as`]).
type Command = (std::ffi::OsString, Vec<std::ffi::OsString>);
static SPAWN_AS: std::sync::Mutex<Option<Command>> = std::sync::Mutex::new(None);

/// The program and arguments [`Ranks::spawn_as`] set.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn spawn_command() -> Option<Command> {
    SPAWN_AS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The processes a job runs on: one, or the ranks of `MPI_COMM_WORLD`.
///
/// Clones share the one MPI world (finalised when the last is dropped, by
/// the thread that initialised MPI, if outcore did), so a
/// [`Session`](crate::Session) and its caller can both hold it.
#[derive(Clone)]
pub struct Ranks {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Single,
    #[cfg(feature = "mpi")]
    Mpi(std::sync::Arc<mpi_impl::World>),
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranks")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl Ranks {
    /// One process, no MPI.
    pub fn single() -> Ranks {
        Ranks {
            inner: Inner::Single,
        }
    }

    /// Initialises MPI (`MPI_THREAD_MULTIPLE` where the library gives it,
    /// at least `SERIALIZED`) and returns the ranks of
    /// `MPI_COMM_WORLD`; MPI is finalised when the last clone is dropped,
    /// which must be on the thread that called this. When another library
    /// of the process (mpi4py) initialised MPI already, at thread level
    /// Serialized or above, its `MPI_COMM_WORLD` is taken and finalising
    /// is left to that library. Call it once per process.
    #[cfg(feature = "mpi")]
    pub fn init() -> Result<Ranks> {
        Ranks::init_as(Role::Worker)
    }

    /// [`Ranks::init`] for a process of the given role: under `mpirun`,
    /// the lenders (`outcore lend`, started beside the job with `:`)
    /// leave the workers' ranks, and the workers' collectives are theirs
    /// alone. Collective over `MPI_COMM_WORLD`, lenders included.
    #[cfg(feature = "mpi")]
    pub fn init_as(role: Role) -> Result<Ranks> {
        Ok(Ranks {
            inner: Inner::Mpi(std::sync::Arc::new(mpi_impl::World::init(role)?)),
        })
    }

    /// The spill tier over the lenders' memory, when there are lenders
    /// (see [`crate::remote`]).
    #[cfg(feature = "mpi")]
    pub fn remote_tier(&self) -> Option<std::sync::Arc<crate::remote::RemoteTier>> {
        match &self.inner {
            Inner::Single => None,
            Inner::Mpi(w) => w.remote_tier(),
        }
    }

    /// On a sharing worker ([`Role::Sharing`]): lends the memory its
    /// work leaves under `cap` bytes (less an eighth, at least 32 MiB) to
    /// the other workers, and returns the images it keeps for them, for
    /// its runtime to take memory back from before evicting its own
    /// executors ([`outcore::Builder::reclaim`]). `None` on any other
    /// process (and without MPI).
    #[cfg(feature = "mpi")]
    pub fn share(&self, cap: u64) -> Option<std::sync::Arc<dyn outcore::Reclaim>> {
        match &self.inner {
            Inner::Single => None,
            Inner::Mpi(w) => w.share(cap),
        }
    }

    /// What this process kept for the other ranks: the most bytes at
    /// once, and the bytes it gave back for its own work (0 and 0 when
    /// it lends nothing).
    pub fn kept_for_others(&self) -> (u64, u64) {
        match &self.inner {
            Inner::Single => (0, 0),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.kept_for_others(),
        }
    }

    /// Spawns `n` lenders (`outcore lend --mem-cap cap`) on free slots
    /// of the allocation, beside the ranks. Collective over the ranks.
    #[cfg(feature = "mpi")]
    pub fn spawn_lenders(&self, n: usize, cap: &str) -> Result<()> {
        match &self.inner {
            Inner::Single => Err(Error::Input(
                "lenders are spawned under mpirun only (one process here)".into(),
            )),
            Inner::Mpi(w) => w.spawn_lenders(n, cap),
        }
    }

    /// For a lender: serves the workers until each has said goodbye,
    /// holding at most `budget` bytes of their images.
    #[cfg(feature = "mpi")]
    pub fn lend(&self, budget: u64) -> Result<crate::remote::Lent> {
        match &self.inner {
            Inner::Single => Err(Error::Input(
                "outcore lend runs under mpirun, beside a job (mpirun ... : -np 1 outcore lend)"
                    .into(),
            )),
            Inner::Mpi(w) => w.lend(budget),
        }
    }

    /// The processes lending their memory beside the ranks (`outcore
    /// lend`): 0 without MPI, and on a lender.
    pub fn lenders(&self) -> usize {
        match &self.inner {
            Inner::Single => 0,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.lenders(),
        }
    }

    /// This process's rank (0 for a single process).
    pub fn rank(&self) -> usize {
        match &self.inner {
            Inner::Single => 0,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.rank(),
        }
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        match &self.inner {
            Inner::Single => 1,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.size(),
        }
    }

    /// Ranks running on this node (this one included), which share its
    /// memory.
    pub fn on_node(&self) -> usize {
        match &self.inner {
            Inner::Single => 1,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.on_node(),
        }
    }

    /// Whether this is rank 0, the one that prints and writes outputs.
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// The element-wise sum of every rank's `local` vectors (each of
    /// `len` values), added in global order (rank 0's vectors in their
    /// order, then rank 1's, and so on) starting from zeros: on every
    /// rank, bit for bit what one process adding all the vectors in that
    /// order gets. Collective: every rank calls it with the same `len`.
    ///
    /// Each rank folds one slice of the vectors (an all-to-all of the
    /// slices, then an all-gather of the sums): a rank sends and receives
    /// about (its vectors + all vectors / ranks) x `len` x 8 bytes.
    pub fn ordered_sum(&self, local: &[Vec<f64>], len: usize) -> Result<Vec<f64>> {
        if let Some(v) = local.iter().find(|v| v.len() != len) {
            return Err(Error::Input(format!(
                "ordered_sum: a vector of {} values where {len} were announced",
                v.len()
            )));
        }
        match &self.inner {
            Inner::Single => {
                let mut acc = crate::zeros::<f64>(len);
                for v in local {
                    add(&mut acc, v);
                }
                Ok(acc)
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.ordered_sum(local, len),
        }
    }

    /// Every rank's `local` values, concatenated in rank order, on every
    /// rank.
    pub fn all_gather(&self, local: &[f32]) -> Result<Vec<f32>> {
        match &self.inner {
            Inner::Single => Ok(local.to_vec()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.all_gather(local),
        }
    }

    /// [`Ranks::all_gather`] of `u32`s (a fit's labels, rank after rank).
    pub fn all_gather_u32(&self, local: &[u32]) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Single => Ok(local.to_vec()),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.all_gather(local),
        }
    }

    /// Rank 0's `bytes` on every rank, whatever their length elsewhere
    /// (a report rank 0 made). Collective.
    pub fn broadcast_bytes(&self, bytes: &mut Vec<u8>) {
        match &self.inner {
            Inner::Single => {
                let _ = bytes;
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.broadcast_bytes(bytes),
        }
    }

    /// Streams the other ranks' bytes to rank 0, rank after rank, a piece
    /// of at most `piece` bytes at a time: every rank but 0 sends its
    /// `len` bytes, each piece filled by `read`; rank 0 hands the pieces
    /// of rank 1, then of rank 2, and so on, to `write` (its own `len` and
    /// `read` are not used). Only a piece is held at once on each side:
    /// rank 0 can write everything into one file, in rank order, without
    /// holding it. Nothing to do on one process. Collective.
    pub fn funnel(
        &self,
        len: u64,
        piece: usize,
        read: impl FnMut(&mut [u8]) -> Result<()>,
        write: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        match &self.inner {
            Inner::Single => {
                let _ = (len, piece, read, write);
                Ok(())
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.funnel(len, piece.max(1), read, write),
        }
    }

    /// Each rank's `local` values (the same count on every rank), one
    /// vector per rank, on rank 0 (`None` on the others).
    pub fn gather_rows(&self, local: &[f64]) -> Result<Option<Vec<Vec<f64>>>> {
        match &self.inner {
            Inner::Single => Ok(Some(vec![local.to_vec()])),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.gather_rows(local),
        }
    }

    /// Rank 0's `values` on every rank (the same length everywhere).
    pub fn broadcast(&self, values: &mut [f32]) {
        match &self.inner {
            Inner::Single => {
                let _ = values;
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.broadcast(values),
        }
    }

    /// Rank `root`'s `values` on every rank (the same length everywhere):
    /// a model handed on from the rank that updated it last.
    pub fn broadcast_from(&self, root: usize, values: &mut [f64]) {
        match &self.inner {
            Inner::Single => {
                let _ = (root, values);
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.broadcast_from(root, values),
        }
    }

    /// Checks that every rank holds the same `values` (what it read of the
    /// data and the settings it was given): ranks that disagree would
    /// exchange vectors of different lengths (a fatal MPI error, with no
    /// message of ours) or, worse, compute a different result without an
    /// error. Collective: every rank calls it with as many values, named
    /// by `names` (one per value) in the error.
    ///
    /// # Errors
    ///
    /// [`Error::Collective`] on every rank when any rank's values differ
    /// from rank 0's, naming the first such rank and value.
    pub fn agree(&self, names: &[&str], values: &[u64]) -> Result<()> {
        match &self.inner {
            Inner::Single => {
                let _ = (names, values);
                Ok(())
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => check_agreement(names, values.len(), &w.all_gather_u64(values)),
        }
    }

    /// Every rank's `values` (as many on every rank), concatenated in
    /// rank order, on every rank. Collective.
    pub fn all_gather_u64(&self, values: &[u64]) -> Vec<u64> {
        match &self.inner {
            Inner::Single => values.to_vec(),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.all_gather_u64(values),
        }
    }

    /// Rank 0's `values` on every rank. Collective.
    pub fn broadcast_u64(&self, values: &mut [u64]) {
        match &self.inner {
            Inner::Single => {
                let _ = values;
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.broadcast_u64(values),
        }
    }

    /// The slots of the allocation the job runs in (`MPI_UNIVERSE_SIZE`,
    /// which `mpirun --host` and batch schedulers set), when the launcher
    /// says; one process without MPI has one.
    pub fn universe(&self) -> Option<usize> {
        match &self.inner {
            Inner::Single => Some(1),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.universe_size(),
        }
    }

    /// Whether the ranks are MPI's (else one process without MPI, which
    /// cannot grow).
    pub fn is_mpi(&self) -> bool {
        !matches!(self.inner, Inner::Single)
    }

    /// Whether this process was spawned by a job that grew
    /// ([`Ranks::grow`]): it joined the ranks after they started, and
    /// takes part from their growth on.
    pub fn joined(&self) -> bool {
        match &self.inner {
            Inner::Single => false,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.joined,
        }
    }

    /// Whether this process was spawned by a job that grew and has not yet
    /// met that growth (`grow::join`, which the job's load runs): its
    /// first job joins the ranks instead of loading on its own.
    pub fn join_pending(&self) -> bool {
        match &self.inner {
            Inner::Single => false,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.join_pending.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Notes that this spawned process has met the growth.
    pub(crate) fn joined_now(&self) {
        #[cfg(feature = "mpi")]
        if let Inner::Mpi(w) = &self.inner {
            w.join_pending
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Sets the program, and its arguments, that [`Ranks::grow`] spawns in
    /// this process from now on, instead of this process's own
    /// executable and arguments: a Python script's ranks run the
    /// interpreter the script runs on (`sys.executable`, which
    /// `/proc/self/exe` gives with its symbolic links resolved: outside a
    /// virtualenv) with the script's arguments.
    pub fn spawn_as(program: std::ffi::OsString, args: Vec<std::ffi::OsString>) {
        *SPAWN_AS.lock().unwrap_or_else(|p| p.into_inner()) = Some((program, args));
    }

    /// Adds `extra` ranks: spawns `extra` processes running this program
    /// with this process's arguments, or what [`Ranks::spawn_as`] set
    /// (`MPI_Comm_spawn`), and merges them
    /// in, after the ranks already there. Every clone of this `Ranks` then
    /// has the new size, and every collective includes the new ranks,
    /// which start as [`joined`](Ranks::joined) ranks (their
    /// `Ranks::init` returns once merged). Collective over the ranks
    /// before growth.
    ///
    /// # Errors
    ///
    /// On every rank, when the spawn fails (no free slot in the
    /// allocation, say): the spawn runs under `MPI_ERRORS_RETURN`, so the
    /// ranks go on as they were. Always on one process without MPI.
    pub fn grow(&self, extra: usize) -> Result<()> {
        match &self.inner {
            Inner::Single => Err(Error::Input(format!(
                "one process without MPI cannot grow by {extra} ranks"
            ))),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.grow(extra),
        }
    }

    /// Whether every rank calls this within `wait` of this rank's call
    /// (always on one process): after an error, whether every rank met
    /// it, or some wait in a collective this rank left (then the ranks
    /// are out of step, and only [`Ranks::abort`] ends them; no other
    /// collective may follow). Collective, but a rank that does not come
    /// is what it finds out.
    pub fn all_arrive(&self, wait: std::time::Duration) -> bool {
        match &self.inner {
            Inner::Single => {
                let _ = wait;
                true
            }
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.all_arrive(wait),
        }
    }

    /// Waits for every rank.
    pub fn barrier(&self) {
        match &self.inner {
            Inner::Single => {}
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.barrier(),
        }
    }

    /// Ends every rank's process with exit status `code` (`MPI_Abort`);
    /// for a single process, exits.
    pub fn abort(&self, code: i32) -> ! {
        match &self.inner {
            Inner::Single => std::process::exit(code),
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.abort(code),
        }
    }
}

#[cfg(feature = "mpi")]
mod mpi_impl;

#[cfg(test)]
mod agreement_tests {
    use super::check_agreement;

    #[test]
    fn the_first_rank_and_value_that_differ_are_named() {
        let names = ["the rows", "the dimensions"];
        assert!(check_agreement(&names, 2, &[10, 3, 10, 3, 10, 3]).is_ok());
        let e = check_agreement(&names, 2, &[10, 3, 10, 3, 8, 3])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the ranks disagree on the rows: rank 0 has 10, rank 2 has 8"),
            "{e}"
        );
        let e = check_agreement(&names, 2, &[10, 3, 10, 4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("on the dimensions: rank 0 has 3, rank 1 has 4"),
            "{e}"
        );
        assert!(!e.contains("ranks 1"), "one rank differs: {e}");
        // Every rank that differs on that value is named.
        let e = check_agreement(&names, 2, &[10, 3, 10, 4, 10, 3, 10, 5])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0 has 3, rank 1 has 4 (ranks 1, 3 differ from rank 0; "),
            "{e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{Ranks, Shards};

    #[test]
    fn shards_cover_every_task_once_and_ranks_hold_runs_of_them() {
        for tasks in [0u64, 1, 2, 7, 40, 41, 1000] {
            for count in [1usize, 3, 8, 64] {
                let s = Shards::new(tasks, count);
                assert!(s.count() >= 1 && s.count() as u64 <= tasks.max(1));
                let mut next = 0;
                for j in 0..s.count() {
                    let t = s.tasks(j);
                    assert_eq!(t.start, next);
                    assert!(t.end - t.start <= tasks.div_ceil(s.count() as u64));
                    next = t.end;
                }
                assert_eq!(next, tasks);
                for ranks in 1..=s.count() {
                    let mut at = 0;
                    for r in 0..ranks {
                        let mine = s.of_rank(r, ranks);
                        assert_eq!(mine.start, at);
                        assert!(!mine.is_empty());
                        at = mine.end;
                        let t = s.tasks_of_rank(r, ranks);
                        assert_eq!(t.start, s.tasks(mine.start).start);
                        assert_eq!(t.end, s.tasks(mine.end - 1).end);
                    }
                    assert_eq!(at, s.count());
                }
            }
        }
    }

    #[test]
    fn one_process_adds_in_order() {
        let r = Ranks::single();
        let v = vec![vec![1e16, 1.0], vec![1.0, 2.0], vec![-1e16, 3.0]];
        // ((0 + 1e16) + 1) - 1e16 = 0 in this order: not the exact 1.
        assert_eq!(r.ordered_sum(&v, 2).unwrap(), vec![0.0, 6.0]);
        assert!(r.ordered_sum(&v, 3).is_err());
        assert_eq!(r.all_gather(&[1.0, 2.0]).unwrap(), vec![1.0, 2.0]);
        let mut wrote = 0;
        r.funnel(
            8,
            4,
            |_| Ok(()),
            |_| {
                wrote += 1;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(wrote, 0, "one process has no other rank's bytes");
    }
}
