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
//! shard order ([`Ranks::ordered_sum`]), so results are bit-for-bit the
//! same whatever the cap, the policy, the timing or the number of
//! processes the shards are spread over ([`run_on`]).
//!
//! A mini-batch step takes `batch_tasks / shards` consecutive tasks from
//! every shard (the batch spans the data, so every process has work in
//! every step), and an epoch walks the shards side by side.
//!
//! **Empty clusters**: a centre that receives no point in a step (a
//! mini-batch or a Lloyd iteration) keeps its position.

mod data;
mod kernel;

use std::sync::Arc;
use std::time::Instant;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

pub use data::{load, load_on, load_weighted, Dataset, Partition};

use crate::error::{Error, Result};
use crate::input::mix;
use crate::ranks::{Ranks, Shards};
use crate::zeros;
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
        let norms = values
            .chunks_exact(dims.max(1))
            .map(|c| c.iter().map(|x| x * x).sum())
            .collect::<Vec<f32>>();
        let packed = kernel::Panels::new(k, dims, &values, &norms);
        Centers {
            k,
            dims,
            values,
            norms,
            packed,
        }
    }

    /// Centre `c`.
    pub fn row(&self, c: usize) -> &[f32] {
        &self.values[c * self.dims..(c + 1) * self.dims]
    }
}

/// What one task returns.
#[derive(Clone, Debug, Default)]
struct Partial {
    /// Per-cluster sums of the assigned points (`k x dims`), when asked.
    sums: Vec<f64>,
    /// Points assigned to each cluster.
    counts: Vec<u64>,
    /// Sum of squared distances to the assigned centres.
    inertia: f64,
    /// The label of each row, when asked.
    labels: Vec<u32>,
    /// The squared distance of each row to its centre, when asked.
    dists: Vec<f32>,
    /// Weight assigned to each cluster: the points' sample weights, or
    /// their count when the data has none.
    wsum: Vec<f64>,
    /// When asked: per-column sums of `x - reference` and of its square,
    /// for the data's per-feature variance.
    colsum: Vec<f64>,
    colsq: Vec<f64>,
    /// Seconds the task spent finding the nearest centres (the distance
    /// kernel), on its thread.
    kernel_seconds: f64,
}

/// What a task computes besides counts and inertia.
#[derive(Clone, Copy, Debug, Default)]
struct Want {
    /// Per-cluster sums of the assigned points.
    sums: bool,
    /// The label of each row.
    labels: bool,
    /// The squared distance of each row to its centre.
    dists: bool,
}

/// Partial sums (`k x dims` each) allowed for in memory while a sweep
/// folds them as they come: those being computed and those that finished
/// ahead of an earlier task.
const IN_FLIGHT: usize = 8;

/// A Lloyd pass reports progress every this many tasks.
const PROGRESS_EVERY: usize = 32;

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

/// Rows per GEMM block (keeps the distance block small for large k).
const BLOCK: usize = 256;

/// Asks the CPU to bring `x` into its caches (a hint: no effect on the
/// results; nothing on CPUs without the instruction).
fn prefetch(x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in x.chunks(16) {
        // SAFETY: a prefetch reads nothing the program can observe and
        // cannot fault; the address is inside `x` anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// `s += x`, in f64, or `s += w x` with a weight: each element its own
/// sum (a rounded product, then a rounded addition: never fused), so the
/// bits are the same whatever the vector width. With the widest vectors
/// the CPU has (the portable build's are two lanes wide).
fn add_row(s: &mut [f64], x: &[f32], w: Option<f64>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { add_row_avx512(s, x, w) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { add_row_avx2(s, x, w) };
        }
    }
    add_row_lanes(s, x, w);
}

/// Appends `0.0 + x`, or `0.0 + w x` with a weight, to `s`: the values
/// [`add_row`] leaves in a slice of zeros, bit for bit.
fn first_row(s: &mut Vec<f64>, x: &[f32], w: Option<f64>) {
    match w {
        None => s.extend(x.iter().map(|&v| 0.0 + f64::from(v))),
        Some(w) => s.extend(x.iter().map(|&v| 0.0 + w * f64::from(v))),
    }
}

/// [`add_row`]'s arithmetic, compiled for whichever instructions its
/// caller enables.
#[inline(always)]
fn add_row_lanes(s: &mut [f64], x: &[f32], w: Option<f64>) {
    match w {
        None => {
            for (acc, &v) in s.iter_mut().zip(x) {
                *acc += f64::from(v);
            }
        }
        Some(w) => {
            for (acc, &v) in s.iter_mut().zip(x) {
                *acc += w * f64::from(v);
            }
        }
    }
}

/// [`add_row`] over 512-bit vectors.
///
/// # Safety
///
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_row_avx512(s: &mut [f64], x: &[f32], w: Option<f64>) {
    add_row_lanes(s, x, w);
}

/// [`add_row`] over 256-bit vectors.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_row_avx2(s: &mut [f64], x: &[f32], w: Option<f64>) {
    add_row_lanes(s, x, w);
}

/// The nearest centre of each row of `x` (and the squared distance to it)
/// through matrixmultiply's `sgemm` into `g` (at least `n * k` floats),
/// for CPUs without the fused kernel.
fn gemm_nearest(
    x: &[f32],
    xn: &[f32],
    c: &Centers,
    g: &mut [f32],
    best: &mut [u32],
    best_d: &mut [f32],
) {
    let (n, d, k) = (best.len(), c.dims, c.k);
    assert!(x.len() >= n * d && g.len() >= n * k && xn.len() >= n && best_d.len() >= n);
    // G = X (n x d) . C^T (d x k)
    // SAFETY:
    // - `x` holds n*d floats, row stride d, column stride 1;
    // - C^T is read from `c.values` (k*d floats) with row stride 1 and
    //   column stride d, so element (j, c) is values[c*d + j];
    // - `g` holds at least n*k floats, row stride k, column stride 1;
    // - beta = 0, so g's prior contents are not read; no aliasing.
    unsafe {
        matrixmultiply::sgemm(
            n,
            d,
            k,
            1.0,
            x.as_ptr(),
            d as isize,
            1,
            c.values.as_ptr(),
            1,
            d as isize,
            0.0,
            g.as_mut_ptr(),
            k as isize,
            1,
        );
    }
    for i in 0..n {
        (best[i], best_d[i]) = kernel::argmin(xn[i], &g[i * k..(i + 1) * k], &c.norms);
    }
}

/// Assigns rows `start..start + len` of `p` to their nearest centres.
///
/// With sample weights (the partition holds them), sums, inertia and
/// cluster weights are weighted; without, the arithmetic is the unweighted
/// one. `reference`, when given, asks for column statistics around it.
fn assign(
    p: &Partition,
    start: usize,
    len: usize,
    c: &Centers,
    want: Want,
    reference: Option<&[f32]>,
) -> Partial {
    let d = c.dims;
    let k = c.k;
    let (want_sums, want_labels) = (want.sums, want.labels);
    let weights = (!p.weights.is_empty()).then_some(&p.weights[..]);
    let mut wsum = vec![0f64; if weights.is_some() { k } else { 0 }];
    let mut out = Partial {
        sums: Vec::new(),
        counts: vec![0; k],
        inertia: 0.0,
        labels: if want_labels {
            Vec::with_capacity(len)
        } else {
            Vec::new()
        },
        dists: if want.dists {
            Vec::with_capacity(len)
        } else {
            Vec::new()
        },
        wsum: Vec::new(),
        colsum: Vec::new(),
        colsq: Vec::new(),
        kernel_seconds: 0.0,
    };
    if let Some(r) = reference {
        let (mut s1, mut s2) = (zeros::<f64>(d), zeros::<f64>(d));
        for i in start..start + len {
            for ((a, b), (&v, &m)) in s1.iter_mut().zip(s2.iter_mut()).zip(p.row(i).iter().zip(r)) {
                let t = f64::from(v) - f64::from(m);
                *a += t;
                *b += t * t;
            }
        }
        out.colsum = s1;
        out.colsq = s2;
    }
    // The nearest centre of every row first. The fused kernel takes all
    // the rows at once, so the centres stay in the level-2 cache until
    // every distance is known; the GEMM path goes by blocks of rows, to
    // keep its n x k matrix small.
    let (mut nearest, mut nearest_d) = (vec![0u32; len], vec![0f32; len]);
    let rows = &p.values()[start * d..(start + len) * d];
    let xn = &p.norms[start..start + len];
    let kernel = Instant::now();
    match &c.packed {
        Some(packed) => packed.nearest(rows, xn, &mut nearest, &mut nearest_d),
        None => {
            let mut g = zeros::<f32>(BLOCK.min(len.max(1)) * k);
            for r in (0..len).step_by(BLOCK) {
                let n = BLOCK.min(len - r);
                gemm_nearest(
                    &rows[r * d..(r + n) * d],
                    &xn[r..r + n],
                    c,
                    &mut g,
                    &mut nearest[r..r + n],
                    &mut nearest_d[r..r + n],
                );
            }
        }
    }
    out.kernel_seconds = kernel.elapsed().as_secs_f64();
    let weight = |i: usize| weights.map(|w| f64::from(w[start + i]));
    for (i, (&best, &best_d)) in nearest.iter().zip(&nearest_d).enumerate() {
        let best = best as usize;
        out.counts[best] += 1;
        match weight(i) {
            None => out.inertia += f64::from(best_d.max(0.0)),
            Some(w) => {
                wsum[best] += w;
                out.inertia += w * f64::from(best_d.max(0.0));
            }
        }
        if want_labels {
            out.labels.push(best as u32);
        }
        if want.dists {
            out.dists.push(best_d.max(0.0));
        }
    }
    if want_sums {
        // Centre by centre, each centre's rows in row order: the same
        // additions in the same order as row by row, but each centre's
        // k-th of the sums (d f64) stays in the level-1 cache while its
        // rows are added, instead of all of them (k x d f64) going through
        // the caches for every block of rows.
        let mut first = vec![0usize; k + 1];
        for &b in &nearest {
            first[b as usize + 1] += 1;
        }
        for j in 0..k {
            first[j + 1] += first[j];
        }
        let mut order = vec![0u32; len];
        for (i, &b) in nearest.iter().enumerate() {
            order[first[b as usize]] = i as u32;
            first[b as usize] += 1;
        }
        // Each centre's sums start as its first row, written as `0.0 + x`
        // (the bits of adding it to a zero, a -0.0 included), so the
        // k x d sums are written once instead of zeroed first; centres
        // with no rows get zeros.
        let mut sums = Vec::with_capacity(k * d);
        let mut o = 0;
        for &n in &out.counts {
            let (start, n) = (sums.len(), n as usize);
            if n == 0 {
                sums.resize(start + d, 0.0);
                continue;
            }
            for (m, &i) in order[o..o + n].iter().enumerate() {
                let i = i as usize;
                if let Some(&next) = order.get(o + m + 1) {
                    prefetch(&rows[next as usize * d..(next as usize + 1) * d]);
                }
                let x = &rows[i * d..(i + 1) * d];
                if m == 0 {
                    first_row(&mut sums, x, weight(i));
                } else {
                    add_row(&mut sums[start..start + d], x, weight(i));
                }
            }
            o += n;
        }
        out.sums = sums;
    }
    out.wsum = match weights {
        Some(_) => wsum,
        None => out.counts.iter().map(|&n| n as f64).collect(),
    };
    out
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
    /// Compute labels in the final pass.
    pub labels: bool,
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
    /// Runs from different initialisations (the first from `seed`); the
    /// one with the lowest final inertia is kept.
    pub n_init: usize,
    /// Shards the tasks are cut into (at most the number of tasks, and for
    /// mini-batch at most `batch_tasks`, are used): the unit of the reductions' order and of the
    /// split among processes, so at least the number of processes. The
    /// results depend on it, never on the number of processes. A
    /// mini-batch takes `batch_tasks / shards` consecutive tasks from each
    /// shard (with one shard, `batch_tasks` consecutive tasks). Load with
    /// [`load_on`], which cuts the partitions shard by shard to fit the
    /// batches: under a cap, 8 shards then read as little per epoch as 1.
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
            labels: false,
            tol: 0.0,
            max_no_improvement: None,
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
    /// The last pass over the data starts: the final inertia (and the
    /// labels, when asked).
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
    /// Labels, when asked.
    pub labels: Option<Vec<u32>>,
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
    /// ([`Ranks::ordered_sum`]) in the steps of the kept run, and the
    /// number of such combines.
    pub combine_seconds: f64,
    /// Combines made (one per step).
    pub combines: usize,
}

/// A task's piece in one partition: rows `start..start+len` of partition
/// `part`, part of global task `task`.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    part: usize,
    start: usize,
    len: usize,
    task: u64,
    /// Global index of its first row.
    row: u64,
}

/// The dataset's rows cut at global task boundaries (multiples of
/// `task_points` rows) and at partition boundaries, in row order: with
/// partitions a whole number of tasks, one chunk per task.
fn chunks(ds: &Dataset, task_points: usize) -> Vec<Chunk> {
    let tp = task_points.max(1) as u64;
    let mut v = Vec::new();
    let mut first = ds.first_row;
    for (part, &rows) in ds.part_rows.iter().enumerate() {
        let end = first + u64::from(rows);
        let mut r = first;
        while r < end {
            let task = r / tp;
            let stop = ((task + 1) * tp).min(end);
            v.push(Chunk {
                part,
                start: (r - first) as usize,
                len: (stop - r) as usize,
                task,
                row: r,
            });
            r = stop;
        }
        first = end;
    }
    v
}

/// The shards of `rows` rows under `cfg`: tasks of `task_points` global
/// rows, in `min(shards, tasks)` shards, and for mini-batch at most
/// `batch_tasks` (each batch takes at least one task from each shard).
pub fn shards(rows: u64, cfg: &Config) -> Shards {
    let tasks = rows.div_ceil(cfg.task_points.max(1) as u64);
    let n = match cfg.algorithm {
        Algorithm::MiniBatch => cfg.shards.min(cfg.batch_tasks),
        Algorithm::Lloyd => cfg.shards,
    };
    Shards::new(tasks, n.max(1))
}

/// The rows rank `rank` of `ranks` holds (its shards' tasks): load them
/// with [`load_on`] and run with [`run_on`].
pub fn rank_rows(rows: u64, cfg: &Config, rank: usize, ranks: usize) -> std::ops::Range<u64> {
    let t = shards(rows, cfg).tasks_of_rank(rank, ranks);
    let tp = cfg.task_points.max(1) as u64;
    (t.start * tp).min(rows)..(t.end * tp).min(rows)
}

/// Mini-batch: the tasks shard `s` of `shards` gives each batch
/// (`batch_tasks` spread over the shards).
fn per_batch(shards: &Shards, s: usize, batch_tasks: usize) -> u64 {
    let (n, b, s) = (shards.count() as u128, batch_tasks as u128, s as u128);
    ((s + 1) * b / n - s * b / n) as u64
}

/// The row segments rank `ranks.rank()` loads (see [`load_on`]): one per
/// shard, `(first, end, rows per partition)`, with partitions of whole
/// tasks near `part_bytes`; for mini-batch, a divisor or a multiple of the
/// shard's tasks per batch, so that a batch never takes part of a
/// partition that the next batch takes the rest of.
fn segments(
    rows: u64,
    dims: usize,
    cfg: &Config,
    ranks: &Ranks,
    part_bytes: u64,
) -> Result<Vec<(u64, u64, u64)>> {
    let sh = shards(rows, cfg);
    if sh.count() < ranks.size() {
        return Err(too_few_shards(&sh, cfg, ranks));
    }
    let tp = cfg.task_points.max(1) as u64;
    let want = (part_bytes / (4 * dims.max(1) as u64) / tp).max(1);
    let mut out = Vec::new();
    for s in sh.of_rank(ranks.rank(), ranks.size()) {
        let t = sh.tasks(s);
        let tasks = match cfg.algorithm {
            Algorithm::MiniBatch => {
                // (Beyond the shard's tasks, runs change nothing.)
                let q = per_batch(&sh, s, cfg.batch_tasks).clamp(1, (t.end - t.start).max(1));
                if want >= q {
                    want / q * q
                } else {
                    // The divisor of q nearest to `want` (by ratio).
                    let below = (1..=want).rev().find(|&d| q.is_multiple_of(d)).unwrap_or(1);
                    let above = (want..=q).find(|&d| q.is_multiple_of(d)).unwrap_or(q);
                    if (above as f64 / want as f64) < (want as f64 / below as f64) {
                        above
                    } else {
                        below
                    }
                }
            }
            Algorithm::Lloyd => want,
        };
        out.push(((t.start * tp).min(rows), (t.end * tp).min(rows), tasks * tp));
    }
    Ok(out)
}

/// The error for fewer shards than processes.
fn too_few_shards(sh: &Shards, cfg: &Config, ranks: &Ranks) -> Error {
    Error::Input(format!(
        "{} processes, but the data makes only {} shards ({} tasks of {} rows, {} shards asked{}): at least one shard per process is needed",
        ranks.size(),
        sh.count(),
        sh.task_count(),
        cfg.task_points,
        cfg.shards,
        if cfg.algorithm == Algorithm::MiniBatch {
            format!(", at most {} per batch", cfg.batch_tasks)
        } else {
            String::new()
        }
    ))
}

/// Where this process's tasks are.
struct Plan<'a> {
    ranks: &'a Ranks,
    shards: Shards,
    /// This process's shards.
    mine: std::ops::Range<usize>,
    chunks: Vec<Chunk>,
    /// Index in `chunks` of each local task's first chunk, and the end.
    task_at: Vec<usize>,
    /// First local task.
    t0: u64,
    tp: u64,
    rows: u64,
    algorithm: Algorithm,
    batch_tasks: usize,
}

impl<'a> Plan<'a> {
    fn new(ranks: &'a Ranks, ds: &Dataset, cfg: &Config) -> Result<Plan<'a>> {
        let shards = shards(ds.rows, cfg);
        if shards.count() < ranks.size() {
            return Err(too_few_shards(&shards, cfg, ranks));
        }
        let want = rank_rows(ds.rows, cfg, ranks.rank(), ranks.size());
        let held: u64 = ds.part_rows.iter().map(|&n| u64::from(n)).sum();
        if want != (ds.first_row..ds.first_row + held) {
            return Err(Error::Input(format!(
                "process {} of {} holds rows {}..{}, but its shards are rows {}..{}",
                ranks.rank(),
                ranks.size(),
                ds.first_row,
                ds.first_row + held,
                want.start,
                want.end
            )));
        }
        let tp = cfg.task_points.max(1) as u64;
        let chunks = chunks(ds, cfg.task_points);
        let mine = shards.of_rank(ranks.rank(), ranks.size());
        let tasks = shards.tasks_of_rank(ranks.rank(), ranks.size());
        let mut task_at = Vec::with_capacity((tasks.end - tasks.start) as usize + 1);
        for (i, c) in chunks.iter().enumerate() {
            if task_at.len() as u64 <= c.task - tasks.start {
                task_at.push(i);
            }
        }
        task_at.push(chunks.len());
        Ok(Plan {
            ranks,
            shards,
            mine,
            chunks,
            task_at,
            t0: tasks.start,
            tp,
            rows: ds.rows,
            algorithm: cfg.algorithm,
            batch_tasks: cfg.batch_tasks,
        })
    }

    /// The chunks of local task `t` (global index).
    fn task(&self, t: u64) -> &[Chunk] {
        let i = (t - self.t0) as usize;
        &self.chunks[self.task_at[i]..self.task_at[i + 1]]
    }

    /// Rows of global task `t`.
    fn task_rows(&self, t: u64) -> u64 {
        (self.rows - t * self.tp).min(self.tp)
    }

    /// Mini-batch: the tasks shard `s` gives to batch `b`.
    fn batch_tasks(&self, s: usize, b: u64, batch_tasks: usize) -> std::ops::Range<u64> {
        let r = self.shards.tasks(s);
        let q = per_batch(&self.shards, s, batch_tasks);
        let a = (r.start + b * q).min(r.end);
        a..(a + q).min(r.end)
    }

    /// Mini-batch: batches in an epoch.
    fn batches(&self, batch_tasks: usize) -> u64 {
        (0..self.shards.count())
            .map(|s| {
                let r = self.shards.tasks(s);
                (r.end - r.start).div_ceil(per_batch(&self.shards, s, batch_tasks).max(1))
            })
            .max()
            .unwrap_or(0)
    }

    /// Rows held by this process.
    fn local_rows(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }

    /// Declares the order an epoch first touches the local partitions in.
    fn declare(&self, rt: &Runtime, ds: &Dataset, tasks: impl Iterator<Item = u64>) {
        let mut seen = vec![false; ds.parts.len()];
        let mut order = Vec::with_capacity(ds.parts.len());
        for t in tasks {
            for c in self.task(t) {
                if !seen[c.part] {
                    seen[c.part] = true;
                    order.push(ds.parts[c.part].id());
                }
            }
        }
        rt.hint_cycle(order);
    }

    /// This process's tasks in the order the algorithm's passes take them
    /// (Lloyd: row order; mini-batch: batch after batch, each walking the
    /// shards), each with its shard (counted from the first local one).
    /// Every shard's tasks come in task order.
    fn sweep_order(&self) -> Vec<(u64, usize)> {
        match self.algorithm {
            Algorithm::Lloyd => self.local_tasks(),
            Algorithm::MiniBatch => (0..self.batches(self.batch_tasks))
                .flat_map(|b| {
                    self.mine.clone().flat_map(move |s| {
                        self.batch_tasks(s, b, self.batch_tasks)
                            .map(move |t| (t, s - self.mine.start))
                    })
                })
                .collect(),
        }
    }

    /// The chunks of `tasks` (global index, shard), in order, and the shard
    /// (counted from the first local one) of each.
    fn chunks_of(&self, tasks: &[(u64, usize)]) -> (Vec<Chunk>, Vec<usize>) {
        let mut list = Vec::with_capacity(tasks.len());
        let mut owner = Vec::with_capacity(tasks.len());
        for &(task, o) in tasks {
            for c in self.task(task) {
                list.push(*c);
                owner.push(o);
            }
        }
        (list, owner)
    }

    /// This process's tasks in row order, each with its shard (counted
    /// from the first local one).
    fn local_tasks(&self) -> Vec<(u64, usize)> {
        self.mine
            .clone()
            .flat_map(|s| self.shards.tasks(s).map(move |t| (t, s)))
            .map(|(t, s)| (t, s - self.mine.start))
            .collect()
    }
}

/// The layout of a step's sums in one vector: per-cluster sums (`k x d`),
/// cluster weights (`k`), the inertia, and with `stats` the column sums
/// and sums of squares (`d` each).
#[derive(Clone, Copy)]
struct Packed {
    k: usize,
    d: usize,
    stats: bool,
}

impl Packed {
    fn len(self) -> usize {
        self.k * self.d + self.k + 1 + if self.stats { 2 * self.d } else { 0 }
    }

    /// Adds a task's partial results to `acc`.
    fn fold(self, acc: &mut [f64], p: &Partial) {
        let (k, d) = (self.k, self.d);
        add(&mut acc[..k * d], &p.sums);
        add(&mut acc[k * d..k * d + k], &p.wsum);
        acc[k * d + k] += p.inertia;
        if self.stats {
            let at = k * d + k + 1;
            add(&mut acc[at..at + d], &p.colsum);
            add(&mut acc[at + d..at + 2 * d], &p.colsq);
        }
    }

    fn unpack(self, mut v: Vec<f64>) -> Reduced {
        let (k, d) = (self.k, self.d);
        let at = k * d + k + 1;
        let (colsum, colsq) = if self.stats {
            (v[at..at + d].to_vec(), v[at + d..at + 2 * d].to_vec())
        } else {
            (Vec::new(), Vec::new())
        };
        let inertia = v[k * d + k];
        let wsum = v[k * d..k * d + k].to_vec();
        v.truncate(k * d);
        Reduced {
            sums: v,
            wsum,
            inertia,
            colsum,
            colsq,
        }
    }
}

/// Runs K-means on a loaded dataset: `cfg.n_init` runs (one with given
/// centres), the best kept.
pub fn run(rt: &Runtime, ds: &Dataset, cfg: &Config, on: impl FnMut(Event)) -> Result<Outcome> {
    run_on(rt, ds, cfg, &Ranks::single(), on)
}

/// [`run`] as one of `ranks`, each holding its share of the rows (loaded
/// with [`load_on`]). Collective: every rank calls it
/// with the same configuration, and every rank gets the same centres,
/// bit for bit those of one process; the labels, when asked, are all on
/// rank 0 (none on the others).
pub fn run_on(
    rt: &Runtime,
    ds: &Dataset,
    cfg: &Config,
    ranks: &Ranks,
    mut on: impl FnMut(Event),
) -> Result<Outcome> {
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
    let plan = Plan::new(ranks, ds, cfg)?;
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
        let mut o = run_once(rt, ds, cfg, &plan, seed, cfg.labels && runs == 1, &mut on)?;
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
    if cfg.labels && runs > 1 {
        on(Event::FinalPass);
        out.labels = final_pass(rt, ds, &plan, &out.centers, true)?.1;
    }
    out.init_inertia = init_inertia;
    Ok(out)
}

/// One run from the initialisation drawn with `seed`.
fn run_once(
    rt: &Runtime,
    ds: &Dataset,
    cfg: &Config,
    plan: &Plan<'_>,
    seed: u64,
    labels: bool,
    on: &mut impl FnMut(Event),
) -> Result<Outcome> {
    // Every pass (the initialisation's sample, the epochs or iterations,
    // the final pass) sweeps in the same order: the resident part of the
    // data chosen during one stays right for the next.
    plan.declare(rt, ds, plan.sweep_order().into_iter().map(|(t, _)| t));
    let t = Instant::now();
    let (mut centers, sample_variance) = initial_centers(rt, ds, cfg, plan.ranks, seed)?;
    on(Event::Initialized {
        seconds: t.elapsed().as_secs_f64(),
    });
    let (k, d) = (cfg.k, ds.dims);
    let mut epoch_seconds = Vec::new();
    let mut epoch_inertia = Vec::new();
    let mut epoch_kernel = Vec::new();
    let mut converged = None;
    let mut steps = 0;
    let mut combine = (0.0f64, 0usize);
    let mut timed = |f: &mut dyn FnMut() -> Result<Vec<f64>>| -> Result<Vec<f64>> {
        let t = Instant::now();
        let r = f();
        combine.0 += t.elapsed().as_secs_f64();
        combine.1 += 1;
        r
    };
    // Progress counts this process's rows, scaled to the whole data.
    let scale = ds.rows as f64 / plan.local_rows().max(1) as f64;
    let progress = |done: u64| ((done as f64 * scale) as u64).min(ds.rows);
    match cfg.algorithm {
        Algorithm::MiniBatch => {
            // scikit-learn's early stopping: the tolerance scaled by the
            // data's mean variance (estimated on the initialisation
            // sample), and the smoothed batch inertia.
            let tol = cfg.tol * sample_variance;
            let watch = cfg.tol > 0.0 || cfg.max_no_improvement.is_some();
            let mut totals = vec![0f64; k];
            let mut ewa: Option<f64> = None;
            let mut ewa_min: Option<f64> = None;
            let mut no_improvement = 0usize;
            let packed = Packed { k, d, stats: false };
            let batches = plan.batches(cfg.batch_tasks);
            let bt = cfg.batch_tasks;
            for epoch in 0..cfg.epochs {
                let t = Instant::now();
                let mut inertia = 0.0;
                let mut kernel = 0.0;
                let mut done = 0u64;
                for b in 0..batches {
                    let tasks: Vec<(u64, usize)> = plan
                        .mine
                        .clone()
                        .flat_map(|s| {
                            plan.batch_tasks(s, b, bt)
                                .map(move |t| (t, s - plan.mine.start))
                        })
                        .collect();
                    let (list, owner) = plan.chunks_of(&tasks);
                    // Room for the batch's sums and the partial sums in
                    // flight (a few: they are folded as they come).
                    rt.make_room((plan.mine.len() + IN_FLIGHT) * packed.len() * 8);
                    let shared = Arc::new(centers.clone());
                    let sums_only = Want {
                        sums: true,
                        ..Want::default()
                    };
                    let mut accs = vec![zeros::<f64>(packed.len()); plan.mine.len()];
                    sweep(rt, ds, &list, &shared, sums_only, None, |i, p| {
                        packed.fold(&mut accs[owner[i]], &p);
                        kernel += p.kernel_seconds;
                        Ok(())
                    })?;
                    let r =
                        packed.unpack(timed(&mut || plan.ranks.ordered_sum(&accs, packed.len()))?);
                    drop(accs);
                    inertia += r.inertia;
                    let before = (cfg.tol > 0.0).then(|| centers.values.clone());
                    minibatch_update(&mut centers, &mut totals, &r.sums, &r.wsum);
                    let rows: u64 = (0..plan.shards.count())
                        .flat_map(|s| plan.batch_tasks(s, b, bt))
                        .map(|t| plan.task_rows(t))
                        .sum();
                    done += list.iter().map(|c| c.len as u64).sum::<u64>();
                    steps += 1;
                    on(Event::Progress {
                        done: progress(done),
                        total: ds.rows,
                    });
                    // The first step's inertia is the initialisation's.
                    if !watch || steps == 1 {
                        continue;
                    }
                    let batch_inertia = r.inertia / rows as f64;
                    let alpha = (rows as f64 * 2.0 / (ds.rows as f64 + 1.0)).min(1.0);
                    let e =
                        ewa.map_or(batch_inertia, |e| e * (1.0 - alpha) + batch_inertia * alpha);
                    ewa = Some(e);
                    if let Some(before) = before {
                        if squared_shift(&before, &centers.values) <= tol {
                            converged = Some(Converged::CenterShift);
                            break;
                        }
                    }
                    if ewa_min.is_none_or(|m| e < m) {
                        no_improvement = 0;
                        ewa_min = Some(e);
                    } else {
                        no_improvement += 1;
                    }
                    if cfg.max_no_improvement.is_some_and(|m| no_improvement >= m) {
                        converged = Some(Converged::NoImprovement);
                        break;
                    }
                }
                let secs = t.elapsed().as_secs_f64();
                epoch_seconds.push(secs);
                epoch_inertia.push(inertia);
                epoch_kernel.push(kernel);
                on(Event::Epoch {
                    index: epoch,
                    seconds: secs,
                    inertia,
                });
                if let Some(why) = converged {
                    on(Event::Converged { steps, why });
                    break;
                }
            }
        }
        Algorithm::Lloyd => {
            // Every task's sums are added to its shard's, in task order,
            // then the shards' in shard order. The first iteration also
            // measures the data's per-feature variance (around the first
            // initial centre) for the tolerance, as scikit-learn's
            // `_tolerance`.
            let reference = Arc::new(centers.row(0).to_vec());
            let mut tol = 0.0;
            let tasks = plan.local_tasks();
            for it in 0..cfg.iterations {
                let t = Instant::now();
                let shared = Arc::new(centers.clone());
                let stats = it == 0 && cfg.tol > 0.0;
                let packed = Packed { k, d, stats };
                rt.make_room((plan.mine.len() + IN_FLIGHT) * packed.len() * 8);
                let mut accs = vec![zeros::<f64>(packed.len()); plan.mine.len()];
                let mut done = 0u64;
                let mut kernel = 0.0;
                // One batch per pass: the partial sums are folded as they
                // come, so only a few are held at once.
                let (list, owner) = plan.chunks_of(&tasks);
                let want = Want {
                    sums: true,
                    ..Want::default()
                };
                let reference = stats.then_some(&reference);
                sweep(rt, ds, &list, &shared, want, reference, |i, p| {
                    packed.fold(&mut accs[owner[i]], &p);
                    kernel += p.kernel_seconds;
                    done += list[i].len as u64;
                    if i % PROGRESS_EVERY == PROGRESS_EVERY - 1 || i + 1 == list.len() {
                        on(Event::Progress {
                            done: progress(done),
                            total: ds.rows,
                        });
                    }
                    Ok(())
                })?;
                let r = packed.unpack(timed(&mut || plan.ranks.ordered_sum(&accs, packed.len()))?);
                drop(accs);
                if stats {
                    let n = ds.rows as f64;
                    let var: f64 = r
                        .colsum
                        .iter()
                        .zip(&r.colsq)
                        .map(|(s1, s2)| (s2 / n - (s1 / n) * (s1 / n)).max(0.0))
                        .sum::<f64>()
                        / d as f64;
                    tol = cfg.tol * var;
                }
                let mut values = centers.values.clone();
                for c in 0..k {
                    if r.wsum[c] > 0.0 {
                        for j in 0..d {
                            values[c * d + j] = (r.sums[c * d + j] / r.wsum[c]) as f32;
                        }
                    }
                }
                let shift = squared_shift(&centers.values, &values);
                centers = Centers::new(k, d, values);
                let secs = t.elapsed().as_secs_f64();
                epoch_seconds.push(secs);
                epoch_inertia.push(r.inertia);
                epoch_kernel.push(kernel);
                on(Event::Epoch {
                    index: it,
                    seconds: secs,
                    inertia: r.inertia,
                });
                if shift <= tol {
                    converged = Some(Converged::CenterShift);
                    on(Event::Converged {
                        steps: it + 1,
                        why: Converged::CenterShift,
                    });
                    break;
                }
            }
            steps = epoch_seconds.len();
        }
    }
    on(Event::FinalPass);
    let (inertia, labels) = final_pass(rt, ds, plan, &centers, labels)?;
    Ok(Outcome {
        centers,
        inertia,
        iterations: epoch_seconds.len(),
        epoch_seconds,
        epoch_inertia,
        epoch_kernel_seconds: epoch_kernel,
        labels,
        steps,
        converged,
        best_init: 0,
        init_inertia: Vec::new(),
        combine_seconds: combine.0,
        combines: combine.1,
    })
}

/// `a += b`, element by element.
fn add(a: &mut [f64], b: &[f64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
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

/// Runs one read-only assignment task per chunk; results in order.
/// Runs `plan`'s chunks as one batch and hands each chunk's partial
/// results to `each` (with the chunk's index in `plan`) in plan order, as
/// they come: only the results that finish ahead of an earlier chunk are
/// held, so a whole sweep can be one batch (no barrier every few tasks)
/// with a fold whose order does not depend on the scheduling. Every chunk
/// runs; the first error is returned.
fn sweep(
    rt: &Runtime,
    ds: &Dataset,
    plan: &[Chunk],
    c: &Arc<Centers>,
    want: Want,
    reference: Option<&Arc<Vec<f32>>>,
    each: impl FnMut(usize, Partial) -> Result<()>,
) -> Result<()> {
    let mut b = rt.batch();
    for ch in plan {
        let c = c.clone();
        let ch = *ch;
        let reference = reference.cloned();
        b.read(&ds.parts[ch.part], move |p: &Partition| {
            assign(
                p,
                ch.start,
                ch.len,
                &c,
                want,
                reference.as_deref().map(Vec::as_slice),
            )
        });
    }
    crate::fold_in_order(b, each)
}

/// A step's sums.
struct Reduced {
    sums: Vec<f64>,
    wsum: Vec<f64>,
    inertia: f64,
    colsum: Vec<f64>,
    colsq: Vec<f64>,
}

/// The mini-batch step: each centre moves to the (weighted) running mean
/// of all the points it has been assigned so far; `totals` holds each
/// centre's accumulated weight (its count without sample weights).
fn minibatch_update(c: &mut Centers, totals: &mut [f64], sums: &[f64], w: &[f64]) {
    let d = c.dims;
    for j in 0..c.k {
        if w[j] == 0.0 {
            continue;
        }
        let old = totals[j];
        totals[j] += w[j];
        let new = totals[j];
        for t in 0..d {
            let v = f64::from(c.values[j * d + t]);
            c.values[j * d + t] = ((v * old + sums[j * d + t]) / new) as f32;
        }
    }
    *c = Centers::new(c.k, d, std::mem::take(&mut c.values));
}

/// Inertia of `c` over all the data (added by shard, then across shards),
/// and the labels when asked (all of them on rank 0, none elsewhere).
fn final_pass(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    c: &Centers,
    labels: bool,
) -> Result<(f64, Option<Vec<u32>>)> {
    let shared = Arc::new(c.clone());
    let mut accs = vec![vec![0f64]; plan.mine.len()];
    let mut all = labels.then(|| vec![0u32; plan.local_rows() as usize]);
    let want = Want {
        labels,
        ..Want::default()
    };
    // In the passes' order (each shard's tasks in task order); the labels
    // land at their rows.
    let (list, owner) = plan.chunks_of(&plan.sweep_order());
    sweep(rt, ds, &list, &shared, want, None, |i, p| {
        accs[owner[i]][0] += p.inertia;
        if let Some(all) = all.as_mut() {
            let at = (list[i].row - ds.first_row) as usize;
            all[at..at + p.labels.len()].copy_from_slice(&p.labels);
        }
        Ok(())
    })?;
    let inertia = plan.ranks.ordered_sum(&accs, 1)?[0];
    let labels = match all {
        Some(l) => plan.ranks.gather_u32(&l)?,
        None => None,
    };
    Ok((inertia, labels))
}

/// Labels every row with its nearest centre (ties to the lowest index, as
/// scikit-learn) and, when `dists` is set, its squared distance to it,
/// sweeping the data in order. `on_block` receives the labels (and
/// distances, else an empty slice) of consecutive blocks of rows, in row
/// order, so the caller can stream them out: at most a few blocks of
/// results are held at once.
pub fn predict(
    rt: &Runtime,
    ds: &Dataset,
    centers: &Centers,
    dists: bool,
    task_points: usize,
    mut on_block: impl FnMut(&[u32], &[f32]) -> Result<()>,
) -> Result<()> {
    if centers.dims != ds.dims {
        return Err(Error::Input(format!(
            "the centres have {} dimensions, the data has {}",
            centers.dims, ds.dims
        )));
    }
    let shared = Arc::new(centers.clone());
    let want = Want {
        labels: true,
        dists,
        ..Want::default()
    };
    let list = chunks(ds, task_points.max(1));
    sweep(rt, ds, &list, &shared, want, None, |_, p| {
        on_block(&p.labels, &p.dists)
    })
}

/// Points sampled for the initialisation: at least 10,000 and 20 per
/// cluster, at most all of them.
fn sample_size(rows: u64, k: usize) -> u64 {
    rows.min((20 * k as u64).max(10_000))
}

/// Bytes the k-means++ or random initialisation's sample of `rows` points
/// of `dims` float32 takes, for `k` clusters. It is held outside the
/// executors while the initialisation runs (it does not depend on the cap,
/// so that capped and uncapped runs start from the same centres).
pub fn init_sample_bytes(rows: u64, dims: usize, k: usize) -> u64 {
    sample_size(rows, k) * dims as u64 * 4
}

/// A sample is read row by row from the input (rather than from the built
/// partitions) when it holds at most one row in this many (and the pages
/// under its rows are at most a quarter of the file's: see
/// `Partitioned::rows_unbuilt`).
const SPARSE: u64 = 4;

/// A uniform sample of rows, chosen by hashing the row index with the seed
/// (so it does not depend on the partitioning), in row order: the values,
/// and the rows' sample weights (empty when the data has none). Every
/// rank gets the whole sample.
fn sample(
    rt: &Runtime,
    ds: &Dataset,
    ranks: &Ranks,
    want: u64,
    seed: u64,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let threshold = if want >= ds.rows {
        u64::MAX
    } else {
        ((want as u128 * (1u128 << 64)) / ds.rows as u128) as u64
    };
    let picked = move |r: u64| threshold == u64::MAX || mix(seed ^ 0x5a3b_1e00, r) < threshold;
    // A sparse sample of partitions not built yet is read row by row from
    // the input: the whole input is then read once, by the first sweep,
    // while the workers compute, instead of once more for the sample.
    let local = ds.part_rows.iter().map(|&n| u64::from(n)).sum::<u64>();
    let direct = if want.saturating_mul(SPARSE) <= ds.rows && ds.rows_readable() {
        let rows: Vec<u64> = (ds.first_row..ds.first_row + local)
            .filter(|&r| picked(r))
            .collect();
        ds.rows_unbuilt(&rows)?
    } else {
        None
    };
    let (mut x, mut w) = match direct {
        Some(xw) => xw,
        None => {
            let mut b = rt.batch();
            for h in &ds.parts {
                b.read(h, move |p: &Partition| {
                    let mut out = Vec::new();
                    let mut w = Vec::new();
                    for i in 0..p.rows as usize {
                        if picked(p.first_row + i as u64) {
                            out.extend_from_slice(p.row(i));
                            if !p.weights.is_empty() {
                                w.push(p.weights[i]);
                            }
                        }
                    }
                    (out, w)
                });
            }
            let (mut x, mut w) = (Vec::new(), Vec::new());
            crate::fold_in_order(b, |_, (a, b)| {
                x.extend_from_slice(&a);
                w.extend_from_slice(&b);
                Ok(())
            })?;
            (x, w)
        }
    };
    if ranks.size() > 1 {
        x = ranks.all_gather(&x)?;
        w = ranks.all_gather(&w)?;
    }
    Ok((x, w))
}

/// Squared Euclidean distance (k-means++ on the sample), with AVX2 where
/// the CPU has it: the bits do not depend on which.
fn sq_dist(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { sq_dist_avx2(a, b) };
    }
    sq_dist_lanes(a, b)
}

/// [`sq_dist`] compiled for AVX2: the same operations in the same order
/// (Rust never fuses a multiply and an add by itself), so the same bits,
/// four times as many lanes per instruction as the SSE2 baseline.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sq_dist_avx2(a: &[f32], b: &[f32]) -> f32 {
    sq_dist_lanes(a, b)
}

/// 32 independent lanes (enough chains to hide the add latency), summed
/// in a fixed order at the end.
#[inline(always)]
fn sq_dist_lanes(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 32;
    let mut acc = [0f32; L];
    let mut ca = a.chunks_exact(L);
    let mut cb = b.chunks_exact(L);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for t in 0..L {
            let v = x[t] - y[t];
            acc[t] += v * v;
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += (x - y) * (x - y);
    }
    acc.iter().sum::<f32>() + tail
}

/// Squared distances from every row of `s` (`d` columns) to the rows
/// `centres` of `s`: `out[i * centres.len() + t]` for row `i` and centre
/// `t`, on `threads` threads over contiguous ranges of rows. Each value is
/// `sq_dist` of the two rows, whatever the thread count.
fn distances_to(s: &[f32], d: usize, centres: &[usize], threads: usize) -> Vec<f32> {
    let n = s.len() / d.max(1);
    let m = centres.len();
    let mut out = vec![0f32; n * m];
    let per = n.div_ceil(threads.max(1)).max(1);
    let blocks: Vec<_> = out.chunks_mut(per * m.max(1)).enumerate().collect();
    crate::par::for_each(blocks, threads, |(r, block)| {
        for (j, o) in block.chunks_exact_mut(m).enumerate() {
            let i = r * per + j;
            let x = &s[i * d..(i + 1) * d];
            for (t, &c) in centres.iter().enumerate() {
                o[t] = sq_dist(x, &s[c * d..(c + 1) * d]);
            }
        }
    });
    out
}

/// Mean over the columns of each column's variance, in f64.
fn mean_variance(s: &[f32], d: usize) -> f64 {
    let n = (s.len() / d.max(1)) as f64;
    if n == 0.0 || d == 0 {
        return 0.0;
    }
    let mut mean = vec![0f64; d];
    for r in s.chunks_exact(d) {
        add(
            &mut mean,
            &r.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        );
    }
    mean.iter_mut().for_each(|m| *m /= n);
    let mut var = 0f64;
    for r in s.chunks_exact(d) {
        for (v, m) in r.iter().zip(&mean) {
            let t = f64::from(*v) - m;
            var += t * t;
        }
    }
    var / n / d as f64
}

/// Draws an index with probability proportional to `w` (`total` their
/// sum): the first whose running sum passes `r * total`; never one of
/// weight 0.
fn draw(w: &[f64], total: f64, r: f64) -> Option<usize> {
    let mut left = r * total;
    let mut last = None;
    for (i, &v) in w.iter().enumerate() {
        if v > 0.0 {
            if left < v {
                return Some(i);
            }
            left -= v;
            last = Some(i);
        }
    }
    // Rounding left a little over: the last candidate.
    last
}

/// The initial centres of a run drawn with `seed`, and the mean
/// per-feature variance of the initialisation sample (the scale of the
/// mini-batch tolerance).
fn initial_centers(
    rt: &Runtime,
    ds: &Dataset,
    cfg: &Config,
    ranks: &Ranks,
    seed: u64,
) -> Result<(Centers, f64)> {
    let d = ds.dims;
    let k = cfg.k;
    if let Init::Given(v) = &cfg.init {
        if v.len() != k * d {
            return Err(Error::Input(format!(
                "the initial centres hold {} values; k x dims = {k} x {d} needs {}",
                v.len(),
                k * d
            )));
        }
        let variance = if cfg.tol > 0.0 && cfg.algorithm == Algorithm::MiniBatch {
            let want = sample_size(ds.rows, k);
            mean_variance(&sample(rt, ds, ranks, want, seed)?.0, d)
        } else {
            0.0
        };
        return Ok((Centers::new(k, d, v.clone()), variance));
    }
    let want = sample_size(ds.rows, k);
    // Room for the sample, its pieces and the distances.
    rt.make_room(want as usize * (d * 8 + 16));
    let (mut s, mut sw) = sample(rt, ds, ranks, want, seed)?;
    let mut n = s.len() / d;
    let positive = |sw: &[f32], n: usize| {
        if sw.is_empty() {
            n
        } else {
            sw.iter().filter(|&&w| w > 0.0).count()
        }
    };
    if positive(&sw, n) < k {
        // A sparse hash sample can fall short for k close to the number of
        // points: take every point then.
        (s, sw) = sample(rt, ds, ranks, ds.rows, seed)?;
        n = s.len() / d;
        if positive(&sw, n) < k {
            return Err(Error::Input(format!(
                "k = {k} is larger than the number of points with a positive weight ({})",
                positive(&sw, n)
            )));
        }
    }
    let variance = mean_variance(&s, d);
    // Equal weights are no weights: the same draws as unweighted data.
    let weights: Option<Vec<f64>> = match sw.first() {
        Some(&w0) if sw.iter().any(|&w| w != w0) => {
            Some(sw.iter().map(|&w| f64::from(w)).collect())
        }
        _ => None,
    };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x1717_c0de);
    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    match (&cfg.init, &weights) {
        (Init::Random, None) => {
            let mut idx: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + (rng.random::<u64>() % (n - i) as u64) as usize;
                idx.swap(i, j);
                chosen.push(idx[i]);
            }
        }
        (Init::Random, Some(w)) => {
            // Without replacement, each draw proportional to the weight.
            let mut left = w.clone();
            for _ in 0..k {
                let total: f64 = left.iter().sum();
                let pick = draw(&left, total, rng.random::<f64>())
                    .ok_or_else(|| Error::Input("no point with a positive weight left".into()))?;
                left[pick] = 0.0;
                chosen.push(pick);
            }
        }
        _ => kmeans_plus_plus(rt, &s, d, k, weights.as_deref(), &mut rng, &mut chosen)?,
    }
    let mut values = Vec::with_capacity(k * d);
    for &i in &chosen {
        values.extend_from_slice(&s[i * d..(i + 1) * d]);
    }
    // Every rank drew the same centres from the same sample; rank 0's are
    // the ones used everywhere all the same (a rank on another CPU model
    // cannot drift).
    ranks.broadcast(&mut values);
    Ok((Centers::new(k, d, values), variance))
}

/// Greedy k-means++ on the sample `s` (`d` columns), weighted by `w` when
/// given: the first centre is drawn with probability proportional to the
/// weight; each next one with probability proportional to the weight times
/// the squared distance to the nearest chosen centre; of 2 + ln(k) such
/// draws, the one that lowers the (weighted) total most is kept.
fn kmeans_plus_plus(
    rt: &Runtime,
    s: &[f32],
    d: usize,
    k: usize,
    w: Option<&[f64]>,
    rng: &mut Xoshiro256PlusPlus,
    chosen: &mut Vec<usize>,
) -> Result<()> {
    let n = s.len() / d;
    let trials = 2 + (k as f64).ln() as usize;
    let threads = rt.workers().max(1);
    let weight = |i: usize| w.map_or(1.0, |w| w[i]);
    let first = match w {
        None => (rng.random::<u64>() % n as u64) as usize,
        Some(w) => {
            let total: f64 = w.iter().sum();
            draw(w, total, rng.random::<f64>())
                .ok_or_else(|| Error::Input("no point has a positive weight".into()))?
        }
    };
    chosen.push(first);
    let mut best = distances_to(s, d, &[first], threads);
    let mut cand_d = vec![0f32; n];
    let mut keep_d = vec![0f32; n];
    let mut mass = vec![0f64; if w.is_some() { n } else { 0 }];
    while chosen.len() < k {
        let total: f64 = match w {
            None => best.iter().map(|&v| f64::from(v)).sum(),
            Some(w) => {
                for (m, (&b, &wi)) in mass.iter_mut().zip(best.iter().zip(w)) {
                    *m = wi * f64::from(b);
                }
                mass.iter().sum()
            }
        };
        if total <= 0.0 {
            // Every remaining point (of positive weight) coincides with a
            // centre.
            let next = (0..n)
                .find(|&i| !chosen.contains(&i) && weight(i) > 0.0)
                .or_else(|| (0..n).find(|i| !chosen.contains(i)))
                .unwrap_or(0);
            chosen.push(next);
            continue;
        }
        let mut winner: Option<(f64, usize)> = None;
        // The draws depend only on `best`: draw them all, then measure
        // every candidate in one parallel pass.
        let picks: Vec<usize> = (0..trials)
            .map(|_| match w {
                None => {
                    let mut r = rng.random::<f64>() * total;
                    for (i, &b) in best.iter().enumerate() {
                        if r < f64::from(b) {
                            return i;
                        }
                        r -= f64::from(b);
                    }
                    n - 1
                }
                Some(_) => draw(&mass, total, rng.random::<f64>()).unwrap_or(first),
            })
            .collect();
        let dist = distances_to(s, d, &picks, threads);
        for (t, &pick) in picks.iter().enumerate() {
            let mut pot = 0f64;
            for (i, c) in cand_d.iter_mut().enumerate() {
                *c = best[i].min(dist[i * trials + t]);
                pot += match w {
                    None => f64::from(*c),
                    Some(w) => w[i] * f64::from(*c),
                };
            }
            if winner.is_none_or(|(v, _)| pot < v) {
                winner = Some((pot, pick));
                std::mem::swap(&mut keep_d, &mut cand_d);
            }
        }
        let Some((_, pick)) = winner else { break };
        chosen.push(pick);
        std::mem::swap(&mut best, &mut keep_d);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Source;

    /// A task's per-centre sums are, bit for bit, its rows added one by
    /// one in row order to a zero: for a centre whose only row is -0.0
    /// (0.0 + -0.0 is +0.0), for a centre with no rows, and with weights.
    #[test]
    fn a_tasks_sums_are_its_rows_added_to_zeros_in_row_order() {
        let (d, n) = (37, 300);
        let mut z = 0x9e37_79b9_u32;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            z as f32 / u32::MAX as f32
        };
        // Centre 0 at the origin, centre 1 far from every row, the rest
        // among the rows (values in 5..6).
        let k = 9;
        let mut centres = vec![0f32; d];
        centres.extend(std::iter::repeat_n(1000.0, d));
        centres.extend((0..(k - 2) * d).map(|_| 5.0 + next()));
        let mut x: Vec<f32> = (0..n * d).map(|_| 5.0 + next()).collect();
        // Row 17 is -0.0 everywhere: centre 0's only row.
        x[17 * d..18 * d].fill(-0.0);
        let weights: Vec<f32> = (0..n).map(|_| 0.5 + next()).collect();
        let c = Centers::new(k, d, centres);
        let want = Want {
            sums: true,
            labels: true,
            dists: false,
        };
        for weighted in [false, true] {
            let p = if weighted {
                Partition::with_weights(0, d, x.clone(), weights.clone())
            } else {
                Partition::new(0, d, x.clone())
            };
            let (start, len) = (3, n - 5);
            let out = assign(&p, start, len, &c, want, None);
            let mut reference = vec![0f64; k * d];
            for (r, &label) in out.labels.iter().enumerate() {
                let i = start + r;
                let s = &mut reference[label as usize * d..(label as usize + 1) * d];
                for (acc, &v) in s.iter_mut().zip(&x[i * d..(i + 1) * d]) {
                    *acc += if weighted {
                        f64::from(weights[i]) * f64::from(v)
                    } else {
                        f64::from(v)
                    };
                }
            }
            assert_eq!(out.counts[0], 1, "row 17 alone is nearest the origin");
            assert_eq!(out.counts[1], 0, "no row is nearest centre 1");
            assert_eq!(out.sums.len(), k * d);
            for (j, (a, b)) in out.sums.iter().zip(&reference).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "weighted {weighted}: centre {}, column {}: {a} against {b}",
                    j / d,
                    j % d
                );
            }
        }
    }

    /// The fused kernel finds the centre the GEMM path finds, at the same
    /// distance to float rounding, for every shape around its tile and
    /// block sizes, ties going to the lowest index.
    #[test]
    fn the_fused_kernel_agrees_with_the_gemm_path() {
        let mut z = 0x2545_f491_u32;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            (z as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let mut checked = 0;
        for &(n, d, k) in &[
            (1, 1, 1),
            (7, 3, 2),
            (13, 257, 8),
            (49, 300, 9),
            (50, 513, 17),
            (97, 64, 24),
            (100, 1000, 100),
            (6, 5, 33),
        ] {
            let x: Vec<f32> = (0..n * d).map(|_| next()).collect();
            let mut values: Vec<f32> = (0..k * d).map(|_| next()).collect();
            if k > 3 {
                // Centre 3 repeats centre 1: ties must go to 1.
                let (a, b) = values.split_at_mut(3 * d);
                b[..d].copy_from_slice(&a[d..2 * d]);
            }
            let c = Centers::new(k, d, values);
            let Some(packed) = &c.packed else {
                eprintln!("this CPU has no AVX2 and FMA: the fused kernel is not used");
                return;
            };
            let xn: Vec<f32> = x
                .chunks_exact(d)
                .map(|r| r.iter().map(|v| v * v).sum())
                .collect();
            let (mut b1, mut d1) = (vec![0u32; n], vec![0f32; n]);
            let (mut b2, mut d2) = (vec![0u32; n], vec![0f32; n]);
            let mut g = vec![0f32; n * k];
            gemm_nearest(&x, &xn, &c, &mut g, &mut b1, &mut d1);
            packed.nearest(&x, &xn, &mut b2, &mut d2);
            for i in 0..n {
                let row = &x[i * d..(i + 1) * d];
                let exact = |j: u32| -> f64 {
                    row.iter()
                        .zip(c.row(j as usize))
                        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                        .sum()
                };
                let scale = 1e-5 * (f64::from(xn[i]) + 1.0);
                assert!(
                    (f64::from(d2[i]) - exact(b2[i])).abs() <= scale,
                    "{n} {d} {k} row {i}"
                );
                assert!(
                    (f64::from(d1[i]) - f64::from(d2[i])).abs() <= scale,
                    "{n} {d} {k} row {i}"
                );
                if b1[i] != b2[i] {
                    // Only a near tie may go either way.
                    assert!(
                        (exact(b1[i]) - exact(b2[i])).abs() <= scale,
                        "{n} {d} {k} row {i}"
                    );
                }
                assert_ne!(b2[i], 3, "the tie goes to the lower index");
                checked += 1;
            }
        }
        assert!(checked > 300);
    }

    /// A sparse sample of a file not read yet is read row by row (only
    /// the pages under its rows: well under the file), and it is the
    /// sample the built partitions give, bit for bit: `.npy` rows (in
    /// place), sample weights, `.fvecs` rows (converted).
    #[test]
    fn a_sparse_sample_read_row_by_row_is_the_partitions_sample() {
        let dir = tempfile::tempdir().unwrap();
        let (n, d) = (20_000usize, 256usize);
        let x: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7919) % 1000) as f32 / 10.0 - 50.0)
            .collect();
        let npy = dir.path().join("x.npy");
        crate::npy::write_array(&npy, &[n as u64, d as u64], &x).unwrap();
        let fvecs = dir.path().join("x.fvecs");
        let mut bytes = Vec::with_capacity(n * (d + 1) * 4);
        for row in x.chunks_exact(d) {
            bytes.extend_from_slice(&(d as i32).to_le_bytes());
            for v in row {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        std::fs::write(&fvecs, bytes).unwrap();
        let weights = dir.path().join("w.npy");
        let w: Vec<f32> = (0..n).map(|i| 0.25 + (i % 5) as f32).collect();
        crate::npy::write_array(&weights, &[n as u64], &w).unwrap();
        let ranks = Ranks::single();
        for (name, src, wpath) in [
            ("npy", Source::Npy(npy.clone()), None),
            (
                "npy, weighted",
                Source::Npy(npy.clone()),
                Some(weights.as_path()),
            ),
            ("fvecs", Source::Fvecs(fvecs.clone()), None),
        ] {
            let rt = Runtime::builder()
                .workers(2)
                .prefetch(false)
                .build()
                .unwrap();
            let ds = load_weighted(&rt, &src, wpath, 256 << 10, |_, _| {}).unwrap();
            let file = match &src {
                Source::Npy(p) | Source::Fvecs(p) => std::fs::metadata(p).unwrap().len(),
                _ => unreachable!(),
            };
            let (x1, w1) = sample(&rt, &ds, &ranks, 500, 7).unwrap();
            let read = ds.input_bytes_read();
            assert!(
                read > 0 && read * 8 < file,
                "{name}: the sparse sample read {read} of {file} bytes"
            );
            assert!(
                x1.len() > 100 * d && x1.len() % d == 0,
                "{name}: {}",
                x1.len()
            );
            assert_eq!(w1.len(), if wpath.is_some() { x1.len() / d } else { 0 });
            // Every partition built (and resident: no cap): the same
            // sample comes from them, with no read of the file.
            let mut b = rt.batch();
            for h in &ds.parts {
                b.read(h, |p: &Partition| p.rows);
            }
            b.run().unwrap();
            let before = ds.input_bytes_read();
            let (x2, w2) = sample(&rt, &ds, &ranks, 500, 7).unwrap();
            assert_eq!(ds.input_bytes_read(), before, "{name}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert!(bits(&x1) == bits(&x2), "{name}: the samples differ");
            assert!(bits(&w1) == bits(&w2), "{name}: the weights differ");
        }
    }

    #[test]
    fn row_sums_bits_do_not_depend_on_the_vector_width() {
        let mut z = 0x9e37_79b9_u32;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            (z as f32 / u32::MAX as f32) * 2e3 - 1e3
        };
        for d in [1, 7, 8, 9, 31, 1000] {
            let rows: Vec<f32> = (0..20 * d).map(|_| next()).collect();
            for w in [None, Some(0.3), Some(1.0 / 3.0)] {
                let (mut a, mut b) = (vec![0.1f64; d], vec![0.1f64; d]);
                for x in rows.chunks_exact(d) {
                    add_row(&mut a, x, w);
                    for (acc, &v) in b.iter_mut().zip(x) {
                        *acc += w.map_or(f64::from(v), |w| w * f64::from(v));
                    }
                }
                let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "d = {d}, weight {w:?}");
            }
        }
    }

    /// The AVX2 path gives the baseline's bits, for every length around
    /// the lane count.
    #[test]
    fn sq_dist_bits_do_not_depend_on_the_instruction_set() {
        let mut z = 0x9e37_79b9_u32;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            (z as f32 / u32::MAX as f32) * 200.0 - 100.0
        };
        for len in 0..100 {
            let a: Vec<f32> = (0..len).map(|_| next()).collect();
            let b: Vec<f32> = (0..len).map(|_| next()).collect();
            let direct: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
                .sum();
            let got = sq_dist(&a, &b);
            assert_eq!(got.to_bits(), sq_dist_lanes(&a, &b).to_bits(), "{len}");
            assert!((f64::from(got) - direct).abs() <= 1e-5 * direct.max(1.0));
        }
    }
}
