//! Loading and pinning: how a task gets its executor's value (loading it
//! from its spill file when evicted) and gives it back.
//!
//! A pinned executor's value is out of its slot, held by the task, so an
//! evictor has nothing to touch: a task never sees its executor evicted
//! underneath it.

use std::any::Any;
use std::cell::Cell;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::shared::{drop_user_value, panic_message, pinned_here, Shared};
use crate::alloc;
use crate::error::{Error, Result};
use crate::executor::{Damage, PinStep, Slot, SlotGuard, State, FROM_LINEAGE};
use crate::spill::Loaded;
use crate::stats::Counters;

impl Shared {
    /// Loads an executor the caller has put in the `Loading` state. A
    /// prefetcher has already counted the load in `loading_bytes` and made
    /// room for it (`reserved`: its size); a demand load (`None`) does both
    /// here.
    pub(crate) fn load_slot(
        &self,
        slot: &Slot,
        file_gen: u64,
        reserved: Option<usize>,
    ) -> Result<()> {
        let prefetch = reserved.is_some();
        let size = match reserved {
            Some(size) => size,
            None => {
                let size = slot.size.load(Ordering::Relaxed);
                // Loads in flight count against the cap in `make_room`, so
                // that concurrent loads do not each assume the same
                // headroom: this one counts before it makes room.
                self.loading_starts(size);
                // Making room runs other executors' `Serialize`; whatever
                // happens there, this load goes on (and the slot never
                // stays `Loading`).
                let _ = catch_unwind(AssertUnwindSafe(|| self.make_room(0, None)));
                size
            }
        };
        // A prefetch holds its claim already (taken on this thread).
        let claim = if prefetch {
            None
        } else {
            self.claim_load(size, true)
        };
        let before = alloc::thread_own_net();
        // The tier's copy first, when it holds one: else (or when it
        // fails) the disk's, or the lineage.
        let tier_gen = match self.tier() {
            Some(_) => slot.lock().tier_gen,
            None => 0,
        };
        let from_tier = self.read_from_tier(slot, tier_gen);
        let tier_failed = tier_gen != 0 && from_tier.is_none();
        let rebuild = from_tier.is_none() && slot.lineage.is_some() && file_gen == FROM_LINEAGE;
        let result = match from_tier {
            Some(v) => Ok((v, Loaded::default())),
            None => self.read_value(slot, file_gen),
        };
        drop(claim);
        let delta = alloc::thread_own_net() - before;
        self.loading_ends(size);
        let mut g = slot.lock();
        if tier_failed {
            g.tier_gen = 0;
        }
        match result {
            Ok((v, read)) => {
                g.value = Some(v);
                g.dirty = false;
                if rebuild && !slot.lineage_repeatable {
                    // Built once: from now on the executor spills.
                    g.dirty = true;
                    g.file_gen = 0;
                }
                if delta > 0 {
                    slot.size.store(delta as usize, Ordering::Relaxed);
                }
                slot.last_use.store(self.tick(), Ordering::Relaxed);
                slot.prefetched.store(prefetch, Ordering::Relaxed);
                // Counted before the value is published: a task that uses
                // it (and whatever its caller reads next) sees the load in
                // the counters.
                self.counters().count_load(
                    slot.size.load(Ordering::Relaxed) as u64,
                    read,
                    rebuild,
                    prefetch,
                );
                slot.set_state(&mut g, State::Resident);
                drop(g);
                self.note_size(slot, 0);
                self.bump_generation();
                self.trim_after_load();
                Ok(())
            }
            Err(source) => {
                let damage = Damage::new(source);
                let e = damage.error();
                g.damage = Some(damage);
                slot.set_state(&mut g, State::Damaged);
                Err(self.load_error(slot, file_gen, e))
            }
        }
    }

    /// Under an address-space limit, the room for a load of `size` bytes,
    /// claimed before the load allocates anything (see
    /// `alloc/claim.rs`): a load that starts then never waits for memory,
    /// so a load in progress is contention that passes. A prefetch
    /// (`demand` false) only claims what is free. A demand load evicts
    /// for its claim (through the trap's token), and waits while other
    /// threads' loads, evictions or tasks hold the room: they pass (a
    /// join that holds executors gives them back rather than wait, see
    /// [`join_room`](Self::join_room)). It waits [`CLAIM_PATIENCE`] after
    /// the last change in what the others hold, or, when this thread holds
    /// executors itself (a task that runs a batch of its own), a short
    /// while ([`CLAIM_PATIENCE_HOLDING`]); then it goes ahead without (the
    /// trap does what it can).
    pub(crate) fn claim_load(&self, size: usize, demand: bool) -> Option<alloc::LoadClaim> {
        crate::cap::rlimit_as()?;
        // A join's load claimed its room already (`join_room`).
        if alloc::claim_held() {
            return None;
        }
        let bytes = size.saturating_add(alloc::CLAIM_PAD);
        // A prefetch never takes room a demand load is waiting for: it
        // would load what the waiting load then evicts, over and over.
        if !demand && CLAIM_WAITERS.load(Ordering::Acquire) > 0 {
            return None;
        }
        if let Some(c) = alloc::LoadClaim::new(bytes) {
            return Some(c);
        }
        if !demand {
            return None;
        }
        CLAIM_WAITERS.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting;
        // Pins this thread holds will not pass while it waits here.
        let mine = HELD.with(Cell::get);
        let patience = if mine == 0 {
            CLAIM_PATIENCE
        } else {
            CLAIM_PATIENCE_HOLDING
        };
        let mut since = Instant::now();
        let mut seen = (self.pinned_now(), self.loading_bytes());
        loop {
            alloc::purge();
            if let Some(c) = alloc::LoadClaim::new(bytes) {
                return Some(c);
            }
            let freed = alloc::evict_external(bytes);
            let now = (self.pinned_now(), self.loading_bytes());
            let others = now.0 > mine || now.1 > size;
            if freed == 0 && !others {
                break;
            }
            // Progress: what the others hold changed, or bytes were freed
            // (1 says only that the trap's token was busy).
            if now != seen || freed > 1 {
                seen = now;
                since = Instant::now();
            }
            // Alone (no other thread pins or loads anything), only an
            // eviction in flight can still help ("busy" is also this very
            // load, on its way in): a short while. Waiting the full
            // patience there held a lone worker a minute per load.
            let wait = if others {
                patience
            } else {
                CLAIM_PATIENCE_HOLDING
            };
            if since.elapsed() >= wait {
                break;
            }
            if freed <= 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        None
    }

    /// Whether a demand load waits for room in [`claim_load`]
    /// (process-wide): a prefetch then stays out of the way, not even
    /// counting a load it would start (the waiter reads that count as
    /// other threads' progress, and a prefetch tried and given back over
    /// and over kept it waiting for ever).
    ///
    /// [`claim_load`]: Self::claim_load
    pub(crate) fn demand_waits_for_room() -> bool {
        CLAIM_WAITERS.load(Ordering::Acquire) > 0
    }

    /// Under an address-space limit, the room to load `slot` for a join
    /// whose executors before it this thread holds: a claim, or `None`
    /// when no load is needed or none can help (no other thread pins or
    /// loads anything: the join is then as alone as it will ever be, and
    /// its load goes ahead as any other). [`NoRoom`] when the room is
    /// held by other threads' pins or loads: the join must give back what
    /// it holds and try again. Waiting instead, holding its first
    /// executors, it could wait for a thread that waits for it (two joins
    /// each holding one executor and each loading another).
    pub(crate) fn join_room(
        &self,
        slot: &Slot,
    ) -> std::result::Result<Option<alloc::LoadClaim>, NoRoom> {
        // An executor another thread loads or writes is not waited for
        // either: the acquire gives way (`gives_way`).
        if crate::cap::rlimit_as().is_none() || slot.lock().state.pin_step() != PinStep::Load {
            return Ok(None);
        }
        let bytes = slot
            .size
            .load(Ordering::Relaxed)
            .saturating_add(alloc::CLAIM_PAD);
        // A few rounds: each evicts what is idle (the trap's token may be
        // taken by another thread).
        for _ in 0..8 {
            alloc::purge();
            if let Some(c) = alloc::LoadClaim::new(bytes) {
                return Ok(Some(c));
            }
            if alloc::evict_external(bytes) == 0 {
                break;
            }
        }
        let mine = HELD.with(Cell::get);
        if self.pinned_now() > mine || self.loading_bytes() > 0 {
            Err(NoRoom)
        } else {
            Ok(None)
        }
    }

    /// Reads `slot`'s value from the spill tier's copy `gen` (0: none):
    /// `None` when there is none, or the tier failed (then counted, said
    /// once, and forgotten by the tier).
    fn read_from_tier(&self, slot: &Slot, gen: u64) -> Option<Box<dyn Any + Send>> {
        let tier = self.tier().filter(|_| gen != 0)?;
        // The tier and the value's `Deserialize` are user code.
        let got = catch_unwind(AssertUnwindSafe(|| {
            (slot.tier_get)(tier, self.ident(), slot.key(gen))
        }))
        .unwrap_or_else(|p| {
            Err(io::Error::other(format!(
                "panicked: {}",
                panic_message(&*p)
            )))
        });
        match got {
            Ok((v, bytes)) => {
                Counters::add(&self.counters().tier_loads, 1);
                Counters::add(&self.counters().tier_bytes_loaded, bytes);
                Some(v)
            }
            Err(e) => {
                self.note_tier_failure(tier, slot, &e);
                self.forget_in_tier(slot, gen);
                None
            }
        }
    }

    /// Reads `slot`'s value from the copy `file_gen` names: its spill
    /// file, or its lineage (which reads nothing from the spill store).
    fn read_value(&self, slot: &Slot, file_gen: u64) -> io::Result<(Box<dyn Any + Send>, Loaded)> {
        let path = self.store().path_for(slot.id);
        let rebuild = match (&slot.lineage, file_gen) {
            (Some(l), FROM_LINEAGE) => Some(l),
            _ => None,
        };
        // The value's `Deserialize` and the lineage are user code: a panic
        // is a damaged load.
        catch_unwind(AssertUnwindSafe(|| match rebuild {
            Some(l) => l().map(|v| {
                let nothing = Loaded {
                    bytes: 0,
                    direct_bytes: 0,
                };
                (v, nothing)
            }),
            None => (slot.load)(&path, slot.key(file_gen)),
        }))
        .unwrap_or_else(|p| {
            let what = if rebuild.is_some() {
                "rebuilding"
            } else {
                "deserialization"
            };
            Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{what} panicked: {}", panic_message(&*p)),
            ))
        })
    }

    /// Counts `slot` in [`Stats::oversized`](crate::Stats::oversized) when
    /// its size, just measured, is over the cap and `before` was not: 0
    /// for an executor that has just come into memory, its size before the
    /// task for one a task changed.
    pub(crate) fn note_size(&self, slot: &Slot, before: usize) {
        let Some(cap) = self.soft_cap() else { return };
        let size = slot.size.load(Ordering::Relaxed);
        if size as u64 > cap && before as u64 <= cap {
            self.counters().note_oversized(&slot.label, size, cap);
        }
    }

    /// The error for a failed load of `slot` from the copy `file_gen`
    /// names (a spill file, or its lineage).
    fn load_error(&self, slot: &Slot, file_gen: u64, source: io::Error) -> Error {
        if file_gen == FROM_LINEAGE && slot.lineage.is_some() {
            Error::Rebuild {
                executor: slot.label.clone(),
                source,
            }
        } else {
            Error::SpillRead {
                executor: slot.label.clone(),
                file: self.store().path_for(slot.id),
                source,
            }
        }
    }

    /// Takes an executor's value for a task: loads it if needed and pins
    /// it. `None` when this thread holds executors and should give them
    /// back rather than wait (see [`gives_way`]).
    pub(crate) fn acquire(&self, slot: &Slot, write: bool) -> Result<Option<Box<dyn Any + Send>>> {
        let start = Instant::now();
        let mut waited = false;
        let mut g = slot.lock();
        loop {
            if g.drop_on_release {
                // Its last handle is gone: the executor goes once the
                // task that holds it is done (see `remove`).
                return Err(self.pin_error(slot, &g));
            }
            match g.state.pin_step() {
                PinStep::Pin => {
                    let Some(v) = g.value.take() else {
                        return Err(Error::Runtime(format!(
                            "{}: resident without a value",
                            slot.label
                        )));
                    };
                    let stale = if write { Slot::make_dirty(&mut g) } else { 0 };
                    slot.set_state(&mut g, State::Pinned);
                    drop(g);
                    self.forget_in_tier(slot, stale);
                    self.pin();
                    held(1);
                    self.count_pinned(slot, waited, start);
                    return Ok(Some(v));
                }
                PinStep::Load => {
                    waited = true;
                    g = self.demand_load(slot, g)?;
                }
                PinStep::Wait if g.state == State::Pinned && pinned_here(slot.id) => {
                    // A task asking for its own executor would wait for
                    // itself.
                    return Err(Error::Reentrant {
                        executor: slot.label.clone(),
                    });
                }
                PinStep::Wait if gives_way(g.state) => return Ok(None),
                PinStep::Wait => {
                    waited = true;
                    g = slot.wait(g);
                }
                PinStep::Fail => return Err(self.pin_error(slot, &g)),
            }
        }
    }

    /// Loads an evicted executor a task waits for (the caller holds its
    /// lock, `g`, and gets it back).
    fn demand_load<'a>(&self, slot: &'a Slot, mut g: SlotGuard<'a>) -> Result<SlotGuard<'a>> {
        let file_gen = g.file_gen;
        slot.set_state(&mut g, State::Loading);
        drop(g);
        Counters::add(&self.counters().demand_loads, 1);
        self.load_slot(slot, file_gen, None)?;
        Ok(slot.lock())
    }

    /// Counts a task's pin of `slot`: a prefetch hit when the prefetcher
    /// loaded it and the task did not wait, else the time it waited since
    /// `start`.
    fn count_pinned(&self, slot: &Slot, waited: bool, start: Instant) {
        if slot.prefetched.swap(false, Ordering::Relaxed) && !waited {
            Counters::add(&self.counters().prefetch_hits, 1);
        }
        if waited {
            Counters::add(
                &self.counters().load_wait_nanos,
                start.elapsed().as_nanos() as u64,
            );
        }
    }

    /// Why a task cannot have an executor that is poisoned, damaged or
    /// removed.
    fn pin_error(&self, slot: &Slot, g: &SlotGuard<'_>) -> Error {
        match g.state {
            State::Poisoned => Error::Poisoned {
                executor: slot.label.clone(),
            },
            State::Damaged => {
                let e = match &g.damage {
                    Some(d) => d.error(),
                    None => io::Error::from(io::ErrorKind::InvalidData),
                };
                self.load_error(slot, g.file_gen, e)
            }
            _ => Error::UnknownExecutor {
                executor: slot.label.clone(),
                removed: true,
            },
        }
    }

    /// Pins an executor for a task that reads it side by side with other
    /// such tasks (loading it if needed): the value stays in the slot, and
    /// the task gets a pointer to it, valid until its
    /// [`release_shared`](Self::release_shared). Waits while a task holds
    /// it alone, or while it moves.
    pub(crate) fn acquire_shared(&self, slot: &Slot) -> Result<Option<*const (dyn Any + Send)>> {
        let start = Instant::now();
        let mut waited = false;
        let mut g = slot.lock();
        loop {
            if g.drop_on_release {
                // Removed while tasks read it: none joins them (see
                // `remove`).
                return Err(self.pin_error(slot, &g));
            }
            let joinable = g.state == State::Pinned && g.readers > 0;
            if g.state == State::Resident || joinable {
                let Some(v) = g.value.as_deref() else {
                    return Err(Error::Runtime(format!(
                        "{}: resident without a value",
                        slot.label
                    )));
                };
                let ptr: *const (dyn Any + Send) = v;
                g.readers += 1;
                if !joinable {
                    slot.set_state(&mut g, State::Pinned);
                }
                drop(g);
                if !joinable {
                    self.pin();
                    held(1);
                }
                self.count_pinned(slot, waited, start);
                return Ok(Some(ptr));
            }
            match g.state.pin_step() {
                PinStep::Load => {
                    waited = true;
                    g = self.demand_load(slot, g)?;
                }
                PinStep::Wait if g.state == State::Pinned && pinned_here(slot.id) => {
                    return Err(Error::Reentrant {
                        executor: slot.label.clone(),
                    });
                }
                PinStep::Wait if gives_way(g.state) => return Ok(None),
                PinStep::Pin | PinStep::Wait => {
                    waited = true;
                    g = slot.wait(g);
                }
                PinStep::Fail => return Err(self.pin_error(slot, &g)),
            }
        }
    }

    /// Ends a shared read of [`acquire_shared`](Self::acquire_shared): the
    /// last reader unpins the executor (and drops it, when a task removed
    /// it meanwhile).
    pub(crate) fn release_shared(&self, slot: &Slot) {
        let mut g = slot.lock();
        g.readers = g.readers.saturating_sub(1);
        if g.readers > 0 {
            return;
        }
        held(-1);
        if g.drop_on_release {
            let v = g.value.take();
            slot.set_state(&mut g, State::Removed);
            drop(g);
            drop_user_value(v);
        } else {
            slot.set_state(&mut g, State::Resident);
            drop(g);
            slot.last_use.store(self.tick(), Ordering::Relaxed);
        }
        self.unpin();
        self.bump_generation();
    }

    /// Puts a task's value back and unpins the executor; `changed` marks it
    /// dirty (a read task that changed it through interior mutability).
    pub(crate) fn release(
        &self,
        slot: &Slot,
        v: Box<dyn Any + Send>,
        changed: bool,
        poisoned: bool,
    ) {
        held(-1);
        let mut g = slot.lock();
        if g.drop_on_release {
            // The task dropped the executor's last handle: it goes now.
            slot.set_state(&mut g, State::Removed);
            drop(g);
            drop_user_value(v);
            self.unpin();
            self.bump_generation();
            return;
        }
        g.value = Some(v);
        let stale = if changed { Slot::make_dirty(&mut g) } else { 0 };
        slot.set_state(
            &mut g,
            if poisoned {
                State::Poisoned
            } else {
                State::Resident
            },
        );
        drop(g);
        self.forget_in_tier(slot, stale);
        slot.last_use.store(self.tick(), Ordering::Relaxed);
        self.unpin();
        self.bump_generation();
    }

    /// Records that a task on `slot` with sequence `seq` is dispatched: it
    /// leaves the pending queue and its cycle's cursor moves to it.
    pub(crate) fn dispatched(&self, slot: &Slot, seq: u64) {
        {
            let mut g = slot.lock();
            if let Some(p) = g.pending.iter().position(|&s| s == seq) {
                g.pending.remove(p);
            }
            if g.pending.is_empty() && g.pending.capacity() > 64 {
                // A long batch is done with it: give the memory back.
                g.pending = std::collections::VecDeque::new();
            }
            self.sync_pending(slot, &g);
        }
        if slot.cycle_id.load(Ordering::Relaxed) != crate::executor::NONE {
            let mut left = super::registry::Left::default();
            self.registry().set_cursor(slot, seq, &mut left);
            for s in left.drain().filter(|s| s.state_hint() == State::Resident) {
                self.note_idle(&s);
            }
        }
        slot.last_use.store(self.tick(), Ordering::Relaxed);
        self.wake_prefetchers();
    }

    /// Removes an executor (its handle was dropped or taken). With
    /// `drop_value`, waits for a task or a move in progress to finish and
    /// drops the value.
    pub(crate) fn remove(&self, slot: &Slot, drop_value: bool) {
        self.registry().remove(slot.id);
        let mut g = slot.lock();
        if drop_value && g.state == State::Pinned && pinned_here(slot.id) {
            // The task running on it dropped its last handle: the value
            // goes when the task ends (waiting here would wait for that
            // very task).
            g.drop_on_release = true;
            let written = spilled(&g);
            let in_tier = std::mem::take(&mut g.tier_gen);
            drop(g);
            self.forget_in_tier(slot, in_tier);
            if written {
                let _ = std::fs::remove_file(self.store().path_for(slot.id));
            }
            return;
        }
        if drop_value {
            // From now on no task takes it, nor joins the tasks reading it
            // (a read side by side could otherwise start after the drop,
            // where a task that holds it alone fails): the last one to
            // give it back drops it.
            g.drop_on_release = true;
        }
        while matches!(g.state, State::Pinned | State::Loading | State::Evicting) && drop_value {
            g = slot.wait(g);
        }
        let written = spilled(&g);
        let in_tier = std::mem::take(&mut g.tier_gen);
        let v = g.value.take();
        slot.set_state(&mut g, State::Removed);
        drop(g);
        self.forget_in_tier(slot, in_tier);
        drop_user_value(v);
        if written {
            let _ = std::fs::remove_file(self.store().path_for(slot.id));
        }
    }
}

/// How long a demand load waits for room after the last change in what
/// other threads' tasks and loads hold, before it goes ahead without a
/// claim: they pass, and a task may run for a long while.
const CLAIM_PATIENCE: Duration = Duration::from_secs(60);

/// The same for a thread that holds executors itself: a task running a
/// batch of its own, whose executors will not pass while it waits.
const CLAIM_PATIENCE_HOLDING: Duration = Duration::from_millis(200);

/// A join's next executor has no room while other threads hold it (see
/// [`Shared::join_room`]).
#[derive(Debug)]
pub(crate) struct NoRoom;

/// Demand loads waiting in `claim_load` (process-wide).
static CLAIM_WAITERS: AtomicUsize = AtomicUsize::new(0);

/// Counts a demand load out of [`CLAIM_WAITERS`] when dropped.
struct Waiting;

impl Drop for Waiting {
    fn drop(&mut self) {
        CLAIM_WAITERS.fetch_sub(1, Ordering::AcqRel);
    }
}

thread_local! {
    /// Executors this thread pinned and has not given back (approximate:
    /// a shared pin counts on the thread that made it). `claim_load` does
    /// not wait for these.
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// Whether a thread that wants an executor in `state` gives back what it
/// holds instead of waiting: under an address-space limit, while it holds
/// executors and another thread loads or writes this one. That load may
/// be waiting for the very room this thread holds (a demand load's
/// patience is a minute), so waiting could wait for ever.
fn gives_way(state: State) -> bool {
    matches!(state, State::Loading | State::Evicting)
        && HELD.with(Cell::get) > 0
        && crate::cap::rlimit_as().is_some()
}

/// Counts a pin this thread made (+1) or gave back (-1).
fn held(d: isize) {
    HELD.with(|h| h.set(h.get().saturating_add_signed(d)));
}

/// Whether a spill file may exist for the slot: a write was started once
/// (one that failed part-way may have left a file). Executors that never
/// left memory have none, and removing them costs no system call.
fn spilled(g: &crate::executor::SlotGuard<'_>) -> bool {
    g.next_gen > 1 || g.state == State::Evicting
}
