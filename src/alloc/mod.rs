//! `TrapAlloc`: the accounting, trapping global allocator.
//!
//! See `src/alloc/README.md` for the protocol (re-entrancy, waiting, the
//! reserve). In short:
//!
//! ```text
//!  alloc(layout) ──► account (thread-local delta, flushed past 64 KiB)
//!        │                 └─ usage > cap? ──► soft trap: evict idle executors
//!        ▼
//!   jemalloc ──null──► hard trap: evict, purge, retry (others wait and retry)
//!        │                 └─ nothing left: one diagnostic line, return null
//!        ▼
//!     pointer            (threads inside an eviction bypass both traps and
//!                         fall back to the reserve when jemalloc fails)
//! ```

pub mod ffi;
mod linebuf;
mod reserve;
mod trap;

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicU64, AtomicUsize, Ordering};

use tikv_jemallocator::Jemalloc;

pub(crate) use trap::{register, Evictor, Registration};

/// Per-thread deltas are flushed to the global counter once they pass the
/// flush threshold, so the shared cache line is touched about once per
/// threshold's worth of allocation traffic instead of on every call. The
/// threshold is 1/256 of the cap, clamped to 64 KiB..4 MiB (4 MiB with no
/// cap): small caps get precise accounting, large ones cheap accounting.
const MIN_FLUSH: isize = 64 * 1024;
const MAX_FLUSH: isize = 4 << 20;

/// "No cap" is stored as `usize::MAX`.
const NO_CAP: usize = usize::MAX;

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
}

thread_local! {
    static LOCAL: Local = const { Local { pending: Cell::new(0), net: Cell::new(0) } };
    /// Depth of "bypass" scopes on this thread: eviction in progress, or a
    /// runtime lock held. Allocations in such a scope never enter the trap.
    static BYPASS: Cell<u32> = const { Cell::new(0) };
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
static FLUSH: Line<AtomicIsize> = Line(AtomicIsize::new(MAX_FLUSH));

/// Process-wide trap counters (the runtime adds its own per-runtime ones).
pub(crate) struct TrapCounters {
    pub soft_traps: AtomicU64,
    pub hard_traps: AtomicU64,
    pub trap_nanos: AtomicU64,
    pub wait_nanos: AtomicU64,
    pub overshoots: AtomicU64,
    pub reserve_allocs: AtomicU64,
    pub failures: AtomicU64,
}

pub(crate) static COUNTERS: TrapCounters = TrapCounters {
    soft_traps: AtomicU64::new(0),
    hard_traps: AtomicU64::new(0),
    trap_nanos: AtomicU64::new(0),
    wait_nanos: AtomicU64::new(0),
    overshoots: AtomicU64::new(0),
    reserve_allocs: AtomicU64::new(0),
    failures: AtomicU64::new(0),
};

/// The outcore global allocator: jemalloc with accounting and an allocation
/// trap.
///
/// With the default `global-allocator` feature, the `outcore` crate installs
/// it for you. Without that feature, install it yourself:
///
/// ```text
/// #[global_allocator]
/// static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
/// ```
///
/// With no [`Runtime`](crate::Runtime) alive in the process it only counts
/// bytes; with one, it evicts the runtime's idle executors when the soft cap
/// is exceeded or when jemalloc returns null (a hard limit such as
/// `ulimit -v`), and retries.
pub struct TrapAlloc {
    inner: Jemalloc,
}

impl TrapAlloc {
    /// A new allocator value (all state is process-global).
    pub const fn new() -> Self {
        TrapAlloc { inner: Jemalloc }
    }
}

impl Default for TrapAlloc {
    fn default() -> Self {
        Self::new()
    }
}

#[inline]
fn bypassing() -> bool {
    BYPASS.try_with(|b| b.get() > 0).unwrap_or(true)
}

/// Adds `delta` to this thread's pending bytes and flushes past the
/// threshold. Returns the new global usage when a flush happened.
#[inline]
fn account(delta: isize) -> Option<usize> {
    let threshold = FLUSH.0.load(Ordering::Relaxed);
    let flushed = LOCAL.try_with(|l| {
        let v = l.pending.get().wrapping_add(delta);
        if v > -threshold && v < threshold {
            l.pending.set(v);
            None
        } else {
            l.pending.set(0);
            l.net.set(l.net.get().wrapping_add(v as i64));
            Some(v)
        }
    });
    let v = match flushed {
        Ok(None) => return None,
        Ok(Some(v)) => v,
        // Thread-local storage unavailable: account directly.
        Err(_) => delta,
    };
    let used = USED.0.fetch_add(v, Ordering::Relaxed).wrapping_add(v);
    let used = if used < 0 { 0 } else { used as usize };
    // Read first: the peak line is only written when it really moves.
    if v > 0 && used > PEAK.0.load(Ordering::Relaxed) {
        PEAK.0.fetch_max(used, Ordering::Relaxed);
    }
    Some(used)
}

/// Accounts an allocation of `size` bytes and runs the soft trap if it takes
/// usage over the cap.
#[inline]
fn account_alloc(size: usize) {
    if let Some(used) = account(size as isize) {
        let cap = CAP.0.load(Ordering::Relaxed);
        if used > cap && !bypassing() {
            trap::soft(used, cap, size);
        }
    }
}

#[inline]
fn account_free(size: usize) {
    let _ = account(-(size as isize));
}

// SAFETY: every method forwards to jemalloc with the caller's layout
// (or to the reserve for pointers it owns), so the `GlobalAlloc` contract is
// the one jemalloc already meets. None of the paths panics, takes a lock or
// allocates through this allocator outside a bypass scope.
unsafe impl GlobalAlloc for TrapAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        account_alloc(layout.size());
        // SAFETY: the caller guarantees `layout` has a non-zero size.
        let p = unsafe { self.inner.alloc(layout) };
        if !p.is_null() {
            return p;
        }
        // SAFETY: same layout as above.
        let p = trap::hard(
            layout.size(),
            || unsafe { self.inner.alloc(layout) },
            layout,
        );
        if p.is_null() {
            account_free(layout.size());
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        account_alloc(layout.size());
        // SAFETY: the caller guarantees `layout` has a non-zero size.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if !p.is_null() {
            return p;
        }
        // SAFETY: same layout as above.
        let p = trap::hard(
            layout.size(),
            || unsafe { self.inner.alloc_zeroed(layout) },
            layout,
        );
        if p.is_null() {
            account_free(layout.size());
        } else if reserve::contains(p) {
            // SAFETY: the reserve handed out `layout.size()` writable bytes.
            unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if reserve::contains(ptr) {
            reserve::free(ptr);
        } else {
            // SAFETY: `ptr` came from jemalloc with this layout (the caller's
            // contract; reserve pointers were handled above).
            unsafe { self.inner.dealloc(ptr, layout) };
        }
        account_free(layout.size());
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if reserve::contains(ptr) {
            // SAFETY: the caller's contract for realloc carries over:
            // `new_size` is non-zero and fits the alignment.
            return unsafe { self.move_out_of_reserve(ptr, layout, new_size) };
        }
        let old = layout.size();
        if new_size > old {
            account_alloc(new_size - old);
        } else {
            account_free(old - new_size);
        }
        // SAFETY: `ptr` was allocated by jemalloc with `layout`.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            return p;
        }
        let new_layout = Layout::from_size_align(new_size, layout.align()).unwrap_or(layout);
        // SAFETY: on failure `ptr` is still valid, so retrying is sound.
        let p = trap::hard(
            new_size,
            || unsafe { self.inner.realloc(ptr, layout, new_size) },
            new_layout,
        );
        if p.is_null() {
            if new_size > old {
                account_free(new_size - old);
            } else {
                account_alloc(old - new_size);
            }
            return p;
        }
        if reserve::contains(p) {
            // The trap served a fresh block from the reserve: move the data.
            // SAFETY: `p` has `new_size` bytes, `ptr` has `old` bytes, and
            // they do not overlap (distinct allocations).
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, p, old.min(new_size));
                self.inner.dealloc(ptr, layout);
            }
        }
        p
    }
}

impl TrapAlloc {
    /// Reallocates a block that lives in the reserve into a fresh block.
    ///
    /// # Safety
    ///
    /// `ptr` is a live reserve block of `layout`, and `new_size` is non-zero
    /// and valid for `layout.align()`.
    unsafe fn move_out_of_reserve(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `new_layout` has a non-zero size.
        let p = unsafe { self.alloc(new_layout) };
        if !p.is_null() {
            // SAFETY: both blocks are live, distinct, and at least
            // `min(old, new)` bytes long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size)) };
            reserve::free(ptr);
            account_free(layout.size());
        }
        p
    }
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

/// Bytes currently accounted as in use by the whole process.
///
/// Accurate to within [`flush_threshold`] bytes per thread (per-thread
/// deltas are flushed lazily).
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
        .try_with(|l| l.net.get().wrapping_add(l.pending.get() as i64))
        .unwrap_or(0)
}

/// Flushes the calling thread's pending delta into the global counter. Call
/// before a thread exits so its last bytes are not lost from the count.
pub fn flush_thread() {
    if let Ok(v) = LOCAL.try_with(|l| {
        let v = l.pending.replace(0);
        l.net.set(l.net.get().wrapping_add(v as i64));
        v
    }) {
        if v != 0 {
            USED.0.fetch_add(v, Ordering::Relaxed);
        }
    }
}

/// The soft cap currently enforced by the allocator, if any.
pub fn soft_cap() -> Option<usize> {
    match CAP.0.load(Ordering::Relaxed) {
        NO_CAP => None,
        c => Some(c),
    }
}

pub(crate) fn set_soft_cap(cap: Option<usize>) {
    CAP.0.store(cap.unwrap_or(NO_CAP), Ordering::Relaxed);
    let t = cap.map_or(MAX_FLUSH, |c| {
        (c / 256).clamp(MIN_FLUSH as usize, MAX_FLUSH as usize) as isize
    });
    FLUSH.0.store(t, Ordering::Relaxed);
}

/// Set when a spill write fails (for the out-of-memory diagnostic).
static SPILL_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The spill directory, for the diagnostic (a leaked copy of the path
/// bytes, set when a runtime starts).
static SPILL_DIR: std::sync::atomic::AtomicPtr<Vec<u8>> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

pub(crate) fn note_failed_spill_write() {
    SPILL_FAILED.store(true, Ordering::Relaxed);
}

pub(crate) fn set_spill_dir_for_diagnostics(dir: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let b = Box::into_raw(Box::new(dir.as_os_str().as_bytes().to_vec()));
    // The previous one (another runtime's) is leaked on purpose: a trap on
    // another thread may be printing it.
    SPILL_DIR.swap(b, Ordering::AcqRel);
}

/// Whether a spill write has failed, and the spill directory (for the
/// trap's diagnostic; reads only, never allocates).
pub(crate) fn spill_diagnostics() -> (bool, Option<&'static [u8]>) {
    let p = SPILL_DIR.load(Ordering::Acquire);
    // SAFETY: a non-null pointer came from `Box::into_raw` and is never
    // freed (see `set_spill_dir_for_diagnostics`).
    let dir = (!p.is_null()).then(|| unsafe { (*p).as_slice() });
    (SPILL_FAILED.load(Ordering::Relaxed), dir)
}

/// The current flush threshold: [`current_usage`] is accurate to within
/// this many bytes per thread.
pub fn flush_threshold() -> usize {
    FLUSH.0.load(Ordering::Relaxed) as usize
}

/// Asks jemalloc to return unused dirty pages to the operating system (all
/// arenas) and flushes this thread's cache. Never allocates.
pub fn purge() {
    // SAFETY: the names are NUL-terminated static strings; both controls
    // take no input and produce no output, so null pointers are valid.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.flush".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// Whether jemalloc is running with `retain` on (freed address space kept
/// mapped). outcore turns it off at start-up when `RLIMIT_AS` is finite.
pub fn jemalloc_retains() -> Option<bool> {
    // SAFETY: "opt.retain" is a read-only boolean control.
    unsafe { tikv_jemalloc_ctl::raw::read::<bool>(b"opt.retain\0").ok() }
}

/// The jemalloc configuration string, chosen before jemalloc initialises
/// (see [`choose_malloc_conf`]). jemalloc reads this pointer once, on its
/// first allocation.
#[export_name = "_rjem_malloc_conf"]
static mut MALLOC_CONF: *const libc::c_char = std::ptr::null();

/// Runs from `.init_array`, before `main` and before any Rust allocation:
/// when the address space is limited, turn `retain` off so that memory
/// freed after an eviction is unmapped and counts against the limit no more.
extern "C" fn choose_malloc_conf() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } == 0;
    if ok && lim.rlim_cur != libc::RLIM_INFINITY {
        // SAFETY: single-threaded start-up; jemalloc has not read the
        // variable yet (it does so on its first allocation).
        unsafe {
            MALLOC_CONF = c"retain:false".as_ptr();
        }
    }
}

// Not under Miri, which cannot run `getrlimit` (and never uses jemalloc).
#[cfg(not(miri))]
#[used]
#[link_section = ".init_array"]
static CHOOSE_MALLOC_CONF: extern "C" fn() = choose_malloc_conf;

/// Keeps the `.init_array` entry and the conf symbol linked in: referenced
/// from the allocator so the linker cannot drop their object file.
#[inline(never)]
pub(crate) fn touch_init() -> usize {
    #[cfg(not(miri))]
    let a = CHOOSE_MALLOC_CONF as usize;
    #[cfg(miri)]
    let a = choose_malloc_conf as usize;
    a ^ std::ptr::addr_of!(MALLOC_CONF) as usize
}

#[cfg(test)]
mod tests;
