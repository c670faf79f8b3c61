//! The registry: the runtime's executors and their declared cycles, under
//! one `std::sync::Mutex` (futex-based, never allocates, so the trap may
//! try-lock it).
//!
//! A runtime may hold several sweep orders at once (two jobs, or two
//! datasets): each [`Runtime::hint_cycle`](crate::Runtime::hint_cycle)
//! makes a new cycle with its own length and cursor. An executor belongs to
//! at most one cycle: declaring it in a new one takes it out of the old
//! one, and a cycle with no member left is forgotten.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use crate::alloc::BypassGuard;
use crate::executor::{Slot, NONE};
use crate::policy::Cycle;

/// Identifies a sweep order declared with
/// [`Runtime::hint_cycle`](crate::Runtime::hint_cycle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CycleId(pub(crate) u64);

/// One declared cycle.
#[derive(Debug)]
struct CycleState {
    /// Positions in the cycle.
    len: u64,
    /// Executors still in it.
    members: u64,
    /// Position of the executor dispatched last.
    cursor: u64,
    /// The executor at each position (its id), as declared.
    order: Vec<u64>,
}

/// What the registry lock guards.
#[derive(Default)]
struct Inner {
    slots: HashMap<u64, Arc<Slot>>,
    cycles: HashMap<u64, CycleState>,
    next_cycle: u64,
}

impl Inner {
    /// The cycle `s` belongs to, for ranking, with `ahead` positions
    /// counting as coming up; the empty cycle when it is in none.
    fn cycle_of(&self, s: &Slot, ahead: u64) -> Cycle {
        let id = s.cycle_id.load(Ordering::Relaxed);
        match self.cycles.get(&id) {
            Some(c) if id != NONE => Cycle {
                len: c.len,
                cursor: c.cursor,
                ahead,
            },
            _ => Cycle::default(),
        }
    }

    /// Declares a new cycle over `order` (ids not in the registry are
    /// skipped). An executor named twice takes its last position. `ids`
    /// is an empty vector with room for `order`, allocated by the caller
    /// before it took the lock (where an allocation cannot trap).
    fn declare_cycle(&mut self, order: &[u64], mut ids: Vec<u64>) -> CycleId {
        self.next_cycle += 1;
        let id = self.next_cycle;
        let mut len = 0u64;
        let mut members = 0u64;
        ids.clear();
        for eid in order {
            let Some(s) = self.slots.get(eid).cloned() else {
                continue;
            };
            ids.push(*eid);
            let old = s.cycle_id.swap(id, Ordering::Relaxed);
            if old != id {
                self.leave(old);
                members += 1;
            }
            s.cycle_pos.store(len, Ordering::Relaxed);
            len += 1;
        }
        if members > 0 {
            self.cycles.insert(
                id,
                CycleState {
                    len,
                    members,
                    cursor: len.saturating_sub(1),
                    order: ids,
                },
            );
        }
        CycleId(id)
    }

    /// The executors of every cycle at the `ahead` positions after its
    /// cursor, nearest first (those still at the position they were
    /// declared at): what the sweeps need next, found without a scan.
    fn coming_up(&self, ahead: u64) -> impl Iterator<Item = &Arc<Slot>> + '_ {
        self.cycles.iter().flat_map(move |(&cid, c)| {
            (1..=ahead.min(c.len)).filter_map(move |k| {
                let pos = (c.cursor + k) % c.len.max(1);
                let s = self.slots.get(c.order.get(pos as usize)?)?;
                (s.cycle_id.load(Ordering::Relaxed) == cid
                    && s.cycle_pos.load(Ordering::Relaxed) == pos)
                    .then_some(s)
            })
        })
    }

    /// Records that the sweep of `s`'s cycle has reached `s`. Returns the
    /// executor the cursor left, if another: its rank has just jumped
    /// (from the one the sweep is on to one needed later).
    fn set_cursor(&mut self, s: &Slot) -> Option<Arc<Slot>> {
        let id = s.cycle_id.load(Ordering::Relaxed);
        let pos = s.cycle_pos.load(Ordering::Relaxed);
        let c = self.cycles.get_mut(&id)?;
        let old = std::mem::replace(&mut c.cursor, pos);
        let left = *c.order.get(usize::try_from(old).ok()?)?;
        (old != pos)
            .then(|| self.slots.get(&left).cloned())
            .flatten()
    }

    /// Removes an executor, taking it out of its cycle.
    fn remove(&mut self, id: u64) -> Option<Arc<Slot>> {
        let s = self.slots.remove(&id)?;
        let old = s.cycle_id.swap(NONE, Ordering::Relaxed);
        s.cycle_pos.store(NONE, Ordering::Relaxed);
        self.leave(old);
        Some(s)
    }

    /// One member fewer in cycle `id`; forgets it when none is left.
    fn leave(&mut self, id: u64) {
        if let Some(c) = self.cycles.get_mut(&id) {
            c.members -= 1;
            if c.members == 0 {
                self.cycles.remove(&id);
            }
        }
    }
}

/// An executor as the registry's scans hand it out, under the lock.
pub(crate) struct Member<'a> {
    pub(crate) slot: &'a Arc<Slot>,
    inner: &'a Inner,
    ahead: u64,
}

impl Member<'_> {
    /// The executor's cycle, for ranking (see `Inner::cycle_of`), looked
    /// up only when asked for.
    pub(crate) fn cycle(&self) -> Cycle {
        self.inner.cycle_of(self.slot, self.ahead)
    }
}

/// The registry's lock. Taken only by its own methods, each of which
/// releases it before returning (the closures of the scans run under it).
#[derive(Default)]
pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

/// The registry's guard, with the trap bypassed while it is held.
struct RegistryGuard<'a> {
    guard: MutexGuard<'a, Inner>,
    _bypass: BypassGuard,
}

impl std::ops::Deref for RegistryGuard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl std::ops::DerefMut for RegistryGuard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.guard
    }
}

/// `slots` as [`Member`]s of `inner`.
fn members<'a>(
    inner: &'a Inner,
    slots: impl Iterator<Item = &'a Arc<Slot>> + 'a,
    ahead: u64,
) -> impl Iterator<Item = Member<'a>> + 'a {
    slots.map(move |slot| Member { slot, inner, ahead })
}

impl Registry {
    /// Adds an executor; returns how many the registry holds. The table
    /// grows outside the lock: under the lock an allocation cannot trap
    /// (the eviction would need this lock), so under an address-space
    /// limit a table doubling there could only fail.
    pub(crate) fn insert(&self, id: u64, slot: Arc<Slot>) -> usize {
        let mut reg = self.lock();
        while reg.slots.len() >= reg.slots.capacity() {
            let want = reg.slots.capacity().saturating_mul(2).max(64);
            drop(reg);
            let mut bigger = HashMap::with_capacity(want);
            reg = self.lock();
            if reg.slots.capacity() < want && reg.slots.len() < want {
                // Within `bigger`'s capacity: no allocation here.
                bigger.extend(reg.slots.drain());
                reg.slots = bigger;
            }
        }
        reg.slots.insert(id, slot);
        reg.slots.len()
    }

    /// Every executor, in a vector allocated outside the lock (see
    /// [`Registry::insert`]).
    pub(crate) fn snapshot(&self) -> Vec<Arc<Slot>> {
        let mut out = Vec::new();
        loop {
            let n = self.lock().slots.len();
            out.reserve(n + 16);
            let reg = self.lock();
            if reg.slots.len() <= out.capacity() {
                out.extend(reg.slots.values().cloned());
                return out;
            }
        }
    }

    /// How many executors the registry holds.
    pub(crate) fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// How many executors are in memory (one scan, under the lock).
    pub(crate) fn count_in_memory(&self) -> usize {
        self.lock()
            .slots
            .values()
            .filter(|s| s.state_hint().in_memory())
            .count()
    }

    /// Declares a new cycle over `order` (see `Inner::declare_cycle`).
    pub(crate) fn declare_cycle(&self, order: &[u64]) -> CycleId {
        // Allocated before the lock is taken, where an allocation may trap.
        let ids = Vec::with_capacity(order.len());
        self.lock().declare_cycle(order, ids)
    }

    /// Records that the sweep of `s`'s cycle has reached `s` (see
    /// `Inner::set_cursor`).
    pub(crate) fn set_cursor(&self, s: &Slot) -> Option<Arc<Slot>> {
        self.lock().set_cursor(s)
    }

    /// Removes an executor, taking it out of its cycle.
    pub(crate) fn remove(&self, id: u64) -> Option<Arc<Slot>> {
        self.lock().remove(id)
    }

    /// `rank` of `s` and its cycle (`ahead` positions counting as coming
    /// up), computed under the lock; `None` when `s` is no longer
    /// registered.
    pub(crate) fn ranked(
        &self,
        s: &Slot,
        ahead: u64,
        rank: impl Fn(&Slot, Cycle) -> u64,
    ) -> Option<(u64, Cycle)> {
        let reg = self.lock();
        if !reg.slots.contains_key(&s.id) {
            return None;
        }
        let cycle = reg.cycle_of(s, ahead);
        Some((rank(s, cycle), cycle))
    }

    /// Calls `f`, under the lock, with every executor (their cycles with
    /// `ahead` positions counting as coming up).
    pub(crate) fn scan<R>(
        &self,
        ahead: u64,
        f: impl FnOnce(&mut dyn Iterator<Item = Member<'_>>) -> R,
    ) -> R {
        let reg = self.lock();
        let out = f(&mut members(&reg, reg.slots.values(), ahead));
        out
    }

    /// As [`Registry::scan`], for the allocation trap: the lock is only
    /// try-locked (spinning briefly), and `None` says it was busy.
    pub(crate) fn try_scan<R>(
        &self,
        ahead: u64,
        f: impl FnOnce(&mut dyn Iterator<Item = Member<'_>>) -> R,
    ) -> Option<R> {
        let reg = self.try_lock()?;
        let out = f(&mut members(&reg, reg.slots.values(), ahead));
        Some(out)
    }

    /// Calls `f`, under the lock, with the executors the sweeps need next
    /// (every cycle's `ahead` positions after its cursor, see
    /// `Inner::coming_up`) followed by those of `pending` (ids) still
    /// registered.
    pub(crate) fn upcoming<R>(
        &self,
        ahead: u64,
        pending: &[u64],
        f: impl FnOnce(&mut dyn Iterator<Item = Member<'_>>) -> R,
    ) -> R {
        let reg = self.lock();
        let pending = pending.iter().filter_map(|id| reg.slots.get(id));
        let out = f(&mut members(
            &reg,
            reg.coming_up(ahead).chain(pending),
            ahead,
        ));
        out
    }

    /// Locks the registry (blocking).
    fn lock(&self) -> RegistryGuard<'_> {
        let bypass = BypassGuard::new();
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        RegistryGuard {
            guard,
            _bypass: bypass,
        }
    }

    /// Try-locks the registry, spinning briefly (for the trap).
    fn try_lock(&self) -> Option<RegistryGuard<'_>> {
        for i in 0..200 {
            let bypass = BypassGuard::new();
            match self.inner.try_lock() {
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
}
