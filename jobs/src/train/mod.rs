//! A training job with model state in executors: multinomial logistic
//! regression by local SGD with periodic model averaging.
//!
//! Each [`Shard`] executor holds a block of training rows, its held-out
//! rows and its own model replica. A round sets every replica to the global
//! model, runs local SGD epochs on each shard (write tasks: the shards are
//! dirty, so an evicted shard is written back), averages the replicas in
//! shard order (weighted by rows, so the result does not depend on timing)
//! and stores the average in the global-model executor. Held-out accuracy
//! is measured after every round.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use outcore::{Handle, PodVec, Runtime};

use crate::error::{Error, Result};
use crate::input::{mix, Block, Labels, Loader, Source};

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
    /// This shard's model replica.
    pub model: Model,
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
        };
        let mut max_label = 0u32;
        for (r, &label) in b.y.iter().enumerate() {
            max_label = max_label.max(label);
            let row = &b.x[r * dims..(r + 1) * dims];
            if mix(seed ^ 0x401d_0017, b.first + r as u64) < threshold {
                s.test_x.extend_from_slice(row);
                s.test_y.push(label);
            } else {
                s.x.extend_from_slice(row);
                s.y.push(label);
            }
        }
        let train_rows = s.y.len() as u64;
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
        let mut grad = vec![0f32; classes * (d + 1)];
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

/// Training settings.
#[derive(Clone, Debug)]
pub struct TrainConfig {
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
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            rounds: 5,
            local_epochs: 1,
            lr: 0.05,
            batch: 64,
            holdout: 0.1,
            seed: 42,
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
    /// The global model.
    pub global: Handle<Model>,
    /// Classes.
    pub classes: usize,
    /// Columns.
    pub dims: usize,
    /// Rows.
    pub rows: u64,
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
    if !(0.0..1.0).contains(&cfg.holdout) {
        return Err(Error::Input(format!(
            "holdout must be in [0, 1), not {}",
            cfg.holdout
        )));
    }
    let threshold = (cfg.holdout * u64::MAX as f64) as u64;
    let seed = cfg.seed;
    let loader = Loader {
        source: src,
        labels: Some(labels),
        part_bytes: shard_bytes,
        name: "shard",
    };
    let (data, summaries) = loader.load(rt, move |b| Shard::split(b, seed, threshold), progress)?;
    let max_label = summaries.iter().map(|s| s.1).max().unwrap_or(0);
    let classes = match classes {
        Some(c) if (max_label as usize) < c => c,
        Some(c) => {
            return Err(Error::Input(format!(
                "a label is {max_label}, but there are only {c} classes"
            )));
        }
        None => max_label as usize + 1,
    };
    if classes < 2 {
        return Err(Error::Input("training needs at least 2 classes".into()));
    }
    let global = rt.insert_named(Some("global model"), Model::zeros(classes, data.dims))?;
    Ok(Job {
        shards: data.parts,
        weights: summaries.iter().map(|s| s.0).collect(),
        global,
        classes,
        dims: data.dims,
        rows: data.rows,
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

/// The outcome of training.
#[derive(Clone, Debug)]
pub struct Trained {
    /// The final global model.
    pub model: Model,
    /// Per-round reports.
    pub rounds: Vec<Round>,
}

/// Trains the job.
pub fn train(
    rt: &Runtime,
    job: &Job,
    cfg: &TrainConfig,
    mut on_round: impl FnMut(&Round),
) -> Result<Trained> {
    if cfg.batch == 0 || cfg.local_epochs == 0 {
        return Err(Error::Input(
            "batch and local_epochs must be at least 1".into(),
        ));
    }
    let total: u64 = job.weights.iter().sum();
    if total == 0 {
        return Err(Error::Input(
            "no training rows left after the held-out split".into(),
        ));
    }
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
        // Weighted average, in shard order.
        let mut avg = vec![0f64; global.w.len()];
        for (w, &n) in replicas.iter().zip(&job.weights) {
            let f = n as f64 / total as f64;
            for (a, &v) in avg.iter_mut().zip(w.iter()) {
                *a += f * f64::from(v);
            }
        }
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
            .fold((0, 0), |a, r| (a.0 + r.0, a.1 + r.1));
        let r = Round {
            index,
            seconds: t.elapsed().as_secs_f64(),
            accuracy: correct as f64 / seen.max(1) as f64,
        };
        on_round(&r);
        rounds.push(r);
    }
    let model = rt.read(&job.global, |m: &Model| m.clone())?;
    Ok(Trained { model, rounds })
}
