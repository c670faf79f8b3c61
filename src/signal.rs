//! Spill directories and signals that end the process. A runtime removes
//! its spill directory when it is dropped, but destructors do not run when
//! SIGINT (Ctrl-C) or SIGTERM ends the process; the next runtime spilling
//! into the same parent directory would remove the files, but until then
//! they take the disk. [`remove_spill_on_signal`] installs handlers that
//! remove them first; [`remove_spill_dirs`] is the same removal, for a
//! program with signal handlers of its own.

use std::sync::atomic::{AtomicBool, Ordering};

/// The signals handled by [`remove_spill_on_signal`]: those that end a
/// process from a terminal, a batch system or a session's end.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Set by the first handler to run: another signal arriving on another
/// thread meanwhile waits for its removal instead of ending the process
/// in the middle of it.
static REMOVING: AtomicBool = AtomicBool::new(false);

/// Set once the first handler's removal is done.
static REMOVED: AtomicBool = AtomicBool::new(false);

/// Removes the spill directory of every runtime alive in this process,
/// with its files, now. Async-signal-safe (no allocation, no lock: a few
/// system calls per file), for a signal handler of your own that then
/// ends the process. A runtime whose directory is gone can no longer
/// evict or load: call it only when the process is about to end.
///
/// Runtimes of a parent process (this one being a child created by
/// `fork()`) are not this process's: their directories stay.
pub fn remove_spill_dirs() {
    crate::spill::dir::remove_live_dirs();
}

/// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove the spill
/// directory of every live runtime ([`remove_spill_dirs`]) and then end the
/// process by the same signal, as it would have ended without them (a
/// shell shows exit status 128 + the signal's number: 130 for Ctrl-C).
///
/// A signal whose action is not the default one is left alone: one the
/// process was started with ignored (`nohup` ignores SIGHUP), or one the
/// program handles already (call [`remove_spill_dirs`] from that handler).
/// Call it once, early in `main`; runtimes built later are covered too.
/// The command line `outcore` does this (and more: it removes its partial
/// outputs) on its own.
///
/// ```
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
/// outcore::remove_spill_on_signal();
/// let rt = outcore::Runtime::builder().build()?;
/// // A Ctrl-C from here on removes rt.spill_dir() before the process ends.
/// # Ok::<(), outcore::Error>(())
/// ```
pub fn remove_spill_on_signal() {
    for sig in SIGNALS {
        // SAFETY: sigaction structs are plain data, valid when zeroed; the
        // calls read and write only them and the signal mask in `new`.
        // `on_signal` makes only async-signal-safe calls.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            new.sa_flags = libc::SA_RESTART;
            // The other handled signals wait while a handler runs on this
            // thread.
            libc::sigemptyset(&mut new.sa_mask);
            for s in SIGNALS {
                libc::sigaddset(&mut new.sa_mask, s);
            }
            libc::sigaction(sig, &new, std::ptr::null_mut());
        }
    }
}

/// The handler: removes the spill directories (or waits, at most 5 s, for
/// the thread already removing them), restores the default action and
/// raises the signal again; it ends the process once the handler returns
/// and the signal is unblocked. Async-signal-safe throughout.
extern "C" fn on_signal(sig: libc::c_int) {
    if REMOVING.swap(true, Ordering::SeqCst) {
        for _ in 0..500 {
            if REMOVED.load(Ordering::SeqCst) {
                break;
            }
            // SAFETY: poll with no descriptors only sleeps.
            unsafe { libc::poll(std::ptr::null_mut(), 0, 10) };
        }
    } else {
        remove_spill_dirs();
        REMOVED.store(true, Ordering::SeqCst);
    }
    // SAFETY: `signal` and `raise` are async-signal-safe; the default
    // action of every handled signal ends the process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}
