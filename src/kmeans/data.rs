//! Data for K-means: synthetic Gaussian blobs and files (`.npy`, `.fvecs`,
//! raw float32), streamed into partition executors so the whole dataset is
//! never held in memory at once.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::npy::NpyRows;
use crate::{Handle, PodVec, Runtime};

/// One partition of the data: a block of consecutive rows and their squared
/// norms (for the GEMM distance identity). Read-only during K-means, so it
/// is evicted clean after its first write.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Partition {
    /// Global index of the first row.
    pub first_row: u64,
    /// Rows held.
    pub rows: u32,
    /// Columns.
    pub dims: u32,
    /// Row-major `rows x dims` values.
    pub data: PodVec<f32>,
    /// `|x|^2` of each row.
    pub norms: PodVec<f32>,
}

impl Partition {
    /// Builds a partition from row-major values.
    pub fn new(first_row: u64, dims: usize, data: Vec<f32>) -> Partition {
        let rows = data.len() / dims.max(1);
        let norms = data
            .chunks_exact(dims)
            .map(|r| r.iter().map(|x| x * x).sum())
            .collect();
        Partition {
            first_row,
            rows: rows as u32,
            dims: dims as u32,
            data: PodVec(data),
            norms: PodVec(norms),
        }
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        let d = self.dims as usize;
        &self.data[i * d..(i + 1) * d]
    }
}

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
                    "{}: not a .npy or .fvecs file; for raw float32 data give --dims",
                    path.display()
                ))),
            },
        }
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
                    return Err(Error::Input("--dims must be at least 1".into()));
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
                for i in first..first + n as u64 {
                    b.point(i, out);
                }
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

/// The partitions of a dataset held by a runtime.
pub struct Dataset {
    /// One handle per partition, in row order.
    pub parts: Vec<Handle<Partition>>,
    /// Rows per partition.
    pub part_rows: Vec<u32>,
    /// Total rows.
    pub rows: u64,
    /// Columns.
    pub dims: usize,
}

/// Rows per partition for partitions of about `part_bytes`.
pub fn rows_per_partition(part_bytes: u64, dims: usize) -> u64 {
    (part_bytes / (4 * dims as u64).max(1)).max(1)
}

/// Streams `src` into partitions of about `part_bytes` each. Synthetic data is
/// generated by the runtime's workers, in parallel, one task per partition.
/// `progress` is called with the rows loaded so far.
pub fn load(
    rt: &Runtime,
    src: &Source,
    part_bytes: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<Dataset> {
    let mut rows_src = Rows::open(src)?;
    let rows = rows_src.rows();
    let dims = rows_src.dims();
    if rows == 0 {
        return Err(Error::Input("the data has no rows".into()));
    }
    let rows_per_part = rows_per_partition(part_bytes, dims).min(u32::MAX as u64);
    let nparts = rows.div_ceil(rows_per_part);
    let mut parts = Vec::with_capacity(nparts as usize);
    let mut part_rows = Vec::with_capacity(nparts as usize);
    // Empty partitions first and the cycle declared, so that what the cap
    // pushes out while the data comes in is already what the sweeps would
    // evict (the resident set is spread over the cycle).
    for p in 0..nparts {
        let first = p * rows_per_part;
        parts.push(rt.insert_named(
            Some(&format!("partition {p}")),
            Partition::new(first, dims, Vec::new()),
        )?);
        part_rows.push(rows_per_part.min(rows - first) as u32);
    }
    rt.hint_cycle(parts.iter().map(|h| h.id()));
    if let Rows::Synthetic(blobs, _) = &rows_src {
        // One generating task per partition: the workers fill them in
        // parallel and the runtime spills them as the cap requires.
        let group = (rt.workers() * 2).max(1);
        let mut done = 0u64;
        for (hs, ns) in parts.chunks(group).zip(part_rows.chunks(group)) {
            // The tasks build their partitions from nothing: make room for
            // what the running ones will allocate.
            let running = ns
                .iter()
                .take(rt.workers())
                .map(|&n| n as usize * dims * 4)
                .sum();
            rt.make_room(running);
            let mut b = rt.batch();
            for (h, &n) in hs.iter().zip(ns) {
                let blobs = blobs.clone();
                b.write(h, move |p: &mut Partition| {
                    let mut data = Vec::with_capacity(n as usize * dims);
                    for i in p.first_row..p.first_row + u64::from(n) {
                        blobs.point(i, &mut data);
                    }
                    *p = Partition::new(p.first_row, dims, data);
                });
            }
            b.run()?;
            done += ns.iter().map(|&n| u64::from(n)).sum::<u64>();
            progress(done, rows);
        }
    } else {
        // Read on this thread, one partition at a time, each handed to its
        // executor by a write task.
        let mut first = 0u64;
        for (h, &n) in parts.iter().zip(&part_rows) {
            let n = n as usize;
            rt.make_room(n * dims * 4);
            let mut data = Vec::with_capacity(n * dims);
            rows_src.read(first, n, &mut data)?;
            let mut b = rt.batch();
            b.write(h, move |p: &mut Partition| {
                *p = Partition::new(p.first_row, dims, data);
            });
            b.run()?;
            first += n as u64;
            progress(first, rows);
        }
    }
    Ok(Dataset {
        parts,
        part_rows,
        rows,
        dims,
    })
}
