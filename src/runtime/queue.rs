//! A batch's tasks not started yet, in the order the workers may take
//! them: each executor's tasks in submission order, a task over several
//! executors once it is the first of each of them.

use std::any::Any;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use super::access::Access;
use super::join::{TaskContext, Value};
use crate::executor::Slot;

/// What a task runs: its executors' values (in the order of
/// [`Task::slots`]) and its context in, its result out (`None` when a value
/// has another type than the task's).
pub(crate) type TaskFn<R> = Box<dyn FnOnce(&[Value<'_>], &TaskContext) -> Option<R> + Send>;

pub(crate) struct Task<R> {
    pub index: usize,
    pub seq: u64,
    /// The executors, by increasing id, each once, with how the task holds
    /// it.
    pub slots: Vec<(Arc<Slot>, Access)>,
    pub f: TaskFn<R>,
}

/// The executors a batch's running tasks hold: how many read each side by
/// side, or [`Busy::ALONE`] when one holds it alone.
#[derive(Default)]
pub(crate) struct Busy(HashMap<u64, u32>);

impl Busy {
    const ALONE: u32 = u32::MAX;

    /// Whether a task may take executor `id` with `access` now.
    fn allows(&self, id: u64, access: Access) -> bool {
        match self.0.get(&id) {
            None => true,
            Some(&n) => access == Access::Shared && n != Self::ALONE,
        }
    }

    /// A task takes its executors.
    pub fn take(&mut self, slots: &[(Arc<Slot>, Access)]) {
        for (s, a) in slots {
            let e = self.0.entry(s.id).or_insert(0);
            *e = if *a == Access::Shared {
                *e + 1
            } else {
                Self::ALONE
            };
        }
    }

    /// A task gives its executors back.
    pub fn give(&mut self, slots: &[(u64, Access)]) {
        for &(id, a) in slots {
            let shared_left = match self.0.get_mut(&id) {
                Some(n) if a == Access::Shared && *n != Self::ALONE && *n > 1 => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            if !shared_left {
                self.0.remove(&id);
            }
        }
    }
}

/// The tasks not started: a worker takes the first one (in submission
/// order) that comes first on each of its executors and whose executors
/// are all free. Only tasks first on each of their executors are looked
/// at, and of those only the ones held up by a busy executor are passed
/// over (one per busy executor at most), not every task queued behind
/// them: with thousands of tasks on one busy executor, a scan of the tasks
/// made each step cost the whole queue.
pub(crate) struct Queue<R> {
    tasks: Vec<Option<Task<R>>>,
    /// For each task, on how many of its executors an earlier task is
    /// still queued.
    behind: Vec<u32>,
    /// Each executor's queued tasks (their indices), in order.
    by_executor: HashMap<u64, VecDeque<usize>>,
    /// The tasks first on each of their executors.
    ready: BTreeSet<usize>,
    len: usize,
}

impl<R> Queue<R> {
    /// A queue for a batch of `n` tasks.
    pub fn new(n: usize) -> Self {
        Queue {
            tasks: (0..n).map(|_| None).collect(),
            behind: vec![0; n],
            by_executor: HashMap::new(),
            ready: BTreeSet::new(),
            len: 0,
        }
    }

    /// Adds a task (in submission order).
    pub fn push(&mut self, t: Task<R>) {
        let i = t.index;
        let mut behind = 0;
        for (slot, _) in &t.slots {
            let q = self.by_executor.entry(slot.id).or_default();
            if !q.is_empty() {
                behind += 1;
            }
            q.push_back(i);
        }
        self.behind[i] = behind;
        if behind == 0 {
            self.ready.insert(i);
        }
        self.tasks[i] = Some(t);
        self.len += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Takes the first task before index `limit` that is first on each of
    /// its executors, all of which `busy` lets it take (no task holds them,
    /// or only tasks reading side by side, when it reads so too), and that
    /// `admit` lets start (asked last, once the rest holds; it is not asked
    /// again for the task it lets start).
    pub fn take_free(
        &mut self,
        busy: &Busy,
        limit: usize,
        mut admit: impl FnMut(&[(Arc<Slot>, Access)]) -> bool,
    ) -> Option<Task<R>> {
        let tasks = &self.tasks;
        let &i = self.ready.range(..limit).find(|&&i| {
            tasks[i].as_ref().is_some_and(|t| {
                t.slots.iter().all(|(s, a)| busy.allows(s.id, *a)) && admit(&t.slots)
            })
        })?;
        self.ready.remove(&i);
        let t = self.tasks[i].take()?;
        for (slot, _) in &t.slots {
            let Some(q) = self.by_executor.get_mut(&slot.id) else {
                continue;
            };
            q.pop_front();
            match q.front() {
                Some(&next) => {
                    self.behind[next] = self.behind[next].saturating_sub(1);
                    if self.behind[next] == 0 {
                        self.ready.insert(next);
                    }
                }
                None => {
                    self.by_executor.remove(&slot.id);
                }
            }
        }
        self.len -= 1;
        Some(t)
    }
}

/// A value a running task holds.
pub(crate) enum Held {
    /// Taken out of its slot.
    Alone(Box<dyn Any + Send>),
    /// Left in its slot, read side by side (see `Shared::acquire_shared`).
    Shared(*const (dyn Any + Send)),
}

/// The values a task's closure sees, from those it pinned.
pub(crate) fn values<'t, R>(t: &Task<R>, held: &'t mut [Held]) -> Vec<Value<'t>> {
    t.slots
        .iter()
        .zip(held.iter_mut())
        .map(|((s, a), h)| match h {
            Held::Alone(v) => Value::alone(s.id, a.writes(), &mut **v),
            Held::Shared(p) => Value::shared(s.id, *p),
        })
        .collect()
}
