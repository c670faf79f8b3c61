//! What the running tasks pin, in bytes, so that tasks over several
//! executors (joins) running side by side stay under the cap together.
//!
//! [`Error::TooLargeTogether`](crate::Error::TooLargeTogether) refuses a
//! join whose executors alone are more than the cap; this keeps two
//! workers from each starting a join that fits alone and together does
//! not (with a 5 MiB cap and joins of up to 4 MiB, the process held
//! 10 MiB pinned). A worker starts a join only when the bytes the running
//! tasks pin (each executor once, at its size as last measured) and those
//! of the join's executors not pinned yet fit under the cap, or when
//! nothing else runs: a join that fits alone always starts once the
//! others are done, so no worker waits forever. The tasks on one executor
//! are not held back (an executor larger than the cap is still served).
//!
//! The caller guarantees: every admitted task is released once, with the
//! executors it was admitted with. A thread that runs a task of its own
//! batch from inside a task (see [`Batch`](crate::Batch)) is always
//! admitted: its task's executors count, and it would wait for itself.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::access::Access;
use crate::executor::Slot;

/// The executors running tasks pin: for each, how many tasks and the bytes
/// it was counted with; and their total. A leaf lock: nothing is taken
/// under it, and the trap never takes it.
#[derive(Default)]
pub(crate) struct Pins {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<u64, (u32, u64)>,
    total: u64,
}

impl Pins {
    /// Whether a task over `slots` may start under `cap` now (see the
    /// module's doc); if so, its executors are counted as pinned until
    /// [`Pins::release`]. Without a cap, every task may start, and nothing
    /// is counted.
    pub(crate) fn admit(
        &self,
        slots: &[(Arc<Slot>, Access)],
        cap: Option<u64>,
        helping: bool,
    ) -> bool {
        let Some(cap) = cap else { return true };
        let mut g = self.inner.lock();
        if slots.len() > 1 && !helping && !g.by_id.is_empty() {
            let new: u64 = slots
                .iter()
                .filter(|(s, _)| !g.by_id.contains_key(&s.id))
                .map(|(s, _)| s.size.load(Ordering::Relaxed) as u64)
                .sum();
            if g.total.saturating_add(new) > cap {
                return false;
            }
        }
        let g = &mut *g;
        for (s, _) in slots {
            let e = g.by_id.entry(s.id).or_insert((0, 0));
            if e.0 == 0 {
                e.1 = s.size.load(Ordering::Relaxed) as u64;
                g.total = g.total.saturating_add(e.1);
            }
            e.0 += 1;
        }
        true
    }

    /// A task admitted with the executors `ids` is over.
    pub(crate) fn release(&self, ids: &[(u64, Access)], cap: Option<u64>) {
        if cap.is_none() {
            return;
        }
        let mut g = self.inner.lock();
        let g = &mut *g;
        for (id, _) in ids {
            if let Some(e) = g.by_id.get_mut(id) {
                e.0 = e.0.saturating_sub(1);
                if e.0 == 0 {
                    g.total = g.total.saturating_sub(e.1);
                    g.by_id.remove(id);
                }
            }
        }
    }
}
