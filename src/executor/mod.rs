//! Executors: the registry's per-executor slot and its state machine.
//!
//! The value lives in the slot as a `Box<dyn Any + Send>`; a running task
//! takes the box out (the slot is then `Pinned` and holds nothing an
//! evictor could touch) and puts it back when it finishes. Every state
//! change happens under the slot's mutex, a `std::sync::Mutex`
//! (futex-based, never allocates, so the allocation trap may take it), and
//! no allocation happens while it is held.
//!
//! Files:
//!
//! - `mod.rs` (this file): the slot;
//! - `state.rs`: the pure state machine and its tests; the diagram is the
//!   doc of [`State`];
//! - `README.md`: what each state means, and the ranking.

mod state;

use std::any::Any;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use state::State;
pub(crate) use state::{EvictStep, PinStep};

/// A failed load's error, shared by every error that reports it: the
/// tasks that come after the load get the error itself (its kind, its
/// message, and its payload for a caller that downcasts it), not a copy
/// of its text.
#[derive(Clone, Debug)]
pub(crate) struct Damage(std::sync::Arc<io::Error>);

impl Damage {
    /// Keeps `e`.
    pub(crate) fn new(e: io::Error) -> Damage {
        Damage(std::sync::Arc::new(e))
    }

    /// An `io::Error` of the same kind and message, whose source is the
    /// kept error.
    pub(crate) fn error(&self) -> io::Error {
        io::Error::new(self.0.kind(), self.clone())
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Damage {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

use crate::alloc::BypassGuard;
use crate::spill::{self, FileKey, SpillTier};

/// Sentinel for "none" in the atomic mirrors.
pub(crate) const NONE: u64 = u64::MAX;

/// Encodes a type-erased value to a spill file.
pub(crate) type SaveFn = fn(&(dyn Any + Send), &Path, FileKey) -> io::Result<u64>;
/// Decodes a type-erased value from a spill file.
pub(crate) type LoadFn = fn(&Path, FileKey) -> io::Result<(Box<dyn Any + Send>, spill::Loaded)>;
/// Measures a type-erased value: the bytes it encodes to (`None` when its
/// `Serialize` fails or panics).
pub(crate) type MeasureFn = fn(&(dyn Any + Send)) -> Option<usize>;
/// Puts a type-erased value's image into a spill tier: its length, or
/// `None` when the tier declined it.
pub(crate) type TierPutFn =
    fn(&(dyn Any + Send), &dyn SpillTier, u64, FileKey, u64) -> io::Result<Option<u64>>;
/// Reads a type-erased value's image back from a spill tier: the value and
/// the image's length.
pub(crate) type TierGetFn =
    fn(&dyn SpillTier, u64, FileKey) -> io::Result<(Box<dyn Any + Send>, u64)>;
/// Rebuilds a type-erased value from its lineage.
pub(crate) type RebuildFn = Box<dyn Fn() -> io::Result<Box<dyn Any + Send>> + Send + Sync>;

/// `file_gen` of an executor whose copy is its lineage, not a spill file:
/// while it stays clean, it is evicted by dropping it and loaded by
/// rebuilding it.
pub(crate) const FROM_LINEAGE: u64 = u64::MAX;

fn save_impl<T: Serialize + 'static>(
    v: &(dyn Any + Send),
    path: &Path,
    key: FileKey,
) -> io::Result<u64> {
    match v.downcast_ref::<T>() {
        Some(t) => spill::write_file(path, key, t),
        None => Err(io::Error::other(
            "internal: executor value has an unexpected type",
        )),
    }
}

fn tier_put_impl<T: Serialize + 'static>(
    v: &(dyn Any + Send),
    tier: &dyn SpillTier,
    runtime: u64,
    key: FileKey,
    len: u64,
) -> io::Result<Option<u64>> {
    match v.downcast_ref::<T>() {
        Some(t) => spill::tier::put_value(tier, runtime, key, len, t),
        None => Err(io::Error::other(
            "internal: executor value has an unexpected type",
        )),
    }
}

fn tier_get_impl<T: DeserializeOwned + Send + 'static>(
    tier: &dyn SpillTier,
    runtime: u64,
    key: FileKey,
) -> io::Result<(Box<dyn Any + Send>, u64)> {
    let (v, n) = spill::tier::get_value::<T>(tier, runtime, key)?;
    Ok((Box::new(v), n))
}

fn measure_impl<T: Serialize + 'static>(v: &(dyn Any + Send)) -> Option<usize> {
    let t = v.downcast_ref::<T>()?;
    // The value's `Serialize` is user code: a panic is no measure.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encoded_len(t))) {
        Ok((n, true)) => Some(n),
        _ => None,
    }
}

/// Counts the bytes `value` encodes to, without writing them anywhere,
/// and whether its `Serialize` succeeded (the count so far when not): its
/// size before it has been measured on a load, and after a task changed
/// it (see `run_task`).
pub(crate) fn encoded_len<T: Serialize>(value: &T) -> (usize, bool) {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let ok = bincode::serde::encode_into_std_write(value, &mut c, spill::bincode_config()).is_ok();
    (c.0, ok)
}

fn load_impl<T: DeserializeOwned + Send + 'static>(
    path: &Path,
    key: FileKey,
) -> io::Result<(Box<dyn Any + Send>, spill::Loaded)> {
    let (v, n) = spill::read_file_counted::<T>(path, key)?;
    Ok((Box::new(v), n))
}

/// Mutable part of a slot, guarded by its mutex.
pub(crate) struct Inner {
    pub state: State,
    pub value: Option<Box<dyn Any + Send>>,
    /// Memory differs from the spill file (or there is no valid file).
    pub dirty: bool,
    /// Generation of the valid spill file; 0 when there is none.
    pub file_gen: u64,
    /// Next generation to write.
    pub next_gen: u64,
    /// Generation of the image a spill tier holds (0: none). Valid while
    /// the executor is clean: whoever makes it dirty takes it (see
    /// [`Slot::make_dirty`]) and has the tier forget it.
    pub tier_gen: u64,
    /// Dispatch sequence numbers of pending tasks, in order.
    pub pending: std::collections::VecDeque<u64>,
    /// Why the executor is damaged (a failed load), when it is.
    pub damage: Option<Damage>,
    /// Removed while pinned by the task that dropped its last handle: the
    /// value is dropped when that task releases it.
    pub drop_on_release: bool,
    /// Tasks reading the value side by side (it stays in `value`, and the
    /// state is `Pinned`); 0 when a task holds it alone (the value is then
    /// out of the slot) or none does.
    pub readers: u32,
}

/// One executor in the registry.
pub(crate) struct Slot {
    pub id: u64,
    /// "executor #N" or "executor #N (name)".
    pub label: String,
    pub fingerprint: u64,
    pub save: SaveFn,
    pub load: LoadFn,
    pub tier_put: TierPutFn,
    pub tier_get: TierGetFn,
    /// The bytes the value encodes to (its size after a task changed it).
    pub measure: MeasureFn,
    /// How to rebuild the value instead of reading a spill file, when the
    /// executor was inserted with a lineage.
    pub lineage: Option<RebuildFn>,
    /// The lineage is used again after an eviction (otherwise it builds
    /// the value once, and the executor spills from then on).
    pub lineage_repeatable: bool,
    inner: Mutex<Inner>,
    cond: Condvar,
    /// Mirror of `inner.state` for lock-free victim scans.
    state_code: AtomicU8,
    /// Bytes the executor takes in memory (measured).
    pub size: AtomicUsize,
    /// Logical time of last use.
    pub last_use: AtomicU64,
    /// Mirror of `inner.pending.front()` ([`NONE`] when idle).
    pub next_task: AtomicU64,
    /// The declared cycle it belongs to ([`NONE`] when none). Changed only
    /// under the registry lock.
    pub cycle_id: AtomicU64,
    /// Position in that cycle ([`NONE`] when not in one).
    pub cycle_pos: AtomicU64,
    /// Loaded by the prefetcher and not used since.
    pub prefetched: AtomicBool,
    /// After a failed write: no new attempt before this time (ms since
    /// the runtime started).
    pub write_retry_at: AtomicU64,
    /// The runtime's count of executors in state `Evicted`, kept by
    /// [`Slot::set_state`] and the slot's creation and drop.
    evicted: Arc<AtomicUsize>,
}

/// The slot's mutex guard; allocations are kept out of the trap while it is
/// held (none should happen, this is belt and braces).
pub(crate) struct SlotGuard<'a> {
    guard: MutexGuard<'a, Inner>,
    _bypass: BypassGuard,
}

impl std::ops::Deref for SlotGuard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.guard
    }
}

impl Drop for Slot {
    /// The value still held (the runtime dropped with its executors, or a
    /// handle outliving its runtime) is user code's to drop: a panic in its
    /// `Drop` is caught (and reported by the panic hook) instead of
    /// unwinding out of the runtime's or the handle's drop.
    fn drop(&mut self) {
        let inner = match self.inner.get_mut() {
            Ok(i) => i,
            Err(poisoned) => poisoned.into_inner(),
        };
        if inner.state == State::Evicted {
            self.evicted.fetch_sub(1, Ordering::Relaxed);
        }
        drop_user_value(inner.value.take());
    }
}

/// Drops a user value; a panic in its `Drop` is caught (and reported by
/// the panic hook) instead of unwinding into the runtime or the allocator.
pub(crate) fn drop_user_value<T>(v: T) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(v)));
}

impl Slot {
    /// A slot for `value` (resident), or for an executor not built yet
    /// (`None`: evicted, rebuilt from `lineage` when first needed). With a
    /// lineage used again after evictions, or one that has not built the
    /// value yet, the executor starts clean: its copy is the lineage.
    pub(crate) fn new<T: Serialize + DeserializeOwned + Send + 'static>(
        id: u64,
        label: String,
        value: Option<T>,
        lineage: Option<(RebuildFn, bool)>,
        size: usize,
        now: u64,
        evicted: Arc<AtomicUsize>,
    ) -> Slot {
        let state = if value.is_some() {
            State::Resident
        } else {
            evicted.fetch_add(1, Ordering::Relaxed);
            State::Evicted
        };
        let (lineage, lineage_repeatable) = match lineage {
            Some((f, r)) => (Some(f), r),
            None => (None, false),
        };
        // The copy is the lineage while it is used again, or until its one
        // build (a value given with a lineage that is not used again was
        // built already: it spills from its first eviction on).
        let from_lineage = lineage.is_some() && (lineage_repeatable || value.is_none());
        Slot {
            id,
            label,
            fingerprint: spill::fingerprint::<T>(),
            save: save_impl::<T>,
            load: load_impl::<T>,
            tier_put: tier_put_impl::<T>,
            tier_get: tier_get_impl::<T>,
            measure: measure_impl::<T>,
            lineage,
            lineage_repeatable,
            inner: Mutex::new(Inner {
                state,
                value: value.map(|v| Box::new(v) as Box<dyn Any + Send>),
                dirty: !from_lineage,
                file_gen: if from_lineage { FROM_LINEAGE } else { 0 },
                next_gen: 1,
                tier_gen: 0,
                pending: std::collections::VecDeque::new(),
                damage: None,
                drop_on_release: false,
                readers: 0,
            }),
            cond: Condvar::new(),
            state_code: AtomicU8::new(state as u8),
            size: AtomicUsize::new(size),
            last_use: AtomicU64::new(now),
            next_task: AtomicU64::new(NONE),
            cycle_id: AtomicU64::new(NONE),
            cycle_pos: AtomicU64::new(NONE),
            prefetched: AtomicBool::new(false),
            write_retry_at: AtomicU64::new(0),
            evicted,
        }
    }

    /// Locks the slot (blocking).
    pub(crate) fn lock(&self) -> SlotGuard<'_> {
        let bypass = BypassGuard::new();
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        SlotGuard {
            guard,
            _bypass: bypass,
        }
    }

    /// Locks the slot if it is free (for the trap).
    pub(crate) fn try_lock(&self) -> Option<SlotGuard<'_>> {
        let bypass = BypassGuard::new();
        let guard = match self.inner.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(SlotGuard {
            guard,
            _bypass: bypass,
        })
    }

    /// Waits for a state change.
    pub(crate) fn wait<'a>(&'a self, g: SlotGuard<'a>) -> SlotGuard<'a> {
        let SlotGuard { guard, _bypass } = g;
        let guard = self.cond.wait(guard).unwrap_or_else(|e| e.into_inner());
        SlotGuard { guard, _bypass }
    }

    /// Sets the state (under the lock) and wakes waiters.
    pub(crate) fn set_state(&self, g: &mut SlotGuard<'_>, s: State) {
        match (g.state == State::Evicted, s == State::Evicted) {
            (false, true) => self.evicted.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.evicted.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
        g.state = s;
        self.state_code.store(s as u8, Ordering::Release);
        self.cond.notify_all();
    }

    /// The state, read without the lock (may be stale).
    pub(crate) fn state_hint(&self) -> State {
        State::from_code(self.state_code.load(Ordering::Acquire))
    }

    /// Refreshes the `next_task` mirror from the pending queue.
    pub(crate) fn sync_next_task(&self, g: &SlotGuard<'_>) {
        self.next_task.store(
            g.pending.front().copied().unwrap_or(NONE),
            Ordering::Release,
        );
    }

    /// Marks the value changed (it differs from every copy): the tier's
    /// image, if there is one, is stale; its generation is returned (0:
    /// none), for the caller to have the tier forget it once the lock is
    /// released.
    pub(crate) fn make_dirty(g: &mut SlotGuard<'_>) -> u64 {
        g.dirty = true;
        std::mem::take(&mut g.tier_gen)
    }

    pub(crate) fn key(&self, generation: u64) -> FileKey {
        FileKey {
            executor: self.id,
            generation,
            fingerprint: self.fingerprint,
        }
    }
}
