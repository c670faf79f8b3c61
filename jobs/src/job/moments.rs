//! The two passes that least squares and PCA share: the (weighted)
//! means of the columns and targets, then the Gram matrix of the rows
//! centred on them, `[x - m_x, y - m_y]`, summed in float64. Centring
//! before the products (not after, from uncentred sums) keeps the
//! precision of data far from the origin.

use super::linalg::{add_gram, gemm, Mat};
use super::Rows;
use crate::error::{Error, Result};

/// Rows centred and multiplied at a time.
const BLOCK: usize = 256;

/// The most a task of these passes holds besides its sums: a block of
/// centred rows and their weights, and a block scaled by them.
pub fn scratch_bytes(shape: &super::Shape) -> u64 {
    (BLOCK * (shape.dims + shape.targets) * 8 * 2 + BLOCK * 8) as u64
}

/// Length of the means pass's sums: the weight, then the weighted sums
/// of the `dims` columns and the `targets` targets.
pub fn means_len(dims: usize, targets: usize) -> usize {
    1 + dims + targets
}

/// Adds one task's weight and weighted column and target sums to `out`.
pub fn add_means(rows: &Rows<'_>, out: &mut [f64]) {
    let (d, t) = (rows.dims, rows.targets);
    for i in 0..rows.len() {
        let w = rows.w.get(i).map_or(1.0, |&w| f64::from(w));
        out[0] += w;
        for (o, &v) in out[1..1 + d].iter_mut().zip(&rows.x[i * d..(i + 1) * d]) {
            *o += w * f64::from(v);
        }
        for (o, &v) in out[1 + d..].iter_mut().zip(&rows.y[i * t..(i + 1) * t]) {
            *o += w * f64::from(v);
        }
    }
}

/// The column and target means from the means pass's `sums`, and the
/// total weight; an error when it is 0.
pub fn means(sums: &[f64], dims: usize) -> Result<(Vec<f64>, Vec<f64>, f64)> {
    let w = sums[0];
    if w.is_nan() || w <= 0.0 {
        return Err(Error::Input("the rows' sample weights add up to 0".into()));
    }
    let m: Vec<f64> = sums[1..].iter().map(|s| s / w).collect();
    let (x, y) = m.split_at(dims);
    Ok((x.to_vec(), y.to_vec(), w))
}

/// The rows `range` of `rows` and their targets, centred on `means` (of
/// the columns, of the targets), into `z`, row-major, in float64.
fn centre(
    rows: &Rows<'_>,
    range: std::ops::Range<usize>,
    means: (&[f64], &[f64]),
    z: &mut Vec<f64>,
) {
    let (d, t) = (rows.dims, rows.targets);
    z.clear();
    for i in range {
        let x = rows.x[i * d..(i + 1) * d].iter().zip(means.0);
        z.extend(x.map(|(&v, m)| f64::from(v) - m));
        let y = rows.y[i * t..(i + 1) * t].iter().zip(means.1);
        z.extend(y.map(|(&v, m)| f64::from(v) - m));
    }
}

/// Adds one task's weighted Gram matrix of `[x - mean_x, y - mean_y]`
/// (`(dims + targets)^2` values, row-major) to `out`.
pub fn add_centred_gram(rows: &Rows<'_>, mean_x: &[f64], mean_y: &[f64], out: &mut [f64]) {
    let (d, t) = (rows.dims, rows.targets);
    let cols = d + t;
    let mut z = Vec::with_capacity(BLOCK * cols);
    let mut w = Vec::with_capacity(BLOCK);
    let n = rows.len();
    let mut r = 0;
    while r < n {
        let m = BLOCK.min(n - r);
        centre(rows, r..r + m, (mean_x, mean_y), &mut z);
        w.clear();
        if !rows.w.is_empty() {
            w.extend(rows.w[r..r + m].iter().map(|&v| f64::from(v)));
        }
        add_gram(&z, cols, &w, out);
        r += m;
    }
}

/// Adds one task's `Z^T (Z Q)` (`dims x width`, row-major), `Z` being the
/// rows centred on `mean` and `Q` the `dims x width` matrix `q`, and then
/// each column's sum of squares of `Z` (`dims` values), to `out`: a pass
/// of subspace iteration on the Gram matrix `Z^T Z`, without forming it.
pub fn add_projected(rows: &Rows<'_>, mean: &[f64], q: &[f64], width: usize, out: &mut [f64]) {
    let d = rows.dims;
    let n = rows.len();
    let mut z = Vec::with_capacity(BLOCK * d);
    let mut p = vec![0.0; BLOCK * width];
    let (zq, squares) = out.split_at_mut(d * width);
    let mut r = 0;
    while r < n {
        let m = BLOCK.min(n - r);
        centre(rows, r..r + m, (mean, &[]), &mut z);
        for row in z.chunks_exact(d.max(1)) {
            for (s, v) in squares.iter_mut().zip(row) {
                *s += v * v;
            }
        }
        let zm = Mat::strided(&z, (m, d), (d, 1));
        gemm(zm, Mat::strided(q, (d, width), (width, 1)), 0.0, &mut p);
        let zt = Mat::strided(&z, (d, m), (1, d));
        gemm(zt, Mat::strided(&p, (m, width), (width, 1)), 1.0, zq);
        r += m;
    }
}
