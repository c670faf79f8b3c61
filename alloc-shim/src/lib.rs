//! `liboutcore_shim.so`: the outcore allocation trap for C code.
//!
//! Loaded with `LD_PRELOAD`, it interposes the C allocation functions
//! (`malloc`, `calloc`, `realloc`, `free`, `posix_memalign`,
//! `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size`)
//! and forwards them to the next allocator in the chain (found with
//! `dlsym(RTLD_NEXT, ..)`, so it composes with glibc or a preloaded
//! jemalloc).
//!
//! When a C allocation fails, or would take the process over
//! `OUTCORE_MEM_CAP` (one budget: the usable sizes of live C allocations
//! plus the runtime's Rust usage; eviction runs only when it can help, so
//! never while the C allocations alone exceed the cap), it calls the
//! eviction entry point
//! of the outcore runtime in the same process, `outcore_evict(bytes)`
//! (looked up with `dlsym(RTLD_DEFAULT, ..)`, or registered by the runtime
//! through `outcore_shim_register`), asks the allocator to give memory back
//! (jemalloc's `mallctl` purge when present, otherwise `malloc_trim(0)`),
//! and retries. Without a runtime in the process it is a pass-through.
//!
//! Rules for this file: no Rust allocation (the Rust allocator of a cdylib
//! is `malloc` itself), no panics, no locks. `dlsym` may allocate while
//! the real functions are being looked up: those requests are served from a
//! static bootstrap buffer.
//!
//! `OUTCORE_SHIM_STATS=1` prints, at exit, calls, bytes, failures,
//! evictions requested and bytes freed, without allocating.

#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::cell::Cell;

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
type AlignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;
type EvictFn = unsafe extern "C" fn(usize) -> usize;
type UsageFn = unsafe extern "C" fn() -> usize;
type MallctlFn =
    unsafe extern "C" fn(*const c_char, *mut c_void, *mut usize, *mut c_void, usize) -> c_int;

/// The next allocator's functions, as addresses (0 = not resolved).
struct Real {
    malloc: AtomicUsize,
    calloc: AtomicUsize,
    realloc: AtomicUsize,
    free: AtomicUsize,
    posix_memalign: AtomicUsize,
    aligned_alloc: AtomicUsize,
    memalign: AtomicUsize,
    valloc: AtomicUsize,
    pvalloc: AtomicUsize,
    usable: AtomicUsize,
}

static REAL: Real = Real {
    malloc: AtomicUsize::new(0),
    calloc: AtomicUsize::new(0),
    realloc: AtomicUsize::new(0),
    free: AtomicUsize::new(0),
    posix_memalign: AtomicUsize::new(0),
    aligned_alloc: AtomicUsize::new(0),
    memalign: AtomicUsize::new(0),
    valloc: AtomicUsize::new(0),
    pvalloc: AtomicUsize::new(0),
    usable: AtomicUsize::new(0),
};

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNINIT);

/// The cap on C allocations in bytes (0 = none).
static CAP: AtomicUsize = AtomicUsize::new(0);
/// Usable bytes of live C allocations (counted only with a cap).
static USED: AtomicUsize = AtomicUsize::new(0);
static STATS_ON: AtomicBool = AtomicBool::new(false);
/// Non-zero when results must be checked: bit 0 for the cap or the stats,
/// bit 1 once a runtime has registered. Zero means pure pass-through.
static MODE: AtomicU8 = AtomicU8::new(0);

/// Counters for `OUTCORE_SHIM_STATS` (updated only when it is set, except
/// the rare-path ones).
static CALLS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static EVICT_REQUESTS: AtomicU64 = AtomicU64::new(0);
static BYTES_FREED: AtomicU64 = AtomicU64::new(0);
static BOOTSTRAP_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// The runtime's eviction entry point, when found with `dlsym` (0 = not
/// looked up yet, [`ABSENT`] = looked up, not exported).
static EVICT: AtomicUsize = AtomicUsize::new(0);
/// The runtime's usage query (`outcore_usage`), likewise.
static USAGE: AtomicUsize = AtomicUsize::new(0);
/// The entry points a runtime registered itself (fallback).
static REGISTERED: AtomicUsize = AtomicUsize::new(0);
static REGISTERED_USAGE: AtomicUsize = AtomicUsize::new(0);
/// A looked-up symbol that is not there: the look-up is not repeated
/// (`dlsym` allocates its error message on every failure).
const ABSENT: usize = 1;
/// A look-up is under way (on some thread).
const BUSY: usize = 2;
/// `dlsym` look-ups of the runtime's entry points (for the stats).
static LOOKUPS: AtomicU64 = AtomicU64::new(0);
/// The runtime's usage when an eviction last freed nothing: evicting again
/// is pointless until it changes.
static FUTILE_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// jemalloc's `mallctl`, when present (1 = looked up, absent).
static MALLCTL: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set while this thread is inside the runtime's eviction: its own C
    /// allocations must not re-enter it.
    static IN_EVICT: Cell<bool> = const { Cell::new(false) };
}

// ---- bootstrap buffer ----------------------------------------------------

const BOOT_BYTES: usize = 256 << 10;

#[repr(C, align(64))]
struct Boot([u8; BOOT_BYTES]);

static mut BOOT: Boot = Boot([0; BOOT_BYTES]);
static BOOT_NEXT: AtomicUsize = AtomicUsize::new(0);

fn boot_base() -> usize {
    core::ptr::addr_of_mut!(BOOT) as usize
}

fn in_boot(p: *mut c_void) -> bool {
    let a = p as usize;
    a >= boot_base() && a < boot_base() + BOOT_BYTES
}

/// Serves a request from the bootstrap buffer: 16 bytes of header (the
/// size) before each block; never freed. Zeroed, since the buffer starts
/// zeroed and is never reused.
fn boot_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(16);
    let mut cur = BOOT_NEXT.load(Ordering::Relaxed);
    loop {
        let start = (boot_base() + cur + 16).next_multiple_of(align) - boot_base();
        let end = match start.checked_add(size) {
            Some(e) if e <= BOOT_BYTES => e,
            _ => return core::ptr::null_mut(),
        };
        match BOOT_NEXT.compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                let p = (boot_base() + start) as *mut u8;
                // SAFETY: `start - 16 .. end` lies inside the buffer and
                // this range was reserved by the exchange above.
                unsafe { (p.sub(16) as *mut usize).write_unaligned(size) };
                BOOTSTRAP_ALLOCS.fetch_add(1, Ordering::Relaxed);
                return p.cast();
            }
            Err(now) => cur = now,
        }
    }
}

fn boot_size(p: *mut c_void) -> usize {
    // SAFETY: `p` came from `boot_alloc`, which wrote the size 16 bytes
    // before it.
    unsafe { ((p as *mut u8).sub(16) as *const usize).read_unaligned() }
}

// ---- resolution ------------------------------------------------------------

unsafe fn next(name: &core::ffi::CStr) -> usize {
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is valid in a shared
    // object.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
}

/// Resolves the next allocator's functions; true when ready. Requests made
/// during resolution (by `dlsym`) see `false` and use the bootstrap buffer.
#[inline]
fn ready() -> bool {
    if STATE.load(Ordering::Acquire) == READY {
        return true;
    }
    init()
}

#[cold]
fn init() -> bool {
    if STATE
        .compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread (or a recursive call) is resolving.
        return STATE.load(Ordering::Acquire) == READY;
    }
    // SAFETY: dlsym with NUL-terminated names.
    unsafe {
        REAL.malloc.store(next(c"malloc"), Ordering::Relaxed);
        REAL.calloc.store(next(c"calloc"), Ordering::Relaxed);
        REAL.realloc.store(next(c"realloc"), Ordering::Relaxed);
        REAL.free.store(next(c"free"), Ordering::Relaxed);
        REAL.posix_memalign
            .store(next(c"posix_memalign"), Ordering::Relaxed);
        REAL.aligned_alloc
            .store(next(c"aligned_alloc"), Ordering::Relaxed);
        REAL.memalign.store(next(c"memalign"), Ordering::Relaxed);
        REAL.valloc.store(next(c"valloc"), Ordering::Relaxed);
        REAL.pvalloc.store(next(c"pvalloc"), Ordering::Relaxed);
        REAL.usable
            .store(next(c"malloc_usable_size"), Ordering::Relaxed);
    }
    // SAFETY: getenv returns null or a NUL-terminated string that stays
    // valid while the environment is not modified (we copy nothing).
    unsafe {
        let cap = libc::getenv(c"OUTCORE_MEM_CAP".as_ptr());
        if !cap.is_null() {
            let text = core::ffi::CStr::from_ptr(cap).to_bytes();
            let bytes = parse_size(text);
            let off = matches!(
                text.trim_ascii(),
                b"0" | b"none" | b"off" | b"unlimited" | b"NONE" | b"OFF"
            );
            if bytes == 0 && !off {
                let mut b = linebuf::LineBuf::new();
                b.push(b"outcore-shim: OUTCORE_MEM_CAP='");
                b.push(text);
                b.push(b"' is not a size (like 512MiB, 2GiB, 1.5G or 4096); no cap\n");
                b.write_stderr();
            }
            CAP.store(bytes, Ordering::Relaxed);
        }
        let st = libc::getenv(c"OUTCORE_SHIM_STATS".as_ptr());
        if !st.is_null() && *st != 0 && *st != b'0' as c_char {
            STATS_ON.store(true, Ordering::Relaxed);
            libc::atexit(print_stats);
        }
    }
    let slow = CAP.load(Ordering::Relaxed) != 0 || STATS_ON.load(Ordering::Relaxed);
    MODE.fetch_or(u8::from(slow), Ordering::Relaxed);
    let ok = REAL.malloc.load(Ordering::Relaxed) != 0 && REAL.free.load(Ordering::Relaxed) != 0;
    STATE.store(if ok { READY } else { UNINIT }, Ordering::Release);
    ok
}

/// The smallest of `RLIMIT_AS` and the machine's memory plus swap, read
/// when an allocation fails (no allocation: two system calls). A larger
/// request fails without asking the runtime to evict: evicting every
/// executor could not make it fit.
fn hopeless_above() -> usize {
    let mut limit = usize::MAX;
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0 && r.rlim_cur != libc::RLIM_INFINITY
    {
        limit = usize::try_from(r.rlim_cur).unwrap_or(usize::MAX);
    }
    // SAFETY: an all-zero sysinfo is a valid value of this plain C struct.
    let mut si: libc::sysinfo = unsafe { core::mem::zeroed() };
    // SAFETY: `si` is a valid, writable sysinfo struct.
    if unsafe { libc::sysinfo(&mut si) } == 0 {
        let unit = u64::from(si.mem_unit.max(1));
        let total = (si.totalram as u64)
            .saturating_add(si.totalswap as u64)
            .saturating_mul(unit);
        if total > 0 {
            limit = limit.min(usize::try_from(total).unwrap_or(usize::MAX));
        }
    }
    limit
}

/// The runtime's size parser (`MemoryCap::parse`), the same file: `512MiB`,
/// `2G`, `1.5GiB`, `300MB`, `1TB`, `4096`, `2 MiB`, any case, spaces
/// around. It allocates nothing and does not panic.
#[path = "../../src/size.rs"]
#[expect(dead_code, reason = "the shim needs no reason, only whether it parsed")]
mod size;

/// `OUTCORE_MEM_CAP`'s bytes, as the runtime parses them; 0 when malformed.
fn parse_size(s: &[u8]) -> usize {
    core::str::from_utf8(s)
        .ok()
        .and_then(|s| size::parse(s).ok())
        .map_or(0, |b| usize::try_from(b).unwrap_or(usize::MAX))
}

macro_rules! real {
    ($field:ident, $ty:ty) => {{
        let a = REAL.$field.load(Ordering::Relaxed);
        // SAFETY: a non-zero address stored by `init` is the next
        // object's function of this exact C signature.
        (a != 0).then(|| unsafe { core::mem::transmute::<usize, $ty>(a) })
    }};
}

#[inline]
fn usable(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if in_boot(p) {
        return boot_size(p);
    }
    match real!(usable, UsableFn) {
        // SAFETY: `p` is a live block of the next allocator.
        Some(f) => unsafe { f(p) },
        None => 0,
    }
}

// ---- the trap ----------------------------------------------------------------

/// Looks `name` up once (cached in `slot`, [`ABSENT`] when missing), or
/// falls back to what the runtime registered. `dlsym` itself may call
/// `malloc`: while a look-up is under way ([`BUSY`]) such nested calls see
/// no symbol instead of looking it up again.
fn lookup(slot: &AtomicUsize, name: &core::ffi::CStr, registered: &AtomicUsize) -> usize {
    let mut a = slot.load(Ordering::Acquire);
    if a == 0 {
        if slot
            .compare_exchange(0, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            LOOKUPS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT
            // searches the whole process.
            a = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize };
            if a == 0 {
                a = ABSENT;
            }
            slot.store(a, Ordering::Release);
        } else {
            a = BUSY;
        }
    }
    if a == ABSENT || a == BUSY {
        a = registered.load(Ordering::Acquire);
    }
    a
}

/// Finds the runtime's eviction entry point.
fn evict_fn() -> Option<EvictFn> {
    let a = lookup(&EVICT, c"outcore_evict", &REGISTERED);
    // SAFETY: the address is `outcore_evict`, exported (or registered) by
    // the runtime with this C signature.
    (a != 0).then(|| unsafe { core::mem::transmute::<usize, EvictFn>(a) })
}

/// Bytes the runtime's Rust allocations use (0 without a runtime).
fn runtime_usage() -> usize {
    let a = lookup(&USAGE, c"outcore_usage", &REGISTERED_USAGE);
    if a == 0 {
        return 0;
    }
    // SAFETY: the address is `outcore_usage`, exported (or registered) by
    // the runtime with this C signature; it only reads an atomic.
    unsafe { core::mem::transmute::<usize, UsageFn>(a)() }
}

/// Asks the allocator to return free memory to the system.
fn purge() {
    let mut m = MALLCTL.load(Ordering::Acquire);
    if m == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        m = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallctl".as_ptr()) as usize };
        MALLCTL.store(if m == 0 { 1 } else { m }, Ordering::Release);
    }
    if m > 1 {
        // SAFETY: `m` is jemalloc's mallctl; "arena.4096.purge" takes no
        // input or output.
        unsafe {
            let f = core::mem::transmute::<usize, MallctlFn>(m);
            f(
                c"arena.4096.purge".as_ptr(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                0,
            );
        }
    } else {
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
    }
}

/// Asks the runtime to evict `bytes`; true when it freed something.
#[cold]
fn reclaim(bytes: usize) -> bool {
    if IN_EVICT.try_with(Cell::get).unwrap_or(true) {
        return false;
    }
    let _ = IN_EVICT.try_with(|c| c.set(true));
    let freed = match evict_fn() {
        Some(f) => {
            EVICT_REQUESTS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the runtime's C entry point; it evicts and returns.
            unsafe { f(bytes) }
        }
        None => 0,
    };
    if freed > 0 {
        BYTES_FREED.fetch_add(freed as u64, Ordering::Relaxed);
        purge();
    }
    let _ = IN_EVICT.try_with(|c| c.set(false));
    freed > 0
}

/// Before an allocation of `size` bytes: evict if it would cross the cap.
#[inline(always)]
fn before(size: usize) {
    if MODE.load(Ordering::Relaxed) != 0 {
        before_slow(size);
    }
}

/// The cap is one budget: C allocations plus the runtime's Rust usage.
/// Eviction frees Rust executors only, so it runs only when it can help:
/// when the C allocations alone are under the cap, and the runtime's usage
/// changed since an eviction last freed nothing.
#[cold]
#[inline(never)]
fn before_slow(size: usize) {
    let cap = CAP.load(Ordering::Relaxed);
    if cap == 0 {
        return;
    }
    let c = USED.load(Ordering::Relaxed).saturating_add(size);
    if c >= cap {
        // C alone fills the cap: evicting executors cannot bring it under.
        return;
    }
    let rust = runtime_usage();
    if c.saturating_add(rust) <= cap || rust == FUTILE_AT.load(Ordering::Relaxed) {
        return;
    }
    let want = (c + rust - cap).saturating_add(cap / 32);
    if !reclaim(want) {
        FUTILE_AT.store(rust, Ordering::Relaxed);
    }
}

/// After an allocation attempt: account it, or retry through the runtime.
#[inline(always)]
fn after(p: *mut c_void, size: usize, retry: impl Fn() -> *mut c_void) -> *mut c_void {
    if !p.is_null() && MODE.load(Ordering::Relaxed) == 0 {
        return p;
    }
    after_slow(p, size, retry)
}

#[cold]
#[inline(never)]
fn after_slow(p: *mut c_void, size: usize, retry: impl Fn() -> *mut c_void) -> *mut c_void {
    let mut p = p;
    if p.is_null() && size != 0 && size <= hopeless_above() {
        for _ in 0..4 {
            if !reclaim(size.saturating_mul(2)) {
                break;
            }
            p = retry();
            if !p.is_null() {
                break;
            }
        }
    }
    if p.is_null() && size != 0 {
        FAILURES.fetch_add(1, Ordering::Relaxed);
        // SAFETY: errno is thread-local and always writable.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return p;
    }
    if CAP.load(Ordering::Relaxed) != 0 {
        USED.fetch_add(usable(p), Ordering::Relaxed);
    }
    if STATS_ON.load(Ordering::Relaxed) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
    p
}

#[inline]
fn forget(p: *mut c_void) {
    if !p.is_null() && CAP.load(Ordering::Relaxed) != 0 {
        let u = usable(p);
        let _ = USED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(u))
        });
    }
}

// ---- the interposed functions --------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    let a = REAL.malloc.load(Ordering::Relaxed);
    if a != 0 && MODE.load(Ordering::Relaxed) == 0 {
        // Pass-through: no runtime, no cap, no stats. A tail call.
        // SAFETY: the address stored by `init` is the next allocator's
        // `malloc`.
        return unsafe { core::mem::transmute::<usize, MallocFn>(a)(size) };
    }
    // SAFETY: same contract as this function.
    unsafe { malloc_slow(size) }
}

#[cold]
#[inline(never)]
unsafe fn malloc_slow(size: usize) -> *mut c_void {
    if !ready() {
        return boot_alloc(size, 16);
    }
    let Some(f) = real!(malloc, MallocFn) else {
        return core::ptr::null_mut();
    };
    before(size);
    // SAFETY: forwarding to the next allocator's malloc.
    let p = unsafe { f(size) };
    // SAFETY: same.
    after(p, size, || unsafe { f(size) })
}

#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        // SAFETY: errno is thread-local and always writable.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return core::ptr::null_mut();
    };
    if !ready() {
        return boot_alloc(total, 16);
    }
    let Some(f) = real!(calloc, CallocFn) else {
        return core::ptr::null_mut();
    };
    before(total);
    // SAFETY: forwarding to the next allocator's calloc.
    let p = unsafe { f(n, size) };
    // SAFETY: same.
    after(p, total, || unsafe { f(n, size) })
}

#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if in_boot(p) {
        return;
    }
    if MODE.load(Ordering::Relaxed) != 0 {
        forget(p);
    }
    let a = REAL.free.load(Ordering::Relaxed);
    if a != 0 {
        // SAFETY:
        // - the address stored by `init` is the next allocator's `free`;
        // - `p` is null or a live block of that allocator (the caller's
        //   contract; bootstrap blocks were handled above).
        unsafe { core::mem::transmute::<usize, FreeFn>(a)(p) }
    }
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { malloc(size) };
    }
    if in_boot(p) {
        // Move a bootstrap block out to the real allocator.
        // SAFETY: malloc has no preconditions.
        let q = unsafe { malloc(size) };
        if !q.is_null() {
            // SAFETY: both blocks are live, distinct, and at least
            // min(old, new) bytes long.
            unsafe {
                core::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, boot_size(p).min(size))
            };
        }
        return q;
    }
    if !ready() {
        return core::ptr::null_mut();
    }
    let Some(f) = real!(realloc, ReallocFn) else {
        return core::ptr::null_mut();
    };
    let counting = CAP.load(Ordering::Relaxed) != 0;
    let old = if counting { usable(p) } else { 0 };
    let uncount = |n: usize| {
        if counting {
            let _ = USED.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
        }
    };
    before(size.saturating_sub(old));
    // SAFETY: `p` is a live block of the next allocator.
    let q = unsafe { f(p, size) };
    if q.is_null() && size == 0 {
        // realloc(p, 0) freed p.
        uncount(old);
        return q;
    }
    // On failure `p` is untouched, so retrying is sound; `after` counts
    // the new block.
    // SAFETY: as above.
    let q = after(q, size, || unsafe { f(p, size) });
    if !q.is_null() {
        uncount(old);
    }
    q
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !ready() {
        let p = boot_alloc(size, align);
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: the caller passes a valid out pointer.
        unsafe { *out = p };
        return 0;
    }
    let Some(f) = real!(posix_memalign, PosixMemalignFn) else {
        return libc::ENOMEM;
    };
    before(size);
    let attempt = || {
        let mut p = core::ptr::null_mut();
        // SAFETY: forwarding with a valid out pointer.
        let rc = unsafe { f(&mut p, align, size) };
        (rc, p)
    };
    let (rc, p) = attempt();
    if rc == libc::EINVAL {
        return rc;
    }
    let p = after(p, size, || attempt().1);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid out pointer.
    unsafe { *out = p };
    0
}

/// Sets `errno` to `e` and returns null: an invalid request, answered at
/// once (no eviction can make it valid).
fn invalid(e: c_int) -> *mut c_void {
    // SAFETY: errno is thread-local and always writable.
    unsafe { *libc::__errno_location() = e };
    core::ptr::null_mut()
}

/// Whether `align` is one `aligned_alloc` accepts: a power of two.
fn aligned_alloc_ok(align: usize) -> bool {
    align.is_power_of_two()
}

/// Whether `align` is one `memalign` accepts: glibc rounds other values up
/// to a power of two, which fails only past `usize::MAX / 2 + 1`.
fn memalign_ok(align: usize) -> bool {
    align <= usize::MAX / 2 + 1
}

macro_rules! aligned {
    ($name:ident, $field:ident, $valid:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(align: usize, size: usize) -> *mut c_void {
            if !$valid(align) {
                return invalid(libc::EINVAL);
            }
            if !ready() {
                return boot_alloc(size, align);
            }
            let Some(f) = real!($field, AlignFn) else {
                return core::ptr::null_mut();
            };
            before(size);
            // SAFETY: errno is thread-local and always readable and
            // writable. It is cleared to tell the next allocator's EINVAL
            // from an older value, and the caller's value is put back on
            // success (no function sets errno to 0 for its caller).
            let saved = unsafe { *libc::__errno_location() };
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: forwarding to the next allocator.
            let p = unsafe { f(align, size) };
            // SAFETY: errno is thread-local and always readable.
            let e = unsafe { *libc::__errno_location() };
            if p.is_null() && e == libc::EINVAL {
                // The next allocator refused the request itself.
                return invalid(libc::EINVAL);
            }
            // SAFETY: same as above.
            let p = after(p, size, || unsafe { f(align, size) });
            if !p.is_null() {
                // SAFETY: as above.
                unsafe { *libc::__errno_location() = saved };
            }
            p
        }
    };
}

aligned!(aligned_alloc, aligned_alloc, aligned_alloc_ok);
aligned!(memalign, memalign, memalign_ok);

macro_rules! paged {
    ($name:ident, $field:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(size: usize) -> *mut c_void {
            if !ready() {
                return boot_alloc(size, 4096);
            }
            let Some(f) = real!($field, MallocFn) else {
                return core::ptr::null_mut();
            };
            before(size);
            // SAFETY: forwarding to the next allocator.
            let p = unsafe { f(size) };
            // SAFETY: same.
            after(p, size, || unsafe { f(size) })
        }
    };
}

paged!(valloc, valloc);
paged!(pvalloc, pvalloc);

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if !ready() && !in_boot(p) {
        return 0;
    }
    usable(p)
}

/// Lets a runtime register its eviction entry point directly (for programs
/// that do not export `outcore_evict` dynamically). Idempotent. NULL
/// withdraws it, and forgets the entry point found by name, so that a
/// library holding the runtime can be unloaded (`dlclose`): the next
/// failing allocation looks it up again.
#[no_mangle]
pub extern "C" fn outcore_shim_register(evict: Option<EvictFn>) {
    match evict {
        Some(f) => {
            REGISTERED.store(f as usize, Ordering::Release);
            // A runtime is here: results must be checked for null so
            // failed allocations can be retried after an eviction.
            MODE.fetch_or(2, Ordering::Relaxed);
        }
        None => {
            REGISTERED.store(0, Ordering::Release);
            EVICT.store(0, Ordering::Release);
        }
    }
}

/// Lets a runtime register its usage query (`outcore_usage`) directly, so
/// that `OUTCORE_MEM_CAP` budgets C and Rust allocations together in
/// programs that do not export it dynamically. Idempotent. NULL withdraws
/// it (see [`outcore_shim_register`]).
#[no_mangle]
pub extern "C" fn outcore_shim_register_usage(usage: Option<UsageFn>) {
    match usage {
        Some(f) => REGISTERED_USAGE.store(f as usize, Ordering::Release),
        None => {
            REGISTERED_USAGE.store(0, Ordering::Release);
            USAGE.store(0, Ordering::Release);
            FUTILE_AT.store(usize::MAX, Ordering::Relaxed);
        }
    }
}

/// Usable bytes of live C allocations as the shim counts them (0 unless
/// `OUTCORE_MEM_CAP` is set).
#[no_mangle]
pub extern "C" fn outcore_shim_usage() -> usize {
    USED.load(Ordering::Relaxed)
}

// ---- stats at exit -----------------------------------------------------------

#[path = "../../src/alloc/linebuf.rs"]
#[expect(
    dead_code,
    reason = "the shim writes plain lines: no process name, no reading back"
)]
mod linebuf;

extern "C" fn print_stats() {
    let mut b = linebuf::LineBuf::new();
    b.push(b"outcore-shim[");
    b.num(u64::from(std::process::id()));
    b.push(b"]: calls ");
    b.num(CALLS.load(Ordering::Relaxed));
    b.push(b", bytes ");
    b.num(BYTES.load(Ordering::Relaxed));
    b.push(b", failures ");
    b.num(FAILURES.load(Ordering::Relaxed));
    b.push(b", evictions requested ");
    b.num(EVICT_REQUESTS.load(Ordering::Relaxed));
    b.push(b", bytes freed ");
    b.num(BYTES_FREED.load(Ordering::Relaxed));
    b.push(b", lookups ");
    b.num(LOOKUPS.load(Ordering::Relaxed));
    b.push(b", bootstrap allocations ");
    b.num(BOOTSTRAP_ALLOCS.load(Ordering::Relaxed));
    b.push(b", cap ");
    b.num(CAP.load(Ordering::Relaxed) as u64);
    b.push(b"\n");
    b.write_stderr();
}
