//! Where the tasks are: this process's tasks in its partitions (the rows
//! cut as `shards.rs` says), and the order the passes take them in.

use std::ops::Range;

use outcore::Runtime;

use super::shards::{per_batch, rank_rows, shards, too_few_shards};
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
            });
            r = stop;
        }
        first = end;
    }
    v
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

    /// First global row of task `t`.
    pub(super) fn task_start(&self, t: u64) -> u64 {
        t * self.tp
    }

    /// The rank that holds global row `r`.
    pub(super) fn rank_of_row(&self, r: u64) -> usize {
        let (t, size) = (r / self.tp, self.ranks.size());
        (0..size)
            .find(|&k| self.shards.tasks_of_rank(k, size).contains(&t))
            .unwrap_or(0)
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
