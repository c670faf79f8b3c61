//! The lender's side: a memory-only rank (`outcore lend`), or a working
//! rank with memory its work does not need, keeps the images the workers
//! put, within its own cap, until they drop them or say goodbye; a
//! working rank gives them back when its own work needs the room.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use outcore::TIER_HEAD_LEN;

use super::wire::{self, Comm, Header, Op};
use super::PIECE;

/// What a lender did, for its last line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lent {
    /// Images kept.
    pub puts: u64,
    /// Puts declined for lack of room, before or after the image came.
    pub declined: u64,
    /// Images handed back.
    pub gets: u64,
    /// Gets of images it did not hold (forgotten, or never kept).
    pub misses: u64,
    /// The most bytes held at once.
    pub peak_bytes: u64,
    /// Some worker found a lender dead (said in its goodbye).
    pub lost: bool,
    /// Images given back before their owners asked, to make room for
    /// this rank's own work (a working rank's).
    pub shed: u64,
}

/// An image's key: the worker, its runtime, the executor and the
/// generation.
type Key = (usize, u64, u64, u64);

/// The images one lender holds.
struct Held {
    images: HashMap<Key, Vec<u8>>,
    /// Their memory (capacities), with an image out of the map while it
    /// is sent (see `give`).
    bytes: u64,
    /// Images leaked (a send that did not complete: MPI may still read
    /// them), still taking memory.
    leaked: u64,
}

/// What a lender may hold.
#[derive(Debug)]
enum Budget {
    /// A memory-only rank (`outcore lend`): this many bytes of images.
    Fixed(u64),
    /// A working rank: what its work leaves under its cap (0: none yet,
    /// or none at all), less a margin (see [`spare`]).
    Spare(AtomicU64),
}

/// The process's memory in use, as a lender sees it: the allocator's
/// count, or the resident set where that is larger (what `top` shows:
/// in a Python rank, the script's own arrays, which are not in the
/// count).
fn in_use() -> u64 {
    (outcore::current_usage() as u64).max(resident())
}

/// The process's resident set ([`outcore::resident_set`]), read at
/// most every 5 ms (a serving loop asks far more often); 0 where it
/// cannot be read.
fn resident() -> u64 {
    static READ_AT: AtomicU64 = AtomicU64::new(0);
    static BYTES: AtomicU64 = AtomicU64::new(0);
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let now = u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let at = READ_AT.load(Ordering::Relaxed);
    if at != 0 && now.saturating_sub(at) < 5 {
        return BYTES.load(Ordering::Relaxed);
    }
    READ_AT.store(now, Ordering::Relaxed);
    let bytes = outcore::resident_set().unwrap_or(0);
    BYTES.store(bytes, Ordering::Relaxed);
    bytes
}

/// The margin a working rank keeps under its cap when it lends: an
/// eighth of the cap, at least 32 MiB. It lends while its memory in use
/// is under `cap - margin`, and gives images back when its own work
/// takes it past `cap - margin / 2`.
fn margin(cap: u64) -> u64 {
    (cap / 8).max(32 << 20).min(cap)
}

/// The images a rank keeps for the others, shared by its serving loop
/// and (on a working rank) its runtime, which takes memory back from it
/// before evicting its own executors ([`outcore::Reclaim`]).
#[derive(Debug)]
pub(crate) struct Pool {
    held: Mutex<Held>,
    budget: Budget,
    /// Images given back to make room, and their bytes.
    shed: AtomicU64,
    shed_bytes: AtomicU64,
    /// The most bytes of images held at once.
    peak: AtomicU64,
    /// Set when the rank ends: the loop stops soon after.
    stop: AtomicBool,
    /// The process's memory in use (`outcore::current_usage`; another
    /// count in tests).
    usage: fn() -> u64,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("images", &self.images.len())
            .field("bytes", &self.bytes)
            .field("leaked", &self.leaked)
            .finish()
    }
}

impl Pool {
    /// A memory-only rank's: at most `budget` bytes.
    pub(crate) fn fixed(budget: u64) -> Pool {
        Pool::with(Budget::Fixed(budget))
    }

    /// A working rank's: nothing until [`Pool::set_cap`].
    pub(crate) fn spare() -> Pool {
        Pool::with(Budget::Spare(AtomicU64::new(0)))
    }

    fn with(budget: Budget) -> Pool {
        Pool {
            held: Mutex::new(Held {
                images: HashMap::new(),
                bytes: 0,
                leaked: 0,
            }),
            budget,
            shed: AtomicU64::new(0),
            shed_bytes: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            usage: in_use,
        }
    }

    /// A working rank's cap (0: lend nothing). No effect on a fixed
    /// budget.
    pub(crate) fn set_cap(&self, cap: u64) {
        if let Budget::Spare(c) = &self.budget {
            c.store(cap, Ordering::Relaxed);
        }
    }

    /// Asks the serving loop to end (it finishes the request it serves).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // The map stays consistent at every step: a panic cannot break it.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes it takes now: `len` more fit when `len <= room`.
    fn room(&self) -> u64 {
        match &self.budget {
            Budget::Fixed(b) => {
                let h = self.held();
                b.saturating_sub(h.bytes + h.leaked)
            }
            Budget::Spare(cap) => {
                let cap = cap.load(Ordering::Relaxed);
                (cap - margin(cap)).saturating_sub((self.usage)())
            }
        }
    }

    /// Whether an image of `len` bytes, received (in memory already),
    /// may be kept.
    fn keeps(&self, len: u64) -> bool {
        match &self.budget {
            Budget::Fixed(b) => {
                let h = self.held();
                h.bytes + h.leaked + len <= *b
            }
            Budget::Spare(cap) => {
                let cap = cap.load(Ordering::Relaxed);
                (self.usage)() <= cap - margin(cap)
            }
        }
    }

    /// On a working rank whose own work took its memory past `cap -
    /// margin / 2`: images given back until it is under `cap - margin`.
    fn shed_over(&self) {
        if let Budget::Spare(cap) = &self.budget {
            let cap = cap.load(Ordering::Relaxed);
            let used = (self.usage)();
            if cap > 0 && used > cap - margin(cap) / 2 {
                self.shed(used - (cap - margin(cap)));
            }
        }
    }

    /// Forgets images (any: the owners read them from their disk or
    /// input instead) until `bytes` are freed or none is left: the bytes
    /// freed.
    fn shed(&self, bytes: u64) -> u64 {
        let mut freed = 0;
        let mut n = 0;
        let mut h = self.held();
        // One pass over the map (taking the first key again and again
        // scanned it from the start each time).
        h.images.retain(|_, v| {
            if freed >= bytes {
                return true;
            }
            freed += v.capacity() as u64;
            n += 1;
            false
        });
        h.bytes -= freed;
        drop(h);
        self.shed.fetch_add(n, Ordering::Relaxed);
        self.shed_bytes.fetch_add(freed, Ordering::Relaxed);
        freed
    }

    /// The most bytes of images held at once so far, and the bytes
    /// given back to make room.
    pub(crate) fn figures(&self) -> (u64, u64) {
        (
            self.peak.load(Ordering::Relaxed),
            self.shed_bytes.load(Ordering::Relaxed),
        )
    }
}

impl outcore::Reclaim for Pool {
    fn reclaim(&self, bytes: u64) -> u64 {
        self.shed(bytes)
    }
}

/// The key of request `h` from worker `from`.
fn key(from: usize, h: &Header) -> Key {
    (from, h.runtime, h.executor, h.generation)
}

/// The longest nap between looks for a request during a run of them:
/// a load waits for its lender's answer no more than this.
const BUSY: Duration = Duration::from_micros(50);

/// How long after a request the lender still looks within [`BUSY`].
const RUN: Duration = Duration::from_millis(100);

/// How long a lender waits for a worker in the middle of a request:
/// no longer than the workers wait for it (`RemoteTier`'s patience).
const PATIENCE: Duration = Duration::from_secs(10);

/// Serves the workers on `comm` until `byes` of them have said goodbye
/// (or the pool is stopped), keeping their images in `pool`. `idle`: the
/// longest nap between looks for a request. `die_after`: a test's fault
/// (the lender kills itself with SIGKILL after that many gets).
pub(crate) fn serve(
    comm: Comm,
    byes: usize,
    pool: &Pool,
    idle: Duration,
    die_after: Option<u64>,
) -> io::Result<Lent> {
    let mut lent = Lent::default();
    let mut said = 0;
    let mut nap = wire::Backoff::new(idle);
    let mut last = Instant::now();
    let mut stopped: Option<Instant> = None;
    while said < byes {
        pool.shed_over();
        if pool.stop.load(Ordering::Relaxed) {
            // The workers' goodbyes are on their way: a while for them.
            if stopped.get_or_insert_with(Instant::now).elapsed() > PATIENCE {
                break;
            }
        }
        let Some((from, len)) = wire::probe(comm, None, wire::REQUEST) else {
            // Requests come in runs (a pass's loads): within one, the
            // next is looked for within `BUSY`; long after, within
            // `idle`.
            if last.elapsed() > RUN {
                nap.relax(idle);
            }
            nap.pause();
            continue;
        };
        nap = wire::Backoff::new(BUSY.min(idle));
        last = Instant::now();
        let raw = wire::recv(comm, from, wire::REQUEST, len, PATIENCE)?;
        let Some(h) = Header::decode(&raw) else {
            continue;
        };
        // A worker that goes away mid-request costs that request only.
        let _ = match h.op {
            Op::Put => take(comm, from, &h, pool, &mut lent),
            Op::Get => {
                let r = match give(comm, from, &h, pool) {
                    Ok(()) => Ok(()),
                    Err(Gave::Early(e)) => Err(e),
                    Err(Gave::Missing) => {
                        lent.misses += 1;
                        Ok(())
                    }
                };
                if r.is_ok() {
                    lent.gets += 1;
                }
                if die_after.is_some_and(|n| lent.gets >= n) {
                    // SAFETY: a plain syscall: this process kills itself.
                    unsafe {
                        libc::raise(libc::SIGKILL);
                    }
                }
                r
            }
            Op::Drop => {
                forget(&mut pool.held(), |k| k == key(from, &h));
                Ok(())
            }
            Op::Bye => {
                said += 1;
                lent.lost |= h.len == 1;
                forget(&mut pool.held(), |k| k.0 == from);
                Ok(())
            }
        };
    }
    lent.peak_bytes = pool.peak.load(Ordering::Relaxed);
    lent.shed = pool.shed.load(Ordering::Relaxed);
    Ok(lent)
}

/// Forgets the images whose key `which` picks.
fn forget(held: &mut Held, which: impl Fn(Key) -> bool) {
    held.images.retain(|&k, v| {
        let keep = !which(k);
        if !keep {
            held.bytes -= v.capacity() as u64;
        }
        keep
    });
}

/// A PUT: says whether there is room, then takes the pieces and the end
/// (its head and the body's length) and says whether it kept the image.
fn take(comm: Comm, from: usize, h: &Header, pool: &Pool, lent: &mut Lent) -> io::Result<()> {
    let room = pool.room();
    let go = h.len <= room;
    wire::send(
        comm,
        from,
        h.tag + 2,
        wire::bytes(&[u64::from(go), room]),
        PATIENCE,
    )?;
    if !go {
        lent.declined += 1;
        return Ok(());
    }
    let Some(mut image) = receive_image(comm, from, h)? else {
        return Ok(());
    };
    // Reserved for the executor's size in memory, which its image may
    // not fill.
    image.shrink_to_fit();
    let len = image.capacity() as u64;
    let kept = pool.keeps(len);
    if kept {
        let mut held = pool.held();
        held.bytes += len;
        if let Some(old) = held.images.insert(key(from, h), image) {
            held.bytes -= old.capacity() as u64;
        }
        pool.peak.fetch_max(held.bytes, Ordering::Relaxed);
        lent.puts += 1;
    } else {
        drop(image);
        lent.declined += 1;
    }
    let answer = wire::bytes(&[u64::from(kept), pool.room()]);
    wire::send(comm, from, h.tag + 2, answer, PATIENCE)
}

/// The pieces of a PUT (tag `h.tag`) and its end (tag `h.tag + 1`: a
/// flag, the body's length, then the head): the image, head first
/// (`None` when the worker gave up). The pieces land in place, after
/// room for the head.
fn receive_image(comm: Comm, from: usize, h: &Header) -> io::Result<Option<Vec<u8>>> {
    let want = usize::try_from(h.len).unwrap_or(0);
    let mut image: Vec<u8> = Vec::with_capacity(TIER_HEAD_LEN + want);
    image.resize(TIER_HEAD_LEN, 0);
    let mut end: Option<(bool, u64, Vec<u8>)> = None;
    let deadline = Instant::now() + PATIENCE;
    let mut wait = wire::Backoff::new(Duration::from_micros(200));
    loop {
        if let Some((_, n)) = wire::probe(comm, Some(from), h.tag) {
            wire::recv_append(comm, from, h.tag, &mut image, n, PATIENCE)?;
            wait = wire::Backoff::new(Duration::from_micros(200));
        } else if end.is_none() {
            if let Some((_, n)) = wire::probe(comm, Some(from), h.tag + 1) {
                let e = wire::recv(comm, from, h.tag + 1, n, PATIENCE)?;
                let w = wire::words(&e[..16.min(e.len())]).unwrap_or_default();
                let (ok, len) = (w.first() == Some(&1), w.get(1).copied().unwrap_or(0));
                end = Some((ok, len, e.get(16..).unwrap_or_default().to_vec()));
            }
        }
        let body = (image.len() - TIER_HEAD_LEN) as u64;
        match &end {
            Some((false, _, _)) => return Ok(None),
            Some((true, len, head)) if body == *len && head.len() == TIER_HEAD_LEN => {
                image[..TIER_HEAD_LEN].copy_from_slice(head);
                return Ok(Some(image));
            }
            Some((true, _, head)) if head.len() != TIER_HEAD_LEN => {
                return Err(io::Error::other(format!(
                    "rank {from} sent a head of {} bytes",
                    head.len()
                )));
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("rank {from} stopped sending an image"),
            ));
        }
        wait.pause();
    }
}

/// Why a GET failed.
enum Gave {
    /// Not held: its length 0 said.
    Missing,
    /// Before any piece of the image.
    Early(io::Error),
}

/// A GET: the image's length (0: not held), then its pieces, sent from
/// where the image lies. The image is out of the pool meanwhile (it
/// cannot be given back under the send), and back in it after; leaked
/// when a piece did not go in time (MPI may still read it).
fn give(comm: Comm, from: usize, h: &Header, pool: &Pool) -> Result<(), Gave> {
    let k = key(from, h);
    let image = pool.held().images.remove(&k);
    let len = image.as_ref().map_or(0, |v| v.len() as u64);
    let told = wire::send(comm, from, h.tag, wire::bytes(&[len]), PATIENCE);
    let Some(image) = image else {
        return told.map_err(Gave::Early).and(Err(Gave::Missing));
    };
    let back = |image: Vec<u8>| {
        pool.held().images.insert(k, image);
    };
    if let Err(e) = told {
        back(image);
        return Err(Gave::Early(e));
    }
    // Every piece posted at once: the worker takes them back to back.
    // SAFETY: on an error the image is leaked below: never freed or
    // changed while MPI may still read it.
    let sent = unsafe { wire::send_pieces_ref(comm, from, h.tag + 1, &image, PIECE, PATIENCE) };
    if let Err(stuck) = sent {
        let mut held = pool.held();
        held.bytes -= image.capacity() as u64;
        held.leaked += image.capacity() as u64;
        std::mem::forget(image);
        return Err(Gave::Early(stuck.into()));
    }
    back(image);
    Ok(())
}

/// The tag of a request's first message, from a running count: three in
/// a row per request, above the requests' own tag, within the 32,767 MPI
/// guarantees.
pub(super) fn tag_of(n: u32) -> c_int {
    let slot = c_int::try_from(n % 10_000).unwrap_or(0);
    16 + 3 * slot
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory in use the pools under test see.
    static USED: AtomicU64 = AtomicU64::new(0);

    fn spare(cap: u64) -> Pool {
        let mut p = Pool::spare();
        p.usage = || USED.load(Ordering::Relaxed);
        p.set_cap(cap);
        p
    }

    fn hold(p: &Pool, n: u64, len: usize) {
        let mut h = p.held();
        for i in 0..n {
            let v = vec![0u8; len];
            h.bytes += v.capacity() as u64;
            h.images.insert((1, 1, i, 1), v);
        }
    }

    const MIB: u64 = 1 << 20;

    // One test: the pools share `USED`.
    #[test]
    fn a_working_rank_lends_what_its_work_leaves_and_takes_it_back() {
        // No cap yet: nothing lent.
        let p = spare(0);
        USED.store(10 * MIB, Ordering::Relaxed);
        assert_eq!(p.room(), 0);
        assert!(!p.keeps(1));
        // 256 MiB: a margin of 32, 10 in use.
        p.set_cap(256 * MIB);
        assert_eq!(p.room(), (256 - 32 - 10) * MIB);
        // An image received (in use now) is kept while under the line.
        USED.store(224 * MIB, Ordering::Relaxed);
        assert!(p.keeps(MIB));
        USED.store(225 * MIB, Ordering::Relaxed);
        assert!(!p.keeps(MIB));
        // 64 images of 1 MiB held; the rank's own work grows into the
        // margin, but not past its half: nothing given back.
        hold(&p, 64, MIB as usize);
        USED.store(240 * MIB, Ordering::Relaxed);
        p.shed_over();
        assert_eq!(p.held().images.len(), 64);
        // Past it: given back down to the line (20 MiB).
        USED.store(244 * MIB, Ordering::Relaxed);
        p.shed_over();
        assert_eq!(p.held().images.len(), 44);
        assert_eq!(p.held().bytes, 44 * MIB);
        assert_eq!(p.figures().1, 20 * MIB);
        // The runtime takes what it asks for (whole images), and no more
        // than there is.
        assert_eq!(p.shed(MIB + 1), 2 * MIB);
        assert_eq!(p.shed(u64::MAX), 42 * MIB);
        assert!(p.held().images.is_empty());
        assert_eq!(p.figures().1, 64 * MIB);
    }

    #[test]
    fn a_lender_holds_its_budget_and_no_more() {
        let p = Pool::fixed(8 * MIB);
        assert_eq!(p.room(), 8 * MIB);
        hold(&p, 6, MIB as usize);
        assert_eq!(p.room(), 2 * MIB);
        assert!(p.keeps(2 * MIB) && !p.keeps(2 * MIB + 1));
        // Its own memory never makes it give images back.
        p.shed_over();
        assert_eq!(p.held().images.len(), 6);
    }
}
