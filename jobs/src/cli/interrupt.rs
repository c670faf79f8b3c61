//! Signals that end a run: destructors do not run on a signal, so a
//! thread of ours removes the spill directories and the partial outputs
//! (the temporary files of outputs not yet complete) itself, then exits
//! with code 128 + the signal's number (130 for Ctrl-C).
//!
//! Every signal whose default action ends the process and that can be
//! caught is handled: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
//! SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGIO, SIGPWR and the real-time
//! signals. A signal the process was started with ignored stays ignored
//! (`nohup` ignores SIGHUP; Rust ignores SIGPIPE, so a closed pipe is an
//! error on the write instead). SIGXFSZ is ignored too: a file grown past
//! `ulimit -f` fails its write with one line naming it. Signals of faults
//! (SIGSEGV, SIGBUS, SIGABRT, ...) and SIGKILL are not caught.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Spill directories to remove if the process is interrupted.
static SPILL_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Set when a handled signal arrives: an error that follows (the spill
/// files vanishing under a running job) is the interruption, not a failure
/// to report.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The write end of the pipe the signal handler writes the signal's
/// number to (-1 before [`install_cleanup`]).
static PIPE: AtomicI32 = AtomicI32::new(-1);

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

/// The signals handled: those whose default action ends the process.
fn handled() -> Vec<libc::c_int> {
    let mut s = vec![
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGXCPU,
        libc::SIGIO,
        libc::SIGPWR,
    ];
    s.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    s
}

/// The signal handler: async-signal-safe, it only writes the signal's
/// number to the pipe (errno kept for the code it interrupted).
extern "C" fn on_signal(sig: libc::c_int) {
    let fd = PIPE.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    // SAFETY: `__errno_location` returns this thread's errno; `write` is
    // async-signal-safe and reads one byte from a live local.
    unsafe {
        let errno = *libc::__errno_location();
        let b = sig as u8;
        libc::write(fd, (&b as *const u8).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Installs the handlers, and the thread that, on a signal, removes the
/// spill directories and partial outputs and exits with code 128 + the
/// signal's number.
pub(super) fn install_cleanup() {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let read_end = fds[0];
    let spawned = std::thread::Builder::new()
        .name("outcore-signals".into())
        .stack_size(256 << 10)
        .spawn(move || wait_and_clean(read_end));
    if spawned.is_err() {
        return;
    }
    PIPE.store(fds[1], Ordering::SeqCst);
    for sig in handled() {
        take_over(
            sig,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    take_over(libc::SIGXFSZ, libc::SIG_IGN);
}

/// Sets `sig`'s action to `action` when it is still the default one.
fn take_over(sig: libc::c_int, action: libc::sighandler_t) {
    // SAFETY: sigaction structs are plain data, valid when zeroed; the
    // calls read and write only them.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return;
        }
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = action;
        new.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut new.sa_mask);
        libc::sigaction(sig, &new, std::ptr::null_mut());
    }
}

/// The cleanup thread: waits for a signal's number on the pipe, then
/// removes what the run leaves on disk and exits.
fn wait_and_clean(fd: libc::c_int) {
    let mut b = 0u8;
    loop {
        // SAFETY: reads one byte into a live local.
        let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            break;
        }
        if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
    INTERRUPTED.store(true, Ordering::SeqCst);
    // No output is begun from now on; those begun are removed.
    outcore_jobs::remove_partial_outputs();
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
    let sig = libc::c_int::from(b);
    say!(
        "outcore: interrupted by {}; spill files and partial outputs removed",
        name(sig)
    );
    std::process::exit(128 + sig);
}

/// The usual name of a signal.
fn name(sig: libc::c_int) -> String {
    let known = [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGVTALRM, "SIGVTALRM"),
        (libc::SIGPROF, "SIGPROF"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGIO, "SIGIO"),
        (libc::SIGPWR, "SIGPWR"),
    ];
    match known.iter().find(|(s, _)| *s == sig) {
        Some((_, n)) => (*n).to_string(),
        None => format!("signal {sig}"),
    }
}
