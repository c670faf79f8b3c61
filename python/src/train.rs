//! Multinomial logistic regression (L-BFGS) on a data file and a file of
//! class indices.

use std::path::PathBuf;

use outcore_jobs::train::{self, Solver, TrainConfig, TrainStats};
use outcore_jobs::{Labels, Session, Source, Workers};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::run::{le_bytes, run_job, session_figures, Settings};

/// Fits the model to the rows of `path` and the class indices (0..classes,
/// a 1-D int32 `.npy`) of `labels`: a dict of `w` (bytes of float32,
/// classes x (dims + 1), the bias last), `n_iter`, `converged`, `stop` and
/// `stats` (JSON). No row is held out.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (settings, path, labels, classes, c, tol, max_iter, shards))]
pub(crate) fn logistic_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    labels: PathBuf,
    classes: usize,
    c: f64,
    tol: f64,
    max_iter: usize,
    shards: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let (_, dims) = src.shape().map_err(crate::to_py)?;
    let cfg = TrainConfig {
        solver: Solver::Lbfgs,
        c,
        tol,
        max_iter,
        holdout: 0.0,
        shards: shards.max(1),
        ..TrainConfig::default()
    };
    let (session, part_bytes) = settings.session(py, |cap, sb, n| {
        Workers::plan(cap, 0, train::aligned_shard_bytes(sb, dims), n)
    })?;
    let shard_bytes = train::aligned_shard_bytes(part_bytes, dims);
    let labels = Labels::File(labels);
    let (out, figures) = run_job(py, &session, || {
        let job = train::load(
            &session,
            &src,
            &labels,
            Some(classes),
            shard_bytes,
            &cfg,
            |_, _| {},
        )?;
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
        Ok((out, figures))
    })?;
    let d = PyDict::new(py);
    d.set_item(
        "w",
        PyBytes::new(py, &le_bytes(&out.model.w, f32::to_le_bytes)),
    )?;
    d.set_item("n_iter", out.last.as_ref().map_or(0, |l| l.index))?;
    d.set_item("converged", out.stop.is_some_and(|s| s.converged()))?;
    d.set_item("stop", out.stop.map(|s| s.describe()))?;
    d.set_item("stats", stats(&session, &figures).to_string())?;
    Ok(d)
}

/// The command line's `--stats` figures for a fit.
fn stats(session: &Session, figures: &TrainStats) -> serde_json::Value {
    let v = serde_json::to_value(figures).unwrap_or_default();
    session_figures(session, v)
}
