//! Eviction decisions at scale: one read sweep over N small executors under
//! a cap that holds half of them, for N = 1,000, 10,000 and 100,000. Every
//! load makes room by evicting one executor, so the time per eviction is
//! the cost of a decision plus a drop and a load; it should not grow with N.
//!
//! ```text
//! cargo bench --bench victims
//! ```
//!
//! The executors have a lineage (rebuilt, never written), so no disk I/O
//! is involved: what is measured is the runtime's bookkeeping.

use std::time::Instant;

use outcore::{MemoryCap, PodVec, Runtime};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

const ELEMS: usize = 4096; // 16 KiB per executor

fn sweep(n: usize) -> (f64, u64) {
    let bytes = n * ELEMS * 4;
    let rt = Runtime::builder()
        .workers(2)
        .mem_cap(MemoryCap::Bytes((bytes / 2) as u64))
        .build()
        .expect("runtime");
    let hs: Vec<_> = (0..n)
        .map(|i| {
            rt.insert_lazy(None, ELEMS * 4, move || {
                Ok(PodVec::from(vec![i as u32; ELEMS]))
            })
            .expect("insert")
        })
        .collect();
    rt.hint_cycle(hs.iter().map(|h| h.id()));
    // A first sweep builds them all (filling the cap), the second is timed.
    for timed in [false, true] {
        let before = rt.stats();
        let t = Instant::now();
        let mut b = rt.batch();
        for h in &hs {
            b.read(h, |v: &PodVec<u32>| v[0]);
        }
        b.run().expect("sweep");
        if timed {
            let evictions = rt.stats().evictions - before.evictions;
            return (t.elapsed().as_secs_f64(), evictions);
        }
    }
    unreachable!()
}

fn main() {
    println!(
        "{:>8} {:>10} {:>10} {:>16}",
        "N", "sweep s", "evictions", "us per eviction"
    );
    // `cargo bench --bench victims -- 100000` runs one size.
    let sizes: Vec<usize> = match std::env::args().skip(1).find_map(|a| a.parse().ok()) {
        Some(n) => vec![n],
        None => vec![1_000, 10_000, 100_000],
    };
    for n in sizes {
        let (s, e) = sweep(n);
        println!(
            "{n:>8} {s:>10.3} {e:>10} {:>16.1}",
            s * 1e6 / e.max(1) as f64
        );
    }
}
