//! Interrupted runs: Ctrl-C (SIGINT) and SIGTERM remove the spill files; a
//! SIGKILL leaves nothing outside the spill directory.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts a long K-means run spilling into `dir`.
fn start(dir: &Path, out: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args([
            "kmeans",
            "--synthetic",
            "128MiB",
            "--dims",
            "64",
            "--k",
            "8",
            "--epochs",
            "1000",
        ])
        .args(["--mem-cap", "24MiB", "--spill-dir"])
        .arg(dir)
        .arg("--output")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// Waits until the run has written spill files.
fn wait_for_spills(dir: &Path) {
    let start = Instant::now();
    loop {
        let n: usize = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| std::fs::read_dir(e.path()).map(|d| d.count()).unwrap_or(0))
            .sum();
        if n > 0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no spill file appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the run did not stop after the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal_removes_spill_files(sig: i32) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("centroids.npy");
    let mut child = start(dir.path(), &out);
    wait_for_spills(dir.path());
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, sig) };
    let st = wait(&mut child);
    assert_eq!(st.code(), Some(130), "{st:?}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn ctrl_c_removes_the_spill_files() {
    signal_removes_spill_files(libc::SIGINT);
}

#[test]
fn sigterm_removes_the_spill_files() {
    signal_removes_spill_files(libc::SIGTERM);
}

#[test]
fn sigkill_leaves_nothing_outside_the_spill_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("centroids.npy");
    let mut child = start(dir.path(), &out);
    wait_for_spills(dir.path());
    child.kill().unwrap();
    let _ = child.wait();
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    // Only the private spill directory, and no output that looks valid.
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("outcore-spill-"),
        "{left:?}"
    );
    assert!(!out.exists());
}
