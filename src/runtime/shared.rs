//! The state the runtime's parts share: one `Arc<Shared>` is held by the
//! [`Runtime`](crate::Runtime), its worker and prefetch threads, the
//! allocator's evictor registration and (weakly) every handle.
//!
//! The behaviour lives next door, one job a file (listed in `mod.rs`).
//!
//! # Locks
//!
//! `Shared`'s fields are private: the other files reach them through the
//! methods below, and every lock is taken only by the methods of the type
//! that owns it, each of which releases it before returning (or hands out
//! a guard that releases it on drop):
//!
//! - a slot's lock: [`Slot::lock`], [`Slot::try_lock`] (`executor/`);
//! - the registry's: the methods of `Registry` (`registry.rs`); its scans
//!   run their closure under it;
//! - the ranked lists' (`victims` for `make_room`, `wanted` for the
//!   prefetchers): `Ranked::lock` (`ranked.rs`);
//! - the pending heads' (`heads`): [`Shared::sync_pending`],
//!   [`Shared::pending_horizon`], [`Shared::pending_soon`] (here);
//! - the last failed write's: `WriteHealth` (`writes.rs`);
//! - the worker pool's queue, the prefetch signal, each batch's state and
//!   what running tasks pin (parking_lot: `pool.rs`, `batch.rs`,
//!   `pins.rs`, a leaf taken under a batch's): never reached from the
//!   trap.
//!
//! The order: a thread holding one of these may take only locks further
//! down this list, never one above it:
//!
//! 1. `victims` or `wanted` (never both);
//! 2. the registry (nothing is taken under it);
//!
//! and, apart:
//!
//! 1. a slot's lock (never held with the registry, either way round);
//! 2. `heads` (a leaf).
//!
//! The allocation trap ([`Evictor::evict_for_trap`](crate::alloc::Evictor))
//! may run in any thread, while it holds any of these: so it never
//! blocks on one. It only try-locks the registry (`Registry::try_scan`,
//! giving up after a brief spin), a slot ([`Slot::try_lock`]) and the last
//! failed write (`WriteHealth::failed`), and takes no other lock. Holders
//! of the registry, slot and `heads` locks are in a bypass scope, so an
//! allocation under them never traps.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::pins::Pins;
use super::pool::{Pool, Signal};
use super::ranked::Ranked;
use super::registry::Registry;
use super::writes::WriteHealth;
use crate::alloc::BypassGuard;
use crate::executor::{Slot, SlotGuard, NONE};
use crate::policy::{Cycle, EvictionPolicy, UseInfo};
use crate::spill::{Reclaim, SpillStore, SpillTier};
use crate::stats::Counters;

pub(crate) struct Shared {
    /// This runtime's identity, unique in the process: the keys of its
    /// executors carry it (see [`Key`](crate::Key)).
    ident: u64,
    cap: Option<u64>,
    policy: EvictionPolicy,
    store: SpillStore,
    registry: Registry,
    counters: Counters,
    /// Executors pinned by running tasks.
    pinned: AtomicUsize,
    /// What running tasks pin, in bytes (for starting joins under the cap).
    pins: Pins,
    /// Bytes of loads in progress.
    loading_bytes: AtomicUsize,
    /// Taken by a join that gave back its executors for lack of room
    /// while it tries again (see `batch::acquire_all`).
    join_turn: parking_lot::Mutex<()>,
    /// Bumped whenever an executor may have become evictable.
    generation: AtomicU64,
    /// Logical clock for last-use times.
    clock: AtomicU64,
    /// Next dispatch sequence number.
    seq: AtomicU64,
    /// Next executor id.
    next_id: AtomicU64,
    pool: Pool,
    prefetch_on: bool,
    prefetch_signal: Signal,
    workers: usize,
    writes: WriteHealth,
    /// Victims ranked by one registry scan, for `make_room` (see
    /// `evict.rs`). Never taken by the trap.
    victims: Ranked,
    /// Freed pages jemalloc may keep for reuse before a load purges them
    /// (see `trim_after_load`).
    dirty_budget: usize,
    /// Resident bytes outside the accounting (code, stacks, the
    /// allocator's bookkeeping, C allocations), last measured after a load:
    /// proactive eviction leaves room for them under the cap (see
    /// `evict::target`).
    outside: AtomicUsize,
    /// Evicted executors ranked by one scan, for the prefetcher.
    wanted: Ranked,
    /// The first pending task of every executor that has one (its
    /// dispatch sequence number, with the executor's id: a task over
    /// several executors is the first of each of them): the order in which
    /// the workers will want them, so the prefetcher looks only a bounded
    /// way ahead (see `pending_horizon`). A leaf lock: nothing else is
    /// taken while it is held.
    heads: std::sync::Mutex<BTreeSet<(u64, u64)>>,
    started: Instant,
    /// The process that started the runtime (see [`Shared::check_process`]).
    owner: u32,
    /// Bumped whenever an executor becomes `Evicted` (evicted, inserted
    /// lazily, or given back by a prefetcher): while it stays put, a scan
    /// for executors to load that found none would find none again.
    evicted_mark: AtomicU64,
    /// Executors in state `Evicted` now (see `wake_prefetchers`).
    evicted_now: Arc<AtomicUsize>,
    /// Set by [`Interrupter::interrupt`](crate::Interrupter::interrupt):
    /// tasks not started yet fail with `Error::Interrupted`.
    interrupted: Arc<AtomicBool>,
    /// Whether to stop when the cap is lost (see
    /// [`Builder::stop_when_cap_lost`](crate::Builder::stop_when_cap_lost)).
    stop_when_cap_lost: bool,
    /// Set once the cap was lost: tasks not started fail with it.
    cap_lost: OnceLock<CapLost>,
    /// Where evictions go before the disk (see `evict.rs`), and what the
    /// process holds for others.
    others: Others,
}

/// What a runtime shares memory with besides its executors: where
/// evictions go before the disk (see `evict.rs`), if anywhere, and the
/// memory the process holds for others, given back before its own
/// executors are evicted (see `make_room`).
pub(crate) struct Others {
    pub(crate) tier: Option<Arc<dyn SpillTier>>,
    pub(crate) reclaim: Option<Arc<dyn Reclaim>>,
}

/// What [`Error::CapLost`](crate::Error::CapLost) reports, kept once the
/// runtime stopped.
struct CapLost {
    in_memory: u64,
    failed_writes: u64,
    last_error: String,
    by_value: bool,
}

/// The next runtime's identity (see [`Shared::ident`]).
static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(1);

impl Shared {
    pub(crate) fn new(
        cap: Option<u64>,
        policy: EvictionPolicy,
        store: SpillStore,
        workers: usize,
        prefetch_on: bool,
        stop_when_cap_lost: bool,
        others: Others,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            ident: NEXT_RUNTIME.fetch_add(1, Ordering::Relaxed),
            cap,
            policy,
            store,
            registry: Registry::default(),
            counters: Counters::default(),
            pinned: AtomicUsize::new(0),
            pins: Pins::default(),
            loading_bytes: AtomicUsize::new(0),
            join_turn: parking_lot::Mutex::new(()),
            generation: AtomicU64::new(0),
            clock: AtomicU64::new(1),
            seq: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            pool: Pool::default(),
            prefetch_on,
            prefetch_signal: Signal::default(),
            workers,
            writes: WriteHealth::from_env(),
            dirty_budget: dirty_budget(cap, &crate::cap::detect_limits()),
            outside: AtomicUsize::new(0),
            victims: Ranked::default(),
            wanted: Ranked::default(),
            heads: std::sync::Mutex::new(BTreeSet::new()),
            started: Instant::now(),
            owner: std::process::id(),
            evicted_mark: AtomicU64::new(0),
            evicted_now: Arc::new(AtomicUsize::new(0)),
            interrupted: Arc::new(AtomicBool::new(false)),
            stop_when_cap_lost,
            cap_lost: OnceLock::new(),
            others,
        })
    }

    /// This runtime's identity, unique in the process (never reused).
    pub(crate) fn ident(&self) -> u64 {
        self.ident
    }

    /// Keeps the ranked lists able to hold `executors` (and the entries
    /// added between rebuilds) without allocating under their locks.
    pub(crate) fn room_to_rank(&self, executors: usize) {
        let n = executors.saturating_add(executors / 2).saturating_add(64);
        self.victims.grow(n);
        self.wanted.grow(n);
    }

    /// `Err(Error::Forked)` in a child process created by `fork()` (where
    /// the workers do not exist and the spill files are the parent's).
    pub(crate) fn check_process(&self) -> crate::Result<()> {
        if std::process::id() == self.owner {
            Ok(())
        } else {
            Err(crate::Error::Forked { owner: self.owner })
        }
    }

    /// The flag [`Interrupter::interrupt`](crate::Interrupter::interrupt)
    /// sets.
    pub(crate) fn interrupt_flag(&self) -> &Arc<AtomicBool> {
        &self.interrupted
    }

    /// Whether the runtime was asked to stop.
    pub(crate) fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::Relaxed)
    }

    /// `Some(Error::CapLost)` once spill writes keep failing and the memory
    /// in use has grown past the cap by an eighth (at least 1 MiB): from
    /// then on, for every task not started (see
    /// [`Builder::stop_when_cap_lost`](crate::Builder::stop_when_cap_lost)).
    pub(crate) fn cap_lost(&self) -> Option<crate::Error> {
        let cap = self.cap?;
        if self.cap_lost.get().is_none() {
            if !self.stop_when_cap_lost || !self.writes.failing() {
                return None;
            }
            let in_memory = crate::alloc::current_usage() as u64;
            if in_memory <= cap.saturating_add((cap / 8).max(1 << 20)) {
                return None;
            }
            let _ = self.cap_lost.set(CapLost {
                in_memory,
                failed_writes: self.counters.failed_writes.load(Ordering::Relaxed),
                last_error: self.writes.last_error().unwrap_or_default(),
                by_value: self.writes.last_by_value(),
            });
        }
        let l = self.cap_lost.get()?;
        Some(crate::Error::CapLost {
            cap,
            in_memory: l.in_memory,
            failed_writes: l.failed_writes,
            last_error: l.last_error.clone(),
            by_value: l.by_value,
        })
    }

    /// The logical clock, without advancing it.
    pub(crate) fn clock_now(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// The next logical time.
    pub(crate) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Milliseconds since the runtime started.
    pub(crate) fn epoch_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Reserves `n` dispatch sequence numbers.
    pub(crate) fn reserve_seqs(&self, n: u64) -> u64 {
        self.seq.fetch_add(n, Ordering::Relaxed)
    }

    /// Cycle positions the prefetcher works ahead of each cycle's cursor:
    /// two per worker.
    pub(crate) fn lookahead(&self) -> u64 {
        2 * self.workers as u64
    }

    /// Refreshes `slot`'s `next_task` mirror from its pending queue, and
    /// its entry among the pending heads. The caller holds the slot's lock
    /// (`g`), so the two change together.
    pub(crate) fn sync_pending(&self, slot: &Slot, g: &SlotGuard<'_>) {
        let old = slot.next_task.load(Ordering::Relaxed);
        slot.sync_next_task(g);
        let new = slot.next_task.load(Ordering::Relaxed);
        if old == new {
            return;
        }
        // The map's nodes come from the allocator; its lock is one the
        // trap never takes, but a trap here would evict under a slot lock.
        let _bypass = BypassGuard::new();
        let mut heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        if old != NONE {
            heads.remove(&(old, slot.id));
        }
        if new != NONE {
            heads.insert((new, slot.id));
        }
    }

    /// How far ahead of the workers the prefetcher loads executors that
    /// have pending tasks: up to the `lookahead()`-th task in dispatch
    /// order that is the first pending one of some executor (those being
    /// worked on count; a task over several executors counts once).
    /// `u64::MAX` when fewer tasks are pending.
    ///
    /// Loading every pending executor of a long batch ahead of time, as
    /// room allowed, took room from the executors kept resident across
    /// sweeps: they were evicted for executors not needed yet, and loaded
    /// again later in the sweep. Counted by executor instead of by task,
    /// the horizon of tasks that join a data block with two model blocks
    /// shrank to a task or two, and most loads came too late.
    pub(crate) fn pending_horizon(&self) -> u64 {
        let _bypass = BypassGuard::new();
        let heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        horizon(&heads, self.lookahead())
    }

    /// The executors with a pending task within [`Self::pending_horizon`],
    /// in dispatch order (their ids).
    pub(crate) fn pending_soon(&self, out: &mut Vec<u64>) {
        let _bypass = BypassGuard::new();
        let heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        let last = horizon(&heads, self.lookahead());
        out.extend(
            heads
                .iter()
                .take_while(|&&(seq, _)| seq <= last)
                .map(|&(_, id)| id),
        );
    }

    /// The rank of `s` in `cycle` (computed under the registry lock, which
    /// hands out the cycle: see `Registry::scan`).
    pub(crate) fn rank(&self, s: &Slot, cycle: Cycle) -> u64 {
        let opt = |v: u64| (v != NONE).then_some(v);
        let u = UseInfo {
            next_task: opt(s.next_task.load(Ordering::Relaxed)),
            cycle_pos: opt(s.cycle_pos.load(Ordering::Relaxed)),
            last_use: s.last_use.load(Ordering::Relaxed),
        };
        self.policy.rank(u, cycle)
    }

    /// The rank of `s` now, `None` when it is no longer registered.
    pub(crate) fn rank_now(&self, s: &Slot) -> Option<u64> {
        self.registry
            .ranked(s, self.lookahead(), |s, c| self.rank(s, c))
            .map(|(r, _)| r)
    }

    /// The soft cap in bytes, if any.
    pub(crate) fn soft_cap(&self) -> Option<u64> {
        self.cap
    }

    pub(crate) fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    pub(crate) fn tier(&self) -> Option<&dyn SpillTier> {
        self.others.tier.as_deref()
    }

    /// The memory held for others, if any (see `make_room`).
    pub(crate) fn reclaimer(&self) -> Option<&dyn Reclaim> {
        self.others.reclaim.as_deref()
    }

    pub(crate) fn store(&self) -> &SpillStore {
        &self.store
    }

    /// The executors (the registry owns its lock).
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// What running tasks pin (it owns its lock, a leaf).
    pub(crate) fn pins(&self) -> &Pins {
        &self.pins
    }

    /// The worker pool (it owns its lock).
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The health of spill writes (it owns its lock, try-locked by the
    /// trap).
    pub(crate) fn writes(&self) -> &WriteHealth {
        &self.writes
    }

    /// The ranked victims of `make_room` (`evict.rs`).
    pub(crate) fn victims(&self) -> &Ranked {
        &self.victims
    }

    /// The ranked candidates of the prefetchers (`prefetch.rs`).
    pub(crate) fn wanted(&self) -> &Ranked {
        &self.wanted
    }

    /// Whether the prefetchers load executors ahead of the workers.
    pub(crate) fn prefetch_on(&self) -> bool {
        self.prefetch_on
    }

    /// Wakes the prefetchers.
    pub(crate) fn wake_prefetchers(&self) {
        // With no executor evicted there is nothing to load: a wake-up of
        // every prefetcher after every task (in memory, at 128-D, k = 32)
        // cost a tenth of the cores in futex calls and context switches.
        // An executor evicted after this check is found by the next wake
        // or the prefetchers' timeout.
        if self.evicted_now.load(Ordering::Relaxed) == 0 {
            return;
        }
        self.prefetch_signal.notify();
    }

    /// Wakes the prefetchers to stop: every wait returns at once from now
    /// on.
    pub(crate) fn stop_prefetchers(&self) {
        self.prefetch_signal.close();
    }

    /// A prefetcher waits for work, at most `timeout`.
    pub(crate) fn wait_for_prefetch_work(&self, timeout: Duration) {
        self.prefetch_signal.wait(timeout);
    }

    /// Freed pages jemalloc may keep (see [`dirty_budget`]).
    pub(crate) fn dirty_budget(&self) -> usize {
        self.dirty_budget
    }

    /// A new executor's id.
    pub(crate) fn new_executor_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Executors pinned by running tasks now.
    pub(crate) fn pinned_now(&self) -> usize {
        self.pinned.load(Ordering::Relaxed)
    }

    /// One more executor pinned by a task.
    pub(crate) fn pin(&self) {
        self.pinned.fetch_add(1, Ordering::AcqRel);
    }

    /// One executor fewer pinned.
    pub(crate) fn unpin(&self) {
        self.pinned.fetch_sub(1, Ordering::AcqRel);
    }

    /// The join turn (see `batch::acquire_all`): held while a join that
    /// gave way tries again.
    pub(crate) fn join_turn(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.join_turn.lock()
    }

    /// Bytes of loads in progress.
    pub(crate) fn loading_bytes(&self) -> usize {
        self.loading_bytes.load(Ordering::Relaxed)
    }

    /// A load of `bytes` starts.
    pub(crate) fn loading_starts(&self, bytes: usize) {
        self.loading_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A load of `bytes` is over (or given back).
    pub(crate) fn loading_ends(&self, bytes: usize) {
        self.loading_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// The counter that moves whenever an executor may have become
    /// evictable.
    pub(crate) fn generation_now(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// An executor may have become evictable.
    pub(crate) fn bump_generation(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// The count of executors in state `Evicted`, for a new slot to keep.
    pub(crate) fn evicted_count(&self) -> Arc<AtomicUsize> {
        self.evicted_now.clone()
    }

    /// The marker that moves whenever an executor becomes `Evicted`.
    pub(crate) fn evicted_mark(&self) -> u64 {
        self.evicted_mark.load(Ordering::Acquire)
    }

    /// An executor has become `Evicted`.
    pub(crate) fn note_evicted(&self) {
        self.evicted_mark.fetch_add(1, Ordering::Release);
    }

    /// Resident bytes outside the accounting, as last measured.
    pub(crate) fn outside(&self) -> usize {
        self.outside.load(Ordering::Relaxed)
    }

    /// Records the resident bytes outside the accounting.
    pub(crate) fn set_outside(&self, bytes: usize) {
        self.outside.store(bytes, Ordering::Relaxed);
    }
}

/// The `n`-th distinct task among the pending heads (`u64::MAX` when
/// fewer).
fn horizon(heads: &BTreeSet<(u64, u64)>, n: u64) -> u64 {
    let mut tasks = 0;
    let mut last = u64::MAX;
    for &(seq, _) in heads {
        if seq != last {
            tasks += 1;
            last = seq;
            if tasks >= n.max(1) {
                return seq;
            }
        }
    }
    u64::MAX
}

/// The message of a caught panic (its payload, when it is a string).
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

thread_local! {
    /// The executors pinned by the tasks running on this thread: one per
    /// task, more while a task runs a batch of its own (whose tasks this
    /// thread helps to run).
    static PINNED_HERE: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether a task running on this thread holds executor `id`.
pub(crate) fn pinned_here(id: u64) -> bool {
    PINNED_HERE.with(|p| p.try_borrow().is_ok_and(|p| p.contains(&id)))
}

/// Whether this thread is running a task.
pub(crate) fn in_task() -> bool {
    PINNED_HERE.with(|p| p.try_borrow().is_ok_and(|p| !p.is_empty()))
}

/// Records, for as long as it lives, that this thread's task holds
/// executor `id`.
pub(crate) struct PinnedHere(u64);

impl PinnedHere {
    pub(crate) fn new(id: u64) -> PinnedHere {
        PINNED_HERE.with(|p| {
            if let Ok(mut p) = p.try_borrow_mut() {
                p.push(id);
            }
        });
        PinnedHere(id)
    }
}

impl Drop for PinnedHere {
    fn drop(&mut self) {
        PINNED_HERE.with(|p| {
            if let Ok(mut p) = p.try_borrow_mut() {
                if let Some(i) = p.iter().rposition(|&x| x == self.0) {
                    p.remove(i);
                }
            }
        });
    }
}

pub(crate) use crate::executor::drop_user_value;

/// How many freed pages jemalloc may keep for reuse under `cap`: what the
/// memory limit (cgroup or physical memory) leaves above the cap, less
/// 1/32 of it for code, stacks and the page cache, and no more than what
/// the address-space limit leaves above the cap and what the process maps
/// besides its heap (as `MemoryCap::Auto` counts it: kept pages stay
/// mapped, and a temporary an eviction needs must find room); at least
/// twice the low watermark's gap (kept pages are taken again by the next
/// loads). Without a cap, unlimited (pages then decay as jemalloc decides).
pub(crate) fn dirty_budget(cap: Option<u64>, l: &crate::cap::Limits) -> usize {
    let Some(cap) = cap else { return usize::MAX };
    let gap = cap - crate::cap::low_watermark(cap);
    let floor = 2 * gap;
    let memory = [l.cgroup, l.physical]
        .into_iter()
        .flatten()
        .min()
        .map(|m| m.saturating_sub(cap).saturating_sub(m / 32));
    let address_space = l
        .rlimit_as
        .map(|v| v.saturating_sub(cap).saturating_sub((v / 4).max(256 << 20)));
    let room = [memory, address_space]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(floor);
    usize::try_from(room.max(floor)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::dirty_budget;
    use crate::cap::Limits;

    /// The count `wake_prefetchers` reads follows every way into and out
    /// of `Evicted`: eviction, a load, a value taken back, a handle
    /// dropped while evicted.
    #[test]
    fn the_count_of_evicted_executors_follows_their_states() {
        use std::sync::atomic::Ordering;
        let rt = crate::Runtime::builder()
            .workers(1)
            .build()
            .expect("a runtime");
        let count = rt.shared.evicted_count();
        let n = || count.load(Ordering::Relaxed);
        let hs: Vec<_> = (0..4u8)
            .map(|i| rt.insert(vec![i; 4096]).expect("inserted"))
            .collect();
        assert_eq!(n(), 0);
        rt.evict_all().expect("evicted");
        assert_eq!(n(), 4);
        let mut hs = hs.into_iter();
        let first = hs.next().expect("four");
        assert_eq!(first.into_inner().expect("loaded")[0], 0);
        assert_eq!(n(), 3);
        let second = hs.next().expect("four");
        let mut b = rt.batch();
        b.read(&second, |v: &Vec<u8>| v[0]);
        assert_eq!(b.run().expect("a task"), vec![1]);
        assert_eq!(n(), 2);
        drop(hs.next());
        assert_eq!(n(), 1);
        drop(hs);
        drop(second);
        assert_eq!(n(), 0);
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn kept_pages_fit_what_the_memory_limit_leaves_above_the_cap() {
        let cgroup = Limits {
            cgroup: Some(2 * GIB),
            rlimit_as: None,
            physical: Some(24 * GIB),
        };
        // 1.9 GiB under a 2 GiB cgroup: little room, so twice the gap.
        let cap = 2 * GIB / 20 * 19;
        let gap = cap - crate::cap::low_watermark(cap);
        assert_eq!(dirty_budget(Some(cap), &cgroup), 2 * gap as usize);
        // 1 GiB on a 24 GiB machine: the rest of memory less 1/32.
        let free = Limits {
            cgroup: None,
            ..cgroup
        };
        assert_eq!(
            dirty_budget(Some(GIB), &free) as u64,
            23 * GIB - 24 * GIB / 32
        );
        assert_eq!(dirty_budget(None, &free), usize::MAX);
        assert_eq!(
            dirty_budget(Some(GIB), &Limits::default()) as u64,
            2 * (GIB - crate::cap::low_watermark(GIB))
        );
        // Under an address-space limit of 4 GiB, a 1 GiB cap: what the
        // limit leaves, less what `MemoryCap::Auto` sets aside (1 GiB).
        let limited = Limits {
            rlimit_as: Some(4 * GIB),
            ..free
        };
        assert_eq!(dirty_budget(Some(GIB), &limited) as u64, 2 * GIB);
    }
}
