//! jemalloc settings: large blocks in the ordinary arenas and `retain:false`
//! under an address-space limit (chosen before jemalloc starts), blocks of
//! 1 MiB or more in one arena every thread shares, freed pages kept for
//! reuse while a capped runtime lives, purging, and queries.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU32, Ordering};

use tikv_jemallocator::Jemalloc;

/// Asks jemalloc to return unused dirty pages to the operating system (all
/// arenas) and flushes this thread's cache. Never allocates.
pub(crate) fn purge() {
    // SAFETY:
    // - the names are NUL-terminated static strings;
    // - both controls take no input and produce no output, so null
    //   pointers and a zero length are valid.
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

/// How long jemalloc keeps freed dirty pages before returning them to the
/// system when no capped runtime is alive (jemalloc's default).
const DEFAULT_DIRTY_DECAY_MS: isize = 10_000;

/// While a runtime with a cap is alive, freed pages stay with jemalloc until
/// reused (`dirty_decay_ms:-1`) instead of decaying. Under a cap, memory is
/// freed by evictions and taken again at once by loads of the same size:
/// decay would return those pages to the system and the next load would
/// fault every page in again (about 3,200 faults and a kernel zeroing per
/// 12.6 MiB partition). Dirty pages come only from freed accounted memory,
/// and a load purges them once they exceed a budget ([`kept_pages`]);
/// the trap and `evict_all` still purge. Called outside the allocator
/// (registration), may allocate.
pub(crate) fn keep_dirty_pages(keep: bool) {
    let ms: isize = if keep { -1 } else { DEFAULT_DIRTY_DECAY_MS };
    // SAFETY: the names are NUL-terminated and name controls of the types
    // read and written (`unsigned` and `ssize_t`).
    unsafe {
        let _ = tikv_jemalloc_ctl::raw::write(b"arenas.dirty_decay_ms\0", ms);
        let n: u32 = tikv_jemalloc_ctl::raw::read(b"arenas.narenas\0").unwrap_or(0);
        for i in 0..n {
            let name = format!("arena.{i}.dirty_decay_ms\0");
            let _ = tikv_jemalloc_ctl::raw::write(name.as_bytes(), ms);
        }
    }
    if !keep {
        purge();
    }
}

/// The freed pages jemalloc keeps for reuse, in bytes (all arenas). Reads
/// jemalloc's statistics (refreshing them), so it is called outside the
/// allocator, after loads.
pub(crate) fn kept_pages() -> usize {
    // SAFETY: "epoch" takes a u64 and "stats.arenas.4096.pdirty" (all
    // arenas) is a size_t; the names are NUL-terminated.
    let pages: usize = unsafe {
        let _ = tikv_jemalloc_ctl::raw::write(b"epoch\0", 1u64);
        tikv_jemalloc_ctl::raw::read(b"stats.arenas.4096.pdirty\0").unwrap_or(0)
    };
    pages.saturating_mul(page_size())
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Whether jemalloc is running with `retain` on (freed address space kept
/// mapped). outcore turns it off at start-up when `RLIMIT_AS` is finite.
#[cfg(test)]
pub(crate) fn retains() -> Option<bool> {
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
/// freed after an eviction is unmapped and counts against the limit no more,
/// keep jemalloc to one automatic arena with no thread caches, and the C
/// library's malloc to one arena.
///
/// One automatic arena (`narenas:1`) and no thread caches (`tcache:false`),
/// because jemalloc 5.3 does not survive a failure to make either. On a
/// thread's first allocation it makes the thread's cache (its stacks of
/// cached blocks, tens of KiB from jemalloc's metadata) and, up to four
/// per CPU, a new arena (a 2 MiB metadata block mapped, then slabs of its
/// own). Under an address-space limit either can fail, and jemalloc goes
/// on with a half-made cache (a null `stack_head`, a null arena) and dies
/// of a SIGSEGV in `cache_bin_alloc` on that very allocation: seen in a
/// thread submitting joins (`tests/hard_limit.rs`, 4 runs of 4 at one
/// margin), and every time in a thread whose first allocation finds the
/// address space full (`a_threads_first_allocation_at_the_limit`; with one
/// arena but caches on, still 3 of 3). With one arena and no caches a
/// thread's first allocation makes nothing, and a failure is an ordinary
/// null the trap sees. The arenas also cost address space the trap cannot
/// give back: 45 MiB mapped at start instead of 53 with 6 threads. Small
/// allocations take the arena's bin locks instead of the thread cache: the
/// join workload of `tests/hard_limit.rs` ran 14 children in 13.9 s instead
/// of 11.1 s; only processes under `RLIMIT_AS` pay it.
extern "C" fn choose_malloc_conf() {
    // An address-space limit, or a data-size limit (`ulimit -d`), which
    // counts jemalloc's writable mappings alike.
    let limited = crate::cap::process_limit().is_some();
    // Large blocks (partitions of tens of MiB) live in the ordinary arenas,
    // where freed pages can be reused (see `keep_dirty_pages`), not in the
    // oversize arena, which returns them to the system on every free.
    let conf = if limited {
        c"oversize_threshold:0,retain:false,narenas:1,tcache:false"
    } else {
        c"oversize_threshold:0"
    };
    if limited {
        // The C library's malloc, which it uses for itself (a thread's
        // start asks it for a few bytes), gives each new thread an arena
        // of its own, and each arena reserves 64 MiB of address space: the
        // runtime's threads alone took most of a few hundred MiB limit
        // (and the trap cannot evict what C code reserved). One arena
        // serves all threads instead.
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt with a valid parameter; glibc is initialised
        // before the executable's constructors run.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
    // SAFETY: single-threaded start-up; jemalloc has not read the variable
    // yet (it does so on its first allocation).
    unsafe {
        MALLOC_CONF = conf.as_ptr();
    }
    create_shared_arena();
}

/// Blocks of at least this many bytes come from one arena that every
/// thread shares ([`SHARED_ARENA`]); smaller ones from the thread's own.
///
/// jemalloc gives each thread one of several arenas, and a freed block
/// goes back to the arena it came from. An eviction on one thread freed
/// its executor's pages into that arena, and the load that followed, on
/// another thread (another prefetcher, a worker), took fresh pages from
/// its own: the kept pages were reused by chance, then purged, and the
/// load faulted and zeroed new ones (a capped PageRank: 314 huge-page
/// faults per iteration of 256 loads of 4 MiB; with one arena for large
/// blocks, about 2, and a third of the kernel time). 1 MiB: executors'
/// buffers, which loads read straight into (see `pod::DIRECT_FROM`), and
/// few enough allocations that threads do not wait on the arena's locks.
pub(crate) const SHARED_FROM: usize = 1 << 20;

/// The index of the arena large blocks share, plus one (0: none was made;
/// blocks then come from the thread's arena).
static SHARED_ARENA: AtomicU32 = AtomicU32::new(0);

/// Makes the arena large blocks share (at start-up, before `main`).
fn create_shared_arena() {
    let mut index: libc::c_uint = 0;
    let mut len = std::mem::size_of::<libc::c_uint>();
    // SAFETY: "arenas.create" writes the new arena's index, an `unsigned`,
    // into `index` (`len` bytes); it takes no input.
    let r = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arenas.create".as_ptr(),
            (&raw mut index).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if r == 0 {
        SHARED_ARENA.store(index.saturating_add(1), Ordering::Relaxed);
    }
}

/// jemalloc's flags for a block of `size` bytes aligned to `align` (both
/// from `placed`) in the shared arena, or `None` for a block the thread's
/// arena serves.
#[inline(always)]
fn shared(size: usize, align: usize) -> Option<libc::c_int> {
    if size < SHARED_FROM {
        return None;
    }
    let arena = SHARED_ARENA.load(Ordering::Relaxed);
    (arena != 0).then(|| {
        tikv_jemalloc_sys::MALLOCX_ARENA(arena as usize - 1)
            | tikv_jemalloc_sys::MALLOCX_TCACHE_NONE
            | tikv_jemalloc_sys::MALLOCX_ALIGN(align)
    })
}

/// jemalloc's allocation of `layout` (zeroed if `zero`): large blocks in
/// the shared arena.
///
/// # Safety
///
/// `layout` has a non-zero size.
#[inline(always)]
pub(crate) unsafe fn alloc(inner: &Jemalloc, layout: Layout, zero: bool) -> *mut u8 {
    match shared(layout.size(), layout.align()) {
        Some(flags) => {
            let flags = if zero {
                flags | tikv_jemalloc_sys::MALLOCX_ZERO
            } else {
                flags
            };
            // SAFETY: a non-zero size (the caller's promise) and valid
            // flags (an arena that exists, a power-of-two alignment).
            unsafe { tikv_jemalloc_sys::mallocx(layout.size(), flags).cast() }
        }
        // SAFETY: the caller's promise, passed on.
        None if zero => unsafe { inner.alloc_zeroed(layout) },
        // SAFETY: as above.
        None => unsafe { inner.alloc(layout) },
    }
}

/// jemalloc's reallocation of `ptr` (its size and the new block's
/// alignment in `layout`) to `new_size`: a large new block in the shared
/// arena if it moves.
///
/// # Safety
///
/// As for `GlobalAlloc::realloc`: `ptr` came from jemalloc, `new_size` is
/// non-zero.
#[inline(always)]
pub(crate) unsafe fn realloc(
    inner: &Jemalloc,
    ptr: *mut u8,
    layout: Layout,
    new_size: usize,
) -> *mut u8 {
    match shared(new_size, layout.align()) {
        // SAFETY: the caller's promise; jemalloc frees `ptr` only if it
        // moved it.
        Some(flags) => unsafe { tikv_jemalloc_sys::rallocx(ptr.cast(), new_size, flags).cast() },
        // SAFETY: the caller's promise, passed on.
        None => unsafe { inner.realloc(ptr, layout, new_size) },
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
