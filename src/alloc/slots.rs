//! A fixed set of slots that readers scan without locks and that a writer
//! empties safely: the memory protocol of the evictor registry, on its own
//! (it uses only `core` and `std`) so that `tests/miri` can check it under
//! Miri's weak-memory emulation.
//!
//! Removal is a store-buffer pattern: the remover stores the slot, then
//! loads the reader count; a reader stores the reader count, then loads the
//! slot. Acquire/release does not order a store before a later load, so
//! both could read the old values: the reader would still see the entry
//! while the remover sees no reader and frees it. All four operations are
//! therefore `SeqCst`: in their single total order either the reader's
//! increment comes first (the remover sees it and waits) or the remover's
//! swap does (the reader sees an empty slot).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// `N` slots of boxed `T`, scanned by [`Slots::any`] without locks.
pub(crate) struct Slots<T, const N: usize> {
    slots: [AtomicPtr<T>; N],
    /// Scans in progress; [`Slots::remove`] waits for zero.
    readers: AtomicUsize,
}

impl<T, const N: usize> Slots<T, N> {
    /// Empty slots.
    pub(crate) const fn new() -> Self {
        Slots {
            slots: [const { AtomicPtr::new(std::ptr::null_mut()) }; N],
            readers: AtomicUsize::new(0),
        }
    }

    /// Puts `value` in a free slot and returns its index, or gives the value
    /// back when every slot is taken.
    pub(crate) fn insert(&self, value: Box<T>) -> Result<usize, Box<T>> {
        let p = Box::into_raw(value);
        for (i, slot) in self.slots.iter().enumerate() {
            if slot
                .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(i);
            }
        }
        // SAFETY: `p` came from `Box::into_raw` above and was never shared.
        Err(unsafe { Box::from_raw(p) })
    }

    /// Empties slot `i` and returns its value once no scan can still be
    /// looking at it (waits for the scans in progress to end).
    pub(crate) fn remove(&self, i: usize) -> Option<Box<T>> {
        let old = self
            .slots
            .get(i)?
            .swap(std::ptr::null_mut(), Ordering::SeqCst);
        while self.readers.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        if old.is_null() {
            return None;
        }
        // SAFETY: the pointer came from `Box::into_raw` in `insert`; it is
        // no longer reachable from the slots, and every scan that could have
        // loaded it has ended (module docs), so this is the only reference.
        Some(unsafe { Box::from_raw(old) })
    }

    /// Calls `f` on each value present until it returns true; returns
    /// whether it did.
    pub(crate) fn any(&self, mut f: impl FnMut(&T) -> bool) -> bool {
        self.readers.fetch_add(1, Ordering::SeqCst);
        let mut found = false;
        for slot in &self.slots {
            let p = slot.load(Ordering::SeqCst);
            if p.is_null() {
                continue;
            }
            // SAFETY: a value loaded while `readers` > 0 stays alive until
            // `readers` returns to zero (see `remove`).
            if f(unsafe { &*p }) {
                found = true;
                break;
            }
        }
        // Release: the remover's acquire load of zero orders this scan's
        // reads of the value before the value is freed.
        self.readers.fetch_sub(1, Ordering::Release);
        found
    }

    /// Whether any slot holds a value (a hint: no value is read).
    pub(crate) fn occupied(&self) -> bool {
        self.slots
            .iter()
            .any(|s| !s.load(Ordering::Relaxed).is_null())
    }

    /// In the child of a `fork()`: only the forking thread exists, so no
    /// scan is in progress.
    pub(crate) fn reset_readers(&self) {
        self.readers.store(0, Ordering::SeqCst);
    }
}
