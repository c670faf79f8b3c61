//! The AVX-512F code of the kernel: its argmin sixteen centres at a time,
//! the 12-row by 32-centre tile and the one-register-per-row tile (see the
//! parent module).

use std::arch::x86_64::*;

/// [`super::argmin`] sixteen centres at a time: each lane keeps its
/// first strictly smaller distance (the same operations as the scalar
/// loop, so the same bits), then the lanes' best go in index order
/// (the lowest index among equals), then the last centres one by one.
///
/// # Safety
///
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn argmin(xn: f32, dots: &[f32], norms: &[f32]) -> (u32, f32) {
    let n = dots.len().min(norms.len());
    let full = n / 16 * 16;
    let (vxn, two) = (_mm512_set1_ps(xn), _mm512_set1_ps(2.0));
    let mut best = _mm512_set1_ps(f32::INFINITY);
    let mut at = _mm512_setzero_si512();
    let mut index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let sixteen = _mm512_set1_epi32(16);
    for c in (0..full).step_by(16) {
        // SAFETY: c + 16 <= full <= n, within both slices.
        let (dot, cn) = unsafe {
            (
                _mm512_loadu_ps(dots.as_ptr().add(c)),
                _mm512_loadu_ps(norms.as_ptr().add(c)),
            )
        };
        let dist = _mm512_add_ps(_mm512_sub_ps(vxn, _mm512_mul_ps(two, dot)), cn);
        let less = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(dist, best);
        best = _mm512_mask_mov_ps(best, less, dist);
        at = _mm512_mask_mov_epi32(at, less, index);
        index = _mm512_add_epi32(index, sixteen);
    }
    super::argmin_from(xn, dots, norms, full, best_lane(best, at))
}

/// [`super::best_of_lanes`] in registers: the smallest distance of
/// `best`, the lowest centre of `at` among the lanes that hold it, and
/// that lane's distance, its own bits (-0.0 and 0.0 are equal, as in
/// the scalar loop). `(0, inf)` when no lane is below infinity: then
/// every `at` lane is 0.
#[target_feature(enable = "avx512f")]
fn best_lane(best: __m512, at: __m512i) -> (u32, f32) {
    let least = _mm512_reduce_min_ps(best);
    let holds = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(best, _mm512_set1_ps(least));
    let first = _mm512_mask_reduce_min_epu32(holds, at);
    let lane = holds & _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(first as i32));
    let bits = _mm512_cvtss_f32(_mm512_maskz_compress_ps(lane, best));
    (first, bits)
}

/// [`super::avx2::tile`] for a full panel (16 centres), one 512-bit
/// register per row: each lane adds the same products in the same
/// order, one fused multiply-add at a time, so the results are the
/// same bits as the AVX2 tile's.
///
/// # Safety
///
/// The CPU must support AVX-512F; the pointers must cover what
/// [`super::tile_dispatch`] says for a panel of width 16.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn tile<const M: usize>(
    x: *const f32,
    d: usize,
    panel: *const f32,
    kc: usize,
    acc: *mut f32,
    stride: usize,
    first: bool,
) {
    let mut c = [_mm512_setzero_ps(); M];
    if !first {
        for (i, ci) in c.iter_mut().enumerate() {
            // SAFETY: row i < M of acc, 16 floats.
            *ci = unsafe { _mm512_loadu_ps(acc.add(i * stride)) };
        }
    }
    for p in 0..kc {
        // SAFETY: p < kc, so 16 floats at p * 16 lie in the panel.
        let b = unsafe { _mm512_loadu_ps(panel.add(p * 16)) };
        for (i, ci) in c.iter_mut().enumerate() {
            // SAFETY: row i < M, column p < kc of x.
            let a = _mm512_set1_ps(unsafe { *x.add(i * d + p) });
            *ci = _mm512_fmadd_ps(a, b, *ci);
        }
    }
    for (i, ci) in c.iter().enumerate() {
        // SAFETY: as for the loads above.
        unsafe { _mm512_storeu_ps(acc.add(i * stride), *ci) };
    }
}

/// [`tile`] for two full panels at once (`p0`, `p1`: 32 centres), two
/// registers per row: the same products added in the same order.
///
/// # Safety
///
/// The CPU must support AVX-512F; the pointers must cover what
/// [`super::tile_pair`] says.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pair<const M: usize>(
    x: *const f32,
    d: usize,
    p0: *const f32,
    p1: *const f32,
    kc: usize,
    acc: *mut f32,
    stride: usize,
    first: bool,
) {
    let mut c = [[_mm512_setzero_ps(); 2]; M];
    if !first {
        for (i, ci) in c.iter_mut().enumerate() {
            // SAFETY: row i < M of acc, 32 floats.
            ci[0] = unsafe { _mm512_loadu_ps(acc.add(i * stride)) };
            // SAFETY: as above.
            ci[1] = unsafe { _mm512_loadu_ps(acc.add(i * stride + 16)) };
        }
    }
    for p in 0..kc {
        // SAFETY: p < kc, so 16 floats at p * 16 lie in each panel.
        let b0 = unsafe { _mm512_loadu_ps(p0.add(p * 16)) };
        // SAFETY: as above.
        let b1 = unsafe { _mm512_loadu_ps(p1.add(p * 16)) };
        for (i, ci) in c.iter_mut().enumerate() {
            // SAFETY: row i < M, column p < kc of x.
            let a = _mm512_set1_ps(unsafe { *x.add(i * d + p) });
            ci[0] = _mm512_fmadd_ps(a, b0, ci[0]);
            ci[1] = _mm512_fmadd_ps(a, b1, ci[1]);
        }
    }
    for (i, ci) in c.iter().enumerate() {
        // SAFETY: as for the loads above.
        unsafe { _mm512_storeu_ps(acc.add(i * stride), ci[0]) };
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(acc.add(i * stride + 16), ci[1]) };
    }
}

/// [`pair`] and the half-panel tile ([`super::avx2::tile`] for 8
/// centres) in one pass (`p[0]`, `p[1]`: 16 centres each, `p[2]`: 8):
/// three registers per row, each lane adding the same products in the
/// same order as in those tiles, so the same bits.
///
/// # Safety
///
/// The CPU must support AVX-512F, AVX2 and FMA; the pointers must cover
/// what [`super::tile_triple`] says.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn triple<const M: usize>(
    x: *const f32,
    d: usize,
    p: [*const f32; 3],
    kc: usize,
    acc: *mut f32,
    stride: usize,
    first: bool,
) {
    let mut c = [[_mm512_setzero_ps(); 2]; M];
    let mut h = [_mm256_setzero_ps(); M];
    if !first {
        for (i, (ci, hi)) in c.iter_mut().zip(h.iter_mut()).enumerate() {
            // SAFETY: row i < M of acc, 40 floats.
            ci[0] = unsafe { _mm512_loadu_ps(acc.add(i * stride)) };
            // SAFETY: as above.
            ci[1] = unsafe { _mm512_loadu_ps(acc.add(i * stride + 16)) };
            // SAFETY: as above.
            *hi = unsafe { _mm256_loadu_ps(acc.add(i * stride + 32)) };
        }
    }
    for q in 0..kc {
        // SAFETY: q < kc, so 16 floats at q * 16 lie in each full panel
        // and 8 at q * 8 in the half one.
        let (b0, b1, b2) = unsafe {
            (
                _mm512_loadu_ps(p[0].add(q * 16)),
                _mm512_loadu_ps(p[1].add(q * 16)),
                _mm256_loadu_ps(p[2].add(q * 8)),
            )
        };
        for (i, (ci, hi)) in c.iter_mut().zip(h.iter_mut()).enumerate() {
            // SAFETY: row i < M, column q < kc of x.
            let v = unsafe { *x.add(i * d + q) };
            let a = _mm512_set1_ps(v);
            ci[0] = _mm512_fmadd_ps(a, b0, ci[0]);
            ci[1] = _mm512_fmadd_ps(a, b1, ci[1]);
            *hi = _mm256_fmadd_ps(_mm256_set1_ps(v), b2, *hi);
        }
    }
    for (i, (ci, hi)) in c.iter().zip(h.iter()).enumerate() {
        // SAFETY: as for the loads above.
        unsafe { _mm512_storeu_ps(acc.add(i * stride), ci[0]) };
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(acc.add(i * stride + 16), ci[1]) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(acc.add(i * stride + 32), *hi) };
    }
}
