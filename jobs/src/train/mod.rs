//! A training job with its data and model state in executors: multinomial
//! logistic regression, by L-BFGS (the default) or by local SGD with model
//! averaging.
//!
//! ```text
//!   load(&session, ..) ─► Job: Shard executors (rows, held-out rows, a
//!        │                model replica) and the global-model executor
//!        ▼
//!   train(&session, &job, &cfg, on) ── cfg.solver picks the algorithm
//!        ├──► Solver::Lbfgs: one read-only pass per evaluation, partial
//!        │    sums added in task order ─► Event::Iteration
//!        └──► Solver::Sgd: local SGD on every replica (write tasks),
//!             averaged in shard order ─► Event::Round
//!        ▼
//!   Trained { model, .. } ─► predict(&session, &data, &model, ..)
//! ```
//!
//! **L-BFGS** ([`Solver::Lbfgs`]) minimises scikit-learn's objective for
//! `LogisticRegression(C=...)` with the multinomial loss,
//! `C * sum_i logloss_i + 0.5 * |W|^2` with the intercepts not penalised;
//! internally it is divided by `C * n` (as scikit-learn does), which
//! changes the scale of the gradient tolerance but not the minimum. Each
//! evaluation of the objective and its gradient is one pass of read-only
//! tasks over the shards, one task per block of [`TASK_ROWS`] global rows.
//! The tasks are grouped into [`TrainConfig::shards`] reduction shards;
//! the per-task partial sums are added per reduction shard in task order,
//! then across them in order ([`crate::ranks::Ranks::ordered_sum`]): the
//! model does not depend on the number of shard executors, the cap, the
//! timing or the number of MPI processes. The held-out accuracy of every
//! evaluated point is measured in the same pass. The L-BFGS curvature
//! pairs live in executors (see [`lbfgs`]).
//!
//! **Local SGD** ([`Solver::Sgd`]): each [`Shard`] executor also holds its
//! own model replica. A round sets every replica to the global model, runs
//! local SGD epochs on each shard (write tasks: the shards are dirty, so an
//! evicted shard is written back), averages the replicas in shard order
//! (weighted by rows, so the result does not depend on timing) and stores
//! the average in the global-model executor. Its result depends on the
//! number of shards.
//!
//! On a [`Session`] of several MPI ranks, [`load`] loads this rank's share
//! of the rows (the share depends on the solver) and [`train`] is
//! collective: every rank gets the same model, bit for bit the single
//! process's.
//!
//! Files:
//!
//! ```text
//!   mod.rs    public types (Model, Solver, TrainConfig, Job, Event, Trained), train, predict
//!   load.rs   the Shard executors and load: labels, classes, each rank's share
//!   sgd.rs    local SGD on the replicas and their averaging (Solver::Sgd)
//!   loss.rs   one task's log-loss, gradient and held-out hits (what L-BFGS minimises)
//!   lbfgs.rs  the L-BFGS optimiser over executors and its driver on a Job (Solver::Lbfgs)
//! ```

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use outcore::{Handle, PodVec};

use crate::error::{Error, Result};
use crate::ranks::Ranks;
use crate::session::Session;

mod kernel;
pub mod lbfgs;
mod load;
mod loss;
pub mod owlqn;
mod quasi;
mod sgd;
mod stats;

pub use load::{load, rank_rows, Shard, Targets};
pub use stats::{final_accuracy, TrainStats};

/// Rows per L-BFGS task: the unit whose partial sums are added in order.
/// Shards hold whole tasks (see [`aligned_shard_bytes`]).
pub const TASK_ROWS: usize = 2048;

/// The most ranks a job under `cfg` can be spread over (`rows` of `dims`
/// columns in shards of `shard_bytes`): one reduction shard each
/// (L-BFGS), one shard executor each (local SGD). A growth's bound.
pub fn spread_limit(cfg: &TrainConfig, rows: u64, dims: usize, shard_bytes: u64) -> usize {
    match cfg.solver {
        Solver::Lbfgs => {
            crate::ranks::Shards::new(rows.div_ceil(TASK_ROWS as u64), cfg.shards).count()
        }
        Solver::Sgd => {
            let per = (shard_bytes / (4 * dims as u64 + 4)).max(1);
            usize::try_from(rows.div_ceil(per)).unwrap_or(usize::MAX)
        }
    }
}

/// Shard size in bytes for `bytes` of `dims`-wide labelled rows, rounded
/// to a whole number of [`TASK_ROWS`] tasks (at least one), so that tasks
/// never straddle shards and the result does not depend on the sharding.
pub fn aligned_shard_bytes(bytes: u64, dims: usize) -> u64 {
    let row = 4 * dims as u64 + 4;
    let task = TASK_ROWS as u64 * row;
    (bytes / task).max(1) * task
}

/// A linear model: `classes x (dims + 1)` weights, the last column the bias.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Model {
    /// Classes.
    pub classes: u32,
    /// Input dimensions.
    pub dims: u32,
    /// Row-major weights.
    pub w: PodVec<f32>,
}

impl Model {
    /// Rows of weights a model of `classes` classes has under `cfg`: one
    /// for scikit-learn's binary model, else one per class.
    pub fn rows(classes: usize, cfg: &TrainConfig) -> usize {
        if cfg.binary && classes == 2 {
            1
        } else {
            classes
        }
    }

    /// A zero model.
    pub fn zeros(classes: usize, dims: usize) -> Model {
        Model {
            classes: classes as u32,
            dims: dims as u32,
            w: PodVec::from(vec![0.0; classes * (dims + 1)]),
        }
    }

    /// Writes the class scores of `x` into `out`.
    fn scores(&self, x: &[f32], out: &mut [f32]) {
        let d = self.dims as usize;
        for (c, o) in out.iter_mut().enumerate() {
            let w = &self.w[c * (d + 1)..(c + 1) * (d + 1)];
            let mut s = w[d];
            for (a, b) in w[..d].iter().zip(x) {
                s += a * b;
            }
            *o = s;
        }
    }

    /// The predicted class of `x`.
    pub fn predict(&self, x: &[f32], scratch: &mut [f32]) -> u32 {
        self.scores(x, scratch);
        let mut best = 0;
        for c in 1..scratch.len() {
            if scratch[c] > scratch[best] {
                best = c;
            }
        }
        best as u32
    }
}

/// How the model is fitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Solver {
    /// L-BFGS on scikit-learn's objective (see the module docs).
    Lbfgs,
    /// Local SGD with model averaging.
    Sgd,
}

/// Training settings.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The solver.
    pub solver: Solver,
    /// L-BFGS: inverse regularisation strength (scikit-learn's `C`).
    pub c: f64,
    /// L-BFGS: stop when the largest gradient component of the scaled
    /// objective is at most this (scikit-learn's `tol`).
    pub tol: f64,
    /// L-BFGS: iteration limit (scikit-learn's `max_iter`).
    pub max_iter: usize,
    /// Rounds of local SGD plus averaging.
    pub rounds: usize,
    /// Local epochs per round.
    pub local_epochs: usize,
    /// Learning rate.
    pub lr: f32,
    /// Mini-batch size of the local SGD.
    pub batch: usize,
    /// Fraction of rows held out for evaluation.
    pub holdout: f64,
    /// Seed (the held-out split).
    pub seed: u64,
    /// L-BFGS: shards the tasks are cut into, the unit of the reductions'
    /// order and of the split among processes (at least the number of
    /// processes). The model depends on it, never on the number of
    /// processes.
    pub shards: usize,
    /// L-BFGS: fit the intercepts (else they stay 0).
    pub fit_intercept: bool,
    /// L-BFGS: the penalty on the weights.
    pub penalty: Penalty,
    /// L-BFGS with two classes: scikit-learn's binary model, one row of
    /// weights for class 1 (class 0's score is 0), instead of the two-row
    /// softmax.
    pub binary: bool,
    /// L-BFGS: the start point (`rows x (dims + 1)` weights, the bias last;
    /// zeros when none), as scikit-learn's `warm_start`.
    pub start: Option<Vec<f64>>,
}

/// The penalty L-BFGS adds to the log-loss (the intercepts never
/// penalised), scaled by `1 / C` against `sum(log-loss)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Penalty {
    /// `0.5 * |W|^2`.
    L2,
    /// scikit-learn's elastic net with `l1_ratio` `r` in `[0, 1]`:
    /// `r * |W|_1 + (1 - r) * 0.5 * |W|^2` (1 is the L1 penalty), fitted
    /// by OWL-QN ([`owlqn`]).
    ElasticNet(f64),
    /// None: `C` plays no part.
    None,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            solver: Solver::Lbfgs,
            c: 1.0,
            tol: 1e-4,
            max_iter: 100,
            rounds: 5,
            local_epochs: 1,
            lr: 0.05,
            batch: 64,
            holdout: 0.1,
            seed: 42,
            shards: 8,
            fit_intercept: true,
            penalty: Penalty::L2,
            binary: false,
            start: None,
        }
    }
}

/// A loaded training job.
#[derive(Debug)]
pub struct Job {
    /// The shards.
    pub shards: Vec<Handle<Shard>>,
    /// Training rows per shard (for weighting the average).
    pub weights: Vec<u64>,
    /// L-BFGS tasks per shard.
    pub tasks: Vec<usize>,
    /// The global model.
    pub global: Handle<Model>,
    /// Classes.
    pub classes: usize,
    /// Columns.
    pub dims: usize,
    /// Rows of the whole data.
    pub rows: u64,
    /// Global index of the first row held here (0 unless the job holds
    /// one process's share of the rows).
    pub first_row: u64,
    /// Rows in each shard.
    pub shard_rows: Vec<u32>,
    /// Whether the rows have sample weights.
    pub weighted: bool,
}

/// One round's report.
#[derive(Clone, Debug)]
pub struct Round {
    /// Round index (from 0).
    pub index: usize,
    /// Seconds it took.
    pub seconds: f64,
    /// Held-out accuracy after the round.
    pub accuracy: f64,
}

/// One L-BFGS iteration's report (one entry of the statistics'
/// `iterations`, without its index).
#[derive(Clone, Debug, Serialize)]
pub struct Iteration {
    /// Iteration index (from 1).
    #[serde(skip)]
    pub index: usize,
    /// Seconds it took.
    pub seconds: f64,
    /// The objective scaled as scikit-learn minimises it:
    /// `mean logloss + |W|^2 / (2 C n)`.
    pub loss: f64,
    /// The objective as `C * sum logloss + 0.5 * |W|^2`.
    pub objective: f64,
    /// Largest component of the scaled objective's gradient.
    pub grad_max: f64,
    /// Held-out accuracy of the new model (none without held-out rows).
    pub accuracy: Option<f64>,
    /// Passes over the data this iteration made (line-search trials).
    pub evaluations: usize,
}

/// The outcome of training.
#[derive(Clone, Debug)]
pub struct Trained {
    /// The final global model.
    pub model: Model,
    /// Per-round reports (local SGD).
    pub rounds: Vec<Round>,
    /// Per-iteration reports (L-BFGS).
    pub iterations: Vec<Iteration>,
    /// Why L-BFGS stopped (none for local SGD).
    pub stop: Option<lbfgs::Stop>,
    /// L-BFGS: the model's weights in float64, as found (empty for local
    /// SGD).
    pub weights: Vec<f64>,
    /// L-BFGS: the final objective, its gradient's largest component and
    /// the held-out accuracy (at the start point when no step was taken).
    pub last: Option<Iteration>,
}

/// What training reports as it goes.
#[derive(Clone, Debug)]
pub enum Event {
    /// Local SGD: a round of local epochs and averaging ended.
    Round(Round),
    /// L-BFGS: an iteration ended.
    Iteration(Iteration),
}

/// This rank's share of the rows, on more than one rank: the first row,
/// the end, and the rows per shard executor.
type Share = (u64, u64, u64);

/// What a solver brings: the rows each rank loads, and the fit.
struct Algorithm {
    /// This rank's share of the `rows` rows of `dims` columns, in shards of
    /// about `shard_bytes` (on more than one rank).
    share: fn(
        rows: u64,
        dims: usize,
        shard_bytes: u64,
        cfg: &TrainConfig,
        ranks: &Ranks,
    ) -> Result<Share>,
    /// Fits the model of a loaded job, reporting each step to `on`.
    /// Collective.
    fit: Fit,
}

/// A solver's fit of a loaded job, reporting each step.
type Fit = fn(&Session, &Job, &TrainConfig, on: &mut dyn FnMut(&Event)) -> Result<Trained>;

impl Solver {
    /// The solver's algorithm: the one place a solver is chosen.
    fn algorithm(self) -> Algorithm {
        match self {
            Solver::Lbfgs => Algorithm {
                share: lbfgs::share,
                fit: lbfgs::fit,
            },
            Solver::Sgd => Algorithm {
                share: sgd::share,
                fit: sgd::fit,
            },
        }
    }
}

/// Trains the job with the solver `cfg.solver` names (see the module
/// docs); `on` is called after every round (local SGD) or iteration
/// (L-BFGS). On a session of several ranks it is collective (the job
/// loaded by [`load`] on the same session and `cfg`): every rank gets the
/// same model, bit for bit the single process's.
pub fn train(
    session: &Session,
    job: &Job,
    cfg: &TrainConfig,
    mut on: impl FnMut(&Event),
) -> Result<Trained> {
    if cfg.solver == Solver::Sgd {
        let lbfgs_only = [
            (job.weighted, "sample weights"),
            (!cfg.fit_intercept, "a model without intercepts"),
            (cfg.penalty != Penalty::L2, "a penalty other than L2"),
            (cfg.binary, "the binary model"),
            (cfg.start.is_some(), "a start point"),
        ];
        if let Some((_, what)) = lbfgs_only.iter().find(|(set, _)| *set) {
            return Err(Error::Input(format!(
                "local SGD does not take {what}; L-BFGS does"
            )));
        }
    }
    (cfg.solver.algorithm().fit)(session, job, cfg, &mut on)
}

/// Training rows of all the ranks (integers: exact in any order); an
/// error when the held-out split left none. Collective.
fn training_rows(job: &Job, ranks: &Ranks) -> Result<u64> {
    let local: u64 = job.weights.iter().sum();
    let n = ranks.ordered_sum(&[vec![local as f64]], 1)?[0] as u64;
    if n == 0 {
        return Err(Error::Input(
            "no training rows left after the held-out split".into(),
        ));
    }
    Ok(n)
}

/// Labels every row of `ds` with the model's class (the largest score
/// `w_c . x + b_c`, ties to the lowest class), sweeping the data in order.
/// `on_block` receives the labels of consecutive blocks of rows, in row
/// order, so the caller can stream them out.
pub fn predict(
    session: &Session,
    ds: &crate::kmeans::Dataset,
    model: &Model,
    mut on_block: impl FnMut(&[u32]) -> Result<()>,
) -> Result<()> {
    if model.dims as usize != ds.dims {
        return Err(Error::Input(format!(
            "the model has {} features, the data has {} columns",
            model.dims, ds.dims
        )));
    }
    let rt = session.runtime();
    let shared = Arc::new(model.clone());
    let group = (rt.workers() * 2).max(1);
    for hs in ds.parts.chunks(group) {
        let mut b = rt.batch();
        for h in hs {
            let m = shared.clone();
            b.read(h, move |p: &crate::kmeans::Partition| {
                model_labels(&m, p.values(), p.rows as usize)
            });
        }
        for labels in b.run()? {
            on_block(&labels)?;
        }
    }
    Ok(())
}

/// The model's class for each of the `rows` rows of `x`.
fn model_labels(m: &Model, x: &[f32], rows: usize) -> Vec<u32> {
    const BLOCK: usize = 256;
    let d = m.dims as usize;
    let classes = m.classes as usize;
    let stride = d + 1;
    let mut out = Vec::with_capacity(rows);
    let mut z = vec![0f32; BLOCK.min(rows.max(1)) * classes];
    let mut row = 0;
    while row < rows {
        let n = BLOCK.min(rows - row);
        let xb = &x[row * d..(row + n) * d];
        // SAFETY:
        // - `xb` holds n*d floats, row stride d, column stride 1;
        // - W^T (d x classes) is read from `m.w` (classes*(d+1) floats)
        //   with row stride 1 and column stride d+1, never reaching the
        //   bias column;
        // - `z` holds at least n*classes floats, row stride classes;
        //   beta = 0, so its contents are not read; nothing aliases.
        unsafe {
            matrixmultiply::sgemm(
                n,
                d,
                classes,
                1.0,
                xb.as_ptr(),
                d as isize,
                1,
                m.w.as_ptr(),
                1,
                stride as isize,
                0.0,
                z.as_mut_ptr(),
                classes as isize,
                1,
            );
        }
        for zr in z[..n * classes].chunks_exact(classes) {
            let mut best = 0;
            let mut best_s = f32::NEG_INFINITY;
            for (c, &v) in zr.iter().enumerate() {
                let s = v + m.w[c * stride + d];
                if s > best_s {
                    best_s = s;
                    best = c;
                }
            }
            out.push(best as u32);
        }
        row += n;
    }
    out
}
