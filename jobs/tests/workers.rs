//! The worker count is in the plan: under a cap, a run starts only the
//! workers whose tasks and threads the cap holds, says so in one line, and
//! its resident set stays within the cap (issue 52: 256 workers under a
//! 64 MiB cap peaked at 250-380 MiB resident, exit 0, no warning).

mod bin_common;

use bin_common::outcore_rss;

const CAP: u64 = 64 << 20;

/// The bound the soak holds every run to: 1.05 x cap + 32 MiB (code,
/// stacks, the allocator's own pages).
fn within(rss: u64) -> bool {
    rss <= CAP + CAP / 20 + (32 << 20)
}

fn check(args: &[&str]) {
    let (code, err, rss) = outcore_rss(args);
    assert_eq!(code, Some(0), "{err}");
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("256 workers asked for"))
        .collect();
    assert_eq!(warned.len(), 1, "one line says fewer workers run:\n{err}");
    assert!(
        within(rss),
        "peak resident set {} MiB under a {} MiB cap:\n{err}",
        rss >> 20,
        CAP >> 20
    );
}

#[test]
fn kmeans_with_256_workers_keeps_the_cap_and_says_how_many_run() {
    check(&[
        "kmeans",
        "--synthetic",
        "256MiB",
        "--dims",
        "64",
        "--k",
        "16",
        "--epochs",
        "1",
        "--mem-cap",
        "64MiB",
        "--workers",
        "256",
    ]);
}

#[test]
fn predict_with_256_workers_keeps_the_cap_and_says_how_many_run() {
    let dir = tempfile::tempdir().unwrap();
    let (data, centres, labels) = (
        dir.path().join("d.npy"),
        dir.path().join("c.npy"),
        dir.path().join("l.npy"),
    );
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (code, err, _) = outcore_rss(&[
        "gen",
        "--synthetic",
        "256MiB",
        "--dims",
        "64",
        "--output",
        &s(&data),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err, _) = outcore_rss(&[
        "kmeans",
        "--input",
        &s(&data),
        "--k",
        "16",
        "--epochs",
        "1",
        "--mem-cap",
        "256MiB",
        "--output",
        &s(&centres),
    ]);
    assert_eq!(code, Some(0), "{err}");
    check(&[
        "predict",
        "--input",
        &s(&data),
        "--centroids",
        &s(&centres),
        "--labels",
        &s(&labels),
        "--mem-cap",
        "64MiB",
        "--workers",
        "256",
    ]);
}

/// With room for every worker asked for, nothing is said.
#[test]
fn with_room_for_every_worker_nothing_is_said() {
    let (code, err, _) = outcore_rss(&[
        "kmeans",
        "--synthetic",
        "16MiB",
        "--dims",
        "16",
        "--k",
        "4",
        "--epochs",
        "1",
        "--mem-cap",
        "256MiB",
        "--workers",
        "2",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("asked for"), "{err}");
}

/// Runs `outcore kmeans` (synthetic, spilled) with the open-file limit at
/// `soft`/`hard` and `TMPDIR` in `tmp`: its exit code and stderr.
fn with_nofile(soft: u64, hard: u64, tmp: &std::path::Path) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_outcore"));
    c.args(["kmeans", "--synthetic", "16MiB", "--dims", "32", "--k", "8"])
        .args(["--epochs", "1", "--mem-cap", "4MiB", "--workers", "2"])
        .env("TMPDIR", tmp);
    // SAFETY: setrlimit is async-signal-safe and limits this child only.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_low_open_file_limit_is_refused_at_the_start_in_one_line() {
    // `ulimit -n 5-10`: runs ended at 9x the cap with exit 0, or failed
    // after the whole run, some leaving their spill directory.
    for n in [6, 8, 10, 12] {
        let tmp = tempfile::tempdir().unwrap();
        let (code, err) = with_nofile(n, n, tmp.path());
        assert_eq!(code, Some(2), "ulimit -n {n}: {err}");
        assert_eq!(err.lines().count(), 1, "ulimit -n {n}: {err}");
        assert!(
            err.contains(&format!("open-file limit (ulimit -n) of {n} is too small")),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "spill left"
        );
    }
}

#[test]
fn a_low_soft_open_file_limit_is_raised_toward_the_hard_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, err) = with_nofile(8, 4096, tmp.path());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "spill left"
    );
}
