//! Batches: tasks submitted to executors in a known order, results returned
//! in submission order.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::access::Access;
use super::handle::Handle;
use super::join::{AnyHandle, Join, ReadHandle, TaskContext, Value};
use super::pool::{Job, Step};
use super::queue::{values, Busy, Held, Queue, Task, TaskFn};
use super::shared::{in_task, panic_message, pinned_here, PinnedHere, Shared};
use crate::error::{Error, Result};
use crate::executor::Slot;
use crate::stats::Counters;

/// A task's executor, or the error for one from another runtime.
type TaskSlot = Result<Arc<Slot>>;

/// A task as submitted: its executors, each with how it holds it.
type Named = Vec<(TaskSlot, Access)>;

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
    /// Each task's executors (or, for a handle of another runtime, the
    /// error), each with how the task holds it, and its function.
    tasks: Vec<(Named, TaskFn<R>)>,
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

    fn slot_of(&self, h: &dyn AnyHandle) -> TaskSlot {
        h.erased().slot_in(self.shared)
    }

    /// Adds a task on one executor: `f` gets its value.
    fn push_one<T: 'static>(
        &mut self,
        h: &Handle<T>,
        write: bool,
        f: impl FnOnce(&mut T, &TaskContext) -> R + Send + 'static,
    ) {
        let slot = self.slot_of(h);
        let task: TaskFn<R> = Box::new(move |v: &[Value<'_>], cx: &TaskContext| {
            v.first().and_then(|v| v.take::<T>()).map(|t| f(t, cx))
        });
        let access = if write { Access::Write } else { Access::Alone };
        self.tasks.push((vec![(slot, access)], task));
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
    ///
    /// The type need not be `Sync`, so two reads of one executor run one
    /// after the other; [`Batch::read_shared`] runs them side by side.
    pub fn read<T, F>(&mut self, h: &Handle<T>, f: F) -> &mut Self
    where
        T: 'static,
        F: FnOnce(&T) -> R + Send + 'static,
    {
        self.push_one(h, false, move |t, _| f(t));
        self
    }

    /// Adds a read-only task, as [`Batch::read`], that runs side by side
    /// with the other reads of the same executor (its type is `Sync`).
    /// Tasks over parts of one executor (blocks of the rows of one
    /// partition) then keep every worker busy, where [`Batch::read`]'s
    /// take the executor one at a time: a K-means sweep of a dozen tasks
    /// per partition on two workers kept 1.2 cores busy so, and 2 with
    /// this. The same contract as [`Batch::read`].
    ///
    /// ```
    /// # use outcore::Runtime;
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = Runtime::builder().workers(2).build()?;
    /// let rows = rt.insert((0..1000u64).collect::<Vec<_>>())?;
    /// let mut b = rt.batch();
    /// for part in 0..4 {
    ///     // Four quarters of one executor, read at once by the workers.
    ///     b.read_shared(&rows, move |v: &Vec<u64>| v[part * 250..][..250].iter().sum::<u64>());
    /// }
    /// assert_eq!(b.run()?.iter().sum::<u64>(), 499_500);
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn read_shared<T, F>(&mut self, h: &Handle<T>, f: F) -> &mut Self
    where
        T: Sync + 'static,
        F: FnOnce(&T) -> R + Send + 'static,
    {
        let key = h.key();
        self.task(&[h], &[], move |j| f(j.read(key)))
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
        self.push_one(h, false, move |t, cx| f(t, cx));
        self
    }

    /// Adds a task with `&mut T` access: the executor becomes dirty and is
    /// written on its next eviction.
    pub fn write<T, F>(&mut self, h: &Handle<T>, f: F) -> &mut Self
    where
        T: 'static,
        F: FnOnce(&mut T) -> R + Send + 'static,
    {
        self.push_one(h, true, move |t, _| f(t));
        self
    }

    /// Adds a task over several executors: it reads those in `reads`
    /// and writes those in `writes`, and finds each in its [`Join`] by
    /// [`Key`](crate::Key) ([`Handle::key`]). All of them are loaded and
    /// pinned together for as long as it runs; those it writes become dirty
    /// (an executor named in both lists is written).
    ///
    /// Order, per executor, in submission order: a task that writes an
    /// executor runs after every earlier task on it has finished and before
    /// any later one starts; tasks that read it and come one after another
    /// run side by side (so the executors read must be `Sync`:
    /// [`ReadHandle`](crate::ReadHandle)). The dispatch plan (eviction,
    /// prefetch) counts the task for every executor it names. A worker
    /// starts a task only when all its executors are free for it, and pins
    /// them in the order of their ids, so tasks that name the same
    /// executors in different orders never wait for each other in a cycle.
    /// Under a cap, it starts the task only when what the running tasks pin
    /// and the task's executors fit under the cap together, or when no
    /// other task runs (so joins side by side stay under the cap).
    ///
    /// The task fails without running, with
    /// [`Error::TooLargeTogether`], when its executors together (their
    /// sizes as last measured) are more than the memory cap; with
    /// [`Error::Reentrant`] when a task running it holds one of them. A
    /// panic poisons the executors it writes, not those it reads.
    ///
    /// ```
    /// # use outcore::Runtime;
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = Runtime::builder().workers(2).build()?;
    /// // A data block, the model block it meets, and a sum they add to.
    /// let x = rt.insert(vec![1.0f64, 2.0, 3.0])?;
    /// let w = rt.insert(vec![0.5f64, 0.5, 0.5])?;
    /// let dot = rt.insert(0.0f64)?;
    /// let (kx, kw, kd) = (x.key(), w.key(), dot.key());
    /// let mut b = rt.batch();
    /// b.task(&[&x, &w], &[&dot], move |j| {
    ///     let (x, w) = (j.read(kx), j.read(kw));
    ///     *j.write(kd) += x.iter().zip(w).map(|(a, b)| a * b).sum::<f64>();
    /// });
    /// b.run()?;
    /// assert_eq!(rt.read(&dot, |d: &f64| *d)?, 3.0);
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn task<F>(
        &mut self,
        reads: &[&dyn ReadHandle],
        writes: &[&dyn AnyHandle],
        f: F,
    ) -> &mut Self
    where
        F: FnOnce(&Join<'_>) -> R + Send + 'static,
    {
        let named = reads
            .iter()
            .map(|h| (h.erased().slot_in(self.shared), Access::Shared))
            .chain(writes.iter().map(|h| (self.slot_of(*h), Access::Write)))
            .collect();
        let task: TaskFn<R> =
            Box::new(move |v: &[Value<'_>], cx: &TaskContext| Some(f(&Join::new(v, cx.runtime))));
        self.tasks.push((named, task));
        self
    }

    /// Adds a task that reads two executors (the same one twice, if
    /// wanted): [`Batch::task`] with two reads.
    ///
    /// ```
    /// # use outcore::Runtime;
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = Runtime::builder().build()?;
    /// let a = rt.insert(vec![1u32, 2])?;
    /// let b = rt.insert(vec![10u32, 20])?;
    /// let mut batch = rt.batch();
    /// batch.read2(&a, &b, |a: &Vec<u32>, b: &Vec<u32>| a[0] * b[1]);
    /// assert_eq!(batch.run()?, vec![20]);
    /// # Ok::<(), outcore::Error>(())
    /// ```
    pub fn read2<A, B, F>(&mut self, a: &Handle<A>, b: &Handle<B>, f: F) -> &mut Self
    where
        A: Sync + 'static,
        B: Sync + 'static,
        F: FnOnce(&A, &B) -> R + Send + 'static,
    {
        let (ka, kb) = (a.key(), b.key());
        self.task(&[a, b], &[], move |j| f(j.read(ka), j.read(kb)))
    }

    /// Adds a task that reads one executor and writes another (a data
    /// block and the model state it updates): [`Batch::task`] with one
    /// read and one write.
    ///
    /// ```
    /// # use outcore::Runtime;
    /// # #[global_allocator]
    /// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
    /// let rt = Runtime::builder().build()?;
    /// let data = rt.insert(vec![1.0f64, 2.0, 3.0])?;
    /// let total = rt.insert(0.0f64)?;
    /// let mut batch = rt.batch();
    /// batch.read_write(&data, &total, |d: &Vec<f64>, t: &mut f64| *t += d.iter().sum::<f64>());
    /// batch.run()?;
    /// assert_eq!(rt.read(&total, |t: &f64| *t)?, 6.0);
    /// # Ok::<(), outcore::Error>(())
    /// ```
    ///
    /// The same executor as both fails the task with
    /// [`Error::TaskPanicked`] (it cannot be lent as `&A` and `&mut B` at
    /// once), leaving the executor as it was.
    pub fn read_write<A, B, F>(&mut self, a: &Handle<A>, b: &Handle<B>, f: F) -> &mut Self
    where
        A: Sync + 'static,
        B: 'static,
        F: FnOnce(&A, &mut B) -> R + Send + 'static,
    {
        if a.id() == b.id() {
            // Refused in the task, which writes nothing so poisons nothing.
            let id = a.id();
            return self.task(&[a], &[], move |_| {
                panic!("read_write: executor #{id} is both the one read and the one written")
            });
        }
        let (ka, kb) = (a.key(), b.key());
        self.task(&[a], &[b], move |j| f(j.read(ka), j.write(kb)))
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
    /// [`Error::UnknownExecutor`], [`Error::Interrupted`] or
    /// [`Error::CapLost`] once the runtime stopped, or [`Error::Forked`] in
    /// a child process created by `fork()` (where the runtime's workers do
    /// not exist).
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

    /// Queues the tasks on the worker pool (the results of tasks that
    /// cannot run are recorded at once).
    fn start(self) -> Arc<BatchState<R>> {
        let n = self.tasks.len();
        let sh = self.shared;
        let base = sh.reserve_seqs(n as u64);
        let mut results: Vec<Option<Result<R>>> = (0..n).map(|_| None).collect();
        let mut queue = Queue::new(n);
        for (i, (named, f)) in self.tasks.into_iter().enumerate() {
            let slots = match checked(sh, named) {
                Ok(slots) => slots,
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            let seq = base + i as u64;
            for (slot, _) in &slots {
                push_pending(sh, slot, seq);
            }
            queue.push(Task {
                index: i,
                seq,
                slots,
                f,
            });
        }
        let remaining = queue.len();
        let state = Arc::new(BatchState {
            shared: sh.clone(),
            inner: Mutex::new(BatchInner {
                queue,
                busy: Busy::default(),
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

/// A task's executors by increasing id, each once (written if named as
/// written), or why the task cannot run: an executor of another runtime,
/// one the task running this batch holds, or executors that together do
/// not fit under the cap.
fn checked(sh: &Shared, named: Named) -> Result<Vec<(Arc<Slot>, Access)>> {
    let mut slots: Vec<(Arc<Slot>, Access)> = Vec::with_capacity(named.len());
    for (slot, access) in named {
        let slot = slot?;
        if pinned_here(slot.id) {
            // A task's batch with a task on the task's own executor: it
            // would wait for the task that waits for it.
            return Err(Error::Reentrant {
                executor: slot.label.clone(),
            });
        }
        match slots.iter_mut().find(|(s, _)| s.id == slot.id) {
            Some((_, a)) => *a = (*a).max(access),
            None => slots.push((slot, access)),
        }
    }
    slots.sort_by_key(|(s, _)| s.id);
    if let (Some(cap), true) = (sh.soft_cap(), slots.len() > 1) {
        let sizes: Vec<(String, usize)> = slots
            .iter()
            .map(|(s, _)| (s.label.clone(), s.size.load(Ordering::Relaxed)))
            .collect();
        let total = sizes.iter().map(|(_, b)| *b as u64).sum::<u64>();
        if total > cap {
            return Err(Error::TooLargeTogether {
                executors: sizes,
                cap,
            });
        }
    }
    Ok(slots)
}

/// Adds the task `seq` to `slot`'s pending tasks (the dispatch plan).
fn push_pending(sh: &Shared, slot: &Slot, seq: u64) {
    let mut g = slot.lock();
    while g.pending.len() == g.pending.capacity() {
        // Grown outside the slot's lock, where the trap may evict (under
        // it, an allocation cannot trap).
        let want = g.pending.capacity().saturating_mul(2).max(8);
        drop(g);
        let mut bigger = std::collections::VecDeque::with_capacity(want);
        g = slot.lock();
        if g.pending.capacity() < want && g.pending.len() < want {
            bigger.extend(g.pending.drain(..));
            g.pending = bigger;
        }
    }
    g.pending.push_back(seq);
    sh.sync_pending(slot, &g);
}

struct BatchInner<R> {
    queue: Queue<R>,
    busy: Busy,
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
            // A join waits while the executors running tasks pin and its
            // own would be more than the cap (see `pins.rs`).
            let (cap, helping) = (sh.soft_cap(), in_task());
            let admit = |slots: &[(Arc<Slot>, Access)]| sh.pins().admit(slots, cap, helping);
            let Some(t) = inner.queue.take_free(&inner.busy, inner.limit, admit) else {
                return Step::Blocked;
            };
            inner.busy.take(&t.slots);
            t
        };
        let ids: Vec<(u64, Access)> = task.slots.iter().map(|(s, a)| (s.id, *a)).collect();
        let index = task.index;
        // User code is already caught inside; this catches the runtime's
        // own, so that a result is always recorded and `run` returns.
        let result = catch_unwind(AssertUnwindSafe(|| run_task(sh, task))).unwrap_or_else(|p| {
            Err(Error::Runtime(format!(
                "internal panic while running a task: {}",
                panic_message(&*p)
            )))
        });
        sh.pins().release(&ids, sh.soft_cap());
        let mut g = self.inner.lock();
        g.results[index] = Some(result);
        g.busy.give(&ids);
        g.remaining -= 1;
        // The caller waits for the next result in order, or for the last.
        if g.awaited == index || g.remaining == 0 {
            self.done.notify_one();
        }
        Step::Ran
    }
}

/// The executors' labels, for an error about the task.
fn labels(slots: &[(Arc<Slot>, Access)]) -> String {
    let names: Vec<&str> = slots.iter().map(|(s, _)| s.label.as_str()).collect();
    names.join(", ")
}

/// Pins a task's executors, in the order of their ids (loading those
/// evicted); on an error, gives back those pinned so far.
fn acquire_all<R>(sh: &Shared, t: &Task<R>) -> Result<Vec<Held>> {
    // Under an address-space limit, a join that holds some of its
    // executors and finds no room for the next gives back what it holds
    // and tries again (see `Shared::join_room`); after the first time, it
    // tries under the runtime's join turn, so that two joins that gave
    // way do not take their first executors back together, over and over.
    let mut turn = None;
    loop {
        if let Some(held) = try_acquire_all(sh, t)? {
            return Ok(held);
        }
        Counters::add(&sh.counters().join_retries, 1);
        if turn.is_none() {
            turn = Some(sh.join_turn());
        } else {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// One try at pinning a task's executors, in their order: `None` when a
/// join gave back what it held for lack of room (see [`acquire_all`]).
fn try_acquire_all<R>(sh: &Shared, t: &Task<R>) -> Result<Option<Vec<Held>>> {
    let mut held = Vec::with_capacity(t.slots.len());
    let give_all_back = |held: Vec<Held>| {
        for ((slot, _), h) in t.slots.iter().zip(held) {
            give_back(sh, slot, h, false, false);
        }
    };
    for (slot, access) in &t.slots {
        // The room for this executor's load, claimed while the ones before
        // it are held (none for the first).
        let room = if held.is_empty() {
            None
        } else {
            match sh.join_room(slot) {
                Ok(room) => room,
                Err(super::load::NoRoom) => {
                    give_all_back(held);
                    return Ok(None);
                }
            }
        };
        let got = match access {
            Access::Shared => sh.acquire_shared(slot).map(|p| p.map(Held::Shared)),
            a => sh.acquire(slot, a.writes()).map(|v| v.map(Held::Alone)),
        };
        drop(room);
        match got {
            Ok(Some(h)) => held.push(h),
            // It gave way to a load in flight (see `load::gives_way`).
            Ok(None) => {
                give_all_back(held);
                return Ok(None);
            }
            Err(e) => {
                give_all_back(held);
                return Err(e);
            }
        }
    }
    Ok(Some(held))
}

/// Gives a value a task held back to its slot: `changed` marks it dirty,
/// `poisoned` poisons it (neither for a value read side by side).
fn give_back(sh: &Shared, slot: &Arc<Slot>, h: Held, changed: bool, poisoned: bool) {
    match h {
        Held::Alone(v) => sh.release(slot, v, changed, poisoned),
        Held::Shared(_) => sh.release_shared(slot),
    }
    sh.note_idle(slot);
}

/// Measures again each executor a task changed (`changed` of its access),
/// by the bytes it encodes to, when the task left `delta` bytes allocated
/// (or freed) on its thread or changed several executors.
///
/// The delta alone does not say whose the bytes are: the task's result
/// holds some (a 40 MiB vector returned by a task that writes a 1 MiB
/// model), and a task that writes two executors grows either. A task that
/// left nothing allocated and changed one executor kept its size.
fn measure_changed(
    sh: &Shared,
    slots: &[(Arc<Slot>, Access)],
    held: &[Held],
    delta: i64,
    changed: impl Fn(Access) -> bool,
) {
    let n = slots.iter().filter(|(_, a)| changed(*a)).count();
    if n == 0 || (delta == 0 && n == 1) {
        return;
    }
    for ((slot, access), h) in slots.iter().zip(held) {
        let Held::Alone(v) = h else { continue };
        if !changed(*access) {
            continue;
        }
        if let Some(bytes) = (slot.measure)(&**v) {
            let size = slot.size.swap(bytes, Ordering::Relaxed);
            sh.note_size(slot, size);
        }
    }
}

fn run_task<R>(sh: &Shared, t: Task<R>) -> Result<R> {
    let stop = if sh.interrupted() {
        Some(Error::Interrupted)
    } else {
        sh.cap_lost()
    };
    if let Some(e) = stop {
        for (slot, _) in &t.slots {
            sh.dispatched(slot, t.seq);
        }
        return Err(e);
    }
    // The pending entries keep the executors ranked as needed-now until
    // they are pinned; only then is the task recorded as dispatched.
    let acquired = acquire_all(sh, &t);
    for (slot, _) in &t.slots {
        sh.dispatched(slot, t.seq);
    }
    let mut held = acquired?;
    let before = crate::alloc::thread_own_net();
    let cx = TaskContext {
        runtime: sh.ident(),
        ..TaskContext::default()
    };
    let here: Vec<PinnedHere> = t.slots.iter().map(|(s, _)| PinnedHere::new(s.id)).collect();
    let out = {
        let vals = values(&t, &mut held);
        let f = t.f;
        catch_unwind(AssertUnwindSafe(|| f(&vals, &cx)))
    };
    drop(here);
    // Publish what the task left allocated (its result, a grown
    // executor): the peak then sees it even when it stays below the
    // flush threshold.
    crate::alloc::flush_thread();
    // A value read side by side is lent as `&T` only, and reads must not
    // change what they read (the contract of `Batch::read`): it stays clean.
    let changed = |a: Access| a.writes() || (a == Access::Alone && cx.dirty.get());
    if out.is_ok() {
        let delta = crate::alloc::thread_own_net() - before;
        measure_changed(sh, &t.slots, &held, delta, changed);
    }
    Counters::add(&sh.counters().tasks, 1);
    let panicked = out.is_err();
    for ((slot, access), h) in t.slots.iter().zip(held) {
        let changed = changed(*access);
        give_back(sh, slot, h, changed, panicked && changed);
    }
    match out {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(Error::UnknownExecutor {
            executor: labels(&t.slots),
            removed: false,
        }),
        Err(p) => Err(Error::TaskPanicked {
            executor: labels(&t.slots),
            message: panic_message(&*p),
        }),
    }
}
