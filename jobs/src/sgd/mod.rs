//! Stochastic gradient descent for linear models under the cap
//! (`outcore sgd`), scikit-learn's `SGDClassifier` and `SGDRegressor`, on
//! the [job interface](crate::job)'s online driver: the model in an
//! executor, updated row by row.
//!
//! Each row's update is scikit-learn's plain SGD: the learning rate of
//! the schedule at step `t`, the L2 part of the penalty as a decay of
//! the weights, the gradient step (scaled by the sample weight), the
//! intercept's step, and the L1 part by the cumulative truncated
//! gradient (Tsuruoka et al., 2009). A classifier of more than two
//! classes trains one binary model per class (one against the rest) on
//! every row. After each epoch, the average objective over the training
//! rows (or, with early stopping, the score on held-out rows) decides
//! whether to stop, as scikit-learn's `tol` and `n_iter_no_change` do.
//! Averaged SGD (`average`) keeps the running mean of each model's
//! weights beside them and fits to it.
//!
//! The epoch's order of rows is the driver's (shuffled by the seed at
//! the granularity of its tasks): the model depends on it, on the
//! settings and on the data, never on the cap or the number of ranks.

mod loss;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::input::mix;
use crate::job::{Online, Rows, Shape};

pub use loss::Loss;

/// The penalty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Penalty {
    /// None.
    None,
    /// `alpha * |w|^2 / 2`.
    L2,
    /// `alpha * |w|_1`.
    L1,
    /// `alpha * (l1_ratio |w|_1 + (1 - l1_ratio) |w|^2 / 2)`.
    ElasticNet,
}

/// The learning rate's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// `eta0`.
    Constant,
    /// `1 / (alpha (t0 + t))`, `t0` from Bottou's heuristic.
    Optimal,
    /// `eta0 / t^power_t`.
    InvScaling,
    /// `eta0`, divided by 5 when the epochs stop improving.
    Adaptive,
}

/// Settings of an SGD fit.
#[derive(Clone, Debug, PartialEq)]
pub struct SgdConfig {
    /// Classes (labels `0..classes` in the targets); 0 for regression.
    pub classes: usize,
    /// The loss.
    pub loss: Loss,
    /// The penalty.
    pub penalty: Penalty,
    /// Its strength.
    pub alpha: f64,
    /// The elastic net's mix.
    pub l1_ratio: f64,
    /// Fit an intercept.
    pub fit_intercept: bool,
    /// Epochs at most.
    pub max_iter: usize,
    /// Stop when `n_iter_no_change` epochs in a row improve by less than
    /// this; `None`: run `max_iter` epochs.
    pub tol: Option<f64>,
    /// Shuffle the rows each epoch (by tasks, then within them).
    pub shuffle: bool,
    /// Seed of the shuffles and of the held-out split.
    pub seed: u64,
    /// The learning rate's schedule.
    pub learning_rate: Schedule,
    /// Its initial value (constant, invscaling, adaptive).
    pub eta0: f64,
    /// invscaling's exponent.
    pub power_t: f64,
    /// Stop on the score of held-out rows instead of the training
    /// objective.
    pub early_stopping: bool,
    /// Share of rows held out for early stopping.
    pub validation_fraction: f64,
    /// Epochs without improvement before stopping.
    pub n_iter_no_change: usize,
    /// A model to go on from (scikit-learn's `partial_fit` and
    /// `warm_start`).
    pub warm: Option<SgdModel>,
    /// Classification: a weight per class (empty: 1 each). As
    /// scikit-learn's, it scales the updates on a binary model's
    /// positive rows (binary: its negative rows by class 0's).
    pub class_weight: Vec<f64>,
    /// Averaged SGD (scikit-learn's `average`): from the update that
    /// makes `t` reach this value on, keep the running mean of the
    /// weights, and fit to it once it has taken an update. 0: off.
    pub average: u64,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig {
            classes: 0,
            loss: Loss::SquaredError,
            penalty: Penalty::L2,
            alpha: 1e-4,
            l1_ratio: 0.15,
            fit_intercept: true,
            max_iter: 1000,
            tol: Some(1e-3),
            shuffle: true,
            seed: 0,
            learning_rate: Schedule::InvScaling,
            eta0: 0.01,
            power_t: 0.25,
            early_stopping: false,
            validation_fraction: 0.1,
            n_iter_no_change: 5,
            warm: None,
            class_weight: Vec::new(),
            average: 0,
        }
    }
}

/// The model: one binary (or regression) model per row of `w`, and the
/// state the updates and the stopping rule carry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SgdModel {
    /// Models.
    pub models: usize,
    /// Columns.
    pub dims: usize,
    /// Weights, `models x dims`.
    pub w: Vec<f64>,
    /// Intercepts.
    pub b: Vec<f64>,
    /// The L1 penalty applied to each weight so far.
    pub q: Vec<f64>,
    /// The L1 penalty each weight could have had so far.
    pub u: f64,
    /// Updates made, plus 1 (scikit-learn's `t_`).
    pub t: f64,
    /// The current learning rate (constant and adaptive).
    pub eta: f64,
    /// This epoch's training rows, loss and objective.
    count: u64,
    loss: f64,
    objective: f64,
    /// The stopping rule: the best objective or score, and the epochs in
    /// a row without improvement.
    best: f64,
    stale: usize,
    /// Whether the stopping rule stopped the fit.
    pub converged: bool,
    /// Averaged SGD's running means of the weights (`models x dims`) and
    /// of the intercepts; empty without averaging, zeros when it starts
    /// (as scikit-learn's `fit`; `partial_fit` carries them on).
    pub aw: Vec<f64>,
    /// See `aw`.
    pub ab: Vec<f64>,
    /// Epochs of this fit.
    epochs: usize,
}

impl SgdModel {
    /// A model of `models` rows of weights `w` (`models x dims`) and
    /// intercepts `b`, at step `t` (1 for a new one), with the L1
    /// penalty's state `q` (empty: none applied yet) and `u`, and the
    /// learning rate `eta` of the constant and adaptive schedules.
    pub fn resume(
        (models, dims): (usize, usize),
        (w, b): (Vec<f64>, Vec<f64>),
        (q, u): (Vec<f64>, f64),
        (t, eta): (f64, f64),
    ) -> Result<SgdModel> {
        if w.len() != models * dims || b.len() != models || !(q.is_empty() || q.len() == w.len()) {
            return Err(Error::Input(format!(
                "the initial model has {} weights and {} intercepts, {models} x {dims} and {models} are needed",
                w.len(),
                b.len()
            )));
        }
        let q = if q.is_empty() { vec![0.0; w.len()] } else { q };
        Ok(SgdModel {
            models,
            dims,
            w,
            b,
            q,
            u,
            t,
            eta,
            ..SgdModel::default()
        })
    }
}

/// What the updates read.
#[derive(Debug)]
pub struct Settings {
    cfg: SgdConfig,
    /// `t0` of the optimal schedule.
    optimal_init: f64,
    /// Rows whose hash falls under it are held out.
    held_out: u64,
}

impl Settings {
    fn is_held_out(&self, row: u64) -> bool {
        self.held_out > 0 && mix(self.cfg.seed ^ 0x5fd0_0e11, row) < self.held_out
    }
}

/// A fitted SGD model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SgdFit {
    /// Coefficients, `models x dims` (one model for regression or two
    /// classes).
    pub coef: Vec<f64>,
    /// Intercepts.
    pub intercept: Vec<f64>,
    /// Epochs run.
    pub n_iter: usize,
    /// Updates made, plus 1.
    pub t: f64,
    /// Whether the stopping rule ended the fit (else `max_iter` did).
    pub converged: bool,
    /// The model, to go on from.
    #[serde(skip)]
    pub model: SgdModel,
}

/// SGD on the job interface.
#[derive(Debug)]
pub struct Sgd {
    cfg: SgdConfig,
}

impl Sgd {
    /// A fit with these settings.
    pub fn new(cfg: SgdConfig) -> Sgd {
        Sgd { cfg }
    }

    fn check(&self, shape: &Shape) -> Result<()> {
        let c = &self.cfg;
        if shape.targets != 1 {
            return Err(Error::Input(format!(
                "SGD needs one target column, the targets have {}",
                shape.targets
            )));
        }
        let bad = |what: String| Err(Error::Input(what));
        if c.classes == 1 {
            return bad("a classifier needs at least 2 classes".into());
        }
        if !(c.alpha.is_finite() && c.alpha >= 0.0) {
            return bad(format!("alpha must be a number >= 0, not {}", c.alpha));
        }
        if c.learning_rate == Schedule::Optimal && c.alpha == 0.0 {
            return bad("alpha must be > 0 with the optimal learning rate".into());
        }
        if c.learning_rate != Schedule::Optimal && !(c.eta0.is_finite() && c.eta0 > 0.0) {
            return bad(format!("eta0 must be > 0, not {}", c.eta0));
        }
        if !(0.0..=1.0).contains(&c.l1_ratio) {
            return bad(format!("l1_ratio must be in [0, 1], not {}", c.l1_ratio));
        }
        if c.early_stopping && !(c.validation_fraction > 0.0 && c.validation_fraction < 1.0) {
            return bad(format!(
                "validation_fraction must be in (0, 1), not {}",
                c.validation_fraction
            ));
        }
        if !c.class_weight.is_empty() && c.class_weight.len() != c.classes {
            return bad(format!(
                "{} class weights for {} classes",
                c.class_weight.len(),
                c.classes
            ));
        }
        if c.max_iter == 0 || c.n_iter_no_change == 0 {
            return bad("max_iter and n_iter_no_change must be at least 1".into());
        }
        Ok(())
    }
}

/// The L1 and L2 shares of the penalty.
fn shares(c: &SgdConfig) -> (f64, f64) {
    match c.penalty {
        Penalty::None => (0.0, 0.0),
        Penalty::L2 => (0.0, 1.0),
        Penalty::L1 => (1.0, 0.0),
        Penalty::ElasticNet => (c.l1_ratio, 1.0 - c.l1_ratio),
    }
}

impl Online for Sgd {
    type Settings = Settings;
    type Model = SgdModel;
    type Fitted = SgdFit;

    fn describe(&self, shape: &Shape) -> String {
        match self.cfg.classes {
            0 => format!("SGD regression on {} columns", shape.dims),
            c => format!(
                "SGD classification of {c} classes on {} columns",
                shape.dims
            ),
        }
    }

    fn start(&mut self, shape: &Shape) -> Result<(Settings, SgdModel)> {
        self.check(shape)?;
        let c = &self.cfg;
        let models = if c.classes > 2 { c.classes } else { 1 };
        let d = shape.dims;
        let mut m = match &c.warm {
            Some(w) if w.models == models && w.dims == d => w.clone(),
            Some(w) => {
                return Err(Error::Input(format!(
                    "the model to go on from has {} x {} weights, the data needs {models} x {d}",
                    w.models, w.dims
                )))
            }
            None => SgdModel {
                models,
                dims: d,
                w: vec![0.0; models * d],
                b: vec![0.0; models],
                q: vec![0.0; models * d],
                u: 0.0,
                t: 1.0,
                eta: c.eta0,
                ..SgdModel::default()
            },
        };
        if c.average == 0 {
            (m.aw, m.ab) = (Vec::new(), Vec::new());
        } else if m.aw.len() != m.w.len() || m.ab.len() != m.b.len() {
            (m.aw, m.ab) = (vec![0.0; m.w.len()], vec![0.0; m.b.len()]);
        }
        m.best = f64::INFINITY;
        m.stale = 0;
        m.converged = false;
        m.epochs = 0;
        let typw = (1.0 / c.alpha.max(f64::MIN_POSITIVE).sqrt()).sqrt();
        let eta = typw / c.loss.gradient(1.0, -typw).max(1.0);
        let held_out = if c.early_stopping {
            (c.validation_fraction * u64::MAX as f64) as u64
        } else {
            0
        };
        let settings = Settings {
            cfg: c.clone(),
            optimal_init: 1.0 / (eta * c.alpha.max(f64::MIN_POSITIVE)),
            held_out,
        };
        Ok((settings, m))
    }

    fn shuffle(&self) -> Option<u64> {
        self.cfg.shuffle.then_some(self.cfg.seed)
    }

    fn update(s: &Settings, m: &mut SgdModel, rows: &Rows<'_>, order: &[u32]) {
        let kept: Vec<u32> = order
            .iter()
            .copied()
            .filter(|&i| !s.is_held_out(rows.first + u64::from(i)))
            .collect();
        let (t0, u0) = (m.t, m.u);
        let mut mine = kept.clone();
        let mut x = vec![0.0f64; rows.dims];
        for k in 0..m.models {
            // One against the rest: each class's model takes the rows in
            // its own order, as scikit-learn's (a shared order made the
            // models' last steps alike, and cost a point of accuracy).
            if s.cfg.shuffle && m.models > 1 {
                mine.copy_from_slice(&kept);
                let seed = mix(s.cfg.seed ^ 0x0c1a_55e5, (k as u64) << 48 ^ t0.to_bits());
                crate::job::shuffle(&mut mine, mix(seed, rows.first));
            }
            m.t = t0;
            m.u = u0;
            for &i in &mine {
                let i = i as usize;
                for (a, &v) in x
                    .iter_mut()
                    .zip(&rows.x[i * rows.dims..(i + 1) * rows.dims])
                {
                    *a = f64::from(v);
                }
                let sw = rows.w.get(i).map_or(1.0, |&w| f64::from(w));
                step(s, m, k, &x, (f64::from(rows.y[i]), sw));
                m.t += 1.0;
            }
        }
        m.count += kept.len() as u64;
    }

    fn values(m: &SgdModel) -> Vec<f64> {
        let mut v = Vec::with_capacity(m.w.len() * 2 + m.b.len() + m.aw.len() + m.ab.len() + 6);
        v.extend(&m.w);
        v.extend(&m.b);
        v.extend(&m.q);
        v.extend([m.u, m.t, m.eta, m.count as f64, m.loss, m.objective]);
        v.extend(&m.aw);
        v.extend(&m.ab);
        v
    }

    fn set_values(m: &mut SgdModel, v: &[f64]) {
        let (nw, nb) = (m.w.len(), m.b.len());
        let (naw, nab) = (m.aw.len(), m.ab.len());
        if v.len() != 2 * nw + nb + 6 + naw + nab {
            return;
        }
        let a = &v[2 * nw + nb + 6..];
        m.aw.copy_from_slice(&a[..naw]);
        m.ab.copy_from_slice(&a[naw..]);
        m.w.copy_from_slice(&v[..nw]);
        m.b.copy_from_slice(&v[nw..nw + nb]);
        m.q.copy_from_slice(&v[nw + nb..2 * nw + nb]);
        let r = &v[2 * nw + nb..];
        (m.u, m.t, m.eta, m.count, m.loss, m.objective) =
            (r[0], r[1], r[2], r[3] as u64, r[4], r[5]);
    }

    fn score_len(&self, _: &Settings) -> usize {
        if self.cfg.early_stopping {
            4
        } else {
            0
        }
    }

    fn score(state: &(std::sync::Arc<Settings>, SgdModel), rows: &Rows<'_>, out: &mut [f64]) {
        let (s, m) = (&state.0, &state.1);
        let d = rows.dims;
        let mut x = vec![0.0f64; d];
        for i in 0..rows.len() {
            if !s.is_held_out(rows.first + i as u64) {
                continue;
            }
            for (a, &v) in x.iter_mut().zip(&rows.x[i * d..(i + 1) * d]) {
                *a = f64::from(v);
            }
            let y = f64::from(rows.y[i]);
            let w = rows.w.get(i).map_or(1.0, |&w| f64::from(w));
            out[0] += w;
            if s.cfg.classes == 0 {
                let p = predict(m, 0, &x);
                out[1] += w * y;
                out[2] += w * y * y;
                out[3] += w * (y - p) * (y - p);
            } else if class_of(m, &x) == y as usize {
                out[1] += w;
            }
        }
    }

    fn end_epoch(
        &mut self,
        s: &Settings,
        m: &mut SgdModel,
        scores: Option<Vec<f64>>,
        epoch: usize,
    ) -> Result<bool> {
        if m.w.iter().chain(&m.b).any(|v| !v.is_finite()) {
            return Err(Error::Input(format!(
                "floating-point overflow at epoch {epoch}: the weights are not finite; scaling the data (StandardScaler) might help"
            )));
        }
        let train = m.count.max(1) as f64 * m.models as f64;
        // Lower is better: the objective, or minus the held-out score.
        let value = match scores {
            Some(v) if v[0] > 0.0 && s.cfg.classes > 0 => -(v[1] / v[0]),
            Some(v) if v[0] > 0.0 => {
                let total = v[2] - v[1] * v[1] / v[0];
                -(1.0 - if total > 0.0 { v[3] / total } else { 0.0 })
            }
            _ => m.objective / train,
        };
        if s.cfg.tol.is_some_and(|tol| value > m.best - tol) {
            m.stale += 1;
        } else {
            m.stale = 0;
        }
        m.best = m.best.min(value);
        m.epochs = epoch;
        (m.count, m.loss, m.objective) = (0, 0.0, 0.0);
        if m.stale >= s.cfg.n_iter_no_change {
            if s.cfg.learning_rate == Schedule::Adaptive && m.eta > 1e-6 {
                m.eta /= 5.0;
                m.stale = 0;
            } else {
                m.converged = true;
                return Ok(true);
            }
        }
        Ok(epoch >= s.cfg.max_iter)
    }

    fn finish(&mut self, s: &Settings, m: SgdModel) -> Result<SgdFit> {
        // scikit-learn's rule: the averages once they have taken an update.
        let averaged = s.cfg.average > 0 && s.cfg.average as f64 <= m.t - 1.0;
        let (coef, intercept) = match averaged {
            true => (m.aw.clone(), m.ab.clone()),
            false => (m.w.clone(), m.b.clone()),
        };
        Ok(SgdFit {
            coef,
            intercept,
            n_iter: m.epochs,
            t: m.t,
            converged: m.converged,
            model: m,
        })
    }
}

/// `w_k . x + b_k`.
fn predict(m: &SgdModel, k: usize, x: &[f64]) -> f64 {
    let w = &m.w[k * m.dims..(k + 1) * m.dims];
    w.iter().zip(x).map(|(a, b)| a * b).sum::<f64>() + m.b[k]
}

/// The predicted class of `x` (binary: 1 when the score is positive).
fn class_of(m: &SgdModel, x: &[f64]) -> usize {
    if m.models == 1 {
        return usize::from(predict(m, 0, x) > 0.0);
    }
    let mut best = (0, f64::NEG_INFINITY);
    for k in 0..m.models {
        let p = predict(m, k, x);
        if p > best.1 {
            best = (k, p);
        }
    }
    best.0
}

/// One row's update of model `k`: `label` is the row's class (or
/// target), `sw` its weight. Advances the L1 penalty's `u` (the caller
/// advances `t`).
fn step(s: &Settings, m: &mut SgdModel, k: usize, x: &[f64], (label, sw): (f64, f64)) {
    let c = &s.cfg;
    let (l1, l2) = shares(c);
    let eta = match c.learning_rate {
        Schedule::Optimal => 1.0 / (c.alpha * (s.optimal_init + m.t - 1.0)),
        Schedule::InvScaling => c.eta0 / m.t.powf(c.power_t),
        Schedule::Constant | Schedule::Adaptive => m.eta,
    };
    let d = m.dims;
    let y = match c.classes {
        0 => label,
        2 if label == 1.0 => 1.0,
        2 => -1.0,
        _ if label == k as f64 => 1.0,
        _ => -1.0,
    };
    let p = predict(m, k, x);
    let w = &mut m.w[k * d..(k + 1) * d];
    if !c.early_stopping {
        let loss = c.loss.loss(y, p);
        m.loss += loss;
        m.objective += loss;
        if c.penalty != Penalty::None {
            let (n2, n1) = w
                .iter()
                .fold((0.0, 0.0), |(a, b), v| (a + v * v, b + v.abs()));
            m.objective += c.alpha * (l2 * 0.5 * n2 + l1 * n1);
        }
    }
    let cw = match c.class_weight.len() {
        0 => 1.0,
        _ if c.classes == 2 => c.class_weight[usize::from(y > 0.0)],
        _ if y > 0.0 => c.class_weight.get(k).copied().unwrap_or(1.0),
        _ => 1.0,
    };
    let update = -eta * c.loss.gradient(y, p).clamp(-1e12, 1e12) * sw * cw;
    if l2 > 0.0 {
        let decay = (1.0 - l2 * eta * c.alpha).max(0.0);
        w.iter_mut().for_each(|v| *v *= decay);
    }
    if update != 0.0 {
        for (a, b) in w.iter_mut().zip(x) {
            *a += update * b;
        }
        if c.fit_intercept {
            m.b[k] += update;
        }
    }
    // The running mean takes every update from `t = average` on, before
    // the L1 truncation (as scikit-learn's).
    if c.average > 0 && c.average as f64 <= m.t {
        let n = m.t - c.average as f64 + 1.0;
        let aw = &mut m.aw[k * d..(k + 1) * d];
        for (a, &v) in aw.iter_mut().zip(w.iter()) {
            *a += (v - *a) / n;
        }
        m.ab[k] += (m.b[k] - m.ab[k]) / n;
    }
    if l1 > 0.0 {
        m.u += l1 * eta * c.alpha;
        let u = m.u;
        let q = &mut m.q[k * d..(k + 1) * d];
        for (wj, qj) in w.iter_mut().zip(q.iter_mut()) {
            let z = *wj;
            if z > 0.0 {
                *wj = (z - (u + *qj)).max(0.0);
            } else if z < 0.0 {
                *wj = (z + (u - *qj)).min(0.0);
            }
            *qj += *wj - z;
        }
    }
}
