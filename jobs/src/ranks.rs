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
//! `mpi` feature, `Ranks::init` initialises MPI (`MPI_THREAD_FUNNELED`:
//! every MPI call is made from the thread that initialised MPI, never from
//! the runtime's workers or its allocator).
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

/// The processes a job runs on: one, or the ranks of `MPI_COMM_WORLD`.
///
/// Clones share the one MPI world (finalised when the last is dropped),
/// so a [`Session`](crate::Session) and its caller can both hold it.
#[derive(Clone)]
pub struct Ranks {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Single,
    #[cfg(feature = "mpi")]
    Mpi(std::rc::Rc<mpi_impl::World>),
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

    /// Initialises MPI (at most once per process) and returns the ranks of
    /// `MPI_COMM_WORLD`. MPI is finalised when the value is dropped.
    #[cfg(feature = "mpi")]
    pub fn init() -> Result<Ranks> {
        Ok(Ranks {
            inner: Inner::Mpi(std::rc::Rc::new(mpi_impl::World::init()?)),
        })
    }

    /// This process's rank (0 for a single process).
    pub fn rank(&self) -> usize {
        match &self.inner {
            Inner::Single => 0,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.rank.get(),
        }
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        match &self.inner {
            Inner::Single => 1,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.size.get(),
        }
    }

    /// Ranks running on this node (this one included), which share its
    /// memory.
    pub fn on_node(&self) -> usize {
        match &self.inner {
            Inner::Single => 1,
            #[cfg(feature = "mpi")]
            Inner::Mpi(w) => w.on_node.get(),
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

    /// Adds `extra` ranks: spawns `extra` processes running this program
    /// with this process's arguments (`MPI_Comm_spawn`) and merges them
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

/// Each local shard's vector made by additions, then the shards'
/// vectors added in shard order across the ranks: what
/// [`Ranks::ordered_sum`] of the shards' vectors gives, bit for bit,
/// without holding every shard's vector on one process.
///
/// On one process, with the shards coming in order, a shard's vector is
/// added to the total as soon as the next one opens: two vectors are held
/// whatever the number of shards (a model-sized sum is as large as a
/// partition of the data). Otherwise every local shard's vector is kept
/// for the combine.
pub(crate) struct ShardSums {
    len: usize,
    /// One process, shards in order: the total and the open shard.
    streaming: Option<(Vec<f64>, Option<Open>)>,
    /// Every local shard's vector (not streaming).
    kept: Vec<Vec<f64>>,
}

/// The shard a streaming [`ShardSums`] adds to, and its vector.
type Open = (usize, Vec<f64>);

impl ShardSums {
    /// Sums of `len` values over `shards` local shards on `ranks`;
    /// `in_order`: the shards will come in order.
    pub(crate) fn new(ranks: &Ranks, shards: usize, len: usize, in_order: bool) -> ShardSums {
        let streaming = ranks.size() == 1 && in_order;
        ShardSums {
            len,
            streaming: streaming.then(|| (crate::zeros(len), None)),
            kept: if streaming {
                Vec::new()
            } else {
                (0..shards).map(|_| crate::zeros(len)).collect()
            },
        }
    }

    /// The vector of local shard `s`, to add to. Streaming, opening a
    /// shard closes the one before it; a shard closed cannot open again.
    pub(crate) fn shard(&mut self, s: usize) -> Result<&mut [f64]> {
        let len = self.len;
        let Some((total, open)) = self.streaming.as_mut() else {
            return self
                .kept
                .get_mut(s)
                .map(Vec::as_mut_slice)
                .ok_or_else(|| Error::Input(format!("internal: no local shard {s}")));
        };
        match open {
            Some((at, _)) if *at == s => {}
            Some((at, _)) if *at > s => {
                return Err(Error::Input(format!(
                    "internal: shard {s} after shard {at} in an ordered sum"
                )))
            }
            _ => {
                if let Some((_, v)) = open.take() {
                    add(total, &v);
                }
                *open = Some((s, crate::zeros(len)));
            }
        }
        Ok(open.as_mut().map_or(&mut [][..], |(_, v)| v.as_mut_slice()))
    }

    /// The sum over every rank's shards. Collective.
    pub(crate) fn finish(self, ranks: &Ranks) -> Result<Vec<f64>> {
        match self.streaming {
            Some((mut total, open)) => {
                if let Some((_, v)) = open {
                    add(&mut total, &v);
                }
                Ok(total)
            }
            None => ranks.ordered_sum(&self.kept, self.len),
        }
    }
}

/// `a += b`, element by element.
fn add(a: &mut [f64], b: &[f64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

#[cfg(feature = "mpi")]
mod mpi_impl {
    use mpi::datatype::{Partition, PartitionMut};
    use mpi::environment::Universe;
    use mpi::point_to_point::{Destination, Source};
    use std::cell::{Cell, Ref, RefCell};

    use mpi::topology::{InterCommunicator, MergeOrder, SimpleCommunicator};
    use mpi::traits::{AsRaw, Communicator, CommunicatorCollectives, Root};
    use mpi::Threading;

    use super::add;
    use crate::error::{Error, Result};

    /// Values an ordered sum sends through MPI at once, from each vector
    /// (8 MiB of f64).
    const SUM_PIECE: usize = 1 << 20;

    pub(super) struct World {
        /// The ranks: `MPI_COMM_WORLD`'s, or after growth the merged
        /// communicator of the ranks started and those spawned.
        comm: RefCell<SimpleCommunicator>,
        // Dropped after `comm`: finalises MPI.
        universe: Universe,
        // MPI is used from the thread that initialised it only.
        _not_send: std::marker::PhantomData<*const ()>,
        pub rank: Cell<usize>,
        pub size: Cell<usize>,
        pub on_node: Cell<usize>,
        /// Spawned by a job that grew: joined it after its start.
        pub joined: bool,
    }

    /// MPI counts are C ints.
    fn count(n: usize, what: &str) -> Result<i32> {
        i32::try_from(n).map_err(|_| {
            Error::Input(format!(
                "{what}: {n} values in one MPI message, more than MPI's count allows"
            ))
        })
    }

    /// Offsets of consecutive blocks of `counts` values; an error when
    /// they add up to more than a C int.
    fn displacements(counts: &[i32]) -> Result<Vec<i32>> {
        let mut at = 0i32;
        let mut out = Vec::with_capacity(counts.len());
        for &c in counts {
            out.push(at);
            at = at.checked_add(c).ok_or_else(|| {
                Error::Input("more values in one MPI collective than MPI's count allows".into())
            })?;
        }
        Ok(out)
    }

    impl Drop for World {
        fn drop(&mut self) {
            // Unwinding out of the thread that owns MPI: finalising would
            // wait for ranks that wait for this one. End the job instead.
            if std::thread::panicking() {
                use std::io::Write as _;
                // One write: `mpirun` could put another rank's output
                // inside a line written in pieces.
                let line = format!(
                    "outcore: error: rank {} of {}: panicked; ending every rank\n",
                    self.rank.get(),
                    self.size.get()
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
                self.comm().abort(101);
            }
        }
    }

    impl World {
        pub fn init() -> Result<World> {
            let (universe, provided) = mpi::initialize_with_threading(Threading::Funneled)
                .ok_or_else(|| Error::Input("MPI was already initialised".into()))?;
            if provided < Threading::Funneled {
                return Err(Error::Input(format!(
                    "the MPI library provides thread level {provided:?}; outcore's worker threads need at least Funneled"
                )));
            }
            let world = universe.world();
            // Spawned by a job that grew: the parents merge with us
            // (they first, in their order), then split by node.
            let (comm, joined) = match world.parent() {
                Some(parent) => (parent.merge(MergeOrder::High), true),
                None => (world, false),
            };
            let on_node = comm.split_shared(0).size() as usize;
            Ok(World {
                rank: Cell::new(comm.rank() as usize),
                size: Cell::new(comm.size() as usize),
                on_node: Cell::new(on_node),
                joined,
                comm: RefCell::new(comm),
                universe,
                _not_send: std::marker::PhantomData,
            })
        }

        fn comm(&self) -> Ref<'_, SimpleCommunicator> {
            self.comm.borrow()
        }

        /// `MPI_UNIVERSE_SIZE`: the slots of the allocation, when the
        /// launcher says.
        pub fn universe_size(&self) -> Option<usize> {
            // Test hook: more slots than the allocation has, to see a
            // spawn fail.
            let claimed = std::env::var("OUTCORE_FAULT_UNIVERSE_SIZE").ok();
            claimed
                .and_then(|v| v.parse().ok())
                .or_else(|| self.universe.size())
        }

        /// Spawns `extra` processes running this program with this
        /// process's arguments and merges them in after the ranks there
        /// are: from then on every collective includes them. Collective.
        /// A failed spawn is an error on every rank, not an abort.
        pub fn grow(&self, extra: usize) -> Result<()> {
            let inter = self.spawn(extra)?;
            let merged = inter.merge(MergeOrder::Low);
            drop(inter);
            let on_node = merged.split_shared(0).size() as usize;
            self.rank.set(merged.rank() as usize);
            self.size.set(merged.size() as usize);
            self.on_node.set(on_node);
            *self.comm.borrow_mut() = merged;
            Ok(())
        }

        /// `MPI_Comm_spawn` of `extra` copies of this program, under
        /// `MPI_ERRORS_RETURN` (a failure is an error code, not an abort),
        /// its outcome agreed on by every rank.
        fn spawn(&self, extra: usize) -> Result<InterCommunicator> {
            use std::ffi::CString;
            use std::os::unix::ffi::OsStrExt;
            let failed =
                |what: String| Error::Input(format!("could not spawn {extra} ranks: {what}"));
            let exe = std::env::current_exe().map_err(|e| failed(e.to_string()))?;
            let prog =
                CString::new(exe.as_os_str().as_bytes()).map_err(|e| failed(e.to_string()))?;
            let args = std::env::args_os()
                .skip(1)
                .map(|a| CString::new(a.as_bytes()))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| failed(e.to_string()))?;
            let mut argv: Vec<*mut std::ffi::c_char> = args
                .iter()
                .map(|a| a.as_ptr().cast_mut())
                .chain(std::iter::once(std::ptr::null_mut()))
                .collect();
            let n = count(extra, "spawn")?;
            let mut codes = vec![0i32; extra];
            let comm = self.comm();
            // SAFETY: `comm` is a live communicator this thread owns (MPI
            // is used from the thread that initialised it only);
            // `MPI_ERRORS_RETURN` is a predefined handler.
            unsafe {
                mpi::ffi::MPI_Comm_set_errhandler(comm.as_raw(), mpi::ffi::RSMPI_ERRORS_RETURN);
            }
            // SAFETY: reads a constant handle the MPI shim defines.
            let mut raw = unsafe { mpi::ffi::RSMPI_COMM_NULL };
            // SAFETY: `prog` and every `argv` string live until the call
            // returns; `argv` ends with a null pointer; `codes` holds
            // `extra` ints; `raw` is written by the call. Every rank of
            // `comm` makes the call (collective), root 0's arguments used.
            let rc = unsafe {
                mpi::ffi::MPI_Comm_spawn(
                    prog.as_ptr(),
                    argv.as_mut_ptr(),
                    n,
                    mpi::ffi::RSMPI_INFO_NULL,
                    0,
                    comm.as_raw(),
                    &mut raw,
                    codes.as_mut_ptr(),
                )
            };
            // The root's error codes are its own: agree on the outcome.
            let ok = i32::from(rc == 0 && (self.rank.get() != 0 || codes.iter().all(|&c| c == 0)));
            let mut all = 0i32;
            comm.all_reduce_into(&ok, &mut all, mpi::collective::SystemOperation::min());
            // SAFETY: reads a constant handle the MPI shim defines.
            let comm_null = unsafe { mpi::ffi::RSMPI_COMM_NULL };
            // A failed spawn may leave `raw` anything (OpenMPI 4 writes a
            // null pointer, not MPI_COMM_NULL): wrapped only on success.
            let inter = (all == 1 && raw != comm_null)
                // SAFETY: every rank's spawn succeeded, so `raw` is the
                // call's new intercommunicator, owned from here on by the
                // value.
                .then(|| unsafe { InterCommunicator::try_from_raw(raw) })
                .flatten();
            inter.ok_or_else(|| {
                failed(format!(
                    "MPI_Comm_spawn returned error {rc} (the allocation may have no free slot)"
                ))
            })
        }

        pub fn ordered_sum(&self, local: &[Vec<f64>], len: usize) -> Result<Vec<f64>> {
            let n = self.size.get();
            if n == 1 {
                // The same fold, without copying through MPI.
                let mut acc = crate::zeros::<f64>(len);
                for v in local {
                    add(&mut acc, v);
                }
                return Ok(acc);
            }
            // How many vectors each rank adds.
            let mine = count(local.len(), "ordered_sum")?;
            let mut counts = vec![0i32; n];
            self.comm().all_gather_into(&mine, &mut counts[..]);
            // Piece by piece: what goes through MPI at once is a few times
            // a piece, not a few times every vector (model-sized sums
            // are as large as a partition of the data).
            let mut out = crate::zeros::<f64>(len);
            let mut at = 0;
            while at < len {
                let end = (at + SUM_PIECE).min(len);
                self.ordered_sum_piece(local, &counts, at..end, &mut out[at..end])?;
                at = end;
            }
            Ok(out)
        }

        /// [`ordered_sum`](Self::ordered_sum) of the values `range` of the
        /// vectors (every rank's vector counts in `counts`) into `out`.
        fn ordered_sum_piece(
            &self,
            local: &[Vec<f64>],
            counts: &[i32],
            range: std::ops::Range<usize>,
            out: &mut [f64],
        ) -> Result<()> {
            let n = self.size.get();
            let len = range.len();
            let bound = |j: usize| j * len / n;
            // Slice j of every local vector goes to rank j.
            let mut send = Vec::with_capacity(local.len() * len);
            let mut scounts = Vec::with_capacity(n);
            for j in 0..n {
                let (a, b) = (range.start + bound(j), range.start + bound(j + 1));
                for v in local {
                    send.extend_from_slice(&v[a..b]);
                }
                scounts.push(count(local.len() * (b - a), "ordered_sum")?);
            }
            let width = bound(self.rank.get() + 1) - bound(self.rank.get());
            let rcounts = counts
                .iter()
                .map(|&m| count(m as usize * width, "ordered_sum"))
                .collect::<Result<Vec<i32>>>()?;
            let total: usize = rcounts.iter().map(|&c| c as usize).sum();
            let mut recv = crate::zeros::<f64>(total);
            {
                let sd = displacements(&scounts)?;
                let rd = displacements(&rcounts)?;
                let s = Partition::new(&send[..], &scounts[..], &sd[..]);
                let mut r = PartitionMut::new(&mut recv[..], &rcounts[..], &rd[..]);
                self.comm().all_to_all_varcount_into(&s, &mut r);
            }
            drop(send);
            // This rank's slice, added in global order: the vectors arrive
            // by source rank, each rank's in its order.
            let mut acc = crate::zeros::<f64>(width);
            if width > 0 {
                for v in recv.chunks_exact(width) {
                    add(&mut acc, v);
                }
            }
            drop(recv);
            let widths = (0..n)
                .map(|j| count(bound(j + 1) - bound(j), "ordered_sum"))
                .collect::<Result<Vec<i32>>>()?;
            let wd = displacements(&widths)?;
            let mut r = PartitionMut::new(out, &widths[..], &wd[..]);
            self.comm().all_gather_varcount_into(&acc[..], &mut r);
            Ok(())
        }

        pub fn all_gather(&self, local: &[f32]) -> Result<Vec<f32>> {
            let mine = count(local.len(), "all_gather")?;
            let mut counts = vec![0i32; self.size.get()];
            self.comm().all_gather_into(&mine, &mut counts[..]);
            let total: usize = counts.iter().map(|&c| c as usize).sum();
            count(total, "all_gather")?;
            let d = displacements(&counts)?;
            let mut out = crate::zeros::<f32>(total);
            {
                let mut r = PartitionMut::new(&mut out[..], &counts[..], &d[..]);
                self.comm().all_gather_varcount_into(local, &mut r);
            }
            Ok(out)
        }

        pub fn funnel(
            &self,
            len: u64,
            piece: usize,
            mut read: impl FnMut(&mut [u8]) -> Result<()>,
            mut write: impl FnMut(&[u8]) -> Result<()>,
        ) -> Result<()> {
            let lens = self.all_gather_u64(&[len]);
            let mut buf = crate::zeros::<u8>(piece);
            let pieces = |n: u64| {
                (0..n.div_ceil(piece as u64))
                    .map(move |i| (n - i * piece as u64).min(piece as u64) as usize)
            };
            let comm = self.comm();
            if self.rank.get() != 0 {
                let root = comm.process_at_rank(0);
                for n in pieces(len) {
                    read(&mut buf[..n])?;
                    root.send(&buf[..n]);
                }
                return Ok(());
            }
            for (r, &n) in lens.iter().enumerate().skip(1) {
                let from = comm.process_at_rank(r as i32);
                for n in pieces(n) {
                    from.receive_into(&mut buf[..n]);
                    write(&buf[..n])?;
                }
            }
            Ok(())
        }

        pub fn gather_rows(&self, local: &[f64]) -> Result<Option<Vec<Vec<f64>>>> {
            let comm = self.comm();
            let root = comm.process_at_rank(0);
            if self.rank.get() != 0 {
                root.gather_into(local);
                return Ok(None);
            }
            let mut all = crate::zeros::<f64>(local.len() * self.size.get());
            root.gather_into_root(local, &mut all[..]);
            Ok(Some(
                all.chunks(local.len().max(1))
                    .map(<[f64]>::to_vec)
                    .collect(),
            ))
        }

        pub fn broadcast(&self, values: &mut [f32]) {
            self.comm().process_at_rank(0).broadcast_into(values);
        }

        /// Every rank's `values` (as many on every rank), in rank order.
        pub fn all_gather_u64(&self, values: &[u64]) -> Vec<u64> {
            let mut all = vec![0u64; values.len() * self.size.get()];
            self.comm().all_gather_into(values, &mut all[..]);
            all
        }

        pub fn broadcast_u64(&self, values: &mut [u64]) {
            self.comm().process_at_rank(0).broadcast_into(values);
        }

        pub fn barrier(&self) {
            self.comm().barrier();
        }

        pub fn abort(&self, code: i32) -> ! {
            self.comm().abort(code)
        }
    }
}

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
