//! A small tmpfs for fault tests, shared by `tests/faults.rs` and
//! `jobs/tests/cli_faults.rs` (included by path).

use std::path::Path;
use std::process::Command;

/// A small tmpfs mounted for the test (root only, as CI runs), unmounted on
/// drop.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(opts: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "outcore-test"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(
            st.success(),
            "mounting a tmpfs needs root (the CI runs as root)"
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}
