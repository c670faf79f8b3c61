//! Faults: a full spill filesystem, injected write failures, a read-only
//! spill directory, damaged spill files, and stress under a hard limit.
//! Scenarios with a cap or a limit run in child processes.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{is_child, run_child, run_child_with, run_job, Part};
use outcore::{Error, MemoryCap, Runtime};

const TIMEOUT: Duration = Duration::from_secs(300);

#[path = "common/tmpfs.rs"]
mod tmpfs;
use tmpfs::Tmpfs;

fn job(spill: Option<&Path>, cap: MemoryCap) {
    // Failed writes keep executors in memory and the job goes on over the
    // cap (`a_spill_that_keeps_failing_stops_the_runtime_past_its_cap`
    // has the default).
    let mut b = Runtime::builder().mem_cap(cap).stop_when_cap_lost(false);
    if let Some(d) = spill {
        b = b.spill_dir(d);
    }
    let rt = b.build().expect("runtime");
    let digest = run_job(&rt, 12, 4 << 20, "rwr");
    let s = rt.stats();
    println!("DIGEST={digest:x}");
    println!("FAILED={}", s.failed_writes);
    println!("EVICTIONS={}", s.evictions);
    println!(
        "LASTERR={}",
        rt.last_spill_error().unwrap_or_default().replace(' ', "_")
    );
}

fn reference() -> String {
    let out = run_child("fault_reference", None, TIMEOUT);
    assert!(out.status.success(), "{}", out.stderr);
    out.value("DIGEST").expect("digest")
}

#[test]
fn fault_reference() {
    if is_child("fault_reference") {
        job(None, MemoryCap::None);
    }
}

#[test]
fn disk_full_keeps_executors_and_the_job_completes() {
    if is_child("disk_full_keeps_executors_and_the_job_completes") {
        let dir = std::env::var("SPILL").expect("SPILL");
        return job(Some(Path::new(&dir)), MemoryCap::Bytes(20 << 20));
    }
    // 6 MiB of spill space for 48 MiB of executors under a 20 MiB cap.
    let fs = Tmpfs::mount("size=6m");
    // Through the child's environment only: `set_var` here would leak into
    // the children of the tests running alongside.
    let spill = fs.path().to_string_lossy().into_owned();
    let out = run_child_with(
        "disk_full_keeps_executors_and_the_job_completes",
        None,
        TIMEOUT,
        &[("SPILL", spill.as_str())],
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        out.value("DIGEST"),
        Some(reference()),
        "results differ after failed writes"
    );
    let failed: u64 = out.value("FAILED").unwrap().parse().unwrap();
    assert!(failed > 0, "no write failed on a 6 MiB filesystem");
    let err = out.value("LASTERR").unwrap();
    assert!(err.contains("No_space_left"), "{err}");
}

/// A full spill filesystem used to let the runtime go on over its cap
/// (48 MiB of executors under a 20 MiB cap stayed in memory). By default
/// it stops once past the cap by an eighth: tasks fail with `CapLost`.
#[test]
fn a_spill_that_keeps_failing_stops_the_runtime_past_its_cap() {
    const NAME: &str = "a_spill_that_keeps_failing_stops_the_runtime_past_its_cap";
    if is_child(NAME) {
        let dir = std::env::var("SPILL").expect("SPILL");
        let rt = Runtime::builder()
            .mem_cap(MemoryCap::Bytes(20 << 20))
            .spill_dir(dir)
            .build()
            .expect("runtime");
        let mut hs = Vec::new();
        let mut stopped = None;
        for i in 0..12u64 {
            match rt.insert(Part::new(i, 1 << 20)) {
                Ok(h) => hs.push(h),
                Err(e) => {
                    stopped = Some(e);
                    break;
                }
            }
        }
        'sweeps: for _ in 0..3 {
            if stopped.is_some() {
                break;
            }
            for h in &hs {
                if let Err(e) = rt.write(h, |p: &mut Part| p.update()) {
                    stopped = Some(e);
                    break 'sweeps;
                }
            }
        }
        let e = stopped.expect("the runtime went on over its cap");
        assert!(matches!(e, Error::CapLost { .. }), "{e}");
        println!("ERROR={}", e.to_string().replace(' ', "_"));
        println!("PEAK={}", rt.stats().peak_bytes);
        // Stopped for good: later tasks get the same error.
        let again = rt
            .read(&hs[0], |p: &Part| p.checksum())
            .expect_err("stopped");
        assert!(matches!(again, Error::CapLost { .. }), "{again}");
        return;
    }
    let fs = Tmpfs::mount("size=6m");
    let spill = fs.path().to_string_lossy().into_owned();
    let out = run_child_with(NAME, None, TIMEOUT, &[("SPILL", spill.as_str())]);
    assert!(out.status.success(), "{}", out.stderr);
    let e = out.value("ERROR").expect("error");
    assert!(
        e.starts_with("cannot_keep_the_cap_of_20.0_MiB") && e.contains("No_space_left"),
        "{e}"
    );
    let peak: u64 = out.value("PEAK").unwrap().parse().unwrap();
    assert!(peak < 32 << 20, "peak {peak} under a 20 MiB cap");
}

#[test]
fn injected_write_faults_lose_nothing() {
    if is_child("injected_write_faults_lose_nothing") {
        return job(None, MemoryCap::Bytes(20 << 20));
    }
    let out = run_child_with(
        "injected_write_faults_lose_nothing",
        None,
        TIMEOUT,
        &[("OUTCORE_FAULT_WRITE_EVERY", "3")],
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.value("DIGEST"), Some(reference()));
    assert!(out.value("FAILED").unwrap().parse::<u64>().unwrap() > 0);
    assert!(out.value("EVICTIONS").unwrap().parse::<u64>().unwrap() > 0);
}

/// `evict_all` on a full spill directory reports the failed write every
/// time it is called: it used to return `Ok(0)` once failed writes had
/// started to hold further ones back, with dirty executors still resident.
#[test]
fn evict_all_reports_a_full_disk_every_time() {
    let fs = Tmpfs::mount("size=4m");
    let rt = Runtime::builder().spill_dir(fs.path()).build().unwrap();
    let hs: Vec<_> = (0..4u64)
        .map(|i| rt.insert(vec![i; 1 << 20]).unwrap())
        .collect();
    for call in 0..5 {
        let r = rt.evict_all();
        assert!(
            matches!(r, Err(outcore::Error::SpillWrite { .. })),
            "call {call}: {r:?} with {} of 4 resident",
            rt.resident_count()
        );
    }
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(rt.read(h, |v: &Vec<u64>| v[7]).unwrap(), i as u64);
    }
}

#[test]
fn a_read_only_spill_directory_is_a_clear_error_at_build_time() {
    let fs = Tmpfs::mount("size=1m,ro");
    let err = Runtime::builder()
        .spill_dir(fs.path())
        .build()
        .expect_err("error");
    assert!(matches!(err, Error::SpillDir { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&fs.path().display().to_string()) && msg.contains("Read-only"),
        "{msg}"
    );
    // A file where a directory is expected.
    let f = tempfile::NamedTempFile::new().unwrap();
    let err = Runtime::builder()
        .spill_dir(f.path())
        .build()
        .expect_err("error");
    assert!(err.to_string().contains("not a directory"), "{err}");
}

/// Many threads allocating under a hard RLIMIT_AS (no soft cap) while
/// tasks sweep the executors: no deadlock (watchdog), no lost executor,
/// and the accounting back near its baseline at the end.
#[test]
fn stress_under_a_hard_limit() {
    const N: usize = 16;
    const BYTES: usize = 8 << 20;
    if is_child("stress_under_a_hard_limit") {
        let rt = Runtime::builder().build().expect("runtime");
        let baseline = outcore::current_usage();
        let hs: Vec<_> = (0..N)
            .map(|i| rt.insert(Part::new(i as u64, BYTES / 4)).expect("insert"))
            .collect();
        rt.hint_cycle(hs.iter().map(|h| h.id()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut s: u64 = 0x2545_f491_4f6c_dd1d ^ t;
                    let mut held: Vec<Vec<u8>> = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        held.push(vec![(s >> 56) as u8; 1 + (s % (8 << 20)) as usize]);
                        if held.len() > 3 {
                            let v = held.remove(0);
                            assert!(v.iter().all(|&b| b == v[0]));
                        }
                    }
                    outcore::flush_thread();
                })
            })
            .collect();
        let mut updates = [0u32; N];
        // At least four rounds, then on until the limit has bitten: on a
        // loaded machine the threads may not have reached it yet.
        let mut round = 0;
        while round < 4 || (rt.stats().hard_traps == 0 && round < 400) {
            let mut b = rt.batch();
            for (i, h) in hs.iter().enumerate() {
                if (i + round) % 3 == 0 {
                    updates[i] += 1;
                    b.write(h, |p: &mut Part| p.update());
                } else {
                    b.read(h, |p: &Part| {
                        std::hint::black_box(p.checksum());
                    });
                }
            }
            b.run().expect("batch");
            round += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in threads {
            t.join().expect("thread");
        }
        let mut b = rt.batch();
        for h in &hs {
            b.read(h, |p: &Part| p.checksum());
        }
        for (i, c) in b.run().expect("final").into_iter().enumerate() {
            let mut want = Part::new(i as u64, BYTES / 4);
            for _ in 0..updates[i] {
                want.update();
            }
            assert_eq!(c, want.checksum(), "executor {i} lost or damaged");
        }
        let s = rt.stats();
        drop(hs);
        outcore::flush_thread();
        let end = outcore::current_usage();
        println!("HARD={}", s.hard_traps);
        println!("DRIFT={}", end.abs_diff(baseline));
        println!("THRESHOLD={}", outcore::flush_threshold());
        return;
    }
    // 128 MiB of executors and the threads' blocks, beside a start-up of
    // about 55 MiB.
    let out = run_child("stress_under_a_hard_limit", Some(285 << 20), TIMEOUT);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.value("HARD").unwrap().parse::<u64>().unwrap() > 0,
        "the hard limit never bit: {}",
        out.stdout
    );
    let drift: usize = out.value("DRIFT").unwrap().parse().unwrap();
    let threshold: usize = out.value("THRESHOLD").unwrap().parse().unwrap();
    // Worker, prefetcher and main threads may each hold one unflushed delta.
    assert!(
        drift <= 6 * threshold,
        "accounting drifted by {drift} bytes"
    );
}

/// Builds a preload library whose `fdatasync` and `fsync` fail with EIO:
/// the kernel reporting a write-back error (thin-provisioned or network
/// storage, a failing disk) after `write()` had succeeded.
fn failing_sync_library(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("failsync.c");
    std::fs::write(
        &src,
        "#include <errno.h>\n\
         int fdatasync(int fd) { (void)fd; errno = EIO; return -1; }\n\
         int fsync(int fd) { (void)fd; errno = EIO; return -1; }\n",
    )
    .unwrap();
    let so = dir.join("libfailsync.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "building the preload library failed");
    so
}

/// Defect 10: a spill write counts only once the kernel has confirmed the
/// data. When write-back fails, the executors stay in memory (the write
/// counts as failed) and the job completes with the right results, instead
/// of freeing memory whose only copy was never stored.
#[test]
fn write_back_errors_keep_executors() {
    if is_child("write_back_errors_keep_executors") {
        return job(None, MemoryCap::Bytes(20 << 20));
    }
    let dir = tempfile::tempdir().unwrap();
    let so = failing_sync_library(dir.path());
    let so = so.to_string_lossy().into_owned();
    let out = run_child_with(
        "write_back_errors_keep_executors",
        None,
        TIMEOUT,
        &[("LD_PRELOAD", so.as_str())],
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        out.value("DIGEST"),
        Some(reference()),
        "results differ after write-back errors"
    );
    let failed: u64 = out.value("FAILED").unwrap().parse().unwrap();
    assert!(failed > 0, "write-back errors went unnoticed");
    let err = out.value("LASTERR").unwrap();
    assert!(err.contains("sync"), "{err}");
}
