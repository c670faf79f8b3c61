//! The command line under spill faults: a full spill filesystem (root
//! only, as CI runs: it mounts a small tmpfs).

use std::process::Command;

#[path = "../../tests/common/tmpfs.rs"]
mod tmpfs;
use tmpfs::Tmpfs;

#[test]
fn the_command_line_warns_about_a_full_spill_directory() {
    let fs = Tmpfs::mount("size=4m");
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args([
            "kmeans",
            "--synthetic",
            "64MiB",
            "--dims",
            "32",
            "--k",
            "8",
            "--epochs",
            "1",
        ])
        .args(["--mem-cap", "24MiB", "--spill-dir"])
        .arg(fs.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warn: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("outcore: warning:"))
        .collect();
    assert_eq!(warn.len(), 1, "{err}");
    assert!(
        warn[0].contains(&fs.path().display().to_string()) && warn[0].contains("No space left"),
        "{}",
        warn[0]
    );
}

/// Spill files in the spill directories under `root`.
fn spill_files(root: &std::path::Path) -> usize {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| std::fs::read_dir(d.path()).map_or(0, |f| f.count()))
        .sum()
}

#[test]
fn a_spill_filesystem_turned_read_only_mid_run_is_said_and_swept_next_run() {
    // It gave the right model and exit 0 but left every spill file
    // (950 files, 506 MB), and no line said so.
    let fs = Tmpfs::mount("size=256m");
    let mut child = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args([
            "kmeans",
            "--synthetic",
            "128MiB",
            "--dims",
            "32",
            "--k",
            "8",
        ])
        .args(["--epochs", "3", "--mem-cap", "16MiB", "--spill-dir"])
        .arg(fs.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read-only once spill files exist (or the run ended first).
    while spill_files(fs.path()) < 20 && child.try_wait().unwrap().is_none() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ro = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(fs.path())
        .status()
        .unwrap();
    assert!(ro.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let left = spill_files(fs.path());
    assert!(left > 0, "nothing was left to say: {err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("could not be removed"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("Read-only file system"), "{err}");
    assert!(said[0].contains(&format!("{left} file(s)")), "{err}");
    // Writable again: the next run in the same place removes it.
    let rw = Command::new("mount")
        .args(["-o", "remount,rw"])
        .arg(fs.path())
        .status()
        .unwrap();
    assert!(rw.success());
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(["kmeans", "--synthetic", "1MiB", "--dims", "8", "--k", "2"])
        .arg("--spill-dir")
        .arg(fs.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read_dir(fs.path()).unwrap().count(), 0);
}
