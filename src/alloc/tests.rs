use std::alloc::Layout;

use super::*;

#[test]
fn thread_net_counts_this_threads_allocations_exactly() {
    let before = thread_net_allocated();
    let v: Vec<u8> = Vec::with_capacity(3 << 20);
    assert_eq!(thread_net_allocated() - before, 3 << 20);
    drop(v);
    assert_eq!(thread_net_allocated(), before);
}

#[test]
fn large_allocations_reach_the_global_counter() {
    // Other tests allocate concurrently, so only check the peak moved.
    let v: Vec<u8> = vec![1; 64 << 20];
    assert!(peak_usage() >= 64 << 20);
    drop(v);
}

#[test]
fn the_reserve_serves_aligned_blocks_and_resets() {
    reserve::init();
    let a = reserve::alloc(Layout::from_size_align(100, 8).unwrap());
    let b = reserve::alloc(Layout::from_size_align(4096, 4096).unwrap());
    assert!(!a.is_null() && !b.is_null());
    assert!(reserve::contains(a) && reserve::contains(b));
    assert_eq!(b as usize % 4096, 0);
    assert!(!reserve::contains(std::ptr::null_mut()));
    let too_big = reserve::alloc(Layout::from_size_align(reserve::RESERVE_BYTES + 1, 8).unwrap());
    assert!(too_big.is_null());
    reserve::free(a);
    reserve::free(b);
}

#[test]
fn purge_and_conf_queries_work() {
    purge();
    // retain is turned off exactly when the process started under a finite
    // RLIMIT_AS.
    let limited = crate::cap::detect_limits().rlimit_as.is_some();
    assert_eq!(jemalloc::retains(), Some(!limited));
}
