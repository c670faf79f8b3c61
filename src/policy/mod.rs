//! Eviction policies: which resident executor to evict first.
//!
//! A policy turns what the runtime knows about an executor ([`UseInfo`],
//! and its declared [`Cycle`] if it is in one) into a *rank*; the victim
//! is the evictable executor with the highest rank. Each policy is one file
//! implementing [`Policy`]; [`EvictionPolicy`] is the public name users
//! choose them by.
//!
//! - `mod.rs` (this file): the [`Policy`] trait and its contract;
//! - `priority.rs`: follow the dispatch plan (the default);
//! - `lru.rs`: least recently used, for comparison.

mod lru;
mod priority;

/// Which executor to evict first.
///
/// Parses from `priority` (also `dispatch`, `belady`) or `lru`, and
/// displays as those names:
///
/// ```
/// use outcore::EvictionPolicy;
/// let p: EvictionPolicy = "lru".parse()?;
/// assert_eq!(p, EvictionPolicy::Lru);
/// assert_eq!(EvictionPolicy::Priority.to_string(), "priority");
/// # Ok::<(), outcore::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
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
            _ => Err(crate::Error::UnknownPolicy {
                input: s.to_string(),
            }),
        }
    }
}

impl std::fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EvictionPolicy::Priority => "priority",
            EvictionPolicy::Lru => "lru",
        })
    }
}

/// What the runtime knows about one executor's use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UseInfo {
    /// Dispatch sequence number of its earliest pending task, if any.
    pub next_task: Option<u64>,
    /// Its position in its declared cycle (see
    /// [`Runtime::hint_cycle`](crate::Runtime::hint_cycle)), if any.
    pub cycle_pos: Option<u64>,
    /// A logical time of its last use (larger is more recent).
    pub last_use: u64,
}

/// The declared cycle an executor belongs to: its length, the position of
/// the executor most recently dispatched, and how far ahead of it the
/// prefetcher works.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cycle {
    /// Executors in the cycle.
    pub len: u64,
    /// Position of the executor the sweep is on (the last one dispatched).
    pub cursor: u64,
    /// Positions from the cursor (the cursor's own included) that count as
    /// coming up: kept resident, and loaded ahead of time.
    pub ahead: u64,
}

/// Ranks at or above this belong to executors with no pending task (under
/// every policy that follows the plan).
pub(crate) const IDLE_RANK: u64 = 1 << 62;

/// An eviction policy.
///
/// The caller guarantees:
/// - the [`UseInfo`] it passes was read from the executor just before
///   ranking, and the [`Cycle`] is that executor's own cycle (the default,
///   empty cycle when it is in none), read in the same scan: ranks of
///   different executors are compared with each other;
/// - it evicts the evictable executor of the highest rank first.
///
/// The implementation MUST:
/// - be a pure function of its inputs: it runs inside the allocation trap,
///   so no allocation, no lock, no panic;
/// - never rank an executor with a pending task above one without (if it
///   follows the plan at all), and keep pending executors in dispatch
///   order;
/// - from [`Policy::prefetch_floor`], return a floor such that loading the
///   target never evicts an executor that is needed sooner than it.
pub(crate) trait Policy: Sync {
    /// The rank of an executor: the higher, the sooner it is evicted.
    fn rank(&self, u: UseInfo, cycle: Cycle) -> u64;

    /// Whether the prefetcher may load an executor of rank `rank` (in
    /// `cycle`) now.
    fn prefetch_target(&self, rank: u64, cycle: Cycle) -> bool;

    /// What the prefetcher may evict to load an executor of rank `rank`
    /// (in `cycle`) ahead of time: executors ranked above the returned
    /// value; `None` when it should not load that executor early at all.
    fn prefetch_floor(&self, cycle: Cycle, rank: u64) -> Option<u64>;
}

impl EvictionPolicy {
    /// The implementation of this policy.
    pub(crate) fn imp(self) -> &'static dyn Policy {
        match self {
            EvictionPolicy::Priority => &priority::Priority,
            EvictionPolicy::Lru => &lru::Lru,
        }
    }

    /// See [`Policy::rank`].
    pub(crate) fn rank(self, u: UseInfo, cycle: Cycle) -> u64 {
        self.imp().rank(u, cycle)
    }

    /// See [`Policy::prefetch_target`].
    pub(crate) fn prefetch_target(self, rank: u64, cycle: Cycle) -> bool {
        self.imp().prefetch_target(rank, cycle)
    }

    /// See [`Policy::prefetch_floor`].
    pub(crate) fn prefetch_floor(self, cycle: Cycle, rank: u64) -> Option<u64> {
        self.imp().prefetch_floor(cycle, rank)
    }
}

/// The age of an executor last used at `last_use`: larger is older. Shared
/// by the policies that fall back to recency.
pub(crate) fn age(last_use: u64) -> u64 {
    IDLE_RANK - 1 - last_use.min(IDLE_RANK - 1)
}

/// Helpers every policy's tests use.
#[cfg(test)]
pub(crate) mod test_util {
    use super::{Cycle, UseInfo};

    pub(crate) fn u(next_task: Option<u64>, cycle_pos: Option<u64>, last_use: u64) -> UseInfo {
        UseInfo {
            next_task,
            cycle_pos,
            last_use,
        }
    }

    pub(crate) fn c(len: u64, cursor: u64, ahead: u64) -> Cycle {
        Cycle { len, cursor, ahead }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_display() {
        for p in [EvictionPolicy::Priority, EvictionPolicy::Lru] {
            assert_eq!(p.to_string().parse::<EvictionPolicy>().unwrap(), p);
        }
        let e = "mru".parse::<EvictionPolicy>().unwrap_err().to_string();
        assert!(e.contains("mru") && e.contains("lru"), "{e}");
    }
}
