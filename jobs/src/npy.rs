//! `.npy` and `.npz` reading and `.npy` writing: 2-D (and 1-D) arrays of
//! float16, float32, float64, int32 and int64 in C order, little- or
//! big-endian.
//!
//! Headers are parsed by the `npyz` crate and `.npz` archives opened by
//! the `zip` crate; the data itself is converted here, a block at a time
//! (several times faster than an element iterator). The public part reads
//! and writes whole arrays ([`read_matrix`], [`write_array`]); the input
//! layer reads data and labels in row blocks through the same code, so a
//! file larger than memory streams through. Writes are atomic: a failed
//! write leaves no file.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::{open_input, AtomicFile};

/// Element types outcore reads (all of them) and writes (`F32`, `I32`,
/// `I64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// `<f2` (read only)
    F16,
    /// `<f4`
    F32,
    /// `<f8`
    F64,
    /// `<i4`
    I32,
    /// `<i8`
    I64,
}

impl Dtype {
    fn descr(self) -> &'static str {
        match self {
            Dtype::F16 => "<f2",
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
            Dtype::I32 => "<i4",
            Dtype::I64 => "<i8",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }
}

/// How an array's elements are stored: their type and byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Element type.
    pub(crate) dtype: Dtype,
    /// Big-endian (`>f4`) rather than little-endian.
    pub(crate) big: bool,
}

impl Stored {
    /// Little-endian float32: bytes that are already the values here.
    pub(crate) fn is_native_f32(self) -> bool {
        self.dtype == Dtype::F32 && !self.big
    }

    fn is_float(self) -> bool {
        matches!(self.dtype, Dtype::F16 | Dtype::F32 | Dtype::F64)
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        self.dtype.size()
    }

    /// The numpy type string (`<f4`, `>f2`).
    fn descr(self) -> String {
        let d = self.dtype.descr();
        if self.big {
            format!(">{}", &d[1..])
        } else {
            d.to_string()
        }
    }

    /// Appends the float values held in `raw` to `out` as `f32` (float64
    /// rounded to nearest, float16 exactly).
    pub(crate) fn floats(self, raw: &[u8], out: &mut Vec<f32>) {
        let big = self.big;
        match self.dtype {
            Dtype::F16 => out.extend(raw.chunks_exact(2).map(|b| {
                let v = if big { [b[1], b[0]] } else { [b[0], b[1]] };
                f16_to_f32(u16::from_le_bytes(v))
            })),
            Dtype::F32 if big => out.extend(
                raw.chunks_exact(4)
                    .map(|b| f32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Dtype::F32 => out.extend(
                raw.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            Dtype::F64 => out.extend(raw.chunks_exact(8).map(|b| {
                let a = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
                (if big {
                    f64::from_be_bytes(a)
                } else {
                    f64::from_le_bytes(a)
                }) as f32
            })),
            Dtype::I32 | Dtype::I64 => out.extend(self.ints(raw).map(|v| v as f32)),
        }
    }

    /// The integer values held in `raw`.
    fn ints(self, raw: &[u8]) -> impl Iterator<Item = i64> + '_ {
        let (size, big) = (self.size(), self.big);
        raw.chunks_exact(size).map(move |b| match (size, big) {
            (4, false) => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            (4, true) => i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            (_, false) => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            (_, true) => i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        })
    }
}

/// An IEEE half-precision value as `f32` (exact: every float16 is a
/// float32).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    match exp {
        // Zero and subnormals: man * 2^-24, exact in f32.
        0 => {
            let v = man as f32 * (1.0 / 16_777_216.0);
            f32::from_bits(v.to_bits() | sign)
        }
        // Infinities and NaNs (payload kept).
        31 => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// The parsed header of a `.npy` array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Element type and byte order.
    pub(crate) stored: Stored,
    /// Shape (one or two dimensions).
    pub(crate) shape: Vec<u64>,
    /// Offset of the data from the start of the array's bytes.
    pub(crate) data_offset: u64,
}

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::Input(format!("{}: {}", path.display(), msg.into()))
}

/// A reader that counts the bytes taken from it.
struct Counted<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n += k as u64;
        Ok(k)
    }
}

/// Parses a `.npy` header from the start of `r` (which is left at the
/// first data byte). `path` names the array in errors.
pub(crate) fn read_header(path: &Path, r: &mut impl Read) -> Result<Header> {
    // The magic is checked here first, for a clearer error than the
    // parser's on files that are not `.npy` at all.
    let mut magic = [0u8; 6];
    let mut got = 0;
    while got < magic.len() {
        match r.read(&mut magic[got..]) {
            Ok(0) => return Err(bad(path, "not a .npy file (too short for the header)")),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(bad(path, format!("read failed: {e}"))),
        }
    }
    if &magic != b"\x93NUMPY" {
        return Err(bad(path, "not a .npy file (bad magic)"));
    }
    let mut counted = Counted {
        inner: (&magic[..]).chain(r),
        n: 0,
    };
    let h = npyz::NpyHeader::from_reader(&mut counted).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            bad(path, "truncated .npy header")
        } else {
            bad(
                path,
                format!("malformed .npy header: {}", one_line(&e.to_string())),
            )
        }
    })?;
    let unsupported = |what: String| {
        bad(
            path,
            format!(
                "unsupported dtype '{what}' (outcore reads data as float16, float32 or float64, and labels as int32 or int64, either byte order)"
            ),
        )
    };
    let npyz::DType::Plain(ts) = h.dtype() else {
        return Err(unsupported(h.dtype().descr()));
    };
    let big = match ts.endianness() {
        npyz::Endianness::Big => true,
        npyz::Endianness::Little => false,
        npyz::Endianness::Irrelevant => return Err(unsupported(ts.to_string())),
    };
    let dtype = match (ts.type_char(), ts.size_field()) {
        (npyz::TypeChar::Float, 2) => Dtype::F16,
        (npyz::TypeChar::Float, 4) => Dtype::F32,
        (npyz::TypeChar::Float, 8) => Dtype::F64,
        (npyz::TypeChar::Int, 4) => Dtype::I32,
        (npyz::TypeChar::Int, 8) => Dtype::I64,
        _ => return Err(unsupported(ts.to_string())),
    };
    if h.order() == npyz::Order::Fortran && h.shape().len() > 1 {
        return Err(bad(
            path,
            "array is in Fortran order; save it in C order (np.ascontiguousarray)",
        ));
    }
    Ok(Header {
        stored: Stored { dtype, big },
        shape: h.shape().to_vec(),
        data_offset: counted.n,
    })
}

/// The header parser's message in one line: its multi-line syntax error
/// (`... syntax error:  --> 1:11`, the text with a caret, `= expected
/// value`) becomes `... syntax error at column 11 (expected value) in
/// "<the header>"`.
fn one_line(msg: &str) -> String {
    let mut lines = msg.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(first) = lines.next() else {
        return String::new();
    };
    let rest: Vec<&str> = lines.collect();
    if rest.is_empty() {
        return first.to_string();
    }
    let (what, at) = match first.split_once("-->") {
        Some((w, a)) => (w.trim().trim_end_matches(':'), a.trim()),
        None => (first, ""),
    };
    let mut out = what.to_string();
    if let Some((_, col)) = at.split_once(':') {
        out.push_str(&format!(" at column {col}"));
    }
    if let Some(e) = rest.iter().find_map(|l| l.strip_prefix("= ")) {
        out.push_str(&format!(" ({e})"));
    }
    // The header's text: the numbered line (`1 | {...}`).
    if let Some(text) = rest
        .iter()
        .find_map(|l| {
            l.split_once(" | ")
                .filter(|(n, _)| n.trim().parse::<u32>().is_ok())
        })
        .map(|(_, t)| t.trim())
    {
        let cut: String = text.chars().take(120).collect();
        out.push_str(&format!(" in {cut:?}"));
    }
    out
}

/// A reader of an array's data, from its first byte on.
struct Stream(Box<dyn Read + Send>);

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stream")
    }
}

/// An array opened for reading: a `.npy` file or a member of a `.npz`
/// archive.
#[derive(Debug)]
struct Array {
    /// The file (the archive, for a member).
    file: PathBuf,
    /// The array in messages: the file, or `archive.npz[name]`.
    label: PathBuf,
    /// The data, from its first byte.
    stream: Stream,
    header: Header,
    /// Bytes the array's `.npy` image holds (header and data).
    total: u64,
    /// Where the data starts in the file, when it is stored as is (a
    /// `.npy` file, an uncompressed `.npz` member): it can then be read at
    /// any position.
    at: Option<u64>,
    /// For an uncompressed `.npz` member, its CRC-32 and where it lies, to
    /// check the blocks read by position against.
    member: Option<MemberCrc>,
}

/// A stored (uncompressed) `.npz` member's CRC-32 as its archive records
/// it, and where the member's bytes (its `.npy` image) lie in the file.
/// Read in order, a member is checked as its last byte is read
/// ([`CrcRead`]); read by position in blocks, when the blocks have covered
/// all of it (`input::region`).
#[derive(Clone, Debug)]
pub(crate) struct MemberCrc {
    /// The member in messages (`archive.npz[name]`).
    pub(crate) label: PathBuf,
    /// The CRC-32 recorded in the archive.
    pub(crate) expected: u32,
    /// Offset of the member's first byte in the file.
    pub(crate) start: u64,
    /// The member's length in bytes.
    pub(crate) len: u64,
}

/// The error of a member whose bytes do not give the CRC-32 its archive
/// records (the message does not name it; the caller does).
pub(crate) fn crc_mismatch(expected: u32, got: u32) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "bad CRC-32 (the archive records {expected:08x}, the member's bytes give {got:08x}): the archive is corrupt"
        ),
    )
}

/// A `.npz` member's bytes read in order, checked against the CRC-32 its
/// archive records when the last of its `left` bytes is read: a mismatch
/// fails that read.
struct CrcRead {
    inner: Box<dyn Read + Send>,
    crc: flate2::Crc,
    left: u64,
    expected: u32,
}

impl Read for CrcRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = self.left.min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.inner.read(&mut buf[..want])?;
        self.crc.update(&buf[..n]);
        self.left -= n as u64;
        if self.left == 0 && self.crc.sum() != self.expected {
            return Err(crc_mismatch(self.expected, self.crc.sum()));
        }
        Ok(n)
    }
}

/// Whether `path` names a `.npz` archive (by its name, or by its first
/// bytes under another name).
fn is_npz(path: &Path) -> bool {
    crate::files::format_of(path) == "npz"
}

/// Opens the array at `path`: a `.npy` file, or the member `key` of a
/// `.npz` archive (`key` or `key.npy`; by default its only or first
/// array).
fn open_array(path: &Path, key: Option<&str>) -> Result<Array> {
    if is_npz(path) {
        return open_member(path, key);
    }
    let (file, total) = open_input(path)?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let header = read_header(path, &mut reader)?;
    Ok(Array {
        file: path.to_path_buf(),
        label: path.to_path_buf(),
        at: Some(header.data_offset),
        stream: Stream(Box::new(reader)),
        header,
        total,
        member: None,
    })
}

/// The index of the member named `key` (with or without `.npy`) among
/// an archive's `names`; the first without a key.
fn member_index(path: &Path, names: &[String], key: Option<&str>) -> Result<usize> {
    match key {
        None if names.is_empty() => Err(bad(path, "the archive holds no array")),
        None => Ok(0),
        Some(k) => names
            .iter()
            .position(|n| n == k || n.strip_suffix(".npy") == Some(k))
            .ok_or_else(|| {
                let all: Vec<&str> = names
                    .iter()
                    .map(|n| n.strip_suffix(".npy").unwrap_or(n))
                    .collect();
                bad(
                    path,
                    format!("no array named '{k}' (it holds: {})", all.join(", ")),
                )
            }),
    }
}

fn open_member(path: &Path, key: Option<&str>) -> Result<Array> {
    let (file, _) = open_input(path)?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| bad(path, format!("not a readable .npz archive ({e})")))?;
    let mut names = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let m = zip
            .by_index_raw(i)
            .map_err(|e| bad(path, format!("unreadable archive member {i} ({e})")))?;
        names.push(m.name().map(|n| n.into_owned()).unwrap_or_default());
    }
    let index = member_index(path, &names, key)?;
    let shown = names[index].strip_suffix(".npy").unwrap_or(&names[index]);
    let label = PathBuf::from(format!("{}[{shown}]", path.display()));
    let m = zip
        .by_index_raw(index)
        .map_err(|e| bad(&label, format!("unreadable archive member ({e})")))?;
    let start = m
        .data_start()
        .ok_or_else(|| bad(&label, "unreadable archive member"))?;
    let (method, packed, total, crc) = (m.compression(), m.compressed_size(), m.size(), m.crc32());
    drop(m);
    let (mut file, _) = open_input(path)?;
    file.seek(SeekFrom::Start(start))
        .map_err(|e| Error::io(path, "cannot seek", e))?;
    let body = BufReader::with_capacity(1 << 20, file).take(packed);
    let (stream, stored): (Box<dyn Read + Send>, bool) = match method {
        zip::CompressionMethod::Stored => (Box::new(body), true),
        zip::CompressionMethod::Deflated => {
            (Box::new(flate2::read::DeflateDecoder::new(body)), false)
        }
        other => {
            return Err(bad(
                &label,
                format!("compressed with {other:?}; outcore reads stored or deflated members (np.savez, np.savez_compressed)"),
            ))
        }
    };
    // The member's bytes, checked against its CRC-32 as they are read.
    let mut stream: Box<dyn Read + Send> = Box::new(CrcRead {
        inner: stream,
        crc: flate2::Crc::new(),
        left: total,
        expected: crc,
    });
    let header = read_header(&label, &mut stream)?;
    Ok(Array {
        file: path.to_path_buf(),
        at: stored.then_some(start + header.data_offset),
        member: stored.then(|| MemberCrc {
            label: label.clone(),
            expected: crc,
            start,
            len: total,
        }),
        label,
        stream: Stream(stream),
        header,
        total,
    })
}

/// Checks that an array of `total` bytes holds the `elems` elements its
/// header promises (`None`: a count that overflowed).
fn check_length(path: &Path, total: u64, h: &Header, elems: Option<u64>) -> Result<()> {
    let need = elems
        .and_then(|n| n.checked_mul(h.stored.size() as u64))
        .and_then(|n| n.checked_add(h.data_offset))
        .ok_or_else(|| bad(path, "shape too large"))?;
    if total < need {
        return Err(bad(
            path,
            format!("truncated: {total} bytes, the header promises {need}"),
        ));
    }
    Ok(())
}

/// A 2-D float array in a `.npy` file or `.npz` member, read in blocks of
/// rows as `f32`.
#[derive(Debug)]
pub(crate) struct NpyRows {
    file: PathBuf,
    label: PathBuf,
    stream: Stream,
    stored: Stored,
    at: Option<u64>,
    member: Option<MemberCrc>,
    rows: u64,
    cols: usize,
    done: u64,
    buf: Vec<u8>,
}

impl NpyRows {
    /// Opens `path` (for a `.npz`, its array `key`), checks it is a 2-D
    /// float C-order array and that the file holds all of its data.
    pub(crate) fn open(path: &Path, key: Option<&str>) -> Result<NpyRows> {
        let a = open_array(path, key)?;
        let h = &a.header;
        if !h.stored.is_float() {
            return Err(bad(
                &a.label,
                format!(
                    "data must be float32 or float64 (or float16), not {}",
                    h.stored.descr()
                ),
            ));
        }
        if h.shape.len() != 2 {
            return Err(bad(
                &a.label,
                format!("data must be a 2-D array, this one has shape {:?}", h.shape),
            ));
        }
        let (rows, cols) = (h.shape[0], h.shape[1]);
        if cols == 0 {
            return Err(bad(&a.label, "data has 0 columns"));
        }
        check_length(&a.label, a.total, h, rows.checked_mul(cols))?;
        Ok(NpyRows {
            stored: h.stored,
            file: a.file,
            label: a.label,
            stream: a.stream,
            at: a.at,
            member: a.member,
            rows,
            cols: cols as usize,
            done: 0,
            buf: Vec::new(),
        })
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> u64 {
        self.rows
    }

    /// The array in messages (`x.npy`, `x.npz[key]`).
    pub(crate) fn label(&self) -> &Path {
        &self.label
    }

    /// The file, where the data starts in it and how it is stored, when
    /// rows can be read at any position (not in a compressed member).
    pub(crate) fn layout(&self) -> Option<(&Path, u64, Stored)> {
        self.at.map(|at| (self.file.as_path(), at, self.stored))
    }

    /// For an uncompressed `.npz` member, its CRC-32 and where it lies.
    pub(crate) fn member(&self) -> Option<&MemberCrc> {
        self.member.as_ref()
    }

    /// Number of columns.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Appends the next `n` rows to `out` as `f32`.
    pub(crate) fn read_rows(&mut self, n: usize, out: &mut Vec<f32>) -> Result<()> {
        if self.done + n as u64 > self.rows {
            return Err(bad(&self.label, "read past the last row"));
        }
        let count = n * self.cols;
        self.buf.resize(count * self.stored.size(), 0);
        let failed = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::InvalidData => bad(&self.label, e.to_string()),
            _ => bad(&self.label, format!("read failed: {e}")),
        };
        self.stream.0.read_exact(&mut self.buf).map_err(failed)?;
        if self.done + n as u64 == self.rows {
            // The member's last bytes (after its data, if any), for its
            // CRC-32 to be checked.
            std::io::copy(&mut self.stream.0, &mut std::io::sink()).map_err(failed)?;
        }
        self.stored.floats(&self.buf, out);
        self.done += n as u64;
        Ok(())
    }
}

/// A 1-D array stored as is in a `.npy` file (or an uncompressed `.npz`
/// member), read at any position.
#[derive(Debug)]
struct Vector {
    file: PathBuf,
    label: PathBuf,
    handle: File,
    stored: Stored,
    len: u64,
    at: u64,
}

impl Vector {
    /// Opens `path`, checks it is a 1-D array held in full whose type
    /// `ok` accepts (`what` names the accepted types in errors).
    fn open(path: &Path, ok: fn(Stored) -> bool, what: &str, role: &str) -> Result<Vector> {
        let a = open_array(path, None)?;
        let h = &a.header;
        if !ok(h.stored) {
            return Err(bad(
                &a.label,
                format!("{role} must be {what}, not {}", h.stored.descr()),
            ));
        }
        if h.shape.len() != 1 {
            return Err(bad(
                &a.label,
                format!(
                    "{role} must be a 1-D array, this one has shape {:?}",
                    h.shape
                ),
            ));
        }
        let len = h.shape[0];
        check_length(&a.label, a.total, h, Some(len))?;
        let at = a.at.ok_or_else(|| {
            bad(
                &a.label,
                "is compressed; save it with np.save or np.savez (uncompressed)",
            )
        })?;
        let (handle, _) = open_input(&a.file)?;
        Ok(Vector {
            file: a.file,
            label: a.label,
            handle,
            stored: h.stored,
            len,
            at,
        })
    }

    /// The raw bytes of values `first..first + n`. Positioned reads: any
    /// thread, any order.
    fn bytes(&self, first: u64, n: usize) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let size = self.stored.size();
        let mut bytes = vec![0u8; n * size];
        self.handle
            .read_exact_at(&mut bytes, self.at + first * size as u64)
            .map_err(|e| bad(&self.label, format!("read failed: {e}")))?;
        Ok(bytes)
    }
}

/// A 1-D integer array (`int32` or `int64`) in a `.npy` file, read in
/// blocks as `u32` labels.
#[derive(Debug)]
pub(crate) struct NpyInts {
    v: Vector,
    pos: u64,
}

impl NpyInts {
    /// Opens `path`, checks it is a 1-D int32/int64 array held in full.
    pub(crate) fn open(path: &Path) -> Result<NpyInts> {
        let v = Vector::open(
            path,
            |s| matches!(s.dtype, Dtype::I32 | Dtype::I64),
            "int32 or int64",
            "labels",
        )?;
        Ok(NpyInts { v, pos: 0 })
    }

    /// Number of labels.
    pub(crate) fn len(&self) -> u64 {
        self.v.len
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.v.file
    }

    /// Reads the next `n` labels; negative or huge values are errors.
    pub(crate) fn read(&mut self, n: usize) -> Result<Vec<u32>> {
        let (v, _) = self.read_at(self.pos, n)?;
        self.pos += n as u64;
        Ok(v)
    }

    /// Reads labels `first..first + n` wherever the stream is (positioned
    /// reads: any thread, any order), with the raw bytes for a checksum.
    pub(crate) fn read_at(&self, first: u64, n: usize) -> Result<(Vec<u32>, Vec<u8>)> {
        let bytes = self.v.bytes(first, n)?;
        let vals = self
            .v
            .stored
            .ints(&bytes)
            .map(|v| {
                u32::try_from(v)
                    .ok()
                    .filter(|&u| u < 1 << 24)
                    .ok_or_else(|| {
                        bad(
                            &self.v.label,
                            format!("label {v} is not a class index (0 .. 16777215)"),
                        )
                    })
            })
            .collect::<Result<Vec<u32>>>()?;
        Ok((vals, bytes))
    }
}

/// A 1-D float array in a `.npy` file (such as one sample weight per
/// row), read at any position as `f32`.
#[derive(Debug)]
pub(crate) struct NpyVector {
    v: Vector,
}

impl NpyVector {
    /// Opens `path`, checks it is a 1-D float array held in full.
    pub(crate) fn open(path: &Path) -> Result<NpyVector> {
        let v = Vector::open(path, Stored::is_float, "float32 or float64", "it")?;
        Ok(NpyVector { v })
    }

    /// Number of values.
    pub(crate) fn len(&self) -> u64 {
        self.v.len
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.v.file
    }

    /// Values `first..first + n` as `f32` (float64 is rounded, as
    /// scikit-learn casts sample weights to the data's float32), with the
    /// raw bytes for a checksum. Positioned reads: any thread, any order.
    pub(crate) fn read_at(&self, first: u64, n: usize) -> Result<(Vec<f32>, Vec<u8>)> {
        let bytes = self.v.bytes(first, n)?;
        let mut v = Vec::with_capacity(n);
        self.v.stored.floats(&bytes, &mut v);
        Ok((v, bytes))
    }
}

/// Reads a whole (small) 2-D float32/float64 array as `f32`: the values,
/// the rows and the columns. An array without rows or columns (centres or
/// a model of nothing) is an error.
pub fn read_matrix(path: &Path) -> Result<(Vec<f32>, usize, usize)> {
    let mut r = NpyRows::open(path, None)?;
    let (rows, cols) = (r.rows() as usize, r.cols());
    if rows == 0 || cols == 0 {
        return Err(bad(path, format!("the array is empty ({rows} x {cols})")));
    }
    let mut out = Vec::with_capacity(rows * cols);
    r.read_rows(rows, &mut out)?;
    check_finite(&out, cols, 0).map_err(|e| bad(path, e))?;
    Ok((out, rows, cols))
}

/// Checks that every value of the row-major block `x` (`dims` columns,
/// its first row being row `first_row` of the data) is finite and that
/// its square is too (magnitudes up to about 1.8e19): the distances and
/// norms the jobs compute in float32 square the values, and values near
/// 1e20 made every distance infinite and put every point in one cluster,
/// silently. Otherwise names the first bad row and column. One pass in 16
/// independent lanes (`v * v * 0` is 0 when `v * v` is finite, NaN
/// otherwise), then a row-by-row search only when the block fails.
pub(crate) fn check_finite(
    x: &[f32],
    dims: usize,
    first_row: u64,
) -> std::result::Result<(), String> {
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            // 0 when the square is finite; NaN for NaN, the infinities
            // and values whose square overflows.
            *a += v * v * 0.0;
        }
    }
    let mut ok = acc.iter().all(|a| *a == 0.0);
    for v in tail {
        ok &= (v * v).is_finite();
    }
    if ok {
        return Ok(());
    }
    let dims = dims.max(1);
    let Some(i) = x.iter().position(|v| !(v * v).is_finite()) else {
        return Ok(());
    };
    let (row, col, v) = (first_row + (i / dims) as u64, i % dims, x[i]);
    Err(if v.is_finite() {
        format!(
            "row {row}, column {col} is {v:e}, too large: its square overflows float32 (values must be below about 1.8e19 in magnitude; scale the data)"
        )
    } else {
        format!(
            "row {row}, column {col} is {} (the data must be finite)",
            if v.is_nan() { "NaN" } else { "infinite" }
        )
    })
}

/// Elements that can be written to `.npy`.
pub trait Element: Copy {
    /// The dtype written.
    const DTYPE: Dtype;
    /// Little-endian bytes.
    fn put(self, out: &mut Vec<u8>);
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for i32 {
    const DTYPE: Dtype = Dtype::I32;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Element for i64 {
    const DTYPE: Dtype = Dtype::I64;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

/// The 10-byte preamble plus header text for `shape`, padded to a multiple
/// of 64 bytes as numpy does.
fn header_bytes(dtype: Dtype, shape: &[u64]) -> Vec<u8> {
    let shape_s = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut text = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_s}, }}",
        dtype.descr()
    );
    let total = 10 + text.len() + 1;
    text.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    text.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// Writes a `.npy` array piece by piece, for outputs too large to hold
/// (such as one label per row of a large input). The file is written
/// atomically: until [`NpyWriter::finish`] it is a temporary file next to
/// the target, removed if the writer is dropped, so a failed or
/// interrupted write never leaves a file that looks valid.
#[derive(Debug)]
pub struct NpyWriter<T: Element> {
    out: AtomicFile,
    expect: u64,
    written: u64,
    scratch: Vec<u8>,
    _t: std::marker::PhantomData<T>,
}

impl<T: Element> NpyWriter<T> {
    /// Starts writing an array of `shape` to `path`.
    pub fn create(path: &Path, shape: &[u64]) -> Result<NpyWriter<T>> {
        let mut out = AtomicFile::create(path)?;
        out.write_all(&header_bytes(T::DTYPE, shape))?;
        Ok(NpyWriter {
            out,
            expect: shape.iter().product(),
            written: 0,
            scratch: Vec::new(),
            _t: std::marker::PhantomData,
        })
    }

    /// Appends elements.
    pub fn write(&mut self, items: &[T]) -> Result<()> {
        self.scratch.clear();
        for &x in items {
            x.put(&mut self.scratch);
        }
        self.out.write_all(&self.scratch)?;
        self.written += items.len() as u64;
        Ok(())
    }

    /// Checks every element was written and moves the file into place.
    pub fn finish(self) -> Result<()> {
        if self.written != self.expect {
            return Err(Error::Output {
                path: self.out.path().to_path_buf(),
                reason: format!(
                    "cannot write: wrote {} elements, expected {}",
                    self.written, self.expect
                ),
            });
        }
        self.out.commit()
    }
}

/// Writes a whole array.
pub fn write_array<T: Element>(path: &Path, shape: &[u64], data: &[T]) -> Result<()> {
    let mut w = NpyWriter::<T>::create(path, shape)?;
    w.write(data)?;
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_f32() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.npy");
        let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        write_array(&p, &[3, 4], &data).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!((bytes.len() - 48) % 64, 0, "header padded to 64 bytes");
        let (got, r, c) = read_matrix(&p).unwrap();
        assert_eq!((r, c), (3, 4));
        assert_eq!(got, data);
    }

    #[test]
    fn reads_blocks_and_f64() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.npy");
        let mut raw = header_bytes(Dtype::F64, &[5, 2]);
        for i in 0..10 {
            raw.extend_from_slice(&(i as f64).to_le_bytes());
        }
        std::fs::write(&p, raw).unwrap();
        let mut r = NpyRows::open(&p, None).unwrap();
        let mut out = Vec::new();
        r.read_rows(2, &mut out).unwrap();
        r.read_rows(3, &mut out).unwrap();
        assert_eq!(out, (0..10).map(|i| i as f32).collect::<Vec<_>>());
        assert!(r.read_rows(1, &mut out).is_err());
    }

    #[test]
    fn rejects_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.npy");
        let check = |bytes: Vec<u8>, want: &str| {
            std::fs::write(&p, bytes).unwrap();
            let e = NpyRows::open(&p, None)
                .expect_err("should fail")
                .to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        };
        check(b"hello".to_vec(), "too short");
        check(b"not a numpy file at all".to_vec(), "bad magic");
        let mut t = header_bytes(Dtype::F32, &[4, 4]);
        t.extend_from_slice(&[0u8; 20]);
        check(t, "truncated");
        check(header_bytes(Dtype::I32, &[2, 2]), "float32 or float64");
        check(header_bytes(Dtype::F32, &[8]), "2-D");
        // Byte-level substitution: the magic is not UTF-8.
        let replace = |mut b: Vec<u8>, from: &[u8], to: &[u8]| {
            let at = b
                .windows(from.len())
                .position(|w| w == from)
                .expect("pattern");
            b[at..at + from.len()].copy_from_slice(to);
            b
        };
        let mut f = replace(header_bytes(Dtype::F32, &[1, 1]), b"False", b"True ");
        f.extend_from_slice(&[0u8; 4]);
        check(f, "Fortran");
        let mut be = replace(header_bytes(Dtype::F32, &[1, 1]), b"<f4", b">c8");
        be.extend_from_slice(&[0u8; 8]);
        check(be, "unsupported dtype '>c8'");
    }

    #[test]
    fn reads_big_endian_and_float16() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.npy");
        let vals = [1.5f32, -2.0, 65504.0, 6.103_515_6e-5];
        let write = |descr: &[u8], bytes: Vec<u8>| {
            let mut raw = header_bytes(Dtype::F32, &[2, 2]);
            let at = raw.windows(3).position(|w| w == b"<f4").unwrap();
            raw[at..at + 3].copy_from_slice(descr);
            raw.extend_from_slice(&bytes);
            std::fs::write(&p, raw).unwrap();
            read_matrix(&p).unwrap()
        };
        let be4: Vec<u8> = vals.iter().flat_map(|v| v.to_be_bytes()).collect();
        assert_eq!(write(b">f4", be4), (vals.to_vec(), 2, 2));
        let be8: Vec<u8> = vals
            .iter()
            .flat_map(|v| f64::from(*v).to_be_bytes())
            .collect();
        assert_eq!(write(b">f8", be8), (vals.to_vec(), 2, 2));
        // 1.5, -2, the largest half, the smallest normal half.
        let h: [u16; 4] = [0x3e00, 0xc000, 0x7bff, 0x0400];
        let le: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(write(b"<f2", le), (vals.to_vec(), 2, 2));
        let be: Vec<u8> = h.iter().flat_map(|v| v.to_be_bytes()).collect();
        assert_eq!(write(b">f2", be), (vals.to_vec(), 2, 2));
    }

    #[test]
    fn float16_special_values() {
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x83ff), -1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        // Every finite half round-trips through f32 exactly: the gaps
        // between consecutive halves are preserved.
        for h in 0u16..0x7bff {
            let (a, b) = (f16_to_f32(h), f16_to_f32(h + 1));
            assert!(b > a, "{h:#x}");
        }
    }

    #[test]
    fn an_unfinished_writer_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.npy");
        let mut w = NpyWriter::<f32>::create(&p, &[2, 2]).unwrap();
        w.write(&[1.0, 2.0]).unwrap();
        drop(w);
        assert!(!p.exists());
        let mut w = NpyWriter::<f32>::create(&p, &[2, 2]).unwrap();
        w.write(&[1.0, 2.0]).unwrap();
        assert!(w.finish().is_err());
        assert!(!p.exists());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "temporary file removed"
        );
    }
}
