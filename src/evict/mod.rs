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
    /// Position of the last dispatched executor of the cycle.
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
                    // Distance to its next turn: the executor after the
                    // cursor comes next (0), the one at the cursor last.
                    let d = (pos + cycle.len - cycle.cursor % cycle.len - 1) % cycle.len;
                    CYCLE_BASE + d.min(PENDING_TOP - 1)
                } else {
                    IDLE_BASE + age
                }
            }
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
        let just_used = p.rank(u(None, Some(1), 100), c);
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

        /// In a cycle, the executor used last has the highest rank and the
        /// one after it the lowest.
        #[test]
        fn cycle_distance(len in 2u64..100, cur in 0u64..1000) {
            let p = EvictionPolicy::Priority;
            let c = Cycle { len, cursor: cur };
            let ranks: Vec<u64> = (0..len).map(|i| p.rank(u(None, Some(i), 0), c)).collect();
            let max = ranks.iter().enumerate().max_by_key(|(_, r)| **r).map(|(i, _)| i as u64);
            let min = ranks.iter().enumerate().min_by_key(|(_, r)| **r).map(|(i, _)| i as u64);
            prop_assert_eq!(max, Some(cur % len));
            prop_assert_eq!(min, Some((cur + 1) % len));
        }
    }
}
