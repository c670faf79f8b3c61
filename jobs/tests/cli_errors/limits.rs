//! Bad input to `outcore gen`, resource limits, and flags out of range.

use super::*;

// ---------------------------------------------------------------------------
// `outcore gen`
// ---------------------------------------------------------------------------

fn gen_args(synthetic: &str, dims: &str, output: &Path) -> Vec<String> {
    let mut a = strs(&["gen", "--synthetic", synthetic, "--dims", dims, "--output"]);
    a.push(s(output));
    a
}

#[test]
fn gen_synthetic_bad_unit() {
    let t = Scratch::new();
    let g = t.join("g.npy");
    let e = t.fails(&gen_args("12XB", "8", &g), std::slice::from_ref(&g));
    assert_mentions(&e, "12XB");
}

#[test]
fn gen_dims_zero() {
    let t = Scratch::new();
    let g = t.join("g.npy");
    let e = t.fails(&gen_args("64KiB", "0", &g), std::slice::from_ref(&g));
    assert_mentions(&e, "--dims");
}

#[test]
fn gen_synthetic_smaller_than_a_point() {
    let t = Scratch::new();
    let g = t.join("g.npy");
    t.fails(&gen_args("0", "8", &g), std::slice::from_ref(&g));
    t.fails(&gen_args("31", "8", &g), std::slice::from_ref(&g));
}

#[test]
fn gen_unwritable_output() {
    let t = Scratch::new();
    let g = PathBuf::from("/nonexistent-dir/g.npy");
    let e = t.fails(&gen_args("64KiB", "8", &g), std::slice::from_ref(&g));
    assert_mentions(&e, "/nonexistent-dir/g.npy");

    let d = t.join("outdir");
    fs::create_dir(&d).unwrap();
    let e = t.fails(&gen_args("64KiB", "8", &d), &[]);
    assert_mentions(&e, "directory");
    assert!(fs::read_dir(&d).unwrap().next().is_none());
}

#[test]
fn gen_larger_than_the_free_space_is_refused_at_once() {
    // `gen --synthetic 99999TB` wrote until the disk was full. The child
    // may write 64 MiB at most (`ulimit -f`), in case it is not refused.
    use std::os::unix::process::CommandExt;
    let t = Scratch::new();
    let out_path = t.join("huge.npy");
    let args = gen_args("99999TB", "8", &out_path);
    let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
    c.args(&args).current_dir(t.path());
    // SAFETY: setrlimit and signal are async-signal-safe and touch only
    // the child.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64 << 20,
                rlim_max: 64 << 20,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = c.output().unwrap();
    let e = check_bad_input(&args, &out);
    assert_mentions(&e, "huge.npy: ");
    assert!(
        e.contains("to write, but its filesystem has") && e.contains(" free"),
        "{e}"
    );
    assert_eq!(listing(t.path()), BTreeSet::new(), "{e}");
}

#[test]
fn an_address_space_limit_too_small_for_the_program_is_one_line() {
    // Under about 55 MB of `ulimit -v` the run aborted after an
    // `outcore: out of memory` line.
    let t = Scratch::new();
    for (limit_mib, args) in [
        (
            40u64,
            strs(&["kmeans", "--synthetic", "8MiB", "--dims", "8", "--k", "4"]),
        ),
        (
            52,
            strs(&[
                "kmeans",
                "--synthetic",
                "8MiB",
                "--dims",
                "8",
                "--k",
                "4",
                "--workers",
                "1",
            ]),
        ),
        (40, gen_args("8MiB", "8", &t.join("g.npy"))),
        // gen holds no runtime to evict from: at 74-80 MiB it aborted
        // with the standard library's line alone.
        (80, gen_args("128MiB", "32", &t.join("g.npy"))),
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
        c.args(&args).current_dir(t.path());
        address_space_limit(&mut c, limit_mib << 20);
        let out = c.output().unwrap();
        let e = check_bad_input(&args, &out);
        assert_mentions(&e, &format!("(ulimit -v {})", limit_mib << 10));
        assert_mentions(&e, "too small for outcore itself");
        assert_mentions(&e, "it needs at least");
        if args[0] == "gen" {
            assert!(!e.contains("--workers"), "gen has no --workers: {e}");
        }
        assert_eq!(listing(t.path()), BTreeSet::new(), "{e}");
    }
}

/// A partition larger than what `ulimit -v` leaves, with no cap (only the
/// trap evicts) and one worker: the load waited for room that nothing
/// could make, and the prefetcher's tries at loading the next executor,
/// each given back, looked like other threads' progress to it, so it
/// waited for ever. It ends now, with the `out of memory` line, and
/// leaves no spill file.
#[test]
fn a_load_that_cannot_fit_under_the_limit_ends_instead_of_waiting() {
    let t = Scratch::new();
    let args = strs(&[
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
        "none",
        "--shards",
        "1",
        "--partitions",
        "1",
        "--workers",
        "1",
    ]);
    // The watchdog: a hang is killed (exit 124) instead of blocking.
    let mut c = Command::new("timeout");
    c.arg("120")
        .arg(env!("CARGO_BIN_EXE_outcore"))
        .args(&args)
        .env("TMPDIR", t.path())
        .env("RUST_BACKTRACE", "0")
        .current_dir(t.path());
    address_space_limit(&mut c, 250_000 << 10);
    let out = c.output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(124), "hung: {e}");
    assert!(!out.status.success(), "{e}");
    assert!(e.contains("outcore: out of memory: "), "{e}");
    assert_eq!(listing(t.path()), BTreeSet::new(), "{e}");
}

/// Runs `c` under an address-space limit of `bytes` (`ulimit -v`, the
/// soft limit), in the child only.
fn address_space_limit(c: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        c.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: libc::RLIM_INFINITY,
            };
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            Ok(())
        });
    }
}

#[test]
fn gen_missing_required_flags() {
    let t = Scratch::new();
    t.fails(&strs(&["gen", "--dims", "8", "--output", "g.npy"]), &[]);
    t.fails(&strs(&["gen", "--synthetic", "64KiB"]), &[]);
    t.fails(&strs(&["frobnicate"]), &[]);
}

/// Argument errors keep clap's detail, in at most three lines: what is
/// missing, the suggestion for a typo, the allowed values.
#[test]
fn argument_errors_keep_the_detail() {
    let t = Scratch::new();
    let e = t.fails(&strs(&["gen", "--dims", "8"]), &[]);
    assert_mentions(
        &e,
        "required arguments were not provided: --synthetic <SIZE>, --output <FILE>",
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    let e = t.fails(&strs(&["kmeans", "--iteration", "3"]), &[]);
    assert_mentions(&e, "unexpected argument '--iteration'");
    assert_mentions(&e, "\n  tip: a similar argument exists: '--iterations'");
    let e = t.fails(&strs(&["kmeans", "--algorithm", "foo"]), &[]);
    assert_mentions(&e, "\n  [possible values: minibatch, lloyd]");
    let e = t.fails(&strs(&["kmeans", "--k", "abc"]), &[]);
    assert_mentions(&e, "invalid value 'abc' for '--k <K>': invalid digit");
    assert!(
        !e.contains("Usage:") && !e.contains("For more information"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------
// `outcore kmeans`: other flags out of range
// ---------------------------------------------------------------------------

#[test]
fn kmeans_other_flags_out_of_range() {
    let t = Scratch::new();
    for extra in [
        &["--workers", "0"][..],
        &["--workers", "100000"],
        &["--partitions", "0"],
        &["--task-points", "0"],
        &["--batch-tasks", "0"],
        &["--true-k", "0"],
        &["--algorithm", "foo"],
        &["--policy", "foo"],
        &["--no-such-flag"],
    ] {
        let mut args = strs(SYNTH);
        args.extend(strs(extra));
        let e = t.kmeans_fails(&args);
        assert_mentions(&e, extra[0]);
    }
    // --spill-dir in a missing directory (the scratch outputs without the
    // scratch --spill-dir: a flag may be given only once).
    let mut args = vec!["kmeans".to_string()];
    args.extend(strs(SYNTH));
    let outs = t.kmeans_outputs();
    args.extend_from_slice(&outs[..6]);
    args.extend(strs(&["--spill-dir", "/nonexistent-dir/spill"]));
    let e = t.fails(&args, &[t.output(), t.labels(), t.stats()]);
    assert_mentions(&e, "/nonexistent-dir/spill");
}

/// Under `ulimit -v`, a cap that does not fit (or no cap) is warned about
/// with the start lines: only the allocation trap would evict, and the
/// data may be read many times over. A cap that fits, or no limit, gets no
/// such line.
#[test]
fn a_cap_over_the_address_space_limit_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.npy");
    let run = |limit: Option<&str>, cap: &str| {
        let limit = limit.map_or(String::new(), |l| format!("ulimit -v {l}; "));
        let o = std::process::Command::new("sh")
            .args(["-c", &format!("{limit}exec \"$@\""), "sh"])
            .arg(env!("CARGO_BIN_EXE_outcore"))
            .args(["kmeans", "--synthetic", "16MiB", "--dims", "16", "--k", "4"])
            .args(["--epochs", "1", "--mem-cap", cap, "--output"])
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{cap}: {err}");
        err
    };
    const WARNING: &str = "under an address-space limit of";
    for cap in ["4GiB", "none"] {
        let err = run(Some("1500000"), cap);
        assert!(err.contains(WARNING), "{cap}: {err}");
        assert!(err.contains("--mem-cap auto"), "{cap}: {err}");
    }
    for (limit, cap) in [
        (Some("1500000"), "64MiB"),
        (Some("1500000"), "auto"),
        (None, "4GiB"),
    ] {
        let err = run(limit, cap);
        assert!(!err.contains(WARNING), "{limit:?} {cap}: {err}");
    }
}

/// `ulimit -d` (`RLIMIT_DATA`), which counts the heap, the allocator's
/// mappings and thread stacks: below what outcore needs for itself, one
/// line at start (it used to die of the standard library's "memory
/// allocation of 1 bytes failed" at 28 MiB, and of an out-of-memory abort
/// at 58-78 MiB); above, the run evicts at the limit, says that its cap
/// does not fit under it, and gives the same bytes as without a limit.
#[test]
fn a_data_size_limit_is_checked_at_start_and_held() {
    let dir = tempfile::tempdir().unwrap();
    let args = "kmeans --synthetic 96MiB --dims 32 --k 8 --epochs 1 --seed 3";
    let run =
        |limit: &str, out: &str| under_ulimit(&format!("-d {limit}"), args, &dir.path().join(out));
    for limit in ["29000", "60000"] {
        let o = run(limit, "small.npy");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{limit}: {err}");
        assert_eq!(err.lines().count(), 1, "{limit}: {err}");
        assert!(
            err.starts_with(&format!(
                "outcore: error: the data size limit (ulimit -d {limit})"
            )),
            "{err}"
        );
        assert!(!dir.path().join("small.npy").exists());
    }
    let o = run("unlimited", "free.npy");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run("90000", "limited.npy");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("under a data size limit of"), "{err}");
    let free = std::fs::read(dir.path().join("free.npy")).unwrap();
    let limited = std::fs::read(dir.path().join("limited.npy")).unwrap();
    assert!(free == limited, "the centroids differ under ulimit -d");
}

/// Under `ulimit -s 64` (KiB) the argument parser alone overflowed the
/// main thread's stack (SIGABRT, "has overflowed its stack"); the program
/// now runs on a thread with a stack of its own, and the run gives the
/// same bytes as under the default limit.
#[test]
fn a_small_stack_limit_runs() {
    let dir = tempfile::tempdir().unwrap();
    let args = "kmeans --synthetic 16MiB --dims 16 --k 4 --epochs 1 --seed 5 --mem-cap 8MiB";
    let run =
        |limit: &str, out: &str| under_ulimit(&format!("-s {limit}"), args, &dir.path().join(out));
    let small = run("64", "small.npy");
    let err = String::from_utf8_lossy(&small.stderr);
    assert!(small.status.success(), "{err}");
    let default = run("8192", "default.npy");
    assert!(default.status.success());
    let a = std::fs::read(dir.path().join("small.npy")).unwrap();
    let b = std::fs::read(dir.path().join("default.npy")).unwrap();
    assert!(a == b, "the centroids differ under ulimit -s 64");
}

/// Runs outcore with `args` (split at spaces) and `--output out`, under
/// `ulimit` with `limit` (such as "-d 60000"), set in the child only.
fn under_ulimit(limit: &str, args: &str, out: &Path) -> std::process::Output {
    std::process::Command::new("sh")
        .args(["-c", &format!("ulimit {limit}; exec \"$@\""), "sh"])
        .arg(env!("CARGO_BIN_EXE_outcore"))
        .args(args.split(' '))
        .arg("--output")
        .arg(out)
        .output()
        .unwrap()
}
