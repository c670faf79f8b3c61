//! What a run holds at once besides the partitions the runtime may evict:
//! its working memory, from the shape of the data and the settings alone.
//!
//! At the seed's shape (k = 1000, 10,000 dimensions) the centres, a
//! step's sums and a task's sums are each as large as a partition, so the
//! run plans them against the cap: it stops at the start when even the
//! least it must hold (the initialisation's sample, or the centres, the
//! sums and one partition) does not fit, and it runs only as many tasks
//! at once as the cap leaves room for (each pins a partition and may hold
//! its own sums, see `fold.rs`).

use super::init::{init_sample_bytes, plus_plus_scratch};
use super::{aligned_partition_bytes, Algorithm, Config, Init};
use crate::error::{Error, Result};
use crate::input::Source;
use crate::ranks::Ranks;
use crate::Session;
use outcore::format_bytes;

/// A run's working memory, in bytes, on one process.
#[derive(Clone, Copy, Debug)]
pub(super) struct Needs {
    /// The initialisation's sample and its scratch (0 with given centres).
    init: u64,
    /// The centres (their values and the kernel's copy), and the values
    /// before a step when its shift is measured.
    centres: u64,
    /// The sums a step adds its tasks' into (see `Folding::vectors`).
    sums: u64,
    /// The largest partition.
    partition: u64,
    /// One task's own sums, held when it finishes ahead of its turn.
    partial: u64,
}

impl Needs {
    /// The working memory of a run under `cfg` on `rows` rows of `dims`
    /// columns, in partitions of at most `part_rows` rows, on a process
    /// holding `shards` of the shards, one of `ranks`.
    pub(super) fn of(
        rows: u64,
        dims: usize,
        cfg: &Config,
        part_rows: u64,
        shards: usize,
        ranks: usize,
    ) -> Needs {
        let (k, d) = (cfg.k as u64, dims as u64);
        let f32s = 4 * k * d;
        let measured = cfg.algorithm == Algorithm::MiniBatch && cfg.tol > 0.0;
        let stats = cfg.algorithm == Algorithm::Lloyd && cfg.tol > 0.0;
        let packed = k * d + k + 1 + if stats { 2 * d } else { 0 };
        let vectors = sum_vectors(shards, ranks == 1) as u64;
        // A row's values, norm and (at most) weight.
        let row = 4 * d + 8;
        let init = match cfg.init {
            Init::Given(_) => 0,
            Init::KMeansParallel => super::parallel::scratch_bytes(rows, dims, cfg.k),
            _ => init_sample_bytes(rows, dims, cfg.k) + plus_plus_scratch(rows, dims, cfg.k),
        };
        Needs {
            init,
            centres: 2 * f32s + if measured { f32s } else { 0 },
            sums: vectors * packed * 8,
            partition: part_rows.min(rows) * row,
            partial: packed * 8,
        }
    }

    /// The least the run holds at once: the initialisation, or a step
    /// with one task.
    pub(super) fn least(&self) -> u64 {
        (self.init + self.partition).max(self.centres + self.sums + self.partition)
    }

    /// Stops the run when even [`least`](Self::least) is over `cap`, with
    /// one line that says what it holds.
    pub(super) fn check(&self, cap: Option<u64>, cfg: &Config, dims: usize) -> Result<()> {
        let Some(cap) = cap else {
            return Ok(());
        };
        let least = self.least();
        if least <= cap {
            return Ok(());
        }
        let mut parts = vec![
            format!("the centres {}", format_bytes(self.centres)),
            format!("the step's sums {}", format_bytes(self.sums)),
            format!("a partition {}", format_bytes(self.partition)),
        ];
        if self.init + self.partition > self.centres + self.sums + self.partition {
            parts = vec![
                format!("the initialisation's sample {}", format_bytes(self.init)),
                format!("a partition {}", format_bytes(self.partition)),
            ];
        }
        Err(Error::Memory(format!(
            "K-means with k = {} on {dims} dimensions needs {} at once ({}), more than the memory cap of {}",
            cfg.k,
            format_bytes(least),
            parts.join(", "),
            format_bytes(cap)
        )))
    }

    /// [`check`](Self::check) on every process: when one stops, all do
    /// (collective), the others saying so.
    pub(super) fn check_all(
        &self,
        ranks: &Ranks,
        cap: Option<u64>,
        cfg: &Config,
        dims: usize,
    ) -> Result<()> {
        let mine = self.check(cap, cfg, dims);
        if ranks.size() == 1 {
            return mine;
        }
        let stopped = ranks.ordered_sum(&[vec![f64::from(u8::from(mine.is_err()))]], 1)?[0];
        match mine {
            Ok(()) if stopped > 0.0 => Err(Error::Memory(
                "another process's memory cap is too small for K-means' working memory (its error says how much it needs)".into(),
            )),
            r => r,
        }
    }

    /// What the run holds whatever its workers (the initialisation, or
    /// the centres and the step's sums), and what each running task holds
    /// on top: its partition, its own sums, and its rows' labels,
    /// distances and (on CPUs without the fused kernel) distance tiles,
    /// `task_points` rows at a time.
    pub(super) fn per_worker(&self, k: usize, task_points: usize) -> (u64, u64) {
        let scratch = task_points as u64 * (4 * k as u64 + 8);
        (
            self.least() - self.partition,
            self.partition + self.partial + scratch,
        )
    }

    /// Tasks a step runs at once under `cap` with `workers` workers: each
    /// beyond the first pins one more partition and may hold its own
    /// sums.
    pub(super) fn window(&self, cap: Option<u64>, workers: usize) -> usize {
        let workers = workers.max(1);
        let Some(cap) = cap else {
            return workers;
        };
        let spare = cap.saturating_sub(self.centres + self.sums + self.partition);
        let each = (self.partition + self.partial).max(1);
        1 + ((spare / each) as usize).min(workers - 1)
    }
}

/// The partition size (bytes of values, whole tasks) for a run under
/// `cfg` on `dims` columns, given about `part_bytes`, on a process
/// holding `shards` shards under `cap`. A mini-batch takes tasks from
/// every shard, so each shard's current partition is used side by side:
/// together (with their rows' norms and weights) they take at most half
/// the cap, else each batch evicts a partition the next one needs, and an
/// epoch reads the data many times over (tall, thin data: 128 MiB of one
/// column under a 16 MiB cap read 6.8 GiB an epoch in partitions of
/// 1 MiB). Lloyd sweeps one partition after another.
pub(super) fn partition_bytes(
    part_bytes: u64,
    dims: usize,
    cfg: &Config,
    shards: usize,
    cap: Option<u64>,
) -> u64 {
    let aligned = |b: u64| aligned_partition_bytes(b, dims, cfg.task_points);
    match cap {
        Some(cap) if cfg.algorithm == Algorithm::MiniBatch => {
            let d = 4 * dims.max(1) as u64;
            let fit = cap / (2 * shards.max(1) as u64) * d / (d + 8);
            aligned(part_bytes.min(fit))
        }
        _ => aligned(part_bytes),
    }
}

/// The memory a run under `cfg` of `rows` x `dims` holds whatever its
/// workers, and each worker's task, in partitions of about `part_bytes`
/// under `cap`, on rank `rank` of `ranks`: what [`Workers`] plans from
/// (see [`super::worker_bytes`]).
///
/// [`Workers`]: crate::Workers
pub(super) fn worker_bytes(
    (rows, dims): (u64, usize),
    cfg: &Config,
    part_bytes: u64,
    cap: Option<u64>,
    (rank, ranks): (usize, usize),
) -> (u64, u64) {
    let shards = super::shards::shards(rows, cfg).of_rank(rank, ranks).len();
    let part_bytes = partition_bytes(part_bytes, dims, cfg, shards, cap);
    let part_rows = part_bytes / (4 * dims.max(1) as u64);
    Needs::of(rows, dims, cfg, part_rows, shards, ranks).per_worker(cfg.k, cfg.task_points)
}

/// The vectors of a step's sums a process keeps (see `fold.rs`): on one
/// process the total and the open shard's, else each local shard's.
pub(super) fn sum_vectors(shards: usize, single: bool) -> usize {
    if single {
        2
    } else {
        shards
    }
}

/// The partition size for loading `src` for a run under `cfg`, given
/// about `part_bytes` ([`partition_bytes`]); an error, on every process,
/// when the run's working memory does not fit under a process's cap.
/// Collective.
pub(super) fn plan(session: &Session, src: &Source, cfg: &Config, part_bytes: u64) -> Result<u64> {
    let ranks = session.ranks();
    let (rows, dims) = src.shape()?;
    let shards = super::shards::shards(rows, cfg)
        .of_rank(ranks.rank(), ranks.size())
        .len();
    let cap = session.runtime().cap();
    let part_bytes = partition_bytes(part_bytes, dims, cfg, shards, cap);
    let part_rows = part_bytes / (4 * dims.max(1) as u64);
    Needs::of(rows, dims, cfg, part_rows, shards, ranks.size()).check_all(ranks, cap, cfg, dims)?;
    Ok(part_bytes)
}

#[cfg(test)]
mod tests {
    use super::{Config, Needs};
    use crate::error::Error;
    use crate::ranks::Ranks;

    const MIB: u64 = 1 << 20;

    /// A step's needs: 3 MiB of centres, 2 MiB of sums, 1 MiB partitions.
    fn step() -> Needs {
        Needs {
            init: MIB,
            centres: 3 * MIB,
            sums: 2 * MIB,
            partition: MIB,
            partial: 0,
        }
    }

    #[test]
    fn a_run_over_the_cap_is_a_memory_error_with_its_line() {
        let cfg = Config {
            k: 100,
            ..Config::default()
        };
        let line = "K-means with k = 100 on 32 dimensions needs 6.0 MiB at once (the centres \
                    3.0 MiB, the step's sums 2.0 MiB, a partition 1.0 MiB), more than the \
                    memory cap of 4.0 MiB";
        let e = step().check(Some(4 * MIB), &cfg, 32).unwrap_err();
        assert!(matches!(e, Error::Memory(_)), "{e:?}");
        assert_eq!(e.to_string(), line);
        // One process: its own refusal, unchanged.
        let e = step()
            .check_all(&Ranks::single(), Some(4 * MIB), &cfg, 32)
            .unwrap_err();
        assert!(matches!(e, Error::Memory(_)), "{e:?}");
        assert_eq!(e.to_string(), line);
        let init = Needs {
            init: 8 * MIB,
            ..step()
        };
        let e = init.check(Some(4 * MIB), &cfg, 32).unwrap_err();
        assert!(matches!(e, Error::Memory(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "K-means with k = 100 on 32 dimensions needs 9.0 MiB at once (the \
             initialisation's sample 8.0 MiB, a partition 1.0 MiB), more than the memory \
             cap of 4.0 MiB"
        );
        assert!(step().check(Some(6 * MIB), &cfg, 32).is_ok());
        assert!(step().check(None, &cfg, 32).is_ok());
    }
}
