//! A job's working memory, reserved by name against the cap: the memory a
//! job holds besides the executors the runtime may evict (its model, its
//! sums, a sample, one task's partition and scratch).
//!
//! A job makes one [`MemoryPool`] for its cap and takes a [`Reservation`]
//! for each consumer, named as the refusal should call it. A consumer
//! grows with [`Reservation::try_grow`] before it allocates, and gives
//! back with [`Reservation::shrink`] (or by being dropped). When a growth
//! would take the pool past the cap, it is refused with
//! [`Error::Memory`], one line that names the job,
//! what it would hold in all, its largest consumers and the cap; nothing
//! is reserved then. Without a cap every growth succeeds, and the pool
//! still knows what the job holds.
//!
//! ```
//! use outcore_jobs::memory::MemoryPool;
//!
//! let pool = MemoryPool::new(Some(4 << 20), "labelling with 8 centres");
//! let mut centres = pool.reserve("the centres");
//! centres.try_grow(1 << 20)?;
//! let mut task = pool.reserve("a task");
//! let err = task.try_grow(5 << 20).unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "labelling with 8 centres needs 6.0 MiB at once (a task 5.0 MiB, the centres \
//!      1.0 MiB), more than the memory cap of 4.0 MiB"
//! );
//! assert_eq!(pool.reserved(), 1 << 20);
//! # Ok::<(), outcore_jobs::Error>(())
//! ```

use std::sync::Mutex;

use outcore::format_bytes;

use crate::error::{Error, Result};

/// Consumers named in a refusal, largest first; the rest are summed.
const NAMED: usize = 4;

/// The working memory of one job under its cap (see the module's
/// documentation).
#[derive(Debug)]
pub struct MemoryPool {
    cap: Option<u64>,
    /// The job, as a refusal names it: "K-means with k = 8 on 32
    /// dimensions".
    job: String,
    /// Each consumer's name and bytes, in the order they were reserved.
    held: Mutex<Vec<(String, u64)>>,
}

impl MemoryPool {
    /// A pool for `job` (named so in refusals) under `cap` (none: every
    /// growth succeeds).
    pub fn new(cap: Option<u64>, job: impl Into<String>) -> MemoryPool {
        MemoryPool {
            cap,
            job: job.into(),
            held: Mutex::new(Vec::new()),
        }
    }

    /// The cap.
    pub fn cap(&self) -> Option<u64> {
        self.cap
    }

    /// A reservation of 0 bytes for `consumer`, the name a refusal gives
    /// it ("the centres", "a partition").
    pub fn reserve(&self, consumer: &str) -> Reservation<'_> {
        let mut held = self.lock();
        held.push((consumer.to_string(), 0));
        Reservation {
            pool: self,
            slot: held.len() - 1,
            bytes: 0,
        }
    }

    /// The bytes reserved, every consumer's.
    pub fn reserved(&self) -> u64 {
        self.lock().iter().map(|(_, b)| b).sum()
    }

    /// Under the cap, what is not reserved (`None` without a cap).
    pub fn free(&self) -> Option<u64> {
        self.cap.map(|c| c.saturating_sub(self.reserved()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(String, u64)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reservations for several consumers at once, each of its bytes: all
    /// of them, or a refusal that counts them all (and what is held
    /// already) and reserves nothing. A job's check at its start: the
    /// line says everything the job would hold, not only the first
    /// consumer that does not fit.
    ///
    /// # Errors
    ///
    /// [`Error::Memory`] over the cap.
    pub fn try_reserve_all(&self, parts: &[(&str, u64)]) -> Result<Vec<Reservation<'_>>> {
        let mut held = self.lock();
        let wanted = parts.iter().fold(0u64, |t, (_, b)| t.saturating_add(*b));
        let total = held
            .iter()
            .map(|(_, b)| b)
            .sum::<u64>()
            .saturating_add(wanted);
        if let Some(cap) = self.cap.filter(|&c| total > c) {
            let all = held
                .iter()
                .map(|(n, b)| (n.as_str(), *b))
                .chain(parts.iter().copied());
            return Err(self.refusal(all, total, cap));
        }
        let first = held.len();
        held.extend(parts.iter().map(|(n, b)| (n.to_string(), *b)));
        Ok(parts
            .iter()
            .enumerate()
            .map(|(i, (_, b))| Reservation {
                pool: self,
                slot: first + i,
                bytes: *b,
            })
            .collect())
    }

    /// Grows consumer `slot` by `bytes`, or refuses without reserving.
    fn grow(&self, slot: usize, bytes: u64) -> Result<()> {
        let mut held = self.lock();
        let total = held
            .iter()
            .map(|(_, b)| b)
            .sum::<u64>()
            .saturating_add(bytes);
        match self.cap {
            Some(cap) if total > cap => {
                let all = held.iter().enumerate().map(|(i, (n, b))| {
                    (
                        n.as_str(),
                        if i == slot {
                            b.saturating_add(bytes)
                        } else {
                            *b
                        },
                    )
                });
                Err(self.refusal(all, total, cap))
            }
            _ => {
                held[slot].1 += bytes;
                Ok(())
            }
        }
    }

    /// The line that refuses holding `consumers` (names and bytes), `total`
    /// in all, under `cap`.
    fn refusal<'n>(
        &self,
        consumers: impl Iterator<Item = (&'n str, u64)>,
        total: u64,
        cap: u64,
    ) -> Error {
        let mut all: Vec<(&str, u64)> = consumers.filter(|&(_, b)| b > 0).collect();
        // Largest first; equal sizes in the order reserved.
        all.sort_by_key(|&(_, b)| std::cmp::Reverse(b));
        let mut parts: Vec<String> = all
            .iter()
            .take(NAMED)
            .map(|(n, b)| format!("{n} {}", format_bytes(*b)))
            .collect();
        if all.len() > NAMED {
            let rest: u64 = all[NAMED..].iter().map(|(_, b)| b).sum();
            parts.push(format!("{} more {}", all.len() - NAMED, format_bytes(rest)));
        }
        Error::Memory(format!(
            "{} needs {} at once ({}), more than the memory cap of {}",
            self.job,
            format_bytes(total),
            parts.join(", "),
            format_bytes(cap)
        ))
    }
}

/// One consumer's share of a [`MemoryPool`]; given back when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    pool: &'a MemoryPool,
    slot: usize,
    bytes: u64,
}

impl Reservation<'_> {
    /// Reserves `bytes` more, or refuses in one line
    /// ([`Error::Memory`]) when the pool would pass its cap; a refusal
    /// reserves nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Memory`] over the cap.
    pub fn try_grow(&mut self, bytes: u64) -> Result<()> {
        self.pool.grow(self.slot, bytes)?;
        self.bytes += bytes;
        Ok(())
    }

    /// Gives back `bytes` (at most what it holds).
    pub fn shrink(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        self.pool.lock()[self.slot].1 -= bytes;
        self.bytes -= bytes;
    }

    /// The bytes it holds.
    pub fn size(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.shrink(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::MemoryPool;

    #[test]
    fn growth_within_the_cap_is_reserved_and_given_back() {
        let pool = MemoryPool::new(Some(100), "a job");
        let mut a = pool.reserve("a");
        a.try_grow(60).unwrap();
        {
            let mut b = pool.reserve("b");
            b.try_grow(40).unwrap();
            assert_eq!((pool.reserved(), pool.free()), (100, Some(0)));
        }
        assert_eq!(pool.reserved(), 60);
        a.shrink(1000);
        assert_eq!((a.size(), pool.reserved()), (0, 0));
    }

    #[test]
    fn a_refusal_names_the_largest_consumers_and_reserves_nothing() {
        let pool = MemoryPool::new(Some(10 << 20), "PCA of 64 columns");
        let mut keep = Vec::new();
        for (name, mib) in [("a", 1), ("b", 2), ("c", 3), ("d", 1), ("e", 1)] {
            let mut r = pool.reserve(name);
            r.try_grow(mib << 20).unwrap();
            keep.push(r);
        }
        let mut big = pool.reserve("the Gram matrix");
        let e = big.try_grow(4 << 20).unwrap_err();
        assert!(matches!(e, crate::Error::Memory(_)));
        assert_eq!(
            e.to_string(),
            "PCA of 64 columns needs 12.0 MiB at once (the Gram matrix 4.0 MiB, c 3.0 MiB, \
             b 2.0 MiB, a 1.0 MiB, 2 more 2.0 MiB), more than the memory cap of 10.0 MiB"
        );
        assert_eq!((big.size(), pool.reserved()), (0, 8 << 20));
    }

    #[test]
    fn several_at_once_are_all_reserved_or_all_named() {
        let pool = MemoryPool::new(Some(3 << 20), "a job");
        let held = pool
            .try_reserve_all(&[("x", 1 << 20), ("y", 1 << 20)])
            .unwrap();
        assert_eq!((held.len(), pool.reserved()), (2, 2 << 20));
        let e = pool
            .try_reserve_all(&[("z", 1 << 20), ("w", 1 << 20)])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "a job needs 4.0 MiB at once (x 1.0 MiB, y 1.0 MiB, z 1.0 MiB, w 1.0 MiB), \
             more than the memory cap of 3.0 MiB"
        );
        drop(held);
        assert_eq!(pool.reserved(), 0);
    }

    #[test]
    fn without_a_cap_every_growth_is_reserved() {
        let pool = MemoryPool::new(None, "a job");
        let mut r = pool.reserve("all");
        r.try_grow(u64::MAX / 2).unwrap();
        assert_eq!((pool.reserved(), pool.free()), (u64::MAX / 2, None));
    }
}
