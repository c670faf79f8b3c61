//! The settings every estimator shares (cap, spill directory, workers,
//! progress, timeline), the session built from them, and a job run on a
//! thread of its own while the caller's thread, without the GIL, waits
//! and polls for signals: Ctrl-C interrupts the runtime and raises
//! `KeyboardInterrupt` once the job has stopped. The runtime then ends
//! (its spill directory removed) on a thread of its own ([`Engine`]).
//!
//! One engine runs at a time in a process: the allocator counts the bytes
//! of the whole process against each runtime's cap, and the smallest cap
//! of the runtimes alive is the one its trap enforces, so a small fit
//! beside a large one would evict (its own executors and the large one's)
//! for the large one's memory. A call waits, without the GIL and
//! answering Ctrl-C, until the engine before it has ended; so do the
//! interpreter's exit and `fork` ([`finish`]).

use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use outcore::{MemoryCap, Runtime};
use outcore_jobs::grow::MaxRanks;
use outcore_jobs::{RunFigures, Session, Workers};
use pyo3::exceptions::{PyRuntimeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;

/// Whether an engine (a runtime) is alive in this process, and the
/// wake-up of the calls waiting for their turn.
static BUSY: Mutex<bool> = Mutex::new(false);
static FREED: Condvar = Condvar::new();

/// This process's turn to run an engine, given back when dropped.
pub(crate) struct Turn(());

impl Drop for Turn {
    fn drop(&mut self) {
        // The flag guards no other data: a poisoned lock is still good.
        *BUSY.lock().unwrap_or_else(|p| p.into_inner()) = false;
        FREED.notify_all();
    }
}

/// A session and this process's turn to run an engine. Dropped, it ends on
/// a thread of its own: the runtime's end (its workers joined, its spill
/// directory removed: 1-3 ms) does not hold up the call that used it, and
/// the turn passes on once it is over, so the next call still waits for
/// it, and so does the interpreter's exit ([`finish`], run at exit).
pub(crate) struct Engine {
    session: ManuallyDrop<Session>,
    turn: ManuallyDrop<Turn>,
    /// How far the fit may grow onto free MPI slots (`max_ranks`), if at
    /// all: [`MaxRanks::Fixed`] for a script's later fits.
    pub(crate) grow: Option<MaxRanks>,
}

impl Deref for Engine {
    type Target = Session;

    fn deref(&self) -> &Session {
        &self.session
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: both fields are taken here, once, and never used again
        // (this is the last use of `self`).
        let (session, turn) = unsafe {
            (
                ManuallyDrop::take(&mut self.session),
                ManuallyDrop::take(&mut self.turn),
            )
        };
        let end = move || {
            drop(session);
            drop(turn);
        };
        // Where no thread can start, `spawn` drops the closure, and with it
        // the session and the turn, here.
        let _ = std::thread::Builder::new()
            .name("outcore-end".into())
            .spawn(end);
    }
}

/// Waits, without the GIL and checking for signals every 10 ms, until no
/// other engine is alive in this process.
fn take_turn(py: Python<'_>, settings: &Settings) -> PyResult<Turn> {
    let mut said = false;
    loop {
        let got = py.detach(|| {
            let mut busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
            if *busy {
                busy = FREED
                    .wait_timeout(busy, Duration::from_millis(10))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            !std::mem::replace(&mut *busy, true)
        });
        if got {
            return Ok(Turn(()));
        }
        if !said {
            settings.say(|| "waiting for another fit in this process to finish".into());
            said = true;
        }
        py.check_signals()?;
    }
}

/// Waits, without the GIL, until the engine alive in this process (if
/// any) has ended: its spill directory is removed. Registered to run at
/// the interpreter's exit.
#[pyfunction]
pub(crate) fn finish(py: Python<'_>) {
    py.detach(|| {
        let mut busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
        while *busy {
            busy = FREED.wait(busy).unwrap_or_else(|p| p.into_inner());
        }
    });
}

/// The estimators' engine settings (`mem_cap`, `spill_dir`, `n_jobs`,
/// `verbose`, `timeline`), checked.
#[pyclass(frozen, module = "outcore._core")]
pub(crate) struct Settings {
    cap: MemoryCap,
    spill_dir: Option<PathBuf>,
    workers: Option<usize>,
    pub(crate) verbose: u32,
    timeline: Option<PathBuf>,
    max_ranks: Option<MaxRanks>,
}

#[pymethods]
impl Settings {
    /// `mem_cap`: `None` (no cap), `"auto"`, or a size (`"512MiB"`, or
    /// bytes as a string); `workers`: `None` for one per core;
    /// `max_ranks`: `None`, `"auto"` or a number as a string.
    #[new]
    #[pyo3(signature = (mem_cap=None, spill_dir=None, workers=None, verbose=0, timeline=None, max_ranks=None))]
    fn new(
        mem_cap: Option<&str>,
        spill_dir: Option<PathBuf>,
        workers: Option<usize>,
        verbose: u32,
        timeline: Option<PathBuf>,
        max_ranks: Option<&str>,
    ) -> PyResult<Settings> {
        let max_ranks = max_ranks
            .map(str::parse::<MaxRanks>)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("max_ranks: {e}")))?;
        let cap = match mem_cap {
            None => MemoryCap::None,
            Some(s) => {
                MemoryCap::parse(s).map_err(|e| PyValueError::new_err(format!("mem_cap: {e}")))?
            }
        };
        if workers == Some(0) || workers.is_some_and(|w| w > outcore::MAX_WORKERS) {
            return Err(PyValueError::new_err(format!(
                "n_jobs must be between 1 and {} workers",
                outcore::MAX_WORKERS
            )));
        }
        Ok(Settings {
            cap,
            spill_dir,
            workers,
            verbose,
            timeline,
            max_ranks,
        })
    }
}

impl Settings {
    /// A session under these settings, once no other is alive in this
    /// process (see the module's doc), and the size of its executors.
    /// `workers` plans the worker threads from the cap, the executor size
    /// and the workers asked for (`n_jobs`, or one per core): when the cap
    /// holds fewer, fewer start, with a `UserWarning` that says so.
    pub(crate) fn session(
        &self,
        py: Python<'_>,
        workers: impl FnOnce(Option<u64>, u64, usize) -> Workers,
    ) -> PyResult<(Engine, u64)> {
        let ranks = crate::ranks::ranks(py)?;
        // The ranks a growth spawns run the script from its start and
        // meet the growth at their first fit: only the first fit grows.
        let grow = match (self.max_ranks, crate::ranks::count_fit()) {
            (Some(m), 0) => Some(m),
            (Some(_), _) => Some(MaxRanks::Fixed),
            (None, _) => None,
        };
        let mut mem_cap = self.cap;
        // `auto` on a node shared with other ranks: its share of the node
        // (as the command line).
        if mem_cap == MemoryCap::Auto && ranks.on_node() > 1 {
            if let Some(b) = mem_cap.resolve_shared(ranks.on_node()) {
                mem_cap = MemoryCap::Bytes(b);
            }
        }
        let cap = mem_cap.resolve();
        // The command line's partitions.
        let part_bytes = outcore_jobs::partition_bytes(cap, 1 << 20);
        let wanted = self.workers();
        let planned = workers(cap, part_bytes, wanted);
        planned.check_descriptors().map_err(crate::to_py)?;
        if let Some(w) = planned.warning() {
            let line = w.trim_start_matches("outcore: warning: ");
            PyErr::warn(py, &py.get_type::<PyUserWarning>(), &CString::new(line)?, 1)?;
        }
        let turn = take_turn(py, self)?;
        let mut b = Runtime::builder().mem_cap(mem_cap).workers(planned.run);
        if let Some(d) = &self.spill_dir {
            b = b.spill_dir(d);
        }
        // Lenders beside the ranks (`python -m outcore.lend`): evictions
        // go to their memory before the disk, unless
        // OUTCORE_REMOTE_MEMORY=off.
        #[cfg(feature = "mpi")]
        if let Some(t) = ranks
            .remote_tier()
            .filter(|_| crate::ranks::remote_memory_on())
        {
            b = b.spill_tier(t);
        }
        // What this rank lends to the others is given back before its
        // own executors are evicted.
        #[cfg(feature = "mpi")]
        if let Some(held) = cap.and_then(|c| ranks.share(c)) {
            b = b.reclaim(held);
        }
        let rt = b.build().map_err(|e| crate::to_py(e.into()))?;
        if cap.is_some() && rt.spill_dir_in_memory() {
            let dir = rt.spill_dir().parent().unwrap_or(rt.spill_dir());
            let line = format!(
                "the spill directory {} is in memory (tmpfs): what is evicted stays in memory \
                 or swap, and counts against a container's memory limit (give a directory on \
                 a disk as spill_dir)",
                dir.display()
            );
            PyErr::warn(py, &py.get_type::<PyUserWarning>(), &CString::new(line)?, 1)?;
        }
        let mut session = Session::on(rt, ranks);
        if let Some(p) = &self.timeline {
            session.record_timeline(p, "load").map_err(crate::to_py)?;
        }
        Ok((
            Engine {
                session: ManuallyDrop::new(session),
                turn: ManuallyDrop::new(turn),
                grow,
            },
            part_bytes,
        ))
    }

    /// The workers asked for (`n_jobs`), or one per core.
    pub(crate) fn workers(&self) -> usize {
        self.workers.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(outcore::MAX_WORKERS)
        })
    }

    /// What a pass outside the engine (see `apply.rs`) may hold: a quarter
    /// of the cap, when there is one.
    pub(crate) fn pass_budget(&self) -> Option<u64> {
        self.cap.resolve().map(|c| c / 4)
    }

    /// A progress line on Python's `sys.stderr`, when `verbose` (on MPI
    /// ranks, rank 0's only).
    pub(crate) fn say(&self, line: impl FnOnce() -> String) {
        if self.verbose > 0 && crate::ranks::is_root() {
            write_stderr(&format!("outcore: {}\n", line()));
        }
    }
}

/// `text` on Python's `sys.stderr`, which `contextlib.redirect_stderr`
/// and notebooks capture (a write to file descriptor 2 escapes both), or
/// on descriptor 2 where that fails. From any thread: it takes the GIL.
pub(crate) fn write_stderr(text: &str) {
    let written = Python::attach(|py| -> PyResult<()> {
        let err = py.import("sys")?.getattr("stderr")?;
        err.call_method1("write", (text,))?;
        err.call_method0("flush")?;
        Ok(())
    });
    if written.is_err() {
        eprint!("{text}");
    }
}

/// Runs `job` on a thread of its own while this one waits without the GIL,
/// checking for signals every 50 ms; it returns as soon as the job ends
/// (a small job costs no polling period). A signal (Ctrl-C) interrupts the
/// runtime; once the job has returned, its exception (`KeyboardInterrupt`)
/// is raised.
///
/// On MPI ranks, an error names the rank; one that some ranks meet and
/// others do not leaves the ranks out of step (see `ranks.rs`).
pub(crate) fn run_job<T: Send>(
    py: Python<'_>,
    session: &Session,
    job: impl FnOnce() -> outcore_jobs::Result<T> + Send,
) -> PyResult<T> {
    let stop = session.runtime().interrupter();
    let ranks = session.ranks();
    let out = run_interruptible(py, job, || stop.interrupt());
    if ranks.size() == 1 {
        return out;
    }
    out.map_err(|e| {
        let every_rank = py.detach(|| crate::ranks::failed(ranks));
        let alone = match every_rank {
            true => "",
            false => " (the other ranks wait for this one: its exit ends them)",
        };
        let (r, n) = (ranks.rank(), ranks.size());
        let line = format!("rank {r} of {n}: {}{alone}", e.value(py));
        PyErr::from_type(e.get_type(py), line)
    })
}

/// [`run_job`] for work outside a session: `interrupt` is called once on
/// a signal, and the work must then end soon.
pub(crate) fn run_interruptible<T: Send>(
    py: Python<'_>,
    job: impl FnOnce() -> outcore_jobs::Result<T> + Send,
    interrupt: impl Fn(),
) -> PyResult<T> {
    let ended = Ended::default();
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            // Set however the job ends, a panic included.
            let _ended = ended.on_drop();
            job()
        });
        let mut signal = None;
        while !py.detach(|| ended.wait(Duration::from_millis(50))) {
            if signal.is_none() {
                if let Err(e) = py.check_signals() {
                    interrupt();
                    signal = Some(e);
                }
            }
        }
        let out = h.join();
        match (signal, out) {
            (Some(e), _) => Err(e),
            (None, Ok(r)) => r.map_err(crate::to_py),
            (None, Err(_)) => Err(PyRuntimeError::new_err(
                "the job panicked (a bug in outcore: please report it)",
            )),
        }
    })
}

/// Whether a job's thread is done, and a wake-up for the thread waiting
/// for it.
#[derive(Default)]
struct Ended {
    done: Mutex<bool>,
    woken: Condvar,
}

/// Marks the job done when dropped.
struct OnDrop<'a>(&'a Ended);

impl Drop for OnDrop<'_> {
    fn drop(&mut self) {
        *self.0.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.0.woken.notify_all();
    }
}

impl Ended {
    fn on_drop(&self) -> OnDrop<'_> {
        OnDrop(self)
    }

    /// Whether the job is done, waiting up to `at_most` for it.
    fn wait(&self, at_most: Duration) -> bool {
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let (done, _) = self
            .woken
            .wait_timeout_while(done, at_most, |d| !*d)
            .unwrap_or_else(|p| p.into_inner());
        *done
    }
}

/// Returns the memory jemalloc keeps freed to the system now (all arenas,
/// and this thread's cache), so that a pass leaves the process's resident
/// set as it found it.
pub(crate) fn release_memory() {
    // SAFETY: NUL-terminated names of controls that take and give nothing
    // (null pointers and zero lengths are what they expect).
    unsafe {
        for name in [c"thread.tcache.flush", c"arena.4096.purge"] {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
        }
    }
}

/// `bytes` as `f32`s (little-endian, as numpy's `float32` here).
pub(crate) fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `v`'s bytes (little-endian).
pub(crate) fn le_bytes<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|x| f(*x)).collect()
}

/// `v` (a JSON object of a job's figures) with the session's, in the
/// statistics type of every job (the command line's `--stats`): the cap,
/// the workers, the runtime's counters and the totals (evictions, loads,
/// bytes, peaks, seconds), as JSON text. On MPI ranks, every rank's
/// totals added up, the same text on every rank. Collective.
pub(crate) fn session_figures(
    session: &Session,
    v: serde_json::Value,
    growth: &[outcore_jobs::grow::Growth],
) -> String {
    let stats = session.runtime().stats();
    let text = match session.report_at(&stats) {
        Ok(Some(report)) => {
            let figures = RunFigures {
                job: &v,
                session: report.figures(session, &stats, growth),
            };
            figures.to_json().unwrap_or(v).to_string()
        }
        _ => v.to_string(),
    };
    from_root(session, text)
}

/// A job's lines for the user: its warnings (`outcore: warning: ...`) as
/// `UserWarning`s, the others with `verbose`.
pub(crate) fn tell(py: Python<'_>, settings: &Settings, lines: &[String]) -> PyResult<()> {
    for line in lines {
        match line.strip_prefix("outcore: warning: ") {
            Some(w) => {
                PyErr::warn(py, &py.get_type::<PyUserWarning>(), &CString::new(w)?, 1)?;
            }
            None => settings.say(|| line.clone()),
        }
    }
    Ok(())
}

/// Rank 0's `text` on every rank (a report rank 0 made): every rank ends a
/// fit with the same attributes. Collective.
pub(crate) fn from_root(session: &Session, text: String) -> String {
    if session.ranks().size() == 1 {
        return text;
    }
    let mut bytes = text.into_bytes();
    session.ranks().broadcast_bytes(&mut bytes);
    String::from_utf8(bytes).unwrap_or_default()
}
