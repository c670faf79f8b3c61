//! Growing a job onto free MPI slots when its data does not fit its ranks'
//! caps.
//!
//! After the load, every rank knows from its runtime
//! ([`Runtime::footprint`](outcore::Runtime::footprint)) how many bytes of
//! executors it holds and how many of them are evicted. Evicted bytes after
//! a load mean that every pass will read them again. [`decide`] gathers
//! these figures on rank 0, which works out how many ranks of this cap the
//! data needs, never more than the allocation's free slots
//! (`MPI_UNIVERSE_SIZE`), the job's limit or its shards, and tells every
//! rank. [`grow`] then spawns the new ranks and merges them in
//! ([`Ranks::grow`](crate::ranks::Ranks::grow)); the spawned ranks, which
//! start as [`joined`](crate::ranks::Ranks::joined) ranks, meet it in
//! [`join`]. From there every rank loads its shards under the new number
//! of ranks, reading its rows from the input as any rank does.
//!
//! The shards never change (their number is a setting, never the number of
//! ranks), and the results depend on the shards only, so a job that grew
//! gives the same bytes as one process and as a job started on its final
//! number of ranks.

use std::str::FromStr;

use serde::Serialize;

use crate::error::{Error, Result};
pub use crate::session::Growth;
use crate::Session;

/// How many ranks a job may grow to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxRanks {
    /// As many as the allocation has slots (`MPI_UNIVERSE_SIZE`).
    Auto,
    /// At most this many.
    At(usize),
    /// As many as now: the job may not grow at this point (a Python
    /// script's later fit: the ranks a growth spawns run the script from
    /// its start, and meet the growth at its first fit).
    Fixed,
}

impl FromStr for MaxRanks {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<MaxRanks, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(MaxRanks::Auto);
        }
        match s.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(MaxRanks::At(n)),
            _ => Err(format!(
                "'{s}' is not a number of ranks (a whole number of at least 1, or auto)"
            )),
        }
    }
}

/// What the ranks hold after their load, added up on rank 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Holding {
    /// Ranks now.
    pub ranks: usize,
    /// Bytes of every rank's executors, in memory or evicted.
    pub data_bytes: u64,
    /// Of those, evicted.
    pub evicted_bytes: u64,
    /// The smallest cap of any rank (0: a rank has none).
    pub cap_bytes: u64,
    /// The most memory any rank uses outside its executors (the runtime,
    /// the job's buffers and model).
    pub other_bytes: u64,
}

impl Holding {
    /// Ranks of this cap that hold the data of `shards` shards in memory
    /// (the shards about equal, whole shards per rank, as many on each as
    /// the rank holding most has), each keeping an eighth of its cap free
    /// besides what it uses outside its executors. `None` without a cap,
    /// or when that leaves no room.
    pub fn ranks_needed(&self, shards: usize) -> Option<usize> {
        let cap = self.cap_bytes;
        let room = cap
            .checked_sub(self.other_bytes + cap / 8)
            .filter(|&r| r > 0)?;
        let shards = shards.max(1) as u64;
        let shard = self.data_bytes.div_ceil(shards).max(1);
        let per_rank = (room / shard).max(1);
        Some(shards.div_ceil(per_rank) as usize)
    }
}

/// Why a job whose data does not fit does not grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// The process runs without MPI.
    NoMpi,
    /// The launcher does not say how many slots the allocation has.
    UnknownSlots,
    /// Every slot of the allocation is taken (`MPI_UNIVERSE_SIZE`).
    NoFreeSlot(usize),
    /// The job's limit on ranks is reached.
    MaxRanks(usize),
    /// One shard per rank at most, and there are no more.
    Shards(usize),
    /// The job may not grow at this point ([`MaxRanks::Fixed`]).
    Fixed,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::NoMpi => write!(
                f,
                "the process runs without MPI (start it with mpirun, from a build with MPI)"
            ),
            Limit::UnknownSlots => write!(
                f,
                "the launcher does not say how many slots the allocation has (MPI_UNIVERSE_SIZE)"
            ),
            Limit::NoFreeSlot(n) => write!(
                f,
                "the allocation's {n} slots (MPI_UNIVERSE_SIZE) are all taken"
            ),
            Limit::MaxRanks(n) => write!(f, "the limit of {n} ranks is reached"),
            Limit::Shards(n) => write!(
                f,
                "the data makes {n} shards, and a rank needs at least one"
            ),
            Limit::Fixed => write!(
                f,
                "only a script's first fit can grow (the ranks it spawns run the script \
                 from its start)"
            ),
        }
    }
}

/// What [`decide`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The data fits: nothing is evicted, or by the estimate the ranks
    /// there hold it.
    Fits(Holding),
    /// Grow to `to` ranks.
    Grow {
        /// What the ranks hold.
        holding: Holding,
        /// Ranks after growth.
        to: usize,
    },
    /// The data does not fit, and the job cannot grow.
    Cannot {
        /// What the ranks hold.
        holding: Holding,
        /// Why not.
        why: Limit,
    },
}

/// Whether the job should grow, and to how many ranks: the ranks' holdings
/// gathered on rank 0, its decision on every rank. Collective over the
/// ranks that loaded (not the joined ones), after the load.
pub fn decide(session: &Session, max: MaxRanks, shards: usize) -> Decision {
    let rt = session.runtime();
    let f = rt.footprint();
    let other = rt.stats().current_bytes.saturating_sub(f.resident_bytes);
    let cap = rt.cap().unwrap_or(0);
    let ranks = session.ranks();
    let all = ranks.all_gather_u64(&[f.total_bytes(), f.evicted_bytes, cap, other]);
    let holding = Holding {
        ranks: ranks.size(),
        data_bytes: all.chunks(4).map(|r| r[0]).sum(),
        evicted_bytes: all.chunks(4).map(|r| r[1]).sum(),
        cap_bytes: all.chunks(4).map(|r| r[2]).min().unwrap_or(0),
        other_bytes: all.chunks(4).map(|r| r[3]).max().unwrap_or(0),
    };
    // Rank 0 decides, from figures every rank has; its universe counts.
    let mut slots = [ranks.universe().map_or(0, |u| u as u64 + 1)];
    ranks.broadcast_u64(&mut slots);
    let universe = slots[0].checked_sub(1).map(|u| u as usize);
    match choose(holding, universe, max, shards) {
        Decision::Cannot { holding, .. } | Decision::Grow { holding, .. } if !ranks.is_mpi() => {
            Decision::Cannot {
                holding,
                why: Limit::NoMpi,
            }
        }
        d => d,
    }
}

/// [`decide`]'s rule: enough ranks to hold the data, within the slots, the
/// limit and the shards.
pub fn choose(h: Holding, universe: Option<usize>, max: MaxRanks, shards: usize) -> Decision {
    if h.evicted_bytes == 0 {
        return Decision::Fits(h);
    }
    let needed = h.ranks_needed(shards).unwrap_or(usize::MAX);
    if max == MaxRanks::Fixed && needed > h.ranks {
        return Decision::Cannot {
            holding: h,
            why: Limit::Fixed,
        };
    }
    let Some(slots) = universe else {
        return Decision::Cannot {
            holding: h,
            why: Limit::UnknownSlots,
        };
    };
    let max = match max {
        // Fixed: refused above when the ranks there do not hold the data.
        MaxRanks::Auto | MaxRanks::Fixed => None,
        MaxRanks::At(n) => Some((n, Limit::MaxRanks(n))),
    };
    let (mut to, mut why) = (needed, None);
    let bounds = [
        Some((slots, Limit::NoFreeSlot(slots))),
        max,
        Some((shards, Limit::Shards(shards))),
    ];
    for (bound, limit) in bounds.into_iter().flatten() {
        if bound < to {
            to = bound;
            why = Some(limit);
        }
    }
    match why {
        Some(why) if to <= h.ranks => Decision::Cannot { holding: h, why },
        // By the estimate the ranks there are hold the data.
        None if to <= h.ranks => Decision::Fits(h),
        _ => Decision::Grow { holding: h, to },
    }
}

/// Spawns the ranks that make `to` and merges them in; the spawned ranks
/// meet this in [`join`]. Returns the ranks before and after. Collective
/// over the ranks before growth.
///
/// # Errors
///
/// On every rank, when the spawn fails: the job goes on as it was.
pub fn grow(session: &Session, to: usize) -> Result<(usize, usize)> {
    let ranks = session.ranks();
    let from = ranks.size();
    if to <= from {
        return Err(Error::Input(format!(
            "cannot grow from {from} to {to} ranks"
        )));
    }
    ranks.grow(to - from)?;
    let mut fromto = [from as u64, to as u64];
    ranks.broadcast_u64(&mut fromto);
    Ok((from, to))
}

/// The spawned ranks' side of [`grow`]: the ranks before and after.
/// Collective, over every rank after growth. A spawned rank joins once:
/// from then on it is one of the ranks ([`Ranks::join_pending`] is
/// false).
///
/// [`Ranks::join_pending`]: crate::ranks::Ranks::join_pending
pub fn join(session: &Session) -> (usize, usize) {
    let mut fromto = [0u64, 0];
    session.ranks().broadcast_u64(&mut fromto);
    session.ranks().joined_now();
    (fromto[0] as usize, fromto[1] as usize)
}

/// Loads a job's data with `load` and grows when its data does not fit
/// the ranks' caps and `max` allows (`bound`: the most ranks the job can
/// be spread over, one shard each): then every rank loads its shards
/// again (`load` called with `true`), a spawned rank for the first time
/// (it has no load before growth). The lines to show (rank 0's: the
/// growth, or why the job could not grow, as `outcore: warning: ...`) go
/// to `say`. The data, and the growth if the job grew. Collective.
pub fn load_and_grow<T>(
    session: &Session,
    max: Option<MaxRanks>,
    bound: usize,
    mut say: impl FnMut(String),
    mut load: impl FnMut(&Session, bool) -> Result<T>,
) -> Result<(T, Option<Growth>)> {
    let started = std::time::Instant::now();
    let joining = session.ranks().join_pending();
    let mut data = match joining {
        true => None,
        false => Some(load(session, false)?),
    };
    let grew = match joining {
        true => Some(join(session)),
        false => after_load(session, max, bound, &mut say),
    };
    let Some((from, to)) = grew else {
        let data = data.ok_or_else(|| Error::Input("a spawned rank found no growth".into()))?;
        return Ok((data, None));
    };
    // The shards spread over the new ranks: each loads its own.
    drop(data.take());
    let data = load(session, true)?;
    let growth = Growth {
        epoch: 0,
        from,
        to,
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok((data, Some(growth)))
}

/// After the load: grows to as many ranks as the data needs, when it does
/// not fit and `max` allows, and says so on rank 0. The ranks before and
/// after, when they changed. Collective.
fn after_load(
    session: &Session,
    max: Option<MaxRanks>,
    bound: usize,
    say: &mut impl FnMut(String),
) -> Option<(usize, usize)> {
    let max = max?;
    let root = session.is_root();
    let mut tell = |line: String| {
        if root {
            say(line);
        }
    };
    match decide(session, max, bound) {
        Decision::Fits(_) => None,
        Decision::Cannot { holding, why } => {
            tell(format!(
                "outcore: warning: {}; cannot grow: {why}; going on out of core",
                does_not_fit(&holding)
            ));
            None
        }
        Decision::Grow { holding, to } => match grow(session, to) {
            Ok((from, to)) => {
                session.ranks_changed();
                tell(format!(
                    "grew from {from} to {to} ranks: {} of data, {} cap per rank",
                    outcore::format_bytes(holding.data_bytes),
                    outcore::format_bytes(holding.cap_bytes)
                ));
                Some((from, to))
            }
            Err(e) => {
                tell(format!(
                    "outcore: warning: {}; could not grow to {to} ranks: {e}; going on out of core",
                    does_not_fit(&holding)
                ));
                None
            }
        },
    }
}

/// "384 MiB of data do not fit 1 rank's cap of 128 MiB (300 MiB not in
/// memory)".
fn does_not_fit(h: &Holding) -> String {
    format!(
        "{} of data do not fit {} rank{} cap of {} ({} not in memory)",
        outcore::format_bytes(h.data_bytes),
        h.ranks,
        if h.ranks == 1 { "'s" } else { "s'" },
        outcore::format_bytes(h.cap_bytes),
        outcore::format_bytes(h.evicted_bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn holding(data: u64, evicted: u64) -> Holding {
        Holding {
            ranks: 1,
            data_bytes: data * MIB,
            evicted_bytes: evicted * MIB,
            cap_bytes: 128 * MIB,
            other_bytes: 16 * MIB,
        }
    }

    #[test]
    fn the_ranks_needed_hold_the_data_within_the_slots_limit_and_shards() {
        // 96 MiB of room per rank: 2 shards of 48 MiB in 8, 1 of 64 in 6.
        let h = holding(384, 300);
        assert_eq!(h.ranks_needed(8), Some(4));
        assert_eq!(h.ranks_needed(6), Some(6));
        assert_eq!(h.ranks_needed(3), Some(3), "a shard larger than the room");
        let grow = |u, max, shards| match choose(h, u, max, shards) {
            Decision::Grow { to, .. } => Ok(to),
            Decision::Cannot { why, .. } => Err(why),
            Decision::Fits(_) => panic!("fits"),
        };
        assert_eq!(grow(Some(8), MaxRanks::Auto, 8), Ok(4));
        assert_eq!(grow(Some(3), MaxRanks::Auto, 8), Ok(3));
        assert_eq!(grow(Some(8), MaxRanks::At(2), 8), Ok(2));
        assert_eq!(grow(Some(8), MaxRanks::Auto, 3), Ok(3));
        assert_eq!(grow(Some(1), MaxRanks::Auto, 8), Err(Limit::NoFreeSlot(1)));
        assert_eq!(grow(Some(8), MaxRanks::At(1), 8), Err(Limit::MaxRanks(1)));
        assert_eq!(grow(None, MaxRanks::Auto, 8), Err(Limit::UnknownSlots));
        assert_eq!(grow(Some(8), MaxRanks::Fixed, 8), Err(Limit::Fixed));
        assert_eq!(grow(None, MaxRanks::Fixed, 8), Err(Limit::Fixed));
        assert!(matches!(
            choose(holding(64, 0), Some(8), MaxRanks::Auto, 8),
            Decision::Fits(_)
        ));
    }

    #[test]
    fn max_ranks_reads_a_count_or_auto() {
        assert_eq!("auto".parse(), Ok(MaxRanks::Auto));
        assert_eq!("3".parse(), Ok(MaxRanks::At(3)));
        assert!("0".parse::<MaxRanks>().is_err());
        assert!("x".parse::<MaxRanks>().is_err());
    }
}
