//! The job interface: an algorithm declares what it computes from the
//! rows, the session's driver does the rest.
//!
//! ```text
//!   Algorithm (one per job: linear/, pca/)       the driver (this folder)
//!   ─────────────────────────────────────        ────────────────────────────
//!   start(shape)        ─► State                 load: rows (and targets,
//!   sums(state)         ─► length of a pass's          weights) into Columns
//!                          partial sums                 executors, this rank's
//!   task(state, rows, out)  one task's rows             shards, sweep declared
//!                          added into `out`      fit: one pass per State:
//!   step(state, sums)   ─► Step::Pass(next)            read tasks on every
//!                          or Step::Done(fit)           partition, per-task sums
//!                                                       added in task order,
//!                                                       shard by shard, then
//!                                                       across ranks in order;
//!                                                       the budget reserved
//!                                                       by name; progress
//! ```
//!
//! A *task* is a fixed block of [`Layout::task_rows`] global rows; tasks
//! are cut into [`Layout::shards`] shards, spread over the MPI ranks. A
//! pass adds the tasks' partial sums in task order within a shard and the
//! shards in shard order (`ShardSums`, as `ranks::Ranks::ordered_sum`): the result does
//! not depend on the cap, the partitions, the workers or the ranks, bit
//! for bit.
//!
//! ```
//! use outcore::Runtime;
//! use outcore_jobs::job::{self, Input, Layout};
//! use outcore_jobs::linear::{Linear, LinearConfig};
//! use outcore_jobs::{Session, Source};
//! # #[global_allocator]
//! # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
//!
//! let session = Session::new(Runtime::builder().build()?);
//! // 20,000 rows of 8 columns, their target a noisy linear function.
//! let x = Source::synthetic(20_000 * 8 * 4, 8, 4, 3);
//! let input = Input::synthetic_targets(&x, 1, 0.01);
//! let data = job::load(&session, &input, Layout::default(), 64 << 10, |_, _| {})?;
//! let mut alg = Linear::new(LinearConfig::default());
//! let (fit, run) = job::fit(&session, &data, &mut alg, |_| {})?;
//! assert_eq!(fit.coef.len(), 8);
//! assert_eq!(run.passes.len(), 2);
//! # Ok::<(), outcore_jobs::Error>(())
//! ```
//!
//! Files:
//!
//! - `mod.rs` (this file): the [`Algorithm`] trait and the types it sees;
//! - `data.rs`: the [`Columns`] executors and [`load`];
//! - `run.rs`: [`fit`], the passes and their ordered sums;
//! - `moments.rs`: the means and centred Gram passes least squares and
//!   PCA share;
//! - `linalg.rs`: float64 Gram matrices, Cholesky, symmetric eigenvalues.

mod data;
pub mod linalg;
pub mod moments;
mod online;
mod run;

use serde::Serialize;

use crate::error::Result;

pub use data::{load, Columns, Data, Input, Targets};
pub(crate) use online::shuffle;
pub use online::{fit_online, Online};
pub use run::{check, fit, Pass, RunStats};

/// The shape of a job's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Shape {
    /// Rows of the whole data (every rank's).
    pub rows: u64,
    /// Columns of the rows.
    pub dims: usize,
    /// Target columns (0 for an unsupervised job).
    pub targets: usize,
    /// Whether the rows carry sample weights.
    pub weighted: bool,
}

/// How the rows are cut into tasks and shards: the order of every sum,
/// so the results depend on it and on nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Rows per task (the unit whose partial sums are added in order).
    pub task_rows: u64,
    /// Shards the tasks are cut into: the unit spread over MPI ranks (at
    /// least one each).
    pub shards: usize,
}

impl Layout {
    /// The most ranks a job of `rows` rows can be spread over: one shard
    /// each (a growth's bound).
    pub fn most_ranks(&self, rows: u64) -> usize {
        crate::ranks::Shards::new(rows.div_ceil(self.task_rows.max(1)), self.shards).count()
    }
}

impl Default for Layout {
    fn default() -> Layout {
        Layout {
            task_rows: 4096,
            shards: 8,
        }
    }
}

/// One task's rows, as [`Algorithm::task`] sees them.
#[derive(Debug)]
pub struct Rows<'a> {
    /// Global index of the first row.
    pub first: u64,
    /// Columns.
    pub dims: usize,
    /// Row-major `len x dims` values.
    pub x: &'a [f32],
    /// Target columns (0 without targets).
    pub targets: usize,
    /// Row-major `len x targets` targets.
    pub y: &'a [f32],
    /// One sample weight per row; empty when there are none (each 1).
    pub w: &'a [f32],
}

impl Rows<'_> {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.x.len() / self.dims.max(1)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }
}

/// What a pass leads to.
#[derive(Debug)]
pub enum Step<S, F> {
    /// Another pass, over this state.
    Pass(S),
    /// The fit is done.
    Done(F),
}

/// One algorithm on the job interface: its passes over the rows and what
/// it makes of their sums. The driver ([`fit`]) runs each pass as one
/// read-only task per block of [`Layout::task_rows`] rows and adds their
/// partial sums in a fixed order.
///
/// Ordinary least squares without an intercept, in full:
///
/// ```
/// use outcore::Runtime;
/// use outcore_jobs::job::linalg::{add_gram, cholesky, cholesky_solve};
/// use outcore_jobs::job::{self, Algorithm, Input, Layout, Rows, Shape, Step};
/// use outcore_jobs::{Error, Result, Session, Source};
/// # #[global_allocator]
/// # static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();
///
/// struct Ols;
///
/// impl Algorithm for Ols {
///     type State = (); // what every task reads: nothing
///     type Fitted = Vec<f64>; // the coefficients
///
///     fn describe(&self, s: &Shape) -> String {
///         format!("least squares on {} columns", s.dims)
///     }
///     fn start(&mut self, _: &Shape) -> Result<()> {
///         Ok(())
///     }
///     // One pass: the Gram matrix of [x, y], (dims + 1)^2 values.
///     fn sums(&self, _: &(), s: &Shape) -> usize {
///         (s.dims + 1).pow(2)
///     }
///     fn most_sums(&self, s: &Shape) -> usize {
///         (s.dims + 1).pow(2)
///     }
///     fn task(_: &(), rows: &Rows<'_>, out: &mut [f64]) {
///         let z: Vec<f64> = (0..rows.len())
///             .flat_map(|i| {
///                 let x = &rows.x[i * rows.dims..(i + 1) * rows.dims];
///                 x.iter().chain([&rows.y[i]]).map(|&v| f64::from(v))
///             })
///             .collect();
///         add_gram(&z, rows.dims + 1, &[], out);
///     }
///     fn step(&mut self, _: (), g: Vec<f64>, s: &Shape) -> Result<Step<(), Vec<f64>>> {
///         let (d, n) = (s.dims, s.dims + 1);
///         let xx: Vec<f64> = (0..d).flat_map(|i| g[i * n..i * n + d].to_vec()).collect();
///         let mut b: Vec<f64> = (0..d).map(|i| g[i * n + d]).collect();
///         let l = cholesky(&xx, d, 0.0).ok_or_else(|| Error::Input("singular".into()))?;
///         cholesky_solve(&l, d, &mut b);
///         Ok(Step::Done(b))
///     }
/// }
///
/// let session = Session::new(Runtime::builder().build()?);
/// let x = Source::synthetic(10_000 * 4 * 4, 4, 2, 9);
/// let input = Input::synthetic_targets(&x, 1, 0.0);
/// let data = job::load(&session, &input, Layout::default(), 64 << 10, |_, _| {})?;
/// let (coef, run) = job::fit(&session, &data, &mut Ols, |_| {})?;
/// assert_eq!((coef.len(), run.passes.len()), (4, 1));
/// # Ok::<(), outcore_jobs::Error>(())
/// ```
pub trait Algorithm {
    /// What every task of a pass reads: the model so far, the pass's
    /// settings. Shared by the workers.
    type State: Send + Sync + 'static;
    /// The fitted model.
    type Fitted;

    /// The job, as a memory refusal and the progress name it: "ridge
    /// regression on 10 columns".
    fn describe(&self, shape: &Shape) -> String;

    /// Checks the data's shape and returns the first pass's state.
    fn start(&mut self, shape: &Shape) -> Result<Self::State>;

    /// Length of one task's partial sums under `state`.
    fn sums(&self, state: &Self::State, shape: &Shape) -> usize;

    /// Length of the largest pass's sums, for the check of the memory at
    /// the start ([`check`]).
    fn most_sums(&self, shape: &Shape) -> usize;

    /// The working memory of the step after the largest pass, besides
    /// that pass's sums (an eigendecomposition's workspace), and its name
    /// for a refusal. The step runs once the pass's partial sums are
    /// freed, so [`check`] checks it against the cap on its own. None by
    /// default: a step holds little beside the sums.
    fn step_memory(&self, _shape: &Shape) -> Option<(&'static str, u64)> {
        None
    }

    /// Adds one task's rows into `out` (`sums` values, zeros on entry).
    /// Runs on the workers; it must not fail (bad values are refused as
    /// the rows are read).
    fn task(state: &Self::State, rows: &Rows<'_>, out: &mut [f64]);

    /// The pass's sums (every rank's, added in order): the next pass or
    /// the fitted model.
    fn step(
        &mut self,
        state: Self::State,
        sums: Vec<f64>,
        shape: &Shape,
    ) -> Result<Step<Self::State, Self::Fitted>>;
}
