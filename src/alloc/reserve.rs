//! The reserve: address space set aside when the first runtime starts, from
//! which allocations made during an eviction are served when jemalloc
//! cannot serve them (under a hard limit such as `ulimit -v`).
//!
//! A lock-free bump allocator: one 64-bit word packs the bump offset (low 40
//! bits) and the number of live blocks (high 24 bits). When the last live
//! block is freed the offset goes back to zero, which suits its use: short
//! bursts of allocations (buffers and paths of one eviction) that are all
//! freed when the eviction ends.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Size of the reserve: enough for the write buffer, the encoder state and
/// the paths and error strings of an eviction.
pub(crate) const RESERVE_BYTES: usize = 16 << 20;

/// The reserve's first address, or [`UNMAPPED`].
static BASE: AtomicUsize = AtomicUsize::new(UNMAPPED);
/// [`BASE`] before the reserve is mapped: the range it would start is the
/// top of the address space, where no user-space pointer lies, so
/// [`contains`] needs no separate "mapped yet" check.
const UNMAPPED: usize = usize::MAX - RESERVE_BYTES + 1;
static STATE: AtomicU64 = AtomicU64::new(0);

const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// Maps the reserve if it is not mapped yet. Only address space is taken
/// (that is what `RLIMIT_AS` counts); pages are faulted in on first use.
pub(crate) fn init() {
    if BASE.load(Ordering::Acquire) != UNMAPPED {
        return;
    }
    // SAFETY: an anonymous private mapping with no address hint has no
    // preconditions; the result is checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            RESERVE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return;
    }
    if BASE
        .compare_exchange(UNMAPPED, p as usize, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread mapped it first.
        // SAFETY: `p` is the mapping made above, unused by anyone.
        unsafe { libc::munmap(p, RESERVE_BYTES) };
    }
}

/// Whether `p` points into the reserve.
#[inline]
pub(crate) fn contains(p: *mut u8) -> bool {
    // One comparison: below the base wraps to a huge offset. Null is never
    // inside (it is `RESERVE_BYTES` past an unmapped base).
    (p as usize).wrapping_sub(BASE.load(Ordering::Relaxed)) < RESERVE_BYTES
}

/// Allocates from the reserve; null when it is unmapped or full.
pub(crate) fn alloc(layout: Layout) -> *mut u8 {
    let base = BASE.load(Ordering::Acquire);
    if base == UNMAPPED {
        return std::ptr::null_mut();
    }
    let mut cur = STATE.load(Ordering::Acquire);
    loop {
        let off = (cur & OFFSET_MASK) as usize;
        let live = cur >> OFFSET_BITS;
        let start = (base + off).next_multiple_of(layout.align().max(1)) - base;
        let end = match start.checked_add(layout.size()) {
            Some(e) if e <= RESERVE_BYTES => e,
            _ => return std::ptr::null_mut(),
        };
        let next = ((live + 1) << OFFSET_BITS) | end as u64;
        match STATE.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return (base + start) as *mut u8,
            Err(now) => cur = now,
        }
    }
}

/// Frees a reserve block (only the live count matters).
pub(crate) fn free(_p: *mut u8) {
    let mut cur = STATE.load(Ordering::Acquire);
    loop {
        let live = cur >> OFFSET_BITS;
        let next = if live <= 1 {
            0
        } else {
            ((live - 1) << OFFSET_BITS) | (cur & OFFSET_MASK)
        };
        match STATE.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}
