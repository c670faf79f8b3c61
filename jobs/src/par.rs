//! Work spread over a few scoped threads, the caller's included, that
//! degrades to fewer threads (the caller alone at worst) when threads
//! cannot be started: under an address-space limit a thread's stack may
//! not fit, and `std::thread::scope`'s `spawn` panics then.

use std::sync::Mutex;

/// Calls `f` on every item, on up to `threads` threads (the caller is one
/// of them), each taking the next item in order until none is left.
/// A panic in `f` reaches the caller when every thread has stopped.
pub(crate) fn for_each<T: Send>(items: Vec<T>, threads: usize, f: impl Fn(T) + Sync) {
    let queue = Mutex::new(items.into_iter());
    let work = || loop {
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
        match next {
            Some(t) => f(t),
            None => break,
        }
    };
    std::thread::scope(|sc| {
        for _ in 1..threads.max(1) {
            if std::thread::Builder::new().spawn_scoped(sc, work).is_err() {
                break;
            }
        }
        work();
    });
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
}
