//! What L-BFGS ([`lbfgs`](super::lbfgs)) and OWL-QN
//! ([`owlqn`](super::owlqn)) share: their settings and results, the
//! curvature pairs (held, or in executors) and the two-loop recursion.

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
pub(super) type Pair = (Vector, Vector, f64);

/// Values of a pair's vector up to which it is held in memory rather than
/// in an executor (64 KiB).
pub const HELD_PAIR_VALUES: usize = 8192;

/// One vector of a curvature pair: held, or in its executor.
pub(super) enum Vector {
    Held(Vec<f64>),
    Stored(Handle<PodVec<f64>>),
}

impl Vector {
    /// `v` held, or stored in an executor named `name` when large.
    fn new(rt: &Runtime, name: &str, v: Vec<f64>) -> Result<Vector> {
        Ok(if v.len() <= HELD_PAIR_VALUES {
            Vector::Held(v)
        } else {
            Vector::Stored(rt.insert_named(Some(name), PodVec::from(v))?)
        })
    }

    /// `self . q`.
    fn dot(&self, rt: &Runtime, q: &[f64]) -> Result<f64> {
        Ok(match self {
            Vector::Held(s) => dot(s, q),
            Vector::Stored(h) => rt.read(h, {
                let q = q.to_vec();
                move |s: &PodVec<f64>| dot(s, &q)
            })?,
        })
    }

    /// `q + a * self`.
    fn add_to(&self, rt: &Runtime, a: f64, mut q: Vec<f64>) -> Result<Vec<f64>> {
        let add = move |v: &[f64]| {
            for (qi, vi) in q.iter_mut().zip(v) {
                *qi += a * vi;
            }
            q
        };
        Ok(match self {
            Vector::Held(v) => add(v),
            Vector::Stored(h) => rt.read(h, move |v: &PodVec<f64>| add(v))?,
        })
    }
}

/// The sufficient decrease constant of the Wolfe conditions (and of
/// OWL-QN's backtracking).
pub(super) const C1: f64 = 1e-4;
/// The curvature constant of the Wolfe conditions.
pub(super) const C2: f64 = 0.9;

pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub(super) fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// A point, its value and gradient, and what else the objective reported.
pub(super) struct Eval<E> {
    pub(super) x: Vec<f64>,
    pub(super) f: f64,
    pub(super) g: Vec<f64>,
    pub(super) extra: E,
}

/// What an objective returns at a point: its value, its gradient and
/// anything else measured in the same pass (reported with the step).
pub type Value<E> = (f64, Vec<f64>, E);

/// Stores the curvature pair of the step from `cur` to `next` (of
/// iteration `iteration`) in executors, dropping the oldest beyond
/// `history`, when its curvature is positive; returns the initial
/// Hessian's new scale, `y . s / y . y`, then.
pub(super) fn add_pair<E>(
    rt: &Runtime,
    pairs: &mut VecDeque<Pair>,
    history: usize,
    iteration: usize,
    cur: &Eval<E>,
    next: &Eval<E>,
) -> Result<Option<f64>> {
    let sv: Vec<f64> = next.x.iter().zip(&cur.x).map(|(a, b)| a - b).collect();
    let yv: Vec<f64> = next.g.iter().zip(&cur.g).map(|(a, b)| a - b).collect();
    let ys = dot(&yv, &sv);
    let yy = dot(&yv, &yv);
    if !(ys > f64::EPSILON * yy && yy > 0.0) {
        return Ok(None);
    }
    if pairs.len() == history {
        pairs.pop_front();
    }
    let hs = Vector::new(rt, &format!("lbfgs s {iteration}"), sv)?;
    let hy = Vector::new(rt, &format!("lbfgs y {iteration}"), yv)?;
    pairs.push_back((hs, hy, 1.0 / ys));
    Ok(Some(ys / yy))
}

/// The two-loop recursion: `-H g` for the inverse-Hessian approximation of
/// the stored pairs, each pair read from where it is kept.
pub(super) fn direction(
    rt: &Runtime,
    pairs: &VecDeque<Pair>,
    gamma: f64,
    g: &[f64],
) -> Result<Vec<f64>> {
    let mut q = g.to_vec();
    let mut alpha = vec![0.0; pairs.len()];
    for (i, (s, y, rho)) in pairs.iter().enumerate().rev() {
        let a = rho * s.dot(rt, &q)?;
        alpha[i] = a;
        // q - a y, as q + (-a) y: the same bits.
        q = y.add_to(rt, -a, q)?;
    }
    let mut r: Vec<f64> = q.iter().map(|v| gamma * v).collect();
    for (i, (s, y, rho)) in pairs.iter().enumerate() {
        let b = rho * y.dot(rt, &r)?;
        r = s.add_to(rt, alpha[i] - b, r)?;
    }
    Ok(r.into_iter().map(|v| -v).collect())
}
