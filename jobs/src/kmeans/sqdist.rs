//! The squared Euclidean distance k-means++ measures on its sample
//! (`init.rs`, `prune.rs`), with the same bits whatever the instruction
//! set, and a pass of it from every row to a few rows.
//!
//! Each distance is 32 independent lanes (enough chains to hide the add
//! latency), lane `t` adding the squares of the differences of elements
//! `t`, `t + 32`, ... in order; then the lanes are summed in order and the
//! tail (the last `len % 32` elements) added. Rust never fuses a multiply
//! and an add by itself, so the AVX2 build of the same code gives the
//! baseline's bits, with four times as many lanes per instruction.

/// Squared Euclidean distance between `a` and `b` (of equal lengths).
pub(super) fn sq_dist(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        return unsafe { sq_dist_avx2(a, b) };
    }
    lanes(a, b)
}

/// [`sq_dist`] compiled for AVX2.
///
/// # Safety
///
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sq_dist_avx2(a: &[f32], b: &[f32]) -> f32 {
    lanes(a, b)
}

/// Lanes per distance.
const L: usize = 32;

/// The distance from `a` to `b`: 32 lanes (see the module).
#[inline(always)]
fn lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; L];
    let (mut ca, mut cb) = (a.chunks_exact(L), b.chunks_exact(L));
    for (x, y) in (&mut ca).zip(&mut cb) {
        for t in 0..L {
            let v = x[t] - y[t];
            acc[t] += v * v;
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += (x - y) * (x - y);
    }
    acc.iter().sum::<f32>() + tail
}

/// Squared distances from every row of `s` (`d` columns) to the rows
/// `picks` of `s`: `out[i * picks.len() + t]` for row `i` and pick `t`,
/// on `threads` threads over contiguous ranges of rows. Each is
/// [`sq_dist`] of the two rows, whatever the thread count, where
/// `wanted(i, t)`, and `+inf` where not.
pub(super) fn distances(
    (s, d): (&[f32], usize),
    picks: &[usize],
    threads: usize,
    wanted: impl Fn(usize, usize) -> bool + Sync,
) -> Vec<f32> {
    let n = s.len() / d.max(1);
    let m = picks.len();
    let mut out = vec![f32::INFINITY; n * m];
    let per = n.div_ceil(threads.max(1)).max(1);
    let blocks: Vec<_> = out.chunks_mut(per * m.max(1)).enumerate().collect();
    crate::par::for_each(blocks, threads, |(r, block)| {
        for (j, o) in block.chunks_exact_mut(m).enumerate() {
            let i = r * per + j;
            let x = &s[i * d..(i + 1) * d];
            for (t, &c) in picks.iter().enumerate() {
                if wanted(i, t) {
                    o[t] = sq_dist(x, &s[c * d..(c + 1) * d]);
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The baseline's bits on the instruction sets this CPU has, close to
    /// the distance in f64.
    #[test]
    fn the_bits_do_not_depend_on_the_instruction_set() {
        let mut z = 0x9e37_79b9_u32;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            (z as f32 / u32::MAX as f32) * 200.0 - 100.0
        };
        for len in 0..100 {
            let mut row = || (0..len).map(|_| next()).collect::<Vec<f32>>();
            let a = row();
            let b = [row(), row(), row(), row()];
            for b in &b {
                let direct: f64 = a
                    .iter()
                    .zip(b)
                    .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
                    .sum();
                let base = lanes(&a, b);
                let got = sq_dist(&a, b);
                assert_eq!(got.to_bits(), base.to_bits(), "{len}");
                assert!((f64::from(got) - direct).abs() <= 1e-5 * direct.max(1.0));
            }
        }
    }
}
