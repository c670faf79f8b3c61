//! Accounting: per-thread deltas flushed to one global counter, the peak,
//! the soft cap, bypass scopes, and the process-wide trap counters.
//!
//! Everything here is reachable from inside `GlobalAlloc`: no locks, no
//! allocation, no panics; thread-locals are `const`-initialised and have no
//! destructor.

use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Per-thread deltas are flushed to the global counter once they pass the
/// flush threshold, so the shared cache line is touched about once per
/// threshold's worth of allocation traffic instead of on every call. The
/// threshold is 1/256 of the cap, clamped to 64 KiB..4 MiB (4 MiB with no
/// cap): small caps get precise accounting, large ones cheap accounting.
const MIN_FLUSH: isize = 64 * 1024;
const MAX_FLUSH: isize = 4 << 20;

/// "No cap" is stored as `usize::MAX`.
pub(super) const NO_CAP: usize = usize::MAX;

/// Per-thread accounting, in one thread-local so each call touches it once.
struct Local {
    /// Bytes allocated (positive) or freed (negative) by this thread and not
    /// yet added to [`USED`].
    pending: Cell<isize>,
    /// Net bytes this thread has flushed to [`USED`] since it started; with
    /// `pending`, what it has allocated net (used to measure the size of an
    /// executor while it is built or loaded). Updated only on a flush, so
    /// the hot path touches one cell.
    net: Cell<i64>,
    /// [`UNHOOKED`], [`HOOKED`] or [`EXITING`]: whether the thread-exit
    /// flush is registered for this thread, or running.
    exit: Cell<u8>,
}

/// The value of `pending` while the thread is not [`HOOKED`]: far outside
/// any threshold, so every call takes the (cold) flush branch, which
/// registers the exit flush or, once the thread exits, publishes directly.
/// The hot path thus checks nothing more than the threshold.
const SENTINEL: isize = isize::MIN / 2;

/// The thread has not registered its exit flush yet.
const UNHOOKED: u8 = 0;
/// The exit flush is registered.
const HOOKED: u8 = 1;
/// The thread is exiting: deltas go straight to [`USED`].
const EXITING: u8 = 2;

thread_local! {
    static LOCAL: Local = const {
        Local { pending: Cell::new(SENTINEL), net: Cell::new(0), exit: Cell::new(UNHOOKED) }
    };
    /// Depth of "bypass" scopes on this thread: eviction in progress, or a
    /// runtime lock held. Allocations in such a scope never enter the trap.
    static BYPASS: Cell<u32> = const { Cell::new(0) };
    /// Net bytes this thread's evictions allocated (negative: freed), and
    /// the depth of eviction scopes; see [`EvictScope`].
    static EVICTED: (Cell<i64>, Cell<u32>) = const { (Cell::new(0), Cell::new(0)) };
}

/// Keeps a hot counter on a cache line of its own (no false sharing).
#[repr(align(128))]
struct Line<T>(T);

/// Accounted bytes in use by the whole process (sum of flushed deltas).
static USED: Line<AtomicIsize> = Line(AtomicIsize::new(0));
/// Highest value [`USED`] has reached.
static PEAK: Line<AtomicUsize> = Line(AtomicUsize::new(0));
/// Soft cap in bytes ([`NO_CAP`] when none), and the flush threshold; both
/// read-mostly.
static CAP: Line<AtomicUsize> = Line(AtomicUsize::new(NO_CAP));
/// Read-mostly tuning on one line: the flush threshold, and the size above
/// which a request is hopeless (larger than the cap or the hard limit: no
/// eviction can make it fit, so it neither traps nor is accounted before
/// it succeeds).
struct Tuning {
    flush: AtomicIsize,
    hopeless: AtomicUsize,
}
static TUNING: Line<Tuning> = Line(Tuning {
    flush: AtomicIsize::new(MAX_FLUSH),
    hopeless: AtomicUsize::new(usize::MAX),
});
/// The hard limit the process runs under (`RLIMIT_AS`, or physical memory
/// plus swap), as the runtime read it when it registered.
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Physical memory plus swap: a request larger than this is one no machine
/// like this one could meet (a probe, such as a `try_reserve` of an
/// absurd size), refused without a diagnostic.
static MACHINE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Process-wide trap counters (the runtime adds its own per-runtime ones).
pub(crate) struct TrapCounters {
    pub soft_traps: AtomicU64,
    pub hard_traps: AtomicU64,
    pub trap_nanos: AtomicU64,
    pub wait_nanos: AtomicU64,
    pub overshoots: AtomicU64,
    pub reserve_allocs: AtomicU64,
    pub headroom_releases: AtomicU64,
    pub failures: AtomicU64,
    pub refusals: AtomicU64,
}

pub(crate) static COUNTERS: TrapCounters = TrapCounters {
    soft_traps: AtomicU64::new(0),
    hard_traps: AtomicU64::new(0),
    trap_nanos: AtomicU64::new(0),
    wait_nanos: AtomicU64::new(0),
    overshoots: AtomicU64::new(0),
    reserve_allocs: AtomicU64::new(0),
    headroom_releases: AtomicU64::new(0),
    failures: AtomicU64::new(0),
    refusals: AtomicU64::new(0),
};

/// Whether the calling thread is in a bypass scope (or its thread-locals
/// are gone, when it is exiting).
#[inline]
pub(super) fn bypassing() -> bool {
    BYPASS.try_with(|b| b.get() > 0).unwrap_or(true)
}

/// What accounting a change did.
pub(super) enum Accounted {
    /// Kept in the thread's pending bytes.
    Kept,
    /// Flushed: the process's usage is now this.
    Flushed(usize),
    /// Not accounted: the request is hopeless (see [`hopeless_above`]).
    Hopeless,
}

/// Adds `delta` to this thread's pending bytes and flushes past the
/// threshold. Returns the new global usage when a flush happened.
#[inline]
pub(super) fn account(delta: isize) -> Option<usize> {
    match account_request(delta, 0) {
        Accounted::Flushed(used) => Some(used),
        _ => None,
    }
}

/// [`account`] for a request of `size` bytes growing memory by `delta`:
/// when the change would flush and `size` is hopeless, nothing is
/// accounted. The check runs only on the flush branch (a hopeless request
/// is larger than the cap, hence than any flush threshold), so the hot
/// path is that of [`account`].
#[inline]
pub(super) fn account_request(delta: isize, size: usize) -> Accounted {
    let threshold = TUNING.0.flush.load(Ordering::Relaxed);
    let flushed = LOCAL.try_with(|l| {
        let v = l.pending.get().wrapping_add(delta);
        if within(v, threshold) {
            l.pending.set(v);
            return Accounted::Kept;
        }
        if size > hopeless_above() {
            return Accounted::Hopeless;
        }
        let v = if l.exit.get() == HOOKED {
            l.pending.set(0);
            v
        } else {
            // `pending` held the sentinel: the delta alone is new.
            unhooked(l);
            delta
        };
        l.net.set(l.net.get().wrapping_add(v as i64));
        Accounted::Flushed(v as usize)
    });
    let v = match flushed {
        Ok(Accounted::Flushed(v)) => v as isize,
        Ok(other) => return other,
        // Thread-local storage unavailable: account directly.
        Err(_) => delta,
    };
    let used = USED.0.fetch_add(v, Ordering::Relaxed).wrapping_add(v);
    Accounted::Flushed(if used < 0 { 0 } else { used as usize })
}

/// The hot path: adds `delta` to this thread's pending bytes when the sum
/// stays within the flush threshold, and returns whether it did. When it
/// returns `false` nothing changed, and the caller takes the flush path
/// ([`account_request`]). Kept small so the allocator's fast path needs no
/// stack frame beyond jemalloc's call.
#[inline(always)]
pub(super) fn keep(delta: isize) -> bool {
    let threshold = TUNING.0.flush.load(Ordering::Relaxed);
    LOCAL
        .try_with(|l| {
            let v = l.pending.get().wrapping_add(delta);
            let kept = within(v, threshold);
            if kept {
                l.pending.set(v);
            }
            kept
        })
        .unwrap_or(false)
}

/// Whether `-threshold < v < threshold` (`threshold` > 0), in one unsigned
/// comparison: `v + threshold - 1` maps that interval, and only it, onto
/// `0..=2 * threshold - 2` (wrapping arithmetic is a bijection).
#[inline(always)]
fn within(v: isize, threshold: isize) -> bool {
    (v.wrapping_add(threshold - 1) as usize) < (2 * threshold - 1) as usize
}

/// Raises the peak to the current usage. Called after an allocation that
/// flushed has *succeeded*, so a refused request never shows in the peak.
#[inline]
pub(super) fn raise_peak() {
    let used = current_usage();
    // Read first: the peak line is only written when it really moves.
    if used > PEAK.0.load(Ordering::Relaxed) {
        PEAK.0.fetch_max(used, Ordering::Relaxed);
    }
}

/// Requests larger than this cannot be helped by eviction.
#[inline]
pub(super) fn hopeless_above() -> usize {
    TUNING.0.hopeless.load(Ordering::Relaxed)
}

/// Records the hard limit and the machine's memory (see [`LIMIT`] and
/// [`MACHINE`]).
pub(super) fn set_limits(limit: usize, machine: usize) {
    LIMIT.store(limit, Ordering::Relaxed);
    MACHINE.store(machine, Ordering::Relaxed);
    update_hopeless();
}

/// The hard limit (see [`LIMIT`]).
pub(super) fn hard_limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// Physical memory plus swap (see [`MACHINE`]).
pub(super) fn machine_memory() -> usize {
    MACHINE.load(Ordering::Relaxed)
}

fn update_hopeless() {
    let h = cap_raw().min(LIMIT.load(Ordering::Relaxed));
    TUNING.0.hopeless.store(h, Ordering::Relaxed);
}

/// The pthread key whose destructor publishes an exiting thread's pending
/// bytes: [`KEY_NONE`] until created.
static EXIT_KEY: AtomicU32 = AtomicU32::new(KEY_NONE);
/// Key-creation state: 0 not started, 1 in progress, 2 done, 3 failed.
static EXIT_KEY_STATE: AtomicU8 = AtomicU8::new(0);
const KEY_NONE: u32 = u32::MAX;

/// The flush branch of a thread that is not [`HOOKED`]: registers its exit
/// flush (on its first allocation), and leaves `pending` at 0 once that
/// worked, at the [`SENTINEL`] otherwise (exiting, or to try again).
#[cold]
fn unhooked(l: &Local) {
    hook_thread_exit(l);
    l.pending
        .set(if l.exit.get() == HOOKED { 0 } else { SENTINEL });
}

/// Registers (once per thread) a pthread-key destructor that publishes the
/// thread's pending bytes when it exits: any thread, not only the
/// runtime's, so short-lived threads leave no phantom usage behind. Cold:
/// runs on a thread's first allocation. Never allocates through this
/// allocator (`pthread_setspecific` may call the C `malloc` for keys past
/// the first 32).
#[cold]
fn hook_thread_exit(l: &Local) {
    if l.exit.get() == EXITING {
        return;
    }
    if EXIT_KEY_STATE.load(Ordering::Acquire) != 2 {
        if EXIT_KEY_STATE
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: `key` is a valid out-pointer; the destructor is an
            // `extern "C"` function that never unwinds.
            let ok = unsafe { libc::pthread_key_create(&mut key, Some(exit_flush)) } == 0;
            if ok {
                EXIT_KEY.store(key, Ordering::Release);
                EXIT_KEY_STATE.store(2, Ordering::Release);
            } else {
                EXIT_KEY_STATE.store(3, Ordering::Release);
            }
        }
        match EXIT_KEY_STATE.load(Ordering::Acquire) {
            2 => {}
            // Failed for good: stop trying on this thread.
            3 => return l.exit.set(HOOKED),
            // Another thread is creating it: try again next time.
            _ => return,
        }
    }
    let key = EXIT_KEY.load(Ordering::Acquire);
    // SAFETY: `key` was created by `pthread_key_create`; the value is a
    // non-null marker, never dereferenced.
    unsafe {
        libc::pthread_setspecific(key, std::ptr::NonNull::<u8>::dangling().as_ptr().cast());
    }
    l.exit.set(HOOKED);
}

/// The pthread-key destructor: the thread is exiting. Publishes its
/// pending bytes, and from now on its deltas (frees made by later
/// destructors) go straight to [`USED`].
extern "C" fn exit_flush(_: *mut libc::c_void) {
    flush_thread();
    let _ = LOCAL.try_with(|l| {
        l.exit.set(EXITING);
        l.pending.set(SENTINEL);
    });
}

/// The soft cap in bytes, [`NO_CAP`] when there is none.
#[inline]
pub(super) fn cap_raw() -> usize {
    CAP.0.load(Ordering::Relaxed)
}

/// Disables the trap on this thread while alive: allocations inside do not
/// evict (and fall back to the reserve under a hard limit). Used while
/// evicting and while holding locks the evictor needs.
pub(crate) struct BypassGuard(());

impl BypassGuard {
    pub(crate) fn new() -> Self {
        let _ = BYPASS.try_with(|b| b.set(b.get() + 1));
        BypassGuard(())
    }
}

impl Drop for BypassGuard {
    fn drop(&mut self) {
        let _ = BYPASS.try_with(|b| b.set(b.get().saturating_sub(1)));
    }
}

/// Bytes currently accounted as in use by the whole process, through
/// [`TrapAlloc`](crate::TrapAlloc).
///
/// Accurate to within [`flush_threshold`] bytes per thread (per-thread
/// deltas are flushed lazily). 0 when `TrapAlloc` is not the global
/// allocator.
pub fn current_usage() -> usize {
    USED.0.load(Ordering::Relaxed).max(0) as usize
}

/// The highest [`current_usage`] seen so far.
pub fn peak_usage() -> usize {
    PEAK.0.load(Ordering::Relaxed)
}

/// Resets the peak to the current usage (for measuring one phase of a job).
pub fn reset_peak() {
    PEAK.0.store(current_usage(), Ordering::Relaxed);
}

/// Net bytes allocated by the calling thread since it started (exact, not
/// subject to the flush threshold). The difference of two readings measures
/// what a piece of code left allocated.
pub fn thread_net_allocated() -> i64 {
    LOCAL
        .try_with(|l| l.net.get().wrapping_add(pending_bytes(l) as i64))
        .unwrap_or(0)
}

/// The thread's unpublished bytes (0 while `pending` holds the sentinel).
fn pending_bytes(l: &Local) -> isize {
    match l.pending.get() {
        SENTINEL => 0,
        p => p,
    }
}

/// Whether the calling thread is inside an eviction (see [`EvictScope`]):
/// the only scope the reserve serves.
pub(super) fn evicting() -> bool {
    EVICTED.try_with(|e| e.1.get() > 0).unwrap_or(false)
}

/// What this thread allocated net, less what its evictions freed: the
/// measure of an executor's size while it is loaded or written to, exact
/// even when the trap evicts other executors on this thread meanwhile.
pub(crate) fn thread_own_net() -> i64 {
    let evicted = EVICTED.try_with(|e| e.0.get()).unwrap_or(0);
    thread_net_allocated().wrapping_sub(evicted)
}

/// Marks an eviction on this thread: what it frees (or allocates) is kept
/// out of [`thread_own_net`]. Nested scopes count once.
pub(crate) struct EvictScope {
    before: i64,
}

impl EvictScope {
    pub(crate) fn new() -> EvictScope {
        let _ = EVICTED.try_with(|e| e.1.set(e.1.get() + 1));
        EvictScope {
            before: thread_net_allocated(),
        }
    }
}

impl Drop for EvictScope {
    fn drop(&mut self) {
        let delta = thread_net_allocated().wrapping_sub(self.before);
        let _ = EVICTED.try_with(|e| {
            let depth = e.1.get().saturating_sub(1);
            e.1.set(depth);
            if depth == 0 {
                e.0.set(e.0.get().wrapping_add(delta));
            }
        });
    }
}

/// Flushes the calling thread's pending delta into the global counter (and
/// raises the peak when it grew). The runtime calls it after every task and
/// every load, and threads call it when they exit, so no thread's bytes
/// stay unpublished for long.
pub fn flush_thread() {
    if let Ok(v) = LOCAL.try_with(|l| {
        let v = pending_bytes(l);
        if l.exit.get() == HOOKED {
            l.pending.set(0);
        }
        l.net.set(l.net.get().wrapping_add(v as i64));
        v
    }) {
        if v != 0 {
            USED.0.fetch_add(v, Ordering::Relaxed);
            if v > 0 {
                raise_peak();
            }
        }
    }
}

/// The current flush threshold: [`current_usage`] is accurate to within
/// this many bytes per thread.
pub fn flush_threshold() -> usize {
    TUNING.0.flush.load(Ordering::Relaxed) as usize
}

/// The soft cap currently enforced by the allocator, if any.
pub(crate) fn soft_cap() -> Option<usize> {
    match cap_raw() {
        NO_CAP => None,
        c => Some(c),
    }
}

/// The flush threshold that goes with a soft cap of `cap` bytes (`None`:
/// no cap): what each thread may hold beyond [`current_usage`] under that
/// cap. A job planning its threads counts it once per thread.
pub fn flush_threshold_for(cap: Option<u64>) -> usize {
    cap.map_or(MAX_FLUSH as usize, |c| {
        usize::try_from(c / 256)
            .unwrap_or(usize::MAX)
            .clamp(MIN_FLUSH as usize, MAX_FLUSH as usize)
    })
}

/// Sets the soft cap and the flush threshold that goes with it.
pub(super) fn set_soft_cap(cap: Option<usize>) {
    CAP.0.store(cap.unwrap_or(NO_CAP), Ordering::Relaxed);
    let t = flush_threshold_for(cap.map(|c| c as u64)) as isize;
    TUNING.0.flush.store(t, Ordering::Relaxed);
    update_hopeless();
}
