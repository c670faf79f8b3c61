//! The health of spill writes: the last error, the per-executor and global
//! backoff after failures, and the fault-injection hook used by tests and
//! the soak script.
//!
//! After a failed write, that executor is not written again for 500 ms
//! (instead of serializing it again and again); after 3 failures in a row
//! (a full disk), no dirty executor is written for 500 ms. Clean evictions
//! go on meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::alloc::linebuf::LineBuf;

/// How long a failed executor, or all dirty writes after repeated failures,
/// are left alone (ms).
const BACKOFF_MS: u64 = 500;
/// Failures in a row that pause all dirty writes.
const FAILURES_TO_PAUSE: u64 = 3;

pub(crate) struct WriteHealth {
    /// The last failure: the file and the reason, in a fixed buffer (this
    /// runs inside evictions, whose allocations may come from the reserve
    /// and must not outlive them).
    last_error: Mutex<Option<LineBuf>>,
    /// Whether any write has failed (for the out-of-memory diagnostic).
    any_failed: AtomicBool,
    /// Whether the last failure was in the value's own encoding (its
    /// `Serialize`), not in the file.
    last_by_value: AtomicBool,
    /// No dirty write is attempted before this time (ms since start).
    backoff_until: AtomicU64,
    /// Failures since the last write that succeeded.
    failures_in_a_row: AtomicU64,
    /// `OUTCORE_FAULT_WRITE_EVERY=N`: every Nth write fails (0: never).
    fault_every: u64,
    fault_count: AtomicU64,
}

impl WriteHealth {
    /// Reads the fault-injection setting from the environment.
    pub(crate) fn from_env() -> WriteHealth {
        WriteHealth {
            last_error: Mutex::new(None),
            any_failed: AtomicBool::new(false),
            last_by_value: AtomicBool::new(false),
            backoff_until: AtomicU64::new(0),
            failures_in_a_row: AtomicU64::new(0),
            fault_every: std::env::var("OUTCORE_FAULT_WRITE_EVERY")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            fault_count: AtomicU64::new(0),
        }
    }

    /// Whether a dirty write of an executor whose own retry time is
    /// `retry_at` may be attempted at `now`.
    pub(crate) fn may_write(&self, now: u64, retry_at: u64) -> bool {
        now >= retry_at && now >= self.backoff_until.load(Ordering::Relaxed)
    }

    /// Test and soak hook: with `OUTCORE_FAULT_WRITE_EVERY=N`, every Nth
    /// spill write fails as if the disk were full.
    pub(crate) fn inject_fault(&self) -> bool {
        match self.fault_every {
            0 => false,
            n => self.fault_count.fetch_add(1, Ordering::Relaxed) % n == n - 1,
        }
    }

    pub(crate) fn succeeded(&self) {
        self.failures_in_a_row.store(0, Ordering::Relaxed);
    }

    /// Records a failure at `now` with `message` (`by_value`: in the
    /// value's encoding); returns the time before which the same executor
    /// must not be written again.
    pub(crate) fn failed(&self, now: u64, message: &str, by_value: bool) -> u64 {
        self.any_failed.store(true, Ordering::Relaxed);
        self.last_by_value.store(by_value, Ordering::Relaxed);
        if self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1 >= FAILURES_TO_PAUSE {
            self.backoff_until
                .store(now + BACKOFF_MS, Ordering::Relaxed);
        }
        // Never block here: this may run inside the allocation trap.
        if let Ok(mut e) = self.last_error.try_lock() {
            let mut buf = LineBuf::new();
            buf.push(message.as_bytes());
            *e = Some(buf);
        }
        now + BACKOFF_MS
    }

    /// Whether writes keep failing: the last few attempted all failed.
    pub(crate) fn failing(&self) -> bool {
        self.failures_in_a_row.load(Ordering::Relaxed) >= FAILURES_TO_PAUSE
    }

    pub(crate) fn any_failed(&self) -> bool {
        self.any_failed.load(Ordering::Relaxed)
    }

    /// Whether the last failure was in the value's own encoding.
    pub(crate) fn last_by_value(&self) -> bool {
        self.last_by_value.load(Ordering::Relaxed)
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|b| String::from_utf8_lossy(b.as_bytes()).into_owned())
    }
}
