//! The distance step fused with the argmin, for CPUs with AVX2 and FMA.
//!
//! For a block of rows `x` (row-major, `d` columns) and the centres, each
//! row's nearest centre is `argmin_c |x|^2 - 2 x.c + |c|^2`, the same
//! expression as the GEMM path, evaluated without writing the `n x k`
//! matrix of dot products anywhere: a 6-row by 16-centre tile of dot
//! products is accumulated in twelve registers over all `d` columns, then
//! turned into distances and compared on the spot.
//!
//! The centres are packed once per set of centres ([`Panels::new`]) into
//! panels of 16 (the last one 8 when at most 8 remain): within a panel,
//! column `p` of the 16 centres is 16 consecutive floats, one cache line,
//! so the kernel streams a panel with two vector loads per column and
//! broadcasts one value of each of the six rows against them. The columns
//! are taken in blocks of [`KC`], so one block of a panel (16 KiB) and of
//! the six rows stay in the level-1 cache while the panels go by; the
//! partial dot products of a block of rows wait between column blocks in
//! a small buffer.
//!
//! Each dot product adds its `d` terms in column order, one fused
//! multiply-add at a time, whatever the blocks, so the results depend on
//! the data and the CPU's instruction set only: the same with and without
//! a cap, for any partitioning, any thread.

/// Centres per full panel.
const W: usize = 16;

/// Rows per tile.
const MR: usize = 6;

/// Columns per block.
const KC: usize = 256;

/// Rows per block of rows that shares a column block's pass over the
/// panels (a multiple of [`MR`]).
const RB: usize = 8 * MR;

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
    pub(super) fn new(k: usize, d: usize, values: &[f32], norms: &[f32]) -> Option<Panels> {
        if !available() || k == 0 || d == 0 {
            return None;
        }
        let panels = k.div_ceil(W);
        let last = width(k, panels - 1);
        let padded = (panels - 1) * W + last;
        let mut data = Vec::with_capacity(padded * d);
        for q in 0..panels {
            let w = width(k, q);
            for p in 0..d {
                for j in 0..w {
                    let c = q * W + j;
                    data.push(if c < k { values[c * d + p] } else { 0.0 });
                }
            }
        }
        let mut padded_norms = norms[..k].to_vec();
        padded_norms.resize(padded, f32::INFINITY);
        Some(Panels {
            k,
            d,
            data,
            norms: padded_norms,
        })
    }

    /// For each of the `best.len()` rows of `x`: the index of its nearest
    /// centre (the lowest index among equals) and the squared distance
    /// `xn[i] - 2 x.c + |c|^2` to it.
    pub(super) fn nearest(&self, x: &[f32], xn: &[f32], best: &mut [u32], best_d: &mut [f32]) {
        let (n, d) = (best.len(), self.d);
        assert!(x.len() >= n * d && xn.len() >= n && best_d.len() >= n);
        let panels = self.k.div_ceil(W);
        let mut acc = vec![0f32; RB * panels * W];
        for r0 in (0..n).step_by(RB) {
            let rows = RB.min(n - r0);
            for k0 in (0..d).step_by(KC) {
                let kc = KC.min(d - k0);
                let first = k0 == 0;
                for q in 0..panels {
                    let w = width(self.k, q);
                    let panel = &self.data[q * W * d + k0 * w..q * W * d + (k0 + kc) * w];
                    for i0 in (0..rows).step_by(MR) {
                        let m = MR.min(rows - i0);
                        let xs = &x[(r0 + i0) * d + k0..];
                        let a = &mut acc[(i0 * panels + q) * W..];
                        // SAFETY: `available()` held when `self` was built
                        // (`new` returns `None` otherwise); `xs` holds `m`
                        // rows of stride `d` with at least `kc` columns
                        // each from its start (`x` holds `n` rows), `panel`
                        // holds `kc * w` floats, and `a`, from row `i0` of
                        // `RB` rows of `panels * W`, at least
                        // `(m - 1) * panels * W + w` floats.
                        unsafe { tile_dispatch(m, w, xs, d, panel, kc, a, panels * W, first) };
                    }
                }
            }
            for i in 0..rows {
                let row = r0 + i;
                let a = &acc[i * panels * W..(i + 1) * panels * W];
                (best[row], best_d[row]) = argmin(xn[row], a, &self.norms);
            }
        }
    }
}

/// The nearest centre to a row of squared norm `xn`, from its dot products
/// with the centres and their squared norms: the lowest index among
/// equals, and the squared distance `xn - 2 x.c + |c|^2` to it.
pub(super) fn argmin(xn: f32, dots: &[f32], norms: &[f32]) -> (u32, f32) {
    let (mut b, mut bd) = (0u32, f32::INFINITY);
    for (c, (&dot, &cn)) in dots.iter().zip(norms).enumerate() {
        let dist = xn - 2.0 * dot + cn;
        if dist < bd {
            bd = dist;
            b = c as u32;
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

/// Runs the tile for `m` rows (1..=MR) and a panel of width `w` (8 or 16).
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
        let (x, p, a) = (x.as_ptr(), panel.as_ptr(), acc.as_mut_ptr());
        // SAFETY: forwarded from this function's contract.
        unsafe {
            match (m, w) {
                (6, 16) => avx2::tile::<6, 2>(x, d, p, kc, a, stride, first),
                (5, 16) => avx2::tile::<5, 2>(x, d, p, kc, a, stride, first),
                (4, 16) => avx2::tile::<4, 2>(x, d, p, kc, a, stride, first),
                (3, 16) => avx2::tile::<3, 2>(x, d, p, kc, a, stride, first),
                (2, 16) => avx2::tile::<2, 2>(x, d, p, kc, a, stride, first),
                (1, 16) => avx2::tile::<1, 2>(x, d, p, kc, a, stride, first),
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
mod avx2 {
    use std::arch::x86_64::*;

    /// `acc[i * stride + j] (+)= sum_p x[i * d + p] * panel[p * 8V + j]`
    /// for `i < M`, `j < 8V`, `p < kc`; `first` starts from zero.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA; the pointers must cover what
    /// [`super::tile_dispatch`] says.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const M: usize, const V: usize>(
        x: *const f32,
        d: usize,
        panel: *const f32,
        kc: usize,
        acc: *mut f32,
        stride: usize,
        first: bool,
    ) {
        let mut c = [[_mm256_setzero_ps(); V]; M];
        if !first {
            for (i, ci) in c.iter_mut().enumerate() {
                for (v, cv) in ci.iter_mut().enumerate() {
                    // SAFETY: row i < M of acc, 8 floats at 8v < 8V.
                    *cv = unsafe { _mm256_loadu_ps(acc.add(i * stride + 8 * v)) };
                }
            }
        }
        for p in 0..kc {
            let mut b = [_mm256_setzero_ps(); V];
            for (v, bv) in b.iter_mut().enumerate() {
                // SAFETY: p < kc, so 8 floats at p * 8V + 8v lie in the panel.
                *bv = unsafe { _mm256_loadu_ps(panel.add(p * 8 * V + 8 * v)) };
            }
            for (i, ci) in c.iter_mut().enumerate() {
                // SAFETY: row i < M, column p < kc of x.
                let a = unsafe { _mm256_broadcast_ss(&*x.add(i * d + p)) };
                for (cv, &bv) in ci.iter_mut().zip(&b) {
                    *cv = _mm256_fmadd_ps(a, bv, *cv);
                }
            }
        }
        for (i, ci) in c.iter().enumerate() {
            for (v, cv) in ci.iter().enumerate() {
                // SAFETY: as for the loads above.
                unsafe { _mm256_storeu_ps(acc.add(i * stride + 8 * v), *cv) };
            }
        }
    }
}
