//! Argument parsing, the checks that name flags, and the subcommands (one
//! file each).
//!
//! The library speaks of its parameters; this module checks every flag
//! before the library sees it, so that a bad value is reported by the flag
//! the user typed. Each subcommand parses its flags into a configuration,
//! runs the job through a [`Session`](outcore_jobs::Session) and reports.
//!
//! - `mod.rs` (this file): the shared flags (memory, spill, workers,
//!   outputs), building the runtime, the address-space checks;
//! - `kmeans.rs`, `train.rs`, `predict.rs`, `gen.rs`, `plot.rs`: one
//!   subcommand each; `fit.rs`: those of the job interface (`linear`,
//!   `pca`) and `sgd.rs` (`sgd`);
//! - `labels.rs`: `kmeans --labels` streamed into its file (from every
//!   rank);
//! - `progress.rs`: progress on stderr (a bar on a terminal, lines
//!   otherwise);
//! - `interrupt.rs`: the signals that end a run, and the cleanup they do.

/// A line on stderr, on rank 0 only: the other ranks of an MPI run stay
/// quiet (their errors still print, with [`tell!`]).
macro_rules! say {
    ($($t:tt)*) => {
        if !$crate::cli::silent() {
            tell!($($t)*);
        }
    };
}

/// A line on stderr that never fails the run: with stderr closed (the
/// reader of a pipe gone, `2>&-`) it is lost, and the run still finishes
/// and writes its outputs (`eprintln!` would panic). Written in one piece
/// (`writeln!` writes each piece of the format on its own): under
/// `mpirun`, another rank's line could land inside it.
macro_rules! tell {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($t)*);
        line.push('\n');
        let _ = std::io::stderr().write_all(line.as_bytes());
    }};
}

mod fit;
mod gen;
mod grow;
mod interrupt;
mod kmeans;
mod labels;
mod lend;
mod plot;
mod predict;
mod progress;
mod sgd;
mod train;

use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Args, Parser, Subcommand};
use outcore::{format_bytes, parse_size, EvictionPolicy, MemoryCap, Runtime, Stats};
use outcore_jobs::ranks::Ranks;
use outcore_jobs::{check_file_size, Error, Result, Source, Workers};

/// Set on MPI ranks other than 0: they print no progress or summaries.
static SILENT: AtomicBool = AtomicBool::new(false);

/// Whether this process prints no progress (an MPI rank other than 0).
pub(crate) fn silent() -> bool {
    SILENT.load(Ordering::Relaxed)
}

pub use interrupt::{interrupted, spill_left};

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
    /// Multinomial logistic regression: full-batch L-BFGS (the default,
    /// scikit-learn's solver) or local SGD with model averaging, each
    /// shard of the data held in its executor.
    ///
    /// With no arguments: 512 MiB of synthetic data (10 classes) under a
    /// 256 MiB cap.
    Train(Box<train::TrainArgs>),
    /// Linear or ridge regression (least squares, float64 normal
    /// equations), the rows held in executors: two passes over the data.
    ///
    /// With no arguments: 256 MiB of synthetic data (64 columns, one
    /// target) under a 256 MiB cap.
    Linear(Box<fit::LinearArgs>),
    /// Principal component analysis (the covariance's eigenvectors), the
    /// rows held in executors: two passes over the data.
    ///
    /// With no arguments: 256 MiB of synthetic data (64 columns) under a
    /// 256 MiB cap.
    Pca(Box<fit::PcaArgs>),
    /// A linear model by stochastic gradient descent (scikit-learn's
    /// SGDClassifier and SGDRegressor), the rows held in executors and the
    /// model in one, updated row by row.
    ///
    /// With no arguments: regression on 256 MiB of synthetic data (64
    /// columns) under a 256 MiB cap.
    Sgd(Box<sgd::SgdArgs>),
    /// Draw a memory timeline (written by --timeline) as a PNG: memory
    /// against the cap, phases, loads and evictions, disk traffic.
    Plot(plot::PlotArgs),
    /// Under mpirun, beside a job: lend this process's memory to the job's
    /// ranks, which evict there before the disk
    /// (`mpirun -np 2 outcore kmeans ... : -np 1 outcore lend`).
    Lend(lend::LendArgs),
}

impl Cli {
    /// Whether this process lends its memory (`outcore lend`) rather
    /// than runs a job.
    pub fn lends(&self) -> bool {
        matches!(self.cmd, Cmd::Lend(_))
    }

    /// Whether this process runs a job that lends the memory its work
    /// leaves to the other ranks (`--remote-memory auto`).
    pub fn shares(&self) -> bool {
        let m = match &self.cmd {
            Cmd::Kmeans(a) => &a.mem,
            Cmd::Predict(a) => &a.mem,
            Cmd::Train(a) => &a.mem,
            Cmd::Linear(a) => &a.rows.mem,
            Cmd::Pca(a) => &a.rows.mem,
            Cmd::Sgd(a) => &a.rows.mem,
            Cmd::Gen(_) | Cmd::Plot(_) | Cmd::Lend(_) => return false,
        };
        m.remote_memory == RemoteMemory::Auto
    }
}

/// Memory and runtime flags shared by the jobs.
#[derive(Args, Debug, Clone)]
struct MemoryArgs {
    /// Memory cap: a size (512MiB, 2GiB, 1.5G), `auto` or `none`. Default:
    /// `auto` with an input file; with synthetic data, 1GiB for kmeans and
    /// 256MiB for train.
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
    /// is 1/256 of the cap (64 MiB with no cap), rounded to whole tasks.
    #[arg(long, value_name = "P")]
    partitions: Option<u64>,
    /// Eviction policy.
    #[arg(long, value_name = "priority|lru", default_value = "priority")]
    policy: EvictionPolicy,
    /// Under MPI: when the data does not fit the ranks' caps after the
    /// load, grow onto free slots of the allocation, up to this many ranks
    /// in all (`auto`: MPI_UNIVERSE_SIZE, the allocation's slots). The
    /// results are the same bytes. Default: never grow.
    #[arg(long, value_name = "N|auto")]
    max_ranks: Option<outcore_jobs::grow::MaxRanks>,
    /// Under MPI: evicted partitions go to other processes' memory
    /// before the disk (`auto`, the default): lenders beside the job
    /// (`mpirun ... : -np 1 outcore lend`), and the other ranks, each
    /// lending what its own work leaves under its cap. `off`: this rank
    /// neither sends nor lends. The results are the same bytes.
    #[arg(long, value_name = "auto|off", default_value = "auto")]
    remote_memory: RemoteMemory,
    /// Under MPI: start N lenders (`outcore lend`) on free slots of the
    /// allocation (MPI_UNIVERSE_SIZE) before the run, whose memory takes
    /// the evictions before the disk. Default: none.
    #[arg(long, value_name = "N")]
    lenders: Option<usize>,
    /// Write run statistics as JSON to this file.
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// Write a memory timeline to this CSV file: every 50 ms (and when each
    /// phase begins) the memory
    /// accounted and resident, the cap, executors in memory, evictions,
    /// loads, bytes moved and the phase. `outcore plot` draws it.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
}

/// `--remote-memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RemoteMemory {
    /// Lenders' and other ranks' memory before the disk; this rank's
    /// spare memory lent to the others.
    Auto,
    /// The disk only; nothing lent.
    Off,
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
                say!("outcore: warning: {flag} {why}; ignored");
            }
        }
    }
}

/// Runs a parsed command line as one of `ranks`; `given` tells which
/// flags were typed.
pub fn run(cli: Cli, given: &Given, ranks: &Ranks) -> Result<()> {
    SILENT.store(!ranks.is_root(), Ordering::Relaxed);
    if ranks.size() > 1 {
        // The allocator's out-of-memory line names the rank too.
        outcore::set_process_name(&format!("rank {} of {}", ranks.rank(), ranks.size()));
    }
    interrupt::install_cleanup(ranks.size() > 1);
    let one = |what: &str| -> Result<()> {
        if ranks.size() > 1 {
            return Err(Error::Input(format!(
                "outcore {what} runs on one process; it was started on {}",
                ranks.size()
            )));
        }
        Ok(())
    };
    match cli.cmd {
        Cmd::Kmeans(a) => kmeans::run(*a, given, ranks),
        Cmd::Predict(a) => one("predict").and_then(|()| predict::run(*a, given)),
        Cmd::Gen(a) => one("gen").and_then(|()| gen::run(a)),
        Cmd::Train(a) => train::run(*a, given, ranks),
        Cmd::Linear(a) => fit::run_linear(*a, given, ranks),
        Cmd::Pca(a) => fit::run_pca(*a, given, ranks),
        Cmd::Sgd(a) => sgd::run(*a, given, ranks),
        Cmd::Plot(a) => one("plot").and_then(|()| plot::run(a)),
        Cmd::Lend(a) => lend::run(&a, ranks),
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

/// The outputs a run writes at its end, each with its flag: when one
/// fails, the error says which of them were written and which not (a
/// run's `--output` may be complete when its `--stats` fails).
struct Outputs {
    /// Flag and path of each output asked for, in the order written.
    all: Vec<(&'static str, PathBuf)>,
    /// The flags of those written.
    written: Vec<&'static str>,
}

impl Outputs {
    fn new(paths: &[(&'static str, &Option<PathBuf>)]) -> Outputs {
        Outputs {
            all: paths
                .iter()
                .filter_map(|&(f, p)| p.clone().map(|p| (f, p)))
                .collect(),
            written: Vec::new(),
        }
    }

    /// The outcome of writing the output of `flag`: recorded when it
    /// succeeded, an error saying which outputs exist when it failed.
    fn write<T>(&mut self, flag: &'static str, r: Result<T>) -> Result<T> {
        match r {
            Ok(v) => {
                self.written.push(flag);
                Ok(v)
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// [`failed`](Self::failed) for an error writing or reading a file
    /// (a streamed output failing mid-run); other errors as they are.
    fn failed_writing(&self, e: Error) -> Error {
        match e {
            Error::Io { .. } | Error::Output { .. } => self.failed(e),
            e => e,
        }
    }

    /// `e` with the outputs written and those not, when there are others
    /// than the one it names.
    fn failed(&self, e: Error) -> Error {
        if self.all.len() < 2 {
            return e;
        }
        let list = |done: bool| -> String {
            let l: Vec<String> = self
                .all
                .iter()
                .filter(|(f, _)| self.written.contains(f) == done)
                .map(|(f, p)| format!("{f} {}", p.display()))
                .collect();
            if l.is_empty() {
                "none".into()
            } else {
                l.join(", ")
            }
        };
        Error::Input(format!(
            "{e} (outputs written: {}; not written: {})",
            list(true),
            list(false)
        ))
    }
}

/// `v`, or an error naming `flag` when it is 0.
/// The paths given, each with its flag, for [`check_outputs`].
fn named<'a>(paths: &[(&'a str, &'a Option<PathBuf>)]) -> Vec<(&'a str, &'a Path)> {
    paths
        .iter()
        .filter_map(|&(flag, p)| p.as_deref().map(|p| (flag, p)))
        .collect()
}

fn positive(flag: &str, v: usize) -> Result<usize> {
    if v == 0 {
        return Err(Error::Input(format!("{flag} must be at least 1")));
    }
    Ok(v)
}

/// An input file (for a `.npz`, its array `key`); raw float32 data needs
/// `--dims`.
fn file_source(path: &Path, dims: Option<usize>, key: Option<&str>) -> Result<Source> {
    Source::check_regular(path)?;
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
/// for `data_bytes` of data. `workers` plans the worker threads from the
/// cap, the partition size and the workers asked for (`--workers`, or one
/// per core): when the cap holds fewer, fewer start, and rank 0 says so.
/// Partitions are a 256th of the cap, at least `least_part` bytes and at
/// most 256 MiB.
fn runtime(
    m: &MemoryArgs,
    default_cap: MemoryCap,
    (data_bytes, least_part): (u64, u64),
    ranks: &Ranks,
    workers: impl FnOnce(Option<u64>, u64, usize) -> Workers,
) -> Result<(Runtime, u64)> {
    if m.partitions == Some(0) {
        return Err(Error::Input("--partitions must be at least 1".into()));
    }
    let mut cap = m.mem_cap.unwrap_or(default_cap);
    // `auto` on a node shared with other ranks: its share of the node.
    if cap == MemoryCap::Auto && ranks.on_node() > 1 {
        if let Some(b) = cap.resolve_shared(ranks.on_node()) {
            cap = MemoryCap::Bytes(b);
        }
    }
    if let Some(w) = m.workers {
        if w > outcore::MAX_WORKERS {
            return Err(Error::Input(format!(
                "--workers must be at most {}, not {w}",
                outcore::MAX_WORKERS
            )));
        }
        positive("--workers", w)?;
    }
    let cap_bytes = cap.resolve();
    let part_bytes = match (m.partitions, cap_bytes) {
        (Some(p), _) => data_bytes.div_ceil(p).max(1),
        (None, cap) => outcore_jobs::partition_bytes(cap, least_part),
    };
    let planned = workers(cap_bytes, part_bytes, m.workers.unwrap_or_else(cores));
    *FEWER_WORKERS.lock().unwrap_or_else(|e| e.into_inner()) = planned.warning();
    planned.check_descriptors()?;
    // A spill file holds a partition, its row norms or labels and a
    // header: at most twice the values and a MiB.
    check_file_size("a spill file", part_bytes.saturating_mul(2) + (1 << 20))?;
    let mut b = Runtime::builder()
        .mem_cap(cap)
        .policy(m.policy)
        .workers(planned.run);
    if let Some(d) = &m.spill_dir {
        b = b.spill_dir(d);
    }
    #[cfg(feature = "mpi")]
    if m.remote_memory == RemoteMemory::Auto {
        spawn_lenders(m.lenders, ranks);
        if let Some(t) = ranks.remote_tier() {
            b = b.spill_tier(t);
        }
        // What its work leaves under the cap, lent to the other ranks
        // and taken back before its own partitions are evicted.
        if let Some(held) = cap_bytes.and_then(|c| ranks.share(c)) {
            b = b.reclaim(held);
        }
    }
    let rt = b.build()?;
    interrupt::remove_on_interrupt(rt.spill_dir().to_path_buf());
    Ok((rt, part_bytes))
}

/// Spawns the lenders `--lenders` asks for, if any (each with `--mem-cap
/// auto`: a lender holds only what the ranks evict); when they cannot
/// start, one warning, and the evictions go to the disk.
#[cfg(feature = "mpi")]
fn spawn_lenders(n: Option<usize>, ranks: &Ranks) {
    let Some(n) = n.filter(|&n| n > 0) else {
        return;
    };
    if let Err(e) = ranks.spawn_lenders(n, "auto") {
        say!("outcore: warning: --lenders {n}: {e}; evictions go to the disk");
    }
}

/// The line saying that the run starts fewer workers than asked for, if
/// it does: set by [`runtime`], shown with the run's first lines (after
/// the input is read, so an input error stays the only line).
static FEWER_WORKERS: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The warnings shown with a run's first lines: the cap against the
/// address-space limit ([`cap_over_limit`]) and fewer workers than asked
/// for.
fn start_warnings(rt: &Runtime) -> Vec<String> {
    let fewer = FEWER_WORKERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    cap_over_limit(rt)
        .into_iter()
        .chain(spill_in_memory(rt))
        .chain(fewer)
        .collect()
}

/// A warning when the run is capped and spills to a filesystem held in
/// memory (tmpfs): what it evicts stays in memory, and a container's
/// memory limit counts it.
fn spill_in_memory(rt: &Runtime) -> Option<String> {
    (rt.cap().is_some() && rt.spill_dir_in_memory()).then(|| {
        let parent = rt.spill_dir().parent().unwrap_or(rt.spill_dir());
        format!(
            "outcore: warning: the spill directory {} is in memory (tmpfs): what is evicted \
             stays in memory or swap, and counts against a container's memory limit \
             (give a directory on a disk with --spill-dir or TMPDIR)",
            parent.display()
        )
    })
}

/// One worker per core, at most [`outcore::MAX_WORKERS`].
fn cores() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, outcore::MAX_WORKERS)
}

/// Every rank's `values` (one per epoch, as many on every rank) added up,
/// on every rank. Collective.
fn summed(ranks: &Ranks, values: &[u64]) -> Result<Vec<u64>> {
    if ranks.size() == 1 {
        return Ok(values.to_vec());
    }
    // Byte counts below 2^53 add exactly in f64.
    let mine = vec![values.iter().map(|&v| v as f64).collect::<Vec<f64>>()];
    let all = ranks.ordered_sum(&mine, values.len())?;
    Ok(all.into_iter().map(|v| v as u64).collect())
}

/// The address space (`ulimit -v`) outcore needs for itself, before any
/// data, with `workers` worker threads: 1.25 x (48 MiB + 5 MiB per
/// worker). Under a smaller limit a run cannot start, or ends in an
/// allocation failure. The least `ulimit -v` under which
/// `outcore kmeans --synthetic 8MiB --dims 8 --k 4 --epochs 1` finished
/// (x86-64 Linux, debug and release builds) was 50-53 MiB with one
/// worker, 56-59 MiB with two, 70 with four, 91-92 with eight and 125
/// with sixteen (`gen` of 8 MiB on two cores: 52 MiB; `--help` 17-21):
/// the binary and its libraries, the allocator's arenas, the 16 MiB
/// reserve for evictions, and each worker's stack and arena. A quarter
/// on top is the margin: near the measured least, runs pass by a few
/// hundred KiB, and evict in the allocation trap throughout. `gen` holds
/// no runtime that could evict, and writes through buffers of up to
/// 16 MiB besides its generator's: `extra` adds 32 MiB for it (a 128 MiB
/// `gen` on two cores failed at 74-90 MB and passed from 95 MB).
pub fn least_address_space(workers: usize, extra: bool) -> u64 {
    let mib = 48 + 5 * workers as u64 + if extra { 32 } else { 0 };
    (mib + mib / 4) << 20
}

impl Cli {
    /// The worker threads the run uses: `--workers`, or one per core.
    fn workers(&self) -> usize {
        let flag = match &self.cmd {
            Cmd::Kmeans(a) => a.mem.workers,
            Cmd::Predict(a) => a.mem.workers,
            Cmd::Train(a) => a.mem.workers,
            Cmd::Linear(a) => a.rows.mem.workers,
            Cmd::Pca(a) => a.rows.mem.workers,
            Cmd::Sgd(a) => a.rows.mem.workers,
            Cmd::Gen(_) | Cmd::Plot(_) | Cmd::Lend(_) => None,
        };
        flag.unwrap_or_else(cores).clamp(1, outcore::MAX_WORKERS)
    }
}

/// The data size (`ulimit -d`, `RLIMIT_DATA`: the process's private
/// writable memory, heap and anonymous mappings, thread stacks included)
/// outcore needs for itself, before any data, with `workers` worker
/// threads: 1.25 x (48 MiB + 7.5 MiB per worker), plus 32 MiB for `gen`
/// (`extra`), as [`least_address_space`]. The least `ulimit -d` under
/// which `outcore kmeans --synthetic 8MiB --dims 8 --k 4 --epochs 1`
/// finished (x86-64 Linux, debug build) was 59 MiB with one worker, 68
/// with two, 88 with four and 107 with eight; a 128 MiB `gen` on two
/// cores, 79 MiB. (It is more than under `ulimit -v`: the allocator, set
/// up for an address-space limit, keeps less mapped under that one.)
pub fn least_data_size(workers: usize, extra: bool) -> u64 {
    let half_mib = 96 + 15 * workers as u64 + if extra { 64 } else { 0 };
    let mib = half_mib.div_ceil(2);
    (mib + mib / 4) << 20
}

/// A limit on the process, checked at start (see [`limit_too_small`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartLimit {
    /// `RLIMIT_AS`, `ulimit -v`.
    AddressSpace,
    /// `RLIMIT_DATA`, `ulimit -d`.
    Data,
}

impl StartLimit {
    /// Its row in `/proc/<pid>/limits`.
    pub fn proc_row(self) -> &'static str {
        match self {
            StartLimit::AddressSpace => "Max address space",
            StartLimit::Data => "Max data size",
        }
    }
}

/// One error line when the address-space limit (`ulimit -v`) or the data
/// size limit (`ulimit -d`) is below what the program needs for itself
/// ([`least_address_space`], [`least_data_size`]): checked before
/// anything starts, instead of an allocation failure later.
pub fn limit_too_small(cli: &Cli) -> Option<(StartLimit, String)> {
    let workers = cli.workers();
    let gen = matches!(cli.cmd, Cmd::Gen(_));
    let checks = [
        (
            StartLimit::AddressSpace,
            rlimit(libc::RLIMIT_AS),
            least_address_space(workers, gen),
            "address-space limit (ulimit -v",
        ),
        (
            StartLimit::Data,
            rlimit(libc::RLIMIT_DATA),
            least_data_size(workers, gen),
            "data size limit (ulimit -d",
        ),
    ];
    let (which, limit, least, what) = checks
        .into_iter()
        .find(|(_, limit, least, _)| limit.is_some_and(|l| l < *least))?;
    let limit = limit.unwrap_or(0);
    let flag = what.rsplit(' ').next().unwrap_or("-v");
    let line = format!(
        "outcore: error: the {what} {}) of {} is too small for outcore itself with {}: it needs at least {} (ulimit {flag} {}) before any data{}",
        limit >> 10,
        format_bytes(limit),
        plural(workers, "worker thread"),
        format_bytes(least),
        least >> 10,
        if workers > 1 && !gen && !matches!(cli.cmd, Cmd::Plot(_)) {
            "; fewer --workers need less"
        } else {
            ""
        }
    );
    Some((which, line))
}

/// The `RLIMIT_AS` (`ulimit -v`) or `RLIMIT_DATA` (`ulimit -d`) in
/// force, the smaller when both are finite: either makes allocations fail
/// at the limit.
fn address_space_limit() -> Option<u64> {
    match (rlimit(libc::RLIMIT_AS), rlimit(libc::RLIMIT_DATA)) {
        (Some(a), Some(d)) => Some(a.min(d)),
        (a, d) => a.or(d),
    }
}

/// A resource limit's soft value, when finite.
fn rlimit(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    let ok = unsafe { libc::getrlimit(resource, &mut lim) } == 0;
    (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// A warning for the start lines when the cap does not fit under the
/// address-space limit: then only the allocation trap evicts, at the limit,
/// one allocation at a time, and the run reads its data many times over
/// (17 GiB for 256 MiB of data with no cap under 400 MiB).
fn cap_over_limit(rt: &Runtime) -> Option<String> {
    let limit = address_space_limit()?;
    // What the limit leaves for a cap, as `MemoryCap::Auto` counts it (the
    // other limits, memory and cgroup, are not what this warns about).
    let fits = limit
        .saturating_sub((limit / 4).max(256 << 20))
        .max(16 << 20);
    let what = match rt.cap() {
        Some(c) if c > fits => format!("the cap of {}", format_bytes(c)),
        Some(_) => return None,
        None => "no cap".to_string(),
    };
    let which = if rlimit(libc::RLIMIT_AS) == Some(limit) {
        "an address-space limit"
    } else {
        "a data size limit"
    };
    let flag = if which.starts_with("an") { "-v" } else { "-d" };
    Some(format!(
        "outcore: warning: {what} under {which} of {} (ulimit {flag}): only the allocation trap evicts, at the limit, and the data may be read many times over (a cap of {} or less fits under it, as does --mem-cap auto)",
        format_bytes(limit),
        format_bytes(fits)
    ))
}

/// One line when spill writes failed: the run kept those executors in
/// memory, over its cap.
fn warn_failed_writes(rt: &Runtime, s: &Stats) {
    if s.failed_writes > 0 {
        let over = s.peak_bytes.saturating_sub(rt.cap().unwrap_or(u64::MAX));
        tell!(
            "outcore: warning: {} spill write(s) to {} failed ({}); those executors stayed in memory, {} over the cap at the peak; free space in the spill directory or choose another with --spill-dir",
            s.failed_writes,
            rt.spill_dir().display(),
            rt.last_spill_error().unwrap_or_default(),
            format_bytes(over)
        );
    }
}

/// Ends a session's work: the runtime's counters, taken once so that
/// every figure shown agrees, close the timeline (the `--timeline` of
/// `outs`), and a line warns when spill writes failed. Returns the
/// counters.
fn finish_session(session: &mut outcore_jobs::Session, outs: &mut Outputs) -> Result<Stats> {
    let s = session.runtime().stats();
    outs.write("--timeline", session.finish_timeline(&s))?;
    warn_failed_writes(session.runtime(), &s);
    Ok(s)
}
