//! The spill directory: a killed runtime's directory is removed by the
//! next runtime of the host, a live runtime's never is (in the same
//! process, in another process, in a child it forked), and a parent
//! directory other users could tamper with is refused.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::is_child;
use outcore::{Error, Runtime};

/// Held by each test that kills a runtime or starts many: they run one at
/// a time, so that one's runtimes and forks (this process's fork handler,
/// its lock descriptors) never overlap another's kill-and-sweep check.
/// `a_killed_runtimes_children_do_not_keep_its_spill_directory` failed
/// once in CI while the test starting 360 runtimes ran beside it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The parent directory a child process spills into.
const PARENT_VAR: &str = "OUTCORE_TEST_SPILL_PARENT";

/// A child process running one test of this binary, killed (SIGKILL) by
/// a watchdog if it is still running after a minute, and on drop.
struct Spawned {
    child: Child,
    out: BufReader<ChildStdout>,
    /// Dropping it stops the watchdog.
    watchdog: Option<mpsc::Sender<()>>,
}

impl Spawned {
    fn new(test: &str, parent: &Path) -> Spawned {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("OUTCORE_TEST_CHILD", test)
            .env(PARENT_VAR, parent)
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, rx) = mpsc::channel::<()>();
        let pid = child.id() as libc::pid_t;
        std::thread::spawn(move || {
            if rx.recv_timeout(Duration::from_secs(60)) == Err(mpsc::RecvTimeoutError::Timeout) {
                // SAFETY: the child is not reaped before the sender is
                // dropped, so `pid` is still ours.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        });
        Spawned {
            child,
            out,
            watchdog: Some(tx),
        }
    }

    /// The value of the next `KEY=value` the child prints.
    fn value(&mut self, key: &str) -> String {
        self.values(&[key]).remove(0)
    }

    /// The values the child prints for `keys`, in whatever order they
    /// come (a forked child's line may come first), in `keys`' order.
    fn values(&mut self, keys: &[&str]) -> Vec<String> {
        let mut found: Vec<Option<String>> = vec![None; keys.len()];
        let mut line = String::new();
        while found.iter().any(Option::is_none) {
            line.clear();
            let n = self.out.read_line(&mut line).expect("read child");
            assert!(n > 0, "the child ended before printing {keys:?}");
            // libtest prints "test name ... " without a newline first.
            for t in line.split_whitespace() {
                for (k, f) in keys.iter().zip(found.iter_mut()) {
                    if let Some(v) = t.strip_prefix(&format!("{k}=")) {
                        *f = Some(v.to_string());
                    }
                }
            }
        }
        found.into_iter().flatten().collect()
    }

    /// Ends the child with SIGKILL and reaps it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        self.watchdog.take();
        let _ = self.child.wait();
    }

    /// Closes the child's stdin (it then drops its runtime and exits) and
    /// waits for it; whether it succeeded.
    fn finish(&mut self) -> bool {
        drop(self.child.stdin.take());
        let ok = self.child.wait().is_ok_and(|s| s.success());
        self.watchdog.take();
        ok
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.watchdog.is_some() {
            self.kill();
        }
    }
}

/// A process that is not our child, killed on drop.
struct Stray(libc::pid_t);

impl Drop for Stray {
    fn drop(&mut self) {
        // SAFETY: a plain syscall; the process is alive until killed here
        // (its parent, init, reaps it only afterwards).
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// In a child: a runtime in the parent from [`PARENT_VAR`], with one
/// executor spilled; prints its directory as `DIR=`.
fn child_runtime() -> (Runtime, outcore::Handle<Vec<u64>>) {
    let parent = std::env::var_os(PARENT_VAR).expect("parent directory");
    let rt = Runtime::builder()
        .workers(1)
        .spill_dir(parent)
        .build()
        .expect("runtime");
    let h = rt.insert(vec![7u64; 1 << 17]).expect("insert");
    rt.evict_all().expect("evict");
    println!("DIR={}", rt.spill_dir().display());
    (rt, h)
}

/// Entries of `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    v.sort();
    v
}

/// Waits in a child until the parent closes its stdin.
fn wait_for_stdin() {
    let mut s = String::new();
    let _ = std::io::stdin().read_line(&mut s);
}

/// Defect (issue 37, point 2): a run killed with SIGKILL left its whole
/// spill directory, and no later run removed it.
#[test]
fn a_killed_runtimes_spill_directory_is_removed_by_the_next_runtime() {
    let _serial = serial();
    const T: &str = "a_killed_runtimes_spill_directory_is_removed_by_the_next_runtime";
    if is_child(T) {
        let _rt = child_runtime();
        wait_for_stdin();
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let mut child = Spawned::new(T, parent.path());
    let dead = PathBuf::from(child.value("DIR"));
    child.kill();
    assert_eq!(entries(&dead).len(), 1, "the killed run's spill file");
    let rt = Runtime::builder().spill_dir(parent.path()).build().unwrap();
    assert!(
        !dead.exists(),
        "{} left after the next runtime",
        dead.display()
    );
    assert_eq!(entries(parent.path()), vec![rt.spill_dir().to_path_buf()]);
    drop(rt);
    assert!(entries(parent.path()).is_empty());
}

/// The lock of a killed run's directory is not kept by its children: one
/// it started with `exec` (the descriptor is close-on-exec) and one it
/// forked without `exec` (the fork handler drops the child's copy).
#[test]
fn a_killed_runtimes_children_do_not_keep_its_spill_directory() {
    let _serial = serial();
    const T: &str = "a_killed_runtimes_children_do_not_keep_its_spill_directory";
    if is_child(T) {
        let _rt = child_runtime();
        // Outlives this process (killed): the test kills it, init reaps it.
        #[allow(clippy::zombie_processes)]
        let sleeper = Command::new("sleep")
            .arg("300")
            .stdout(Stdio::null())
            .spawn()
            .expect("sleep");
        println!("SLEEPER={}", sleeper.id());
        // SAFETY: the child only writes, sleeps and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // Past `fork`, so the fork handler has dropped this copy of
            // the lock: say so. Until this process first runs (on a busy
            // machine, a while) its copy holds the lock, and a sweep
            // then rightly leaves the directory; the test was flaky
            // (12 of 150 runs under load) for waiting on `fork`'s return
            // in the parent instead.
            let line = b"FORK_READY=1\n";
            // SAFETY: plain syscalls, async-signal-safe; `line` outlives
            // the write.
            unsafe {
                libc::write(1, line.as_ptr().cast(), line.len());
                libc::sleep(300);
                libc::_exit(0);
            }
        }
        println!("FORKED={pid}");
        wait_for_stdin();
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let mut child = Spawned::new(T, parent.path());
    let dead = PathBuf::from(child.value("DIR"));
    let v = child.values(&["SLEEPER", "FORKED", "FORK_READY"]);
    let _sleeper = Stray(v[0].parse().unwrap());
    let _forked = Stray(v[1].parse().unwrap());
    child.kill();
    let rt = Runtime::builder().spill_dir(parent.path()).build().unwrap();
    assert!(
        !dead.exists(),
        "{} kept by the killed run's children",
        dead.display()
    );
    drop(rt);
}

/// A runtime never removes the directory of a live one: another runtime
/// of the same process, or one in another process.
#[test]
fn a_live_runtimes_spill_directory_is_left_alone() {
    let _serial = serial();
    const T: &str = "a_live_runtimes_spill_directory_is_left_alone";
    if is_child(T) {
        let (rt, h) = child_runtime();
        wait_for_stdin();
        // Still there, intact, when the parent lets go.
        assert_eq!(rt.read(&h, |v| v.iter().sum::<u64>()).unwrap(), 7 << 17);
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let mut child = Spawned::new(T, parent.path());
    let theirs = PathBuf::from(child.value("DIR"));
    let first = Runtime::builder().spill_dir(parent.path()).build().unwrap();
    let h = first.insert(vec![3u32; 1 << 16]).unwrap();
    first.evict_all().unwrap();
    let second = Runtime::builder().spill_dir(parent.path()).build().unwrap();
    assert_ne!(first.spill_dir(), second.spill_dir());
    assert_eq!(entries(first.spill_dir()).len(), 1);
    assert_eq!(entries(&theirs).len(), 1);
    let sum = first.read(&h, |v| v.iter().map(|&x| u64::from(x)).sum::<u64>());
    assert_eq!(sum.unwrap(), 3 << 16);
    assert!(child.finish(), "the other process lost its spill file");
    assert!(!theirs.exists(), "removed by its own runtime on exit");
    drop((h, first, second));
    assert!(entries(parent.path()).is_empty());
}

/// Builds a runtime spilling into `dir`; the error, if any.
fn build_in(dir: &Path) -> Option<Error> {
    Runtime::builder().spill_dir(dir).build().err()
}

/// Defect (issue 37, point 5): a symbolic link as the spill directory was
/// followed.
#[test]
fn a_symbolic_link_as_spill_directory_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let real = t.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = build_in(&link).expect("refused");
    assert!(matches!(err, Error::SpillDirUnsafe { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&*link.to_string_lossy()), "{msg}");
    assert!(msg.contains("symbolic link"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(entries(&real).is_empty());
    assert!(build_in(&real).is_none());
}

/// Defect (issue 37, point 5): a directory of another user was used.
#[test]
fn a_spill_directory_of_another_user_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let theirs = t.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    let path = std::ffi::CString::new(theirs.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path valid for the call.
    if unsafe { libc::chown(path.as_ptr(), 12345, 12345) } != 0 {
        eprintln!("skipped: chown needs root");
        return;
    }
    let err = build_in(&theirs).expect("refused");
    assert!(matches!(err, Error::SpillDirUnsafe { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&*theirs.to_string_lossy()), "{msg}");
    assert!(msg.contains("uid 12345"), "{msg}");
    assert!(entries(&theirs).is_empty());
}

/// Defect (issue 37, point 5): a directory everyone can write without the
/// sticky bit (anyone could rename or replace the spill directory) was
/// used. With the sticky bit, as `/tmp`, it is fine.
#[test]
fn a_world_writable_spill_directory_needs_the_sticky_bit() {
    let t = tempfile::tempdir().unwrap();
    let open = t.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = build_in(&open).expect("refused");
    assert!(matches!(err, Error::SpillDirUnsafe { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&*open.to_string_lossy()), "{msg}");
    assert!(msg.contains("sticky"), "{msg}");
    assert!(entries(&open).is_empty());
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let rt = Runtime::builder().spill_dir(&open).build().unwrap();
    let mode = std::fs::metadata(rt.spill_dir())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o700);
}

/// Runtimes started at once in one parent: each one's sweep runs while
/// the others create their directories, and never takes one being made.
/// A sweeper used to remove a directory between its `mkdir` and its
/// lock, and the runtime being built failed ("No such file or
/// directory"), as a CI run of two test binaries sharing /tmp did.
#[test]
fn runtimes_started_at_once_in_one_parent_all_start() {
    let _serial = serial();
    let parent = tempfile::tempdir().unwrap();
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                for _ in 0..60 {
                    let rt = Runtime::builder()
                        .spill_dir(parent.path())
                        .workers(1)
                        .build();
                    if let Err(e) = rt {
                        panic!("a runtime did not start: {e}");
                    }
                }
            });
        }
    });
    assert!(entries(parent.path()).is_empty());
}
