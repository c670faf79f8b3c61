//! What a task sees: [`TaskContext`]; for tasks over several executors,
//! [`Key`], the copyable name of an executor a task carries, [`Join`],
//! its executors, and [`AnyHandle`], a handle of any type in a task's
//! list.

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use super::handle::Handle;
use super::shared::Shared;
use crate::error::{Error, ExecutorId};
use crate::executor::Slot;

/// What a task started with [`Batch::read_with`](crate::Batch::read_with)
/// can tell the runtime.
#[derive(Debug, Default)]
pub struct TaskContext {
    pub(crate) dirty: Cell<bool>,
    /// The identity of the runtime running the task (see [`Key`]).
    pub(crate) runtime: u64,
}

impl TaskContext {
    /// Marks the executor dirty: the task changed it through interior
    /// mutability (a `Cell`, an atomic, a `Mutex`), so its next eviction
    /// must write it instead of dropping it.
    pub fn mark_dirty(&self) {
        self.dirty.set(true);
    }
}

/// The name of an executor holding a `T`, for a task over several
/// executors to find it in its [`Join`]. `Copy`: a task's closure
/// captures it by value (a [`Handle`] is the executor's owner and is
/// not).
///
/// A key names an executor of one runtime: it carries that runtime's
/// identity as well as the executor's id, so a key of another runtime
/// (whose executor may have the same id) is never taken for one of this
/// runtime's executors; [`Join::read`] and [`Join::write`] panic on it.
///
/// ```
/// # use outcore::Runtime;
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
/// let rt = Runtime::builder().build()?;
/// let data = rt.insert(vec![1.0f64, 2.0, 3.0])?;
/// let model = rt.insert(0.0f64)?;
/// let (d, m) = (data.key(), model.key());
/// let mut b = rt.batch();
/// b.task(&[&data], &[&model], move |j| *j.write(m) += j.read(d).iter().sum::<f64>());
/// b.run()?;
/// assert_eq!(rt.read(&model, |m: &f64| *m)?, 6.0);
/// # Ok::<(), outcore::Error>(())
/// ```
pub struct Key<T> {
    id: ExecutorId,
    /// The identity of the executor's runtime.
    runtime: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Key<T> {
    /// The executor's id.
    pub fn id(self) -> ExecutorId {
        self.id
    }
}

impl<T> Clone for Key<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Key<T> {}

impl<T> PartialEq for Key<T> {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.runtime == other.runtime
    }
}

impl<T> Eq for Key<T> {}

impl<T> std::hash::Hash for Key<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
        self.runtime.hash(state);
    }
}

impl<T> std::fmt::Debug for Key<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key(executor #{} of runtime {})", self.id, self.runtime)
    }
}

impl<T> Handle<T> {
    /// The executor's [`Key`], for tasks over several executors.
    pub fn key(&self) -> Key<T> {
        Key {
            id: self.id(),
            runtime: self.runtime,
            _t: PhantomData,
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl<T> Sealed for super::Handle<T> {}
}

/// A handle whatever the type of its executor, in the lists of executors
/// a task over several executors reads and writes
/// ([`Batch::task`](crate::Batch::task)). Implemented by [`Handle`] only.
pub trait AnyHandle: sealed::Sealed {
    #[doc(hidden)]
    fn erased(&self) -> Erased<'_>;
}

/// A handle's parts, whatever its type.
#[doc(hidden)]
pub struct Erased<'a> {
    slot: Option<&'a Arc<Slot>>,
    shared: &'a Weak<Shared>,
}

impl std::fmt::Debug for Erased<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Erased")
    }
}

impl Erased<'_> {
    /// The executor's slot when it belongs to the runtime `sh`, else the
    /// error a task on it gets.
    pub(crate) fn slot_in(&self, sh: &Arc<Shared>) -> crate::Result<Arc<Slot>> {
        let ours = self.shared.upgrade().is_some_and(|s| Arc::ptr_eq(&s, sh));
        match self.slot {
            Some(s) if ours => Ok(s.clone()),
            Some(s) => Err(Error::UnknownExecutor {
                executor: s.label.clone(),
                removed: false,
            }),
            None => Err(Error::UnknownExecutor {
                executor: "executor".to_string(),
                removed: true,
            }),
        }
    }
}

/// A handle whose executor tasks over several executors may read side by
/// side: its type is `Sync`, so `&T` may be on several threads at once.
/// The reads of [`Batch::task`](crate::Batch::task) take these.
pub trait ReadHandle: AnyHandle {}

impl<T: Sync> ReadHandle for Handle<T> {}

impl<T> AnyHandle for Handle<T> {
    fn erased(&self) -> Erased<'_> {
        Erased {
            slot: self.slot.as_ref(),
            shared: &self.shared,
        }
    }
}

/// How a task's executor is lent out so far.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lent {
    No,
    Shared,
    Mut,
}

/// One executor of a running task.
pub(crate) struct Value<'t> {
    id: ExecutorId,
    write: bool,
    /// Lent as `&mut` only when the task holds the value alone.
    alone: bool,
    value: *mut (dyn Any + Send),
    lent: Cell<Lent>,
    _v: PhantomData<&'t mut (dyn Any + Send)>,
}

impl<'t> Value<'t> {
    /// The value of executor `id`, which the task holds alone (and writes
    /// when `write`).
    pub(crate) fn alone(id: ExecutorId, write: bool, value: &'t mut (dyn Any + Send)) -> Self {
        Value {
            id,
            write,
            alone: true,
            value,
            lent: Cell::new(Lent::No),
            _v: PhantomData,
        }
    }

    /// The value of executor `id`, which the task reads side by side with
    /// others: pinned in its slot for `'t`, and only ever lent as `&T`.
    pub(crate) fn shared(id: ExecutorId, value: *const (dyn Any + Send)) -> Self {
        Value {
            id,
            write: false,
            alone: false,
            value: value.cast_mut(),
            lent: Cell::new(Lent::No),
            _v: PhantomData,
        }
    }
}

impl Value<'_> {
    /// The value as `&mut T`, once: for a task on one executor, which
    /// holds it alone whether it reads or writes it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn take<T: 'static>(&self) -> Option<&mut T> {
        if self.lent.get() != Lent::No || !self.alone {
            return None;
        }
        self.lent.set(Lent::Mut);
        // SAFETY: the value is pinned for the task's lifetime and lent
        // this once (checked above; `lent` never goes back to `No`).
        let any: &mut (dyn Any + Send) = unsafe { &mut *self.value };
        any.downcast_mut::<T>()
    }
}

/// What a task over several executors sees: each of its executors, by
/// [`Key`], as `&T` ([`Join::read`]) or `&mut T` ([`Join::write`], for
/// the executors it named as written). Every executor is loaded and pinned
/// for as long as the task runs.
pub struct Join<'t> {
    values: &'t [Value<'t>],
    /// The identity of the runtime running the task.
    runtime: u64,
}

impl std::fmt::Debug for Join<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<ExecutorId> = self.values.iter().map(|v| v.id).collect();
        f.debug_struct("Join").field("executors", &ids).finish()
    }
}

impl<'t> Join<'t> {
    /// The values of a task run by the runtime `runtime` (its identity).
    pub(crate) fn new(values: &'t [Value<'t>], runtime: u64) -> Self {
        Join { values, runtime }
    }

    fn find<T: 'static>(&self, k: Key<T>) -> &Value<'t> {
        if k.runtime != self.runtime {
            panic!(
                "executor #{} of the key belongs to another runtime, not to the one running the task",
                k.id
            );
        }
        match self.values.iter().find(|v| v.id == k.id) {
            Some(v) => v,
            None => panic!("executor #{} is not one the task named", k.id),
        }
    }

    /// The executor `k` names, read-only. As many reads as wanted, of
    /// executors named as read or as written.
    ///
    /// # Panics
    ///
    /// When the task did not name the executor (a key of another runtime
    /// names none of them), when it holds another type than `T`, or when
    /// [`Join::write`] has lent it out (the task then fails with
    /// [`Error::TaskPanicked`](crate::Error::TaskPanicked)).
    pub fn read<T: 'static>(&self, k: Key<T>) -> &T {
        let v = self.find(k);
        if v.lent.get() == Lent::Mut {
            panic!("executor #{} is lent out by Join::write", k.id);
        }
        // SAFETY: `value` points to the executor's value, pinned (out of
        // the runtime's reach) for the task's lifetime 't, which outlives
        // `&self`; it is not lent as `&mut` (checked above), and from now
        // on never will be (`lent` only moves away from `No`), so shared
        // references to it never alias a mutable one. A value read side by
        // side by several tasks is never lent as `&mut` at all (`write`
        // and `take` refuse it), and its type is `Sync` (`ReadHandle`).
        let any: &(dyn Any + Send) = unsafe { &*v.value };
        v.lent.set(Lent::Shared);
        match any.downcast_ref::<T>() {
            Some(t) => t,
            None => panic!(
                "executor #{} does not hold a {}",
                k.id,
                std::any::type_name::<T>()
            ),
        }
    }

    /// The executor `k` names, for writing: once per executor, for one the
    /// task named as written, and not after a [`Join::read`] of it.
    ///
    /// # Panics
    ///
    /// When the task did not name the executor as written (a key of
    /// another runtime names none of them), when it holds another type
    /// than `T`, or when it was lent out before.
    #[allow(clippy::mut_from_ref)]
    pub fn write<T: 'static>(&self, k: Key<T>) -> &mut T {
        let v = self.find(k);
        if !v.write || !v.alone {
            panic!("executor #{} was named as read, not written", k.id);
        }
        if v.lent.get() != Lent::No {
            panic!("executor #{} is lent out already", k.id);
        }
        // SAFETY: as in `read`; this is the one time the value is lent
        // (checked above, and `lent` never goes back to `No`), so the
        // `&mut` is the only reference to it. The task's executors are
        // distinct (the batch merges repeated names), so no two `Value`s
        // point to the same value.
        let any: &mut (dyn Any + Send) = unsafe { &mut *v.value };
        v.lent.set(Lent::Mut);
        match any.downcast_mut::<T>() {
            Some(t) => t,
            None => panic!(
                "executor #{} does not hold a {}",
                k.id,
                std::any::type_name::<T>()
            ),
        }
    }
}
