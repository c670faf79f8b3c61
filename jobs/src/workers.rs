//! How many worker threads a cap holds.
//!
//! Executors are not all a run holds: each worker's running task pins
//! its partition (which the trap cannot evict) and holds its own working
//! memory, and each worker thread keeps memory the cap sees late or not
//! at all: the allocations it has not yet counted (up to the
//! [flush threshold](outcore::flush_threshold_for)), its stack and the
//! allocator's per-thread caches. Under a 64 MiB cap, 256 workers held
//! 250-380 MiB resident. A job therefore plans its workers from the cap
//! before the runtime starts them: their tasks and threads together take
//! at most half of what the cap leaves after the job's fixed working
//! memory (the other half keeps executors resident between sweeps), and
//! when fewer than asked fit, the job runs fewer and says so in one line
//! ([`Workers::warning`]).
//!
//! ```
//! use outcore_jobs::Workers;
//!
//! // 64 MiB cap, 4 MiB of centres and sums, 1 MiB per task.
//! let w = Workers::plan(Some(64 << 20), 4 << 20, 1 << 20, 256);
//! assert!(w.run < 256 && w.run >= 1);
//! assert!(w.warning().is_some());
//! // Without a cap, every worker asked for runs.
//! assert_eq!(Workers::plan(None, 4 << 20, 1 << 20, 256).run, 256);
//! ```

use outcore::format_bytes;

use crate::error::{Error, Result};

/// Descriptors a run keeps open besides those already open when it
/// starts: the spill directory and its lock, the input and label files
/// (a buffered and a direct handle each), the outputs being written and
/// the timeline.
const BASE_DESCRIPTORS: u64 = 16;

/// Descriptors each worker and each of the (at most four) prefetch
/// threads may hold at once: the spill file it loads or writes, and the
/// input file it reads again.
const THREAD_DESCRIPTORS: u64 = 2;

/// What a worker thread holds besides its task's memory and its uncounted
/// allocations: its stack as far as the tasks touch it and the
/// allocator's per-thread caches. Measured on x86-64 Linux (`outcore
/// kmeans --synthetic 32MiB --dims 64 --k 16 --epochs 2 --mem-cap none
/// --partitions 1024`): peak resident 43.8 MiB with 1 worker, 49.6 with
/// 64 and 62.0 with 256, about 75 KiB a worker; a quarter MiB leaves room
/// for tasks that touch more of their stack.
pub const THREAD_BYTES: u64 = 256 << 10;

/// The workers a run starts: how many were asked for, how many the cap
/// holds, and what each needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    /// The workers asked for.
    pub wanted: usize,
    /// The workers the run starts: `wanted`, or fewer when the cap cannot
    /// hold them; at least one.
    pub run: usize,
    /// The bytes each worker needs: its task's, its thread's
    /// ([`THREAD_BYTES`]) and its uncounted allocations'.
    pub each: u64,
    /// The cap planned against, if any.
    pub cap: Option<u64>,
    /// What the run holds whatever its workers.
    pub fixed: u64,
}

impl Workers {
    /// The workers to start under `cap` when the run holds `fixed` bytes
    /// whatever the workers (centres, sums, a model) and each worker's
    /// task holds `task` bytes (its pinned partition and working memory),
    /// `wanted` being asked for. Their memory takes at most half of what
    /// `cap` leaves after `fixed`; one worker always runs (a cap too
    /// small for one is the job's own check).
    pub fn plan(cap: Option<u64>, fixed: u64, task: u64, wanted: usize) -> Workers {
        let wanted = wanted.max(1);
        let each = task
            .saturating_add(THREAD_BYTES)
            .saturating_add(outcore::flush_threshold_for(cap) as u64);
        let run = match cap {
            None => wanted,
            Some(cap) => {
                let room = cap.saturating_sub(fixed) / 2;
                usize::try_from(room / each.max(1))
                    .unwrap_or(usize::MAX)
                    .clamp(1, wanted)
            }
        };
        Workers {
            wanted,
            run,
            each,
            cap,
            fixed,
        }
    }

    /// The open-file descriptors (`ulimit -n`) the run needs: those open
    /// now, and what its threads and files add. Under a smaller limit a
    /// spill write or load failed part-way (a write that fails keeps its
    /// executor in memory: runs ended at 9x the cap) or an output after the
    /// whole run; measured, `kmeans` with every output needed 12-16.
    pub fn descriptors(&self) -> u64 {
        let open = std::fs::read_dir("/proc/self/fd").map_or(3, |d| d.count() as u64);
        open + BASE_DESCRIPTORS + THREAD_DESCRIPTORS * (self.run as u64 + 4)
    }

    /// Checks the open-file limit against [`descriptors`](Self::descriptors)
    /// before the run starts: the soft limit is raised toward the hard one
    /// when that is enough; otherwise an error in one line.
    pub fn check_descriptors(&self) -> Result<()> {
        let need = self.descriptors();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit struct.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
            || lim.rlim_cur == libc::RLIM_INFINITY
            || lim.rlim_cur >= need
        {
            return Ok(());
        }
        if lim.rlim_max == libc::RLIM_INFINITY || lim.rlim_max >= need {
            let raised = libc::rlimit {
                rlim_cur: need,
                rlim_max: lim.rlim_max,
            };
            // SAFETY: `raised` is a valid rlimit struct, read for the call.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                return Ok(());
            }
        }
        Err(Error::Input(format!(
            "the open-file limit (ulimit -n) of {} is too small for this run with {}: it needs at least {need} descriptors (spill files, inputs, outputs)",
            lim.rlim_cur,
            if self.run == 1 { "one worker".to_string() } else { format!("{} workers", self.run) }
        )))
    }

    /// One line when the run starts fewer workers than asked for, saying
    /// how many and why; none when the cap cannot hold even one worker
    /// beside the fixed memory (the job's own check says what it needs).
    pub fn warning(&self) -> Option<String> {
        let one = self.fixed.saturating_add(self.each);
        if self.run >= self.wanted || self.cap.is_some_and(|c| c < one) {
            return None;
        }
        Some(format!(
            "outcore: warning: {} workers asked for, {} run: each needs about {} (its task's partition and working memory, its thread's), and the cap of {} holds {} beside the executors",
            self.wanted,
            self.run,
            format_bytes(self.each),
            format_bytes(self.cap.unwrap_or(0)),
            if self.run == 1 { "one".to_string() } else { self.run.to_string() }
        ))
    }
}

/// The partitions' size by default: a 256th of the cap, between `least`
/// and 256 MiB; 64 MiB without a cap. The command line and Python both
/// cut their data so.
///
/// Between the executors kept in memory across sweeps and the cap sit
/// the few being worked on, loaded ahead or just used (about six with two
/// workers), so small partitions waste little of the cap: at 1/64 of it,
/// six took 9% and a 2x overcommitted sweep read 1.17x (data - cap); at
/// 1/256, 1.06x.
///
/// ```
/// assert_eq!(outcore_jobs::partition_bytes(Some(1 << 30), 1 << 20), 4 << 20);
/// assert_eq!(outcore_jobs::partition_bytes(Some(64 << 20), 1 << 20), 1 << 20);
/// assert_eq!(outcore_jobs::partition_bytes(None, 1 << 20), 64 << 20);
/// ```
pub fn partition_bytes(cap: Option<u64>, least: u64) -> u64 {
    const PARTS_PER_CAP: u64 = 256;
    match cap {
        Some(cap) => (cap / PARTS_PER_CAP).clamp(least.min(256 << 20), 256 << 20),
        None => 64 << 20,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_take_at_most_half_of_what_the_cap_leaves() {
        for cap in [16u64 << 20, 64 << 20, 1 << 30, 64 << 30] {
            for task in [64u64 << 10, 1 << 20, 64 << 20] {
                let fixed = cap / 8;
                let w = Workers::plan(Some(cap), fixed, task, 1024);
                assert!(w.run >= 1);
                assert!(
                    w.run == 1 || w.run as u64 * w.each <= (cap - fixed) / 2,
                    "{w:?}"
                );
                // One more would not fit, unless all asked for run.
                assert!(w.run == 1024 || (w.run as u64 + 1) * w.each > (cap - fixed) / 2);
            }
        }
    }

    #[test]
    fn without_a_cap_or_with_room_every_worker_runs_and_nothing_is_said() {
        let w = Workers::plan(None, 1 << 30, 1 << 30, 8);
        assert_eq!((w.run, w.warning()), (8, None));
        let w = Workers::plan(Some(1 << 30), 0, 1 << 20, 2);
        assert_eq!((w.run, w.warning()), (2, None));
        // Zero asked for is one.
        assert_eq!(Workers::plan(None, 0, 0, 0).run, 1);
    }

    #[test]
    fn a_cap_smaller_than_the_fixed_memory_runs_one_worker_and_leaves_the_line_to_the_job() {
        let w = Workers::plan(Some(1 << 20), 1 << 30, 1 << 20, 4);
        assert_eq!((w.run, w.warning()), (1, None));
        let w = Workers::plan(Some(8 << 20), 1 << 20, 2 << 20, 4);
        assert_eq!(w.run, 1);
        let line = w.warning().unwrap_or_default();
        assert!(line.contains("4 workers asked for, 1 run"), "{line}");
    }
}
