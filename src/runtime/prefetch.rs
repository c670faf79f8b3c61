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

impl Shared {
    /// The prefetcher's one step: loads the evicted executor needed soonest
    /// (lowest rank: a pending task, or one of the next turns in its
    /// declared cycle) if it fits, evicting only idle executors that are not
    /// coming up, highest rank first. Without a plan for an executor (idle,
    /// outside any cycle), it comes back only when no work is pending and
    /// usage is below 90% of the low watermark. Returns whether it loaded
    /// something.
    fn prefetch_step(&self) -> bool {
        let target = {
            let reg = self.registry.lock();
            let mut best: Option<(u64, &Arc<Slot>)> = None;
            for s in reg.slots.values() {
                if s.state_hint() != State::Evicted {
                    continue;
                }
                let r = self.rank(s, &reg);
                if best.is_none_or(|(br, _)| r < br) {
                    best = Some((r, s));
                }
            }
            best.map(|(r, s)| (r, reg.cycle_of(s, self.lookahead()), s.clone()))
        };
        let Some((rank, cycle, slot)) = target else {
            return false;
        };
        if !self.prefetch_may_load(&slot, rank, cycle) {
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
