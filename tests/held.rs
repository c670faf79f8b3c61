//! Held memory: what `top`, a cgroup and the OOM killer see. The cap bounds
//! the bytes in use plus the freed pages jemalloc keeps for reuse, so a
//! capped process's resident set stays within the cap (plus code, stacks
//! and the allocator's own bookkeeping).

mod common;

use std::time::Duration;

use outcore::{MemoryCap, PodVec, Runtime};

const MIB: u64 = 1 << 20;

/// The process's peak resident set (`VmHWM`), in bytes.
fn peak_resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// Sweeps `data` bytes of executors under `cap`, alternating read and
/// update sweeps (as the quickstart does), and prints the peak resident
/// set and the peak accounted bytes.
fn sweep_under(cap: u64, data: u64, part: u64) {
    let rt = Runtime::builder()
        .mem_cap(MemoryCap::Bytes(cap))
        .workers(2)
        .build()
        .expect("runtime");
    let elems = (part / 4) as usize;
    let handles: Vec<_> = (0..data / part)
        .map(|i| {
            let v: Vec<f32> = (0..elems).map(|j| (i as usize + j) as f32).collect();
            rt.insert(PodVec::from(v)).expect("insert")
        })
        .collect();
    rt.hint_cycle(handles.iter().map(|h| h.id()));
    for kind in "rwrwr".chars() {
        let mut batch = rt.batch();
        for h in &handles {
            if kind == 'w' {
                batch.write(h, |v: &mut PodVec<f32>| {
                    v.iter_mut().for_each(|x| *x = *x * 0.5 + 1.0);
                    v.len()
                });
            } else {
                batch.read(h, |v: &PodVec<f32>| v.len());
            }
        }
        let lens = batch.run().expect("sweep");
        assert!(lens.iter().all(|&n| n == elems));
    }
    let s = rt.stats();
    assert!(s.evictions > 0 && s.loads > 0, "{s:?}");
    println!(
        "PEAK_RSS={} PEAK_ACCOUNTED={}",
        peak_resident(),
        s.peak_bytes
    );
}

/// A 256 MiB sweep with updates under a 64 MiB cap: the freed pages kept
/// for reuse (by the loads that follow evictions) count within the cap.
/// They were kept up to what physical memory left above it: the same
/// workload at 1 GiB under 256 MiB (the quickstart) held 516 MiB resident.
#[test]
fn the_resident_set_stays_within_the_cap() {
    const TEST: &str = "the_resident_set_stays_within_the_cap";
    let cap = 64 * MIB;
    if common::is_child(TEST) {
        sweep_under(cap, 256 * MIB, 4 * MIB);
        return;
    }
    let out = common::child_ok(TEST, None, Duration::from_secs(300), &[]);
    let rss = out.num("PEAK_RSS");
    let bound = cap + cap / 20 + 32 * MIB;
    assert!(
        rss <= bound,
        "peak resident set {} MiB over {} MiB (cap {} MiB; peak accounted {} MiB)",
        rss / MIB,
        bound / MIB,
        cap / MIB,
        out.num("PEAK_ACCOUNTED") / MIB
    );
}
