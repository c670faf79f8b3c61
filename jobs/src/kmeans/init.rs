//! The initial centres: k-means++ or random draws on a sample of the
//! rows, or given centres; the sample, read from the partitions or row by
//! row from the input.

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use outcore::Runtime;

use super::assign::add;
use super::prune::Groups;
use super::sqdist::distances;
use super::{Algorithm, Centers, Config, Dataset, Init, Partition};
use crate::error::{Error, Result};
use crate::input::mix;
use crate::ranks::Ranks;

/// Points sampled for the initialisation: at least 10,000 and 20 per
/// cluster, at most all of them, and at most [`SAMPLE_BYTES`] of them
/// (but 3 per cluster, as scikit-learn's `MiniBatchKMeans` takes, at
/// least). The sample is held outside the executors, and its size must
/// not depend on the cap (capped and uncapped runs start from the same
/// centres): at the seed's shape (k = 1000, 10,000 dimensions) 20 per
/// cluster were 800 MB, most of the data.
fn sample_size(rows: u64, dims: usize, k: usize) -> u64 {
    let k = k as u64;
    let wanted = (20 * k).max(10_000);
    let by_bytes = (SAMPLE_BYTES / (4 * dims.max(1) as u64)).max(3 * k);
    rows.min(wanted).min(by_bytes)
}

/// The initialisation's sample takes at most this many bytes (see
/// [`sample_size`]).
const SAMPLE_BYTES: u64 = 128 << 20;

/// Bytes k-means++ works with besides its sample of `rows` of `dims`
/// columns for `k` clusters: each sampled row's distances (to its nearest
/// centre, to each candidate, and the best candidate's) and weights, and
/// the rows' groups with the bounds between centres (`prune.rs`).
pub(super) fn plus_plus_scratch(rows: u64, dims: usize, k: usize) -> u64 {
    let n = sample_size(rows, dims, k);
    let trials = 2 + (k as f64).ln() as u64;
    n * (4 * (3 + trials) + 8 + 4 + 8) + Groups::bytes(n, k) + trials * k as u64 * 17
}

/// Bytes the k-means++ or random initialisation's sample of `rows` points
/// of `dims` float32 takes, for `k` clusters. It is held outside the
/// executors while the initialisation runs (it does not depend on the cap,
/// so that capped and uncapped runs start from the same centres).
pub fn init_sample_bytes(rows: u64, dims: usize, k: usize) -> u64 {
    sample_size(rows, dims, k) * dims as u64 * 4
}

/// A sample is read row by row from the input (rather than from the built
/// partitions) when it holds at most one row in this many (and the pages
/// under its rows are at most a quarter of the file's: see
/// `Partitioned::rows_unbuilt`).
const SPARSE: u64 = 4;

/// A uniform sample of rows, chosen by hashing the row index with the seed
/// (so it does not depend on the partitioning), in row order: the values,
/// and the rows' sample weights (empty when the data has none). Every
/// rank gets the whole sample.
fn sample(
    rt: &Runtime,
    ds: &Dataset,
    ranks: &Ranks,
    want: u64,
    seed: u64,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let threshold = if want >= ds.rows {
        u64::MAX
    } else {
        ((want as u128 * (1u128 << 64)) / ds.rows as u128) as u64
    };
    let picked = move |r: u64| threshold == u64::MAX || mix(seed ^ 0x5a3b_1e00, r) < threshold;
    // A sparse sample of partitions not built yet is read row by row from
    // the input: the whole input is then read once, by the first sweep,
    // while the workers compute, instead of once more for the sample.
    let local = ds.part_rows.iter().map(|&n| u64::from(n)).sum::<u64>();
    let direct = if want.saturating_mul(SPARSE) <= ds.rows && ds.rows_readable() {
        let rows: Vec<u64> = (ds.first_row..ds.first_row + local)
            .filter(|&r| picked(r))
            .collect();
        ds.rows_unbuilt(&rows)?
    } else {
        None
    };
    let (mut x, mut w) = match direct {
        Some(xw) => xw,
        None => {
            let mut b = rt.batch();
            for h in &ds.parts {
                b.read(h, move |p: &Partition| {
                    let mut out = Vec::new();
                    let mut w = Vec::new();
                    for i in 0..p.rows as usize {
                        if picked(p.first_row + i as u64) {
                            out.extend_from_slice(p.row(i));
                            if !p.weights.is_empty() {
                                w.push(p.weights[i]);
                            }
                        }
                    }
                    (out, w)
                });
            }
            let (mut x, mut w) = (Vec::new(), Vec::new());
            crate::fold_in_order(b, |_, (a, b)| {
                x.extend_from_slice(&a);
                w.extend_from_slice(&b);
                Ok(())
            })?;
            (x, w)
        }
    };
    if ranks.size() > 1 {
        x = ranks.all_gather(&x)?;
        w = ranks.all_gather(&w)?;
    }
    Ok((x, w))
}

/// Mean over the columns of each column's variance, in f64.
fn mean_variance(s: &[f32], d: usize) -> f64 {
    let n = (s.len() / d.max(1)) as f64;
    if n == 0.0 || d == 0 {
        return 0.0;
    }
    let mut mean = vec![0f64; d];
    for r in s.chunks_exact(d) {
        add(
            &mut mean,
            &r.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        );
    }
    mean.iter_mut().for_each(|m| *m /= n);
    let mut var = 0f64;
    for r in s.chunks_exact(d) {
        for (v, m) in r.iter().zip(&mean) {
            let t = f64::from(*v) - m;
            var += t * t;
        }
    }
    var / n / d as f64
}

/// Draws an index with probability proportional to `w` (`total` their
/// sum): the first whose running sum passes `r * total`; never one of
/// weight 0.
fn draw(w: &[f64], total: f64, r: f64) -> Option<usize> {
    let mut left = r * total;
    let mut last = None;
    for (i, &v) in w.iter().enumerate() {
        if v > 0.0 {
            if left < v {
                return Some(i);
            }
            left -= v;
            last = Some(i);
        }
    }
    // Rounding left a little over: the last candidate.
    last
}

/// The initial centres of a run drawn with `seed`, and the mean
/// per-feature variance of the initialisation sample (the scale of the
/// mini-batch tolerance).
pub(super) fn initial_centers(
    rt: &Runtime,
    ds: &Dataset,
    cfg: &Config,
    ranks: &Ranks,
    seed: u64,
) -> Result<(Centers, f64)> {
    let d = ds.dims;
    let k = cfg.k;
    if let Init::Given(v) = &cfg.init {
        return given(rt, ds, cfg, ranks, seed, v);
    }
    let want = sample_size(ds.rows, d, k);
    // Room for the sample, its pieces and the distances.
    rt.make_room(want as usize * (d * 8 + 16));
    let (s, sw) = sample_of_k(rt, ds, ranks, want, seed, k)?;
    let n = s.len() / d;
    let variance = mean_variance(&s, d);
    // Equal weights are no weights: the same draws as unweighted data.
    let weights: Option<Vec<f64>> = match sw.first() {
        Some(&w0) if sw.iter().any(|&w| w != w0) => {
            Some(sw.iter().map(|&w| f64::from(w)).collect())
        }
        _ => None,
    };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x1717_c0de);
    let chosen = match (&cfg.init, &weights) {
        (Init::Random, None) => random(n, k, &mut rng),
        (Init::Random, Some(w)) => random_weighted(w, k, &mut rng)?,
        _ => kmeans_plus_plus(
            (&s, d),
            k,
            weights.as_deref(),
            &mut rng,
            (rt.workers(), true),
        )?,
    };
    let mut values = Vec::with_capacity(k * d);
    for &i in &chosen {
        values.extend_from_slice(&s[i * d..(i + 1) * d]);
    }
    // Every rank drew the same centres from the same sample; rank 0's are
    // the ones used everywhere all the same (a rank on another CPU model
    // cannot drift).
    ranks.broadcast(&mut values);
    Ok((Centers::new(k, d, values), variance))
}

/// Given centres `v`, checked; and for a mini-batch run with a tolerance,
/// the variance of a sample drawn with `seed`.
fn given(
    rt: &Runtime,
    ds: &Dataset,
    cfg: &Config,
    ranks: &Ranks,
    seed: u64,
    v: &[f32],
) -> Result<(Centers, f64)> {
    let (d, k) = (ds.dims, cfg.k);
    if v.len() != k * d {
        return Err(Error::Input(format!(
            "the initial centres hold {} values; k x dims = {k} x {d} needs {}",
            v.len(),
            k * d
        )));
    }
    let variance = if cfg.tol > 0.0 && cfg.algorithm == Algorithm::MiniBatch {
        let want = sample_size(ds.rows, d, k);
        mean_variance(&sample(rt, ds, ranks, want, seed)?.0, d)
    } else {
        0.0
    };
    Ok((Centers::new(k, d, v.to_vec()), variance))
}

/// A [`sample`] of about `want` rows with at least `k` of positive weight:
/// a sparse hash sample can fall short for `k` close to the number of
/// points, and every point is taken then.
fn sample_of_k(
    rt: &Runtime,
    ds: &Dataset,
    ranks: &Ranks,
    want: u64,
    seed: u64,
    k: usize,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let positive = |(s, sw): &(Vec<f32>, Vec<f32>)| {
        if sw.is_empty() {
            s.len() / ds.dims
        } else {
            sw.iter().filter(|&&w| w > 0.0).count()
        }
    };
    let mut sample_w = sample(rt, ds, ranks, want, seed)?;
    if positive(&sample_w) < k {
        sample_w = sample(rt, ds, ranks, ds.rows, seed)?;
        if positive(&sample_w) < k {
            return Err(Error::Input(format!(
                "k = {k} is larger than the number of points with a positive weight ({})",
                positive(&sample_w)
            )));
        }
    }
    Ok(sample_w)
}

/// `k` distinct indices of `0..n`, drawn uniformly.
fn random(n: usize, k: usize, rng: &mut Xoshiro256PlusPlus) -> Vec<usize> {
    let mut chosen = Vec::with_capacity(k);
    let mut idx: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let j = i + (rng.random::<u64>() % (n - i) as u64) as usize;
        idx.swap(i, j);
        chosen.push(idx[i]);
    }
    chosen
}

/// `k` distinct indices of `w`, drawn without replacement, each draw
/// proportional to the weight.
fn random_weighted(w: &[f64], k: usize, rng: &mut Xoshiro256PlusPlus) -> Result<Vec<usize>> {
    let mut chosen = Vec::with_capacity(k);
    let mut left = w.to_vec();
    for _ in 0..k {
        let total: f64 = left.iter().sum();
        let pick = draw(&left, total, rng.random::<f64>())
            .ok_or_else(|| Error::Input("no point with a positive weight left".into()))?;
        left[pick] = 0.0;
        chosen.push(pick);
    }
    Ok(chosen)
}

/// Greedy k-means++ on the sample `s` (`d` columns), weighted by `w` when
/// given: the first centre is drawn with probability proportional to the
/// weight; each next one with probability proportional to the weight times
/// the squared distance to the nearest chosen centre; of 2 + ln(k) such
/// draws, the one that lowers the (weighted) total most is kept. Returns
/// the indices of the chosen rows.
pub(super) fn kmeans_plus_plus(
    (s, d): (&[f32], usize),
    k: usize,
    w: Option<&[f64]>,
    rng: &mut Xoshiro256PlusPlus,
    (threads, prune): (usize, bool),
) -> Result<Vec<usize>> {
    let n = s.len() / d;
    let trials = 2 + (k as f64).ln() as usize;
    let threads = threads.max(1);
    let weight = |i: usize| w.map_or(1.0, |w| w[i]);
    let first = match w {
        None => (rng.random::<u64>() % n as u64) as usize,
        Some(w) => {
            let total: f64 = w.iter().sum();
            draw(w, total, rng.random::<f64>())
                .ok_or_else(|| Error::Input("no point has a positive weight".into()))?
        }
    };
    let mut chosen = Vec::with_capacity(k);
    chosen.push(first);
    let mut best = distances((s, d), &[first], threads, |_, _| true);
    let mut groups = Groups::new(&best, k, prune);
    let mut tries = Tries {
        cand_d: vec![0f32; n],
        keep_d: vec![0f32; n],
        mass: vec![0f64; if w.is_some() { n } else { 0 }],
    };
    while chosen.len() < k {
        let total = tries.total(&best, w);
        if total <= 0.0 {
            // Every remaining point (of positive weight) coincides with a
            // centre.
            let next = (0..n)
                .find(|&i| !chosen.contains(&i) && weight(i) > 0.0)
                .or_else(|| (0..n).find(|i| !chosen.contains(i)))
                .unwrap_or(0);
            groups.add((s, d), (&chosen, next), None, (&best, &best));
            chosen.push(next);
            continue;
        }
        // The draws depend only on `best`: draw them all, then measure
        // every candidate in one parallel pass, where it may move a row.
        let picks: Vec<usize> = (0..trials)
            .map(|_| tries.draw(&best, w, total, rng).unwrap_or(first))
            .collect();
        let live = groups.live((s, d), &chosen, &picks, &best);
        let dist = groups.distances((s, d), &picks, &live, threads);
        let Some(pick) = tries.best(&best, w, &picks, &dist) else {
            break;
        };
        let t = picks.iter().position(|&p| p == pick).unwrap_or(0);
        let after = (&best[..], &tries.keep_d[..]);
        groups.add((s, d), (&chosen, pick), Some((&live, t)), after);
        chosen.push(pick);
        std::mem::swap(&mut best, &mut tries.keep_d);
    }
    Ok(chosen)
}

/// k-means++'s scratch: the distances of a candidate and of the best one
/// so far, and the weighted squared distances.
struct Tries {
    cand_d: Vec<f32>,
    keep_d: Vec<f32>,
    mass: Vec<f64>,
}

impl Tries {
    /// The (weighted) total of the squared distances `best`; with weights,
    /// each row's share is left in `mass`.
    fn total(&mut self, best: &[f32], w: Option<&[f64]>) -> f64 {
        match w {
            None => best.iter().map(|&v| f64::from(v)).sum(),
            Some(w) => {
                for (m, (&b, &wi)) in self.mass.iter_mut().zip(best.iter().zip(w)) {
                    *m = wi * f64::from(b);
                }
                self.mass.iter().sum()
            }
        }
    }

    /// A row drawn with probability proportional to its share of `total`
    /// (`None`: rounding left no weighted candidate).
    fn draw(
        &self,
        best: &[f32],
        w: Option<&[f64]>,
        total: f64,
        rng: &mut Xoshiro256PlusPlus,
    ) -> Option<usize> {
        match w {
            None => {
                let mut r = rng.random::<f64>() * total;
                for (i, &b) in best.iter().enumerate() {
                    if r < f64::from(b) {
                        return Some(i);
                    }
                    r -= f64::from(b);
                }
                Some(best.len() - 1)
            }
            Some(_) => draw(&self.mass, total, rng.random::<f64>()),
        }
    }

    /// Of the candidates `picks` (their squared distances to every row in
    /// `dist`, row-major), the one that lowers the (weighted) total most;
    /// the rows' distances to their nearest centre with it are left in
    /// `keep_d`.
    fn best(
        &mut self,
        best: &[f32],
        w: Option<&[f64]>,
        picks: &[usize],
        dist: &[f32],
    ) -> Option<usize> {
        let trials = picks.len();
        let mut winner: Option<(f64, usize)> = None;
        for (t, &pick) in picks.iter().enumerate() {
            let mut pot = 0f64;
            for (i, c) in self.cand_d.iter_mut().enumerate() {
                *c = best[i].min(dist[i * trials + t]);
                pot += match w {
                    None => f64::from(*c),
                    Some(w) => w[i] * f64::from(*c),
                };
            }
            if winner.is_none_or(|(v, _)| pot < v) {
                winner = Some((pot, pick));
                std::mem::swap(&mut self.keep_d, &mut self.cand_d);
            }
        }
        winner.map(|(_, pick)| pick)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Source;
    use crate::kmeans::load;
    use crate::Session;

    /// A sparse sample of a file not read yet is read row by row (only
    /// the pages under its rows: well under the file), and it is the
    /// sample the built partitions give, bit for bit: `.npy` rows (in
    /// place), sample weights, `.fvecs` rows (converted).
    #[test]
    fn a_sparse_sample_read_row_by_row_is_the_partitions_sample() {
        let dir = tempfile::tempdir().unwrap();
        let (n, d) = (20_000usize, 256usize);
        let x: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7919) % 1000) as f32 / 10.0 - 50.0)
            .collect();
        let npy = dir.path().join("x.npy");
        crate::npy::write_array(&npy, &[n as u64, d as u64], &x).unwrap();
        let fvecs = dir.path().join("x.fvecs");
        let mut bytes = Vec::with_capacity(n * (d + 1) * 4);
        for row in x.chunks_exact(d) {
            bytes.extend_from_slice(&(d as i32).to_le_bytes());
            for v in row {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        std::fs::write(&fvecs, bytes).unwrap();
        let weights = dir.path().join("w.npy");
        let w: Vec<f32> = (0..n).map(|i| 0.25 + (i % 5) as f32).collect();
        crate::npy::write_array(&weights, &[n as u64], &w).unwrap();
        let ranks = Ranks::single();
        for (name, src, wpath) in [
            ("npy", Source::Npy(npy.clone()), None),
            (
                "npy, weighted",
                Source::Npy(npy.clone()),
                Some(weights.as_path()),
            ),
            ("fvecs", Source::Fvecs(fvecs.clone()), None),
        ] {
            let session = Session::new(
                Runtime::builder()
                    .workers(2)
                    .prefetch(false)
                    .build()
                    .unwrap(),
            );
            let rt = session.runtime();
            let ds = load(&session, &src, wpath, None, 256 << 10, |_, _| {}).unwrap();
            let file = match &src {
                Source::Npy(p) | Source::Fvecs(p) => std::fs::metadata(p).unwrap().len(),
                _ => unreachable!(),
            };
            let (x1, w1) = sample(rt, &ds, &ranks, 500, 7).unwrap();
            let read = ds.input_bytes_read();
            assert!(
                read > 0 && read * 8 < file,
                "{name}: the sparse sample read {read} of {file} bytes"
            );
            assert!(
                x1.len() > 100 * d && x1.len() % d == 0,
                "{name}: {}",
                x1.len()
            );
            assert_eq!(w1.len(), if wpath.is_some() { x1.len() / d } else { 0 });
            // Every partition built (and resident: no cap): the same
            // sample comes from them, with no read of the file.
            let mut b = rt.batch();
            for h in &ds.parts {
                b.read(h, |p: &Partition| p.rows);
            }
            b.run().unwrap();
            let before = ds.input_bytes_read();
            let (x2, w2) = sample(rt, &ds, &ranks, 500, 7).unwrap();
            assert_eq!(ds.input_bytes_read(), before, "{name}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert!(bits(&x1) == bits(&x2), "{name}: the samples differ");
            assert!(bits(&w1) == bits(&w2), "{name}: the weights differ");
        }
    }

    /// The AVX2 path gives the baseline's bits, for every length around
    /// the lane count.
    /// k-means++ that leaves out the rows a trial cannot move chooses the
    /// same centres as the plain one: clustered rows (where most are
    /// left out), duplicates (radii of zero), tiny and huge scales,
    /// weights, any thread count.
    #[test]
    fn pruned_kmeans_plus_plus_chooses_the_plain_ones_centres() {
        let mut z = 0x2545_f491_u32;
        let mut next = move || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            z as f32 / u32::MAX as f32 - 0.5
        };
        for (case, (n, d, blobs, scale)) in [
            (600, 37, 12, 1.0f32),
            (500, 8, 40, 1e-15),
            (400, 64, 5, 1e12),
            (300, 3, 300, 1.0),
        ]
        .into_iter()
        .enumerate()
        {
            let centres: Vec<f32> = (0..blobs * d).map(|_| 40.0 * next()).collect();
            let mut s = Vec::with_capacity(n * d);
            for i in 0..n {
                let b = i % blobs;
                // Every fifth row sits on its blob's centre (duplicates).
                let spread = if i % 5 == 0 { 0.0 } else { 1.0 };
                s.extend((0..d).map(|j| scale * (centres[b * d + j] + spread * next())));
            }
            let w: Vec<f64> = (0..n).map(|i| 0.5 + (i % 7) as f64).collect();
            let ks = [
                (blobs.min(n), None),
                (2 * blobs.min(n / 3), Some(&w[..])),
                // Many centres a blob: small radii, far blobs (the bounds
                // taken without measuring).
                ((6 * blobs).min(n / 2), None),
            ];
            for (k, weights) in ks {
                for threads in [1, 3] {
                    let run = |prune| {
                        let mut rng = Xoshiro256PlusPlus::seed_from_u64(case as u64);
                        kmeans_plus_plus((&s, d), k, weights, &mut rng, (threads, prune)).unwrap()
                    };
                    assert_eq!(
                        run(true),
                        run(false),
                        "case {case}, k {k}, {threads} threads"
                    );
                }
            }
        }
    }
}
