//! The worker pool and the prefetcher's wake-up signal.
//!
//! Workers share a queue of batches. Each worker works on the front batch:
//! it takes the first task whose executor is free (tasks on one executor
//! run one at a time, in submission order), runs it, and goes on; when the
//! batch has nothing left to hand out it is taken off the queue.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::Shared;

/// What a worker did with a batch.
pub(crate) enum Step {
    /// Ran a task.
    Ran,
    /// Tasks remain, but their executors are busy.
    Blocked,
    /// Nothing left to hand out.
    Exhausted,
}

/// A batch as the pool sees it.
pub(crate) trait Job: Send + Sync {
    fn step(&self, sh: &Shared) -> Step;
}

#[derive(Default)]
pub(crate) struct Pool {
    queue: Mutex<VecDeque<Arc<dyn Job>>>,
    cv: Condvar,
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
}

pub(crate) fn worker_loop(sh: Arc<Shared>) {
    loop {
        let job = {
            let mut q = sh.pool.queue.lock();
            loop {
                if sh.shutdown.load(Ordering::Acquire) {
                    drop(q);
                    crate::alloc::flush_thread();
                    return;
                }
                if let Some(j) = q.front() {
                    break j.clone();
                }
                sh.pool.cv.wait(&mut q);
            }
        };
        match job.step(&sh) {
            Step::Ran => sh.pool.wake_all(),
            Step::Blocked => {
                let mut q = sh.pool.queue.lock();
                sh.pool.cv.wait_for(&mut q, Duration::from_millis(5));
            }
            Step::Exhausted => {
                let mut q = sh.pool.queue.lock();
                if q.front().is_some_and(|f| Arc::ptr_eq(f, &job)) {
                    q.pop_front();
                }
            }
        }
    }
}

/// A wake-up signal with a timeout (for the prefetcher).
#[derive(Default)]
pub(crate) struct Signal {
    flag: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    pub(crate) fn notify(&self) {
        let mut f = self.flag.lock();
        *f = true;
        self.cv.notify_one();
    }

    pub(crate) fn wait(&self, timeout: Duration) {
        let mut f = self.flag.lock();
        if !*f {
            self.cv.wait_for(&mut f, timeout);
        }
        *f = false;
    }
}
