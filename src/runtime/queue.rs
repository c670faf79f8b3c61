//! A batch's tasks not started yet, in the order the workers may take
//! them: each executor's tasks in submission order, a task over several
//! executors once it is the first of each of them.

use std::any::Any;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::join::{TaskContext, Value};
use crate::executor::Slot;

/// What a task runs: its executors' values (in the order of
/// [`Task::slots`]) and its context in, its result out (`None` when a value
/// has another type than the task's).
pub(crate) type TaskFn<R> = Box<dyn FnOnce(&[Value<'_>], &TaskContext) -> Option<R> + Send>;

pub(crate) struct Task<R> {
    pub index: usize,
    pub seq: u64,
    /// The executors, by increasing id, each once, with whether the task
    /// writes it.
    pub slots: Vec<(Arc<Slot>, bool)>,
    pub f: TaskFn<R>,
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
    /// its executors, none of which is in `busy`.
    pub fn take_free(&mut self, busy: &HashSet<u64>, limit: usize) -> Option<Task<R>> {
        let tasks = &self.tasks;
        let &i = self.ready.range(..limit).find(|&&i| {
            tasks[i]
                .as_ref()
                .is_some_and(|t| t.slots.iter().all(|(s, _)| !busy.contains(&s.id)))
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

/// The values a task's closure sees, from the boxes it pinned.
pub(crate) fn values<'t, R>(t: &Task<R>, held: &'t mut [Box<dyn Any + Send>]) -> Vec<Value<'t>> {
    t.slots
        .iter()
        .zip(held.iter_mut())
        .map(|((s, w), v)| Value::new(s.id, *w, &mut **v))
        .collect()
}
