//! `--max-ranks`: growing onto free MPI slots after the load, when the
//! data does not fit the ranks' caps (see `outcore_jobs::grow`).

use outcore_jobs::grow::{self, Growth, MaxRanks};
use outcore_jobs::{Result, Session};

/// Loads the job's data with `load` and grows as
/// `outcore_jobs::grow::load_and_grow` says, its lines on stderr (rank
/// 0's). The data, and the growth if the job grew. Collective.
pub(super) fn load_and_grow<T>(
    session: &Session,
    max: Option<MaxRanks>,
    bound: usize,
    load: impl FnMut(&Session, bool) -> Result<T>,
) -> Result<(T, Option<Growth>)> {
    let out = grow::load_and_grow(session, max, bound, |line| say!("{line}"), load)?;
    if out.1.is_some() {
        // From now on, SIGTERM from mpirun ends this rank quietly.
        super::interrupt::set_ranked();
    }
    Ok(out)
}
