//! The session: what every job shares, so a job's own code is its
//! algorithm.
//!
//! ```text
//!   Session ── the runtime (cap, workers, spill directory)
//!     │     ── the ranks (one process is the one-rank case)
//!     │     ── the phase and the --timeline sampler
//!     │     ── the clock, and the input files' reads
//!     ▼
//!   job::load(&session, ..) ─► job::run(&session, ..) ─► session.report()
//!                                                         Totals per rank,
//!                                                         summed on rank 0
//! ```
//!
//! A job's load registers the bytes its executors read from the input
//! ([`Session::add_reads`]), so [`Session::bytes_read`] and the
//! [`Totals`] count spill files and input together, the way `top`-minded
//! users count a job's reads. [`Totals`] is one struct, flattened into
//! each job's statistics.
//!
//! ```
//! use outcore::Runtime;
//! use outcore_jobs::kmeans::{self, Config};
//! use outcore_jobs::{Session, Source};
//! # #[global_allocator]
//! # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
//!
//! let session = Session::new(Runtime::builder().build()?);
//! let cfg = Config {
//!     k: 4,
//!     ..Config::default()
//! };
//! // 1 MiB of 8-dimensional points around 4 blobs.
//! let src = Source::synthetic(1 << 20, 8, 4, 7);
//! let ds = kmeans::load(&session, &src, None, Some(&cfg), 64 << 10, |_, _| {})?;
//! session.phase("k-means");
//! let out = kmeans::run(&session, &ds, &cfg, |_| {})?;
//! assert_eq!(out.centers.k, 4);
//! let report = session.report()?.expect("one process is rank 0");
//! assert_eq!(report.per_process.len(), 1);
//! assert_eq!(report.total.evictions, 0);
//! // Synthetic data is generated, not read.
//! assert_eq!(report.total.input_bytes_read, 0);
//! # Ok::<(), outcore_jobs::Error>(())
//! ```

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use outcore::{Runtime, Stats};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::input::InputReads;
use crate::ranks::Ranks;
use crate::timeline::{self, Timeline};

/// What every job needs: the runtime, the ranks, the phases and timeline,
/// the clock and the input's reads.
#[derive(Debug)]
pub struct Session {
    rt: Runtime,
    ranks: Ranks,
    timeline: Option<Timeline>,
    started: Instant,
    reads: Mutex<Vec<InputReads>>,
}

impl Session {
    /// A session of one process on `rt`.
    pub fn new(rt: Runtime) -> Session {
        Session::on(rt, Ranks::single())
    }

    /// A session on `ranks` (each rank builds its own runtime `rt`).
    pub fn on(rt: Runtime, ranks: Ranks) -> Session {
        Session {
            rt,
            ranks,
            timeline: None,
            started: Instant::now(),
            reads: Mutex::new(Vec::new()),
        }
    }

    /// Samples memory and traffic into a CSV file at `path` every
    /// [`timeline::PERIOD`], starting in phase `first` (see
    /// [`Timeline`]). On MPI ranks other than 0 this does nothing: the
    /// timeline is rank 0's.
    pub fn record_timeline(&mut self, path: &Path, first: &str) -> Result<()> {
        if self.ranks.is_root() {
            let t = Timeline::start(&self.rt, path, timeline::PERIOD, first)?;
            for r in self.input_reads() {
                t.add_reads(r);
            }
            t.set_ranks(self.ranks.size());
            self.timeline = Some(t);
        }
        Ok(())
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// The ranks.
    pub fn ranks(&self) -> &Ranks {
        &self.ranks
    }

    /// Whether this process is rank 0 (always, on one process).
    pub fn is_root(&self) -> bool {
        self.ranks.is_root()
    }

    /// Tells the timeline the ranks the job now runs on, after it grew
    /// ([`grow`](crate::grow)).
    pub fn ranks_changed(&self) {
        if let Some(t) = &self.timeline {
            t.set_ranks(self.ranks.size());
        }
    }

    /// Names the phase the timeline's next samples belong to.
    pub fn phase(&self, name: &str) {
        if let Some(t) = &self.timeline {
            t.phase(name);
        }
    }

    /// Counts the reads of an input file (executors built and rebuilt
    /// from it) in [`Session::bytes_read`], the totals and the timeline.
    /// The jobs' loads call it.
    pub fn add_reads(&self, r: InputReads) {
        if let Some(t) = &self.timeline {
            t.add_reads(r.clone());
        }
        if let Ok(mut v) = self.reads.lock() {
            v.push(r);
        }
    }

    fn input_reads(&self) -> Vec<InputReads> {
        self.reads.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Bytes read from input files so far, on this process.
    pub fn input_bytes_read(&self) -> u64 {
        self.input_reads().iter().map(InputReads::bytes).sum()
    }

    /// Bytes read from disk so far on this process: spill files and input
    /// files.
    pub fn bytes_read(&self) -> u64 {
        self.rt.stats().bytes_read + self.input_bytes_read()
    }

    /// Seconds since the session began.
    pub fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// This process's totals so far, from `stats` (the runtime's counters,
    /// taken once by the caller so that every figure it shows agrees).
    pub fn totals(&self, stats: &Stats) -> Totals {
        let input = self.input_bytes_read();
        let (kept, given_back) = self.ranks().kept_for_others();
        Totals {
            evictions: stats.evictions,
            trap_evictions: stats.trap_evictions,
            clean_evictions: stats.clean_evictions,
            loads: stats.loads,
            prefetch_hits: stats.prefetch_hits,
            bytes_written: stats.bytes_written,
            bytes_read: stats.bytes_read + input,
            input_bytes_read: input,
            peak_bytes: stats.peak_bytes,
            peak_resident_bytes: peak_resident(),
            wall_seconds: self.seconds(),
            remote_bytes_sent: stats.tier_bytes_sent,
            remote_bytes_loaded: stats.tier_bytes_loaded,
            remote_fallbacks: stats.tier_fallbacks,
            remote_bytes_kept: kept,
            remote_bytes_given_back: given_back,
        }
    }

    /// Writes the timeline's last sample, showing `stats` (so the file and
    /// the totals agree), and closes it. Nothing without a timeline.
    pub fn finish_timeline(&mut self, stats: &Stats) -> Result<()> {
        if let Some(t) = self.timeline.take() {
            t.finish_at(stats)?;
        }
        Ok(())
    }

    /// Every process's totals, on rank 0 (`None` on the other ranks).
    /// Collective: every rank calls it, once, at the end of the job.
    pub fn report(&self) -> Result<Option<Report>> {
        self.report_at(&self.rt.stats())
    }

    /// [`Session::report`], with this process's counters from `stats`: the
    /// ones the timeline's last row shows ([`Session::finish_timeline`]),
    /// so the two agree even while a prefetch still finishes in the
    /// background (counters taken twice differed by a load once in CI).
    pub fn report_at(&self, stats: &Stats) -> Result<Option<Report>> {
        let mine = self.totals(stats);
        let cap = self.rt.cap();
        let mut row = mine.to_row();
        row.push(cap.map_or(-1.0, |c| c as f64));
        let Some(rows) = self.ranks.gather_rows(&row)? else {
            return Ok(None);
        };
        let per_process: Vec<ProcessTotals> = rows
            .iter()
            .enumerate()
            .map(|(rank, r)| ProcessTotals {
                rank,
                totals: Totals::from_row(r),
                mem_cap_bytes: r
                    .get(Totals::FIELDS)
                    .filter(|&&c| c >= 0.0)
                    .map(|&c| c as u64),
            })
            .collect();
        let mut total = mine;
        if let Some((first, rest)) = per_process.split_first() {
            total = first.totals;
            for p in rest {
                total.add(&p.totals);
            }
        }
        Ok(Some(Report {
            total,
            mem_cap_bytes: per_process.iter().filter_map(|p| p.mem_cap_bytes).max(),
            per_process,
        }))
    }
}

/// This process's largest resident set so far (`VmHWM` in
/// `/proc/self/status`), in bytes; 0 when it cannot be read.
fn peak_resident() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// A job's memory and traffic: one process's, or every process's added up
/// (the largest peak and wall time). Flattened into each job's statistics.
#[derive(Serialize, Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    /// Executors written or dropped to make room.
    pub evictions: u64,
    /// Of those, evicted in the allocation trap.
    pub trap_evictions: u64,
    /// Of those, dropped with no write (a valid spill file or lineage).
    pub clean_evictions: u64,
    /// Executors loaded back.
    pub loads: u64,
    /// Loads done ahead of their task.
    pub prefetch_hits: u64,
    /// Bytes written to spill files.
    pub bytes_written: u64,
    /// Bytes read: spill files and input files together.
    pub bytes_read: u64,
    /// Of those, from input files (executors built and rebuilt from them).
    pub input_bytes_read: u64,
    /// The most memory accounted at once.
    pub peak_bytes: u64,
    /// The process's largest resident set so far (`VmHWM`, what `top`
    /// showed at its highest), in bytes; 0 where `/proc` does not say.
    pub peak_resident_bytes: u64,
    /// Seconds from the session's start.
    pub wall_seconds: f64,
    /// Bytes of evicted executors sent to lenders' memory (`outcore
    /// lend`; the runtime's spill tier).
    pub remote_bytes_sent: u64,
    /// Bytes of executors loaded back from lenders' memory.
    pub remote_bytes_loaded: u64,
    /// Times a lender failed a load or a put (gone, or it no longer held
    /// the image): the executor was read from the disk or its input
    /// instead.
    pub remote_fallbacks: u64,
    /// The most bytes of other ranks' evicted executors kept at once in
    /// the memory this rank's work left (in the totals, the largest).
    pub remote_bytes_kept: u64,
    /// Of those, bytes given back because this rank's own work needed
    /// the room.
    pub remote_bytes_given_back: u64,
}

impl Totals {
    /// Number of figures in a row of [`Totals::to_row`].
    const FIELDS: usize = 16;

    fn to_row(self) -> Vec<f64> {
        vec![
            self.evictions as f64,
            self.trap_evictions as f64,
            self.clean_evictions as f64,
            self.loads as f64,
            self.prefetch_hits as f64,
            self.bytes_written as f64,
            self.bytes_read as f64,
            self.input_bytes_read as f64,
            self.peak_bytes as f64,
            self.peak_resident_bytes as f64,
            self.wall_seconds,
            self.remote_bytes_sent as f64,
            self.remote_bytes_loaded as f64,
            self.remote_fallbacks as f64,
            self.remote_bytes_kept as f64,
            self.remote_bytes_given_back as f64,
        ]
    }

    fn from_row(r: &[f64]) -> Totals {
        let at = |i: usize| r.get(i).copied().unwrap_or_default();
        Totals {
            evictions: at(0) as u64,
            trap_evictions: at(1) as u64,
            clean_evictions: at(2) as u64,
            loads: at(3) as u64,
            prefetch_hits: at(4) as u64,
            bytes_written: at(5) as u64,
            bytes_read: at(6) as u64,
            input_bytes_read: at(7) as u64,
            peak_bytes: at(8) as u64,
            peak_resident_bytes: at(9) as u64,
            wall_seconds: at(10),
            remote_bytes_sent: at(11) as u64,
            remote_bytes_loaded: at(12) as u64,
            remote_fallbacks: at(13) as u64,
            remote_bytes_kept: at(14) as u64,
            remote_bytes_given_back: at(15) as u64,
        }
    }

    /// Adds `o`'s counters; keeps the larger peak and wall time.
    fn add(&mut self, o: &Totals) {
        self.evictions += o.evictions;
        self.trap_evictions += o.trap_evictions;
        self.clean_evictions += o.clean_evictions;
        self.loads += o.loads;
        self.prefetch_hits += o.prefetch_hits;
        self.bytes_written += o.bytes_written;
        self.bytes_read += o.bytes_read;
        self.input_bytes_read += o.input_bytes_read;
        self.peak_bytes = self.peak_bytes.max(o.peak_bytes);
        self.peak_resident_bytes = self.peak_resident_bytes.max(o.peak_resident_bytes);
        self.wall_seconds = self.wall_seconds.max(o.wall_seconds);
        self.remote_bytes_sent += o.remote_bytes_sent;
        self.remote_bytes_loaded += o.remote_bytes_loaded;
        self.remote_fallbacks += o.remote_fallbacks;
        self.remote_bytes_kept = self.remote_bytes_kept.max(o.remote_bytes_kept);
        self.remote_bytes_given_back += o.remote_bytes_given_back;
    }
}

/// One process's figures in a [`Report`].
#[derive(Serialize, Debug, Clone, Copy)]
pub struct ProcessTotals {
    /// The MPI rank (0 on one process).
    pub rank: usize,
    /// Its totals.
    #[serde(flatten)]
    pub totals: Totals,
    /// Its cap, if any.
    pub mem_cap_bytes: Option<u64>,
}

/// Every process's totals at the end of a job, on rank 0.
#[derive(Debug, Clone)]
pub struct Report {
    /// All processes added up: counters summed, the largest peak and wall
    /// time.
    pub total: Totals,
    /// The largest cap of any process.
    pub mem_cap_bytes: Option<u64>,
    /// Each process's, in rank order.
    pub per_process: Vec<ProcessTotals>,
}

impl Report {
    /// The cap, as the last line says it: "cap 1.0 GiB", "no cap", or
    /// with ranks given different caps, "caps 12.0 MiB to 256.0 MiB".
    pub fn cap_phrase(&self) -> String {
        let caps = self.per_process.iter().map(|p| p.mem_cap_bytes);
        let (lo, hi) = (caps.clone().min().flatten(), caps.max().flatten());
        match (lo, hi) {
            (_, None) => "no cap".into(),
            (Some(lo), Some(hi)) if lo == hi => format!("cap {}", outcore::format_bytes(hi)),
            (lo, Some(hi)) => format!(
                "caps {} to {}",
                lo.map_or("none".into(), outcore::format_bytes),
                outcore::format_bytes(hi)
            ),
        }
    }

    /// The session's half of a run's statistics, with this process's
    /// counters `stats` (those of this report) and the job's `growth`.
    pub fn figures<'a>(
        &'a self,
        session: &Session,
        stats: &'a Stats,
        growth: &'a [Growth],
    ) -> SessionFigures<'a> {
        let rt = session.runtime();
        SessionFigures {
            totals: self.total,
            mem_cap_bytes: self.mem_cap_bytes,
            policy: rt.policy().to_string(),
            workers: rt.workers(),
            runtime: stats,
            processes: session.ranks().size(),
            ranks: session.ranks().size(),
            growth,
            lenders: session.ranks().lenders(),
            per_process: &self.per_process,
        }
    }
}

/// The session's half of a run's statistics, the same for every job:
/// every process's totals, the cap, the workers and the ranks.
#[derive(Serialize, Debug, Clone)]
pub struct SessionFigures<'a> {
    /// Every process's added up.
    #[serde(flatten)]
    pub totals: Totals,
    /// Per process (the largest, under MPI).
    pub mem_cap_bytes: Option<u64>,
    /// The eviction policy.
    pub policy: String,
    /// Worker threads per process.
    pub workers: usize,
    /// Rank 0's runtime counters.
    pub runtime: &'a Stats,
    /// MPI processes; the counters above are their totals, `peak_bytes`
    /// and `wall_seconds` the largest.
    pub processes: usize,
    /// The same: the ranks the job ended on.
    pub ranks: usize,
    /// The job's growths onto more ranks (`--max-ranks`).
    pub growth: &'a [Growth],
    /// Processes lending their memory beside the ranks (`outcore lend`).
    pub lenders: usize,
    /// Each process's totals, in rank order.
    pub per_process: &'a [ProcessTotals],
}

/// A run's statistics, as `--stats` writes them and Python's `stats_`
/// holds them: the job's own figures and the session's, in one object.
/// The one statistics type of every job.
#[derive(Serialize, Debug, Clone)]
pub struct RunFigures<'a, J: Serialize> {
    /// The job's figures (a struct or a JSON object), flattened.
    #[serde(flatten)]
    pub job: &'a J,
    /// The session's, flattened.
    #[serde(flatten)]
    pub session: SessionFigures<'a>,
}

impl<J: Serialize> RunFigures<'_, J> {
    /// As a JSON value.
    pub fn to_json(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self)
            .map_err(|e| Error::Input(format!("internal: the statistics: {e}")))
    }
}

/// One growth of the job onto more ranks (`--max-ranks`, see
/// [`grow`](crate::grow)), for its statistics.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Growth {
    /// The epoch (or iteration) the new ranks first take part in.
    pub epoch: usize,
    /// Ranks before.
    pub from: usize,
    /// Ranks after.
    pub to: usize,
    /// Seconds the growth took: spawning, merging and loading the shards
    /// again.
    pub seconds: f64,
}
