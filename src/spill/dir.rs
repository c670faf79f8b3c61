//! The spill store's private directory: checking the directory it goes in,
//! creating it, locking it for the runtime's life, and removing the
//! directories of runtimes that died without removing theirs (`SIGKILL`,
//! the OOM killer, a batch system's time limit).
//!
//! Each runtime's directory is named
//! `outcore-spill-<host>-<boot>-<pid>-<random>` (mode 0700; `<boot>` is
//! the start of the kernel's boot id) and is locked with
//! `flock(LOCK_EX)` on a descriptor of the directory itself, kept open
//! (close-on-exec) until the runtime is dropped. `flock` locks belong to
//! the open file description, so two runtimes of one process exclude each
//! other like two processes, and the kernel releases the lock when the
//! process dies, however it dies.
//!
//! When a runtime creates its directory, it then looks in the same parent
//! for directories of the same host and boot owned by the same user, and
//! removes each whose lock it can take: their owners are gone. It never
//! looks at another host's directories (a shared filesystem's locks may be
//! local to each host), nor at directories of older versions (no lock).
//!
//! The race between creating a directory and locking it is closed from
//! the creator's side: a sweeper may lock and remove a directory created
//! an instant ago, so the creator takes its lock without waiting and then
//! checks that the path still names the directory it locked; otherwise it
//! starts again under a new name.
//!
//! A child created by `fork()` (without `exec`) would share the lock and
//! keep a dead parent's directory locked: a fork handler points the
//! child's copies of the descriptors at `/dev/null` instead.
//!
//! [`ScratchDir`] makes the same directory for a process's other temporary
//! files (the Python package's copy of an in-memory array), so that what a
//! killed process leaves there is swept the same way.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// What every spill directory's name starts with.
const PREFIX: &str = "outcore-spill-";

/// Names tried before giving up (each attempt fails only on a name taken
/// already, or a directory removed by a sweeper an instant after it was
/// made).
const ATTEMPTS: usize = 16;

/// Refuses a parent directory where other users could remove, rename or
/// replace the spill directory: a symbolic link (when `explicit`: the
/// default temporary directory is taken as the system gives it), a
/// directory owned by another user than this one or root, or one
/// writable by everyone without the sticky bit.
pub(crate) fn check_parent(dir: &Path, explicit: bool) -> Result<()> {
    let meta = if explicit {
        std::fs::symlink_metadata(dir)
    } else {
        std::fs::metadata(dir)
    }
    .map_err(|source| Error::SpillDir {
        dir: dir.to_path_buf(),
        source,
    })?;
    let refuse = |reason: String| {
        Err(Error::SpillDirUnsafe {
            dir: dir.to_path_buf(),
            reason,
        })
    };
    if meta.file_type().is_symlink() {
        return refuse("is a symbolic link (give the directory it points to)".into());
    }
    if !meta.is_dir() {
        return Err(Error::SpillDir {
            dir: dir.to_path_buf(),
            source: io::Error::other("not a directory"),
        });
    }
    // SAFETY: a plain syscall without arguments.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid && meta.uid() != 0 {
        return refuse(format!(
            "is owned by uid {}, neither this user (uid {euid}) nor root",
            meta.uid()
        ));
    }
    if meta.mode() & 0o002 != 0 && meta.mode() & 0o1000 == 0 {
        return refuse(format!(
            "is writable by every user and lacks the sticky bit (mode {:o}), so \
             anyone could remove or replace the spill files",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// A runtime's private spill directory, locked while it lives and removed
/// on drop (in the process that created it only).
#[derive(Debug)]
pub(crate) struct PrivateDir {
    path: PathBuf,
    _lock: LockFd,
    owner: u32,
}

impl PrivateDir {
    /// Creates a private directory in `parent` (checked already), locks
    /// it, then removes the directories of dead runtimes of this host
    /// found next to it.
    pub(crate) fn create(parent: &Path) -> Result<PrivateDir> {
        let tag = host_tag();
        let owner = std::process::id();
        // Counted as being created until its lock descriptor is registered,
        // so that `remove_live_dirs` waits for it (a signal in between
        // left an empty directory).
        let _creating = Creating::enter().ok_or_else(|| Error::SpillDir {
            dir: parent.to_path_buf(),
            source: io::Error::other("the process is ending: its spill directories were removed"),
        })?;
        for _ in 0..ATTEMPTS {
            let path = parent.join(format!("{PREFIX}{tag}-{owner}-{}", random_name()));
            match DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => test_pause_after_mkdir(),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(Error::SpillDir {
                        dir: parent.to_path_buf(),
                        source,
                    })
                }
            }
            let fail = |source: io::Error| {
                let _ = std::fs::remove_dir(&path);
                Error::SpillDir {
                    dir: path.clone(),
                    source,
                }
            };
            // Locked before anything else is done to it: until then another
            // runtime's sweep may take it for a dead one's and remove it
            // (a chmod by path in between failed with "No such file or
            // directory" when runtimes started at once).
            let Some(lock) = lock_new(&path).map_err(fail)? else {
                continue;
            };
            // The umask may have taken bits off.
            // SAFETY: a plain syscall on the descriptor the lock owns.
            if unsafe { libc::fchmod(lock.fd, 0o700) } != 0 {
                return Err(fail(io::Error::last_os_error()));
            }
            let dir = PrivateDir {
                path,
                _lock: lock,
                owner,
            };
            sweep(parent, &tag, &dir.path);
            return Ok(dir);
        }
        Err(Error::SpillDir {
            dir: parent.to_path_buf(),
            source: io::Error::other(format!(
                "no private directory could be created in {ATTEMPTS} attempts"
            )),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // In a child created by `fork()` the directory is the parent's.
        if std::process::id() == self.owner {
            // Removed while still locked: no sweeper starts on it meanwhile.
            let _ = std::fs::remove_dir_all(&self.path);
        }
        // Then `_lock` is dropped, which releases the lock.
    }
}

/// A private directory for a process's temporary files beside the spill
/// (the Python package's copy of an in-memory array), made, locked and
/// removed as a runtime's spill directory: removed on drop, and, left by
/// a process that died, removed by the next runtime (or `ScratchDir`) of
/// this user, host and boot created in the same parent.
#[derive(Debug)]
pub struct ScratchDir(PrivateDir);

impl ScratchDir {
    /// Creates one inside `parent`, or inside the system temporary
    /// directory (as a runtime's spill directory, and with the same checks
    /// on the parent), then removes the directories of dead processes
    /// next to it.
    ///
    /// # Errors
    ///
    /// [`Error::SpillDirUnsafe`] when other users could tamper with
    /// `parent`, [`Error::SpillDir`] when it cannot be created.
    pub fn create(parent: Option<&Path>) -> Result<ScratchDir> {
        let parent_dir = parent.map_or_else(super::system_temp_dir, Path::to_path_buf);
        check_parent(&parent_dir, parent.is_some())?;
        PrivateDir::create(&parent_dir).map(ScratchDir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// The descriptor holding a directory's lock, registered with the fork
/// handler. Closed on drop by its owner process only: in a `fork()` child
/// the number may have been pointed at `/dev/null`, or reused.
#[derive(Debug)]
struct LockFd {
    fd: i32,
    /// Its place in [`LOCK_FDS`], if there was room.
    slot: Option<usize>,
    /// The process that opened it.
    owner: u32,
}

impl LockFd {
    /// Takes `fd`; `register`: hand it to the fork handler.
    fn new(fd: i32, register: bool) -> LockFd {
        let slot = register
            .then(|| {
                install_fork_handler();
                LOCK_FDS.iter().position(|s| {
                    s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
            })
            .flatten();
        LockFd {
            fd,
            slot,
            owner: std::process::id(),
        }
    }

    /// Releases the lock: unregisters, then closes the descriptor.
    fn close(&mut self) {
        if let Some(i) = self.slot.take() {
            LOCK_FDS[i].store(-1, Ordering::Release);
        }
        if self.fd >= 0 {
            // SAFETY: our own descriptor, closed once (`fd` is cleared).
            unsafe { libc::close(self.fd) };
            self.fd = -1;
        }
    }
}

impl Drop for LockFd {
    fn drop(&mut self) {
        if std::process::id() == self.owner {
            self.close();
        }
    }
}

/// Opens a directory without following a symbolic link, for locking.
fn open_dir(path: &Path) -> io::Result<i32> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("path contains a NUL byte"))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fd)
    }
}

/// `flock(LOCK_EX | LOCK_NB)`.
fn try_lock(fd: i32) -> io::Result<()> {
    // SAFETY: a plain syscall on a descriptor we own.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `path` still names the directory open as `fd`.
fn same_dir(fd: i32, path: &Path) -> bool {
    // SAFETY: `st` is written by `fstat` before it is read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a plain syscall on a descriptor we own, writing into `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| m.is_dir() && m.dev() == st.st_dev && m.ino() == st.st_ino)
}

/// Locks the directory just created at `path`. `None` when a sweeper got
/// there first (it holds the lock, or removed the directory already).
/// Where the filesystem cannot lock directories (NFS may refuse an exclusive
/// lock on a descriptor not open for writing), the directory stays
/// unlocked: there every sweeper's lock fails too, so none removes it.
fn lock_new(path: &Path) -> io::Result<Option<LockFd>> {
    let fd = match open_dir(path) {
        Ok(fd) => LockFd::new(fd, true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match try_lock(fd.fd) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => return Err(e),
        Err(_) => {}
    }
    Ok(same_dir(fd.fd, path).then_some(fd))
}

/// Removes the directories of dead runtimes in `parent`: this host's and
/// boot's (`tag`), owned by this user, whose lock can be taken. Best
/// effort: what cannot be read or removed is left.
fn sweep(parent: &Path, tag: &str, own: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = format!("{PREFIX}{tag}-");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let ours = name
            .as_bytes()
            .strip_prefix(prefix.as_bytes())
            .is_some_and(is_pid_and_random);
        let path = entry.path();
        if ours && path != own {
            remove_if_dead(&path);
        }
    }
}

/// Whether `rest` is `<pid>-<random>`, as [`PrivateDir::create`] names
/// directories (so a host whose name extends this one's is told apart).
fn is_pid_and_random(rest: &[u8]) -> bool {
    let Some(dash) = rest.iter().position(|&b| b == b'-') else {
        return false;
    };
    let (pid, random) = (&rest[..dash], &rest[dash + 1..]);
    !pid.is_empty()
        && pid.iter().all(u8::is_ascii_digit)
        && !random.is_empty()
        && random.iter().all(|b| ALPHABET.contains(b))
}

/// Removes the directory at `path` if it is a real directory owned by this
/// user and nobody holds its lock. Holds the lock while removing it.
fn remove_if_dead(path: &Path) -> bool {
    let Ok(fd) = open_dir(path) else {
        return false;
    };
    // Not handed to the fork handler: held for the removal only.
    let fd = LockFd::new(fd, false);
    // SAFETY: a plain syscall without arguments.
    let euid = unsafe { libc::geteuid() };
    let owned = std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == euid);
    // Removed while locked (the lock goes when `fd` is dropped), and only
    // if the path still names the directory locked.
    owned
        && try_lock(fd.fd).is_ok()
        && same_dir(fd.fd, path)
        && std::fs::remove_dir_all(path).is_ok()
}

/// Letters of the random part of a name.
const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// 16 random letters (80 bits), from `getrandom`, else from the standard
/// library's randomly keyed hasher.
fn random_name() -> String {
    let mut b = [0u8; 16];
    // SAFETY: `getrandom` writes at most `b.len()` bytes into `b`.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if usize::try_from(got).ok() != Some(b.len()) {
        use std::hash::BuildHasher;
        let s = std::collections::hash_map::RandomState::new();
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b[..8].copy_from_slice(&s.hash_one((t, 1u8)).to_le_bytes());
        b[8..].copy_from_slice(&s.hash_one((t, 2u8)).to_le_bytes());
    }
    b.iter()
        .map(|&x| char::from(ALPHABET[usize::from(x) % ALPHABET.len()]))
        .collect()
}

/// `<host>-<boot>`: the host name (letters, digits, `.` and `-` kept,
/// others as `_`) and the first 8 hex digits of the kernel's boot id (so
/// a twin host name elsewhere, or this host after a reboot, is another
/// host: locks are only known to hold within one running kernel).
pub(crate) fn host_tag() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `gethostname` writes at most `buf.len()` bytes into `buf`.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let mut tag: String = buf[..if ok { len } else { 0 }]
        .iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' {
                char::from(b)
            } else {
                '_'
            }
        })
        .collect();
    if tag.is_empty() {
        tag.push_str("host");
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let boot: String = boot
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect();
    tag.push('-');
    tag.push_str(if boot.is_empty() { "0" } else { &boot });
    tag
}

/// Lock descriptors of this process's live runtimes, for the fork handler
/// (-1: free). 64 runtimes at most are alive at once; a lock beyond them is
/// not handed over (a child then keeps it until it exits).
static LOCK_FDS: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];

/// Set once the fork handler is installed.
static FORK_HANDLER: AtomicBool = AtomicBool::new(false);

fn install_fork_handler() {
    if !FORK_HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain `extern "C"` function that only makes
        // async-signal-safe calls (open, dup3, close), as a child handler
        // must.
        unsafe {
            libc::pthread_atfork(None, None, Some(unlock_in_child));
        }
    }
}

/// In the child of a `fork()`: the lock descriptors are copies of the
/// parent's, and would keep its directories locked after the parent died.
/// Each is pointed at `/dev/null` (the number stays valid for whoever holds
/// it; the child's copy of the lock goes). The parent keeps its locks.
extern "C" fn unlock_in_child() {
    let mut null = -1;
    for s in &LOCK_FDS {
        let fd = s.swap(-1, Ordering::AcqRel);
        if fd < 0 {
            continue;
        }
        if null < 0 {
            // SAFETY: a NUL-terminated literal path.
            null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        }
        // SAFETY: `fd` was open at the fork; replacing it only drops the
        // child's reference to the parent's open directory (never
        // `LOCK_UN`, which would unlock the parent's too).
        unsafe {
            if null < 0 || libc::dup3(null, fd, libc::O_CLOEXEC) < 0 {
                libc::close(fd);
            }
        }
    }
    if null >= 0 {
        // SAFETY: the descriptor opened above.
        unsafe { libc::close(null) };
    }
}

/// Removes the spill directory of every live runtime of this process (those
/// registered in [`LOCK_FDS`]), for a signal handler that ends the process:
/// only async-signal-safe calls (`openat`, `getdents64`, `unlinkat`,
/// `readlink`, `rmdir`, `close`), no allocation, no lock. Files a worker
/// creates meanwhile are removed on the next of a few passes. In a child
/// created by `fork()` the table is empty: the parent's directories stay.
pub(crate) fn remove_live_dirs() {
    // No directory is created from now on; those being created are
    // waited for (at most 1 s: the thread creating one may be the one this
    // runs on, in a signal handler), so that they are removed too.
    CLOSING.store(true, Ordering::SeqCst);
    for _ in 0..100 {
        if CREATING.load(Ordering::SeqCst) == 0 {
            break;
        }
        // SAFETY: poll with no descriptors only sleeps (async-signal-safe).
        unsafe { libc::poll(std::ptr::null_mut(), 0, 10) };
    }
    for s in &LOCK_FDS {
        let fd = s.load(Ordering::Acquire);
        if fd >= 0 {
            remove_dir_at(fd);
        }
    }
}

/// Spill directories being created: made, and their lock descriptors not
/// yet registered (see [`PrivateDir::create`]).
static CREATING: AtomicUsize = AtomicUsize::new(0);

/// Set by [`remove_live_dirs`]: the process is ending, and no spill
/// directory is created any more.
static CLOSING: AtomicBool = AtomicBool::new(false);

/// A directory being created, counted in [`CREATING`] while it lives.
struct Creating;

impl Creating {
    /// `None` once the process is ending.
    fn enter() -> Option<Creating> {
        CREATING.fetch_add(1, Ordering::SeqCst);
        if CLOSING.load(Ordering::SeqCst) {
            CREATING.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Creating)
    }
}

impl Drop for Creating {
    fn drop(&mut self) {
        CREATING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Test hook: `OUTCORE_TEST_PAUSE_AFTER_MKDIR_MS=N` sleeps N ms between a
/// spill directory's creation and its lock, so that a test's signal lands
/// there.
fn test_pause_after_mkdir() {
    let ms = std::env::var("OUTCORE_TEST_PAUSE_AFTER_MKDIR_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Passes over a directory's entries before giving up on removing it.
const REMOVE_PASSES: usize = 16;

/// Empties and removes the spill directory open as `fd` (async-signal-safe).
/// The path comes from `/proc/self/fd`; nothing is touched unless its last
/// component is a spill directory's name (the number may have been closed
/// and reused since it was read from the table).
fn remove_dir_at(fd: i32) {
    let mut path = [0u8; 4096];
    let Some(len) = fd_path(fd, &mut path) else {
        return;
    };
    let name_at = path[..len]
        .iter()
        .rposition(|&b| b == b'/')
        .map_or(0, |i| i + 1);
    if !path[name_at..len].starts_with(PREFIX.as_bytes()) {
        return;
    }
    // SAFETY: a plain syscall; "." is a NUL-terminated literal. A new open
    // file description, so the lock descriptor's offset is left alone.
    let dir = unsafe {
        libc::openat(
            fd,
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return;
    }
    for _ in 0..REMOVE_PASSES {
        unlink_entries(dir);
        // SAFETY: `path` is NUL-terminated at `len` (`fd_path` leaves a
        // zero after the link's text).
        if unsafe { libc::rmdir(path.as_ptr().cast()) } == 0 {
            break;
        }
    }
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(dir) };
}

/// The path of the file open as `fd`, read from `/proc/self/fd/<fd>` into
/// `buf` and NUL-terminated; its length. `None` if unknown, too long, or
/// already removed (" (deleted)").
fn fd_path(fd: i32, buf: &mut [u8; 4096]) -> Option<usize> {
    let mut link = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut at = 14;
    let mut digits = [0u8; 10];
    let mut n = u32::try_from(fd).ok()?;
    let mut k = 0;
    loop {
        digits[k] = b'0' + (n % 10) as u8;
        k += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    while k > 0 {
        k -= 1;
        link[at] = digits[k];
        at += 1;
    }
    // SAFETY: `link` is NUL-terminated (at most 10 digits after 14 bytes
    // of a 26-byte zeroed tail); `readlink` writes at most `buf.len() - 1`
    // bytes into `buf`.
    let got =
        unsafe { libc::readlink(link.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len() - 1) };
    let len = usize::try_from(got).ok().filter(|&l| l > 0)?;
    buf[len] = 0;
    (!buf[..len].ends_with(b" (deleted)")).then_some(len)
}

/// Unlinks every entry of the directory open as `dir` (one pass of
/// `getdents64` from its start; async-signal-safe).
fn unlink_entries(dir: i32) {
    // 8-byte aligned, as `linux_dirent64` records are.
    let mut buf = [0u64; 512];
    // SAFETY: a plain syscall on our descriptor.
    unsafe { libc::lseek(dir, 0, libc::SEEK_SET) };
    loop {
        // SAFETY: `getdents64` writes at most the buffer's size into it.
        let got = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir,
                buf.as_mut_ptr(),
                std::mem::size_of_val(&buf),
            )
        };
        let Ok(got) = usize::try_from(got) else {
            return;
        };
        if got == 0 {
            return;
        }
        let base = buf.as_ptr().cast::<u8>();
        let mut off = 0;
        while off + 19 < got {
            // SAFETY: the kernel wrote `got` bytes of whole records: each
            // has its 2-byte length at offset 16 and its NUL-terminated
            // name from offset 19, within the record.
            unsafe {
                let reclen = usize::from(base.add(off + 16).cast::<u16>().read_unaligned());
                let name = base.add(off + 19);
                let dot = *name == b'.'
                    && (*name.add(1) == 0 || (*name.add(1) == b'.' && *name.add(2) == 0));
                if !dot && libc::unlinkat(dir, name.cast(), 0) != 0 {
                    libc::unlinkat(dir, name.cast(), libc::AT_REMOVEDIR);
                }
                if reclen == 0 {
                    return;
                }
                off += reclen;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_made_here_count_as_this_hosts() {
        assert!(is_pid_and_random(b"123-abcz27"));
        // A host whose name extends this one's: "<tag>-5-1234abcd".
        assert!(!is_pid_and_random(b"5-1234abcd-123-abc"));
        assert!(!is_pid_and_random(b"123-"));
        assert!(!is_pid_and_random(b"-abc"));
        assert!(!is_pid_and_random(b"123-ABC"));
        assert!(!is_pid_and_random(b"123abc"));
        let tag = host_tag();
        let name = random_name();
        assert_eq!(name.len(), 16);
        assert_ne!(name, random_name());
        assert!(is_pid_and_random(format!("1-{name}").as_bytes()));
        assert!(!tag.contains('/'));
    }

    #[test]
    fn a_dead_directory_of_this_host_is_removed_and_others_are_not() {
        let parent = tempfile::tempdir().unwrap();
        let tag = host_tag();
        let dead = parent.path().join(format!("{PREFIX}{tag}-1-deadrun"));
        let other_host = parent.path().join(format!("{PREFIX}elsewhere-0-1-deadrun"));
        let extended = parent.path().join(format!("{PREFIX}{tag}-x-1-deadrun"));
        let old = parent.path().join(format!("{PREFIX}AbC123"));
        for d in [&dead, &other_host, &extended, &old] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("exec-00000001.spill"), b"x").unwrap();
        }
        // A symbolic link named like a dead directory: not followed.
        let target = parent.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), b"x").unwrap();
        let link = parent.path().join(format!("{PREFIX}{tag}-2-deadlink"));
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let live = PrivateDir::create(parent.path()).unwrap();
        assert!(!dead.exists());
        for d in [&other_host, &extended, &old, &target] {
            assert!(d.is_dir(), "{}", d.display());
        }
        assert!(target.join("keep").exists());
        assert!(std::fs::symlink_metadata(&link).is_ok());
        let path = live.path().to_path_buf();
        drop(live);
        assert!(!path.exists());
    }

    #[test]
    fn a_scratch_directory_sweeps_and_is_swept_as_a_spill_directory() {
        let parent = tempfile::tempdir().unwrap();
        let dead = parent
            .path()
            .join(format!("{PREFIX}{}-1-deadcopy", host_tag()));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("outcore-x.npy"), b"x").unwrap();
        let scratch = ScratchDir::create(Some(parent.path())).unwrap();
        assert!(!dead.exists());
        let path = scratch.path().to_path_buf();
        std::fs::write(path.join("outcore-y.npy"), b"y").unwrap();
        // Alive: a runtime's sweep leaves it.
        let store = PrivateDir::create(parent.path()).unwrap();
        assert!(path.join("outcore-y.npy").exists());
        drop(store);
        drop(scratch);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }
}
