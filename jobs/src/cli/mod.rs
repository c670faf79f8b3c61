//! Argument parsing, the checks that name flags, and the subcommands (one
//! file each).
//!
//! The library speaks of its parameters; this module checks every flag
//! before the library sees it, so that a bad value is reported by the flag
//! the user typed.

mod gen;
mod interrupt;
mod kmeans;
mod plot;
mod predict;
mod progress;
mod train;

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use outcore::{format_bytes, parse_size, EvictionPolicy, MemoryCap, Runtime, Stats};
use outcore_jobs::timeline::{self, Timeline};
use outcore_jobs::{Error, InputReads, Result, Source};

pub use interrupt::interrupted;

/// outcore: memory-hungry iterative jobs under a memory cap.
#[derive(Parser, Debug)]
#[command(name = "outcore", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// K-means (mini-batch or Lloyd) on data larger than the memory cap.
    ///
    /// With no arguments: a demonstration on 2 GiB of synthetic data under a
    /// 1 GiB cap, k = 100.
    Kmeans(Box<kmeans::KmeansArgs>),
    /// Label rows with trained centroids (nearest centre) or a trained
    /// model (largest score), streaming the input under the cap.
    Predict(Box<predict::PredictArgs>),
    /// Write a synthetic Gaussian-blob dataset to a .npy file.
    Gen(gen::GenArgs),
    /// Multinomial logistic regression by local SGD with model averaging,
    /// each shard's model replica held in its executor.
    ///
    /// With no arguments: 512 MiB of synthetic data (10 classes) under a
    /// 256 MiB cap.
    Train(Box<train::TrainArgs>),
    /// Draw a memory timeline (written by --timeline) as a PNG: memory
    /// against the cap, phases, loads and evictions, disk traffic.
    Plot(plot::PlotArgs),
}

/// Memory and runtime flags shared by the jobs.
#[derive(Args, Debug, Clone)]
struct MemoryArgs {
    /// Memory cap: a size (512MiB, 2GiB, 1.5G), `auto` or `none`. Default:
    /// 1GiB for synthetic data, `auto` for a file.
    #[arg(long, value_name = "SIZE|auto|none", allow_hyphen_values = true)]
    mem_cap: Option<MemoryCap>,
    /// Directory for spill files (a private subdirectory is made inside and
    /// removed at exit). Default: the system temporary directory.
    #[arg(long, value_name = "DIR")]
    spill_dir: Option<PathBuf>,
    /// Worker threads. Default: one per core.
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Number of data partitions (executors). Default: sized so a partition
    /// is 1/64 of the cap (64 MiB with no cap), rounded to whole tasks.
    #[arg(long, value_name = "P")]
    partitions: Option<u64>,
    /// Eviction policy.
    #[arg(long, value_name = "priority|lru", default_value = "priority")]
    policy: EvictionPolicy,
    /// Write run statistics as JSON to this file.
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// Write a memory timeline to this CSV file: every 50 ms the memory
    /// accounted and resident, the cap, executors in memory, evictions,
    /// loads, bytes moved and the phase. `outcore plot` draws it.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
}

/// The `--timeline` sampler, when one was asked for.
struct Phases(Option<Timeline>);

impl Phases {
    /// Starts sampling `rt` into `--timeline`'s file, in phase `first`.
    fn start(rt: &Runtime, m: &MemoryArgs, first: &str) -> Result<Phases> {
        Ok(Phases(match &m.timeline {
            Some(p) => Some(Timeline::start(rt, p, timeline::PERIOD, first)?),
            None => None,
        }))
    }

    /// Sets the phase of the next samples.
    fn set(&self, name: &str) {
        if let Some(t) = &self.0 {
            t.phase(name);
        }
    }

    /// Counts an input file's reads in the timeline's bytes read.
    fn add_reads(&self, r: InputReads) {
        if let Some(t) = &self.0 {
            t.add_reads(r);
        }
    }

    /// Writes the last sample and closes the file.
    fn finish(self) -> Result<()> {
        if let Some(t) = self.0 {
            t.finish()?;
        }
        Ok(())
    }
}

/// The flags given on the command line (not defaults), to warn about
/// those that do not apply to the run.
#[derive(Debug, Default)]
pub struct Given(std::collections::HashSet<String>);

impl Given {
    /// The flags of the subcommand in `m` given on the command line.
    pub fn from_matches(m: &clap::ArgMatches) -> Given {
        let mut set = std::collections::HashSet::new();
        if let Some((_, sub)) = m.subcommand() {
            for id in sub.ids() {
                if sub.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine) {
                    set.insert(id.as_str().to_string());
                }
            }
        }
        Given(set)
    }

    /// Whether the flag with clap id `id` was given.
    fn has(&self, id: &str) -> bool {
        self.0.contains(id)
    }

    /// One warning line for each of `flags` (clap id, flag as typed)
    /// that was given, saying `why` it does not apply.
    fn warn_unused(&self, flags: &[(&str, &str)], why: &str) {
        for (id, flag) in flags {
            if self.has(id) {
                eprintln!("outcore: warning: {flag} {why}; ignored");
            }
        }
    }
}

/// Runs a parsed command line; `given` tells which flags were typed.
pub fn run(cli: Cli, given: &Given) -> Result<()> {
    interrupt::install_cleanup();
    match cli.cmd {
        Cmd::Kmeans(a) => kmeans::run(*a, given),
        Cmd::Predict(a) => predict::run(*a, given),
        Cmd::Gen(a) => gen::run(a),
        Cmd::Train(a) => train::run(*a, given),
        Cmd::Plot(a) => plot::run(a),
    }
}

/// Warns about `--dims` given with an input whose header or records
/// carry the number of columns, and `--key` with an input that is not a
/// `.npz` archive.
fn warn_dims(given: &Given, input: Option<&Path>) {
    match input {
        Some(p) if Source::is_archive(p) => {}
        Some(p) => given.warn_unused(
            &[("key", "--key")],
            &format!("applies to .npz archives, not to {}", p.display()),
        ),
        None => given.warn_unused(&[("key", "--key")], "applies to an --input .npz archive"),
    }
    if let Some(p) = input {
        if !Source::needs_dims(p) {
            given.warn_unused(
                &[("dims", "--dims")],
                &format!(
                    "does not apply to {} (its columns come from the file)",
                    p.display()
                ),
            );
        }
    }
}

/// "1 partition", "3 partitions".
fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `v`, or an error naming `flag` when it is 0.
fn positive(flag: &str, v: usize) -> Result<usize> {
    if v == 0 {
        return Err(Error::Input(format!("{flag} must be at least 1")));
    }
    Ok(v)
}

/// An input file (for a `.npz`, its array `key`); raw float32 data needs
/// `--dims`.
fn file_source(path: &Path, dims: Option<usize>, key: Option<&str>) -> Result<Source> {
    if Source::needs_dims(path) {
        match dims {
            None => {
                return Err(Error::Input(format!(
                    "{}: not a .npy, .npz or .fvecs file; for raw float32 data give --dims",
                    path.display()
                )))
            }
            Some(d) => positive("--dims", d)?,
        };
    }
    Ok(Source::from_path(path, dims)?.with_key(key.map(str::to_string)))
}

/// Synthetic data from `--synthetic SIZE`, `--dims` and `--true-k` (or
/// `--classes`), checked here for every subcommand.
fn synthetic_source(size: &str, dims: usize, true_k: usize, seed: u64) -> Result<Source> {
    let bytes = parse_size(size)?;
    positive("--dims", dims)?;
    positive("--true-k", true_k)?;
    if bytes < 4 * dims as u64 {
        return Err(Error::Input(format!(
            "--synthetic {size} is smaller than one point of {dims} dimensions"
        )));
    }
    Ok(Source::synthetic(bytes, dims, true_k, seed))
}

/// Builds the runtime from the memory flags (`default_cap` when
/// `--mem-cap` is not given); returns it and the partition size in bytes
/// for `data_bytes` of data.
fn runtime(m: &MemoryArgs, default_cap: MemoryCap, data_bytes: u64) -> Result<(Runtime, u64)> {
    if m.partitions == Some(0) {
        return Err(Error::Input("--partitions must be at least 1".into()));
    }
    let mut b = Runtime::builder()
        .mem_cap(m.mem_cap.unwrap_or(default_cap))
        .policy(m.policy);
    if let Some(w) = m.workers {
        b = b.workers(positive("--workers", w)?);
    }
    if let Some(d) = &m.spill_dir {
        b = b.spill_dir(d);
    }
    let rt = b.build()?;
    interrupt::remove_on_interrupt(rt.spill_dir().to_path_buf());
    let part_bytes = match (m.partitions, rt.cap()) {
        (Some(p), _) => data_bytes.div_ceil(p).max(1),
        (None, Some(cap)) => (cap / 64).clamp(1 << 20, 256 << 20),
        (None, None) => 64 << 20,
    };
    Ok((rt, part_bytes))
}

/// One line when spill writes failed: the run kept those executors in
/// memory, over its cap.
fn warn_failed_writes(rt: &Runtime, s: &Stats) {
    if s.failed_writes > 0 {
        let over = s.peak_bytes.saturating_sub(rt.cap().unwrap_or(u64::MAX));
        eprintln!(
            "outcore: warning: {} spill write(s) to {} failed ({}); those executors stayed in memory, {} over the cap at the peak; free space in the spill directory or choose another with --spill-dir",
            s.failed_writes,
            rt.spill_dir().display(),
            rt.last_spill_error().unwrap_or_default(),
            format_bytes(over)
        );
    }
}
