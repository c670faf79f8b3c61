//! The trap: what happens when an allocation would exceed the soft cap or
//! jemalloc returns null.
//!
//! Only one thread evicts on behalf of the allocator at a time (it holds the
//! *token*). Other threads that trap meanwhile wait on a futex until the
//! token is released, then retry. Nothing here allocates, panics, or blocks
//! on a lock: waiting is a futex wait with a timeout, and evictors only
//! try-lock.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::account::{self, BypassGuard, COUNTERS, NO_CAP};
use super::linebuf::LineBuf;
use super::slots::Slots;
use super::{claim, headroom, jemalloc, reserve};

/// Something that can free memory by evicting executors: implemented by the
/// runtime.
///
/// The caller (the trap) guarantees it calls [`Evictor::evict_for_trap`]
/// inside a bypass scope and from one thread at a time. The implementation
/// MUST NOT block on a lock that an allocating thread may hold (try-lock
/// and skip instead), and MUST NOT panic.
pub(crate) trait Evictor: Send + Sync {
    /// Evicts idle executors until at least `bytes` are freed or nothing is
    /// left to evict. Returns the bytes freed, and whether something could
    /// not be examined because another thread held its lock (contention,
    /// not exhaustion: the trap retries).
    fn evict_for_trap(&self, bytes: usize) -> Freed;
    /// Number of executors pinned by running tasks (for the diagnostic).
    fn pinned(&self) -> usize;
    /// A counter that changes whenever an executor may have become
    /// evictable; the trap skips fruitless rescans while it is unchanged.
    fn generation(&self) -> u64;
    /// The soft cap this runtime asks for.
    fn cap(&self) -> Option<usize>;
    /// Adds what the out-of-memory diagnostic should say about this
    /// evictor beyond the pinned count (for example, that its spill writes
    /// are failing). The implementation MUST NOT allocate.
    fn describe(&self, out: &mut LineBuf);
}

/// What one trap eviction achieved.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Freed {
    /// Bytes freed.
    pub bytes: usize,
    /// A lock the evictor needed was held by another thread.
    pub busy: bool,
}

pub(super) struct Entry {
    evictor: Arc<dyn Evictor>,
    /// `generation()` at the last trap that freed nothing.
    fruitless_at: AtomicU64,
    /// [`FORKS`] when it registered: an entry registered before a `fork()`
    /// belongs to the parent, whose threads and spill files the child must
    /// not use, so the child's traps skip it.
    forks: u64,
}

/// `fork()`s this process descends through: bumped in the child.
static FORKS: AtomicU64 = AtomicU64::new(0);

const SLOTS: usize = 64;

/// The registered evictors (see `slots.rs` for the memory protocol).
static REGISTRY: Slots<Entry, SLOTS> = Slots::new();
/// 1 while a thread evicts on behalf of the allocator.
static TOKEN: AtomicU32 = AtomicU32::new(0);
/// Bumped when the token is released; waiters futex-wait on it.
static EPOCH: AtomicU32 = AtomicU32::new(0);

/// In the child of a `fork()`: only the forking thread exists, so no other
/// thread holds the token or reads the registry. The runtimes registered so
/// far are the parent's: the child's traps no longer ask them to evict
/// (their spill files are the parent's; writing them would overwrite the
/// parent's executors). Called by the `pthread_atfork` child handler
/// (`register.rs`): it only stores to atomics.
pub(super) fn reset_after_fork() {
    FORKS.fetch_add(1, Ordering::AcqRel);
    REGISTRY.reset_readers();
    EPOCH.fetch_add(1, Ordering::SeqCst);
    TOKEN.store(0, Ordering::SeqCst);
}

/// A registry entry for `evictor`, made before `register.rs` takes its
/// lock (it allocates).
pub(super) fn new_entry(evictor: Arc<dyn Evictor>) -> Box<Entry> {
    Box::new(Entry {
        evictor,
        fruitless_at: AtomicU64::new(u64::MAX),
        forks: FORKS.load(Ordering::Acquire),
    })
}

/// Adds `entry` to the registry of evictors; its slot, or `None` when all
/// are taken.
pub(super) fn insert(entry: Box<Entry>) -> Option<usize> {
    let slot = REGISTRY.insert(entry).ok()?;
    recompute_cap();
    Some(slot)
}

/// Takes the evictor in `slot` out of the registry, once no trap can still
/// be looking at it (a store-buffer pattern, hence SeqCst: see `slots.rs`
/// and README.md, "Memory orderings"). Returns whether an evictor of this
/// process (not counting a parent's, inherited across a `fork()`) is left.
pub(super) fn remove(slot: usize) -> bool {
    drop(REGISTRY.remove(slot));
    recompute_cap();
    with_entries(|_| true)
}

fn recompute_cap() {
    let mut cap: Option<usize> = None;
    with_entries(|e| {
        if let Some(c) = e.evictor.cap() {
            cap = Some(cap.map_or(c, |m: usize| m.min(c)));
        }
        false
    });
    account::set_soft_cap(cap);
    // Called from registration only (never from the allocator).
    if KEEP_DIRTY.swap(cap.is_some(), Ordering::AcqRel) != cap.is_some() {
        jemalloc::keep_dirty_pages(cap.is_some());
    }
}

/// Whether freed pages are being kept for reuse (a capped runtime lives).
static KEEP_DIRTY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Calls `f` on each entry registered in this process (not inherited
/// across a `fork()`) until it returns true.
fn with_entries(mut f: impl FnMut(&Entry) -> bool) -> bool {
    let forks = FORKS.load(Ordering::Acquire);
    REGISTRY.any(|e| e.forks == forks && f(e))
}

fn any_registered() -> bool {
    REGISTRY.occupied()
}

/// Asks the registered evictors to free `bytes`. Returns the bytes freed.
fn evict(bytes: usize, skip_fruitless: bool) -> Freed {
    let _bypass = BypassGuard::new();
    let mut freed = 0usize;
    let mut busy = false;
    with_entries(|e| {
        let gen = e.evictor.generation();
        if skip_fruitless && e.fruitless_at.load(Ordering::Relaxed) == gen {
            return false;
        }
        // No panic may leave the allocator: the evictor catches user code's
        // panics itself; this is the last line.
        let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            e.evictor.evict_for_trap(bytes.saturating_sub(freed))
        }))
        .unwrap_or_default();
        if got.bytes == 0 && !got.busy {
            e.fruitless_at.store(gen, Ordering::Relaxed);
        } else {
            e.fruitless_at.store(u64::MAX, Ordering::Relaxed);
        }
        busy |= got.busy;
        freed = freed.saturating_add(got.bytes);
        freed >= bytes
    });
    if freed > 0 {
        jemalloc::purge();
    }
    Freed { bytes: freed, busy }
}

/// How long the hard trap keeps retrying while evictors report only
/// contention (another thread holds a lock they need).
const BUSY_PATIENCE: Duration = Duration::from_secs(5);

fn pinned_total() -> usize {
    let mut n = 0;
    with_entries(|e| {
        n += e.evictor.pinned();
        false
    });
    n
}

fn try_take_token() -> bool {
    TOKEN
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

fn release_token() {
    EPOCH.fetch_add(1, Ordering::Release);
    TOKEN.store(0, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a valid, aligned, static u32; no other memory
    // is touched.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            EPOCH.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        );
    }
}

/// Waits (without allocating) until the current token holder releases it,
/// or 50 ms pass.
fn wait_for_token(epoch: u32) {
    let start = Instant::now();
    while TOKEN.load(Ordering::Acquire) != 0 && EPOCH.load(Ordering::Acquire) == epoch {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 5_000_000,
        };
        // SAFETY: FUTEX_WAIT on a valid static u32 with a valid timeout; it
        // returns at once if the value is no longer `epoch`.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                EPOCH.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                epoch,
                &ts as *const libc::timespec,
            );
        }
        if start.elapsed().as_millis() > 50 {
            break;
        }
    }
    COUNTERS
        .wait_nanos
        .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// Extra bytes evicted beyond the overshoot, so that the next allocations do
/// not trap again at once: 1/32 of the cap, at least 1 MiB.
fn slack(cap: usize) -> usize {
    (cap / 32).max(1 << 20)
}

/// The soft trap: usage `used` went over `cap` after accounting `size`
/// bytes. Evicts, or waits for the thread that is evicting and then checks
/// again (the other thread may not have freed enough for both). If nothing
/// can be evicted, the allocation goes ahead over the cap and the overshoot
/// is counted.
#[cold]
pub(super) fn soft(used: usize, cap: usize, size: usize) {
    if !any_registered() {
        return;
    }
    let mut used = used;
    for _ in 0..8 {
        let epoch = EPOCH.load(Ordering::Acquire);
        if try_take_token() {
            let start = Instant::now();
            COUNTERS.soft_traps.fetch_add(1, Ordering::Relaxed);
            let want = used
                .saturating_sub(cap)
                .saturating_add(slack(cap))
                .max(size);
            let freed = evict(want, true);
            if freed.bytes == 0 {
                COUNTERS.overshoots.fetch_add(1, Ordering::Relaxed);
            }
            COUNTERS
                .trap_nanos
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            release_token();
            // Given up under a lock since the last hard trap: take it back
            // now if the address space is there (one failed `mmap` if not).
            headroom::restore();
            return;
        }
        wait_for_token(epoch);
        used = account::current_usage();
        if used <= cap {
            return;
        }
    }
}

/// The hard trap: jemalloc returned null for `size` bytes. Evicts and
/// retries with `retry` until it succeeds or nothing is left to evict.
#[cold]
pub(super) fn hard(size: usize, retry: &impl Fn() -> *mut u8, layout: Layout) -> *mut u8 {
    // A load that claimed its room first: the room is here (`claim.rs`).
    if claim::release_own() {
        let p = retry();
        if !p.is_null() {
            return p;
        }
    }
    if account::bypassing() {
        // No trap in a bypass scope. Inside an eviction, the memory set
        // aside at start-up serves it: those blocks are all freed when the
        // eviction ends, so the reserve resets. A long-lived allocation
        // (one made while holding a runtime lock) never comes from it: it
        // would keep the reserve from ever resetting.
        if account::evicting() {
            let p = reserve::alloc(layout);
            if !p.is_null() {
                COUNTERS.reserve_allocs.fetch_add(1, Ordering::Relaxed);
                return p;
            }
        }
        // The address space held back for this (see `headroom.rs`): the
        // next trap outside a bypass scope evicts to take it back.
        if headroom::release() {
            COUNTERS.headroom_releases.fetch_add(1, Ordering::Relaxed);
            return retry();
        }
        return std::ptr::null_mut();
    }
    if !any_registered() {
        return std::ptr::null_mut();
    }
    COUNTERS.hard_traps.fetch_add(1, Ordering::Relaxed);
    let cap = account::cap_raw();
    let want = size
        .saturating_mul(2)
        .saturating_add(if cap == NO_CAP { 16 << 20 } else { slack(cap) })
        .saturating_add(headroom::missing());
    // Bounded: each round frees something, waits out contention for a
    // while, or gives up.
    let mut busy_since: Option<Instant> = None;
    for _ in 0..100_000 {
        let epoch = EPOCH.load(Ordering::Acquire);
        if try_take_token() {
            let start = Instant::now();
            let freed = evict(want, false);
            COUNTERS
                .trap_nanos
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            release_token();
            // The headroom first, if it was given up: it is what lets the
            // next allocation under a runtime lock succeed.
            headroom::restore();
            let p = retry();
            if !p.is_null() {
                return p;
            }
            if freed.bytes > 0 {
                busy_since = None;
            } else if freed.busy {
                // Contention is not exhaustion: the lock holder will let go.
                let since = *busy_since.get_or_insert(start);
                if since.elapsed() > BUSY_PATIENCE {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            } else {
                break;
            }
        } else {
            wait_for_token(epoch);
            let p = retry();
            if !p.is_null() {
                return p;
            }
        }
    }
    // Nothing left to evict: the headroom is better spent than the process.
    if headroom::release() {
        COUNTERS.headroom_releases.fetch_add(1, Ordering::Relaxed);
        let p = retry();
        if !p.is_null() {
            return p;
        }
    }
    COUNTERS.failures.fetch_add(1, Ordering::Relaxed);
    diagnose(size);
    std::ptr::null_mut()
}

/// Eviction on behalf of C code (the LD_PRELOAD shim): evicts `bytes`
/// with the allocator's token, or waits for the thread holding it. Returns
/// the bytes freed (1 when another thread's eviction ran meanwhile, so the
/// caller retries).
pub(crate) fn evict_external(bytes: usize) -> usize {
    if account::bypassing() || !any_registered() {
        return 0;
    }
    let epoch = EPOCH.load(Ordering::Acquire);
    if try_take_token() {
        let start = Instant::now();
        // Skip evictors that had nothing to give and have not changed since:
        // C code over its cap calls in on every allocation.
        let freed = evict(bytes, true);
        COUNTERS
            .trap_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        release_token();
        // Contention: ask the caller to retry.
        if freed.bytes == 0 && freed.busy {
            1
        } else {
            freed.bytes
        }
    } else {
        wait_for_token(epoch);
        1
    }
}

/// Writes one line to stderr without allocating, for a request refused
/// without eviction: larger than the hard limit, or than the cap and what
/// the limit leaves (see `grow_hopeless`).
pub(super) fn diagnose_refusal(size: usize) {
    let mut buf = LineBuf::new();
    buf.prefix();
    buf.push(b"out of memory: allocation of ");
    buf.num(size as u64);
    if size > account::hard_limit() {
        buf.push(
            b" bytes refused without evicting: no eviction can make it fit under the limit of ",
        );
    } else {
        // Larger than the cap: tried once, as it is, without evicting.
        buf.push(b" bytes, more than the cap, failed without evicting under the limit of ");
    }
    buf.num(account::hard_limit() as u64);
    buf.push(b" bytes (");
    push_usage(&mut buf);
    buf.push(b")\n");
    buf.write_stderr();
}

/// "N bytes in use, cap C bytes" (or "cap none").
fn push_usage(buf: &mut LineBuf) {
    buf.num(account::current_usage() as u64);
    buf.push(b" bytes in use, cap ");
    match account::soft_cap() {
        Some(c) => {
            buf.num(c as u64);
            buf.push(b" bytes");
        }
        None => buf.push(b"none"),
    }
}

/// Writes one line to stderr without allocating: the request, the usage,
/// the cap and the pinned executors.
pub(super) fn diagnose(size: usize) {
    let mut buf = LineBuf::new();
    buf.prefix();
    buf.push(b"out of memory: allocation of ");
    buf.num(size as u64);
    buf.push(b" bytes failed with ");
    push_usage(&mut buf);
    buf.push(b"; nothing left to evict, ");
    buf.num(pinned_total() as u64);
    buf.push(b" executor(s) pinned by running tasks");
    with_entries(|e| {
        e.evictor.describe(&mut buf);
        false
    });
    buf.push(b"\n");
    buf.write_stderr();
}
