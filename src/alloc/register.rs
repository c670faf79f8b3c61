//! Registering a runtime with the allocator: its evictor in the trap's
//! registry, the reserve and the headroom set up, the `fork()` handler,
//! and the handshake with the `LD_PRELOAD` shim (`ffi.rs`), all under one
//! lifecycle lock. Never on the allocator's paths.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::trap::{self, Evictor};
use super::{account, ffi, headroom, jemalloc, reserve};

/// Keeps an evictor registered with the allocator; unregisters on drop.
pub(crate) struct Registration {
    slot: usize,
}

/// Registers `evictor` with the trap. `limits` are the limit the process
/// runs under (requests above it are refused at once, without eviction)
/// and the machine's memory (a refusal above it prints no diagnostic).
/// Returns `None` when all slots are taken (more than 64 runtimes alive at
/// once).
pub(crate) fn register(evictor: Arc<dyn Evictor>, limits: (usize, usize)) -> Option<Registration> {
    reserve::init();
    jemalloc::touch_init();
    account::set_limits(limits.0, limits.1);
    install_fork_handler();
    let entry = trap::new_entry(evictor);
    let _lifecycle = Lifecycle::lock();
    let slot = trap::insert(entry)?;
    headroom::keep(crate::cap::rlimit_as());
    ffi::announce_to_shim();
    Some(Registration { slot })
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _lifecycle = Lifecycle::lock();
        // The last runtime of this process (not counting a parent's,
        // inherited across a `fork()`).
        if !trap::remove(self.slot) {
            headroom::forget();
            ffi::withdraw_from_shim();
        }
    }
}

/// Held while a runtime registers or unregisters: the last one going must
/// not give up the headroom or withdraw from the shim after a new one has
/// come (a check, then an action). A spin lock, reset in a `fork()` child
/// (a `std` mutex held by another thread at the fork would stay locked
/// there). Never taken by the allocator's paths.
struct Lifecycle(());

static LIFECYCLE: AtomicBool = AtomicBool::new(false);

impl Lifecycle {
    fn lock() -> Lifecycle {
        while LIFECYCLE
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        Lifecycle(())
    }
}

impl Drop for Lifecycle {
    fn drop(&mut self) {
        LIFECYCLE.store(false, Ordering::Release);
    }
}

/// Set once the fork handler is installed.
static FORK_HANDLER: AtomicBool = AtomicBool::new(false);

/// Installs (once) a `pthread_atfork` child handler that resets the trap:
/// a `fork()` while another thread held the token or read the registry
/// would otherwise leave the child, where that thread does not exist,
/// waiting for it.
fn install_fork_handler() {
    if !FORK_HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain `extern "C"` function that only stores
        // to atomics (async-signal-safe, as a child handler must be).
        unsafe {
            libc::pthread_atfork(None, None, Some(reset_after_fork));
        }
    }
}

/// In the child of a `fork()`: no other thread exists, so none holds the
/// lifecycle lock or the trap's token (see [`trap::reset_after_fork`]).
extern "C" fn reset_after_fork() {
    trap::reset_after_fork();
    LIFECYCLE.store(false, Ordering::Release);
}
