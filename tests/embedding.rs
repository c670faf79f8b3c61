//! An application that keeps its own global allocator: outcore builds into
//! it, an uncapped runtime works, and a capped runtime refuses to start
//! (the cap could not be enforced) instead of silently doing nothing.
//!
//! This test binary deliberately does not include `common` (which installs
//! `TrapAlloc`).

use std::process::Command;

use outcore::{Error, MemoryCap, PodVec, Runtime};

#[global_allocator]
static SYSTEM: std::alloc::System = std::alloc::System;

#[test]
fn a_capped_runtime_without_trapalloc_is_an_error() {
    let err = Runtime::builder()
        .mem_cap(MemoryCap::Bytes(64 << 20))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::AllocatorNotInstalled { cap } if cap == 64 << 20),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("64.0 MiB") && msg.contains("#[global_allocator]"),
        "{msg}"
    );
    // `auto` resolves to a cap too.
    let err = Runtime::builder()
        .mem_cap(MemoryCap::Auto)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, Error::AllocatorNotInstalled { .. }),
        "{err:?}"
    );
}

#[test]
fn an_uncapped_runtime_works_with_any_allocator() {
    let spill = tempfile::tempdir().unwrap();
    let rt = Runtime::builder()
        .workers(2)
        .spill_dir(spill.path())
        .build()
        .expect("no cap: no allocator needed");
    let h = rt.insert(PodVec::from(vec![2.0f32; 1 << 16])).unwrap();
    assert_eq!(rt.evict_all().unwrap(), 1, "explicit evictions still work");
    let sum = rt
        .read(&h, |v: &PodVec<f32>| v.iter().sum::<f32>())
        .unwrap();
    assert_eq!(sum, 2.0 * (1 << 16) as f32);
    // The allocator's queries report nothing: it is not installed.
    assert_eq!(outcore::current_usage(), 0);
}

/// Set in the child process that [`main_that_returns_the_error_shows_its_message`]
/// starts.
const CHILD_VAR: &str = "OUTCORE_EMBEDDING_CHILD";

/// The child: a test that returns the error, as `main` would. A test's
/// `Err` is printed by the same code as `main`'s (`Termination`, with
/// `Debug`).
#[test]
fn returns_the_error_like_main() -> Result<(), Error> {
    if std::env::var_os(CHILD_VAR).is_some() {
        Runtime::builder()
            .mem_cap(MemoryCap::Bytes(128 << 20))
            .build()?;
    }
    Ok(())
}

/// `fn main() -> Result<(), outcore::Error>`, the README's pattern, prints
/// the error's message with the line to add, not its variant's fields
/// (it printed `Error: AllocatorNotInstalled { cap: 134217728 }`).
#[test]
fn main_that_returns_the_error_shows_its_message() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["returns_the_error_like_main", "--exact", "--nocapture"])
        .args(["--test-threads=1"])
        .env(CHILD_VAR, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let err = Error::AllocatorNotInstalled { cap: 128 << 20 };
    let want = format!("Error: {err}");
    assert!(stderr.contains(&want), "{stderr}");
    assert!(stderr.contains("#[global_allocator]"), "{stderr}");
    assert!(!stderr.contains("AllocatorNotInstalled"), "{stderr}");
    assert_eq!(format!("{err:?}"), err.to_string());
}
