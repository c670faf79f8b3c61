//! `outcore gen`: a synthetic dataset written to a `.npy` file.

use std::path::PathBuf;

use clap::Args;
use outcore::format_bytes;
use outcore_jobs::{check_room, check_writable, Result};

use super::progress::Feedback;
use super::synthetic_source;

/// Flags of `outcore gen`.
#[derive(Args, Debug)]
pub(super) struct GenArgs {
    /// Size of the data.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    synthetic: String,
    /// Dimensions.
    #[arg(long, default_value_t = 1000)]
    dims: usize,
    /// Number of blobs.
    #[arg(long, default_value_t = 100)]
    true_k: usize,
    /// Seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// The .npy file to write.
    #[arg(long, value_name = "FILE")]
    output: PathBuf,
}

/// Runs `outcore gen`.
pub(super) fn run(a: GenArgs) -> Result<()> {
    check_writable(&a.output)?;
    let src = synthetic_source(&a.synthetic, a.dims, a.true_k, a.seed)?;
    let (rows, dims) = src.shape()?;
    // The data and a header of at most a few KiB.
    check_room(&a.output, (rows * dims as u64 * 4).saturating_add(4096))?;
    let mut fb = Feedback::new();
    fb.stage("writing", rows);
    src.write_npy(&a.output, |done, _| fb.progress(done))?;
    fb.done();
    say!(
        "wrote {} ({rows} x {dims} float32) to {}",
        format_bytes(rows * dims as u64 * 4),
        a.output.display()
    );
    Ok(())
}
