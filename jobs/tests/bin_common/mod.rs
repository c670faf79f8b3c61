//! Shared by the integration tests that run the `outcore` binary (kept
//! apart from `tests/common`, which the shim's tests also include and which
//! cannot name this crate's binary).

use std::process::Command;

/// Runs the `outcore` binary with `args`: its exit code (`None` when a
/// signal ended it) and its stderr.
#[allow(dead_code)]
pub fn outcore_cli(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(args)
        .output()
        .expect("failed to start outcore");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether python3 can import `modules` (comma-separated). When it cannot,
/// the caller skips its test with a message, unless
/// `OUTCORE_REQUIRE_SKLEARN=1` (set by CI) makes that a failure.
#[allow(dead_code)]
pub fn have_python(modules: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("OUTCORE_REQUIRE_SKLEARN").as_deref() != Ok("1"),
            "python3 with {modules} is required (OUTCORE_REQUIRE_SKLEARN=1) but cannot be imported"
        );
        eprintln!("skipped: python3 with {modules} is not installed");
    }
    ok
}

/// Runs a python3 script with arguments; its standard output (panics,
/// showing stderr, when it fails).
#[allow(dead_code)]
pub fn python(script: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The data of a little-endian `.npy` file of 4-byte elements (int32 or
/// float32), as raw 4-byte words, and the descr it declares.
#[allow(dead_code)]
pub fn npy_words(path: &std::path::Path) -> (String, Vec<[u8; 4]>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = String::from_utf8_lossy(&b[10..10 + hlen]).into_owned();
    let descr = header
        .split("'descr': '")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .unwrap_or("")
        .to_string();
    let words = b[10 + hlen..]
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect();
    (descr, words)
}

/// What the accounted peak may exceed a cap by before the trap or the
/// proactive eviction catches it (docs/cli.md): per thread (two workers,
/// the prefetcher, the main thread) one flush threshold not yet published
/// (cap / 256, at least 64 KiB). Tests add what their run holds besides
/// (the allocation being trapped, a partition, a write buffer).
#[allow(dead_code)]
pub fn flush_slack(cap: u64) -> u64 {
    4 * (cap / 256).max(64 << 10)
}

/// Runs the `outcore` binary with `args`: its exit code (`None` when a
/// signal ended it), its stderr, and its peak resident set in bytes (the
/// kernel's `ru_maxrss` of this child alone).
#[allow(dead_code)]
#[expect(
    clippy::zombie_processes,
    reason = "reaped by wait4, which gives the child's rusage; std's wait does not"
)]
pub fn outcore_rss(args: &[&str]) -> (Option<i32>, String, u64) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("failed to start outcore");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // SAFETY: rusage is plain integers; all zeros is a valid value.
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: the pid is our unwaited child; `status` and `usage` are
    // valid for writes. std's `Child` is not waited afterwards.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(r, child.id() as i32, "wait4");
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, err, usage.ru_maxrss as u64 * 1024)
}
