//! `outcore train`: logistic regression with model state in executors.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use outcore::{format_bytes, MemoryCap, Stats};
use outcore_jobs::train::{self, TrainConfig};
use outcore_jobs::{check_writable, npy, write_json, Error, Labels, Result};
use serde::Serialize;

use super::progress::Feedback;
use super::{file_source, positive, runtime, synthetic_source, warn_failed_writes, MemoryArgs};

/// Flags of `outcore train`.
#[derive(Args, Debug)]
pub(super) struct TrainArgs {
    /// Inputs: .npy (2-D float32/float64), .fvecs, or raw float32 (with
    /// --dims). Without it, synthetic data.
    #[arg(long, value_name = "FILE", requires = "targets")]
    input: Option<PathBuf>,
    /// Labels for --input: a 1-D int32/int64 .npy file, one per row.
    #[arg(long, value_name = "FILE", requires = "input")]
    targets: Option<PathBuf>,
    /// Size of the synthetic data.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "512MiB",
        allow_hyphen_values = true
    )]
    synthetic: String,
    /// Dimensions of synthetic data, or columns of a raw input file.
    #[arg(long, value_name = "D")]
    dims: Option<usize>,
    /// Classes (synthetic data: one Gaussian blob each). Default for a file:
    /// the largest label + 1.
    #[arg(long, value_name = "C")]
    classes: Option<usize>,
    /// Seed for the synthetic data and the held-out split.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    mem: MemoryArgs,
    /// Rounds of local SGD followed by model averaging.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Local epochs per round.
    #[arg(long, default_value_t = 1)]
    local_epochs: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    lr: f32,
    /// Mini-batch size of the local SGD.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Fraction of the rows held out for the accuracy report.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    holdout: f64,
    /// Write the model (float32, classes x (D + 1), bias last) to this .npy
    /// file.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Serialize)]
struct TrainStats<'a> {
    rows: u64,
    dims: usize,
    classes: usize,
    shards: usize,
    round_seconds: Vec<f64>,
    accuracy: Vec<f64>,
    evictions: u64,
    trap_evictions: u64,
    clean_evictions: u64,
    loads: u64,
    bytes_written: u64,
    bytes_read: u64,
    peak_bytes: u64,
    wall_seconds: f64,
    mem_cap_bytes: Option<u64>,
    runtime: &'a Stats,
}

/// Runs `outcore train`.
pub(super) fn run(a: TrainArgs) -> Result<()> {
    let wall = Instant::now();
    for p in [&a.output, &a.mem.stats].into_iter().flatten() {
        check_writable(p)?;
    }
    positive("--batch", a.batch)?;
    positive("--local-epochs", a.local_epochs)?;
    positive("--rounds", a.rounds)?;
    if !(a.lr.is_finite() && a.lr > 0.0) {
        return Err(Error::Input(format!(
            "--lr must be a positive number, not {}",
            a.lr
        )));
    }
    if !(0.0..1.0).contains(&a.holdout) {
        return Err(Error::Input(format!(
            "--holdout must be in [0, 1), not {}",
            a.holdout
        )));
    }
    let (src, labels, classes) = match (&a.input, &a.targets) {
        (Some(x), Some(y)) => (file_source(x, a.dims)?, Labels::File(y.clone()), a.classes),
        _ => {
            let classes = positive("--classes", a.classes.unwrap_or(10))?;
            let src = synthetic_source(&a.synthetic, a.dims.unwrap_or(256), classes, a.seed)?;
            (src, Labels::Blobs, Some(classes))
        }
    };
    let (rows, dims) = src.shape()?;
    let data_bytes = rows * dims as u64 * 4;
    let default_cap = match a.input {
        None => MemoryCap::Bytes(256 << 20),
        Some(_) => MemoryCap::Auto,
    };
    let (rt, shard_bytes) = runtime(&a.mem, default_cap, data_bytes)?;
    let cfg = TrainConfig {
        rounds: a.rounds,
        local_epochs: a.local_epochs,
        lr: a.lr,
        batch: a.batch,
        holdout: a.holdout,
        seed: a.seed,
    };
    let mut fb = Feedback::new();
    fb.stage("loading", rows);
    let job = train::load(&rt, &src, &labels, classes, shard_bytes, &cfg, |done, _| {
        fb.progress(done)
    })?;
    fb.done();
    eprintln!(
        "outcore train: {} rows x {} dims ({}), {} classes, {} shards, cap {}, {} workers",
        job.rows,
        job.dims,
        format_bytes(data_bytes),
        job.classes,
        job.shards.len(),
        rt.cap().map_or("none".into(), format_bytes),
        rt.workers()
    );
    let mut last = rt.stats();
    let out = train::train(&rt, &job, &cfg, |r| {
        let s = rt.stats();
        eprintln!(
            "round {}/{}: {:.2}s, held-out accuracy {:.2}%, evictions {}, loads {}, read {}, written {}",
            r.index + 1,
            cfg.rounds,
            r.seconds,
            r.accuracy * 100.0,
            s.evictions - last.evictions,
            s.loads - last.loads,
            format_bytes(s.bytes_read - last.bytes_read),
            format_bytes(s.bytes_written - last.bytes_written),
        );
        last = s;
    })?;
    if let Some(p) = &a.output {
        npy::write_array(p, &[job.classes as u64, job.dims as u64 + 1], &out.model.w)?;
    }
    let s = rt.stats();
    warn_failed_writes(&rt, &s);
    let wall_seconds = wall.elapsed().as_secs_f64();
    if let Some(p) = &a.mem.stats {
        write_json(
            p,
            &TrainStats {
                rows: job.rows,
                dims: job.dims,
                classes: job.classes,
                shards: job.shards.len(),
                round_seconds: out.rounds.iter().map(|r| r.seconds).collect(),
                accuracy: out.rounds.iter().map(|r| r.accuracy).collect(),
                evictions: s.evictions,
                trap_evictions: s.trap_evictions,
                clean_evictions: s.clean_evictions,
                loads: s.loads,
                bytes_written: s.bytes_written,
                bytes_read: s.bytes_read,
                peak_bytes: s.peak_bytes,
                wall_seconds,
                mem_cap_bytes: rt.cap(),
                runtime: &s,
            },
        )?;
    }
    eprintln!(
        "done in {wall_seconds:.1}s: held-out accuracy {:.2}%; peak {}; evictions {}, loads {}, read {}, written {}",
        out.rounds.last().map_or(0.0, |r| r.accuracy * 100.0),
        format_bytes(s.peak_bytes),
        s.evictions,
        s.loads,
        format_bytes(s.bytes_read),
        format_bytes(s.bytes_written)
    );
    Ok(())
}
