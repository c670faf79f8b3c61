//! The command line under spill faults: a full spill filesystem (root
//! only, as CI runs: it mounts a small tmpfs).

use std::process::Command;

#[path = "../../tests/common/tmpfs.rs"]
mod tmpfs;
use tmpfs::Tmpfs;

fn kmeans_64mib(spill: &std::path::Path, fault_every: Option<&str>) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
    c.args([
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
    .arg(spill);
    if let Some(n) = fault_every {
        c.env("OUTCORE_FAULT_WRITE_EVERY", n);
    }
    c.output().unwrap()
}

/// A full spill filesystem used to let the run go on over its cap (64 MiB
/// under a 24 MiB cap with 4 MiB of spill space) and exit 0 with a
/// warning. It stops once past the cap, with one line.
#[test]
fn a_full_spill_directory_stops_the_run_with_one_line() {
    let fs = Tmpfs::mount("size=4m");
    let out = kmeans_64mib(fs.path(), None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    // Besides the warning that a tmpfs spill stays in memory.
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("outcore: ") && !l.contains("is in memory (tmpfs)"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].starts_with("outcore: error: cannot keep the cap of 24.0 MiB")
            && said[0].contains(&fs.path().display().to_string())
            && said[0].contains("No space left"),
        "{}",
        said[0]
    );
}

/// Writes that fail now and then (every third) do not stop the run: it
/// completes within its cap, and one warning line names the directory.
#[test]
fn the_command_line_warns_about_failed_spill_writes() {
    // On a disk: a tmpfs spill adds a warning of its own.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = kmeans_64mib(dir.path(), Some("3"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warn: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("outcore: warning:"))
        .collect();
    assert_eq!(warn.len(), 1, "{err}");
    assert!(
        warn[0].contains(&dir.path().display().to_string()) && warn[0].contains("injected fault"),
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
fn a_spill_filesystem_turned_read_only_mid_run_stops_is_said_and_swept_next_run() {
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
    // A remount fails (EBUSY) while a file is open for writing: try again
    // until none is.
    let remount_ro = || {
        Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(fs.path())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    let mut tries = 0;
    while !remount_ro() {
        tries += 1;
        assert!(tries < 500, "the spill filesystem stayed busy");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // The executors whose writes fail stay in memory: the run used to go
    // on to 6.9 x its cap and exit 0. It stops once past the cap.
    assert!(!out.status.success(), "{err}");
    let stopped: Vec<&str> = err.lines().filter(|l| l.contains("error:")).collect();
    assert_eq!(stopped.len(), 1, "{err}");
    assert!(
        stopped[0].contains("cannot keep the cap of 16.0 MiB")
            && stopped[0].contains("Read-only file system"),
        "{err}"
    );
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

/// A capped run spilling to tmpfs (here /dev/shm) keeps what it evicts in
/// memory: it used to say nothing. One warning line says so; a spill
/// directory on a disk gets none.
#[test]
fn a_spill_directory_in_memory_is_warned_about() {
    let shm = std::path::Path::new("/dev/shm");
    if std::fs::metadata(shm).is_err() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (dir, warned) in [(shm, true), (disk.path(), false)] {
        let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
            .args(["kmeans", "--synthetic", "16MiB", "--dims", "8", "--k", "4"])
            .args(["--epochs", "1", "--mem-cap", "8MiB", "--spill-dir"])
            .arg(dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let said: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("is in memory (tmpfs)"))
            .collect();
        assert_eq!(said.len(), usize::from(warned), "{}: {err}", dir.display());
    }
}
