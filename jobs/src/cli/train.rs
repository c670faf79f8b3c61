//! `outcore train`: logistic regression with model state in executors.
//!
//! [`run`] parses the flags into a [`Plan`] (each bad value reported by
//! its flag), loads and trains through a [`Session`] (a progress line per
//! round or iteration), then reports: the model (`--output`), the
//! timeline, the statistics (`--stats`) and the summary line.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use outcore::{format_bytes, MemoryCap, Stats};
use outcore_jobs::grow::Growth;
use outcore_jobs::ranks::Ranks;
use outcore_jobs::train::{
    self, final_accuracy, Event, Job, Solver, TrainConfig, TrainStats, Trained,
};
use outcore_jobs::{
    check_outputs, npy, write_json, Error, Labels, Result, RunFigures, Session, Source, Workers,
};

use super::grow;
use super::progress::Feedback;
use super::{
    file_source, named, plural, positive, runtime, start_warnings, synthetic_source, warn_dims,
    warn_failed_writes, Given, MemoryArgs, Outputs,
};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum SolverArg {
    Lbfgs,
    Sgd,
}

/// Flags of `outcore train`.
#[derive(Args, Debug)]
pub(super) struct TrainArgs {
    /// Inputs: .npy (2-D float32/float64/float16, either byte order),
    /// .npz, .fvecs, or raw float32 (with --dims). Without it, synthetic
    /// data.
    #[arg(long, value_name = "FILE", requires = "targets")]
    input: Option<PathBuf>,
    /// The array to read from an --input .npz archive (default: its
    /// first).
    #[arg(long, value_name = "NAME")]
    key: Option<String>,
    /// Labels for --input: a 1-D int32/int64 .npy file, one per row.
    #[arg(long, value_name = "FILE", requires = "input")]
    targets: Option<PathBuf>,
    /// L-BFGS: sample weights for --input, a 1-D float32/float64 .npy, one
    /// finite weight >= 0 per row (scikit-learn's sample_weight).
    #[arg(long, value_name = "W.npy", requires = "input")]
    sample_weight: Option<PathBuf>,
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
    pub(super) mem: MemoryArgs,
    /// How the model is fitted: L-BFGS on scikit-learn's objective, or
    /// local SGD with model averaging.
    #[arg(long, value_enum, default_value_t = SolverArg::Lbfgs)]
    solver: SolverArg,
    /// L-BFGS: inverse regularisation strength (scikit-learn's C).
    #[arg(
        long = "C",
        value_name = "C",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    c: f64,
    /// L-BFGS: stop when the largest gradient component (of the objective
    /// divided by C x rows, as scikit-learn) is at most this.
    #[arg(long, default_value_t = 1e-4, allow_negative_numbers = true)]
    tol: f64,
    /// L-BFGS: iteration limit.
    #[arg(long, default_value_t = 100)]
    max_iter: usize,
    /// Local SGD: rounds of local SGD followed by model averaging.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Local SGD: local epochs per round.
    #[arg(long, default_value_t = 1)]
    local_epochs: usize,
    /// Local SGD: learning rate.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    lr: f32,
    /// Local SGD: mini-batch size.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Fraction of the rows held out for the accuracy report (0: train on
    /// all rows, no accuracy reported).
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    holdout: f64,
    /// L-BFGS: shards the tasks are cut into: the order of every sum, and
    /// the unit spread over MPI processes (at least one each). The model
    /// depends on it, not on the number of processes.
    #[arg(long, value_name = "S", default_value_t = 8)]
    shards: usize,
    /// Write the model (float32, classes x (D + 1), bias last) to this .npy
    /// file.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Runs `outcore train`.
pub(super) fn run(a: TrainArgs, given: &Given, ranks: &Ranks) -> Result<()> {
    let plan = plan(&a, given, ranks)?;
    let (rows, dims) = plan.src.shape()?;
    // A shard holds 4 bytes per value and 4 per label.
    let (rt, shard_bytes) = runtime(
        &a.mem,
        plan.default_cap,
        (rows * (dims as u64 * 4 + 4), 1 << 20),
        ranks,
        // Each task pins its shard; the model's own memory is checked
        // once the classes are known (`train::load`).
        |cap, sb, n| Workers::plan(cap, 0, train::aligned_shard_bytes(sb, dims), n),
    )?;
    let mut session = Session::on(rt, ranks.clone());
    // Under MPI, the timeline is rank 0's.
    if let Some(p) = &a.mem.timeline {
        session.record_timeline(p, "load")?;
    }
    // Whole L-BFGS tasks per shard: the model does not depend on the
    // sharding.
    let shard_bytes = train::aligned_shard_bytes(shard_bytes, dims);
    let bound = train::spread_limit(&plan.cfg, rows, dims, shard_bytes);
    let (job, growth) = grow::load_and_grow(&session, a.mem.max_ranks, bound, |s, again| {
        // After growth, of rank 0's shard size (local SGD's model
        // depends on it).
        let mut size = [shard_bytes];
        if again {
            s.ranks().broadcast_u64(&mut size);
        }
        load(s, &plan, size[0])
    })?;
    let out = fit(&session, &job, &plan.cfg)?;
    session.phase("output");
    report(&a, session, (&plan.cfg, growth), &job, &out)
}

/// What a command line asks for, its flags checked.
struct Plan {
    src: Source,
    labels: Labels,
    /// `--sample-weight`.
    weights: Option<PathBuf>,
    /// `--classes`, or the blobs' (none for a file without it).
    classes: Option<usize>,
    cfg: TrainConfig,
    /// The cap without `--mem-cap`.
    default_cap: MemoryCap,
}

/// Checks the flags (warning about those that do not apply) and makes the
/// plan. On rank 0, checks that the outputs can be written.
fn plan(a: &TrainArgs, given: &Given, ranks: &Ranks) -> Result<Plan> {
    warn_unused(a, given);
    positive("--shards", a.shards)?;
    // Rank 0 writes the outputs.
    if ranks.is_root() {
        let outputs = [
            ("--output", &a.output),
            ("--stats", &a.mem.stats),
            ("--timeline", &a.mem.timeline),
        ];
        let inputs = [("--input", &a.input), ("--targets", &a.targets)];
        check_outputs(&named(&outputs), &named(&inputs))?;
    }
    check_solver_flags(a)?;
    if !(0.0..1.0).contains(&a.holdout) {
        return Err(Error::Input(format!(
            "--holdout must be in [0, 1), not {}",
            a.holdout
        )));
    }
    let (src, labels, classes) = match (&a.input, &a.targets) {
        (Some(x), Some(y)) => (
            file_source(x, a.dims, a.key.as_deref())?,
            Labels::File(y.clone()),
            a.classes,
        ),
        _ => {
            let classes = positive("--classes", a.classes.unwrap_or(10))?;
            let src = synthetic_source(&a.synthetic, a.dims.unwrap_or(256), classes, a.seed)?;
            (src, Labels::Blobs, Some(classes))
        }
    };
    let default_cap = match a.input {
        None => MemoryCap::Bytes(256 << 20),
        Some(_) => MemoryCap::Auto,
    };
    Ok(Plan {
        src,
        labels,
        weights: a.sample_weight.clone(),
        classes,
        cfg: config(a),
        default_cap,
    })
}

/// Warns about the flags given that do not apply: to the input, or to
/// the other solver.
fn warn_unused(a: &TrainArgs, given: &Given) {
    warn_dims(given, a.input.as_deref());
    if a.input.is_some() {
        given.warn_unused(
            &[("synthetic", "--synthetic")],
            "applies to synthetic data, not to --input",
        );
    }
    match a.solver {
        SolverArg::Lbfgs => given.warn_unused(
            &[
                ("rounds", "--rounds"),
                ("local_epochs", "--local-epochs"),
                ("lr", "--lr"),
                ("batch", "--batch"),
            ],
            "applies to --solver sgd",
        ),
        SolverArg::Sgd => given.warn_unused(
            &[("c", "--C"), ("tol", "--tol"), ("max_iter", "--max-iter")],
            "applies to --solver lbfgs",
        ),
    }
}

/// Each solver's own settings, checked when that solver runs.
fn check_solver_flags(a: &TrainArgs) -> Result<()> {
    match a.solver {
        SolverArg::Sgd => {
            positive("--batch", a.batch)?;
            positive("--local-epochs", a.local_epochs)?;
            positive("--rounds", a.rounds)?;
            if !(a.lr.is_finite() && a.lr > 0.0) {
                return Err(Error::Input(format!(
                    "--lr must be a positive number, not {}",
                    a.lr
                )));
            }
        }
        SolverArg::Lbfgs => {
            positive("--max-iter", a.max_iter)?;
            if !(a.c.is_finite() && a.c > 0.0) {
                return Err(Error::Input(format!(
                    "--C must be a positive number, not {}",
                    a.c
                )));
            }
            if !(a.tol.is_finite() && a.tol >= 0.0) {
                return Err(Error::Input(format!(
                    "--tol must be a number >= 0, not {}",
                    a.tol
                )));
            }
        }
    }
    Ok(())
}

/// The library's settings from the flags.
fn config(a: &TrainArgs) -> TrainConfig {
    TrainConfig {
        solver: match a.solver {
            SolverArg::Lbfgs => Solver::Lbfgs,
            SolverArg::Sgd => Solver::Sgd,
        },
        c: a.c,
        tol: a.tol,
        max_iter: a.max_iter,
        rounds: a.rounds,
        local_epochs: a.local_epochs,
        lr: a.lr,
        batch: a.batch,
        holdout: a.holdout,
        seed: a.seed,
        shards: a.shards,
        ..TrainConfig::default()
    }
}

/// Loads the job (a progress bar on a terminal), then says what will run.
fn load(session: &Session, plan: &Plan, shard_bytes: u64) -> Result<Job> {
    let (rows, dims) = plan.src.shape()?;
    let mut fb = Feedback::new();
    fb.stage("loading", rows);
    let job = train::load(
        session,
        &plan.src,
        train::Targets {
            labels: &plan.labels,
            weights: plan.weights.as_deref(),
            classes: plan.classes,
        },
        shard_bytes,
        &plan.cfg,
        |done, _| fb.progress(done),
    )?;
    fb.done();
    let (rt, ranks, cfg) = (session.runtime(), session.ranks(), &plan.cfg);
    if ranks.size() > 1 {
        say!(
            "{} processes: rank 0 holds rows {}..{}; cap, workers and shards per process",
            ranks.size(),
            job.first_row,
            job.first_row + job.shard_rows.iter().map(|&n| u64::from(n)).sum::<u64>()
        );
    }
    say!(
        "outcore train: {} rows x {} dims ({}), {} classes, {}, {}, cap {}, {}",
        job.rows,
        job.dims,
        format_bytes(rows * dims as u64 * 4),
        job.classes,
        match cfg.solver {
            Solver::Lbfgs => format!("L-BFGS (C = {}, tol = {:e})", cfg.c, cfg.tol),
            Solver::Sgd => "local SGD".to_string(),
        },
        plural(job.shards.len(), "shard"),
        rt.cap().map_or("none".into(), format_bytes),
        plural(rt.workers(), "worker")
    );
    for w in start_warnings(rt) {
        say!("{w}");
    }
    Ok(job)
}

/// Trains the job: a line per round or iteration, each phase named on the
/// timeline, and for L-BFGS why it stopped.
fn fit(session: &Session, job: &Job, cfg: &TrainConfig) -> Result<Trained> {
    session.phase(match cfg.solver {
        Solver::Lbfgs => "iteration 1",
        Solver::Sgd => "round 1",
    });
    let mut moved = Moved::new(session);
    let accuracy = |a: Option<f64>| {
        a.map_or(String::new(), |a| {
            format!(", held-out accuracy {:.2}%", a * 100.0)
        })
    };
    let out = train::train(session, job, cfg, |ev| match ev {
        Event::Round(r) => {
            say!(
                "round {}/{}: {:.2}s{}, {}",
                r.index + 1,
                cfg.rounds,
                r.seconds,
                accuracy((cfg.holdout > 0.0).then_some(r.accuracy)),
                moved.since()
            );
            session.phase(&format!("round {}", r.index + 2));
        }
        Event::Iteration(it) => {
            say!(
                "iteration {}: {:.2}s, objective {:.6e}, max |gradient| {:.2e}{}, {} pass{}, {}",
                it.index,
                it.seconds,
                it.objective,
                it.grad_max,
                accuracy(it.accuracy),
                it.evaluations,
                if it.evaluations == 1 { "" } else { "es" },
                moved.since()
            );
            session.phase(&format!("iteration {}", it.index + 1));
        }
    })?;
    if let (Some(stop), Some(it)) = (out.stop, &out.last) {
        say!(
            "{} after {} iteration{} ({} passes): {}",
            if stop.converged() {
                "converged"
            } else {
                "stopped"
            },
            it.index,
            if it.index == 1 { "" } else { "s" },
            it.evaluations,
            stop.describe()
        );
    }
    Ok(out)
}

/// The disk traffic between progress lines.
struct Moved<'a> {
    session: &'a Session,
    last: Stats,
    /// Bytes read from disk: spill files and the input file.
    last_read: u64,
}

impl<'a> Moved<'a> {
    fn new(session: &'a Session) -> Moved<'a> {
        let last = session.runtime().stats();
        let last_read = last.bytes_read + session.input_bytes_read();
        Moved {
            session,
            last,
            last_read,
        }
    }

    /// The evictions, loads and bytes read and written since the last
    /// call.
    fn since(&mut self) -> String {
        let s = self.session.runtime().stats();
        let now_read = s.bytes_read + self.session.input_bytes_read();
        let text = format!(
            "evictions {}, loads {}, read {}, written {}",
            s.evictions - self.last.evictions,
            s.loads - self.last.loads,
            format_bytes(now_read - self.last_read),
            format_bytes(s.bytes_written - self.last.bytes_written),
        );
        self.last = s;
        self.last_read = now_read;
        text
    }
}

/// Writes the outputs (rank 0 the model and the statistics), gathers
/// every rank's figures and, on rank 0, says the summary.
fn report(
    a: &TrainArgs,
    mut session: Session,
    (cfg, growth): (&TrainConfig, Option<Growth>),
    job: &Job,
    out: &Trained,
) -> Result<()> {
    let root = session.is_root();
    // Rank 0 writes the outputs.
    let mut outs = Outputs::new(&[
        ("--output", if root { &a.output } else { &None }),
        ("--timeline", &a.mem.timeline),
        ("--stats", if root { &a.mem.stats } else { &None }),
    ]);
    if let (Some(p), true) = (&a.output, root) {
        let shape = [job.classes as u64, job.dims as u64 + 1];
        outs.write("--output", npy::write_array(p, &shape, &out.model.w))?;
    }
    let s = session.runtime().stats();
    outs.write("--timeline", session.finish_timeline(&s))?;
    warn_failed_writes(session.runtime(), &s);
    // Every rank's figures, on rank 0 (the others are done).
    let Some(report) = session.report_at(&s).map_err(|e| outs.failed(e))? else {
        return Ok(());
    };
    let final_accuracy = final_accuracy(cfg, out);
    if let Some(p) = &a.mem.stats {
        let figures = RunFigures {
            job: &TrainStats::new(cfg, job, out),
            session: report.figures(&session, &s, growth.as_slice()),
        };
        outs.write("--stats", write_json(p, &figures))?;
    }
    let tot = report.total;
    say!(
        "done in {:.1}s: {}{} {}; evictions {}, loads {}, read {}, written {}",
        tot.wall_seconds,
        final_accuracy.map_or(String::new(), |a| format!(
            "held-out accuracy {:.2}%; ",
            a * 100.0
        )),
        if session.ranks().size() > 1 {
            "largest peak"
        } else {
            "peak"
        },
        format_bytes(tot.peak_bytes),
        tot.evictions,
        tot.loads,
        format_bytes(tot.bytes_read),
        format_bytes(tot.bytes_written)
    );
    Ok(())
}
