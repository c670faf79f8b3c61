//! Limited-memory BFGS with a strong-Wolfe line search, for smooth convex
//! objectives evaluated by a pass over executors.
//!
//! The objective is a callback that returns the value and the gradient at
//! a point together, so every line-search trial costs one pass and the
//! accepted trial's gradient is reused by the next iteration. The curvature
//! pairs `(s, y)` live in executors of the runtime, so a large model's
//! history can be evicted like data; the two-loop recursion reads them one
//! at a time.
//!
//! Every step is a fixed sequence of floating-point operations on the
//! values the callback returns, so the iterates depend only on them: a
//! callback that is itself deterministic gives the same model every time.

use std::collections::VecDeque;

use outcore::{Handle, PodVec, Runtime};

use crate::error::Result;

/// Why the optimiser stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The largest gradient component fell to the tolerance.
    Gradient,
    /// The objective's relative decrease fell below machine precision
    /// (scikit-learn's `ftol`, 64 ulps).
    Objective,
    /// The iteration budget ran out.
    MaxIter,
    /// The line search found no acceptable step (the point kept is the
    /// best one found).
    LineSearch,
}

impl Stop {
    /// Whether this counts as convergence.
    pub fn converged(self) -> bool {
        matches!(self, Stop::Gradient | Stop::Objective)
    }

    /// A short description for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Stop::Gradient => "gradient below tolerance",
            Stop::Objective => "objective no longer decreasing",
            Stop::MaxIter => "iteration limit reached",
            Stop::LineSearch => "line search found no better point",
        }
    }
}

/// Settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Stop when `max |g_i| <= tol`.
    pub tol: f64,
    /// Iteration limit.
    pub max_iter: usize,
    /// Curvature pairs kept.
    pub history: usize,
    /// Objective evaluations allowed per line search.
    pub max_evals: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tol: 1e-4,
            max_iter: 100,
            history: 10,
            max_evals: 20,
        }
    }
}

/// One accepted step.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// Iteration index (from 1).
    pub iteration: usize,
    /// Objective at the new point.
    pub value: f64,
    /// Largest gradient component at the new point.
    pub grad_max: f64,
    /// Evaluations this iteration's line search made.
    pub evaluations: usize,
}

/// The result.
#[derive(Clone, Debug)]
pub struct Minimum<E> {
    /// The point.
    pub x: Vec<f64>,
    /// The objective there.
    pub value: f64,
    /// Largest gradient component there.
    pub grad_max: f64,
    /// Iterations made.
    pub iterations: usize,
    /// Objective evaluations made (passes).
    pub evaluations: usize,
    /// Why it stopped.
    pub stop: Stop,
    /// What the objective reported with its value at the point.
    pub extra: E,
}

/// A curvature pair in its executors: `s`, `y` and `1 / (y . s)`.
type Pair = (Handle<PodVec<f64>>, Handle<PodVec<f64>>, f64);

/// Sufficient decrease and curvature constants of the Wolfe conditions.
const C1: f64 = 1e-4;
const C2: f64 = 0.9;

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// A point, its value and gradient, and what else the objective reported.
struct Eval<E> {
    x: Vec<f64>,
    f: f64,
    g: Vec<f64>,
    extra: E,
}

/// What an objective returns at a point: its value, its gradient and
/// anything else measured in the same pass (reported with the step).
pub type Value<E> = (f64, Vec<f64>, E);

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
        let sv: Vec<f64> = next.x.iter().zip(&cur.x).map(|(a, b)| a - b).collect();
        let yv: Vec<f64> = next.g.iter().zip(&cur.g).map(|(a, b)| a - b).collect();
        let ys = dot(&yv, &sv);
        let yy = dot(&yv, &yv);
        if ys > f64::EPSILON * yy && yy > 0.0 {
            if pairs.len() == s.history {
                pairs.pop_front();
            }
            gamma = ys / yy;
            let hs = rt.insert_named(Some(&format!("lbfgs s {iterations}")), PodVec::from(sv))?;
            let hy = rt.insert_named(Some(&format!("lbfgs y {iterations}")), PodVec::from(yv))?;
            pairs.push_back((hs, hy, 1.0 / ys));
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

/// The two-loop recursion: `-H g` for the inverse-Hessian approximation of
/// the stored pairs, each pair read from its executors.
fn direction(rt: &Runtime, pairs: &VecDeque<Pair>, gamma: f64, g: &[f64]) -> Result<Vec<f64>> {
    let mut q = g.to_vec();
    let mut alpha = vec![0.0; pairs.len()];
    for (i, (hs, hy, rho)) in pairs.iter().enumerate().rev() {
        let a = rho
            * rt.read(hs, {
                let q = q.clone();
                move |s: &PodVec<f64>| dot(s, &q)
            })?;
        alpha[i] = a;
        q = rt.read(hy, move |y: &PodVec<f64>| {
            for (qi, yi) in q.iter_mut().zip(y.iter()) {
                *qi -= a * yi;
            }
            q
        })?;
    }
    let mut r: Vec<f64> = q.iter().map(|v| gamma * v).collect();
    for (i, (hs, hy, rho)) in pairs.iter().enumerate() {
        let b = rho
            * rt.read(hy, {
                let r = r.clone();
                move |y: &PodVec<f64>| dot(y, &r)
            })?;
        let c = alpha[i] - b;
        r = rt.read(hs, move |s: &PodVec<f64>| {
            for (ri, si) in r.iter_mut().zip(s.iter()) {
                *ri += c * si;
            }
            r
        })?;
    }
    Ok(r.into_iter().map(|v| -v).collect())
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
    let mut used = 0;
    let mut at = |a: f64, used: &mut usize| -> Result<(Eval<E>, f64)> {
        let x: Vec<f64> = cur.x.iter().zip(d).map(|(x, d)| x + a * d).collect();
        let (f, g, extra) = eval(&x)?;
        *used += 1;
        let dg = dot(&g, d);
        Ok((Eval { x, f, g, extra }, dg))
    };
    let armijo = |a: f64, f: f64| f <= cur.f + C1 * a * slope;
    let curvature = |dg: f64| dg.abs() <= -C2 * slope;
    // The best point seen that lowers the objective (a fallback).
    let mut best: Option<Eval<E>> = None;
    let keep = |e: Eval<E>, best: &mut Option<Eval<E>>| {
        if e.f < cur.f && best.as_ref().is_none_or(|b| e.f < b.f) {
            *best = Some(e);
        }
    };
    // Bracketing: (lo: step, value, slope) satisfies the sufficient
    // decrease; hi is the other end once found.
    let (mut lo, mut f_lo, mut dg_lo) = (0.0, cur.f, slope);
    let mut a = first;
    let mut hi: Option<(f64, f64)> = None;
    while used < max_evals {
        let (e, dg) = at(a, &mut used)?;
        if !armijo(a, e.f) || (lo > 0.0 && e.f >= f_lo) {
            hi = Some((a, e.f));
            keep(e, &mut best);
            break;
        }
        if curvature(dg) {
            return Ok((Some(e), used));
        }
        if dg >= 0.0 {
            // Past the minimum along d: the interval is [a, lo].
            hi = Some((lo, f_lo));
            (lo, f_lo, dg_lo) = (a, e.f, dg);
            keep(e, &mut best);
            break;
        }
        (lo, f_lo, dg_lo) = (a, e.f, dg);
        keep(e, &mut best);
        a *= 2.0;
    }
    // Zoom between lo (sufficient decrease holds) and hi.
    while let Some((h, f_h)) = hi {
        if used >= max_evals {
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
        let (e, dg) = at(t, &mut used)?;
        if !armijo(t, e.f) || e.f >= f_lo {
            hi = Some((t, e.f));
            keep(e, &mut best);
            continue;
        }
        if curvature(dg) {
            return Ok((Some(e), used));
        }
        if dg * (h - lo) >= 0.0 {
            hi = Some((lo, f_lo));
        }
        (lo, f_lo, dg_lo) = (t, e.f, dg);
        keep(e, &mut best);
    }
    Ok((best, used))
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
