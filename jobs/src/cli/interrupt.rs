//! Signals that end a run: destructors do not run on a signal, so a
//! thread of ours removes the spill directories and the partial outputs
//! (the temporary files of outputs not yet complete) itself, then exits
//! with code 128 + the signal's number (130 for Ctrl-C).
//!
//! Every signal whose default action ends the process and that can be
//! caught is handled: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
//! SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU, SIGIO, SIGPWR and the real-time
//! signals (under a CPU-time limit, the soft limit is lowered so that
//! SIGXCPU comes before the kernel's SIGKILL). A signal the process was
//! started with ignored stays ignored (`nohup` ignores SIGHUP; Rust
//! ignores SIGPIPE, so a closed pipe is an
//! error on the write instead). SIGXFSZ is ignored too: a file grown past
//! `ulimit -f` fails its write with one line naming it. SIGABRT (an
//! allocation that failed after the allocator's out-of-memory line, or
//! any other abort) gets the same cleanup, within a few seconds, and then
//! the abort goes on. Signals of faults (SIGSEGV, SIGBUS, ...) and SIGKILL
//! are not caught (the next runtime in the same spill directory removes a
//! dead one's files).
//!
//! Under MPI, `mpirun` ends the other ranks with SIGTERM both when the user
//! presses Ctrl-C and when one rank fails (its own line says why): ranks
//! stopped by SIGTERM clean up and exit without a line of their own.

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

/// Set when the process is one of several MPI ranks.
static RANKED: AtomicBool = AtomicBool::new(false);

/// How long an aborting thread waits for the cleanup before the abort goes
/// on (the cleanup allocates: after heap damage it could wait forever).
const ABORT_CLEANUP_MS: libc::c_int = 5000;

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

/// One line for each spill directory still there once its runtime has
/// ended (removing it failed: its filesystem turned read-only mid-run,
/// say), with what is left and why. Each is tried once more first. The
/// next runtime made in the same place removes it (its process is dead).
pub fn spill_left() -> Vec<String> {
    let dirs = SPILL_DIRS.lock().map(|d| d.clone()).unwrap_or_default();
    dirs.iter()
        .filter(|d| d.exists())
        .filter_map(|d| {
            let why = std::fs::remove_dir_all(d).err()?;
            let (mut files, mut bytes) = (0u64, 0u64);
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                files += 1;
                bytes += e.metadata().map_or(0, |m| m.len());
            }
            Some(format!(
                "outcore: warning: the spill directory {} could not be removed ({why}): {files} file(s), {} left; the next run with the same spill directory removes it",
                d.display(),
                outcore::format_bytes(bytes)
            ))
        })
        .collect()
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
/// number to the pipe (errno kept for the code it interrupted). For
/// SIGABRT it then waits (the abort ends the process once the handler
/// returns) until the cleanup thread exits the process, at most
/// [`ABORT_CLEANUP_MS`]; a second abort, or one from the cleanup itself,
/// goes on at once.
extern "C" fn on_signal(sig: libc::c_int) {
    let fd = PIPE.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    if sig == libc::SIGABRT {
        if ABORTING.swap(true, Ordering::SeqCst) || CLEANING.load(Ordering::SeqCst) {
            return;
        }
        notify(fd, sig);
        // SAFETY: poll with no descriptors only sleeps (async-signal-safe).
        unsafe {
            libc::poll(std::ptr::null_mut(), 0, ABORT_CLEANUP_MS);
        }
        return;
    }
    notify(fd, sig);
}

/// Set by the first SIGABRT.
static ABORTING: AtomicBool = AtomicBool::new(false);

/// Set while the cleanup thread runs.
static CLEANING: AtomicBool = AtomicBool::new(false);

/// Writes the signal's number to the pipe, keeping errno.
fn notify(fd: libc::c_int, sig: libc::c_int) {
    // SAFETY: `__errno_location` returns this thread's errno; `write` is
    // async-signal-safe and reads one byte from a live local.
    unsafe {
        let errno = *libc::__errno_location();
        let b = sig as u8;
        libc::write(fd, (&b as *const u8).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Says that the process now runs among other ranks (the job grew): from
/// then on, SIGTERM from `mpirun` ends it without a line of its own.
pub(super) fn set_ranked() {
    RANKED.store(true, Ordering::SeqCst);
}

/// Installs the handlers, and the thread that, on a signal, removes the
/// spill directories and partial outputs and exits with code 128 + the
/// signal's number.
pub(super) fn install_cleanup(ranked: bool) {
    RANKED.store(ranked, Ordering::SeqCst);
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
    // Replacing any handler: the MPI library's prints a 20-line backtrace
    // after the line that says why, and removes nothing.
    set_action(
        libc::SIGABRT,
        on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        true,
    );
    take_over(libc::SIGXFSZ, libc::SIG_IGN);
    leave_cpu_margin();
}

/// Under a CPU-time limit (`ulimit -t`) whose soft and hard values are
/// the same, the kernel's SIGKILL follows its SIGXCPU at once, and a run
/// ended that way left its spill directory. The soft limit is lowered, so
/// that SIGXCPU (handled: the cleanup) comes a margin of CPU time before:
/// a quarter of a CPU-second per core, at least one, at most half the
/// limit.
fn leave_cpu_margin() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_CPU, &mut lim) } != 0
        || lim.rlim_max == libc::RLIM_INFINITY
    {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let margin = (cores / 4).max(1).min(lim.rlim_max / 2);
    let soft = lim.rlim_max - margin;
    if margin == 0 || lim.rlim_cur <= soft {
        return;
    }
    let lowered = libc::rlimit {
        rlim_cur: soft,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: lowering a soft limit below its hard one is always allowed.
    unsafe { libc::setrlimit(libc::RLIMIT_CPU, &lowered) };
}

/// Sets `sig`'s action to `action` when it is still the default one.
fn take_over(sig: libc::c_int, action: libc::sighandler_t) {
    set_action(sig, action, false);
}

/// Sets `sig`'s action to `action`, when it is still the default one or
/// whatever it is (`replace`).
fn set_action(sig: libc::c_int, action: libc::sighandler_t, replace: bool) {
    // SAFETY: sigaction structs are plain data, valid when zeroed; the
    // calls read and write only them.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || (old.sa_sigaction != libc::SIG_DFL && !replace)
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
    CLEANING.store(true, Ordering::SeqCst);
    INTERRUPTED.store(true, Ordering::SeqCst);
    // No output is begun from now on; those begun are removed.
    outcore_jobs::remove_partial_outputs();
    // Every runtime's directory, by its lock descriptor: also one being
    // created (it is waited for), or whose runtime is still being built
    // and not yet in `SPILL_DIRS`. No directory is created after this.
    outcore::remove_spill_dirs();
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
    // An abort has said why (the out-of-memory line); a rank stopped by
    // mpirun leaves the line to the rank that failed, or to the user's
    // Ctrl-C.
    let quiet = sig == libc::SIGABRT || (sig == libc::SIGTERM && RANKED.load(Ordering::SeqCst));
    if !quiet {
        say!(
            "outcore: interrupted by {}; spill files and partial outputs removed",
            name(sig)
        );
    }
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
