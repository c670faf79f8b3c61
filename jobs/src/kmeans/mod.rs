//! Memory-capped K-means on the outcore runtime: mini-batch (the default)
//! and Lloyd.
//!
//! The data lives in [`Partition`] executors, swept in a fixed cyclic
//! order (declared to the runtime with `hint_cycle`), so the eviction queue
//! keeps a fixed part of the data resident and prefetches the rest.
//! Partitions are only read, so after their first write they are evicted
//! clean (dropped, not rewritten).
//!
//! Distances use the GEMM identity `|x - c|^2 = |x|^2 - 2 x.c + |c|^2`
//! (matrixmultiply's `sgemm`). Each task returns per-cluster sums and counts
//! for its rows; the driver adds them up in submission order, so results
//! are bit-for-bit the same whatever the cap, the policy or the timing.
//!
//! **Empty clusters**: a centre that receives no point in a step (a
//! mini-batch or a Lloyd iteration) keeps its position.

mod data;

use std::sync::Arc;
use std::time::Instant;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

pub use data::{load, Dataset, Partition};

use crate::error::{Error, Result};
use crate::input::mix;
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
}

impl Centers {
    /// Centres from row-major values.
    pub fn new(k: usize, dims: usize, values: Vec<f32>) -> Centers {
        let norms = values
            .chunks_exact(dims.max(1))
            .map(|c| c.iter().map(|x| x * x).sum())
            .collect();
        Centers {
            k,
            dims,
            values,
            norms,
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

/// Lloyd: tasks per batch (each holds a `k x dims` partial sum until the
/// batch is reduced).
const LLOYD_GROUP: usize = 32;

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

/// A zeroed vector whose pages are written, not mapped from the zero page.
///
/// `vec![0.0; n]` asks the allocator for zeroed memory, which for large
/// sizes is fresh pages nobody has touched. Accumulating into them reads
/// first (mapping the shared zero page) and then writes, and every such
/// write fault flushes the page from the other cores' TLBs: in a process
/// with workers on every core that cost 12% of K-means' time. Writing the
/// zeros up front takes one ordinary fault per page instead.
fn zeros<T: Copy + Default>(n: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, T::default());
    v
}

/// Assigns rows `start..start + len` of `p` to their nearest centres.
fn assign(p: &Partition, start: usize, len: usize, c: &Centers, want: Want) -> Partial {
    let d = c.dims;
    let k = c.k;
    let (want_sums, want_labels) = (want.sums, want.labels);
    let mut out = Partial {
        sums: if want_sums { zeros(k * d) } else { Vec::new() },
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
    };
    let mut g = zeros::<f32>(BLOCK.min(len.max(1)) * k);
    let mut row = start;
    while row < start + len {
        let n = BLOCK.min(start + len - row);
        let x = &p.data[row * d..(row + n) * d];
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
            let xn = p.norms[row + i];
            let gi = &g[i * k..(i + 1) * k];
            let mut best = 0usize;
            let mut best_d = f32::INFINITY;
            for (cj, (&dot, &cn)) in gi.iter().zip(&c.norms).enumerate() {
                let dist = xn - 2.0 * dot + cn;
                if dist < best_d {
                    best_d = dist;
                    best = cj;
                }
            }
            out.counts[best] += 1;
            out.inertia += f64::from(best_d.max(0.0));
            if want_sums {
                let s = &mut out.sums[best * d..(best + 1) * d];
                for (acc, &v) in s.iter_mut().zip(&x[i * d..(i + 1) * d]) {
                    *acc += f64::from(v);
                }
            }
            if want_labels {
                out.labels.push(best as u32);
            }
            if want.dists {
                out.dists.push(best_d.max(0.0));
            }
        }
        row += n;
    }
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
    /// Mini-batch: epochs (sweeps over the data).
    pub epochs: usize,
    /// Lloyd: iterations (full passes).
    pub iterations: usize,
    /// Mini-batch: tasks per batch.
    pub batch_tasks: usize,
    /// Mini-batch: points per task.
    pub task_points: usize,
    /// Seed for the initialisation.
    pub seed: u64,
    /// Compute labels in the final pass.
    pub labels: bool,
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
        }
    }
}

/// Progress events, for the command line's bar and summary lines.
#[derive(Clone, Debug)]
pub enum Event {
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
    /// An epoch (or Lloyd iteration) finished.
    Epoch {
        /// Its index (from 0).
        index: usize,
        /// Seconds it took.
        seconds: f64,
        /// Inertia: for mini-batch the sum over the epoch's batches at
        /// assignment time; for Lloyd the inertia before the update.
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
    /// Labels, when asked.
    pub labels: Option<Vec<u32>>,
}

/// A task: rows `start..start+len` of partition `part`.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    part: usize,
    start: usize,
    len: usize,
}

/// The chunks of one sweep, partition after partition.
fn chunks(ds: &Dataset, task_points: usize) -> Vec<Chunk> {
    let mut v = Vec::new();
    for (part, &rows) in ds.part_rows.iter().enumerate() {
        let mut start = 0usize;
        while start < rows as usize {
            let len = task_points.min(rows as usize - start);
            v.push(Chunk { part, start, len });
            start += len;
        }
    }
    v
}

/// Runs K-means on a loaded dataset.
pub fn run(rt: &Runtime, ds: &Dataset, cfg: &Config, mut on: impl FnMut(Event)) -> Result<Outcome> {
    if cfg.k == 0 {
        return Err(Error::Input("k must be at least 1".into()));
    }
    if cfg.k as u64 > ds.rows {
        return Err(Error::Input(format!(
            "k = {} is larger than the number of points ({})",
            cfg.k, ds.rows
        )));
    }
    if cfg.task_points == 0 || cfg.batch_tasks == 0 {
        return Err(Error::Input(
            "task_points and batch_tasks must be at least 1".into(),
        ));
    }
    let t = Instant::now();
    let mut centers = initial_centers(rt, ds, cfg)?;
    on(Event::Initialized {
        seconds: t.elapsed().as_secs_f64(),
    });
    let mut epoch_seconds = Vec::new();
    let mut epoch_inertia = Vec::new();
    match cfg.algorithm {
        Algorithm::MiniBatch => {
            let plan = chunks(ds, cfg.task_points);
            let mut counts = vec![0u64; cfg.k];
            for epoch in 0..cfg.epochs {
                let t = Instant::now();
                let mut inertia = 0.0;
                let mut done = 0u64;
                for batch in plan.chunks(cfg.batch_tasks) {
                    // Room for the batch's partial sums.
                    rt.make_room(batch.len() * cfg.k * ds.dims * 8);
                    let shared = Arc::new(centers.clone());
                    let parts = sweep(
                        rt,
                        ds,
                        batch,
                        &shared,
                        Want {
                            sums: true,
                            ..Want::default()
                        },
                    )?;
                    let (sums, n, i) = reduce(&parts, cfg.k, ds.dims);
                    inertia += i;
                    minibatch_update(&mut centers, &mut counts, &sums, &n);
                    done += batch.iter().map(|c| c.len as u64).sum::<u64>();
                    on(Event::Progress {
                        done,
                        total: ds.rows,
                    });
                }
                let secs = t.elapsed().as_secs_f64();
                epoch_seconds.push(secs);
                epoch_inertia.push(inertia);
                on(Event::Epoch {
                    index: epoch,
                    seconds: secs,
                    inertia,
                });
            }
        }
        Algorithm::Lloyd => {
            // Tasks of `task_points` rows, reduced in fixed groups: with
            // partitions a multiple of `task_points` rows (see
            // `aligned_partition_bytes`), the arithmetic does not depend on
            // how the data is partitioned, so the cap does not change it.
            let plan = chunks(ds, cfg.task_points);
            for it in 0..cfg.iterations {
                let t = Instant::now();
                let shared = Arc::new(centers.clone());
                let mut sums = zeros::<f64>(cfg.k * ds.dims);
                let mut n = vec![0u64; cfg.k];
                let mut inertia = 0.0;
                let mut done = 0u64;
                // A bounded number of tasks per batch bounds the partial
                // sums held at once; the declared cycle still tells the
                // runtime what comes next.
                for group in plan.chunks(LLOYD_GROUP) {
                    let parts = sweep(
                        rt,
                        ds,
                        group,
                        &shared,
                        Want {
                            sums: true,
                            ..Want::default()
                        },
                    )?;
                    let (s, c, i) = reduce(&parts, cfg.k, ds.dims);
                    for (a, b) in sums.iter_mut().zip(&s) {
                        *a += b;
                    }
                    for (a, b) in n.iter_mut().zip(&c) {
                        *a += b;
                    }
                    inertia += i;
                    done += group.iter().map(|c| c.len as u64).sum::<u64>();
                    on(Event::Progress {
                        done,
                        total: ds.rows,
                    });
                }
                let mut values = centers.values.clone();
                for c in 0..cfg.k {
                    if n[c] > 0 {
                        for j in 0..ds.dims {
                            values[c * ds.dims + j] = (sums[c * ds.dims + j] / n[c] as f64) as f32;
                        }
                    }
                }
                centers = Centers::new(cfg.k, ds.dims, values);
                let secs = t.elapsed().as_secs_f64();
                epoch_seconds.push(secs);
                epoch_inertia.push(inertia);
                on(Event::Epoch {
                    index: it,
                    seconds: secs,
                    inertia,
                });
            }
        }
    }
    let (inertia, labels) = final_pass(rt, ds, &centers, cfg.labels, cfg.task_points)?;
    Ok(Outcome {
        centers,
        inertia,
        epoch_seconds,
        epoch_inertia,
        labels,
    })
}

/// Runs one read-only assignment task per chunk; results in order.
fn sweep(
    rt: &Runtime,
    ds: &Dataset,
    plan: &[Chunk],
    c: &Arc<Centers>,
    want: Want,
) -> Result<Vec<Partial>> {
    let mut b = rt.batch();
    for ch in plan {
        let c = c.clone();
        let ch = *ch;
        b.read(&ds.parts[ch.part], move |p: &Partition| {
            assign(p, ch.start, ch.len, &c, want)
        });
    }
    Ok(b.run()?)
}

/// Adds partial results in order.
fn reduce(parts: &[Partial], k: usize, d: usize) -> (Vec<f64>, Vec<u64>, f64) {
    let mut sums = zeros::<f64>(k * d);
    let mut counts = vec![0u64; k];
    let mut inertia = 0.0;
    for p in parts {
        for (a, b) in sums.iter_mut().zip(&p.sums) {
            *a += b;
        }
        for (a, b) in counts.iter_mut().zip(&p.counts) {
            *a += b;
        }
        inertia += p.inertia;
    }
    (sums, counts, inertia)
}

/// The mini-batch step: each centre moves to the running mean of all the
/// points it has been assigned so far (learning rate 1/count).
fn minibatch_update(c: &mut Centers, counts: &mut [u64], sums: &[f64], n: &[u64]) {
    let d = c.dims;
    for j in 0..c.k {
        if n[j] == 0 {
            continue;
        }
        let old = counts[j] as f64;
        counts[j] += n[j];
        let new = counts[j] as f64;
        for t in 0..d {
            let v = f64::from(c.values[j * d + t]);
            c.values[j * d + t] = ((v * old + sums[j * d + t]) / new) as f32;
        }
    }
    *c = Centers::new(c.k, d, std::mem::take(&mut c.values));
}

/// Inertia of `c` over all the data, and the labels when asked.
fn final_pass(
    rt: &Runtime,
    ds: &Dataset,
    c: &Centers,
    labels: bool,
    task_points: usize,
) -> Result<(f64, Option<Vec<u32>>)> {
    let shared = Arc::new(c.clone());
    let mut inertia = 0.0;
    let mut all = labels.then(|| Vec::with_capacity(ds.rows as usize));
    for group in chunks(ds, task_points).chunks(LLOYD_GROUP) {
        for p in sweep(
            rt,
            ds,
            group,
            &shared,
            Want {
                labels,
                ..Want::default()
            },
        )? {
            inertia += p.inertia;
            if let Some(all) = all.as_mut() {
                all.extend_from_slice(&p.labels);
            }
        }
    }
    Ok((inertia, all))
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
    for group in chunks(ds, task_points.max(1)).chunks(LLOYD_GROUP) {
        for p in sweep(rt, ds, group, &shared, want)? {
            on_block(&p.labels, &p.dists)?;
        }
    }
    Ok(())
}

/// Points sampled for the initialisation: at least 10,000 and 20 per
/// cluster, at most all of them.
fn sample_size(rows: u64, k: usize) -> u64 {
    rows.min((20 * k as u64).max(10_000))
}

/// A uniform sample of rows, chosen by hashing the row index with the seed
/// (so it does not depend on the partitioning), in row order.
fn sample(rt: &Runtime, ds: &Dataset, want: u64, seed: u64) -> Result<Vec<f32>> {
    let threshold = if want >= ds.rows {
        u64::MAX
    } else {
        ((want as u128 * (1u128 << 64)) / ds.rows as u128) as u64
    };
    let mut b = rt.batch();
    for h in &ds.parts {
        b.read(h, move |p: &Partition| {
            let mut out = Vec::new();
            for i in 0..p.rows as usize {
                if threshold == u64::MAX
                    || mix(seed ^ 0x5a3b_1e00, p.first_row + i as u64) < threshold
                {
                    out.extend_from_slice(p.row(i));
                }
            }
            out
        });
    }
    Ok(b.run()?.concat())
}

/// Squared Euclidean distance, with eight accumulators so it vectorises.
fn sq_dist(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for t in 0..8 {
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
    std::thread::scope(|sc| {
        for (r, block) in out.chunks_mut(per * m).enumerate() {
            sc.spawn(move || {
                for (j, o) in block.chunks_exact_mut(m).enumerate() {
                    let i = r * per + j;
                    let x = &s[i * d..(i + 1) * d];
                    for (t, &c) in centres.iter().enumerate() {
                        o[t] = sq_dist(x, &s[c * d..(c + 1) * d]);
                    }
                }
            });
        }
    });
    out
}

fn initial_centers(rt: &Runtime, ds: &Dataset, cfg: &Config) -> Result<Centers> {
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
        return Ok(Centers::new(k, d, v.clone()));
    }
    let want = sample_size(ds.rows, k);
    // Room for the sample, its pieces and the distances.
    rt.make_room(want as usize * (d * 8 + 16));
    let mut s = sample(rt, ds, want, cfg.seed)?;
    let mut n = s.len() / d;
    if n < k {
        // A sparse hash sample can fall short for k close to the number of
        // points: take every point then.
        s = sample(rt, ds, ds.rows, cfg.seed)?;
        n = s.len() / d;
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(cfg.seed ^ 0x1717_c0de);
    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    match cfg.init {
        Init::Random => {
            let mut idx: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + (rng.random::<u64>() % (n - i) as u64) as usize;
                idx.swap(i, j);
                chosen.push(idx[i]);
            }
        }
        _ => {
            // Greedy k-means++: each next centre is drawn with probability
            // proportional to the squared distance to the nearest chosen
            // one; of 2 + ln(k) such draws, the one that lowers the total
            // most is kept.
            let trials = 2 + (k as f64).ln() as usize;
            let threads = rt.workers().max(1);
            let first = (rng.random::<u64>() % n as u64) as usize;
            chosen.push(first);
            let mut best = distances_to(&s, d, &[first], threads);
            let mut cand_d = vec![0f32; n];
            let mut keep_d = vec![0f32; n];
            while chosen.len() < k {
                let total: f64 = best.iter().map(|&v| f64::from(v)).sum();
                if total <= 0.0 {
                    // Every remaining point coincides with a centre.
                    let next = (0..n).find(|i| !chosen.contains(i)).unwrap_or(0);
                    chosen.push(next);
                    continue;
                }
                let mut winner: Option<(f64, usize)> = None;
                // The draws depend only on `best`: draw them all, then
                // measure every candidate in one parallel pass.
                let picks: Vec<usize> = (0..trials)
                    .map(|_| {
                        let mut r = rng.random::<f64>() * total;
                        for (i, &b) in best.iter().enumerate() {
                            if r < f64::from(b) {
                                return i;
                            }
                            r -= f64::from(b);
                        }
                        n - 1
                    })
                    .collect();
                let dist = distances_to(&s, d, &picks, threads);
                for (t, &pick) in picks.iter().enumerate() {
                    let mut pot = 0f64;
                    for (i, c) in cand_d.iter_mut().enumerate() {
                        *c = best[i].min(dist[i * trials + t]);
                        pot += f64::from(*c);
                    }
                    if winner.is_none_or(|(w, _)| pot < w) {
                        winner = Some((pot, pick));
                        std::mem::swap(&mut keep_d, &mut cand_d);
                    }
                }
                let Some((_, pick)) = winner else { break };
                chosen.push(pick);
                std::mem::swap(&mut best, &mut keep_d);
            }
        }
    }
    let mut values = Vec::with_capacity(k * d);
    for &i in &chosen {
        values.extend_from_slice(&s[i * d..(i + 1) * d]);
    }
    Ok(Centers::new(k, d, values))
}
