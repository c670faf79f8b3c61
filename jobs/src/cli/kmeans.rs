//! `outcore kmeans`: K-means on data larger than the memory cap.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use outcore::{format_bytes, MemoryCap};
use outcore_jobs::grow::Growth;
use outcore_jobs::kmeans::{
    self, Algorithm, Config, Dataset, Delta, Event, Init, KmeansStats, Loaded, Outcome, Traffic,
};
use outcore_jobs::ranks::Ranks;
use outcore_jobs::{
    check_outputs, check_room, npy, write_json, Error, Report, Result, RunFigures, Session, Source,
};

use super::grow;
use super::labels::LabelsOut;
use super::progress::Feedback;
use super::{
    file_source, finish_session, named, plural, positive, runtime, start_warnings, summed,
    synthetic_source, warn_dims, Given, MemoryArgs, Outputs,
};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AlgorithmArg {
    Minibatch,
    Lloyd,
}

/// Flags of `outcore kmeans`.
#[derive(Args, Debug)]
pub(super) struct KmeansArgs {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    pub(super) mem: MemoryArgs,
    /// Number of clusters. Default: 100, or the rows of an --init file.
    #[arg(long, value_name = "K")]
    k: Option<usize>,
    /// Algorithm.
    #[arg(long, value_enum, default_value_t = AlgorithmArg::Minibatch)]
    algorithm: AlgorithmArg,
    /// Initialisation: kmeans++ (on a sample), random, k-means|| (over
    /// five passes of all the rows), or a .npy file of k x D centres.
    #[arg(
        long,
        default_value = "kmeans++",
        value_name = "kmeans++|random|k-means|||FILE.npy"
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
    /// Shards the tasks are cut into: the order of every sum, and the
    /// unit spread over MPI processes (at least one each; at most
    /// --batch-tasks are used). A mini-batch takes --batch-tasks / S
    /// consecutive tasks from each shard. Results depend on it, not on the
    /// number of processes.
    #[arg(long, value_name = "S", default_value_t = 8)]
    shards: usize,
    /// Convergence tolerance, relative to the data's mean per-feature
    /// variance (scikit-learn's tol). Lloyd stops when the squared centre
    /// shift of an iteration is at most this (default 1e-4); mini-batch
    /// when a step moves the centres that little (default 0: never).
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    tol: Option<f64>,
    /// Mini-batch: stop after N steps in a row without improvement of the
    /// smoothed batch inertia (scikit-learn's max_no_improvement; default:
    /// never).
    #[arg(long, value_name = "N")]
    max_no_improvement: Option<usize>,
    /// Mini-batch: after a step, centres whose accumulated weight is
    /// under R times the largest move onto rows of the batch
    /// (scikit-learn's reassignment_ratio; 0: never).
    #[arg(long, value_name = "R", default_value_t = 0.01)]
    reassignment_ratio: f64,
    /// Runs from N initialisations (the first from --seed); the lowest
    /// final inertia is kept.
    #[arg(long, value_name = "N", default_value_t = 1)]
    n_init: usize,
    /// Sample weights: a 1-D float32/float64 .npy, one finite weight >= 0
    /// per row (scikit-learn's sample_weight).
    #[arg(long, value_name = "W.npy")]
    sample_weight: Option<PathBuf>,
    /// Write the centroids (float32, k x D) to this .npy file.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Write each point's cluster (int32) to this .npy file.
    #[arg(long, value_name = "FILE")]
    labels: Option<PathBuf>,
}

/// Data flags of `outcore kmeans`.
#[derive(Args, Debug, Clone)]
struct DataArgs {
    /// Input: .npy (2-D float32/float64/float16, C order, either byte
    /// order), .npz, .fvecs, or raw little-endian float32 (with --dims).
    /// Without it, synthetic data.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// The array to read from an --input .npz archive (default: its
    /// first).
    #[arg(long, value_name = "NAME")]
    key: Option<String>,
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

/// Runs `outcore kmeans`: the flags checked into a job, the job run
/// through a session, then its outputs and summary.
pub(super) fn run(a: KmeansArgs, given: &Given, ranks: &Ranks) -> Result<()> {
    warn_unused(&a, given);
    let job = Job::parse(&a, ranks)?;
    let default_cap = match a.data.input {
        None => MemoryCap::Bytes(1 << 30),
        Some(_) => MemoryCap::Auto,
    };
    let place = (ranks.rank(), ranks.size());
    let (rt, part_bytes) = runtime(
        &a.mem,
        default_cap,
        (job.data_bytes(), 1 << 20),
        ranks,
        |cap, pb, n| {
            let pb = kmeans::aligned_partition_bytes(pb, job.dims, a.task_points);
            kmeans::workers((job.rows, job.dims), &job.cfg, pb, cap, place, n)
        },
    )?;
    let mut session = Session::on(rt, ranks.clone());
    // Under MPI, the timeline is rank 0's.
    if let Some(p) = &a.mem.timeline {
        session.record_timeline(p, "load")?;
    }
    let part_bytes = kmeans::aligned_partition_bytes(part_bytes, job.dims, a.task_points);
    let mut fb = Feedback::new();
    let t = Instant::now();
    let load = |session: &Session, fb: &mut Feedback| {
        fb.stage("loading", job.rows);
        kmeans::load(
            session,
            &job.src,
            a.sample_weight.as_deref(),
            Some(&job.cfg),
            part_bytes,
            |done, _| fb.progress(done),
        )
    };
    let (ds, growth) = grow::load_and_grow(&session, a.mem.max_ranks, job.shards(), |s, _| {
        load(s, &mut fb)
    })?;
    let load_seconds = t.elapsed().as_secs_f64();
    let intro = job.intro(&a, &session, &ds, load_seconds);
    let mut rep = Reporter::new(&session, fb, intro, &job);
    session.phase("init");
    // The labels go out as the final pass makes them.
    let mut labels = a
        .labels
        .as_deref()
        .map(|p| LabelsOut::new(&session, p, job.rows));
    let out = match labels.as_mut() {
        // A labels file that fails mid-run (disk full, file-size limit):
        // the line lists the outputs, none of them written.
        Some(l) => {
            kmeans::run_with_labels(&session, &ds, &job.cfg, |ev| rep.on(ev), |v| l.write(v))
                .map_err(|e| outputs(&a, session.is_root()).failed_writing(e))?
        }
        None => kmeans::run(&session, &ds, &job.cfg, |ev| rep.on(ev))?,
    };
    let traffic = rep.finish();
    session.phase("output");
    let ran = Ran {
        job: &job,
        ds: &ds,
        out: &out,
        traffic: &traffic,
        load_seconds,
        growth,
    };
    ran.finish(&a, labels, session)
}

/// The outputs asked for, in the order they are written (rank 0 writes
/// the centres and the statistics).
fn outputs(a: &KmeansArgs, root: bool) -> Outputs {
    Outputs::new(&[
        ("--output", if root { &a.output } else { &None }),
        ("--labels", &a.labels),
        ("--timeline", &a.mem.timeline),
        ("--stats", if root { &a.mem.stats } else { &None }),
    ])
}

/// Warnings for flags given that do not apply to the run.
fn warn_unused(a: &KmeansArgs, given: &Given) {
    warn_dims(given, a.data.input.as_deref());
    if a.data.input.is_some() {
        given.warn_unused(
            &[("synthetic", "--synthetic"), ("true_k", "--true-k")],
            "applies to synthetic data, not to --input",
        );
    }
    match a.algorithm {
        AlgorithmArg::Lloyd => given.warn_unused(
            &[
                ("epochs", "--epochs"),
                ("batch_tasks", "--batch-tasks"),
                ("max_no_improvement", "--max-no-improvement"),
                ("reassignment_ratio", "--reassignment-ratio"),
            ],
            "applies to --algorithm minibatch",
        ),
        AlgorithmArg::Minibatch => given.warn_unused(
            &[("iterations", "--iterations")],
            "applies to --algorithm lloyd",
        ),
    }
}

/// A checked command line: the data and the configuration.
struct Job {
    src: Source,
    rows: u64,
    dims: usize,
    cfg: Config,
}

impl Job {
    /// The job the flags ask for, every flag checked (the errors name
    /// them), on `ranks`.
    fn parse(a: &KmeansArgs, ranks: &Ranks) -> Result<Job> {
        // Rank 0 writes the outputs.
        if ranks.is_root() {
            check_files(a)?;
        }
        let shards = check_numbers(a)?;
        let (src, rows, dims) = open_source(&a.data)?;
        // The labels file's size is known: checked against the file-size
        // limit and the free space before the work.
        if let (Some(p), true) = (&a.labels, ranks.is_root()) {
            check_room(p, rows * 4 + 128)?;
        }
        let (init, k) = initial_centres(a, dims)?;
        positive("--k", k)?;
        if let (Some(p), true) = (&a.output, ranks.is_root()) {
            check_room(p, (k * dims) as u64 * 4 + 128)?;
        }
        if k as u64 > rows {
            return Err(Error::Input(format!(
                "--k {k} is larger than the number of points ({rows})"
            )));
        }
        let job = Job {
            src,
            rows,
            dims,
            cfg: config(a, init, k, shards),
        };
        job.check_shards(a, ranks.size())?;
        Ok(job)
    }

    /// Bytes of the data, as float32.
    fn data_bytes(&self) -> u64 {
        self.rows * self.dims as u64 * 4
    }

    /// Iterations (Lloyd) or epochs (mini-batch), as the lines name them.
    fn word(&self) -> &'static str {
        match self.cfg.algorithm {
            Algorithm::MiniBatch => "epoch",
            Algorithm::Lloyd => "iteration",
        }
    }

    /// Epochs or iterations, at most.
    fn passes(&self) -> usize {
        match self.cfg.algorithm {
            Algorithm::MiniBatch => self.cfg.epochs,
            Algorithm::Lloyd => self.cfg.iterations,
        }
    }

    /// Shards the tasks are cut into.
    fn shards(&self) -> usize {
        kmeans::shards(self.rows, &self.cfg).count()
    }

    /// An error when the data makes fewer shards than `processes`, naming
    /// the flags that give more.
    fn check_shards(&self, a: &KmeansArgs, processes: usize) -> Result<()> {
        if processes < 2 {
            return Ok(());
        }
        let (cfg, rows) = (&self.cfg, self.rows);
        let sh = kmeans::shards(rows, cfg);
        if sh.count() >= processes {
            return Ok(());
        }
        Err(Error::Input(format!(
            "{processes} processes, but the data makes only {} shards ({} tasks of --task-points {}; --shards {}{}): give {} (the results depend on --shards, not on the number of processes)",
            sh.count(),
            sh.task_count(),
            a.task_points,
            cfg.shards,
            match cfg.algorithm {
                Algorithm::MiniBatch => format!(", --batch-tasks {}", a.batch_tasks),
                Algorithm::Lloyd => String::new(),
            },
            if sh.task_count() < processes as u64 {
                format!(
                    "a smaller --task-points (at most {})",
                    (rows / processes as u64).max(1)
                )
            } else {
                match cfg.algorithm {
                    Algorithm::MiniBatch => "--shards and --batch-tasks at least {processes}",
                    Algorithm::Lloyd => "--shards at least {processes}",
                }
                .replace("{processes}", &processes.to_string())
            }
        )))
    }

    /// The start lines, shown once the initialisation is done (it reads
    /// the data: an input error found on the way is then the only line).
    fn intro(
        &self,
        a: &KmeansArgs,
        session: &Session,
        ds: &Dataset,
        load_seconds: f64,
    ) -> Vec<String> {
        let (rt, rows, dims) = (session.runtime(), self.rows, self.dims);
        let held: u64 = ds.part_rows.iter().map(|&n| u64::from(n)).sum();
        // The partitions' mean size (they are cut shard by shard), or the
        // largest when they differ by more than a tenth: a shard's last
        // partition may be small, and the mean then hid one too large.
        let mean = held * dims as u64 * 4 / ds.parts.len().max(1) as u64;
        let largest = ds.part_rows.iter().max().map_or(0, |&n| u64::from(n)) * dims as u64 * 4;
        let part_size = if largest > mean + mean / 10 {
            format!("up to {}", format_bytes(largest))
        } else {
            format_bytes(mean)
        };
        let mut intro = vec![format!(
            "outcore kmeans: {rows} points x {dims} dims ({}), k = {}, {}, cap {}, {}, policy {}",
            format_bytes(self.data_bytes()),
            self.cfg.k,
            match self.cfg.algorithm {
                Algorithm::MiniBatch => "mini-batch",
                Algorithm::Lloyd => "Lloyd",
            },
            rt.cap().map_or("none".into(), format_bytes),
            plural(rt.workers(), "worker"),
            rt.policy()
        )];
        if session.ranks().size() > 1 {
            intro.push(format!(
                "{} processes, {} shards: rank 0 holds rows {}..{}; cap, workers and partitions per process",
                session.ranks().size(),
                self.shards(),
                ds.first_row,
                ds.first_row + held
            ));
        }
        let parts = plural(ds.parts.len(), "partition");
        intro.push(if ds.lazy {
            let from = if a.data.input.is_some() {
                "input"
            } else {
                "generator"
            };
            format!("{parts} of {part_size}, read from the {from} as the run needs them")
        } else {
            format!("loaded {parts} of {part_size} in {load_seconds:.1}s")
        });
        if session.is_root() {
            intro.extend(start_warnings(rt));
        }
        intro
    }
}

/// The paths given: no output may overwrite an input or another output.
fn check_files(a: &KmeansArgs) -> Result<()> {
    let outputs = [
        ("--output", &a.output),
        ("--labels", &a.labels),
        ("--stats", &a.mem.stats),
        ("--timeline", &a.mem.timeline),
    ];
    let init_file = match a.init.as_str() {
        "kmeans++" | "k-means++" | "random" | "k-means||" | "kmeans||" => None,
        file => Some(PathBuf::from(file)),
    };
    let inputs = [
        ("--input", &a.data.input),
        ("--sample-weight", &a.sample_weight),
        ("--init", &init_file),
    ];
    check_outputs(&named(&outputs), &named(&inputs))
}

/// The numeric flags of the algorithm run (the other's were warned about
/// and are not used); returns `--shards`.
fn check_numbers(a: &KmeansArgs) -> Result<usize> {
    positive("--task-points", a.task_points)?;
    let shards = positive("--shards", a.shards)?;
    match a.algorithm {
        AlgorithmArg::Minibatch => {
            positive("--batch-tasks", a.batch_tasks)?;
            positive("--epochs", a.epochs)?;
            if a.max_no_improvement == Some(0) {
                return Err(Error::Input(
                    "--max-no-improvement must be at least 1".into(),
                ));
            }
            let r = a.reassignment_ratio;
            if !(r.is_finite() && r >= 0.0) {
                return Err(Error::Input(format!(
                    "--reassignment-ratio must be a number >= 0, not {r}"
                )));
            }
        }
        AlgorithmArg::Lloyd => {
            positive("--iterations", a.iterations)?;
        }
    }
    positive("--n-init", a.n_init)?;
    if let Some(t) = a.tol {
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::Input(format!(
                "--tol must be a number >= 0, not {t}"
            )));
        }
    }
    Ok(shards)
}

/// `--init` and `--k` for data of `dims` columns: the initialisation and
/// k (the rows of an `--init` file).
fn initial_centres(a: &KmeansArgs, dims: usize) -> Result<(Init, usize)> {
    Ok(match a.init.as_str() {
        "kmeans++" | "k-means++" => (Init::KMeansPlusPlus, a.k.unwrap_or(100)),
        "random" => (Init::Random, a.k.unwrap_or(100)),
        "k-means||" | "kmeans||" => (Init::KMeansParallel, a.k.unwrap_or(100)),
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
            if a.n_init > 1 {
                say!(
                    "outcore: warning: --n-init {} with --init {file}: every run would start from the same centres; running once",
                    a.n_init
                );
            }
            (Init::Given(v), r)
        }
    })
}

/// The library's configuration from the checked flags.
fn config(a: &KmeansArgs, init: Init, k: usize, shards: usize) -> Config {
    Config {
        k,
        algorithm: match a.algorithm {
            AlgorithmArg::Minibatch => Algorithm::MiniBatch,
            AlgorithmArg::Lloyd => Algorithm::Lloyd,
        },
        init,
        // The ignored algorithm's settings, valid whatever was given.
        epochs: a.epochs.max(1),
        iterations: a.iterations.max(1),
        batch_tasks: a.batch_tasks.max(1),
        task_points: a.task_points,
        seed: a.data.seed,
        tol: a.tol.unwrap_or(match a.algorithm {
            AlgorithmArg::Minibatch => 0.0,
            AlgorithmArg::Lloyd => 1e-4,
        }),
        max_no_improvement: a.max_no_improvement,
        reassignment_ratio: a.reassignment_ratio,
        n_init: a.n_init,
        shards,
    }
}

/// The run's lines on stderr as its events come (a bar on a terminal),
/// and the figures of its passes for `--stats`.
struct Reporter<'a> {
    session: &'a Session,
    fb: Feedback,
    /// The start lines, until the initialisation is done.
    intro: Vec<String>,
    algorithm: Algorithm,
    word: &'static str,
    passes: usize,
    rows: u64,
    /// "run 2: " with several runs.
    run_prefix: String,
    /// The traffic of each phase, counted from the last line.
    traffic: Traffic,
}

impl<'a> Reporter<'a> {
    /// Starts the first epoch's stage, `fb` having shown the load.
    fn new(session: &'a Session, mut fb: Feedback, intro: Vec<String>, job: &Job) -> Reporter<'a> {
        let (word, passes) = (job.word(), job.passes());
        fb.stage(&format!("{word} 1/{passes}"), job.rows);
        Reporter {
            session,
            fb,
            intro,
            algorithm: job.cfg.algorithm,
            word,
            passes,
            rows: job.rows,
            run_prefix: String::new(),
            traffic: Traffic::start(session),
        }
    }

    /// Shows event `ev`.
    fn on(&mut self, ev: Event) {
        // The traffic since the last line, at the end of a phase.
        let d = self.traffic.on(self.session, &ev).unwrap_or_default();
        match ev {
            Event::Progress { done, .. } => self.fb.progress(done),
            Event::Run { index, of } => self.run_starts(index, of),
            Event::RunDone { index, inertia } => {
                self.fb
                    .line(&format!("run {}: final inertia {inertia:.6e}", index + 1));
                self.fb
                    .stage(&format!("{} 1/{}", self.word, self.passes), self.rows);
            }
            Event::Reassigned { .. } => {}
            Event::FinalPass => self
                .session
                .phase(&format!("{}final pass", self.run_prefix)),
            Event::Converged { steps, why } => self.fb.line(&format!(
                "converged after {}: {}",
                match self.algorithm {
                    Algorithm::MiniBatch => format!("{steps} steps"),
                    Algorithm::Lloyd => plural(steps, "iteration"),
                },
                why.describe()
            )),
            Event::Initialized { seconds } => self.initialized(seconds, d),
            Event::Epoch {
                index,
                seconds,
                inertia,
            } => self.epoch(index, seconds, inertia, d),
        }
    }

    /// The start lines, if not shown yet.
    fn show_intro(&mut self) {
        for l in self.intro.drain(..) {
            self.fb.line(&l);
        }
    }

    /// Run `index` of `of` starts.
    fn run_starts(&mut self, index: usize, of: usize) {
        self.show_intro();
        self.fb.line(&format!("run {}/{of}:", index + 1));
        self.run_prefix = format!("run {}: ", index + 1);
        self.session.phase(&format!("{}init", self.run_prefix));
    }

    /// The initial centres are chosen, in `seconds`, with traffic `d`.
    fn initialized(&mut self, seconds: f64, d: Delta) {
        self.show_intro();
        self.session
            .phase(&format!("{}{} 1", self.run_prefix, self.word));
        self.fb.line(&format!(
            "initialised in {seconds:.2}s: loads {}, read {}",
            d.loads,
            format_bytes(d.read)
        ));
    }

    /// Epoch or iteration `index` finished, with traffic `d`.
    fn epoch(&mut self, index: usize, seconds: f64, inertia: f64, d: Delta) {
        let (word, passes) = (self.word, self.passes);
        self.fb.line(&format!(
            "{word} {}/{passes}: {seconds:.2}s, inertia {inertia:.6e}, evictions {} (clean {}), loads {}, read {}, written {}",
            index + 1,
            d.evictions,
            d.clean_evictions,
            d.loads,
            format_bytes(d.read),
            format_bytes(d.written),
        ));
        if index + 1 < passes {
            self.fb
                .stage(&format!("{word} {}/{passes}", index + 2), self.rows);
            self.session
                .phase(&format!("{}{word} {}", self.run_prefix, index + 2));
        }
    }

    /// Ends the display; the traffic for `--stats`.
    fn finish(mut self) -> Traffic {
        self.fb.done();
        self.traffic
    }
}

/// A finished run, for its outputs and reports.
struct Ran<'a> {
    job: &'a Job,
    ds: &'a Dataset,
    out: &'a Outcome,
    traffic: &'a Traffic,
    load_seconds: f64,
    /// The growth onto more ranks after the load, if any.
    growth: Option<Growth>,
}

impl Ran<'_> {
    /// Writes the outputs (rank 0 writes them), then on rank 0 the
    /// statistics and the summary line; every rank's figures go to rank 0.
    fn finish(
        &self,
        a: &KmeansArgs,
        labels: Option<LabelsOut>,
        mut session: Session,
    ) -> Result<()> {
        let root = session.is_root();
        let mut outs = outputs(a, root);
        let (k, dims) = (self.job.cfg.k as u64, self.job.dims as u64);
        if let (Some(p), true) = (&a.output, root) {
            let centres = npy::write_array(p, &[k, dims], &self.out.centers.values);
            outs.write("--output", centres)?;
        }
        if let Some(l) = labels {
            // Every rank's labels into rank 0's file.
            outs.write("--labels", l.finish(session.ranks()))?;
        }
        // Every rank's bytes read per epoch, added up on rank 0.
        let epoch_read = summed(session.ranks(), &self.traffic.epoch_read)?;
        // The timeline ends with the totals, so the two agree.
        let s = finish_session(&mut session, &mut outs)?;
        // Every rank's figures, on rank 0 (the others are done).
        let Some(report) = session.report_at(&s).map_err(|e| outs.failed(e))? else {
            return Ok(());
        };
        if let Some(p) = &a.mem.stats {
            let job = self.stats(a, &epoch_read);
            let figures = RunFigures {
                job: &job,
                session: report.figures(&session, &s, self.growth.as_slice()),
            };
            let r = write_json(p, &figures);
            outs.write("--stats", r)?;
        }
        self.summary(&session, &report);
        Ok(())
    }

    /// The job's half of the `--stats` JSON.
    fn stats<'b>(&'b self, a: &KmeansArgs, epoch_read: &'b [u64]) -> KmeansStats<'b> {
        let data = Loaded {
            rows: self.job.rows,
            dims: self.job.dims,
            partitions: self.ds.parts.len(),
            weighted: a.sample_weight.is_some(),
            load_seconds: self.load_seconds,
        };
        KmeansStats::new(&self.job.cfg, data, self.out, self.traffic, epoch_read)
    }

    /// The last line: every process's totals.
    fn summary(&self, session: &Session, report: &Report) {
        let tot = report.total;
        let cap = report.cap_phrase();
        let (peak, each) = if session.ranks().size() > 1 {
            ("largest peak", " per process")
        } else {
            ("peak", "")
        };
        say!(
            "done in {:.1}s: final inertia {:.6e}; {peak} {} ({cap}{each}); evictions {} (clean {}, in the trap {}), loads {}, read {}, written {}",
            tot.wall_seconds,
            self.out.inertia,
            format_bytes(tot.peak_bytes),
            tot.evictions,
            tot.clean_evictions,
            tot.trap_evictions,
            tot.loads,
            format_bytes(tot.bytes_read),
            format_bytes(tot.bytes_written),
        );
    }
}

/// A source and its shape, read up front.
fn open_source(d: &DataArgs) -> Result<(Source, u64, usize)> {
    let src = match &d.input {
        Some(p) => file_source(p, d.dims, d.key.as_deref())?,
        None => synthetic_source(&d.synthetic, d.dims.unwrap_or(1000), d.true_k, d.seed)?,
    };
    let (rows, dims) = src.shape()?;
    Ok((src, rows, dims))
}
