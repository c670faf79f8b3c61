//! Work spread over a few scoped threads, the caller's included, that
//! degrades to fewer threads (the caller alone at worst) when threads
//! cannot be started: under an address-space limit a thread's stack may
//! not fit, and `std::thread::scope`'s `spawn` panics then.

use std::sync::Mutex;

/// Calls `f` on every item, on up to `threads` threads (the caller is one
/// of them, and there are no more threads than items), each taking the
/// next item in order until none is left. A panic in `f` reaches the
/// caller, with its message, when every thread has stopped.
pub(crate) fn for_each<T: Send>(items: Vec<T>, threads: usize, f: impl Fn(T) + Sync) {
    let threads = threads.min(items.len()).max(1);
    let queue = Mutex::new(items.into_iter());
    let work = || loop {
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
        match next {
            Some(t) => f(t),
            None => break,
        }
    };
    std::thread::scope(|sc| {
        let mut helpers = Vec::with_capacity(threads - 1);
        for _ in 1..threads {
            match std::thread::Builder::new().spawn_scoped(sc, work) {
                Ok(h) => helpers.push(h),
                Err(_) => break,
            }
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        for h in helpers {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
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
}
