//! Online algorithms on the job interface: a model in an executor,
//! updated row by row in a fixed order (stochastic gradient descent).
//!
//! ```text
//!   epoch e: shards in order (shuffled by seed and e when asked)
//!     shard s, on the rank that holds it: its tasks in order (shuffled),
//!       each a task reading the rows (and targets) and writing the model
//!       executor, rows in order (shuffled): Online::update
//!     then the model is handed from that rank to every rank
//!   after the epoch: Online::score_len > 0: a sum pass over the rows
//!     (the held-out rows' score), then Online::end_epoch: stop or not
//! ```
//!
//! The order of the updates depends on the seed, the epoch and the
//! layout's tasks and shards only: the model is the same bytes under any
//! cap, partitioning, worker count and number of ranks.

use std::sync::Arc;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::data::{with_rows, Columns, Data};
use super::run::{sum_pass, Pass, RunStats};
use super::{Rows, Shape};
use crate::error::{Error, Result};
use crate::input::mix;
use crate::memory::MemoryPool;
use crate::session::Session;

/// One online algorithm on the job interface.
pub trait Online {
    /// What every update reads: the settings fixed for the fit.
    type Settings: Send + Sync + 'static;
    /// The model, held in an executor between updates.
    type Model: Serialize + DeserializeOwned + Clone + Default + Send + Sync + 'static;
    /// The fitted model.
    type Fitted;

    /// The job, as errors and progress name it.
    fn describe(&self, shape: &Shape) -> String;

    /// Checks the data's shape; the settings and the first model.
    fn start(&mut self, shape: &Shape) -> Result<(Self::Settings, Self::Model)>;

    /// The seed the epochs' order is shuffled with; `None`: rows in
    /// order.
    fn shuffle(&self) -> Option<u64>;

    /// Updates `model` with `rows`, taken in the order `order` (indices
    /// into the rows).
    fn update(settings: &Self::Settings, model: &mut Self::Model, rows: &Rows<'_>, order: &[u32]);

    /// The model's values, to hand it to the other ranks.
    fn values(model: &Self::Model) -> Vec<f64>;

    /// The model from values made by [`Online::values`].
    fn set_values(model: &mut Self::Model, values: &[f64]);

    /// Length of the sums scoring the model after an epoch (0: none).
    fn score_len(&self, settings: &Self::Settings) -> usize;

    /// Adds one task's rows' scores of the model (after an epoch).
    fn score(state: &(Arc<Self::Settings>, Self::Model), rows: &Rows<'_>, out: &mut [f64]);

    /// After epoch `epoch` (from 1), with the scores' sums if any:
    /// whether to stop. May change the model (a learning rate).
    fn end_epoch(
        &mut self,
        settings: &Self::Settings,
        model: &mut Self::Model,
        scores: Option<Vec<f64>>,
        epoch: usize,
    ) -> Result<bool>;

    /// The fitted model from the last one.
    fn finish(&mut self, settings: &Self::Settings, model: Self::Model) -> Result<Self::Fitted>;
}

/// Fits `alg` to `data` (loaded on this session) epoch after epoch until
/// it stops; `on` is called after each epoch. Collective on several
/// ranks: every rank gets the same model, bit for bit the single
/// process's.
pub fn fit_online<A: Online>(
    session: &Session,
    data: &Data,
    alg: &mut A,
    mut on: impl FnMut(&Pass),
) -> Result<(A::Fitted, RunStats)> {
    let shape = data.shape;
    let rt = session.runtime();
    let (settings, model) = alg.start(&shape)?;
    let settings = Arc::new(settings);
    let pool = MemoryPool::new(rt.cap(), alg.describe(&shape));
    let model_h = rt.insert_named(Some("the model"), model)?;
    let mut run = RunStats::new(alg.describe(&shape), data);
    let plan = Plan::new(data);
    loop {
        let started = Instant::now();
        let epoch = run.passes.len() + 1;
        session.phase(&format!("epoch {epoch}"));
        for s in plan.shard_order(alg.shuffle(), epoch) {
            let owner = plan.owner(session, s);
            if owner == session.ranks().rank() {
                update_shard::<A>(
                    session,
                    data,
                    &plan,
                    (s, epoch),
                    alg.shuffle(),
                    &settings,
                    &model_h,
                )?;
            }
            if session.ranks().size() > 1 {
                // Every rank's model has the owner's shape: its values
                // are as many, and the owner's replace them.
                let mut v = rt.read(&model_h, |m: &A::Model| A::values(m))?;
                session.ranks().broadcast_from(owner, &mut v);
                rt.write(&model_h, move |m: &mut A::Model| A::set_values(m, &v))?;
            }
        }
        let mut model = rt.read(&model_h, |m: &A::Model| m.clone())?;
        let len = alg.score_len(&settings);
        let scores = if len > 0 {
            let state = Arc::new((settings.clone(), model.clone()));
            Some(sum_pass(session, data, &state, len, &pool, A::score)?)
        } else {
            None
        };
        let stop = alg.end_epoch(&settings, &mut model, scores, epoch)?;
        let p = Pass {
            index: epoch,
            seconds: started.elapsed().as_secs_f64(),
            sums: len,
        };
        on(&p);
        run.passes.push(p);
        if stop {
            return Ok((alg.finish(&settings, model)?, run));
        }
        let m = model;
        rt.write(&model_h, move |x: &mut A::Model| *x = m)?;
    }
}

/// Where each task's rows are: the partition and the rows in it.
struct Plan {
    /// Per global task: (partition index, first row in it, rows), for
    /// this rank's tasks; `None` for the others'.
    tasks: Vec<Option<(usize, usize, usize)>>,
    /// The shards' task ranges and count.
    shards: crate::ranks::Shards,
}

impl Plan {
    fn new(data: &Data) -> Plan {
        let tr = data.layout.task_rows;
        let count = data.shards.task_count() as usize;
        let mut tasks = vec![None; count];
        for (p, &n) in data.x.part_rows.iter().enumerate() {
            let first = data.x.first_row
                + data.x.part_rows[..p]
                    .iter()
                    .map(|&r| u64::from(r))
                    .sum::<u64>();
            let mut r = 0u64;
            while r < u64::from(n) {
                let g = first + r;
                let len = (tr - g % tr).min(u64::from(n) - r);
                if let Some(t) = tasks.get_mut((g / tr) as usize) {
                    *t = Some((p, r as usize, len as usize));
                }
                r += len;
            }
        }
        Plan {
            tasks,
            shards: data.shards,
        }
    }

    /// The shards in the order of epoch `epoch`.
    fn shard_order(&self, seed: Option<u64>, epoch: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.shards.count()).collect();
        if let Some(seed) = seed {
            shuffle(&mut v, mix(seed ^ 0x5a4d_0001, epoch as u64));
        }
        v
    }

    /// The rank holding shard `s`.
    fn owner(&self, session: &Session, s: usize) -> usize {
        let n = session.ranks().size();
        (0..n)
            .find(|&r| self.shards.of_rank(r, n).contains(&s))
            .unwrap_or(0)
    }
}

/// A Fisher-Yates shuffle of `v` from `seed`.
pub(crate) fn shuffle<T>(v: &mut [T], seed: u64) {
    for i in (1..v.len()).rev() {
        let j = (mix(seed, i as u64) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// Runs shard `s`'s tasks of epoch `epoch` on the model, in order: one
/// task per global task, each reading its partition (and targets) and
/// writing the model executor (tasks on one executor run in submission
/// order).
fn update_shard<A: Online>(
    session: &Session,
    data: &Data,
    plan: &Plan,
    (s, epoch): (usize, usize),
    seed: Option<u64>,
    settings: &Arc<A::Settings>,
    model: &outcore::Handle<A::Model>,
) -> Result<()> {
    let rt = session.runtime();
    let mut tasks: Vec<u64> = plan.shards.tasks(s).collect();
    if let Some(seed) = seed {
        shuffle(
            &mut tasks,
            mix(seed ^ 0x7a5c, (epoch as u64) << 32 | s as u64),
        );
    }
    let mut b = rt.batch();
    for t in tasks {
        let Some((p, first, n)) = plan.tasks.get(t as usize).copied().flatten() else {
            return Err(Error::Input(format!("internal: task {t} is not held here")));
        };
        let st = settings.clone();
        let synthetic = data.synthetic;
        let order_seed = seed.map(|seed| mix(seed ^ 0x0de5, (epoch as u64) << 40 | t));
        let xh = &data.x.parts[p];
        let run = move |x: &Columns, y: Option<&Columns>, m: &mut A::Model| {
            with_rows(x, y, synthetic, (first, n), |rows| {
                let mut order: Vec<u32> = (0..n as u32).collect();
                if let Some(seed) = order_seed {
                    shuffle(&mut order, seed);
                }
                A::update(&st, m, rows, &order);
            });
        };
        match data.y.as_ref().and_then(|y| y.parts.get(p)) {
            Some(yh) => {
                let (kx, ky, km) = (xh.key(), yh.key(), model.key());
                b.task(
                    &[xh as &dyn outcore::ReadHandle, yh],
                    &[model as &dyn outcore::AnyHandle],
                    move |j| run(j.read(kx), Some(j.read(ky)), j.write(km)),
                )
            }
            None => b.read_write(xh, model, move |x: &Columns, m: &mut A::Model| {
                run(x, None, m)
            }),
        };
    }
    b.run()?;
    Ok(())
}
