//! Load claims: under an address-space limit (`RLIMIT_AS`), a load holds
//! the address space it will need before it allocates anything, so that
//! a load in progress never has to wait for memory.
//!
//! Without them, two loads (a prefetcher's and a worker's) could each get
//! part-way, both fail to allocate, and each take the other's executor,
//! still `Loading`, for contention that would pass: both waited out the
//! trap's patience and the process aborted or stalled. With a claim, a
//! load that starts always has its room: the claim is a `PROT_NONE`,
//! `MAP_NORESERVE` mapping (address space, no memory) that the hard trap
//! unmaps, on the claiming thread only, the first time one of the load's
//! allocations fails, and retries. A thread that cannot claim does not
//! start the load (the prefetcher gives it back) or first evicts for it.
//!
//! Everything here is reachable from the allocator: no locks, no
//! allocation; the thread-local is `const`-initialised and has no
//! destructor.

use std::cell::Cell;

thread_local! {
    /// This thread's claim: its first address and length (0: none).
    static CLAIM: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// Address space claimed beyond a load's size: a block of 2 MiB or more
/// is placed on a 2 MiB boundary, which jemalloc gets by mapping the size
/// plus the alignment and trimming; and the load's small allocations
/// (buffers, headers, the value's other fields).
pub(crate) const CLAIM_PAD: usize = 3 << 20;

/// A load's claim on the address space; dropping it gives back what the
/// load did not use.
#[derive(Debug)]
pub(crate) struct LoadClaim(());

impl LoadClaim {
    /// Claims `bytes` of address space for a load on this thread: `None`
    /// when they are not there (or a claim is already held).
    pub(crate) fn new(bytes: usize) -> Option<LoadClaim> {
        if bytes == 0 || CLAIM.try_with(|c| c.get().1 != 0).unwrap_or(true) {
            return None;
        }
        let p = super::headroom::map_inaccessible(bytes)?;
        let _ = CLAIM.try_with(|c| c.set((p as usize, bytes)));
        Some(LoadClaim(()))
    }
}

impl Drop for LoadClaim {
    fn drop(&mut self) {
        release_own();
    }
}

/// Whether this thread holds a claim: a load it starts uses that one.
pub(crate) fn claim_held() -> bool {
    CLAIM.try_with(|c| c.get().1 != 0).unwrap_or(false)
}

/// Unmaps this thread's claim, if it holds one, so that the allocation
/// that just failed can use it. Returns whether there was one. One
/// `munmap`, nothing else.
pub(super) fn release_own() -> bool {
    let (base, len) = CLAIM.try_with(|c| c.replace((0, 0))).unwrap_or((0, 0));
    if len == 0 {
        return false;
    }
    // SAFETY: `base`/`len` is the mapping `LoadClaim::new` made on this
    // thread, never touched, and taken out of the thread-local above, so
    // it is unmapped once.
    unsafe { libc::munmap(base as *mut libc::c_void, len) };
    true
}
