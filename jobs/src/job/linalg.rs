//! Dense float64 linear algebra for the jobs' small systems (a model's
//! `d x d` Gram matrix): the Gram matrix of a block of rows, Cholesky
//! solves and the symmetric eigendecomposition (faer's, or Householder
//! reduction and the implicit QL method for small ones). Every routine is
//! sequential and its operations' order depends only on its input's
//! shape, so the results are the same bytes on every run.

/// Rows converted to float64 and centred at a time.
const BLOCK: usize = 256;

/// A matrix read from a slice: its shape and its row and column strides.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    v: &'a [f64],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> Mat<'a> {
    /// `v` as a `rows x cols` matrix whose element `(i, j)` is
    /// `v[i * rs + j * cs]`.
    pub fn strided(
        v: &'a [f64],
        (rows, cols): (usize, usize),
        (rs, cs): (usize, usize),
    ) -> Mat<'a> {
        Mat {
            v,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// Whether every element lies within the slice.
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.v.len()
    }
}

/// `C = A B + beta C`, `C` being `a.rows x b.cols`, row-major (row
/// stride `b.cols`), with `beta = 0` not reading it: one GEMM, in an order
/// that depends only on the shapes. Panics (a bug of the caller) when the
/// shapes do not match or a matrix reaches past its slice.
pub fn gemm(a: Mat<'_>, b: Mat<'_>, beta: f64, c: &mut [f64]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(
        b.rows == k && a.fits() && b.fits() && m * n <= c.len(),
        "internal: gemm of {m}x{k} by {}x{n} into {} values",
        b.rows,
        c.len()
    );
    // SAFETY: checked above: every element of A and B read lies within
    // its slice and C's m*n elements (row stride n) within `c`, which is
    // borrowed uniquely, so it aliases neither.
    unsafe {
        matrixmultiply::dgemm(
            m,
            k,
            n,
            1.0,
            a.v.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.v.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Adds `sum_i w_i z_i z_i^T` to `gram` (`cols x cols`, row-major), where
/// `z_i` is row `i` of `z` (`rows x cols`, row-major, float64) and `w_i`
/// is `w[i]` (1 when `w` is empty). Blocks of 256 rows from the
/// first, each one GEMM.
pub fn add_gram(z: &[f64], cols: usize, w: &[f64], gram: &mut [f64]) {
    let rows = z.len() / cols.max(1);
    let mut scaled = Vec::new();
    let mut r = 0;
    while r < rows {
        let n = BLOCK.min(rows - r);
        let zb = &z[r * cols..(r + n) * cols];
        let b: &[f64] = if w.is_empty() {
            zb
        } else {
            scaled.clear();
            for (row, &wi) in zb.chunks_exact(cols).zip(&w[r..r + n]) {
                scaled.extend(row.iter().map(|v| v * wi));
            }
            &scaled
        };
        let a = Mat::strided(zb, (cols, n), (1, cols));
        gemm(a, Mat::strided(b, (n, cols), (cols, 1)), 1.0, gram);
        r += n;
    }
}

/// The Cholesky factor `L` (lower, row-major) of the symmetric `n x n`
/// matrix `a`, or `None` when a pivot is not positive or falls below
/// `tiny` (the matrix is singular or nearly so).
pub fn cholesky(a: &[f64], n: usize, tiny: f64) -> Option<Vec<f64>> {
    if n >= FAER_FROM {
        cholesky_faer(a, n, tiny)
    } else {
        cholesky_loops(a, n, tiny)
    }
}

/// [`cholesky`] by the textbook loops.
fn cholesky_loops(a: &[f64], n: usize, tiny: f64) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for j in 0..n {
        let mut s = a[j * n + j];
        for k in 0..j {
            s -= l[j * n + k] * l[j * n + k];
        }
        if s.is_nan() || s <= tiny {
            return None;
        }
        let d = s.sqrt();
        l[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            l[i * n + j] = s / d;
        }
    }
    Some(l)
}

/// [`cholesky`] by faer's blocked factorization (one thread), from
/// [`FAER_FROM`] columns: 10-20 times the loops above at 2,000.
fn cholesky_faer(a: &[f64], n: usize, tiny: f64) -> Option<Vec<f64>> {
    use faer::linalg::cholesky::llt::factor::{self, LltRegularization};
    use faer::{MatMut, Par};
    if a.len() != n * n || a.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut l = a.to_vec();
    {
        // Column-major, `a` is itself (symmetric); faer leaves L in the
        // lower triangle, which the row-major buffer holds as L^T.
        let m = MatMut::from_column_major_slice_mut(&mut l, n, n);
        let req = factor::cholesky_in_place_scratch::<f64>(n, Par::Seq, Default::default());
        let mut buf = faer::dyn_stack::MemBuffer::try_new(req).ok()?;
        let stack = faer::dyn_stack::MemStack::new(&mut buf);
        let none = LltRegularization::default();
        factor::cholesky_in_place(m, none, Par::Seq, stack, Default::default()).ok()?;
    }
    for i in 0..n {
        let d = l[i * n + i];
        if d.is_nan() || d * d <= tiny {
            return None;
        }
        for j in 0..i {
            l[i * n + j] = l[j * n + i];
            l[j * n + i] = 0.0;
        }
    }
    Some(l)
}

/// Solves `L L^T x = b` in place, `l` from [`cholesky`].
pub fn cholesky_solve(l: &[f64], n: usize, b: &mut [f64]) {
    for i in 0..n {
        let mut s = b[i];
        for k in 0..i {
            s -= l[i * n + k] * b[k];
        }
        b[i] = s / l[i * n + i];
    }
    for i in (0..n).rev() {
        let mut s = b[i];
        for k in i + 1..n {
            s -= l[k * n + i] * b[k];
        }
        b[i] = s / l[i * n + i];
    }
}

/// The eigenvalues of the symmetric `n x n` matrix `a` (row-major), in
/// descending order, and the eigenvectors as the rows of the second
/// vector (`n x n`, row `i` for value `i`). `None` when the iteration
/// does not converge or the matrix holds a NaN.
///
/// From [`FAER_FROM`] columns on, faer's blocked tridiagonal reduction
/// and divide and conquer, on one thread (faer is built without rayon):
/// at LAPACK's speed, 15-20 times the Householder and QL code below at
/// 1,000-2,000 columns. Under that, that code, which holds half as much
/// memory and none for faer's matrix products. Either gives the same
/// bytes on every run on one machine; faer's kernels pick their
/// instruction set at run time, as the Gram matrix's `gemm` does.
pub fn eigh(a: &[f64], n: usize) -> Option<(Vec<f64>, Vec<f64>)> {
    if a.len() != n * n || a.iter().any(|v| !v.is_finite()) {
        return None;
    }
    if n < FAER_FROM {
        eigh_ql(a, n)
    } else {
        eigh_faer(a, n)
    }
}

/// Columns from which [`eigh`] takes faer's solver.
pub const FAER_FROM: usize = 256;

/// [`eigh`] by faer.
fn eigh_faer(a: &[f64], n: usize) -> Option<(Vec<f64>, Vec<f64>)> {
    use faer::linalg::evd::{self, ComputeEigenvectors};
    use faer::{ColMut, MatMut, MatRef, Par};
    let mut values = vec![0.0; n];
    let mut vectors = vec![0.0; n * n];
    {
        // The eigenvectors are U's columns: stored column-major, each is a
        // row of `vectors`.
        let u = MatMut::from_column_major_slice_mut(&mut vectors, n, n);
        let s = ColMut::from_slice_mut(&mut values).as_diagonal_mut();
        let req = evd::self_adjoint_evd_scratch::<f64>(
            n,
            ComputeEigenvectors::Yes,
            Par::Seq,
            Default::default(),
        );
        let mut buf = faer::dyn_stack::MemBuffer::try_new(req).ok()?;
        let stack = faer::dyn_stack::MemStack::new(&mut buf);
        // `a` is symmetric: its row-major view is the matrix.
        let m = MatRef::from_row_major_slice(a, n, n);
        evd::self_adjoint_evd(m, s, Some(u), Par::Seq, stack, Default::default()).ok()?;
    }
    if values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| values[j].total_cmp(&values[i]).then(i.cmp(&j)));
    permute_rows(&mut vectors, n, &order);
    let values = order.iter().map(|&i| values[i]).collect();
    Some((values, vectors))
}

/// Bytes [`eigh`] holds besides its input, for an `n x n` matrix. faer's:
/// the vectors and its workspace (4.04 `n^2` float64 measured at 1,000
/// and 2,000 columns), and the packing buffers its matrix products keep
/// for the thread (4 MiB, from the first call on). The QL code's: a
/// copy of the matrix and the vectors.
pub fn eigh_bytes(n: usize) -> u64 {
    let m = n as u64;
    if n < FAER_FROM {
        (2 * m * m + 8 * m) * 8
    } else {
        (4 * m * m + 80 * m) * 8 + (4 << 20)
    }
}

/// Puts row `order[i]` of the `rows x n` matrix `m` at row `i`, in place
/// (one row of scratch).
fn permute_rows(m: &mut [f64], n: usize, order: &[usize]) {
    let mut done = vec![false; order.len()];
    let mut row = vec![0.0; n];
    for start in 0..order.len() {
        if done[start] || order[start] == start {
            done[start] = true;
            continue;
        }
        // The cycle start <- order[start] <- order[order[start]] ...
        row.copy_from_slice(&m[start * n..(start + 1) * n]);
        let mut i = start;
        loop {
            done[i] = true;
            let from = order[i];
            if from == start {
                m[i * n..(i + 1) * n].copy_from_slice(&row);
                break;
            }
            m.copy_within(from * n..(from + 1) * n, i * n);
            i = from;
        }
    }
}

/// [`eigh`] by Householder reduction to tridiagonal form and the
/// implicit QL method.
fn eigh_ql(a: &[f64], n: usize) -> Option<(Vec<f64>, Vec<f64>)> {
    if n == 0 {
        return Some((Vec::new(), Vec::new()));
    }
    let mut v = a.to_vec();
    let mut d = vec![0.0; n];
    let mut e = vec![0.0; n];
    // The reduction works on the transpose (the same matrix), so that its
    // inner loops run along rows, and leaves V^T, whose rows the QL sweeps
    // rotate, each contiguous.
    tridiagonalize(&mut v, n, &mut d, &mut e);
    let mut vt = v;
    diagonalize(&mut vt, n, &mut d, &mut e)?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| d[j].total_cmp(&d[i]).then(i.cmp(&j)));
    let values = order.iter().map(|&i| d[i]).collect();
    let mut vectors = Vec::with_capacity(n * n);
    for &i in &order {
        vectors.extend_from_slice(&vt[i * n..(i + 1) * n]);
    }
    Some((values, vectors))
}

/// Householder reduction of the symmetric matrix `v` to tridiagonal form:
/// on return `d` holds the diagonal, `e[1..]` the subdiagonal and `v` the
/// orthogonal transformation, transposed (its rows). Every index of the
/// textbook algorithm is transposed, so the inner loops run along rows.
#[allow(clippy::many_single_char_names)]
fn tridiagonalize(v: &mut [f64], n: usize, d: &mut [f64], e: &mut [f64]) {
    for (j, x) in d.iter_mut().enumerate() {
        *x = v[j * n + n - 1];
    }
    for i in (1..n).rev() {
        let scale: f64 = d[..i].iter().map(|x| x.abs()).sum();
        let mut h = 0.0;
        if scale == 0.0 {
            e[i] = d[i - 1];
            for j in 0..i {
                d[j] = v[j * n + i - 1];
                v[j * n + i] = 0.0;
                v[i * n + j] = 0.0;
            }
        } else {
            for x in &mut d[..i] {
                *x /= scale;
                h += *x * *x;
            }
            let f = d[i - 1];
            let g = if f > 0.0 { -h.sqrt() } else { h.sqrt() };
            e[i] = scale * g;
            h -= f * g;
            d[i - 1] = f - g;
            e[..i].fill(0.0);
            for j in 0..i {
                let f = d[j];
                v[i * n + j] = f;
                let mut g = e[j] + v[j * n + j] * f;
                for k in j + 1..i {
                    g += v[j * n + k] * d[k];
                    e[k] += v[j * n + k] * f;
                }
                e[j] = g;
            }
            let mut f = 0.0;
            for j in 0..i {
                e[j] /= h;
                f += e[j] * d[j];
            }
            let hh = f / (h + h);
            for j in 0..i {
                e[j] -= hh * d[j];
            }
            for j in 0..i {
                let (f, g) = (d[j], e[j]);
                for k in j..i {
                    v[j * n + k] -= f * e[k] + g * d[k];
                }
                d[j] = v[j * n + i - 1];
                v[j * n + i] = 0.0;
            }
        }
        d[i] = h;
    }
    accumulate(v, n, d);
    e[0] = 0.0;
}

/// The second half of [`tridiagonalize`]: the transformations multiplied
/// out into `v`, and the diagonal into `d`.
fn accumulate(v: &mut [f64], n: usize, d: &mut [f64]) {
    for i in 0..n - 1 {
        v[i * n + n - 1] = v[i * n + i];
        v[i * n + i] = 1.0;
        let h = d[i + 1];
        if h != 0.0 {
            for k in 0..=i {
                d[k] = v[(i + 1) * n + k] / h;
            }
            for j in 0..=i {
                let mut g = 0.0;
                for k in 0..=i {
                    g += v[(i + 1) * n + k] * v[j * n + k];
                }
                for k in 0..=i {
                    v[j * n + k] -= g * d[k];
                }
            }
        }
        for k in 0..=i {
            v[(i + 1) * n + k] = 0.0;
        }
    }
    for j in 0..n {
        d[j] = v[j * n + n - 1];
        v[j * n + n - 1] = 0.0;
    }
    v[(n - 1) * n + n - 1] = 1.0;
}

/// The implicit QL method on the tridiagonal matrix (`d`, `e`) from
/// [`tridiagonalize`], rotating the rows of `vt` (its transformation,
/// transposed): on return `d` holds the eigenvalues and row `i` of `vt`
/// the eigenvector of `d[i]`. `None` after 100 iterations on one value.
#[allow(clippy::many_single_char_names)]
fn diagonalize(vt: &mut [f64], n: usize, d: &mut [f64], e: &mut [f64]) -> Option<()> {
    for i in 1..n {
        e[i - 1] = e[i];
    }
    e[n - 1] = 0.0;
    let mut f = 0.0;
    let mut tst1: f64 = 0.0;
    let eps = f64::EPSILON;
    for l in 0..n {
        tst1 = tst1.max(d[l].abs() + e[l].abs());
        let mut m = l;
        while m < n - 1 && e[m].abs() > eps * tst1 {
            m += 1;
        }
        let mut iterations = 0;
        while m > l && e[l].abs() > eps * tst1 {
            iterations += 1;
            if iterations > 100 {
                return None;
            }
            let g = d[l];
            let p = (d[l + 1] - g) / (2.0 * e[l]);
            let r = if p < 0.0 { -p.hypot(1.0) } else { p.hypot(1.0) };
            d[l] = e[l] / (p + r);
            d[l + 1] = e[l] * (p + r);
            let dl1 = d[l + 1];
            let h = g - d[l];
            for x in &mut d[l + 2..n] {
                *x -= h;
            }
            f += h;
            let mut p = d[m];
            let (mut c, mut c2, mut c3) = (1.0, 1.0, 1.0);
            let el1 = e[l + 1];
            let (mut s, mut s2) = (0.0, 0.0);
            for i in (l..m).rev() {
                c3 = c2;
                c2 = c;
                s2 = s;
                let g = c * e[i];
                let h = c * p;
                let r = p.hypot(e[i]);
                e[i + 1] = s * r;
                s = e[i] / r;
                c = p / r;
                p = c * d[i] - s * g;
                d[i + 1] = h + s * (c * g + s * d[i]);
                let (lo, hi) = vt.split_at_mut((i + 1) * n);
                let (a, b) = (&mut lo[i * n..], &mut hi[..n]);
                for (x, y) in a.iter_mut().zip(b.iter_mut()) {
                    let h = *y;
                    *y = s * *x + c * h;
                    *x = c * *x - s * h;
                }
            }
            let p = -s * s2 * c3 * el1 * e[l] / dl1;
            e[l] = s * p;
            d[l] = c * p;
        }
        d[l] += f;
        e[l] = 0.0;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symmetric matrix from a fixed pseudo-random sequence.
    fn symmetric(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) - 0.5
        };
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let v = next();
                a[i * n + j] = v;
                a[j * n + i] = v;
            }
        }
        a
    }

    #[test]
    fn eigh_gives_orthonormal_vectors_that_diagonalise_the_matrix() {
        for (n, seed) in [(1, 1), (2, 2), (5, 3), (40, 4), (97, 5), (300, 6)] {
            let a = symmetric(n, seed);
            let (vals, vecs) = eigh(&a, n).expect("converges");
            for w in vals.windows(2) {
                assert!(w[0] >= w[1], "descending");
            }
            for i in 0..n {
                let v = &vecs[i * n..(i + 1) * n];
                for r in 0..n {
                    let av: f64 = (0..n).map(|c| a[r * n + c] * v[c]).sum();
                    assert!((av - vals[i] * v[r]).abs() < 1e-10, "A v = lambda v");
                }
                for j in 0..n {
                    let dot: f64 = (0..n).map(|c| v[c] * vecs[j * n + c]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-10, "orthonormal");
                }
            }
        }
    }

    #[test]
    fn eigh_finds_repeated_and_zero_eigenvalues() {
        // diag(3, 0, 3, -1) in a rotated basis would do; the diagonal is the
        // degenerate case of the reduction (every scale 0).
        let a = [
            3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, -1.0,
        ];
        let (vals, _) = eigh(&a, 4).expect("converges");
        assert_eq!(vals, vec![3.0, 3.0, 0.0, -1.0]);
    }

    #[test]
    fn both_solvers_agree_up_to_each_vectors_sign() {
        for n in [3, 20, FAER_FROM + 7] {
            let a = symmetric(n, 11);
            let (v1, u1) = eigh_ql(&a, n).expect("converges");
            let (v2, u2) = eigh_faer(&a, n).expect("converges");
            for i in 0..n {
                assert!((v1[i] - v2[i]).abs() < 1e-10, "value {i}");
                let (x, y) = (&u1[i * n..(i + 1) * n], &u2[i * n..(i + 1) * n]);
                let dot: f64 = x.iter().zip(y).map(|(p, q)| p * q).sum();
                assert!((dot.abs() - 1.0).abs() < 1e-9, "vector {i}: {dot}");
            }
        }
        assert!(eigh_bytes(FAER_FROM) > eigh_bytes(FAER_FROM - 1));
    }

    #[test]
    fn both_choleskys_agree_and_refuse_a_singular_matrix() {
        let n = FAER_FROM + 5;
        // A^T A + I: positive definite.
        let r = symmetric(n, 3);
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (0..n).map(|k| r[k * n + i] * r[k * n + j]).sum::<f64>();
            }
            a[i * n + i] += 1.0;
        }
        let (l1, l2) = (
            cholesky_loops(&a, n, 0.0).unwrap(),
            cholesky(&a, n, 0.0).unwrap(),
        );
        assert!(l1.iter().zip(&l2).all(|(x, y)| (x - y).abs() < 1e-9));
        assert!(
            (0..n).all(|i| (i + 1..n).all(|j| l2[i * n + j] == 0.0)),
            "lower"
        );
        // Rank one: singular.
        let v: Vec<f64> = (0..n).map(|i| i as f64 + 1.0).collect();
        let s: Vec<f64> = (0..n * n).map(|k| v[k / n] * v[k % n]).collect();
        assert!(cholesky(&s, n, 1e-9).is_none());
    }

    #[test]
    fn rows_are_permuted_in_place_along_every_cycle() {
        let order = [3, 0, 4, 1, 2, 5, 7, 6];
        let mut m: Vec<f64> = (0..8 * 3).map(|v| v as f64).collect();
        permute_rows(&mut m, 3, &order);
        for (i, &o) in order.iter().enumerate() {
            assert_eq!(
                m[i * 3..i * 3 + 3],
                [3.0 * o as f64, 3.0 * o as f64 + 1.0, 3.0 * o as f64 + 2.0]
            );
        }
    }

    #[test]
    fn eigh_refuses_a_nan_and_repeats_its_bytes() {
        let mut a = symmetric(20, 7);
        assert_eq!(eigh(&a, 20), eigh(&a, 20));
        a[3 * 20 + 5] = f64::NAN;
        a[5 * 20 + 3] = f64::NAN;
        assert_eq!(eigh(&a, 20), None);
    }

    #[test]
    fn cholesky_solves_and_refuses_a_singular_matrix() {
        let a = [4.0, 2.0, 2.0, 3.0];
        let l = cholesky(&a, 2, 0.0).expect("positive definite");
        let mut b = [2.0, 1.0];
        cholesky_solve(&l, 2, &mut b);
        assert!((4.0 * b[0] + 2.0 * b[1] - 2.0).abs() < 1e-12);
        assert!((2.0 * b[0] + 3.0 * b[1] - 1.0).abs() < 1e-12);
        assert!(cholesky(&[1.0, 1.0, 1.0, 1.0], 2, 1e-12).is_none());
    }

    #[test]
    fn the_gram_matrix_is_weighted_and_blocked_like_a_plain_sum() {
        let cols = 3;
        let rows = 600;
        let z: Vec<f64> = (0..rows * cols)
            .map(|i| ((i * 37) % 11) as f64 - 5.0)
            .collect();
        let w: Vec<f64> = (0..rows).map(|i| (i % 3) as f64 + 0.5).collect();
        let mut g = vec![0.0; cols * cols];
        add_gram(&z, cols, &w, &mut g);
        for a in 0..cols {
            for b in 0..cols {
                let want: f64 = (0..rows)
                    .map(|i| w[i] * z[i * cols + a] * z[i * cols + b])
                    .sum();
                assert!((g[a * cols + b] - want).abs() < 1e-9);
            }
        }
    }
}
