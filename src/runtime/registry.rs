//! The registry: the runtime's executors and their declared cycles, under
//! one `std::sync::Mutex` (futex-based, never allocates, so the trap may
//! try-lock it).
//!
//! A runtime may hold several sweep orders at once (two jobs, or two
//! datasets): each [`Runtime::hint_cycle`](crate::Runtime::hint_cycle)
//! makes a new cycle with its own length and cursor. An executor belongs to
//! at most one cycle: declaring it in a new one takes it out of the old
//! one, and a cycle with no member left is forgotten.
//!
//! A cycle is a sequence of *steps*, each naming the executors one task
//! meets (a data block and the model block it joins). An executor may be
//! named by several steps (a model block every data block of a row meets);
//! its position is then the next step that names it, moved on each time the
//! sweep reaches it, so that its rank always says when it is needed next.

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

/// A cycle's steps as declared, prepared before the registry lock is taken
/// (where allocations may trap). Kept small: a plain cycle of `n`
/// executors takes 12 bytes per position.
#[derive(Debug, Default)]
pub(crate) struct Steps {
    /// The executors (ids) of every step, one step after another.
    ids: Vec<u64>,
    /// Where each step starts in `ids`, and one past the last step's end;
    /// empty while every step names one executor (step `i` is `ids[i]`).
    starts: Vec<u32>,
    /// For each entry of `ids`, the step that names the same executor next
    /// (after this one, cyclically; its own step when it is named once).
    again: Vec<u32>,
}

impl Steps {
    /// Prepares `steps` (each a list of executor ids). Positions past
    /// `u32::MAX` are not kept.
    pub(crate) fn new(steps: impl IntoIterator<Item = impl IntoIterator<Item = u64>>) -> Steps {
        let steps = steps.into_iter();
        let mut ids = Vec::with_capacity(steps.size_hint().0);
        let mut starts: Vec<u32> = Vec::new();
        for (n, step) in steps.enumerate() {
            let Ok(at) = u32::try_from(ids.len()) else {
                break;
            };
            if !starts.is_empty() {
                starts.push(at);
            }
            ids.extend(step);
            if starts.is_empty() && ids.len() != n + 1 {
                // The first step that does not name exactly one executor:
                // from here on, steps need their bounds.
                starts = (0..=at).collect();
            }
        }
        if !starts.is_empty() {
            starts.push(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        }
        let mut s = Steps {
            ids,
            starts,
            again: Vec::new(),
        };
        s.link();
        s
    }

    /// Fills `again`: going backwards, each entry's next occurrence is the
    /// step where its executor was last seen, or (for its last one) the
    /// step where it is first named.
    fn link(&mut self) {
        let len = u32::try_from(self.len()).unwrap_or(u32::MAX);
        let mut seen: HashMap<u64, u32> = HashMap::new();
        for pos in 0..len {
            for e in self.step(pos.into()) {
                seen.entry(self.ids[e]).or_insert(pos);
            }
        }
        self.again = vec![0; self.ids.len()];
        for pos in (0..len).rev() {
            for e in self.step(pos.into()).rev() {
                if let Some(next) = seen.insert(self.ids[e], pos) {
                    self.again[e] = next;
                }
            }
        }
    }

    /// Steps in the cycle.
    fn len(&self) -> u64 {
        if self.starts.is_empty() {
            self.ids.len() as u64
        } else {
            self.starts.len() as u64 - 1
        }
    }

    /// The entries (indices into `ids`) of step `pos`.
    fn step(&self, pos: u64) -> std::ops::Range<usize> {
        let Ok(i) = usize::try_from(pos) else {
            return 0..0;
        };
        if self.starts.is_empty() {
            return if i < self.ids.len() { i..i + 1 } else { 0..0 };
        }
        match (self.starts.get(i), self.starts.get(i + 1)) {
            (Some(&a), Some(&b)) => a as usize..b as usize,
            _ => 0..0,
        }
    }
}

/// One declared cycle.
#[derive(Debug)]
struct CycleState {
    /// Executors still in it.
    members: u64,
    /// The step dispatched last.
    cursor: u64,
    /// The dispatch sequence number of the task that moved the cursor
    /// there: a task of the plan that comes before it, dispatched late,
    /// leaves the cursor where it is (see `Inner::set_cursor`).
    cursor_seq: u64,
    /// The steps, as declared.
    steps: Steps,
}

/// Most executors [`Registry::set_cursor`] reports as left by the cursor.
pub(crate) const LEFT_MAX: usize = 8;

/// The executors a move of a cycle's cursor left behind, in a fixed array
/// (filled under the registry lock, where nothing may allocate).
#[derive(Default)]
pub(crate) struct Left {
    slots: [Option<Arc<Slot>>; LEFT_MAX],
}

impl Left {
    /// Takes the executors out, one by one.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Arc<Slot>> + '_ {
        self.slots.iter_mut().filter_map(Option::take)
    }
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
                len: c.steps.len(),
                cursor: c.cursor,
                ahead,
            },
            _ => Cycle::default(),
        }
    }

    /// Declares a new cycle over `steps` (ids not in the registry are
    /// left out). An executor named by several steps starts at the first.
    fn declare_cycle(&mut self, steps: Steps) -> CycleId {
        self.next_cycle += 1;
        let id = self.next_cycle;
        let mut members = 0u64;
        for pos in 0..steps.len() {
            for e in steps.step(pos) {
                let Some(s) = self.slots.get(&steps.ids[e]).cloned() else {
                    continue;
                };
                let old = s.cycle_id.swap(id, Ordering::Relaxed);
                if old != id {
                    self.leave(old);
                    members += 1;
                    s.cycle_pos.store(pos, Ordering::Relaxed);
                }
            }
        }
        if members > 0 {
            let cursor = steps.len().saturating_sub(1);
            self.cycles.insert(
                id,
                CycleState {
                    members,
                    cursor,
                    cursor_seq: 0,
                    steps,
                },
            );
        }
        CycleId(id)
    }

    /// The executors of every cycle at the `ahead` steps after its
    /// cursor, nearest first (those whose next step it is): what the
    /// sweeps need next, found without a scan.
    fn coming_up(&self, ahead: u64) -> impl Iterator<Item = &Arc<Slot>> + '_ {
        self.cycles.iter().flat_map(move |(&cid, c)| {
            let len = c.steps.len();
            (1..=ahead.min(len)).flat_map(move |k| {
                let pos = (c.cursor + k) % len.max(1);
                c.steps.step(pos).filter_map(move |e| {
                    let s = self.slots.get(&c.steps.ids[e])?;
                    (s.cycle_id.load(Ordering::Relaxed) == cid
                        && s.cycle_pos.load(Ordering::Relaxed) == pos)
                        .then_some(s)
                })
            })
        })
    }

    /// Records that the sweep of `s`'s cycle has reached `s` with the task
    /// of dispatch sequence number `seq`: `s` moves on to the next step
    /// that names it, and the cursor moves to `s`'s step unless a task
    /// later in the plan has moved it already. Fills `left` with the other
    /// executors of the step the cursor left, if it moved: their ranks
    /// have just jumped (from the step the sweep is on to one needed
    /// later).
    ///
    /// A task is dispatched once its executors are pinned, so a task whose
    /// executor had to be loaded is dispatched after later ones that found
    /// theirs resident. Moved back to such a task's step, the cursor made
    /// the steps just after it, which the sweep had already passed, count
    /// as coming up: the prefetcher loaded them again, and they were
    /// evicted unused once the cursor went on (up to 15 a sweep of a
    /// 480-step cycle on two workers with every core busy, which then
    /// loaded 298-313 executors where 295-300 do).
    fn set_cursor(&mut self, s: &Slot, seq: u64, left: &mut Left) {
        let id = s.cycle_id.load(Ordering::Relaxed);
        let pos = s.cycle_pos.load(Ordering::Relaxed);
        let Some(c) = self.cycles.get(&id) else {
            return;
        };
        let old = c.cursor;
        if let Some(e) = c.steps.step(pos).rev().find(|&e| c.steps.ids[e] == s.id) {
            s.cycle_pos
                .store(u64::from(c.steps.again[e]), Ordering::Relaxed);
        }
        if seq < c.cursor_seq {
            return;
        }
        if old != pos {
            let others = c.steps.step(old).filter(|&e| c.steps.ids[e] != s.id);
            for (out, e) in left.slots.iter_mut().zip(others) {
                *out = self.slots.get(&c.steps.ids[e]).cloned();
            }
        }
        if let Some(c) = self.cycles.get_mut(&id) {
            c.cursor = pos;
            c.cursor_seq = seq;
        }
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

    /// The executors' sizes, by where they are (one scan, under the lock).
    pub(crate) fn footprint(&self) -> crate::stats::Footprint {
        let mut f = crate::stats::Footprint::default();
        for s in self.lock().slots.values() {
            let size = s.size.load(std::sync::atomic::Ordering::Relaxed) as u64;
            f.executors += 1;
            if s.state_hint().in_memory() {
                f.resident += 1;
                f.resident_bytes += size;
            } else {
                f.evicted_bytes += size;
            }
        }
        f
    }

    /// How many executors are in memory (one scan, under the lock).
    pub(crate) fn count_in_memory(&self) -> usize {
        self.lock()
            .slots
            .values()
            .filter(|s| s.state_hint().in_memory())
            .count()
    }

    /// Declares a new cycle over `steps` (see `Inner::declare_cycle`),
    /// prepared before the lock is taken, where an allocation may trap.
    pub(crate) fn declare_cycle(&self, steps: Steps) -> CycleId {
        self.lock().declare_cycle(steps)
    }

    /// Records that the sweep of `s`'s cycle has reached `s` with the task
    /// of dispatch sequence number `seq`; `left` gets the executors the
    /// cursor left (see `Inner::set_cursor`).
    pub(crate) fn set_cursor(&self, s: &Slot, seq: u64, left: &mut Left) {
        self.lock().set_cursor(s, seq, left)
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

#[cfg(test)]
mod tests {
    use super::Steps;

    #[test]
    fn steps_know_where_each_executor_is_needed_next() {
        // A plain cycle with a repeat: 7 is needed at steps 0 and 2.
        let s = Steps::new([[7u64], [8], [7]]);
        assert_eq!((s.len(), s.starts.len()), (3, 0));
        assert_eq!(s.again, [2, 1, 0]);
        // Pairs: the model block 9 is met at every step, 5 twice in one.
        let s = Steps::new([vec![1u64, 9], vec![2, 9, 5, 5], vec![3, 9]]);
        assert_eq!(s.len(), 3);
        assert_eq!(s.step(1), 2..6);
        assert_eq!(s.step(3), 0..0);
        assert_eq!(s.again, [0, 1, 1, 2, 1, 1, 2, 0]);
        // A step that names nothing still takes its place.
        let s = Steps::new([vec![1u64], vec![], vec![1]]);
        assert_eq!((s.len(), s.step(1)), (3, 1..1));
        assert_eq!(s.again, [2, 0]);
    }
}
