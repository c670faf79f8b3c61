//! Counters kept by the runtime and the allocator, and a serializable
//! snapshot of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use serde::Serialize;

use crate::alloc::COUNTERS;

/// Live counters of one runtime (all relaxed atomics).
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub evictions: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub trap_evictions: AtomicU64,
    pub clean_evictions: AtomicU64,
    pub failed_writes: AtomicU64,
    pub loads: AtomicU64,
    pub loaded_bytes: AtomicU64,
    pub rebuilds: AtomicU64,
    pub prefetches: AtomicU64,
    pub prefetch_hits: AtomicU64,
    pub prefetches_unused: AtomicU64,
    pub demand_loads: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub direct_bytes_read: AtomicU64,
    pub tier_puts: AtomicU64,
    pub tier_bytes_sent: AtomicU64,
    pub tier_loads: AtomicU64,
    pub tier_bytes_loaded: AtomicU64,
    pub tier_fallbacks: AtomicU64,
    pub reclaimed_bytes: AtomicU64,
    /// The warning about the first failure of the spill tier.
    tier_warning: OnceLock<String>,
    pub tasks: AtomicU64,
    pub join_retries: AtomicU64,
    pub load_wait_nanos: AtomicU64,
    pub oversized: AtomicU64,
    /// The warning about the first executor larger than the cap.
    oversized_warning: OnceLock<String>,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a load of an executor of `size` bytes in memory that read
    /// `read` from its spill file, or `rebuilt` it from its lineage, made
    /// by a prefetcher or not.
    pub(crate) fn count_load(
        &self,
        size: u64,
        read: crate::spill::Loaded,
        rebuilt: bool,
        prefetched: bool,
    ) {
        Counters::add(&self.loads, 1);
        Counters::add(&self.loaded_bytes, size);
        Counters::add(&self.bytes_read, read.bytes);
        Counters::add(&self.direct_bytes_read, read.direct_bytes);
        if rebuilt {
            Counters::add(&self.rebuilds, 1);
        }
        if prefetched {
            Counters::add(&self.prefetches, 1);
        }
    }

    /// Counts a failure of the spill tier `tier` (named), met for
    /// `executor`; the first one also leaves a warning.
    pub(crate) fn note_tier_failure(&self, tier: &str, executor: &str, error: &std::io::Error) {
        Counters::add(&self.tier_fallbacks, 1);
        // An image the tier no longer holds is no failure: a tier may
        // forget any image to give its memory back.
        if error.kind() != std::io::ErrorKind::NotFound && self.tier_warning.get().is_none() {
            let _ = self.tier_warning.set(format!(
                "the spill tier ({tier}) failed for {executor}: {error}; executors it \
                 held are read from the disk or rebuilt from their lineage instead"
            ));
        }
    }

    /// Counts an executor taking `bytes` in memory, more than the cap
    /// (see [`Stats::oversized`]); the first one also leaves a warning.
    pub(crate) fn note_oversized(&self, executor: &str, bytes: usize, cap: u64) {
        Counters::add(&self.oversized, 1);
        if self.oversized_warning.get().is_none() {
            let _ = self.oversized_warning.set(format!(
                "{executor} takes {} in memory, more than the cap of {}: no eviction \
                 makes it fit, so memory goes over the cap whenever it is in memory \
                 (split it into smaller executors, or raise the cap)",
                crate::units::format_bytes(bytes as u64),
                crate::units::format_bytes(cap)
            ));
        }
    }
}

/// A runtime's executors by where they are, as last measured
/// ([`Runtime::footprint`](crate::Runtime::footprint)): the signal a
/// scheduler reads to decide whether the data fits its cap, or would fit
/// on more processes.
///
/// An executor's size is its memory when last in memory (for an evicted
/// one, what loading it takes again).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct Footprint {
    /// Executors registered.
    pub executors: u64,
    /// Of those, in memory (resident, or being loaded or evicted).
    pub resident: u64,
    /// Bytes of the executors in memory.
    pub resident_bytes: u64,
    /// Bytes of the executors not in memory (evicted, not yet built, or
    /// damaged).
    pub evicted_bytes: u64,
}

impl Footprint {
    /// Bytes of every executor, in memory or not.
    pub fn total_bytes(&self) -> u64 {
        self.resident_bytes + self.evicted_bytes
    }
}

/// A snapshot of the runtime's and the allocator's counters.
///
/// The executor counters (evictions, loads, bytes moved, tasks) belong to
/// one runtime; the allocator's (`peak_bytes`, `current_bytes`, the trap
/// counters and times) are process-wide, since the allocator is.
/// Serializes to JSON with [`Stats::to_json`].
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Executors evicted (written or dropped clean), for any reason.
    pub evictions: u64,
    /// The evicted executors' sizes in memory, added up: memory the
    /// evictions freed. Read with [`loaded_bytes`](Stats::loaded_bytes)
    /// between two points of a sweep, it says how much of the data does
    /// not fit: a sweep that evicts and loads again about its own size
    /// has found everything evicted before its turn.
    pub evicted_bytes: u64,
    /// Of those, evictions made from inside the allocation trap.
    pub trap_evictions: u64,
    /// Of those, clean evictions: memory dropped with no write, because the
    /// spill file from an earlier eviction was still valid.
    pub clean_evictions: u64,
    /// Spill writes that failed (the executor stayed in memory).
    pub failed_writes: u64,
    /// Executors loaded: read back from spill files, or built from their
    /// lineage ([`Stats::rebuilds`]).
    pub loads: u64,
    /// The loaded executors' sizes in memory, added up (whether read from
    /// spill files or built from their lineage).
    pub loaded_bytes: u64,
    /// Loads that built the executor from its lineage instead of a spill
    /// file (see [`Lineage`](crate::Lineage)).
    pub rebuilds: u64,
    /// Loads made ahead of time by the prefetcher.
    pub prefetches: u64,
    /// Tasks that found their executor already loaded by the prefetcher.
    pub prefetch_hits: u64,
    /// Executors the prefetcher loaded that were evicted again before any
    /// task used them: loads made for nothing (the executor is loaded once
    /// more when its task comes). A sweep that follows its plan makes
    /// none.
    pub prefetches_unused: u64,
    /// Loads a task had to wait for (the executor was not prefetched).
    pub demand_loads: u64,
    /// Bytes written to spill files.
    pub bytes_written: u64,
    /// Bytes read from spill files.
    pub bytes_read: u64,
    /// Of those, bytes read with direct I/O (`O_DIRECT`) straight into the
    /// loaded value's memory: the bytes of large [`PodVec`](crate::PodVec)s,
    /// where the spill directory's filesystem allows it.
    pub direct_bytes_read: u64,
    /// Images put into the spill tier (see
    /// [`Builder::spill_tier`](crate::Builder::spill_tier)).
    pub tier_puts: u64,
    /// Bytes of those images.
    pub tier_bytes_sent: u64,
    /// Executors loaded from the spill tier (counted in
    /// [`loads`](Stats::loads) too; not in [`bytes_read`](Stats::bytes_read)).
    pub tier_loads: u64,
    /// Bytes of the images those loads read.
    pub tier_bytes_loaded: u64,
    /// Times the spill tier failed (a put or a get; an image it no
    /// longer held, or handed back damaged): the executor went to the disk
    /// or was read from it, or rebuilt from its lineage, instead. The
    /// first one leaves a line in [`warnings`](Stats::warnings), unless
    /// it was an image the tier had forgotten (a get's
    /// [`NotFound`](std::io::ErrorKind::NotFound)): a tier may forget any
    /// image to give its memory back.
    pub tier_fallbacks: u64,
    /// Bytes the memory held for others gave back before the runtime
    /// evicted its own executors (see [`Reclaim`](crate::Reclaim)).
    pub reclaimed_bytes: u64,
    /// Tasks run.
    pub tasks: u64,
    /// Times a task over several executors (a join) gave back the ones it
    /// held and tried again: under an address-space limit, the room for
    /// its next executor was held by other threads' tasks or loads.
    pub join_retries: u64,
    /// Time tasks spent waiting for their executor to be loaded, in seconds.
    pub load_wait_seconds: f64,
    /// Highest accounted usage of the process, in bytes. Raised whenever a
    /// thread publishes its allocations: past the flush threshold, after
    /// every task and load, when [`stats`](crate::Runtime::stats) is
    /// called and when a thread exits. A spike shorter than that can be
    /// missed by at most the flush threshold per thread.
    pub peak_bytes: u64,
    /// Accounted usage of the process now, in bytes.
    pub current_bytes: u64,
    /// The soft cap in force, in bytes (absent when none).
    pub mem_cap_bytes: Option<u64>,
    /// Times an allocation took usage over the soft cap and trapped.
    pub soft_traps: u64,
    /// Times jemalloc returned null and the hard trap ran.
    pub hard_traps: u64,
    /// Soft traps that found nothing to evict (usage went over the cap).
    pub overshoots: u64,
    /// Allocations served from the reserve during evictions.
    pub reserve_allocs: u64,
    /// Times the address space held back under `RLIMIT_AS` was given up:
    /// to an allocation made while a runtime lock was held (where the trap
    /// cannot evict), or to one nothing was left to evict for. The next
    /// trap takes it back.
    pub headroom_releases: u64,
    /// Allocations that failed for good (null returned).
    pub alloc_failures: u64,
    /// Requests refused without eviction: larger than the cap or the hard
    /// limit, so no eviction could make them fit, tried once and failed
    /// (such as a `try_reserve` that the program handles). Such a request
    /// that the system grants is served, over the cap: only the peak shows
    /// it (and [`oversized`](Stats::oversized), for an executor).
    pub refusals: u64,
    /// Times an executor larger than the cap came into memory: inserted,
    /// loaded or rebuilt while larger than the cap, or grown past it by a
    /// task. No eviction can make such an executor fit, so each time
    /// memory goes over the cap by at least its excess (which
    /// [`peak_bytes`](Stats::peak_bytes) shows); the runtime still serves
    /// it, as the allocator serves a single request over the cap that the
    /// system grants. The first one leaves a line in
    /// [`warnings`](Stats::warnings).
    pub oversized: u64,
    /// Time spent evicting inside the trap, in seconds.
    pub trap_seconds: f64,
    /// Time threads spent waiting for another thread's trap, in seconds.
    pub wait_seconds: f64,
    /// What the runtime found wrong, each kind said once, in plain
    /// sentences: the first executor larger than the cap (see
    /// [`oversized`](Stats::oversized)), naming it, its size and the cap;
    /// the first failure of the spill tier (see
    /// [`tier_fallbacks`](Stats::tier_fallbacks)), naming the tier, the
    /// executor and the error. Empty when all is well.
    pub warnings: Vec<String>,
}

impl Stats {
    pub(crate) fn collect(c: &Counters, cap: Option<u64>) -> Stats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            evictions: g(&c.evictions),
            evicted_bytes: g(&c.evicted_bytes),
            trap_evictions: g(&c.trap_evictions),
            clean_evictions: g(&c.clean_evictions),
            failed_writes: g(&c.failed_writes),
            loads: g(&c.loads),
            loaded_bytes: g(&c.loaded_bytes),
            rebuilds: g(&c.rebuilds),
            prefetches: g(&c.prefetches),
            prefetch_hits: g(&c.prefetch_hits),
            prefetches_unused: g(&c.prefetches_unused),
            demand_loads: g(&c.demand_loads),
            bytes_written: g(&c.bytes_written),
            bytes_read: g(&c.bytes_read),
            direct_bytes_read: g(&c.direct_bytes_read),
            tier_puts: g(&c.tier_puts),
            tier_bytes_sent: g(&c.tier_bytes_sent),
            tier_loads: g(&c.tier_loads),
            tier_bytes_loaded: g(&c.tier_bytes_loaded),
            tier_fallbacks: g(&c.tier_fallbacks),
            reclaimed_bytes: g(&c.reclaimed_bytes),
            tasks: g(&c.tasks),
            join_retries: g(&c.join_retries),
            load_wait_seconds: g(&c.load_wait_nanos) as f64 * 1e-9,
            peak_bytes: crate::alloc::peak_usage() as u64,
            current_bytes: crate::alloc::current_usage() as u64,
            mem_cap_bytes: cap,
            soft_traps: g(&COUNTERS.soft_traps),
            hard_traps: g(&COUNTERS.hard_traps),
            overshoots: g(&COUNTERS.overshoots),
            reserve_allocs: g(&COUNTERS.reserve_allocs),
            headroom_releases: g(&COUNTERS.headroom_releases),
            alloc_failures: g(&COUNTERS.failures),
            refusals: g(&COUNTERS.refusals),
            oversized: g(&c.oversized),
            trap_seconds: g(&COUNTERS.trap_nanos) as f64 * 1e-9,
            wait_seconds: g(&COUNTERS.wait_nanos) as f64 * 1e-9,
            warnings: [&c.oversized_warning, &c.tier_warning]
                .into_iter()
                .filter_map(|w| w.get().cloned())
                .collect(),
        }
    }

    /// The snapshot as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
