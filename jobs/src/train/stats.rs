//! A training run's own statistics (the job's half of `--stats` and of
//! Python's `stats_`; the session adds its half, see
//! [`RunFigures`](crate::RunFigures)).

use serde::Serialize;

use super::{Iteration, Job, Solver, TrainConfig, Trained, TASK_ROWS};
use crate::ranks::Shards;

/// A training run's own figures.
#[derive(Clone, Debug, Serialize)]
pub struct TrainStats {
    /// "lbfgs" or "sgd".
    pub solver: &'static str,
    /// The inverse regularisation strength.
    pub c: f64,
    /// L-BFGS: the tolerance on the largest gradient component.
    pub tol: f64,
    /// Rows, every rank's.
    pub rows: u64,
    /// Columns.
    pub dims: usize,
    /// Classes.
    pub classes: usize,
    /// Rank 0's shard executors.
    pub shards: usize,
    /// L-BFGS reduction shards (the order of the sums; the unit spread
    /// over ranks).
    pub reduction_shards: usize,
    /// Local SGD: seconds per round.
    pub round_seconds: Vec<f64>,
    /// Held-out accuracy per round (local SGD) or per iteration (L-BFGS).
    pub accuracy: Vec<f64>,
    /// L-BFGS: one entry per iteration.
    pub iterations: Vec<Iteration>,
    /// L-BFGS: whether it converged.
    pub converged: Option<bool>,
    /// L-BFGS: why it stopped.
    pub stop: Option<&'static str>,
    /// L-BFGS: the final objective.
    pub objective: Option<f64>,
    /// L-BFGS: the final scaled loss.
    pub loss: Option<f64>,
    /// L-BFGS: the final largest gradient component.
    pub grad_max: Option<f64>,
    /// L-BFGS: passes made.
    pub evaluations: Option<usize>,
    /// The final model's held-out accuracy.
    pub final_accuracy: Option<f64>,
}

/// The final model's held-out accuracy (none without held-out rows).
pub fn final_accuracy(cfg: &TrainConfig, out: &Trained) -> Option<f64> {
    match &out.last {
        Some(it) => it.accuracy,
        None => out
            .rounds
            .last()
            .filter(|_| cfg.holdout > 0.0)
            .map(|r| r.accuracy),
    }
}

impl TrainStats {
    /// The figures of run `out` of `cfg` on `job`.
    pub fn new(cfg: &TrainConfig, job: &Job, out: &Trained) -> TrainStats {
        let last = out.last.as_ref();
        TrainStats {
            solver: match cfg.solver {
                Solver::Lbfgs => "lbfgs",
                Solver::Sgd => "sgd",
            },
            c: cfg.c,
            tol: cfg.tol,
            rows: job.rows,
            dims: job.dims,
            classes: job.classes,
            shards: job.shards.len(),
            reduction_shards: Shards::new(job.rows.div_ceil(TASK_ROWS as u64), cfg.shards).count(),
            round_seconds: out.rounds.iter().map(|r| r.seconds).collect(),
            accuracy: if out.rounds.is_empty() {
                out.iterations.iter().filter_map(|i| i.accuracy).collect()
            } else if cfg.holdout > 0.0 {
                out.rounds.iter().map(|r| r.accuracy).collect()
            } else {
                Vec::new()
            },
            iterations: out.iterations.clone(),
            converged: out.stop.map(|s| s.converged()),
            stop: out.stop.map(|s| s.describe()),
            objective: last.map(|i| i.objective),
            loss: last.map(|i| i.loss),
            grad_max: last.map(|i| i.grad_max),
            evaluations: last.map(|i| i.evaluations),
            final_accuracy: final_accuracy(cfg, out),
        }
    }
}
