//! Allocator overhead: TrapAlloc vs bare jemalloc vs the system allocator,
//! measured side by side in one criterion run, with the ratio to jemalloc
//! printed at the end.
//!
//! ```text
//! cargo bench --bench alloc
//! ```
//!
//! Each allocator's `GlobalAlloc` methods are called directly (the process's
//! own global allocator is TrapAlloc, installed below), on three workloads (small
//! mixed-size alloc/free, realloc growth, 1 MiB blocks), with one thread
//! and with two. Target: TrapAlloc at most 1.05x jemalloc.
//!
//! Two tables are printed at the end: ratios of criterion's medians, and
//! ratios of the fastest of 15 alternating rounds (the one to trust on a
//! shared, noisy machine).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use outcore::TrapAlloc;
use tikv_jemallocator::Jemalloc;

#[path = "common.rs"]
mod common;

/// outcore's allocator, installed by the program (one line).
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

fn small_mixed<A: GlobalAlloc>(a: &A, seed: u64) {
    let mut s = seed | 1;
    let mut live: Vec<(*mut u8, Layout)> = Vec::with_capacity(512);
    for _ in 0..100_000 {
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

fn realloc_growth<A: GlobalAlloc>(a: &A, _seed: u64) {
    for _ in 0..100 {
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

fn large_blocks<A: GlobalAlloc>(a: &A, _seed: u64) {
    let l = Layout::from_size_align(1 << 20, 64).expect("layout");
    for _ in 0..1_000 {
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

/// Runs `work` on `threads` threads, `iters` times each, and returns the
/// wall time.
fn timed(iters: u64, threads: usize, work: &(dyn Fn(u64) + Sync)) -> Duration {
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..threads {
            s.spawn(move || {
                for i in 0..iters {
                    work(i * 7 + th as u64 + 1);
                }
            });
        }
    });
    t.elapsed()
}

const WORKLOADS: [&str; 3] = ["small_mixed", "realloc_growth", "large_1MiB"];
const ALLOCATORS: [&str; 3] = ["trapalloc", "jemalloc", "system"];

fn run_one(name: &str, alloc: &str, seed: u64) {
    macro_rules! with {
        ($a:expr) => {
            match name {
                "small_mixed" => small_mixed($a, seed),
                "realloc_growth" => realloc_growth($a, seed),
                _ => large_blocks($a, seed),
            }
        };
    }
    match alloc {
        "trapalloc" => with!(&TrapAlloc::new()),
        "jemalloc" => with!(&Jemalloc),
        _ => with!(&System),
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    for name in WORKLOADS {
        for threads in [1usize, 2] {
            let group_name = format!("alloc_{name}_{threads}t");
            let mut g = c.benchmark_group(&group_name);
            for alloc in ALLOCATORS {
                g.bench_function(alloc, |b| {
                    b.iter_custom(|iters| timed(iters, threads, &|seed| run_one(name, alloc, seed)))
                });
            }
            g.finish();
        }
    }
    c.final_summary();
    println!("\nRatios from criterion's medians (each allocator measured in turn):");
    println!(
        "{:<24} {:>14} {:>16}",
        "workload", "trap/jemalloc", "system/jemalloc"
    );
    for name in WORKLOADS {
        for threads in [1usize, 2] {
            let g = format!("alloc_{name}_{threads}t");
            if let (Some(t), Some(j), Some(s)) = (
                common::mean_ns(&g, "trapalloc"),
                common::mean_ns(&g, "jemalloc"),
                common::mean_ns(&g, "system"),
            ) {
                println!(
                    "{:<24} {:>14.3} {:>16.4}",
                    format!("{name}, {threads} thread(s)"),
                    t / j,
                    s / j
                );
            }
        }
    }
    interleaved();
}

/// The same comparison, robust to a noisy machine: TrapAlloc and jemalloc
/// alternate, round after round, on the same work, and the fastest round
/// of each is kept (noise only ever adds time), so drift between the two
/// measurements cannot pose as overhead.
fn interleaved() {
    const ROUNDS: usize = 15;
    println!("\nInterleaved, fastest of {ROUNDS} alternating rounds:");
    println!("{:<24} {:>14}", "workload", "trap/jemalloc");
    for name in WORKLOADS {
        for threads in [1usize, 2] {
            let iters = match name {
                "small_mixed" => 20,
                "realloc_growth" => 20,
                _ => 200,
            };
            let mut best = [Duration::MAX; 2];
            for _ in 0..ROUNDS {
                for (i, alloc) in ["trapalloc", "jemalloc"].into_iter().enumerate() {
                    let t = timed(iters, threads, &|seed| run_one(name, alloc, seed));
                    best[i] = best[i].min(t);
                }
            }
            println!(
                "{:<24} {:>14.3}",
                format!("{name}, {threads} thread(s)"),
                best[0].as_secs_f64() / best[1].as_secs_f64()
            );
        }
    }
}
