//! The input layer shared by the jobs: where rows come from, how they are
//! read, and how they become executors.
//!
//! ```text
//!   Source ──────────► rows.rs: Rows ──────────► load.rs: Loader::load
//!   synthetic blobs    one reader per format     one executor per block of
//!   .npy  .fvecs       (sizes checked up front,  rows, inserted empty, the
//!   raw float32        rows streamed in order)   sweep order declared
//!                                                (hint_cycle), then filled:
//!   Labels ─── blobs or a .npy of ints ───────►  synthetic blocks by the
//!   (supervised jobs)                            workers, file blocks read
//!                                                here, room made first
//! ```
//!
//! A job says how a block of rows ([`Block`]) becomes its executor type
//! (K-means: a `Partition`; training: a `Shard`); everything else, from
//! opening the file to declaring the cycle, happens here once.
//!
//! Files:
//!
//! - `mod.rs` (this file): the sources ([`Source`], [`Labels`]);
//! - `rows.rs`: the row readers, one per format;
//! - `blobs.rs`: the one synthetic-data generator;
//! - `direct.rs`: direct reads of a byte range, several requests in flight;
//! - `region/`: any block of rows of an input file, read again (direct
//!   I/O);
//! - `digest.rs`: a digest of a fixed sample of a file, which ranks
//!   compare to check that they read the same file;
//! - `load.rs`: rows into executors, the sweep order declared, room made.

mod blobs;
mod digest;
mod direct;
mod load;
mod region;
mod rows;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::format_of;
use crate::npy::NpyWriter;
use crate::ranks::Ranks;

pub(crate) use blobs::{mix, Blobs};
pub(crate) use load::{Block, Loader};
pub use load::{InputReads, Partitioned};
use rows::Rows;

/// Where the data comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// Gaussian blobs: `rows` points in `dims` dimensions around `true_k`
    /// centres (uniform in `[-10, 10]^dims`, unit variance), all derived
    /// from `seed`. Point `i` depends only on the seed and `i`, so the data
    /// does not depend on how it is partitioned.
    Synthetic {
        /// Points.
        rows: u64,
        /// Dimensions.
        dims: usize,
        /// Number of blobs.
        true_k: usize,
        /// Seed.
        seed: u64,
    },
    /// A 2-D float C-order `.npy` file (float32, float64 or float16,
    /// either byte order).
    Npy(PathBuf),
    /// An array in a `.npz` archive (as [`Source::Npy`]): the one named
    /// (with or without `.npy`), or by default the first. Uncompressed
    /// members (`np.savez`) are read at any position like a `.npy`;
    /// compressed ones (`np.savez_compressed`) are read once, in order.
    Npz(PathBuf, Option<String>),
    /// An `.fvecs` file (each vector: its dimension as int32, then floats).
    Fvecs(PathBuf),
    /// Targets in a `.npy` file: as [`Source::Npy`], and a 1-D array is
    /// one column (see [`Source::targets`]).
    Column(PathBuf),
    /// Raw little-endian float32 with the given number of columns.
    Raw(PathBuf, usize),
}

impl Source {
    /// Picks the reader from the file name: `.npy`, `.npz` (its first
    /// array), `.fvecs`, or raw
    /// float32 with `dims` columns (which raw data needs; see
    /// [`Source::needs_dims`]).
    pub fn from_path(path: &Path, dims: Option<usize>) -> Result<Source> {
        Source::check_regular(path)?;
        let ext = format_of(path);
        match ext.as_str() {
            "npy" => Ok(Source::Npy(path.to_path_buf())),
            "npz" => Ok(Source::Npz(path.to_path_buf(), None)),
            "fvecs" => Ok(Source::Fvecs(path.to_path_buf())),
            _ => match dims {
                Some(d) if d > 0 => Ok(Source::Raw(path.to_path_buf(), d)),
                Some(_) => Err(Error::Input("dims must be at least 1".into())),
                None => Err(Error::Input(format!(
                    "{}: not a .npy, .npz or .fvecs file; raw float32 data needs its number of columns (dims)",
                    path.display()
                ))),
            },
        }
    }

    /// A file of targets, a row per data row: a `.npy` of one (1-D) or
    /// more (2-D) columns, or any other input [`Source::from_path`]
    /// reads.
    pub fn targets(path: &Path) -> Result<Source> {
        Source::check_regular(path)?;
        match format_of(path).as_str() {
            "npy" => Ok(Source::Column(path.to_path_buf())),
            _ => Source::from_path(path, None),
        }
    }

    /// Refuses an input that is not a regular file: a directory, or what
    /// partitions cannot be read again from by position (a pipe, a device,
    /// standard input `-`). A missing file passes (opening it names the
    /// error).
    pub fn check_regular(path: &Path) -> Result<()> {
        if path.is_dir() {
            return Err(Error::Input(format!(
                "{}: is a directory; the input must be a file (.npy, .npz, .fvecs or raw float32)",
                path.display()
            )));
        }
        let special = path.as_os_str() == "-"
            || std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir());
        if special {
            return Err(Error::Input(format!(
                "{}: not a regular file; the input must be a file, which the run reads again by position (pipes and standard input are not supported)",
                path.display()
            )));
        }
        Ok(())
    }

    /// The input file, for data read from one (not synthetic data).
    pub fn file(&self) -> Option<&Path> {
        match self {
            Source::Synthetic { .. } => None,
            Source::Npy(p)
            | Source::Npz(p, _)
            | Source::Fvecs(p)
            | Source::Raw(p, _)
            | Source::Column(p) => Some(p),
        }
    }

    /// Whether a file at `path` is read as raw float32, whose number of
    /// columns must be given (not `.npy`, `.npz` or `.fvecs`).
    pub fn needs_dims(path: &Path) -> bool {
        !matches!(format_of(path).as_str(), "npy" | "npz" | "fvecs")
    }

    /// Whether a file at `path` is a `.npz` archive (whose array can be
    /// chosen by name).
    pub fn is_archive(path: &Path) -> bool {
        format_of(path) == "npz"
    }

    /// For a `.npz` source, the same archive's array `key`; other sources
    /// unchanged.
    pub fn with_key(self, key: Option<String>) -> Source {
        match self {
            Source::Npz(p, _) => Source::Npz(p, key),
            other => other,
        }
    }

    /// Synthetic data of about `bytes` bytes of float32: `bytes / (4 *
    /// dims)` points (none when `bytes` is smaller than one point, which
    /// loading reports as data with no rows).
    pub fn synthetic(bytes: u64, dims: usize, true_k: usize, seed: u64) -> Source {
        Source::Synthetic {
            rows: bytes / (4 * dims.max(1) as u64),
            dims,
            true_k,
            seed,
        }
    }

    /// Rows and columns, read from the file's header or size (and checked
    /// against it) without reading the data.
    pub fn shape(&self) -> Result<(u64, usize)> {
        let r = Rows::open(self)?;
        Ok((r.rows(), r.dims()))
    }

    /// Writes the data to a float32 `.npy` file (atomically), a block of
    /// rows at a time; synthetic blocks are generated on all cores.
    /// `progress` is called with the rows written so far and the total.
    /// Returns the shape written.
    pub fn write_npy(
        &self,
        path: &Path,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<(u64, usize)> {
        let mut rows = Rows::open(self)?;
        let (n, dims) = (rows.rows(), rows.dims());
        let mut w = NpyWriter::<f32>::create(path, &[n, dims as u64])?;
        // About 8 MiB per core at a time.
        let threads = std::thread::available_parallelism().map_or(2, |t| t.get()) as u64;
        let block = ((8 << 20) / (4 * dims as u64)).max(1) * threads;
        let mut buf = Vec::new();
        let mut first = 0;
        while first < n {
            let len = block.min(n - first) as usize;
            buf.clear();
            rows.read(first, len, &mut buf)?;
            w.write(&buf)?;
            first += len as u64;
            progress(first, n);
        }
        w.finish()?;
        Ok((n, dims))
    }
}

/// What ranks compare ([`Ranks::agree`]) to check that they read the
/// same input `files` (the data, its labels or weights; `None`s are
/// skipped), and not a stale copy of one on some node: for each file, its
/// name in the error and the digest of a fixed sample of its bytes
/// (`digest.rs`). Nothing on one process, which has no copy to compare
/// with.
///
/// # Errors
///
/// [`Error::Io`] when a file cannot be read.
pub(crate) fn digests(ranks: &Ranks, files: &[Option<&Path>]) -> Result<Vec<(String, u64)>> {
    if ranks.size() < 2 {
        return Ok(Vec::new());
    }
    files
        .iter()
        .flatten()
        .map(|p| {
            let name = format!(
                "the contents of {} (a digest of its size and a fixed sample of its bytes)",
                p.display()
            );
            Ok((name, digest::sample_digest(p)?))
        })
        .collect()
}

/// Reads any block of rows of an input file, as K-means' partitions do
/// when they are rebuilt after an eviction: large direct reads (four 1 MiB
/// pieces in flight), checked against the file as first seen.
#[derive(Debug)]
pub struct BlockReader {
    region: region::Region,
    rows: u64,
}

impl BlockReader {
    /// Opens a file source (`.npy`, `.fvecs`, raw float32). Generated data
    /// and files that cannot be read twice (pipes, devices) have no block
    /// reader.
    pub fn open(src: &Source) -> Result<BlockReader> {
        let rows = Rows::open(src)?;
        let n = rows.rows();
        match rows.region()? {
            Some(region) => Ok(BlockReader { region, rows: n }),
            None => Err(Error::Input("block reads need a regular input file".into())),
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Rows `first..first + n` as row-major float32 values into `out`
    /// (cleared first), copied from the page cache when the file stores
    /// float32 and they are all there (not validated then: see
    /// [`read`](Self::read)); else `false`, `out` then unspecified.
    pub fn read_cached(&self, first: u64, n: usize, out: &mut Vec<f32>) -> Result<bool> {
        if first.saturating_add(n as u64) > self.rows {
            return Ok(false);
        }
        self.region
            .read_cached(first, n, out)
            .map_err(|e| crate::error::BadValue::of_read(&e))
    }

    /// Rows `first..first + n` as row-major float32 values.
    pub fn read(&self, first: u64, n: usize) -> Result<Vec<f32>> {
        if first.saturating_add(n as u64) > self.rows {
            return Err(Error::Input(format!(
                "rows {first}..{} are past the last row ({})",
                first.saturating_add(n as u64),
                self.rows
            )));
        }
        self.region
            .read(first, n, &std::sync::OnceLock::new())
            .map_err(|e| crate::error::BadValue::of_read(&e))
    }
}

/// Where the labels of a supervised job come from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Labels {
    /// The blob each point of a [`Source::Synthetic`] was drawn from.
    Blobs,
    /// A 1-D int32/int64 `.npy` file, one label per row.
    File(PathBuf),
}
