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

mod open;
mod read;
mod write;

use open::*;
pub(crate) use open::{crc_mismatch, MemberCrc};
pub use read::read_matrix;
pub(crate) use read::{check_finite, NpyInts, NpyRows, NpyVector};
pub use write::{write_array, Element, NpyWriter};

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

#[cfg(test)]
mod tests {
    use super::read::*;
    use super::write::*;
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
