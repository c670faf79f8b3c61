//! The one synthetic-data generator: Gaussian blobs, each point a function
//! of the seed and its index only.

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use rand_distr::StandardNormal;

/// Gaussian blobs: centres uniform in `[-10, 10]^dims`, unit variance.
#[derive(Clone, Debug)]
pub(crate) struct Blobs {
    dims: usize,
    centres: Vec<f32>,
    true_k: usize,
    seed: u64,
}

impl Blobs {
    /// The blob model for a seed (`true_k` at least 1).
    pub(crate) fn new(dims: usize, true_k: usize, seed: u64) -> Blobs {
        let true_k = true_k.max(1);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0xb10b_5eed);
        let centres = (0..true_k * dims)
            .map(|_| rng.random_range(-10.0f32..10.0))
            .collect();
        Blobs {
            dims,
            centres,
            true_k,
            seed,
        }
    }

    /// Columns.
    pub(crate) fn dims(&self) -> usize {
        self.dims
    }

    /// The blob point `i` belongs to.
    pub(crate) fn label(&self, i: u64) -> u32 {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(mix(self.seed, i));
        (rng.random::<u64>() % self.true_k as u64) as u32
    }

    /// Appends point `i`.
    fn point(&self, i: u64, out: &mut Vec<f32>) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(mix(self.seed, i));
        let blob = (rng.random::<u64>() % self.true_k as u64) as usize;
        let c = &self.centres[blob * self.dims..(blob + 1) * self.dims];
        out.extend(c.iter().map(|&m| m + rng.sample::<f32, _>(StandardNormal)));
    }

    /// Appends points `first..first + n`, on this thread.
    pub(crate) fn points(&self, first: u64, n: usize, out: &mut Vec<f32>) {
        out.reserve(n * self.dims);
        for i in first..first + n as u64 {
            self.point(i, out);
        }
    }

    /// Appends points `first..first + n`, generated in consecutive pieces
    /// on up to `threads` threads (the same values as [`Blobs::points`]:
    /// a point does not depend on who generates it).
    pub(crate) fn points_parallel(&self, first: u64, n: usize, threads: usize, out: &mut Vec<f32>) {
        // Pieces of at least 64 Ki values, so small reads stay on this
        // thread.
        let min_rows = ((64 << 10) / self.dims.max(1)).max(1);
        let per = n.div_ceil(threads.max(1)).max(min_rows);
        if per >= n {
            return self.points(first, n, out);
        }
        let mut pieces: Vec<Vec<f32>> = (0..n).step_by(per).map(|_| Vec::new()).collect();
        let work: Vec<_> = (0..n).step_by(per).zip(pieces.iter_mut()).collect();
        crate::par::for_each(work, threads, |(s, v)| {
            let len = per.min(n - s);
            v.reserve_exact(len * self.dims);
            self.points(first + s as u64, len, v);
        });
        out.reserve(n * self.dims);
        for p in &pieces {
            out.extend_from_slice(p);
        }
    }
}

/// A 64-bit mix of two values (splitmix64 finaliser): the hash behind
/// every per-row random choice (a point's blob, the held-out split, the
/// K-means sample), so none depends on the partitioning.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_points_are_the_serial_points() {
        let b = Blobs::new(3, 4, 9);
        let mut serial = Vec::new();
        b.points(5, 100_000, &mut serial);
        let mut parallel = Vec::new();
        b.points_parallel(5, 100_000, 4, &mut parallel);
        assert!(serial == parallel);
        assert_eq!(b.label(7), b.label(7));
    }
}
