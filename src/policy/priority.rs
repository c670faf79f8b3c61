//! The dispatch-plan policy ([`EvictionPolicy::Priority`](super::EvictionPolicy::Priority)):
//! pending executors in dispatch order, then the executors coming up in
//! their declared cycle, then the rest of each cycle in a fixed order
//! spread over it, then idle executors outside any cycle, least recently
//! used first.

use super::{age, Cycle, Policy, UseInfo, IDLE_RANK};

/// Ranks of executors with a pending task are below this.
const PENDING_TOP: u64 = IDLE_RANK;
/// Ranks of idle executors in a cycle start here.
const CYCLE_BASE: u64 = IDLE_RANK;
/// Ranks of idle executors outside any cycle start here.
const IDLE_BASE: u64 = 1 << 63;

/// Follow the dispatch plan (Belady's rule for a known plan).
#[derive(Debug)]
pub(crate) struct Priority;

/// The place of cycle position `pos` in the bit-reversal (van der Corput)
/// order of `0..len`: any prefix of that order is spread evenly over the
/// cycle. Smaller is kept longer.
fn spread(pos: u64, len: u64) -> u64 {
    let bits = 64 - len.saturating_sub(1).leading_zeros();
    if bits == 0 {
        return 0;
    }
    pos.reverse_bits() >> (64 - bits)
}

impl Policy for Priority {
    /// Executors in a declared cycle that are not coming up within
    /// `cycle.ahead` positions rank by a fixed, evenly spread order of their
    /// positions. On a cyclic plan that holds more data than memory, every
    /// fixed resident set costs the same loads per sweep (each executor
    /// outside it is loaded once); Belady's rule keeps the executors at the
    /// start of the cycle, so all the loads come in one run at its end,
    /// where they outpace the computation and the workers wait. A resident
    /// set spread over the cycle puts a load between every few resident
    /// executors, so the loads overlap the work on the resident ones. The
    /// set is also stable: the executor just used is evicted only when it
    /// is outside the set.
    fn rank(&self, u: UseInfo, cycle: Cycle) -> u64 {
        if let Some(seq) = u.next_task {
            seq.min(PENDING_TOP - 1)
        } else if let (Some(pos), true) = (u.cycle_pos, cycle.len > 0) {
            // Distance to its next turn. The cursor's executor is the one
            // the sweep is on (a batch may stop part-way through it and the
            // next one go on with it): 0.
            let len = cycle.len;
            let d = (pos % len + len - cycle.cursor % len) % len;
            let ahead = cycle.ahead.min(len);
            if d < ahead {
                CYCLE_BASE + d
            } else {
                CYCLE_BASE + ahead + spread(pos % len, len)
            }
        } else {
            IDLE_BASE + age(u.last_use)
        }
    }

    /// One with a pending task, or one coming up in its declared cycle
    /// (within `cycle.ahead` positions).
    fn prefetch_target(&self, rank: u64, cycle: Cycle) -> bool {
        rank < CYCLE_BASE || (cycle.len > 0 && rank < CYCLE_BASE + cycle.ahead)
    }

    /// For an executor a pending task needs (the prefetcher takes those
    /// within a few tasks of the workers): any executor needed after it,
    /// pending ones included, as a load on demand would evict. Executors
    /// a cyclic sweep keeps between its batches become pending when the
    /// next batch names them all; with only executors not pending to
    /// evict, memory held them until a task had used each, and the
    /// prefetcher could not load ahead (a capped PageRank: 2,292 refusals
    /// and 92-120 loads on demand in 6 iterations; 11-13 after).
    ///
    /// For an executor coming up in its cycle: any executor with no
    /// pending task that is not coming up in its cycle (the spread order
    /// then decides which). That floor does not depend on the cycle's
    /// length, so the executors coming up in *other* cycles (all ranked
    /// below `CYCLE_BASE + ahead`) are not displaced either.
    fn prefetch_floor(&self, cycle: Cycle, rank: u64) -> Option<u64> {
        if rank < PENDING_TOP {
            return Some(rank);
        }
        let floor = if cycle.len > 0 {
            CYCLE_BASE + cycle.ahead
        } else {
            CYCLE_BASE
        };
        (rank < floor).then_some(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{c, u};
    use super::super::{Cycle, EvictionPolicy};
    use proptest::prelude::*;

    #[test]
    fn pending_in_dispatch_order_then_cycle_then_idle() {
        let p = EvictionPolicy::Priority;
        let c = c(4, 1, 2);
        let soon = p.rank(u(Some(10), Some(3), 5), c);
        let later = p.rank(u(Some(20), None, 99), c);
        let next_in_cycle = p.rank(u(None, Some(2), 1), c);
        let later_in_cycle = p.rank(u(None, Some(0), 100), c);
        let idle_old = p.rank(u(None, None, 1), c);
        let idle_new = p.rank(u(None, None, 50), c);
        assert!(soon < later);
        assert!(later < next_in_cycle);
        assert!(next_in_cycle < later_in_cycle);
        assert!(later_in_cycle < idle_new);
        assert!(
            idle_new < idle_old,
            "among idle, least recently used goes first"
        );
    }

    #[test]
    fn the_prefetcher_looks_only_a_short_way_ahead() {
        let p = EvictionPolicy::Priority;
        let c = c(30, 10, 3);
        let rank_at = |pos: u64| p.rank(u(None, Some(pos), 0), c);
        assert!(p.prefetch_target(rank_at(11), c));
        assert!(p.prefetch_target(rank_at(12), c));
        assert!(!p.prefetch_target(rank_at(13), c));
        assert!(!p.prefetch_target(rank_at(9), c));
        assert!(
            p.prefetch_target(p.rank(u(Some(500), None, 0), c), c),
            "pending tasks always"
        );
        assert!(
            !p.prefetch_target(p.rank(u(None, None, 0), c), c),
            "idle, outside the cycle"
        );
    }

    #[test]
    fn a_pending_tasks_executor_displaces_only_what_is_needed_after_it() {
        let p = EvictionPolicy::Priority;
        for c in [c(30, 10, 4), Cycle::default()] {
            let floor = p.prefetch_floor(c, p.rank(u(Some(40), None, 0), c));
            let floor = floor.expect("a pending task's executor is prefetched");
            // Pending later in the batch (the executors a sweep kept, once
            // the next batch names them), idle, anywhere in a cycle: may go.
            for later in [
                u(Some(41), None, 0),
                u(Some(500), Some(3), 0),
                u(None, None, 9),
                u(None, Some(11), 0),
            ] {
                assert!(p.rank(later, c) > floor, "{later:?} in {c:?}");
            }
            // Needed sooner: stays.
            assert!(p.rank(u(Some(39), Some(11), 0), c) <= floor);
        }
    }

    #[test]
    fn the_prefetcher_never_displaces_what_comes_up_next() {
        let p = EvictionPolicy::Priority;
        let c = c(30, 10, 4);
        let rank_at = |pos: u64| p.rank(u(None, Some(pos), 0), c);
        let floor = p.prefetch_floor(c, rank_at(10)).unwrap();
        for pos in [10, 11, 12, 13] {
            assert!(rank_at(pos) < floor, "pos {pos}");
        }
        for pos in (0..10).chain(14..30) {
            assert!(rank_at(pos) >= floor, "pos {pos}");
        }
        assert!(p.rank(u(None, None, 5), c) >= floor);
        // What comes up may be loaded early; what does not, may not.
        assert_eq!(p.prefetch_floor(c, rank_at(11)), Some(floor));
        assert_eq!(p.prefetch_floor(c, rank_at(20)), None);
    }

    /// Which positions a cache of `keep` executors holds: the `keep`
    /// lowest-ranked ones (those the policy evicts last).
    fn kept(len: u64, cursor: u64, keep: usize) -> Vec<u64> {
        let p = EvictionPolicy::Priority;
        let c = c(len, cursor, 0);
        let mut pos: Vec<u64> = (0..len).collect();
        pos.sort_by_key(|&i| p.rank(u(None, Some(i), 0), c));
        let mut k = pos[..keep].to_vec();
        k.sort_unstable();
        k
    }

    #[test]
    fn the_resident_set_is_spread_over_the_cycle_and_stable() {
        // Half of 16: every other position, wherever the sweep is.
        for cursor in 0..16 {
            assert_eq!(kept(16, cursor, 8), vec![0, 2, 4, 6, 8, 10, 12, 14]);
        }
        // A quarter of 16: every fourth.
        assert_eq!(kept(16, 5, 4), vec![0, 4, 8, 12]);
        // Not a power of two: no gap longer than twice the average.
        for len in [10u64, 37, 100, 135] {
            for keep in [len as usize / 3, len as usize / 2, 2 * len as usize / 3] {
                let k = kept(len, 0, keep);
                let mut gaps: Vec<u64> = k.windows(2).map(|w| w[1] - w[0]).collect();
                gaps.push(k[0] + len - k[k.len() - 1]);
                let max = *gaps.iter().max().unwrap_or(&0);
                assert!(
                    max * keep as u64 <= 2 * len + keep as u64,
                    "len {len} keep {keep}: gaps {gaps:?}"
                );
            }
        }
    }

    proptest! {
        /// Under Priority, an executor with a pending task always ranks
        /// below (is kept longer than) any executor without one, and
        /// pending executors keep dispatch order.
        #[test]
        fn pending_always_kept_longer(a in 0u64..1<<40, b in 0u64..1<<40, pos in 0u64..64,
                                      len in 1u64..64, cur in 0u64..64, ahead in 0u64..8,
                                      lu in any::<u64>(), lu2 in any::<u64>()) {
            let p = EvictionPolicy::Priority;
            let c = c(len, cur, ahead);
            let pend = p.rank(u(Some(a), Some(pos % len), lu), c);
            let idle = p.rank(u(None, Some(pos % len), lu2), c);
            let idle2 = p.rank(u(None, None, lu2), c);
            prop_assert!(pend < idle);
            prop_assert!(idle < idle2);
            prop_assert_eq!(a < b, pend < p.rank(u(Some(b), None, lu2), c));
        }

        /// In a cycle, the executors coming up rank lowest, in the order
        /// they come, and every position has its own rank.
        #[test]
        fn upcoming_first_and_ranks_distinct(len in 2u64..200, cur in 0u64..1000, ahead in 0u64..10) {
            let p = EvictionPolicy::Priority;
            let c = c(len, cur, ahead);
            let ranks: Vec<u64> = (0..len).map(|i| p.rank(u(None, Some(i), 0), c)).collect();
            let mut by_rank: Vec<u64> = (0..len).collect();
            by_rank.sort_by_key(|&i| ranks[i as usize]);
            for (d, &i) in by_rank.iter().take(ahead.min(len) as usize).enumerate() {
                prop_assert_eq!(i, (cur + d as u64) % len);
            }
            let mut sorted = ranks.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len() as u64, len);
        }
    }
}
