//! The final pass (the inertia of the centres found, and the labels) and
//! [`predict`]: every row's nearest centre, swept in order.

use std::sync::Arc;

use super::assign::{sweep, Want};
use super::plan::{chunks, Plan};
use super::{lend, Centers, Dataset, LabelSink};
use crate::error::{Error, Result};
use crate::Session;
use outcore::Runtime;

/// Inertia of `c` over all the data (added by shard, then across shards),
/// and with a sink this rank's labels, handed to it task by task in row
/// order.
pub(super) fn final_pass(
    rt: &Runtime,
    ds: &Dataset,
    plan: &Plan<'_>,
    c: &mut Centers,
    mut labels: Option<LabelSink<'_>>,
) -> Result<f64> {
    let mut accs = vec![vec![0f64]; plan.mine.len()];
    let want = Want {
        labels: labels.is_some(),
        ..Want::default()
    };
    // Without labels, in the passes' order (the resident part of the data
    // stays right); with, in row order (the order is declared again), so
    // the labels go out as they come. Each shard's tasks come in task
    // order either way, so the inertia is the same, bit for bit.
    let order = match labels {
        Some(_) => {
            let rows = plan.local_tasks();
            plan.declare(rt, ds, rows.iter().map(|&(t, _)| t));
            rows
        }
        None => plan.sweep_order(),
    };
    let (list, owner) = plan.chunks_of(&order);
    // The centres are lent to the tasks, not copied.
    lend(c, |shared| {
        sweep(rt, ds, &list, shared, want, None, |i, p| {
            accs[owner[i]][0] += p.inertia;
            match labels.as_mut() {
                Some(sink) => sink(&p.labels),
                None => Ok(()),
            }
        })
    })?;
    Ok(plan.ranks.ordered_sum(&accs, 1)?[0])
}

/// Labels every row with its nearest centre (ties to the lowest index, as
/// scikit-learn) and, when `dists` is set, its squared distance to it,
/// sweeping the data in order. `on_block` receives the labels (and
/// distances, else an empty slice) of consecutive blocks of rows, in row
/// order, so the caller can stream them out: at most a few blocks of
/// results are held at once.
pub fn predict(
    session: &Session,
    ds: &Dataset,
    centers: &Centers,
    dists: bool,
    task_points: usize,
    mut on_block: impl FnMut(&[u32], &[f32]) -> Result<()>,
) -> Result<()> {
    if centers.dims != ds.dims {
        return Err(Error::Input(format!(
            "the centres have {} dimensions, the data has {}",
            centers.dims, ds.dims
        )));
    }
    let shared = Arc::new(centers.clone());
    let want = Want {
        labels: true,
        dists,
        ..Want::default()
    };
    let list = chunks(ds, task_points.max(1));
    sweep(session.runtime(), ds, &list, &shared, want, None, |_, p| {
        on_block(&p.labels, &p.dists)
    })
}
