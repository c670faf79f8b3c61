//! The AVX2 and FMA code of the kernel: its argmin eight centres at a
//! time and its 6-row tiles (see the parent module).

use std::arch::x86_64::*;

/// [`super::argmin`] eight centres at a time, as
/// [`super::avx512::argmin`] does sixteen: each lane keeps its first
/// strictly smaller distance (the scalar loop's operations, so its
/// bits), then the lanes' best go in index order (the lowest index
/// among equals), then the last centres one by one.
///
/// # Safety
///
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn argmin(xn: f32, dots: &[f32], norms: &[f32]) -> (u32, f32) {
    let n = dots.len().min(norms.len());
    let full = n / 8 * 8;
    let (vxn, two) = (_mm256_set1_ps(xn), _mm256_set1_ps(2.0));
    let mut best = _mm256_set1_ps(f32::INFINITY);
    let mut at = _mm256_setzero_si256();
    let mut index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let eight = _mm256_set1_epi32(8);
    for c in (0..full).step_by(8) {
        // SAFETY: c + 8 <= full <= n, within both slices.
        let (dot, cn) = unsafe {
            (
                _mm256_loadu_ps(dots.as_ptr().add(c)),
                _mm256_loadu_ps(norms.as_ptr().add(c)),
            )
        };
        let dist = _mm256_add_ps(_mm256_sub_ps(vxn, _mm256_mul_ps(two, dot)), cn);
        let less = _mm256_cmp_ps::<_CMP_LT_OQ>(dist, best);
        best = _mm256_blendv_ps(best, dist, less);
        at = _mm256_castps_si256(_mm256_blendv_ps(
            _mm256_castsi256_ps(at),
            _mm256_castsi256_ps(index),
            less,
        ));
        index = _mm256_add_epi32(index, eight);
    }
    let (mut lanes, mut lane_at) = ([0f32; 8], [0u32; 8]);
    // SAFETY: 8 floats and 8 integers of local arrays.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), best);
        _mm256_storeu_si256(lane_at.as_mut_ptr().cast(), at);
    }
    super::argmin_from(
        xn,
        dots,
        norms,
        full,
        super::best_of_lanes(&lanes, &lane_at),
    )
}

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
