//! The spill store: one file per executor in a private directory.
//!
//! File layout (little-endian):
//!
//! ```text
//! offset  size  field
//!      0     8  magic "OUTCORE\0"
//!      8     4  format version (3)
//!     12     4  flags (0)
//!     16     8  executor id
//!     24     8  generation (bumped on every write of that executor)
//!     32     8  type fingerprint (hash of the Rust type's name and size)
//!     40     8  payload length in bytes
//!     48     8  checksum of the payload ([`Checksum`](crate::Checksum))
//!     56     8  checksum of bytes 0..56
//!     64     …  payload: the value encoded with bincode 2 (serde, fixed-width
//!               little-endian integers)
//! ```
//!
//! Version 3: 64-bit checksums (version 2 had CRC-32s, which cost loads
//! more CPU than their direct reads), and a 64-byte header.
//!
//! Since version 2: the bytes of every [`PodVec`](crate::PodVec) of 1 MiB or more
//! start on a 4 KiB boundary of the file (the vector's encoding carries the
//! padding), so loading reads them with `O_DIRECT` straight into the new
//! vector, which the allocator places on a page boundary. The rest of the
//! file (the header, each vector's length and padding, other fields) is
//! read with `O_DIRECT` too, a page at a time through a small aligned
//! buffer (`aligned.rs`): through the page cache, the kernel read ahead
//! bytes the direct reads then read again. Where the filesystem refuses
//! `O_DIRECT` (tmpfs, some network filesystems), everything is read
//! buffered.
//!
//! Writing streams the encoder straight into a buffered file writer (no
//! intermediate buffer of the whole value), then seeks back to fill in the
//! header. Loading checks every header field and the file length before
//! decoding, decodes under a bincode size limit derived from the payload
//! length (so a damaged length prefix cannot ask for a huge allocation), and
//! checks the payload checksum and that every byte was consumed before handing the
//! value back.
//!
//! A write counts only once `fdatasync` and a checked `close` have
//! succeeded: the executor's memory is freed after that, so a write-back
//! error (thin-provisioned or network storage, EIO) leaves the executor in
//! memory instead of leaving it with no copy anywhere.
//!
//! After a write and after a load the file's pages are dropped from the page
//! cache (`POSIX_FADV_DONTNEED`): a memory cgroup charges them to the job's
//! limit, and dirty spill pages piling up there make the kernel swap out
//! the job's own memory.
//!
//! Files:
//!
//! - `mod.rs` (this file): the format, writing and loading (direct loads
//!   through the crate's read-ahead engine, `readahead.rs`);
//! - `aligned.rs`: the small reads of a direct load;
//! - `dir.rs`: the private spill directory, its lock and the sweep of
//!   directories left by killed runs;
//! - `tier.rs`: [`SpillTier`], a place for the same images besides the
//!   directory (another rank's memory), and the streams to and from it;
//! - `tests.rs`: round trips and every kind of corruption.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Result;
use crate::pod::RawRead;
use crate::Checksum;

/// Magic bytes at the start of every spill file.
pub const MAGIC: [u8; 8] = *b"OUTCORE\0";
/// The current format version.
pub const VERSION: u32 = 3;
/// Header length in bytes.
pub const HEADER_LEN: usize = 64;
/// Buffer size of the spill writer.
const IO_BUF: usize = 1 << 20;
/// Buffer size of the spill reader. Small on purpose: `PodVec` reads its
/// 1 MiB chunks straight into place, and a large buffer would be refilled
/// by each 8-byte chunk header and then copied out again.
const READ_BUF: usize = 64 << 10;

/// Bytes per direct read without native AIO (the kernel splits it into
/// several device requests in flight).
const DIRECT_PIECE: usize = 8 << 20;
/// Bytes per read through native AIO ([`crate::readahead`]).
const AIO_PIECE: usize = 512 << 10;
/// Reads in flight at most through native AIO.
const AIO_WINDOW: usize = 16;

/// Identifies what a spill file must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileKey {
    /// The executor's id.
    pub executor: u64,
    /// The write generation.
    pub generation: u64,
    /// The type fingerprint (see [`fingerprint`]).
    pub fingerprint: u64,
}

/// A fingerprint of the type `T`: FNV-1a over its name and size.
pub fn fingerprint<T: 'static>() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let name = std::any::type_name::<T>().as_bytes();
    let size = (std::mem::size_of::<T>() as u64).to_le_bytes();
    for &b in name.iter().chain(size.iter()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub(crate) fn bincode_config(
) -> bincode::config::Configuration<bincode::config::LittleEndian, bincode::config::Fixint> {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
}

/// The decoded header of a spill file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    key: FileKey,
    payload_len: u64,
    payload_sum: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.executor.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.generation.to_le_bytes());
        b[32..40].copy_from_slice(&self.key.fingerprint.to_le_bytes());
        b[40..48].copy_from_slice(&self.payload_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.payload_sum.to_le_bytes());
        let sum = Checksum::of(&b[0..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_LEN]) -> std::result::Result<Header, String> {
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        if b[0..8] != MAGIC {
            return Err("not an outcore spill file (bad magic)".into());
        }
        let version = u32_at(8);
        if u64_at(56) != Checksum::of(&b[0..56]) {
            // Older versions laid the header out differently, so their
            // checksum never matches this one's: name the version too.
            if (1..VERSION).contains(&version) {
                return Err(format!(
                    "header checksum mismatch: format version {version} of an older outcore, \
                     or a damaged header (this one reads version {VERSION})"
                ));
            }
            return Err("header checksum mismatch (damaged header)".into());
        }
        if version != VERSION {
            return Err(format!(
                "unsupported format version {version} (expected {VERSION})"
            ));
        }
        let flags = u32_at(12);
        if flags != 0 {
            return Err(format!(
                "unknown header flags {flags:#x} (this version writes none)"
            ));
        }
        Ok(Header {
            key: FileKey {
                executor: u64_at(16),
                generation: u64_at(24),
                fingerprint: u64_at(32),
            },
            payload_len: u64_at(40),
            payload_sum: u64_at(48),
        })
    }
}

/// A writer that counts and checksums what passes through.
struct Tee<W> {
    inner: W,
    /// The checksum of what passed, which also counts it.
    sum: Checksum,
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sum.update(&buf[..n]);
        crate::pod::WritePos::advance(n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that counts and checksums what passes through, and reports EOF
/// at the end of the payload. With a direct descriptor, [`RawRead`] reads
/// page-aligned stretches of the payload with `O_DIRECT`.
struct TeeRead<'f, R> {
    inner: R,
    sum: Checksum,
    /// Payload bytes not read yet.
    left: u64,
    /// The file offset of the next payload byte.
    pos: u64,
    /// The same file opened with `O_DIRECT`, if the filesystem allows it.
    direct: Option<&'f File>,
    /// Bytes read with direct I/O.
    direct_bytes: u64,
}

impl<R: Read> Read for TeeRead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let max = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if max == 0 {
            return Ok(0);
        }
        let n = self.inner.read(&mut buf[..max])?;
        self.sum.update(&buf[..n]);
        self.left -= n as u64;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read + Seek> RawRead for TeeRead<'_, R> {
    unsafe fn read_direct(&mut self, dst: *mut u8, len: usize) -> io::Result<usize> {
        let page = crate::alloc::PAGE;
        let Some(file) = self.direct else {
            return Ok(0);
        };
        if dst as usize % page != 0 || self.pos % page as u64 != 0 {
            return Ok(0);
        }
        let want = len.min(usize::try_from(self.left).unwrap_or(usize::MAX)) / page * page;
        if want == 0 {
            return Ok(0);
        }
        let mut sum = self.sum.clone();
        // SAFETY: the caller lends us `len >= want` bytes at `dst`.
        match unsafe { read_pieces(file, self.pos, dst, want, &mut sum) } {
            Ok(()) => self.sum = sum,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // Refused (alignment rules stricter than a page, a
                // filesystem without direct reads): nothing was taken from
                // the stream; the caller reads it buffered.
                self.direct = None;
                return Ok(0);
            }
            Err(e) => return Err(e),
        }
        self.left -= want as u64;
        self.pos += want as u64;
        self.direct_bytes += want as u64;
        // Drops what the buffered reader read ahead.
        self.inner
            .seek(SeekFrom::Start(self.pos))
            .map_err(context("seek"))?;
        Ok(want)
    }
}

/// Reads `len` bytes (a multiple of the page size) of `file` at `pos`
/// into `dst` with direct I/O, each piece added to `sum` as it lands (on
/// error, `sum` holds part of the range: the caller's copy is not
/// updated until all of it is in).
///
/// Through native AIO ([`crate::readahead`]), [`AIO_WINDOW`] reads of
/// [`AIO_PIECE`] in flight, checksummed in order as they land; where
/// that is unavailable or did not work (then the whole range again, which
/// reports the error if there is one), one [`DIRECT_PIECE`] `pread` at a
/// time (which the kernel splits into device requests). No helper thread: under a hard
/// memory limit starting a thread can fail fatally (its thread-local
/// destructors are registered with the C library's allocator).
///
/// # Safety
///
/// `dst` is valid for writes of `len` bytes and nothing else touches them
/// during the call.
unsafe fn read_pieces(
    file: &File,
    pos: u64,
    dst: *mut u8,
    len: usize,
    sum: &mut Checksum,
) -> io::Result<()> {
    let before = sum.clone();
    // SAFETY: the caller's promise, passed on.
    if unsafe { read_aio(file, pos, dst, len, sum) } {
        return Ok(());
    }
    *sum = before;
    let mut off = 0;
    while off < len {
        let n = DIRECT_PIECE.min(len - off);
        // SAFETY: `off..off + n` lies within the `len` bytes lent to us.
        unsafe { read_piece(file, pos + off as u64, dst.add(off), n) }?;
        // SAFETY: the kernel wrote all `n` bytes at `dst + off`.
        sum.update(unsafe { std::slice::from_raw_parts(dst.add(off), n) });
        off += n;
    }
    Ok(())
}

/// [`read_pieces`] through native AIO; `false` when that did not work
/// (then `sum` may hold part of the range, and no read is in flight).
///
/// # Safety
///
/// As for [`read_pieces`].
unsafe fn read_aio(file: &File, pos: u64, dst: *mut u8, len: usize, sum: &mut Checksum) -> bool {
    let piece = |i: usize| {
        let (at, n) = (i * AIO_PIECE, AIO_PIECE.min(len - i * AIO_PIECE));
        // SAFETY: `at < len`: within the `len` bytes lent to us.
        let dst = unsafe { dst.add(at) };
        crate::readahead::Request {
            pos: pos + at as u64,
            dst,
            len: n,
            need: n,
        }
    };
    let landed = |i: usize| {
        let r = piece(i);
        // SAFETY: the kernel wrote all `r.len` bytes of this piece, which
        // lie within the `len` bytes lent to us.
        sum.update(unsafe { std::slice::from_raw_parts(r.dst, r.len) });
    };
    let count = len.div_ceil(AIO_PIECE);
    let how = crate::readahead::Submit::Each;
    // SAFETY: the pieces lie within the `len` bytes lent to us, which
    // nothing else touches during the call.
    unsafe { crate::readahead::read(file, count, AIO_WINDOW, how, piece, landed) }
}

/// Reads exactly `n` bytes at `pos` into `dst` with direct I/O.
///
/// # Safety
///
/// `dst` is valid for writes of `n` bytes and nothing else touches them
/// during the call.
unsafe fn read_piece(file: &File, pos: u64, dst: *mut u8, n: usize) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let mut got = 0usize;
    while got < n {
        let offset = libc::off_t::try_from(pos + got as u64)
            .map_err(|_| io::Error::other("file offset out of range"))?;
        // SAFETY: `dst + got .. dst + n` lies within the bytes lent to us.
        let r = unsafe {
            libc::pread(
                file.as_raw_fd(),
                dst.add(got).cast::<libc::c_void>(),
                n - got,
                offset,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file ends inside a directly read region (truncated)",
            ));
        }
        got += r as usize;
    }
    Ok(())
}

/// Reads through a `RefCell` shared with the `PodVec` raw-read hook.
struct SharedRead<'a, R>(&'a RefCell<R>);

impl<R: Read> Read for SharedRead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.0.try_borrow_mut() {
            Ok(mut r) => r.read(buf),
            Err(_) => Err(io::Error::other("spill reader busy")),
        }
    }
}

/// Adds what was being done to an I/O error, keeping its kind (a full
/// disk stays [`io::ErrorKind::StorageFull`]).
fn context(what: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Encodes `value` into `inner` as the payload of a spill file, counting
/// and checksumming it. `PodVec`s place their bytes by file offset, counted
/// from the end of the header.
fn encode_payload_into<W: Write, T: Serialize>(
    inner: W,
    value: &T,
) -> std::result::Result<Tee<W>, bincode::error::EncodeError> {
    let mut tee = Tee {
        inner,
        sum: Checksum::new(),
    };
    let _pos = crate::pod::WritePos::install(HEADER_LEN as u64);
    bincode::serde::encode_into_std_write(value, &mut tee, bincode_config())?;
    Ok(tee)
}

/// A spill write that failed in the value's own encoding (its `Serialize`
/// returned an error or panicked), not in the file: the payload of the
/// `io::Error` it is reported as.
#[derive(Debug)]
pub(crate) struct ValueFailed(String);

impl ValueFailed {
    /// An `io::Error` of kind `Other` carrying the reason.
    pub(crate) fn error(reason: String) -> io::Error {
        io::Error::other(ValueFailed(reason))
    }

    /// Whether `e` is such a failure.
    pub(crate) fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|r| r.is::<ValueFailed>())
    }
}

impl std::fmt::Display for ValueFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ValueFailed {}

/// Writes `value` to `path` with the header for `key`. Returns the file's
/// length. On error the file may be partial; the caller must not treat it as
/// valid. Errors keep the underlying I/O error's kind.
pub fn write_file<T: Serialize>(path: &Path, key: FileKey, value: &T) -> io::Result<u64> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(context("create"))?;
    let mut w = BufWriter::with_capacity(IO_BUF, file);
    w.write_all(&[0u8; HEADER_LEN]).map_err(context("write"))?;
    let tee = encode_payload_into(w, value).map_err(|e| match e {
        bincode::error::EncodeError::Io { inner, .. } => context("write")(inner),
        other => ValueFailed::error(format!("encode: {other}")),
    })?;
    let header = Header {
        key,
        payload_len: tee.sum.len(),
        payload_sum: tee.sum.finish(),
    };
    let mut w = tee.inner;
    w.flush().map_err(context("write"))?;
    let mut file = w
        .into_inner()
        .map_err(|e| context("write")(e.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(context("seek"))?;
    file.write_all(&header.encode()).map_err(context("write"))?;
    // The caller frees the executor's memory on success: success must mean
    // the data is on disk. Write-back errors (a thin-provisioned or network
    // disk, EIO) surface here or at close, not at write().
    file.sync_data().map_err(context("sync"))?;
    drop_cached(&file);
    close_checked(file)?;
    Ok(HEADER_LEN as u64 + header.payload_len)
}

macro_rules! decode_bounded {
    ($reader:expr, $len:expr, $($bits:literal)*) => {{
        $(
            if $len <= (1u64 << $bits) {
                return bincode::serde::decode_from_std_read::<T, _, _>(
                    $reader,
                    bincode_config().with_limit::<{ 1usize << $bits }>(),
                )
                .map_err(|e| format!("decode: {e}"));
            }
        )*
        Err(format!("payload of {} bytes is larger than the decoder allows", $len))
    }};
}

/// Decodes under a container-size limit of at most 4x the payload length.
fn decode_limited<T: DeserializeOwned, R: Read>(
    r: &mut R,
    payload_len: u64,
) -> std::result::Result<T, String> {
    decode_bounded!(r, payload_len, 16 18 20 22 24 26 28 30 32 34 36 38 40 42 44 46)
}

/// Reads and verifies the file at `path`, which must hold `key`. Returns
/// the value and the file length. A file that fails verification gives an
/// error of kind [`io::ErrorKind::InvalidData`]; others keep their kind.
#[cfg(test)]
pub fn read_file<T: DeserializeOwned>(path: &Path, key: FileKey) -> io::Result<(T, u64)> {
    read_file_counted(path, key).map(|(v, l)| (v, l.bytes))
}

/// What a load read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Loaded {
    /// The file's length.
    pub bytes: u64,
    /// Of those, bytes read with direct I/O.
    pub direct_bytes: u64,
}

/// [`read_file`], also saying how much was read with direct I/O.
pub(crate) fn read_file_counted<T: DeserializeOwned>(
    path: &Path,
    key: FileKey,
) -> io::Result<(T, Loaded)> {
    let file = File::open(path).map_err(context("open"))?;
    let file_len = file.metadata().map_err(context("stat"))?.len();
    // Only a file that can hold a large `PodVec` is worth a second
    // descriptor. A filesystem without `O_DIRECT` refuses the open.
    let direct = (file_len >= crate::pod::DIRECT_FROM as u64)
        .then(|| {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        })
        .flatten();
    let value = match &direct {
        // The small reads go direct too (see `aligned`): no read-ahead
        // of bytes the direct reads then read again.
        Some(d) => {
            let mut reader = aligned::AlignedReader::new(file, d);
            let value = read_from(&mut reader, file_len, key, direct.as_ref());
            drop_cached(reader.plain());
            value
        }
        None => {
            // Doubles the kernel's readahead window.
            advise(&file, libc::POSIX_FADV_SEQUENTIAL);
            let mut reader = BufReader::with_capacity(READ_BUF, file);
            let value = read_from(&mut reader, file_len, key, None);
            drop_cached(reader.get_ref());
            value
        }
    };
    let (value, direct_bytes) = value.map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?;
    Ok((
        value,
        Loaded {
            bytes: file_len,
            direct_bytes,
        },
    ))
}

/// Closes `file`, reporting an error `close(2)` returns (dropping a `File`
/// ignores it).
fn close_checked(file: File) -> io::Result<()> {
    use std::os::unix::io::IntoRawFd;
    let fd = file.into_raw_fd();
    // SAFETY: `fd` is a descriptor we own (taken from the `File`), closed
    // exactly once.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(context("close")(io::Error::last_os_error()))
    }
}

/// Asks the kernel to write the file's dirty pages back now and to drop
/// its cached pages (those already clean; the rest become droppable as
/// soon as they are written).
///
/// A spill file's pages are of no use in the page cache: the executor is
/// either in memory or will be read back once, much later. Under a memory
/// cgroup they are charged to the same limit as the job's memory, and when
/// dirty pages pile up the kernel reclaims by swapping out the job's own
/// memory instead (seen as major faults in the next sweep). Advice only:
/// errors are ignored.
fn drop_cached(file: &File) {
    advise(file, libc::POSIX_FADV_DONTNEED);
}

/// `posix_fadvise` over the whole file; advice only, errors are ignored.
/// (`POSIX_FADV_SEQUENTIAL` before a load doubles the kernel's readahead
/// window for the file.)
fn advise(file: &File, advice: libc::c_int) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain syscall on a descriptor we own; no memory is passed.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, advice);
    }
}

/// Verifies and decodes a whole spill file held in memory (the same checks
/// as [`read_file`]): an executor's exported bytes, and the fuzz target's.
pub fn decode_bytes<T: DeserializeOwned>(
    bytes: &[u8],
    key: FileKey,
) -> std::result::Result<T, String> {
    read_from(io::Cursor::new(bytes), bytes.len() as u64, key, None).map(|(v, _)| v)
}

/// The payload of `value` as the spill writer lays it out (large `PodVec`
/// bytes on 4 KiB boundaries of the file), and its checksum.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn encode_payload<T: Serialize>(
    value: &T,
) -> std::result::Result<(Vec<u8>, u64), String> {
    let tee = encode_payload_into(Vec::new(), value).map_err(|e| format!("encode: {e}"))?;
    Ok((tee.inner, tee.sum.finish()))
}

/// Encodes `value` as a whole spill file in memory (the inverse of
/// [`decode_bytes`]): the header's place is kept at the start and filled
/// in last, so the bytes are made in one buffer, once.
pub fn encode_bytes<T: Serialize>(key: FileKey, value: &T) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    let tee = encode_payload_into(out, value).map_err(|e| format!("encode: {e}"))?;
    let mut out = tee.inner;
    let header = Header {
        key,
        payload_len: (out.len() - HEADER_LEN) as u64,
        payload_sum: tee.sum.finish(),
    };
    out[..HEADER_LEN].copy_from_slice(&header.encode());
    Ok(out)
}

/// The checks and the bounded decode, from a reader of `file_len` bytes
/// (and the same file opened for direct I/O, if it could be). Returns the
/// value and the bytes read with direct I/O.
fn read_from<T: DeserializeOwned, R: Read + Seek>(
    mut r: R,
    file_len: u64,
    key: FileKey,
    direct: Option<&File>,
) -> std::result::Result<(T, u64), String> {
    let mut hb = [0u8; HEADER_LEN];
    r.read_exact(&mut hb).map_err(|_| {
        format!("truncated: {file_len} bytes, shorter than the {HEADER_LEN}-byte header")
    })?;
    let h = Header::decode(&hb)?;
    if h.key.executor != key.executor {
        return Err(format!(
            "file belongs to executor #{}, not #{}",
            h.key.executor, key.executor
        ));
    }
    if h.key.fingerprint != key.fingerprint {
        return Err("file holds a different type (fingerprint mismatch)".into());
    }
    if h.key.generation != key.generation {
        return Err(format!(
            "stale file: generation {} on disk, {} expected",
            h.key.generation, key.generation
        ));
    }
    if file_len.checked_sub(HEADER_LEN as u64) != Some(h.payload_len) {
        return Err(format!(
            "length mismatch: header says {} payload bytes, file has {}",
            h.payload_len,
            file_len.saturating_sub(HEADER_LEN as u64)
        ));
    }
    let tee = RefCell::new(TeeRead {
        inner: r,
        sum: Checksum::new(),
        left: h.payload_len,
        pos: HEADER_LEN as u64,
        direct,
        direct_bytes: 0,
    });
    let value: T = {
        let _budget = crate::pod::DecodeBudget::set(h.payload_len);
        let _raw = crate::pod::RawReader::install(&tee);
        decode_limited(&mut SharedRead(&tee), h.payload_len)?
    };
    let tee = tee.into_inner();
    if tee.left != 0 {
        return Err(format!("{} trailing payload bytes not decoded", tee.left));
    }
    if tee.sum.finish() != h.payload_sum {
        return Err("payload checksum mismatch (damaged data)".into());
    }
    Ok((value, tee.direct_bytes))
}

/// The directory holding the spill files.
#[derive(Debug)]
pub(crate) struct SpillStore {
    dir: PathBuf,
    _private: dir::PrivateDir,
}

/// The system temporary directory: `TMPDIR`, or `/tmp` when it is unset
/// or set but empty (as `mktemp` reads it; `std::env::temp_dir` would
/// give an empty path, and the spill directory a "No such file" error).
/// Unset, and `/tmp` in memory (tmpfs, as on many distributions), it is
/// `/var/tmp` when that is on a disk: spilled data on tmpfs stays in
/// memory, and counts against a container's memory limit.
pub(crate) fn system_temp_dir() -> PathBuf {
    temp_dir_from(
        std::env::var_os("TMPDIR"),
        |p| p.is_dir() && in_memory(p) == Some(false),
        |p| in_memory(p) == Some(true),
    )
}

/// [`system_temp_dir`] from `TMPDIR`'s value, `on_disk` and `in_ram`
/// (whether a directory is on a disk, or in memory).
fn temp_dir_from(
    tmpdir: Option<std::ffi::OsString>,
    on_disk: impl Fn(&Path) -> bool,
    in_ram: impl Fn(&Path) -> bool,
) -> PathBuf {
    match tmpdir {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ if in_ram(Path::new("/tmp")) && on_disk(Path::new("/var/tmp")) => {
            PathBuf::from("/var/tmp")
        }
        _ => PathBuf::from("/tmp"),
    }
}

/// Whether `dir` is on a filesystem held in memory (tmpfs or ramfs), where
/// spilled data does not leave memory; `None` when it cannot be told.
pub(crate) fn in_memory(dir: &Path) -> Option<bool> {
    use std::os::unix::ffi::OsStrExt;
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `st` is plain data, written by `statfs` before it is read.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path; `statfs` writes only `st`.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // `f_type`'s type differs by target.
    let kind = st.f_type as i64;
    Some(kind == TMPFS_MAGIC || kind == RAMFS_MAGIC)
}

impl SpillStore {
    /// Creates a private directory (mode 0700, locked while the store
    /// lives: see [`dir`]) inside `parent`, or inside the system temporary
    /// directory, after checking that other users cannot tamper with it.
    /// It is removed on drop. Directories left by runtimes of this host
    /// that died (killed) are removed.
    pub(crate) fn new(parent: Option<&Path>) -> Result<SpillStore> {
        let parent_dir = parent.map_or_else(system_temp_dir, Path::to_path_buf);
        dir::check_parent(&parent_dir, parent.is_some())?;
        let private = dir::PrivateDir::create(&parent_dir)?;
        Ok(SpillStore {
            dir: private.path().to_path_buf(),
            _private: private,
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of an executor: derived from its id only, never from user
    /// input.
    pub(crate) fn path_for(&self, id: u64) -> PathBuf {
        self.dir.join(format!("exec-{id:08}.spill"))
    }
}

mod aligned;
pub(crate) mod dir;
pub(crate) mod tier;
pub use tier::{Reclaim, SpillTier, TierHead, TierKey, TIER_HEAD_LEN};
#[cfg(test)]
mod tests;
