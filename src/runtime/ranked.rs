//! Executors ranked by one scan of the registry, reused across decisions
//! (`make_room`'s victims, the prefetcher's next loads) so that a decision
//! costs no scan. Ranks drift as sweeps move on, so the list is rebuilt
//! when it runs out or once the clock has moved by a quarter of its length;
//! the user checks each pick against its rank now, and adds executors
//! whose rank has just jumped (see [`RankedList::push`]).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::alloc::BypassGuard;
use crate::executor::Slot;

/// An executor and its rank, ordered by the rank only (stored so that the
/// heap's top is the next pick).
struct Entry(u64, Arc<Slot>);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

/// Executors and their ranks, the next pick first: the highest rank when
/// built with `highest_first`, else the lowest. An executor may appear
/// twice (added again after its rank changed); users skip what is no
/// longer a candidate when they pick it.
#[derive(Default)]
pub(crate) struct RankedList {
    heap: BinaryHeap<Entry>,
    highest_first: bool,
    /// The runtime's clock when the list was built, and its length then.
    built_at: u64,
    built_len: u64,
    /// The owner's marker (see `Shared::evicted_mark`) when a rebuild
    /// found nothing, while the list stays empty.
    pub(crate) empty_at: Option<u64>,
}

impl RankedList {
    /// The stored key of rank `r`: the heap's top is the largest key.
    fn key(&self, r: u64) -> u64 {
        if self.highest_first {
            r
        } else {
            !r
        }
    }

    /// Whether the list should be rebuilt at clock `now`.
    pub(crate) fn stale(&self, now: u64) -> bool {
        self.heap.is_empty() || now.saturating_sub(self.built_at) > self.built_len / 4 + 16
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Replaces the list with `items`, to be picked highest rank first
    /// when `highest_first`, lowest first otherwise.
    pub(crate) fn rebuild(
        &mut self,
        now: u64,
        items: impl Iterator<Item = (u64, Arc<Slot>)>,
        highest_first: bool,
    ) {
        self.highest_first = highest_first;
        let mut v = std::mem::take(&mut self.heap).into_vec();
        v.clear();
        v.extend(items.map(|(r, s)| Entry(self.key(r), s)));
        self.heap = BinaryHeap::from(v);
        self.built_at = now;
        self.built_len = self.heap.len() as u64;
    }

    /// Room for `n` entries without allocating. Locked lists are used in
    /// bypass scopes, where an allocation cannot trap: the owner grows them
    /// outside the lock, through [`Ranked::grow`].
    fn has_room(&self, n: usize) -> bool {
        self.heap.capacity() >= n
    }

    /// Adds `s` at rank `r` (O(log n)).
    pub(crate) fn push(&mut self, r: u64, s: Arc<Slot>) {
        let k = self.key(r);
        self.heap.push(Entry(k, s));
    }

    /// Takes the next pick and its rank.
    pub(crate) fn pop(&mut self) -> Option<(u64, Arc<Slot>)> {
        let Entry(k, s) = self.heap.pop()?;
        Some((self.key(k), s))
    }

    /// The next pick and its rank, left in the list.
    pub(crate) fn peek(&self) -> Option<(u64, &Arc<Slot>)> {
        self.heap.peek().map(|Entry(k, s)| (self.key(*k), s))
    }
}

/// A [`RankedList`] behind its lock, shared by the threads that decide
/// from it. The lock is taken only here: a leaf, except that its holder
/// may take the registry's (see `shared.rs`, "Locks").
#[derive(Default)]
pub(crate) struct Ranked {
    list: Mutex<RankedList>,
}

impl Ranked {
    /// Locks the list (blocking; never from the allocation trap).
    pub(crate) fn lock(&self) -> MutexGuard<'_, RankedList> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes room for `n` entries, allocating outside the lock (in the
    /// caller's context, where the trap may evict) and moving the entries
    /// over under it.
    pub(crate) fn grow(&self, n: usize) {
        let locked = || {
            let bypass = BypassGuard::new();
            (self.lock(), bypass)
        };
        if locked().0.has_room(n) {
            return;
        }
        let mut fresh: Vec<Entry> = Vec::with_capacity(n.saturating_mul(2));
        let (mut l, _bypass) = locked();
        if !l.has_room(n) && l.heap.len() <= fresh.capacity() {
            // Within `fresh`'s capacity: no allocation under the lock.
            fresh.extend(std::mem::take(&mut l.heap).into_vec());
            l.heap = BinaryHeap::from(fresh);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RankedList;
    use crate::executor::Slot;
    use std::sync::Arc;

    #[test]
    fn picks_in_rank_order_either_way_including_additions() {
        let slots: Vec<Arc<Slot>> = (0..6)
            .map(|i| {
                Arc::new(Slot::new::<u8>(
                    i,
                    format!("#{i}"),
                    None,
                    None,
                    0,
                    0,
                    Default::default(),
                ))
            })
            .collect();
        let ranks = [5u64, 1, 9, 3, 7, u64::MAX];
        for highest_first in [true, false] {
            let mut l = RankedList::default();
            l.rebuild(
                0,
                ranks[..5].iter().zip(&slots).map(|(r, s)| (*r, s.clone())),
                highest_first,
            );
            l.push(ranks[5], slots[5].clone());
            l.push(4, slots[0].clone());
            let mut got = Vec::new();
            while let Some((r, _)) = l.pop() {
                got.push(r);
            }
            let mut want = vec![5, 1, 9, 3, 7, u64::MAX, 4];
            want.sort_unstable();
            if highest_first {
                want.reverse();
            }
            assert_eq!(got, want, "highest_first {highest_first}");
        }
    }
}
