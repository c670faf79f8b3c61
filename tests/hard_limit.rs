//! Under a hard address-space limit (`RLIMIT_AS`) set just above what the
//! process maps at start, the process never crashes: it completes, or it
//! refuses with one `outcore:` line. Each run is a child process whose
//! limit is set (before `exec`, so the allocator starts under it) relative
//! to the `VmSize` a probe child measured at the same point.

mod common;

use std::time::Duration;

use common::{is_child, run_child, run_child_with, vm_size, ChildOutput};
use outcore::{Handle, PodVec, Runtime};
use serde::{Deserialize, Serialize};

/// One executor: data whose checksum never changes, and a counter that
/// write tasks bump (so evictions write).
#[derive(Serialize, Deserialize)]
struct Block {
    data: PodVec<u32>,
    count: u64,
}

fn fill(i: u64, elems: usize) -> Vec<u32> {
    (0..elems as u32)
        .map(|j| j.wrapping_mul(2_654_435_761) ^ (i as u32).wrapping_mul(40_503))
        .collect()
}

fn sum(v: &[u32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// xorshift: the child's random choices (thread timing varies anyway).
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// The workload: 19 executors of 1 MiB, and 3 threads submitting batches
/// of joins (two executors read, one written: 3 MiB) to 2 workers, with
/// prefetch on and no soft cap. Prints `JOINS=` and `OK=1` when every join
/// saw the right data and every write counted.
fn joins_child() {
    const N: usize = 19;
    let probe = std::env::var("OUTCORE_TEST_PROBE").is_ok();
    let rt = match Runtime::builder().workers(2).build() {
        Ok(rt) => rt,
        Err(e) => {
            // A refusal: one line.
            eprintln!("outcore: {e}");
            std::process::exit(2);
        }
    };
    let hs: std::sync::OnceLock<Vec<Handle<Block>>> = std::sync::OnceLock::new();
    let sums: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    let go = std::sync::Barrier::new(4);
    let writes: u64 = std::thread::scope(|s| {
        // The threads start before the data comes in: a thread's stack is
        // mapped outside any allocator, and the trap cannot make room for
        // it (docs/reliability.md).
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let (rt, hs, sums, go) = (&rt, &hs, &sums, &go);
                s.spawn(move || {
                    go.wait();
                    match (hs.get(), sums.get()) {
                        (Some(hs), Some(sums)) => submit(rt, hs, sums, t),
                        _ => 0,
                    }
                })
            })
            .collect();
        if probe {
            println!("VMSIZE={}", vm_size());
        } else {
            let _ = hs.set(
                (0..N)
                    .map(|i| {
                        rt.insert(Block {
                            data: PodVec::from(fill(i as u64, elems(i))),
                            count: 0,
                        })
                        .expect("insert")
                    })
                    .collect::<Vec<_>>(),
            );
            let _ = sums.set((0..N).map(|i| sum(&fill(i as u64, elems(i)))).collect());
        }
        go.wait();
        threads.into_iter().map(|t| t.join().expect("thread")).sum()
    });
    let Some(hs) = hs.get() else { return };
    let mut counted = 0;
    for h in hs {
        counted += rt.read(h, |b: &Block| b.count).expect("read");
    }
    assert_eq!(counted, writes, "a write was lost");
    let s = rt.stats();
    println!("JOINS={writes}");
    println!("HARD_TRAPS={}", s.hard_traps);
    println!("OK=1");
}

/// Executor `i` holds 0.5, 1 or 1.5 MiB (19 MiB for 19 executors).
fn elems(i: usize) -> usize {
    (i % 3 + 1) * (128 << 10)
}

/// One submitting thread: batches of joins (two executors read, one
/// written), each result checked. Returns the writes it made.
fn submit(rt: &Runtime, hs: &[Handle<Block>], sums: &[u64], t: u64) -> u64 {
    const ROUNDS: usize = 12;
    const PER_BATCH: usize = 6;
    let n = hs.len();
    let mut seed = 0x9e37_79b9_7f4a_7c15 ^ (t + 1);
    let mut writes = 0u64;
    for _ in 0..ROUNDS {
        let mut b = rt.batch();
        let mut want = Vec::new();
        for _ in 0..PER_BATCH {
            // Executor `w` written, `a` read, and `c` read too when the
            // three hold at most 3 MiB; each task also allocates 256 KiB
            // of its own while its executors are pinned.
            let a = next(&mut seed) as usize % n;
            let c = (a + 1 + next(&mut seed) as usize % (n - 1)) % n;
            let mut w = next(&mut seed) as usize % n;
            while w == a || w == c {
                w = (w + 1) % n;
            }
            let three = elems(a) + elems(c) + elems(w) <= 3 * (256 << 10);
            let (ka, kc, kw) = (hs[a].key(), hs[c].key(), hs[w].key());
            if three {
                b.task(&[&hs[a], &hs[c]], &[&hs[w]], move |j| {
                    let scratch = std::hint::black_box(vec![1u8; 256 << 10]);
                    j.write(kw).count += u64::from(scratch[7]);
                    (sum(&j.read(ka).data), sum(&j.read(kc).data))
                });
                want.push((sums[a], sums[c]));
            } else {
                b.task(&[&hs[a]], &[&hs[w]], move |j| {
                    let scratch = std::hint::black_box(vec![1u8; 256 << 10]);
                    j.write(kw).count += u64::from(scratch[7]);
                    (sum(&j.read(ka).data), 0)
                });
                want.push((sums[a], 0));
            }
            writes += 1;
        }
        let got = b.run().expect("batch");
        assert_eq!(got, want, "a join saw the wrong data");
    }
    writes
}

/// The address space the child maps once its runtime is built, before
/// any data comes in ("the start"), under a finite limit near the ones
/// the sweep sets (the runtime holds back 1/32 of the limit as headroom):
/// a first probe under a generous limit, a second 64 MiB above that.
fn start_vm_size(test: &str) -> u64 {
    let probe = [("OUTCORE_TEST_PROBE", "1")];
    let mut limit = 4 << 30;
    for _ in 0..2 {
        let out = run_child_with(test, Some(limit), Duration::from_secs(60), &probe);
        assert!(out.status.success(), "probe failed: {out:?}");
        limit = out.num("VMSIZE") + (64 << 20);
    }
    limit - (64 << 20)
}

/// How one run under a limit ended.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    Completed,
    /// Failed with exactly one `outcore:` line on stderr.
    Refused,
    /// Anything else: a signal other than an abort after our line, a
    /// panic, the standard library's line alone.
    Crashed,
}

fn judge(out: &ChildOutput) -> Outcome {
    if out.status.success() && out.value("OK").as_deref() == Some("1") {
        return Outcome::Completed;
    }
    let ours = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("outcore:"))
        .count();
    let panicked = out.stderr.contains("panicked");
    if ours == 1 && !panicked && out.stdout.lines().all(|l| !l.contains("OK=")) {
        use std::os::unix::process::ExitStatusExt;
        // An abort after our line (Rust's allocation failure), or an
        // exit with an error code.
        if out.status.signal().is_none_or(|s| s == libc::SIGABRT) {
            return Outcome::Refused;
        }
    }
    Outcome::Crashed
}

/// Runs `test` `runs` times at each margin (MiB over the start), and
/// returns, per margin, (completed, refused, crashed) with the stderr of
/// the first crash.
fn sweep(test: &str, margins: &[u64], runs: usize) -> Vec<(u64, [usize; 3], Option<String>)> {
    let start = start_vm_size(test);
    margins
        .iter()
        .map(|&m| {
            let mut counts = [0usize; 3];
            let mut first = None;
            for _ in 0..runs {
                let out = run_child(test, Some(start + (m << 20)), Duration::from_secs(60));
                let o = judge(&out);
                counts[o as usize] += 1;
                if o == Outcome::Crashed && first.is_none() {
                    first = Some(format!("{:?}\n{}\n{}", out.status, out.stdout, out.stderr));
                }
            }
            eprintln!("start {start}: +{m} MiB: completed/refused/crashed = {counts:?}");
            (m, counts, first)
        })
        .collect()
}

fn report(results: &[(u64, [usize; 3], Option<String>)]) {
    for (m, counts, first) in results {
        assert_eq!(
            counts[2],
            0,
            "+{m} MiB: {counts:?} (completed, refused, crashed); first crash:\n{}",
            first.as_deref().unwrap_or("")
        );
    }
}

/// Every run at every margin completed.
fn all_completed(results: &[(u64, [usize; 3], Option<String>)], runs: usize) {
    for (m, counts, _) in results {
        assert_eq!(
            counts[0], runs,
            "+{m} MiB: {counts:?}: not every run completed"
        );
    }
}

/// A child's runtime from `b`, or its refusal as one line and exit 2;
/// `None` for a probe, which prints the address space mapped so far.
fn start(b: outcore::Builder) -> Option<Runtime> {
    let rt = match b.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("outcore: {e}");
            std::process::exit(2);
        }
    };
    if std::env::var("OUTCORE_TEST_PROBE").is_ok() {
        println!("VMSIZE={}", vm_size());
        return None;
    }
    Some(rt)
}

/// `n` executors of `elems` values each, and their checksums.
fn blocks(rt: &Runtime, n: usize, elems: usize) -> (Vec<Handle<Block>>, Vec<u64>) {
    let hs = (0..n)
        .map(|i| {
            rt.insert(Block {
                data: PodVec::from(fill(i as u64, elems)),
                count: 0,
            })
            .expect("insert")
        })
        .collect();
    let sums = (0..n).map(|i| sum(&fill(i as u64, elems))).collect();
    (hs, sums)
}

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Joins from 3 threads under `RLIMIT_AS` at 8 to 32 MiB over the start:
/// no run crashes, and from +16 MiB on every run completes.
#[test]
fn joins_never_crash_near_the_limit() {
    const T: &str = "joins_never_crash_near_the_limit";
    if is_child(T) {
        return joins_child();
    }
    let runs = env_or("HARD_LIMIT_RUNS", 2);
    let results = sweep(T, &[8, 12, 16, 20, 24, 28, 32], runs);
    report(&results);
}

/// Four executors of 10 MiB joined in pairs (one read, one written) by
/// two workers, with the prefetcher on (`PREFETCH=0`: off). Prints `OK=1`
/// when every join saw the right data.
fn pairs_child() {
    const N: usize = 4;
    const ELEMS: usize = (10 << 20) / 4;
    let prefetch = std::env::var("PREFETCH").map_or(true, |v| v != "0");
    let Some(rt) = start(Runtime::builder().workers(2).prefetch(prefetch)) else {
        return;
    };
    let (hs, sums) = blocks(&rt, N, ELEMS);
    rt.hint_cycle(hs.iter().map(|h| h.id()));
    for _ in 0..4 {
        let mut b = rt.batch();
        for i in 0..N {
            let (ka, kw) = (hs[i].key(), hs[(i + 1) % N].key());
            b.task(&[&hs[i]], &[&hs[(i + 1) % N]], move |j| {
                j.write(kw).count += 1;
                sum(&j.read(ka).data)
            });
        }
        assert_eq!(b.run().expect("batch"), sums, "a join saw the wrong data");
    }
    let s = rt.stats();
    println!("HARD_TRAPS={}", s.hard_traps);
    println!("PREFETCHES={}", s.prefetches);
    println!("OK=1");
}

/// The prefetcher's load and a worker's load under `RLIMIT_AS`, 20 to 28
/// MiB over the start, each needing the address space the other holds:
/// they used to take each other's executor, still loading, for passing
/// contention and wait out the trap's patience (5 s), then abort (at +20
/// every time) or stall. Each run must complete from +24 on. At +20 the
/// two blocks a join holds take the whole margin, and a run may refuse
/// with one line (2 of 30 runs did: an allocation of 10 MiB failed with
/// 10.5 or 21 MB in use), but most complete.
#[test]
fn a_prefetch_and_a_demand_load_never_wait_on_each_other() {
    const T: &str = "a_prefetch_and_a_demand_load_never_wait_on_each_other";
    if is_child(T) {
        return pairs_child();
    }
    let runs = env_or("HARD_LIMIT_RUNS", 2);
    let results = sweep(T, &[20, 24, 28], runs);
    report(&results);
    let (edge, rest) = results.split_at(1);
    for (m, counts, _) in edge {
        assert!(
            counts[0] * 2 >= runs,
            "+{m} MiB: {counts:?}: fewer than half the runs completed"
        );
    }
    all_completed(rest, runs);
}

/// Maps address space nobody uses (`PROT_NONE`, straight from the kernel)
/// until only `bytes` of it are left, to within a page. The mappings live
/// until exit.
fn leave_free(bytes: usize) {
    let map = |len: usize| {
        // SAFETY: an anonymous mapping with no address hint, never touched.
        unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        }
    };
    let keep = map(bytes);
    assert_ne!(keep, libc::MAP_FAILED);
    let mut size: usize = 1 << 34;
    while size >= 4096 {
        if map(size) == libc::MAP_FAILED {
            size /= 2;
        }
    }
    // SAFETY: `keep` is the mapping made above, never used.
    unsafe { libc::munmap(keep, bytes) };
}

/// Threads whose first allocation comes when the address space is all but
/// gone: jemalloc used to make each one an arena then, and died of a
/// SIGSEGV when the arena's metadata could not be mapped.
#[test]
fn a_threads_first_allocation_at_the_limit() {
    const T: &str = "a_threads_first_allocation_at_the_limit";
    if is_child(T) {
        let _rt = Runtime::builder().workers(2).build().expect("runtime");
        let go = std::sync::Barrier::new(7);
        let made: usize = std::thread::scope(|s| {
            let threads: Vec<_> = (0..6)
                .map(|i| {
                    let go = &go;
                    s.spawn(move || {
                        // Started (its signal stack mapped), then the
                        // first allocation once the space is gone.
                        go.wait();
                        go.wait();
                        let v = std::hint::black_box(vec![i as u64; 16]);
                        let b = std::hint::black_box(Box::new(v.len()));
                        *b
                    })
                })
                .collect();
            go.wait();
            leave_free(4096);
            go.wait();
            threads.into_iter().map(|t| t.join().expect("thread")).sum()
        });
        println!("MADE={made}");
        return;
    }
    let out = run_child(T, Some(512 << 20), Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.num("MADE"), 96);
}

/// Six executors of 8 MiB joined in disjoint pairs (`2i` read, `2i + 1`
/// written) by two workers, prefetch off. Prints `OK=1` when every join
/// saw the right data.
fn disjoint_pairs_child() {
    const N: usize = 6;
    const ELEMS: usize = (8 << 20) / 4;
    let Some(rt) = start(Runtime::builder().workers(2).prefetch(false)) else {
        return;
    };
    let (hs, sums) = blocks(&rt, N, ELEMS);
    for round in 0..6 {
        let mut b = rt.batch();
        let mut want = Vec::new();
        for p in 0..N / 2 {
            // Each round starts the pairs in another order, so that the
            // two workers' first executors are not always the ones left
            // resident.
            let p = (p + round) % (N / 2);
            let (ka, kw) = (hs[2 * p].key(), hs[2 * p + 1].key());
            b.task(&[&hs[2 * p]], &[&hs[2 * p + 1]], move |j| {
                j.write(kw).count += 1;
                sum(&j.read(ka).data)
            });
            want.push(sums[2 * p]);
        }
        assert_eq!(b.run().expect("batch"), want, "a join saw the wrong data");
    }
    let s = rt.stats();
    println!("JOIN_RETRIES={}", s.join_retries);
    println!("HARD_TRAPS={}", s.hard_traps);
    println!("OK=1");
}

/// Two workers, each holding one executor of its join pinned while it
/// loads the other, under `RLIMIT_AS` with room for about three of the
/// six: each used to wait in the trap for the room the other held, and
/// the process aborted after the trap's patience. Each run must complete.
#[test]
fn two_joins_never_wait_on_each_other() {
    const T: &str = "two_joins_never_wait_on_each_other";
    if is_child(T) {
        return disjoint_pairs_child();
    }
    let runs = env_or("HARD_LIMIT_RUNS", 2);
    let results = sweep(T, &[32, 36, 40], runs);
    report(&results);
    all_completed(&results, runs);
}

/// Builds a runtime (two workers, prefetch on) and prints `OK=1`; a probe
/// prints the address space mapped before the build.
fn build_child() {
    if std::env::var("OUTCORE_TEST_PROBE").is_ok() {
        println!("VMSIZE={}", vm_size());
        return;
    }
    match Runtime::builder().workers(2).build() {
        Ok(_rt) => println!("OK=1"),
        Err(e) => {
            eprintln!("outcore: {e}");
            std::process::exit(2);
        }
    }
}

/// A runtime built under `RLIMIT_AS` too small for its threads is refused
/// with one line, never a crash; from +8 MiB over the start (three stacks
/// of 2 MiB) it is built. Its reserve (16 MiB) used to be mapped before
/// the threads started, so builds at +16 to +22 MiB were refused where
/// +8 passed; and a thread that started but could not map its signal
/// stack aborted the process.
#[test]
fn a_runtime_built_under_too_small_a_limit_is_refused() {
    const T: &str = "a_runtime_built_under_too_small_a_limit_is_refused";
    if is_child(T) {
        return build_child();
    }
    let runs = env_or("HARD_LIMIT_RUNS", 2);
    let margins = [0, 2, 4, 6, 8, 12, 16, 18, 20, 22, 24, 32];
    let results = sweep(T, &margins, runs);
    report(&results);
    for (m, counts, _) in results.iter().filter(|(m, _, _)| *m >= 8) {
        assert_eq!(counts[0], runs, "+{m} MiB: {counts:?}: not built");
    }
}
