//! [`fit`]: an [`Algorithm`]'s passes over a job's rows, each pass's
//! partial sums added in a fixed order, and the run's statistics.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::data::{with_rows, Columns, Data, Made};
use super::{Algorithm, Rows, Step};
use crate::error::{Error, Result};
use crate::memory::MemoryPool;
use crate::ranks::ShardSums;
use crate::session::{RunFigures, Session};

/// What a task of a sum pass does: adds its rows' sums into the vector.
pub(super) type TaskFn<S> = fn(&S, &Rows<'_>, &mut [f64]);

/// One pass over the rows, as [`fit`] reports it.
#[derive(Clone, Debug, Serialize)]
pub struct Pass {
    /// Its index, from 1.
    pub index: usize,
    /// Seconds it took.
    pub seconds: f64,
    /// Values in its sums.
    pub sums: usize,
}

/// What a fit did, for `--stats` and Python's `stats_` (with the
/// algorithm's own figures and the session's totals: see
/// [`RunStats::to_json`]).
#[derive(Clone, Debug, Serialize)]
pub struct RunStats {
    /// The job, as the algorithm describes it.
    pub job: String,
    /// Rows of the data.
    pub rows: u64,
    /// Columns.
    pub dims: usize,
    /// Target columns.
    pub targets: usize,
    /// Rows per task.
    pub task_rows: u64,
    /// Shards of the tasks (the order of the sums).
    pub shards: usize,
    /// This process's partitions.
    pub partitions: usize,
    /// The passes, in order.
    pub passes: Vec<Pass>,
    /// The growth onto more ranks after the load, if the job grew (set
    /// by the caller of [`load_and_grow`](crate::grow::load_and_grow);
    /// reported with the session's figures).
    #[serde(skip)]
    pub growth: Vec<crate::grow::Growth>,
}

/// A fit's own figures: the run's and the algorithm's result's.
#[derive(Serialize)]
struct Fit<'a, R: Serialize> {
    #[serde(flatten)]
    run: &'a RunStats,
    #[serde(flatten)]
    result: &'a R,
}

impl RunStats {
    /// The statistics of a run of `job` on `data`, before its passes.
    pub(super) fn new(job: String, data: &Data) -> RunStats {
        RunStats {
            job,
            rows: data.shape.rows,
            dims: data.shape.dims,
            targets: data.shape.targets,
            task_rows: data.layout.task_rows,
            shards: data.shards.count(),
            partitions: data.x.parts.len(),
            passes: Vec::new(),
            growth: Vec::new(),
        }
    }

    /// The run's statistics as JSON, with the algorithm's `result`
    /// figures and every process's totals (counters from `stats`, taken
    /// by the caller once), on rank 0; `None` on the other ranks.
    /// Collective.
    pub fn to_json(
        &self,
        session: &Session,
        result: &impl Serialize,
        stats: &outcore::Stats,
    ) -> Result<Option<serde_json::Value>> {
        let Some(report) = session.report_at(stats)? else {
            return Ok(None);
        };
        let job = Fit { run: self, result };
        let figures = RunFigures {
            job: &job,
            session: report.figures(session, stats, &self.growth),
        };
        figures.to_json().map(Some)
    }
}

/// Fits `alg` to `data` (loaded by [`load`](super::load) on this
/// session): one pass per state the algorithm asks for, `on` called after
/// each. Collective on several ranks: every rank gets the same model, bit
/// for bit the single process's.
pub fn fit<A: Algorithm>(
    session: &Session,
    data: &Data,
    alg: &mut A,
    mut on: impl FnMut(&Pass),
) -> Result<(A::Fitted, RunStats)> {
    let shape = data.shape;
    let job = alg.describe(&shape);
    let pool = MemoryPool::new(session.runtime().cap(), job.clone());
    let mut run = RunStats::new(job, data);
    let mut state = alg.start(&shape)?;
    check(session, data, alg)?;
    loop {
        let started = Instant::now();
        let index = run.passes.len() + 1;
        session.phase(&format!("pass {index}"));
        let len = alg.sums(&state, &shape);
        let shared = Arc::new(state);
        let sums = sum_pass(session, data, &shared, len, &pool, A::task)?;
        let state_back = Arc::try_unwrap(shared)
            .map_err(|_| Error::Input("internal: a pass's state still shared".into()))?;
        let p = Pass {
            index,
            seconds: started.elapsed().as_secs_f64(),
            sums: len,
        };
        on(&p);
        run.passes.push(p);
        match alg.step(state_back, sums, &shape)? {
            Step::Pass(next) => state = next,
            Step::Done(fitted) => return Ok((fitted, run)),
        }
    }
}

/// One pass: a read task per partition (joined with its targets'),
/// returning each of its tasks' sums; added in task order per shard,
/// then across ranks in shard order. Its memory is reserved first.
pub(super) fn sum_pass<S: Send + Sync + 'static>(
    session: &Session,
    data: &Data,
    state: &Arc<S>,
    len: usize,
    pool: &MemoryPool,
    task: TaskFn<S>,
) -> Result<Vec<f64>> {
    let (rt, ranks) = (session.runtime(), session.ranks());
    let local = data.local_shards(ranks);
    let tr = data.layout.task_rows;
    let window = (rt.workers() * 2).max(1);
    let _held = pool.try_reserve_all(&budget(session, data, len))?;
    let mut sums = ShardSums::new(ranks, local.len(), len, true);
    let mut b = rt.batch();
    for (i, h) in data.x.parts.iter().enumerate() {
        let st = state.clone();
        let synthetic = data.synthetic;
        match data.y.as_ref().and_then(|y| y.parts.get(i)) {
            Some(yh) => b.read2(h, yh, move |x: &Columns, y: &Columns| {
                task_sums(&*st, x, Some(y), (synthetic, tr, len), task)
            }),
            None => b.read(h, move |x: &Columns| {
                task_sums(&*st, x, None, (synthetic, tr, len), task)
            }),
        };
    }
    b.ahead(window);
    let mut shard = local.start;
    crate::fold_in_order(b, |_, per_task: Vec<(u64, Vec<f64>)>| {
        for (task, v) in per_task {
            while data.shards.tasks(shard).end <= task && shard + 1 < local.end {
                shard += 1;
            }
            let acc = sums.shard(shard - local.start)?;
            for (a, x) in acc.iter_mut().zip(&v) {
                *a += x;
            }
        }
        Ok(())
    })?;
    sums.finish(ranks)
}

/// What a pass whose sums are `len` values holds besides the executors,
/// each part named: the sums of the tasks ahead of their turn (a window
/// of partitions, each its tasks'), the shards' sums, each worker's
/// scratch.
fn budget(session: &Session, data: &Data, len: usize) -> [(&'static str, u64); 3] {
    let (rt, ranks) = (session.runtime(), session.ranks());
    let tr = data.layout.task_rows;
    let per_part = data
        .x
        .part_rows
        .iter()
        .map(|&n| u64::from(n).div_ceil(tr))
        .max()
        .unwrap_or(1);
    let window = (rt.workers() * 2).max(1) as u64;
    let local = data.local_shards(ranks).len() as u64;
    let vectors = if ranks.size() == 1 { 2 } else { local };
    let bytes = |n: u64| n.saturating_mul(len as u64).saturating_mul(8);
    let scratch = super::moments::scratch_bytes(&data.shape);
    [
        (
            "the partial sums of the tasks in flight",
            bytes(window * per_part),
        ),
        ("the pass's sums", bytes(vectors)),
        ("the tasks' scratch", scratch * rt.workers() as u64),
    ]
}

/// Checks `alg`'s settings against `data` ([`Algorithm::start`]) and
/// that its largest pass ([`Algorithm::most_sums`]) and its last step
/// ([`Algorithm::step_memory`]) each fit the cap: one line naming what it
/// would hold, before any pass runs. [`fit`] checks
/// too; a caller that says what will run checks first.
pub fn check<A: Algorithm>(session: &Session, data: &Data, alg: &mut A) -> Result<()> {
    alg.start(&data.shape)?;
    let pool = MemoryPool::new(session.runtime().cap(), alg.describe(&data.shape));
    let len = alg.most_sums(&data.shape);
    pool.try_reserve_all(&budget(session, data, len))?;
    if let Some((name, bytes)) = alg.step_memory(&data.shape) {
        let sums = ("the pass's sums", (len as u64).saturating_mul(8));
        pool.try_reserve_all(&[sums, (name, bytes)])?;
    }
    Ok(())
}

/// The sums of each task of the partition `x` (its targets `y`), with
/// the task's index.
fn task_sums<S>(
    state: &S,
    x: &Columns,
    y: Option<&Columns>,
    (made, task_rows, len): (Option<Made>, u64, usize),
    task: TaskFn<S>,
) -> Vec<(u64, Vec<f64>)> {
    let mut out = Vec::new();
    let mut r = 0usize;
    let rows = x.rows as usize;
    while r < rows {
        let first = x.first_row + r as u64;
        let n = ((task_rows - first % task_rows) as usize).min(rows - r);
        let mut v = crate::zeros::<f64>(len);
        with_rows(x, y, made, (r, n), |rows| task(state, rows, &mut v));
        out.push((first / task_rows, v));
        r += n;
    }
    out
}
