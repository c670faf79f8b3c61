//! The input layer the jobs share: where rows come from (synthetic
//! Gaussian blobs, `.npy`, `.fvecs`, raw float32), reading them in order,
//! and streaming them into partition executors whose sweep order is
//! declared to the runtime, so the whole dataset is never held in memory
//! at once.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use rand_distr::StandardNormal;

use outcore::{CycleId, Handle, Runtime};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::npy::NpyRows;

/// Where the data comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// Gaussian blobs: `rows` points in `dims` dimensions around `true_k`
    /// centres, all derived from `seed` (point `i` depends only on the seed
    /// and `i`, so the data does not depend on how it is partitioned).
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
    /// A 2-D float32/float64 C-order `.npy` file.
    Npy(PathBuf),
    /// An `.fvecs` file (each vector: its dimension as int32, then floats).
    Fvecs(PathBuf),
    /// Raw little-endian float32 with the given number of columns.
    Raw(PathBuf, usize),
}

impl Source {
    /// Picks the reader from the file name: `.npy`, `.fvecs`, or raw
    /// float32 when `dims` is given.
    pub fn from_path(path: &Path, dims: Option<usize>) -> Result<Source> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        match ext.as_str() {
            "npy" => Ok(Source::Npy(path.to_path_buf())),
            "fvecs" => Ok(Source::Fvecs(path.to_path_buf())),
            _ => match dims {
                Some(d) if d > 0 => Ok(Source::Raw(path.to_path_buf(), d)),
                _ => Err(Error::Input(format!(
                    "{}: not a .npy or .fvecs file; raw float32 data needs its number of columns",
                    path.display()
                ))),
            },
        }
    }

    /// Whether `path` is read as raw float32, which needs the number of
    /// columns (it is neither `.npy` nor `.fvecs`).
    pub fn needs_dims(path: &Path) -> bool {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        !matches!(ext.as_str(), "npy" | "fvecs")
    }

    /// Synthetic data of about `bytes` bytes.
    pub fn synthetic(bytes: u64, dims: usize, true_k: usize, seed: u64) -> Source {
        Source::Synthetic {
            rows: (bytes / (4 * dims.max(1) as u64)).max(1),
            dims,
            true_k: true_k.max(1),
            seed,
        }
    }
}

/// Row reader over any source.
pub enum Rows {
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
    /// Opens a source, validating its shape and size up front.
    pub fn open(src: &Source) -> Result<Rows> {
        match src {
            Source::Synthetic {
                rows,
                dims,
                true_k,
                seed,
            } => {
                if *dims == 0 {
                    return Err(Error::Input(
                        "synthetic data needs at least 1 dimension".into(),
                    ));
                }
                Ok(Rows::Synthetic(Blobs::new(*dims, *true_k, *seed), *rows))
            }
            Source::Npy(p) => {
                if p.is_dir() {
                    return Err(Error::Input(format!("{}: is a directory", p.display())));
                }
                Ok(Rows::Npy(NpyRows::open(p)?))
            }
            Source::Fvecs(p) => {
                let (file, len) = open_len(p)?;
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
                let (file, _) = open_len(p)?;
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
                let (file, len) = open_len(p)?;
                let rec = 4 * *dims as u64;
                if len == 0 || len % rec != 0 {
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
    pub fn rows(&self) -> u64 {
        match self {
            Rows::Synthetic(_, n) => *n,
            Rows::Npy(r) => r.rows(),
            Rows::Plain { rows, .. } => *rows,
        }
    }

    /// Number of columns.
    pub fn dims(&self) -> usize {
        match self {
            Rows::Synthetic(b, _) => b.dims,
            Rows::Npy(r) => r.cols(),
            Rows::Plain { dims, .. } => *dims,
        }
    }

    /// Appends rows `first..first + n` to `out` (rows are read in order).
    pub fn read(&mut self, first: u64, n: usize, out: &mut Vec<f32>) -> Result<()> {
        match self {
            Rows::Synthetic(b, _) => {
                b.points(first, n, out);
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
                    .map_err(|e| Error::Input(format!("{}: read failed: {e}", path.display())))?;
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

fn open_len(p: &Path) -> Result<(File, u64)> {
    if p.is_dir() {
        return Err(Error::Input(format!("{}: is a directory", p.display())));
    }
    let f =
        File::open(p).map_err(|e| Error::Input(format!("{}: cannot open: {e}", p.display())))?;
    let len = f
        .metadata()
        .map_err(|e| Error::Input(format!("{}: {e}", p.display())))?
        .len();
    Ok((f, len))
}

/// Gaussian blobs: centres uniform in `[-10, 10]^dims`, unit variance.
#[derive(Clone, Debug)]
pub struct Blobs {
    dims: usize,
    centres: Vec<f32>,
    true_k: usize,
    seed: u64,
}

impl Blobs {
    /// The blob model for a seed.
    pub fn new(dims: usize, true_k: usize, seed: u64) -> Blobs {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0xb10b_5eed);
        let centres = (0..true_k * dims)
            .map(|_| rng.random_range(-10.0f32..10.0))
            .collect();
        Blobs {
            dims,
            centres,
            true_k,
            seed,
        }
    }

    /// The blob point `i` belongs to.
    pub fn label(&self, i: u64) -> usize {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(mix(self.seed, i));
        (rng.random::<u64>() % self.true_k as u64) as usize
    }

    /// Appends points `first..first + n`.
    pub fn points(&self, first: u64, n: usize, out: &mut Vec<f32>) {
        out.reserve(n * self.dims);
        for i in first..first + n as u64 {
            self.point(i, out);
        }
    }

    /// The number of dimensions.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Appends point `i`.
    pub fn point(&self, i: u64, out: &mut Vec<f32>) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(mix(self.seed, i));
        let blob = (rng.random::<u64>() % self.true_k as u64) as usize;
        let c = &self.centres[blob * self.dims..(blob + 1) * self.dims];
        out.extend(c.iter().map(|&m| m + rng.sample::<f32, _>(StandardNormal)));
    }
}

/// A 64-bit mix of two values (splitmix64 finaliser).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Executors filled from a source, one per block of consecutive rows, in
/// row order, swept in that order.
#[derive(Debug)]
pub struct Parts<T> {
    /// One handle per block, in row order.
    pub handles: Vec<Handle<T>>,
    /// Rows in each block.
    pub part_rows: Vec<u32>,
    /// Total rows.
    pub rows: u64,
    /// Columns.
    pub dims: usize,
    /// The sweep order declared for the blocks.
    pub cycle: CycleId,
}

/// Rows per partition for partitions of about `part_bytes` of float32
/// rows of `dims` columns (plus `extra_per_row` bytes per row).
pub fn rows_per_partition(part_bytes: u64, dims: usize, extra_per_row: u64) -> u64 {
    (part_bytes / (4 * dims as u64 + extra_per_row).max(1)).clamp(1, u64::from(u32::MAX))
}

/// Streams `src` into executors of `rows_per_part(dims)` rows each (the
/// last one shorter), named `"{name} {index}"`.
///
/// The executors are inserted empty (`T::default()`) and their sweep order
/// declared first, so that what the cap pushes out while the data comes in
/// is already what the sweeps would evict. Each block then becomes
/// `make(first_row, dims, values, side)`, run as a write task on its
/// executor: `values` are the block's rows (row-major, `dims` columns), and `side` is what
/// `side(first_row, rows)` returned on the calling thread, in row order
/// (labels read from another file, say). Synthetic rows are generated by
/// the workers, in parallel; file rows are read on the calling thread.
/// `progress` is called with the rows loaded so far and the total.
///
/// # Errors
///
/// [`Error::Input`] for a source that cannot be read or has no rows, and
/// whatever `side` or the runtime returns.
pub fn partition<T, S, F>(
    rt: &Runtime,
    src: &Source,
    rows_per_part: impl FnOnce(usize) -> u64,
    name: &str,
    mut side: impl FnMut(u64, usize) -> Result<S>,
    make: F,
    mut progress: impl FnMut(u64, u64),
) -> Result<Parts<T>>
where
    T: Serialize + DeserializeOwned + Default + Send + 'static,
    S: Send + 'static,
    F: Fn(u64, usize, Vec<f32>, S) -> T + Clone + Send + 'static,
{
    let mut rows_src = Rows::open(src)?;
    let rows = rows_src.rows();
    let dims = rows_src.dims();
    if rows == 0 {
        return Err(Error::Input("the data has no rows".into()));
    }
    let per = rows_per_part(dims).clamp(1, u64::from(u32::MAX));
    let nparts = rows.div_ceil(per);
    let mut handles = Vec::with_capacity(nparts as usize);
    let mut part_rows = Vec::with_capacity(nparts as usize);
    for p in 0..nparts {
        handles.push(rt.insert_named(Some(&format!("{name} {p}")), T::default())?);
        part_rows.push(per.min(rows - p * per) as u32);
    }
    let cycle = rt.hint_cycle(handles.iter().map(|h| h.id()));
    if let Rows::Synthetic(blobs, _) = &rows_src {
        // One generating task per block: the workers fill them in parallel
        // and the runtime spills them as the cap requires.
        let group = (rt.workers() * 2).max(1);
        let mut done = 0u64;
        for (g, (hs, ns)) in handles
            .chunks(group)
            .zip(part_rows.chunks(group))
            .enumerate()
        {
            // The tasks build their blocks from nothing: make room for what
            // the running ones will allocate.
            let running = ns
                .iter()
                .take(rt.workers())
                .map(|&n| n as usize * dims * 4)
                .sum();
            rt.make_room(running);
            let mut b = rt.batch();
            for (i, (h, &n)) in hs.iter().zip(ns).enumerate() {
                let first = (g * group + i) as u64 * per;
                let s = side(first, n as usize)?;
                let (blobs, make) = (blobs.clone(), make.clone());
                b.write(h, move |p: &mut T| {
                    let mut data = Vec::new();
                    blobs.points(first, n as usize, &mut data);
                    *p = make(first, dims, data, s);
                });
            }
            b.run()?;
            done += ns.iter().map(|&n| u64::from(n)).sum::<u64>();
            progress(done, rows);
        }
    } else {
        // Read on this thread, one block at a time, each handed to its
        // executor by a write task.
        let mut first = 0u64;
        for (h, &n) in handles.iter().zip(&part_rows) {
            let n = n as usize;
            rt.make_room(n * dims * 4);
            let mut data = Vec::with_capacity(n * dims);
            rows_src.read(first, n, &mut data)?;
            let s = side(first, n)?;
            let make = make.clone();
            let start = first;
            rt.write(h, move |p: &mut T| *p = make(start, dims, data, s))?;
            first += n as u64;
            progress(first, rows);
        }
    }
    Ok(Parts {
        handles,
        part_rows,
        rows,
        dims,
        cycle,
    })
}
