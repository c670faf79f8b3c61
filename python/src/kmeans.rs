//! K-means (Lloyd and mini-batch) on a data file: fit, with the labels of
//! the final pass (`apply.rs` labels new rows).

use std::path::PathBuf;
use std::time::Instant;

use outcore_jobs::grow::{self, Growth, MaxRanks};
use outcore_jobs::kmeans::{
    self, Algorithm, Config, Converged, Event, Init, KmeansStats, Loaded, Outcome, Traffic,
};
use outcore_jobs::{Session, Source};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::run::{f32s, le_bytes, run_job, session_figures, Settings};

/// The K-means settings, as the estimators name them.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct Params {
    k: usize,
    lloyd: bool,
    /// `"k-means++"`, `"random"` or `"given"` (then `centers`).
    init: String,
    centers: Option<Vec<u8>>,
    n_init: usize,
    /// Lloyd iterations, or mini-batch epochs.
    max_iter: usize,
    tol: f64,
    seed: u64,
    batch_tasks: usize,
    task_points: usize,
    max_no_improvement: Option<usize>,
    reassignment_ratio: f64,
    shards: usize,
}

impl Params {
    /// The library's configuration.
    fn config(&self, dims: usize) -> PyResult<Config> {
        let init = match self.init.as_str() {
            "k-means++" => Init::KMeansPlusPlus,
            "random" => Init::Random,
            "k-means||" => Init::KMeansParallel,
            "given" => {
                let c = f32s(self.centers.as_deref().unwrap_or_default());
                if c.len() != self.k * dims {
                    return Err(PyValueError::new_err(format!(
                        "init holds {} values, not n_clusters x n_features = {} x {dims}",
                        c.len(),
                        self.k
                    )));
                }
                Init::Given(c)
            }
            other => return Err(PyValueError::new_err(format!("unknown init '{other}'"))),
        };
        Ok(Config {
            k: self.k,
            algorithm: if self.lloyd {
                Algorithm::Lloyd
            } else {
                Algorithm::MiniBatch
            },
            init,
            epochs: self.max_iter.max(1),
            iterations: self.max_iter.max(1),
            batch_tasks: self.batch_tasks.max(1),
            task_points: self.task_points.max(1),
            seed: self.seed,
            tol: self.tol,
            max_no_improvement: self.max_no_improvement,
            reassignment_ratio: self.reassignment_ratio,
            n_init: self.n_init.max(1),
            shards: self.shards.max(1),
        })
    }
}

/// What a fit gives back besides the outcome: labels and the figures the
/// statistics need.
struct Extra {
    labels: Vec<u32>,
    /// The data as loaded.
    data: Loaded,
    traffic: Traffic,
    /// The growth onto more ranks, if the fit grew.
    growth: Option<Growth>,
    /// The lines the growth (or its refusal) gave, rank 0's.
    notes: Vec<String>,
}

/// Fits K-means to the data in `path` (weights in `weights`, a 1-D
/// `.npy`): a dict of `centers` (bytes of float32, k x dims), `labels`
/// (bytes of uint32), `inertia`, `n_iter`, `n_steps`, `converged` and
/// `stats` (JSON). With `verbose`, progress goes to `echo(line, stdout)`
/// (see [`Echo`]).
#[pyfunction]
#[pyo3(signature = (settings, path, weights, params, echo=None))]
pub(crate) fn kmeans_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    weights: Option<PathBuf>,
    mut params: Params,
    echo: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let (rows, dims) = src.shape().map_err(crate::to_py)?;
    let ranks = crate::ranks::ranks(py)?;
    // On MPI ranks, rank 0's draws: its seed, and its initial centres.
    params.seed = crate::ranks::shared_seed(py, &ranks, params.seed);
    if let Some(c) = params.centers.as_mut() {
        crate::ranks::shared_bytes(py, &ranks, c);
    }
    let cfg = params.config(dims)?;
    let (session, part_bytes) = settings.session(py, |cap, pb, n| {
        let pb = kmeans::aligned_partition_bytes(pb, dims, cfg.task_points);
        kmeans::workers((rows, dims), &cfg, pb, cap, (ranks.rank(), ranks.size()), n)
    })?;
    let part_bytes = kmeans::aligned_partition_bytes(part_bytes, dims, cfg.task_points);
    let echo = Echo {
        verbose: settings.verbose > 0 && ranks.is_root(),
        to: echo,
    };
    // On MPI ranks, each rank labels its own rows: every rank gets all.
    let (out, labels, stats, notes) = run_job(py, &session, || {
        let how = (&src, weights.as_deref(), part_bytes);
        let mut cfg = cfg.clone();
        let (out, extra) = fit(&session, session.grow, &echo, how, &mut cfg)?;
        let labels = session.ranks().all_gather_u32(&extra.labels)?;
        let stats = stats(&session, &cfg, &out, &extra);
        Ok((out, labels, stats, extra.notes))
    })?;
    crate::run::tell(py, settings, &notes)?;
    let d = PyDict::new(py);
    d.set_item(
        "centers",
        PyBytes::new(py, &le_bytes(&out.centers.values, f32::to_le_bytes)),
    )?;
    d.set_item(
        "labels",
        PyBytes::new(py, &le_bytes(&labels, u32::to_le_bytes)),
    )?;
    d.set_item("inertia", out.inertia)?;
    d.set_item("n_iter", out.iterations)?;
    d.set_item("n_steps", out.steps)?;
    d.set_item("converged", out.converged.is_some())?;
    d.set_item("stats", stats)?;
    Ok(d)
}

/// Where a fit's progress lines go, when `verbose`: a Python callable
/// `to(line, stdout)`, called from the job's thread (it takes the GIL,
/// which the caller's thread, waiting in `run_job`, does not hold). The
/// lines in scikit-learn's words go to its standard output, as
/// scikit-learn prints them; the engine's own (`outcore: ...`: loading,
/// seconds per pass) to its standard error. Without a callable, the
/// process's streams.
struct Echo {
    verbose: bool,
    to: Option<Py<PyAny>>,
}

impl Echo {
    /// A line of the engine's own.
    fn outcore(&self, line: impl FnOnce() -> String) {
        if self.verbose {
            self.write(format!("outcore: {}", line()), false);
        }
    }

    /// `line`, to standard output (scikit-learn's words) or error.
    fn write(&self, line: String, stdout: bool) {
        match &self.to {
            Some(f) => Python::attach(|py| {
                if let Err(e) = f.call1(py, (line, stdout)) {
                    e.write_unraisable(py, None);
                }
            }),
            None if stdout => println!("{line}"),
            None => eprintln!("{line}"),
        }
    }
}

/// What the events of a fit say, in scikit-learn's words (its
/// `_kmeans_single_lloyd` and `MiniBatchKMeans` verbose lines), as far
/// as the events tell: the engine reports that the centres' squared shift
/// was within the tolerance, not the shift itself.
struct Narrator<'a> {
    cfg: &'a Config,
    /// Rows of the data (a mini-batch epoch's inertia is over all of them).
    rows: u64,
    /// The last pass reported in the current run.
    last: usize,
}

impl Narrator<'_> {
    /// The line `ev` is told in, if any.
    fn line(&mut self, ev: &Event) -> Option<String> {
        let lloyd = matches!(self.cfg.algorithm, Algorithm::Lloyd);
        match *ev {
            Event::Run { index, of } if !lloyd => Some(format!(
                "Init {}/{of} with method {}",
                index + 1,
                init_name(&self.cfg.init)
            )),
            Event::Initialized { .. } if lloyd => Some("Initialization complete".into()),
            Event::Epoch { index, inertia, .. } => {
                self.last = index;
                Some(if lloyd {
                    format!("Iteration {index}, inertia {inertia}.")
                } else {
                    format!(
                        "Minibatch epoch {}/{}: mean batch inertia: {}",
                        index + 1,
                        self.cfg.epochs,
                        inertia / self.rows.max(1) as f64
                    )
                })
            }
            Event::Reassigned { centres } => Some(format!(
                "[MiniBatchKMeans] Reassigning {centres} cluster centers."
            )),
            Event::Converged { steps, why } => Some(match (lloyd, why) {
                (true, _) if self.cfg.tol <= 0.0 => {
                    // Centres that did not move: the labels did not change.
                    format!("Converged at iteration {}: strict convergence.", self.last)
                }
                (true, _) => format!(
                    "Converged at iteration {}: center shift (sum of squares) within tolerance \
                     {} x the mean variance of the features.",
                    self.last, self.cfg.tol
                ),
                (false, Converged::CenterShift) => {
                    format!("Converged (small centers change) at step {steps}")
                }
                (false, Converged::NoImprovement) => {
                    format!("Converged (lack of improvement in inertia) at step {steps}")
                }
            }),
            _ => None,
        }
    }
}

/// The name of an initialisation, as the estimators take it.
fn init_name(init: &Init) -> &'static str {
    match init {
        Init::KMeansPlusPlus => "k-means++",
        Init::Random => "random",
        Init::KMeansParallel => "k-means||",
        Init::Given(_) => "given centres",
    }
}

/// The fit, on the job's thread.
fn fit(
    session: &Session,
    grow: Option<MaxRanks>,
    echo: &Echo,
    (src, weights, part_bytes): (&Source, Option<&std::path::Path>, u64),
    cfg: &mut Config,
) -> outcore_jobs::Result<(Outcome, Extra)> {
    let t = Instant::now();
    // Grown: every rank loads its shards again (a spawned one, first).
    let mut notes = Vec::new();
    let bound = kmeans::shards(src.shape()?.0, cfg).count();
    let note = |line| notes.push(line);
    let (ds, growth) = grow::load_and_grow(session, grow, bound, note, |s, again| {
        if again {
            hand_over(s.ranks(), cfg);
        }
        kmeans::load(s, src, weights, Some(cfg), part_bytes, |_, _| {})
    })?;
    let cfg = &*cfg;
    let data = Loaded {
        rows: ds.rows,
        dims: ds.dims,
        partitions: ds.parts.len(),
        weighted: weights.is_some(),
        load_seconds: t.elapsed().as_secs_f64(),
    };
    echo.outcore(|| {
        format!(
            "loaded {} rows of {} in {:.1} s",
            ds.rows, ds.dims, data.load_seconds
        )
    });
    session.phase("fit");
    let mut traffic = Traffic::start(session);
    let mut labels = Vec::new();
    let mut narrator = Narrator {
        cfg,
        rows: ds.rows,
        last: 0,
    };
    let mut on = |ev: Event| {
        traffic.on(session, &ev);
        if echo.verbose {
            if let Some(line) = narrator.line(&ev) {
                echo.write(line, true);
            }
        }
        if let Event::Epoch {
            index,
            seconds,
            inertia,
        } = ev
        {
            echo.outcore(|| format!("pass {}: {seconds:.2} s, inertia {inertia:.6e}", index + 1));
        }
    };
    let out = kmeans::run_with_labels(session, &ds, cfg, &mut on, |v| {
        labels.extend_from_slice(v);
        Ok(())
    })?;
    let extra = Extra {
        labels,
        data,
        traffic,
        growth,
        notes,
    };
    Ok((out, extra))
}

/// After a growth, rank 0's draws on every rank: a spawned rank drew its
/// own seed (and a callable its own centres) before it joined. Collective
/// over the grown ranks.
fn hand_over(ranks: &outcore_jobs::ranks::Ranks, cfg: &mut Config) {
    crate::ranks::hand_over_seed(ranks, &mut cfg.seed);
    if let Init::Given(c) = &mut cfg.init {
        ranks.broadcast(c);
    }
}

/// The command line's `--stats` figures for a fit, as JSON text (the same
/// on every rank). Collective.
fn stats(session: &Session, cfg: &Config, out: &Outcome, extra: &Extra) -> String {
    let t = &extra.traffic;
    let job = KmeansStats::new(cfg, extra.data, out, t, &t.epoch_read);
    let v = serde_json::to_value(job).unwrap_or_default();
    session_figures(session, v, extra.growth.as_slice())
}
