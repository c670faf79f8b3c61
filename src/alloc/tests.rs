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

#[test]
fn the_reserve_serves_evictions_only() {
    reserve::init();
    let layout = Layout::from_size_align(64, 8).unwrap();
    let failing = || std::ptr::null_mut::<u8>();
    {
        // A runtime lock held (a bypass scope, no eviction): a long-lived
        // allocation must not pin the reserve.
        let _bypass = BypassGuard::new();
        assert!(
            trap::hard(64, &failing, layout).is_null(),
            "a lock-holding scope was served from the reserve"
        );
    }
    // Inside an eviction it is served, and freed when the eviction ends.
    let _bypass = BypassGuard::new();
    let _scope = EvictScope::new();
    let p = trap::hard(64, &failing, layout);
    assert!(reserve::contains(p));
    reserve::free(p);
}
