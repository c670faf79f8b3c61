//! Row readers: one per input format, each checking the file's size
//! against its shape when it is opened and then streaming rows in order.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::PathBuf;

use super::region::{Encoding, Region};
use super::{Blobs, Source};
use crate::error::{Error, Result};
use crate::files::open_input;
use crate::npy::NpyRows;

/// Row reader over any source.
#[derive(Debug)]
pub(crate) enum Rows {
    /// Generated points.
    Synthetic(Blobs, u64),
    /// `.npy` rows.
    Npy(NpyRows),
    /// `.fvecs` or raw rows.
    Plain {
        /// The file.
        path: PathBuf,
        /// Reader.
        reader: BufReader<File>,
        /// Columns.
        dims: usize,
        /// Rows.
        rows: u64,
        /// Rows read.
        done: u64,
        /// Whether each row starts with an int32 dimension (`.fvecs`).
        fvecs: bool,
        /// Scratch.
        buf: Vec<u8>,
    },
}

impl Rows {
    /// Opens a source, validating its shape and size up front; data with
    /// no rows is an error.
    pub(crate) fn open(src: &Source) -> Result<Rows> {
        let rows = Rows::open_any(src)?;
        if rows.rows() == 0 {
            return Err(Error::Input(match src {
                Source::Npy(p)
                | Source::Npz(p, _)
                | Source::Fvecs(p)
                | Source::Raw(p, _)
                | Source::Column(p) => {
                    format!("{}: the data has no rows", p.display())
                }
                _ => "the data has no rows".into(),
            }));
        }
        Ok(rows)
    }

    fn open_any(src: &Source) -> Result<Rows> {
        match src {
            Source::Synthetic {
                rows,
                dims,
                true_k,
                seed,
            } => {
                if *dims == 0 {
                    return Err(Error::Input("dims must be at least 1".into()));
                }
                Ok(Rows::Synthetic(Blobs::new(*dims, *true_k, *seed), *rows))
            }
            Source::Npy(p) => Ok(Rows::Npy(NpyRows::open(p, None)?)),
            Source::Column(p) => Ok(Rows::Npy(NpyRows::open_column(p)?)),
            Source::Npz(p, key) => Ok(Rows::Npy(NpyRows::open(p, key.as_deref())?)),
            Source::Fvecs(p) => {
                let (file, len) = open_input(p)?;
                let mut reader = BufReader::with_capacity(1 << 20, file);
                let mut d = [0u8; 4];
                reader.read_exact(&mut d).map_err(|_| {
                    Error::Input(format!("{}: empty or truncated .fvecs file", p.display()))
                })?;
                let dims = i32::from_le_bytes(d);
                if dims <= 0 || dims > 1 << 24 {
                    return Err(Error::Input(format!(
                        "{}: bad .fvecs dimension {dims}",
                        p.display()
                    )));
                }
                let dims = dims as usize;
                let rec = 4 + 4 * dims as u64;
                if len % rec != 0 {
                    return Err(Error::Input(format!(
                        "{}: {len} bytes is not a whole number of {dims}-dimensional .fvecs records",
                        p.display()
                    )));
                }
                // Re-open to start at the first record.
                let (file, _) = open_input(p)?;
                Ok(Rows::Plain {
                    path: p.clone(),
                    reader: BufReader::with_capacity(1 << 20, file),
                    dims,
                    rows: len / rec,
                    done: 0,
                    fvecs: true,
                    buf: Vec::new(),
                })
            }
            Source::Raw(p, dims) => {
                if *dims == 0 {
                    return Err(Error::Input("dims must be at least 1".into()));
                }
                let (file, len) = open_input(p)?;
                let rec = 4 * *dims as u64;
                if len % rec != 0 {
                    return Err(Error::Input(format!(
                        "{}: {len} bytes is not a whole number of rows of {dims} float32 values",
                        p.display()
                    )));
                }
                Ok(Rows::Plain {
                    path: p.clone(),
                    reader: BufReader::with_capacity(1 << 20, file),
                    dims: *dims,
                    rows: len / rec,
                    done: 0,
                    fvecs: false,
                    buf: Vec::new(),
                })
            }
        }
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> u64 {
        match self {
            Rows::Synthetic(_, n) => *n,
            Rows::Npy(r) => r.rows(),
            Rows::Plain { rows, .. } => *rows,
        }
    }

    /// Number of columns.
    pub(crate) fn dims(&self) -> usize {
        match self {
            Rows::Synthetic(b, _) => b.dims(),
            Rows::Npy(r) => r.cols(),
            Rows::Plain { dims, .. } => *dims,
        }
    }

    /// A block reader over the same file, for reading rows again in any
    /// order (the lineage of file-backed executors); `None` for generated
    /// data and for files that cannot be read twice (pipes, devices).
    pub(crate) fn region(&self) -> Result<Option<Region>> {
        let (path, offset, encoding) = match self {
            Rows::Synthetic(..) => return Ok(None),
            Rows::Npy(r) => match r.layout() {
                // A compressed `.npz` member can only be read in order.
                None => return Ok(None),
                Some((path, offset, stored)) => {
                    let enc = if stored.is_native_f32() {
                        Encoding::F32
                    } else {
                        Encoding::Convert(stored)
                    };
                    (path, offset, enc)
                }
            },
            Rows::Plain { path, fvecs, .. } => (
                path.as_path(),
                0,
                if *fvecs {
                    Encoding::Fvecs
                } else {
                    Encoding::F32
                },
            ),
        };
        Region::open(path, offset, self.dims(), encoding)
            .and_then(|r| match (r, self) {
                // An uncompressed `.npz` member: checked against its CRC-32.
                (Some(r), Rows::Npy(n)) => match n.member() {
                    Some(m) => r.check_member(m, n.rows()).map(Some),
                    None => Ok(Some(r)),
                },
                (r, _) => Ok(r),
            })
            .map_err(|e| Error::io(path, "cannot open", e))
    }

    /// Rows `first..first + n`, read as [`Rows::read`] does.
    pub(crate) fn read_vec(&mut self, first: u64, n: usize) -> Result<Vec<f32>> {
        let mut x = Vec::with_capacity(n * self.dims());
        self.read(first, n, &mut x)?;
        Ok(x)
    }

    /// Appends rows `first..first + n` to `out` (rows are read in order).
    /// A value that is not finite is an error naming its row and column.
    pub(crate) fn read(&mut self, first: u64, n: usize, out: &mut Vec<f32>) -> Result<()> {
        let start = out.len();
        self.read_any(first, n, out)?;
        let path = match self {
            Rows::Synthetic(..) => return Ok(()),
            Rows::Npy(r) => r.label().to_path_buf(),
            Rows::Plain { path, .. } => path.clone(),
        };
        crate::npy::check_finite(&out[start..], self.dims(), first)
            .map_err(|bad| bad.at(&path).into_error())
    }

    fn read_any(&mut self, first: u64, n: usize, out: &mut Vec<f32>) -> Result<()> {
        match self {
            Rows::Synthetic(b, _) => {
                let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
                b.points_parallel(first, n, threads, out);
                Ok(())
            }
            Rows::Npy(r) => r.read_rows(n, out),
            Rows::Plain {
                path,
                reader,
                dims,
                done,
                fvecs,
                buf,
                ..
            } => {
                let d = *dims;
                let rec = if *fvecs { 4 + 4 * d } else { 4 * d };
                buf.resize(rec * n, 0);
                reader
                    .read_exact(buf)
                    .map_err(|e| Error::io(&*path, "read failed", e))?;
                for (k, r) in buf.chunks_exact(rec).enumerate() {
                    let body = if *fvecs {
                        let rd = i32::from_le_bytes([r[0], r[1], r[2], r[3]]);
                        if rd as usize != d {
                            return Err(Error::Input(format!(
                                "{}: record {} has dimension {rd}, expected {d}",
                                path.display(),
                                *done + k as u64
                            )));
                        }
                        &r[4..]
                    } else {
                        r
                    };
                    out.extend(
                        body.chunks_exact(4)
                            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                    );
                }
                *done += n as u64;
                Ok(())
            }
        }
    }
}
