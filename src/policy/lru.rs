//! Least recently used first ([`EvictionPolicy::Lru`](super::EvictionPolicy::Lru)),
//! ignoring the plan: what OS paging does, kept so the difference can be
//! measured.

use super::{age, Cycle, Policy, UseInfo};

/// Least recently used first.
#[derive(Debug)]
pub(crate) struct Lru;

impl Policy for Lru {
    fn rank(&self, u: UseInfo, _cycle: Cycle) -> u64 {
        age(u.last_use)
    }

    /// LRU has no plan to prefetch by.
    fn prefetch_target(&self, _rank: u64, _cycle: Cycle) -> bool {
        false
    }

    /// Any executor ranked after (used longer ago than) the one loaded.
    fn prefetch_floor(&self, _cycle: Cycle, rank: u64) -> Option<u64> {
        Some(rank)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::u;
    use super::super::{Cycle, EvictionPolicy};

    #[test]
    fn lru_ignores_the_plan() {
        let p = EvictionPolicy::Lru;
        let c = Cycle::default();
        assert!(p.rank(u(Some(1), None, 3), c) > p.rank(u(None, None, 7), c));
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
}
