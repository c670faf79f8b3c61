//! The runtime's public API, without a cap (so these tests can share one
//! process).

mod common;

use std::os::unix::fs::PermissionsExt;

use common::Part;
use outcore::{Error, PodVec, Runtime, State};

fn rt() -> Runtime {
    Runtime::builder().workers(2).build().expect("runtime")
}

#[test]
fn results_come_back_in_submission_order() {
    let rt = rt();
    let hs: Vec<_> = (0..8u64)
        .map(|i| rt.insert(vec![i; 1000]).unwrap())
        .collect();
    let mut b = rt.batch();
    for round in 0..5u64 {
        for h in &hs {
            b.read(h, move |v: &Vec<u64>| v[0] * 100 + round);
        }
    }
    let got = b.run().unwrap();
    let want: Vec<u64> = (0..5u64)
        .flat_map(|r| (0..8u64).map(move |i| i * 100 + r))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn tasks_on_one_executor_run_in_submission_order() {
    let rt = rt();
    let h = rt.insert(Vec::<u32>::new()).unwrap();
    let other = rt.insert(Vec::<u32>::new()).unwrap();
    let mut b = rt.batch();
    for i in 0..200u32 {
        b.write(&h, move |v: &mut Vec<u32>| v.push(i));
        b.write(&other, move |v: &mut Vec<u32>| v.push(i));
    }
    b.run().unwrap();
    let v = h.into_inner().unwrap();
    assert_eq!(v, (0..200).collect::<Vec<_>>());
}

#[test]
fn a_panicking_write_task_poisons_only_its_executor() {
    let rt = rt();
    let bad = rt.insert(vec![1u8; 10]).unwrap();
    let good = rt.insert(vec![2u8; 10]).unwrap();
    let mut b = rt.batch();
    b.write(&bad, |v: &mut Vec<u8>| {
        v[0] = 99;
        if v.len() == 10 {
            panic!("boom in task");
        }
        0usize
    });
    b.read(&good, |v: &Vec<u8>| v.len());
    b.read(&bad, |v: &Vec<u8>| v.len());
    let r = b.run_each();
    match &r[0] {
        Err(Error::TaskPanicked { executor, message }) => {
            assert!(executor.starts_with("executor #"));
            assert!(message.contains("boom in task"));
        }
        other => panic!("expected TaskPanicked, got {other:?}"),
    }
    assert_eq!(r[1].as_ref().ok(), Some(&10));
    assert!(matches!(r[2], Err(Error::Poisoned { .. })), "{:?}", r[2]);
    assert_eq!(bad.state(), State::Poisoned);
    // The runtime carries on.
    assert_eq!(rt.read(&good, |v: &Vec<u8>| v[0]).unwrap(), 2);
}

#[test]
fn a_panicking_read_task_leaves_the_executor_usable() {
    let rt = rt();
    let h = rt.insert(vec![5u8; 3]).unwrap();
    let r = rt.read(&h, |v: &Vec<u8>| -> u8 { panic!("read failed {}", v[0]) });
    assert!(matches!(r, Err(Error::TaskPanicked { .. })));
    assert_eq!(rt.read(&h, |v: &Vec<u8>| v[2]).unwrap(), 5);
}

#[test]
fn evicted_executors_load_back_and_clean_ones_are_not_rewritten() {
    let rt = rt();
    let h = rt.insert(Part::new(7, 100_000)).unwrap();
    let sum = Part::new(7, 100_000).checksum();
    assert_eq!(h.state(), State::Resident);
    assert_eq!(rt.evict_all().unwrap(), 1);
    assert_eq!(h.state(), State::Evicted);
    let written = rt.stats().bytes_written;
    assert!(written > 400_000);
    assert_eq!(rt.read(&h, |p: &Part| p.checksum()).unwrap(), sum);
    assert_eq!(h.state(), State::Resident);
    // Read-only since the write: evicting again drops it clean.
    rt.evict_all().unwrap();
    let s = rt.stats();
    assert_eq!(
        s.bytes_written, written,
        "a clean executor was written again"
    );
    assert_eq!(s.clean_evictions, 1);
    // A write task makes it dirty: the next eviction writes.
    rt.write(&h, |p: &mut Part| p.update()).unwrap();
    rt.evict_all().unwrap();
    assert!(rt.stats().bytes_written > written);
    let mut want = Part::new(7, 100_000);
    want.update();
    assert_eq!(
        rt.read(&h, |p: &Part| p.checksum()).unwrap(),
        want.checksum()
    );
}

#[test]
fn dropping_a_handle_frees_its_file_and_into_inner_returns_the_value() {
    let rt = rt();
    let a = rt.insert(PodVec::from(vec![1.5f32; 50_000])).unwrap();
    let b = rt.insert(PodVec::from(vec![2.5f32; 50_000])).unwrap();
    rt.evict_all().unwrap();
    let files = || std::fs::read_dir(rt.spill_dir()).unwrap().count();
    assert_eq!(files(), 2);
    drop(a);
    assert_eq!(files(), 1);
    let v = b.into_inner().unwrap();
    assert_eq!(v.len(), 50_000);
    assert!(v.iter().all(|&x| x == 2.5));
    assert_eq!(files(), 0);
}

#[test]
fn spill_dir_is_private_and_removed_with_the_runtime() {
    let parent = tempfile::tempdir().unwrap();
    let rt = Runtime::builder().spill_dir(parent.path()).build().unwrap();
    let dir = rt.spill_dir().to_path_buf();
    assert!(dir.starts_with(parent.path()));
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let h = rt.insert(vec![1u32; 100]).unwrap();
    rt.evict_all().unwrap();
    let f = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
    drop(h);
    drop(rt);
    assert!(!dir.exists());
}

#[test]
fn a_missing_spill_dir_is_a_clear_error() {
    let err = Runtime::builder()
        .spill_dir("/nonexistent/outcore/dir")
        .build()
        .expect_err("error");
    assert!(matches!(err, Error::SpillDir { .. }));
    assert!(
        err.to_string().contains("/nonexistent/outcore/dir"),
        "{err}"
    );
}

#[test]
fn a_damaged_spill_file_is_reported_never_used() {
    let rt = rt();
    let h = rt
        .insert_named(Some("shard-3"), Part::new(3, 10_000))
        .unwrap();
    rt.evict_all().unwrap();
    let f = std::fs::read_dir(rt.spill_dir())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&f).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&f, bytes).unwrap();
    let err = rt.read(&h, |p: &Part| p.checksum()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::SpillRead { .. }), "{msg}");
    assert!(
        msg.contains("shard-3") && msg.contains(&f.display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("checksum"), "{msg}");
    assert_eq!(h.state(), State::Damaged);
}

#[test]
fn a_handle_from_another_runtime_is_rejected() {
    let a = rt();
    let b = rt();
    let h = a.insert_named(Some("weights"), 1u64).unwrap();
    let r = b.read(&h, |x: &u64| *x);
    assert!(matches!(r, Err(Error::UnknownExecutor { .. })), "{r:?}");
    // The error names the executor, also once its runtime is gone.
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains("(weights)"), "{msg}");
    drop(a);
    let msg = b.read(&h, |x: &u64| *x).unwrap_err().to_string();
    assert!(msg.contains("(weights)"), "{msg}");
}

/// Once its runtime is dropped, a handle's state agrees with its other
/// calls: `Removed`, as `into_inner` and any other runtime say it is
/// unknown (it said `Resident`, and `Evicted` for an evicted one).
#[test]
fn a_handle_whose_runtime_is_gone_is_removed() {
    let a = rt();
    let other = rt();
    let resident = a.insert_named(Some("kept"), 7u64).unwrap();
    let evicted = a.insert(PodVec::from(vec![1u8; 4096])).unwrap();
    let taken = a.insert(3u64).unwrap();
    a.evict_all().unwrap();
    a.read(&resident, |x: &u64| *x).unwrap();
    assert_eq!(resident.state(), State::Resident);
    assert_eq!(evicted.state(), State::Evicted);
    drop(a);
    assert_eq!(resident.state(), State::Removed);
    assert_eq!(evicted.state(), State::Removed);
    assert!(format!("{resident:?}").contains("Removed"), "{resident:?}");
    let r = other.read(&resident, |x: &u64| *x);
    assert!(matches!(r, Err(Error::UnknownExecutor { .. })), "{r:?}");
    let r = taken.into_inner();
    assert!(matches!(r, Err(Error::UnknownExecutor { .. })), "{r:?}");
}

/// A batch whose remaining tasks wait for a busy executor does not keep
/// the other workers from another batch's free tasks: the second batch
/// runs while the first one's task is still running.
#[test]
fn a_blocked_batch_does_not_hold_up_another() {
    use std::sync::mpsc;
    let rt = Runtime::builder().workers(4).build().unwrap();
    let a = rt.insert(1u32).unwrap();
    let b = rt.insert(2u32).unwrap();
    let (started_tx, started) = mpsc::channel::<()>();
    let (go_tx, go) = mpsc::channel::<()>();
    let go = std::sync::Mutex::new(go);
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            let mut batch = rt.batch();
            batch.read(&a, move |_: &u32| {
                started_tx.send(()).unwrap();
                // Only the other batch's task can send this; the timeout
                // only keeps a regression from hanging the test.
                go.lock()
                    .unwrap()
                    .recv_timeout(std::time::Duration::from_secs(30))
                    .is_ok()
            });
            batch.read(&a, |_: &u32| true);
            batch.run().unwrap()
        });
        started.recv().unwrap();
        rt.read(&b, move |_: &u32| go_tx.send(()).unwrap()).unwrap();
        assert_eq!(
            first.join().unwrap(),
            vec![true, true],
            "the second batch waited"
        );
    });
}

#[test]
fn stats_serialize_to_json() {
    let rt = rt();
    let h = rt.insert(vec![0u8; 10]).unwrap();
    rt.read(&h, |v: &Vec<u8>| v.len()).unwrap();
    let json = rt.stats().to_json();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    for key in [
        "evictions",
        "trap_evictions",
        "clean_evictions",
        "loads",
        "prefetch_hits",
        "bytes_written",
        "bytes_read",
        "peak_bytes",
        "trap_seconds",
        "wait_seconds",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {json}");
    }
    assert_eq!(v["tasks"], 1);
}

/// Each kind of damage between eviction and load: a clear error naming the
/// executor and the file, never wrong data, never a panic; the other
/// executors carry on.
#[test]
fn damaged_spill_files_of_every_kind_are_reported() {
    for damage in ["truncated", "other executor", "deleted", "bit flip"] {
        let rt = rt();
        let a = rt
            .insert_named(Some("alpha"), Part::new(1, 20_000))
            .unwrap();
        let b = rt.insert_named(Some("beta"), Part::new(2, 20_000)).unwrap();
        rt.evict_all().unwrap();
        let file_of = |id: u64| rt.spill_dir().join(format!("exec-{id:08}.spill"));
        let fa = file_of(a.id());
        match damage {
            "truncated" => {
                let bytes = std::fs::read(&fa).unwrap();
                std::fs::write(&fa, &bytes[..bytes.len() / 3]).unwrap();
            }
            "other executor" => {
                std::fs::copy(file_of(b.id()), &fa).unwrap();
            }
            "deleted" => std::fs::remove_file(&fa).unwrap(),
            _ => {
                let mut bytes = std::fs::read(&fa).unwrap();
                let n = bytes.len();
                bytes[n - 100] ^= 0x01;
                std::fs::write(&fa, bytes).unwrap();
            }
        }
        let err = rt.read(&a, |p: &Part| p.checksum()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::SpillRead { .. }), "{damage}: {msg}");
        assert!(
            msg.contains("alpha") && msg.contains(&fa.display().to_string()),
            "{damage}: {msg}"
        );
        assert_eq!(msg.lines().count(), 1, "{damage}: {msg}");
        // The other executor is unaffected.
        assert_eq!(
            rt.read(&b, |p: &Part| p.checksum()).unwrap(),
            Part::new(2, 20_000).checksum(),
            "{damage}"
        );
    }
}

/// Threads in this process (`Threads:` in /proc/self/status).
fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_build_that_fails_part_way_stops_its_threads_and_removes_its_spill_dir() {
    const TEST: &str = "a_build_that_fails_part_way_stops_its_threads_and_removes_its_spill_dir";
    if common::is_child(TEST) {
        let spill = tempfile::tempdir().unwrap();
        let before = thread_count();
        // Thread stacks are 256 MiB here (RUST_MIN_STACK, set by the
        // parent): room for about three of them, not 1000, with plenty
        // left for ordinary allocations.
        let limit = common::vm_size() + (1 << 30);
        let lim = libc::rlimit {
            rlim_cur: limit,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: a plain setrlimit on this (child) process.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
        let err = Runtime::builder()
            .workers(1000)
            .spill_dir(spill.path())
            .build()
            .unwrap_err();
        let lim = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
        println!("ERR={}", err.to_string().replace(' ', "_"));
        // The started workers are gone (joined, not parked forever).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while thread_count() > before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        println!("THREADS_BEFORE={before}");
        println!("THREADS_AFTER={}", thread_count());
        let left = std::fs::read_dir(spill.path()).unwrap().count();
        println!("SPILL_ENTRIES={left}");
        return;
    }
    let out = common::run_child_with(
        TEST,
        None,
        std::time::Duration::from_secs(120),
        &[("RUST_MIN_STACK", "268435456")],
    );
    assert!(out.status.success(), "{}", out.stderr);
    let err = out.value("ERR").unwrap();
    assert!(err.contains("cannot_start_worker_thread"), "{err}");
    // Part-way: some workers had started.
    let started: usize = err
        .split("cannot_start_worker_thread_")
        .nth(1)
        .and_then(|t| t.split('_').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(started > 0, "no worker had started: {err}");
    let before: usize = out.value("THREADS_BEFORE").unwrap().parse().unwrap();
    let after: usize = out.value("THREADS_AFTER").unwrap().parse().unwrap();
    assert_eq!(after, before, "threads left behind by the failed build");
    assert_eq!(out.value("SPILL_ENTRIES").as_deref(), Some("0"));
}

#[test]
fn two_sweep_orders_in_one_runtime_keep_their_own_positions() {
    let rt = rt();
    let a: Vec<_> = (0..4)
        .map(|i| rt.insert(vec![i as u8; 16]).unwrap())
        .collect();
    let b: Vec<_> = (0..3)
        .map(|i| rt.insert(vec![i as u8; 16]).unwrap())
        .collect();
    let ca = rt.hint_cycle(a.iter().map(|h| h.id()));
    let cb = rt.hint_cycle(b.iter().rev().map(|h| h.id()));
    assert_ne!(ca, cb);
    for (i, h) in a.iter().enumerate() {
        assert_eq!(h.cycle_position(), Some((ca, i as u64)), "first cycle kept");
    }
    for (i, h) in b.iter().rev().enumerate() {
        assert_eq!(h.cycle_position(), Some((cb, i as u64)));
    }
    // Sweeping one cycle leaves the other alone.
    let mut batch = rt.batch();
    for h in &b {
        batch.read(h, |v: &Vec<u8>| v.len());
    }
    batch.run().unwrap();
    assert_eq!(a[3].cycle_position(), Some((ca, 3)));
    // Declaring an executor again moves it to the new cycle.
    let cc = rt.hint_cycle([a[0].id()]);
    assert_eq!(a[0].cycle_position(), Some((cc, 0)));
    assert_eq!(a[1].cycle_position(), Some((ca, 1)));
}

/// A small uncapped run reports a real peak: what a task leaves allocated
/// counts even below the allocator's flush threshold (4 MiB per thread
/// with no cap), where the peak used to stay at 0 B.
#[test]
fn a_small_run_reports_its_real_peak() {
    const TEST: &str = "a_small_run_reports_its_real_peak";
    if common::is_child(TEST) {
        let rt = Runtime::builder().workers(1).build().expect("runtime");
        let h = rt.insert(Vec::<u8>::new()).expect("insert");
        // 1 MiB built by a worker, inside the executor.
        rt.write(&h, |v: &mut Vec<u8>| v.resize(1 << 20, 7))
            .expect("write");
        println!("PEAK={}", rt.stats().peak_bytes);
        return;
    }
    let out = common::child_ok(TEST, None, std::time::Duration::from_secs(60), &[]);
    assert!(out.num("PEAK") >= 1 << 20, "{}", out.stdout);
}

/// `run_in_order` hands each result over, in submission order, while
/// later tasks still run: here the last task waits for the first result
/// to have been handed over (it would time out if results came only at
/// the end).
#[test]
fn results_are_handed_over_in_order_while_later_tasks_run() {
    use std::sync::{mpsc, Arc, Mutex};
    let rt = rt();
    let hs: Vec<_> = (0..6u64).map(|i| rt.insert(vec![i; 10]).unwrap()).collect();
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Arc::new(Mutex::new(rx));
    let mut b = rt.batch();
    for (i, h) in hs.iter().enumerate() {
        let rx = rx.clone();
        b.read(h, move |v: &Vec<u64>| {
            let streamed = i + 1 < 6
                || rx
                    .lock()
                    .unwrap()
                    .recv_timeout(std::time::Duration::from_secs(30))
                    .is_ok();
            (v[0], streamed)
        });
    }
    let mut seen = Vec::new();
    b.run_in_order(|i, r| {
        if i == 0 {
            tx.send(()).unwrap();
        }
        seen.push((i, r.unwrap()));
    });
    let want: Vec<_> = (0..6).map(|i| (i, (i as u64, true))).collect();
    assert_eq!(seen, want);
}

/// With `ahead(n)`, tasks start at most `n` past the first result not
/// handed over yet: the results held and the tasks running stay `n` at
/// most. Here the first eight tasks share one executor (they run one at
/// a time, each slow) and the next eight have one each: without the
/// window, the second worker runs all of those while the shared
/// executor's tasks go one by one, and their results wait (the test
/// checks that too, so it can fail).
#[test]
fn a_window_bounds_the_tasks_started_ahead_of_the_results() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let rt = rt();
    let shared = rt.insert(vec![0u64; 10]).unwrap();
    let own: Vec<_> = (1..9u64).map(|i| rt.insert(vec![i; 10]).unwrap()).collect();
    let run = |window: Option<usize>| {
        // Tasks started and results not yet handed over, and its maximum.
        let live = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut b = rt.batch();
        for i in 0..16u64 {
            let (live, most) = (live.clone(), most.clone());
            let f = move |v: &Vec<u64>| {
                let now = live.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(if i < 8 { 15 } else { 1 }));
                v[0] + i
            };
            match i {
                0..8 => b.read(&shared, f),
                _ => b.read(&own[i as usize - 8], f),
            };
        }
        if let Some(n) = window {
            b.ahead(n);
        }
        let mut got = Vec::new();
        b.run_in_order(|_, r| {
            live.fetch_sub(1, Ordering::SeqCst);
            got.push(r.unwrap());
        });
        let want: Vec<u64> = (0..16).map(|i| if i < 8 { i } else { 2 * i - 7 }).collect();
        assert_eq!(got, want);
        most.load(Ordering::SeqCst)
    };
    assert!(run(None) > 4, "without a window the later tasks run ahead");
    for n in [1, 2, 3] {
        let most = run(Some(n));
        assert!(
            most <= n,
            "window {n}: {most} tasks started ahead of their results"
        );
    }
}

/// Results that finish while the caller waits for an earlier one do not
/// wake it; the awaited one does, at once, and every result is handed over
/// in order. Here tasks 1 to n - 2 finish while the caller waits for task
/// 0, which finishes after them; the last task then waits until the caller
/// has been handed task 0's result (so it would wait for ever if only the
/// batch's last result woke the caller: its 30 s timeout fails the test).
#[test]
fn results_that_finish_ahead_of_the_awaited_one_are_all_handed_over() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc, Mutex};
    use std::time::Duration;
    let n = 12usize;
    let rt = rt();
    let hs: Vec<_> = (0..n as u64)
        .map(|i| rt.insert(vec![i; 10]).unwrap())
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Arc::new(Mutex::new(rx));
    let mut b = rt.batch();
    for (i, h) in hs.iter().enumerate() {
        let (done, rx) = (done.clone(), rx.clone());
        b.read(h, move |v: &Vec<u64>| {
            let mut handed_over = true;
            if i == 0 {
                while done.load(Ordering::SeqCst) < n - 2 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else if i + 1 < n {
                std::thread::sleep(Duration::from_millis(2));
                done.fetch_add(1, Ordering::SeqCst);
            } else {
                handed_over = rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(30))
                    .is_ok();
            }
            (v[0], handed_over)
        });
    }
    let mut seen = Vec::new();
    b.run_in_order(|i, r| {
        if i == 0 {
            tx.send(()).unwrap();
        }
        seen.push((i, r.unwrap()));
    });
    let want: Vec<_> = (0..n).map(|i| (i, (i as u64, true))).collect();
    assert_eq!(seen, want);
}

/// A panic in `run_in_order`'s callback reaches the caller; the batch's
/// other tasks still run and release their executors, so the runtime and
/// every executor stay usable.
#[test]
fn a_panicking_fold_leaves_the_runtime_usable() {
    let rt = rt();
    let hs: Vec<_> = (0..8u64).map(|i| rt.insert(vec![i; 10]).unwrap()).collect();
    let mut b = rt.batch();
    for h in &hs {
        b.write(h, |v: &mut Vec<u64>| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            v[0] += 100;
        });
    }
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        b.run_in_order(|i, _| {
            if i == 0 {
                panic!("fold failed");
            }
        })
    }));
    assert!(caught.is_err(), "the callback's panic reaches the caller");
    // Every task ran (their writes land) and released its executor: a
    // new batch over all of them completes (a watchdog fails the test
    // rather than hang it if one stayed pinned).
    let rt = std::sync::Arc::new(rt);
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let rt = rt.clone();
        std::thread::spawn(move || {
            let mut b = rt.batch();
            for h in &hs {
                b.read(h, |v: &Vec<u64>| v[0]);
            }
            let _ = tx.send(b.run().unwrap());
        })
    };
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("a batch over the executors completes");
    worker.join().unwrap();
    assert_eq!(got, (100..108).collect::<Vec<u64>>());
}

/// The prefetcher loads a batch's executors only a short way ahead of the
/// workers (two per worker, in dispatch order), not every executor the
/// batch names as soon as there is room: under a cap, loading far ahead
/// evicts executors that are needed before those.
#[test]
fn the_prefetcher_loads_a_batch_only_a_short_way_ahead() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const N: usize = 24;
    let rt = rt();
    let hs: Vec<_> = (0..N)
        .map(|i| rt.insert(PodVec::from(vec![i as u8; 1 << 20])).unwrap())
        .collect();
    rt.evict_all().unwrap();
    assert_eq!(rt.resident_count(), 0);
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    let finished = AtomicUsize::new(0);
    let mut ahead_max = 0;
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut max = 0;
            while finished.load(Ordering::Acquire) == 0 {
                // Resident and not yet used: loaded ahead (or in use).
                let ahead = rt
                    .resident_count()
                    .saturating_sub(done.load(Ordering::Acquire));
                max = max.max(ahead);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            max
        });
        let mut b = rt.batch();
        for h in &hs {
            let done = done.clone();
            b.read(h, move |v: &PodVec<u8>| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                done.fetch_add(1, Ordering::Release);
                v.len()
            });
        }
        b.run().unwrap();
        finished.store(1, Ordering::Release);
        ahead_max = watcher.join().unwrap();
    });
    // Two workers, four executors ahead of the queue (those being worked
    // on among them); a little slack for the watcher seeing a task's
    // executor before the task counts. Loading the whole batch ahead
    // showed 22 here.
    assert!(ahead_max <= 8, "{ahead_max} executors loaded ahead");
}

/// Two executors are loaded ahead at once: while the only worker is busy
/// on the first executor, the next two in the batch are rebuilt by the
/// prefetch threads at the same time (each rebuild waits, with a
/// deadline, for the other to be under way).
#[test]
fn two_executors_are_loaded_ahead_at_once() {
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::{Duration, Instant};
    #[derive(Default)]
    struct Rebuilds {
        running: usize,
        most_at_once: usize,
        done: usize,
    }
    // Under an address-space limit the runtime starts one prefetcher.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0;
    if read && lim.rlim_cur != libc::RLIM_INFINITY {
        return;
    }
    let rt = Runtime::builder().workers(1).build().expect("runtime");
    let state = Arc::new((Mutex::new(Rebuilds::default()), Condvar::new()));
    let first = rt
        .insert_lazy(Some("first"), 64, || Ok(vec![0u64; 8]))
        .unwrap();
    let ahead: Vec<_> = (1..=2u64)
        .map(|i| {
            let state = state.clone();
            rt.insert_lazy(Some(&format!("ahead {i}")), 64, move || {
                let (m, cv) = &*state;
                let mut g = m.lock().unwrap();
                g.running += 1;
                g.most_at_once = g.most_at_once.max(g.running);
                cv.notify_all();
                let deadline = Instant::now() + Duration::from_secs(5);
                while g.most_at_once < 2 && Instant::now() < deadline {
                    g = cv.wait_timeout(g, Duration::from_millis(20)).unwrap().0;
                }
                g.running -= 1;
                g.done += 1;
                cv.notify_all();
                Ok(vec![i; 8])
            })
            .unwrap()
        })
        .collect();
    rt.hint_cycle([first.id(), ahead[0].id(), ahead[1].id()]);
    let mut b = rt.batch();
    let seen = state.clone();
    b.read(&first, move |v: &Vec<u64>| {
        // Keep the only worker here until both rebuilds are done (or
        // 30 s), so that it loads neither itself.
        let (m, cv) = &*seen;
        let mut g = m.lock().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while g.done < 2 && Instant::now() < deadline {
            g = cv.wait_timeout(g, Duration::from_millis(20)).unwrap().0;
        }
        v[0]
    });
    for h in &ahead {
        b.read(h, |v: &Vec<u64>| v[0]);
    }
    assert_eq!(b.run().unwrap(), vec![0, 1, 2]);
    let most = state.0.lock().unwrap().most_at_once;
    assert_eq!(
        most, 2,
        "the two executors ahead were loaded one after the other"
    );
}

#[test]
fn more_workers_than_the_most_is_an_error_not_an_abort() {
    let r = Runtime::builder()
        .workers(outcore::MAX_WORKERS + 1)
        .prefetch(false)
        .build();
    let msg = r.map(|_| ()).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("{} at most", outcore::MAX_WORKERS)),
        "{msg}"
    );
}

#[test]
fn an_interrupted_runtime_runs_no_task_it_had_not_started() {
    // One worker: the tasks run one after another, so none but the first
    // has started when it interrupts (the waiting thread runs none).
    let rt = Runtime::builder().workers(1).build().unwrap();
    let hs: Vec<_> = (0..64u64).map(|i| rt.insert(i).unwrap()).collect();
    let stop = rt.interrupter();
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut b = rt.batch();
    for (i, h) in hs.iter().enumerate() {
        let (stop, ran) = (stop.clone(), ran.clone());
        b.read(h, move |v: &u64| {
            ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i == 0 {
                stop.interrupt();
            }
            *v
        });
    }
    let mut out = Vec::new();
    b.run_in_order(|_, r| out.push(r));
    assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert!(matches!(out[0], Ok(0)));
    assert!(out[1..]
        .iter()
        .all(|r| matches!(r, Err(outcore::Error::Interrupted))));
    assert!(stop.is_interrupted());
    // Later batches stop too; the executors are still there.
    assert!(matches!(
        rt.read(&hs[0], |v: &u64| *v),
        Err(outcore::Error::Interrupted)
    ));
    assert_eq!(rt.stats().evictions, 0);
}
