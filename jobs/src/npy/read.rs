//! Reading arrays: row blocks of a 2-D array ([`NpyRows`]), 1-D labels
//! and weights ([`NpyInts`], [`NpyVector`]), whole matrices
//! ([`read_matrix`]) and the finiteness check of the data.

use super::*;

/// A 2-D float array in a `.npy` file or `.npz` member, read in blocks of
/// rows as `f32`.
#[derive(Debug)]
pub(crate) struct NpyRows {
    pub(super) file: PathBuf,
    pub(super) label: PathBuf,
    pub(super) stream: Stream,
    pub(super) stored: Stored,
    pub(super) at: Option<u64>,
    pub(super) member: Option<MemberCrc>,
    pub(super) rows: u64,
    pub(super) cols: usize,
    pub(super) done: u64,
    pub(super) buf: Vec<u8>,
}

impl NpyRows {
    /// Opens `path` (for a `.npz`, its array `key`), checks it is a 2-D
    /// float C-order array and that the file holds all of its data.
    pub(crate) fn open(path: &Path, key: Option<&str>) -> Result<NpyRows> {
        NpyRows::open_shaped(path, key, false)
    }

    /// [`NpyRows::open`] for a column of targets: a 1-D array is one
    /// column.
    pub(crate) fn open_column(path: &Path) -> Result<NpyRows> {
        NpyRows::open_shaped(path, None, true)
    }

    fn open_shaped(path: &Path, key: Option<&str>, column: bool) -> Result<NpyRows> {
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
        // A column of targets may be 1-D: one per row.
        let (rows, cols) = match h.shape[..] {
            [rows] if column => (rows, 1),
            [rows, cols] => (rows, cols),
            _ => {
                return Err(bad(
                    &a.label,
                    format!(
                        "{} must be a 2-D{} array, this one has shape {:?}",
                        if column { "targets" } else { "data" },
                        if column { " (or 1-D)" } else { "" },
                        h.shape
                    ),
                ))
            }
        };
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
pub(super) struct Vector {
    pub(super) file: PathBuf,
    pub(super) label: PathBuf,
    pub(super) handle: File,
    pub(super) stored: Stored,
    pub(super) len: u64,
    pub(super) at: u64,
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
    pub(super) v: Vector,
    pub(super) pos: u64,
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
    pub(super) v: Vector,
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
    check_finite(&out, cols, 0).map_err(|b| b.at(path).into_error())?;
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
) -> std::result::Result<(), crate::error::BadValue> {
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
    let (row, col) = (first_row + (i / dims) as u64, i % dims);
    Err(crate::error::BadValue {
        path: None,
        row,
        col,
        value: x[i],
    })
}
