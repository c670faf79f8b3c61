//! k-means++ without measuring what cannot change: the triangle
//! inequality, exactly.
//!
//! A trial centre `c` lowers a sample row's distance only when it is
//! nearer to the row than the row's nearest chosen centre `a`. The rows
//! are grouped by that centre, with the group's radius `r` (the largest
//! such distance among its rows): when `|c - a| >= 2 r`, then for every
//! row `x` of the group `|x - c| >= |c - a| - |x - a| >= r >= |x - a|`,
//! and the row is not read at all. `|c - a|` itself is often bounded
//! without being measured: the trial is a sample row, at a known distance
//! from its own group's centre `h`, and `|c - a| >= |a - h| - |c - h|`,
//! where `|a - h|` is measured once, when the later of the two centres
//! is chosen (bounds of bounds would weaken step after step).
//!
//! The distances that are measured are measured as before, and those
//! left out are larger than the row's distance by a margin that covers
//! the rounding of the `f32` sums (1%, and radii whose squares are normal
//! floats): every minimum, every draw and every chosen centre is the
//! same, bit for bit. At 1 GiB of 10,000-D, k = 1000, the rows read fall
//! from the whole sample for every step to a few of its groups.

use super::sqdist::{distances, sq_dist};

/// The factor by which a bound must clear twice a group's radius.
const MARGIN: f64 = 1.01;

/// The relative error allowed for in a distance computed in `f32` (and a
/// bound stored as one).
const SLACK: f64 = 1e-3;

/// Radii below this are not pruned on (their squares are near the
/// subnormal floats, where relative errors grow).
const LEAST: f64 = 1e-18;

/// The bounds between chosen centres are kept while they take at most
/// this many bytes (`k^2 / 2` floats), else each trial measures its
/// distance to every centre.
const BOUNDS_BYTES: usize = 64 << 20;

/// The sample's rows grouped by their nearest chosen centre.
pub(super) struct Groups {
    /// Each row's nearest chosen centre (its place in the order chosen).
    of: Vec<u32>,
    /// Per chosen centre: the largest distance (not squared) of its rows.
    radius: Vec<f64>,
    /// `near[j][m]`, `m < j`: a lower bound on the distance between the
    /// centres chosen `j`-th and `m`-th (when `keep`).
    near: Vec<Vec<f32>>,
    keep: bool,
    /// Whether rows are left out at all (without, every trial measures
    /// every row: the plain k-means++ the tests compare with).
    prune: bool,
}

/// For each trial of a step: the groups whose rows it may move, and its
/// distance to each chosen centre where it was measured.
pub(super) struct Live {
    groups: usize,
    /// `alive[t * groups + j]`.
    alive: Vec<bool>,
    /// `to[t][j]`: measured (not squared), or `None`.
    to: Vec<Vec<Option<f64>>>,
}

/// `b` as a lower bound stored in `f32` (rounded down a little).
fn lower(b: f64) -> f32 {
    (b.max(0.0) * (1.0 - SLACK)) as f32
}

impl Groups {
    /// Every row in the group of the first centre, at distances `best`,
    /// for a run that chooses `k` centres; with `prune` unset, no row is
    /// ever left out.
    pub(super) fn new(best: &[f32], k: usize, prune: bool) -> Groups {
        let keep = prune && k.saturating_mul(k) / 2 * 4 <= BOUNDS_BYTES;
        let mut g = Groups {
            of: vec![0; best.len()],
            radius: vec![0.0],
            near: vec![Vec::new()],
            keep,
            prune,
        };
        g.radii(best);
        g
    }

    /// Memory the groups take for `n` rows and `k` centres, at most.
    pub(super) fn bytes(n: u64, k: usize) -> u64 {
        let k = k as u64;
        let bounds = k * k / 2 * 4;
        let bounds = if bounds <= BOUNDS_BYTES as u64 {
            bounds + k * 24
        } else {
            0
        };
        n * 4 + k * 8 + bounds
    }

    fn radii(&mut self, best: &[f32]) {
        self.radius.iter_mut().for_each(|r| *r = 0.0);
        for (&g, &b) in self.of.iter().zip(best) {
            let r = &mut self.radius[g as usize];
            *r = r.max(f64::from(b).sqrt());
        }
    }

    /// A lower bound on the distance between chosen centres `a` and `b`.
    fn bound(&self, a: usize, b: usize) -> f64 {
        let (hi, lo) = (a.max(b), a.min(b));
        match self.near.get(hi).and_then(|v| v.get(lo)) {
            Some(&v) if self.keep && hi != lo => f64::from(v),
            _ => 0.0,
        }
    }

    /// Which groups each trial (`picks`, rows of `s`, `d` columns) may
    /// move rows of, given the chosen centres (rows `chosen`) and each
    /// row's distance `best` to its nearest.
    pub(super) fn live(
        &self,
        (s, d): (&[f32], usize),
        chosen: &[usize],
        picks: &[usize],
        best: &[f32],
    ) -> Live {
        let groups = chosen.len();
        let mut alive = vec![false; picks.len() * groups];
        let mut to = Vec::with_capacity(picks.len());
        for (t, &p) in picks.iter().enumerate() {
            let home = self.of[p] as usize;
            let from_home = f64::from(best[p]).sqrt() * (1.0 + SLACK);
            let c = &s[p * d..(p + 1) * d];
            let mut row = Vec::with_capacity(groups);
            for (j, &centre) in chosen.iter().enumerate() {
                let r = self.radius[j];
                let need = 2.0 * MARGIN * r;
                let lb = self.bound(j, home) * (1.0 - SLACK) - from_home;
                let prunable = self.prune && r >= LEAST;
                let (live, near) = if !self.prune {
                    (true, None)
                } else if r == 0.0 {
                    // Every row sits on its centre: nothing is nearer.
                    (false, None)
                } else if prunable && lb >= need {
                    (false, None)
                } else {
                    let e = f64::from(sq_dist(c, &s[centre * d..(centre + 1) * d])).sqrt();
                    (!(prunable && e * (1.0 - SLACK) >= need), Some(e))
                };
                alive[t * groups + j] = live;
                row.push(near);
            }
            to.push(row);
        }
        Live { groups, alive, to }
    }

    /// Squared distances from every row of `s` to the trials `picks`
    /// (`out[i * picks.len() + t]`), on `threads` threads, measured
    /// (`sq_dist`, the same bits as a full pass) where the trial may move
    /// the row, and `+inf` where it cannot (it is farther than the row's
    /// nearest centre then: the minimum is the same).
    pub(super) fn distances(
        &self,
        (s, d): (&[f32], usize),
        picks: &[usize],
        live: &Live,
        threads: usize,
    ) -> Vec<f32> {
        distances((s, d), picks, threads, |i, t| {
            live.alive[t * live.groups + self.of[i] as usize]
        })
    }

    /// The centre chosen next, row `pick` of `s`, after the centres
    /// `chosen` (its trial `t` of `live`, if it was one), with the rows'
    /// distances `before` and `after` it: the rows it came nearer to join
    /// its group, and its distances to the other centres are bounded
    /// ([`Groups::bounds_to`]).
    pub(super) fn add(
        &mut self,
        (s, d): (&[f32], usize),
        (chosen, pick): (&[usize], usize),
        live: Option<(&Live, usize)>,
        (before, after): (&[f32], &[f32]),
    ) {
        let m = self.radius.len();
        if self.keep {
            let to = self.bounds_to((s, d), (chosen, pick), live, before);
            self.near.push(to);
        }
        for ((g, &b), &a) in self.of.iter_mut().zip(before).zip(after) {
            if a < b {
                *g = m as u32;
            }
        }
        self.radius.push(0.0);
        self.radii(after);
    }

    /// Lower bounds on the distances from the new centre, row `pick`, to
    /// the centres `chosen` before it (the rows at distances `before`).
    ///
    /// A bound of at least `FAR` times the largest radius decides every
    /// later trial by itself: no radius grows (rows only move to nearer
    /// centres), so a trial of either group, within that radius of its
    /// own centre, stays more than twice the other group's radius (with
    /// the margin) from the other centre. Such a bound comes free from
    /// the triangle through the centre `h` the new one was nearest to:
    /// `|c - c_j| >= |c_j - h| - |c - h|`. The others are measured (or
    /// taken from the trial that measured them) on this thread: they are
    /// few, and each step that starts threads is one more chance for a
    /// thread to find no address space for its signal stack under
    /// `RLIMIT_AS` (the standard library aborts then).
    fn bounds_to(
        &self,
        (s, d): (&[f32], usize),
        (chosen, pick): (&[usize], usize),
        live: Option<(&Live, usize)>,
        before: &[f32],
    ) -> Vec<f32> {
        /// `2 * MARGIN + 1`, and room for the slack of the bounds.
        const FAR: f64 = 2.0 * MARGIN + 1.0 + 8.0 * SLACK;
        let largest = self.radius.iter().fold(0f64, |a, &r| a.max(r));
        let enough = FAR * largest;
        let home = self.of[pick] as usize;
        let from_home = f64::from(before[pick]).sqrt() * (1.0 + SLACK);
        let known = live.map(|(l, t)| &l.to[t]);
        let c = &s[pick * d..(pick + 1) * d];
        (0..chosen.len())
            .map(|j| {
                let free = self.bound(j, home) * (1.0 - SLACK) - from_home;
                let e = match known.and_then(|k| k[j]) {
                    Some(e) => e,
                    None if largest > 0.0 && free >= enough => free,
                    None => f64::from(sq_dist(c, &s[chosen[j] * d..(chosen[j] + 1) * d])).sqrt(),
                };
                lower(e)
            })
            .collect()
    }
}
