//! The jobs of the job interface: least squares (`LinearRegression`,
//! `Ridge`) and PCA, on data files the Python side names or writes.

use std::path::PathBuf;

use outcore_jobs::grow::{self, Growth};
use outcore_jobs::job::{self, Algorithm, Input, Layout, Targets};
use outcore_jobs::linear::{Linear, LinearConfig};
use outcore_jobs::pca::{Components, Pca, Solver};
use outcore_jobs::sgd::{Loss, Penalty, Schedule, Sgd, SgdConfig, SgdModel};
use outcore_jobs::{Source, Workers};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use serde::Serialize;

use crate::run::{le_bytes, run_job, Engine, Settings};

/// Loads `input` and fits the algorithm `make` makes from `seed` (rank
/// 0's, handed over by a growth) under `settings`: the fitted model and
/// the statistics (JSON, the command line's `--stats`).
fn fit<A>(
    py: Python<'_>,
    settings: &Settings,
    input: &Input<'_>,
    (mut seed, make): (Option<u64>, impl FnOnce(Option<u64>) -> A + Send),
) -> PyResult<(A::Fitted, String)>
where
    A: Algorithm,
    A::Fitted: Serialize + Send,
{
    let (session, part_bytes) = settings.session(py, |cap, pb, n| Workers::plan(cap, 0, pb, n))?;
    let (fitted, json, notes) = run_job(py, &session, || {
        let (data, growth, notes) = load(&session, input, part_bytes, &mut seed)?;
        let mut alg = make(seed);
        job::check(&session, &data, &mut alg)?;
        let (fitted, mut run) = job::fit(&session, &data, &mut alg, |p| {
            settings.say(|| format!("pass {}: {:.2}s", p.index, p.seconds));
        })?;
        run.growth.extend(growth);
        let stats = session.runtime().stats();
        let json = run.to_json(&session, &fitted, &stats)?;
        let json = json.map(|j| j.to_string()).unwrap_or_default();
        Ok((fitted, crate::run::from_root(&session, json), notes))
    })?;
    crate::run::tell(py, settings, &notes)?;
    Ok((fitted, json))
}

/// `input` loaded into the session, grown onto free MPI slots as
/// `max_ranks` allows when it does not fit: the data, the growth, and the
/// lines about it. After a growth, `seed` is rank 0's on every rank (a
/// spawned rank drew its own before it joined). Collective.
fn load(
    session: &Engine,
    input: &Input<'_>,
    part_bytes: u64,
    seed: &mut Option<u64>,
) -> outcore_jobs::Result<(job::Data, Option<Growth>, Vec<String>)> {
    let layout = Layout::default();
    let mut notes = Vec::new();
    let bound = layout.most_ranks(input.source.shape()?.0);
    let note = |line| notes.push(line);
    let (data, growth) = grow::load_and_grow(session, session.grow, bound, note, |s, again| {
        if let (true, Some(v)) = (again, seed.as_mut()) {
            crate::ranks::hand_over_seed(s.ranks(), v);
        }
        job::load(s, input, layout, part_bytes, |_, _| {})
    })?;
    Ok((data, growth, notes))
}

/// Least squares of the targets in `targets` (a 1-D or 2-D float `.npy`)
/// on the rows of `path`, with the sample weights of `weights` if given:
/// a dict of `coef` (bytes of float64, targets x dims), `intercept`
/// (float64 per target), `rank`, `singular` (bytes of float64), `solver`
/// and `stats` (JSON). `model`: `(fit_intercept, alpha, positive)`, the
/// penalty one value or one per target, `positive` coefficients >= 0.
#[pyfunction]
#[pyo3(signature = (settings, path, targets, weights, model))]
pub(crate) fn linear_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    targets: PathBuf,
    weights: Option<PathBuf>,
    model: (bool, Vec<f64>, bool),
) -> PyResult<Bound<'py, PyDict>> {
    let (fit_intercept, alpha, positive) = model;
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let ys = Source::targets(&targets).map_err(crate::to_py)?;
    let input = Input {
        source: &src,
        targets: Targets::File(ys),
        weights: weights.as_deref(),
    };
    let alg = Linear::new(LinearConfig {
        fit_intercept,
        alpha,
        positive,
    });
    let (f, stats) = fit(py, settings, &input, (None, move |_| alg))?;
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
/// `noise_variance`, `rows`, `gram` (bytes of the centred rows' Gram
/// matrix, with `gram=True`; else empty) and `stats` (JSON).
/// `randomized`: `(oversamples, power passes, seed)` for the randomized
/// solver.
#[pyfunction]
#[pyo3(signature = (settings, path, count=None, share=None, gram=false, randomized=None))]
pub(crate) fn pca_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    count: Option<usize>,
    share: Option<f64>,
    gram: bool,
    randomized: Option<(usize, usize, u64)>,
) -> PyResult<Bound<'py, PyDict>> {
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let components = match (count, share) {
        (Some(k), _) => Components::Count(k),
        (None, Some(s)) => Components::Share(s),
        (None, None) => Components::All,
    };
    let rows = src.shape().map_err(crate::to_py)?.0;
    let seed = match randomized {
        Some((_, _, seed)) => Some(crate::ranks::shared_seed(
            py,
            &crate::ranks::ranks(py)?,
            seed,
        )),
        None => None,
    };
    let make = move |seed: Option<u64>| {
        let mut alg = Pca::new(components);
        if gram {
            alg = alg.keep_gram();
        }
        if let (Some((oversamples, iterations, _)), Some(seed)) = (randomized, seed) {
            alg = alg.solver(Solver::Randomized {
                oversamples,
                iterations,
                seed,
            });
        }
        alg
    };
    let (f, stats) = fit(py, settings, &Input::rows(&src), (seed, make))?;
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
    d.set_item("rows", rows)?;
    d.set_item(
        "gram",
        PyBytes::new(py, &le_bytes(&f.gram, f64::to_le_bytes)),
    )?;
    d.set_item("stats", stats)?;
    Ok(d)
}

/// SGD of the targets in `targets` (a 1-D float `.npy`: class indices
/// with `classes` > 0, else values) on the rows of `path`: `params` is a
/// dict of the settings (scikit-learn's names), `warm` the model to go on
/// from (`coef` bytes of float64, `intercept`, `q` bytes, `u`, `t`,
/// `eta`, and averaged SGD's `aw` bytes and `ab`). A dict of `coef`
/// (bytes of float64, models x dims), `intercept`, `n_iter`, `t`,
/// `converged`, `q`, `u`, `eta`, `stats`, and the model to go on from:
/// the last weights `w` (bytes) and `b`, and the averages `aw` and `ab`.
#[pyfunction]
#[pyo3(signature = (settings, path, targets, weights, params, warm=None))]
pub(crate) fn sgd_fit<'py>(
    py: Python<'py>,
    settings: &Settings,
    path: PathBuf,
    targets: PathBuf,
    weights: Option<PathBuf>,
    params: &Bound<'py, PyDict>,
    warm: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let src = Source::from_path(&path, None).map_err(crate::to_py)?;
    let ys = Source::targets(&targets).map_err(crate::to_py)?;
    let (_, dims) = src.shape().map_err(crate::to_py)?;
    let mut cfg = sgd_config(params)?;
    let ranks = crate::ranks::ranks(py)?;
    cfg.seed = crate::ranks::shared_seed(py, &ranks, cfg.seed);
    if let Some(w) = warm {
        cfg.warm = Some(warm_model(w, &cfg, dims)?);
    }
    let input = Input {
        source: &src,
        targets: Targets::File(ys),
        weights: weights.as_deref(),
    };
    let (session, part_bytes) = settings.session(py, |cap, pb, n| Workers::plan(cap, 0, pb, n))?;
    let (f, stats, notes) = run_job(py, &session, || {
        let mut seed = Some(cfg.seed);
        let (data, growth, notes) = load(&session, &input, part_bytes, &mut seed)?;
        cfg.seed = seed.unwrap_or(cfg.seed);
        let mut alg = Sgd::new(cfg);
        let (fitted, mut run) = job::fit_online(&session, &data, &mut alg, |p| {
            settings.say(|| format!("epoch {}: {:.2}s", p.index, p.seconds));
        })?;
        run.growth.extend(growth);
        let s = session.runtime().stats();
        let json = run.to_json(&session, &fitted, &s)?;
        let json = json.map(|j| j.to_string()).unwrap_or_default();
        Ok((fitted, crate::run::from_root(&session, json), notes))
    })?;
    crate::run::tell(py, settings, &notes)?;
    let d = PyDict::new(py);
    let bytes = |v: &[f64]| PyBytes::new(py, &le_bytes(v, f64::to_le_bytes));
    d.set_item("coef", bytes(&f.coef))?;
    d.set_item("intercept", f.intercept.clone())?;
    d.set_item("n_iter", f.n_iter)?;
    d.set_item("t", f.t)?;
    d.set_item("converged", f.converged)?;
    d.set_item("q", bytes(&f.model.q))?;
    d.set_item("u", f.model.u)?;
    d.set_item("eta", f.model.eta)?;
    d.set_item("w", bytes(&f.model.w))?;
    d.set_item("b", f.model.b.clone())?;
    d.set_item("aw", bytes(&f.model.aw))?;
    d.set_item("ab", f.model.ab.clone())?;
    d.set_item("stats", stats)?;
    Ok(d)
}

/// A setting of `params`, or an error naming it.
fn item<'py>(params: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    params
        .get_item(key)?
        .ok_or_else(|| PyValueError::new_err(format!("internal: no {key} among the settings")))
}

/// The settings from scikit-learn's parameters (checked on the Python
/// side).
fn sgd_config(p: &Bound<'_, PyDict>) -> PyResult<SgdConfig> {
    let eps: f64 = item(p, "epsilon")?.extract()?;
    let loss = match item(p, "loss")?.extract::<String>()?.as_str() {
        "hinge" => Loss::Hinge,
        "log_loss" => Loss::LogLoss,
        "modified_huber" => Loss::ModifiedHuber,
        "squared_hinge" => Loss::SquaredHinge,
        "perceptron" => Loss::Perceptron,
        "squared_error" => Loss::SquaredError,
        "huber" => Loss::Huber(eps),
        "epsilon_insensitive" => Loss::EpsilonInsensitive(eps),
        "squared_epsilon_insensitive" => Loss::SquaredEpsilonInsensitive(eps),
        l => return Err(PyValueError::new_err(format!("unknown loss {l:?}"))),
    };
    let penalty = match item(p, "penalty")?.extract::<Option<String>>()?.as_deref() {
        None => Penalty::None,
        Some("l2") => Penalty::L2,
        Some("l1") => Penalty::L1,
        Some("elasticnet") => Penalty::ElasticNet,
        Some(x) => return Err(PyValueError::new_err(format!("unknown penalty {x:?}"))),
    };
    let learning_rate = match item(p, "learning_rate")?.extract::<String>()?.as_str() {
        "constant" => Schedule::Constant,
        "optimal" => Schedule::Optimal,
        "invscaling" => Schedule::InvScaling,
        "adaptive" => Schedule::Adaptive,
        x => {
            return Err(PyValueError::new_err(format!(
                "unknown learning_rate {x:?}"
            )))
        }
    };
    Ok(SgdConfig {
        classes: item(p, "classes")?.extract()?,
        loss,
        penalty,
        alpha: item(p, "alpha")?.extract()?,
        l1_ratio: item(p, "l1_ratio")?.extract()?,
        fit_intercept: item(p, "fit_intercept")?.extract()?,
        max_iter: item(p, "max_iter")?.extract()?,
        tol: item(p, "tol")?.extract()?,
        shuffle: item(p, "shuffle")?.extract()?,
        seed: item(p, "seed")?.extract()?,
        learning_rate,
        eta0: item(p, "eta0")?.extract()?,
        power_t: item(p, "power_t")?.extract()?,
        early_stopping: item(p, "early_stopping")?.extract()?,
        validation_fraction: item(p, "validation_fraction")?.extract()?,
        n_iter_no_change: item(p, "n_iter_no_change")?.extract()?,
        warm: None,
        class_weight: item(p, "class_weight")?.extract()?,
        average: item(p, "average")?.extract()?,
    })
}

/// The model to go on from.
fn warm_model(w: &Bound<'_, PyDict>, cfg: &SgdConfig, dims: usize) -> PyResult<SgdModel> {
    let floats = |b: Vec<u8>| -> Vec<f64> {
        b.chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()
    };
    let models = if cfg.classes > 2 { cfg.classes } else { 1 };
    let mut m = SgdModel::resume(
        (models, dims),
        (
            floats(item(w, "coef")?.extract()?),
            item(w, "intercept")?.extract()?,
        ),
        (floats(item(w, "q")?.extract()?), item(w, "u")?.extract()?),
        (item(w, "t")?.extract()?, item(w, "eta")?.extract()?),
    )
    .map_err(crate::to_py)?;
    // The averages carried on (`partial_fit`); empty: they start again.
    m.aw = floats(item(w, "aw")?.extract()?);
    m.ab = item(w, "ab")?.extract()?;
    Ok(m)
}
