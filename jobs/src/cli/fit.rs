//! The subcommands of the job interface (`outcore linear`, `outcore
//! pca`): their flags, and the one runner they share (the runtime, the
//! load, the passes with a line each, the outputs and the summary).

use std::path::PathBuf;

use clap::Args;
use outcore::{format_bytes, MemoryCap};
use outcore_jobs::grow::Growth;
use outcore_jobs::job::{self, Algorithm, Data, Input, Layout, Online, RunStats, Targets};
use outcore_jobs::linear::{Linear, LinearConfig};
use outcore_jobs::pca::{Components, Pca, Solver};
use outcore_jobs::ranks::Ranks;
use outcore_jobs::{check_outputs, npy, write_json, Error, Result, Session, Source, Workers};
use serde::Serialize;

use super::progress::Feedback;
use super::{
    file_source, finish_session, named, plural, positive, runtime, start_warnings,
    synthetic_source, warn_dims, Given, MemoryArgs, Outputs,
};

/// The rows, and the flags every job of the interface has.
#[derive(Args, Debug)]
pub(super) struct RowsArgs {
    /// Input rows: .npy (2-D float32/float64/float16), .npz, .fvecs, or
    /// raw float32 (with --dims). Without it, synthetic data.
    #[arg(long, value_name = "FILE")]
    pub(super) input: Option<PathBuf>,
    /// The array to read from an --input .npz archive (default: its
    /// first).
    #[arg(long, value_name = "NAME")]
    key: Option<String>,
    /// Size of the synthetic data.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "256MiB",
        allow_hyphen_values = true
    )]
    synthetic: String,
    /// Dimensions of synthetic data, or columns of a raw input file.
    #[arg(long, value_name = "D")]
    dims: Option<usize>,
    /// Seed of the synthetic data.
    #[arg(long, default_value_t = 42)]
    pub(super) seed: u64,
    /// Shards the rows' tasks are cut into: the order of every sum, and
    /// the unit spread over MPI processes (at least one each). The result
    /// depends on it, not on the number of processes or the cap.
    #[arg(long, value_name = "S", default_value_t = 8)]
    shards: usize,
    #[command(flatten)]
    pub(super) mem: MemoryArgs,
}

/// Flags of `outcore linear`.
#[derive(Args, Debug)]
pub(super) struct LinearArgs {
    #[command(flatten)]
    pub(super) rows: RowsArgs,
    /// Targets for --input: a 1-D (one target) or 2-D float .npy, a row
    /// per input row.
    #[arg(long, value_name = "FILE", requires = "input")]
    targets: Option<PathBuf>,
    /// Sample weights for --input: a 1-D float .npy, one per row (finite,
    /// >= 0).
    #[arg(long, value_name = "FILE", requires = "input")]
    sample_weight: Option<PathBuf>,
    /// Ridge penalty (L2): one value, or one per target separated by
    /// commas. 0 is linear regression.
    #[arg(
        long,
        value_name = "A[,A...]",
        default_value = "0",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    alpha: Vec<f64>,
    /// Fit no intercept (the data is not centred).
    #[arg(long)]
    no_intercept: bool,
    /// Constrain the coefficients to be >= 0 (non-negative least
    /// squares, by active sets on the normal equations).
    #[arg(long)]
    positive: bool,
    /// Synthetic data: target columns, each a noisy linear function of
    /// the rows.
    #[arg(long, value_name = "T", default_value_t = 1)]
    synthetic_targets: usize,
    /// Write the model (float64, targets x (D + 1), the intercept last)
    /// to this .npy file.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum SolverArg {
    Exact,
    Randomized,
}

/// Flags of `outcore pca`.
#[derive(Args, Debug)]
pub(super) struct PcaArgs {
    #[command(flatten)]
    pub(super) rows: RowsArgs,
    /// Components to keep: a count, a share of the variance in (0, 1)
    /// (the fewest components explaining more), or `all`.
    #[arg(long, value_name = "N|SHARE|all", default_value = "all")]
    n_components: String,
    /// `exact`: the covariance's eigenvectors (a `D x D` matrix per task
    /// in flight); `randomized`: subspace iteration over passes of the
    /// data (a `D x (N + oversamples)` matrix), for many columns and a
    /// count of components.
    #[arg(long, value_enum, default_value_t = SolverArg::Exact)]
    solver: SolverArg,
    /// Randomized: directions beyond the components kept.
    #[arg(long, default_value_t = 10)]
    n_oversamples: usize,
    /// Randomized: power iterations, as scikit-learn counts them (`auto`:
    /// 7 when fewer components than a tenth of the columns are kept, else
    /// 4); each is a pass over the data, and two more follow.
    #[arg(long, value_name = "N|auto", default_value = "auto")]
    iterated_power: String,
    /// Write the components (float64, n_components x D) to this .npy
    /// file; the means and variances are in --stats.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Runs `outcore linear`.
pub(super) fn run_linear(a: LinearArgs, given: &Given, ranks: &Ranks) -> Result<()> {
    if a.rows.input.is_some() && a.targets.is_none() {
        return Err(Error::Input("--input needs --targets".into()));
    }
    if a.rows.input.is_some() {
        given.warn_unused(
            &[("synthetic_targets", "--synthetic-targets")],
            "applies to synthetic data, not to --input",
        );
    }
    if let Some(x) = a.alpha.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
        return Err(Error::Input(format!(
            "--alpha must be a number >= 0, not {x}"
        )));
    }
    let src = source(
        &a.rows,
        given,
        ranks,
        &[
            ("--targets", &a.targets),
            ("--sample-weight", &a.sample_weight),
        ],
        &a.output,
    )?;
    let input = Input {
        source: &src,
        targets: match &a.targets {
            Some(p) => Targets::File(Source::targets(p)?),
            None => Targets::Synthetic {
                count: positive("--synthetic-targets", a.synthetic_targets)?,
                noise: 0.1,
                seed: a.rows.seed,
            },
        },
        weights: a.sample_weight.as_deref(),
    };
    let mut alg = Linear::new(LinearConfig {
        fit_intercept: !a.no_intercept,
        alpha: a.alpha.clone(),
        positive: a.positive,
    });
    let (session, fit, run) = fit_job(&a.rows, &input, &mut alg, ranks, "linear")?;
    let (shape, model) = with_intercepts(&fit.coef, &fit.intercept, run.dims);
    let r2: Vec<String> = fit.r2.iter().map(|r| format!("{r:.4}")).collect();
    let said = format!(
        "R^2 {} on the rows fitted, rank {}, solved by {}",
        r2.join(", "),
        fit.rank,
        fit.solver
    );
    report(
        session,
        (&a.rows, &a.output),
        (&shape, &model),
        &run,
        (&fit, &said),
    )
}

/// Runs `outcore pca`.
pub(super) fn run_pca(a: PcaArgs, given: &Given, ranks: &Ranks) -> Result<()> {
    let components = parse_components(&a.n_components)?;
    let src = source(&a.rows, given, ranks, &[], &a.output)?;
    let mut alg = Pca::new(components);
    if let SolverArg::Randomized = a.solver {
        let Components::Count(k) = components else {
            return Err(Error::Input(
                "--solver randomized needs a count of --n-components".into(),
            ));
        };
        let dims = src.shape()?.1;
        let iterations = match a.iterated_power.as_str() {
            "auto" if k * 10 < dims => 7,
            "auto" => 4,
            n => n.parse::<usize>().map_err(|_| {
                Error::Input(format!("--iterated-power must be a count or auto, not {n}"))
            })?,
        };
        alg = alg.solver(Solver::Randomized {
            oversamples: a.n_oversamples,
            iterations,
            seed: a.rows.seed,
        });
    } else {
        given.warn_unused(
            &[
                ("n_oversamples", "--n-oversamples"),
                ("iterated_power", "--iterated-power"),
            ],
            "applies to --solver randomized",
        );
    }
    let (session, fit, run) = fit_job(&a.rows, &Input::rows(&src), &mut alg, ranks, "pca")?;
    let shape = [fit.n_components as u64, run.dims as u64];
    let kept: f64 = fit.explained_variance_ratio.iter().sum();
    let said = format!(
        "{} kept, explaining {:.2}% of the variance",
        plural(fit.n_components, "component"),
        kept * 100.0
    );
    report(
        session,
        (&a.rows, &a.output),
        (&shape, &fit.components),
        &run,
        (&fit, &said),
    )
}

/// A linear model's file: one row per model, its `dims` coefficients and
/// then its intercept; the shape and the values.
pub(super) fn with_intercepts(
    coef: &[f64],
    intercept: &[f64],
    dims: usize,
) -> ([u64; 2], Vec<f64>) {
    let model = intercept
        .iter()
        .enumerate()
        .flat_map(|(k, &b)| coef[k * dims..(k + 1) * dims].iter().copied().chain([b]))
        .collect();
    ([intercept.len() as u64, dims as u64 + 1], model)
}

/// `--n-components`: a count, a share in (0, 1), or `all`.
fn parse_components(s: &str) -> Result<Components> {
    if s == "all" {
        return Ok(Components::All);
    }
    if let Ok(n) = s.parse::<usize>() {
        return positive("--n-components", n).map(Components::Count);
    }
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f < 1.0 => Ok(Components::Share(f)),
        _ => Err(Error::Input(format!(
            "--n-components must be a count, a share of the variance in (0, 1) or all, not {s}"
        ))),
    }
}

/// The rows the flags name, the outputs checked (on rank 0).
pub(super) fn source(
    a: &RowsArgs,
    given: &Given,
    ranks: &Ranks,
    inputs: &[(&'static str, &Option<PathBuf>)],
    output: &Option<PathBuf>,
) -> Result<Source> {
    warn_dims(given, a.input.as_deref());
    if a.input.is_some() {
        given.warn_unused(
            &[("synthetic", "--synthetic")],
            "applies to synthetic data, not to --input",
        );
    }
    positive("--shards", a.shards)?;
    if ranks.is_root() {
        let outputs = [
            ("--output", output),
            ("--stats", &a.mem.stats),
            ("--timeline", &a.mem.timeline),
        ];
        let mut all = vec![("--input", &a.input)];
        all.extend_from_slice(inputs);
        check_outputs(&named(&outputs), &named(&all))?;
    }
    match &a.input {
        Some(p) => file_source(p, a.dims, a.key.as_deref()),
        None => synthetic_source(&a.synthetic, a.dims.unwrap_or(64), 8, a.seed),
    }
}

/// Builds the session, loads `input` and fits `alg` to it, a line per
/// pass.
fn fit_job<A: Algorithm>(
    a: &RowsArgs,
    input: &Input<'_>,
    alg: &mut A,
    ranks: &Ranks,
    name: &str,
) -> Result<(Session, A::Fitted, RunStats)> {
    let (session, data, growth) = load(a, input, ranks)?;
    job::check(&session, &data, alg)?;
    say_start(&session, &data, name, &alg.describe(&data.shape));
    let (fit, mut run) = job::fit(&session, &data, alg, |p| {
        say!("pass {}: {:.2}s, {} sums", p.index, p.seconds, p.sums);
    })?;
    run.growth.extend(growth);
    Ok((session, fit, run))
}

/// [`fit_job`] for an online algorithm: a line per epoch.
pub(super) fn fit_online_job<A: Online>(
    a: &RowsArgs,
    input: &Input<'_>,
    alg: &mut A,
    ranks: &Ranks,
    name: &str,
) -> Result<(Session, A::Fitted, RunStats)> {
    let (session, data, growth) = load(a, input, ranks)?;
    say_start(&session, &data, name, &alg.describe(&data.shape));
    let (fit, mut run) = job::fit_online(&session, &data, alg, |p| {
        say!("epoch {}: {:.2}s", p.index, p.seconds);
    })?;
    run.growth.extend(growth);
    Ok((session, fit, run))
}

/// The session under the memory flags, and `input` loaded into it (a
/// progress bar on a terminal), grown onto free slots as `--max-ranks`
/// allows when it does not fit.
fn load(a: &RowsArgs, input: &Input<'_>, ranks: &Ranks) -> Result<(Session, Data, Option<Growth>)> {
    let (rows, dims) = input.source.shape()?;
    let default_cap = match a.input {
        None => MemoryCap::Bytes(256 << 20),
        Some(_) => MemoryCap::Auto,
    };
    let (rt, part_bytes) = runtime(
        &a.mem,
        default_cap,
        (rows * dims as u64 * 4, 1 << 20),
        ranks,
        |cap, pb, n| Workers::plan(cap, 0, pb, n),
    )?;
    let mut session = Session::on(rt, ranks.clone());
    if let Some(p) = &a.mem.timeline {
        session.record_timeline(p, "load")?;
    }
    let layout = Layout {
        shards: a.shards,
        ..Layout::default()
    };
    let mut fb = Feedback::new();
    fb.stage("loading", rows);
    let bound = layout.most_ranks(rows);
    let (data, growth) = super::grow::load_and_grow(&session, a.mem.max_ranks, bound, |s, _| {
        job::load(s, input, layout, part_bytes, |done, _| fb.progress(done))
    })?;
    fb.done();
    Ok((session, data, growth))
}

/// The run's first lines: what runs, and the warnings.
fn say_start(session: &Session, data: &Data, name: &str, what: &str) {
    let rt = session.runtime();
    let (rows, dims) = (data.shape.rows, data.shape.dims);
    say!(
        "outcore {name}: {} rows x {} dims ({}), {}, {}, cap {}, {}",
        rows,
        dims,
        format_bytes(rows * dims as u64 * 4),
        what,
        plural(data.x.parts.len(), "partition"),
        rt.cap().map_or("none".into(), format_bytes),
        plural(rt.workers(), "worker")
    );
    for w in start_warnings(rt) {
        say!("{w}");
    }
}

/// Writes the model (`--output`, rank 0), closes the timeline, writes
/// the statistics and says the summary with `said`.
pub(super) fn report<R: Serialize>(
    mut session: Session,
    (a, output): (&RowsArgs, &Option<PathBuf>),
    (shape, model): (&[u64], &[f64]),
    run: &RunStats,
    (result, said): (&R, &str),
) -> Result<()> {
    session.phase("output");
    let root = session.is_root();
    let mut outs = Outputs::new(&[
        ("--output", if root { output } else { &None }),
        ("--timeline", &a.mem.timeline),
        ("--stats", if root { &a.mem.stats } else { &None }),
    ]);
    if let (Some(p), true) = (output, root) {
        outs.write("--output", npy::write_array(p, shape, model))?;
    }
    let s = finish_session(&mut session, &mut outs)?;
    let json = run
        .to_json(&session, result, &s)
        .map_err(|e| outs.failed(e))?;
    let Some(json) = json else {
        return Ok(());
    };
    if let Some(p) = &a.mem.stats {
        outs.write("--stats", write_json(p, &json))?;
    }
    let g = |k: &str| json.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    say!(
        "done in {:.1}s: {said}; peak {}, evictions {}, loads {}, read {}, written {}",
        json.get("wall_seconds")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0),
        format_bytes(g("peak_bytes")),
        g("evictions"),
        g("loads"),
        format_bytes(g("bytes_read")),
        format_bytes(g("bytes_written"))
    );
    Ok(())
}
