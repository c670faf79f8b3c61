//! A training job with its data and model state in executors: multinomial
//! logistic regression, by L-BFGS (the default) or by local SGD with model
//! averaging.
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
//! timing or the number of MPI processes ([`train_lbfgs_on`]). The
//! held-out accuracy of every evaluated point is measured in the same
//! pass. The L-BFGS curvature pairs live in executors (see [`lbfgs`]).
//!
//! **Local SGD** ([`Solver::Sgd`]): each [`Shard`] executor also holds its
//! own model replica. A round sets every replica to the global model, runs
//! local SGD epochs on each shard (write tasks: the shards are dirty, so an
//! evicted shard is written back), averages the replicas in shard order
//! (weighted by rows, so the result does not depend on timing) and stores
//! the average in the global-model executor. Its result depends on the
//! number of shards.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use outcore::{Handle, PodVec, Runtime};

use crate::error::{Error, Result};
use crate::input::{mix, Block, InputReads, Labels, Loader, Source};
use crate::npy::NpyInts;
use crate::ranks::{Ranks, Shards};
use std::ops::Range;

pub mod lbfgs;

/// Rows per L-BFGS task: the unit whose partial sums are added in order.
/// Shards hold whole tasks (see [`aligned_shard_bytes`]).
pub const TASK_ROWS: usize = 2048;

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

/// A shard: training rows, held-out rows and a model replica.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Shard {
    /// Columns.
    pub dims: u32,
    /// Training inputs, row-major.
    pub x: PodVec<f32>,
    /// Training labels.
    pub y: PodVec<u32>,
    /// Held-out inputs.
    pub test_x: PodVec<f32>,
    /// Held-out labels.
    pub test_y: PodVec<u32>,
    /// This shard's model replica (local SGD only).
    pub model: Model,
    /// Where each block of [`TASK_ROWS`] global rows starts among the
    /// training rows, and the number of training rows last.
    pub tasks: PodVec<u32>,
}

impl Shard {
    /// A shard from a block of labelled rows: the rows whose hash (with
    /// `seed`) falls under `threshold` are held out. Returns the shard, its
    /// training rows and its largest label.
    fn split(b: Block, seed: u64, threshold: u64) -> (Shard, (u64, u32)) {
        let dims = b.dims;
        let mut s = Shard {
            dims: dims as u32,
            x: PodVec::new(),
            y: PodVec::new(),
            test_x: PodVec::new(),
            test_y: PodVec::new(),
            model: Model::zeros(0, dims),
            tasks: PodVec::from(vec![0]),
        };
        let mut max_label = 0u32;
        for (r, &label) in b.y.iter().enumerate() {
            max_label = max_label.max(label);
            if r > 0 && (b.first + r as u64).is_multiple_of(TASK_ROWS as u64) {
                s.tasks.push(s.y.len() as u32);
            }
            let row = &b.x[b.skip + r * dims..b.skip + (r + 1) * dims];
            if held_out(seed, threshold, b.first + r as u64) {
                s.test_x.extend_from_slice(row);
                s.test_y.push(label);
            } else {
                s.x.extend_from_slice(row);
                s.y.push(label);
            }
        }
        let train_rows = s.y.len() as u64;
        s.tasks.push(train_rows as u32);
        (s, (train_rows, max_label))
    }

    /// Runs `epochs` of mini-batch SGD on the shard's rows, starting from
    /// `start`.
    fn local_sgd(&mut self, start: &Model, epochs: usize, lr: f32, batch: usize) {
        self.model = start.clone();
        let d = self.dims as usize;
        let classes = self.model.classes as usize;
        let n = self.y.len();
        let mut p = vec![0f32; classes];
        let mut grad = crate::zeros::<f32>(classes * (d + 1));
        for _ in 0..epochs {
            let mut i = 0;
            while i < n {
                let end = (i + batch).min(n);
                grad.iter_mut().for_each(|g| *g = 0.0);
                for r in i..end {
                    let x = &self.x[r * d..(r + 1) * d];
                    self.model.scores(x, &mut p);
                    softmax(&mut p);
                    p[self.y[r] as usize] -= 1.0;
                    for (c, &pc) in p.iter().enumerate() {
                        let g = &mut grad[c * (d + 1)..(c + 1) * (d + 1)];
                        for (gj, &xj) in g[..d].iter_mut().zip(x) {
                            *gj += pc * xj;
                        }
                        g[d] += pc;
                    }
                }
                let step = lr / (end - i) as f32;
                for (w, g) in self.model.w.iter_mut().zip(&grad) {
                    *w -= step * g;
                }
                i = end;
            }
        }
    }

    /// The log-loss of task `task`'s training rows under the weights `w`
    /// (`classes x (dims + 1)`, f64), its gradient, and (when `held_out`)
    /// the correct predictions over the shard's held-out rows. Row after
    /// row, in f64: the result depends only on the rows and `w`.
    fn loss_part(&self, task: usize, w: &[f64], classes: usize, held_out: bool) -> Part {
        let d = self.dims as usize;
        let stride = d + 1;
        let (a, b) = (self.tasks[task] as usize, self.tasks[task + 1] as usize);
        let mut part = Part {
            loss: 0.0,
            grad: crate::zeros::<f64>(classes * stride),
            correct: 0,
            held: 0,
        };
        let n = b - a;
        if n > 0 {
            // The task's rows in f64, then two GEMMs: the scores
            // Z = X . W^T, and, once Z holds P - Y, the gradient P^T . X.
            let xd: Vec<f64> = self.x[a * d..b * d].iter().map(|&v| f64::from(v)).collect();
            let mut z = crate::zeros::<f64>(n * classes);
            // SAFETY:
            // - `xd` holds n*d values, row stride d, column stride 1;
            // - W^T (d x classes) is read from `w` (classes*(d+1) values)
            //   with row stride 1 and column stride d+1: element (j, c)
            //   is w[c*(d+1) + j], j < d, never the bias column;
            // - `z` holds n*classes values, row stride classes; beta = 0,
            //   so its prior contents are not read; nothing aliases.
            unsafe {
                matrixmultiply::dgemm(
                    n,
                    d,
                    classes,
                    1.0,
                    xd.as_ptr(),
                    d as isize,
                    1,
                    w.as_ptr(),
                    1,
                    stride as isize,
                    0.0,
                    z.as_mut_ptr(),
                    classes as isize,
                    1,
                );
            }
            for (r, zr) in z.chunks_exact_mut(classes).enumerate() {
                for (c, v) in zr.iter_mut().enumerate() {
                    *v += w[c * stride + d];
                }
                let m = zr.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + zr.iter().map(|&v| (v - m).exp()).sum::<f64>().ln();
                let y = self.y[a + r] as usize;
                part.loss += lse - zr[y];
                for (c, v) in zr.iter_mut().enumerate() {
                    *v = (*v - lse).exp() - if c == y { 1.0 } else { 0.0 };
                    part.grad[c * stride + d] += *v;
                }
            }
            // SAFETY:
            // - P^T (classes x n) is read from `z` (n*classes values) with
            //   row stride 1 and column stride classes;
            // - `xd` holds n*d values, row stride d, column stride 1;
            // - the gradient's weight columns (classes x d) are written
            //   in `part.grad` with row stride d+1 and column stride 1,
            //   never touching the bias column; beta = 0 (they are all
            //   zero), and `part.grad` aliases neither input.
            unsafe {
                matrixmultiply::dgemm(
                    classes,
                    n,
                    d,
                    1.0,
                    z.as_ptr(),
                    1,
                    classes as isize,
                    xd.as_ptr(),
                    d as isize,
                    1,
                    0.0,
                    part.grad.as_mut_ptr(),
                    stride as isize,
                    1,
                );
            }
        }
        let mut z = vec![0f64; classes];
        let mut xr = vec![0f64; d];
        if held_out {
            for (r, &y) in self.test_y.iter().enumerate() {
                for (o, &v) in xr.iter_mut().zip(&self.test_x[r * d..(r + 1) * d]) {
                    *o = f64::from(v);
                }
                scores64(w, &xr, &mut z);
                let mut best = 0;
                for c in 1..classes {
                    if z[c] > z[best] {
                        best = c;
                    }
                }
                part.correct += u64::from(best == y as usize);
                part.held += 1;
            }
        }
        part
    }

    /// Correct predictions and total over the held-out rows.
    fn evaluate(&self, m: &Model) -> (u64, u64) {
        let d = self.dims as usize;
        let mut scratch = vec![0f32; m.classes as usize];
        let mut correct = 0;
        for (r, &y) in self.test_y.iter().enumerate() {
            if m.predict(&self.test_x[r * d..(r + 1) * d], &mut scratch) == y {
                correct += 1;
            }
        }
        (correct, self.test_y.len() as u64)
    }
}

/// Whether row `row` is held out (its hash with `seed` under
/// `threshold`).
fn held_out(seed: u64, threshold: u64, row: u64) -> bool {
    mix(seed ^ 0x401d_0017, row) < threshold
}

/// One L-BFGS task's partial sums.
#[derive(Debug)]
struct Part {
    loss: f64,
    grad: Vec<f64>,
    correct: u64,
    held: u64,
}

/// Class scores `w_c . x + b_c` in f64 (`w` is `classes x (dims + 1)`),
/// each dot product summed in four lanes, always in the same order.
fn scores64(w: &[f64], x: &[f64], out: &mut [f64]) {
    let d = x.len();
    for (c, o) in out.iter_mut().enumerate() {
        let wc = &w[c * (d + 1)..(c + 1) * (d + 1)];
        let mut acc = [0f64; 4];
        let mut wi = wc[..d].chunks_exact(4);
        let mut xi = x.chunks_exact(4);
        for (a, b) in (&mut wi).zip(&mut xi) {
            for t in 0..4 {
                acc[t] += a[t] * b[t];
            }
        }
        let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for (a, b) in wi.remainder().iter().zip(xi.remainder()) {
            s += a * b;
        }
        *o = s + wc[d];
    }
}

fn softmax(v: &mut [f32]) {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for x in v.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    for x in v.iter_mut() {
        *x /= sum;
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
    /// Bytes the shards read from the input file (built and rebuilt
    /// after evictions).
    pub input_reads: InputReads,
}

/// Loads `src` with its labels into shards of about `shard_bytes` (4
/// bytes per value and per label), declared to the runtime as the sweep
/// order, and inserts the global model. Synthetic shards are generated by
/// the runtime's workers in parallel. `progress` is called with the rows
/// loaded so far and the total. `classes` defaults to the largest label
/// plus one.
pub fn load(
    rt: &Runtime,
    src: &Source,
    labels: &Labels,
    classes: Option<usize>,
    shard_bytes: u64,
    cfg: &TrainConfig,
    progress: impl FnMut(u64, u64),
) -> Result<Job> {
    load_on(
        rt,
        src,
        labels,
        classes,
        shard_bytes,
        cfg,
        &Ranks::single(),
        progress,
    )
}

/// The rows rank `rank` of `ranks` holds for L-BFGS: its share of
/// `cfg.shards` shards of [`TASK_ROWS`]-row tasks.
pub fn rank_rows(rows: u64, cfg: &TrainConfig, rank: usize, ranks: usize) -> Range<u64> {
    let t = Shards::new(rows.div_ceil(TASK_ROWS as u64), cfg.shards).tasks_of_rank(rank, ranks);
    let tr = TASK_ROWS as u64;
    (t.start * tr).min(rows)..(t.end * tr).min(rows)
}

/// Refuses a model that could not be held. With `classes x (dims + 1)`
/// weights, the run holds in float64 the model, its gradient and the
/// L-BFGS history (about 24 copies), and each worker's task its partial
/// gradient and the class scores of its rows (up to [`TASK_ROWS`] x
/// `classes`). Over half the cap (or of the machine's memory without one)
/// is refused: a label far larger than the number of classes meant
/// (labels number the classes from 0) would otherwise end the run in an
/// allocation failure.
fn check_model_fits(
    rt: &Runtime,
    classes: usize,
    rows: u64,
    dims: usize,
    max_label: u32,
) -> Result<()> {
    let width = dims as u64 + 1;
    let per_task = rows.min(TASK_ROWS as u64) + width;
    let need = (classes as u64 * 8).saturating_mul(rt.workers() as u64 * per_task + 24 * width);
    let (room, what) = match rt.cap() {
        Some(cap) => (cap, "the memory cap"),
        None => (physical_memory(), "this machine's memory"),
    };
    if need <= room / 2 {
        return Ok(());
    }
    Err(Error::Input(format!(
        "{classes} classes of {dims} features need about {} for the model and its working copies, more than half of {what} ({}); the largest label is {max_label}, and labels number the classes from 0",
        outcore::format_bytes(need),
        outcore::format_bytes(room)
    )))
}

/// The machine's physical memory in bytes (`u64::MAX` when unknown).
fn physical_memory() -> u64 {
    // SAFETY: sysconf reads system constants.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && size > 0 {
        pages as u64 * size as u64
    } else {
        u64::MAX
    }
}

/// [`load`] as one of `ranks`: this rank's rows only ([`rank_rows`]), in
/// shards of whole [`TASK_ROWS`]-row tasks.
#[allow(clippy::too_many_arguments)]
pub fn load_on(
    rt: &Runtime,
    src: &Source,
    labels: &Labels,
    classes: Option<usize>,
    shard_bytes: u64,
    cfg: &TrainConfig,
    ranks: &Ranks,
    progress: impl FnMut(u64, u64),
) -> Result<Job> {
    if !(0.0..1.0).contains(&cfg.holdout) {
        return Err(Error::Input(format!(
            "holdout must be in [0, 1), not {}",
            cfg.holdout
        )));
    }
    let threshold = (cfg.holdout * u64::MAX as f64) as u64;
    let seed = cfg.seed;
    // The largest label, known before any shard is built: the labels file
    // is scanned once (it is small next to the data), blob labels are
    // below the number of blobs.
    let max_label = match (labels, src) {
        (Labels::File(p), _) => {
            let mut r = NpyInts::open(p)?;
            let (mut left, mut max) = (r.len(), 0u32);
            while left > 0 {
                let n = left.min(1 << 20) as usize;
                max = r.read(n)?.into_iter().fold(max, u32::max);
                left -= n as u64;
            }
            max
        }
        (Labels::Blobs, Source::Synthetic { true_k, .. }) => (*true_k).max(1) as u32 - 1,
        (Labels::Blobs, _) => {
            return Err(Error::Input(
                "labels from the blobs need synthetic data".into(),
            ))
        }
    };
    let classes = match classes {
        Some(c) if (max_label as usize) < c => c,
        Some(c) => {
            let whose = match labels {
                Labels::File(p) => format!("{}: ", p.display()),
                _ => String::new(),
            };
            return Err(Error::Input(format!(
                "{whose}a label is {max_label}, but there are only {c} classes"
            )));
        }
        None => max_label as usize + 1,
    };
    let (rows, dims) = src.shape()?;
    ranks.agree(
        &[
            "the rows",
            "the dimensions",
            "the classes",
            "the settings (a hash)",
        ],
        &[
            rows,
            dims as u64,
            classes as u64,
            crate::ranks::hash_of(cfg),
        ],
    )?;
    check_model_fits(rt, classes, rows, dims, max_label)?;
    let range = if ranks.size() > 1 && cfg.solver == Solver::Sgd {
        // Local SGD's model depends on the shard executors: the ranks
        // hold runs of the single process's shards (every `per` rows from
        // row 0).
        let rows = src.shape()?.0;
        let per = (shard_bytes / (4 * src.shape()?.1 as u64 + 4)).max(1);
        let s = Shards::new(rows.div_ceil(per), usize::MAX);
        if s.count() < ranks.size() {
            return Err(Error::Input(format!(
                "{} processes, but the data makes only {} shards of {per} rows: at least one shard per process is needed (a --partitions of {} or more makes enough)",
                ranks.size(),
                s.count(),
                ranks.size()
            )));
        }
        let t = s.tasks_of_rank(ranks.rank(), ranks.size());
        Some([((t.start * per).min(rows), (t.end * per).min(rows), per)])
    } else if ranks.size() > 1 {
        let rows = src.shape()?.0;
        let s = Shards::new(rows.div_ceil(TASK_ROWS as u64), cfg.shards);
        if s.count() < ranks.size() {
            return Err(Error::Input(format!(
                "{} processes, but the data makes only {} shards ({} tasks of {TASK_ROWS} rows, {} shards asked): at least one shard per process is needed",
                ranks.size(),
                s.count(),
                s.task_count(),
                cfg.shards
            )));
        }
        let r = rank_rows(rows, cfg, ranks.rank(), ranks.size());
        // Shards of about `shard_bytes`, whole tasks, from the share's
        // first row (a task boundary).
        let per = shard_bytes / (4 * src.shape()?.1 as u64 + 4).max(1);
        let tr = TASK_ROWS as u64;
        Some([(r.start, r.end, (per / tr).max(1) * tr)])
    } else {
        None
    };
    let loader = Loader {
        source: src,
        labels: Some(labels),
        weights: None,
        part_bytes: shard_bytes,
        name: "shard",
        segments: range.as_ref().map(|s| &s[..]),
    };
    // Shards are built when first needed (read from the input again after
    // an eviction while they are clean).
    let bytes_per_row = 4 * src.shape()?.1 as u64 + 4;
    let data = loader.load_lazy(
        rt,
        bytes_per_row,
        move |b| Shard::split(b, seed, threshold).0,
        progress,
    )?;
    // What each shard will hold, from the row indices alone.
    let mut weights = Vec::with_capacity(data.parts.len());
    let mut tasks = Vec::with_capacity(data.parts.len());
    let mut first = data.first_row;
    for &n in &data.part_rows {
        let last = first + u64::from(n);
        weights.push(
            (first..last)
                .filter(|&r| !held_out(seed, threshold, r))
                .count() as u64,
        );
        tasks.push(
            1 + (first + 1..last)
                .filter(|r| r % TASK_ROWS as u64 == 0)
                .count(),
        );
        first = last;
    }
    if classes < 2 {
        return Err(Error::Input("training needs at least 2 classes".into()));
    }
    let global = rt.insert_named(Some("global model"), Model::zeros(classes, data.dims))?;
    let input_reads = data.input_reads();
    Ok(Job {
        shards: data.parts,
        weights,
        tasks,
        input_reads,
        global,
        classes,
        dims: data.dims,
        rows: data.rows,
        first_row: data.first_row,
        shard_rows: data.part_rows,
    })
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

/// One L-BFGS iteration's report.
#[derive(Clone, Debug)]
pub struct Iteration {
    /// Iteration index (from 1).
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
    /// L-BFGS: the final objective, its gradient's largest component and
    /// the held-out accuracy (at the start point when no step was taken).
    pub last: Option<Iteration>,
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

/// Trains the job.
pub fn train(
    rt: &Runtime,
    job: &Job,
    cfg: &TrainConfig,
    on_round: impl FnMut(&Round),
) -> Result<Trained> {
    train_on(rt, job, cfg, &Ranks::single(), on_round)
}

/// [`train`] (local SGD) as one of `ranks`, each holding a run of the
/// shards one process would hold with the same shard size ([`load_on`]).
/// Collective: every rank gets the same model, bit for bit the single
/// process's: the replicas are averaged in shard order across ranks.
pub fn train_on(
    rt: &Runtime,
    job: &Job,
    cfg: &TrainConfig,
    ranks: &Ranks,
    mut on_round: impl FnMut(&Round),
) -> Result<Trained> {
    if cfg.batch == 0 || cfg.local_epochs == 0 {
        return Err(Error::Input(
            "batch and local_epochs must be at least 1".into(),
        ));
    }
    let total = training_rows(job, ranks)?;
    let mut rounds = Vec::new();
    for index in 0..cfg.rounds {
        let t = Instant::now();
        let global = Arc::new(rt.read(&job.global, |m: &Model| m.clone())?);
        // Local SGD on every shard (write tasks: replicas change).
        let mut b = rt.batch();
        for h in &job.shards {
            let g = global.clone();
            let (epochs, lr, batch) = (cfg.local_epochs, cfg.lr, cfg.batch);
            b.write(h, move |s: &mut Shard| {
                s.local_sgd(&g, epochs, lr, batch);
                s.model.w.clone()
            });
        }
        let replicas = b.run()?;
        // Weighted average, in shard order (across ranks).
        let len = global.w.len();
        let terms: Vec<Vec<f64>> = replicas
            .iter()
            .zip(&job.weights)
            .map(|(w, &n)| {
                let f = n as f64 / total as f64;
                w.iter().map(|&v| f * f64::from(v)).collect()
            })
            .collect();
        drop(replicas);
        let avg = ranks.ordered_sum(&terms, len)?;
        drop(terms);
        let avg: Vec<f32> = avg.into_iter().map(|v| v as f32).collect();
        rt.write(&job.global, move |m: &mut Model| m.w = PodVec::from(avg))?;
        let model = Arc::new(rt.read(&job.global, |m: &Model| m.clone())?);
        let mut b = rt.batch();
        for h in &job.shards {
            let m = model.clone();
            b.read(h, move |s: &Shard| s.evaluate(&m));
        }
        let (correct, seen) = b
            .run()?
            .into_iter()
            .fold((0u64, 0u64), |a, r| (a.0 + r.0, a.1 + r.1));
        let all = ranks.ordered_sum(&[vec![correct as f64, seen as f64]], 2)?;
        let (correct, seen) = (all[0] as u64, all[1] as u64);
        let r = Round {
            index,
            seconds: t.elapsed().as_secs_f64(),
            accuracy: correct as f64 / seen.max(1) as f64,
        };
        on_round(&r);
        rounds.push(r);
    }
    let model = rt.read(&job.global, |m: &Model| m.clone())?;
    Ok(Trained {
        model,
        rounds,
        iterations: Vec::new(),
        stop: None,
        last: None,
    })
}

/// What one pass measures besides the objective and its gradient.
#[derive(Clone, Copy, Debug)]
struct Measured {
    objective: f64,
    accuracy: Option<f64>,
}

/// Trains the job by L-BFGS (see the module docs); `on_iter` is called
/// after every iteration.
pub fn train_lbfgs(
    rt: &Runtime,
    job: &Job,
    cfg: &TrainConfig,
    on_iter: impl FnMut(&Iteration),
) -> Result<Trained> {
    train_lbfgs_on(rt, job, cfg, &Ranks::single(), on_iter)
}

/// [`train_lbfgs`] as one of `ranks`, each with its share of the rows
/// ([`load_on`]). Collective: every rank gets the same model, bit for bit
/// the one a single process gets with the same `cfg.shards`.
pub fn train_lbfgs_on(
    rt: &Runtime,
    job: &Job,
    cfg: &TrainConfig,
    ranks: &Ranks,
    mut on_iter: impl FnMut(&Iteration),
) -> Result<Trained> {
    if !(cfg.c.is_finite() && cfg.c > 0.0) {
        return Err(Error::Input(format!(
            "C must be a positive number, not {}",
            cfg.c
        )));
    }
    if !(cfg.tol.is_finite() && cfg.tol >= 0.0) {
        return Err(Error::Input(format!(
            "tol must be a number >= 0, not {}",
            cfg.tol
        )));
    }
    let n = training_rows(job, ranks)?;
    let (classes, d) = (job.classes, job.dims);
    let stride = d + 1;
    // The plan: every task of every shard executor, in row order, each
    // with the reduction shard (counted from this rank's first) of its
    // global task.
    let shards = Shards::new(job.rows.div_ceil(TASK_ROWS as u64), cfg.shards);
    let mine = shards.of_rank(ranks.rank(), ranks.size());
    let held: u64 = job.shard_rows.iter().map(|&r| u64::from(r)).sum();
    let want = rank_rows(job.rows, cfg, ranks.rank(), ranks.size());
    if ranks.size() > 1 && want != (job.first_row..job.first_row + held) {
        return Err(Error::Input(format!(
            "process {} of {} holds rows {}..{}, but its shards are rows {}..{} (load the job with the same configuration and processes)",
            ranks.rank(),
            ranks.size(),
            job.first_row,
            job.first_row + held,
            want.start,
            want.end
        )));
    }
    let owner_of = |g: u64| -> usize {
        mine.clone()
            .find(|&s| shards.tasks(s).contains(&g))
            .map_or(0, |s| s - mine.start)
    };
    let mut plan: Vec<(usize, usize, usize)> = Vec::new();
    let mut first = job.first_row;
    for (s, (&t, &rows)) in job.tasks.iter().zip(&job.shard_rows).enumerate() {
        let g0 = first / TASK_ROWS as u64;
        for i in 0..t {
            plan.push((s, i, owner_of(g0 + i as u64)));
        }
        first += u64::from(rows);
    }
    let groups = mine.len().max(1);
    let held_out = cfg.holdout > 0.0;
    let scale = 1.0 / n as f64;
    let reg = 1.0 / (cfg.c * n as f64);
    let objective_scale = cfg.c * n as f64;
    let eval = |w: &[f64]| -> Result<lbfgs::Value<Measured>> {
        let shared = Arc::new(w.to_vec());
        // Per reduction shard: the gradient, the loss, and the held-out
        // rows right and seen (integers, exact as sums of f64).
        let len = w.len() + 3;
        let mut accs = vec![vec![0.0; len]; groups];
        // One batch per evaluation; the partial gradients are folded as
        // they come (in plan order), so only a few are held at once.
        let mut b = rt.batch();
        for &(s, t, _) in &plan {
            let w = shared.clone();
            b.read(&job.shards[s], move |sh: &Shard| {
                sh.loss_part(t, &w, classes, held_out && t == 0)
            });
        }
        crate::fold_in_order(b, |i, p| {
            let acc = &mut accs[plan[i].2];
            for (a, v) in acc.iter_mut().zip(&p.grad) {
                *a += v;
            }
            acc[len - 3] += p.loss;
            acc[len - 2] += p.correct as f64;
            acc[len - 1] += p.held as f64;
            Ok(())
        })?;
        let mut grad = ranks.ordered_sum(&accs[..mine.len()], len)?;
        let held = grad.pop().unwrap_or(0.0) as u64;
        let correct = grad.pop().unwrap_or(0.0) as u64;
        let loss = grad.pop().unwrap_or(0.0);
        let mut penalty = 0.0;
        for c in 0..classes {
            for j in 0..d {
                let v = w[c * stride + j];
                penalty += v * v;
            }
        }
        let f = loss * scale + 0.5 * reg * penalty;
        for (i, g) in grad.iter_mut().enumerate() {
            *g *= scale;
            if i % stride != d {
                *g += reg * w[i];
            }
        }
        let measured = Measured {
            objective: f * objective_scale,
            accuracy: (held > 0).then(|| correct as f64 / held as f64),
        };
        Ok((f, grad, measured))
    };
    let settings = lbfgs::Settings {
        tol: cfg.tol,
        max_iter: cfg.max_iter,
        ..lbfgs::Settings::default()
    };
    let mut iterations = Vec::new();
    let mut t = Instant::now();
    let min = lbfgs::minimize(
        rt,
        vec![0.0; classes * stride],
        &settings,
        eval,
        |step, _, m: &Measured| {
            let it = Iteration {
                index: step.iteration,
                seconds: t.elapsed().as_secs_f64(),
                loss: step.value,
                objective: m.objective,
                grad_max: step.grad_max,
                accuracy: m.accuracy,
                evaluations: step.evaluations,
            };
            on_iter(&it);
            iterations.push(it);
            t = Instant::now();
        },
    )?;
    let last = Iteration {
        index: min.iterations,
        seconds: 0.0,
        loss: min.value,
        objective: min.extra.objective,
        grad_max: min.grad_max,
        accuracy: min.extra.accuracy,
        evaluations: min.evaluations,
    };
    let w: Vec<f32> = min.x.iter().map(|&v| v as f32).collect();
    let model = Model {
        classes: classes as u32,
        dims: d as u32,
        w: PodVec::from(w),
    };
    let stored = model.clone();
    rt.write(&job.global, move |m: &mut Model| *m = stored)?;
    Ok(Trained {
        model,
        rounds: Vec::new(),
        iterations,
        stop: Some(min.stop),
        last: Some(last),
    })
}

/// Labels every row of `ds` with the model's class (the largest score
/// `w_c . x + b_c`, ties to the lowest class), sweeping the data in order.
/// `on_block` receives the labels of consecutive blocks of rows, in row
/// order, so the caller can stream them out.
pub fn predict(
    rt: &Runtime,
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
