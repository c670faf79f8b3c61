//! Limited-memory BFGS with a strong-Wolfe line search, for smooth convex
//! objectives evaluated by a pass over executors.
//!
//! The objective is a callback that returns the value and the gradient at
//! a point together, so every line-search trial costs one pass and the
//! accepted trial's gradient is reused by the next iteration. The curvature
//! pairs `(s, y)` live in executors of the runtime, so a large model's
//! history can be evicted like data; the two-loop recursion reads them one
//! at a time. A small model's pairs (up to [`HELD_PAIR_VALUES`] values
//! each) are held in memory instead: reading forty executors per
//! iteration cost more than the pass itself on small data.
//!
//! Every step is a fixed sequence of floating-point operations on the
//! values the callback returns, so the iterates depend only on them: a
//! callback that is itself deterministic gives the same model every time.
//!
//! The training job's [`Solver::Lbfgs`](super::Solver::Lbfgs) is
//! [`minimize`] on the objective of the multinomial log-loss over a job's
//! shards (the `Objective` here, one pass of [`TASK_ROWS`]-row tasks per
//! evaluation, the losses of `loss.rs`), each rank holding its share of
//! the reduction shards ([`rank_rows`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use outcore::{PodVec, Runtime};

use super::load::Shard;
use super::owlqn;
use super::quasi::{add_pair, direction, dot, max_abs, Eval, Pair, C1, C2};
pub use super::quasi::{Minimum, Settings, Step, Stop, Value, HELD_PAIR_VALUES};
use super::TASK_ROWS;
use super::{
    rank_rows, training_rows, Event, Iteration, Job, Model, Penalty, Share, TrainConfig, Trained,
};
use crate::error::{Error, Result};
use crate::ranks::{Ranks, ShardSums, Shards};
use crate::session::Session;

/// Minimises `eval` (value and gradient at a point, plus anything else
/// measured in the same pass) from `x0`. `on_step` is called after every
/// accepted step with the new point and what `eval` reported there.
pub fn minimize<E>(
    rt: &Runtime,
    x0: Vec<f64>,
    s: &Settings,
    mut eval: impl FnMut(&[f64]) -> Result<Value<E>>,
    mut on_step: impl FnMut(&Step, &[f64], &E),
) -> Result<Minimum<E>> {
    let (f, g, extra) = eval(&x0)?;
    let mut evaluations = 1;
    let mut cur = Eval { x: x0, f, g, extra };
    // Curvature pairs, oldest first.
    let mut pairs: VecDeque<Pair> = VecDeque::new();
    // y . s / y . y of the newest pair: the initial Hessian's scale.
    let mut gamma = 1.0;
    let mut iterations = 0;
    let stop = loop {
        if max_abs(&cur.g) <= s.tol {
            break Stop::Gradient;
        }
        if iterations >= s.max_iter {
            break Stop::MaxIter;
        }
        let mut d = direction(rt, &pairs, gamma, &cur.g)?;
        let mut slope = dot(&d, &cur.g);
        if slope.is_nan() || slope >= 0.0 {
            // Not a descent direction (numerical trouble): restart from the
            // steepest descent.
            pairs.clear();
            d = cur.g.iter().map(|v| -v).collect();
            slope = dot(&d, &cur.g);
        }
        // The first step is scaled to a unit move, later ones start at 1.
        let first = if pairs.is_empty() {
            (1.0 / dot(&d, &d).sqrt()).min(1.0)
        } else {
            1.0
        };
        let (next, used) = line_search(&cur, &d, slope, first, s.max_evals, &mut eval)?;
        evaluations += used;
        iterations += 1;
        let Some(next) = next else {
            break Stop::LineSearch;
        };
        if let Some(g) = add_pair(rt, &mut pairs, s.history, iterations, &cur, &next)? {
            gamma = g;
        }
        let decrease = (cur.f - next.f) / cur.f.abs().max(next.f.abs()).max(1.0);
        cur = next;
        on_step(
            &Step {
                iteration: iterations,
                value: cur.f,
                grad_max: max_abs(&cur.g),
                evaluations: used,
            },
            &cur.x,
            &cur.extra,
        );
        if decrease <= 64.0 * f64::EPSILON {
            break Stop::Objective;
        }
    };
    Ok(Minimum {
        grad_max: max_abs(&cur.g),
        x: cur.x,
        value: cur.f,
        iterations,
        evaluations,
        stop,
        extra: cur.extra,
    })
}

/// A strong-Wolfe line search along `d` from `cur` (`slope` = d . g < 0),
/// starting at step `first`: bracketing, then zooming by safeguarded
/// quadratic interpolation. Returns the accepted point (or, when no step
/// meets both conditions within `max_evals`, the best point that lowered
/// the objective, if any) and the evaluations made.
fn line_search<E>(
    cur: &Eval<E>,
    d: &[f64],
    slope: f64,
    first: f64,
    max_evals: usize,
    eval: &mut impl FnMut(&[f64]) -> Result<Value<E>>,
) -> Result<(Option<Eval<E>>, usize)> {
    let mut s = Search {
        cur,
        d,
        slope,
        max_evals,
        eval,
        used: 0,
        best: None,
    };
    let accepted = match s.bracket(first)? {
        Bracket::Accepted(e) => Some(e),
        Bracket::Interval(lo, hi) => s.zoom(lo, hi)?,
    };
    Ok((accepted.or(s.best), s.used))
}

/// A line search under way along `d` from `cur`.
struct Search<'a, E, F> {
    cur: &'a Eval<E>,
    d: &'a [f64],
    /// `d . g` at `cur` (negative).
    slope: f64,
    max_evals: usize,
    eval: &'a mut F,
    /// Evaluations made.
    used: usize,
    /// The best point seen that lowers the objective (a fallback).
    best: Option<Eval<E>>,
}

/// An end of the interval that meets the sufficient decrease: its step,
/// value and slope along the direction.
type Low = (f64, f64, f64);

/// What the bracketing found: a step meeting both conditions, or the
/// interval to zoom in (`hi`, step and value, once found).
enum Bracket<E> {
    Accepted(Eval<E>),
    Interval(Low, Option<(f64, f64)>),
}

impl<E, F: FnMut(&[f64]) -> Result<Value<E>>> Search<'_, E, F> {
    /// The point at step `a`, and its slope along the direction.
    fn at(&mut self, a: f64) -> Result<(Eval<E>, f64)> {
        let x: Vec<f64> = self
            .cur
            .x
            .iter()
            .zip(self.d)
            .map(|(x, d)| x + a * d)
            .collect();
        let (f, g, extra) = (self.eval)(&x)?;
        self.used += 1;
        let dg = dot(&g, self.d);
        Ok((Eval { x, f, g, extra }, dg))
    }

    /// The sufficient decrease at step `a` with value `f`.
    fn armijo(&self, a: f64, f: f64) -> bool {
        f <= self.cur.f + C1 * a * self.slope
    }

    /// The curvature condition on the slope `dg`.
    fn curvature(&self, dg: f64) -> bool {
        dg.abs() <= -C2 * self.slope
    }

    /// Keeps `e` as the fallback when it is the best lower point yet.
    fn keep(&mut self, e: Eval<E>) {
        if e.f < self.cur.f && self.best.as_ref().is_none_or(|b| e.f < b.f) {
            self.best = Some(e);
        }
    }

    /// Bracketing from step `first`, doubling: lo meets the sufficient
    /// decrease; hi is the other end once found.
    fn bracket(&mut self, first: f64) -> Result<Bracket<E>> {
        let (mut lo, mut f_lo, mut dg_lo) = (0.0, self.cur.f, self.slope);
        let mut a = first;
        let mut hi: Option<(f64, f64)> = None;
        while self.used < self.max_evals {
            let (e, dg) = self.at(a)?;
            if !self.armijo(a, e.f) || (lo > 0.0 && e.f >= f_lo) {
                hi = Some((a, e.f));
                self.keep(e);
                break;
            }
            if self.curvature(dg) {
                return Ok(Bracket::Accepted(e));
            }
            if dg >= 0.0 {
                // Past the minimum along d: the interval is [a, lo].
                hi = Some((lo, f_lo));
                (lo, f_lo, dg_lo) = (a, e.f, dg);
                self.keep(e);
                break;
            }
            (lo, f_lo, dg_lo) = (a, e.f, dg);
            self.keep(e);
            a *= 2.0;
        }
        Ok(Bracket::Interval((lo, f_lo, dg_lo), hi))
    }

    /// Zooms between `lo` (sufficient decrease holds) and `hi`: the
    /// accepted point, if any within the evaluations left.
    fn zoom(&mut self, low: Low, mut hi: Option<(f64, f64)>) -> Result<Option<Eval<E>>> {
        let (mut lo, mut f_lo, mut dg_lo) = low;
        while let Some((h, f_h)) = hi {
            if self.used >= self.max_evals {
                break;
            }
            let width = h - lo;
            // The minimiser of the quadratic through f_lo, dg_lo and f_h,
            // kept inside the middle 80% of the interval.
            let denom = 2.0 * (f_h - f_lo - dg_lo * width);
            let mut t = if denom > 0.0 {
                lo - dg_lo * width * width / denom
            } else {
                lo + 0.5 * width
            };
            let (a_min, a_max) = if width > 0.0 {
                (lo + 0.1 * width, lo + 0.9 * width)
            } else {
                (lo + 0.9 * width, lo + 0.1 * width)
            };
            if !t.is_finite() || t < a_min || t > a_max {
                t = lo + 0.5 * width;
            }
            let (e, dg) = self.at(t)?;
            if !self.armijo(t, e.f) || e.f >= f_lo {
                hi = Some((t, e.f));
                self.keep(e);
                continue;
            }
            if self.curvature(dg) {
                return Ok(Some(e));
            }
            if dg * (h - lo) >= 0.0 {
                hi = Some((lo, f_lo));
            }
            (lo, f_lo, dg_lo) = (t, e.f, dg);
            self.keep(e);
        }
        Ok(None)
    }
}

/// What one pass measures besides the objective and its gradient.
#[derive(Clone, Copy, Debug)]
struct Measured {
    /// What turns the scaled objective back into scikit-learn's: `C n`, or
    /// `n` without a penalty.
    scale: f64,
    /// The sample weights added up.
    n: f64,
    accuracy: Option<f64>,
}

/// This rank's share on several ranks: its share of `cfg.shards`
/// reduction shards ([`rank_rows`]), at least one per rank, in shard
/// executors of about `shard_bytes` made of whole tasks from the share's
/// first row (a task boundary).
pub(super) fn share(
    rows: u64,
    dims: usize,
    shard_bytes: u64,
    cfg: &TrainConfig,
    ranks: &Ranks,
) -> Result<Share> {
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
    let per = shard_bytes / (4 * dims as u64 + 4).max(1);
    let tr = TASK_ROWS as u64;
    Ok((r.start, r.end, (per / tr).max(1) * tr))
}

/// Fits the job's model by L-BFGS (see the [module docs](super)),
/// reporting each iteration to `on`. Collective: every rank gets the same
/// model, bit for bit the one a single process gets with the same
/// `cfg.shards`.
pub(super) fn fit(
    session: &Session,
    job: &Job,
    cfg: &TrainConfig,
    on: &mut dyn FnMut(&Event),
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
    training_rows(job, session.ranks())?;
    let objective = Objective::new(session, job, cfg)?;
    let start = match &cfg.start {
        Some(w) if w.len() == objective.rows * (job.dims + 1) => w.clone(),
        Some(w) => {
            return Err(Error::Input(format!(
                "the start point has {} weights, not {} x {} (classes x (features + 1))",
                w.len(),
                objective.rows,
                job.dims + 1
            )))
        }
        None => vec![0.0; objective.rows * (job.dims + 1)],
    };
    let settings = Settings {
        tol: cfg.tol,
        max_iter: cfg.max_iter,
        ..Settings::default()
    };
    let mut iterations = Vec::new();
    let mut t = Instant::now();
    let on_step = |step: &Step, _: &[f64], m: &Measured| {
        let it = Iteration {
            index: step.iteration,
            seconds: t.elapsed().as_secs_f64(),
            loss: step.value,
            objective: step.value * m.scale,
            grad_max: step.grad_max,
            accuracy: m.accuracy,
            evaluations: step.evaluations,
        };
        on(&Event::Iteration(it.clone()));
        iterations.push(it);
        t = Instant::now();
    };
    let rt = session.runtime();
    let eval = |w: &[f64]| objective.eval(w);
    let min = match cfg.penalty {
        Penalty::ElasticNet(r) if r > 0.0 => {
            let l1_of = |m: &Measured| objective.l1_weights(r, m.n);
            owlqn::minimize_l1(rt, start, &settings, l1_of, eval, on_step)?
        }
        _ => minimize(rt, start, &settings, eval, on_step)?,
    };
    finish(session, job, min, iterations)
}

/// The trained model from the minimum, also stored in the job's
/// global-model executor.
fn finish(
    session: &Session,
    job: &Job,
    min: Minimum<Measured>,
    iterations: Vec<Iteration>,
) -> Result<Trained> {
    let last = Iteration {
        index: min.iterations,
        seconds: 0.0,
        loss: min.value,
        objective: min.value * min.extra.scale,
        grad_max: min.grad_max,
        accuracy: min.extra.accuracy,
        evaluations: min.evaluations,
    };
    let w: Vec<f32> = min.x.iter().map(|&v| v as f32).collect();
    let model = Model {
        classes: (min.x.len() / (job.dims + 1)) as u32,
        dims: job.dims as u32,
        w: PodVec::from(w),
    };
    let stored = model.clone();
    session
        .runtime()
        .write(&job.global, move |m: &mut Model| *m = stored)?;
    Ok(Trained {
        model,
        rounds: Vec::new(),
        iterations,
        stop: Some(min.stop),
        last: Some(last),
        weights: min.x,
    })
}

/// The objective over a job's shards: one pass of read-only tasks per
/// evaluation, the tasks' partial sums added per reduction shard in task
/// order, then across the reduction shards in order (over the ranks).
struct Objective<'a> {
    rt: &'a Runtime,
    ranks: &'a Ranks,
    job: &'a Job,
    /// Every task of every shard executor, in row order: the shard, the
    /// task within it, and the reduction shard (counted from this rank's
    /// first) of its global task.
    plan: Vec<(usize, usize, usize)>,
    /// This rank's reduction shards.
    mine: usize,
    /// Whether to measure the held-out accuracy.
    held_out: bool,
    /// Rows of weights: the classes, or 1 for the binary model.
    rows: usize,
    /// `C`, or none without a penalty.
    c: Option<f64>,
    /// The share of the penalty that is `0.5 |W|^2` (the rest is L1).
    l2: f64,
    fit_intercept: bool,
}

impl<'a> Objective<'a> {
    fn new(session: &'a Session, job: &'a Job, cfg: &TrainConfig) -> Result<Self> {
        let ranks = session.ranks();
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
        let mut plan = Vec::new();
        let mut first = job.first_row;
        for (s, (&t, &rows)) in job.tasks.iter().zip(&job.shard_rows).enumerate() {
            let g0 = first / TASK_ROWS as u64;
            for i in 0..t {
                plan.push((s, i, owner_of(g0 + i as u64)));
            }
            first += u64::from(rows);
        }
        Ok(Objective {
            rt: session.runtime(),
            ranks,
            job,
            plan,
            mine: mine.len(),
            held_out: cfg.holdout > 0.0,
            rows: Model::rows(job.classes, cfg),
            c: (cfg.penalty != Penalty::None).then_some(cfg.c),
            l2: match cfg.penalty {
                Penalty::ElasticNet(r) => 1.0 - r,
                _ => 1.0,
            },
            fit_intercept: cfg.fit_intercept,
        })
    }

    /// The scaled objective at `w`, its gradient and what the pass
    /// measured.
    /// The loss is divided by the sum of the sample weights `n` (the rows
    /// without them), and the penalty by `C n`, as scikit-learn does.
    fn eval(&self, w: &[f64]) -> Result<Value<Measured>> {
        let (classes, d) = (self.rows, self.job.dims);
        let stride = d + 1;
        let mut grad = self.pass(w)?;
        let held = grad.pop().unwrap_or(0.0) as u64;
        let correct = grad.pop().unwrap_or(0.0) as u64;
        let n = grad.pop().unwrap_or(0.0);
        let loss = grad.pop().unwrap_or(0.0);
        if n.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return Err(Error::Input(
                "the sample weights of the training rows add up to 0".into(),
            ));
        }
        let scale = 1.0 / n;
        // With no penalty the objective is scaled by n alone.
        let (reg, objective_scale) = match self.c {
            Some(c) => (self.l2 / (c * n), c * n),
            None => (0.0, n),
        };
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
            } else if !self.fit_intercept {
                *g = 0.0;
            }
        }
        let measured = Measured {
            scale: objective_scale,
            n,
            accuracy: (held > 0).then(|| correct as f64 / held as f64),
        };
        Ok((f, grad, measured))
    }

    /// The L1 weight of every coordinate for the elastic net's L1 share
    /// `r`, with `n` the sample weights added up: `r / (C n)`, 0 for the
    /// intercepts.
    fn l1_weights(&self, r: f64, n: f64) -> Vec<f64> {
        let d = self.job.dims;
        let c = self.c.unwrap_or(f64::INFINITY);
        (0..self.rows * (d + 1))
            .map(|i| if i % (d + 1) == d { 0.0 } else { r / (c * n) })
            .collect()
    }

    /// One pass: the log-loss's gradient, the log-loss, and the held-out
    /// rows right and seen (integers, exact as sums of f64), summed over
    /// every rank's tasks in order.
    fn pass(&self, w: &[f64]) -> Result<Vec<f64>> {
        let shared = Arc::new(w.to_vec());
        let classes = self.rows;
        let held_out = self.held_out;
        // Per reduction shard: the gradient, the loss, the sample weights,
        // the held-out rows right and seen; on one process added to the
        // total as each shard closes (two vectors the size of the model,
        // whatever the shards).
        let len = w.len() + 4;
        let in_order = self.plan.windows(2).all(|p| p[0].2 <= p[1].2);
        let mut sums = ShardSums::new(self.ranks, self.mine.max(1), len, in_order);
        // One batch per evaluation; the partial gradients are folded as
        // they come (in plan order), and only as many tasks as workers run
        // ahead of the fold, so a few gradients are held at once.
        let mut b = self.rt.batch();
        for &(s, t, _) in &self.plan {
            let w = shared.clone();
            b.read_shared(&self.job.shards[s], move |sh: &Shard| {
                sh.loss_part(t, &w, classes, held_out && t == 0)
            });
        }
        b.ahead(self.rt.workers().max(1));
        crate::fold_in_order(b, |i, p| {
            let acc = sums.shard(self.plan[i].2)?;
            for (a, v) in acc.iter_mut().zip(&p.grad) {
                *a += v;
            }
            acc[len - 4] += p.loss;
            acc[len - 3] += p.wsum;
            acc[len - 2] += p.correct as f64;
            acc[len - 1] += p.held as f64;
            Ok(())
        })?;
        sums.finish(self.ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rosenbrock function in n dimensions.
    fn rosenbrock(x: &[f64]) -> (f64, Vec<f64>, ()) {
        let mut f = 0.0;
        let mut g = vec![0.0; x.len()];
        for i in 0..x.len() - 1 {
            let a = x[i + 1] - x[i] * x[i];
            let b = 1.0 - x[i];
            f += 100.0 * a * a + b * b;
            g[i] += -400.0 * x[i] * a - 2.0 * b;
            g[i + 1] += 200.0 * a;
        }
        (f, g, ())
    }

    #[test]
    fn finds_the_minimum_of_rosenbrock() {
        let rt = Runtime::builder().workers(1).build().unwrap();
        let s = Settings {
            tol: 1e-8,
            max_iter: 500,
            ..Settings::default()
        };
        let m = minimize(
            &rt,
            vec![-1.2, 1.0, -1.2, 1.0],
            &s,
            |x| Ok(rosenbrock(x)),
            |_, _, _| {},
        )
        .unwrap();
        assert!(m.stop.converged(), "{m:?}");
        for v in &m.x {
            assert!((v - 1.0).abs() < 1e-5, "{m:?}");
        }
    }

    #[test]
    fn a_quadratic_converges_in_few_iterations_and_repeats_exactly() {
        let rt = Runtime::builder().workers(1).build().unwrap();
        let quad = |x: &[f64]| -> Result<Value<()>> {
            let g: Vec<f64> = x
                .iter()
                .enumerate()
                .map(|(i, v)| (i + 1) as f64 * (v - 3.0))
                .collect();
            let f = x
                .iter()
                .enumerate()
                .map(|(i, v)| 0.5 * (i + 1) as f64 * (v - 3.0) * (v - 3.0))
                .sum();
            Ok((f, g, ()))
        };
        let s = Settings {
            tol: 1e-10,
            ..Settings::default()
        };
        let a = minimize(&rt, vec![0.0; 8], &s, quad, |_, _, _| {}).unwrap();
        let b = minimize(&rt, vec![0.0; 8], &s, quad, |_, _, _| {}).unwrap();
        assert!(a.stop.converged(), "{a:?}");
        assert!(a.iterations <= 20, "{a:?}");
        assert_eq!(a.x, b.x);
        for v in &a.x {
            assert!((v - 3.0).abs() < 1e-6, "{a:?}");
        }
    }
}
