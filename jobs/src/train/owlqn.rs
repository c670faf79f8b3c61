//! OWL-QN (Andrew and Gao, 2007): L-BFGS for a smooth objective plus an
//! L1 penalty `sum_i l1_i |x_i|`, for the L1 and elastic-net penalties.
//!
//! The L1 term has no gradient where a coordinate is 0, so each iteration
//! works in one orthant, where it is linear:
//!
//! - the *pseudo-gradient* is the gradient of the objective restricted to
//!   the orthant that leads downhill (0 for a coordinate at 0 whose
//!   subgradient interval holds 0: it stays at 0);
//! - the L-BFGS direction of the pseudo-gradient (the curvature pairs come
//!   from the smooth part's gradients, kept in executors as for L-BFGS)
//!   keeps only the components that go downhill;
//! - a backtracking line search projects each trial point onto the
//!   orthant: a coordinate that would cross 0 stops at 0. That is how
//!   coordinates become exactly 0.

use std::collections::VecDeque;

use outcore::Runtime;

use super::quasi::{
    add_pair, direction, dot, max_abs, Eval, Minimum, Pair, Settings, Step, Stop, Value, C1,
};
use crate::error::Result;

/// `sum_i l1_i |x_i|`.
fn l1_norm(x: &[f64], l1: &[f64]) -> f64 {
    x.iter().zip(l1).map(|(v, w)| w * v.abs()).sum()
}

/// The pseudo-gradient of `g + l1 . |x|` at `x`.
fn pseudo_gradient(x: &[f64], g: &[f64], l1: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(g)
        .zip(l1)
        .map(|((&x, &g), &w)| {
            if w == 0.0 {
                g
            } else if x > 0.0 {
                g + w
            } else if x < 0.0 {
                g - w
            } else if g + w < 0.0 {
                g + w
            } else if g - w > 0.0 {
                g - w
            } else {
                0.0
            }
        })
        .collect()
}

/// Minimises `eval` (the smooth part: value and gradient at a point, plus
/// anything else measured in the same pass) plus `sum_i l1_i |x_i|` from
/// `x0`, as [`minimize`](super::lbfgs::minimize) does without the L1 term.
/// The L1 weights `l1_i` come from `l1_of` with what the first evaluation
/// reported. The values reported (steps and minimum) include the L1 term;
/// the largest gradient component is the pseudo-gradient's.
pub fn minimize_l1<E>(
    rt: &Runtime,
    x0: Vec<f64>,
    s: &Settings,
    l1_of: impl FnOnce(&E) -> Vec<f64>,
    mut eval: impl FnMut(&[f64]) -> Result<Value<E>>,
    mut on_step: impl FnMut(&Step, &[f64], &E),
) -> Result<Minimum<E>> {
    let (f, g, extra) = eval(&x0)?;
    let l1 = &l1_of(&extra)[..];
    let mut evaluations = 1;
    let mut cur = Eval { x: x0, f, g, extra };
    let mut pairs: VecDeque<Pair> = VecDeque::new();
    let mut gamma = 1.0;
    let mut iterations = 0;
    let total = |e: &Eval<E>| e.f + l1_norm(&e.x, l1);
    let stop = loop {
        let pg = pseudo_gradient(&cur.x, &cur.g, l1);
        if max_abs(&pg) <= s.tol {
            break Stop::Gradient;
        }
        if iterations >= s.max_iter {
            break Stop::MaxIter;
        }
        let d = downhill(direction(rt, &pairs, gamma, &pg)?, &pg, &mut pairs);
        let first = if pairs.is_empty() {
            (1.0 / dot(&d, &d).sqrt()).min(1.0)
        } else {
            1.0
        };
        let (next, used) = backtrack(&cur, &d, &pg, first, s.max_evals, l1, &mut eval)?;
        evaluations += used;
        iterations += 1;
        let Some(next) = next else {
            break Stop::LineSearch;
        };
        if let Some(g) = add_pair(rt, &mut pairs, s.history, iterations, &cur, &next)? {
            gamma = g;
        }
        let (before, after) = (total(&cur), total(&next));
        let decrease = (before - after) / before.abs().max(after.abs()).max(1.0);
        cur = next;
        on_step(
            &Step {
                iteration: iterations,
                value: after,
                grad_max: max_abs(&pseudo_gradient(&cur.x, &cur.g, l1)),
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
        grad_max: max_abs(&pseudo_gradient(&cur.x, &cur.g, l1)),
        value: total(&cur),
        x: cur.x,
        iterations,
        evaluations,
        stop,
        extra: cur.extra,
    })
}

/// The direction `d` with the components that do not go downhill (against
/// the pseudo-gradient `pg`) set to 0; the steepest descent `-pg`, the
/// pairs dropped, when nothing is left of it.
fn downhill(mut d: Vec<f64>, pg: &[f64], pairs: &mut VecDeque<Pair>) -> Vec<f64> {
    for (di, &p) in d.iter_mut().zip(pg) {
        if *di * p >= 0.0 {
            *di = 0.0;
        }
    }
    let slope = dot(&d, pg);
    if slope.is_nan() || slope >= 0.0 {
        pairs.clear();
        return pg.iter().map(|v| -v).collect();
    }
    d
}

/// Backtracking along `d` from `cur`, each trial point projected onto the
/// orthant of `cur.x` (or, for a coordinate at 0, the one `-pg` points
/// to), until the objective with its L1 term decreases enough (Armijo,
/// with the pseudo-gradient). Returns the accepted point, if any within
/// `max_evals`, and the evaluations made.
fn backtrack<E>(
    cur: &Eval<E>,
    d: &[f64],
    pg: &[f64],
    first: f64,
    max_evals: usize,
    l1: &[f64],
    eval: &mut impl FnMut(&[f64]) -> Result<Value<E>>,
) -> Result<(Option<Eval<E>>, usize)> {
    let base = cur.f + l1_norm(&cur.x, l1);
    let orthant: Vec<f64> = cur
        .x
        .iter()
        .zip(pg)
        .map(|(&x, &p)| if x != 0.0 { x.signum() } else { -p.signum() })
        .collect();
    let mut a = first;
    for used in 1..=max_evals.max(1) {
        let x: Vec<f64> = (0..d.len())
            .map(|i| {
                let v = cur.x[i] + a * d[i];
                if l1[i] > 0.0 && v * orthant[i] <= 0.0 {
                    0.0
                } else {
                    v
                }
            })
            .collect();
        let (f, g, extra) = eval(&x)?;
        let moved: f64 = x
            .iter()
            .zip(&cur.x)
            .zip(pg)
            .map(|((n, o), p)| (n - o) * p)
            .sum();
        if f.is_finite() && f + l1_norm(&x, l1) <= base + C1 * moved {
            return Ok((Some(Eval { x, f, g, extra }), used));
        }
        a *= 0.5;
    }
    Ok((None, max_evals.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `0.5 |x - t|^2 + l |x|_1` has the soft-thresholded `t` as its
    /// minimum: coordinates with `|t_i| <= l` exactly 0.
    #[test]
    fn a_lasso_quadratic_reaches_the_soft_threshold() {
        let rt = Runtime::builder().workers(1).build().unwrap();
        let t = [3.0, -0.5, 0.2, -2.0, 0.0];
        let l = 0.7;
        let l1 = vec![l; t.len()];
        let s = Settings {
            tol: 1e-10,
            max_iter: 200,
            ..Settings::default()
        };
        let min = minimize_l1(
            &rt,
            vec![0.0; t.len()],
            &s,
            |_| l1,
            |x| {
                let g: Vec<f64> = x.iter().zip(&t).map(|(a, b)| a - b).collect();
                Ok((0.5 * dot(&g, &g), g, ()))
            },
            |_, _, _| {},
        )
        .unwrap();
        let want = [2.3, 0.0, 0.0, -1.3, 0.0];
        for (a, b) in min.x.iter().zip(&want) {
            assert!((a - b).abs() < 1e-8, "{:?}", min.x);
        }
        assert_eq!(min.x[1], 0.0);
        assert_eq!(min.x[2], 0.0);
        assert!(min.stop.converged(), "{:?}", min.stop);
    }
}
