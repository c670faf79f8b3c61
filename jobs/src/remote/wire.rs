//! Point-to-point messages with a deadline, on the tier's communicator.
//!
//! Open MPI does not tell the living about a dead peer: a blocking call
//! that involves it hangs, and a small send to it even succeeds (see
//! docs/design.md, "A lender's death"). So every call here is
//! nonblocking and polled until a deadline; past it the request is
//! cancelled and freed, and its buffer is leaked, since MPI may still
//! touch it. A buffer is always owned by the call (a copy of what is
//! sent), never borrowed from a value that may be freed meanwhile.

use std::ffi::c_int;
use std::io;
use std::time::{Duration, Instant};

use mpi::ffi;

/// The requests' tag: a request's header (see `Header`).
pub(super) const REQUEST: c_int = 1;

/// A communicator shared by threads (`MPI_THREAD_MULTIPLE`).
#[derive(Clone, Copy)]
pub(crate) struct Comm(pub ffi::MPI_Comm);

// SAFETY: the tier is only built when MPI granted MPI_THREAD_MULTIPLE
// (checked in `World::init`), under which any thread may use a
// communicator at any time; the handle stays valid while the `World`
// that owns the communicator lives, which outlives every tier call (the
// runtime holding the tier is dropped before the world).
unsafe impl Send for Comm {}
// SAFETY: as for `Send`.
unsafe impl Sync for Comm {}

/// An error for a peer that did not answer in time.
fn timed_out(what: &str, peer: usize, wait: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "rank {peer} did not {what} within {:.1} s",
            wait.as_secs_f64()
        ),
    )
}

/// An MPI call's error code as an error.
fn failed(what: &str, rc: c_int) -> io::Error {
    io::Error::other(format!("MPI {what} failed (error code {rc})"))
}

/// Polls `request` until it completes or `deadline` passes, with a
/// [`Backoff`] of up to 200 µs (the waiting thread is a worker or a
/// prefetcher, whose core the tasks want). On time: the status. Else the
/// request is cancelled and freed, and why.
fn complete(request: &mut ffi::MPI_Request, deadline: Instant) -> Result<ffi::MPI_Status, Failed> {
    let mut pause = Backoff::new(Duration::from_micros(200));
    loop {
        let mut flag: c_int = 0;
        // SAFETY: a zeroed MPI_Status is a valid plain C struct to be
        // written by MPI_Test.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: `request` is an active request this thread owns;
        // MPI_Test writes `flag` and `status` and, once complete, frees
        // the request (setting it to MPI_REQUEST_NULL).
        let rc = unsafe { ffi::MPI_Test(request, &mut flag, &mut status) };
        if rc != 0 {
            // SAFETY: `request` is still active (the test failed): cancelled
            // and freed, its buffer leaked by the caller.
            unsafe {
                ffi::MPI_Cancel(request);
                ffi::MPI_Request_free(request);
            }
            return Err(Failed::Error(rc));
        }
        if flag != 0 {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            // SAFETY: `request` is active and ours: cancelled, then freed
            // (MPI completes it in the background; the caller leaks the
            // buffer it uses).
            unsafe {
                ffi::MPI_Cancel(request);
                ffi::MPI_Request_free(request);
            }
            return Err(Failed::Late);
        }
        pause.pause();
    }
}

/// Why a request did not complete.
enum Failed {
    /// Not by its deadline.
    Late,
    /// MPI said this error code.
    Error(c_int),
}

impl Failed {
    /// The error for a request with `peer` that failed so (`what`: what
    /// the peer did not do in time).
    fn error(&self, what: &str, peer: usize, wait: Duration) -> io::Error {
        match self {
            Failed::Late => timed_out(what, peer, wait),
            Failed::Error(rc) => failed(&format!("a message with rank {peer}"), *rc),
        }
    }
}

/// Waiting for a peer: yields the core for the first `SPIN` (a message
/// between ranks takes tens of microseconds, less than a sleep's
/// granularity), then sleeps, doubling from 10 µs up to `most`.
pub(super) struct Backoff {
    since: Instant,
    nap: Duration,
    most: Duration,
}

/// How long a waiting thread yields before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

impl Backoff {
    pub(super) fn new(most: Duration) -> Backoff {
        Backoff {
            since: Instant::now(),
            nap: Duration::from_micros(10),
            most,
        }
    }

    /// Lets its naps grow to `most` from now on.
    pub(super) fn relax(&mut self, most: Duration) {
        self.most = most;
    }

    /// Waits a little.
    pub(super) fn pause(&mut self) {
        if self.since.elapsed() < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.nap);
            self.nap = (self.nap * 2).min(self.most);
        }
    }
}

/// A send or a receive that did not complete in time: MPI may still
/// touch its buffer, which must therefore never be freed or reused.
#[derive(Debug)]
pub(super) struct Stuck(io::Error);

impl From<Stuck> for io::Error {
    fn from(s: Stuck) -> io::Error {
        s.0
    }
}

/// Sends `buf` to `peer` under `tag`, waiting at most `wait`. On `Err`,
/// `buf` was leaked (MPI may still read it).
pub(super) fn send(
    comm: Comm,
    peer: usize,
    tag: c_int,
    buf: Vec<u8>,
    wait: Duration,
) -> io::Result<()> {
    // SAFETY: on `Stuck`, `buf` is leaked below: never freed.
    match unsafe { send_ref(comm, peer, tag, &buf, wait) } {
        Ok(()) => Ok(()),
        Err(stuck) => {
            std::mem::forget(buf);
            Err(stuck.into())
        }
    }
}

/// Sends `buf` to `peer` under `tag`, waiting at most `wait`, without a
/// copy.
///
/// # Safety
///
/// On `Err(Stuck)`, MPI may still read `buf`: the caller must leak it
/// (never free or change it).
pub(super) unsafe fn send_ref(
    comm: Comm,
    peer: usize,
    tag: c_int,
    buf: &[u8],
    wait: Duration,
) -> Result<(), Stuck> {
    // SAFETY: the caller leaks `buf` on `Err`, as `isend` needs.
    let mut request = unsafe { isend(comm, peer, tag, buf)? };
    complete(&mut request, Instant::now() + wait)
        .map(|_| ())
        .map_err(|f| Stuck(f.error("take a message", peer, wait)))
}

/// Posts a send of `buf` to `peer` under `tag`: its request.
///
/// # Safety
///
/// `buf` must stay alive and unchanged until the request completes, or
/// be leaked when it does not.
unsafe fn isend(
    comm: Comm,
    peer: usize,
    tag: c_int,
    buf: &[u8],
) -> Result<ffi::MPI_Request, Stuck> {
    let n = c_int::try_from(buf.len()).map_err(|_| Stuck(io::Error::other("message too long")))?;
    let dest = c_int::try_from(peer).map_err(|_| Stuck(io::Error::other("rank out of range")))?;
    // SAFETY: reads a constant handle the MPI shim defines.
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `buf` holds `n` bytes and stays alive and unchanged until
    // the request completes, or is leaked (the caller's duty); `comm` is
    // a live communicator.
    let rc = unsafe {
        ffi::MPI_Isend(
            buf.as_ptr().cast(),
            n,
            ffi::RSMPI_UINT8_T,
            dest,
            tag,
            comm.0,
            &mut request,
        )
    };
    if rc != 0 {
        return Err(Stuck(failed("Isend", rc)));
    }
    Ok(request)
}

/// Sends `buf` to `peer` under `tag` as messages of `piece` bytes, all
/// posted at once (the receiver takes them in order, back to back),
/// waiting at most `wait` for every one, without a copy.
///
/// # Safety
///
/// On `Err(Stuck)`, MPI may still read `buf`: the caller must leak it
/// (never free or change it).
pub(super) unsafe fn send_pieces_ref(
    comm: Comm,
    peer: usize,
    tag: c_int,
    buf: &[u8],
    piece: usize,
    wait: Duration,
) -> Result<(), Stuck> {
    let mut requests: Vec<ffi::MPI_Request> = Vec::with_capacity(buf.len().div_ceil(piece));
    for p in buf.chunks(piece.max(1)) {
        // SAFETY: `p` is part of `buf`, which the caller leaks on `Err`.
        match unsafe { isend(comm, peer, tag, p) } {
            Ok(r) => requests.push(r),
            Err(e) => {
                abandon(&mut requests);
                return Err(e);
            }
        }
    }
    complete_all(&mut requests, Instant::now() + wait)
        .map_err(|f| Stuck(f.error("take a message", peer, wait)))
}

/// Polls `requests` until every one completes or `deadline` passes; on a
/// failure or past it, those still active are cancelled and freed (their
/// buffers leaked by the caller).
fn complete_all(requests: &mut [ffi::MPI_Request], deadline: Instant) -> Result<(), Failed> {
    let n = c_int::try_from(requests.len()).map_err(|_| Failed::Error(-1))?;
    let mut pause = Backoff::new(Duration::from_micros(200));
    loop {
        let mut flag: c_int = 0;
        // SAFETY: `requests` holds `n` requests this thread owns (active,
        // or null once complete); MPI_Testall writes `flag` and, once all
        // are complete, frees them (setting each to MPI_REQUEST_NULL);
        // statuses are ignored.
        let rc = unsafe {
            ffi::MPI_Testall(
                n,
                requests.as_mut_ptr(),
                &mut flag,
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        if rc != 0 {
            abandon(requests);
            return Err(Failed::Error(rc));
        }
        if flag != 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            abandon(requests);
            return Err(Failed::Late);
        }
        pause.pause();
    }
}

/// Cancels and frees every request of `requests` still active (MPI
/// completes them in the background; the caller leaks their buffers).
fn abandon(requests: &mut [ffi::MPI_Request]) {
    // SAFETY: reads a constant handle the MPI shim defines.
    let null = unsafe { ffi::RSMPI_REQUEST_NULL };
    for r in requests.iter_mut().filter(|r| **r != null) {
        // SAFETY: `r` is an active request this thread owns: cancelled,
        // then freed.
        unsafe {
            ffi::MPI_Cancel(r);
            ffi::MPI_Request_free(r);
        }
    }
}

/// The pieces of one message stream from `peer` under `tag`, received
/// ahead: up to `depth` receives posted at once, each into a buffer of
/// its own, taken in order. Buffers handed back are reused. Receives
/// still posted when it is dropped (a deadline passed, or the reader
/// stopped) are cancelled and their buffers leaked: MPI may still write
/// them.
pub(super) struct Ahead {
    comm: Comm,
    peer: usize,
    tag: c_int,
    wait: Duration,
    depth: usize,
    /// Posted receives, oldest first, with their buffers.
    posted: std::collections::VecDeque<(ffi::MPI_Request, Vec<u8>)>,
    /// Lengths of the pieces still to post.
    due: std::collections::VecDeque<usize>,
    spare: Vec<Vec<u8>>,
}

impl Ahead {
    /// Pieces of lengths `due`, in order, received into `spare` buffers
    /// first (then new ones).
    pub(super) fn new(
        (comm, peer, tag): (Comm, usize, c_int),
        due: impl IntoIterator<Item = usize>,
        depth: usize,
        wait: Duration,
        spare: Vec<Vec<u8>>,
    ) -> Ahead {
        Ahead {
            comm,
            peer,
            tag,
            wait,
            depth: depth.max(1),
            posted: std::collections::VecDeque::new(),
            due: due.into_iter().collect(),
            spare,
        }
    }

    /// The buffers not in use (none is, once every piece was taken).
    pub(super) fn take_spare(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.spare)
    }

    /// Whether every piece was taken.
    pub(super) fn done(&self) -> bool {
        self.posted.is_empty() && self.due.is_empty()
    }

    /// Posts receives until `depth` are posted or none is due.
    fn post(&mut self) -> io::Result<()> {
        while self.posted.len() < self.depth {
            let Some(len) = self.due.pop_front() else {
                return Ok(());
            };
            let mut buf = self.spare.pop().unwrap_or_default();
            // A reused buffer keeps its old bytes (MPI writes over them):
            // no memset of every piece.
            buf.resize(len, 0);
            // SAFETY: `buf` is moved into `posted` below (its heap memory
            // does not move) and not touched until the request completes,
            // or leaked when it is abandoned (`drop`).
            let request = unsafe { irecv(self.comm, self.peer, self.tag, &mut buf)? };
            self.posted.push_back((request, buf));
        }
        Ok(())
    }

    /// The next piece (`None` once all were taken), waiting at most the
    /// patience for it. After an error, nothing more comes.
    pub(super) fn next(&mut self) -> io::Result<Option<Vec<u8>>> {
        if let Err(e) = self.post() {
            self.due.clear();
            return Err(e);
        }
        let Some((mut request, buf)) = self.posted.pop_front() else {
            return Ok(None);
        };
        let r = complete(&mut request, Instant::now() + self.wait);
        match r {
            Ok(status) if count(&status) == buf.len() => {
                // The next ones go on while this one is read.
                let _ = self.post();
                Ok(Some(buf))
            }
            Ok(status) => {
                self.due.clear();
                Err(io::Error::other(format!(
                    "rank {} sent {} bytes where {} were due",
                    self.peer,
                    count(&status),
                    buf.len()
                )))
            }
            Err(f) => {
                // Cancelled and freed: MPI may still write it.
                std::mem::forget(buf);
                self.due.clear();
                Err(f.error("answer", self.peer, self.wait))
            }
        }
    }

    /// A piece's buffer, for a later piece.
    pub(super) fn give_back(&mut self, buf: Vec<u8>) {
        self.spare.push(buf);
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        for (mut request, buf) in self.posted.drain(..) {
            abandon(std::slice::from_mut(&mut request));
            std::mem::forget(buf);
        }
    }
}

/// Receives exactly `len` bytes from `peer` under `tag`, waiting at most
/// `wait`.
pub(super) fn recv(
    comm: Comm,
    peer: usize,
    tag: c_int,
    len: usize,
    wait: Duration,
) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    recv_append(comm, peer, tag, &mut buf, len, wait)?;
    Ok(buf)
}

/// Receives exactly `len` bytes from `peer` under `tag` onto the end of
/// `buf`, waiting at most `wait` (reusing `buf`'s memory: no fresh pages
/// to fault in for every piece). On error `buf` is left empty, its
/// memory leaked when MPI may still write it.
pub(super) fn recv_append(
    comm: Comm,
    peer: usize,
    tag: c_int,
    buf: &mut Vec<u8>,
    len: usize,
    wait: Duration,
) -> io::Result<()> {
    let at = buf.len();
    buf.resize(at + len, 0);
    // SAFETY: nothing touches `buf` (nor moves its memory) until the
    // request completes, and its memory is leaked below when it does not.
    let mut request = match unsafe { irecv(comm, peer, tag, &mut buf[at..]) } {
        Ok(r) => r,
        Err(e) => {
            buf.truncate(at);
            return Err(e);
        }
    };
    match complete(&mut request, Instant::now() + wait) {
        Ok(status) => {
            let got = count(&status);
            if got != len {
                buf.clear();
                return Err(io::Error::other(format!(
                    "rank {peer} sent {got} bytes where {len} were due"
                )));
            }
            Ok(())
        }
        Err(f) => {
            std::mem::forget(std::mem::take(buf));
            Err(f.error("answer", peer, wait))
        }
    }
}

/// Posts a receive into `buf` from `peer` under `tag`: its request.
///
/// # Safety
///
/// `buf`'s memory must stay alive and untouched until the request
/// completes, or be leaked when it does not.
unsafe fn irecv(
    comm: Comm,
    peer: usize,
    tag: c_int,
    buf: &mut [u8],
) -> io::Result<ffi::MPI_Request> {
    let n = c_int::try_from(buf.len()).map_err(|_| io::Error::other("message too long"))?;
    let src = c_int::try_from(peer).map_err(|_| io::Error::other("rank out of range"))?;
    // SAFETY: reads a constant handle the MPI shim defines.
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `buf` has room for `n` bytes, alive and untouched until the
    // request completes (the caller's duty); `comm` is a live
    // communicator.
    let rc = unsafe {
        ffi::MPI_Irecv(
            buf.as_mut_ptr().cast(),
            n,
            ffi::RSMPI_UINT8_T,
            src,
            tag,
            comm.0,
            &mut request,
        )
    };
    if rc != 0 {
        return Err(failed("Irecv", rc));
    }
    Ok(request)
}

/// The bytes a completed receive or probe's status says.
fn count(status: &ffi::MPI_Status) -> usize {
    let mut n: c_int = 0;
    // SAFETY: `status` was written by MPI for a message of bytes.
    unsafe {
        ffi::MPI_Get_count(status, ffi::RSMPI_UINT8_T, &mut n);
    }
    usize::try_from(n).unwrap_or(0)
}

/// A message waiting from `peer` (any, with `None`) under `tag`: its
/// sender and length. Does not wait.
pub(super) fn probe(comm: Comm, peer: Option<usize>, tag: c_int) -> Option<(usize, usize)> {
    // SAFETY: reads a constant the MPI shim defines.
    let any = unsafe { ffi::RSMPI_ANY_SOURCE };
    let src = peer.and_then(|p| c_int::try_from(p).ok()).unwrap_or(any);
    let mut flag: c_int = 0;
    // SAFETY: a zeroed MPI_Status is a valid plain C struct to be written.
    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
    // SAFETY: `comm` is a live communicator; MPI writes `flag` and
    // `status`.
    let rc = unsafe { ffi::MPI_Iprobe(src, tag, comm.0, &mut flag, &mut status) };
    if rc != 0 || flag == 0 {
        return None;
    }
    let source = usize::try_from(status.MPI_SOURCE).ok()?;
    Some((source, count(&status)))
}

/// A request's header: what, for which image, and the tag of its
/// messages (the request's own three tags: `tag`, `tag + 1`, `tag + 2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub op: Op,
    /// The worker's runtime (see `outcore::TierKey`).
    pub runtime: u64,
    pub executor: u64,
    pub generation: u64,
    /// PUT: the image's expected length; BYE: 1 when a worker found a
    /// lender dead.
    pub len: u64,
    pub tag: c_int,
}

/// What a request asks of a lender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Keep an image: the lender answers with room (go or not), then
    /// takes the pieces and the end, and answers whether it kept it.
    Put = 1,
    /// Hand an image back: its length, then its pieces.
    Get = 2,
    /// Forget an image. No answer.
    Drop = 3,
    /// This worker is done: forget its images. No answer. Its `len` is 1
    /// when some worker found a lender dead (the lender then ends
    /// without `MPI_Finalize`, see `World::drop`).
    Bye = 4,
}

impl Header {
    pub(super) fn encode(&self) -> Vec<u8> {
        let tag = u64::try_from(self.tag).unwrap_or(0);
        [
            self.op as u64,
            self.runtime,
            self.executor,
            self.generation,
            self.len,
            tag,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
    }

    pub(super) fn decode(b: &[u8]) -> Option<Header> {
        let w = words(b)?;
        let op = match w.first()? {
            1 => Op::Put,
            2 => Op::Get,
            3 => Op::Drop,
            4 => Op::Bye,
            _ => return None,
        };
        Some(Header {
            op,
            runtime: *w.get(1)?,
            executor: *w.get(2)?,
            generation: *w.get(3)?,
            len: *w.get(4)?,
            tag: c_int::try_from(*w.get(5)?).ok()?,
        })
    }
}

/// `b` as little-endian u64s (`None` when its length is not a multiple
/// of 8).
pub(super) fn words(b: &[u8]) -> Option<Vec<u64>> {
    if !b.len().is_multiple_of(8) {
        return None;
    }
    Some(
        b.chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect(),
    )
}

/// `w` as little-endian bytes.
pub(super) fn bytes(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}
