//! Output files behave like other tools' outputs: mode 0666 less the
//! umask, `-` for standard output, non-regular targets (FIFOs, devices,
//! links to them) written in place and never replaced, links to regular
//! files followed.

use std::ffi::CString;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

const RUN: [&str; 13] = [
    "kmeans",
    "--synthetic",
    "1MiB",
    "--dims",
    "16",
    "--k",
    "4",
    "--true-k",
    "4",
    "--epochs",
    "1",
    "--mem-cap",
    "none",
];

/// Runs `outcore` in `dir` under `umask`.
fn run_in(dir: &Path, umask: u32, extra: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
    c.current_dir(dir).args(RUN).args(extra);
    // SAFETY: umask is async-signal-safe and touches only this child.
    unsafe {
        c.pre_exec(move || {
            libc::umask(umask as libc::mode_t);
            Ok(())
        });
    }
    let out = c.output().expect("run outcore");
    assert!(
        out.status.success(),
        "outcore {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn outputs_get_0666_less_the_umask() {
    for (umask, want) in [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)] {
        let dir = tempfile::tempdir().unwrap();
        run_in(
            dir.path(),
            umask,
            &[
                "--output", "c.npy", "--labels", "l.npy", "--stats", "s.json",
            ],
        );
        for f in ["c.npy", "l.npy", "s.json"] {
            assert_eq!(mode(&dir.path().join(f)), want, "{f} under umask {umask:o}");
        }
        // Nothing else is left (no temporary files).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
    }
}

#[test]
fn a_dash_means_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(dir.path(), 0o022, &["--stats", "-"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(v["inertia"].as_f64().is_some(), "{v}");
    assert!(!dir.path().join("-").exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

fn mkfifo(p: &Path) {
    let c = CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// A FIFO, and a symlink to one, are written in place and stay what they
/// are.
#[test]
fn a_fifo_is_written_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("stats.fifo");
    mkfifo(&fifo);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for target in [&fifo, &link] {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        run_in(dir.path(), 0o022, &["--stats", target.to_str().unwrap()]);
        // Checked before waiting for the reader, which would wait forever
        // on a FIFO that was replaced instead of written.
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        let text = reader.join().unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON through the FIFO");
        assert!(v["inertia"].as_f64().is_some(), "{v}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// A link to this process's standard output (what /dev/stdout is, as
/// root) is written through, not replaced by a regular file.
#[test]
fn a_link_to_standard_output_stays_a_link() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("stdout");
    std::os::unix::fs::symlink("/proc/self/fd/1", &link).unwrap();
    let out = run_in(dir.path(), 0o022, &["--stats", link.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(v["inertia"].as_f64().is_some(), "{v}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// A symlink to a regular file: the file is replaced, the link stays.
#[test]
fn a_link_to_a_file_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.json");
    std::fs::write(&real, "old").unwrap();
    let link = dir.path().join("s.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    run_in(dir.path(), 0o022, &["--stats", "s.json"]);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&real).unwrap()).unwrap();
    assert!(v["inertia"].as_f64().is_some(), "{v}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

/// Flags that do not apply to the run get one warning line each; the run
/// goes on. Flags that apply get none.
#[test]
fn flags_that_do_not_apply_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    outcore_jobs::npy::write_array(&x, &[64, 4], &vec![1f32; 256]).unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec![
                "kmeans",
                "--input",
                x.to_str().unwrap(),
                "--k",
                "2",
                "--dims",
                "4",
                "--true-k",
                "3",
            ],
            vec![
                "--dims does not apply",
                "--true-k applies to synthetic data",
            ],
        ),
        (
            vec![
                "kmeans",
                "--synthetic",
                "64KiB",
                "--dims",
                "4",
                "--k",
                "2",
                "--algorithm",
                "lloyd",
                "--epochs",
                "2",
                "--iterations",
                "2",
            ],
            vec!["--epochs applies to --algorithm minibatch"],
        ),
        // Ignored, so not checked either (it warned, then failed on it).
        (
            vec![
                "kmeans",
                "--synthetic",
                "64KiB",
                "--dims",
                "4",
                "--k",
                "2",
                "--algorithm",
                "lloyd",
                "--epochs",
                "0",
                "--batch-tasks",
                "0",
                "--max-no-improvement",
                "0",
            ],
            vec![
                "--epochs applies to --algorithm minibatch",
                "--batch-tasks applies to --algorithm minibatch",
                "--max-no-improvement applies to --algorithm minibatch",
            ],
        ),
        (
            vec![
                "kmeans",
                "--synthetic",
                "64KiB",
                "--dims",
                "4",
                "--k",
                "2",
                "--epochs",
                "1",
                "--iterations",
                "0",
            ],
            vec!["--iterations applies to --algorithm lloyd"],
        ),
        (
            vec![
                "kmeans",
                "--synthetic",
                "64KiB",
                "--dims",
                "4",
                "--k",
                "2",
                "--epochs",
                "1",
                "--iterations",
                "2",
            ],
            vec!["--iterations applies to --algorithm lloyd"],
        ),
        (
            vec![
                "train",
                "--synthetic",
                "64KiB",
                "--dims",
                "4",
                "--classes",
                "2",
                "--max-iter",
                "2",
                "--lr",
                "0.1",
            ],
            vec!["--lr applies to --solver sgd"],
        ),
        (
            vec![
                "train",
                "--synthetic",
                "64KiB",
                "--dims",
                "4",
                "--classes",
                "2",
                "--solver",
                "sgd",
                "--rounds",
                "1",
                "--C",
                "2",
            ],
            vec!["--C applies to --solver lbfgs"],
        ),
        (
            vec![
                "kmeans",
                "--synthetic",
                "64KiB",
                "--dims",
                "4",
                "--true-k",
                "2",
                "--k",
                "2",
                "--epochs",
                "1",
            ],
            vec![],
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
            .current_dir(dir.path())
            .args(&args)
            .args(["--mem-cap", "none"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        let warnings: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("outcore: warning:"))
            .collect();
        assert_eq!(warnings.len(), want.len(), "{args:?}: {err}");
        for (w, text) in warnings.iter().zip(&want) {
            assert!(w.contains(text), "{args:?}: {w}");
        }
    }
}

/// The start and summary lines speak the user's words (the flag values),
/// never Rust's debug names.
#[test]
fn the_summary_uses_user_facing_names() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(dir.path(), 0o022, &["--policy", "lru"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mini-batch"), "{err}");
    assert!(err.contains("policy lru"), "{err}");
    for rust_name in ["Minibatch", "MiniBatch", "Lru", "Priority", "Some(", "None"] {
        assert!(!err.contains(rust_name), "{rust_name} in: {err}");
    }
    let out = run_in(dir.path(), 0o022, &["--algorithm", "lloyd"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Lloyd") && err.contains("policy priority"),
        "{err}"
    );
}

/// Runs `outcore` in `dir` and expects it to fail.
fn fails_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run outcore");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "outcore {args:?}: {err}");
    err
}

#[test]
fn an_output_never_overwrites_an_input_or_another_output() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_in(d, 0o022, &["--output", "c.npy", "--stats", "s.json"]);
    // Data to read: the centroids make a small 4 x 16 input too.
    let keep = std::fs::read(d.join("c.npy")).unwrap();
    std::fs::write(d.join("x.npy"), &keep).unwrap();
    std::os::unix::fs::symlink("x.npy", d.join("link.npy")).unwrap();
    let k = ["kmeans", "--input", "x.npy", "--k", "2"];
    for extra in [
        &["--output", "x.npy"][..],
        &["--labels", "link.npy"],
        &["--stats", "./x.npy"],
        &["--timeline", "x.npy"],
    ] {
        let args: Vec<&str> = k.iter().chain(extra).copied().collect();
        let err = fails_in(d, &args);
        assert!(err.contains("is the --input file"), "{args:?}: {err}");
    }
    let err = fails_in(
        d,
        &[&k[..], &["--init", "c.npy", "--output", "c.npy"]].concat(),
    );
    assert!(err.contains("is the --init file"), "{err}");
    let err = fails_in(
        d,
        &[&k[..], &["--output", "o.npy", "--labels", "o.npy"]].concat(),
    );
    assert!(err.contains("--output and --labels both write"), "{err}");
    let err = fails_in(d, &[&k[..], &["--output", "-", "--labels", "-"]].concat());
    assert!(err.contains("both write standard output"), "{err}");
    let err = fails_in(
        d,
        &[
            "predict",
            "--input",
            "x.npy",
            "--centroids",
            "c.npy",
            "--labels",
            "c.npy",
        ],
    );
    assert!(err.contains("is the --centroids file"), "{err}");
    let err = fails_in(d, &["plot", "s.json", "--output", "s.json"]);
    assert!(err.contains("is the timeline file"), "{err}");
    // Nothing was touched.
    assert_eq!(std::fs::read(d.join("x.npy")).unwrap(), keep);
    assert_eq!(std::fs::read(d.join("c.npy")).unwrap(), keep);
    assert!(!d.join("o.npy").exists());
}

/// A cap smaller than what the run must hold at once (here the
/// initialisation's sample: 4096 points of 1 KiB) stops it at the start,
/// with one line that says how much it needs and writes nothing. (It used
/// to warn and run over the cap.)
#[test]
fn a_cap_smaller_than_what_the_run_holds_at_once_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let run = |cap: &str| {
        Command::new(env!("CARGO_BIN_EXE_outcore"))
            .current_dir(dir.path())
            .args(["kmeans", "--synthetic", "4MiB", "--dims", "256", "--k", "4"])
            .args(["--epochs", "1", "--mem-cap", cap, "--output", "c.npy"])
            .output()
            .unwrap()
    };
    let out = run("2MiB");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("K-means with k = 4 on 256 dimensions needs 5.3 MiB at once")
            && err.contains("the initialisation's sample 4.2 MiB")
            && err.contains("more than the memory cap of 2.0 MiB"),
        "{err}"
    );
    assert!(
        !err.contains("--"),
        "no flag in the library's message: {err}"
    );
    assert!(!dir.path().join("c.npy").exists());
    let out = run("64MiB");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn a_failed_output_says_which_outputs_were_written() {
    // `--stats /dev/full` failed with exit 2 after the centroids were
    // written, and the line did not say so.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .current_dir(dir.path())
        .args(RUN)
        .args(["--output", "c.npy", "--labels", "l.npy"])
        .args(["--stats", "/dev/full"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    let e = errors[0];
    assert!(e.starts_with("outcore: error: /dev/full: "), "{e}");
    assert!(
        e.contains(
            "outputs written: --output c.npy, --labels l.npy; not written: --stats /dev/full"
        ),
        "{e}"
    );
    assert!(dir.path().join("c.npy").exists() && dir.path().join("l.npy").exists());
}

#[test]
fn a_closed_stderr_does_not_lose_the_run() {
    // `outcore kmeans ... 2>&1 | head -1`: the run panicked ("failed
    // printing to stderr", exit 101) and its centroids were lost.
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .current_dir(dir.path())
        .args(RUN)
        .args(["--output", "c.npy", "--stats", "s.json"])
        .stderr(writer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    for f in ["c.npy", "s.json"] {
        assert!(dir.path().join(f).exists(), "{f} was not written");
    }
}

/// Whether the run did any work: its progress lines name the epoch or
/// the initialisation.
fn worked(err: &str) -> bool {
    err.contains("epoch") || err.contains("initialised")
}

#[test]
fn an_output_name_the_filesystem_refuses_stops_the_run_before_the_work() {
    // A 300-byte name failed only after the whole run.
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}.npy", "a".repeat(300));
    for flag in ["--output", "--labels", "--stats", "--timeline"] {
        let err = fails_in(dir.path(), &[&RUN[..], &[flag, &long]].concat());
        assert!(err.contains("File name too long"), "{flag}: {err}");
        assert!(!worked(&err), "{flag}: the run worked first: {err}");
        assert_eq!(err.lines().count(), 1, "{flag}: {err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn an_immutable_output_stops_the_run_before_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.npy");
    std::fs::write(&p, b"old").unwrap();
    let chattr = |flag: &str| {
        Command::new("chattr")
            .args([flag, p.to_str().unwrap()])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        // Not root, or a filesystem without the flag (tmpfs).
        eprintln!("skipped: chattr +i is not available here");
        return;
    }
    let err = fails_in(dir.path(), &[&RUN[..], &["--output", "c.npy"]].concat());
    assert!(chattr("-i"));
    assert!(err.contains("immutable"), "{err}");
    assert!(!worked(&err), "the run worked first: {err}");
    assert_eq!(std::fs::read(&p).unwrap(), b"old");
}

#[test]
fn streamed_labels_that_fail_mid_run_list_the_outputs_not_written() {
    // The labels file fails while the final pass streams it (here
    // /dev/full: its size and room cannot be checked before): the line
    // must say which outputs exist.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .current_dir(dir.path())
        .args(["kmeans", "--synthetic", "32MiB", "--dims", "16", "--k", "4"])
        .args(["--epochs", "1", "--mem-cap", "none"])
        .args([
            "--output",
            "c.npy",
            "--labels",
            "/dev/full",
            "--stats",
            "s.json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains(
            "outputs written: none; not written: --output c.npy, --labels /dev/full, --stats s.json"
        ),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Outputs and spill files larger than the file-size limit (`ulimit -f`)
/// are refused before the work: spill writes failed part-way (their
/// executors kept in memory, over the cap) and the labels after the run.
#[test]
fn a_file_size_limit_too_small_for_the_spill_or_the_labels_is_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
        c.current_dir(dir.path())
            .args(["kmeans", "--synthetic", "16MiB", "--dims", "16", "--k", "4"])
            .args(["--epochs", "1"])
            .args(extra);
        // SAFETY: setrlimit and signal are async-signal-safe and touch
        // only this child.
        unsafe {
            c.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 256 << 10,
                    rlim_max: 256 << 10,
                };
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
                Ok(())
            });
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (extra, want) in [
        (&["--mem-cap", "4MiB"][..], "a spill file would reach"),
        (
            &["--mem-cap", "none", "--labels", "l.npy"],
            "l.npy: 1.0 MiB to write, but the file-size limit",
        ),
    ] {
        let (code, err) = run(extra);
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(want) && err.contains("ulimit -f 256"), "{err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
