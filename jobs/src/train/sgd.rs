//! Local SGD with model averaging ([`Solver::Sgd`](super::Solver::Sgd)):
//! each round sets every shard's replica to the global model, runs local
//! epochs on each shard (write tasks: an evicted shard is written back),
//! averages the replicas in shard order, weighted by their training rows,
//! and measures the held-out accuracy of the average.
//!
//! Its model depends on the shard executors, so on several ranks each
//! holds a run of the shards one process would hold ([`share`]).

use std::time::Instant;

use outcore::PodVec;

use super::load::Shard;
use super::{training_rows, Event, Job, Model, Round, Share, TrainConfig, Trained};
use crate::error::{Error, Result};
use crate::ranks::{Ranks, ShardSums, Shards};
use crate::session::Session;

impl Shard {
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

/// This rank's share: a run of the shards of `shard_bytes` one process
/// holds (every `per` rows from row 0), at least one per rank.
pub(super) fn share(
    rows: u64,
    dims: usize,
    shard_bytes: u64,
    _cfg: &TrainConfig,
    ranks: &Ranks,
) -> Result<Share> {
    let per = (shard_bytes / (4 * dims as u64 + 4)).max(1);
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
    Ok(((t.start * per).min(rows), (t.end * per).min(rows), per))
}

/// Runs `cfg.rounds` rounds, reporting each to `on`. Collective: every
/// rank gets the same model, bit for bit the single process's: the
/// replicas are averaged in shard order across ranks.
pub(super) fn fit(
    session: &Session,
    job: &Job,
    cfg: &TrainConfig,
    on: &mut dyn FnMut(&Event),
) -> Result<Trained> {
    if cfg.batch == 0 || cfg.local_epochs == 0 {
        return Err(Error::Input(
            "batch and local_epochs must be at least 1".into(),
        ));
    }
    let total = training_rows(job, session.ranks())?;
    let mut rounds = Vec::new();
    for index in 0..cfg.rounds {
        let r = round(session, job, cfg, index, total)?;
        on(&Event::Round(r.clone()));
        rounds.push(r);
    }
    let model = session.runtime().read(&job.global, |m: &Model| m.clone())?;
    Ok(Trained {
        model,
        rounds,
        iterations: Vec::new(),
        stop: None,
        last: None,
        weights: Vec::new(),
    })
}

/// Round `index`: local SGD on every shard from the global model, the
/// replicas averaged (`total` training rows in all) into the global
/// model, and its held-out accuracy.
fn round(
    session: &Session,
    job: &Job,
    cfg: &TrainConfig,
    index: usize,
    total: u64,
) -> Result<Round> {
    let (rt, ranks) = (session.runtime(), session.ranks());
    let t = Instant::now();
    let len = rt.read(&job.global, |m: &Model| m.w.len())?;
    // Local SGD on every shard (replicas change) from the global model,
    // which the tasks read side by side in its executor: no copy of it.
    let mut b = rt.batch();
    let kg = job.global.key();
    for h in &job.shards {
        let ks = h.key();
        let (epochs, lr, batch) = (cfg.local_epochs, cfg.lr, cfg.batch);
        b.task(&[&job.global], &[h], move |j| {
            let s = j.write(ks);
            s.local_sgd(j.read(kg), epochs, lr, batch);
            s.model.w.clone()
        });
    }
    // Weighted average, in shard order (across ranks), folded as the
    // replicas come: as many are held as tasks run at once, and on one
    // process the sum alone (not every shard's term) is kept.
    let mut sums = ShardSums::new(ranks, job.shards.len(), len, true);
    b.ahead(rt.workers().max(1));
    crate::fold_in_order(b, |i, w| {
        let f = job.weights[i] as f64 / total as f64;
        for (a, &v) in sums.shard(i)?.iter_mut().zip(w.iter()) {
            *a += f * f64::from(v);
        }
        Ok(())
    })?;
    let avg = sums.finish(ranks)?;
    let avg: Vec<f32> = avg.into_iter().map(|v| v as f32).collect();
    rt.write(&job.global, move |m: &mut Model| m.w = PodVec::from(avg))?;
    let accuracy = accuracy(session, job)?;
    Ok(Round {
        index,
        seconds: t.elapsed().as_secs_f64(),
        accuracy,
    })
}

/// The global model's held-out accuracy over every rank's shards.
fn accuracy(session: &Session, job: &Job) -> Result<f64> {
    let (rt, ranks) = (session.runtime(), session.ranks());
    let mut b = rt.batch();
    for h in &job.shards {
        b.read2(h, &job.global, |s: &Shard, m: &Model| s.evaluate(m));
    }
    let (correct, seen) = b
        .run()?
        .into_iter()
        .fold((0u64, 0u64), |a, r| (a.0 + r.0, a.1 + r.1));
    let all = ranks.ordered_sum(&[vec![correct as f64, seen as f64]], 2)?;
    let (correct, seen) = (all[0] as u64, all[1] as u64);
    Ok(correct as f64 / seen.max(1) as f64)
}
