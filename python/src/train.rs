//! Multinomial logistic regression (L-BFGS) on a data file and a file of
//! class indices.

use std::path::PathBuf;

use outcore_jobs::grow::{self, Growth};
use outcore_jobs::train::{self, Penalty, Solver, TrainConfig, TrainStats};
use outcore_jobs::{Labels, Session, Source, Workers};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::run::{le_bytes, run_job, session_figures, Settings};

/// The logistic regression's settings, as the estimator names them.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct Params {
    classes: usize,
    /// `C`, or none without a penalty.
    c: Option<f64>,
    /// The elastic net's L1 share (0: L2, 1: L1).
    l1_ratio: f64,
    tol: f64,
    max_iter: usize,
    shards: usize,
    fit_intercept: bool,
    /// scikit-learn's binary model (two classes).
    binary: bool,
    /// The start point: float64 bytes, `rows x (dims + 1)`, bias last.
    start: Option<Vec<u8>>,
}

/// Fits the model to the rows of `path` and the class indices (0..classes,
/// a 1-D int32 `.npy`) of `labels`, with the sample weights of `weights`
/// (a 1-D float64 `.npy`) if given: a dict of `w` (bytes of float64, rows
/// x (dims + 1), the bias last), `n_iter`, `converged`, `stop` and `stats`
/// (JSON). No row is held out.
#[pyfunction]
#[pyo3(signature = (settings, path, labels, weights, params))]
pub(crate) fn logistic_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    labels: PathBuf,
    weights: Option<PathBuf>,
    params: Params,
) -> PyResult<Bound<'py, PyDict>> {
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let (rows, dims) = src.shape().map_err(crate::to_py)?;
    let start = params.start.as_deref().map(|b| {
        b.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect()
    });
    let cfg = TrainConfig {
        solver: Solver::Lbfgs,
        c: params.c.unwrap_or(1.0),
        penalty: match params.c {
            Some(_) if params.l1_ratio > 0.0 => Penalty::ElasticNet(params.l1_ratio),
            Some(_) => Penalty::L2,
            None => Penalty::None,
        },
        tol: params.tol,
        max_iter: params.max_iter,
        holdout: 0.0,
        shards: params.shards.max(1),
        fit_intercept: params.fit_intercept,
        binary: params.binary,
        start,
        ..TrainConfig::default()
    };
    let classes = params.classes;
    let (session, part_bytes) = settings.session(py, |cap, sb, n| {
        Workers::plan(cap, 0, train::aligned_shard_bytes(sb, dims), n)
    })?;
    let shard_bytes = train::aligned_shard_bytes(part_bytes, dims);
    let labels = Labels::File(labels);
    let bound = train::spread_limit(&cfg, rows, dims, shard_bytes);
    let (out, stats, notes) = run_job(py, &session, || {
        let mut notes = Vec::new();
        let note = |line| notes.push(line);
        let targets = train::Targets {
            labels: &labels,
            weights: weights.as_deref(),
            classes: Some(classes),
        };
        let (job, growth) = grow::load_and_grow(&session, session.grow, bound, note, |s, _| {
            train::load(s, &src, targets, shard_bytes, &cfg, |_, _| {})
        })?;
        session.phase("fit");
        let out = train::train(&session, &job, &cfg, |ev| {
            if let train::Event::Iteration(it) = ev {
                settings.say(|| {
                    format!(
                        "iteration {}: objective {:.6e}, largest gradient {:.3e}",
                        it.index, it.objective, it.grad_max
                    )
                });
            }
        })?;
        let figures = TrainStats::new(&cfg, &job, &out);
        let stats = stats(&session, &figures, growth.as_slice());
        Ok((out, stats, notes))
    })?;
    crate::run::tell(py, settings, &notes)?;
    let d = PyDict::new(py);
    d.set_item(
        "w",
        PyBytes::new(py, &le_bytes(&out.weights, f64::to_le_bytes)),
    )?;
    d.set_item("n_iter", out.last.as_ref().map_or(0, |l| l.index))?;
    d.set_item("converged", out.stop.is_some_and(|s| s.converged()))?;
    d.set_item("stop", out.stop.map(|s| s.describe()))?;
    d.set_item("stats", stats)?;
    Ok(d)
}

/// The command line's `--stats` figures for a fit, as JSON text (the same
/// on every rank). Collective.
fn stats(session: &Session, figures: &TrainStats, growth: &[Growth]) -> String {
    let v = serde_json::to_value(figures).unwrap_or_default();
    session_figures(session, v, growth)
}
