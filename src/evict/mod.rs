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

/// The declared cycle: its length and the position of the executor most
/// recently dispatched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cycle {
    /// Executors in the cycle.
    pub len: u64,
    /// Position of the executor the sweep is on (the last one dispatched).
    pub cursor: u64,
}

const PENDING_TOP: u64 = 1 << 62;
const CYCLE_BASE: u64 = 1 << 62;
const IDLE_BASE: u64 = 1 << 63;

/// Under [`EvictionPolicy::Priority`], ranks at or above this belong to
/// executors with no pending task.
pub const IDLE_RANK: u64 = CYCLE_BASE;

impl EvictionPolicy {
    /// The rank of an executor: the higher, the sooner it is evicted.
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
                    // through it and the next one go on with it): 0. The
                    // executor before it was used last and comes back last.
                    let d = (pos + cycle.len - cycle.cursor % cycle.len) % cycle.len;
                    CYCLE_BASE + d.min(PENDING_TOP - 1)
                } else {
                    IDLE_BASE + age
                }
            }
        }
    }
}

impl EvictionPolicy {
    /// Whether the prefetcher may load an executor of rank `rank` now:
    /// one with a pending task, or (under `Priority`) one whose turn in the
    /// declared cycle is within the next `window` positions.
    ///
    /// Loading further ahead would cost more than it saves. On a full cache,
    /// each early load evicts an executor used recently, and doing that
    /// for every executor in turn turns the resident set into a sliding
    /// window that reloads the whole cycle every time, while Belady's rule
    /// keeps all but about one load per miss resident.
    pub fn prefetch_target(self, rank: u64, cycle: Cycle, window: u64) -> bool {
        match self {
            EvictionPolicy::Lru => false,
            EvictionPolicy::Priority => {
                rank < CYCLE_BASE || (cycle.len > 0 && rank < CYCLE_BASE + window)
            }
        }
    }

    /// The lowest rank the prefetcher may evict to load an executor ahead
    /// of time (it also never evicts anything ranked at or before the
    /// executor it loads).
    ///
    /// Under `Priority` with a declared cycle: only executors used within
    /// the last `window` positions of the cycle, and idle executors outside
    /// it. On a cyclic plan Belady's rule evicts only the executor just
    /// used and keeps the rest resident; letting the prefetcher displace
    /// that resident set for executors needed a little sooner would turn it
    /// into a sliding window that reloads every executor each cycle.
    /// Without a cycle: any executor with no pending task. Under `Lru`: any
    /// executor ranked after the one loaded.
    pub fn prefetch_floor(self, cycle: Cycle, window: u64) -> u64 {
        match self {
            EvictionPolicy::Lru => 0,
            EvictionPolicy::Priority if cycle.len > 0 => {
                CYCLE_BASE + cycle.len.saturating_sub(window.max(1))
            }
            EvictionPolicy::Priority => CYCLE_BASE,
        }
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

    #[test]
    fn pending_in_dispatch_order_then_cycle_then_idle() {
        let p = EvictionPolicy::Priority;
        let c = Cycle { len: 4, cursor: 1 };
        let soon = p.rank(u(Some(10), Some(3), 5), c);
        let later = p.rank(u(Some(20), None, 99), c);
        let next_in_cycle = p.rank(u(None, Some(2), 1), c);
        let just_used = p.rank(u(None, Some(0), 100), c);
        let idle_old = p.rank(u(None, None, 1), c);
        let idle_new = p.rank(u(None, None, 50), c);
        assert!(soon < later);
        assert!(later < next_in_cycle);
        assert!(next_in_cycle < just_used);
        assert!(just_used < idle_new);
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
        let c = Cycle {
            len: 30,
            cursor: 10,
        };
        let rank_at = |pos: u64| p.rank(u(None, Some(pos), 0), c);
        assert!(p.prefetch_target(rank_at(11), c, 3));
        assert!(p.prefetch_target(rank_at(12), c, 3));
        assert!(!p.prefetch_target(rank_at(13), c, 3));
        assert!(!p.prefetch_target(rank_at(9), c, 3));
        assert!(
            p.prefetch_target(p.rank(u(Some(500), None, 0), c), c, 3),
            "pending tasks always"
        );
        assert!(
            !p.prefetch_target(p.rank(u(None, None, 0), c), c, 3),
            "idle, outside the cycle"
        );
    }

    #[test]
    fn the_prefetcher_only_displaces_recently_used_executors() {
        let p = EvictionPolicy::Priority;
        let c = Cycle {
            len: 30,
            cursor: 10,
        };
        let floor = p.prefetch_floor(c, 4);
        let rank_at = |pos: u64| p.rank(u(None, Some(pos), 0), c);
        // Used up to 4 positions before the cursor: may be displaced.
        for pos in [9, 8, 7, 6] {
            assert!(rank_at(pos) >= floor, "pos {pos}");
        }
        // The one in progress, and ones needed later but used longer ago:
        // kept.
        for pos in [10, 5, 20, 11, 12] {
            assert!(rank_at(pos) < floor, "pos {pos}");
        }
        // Idle executors outside the cycle may always go.
        assert!(p.rank(u(None, None, 5), c) >= floor);
        // Without a cycle: anything with no pending task.
        let none = Cycle::default();
        assert!(p.rank(u(None, None, 5), none) >= p.prefetch_floor(none, 4));
        assert!(p.rank(u(Some(9), None, 5), none) < p.prefetch_floor(none, 4));
    }

    proptest! {
        /// Under Priority, an executor with a pending task always ranks
        /// below (is kept longer than) any executor without one, and
        /// pending executors keep dispatch order.
        #[test]
        fn pending_always_kept_longer(a in 0u64..1<<40, b in 0u64..1<<40, pos in 0u64..64,
                                      len in 1u64..64, cur in 0u64..64, lu in any::<u64>(), lu2 in any::<u64>()) {
            let p = EvictionPolicy::Priority;
            let c = Cycle { len, cursor: cur };
            let pend = p.rank(u(Some(a), Some(pos % len), lu), c);
            let idle = p.rank(u(None, Some(pos % len), lu2), c);
            let idle2 = p.rank(u(None, None, lu2), c);
            prop_assert!(pend < idle);
            prop_assert!(idle < idle2);
            prop_assert_eq!(a < b, pend < p.rank(u(Some(b), None, lu2), c));
        }

        /// In a cycle, the executor before the cursor (done with) has the
        /// highest rank and the one at the cursor (in progress) the lowest.
        #[test]
        fn cycle_distance(len in 2u64..100, cur in 0u64..1000) {
            let p = EvictionPolicy::Priority;
            let c = Cycle { len, cursor: cur };
            let ranks: Vec<u64> = (0..len).map(|i| p.rank(u(None, Some(i), 0), c)).collect();
            let max = ranks.iter().enumerate().max_by_key(|(_, r)| **r).map(|(i, _)| i as u64);
            let min = ranks.iter().enumerate().min_by_key(|(_, r)| **r).map(|(i, _)| i as u64);
            prop_assert_eq!(max, Some((cur + len - 1) % len));
            prop_assert_eq!(min, Some(cur % len));
        }
    }
}
