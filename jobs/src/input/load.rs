//! Partitioning the rows into executors and declaring the sweep order.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use outcore::{Handle, Lineage, Runtime};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::region::Region;
use super::rows::Rows;
use super::{Blobs, Labels, Source};
use crate::error::{Error, Result};
use crate::npy::{NpyInts, NpyVector};

/// A dataset spread over executors: one per block of consecutive rows, in
/// row order, declared to the runtime as the cycle the jobs sweep.
#[derive(Debug)]
#[non_exhaustive]
pub struct Partitioned<T> {
    /// One handle per block, in row order.
    pub parts: Vec<Handle<T>>,
    /// Rows in each block.
    pub part_rows: Vec<u32>,
    /// Rows of the whole dataset.
    pub rows: u64,
    /// Global index of the first row held here: 0, unless the dataset was
    /// loaded as one rank's share of the rows (then the blocks hold rows
    /// `first_row..first_row + part_rows.sum()`).
    pub first_row: u64,
    /// Columns.
    pub dims: usize,
    /// The executors are built when first needed (from the input file or
    /// the generator), not loaded up front.
    pub lazy: bool,
    /// The input file the executors are read from again, when they are.
    input: Option<Arc<Region>>,
    /// Where single rows are read without building their executors (for
    /// a lazily built dataset).
    rows_at: Option<RowsAt>,
}

/// Where a lazily built dataset's single rows come from, and how many of
/// its executors were built so far.
struct RowsAt {
    lazy: Lazy,
    weights: Option<Arc<Checked<NpyVector>>>,
    built: Arc<AtomicUsize>,
}

impl std::fmt::Debug for RowsAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowsAt")
            .field("file", &matches!(self.lazy, Lazy::File(..)))
            .field("weights", &self.weights.is_some())
            .field("built", &self.built.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> Partitioned<T> {
    /// Bytes read from the input file by the executors' lineages (builds
    /// and rebuilds after evictions); 0 when the data was loaded up front.
    pub fn input_bytes_read(&self) -> u64 {
        self.input.as_ref().map_or(0, |r| r.bytes_read())
    }

    /// A counter of the bytes read from the input file, which outlives
    /// this value.
    pub fn input_reads(&self) -> InputReads {
        InputReads(self.input.clone())
    }

    /// Whether [`rows_unbuilt`](Self::rows_unbuilt) may read rows: the
    /// executors are built when first needed, and fewer than half of them
    /// are built yet (reading rows from built executors costs less; with
    /// no cap, the prefetchers may be building them meanwhile).
    pub(crate) fn rows_readable(&self) -> bool {
        self.rows_at
            .as_ref()
            .is_some_and(|at| at.built.load(Ordering::Relaxed) * 2 < self.parts.len())
    }

    /// Rows `rows` (global indices, ascending, within this dataset's
    /// share) and their sample weights (empty when there are none), read
    /// straight from the input file (scattered reads, many in flight) or
    /// from the generator, without building any executor. `None` when not
    /// [`rows_readable`](Self::rows_readable), or when the pages under the
    /// rows come to more than a quarter of this share's bytes in the file
    /// (narrow rows cost a page each: reading the share whole costs less).
    ///
    /// A sample of the rows then costs its own rows' reads, not a read of
    /// the whole input, and the first full read overlaps the first sweep's
    /// work.
    pub(crate) fn rows_unbuilt(&self, rows: &[u64]) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
        let Some(at) = self.rows_at.as_ref().filter(|_| self.rows_readable()) else {
            return Ok(None);
        };
        if let Lazy::File(region, _) = &at.lazy {
            let share: u64 = self.part_rows.iter().map(|&n| u64::from(n)).sum();
            if region.scattered_bytes(rows).saturating_mul(4) > region.bytes_of(share) {
                return Ok(None);
            }
        }
        let x = match &at.lazy {
            Lazy::File(region, _) => region
                .read_rows(rows)
                .map_err(|e| crate::error::BadValue::of_read(&e))?,
            Lazy::Generated(blobs, _) => {
                let mut x = Vec::with_capacity(rows.len() * blobs.dims());
                for &r in rows {
                    blobs.points(r, 1, &mut x);
                }
                x
            }
        };
        let w = match &at.weights {
            Some(c) => c.pick(rows)?,
            None => Vec::new(),
        };
        Ok(Some((x, w)))
    }
}

/// Bytes read from an input file by the executors' lineages.
#[derive(Clone, Debug, Default)]
pub struct InputReads(Option<Arc<Region>>);

impl InputReads {
    /// Bytes read so far (0 when the data was loaded up front).
    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |r| r.bytes_read())
    }
}

/// One block of consecutive rows, handed to the job's function that turns
/// it into an executor.
#[derive(Debug)]
pub(crate) struct Block {
    /// Global index of the first row.
    pub first: u64,
    /// Columns.
    pub dims: usize,
    /// Row-major `rows x dims` values, from `x[skip]` on.
    pub x: Vec<f32>,
    /// Elements of `x` before the first row's (a block read in place
    /// starts where its first row's page of the file starts); 0 for most.
    pub skip: usize,
    /// One label per row when the job has labels; empty otherwise.
    pub y: Vec<u32>,
    /// One sample weight per row when the job has them; empty otherwise.
    pub w: Vec<f32>,
}

/// What to load and how to cut it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loader<'a> {
    /// The rows.
    pub source: &'a Source,
    /// Their labels, for a supervised job.
    pub labels: Option<&'a Labels>,
    /// A file of sample weights (1-D float32/float64 `.npy`, one per row).
    pub weights: Option<&'a std::path::Path>,
    /// Bytes per executor, counting 4 per value and 4 per label: blocks
    /// of that many rows (at least 1, at most `u32::MAX`; the last block
    /// holds the rest).
    pub part_bytes: u64,
    /// Executors are named `"{name} {index}"`.
    pub name: &'a str,
    /// Only these rows, cut into blocks segment by segment, when given:
    /// `(first, end, rows per block)`, consecutive (one rank's share,
    /// with blocks aligned to its shards). [`Loader::load_lazy`] only;
    /// [`Loader::load`] takes them only when they cover every row.
    pub segments: Option<&'a [(u64, u64, u64)]>,
}

/// How a block's values reach the task that builds its executor.
enum Fill<T> {
    /// Read on the loading thread.
    Read(T),
    /// Generated by the task.
    Generate(Arc<Blobs>),
    /// None (no labels).
    Nothing,
}

impl Loader<'_> {
    /// Loads the rows into executors built by `build`, which also returns
    /// a summary of each block (in row order).
    ///
    /// The executors are first inserted empty and declared as the cycle,
    /// so that what the cap pushes out while the data comes in is already
    /// what the sweeps would evict (the resident set is spread over the
    /// cycle). Synthetic blocks are then generated by the runtime's
    /// workers, in parallel, one task per block; file blocks are read on
    /// this thread, one at a time, each handed to its executor by a write
    /// task. Before each batch, room is made for what its running tasks
    /// will hold. `progress` is called with the rows loaded so far and the
    /// total.
    pub(crate) fn load<T, R, F>(
        &self,
        rt: &Runtime,
        build: F,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<(Partitioned<T>, Vec<R>)>
    where
        T: Default + Serialize + DeserializeOwned + Send + 'static,
        R: Send + 'static,
        F: Fn(Block) -> (T, R) + Send + Sync + 'static,
    {
        let mut rows_src = Rows::open(self.source)?;
        let (rows, dims) = (rows_src.rows(), rows_src.dims());
        self.check_whole(rows)?;
        let blobs = match &rows_src {
            Rows::Synthetic(b, _) => Some(Arc::new(b.clone())),
            _ => None,
        };
        let mut extras = self.open_extras(rows, blobs.is_some())?;
        let (parts, part_rows) = self.insert_empty::<T>(rt, rows, dims)?;
        let build = Arc::new(build);
        // Generated blocks: enough tasks to keep every worker busy. Read
        // blocks: one at a time, so one block is held outside the runtime.
        let group = if blobs.is_some() {
            (rt.workers() * 2).max(1)
        } else {
            1
        };
        let mut summaries = Vec::with_capacity(parts.len());
        let mut first = 0u64;
        for (hs, ns) in parts.chunks(group).zip(part_rows.chunks(group)) {
            // The tasks build their executors from nothing: make room for
            // what the running ones will allocate.
            let running = ns
                .iter()
                .take(rt.workers())
                .map(|&n| n as usize * dims * 4)
                .sum();
            rt.make_room(running);
            let mut b = rt.batch();
            for (h, &n) in hs.iter().zip(ns) {
                let n = n as usize;
                let x = match &blobs {
                    Some(g) => Fill::Generate(g.clone()),
                    None => Fill::Read(rows_src.read_vec(first, n)?),
                };
                let (y, w) = extras.read(self.labels, &blobs, first, n)?;
                let build = build.clone();
                b.write(h, move |t: &mut T| {
                    let (value, summary) = build(Block {
                        first,
                        dims,
                        x: x.points(first, n, dims),
                        skip: 0,
                        y: y.labels(first, n),
                        w,
                    });
                    *t = value;
                    summary
                });
                first += n as u64;
            }
            summaries.extend(b.run()?);
            progress(first, rows);
        }
        Ok((
            Partitioned {
                parts,
                part_rows,
                rows,
                first_row: 0,
                dims,
                lazy: false,
                input: None,
                rows_at: None,
            },
            summaries,
        ))
    }

    /// An error unless the load's segments, if any, cover all `rows`.
    fn check_whole(&self, rows: u64) -> Result<()> {
        let covered = self
            .segments
            .map(|s| (s.first().map_or(0, |f| f.0), s.last().map_or(0, |l| l.1)));
        if covered.is_some_and(|r| r != (0, rows)) {
            return Err(Error::Input(
                "compressed .npz members can only be read whole, in order: they cannot be split among processes".into(),
            ));
        }
        Ok(())
    }

    /// The label and weight files, checked against `rows`.
    fn open_extras(&self, rows: u64, synthetic: bool) -> Result<Extras> {
        let mut labels = None;
        match self.labels {
            None => {}
            Some(Labels::Blobs) if !synthetic => {
                return Err(Error::Input(
                    "labels from the blobs need synthetic data".into(),
                ))
            }
            Some(Labels::Blobs) => {}
            Some(Labels::File(p)) => {
                let r = NpyInts::open(p)?;
                if r.len() != rows {
                    return Err(Error::Input(format!(
                        "{}: {} labels for {rows} rows of data",
                        p.display(),
                        r.len()
                    )));
                }
                labels = Some(r);
            }
        }
        let weights = match self.weights {
            Some(p) => Some(open_weights(p, rows)?),
            None => None,
        };
        Ok(Extras { labels, weights })
    }

    /// The executors, inserted empty and declared as the cycle, and the
    /// rows of each.
    fn insert_empty<T>(
        &self,
        rt: &Runtime,
        rows: u64,
        dims: usize,
    ) -> Result<(Vec<Handle<T>>, Vec<u32>)>
    where
        T: Default + Serialize + DeserializeOwned + Send + 'static,
    {
        let row_bytes = 4 * dims as u64 + if self.labels.is_some() { 4 } else { 0 };
        let per = (self.part_bytes / row_bytes.max(1)).clamp(1, u64::from(u32::MAX));
        let nparts = rows.div_ceil(per);
        let mut parts = Vec::with_capacity(nparts as usize);
        let mut part_rows = Vec::with_capacity(nparts as usize);
        for p in 0..nparts {
            let name = format!("{} {p}", self.name);
            parts.push(rt.insert_named(Some(&name), T::default())?);
            part_rows.push(per.min(rows - p * per) as u32);
        }
        rt.hint_cycle(parts.iter().map(|h| h.id()));
        Ok((parts, part_rows))
    }
}

/// The label and weight files of a load, read block by block in order.
struct Extras {
    labels: Option<NpyInts>,
    weights: Option<Checked<NpyVector>>,
}

impl Extras {
    /// The labels and weights of the `n` rows from `first`.
    fn read(
        &mut self,
        labels: Option<&Labels>,
        blobs: &Option<Arc<Blobs>>,
        first: u64,
        n: usize,
    ) -> Result<(Fill<Vec<u32>>, Vec<f32>)> {
        let y = match (&mut self.labels, labels, blobs) {
            (Some(r), _, _) => Fill::Read(r.read(n)?),
            (None, Some(Labels::Blobs), Some(g)) => Fill::Generate(g.clone()),
            _ => Fill::Nothing,
        };
        let w = match &self.weights {
            Some(c) => c.col.read_at(first, n)?.0,
            None => Vec::new(),
        };
        Ok((y, w))
    }
}

impl Fill<Vec<f32>> {
    /// The `n` rows of `dims` values from `first`, read or generated.
    fn points(self, first: u64, n: usize, dims: usize) -> Vec<f32> {
        match self {
            Fill::Read(x) => x,
            Fill::Generate(g) => {
                let mut x = Vec::with_capacity(n * dims);
                g.points(first, n, &mut x);
                x
            }
            Fill::Nothing => Vec::new(),
        }
    }
}

impl Fill<Vec<u32>> {
    /// The labels of the `n` rows from `first`, read or generated.
    fn labels(self, first: u64, n: usize) -> Vec<u32> {
        match self {
            Fill::Read(y) => y,
            Fill::Generate(g) => (first..first + n as u64).map(|i| g.label(i)).collect(),
            Fill::Nothing => Vec::new(),
        }
    }
}

/// Where lazily built executors get their rows (and labels).
#[derive(Clone)]
enum Lazy {
    File(Arc<Region>, Option<Arc<Checked<NpyInts>>>),
    Generated(Arc<Blobs>, bool),
}

/// A file of one value per row (labels, sample weights), read at any
/// position.
pub(crate) trait Column: Send + Sync + 'static {
    /// The value type.
    type Item: Send;
    /// The file.
    fn path(&self) -> &std::path::Path;
    /// Values held.
    fn count(&self) -> u64;
    /// Values `first..first + n` and their raw bytes.
    fn read_at(&self, first: u64, n: usize) -> Result<(Vec<Self::Item>, Vec<u8>)>;
}

impl Column for NpyInts {
    type Item = u32;
    fn path(&self) -> &std::path::Path {
        NpyInts::path(self)
    }
    fn count(&self) -> u64 {
        self.len()
    }
    fn read_at(&self, first: u64, n: usize) -> Result<(Vec<u32>, Vec<u8>)> {
        NpyInts::read_at(self, first, n)
    }
}

impl Column for NpyVector {
    type Item = f32;
    fn path(&self) -> &std::path::Path {
        NpyVector::path(self)
    }
    fn count(&self) -> u64 {
        self.len()
    }
    fn read_at(&self, first: u64, n: usize) -> Result<(Vec<f32>, Vec<u8>)> {
        NpyVector::read_at(self, first, n)
    }
}

/// A [`Column`] checked against the file as first seen (size and
/// modification time) and, from a block's second read on, against that
/// block's first checksum.
struct Checked<C> {
    col: C,
    stamp: (u64, i64, i64),
}

impl<C: Column> Checked<C> {
    /// Opens the column for `rows` rows of data.
    fn open(col: C, rows: u64, what: &str) -> Result<Checked<C>> {
        let path = col.path().to_path_buf();
        if col.count() != rows {
            return Err(Error::Input(format!(
                "{}: {} {what} for {rows} rows of data",
                path.display(),
                col.count()
            )));
        }
        let stamp = stamp(&path).map_err(|e| Error::io(&path, "cannot read its size", e))?;
        Ok(Checked { col, stamp })
    }

    /// The values of rows `rows` (ascending), read a million at a time
    /// (a column is small beside the rows), with the file checked against
    /// its first size and modification time.
    fn pick(&self, rows: &[u64]) -> Result<Vec<C::Item>>
    where
        C::Item: Copy,
    {
        if stamp(self.col.path()).ok() != Some(self.stamp) {
            return Err(Error::Input(format!(
                "{}: the file changed during the run",
                self.col.path().display()
            )));
        }
        let mut out = Vec::with_capacity(rows.len());
        let mut i = 0;
        while i < rows.len() {
            let first = rows[i];
            let last = rows[rows.len() - 1];
            let n = (last - first + 1).min(1 << 20) as usize;
            let (values, _) = self.col.read_at(first, n)?;
            while i < rows.len() && rows[i] < first + n as u64 {
                out.push(values[(rows[i] - first) as usize]);
                i += 1;
            }
        }
        Ok(out)
    }

    fn read(&self, first: u64, n: usize, at_first: &OnceLock<u64>) -> io::Result<Vec<C::Item>> {
        let changed = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the file changed during the run",
                    self.col.path().display()
                ),
            )
        };
        if stamp(self.col.path())? != self.stamp {
            return Err(changed());
        }
        let (values, bytes) = self
            .col
            .read_at(first, n)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let sum = outcore::Checksum::of(&bytes);
        if *at_first.get_or_init(|| sum) != sum {
            return Err(changed());
        }
        Ok(values)
    }
}

/// Opens a sample-weights file for `rows` rows and checks every weight
/// once, up front: finite, at least 0, not all 0.
fn open_weights(path: &std::path::Path, rows: u64) -> Result<Checked<NpyVector>> {
    let c = Checked::open(NpyVector::open(path)?, rows, "sample weights")?;
    let mut any = false;
    let mut first = 0u64;
    while first < rows {
        let n = (rows - first).min(1 << 20) as usize;
        let (w, _) = c.col.read_at(first, n)?;
        for (i, &v) in w.iter().enumerate() {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::Input(format!(
                    "{}: weight {} is {v}; sample weights must be finite and >= 0",
                    path.display(),
                    first + i as u64
                )));
            }
            any |= v > 0.0;
        }
        first += n as u64;
    }
    if !any {
        return Err(Error::Input(format!(
            "{}: every sample weight is 0",
            path.display()
        )));
    }
    Ok(c)
}

/// Size and modification time of `path`.
fn stamp(path: &std::path::Path) -> io::Result<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.len(), m.mtime(), m.mtime_nsec()))
}

/// Builds a job's executor from a block of rows.
type BuildFn<T> = Arc<dyn Fn(Block) -> T + Send + Sync>;

/// The lineage of an executor over rows of an input file: read them again
/// (checking the file has not changed) and build the executor.
struct FromFile<T> {
    region: Arc<Region>,
    labels: Option<Arc<Checked<NpyInts>>>,
    weights: Option<Arc<Checked<NpyVector>>>,
    first: u64,
    rows: usize,
    dims: usize,
    /// The block's checksum at its first read.
    sum: OnceLock<u64>,
    /// Its labels' and weights' checksums at their first read.
    label_sum: OnceLock<u64>,
    weight_sum: OnceLock<u64>,
    build: BuildFn<T>,
    /// Counts the dataset's executors built at least once.
    built: Arc<AtomicUsize>,
    /// Whether this one was.
    counted: AtomicBool,
}

impl<T: Send + 'static> Lineage<T> for FromFile<T> {
    fn rebuild(&self) -> io::Result<T> {
        if !self.counted.swap(true, Ordering::Relaxed) {
            self.built.fetch_add(1, Ordering::Relaxed);
        }
        let (x, skip) = self
            .region
            .read_in_place(self.first, self.rows, &self.sum)?;
        let y = match &self.labels {
            Some(l) => l.read(self.first, self.rows, &self.label_sum)?,
            None => Vec::new(),
        };
        let w = match &self.weights {
            Some(c) => c.read(self.first, self.rows, &self.weight_sum)?,
            None => Vec::new(),
        };
        Ok((self.build)(Block {
            first: self.first,
            dims: self.dims,
            x,
            skip,
            y,
            w,
        }))
    }
}

/// The lineage of an executor over generated rows: generate them the first
/// time only. Regenerating costs more CPU than a spill round trip (about
/// 2.2 s per GiB against well under 1 s of mostly idle waiting), so the
/// executor spills after its first eviction.
struct Generated<T> {
    blobs: Arc<Blobs>,
    /// Whether the block carries its blob labels.
    labels: bool,
    weights: Option<Arc<Checked<NpyVector>>>,
    weight_sum: OnceLock<u64>,
    first: u64,
    rows: usize,
    build: BuildFn<T>,
    /// Counts the dataset's executors built at least once.
    built: Arc<AtomicUsize>,
    /// Whether this one was.
    counted: AtomicBool,
}

impl<T: Send + 'static> Lineage<T> for Generated<T> {
    fn rebuild(&self) -> io::Result<T> {
        if !self.counted.swap(true, Ordering::Relaxed) {
            self.built.fetch_add(1, Ordering::Relaxed);
        }
        let mut x = Vec::with_capacity(self.rows * self.blobs.dims());
        // Huge pages for the block, as for blocks read from a file: the
        // memory is reused by the spill loads that follow, and direct reads
        // into huge pages run several times faster on a virtual disk.
        super::region::huge_pages(x.spare_capacity_mut());
        self.blobs.points(self.first, self.rows, &mut x);
        let last = self.first + self.rows as u64;
        let y = if self.labels {
            (self.first..last).map(|i| self.blobs.label(i)).collect()
        } else {
            Vec::new()
        };
        let w = match &self.weights {
            Some(c) => c.read(self.first, self.rows, &self.weight_sum)?,
            None => Vec::new(),
        };
        Ok((self.build)(Block {
            first: self.first,
            dims: self.blobs.dims(),
            x,
            skip: 0,
            y,
            w,
        }))
    }

    fn repeatable(&self) -> bool {
        false
    }
}

/// Inserts the lazy executor of the `n` rows from `first` (of `dims`
/// columns), built from `lazy` by `build` when first needed (counting
/// builds in `built`).
fn insert_lazy<T>(
    rt: &Runtime,
    name: &str,
    size: usize,
    lazy: &Lazy,
    weights: &Option<Arc<Checked<NpyVector>>>,
    (first, n, dims): (u64, usize, usize),
    (build, built): (&BuildFn<T>, &Arc<AtomicUsize>),
) -> Result<Handle<T>>
where
    T: Default + Serialize + DeserializeOwned + Send + 'static,
{
    Ok(match lazy {
        Lazy::File(region, labels) => rt.insert_lazy(
            Some(name),
            size,
            FromFile {
                region: region.clone(),
                labels: labels.clone(),
                weights: weights.clone(),
                first,
                rows: n,
                dims,
                sum: OnceLock::new(),
                label_sum: OnceLock::new(),
                weight_sum: OnceLock::new(),
                build: build.clone(),
                built: built.clone(),
                counted: AtomicBool::new(false),
            },
        )?,
        Lazy::Generated(blobs, labels) => rt.insert_lazy(
            Some(name),
            size,
            Generated {
                blobs: blobs.clone(),
                labels: *labels,
                weights: weights.clone(),
                weight_sum: OnceLock::new(),
                first,
                rows: n,
                build: build.clone(),
                built: built.clone(),
                counted: AtomicBool::new(false),
            },
        )?,
    })
}

impl Loader<'_> {
    /// Declares the rows as executors built when first needed, with no
    /// load phase: file rows are read (and read again after each eviction,
    /// never spilled) by the runtime's loads, generated rows are generated
    /// on first use and spilled after their first eviction. Sources that
    /// cannot be read twice (a pipe) are loaded by [`Loader::load`]. Labels
    /// come with their rows: read from their file (checked like the rows)
    /// or derived from the generator.
    ///
    /// `bytes_per_row` is what one row of the built executor takes in
    /// memory (the runtime's estimate until it is built).
    pub(crate) fn load_lazy<T, F>(
        &self,
        rt: &Runtime,
        bytes_per_row: u64,
        build: F,
        progress: impl FnMut(u64, u64),
    ) -> Result<Partitioned<T>>
    where
        T: Default + Serialize + DeserializeOwned + Send + 'static,
        F: Fn(Block) -> T + Send + Sync + 'static,
    {
        let rows_src = Rows::open(self.source)?;
        let (rows, dims) = (rows_src.rows(), rows_src.dims());
        let region = rows_src.region()?.map(Arc::new);
        let blobs = match &rows_src {
            Rows::Synthetic(b, _) => Some(Arc::new(b.clone())),
            _ => None,
        };
        let lazy = match (region, blobs, self.labels) {
            (Some(r), _, None) => Lazy::File(r, None),
            (Some(r), _, Some(Labels::File(p))) => {
                let l = Checked::open(NpyInts::open(p)?, rows, "labels")?;
                Lazy::File(r, Some(Arc::new(l)))
            }
            (None, Some(b), None) => Lazy::Generated(b, false),
            (None, Some(b), Some(Labels::Blobs)) => Lazy::Generated(b, true),
            _ => {
                let (ds, _) = self.load(rt, move |b| (build(b), ()), progress)?;
                return Ok(ds);
            }
        };
        let weights = match self.weights {
            Some(p) => Some(Arc::new(open_weights(p, rows)?)),
            None => None,
        };
        let build: BuildFn<T> = Arc::new(build);
        let built = Arc::new(AtomicUsize::new(0));
        let blocks = self.blocks(rows, dims)?;
        let start = self.segments.and_then(|s| s.first()).map_or(0, |s| s.0);
        let mut parts = Vec::with_capacity(blocks.len());
        let mut part_rows = Vec::with_capacity(blocks.len());
        for (p, &(first, n)) in blocks.iter().enumerate() {
            let name = format!("{} {p}", self.name);
            let size = n as u64 * bytes_per_row;
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            let h = insert_lazy(
                rt,
                &name,
                size,
                &lazy,
                &weights,
                (first, n, dims),
                (&build, &built),
            )?;
            parts.push(h);
            part_rows.push(n as u32);
        }
        rt.hint_cycle(parts.iter().map(|h| h.id()));
        let mut progress = progress;
        progress(rows, rows);
        Ok(Partitioned {
            parts,
            part_rows,
            rows,
            first_row: start,
            dims,
            lazy: true,
            input: match &lazy {
                Lazy::File(r, _) => Some(r.clone()),
                Lazy::Generated(..) => None,
            },
            rows_at: Some(RowsAt {
                lazy,
                weights,
                built,
            }),
        })
    }

    /// The blocks `(first row, rows)` of a lazy load: `load`'s (4 bytes
    /// per value and per label); for one rank's share, blocks cut segment
    /// by segment from the share's first row.
    fn blocks(&self, rows: u64, dims: usize) -> Result<Vec<(u64, usize)>> {
        let row_bytes = 4 * dims as u64 + if self.labels.is_some() { 4 } else { 0 };
        let per = (self.part_bytes / row_bytes.max(1)).clamp(1, u64::from(u32::MAX));
        let whole = [(0, rows, per)];
        let segments = self.segments.unwrap_or(&whole);
        let mut blocks = Vec::new();
        let mut at = segments.first().map_or(0, |s| s.0);
        for &(a, b, per) in segments {
            if a != at || a > b || b > rows || per == 0 {
                return Err(Error::Input(format!(
                    "row segments must be consecutive, within the {rows} rows and cut into blocks of at least 1 row: {segments:?}"
                )));
            }
            let per = per.min(u64::from(u32::MAX));
            let mut first = a;
            while first < b {
                let n = per.min(b - first);
                blocks.push((first, n as usize));
                first += n;
            }
            at = b;
        }
        Ok(blocks)
    }
}
