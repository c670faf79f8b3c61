//! Lloyd's K-means: full passes; each centre moves to the mean of its
//! points.

use std::sync::Arc;

use super::assign::{sweep, Packed, Reduced, Want, IN_FLIGHT};
use super::{squared_shift, Centers, Config, Converged, Event, Pass, Solver, Swept};
use crate::error::Result;
use crate::zeros;

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

    /// The sums of every task (one batch per pass: the partial sums are
    /// folded as they come, so only a few are held at once), with the
    /// column statistics when `stats`, and the seconds the tasks spent in
    /// the kernel.
    fn sums(
        &self,
        pass: &mut Pass<'_>,
        centers: &Centers,
        stats: bool,
        on: &mut dyn FnMut(Event),
    ) -> Result<(Reduced, f64)> {
        let plan = pass.plan;
        let shared = Arc::new(centers.clone());
        let packed = Packed {
            k: self.k,
            d: self.d,
            stats,
        };
        pass.rt
            .make_room((plan.mine.len() + IN_FLIGHT) * packed.len() * 8);
        let mut accs = vec![zeros::<f64>(packed.len()); plan.mine.len()];
        let mut done = 0u64;
        let mut kernel = 0.0;
        let (list, owner) = plan.chunks_of(&self.tasks);
        let want = Want {
            sums: true,
            ..Want::default()
        };
        let reference = stats.then_some(&self.reference);
        let at = &*pass;
        sweep(at.rt, at.ds, &list, &shared, want, reference, |i, p| {
            packed.fold(&mut accs[owner[i]], &p);
            kernel += p.kernel_seconds;
            done += list[i].len as u64;
            if i % PROGRESS_EVERY == PROGRESS_EVERY - 1 || i + 1 == list.len() {
                on(Event::Progress {
                    done: at.progress(done),
                    total: at.ds.rows,
                });
            }
            Ok(())
        })?;
        let r = packed.unpack(pass.combine(&accs, packed.len())?);
        drop(accs);
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
    /// the means (a centre with no point stays).
    fn pass(
        &mut self,
        pass: &mut Pass<'_>,
        centers: &mut Centers,
        on: &mut dyn FnMut(Event),
    ) -> Result<Swept> {
        let (k, d) = (self.k, self.d);
        let stats = self.iterations == 0 && self.relative_tol > 0.0;
        let (r, kernel_seconds) = self.sums(pass, centers, stats, on)?;
        if stats {
            self.tol = self.relative_tol * self.variance(&r, pass.ds.rows);
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
        *centers = Centers::new(k, d, values);
        self.iterations += 1;
        Ok(Swept {
            inertia: r.inertia,
            kernel_seconds,
            converged: (shift <= self.tol).then_some(Converged::CenterShift),
        })
    }

    fn steps(&self) -> usize {
        self.iterations
    }
}
