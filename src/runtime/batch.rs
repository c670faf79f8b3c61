//! Batches: tasks submitted to executors in a known order, results returned
//! in submission order.

use std::any::Any;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::handle::Handle;
use super::pool::{Job, Step};
use super::shared::{in_task, panic_message, pinned_here, PinnedHere, Shared};
use crate::error::{Error, Result};
use crate::executor::Slot;
use crate::stats::Counters;

/// A task's executor, or the label of one from another runtime (for the
/// error).
type TaskSlot = std::result::Result<Arc<Slot>, String>;

type TaskFn<R> = Box<dyn FnOnce(&mut (dyn Any + Send), &TaskContext) -> Option<R> + Send>;

/// What a task started with [`Batch::read_with`] can tell the runtime.
#[derive(Debug, Default)]
pub struct TaskContext {
    dirty: Cell<bool>,
}

impl TaskContext {
    /// Marks the executor dirty: the task changed it through interior
    /// mutability (a `Cell`, an atomic, a `Mutex`), so its next eviction
    /// must write it instead of dropping it.
    pub fn mark_dirty(&self) {
        self.dirty.set(true);
    }
}

struct Task<R> {
    index: usize,
    seq: u64,
    slot: Arc<Slot>,
    write: bool,
    f: TaskFn<R>,
}

/// A set of tasks on executors, run by the worker pool.
///
/// Tasks on one executor run one after another in submission order; tasks
/// on different executors run in parallel. The submission order is the
/// dispatch plan the eviction queue and the prefetcher follow. Batches
/// run side by side: one whose remaining tasks wait for a busy executor
/// does not hold up another's.
///
/// A task may run tasks of its own on other executors (a batch, or
/// [`Runtime::read`](crate::Runtime::read) through an
/// `Arc<Runtime>`): the thread that runs it helps to run them, so they
/// finish even when every worker is busy. A task that asks for its own
/// executor gets [`Error::Reentrant`] (it holds it until it returns), and
/// one that drops the executor's last handle frees it when it returns.
/// Tasks that wait for each other's executors in a cycle (one on `a`
/// running a task on `b` while one on `b` runs a task on `a`) deadlock,
/// as threads taking two locks in opposite orders do.
///
/// ```
/// # use outcore::Runtime;
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
/// let rt = Runtime::builder().workers(2).build().unwrap();
/// let a = rt.insert(vec![1u32, 2, 3]).unwrap();
/// let b = rt.insert(vec![10u32, 20]).unwrap();
/// let mut batch = rt.batch();
/// batch.read(&a, |v: &Vec<u32>| v.iter().sum::<u32>());
/// batch.write(&b, |v: &mut Vec<u32>| { v.push(30); v.iter().sum::<u32>() });
/// batch.read(&a, |v: &Vec<u32>| v.len() as u32);
/// assert_eq!(batch.run().unwrap(), vec![6, 60, 3]);
/// ```
pub struct Batch<'rt, R> {
    shared: &'rt Arc<Shared>,
    /// Each task's executor (or, for a handle of another runtime, the
    /// executor's label for the error), access and function.
    tasks: Vec<(TaskSlot, bool, TaskFn<R>)>,
    /// At most this many tasks start past the first result not yet handed
    /// back ([`Batch::ahead`]).
    ahead: usize,
}

impl<R> std::fmt::Debug for Batch<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("tasks", &self.tasks.len())
            .finish()
    }
}

impl<'rt, R: Send + 'static> Batch<'rt, R> {
    pub(crate) fn new(shared: &'rt Arc<Shared>) -> Self {
        Batch {
            shared,
            tasks: Vec::new(),
            ahead: usize::MAX,
        }
    }

    /// Starts at most `n` tasks (at least one) past the first result not
    /// yet handed back by [`Batch::run_in_order`] (or collected by
    /// [`Batch::run`]): the results waiting to be handed back and the
    /// tasks running are then `n` at most, so a sweep whose results are
    /// large (a task's partial sums the size of a model) holds `n` of them
    /// at most, however the tasks' executors make them finish out of
    /// order. Without it, a worker that finds the next task's executor
    /// busy runs any later task, and its result waits.
    ///
    /// With `n` at least the number of workers, every worker still has a
    /// task while the results are taken as they come.
    ///
    /// ```
    /// # use outcore::Runtime;
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = Runtime::builder().workers(2).build()?;
    /// let parts: Vec<_> = (0..8u32)
    ///     .map(|i| rt.insert(vec![i; 1000]))
    ///     .collect::<Result<_, _>>()?;
    /// let mut batch = rt.batch();
    /// for h in &parts {
    ///     // A large result per task: at most two exist at once.
    ///     batch.read(h, |v: &Vec<u32>| vec![f64::from(v[0]); 1 << 20]);
    /// }
    /// let mut total = 0.0;
    /// batch.ahead(2);
    /// batch.run_in_order(|_, r| total += r.expect("task")[0]);
    /// assert_eq!(total, 28.0);
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn ahead(&mut self, n: usize) -> &mut Self {
        self.ahead = n.max(1);
        self
    }

    fn slot_of<T>(&self, h: &Handle<T>) -> TaskSlot {
        h.slot_in(self.shared).ok_or_else(|| {
            h.slot
                .as_ref()
                .map_or_else(|| "a removed executor".to_string(), |s| s.label.clone())
        })
    }

    /// Adds a read-only task: it sees `&T` and leaves the executor clean.
    ///
    /// **Contract:** the task must not change the value, not even through
    /// interior mutability (`Cell`, `RefCell`, atomics, `Mutex`). A clean
    /// executor whose spill file is still valid is evicted by dropping its
    /// memory, so such a change would be lost at the next eviction. Use
    /// [`Batch::write`] for tasks that change the value, or
    /// [`Batch::read_with`] and [`TaskContext::mark_dirty`] for a read
    /// that sometimes updates something inside.
    pub fn read<T, F>(&mut self, h: &Handle<T>, f: F) -> &mut Self
    where
        T: 'static,
        F: FnOnce(&T) -> R + Send + 'static,
    {
        let slot = self.slot_of(h);
        let task: TaskFn<R> = Box::new(move |v, _| v.downcast_ref::<T>().map(f));
        self.tasks.push((slot, false, task));
        self
    }

    /// Adds a task with `&T` access that may change the value through
    /// interior mutability, and says so by calling
    /// [`TaskContext::mark_dirty`]: the executor is then written on its
    /// next eviction (unmarked, it stays clean, as with [`Batch::read`]).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// # use outcore::Runtime;
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = Runtime::builder().build()?;
    /// let h = rt.insert(AtomicU64::new(0))?;
    /// let mut b = rt.batch();
    /// b.read_with(&h, |hits: &AtomicU64, cx| {
    ///     hits.fetch_add(1, Ordering::Relaxed);
    ///     cx.mark_dirty();
    /// });
    /// b.run()?;
    /// rt.evict_all()?;
    /// assert_eq!(rt.read(&h, |hits: &AtomicU64| hits.load(Ordering::Relaxed))?, 1);
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn read_with<T, F>(&mut self, h: &Handle<T>, f: F) -> &mut Self
    where
        T: 'static,
        F: FnOnce(&T, &TaskContext) -> R + Send + 'static,
    {
        let slot = self.slot_of(h);
        let task: TaskFn<R> = Box::new(move |v, cx| v.downcast_ref::<T>().map(|t| f(t, cx)));
        self.tasks.push((slot, false, task));
        self
    }

    /// Adds a task with `&mut T` access: the executor becomes dirty and is
    /// written on its next eviction.
    pub fn write<T, F>(&mut self, h: &Handle<T>, f: F) -> &mut Self
    where
        T: 'static,
        F: FnOnce(&mut T) -> R + Send + 'static,
    {
        let slot = self.slot_of(h);
        let task: TaskFn<R> = Box::new(move |v, _| v.downcast_mut::<T>().map(f));
        self.tasks.push((slot, true, task));
        self
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the batch has no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Runs every task and returns the results in submission order, or the
    /// first error (all tasks still run).
    ///
    /// # Errors
    ///
    /// The first task's error in submission order: [`Error::TaskPanicked`],
    /// [`Error::Poisoned`], [`Error::SpillRead`],
    /// [`Error::UnknownExecutor`], or [`Error::Forked`] in a child process
    /// created by `fork()` (where the runtime's workers do not exist).
    pub fn run(self) -> Result<Vec<R>> {
        self.run_each().into_iter().collect()
    }

    /// Runs every task and returns each task's result in submission order.
    pub fn run_each(self) -> Vec<Result<R>> {
        let mut out = Vec::with_capacity(self.tasks.len());
        self.run_in_order(|_, r| out.push(r));
        out
    }

    /// Runs every task and hands each result to `f`, with its index, in
    /// submission order, on this thread while later tasks still run: a
    /// result is handed over as soon as it and every result before it are
    /// done. Only the results that finish ahead of an earlier one wait, so
    /// a long batch whose results are folded as they come holds a few of
    /// them at a time instead of all of them, and the fold's order (so its
    /// floating-point result) does not depend on the scheduling.
    ///
    /// A panic in `f` reaches the caller at once. The tasks not finished by
    /// then still run on the workers, which release their executors as
    /// usual; their results are dropped.
    ///
    /// ```
    /// # use outcore::Runtime;
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = Runtime::builder().workers(2).build()?;
    /// let parts: Vec<_> = (0..4u32)
    ///     .map(|i| rt.insert(vec![i as f64 + 0.5; 1000]))
    ///     .collect::<Result<_, _>>()?;
    /// let mut batch = rt.batch();
    /// for h in &parts {
    ///     batch.read(h, |v: &Vec<f64>| v.iter().sum::<f64>());
    /// }
    /// let mut total = 0.0;
    /// batch.run_in_order(|_, r| total += r.expect("task"));
    /// assert_eq!(total, 1000.0 * (0.5 + 1.5 + 2.5 + 3.5));
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn run_in_order(self, mut f: impl FnMut(usize, Result<R>)) {
        let n = self.tasks.len();
        if n == 0 {
            return;
        }
        if let Err(Error::Forked { owner }) = self.shared.check_process() {
            // No worker exists in a child created by `fork()`.
            for i in 0..n {
                f(i, Err(Error::Forked { owner }));
            }
            return;
        }
        // A batch run from inside a task: this thread runs its tasks too,
        // so that it finishes even when every worker is busy (with the
        // task that waits here, for one).
        let nested = in_task();
        let state = self.start();
        let mut next = 0;
        let mut ready = Vec::new();
        while next < n {
            if nested {
                while let Step::Ran = state.step() {}
            }
            {
                let mut g = state.inner.lock();
                while g.results[next].is_none() && g.remaining > 0 {
                    g.awaited = next;
                    if nested {
                        // Back to helping soon: a task of this batch may
                        // be waiting for an executor a worker holds.
                        state
                            .done
                            .wait_for(&mut g, std::time::Duration::from_millis(1));
                        break;
                    }
                    state.done.wait(&mut g);
                }
                g.awaited = NOT_WAITING;
                while next < n {
                    let Some(r) = g.results[next].take() else {
                        if g.remaining == 0 {
                            ready.push(Err(Error::Runtime("task did not run".into())));
                            next += 1;
                            continue;
                        }
                        break;
                    };
                    ready.push(r);
                    next += 1;
                }
            }
            // Outside the lock: the workers record results meanwhile.
            let first = next - ready.len();
            for (i, r) in ready.drain(..).enumerate() {
                f(first + i, r);
            }
            state.hand_back(next);
        }
    }

    /// Queues the tasks on the worker pool (the results of tasks on
    /// another runtime's executors are recorded at once).
    fn start(self) -> Arc<BatchState<R>> {
        let n = self.tasks.len();
        let sh = self.shared;
        let base = sh.reserve_seqs(n as u64);
        let mut results: Vec<Option<Result<R>>> = (0..n).map(|_| None).collect();
        let mut queue = Queue::default();
        for (i, (slot, write, f)) in self.tasks.into_iter().enumerate() {
            let slot = match slot {
                Ok(slot) => slot,
                Err(executor) => {
                    results[i] = Some(Err(Error::UnknownExecutor { executor }));
                    continue;
                }
            };
            if pinned_here(slot.id) {
                // A task's batch with a task on the task's own executor:
                // it would wait for the task that waits for it.
                results[i] = Some(Err(Error::Reentrant {
                    executor: slot.label.clone(),
                }));
                continue;
            }
            let seq = base + i as u64;
            {
                let mut g = slot.lock();
                while g.pending.len() == g.pending.capacity() {
                    // Grown outside the slot's lock, where the trap may
                    // evict (under it, an allocation cannot trap).
                    let want = g.pending.capacity().saturating_mul(2).max(8);
                    drop(g);
                    let mut bigger = VecDeque::with_capacity(want);
                    g = slot.lock();
                    if g.pending.capacity() < want && g.pending.len() < want {
                        bigger.extend(g.pending.drain(..));
                        g.pending = bigger;
                    }
                }
                g.pending.push_back(seq);
                sh.sync_pending(&slot, &g);
            }
            queue.push(Task {
                index: i,
                seq,
                slot,
                write,
                f,
            });
        }
        let remaining = queue.len();
        let state = Arc::new(BatchState {
            shared: sh.clone(),
            inner: Mutex::new(BatchInner {
                queue,
                busy: HashSet::new(),
                results,
                remaining,
                awaited: NOT_WAITING,
                limit: self.ahead,
            }),
            done: Condvar::new(),
            ahead: self.ahead,
        });
        if remaining > 0 {
            sh.pool().submit(state.clone());
            sh.wake_prefetchers();
        }
        state
    }
}

/// A batch's tasks not started yet: each executor's in submission order,
/// and the executors by their first such task. A worker takes the first
/// task whose executor is free, looking past the busy executors only (one
/// per worker at most), not past every task queued behind them: with
/// thousands of tasks on one busy executor, a scan of the tasks made each
/// step cost the whole queue.
struct Queue<R> {
    by_executor: HashMap<u64, VecDeque<Task<R>>>,
    /// The index of each executor's first task, to the executor.
    fronts: BTreeMap<usize, u64>,
    len: usize,
}

impl<R> Default for Queue<R> {
    fn default() -> Self {
        Queue {
            by_executor: HashMap::new(),
            fronts: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<R> Queue<R> {
    /// Adds a task (in submission order).
    fn push(&mut self, t: Task<R>) {
        let id = t.slot.id;
        let q = self.by_executor.entry(id).or_default();
        if q.is_empty() {
            self.fronts.insert(t.index, id);
        }
        q.push_back(t);
        self.len += 1;
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Takes the first task before index `limit` whose executor is not in
    /// `busy`.
    fn take_free(&mut self, busy: &HashSet<u64>, limit: usize) -> Option<Task<R>> {
        let (&first, &id) = self
            .fronts
            .range(..limit)
            .find(|(_, id)| !busy.contains(id))?;
        self.fronts.remove(&first);
        let q = self.by_executor.get_mut(&id)?;
        let t = q.pop_front()?;
        match q.front() {
            Some(next) => {
                self.fronts.insert(next.index, id);
            }
            None => {
                self.by_executor.remove(&id);
            }
        }
        self.len -= 1;
        Some(t)
    }
}

struct BatchInner<R> {
    queue: Queue<R>,
    busy: HashSet<u64>,
    results: Vec<Option<Result<R>>>,
    remaining: usize,
    /// The result the caller waits for, or [`NOT_WAITING`]: a worker wakes
    /// it for that result or the last one only, not for each result that
    /// finishes ahead of an earlier one (a wake-up interrupts the core a
    /// worker computes on).
    awaited: usize,
    /// Tasks from this index on do not start yet ([`Batch::ahead`]).
    limit: usize,
}

/// [`BatchInner::awaited`] when the caller is not waiting.
const NOT_WAITING: usize = usize::MAX;

struct BatchState<R> {
    shared: Arc<Shared>,
    inner: Mutex<BatchInner<R>>,
    done: Condvar,
    /// See [`Batch::ahead`].
    ahead: usize,
}

impl<R> BatchState<R> {
    /// The results before `next` are handed back: with a window
    /// ([`Batch::ahead`]), the tasks it now lets start may run (the
    /// workers that found none are woken).
    fn hand_back(&self, next: usize) {
        if self.ahead == usize::MAX {
            return;
        }
        let limit = next.saturating_add(self.ahead);
        let mut g = self.inner.lock();
        if limit > g.limit {
            g.limit = limit;
            drop(g);
            self.shared.pool().wake_all();
        }
    }
}

impl<R: Send + 'static> Job for BatchState<R> {
    fn step(&self) -> Step {
        let sh = &*self.shared;
        let task = {
            let mut g = self.inner.lock();
            if g.queue.is_empty() {
                return Step::Exhausted;
            }
            let inner = &mut *g;
            let Some(t) = inner.queue.take_free(&inner.busy, inner.limit) else {
                return Step::Blocked;
            };
            inner.busy.insert(t.slot.id);
            t
        };
        let id = task.slot.id;
        let index = task.index;
        // User code is already caught inside; this catches the runtime's
        // own, so that a result is always recorded and `run` returns.
        let result = catch_unwind(AssertUnwindSafe(|| run_task(sh, task))).unwrap_or_else(|p| {
            Err(Error::Runtime(format!(
                "internal panic while running a task: {}",
                panic_message(&*p)
            )))
        });
        let mut g = self.inner.lock();
        g.results[index] = Some(result);
        g.busy.remove(&id);
        g.remaining -= 1;
        // The caller waits for the next result in order, or for the last.
        if g.awaited == index || g.remaining == 0 {
            self.done.notify_one();
        }
        Step::Ran
    }
}

fn run_task<R>(sh: &Shared, t: Task<R>) -> Result<R> {
    // The pending entry keeps the executor ranked as needed-now until it is
    // pinned; only then is the task recorded as dispatched.
    let acquired = sh.acquire(&t.slot, t.write);
    sh.dispatched(&t.slot, t.seq);
    let mut v = acquired?;
    let before = crate::alloc::thread_own_net();
    let f = t.f;
    let cx = TaskContext::default();
    let here = PinnedHere::new(t.slot.id);
    let out = catch_unwind(AssertUnwindSafe(|| f(&mut *v, &cx)));
    drop(here);
    // Publish what the task left allocated (its result, a grown
    // executor): the peak then sees it even when it stays below the
    // flush threshold.
    crate::alloc::flush_thread();
    let changed = t.write || cx.dirty.get();
    if changed {
        let delta = crate::alloc::thread_own_net() - before;
        let size = t.slot.size.load(Ordering::Relaxed);
        t.slot
            .size
            .store((size as i64 + delta).max(0) as usize, Ordering::Relaxed);
        sh.note_size(&t.slot, size);
    }
    Counters::add(&sh.counters().tasks, 1);
    let panicked = out.is_err();
    sh.release(&t.slot, v, changed, panicked && changed);
    sh.note_idle(&t.slot);
    match out {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(Error::UnknownExecutor {
            executor: t.slot.label.clone(),
        }),
        Err(p) => Err(Error::TaskPanicked {
            executor: t.slot.label.clone(),
            message: panic_message(&*p),
        }),
    }
}
