//! Allocator overhead: TrapAlloc vs bare jemalloc vs the system allocator,
//! measured side by side in one run, reported as ratios to jemalloc.
//!
//! ```text
//! cargo bench --bench alloc
//! ```
//!
//! Each allocator's `GlobalAlloc` methods are called directly (the process's
//! own global allocator is TrapAlloc either way), on three workloads: small
//! mixed-size alloc/free, realloc growth, and large blocks; one thread and
//! two. Every measurement is the best of several rounds, rounds interleaved
//! across allocators so machine noise hits them alike.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::Instant;

use outcore::TrapAlloc;
use tikv_jemallocator::Jemalloc;

fn small_mixed<A: GlobalAlloc>(a: &A, seed: u64) {
    let mut s = seed | 1;
    let mut live: Vec<(*mut u8, Layout)> = Vec::with_capacity(512);
    for _ in 0..2_000_000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if live.len() < 256 || (s & 1 == 0 && live.len() < 512) {
            let size = 8 + (s >> 8) as usize % 1024;
            let l = Layout::from_size_align(size, 8).expect("layout");
            // SAFETY: non-zero size; freed below with the same layout.
            let p = unsafe { a.alloc(l) };
            assert!(!p.is_null());
            // SAFETY: p points to at least one writable byte.
            unsafe { *p = 1 };
            live.push((p, l));
        } else {
            let i = (s >> 20) as usize % live.len();
            let (p, l) = live.swap_remove(i);
            // SAFETY: allocated above by `a` with layout `l`.
            unsafe { a.dealloc(p, l) };
        }
    }
    for (p, l) in live {
        // SAFETY: allocated above by `a` with layout `l`.
        unsafe { a.dealloc(p, l) };
    }
}

fn realloc_growth<A: GlobalAlloc>(a: &A) {
    for _ in 0..2_000 {
        let mut l = Layout::from_size_align(16, 8).expect("layout");
        // SAFETY: non-zero size.
        let mut p = unsafe { a.alloc(l) };
        while l.size() < (1 << 20) {
            let n = l.size() * 2;
            // SAFETY: p was allocated by `a` with `l`; n is non-zero.
            p = unsafe { a.realloc(p, l, n) };
            assert!(!p.is_null());
            l = Layout::from_size_align(n, 8).expect("layout");
            // SAFETY: the block has n bytes.
            unsafe { *p.add(n - 1) = 1 };
        }
        // SAFETY: allocated by `a` with `l`.
        unsafe { a.dealloc(p, l) };
    }
}

fn large_blocks<A: GlobalAlloc>(a: &A) {
    let l = Layout::from_size_align(1 << 20, 64).expect("layout");
    for _ in 0..20_000 {
        // SAFETY: non-zero size; freed right after.
        let p = unsafe { a.alloc(l) };
        assert!(!p.is_null());
        // SAFETY: p has 1 MiB.
        unsafe {
            *p = 1;
            a.dealloc(black_box(p), l);
        }
    }
}

fn time<F: Fn() + Sync>(threads: usize, f: &F) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(f);
        }
    });
    t.elapsed().as_secs_f64()
}

fn main() {
    let trap = TrapAlloc::new();
    let je = Jemalloc;
    let sys = System;
    type Work<'a> = Box<dyn Fn(usize) + Sync + 'a>;
    let workloads: Vec<(&str, Work, Work, Work)> = vec![
        (
            "small mixed",
            Box::new(|t| small_mixed(&trap, t as u64 + 1)),
            Box::new(|t| small_mixed(&je, t as u64 + 1)),
            Box::new(|t| small_mixed(&sys, t as u64 + 1)),
        ),
        (
            "realloc growth",
            Box::new(|_| realloc_growth(&trap)),
            Box::new(|_| realloc_growth(&je)),
            Box::new(|_| realloc_growth(&sys)),
        ),
        (
            "large 1 MiB",
            Box::new(|_| large_blocks(&trap)),
            Box::new(|_| large_blocks(&je)),
            Box::new(|_| large_blocks(&sys)),
        ),
    ];
    println!(
        "{:<16} {:>7} {:>11} {:>11} {:>11} {:>13} {:>13}",
        "workload",
        "threads",
        "trap ms",
        "jemalloc ms",
        "system ms",
        "trap/jemalloc",
        "system/jemalloc"
    );
    for (name, tw, jw, sw) in &workloads {
        for threads in [1usize, 2] {
            let (mut bt, mut bj, mut bs) = (f64::MAX, f64::MAX, f64::MAX);
            for _ in 0..7 {
                bt = bt.min(time(threads, &|| tw(threads)));
                bj = bj.min(time(threads, &|| jw(threads)));
                bs = bs.min(time(threads, &|| sw(threads)));
            }
            println!(
                "{name:<16} {threads:>7} {:>11.2} {:>11.2} {:>11.2} {:>13.3} {:>13.3}",
                bt * 1e3,
                bj * 1e3,
                bs * 1e3,
                bt / bj,
                bs / bj
            );
        }
    }
}
