//! [`ShardSums`]: the shards' vectors summed in shard order across the
//! ranks, streamed on one process.

use super::Ranks;
use crate::error::{Error, Result};

/// Each local shard's vector made by additions, then the shards'
/// vectors added in shard order across the ranks: what
/// [`Ranks::ordered_sum`] of the shards' vectors gives, bit for bit,
/// without holding every shard's vector on one process.
///
/// On one process, with the shards coming in order, a shard's vector is
/// added to the total as soon as the next one opens: two vectors are held
/// whatever the number of shards (a model-sized sum is as large as a
/// partition of the data). Otherwise every local shard's vector is kept
/// for the combine.
pub(crate) struct ShardSums {
    len: usize,
    /// One process, shards in order: the total and the open shard.
    streaming: Option<(Vec<f64>, Option<Open>)>,
    /// Every local shard's vector (not streaming).
    kept: Vec<Vec<f64>>,
}

/// The shard a streaming [`ShardSums`] adds to, and its vector.
pub(super) type Open = (usize, Vec<f64>);

impl ShardSums {
    /// Sums of `len` values over `shards` local shards on `ranks`;
    /// `in_order`: the shards will come in order.
    pub(crate) fn new(ranks: &Ranks, shards: usize, len: usize, in_order: bool) -> ShardSums {
        let streaming = ranks.size() == 1 && in_order;
        ShardSums {
            len,
            streaming: streaming.then(|| (crate::zeros(len), None)),
            kept: if streaming {
                Vec::new()
            } else {
                (0..shards).map(|_| crate::zeros(len)).collect()
            },
        }
    }

    /// The vector of local shard `s`, to add to. Streaming, opening a
    /// shard closes the one before it; a shard closed cannot open again.
    pub(crate) fn shard(&mut self, s: usize) -> Result<&mut [f64]> {
        let len = self.len;
        let Some((total, open)) = self.streaming.as_mut() else {
            return self
                .kept
                .get_mut(s)
                .map(Vec::as_mut_slice)
                .ok_or_else(|| Error::Input(format!("internal: no local shard {s}")));
        };
        match open {
            Some((at, _)) if *at == s => {}
            Some((at, _)) if *at > s => {
                return Err(Error::Input(format!(
                    "internal: shard {s} after shard {at} in an ordered sum"
                )))
            }
            _ => {
                if let Some((_, v)) = open.take() {
                    add(total, &v);
                }
                *open = Some((s, crate::zeros(len)));
            }
        }
        Ok(open.as_mut().map_or(&mut [][..], |(_, v)| v.as_mut_slice()))
    }

    /// The sum over every rank's shards. Collective.
    pub(crate) fn finish(self, ranks: &Ranks) -> Result<Vec<f64>> {
        match self.streaming {
            Some((mut total, open)) => {
                if let Some((_, v)) = open {
                    add(&mut total, &v);
                }
                Ok(total)
            }
            None => ranks.ordered_sum(&self.kept, self.len),
        }
    }
}

/// `a += b`, element by element.
pub(super) fn add(a: &mut [f64], b: &[f64]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}
