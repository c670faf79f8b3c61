//! The allocation trap, end to end. Every scenario runs in a child process:
//! the cap is process-wide, and hard limits (`RLIMIT_AS`) must be set
//! before the allocator starts.

mod common;

use std::time::Duration;

use common::{is_child, run_child, run_job, Part};
use outcore::{EvictionPolicy, MemoryCap, Runtime};

const PARTS: usize = 16;
const PART_BYTES: usize = 16 << 20;
const SWEEPS: &str = "rwr";
const TIMEOUT: Duration = Duration::from_secs(300);

fn job_child(cap: MemoryCap, policy: EvictionPolicy) {
    let rt = Runtime::builder()
        .mem_cap(cap)
        .policy(policy)
        .build()
        .expect("runtime");
    let digest = run_job(&rt, PARTS, PART_BYTES, SWEEPS);
    let s = rt.stats();
    println!("DIGEST={digest:x}");
    println!("EVICTIONS={}", s.evictions);
    println!("TRAP_EVICTIONS={}", s.trap_evictions);
    println!("HARD_TRAPS={}", s.hard_traps);
    println!("PEAK={}", s.peak_bytes);
    println!("LOADS={}", s.loads);
    println!("RESERVE={}", s.reserve_allocs);
}

fn ok(test: &str, limit: Option<u64>) -> common::ChildOutput {
    ok_with(test, limit, &[])
}

/// [`ok`] with extra environment variables for the child (never `set_var`:
/// it would leak into the children of tests running alongside).
fn ok_with(test: &str, limit: Option<u64>, env: &[(&str, &str)]) -> common::ChildOutput {
    common::child_ok(test, limit, TIMEOUT, env)
}

fn num(out: &common::ChildOutput, key: &str) -> u64 {
    out.num(key)
}

#[test]
fn uncapped_reference() {
    if is_child("uncapped_reference") {
        return job_child(MemoryCap::None, EvictionPolicy::Priority);
    }
    let out = ok("uncapped_reference", None);
    assert_eq!(num(&out, "EVICTIONS"), 0);
}

/// Executors total 4x the soft cap: the job completes, evicts, and gives
/// the same result as without a cap, under both policies.
#[test]
fn soft_cap_4x_matches_uncapped() {
    if is_child("soft_cap_4x_matches_uncapped") {
        let policy =
            std::env::var("POLICY").map_or(EvictionPolicy::Priority, |_| EvictionPolicy::Lru);
        return job_child(MemoryCap::Bytes((PARTS * PART_BYTES / 4) as u64), policy);
    }
    let reference = ok("uncapped_reference", None)
        .value("DIGEST")
        .expect("digest");
    let capped = ok("soft_cap_4x_matches_uncapped", None);
    assert_eq!(capped.value("DIGEST").as_deref(), Some(reference.as_str()));
    assert!(num(&capped, "EVICTIONS") > 0);
    // Peak accounted usage stays near the cap (the cap, plus one part being
    // loaded, plus slack).
    let cap = (PARTS * PART_BYTES / 4) as u64;
    assert!(
        num(&capped, "PEAK") < cap + 2 * PART_BYTES as u64,
        "peak {} vs cap {cap}",
        num(&capped, "PEAK")
    );

    let lru = ok_with("soft_cap_4x_matches_uncapped", None, &[("POLICY", "lru")]);
    assert_eq!(lru.value("DIGEST").as_deref(), Some(reference.as_str()));
    assert!(num(&lru, "EVICTIONS") > 0);
}

/// Address space for the hard-limit children: start-up (about 55 MiB with
/// the runtime's threads, reserve and headroom) plus 170 MiB, while the job
/// holds 256 MiB of executors.
const HARD_LIMIT: u64 = 225 << 20;

/// Under `RLIMIT_AS` with the soft cap off, the hard trap evicts and the
/// job completes with the uncapped result.
#[test]
fn hard_limit_trap_completes() {
    if is_child("hard_limit_trap_completes") {
        return job_child(MemoryCap::None, EvictionPolicy::Priority);
    }
    let reference = ok("uncapped_reference", None)
        .value("DIGEST")
        .expect("digest");
    let out = ok("hard_limit_trap_completes", Some(HARD_LIMIT));
    assert_eq!(out.value("DIGEST").as_deref(), Some(reference.as_str()));
    assert!(
        num(&out, "HARD_TRAPS") > 0,
        "the hard trap never ran:\n{}",
        out.stdout
    );
    assert!(num(&out, "TRAP_EVICTIONS") > 0);
}

/// Control for the test above: the same data, held in plain vectors beside
/// an idle runtime (so start-up costs the same), does not fit under the
/// same limit.
#[test]
fn hard_limit_is_too_small_without_the_runtime() {
    if is_child("hard_limit_is_too_small_without_the_runtime") {
        let _rt = Runtime::builder().build().expect("runtime");
        let parts: Vec<Part> = (0..PARTS)
            .map(|i| Part::new(i as u64, PART_BYTES / 4))
            .collect();
        println!("HELD={}", parts.len());
        return;
    }
    let out = run_child(
        "hard_limit_is_too_small_without_the_runtime",
        Some(HARD_LIMIT),
        TIMEOUT,
    );
    assert!(
        !out.status.success(),
        "the job fit without the runtime; the limit is too loose"
    );
}

/// When everything is pinned, a failing allocation gives one diagnostic
/// line and fails (no hang).
#[test]
fn all_pinned_fails_with_diagnostic() {
    if is_child("all_pinned_fails_with_diagnostic") {
        let rt = Runtime::builder().build().expect("runtime");
        let h = rt.insert(Part::new(0, 1 << 20)).expect("insert");
        let r = rt.write(&h, |p: &mut Part| {
            // More than the limit leaves (though less than the limit),
            // while the only executor is pinned by this task.
            let big: Vec<u8> = std::hint::black_box(vec![1u8; 200 << 20]);
            p.updates = big[12345] as u32;
        });
        println!("UNEXPECTED={r:?}");
        return;
    }
    let out = run_child(
        "all_pinned_fails_with_diagnostic",
        Some(HARD_LIMIT),
        Duration::from_secs(120),
    );
    assert!(
        !out.status.success(),
        "allocation should have failed:\n{}",
        out.stdout
    );
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("outcore: out of memory"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one diagnostic line, stderr:\n{}",
        out.stderr
    );
    assert!(lines[0].contains("209715200 bytes"), "{}", lines[0]);
    assert!(lines[0].contains("1 executor(s) pinned"), "{}", lines[0]);
}

/// Many threads allocating at once under a small cap, while tasks sweep
/// the executors: no deadlock (the child has a watchdog timeout), no lost
/// executor (every checksum preserved).
#[test]
fn many_threads_under_a_small_cap() {
    const N: usize = 24;
    const BYTES: usize = 2 << 20;
    if is_child("many_threads_under_a_small_cap") {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(24 << 20))
            .build()
            .expect("runtime");
        let handles: Vec<_> = (0..N)
            .map(|i| rt.insert(Part::new(i as u64, BYTES / 4)).expect("insert"))
            .collect();
        rt.hint_cycle(handles.iter().map(|h| h.id()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ t;
                    let mut held: Vec<Vec<u8>> = Vec::new();
                    let mut rounds = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let size = 1 + (seed % (1 << 20)) as usize;
                        let fill = (seed >> 32) as u8;
                        let mut v = vec![fill; size];
                        v[size / 2] = fill;
                        held.push(v);
                        if held.len() > 4 {
                            let old = held.remove(0);
                            let f = old[0];
                            assert!(old.iter().all(|&b| b == f), "a buffer was corrupted");
                        }
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        let mut updates = [0u32; N];
        for round in 0..6 {
            let mut b = rt.batch();
            for (i, h) in handles.iter().enumerate() {
                if (i + round) % 2 == 0 {
                    updates[i] += 1;
                    b.write(h, |p: &mut Part| {
                        p.update();
                        p.checksum()
                    });
                } else {
                    b.read(h, |p: &Part| p.checksum());
                }
            }
            b.run().expect("batch");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let rounds: u64 = threads
            .into_iter()
            .map(|t| t.join().expect("allocating thread"))
            .sum();
        // Every executor still holds exactly what its updates made of it.
        let mut b = rt.batch();
        for h in &handles {
            b.read(h, |p: &Part| p.checksum());
        }
        let got = b.run().expect("final sweep");
        for (i, c) in got.iter().enumerate() {
            let mut want = Part::new(i as u64, BYTES / 4);
            for _ in 0..updates[i] {
                want.update();
            }
            assert_eq!(*c, want.checksum(), "executor {i} lost or damaged");
        }
        let s = rt.stats();
        println!("ROUNDS={rounds}");
        println!("EVICTIONS={}", s.evictions);
        return;
    }
    let out = ok("many_threads_under_a_small_cap", None);
    assert!(num(&out, "EVICTIONS") > 0);
    assert!(num(&out, "ROUNDS") > 0);
}

/// Read-only sweeps write each executor at most once; clean evictions
/// drop memory without writing.
#[test]
fn read_only_sweeps_write_each_executor_once() {
    const N: usize = 16;
    const BYTES: usize = 4 << 20;
    if is_child("read_only_sweeps_write_each_executor_once") {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(24 << 20))
            .build()
            .expect("runtime");
        let digest = run_job(&rt, N, BYTES, "rrrr");
        let s = rt.stats();
        println!("DIGEST={digest:x}");
        println!("WRITTEN={}", s.bytes_written);
        println!("CLEAN={}", s.clean_evictions);
        println!("EVICTIONS={}", s.evictions);
        return;
    }
    let out = ok("read_only_sweeps_write_each_executor_once", None);
    let written = num(&out, "WRITTEN");
    // Each file: the data, the header and framing, and up to a page of
    // padding that puts the data on a page boundary.
    let once = (N * (BYTES + 8192)) as u64;
    assert!(
        written <= once,
        "wrote {written} bytes for {N} executors of {BYTES}"
    );
    assert!(num(&out, "CLEAN") > 0);
    assert!(num(&out, "EVICTIONS") > num(&out, "CLEAN"));
}

/// A spill write that fails leaves the executor resident and intact, and
/// eviction moves on to other victims: the job completes, correct.
#[test]
fn a_failed_write_keeps_the_executor_and_eviction_moves_on() {
    const N: usize = 12;
    const BYTES: usize = 4 << 20;
    if is_child("a_failed_write_keeps_the_executor_and_eviction_moves_on") {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(20 << 20))
            .build()
            .expect("runtime");
        // Executor ids start at 1; a directory where executor #1's spill
        // file would go makes every write of it fail.
        std::fs::create_dir(rt.spill_dir().join("exec-00000001.spill")).expect("blocker");
        let digest = run_job(&rt, N, BYTES, "rwr");
        let s = rt.stats();
        println!("DIGEST={digest:x}");
        println!("FAILED={}", s.failed_writes);
        println!("EVICTIONS={}", s.evictions);
        return;
    }
    let reference = ok("small_reference", None).value("DIGEST").expect("digest");
    let out = ok(
        "a_failed_write_keeps_the_executor_and_eviction_moves_on",
        None,
    );
    assert_eq!(out.value("DIGEST").as_deref(), Some(reference.as_str()));
    assert!(
        num(&out, "FAILED") > 0,
        "the blocked executor was never chosen:\n{}",
        out.stdout
    );
    assert!(num(&out, "EVICTIONS") > 0);
}

/// Reference run for the test above (no cap, same job).
#[test]
fn small_reference() {
    if is_child("small_reference") {
        let rt = Runtime::builder().build().expect("runtime");
        println!("DIGEST={:x}", run_job(&rt, 12, 4 << 20, "rwr"));
    }
}

/// When usage falls, evicted executors come back without being asked.
#[test]
fn executors_come_back_when_memory_frees_up() {
    if is_child("executors_come_back_when_memory_frees_up") {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(64 << 20))
            .build()
            .expect("runtime");
        let hs: Vec<_> = (0..8)
            .map(|i| rt.insert(Part::new(i, 1 << 20)).expect("insert"))
            .collect();
        // A big temporary allocation pushes executors out...
        let big = std::hint::black_box(vec![7u8; 56 << 20]);
        let evicted_at_peak = 8 - rt.resident_count();
        drop(big);
        // ...and they come back once it is gone, with no task asking.
        let start = std::time::Instant::now();
        while rt.resident_count() < 8 && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("EVICTED={evicted_at_peak}");
        println!("RESIDENT={}", rt.resident_count());
        println!("PREFETCHES={}", rt.stats().prefetches);
        drop(hs);
        return;
    }
    let out = ok("executors_come_back_when_memory_frees_up", None);
    assert!(num(&out, "EVICTED") > 0, "{}", out.stdout);
    assert_eq!(num(&out, "RESIDENT"), 8, "{}", out.stdout);
    assert!(num(&out, "PREFETCHES") > 0);
}

/// Sweeps over a declared cycle twice the cap's size load, each sweep,
/// about what does not fit and no more: the executors used last in a
/// sweep are the victims as soon as they are idle, so the set kept in
/// memory from one sweep to the next stays as large as the cap allows.
/// (Victims used to be picked from a ranking refreshed only every so many
/// tasks, which missed the executors loaded since: those stayed resident
/// while executors kept from the last sweep were evicted, and loaded again
/// later in the same sweep.) Nothing the prefetcher loads is evicted
/// unused: it loads only what the sweep comes to next, even when tasks
/// are dispatched out of order or the prefetch threads are held up.
#[test]
fn cyclic_sweeps_load_only_what_does_not_fit() {
    const N: usize = 480;
    const ELEMS: usize = 32 << 10; // 128 KiB of data each
    const SWEEPS: usize = 5;
    const WORKERS: usize = 2;
    if is_child("cyclic_sweeps_load_only_what_does_not_fit") {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(32 << 20))
            .workers(WORKERS)
            .build()
            .expect("runtime");
        let hs: Vec<_> = (0..N)
            .map(|i| rt.insert(Part::new(i as u64, ELEMS)).expect("insert"))
            .collect();
        rt.hint_cycle(hs.iter().map(|h| h.id()));
        for sweep in 0..SWEEPS {
            let before = rt.stats();
            // In batches of 24, as a mini-batch job steps through its data.
            for batch in hs.chunks(24) {
                let mut b = rt.batch();
                for h in batch {
                    b.read(h, |p: &Part| p.checksum());
                }
                b.run().expect("batch");
            }
            let after = rt.stats();
            println!("LOADS_{sweep}={}", after.loads - before.loads);
            println!(
                "UNUSED_{sweep}={}",
                after.prefetches_unused - before.prefetches_unused
            );
            println!("RESIDENT_{sweep}={}", rt.resident_count());
        }
        return;
    }
    let out = ok("cyclic_sweeps_load_only_what_does_not_fit", None);
    for sweep in 2..SWEEPS {
        let loads = num(&out, &format!("LOADS_{sweep}"));
        // Resident when the sweep began (the last one's end) and when it
        // ended: the two differ by an executor or two, as the prefetchers
        // stand between sweeps.
        let resident = num(&out, &format!("RESIDENT_{}", sweep - 1))
            .min(num(&out, &format!("RESIDENT_{sweep}")));
        // Executors in flight: those the workers hold or have just let go
        // of, and those the prefetcher loads ahead (2 per worker).
        let in_flight = (WORKERS + 2 * WORKERS) as u64;
        // What was not resident, plus what was in flight: at the sweep's
        // ends, resident executors outside the set kept across sweeps
        // (those just used when it began, those loaded ahead for the next
        // sweep when it ended), each loaded once in the sweep; and while
        // it runs, as many kept ones that loads in flight displace, loaded
        // again at their turn. 2 to 7 more than the executors not resident
        // with every core busy beside the test. (8 to 20 more, and 0 to 15
        // prefetches unused, when a task dispatched late moved the cycle's
        // cursor back: the prefetcher loaded again executors the sweep had
        // passed, and they were evicted unused.)
        let bound = N as u64 - resident + 2 * in_flight;
        assert!(
            loads <= bound,
            "sweep {sweep}: {loads} loads with {resident} of {N} resident (at most {bound})\n{}",
            out.stdout
        );
        assert_eq!(
            num(&out, &format!("UNUSED_{sweep}")),
            0,
            "sweep {sweep}: prefetched executors evicted unused\n{}",
            out.stdout
        );
    }
}

/// Maps address space nobody uses (`PROT_NONE`, straight from the kernel,
/// not through the allocator) until none is left, to within a page. The
/// mappings live until exit.
fn exhaust_address_space() {
    let mut size: usize = 1 << 34;
    while size >= 4096 {
        if map_unused(size) == libc::MAP_FAILED {
            size /= 2;
        }
    }
}

/// Maps address space (`PROT_NONE`, never touched) of `bytes`.
fn map_unused(bytes: usize) -> *mut libc::c_void {
    // SAFETY: an anonymous mapping with no address hint; the caller checks
    // the result and never touches the mapping.
    unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    }
}

/// Leaves `bytes` of address space free and no more: what the runtime's
/// next allocations get.
fn leave_free(bytes: usize) {
    let keep = map_unused(bytes);
    assert_ne!(keep, libc::MAP_FAILED);
    exhaust_address_space();
    // SAFETY: `keep` is the mapping made above, never used.
    unsafe { libc::munmap(keep, bytes) };
}

/// The runtime's own tables grow while it holds its locks, where the trap
/// cannot evict (the evictor needs those locks). Under an address-space
/// limit with none left, the registry's table doubling on an insert used
/// to fail there and abort the process, while evictable executors were
/// resident. It doubles twice here.
#[test]
fn runtime_tables_grow_at_the_hard_limit() {
    // Executors in the registry after which inserting one more doubles its
    // table (to 2^17 entries, 2.2 MiB, then to 2^18, 4.5 MiB).
    const FULL: [usize; 2] = [57_344, 114_688];
    const BIG: usize = 8;
    if is_child("runtime_tables_grow_at_the_hard_limit") {
        let rt = Runtime::builder()
            .workers(1)
            .prefetch(false)
            .build()
            .expect("runtime");
        let mut big = Vec::with_capacity(BIG);
        for i in 0..BIG {
            big.push(
                rt.insert(Part::new(i as u64, PART_BYTES / 4))
                    .expect("insert"),
            );
        }
        let mut small = Vec::with_capacity(FULL[1] + 1);
        for full in FULL {
            while small.len() + BIG < full {
                small.push(rt.insert((small.len() + BIG) as u64).expect("insert"));
            }
            // 1 MiB free: enough for the next executor's slot, not for
            // the table.
            leave_free(1 << 20);
            small.push(rt.insert((small.len() + BIG) as u64).expect("insert"));
            println!("INSERTED_{full}={}", small.len() + BIG);
        }
        // Every executor is still there and intact.
        let mut b = rt.batch();
        for h in &small {
            b.read(h, |v: &u64| *v);
        }
        let sum: u64 = b.run().expect("batch").into_iter().sum();
        println!("SUM={sum}");
        for (i, h) in big.iter().enumerate() {
            let c = rt.read(h, |p: &Part| p.checksum()).expect("read");
            assert_eq!(c, Part::new(i as u64, PART_BYTES / 4).checksum());
        }
        let s = rt.stats();
        println!("HEADROOM_RELEASES={}", s.headroom_releases);
        println!("HARD_TRAPS={}", s.hard_traps);
        return;
    }
    let out = ok("runtime_tables_grow_at_the_hard_limit", Some(HARD_LIMIT));
    for full in FULL {
        assert_eq!(num(&out, &format!("INSERTED_{full}")), full as u64 + 1);
    }
    let n = FULL[1] as u64 + 1;
    let big = BIG as u64;
    assert_eq!(num(&out, "SUM"), n * (n - 1) / 2 - big * (big - 1) / 2);
    // The table grows outside the lock, where the trap evicts: the
    // address space held back for allocations under a lock was not needed.
    assert_eq!(num(&out, "HEADROOM_RELEASES"), 0, "{}", out.stdout);
}

/// Address space for the tests below, which hold more bookkeeping.
const ROOMY_LIMIT: u64 = 1 << 30;

/// A long declared cycle (each executor named 50 times) needs a 40 MB
/// vector of positions. It used to be allocated under the registry lock,
/// where it could not trap, and aborted the process at the limit: more
/// than the headroom held back.
#[test]
fn a_long_cycle_is_declared_at_the_hard_limit() {
    const T: &str = "a_long_cycle_is_declared_at_the_hard_limit";
    const SMALL: u64 = 100_000;
    if is_child(T) {
        let rt = Runtime::builder()
            .workers(1)
            .prefetch(false)
            .build()
            .expect("runtime");
        let big: Vec<_> = (0..8)
            .map(|i| rt.insert(Part::new(i, PART_BYTES / 4)).expect("insert"))
            .collect();
        let small: Vec<_> = (0..SMALL).map(|i| rt.insert(i).expect("insert")).collect();
        let mut order = Vec::with_capacity(small.len() * 50);
        for _ in 0..50 {
            order.extend(small.iter().map(|h| h.id()));
        }
        leave_free(1 << 20);
        rt.hint_cycle(order);
        let positions: Vec<u64> = small
            .iter()
            .filter_map(|h| h.cycle_position().map(|(_, p)| p))
            .collect();
        println!("IN_CYCLE={}", positions.len());
        // Each executor starts at its first position, in the first
        // repetition (and moves on to the next as the sweep reaches it).
        println!("FIRST={}", positions[positions.len() - 1]);
        drop(big);
        return;
    }
    let out = ok(T, Some(ROOMY_LIMIT));
    assert_eq!(num(&out, "IN_CYCLE"), SMALL);
    assert_eq!(num(&out, "FIRST"), SMALL - 1);
}

/// Tasks waiting on one executor queue up in its pending queue, which used
/// to grow under the executor's lock: at the limit, the doubling that one
/// more task needed aborted the process (or, since the headroom, took it).
#[test]
fn a_long_queue_on_one_executor_grows_at_the_hard_limit() {
    const T: &str = "a_long_queue_on_one_executor_grows_at_the_hard_limit";
    // Tasks queued on the busy executor: the queue is then full (a power
    // of two), so the next task doubles it (to 2^19 entries, 4 MiB).
    const QUEUED: usize = 1 << 18;
    if is_child(T) {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let rt = Arc::new(
            Runtime::builder()
                .workers(2)
                .prefetch(false)
                .build()
                .expect("runtime"),
        );
        let big: Vec<_> = (0..8)
            .map(|i| rt.insert(Part::new(i, PART_BYTES / 4)).expect("insert"))
            .collect();
        let a = Arc::new(rt.insert(0u64).expect("insert"));
        let c = Arc::new(rt.insert(0u64).expect("insert"));
        let release = Arc::new(AtomicBool::new(false));
        let queued = Arc::new(AtomicBool::new(false));
        // Holds `a` until released.
        let holder = {
            let (rt, a, release) = (rt.clone(), a.clone(), release.clone());
            std::thread::spawn(move || {
                rt.read(&a, move |_: &u64| {
                    while !release.load(Ordering::Acquire) {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                })
                .expect("hold")
            })
        };
        while a.state() != outcore::State::Pinned {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A batch: one task on `c`, whose result comes back once every
        // task is queued, then QUEUED tasks on `a`, which wait.
        let first = {
            let (rt, a, c, queued) = (rt.clone(), a.clone(), c.clone(), queued.clone());
            std::thread::spawn(move || {
                let mut b = rt.batch();
                b.write(&c, |v: &mut u64| *v);
                for _ in 0..QUEUED {
                    b.write(&a, |v: &mut u64| {
                        *v += 1;
                        *v
                    });
                }
                let mut last = 0;
                b.run_in_order(|i, r| {
                    if i == 0 {
                        queued.store(true, Ordering::Release);
                    }
                    last = r.expect("task");
                });
                last
            })
        };
        // One more task on `a`, from a thread started now (a thread's
        // stack needs address space too).
        let go = Arc::new(AtomicBool::new(false));
        let second = {
            let (rt, a, go) = (rt.clone(), a.clone(), go.clone());
            std::thread::spawn(move || {
                while !go.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                rt.write(&a, |v: &mut u64| {
                    *v += 1_000_000;
                    *v
                })
                .expect("task")
            })
        };
        while !queued.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        leave_free(1 << 20);
        go.store(true, Ordering::Release);
        std::thread::sleep(std::time::Duration::from_millis(200));
        release.store(true, Ordering::Release);
        holder.join().expect("holder");
        println!("FIRST={}", first.join().expect("first"));
        println!("SECOND={}", second.join().expect("second"));
        println!("FINAL={}", rt.read(&a, |v: &u64| *v).expect("read"));
        println!("HEADROOM_RELEASES={}", rt.stats().headroom_releases);
        drop(big);
        return;
    }
    let out = ok(T, Some(ROOMY_LIMIT));
    // Every update landed, in whichever order the two batches ran.
    let all = QUEUED as u64 + 1_000_000;
    assert_eq!(num(&out, "FINAL"), all);
    assert!(num(&out, "FIRST") <= all && num(&out, "SECOND") <= all);
    assert!(num(&out, "FIRST") == all || num(&out, "SECOND") == all);
    // The queue grew outside the executor's lock, where the trap evicts.
    assert_eq!(num(&out, "HEADROOM_RELEASES"), 0, "{}", out.stdout);
}

/// Under `RLIMIT_AS`, threads cost their stacks only: the C library's
/// malloc (which a thread's start uses) used to give each new thread an
/// arena reserving 64 MiB of address space, so a few threads took most of
/// a limit of a few hundred MiB.
#[test]
fn threads_cost_little_address_space_under_a_limit() {
    const T: &str = "threads_cost_little_address_space_under_a_limit";
    const THREADS: usize = 8;
    if is_child(T) {
        let before = common::vm_size();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS + 1));
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                let b = barrier.clone();
                std::thread::spawn(move || {
                    // SAFETY: a small C allocation, freed at once.
                    unsafe { libc::free(std::hint::black_box(libc::malloc(100))) };
                    b.wait();
                    b.wait();
                })
            })
            .collect();
        barrier.wait();
        println!("GROWTH={}", common::vm_size() - before);
        barrier.wait();
        for h in hs {
            h.join().expect("thread");
        }
        return;
    }
    let out = ok(T, Some(HARD_LIMIT));
    // The stacks (2 MiB each and a guard page), not 64 MiB per thread.
    let growth = num(&out, "GROWTH");
    assert!(
        growth < (THREADS as u64) * (4 << 20),
        "{growth} bytes for {THREADS} threads"
    );
}

/// A request larger than the address-space limit fails at once, evicting
/// nothing, and its line says so: it used to say "nothing left to evict,
/// 0 executor(s) pinned" with every executor resident and evictable.
#[test]
fn a_request_over_the_limit_is_refused_with_a_true_line() {
    const T: &str = "a_request_over_the_limit_is_refused_with_a_true_line";
    if is_child(T) {
        let rt = Runtime::builder().prefetch(false).build().expect("runtime");
        let hs: Vec<_> = (0..4)
            .map(|i| rt.insert(Part::new(i, PART_BYTES / 4)).expect("insert"))
            .collect();
        let mut v: Vec<u8> = Vec::new();
        println!(
            "REFUSED={}",
            v.try_reserve(HARD_LIMIT as usize + (1 << 30)).is_err()
        );
        println!("EVICTIONS={}", rt.stats().evictions);
        drop(hs);
        return;
    }
    let out = ok(T, Some(HARD_LIMIT));
    assert_eq!(out.value("REFUSED").as_deref(), Some("true"));
    assert_eq!(num(&out, "EVICTIONS"), 0);
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("outcore:"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].contains("refused without evicting"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains(&format!("limit of {HARD_LIMIT} bytes")),
        "{}",
        lines[0]
    );
    assert!(!lines[0].contains("nothing left to evict"), "{}", lines[0]);
}

/// A request larger than the soft cap but within the limit is tried once
/// without evicting; when it fails, its line says that, not that it could
/// never fit under the limit.
#[test]
fn a_request_over_the_cap_that_fails_says_so() {
    const T: &str = "a_request_over_the_cap_that_fails_says_so";
    if is_child(T) {
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(32 << 20))
            .prefetch(false)
            .build()
            .expect("runtime");
        let hs: Vec<_> = (0..2)
            .map(|i| rt.insert(Part::new(i, PART_BYTES / 4)).expect("insert"))
            .collect();
        let mut v: Vec<u8> = Vec::new();
        println!("REFUSED={}", v.try_reserve(200 << 20).is_err());
        drop(hs);
        return;
    }
    let out = ok(T, Some(HARD_LIMIT));
    assert_eq!(
        out.value("REFUSED").as_deref(),
        Some("true"),
        "{}",
        out.stderr
    );
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("outcore:"))
        .unwrap_or_default();
    assert!(
        line.contains("209715200 bytes, more than the cap, failed without evicting"),
        "{line}"
    );
}
