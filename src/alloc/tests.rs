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

/// A large block freed on one thread is taken again by the next
/// allocation of its size on another: loads (a prefetcher, a worker) reuse
/// the pages evictions on other threads freed, instead of faulting in and
/// zeroing new ones while the freed ones wait for a purge.
#[test]
fn a_large_block_freed_on_one_thread_is_reused_on_another() {
    let n = 4 << 20;
    let mut reused = 0;
    for _ in 0..8 {
        let freed = std::thread::spawn(move || {
            let v: Vec<u8> = vec![1; n];
            v.as_ptr() as usize
        })
        .join()
        .unwrap();
        let v: Vec<u8> = Vec::with_capacity(n);
        reused += usize::from(v.as_ptr() as usize == freed);
    }
    // Other tests allocate meanwhile and may take a block first.
    assert!(reused >= 6, "reused {reused} of 8 freed blocks");
}

#[test]
fn purge_and_conf_queries_work() {
    purge();
    // retain is turned off exactly when the process started under a finite
    // RLIMIT_AS or RLIMIT_DATA.
    let limited = crate::cap::detect_limits().rlimit_as.is_some();
    assert_eq!(jemalloc::retains(), Some(!limited));
}

#[test]
fn the_reserve_serves_evictions_and_the_headroom_lock_scopes() {
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
    {
        // Under an address-space limit, the headroom is given up for it
        // and the allocation retried; the next hard trap takes it back.
        headroom::keep(Some(1 << 30));
        assert_eq!(headroom::missing(), 0);
        let sentinel = std::ptr::NonNull::<u8>::dangling().as_ptr();
        let after_release = || {
            if headroom::missing() > 0 {
                sentinel
            } else {
                std::ptr::null_mut()
            }
        };
        let p = {
            let _bypass = BypassGuard::new();
            trap::hard(64, &after_release, layout)
        };
        assert!(!p.is_null(), "the headroom was not given up");
        assert_eq!(headroom::missing(), 32 << 20);
        assert!(headroom::restore());
        assert_eq!(headroom::missing(), 0);
        headroom::forget();
        assert_eq!(headroom::missing(), 0);
    }
    // Inside an eviction it is served, and freed when the eviction ends.
    let _bypass = BypassGuard::new();
    let _scope = EvictScope::new();
    let p = trap::hard(64, &failing, layout);
    assert!(reserve::contains(p));
    reserve::free(p);
}

#[test]
fn large_blocks_start_on_a_page_and_huge_ones_on_a_huge_page() {
    let aligned = |p: *const u8| p as usize % PAGE == 0;
    // Many allocations: jemalloc alone starts a large block at a random
    // cache line of its first page (63 of 64 not page-aligned).
    for i in 0..64 {
        let v: Vec<u8> = Vec::with_capacity(PAGE_ALIGNED_FROM + i * 64);
        assert!(aligned(v.as_ptr()), "alloc of {} bytes", v.capacity());
        let z: Vec<f32> = vec![0.0; (PAGE_ALIGNED_FROM >> 2) + i];
        assert!(aligned(z.as_ptr().cast()), "alloc_zeroed");
        assert!(z.iter().all(|&x| x == 0.0));
        // Growth from small to large and large to larger moves or grows
        // in place, page-aligned either way; a shrink below the threshold
        // and back again frees with the matching alignment.
        let mut g: Vec<u8> = vec![7; 1000 + i];
        g.reserve_exact(PAGE_ALIGNED_FROM);
        assert!(aligned(g.as_ptr()), "realloc small -> large");
        g.reserve_exact(4 * PAGE_ALIGNED_FROM);
        assert!(aligned(g.as_ptr()), "realloc large -> larger");
        g.shrink_to_fit();
        assert!(g.iter().all(|&b| b == 7));
        g.truncate(10);
        g.shrink_to_fit();
        g.reserve_exact(PAGE_ALIGNED_FROM);
        assert!(aligned(g.as_ptr()), "realloc back to large");
        assert_eq!(&g[..], &[7u8; 10][..]);
    }
    // Blocks of 2 MiB and more start on a huge page, through every path
    // (jemalloc alone puts a 2 MiB-aligned start at one page in 512).
    let huge = |p: *const u8| p as usize % HUGE_PAGE == 0;
    for i in 0..16 {
        let n = HUGE_ALIGNED_FROM + i * 4096 + 64;
        let v: Vec<u8> = Vec::with_capacity(n);
        assert!(huge(v.as_ptr()), "alloc of {n} bytes");
        let z: Vec<f32> = vec![0.0; n / 4];
        assert!(huge(z.as_ptr().cast()), "alloc_zeroed of {n} bytes");
        assert!(z.iter().all(|&x| x == 0.0));
        let mut g: Vec<u8> = vec![7; PAGE_ALIGNED_FROM + i];
        g.reserve_exact(n);
        assert!(huge(g.as_ptr()), "realloc large -> huge");
        g.reserve_exact(3 * n);
        assert!(huge(g.as_ptr()), "realloc huge -> larger");
        // Shrunk below the threshold and grown again: freed and reallocated
        // with matching alignments.
        g.truncate(PAGE_ALIGNED_FROM);
        g.shrink_to_fit();
        assert!(aligned(g.as_ptr()), "realloc huge -> large");
        g.reserve_exact(n);
        assert!(huge(g.as_ptr()), "realloc back to huge");
        assert!(g.iter().all(|&b| b == 7));
    }
    // Over-aligned requests keep their own alignment.
    let l = Layout::from_size_align(PAGE_ALIGNED_FROM, 1 << 16).unwrap();
    // SAFETY: non-zero size; freed with the same layout below.
    let p = unsafe { std::alloc::alloc(l) };
    assert!(!p.is_null() && p as usize % (1 << 16) == 0);
    // SAFETY: allocated above with `l`.
    unsafe { std::alloc::dealloc(p, l) };
}
