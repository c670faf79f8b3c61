//! The rows cut into tasks of `task_points` global rows, the tasks into
//! shards, the shards among the ranks, and the rows each rank loads.
//! Arithmetic on row counts only: the load (`data.rs`) and the plan
//! (`plan.rs`) both build on it.

use std::ops::Range;

use super::{Algorithm, Config};
use crate::error::{Error, Result};
use crate::ranks::{Ranks, Shards};

/// The shards of `rows` rows under `cfg`: tasks of `task_points` global
/// rows, in `min(shards, tasks)` shards, and for mini-batch at most
/// `batch_tasks` (each batch takes at least one task from each shard).
pub fn shards(rows: u64, cfg: &Config) -> Shards {
    let tasks = rows.div_ceil(cfg.task_points.max(1) as u64);
    let n = match cfg.algorithm {
        Algorithm::MiniBatch => cfg.shards.min(cfg.batch_tasks),
        Algorithm::Lloyd => cfg.shards,
    };
    Shards::new(tasks, n.max(1))
}

/// The rows rank `rank` of `ranks` holds (its shards' tasks), as
/// [`load`](super::load) loads them for a run under `cfg` on a session of
/// `ranks` ranks.
pub fn rank_rows(rows: u64, cfg: &Config, rank: usize, ranks: usize) -> Range<u64> {
    let t = shards(rows, cfg).tasks_of_rank(rank, ranks);
    let tp = cfg.task_points.max(1) as u64;
    (t.start * tp).min(rows)..(t.end * tp).min(rows)
}

/// Mini-batch: the tasks shard `s` of `shards` gives each batch
/// (`batch_tasks` spread over the shards).
pub(super) fn per_batch(shards: &Shards, s: usize, batch_tasks: usize) -> u64 {
    let (n, b, s) = (shards.count() as u128, batch_tasks as u128, s as u128);
    ((s + 1) * b / n - s * b / n) as u64
}

/// The row segments rank `ranks.rank()` loads (see [`load`](super::load)): one per
/// shard, `(first, end, rows per partition)`, with partitions of whole
/// tasks near `part_bytes`; for mini-batch, a divisor or a multiple of the
/// shard's tasks per batch, so that a batch never takes part of a
/// partition that the next batch takes the rest of.
pub(super) fn segments(
    rows: u64,
    dims: usize,
    cfg: &Config,
    ranks: &Ranks,
    part_bytes: u64,
) -> Result<Vec<(u64, u64, u64)>> {
    let sh = shards(rows, cfg);
    if sh.count() < ranks.size() {
        return Err(too_few_shards(&sh, cfg, ranks));
    }
    let tp = cfg.task_points.max(1) as u64;
    let want = (part_bytes / (4 * dims.max(1) as u64) / tp).max(1);
    let mut out = Vec::new();
    for s in sh.of_rank(ranks.rank(), ranks.size()) {
        let t = sh.tasks(s);
        let tasks = match cfg.algorithm {
            Algorithm::MiniBatch => {
                // (Beyond the shard's tasks, runs change nothing.)
                let len = (t.end - t.start).max(1);
                let q = per_batch(&sh, s, cfg.batch_tasks).clamp(1, len);
                if want >= q {
                    // As many partitions as `want` tasks each make, evened
                    // out, in whole batches, where rounding down to whole
                    // batches keeps their number; else `want` in whole
                    // batches. Never larger than that: a tight cap was
                    // checked against it.
                    let n = len.div_ceil(want);
                    let even = (len.div_ceil(n) / q * q).max(q);
                    if len.div_ceil(even) <= n {
                        even
                    } else {
                        want / q * q
                    }
                } else {
                    // The divisor of q nearest to `want` (by ratio).
                    let below = (1..=want).rev().find(|&d| q.is_multiple_of(d)).unwrap_or(1);
                    let above = (want..=q).find(|&d| q.is_multiple_of(d)).unwrap_or(q);
                    if (above as f64 / want as f64) < (want as f64 / below as f64) {
                        above
                    } else {
                        below
                    }
                }
            }
            // As many partitions as `want` tasks each would make, evened
            // out: no short last one (a partition of 9 MiB beside one of
            // 247 MiB, for `--partitions 1` on rows that end mid-task).
            Algorithm::Lloyd => {
                let len = (t.end - t.start).max(1);
                len.div_ceil(len.div_ceil(want))
            }
        };
        out.push(((t.start * tp).min(rows), (t.end * tp).min(rows), tasks * tp));
    }
    Ok(out)
}

/// The error for fewer shards than processes.
pub(super) fn too_few_shards(sh: &Shards, cfg: &Config, ranks: &Ranks) -> Error {
    Error::Input(format!(
        "{} processes, but the data makes only {} shards ({} tasks of {} rows, {} shards asked{}): at least one shard per process is needed",
        ranks.size(),
        sh.count(),
        sh.task_count(),
        cfg.task_points,
        cfg.shards,
        if cfg.algorithm == Algorithm::MiniBatch {
            format!(", at most {} per batch", cfg.batch_tasks)
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lloyd's partitions of a shard are even, and never larger than
    /// asked for.
    #[test]
    fn lloyd_partitions_are_even() {
        let cfg = Config {
            algorithm: Algorithm::Lloyd,
            shards: 1,
            task_points: 100,
            ..Config::default()
        };
        let ranks = Ranks::single();
        let dims = 4;
        // 10,050 rows: 101 tasks, the last one half full.
        let rows = 10_050;
        for (want_tasks, parts) in [(100, 2), (101, 1), (50, 3), (34, 3), (1, 101)] {
            let part_bytes = want_tasks * 100 * 4 * dims as u64;
            let seg = segments(rows, dims, &cfg, &ranks, part_bytes).unwrap();
            assert_eq!(seg.len(), 1);
            let (first, end, per) = seg[0];
            assert_eq!((first, end), (0, rows));
            let tasks = per / 100;
            assert!(
                tasks <= want_tasks,
                "{want_tasks}: {tasks} tasks a partition"
            );
            assert_eq!(
                101u64.div_ceil(tasks),
                parts,
                "{want_tasks}: {tasks} tasks a partition"
            );
            // The last partition holds at least half as many tasks as the others.
            let last = 101 - (parts - 1) * tasks;
            assert!(
                2 * last >= tasks || parts == 1,
                "{want_tasks}: last {last} of {tasks}"
            );
        }
    }
}
