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
/// on these tall, thin matrices); a column that vanishes is replaced by
/// a unit vector orthogonal to the others.
pub(super) fn orthonormalise(y: &mut [f64], d: usize, w: usize) {
    for j in 0..w {
        for _ in 0..2 {
            for k in 0..j {
                let dot: f64 = (0..d).map(|i| y[i * w + j] * y[i * w + k]).sum();
                for i in 0..d {
                    y[i * w + j] -= dot * y[i * w + k];
                }
            }
        }
        let norm = (0..d)
            .map(|i| y[i * w + j] * y[i * w + j])
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 && norm.is_finite() {
            for i in 0..d {
                y[i * w + j] /= norm;
            }
        } else {
            for i in 0..d {
                y[i * w + j] = if i == j % d { 1.0 } else { 0.0 };
            }
        }
    }
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
