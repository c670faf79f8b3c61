//! Eviction policies: which resident executor to evict first.
//!
//! A policy turns what the runtime knows about an executor into a *rank*;
//! the victim is the evictable executor with the highest rank.
//!
//! Contract: the caller guarantees that the [`UseInfo`] it passes was read
//! from the executor just before ranking (ranks of different executors are
//! compared, so they must be computed against the same cursor). The
//! implementation MUST be a pure function of its inputs (it runs inside the
//! allocation trap: no allocation, no lock, no panic).

/// Which executor to evict first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Follow the dispatch plan: executors with pending tasks keep their
    /// dispatch order, idle ones go to the tail (ordered by a declared cycle
    /// when there is one, least recently used first otherwise), and victims
    /// come from the tail: the executor needed last is evicted first
    /// (Belady's rule for a known plan).
    #[default]
    Priority,
    /// Least recently used first, ignoring the plan (what OS paging does).
    Lru,
}

impl std::str::FromStr for EvictionPolicy {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "priority" | "dispatch" | "belady" => Ok(EvictionPolicy::Priority),
            "lru" => Ok(EvictionPolicy::Lru),
            _ => Err(crate::Error::Runtime(format!(
                "unknown eviction policy '{s}' (expected 'priority' or 'lru')"
            ))),
        }
    }
}

/// What the runtime knows about one executor's use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UseInfo {
    /// Dispatch sequence number of its earliest pending task, if any.
    pub next_task: Option<u64>,
    /// Its position in the declared cycle (see
    /// [`Runtime::hint_cycle`](crate::Runtime::hint_cycle)), if any.
    pub cycle_pos: Option<u64>,
    /// A logical time of its last use (larger is more recent).
    pub last_use: u64,
}

/// The declared cycle: its length, the position of the executor most
/// recently dispatched, and how far ahead of it the prefetcher works.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cycle {
    /// Executors in the cycle.
    pub len: u64,
    /// Position of the executor the sweep is on (the last one dispatched).
    pub cursor: u64,
    /// Positions from the cursor (the cursor's own included) that count as
    /// coming up: kept resident, and loaded ahead of time.
    pub ahead: u64,
}

const PENDING_TOP: u64 = 1 << 62;
const CYCLE_BASE: u64 = 1 << 62;
const IDLE_BASE: u64 = 1 << 63;

/// Under [`EvictionPolicy::Priority`], ranks at or above this belong to
/// executors with no pending task.
pub const IDLE_RANK: u64 = CYCLE_BASE;

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

impl EvictionPolicy {
    /// The rank of an executor: the higher, the sooner it is evicted.
    ///
    /// Under `Priority`, executors in a declared cycle that are not coming
    /// up within `cycle.ahead` positions rank by a fixed, evenly spread
    /// order of their positions. On a cyclic plan that holds more data
    /// than memory, every fixed resident set costs the same loads per
    /// sweep (each executor outside it is loaded once); Belady's rule keeps
    /// the executors at the start of the cycle, so all the loads come in
    /// one run at its end, where they outpace the computation and the
    /// workers wait. A resident set spread over the cycle puts a load
    /// between every few resident executors, so the loads overlap the
    /// work on the resident ones. The set is also stable: the executor just
    /// used is evicted only when it is outside the set.
    pub fn rank(self, u: UseInfo, cycle: Cycle) -> u64 {
        let age = PENDING_TOP - 1 - u.last_use.min(PENDING_TOP - 1);
        match self {
            EvictionPolicy::Lru => age,
            EvictionPolicy::Priority => {
                if let Some(seq) = u.next_task {
                    seq.min(PENDING_TOP - 1)
                } else if let (Some(pos), true) = (u.cycle_pos, cycle.len > 0) {
                    // Distance to its next turn. The cursor's executor is
                    // the one the sweep is on (a batch may stop part-way
                    // through it and the next one go on with it): 0.
                    let len = cycle.len;
                    let d = (pos % len + len - cycle.cursor % len) % len;
                    let ahead = cycle.ahead.min(len);
                    if d < ahead {
                        CYCLE_BASE + d
                    } else {
                        CYCLE_BASE + ahead + spread(pos % len, len)
                    }
                } else {
                    IDLE_BASE + age
                }
            }
        }
    }
}

impl EvictionPolicy {
    /// Whether the prefetcher may load an executor of rank `rank` now:
    /// one with a pending task, or (under `Priority`) one coming up in the
    /// declared cycle (within `cycle.ahead` positions).
    pub fn prefetch_target(self, rank: u64, cycle: Cycle) -> bool {
        match self {
            EvictionPolicy::Lru => false,
            EvictionPolicy::Priority => {
                rank < CYCLE_BASE || (cycle.len > 0 && rank < CYCLE_BASE + cycle.ahead)
            }
        }
    }

    /// What the prefetcher may evict to load an executor of rank `rank`
    /// ahead of time: executors ranked above the returned value; `None`
    /// when it should not load that executor early at all.
    ///
    /// Under `Priority`: any executor with no pending task that is not
    /// coming up in the cycle (the spread order then decides which), and
    /// only for an executor that is itself pending or coming up. Under
    /// `Lru`: any executor ranked after (used longer ago than) the one
    /// loaded.
    pub fn prefetch_floor(self, cycle: Cycle, rank: u64) -> Option<u64> {
        let floor = match self {
            EvictionPolicy::Lru => return Some(rank),
            EvictionPolicy::Priority if cycle.len > 0 => CYCLE_BASE + cycle.ahead.min(cycle.len),
            EvictionPolicy::Priority => CYCLE_BASE,
        };
        (rank < floor).then_some(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn u(next_task: Option<u64>, cycle_pos: Option<u64>, last_use: u64) -> UseInfo {
        UseInfo {
            next_task,
            cycle_pos,
            last_use,
        }
    }

    fn c(len: u64, cursor: u64, ahead: u64) -> Cycle {
        Cycle { len, cursor, ahead }
    }

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
    fn lru_ignores_the_plan() {
        let p = EvictionPolicy::Lru;
        let c = Cycle::default();
        assert!(p.rank(u(Some(1), None, 3), c) > p.rank(u(None, None, 7), c));
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
    fn the_prefetcher_never_displaces_what_comes_up_next() {
        let p = EvictionPolicy::Priority;
        let c = c(30, 10, 4);
        let floor = p.prefetch_floor(c, 0).unwrap();
        let rank_at = |pos: u64| p.rank(u(None, Some(pos), 0), c);
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
        let none = Cycle::default();
        let none_floor = p.prefetch_floor(none, 0).unwrap();
        assert!(p.rank(u(None, None, 5), none) >= none_floor);
        assert!(p.rank(u(Some(9), None, 5), none) < none_floor);
    }

    #[test]
    fn under_lru_the_prefetcher_displaces_only_older_executors() {
        let p = EvictionPolicy::Lru;
        let c = Cycle::default();
        let loaded = p.rank(u(Some(3), None, 50), c);
        let floor = p.prefetch_floor(c, loaded).expect("LRU prefetches");
        assert!(p.rank(u(None, None, 10), c) > floor, "older: may go");
        assert!(p.rank(u(None, None, 90), c) <= floor, "newer: stays");
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
