//! A fitted model applied to rows, in one streamed pass: each row's
//! nearest centre, its distances to every centre, or an affine map
//! (`X W^T + b`: a linear model's decision values, a projection).
//!
//! The rows come from a file or from memory; the workers take blocks in
//! turn, so reading one block overlaps computing another. A block goes
//! through the finite check, the norms and the product a piece (about
//! 256 KiB) at a time, while the piece is in the core's cache. While a
//! file's pieces are in the page cache they are copied from it one by one
//! into a buffer that stays in that cache; once one is not, the rest of
//! the block is read by large direct reads. Nothing of the file stays
//! mapped into the process. What the pass holds is one block of rows and
//! its results per worker (see [`Plan`]); the results go straight into
//! the caller's output. Products are matrix products (`matrixmultiply`),
//! or dot products for an affine map of at most four outputs, in the
//! precision of `T`; the nearest centre in `f32` is found as a K-means
//! fit finds it (its fused kernel), so `predict` gives a fit's labels.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::input::BlockReader;
use crate::kmeans::Centers;
use crate::{Error, Result};

/// The element types a pass computes in: `f32` and `f64`.
pub trait Real: Copy + Default + PartialOrd + Send + Sync + 'static {
    /// `c = a b^T` for `a` (`m x k`) and `b` (`n x k`), row-major, `c`
    /// `m x n`.
    fn gemm_nt(m: usize, n: usize, k: usize, a: &[Self], b: &[Self], c: &mut [Self]);
    /// The value of `x`.
    fn of_f32(x: f32) -> Self;
    /// `x` as `f64`.
    fn to_f64(self) -> f64;
    /// Rows that `read` reads as float32 (what it returns: whether it
    /// read them), in `out`: read there where `Self` is `f32`, else read
    /// into `scratch` and widened.
    fn read_f32(
        out: &mut Vec<Self>,
        scratch: &mut Vec<f32>,
        read: impl FnOnce(&mut Vec<f32>) -> Result<bool>,
    ) -> Result<bool>;
    /// `x` as `f32` values, where `Self` is `f32`.
    fn as_f32(x: &[Self]) -> Option<&[f32]>;
    /// `x` as `f32` values, where `Self` is `f32`.
    fn as_f32_mut(x: &mut [Self]) -> Option<&mut [f32]>;
    /// `self * b + c`.
    fn mul_add(self, b: Self, c: Self) -> Self;
    /// The square root of `max(self, 0)`.
    fn sqrt0(self) -> Self;
    /// Zero.
    const ZERO: Self;
}

macro_rules! real {
    ($t:ty, $gemm:path, { $($own:tt)* }) => {
        impl Real for $t {
            fn gemm_nt(m: usize, n: usize, k: usize, a: &[$t], b: &[$t], c: &mut [$t]) {
                assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n);
                let (n_, k_) = (n as isize, k as isize);
                // SAFETY: the assert above bounds every index the product
                // touches: `a` is read at `i * k + p` (i < m, p < k), `b` at
                // `j * k + p` (j < n) through the transposed strides
                // (1, k), and `c` written at `i * n + j`; `c` is borrowed
                // mutably, so it overlaps neither input.
                unsafe {
                    $gemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        k_,
                        1,
                        b.as_ptr(),
                        1,
                        k_,
                        0.0,
                        c.as_mut_ptr(),
                        n_,
                        1,
                    );
                }
            }
            fn of_f32(x: f32) -> $t {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            $($own)*
            fn mul_add(self, b: $t, c: $t) -> $t {
                self * b + c
            }
            fn sqrt0(self) -> $t {
                if self > 0.0 {
                    self.sqrt()
                } else {
                    0.0
                }
            }
            const ZERO: $t = 0.0;
        }
    };
}

real!(f32, matrixmultiply::sgemm, {
    fn read_f32(
        out: &mut Vec<f32>,
        _: &mut Vec<f32>,
        read: impl FnOnce(&mut Vec<f32>) -> Result<bool>,
    ) -> Result<bool> {
        read(out)
    }
    fn as_f32(x: &[f32]) -> Option<&[f32]> {
        Some(x)
    }
    fn as_f32_mut(x: &mut [f32]) -> Option<&mut [f32]> {
        Some(x)
    }
});
real!(f64, matrixmultiply::dgemm, {
    fn read_f32(
        out: &mut Vec<f64>,
        scratch: &mut Vec<f32>,
        read: impl FnOnce(&mut Vec<f32>) -> Result<bool>,
    ) -> Result<bool> {
        let got = read(scratch)?;
        out.clear();
        if got {
            out.extend(scratch.iter().map(|x| f64::from(*x)));
        }
        Ok(got)
    }
    fn as_f32(_: &[f64]) -> Option<&[f32]> {
        None
    }
    fn as_f32_mut(_: &mut [f64]) -> Option<&mut [f32]> {
        None
    }
});

/// Where the rows come from.
pub trait Rows<T>: Sync {
    /// Number of rows.
    fn rows(&self) -> u64;
    /// Values per row.
    fn cols(&self) -> usize;
    /// Rows `first..first + n` into `out` (cleared first), row-major.
    fn read(&self, first: u64, n: usize, out: &mut Vec<T>) -> Result<()>;
    /// [`read`](Self::read), when the rows are in memory now (the page
    /// cache): `false` when reading them would wait for a disk, `out`
    /// then unspecified. Pieces of a block are read so while they are
    /// there; the rest of the block then by one `read`.
    fn read_now(&self, first: u64, n: usize, out: &mut Vec<T>) -> Result<bool>;
}

/// A file's rows (read as float32, the engine's precision, and widened
/// to `T`).
#[derive(Debug)]
pub struct FileRows {
    reader: BlockReader,
    cols: usize,
    /// Float32 rows before they are widened, a buffer per worker at work,
    /// used again (not per thread: the workers' threads outlive a pass,
    /// and the buffers go with it).
    spare: Mutex<Vec<Vec<f32>>>,
}

impl FileRows {
    /// The rows of `reader`, `cols` values each.
    pub fn new(reader: BlockReader, cols: usize) -> FileRows {
        FileRows {
            reader,
            cols,
            spare: Mutex::new(Vec::new()),
        }
    }

    /// `f` with a float32 buffer of this pass's.
    fn with_scratch<R>(&self, f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
        let lock = || self.spare.lock().unwrap_or_else(|p| p.into_inner());
        let mut scratch = lock().pop().unwrap_or_default();
        let r = f(&mut scratch);
        lock().push(scratch);
        r
    }
}

impl<T: Real> Rows<T> for FileRows {
    fn rows(&self) -> u64 {
        self.reader.rows()
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn read(&self, first: u64, n: usize, out: &mut Vec<T>) -> Result<()> {
        self.with_scratch(|scratch| {
            T::read_f32(out, scratch, |v| {
                *v = self.reader.read(first, n)?;
                Ok(true)
            })
        })?;
        Ok(())
    }
    fn read_now(&self, first: u64, n: usize, out: &mut Vec<T>) -> Result<bool> {
        self.with_scratch(|scratch| {
            T::read_f32(out, scratch, |v| self.reader.read_cached(first, n, v))
        })
    }
}

/// What the pass computes, and where it goes (one entry per row, or
/// `width` per row, row-major).
#[derive(Debug)]
pub enum Task<'a, T> {
    /// The nearest of the centres (`k x cols`, row-major; the lowest index
    /// on ties) and the squared distance to it.
    Nearest {
        /// The centres.
        centers: &'a [T],
        /// Each row's nearest centre.
        labels: &'a mut [i32],
        /// Each row's squared distance to it (at least 0).
        d2: &'a mut [T],
    },
    /// The Euclidean distance to every centre: `k` per row.
    Distances {
        /// The centres.
        centers: &'a [T],
        /// `rows x k` distances.
        out: &'a mut [T],
    },
    /// `x W^T + b` for `weights` (`outputs x cols`) and `bias` (`outputs`).
    Affine {
        /// The weights.
        weights: &'a [T],
        /// The bias.
        bias: &'a [T],
        /// `rows x outputs` values.
        out: &'a mut [T],
    },
}

/// How a pass runs: its workers and the rows a block holds.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Worker threads (at least 1); the caller's thread is one of them.
    pub workers: usize,
    /// Rows per block.
    pub block_rows: usize,
}

impl Plan {
    /// `workers` workers and blocks of about `block_bytes` of input each
    /// (at least 1 row, at most `rows`), with their results, so that the
    /// pass holds about `workers * block_bytes`: 8 MiB blocks unless
    /// `budget` (bytes) is smaller than `workers` of them.
    pub fn new(
        workers: usize,
        (rows, cols, width): (u64, usize, usize),
        elem: usize,
        budget: Option<u64>,
    ) -> Plan {
        let workers = workers.max(1);
        let mut block_bytes = 8u64 << 20;
        if let Some(b) = budget {
            block_bytes = block_bytes.min(b / workers as u64);
        }
        let row_bytes = ((cols + width + 1) * elem) as u64;
        // A block for every worker, where there are rows for them.
        let per_worker = rows.div_ceil(workers as u64).max(1);
        let block_rows = (block_bytes / row_bytes).clamp(1, per_worker);
        Plan {
            workers,
            block_rows: usize::try_from(block_rows).unwrap_or(usize::MAX),
        }
    }
}

/// One block's share of the output.
enum Out<'a, T> {
    Nearest(&'a mut [i32], &'a mut [T]),
    Values(&'a mut [T]),
}

/// Applies `task` to every row of `rows` under `plan`. A value that is
/// not finite stops the pass with [`Error::NotFinite`] (the first such
/// row a worker met); the outputs are then partly written.
pub fn apply<T: Real>(rows: &dyn Rows<T>, task: Task<'_, T>, plan: Plan) -> Result<()> {
    let (n, cols) = (rows.rows(), rows.cols());
    let n_usize =
        usize::try_from(n).map_err(|_| Error::Input(format!("{n} rows do not fit in memory")))?;
    let b = plan.block_rows.max(1);
    let (model, width, blocks) = split(task, n_usize, cols, b)?;
    let failed = AtomicBool::new(false);
    let spare: Mutex<Vec<Bufs<T>>> = Mutex::new(Vec::new());
    let first_error: Mutex<Option<(u64, Error)>> = Mutex::new(None);
    let items: Vec<_> = blocks.into_iter().enumerate().collect();
    crate::par::for_each(items, plan.workers, |(i, out)| {
        if failed.load(Ordering::Relaxed) {
            return;
        }
        let first = (i * b) as u64;
        let count = b.min(n_usize - i * b);
        // Buffers are used again (fresh memory costs a page fault per
        // page).
        let mut bufs = spare
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .unwrap_or_default();
        let r = block(rows, &model, (first, count), (cols, width), out, &mut bufs);
        spare.lock().unwrap_or_else(|p| p.into_inner()).push(bufs);
        if let Err(e) = r {
            failed.store(true, Ordering::Relaxed);
            let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
            // The lowest block's error, whichever worker saw it first.
            if slot.as_ref().is_none_or(|(f, _)| first < *f) {
                *slot = Some((first, e));
            }
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// The model's rows and norms.
struct Model<'a, T> {
    /// `m x cols`.
    w: &'a [T],
    /// Nearest and distances: the centres' squared norms; affine: the
    /// bias.
    extra: Vec<T>,
    kind: Kind,
    /// Nearest, in `f32`: the centres as a fit's labelling takes them
    /// (its kernel, so its labels).
    centers: Option<Centers>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Nearest,
    Distances,
    Affine,
}

type Split<'a, T> = (Model<'a, T>, usize, Vec<Out<'a, T>>);

/// The task's model, its output width and its output cut into blocks.
fn split<T: Real>(task: Task<'_, T>, n: usize, cols: usize, b: usize) -> Result<Split<'_, T>> {
    let wrong = |what: &str, len: usize, want: usize| {
        Error::Input(format!("{what} holds {len} values where {want} are needed"))
    };
    // The model's rows, their number (the output's width) and what goes
    // with them: the centres' squared norms, or the bias.
    let (w, width, extra, kind) = match &task {
        Task::Nearest { centers, .. } | Task::Distances { centers, .. } => {
            let k = centers.len() / cols.max(1);
            if k == 0 || centers.len() != k * cols {
                return Err(wrong("the centres", centers.len(), k.max(1) * cols));
            }
            let kind = match task {
                Task::Nearest { .. } => Kind::Nearest,
                _ => Kind::Distances,
            };
            let norms = centers.chunks(cols.max(1)).map(sum_sq).collect();
            (*centers, k, norms, kind)
        }
        Task::Affine { weights, bias, .. } => {
            let m = bias.len();
            if m == 0 || weights.len() != m * cols {
                return Err(wrong("the weights", weights.len(), m.max(1) * cols));
            }
            (*weights, m, bias.to_vec(), Kind::Affine)
        }
    };
    let outs = match task {
        Task::Nearest { labels, d2, .. } => {
            if labels.len() != n || d2.len() != n {
                return Err(wrong("the output", labels.len().min(d2.len()), n));
            }
            let outs = labels.chunks_mut(b).zip(d2.chunks_mut(b));
            outs.map(|(l, d)| Out::Nearest(l, d)).collect()
        }
        Task::Distances { out, .. } | Task::Affine { out, .. } => {
            if out.len() != n * width {
                return Err(wrong("the output", out.len(), n * width));
            }
            out.chunks_mut(b * width).map(Out::Values).collect()
        }
    };
    let centers = match (kind, T::as_f32(w)) {
        (Kind::Nearest, Some(c)) => Some(Centers::new(width, cols, c.to_vec())),
        _ => None,
    };
    Ok((
        Model {
            w,
            extra,
            kind,
            centers,
        },
        width,
        outs,
    ))
}

/// The first value of `x` (rows of `cols`, the first `first`) that is not
/// finite, as an error.
fn check_finite<T: Real>(x: &[T], first: u64, cols: usize) -> Result<()> {
    // A sum of squares is finite exactly when every value is finite and
    // not too large; the rare block where it is not is searched.
    // `v * 0` is 0 for a finite value and NaN otherwise; eight
    // independent sums let the loop use vector registers.
    let mut lanes = [T::ZERO; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = v.mul_add(T::ZERO, *l);
        }
    }
    let ok = lanes.iter().chain(tail).all(|v| v.to_f64().is_finite());
    if ok {
        return Ok(());
    }
    let i = x.iter().position(|v| !v.to_f64().is_finite()).unwrap_or(0);
    Err(Error::NotFinite {
        row: first + (i / cols.max(1)) as u64,
        col: i % cols.max(1),
        nan: x[i].to_f64().is_nan(),
        path: None,
    })
}

/// The sum of the squares of `r`, in eight lanes (vector registers).
fn sum_sq<T: Real>(r: &[T]) -> T {
    let mut lanes = [T::ZERO; 8];
    let chunks = r.chunks_exact(8);
    let tail = chunks
        .remainder()
        .iter()
        .fold(T::ZERO, |s, v| v.mul_add(*v, s));
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = v.mul_add(*v, *l);
        }
    }
    lanes
        .iter()
        .fold(tail, |s, l| s.mul_add(T::of_f32(1.0), *l))
}

impl<'a, T> Out<'a, T> {
    /// This output cut into pieces of `rows` rows (`width` values each).
    fn pieces(self, rows: usize, width: usize) -> Vec<Out<'a, T>> {
        match self {
            Out::Nearest(l, d) => l
                .chunks_mut(rows)
                .zip(d.chunks_mut(rows))
                .map(|(l, d)| Out::Nearest(l, d))
                .collect(),
            Out::Values(o) => o.chunks_mut(rows * width).map(Out::Values).collect(),
        }
    }

    /// Its rows.
    fn rows(&self, width: usize) -> usize {
        match self {
            Out::Nearest(l, _) => l.len(),
            Out::Values(o) => o.len() / width.max(1),
        }
    }
}

/// Rows of a block taken through the check, the norms and the product
/// together, so that they stay in the core's cache: about 256 KiB of
/// them, and at least four per model row (the product packs the model
/// once per piece).
fn piece_rows(cols: usize, width: usize, elem: usize) -> usize {
    ((256usize << 10) / (cols.max(1) * elem))
        .max(4 * width)
        .max(1)
}

/// A worker's memory: the rows of a piece, or of the rest of a block
/// when they are read from the disk, and what a piece's product needs.
#[derive(Default)]
struct Bufs<T> {
    piece: Vec<T>,
    block: Vec<T>,
    scratch: Scratch<T>,
}

/// Room for a piece's products and norms, and its labels.
#[derive(Default)]
struct Scratch<T> {
    tile: Vec<T>,
    xn: Vec<T>,
    norms: Vec<f32>,
    best: Vec<u32>,
}

/// One block: rows `first..first + count` through the model into `out`,
/// a piece at a time; a value that is not finite stops it. Pieces are
/// read one by one while they are in memory (from the page cache, into a
/// buffer that stays in the core's cache); once one is not, the rest of
/// the block is read at once (large reads from the disk).
fn block<T: Real>(
    rows: &dyn Rows<T>,
    model: &Model<'_, T>,
    (first, count): (u64, usize),
    (cols, width): (usize, usize),
    out: Out<'_, T>,
    bufs: &mut Bufs<T>,
) -> Result<()> {
    let p = piece_rows(cols, width, std::mem::size_of::<T>());
    let Bufs {
        piece: one,
        block: rest,
        scratch,
    } = bufs;
    // Where the rest of the block starts, once it was read at once.
    let mut rest_from = None;
    for (i, o) in out.pieces(p, width).into_iter().enumerate() {
        let (start, n) = (i * p, o.rows(width));
        let at = first + start as u64;
        if rest_from.is_none() && !rows.read_now(at, n, one)? {
            rows.read(at, count - start, rest)?;
            rest_from = Some(start);
        }
        let xs = match rest_from {
            Some(s) => &rest[(start - s) * cols..(start - s + n) * cols],
            None => &one[..n * cols],
        };
        check_finite(xs, at, cols)?;
        piece(model, xs, (n, cols, width), o, scratch);
    }
    Ok(())
}

/// Outputs this narrow or narrower are dot products, not a matrix
/// product (which would pad them to its kernel's width).
const NARROW: usize = 4;

/// One piece: `n` rows of `x` through the model into `out`, with `tile`
/// and `xn` as room for the products and the rows' norms.
fn piece<T: Real>(
    model: &Model<'_, T>,
    x: &[T],
    (n, cols, width): (usize, usize, usize),
    mut out: Out<'_, T>,
    s: &mut Scratch<T>,
) {
    if let (Some(c), Some(xf), Out::Nearest(labels, d2)) = (&model.centers, T::as_f32(x), &mut out)
    {
        if let Some(d2) = T::as_f32_mut(d2) {
            return nearest_f32(c, xf, labels, d2, s);
        }
    }
    let out = match (model.kind, out) {
        (Kind::Affine, Out::Values(o)) if width <= NARROW && cols > 0 => {
            return affine_narrow(model, x, cols, width, o);
        }
        (_, out) => out,
    };
    let (tile, xn) = (&mut s.tile, &mut s.xn);
    tile.clear();
    tile.resize(n * width, T::ZERO);
    T::gemm_nt(n, width, cols, x, model.w, tile);
    match (model.kind, out) {
        (Kind::Affine, Out::Values(o)) => {
            for (dst, src) in o.chunks_mut(width).zip(tile.chunks(width)) {
                for ((d, s), b) in dst.iter_mut().zip(src).zip(&model.extra) {
                    *d = s.mul_add(T::of_f32(1.0), *b);
                }
            }
        }
        (kind, out) => {
            xn.clear();
            xn.extend(x[..n * cols].chunks(cols.max(1)).map(sum_sq));
            distances(kind, xn, &model.extra, tile, width, out);
        }
    }
}

/// Each row of `x`'s nearest centre into `labels` and its squared
/// distance to it (at least 0) into `d2`, as a fit labels them.
fn nearest_f32<T>(c: &Centers, x: &[f32], labels: &mut [i32], d2: &mut [f32], s: &mut Scratch<T>) {
    s.best.clear();
    s.best.resize(labels.len(), 0);
    crate::kmeans::label_rows(x, c, &mut s.norms, &mut s.best, d2);
    for (l, &b) in labels.iter_mut().zip(&s.best) {
        *l = i32::try_from(b).unwrap_or(i32::MAX);
    }
    for v in d2.iter_mut() {
        *v = v.max(0.0);
    }
}

/// `x W^T + b` for a narrow `W`: each output a dot product in eight
/// lanes.
fn affine_narrow<T: Real>(model: &Model<'_, T>, x: &[T], cols: usize, width: usize, o: &mut [T]) {
    for (dst, xr) in o.chunks_mut(width).zip(x.chunks_exact(cols)) {
        let outputs = model.w.chunks_exact(cols).zip(&model.extra);
        for (d, (wr, b)) in dst.iter_mut().zip(outputs) {
            let mut lanes = [T::ZERO; 8];
            let (xc, wc) = (xr.chunks_exact(8), wr.chunks_exact(8));
            let tail = xc.remainder().iter().zip(wc.remainder());
            let tail = tail.fold(*b, |s, (a, w)| a.mul_add(*w, s));
            for (a, w) in xc.zip(wc) {
                for t in 0..8 {
                    lanes[t] = a[t].mul_add(w[t], lanes[t]);
                }
            }
            *d = lanes
                .iter()
                .fold(tail, |s, l| s.mul_add(T::of_f32(1.0), *l));
        }
    }
}

/// Squared distances `|x|^2 - 2 x.c + |c|^2` from the products in `tile`,
/// reduced to the nearest centre or written as distances.
fn distances<T: Real>(kind: Kind, xn: &[T], cn: &[T], tile: &[T], k: usize, out: Out<'_, T>) {
    let d2 = |i: usize, j: usize| {
        let p = tile[i * k + j];
        let v = p
            .mul_add(T::of_f32(-2.0), xn[i])
            .mul_add(T::of_f32(1.0), cn[j]);
        if v > T::ZERO {
            v
        } else {
            T::ZERO
        }
    };
    match (kind, out) {
        (Kind::Nearest, Out::Nearest(labels, best)) => {
            for i in 0..labels.len() {
                let (mut arg, mut min) = (0, d2(i, 0));
                for j in 1..k {
                    let v = d2(i, j);
                    if v < min {
                        (arg, min) = (j, v);
                    }
                }
                labels[i] = arg as i32;
                best[i] = min;
            }
        }
        (_, Out::Values(o)) => {
            for (i, row) in o.chunks_mut(k).enumerate() {
                for (j, d) in row.iter_mut().enumerate() {
                    *d = d2(i, j).sqrt0();
                }
            }
        }
        (_, Out::Nearest(..)) => {}
    }
}

#[cfg(test)]
mod tests;
