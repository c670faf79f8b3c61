//! The state the runtime's parts share: one `Arc<Shared>` is held by the
//! [`Runtime`](crate::Runtime), its worker and prefetch threads, the
//! allocator's evictor registration and (weakly) every handle.
//!
//! The behaviour lives next door, one job a file: `evict.rs` (victims,
//! writes, making room, the trap's entry point), `load.rs` (loading and
//! pinning), `prefetch.rs` (the prefetcher), `ranked.rs` (the ranked lists
//! those two decide from).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::pool::{Pool, Signal};
use super::registry::Registry;
use super::writes::WriteHealth;
use crate::alloc::BypassGuard;
use crate::executor::{Slot, SlotGuard, NONE};
use crate::policy::{EvictionPolicy, UseInfo};
use crate::spill::SpillStore;
use crate::stats::Counters;

pub(crate) struct Shared {
    pub(crate) cap: Option<u64>,
    pub(crate) policy: EvictionPolicy,
    pub(crate) store: SpillStore,
    pub(crate) registry: Registry,
    pub(crate) counters: Counters,
    /// Executors pinned by running tasks.
    pub(crate) pinned: AtomicUsize,
    /// Bytes of loads in progress.
    pub(crate) loading_bytes: AtomicUsize,
    /// Bumped whenever an executor may have become evictable.
    pub(crate) generation: AtomicU64,
    /// Logical clock for last-use times.
    clock: AtomicU64,
    /// Next dispatch sequence number.
    seq: AtomicU64,
    /// Next executor id.
    pub(crate) next_id: AtomicU64,
    pub(crate) pool: Pool,
    pub(crate) prefetch_on: bool,
    pub(crate) prefetch_signal: Signal,
    pub(crate) workers: usize,
    pub(crate) writes: WriteHealth,
    /// Victims ranked by one registry scan, for `make_room` (see
    /// `evict.rs`). Never taken by the trap.
    pub(crate) victims: std::sync::Mutex<super::ranked::RankedList>,
    /// Freed pages jemalloc may keep for reuse before a load purges them
    /// (see `trim_after_load`).
    pub(crate) dirty_budget: usize,
    /// Resident bytes outside the accounting (code, stacks, the
    /// allocator's bookkeeping, C allocations), last measured after a load:
    /// proactive eviction leaves room for them under the cap (see
    /// `evict::target`).
    pub(crate) outside: AtomicUsize,
    /// Evicted executors ranked by one scan, for the prefetcher.
    pub(crate) wanted: std::sync::Mutex<super::ranked::RankedList>,
    /// The first pending task of every executor that has one (its
    /// dispatch sequence number, to the executor's id): the order in which
    /// the workers will want them, so the prefetcher looks only a bounded
    /// way ahead (see `pending_horizon`). A leaf lock: nothing else is
    /// taken while it is held.
    heads: std::sync::Mutex<BTreeMap<u64, u64>>,
    started: Instant,
    /// The process that started the runtime (see [`Shared::check_process`]).
    owner: u32,
    /// Bumped whenever an executor becomes `Evicted` (evicted, inserted
    /// lazily, or given back by a prefetcher): while it stays put, a scan
    /// for executors to load that found none would find none again.
    pub(crate) evicted_mark: AtomicU64,
}

impl Shared {
    pub(crate) fn new(
        cap: Option<u64>,
        policy: EvictionPolicy,
        store: SpillStore,
        workers: usize,
        prefetch_on: bool,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            cap,
            policy,
            store,
            registry: Registry::default(),
            counters: Counters::default(),
            pinned: AtomicUsize::new(0),
            loading_bytes: AtomicUsize::new(0),
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
            victims: std::sync::Mutex::new(super::ranked::RankedList::default()),
            wanted: std::sync::Mutex::new(super::ranked::RankedList::default()),
            heads: std::sync::Mutex::new(BTreeMap::new()),
            started: Instant::now(),
            owner: std::process::id(),
            evicted_mark: AtomicU64::new(0),
        })
    }

    /// Keeps the ranked lists able to hold `executors` (and the entries
    /// added between rebuilds) without allocating under their locks.
    pub(crate) fn room_to_rank(&self, executors: usize) {
        let n = executors.saturating_add(executors / 2).saturating_add(64);
        super::ranked::grow(&self.victims, n);
        super::ranked::grow(&self.wanted, n);
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

    /// The next logical time.
    /// The logical clock, without advancing it.
    pub(crate) fn clock_now(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

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
            heads.remove(&old);
        }
        if new != NONE {
            heads.insert(new, slot.id);
        }
    }

    /// How far ahead of the workers the prefetcher loads executors that
    /// have pending tasks: up to the first pending task of the
    /// `lookahead()`-th executor in dispatch order (those being worked on
    /// count). `u64::MAX` when fewer executors have pending tasks.
    ///
    /// Loading every pending executor of a long batch ahead of time, as
    /// room allowed, took room from the executors kept resident across
    /// sweeps: they were evicted for executors not needed yet, and loaded
    /// again later in the sweep.
    pub(crate) fn pending_horizon(&self) -> u64 {
        let n = usize::try_from(self.lookahead()).unwrap_or(usize::MAX);
        let _bypass = BypassGuard::new();
        let heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        heads
            .keys()
            .nth(n.saturating_sub(1))
            .copied()
            .unwrap_or(u64::MAX)
    }

    /// The executors with a pending task within [`Self::pending_horizon`],
    /// in dispatch order (their ids).
    pub(crate) fn pending_soon(&self, out: &mut Vec<u64>) {
        let n = usize::try_from(self.lookahead()).unwrap_or(usize::MAX);
        let _bypass = BypassGuard::new();
        let heads = self.heads.lock().unwrap_or_else(|e| e.into_inner());
        out.extend(heads.values().take(n).copied());
    }

    /// The rank of `s` (the caller holds the registry lock, `reg`).
    pub(crate) fn rank(&self, s: &Slot, reg: &super::registry::Inner) -> u64 {
        let opt = |v: u64| (v != NONE).then_some(v);
        let u = UseInfo {
            next_task: opt(s.next_task.load(Ordering::Relaxed)),
            cycle_pos: opt(s.cycle_pos.load(Ordering::Relaxed)),
            last_use: s.last_use.load(Ordering::Relaxed),
        };
        self.policy.rank(u, reg.cycle_of(s, self.lookahead()))
    }
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
