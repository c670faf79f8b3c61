//! `TrapAlloc`: the accounting, trapping global allocator.
//!
//! See `src/alloc/README.md` for the protocol (re-entrancy, waiting, the
//! reserve). In short:
//!
//! ```text
//!  alloc(layout) ──► account (thread-local delta, flushed past a threshold)
//!        │                 └─ usage > cap? ──► soft trap: evict idle executors
//!        ▼
//!   jemalloc ──null──► hard trap: evict, purge, retry (others wait and retry)
//!        │                 └─ nothing left: one diagnostic line, return null
//!        ▼
//!     pointer            (threads inside an eviction bypass both traps and
//!                         fall back to the reserve when jemalloc fails)
//! ```
//!
//! Files, each depending only on those above it:
//!
//! - `linebuf.rs`: a 512-byte stack buffer for messages written from
//!   inside the allocator;
//! - `reserve.rs`: the address space set aside for evictions under a hard
//!   limit;
//! - `headroom.rs`: the address space held back, under `RLIMIT_AS`, for
//!   allocations made under a runtime lock;
//! - `claim.rs`: the address space a load claims, under `RLIMIT_AS`,
//!   before it allocates;
//! - `slots.rs`: the lock-free slots the evictor registry lives in (std
//!   only, so that `tests/miri` runs it alone under Miri);
//! - `jemalloc.rs`: `retain:false` chosen before `main`, the arena blocks of
//!   1 MiB or more share, `purge()`;
//! - `account.rs`: per-thread deltas, `USED`/`PEAK`, the cap and flush
//!   threshold, bypass and eviction scopes, the exit flush, trap counters;
//! - `trap.rs`: the `Evictor` contract, the registry of evictors, the
//!   token and epoch, the soft and hard traps, the diagnostic;
//! - `ffi.rs`: the C entry points for the `LD_PRELOAD` shim;
//! - `register.rs`: registering a runtime's evictor: the lifecycle lock,
//!   the `fork()` handler, the handshake with the shim;
//! - `mod.rs` (this file): the `GlobalAlloc` implementation and the
//!   installation probe;
//! - `tests.rs`: unit tests of the allocator;
//! - `README.md`: the protocol.

mod account;
mod claim;
mod ffi;
mod headroom;
mod jemalloc;
pub(crate) mod linebuf;
mod register;
mod reserve;
mod slots;
mod trap;

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::Ordering;

use tikv_jemallocator::Jemalloc;

pub use account::{
    current_usage, flush_thread, flush_threshold, flush_threshold_for, peak_usage, reset_peak,
    thread_net_allocated,
};
pub(crate) use account::{thread_own_net, BypassGuard, EvictScope, COUNTERS};
pub(crate) use claim::{claim_held, LoadClaim, CLAIM_PAD};
pub(crate) use headroom::address_space_free;
pub(crate) use jemalloc::{kept_pages, purge};
pub use linebuf::set_process_name;
pub(crate) use register::{register, Registration};
pub(crate) use trap::{evict_external, Evictor, Freed};

/// The outcore global allocator: jemalloc with accounting and an allocation
/// trap.
///
/// The application installs it, with one line (as with tikv-jemallocator):
///
/// ```
/// #[global_allocator]
/// static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
/// # fn main() {}
/// ```
///
/// With no [`Runtime`](crate::Runtime) alive in the process it only counts
/// bytes; with one, it evicts the runtime's idle executors when the soft cap
/// is exceeded or when jemalloc returns null (a hard limit such as
/// `ulimit -v`), and retries. A runtime with a cap refuses to start when
/// `TrapAlloc` is not the global allocator
/// ([`Error::AllocatorNotInstalled`](crate::Error::AllocatorNotInstalled)):
/// the cap would do nothing.
///
/// Blocks of 16 KiB and more start on a 4 KiB page boundary (jemalloc
/// alone starts them at a random cache line of their first page), so spill
/// loads can read straight into them with direct I/O; blocks of 2 MiB and
/// more start on a 2 MiB boundary, so transparent huge pages can back all
/// of them but their tail.
#[derive(Debug)]
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

/// Blocks of at least this many bytes start on a page boundary, so that
/// direct I/O can read straight into them (a spill load into a
/// `PodVec`'s storage). jemalloc would otherwise start large blocks at a
/// random cache line within their first page. 16 KiB is jemalloc's
/// smallest large size class: every large block is aligned, so a large
/// block growing in place stays aligned and never has to move just to
/// become aligned (small blocks move when they grow into large ones
/// anyway).
pub(crate) const PAGE_ALIGNED_FROM: usize = 16 << 10;

/// The page size that [`PAGE_ALIGNED_FROM`] blocks are aligned to.
pub(crate) const PAGE: usize = 4096;

/// Blocks of at least this many bytes start on a [`HUGE_PAGE`] boundary.
///
/// A transparent huge page (where the system gives them: always, or on
/// `MADV_HUGEPAGE` advice) can only back a 2 MiB-aligned range, and
/// jemalloc starts a large block on any page: a 4 MiB block then holds
/// one huge page, or none, instead of two. Measured on a K-means epoch over
/// 4 GiB of rows, the distance kernel took 11-15% more CPU time on rows in
/// 4 KiB pages than in huge pages (a TLB miss per row of 4 KB).
pub(crate) const HUGE_ALIGNED_FROM: usize = 2 << 20;

/// The alignment of [`HUGE_ALIGNED_FROM`] blocks: one huge page.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// The layout jemalloc is asked for: `layout`, page-aligned when large,
/// huge-page-aligned when larger. A pure function of the layout, so
/// `alloc` and `dealloc` of one block always agree (jemalloc's sized free
/// must see the alignment the block was allocated with; for large blocks
/// their size class does not depend on it, so a block that changed class
/// in place is still freed consistently).
#[inline(always)]
fn placed(layout: Layout) -> Layout {
    if layout.size() >= PAGE_ALIGNED_FROM && layout.align() < PAGE {
        placed_slow(layout)
    } else {
        layout
    }
}

#[inline(never)]
fn placed_slow(layout: Layout) -> Layout {
    let align = if layout.size() >= HUGE_ALIGNED_FROM {
        HUGE_PAGE
    } else {
        PAGE
    };
    // Fails only for sizes within an alignment of `isize::MAX`, which no
    // allocator can serve: keep the caller's layout then (still
    // consistent, since this is a pure function of `layout`).
    Layout::from_size_align(layout.size(), align).unwrap_or(layout)
}

// SAFETY: every method forwards to jemalloc with the caller's layout, raised
// to page alignment for large blocks by `placed` in every path (so a block
// is freed with the alignment it was allocated with), or to the reserve for
// pointers it owns. The `GlobalAlloc` contract is the one jemalloc already
// meets; a stricter alignment than asked for is allowed. None of the paths
// panics, takes a lock or allocates through this allocator outside a bypass
// scope.
unsafe impl GlobalAlloc for TrapAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let inner = placed(layout);
        // SAFETY: the caller guarantees `layout` has a non-zero size, and
        // `inner` has the same size.
        allocate(layout, || unsafe {
            jemalloc::alloc(&self.inner, inner, false)
        })
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let inner = placed(layout);
        // SAFETY: the caller guarantees `layout` has a non-zero size, and
        // `inner` has the same size.
        let p = allocate(layout, || unsafe {
            jemalloc::alloc(&self.inner, inner, true)
        });
        if reserve::contains(p) {
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
            // SAFETY: `ptr` came from jemalloc with `placed(layout)` (the
            // caller's contract; reserve pointers were handled above).
            unsafe { self.inner.dealloc(ptr, placed(layout)) };
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
        // jemalloc's realloc takes the new block's alignment from the
        // layout it is given (the old block's alignment does not matter to
        // it): that of `placed` for the new size, so that the block's
        // eventual `dealloc(placed(new layout))` matches.
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let align = placed(new_layout).align();
        let Ok(call_layout) = Layout::from_size_align(old, align) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `ptr` was allocated by jemalloc (with `placed(layout)`),
        // `new_size` is non-zero, and jemalloc's realloc only uses the
        // layout's alignment; on failure `ptr` stays valid, so retrying is
        // sound.
        let attempt = || unsafe { jemalloc::realloc(&self.inner, ptr, call_layout, new_size) };
        if new_size <= old {
            let p = attempt();
            if !p.is_null() {
                account_free(old - new_size);
            }
            return p;
        }
        let p = grow(new_size - old, new_layout, attempt);
        if reserve::contains(p) {
            // The trap served a fresh block from the reserve: move the data.
            // SAFETY: `p` has `new_size` bytes, `ptr` has `old` bytes, and
            // they do not overlap (distinct allocations).
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, p, old);
                self.inner.dealloc(ptr, placed(layout));
            }
        }
        p
    }
}

/// An allocation of `layout` by `attempt`, accounted and trapped.
#[inline(always)]
fn allocate(layout: Layout, attempt: impl Fn() -> *mut u8) -> *mut u8 {
    grow(layout.size(), layout, attempt)
}

/// Memory use grows by `delta` bytes if `attempt` (an allocation or a
/// growing reallocation to `layout`) succeeds: account it (with the soft
/// trap), attempt, and on failure run the hard trap.
///
/// The fast path (the delta stays in the thread's pending bytes, jemalloc
/// succeeds) is inlined; everything else is out of line.
#[inline(always)]
fn grow(delta: usize, layout: Layout, attempt: impl Fn() -> *mut u8) -> *mut u8 {
    if account::keep(delta as isize) {
        let p = attempt();
        if !p.is_null() {
            return p;
        }
        return grow_failed(delta, layout, false, attempt);
    }
    grow_flush(delta, layout, attempt)
}

/// [`grow`] when the delta flushes the thread's pending bytes.
#[cold]
#[inline(never)]
fn grow_flush(delta: usize, layout: Layout, attempt: impl Fn() -> *mut u8) -> *mut u8 {
    let flushed = match account::account_request(delta as isize, layout.size()) {
        account::Accounted::Kept => false,
        account::Accounted::Flushed(used) => {
            soft_trap(used, delta);
            true
        }
        account::Accounted::Hopeless => return grow_hopeless(layout.size(), delta, attempt),
    };
    let p = attempt();
    if p.is_null() {
        return grow_failed(delta, layout, flushed, attempt);
    }
    if flushed {
        account::raise_peak();
    }
    p
}

/// The allocator returned null for an accounted request: the hard trap.
#[cold]
#[inline(never)]
fn grow_failed(
    delta: usize,
    layout: Layout,
    flushed: bool,
    attempt: impl Fn() -> *mut u8,
) -> *mut u8 {
    let p = trap::hard(layout.size(), &attempt, layout);
    if p.is_null() {
        account_free(delta);
    } else if flushed {
        account::raise_peak();
    }
    p
}

/// A request larger than the cap or the hard limit: no eviction can make it
/// fit, so it is attempted once, accounted only if it succeeds, and a
/// failure is returned at once, with no eviction. A line says so when the
/// request is one this machine could hold (the program may abort on it); a
/// larger one is a probe (a `try_reserve` the caller handles), refused
/// silently.
#[cold]
#[inline(never)]
fn grow_hopeless(size: usize, delta: usize, attempt: impl Fn() -> *mut u8) -> *mut u8 {
    let p = attempt();
    if p.is_null() {
        COUNTERS.refusals.fetch_add(1, Ordering::Relaxed);
        if size <= account::machine_memory() && !account::bypassing() {
            trap::diagnose_refusal(size);
        }
    } else if account::account(delta as isize).is_some() {
        account::raise_peak();
    }
    p
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

/// After a flush took usage to `used` for a request of `size` bytes: the
/// soft trap, if that is over the cap.
#[inline]
fn soft_trap(used: usize, size: usize) {
    let cap = account::cap_raw();
    if used > cap && !account::bypassing() {
        trap::soft(used, cap, size);
    }
}

/// Accounts a free of `size` bytes.
#[inline]
fn account_free(size: usize) {
    if !account::keep(-(size as isize)) {
        account_free_flush(size);
    }
}

/// [`account_free`] when the change flushes the thread's pending bytes.
#[cold]
#[inline(never)]
fn account_free_flush(size: usize) {
    let _ = account::account(-(size as isize));
}

/// Whether [`TrapAlloc`] is the process's global allocator: allocates a
/// probe block through the global allocator and checks that the calling
/// thread's accounting saw it.
pub(crate) fn installed() -> bool {
    const PROBE: usize = 4096;
    let Ok(layout) = Layout::from_size_align(PROBE, 8) else {
        return false;
    };
    let before = thread_net_allocated();
    // SAFETY: `layout` has a non-zero size.
    let p = std::hint::black_box(unsafe { std::alloc::alloc(layout) });
    let seen = thread_net_allocated() - before;
    if !p.is_null() {
        // SAFETY: `p` was allocated just above with `layout`.
        unsafe { std::alloc::dealloc(p, layout) };
    }
    seen == PROBE as i64
}

#[cfg(test)]
mod tests;
