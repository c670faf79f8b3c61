//! The prefetcher: a thread that loads the executors needed next while the
//! workers compute, so loads overlap the work.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::evict::low_watermark;
use super::shared::Shared;
use crate::alloc;
use crate::executor::{Slot, State, NONE};
use crate::policy::Cycle;

/// Evicted executors ranked by one scan of the registry, for the
/// prefetcher: the most urgent last.
#[derive(Default)]
pub(crate) struct Wanted {
    list: Vec<(u64, Arc<Slot>)>,
    /// The runtime's clock when the list was built, and its length then.
    built_at: u64,
    built_len: u64,
}

impl Shared {
    /// The evicted executor needed soonest, with its rank and cycle: the
    /// top of the ranked list, checked against its rank now. Rebuilt by one
    /// scan when it runs out or after a quarter as many clock ticks as it
    /// held candidates, so a step costs O(log n) amortised, not a scan.
    fn next_to_prefetch(&self) -> Option<(u64, Cycle, Arc<Slot>)> {
        let mut cache = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.clock_now();
        let mut rebuilt = false;
        loop {
            if cache.list.is_empty()
                || now.saturating_sub(cache.built_at) > cache.built_len / 4 + 16
            {
                if rebuilt {
                    return None;
                }
                cache.list.clear();
                {
                    let reg = self.registry.lock();
                    for s in reg.slots.values() {
                        if s.state_hint() == State::Evicted {
                            cache.list.push((self.rank(s, &reg), s.clone()));
                        }
                    }
                }
                // Descending: the most urgent last.
                cache
                    .list
                    .sort_unstable_by_key(|(r, _)| std::cmp::Reverse(*r));
                cache.built_at = now;
                cache.built_len = cache.list.len() as u64;
                rebuilt = true;
            }
            let Some((cached, s)) = cache.list.pop() else {
                continue;
            };
            if s.state_hint() != State::Evicted {
                continue;
            }
            let (r, cycle) = {
                let reg = self.registry.lock();
                if !reg.slots.contains_key(&s.id) {
                    continue;
                }
                (self.rank(&s, &reg), reg.cycle_of(&s, self.lookahead()))
            };
            if r > cached && cache.list.last().is_some_and(|(next, _)| r > *next) {
                // Needed later than when ranked: back in the list.
                let at = cache.list.partition_point(|(x, _)| *x > r);
                cache.list.insert(at, (r, s));
                continue;
            }
            return Some((r, cycle, s));
        }
    }
    /// The prefetcher's one step: loads the evicted executor needed soonest
    /// (lowest rank: a pending task, or one of the next turns in its
    /// declared cycle) if it fits, evicting only idle executors that are not
    /// coming up, highest rank first. Without a plan for an executor (idle,
    /// outside any cycle), it comes back only when no work is pending and
    /// usage is below 90% of the low watermark. Returns whether it loaded
    /// something.
    fn prefetch_step(&self) -> bool {
        let target = self.next_to_prefetch();
        let Some((rank, cycle, slot)) = target else {
            return false;
        };
        if !self.prefetch_may_load(&slot, rank, cycle) {
            // Not now: it stays the most urgent candidate.
            let mut cache = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
            cache.list.push((rank, slot));
            return false;
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

    /// Whether the prefetcher may load `slot` (of rank `rank` in `cycle`)
    /// now, making room for it first when it is part of the plan.
    fn prefetch_may_load(&self, slot: &Slot, rank: u64, cycle: Cycle) -> bool {
        let size = slot.size.load(Ordering::Relaxed);
        let pending = slot.next_task.load(Ordering::Relaxed) != NONE;
        let planned = pending || slot.cycle_pos.load(Ordering::Relaxed) != NONE;
        if planned {
            if !self.policy.prefetch_target(rank, cycle) && !pending {
                return false;
            }
            let Some(floor) = self.policy.prefetch_floor(cycle, rank) else {
                return false;
            };
            self.make_room(size, Some(floor.max(rank)))
        } else {
            let Some(cap) = self.cap else { return false };
            self.pool.is_idle()
                && (alloc::current_usage() + size) as u64 <= low_watermark(cap) / 10 * 9
        }
    }
}

/// The prefetch thread's loop.
pub(crate) fn prefetch_loop(sh: Arc<Shared>) {
    while !sh.pool.is_shut_down() {
        if !sh.prefetch_on || !sh.prefetch_step() {
            sh.prefetch_signal.wait(Duration::from_millis(50));
        }
    }
    alloc::flush_thread();
}
