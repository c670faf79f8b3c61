//! `outcore kmeans`: K-means on data larger than the memory cap.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use outcore::{format_bytes, MemoryCap, Stats};
use outcore_jobs::kmeans::{self, Algorithm, Config, Event, Init};
use outcore_jobs::ranks::Ranks;
use outcore_jobs::{
    check_outputs, npy, write_json, Error, ProcessTotals, Result, Session, Source, Totals,
};
use serde::Serialize;

use super::progress::Feedback;
use super::{
    cap_over_limit, file_source, named, plural, positive, runtime, synthetic_source, warn_dims,
    warn_failed_writes, Given, MemoryArgs, Outputs,
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

#[derive(Serialize)]
struct KmeansStats<'a> {
    algorithm: &'a str,
    k: usize,
    rows: u64,
    dims: usize,
    /// Rank 0's partitions.
    partitions: usize,
    /// Shards used (the order of the sums; the unit spread over ranks).
    shards: usize,
    epoch_seconds: &'a [f64],
    epoch_inertia: &'a [f64],
    /// Rank 0's seconds in the distance kernel per epoch, summed over its
    /// worker threads.
    epoch_kernel_seconds: &'a [f64],
    /// Rank 0's bytes read and written per epoch.
    epoch_bytes_read: &'a [u64],
    epoch_bytes_written: &'a [u64],
    inertia: f64,
    /// Epochs (mini-batch) or iterations (Lloyd) run.
    iterations: usize,
    /// Mini-batch steps (batches) run.
    steps: usize,
    /// Whether the run stopped early on convergence, and why.
    converged: bool,
    stop: Option<&'a str>,
    tol: f64,
    max_no_improvement: Option<usize>,
    n_init: usize,
    /// The run kept (from 0) and every run's final inertia.
    best_init: usize,
    init_inertia: &'a [f64],
    weighted: bool,
    /// Rank 0's seconds adding the shards' sums across processes, and the
    /// number of steps that did.
    combine_seconds: f64,
    combines: usize,
    /// Every process's added up.
    #[serde(flatten)]
    totals: Totals,
    load_seconds: f64,
    /// The initialisation (k-means++, random or given centres).
    init_seconds: f64,
    /// Rank 0's bytes read while choosing the initial centres (every run).
    init_bytes_read: u64,
    /// Per process (the largest, under MPI).
    mem_cap_bytes: Option<u64>,
    policy: &'a str,
    workers: usize,
    /// Rank 0's runtime counters.
    runtime: &'a Stats,
    /// MPI processes; the counters above are their totals, `peak_bytes`
    /// and `wall_seconds` the largest.
    processes: usize,
    per_process: &'a [ProcessTotals],
}

/// Runs `outcore kmeans`.
pub(super) fn run(a: KmeansArgs, given: &Given, ranks: &Ranks) -> Result<()> {
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
            ],
            "applies to --algorithm minibatch",
        ),
        AlgorithmArg::Minibatch => given.warn_unused(
            &[("iterations", "--iterations")],
            "applies to --algorithm lloyd",
        ),
    }
    // Rank 0 writes the outputs.
    if ranks.is_root() {
        let outputs = [
            ("--output", &a.output),
            ("--labels", &a.labels),
            ("--stats", &a.mem.stats),
            ("--timeline", &a.mem.timeline),
        ];
        let init_file = match a.init.as_str() {
            "kmeans++" | "k-means++" | "random" => None,
            file => Some(PathBuf::from(file)),
        };
        let inputs = [
            ("--input", &a.data.input),
            ("--sample-weight", &a.sample_weight),
            ("--init", &init_file),
        ];
        check_outputs(&named(&outputs), &named(&inputs))?;
    }
    positive("--task-points", a.task_points)?;
    let shards = positive("--shards", a.shards)?;
    // Each algorithm's own settings: the other's were warned about above
    // and are not used.
    match a.algorithm {
        AlgorithmArg::Minibatch => {
            positive("--batch-tasks", a.batch_tasks)?;
            positive("--epochs", a.epochs)?;
            if a.max_no_improvement == Some(0) {
                return Err(Error::Input(
                    "--max-no-improvement must be at least 1".into(),
                ));
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
            if a.n_init > 1 {
                say!(
                    "outcore: warning: --n-init {} with --init {file}: every run would start from the same centres; running once",
                    a.n_init
                );
            }
            (Init::Given(v), r)
        }
    };
    positive("--k", k)?;
    if k as u64 > rows {
        return Err(Error::Input(format!(
            "--k {k} is larger than the number of points ({rows})"
        )));
    }
    let cfg = Config {
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
        labels: a.labels.is_some(),
        tol: a.tol.unwrap_or(match a.algorithm {
            AlgorithmArg::Minibatch => 0.0,
            AlgorithmArg::Lloyd => 1e-4,
        }),
        max_no_improvement: a.max_no_improvement,
        n_init: a.n_init,
        shards,
    };
    let processes = ranks.size();
    if processes > 1 {
        let sh = kmeans::shards(rows, &cfg);
        if sh.count() < processes {
            return Err(Error::Input(format!(
                "{processes} processes, but the data makes only {} shards ({} tasks of --task-points {}; --shards {shards}{}): give {} (the results depend on --shards, not on the number of processes)",
                sh.count(),
                sh.task_count(),
                a.task_points,
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
            )));
        }
    }
    let data_bytes = rows * dims as u64 * 4;
    let default_cap = match a.data.input {
        None => MemoryCap::Bytes(1 << 30),
        Some(_) => MemoryCap::Auto,
    };
    let (rt, part_bytes) = runtime(&a.mem, default_cap, data_bytes, ranks)?;
    let mut session = Session::on(rt, ranks.clone());
    // Under MPI, the timeline is rank 0's.
    if let Some(p) = &a.mem.timeline {
        session.record_timeline(p, "load")?;
    }
    let session = session;
    let rt = session.runtime();
    let part_bytes = kmeans::aligned_partition_bytes(part_bytes, dims, a.task_points);
    // Shown with the start lines, after the initialisation: an input error
    // found before stays the only line.
    let small_cap = rt.cap().filter(|_| ranks.is_root()).and_then(|cap| {
        small_cap(
            cap,
            &cfg,
            rows,
            dims,
            part_bytes.min(data_bytes),
            rt.workers(),
        )
    });
    let mut fb = Feedback::new();
    fb.stage("loading", rows);
    let t = Instant::now();
    let ds = kmeans::load(
        &session,
        &src,
        a.sample_weight.as_deref(),
        Some(&cfg),
        part_bytes,
        |done, _| fb.progress(done),
    )?;
    let load_seconds = t.elapsed().as_secs_f64();
    // The partitions' mean size (they are cut shard by shard).
    let held: u64 = ds.part_rows.iter().map(|&n| u64::from(n)).sum();
    let part_size = held * dims as u64 * 4 / ds.parts.len().max(1) as u64;
    // The start lines wait for the initialisation, which reads the data
    // (k-means++ and random samples read every partition): an input error
    // found on the way is then the only line the user sees.
    let mut intro = vec![format!(
        "outcore kmeans: {rows} points x {dims} dims ({}), k = {k}, {}, cap {}, {} workers, policy {}",
        format_bytes(data_bytes),
        match a.algorithm {
            AlgorithmArg::Minibatch => "mini-batch",
            AlgorithmArg::Lloyd => "Lloyd",
        },
        rt.cap().map_or("none".into(), format_bytes),
        rt.workers(),
        rt.policy()
    )];
    if processes > 1 {
        intro.push(format!(
            "{processes} processes, {} shards: rank 0 holds rows {}..{}; cap, workers and partitions per process",
            kmeans::shards(rows, &cfg).count(),
            ds.first_row,
            ds.first_row + ds.part_rows.iter().map(|&n| u64::from(n)).sum::<u64>()
        ));
    }
    if ds.lazy {
        intro.push(format!(
            "{} of {}, read from the {} as the run needs them",
            plural(ds.parts.len(), "partition"),
            format_bytes(part_size),
            if a.data.input.is_some() {
                "input"
            } else {
                "generator"
            }
        ));
    } else {
        intro.push(format!(
            "loaded {} of {} in {:.1}s",
            plural(ds.parts.len(), "partition"),
            format_bytes(part_size),
            load_seconds
        ));
    }
    intro.extend(small_cap);
    intro.extend(cap_over_limit(rt).filter(|_| ranks.is_root()));
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
    // Bytes read from disk: spill files and, for executors rebuilt from
    // the input file, the input.
    let mut last_read = last.bytes_read + session.input_bytes_read();
    let mut init_seconds = 0.0;
    let mut init_read = 0;
    let mut epoch_read = Vec::new();
    let mut epoch_written = Vec::new();
    let mut run_prefix = String::new();
    session.phase("init");
    let out = kmeans::run(&session, &ds, &cfg, |ev| match ev {
        Event::Progress { done, .. } => fb.progress(done),
        Event::Run { index, of } => {
            for l in intro.drain(..) {
                fb.line(&l);
            }
            fb.line(&format!("run {}/{of}:", index + 1));
            run_prefix = format!("run {}: ", index + 1);
            session.phase(&format!("{run_prefix}init"));
        }
        Event::RunDone { index, inertia } => {
            fb.line(&format!("run {}: final inertia {inertia:.6e}", index + 1));
            fb.stage(&format!("{word} 1/{passes}"), rows);
        }
        Event::FinalPass => session.phase(&format!("{run_prefix}final pass")),
        Event::Converged { steps, why } => {
            fb.line(&format!(
                "converged after {}: {}",
                match cfg.algorithm {
                    Algorithm::MiniBatch => format!("{steps} steps"),
                    Algorithm::Lloyd => plural(steps, "iteration"),
                },
                why.describe()
            ));
        }
        Event::Initialized { seconds } => {
            for l in intro.drain(..) {
                fb.line(&l);
            }
            init_seconds = seconds;
            session.phase(&format!("{run_prefix}{word} 1"));
            let s = rt.stats();
            let read = s.bytes_read + session.input_bytes_read();
            fb.line(&format!(
                "initialised in {seconds:.2}s: loads {}, read {}",
                s.loads - last.loads,
                format_bytes(read - last_read)
            ));
            init_read += read - last_read;
            last = s;
            last_read = read;
        }
        Event::Epoch {
            index,
            seconds,
            inertia,
        } => {
            let s = rt.stats();
            let read = s.bytes_read + session.input_bytes_read();
            fb.line(&format!(
                "{word} {}/{passes}: {seconds:.2}s, inertia {inertia:.6e}, evictions {} (clean {}), loads {}, read {}, written {}",
                index + 1,
                s.evictions - last.evictions,
                s.clean_evictions - last.clean_evictions,
                s.loads - last.loads,
                format_bytes(read - last_read),
                format_bytes(s.bytes_written - last.bytes_written),
            ));
            epoch_read.push(read - last_read);
            epoch_written.push(s.bytes_written - last.bytes_written);
            last = s;
            last_read = read;
            if index + 1 < passes {
                fb.stage(&format!("{word} {}/{passes}", index + 2), rows);
                session.phase(&format!("{run_prefix}{word} {}", index + 2));
            }
        }
    })?;
    fb.done();
    session.phase("output");
    // Rank 0 writes the outputs.
    let mut outs = Outputs::new(&[
        ("--output", if ranks.is_root() { &a.output } else { &None }),
        ("--labels", &a.labels),
        ("--timeline", &a.mem.timeline),
        (
            "--stats",
            if ranks.is_root() { &a.mem.stats } else { &None },
        ),
    ]);
    if let (Some(p), true) = (&a.output, ranks.is_root()) {
        outs.write(
            "--output",
            npy::write_array(p, &[k as u64, dims as u64], &out.centers.values),
        )?;
    }
    if let (Some(p), Some(labels)) = (&a.labels, &out.labels) {
        let as_i32: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
        outs.write(
            "--labels",
            npy::write_array(p, &[labels.len() as u64], &as_i32),
        )?;
    }
    // The timeline ends with the totals, so the two agree.
    let s = session.runtime().stats();
    let mut session = session;
    outs.write("--timeline", session.finish_timeline(&s))?;
    let rt = session.runtime();
    warn_failed_writes(rt, &s);
    // Every rank's figures, on rank 0 (the others are done).
    let Some(report) = session.report().map_err(|e| outs.failed(e))? else {
        return Ok(());
    };
    let tot = report.total;
    if let Some(p) = &a.mem.stats {
        let r = write_json(
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
                shards: kmeans::shards(rows, &cfg).count(),
                epoch_seconds: &out.epoch_seconds,
                epoch_inertia: &out.epoch_inertia,
                epoch_kernel_seconds: &out.epoch_kernel_seconds,
                epoch_bytes_read: &epoch_read,
                epoch_bytes_written: &epoch_written,
                inertia: out.inertia,
                iterations: out.iterations,
                steps: out.steps,
                converged: out.converged.is_some(),
                stop: out.converged.map(|c| c.describe()),
                tol: cfg.tol,
                max_no_improvement: cfg.max_no_improvement,
                n_init: out.init_inertia.len(),
                best_init: out.best_init,
                init_inertia: &out.init_inertia,
                weighted: a.sample_weight.is_some(),
                combine_seconds: out.combine_seconds,
                combines: out.combines,
                totals: tot,
                load_seconds,
                init_seconds,
                init_bytes_read: init_read,
                mem_cap_bytes: report.mem_cap_bytes,
                policy: &rt.policy().to_string(),
                workers: rt.workers(),
                runtime: &s,
                processes,
                per_process: &report.per_process,
            },
        );
        outs.write("--stats", r)?;
    }
    let cap = rt
        .cap()
        .map_or("no cap".into(), |c| format!("cap {}", format_bytes(c)));
    let (peak, each) = if processes > 1 {
        ("largest peak", " per process")
    } else {
        ("peak", "")
    };
    say!(
        "done in {:.1}s: final inertia {:.6e}; {peak} {} ({cap}{each}); evictions {} (clean {}, in the trap {}), loads {}, read {}, written {}",
        tot.wall_seconds,
        out.inertia,
        format_bytes(tot.peak_bytes),
        tot.evictions,
        tot.clean_evictions,
        tot.trap_evictions,
        tot.loads,
        format_bytes(tot.bytes_read),
        format_bytes(tot.bytes_written),
    );
    Ok(())
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

/// A warning when the cap is smaller than what the run must hold at once:
/// the initialisation's sample (held outside the executors) and a
/// partition for each worker to compute on. The run goes ahead; its memory
/// then exceeds the cap, which its summary's peak shows.
fn small_cap(
    cap: u64,
    cfg: &Config,
    rows: u64,
    dims: usize,
    part: u64,
    workers: usize,
) -> Option<String> {
    let sample = match cfg.init {
        Init::Given(_) => 0,
        _ => kmeans::init_sample_bytes(rows, dims, cfg.k),
    };
    let parts = part * workers as u64;
    if sample.max(parts) <= cap {
        return None;
    }
    let mut what = Vec::new();
    if sample > cap {
        what.push(format!(
            "the initialisation's sample ({})",
            format_bytes(sample)
        ));
    }
    if parts > cap {
        what.push(format!(
            "a partition for each of {workers} workers ({workers} x {})",
            format_bytes(part)
        ));
    }
    Some(format!(
        "outcore: warning: the cap of {} is smaller than {}, which the run holds at once: memory will exceed the cap (a larger --mem-cap keeps it)",
        format_bytes(cap),
        what.join(" and ")
    ))
}
