//! outcore's lock-free protocols, compiled on their own and run under Miri,
//! whose weak-memory emulation lets loads return stale values that the C++
//! memory model allows (which x86 hardware, with its locked
//! read-modify-writes, never shows).
//!
//! Run: `cargo +nightly miri test --manifest-path tests/miri/Cargo.toml`.

#![cfg(test)]

#[path = "../../../src/alloc/slots.rs"]
#[allow(dead_code)]
mod slots;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use slots::Slots;

struct Value {
    checksum: AtomicU64,
}

/// The registry's removal races a scan: the scan may use the value only if
/// the removal has not freed it yet. With acquire/release orderings (a
/// store-buffer pattern) Miri finds a scan reading a freed value; with
/// `SeqCst`, none.
#[test]
fn a_scan_never_sees_a_removed_value() {
    for round in 0..200u64 {
        let slots: Arc<Slots<Value, 2>> = Arc::new(Slots::new());
        let slot = slots
            .insert(Box::new(Value {
                checksum: AtomicU64::new(round),
            }))
            .ok()
            .expect("a free slot");
        let scanner = {
            let slots = Arc::clone(&slots);
            std::thread::spawn(move || {
                slots.any(|v| {
                    v.checksum.fetch_add(1, Ordering::Relaxed);
                    false
                })
            })
        };
        let removed = slots.remove(slot).expect("the value");
        // The scan that may still be running must not touch it any more.
        removed.checksum.store(u64::MAX, Ordering::Relaxed);
        drop(removed);
        scanner.join().expect("the scan");
        assert!(!slots.occupied());
    }
}

/// A slot freed by a removal is reused by the next insertion, and a full
/// set gives the value back.
#[test]
fn inserts_fill_free_slots_and_give_back_when_full() {
    let slots: Slots<u32, 2> = Slots::new();
    assert_eq!(slots.insert(Box::new(1)).ok(), Some(0));
    assert_eq!(slots.insert(Box::new(2)).ok(), Some(1));
    let back = slots.insert(Box::new(3)).err().expect("full");
    assert_eq!(*back, 3);
    assert_eq!(slots.remove(0).map(|b| *b), Some(1));
    assert_eq!(slots.insert(Box::new(4)).ok(), Some(0));
    let mut seen = Vec::new();
    slots.any(|v| {
        seen.push(*v);
        false
    });
    assert_eq!(seen, [4, 2]);
    assert_eq!(slots.remove(0).map(|b| *b), Some(4));
    assert_eq!(slots.remove(1).map(|b| *b), Some(2));
    assert!(slots.remove(1).is_none());
}
