//! Direct reads of a byte range of a file, several requests in flight.
//!
//! A virtual disk, like many SSDs, delivers its bandwidth only to a deep
//! queue: on the machine these jobs are measured on, one 1 MiB read at a
//! time gets 0.7-0.8 GB/s, eight 256 KiB reads in flight several times that.
//! A [`DirectReader`] puts a whole block's reads in flight at once (up to
//! [`MAX_DEPTH`]) through the runtime's read-ahead engine
//! ([`outcore::readahead`], Linux native AIO, which spill loads use too), in
//! one of two ways (`O_DIRECT` needs aligned offsets, lengths and memory):
//!
//! - [`read_into`](DirectReader::read_into) reads whole pages straight
//!   into the caller's page-aligned memory, which then holds the bytes
//!   before the range too: no buffer and no copy (float32 blocks of
//!   256 KiB and more, whose rows start anywhere in a page);
//! - [`read`](DirectReader::read) reads each piece into its own aligned
//!   buffer, and as each lands copies it to its place and checksums it in
//!   the same pass ([`copy_sum`]).
//!
//! No thread is started: one thread waits for all the reads. Where the
//! engine is unavailable or a read through it fails (an old kernel, a
//! sandbox that forbids it, a file shorter than expected), the same reader
//! reads the whole range again one piece at a time with `pread`, which
//! reports the error if there is one.
//!
//! These reads went through an io_uring until the engines were made one:
//! on the same requests both read at the same speed (`benches/RESULTS.md`,
//! "One read-ahead engine").

use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::io::AsRawFd;

use outcore::readahead::{self, Request, Submit};

/// Alignment of direct reads: offsets, lengths and memory.
pub(crate) const ALIGN: usize = 4096;
/// Bytes of a block read by one request: with the pages around an
/// unaligned piece, each request's buffer is 256 KiB.
const PIECE: usize = (256 << 10) - 2 * ALIGN;
/// Bytes of the largest record [`DirectReader::read_records`] reads.
pub(crate) const MAX_RECORD: usize = PIECE;
/// Requests in flight at most: 8 MiB of buffers.
///
/// A reader keeps as many buffers as its largest block has pieces, up to
/// this, so each block is in flight whole and its buffers take about what
/// the block does. With 8 requests in flight, the capped k-means loads
/// (4.2 MiB blocks, one reader thread) could not keep up with two workers
/// on the machine these jobs are measured on: steady epochs of 4 GiB under
/// 1 GiB took 2.16-2.42 s, against 1.80 with the block in flight whole.
const MAX_DEPTH: usize = 32;
/// Size of each request's buffer: a piece, and the parts of the pages
/// around it that an unaligned piece also reads.
const BUF: usize = PIECE + 2 * ALIGN;
/// Alignment of the buffers' arena: a transparent huge page.
const HUGE: usize = 2 << 20;

/// Reads byte ranges of files with direct I/O; one per reading thread at a
/// time (its buffers are in use during a read).
pub(crate) struct DirectReader {
    /// Whether reads go through the read-ahead engine first (the tests
    /// turn it off): without it, one `pread` at a time.
    engine: bool,
    /// One buffer of [`BUF`] bytes per request in flight, in one arena
    /// (grown to the pieces of the largest block read, up to
    /// [`MAX_DEPTH`]; empty until the first read).
    ///
    /// The arena lies in transparent huge pages where the system allows:
    /// on a virtual disk, a direct read into a buffer made of 4 KiB pages
    /// is split into one segment per page, and measured here ran at
    /// 0.77 GB/s (256 KiB reads) against 3.0 GB/s into a huge page.
    arena: AlignedBuf,
}

/// A piece of the range being read, in one of the reader's buffers.
#[derive(Clone, Copy, Default)]
struct Piece {
    /// Index of the piece in the range.
    index: usize,
    /// Aligned file offset its buffer starts at.
    start: u64,
    /// Bytes before the piece's first byte in the buffer.
    skip: usize,
    /// The piece's length.
    len: usize,
}

impl Piece {
    fn of(index: usize, pos: u64, total: usize) -> Piece {
        let first = pos + (index * PIECE) as u64;
        let start = first - first % ALIGN as u64;
        Piece {
            index,
            start,
            skip: (first - start) as usize,
            len: PIECE.min(total - index * PIECE),
        }
    }

    /// Bytes to read into the buffer (whole pages: direct reads need
    /// them, and the file may end inside the last one).
    fn want(&self) -> usize {
        (self.skip + self.len).next_multiple_of(ALIGN)
    }
}

impl std::fmt::Debug for DirectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectReader")
            .field("engine", &self.engine)
            .field("buffers", &(self.arena.len() / BUF))
            .finish()
    }
}

impl DirectReader {
    /// A reader; its buffers are made at its first read. Where the
    /// read-ahead engine is refused, it reads one `pread` at a time and
    /// makes one buffer, not a window of them.
    pub(crate) fn new() -> io::Result<DirectReader> {
        Ok(DirectReader {
            engine: readahead::available(),
            arena: AlignedBuf::empty(),
        })
    }

    /// Fills `dst` with the bytes of `file` (opened with `O_DIRECT`) at
    /// `pos`, and returns their [`checksum`]. `dst` may be uninitialised;
    /// it is fully initialised when this returns `Ok`. A file shorter than
    /// `pos + dst.len()` is an `UnexpectedEof` error.
    pub(crate) fn read(
        &mut self,
        file: &File,
        pos: u64,
        dst: &mut [MaybeUninit<u8>],
    ) -> io::Result<u64> {
        let count = dst.len().div_ceil(PIECE);
        self.grow_buffers(count)?;
        // Each piece's checksum, combined in order at the end (pieces land
        // in any order).
        let mut sums = vec![0u64; count];
        let total = dst.len();
        self.read_pieces(
            file,
            count,
            Submit::Each,
            |i| Piece::of(i, pos, total),
            |p, buf| sums[p.index] = land(buf, p, dst),
        )?;
        Ok(combine(&sums))
    }

    /// Reads `starts.len()` records of `record` bytes (at most a piece's
    /// worth), the `i`-th at byte `starts[i]` of `file` (opened with
    /// `O_DIRECT`), into `dst[i * record..]`: scattered rows, many in
    /// flight at once (a queue of single-page reads gets several times the
    /// throughput of one at a time). `dst` (`starts.len() * record` bytes,
    /// maybe uninitialised) is fully initialised when this returns `Ok`.
    /// Buffers grown for the call are given back after it.
    pub(crate) fn read_records(
        &mut self,
        file: &File,
        starts: &[u64],
        record: usize,
        dst: &mut [MaybeUninit<u8>],
    ) -> io::Result<()> {
        if record == 0 || record > PIECE || dst.len() != starts.len() * record {
            return Err(io::Error::other(
                "scattered reads take records of at most a piece, and room for each",
            ));
        }
        let count = starts.len();
        let grown = self.grow_buffers(count)?;
        let piece_of = |i: usize| {
            let first = starts[i];
            let start = first - first % ALIGN as u64;
            Piece {
                index: i,
                start,
                skip: (first - start) as usize,
                len: record,
            }
        };
        let result = self.read_pieces(file, count, Submit::Together, piece_of, |p, buf| {
            let src = &buf[p.skip..p.skip + p.len];
            let out = &mut dst[p.index * record..(p.index + 1) * record];
            for (o, &b) in out.iter_mut().zip(src) {
                o.write(b);
            }
        });
        // Nothing is in flight any more.
        if grown {
            self.arena = AlignedBuf::empty();
        }
        result
    }

    /// Grows the arena to a buffer for each of `count` pieces in flight at
    /// once (up to [`MAX_DEPTH`]; one without the engine), and says
    /// whether it grew. The arena is empty before the first read.
    fn grow_buffers(&mut self, count: usize) -> io::Result<bool> {
        let depth = if self.engine {
            count.clamp(1, MAX_DEPTH)
        } else {
            1
        };
        if self.arena.len() >= depth * BUF {
            return Ok(false);
        }
        // The old buffers go first, so old and new never count against
        // the cap together.
        self.arena = AlignedBuf::empty();
        self.arena = AlignedBuf::new(depth * BUF, HUGE)?;
        Ok(true)
    }

    /// Reads pieces `0..count` (each made by `piece_of`) into the arena's
    /// buffers, and hands each finished one to `land` with its buffer:
    /// through the engine, a piece in flight per buffer, handed over in
    /// order; where that does not work, all of them again, one `pread` at
    /// a time into the first buffer. The arena must hold at least one
    /// buffer.
    fn read_pieces(
        &mut self,
        file: &File,
        count: usize,
        how: Submit,
        piece_of: impl Fn(usize) -> Piece,
        mut land: impl FnMut(&Piece, &[u8]),
    ) -> io::Result<()> {
        if count > 0 && self.arena.len() < BUF {
            return Err(io::Error::other("no buffer to read into"));
        }
        let window = (self.arena.len() / BUF).min(MAX_DEPTH);
        let base = self.arena.ptr.as_ptr();
        // Piece `i` goes to buffer `i % window` (no piece when reading
        // without the engine, one `pread` at a time).
        let request = |i: usize, window: usize| {
            let p = piece_of(i);
            Request {
                pos: p.start,
                dst: base.wrapping_add(i % window * BUF),
                len: p.want(),
                need: p.skip + p.len,
            }
        };
        let mut landed = |i: usize, window: usize| {
            let buf = base.wrapping_add(i % window * BUF);
            // SAFETY: the piece's buffer lies in the arena, and the engine
            // (or the `pread` below) is done writing into it; the other
            // buffers are not borrowed.
            land(&piece_of(i), unsafe {
                std::slice::from_raw_parts(buf, BUF)
            });
        };
        let (to, from) = (|i| request(i, window), |i| landed(i, window));
        // SAFETY: each piece's buffer is the arena's own, free until its
        // piece is handed over (a piece goes to a buffer only once the
        // piece `window` before it is).
        if self.engine && unsafe { readahead::read(file, count, window, how, to, from) } {
            return Ok(());
        }
        for i in 0..count {
            // SAFETY: the first buffer, the arena's own, free between reads.
            unsafe { pread_fully(file, &request(i, 1)) }?;
            landed(i, 1);
        }
        Ok(())
    }
}

/// Bytes read by one request of a read in place.
///
/// 1 MiB suits both virtual disks these jobs have been measured on. On
/// one (Intel host), requests of 256 KiB to 1 MiB read at the same speed
/// and larger ones slower (see [`outcore::readahead`]). On the other (AMD
/// EPYC host, fio `O_DIRECT` with 32 in flight), 256 KiB requests read
/// 0.7-1.0 GB/s and 1 MiB ones 1.3-1.8; capped K-means' steady epochs,
/// alternating runs with 256 KiB and 1 MiB requests, took 0.75-0.78 s
/// against 0.81-0.89 s (1 GiB under 512 MiB), 1.23-1.32 s against
/// 1.29-1.35 s (2 GiB under 1 GiB) and 2.87-3.11 s against 3.22-3.26 s
/// (4 GiB under 1 GiB).
const SPAN: usize = 1 << 20;

impl DirectReader {
    /// Reads the file's bytes from `start` on straight into the spare
    /// capacity of `v` (empty, its memory aligned to [`ALIGN`]), a whole
    /// block in flight at once (up to [`MAX_DEPTH`] requests of [`SPAN`]
    /// bytes): no buffers and no copy. `start` is a multiple of
    /// [`ALIGN`]; the requests cover the first `need` bytes rounded up to
    /// a page, which must fit in the capacity. Returns `Ok` when those
    /// `need` bytes are in `v`'s spare capacity (`v` itself is left
    /// empty); a file that ends before is an `UnexpectedEof` error.
    pub(crate) fn read_into(
        &mut self,
        file: &File,
        start: u64,
        need: usize,
        v: &mut Vec<f32>,
    ) -> io::Result<()> {
        let span = need.next_multiple_of(ALIGN);
        let base = v.as_mut_ptr().cast::<u8>();
        if !v.is_empty()
            || v.capacity() * 4 < span
            || !(base as usize).is_multiple_of(ALIGN)
            || !start.is_multiple_of(ALIGN as u64)
        {
            return Err(io::Error::other(
                "a read in place needs aligned, large enough memory",
            ));
        }
        let count = span.div_ceil(SPAN);
        let request = |i: usize| {
            let at = i * SPAN;
            let len = SPAN.min(span - at);
            Request {
                pos: start + at as u64,
                dst: base.wrapping_add(at),
                len,
                need: len.min(need - at),
            }
        };
        let how = Submit::Each;
        // SAFETY: every request lies in `v`'s spare capacity (`span` bytes
        // fit in it), which nothing else touches while this call holds `v`.
        if self.engine && unsafe { readahead::read(file, count, MAX_DEPTH, how, request, |_| {}) } {
            return Ok(());
        }
        for i in 0..count {
            // SAFETY: as above.
            unsafe { pread_fully(file, &request(i)) }?;
        }
        Ok(())
    }
}

/// Reads request `r` with `pread` until its `need` bytes are in; a file
/// that ends before is an `UnexpectedEof` error.
///
/// # Safety
///
/// `r.dst` is valid for writes of `r.len` bytes, which nothing else
/// touches during the call.
unsafe fn pread_fully(file: &File, r: &Request) -> io::Result<()> {
    let mut got = 0;
    while got < r.need {
        let at = libc::off_t::try_from(r.pos + got as u64)
            .map_err(|_| io::Error::other("file offset out of range"))?;
        // SAFETY: `got < r.need <= r.len`: the rest lies within the bytes
        // lent to us.
        let n = unsafe { libc::pread(file.as_raw_fd(), r.dst.add(got).cast(), r.len - got, at) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
        if n == 0 || (got < r.need && !got.is_multiple_of(ALIGN)) {
            return Err(eof());
        }
    }
    Ok(())
}

/// Copies a finished piece from its buffer to its place in `dst` and
/// returns its checksum, taken in the same pass.
fn land(buf: &[u8], piece: &Piece, dst: &mut [MaybeUninit<u8>]) -> u64 {
    let src = &buf[piece.skip..piece.skip + piece.len];
    let out = &mut dst[piece.index * PIECE..piece.index * PIECE + piece.len];
    copy_sum(src, Some(out))
}

/// The checksum of `bytes`: that of each piece of [`PIECE`] bytes,
/// combined in order. It is what [`DirectReader::read`] returns for the
/// same bytes.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    let sums: Vec<u64> = bytes.chunks(PIECE).map(|p| copy_sum(p, None)).collect();
    combine(&sums)
}

fn combine(sums: &[u64]) -> u64 {
    sums.iter().fold(sums.len() as u64, |h, &s| {
        (h ^ s).wrapping_mul(0x9E37_79B1_85EB_CA87).rotate_left(29)
    })
}

/// The checksum of `src` ([`outcore::Checksum`]), copying it to `dst` in
/// the same pass when given (it must be as long as `src`). Fused with the
/// copy it runs at the copy's speed (measured in the cache: 14 GB/s,
/// against 7 GB/s for a copy followed by CRC-32).
pub(crate) fn copy_sum(src: &[u8], dst: Option<&mut [MaybeUninit<u8>]>) -> u64 {
    let mut sum = outcore::Checksum::new();
    match dst {
        Some(d) => sum.update_copy(src, &mut d[..src.len()]),
        None => sum.update(src),
    }
    sum.finish()
}

fn eof() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the file is shorter than its header says",
    )
}

/// A zeroed buffer aligned for direct I/O, in huge pages where it spans
/// them and the system allows.
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    /// `len` bytes aligned to `align` (a power of two, at least [`ALIGN`]).
    pub(crate) fn new(len: usize, align: usize) -> io::Result<AlignedBuf> {
        let layout = Layout::from_size_align(len.max(ALIGN), align.max(ALIGN))
            .map_err(|_| io::Error::other("buffer too large"))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        let ptr =
            std::ptr::NonNull::new(p).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        if layout.size() >= HUGE {
            // SAFETY: advice on memory this buffer owns; it changes neither
            // its contents nor its validity. Given before the first touch,
            // so that the pages are faulted in huge where possible.
            unsafe { libc::madvise(p.cast(), layout.size(), libc::MADV_HUGEPAGE) };
        }
        // SAFETY: `p` is valid for writes of `layout.size()` bytes.
        unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
        Ok(AlignedBuf { ptr, layout })
    }

    /// A buffer of no bytes, owning nothing.
    fn empty() -> AlignedBuf {
        AlignedBuf {
            ptr: std::ptr::NonNull::dangling(),
            layout: Layout::new::<()>(),
        }
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    #[cfg(test)]
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` holds `layout.size()` initialised bytes owned by
        // this buffer (none for an empty one), borrowed through `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    #[cfg(test)]
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `layout.size()` initialised (zeroed) bytes
        // owned by this buffer, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.layout.size() > 0 {
            // SAFETY: allocated in `new` with this layout, freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }
}

// SAFETY: the buffer owns its memory exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt;

    /// Reads `len` bytes at `pos` with `reader`; `None` where the
    /// filesystem refuses direct I/O.
    fn read(
        reader: &mut DirectReader,
        path: &std::path::Path,
        pos: u64,
        len: usize,
    ) -> Option<io::Result<(Vec<u8>, u64)>> {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok()?;
        let mut v: Vec<u8> = Vec::with_capacity(len);
        Some(reader.read(&f, pos, v.spare_capacity_mut()).map(|sum| {
            // SAFETY: `read` initialised all `len` bytes.
            unsafe { v.set_len(len) };
            (v, sum)
        }))
    }

    #[test]
    fn ranges_read_back_exactly_with_and_without_the_engine() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let p = dir.path().join("bytes");
        // 10 MiB and a bit: ranges span many pieces (more than a reader
        // puts in flight) and end inside a page.
        let bytes: Vec<u8> = (0..(10 << 20) + 1234u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let without = || DirectReader {
            engine: false,
            arena: AlignedBuf::new(BUF, HUGE).unwrap(),
        };
        for mut reader in [DirectReader::new().unwrap(), without()] {
            for (pos, len) in [
                (0, 1),
                (128, 4 << 20),
                (4095, PIECE + 1),
                (1000, bytes.len() - 1000),
            ] {
                let Some(r) = read(&mut reader, &p, pos as u64, len) else {
                    return;
                };
                let (got, sum) = r.unwrap();
                assert!(got == bytes[pos..pos + len], "{reader:?}: {pos}+{len}");
                assert_eq!(sum, checksum(&bytes[pos..pos + len]));
            }
            let past = read(&mut reader, &p, 4096, bytes.len()).unwrap();
            assert_eq!(
                past.unwrap_err().kind(),
                io::ErrorKind::UnexpectedEof,
                "{reader:?}"
            );
            // The reader is still usable after a failed read.
            let (got, _) = read(&mut reader, &p, 7, 300_000).unwrap().unwrap();
            assert!(got == bytes[7..300_007]);
        }
    }

    #[test]
    fn reads_in_place_fill_exactly_what_is_asked_with_and_without_the_engine() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let p = dir.path().join("bytes");
        // More requests than are in flight at once ([`MAX_DEPTH`] of
        // [`SPAN`]), so that slots are reused.
        let bytes: Vec<u8> = (0..((MAX_DEPTH * SPAN) as u32) + (8 << 20) + 1234)
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(&p, &bytes).unwrap();
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
        else {
            return;
        };
        let without = || DirectReader {
            engine: false,
            arena: AlignedBuf::empty(),
        };
        for mut reader in [DirectReader::new().unwrap(), without()] {
            // (start, need): within a piece, across many (more than are in
            // flight at once), and up to the file's last byte.
            for (start, need) in [
                (0usize, 100_000usize),
                (4096, (2 << 20) + 5),
                (8192, bytes.len() - 8192),
            ] {
                let mut v: Vec<f32> = Vec::with_capacity(need.next_multiple_of(ALIGN) / 4);
                match reader.read_into(&f, start as u64, need, &mut v) {
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
                    r => r.unwrap(),
                }
                // SAFETY: `read_into` initialised the first `need` bytes.
                let got = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), need) };
                assert!(
                    got == &bytes[start..start + need],
                    "{reader:?}: {start}+{need}"
                );
            }
            // Past the end of the file.
            let mut v: Vec<f32> = Vec::with_capacity(bytes.len() / 4 + ALIGN);
            let past = reader.read_into(&f, 4096, bytes.len(), &mut v);
            assert_eq!(
                past.unwrap_err().kind(),
                io::ErrorKind::UnexpectedEof,
                "{reader:?}"
            );
        }
    }

    #[test]
    fn a_block_is_in_flight_whole_up_to_the_most_buffers() {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let p = dir.path().join("bytes");
        std::fs::write(&p, vec![7u8; 12 << 20]).unwrap();
        let mut reader = DirectReader::new().unwrap();
        let buffers = |r: &DirectReader| r.arena.len() / BUF;
        assert_eq!(buffers(&reader), 0, "no buffers before the first read");
        for (len, want) in [
            (1000, 1),
            (4 << 20, (4usize << 20).div_ceil(PIECE)),
            (1 << 20, (4usize << 20).div_ceil(PIECE)),
            (11 << 20, MAX_DEPTH),
        ] {
            let Some(r) = read(&mut reader, &p, 10, len) else {
                return;
            };
            assert!(r.unwrap().0.iter().all(|&b| b == 7));
            assert_eq!(buffers(&reader), want, "after a read of {len} bytes");
        }
    }

    #[test]
    fn the_checksum_copies_exactly_and_combines_pieces_in_order() {
        let bytes: Vec<u8> = (0..8192 + 37u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let one = outcore::Checksum::of(&bytes);
        // Into an aligned destination (streamed stores) and misaligned ones:
        // the copy is exact and the sum is the runtime's.
        let mut page = AlignedBuf::new(bytes.len() + 64, ALIGN).unwrap();
        for at in [0, 1, 32] {
            let o = &mut page.as_mut()[at..at + bytes.len()];
            // SAFETY: initialised bytes viewed as `MaybeUninit<u8>` (same
            // layout), borrowed mutably for the call.
            let o = unsafe { &mut *(o as *mut [u8] as *mut [MaybeUninit<u8>]) };
            assert_eq!(copy_sum(&bytes, Some(o)), one, "at {at}");
            assert!(page.as_ref()[at..at + bytes.len()] == bytes[..], "at {at}");
            page.as_mut().fill(0);
        }
        assert_eq!(copy_sum(&bytes, None), one);
        assert_eq!(checksum(&bytes), combine(&[one]));
        // Pieces combine in order.
        let big: Vec<u8> = (0..3 * PIECE as u32 + 5)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut swapped = big.clone();
        let (p, q) = swapped.split_at_mut(PIECE);
        p.swap_with_slice(&mut q[..PIECE]);
        assert_ne!(checksum(&big), checksum(&swapped));
        let sums: Vec<u64> = big.chunks(PIECE).map(outcore::Checksum::of).collect();
        assert_eq!(checksum(&big), combine(&sums));
    }
}
