//! A K-means run's own statistics (the job's half of `--stats` and of
//! Python's `stats_`; the session adds its half, see
//! [`RunFigures`](crate::RunFigures)), and the traffic of its phases.

use outcore::Stats;
use serde::Serialize;

use super::{shards, Algorithm, Config, Event, Outcome};
use crate::session::Session;

/// What the runtime did between two events of a run: this process's
/// counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Delta {
    /// Executors evicted.
    pub evictions: u64,
    /// Of those, dropped without a write (their file was current).
    pub clean_evictions: u64,
    /// Executors loaded.
    pub loads: u64,
    /// Bytes read from disk: spill files and input.
    pub read: u64,
    /// Bytes written to spill files.
    pub written: u64,
}

/// The traffic of a run's phases (the initialisation and each epoch or
/// iteration), fed every event of the run through [`Traffic::on`].
#[derive(Clone, Debug)]
pub struct Traffic {
    /// Seconds the (last) initialisation took.
    pub init_seconds: f64,
    /// Bytes read while choosing the initial centres (every run).
    pub init_read: u64,
    /// This process's bytes read per epoch or iteration.
    pub epoch_read: Vec<u64>,
    /// This process's bytes written per epoch or iteration.
    pub epoch_written: Vec<u64>,
    last: Stats,
    last_read: u64,
}

impl Traffic {
    /// Counts from now.
    pub fn start(session: &Session) -> Traffic {
        let last = session.runtime().stats();
        Traffic {
            init_seconds: 0.0,
            init_read: 0,
            epoch_read: Vec::new(),
            epoch_written: Vec::new(),
            last_read: last.bytes_read + session.input_bytes_read(),
            last,
        }
    }

    /// What the runtime did since the last call (or the start); the next
    /// counts from now.
    pub fn since_last(&mut self, session: &Session) -> Delta {
        let s = session.runtime().stats();
        let read = s.bytes_read + session.input_bytes_read();
        let d = Delta {
            evictions: s.evictions.saturating_sub(self.last.evictions),
            clean_evictions: s.clean_evictions.saturating_sub(self.last.clean_evictions),
            loads: s.loads.saturating_sub(self.last.loads),
            read: read.saturating_sub(self.last_read),
            written: s.bytes_written.saturating_sub(self.last.bytes_written),
        };
        self.last = s;
        self.last_read = read;
        d
    }

    /// Records event `ev`: the end of the initialisation or of an epoch
    /// adds its traffic, which is returned (to show it); `None` for the
    /// other events.
    pub fn on(&mut self, session: &Session, ev: &Event) -> Option<Delta> {
        match *ev {
            Event::Initialized { seconds } => {
                self.init_seconds = seconds;
                let d = self.since_last(session);
                self.init_read += d.read;
                Some(d)
            }
            Event::Epoch { .. } => {
                let d = self.since_last(session);
                self.epoch_read.push(d.read);
                self.epoch_written.push(d.written);
                Some(d)
            }
            _ => None,
        }
    }
}

/// A K-means run's own figures.
#[derive(Clone, Debug, Serialize)]
pub struct KmeansStats<'a> {
    /// "minibatch" or "lloyd".
    pub algorithm: &'static str,
    /// Clusters.
    pub k: usize,
    /// Rows, every rank's.
    pub rows: u64,
    /// Columns.
    pub dims: usize,
    /// Rank 0's partitions.
    pub partitions: usize,
    /// Shards used (the order of the sums; the unit spread over ranks).
    pub shards: usize,
    /// Seconds per epoch or iteration.
    pub epoch_seconds: &'a [f64],
    /// Inertia per epoch or iteration.
    pub epoch_inertia: &'a [f64],
    /// Rank 0's seconds in the distance kernel per epoch, summed over its
    /// worker threads.
    pub epoch_kernel_seconds: &'a [f64],
    /// Bytes read per epoch, every rank's added up (spill files and
    /// input).
    pub epoch_bytes_read: &'a [u64],
    /// Rank 0's bytes written per epoch.
    pub epoch_bytes_written: &'a [u64],
    /// The final inertia.
    pub inertia: f64,
    /// Epochs (mini-batch) or iterations (Lloyd) run.
    pub iterations: usize,
    /// Mini-batch steps (batches) run.
    pub steps: usize,
    /// Whether the run stopped early on convergence, and why.
    pub converged: bool,
    /// Why it stopped early.
    pub stop: Option<&'static str>,
    /// The convergence tolerance.
    pub tol: f64,
    /// Mini-batch: steps without improvement that stop the run.
    pub max_no_improvement: Option<usize>,
    /// Mini-batch: `reassignment_ratio` (0: off).
    pub reassignment_ratio: f64,
    /// Runs from different initialisations.
    pub n_init: usize,
    /// The run kept (from 0).
    pub best_init: usize,
    /// Every run's final inertia.
    pub init_inertia: &'a [f64],
    /// Centres moved in the kept run: Lloyd's empty ones onto far points,
    /// mini-batch's light ones onto rows of a batch.
    pub relocated: usize,
    /// Whether rows had sample weights.
    pub weighted: bool,
    /// Rank 0's seconds adding the shards' sums across processes.
    pub combine_seconds: f64,
    /// Steps that added sums across processes.
    pub combines: usize,
    /// Seconds loading the data.
    pub load_seconds: f64,
    /// The initialisation (k-means++, random or given centres).
    pub init_seconds: f64,
    /// Rank 0's bytes read while choosing the initial centres (every run).
    pub init_bytes_read: u64,
}

/// The data as loaded, for [`KmeansStats::new`].
#[derive(Clone, Copy, Debug)]
pub struct Loaded {
    /// Rows, every rank's.
    pub rows: u64,
    /// Columns.
    pub dims: usize,
    /// This process's partitions.
    pub partitions: usize,
    /// Whether rows had sample weights.
    pub weighted: bool,
    /// Seconds loading the data.
    pub load_seconds: f64,
}

impl<'a> KmeansStats<'a> {
    /// The figures of run `out` of `cfg` on `data`, with its `traffic`
    /// and the bytes read per epoch (`epoch_read`: every rank's added up,
    /// or this process's).
    pub fn new(
        cfg: &Config,
        data: Loaded,
        out: &'a Outcome,
        traffic: &'a Traffic,
        epoch_read: &'a [u64],
    ) -> KmeansStats<'a> {
        KmeansStats {
            algorithm: match cfg.algorithm {
                Algorithm::MiniBatch => "minibatch",
                Algorithm::Lloyd => "lloyd",
            },
            k: cfg.k,
            rows: data.rows,
            dims: data.dims,
            partitions: data.partitions,
            shards: shards(data.rows, cfg).count(),
            epoch_seconds: &out.epoch_seconds,
            epoch_inertia: &out.epoch_inertia,
            epoch_kernel_seconds: &out.epoch_kernel_seconds,
            epoch_bytes_read: epoch_read,
            epoch_bytes_written: &traffic.epoch_written,
            inertia: out.inertia,
            iterations: out.iterations,
            steps: out.steps,
            converged: out.converged.is_some(),
            stop: out.converged.map(|c| c.describe()),
            tol: cfg.tol,
            max_no_improvement: cfg.max_no_improvement,
            reassignment_ratio: cfg.reassignment_ratio,
            n_init: out.init_inertia.len(),
            best_init: out.best_init,
            init_inertia: &out.init_inertia,
            relocated: out.relocated,
            weighted: data.weighted,
            combine_seconds: out.combine_seconds,
            combines: out.combines,
            load_seconds: data.load_seconds,
            init_seconds: traffic.init_seconds,
            init_bytes_read: traffic.init_read,
        }
    }
}
