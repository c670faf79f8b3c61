//! Other ranks' memory as a spill tier (feature `mpi`): memory-only ranks
//! (`outcore lend`, started beside the job with `mpirun`'s `:`) keep the
//! images of executors the workers evict, and hand them back when the
//! workers load them, faster than a disk where the interconnect is.
//!
//! - [`RemoteTier`] is the workers' side, a [`SpillTier`] for the runtime:
//!   the runtime never makes it an executor's only copy (see
//!   `outcore::SpillTier`), so a lender that declines, forgets or dies
//!   costs a read from the disk or a rebuild, never a result.
//! - `lend.rs`: the lender's side, a loop that serves requests within
//!   its cap.
//! - `wire.rs`: nonblocking messages with deadlines (Open MPI does not
//!   report a dead peer: a blocking call to one hangs).
//!
//! The lenders and the workers share a communicator of their own (a
//! duplicate of `MPI_COMM_WORLD`); the workers' collectives run on a
//! communicator of the workers only, so a lender's death cannot hang
//! them. Surviving it also takes `mpirun --enable-recovery`, without
//! which `mpirun` ends every rank when one dies.

mod lend;
mod wire;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use outcore::{SpillTier, TierHead, TierKey};

pub use lend::Lent;
pub(crate) use lend::{serve, Pool};
pub(crate) use wire::Comm;

/// What a lender may hold under `cap` (`--mem-cap`, `mem_cap`): the
/// cap (`auto`: its share of the node's memory among the processes the
/// launcher started there) less a margin for the lender itself, a
/// sixteenth and at least 32 MiB.
pub fn lender_budget(cap: outcore::MemoryCap) -> crate::Result<u64> {
    use outcore::MemoryCap;
    let bytes = match cap {
        MemoryCap::None => {
            return Err(crate::Error::Input(
                "a lender needs a cap (a size or auto), not none".into(),
            ))
        }
        MemoryCap::Auto => {
            let on_node = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1usize);
            MemoryCap::Auto.resolve_shared(on_node)
        }
        c => c.resolve(),
    };
    let bytes = bytes
        .ok_or_else(|| crate::Error::Input("a lender's auto cap: no memory limit found".into()))?;
    Ok(bytes.saturating_sub((bytes / 16).max(32 << 20)))
}

impl Lent {
    /// The lender's last line (with a newline): what it kept, held and
    /// handed back.
    pub fn line(&self, rank: usize, budget: u64) -> String {
        format!(
            "outcore lend: rank {rank}: kept {} images (at most {} at once, of {} allowed), \
             handed back {}, declined {}, asked for {} it did not hold\n",
            self.puts,
            outcore::format_bytes(self.peak_bytes),
            outcore::format_bytes(budget),
            self.gets,
            self.declined,
            self.misses,
        )
    }
}

/// The largest message: images go in pieces of 1 MiB.
pub(crate) const PIECE: usize = 1 << 20;

/// One lender, as a worker sees it.
struct Lender {
    /// The communicator it is reached on.
    comm: Comm,
    /// Its rank there.
    rank: usize,
    /// The room it said it had at its last answer (`u64::MAX` before
    /// any), and when (milliseconds since the tier was made).
    room: AtomicU64,
    room_at: AtomicU64,
    alive: AtomicBool,
}

impl Lender {
    /// The room to count on at `now` (the tier's milliseconds): what it
    /// said at its last answer, or any when that word is old.
    fn room(&self, now: u64) -> u64 {
        if now.saturating_sub(self.room_at.load(Ordering::Relaxed)) > ROOM_FRESH_MS {
            u64::MAX
        } else {
            self.room.load(Ordering::Relaxed)
        }
    }
}

/// How old a lender's word on its room may be before a put that it would
/// not fit asks it again: a lender's room grows as its owners drop images
/// and as a working rank's own work shrinks.
const ROOM_FRESH_MS: u64 = 100;

/// What went through the tier, for the statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteFigures {
    /// Lenders at the start.
    pub lenders: usize,
    /// Of those, found dead (no answer in time).
    pub lost: usize,
}

/// The workers' side of the tier: puts go to a lender with room, in
/// turn; each image's lender is remembered for its get and its drop.
pub struct RemoteTier {
    lenders: Vec<Lender>,
    /// When it was made (the clock of `Lender::room_at`).
    born: Instant,
    /// Buffers of a piece each, reused from get to get: no fresh pages
    /// to fault in and zero for every image.
    buffers: Mutex<Vec<Vec<u8>>>,
    /// Where each image went: its lender's index.
    placed: Mutex<HashMap<TierKey, usize>>,
    /// The next lender to try.
    turn: AtomicUsize,
    /// Requests made so far (their tags).
    requests: AtomicU32,
    /// How long a lender may take to answer one message.
    patience: Duration,
    /// Said once: a lender found dead.
    told: AtomicBool,
    /// Set by [`RemoteTier::goodbye`]: every call fails from then on
    /// (MPI may be finalised soon after).
    closed: AtomicBool,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier")
            .field(
                "lenders",
                &self.lenders.iter().map(|l| l.rank).collect::<Vec<_>>(),
            )
            .field("figures", &self.figures())
            .finish()
    }
}

impl RemoteTier {
    /// A tier over the lenders at `lenders` (a communicator and a rank
    /// there, each).
    pub(crate) fn new(lenders: &[(Comm, usize)]) -> RemoteTier {
        let patience = std::env::var("OUTCORE_REMOTE_PATIENCE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(10), Duration::from_millis);
        RemoteTier {
            lenders: lenders
                .iter()
                .map(|&(comm, rank)| Lender {
                    comm,
                    rank,
                    room: AtomicU64::new(u64::MAX),
                    room_at: AtomicU64::new(0),
                    alive: AtomicBool::new(true),
                })
                .collect(),
            born: Instant::now(),
            buffers: Mutex::new(Vec::new()),
            placed: Mutex::new(HashMap::new()),
            turn: AtomicUsize::new(0),
            requests: AtomicU32::new(0),
            patience,
            told: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Lenders at the start, and those found dead since.
    pub fn figures(&self) -> RemoteFigures {
        RemoteFigures {
            lenders: self.lenders.len(),
            lost: self
                .lenders
                .iter()
                .filter(|l| !l.alive.load(Ordering::Relaxed))
                .count(),
        }
    }

    /// Tells every lender this worker is done (they forget its images,
    /// and end once every worker has said it), those found dead too (a
    /// slow one is only marked so, and waits for it); `lost`: some worker
    /// found a lender dead. Every call fails from then on.
    pub fn goodbye(&self, lost: bool) {
        self.closed.store(true, Ordering::Relaxed);
        let none = TierKey {
            runtime: 0,
            executor: 0,
            generation: 0,
        };
        for l in &self.lenders {
            let h = self.header(wire::Op::Bye, none, u64::from(lost), 0);
            // A small message: it goes even to a dead peer (and is lost).
            let _ = wire::send(l.comm, l.rank, wire::REQUEST, h.encode(), self.patience);
        }
    }

    /// A request's header.
    fn header(&self, op: wire::Op, key: TierKey, len: u64, tag: i32) -> wire::Header {
        wire::Header {
            op,
            runtime: key.runtime,
            executor: key.executor,
            generation: key.generation,
            len,
            tag,
        }
    }

    /// An error unless the tier is open.
    fn open(&self) -> io::Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(io::Error::other("the lenders' tier is closed"));
        }
        Ok(())
    }

    /// Sends a request's header to `l` (a new tag for the requests
    /// answered, PUT and GET; none for the others): its first tag.
    fn request(&self, l: &Lender, op: wire::Op, key: TierKey, len: u64) -> io::Result<i32> {
        self.open()?;
        let tag = match op {
            wire::Op::Put | wire::Op::Get => {
                lend::tag_of(self.requests.fetch_add(1, Ordering::Relaxed))
            }
            wire::Op::Drop | wire::Op::Bye => 0,
        };
        let h = self.header(op, key, len, tag);
        self.checked(
            l,
            wire::send(l.comm, l.rank, wire::REQUEST, h.encode(), self.patience),
        )?;
        Ok(tag)
    }

    /// `r`, and when it timed out, `l` marked dead (said once).
    fn checked<T>(&self, l: &Lender, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            if e.kind() == io::ErrorKind::TimedOut && l.alive.swap(false, Ordering::Relaxed) {
                self.placed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|_, &mut i| !std::ptr::eq(&self.lenders[i], l));
                if !self.told.swap(true, Ordering::Relaxed) {
                    // One write: mpirun forwards the pieces as they come.
                    let line = format!(
                        "outcore: warning: the lender at rank {} is gone ({e}): the executors it \
                         held are read from the disk or their input instead\n",
                        l.rank
                    );
                    let _ = io::stderr().write_all(line.as_bytes());
                }
            }
        }
        r
    }

    /// Buffers for a get's pieces, used before.
    fn buffers(&self) -> Vec<Vec<u8>> {
        let mut kept = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let n = kept.len().saturating_sub(AHEAD + 1);
        kept.split_off(n)
    }

    /// Keeps a get's piece buffers for the next gets (a few: a get's
    /// pieces, for each of a few loads at once).
    fn keep_buffers(&self, spare: Vec<Vec<u8>>) {
        let mut kept = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let room = (4 * (AHEAD + 1)).saturating_sub(kept.len());
        kept.extend(
            spare
                .into_iter()
                .filter(|b| b.capacity() >= PIECE)
                .take(room),
        );
    }

    /// Milliseconds since the tier was made.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The next living lender with room for `len` bytes, in turn (or
    /// whose word on its room is old).
    fn pick(&self, len: u64) -> Option<(usize, &Lender)> {
        let n = self.lenders.len();
        let start = self.turn.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        (0..n).map(|k| (start + k) % n).find_map(|i| {
            let l = &self.lenders[i];
            (l.alive.load(Ordering::Relaxed) && l.room(now) >= len).then_some((i, l))
        })
    }

    /// A PUT to `l`: go or not, then the body and the end, then kept or
    /// not.
    fn put_to(
        &self,
        l: &Lender,
        key: TierKey,
        len: u64,
        write: &mut dyn FnMut(&mut dyn Write) -> io::Result<TierHead>,
    ) -> io::Result<bool> {
        let tag = self.request(l, wire::Op::Put, key, len)?;
        // The lender's answers: go (or kept), and its room now.
        let answer = || -> io::Result<bool> {
            let a = self.checked(l, wire::recv(l.comm, l.rank, tag + 2, 16, self.patience))?;
            let w = wire::words(&a).unwrap_or_default();
            l.room
                .store(w.get(1).copied().unwrap_or(0), Ordering::Relaxed);
            l.room_at.store(self.now_ms(), Ordering::Relaxed);
            Ok(w.first() == Some(&1))
        };
        if !answer()? {
            return Ok(false);
        }
        let mut out = Out {
            tier: self,
            lender: l,
            tag,
            sent: 0,
        };
        // The value's `Serialize` is user code: a panic ends the put (the
        // lender told to drop it) before it goes on up.
        let head = catch_unwind(AssertUnwindSafe(|| write(&mut out)));
        let sent = out.sent;
        let ok = matches!(head, Ok(Ok(_)));
        let mut end = wire::bytes(&[u64::from(ok), sent]);
        if let Ok(Ok(h)) = &head {
            end.extend_from_slice(h);
        }
        self.checked(l, wire::send(l.comm, l.rank, tag + 1, end, self.patience))?;
        match head {
            Ok(h) => h?,
            Err(p) => resume_unwind(p),
        };
        answer()
    }
}

/// The body of a PUT, sent in pieces as the runtime writes it.
struct Out<'a> {
    tier: &'a RemoteTier,
    lender: &'a Lender,
    tag: i32,
    sent: u64,
}

impl Write for Out<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = b.len().min(PIECE);
        let t = self.tier;
        let r = wire::send(
            self.lender.comm,
            self.lender.rank,
            self.tag,
            b[..n].to_vec(),
            t.patience,
        );
        t.checked(self.lender, r)?;
        self.sent += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The image of a GET, received in pieces as the runtime reads it, the
/// next [`AHEAD`] already on their way.
struct In<'a> {
    tier: &'a RemoteTier,
    lender: &'a Lender,
    pieces: wire::Ahead,
    piece: Vec<u8>,
    at: usize,
}

/// Pieces of a GET received ahead of the reader: the lender sends them
/// back to back, and the transfer of one overlaps the decoding of the
/// one before.
const AHEAD: usize = 4;

impl In<'_> {
    /// Takes every piece the reader left (it stopped part-way), so that
    /// none waits for ever at the lender.
    fn drain(&mut self) {
        while self.lender.alive.load(Ordering::Relaxed) {
            match self.pieces.next() {
                Ok(Some(p)) => self.pieces.give_back(p),
                Ok(None) => return,
                Err(e) => {
                    let _ = self.tier.checked(self.lender, Err::<(), _>(e));
                    return;
                }
            }
        }
    }
}

impl Read for In<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.piece.len() {
            let next = self.pieces.next();
            let Some(p) = self.tier.checked(self.lender, next)? else {
                return Ok(0);
            };
            let old = std::mem::replace(&mut self.piece, p);
            self.pieces.give_back(old);
            self.at = 0;
        }
        let n = buf.len().min(self.piece.len() - self.at);
        buf[..n].copy_from_slice(&self.piece[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl SpillTier for RemoteTier {
    fn name(&self) -> String {
        let ranks: Vec<String> = self.lenders.iter().map(|l| l.rank.to_string()).collect();
        format!("the memory of the lenders at ranks {}", ranks.join(", "))
    }

    fn room(&self) -> u64 {
        let now = self.now_ms();
        self.lenders
            .iter()
            .filter(|l| l.alive.load(Ordering::Relaxed))
            .map(|l| l.room(now))
            .max()
            .unwrap_or(0)
    }

    fn put(
        &self,
        key: TierKey,
        len: u64,
        write: &mut dyn FnMut(&mut dyn Write) -> io::Result<TierHead>,
    ) -> io::Result<bool> {
        self.open()?;
        let Some((i, l)) = self.pick(len) else {
            return Ok(false);
        };
        let kept = self.put_to(l, key, len, write)?;
        if kept {
            self.placed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, i);
        }
        Ok(kept)
    }

    fn get(
        &self,
        key: TierKey,
        read: &mut dyn FnMut(&mut dyn Read, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        self.open()?;
        let i = self
            .placed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .copied();
        let l = i
            .map(|i| &self.lenders[i])
            .filter(|l| l.alive.load(Ordering::Relaxed))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no lender holds it"))?;
        let tag = self.request(l, wire::Op::Get, key, 0)?;
        let a = self.checked(l, wire::recv(l.comm, l.rank, tag, 8, self.patience))?;
        let len = wire::words(&a)
            .and_then(|w| w.first().copied())
            .unwrap_or(0);
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("the lender at rank {} no longer holds it", l.rank),
            ));
        }
        let whole = usize::try_from(len).unwrap_or(usize::MAX);
        let sizes = (0..whole.div_ceil(PIECE)).map(|i| PIECE.min(whole - i * PIECE));
        let mut input = In {
            tier: self,
            lender: l,
            pieces: wire::Ahead::new(
                (l.comm, l.rank, tag + 1),
                sizes,
                AHEAD,
                self.patience,
                self.buffers(),
            ),
            piece: Vec::new(),
            at: 0,
        };
        // The value's `Deserialize` is user code: on a panic, the pieces
        // are taken first (below), then it goes on up.
        let r = catch_unwind(AssertUnwindSafe(|| read(&mut input, len)));
        // What the reader left (it failed part-way): taken.
        if !input.pieces.done() {
            input.drain();
        }
        let last = std::mem::take(&mut input.piece);
        input.pieces.give_back(last);
        let spare = input.pieces.take_spare();
        self.keep_buffers(spare);
        r.unwrap_or_else(|p| resume_unwind(p))
    }

    fn remove(&self, key: TierKey) {
        let i = self
            .placed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        if let Some(l) = i
            .map(|i| &self.lenders[i])
            .filter(|l| l.alive.load(Ordering::Relaxed))
        {
            let _ = self.request(l, wire::Op::Drop, key, 0);
        }
    }
}
