//! The log-loss's two products, on [`BLOCK`] rows at a time: the scores
//! `X W^T + b`, and the gradient's update `G^T X`. A block's rows are
//! read once for every class, and each weight once for the block.
//!
//! Every sum is a fixed sequence of fused multiply-adds (`f64::mul_add`,
//! exact with or without the instruction), four lanes over the columns
//! for the scores: the results are the same bits on any CPU. Where AVX2
//! and FMA are there, the same code is compiled for them, and the loops
//! run in vector registers.

/// Rows per block.
pub(super) const BLOCK: usize = 4;

/// Which build of the kernels runs: the AVX2 and FMA one only where the
/// CPU has them (a value that says so comes from [`Isa::detect`] alone),
/// else the plain one.
#[derive(Clone, Copy, Debug)]
pub(super) struct Isa {
    fma: bool,
}

impl Isa {
    /// The best build this CPU runs.
    pub(super) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        let fma = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let fma = false;
        Isa { fma }
    }

    /// The plain build.
    #[cfg(test)]
    fn plain() -> Isa {
        Isa { fma: false }
    }
}

/// `z[r * classes + c] = w_c . x_r + b_c` for the [`BLOCK`] rows of `x`
/// (`d` values each, f64), with `w` holding `classes` rows of `d + 1`
/// (the weights, then the bias).
pub(super) fn scores(isa: Isa, x: &[f64], w: &[f64], classes: usize, z: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if isa.fma {
        // SAFETY: `isa.fma` is set by `Isa::detect` alone, after checking
        // that the CPU has AVX2 and FMA.
        unsafe { scores_fma(x, w, classes, z) };
        return;
    }
    let _ = isa;
    scores_any(x, w, classes, z);
}

/// `grad[c * (d + 1) + j] += sum_r g[r * classes + c] * x_r[j]` for the
/// [`BLOCK`] rows of `x`, row after row (the bias column is left alone).
pub(super) fn add_outer(isa: Isa, x: &[f64], g: &[f64], classes: usize, grad: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if isa.fma {
        // SAFETY: `isa.fma` is set by `Isa::detect` alone, after checking
        // that the CPU has AVX2 and FMA.
        unsafe { add_outer_fma(x, g, classes, grad) };
        return;
    }
    let _ = isa;
    add_outer_any(x, g, classes, grad);
}

/// [`scores_any`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_fma(x: &[f64], w: &[f64], classes: usize, z: &mut [f64]) {
    scores_any(x, w, classes, z);
}

/// [`add_outer_any`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_outer_fma(x: &[f64], g: &[f64], classes: usize, grad: &mut [f64]) {
    add_outer_any(x, g, classes, grad);
}

/// The block's rows.
#[inline(always)]
fn rows(x: &[f64]) -> [&[f64]; BLOCK] {
    let d = x.len() / BLOCK;
    std::array::from_fn(|r| &x[r * d..(r + 1) * d])
}

#[inline(always)]
fn scores_any(x: &[f64], w: &[f64], classes: usize, z: &mut [f64]) {
    let d = x.len() / BLOCK;
    let full = d - d % 4;
    let [x0, x1, x2, x3] = rows(x);
    for c in 0..classes {
        let wc = &w[c * (d + 1)..(c + 1) * (d + 1)];
        let mut acc = [[0f64; 4]; BLOCK];
        let lanes = wc[..full].chunks_exact(4).zip(x0.chunks_exact(4));
        let lanes = lanes.zip(x1.chunks_exact(4)).zip(x2.chunks_exact(4));
        for ((((wv, a), b), e), f) in lanes.zip(x3.chunks_exact(4)) {
            for t in 0..4 {
                acc[0][t] = wv[t].mul_add(a[t], acc[0][t]);
                acc[1][t] = wv[t].mul_add(b[t], acc[1][t]);
                acc[2][t] = wv[t].mul_add(e[t], acc[2][t]);
                acc[3][t] = wv[t].mul_add(f[t], acc[3][t]);
            }
        }
        for (r, xr) in [x0, x1, x2, x3].into_iter().enumerate() {
            let a = acc[r];
            let mut s = (a[0] + a[1]) + (a[2] + a[3]);
            for j in full..d {
                s = wc[j].mul_add(xr[j], s);
            }
            z[r * classes + c] = s + wc[d];
        }
    }
}

#[inline(always)]
fn add_outer_any(x: &[f64], g: &[f64], classes: usize, grad: &mut [f64]) {
    let d = x.len() / BLOCK;
    let [x0, x1, x2, x3] = rows(x);
    for c in 0..classes {
        let [g0, g1, g2, g3] = std::array::from_fn(|r| g[r * classes + c]);
        let gc = &mut grad[c * (d + 1)..c * (d + 1) + d];
        let cols = gc.iter_mut().zip(x0).zip(x1).zip(x2).zip(x3);
        for ((((o, &a), &b), &e), &f) in cols {
            *o = g3.mul_add(f, g2.mul_add(e, g1.mul_add(b, g0.mul_add(a, *o))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels against sums written out, on a width with a tail.
    #[test]
    fn the_products_match_plain_sums_on_every_build() {
        let (d, classes) = (11, 3);
        let x: Vec<f64> = (0..BLOCK * d).map(|i| (i as f64 * 0.37).sin()).collect();
        let w: Vec<f64> = (0..classes * (d + 1))
            .map(|i| (i as f64 * 0.11).cos())
            .collect();
        let g: Vec<f64> = (0..BLOCK * classes).map(|i| i as f64 - 4.5).collect();
        for isa in [Isa::plain(), Isa::detect()] {
            let mut z = vec![0.0; BLOCK * classes];
            scores(isa, &x, &w, classes, &mut z);
            let mut grad = vec![1.0; classes * (d + 1)];
            add_outer(isa, &x, &g, classes, &mut grad);
            for r in 0..BLOCK {
                for c in 0..classes {
                    let dot: f64 = (0..d).map(|j| w[c * (d + 1) + j] * x[r * d + j]).sum();
                    let want = dot + w[c * (d + 1) + d];
                    assert!((z[r * classes + c] - want).abs() < 1e-12, "{r} {c}");
                }
            }
            for c in 0..classes {
                for j in 0..d {
                    let s: f64 = (0..BLOCK).map(|r| g[r * classes + c] * x[r * d + j]).sum();
                    assert!((grad[c * (d + 1) + j] - 1.0 - s).abs() < 1e-12, "{c} {j}");
                }
                assert_eq!(grad[c * (d + 1) + d], 1.0, "the bias column is left alone");
            }
        }
    }

    /// The AVX2 build gives the plain build's bits.
    #[test]
    fn the_fma_build_gives_the_same_bits() {
        if !Isa::detect().fma {
            return;
        }
        let (d, classes) = (37, 2);
        let x: Vec<f64> = (0..BLOCK * d)
            .map(|i| (i as f64 * 0.91).sin() * 1e3)
            .collect();
        let w: Vec<f64> = (0..classes * (d + 1))
            .map(|i| (i as f64 * 0.13).cos())
            .collect();
        let g: Vec<f64> = (0..BLOCK * classes).map(|i| (i as f64).sqrt()).collect();
        let run = |isa| {
            let mut z = vec![0.0; BLOCK * classes];
            scores(isa, &x, &w, classes, &mut z);
            let mut grad = vec![0.5; classes * (d + 1)];
            add_outer(isa, &x, &g, classes, &mut grad);
            (z, grad)
        };
        assert_eq!(run(Isa::plain()), run(Isa::detect()));
    }
}
