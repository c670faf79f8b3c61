//! [`Builder`]: configuring and starting a [`Runtime`].

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::prefetch::{prefetch_loop, prefetchers};
use super::shared::{Others, Shared};
use super::Runtime;
use crate::alloc::{self, Evictor, Registration};
use crate::cap::MemoryCap;
use crate::error::{Error, Result};
use crate::policy::EvictionPolicy;
use crate::spill::{Reclaim, SpillStore, SpillTier};

/// The most worker threads a runtime starts. Each thread takes a stack and
/// the standard library's signal stack, mapped separately; tens of
/// thousands of them exhaust the process's memory maps, and a thread that
/// cannot map its signal stack aborts the process instead of failing to
/// start. Tasks wait for memory and disk, not only for cores, but beyond
/// a thousand threads they only contend.
pub const MAX_WORKERS: usize = 1024;

/// Configures and builds a [`Runtime`].
///
/// ```
/// use outcore::{EvictionPolicy, MemoryCap, Runtime};
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
/// let rt = Runtime::builder()
///     .mem_cap(MemoryCap::parse("512MiB")?)
///     .workers(2)
///     .policy(EvictionPolicy::Priority)
///     .build()?;
/// assert_eq!(rt.workers(), 2);
/// # Ok::<(), outcore::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Builder {
    cap: MemoryCap,
    workers: Option<usize>,
    policy: EvictionPolicy,
    spill_dir: Option<PathBuf>,
    prefetch: bool,
    stop_when_cap_lost: bool,
    tier: Option<TierRef>,
    reclaim: Option<ReclaimRef>,
}

/// The memory held for others a builder was given.
#[derive(Clone)]
struct ReclaimRef(Arc<dyn Reclaim>);

impl std::fmt::Debug for ReclaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reclaim")
    }
}

/// The spill tier a builder was given (printed by its name).
#[derive(Clone)]
struct TierRef(Arc<dyn SpillTier>);

impl std::fmt::Debug for TierRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SpillTier").field(&self.0.name()).finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            cap: MemoryCap::None,
            workers: None,
            policy: EvictionPolicy::Priority,
            spill_dir: None,
            prefetch: true,
            stop_when_cap_lost: true,
            tier: None,
            reclaim: None,
        }
    }
}

/// Threads started so far while building; on drop (a failed build) it
/// stops and joins them, so nothing is left waiting forever. Defused when
/// the runtime is complete.
struct StartGuard {
    shared: Arc<Shared>,
    registration: Option<Registration>,
    threads: Vec<JoinHandle<()>>,
    prefetchers: Vec<JoinHandle<()>>,
    /// Set once the runtime owns the threads.
    done: bool,
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        stop(
            &self.shared,
            &mut self.registration,
            &mut self.threads,
            &mut self.prefetchers,
        );
    }
}

/// Stops a runtime's threads: unregisters from the trap first (no more
/// evictions from the allocator), then shuts the pool down and joins.
pub(super) fn stop(
    shared: &Shared,
    registration: &mut Option<Registration>,
    threads: &mut Vec<JoinHandle<()>>,
    prefetchers: &mut Vec<JoinHandle<()>>,
) {
    registration.take();
    shared.pool().shut_down();
    shared.stop_prefetchers();
    for t in threads.drain(..).chain(prefetchers.drain(..)) {
        let _ = t.join();
    }
}

impl Builder {
    /// The soft memory cap (default: none; a hard limit still traps).
    pub fn mem_cap(mut self, cap: MemoryCap) -> Self {
        self.cap = cap;
        self
    }

    /// Worker threads (default: one per core; at most [`MAX_WORKERS`]).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n.max(1));
        self
    }

    /// The eviction policy (default: [`EvictionPolicy::Priority`]).
    pub fn policy(mut self, p: EvictionPolicy) -> Self {
        self.policy = p;
        self
    }

    /// Where spill files go: a private subdirectory (mode 0700, with an
    /// unpredictable name) is created inside `dir` (default: `TMPDIR`, or
    /// `/tmp`; `/var/tmp` instead when `/tmp` is held in memory, tmpfs,
    /// and `/var/tmp` is on a disk). It is removed when the runtime is dropped,
    /// and by the next runtime of the same host when its process was
    /// killed. `dir` must not be a symbolic link, be owned by another user
    /// than this one or root, or be writable by everyone without the
    /// sticky bit.
    pub fn spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_dir = Some(dir.into());
        self
    }

    /// Load upcoming executors in the background, two at a time (one under
    /// an address-space limit, `RLIMIT_AS`) (default: on).
    pub fn prefetch(mut self, on: bool) -> Self {
        self.prefetch = on;
        self
    }

    /// What to do when spill writes keep failing (a full or read-only
    /// spill filesystem) and the memory in use grows past the cap by more
    /// than an eighth (at least 1 MiB). On (the default), the runtime
    /// stops: tasks not started by then fail with [`Error::CapLost`], and
    /// the executors stay as they were. Off, the executors whose writes
    /// fail stay in memory and tasks go on over the cap;
    /// [`Runtime::last_spill_error`](crate::Runtime::last_spill_error)
    /// tells why. Without a cap there is nothing to keep.
    pub fn stop_when_cap_lost(mut self, on: bool) -> Self {
        self.stop_when_cap_lost = on;
        self
    }

    /// A place for evicted executors besides the spill directory, tried
    /// first (default: none): see [`SpillTier`]. The disk still takes the
    /// evictions made inside the allocation trap, and every write of an
    /// executor changed since its last one, so the tier is never the only
    /// copy of a value.
    pub fn spill_tier(mut self, tier: Arc<dyn SpillTier>) -> Self {
        self.tier = Some(TierRef(tier));
        self
    }

    /// Memory the process holds for others, given back before the
    /// runtime evicts its own executors to make room (default: none): see
    /// [`Reclaim`].
    pub fn reclaim(mut self, held: Arc<dyn Reclaim>) -> Self {
        self.reclaim = Some(ReclaimRef(held));
        self
    }

    /// Starts the runtime: creates the spill directory, registers with the
    /// allocator and starts the workers and the prefetchers. If anything
    /// fails part-way, the threads already started are stopped and the
    /// spill directory is removed.
    ///
    /// # Errors
    ///
    /// - [`Error::AllocatorNotInstalled`] when a cap is set but
    ///   [`TrapAlloc`](crate::TrapAlloc) is not the global allocator;
    /// - [`Error::SpillDir`] when the spill directory is missing or not
    ///   writable;
    /// - [`Error::SpillDirUnsafe`] when other users could tamper with the
    ///   spill directory (see [`Builder::spill_dir`]);
    /// - [`Error::Runtime`] when threads cannot be started.
    pub fn build(self) -> Result<Runtime> {
        let cap = self.cap.resolve();
        if let Some(cap) = cap {
            if !alloc::installed() {
                return Err(Error::AllocatorNotInstalled { cap });
            }
        }
        if let Some(n) = self.workers.filter(|&n| n > MAX_WORKERS) {
            return Err(Error::Runtime(format!(
                "{n} worker threads asked for, {MAX_WORKERS} at most"
            )));
        }
        let store = SpillStore::new(self.spill_dir.as_deref())?;
        let workers = self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        });
        let shared = Shared::new(
            cap,
            self.policy,
            store,
            workers,
            self.prefetch,
            self.stop_when_cap_lost,
            Others {
                tier: self.tier.map(|t| t.0),
                reclaim: self.reclaim.map(|r| r.0),
            },
        );
        let mut guard = StartGuard {
            shared: shared.clone(),
            registration: None,
            threads: Vec::with_capacity(workers),
            prefetchers: Vec::new(),
            done: false,
        };
        // The threads first: under an address-space limit, their stacks
        // must fit before the trap sets address space aside (the reserve
        // and the headroom, taken only where they fit).
        let prefetchers = if self.prefetch { prefetchers() } else { 0 };
        for i in 0..workers {
            let sh = shared.clone();
            guard.threads.push(start_thread(
                format!("outcore-worker-{i}"),
                || format!("worker thread {i} of {workers}"),
                move || super::pool::worker_loop(sh.pool()),
            )?);
        }
        for i in 0..prefetchers {
            let sh = shared.clone();
            guard.prefetchers.push(start_thread(
                format!("outcore-prefetch-{i}"),
                || format!("prefetch thread {i}"),
                move || prefetch_loop(sh),
            )?);
        }
        guard.registration = Some(
            alloc::register(
                shared.clone() as Arc<dyn Evictor>,
                crate::cap::hard_limits(),
            )
            .ok_or_else(|| {
                Error::Runtime("too many runtimes alive in this process (64 at most)".into())
            })?,
        );
        guard.done = true;
        Ok(Runtime {
            shared,
            registration: guard.registration.take(),
            threads: std::mem::take(&mut guard.threads),
            prefetchers: std::mem::take(&mut guard.prefetchers),
            workers,
        })
    }
}

/// Why a runtime's thread could not start, with the address-space limit
/// when one is set (a thread's stack is address space).
fn thread_error(what: &str, e: &std::io::Error) -> Error {
    match crate::cap::rlimit_as() {
        Some(limit) => Error::Runtime(format!(
            "cannot start {what} under an address-space limit (RLIMIT_AS) of {}: {e}",
            crate::units::format_bytes(limit),
        )),
        None => Error::Runtime(format!("cannot start {what}: {e}")),
    }
}

/// Starts one of the runtime's threads, named `name`, running `f`, and
/// waits until it runs: the C library maps a thread's stack at the spawn,
/// but std maps its signal stack only once the thread starts, and a
/// thread that started late, after the next threads' stacks and the
/// trap's reserve took the address space, could not map it and aborted
/// the process (a build under `RLIMIT_AS` in tests/hard_limit.rs, on a
/// loaded machine). `what` names the thread in an error.
fn start_thread(
    name: String,
    what: impl FnOnce() -> String,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>> {
    let (started, running) = std::sync::mpsc::channel::<()>();
    let t = thread_room()
        .and_then(|()| {
            std::thread::Builder::new().name(name).spawn(move || {
                let _ = started.send(());
                f()
            })
        })
        .map_err(|e| thread_error(&what(), &e))?;
    // An error only when the thread ended without sending (it cannot
    // fail otherwise): there is nothing to wait for then.
    let _ = running.recv();
    Ok(t)
}

/// Under an address-space limit, whether a thread's stack fits: a thread
/// that starts and then cannot map its signal stack panics where nothing
/// can catch it, and the process aborts. A thread counts its stack
/// (`RUST_MIN_STACK`, or the standard library's 2 MiB) and 256 KiB for
/// its guard page, signal stack and first allocations.
fn thread_room() -> std::io::Result<()> {
    if crate::cap::rlimit_as().is_none() {
        return Ok(());
    }
    let stack = std::env::var("RUST_MIN_STACK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2 << 20);
    if alloc::address_space_free(stack.saturating_add(256 << 10)) {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::OutOfMemory,
        "no address space left for its stack",
    ))
}
