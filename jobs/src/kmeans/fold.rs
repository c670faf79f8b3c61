//! A sweep's per-centre sums, added where the tasks make them, in the
//! order of the sweep's chunks.
//!
//! The sums of a step are each shard's chunks added in chunk order from
//! zero, then the shards' sums added in shard order (see
//! [`Ranks::ordered_sum`](crate::ranks::Ranks::ordered_sum)). A chunk's
//! sums are `k x d` values: at the seed's shape (k = 1000, 10,000
//! dimensions) 80 MB, as much as a partition of the data. So no chunk
//! returns them: the task whose turn it is adds its rows, centre by
//! centre, to its shard's sums (a centre's sum made in a `d`-value
//! scratch from zero and added, the same additions as adding the chunk's
//! whole sums: its centres with no rows add zeros, which leave a sum
//! that started at +0.0 unchanged), and hands the turn on.
//!
//! A task that finishes ahead of its turn waits for it while the task
//! before it runs (that one never waits: its turn has come). When that
//! task has not even started (its executor is busy or being loaded), it
//! makes its own sums instead and leaves them to be added when the turn
//! comes, so no task ever waits for one that may wait for it. The sweep's
//! window ([`outcore::Batch::ahead`]) bounds those held sums.
//!
//! On one process the shards come in shard order, and each shard's sums
//! are added to the total as soon as its last chunk is in: two vectors
//! (the total and the shard's) whatever the number of shards. Across
//! processes every local shard's sums are kept for the combine.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use std::sync::Arc;

use outcore::Runtime;

use super::assign::{
    add, add_centre_sums, assign_rows, centre_sums, weights_of, Packed, Partial, Want,
};
use super::plan::Chunk;
use super::{Centers, Dataset, Partition};
use crate::error::{Error, Result};
use crate::zeros;

/// How long a task that finished ahead of its turn waits for the task
/// before it to start, before it makes its own sums: the hand-over from
/// one task to the next on the same executor takes a few microseconds.
const GRACE: Duration = Duration::from_millis(2);

/// The sums of one sweep, shared by its tasks.
pub(super) struct Folding {
    state: Mutex<State>,
    turn: Condvar,
    /// The local shard of each chunk.
    owner: Vec<usize>,
    /// Whether each chunk is its shard's last in the sweep.
    closes: Vec<bool>,
    packed: Packed,
    /// One process, shards in order: the total is kept as they close.
    streaming: bool,
}

struct State {
    /// The chunk whose sums are added next.
    next: usize,
    /// Whether each chunk's task has started.
    started: Vec<bool>,
    /// Sums of chunks that finished ahead of their turn.
    held: BTreeMap<usize, Partial>,
    /// Streaming: the total and the open shard's sums; else each local
    /// shard's.
    accs: Vec<Vec<f64>>,
    /// A task failed: the sweep's sums are lost (its error is returned).
    failed: bool,
}

impl Folding {
    /// The sums of a sweep over chunks of local shards `owner` (`shards`
    /// of them), laid out as `packed`; on one process (`single`) with the
    /// shards in order, kept as a total.
    /// The vectors come from `spare` as far as it has them.
    pub(super) fn new(
        owner: Vec<usize>,
        shards: usize,
        packed: Packed,
        single: bool,
        spare: &mut Vec<Vec<f64>>,
    ) -> Folding {
        let streaming = single && owner.windows(2).all(|w| w[0] <= w[1]);
        let closes = (0..owner.len())
            .map(|i| owner.get(i + 1) != Some(&owner[i]))
            .collect();
        let vectors = super::budget::sum_vectors(shards, streaming);
        let accs = (0..vectors)
            .map(|_| match spare.pop() {
                Some(mut v) => {
                    v.clear();
                    v.resize(packed.len(), 0.0);
                    v
                }
                None => zeros::<f64>(packed.len()),
            })
            .collect();
        Folding {
            state: Mutex::new(State {
                next: 0,
                started: vec![false; owner.len()],
                held: BTreeMap::new(),
                accs,
                failed: false,
            }),
            turn: Condvar::new(),
            owner,
            closes,
            packed,
            streaming,
        }
    }

    /// The state; a task that panicked holding it failed the sweep
    /// already (see [`Unwinding`]), so what it left is not used.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Chunk `i`'s task has started (it holds its executor).
    pub(super) fn start(&self, i: usize) {
        let mut g = self.lock();
        g.started[i] = true;
        self.turn.notify_all();
    }

    /// A task failed (or will never run): every task waiting for its turn
    /// gives up.
    pub(super) fn fail(&self) {
        self.lock().failed = true;
        self.turn.notify_all();
    }

    /// Adds chunk `i`'s sums: `direct` adds them to the slice it is given
    /// when the turn is `i`'s; when it is not and the chunk before it has
    /// not started, `partial` makes them to be added later.
    pub(super) fn add(
        &self,
        i: usize,
        direct: impl FnOnce(&mut [f64]),
        partial: impl FnOnce() -> Partial,
    ) {
        let mut g = self.lock();
        let mut since: Option<Instant> = None;
        loop {
            if g.failed {
                return;
            }
            if g.next == i {
                let acc = self.acc(&mut g, i);
                direct(acc);
                self.close(&mut g);
                self.drain(&mut g);
                self.turn.notify_all();
                return;
            }
            let next = g.next;
            if g.started[next] {
                // Its task runs and never waits: the turn comes.
                g = self.turn.wait(g).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            let left = GRACE.saturating_sub(since.get_or_insert_with(Instant::now).elapsed());
            if left.is_zero() {
                break;
            }
            g = match self.turn.wait_timeout(g, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        drop(g);
        let p = partial();
        let mut g = self.lock();
        if g.failed {
            return;
        }
        g.held.insert(i, p);
        self.drain(&mut g);
        self.turn.notify_all();
    }

    /// The vector chunk `i`'s sums go to.
    fn acc<'a>(&self, g: &'a mut State, i: usize) -> &'a mut [f64] {
        let at = if self.streaming { 1 } else { self.owner[i] };
        &mut g.accs[at]
    }

    /// Chunk `next` is added: the turn moves on, and on one process a
    /// shard whose last chunk it was is added to the total.
    fn close(&self, g: &mut State) {
        let i = g.next;
        if self.streaming && self.closes[i] {
            let (total, open) = g.accs.split_at_mut(1);
            add(&mut total[0], &open[0]);
            open[0].fill(0.0);
        }
        g.next += 1;
    }

    /// Adds the held sums whose turn has come.
    fn drain(&self, g: &mut State) {
        while let Some(p) = g.held.remove(&g.next) {
            let i = g.next;
            self.packed.fold(self.acc(g, i), &p);
            self.close(g);
        }
    }

    /// The sums: on one process the total (one vector), else each local
    /// shard's; an error when a chunk was never added. The vectors not
    /// returned go to `spare`.
    pub(super) fn into_sums(self, spare: &mut Vec<Vec<f64>>) -> Result<Vec<Vec<f64>>> {
        let mut g = self
            .state
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if g.failed || g.next != self.owner.len() {
            return Err(Error::Input(format!(
                "internal: {} of {} chunks' sums were added",
                g.next,
                self.owner.len()
            )));
        }
        if self.streaming {
            spare.extend(g.accs.drain(1..));
        }
        Ok(g.accs)
    }
}

/// Marks the sweep failed when a task's work unwinds, so that no task
/// waits for a turn that will not come.
pub(super) struct Unwinding<'a>(pub(super) &'a Folding);

impl Drop for Unwinding<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}

/// What a sweep that sums ([`sweep_sums`]) works on.
pub(super) struct Summing<'a> {
    /// The sweep's chunks, in order, and the local shard of each.
    pub(super) list: &'a [Chunk],
    pub(super) owner: &'a [usize],
    /// Local shards.
    pub(super) shards: usize,
    /// One process: the shards' sums are added as they close.
    pub(super) single: bool,
    pub(super) packed: Packed,
    /// With column statistics: the point they are measured around.
    pub(super) reference: Option<&'a Arc<Vec<f32>>>,
    /// Tasks run at once, at most.
    pub(super) window: usize,
}

/// Runs the chunks of `s` as one batch and adds their sums (laid out as
/// `s.packed`) in chunk order, each shard's, then the shards' on one
/// process (see `fold.rs`): no task returns its `k x d` sums. Hands each
/// chunk's other results (its kernel time) to `each`, in order. Returns
/// the total on one process, else each local shard's sums. Every chunk
/// runs; the first error is returned.
pub(super) fn sweep_sums(
    rt: &Runtime,
    ds: &Dataset,
    s: &Summing<'_>,
    c: &Arc<Centers>,
    spare: &mut Vec<Vec<f64>>,
    mut each: impl FnMut(usize, &Partial),
) -> Result<Vec<Vec<f64>>> {
    let folding = Folding::new(s.owner.to_vec(), s.shards, s.packed, s.single, spare);
    let folding = Arc::new(folding);
    let want = Want::default();
    let mut b = rt.batch();
    for (i, ch) in s.list.iter().enumerate() {
        let (c, ch, folding, packed) = (c.clone(), *ch, folding.clone(), s.packed);
        let reference = s.reference.cloned();
        b.read_shared(&ds.parts[ch.part], move |p: &Partition| {
            folding.start(i);
            let _unwinding = Unwinding(&folding);
            let r = reference.as_deref().map(Vec::as_slice);
            let (out, nearest) = assign_rows(p, ch.start, ch.len, &c, want, r);
            let (d, kd) = (c.dims, c.k * c.dims);
            let rows = &p.values()[ch.start * d..(ch.start + ch.len) * d];
            let weights = weights_of(p, ch.start, ch.len);
            folding.add(
                i,
                |acc| {
                    packed.fold_small(acc, &out);
                    add_centre_sums(&mut acc[..kd], rows, d, &nearest, &out.counts, weights);
                },
                || {
                    let mut held = out.clone();
                    held.sums = centre_sums(rows, d, &nearest, &out.counts, weights);
                    held
                },
            );
            out
        });
    }
    // Tasks beyond the workers' (and the one that covers the hand-over of
    // results to this thread) would only finish ahead of their turn.
    b.ahead(s.window.clamp(1, rt.workers().max(1) + 1));
    let mut first: Option<Error> = None;
    b.run_in_order(|i, r| match r {
        Ok(p) if first.is_none() => each(i, &p),
        Ok(_) => {}
        Err(e) => {
            folding.fail();
            first.get_or_insert(e.into());
        }
    });
    if let Some(e) = first {
        return Err(e);
    }
    Arc::into_inner(folding)
        .ok_or_else(|| Error::Input("internal: a task outlived its sweep".into()))?
        .into_sums(spare)
}
