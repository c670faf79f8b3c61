//! Direct reads with several requests in flight, through Linux native AIO
//! (`io_setup`, `io_submit`, `io_getevents`): no thread, and no dependency
//! beyond the system calls. The one read-ahead engine of outcore: spill
//! loads (`spill`, 512 KiB requests, 16 in flight) and the jobs' input reads
//! (`outcore-jobs`' `input/direct.rs`: blocks in place in 1 MiB requests, up
//! to 32 in flight; pieces through aligned buffers; scattered rows) go
//! through [`read`]. Not a stable API.
//!
//! It replaced an io_uring reader in the jobs crate, as both read at the
//! same speed within what a shared virtual disk lets one measure
//! (`benches/RESULTS.md`, "One read-ahead engine"): 1 GiB read in place
//! with `O_DIRECT` in blocks of 4.2-64 MiB, this engine with the io_uring
//! reader's requests (1 MiB, 32 in flight) ran at 0.95-1.03 times its
//! speed, medians of five alternating runs; whole capped K-means runs
//! took 1.09 times as long from an input file and 0.98 times spilling
//! (medians of 16 and 9 alternating pairs, each pair between 0.6 and 1.3).
//! It needs no dependency in the runtime.
//!
//! Each request is submitted on its own by default ([`Submit::Each`]):
//! requests submitted together are plugged as one batch, and the block
//! layer merges adjacent ones into requests as large as the device takes
//! (4 MiB on the virtual disk this runtime is measured on), which that disk
//! reads at 1.8-1.9 GiB/s against 2.9-3.5 GiB/s for requests of 256 KiB to
//! 1 MiB (fio, 8-32 in flight). One `pread` of 8 MiB at a time reached
//! about 2 GiB/s there. Scattered small reads go together
//! ([`Submit::Together`]): a system call each would cost more than they do.
//!
//! Requests land in order: request `i` is handed to the caller's `landed`
//! once it and every request before it are in, and is submitted only when
//! its place in the window of requests after the first one not yet handed
//! over is free (so a caller may reuse buffers by place in the window).
//!
//! Memory safety: the kernel writes into the caller's memory until a read
//! completes. Every return path first reaps every read in flight; where
//! waiting fails, or `landed` panics, the context is destroyed, which waits
//! for them (`io_destroy` blocks until the reads it cannot cancel complete).
//!
//! Each thread keeps one context ([`MAX_WINDOW`] requests) for its reads.
//! When the thread exits, its context (with no read in flight: every call
//! reaps its reads) goes to a small process-wide stock that the next
//! threads take from, and is destroyed only when the stock is full:
//! `io_destroy` waits for a kernel grace period, 30-50 ms here, which
//! every runtime's drop used to pay while joining its worker threads (a
//! context belongs to the process, not to the thread that made it).

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Reads in flight at most: the size of each thread's context.
pub const MAX_WINDOW: usize = 32;
/// The context's size, as the system calls take it.
const DEPTH: usize = MAX_WINDOW;

/// `struct iocb` of `<linux/aio_abi.h>`, as laid out on 64-bit
/// little-endian machines (the only ones this module is built for).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: i32,
    opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

/// `struct io_event` of `<linux/aio_abi.h>`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

/// `IOCB_CMD_PREAD`.
const CMD_PREAD: u16 = 0;

/// An AIO context (`aio_context_t`) of this thread.
struct Context(libc::c_ulong);

impl Context {
    fn setup() -> Option<Context> {
        let mut id: libc::c_ulong = 0;
        // SAFETY: io_setup writes the new context's id to the pointer
        // given, a live local.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_setup,
                DEPTH as libc::c_long,
                &mut id as *mut libc::c_ulong,
            )
        };
        (r == 0 && id != 0).then_some(Context(id))
    }

    /// Submits `cbs` (at most [`DEPTH`]) in one call; returns how many
    /// the kernel took (an error only when it took none).
    fn submit(&self, cbs: &mut [Iocb]) -> io::Result<usize> {
        let mut list = [std::ptr::null_mut::<Iocb>(); DEPTH];
        let n = cbs.len().min(DEPTH);
        for (l, cb) in list.iter_mut().zip(cbs.iter_mut()) {
            *l = cb;
        }
        // SAFETY: `n` valid iocb pointers; the kernel reads the iocbs (and
        // writes their keys) during the call only, and the buffers they
        // name are the caller's to lend until the reads complete.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_submit,
                self.0,
                n as libc::c_long,
                list.as_mut_ptr(),
            )
        };
        match r {
            1.. => Ok(r as usize),
            0 => Err(io::Error::from_raw_os_error(libc::EAGAIN)),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Waits for at least one read and returns the finished ones.
    fn wait(&self, events: &mut [IoEvent; DEPTH]) -> io::Result<usize> {
        loop {
            // SAFETY: room for `DEPTH` events; no timeout.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.0,
                    1 as libc::c_long,
                    DEPTH as libc::c_long,
                    events.as_mut_ptr(),
                    std::ptr::null_mut::<libc::timespec>(),
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Contexts of exited threads, for the next threads' reads; 0 marks an
/// empty place. Atomics only: it is used from a pthread key's destructor,
/// which must not allocate or lock.
static STOCK: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Keeps context `id` (no read in flight) in [`STOCK`], or destroys it
/// when the stock is full.
#[allow(clippy::unnecessary_cast)] // `c_ulong` is `u32` on 32-bit targets.
fn stock(id: libc::c_ulong) {
    for place in &STOCK {
        if place
            .compare_exchange(0, id as u64, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
    destroy(id);
}

/// A context from [`STOCK`], if it holds one.
#[allow(clippy::unnecessary_cast)] // `c_ulong` is `u32` on 32-bit targets.
fn from_stock() -> Option<Context> {
    STOCK.iter().find_map(|place| {
        if place.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let id = place.swap(0, Ordering::AcqRel);
        (id != 0).then_some(Context(id as libc::c_ulong))
    })
}

/// Destroys context `id`; waits for any read still in flight on it.
fn destroy(id: libc::c_ulong) {
    // SAFETY: io_destroy takes a context id; an id that is not one is
    // refused with EINVAL.
    unsafe { libc::syscall(libc::SYS_io_destroy, id) };
}

thread_local! {
    /// This thread's context id (0: none yet), made at its first direct
    /// load and kept: a context per load would pay its set-up and teardown
    /// each time. A plain `Cell`, so that no thread-local destructor is
    /// registered: glibc allocates to register one, and aborts the process
    /// when that fails (as it may under a hard memory limit). The context
    /// is destroyed at thread exit through a pthread key instead.
    static CONTEXT: Cell<libc::c_ulong> = const { Cell::new(0) };
}

/// The pthread key whose destructor destroys an exiting thread's context;
/// `None` when none could be made.
fn exit_key() -> Option<libc::pthread_key_t> {
    extern "C" fn on_exit(id: *mut libc::c_void) {
        // Forgotten first: a load made later in this thread's exit (from
        // another key's destructor) must make a new context, not submit to
        // this id, which the kernel may give to another thread's next one.
        let _ = CONTEXT.try_with(|c| c.set(0));
        stock(id as libc::c_ulong);
    }
    static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is a valid out-pointer; the destructor is an
        // `extern "C"` function that never unwinds.
        (unsafe { libc::pthread_key_create(&mut key, Some(on_exit)) } == 0).then_some(key)
    })
}

/// This thread's context, taken out of [`CONTEXT`] for the caller's use
/// (put back with [`give_back`]), or a new one.
fn take_context() -> Option<Context> {
    let id = CONTEXT.try_with(|c| c.replace(0)).ok()?;
    if id != 0 {
        return Some(Context(id));
    }
    let key = exit_key()?;
    let ctx = from_stock().or_else(Context::setup)?;
    // SAFETY: `key` was made by pthread_key_create; the value is the
    // context id, never dereferenced.
    if unsafe { libc::pthread_setspecific(key, ctx.0 as *const libc::c_void) } != 0 {
        destroy(ctx.0);
        return None;
    }
    Some(ctx)
}

/// Keeps `ctx` for this thread's next load. Where the thread's storage is
/// gone (it is exiting), the pthread key's destructor destroys it.
/// Whether this thread can read through the engine: a 64-bit
/// little-endian Linux where the kernel grants an AIO context (a seccomp
/// filter or an exhausted `aio-max-nr` refuses it). The context is kept
/// for the thread's next [`read`].
pub fn available() -> bool {
    if !cfg!(all(target_pointer_width = "64", target_endian = "little")) {
        return false;
    }
    match take_context() {
        Some(ctx) => {
            give_back(ctx);
            true
        }
        None => false,
    }
}

fn give_back(ctx: Context) {
    let _ = CONTEXT.try_with(|c| c.set(ctx.0));
}

/// Destroys `ctx` now (waiting for its reads in flight), so that the
/// thread's exit does not destroy it again.
fn discard(ctx: Context) {
    if let Some(key) = exit_key() {
        // SAFETY: as in `take_context`; a null value runs no destructor.
        unsafe { libc::pthread_setspecific(key, std::ptr::null()) };
    }
    destroy(ctx.0);
}

/// One read: `len` bytes of the file at `pos` into `dst`. It is done once
/// at least `need` bytes (at most `len`) are in: the file may end inside
/// the last page of a read of whole pages. `pos`, `len` and `dst` must suit
/// the file's direct I/O (page-aligned for `O_DIRECT`).
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub pos: u64,
    pub dst: *mut u8,
    pub len: usize,
    pub need: usize,
}

/// How the reads of one call reach the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// Each on its own, as soon as its place is free: the pieces of one
    /// range (see the module docs).
    Each,
    /// All free places' worth together: scattered small reads.
    Together,
}

/// Reads requests `0..count` of `file` (`request(i)` says where each goes),
/// up to `window` (at most [`MAX_WINDOW`]) in flight, and hands each to
/// `landed` in order once it is in. `false` when that did not work (then
/// some requests may not have been handed over): no context could be made,
/// a read was refused or failed, or the file ended early. No read is in
/// flight then, and the caller reads the whole range again another way
/// (which reports what is wrong, if anything is: a transient failure here,
/// such as an interrupted read, costs a second read, not a failed one).
///
/// # Safety
///
/// Each request's `dst` is valid for writes of its `len` bytes, and nothing
/// else touches them from its submission until it is handed to `landed`
/// (or the call returns, normally or by unwinding: memory the closures
/// own is freed only after every read in flight is done): request `i` is
/// submitted only after request `i - window` was handed over.
pub unsafe fn read(
    file: &File,
    count: usize,
    window: usize,
    how: Submit,
    request: impl Fn(usize) -> Request,
    mut landed: impl FnMut(usize),
) -> bool {
    if !cfg!(all(target_pointer_width = "64", target_endian = "little")) {
        return false;
    }
    let Some(ctx) = take_context() else {
        return false;
    };
    // Where `landed` or `request` panics with reads in flight, the context
    // is destroyed (waiting for them) before the caller's memory is
    // unwound, and before the two closures (parameters, dropped after
    // this local; `read_with` only borrows them) free what they own.
    struct Guard(libc::c_ulong);
    impl Drop for Guard {
        fn drop(&mut self) {
            discard(Context(self.0));
        }
    }
    let guard = Guard(ctx.0);
    let jobs = Jobs {
        window: window.clamp(1, MAX_WINDOW),
        how,
        count,
    };
    // SAFETY: the caller's promise, passed on.
    let outcome = unsafe { read_with(&ctx, file, &jobs, &request, &mut landed) };
    std::mem::forget(guard);
    match outcome {
        Outcome::Read => {
            give_back(ctx);
            true
        }
        Outcome::Failed => {
            give_back(ctx);
            false
        }
        Outcome::Stale | Outcome::WaitFailed => {
            // A context the kernel does not know (inherited across a fork)
            // or one whose reads could not be waited for: it goes. Its
            // teardown waits for every read still in flight, before the
            // caller reads the range again.
            discard(ctx);
            false
        }
    }
}

/// How [`read_with`] ended.
enum Outcome {
    /// Every request is in, and handed over.
    Read,
    /// A read was refused or failed, or the file ended early; every read
    /// submitted has completed.
    Failed,
    /// The first submission was refused as invalid: nothing was submitted,
    /// and the context is not one the kernel knows.
    Stale,
    /// Waiting for the reads failed, with some possibly still in flight:
    /// the context must be destroyed before the memory is reused.
    WaitFailed,
}

/// The shape of one call of [`read`].
struct Jobs {
    window: usize,
    how: Submit,
    count: usize,
}

/// The requests of one call in flight: per place in the window (request
/// `i` goes to place `i % window`), the bytes read so far and whether it
/// is done.
struct Window {
    got: [usize; DEPTH],
    done: [bool; DEPTH],
    /// The next request to submit.
    next: usize,
    /// Requests handed over, in order.
    landed: usize,
    in_flight: usize,
    failed: bool,
}

/// The iocb reading the rest of `r` (from byte `from` on), tagged `i`.
fn iocb(fd: u32, r: &Request, from: usize, i: usize) -> Iocb {
    Iocb {
        data: i as u64,
        opcode: CMD_PREAD,
        fildes: fd,
        buf: r.dst as u64 + from as u64,
        nbytes: (r.len - from) as u64,
        offset: (r.pos + from as u64) as i64,
        ..Iocb::default()
    }
}

/// [`read`] with a context.
///
/// # Safety
///
/// As for [`read`].
unsafe fn read_with(
    ctx: &Context,
    file: &File,
    jobs: &Jobs,
    request: &impl Fn(usize) -> Request,
    landed: &mut impl FnMut(usize),
) -> Outcome {
    let Ok(fd) = u32::try_from(file.as_raw_fd()) else {
        return Outcome::Failed;
    };
    let mut w = Window {
        got: [0; DEPTH],
        done: [false; DEPTH],
        next: 0,
        landed: 0,
        in_flight: 0,
        failed: false,
    };
    let mut events = [IoEvent::default(); DEPTH];
    while w.landed < jobs.count {
        if let Err(stale) = fill(ctx, fd, jobs, &mut w, &request) {
            if stale {
                return Outcome::Stale;
            }
        }
        if w.in_flight == 0 {
            break;
        }
        let n = match ctx.wait(&mut events) {
            Ok(n) => n,
            Err(_) => return Outcome::WaitFailed,
        };
        for ev in &events[..n] {
            reap(ctx, fd, jobs, &mut w, ev, &request);
        }
        while !w.failed && w.landed < w.next && w.done[w.landed % jobs.window] {
            landed(w.landed);
            w.landed += 1;
        }
    }
    if w.failed || w.landed < jobs.count {
        Outcome::Failed
    } else {
        Outcome::Read
    }
}

/// Submits requests into the window's free places (none once a read
/// failed). `Err(true)` when the very first submission was refused as
/// invalid (a stale context), `Err(false)` for any other refusal (then
/// `w.failed` is set).
fn fill(
    ctx: &Context,
    fd: u32,
    jobs: &Jobs,
    w: &mut Window,
    request: &impl Fn(usize) -> Request,
) -> Result<(), bool> {
    let mut cbs = [Iocb::default(); DEPTH];
    while !w.failed && w.next < jobs.count && w.next < w.landed + jobs.window {
        let batch = match jobs.how {
            Submit::Each => 1,
            Submit::Together => (jobs.count - w.next).min(w.landed + jobs.window - w.next),
        };
        for (k, cb) in cbs[..batch].iter_mut().enumerate() {
            let i = w.next + k;
            *cb = iocb(fd, &request(i), 0, i);
            w.got[i % jobs.window] = 0;
            w.done[i % jobs.window] = false;
        }
        match ctx.submit(&mut cbs[..batch]) {
            Ok(n) => {
                w.next += n;
                w.in_flight += n;
            }
            Err(e) => {
                w.failed = true;
                let first = w.in_flight == 0 && w.next == 0;
                return Err(first && e.raw_os_error() == Some(libc::EINVAL));
            }
        }
    }
    Ok(())
}

/// Takes in one finished read: its request is done, or the rest of a
/// short read of whole pages is asked for, or the call has failed.
fn reap(
    ctx: &Context,
    fd: u32,
    jobs: &Jobs,
    w: &mut Window,
    ev: &IoEvent,
    request: &impl Fn(usize) -> Request,
) {
    w.in_flight -= 1;
    let i = ev.data as usize;
    if ev.res <= 0 || w.failed || i >= w.next || i < w.landed {
        w.failed = true;
        return;
    }
    let r = request(i);
    let place = i % jobs.window;
    let got = w.got[place] + ev.res as usize;
    w.got[place] = got;
    if got >= r.need && got <= r.len {
        w.done[place] = true;
    } else if got >= r.len || got % crate::alloc::PAGE != 0 {
        w.failed = true;
    } else if ctx.submit(&mut [iocb(fd, &r, got, i)]).is_ok() {
        w.in_flight += 1;
    } else {
        w.failed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    /// A thread's context outlives the thread (kept for the next
    /// threads): the kernel still knows it after the thread has exited,
    /// where destroying it would have made the exit wait for a grace
    /// period.
    #[test]
    fn an_exiting_threads_context_is_kept_not_destroyed() {
        let id = std::thread::spawn(|| {
            if !available() {
                return None;
            }
            CONTEXT.with(|c| Some(c.get()))
        })
        .join()
        .unwrap();
        let Some(id) = id else {
            eprintln!("no AIO context on this machine: nothing to check");
            return;
        };
        let mut events = [IoEvent::default(); DEPTH];
        // SAFETY: room for `DEPTH` events; a zero timeout; an id the kernel
        // does not know is refused with EINVAL.
        let r = unsafe {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::syscall(
                libc::SYS_io_getevents,
                id,
                0 as libc::c_long,
                DEPTH as libc::c_long,
                events.as_mut_ptr(),
                &zero as *const libc::timespec,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
    }

    const PAGE: usize = crate::alloc::PAGE;

    /// Page-aligned zeroed memory.
    struct Pages(Vec<u8>, usize);

    impl Pages {
        fn new(len: usize) -> Pages {
            let v = vec![0u8; len + PAGE];
            let skip = v.as_ptr().align_offset(PAGE);
            Pages(v, skip)
        }
        fn ptr(&mut self) -> *mut u8 {
            self.0[self.1..].as_mut_ptr()
        }
        fn bytes(&self, len: usize) -> &[u8] {
            &self.0[self.1..self.1 + len]
        }
    }

    /// A file of `len` bytes, opened with `O_DIRECT` (`None` where the
    /// filesystem refuses it), and its bytes.
    fn file(len: usize) -> Option<(tempfile::TempDir, File, Vec<u8>)> {
        let base = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::tempdir_in(&base).unwrap();
        let path = dir.path().join("readahead.bin");
        let data: Vec<u8> = (0..len as u64)
            .map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .ok()?;
        Some((dir, f, data))
    }

    /// Scattered page reads submitted together, more than fit in the
    /// window, each into the buffer of its place in the window: every one
    /// is handed over in order with its own bytes in that buffer.
    #[test]
    fn scattered_reads_together_land_in_order_in_their_places() {
        let Some((_dir, f, data)) = file(300 * PAGE) else {
            return;
        };
        let starts: Vec<usize> = (0..100).map(|i| (i * 37 % 299) * PAGE).collect();
        let window = 8;
        let mut bufs = Pages::new(window * PAGE);
        let base = bufs.ptr();
        let mut seen = Vec::new();
        let request = |i: usize| Request {
            pos: starts[i] as u64,
            dst: base.wrapping_add(i % window * PAGE),
            len: PAGE,
            need: PAGE,
        };
        let landed = |i: usize| {
            // SAFETY: the place's buffer, which the kernel is done with.
            let got = unsafe { std::slice::from_raw_parts(base.add(i % window * PAGE), PAGE) };
            assert!(got == &data[starts[i]..starts[i] + PAGE], "record {i}");
            seen.push(i);
        };
        // SAFETY: each place's buffer is ours and free until its read is
        // handed over.
        let ok = unsafe { read(&f, starts.len(), window, Submit::Together, request, landed) };
        assert!(ok, "the engine did not read");
        assert_eq!(seen, (0..starts.len()).collect::<Vec<_>>());
    }

    /// A read of whole pages past a file that ends inside its last page is
    /// done once the bytes it needs are in; one that needs bytes past the
    /// end is not taken for read. A panic in `landed` leaves the thread
    /// able to read again.
    #[test]
    fn reads_end_where_the_file_does_and_survive_a_panic() {
        let len = 5 * PAGE + 100;
        let Some((_dir, f, data)) = file(len) else {
            return;
        };
        let mut buf = Pages::new(8 * PAGE);
        let dst = buf.ptr();
        let req = |i: usize| Request {
            pos: (i * 2 * PAGE) as u64,
            dst: dst.wrapping_add(i * 2 * PAGE),
            len: 2 * PAGE,
            need: (2 * PAGE).min(len - i * 2 * PAGE),
        };
        // SAFETY: `buf` holds the 6 pages the requests name, ours alone.
        assert!(unsafe { read(&f, 3, 4, Submit::Each, req, |_| {}) });
        assert!(buf.bytes(len) == &data[..]);
        let past = |i: usize| Request {
            need: 2 * PAGE,
            ..req(i)
        };
        // SAFETY: as above.
        assert!(!unsafe { read(&f, 3, 4, Submit::Each, past, |_| {}) });
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: as above (with reads still in flight when `landed`
            // panics: the context is destroyed, which waits for them,
            // before `buf` can go).
            unsafe { read(&f, 3, 4, Submit::Each, req, |_| panic!("landed")) }
        }));
        assert!(r.is_err());
        // SAFETY: as above.
        assert!(unsafe { read(&f, 3, 4, Submit::Each, req, |_| {}) });
    }
}
