//! The distance step fused with the argmin, for CPUs with AVX2 and FMA
//! (and AVX-512F, where present).
//!
//! For a block of rows `x` (row-major, `d` columns) and the centres, each
//! row's nearest centre is `argmin_c |x|^2 - 2 x.c + |c|^2`, the same
//! expression as the GEMM path, evaluated without writing the `n x k`
//! matrix of dot products anywhere: a 6-row by 16-centre tile of dot
//! products is accumulated in twelve registers over all `d` columns, then
//! turned into distances and compared on the spot.
//!
//! The centres are packed once per set of centres ([`Panels::new_in`]) into
//! panels of 16 (the last one 8 when at most 8 remain): within a panel,
//! column `p` of the 16 centres is 16 consecutive floats, one cache line,
//! so the kernel streams a panel with two vector loads per column and
//! broadcasts one value of each of the six rows against them. The columns
//! are taken in blocks of [`KC`], so one block of a panel (16 KiB) and of
//! the six rows stay in the level-1 cache while the panels go by; the
//! partial dot products of a block of rows wait between column blocks in
//! a small buffer.
//!
//! Where the CPU has AVX-512F, full panels go two at a time through a
//! tile of 12 rows by 32 centres (24 of the 32 512-bit registers
//! accumulate), and a lone full panel through one 512-bit register per
//! row. A half panel (and, with AVX-512, a lone full one) takes twelve
//! rows at a time, so that twelve independent sums are in flight. A Lloyd iteration over 512 MiB, k = 100, on the machine these
//! jobs are measured on: 0.201-0.210 s with the AVX2 tile, 0.187-0.189 s
//! with one 512-bit register per row, 0.152-0.157 s with the 12 x 32 tile.
//!
//! Each dot product adds its `d` terms in column order, one fused
//! multiply-add at a time, whatever the blocks and the register width, so
//! the results depend on the data only (the AVX-512 tile gives the AVX2
//! tile's bits, tested): the same with and without a cap, for any
//! partitioning, any thread. CPUs without FMA take the GEMM path.

use std::ops::Range;

/// Centres per full panel.
const W: usize = 16;

/// Rows per tile.
const MR: usize = 6;

/// Rows per paired AVX-512 tile (24 of the 32 registers accumulate).
const MR2: usize = 12;

/// Rows per AVX-512 tile of two full panels and the last, half panel (24
/// of the 32 registers accumulate).
const MR3: usize = 8;

/// Columns per block.
const KC: usize = 256;

/// Rows per block of rows that shares a column block's pass over the
/// panels (a multiple of [`MR`], [`MR2`] and [`MR3`]), for `k` centres
/// of `d` columns.
///
/// Every block of rows streams all the panels once. Centres that stay in
/// the level-2 cache (up to 1 MiB) cost little to stream again: 48 rows.
/// Larger ones come from the level-3 cache or memory every time, so a
/// block takes eight times as many rows, whose partial dot products then
/// outgrow the level-2 cache themselves, a smaller cost: at 10,000-D,
/// k = 1000 (40 MB of centres), a Lloyd iteration went from 1.71 s to
/// 1.32 s (the kernel from 68% to 92% of the FMA peak), while at 128-D,
/// k = 32 the large block was a third slower.
fn row_block(k: usize, d: usize) -> usize {
    if k.saturating_mul(d).saturating_mul(4) <= 1 << 20 {
        8 * MR
    } else {
        64 * MR
    }
}

/// The centres, packed for the kernel.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Panels {
    k: usize,
    d: usize,
    /// Panels one after the other; panel `q` starts at `q * W * d`.
    data: Vec<f32>,
    /// `|c|^2` per centre, padded with +inf to a whole number of panels.
    norms: Vec<f32>,
}

impl Panels {
    /// Packs `k` centres of `d` columns (row-major `values`, their squared
    /// norms `norms`), when this CPU runs the kernel; `None` otherwise.
    ///
    /// In `reuse`'s memory: the panels of the centres before a step (as
    /// large as the centres, packed again every step).
    pub(super) fn new_in(
        k: usize,
        d: usize,
        values: &[f32],
        norms: &[f32],
        mut reuse: Vec<f32>,
    ) -> Option<Panels> {
        if !available() || k == 0 || d == 0 {
            return None;
        }
        let panels = k.div_ceil(W);
        let last = width(k, panels - 1);
        let padded = (panels - 1) * W + last;
        reuse.clear();
        reuse.reserve(padded * d);
        let mut data = reuse;
        for q in 0..panels {
            let w = width(k, q);
            for p in 0..d {
                for j in 0..w {
                    let c = q * W + j;
                    data.push(if c < k { values[c * d + p] } else { 0.0 });
                }
            }
        }
        let mut padded_norms = Vec::with_capacity(padded);
        padded_norms.extend_from_slice(&norms[..k]);
        padded_norms.resize(padded, f32::INFINITY);
        Some(Panels {
            k,
            d,
            data,
            norms: padded_norms,
        })
    }

    /// The panels' memory, for [`Panels::new_in`].
    pub(super) fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// For each of the `best.len()` rows of `x`: the index of its nearest
    /// centre (the lowest index among equals) and the squared distance
    /// `xn[i] - 2 x.c + |c|^2` to it.
    pub(super) fn nearest(&self, x: &[f32], xn: &[f32], best: &mut [u32], best_d: &mut [f32]) {
        let (n, d) = (best.len(), self.d);
        assert!(x.len() >= n * d && xn.len() >= n && best_d.len() >= n);
        let panels = self.k.div_ceil(W);
        let rb = row_block(self.k, d);
        let mut acc = crate::zeros::<f32>(rb * panels * W);
        let wide = avx512();
        for r0 in (0..n).step_by(rb) {
            let rows = rb.min(n - r0);
            for k0 in (0..d).step_by(KC) {
                self.dots(x, r0..r0 + rows, k0..k0 + KC.min(d - k0), &mut acc, wide);
            }
            for i in 0..rows {
                let row = r0 + i;
                let a = &acc[i * panels * W..(i + 1) * panels * W];
                (best[row], best_d[row]) = argmin(xn[row], a, &self.norms);
            }
        }
    }

    /// Adds to `acc` (rows of `panels * W` floats) the dot products
    /// of columns `cols` of rows `rows` of `x` with every centre (written,
    /// not added, for the first columns), panel by panel: with AVX-512
    /// (`wide`), two or three panels in one pass where they fit.
    #[inline]
    fn dots(&self, x: &[f32], rows: Range<usize>, cols: Range<usize>, acc: &mut [f32], wide: bool) {
        let d = self.d;
        let (r0, rows) = (rows.start, rows.len());
        let (k0, kc) = (cols.start, cols.len());
        let panels = self.k.div_ceil(W);
        let first = k0 == 0;
        let mut q = 0;
        while q < panels {
            let w = width(self.k, q);
            let panel = &self.data[q * W * d + k0 * w..q * W * d + (k0 + kc) * w];
            if wide && q + 3 == panels && width(self.k, q + 1) == W && width(self.k, q + 2) < W {
                // The last two full panels and the half panel after
                // them in one pass: 40 centres per row. On its own
                // the half panel cost half a pair's time for a
                // quarter of its centres.
                let at =
                    |j: usize, w: usize| &self.data[j * W * d + k0 * w..j * W * d + (k0 + kc) * w];
                let (next, half) = (at(q + 1, W), at(q + 2, W / 2));
                for i0 in (0..rows).step_by(MR3) {
                    let m = MR3.min(rows - i0);
                    let xs = &x[(r0 + i0) * d + k0..];
                    let a = &mut acc[(i0 * panels + q) * W..];
                    // SAFETY: `wide` says the CPU has AVX-512F (and
                    // `available()`, AVX2 and FMA); `xs` holds `m`
                    // rows of stride `d` with at least `kc` columns
                    // each, the full panels `kc * 16` floats, the
                    // half one `kc * 8`, and `a`, from panel `q` of
                    // row `i0`, at least `(m - 1) * panels * W + 40`
                    // floats (panel `q + 2` is the row's last).
                    unsafe { tile_triple(m, xs, d, [panel, next, half], kc, a, panels * W, first) };
                }
                q += 3;
                continue;
            }
            if wide && q + 1 < panels && width(self.k, q + 1) == W {
                // Two full panels at once: 32 centres per row.
                let next = &self.data[(q + 1) * W * d + k0 * W..(q + 1) * W * d + (k0 + kc) * W];
                for i0 in (0..rows).step_by(MR2) {
                    let m = MR2.min(rows - i0);
                    let xs = &x[(r0 + i0) * d + k0..];
                    let a = &mut acc[(i0 * panels + q) * W..];
                    // SAFETY: `wide` says the CPU has AVX-512F;
                    // `xs` holds `m` rows of stride `d` with at
                    // least `kc` columns each, each panel `kc * 16`
                    // floats, and `a`, from panel `q` of row `i0`,
                    // at least `(m - 1) * panels * W + 2 * W`
                    // floats (panel `q + 1` exists).
                    unsafe { tile_pair(m, xs, d, panel, next, kc, a, panels * W, first) };
                }
                q += 2;
                continue;
            }
            // Twelve rows at a time where one register per row
            // holds the panel (a half panel; a full one with
            // AVX-512): twelve sums in flight, where six would
            // wait on each other's latency.
            let step = if w < W || wide { MR2 } else { MR };
            for i0 in (0..rows).step_by(step) {
                let m = step.min(rows - i0);
                let xs = &x[(r0 + i0) * d + k0..];
                let a = &mut acc[(i0 * panels + q) * W..];
                // SAFETY: `available()` held when `self` was built
                // (`new` returns `None` otherwise); `m` is at most
                // `MR`, or `MR2` for a half panel or with AVX-512
                // (`wide`); `xs` holds `m` rows of stride `d` with
                // at least `kc` columns each from its start (`x`
                // holds `n` rows), `panel` holds `kc * w` floats,
                // and `a`, from row `i0` of `rows` rows of
                // `panels * W`, at least `(m - 1) * panels * W + w`
                // floats.
                unsafe { tile_dispatch(m, w, xs, d, panel, kc, a, panels * W, first) };
            }
            q += 1;
        }
    }
}

/// The nearest centre to a row of squared norm `xn`, from its dot products
/// with the centres and their squared norms: the lowest index among
/// equals, and the squared distance `xn - 2 x.c + |c|^2` to it.
pub(super) fn argmin(xn: f32, dots: &[f32], norms: &[f32]) -> (u32, f32) {
    #[cfg(target_arch = "x86_64")]
    if dots.len().min(norms.len()) >= 16 && avx512() {
        // SAFETY: the CPU supports AVX-512F, checked just above.
        return unsafe { avx512::argmin(xn, dots, norms) };
    }
    #[cfg(target_arch = "x86_64")]
    if dots.len().min(norms.len()) >= 8 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { avx2::argmin(xn, dots, norms) };
    }
    argmin_from(xn, dots, norms, 0, (0, f32::INFINITY))
}

/// [`argmin`] over the centres from `from` on, starting from the best so
/// far, `best` (`(0, inf)` for none).
fn argmin_from(xn: f32, dots: &[f32], norms: &[f32], from: usize, best: (u32, f32)) -> (u32, f32) {
    let (mut b, mut bd) = best;
    for (c, (&dot, &cn)) in dots.iter().zip(norms).enumerate().skip(from) {
        let dist = xn - 2.0 * dot + cn;
        if dist < bd {
            bd = dist;
            b = c as u32;
        }
    }
    (b, bd)
}

/// The best of the vector argmins' lanes: lane `l` found distance
/// `lanes[l]` first at centre `at[l]`; the smallest distance wins, and the
/// lowest centre among equals. `(0, inf)` when none is below infinity.
#[cfg(target_arch = "x86_64")]
fn best_of_lanes(lanes: &[f32], at: &[u32]) -> (u32, f32) {
    let (mut b, mut bd) = (0u32, f32::INFINITY);
    for (&v, &i) in lanes.iter().zip(at) {
        if v < bd || (v == bd && i < b) {
            (b, bd) = (i, v);
        }
    }
    (b, bd)
}

/// Width of panel `q` of `k` centres.
fn width(k: usize, q: usize) -> usize {
    if k - q * W <= W / 2 {
        W / 2
    } else {
        W
    }
}

/// Whether this CPU runs the kernel.
fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX-512 tiles.
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Runs the AVX-512 tile for `m` rows (1..=MR2) and two full panels, `p0`
/// and `p1`, whose dot products go to 32 consecutive floats of each row
/// of `acc`.
///
/// # Safety
///
/// The CPU must support AVX-512F. `x` must hold `m` rows of stride `d`
/// with `kc` columns each from its start; `p0` and `p1` `kc * 16` floats
/// each; `acc` `(m - 1) * stride + 32` floats.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_pair(
    m: usize,
    x: &[f32],
    d: usize,
    p0: &[f32],
    p1: &[f32],
    kc: usize,
    acc: &mut [f32],
    stride: usize,
    first: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        debug_assert!(x.len() >= (m - 1) * d + kc && p0.len() >= kc * W && p1.len() >= kc * W);
        debug_assert!(acc.len() >= (m - 1) * stride + 2 * W);
        let (x, p0, p1, a) = (x.as_ptr(), p0.as_ptr(), p1.as_ptr(), acc.as_mut_ptr());
        // SAFETY: forwarded from this function's contract.
        unsafe {
            match m {
                12 => avx512::pair::<12>(x, d, p0, p1, kc, a, stride, first),
                11 => avx512::pair::<11>(x, d, p0, p1, kc, a, stride, first),
                10 => avx512::pair::<10>(x, d, p0, p1, kc, a, stride, first),
                9 => avx512::pair::<9>(x, d, p0, p1, kc, a, stride, first),
                8 => avx512::pair::<8>(x, d, p0, p1, kc, a, stride, first),
                7 => avx512::pair::<7>(x, d, p0, p1, kc, a, stride, first),
                6 => avx512::pair::<6>(x, d, p0, p1, kc, a, stride, first),
                5 => avx512::pair::<5>(x, d, p0, p1, kc, a, stride, first),
                4 => avx512::pair::<4>(x, d, p0, p1, kc, a, stride, first),
                3 => avx512::pair::<3>(x, d, p0, p1, kc, a, stride, first),
                2 => avx512::pair::<2>(x, d, p0, p1, kc, a, stride, first),
                _ => avx512::pair::<1>(x, d, p0, p1, kc, a, stride, first),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, x, d, p0, p1, kc, acc, stride, first);
    }
}

/// Runs the AVX-512 tile for `m` rows (1..=MR3), two full panels and a
/// half one (`p[0]`, `p[1]`, `p[2]`), whose dot products go to 40
/// consecutive floats of each row of `acc`.
///
/// # Safety
///
/// The CPU must support AVX-512F, AVX2 and FMA. `x` must hold `m` rows of
/// stride `d` with `kc` columns each from its start; `p[0]` and `p[1]`
/// `kc * 16` floats each, `p[2]` `kc * 8`; `acc` `(m - 1) * stride + 40`
/// floats.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_triple(
    m: usize,
    x: &[f32],
    d: usize,
    p: [&[f32]; 3],
    kc: usize,
    acc: &mut [f32],
    stride: usize,
    first: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        debug_assert!(x.len() >= (m - 1) * d + kc && p[0].len() >= kc * W);
        debug_assert!(p[1].len() >= kc * W && p[2].len() >= kc * W / 2);
        debug_assert!(acc.len() >= (m - 1) * stride + 2 * W + W / 2);
        let (x, a) = (x.as_ptr(), acc.as_mut_ptr());
        let p = [p[0].as_ptr(), p[1].as_ptr(), p[2].as_ptr()];
        // SAFETY: forwarded from this function's contract.
        unsafe {
            match m {
                8 => avx512::triple::<8>(x, d, p, kc, a, stride, first),
                7 => avx512::triple::<7>(x, d, p, kc, a, stride, first),
                6 => avx512::triple::<6>(x, d, p, kc, a, stride, first),
                5 => avx512::triple::<5>(x, d, p, kc, a, stride, first),
                4 => avx512::triple::<4>(x, d, p, kc, a, stride, first),
                3 => avx512::triple::<3>(x, d, p, kc, a, stride, first),
                2 => avx512::triple::<2>(x, d, p, kc, a, stride, first),
                _ => avx512::triple::<1>(x, d, p, kc, a, stride, first),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, x, d, p, kc, acc, stride, first);
    }
}

/// Runs the tile for `m` rows and a panel of width `w` (8 or 16): `m` is
/// 1..=MR, or up to MR2 for a half panel (`w` = 8) or on a CPU with
/// AVX-512F.
///
/// # Safety
///
/// The CPU must support AVX2 and FMA. `x` must hold `m` rows of stride
/// `d` with `kc` columns each from its start; `panel` `kc * w` floats;
/// `acc` `(m - 1) * stride + w` floats.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_dispatch(
    m: usize,
    w: usize,
    x: &[f32],
    d: usize,
    panel: &[f32],
    kc: usize,
    acc: &mut [f32],
    stride: usize,
    first: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        debug_assert!(x.len() >= (m - 1) * d + kc && panel.len() >= kc * w);
        debug_assert!(acc.len() >= (m - 1) * stride + w);
        debug_assert!(m <= MR || (m <= MR2 && (w < W || avx512())));
        let (x, p, a) = (x.as_ptr(), panel.as_ptr(), acc.as_mut_ptr());
        if w == W && avx512() {
            // SAFETY: the CPU supports AVX-512F (just checked); the rest is
            // forwarded from this function's contract.
            unsafe {
                match m {
                    12 => avx512::tile::<12>(x, d, p, kc, a, stride, first),
                    11 => avx512::tile::<11>(x, d, p, kc, a, stride, first),
                    10 => avx512::tile::<10>(x, d, p, kc, a, stride, first),
                    9 => avx512::tile::<9>(x, d, p, kc, a, stride, first),
                    8 => avx512::tile::<8>(x, d, p, kc, a, stride, first),
                    7 => avx512::tile::<7>(x, d, p, kc, a, stride, first),
                    6 => avx512::tile::<6>(x, d, p, kc, a, stride, first),
                    5 => avx512::tile::<5>(x, d, p, kc, a, stride, first),
                    4 => avx512::tile::<4>(x, d, p, kc, a, stride, first),
                    3 => avx512::tile::<3>(x, d, p, kc, a, stride, first),
                    2 => avx512::tile::<2>(x, d, p, kc, a, stride, first),
                    _ => avx512::tile::<1>(x, d, p, kc, a, stride, first),
                }
            }
            return;
        }
        // SAFETY: forwarded from this function's contract.
        unsafe {
            match (m, w) {
                (6, 16) => avx2::tile::<6, 2>(x, d, p, kc, a, stride, first),
                (5, 16) => avx2::tile::<5, 2>(x, d, p, kc, a, stride, first),
                (4, 16) => avx2::tile::<4, 2>(x, d, p, kc, a, stride, first),
                (3, 16) => avx2::tile::<3, 2>(x, d, p, kc, a, stride, first),
                (2, 16) => avx2::tile::<2, 2>(x, d, p, kc, a, stride, first),
                (1, 16) => avx2::tile::<1, 2>(x, d, p, kc, a, stride, first),
                (12, 8) => avx2::tile::<12, 1>(x, d, p, kc, a, stride, first),
                (11, 8) => avx2::tile::<11, 1>(x, d, p, kc, a, stride, first),
                (10, 8) => avx2::tile::<10, 1>(x, d, p, kc, a, stride, first),
                (9, 8) => avx2::tile::<9, 1>(x, d, p, kc, a, stride, first),
                (8, 8) => avx2::tile::<8, 1>(x, d, p, kc, a, stride, first),
                (7, 8) => avx2::tile::<7, 1>(x, d, p, kc, a, stride, first),
                (6, _) => avx2::tile::<6, 1>(x, d, p, kc, a, stride, first),
                (5, _) => avx2::tile::<5, 1>(x, d, p, kc, a, stride, first),
                (4, _) => avx2::tile::<4, 1>(x, d, p, kc, a, stride, first),
                (3, _) => avx2::tile::<3, 1>(x, d, p, kc, a, stride, first),
                (2, _) => avx2::tile::<2, 1>(x, d, p, kc, a, stride, first),
                _ => avx2::tile::<1, 1>(x, d, p, kc, a, stride, first),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, w, x, d, panel, kc, acc, stride, first);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
