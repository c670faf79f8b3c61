//! The runtime: executors, tasks, eviction, loading and prefetching.
//!
//! ```text
//!  Batch::run ──► pending seqs on each slot ──► worker pool (N threads)
//!                          │                        │ acquire: load if evicted,
//!                          ▼                        │ pin, run, unpin
//!                  eviction ranks ◄─────────────────┘
//!                 (policy + plan)      prefetchers (4 threads): load upcoming
//!                          │           executors, evicting only ones needed later
//!                          ▼
//!      TrapAlloc ──► Evictor::evict_for_trap (try-locks only)
//! ```
//!
//! One job a file:
//!
//! - `mod.rs`: [`Runtime`], the public API;
//! - `access.rs`: how a task holds an executor (read side by side, read
//!   alone, written);
//! - `builder.rs`: [`Builder`], starting (and, on failure, stopping) the
//!   threads;
//! - `handle.rs`: [`Handle`];
//! - `batch.rs`: [`Batch`], tasks and their results;
//! - `queue.rs`: a batch's tasks not started yet, in the order workers
//!   may take them;
//! - `join.rs`: what a task sees ([`TaskContext`], and [`Join`] and
//!   [`Key`] for tasks over several executors);
//! - `pool.rs`: the worker pool, the prefetchers' signal;
//! - `pins.rs`: what running tasks pin, so that joins side by side stay
//!   under the cap;
//! - `shared.rs`: the state the threads share;
//! - `registry.rs`: executors and their declared cycles (several per
//!   runtime);
//! - `ranked.rs`: executors ranked by one registry scan, reused across
//!   decisions (victims, next loads);
//! - `evict.rs`: victim choice, eviction, making room, the trap's entry;
//! - `writes.rs`: spill-write failures and backoff, fault injection;
//! - `load.rs`: loading and pinning;
//! - `prefetch.rs`: the prefetchers.

mod access;
mod batch;
mod builder;
mod evict;
mod handle;
mod join;
mod load;
mod pins;
mod pool;
mod prefetch;
mod queue;
mod ranked;
mod registry;
mod shared;
mod writes;

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use batch::Batch;
pub use builder::{Builder, MAX_WORKERS};
pub use handle::Handle;
pub use join::{AnyHandle, Join, Key, ReadHandle, TaskContext};
pub use registry::CycleId;

use crate::alloc::Registration;
use crate::error::{ExecutorId, Result};
use crate::executor::{RebuildFn, Slot};
use crate::lineage::Lineage;
use crate::policy::EvictionPolicy;
use crate::stats::{Footprint, Stats};
use shared::Shared;

/// Asks a [`Runtime`] to stop (see [`Runtime::interrupter`]). Cheap to
/// clone and to send to another thread.
#[derive(Clone, Debug)]
pub struct Interrupter(Arc<std::sync::atomic::AtomicBool>);

impl Interrupter {
    /// Asks the runtime to stop: tasks not started yet fail with
    /// [`Error::Interrupted`](crate::Error::Interrupted). It stays so.
    pub fn interrupt(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the runtime was asked to stop.
    pub fn is_interrupted(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The outcore runtime: owns executors, runs tasks on them, and evicts them
/// to disk under memory pressure.
///
/// Dropping the runtime stops its threads and removes its spill directory.
///
/// ```
/// use outcore::{MemoryCap, PodVec, Runtime};
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
/// let rt = Runtime::builder().mem_cap(MemoryCap::parse("64MiB")?).build()?;
/// let h = rt.insert(PodVec::from(vec![1.0f32; 1 << 20]))?;
/// let sum = rt.read(&h, |v: &PodVec<f32>| v.iter().sum::<f32>())?;
/// assert_eq!(sum, (1 << 20) as f32);
/// # Ok::<(), outcore::Error>(())
/// ```
pub struct Runtime {
    shared: Arc<Shared>,
    registration: Option<Registration>,
    threads: Vec<JoinHandle<()>>,
    prefetchers: Vec<JoinHandle<()>>,
    workers: usize,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("cap", &self.shared.soft_cap())
            .field("policy", &self.shared.policy())
            .field("workers", &self.workers)
            .field("spill_dir", &self.shared.store().dir())
            .field("executors", &self.shared.registry().len())
            .finish()
    }
}

impl Runtime {
    /// A builder with the defaults: no cap, one worker per core, priority
    /// eviction, a temporary spill directory, prefetch on.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Worker threads.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The soft cap in bytes, if any.
    pub fn cap(&self) -> Option<u64> {
        self.shared.soft_cap()
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.shared.policy()
    }

    /// The private spill directory.
    pub fn spill_dir(&self) -> &Path {
        self.shared.store().dir()
    }

    /// Whether the spill directory is on a filesystem held in memory
    /// (tmpfs or ramfs): what is evicted there stays in memory (or swap),
    /// and counts against a container's memory limit, so a cap saves
    /// nothing. The default spill directory avoids a `/tmp` in memory
    /// when `/var/tmp` is on a disk (see [`Builder::spill_dir`]).
    ///
    /// [`Builder::spill_dir`]: crate::Builder::spill_dir
    pub fn spill_dir_in_memory(&self) -> bool {
        crate::spill::in_memory(self.spill_dir()) == Some(true)
    }

    /// Hands `value` to the runtime and returns its handle.
    ///
    /// # Errors
    ///
    /// [`Error::Forked`](crate::Error::Forked) in a child process created
    /// by `fork()`; [`Error::CapLost`](crate::Error::CapLost) once spill
    /// writes keep failing past the cap (see
    /// [`Builder::stop_when_cap_lost`](crate::Builder::stop_when_cap_lost)).
    pub fn insert<T>(&self, value: T) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        self.insert_named(None, value)
    }

    /// Like [`Runtime::insert`], with a name shown in messages.
    ///
    /// # Errors
    ///
    /// As [`Runtime::insert`].
    pub fn insert_named<T>(&self, name: Option<&str>, value: T) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let size = encoded_len(&value);
        self.insert_slot(name, Some(value), None, size)
    }

    /// Registers the executor whose bytes [`Handle::into_bytes`] gave, in
    /// this runtime (of this process or of another: the bytes are the
    /// spill format, which is the same on every machine of the same
    /// architecture). The bytes are checked (length, checksum, the type's
    /// fingerprint) and decoded into the value, held in memory as after
    /// [`Runtime::insert`]. This is how an executor moves from one runtime
    /// to another, over a network say, without a spill file between them.
    ///
    /// ```
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let a = outcore::Runtime::builder().build()?;
    /// let b = outcore::Runtime::builder().build()?;
    /// let h = a.insert(vec![1u32, 2, 3])?;
    /// let bytes = h.into_bytes()?; // gone from `a`
    /// let moved = b.insert_bytes::<Vec<u32>>(None, &bytes)?;
    /// assert_eq!(b.read(&moved, |v| v.clone())?, vec![1, 2, 3]);
    /// assert!(b.insert_bytes::<Vec<u64>>(None, &bytes).is_err()); // another type
    /// # Ok::<(), outcore::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::BadBytes`](crate::Error::BadBytes) when the bytes are not
    /// an exported executor of type `T`; [`Error::Forked`](crate::Error::Forked)
    /// in a child process created by `fork()`.
    pub fn insert_bytes<T>(&self, name: Option<&str>, bytes: &[u8]) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        self.shared.check_process()?;
        // The value's `Deserialize` is user code: a panic is bad bytes.
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::spill::decode_bytes::<T>(bytes, handle::export_key::<T>())
        }))
        .unwrap_or_else(|_| Err("decoding panicked".into()));
        let value = decoded.map_err(|reason| crate::Error::BadBytes {
            executor: name.map_or_else(
                || format!("an executor of type {}", std::any::type_name::<T>()),
                str::to_string,
            ),
            bytes: bytes.len() as u64,
            reason,
        })?;
        self.insert_named(name, value)
    }

    /// Registers an executor that is built when a task first needs it, by
    /// `lineage`, and rebuilt by it after each eviction while it stays
    /// clean: it is never written to a spill file until a task changes it.
    /// `size_hint` is the memory it will take, in bytes (used to make room
    /// before it is built; the measured size replaces it).
    ///
    /// This is how data that can be read again from its source (a region
    /// of an input file) or regenerated (from a seed) avoids a load phase
    /// and spill writes. See [`Lineage`] for the contract.
    ///
    /// ```
    /// # fn main() -> outcore::Result<()> {
    /// let rt = outcore::Runtime::builder().workers(1).build()?;
    /// // Rows 1000..2000 of some source, built on first use.
    /// let h = rt.insert_lazy(Some("rows 1000.."), 1000 * 4, || {
    ///     Ok((1000..2000u32).collect::<Vec<u32>>())
    /// })?;
    /// assert_eq!(h.state(), outcore::State::Evicted);
    /// assert_eq!(rt.read(&h, |v| v[0])?, 1000);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Forked`](crate::Error::Forked) in a child process created
    /// by `fork()`.
    pub fn insert_lazy<T, L>(
        &self,
        name: Option<&str>,
        size_hint: usize,
        lineage: L,
    ) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        L: Lineage<T>,
    {
        self.insert_slot(name, None, Some(erase(lineage)), size_hint)
    }

    /// Like [`Runtime::insert_named`] for a value that `lineage` can
    /// rebuild: while the executor stays clean, eviction drops it instead
    /// of writing it. See [`Runtime::insert_lazy`] and [`Lineage`].
    ///
    /// # Errors
    ///
    /// [`Error::Forked`](crate::Error::Forked) in a child process created
    /// by `fork()`.
    pub fn insert_with_lineage<T, L>(
        &self,
        name: Option<&str>,
        value: T,
        lineage: L,
    ) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        L: Lineage<T>,
    {
        let size = encoded_len(&value);
        self.insert_slot(name, Some(value), Some(erase(lineage)), size)
    }

    fn insert_slot<T>(
        &self,
        name: Option<&str>,
        value: Option<T>,
        lineage: Option<(RebuildFn, bool)>,
        size: usize,
    ) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let sh = &self.shared;
        sh.check_process()?;
        if let Some(e) = sh.cap_lost() {
            return Err(e);
        }
        let id = sh.new_executor_id();
        let label = match name {
            Some(n) => format!("executor #{id} ({n})"),
            None => format!("executor #{id}"),
        };
        let resident = value.is_some();
        let evicted = sh.evicted_count();
        let slot = Arc::new(Slot::new(
            id,
            label,
            value,
            lineage,
            size,
            sh.tick(),
            evicted,
        ));
        let n = sh.registry().insert(id, slot.clone());
        sh.room_to_rank(n);
        sh.bump_generation();
        if resident {
            sh.note_size(&slot, 0);
            sh.make_room(0, None);
        } else {
            sh.note_evicted();
        }
        Ok(Handle {
            slot: Some(slot),
            shared: Arc::downgrade(sh),
            runtime: sh.ident(),
            _t: PhantomData,
        })
    }

    /// Starts a batch of tasks whose results have type `R`.
    pub fn batch<R: Send + 'static>(&self) -> Batch<'_, R> {
        Batch::new(&self.shared)
    }

    /// Runs one read-only task on `h` and returns its result. The task
    /// must not change the value, not even through interior mutability:
    /// see the contract on [`Batch::read`].
    ///
    /// # Errors
    ///
    /// As [`Batch::run`].
    pub fn read<T, R, F>(&self, h: &Handle<T>, f: F) -> Result<R>
    where
        T: 'static,
        R: Send + 'static,
        F: FnOnce(&T) -> R + Send + 'static,
    {
        let mut b = self.batch();
        b.read(h, f);
        b.run().map(|mut v| v.remove(0))
    }

    /// Runs one task with `&mut` access on `h` and returns its result.
    ///
    /// # Errors
    ///
    /// As [`Batch::run`].
    pub fn write<T, R, F>(&self, h: &Handle<T>, f: F) -> Result<R>
    where
        T: 'static,
        R: Send + 'static,
        F: FnOnce(&mut T) -> R + Send + 'static,
    {
        let mut b = self.batch();
        b.write(h, f);
        b.run().map(|mut v| v.remove(0))
    }

    /// Declares that the job sweeps these executors in this order, over and
    /// over (an epoch of iterative training), and returns the new cycle's
    /// id. The next few executors of the cycle are then prefetched and
    /// kept, and the rest are ranked in a fixed order spread over the
    /// cycle, so the part of the cycle that stays resident is the same
    /// every sweep and the loads are spread between resident executors.
    ///
    /// A runtime holds any number of cycles (two jobs, or two datasets,
    /// each declare their own). An executor is in one cycle at a time:
    /// declaring it again moves it to the new cycle. A cycle whose
    /// executors have all been dropped or moved is forgotten.
    ///
    /// In a child process created by `fork()` it does nothing (the runtime
    /// is the parent's).
    ///
    /// An executor named more than once is needed at each of those
    /// positions: it ranks by the next one the sweep comes to.
    pub fn hint_cycle(&self, order: impl IntoIterator<Item = ExecutorId>) -> CycleId {
        self.hint_cycle_steps(order.into_iter().map(std::iter::once))
    }

    /// Declares a cycle of *steps*, each naming the executors one task
    /// meets together (see [`Batch::task`]): a data block and the model
    /// block it joins, say. As [`Runtime::hint_cycle`], with each step in
    /// place of one executor: the executors of the next few steps are
    /// prefetched together, and an executor that several steps name (a
    /// model block that every data block of a row meets) is kept for the
    /// next step that needs it, so the sweep of the data blocks does not
    /// push it out between its uses.
    ///
    /// ```
    /// # fn main() -> outcore::Result<()> {
    /// let rt = outcore::Runtime::builder().workers(1).build()?;
    /// let model = rt.insert(vec![0.0f64; 4])?;
    /// let data: Vec<_> = (0..3).map(|i| rt.insert(vec![i as f64; 4])).collect::<Result<_, _>>()?;
    /// // Each step joins one data block with the model.
    /// let cycle = rt.hint_cycle_steps(data.iter().map(|d| [d.id(), model.id()]));
    /// assert_eq!(model.cycle_position(), Some((cycle, 0)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn hint_cycle_steps<S>(&self, steps: impl IntoIterator<Item = S>) -> CycleId
    where
        S: IntoIterator<Item = ExecutorId>,
    {
        if self.shared.check_process().is_err() {
            return CycleId(0);
        }
        let steps = registry::Steps::new(steps);
        let id = self.shared.registry().declare_cycle(steps);
        self.shared.bump_generation();
        id
    }

    /// A handle that asks the runtime to stop, from any thread: tasks not
    /// started by then fail with [`Error::Interrupted`](crate::Error::Interrupted)
    /// (those running finish), so a job that passes errors on returns
    /// within about one task. For a Ctrl-C from a thread that waits on the
    /// job, or a deadline.
    ///
    /// ```
    /// # fn main() -> outcore::Result<()> {
    /// let rt = outcore::Runtime::builder().workers(1).build()?;
    /// let h = rt.insert(1u32)?;
    /// rt.interrupter().interrupt();
    /// assert!(matches!(rt.read(&h, |v: &u32| *v), Err(outcore::Error::Interrupted)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn interrupter(&self) -> Interrupter {
        Interrupter(self.shared.interrupt_flag().clone())
    }

    /// Evicts idle executors (highest rank first) until `bytes` more
    /// fit under the cap with the runtime's headroom. Call it before a large
    /// allocation the runtime cannot foresee, such as a task that builds a
    /// big value, so that room is made ahead of time instead of in the
    /// allocation trap. Returns whether the bytes fit (always true with no
    /// cap).
    ///
    /// Without a cap nothing is evicted, but the freed pages the allocator
    /// keeps for reuse are returned to the system when they are more than
    /// 1/64 of the bytes in use: call it after freeing a large temporary
    /// (a sample, a model-sized vector), so that the resident set `top`
    /// shows follows the bytes in use. The runtime does the same after
    /// each load.
    pub fn make_room(&self, bytes: usize) -> bool {
        self.shared.check_process().is_ok() && self.shared.make_room(bytes, None)
    }

    /// Evicts every idle executor now (writing the dirty ones). Returns how
    /// many were evicted.
    ///
    /// # Errors
    ///
    /// [`Error::SpillWrite`](crate::Error::SpillWrite) for the first write
    /// that fails (that executor stays in memory);
    /// [`Error::Forked`](crate::Error::Forked) in a child process created
    /// by `fork()`.
    pub fn evict_all(&self) -> Result<usize> {
        self.shared.check_process()?;
        self.shared.evict_all()
    }

    /// The last spill write that failed (file and reason), if any: a full
    /// or broken spill directory. The executor stayed in memory.
    pub fn last_spill_error(&self) -> Option<String> {
        self.shared.writes().last_error()
    }

    /// Number of executors currently in memory (0 in a child process
    /// created by `fork()`, where the runtime is the parent's).
    pub fn resident_count(&self) -> usize {
        if self.shared.check_process().is_err() {
            return 0;
        }
        self.shared.registry().count_in_memory()
    }

    /// The executors' sizes by where they are: in memory or evicted (one
    /// scan of the registry, under its lock). With [`Stats::evicted_bytes`]
    /// and [`Stats::loaded_bytes`] read at two points of a sweep, it is
    /// what a scheduler needs to decide whether the data fits under the cap
    /// and, if not, how many processes of this cap it would fit on (see
    /// the library guide's "Growing onto more processes").
    ///
    /// ```
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = outcore::Runtime::builder().build()?;
    /// let _h = rt.insert(vec![0u8; 1 << 20])?;
    /// let f = rt.footprint();
    /// assert_eq!((f.executors, f.resident, f.evicted_bytes), (1, 1, 0));
    /// assert!(f.resident_bytes >= 1 << 20);
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn footprint(&self) -> Footprint {
        if self.shared.check_process().is_err() {
            return Footprint::default();
        }
        self.shared.registry().footprint()
    }

    /// A handle that reads this runtime's counters from any thread (a
    /// sampler, a progress display) without borrowing the runtime.
    ///
    /// ```
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = outcore::Runtime::builder().build()?;
    /// let m = rt.monitor();
    /// let watcher = std::thread::spawn(move || m.stats().map(|s| s.loads));
    /// assert_eq!(watcher.join().unwrap(), Some(0));
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn monitor(&self) -> Monitor {
        Monitor {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        // The caller's own unpublished bytes count in the usage and peak.
        crate::alloc::flush_thread();
        Stats::collect(self.shared.counters(), self.shared.soft_cap())
    }
}

/// Reads a runtime's counters from another thread; made by
/// [`Runtime::monitor`]. It does not keep the runtime alive: once the
/// runtime is dropped, its methods return `None`. Reading never waits for
/// a task or a load.
#[derive(Clone, Debug)]
pub struct Monitor {
    shared: std::sync::Weak<Shared>,
}

impl Monitor {
    /// A snapshot of the counters, as [`Runtime::stats`] gives (without
    /// the calling thread's unpublished bytes, which a monitoring thread
    /// does not have); `None` once the runtime is dropped.
    pub fn stats(&self) -> Option<Stats> {
        let s = self.shared.upgrade()?;
        Some(Stats::collect(s.counters(), s.soft_cap()))
    }

    /// [`Runtime::footprint`], from any thread; `None` once the runtime
    /// is dropped.
    pub fn footprint(&self) -> Option<Footprint> {
        let s = self.shared.upgrade()?;
        Some(s.registry().footprint())
    }

    /// Executors in memory now (one scan of the registry, under its lock
    /// for the scan's duration); `None` once the runtime is dropped.
    pub fn resident_count(&self) -> Option<usize> {
        let s = self.shared.upgrade()?;
        Some(s.registry().count_in_memory())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.shared.check_process().is_err() {
            // A child created by `fork()`: the threads are the parent's
            // (they do not exist here, so there is nothing to join) and so
            // are the spill files, which dropping the last reference would
            // remove. Leave all of it alone.
            std::mem::forget(self.shared.clone());
            std::mem::forget(self.registration.take());
            std::mem::forget(std::mem::take(&mut self.threads));
            std::mem::forget(std::mem::take(&mut self.prefetchers));
            return;
        }
        builder::stop(
            &self.shared,
            &mut self.registration,
            &mut self.threads,
            &mut self.prefetchers,
        );
        self.shared.forget_tier_copies();
    }
}

/// Counts the bytes `value` encodes to (its size estimate before it has
/// been measured on a load).
fn encoded_len<T: Serialize>(value: &T) -> usize {
    crate::executor::encoded_len(value).0
}

/// A lineage with its value type erased, as the slot stores it, and
/// whether it is used again after an eviction.
fn erase<T: Send + 'static, L: Lineage<T>>(lineage: L) -> (RebuildFn, bool) {
    let repeatable = lineage.repeatable();
    let f: RebuildFn = Box::new(move || {
        lineage
            .rebuild()
            .map(|v| Box::new(v) as Box<dyn std::any::Any + Send>)
    });
    (f, repeatable)
}
