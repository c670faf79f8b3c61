//! Memory-capped K-means on the outcore runtime: mini-batch (the default)
//! and Lloyd.
//!
//! The data lives in [`Partition`] executors, swept in a fixed cyclic
//! order (declared to the runtime with `hint_cycle`), so the eviction queue
//! keeps a fixed part of the data resident and prefetches the rest.
//! Partitions are only read, so after their first write they are evicted
//! clean (dropped, not rewritten).
//!
//! Distances use the GEMM identity `|x - c|^2 = |x|^2 - 2 x.c + |c|^2`:
//! on CPUs with AVX2 and FMA a kernel that keeps each block of dot
//! products in registers and takes the argmin on the spot (`kernel`),
//! elsewhere matrixmultiply's `sgemm`. Each task returns per-cluster sums and counts
//! for its rows. The tasks (blocks of `task_points` global rows) are cut
//! into [`Config::shards`] shards of consecutive tasks; a step adds its
//! tasks' sums shard by shard, in task order, then the shards' sums in
//! shard order ([`Ranks::ordered_sum`](crate::ranks::Ranks::ordered_sum)),
//! so results are bit-for-bit the same whatever the cap, the policy, the
//! timing or the number of processes the shards are spread over (the
//! session's ranks: see [`run`]).
//!
//! A mini-batch step takes `batch_tasks / shards` consecutive tasks from
//! every shard (the batch spans the data, so every process has work in
//! every step), and an epoch walks the shards side by side.
//!
//! **Empty clusters**: a centre that receives no point in a Lloyd
//! iteration moves onto the point farthest from its centre, as
//! scikit-learn's (`relocate.rs`); in a mini-batch step it keeps its
//! position.
//!
//! ```text
//!   load ─► run: validate, plan ─► for each initialisation: run_once
//!                                    init::initial_centers
//!                                    Solver::pass × epochs/iterations
//!                                      (MiniBatch | Lloyd, each sweeping
//!                                       assign tasks over the plan)
//!                                    final_pass: inertia, labels
//! ```
//!
//! **Labels** ([`run_with_labels`]) are never held whole: the final pass
//! then takes the tasks in row order and hands each task's labels to the
//! caller as it finishes, which writes them out.
//!
//! Files, one concept each:
//!
//! - `mod.rs`: the public types ([`Config`], [`Outcome`]...), [`run`], [`run_with_labels`], [`predict`], the driver.
//! - `data.rs`: [`Partition`], [`Dataset`] and [`load`] (a rank's shards, through the input layer).
//! - `shards.rs`: rows into tasks, tasks into shards, shards among ranks; the segments a rank loads.
//! - `plan.rs`: this process's tasks in its partitions (`Plan`) and the order of its passes.
//! - `assign.rs`: a task's nearest centres, sums and labels; the sweep that folds them in order.
//! - `kernel/`: the fused AVX2/FMA (and AVX-512) distance and argmin kernel.
//! - `minibatch.rs`: mini-batch epochs: the running-mean update and early stopping.
//! - `lloyd.rs`: Lloyd iterations: centres to the means, the tolerance from the data's variance.
//! - `label.rs`: the final pass (inertia, labels) and [`predict`].
//! - `init.rs`: the initial centres (k-means++, random or given) and the sample they come from.
//! - `parallel.rs`: k-means|| initial centres, drawn over passes of all the rows.

mod assign;
mod budget;
mod data;
mod fold;
mod init;
mod kernel;
mod label;
mod lloyd;
mod minibatch;
mod parallel;
mod plan;
mod prune;
mod reassign;
mod relocate;
mod shards;
mod sqdist;
mod stats;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub use data::{Dataset, Partition};
pub use init::init_sample_bytes;
pub use label::predict;
pub use shards::{rank_rows, shards};
pub use stats::{Delta, KmeansStats, Loaded, Traffic};

pub(crate) use self::assign::label_rows;
use self::assign::Packed;
use self::budget::Needs;
use self::fold::Summing;
use self::lloyd::Lloyd;
use self::minibatch::MiniBatch;
use self::plan::{Chunk, Plan};
use crate::error::{Error, Result};
use crate::input::{mix, Source};
use crate::{Session, Workers};
use outcore::Runtime;

/// The centres, shared read-only with tasks.
#[derive(Clone, Debug, PartialEq)]
pub struct Centers {
    /// Number of centres.
    pub k: usize,
    /// Dimensions.
    pub dims: usize,
    /// Row-major `k x dims`.
    pub values: Vec<f32>,
    norms: Vec<f32>,
    /// The centres packed for the fused kernel, on CPUs that run it.
    packed: Option<kernel::Panels>,
}

impl Centers {
    /// Centres from row-major values.
    pub fn new(k: usize, dims: usize, values: Vec<f32>) -> Centers {
        let mut c = Centers {
            k,
            dims,
            values,
            norms: Vec::new(),
            packed: None,
        };
        c.refresh();
        c
    }

    /// The norms and the kernel's panels again, after `values` changed,
    /// in the memory they had: a step moves centres as large as a
    /// partition at the seed's shape, and packs them every time.
    fn refresh(&mut self) {
        let squares = |c: &[f32]| c.iter().map(|x| x * x).sum::<f32>();
        self.norms.clear();
        self.norms
            .extend(self.values.chunks_exact(self.dims.max(1)).map(squares));
        let reuse = self.packed.take().map(kernel::Panels::into_data);
        self.packed = kernel::Panels::new_in(
            self.k,
            self.dims,
            &self.values,
            &self.norms,
            reuse.unwrap_or_default(),
        );
    }

    /// No centres: what a run's centres are while its tasks hold them.
    fn empty() -> Centers {
        Centers {
            k: 0,
            dims: 0,
            values: Vec::new(),
            norms: Vec::new(),
            packed: None,
        }
    }

    /// Centre `c`.
    pub fn row(&self, c: usize) -> &[f32] {
        &self.values[c * self.dims..(c + 1) * self.dims]
    }
}

/// Lends `centers` to `f` as the `Arc` its tasks share, without a copy
/// (they are as large as a partition at the seed's shape), and takes them
/// back: the tasks are done when `f` returns.
fn lend<T>(centers: &mut Centers, f: impl FnOnce(&Arc<Centers>) -> T) -> T {
    let shared = Arc::new(std::mem::replace(centers, Centers::empty()));
    let out = f(&shared);
    *centers = Arc::try_unwrap(shared).unwrap_or_else(|a| (*a).clone());
    out
}

/// Partition size in bytes for `part_bytes` of `dims`-wide rows, rounded to
/// a whole number of tasks of `task_points` rows (at least one). Tasks then
/// never straddle partitions, so the tasks, and the results, are the same
/// whatever the partition size.
pub fn aligned_partition_bytes(part_bytes: u64, dims: usize, task_points: usize) -> u64 {
    let row = 4 * dims.max(1) as u64;
    let tp = task_points.max(1) as u64;
    let rows = (part_bytes / row).max(1);
    (rows / tp).max(1) * tp * row
}

/// The worker threads to start for a run of `cfg` on `rows` x `dims` of
/// data, in partitions of about `part_bytes`, under `cap`, on rank `rank`
/// of `ranks`, `wanted` being asked for: as many as the cap holds beside
/// the run's fixed working memory (see [`Workers`]).
///
/// ```
/// use outcore_jobs::kmeans::{self, Config};
///
/// let cfg = Config { k: 16, ..Config::default() };
/// // 256 MiB of 64-D points under a 64 MiB cap, in 1 MiB partitions.
/// let w = kmeans::workers((1 << 20, 64), &cfg, 1 << 20, Some(64 << 20), (0, 1), 256);
/// assert!(w.run < 256);
/// ```
pub fn workers(
    (rows, dims): (u64, usize),
    cfg: &Config,
    part_bytes: u64,
    cap: Option<u64>,
    (rank, ranks): (usize, usize),
    wanted: usize,
) -> Workers {
    let (fixed, task) = budget::worker_bytes((rows, dims), cfg, part_bytes, cap, (rank, ranks));
    Workers::plan(cap, fixed, task, wanted)
}

/// The worker threads to start for [`predict`] with `k` centres on
/// `dims` columns, in partitions of about `part_bytes` labelled
/// `task_points` rows at a time, under `cap` (see [`Workers`]).
pub fn predict_workers(
    (k, dims): (usize, usize),
    part_bytes: u64,
    task_points: usize,
    cap: Option<u64>,
    wanted: usize,
) -> Workers {
    let (fixed, task) = predict_memory((k, dims), part_bytes, task_points);
    Workers::plan(cap, fixed, task, wanted)
}

/// What labelling holds whatever its workers (the centres, the kernel's
/// copy and their norms), and what each task holds (a partition of
/// `part_bytes`, its norms, and a task's labels, distances and distance
/// tiles), in bytes, for `k` centres of `dims` dimensions.
pub fn predict_memory(
    (k, dims): (usize, usize),
    part_bytes: u64,
    task_points: usize,
) -> (u64, u64) {
    let (k, d) = (k as u64, dims.max(1) as u64);
    let fixed = 8 * k * d + 8 * k;
    let part_rows = (part_bytes / (4 * d)).max(1);
    let task = part_rows * (4 * d + 4) + task_points as u64 * (4 * k + 8);
    (fixed, task)
}

/// Streams `src` into partitions of about `part_bytes` each, declared to
/// the runtime as the sweep order, and counts their reads from the input
/// in the session ([`Session::add_reads`]). Synthetic data is generated by
/// the runtime's workers, in parallel, one task per partition. `progress`
/// is called with the rows loaded so far and the total.
///
/// `weights`: the rows' sample weights, a 1-D float32/float64 `.npy`, one
/// finite weight >= 0 per row, not all 0, checked before any partition is
/// built. Each partition holds its rows' weights, read with them (and read
/// again with them after an eviction).
///
/// `cfg`: the run the data is for. Given, the session's rank loads its
/// shards of the tasks under `cfg` only (see [`rank_rows`]), each
/// partition read (or generated) from its own rows only, and cut shard by
/// shard so that a mini-batch's share of a shard is whole partitions.
/// Sources that can only be read whole and in order (standard input,
/// compressed `.npz` members) cannot be split among ranks. `None`: every
/// row, in partitions of `part_bytes` (to [`predict`], or
/// for runs of any configuration on one process).
///
/// Under a cap, a run whose working memory (see `budget.rs`) does not fit
/// stops here, before anything is read, with one line that says how much
/// it needs; a mini-batch run's partitions are made small enough that
/// every shard's current one fits at once.
pub fn load(
    session: &Session,
    src: &Source,
    weights: Option<&Path>,
    cfg: Option<&Config>,
    part_bytes: u64,
    progress: impl FnMut(u64, u64),
) -> Result<Dataset> {
    let part_bytes = match cfg {
        Some(cfg) => budget::plan(session, src, cfg, part_bytes)?,
        None => part_bytes,
    };
    data::load(session, src, weights, cfg, part_bytes, progress)
}

/// Which algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Mini-batch K-means: batches of tasks, centres updated after each
    /// batch with per-centre learning rates 1/count.
    MiniBatch,
    /// Lloyd: full passes; centres become the means of their points.
    Lloyd,
}

/// How the centres start.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// k-means++ seeding on a sample of the data.
    KMeansPlusPlus,
    /// k distinct points of a sample, chosen at random.
    Random,
    /// k-means|| (Bahmani et al.): candidates drawn over a few passes of
    /// all the rows, then a weighted k-means++ over them (`parallel.rs`).
    KMeansParallel,
    /// Given centres (`k x dims`).
    Given(Vec<f32>),
}

/// K-means settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of clusters.
    pub k: usize,
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Initialisation.
    pub init: Init,
    /// Mini-batch: epochs (sweeps over the data), at most.
    pub epochs: usize,
    /// Lloyd: iterations (full passes), at most.
    pub iterations: usize,
    /// Mini-batch: tasks per batch.
    pub batch_tasks: usize,
    /// Mini-batch: points per task.
    pub task_points: usize,
    /// Seed for the initialisation.
    pub seed: u64,
    /// Convergence tolerance, relative to the data's mean per-feature
    /// variance, as scikit-learn's `tol`. Lloyd stops when the squared
    /// shift of the centres in an iteration is at most `tol` times that
    /// variance (it always stops when they no longer move); mini-batch
    /// stops when a step moves them that little (0: never).
    pub tol: f64,
    /// Mini-batch: stop after this many steps in a row that do not lower
    /// the smoothed batch inertia (scikit-learn's `max_no_improvement`);
    /// `None`: never.
    pub max_no_improvement: Option<usize>,
    /// Mini-batch: centres whose accumulated weight falls under this
    /// share of the largest move onto rows of the batch (scikit-learn's
    /// `reassignment_ratio`; 0: never). See `reassign.rs`.
    pub reassignment_ratio: f64,
    /// Runs from different initialisations (the first from `seed`); the
    /// one with the lowest final inertia is kept.
    pub n_init: usize,
    /// Shards the tasks are cut into (at most the number of tasks, and for
    /// mini-batch at most `batch_tasks`, are used): the unit of the reductions' order and of the
    /// split among processes, so at least the number of processes. The
    /// results depend on it, never on the number of processes. A
    /// mini-batch takes `batch_tasks / shards` consecutive tasks from each
    /// shard (with one shard, `batch_tasks` consecutive tasks). Load with
    /// [`load`] given the configuration, which cuts the partitions shard by
    /// shard to fit the batches: under a cap, 8 shards then read as little
    /// per epoch as 1.
    pub shards: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            k: 100,
            algorithm: Algorithm::MiniBatch,
            init: Init::KMeansPlusPlus,
            epochs: 3,
            iterations: 10,
            batch_tasks: 40,
            task_points: 1100,
            seed: 0,
            tol: 0.0,
            max_no_improvement: None,
            reassignment_ratio: 0.01,
            n_init: 1,
            shards: 8,
        }
    }
}

/// Why a run stopped before its last epoch or iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Converged {
    /// The centres moved less than the tolerance (or not at all).
    CenterShift,
    /// Mini-batch: the smoothed batch inertia stopped improving.
    NoImprovement,
}

impl Converged {
    /// A short description for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Converged::CenterShift => "centre shift within tolerance",
            Converged::NoImprovement => "no improvement of the smoothed batch inertia",
        }
    }
}

/// Progress events, for the command line's bar and summary lines.
#[derive(Clone, Debug)]
pub enum Event {
    /// A run from a new initialisation starts (with more than one).
    Run {
        /// Its index (from 0).
        index: usize,
        /// Runs in all.
        of: usize,
    },
    /// The initial centres are chosen.
    Initialized {
        /// Seconds it took.
        seconds: f64,
    },
    /// Work within an epoch: `done` of `total` points.
    Progress {
        /// Points done.
        done: u64,
        /// Points in the epoch.
        total: u64,
    },
    /// An epoch (or Lloyd iteration) finished, or stopped early.
    Epoch {
        /// Its index (from 0).
        index: usize,
        /// Seconds it took.
        seconds: f64,
        /// Inertia: for mini-batch the sum over the epoch's batches at
        /// assignment time; for Lloyd the inertia before the update.
        inertia: f64,
    },
    /// The run converged after the epoch or iteration just reported.
    Converged {
        /// Mini-batch steps (batches) made so far.
        steps: usize,
        /// Why.
        why: Converged,
    },
    /// Mini-batch: light centres moved onto rows of the batch just made.
    Reassigned {
        /// How many.
        centres: usize,
    },
    /// The last pass over the data starts: the final inertia (and the
    /// labels, with [`run_with_labels`]).
    FinalPass,
    /// A run finished, with its final inertia (with more than one run).
    RunDone {
        /// Its index (from 0).
        index: usize,
        /// Inertia of its final centres over all the data.
        inertia: f64,
    },
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Final centres.
    pub centers: Centers,
    /// Inertia of the final centres over all the data.
    pub inertia: f64,
    /// Seconds per epoch or iteration.
    pub epoch_seconds: Vec<f64>,
    /// Inertia per epoch or iteration (see [`Event::Epoch`]).
    pub epoch_inertia: Vec<f64>,
    /// Per epoch or iteration: seconds the tasks of this process spent in
    /// the distance kernel (finding each row's nearest centre), summed over
    /// the worker threads. Divided by the workers, it is the kernel's share
    /// of the epoch; the rest is the centre sums, the updates and the
    /// loads.
    pub epoch_kernel_seconds: Vec<f64>,
    /// Epochs (mini-batch) or iterations (Lloyd) run.
    pub iterations: usize,
    /// Mini-batch steps (batches) run.
    pub steps: usize,
    /// Why the run stopped early, if it did.
    pub converged: Option<Converged>,
    /// Which initialisation the outcome comes from (from 0).
    pub best_init: usize,
    /// The final inertia of every initialisation's run.
    pub init_inertia: Vec<f64>,
    /// Seconds spent adding the shards' sums across processes
    /// ([`Ranks::ordered_sum`](crate::ranks::Ranks::ordered_sum)) in the
    /// steps of the kept run.
    pub combine_seconds: f64,
    /// Combines made (one per step).
    pub combines: usize,
    /// Centres moved, over the kept run: in a Lloyd iteration the ones
    /// no point chose, onto the points farthest from their centres; in a
    /// mini-batch step the light ones, onto rows of the batch (both as
    /// scikit-learn).
    pub relocated: usize,
}

/// Sum of squared differences between two sets of centres.
fn squared_shift(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let t = f64::from(*x) - f64::from(*y);
            t * t
        })
        .sum()
}

/// Runs K-means on a loaded dataset: `cfg.n_init` runs (one with given
/// centres), the best kept.
///
/// On a session of several ranks, each holds its share of the rows
/// (loaded by [`load`] with the same `cfg`). Collective: every rank calls
/// it with the same configuration, and every rank gets the same centres,
/// bit for bit those of one process.
pub fn run(
    session: &Session,
    ds: &Dataset,
    cfg: &Config,
    mut on: impl FnMut(Event),
) -> Result<Outcome> {
    drive(session, ds, cfg, &mut on, None)
}

/// What receives the labels: each task's, in row order.
type LabelSink<'a> = &'a mut dyn FnMut(&[u32]) -> Result<()>;

/// [`run`], and the labels of the final centres (each row's nearest,
/// ties to the lowest index, as scikit-learn) handed to `labels` as the
/// final pass makes them: this rank's rows (all of them on one process),
/// a task's rows at a time, in row order. They are never held whole, so
/// the caller can write them out under the cap (the `outcore` command
/// streams them into their `.npy` file). An error from `labels` stops the
/// run and is returned.
///
/// A callback, not an [`Event`]: events only report (they cannot fail,
/// and their handler may ignore them), while the labels are an output
/// whose writing may fail and must stop the run.
pub fn run_with_labels(
    session: &Session,
    ds: &Dataset,
    cfg: &Config,
    mut on: impl FnMut(Event),
    mut labels: impl FnMut(&[u32]) -> Result<()>,
) -> Result<Outcome> {
    drive(session, ds, cfg, &mut on, Some(&mut labels))
}

/// [`run`] and [`run_with_labels`]: the runs, the best kept, its labels
/// to `labels` when given.
fn drive(
    session: &Session,
    ds: &Dataset,
    cfg: &Config,
    on: &mut dyn FnMut(Event),
    mut labels: Option<LabelSink<'_>>,
) -> Result<Outcome> {
    check(cfg, ds)?;
    let rt = session.runtime();
    let plan = Plan::new(session.ranks(), ds, cfg)?;
    let part_rows = ds.part_rows.iter().copied().max().unwrap_or(0);
    let needs = Needs::of(
        ds.rows,
        ds.dims,
        cfg,
        u64::from(part_rows),
        plan.mine.len(),
        plan.ranks.size(),
    );
    needs.check_all(plan.ranks, rt.cap(), cfg, ds.dims)?;
    // One task beyond the workers where the cap leaves room for it: a
    // worker that finishes then starts its next task at once, instead of
    // waiting for this thread to take the last result (two thread
    // wake-ups per task: 17% of a Lloyd iteration at 128-D, k = 32).
    let window = needs.window(rt.cap(), rt.workers() + 1);
    // Given centres make every run the same.
    let runs = if matches!(cfg.init, Init::Given(_)) {
        1
    } else {
        cfg.n_init
    };
    let mut best: Option<Outcome> = None;
    let mut init_inertia = Vec::with_capacity(runs);
    for r in 0..runs {
        if runs > 1 {
            on(Event::Run { index: r, of: runs });
        }
        let seed = if r == 0 {
            cfg.seed
        } else {
            mix(cfg.seed ^ 0x6e69_6e69, r as u64)
        };
        // With one run, its final pass makes the labels.
        let sink = if runs == 1 { labels.take() } else { None };
        let mut o = run_once(rt, ds, cfg, (&plan, window), seed, sink, on)?;
        if runs > 1 {
            on(Event::RunDone {
                index: r,
                inertia: o.inertia,
            });
        }
        init_inertia.push(o.inertia);
        o.best_init = r;
        if best.as_ref().is_none_or(|b| o.inertia < b.inertia) {
            best = Some(o);
        }
    }
    let mut out = best.ok_or_else(|| Error::Input("no run".into()))?;
    if let Some(sink) = labels {
        on(Event::FinalPass);
        label::final_pass(rt, ds, &plan, &mut out.centers, Some(sink))?;
    }
    out.init_inertia = init_inertia;
    Ok(out)
}

/// The settings [`run`] cannot run with on `ds`.
fn check(cfg: &Config, ds: &Dataset) -> Result<()> {
    if cfg.k == 0 {
        return Err(Error::Input("k must be at least 1".into()));
    }
    if cfg.k as u64 > ds.rows {
        return Err(Error::Input(format!(
            "k = {} is larger than the number of points ({})",
            cfg.k, ds.rows
        )));
    }
    if cfg.task_points == 0 || cfg.batch_tasks == 0 || cfg.n_init == 0 || cfg.shards == 0 {
        return Err(Error::Input(
            "task_points, batch_tasks, shards and n_init must be at least 1".into(),
        ));
    }
    if !(cfg.tol.is_finite() && cfg.tol >= 0.0) {
        return Err(Error::Input(format!(
            "tol must be a number >= 0, not {}",
            cfg.tol
        )));
    }
    Ok(())
}

/// What an algorithm's pass works with: the runtime, the data, where the
/// tasks are, and the run's combines across processes.
struct Pass<'a> {
    rt: &'a Runtime,
    ds: &'a Dataset,
    plan: &'a Plan<'a>,
    /// Tasks a step runs at once (see `budget.rs`).
    window: usize,
    /// Sum vectors a step is done with, for the next step's (each the
    /// size of the model: made once, not every step).
    spare: Vec<Vec<f64>>,
    /// Seconds spent adding the shards' sums across processes, and the
    /// number of such combines.
    combine: (f64, usize),
}

impl Pass<'_> {
    /// What a sweep over `list` (its chunks' local shards `owner`) that
    /// sums as `packed` needs to know.
    fn summing<'s>(
        &self,
        list: &'s [Chunk],
        owner: &'s [usize],
        packed: Packed,
        reference: Option<&'s Arc<Vec<f32>>>,
    ) -> Summing<'s> {
        Summing {
            list,
            owner,
            shards: self.plan.mine.len(),
            single: self.plan.ranks.size() == 1,
            packed,
            reference,
            window: self.window,
        }
    }

    /// A sweep's sums (`len` values each: one total on one process, else
    /// each local shard's) added in shard order across the processes,
    /// timed.
    fn combine(&mut self, sums: Vec<Vec<f64>>, len: usize) -> Result<Vec<f64>> {
        let t = Instant::now();
        let r = match self.plan.ranks.size() {
            1 => sums
                .into_iter()
                .next()
                .ok_or_else(|| Error::Input("internal: a sweep without sums".into())),
            _ => {
                let r = self.plan.ranks.ordered_sum(&sums, len);
                self.spare.extend(sums);
                r
            }
        };
        self.combine.0 += t.elapsed().as_secs_f64();
        self.combine.1 += 1;
        r
    }

    /// `done` of this process's rows, scaled to the whole data (progress
    /// counts this process's rows).
    fn progress(&self, done: u64) -> u64 {
        let scale = self.ds.rows as f64 / self.plan.local_rows().max(1) as f64;
        ((done as f64 * scale) as u64).min(self.ds.rows)
    }
}

/// What a pass (an epoch or an iteration) found.
#[derive(Default)]
struct Swept {
    /// See [`Event::Epoch`].
    inertia: f64,
    /// Seconds this process's tasks spent in the distance kernel.
    kernel_seconds: f64,
    /// Empty centres moved onto far points.
    relocated: usize,
    /// Whether the run converged with this pass, and why.
    converged: Option<Converged>,
}

/// An algorithm, as [`run_once`] drives it: pass after pass over the
/// data, each moving the centres, until the passes run out or it
/// converges.
trait Solver {
    /// One pass (a mini-batch epoch, a Lloyd iteration): moves `centers`,
    /// and tells `on` of its progress.
    fn pass(
        &mut self,
        pass: &mut Pass<'_>,
        centers: &mut Centers,
        on: &mut dyn FnMut(Event),
    ) -> Result<Swept>;

    /// Steps made so far: mini-batch steps (batches) or Lloyd iterations.
    fn steps(&self) -> usize;
}

/// One run from the initialisation drawn with `seed`.
fn run_once(
    rt: &Runtime,
    ds: &Dataset,
    cfg: &Config,
    (plan, window): (&Plan<'_>, usize),
    seed: u64,
    labels: Option<LabelSink<'_>>,
    on: &mut dyn FnMut(Event),
) -> Result<Outcome> {
    // Every pass (the initialisation's sample, the epochs or iterations,
    // the final pass) sweeps in the same order: the resident part of the
    // data chosen during one stays right for the next.
    plan.declare(rt, ds, plan.sweep_order().into_iter().map(|(t, _)| t));
    let t = Instant::now();
    let (mut centers, variance) = match cfg.init {
        Init::KMeansParallel => parallel::initial_centers(rt, ds, cfg, plan, seed)?,
        _ => init::initial_centers(rt, ds, cfg, plan.ranks, seed)?,
    };
    // The initialisation's sample is freed: without a cap, its pages go
    // back to the system now rather than after jemalloc's decay.
    rt.make_room(0);
    on(Event::Initialized {
        seconds: t.elapsed().as_secs_f64(),
    });
    let mut pass = Pass {
        rt,
        ds,
        plan,
        window,
        spare: Vec::new(),
        combine: (0.0, 0),
    };
    let (mut solver, passes): (Box<dyn Solver>, usize) = match cfg.algorithm {
        Algorithm::MiniBatch => (
            Box::new(MiniBatch::new(cfg, &pass, variance, seed)),
            cfg.epochs,
        ),
        Algorithm::Lloyd => (Box::new(Lloyd::new(cfg, &pass, &centers)), cfg.iterations),
    };
    let mut history = History::default();
    for index in 0..passes {
        let t = Instant::now();
        let swept = solver.pass(&mut pass, &mut centers, on)?;
        if let Some(why) = history.record(index, t.elapsed().as_secs_f64(), &swept, on) {
            on(Event::Converged {
                steps: solver.steps(),
                why,
            });
            break;
        }
    }
    // The final pass holds the centres alone: the steps' sums go first.
    let steps = solver.steps();
    let combine = pass.combine;
    drop(solver);
    drop(pass);
    rt.make_room(0);
    on(Event::FinalPass);
    let inertia = label::final_pass(rt, ds, plan, &mut centers, labels)?;
    Ok(Outcome {
        centers,
        inertia,
        iterations: history.seconds.len(),
        epoch_seconds: history.seconds,
        epoch_inertia: history.inertia,
        epoch_kernel_seconds: history.kernel,
        steps,
        converged: history.converged,
        best_init: 0,
        init_inertia: Vec::new(),
        combine_seconds: combine.0,
        combines: combine.1,
        relocated: history.relocated,
    })
}

/// A run's passes so far: their figures for the [`Outcome`].
#[derive(Default)]
struct History {
    seconds: Vec<f64>,
    inertia: Vec<f64>,
    kernel: Vec<f64>,
    relocated: usize,
    converged: Option<Converged>,
}

impl History {
    /// Records pass `index`, which took `seconds` and found `swept`, and
    /// tells `on`; why the run converged with it, if it did.
    fn record(
        &mut self,
        index: usize,
        seconds: f64,
        swept: &Swept,
        on: &mut dyn FnMut(Event),
    ) -> Option<Converged> {
        self.seconds.push(seconds);
        self.inertia.push(swept.inertia);
        self.kernel.push(swept.kernel_seconds);
        self.relocated += swept.relocated;
        on(Event::Epoch {
            index,
            seconds,
            inertia: swept.inertia,
        });
        self.converged = swept.converged;
        swept.converged
    }
}
