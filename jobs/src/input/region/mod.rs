//! Reading any block of rows from an input file, again and again: the
//! lineage of file-backed executors (they are rebuilt from the file
//! instead of being spilled).
//!
//! Reads are direct and several are in flight ([`super::direct`]), so they
//! cost no page-cache copy and leave the page cache alone; where the
//! filesystem refuses direct I/O (tmpfs), plain `pread` takes over.
//!
//! A file that changes under the run would silently change the data, so
//! each read checks the file's size and modification time against those
//! taken when it was opened, and a checksum of the block's bytes against
//! the one taken at its first read. An uncompressed `.npz` member is also
//! checked against the CRC-32 its archive records, once: the CRC-32s of
//! the blocks' first reads are combined when they cover the member.
//!
//! Files: `mod.rs` (this file) holds [`Region`] and its reads;
//! `member.rs` the CRC-32 check of a `.npz` member; `pages.rs` the memory
//! advice for fresh blocks; `tests.rs` the tests.

use std::fs::{File, OpenOptions};
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};

use super::direct::{checksum, DirectReader, ALIGN, MAX_RECORD};

mod member;
mod pages;

use member::MemberCheck;
pub(crate) use pages::{huge_pages, populate};
use pages::{read_if_cached, uninit_bytes};

/// How rows are stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// Little-endian float32 values, `dims` per row (read straight into
    /// the block).
    F32,
    /// Other float or integer values (float16, float64, big-endian),
    /// converted to float32.
    Convert(crate::npy::Stored),
    /// `.fvecs`: each row starts with its dimension as int32.
    Fvecs,
}

/// What identifies the file's contents as first seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// The rows of one input file, readable by block.
#[derive(Debug)]
pub(crate) struct Region {
    path: PathBuf,
    /// Opened with `O_DIRECT`, when the filesystem allows it.
    direct: Option<File>,
    plain: File,
    /// Byte offset of row 0.
    offset: u64,
    dims: usize,
    encoding: Encoding,
    stamp: Stamp,
    /// The file's two readers, each made at its first direct read and kept
    /// with its buffers (fresh memory would cost a page fault per page on
    /// every read). A reader puts a whole block in flight and holds about
    /// a block's worth of buffers (8 MiB at most), counted against the cap
    /// like any memory. Threads reading at once (the prefetcher, workers
    /// loading on demand) take a free one, or wait for the first: with
    /// two, one thread's reads are in flight while another copies its
    /// block out (4 GiB `.npy` under 1 GiB: initialisation 2.0-3.3 s
    /// against 2.6-4.1 s with one reader, three alternations).
    readers: [Mutex<Option<DirectReader>>; 2],
    /// Set when the filesystem refused a read in place (`EINVAL`): later
    /// blocks go straight to the buffered path instead of trying again.
    in_place_refused: AtomicBool,
    /// Bytes read from the file so far.
    read_bytes: AtomicU64,
    /// For an uncompressed `.npz` member: its CRC-32 check.
    member: Option<MemberCheck>,
}

impl Region {
    /// Opens `path` for block reads; `None` when it is not a regular file
    /// (a pipe or a device cannot be read twice).
    pub(crate) fn open(
        path: &Path,
        offset: u64,
        dims: usize,
        encoding: Encoding,
    ) -> io::Result<Option<Region>> {
        let plain = File::open(path)?;
        let meta = plain.metadata()?;
        if !meta.file_type().is_file() {
            return Ok(None);
        }
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(Some(Region {
            path: path.to_path_buf(),
            direct,
            plain,
            offset,
            dims,
            encoding,
            stamp: Stamp::of(&meta),
            readers: [Mutex::new(None), Mutex::new(None)],
            in_place_refused: AtomicBool::new(false),
            read_bytes: AtomicU64::new(0),
            member: None,
        }))
    }

    /// Bytes read from the file so far.
    pub(crate) fn bytes_read(&self) -> u64 {
        self.read_bytes.load(Ordering::Relaxed)
    }

    /// Rows `first..first + n` as float32 into `out` (cleared first) when
    /// the file stores float32 rows and all their pages are in the page
    /// cache: copied from it (buffered reads that do not wait for the
    /// disk), which is faster than reading them again from the disk.
    /// `false` otherwise (read them with [`read`](Self::read)), `out` then
    /// unspecified. The values are not validated here.
    pub(crate) fn read_cached(&self, first: u64, n: usize, out: &mut Vec<f32>) -> io::Result<bool> {
        out.clear();
        if !matches!(self.encoding, Encoding::F32) || self.member.is_some() {
            return Ok(false);
        }
        let pos = self.offset + first * self.record() as u64;
        let count = n * self.dims;
        if Stamp::of(&self.plain.metadata()?) != self.stamp {
            return Err(self.changed(first, n, "its size or modification time changed"));
        }
        out.reserve(count);
        if !read_if_cached(
            &self.plain,
            pos,
            uninit_bytes(&mut out.spare_capacity_mut()[..count]),
        )? {
            return Ok(false);
        }
        // SAFETY: `read_if_cached` filled all `count * 4` bytes of the
        // first `count` elements, and any bits are a valid f32.
        unsafe { out.set_len(count) };
        self.read_bytes
            .fetch_add((count * 4) as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Bytes one row takes in the file.
    fn record(&self) -> usize {
        match self.encoding {
            Encoding::F32 => 4 * self.dims,
            Encoding::Convert(s) => s.size() * self.dims,
            Encoding::Fvecs => 4 + 4 * self.dims,
        }
    }

    /// Rows `first..first + n` as float32, row-major. `first_sum` holds the
    /// [`checksum`] of the block's bytes from its
    /// first read (set by that read);
    /// a later read that differs, or a file whose size or modification
    /// time changed since it was opened, is an error.
    pub(crate) fn read(
        &self,
        first: u64,
        n: usize,
        first_sum: &OnceLock<u64>,
    ) -> io::Result<Vec<f32>> {
        self.read_block(first, n, first_sum, false).map(|(v, _)| v)
    }

    /// [`read`](Self::read), but the values may start `skip` elements into
    /// the vector returned with `skip`: where the rows are float32 and the
    /// file allows direct reads, the block's pages are read straight into
    /// the vector's memory, with no buffer and no copy, so the vector
    /// starts where the first row's page starts (the bytes before the
    /// first row are the file's).
    pub(crate) fn read_in_place(
        &self,
        first: u64,
        n: usize,
        first_sum: &OnceLock<u64>,
    ) -> io::Result<(Vec<f32>, usize)> {
        self.read_block(first, n, first_sum, true)
    }

    fn read_block(
        &self,
        first: u64,
        n: usize,
        first_sum: &OnceLock<u64>,
        in_place: bool,
    ) -> io::Result<(Vec<f32>, usize)> {
        if let Some(m) = &self.member {
            m.check()?;
        }
        let now = Stamp::of(&self.plain.metadata()?);
        if now != self.stamp {
            return Err(self.changed(first, n, "its size or modification time changed"));
        }
        let pos = self.offset + first * self.record() as u64;
        let placed = match self.encoding {
            Encoding::F32 if in_place => self.in_place(pos, n * self.dims)?,
            _ => None,
        };
        // A member's block read for the first time: its CRC-32.
        let crc_wanted = self.member.is_some() && first_sum.get().is_none();
        let (values, skip, sum, crc) = match placed {
            Some((v, skip, sum)) => (v, skip, sum, None),
            None => self.read_values(first, n, pos, crc_wanted)?,
        };
        self.read_bytes
            .fetch_add((n * self.record()) as u64, Ordering::Relaxed);
        // The first read validates the values; later reads are checked
        // against its checksum instead.
        let mut first_read = false;
        if *first_sum.get_or_init(|| {
            first_read = true;
            sum
        }) != sum
        {
            return Err(self.changed(first, n, "its bytes differ from the first read"));
        }
        if first_read {
            self.validate_first(first, n, &values[skip..], crc)?;
        }
        Ok((values, skip))
    }

    /// `n` rows from byte `pos` read into a new vector (converted to
    /// float32 if the file holds another type), with their checksum and,
    /// when `crc_wanted`, the CRC-32 of the file's bytes (for a member
    /// whose values are converted; float32 values are their bytes).
    fn read_values(
        &self,
        first: u64,
        n: usize,
        pos: u64,
        crc_wanted: bool,
    ) -> io::Result<(Vec<f32>, usize, u64, Option<flate2::Crc>)> {
        if let Encoding::F32 = self.encoding {
            let count = n * self.dims;
            let mut v: Vec<f32> = Vec::with_capacity(count);
            huge_pages(v.spare_capacity_mut());
            populate(&mut v.spare_capacity_mut()[..count]);
            let sum =
                self.read_exact_at(pos, uninit_bytes(&mut v.spare_capacity_mut()[..count]))?;
            // SAFETY: `read_exact_at` initialised all `count * 4` bytes
            // of the first `count` elements, and any bits are a valid f32.
            unsafe { v.set_len(count) };
            return Ok((v, 0, sum, None));
        }
        let len = n * self.record();
        let mut raw: Vec<u8> = Vec::with_capacity(len);
        populate(&mut raw.spare_capacity_mut()[..len]);
        let sum = self.read_exact_at(pos, &mut raw.spare_capacity_mut()[..len])?;
        // SAFETY: `read_exact_at` initialised the first `len` bytes.
        unsafe { raw.set_len(len) };
        let crc = crc_wanted.then(|| {
            let mut c = flate2::Crc::new();
            c.update(&raw);
            c
        });
        Ok((self.convert(first, &raw)?, 0, sum, crc))
    }

    /// The checks of a block's first read: a member's CRC-32 recorded
    /// (`crc`, or the float32 `values`' own bytes), every value finite.
    fn validate_first(
        &self,
        first: u64,
        n: usize,
        values: &[f32],
        crc: Option<flate2::Crc>,
    ) -> io::Result<()> {
        if let Some(m) = &self.member {
            let crc = match crc {
                Some(c) => c,
                None => {
                    // Float32 rows: the values are the file's bytes.
                    let v = &values[..n * self.dims];
                    // SAFETY: any f32 is 4 initialised bytes, and u8
                    // has no alignment; the slice outlives `bytes`.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 4) };
                    let mut c = flate2::Crc::new();
                    c.update(bytes);
                    c
                }
            };
            m.record(first, n as u64, crc)?;
        }
        if let Err(bad) = crate::npy::check_finite(values, self.dims, first) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                bad.at(&self.path),
            ));
        }
        Ok(())
    }

    /// Bytes `n` rows take in the file.
    pub(crate) fn bytes_of(&self, n: u64) -> u64 {
        n.saturating_mul(self.record() as u64)
    }

    /// Bytes [`read_rows`](Self::read_rows) asks of the device for `rows`:
    /// the whole pages under each row (a row of a few bytes costs a page).
    pub(crate) fn scattered_bytes(&self, rows: &[u64]) -> u64 {
        let (record, page) = (self.record() as u64, ALIGN as u64);
        rows.iter()
            .map(|&r| {
                let pos = self.offset + r * record;
                (pos + record).next_multiple_of(page) - pos / page * page
            })
            .sum()
    }

    /// Rows `rows` (each below the file's last) as float32, row-major, in
    /// the order given: scattered reads, many in flight, and no checksum
    /// kept (the rows are not a block a lineage reads again). Their values
    /// are checked to be finite, as a block's are at its first read. The
    /// bytes read count whole pages ([`scattered_bytes`](Self::scattered_bytes)).
    pub(crate) fn read_rows(&self, rows: &[u64]) -> io::Result<Vec<f32>> {
        if let Some(m) = &self.member {
            m.check()?;
        }
        let now = Stamp::of(&self.plain.metadata()?);
        if now != self.stamp {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} changed during the run (its size or modification time)",
                    self.path.display()
                ),
            ));
        }
        let record = self.record();
        let len = rows.len() * record;
        let starts: Vec<u64> = rows
            .iter()
            .map(|&r| self.offset + r * record as u64)
            .collect();
        let mut raw: Vec<u8> = Vec::with_capacity(len);
        let dst = &mut raw.spare_capacity_mut()[..len];
        let direct = self.direct.as_ref().filter(|_| record <= MAX_RECORD);
        let read = match direct {
            Some(f) => match self.with_reader(|r| r.read_records(f, &starts, record, dst)) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
                other => Some(other),
            },
            None => None,
        };
        match read {
            Some(r) => r.map_err(|e| self.explain(e))?,
            None => {
                dst.fill(MaybeUninit::new(0));
                // SAFETY: every byte was just initialised; `MaybeUninit<u8>`
                // and `u8` have the same layout.
                let bytes = unsafe { &mut *(dst as *mut [MaybeUninit<u8>] as *mut [u8]) };
                for (b, &at) in bytes.chunks_exact_mut(record).zip(&starts) {
                    self.plain
                        .read_exact_at(b, at)
                        .map_err(|e| self.explain(e))?;
                }
            }
        }
        // SAFETY: the first `len` bytes were initialised just above.
        unsafe { raw.set_len(len) };
        self.read_bytes
            .fetch_add(self.scattered_bytes(rows), Ordering::Relaxed);
        let mut out = Vec::with_capacity(rows.len() * self.dims);
        for (chunk, &r) in raw.chunks_exact(record.max(1)).zip(rows) {
            let at = out.len();
            self.convert_into(r, chunk, &mut out)?;
            if let Err(bad) = crate::npy::check_finite(&out[at..], self.dims, r) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    bad.at(&self.path),
                ));
            }
        }
        Ok(out)
    }

    /// Reads `count` float32 values at byte `pos` straight into a fresh
    /// vector's memory, from the start of `pos`'s page, and returns the
    /// vector, the elements before the first value, and the values'
    /// checksum. `None` where that is not done: no direct I/O, values
    /// that do not start on a 4-byte boundary of a page, blocks under
    /// 256 KiB, memory the allocator did not align to a page, or a
    /// filesystem that refuses the reads.
    fn in_place(&self, pos: u64, count: usize) -> io::Result<Option<(Vec<f32>, usize, u64)>> {
        let Some(direct) = &self.direct else {
            return Ok(None);
        };
        if self.in_place_refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let skip = (pos % ALIGN as u64) as usize;
        // Reading whole pages costs up to two pages more memory: kept for
        // blocks of 256 KiB and more, where that is under 3%.
        if !skip.is_multiple_of(4) || count * 4 < 64 * ALIGN {
            return Ok(None);
        }
        let need = skip + count * 4;
        let mut v: Vec<f32> = Vec::with_capacity(need.next_multiple_of(ALIGN) / 4);
        if !(v.as_ptr() as usize).is_multiple_of(ALIGN) {
            return Ok(None);
        }
        // Not populated first (as the copying path's blocks are): the
        // kernel faults the pages in as each piece is submitted, so the
        // faults of fresh memory overlap the reads of the pieces before.
        // Populating a whole block at once held the process's memory-map
        // lock (read) while the other prefetch thread's huge-page advice
        // waited for it (write), and the two threads faulted in turn: the
        // first epoch of 4 GiB under 1 GiB took 4.75-5.04 s populated,
        // 4.08-4.13 s not.
        huge_pages(v.spare_capacity_mut());
        match self.with_reader(|r| r.read_into(direct, pos - skip as u64, need, &mut v)) {
            Ok(()) => {}
            // The filesystem took the open but refuses the reads.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.in_place_refused.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            Err(e) => return Err(self.explain(e)),
        }
        let len = skip / 4 + count;
        // SAFETY: `read_into` initialised the first `need` bytes of the
        // spare capacity: the first `len` elements, and any bits are a
        // valid f32.
        unsafe { v.set_len(len) };
        let values = &v[skip / 4..];
        // SAFETY: the values' memory, viewed as the bytes it holds (f32 has
        // no padding; u8 has no alignment).
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
        };
        let sum = checksum(bytes);
        Ok(Some((v, skip / 4, sum)))
    }

    /// Runs `f` with one of the file's readers (made at its first use).
    ///
    /// A reader whose last user panicked is dropped and replaced: its
    /// state may be half updated, but no read is in flight into its
    /// buffers (the read-ahead engine waits for its reads before a panic
    /// unwinds past it).
    fn with_reader<R>(&self, f: impl FnOnce(&mut DirectReader) -> io::Result<R>) -> io::Result<R> {
        fn recover<'a>(
            p: std::sync::PoisonError<MutexGuard<'a, Option<DirectReader>>>,
        ) -> MutexGuard<'a, Option<DirectReader>> {
            let mut g = p.into_inner();
            g.take();
            g
        }
        let free = self.readers.iter().find_map(|r| match r.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(recover(p)),
            Err(TryLockError::WouldBlock) => None,
        });
        let mut kept = match free {
            Some(g) => g,
            None => self.readers[0].lock().unwrap_or_else(recover),
        };
        let reader = match &mut *kept {
            Some(r) => r,
            empty => empty.insert(DirectReader::new()?),
        };
        f(reader)
    }

    /// A read error, with the file named where it ended early.
    fn explain(&self, e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: shorter than its header says", self.path.display()),
            )
        } else {
            e
        }
    }

    fn changed(&self, first: u64, n: usize, why: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} changed during the run (rows {first}..{}: {why})",
                self.path.display(),
                first + n as u64
            ),
        )
    }

    fn convert(&self, first: u64, raw: &[u8]) -> io::Result<Vec<f32>> {
        let mut out = Vec::with_capacity(raw.len() / self.record() * self.dims);
        self.convert_into(first, raw, &mut out)?;
        Ok(out)
    }

    /// Appends the rows whose stored bytes are `raw` (the first is row
    /// `first`) to `out` as float32.
    fn convert_into(&self, first: u64, raw: &[u8], out: &mut Vec<f32>) -> io::Result<()> {
        let d = self.dims;
        match self.encoding {
            Encoding::Convert(s) => s.floats(raw, out),
            Encoding::Fvecs => {
                for (k, r) in raw.chunks_exact(self.record()).enumerate() {
                    let rd = i32::from_le_bytes([r[0], r[1], r[2], r[3]]);
                    if rd as usize != d {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{}: record {} has dimension {rd}, expected {d}",
                                self.path.display(),
                                first + k as u64
                            ),
                        ));
                    }
                    out.extend(
                        r[4..]
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    );
                }
            }
            Encoding::F32 => out.extend(
                raw.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
        Ok(())
    }

    /// Fills `dst` from the file at `pos`, and returns the checksum of its
    /// bytes: direct reads when possible, several in flight; plain reads
    /// otherwise.
    ///
    /// `dst` may be uninitialised (fresh memory is never zeroed first:
    /// zeroing would cost a pass, or page faults, over every block); it is
    /// fully initialised when this returns `Ok`.
    fn read_exact_at(&self, pos: u64, dst: &mut [MaybeUninit<u8>]) -> io::Result<u64> {
        let Some(direct) = &self.direct else {
            return self.plain_read(pos, dst);
        };
        match self.with_reader(|r| r.read(direct, pos, dst)) {
            Ok(sum) => Ok(sum),
            // The filesystem took the open but refuses the reads.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.plain_read(pos, dst),
            Err(e) => Err(self.explain(e)),
        }
    }

    /// Plain `pread`s into `dst` (zeroed first: the standard reader needs
    /// initialised memory; this path is for filesystems without direct
    /// I/O, where the page-cache copy costs more than the zeroing).
    fn plain_read(&self, pos: u64, dst: &mut [MaybeUninit<u8>]) -> io::Result<u64> {
        dst.fill(MaybeUninit::new(0));
        // SAFETY: every byte was just initialised; `MaybeUninit<u8>` and
        // `u8` have the same layout.
        let bytes = unsafe { &mut *(dst as *mut [MaybeUninit<u8>] as *mut [u8]) };
        self.plain.read_exact_at(bytes, pos)?;
        Ok(super::direct::checksum(bytes))
    }
}

#[cfg(test)]
mod tests;
