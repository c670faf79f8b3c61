//! Mini-batch K-means: each step takes `batch_tasks / shards` consecutive
//! tasks from every shard and moves each centre to the running mean of
//! the points it was assigned; scikit-learn's early stopping.

use super::assign::{Packed, Reduced};
use super::fold::sweep_sums;
use super::reassign::Reassign;
use super::{lend, squared_shift, Centers, Config, Converged, Event, Pass, Solver, Swept};
use crate::error::Result;

/// A mini-batch run's state across its epochs.
pub(super) struct MiniBatch {
    /// The tolerance on a step's squared centre shift, scaled by the
    /// data's mean variance (estimated on the initialisation sample).
    tol: f64,
    /// Whether to measure the centre shift (a tolerance was given).
    shift: bool,
    /// Whether to watch for convergence at all.
    watch: bool,
    max_no_improvement: Option<usize>,
    batch_tasks: usize,
    /// Each centre's accumulated weight (its count without sample weights).
    totals: Vec<f64>,
    /// The smoothed batch inertia, its least value, and the steps since.
    ewa: Option<f64>,
    ewa_min: Option<f64>,
    no_improvement: usize,
    packed: Packed,
    /// Batches in an epoch.
    batches: u64,
    /// Steps (batches) made.
    steps: usize,
    reassign: Reassign,
}

impl MiniBatch {
    /// A run under `cfg` on `pass`'s data, whose mean per-feature variance
    /// is about `variance`.
    /// `seed`: the run's.
    pub(super) fn new(cfg: &Config, pass: &Pass<'_>, variance: f64, seed: u64) -> MiniBatch {
        let (k, d) = (cfg.k, pass.ds.dims);
        MiniBatch {
            tol: cfg.tol * variance,
            shift: cfg.tol > 0.0,
            watch: cfg.tol > 0.0 || cfg.max_no_improvement.is_some(),
            max_no_improvement: cfg.max_no_improvement,
            batch_tasks: cfg.batch_tasks,
            totals: vec![0f64; k],
            ewa: None,
            ewa_min: None,
            no_improvement: 0,
            packed: Packed { k, d, stats: false },
            batches: pass.plan.batches(cfg.batch_tasks),
            steps: 0,
            reassign: Reassign::new(cfg.reassignment_ratio, seed),
        }
    }

    /// The sums of batch `b` over every shard, the rows this process
    /// assigned in it, and the seconds its tasks spent in the kernel.
    fn batch(
        &self,
        pass: &mut Pass<'_>,
        centers: &mut Centers,
        b: u64,
    ) -> Result<(Reduced, u64, f64)> {
        let (plan, packed) = (pass.plan, self.packed);
        let tasks: Vec<(u64, usize)> = plan
            .mine
            .clone()
            .flat_map(|s| {
                plan.batch_tasks(s, b, self.batch_tasks)
                    .map(move |t| (t, s - plan.mine.start))
            })
            .collect();
        let (list, owner) = plan.chunks_of(&tasks);
        let summing = pass.summing(&list, &owner, packed, None);
        let mut kernel = 0.0;
        let mut spare = std::mem::take(&mut pass.spare);
        let sums = lend(centers, |c| {
            sweep_sums(pass.rt, pass.ds, &summing, c, &mut spare, |_, p| {
                kernel += p.kernel_seconds;
            })
        });
        pass.spare = spare;
        let sums = sums?;
        let r = packed.unpack(pass.combine(sums, packed.len())?);
        let local = list.iter().map(|c| c.len as u64).sum::<u64>();
        Ok((r, local, kernel))
    }

    /// Rows of batch `b` over every shard (every process's).
    fn batch_rows(&self, pass: &Pass<'_>, b: u64) -> u64 {
        let plan = pass.plan;
        (0..plan.shards.count())
            .flat_map(|s| plan.batch_tasks(s, b, self.batch_tasks))
            .map(|t| plan.task_rows(t))
            .sum()
    }

    /// scikit-learn's early stopping after a step of batch inertia
    /// `inertia` over `rows` of the data's `n` rows, which moved the
    /// centres from `before` (when measured) to `centers`.
    fn stop(
        &mut self,
        inertia: f64,
        rows: u64,
        n: u64,
        before: Option<Vec<f32>>,
        centers: &Centers,
    ) -> Option<Converged> {
        let batch_inertia = inertia / rows as f64;
        let alpha = (rows as f64 * 2.0 / (n as f64 + 1.0)).min(1.0);
        let e = self
            .ewa
            .map_or(batch_inertia, |e| e * (1.0 - alpha) + batch_inertia * alpha);
        self.ewa = Some(e);
        if let Some(before) = before {
            if squared_shift(&before, &centers.values) <= self.tol {
                return Some(Converged::CenterShift);
            }
        }
        if self.ewa_min.is_none_or(|m| e < m) {
            self.no_improvement = 0;
            self.ewa_min = Some(e);
        } else {
            self.no_improvement += 1;
        }
        self.max_no_improvement
            .is_some_and(|m| self.no_improvement >= m)
            .then_some(Converged::NoImprovement)
    }
}

impl Solver for MiniBatch {
    /// An epoch: the batches in turn, each walking the shards.
    fn pass(
        &mut self,
        pass: &mut Pass<'_>,
        centers: &mut Centers,
        on: &mut dyn FnMut(Event),
    ) -> Result<Swept> {
        let mut out = Swept::default();
        let mut done = 0u64;
        for b in 0..self.batches {
            let (r, local, kernel) = self.batch(pass, centers, b)?;
            out.inertia += r.inertia;
            out.kernel_seconds += kernel;
            let before = self.shift.then(|| centers.values.clone());
            let rows = self.batch_rows(pass, b);
            let due = self.reassign.due(&self.totals, rows);
            update(centers, &mut self.totals, &r.sums, &r.wsum);
            pass.spare.push(r.sums);
            if due {
                let at = (pass.rt, pass.ds, pass.plan);
                let batch = (b, self.batch_tasks);
                let n = (self.reassign).apply(
                    at,
                    centers,
                    &mut self.totals,
                    batch,
                    rows,
                    self.steps,
                )?;
                if n > 0 {
                    on(Event::Reassigned { centres: n });
                }
                out.relocated += n;
            }
            done += local;
            self.steps += 1;
            on(Event::Progress {
                done: pass.progress(done),
                total: pass.ds.rows,
            });
            // The first step's inertia is the initialisation's.
            if !self.watch || self.steps == 1 {
                continue;
            }
            out.converged = self.stop(r.inertia, rows, pass.ds.rows, before, centers);
            if out.converged.is_some() {
                break;
            }
        }
        Ok(out)
    }

    fn steps(&self) -> usize {
        self.steps
    }
}

/// The mini-batch step: each centre moves to the (weighted) running mean
/// of all the points it has been assigned so far; `totals` holds each
/// centre's accumulated weight (its count without sample weights).
fn update(c: &mut Centers, totals: &mut [f64], sums: &[f64], w: &[f64]) {
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
    c.refresh();
}
