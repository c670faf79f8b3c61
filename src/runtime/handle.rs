//! [`Handle`]: the user's reference to an executor.

use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::registry::CycleId;
use super::shared::Shared;
use crate::error::{Error, ExecutorId, Result};
use crate::executor::{Slot, State, NONE};

/// A handle to an executor holding a `T`. Cheap to pass by reference;
/// dropping it frees the executor's memory and its spill file.
///
/// Dropping it waits while a task holds the executor (the value is freed
/// when the task gives it back); from the moment the drop begins, no other
/// task starts on it, and those still queued fail with
/// [`Error::UnknownExecutor`] (removed). A thread must therefore not drop a
/// handle whose executor a task it waits for holds: drop it after the
/// batch that uses it has returned, or move it into the last task on the
/// executor and drop it there (a task that drops its own executor's last
/// handle does not wait: the executor goes when the task returns).
pub struct Handle<T> {
    pub(crate) slot: Option<Arc<Slot>>,
    pub(crate) shared: Weak<Shared>,
    /// The runtime's identity ([`Shared::ident`]), which its keys carry.
    pub(crate) runtime: u64,
    pub(crate) _t: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// The executor's id.
    pub fn id(&self) -> ExecutorId {
        self.slot.as_ref().map_or(0, |s| s.id)
    }

    /// The executor's current state: [`State::Removed`] once its runtime
    /// is dropped (the calls that take the handle then return
    /// [`Error::UnknownExecutor`]).
    pub fn state(&self) -> State {
        match &self.slot {
            // The same test `into_inner` makes: the runtime's shared state
            // is gone.
            Some(s) if self.shared.strong_count() > 0 => s.state_hint(),
            _ => State::Removed,
        }
    }

    /// Bytes the executor takes in memory, as last measured.
    pub fn size(&self) -> usize {
        self.slot
            .as_ref()
            .map_or(0, |s| s.size.load(Ordering::Relaxed))
    }

    /// The declared cycle the executor is in and its position there, if
    /// any (see [`Runtime::hint_cycle`](crate::Runtime::hint_cycle)).
    pub fn cycle_position(&self) -> Option<(CycleId, u64)> {
        let s = self.slot.as_ref()?;
        let id = s.cycle_id.load(Ordering::Relaxed);
        let pos = s.cycle_pos.load(Ordering::Relaxed);
        (id != NONE && pos != NONE).then_some((CycleId(id), pos))
    }
}

impl<T: Send + 'static> Handle<T> {
    /// Takes the value back out of the runtime (loading it if needed).
    ///
    /// # Errors
    ///
    /// The errors of a task on the executor: [`Error::SpillRead`] when it
    /// cannot be loaded, [`Error::Poisoned`] after a panic in a `&mut`
    /// task, [`Error::UnknownExecutor`] when the runtime is gone,
    /// [`Error::Reentrant`] when called from a task on this very executor
    /// (which holds it; the handle is consumed all the same, so the
    /// executor is freed when that task returns), and [`Error::Forked`] in
    /// a child process created by `fork()`.
    pub fn into_inner(mut self) -> Result<T> {
        let slot = self.slot.take().ok_or_else(|| Error::UnknownExecutor {
            executor: "executor".into(),
            removed: true,
        })?;
        let shared = self
            .shared
            .upgrade()
            .ok_or_else(|| Error::UnknownExecutor {
                executor: slot.label.clone(),
                removed: false,
            })?;
        // In a fork child the executor is the parent's: left as it is
        // (see `Drop`).
        shared.check_process()?;
        // A task that holds executors and calls this under an address-space
        // limit is told to give way to a load in flight; it has nothing of
        // this call's to give back, so it looks again shortly.
        let v = loop {
            match shared.acquire(&slot, true) {
                Ok(Some(v)) => break v,
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(1)),
                Err(e) => {
                    // Poisoned or damaged: the handle is gone, so is the value.
                    shared.remove(&slot, true);
                    return Err(e);
                }
            }
        };
        shared.remove(&slot, false);
        shared.unpin();
        v.downcast::<T>()
            .map(|b| *b)
            .map_err(|_| Error::UnknownExecutor {
                executor: slot.label.clone(),
                removed: false,
            })
    }
}

impl<T> Handle<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    /// Takes the executor out of the runtime as bytes (its spill format:
    /// a checked header, then the value), for
    /// [`Runtime::insert_bytes`](crate::Runtime::insert_bytes) to register
    /// in another runtime: this is how an executor moves to another
    /// process. Like [`Handle::into_inner`], it consumes the handle and
    /// removes the executor (and its spill file); an evicted executor is
    /// loaded first. The value and its bytes are both in memory while it
    /// is encoded.
    ///
    /// # Errors
    ///
    /// The errors of [`Handle::into_inner`];
    /// [`Error::ExportFailed`] when the value cannot be encoded (its
    /// `Serialize` fails or panics).
    pub fn into_bytes(self) -> Result<Vec<u8>> {
        let label = self
            .slot
            .as_ref()
            .map_or_else(|| "executor".to_string(), |s| s.label.clone());
        let size = self.size();
        let value = self.into_inner()?;
        // The value's `Serialize` is user code: a panic is a failed encode.
        let encoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::spill::encode_bytes(export_key::<T>(), &value)
        }))
        .unwrap_or_else(|_| Err("encoding panicked".into()));
        crate::executor::drop_user_value(value);
        encoded.map_err(|reason| Error::ExportFailed {
            executor: label,
            bytes: size,
            reason,
        })
    }
}

/// The key of exported bytes: no executor or generation of any runtime,
/// the type's fingerprint.
pub(crate) fn export_key<T: 'static>() -> crate::spill::FileKey {
    crate::spill::FileKey {
        executor: 0,
        generation: 0,
        fingerprint: crate::spill::fingerprint::<T>(),
    }
}

impl<T> Drop for Handle<T> {
    fn drop(&mut self) {
        if let (Some(slot), Some(shared)) = (self.slot.take(), self.shared.upgrade()) {
            // In a child created by `fork()` the spill file is the
            // parent's: the executor stays registered, untouched.
            if shared.check_process().is_ok() {
                shared.remove(&slot, true);
            }
        }
    }
}

impl<T> std::fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.slot {
            Some(s) => write!(f, "Handle({}, {:?})", s.label, self.state()),
            None => f.write_str("Handle(removed)"),
        }
    }
}
