//! `--max-ranks`: growing onto free MPI slots after the load, when the
//! data does not fit the ranks' caps (see `outcore_jobs::grow`).

use std::time::Instant;

use outcore::format_bytes;
use outcore_jobs::grow::{self, Decision, Growth, Holding, MaxRanks};
use outcore_jobs::{Error, Result, Session};

/// A growth under way: the ranks before and after, since when.
pub(super) struct Growing {
    from: usize,
    to: usize,
    started: Instant,
}

impl Growing {
    /// The growth done, the shards loaded again at `epoch`.
    pub(super) fn done(self, epoch: usize) -> Growth {
        Growth {
            epoch,
            from: self.from,
            to: self.to,
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// Loads the job's data with `load` and grows as [`after_load`] says:
/// then every rank loads its shards again (`load` called with `true`),
/// a spawned rank for the first time (it has no load before growth).
/// The data, and the growth if the job grew. Collective.
pub(super) fn load_and_grow<T>(
    session: &Session,
    max: Option<MaxRanks>,
    bound: usize,
    mut load: impl FnMut(&Session, bool) -> Result<T>,
) -> Result<(T, Option<Growth>)> {
    let mut data = match session.ranks().joined() {
        true => None,
        false => Some(load(session, false)?),
    };
    let growth = match after_load(session, max, bound)? {
        Some(g) => {
            // The shards spread over the new ranks: each loads its own.
            drop(data.take());
            data = Some(load(session, true)?);
            Some(g.done(0))
        }
        None => None,
    };
    let data = data.ok_or_else(|| Error::Input("a spawned rank found no growth to join".into()))?;
    Ok((data, growth))
}

/// After the load: grows to as many ranks as the data needs, when it does
/// not fit and `max` allows (`bound`: the most ranks the job can be spread
/// over, one shard each), and says so on rank 0. A spawned rank meets the
/// growth here. `Some` when the ranks changed: every rank then loads its
/// shards again under the new number of ranks (a spawned one, for the
/// first time). Collective.
fn after_load(session: &Session, max: Option<MaxRanks>, bound: usize) -> Result<Option<Growing>> {
    let started = Instant::now();
    if session.ranks().joined() {
        let (from, to) = grow::join(session);
        return Ok(Some(Growing { from, to, started }));
    }
    let Some(max) = max else { return Ok(None) };
    match grow::decide(session, max, bound) {
        Decision::Fits(_) => Ok(None),
        Decision::Cannot { holding, why } => {
            say!(
                "outcore: warning: {}; cannot grow: {why}; going on out of core",
                does_not_fit(&holding)
            );
            Ok(None)
        }
        Decision::Grow { holding, to } => match grow::grow(session, to) {
            Ok((from, to)) => {
                super::interrupt::set_ranked();
                session.ranks_changed();
                say!(
                    "grew from {from} to {to} ranks: {} of data, {} cap per rank",
                    format_bytes(holding.data_bytes),
                    format_bytes(holding.cap_bytes)
                );
                Ok(Some(Growing { from, to, started }))
            }
            Err(e) => {
                say!(
                    "outcore: warning: {}; could not grow to {to} ranks: {e}; going on out of core",
                    does_not_fit(&holding)
                );
                Ok(None)
            }
        },
    }
}

/// "384 MiB of data do not fit 1 rank's cap of 128 MiB (300 MiB evicted)".
fn does_not_fit(h: &Holding) -> String {
    format!(
        "{} of data do not fit {} rank{} cap of {} ({} not in memory)",
        format_bytes(h.data_bytes),
        h.ranks,
        if h.ranks == 1 { "'s" } else { "s'" },
        format_bytes(h.cap_bytes),
        format_bytes(h.evicted_bytes)
    )
}
