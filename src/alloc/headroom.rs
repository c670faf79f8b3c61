//! The headroom: address space held back under an address-space limit
//! (`RLIMIT_AS`) for the allocations a runtime makes while it holds one of
//! its locks (a bypass scope that is not an eviction).
//!
//! Such an allocation cannot trap: the eviction it would need takes the
//! locks its own thread holds. Yet it can be large (the registry's table
//! doubling at 100,000 executors asks for 4.5 MiB) and long-lived, so the
//! reserve, whose blocks must all be freed at the end of each eviction,
//! cannot serve it. So while a runtime lives under such a limit, a
//! `PROT_NONE` mapping holds some address space back. When an allocation in
//! a lock scope fails, the mapping is unmapped and the allocation retried;
//! the next trap outside a lock scope evicts enough to map it again.
//!
//! Only address space is held (`MAP_NORESERVE`, never touched): no memory.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The mapping's first address; 0 while it is not mapped.
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Its size, set by the first runtime that registers under a limit and
/// never changed after (every mapping has this size).
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// Whether a runtime under a limit is registered.
static WANTED: AtomicBool = AtomicBool::new(false);

/// The headroom for an address-space limit of `limit` bytes: 1/32 of it,
/// between 1 MiB and 32 MiB.
fn size_for(limit: u64) -> usize {
    let b = usize::try_from(limit / 32).unwrap_or(usize::MAX);
    b.clamp(1 << 20, 32 << 20) & !4095
}

/// Holds headroom back for `limit` (the `RLIMIT_AS` in force; `None`
/// when there is none). Called when a runtime registers; may fail to map
/// it (then the next hard trap tries again).
pub(crate) fn keep(limit: Option<u64>) {
    let Some(limit) = limit else { return };
    let _ = BYTES.compare_exchange(0, size_for(limit), Ordering::AcqRel, Ordering::Acquire);
    WANTED.store(true, Ordering::Release);
    restore();
}

/// Gives the headroom back for good (the last runtime unregistered).
pub(crate) fn forget() {
    WANTED.store(false, Ordering::Release);
    release();
}

/// Bytes the headroom lacks: its size while it is wanted and not mapped,
/// else 0.
pub(crate) fn missing() -> usize {
    if WANTED.load(Ordering::Acquire) && BASE.load(Ordering::Acquire) == 0 {
        BYTES.load(Ordering::Acquire)
    } else {
        0
    }
}

/// Maps the headroom if it is wanted and not mapped. Returns false when it
/// is wanted and could not be mapped. Never allocates: one `mmap`.
pub(crate) fn restore() -> bool {
    let bytes = missing();
    if bytes == 0 {
        return true;
    }
    let Some(p) = map_inaccessible(bytes) else {
        return false;
    };
    if BASE
        .compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread mapped it first.
        // SAFETY: `p` is the mapping made above, of `bytes`, unused.
        unsafe { libc::munmap(p, bytes) };
    }
    true
}

/// Unmaps the headroom so that an allocation that cannot trap may use its
/// address space. Returns whether there was one to give. Never allocates:
/// one `munmap`.
pub(crate) fn release() -> bool {
    let base = BASE.swap(0, Ordering::AcqRel);
    if base == 0 {
        return false;
    }
    // SAFETY: `base` was swapped out of BASE, so this thread alone owns
    // the mapping; `restore` made it with the size in BYTES, which never
    // changes once set.
    unsafe { libc::munmap(base as *mut libc::c_void, BYTES.load(Ordering::Acquire)) };
    true
}

/// Maps `bytes` of address space that holds no memory (no access, no
/// swap reserved): what counts against `RLIMIT_AS` and nothing else, for
/// the headroom and for a load's claim (`claim.rs`). Never allocates: one
/// `mmap`. `None` when the limit leaves no room.
pub(super) fn map_inaccessible(bytes: usize) -> Option<*mut libc::c_void> {
    // SAFETY: an anonymous private mapping with no address hint and no
    // access has no preconditions; the result is checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p)
}

/// Whether `bytes` of address space are free now under the address-space
/// limit: mapped once and given back at once.
pub(crate) fn address_space_free(bytes: usize) -> bool {
    match map_inaccessible(bytes) {
        Some(p) => {
            // SAFETY: `p` is the mapping of `bytes` made just above, never
            // touched and not shared.
            unsafe { libc::munmap(p, bytes) };
            true
        }
        None => false,
    }
}
