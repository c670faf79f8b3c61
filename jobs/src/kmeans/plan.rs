//! Where the tasks are: the rows cut into tasks of `task_points` global
//! rows, the tasks into shards, the shards among the ranks, and the order
//! the passes take them in.

use std::ops::Range;

use outcore::Runtime;

use super::{Algorithm, Config, Dataset};
use crate::error::{Error, Result};
use crate::ranks::{Ranks, Shards};

/// A task's piece in one partition: rows `start..start+len` of partition
/// `part`, part of global task `task`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) part: usize,
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) task: u64,
    /// Global index of its first row.
    pub(super) row: u64,
}

/// The dataset's rows cut at global task boundaries (multiples of
/// `task_points` rows) and at partition boundaries, in row order: with
/// partitions a whole number of tasks, one chunk per task.
pub(super) fn chunks(ds: &Dataset, task_points: usize) -> Vec<Chunk> {
    let tp = task_points.max(1) as u64;
    let mut v = Vec::new();
    let mut first = ds.first_row;
    for (part, &rows) in ds.part_rows.iter().enumerate() {
        let end = first + u64::from(rows);
        let mut r = first;
        while r < end {
            let task = r / tp;
            let stop = ((task + 1) * tp).min(end);
            v.push(Chunk {
                part,
                start: (r - first) as usize,
                len: (stop - r) as usize,
                task,
                row: r,
            });
            r = stop;
        }
        first = end;
    }
    v
}

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
fn per_batch(shards: &Shards, s: usize, batch_tasks: usize) -> u64 {
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
                let q = per_batch(&sh, s, cfg.batch_tasks).clamp(1, (t.end - t.start).max(1));
                if want >= q {
                    want / q * q
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
            Algorithm::Lloyd => want,
        };
        out.push(((t.start * tp).min(rows), (t.end * tp).min(rows), tasks * tp));
    }
    Ok(out)
}

/// The error for fewer shards than processes.
fn too_few_shards(sh: &Shards, cfg: &Config, ranks: &Ranks) -> Error {
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

/// Where this process's tasks are.
pub(super) struct Plan<'a> {
    pub(super) ranks: &'a Ranks,
    pub(super) shards: Shards,
    /// This process's shards.
    pub(super) mine: Range<usize>,
    chunks: Vec<Chunk>,
    /// Index in `chunks` of each local task's first chunk, and the end.
    task_at: Vec<usize>,
    /// First local task.
    t0: u64,
    tp: u64,
    rows: u64,
    algorithm: Algorithm,
    batch_tasks: usize,
}

impl<'a> Plan<'a> {
    pub(super) fn new(ranks: &'a Ranks, ds: &Dataset, cfg: &Config) -> Result<Plan<'a>> {
        let shards = shards(ds.rows, cfg);
        if shards.count() < ranks.size() {
            return Err(too_few_shards(&shards, cfg, ranks));
        }
        let want = rank_rows(ds.rows, cfg, ranks.rank(), ranks.size());
        let held: u64 = ds.part_rows.iter().map(|&n| u64::from(n)).sum();
        if want != (ds.first_row..ds.first_row + held) {
            return Err(Error::Input(format!(
                "process {} of {} holds rows {}..{}, but its shards are rows {}..{}",
                ranks.rank(),
                ranks.size(),
                ds.first_row,
                ds.first_row + held,
                want.start,
                want.end
            )));
        }
        let tp = cfg.task_points.max(1) as u64;
        let chunks = chunks(ds, cfg.task_points);
        let mine = shards.of_rank(ranks.rank(), ranks.size());
        let tasks = shards.tasks_of_rank(ranks.rank(), ranks.size());
        let mut task_at = Vec::with_capacity((tasks.end - tasks.start) as usize + 1);
        for (i, c) in chunks.iter().enumerate() {
            if task_at.len() as u64 <= c.task - tasks.start {
                task_at.push(i);
            }
        }
        task_at.push(chunks.len());
        Ok(Plan {
            ranks,
            shards,
            mine,
            chunks,
            task_at,
            t0: tasks.start,
            tp,
            rows: ds.rows,
            algorithm: cfg.algorithm,
            batch_tasks: cfg.batch_tasks,
        })
    }

    /// The chunks of local task `t` (global index).
    fn task(&self, t: u64) -> &[Chunk] {
        let i = (t - self.t0) as usize;
        &self.chunks[self.task_at[i]..self.task_at[i + 1]]
    }

    /// Rows of global task `t`.
    pub(super) fn task_rows(&self, t: u64) -> u64 {
        (self.rows - t * self.tp).min(self.tp)
    }

    /// Mini-batch: the tasks shard `s` gives to batch `b`.
    pub(super) fn batch_tasks(&self, s: usize, b: u64, batch_tasks: usize) -> Range<u64> {
        let r = self.shards.tasks(s);
        let q = per_batch(&self.shards, s, batch_tasks);
        let a = (r.start + b * q).min(r.end);
        a..(a + q).min(r.end)
    }

    /// Mini-batch: batches in an epoch.
    pub(super) fn batches(&self, batch_tasks: usize) -> u64 {
        (0..self.shards.count())
            .map(|s| {
                let r = self.shards.tasks(s);
                (r.end - r.start).div_ceil(per_batch(&self.shards, s, batch_tasks).max(1))
            })
            .max()
            .unwrap_or(0)
    }

    /// Rows held by this process.
    pub(super) fn local_rows(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }

    /// Declares the order an epoch first touches the local partitions in.
    pub(super) fn declare(&self, rt: &Runtime, ds: &Dataset, tasks: impl Iterator<Item = u64>) {
        let mut seen = vec![false; ds.parts.len()];
        let mut order = Vec::with_capacity(ds.parts.len());
        for t in tasks {
            for c in self.task(t) {
                if !seen[c.part] {
                    seen[c.part] = true;
                    order.push(ds.parts[c.part].id());
                }
            }
        }
        rt.hint_cycle(order);
    }

    /// This process's tasks in the order the algorithm's passes take them
    /// (Lloyd: row order; mini-batch: batch after batch, each walking the
    /// shards), each with its shard (counted from the first local one).
    /// Every shard's tasks come in task order.
    pub(super) fn sweep_order(&self) -> Vec<(u64, usize)> {
        match self.algorithm {
            Algorithm::Lloyd => self.local_tasks(),
            Algorithm::MiniBatch => (0..self.batches(self.batch_tasks))
                .flat_map(|b| {
                    self.mine.clone().flat_map(move |s| {
                        self.batch_tasks(s, b, self.batch_tasks)
                            .map(move |t| (t, s - self.mine.start))
                    })
                })
                .collect(),
        }
    }

    /// The chunks of `tasks` (global index, shard), in order, and the shard
    /// (counted from the first local one) of each.
    pub(super) fn chunks_of(&self, tasks: &[(u64, usize)]) -> (Vec<Chunk>, Vec<usize>) {
        let mut list = Vec::with_capacity(tasks.len());
        let mut owner = Vec::with_capacity(tasks.len());
        for &(task, o) in tasks {
            for c in self.task(task) {
                list.push(*c);
                owner.push(o);
            }
        }
        (list, owner)
    }

    /// This process's tasks in row order, each with its shard (counted
    /// from the first local one).
    pub(super) fn local_tasks(&self) -> Vec<(u64, usize)> {
        self.mine
            .clone()
            .flat_map(|s| self.shards.tasks(s).map(move |t| (t, s)))
            .map(|(t, s)| (t, s - self.mine.start))
            .collect()
    }
}
