//! Minimal `.npy` reading and writing: 2-D (and 1-D) little-endian arrays
//! of `f32`, `f64`, `i32` and `i64` in C order.
//!
//! The public part reads and writes whole arrays ([`read_matrix`],
//! [`write_array`]); the input layer reads data and labels in row blocks
//! through the same header parser, so a file larger than memory streams
//! through. Writes are atomic: a failed write leaves no file.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::{open_input, AtomicFile};

/// Element types outcore reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
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
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
            Dtype::I32 => "<i4",
            Dtype::I64 => "<i8",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }
}

/// The parsed header of a `.npy` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Element type.
    pub(crate) dtype: Dtype,
    /// Shape (one or two dimensions).
    pub(crate) shape: Vec<u64>,
    /// Offset of the data from the start of the file.
    pub(crate) data_offset: u64,
}

fn bad(path: &Path, msg: impl Into<String>) -> Error {
    Error::Input(format!("{}: {}", path.display(), msg.into()))
}

/// Parses a `.npy` header from the start of `r`.
pub(crate) fn read_header(path: &Path, r: &mut impl Read) -> Result<Header> {
    let mut pre = [0u8; 10];
    r.read_exact(&mut pre)
        .map_err(|_| bad(path, "not a .npy file (too short for the header)"))?;
    if &pre[0..6] != b"\x93NUMPY" {
        return Err(bad(path, "not a .npy file (bad magic)"));
    }
    let (hlen, offset) = match pre[6] {
        1 => (u16::from_le_bytes([pre[8], pre[9]]) as usize, 10usize),
        2 | 3 => {
            let mut more = [0u8; 2];
            r.read_exact(&mut more)
                .map_err(|_| bad(path, "truncated .npy header"))?;
            (
                u32::from_le_bytes([pre[8], pre[9], more[0], more[1]]) as usize,
                12usize,
            )
        }
        v => return Err(bad(path, format!("unsupported .npy format version {v}"))),
    };
    if hlen > 1 << 20 {
        return Err(bad(path, "implausibly long .npy header"));
    }
    let mut h = vec![0u8; hlen];
    r.read_exact(&mut h)
        .map_err(|_| bad(path, "truncated .npy header"))?;
    let text = String::from_utf8_lossy(&h);
    let field = |key: &str| -> Option<String> {
        let start = text.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = text[start..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest.to_string())
    };
    let descr = field("descr").ok_or_else(|| bad(path, "malformed .npy header (no descr)"))?;
    let descr = descr.trim_start_matches('\'');
    let descr = &descr[..descr.find('\'').unwrap_or(0)];
    let dtype = match descr {
        "<f4" | "=f4" => Dtype::F32,
        "<f8" | "=f8" => Dtype::F64,
        "<i4" | "=i4" => Dtype::I32,
        "<i8" | "=i8" => Dtype::I64,
        other => {
            return Err(bad(
                path,
                format!("unsupported dtype '{other}' (outcore reads little-endian float32, float64, int32, int64)"),
            ))
        }
    };
    let fortran = field("fortran_order")
        .ok_or_else(|| bad(path, "malformed .npy header (no fortran_order)"))?;
    if fortran.starts_with("True") {
        return Err(bad(
            path,
            "array is in Fortran order; save it in C order (np.ascontiguousarray)",
        ));
    }
    let shape_s = field("shape").ok_or_else(|| bad(path, "malformed .npy header (no shape)"))?;
    let inner = shape_s
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad(path, "malformed .npy header (shape)"))?;
    let mut shape = Vec::new();
    for part in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        shape.push(
            part.parse::<u64>()
                .map_err(|_| bad(path, format!("malformed shape entry '{part}'")))?,
        );
    }
    Ok(Header {
        dtype,
        shape,
        data_offset: (offset + hlen) as u64,
    })
}

/// A 2-D float array in a `.npy` file, read in blocks of rows as `f32`.
#[derive(Debug)]
pub(crate) struct NpyRows {
    path: PathBuf,
    reader: BufReader<File>,
    dtype: Dtype,
    data_offset: u64,
    rows: u64,
    cols: usize,
    done: u64,
    buf: Vec<u8>,
}

/// Opens a `.npy` file for reading: its reader (positioned after the
/// header), its length and its header.
fn open_with_header(path: &Path) -> Result<(BufReader<File>, u64, Header)> {
    let (file, len) = open_input(path)?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let h = read_header(path, &mut reader)?;
    Ok((reader, len, h))
}

/// Checks that a file of `len` bytes holds the `elems` elements its header
/// promises (`None`: a count that overflowed).
fn check_length(path: &Path, len: u64, h: &Header, elems: Option<u64>) -> Result<()> {
    let need = elems
        .and_then(|n| n.checked_mul(h.dtype.size() as u64))
        .and_then(|n| n.checked_add(h.data_offset))
        .ok_or_else(|| bad(path, "shape too large"))?;
    if len < need {
        return Err(bad(
            path,
            format!("truncated: {len} bytes, the header promises {need}"),
        ));
    }
    Ok(())
}

impl NpyRows {
    /// Opens `path`, checks it is a 2-D float32/float64 C-order array and
    /// that the file holds all of its data.
    pub(crate) fn open(path: &Path) -> Result<NpyRows> {
        let (reader, len, h) = open_with_header(path)?;
        if !matches!(h.dtype, Dtype::F32 | Dtype::F64) {
            return Err(bad(
                path,
                format!("data must be float32 or float64, not {}", h.dtype.descr()),
            ));
        }
        if h.shape.len() != 2 {
            return Err(bad(
                path,
                format!("data must be a 2-D array, this one has shape {:?}", h.shape),
            ));
        }
        let (rows, cols) = (h.shape[0], h.shape[1]);
        if cols == 0 {
            return Err(bad(path, "data has 0 columns"));
        }
        check_length(path, len, &h, rows.checked_mul(cols))?;
        Ok(NpyRows {
            path: path.to_path_buf(),
            reader,
            dtype: h.dtype,
            data_offset: h.data_offset,
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

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Where the data starts in the file, and its element type.
    pub(crate) fn layout(&self) -> (u64, Dtype) {
        (self.data_offset, self.dtype)
    }

    /// Number of columns.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Appends the next `n` rows to `out` as `f32`.
    pub(crate) fn read_rows(&mut self, n: usize, out: &mut Vec<f32>) -> Result<()> {
        if self.done + n as u64 > self.rows {
            return Err(bad(&self.path, "read past the last row"));
        }
        let count = n * self.cols;
        self.buf.resize(count * self.dtype.size(), 0);
        self.reader
            .read_exact(&mut self.buf)
            .map_err(|e| bad(&self.path, format!("read failed: {e}")))?;
        match self.dtype {
            Dtype::F32 => out.extend(
                self.buf
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            _ => out.extend(self.buf.chunks_exact(8).map(|b| {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                f64::from_le_bytes(a) as f32
            })),
        }
        self.done += n as u64;
        Ok(())
    }
}

/// A 1-D integer array (`int32` or `int64`) in a `.npy` file, read in
/// blocks as `u32` labels.
#[derive(Debug)]
pub(crate) struct NpyInts {
    path: PathBuf,
    reader: BufReader<File>,
    dtype: Dtype,
    len: u64,
    data_offset: u64,
    buf: Vec<u8>,
}

impl NpyInts {
    /// Opens `path`, checks it is a 1-D int32/int64 array held in full.
    pub(crate) fn open(path: &Path) -> Result<NpyInts> {
        let (reader, flen, h) = open_with_header(path)?;
        if !matches!(h.dtype, Dtype::I32 | Dtype::I64) {
            return Err(bad(
                path,
                format!("labels must be int32 or int64, not {}", h.dtype.descr()),
            ));
        }
        if h.shape.len() != 1 {
            return Err(bad(
                path,
                format!(
                    "labels must be a 1-D array, this one has shape {:?}",
                    h.shape
                ),
            ));
        }
        let len = h.shape[0];
        check_length(path, flen, &h, Some(len))?;
        Ok(NpyInts {
            path: path.to_path_buf(),
            reader,
            dtype: h.dtype,
            len,
            data_offset: h.data_offset,
            buf: Vec::new(),
        })
    }

    /// Number of labels.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the next `n` labels; negative or huge values are errors.
    pub(crate) fn read(&mut self, n: usize) -> Result<Vec<u32>> {
        self.buf.resize(n * self.dtype.size(), 0);
        self.reader
            .read_exact(&mut self.buf)
            .map_err(|e| bad(&self.path, format!("read failed: {e}")))?;
        self.decode(&self.buf)
    }

    /// Reads labels `first..first + n` wherever the stream is (positioned
    /// reads: any thread, any order), with the raw bytes for a checksum.
    pub(crate) fn read_at(&self, first: u64, n: usize) -> Result<(Vec<u32>, Vec<u8>)> {
        use std::os::unix::fs::FileExt;
        let size = self.dtype.size() as u64;
        let mut bytes = vec![0u8; n * size as usize];
        self.reader
            .get_ref()
            .read_exact_at(&mut bytes, self.data_offset + first * size)
            .map_err(|e| bad(&self.path, format!("read failed: {e}")))?;
        Ok((self.decode(&bytes)?, bytes))
    }

    fn decode(&self, buf: &[u8]) -> Result<Vec<u32>> {
        let vals: Vec<i64> = match self.dtype {
            Dtype::I32 => buf
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
            _ => buf
                .chunks_exact(8)
                .map(|b| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    i64::from_le_bytes(a)
                })
                .collect(),
        };
        vals.into_iter()
            .map(|v| {
                u32::try_from(v)
                    .ok()
                    .filter(|&u| u < 1 << 24)
                    .ok_or_else(|| {
                        bad(
                            &self.path,
                            format!("label {v} is not a class index (0 .. 16777215)"),
                        )
                    })
            })
            .collect()
    }
}

/// A 1-D float32/float64 array in a `.npy` file (such as one sample
/// weight per row), read at any position as `f32`.
#[derive(Debug)]
pub(crate) struct NpyVector {
    path: PathBuf,
    file: File,
    dtype: Dtype,
    len: u64,
    data_offset: u64,
}

impl NpyVector {
    /// Opens `path`, checks it is a 1-D float32/float64 array held in full.
    pub(crate) fn open(path: &Path) -> Result<NpyVector> {
        let (reader, flen, h) = open_with_header(path)?;
        if !matches!(h.dtype, Dtype::F32 | Dtype::F64) {
            return Err(bad(
                path,
                format!("must be float32 or float64, not {}", h.dtype.descr()),
            ));
        }
        if h.shape.len() != 1 {
            return Err(bad(
                path,
                format!("must be a 1-D array, this one has shape {:?}", h.shape),
            ));
        }
        let len = h.shape[0];
        check_length(path, flen, &h, Some(len))?;
        Ok(NpyVector {
            path: path.to_path_buf(),
            file: reader.into_inner(),
            dtype: h.dtype,
            len,
            data_offset: h.data_offset,
        })
    }

    /// Number of values.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Values `first..first + n` as `f32` (float64 is rounded, as
    /// scikit-learn casts sample weights to the data's float32), with the
    /// raw bytes for a checksum. Positioned reads: any thread, any order.
    pub(crate) fn read_at(&self, first: u64, n: usize) -> Result<(Vec<f32>, Vec<u8>)> {
        use std::os::unix::fs::FileExt;
        let size = self.dtype.size();
        let mut bytes = vec![0u8; n * size];
        self.file
            .read_exact_at(&mut bytes, self.data_offset + first * size as u64)
            .map_err(|e| bad(&self.path, format!("read failed: {e}")))?;
        let v = match self.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            _ => bytes
                .chunks_exact(8)
                .map(|b| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    f64::from_le_bytes(a) as f32
                })
                .collect(),
        };
        Ok((v, bytes))
    }
}

/// Reads a whole (small) 2-D float32/float64 array as `f32`: the values,
/// the rows and the columns.
pub fn read_matrix(path: &Path) -> Result<(Vec<f32>, usize, usize)> {
    let mut r = NpyRows::open(path)?;
    let (rows, cols) = (r.rows() as usize, r.cols());
    let mut out = Vec::with_capacity(rows * cols);
    r.read_rows(rows, &mut out)?;
    crate::input::check_finite(&out, cols, 0).map_err(|e| bad(path, e))?;
    Ok((out, rows, cols))
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
        let mut r = NpyRows::open(&p).unwrap();
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
            let e = NpyRows::open(&p).expect_err("should fail").to_string();
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
        let mut be = replace(header_bytes(Dtype::F32, &[1, 1]), b"<f4", b">f4");
        be.extend_from_slice(&[0u8; 4]);
        check(be, "unsupported dtype");
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
