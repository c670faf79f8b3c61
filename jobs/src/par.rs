//! Work spread over a few threads, the caller's included, that degrades
//! to fewer threads (the caller alone at worst) when threads cannot be
//! started.
//!
//! The helpers are started once per process and kept, parked, for the
//! next call: a job's steps (k-means++'s thousands, each pass after a
//! fit) start no thread of their own. Starting a thread near an
//! address-space limit (`ulimit -v`) is what can end a process: Rust's
//! standard library aborts when a new thread cannot map its signal stack,
//! and no caller can catch that. A thread that cannot be started at all
//! (`spawn` returns an error) leaves the work to the threads there are.
//!
//! A call hands each helper it asks for a pointer to its work and waits,
//! before it returns, until every helper that took the work is done with
//! it; what a helper has not taken yet, the caller takes back. So the
//! work may borrow the caller's data, as with `std::thread::scope`.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// At most this many helpers are kept.
const MOST_HELPERS: usize = 64;

/// Calls `f` on every item, on up to `threads` threads (the caller is one
/// of them, and there are no more threads than items), each taking the
/// next item in order until none is left. A panic in `f` reaches the
/// caller, with its message, once every thread has stopped working on
/// the items.
pub(crate) fn for_each<T: Send>(items: Vec<T>, threads: usize, f: impl Fn(T) + Sync) {
    let threads = threads.min(items.len()).max(1);
    let queue = Mutex::new(items.into_iter());
    let work = || loop {
        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
        match next {
            Some(t) => f(t),
            None => break,
        }
    };
    if threads == 1 {
        return work();
    }
    let call = Call::default();
    let pool = pool();
    pool.hand_out(&work, &call, threads - 1);
    let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    pool.take_back(&call);
    let theirs = call.wait();
    if let Err(p) = mine {
        std::panic::resume_unwind(p);
    }
    if let Some(p) = theirs {
        std::panic::resume_unwind(p);
    }
}

/// One call's work as the helpers see it: its lifetime erased (see
/// [`Pool::hand_out`]).
type Work = *const (dyn Fn() + Sync + 'static);

/// A piece of work handed out: the work, and the call waiting for it.
struct Piece {
    work: Work,
    call: *const Call,
}

// SAFETY: a `Piece` points at a call's work (`Sync`) and its `Call` (its
// state behind a mutex), both alive until every piece of the call is
// either taken back or done (see `Pool::hand_out`).
unsafe impl Send for Piece {}

/// What a call waits for: its pieces that helpers took and have not
/// finished, and the first panic among them.
#[derive(Default)]
struct Call {
    state: Mutex<(usize, Option<Box<dyn Any + Send>>)>,
    done: Condvar,
}

impl Call {
    fn lock(&self) -> MutexGuard<'_, (usize, Option<Box<dyn Any + Send>>)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no helper works on this call: the first panic, if any.
    fn wait(&self) -> Option<Box<dyn Any + Send>> {
        let mut g = self.lock();
        while g.0 > 0 {
            g = self.done.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        g.1.take()
    }
}

/// The helpers: the pieces not yet taken, and how many helpers there are
/// and how many wait for a piece.
struct Pool {
    state: Mutex<PoolState>,
    work: Condvar,
    /// The process the helpers run in: a child made by `fork` has none.
    pid: u32,
}

#[derive(Default)]
struct PoolState {
    pieces: VecDeque<Piece>,
    helpers: usize,
    idle: usize,
}

/// This process's pool.
fn pool() -> Arc<Pool> {
    static POOL: Mutex<Option<Arc<Pool>>> = Mutex::new(None);
    let mut g = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let pid = std::process::id();
    match g.as_ref() {
        Some(p) if p.pid == pid => p.clone(),
        // None yet, or the parent's (after `fork`, its threads are gone).
        _ => {
            let p = Arc::new(Pool {
                state: Mutex::new(PoolState::default()),
                work: Condvar::new(),
                pid,
            });
            *g = Some(p.clone());
            p
        }
    }
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `n` pieces of `work` out, starting helpers while there are
    /// fewer idle than pieces (as far as threads start). `call` counts
    /// the pieces taken.
    ///
    /// The pointers handed out erase the borrows of `work` and `call`:
    /// the caller must call [`Pool::take_back`] and then [`Call::wait`]
    /// before either goes away, after which no helper holds them.
    fn hand_out(self: &Arc<Self>, work: &(dyn Fn() + Sync), call: &Call, n: usize) {
        // SAFETY: only the lifetime changes (the same fat pointer); see
        // above for why no helper uses it once the caller returns.
        let work: Work =
            unsafe { std::mem::transmute::<*const (dyn Fn() + Sync + '_), Work>(work) };
        let mut g = self.lock();
        for _ in 0..n {
            g.pieces.push_back(Piece {
                work,
                call: call as *const Call,
            });
        }
        while g.idle < g.pieces.len() && g.helpers < MOST_HELPERS {
            let me = self.clone();
            let started = std::thread::Builder::new()
                .name("outcore-par".into())
                .spawn(move || me.serve());
            if started.is_err() {
                break;
            }
            g.helpers += 1;
            g.idle += 1;
        }
        drop(g);
        self.work.notify_all();
    }

    /// Takes back the pieces of `call` no helper has taken.
    fn take_back(&self, call: &Call) {
        let at = call as *const Call;
        self.lock().pieces.retain(|p| !std::ptr::eq(p.call, at));
    }

    /// A helper: takes pieces and runs them, for the life of the process.
    fn serve(&self) {
        let mut g = self.lock();
        loop {
            let Some(piece) = g.pieces.pop_front() else {
                g = self.work.wait(g).unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            g.idle -= 1;
            // SAFETY: the call is alive: its caller waits for this piece
            // (counted here, under the pool's lock, before it could take
            // it back) before it returns.
            let call = unsafe { &*piece.call };
            call.lock().0 += 1;
            drop(g);
            // SAFETY: as `call`: the work outlives every piece taken.
            let work = unsafe { &*piece.work };
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            {
                let mut c = call.lock();
                c.0 -= 1;
                if let Err(p) = out {
                    c.1.get_or_insert(p);
                }
                // Notified under the call's lock: the caller cannot see
                // the count at 0, return and free the call before this
                // thread is done with it.
                call.done.notify_all();
            }
            g = self.lock();
            g.idle += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::for_each;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn every_item_once_whatever_the_thread_count() {
        for threads in [0, 1, 3, 8] {
            let sum = AtomicU64::new(0);
            let mut hits = [0u8; 100];
            let items: Vec<(usize, &mut u8)> = hits.iter_mut().enumerate().collect();
            for_each(items, threads, |(i, h)| {
                *h += 1;
                sum.fetch_add(i as u64, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|&h| h == 1), "threads {threads}");
            assert_eq!(sum.load(Ordering::Relaxed), 4950);
        }
    }

    #[test]
    fn no_more_threads_than_items_and_panics_keep_their_message() {
        let seen = std::sync::Mutex::new(std::collections::HashSet::new());
        for_each(vec![1, 2], 64, |_| {
            seen.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_millis(20));
        });
        assert!(seen.lock().unwrap().len() <= 2);
        let r = std::panic::catch_unwind(|| {
            for_each(vec![1, 2, 3], 2, |i| {
                if i == 3 {
                    panic!("item {i} failed");
                }
            })
        });
        let p = r.expect_err("the panic reaches the caller");
        let msg = p.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(msg, "item 3 failed");
    }

    #[test]
    fn calls_after_the_first_start_no_thread() {
        // The threads that ran the items of 200 calls of 4 threads: a
        // thread started per call and helper would be about 600 (thread
        // ids are not reused at once).
        let ran = std::sync::Mutex::new(std::collections::HashSet::new());
        for _ in 0..200 {
            let sum = AtomicU64::new(0);
            for_each((0..64u64).collect(), 4, |i| {
                // SAFETY: gettid takes nothing and cannot fail.
                ran.lock().unwrap().insert(unsafe { libc::gettid() });
                sum.fetch_add(i, Ordering::Relaxed);
            });
            assert_eq!(sum.load(Ordering::Relaxed), 2016);
        }
        // Other tests of this binary may use the helpers meanwhile, and
        // have more started: some slack.
        let n = ran.lock().unwrap().len();
        assert!(n <= 16, "200 calls ran on {n} threads");
    }

    #[test]
    fn calls_from_many_threads_at_once_each_get_their_items() {
        std::thread::scope(|s| {
            for t in 0..6u64 {
                s.spawn(move || {
                    for _ in 0..50 {
                        let sum = AtomicU64::new(0);
                        for_each((0..100u64).collect(), 3, |i| {
                            sum.fetch_add(i * (t + 1), Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 4950 * (t + 1));
                    }
                });
            }
        });
    }
}
