//! The runtime: executor registry, eviction, loading, task batches, the
//! worker pool and the prefetcher.
//!
//! ```text
//!  Batch::run ──► pending seqs on each slot ──► worker pool (N threads)
//!                          │                        │ acquire: load if evicted,
//!                          ▼                        │ pin, run, unpin
//!                  eviction ranks ◄─────────────────┘
//!                 (policy + plan)      prefetcher: loads upcoming executors,
//!                          │           evicting only ones needed later
//!                          ▼
//!      TrapAlloc ──► Evictor::evict_for_trap (try-locks only)
//! ```

mod batch;
mod pool;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use batch::Batch;

use crate::alloc::{self, BypassGuard, Evictor, Registration};
use crate::cap::MemoryCap;
use crate::error::{Error, ExecutorId, Result};
use crate::evict::{Cycle, EvictionPolicy, UseInfo};
use crate::executor::{EvictStep, PinStep, Slot, State, NONE};
use crate::spill::SpillStore;
use crate::stats::{Counters, Stats};

/// Configures and builds a [`Runtime`].
///
/// ```
/// use outcore::{EvictionPolicy, MemoryCap, Runtime};
/// let rt = Runtime::builder()
///     .mem_cap(MemoryCap::parse("512MiB").unwrap())
///     .workers(2)
///     .policy(EvictionPolicy::Priority)
///     .build()
///     .unwrap();
/// assert_eq!(rt.workers(), 2);
/// ```
#[derive(Clone, Debug)]
pub struct Builder {
    cap: MemoryCap,
    workers: Option<usize>,
    policy: EvictionPolicy,
    spill_dir: Option<PathBuf>,
    prefetch: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            cap: MemoryCap::None,
            workers: None,
            policy: EvictionPolicy::Priority,
            spill_dir: None,
            prefetch: true,
        }
    }
}

impl Builder {
    /// The soft memory cap (default: none; a hard limit still traps).
    pub fn mem_cap(mut self, cap: MemoryCap) -> Self {
        self.cap = cap;
        self
    }

    /// Worker threads (default: one per core).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n.max(1));
        self
    }

    /// The eviction policy (default: [`EvictionPolicy::Priority`]).
    pub fn policy(mut self, p: EvictionPolicy) -> Self {
        self.policy = p;
        self
    }

    /// Where spill files go: a private subdirectory is created inside
    /// `dir` (default: the system temporary directory). It is removed when
    /// the runtime is dropped.
    pub fn spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_dir = Some(dir.into());
        self
    }

    /// Load upcoming executors in the background (default: on).
    pub fn prefetch(mut self, on: bool) -> Self {
        self.prefetch = on;
        self
    }

    /// Starts the runtime: creates the spill directory, registers with the
    /// allocator and starts the workers and the prefetcher.
    ///
    /// # Errors
    ///
    /// [`Error::SpillDir`] when the spill directory is missing or not
    /// writable; [`Error::Runtime`] when threads cannot be started.
    pub fn build(self) -> Result<Runtime> {
        let store = SpillStore::new(self.spill_dir.as_deref())?;
        let workers = self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        });
        let cap = self.cap.resolve();
        let shared = Arc::new(Shared {
            cap,
            policy: self.policy,
            store,
            registry: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            pinned: AtomicUsize::new(0),
            loading_bytes: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            clock: AtomicU64::new(1),
            seq: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            cycle_len: AtomicU64::new(0),
            cycle_cursor: AtomicU64::new(0),
            pool: pool::Pool::default(),
            prefetch_on: self.prefetch,
            prefetch_signal: pool::Signal::default(),
            workers,
            shutdown: AtomicBool::new(false),
            last_write_error: Mutex::new(None),
            fault_every: std::env::var("OUTCORE_FAULT_WRITE_EVERY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            fault_count: AtomicU64::new(0),
            started: Instant::now(),
            write_backoff_until: AtomicU64::new(0),
            failures_in_a_row: AtomicU64::new(0),
        });
        alloc::set_spill_dir_for_diagnostics(shared.store.dir());
        let registration =
            alloc::register(shared.clone() as Arc<dyn Evictor>).ok_or_else(|| {
                Error::Runtime("too many runtimes alive in this process (64 at most)".into())
            })?;
        let mut threads = Vec::new();
        for i in 0..workers {
            let sh = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("outcore-worker-{i}"))
                .spawn(move || pool::worker_loop(sh))
                .map_err(|e| Error::Runtime(format!("cannot start worker thread: {e}")))?;
            threads.push(t);
        }
        let prefetcher = if self.prefetch {
            let sh = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("outcore-prefetch".into())
                    .spawn(move || prefetch_loop(sh))
                    .map_err(|e| Error::Runtime(format!("cannot start prefetch thread: {e}")))?,
            )
        } else {
            None
        };
        Ok(Runtime {
            shared,
            registration: Some(registration),
            threads,
            prefetcher,
            workers,
        })
    }
}

/// The outcore runtime: owns executors, runs tasks on them, and evicts them
/// to disk under memory pressure.
///
/// Dropping the runtime stops its threads and removes its spill directory.
pub struct Runtime {
    shared: Arc<Shared>,
    registration: Option<Registration>,
    threads: Vec<JoinHandle<()>>,
    prefetcher: Option<JoinHandle<()>>,
    workers: usize,
}

/// A handle to an executor holding a `T`. Cheap to pass by reference;
/// dropping it frees the executor's memory and its spill file.
pub struct Handle<T> {
    slot: Option<Arc<Slot>>,
    shared: Weak<Shared>,
    _t: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// The executor's id.
    pub fn id(&self) -> ExecutorId {
        self.slot.as_ref().map_or(0, |s| s.id)
    }

    /// The executor's current state.
    pub fn state(&self) -> State {
        self.slot
            .as_ref()
            .map_or(State::Removed, |s| s.state_hint())
    }

    /// Bytes the executor takes in memory, as last measured.
    pub fn size(&self) -> usize {
        self.slot
            .as_ref()
            .map_or(0, |s| s.size.load(Ordering::Relaxed))
    }

    pub(crate) fn slot(&self) -> Option<&Arc<Slot>> {
        self.slot.as_ref()
    }
}

impl<T: Send + 'static> Handle<T> {
    /// Takes the value back out of the runtime (loading it if needed).
    pub fn into_inner(mut self) -> Result<T> {
        let slot = self.slot.take().ok_or_else(|| Error::UnknownExecutor {
            executor: "executor".into(),
        })?;
        let shared = self
            .shared
            .upgrade()
            .ok_or_else(|| Error::UnknownExecutor {
                executor: slot.label.clone(),
            })?;
        let v = shared.acquire(&slot, true)?;
        shared.remove(&slot, false);
        shared.pinned.fetch_sub(1, Ordering::AcqRel);
        v.downcast::<T>()
            .map(|b| *b)
            .map_err(|_| Error::UnknownExecutor {
                executor: slot.label.clone(),
            })
    }
}

impl<T> Drop for Handle<T> {
    fn drop(&mut self) {
        if let (Some(slot), Some(shared)) = (self.slot.take(), self.shared.upgrade()) {
            shared.remove(&slot, true);
        }
    }
}

impl<T> std::fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.slot {
            Some(s) => write!(f, "Handle({}, {:?})", s.label, s.state_hint()),
            None => f.write_str("Handle(removed)"),
        }
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
        self.shared.cap
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.shared.policy
    }

    /// The private spill directory.
    pub fn spill_dir(&self) -> &Path {
        self.shared.store.dir()
    }

    /// Hands `value` to the runtime and returns its handle.
    pub fn insert<T>(&self, value: T) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        self.insert_named(None, value)
    }

    /// Like [`Runtime::insert`], with a name shown in messages.
    pub fn insert_named<T>(&self, name: Option<&str>, value: T) -> Result<Handle<T>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let sh = &self.shared;
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let label = match name {
            Some(n) => format!("executor #{id} ({n})"),
            None => format!("executor #{id}"),
        };
        let size = encoded_len(&value);
        let slot = Arc::new(Slot::new(id, label, value, size, sh.tick()));
        {
            let mut reg = sh.registry_lock();
            reg.insert(id, slot.clone());
        }
        sh.generation.fetch_add(1, Ordering::Relaxed);
        sh.make_room(0, None);
        Ok(Handle {
            slot: Some(slot),
            shared: Arc::downgrade(sh),
            _t: PhantomData,
        })
    }

    /// Starts a batch of tasks whose results have type `R`.
    pub fn batch<R: Send + 'static>(&self) -> Batch<'_, R> {
        Batch::new(self)
    }

    /// Runs one read-only task on `h` and returns its result.
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
    /// over (an epoch of iterative training). The next few executors of the
    /// cycle are then prefetched and kept, and the rest are ranked in a
    /// fixed order spread over the cycle (see
    /// [`EvictionPolicy::rank`](crate::EvictionPolicy::rank)), so the part
    /// of the cycle that stays resident is the same every sweep and the
    /// loads are spread between resident executors.
    pub fn hint_cycle(&self, order: impl IntoIterator<Item = ExecutorId>) {
        let sh = &self.shared;
        let order: Vec<ExecutorId> = order.into_iter().collect();
        let reg = sh.registry_lock();
        for s in reg.values() {
            s.cycle_pos.store(NONE, Ordering::Relaxed);
        }
        let mut n = 0u64;
        for id in &order {
            if let Some(s) = reg.get(id) {
                s.cycle_pos.store(n, Ordering::Relaxed);
                n += 1;
            }
        }
        sh.cycle_len.store(n, Ordering::Relaxed);
        sh.cycle_cursor
            .store(n.saturating_sub(1), Ordering::Relaxed);
    }

    /// Evicts idle executors (highest rank first) until `bytes` more
    /// fit under the cap with the runtime's headroom. Call it before a large
    /// allocation the runtime cannot foresee, such as a task that builds a
    /// big value, so that room is made ahead of time instead of in the
    /// allocation trap. Returns whether the bytes fit (always true with no
    /// cap).
    pub fn make_room(&self, bytes: usize) -> bool {
        self.shared.make_room(bytes, None)
    }

    /// Evicts every idle executor now (writing the dirty ones). Returns how
    /// many were evicted.
    pub fn evict_all(&self) -> Result<usize> {
        let sh = &self.shared;
        let slots: Vec<Arc<Slot>> = sh.registry_lock().values().cloned().collect();
        let mut n = 0;
        for s in slots {
            match sh.evict_slot(&s, false) {
                Evicted::Freed(_) => n += 1,
                Evicted::Skipped => {}
                Evicted::Failed => {
                    let reason = sh
                        .last_write_error()
                        .unwrap_or_else(|| "write failed".into());
                    return Err(Error::SpillWrite {
                        executor: s.label.clone(),
                        file: sh.store.path_for(s.id),
                        bytes: s.size.load(Ordering::Relaxed),
                        reason,
                    });
                }
            }
        }
        alloc::purge();
        Ok(n)
    }

    /// The last spill write that failed (file and reason), if any: a full
    /// or broken spill directory. The executor stayed in memory.
    pub fn last_spill_error(&self) -> Option<String> {
        self.shared.last_write_error()
    }

    /// Number of executors currently in memory.
    pub fn resident_count(&self) -> usize {
        self.shared
            .registry_lock()
            .values()
            .filter(|s| s.state_hint().in_memory())
            .count()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        Stats::collect(&self.shared.counters, self.shared.cap)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Stop trapping into this runtime first, then stop the threads.
        self.registration.take();
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.pool.wake_all();
        self.shared.prefetch_signal.notify();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(t) = self.prefetcher.take() {
            let _ = t.join();
        }
    }
}

/// Counts the bytes `value` encodes to (its size estimate before it has
/// been measured on a load).
fn encoded_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = bincode::serde::encode_into_std_write(value, &mut c, crate::spill::bincode_config());
    c.0
}

/// The level proactive eviction brings usage down to.
fn low_watermark(cap: u64) -> u64 {
    cap.saturating_sub((cap / 32).max(4 << 20).min(cap / 2))
}

/// Outcome of one eviction attempt.
pub(crate) enum Evicted {
    Freed(usize),
    Skipped,
    Failed,
}

pub(crate) struct Shared {
    cap: Option<u64>,
    policy: EvictionPolicy,
    store: SpillStore,
    registry: Mutex<HashMap<u64, Arc<Slot>>>,
    pub(crate) counters: Counters,
    pinned: AtomicUsize,
    /// Bytes of loads in progress.
    loading_bytes: AtomicUsize,
    generation: AtomicU64,
    clock: AtomicU64,
    seq: AtomicU64,
    next_id: AtomicU64,
    cycle_len: AtomicU64,
    cycle_cursor: AtomicU64,
    pub(crate) pool: pool::Pool,
    prefetch_on: bool,
    pub(crate) prefetch_signal: pool::Signal,
    workers: usize,
    pub(crate) shutdown: AtomicBool,
    last_write_error: Mutex<Option<String>>,
    fault_every: u64,
    fault_count: AtomicU64,
    started: Instant,
    /// No dirty write is attempted before this time (ms since `started`).
    write_backoff_until: AtomicU64,
    /// Spill writes that failed since the last one that succeeded.
    failures_in_a_row: AtomicU64,
}

/// The registry's guard, with the trap bypassed while it is held.
struct RegistryGuard<'a> {
    guard: MutexGuard<'a, HashMap<u64, Arc<Slot>>>,
    _bypass: BypassGuard,
}

impl std::ops::Deref for RegistryGuard<'_> {
    type Target = HashMap<u64, Arc<Slot>>;
    fn deref(&self) -> &Self::Target {
        &self.guard
    }
}

impl std::ops::DerefMut for RegistryGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.guard
    }
}

impl Shared {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn registry_lock(&self) -> RegistryGuard<'_> {
        let bypass = BypassGuard::new();
        let guard = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        RegistryGuard {
            guard,
            _bypass: bypass,
        }
    }

    /// Try-locks the registry, spinning briefly (for the trap).
    fn registry_try_lock(&self) -> Option<RegistryGuard<'_>> {
        for i in 0..200 {
            let bypass = BypassGuard::new();
            match self.registry.try_lock() {
                Ok(guard) => {
                    return Some(RegistryGuard {
                        guard,
                        _bypass: bypass,
                    })
                }
                Err(TryLockError::Poisoned(e)) => {
                    return Some(RegistryGuard {
                        guard: e.into_inner(),
                        _bypass: bypass,
                    })
                }
                Err(TryLockError::WouldBlock) => {
                    if i < 50 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
        None
    }

    fn last_write_error(&self) -> Option<String> {
        self.last_write_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn cycle(&self) -> Cycle {
        Cycle {
            len: self.cycle_len.load(Ordering::Relaxed),
            cursor: self.cycle_cursor.load(Ordering::Relaxed),
            ahead: self.lookahead(),
        }
    }

    /// Cycle positions the prefetcher works ahead of the cursor: two per
    /// worker.
    fn lookahead(&self) -> u64 {
        2 * self.workers as u64
    }

    pub(crate) fn rank(&self, s: &Slot, cycle: Cycle) -> u64 {
        let opt = |v: u64| (v != NONE).then_some(v);
        let u = UseInfo {
            next_task: opt(s.next_task.load(Ordering::Relaxed)),
            cycle_pos: opt(s.cycle_pos.load(Ordering::Relaxed)),
            last_use: s.last_use.load(Ordering::Relaxed),
        };
        self.policy.rank(u, cycle)
    }

    /// The resident executor to evict next: the highest rank, above
    /// `above` when given, not in `skip`.
    fn pick_victim(&self, above: Option<u64>, skip: &[u64], trap: bool) -> Option<Arc<Slot>> {
        let reg = if trap {
            self.registry_try_lock()?
        } else {
            self.registry_lock()
        };
        let cycle = self.cycle();
        let mut best: Option<(u64, &Arc<Slot>)> = None;
        for s in reg.values() {
            if s.state_hint() != State::Resident || skip.contains(&s.id) {
                continue;
            }
            let r = self.rank(s, cycle);
            if above.is_some_and(|a| r <= a) {
                continue;
            }
            if best.is_none_or(|(br, _)| r > br) {
                best = Some((r, s));
            }
        }
        best.map(|(_, s)| s.clone())
    }

    /// Evicts `slot` if it is resident and idle.
    pub(crate) fn evict_slot(&self, slot: &Slot, trap: bool) -> Evicted {
        let g = if trap {
            slot.try_lock()
        } else {
            Some(slot.lock())
        };
        let Some(mut g) = g else {
            return Evicted::Skipped;
        };
        let size = slot.size.load(Ordering::Relaxed);
        match g.state.evict_step(g.dirty, g.file_gen != 0) {
            EvictStep::Skip => Evicted::Skipped,
            EvictStep::DropClean => {
                let v = g.value.take();
                slot.set_state(&mut g, State::Evicted);
                drop(g);
                drop(v);
                self.count_eviction(trap, true);
                Evicted::Freed(size)
            }
            EvictStep::Write => {
                // After a failed write, leave that executor alone for a while
                // instead of serializing it again and again; after several
                // failures in a row (a full disk), leave all dirty ones
                // alone for a while. Clean evictions go on.
                let now = self.epoch_ms();
                if now < slot.write_retry_at.load(Ordering::Relaxed)
                    || now < self.write_backoff_until.load(Ordering::Relaxed)
                {
                    return Evicted::Skipped;
                }
                let Some(v) = g.value.take() else {
                    return Evicted::Skipped;
                };
                let gen = g.next_gen;
                g.next_gen += 1;
                slot.set_state(&mut g, State::Evicting);
                drop(g);
                let _bypass = BypassGuard::new();
                let path = self.store.path_for(slot.id);
                let result = if self.inject_fault() {
                    Err("injected fault (OUTCORE_FAULT_WRITE_EVERY)".to_string())
                } else {
                    (slot.save)(&*v, &path, slot.key(gen))
                };
                let mut g = slot.lock();
                match result {
                    Ok(written) => {
                        self.failures_in_a_row.store(0, Ordering::Relaxed);
                        g.file_gen = gen;
                        g.dirty = false;
                        slot.set_state(&mut g, State::Evicted);
                        drop(g);
                        drop(v);
                        Counters::add(&self.counters.bytes_written, written);
                        self.count_eviction(trap, false);
                        Evicted::Freed(size.max(written as usize))
                    }
                    Err(reason) => {
                        g.value = Some(v);
                        slot.set_state(&mut g, State::Resident);
                        drop(g);
                        Counters::add(&self.counters.failed_writes, 1);
                        alloc::note_failed_spill_write();
                        let now = self.epoch_ms();
                        slot.write_retry_at.store(now + 500, Ordering::Relaxed);
                        if self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1 >= 3 {
                            self.write_backoff_until.store(now + 500, Ordering::Relaxed);
                        }
                        let msg = format!("{}: {reason}", path.display());
                        if let Ok(mut e) = self.last_write_error.try_lock() {
                            *e = Some(msg);
                        }
                        Evicted::Failed
                    }
                }
            }
        }
    }

    /// Milliseconds since the runtime started.
    fn epoch_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Test and soak hook: with `OUTCORE_FAULT_WRITE_EVERY=N`, every Nth
    /// spill write fails as if the disk were full.
    fn inject_fault(&self) -> bool {
        match self.fault_every {
            0 => false,
            n => self.fault_count.fetch_add(1, Ordering::Relaxed) % n == n - 1,
        }
    }

    fn count_eviction(&self, trap: bool, clean: bool) {
        Counters::add(&self.counters.evictions, 1);
        if trap {
            Counters::add(&self.counters.trap_evictions, 1);
        }
        if clean {
            Counters::add(&self.counters.clean_evictions, 1);
        }
    }

    /// Evicts until `bytes` more fit under the low watermark, taking only
    /// victims ranked above `above` when given. Returns whether they fit.
    ///
    /// The low watermark is the cap less 1/32 (at least 4 MiB): headroom
    /// for the buffers of loads and for what tasks allocate, so that the
    /// trap stays the last resort.
    pub(crate) fn make_room(&self, bytes: usize, above: Option<u64>) -> bool {
        let Some(cap) = self.cap else { return true };
        let cap = low_watermark(cap);
        let mut skip: Vec<u64> = Vec::new();
        // No purge afterwards: jemalloc reuses the freed extents for the
        // loads that follow. Purging on every proactive eviction made each
        // task's fresh buffers fault in zeroed pages again (with TLB
        // shootdowns across the workers). The trap, where memory must go
        // back to the system now, still purges.
        loop {
            let in_flight = self.loading_bytes.load(Ordering::Relaxed);
            if alloc::current_usage()
                .saturating_add(in_flight)
                .saturating_add(bytes) as u64
                <= cap
            {
                return true;
            }
            let Some(v) = self.pick_victim(above, &skip, false) else {
                return false;
            };
            if !matches!(self.evict_slot(&v, false), Evicted::Freed(_)) {
                skip.push(v.id);
            }
        }
    }

    /// Loads an executor the caller has put in the `Loading` state.
    fn load_slot(&self, slot: &Slot, file_gen: u64, prefetch: bool) -> Result<()> {
        let size = slot.size.load(Ordering::Relaxed);
        if !prefetch {
            self.make_room(size, None);
        }
        let path = self.store.path_for(slot.id);
        // Loads in flight count against the cap in `make_room`, so that
        // concurrent loads do not each assume the same headroom.
        self.loading_bytes.fetch_add(size, Ordering::Relaxed);
        let before = alloc::thread_net_allocated();
        let result = (slot.load)(&path, slot.key(file_gen));
        let delta = alloc::thread_net_allocated() - before;
        self.loading_bytes.fetch_sub(size, Ordering::Relaxed);
        let mut g = slot.lock();
        match result {
            Ok((v, read)) => {
                g.value = Some(v);
                g.dirty = false;
                if delta > 0 {
                    slot.size.store(delta as usize, Ordering::Relaxed);
                }
                slot.last_use.store(self.tick(), Ordering::Relaxed);
                slot.prefetched.store(prefetch, Ordering::Relaxed);
                slot.set_state(&mut g, State::Resident);
                drop(g);
                Counters::add(&self.counters.loads, 1);
                Counters::add(&self.counters.bytes_read, read);
                if prefetch {
                    Counters::add(&self.counters.prefetches, 1);
                }
                self.generation.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(reason) => {
                g.damage = Some(reason.clone());
                slot.set_state(&mut g, State::Damaged);
                Err(Error::SpillRead {
                    executor: slot.label.clone(),
                    file: path,
                    reason,
                })
            }
        }
    }

    /// Takes an executor's value for a task: loads it if needed and pins it.
    pub(crate) fn acquire(
        &self,
        slot: &Slot,
        write: bool,
    ) -> Result<Box<dyn std::any::Any + Send>> {
        let start = Instant::now();
        let mut waited = false;
        let mut g = slot.lock();
        loop {
            match g.state.pin_step() {
                PinStep::Pin => {
                    let Some(v) = g.value.take() else {
                        return Err(Error::Runtime(format!(
                            "{}: resident without a value",
                            slot.label
                        )));
                    };
                    if write {
                        g.dirty = true;
                    }
                    slot.set_state(&mut g, State::Pinned);
                    drop(g);
                    self.pinned.fetch_add(1, Ordering::AcqRel);
                    if slot.prefetched.swap(false, Ordering::Relaxed) && !waited {
                        Counters::add(&self.counters.prefetch_hits, 1);
                    }
                    if waited {
                        Counters::add(
                            &self.counters.load_wait_nanos,
                            start.elapsed().as_nanos() as u64,
                        );
                    }
                    return Ok(v);
                }
                PinStep::Load => {
                    let file_gen = g.file_gen;
                    slot.set_state(&mut g, State::Loading);
                    drop(g);
                    waited = true;
                    Counters::add(&self.counters.demand_loads, 1);
                    self.load_slot(slot, file_gen, false)?;
                    g = slot.lock();
                }
                PinStep::Wait => {
                    waited = true;
                    g = slot.wait(g);
                }
                PinStep::Fail => {
                    return Err(match g.state {
                        State::Poisoned => Error::Poisoned {
                            executor: slot.label.clone(),
                        },
                        State::Damaged => Error::SpillRead {
                            executor: slot.label.clone(),
                            file: self.store.path_for(slot.id),
                            reason: g.damage.clone().unwrap_or_default(),
                        },
                        _ => Error::UnknownExecutor {
                            executor: slot.label.clone(),
                        },
                    });
                }
            }
        }
    }

    /// Puts a task's value back and unpins the executor.
    pub(crate) fn release(&self, slot: &Slot, v: Box<dyn std::any::Any + Send>, poisoned: bool) {
        let mut g = slot.lock();
        g.value = Some(v);
        slot.set_state(
            &mut g,
            if poisoned {
                State::Poisoned
            } else {
                State::Resident
            },
        );
        drop(g);
        slot.last_use.store(self.tick(), Ordering::Relaxed);
        self.pinned.fetch_sub(1, Ordering::AcqRel);
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Records that a task on `slot` with sequence `seq` is dispatched.
    pub(crate) fn dispatched(&self, slot: &Slot, seq: u64) {
        {
            let mut g = slot.lock();
            if let Some(p) = g.pending.iter().position(|&s| s == seq) {
                g.pending.remove(p);
            }
            slot.sync_next_task(&g);
        }
        let pos = slot.cycle_pos.load(Ordering::Relaxed);
        if pos != NONE {
            self.cycle_cursor.store(pos, Ordering::Relaxed);
        }
        slot.last_use.store(self.tick(), Ordering::Relaxed);
        self.prefetch_signal.notify();
    }

    /// Reserves `n` dispatch sequence numbers.
    pub(crate) fn reserve_seqs(&self, n: u64) -> u64 {
        self.seq.fetch_add(n, Ordering::Relaxed)
    }

    /// Removes an executor (its handle was dropped or taken).
    fn remove(&self, slot: &Slot, drop_value: bool) {
        self.registry_lock().remove(&slot.id);
        let mut g = slot.lock();
        while matches!(g.state, State::Pinned | State::Loading | State::Evicting) && drop_value {
            g = slot.wait(g);
        }
        let v = g.value.take();
        slot.set_state(&mut g, State::Removed);
        drop(g);
        drop(v);
        let _ = std::fs::remove_file(self.store.path_for(slot.id));
    }

    /// The prefetcher's one step: loads the evicted executor needed soonest
    /// (lowest rank: a pending task, or one of the next turns in the
    /// declared cycle) if it fits, evicting only idle executors that are not
    /// coming up, highest rank first. Without a plan for an executor (idle,
    /// outside any cycle), it comes back only when no work is pending and
    /// usage is below 90% of the low watermark. Returns whether it loaded
    /// something.
    fn prefetch_step(&self) -> bool {
        let cycle = self.cycle();
        let target = {
            let reg = self.registry_lock();
            let mut best: Option<(u64, &Arc<Slot>)> = None;
            for s in reg.values() {
                if s.state_hint() != State::Evicted {
                    continue;
                }
                let r = self.rank(s, cycle);
                if best.is_none_or(|(br, _)| r < br) {
                    best = Some((r, s));
                }
            }
            best.map(|(r, s)| (r, s.clone()))
        };
        let Some((rank, slot)) = target else {
            return false;
        };
        let size = slot.size.load(Ordering::Relaxed);
        let planned = slot.next_task.load(Ordering::Relaxed) != NONE
            || slot.cycle_pos.load(Ordering::Relaxed) != NONE;
        if planned {
            if !self.policy.prefetch_target(rank, cycle)
                && slot.next_task.load(Ordering::Relaxed) == NONE
            {
                return false;
            }
            let Some(floor) = self.policy.prefetch_floor(cycle, rank) else {
                return false;
            };
            if !self.make_room(size, Some(floor.max(rank))) {
                return false;
            }
        } else {
            let Some(cap) = self.cap else { return false };
            if !self.pool.is_idle()
                || (alloc::current_usage() + size) as u64 > low_watermark(cap) / 10 * 9
            {
                return false;
            }
        }
        let mut g = slot.lock();
        if g.state != State::Evicted {
            return true;
        }
        let file_gen = g.file_gen;
        slot.set_state(&mut g, State::Loading);
        drop(g);
        // A damaged file is reported to the task that needs the executor.
        let _ = self.load_slot(&slot, file_gen, true);
        true
    }
}

fn prefetch_loop(sh: Arc<Shared>) {
    while !sh.shutdown.load(Ordering::Acquire) {
        if !sh.prefetch_on || !sh.prefetch_step() {
            sh.prefetch_signal.wait(Duration::from_millis(50));
        }
    }
    alloc::flush_thread();
}

impl Evictor for Shared {
    fn evict_for_trap(&self, bytes: usize) -> usize {
        let mut freed = 0usize;
        let mut skip = [NONE; 16];
        let mut nskip = 0;
        for _ in 0..256 {
            if freed >= bytes {
                break;
            }
            let Some(v) = self.pick_victim(None, &skip[..nskip], true) else {
                break;
            };
            match self.evict_slot(&v, true) {
                Evicted::Freed(n) => freed = freed.saturating_add(n.max(1)),
                Evicted::Skipped | Evicted::Failed => {
                    if nskip == skip.len() {
                        break;
                    }
                    skip[nskip] = v.id;
                    nskip += 1;
                }
            }
        }
        freed
    }

    fn pinned(&self) -> usize {
        self.pinned.load(Ordering::Relaxed)
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    fn cap(&self) -> Option<usize> {
        self.cap.map(|c| usize::try_from(c).unwrap_or(usize::MAX))
    }
}
