//! The examples keep the command line's promises (they are what embedders
//! copy): a signal leaves no spill files, a bad flag gives one
//! `NAME: error: ...` line and a non-zero exit, a run that cannot keep its
//! cap stops with one line, and there is a cap by default. Each runs the
//! example's binary as a child (built first, by the cargo that runs the
//! tests).

mod common;
#[path = "common/tmpfs.rs"]
mod tmpfs;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The example's binary, next to this test's directory (`target/debug/
/// examples/`), brought up to date once per test binary.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("examples").join(name);
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|b| b == name) {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-q", "--example", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo build --example");
        assert!(st.success() && bin.exists(), "no {}", bin.display());
        built.push(name.to_string());
    }
    bin
}

/// A command for `name` with the signals the tests send at their default
/// action (a shell's background job inherits SIGINT ignored).
fn command(name: &str, args: &[&str]) -> Command {
    let mut c = Command::new(example(name));
    c.args(args);
    // SAFETY: `signal` is async-signal-safe, as needed between fork and exec.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
            Ok(())
        });
    }
    c
}

fn run(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    command(name, args)
        .envs(env.iter().copied())
        .output()
        .expect("run example")
}

/// Files in the spill directories inside `parent`.
fn spill_files(parent: &Path) -> usize {
    std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_dir(e.path()).ok())
        .map(|d| d.count())
        .sum()
}

/// Starts `name` spilling into a fresh directory, sends `sig` once spill
/// files exist, and checks that the process ended by the signal with its
/// spill directory gone.
fn signal_leaves_nothing(name: &str, args: &[&str], sig: libc::c_int) {
    let parent = tempfile::tempdir().unwrap();
    let mut args = args.to_vec();
    args.extend(["--spill-dir", parent.path().to_str().unwrap()]);
    let mut child = command(name, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while spill_files(parent.path()) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "{name} ended early");
        // A hang guard, not a timing assertion.
        assert!(start.elapsed() < Duration::from_secs(300), "no spill file");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: a plain syscall on our child's pid.
    unsafe { libc::kill(child.id() as i32, sig) };
    let st = child.wait().unwrap();
    assert!(
        st.signal() == Some(sig) || st.code() == Some(128 + sig),
        "{name}: {st:?}"
    );
    let left: Vec<_> = std::fs::read_dir(parent.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{name} left {left:?}");
}

const PAGERANK_SPILLING: &[&str] = &[
    "--edges",
    "64MiB",
    "--nodes",
    "256K",
    "--mem-cap",
    "16MiB",
    "--iters",
    "100000",
];

#[test]
fn pagerank_sigint_and_sigterm_leave_no_spill_files() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_leaves_nothing("pagerank", PAGERANK_SPILLING, sig);
    }
}

#[test]
fn quickstart_sigint_and_sigterm_leave_no_spill_files() {
    let args = [
        "--data",
        "256MiB",
        "--part",
        "4MiB",
        "--mem-cap",
        "16MiB",
        "--sweeps",
        "rwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrwrw",
    ];
    for sig in [libc::SIGINT, libc::SIGTERM] {
        signal_leaves_nothing("quickstart", &args, sig);
    }
}

/// One `NAME: error: ...` line naming `want` (and not `not`), exit code 2.
fn bad_flag(name: &str, args: &[&str], want: &str, not: &str) {
    let out = run(name, args, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = err.lines().collect();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(
        lines[0].starts_with(&format!("{name}: error: ")),
        "{args:?}: {err}"
    );
    assert!(lines[0].contains(want), "{args:?}: {err}");
    assert!(not.is_empty() || !lines[0].contains(not), "{args:?}: {err}");
}

#[test]
fn pagerank_bad_flags_give_one_correct_line() {
    let p = "pagerank";
    bad_flag(
        p,
        &["--bogus"],
        "unknown argument '--bogus'",
        "needs a value",
    );
    bad_flag(p, &["--bogus", "1"], "unknown argument '--bogus'", "");
    bad_flag(p, &["--blocks", "0"], "--blocks", "--nodes");
    bad_flag(p, &["--blocks", "x"], "--blocks", "--nodes");
    bad_flag(p, &["--workers", "0"], "--workers", "");
    bad_flag(p, &["--iters", "0"], "--iters", "");
    bad_flag(p, &["--nodes", "0"], "--nodes", "");
    bad_flag(p, &["--nodes", "3", "--blocks", "4"], "--nodes", "");
    bad_flag(p, &["--edges", "4"], "--edges", "");
    bad_flag(p, &["--edges"], "--edges needs a value", "");
    bad_flag(p, &["--mem-cap", "lots"], "--mem-cap", "");
}

#[test]
fn quickstart_and_kmeans_bad_flags_give_one_correct_line() {
    let q = "quickstart";
    bad_flag(q, &["--bogus"], "unknown argument '--bogus'", "");
    bad_flag(q, &["--workers", "0"], "--workers", "");
    bad_flag(q, &["--data"], "--data needs a value", "");
    bad_flag(q, &["--part", "1GiB", "--data", "1MiB"], "--data", "");
    bad_flag(q, &["--mem-cap", "lots"], "--mem-cap", "");
    let k = "kmeans_executors";
    bad_flag(k, &["lots"], "data size", "");
    // Less than one executor used to run on one (4 MiB) and report "0 B".
    bad_flag(k, &["0"], "less than one executor", "");
    bad_flag(k, &["1MiB"], "less than one executor", "");
    bad_flag(k, &["4MiB", "lots"], "memory cap", "");
    bad_flag(k, &["4MiB", "1MiB", "extra"], "extra", "");
}

/// An executor larger than the cap is served, and the example says so in
/// one warning (it used to say nothing).
#[test]
fn kmeans_executors_warns_of_executors_larger_than_the_cap() {
    let out = run("kmeans_executors", &["8MiB", "1MiB"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<_> = err.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("more than the cap"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("8.0 MiB of points in 2 executors"),
        "{stdout}"
    );
}

/// The same in the quickstart.
#[test]
fn quickstart_warns_of_executors_larger_than_the_cap() {
    let args = ["--data", "16MiB", "--part", "8MiB", "--mem-cap", "1MiB"];
    let out = run("quickstart", &args, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<_> = err.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].starts_with("quickstart: warning:"), "{err}");
}

/// The last line of standard error, and that it is the only error line.
fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    err.lines().last().unwrap_or_default().to_string()
}

#[test]
fn pagerank_stops_with_one_line_when_spill_writes_fail() {
    let out = run(
        "pagerank",
        &[
            "--edges",
            "64MiB",
            "--nodes",
            "256K",
            "--mem-cap",
            "16MiB",
            "--iters",
            "3",
        ],
        &[("OUTCORE_FAULT_WRITE_EVERY", "1")],
    );
    let last = one_error_line(&out);
    assert!(
        last.starts_with("pagerank: error: cannot keep the cap"),
        "{last}"
    );
}

#[test]
fn pagerank_refuses_a_spill_directory_too_small() {
    // SAFETY: a plain syscall without arguments.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let fs = tmpfs::Tmpfs::mount("size=1M");
    let out = run(
        "pagerank",
        &[
            "--edges",
            "8MiB",
            "--nodes",
            "64K",
            "--mem-cap",
            "4MiB",
            "--iters",
            "2",
            "--spill-dir",
            fs.path().to_str().unwrap(),
        ],
        &[],
    );
    let last = one_error_line(&out);
    assert!(
        last.starts_with("pagerank: error: the spill directory"),
        "{last}"
    );
}

#[test]
fn pagerank_has_a_cap_by_default_and_checks_sizes_against_it() {
    let out = run(
        "pagerank",
        &["--edges", "8KiB", "--nodes", "1K", "--iters", "1"],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(!json.contains("\"mem_cap_bytes\":null"), "{json}");
    // 4Mi nodes hold 32 MiB of ranks outside the executors: refused
    // before anything is built.
    let out = run(
        "pagerank",
        &[
            "--edges",
            "1MiB",
            "--nodes",
            "4M",
            "--mem-cap",
            "4MiB",
            "--iters",
            "1",
        ],
        &[],
    );
    let last = one_error_line(&out);
    assert!(last.contains("too small"), "{last}");
}
