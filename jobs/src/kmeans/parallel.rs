//! k-means|| (Bahmani et al., 2012; Spark's and dask-ml's default): the
//! initial centres from a few passes over all the rows, where k-means++
//! (`init.rs`) draws them from a sample.
//!
//! ```text
//!   C = { one row drawn from the seed }
//!   ROUNDS times:
//!     pass: phi = sum over the rows of w(x) d(x, C)^2
//!     pass: row x joins C when u(seed, round, x) * phi < l * w(x) d(x, C)^2
//!   pass: each candidate's weight, that of the rows nearest it
//!   weighted greedy k-means++ over the candidates, in memory
//! ```
//!
//! `l` = [`OVERSAMPLING`] x k candidates are expected per round, and two
//! rounds, as Spark's defaults (`initializationSteps` 2, oversampling 2):
//! five passes in all. Every pass finds each row's nearest candidate with
//! Lloyd's kernel, so a round costs about two Lloyd iterations at `2k`
//! centres and the weighting one at `4k`.
//!
//! The result depends on nothing but the data and the seed: `phi` and the
//! weights are each task's sum added in task order within a shard and the
//! shards in order (as Lloyd's sums), the draw `u` hashes the row's index
//! with the seed, and the candidates are taken in row order. So it is the
//! same capped, uncapped and on any number of ranks.

use std::sync::Arc;

use rand::rngs::Xoshiro256PlusPlus;
use rand::SeedableRng;

use outcore::Runtime;

use super::assign::{add, assign_rows, Want};
use super::plan::{Chunk, Plan};
use super::{Centers, Config, Dataset, Partition};
use crate::error::{Error, Result};
use crate::input::mix;

/// Rounds of candidate draws.
pub(super) const ROUNDS: usize = 2;
/// Candidates expected per round, per cluster.
pub(super) const OVERSAMPLING: usize = 2;

/// Candidates budgeted for: the expected `1 + ROUNDS x OVERSAMPLING x k`
/// and a quarter more (the draws are random), at most the rows.
fn most_candidates(rows: u64, k: usize) -> u64 {
    let expected = 1 + (ROUNDS * OVERSAMPLING * k) as u64;
    rows.min(expected + expected / 4)
}

/// Bytes the initialisation holds besides the data: the candidates
/// (their values as rows and packed for the kernel, and a round's draws
/// twice while they are gathered: three copies of a row at most), their
/// weights, and the k-means++ over them (distances and groups per
/// candidate).
pub(super) fn scratch_bytes(rows: u64, dims: usize, k: usize) -> u64 {
    let m = most_candidates(rows, k);
    m * (12 * dims as u64 + 64) + super::prune::Groups::bytes(m, k)
}

/// The initial centres and the data's mean per-feature variance (the
/// scale of the mini-batch tolerance). Collective.
pub(super) fn initial_centers(
    rt: &Runtime,
    ds: &Dataset,
    cfg: &Config,
    plan: &Plan<'_>,
    seed: u64,
) -> Result<(Centers, f64)> {
    let (d, k) = (ds.dims, cfg.k);
    let l = (OVERSAMPLING * k) as f64;
    let first = first_row(rt, ds, plan, seed)?;
    let mut cand = Candidates {
        values: first.0.iter().map(|&v| v as f32).collect(),
        weights: Vec::new(),
    };
    let mut variance = 0.0;
    for round in 0..ROUNDS {
        // The candidates lent to the passes as centres, and taken back
        // (no second copy of them: at 10,000-D, 4k of them are 160 MB).
        let m = cand.len(d);
        let c = Arc::new(Centers::new(m, d, std::mem::take(&mut cand.values)));
        let reference = (round == 0).then(|| c.values[..d].to_vec());
        let (phi, v) = total_cost(rt, ds, plan, &c, reference)?;
        if round == 0 {
            variance = v;
        }
        let key = seed ^ 0x6b6d_7c7c ^ ((round as u64) << 56);
        // phi = 0: every row sits on a candidate, and no draw can add one.
        let picked = match phi > 0.0 {
            true => draw(rt, ds, plan, &c, key, l / phi)?,
            false => Vec::new(),
        };
        cand.values = take_values(c)?;
        cand.values.extend_from_slice(&picked);
        if phi <= 0.0 {
            break;
        }
    }
    let m = cand.len(d);
    let c = Arc::new(Centers::new(m, d, std::mem::take(&mut cand.values)));
    cand.weights = candidate_weights(rt, ds, plan, &c)?;
    cand.values = take_values(c)?;
    let positive = cand.weights.iter().filter(|&&w| w > 0.0).count();
    if positive < k {
        return Err(Error::Input(format!(
            "k-means|| found {positive} distinct candidates with a positive weight for k = {k}: the data has fewer distinct points than clusters (k-means++ draws from a sample instead)"
        )));
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x1717_c0de);
    let chosen = super::init::kmeans_plus_plus(
        (&cand.values, d),
        k,
        Some(&cand.weights),
        &mut rng,
        (rt.workers(), true),
    )?;
    let mut values = Vec::with_capacity(k * d);
    for &i in &chosen {
        values.extend_from_slice(&cand.values[i * d..(i + 1) * d]);
    }
    plan.ranks.broadcast(&mut values);
    Ok((Centers::new(k, d, values), variance))
}

/// The values of centres lent to the passes, once they are back.
fn take_values(c: Arc<Centers>) -> Result<Vec<f32>> {
    Arc::into_inner(c)
        .map(|c| c.values)
        .ok_or_else(|| Error::Input("internal: k-means|| candidates still lent".into()))
}

/// The candidates so far: `len` rows of values, and (after the last pass)
/// their weights.
struct Candidates {
    values: Vec<f32>,
    weights: Vec<f64>,
}

impl Candidates {
    fn len(&self, d: usize) -> usize {
        self.values.len() / d.max(1)
    }
}

/// The row the draws start from: one drawn uniformly with the seed, read
/// by the rank that holds it and sent to every rank.
fn first_row(rt: &Runtime, ds: &Dataset, plan: &Plan<'_>, seed: u64) -> Result<(Vec<f64>, f64)> {
    let row = mix(seed ^ 0x0f17_57c0, 0) % ds.rows.max(1);
    super::relocate::row_everywhere(rt, ds, plan, row, plan.rank_of_row(row))
}

/// Runs `task` on every chunk of this rank's rows (read-only, side by
/// side), and hands each result to `each` in the sweep's order with the
/// chunk's local shard: every shard's chunks come in row order.
fn sweep<R: Send + 'static>(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    task: impl Fn(&Partition, Chunk) -> R + Send + Sync + 'static,
    mut each: impl FnMut(usize, R) -> Result<()>,
) -> Result<()> {
    let (list, owner) = plan.chunks_of(&plan.sweep_order());
    let task = Arc::new(task);
    let mut b = rt.batch();
    for ch in list {
        let task = task.clone();
        b.read_shared(&ds.parts[ch.part], move |p: &Partition| task(p, ch));
    }
    crate::fold_in_order(b, |i, r| each(owner[i], r))
}

/// `phi`, the (weighted) sum of the rows' squared distances to their
/// nearest centre in `c`; and with a `reference` row, the data's mean
/// per-feature variance from the column sums around it (else 0).
fn total_cost(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    c: &Arc<Centers>,
    reference: Option<Vec<f32>>,
) -> Result<(f64, f64)> {
    let d = ds.dims;
    let len = 1 + if reference.is_some() { 2 * d } else { 0 };
    let local = plan.mine.len();
    let mut shards = vec![vec![0f64; len]; local];
    let (c2, reference) = (c.clone(), reference.map(Arc::new));
    let task = move |p: &Partition, ch: Chunk| {
        let r = reference.as_deref().map(Vec::as_slice);
        let (out, _) = assign_rows(p, ch.start, ch.len, &c2, Want::default(), r);
        let mut v = Vec::with_capacity(len);
        v.push(out.inertia);
        v.extend(&out.colsum);
        v.extend(&out.colsq);
        v
    };
    sweep(rt, ds, plan, task, |s, v| {
        add(&mut shards[s], &v);
        Ok(())
    })?;
    let all = plan.ranks.ordered_sum(&shards, len)?;
    let variance = if len > 1 {
        let n = ds.rows as f64;
        let (s1, s2) = all[1..].split_at(d);
        s1.iter()
            .zip(s2)
            .map(|(a, b)| (b / n - (a / n) * (a / n)).max(0.0))
            .sum::<f64>()
            / d as f64
    } else {
        0.0
    };
    Ok((all[0], variance))
}

/// The rows of every rank drawn in one round, in row order: row `x` with
/// `u(key, x) < scale * w(x) * d(x, c)^2`, `u` uniform in (0, 1].
fn draw(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    c: &Arc<Centers>,
    key: u64,
    scale: f64,
) -> Result<Vec<f32>> {
    let d = ds.dims;
    let c2 = c.clone();
    let task = move |p: &Partition, ch: Chunk| {
        let want = Want {
            dists: true,
            ..Want::default()
        };
        let (out, _) = assign_rows(p, ch.start, ch.len, &c2, want, None);
        let first = p.first_row + ch.start as u64;
        let mut picked: Vec<(u64, Vec<f32>)> = Vec::new();
        for (i, &d2) in out.dists.iter().enumerate() {
            let w = p.weights.get(ch.start + i).map_or(1.0, |&w| f64::from(w));
            let u = ((mix(key, first + i as u64) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            if u < scale * w * f64::from(d2) {
                picked.push((first + i as u64, p.row(ch.start + i).to_vec()));
            }
        }
        picked
    };
    let mut mine: Vec<(u64, Vec<f32>)> = Vec::new();
    sweep(rt, ds, plan, task, |_, v| {
        mine.extend(v);
        Ok(())
    })?;
    mine.sort_unstable_by_key(|(row, _)| *row);
    // Ranks hold rows in rank order: their lists, concatenated, are in
    // row order.
    let rows: Vec<u32> = mine
        .iter()
        .flat_map(|(r, _)| [(r >> 32) as u32, *r as u32])
        .collect();
    let values: Vec<f32> = mine.into_iter().flat_map(|(_, v)| v).collect();
    if plan.ranks.size() == 1 {
        return Ok(values);
    }
    let all_rows = plan.ranks.all_gather_u32(&rows)?;
    let all = plan.ranks.all_gather(&values)?;
    if all.len() != all_rows.len() / 2 * d {
        return Err(Error::Input(format!(
            "internal: k-means|| gathered {} values for {} rows",
            all.len(),
            all_rows.len() / 2
        )));
    }
    Ok(all)
}

/// Each candidate's weight: the (sample) weights of the rows nearest it.
fn candidate_weights(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    c: &Arc<Centers>,
) -> Result<Vec<f64>> {
    let m = c.k;
    let mut shards = vec![vec![0f64; m]; plan.mine.len()];
    let c2 = c.clone();
    let task = move |p: &Partition, ch: Chunk| {
        let (out, _) = assign_rows(p, ch.start, ch.len, &c2, Want::default(), None);
        out.wsum
    };
    sweep(rt, ds, plan, task, |s, v| {
        add(&mut shards[s], &v);
        Ok(())
    })?;
    plan.ranks.ordered_sum(&shards, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_covers_the_expected_candidates_and_stops_at_the_rows() {
        assert_eq!(most_candidates(1_000_000, 100), 501);
        assert_eq!(most_candidates(300, 100), 300);
        assert!(scratch_bytes(1_000_000, 64, 100) > 501 * 8 * 64);
    }
}
