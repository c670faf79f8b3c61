//! A task's work: the nearest centre of each of its rows, and what the
//! step needs of them (per-centre sums and weights, the inertia, labels,
//! distances, column statistics); the sweep that runs the tasks and folds
//! their results in order.

use std::sync::Arc;
use std::time::Instant;

use outcore::Runtime;

use super::plan::Chunk;
use super::{kernel, Centers, Dataset, Partition};
use crate::error::Result;
use crate::zeros;

/// What one task returns.
#[derive(Clone, Debug, Default)]
pub(super) struct Partial {
    /// Per-cluster sums of the assigned points (`k x dims`), when asked.
    pub(super) sums: Vec<f64>,
    /// Points assigned to each cluster.
    pub(super) counts: Vec<u64>,
    /// Sum of squared distances to the assigned centres.
    pub(super) inertia: f64,
    /// The label of each row, when asked.
    pub(super) labels: Vec<u32>,
    /// The squared distance of each row to its centre, when asked.
    pub(super) dists: Vec<f32>,
    /// Weight assigned to each cluster: the points' sample weights, or
    /// their count when the data has none.
    pub(super) wsum: Vec<f64>,
    /// When asked: per-column sums of `x - reference` and of its square,
    /// for the data's per-feature variance.
    pub(super) colsum: Vec<f64>,
    pub(super) colsq: Vec<f64>,
    /// Seconds the task spent finding the nearest centres (the distance
    /// kernel), on its thread.
    pub(super) kernel_seconds: f64,
}

/// What a task computes besides counts and inertia.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Want {
    /// Per-cluster sums of the assigned points.
    pub(super) sums: bool,
    /// The label of each row.
    pub(super) labels: bool,
    /// The squared distance of each row to its centre.
    pub(super) dists: bool,
}

/// Rows per GEMM block (keeps the distance block small for large k).
const BLOCK: usize = 256;

/// Asks the CPU to bring `x` into its caches (a hint: no effect on the
/// results; nothing on CPUs without the instruction).
fn prefetch(x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in x.chunks(16) {
        // SAFETY: a prefetch reads nothing the program can observe and
        // cannot fault; the address is inside `x` anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// `s += x`, in f64, or `s += w x` with a weight: each element its own
/// sum (a rounded product, then a rounded addition: never fused), so the
/// bits are the same whatever the vector width. With the widest vectors
/// the CPU has (the portable build's are two lanes wide).
fn add_row(s: &mut [f64], x: &[f32], w: Option<f64>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { add_row_avx512(s, x, w) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { add_row_avx2(s, x, w) };
        }
    }
    add_row_lanes(s, x, w);
}

/// Appends `0.0 + x`, or `0.0 + w x` with a weight, to `s`: the values
/// [`add_row`] leaves in a slice of zeros, bit for bit.
fn first_row(s: &mut Vec<f64>, x: &[f32], w: Option<f64>) {
    match w {
        None => s.extend(x.iter().map(|&v| 0.0 + f64::from(v))),
        Some(w) => s.extend(x.iter().map(|&v| 0.0 + w * f64::from(v))),
    }
}

/// [`add_row`]'s arithmetic, compiled for whichever instructions its
/// caller enables.
#[inline(always)]
fn add_row_lanes(s: &mut [f64], x: &[f32], w: Option<f64>) {
    match w {
        None => {
            for (acc, &v) in s.iter_mut().zip(x) {
                *acc += f64::from(v);
            }
        }
        Some(w) => {
            for (acc, &v) in s.iter_mut().zip(x) {
                *acc += w * f64::from(v);
            }
        }
    }
}

/// [`add_row`] over 512-bit vectors.
///
/// # Safety
///
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_row_avx512(s: &mut [f64], x: &[f32], w: Option<f64>) {
    add_row_lanes(s, x, w);
}

/// [`add_row`] over 256-bit vectors.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_row_avx2(s: &mut [f64], x: &[f32], w: Option<f64>) {
    add_row_lanes(s, x, w);
}

/// The nearest centre of each row of `x` (and the squared distance to it)
/// through matrixmultiply's `sgemm` into `g` (at least `n * k` floats),
/// for CPUs without the fused kernel.
fn gemm_nearest(
    x: &[f32],
    xn: &[f32],
    c: &Centers,
    g: &mut [f32],
    best: &mut [u32],
    best_d: &mut [f32],
) {
    let (n, d, k) = (best.len(), c.dims, c.k);
    assert!(x.len() >= n * d && g.len() >= n * k && xn.len() >= n && best_d.len() >= n);
    // G = X (n x d) . C^T (d x k)
    // SAFETY:
    // - `x` holds n*d floats, row stride d, column stride 1;
    // - C^T is read from `c.values` (k*d floats) with row stride 1 and
    //   column stride d, so element (j, c) is values[c*d + j];
    // - `g` holds at least n*k floats, row stride k, column stride 1;
    // - beta = 0, so g's prior contents are not read; no aliasing.
    unsafe {
        matrixmultiply::sgemm(
            n,
            d,
            k,
            1.0,
            x.as_ptr(),
            d as isize,
            1,
            c.values.as_ptr(),
            1,
            d as isize,
            0.0,
            g.as_mut_ptr(),
            k as isize,
            1,
        );
    }
    for i in 0..n {
        (best[i], best_d[i]) = kernel::argmin(xn[i], &g[i * k..(i + 1) * k], &c.norms);
    }
}

/// Assigns rows `start..start + len` of `p` to their nearest centres.
///
/// With sample weights (the partition holds them), sums, inertia and
/// cluster weights are weighted; without, the arithmetic is the unweighted
/// one. `reference`, when given, asks for column statistics around it.
pub(super) fn assign(
    p: &Partition,
    start: usize,
    len: usize,
    c: &Centers,
    want: Want,
    reference: Option<&[f32]>,
) -> Partial {
    let (mut out, nearest) = assign_rows(p, start, len, c, want, reference);
    if want.sums {
        let rows = &p.values()[start * c.dims..(start + len) * c.dims];
        out.sums = centre_sums(
            rows,
            c.dims,
            &nearest,
            &out.counts,
            weights_of(p, start, len),
        );
    }
    out
}

/// The sample weights of rows `start..start + len` of `p`, if it has any.
pub(super) fn weights_of(p: &Partition, start: usize, len: usize) -> Option<&[f32]> {
    (!p.weights.is_empty()).then(|| &p.weights[start..start + len])
}

/// [`assign`] without the per-centre sums, and each row's nearest centre.
pub(super) fn assign_rows(
    p: &Partition,
    start: usize,
    len: usize,
    c: &Centers,
    want: Want,
    reference: Option<&[f32]>,
) -> (Partial, Vec<u32>) {
    let d = c.dims;
    let mut out = Partial::default();
    if let Some(r) = reference {
        (out.colsum, out.colsq) = column_sums(p, start, len, r, d);
    }
    // The nearest centre of every row first, then what the step wants of
    // them.
    let rows = &p.values()[start * d..(start + len) * d];
    let kernel = Instant::now();
    let (nearest, nearest_d) = nearest(rows, &p.norms[start..start + len], c);
    out.kernel_seconds = kernel.elapsed().as_secs_f64();
    out.tally(&nearest, &nearest_d, weights_of(p, start, len), c.k, want);
    (out, nearest)
}

/// Per-column sums of `x - r` and of its square over rows
/// `start..start + len` of `p` (`d` columns), in f64.
fn column_sums(
    p: &Partition,
    start: usize,
    len: usize,
    r: &[f32],
    d: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut s1, mut s2) = (zeros::<f64>(d), zeros::<f64>(d));
    for i in start..start + len {
        for ((a, b), (&v, &m)) in s1.iter_mut().zip(s2.iter_mut()).zip(p.row(i).iter().zip(r)) {
            let t = f64::from(v) - f64::from(m);
            *a += t;
            *b += t * t;
        }
    }
    (s1, s2)
}

/// The nearest centre of each row of `rows` (norms `xn`) and the squared
/// distance to it. The fused kernel takes all the rows at once, so the
/// centres stay in the level-2 cache until every distance is known; the
/// GEMM path goes by blocks of rows, to keep its n x k matrix small.
fn nearest(rows: &[f32], xn: &[f32], c: &Centers) -> (Vec<u32>, Vec<f32>) {
    let len = xn.len();
    let (mut nearest, mut nearest_d) = (vec![0u32; len], vec![0f32; len]);
    nearest_into(rows, xn, c, &mut nearest, &mut nearest_d);
    (nearest, nearest_d)
}

/// [`nearest`] into `best` and `best_d` (one per row of `rows`).
fn nearest_into(rows: &[f32], xn: &[f32], c: &Centers, best: &mut [u32], best_d: &mut [f32]) {
    let (len, d, k) = (xn.len(), c.dims, c.k);
    match &c.packed {
        Some(packed) => packed.nearest(rows, xn, best, best_d),
        None => {
            let mut g = zeros::<f32>(BLOCK.min(len.max(1)) * k);
            for r in (0..len).step_by(BLOCK) {
                let n = BLOCK.min(len - r);
                gemm_nearest(
                    &rows[r * d..(r + n) * d],
                    &xn[r..r + n],
                    c,
                    &mut g,
                    &mut best[r..r + n],
                    &mut best_d[r..r + n],
                );
            }
        }
    }
}

/// Each row of `rows` (`c.dims` columns) labelled as a fit labels it: its
/// squared norm into `xn`, its nearest centre into `best` and the squared
/// distance to it (`|x|^2 - 2 x.c + |c|^2`, not clamped) into `best_d`.
pub(crate) fn label_rows(
    rows: &[f32],
    c: &Centers,
    xn: &mut Vec<f32>,
    best: &mut [u32],
    best_d: &mut [f32],
) {
    xn.clear();
    xn.extend(rows.chunks_exact(c.dims.max(1)).map(super::data::norm2));
    nearest_into(rows, xn, c, best, best_d);
}

impl Partial {
    /// Counts, inertia and cluster weights of rows assigned to `nearest`
    /// at squared distances `nearest_d` (weighted by `weights`, one per
    /// row, when given), and the labels and distances when `want`ed.
    fn tally(
        &mut self,
        nearest: &[u32],
        nearest_d: &[f32],
        weights: Option<&[f32]>,
        k: usize,
        want: Want,
    ) {
        let len = nearest.len();
        self.counts = vec![0; k];
        if want.labels {
            self.labels = Vec::with_capacity(len);
        }
        if want.dists {
            self.dists = Vec::with_capacity(len);
        }
        let mut wsum = vec![0f64; if weights.is_some() { k } else { 0 }];
        for (i, (&best, &best_d)) in nearest.iter().zip(nearest_d).enumerate() {
            let best = best as usize;
            self.counts[best] += 1;
            match weights.map(|w| f64::from(w[i])) {
                None => self.inertia += f64::from(best_d.max(0.0)),
                Some(w) => {
                    wsum[best] += w;
                    self.inertia += w * f64::from(best_d.max(0.0));
                }
            }
            if want.labels {
                self.labels.push(best as u32);
            }
            if want.dists {
                self.dists.push(best_d.max(0.0));
            }
        }
        self.wsum = match weights {
            Some(_) => wsum,
            None => self.counts.iter().map(|&n| n as f64).collect(),
        };
    }
}

/// The row indices sorted by their centre (`counts[j]` rows for centre
/// `j`), each centre's in row order.
fn by_centre(nearest: &[u32], counts: &[u64]) -> Vec<u32> {
    let mut first = vec![0usize; counts.len() + 1];
    for &b in nearest {
        first[b as usize + 1] += 1;
    }
    for j in 0..counts.len() {
        first[j + 1] += first[j];
    }
    let mut order = vec![0u32; nearest.len()];
    for (i, &b) in nearest.iter().enumerate() {
        order[first[b as usize]] = i as u32;
        first[b as usize] += 1;
    }
    order
}

/// Per-centre sums (`k x d`) of `rows` (weighted by `weights`, one per
/// row, when given), the rows assigned to `nearest`, `counts[j]` of them
/// to centre `j`: [`add_centre_sums`] to zeros (each centre's sum starts
/// at +0.0, so adding it to a zero leaves its bits).
pub(super) fn centre_sums(
    rows: &[f32],
    d: usize,
    nearest: &[u32],
    counts: &[u64],
    weights: Option<&[f32]>,
) -> Vec<f64> {
    let mut sums = zeros::<f64>(counts.len() * d);
    add_centre_sums(&mut sums, rows, d, nearest, counts, weights);
    sums
}

/// Adds the per-centre sums of `rows` (weighted by `weights`, one per
/// row, when given), the rows assigned to `nearest`, `counts[j]` of them
/// to centre `j`, to `acc` (`k x d`), without making all of them at once.
///
/// Centre by centre, each centre's rows in row order: its sum is made in
/// a `d`-value scratch (its first row written as `0.0 + x`, the bits of
/// adding it to a zero, a -0.0 included), which stays in the level-1
/// cache while its rows are added, and then added to `acc`. The bits are
/// those of adding the whole `k x d` sums: a centre with no rows would
/// add zeros, and adding +0.0 leaves any sum that started at +0.0
/// unchanged (only -0.0 + -0.0 is -0.0).
pub(super) fn add_centre_sums(
    acc: &mut [f64],
    rows: &[f32],
    d: usize,
    nearest: &[u32],
    counts: &[u64],
    weights: Option<&[f32]>,
) {
    let order = by_centre(nearest, counts);
    let weight = |i: usize| weights.map(|w| f64::from(w[i]));
    let mut scratch = Vec::with_capacity(d);
    let mut o = 0;
    for (j, &n) in counts.iter().enumerate() {
        let n = n as usize;
        if n == 0 {
            continue;
        }
        scratch.clear();
        for (m, &i) in order[o..o + n].iter().enumerate() {
            let i = i as usize;
            if let Some(&next) = order.get(o + m + 1) {
                prefetch(&rows[next as usize * d..(next as usize + 1) * d]);
            }
            let x = &rows[i * d..(i + 1) * d];
            if m == 0 {
                first_row(&mut scratch, x, weight(i));
            } else {
                add_row(&mut scratch, x, weight(i));
            }
        }
        add(&mut acc[j * d..(j + 1) * d], &scratch);
        o += n;
    }
}

/// The layout of a step's sums in one vector: per-cluster sums (`k x d`),
/// cluster weights (`k`), the inertia, and with `stats` the column sums
/// and sums of squares (`d` each).
#[derive(Clone, Copy)]
pub(super) struct Packed {
    pub(super) k: usize,
    pub(super) d: usize,
    pub(super) stats: bool,
}

impl Packed {
    pub(super) fn len(self) -> usize {
        self.k * self.d + self.k + 1 + if self.stats { 2 * self.d } else { 0 }
    }

    /// Adds a task's partial results to `acc`.
    pub(super) fn fold(self, acc: &mut [f64], p: &Partial) {
        add(&mut acc[..self.k * self.d], &p.sums);
        self.fold_small(acc, p);
    }

    /// Adds a task's partial results but the per-centre sums to `acc`.
    pub(super) fn fold_small(self, acc: &mut [f64], p: &Partial) {
        let (k, d) = (self.k, self.d);
        add(&mut acc[k * d..k * d + k], &p.wsum);
        acc[k * d + k] += p.inertia;
        if self.stats {
            let at = k * d + k + 1;
            add(&mut acc[at..at + d], &p.colsum);
            add(&mut acc[at + d..at + 2 * d], &p.colsq);
        }
    }

    pub(super) fn unpack(self, mut v: Vec<f64>) -> Reduced {
        let (k, d) = (self.k, self.d);
        let at = k * d + k + 1;
        let (colsum, colsq) = if self.stats {
            (v[at..at + d].to_vec(), v[at + d..at + 2 * d].to_vec())
        } else {
            (Vec::new(), Vec::new())
        };
        let inertia = v[k * d + k];
        let wsum = v[k * d..k * d + k].to_vec();
        v.truncate(k * d);
        Reduced {
            sums: v,
            wsum,
            inertia,
            colsum,
            colsq,
        }
    }
}

/// A step's sums.
pub(super) struct Reduced {
    pub(super) sums: Vec<f64>,
    pub(super) wsum: Vec<f64>,
    pub(super) inertia: f64,
    pub(super) colsum: Vec<f64>,
    pub(super) colsq: Vec<f64>,
}

/// `a += b`, element by element.
pub(super) fn add(a: &mut [f64], b: &[f64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Runs `plan`'s chunks as one batch and hands each chunk's partial
/// results to `each` (with the chunk's index in `plan`) in plan order, as
/// they come: only the results that finish ahead of an earlier chunk are
/// held, so a whole sweep can be one batch (no barrier every few tasks)
/// with a fold whose order does not depend on the scheduling. Every chunk
/// runs; the first error is returned.
pub(super) fn sweep(
    rt: &Runtime,
    ds: &Dataset,
    plan: &[Chunk],
    c: &Arc<Centers>,
    want: Want,
    reference: Option<&Arc<Vec<f32>>>,
    each: impl FnMut(usize, Partial) -> Result<()>,
) -> Result<()> {
    let mut b = rt.batch();
    for ch in plan {
        let c = c.clone();
        let ch = *ch;
        let reference = reference.cloned();
        b.read_shared(&ds.parts[ch.part], move |p: &Partition| {
            assign(
                p,
                ch.start,
                ch.len,
                &c,
                want,
                reference.as_deref().map(Vec::as_slice),
            )
        });
    }
    crate::fold_in_order(b, each)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's per-centre sums are, bit for bit, its rows added one by
    /// one in row order to a zero: for a centre whose only row is -0.0
    /// (0.0 + -0.0 is +0.0), for a centre with no rows, and with weights.
    #[test]
    fn a_tasks_sums_are_its_rows_added_to_zeros_in_row_order() {
        let (d, n) = (37, 300);
        let mut z = 0x9e37_79b9_u32;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            z as f32 / u32::MAX as f32
        };
        // Centre 0 at the origin, centre 1 far from every row, the rest
        // among the rows (values in 5..6).
        let k = 9;
        let mut centres = vec![0f32; d];
        centres.extend(std::iter::repeat_n(1000.0, d));
        centres.extend((0..(k - 2) * d).map(|_| 5.0 + next()));
        let mut x: Vec<f32> = (0..n * d).map(|_| 5.0 + next()).collect();
        // Row 17 is -0.0 everywhere: centre 0's only row.
        x[17 * d..18 * d].fill(-0.0);
        let weights: Vec<f32> = (0..n).map(|_| 0.5 + next()).collect();
        let c = Centers::new(k, d, centres);
        let want = Want {
            sums: true,
            labels: true,
            dists: false,
        };
        for weighted in [false, true] {
            let p = if weighted {
                Partition::with_weights(0, d, x.clone(), weights.clone())
            } else {
                Partition::new(0, d, x.clone())
            };
            let (start, len) = (3, n - 5);
            let out = assign(&p, start, len, &c, want, None);
            let mut reference = vec![0f64; k * d];
            for (r, &label) in out.labels.iter().enumerate() {
                let i = start + r;
                let s = &mut reference[label as usize * d..(label as usize + 1) * d];
                for (acc, &v) in s.iter_mut().zip(&x[i * d..(i + 1) * d]) {
                    *acc += if weighted {
                        f64::from(weights[i]) * f64::from(v)
                    } else {
                        f64::from(v)
                    };
                }
            }
            assert_eq!(out.counts[0], 1, "row 17 alone is nearest the origin");
            assert_eq!(out.counts[1], 0, "no row is nearest centre 1");
            assert_eq!(out.sums.len(), k * d);
            for (j, (a, b)) in out.sums.iter().zip(&reference).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "weighted {weighted}: centre {}, column {}: {a} against {b}",
                    j / d,
                    j % d
                );
            }
        }
    }

    /// The fused kernel finds the centre the GEMM path finds, at the same
    /// distance to float rounding, for every shape around its tile and
    /// block sizes, ties going to the lowest index.
    #[test]
    fn the_fused_kernel_agrees_with_the_gemm_path() {
        let mut z = 0x2545_f491_u32;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            (z as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let mut checked = 0;
        for &(n, d, k) in &[
            (1, 1, 1),
            (7, 3, 2),
            (13, 257, 8),
            (49, 300, 9),
            (50, 513, 17),
            (97, 64, 24),
            (100, 1000, 100),
            (6, 5, 33),
        ] {
            let x: Vec<f32> = (0..n * d).map(|_| next()).collect();
            let mut values: Vec<f32> = (0..k * d).map(|_| next()).collect();
            if k > 3 {
                // Centre 3 repeats centre 1: ties must go to 1.
                let (a, b) = values.split_at_mut(3 * d);
                b[..d].copy_from_slice(&a[d..2 * d]);
            }
            let c = Centers::new(k, d, values);
            let Some(packed) = &c.packed else {
                eprintln!("this CPU has no AVX2 and FMA: the fused kernel is not used");
                return;
            };
            let xn: Vec<f32> = x
                .chunks_exact(d)
                .map(|r| r.iter().map(|v| v * v).sum())
                .collect();
            let (mut b1, mut d1) = (vec![0u32; n], vec![0f32; n]);
            let (mut b2, mut d2) = (vec![0u32; n], vec![0f32; n]);
            let mut g = vec![0f32; n * k];
            gemm_nearest(&x, &xn, &c, &mut g, &mut b1, &mut d1);
            packed.nearest(&x, &xn, &mut b2, &mut d2);
            for i in 0..n {
                let row = &x[i * d..(i + 1) * d];
                let exact = |j: u32| -> f64 {
                    row.iter()
                        .zip(c.row(j as usize))
                        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                        .sum()
                };
                let scale = 1e-5 * (f64::from(xn[i]) + 1.0);
                assert!(
                    (f64::from(d2[i]) - exact(b2[i])).abs() <= scale,
                    "{n} {d} {k} row {i}"
                );
                assert!(
                    (f64::from(d1[i]) - f64::from(d2[i])).abs() <= scale,
                    "{n} {d} {k} row {i}"
                );
                if b1[i] != b2[i] {
                    // Only a near tie may go either way.
                    assert!(
                        (exact(b1[i]) - exact(b2[i])).abs() <= scale,
                        "{n} {d} {k} row {i}"
                    );
                }
                assert_ne!(b2[i], 3, "the tie goes to the lower index");
                checked += 1;
            }
        }
        assert!(checked > 300);
    }

    #[test]
    fn row_sums_bits_do_not_depend_on_the_vector_width() {
        let mut z = 0x9e37_79b9_u32;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            (z as f32 / u32::MAX as f32) * 2e3 - 1e3
        };
        for d in [1, 7, 8, 9, 31, 1000] {
            let rows: Vec<f32> = (0..20 * d).map(|_| next()).collect();
            for w in [None, Some(0.3), Some(1.0 / 3.0)] {
                let (mut a, mut b) = (vec![0.1f64; d], vec![0.1f64; d]);
                for x in rows.chunks_exact(d) {
                    add_row(&mut a, x, w);
                    for (acc, &v) in b.iter_mut().zip(x) {
                        *acc += w.map_or(f64::from(v), |w| w * f64::from(v));
                    }
                }
                let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "d = {d}, weight {w:?}");
            }
        }
    }
}
