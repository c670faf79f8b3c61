//! A memory timeline: a CSV of the process's memory and the runtime's
//! traffic, sampled by a thread of its own while a job runs.
//!
//! One row per sample (every 50 ms by default, plus one at the start, one
//! when each phase begins, however short, and one at the end):
//!
//! ```text
//! time_s,accounted_bytes,rss_bytes,cap_bytes,resident_executors,evictions,loads,bytes_read,bytes_written,ranks,remote_bytes_sent,remote_bytes_loaded,phase
//! 0.000,1187840,6901760,268435456,0,0,0,0,0,1,0,0,load
//! 0.050,98566144,104407040,268435456,12,0,12,96468992,0,1,0,0,init
//! ```
//!
//! - `accounted_bytes`: what the allocator counts against the cap (the
//!   runtime's `current_bytes`), `rss_bytes`: the resident set from
//!   `/proc/self/statm`, `cap_bytes`: the soft cap (empty without one);
//! - `resident_executors`: executors in memory;
//! - `evictions`, `loads`, `bytes_read` (spill files and input files read
//!   again), `bytes_written` (spill files): running totals;
//! - `ranks`: the MPI ranks the job runs on (1 on one process; it
//!   changes when the job grows, see [`Timeline::set_ranks`]);
//! - `remote_bytes_sent`, `remote_bytes_loaded`: running totals of the
//!   bytes put into lenders' memory and loaded back from it (`outcore
//!   lend`; the runtime's spill tier);
//! - `phase`: what the job is doing (`load`, `init`, `epoch 3`, ...), as
//!   set by [`Timeline::phase`].
//!
//! The file (`-`: standard output) is written as the run goes (each row
//! is flushed), so it shows the memory up to a failure too. The sampler reads atomic counters and
//! scans the executor registry once per sample; it allocates a few hundred
//! bytes per sample, from a buffer it reuses.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use outcore::{Monitor, Runtime, Stats};

use crate::error::{Error, Result};
use crate::input::InputReads;

/// The CSV header line.
pub const HEADER: &str = "time_s,accounted_bytes,rss_bytes,cap_bytes,resident_executors,evictions,loads,bytes_read,bytes_written,ranks,remote_bytes_sent,remote_bytes_loaded,phase";

/// The header of timelines written before the lenders' columns (read as
/// no traffic to lenders).
const HEADER_BEFORE_REMOTE: &str = "time_s,accounted_bytes,rss_bytes,cap_bytes,resident_executors,evictions,loads,bytes_read,bytes_written,ranks,phase";

/// The header of timelines written before the `ranks` column (read as one
/// rank).
const HEADER_BEFORE_RANKS: &str = "time_s,accounted_bytes,rss_bytes,cap_bytes,resident_executors,evictions,loads,bytes_read,bytes_written,phase";

/// The default sampling period.
pub const PERIOD: Duration = Duration::from_millis(50);

/// State shared with the sampler thread.
#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    wake: Condvar,
    /// Input reads to add to `bytes_read` (executors rebuilt from their
    /// input file), once the data is loaded.
    inputs: Mutex<Vec<InputReads>>,
    /// Samples written.
    rows: AtomicU64,
    /// The `ranks` column (0 is read as 1).
    ranks: AtomicU64,
}

/// The phase and the sampler's orders.
#[derive(Debug, Default)]
struct State {
    /// The current phase.
    phase: String,
    /// Phases entered since the last row, each to get a row of its own
    /// even when it ends before the next tick.
    entered: Vec<String>,
    /// Whether the sampler must stop.
    stop: bool,
    /// The counters the last row shows, when given (see
    /// [`Timeline::finish_at`]).
    last: Option<Stats>,
}

/// A running timeline; see the module documentation.
#[derive(Debug)]
pub struct Timeline {
    inner: Arc<Inner>,
    path: PathBuf,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Timeline {
    /// Creates (or truncates) `path` (`-`: standard output) and starts
    /// sampling `rt` every `period`, in phase `phase`.
    pub fn start(rt: &Runtime, path: &Path, period: Duration, phase: &str) -> Result<Timeline> {
        let file: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(std::io::stdout())
        } else {
            Box::new(File::create(path).map_err(|e| Error::io(path, "cannot create", e))?)
        };
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                phase: phase.to_string(),
                ..State::default()
            }),
            ..Inner::default()
        });
        let mut sampler = Sampler {
            inner: inner.clone(),
            monitor: rt.monitor(),
            cap: rt.cap(),
            out: BufWriter::new(file),
            statm: File::open("/proc/self/statm").ok(),
            page: page_size(),
            start: Instant::now(),
            line: String::with_capacity(256),
        };
        // The header and the first sample, here: the first phase is in
        // the file however late the thread starts.
        let io = |e| Error::io(path, "cannot write", e);
        writeln!(sampler.out, "{HEADER}").map_err(io)?;
        sampler.sample(phase, None).map_err(io)?;
        let thread = std::thread::Builder::new()
            .name("outcore-timeline".into())
            .spawn(move || sampler.run(period))
            .map_err(|e| Error::io(path, "cannot start the sampler thread", e))?;
        Ok(Timeline {
            inner,
            path: path.to_path_buf(),
            thread: Some(thread),
        })
    }

    /// Sets the phase, and has a row written for it at once: every
    /// phase is in the file, however short.
    pub fn phase(&self, name: &str) {
        if let Ok(mut s) = self.inner.state.lock() {
            s.phase.clear();
            s.phase.push_str(name);
            s.entered.push(name.to_string());
        }
        self.inner.wake.notify_all();
    }

    /// Sets the `ranks` column from now on (the job grew), with a row at
    /// once.
    pub fn set_ranks(&self, ranks: usize) {
        self.inner.ranks.store(ranks as u64, Ordering::Relaxed);
        if let Ok(mut st) = self.inner.state.lock() {
            let phase = st.phase.clone();
            st.entered.push(phase);
        }
        self.inner.wake.notify_all();
    }

    /// Adds an input file's reads to the `bytes_read` column.
    pub fn add_reads(&self, reads: InputReads) {
        if let Ok(mut v) = self.inner.inputs.lock() {
            v.push(reads);
        }
    }

    /// Writes a last sample, stops the sampler and closes the file; the
    /// number of samples written.
    pub fn finish(mut self) -> Result<u64> {
        self.stop()?;
        Ok(self.inner.rows.load(Ordering::Relaxed))
    }

    /// [`Timeline::finish`], with the last row showing `stats`: the
    /// totals a run reports, so that the two agree even while the runtime
    /// still works in the background (a prefetch finishing).
    pub fn finish_at(self, stats: &Stats) -> Result<u64> {
        if let Ok(mut s) = self.inner.state.lock() {
            s.last = Some(stats.clone());
        }
        self.finish()
    }

    fn stop(&mut self) -> Result<()> {
        if let Ok(mut s) = self.inner.state.lock() {
            s.stop = true;
        }
        self.inner.wake.notify_all();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Err(e))) => Err(Error::io(&self.path, "cannot write", e)),
            Some(Err(_)) => Err(Error::Output {
                path: self.path.clone(),
                reason: "the sampler thread panicked".into(),
            }),
            _ => Ok(()),
        }
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        // A run that failed still leaves its timeline up to the failure.
        let _ = self.stop();
    }
}

struct Sampler {
    inner: Arc<Inner>,
    monitor: Monitor,
    cap: Option<u64>,
    out: BufWriter<Box<dyn Write + Send>>,
    statm: Option<File>,
    page: u64,
    start: Instant,
    line: String,
}

impl Sampler {
    fn run(mut self, period: Duration) -> std::io::Result<()> {
        let mut next = self.start;
        loop {
            next += period;
            let now = Instant::now();
            if next < now {
                // Fell behind (a stalled machine): skip the missed ticks.
                next = now;
            }
            let (entered, phase, stop, last) = {
                let inner = &self.inner;
                let guard = inner
                    .state
                    .lock()
                    .map_err(|_| std::io::Error::other("poisoned"))?;
                let (mut s, _) = inner
                    .wake
                    .wait_timeout_while(guard, next - now, |s| !s.stop && s.entered.is_empty())
                    .map_err(|_| std::io::Error::other("poisoned"))?;
                let last = if s.stop { s.last.take() } else { None };
                (
                    std::mem::take(&mut s.entered),
                    s.phase.clone(),
                    s.stop,
                    last,
                )
            };
            let mut alive = true;
            for p in &entered {
                alive = alive && self.sample(p, None)?;
            }
            if entered.is_empty() || stop {
                alive = alive && self.sample(&phase, last.as_ref())?;
            }
            if stop || !alive {
                return self.out.flush();
            }
            if !entered.is_empty() {
                // A row at a phase's start does not move the ticks.
                next -= period;
            }
        }
    }

    /// Writes one row, in phase `phase`, with the counters `given` or read
    /// now; false when the runtime is gone (nothing is written then, nor
    /// from then on).
    fn sample(&mut self, phase: &str, given: Option<&Stats>) -> std::io::Result<bool> {
        use std::fmt::Write as _;
        let t = self.start.elapsed().as_secs_f64();
        let Some(s) = given.cloned().or_else(|| self.monitor.stats()) else {
            return Ok(false);
        };
        let resident = self.monitor.resident_count().unwrap_or(0);
        let rss = self.rss();
        let input: u64 = self
            .inner
            .inputs
            .lock()
            .map(|v| v.iter().map(InputReads::bytes).sum())
            .unwrap_or(0);
        self.line.clear();
        let _ = write!(
            self.line,
            "{t:.3},{},{},{},{resident},{},{},{},{},{},{},{},{}",
            s.current_bytes,
            rss,
            self.cap.map_or(String::new(), |c| c.to_string()),
            s.evictions,
            s.loads,
            s.bytes_read + input,
            s.bytes_written,
            self.inner.ranks.load(Ordering::Relaxed).max(1),
            s.tier_bytes_sent,
            s.tier_bytes_loaded,
            csv_field(phase),
        );
        writeln!(self.out, "{}", self.line)?;
        self.out.flush()?;
        self.inner.rows.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// The resident set size in bytes (0 where `/proc` is missing).
    fn rss(&mut self) -> u64 {
        let Some(f) = &mut self.statm else { return 0 };
        let mut buf = [0u8; 128];
        let n = f
            .seek(SeekFrom::Start(0))
            .and_then(|_| f.read(&mut buf))
            .unwrap_or(0);
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |pages| pages * self.page)
    }
}

/// `s` as a CSV field (quoted when it holds a comma or a quote).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 on error.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096)
}

/// One row of a timeline file, as read back (by `outcore plot` and tests).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Seconds since the start.
    pub time_s: f64,
    /// Bytes accounted against the cap.
    pub accounted_bytes: u64,
    /// Resident set size.
    pub rss_bytes: u64,
    /// The cap, if any.
    pub cap_bytes: Option<u64>,
    /// Executors in memory.
    pub resident_executors: u64,
    /// Evictions so far.
    pub evictions: u64,
    /// Loads so far.
    pub loads: u64,
    /// Bytes read so far.
    pub bytes_read: u64,
    /// Bytes written so far.
    pub bytes_written: u64,
    /// The MPI ranks the job ran on (1 in files written before the
    /// column).
    pub ranks: u64,
    /// Bytes put into lenders' memory so far (0 in files written before
    /// the column).
    pub remote_bytes_sent: u64,
    /// Bytes loaded back from lenders' memory so far (the same).
    pub remote_bytes_loaded: u64,
    /// The phase.
    pub phase: String,
}

/// Reads a timeline file.
pub fn read(path: &Path) -> Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "cannot read", e))?;
    let bad = |line: usize, why: &str| {
        Error::Input(format!(
            "{}: line {line}: {why} (not an outcore timeline?)",
            path.display()
        ))
    };
    let mut lines = text.lines();
    // The columns after `bytes_written` before the phase: none, the
    // ranks, or the ranks and the lenders' two.
    let extra = match lines.next().map(str::trim) {
        Some(HEADER) => 3,
        Some(HEADER_BEFORE_REMOTE) => 1,
        Some(HEADER_BEFORE_RANKS) => 0,
        _ => return Err(bad(1, "unexpected header")),
    };
    let mut out = Vec::new();
    for (i, l) in lines.enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let mut f = l.splitn(10 + extra, ',');
        let mut next = || f.next().unwrap_or("");
        let num = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| bad(i + 2, "bad number"))
        };
        let time_s = next()
            .trim()
            .parse::<f64>()
            .map_err(|_| bad(i + 2, "bad time"))?;
        let accounted_bytes = num(next())?;
        let rss_bytes = num(next())?;
        let cap = next();
        let cap_bytes = if cap.trim().is_empty() {
            None
        } else {
            Some(num(cap)?)
        };
        let resident_executors = num(next())?;
        let evictions = num(next())?;
        let loads = num(next())?;
        let bytes_read = num(next())?;
        let bytes_written = num(next())?;
        let ranks = if extra >= 1 { num(next())? } else { 1 };
        let (remote_bytes_sent, remote_bytes_loaded) = if extra >= 3 {
            (num(next())?, num(next())?)
        } else {
            (0, 0)
        };
        let phase = next().trim();
        let phase = phase
            .strip_prefix('"')
            .and_then(|p| p.strip_suffix('"'))
            .map_or_else(|| phase.to_string(), |p| p.replace("\"\"", "\""));
        out.push(Sample {
            time_s,
            accounted_bytes,
            rss_bytes,
            cap_bytes,
            resident_executors,
            evictions,
            loads,
            bytes_read,
            bytes_written,
            ranks,
            remote_bytes_sent,
            remote_bytes_loaded,
            phase,
        });
    }
    if out.is_empty() {
        return Err(bad(2, "no samples"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of every version read back: the columns a version lacks as
    /// one rank and no traffic to lenders.
    #[test]
    fn every_version_of_the_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let rows = [
            (
                HEADER_BEFORE_RANKS,
                "0.050,10,20,30,1,2,3,4,5,\"epoch 1, a\"",
                (1, 0, 0),
            ),
            (
                HEADER_BEFORE_REMOTE,
                "0.050,10,20,30,1,2,3,4,5,2,epoch 1",
                (2, 0, 0),
            ),
            (
                HEADER,
                "0.050,10,20,30,1,2,3,4,5,2,600,700,epoch 1",
                (2, 600, 700),
            ),
        ];
        for (i, (header, row, (ranks, sent, loaded))) in rows.iter().enumerate() {
            let p = dir.path().join(format!("t{i}.csv"));
            std::fs::write(&p, format!("{header}\n{row}\n")).unwrap();
            let s = read(&p).unwrap();
            assert_eq!(s.len(), 1);
            let s = &s[0];
            assert_eq!((s.accounted_bytes, s.bytes_written), (10, 5), "{header}");
            assert_eq!(
                (s.ranks, s.remote_bytes_sent, s.remote_bytes_loaded),
                (*ranks, *sent, *loaded)
            );
            assert!(s.phase.starts_with("epoch 1"), "{}", s.phase);
        }
    }
}
