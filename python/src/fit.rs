//! The jobs of the job interface: least squares (`LinearRegression`,
//! `Ridge`) and PCA, on data files the Python side names or writes.

use std::path::PathBuf;

use outcore_jobs::job::{self, Algorithm, Input, Layout, Targets};
use outcore_jobs::linear::{Linear, LinearConfig};
use outcore_jobs::pca::{Components, Pca};
use outcore_jobs::{Source, Workers};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use serde::Serialize;

use crate::run::{le_bytes, run_job, Settings};

/// Loads `input` and fits `alg` to it under `settings`: the fitted model
/// and the statistics (JSON, the command line's `--stats`).
fn fit<A>(
    py: Python<'_>,
    settings: &Settings,
    input: &Input<'_>,
    mut alg: A,
) -> PyResult<(A::Fitted, String)>
where
    A: Algorithm + Send,
    A::Fitted: Serialize + Send,
{
    let (session, part_bytes) = settings.session(py, |cap, pb, n| Workers::plan(cap, 0, pb, n))?;
    run_job(py, &session, || {
        let data = job::load(&session, input, Layout::default(), part_bytes, |_, _| {})?;
        job::check(&session, &data, &mut alg)?;
        let (fitted, run) = job::fit(&session, &data, &mut alg, |p| {
            settings.say(|| format!("pass {}: {:.2}s", p.index, p.seconds));
        })?;
        let stats = session.runtime().stats();
        let json = run.to_json(&session, &fitted, &stats)?;
        Ok((fitted, json.map(|j| j.to_string()).unwrap_or_default()))
    })
}

/// Least squares of the targets in `targets` (a 1-D or 2-D float `.npy`)
/// on the rows of `path`, with the sample weights of `weights` if given:
/// a dict of `coef` (bytes of float64, targets x dims), `intercept`
/// (float64 per target), `rank`, `singular` (bytes of float64), `solver`
/// and `stats` (JSON).
#[pyfunction]
#[pyo3(signature = (settings, path, targets, weights, fit_intercept, alpha))]
pub(crate) fn linear_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    targets: PathBuf,
    weights: Option<PathBuf>,
    fit_intercept: bool,
    alpha: Vec<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let ys = Source::from_path(&targets, None).map_err(crate::to_py)?;
    let input = Input {
        source: &src,
        targets: Targets::File(ys),
        weights: weights.as_deref(),
    };
    let alg = Linear::new(LinearConfig {
        fit_intercept,
        alpha,
    });
    let (f, stats) = fit(py, settings, &input, alg)?;
    let d = PyDict::new(py);
    d.set_item(
        "coef",
        PyBytes::new(py, &le_bytes(&f.coef, f64::to_le_bytes)),
    )?;
    d.set_item("intercept", f.intercept)?;
    d.set_item("rank", f.rank)?;
    d.set_item(
        "singular",
        PyBytes::new(py, &le_bytes(&f.singular, f64::to_le_bytes)),
    )?;
    d.set_item("solver", f.solver)?;
    d.set_item("stats", stats)?;
    Ok(d)
}

/// PCA of the rows of `path`, keeping `n_components` (a count, a share
/// of the variance in (0, 1), or all for `None`): a dict of `components`
/// (bytes of float64, n_components x dims), `explained_variance`,
/// `explained_variance_ratio`, `singular_values`, `mean`,
/// `noise_variance` and `stats` (JSON).
#[pyfunction]
#[pyo3(signature = (settings, path, count=None, share=None))]
pub(crate) fn pca_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    count: Option<usize>,
    share: Option<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let components = match (count, share) {
        (Some(k), _) => Components::Count(k),
        (None, Some(s)) => Components::Share(s),
        (None, None) => Components::All,
    };
    let (f, stats) = fit(py, settings, &Input::rows(&src), Pca::new(components))?;
    let d = PyDict::new(py);
    d.set_item(
        "components",
        PyBytes::new(py, &le_bytes(&f.components, f64::to_le_bytes)),
    )?;
    d.set_item("n_components", f.n_components)?;
    d.set_item("explained_variance", f.explained_variance)?;
    d.set_item("explained_variance_ratio", f.explained_variance_ratio)?;
    d.set_item("singular_values", f.singular_values)?;
    d.set_item("mean", f.mean)?;
    d.set_item("noise_variance", f.noise_variance)?;
    d.set_item("stats", stats)?;
    Ok(d)
}
