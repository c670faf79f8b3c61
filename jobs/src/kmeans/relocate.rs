//! Empty clusters, as scikit-learn relocates them: after a Lloyd
//! iteration's assignment, each centre no point chose takes the point
//! farthest from its own centre, the farthest for the lowest-numbered
//! empty centre.
//!
//! The point leaves its old centre's sums and becomes the empty centre's
//! only point, so the update moves the empty centre onto it (scikit-learn's
//! `_relocate_empty_clusters_dense`). The far points are found by an extra
//! read-only pass over the data, made only in an iteration that left a
//! centre empty: each task keeps its rows' `e` largest distances (`e` the
//! number of empty centres), the tasks' lists are merged, and so are the
//! ranks'. The order is the distance, largest first, then the row index,
//! smallest first: it depends on nothing but the data and the centres, so
//! the relocation is the same capped, uncapped and on any number of ranks.
//! When every row sits on its centre (more centres than distinct rows),
//! nothing moves, as in scikit-learn.

use std::cmp::Ordering;
use std::sync::Arc;

use outcore::Runtime;

use super::assign::{assign_rows, Reduced, Want};
use super::plan::Plan;
use super::{Centers, Dataset, Partition};
use crate::error::Result;

/// A row far from its centre: a candidate to take an empty centre.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Far {
    /// Squared distance to its nearest centre.
    dist: f32,
    /// Global row index.
    row: u64,
    /// Its nearest centre.
    label: u32,
}

/// Farthest first, then the lowest row.
fn farther(a: &Far, b: &Far) -> Ordering {
    b.dist.total_cmp(&a.dist).then(a.row.cmp(&b.row))
}

/// Keeps the `m` farthest of `v`, in order.
fn keep_farthest(v: &mut Vec<Far>, m: usize) {
    if v.len() > m {
        v.select_nth_unstable_by(m, farther);
        v.truncate(m);
    }
    v.sort_unstable_by(farther);
}

/// The centres of `r` no point chose (zero weight), in order.
pub(super) fn empty_centres(r: &Reduced) -> Vec<usize> {
    (0..r.wsum.len()).filter(|&c| r.wsum[c] == 0.0).collect()
}

/// Moves each of the `empty` centres of `r`'s sums (made with centres
/// `c`) onto one of the points farthest from their centres, as the module
/// docs say. Collective. Returns the number of centres relocated.
pub(super) fn relocate(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    c: &Arc<Centers>,
    empty: &[usize],
    r: &mut Reduced,
) -> Result<usize> {
    let e = empty.len();
    let local = farthest(rt, ds, plan, c, e)?;
    let chosen = merge_ranks(plan, &local, e)?;
    if chosen.first().is_none_or(|(far, _)| far.dist <= 0.0) {
        // Every row sits on its centre (more centres than distinct rows):
        // moving one would change nothing but the centres' order.
        return Ok(0);
    }
    let d = c.dims;
    for (&new, &(far, owner)) in empty.iter().zip(&chosen) {
        let (x, w) = row_everywhere(rt, ds, plan, far.row, owner)?;
        let old = far.label as usize;
        for (j, &v) in x.iter().enumerate() {
            let v = w * v;
            r.sums[old * d + j] -= v;
            r.sums[new * d + j] = v;
        }
        r.wsum[new] = w;
        r.wsum[old] -= w;
    }
    Ok(chosen.len())
}

/// This rank's `m` rows farthest from their nearest centres in `c`.
fn farthest(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    c: &Arc<Centers>,
    m: usize,
) -> Result<Vec<Far>> {
    let want = Want {
        labels: true,
        dists: true,
        ..Want::default()
    };
    let (list, _) = plan.chunks_of(&plan.sweep_order());
    let mut b = rt.batch();
    for ch in list {
        let c = c.clone();
        b.read_shared(&ds.parts[ch.part], move |p: &Partition| {
            let (out, _) = assign_rows(p, ch.start, ch.len, &c, want, None);
            let first = p.first_row + ch.start as u64;
            let mut v: Vec<Far> = (out.labels.iter().zip(&out.dists).enumerate())
                .map(|(i, (&label, &dist))| Far {
                    dist,
                    row: first + i as u64,
                    label,
                })
                .collect();
            keep_farthest(&mut v, m);
            v
        });
    }
    let mut all = Vec::new();
    crate::fold_in_order(b, |_, v| {
        all.extend(v);
        keep_farthest(&mut all, m);
        Ok(())
    })?;
    Ok(all)
}

/// The `m` farthest rows of every rank's `local` ones, with the rank that
/// holds each. Collective.
fn merge_ranks(plan: &Plan<'_>, local: &[Far], m: usize) -> Result<Vec<(Far, usize)>> {
    const NONE: u64 = u64::MAX;
    let mut mine = Vec::with_capacity(3 * m);
    for i in 0..m {
        match local.get(i) {
            Some(f) => mine.extend([u64::from(f.dist.to_bits()), f.row, u64::from(f.label)]),
            None => mine.extend([0, NONE, 0]),
        }
    }
    let every = plan.ranks.all_gather_u64(&mine);
    let mut all: Vec<(Far, usize)> = every
        .chunks_exact(3)
        .enumerate()
        .filter(|(_, f)| f[1] != NONE)
        .map(|(i, f)| {
            let far = Far {
                dist: f32::from_bits(f[0] as u32),
                row: f[1],
                label: f[2] as u32,
            };
            (far, i / m)
        })
        .collect();
    all.sort_unstable_by(|a, b| farther(&a.0, &b.0));
    all.truncate(m);
    Ok(all)
}

/// Global row `row`, read by `owner` (the rank that holds it), in f64,
/// and its sample weight, on every rank. Collective. The owner sends
/// whether its read succeeded with the row: when it failed, every rank
/// returns an error (the owner its own), rather than the others waiting
/// for a row that never comes.
pub(super) fn row_everywhere(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    row: u64,
    owner: usize,
) -> Result<(Vec<f64>, f64)> {
    let d = ds.dims;
    // The values, the weight, and 1 for a row read.
    let mut x = vec![0f64; d + 2];
    let mut failed = None;
    if owner == plan.ranks.rank() {
        match read_row(rt, ds, row) {
            Ok((values, w)) => {
                x[..d].copy_from_slice(&values);
                (x[d], x[d + 1]) = (w, 1.0);
            }
            Err(e) => failed = Some(e),
        }
    }
    plan.ranks.broadcast_from(owner, &mut x);
    if let Some(e) = failed {
        return Err(e);
    }
    if x[d + 1] != 1.0 {
        return Err(crate::error::Error::Input(format!(
            "process {owner} of {} could not read row {row} (its own error says why)",
            plan.ranks.size()
        )));
    }
    let w = x[d];
    x.truncate(d);
    Ok((x, w))
}

/// Global row `row` of this rank's data, in f64, and its sample weight.
fn read_row(rt: &Runtime, ds: &Dataset, row: u64) -> Result<(Vec<f64>, f64)> {
    let mut first = ds.first_row;
    for (part, &rows) in ds.part_rows.iter().enumerate() {
        let end = first + u64::from(rows);
        if row < end {
            let i = (row - first) as usize;
            let got = rt.read(&ds.parts[part], move |p: &Partition| {
                let w = p.weights.get(i).map_or(1.0, |&w| f64::from(w));
                (p.row(i).iter().map(|&v| f64::from(v)).collect(), w)
            })?;
            return Ok(got);
        }
        first = end;
    }
    Err(crate::error::Error::Input(format!(
        "row {row} is not among this rank's rows"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn far(dist: f32, row: u64) -> Far {
        Far {
            dist,
            row,
            label: 0,
        }
    }

    #[test]
    fn the_farthest_come_first_and_ties_go_to_the_lowest_row() {
        let mut v = vec![
            far(1.0, 5),
            far(3.0, 9),
            far(3.0, 2),
            far(0.0, 1),
            far(2.0, 7),
        ];
        keep_farthest(&mut v, 3);
        assert_eq!(v, vec![far(3.0, 2), far(3.0, 9), far(2.0, 7)]);
        let mut w = vec![far(1.0, 4)];
        keep_farthest(&mut w, 3);
        assert_eq!(w, vec![far(1.0, 4)]);
    }
}
