//! The lender's side: a memory-only rank (`outcore lend`) keeps the
//! images the workers put, within its own cap, until they drop them or
//! say goodbye.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
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
}

/// An image's key: the worker, its runtime, the executor and the
/// generation.
type Key = (usize, u64, u64, u64);

/// The images one lender holds.
struct Held {
    images: HashMap<Key, Vec<u8>>,
    /// Their memory (capacities).
    bytes: u64,
    /// Images leaked (a send that did not complete: MPI may still read
    /// them), still taking memory.
    leaked: u64,
    /// What may be held: the cap less a margin for the lender itself.
    budget: u64,
}

impl Held {
    fn room(&self) -> u64 {
        self.budget.saturating_sub(self.bytes + self.leaked)
    }
}

/// The key of request `h` from worker `from`.
fn key(from: usize, h: &Header) -> Key {
    (from, h.runtime, h.executor, h.generation)
}

/// How long a lender waits for a worker in the middle of a request:
/// no longer than the workers wait for it (`RemoteTier`'s patience).
const PATIENCE: Duration = Duration::from_secs(10);

/// Serves `workers` (their ranks on `comm`) until each has said goodbye,
/// holding at most `budget` bytes of images. `die_after`: a test's fault
/// (the lender kills itself with SIGKILL after that many gets).
pub(crate) fn serve(
    comm: Comm,
    workers: usize,
    budget: u64,
    die_after: Option<u64>,
) -> io::Result<Lent> {
    let mut held = Held {
        images: HashMap::new(),
        bytes: 0,
        leaked: 0,
        budget,
    };
    let mut lent = Lent::default();
    let mut byes = 0;
    let mut idle = wire::Backoff::new(Duration::from_millis(1));
    while byes < workers {
        let Some((from, len)) = wire::probe(comm, None, wire::REQUEST) else {
            idle.pause();
            continue;
        };
        idle = wire::Backoff::new(Duration::from_millis(1));
        let raw = wire::recv(comm, from, wire::REQUEST, len, PATIENCE)?;
        let Some(h) = Header::decode(&raw) else {
            continue;
        };
        // A worker that goes away mid-request costs that request only.
        let _ = match h.op {
            Op::Put => take(comm, from, &h, &mut held, &mut lent),
            Op::Get => {
                let r = match give(comm, from, &h, &held) {
                    Ok(()) => Ok(()),
                    Err(Gave::Early(e)) => Err(e),
                    Err(Gave::Stuck(e)) => {
                        // MPI may still read it: leaked, not freed.
                        if let Some(v) = held.images.remove(&key(from, &h)) {
                            held.bytes -= v.capacity() as u64;
                            held.leaked += v.capacity() as u64;
                            std::mem::forget(v);
                        }
                        Err(e)
                    }
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
                forget(&mut held, |k| k == key(from, &h));
                Ok(())
            }
            Op::Bye => {
                byes += 1;
                lent.lost |= h.len == 1;
                forget(&mut held, |k| k.0 == from);
                Ok(())
            }
        };
        lent.peak_bytes = lent.peak_bytes.max(held.bytes);
    }
    Ok(lent)
}

/// Forgets the images whose key `which` picks.
fn forget(held: &mut Held, which: impl Fn(Key) -> bool) {
    let gone: Vec<_> = held.images.keys().copied().filter(|&k| which(k)).collect();
    for k in gone {
        if let Some(v) = held.images.remove(&k) {
            held.bytes -= v.capacity() as u64;
        }
    }
}

/// A PUT: says whether there is room, then takes the pieces and the end
/// (its head and the body's length) and says whether it kept the image.
fn take(comm: Comm, from: usize, h: &Header, held: &mut Held, lent: &mut Lent) -> io::Result<()> {
    let room = held.room();
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
    let kept = len <= held.room();
    if kept {
        held.bytes += len;
        if let Some(old) = held.images.insert(key(from, h), image) {
            held.bytes -= old.capacity() as u64;
        }
        lent.puts += 1;
    } else {
        lent.declined += 1;
    }
    let answer = wire::bytes(&[u64::from(kept), held.room()]);
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
    /// A piece of the image did not go in time: MPI may still read the
    /// image, which must be leaked.
    Stuck(io::Error),
}

/// A GET: the image's length (0: not held), then its pieces, sent from
/// where the image lies.
fn give(comm: Comm, from: usize, h: &Header, held: &Held) -> Result<(), Gave> {
    let image = held.images.get(&key(from, h));
    let len = image.map_or(0, |v| v.len() as u64);
    wire::send(comm, from, h.tag, wire::bytes(&[len]), PATIENCE).map_err(Gave::Early)?;
    let Some(image) = image else {
        return Err(Gave::Missing);
    };
    for piece in image.chunks(PIECE) {
        // SAFETY: on `Stuck` the image is leaked (see `serve`): never
        // freed or changed while MPI may still read it.
        if let Err(stuck) = unsafe { wire::send_ref(comm, from, h.tag + 1, piece, PATIENCE) } {
            return Err(Gave::Stuck(stuck.into()));
        }
    }
    Ok(())
}

/// The tag of a request's first message, from a running count: three in
/// a row per request, above the requests' own tag, within the 32,767 MPI
/// guarantees.
pub(super) fn tag_of(n: u32) -> c_int {
    let slot = c_int::try_from(n % 10_000).unwrap_or(0);
    16 + 3 * slot
}
