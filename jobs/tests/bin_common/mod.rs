//! Shared by the integration tests that run the `outcore` binary (kept
//! apart from `tests/common`, which the shim's tests also include and which
//! cannot name this crate's binary).

use std::process::Command;

/// Runs the `outcore` binary with `args`: its exit code (`None` when a
/// signal ended it) and its stderr.
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
