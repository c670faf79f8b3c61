//! The kernel's tiles and argmins, bit for bit: the AVX-512 tiles give
//! the AVX2 tile's bits, every tile gives one fused multiply-add per
//! column in column order, and the vector argmins give the scalar loop's
//! answer.

use super::*;

/// Numbers in [-1, 1) from a linear congruential generator: the same
/// sequence for the same seed.
fn uniform(mut seed: u32) -> impl FnMut() -> f32 {
    move || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0
    }
}

/// The bits of each float, to compare results exactly.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn the_avx512_tile_gives_the_avx2_tiles_bits() {
    if !(available() && std::arch::is_x86_feature_detected!("avx512f")) {
        return;
    }
    let (d, kc) = (300, 256);
    // Values whose products and sums round differently in another
    // order, so a different order of additions would show.
    let mut next = uniform(7);
    let x: Vec<f32> = (0..6 * d).map(|_| next() * 1e3).collect();
    let panel: Vec<f32> = (0..kc * W).map(|_| next() / 7.0).collect();
    let stride = 3 * W;
    for m in 1..=MR {
        for first in [true, false] {
            let start: Vec<f32> = (0..MR * stride).map(|_| next()).collect();
            let (mut a, mut b) = (start.clone(), start);
            let (xp, pp) = (x.as_ptr(), panel.as_ptr());
            // SAFETY: the CPU has AVX2, FMA and AVX-512F (checked
            // above); x holds 6 rows of stride d >= kc, the panel
            // kc * 16 floats, a and b 6 rows of stride 48.
            unsafe {
                match m {
                    6 => {
                        avx2::tile::<6, 2>(xp, d, pp, kc, a.as_mut_ptr(), stride, first);
                        avx512::tile::<6>(xp, d, pp, kc, b.as_mut_ptr(), stride, first);
                    }
                    5 => {
                        avx2::tile::<5, 2>(xp, d, pp, kc, a.as_mut_ptr(), stride, first);
                        avx512::tile::<5>(xp, d, pp, kc, b.as_mut_ptr(), stride, first);
                    }
                    4 => {
                        avx2::tile::<4, 2>(xp, d, pp, kc, a.as_mut_ptr(), stride, first);
                        avx512::tile::<4>(xp, d, pp, kc, b.as_mut_ptr(), stride, first);
                    }
                    3 => {
                        avx2::tile::<3, 2>(xp, d, pp, kc, a.as_mut_ptr(), stride, first);
                        avx512::tile::<3>(xp, d, pp, kc, b.as_mut_ptr(), stride, first);
                    }
                    2 => {
                        avx2::tile::<2, 2>(xp, d, pp, kc, a.as_mut_ptr(), stride, first);
                        avx512::tile::<2>(xp, d, pp, kc, b.as_mut_ptr(), stride, first);
                    }
                    _ => {
                        avx2::tile::<1, 2>(xp, d, pp, kc, a.as_mut_ptr(), stride, first);
                        avx512::tile::<1>(xp, d, pp, kc, b.as_mut_ptr(), stride, first);
                    }
                }
            }
            assert_eq!(bits(&a), bits(&b), "{m} rows, first {first}");
        }
    }
}

#[test]
fn the_paired_avx512_tile_gives_two_single_tiles_bits() {
    if !(available() && std::arch::is_x86_feature_detected!("avx512f")) {
        return;
    }
    let (d, kc) = (300, 256);
    let mut next = uniform(11);
    let x: Vec<f32> = (0..MR2 * d).map(|_| next() * 1e3).collect();
    let p0: Vec<f32> = (0..kc * W).map(|_| next() / 7.0).collect();
    let p1: Vec<f32> = (0..kc * W).map(|_| next() / 3.0).collect();
    let stride = 3 * W;
    for m in 1..=MR2 {
        for first in [true, false] {
            let start: Vec<f32> = (0..MR2 * stride).map(|_| next()).collect();
            let (mut a, mut b) = (start.clone(), start);
            // SAFETY: the CPU has AVX2, FMA and AVX-512F (checked
            // above); x holds 12 rows of stride d >= kc, each panel
            // kc * 16 floats, a and b 12 rows of stride 48 (32 used).
            unsafe {
                // One panel and at most MR rows at a time (the
                // single-panel tile, whose bits are the AVX2 tile's:
                // tested above).
                for (panel, at) in [(&p0, 0), (&p1, W)] {
                    for i0 in (0..m).step_by(MR) {
                        let (rows, out) = (MR.min(m - i0), &mut a[i0 * stride + at..]);
                        tile_dispatch(rows, W, &x[i0 * d..], d, panel, kc, out, stride, first);
                    }
                }
                tile_pair(m, &x, d, &p0, &p1, kc, &mut b, stride, first);
            }
            assert_eq!(bits(&a), bits(&b), "{m} rows, first {first}");
        }
    }
}

#[test]
fn the_triple_avx512_tile_gives_the_pair_and_half_tiles_bits() {
    if !(available() && std::arch::is_x86_feature_detected!("avx512f")) {
        return;
    }
    let (d, kc) = (300, 256);
    let mut next = uniform(29);
    let x: Vec<f32> = (0..MR3 * d).map(|_| next() * 1e3).collect();
    let p0: Vec<f32> = (0..kc * W).map(|_| next() / 7.0).collect();
    let p1: Vec<f32> = (0..kc * W).map(|_| next() / 3.0).collect();
    let p2: Vec<f32> = (0..kc * W / 2).map(|_| next() / 5.0).collect();
    let stride = 3 * W;
    for m in 1..=MR3 {
        for first in [true, false] {
            let start: Vec<f32> = (0..MR3 * stride).map(|_| next()).collect();
            let (mut a, mut b) = (start.clone(), start);
            // SAFETY: the CPU has AVX2, FMA and AVX-512F (checked
            // above); x holds 8 rows of stride d >= kc, the full panels
            // kc * 16 floats, the half one kc * 8, a and b 8 rows of
            // stride 48 (40 used).
            unsafe {
                tile_pair(m, &x, d, &p0, &p1, kc, &mut a, stride, first);
                tile_dispatch(m, W / 2, &x, d, &p2, kc, &mut a[2 * W..], stride, first);
                tile_triple(m, &x, d, [&p0, &p1, &p2], kc, &mut b, stride, first);
            }
            assert_eq!(bits(&a), bits(&b), "{m} rows, first {first}");
        }
    }
}

/// Whatever the tiles (pairs of panels, a lone or half panel, six or
/// twelve rows, the last rows of a block), every distance has the bits
/// of one fused multiply-add per column in column order, and the
/// nearest centre is the lowest index among equals.
#[test]
fn every_tile_gives_the_bits_of_fused_multiply_adds_in_column_order() {
    if !available() {
        return;
    }
    let mut next = uniform(11);
    for &(n, d, k) in &[
        (1, 5, 4),
        (13, 300, 8),
        (61, 17, 24),
        (50, 1000, 100),
        (97, 257, 40),
        (30, 64, 48),
        (12, 9, 16),
        // Last tiles of 7 to 11 rows.
        (7, 33, 8),
        (9, 40, 16),
        (20, 50, 100),
        (58, 70, 24),
        (59, 21, 48),
        (11, 300, 40),
        // Centres over 1 MiB: blocks of 384 rows, the last one partial.
        (800, 1100, 260),
    ] {
        let x: Vec<f32> = (0..n * d).map(|_| next() * 10.0).collect();
        let mut values: Vec<f32> = (0..k * d).map(|_| next() * 10.0).collect();
        // Two equal centres: the first must win.
        if k > 3 {
            let (a, b) = values.split_at_mut(2 * d);
            b[..d].copy_from_slice(&a[d..2 * d]);
        }
        let norm = |v: &[f32]| v.iter().fold(0f32, |s, &t| t.mul_add(t, s));
        let cn: Vec<f32> = values.chunks_exact(d).map(norm).collect();
        let xn: Vec<f32> = x.chunks_exact(d).map(norm).collect();
        let panels =
            Panels::new_in(k, d, &values, &cn, Vec::new()).expect("the kernel is available");
        let (mut best, mut best_d) = (vec![0u32; n], vec![0f32; n]);
        panels.nearest(&x, &xn, &mut best, &mut best_d);
        for i in 0..n {
            let row = &x[i * d..(i + 1) * d];
            let dots: Vec<f32> = values
                .chunks_exact(d)
                .map(|c| row.iter().zip(c).fold(0f32, |s, (&a, &b)| a.mul_add(b, s)))
                .collect();
            let (b, bd) = argmin(xn[i], &dots, &cn);
            assert_eq!(best[i], b, "n {n}, d {d}, k {k}, row {i}");
            assert_eq!(
                best_d[i].to_bits(),
                bd.to_bits(),
                "n {n}, d {d}, k {k}, row {i}"
            );
        }
    }
}

/// The vector argmins (AVX-512, AVX2) give the scalar loop's centre
/// and bits: ties go to the lowest index, NaN and infinite distances
/// never win over a finite one, and with none finite the answer is
/// centre 0 at +inf.
#[test]
fn the_vector_argmin_gives_the_scalar_loops_answer() {
    let wide = available() && avx512();
    let narrow = std::arch::is_x86_feature_detected!("avx2");
    if !(wide || narrow) {
        return;
    }
    let mut seed = 5u32;
    let mut next = || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        seed >> 8
    };
    for k in [8, 9, 15, 16, 17, 31, 32, 100, 112, 257] {
        for round in 0..200 {
            // Few distinct values, so ties are common.
            let mut dots: Vec<f32> = (0..k).map(|_| (next() % 7) as f32).collect();
            let mut norms: Vec<f32> = (0..k).map(|_| (next() % 5) as f32).collect();
            match round % 6 {
                1 => dots[next() as usize % k] = f32::NAN,
                2 => norms.iter_mut().for_each(|n| *n = f32::INFINITY),
                3 => {
                    dots.iter_mut().for_each(|d| *d = f32::NAN);
                    norms[k - 1] = 0.0;
                }
                4 => {
                    // -inf and signed zeros.
                    norms[next() as usize % k] = f32::NEG_INFINITY;
                    dots[next() as usize % k] = -0.0;
                }
                5 => {
                    // The lengths differ: the shorter one counts.
                    norms.truncate(k - k / 3);
                }
                _ => {}
            }
            let xn = if round % 7 == 0 {
                -0.0
            } else {
                (next() % 9) as f32
            };
            let (sb, sbd) = argmin_from(xn, &dots, &norms, 0, (0, f32::INFINITY));
            if wide && dots.len().min(norms.len()) >= 16 {
                // SAFETY: the CPU supports AVX-512F (checked above).
                let (b, bd) = unsafe { avx512::argmin(xn, &dots, &norms) };
                let got = (b, bd.to_bits());
                assert_eq!(got, (sb, sbd.to_bits()), "AVX-512, k {k}, round {round}");
            }
            if narrow {
                // SAFETY: the CPU supports AVX2 (checked above).
                let (b, bd) = unsafe { avx2::argmin(xn, &dots, &norms) };
                let got = (b, bd.to_bits());
                assert_eq!(got, (sb, sbd.to_bits()), "AVX2, k {k}, round {round}");
            }
        }
    }
}
