//! The small reads of a direct load (the header, each `PodVec`'s length
//! and padding, fields that are not `PodVec`s), made with `O_DIRECT` too.
//!
//! Read through the page cache, the first small read of a spill file made
//! the kernel read ahead (256 KiB for a 64 KiB buffer, and the virtual disk
//! this runtime is measured on allows 8 MiB windows), and the direct read
//! that followed read those bytes again: 1 MiB executors made the device
//! read 1.25 bytes per byte loaded, and the kernel copied and then dropped
//! the cached pages. Here a small read is one aligned direct read of 4 KiB
//! (the bytes before a `PodVec`'s data fit in one page), and reads that
//! follow on from each other double up to [`MAX_FILL`], as read-ahead
//! would, for large values that are not `PodVec`s.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::io::AsRawFd;

use crate::alloc::PAGE;

/// The largest read of one refill.
const MAX_FILL: usize = 64 << 10;

/// A buffered reader of one file that reads through an `O_DIRECT`
/// descriptor while the filesystem takes it, and through the plain one
/// after a refusal (`EINVAL`).
pub(super) struct AlignedReader<'f> {
    plain: File,
    direct: Option<&'f File>,
    /// `MAX_FILL` bytes, plus a page to align them.
    buf: Vec<u8>,
    /// Where the page-aligned part of `buf` starts.
    at: usize,
    /// The file offset of the buffer's first byte.
    buf_pos: u64,
    /// Bytes in the buffer, and the next one to hand out.
    filled: usize,
    next: usize,
    /// The size of the next refill.
    fill: usize,
}

impl<'f> AlignedReader<'f> {
    pub(super) fn new(plain: File, direct: &'f File) -> AlignedReader<'f> {
        let buf: Vec<u8> = Vec::with_capacity(MAX_FILL + PAGE);
        let at = buf.as_ptr().align_offset(PAGE);
        AlignedReader {
            plain,
            direct: Some(direct),
            buf,
            at,
            buf_pos: 0,
            filled: 0,
            next: 0,
            fill: PAGE,
        }
    }

    /// The plain descriptor.
    pub(super) fn plain(&self) -> &File {
        &self.plain
    }

    /// The file offset of the next byte handed out.
    fn pos(&self) -> u64 {
        self.buf_pos + self.next as u64
    }

    /// Refills the buffer from `pos` (rounded down to a page); returns the
    /// bytes now available at `pos`.
    fn refill(&mut self, pos: u64) -> io::Result<usize> {
        let start = pos - pos % PAGE as u64;
        let skip = (pos - start) as usize;
        // `skip < PAGE <= fill`: the byte at `pos` is in the read.
        let len = self.fill;
        let n = loop {
            let fd = self.direct.unwrap_or(&self.plain).as_raw_fd();
            let offset = libc::off_t::try_from(start)
                .map_err(|_| io::Error::other("file offset out of range"))?;
            // SAFETY: `at + len <= at + MAX_FILL <=` the buffer's capacity:
            // the kernel writes within its allocation, and the bytes are
            // read back only up to the count it returns.
            let r =
                unsafe { libc::pread(fd, self.buf.as_mut_ptr().add(self.at).cast(), len, offset) };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EINVAL) if self.direct.is_some() => self.direct = None,
                _ => return Err(e),
            }
        };
        self.buf_pos = start;
        self.filled = n;
        self.next = skip.min(n);
        self.fill = (len * 2).min(MAX_FILL);
        Ok(n - self.next)
    }
}

impl Read for AlignedReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.next == self.filled && self.refill(self.pos())? == 0 {
            return Ok(0);
        }
        let n = out.len().min(self.filled - self.next);
        // SAFETY: `at + next .. at + next + n` lies within the `filled`
        // bytes the kernel wrote into the buffer's allocation.
        let src =
            unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(self.at + self.next), n) };
        out[..n].copy_from_slice(src);
        self.next += n;
        Ok(n)
    }
}

impl Seek for AlignedReader<'_> {
    /// Moves to `to`; the buffer is kept only if `to` lies in it. A move
    /// starts the refill sizes over (a direct read of a `PodVec`'s data
    /// came between).
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos().checked_add_signed(d),
            SeekFrom::End(d) => self.plain.metadata()?.len().checked_add_signed(d),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek out of range"))?;
        let end = self.buf_pos + self.filled as u64;
        if (self.buf_pos..=end).contains(&target) {
            self.next = (target - self.buf_pos) as usize;
        } else {
            self.buf_pos = target;
            self.filled = 0;
            self.next = 0;
            self.fill = PAGE;
        }
        Ok(target)
    }
}
