//! The worker pool and the prefetcher's wake-up signal.
//!
//! Workers share a queue of jobs (batches). A worker asks the front job
//! for a step (a batch runs the first task whose executor is free: tasks
//! on one executor run one at a time, in submission order), or the next
//! job when that one has nothing free to run; a job with nothing left to
//! hand out is taken off the queue.
//! The pool knows nothing of executors: a job carries what it needs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// What a worker did with a job.
pub(crate) enum Step {
    /// Ran a task.
    Ran,
    /// Tasks remain, but their executors are busy.
    Blocked,
    /// Nothing left to hand out.
    Exhausted,
}

/// A job as the pool sees it.
pub(crate) trait Job: Send + Sync {
    /// Runs one unit of work. MUST NOT panic (task panics are caught).
    fn step(&self) -> Step;
}

/// The queue of jobs the workers take from.
#[derive(Default)]
pub(crate) struct Pool {
    queue: Mutex<VecDeque<Arc<dyn Job>>>,
    cv: Condvar,
    shutdown: AtomicBool,
}

impl Pool {
    pub(crate) fn submit(&self, job: Arc<dyn Job>) {
        self.queue.lock().push_back(job);
        self.cv.notify_all();
    }

    pub(crate) fn wake_all(&self) {
        let _q = self.queue.lock();
        self.cv.notify_all();
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.queue.lock().is_empty()
    }

    /// Tells the workers to exit once their current step is done. Jobs still queued (finished batches not yet taken off) are dropped.
    pub(crate) fn shut_down(&self) {
        self.shutdown.store(true, Ordering::Release);
        let mut q = self.queue.lock();
        q.clear();
        self.cv.notify_all();
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }
}

/// A worker thread's loop: runs job steps until the pool shuts down.
///
/// A worker asks the jobs for a step in queue order: when the front job's
/// remaining tasks all wait for busy executors, it goes on to the next
/// job, so that one batch never holds up another's free work. Only when
/// every job is blocked does it wait (woken by any task's end, or after a
/// few milliseconds).
pub(crate) fn worker_loop(pool: &Pool) {
    // Jobs found blocked since the last task run: the next to ask is the
    // one after them.
    let mut skip = 0usize;
    loop {
        let job = {
            let mut q = pool.queue.lock();
            loop {
                if pool.is_shut_down() {
                    drop(q);
                    crate::alloc::flush_thread();
                    return;
                }
                if let Some(j) = q.get(skip) {
                    break j.clone();
                }
                if skip > 0 {
                    // Every job is blocked: wait for a task to end.
                    pool.cv.wait_for(&mut q, Duration::from_millis(5));
                    skip = 0;
                    continue;
                }
                pool.cv.wait(&mut q);
            }
        };
        // A job catches its tasks' panics; should one escape anyway, the
        // worker survives and keeps serving the queue.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.step()))
            .unwrap_or(Step::Blocked);
        match step {
            Step::Ran => {
                skip = 0;
                pool.wake_all();
            }
            Step::Blocked => skip += 1,
            Step::Exhausted => {
                // Off the queue, wherever it is now; the jobs after it
                // move up, so `skip` already points at the next one.
                let mut q = pool.queue.lock();
                if let Some(i) = q.iter().position(|f| Arc::ptr_eq(f, &job)) {
                    q.remove(i);
                }
            }
        }
    }
}

/// A wake-up signal with a timeout (for the prefetchers: it wakes them
/// all), and closed for good when they are to stop.
#[derive(Default)]
pub(crate) struct Signal {
    /// Woken since the last wait; closed.
    state: Mutex<(bool, bool)>,
    cv: Condvar,
}

impl Signal {
    pub(crate) fn notify(&self) {
        let mut s = self.state.lock();
        s.0 = true;
        self.cv.notify_all();
    }

    /// Wakes every waiter and makes every later wait return at once. A
    /// notification alone is not enough to stop several waiters: the
    /// first one it wakes clears it, and one that had not reached its
    /// wait yet would then sleep its whole timeout (50 ms on every
    /// runtime's drop).
    pub(crate) fn close(&self) {
        let mut s = self.state.lock();
        s.1 = true;
        self.cv.notify_all();
    }

    pub(crate) fn wait(&self, timeout: Duration) {
        let mut s = self.state.lock();
        if !s.0 && !s.1 {
            self.cv.wait_for(&mut s, timeout);
        }
        s.0 = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After `close`, every wait returns at once, however many waiters
    /// come (a notification wakes only the waits it finds). Each wait is
    /// for an hour: the watchdog fails the test if one sleeps.
    #[test]
    fn a_closed_signal_never_sleeps() {
        let s = std::sync::Arc::new(Signal::default());
        s.close();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = s.clone();
        std::thread::spawn(move || {
            for _ in 0..4 {
                waiter.wait(Duration::from_secs(3600));
            }
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(60)).is_ok(),
            "a wait after close slept"
        );
    }
}
