//! The randomized solver (Halko, Martinsson and Tropp, 2011) on the
//! covariance: subspace iteration `Y = G Q` over passes of the data
//! (each pass forms `Z^T (Z Q)` from the centred rows `Z`, never the
//! `d x d` matrix `G = Z^T Z`), orthonormalising `Y` between passes, then
//! Rayleigh-Ritz on the last subspace: the eigenvectors of `Q^T G Q`,
//! mapped back by `Q`.

use crate::input::mix;
use crate::job::linalg::eigh;

/// A `d x w` matrix of standard normal values from `seed` (Box-Muller
/// on hashed uniforms), orthonormalised: the starting subspace.
pub(super) fn start(d: usize, w: usize, seed: u64) -> Vec<f64> {
    let unit = |i: u64| ((mix(seed ^ 0x4a17_0b5e, i) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let mut q: Vec<f64> = (0..(d * w) as u64)
        .map(|i| {
            let (a, b) = (unit(2 * i), unit(2 * i + 1));
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        })
        .collect();
    orthonormalise(&mut q, d, w);
    q
}

/// Orthonormalises the `w` columns of the `d x w` matrix `y` in place
/// (modified Gram-Schmidt, twice, for the precision of Householder QR
/// on these tall, thin matrices; `w <= d`). A column that vanishes (in
/// the span of the ones before it, to rounding: the data has fewer
/// directions than the width) is replaced by the next unit vector that
/// is not, orthogonalised in turn. (The unit vector used to go in as it
/// was, not orthogonal to the others: on data of exactly low rank the
/// subspace was not orthonormal, and the components came out longer than
/// 1 with their variance multiplied.)
pub(super) fn orthonormalise(y: &mut [f64], d: usize, w: usize) {
    let mut unit = 0;
    for j in 0..w {
        let mut before = column_norm(y, d, w, j);
        let mut norm = project_out(y, d, w, j);
        while !(norm > before * 1e-10 && norm.is_finite()) && unit < d {
            for i in 0..d {
                y[i * w + j] = if i == unit { 1.0 } else { 0.0 };
            }
            unit += 1;
            before = 1.0;
            norm = project_out(y, d, w, j);
        }
        // Zero only when `w > d`, which the width rules out.
        let norm = if norm > 0.0 && norm.is_finite() {
            norm
        } else {
            f64::INFINITY
        };
        for i in 0..d {
            y[i * w + j] /= norm;
        }
    }
}

/// The Euclidean norm of column `j` of the `d x w` matrix `y`.
fn column_norm(y: &[f64], d: usize, w: usize, j: usize) -> f64 {
    (0..d)
        .map(|i| y[i * w + j] * y[i * w + j])
        .sum::<f64>()
        .sqrt()
}

/// Takes out of column `j` its components along columns `0..j` (twice),
/// and returns its norm then.
fn project_out(y: &mut [f64], d: usize, w: usize, j: usize) -> f64 {
    for _ in 0..2 {
        for k in 0..j {
            let dot: f64 = (0..d).map(|i| y[i * w + j] * y[i * w + k]).sum();
            for i in 0..d {
                y[i * w + j] -= dot * y[i * w + k];
            }
        }
    }
    column_norm(y, d, w, j)
}

/// Rayleigh-Ritz: the eigenvalues (descending) of `Q^T Y` (`Y = G Q`) and
/// the matching eigenvectors of `G`, as the rows of a `w x d` matrix.
pub(super) fn ritz(q: &[f64], y: &[f64], d: usize, w: usize) -> Option<(Vec<f64>, Vec<f64>)> {
    let mut t = vec![0.0; w * w];
    for a in 0..w {
        for b in 0..w {
            t[a * w + b] = (0..d).map(|i| q[i * w + a] * y[i * w + b]).sum();
        }
    }
    // Symmetric in exact arithmetic: its mean with its transpose.
    for a in 0..w {
        for b in 0..a {
            let m = 0.5 * (t[a * w + b] + t[b * w + a]);
            t[a * w + b] = m;
            t[b * w + a] = m;
        }
    }
    let (vals, vecs) = eigh(&t, w)?;
    let mut out = vec![0.0; w * d];
    for r in 0..w {
        for i in 0..d {
            out[r * d + i] = (0..w).map(|j| q[i * w + j] * vecs[r * w + j]).sum();
        }
    }
    Some((vals, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Q^T Q`'s largest distance from the identity.
    fn off_identity(q: &[f64], d: usize, w: usize) -> f64 {
        let mut worst: f64 = 0.0;
        for a in 0..w {
            for b in 0..w {
                let dot: f64 = (0..d).map(|i| q[i * w + a] * q[i * w + b]).sum();
                let want = if a == b { 1.0 } else { 0.0 };
                worst = worst.max((dot - want).abs());
            }
        }
        worst
    }

    #[test]
    fn columns_in_the_span_of_the_others_become_orthonormal_unit_vectors() {
        // Columns: (1, 1, 0), its double, zero, and (1, 0, 0): the first
        // replacement, e_0, is not orthogonal to the first column.
        let (d, w) = (3, 3);
        for y0 in [
            vec![1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0],
            vec![1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ] {
            let mut y = y0.clone();
            orthonormalise(&mut y, d, w);
            assert!(off_identity(&y, d, w) < 1e-12, "{y0:?} -> {y:?}");
        }
    }

    #[test]
    fn ordinary_columns_are_orthonormalised() {
        let (d, w) = (50, 7);
        let q = start(d, w, 3);
        assert!(off_identity(&q, d, w) < 1e-12);
    }
}
