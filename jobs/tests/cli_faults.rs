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
