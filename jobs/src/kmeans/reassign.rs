//! Mini-batch reassignment, as scikit-learn's `reassignment_ratio`: after
//! a step, the centres whose accumulated weight is under `ratio` times
//! the largest move onto rows of the batch, and their weight becomes the
//! least weight of the others. It is checked every `10 k` rows, and after
//! every step while a centre has no weight at all (an empty one).
//!
//! scikit-learn draws the rows at random. Here each row of the batch gets
//! a key, a hash of the run's seed, the step and its global index, and
//! the rows of the smallest keys are taken: a draw that depends on nothing
//! but those, so the centres are the same capped, uncapped and on any
//! number of ranks. Every rank computes the same keys from the plan alone;
//! the rank holding a chosen row sends it to the others.

use super::plan::Plan;
use super::relocate::row_everywhere;
use super::{Centers, Dataset};
use crate::error::Result;
use crate::input::mix;
use outcore::Runtime;

/// A run's reassignment state.
pub(super) struct Reassign {
    /// `reassignment_ratio` (0: never).
    ratio: f64,
    /// Rows since the last check.
    since: u64,
    seed: u64,
}

impl Reassign {
    pub(super) fn new(ratio: f64, seed: u64) -> Reassign {
        Reassign {
            ratio,
            since: 0,
            seed,
        }
    }

    /// Whether the step about to be made over `rows` rows checks for
    /// centres to reassign, given the weights `totals` before it.
    pub(super) fn due(&mut self, totals: &[f64], rows: u64) -> bool {
        if self.ratio <= 0.0 {
            return false;
        }
        self.since += rows;
        let due = totals.contains(&0.0) || self.since >= 10 * totals.len() as u64;
        if due {
            self.since = 0;
        }
        due
    }

    /// Moves the light centres of `c` (weights `totals`, after step
    /// `step` over batch `b` of `rows` rows) onto rows of that batch, as
    /// the module docs say. Collective. Returns the centres moved.
    pub(super) fn apply(
        &self,
        (rt, ds, plan): (&Runtime, &Dataset, &Plan<'_>),
        c: &mut Centers,
        totals: &mut [f64],
        (b, batch_tasks): (u64, usize),
        rows: u64,
        step: usize,
    ) -> Result<usize> {
        let light = light_centres(totals, self.ratio, rows);
        if light.is_empty() {
            return Ok(0);
        }
        // The step's key: the seed, then the step ("reassign" in ASCII
        // keeps it apart from the seed's other uses).
        let key = mix(mix(self.seed, 0x7265_6173_7369_676e), step as u64);
        let picks = draw(plan, (b, batch_tasks), light.len(), key);
        let d = c.dims;
        for (&j, &(row, owner)) in light.iter().zip(&picks) {
            let (x, _) = row_everywhere(rt, ds, plan, row, owner)?;
            for (v, &x) in c.values[j * d..(j + 1) * d].iter_mut().zip(&x) {
                *v = x as f32;
            }
        }
        let rest = (0..totals.len())
            .filter(|j| light.binary_search(j).is_err())
            .map(|j| totals[j])
            .fold(f64::INFINITY, f64::min);
        for &j in &light[..picks.len()] {
            totals[j] = rest;
        }
        c.refresh();
        Ok(picks.len())
    }
}

/// The centres whose weight is under `ratio` times the largest, at most
/// half the batch's `rows` of them (the lightest, then the lowest index),
/// and never the heaviest (the first of them): with a ratio over 1 every
/// centre would be light, and none left to give the light ones a weight.
fn light_centres(totals: &[f64], ratio: f64, rows: u64) -> Vec<usize> {
    let heaviest = (0..totals.len()).fold(0, |h, j| if totals[j] > totals[h] { j } else { h });
    let max = totals.get(heaviest).copied().unwrap_or(0.0);
    let mut light: Vec<usize> = (0..totals.len())
        .filter(|&j| j != heaviest && totals[j] < ratio * max)
        .collect();
    let most = (rows / 2) as usize;
    if light.len() > most {
        light.sort_by(|&a, &b| totals[a].total_cmp(&totals[b]).then(a.cmp(&b)));
        light.truncate(most);
        light.sort_unstable();
    }
    light
}

/// `m` rows of batch `b` (at most its rows), the smallest keys under
/// `key` first, each with the rank that holds it.
fn draw(plan: &Plan<'_>, (b, batch_tasks): (u64, usize), m: usize, key: u64) -> Vec<(u64, usize)> {
    let mut keyed: Vec<(u64, u64)> = Vec::new();
    for s in 0..plan.shards.count() {
        for t in plan.batch_tasks(s, b, batch_tasks) {
            let first = plan.task_start(t);
            let rows = first..first + plan.task_rows(t);
            keyed.extend(rows.map(|r| (mix(key, r), r)));
        }
    }
    if keyed.len() > m {
        keyed.select_nth_unstable(m);
        keyed.truncate(m);
    }
    keyed.sort_unstable();
    keyed
        .into_iter()
        .map(|(_, r)| (r, plan.rank_of_row(r)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn light_centres_are_under_the_ratio_and_at_most_half_the_batch() {
        let totals = [100.0, 0.5, 0.0, 2.0, 0.9];
        assert_eq!(light_centres(&totals, 0.01, 1000), vec![1, 2, 4]);
        // Two rows: one centre, the lightest.
        assert_eq!(light_centres(&totals, 0.01, 2), vec![2]);
        assert!(
            light_centres(&[0.0, 0.0], 0.01, 100).is_empty(),
            "no weight anywhere"
        );
        // A ratio over 1: all but the heaviest (the first of two).
        assert_eq!(
            light_centres(&[3.0, 5.0, 5.0, 1.0], 2.0, 1000),
            vec![0, 2, 3]
        );
    }

    #[test]
    fn a_check_is_due_every_ten_k_rows_or_while_a_centre_is_empty() {
        let mut r = Reassign::new(0.01, 0);
        assert!(r.due(&[0.0, 1.0], 5), "an empty centre");
        assert!(!r.due(&[1.0, 1.0], 5));
        assert!(!r.due(&[1.0, 1.0], 14));
        assert!(r.due(&[1.0, 1.0], 1), "20 rows for k = 2");
        assert!(!Reassign::new(0.0, 0).due(&[0.0], 5), "ratio 0: never");
    }
}
