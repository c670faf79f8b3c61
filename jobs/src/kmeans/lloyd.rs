//! Lloyd's K-means: full passes; each centre moves to the mean of its
//! points.

use std::sync::Arc;

use super::assign::{Packed, Reduced};
use super::fold::sweep_sums;
use super::relocate::{empty_centres, relocate};
use super::{lend, Centers, Config, Converged, Event, Pass, Solver, Swept};
use crate::error::Result;

/// A Lloyd pass reports progress every this many tasks.
const PROGRESS_EVERY: usize = 32;

/// A Lloyd run's state across its iterations.
///
/// Every task's sums are added to its shard's, in task order, then the
/// shards' in shard order. The first iteration also measures the data's
/// per-feature variance (around the first initial centre) for the
/// tolerance, as scikit-learn's `_tolerance`.
pub(super) struct Lloyd {
    k: usize,
    d: usize,
    /// The tolerance as given, relative to the variance.
    relative_tol: f64,
    /// The tolerance on an iteration's squared centre shift (0 until the
    /// first iteration measured the variance).
    tol: f64,
    /// The first initial centre: the variance is measured around it.
    reference: Arc<Vec<f32>>,
    /// This process's tasks, in row order, with their shards.
    tasks: Vec<(u64, usize)>,
    /// Iterations made.
    iterations: usize,
}

impl Lloyd {
    /// A run under `cfg` on `pass`'s data from the initial `centers`.
    pub(super) fn new(cfg: &Config, pass: &Pass<'_>, centers: &Centers) -> Lloyd {
        Lloyd {
            k: cfg.k,
            d: pass.ds.dims,
            relative_tol: cfg.tol,
            tol: 0.0,
            reference: Arc::new(centers.row(0).to_vec()),
            tasks: pass.plan.local_tasks(),
            iterations: 0,
        }
    }

    /// The sums of every task (one batch per pass: each task adds its
    /// sums in turn, see `fold.rs`), with the column statistics when
    /// `stats`, and the seconds the tasks spent in the kernel.
    fn sums(
        &self,
        pass: &mut Pass<'_>,
        centers: &mut Centers,
        stats: bool,
        on: &mut dyn FnMut(Event),
    ) -> Result<(Reduced, f64)> {
        let plan = pass.plan;
        let packed = Packed {
            k: self.k,
            d: self.d,
            stats,
        };
        let (list, owner) = plan.chunks_of(&self.tasks);
        let summing = pass.summing(&list, &owner, packed, stats.then_some(&self.reference));
        let mut done = 0u64;
        let mut kernel = 0.0;
        let mut spare = std::mem::take(&mut pass.spare);
        let at = &*pass;
        let sums = lend(centers, |c| {
            sweep_sums(at.rt, at.ds, &summing, c, &mut spare, |i, p| {
                kernel += p.kernel_seconds;
                done += list[i].len as u64;
                if i % PROGRESS_EVERY == PROGRESS_EVERY - 1 || i + 1 == list.len() {
                    on(Event::Progress {
                        done: at.progress(done),
                        total: at.ds.rows,
                    });
                }
            })
        });
        pass.spare = spare;
        let r = packed.unpack(pass.combine(sums?, packed.len())?);
        Ok((r, kernel))
    }

    /// The mean per-feature variance of the data, from the column sums
    /// of `r` over all `n` rows.
    fn variance(&self, r: &Reduced, n: u64) -> f64 {
        let n = n as f64;
        r.colsum
            .iter()
            .zip(&r.colsq)
            .map(|(s1, s2)| (s2 / n - (s1 / n) * (s1 / n)).max(0.0))
            .sum::<f64>()
            / self.d as f64
    }
}

impl Solver for Lloyd {
    /// An iteration: every row's nearest centre, then the centres moved to
    /// the means (a centre no point chose takes a far point, see
    /// `relocate.rs`).
    fn pass(
        &mut self,
        pass: &mut Pass<'_>,
        centers: &mut Centers,
        on: &mut dyn FnMut(Event),
    ) -> Result<Swept> {
        let (k, d) = (self.k, self.d);
        let stats = self.iterations == 0 && self.relative_tol > 0.0;
        let (mut r, kernel_seconds) = self.sums(pass, centers, stats, on)?;
        if stats {
            self.tol = self.relative_tol * self.variance(&r, pass.ds.rows);
        }
        let empty = empty_centres(&r);
        let relocated = if empty.is_empty() {
            0
        } else {
            let (rt, ds, plan) = (pass.rt, pass.ds, pass.plan);
            lend(centers, |c| relocate(rt, ds, plan, c, &empty, &mut r))?
        };
        // In place: the centres are held once while they move.
        let values = &mut centers.values;
        let mut shift = 0.0;
        for c in 0..k {
            let moves = r.wsum[c] > 0.0;
            for j in 0..d {
                let old = values[c * d + j];
                let new = if moves {
                    (r.sums[c * d + j] / r.wsum[c]) as f32
                } else {
                    old
                };
                let t = f64::from(old) - f64::from(new);
                shift += t * t;
                values[c * d + j] = new;
            }
        }
        let inertia = r.inertia;
        pass.spare.push(r.sums);
        centers.refresh();
        self.iterations += 1;
        Ok(Swept {
            inertia,
            kernel_seconds,
            relocated,
            converged: (shift <= self.tol).then_some(Converged::CenterShift),
        })
    }

    fn steps(&self) -> usize {
        self.iterations
    }
}
