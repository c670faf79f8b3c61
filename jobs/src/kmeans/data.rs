//! K-means' data: partitions of rows with their squared norms, loaded
//! through the input layer.

use std::path::Path;

use outcore::{PodVec, Runtime};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::input::{Loader, Partitioned, Source};
use crate::Session;

/// One partition of the data: a block of consecutive rows and their squared
/// norms (for the GEMM distance identity). Read-only during K-means, so it
/// is evicted clean after its first write.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Partition {
    /// Global index of the first row.
    pub first_row: u64,
    /// Rows held.
    pub rows: u32,
    /// Columns.
    pub dims: u32,
    /// Row-major `rows x dims` values, from `data[skip]` on (see
    /// [`values`](Self::values)).
    pub data: PodVec<f32>,
    /// Elements of `data` before the first row's values: a partition read
    /// from a file in place starts where its first row's page starts, so
    /// the read needs no copy. 0 for partitions built from values.
    pub skip: u32,
    /// `|x|^2` of each row.
    pub norms: PodVec<f32>,
    /// The sample weight of each row; empty when the data has none.
    pub weights: PodVec<f32>,
}

impl Partition {
    /// Builds a partition from row-major values.
    pub fn new(first_row: u64, dims: usize, data: Vec<f32>) -> Partition {
        let rows = data.len() / dims.max(1);
        let norms: Vec<f32> = data.chunks_exact(dims.max(1)).map(norm2).collect();
        Partition {
            first_row,
            rows: rows as u32,
            dims: dims as u32,
            data: PodVec::from(data),
            skip: 0,
            norms: PodVec::from(norms),
            weights: PodVec::new(),
        }
    }

    /// Builds a partition from row-major values and their rows' sample
    /// weights (empty: none).
    pub fn with_weights(
        first_row: u64,
        dims: usize,
        data: Vec<f32>,
        weights: Vec<f32>,
    ) -> Partition {
        let mut p = Partition::new(first_row, dims, data);
        p.weights = PodVec::from(weights);
        p
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        let d = self.dims as usize;
        &self.values()[i * d..(i + 1) * d]
    }

    /// The row-major `rows x dims` values.
    pub fn values(&self) -> &[f32] {
        &self.data[self.skip as usize..]
    }
}

/// `|x|^2`, summed in 16 independent lanes (so the compiler vectorises
/// it) and then across them, always in the same order: the result depends
/// only on `x`.
pub(crate) fn norm2(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for v in tail {
        s += v * v;
    }
    s
}

/// The partitions of a dataset held by a runtime.
pub type Dataset = Partitioned<Partition>;

/// [`load`](super::load), with the partitions' size settled: `part_bytes`
/// as the run's working memory allows.
pub(super) fn load(
    session: &Session,
    src: &Source,
    weights: Option<&Path>,
    cfg: Option<&super::Config>,
    part_bytes: u64,
    progress: impl FnMut(u64, u64),
) -> Result<Dataset> {
    let segments = match cfg {
        Some(cfg) => {
            let ranks = session.ranks();
            let (rows, dims) = src.shape()?;
            let files = crate::input::digests(ranks, &[src.file(), weights])?;
            let mut names = vec!["the rows", "the dimensions", "k", "the settings (a hash)"];
            let mut values = vec![rows, dims as u64, cfg.k as u64, crate::ranks::hash_of(cfg)];
            names.extend(files.iter().map(|(n, _)| n.as_str()));
            values.extend(files.iter().map(|&(_, d)| d));
            ranks.agree(&names, &values)?;
            Some(super::shards::segments(rows, dims, cfg, ranks, part_bytes)?)
        }
        None => None,
    };
    let rt = session.runtime();
    let ds = load_segments(rt, src, weights, segments.as_deref(), part_bytes, progress)?;
    session.add_reads(ds.input_reads());
    Ok(ds)
}

/// The partitions of `segments` (all rows when `None`; see
/// `Loader::segments`).
fn load_segments(
    rt: &Runtime,
    src: &Source,
    weights: Option<&Path>,
    segments: Option<&[(u64, u64, u64)]>,
    part_bytes: u64,
    progress: impl FnMut(u64, u64),
) -> Result<Dataset> {
    let loader = Loader {
        source: src,
        labels: None,
        weights,
        part_bytes,
        name: "partition",
        segments,
    };
    // A row takes its values, its norm and its weight.
    let bytes_per_row = 4 * src.shape()?.1 as u64 + if weights.is_some() { 8 } else { 4 };
    // A partition's row norms are computed each time it is built, from
    // the values just read: one pass over data already in cache, and
    // nothing row-sized kept outside the executors (on one-column data
    // the norms are as large as the data).
    loader.load_lazy(
        rt,
        bytes_per_row,
        |b| {
            let values = &b.x[b.skip..];
            let norms: Vec<f32> = values.chunks_exact(b.dims.max(1)).map(norm2).collect();
            Partition {
                first_row: b.first,
                rows: norms.len() as u32,
                dims: b.dims as u32,
                skip: b.skip as u32,
                data: PodVec::from(b.x),
                norms: PodVec::from(norms),
                weights: PodVec::from(b.w),
            }
        },
        progress,
    )
}
