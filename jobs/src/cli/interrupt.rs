//! Ctrl-C and SIGTERM: destructors do not run on a signal, so the handler
//! removes the spill directories itself and exits with code 130.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Spill directories to remove if the process is interrupted.
static SPILL_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Set when SIGINT or SIGTERM arrives: an error that follows (the spill
/// files vanishing under a running job) is the interruption, not a failure
/// to report.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Whether the run was interrupted by a signal.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Adds a spill directory to remove on interruption.
pub(super) fn remove_on_interrupt(dir: PathBuf) {
    if let Ok(mut d) = SPILL_DIRS.lock() {
        d.push(dir);
    }
}

/// Installs the handler that removes the spill directories and exits with
/// code 130 on Ctrl-C or SIGTERM.
pub(super) fn install_cleanup() {
    let _ = ctrlc::set_handler(|| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        let dirs = SPILL_DIRS.lock().map(|d| d.clone()).unwrap_or_default();
        // Workers may still be writing a spill file: retry until the
        // directory is gone (a file created after it goes fails to open).
        for d in &dirs {
            for _ in 0..50 {
                let _ = std::fs::remove_dir_all(d);
                if !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if !super::silent() {
            eprintln!("outcore: interrupted; spill files removed");
        }
        std::process::exit(130);
    });
}
