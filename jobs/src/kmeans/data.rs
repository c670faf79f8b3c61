//! K-means data: partitions of rows with their squared norms, loaded
//! through the shared input layer ([`crate::input`]).

use outcore::{Handle, PodVec, Runtime};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::input::{self, Source};

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

/// The partitions of a dataset held by a runtime.
#[derive(Debug)]
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

/// Streams `src` into partitions of about `part_bytes` each (see
/// [`input::partition`]). `progress` is called with the rows loaded so far
/// and the total.
///
/// # Errors
///
/// As [`input::partition`].
pub fn load(
    rt: &Runtime,
    src: &Source,
    part_bytes: u64,
    progress: impl FnMut(u64, u64),
) -> Result<Dataset> {
    let parts = input::partition(
        rt,
        src,
        |dims| input::rows_per_partition(part_bytes, dims, 0),
        "partition",
        |_, _| Ok(()),
        |first, dims, data, ()| Partition::new(first, dims, data),
        progress,
    )?;
    Ok(Dataset {
        parts: parts.handles,
        part_rows: parts.part_rows,
        rows: parts.rows,
        dims: parts.dims,
    })
}
