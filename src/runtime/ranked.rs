//! A list of executors ranked by one scan of the registry, reused across
//! decisions (`make_room`'s victims, the prefetcher's next loads) so that a
//! decision costs no scan. Ranks drift as sweeps move on, so the list is
//! rebuilt when it runs out or once the clock has moved by a quarter of its
//! length, and the user checks each pick against its rank now.

use std::sync::Arc;

use crate::executor::Slot;

/// Executors and their ranks when the list was built.
#[derive(Default)]
pub(crate) struct RankedList {
    /// Sorted by the user: the next pick is last.
    pub(crate) list: Vec<(u64, Arc<Slot>)>,
    /// The runtime's clock when the list was built, and its length then.
    built_at: u64,
    built_len: u64,
}

impl RankedList {
    /// Whether the list should be rebuilt at clock `now`.
    pub(crate) fn stale(&self, now: u64) -> bool {
        self.list.is_empty() || now.saturating_sub(self.built_at) > self.built_len / 4 + 16
    }

    /// Replaces the list with `items`, the next pick last: ascending ranks
    /// when `highest_first`, descending otherwise.
    pub(crate) fn rebuild(
        &mut self,
        now: u64,
        items: impl Iterator<Item = (u64, Arc<Slot>)>,
        highest_first: bool,
    ) {
        self.list.clear();
        self.list.extend(items);
        if highest_first {
            self.list.sort_unstable_by_key(|(r, _)| *r);
        } else {
            self.list
                .sort_unstable_by_key(|(r, _)| std::cmp::Reverse(*r));
        }
        self.built_at = now;
        self.built_len = self.list.len() as u64;
    }
}
