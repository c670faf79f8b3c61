//! The prefetchers: threads that load the executors needed next while the
//! workers compute, so loads overlap the work.
//!
//! Several of them, so that other loads are in flight while one load's
//! reads complete and it is checked and handed over: one load at a time
//! left the device idle between loads. 4 GiB of `.npy` under 1 GiB, k =
//! 100, alternating runs: steady epochs 2.50-2.64 s against 2.29-2.36 s
//! with two; 8 GiB under 2 GiB: 5.03-5.10 s against 3.39-4.84 s, and the
//! first epoch (which reads the whole input) 8.5-10.4 s against 5.5-7.3 s.
//! The workers loaded on demand a thousand times a run with one, a dozen
//! times with two.
//!
//! Four since a PageRank over small executors: a load reads its header,
//! then its data, so a thread keeps at most one executor's requests in
//! flight, and a 1 MiB executor is two of them. Over 1 MiB edge blocks
//! (1 GiB under 128 MiB, 2 workers) the device had 1.8-2.0 reads in
//! flight on average with two threads and 2.7-3.2 with four, and the
//! capped iterations took 1.36-1.86 s with two against 1.27-1.54 s with
//! four (3 alternating pairs). Over 4 MiB blocks, 7-9 reads were in
//! flight with two already: 0.95-0.99 s against 0.94-1.21 s. `outcore
//! kmeans`, 1 GiB under 256 MiB: 6.0-6.6 s with two, 4.9-5.4 s with four,
//! the same inertia and peak (3 alternating pairs).
//!
//! Under an address-space limit (`RLIMIT_AS`) there is one: each thread
//! costs address space (its stack, and the C library's arena for its
//! thread-local destructors), which such a limit counts as it counts
//! memory.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::shared::Shared;
use crate::alloc;
use crate::executor::{Slot, State, NONE};
use crate::policy::Cycle;

impl Shared {
    /// The evicted executor needed soonest, with its rank and cycle.
    ///
    /// Two sources, so that a step costs no scan of the registry: the
    /// positions just ahead of each cycle's cursor (looked up directly:
    /// ranks there move with the cursor), and, for executors with pending
    /// tasks or in no cycle (whose ranks do not move), a list ranked by one
    /// scan, rebuilt when it runs out or after a quarter as many clock
    /// ticks as it held candidates.
    fn next_to_prefetch(&self) -> Option<(u64, Cycle, Arc<Slot>)> {
        let ahead = self.lookahead();
        let mut soon = Vec::new();
        self.pending_soon(&mut soon);
        let in_window = self.registry().upcoming(ahead, &soon, |upcoming| {
            upcoming
                .filter(|m| m.slot.state_hint() == State::Evicted)
                .map(|m| {
                    let cycle = m.cycle();
                    (self.rank(m.slot, cycle), cycle, m.slot.clone())
                })
                .min_by_key(|(r, _, _)| *r)
        });
        let mut cache = self.wanted().lock();
        let now = self.clock_now();
        let mut rebuilt = false;
        loop {
            if cache.stale(now) {
                let mark = self.evicted_mark();
                if rebuilt || (cache.is_empty() && cache.empty_at == Some(mark)) {
                    // Nothing became evicted since a scan found nothing to
                    // load: a scan per dispatch cost the whole registry
                    // (100,000 one-task executors took minutes).
                    return in_window;
                }
                cache.empty_at = None;
                self.registry().scan(ahead, |all| {
                    let steady = all
                        .filter(|m| {
                            let s = m.slot;
                            (s.next_task.load(Ordering::Relaxed) != NONE
                                || s.cycle_id.load(Ordering::Relaxed) == NONE)
                                && s.state_hint() == State::Evicted
                        })
                        .map(|m| (self.rank(m.slot, m.cycle()), m.slot.clone()));
                    cache.rebuild(now, steady, false);
                });
                if cache.is_empty() {
                    cache.empty_at = Some(mark);
                }
                rebuilt = true;
                continue;
            }
            let Some(s) = cache.peek().map(|(_, s)| s.clone()) else {
                continue;
            };
            let fresh = self
                .registry()
                .ranked(&s, ahead, |s, cycle| self.rank(s, cycle));
            let Some((r, cycle)) = fresh.filter(|_| s.state_hint() == State::Evicted) else {
                cache.pop();
                continue;
            };
            return match in_window {
                Some(w) if w.0 <= r => Some(w),
                _ => {
                    cache.pop();
                    Some((r, cycle, s))
                }
            };
        }
    }

    fn prefetch_step(&self) -> bool {
        // Under an address-space limit a demand load waiting for room
        // comes first (see `Shared::demand_waits_for_room`).
        if crate::cap::rlimit_as().is_some() && Shared::demand_waits_for_room() {
            return false;
        }
        let target = self.next_to_prefetch();
        let Some((rank, cycle, slot)) = target else {
            return false;
        };
        if self.prefetch_room(&slot, rank, cycle).is_none() {
            self.keep_wanted(rank, slot);
            return false;
        }
        let Some((file_gen, rank, room)) = self.claim_prefetch(&slot) else {
            return true;
        };
        let size = slot.size.load(Ordering::Relaxed);
        self.loading_starts(size);
        // Whatever happens while room is made (user code runs there, each
        // piece of it caught where it runs), the claim is undone below
        // unless the load goes ahead: the executor never stays `Loading`.
        let fits = catch_unwind(AssertUnwindSafe(|| match room {
            Room::Above(floor) => self.make_room(0, Some(floor)),
            Room::IfIdle(cap) => {
                let in_flight = self.loading_bytes();
                self.pool().is_idle()
                    && alloc::current_usage().saturating_add(in_flight) as u64
                        <= self.eviction_target(cap) / 10 * 9
            }
        }))
        .unwrap_or(false);
        if !fits {
            self.give_back_prefetch(&slot, size, rank);
            return false;
        }
        // Under an address-space limit the load's room is claimed first,
        // from what is free (see `Shared::claim_load`): a prefetch that
        // started and then waited for memory could hold up a worker's load
        // that waits for it in turn.
        let claim = self.claim_load(size, false);
        if crate::cap::rlimit_as().is_some() && claim.is_none() {
            self.give_back_prefetch(&slot, size, rank);
            return false;
        }
        // A damaged file is reported to the task that needs the executor.
        let _ = self.load_slot(&slot, file_gen, Some(size));
        drop(claim);
        alloc::flush_thread();
        true
    }

    /// Claims `slot`, picked for a prefetch, if it is still evicted and
    /// still to be loaded ahead: its copy to load (`file_gen`), its rank
    /// now and how room is made for it; `None` when it is not to be loaded
    /// now (the claim, if made, undone).
    ///
    /// Claimed before room is made, and counted in `loading_bytes` by the
    /// caller: a second prefetcher that picked the same executor finds it
    /// taken instead of evicting for it too, and every `make_room`
    /// meanwhile counts this load. (Claimed after, both prefetchers made
    /// room for one executor, and each counted none of the other's load.)
    ///
    /// Ranked again once claimed, when no task can take it before it is
    /// loaded: the rank it was picked at may be stale. A thread
    /// held up between the pick and the claim (every core busy) found
    /// evicted an executor whose pending task had meanwhile been
    /// dispatched, loaded on demand and run: it loaded it again at the
    /// rank of that task, and it was evicted unused.
    fn claim_prefetch(&self, slot: &Arc<Slot>) -> Option<(u64, u64, Room)> {
        let mut g = slot.lock();
        if g.state != State::Evicted {
            return None;
        }
        let file_gen = g.file_gen;
        slot.set_state(&mut g, State::Loading);
        drop(g);
        let now = self
            .registry()
            .ranked(slot, self.lookahead(), |s, cycle| self.rank(s, cycle))
            .and_then(|(rank, cycle)| Some((rank, self.prefetch_room(slot, rank, cycle)?)));
        let Some((rank, room)) = now else {
            let mut g = slot.lock();
            slot.set_state(&mut g, State::Evicted);
            self.note_evicted();
            return None;
        };
        Some((file_gen, rank, room))
    }

    /// Undoes a prefetcher's claim on `slot` (of `size` bytes, rank
    /// `rank`) that it will not load now: a task waiting for it loads it
    /// itself.
    fn give_back_prefetch(&self, slot: &Arc<Slot>, size: usize, rank: u64) {
        self.loading_ends(size);
        let mut g = slot.lock();
        slot.set_state(&mut g, State::Evicted);
        self.note_evicted();
        drop(g);
        self.keep_wanted(rank, slot.clone());
    }

    /// Puts a candidate the prefetcher may not load now back in its list:
    /// it stays the most urgent one.
    fn keep_wanted(&self, rank: u64, slot: Arc<Slot>) {
        // The list may grow under its lock: no trap there (the eviction it
        // would run takes that lock; under `RLIMIT_AS` a prefetch that
        // cannot claim room comes here on every step, and a trap here
        // deadlocked with a worker's).
        let _bypass = alloc::BypassGuard::new();
        self.wanted().lock().push(rank, slot);
    }

    /// Whether the prefetcher may load `slot` (of rank `rank` in `cycle`)
    /// now, and how room is made for it: by evicting executors ranked
    /// above a floor when it is part of the plan, or only into free memory
    /// while the workers are idle.
    fn prefetch_room(&self, slot: &Slot, rank: u64, cycle: Cycle) -> Option<Room> {
        let next = slot.next_task.load(Ordering::Relaxed);
        let pending = next != NONE;
        let planned = pending || slot.cycle_pos.load(Ordering::Relaxed) != NONE;
        if planned {
            let target = if pending {
                next <= self.pending_horizon()
            } else {
                self.policy().prefetch_target(rank, cycle)
            };
            if !target {
                return None;
            }
            let floor = self.policy().prefetch_floor(cycle, rank)?;
            Some(Room::Above(floor.max(rank)))
        } else {
            self.soft_cap().map(Room::IfIdle)
        }
    }
}

/// How a prefetcher makes room for a load.
enum Room {
    /// Evict executors ranked above this.
    Above(u64),
    /// Evict nothing: load into free memory under the cap's low watermark
    /// (less a tenth), and only while the workers are idle.
    IfIdle(u64),
}

/// Prefetch threads a runtime starts: four, or one under an address-space
/// limit.
pub(crate) fn prefetchers() -> usize {
    if crate::cap::rlimit_as().is_some() {
        1
    } else {
        4
    }
}

/// A prefetch thread's loop.
pub(crate) fn prefetch_loop(sh: Arc<Shared>) {
    while !sh.pool().is_shut_down() {
        if !sh.prefetch_on() || !sh.prefetch_step() {
            // Nothing to load: pages freed meanwhile are trimmed here too,
            // under a cap. Without one, trimming every 50 ms purged what
            // the tasks free and take again: in-memory Lloyd iterations
            // at 128-D were 13% slower (loads and `make_room` trim).
            if sh.soft_cap().is_some() {
                sh.trim(0);
            }
            sh.wait_for_prefetch_work(Duration::from_millis(50));
        }
    }
    alloc::flush_thread();
}
