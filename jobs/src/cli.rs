//! Argument parsing and the subcommands.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use outcore::{format_bytes, parse_size, EvictionPolicy, MemoryCap, Runtime, Stats};
use outcore_jobs::input::{Blobs, Rows, Source};
use outcore_jobs::kmeans::{self, Algorithm, Config, Event, Init};
use outcore_jobs::npy::{self, NpyWriter};
use outcore_jobs::{output, Error, Result};
use serde::Serialize;

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
    Kmeans(Box<KmeansArgs>),
    /// Write a synthetic Gaussian-blob dataset to a .npy file.
    Gen(GenArgs),
    /// Multinomial logistic regression by local SGD with model averaging,
    /// each shard's model replica held in its executor.
    ///
    /// With no arguments: 512 MiB of synthetic data (10 classes) under a
    /// 256 MiB cap.
    Train(Box<TrainArgs>),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AlgorithmArg {
    Minibatch,
    Lloyd,
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
    /// Eviction policy: priority (follow the dispatch plan) or lru.
    #[arg(long, value_name = "priority|lru", default_value = "priority")]
    policy: EvictionPolicy,
    /// Write run statistics as JSON to this file.
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
}

/// Data flags shared by the jobs.
#[derive(Args, Debug, Clone)]
struct DataArgs {
    /// Input: .npy (2-D float32/float64, C order), .fvecs, or raw
    /// little-endian float32 (with --dims). Without it, synthetic data.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Size of the synthetic data.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "2GiB",
        allow_hyphen_values = true
    )]
    synthetic: String,
    /// Dimensions of synthetic data, or columns of a raw input file.
    #[arg(long, value_name = "D")]
    dims: Option<usize>,
    /// Number of blobs in synthetic data.
    #[arg(long, value_name = "K", default_value_t = 100)]
    true_k: usize,
    /// Seed for the synthetic data and the initialisation.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

#[derive(Args, Debug)]
struct KmeansArgs {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    mem: MemoryArgs,
    /// Number of clusters. Default: 100, or the rows of an --init file.
    #[arg(long, value_name = "K")]
    k: Option<usize>,
    /// Algorithm.
    #[arg(long, value_enum, default_value_t = AlgorithmArg::Minibatch)]
    algorithm: AlgorithmArg,
    /// Initialisation: kmeans++, random, or a .npy file of k x D centres.
    #[arg(
        long,
        default_value = "kmeans++",
        value_name = "kmeans++|random|FILE.npy"
    )]
    init: String,
    /// Mini-batch: sweeps over the data.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Lloyd: full passes.
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    /// Mini-batch: tasks per batch.
    #[arg(long, default_value_t = 40)]
    batch_tasks: usize,
    /// Mini-batch: points per task.
    #[arg(long, default_value_t = 1100)]
    task_points: usize,
    /// Write the centroids (float32, k x D) to this .npy file.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Write each point's cluster (int32) to this .npy file.
    #[arg(long, value_name = "FILE")]
    labels: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct TrainArgs {
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

#[derive(Args, Debug)]
struct GenArgs {
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

/// Spill directories to remove if the process is interrupted (SIGINT or
/// SIGTERM): destructors do not run on a signal.
static SPILL_DIRS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Set when SIGINT or SIGTERM arrives: an error that follows (the spill
/// files vanishing under a running job) is the interruption, not a failure
/// to report.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the run was interrupted by a signal.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Installs the handler that removes the spill directories and exits with
/// code 130 on Ctrl-C or SIGTERM.
fn install_interrupt_cleanup() {
    let _ = ctrlc::set_handler(|| {
        INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let dirs = SPILL_DIRS.lock().map(|d| d.clone()).unwrap_or_default();
        // Workers may still be writing a spill file: retry until the
        // directory is gone (a file created after it goes fails to open).
        for d in &dirs {
            for _ in 0..50 {
                let _ = std::fs::remove_dir_all(d);
                if !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        eprintln!("outcore: interrupted; spill files removed");
        std::process::exit(130);
    });
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    install_interrupt_cleanup();
    match cli.cmd {
        Cmd::Kmeans(a) => kmeans_cmd(*a),
        Cmd::Gen(a) => gen_cmd(a),
        Cmd::Train(a) => train_cmd(*a),
    }
}

/// Checks an output path can be written before any work is done.
fn preflight(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if path.is_dir() {
        return Err(Error::Output(format!("{}: is a directory", path.display())));
    }
    tempfile::Builder::new()
        .prefix(".outcore-check-")
        .tempfile_in(&dir)
        .map(drop)
        .map_err(|e| Error::Output(format!("{}: cannot write there: {e}", path.display())))
}

fn positive(name: &str, v: usize) -> Result<usize> {
    if v == 0 {
        return Err(Error::Input(format!("{name} must be at least 1")));
    }
    Ok(v)
}

/// A source and its shape, read up front.
fn open_source(d: &DataArgs) -> Result<(Source, u64, usize)> {
    let src = match &d.input {
        Some(p) => file_source(p, d.dims)?,
        None => synthetic_source(&d.synthetic, d.dims.unwrap_or(1000), d.true_k, d.seed)?,
    };
    let rows = Rows::open(&src)?;
    Ok((src, rows.rows(), rows.dims()))
}

/// The source for `--input`: raw float32 needs `--dims`.
fn file_source(p: &Path, dims: Option<usize>) -> Result<Source> {
    if dims.is_none() && Source::needs_dims(p) {
        return Err(Error::Input(format!(
            "{}: not a .npy or .fvecs file; for raw float32 data give --dims",
            p.display()
        )));
    }
    Source::from_path(p, dims)
}

/// Synthetic data from `--synthetic SIZE`, `--dims` and the number of
/// blobs (`--true-k`, or `--classes` for training).
fn synthetic_source(size: &str, dims: usize, blobs: usize, seed: u64) -> Result<Source> {
    let bytes = parse_size(size)?;
    let dims = positive("--dims", dims)?;
    positive("--true-k", blobs)?;
    if bytes < 4 * dims as u64 {
        return Err(Error::Input(format!(
            "--synthetic {size} is smaller than one point of {dims} dimensions"
        )));
    }
    Ok(Source::synthetic(bytes, dims, blobs, seed))
}

/// Builds the runtime from the memory flags; returns it and the partition
/// size in bytes.
fn runtime(m: &MemoryArgs, synthetic_cap: Option<u64>, data_bytes: u64) -> Result<(Runtime, u64)> {
    let cap = match (m.mem_cap, synthetic_cap) {
        (Some(c), _) => c,
        (None, Some(c)) => MemoryCap::Bytes(c),
        (None, None) => MemoryCap::Auto,
    };
    let mut b = Runtime::builder().mem_cap(cap).policy(m.policy);
    if let Some(w) = m.workers {
        b = b.workers(positive("--workers", w)?);
    }
    if let Some(d) = &m.spill_dir {
        b = b.spill_dir(d);
    }
    let rt = b.build()?;
    if let Ok(mut d) = SPILL_DIRS.lock() {
        d.push(rt.spill_dir().to_path_buf());
    }
    let part_bytes = match (m.partitions, rt.cap()) {
        (Some(0), _) => return Err(Error::Input("--partitions must be at least 1".into())),
        (Some(p), _) => data_bytes.div_ceil(p).max(1),
        (None, Some(cap)) => (cap / 64).clamp(1 << 20, 256 << 20),
        (None, None) => 64 << 20,
    };
    Ok((rt, part_bytes))
}

/// Progress on stderr: a bar on a terminal, summary lines otherwise.
struct Feedback {
    bar: Option<ProgressBar>,
}

impl Feedback {
    fn new() -> Feedback {
        Feedback { bar: None }
    }

    fn stage(&mut self, what: &str, total: u64) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if std::io::stderr().is_terminal() {
            let b = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "{msg:>12} [{bar:40}] {percent:>3}% {elapsed_precise} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            b.set_style(style);
            b.set_message(what.to_string());
            self.bar = Some(b);
        }
    }

    fn progress(&self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    fn line(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => eprintln!("{msg}"),
        }
    }

    fn done(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[derive(Serialize)]
struct KmeansStats<'a> {
    algorithm: &'a str,
    k: usize,
    rows: u64,
    dims: usize,
    partitions: usize,
    epoch_seconds: &'a [f64],
    epoch_inertia: &'a [f64],
    epoch_bytes_read: &'a [u64],
    epoch_bytes_written: &'a [u64],
    inertia: f64,
    evictions: u64,
    trap_evictions: u64,
    clean_evictions: u64,
    loads: u64,
    prefetch_hits: u64,
    bytes_written: u64,
    bytes_read: u64,
    peak_bytes: u64,
    wall_seconds: f64,
    load_seconds: f64,
    mem_cap_bytes: Option<u64>,
    policy: String,
    workers: usize,
    runtime: &'a Stats,
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::Output(e.to_string()))?;
    output::write_file(path, text.as_bytes())
}

fn kmeans_cmd(a: KmeansArgs) -> Result<()> {
    let wall = Instant::now();
    for p in [&a.output, &a.labels, &a.mem.stats].into_iter().flatten() {
        preflight(p)?;
    }
    positive("--task-points", a.task_points)?;
    positive("--batch-tasks", a.batch_tasks)?;
    positive("--epochs", a.epochs)?;
    positive("--iterations", a.iterations)?;
    let (src, rows, dims) = open_source(&a.data)?;
    let (init, k) = match a.init.as_str() {
        "kmeans++" | "k-means++" => (Init::KMeansPlusPlus, a.k.unwrap_or(100)),
        "random" => (Init::Random, a.k.unwrap_or(100)),
        file => {
            let (v, r, c) = npy::read_matrix(Path::new(file))?;
            if c != dims {
                return Err(Error::Input(format!(
                    "--init {file}: centres have {c} dimensions, the data has {dims}"
                )));
            }
            if let Some(k) = a.k {
                if k != r {
                    return Err(Error::Input(format!(
                        "--init {file}: holds {r} centres but --k is {k}"
                    )));
                }
            }
            (Init::Given(v), r)
        }
    };
    if k == 0 {
        return Err(Error::Input("--k must be at least 1".into()));
    }
    if k as u64 > rows {
        return Err(Error::Input(format!(
            "--k {k} is larger than the number of points ({rows})"
        )));
    }
    let data_bytes = rows * dims as u64 * 4;
    let (rt, part_bytes) = runtime(
        &a.mem,
        a.data.input.is_none().then_some(1 << 30),
        data_bytes,
    )?;
    let part_bytes = kmeans::aligned_partition_bytes(part_bytes, dims, a.task_points);
    let mut fb = Feedback::new();
    fb.stage("loading", rows);
    let t = Instant::now();
    let ds = kmeans::load(&rt, &src, part_bytes, |done, _| fb.progress(done))?;
    let load_seconds = t.elapsed().as_secs_f64();
    // Printed once the data is in: an input error found while streaming
    // is then the only line the user sees.
    fb.line(&format!(
        "outcore kmeans: {rows} points x {dims} dims ({}), k = {k}, {}, cap {}, {} workers, policy {}",
        format_bytes(data_bytes),
        match a.algorithm {
            AlgorithmArg::Minibatch => "mini-batch",
            AlgorithmArg::Lloyd => "Lloyd",
        },
        rt.cap().map_or("none".into(), format_bytes),
        rt.workers(),
        rt.policy()
    ));
    fb.line(&format!(
        "loaded {} partitions of {} in {:.1}s",
        ds.parts.len(),
        format_bytes(part_bytes.min(data_bytes)),
        load_seconds
    ));
    let cfg = Config {
        k,
        algorithm: match a.algorithm {
            AlgorithmArg::Minibatch => Algorithm::MiniBatch,
            AlgorithmArg::Lloyd => Algorithm::Lloyd,
        },
        init,
        epochs: a.epochs,
        iterations: a.iterations,
        batch_tasks: a.batch_tasks,
        task_points: a.task_points,
        seed: a.data.seed,
        labels: a.labels.is_some(),
    };
    let passes = match cfg.algorithm {
        Algorithm::MiniBatch => cfg.epochs,
        Algorithm::Lloyd => cfg.iterations,
    };
    let word = if cfg.algorithm == Algorithm::Lloyd {
        "iteration"
    } else {
        "epoch"
    };
    fb.stage(&format!("{word} 1/{passes}"), rows);
    let mut last = rt.stats();
    let mut epoch_read = Vec::new();
    let mut epoch_written = Vec::new();
    let out = kmeans::run(&rt, &ds, &cfg, |ev| match ev {
        Event::Progress { done, .. } => fb.progress(done),
        Event::Initialized { seconds } => {
            let s = rt.stats();
            fb.line(&format!(
                "initialised in {seconds:.2}s: loads {}, read {}",
                s.loads - last.loads,
                format_bytes(s.bytes_read - last.bytes_read)
            ));
            last = s;
        }
        Event::Epoch {
            index,
            seconds,
            inertia,
        } => {
            let s = rt.stats();
            fb.line(&format!(
                "{word} {}/{passes}: {seconds:.2}s, inertia {inertia:.6e}, evictions {} (clean {}), loads {}, read {}, written {}",
                index + 1,
                s.evictions - last.evictions,
                s.clean_evictions - last.clean_evictions,
                s.loads - last.loads,
                format_bytes(s.bytes_read - last.bytes_read),
                format_bytes(s.bytes_written - last.bytes_written),
            ));
            epoch_read.push(s.bytes_read - last.bytes_read);
            epoch_written.push(s.bytes_written - last.bytes_written);
            last = s;
            if index + 1 < passes {
                fb.stage(&format!("{word} {}/{passes}", index + 2), rows);
            }
        }
    })?;
    fb.done();
    if let Some(p) = &a.output {
        npy::write_array(p, &[k as u64, dims as u64], &out.centers.values)?;
    }
    if let (Some(p), Some(labels)) = (&a.labels, &out.labels) {
        let mut w = NpyWriter::<i32>::create(p, &[labels.len() as u64])?;
        let as_i32: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
        w.write(&as_i32)?;
        w.finish()?;
    }
    let s = rt.stats();
    let wall_seconds = wall.elapsed().as_secs_f64();
    if let Some(p) = &a.mem.stats {
        write_json(
            p,
            &KmeansStats {
                algorithm: match cfg.algorithm {
                    Algorithm::MiniBatch => "minibatch",
                    Algorithm::Lloyd => "lloyd",
                },
                k,
                rows,
                dims,
                partitions: ds.parts.len(),
                epoch_seconds: &out.epoch_seconds,
                epoch_inertia: &out.epoch_inertia,
                epoch_bytes_read: &epoch_read,
                epoch_bytes_written: &epoch_written,
                inertia: out.inertia,
                evictions: s.evictions,
                trap_evictions: s.trap_evictions,
                clean_evictions: s.clean_evictions,
                loads: s.loads,
                prefetch_hits: s.prefetch_hits,
                bytes_written: s.bytes_written,
                bytes_read: s.bytes_read,
                peak_bytes: s.peak_bytes,
                wall_seconds,
                load_seconds,
                mem_cap_bytes: rt.cap(),
                policy: rt.policy().to_string(),
                workers: rt.workers(),
                runtime: &s,
            },
        )?;
    }
    warn_failed_writes(&rt, &s);
    let cap = rt
        .cap()
        .map_or("no cap".into(), |c| format!("cap {}", format_bytes(c)));
    eprintln!(
        "done in {wall_seconds:.1}s: final inertia {:.6e}; peak {} ({cap}); evictions {} (clean {}, in the trap {}), loads {}, read {}, written {}",
        out.inertia,
        format_bytes(s.peak_bytes),
        s.evictions,
        s.clean_evictions,
        s.trap_evictions,
        s.loads,
        format_bytes(s.bytes_read),
        format_bytes(s.bytes_written),
    );
    Ok(())
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

fn gen_cmd(a: GenArgs) -> Result<()> {
    preflight(&a.output)?;
    let src = synthetic_source(&a.synthetic, a.dims, a.true_k, a.seed)?;
    let Source::Synthetic {
        rows,
        dims,
        true_k,
        seed,
    } = src
    else {
        return Err(Error::Input("gen writes synthetic data only".into()));
    };
    let blobs = Blobs::new(dims, true_k, seed);
    let mut w = NpyWriter::<f32>::create(&a.output, &[rows, dims as u64])?;
    let mut fb = Feedback::new();
    fb.stage("writing", rows);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Blocks of about 8 MiB per thread, generated in parallel, written in
    // order.
    let per = ((8 << 20) / (4 * dims as u64)).max(1);
    let mut first = 0u64;
    while first < rows {
        let blocks: Vec<(u64, u64)> = (0..threads as u64)
            .map(|t| first + t * per)
            .filter(|&s| s < rows)
            .map(|s| (s, per.min(rows - s)))
            .collect();
        let parts: Vec<Vec<f32>> = std::thread::scope(|sc| {
            let hs: Vec<_> = blocks
                .iter()
                .map(|&(s, n)| {
                    let blobs = &blobs;
                    sc.spawn(move || {
                        let mut v = Vec::new();
                        blobs.points(s, n as usize, &mut v);
                        v
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        for p in &parts {
            w.write(p)?;
        }
        first += blocks.iter().map(|b| b.1).sum::<u64>();
        fb.progress(first);
    }
    w.finish()?;
    fb.done();
    eprintln!(
        "wrote {} ({rows} x {dims} float32) to {}",
        format_bytes(rows * dims as u64 * 4),
        a.output.display()
    );
    Ok(())
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

fn train_cmd(a: TrainArgs) -> Result<()> {
    use outcore_jobs::train::{self, Labels, TrainConfig};
    let wall = Instant::now();
    for p in [&a.output, &a.mem.stats].into_iter().flatten() {
        preflight(p)?;
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
            let dims = a.dims.unwrap_or(256);
            let src = synthetic_source(&a.synthetic, dims, classes, a.seed)?;
            (
                src,
                Labels::Blobs(Blobs::new(dims, classes, a.seed)),
                Some(classes),
            )
        }
    };
    let probe = Rows::open(&src)?;
    let data_bytes = probe.rows() * probe.dims() as u64 * 4;
    drop(probe);
    let (rt, shard_bytes) = runtime(&a.mem, a.input.is_none().then_some(256 << 20), data_bytes)?;
    let cfg = TrainConfig {
        rounds: a.rounds,
        local_epochs: a.local_epochs,
        lr: a.lr,
        batch: a.batch,
        holdout: a.holdout,
        seed: a.seed,
    };
    let mut fb = Feedback::new();
    fb.stage("loading", 1);
    let job = train::load(&rt, &src, &labels, classes, shard_bytes, &cfg)?;
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
