//! The processes a fit runs on: one, or, in a module built with MPI
//! (`--features mpi`) and started by an MPI launcher (`mpirun -np N
//! python script.py`), the launcher's ranks, every one running the same
//! script. Each rank reads its shards of the data; the fit's sums are
//! added in the engine's fixed order, so every rank ends with the same
//! fitted attributes, bit for bit those of one process.
//!
//! MPI is initialised at the first fit (`MPI_THREAD_SERIALIZED`), or taken
//! from mpi4py when it initialised MPI first (the same `MPI_COMM_WORLD`,
//! no second `MPI_Init`). Outcore finalises only an MPI it initialised,
//! at the interpreter's exit ([`mpi_end`]), once the last engine has
//! ended.
//!
//! A fit that fails on every rank (a check of its settings) raises its
//! exception on every rank, naming the rank. One that fails on some ranks
//! only (a NaN in one rank's rows) raises on those, naming the rank, once
//! they have waited a few seconds for the others; the others wait in the
//! fit's next exchange. The ranks are then out of step, so a later fit
//! on the failed rank is refused, and its exit ends every rank
//! (`MPI_Abort`) instead of finalising: no rank is left waiting.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use outcore_jobs::ranks::Ranks;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The ranks of this process's fits, once known (kept until the exit).
static RANKS: Mutex<Option<Ranks>> = Mutex::new(None);

/// Fits started in this process.
static FITS: AtomicUsize = AtomicUsize::new(0);

/// Counts a fit: the fits started before it.
pub(crate) fn count_fit() -> usize {
    FITS.fetch_add(1, Ordering::Relaxed)
}

/// Set when a fit failed on this rank alone: the other ranks may be
/// waiting for it in an exchange it will not make.
static OUT_OF_STEP: AtomicBool = AtomicBool::new(false);

/// Environment variables MPI launchers set in the processes they start
/// (Open MPI, PMI and PMIx: MPICH, Intel MPI, Slurm's `srun`).
const LAUNCHED: [&str; 4] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"];

/// The launcher's rank count, when an MPI launcher started this process.
fn launched_size() -> Option<usize> {
    if !LAUNCHED.iter().any(|v| std::env::var_os(v).is_some()) {
        return None;
    }
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .or(Some(1))
}

/// Whether `OUTCORE_MPI=off` (or `0`) keeps every fit in its own process
/// under a launcher (a script that splits the work among the ranks
/// itself).
fn turned_off() -> bool {
    std::env::var("OUTCORE_MPI").is_ok_and(|v| matches!(v.trim(), "off" | "0" | "no"))
}

/// The ranks a fit runs on (MPI initialised by the first call that needs
/// it). Refused once the ranks are out of step.
pub(crate) fn ranks(py: Python<'_>) -> PyResult<Ranks> {
    if OUT_OF_STEP.load(Ordering::Relaxed) {
        return Err(PyRuntimeError::new_err(
            "an earlier fit failed on this MPI rank alone: the ranks are out of step, and \
             every fit now fails (end the script; its exit ends every rank)",
        ));
    }
    let mut held = RANKS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(r) = held.as_ref() {
        return Ok(r.clone());
    }
    let r = start(py)?;
    // SIGTERM (what `mpirun` sends the other ranks when one fails, or on
    // Ctrl-C) and SIGHUP, when Python leaves them at their default, now
    // remove the spill directories before they end the process.
    outcore::remove_spill_on_signal();
    *held = Some(r.clone());
    Ok(r)
}

/// Whether evictions may go to other processes' memory, and this rank
/// lends its own (`OUTCORE_REMOTE_MEMORY` is not `off`).
#[cfg(feature = "mpi")]
pub(crate) fn remote_memory_on() -> bool {
    !std::env::var("OUTCORE_REMOTE_MEMORY").is_ok_and(|v| matches!(v.trim(), "off" | "0" | "no"))
}

/// Lends this process's memory to the ranks beside it under `mpirun`
/// (`python -m outcore.lend`), holding at most what `mem_cap` (a size or
/// `"auto"`) allows, until every rank is done; then writes one line on
/// stderr. Must come before any fit in this process.
#[cfg(feature = "mpi")]
#[pyfunction]
pub(crate) fn lend(py: Python<'_>, mem_cap: &str) -> PyResult<()> {
    let cap = outcore::MemoryCap::parse(mem_cap)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let budget = outcore_jobs::remote::lender_budget(cap).map_err(crate::to_py)?;
    if RANKS.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
        return Err(PyRuntimeError::new_err(
            "this process ran a fit under MPI already: a lender lends from its start",
        ));
    }
    if launched_size().is_none() {
        return Err(PyRuntimeError::new_err(
            "a lender runs under mpirun, beside the ranks of a job \
             (mpirun -np 2 python fit.py : -np 1 python -m outcore.lend)",
        ));
    }
    let r = Ranks::init_as(outcore_jobs::ranks::Role::Lender).map_err(crate::to_py)?;
    py.detach(move || {
        let lent = r.lend(budget);
        if let Ok(l) = &lent {
            crate::run::write_stderr(&l.line(r.rank(), budget));
        }
        // Dropped here, on the thread that initialised MPI: finalises it.
        drop(r);
        lent.map(|_| ())
    })
    .map_err(crate::to_py)
}

/// Without MPI there is nothing to lend to.
#[cfg(not(feature = "mpi"))]
#[pyfunction]
pub(crate) fn lend(_py: Python<'_>, _mem_cap: &str) -> PyResult<()> {
    Err(PyRuntimeError::new_err(
        "this outcore was built without MPI: it cannot lend (reinstall it with MPI: \
         MATURIN_PEP517_ARGS=\"--features mpi\" pip install ./python)",
    ))
}

/// MPI's ranks when launched by MPI (and built with it), else one process.
#[cfg(feature = "mpi")]
fn start(py: Python<'_>) -> PyResult<Ranks> {
    if turned_off() || launched_size().is_none() {
        return Ok(Ranks::single());
    }
    // Each rank lends what its fits leave under their cap to the others
    // (its resident set counted, the script's arrays with it), unless
    // OUTCORE_REMOTE_MEMORY=off.
    let role = if remote_memory_on() {
        outcore_jobs::ranks::Role::Sharing
    } else {
        outcore_jobs::ranks::Role::Worker
    };
    let r = Ranks::init_as(role).map_err(crate::to_py)?;
    // A growth spawns this interpreter on this script, with its options
    // (`sys.orig_argv`, Python 3.10 on; `sys.argv` before).
    let sys = py.import("sys")?;
    let exe: std::path::PathBuf = sys.getattr("executable")?.extract()?;
    let args: Vec<String> = match sys.getattr("orig_argv") {
        Ok(a) => a.extract::<Vec<String>>()?.into_iter().skip(1).collect(),
        Err(_) => sys.getattr("argv")?.extract()?,
    };
    Ranks::spawn_as(exe.into(), args.into_iter().map(Into::into).collect());
    Ok(r)
}

/// One process: a module built without MPI. Under a launcher of several
/// ranks every one would fit the whole data on its own, so that is an
/// error unless asked for (`OUTCORE_MPI=off`).
#[cfg(not(feature = "mpi"))]
fn start(_: Python<'_>) -> PyResult<Ranks> {
    match launched_size() {
        Some(n) if n > 1 && !turned_off() => Err(PyRuntimeError::new_err(format!(
            "this process is one of {n} MPI ranks, but this outcore was built without MPI, \
             so every rank would fit the whole data alone (reinstall it with MPI: \
             MATURIN_PEP517_ARGS=\"--features mpi\" pip install ./python; or set \
             OUTCORE_MPI=off to fit on each rank alone)"
        ))),
        _ => Ok(Ranks::single()),
    }
}

/// How long a rank whose fit failed waits for the others to have failed
/// too (an error every rank meets, such as a check of the settings)
/// before it concludes that they wait for it.
const STRAGGLERS: std::time::Duration = std::time::Duration::from_secs(5);

/// After a fit failed on this rank: whether every rank failed (they are
/// in step), else notes that the ranks are out of step from now on.
pub(crate) fn failed(ranks: &Ranks) -> bool {
    if ranks.size() == 1 || ranks.all_arrive(STRAGGLERS) {
        return true;
    }
    OUT_OF_STEP.store(true, Ordering::Relaxed);
    false
}

/// Rank 0's `seed` on every rank: a seed drawn in each process
/// (`random_state=None`) is one seed for the ranks, as for one process.
/// Collective: every rank's fit calls it at the same point.
///
/// A rank spawned by a growth, before it joins the fit that grew, keeps
/// its own: the ranks it joins are past this point, and the growth hands
/// their draws over.
pub(crate) fn shared_seed(py: Python<'_>, ranks: &Ranks, seed: u64) -> u64 {
    if ranks.size() == 1 || ranks.join_pending() {
        return seed;
    }
    let mut v = [seed];
    py.detach(|| ranks.broadcast_u64(&mut v));
    v[0]
}

/// After a growth, rank 0's `seed` on every rank: a spawned rank drew its
/// own before it joined. Collective over the grown ranks.
pub(crate) fn hand_over_seed(ranks: &Ranks, seed: &mut u64) {
    let mut v = [*seed];
    ranks.broadcast_u64(&mut v);
    *seed = v[0];
}

/// Rank 0's `bytes` on every rank (initial centres a callable made from
/// a seed of its own). Collective, as [`shared_seed`].
pub(crate) fn shared_bytes(py: Python<'_>, ranks: &Ranks, bytes: &mut Vec<u8>) {
    if ranks.size() > 1 && !ranks.join_pending() {
        py.detach(|| ranks.broadcast_bytes(bytes));
    }
}

/// Whether this process is rank 0 of its fits' ranks (or has not fitted
/// yet, or runs alone): the one that prints progress.
pub(crate) fn is_root() -> bool {
    RANKS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_none_or(Ranks::is_root)
}

/// `(rank, size)` of this process's fits: `(0, 1)` for one process. Starts
/// MPI when launched by it.
#[pyfunction]
pub(crate) fn mpi_rank(py: Python<'_>) -> PyResult<(usize, usize)> {
    let r = ranks(py)?;
    Ok((r.rank(), r.size()))
}

/// Whether this module was built with MPI.
#[pyfunction]
pub(crate) fn mpi_built() -> bool {
    cfg!(feature = "mpi")
}

/// At the interpreter's exit, after the last engine ended ([`finish`]
/// runs first): ends every rank when they are out of step (`MPI_Abort`,
/// exit status 1), else lets MPI finalise (when outcore initialised it).
///
/// [`finish`]: crate::run::finish
#[pyfunction]
pub(crate) fn mpi_end(py: Python<'_>) {
    let held = RANKS.lock().unwrap_or_else(|p| p.into_inner()).take();
    let Some(r) = held else {
        return;
    };
    if r.size() > 1 && OUT_OF_STEP.load(Ordering::Relaxed) {
        let line = format!(
            "outcore: error: rank {} of {}: a fit failed on this rank; ending every rank\n",
            r.rank(),
            r.size()
        );
        crate::run::write_stderr(&line);
        py.detach(|| r.abort(1));
    }
    py.detach(move || {
        // The last clone, dropped here: finalises MPI if outcore
        // initialised it (on the thread that did: Python's main thread,
        // which runs the exit's handlers).
        let _last = r;
    });
}
