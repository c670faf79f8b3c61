//! Non-negative least squares on the normal equations: Lawson and
//! Hanson's active-set method on `A = X^T X (+ alpha I)` and `c = X^T y`,
//! the coefficients of scikit-learn's `positive=True`.

use crate::job::linalg::{cholesky, cholesky_solve};

/// The `b >= 0` that minimises `b^T A b / 2 - c^T b` (`A` symmetric
/// positive semi-definite, `n x n`, row-major): the least-squares
/// coefficients under the constraint. Each outer step frees the
/// coefficient whose gradient most wants to grow, then solves on the
/// free ones, stepping back to the boundary while a solution goes
/// negative; at most `3 n` outer steps.
pub(super) fn nnls(a: &[f64], c: &[f64], n: usize) -> Vec<f64> {
    let mut b = vec![0.0; n];
    let mut free = vec![false; n];
    let big = c.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let tol = 1e-12 * big.max(f64::MIN_POSITIVE);
    for _ in 0..3 * n.max(1) {
        let w = gradient(a, c, &b, n);
        let pick = (0..n)
            .filter(|&j| !free[j] && w[j] > tol)
            .max_by(|&i, &j| w[i].total_cmp(&w[j]));
        let Some(j) = pick else {
            break;
        };
        free[j] = true;
        // At most n rounds: each fixes one more coefficient at 0.
        for _ in 0..=n {
            let z = solve_free(a, c, &free, n);
            if (0..n).all(|i| !free[i] || z[i] > 0.0) {
                b = z;
                break;
            }
            // Towards `z` as far as every coefficient stays >= 0.
            let step = (0..n)
                .filter(|&i| free[i] && z[i] <= 0.0)
                .map(|i| b[i] / (b[i] - z[i]))
                .fold(1.0f64, f64::min);
            for i in 0..n {
                if free[i] {
                    b[i] += step * (z[i] - b[i]);
                    if b[i] <= 0.0 || (z[i] <= 0.0 && b[i] <= 1e-15 * big) {
                        free[i] = false;
                        b[i] = 0.0;
                    }
                }
            }
        }
    }
    b
}

/// `c - A b`: the negative gradient.
fn gradient(a: &[f64], c: &[f64], b: &[f64], n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| c[i] - (0..n).map(|k| a[i * n + k] * b[k]).sum::<f64>())
        .collect()
}

/// The unconstrained solution on the free coefficients (the others 0),
/// by Cholesky; a singular block gets a relative nudge on its diagonal.
fn solve_free(a: &[f64], c: &[f64], free: &[bool], n: usize) -> Vec<f64> {
    let idx: Vec<usize> = (0..n).filter(|&i| free[i]).collect();
    let m = idx.len();
    let mut sub: Vec<f64> = idx
        .iter()
        .flat_map(|&i| idx.iter().map(move |&k| a[i * n + k]))
        .collect();
    let scale = (0..m).map(|i| sub[i * m + i]).fold(0.0, f64::max);
    let mut rhs: Vec<f64> = idx.iter().map(|&i| c[i]).collect();
    let l = match cholesky(&sub, m, scale * 1e-13) {
        Some(l) => l,
        None => {
            for i in 0..m {
                sub[i * m + i] += scale.max(f64::MIN_POSITIVE) * 1e-10;
            }
            cholesky(&sub, m, 0.0).unwrap_or_else(|| vec![0.0; m * m])
        }
    };
    cholesky_solve(&l, m, &mut rhs);
    let mut z = vec![0.0; n];
    for (k, &i) in idx.iter().enumerate() {
        z[i] = if rhs[k].is_finite() { rhs[k] } else { 0.0 };
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unconstrained_solution_when_it_is_positive() {
        // A = I: b = c where c >= 0, else 0.
        let a = [1.0, 0.0, 0.0, 1.0];
        assert_eq!(nnls(&a, &[2.0, 3.0], 2), vec![2.0, 3.0]);
        assert_eq!(nnls(&a, &[2.0, -3.0], 2), vec![2.0, 0.0]);
        assert_eq!(nnls(&a, &[-1.0, -3.0], 2), vec![0.0, 0.0]);
    }

    #[test]
    fn correlated_columns_meet_the_optimality_conditions() {
        // X = [[1, 2], [1, 0], [0, 1]], y = [1, 2, -3]: the unconstrained
        // solution has a negative second coefficient.
        let x = [[1.0, 2.0], [1.0, 0.0], [0.0, 1.0]];
        let y = [1.0, 2.0, -3.0];
        let mut a = [0.0; 4];
        let mut c = [0.0; 2];
        for (r, &t) in x.iter().zip(&y) {
            for i in 0..2 {
                c[i] += r[i] * t;
                for k in 0..2 {
                    a[i * 2 + k] += r[i] * r[k];
                }
            }
        }
        let b = nnls(&a, &c, 2);
        let w = gradient(&a, &c, &b, 2);
        for i in 0..2 {
            assert!(b[i] >= 0.0);
            // KKT: zero gradient where free, non-positive where at 0.
            if b[i] > 0.0 {
                assert!(w[i].abs() < 1e-12, "{b:?} {w:?}");
            } else {
                assert!(w[i] <= 1e-12, "{b:?} {w:?}");
            }
        }
        assert!((b[0] - 1.5).abs() < 1e-12 && b[1] == 0.0, "{b:?}");
    }
}
