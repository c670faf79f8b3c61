//! The C entry points the runtime exports for C code in the same process,
//! chiefly the `LD_PRELOAD` shim (`liboutcore_shim.so`), which calls
//! [`outcore_evict`] when a C allocation fails or crosses its cap.
//! Declared in `alloc-shim/include/outcore.h`.
//!
//! The shim finds `outcore_evict` with `dlsym(RTLD_DEFAULT, ..)`, which
//! needs the symbol in the executable's dynamic symbol table: outcore's own
//! binaries, tests and examples are linked with
//! `-Wl,--export-dynamic-symbol=outcore_*` (see `build.rs`). For any other
//! program, the runtime also hands the entry point to the shim directly
//! when it starts (`outcore_shim_register`), so no link flag is needed.

/// Evicts idle executors of the runtimes in this process until at least
/// `bytes` are freed or nothing is left to evict, and returns the bytes
/// freed (0 when there is no runtime or nothing to evict; 1 when another
/// thread's eviction ran meanwhile, meaning "retry").
///
/// Safe to call from any thread, including from inside `malloc` (it never
/// calls `malloc` on its own account; the Rust allocations it makes go to
/// jemalloc).
#[no_mangle]
pub extern "C" fn outcore_evict(bytes: usize) -> usize {
    super::trap::evict_external(bytes)
}

/// Bytes accounted as in use by the process's Rust allocations (the
/// executors and everything else allocated through `TrapAlloc`).
#[no_mangle]
pub extern "C" fn outcore_usage() -> usize {
    super::account::current_usage()
}

/// The soft cap in bytes, or 0 when there is none.
#[no_mangle]
pub extern "C" fn outcore_cap() -> usize {
    super::account::soft_cap().unwrap_or(0)
}

type RegisterFn = unsafe extern "C" fn(Option<extern "C" fn(usize) -> usize>);

type RegisterUsageFn = unsafe extern "C" fn(Option<extern "C" fn() -> usize>);

/// If the shim is loaded, takes [`outcore_evict`] and [`outcore_usage`]
/// back from it: the last runtime is gone, and the library holding this
/// code may be unloaded next (`dlclose`), which would leave the shim
/// calling into unmapped code.
pub(crate) fn withdraw_from_shim() {
    // SAFETY: dlsym with NUL-terminated names; RTLD_DEFAULT searches the
    // whole process. The shim exports both functions with exactly these C
    // signatures, and takes NULL to withdraw.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"outcore_shim_register".as_ptr());
        if !f.is_null() {
            std::mem::transmute::<*mut libc::c_void, RegisterFn>(f)(None);
        }
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"outcore_shim_register_usage".as_ptr());
        if !f.is_null() {
            std::mem::transmute::<*mut libc::c_void, RegisterUsageFn>(f)(None);
        }
    }
}

/// If the shim is loaded, hands it [`outcore_evict`] and [`outcore_usage`]
/// directly.
pub(crate) fn announce_to_shim() {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the
    // whole process.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"outcore_shim_register".as_ptr()) };
    if !f.is_null() {
        // SAFETY: the shim exports `outcore_shim_register` with exactly
        // this C signature.
        unsafe {
            let register = std::mem::transmute::<*mut libc::c_void, RegisterFn>(f);
            register(Some(outcore_evict));
        }
    }
    // SAFETY: as above.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"outcore_shim_register_usage".as_ptr()) };
    if !f.is_null() {
        // SAFETY: the shim exports `outcore_shim_register_usage` with
        // exactly this C signature.
        unsafe {
            let register = std::mem::transmute::<*mut libc::c_void, RegisterUsageFn>(f);
            register(Some(outcore_usage));
        }
    }
}
