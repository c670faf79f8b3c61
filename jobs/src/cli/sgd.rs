//! `outcore sgd`: a linear model by stochastic gradient descent
//! (scikit-learn's SGDClassifier and SGDRegressor), the rows held in
//! executors and the model in one.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use outcore_jobs::job::{Input, Targets};
use outcore_jobs::ranks::Ranks;
use outcore_jobs::sgd::{Loss, Penalty, Schedule, Sgd, SgdConfig};
use outcore_jobs::{Error, Result, Source};

use super::fit::{fit_online_job, report, source, with_intercepts, RowsArgs};
use super::{positive, Given};

#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
enum LossArg {
    Hinge,
    LogLoss,
    ModifiedHuber,
    SquaredHinge,
    Perceptron,
    SquaredError,
    Huber,
    EpsilonInsensitive,
    SquaredEpsilonInsensitive,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PenaltyArg {
    L2,
    L1,
    Elasticnet,
    None,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RateArg {
    Constant,
    Optimal,
    Invscaling,
    Adaptive,
}

/// Flags of `outcore sgd`.
#[derive(Args, Debug)]
pub(super) struct SgdArgs {
    #[command(flatten)]
    pub(super) rows: RowsArgs,
    /// Targets for --input: a 1-D float .npy, a row per input row (class
    /// indices 0..C-1 with --classes).
    #[arg(long, value_name = "FILE", requires = "input")]
    targets: Option<PathBuf>,
    /// Sample weights for --input: a 1-D float .npy, one per row.
    #[arg(long, value_name = "FILE", requires = "input")]
    sample_weight: Option<PathBuf>,
    /// Classify into C classes (the targets are class indices); without
    /// it, regression.
    #[arg(long, value_name = "C")]
    classes: Option<usize>,
    /// The loss. Default: hinge for classes, squared_error otherwise.
    #[arg(long, value_enum)]
    loss: Option<LossArg>,
    /// The penalty.
    #[arg(long, value_enum, default_value_t = PenaltyArg::L2)]
    penalty: PenaltyArg,
    /// The penalty's strength.
    #[arg(long, default_value_t = 1e-4, allow_negative_numbers = true)]
    alpha: f64,
    /// The elastic net's L1 share.
    #[arg(long, default_value_t = 0.15, allow_negative_numbers = true)]
    l1_ratio: f64,
    /// Fit no intercept.
    #[arg(long)]
    no_intercept: bool,
    /// Epochs at most.
    #[arg(long, default_value_t = 1000)]
    max_iter: usize,
    /// Stop when --n-iter-no-change epochs in a row improve by less than
    /// this (`none`: run --max-iter epochs).
    #[arg(long, default_value = "1e-3", allow_hyphen_values = true)]
    tol: String,
    /// Rows in file order every epoch (default: shuffled by --seed).
    #[arg(long)]
    no_shuffle: bool,
    /// The learning rate's schedule. Default: optimal for classes,
    /// invscaling otherwise.
    #[arg(long, value_enum)]
    learning_rate: Option<RateArg>,
    /// The initial learning rate (constant, invscaling, adaptive).
    /// Default: 0.01, or 1e-4 on synthetic data (its values reach 10 in
    /// magnitude, so 0.01 diverges, as it would on any unscaled data).
    #[arg(long, allow_negative_numbers = true)]
    eta0: Option<f64>,
    /// invscaling's exponent. Default: 0.5 for classes, 0.25 otherwise.
    #[arg(long, allow_negative_numbers = true)]
    power_t: Option<f64>,
    /// Stop on the score of held-out rows (--validation-fraction).
    #[arg(long)]
    early_stopping: bool,
    /// Share of the rows held out with --early-stopping.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    validation_fraction: f64,
    /// Epochs without improvement before stopping.
    #[arg(long, default_value_t = 5)]
    n_iter_no_change: usize,
    /// Averaged SGD: the model is the mean of the weights from update N
    /// on (1: every update; 0: off, the last weights).
    #[arg(long, value_name = "N", default_value_t = 0)]
    average: u64,
    /// Huber's and the epsilon-insensitive losses' epsilon.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    epsilon: f64,
    /// Write the model (float64, models x (D + 1), the intercept last; one
    /// model for regression or 2 classes, one per class otherwise) to
    /// this .npy file.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Runs `outcore sgd`.
pub(super) fn run(a: SgdArgs, given: &Given, ranks: &Ranks) -> Result<()> {
    if a.rows.input.is_some() && a.targets.is_none() {
        return Err(Error::Input("--input needs --targets".into()));
    }
    let cfg = config(&a)?;
    let inputs = [
        ("--targets", &a.targets),
        ("--sample-weight", &a.sample_weight),
    ];
    let src = source(&a.rows, given, ranks, &inputs, &a.output)?;
    let targets = match (&a.targets, cfg.classes) {
        (Some(p), _) => Targets::File(Source::targets(p)?),
        (None, 0) => Targets::Synthetic {
            count: 1,
            noise: 0.1,
            seed: a.rows.seed,
        },
        (None, c) => Targets::SyntheticClasses {
            classes: c,
            seed: a.rows.seed,
        },
    };
    let input = Input {
        source: &src,
        targets,
        weights: a.sample_weight.as_deref(),
    };
    let mut alg = Sgd::new(cfg);
    let (session, fit, run) = fit_online_job(&a.rows, &input, &mut alg, ranks, "sgd")?;
    let (shape, model) = with_intercepts(&fit.coef, &fit.intercept, run.dims);
    let said = format!(
        "{} after {} epoch{}",
        if fit.converged {
            "converged"
        } else {
            "stopped"
        },
        fit.n_iter,
        if fit.n_iter == 1 { "" } else { "s" }
    );
    report(
        session,
        (&a.rows, &a.output),
        (&shape, &model),
        &run,
        (&fit, &said),
    )
}

/// The library's settings from the flags, each checked by its flag.
fn config(a: &SgdArgs) -> Result<SgdConfig> {
    let classes = match a.classes {
        Some(c) if c < 2 => {
            return Err(Error::Input(format!(
                "--classes must be at least 2, not {c}"
            )))
        }
        c => c.unwrap_or(0),
    };
    let e = a.epsilon;
    let loss = match a.loss.unwrap_or(if classes > 0 {
        LossArg::Hinge
    } else {
        LossArg::SquaredError
    }) {
        LossArg::Hinge => Loss::Hinge,
        LossArg::LogLoss => Loss::LogLoss,
        LossArg::ModifiedHuber => Loss::ModifiedHuber,
        LossArg::SquaredHinge => Loss::SquaredHinge,
        LossArg::Perceptron => Loss::Perceptron,
        LossArg::SquaredError => Loss::SquaredError,
        LossArg::Huber => Loss::Huber(e),
        LossArg::EpsilonInsensitive => Loss::EpsilonInsensitive(e),
        LossArg::SquaredEpsilonInsensitive => Loss::SquaredEpsilonInsensitive(e),
    };
    if classes == 0 && loss.classifies() {
        return Err(Error::Input(
            "a classification --loss needs --classes (regression takes squared_error, huber or the epsilon-insensitive losses)".into(),
        ));
    }
    let tol = match a.tol.as_str() {
        "none" => None,
        t => match t.parse::<f64>() {
            Ok(v) if v.is_finite() => Some(v),
            _ => {
                return Err(Error::Input(format!(
                    "--tol must be a number or none, not {t}"
                )))
            }
        },
    };
    let learning_rate = match a.learning_rate {
        Some(RateArg::Constant) => Schedule::Constant,
        Some(RateArg::Optimal) => Schedule::Optimal,
        Some(RateArg::Invscaling) => Schedule::InvScaling,
        Some(RateArg::Adaptive) => Schedule::Adaptive,
        None if classes > 0 => Schedule::Optimal,
        None => Schedule::InvScaling,
    };
    Ok(SgdConfig {
        classes,
        loss,
        penalty: match a.penalty {
            PenaltyArg::L2 => Penalty::L2,
            PenaltyArg::L1 => Penalty::L1,
            PenaltyArg::Elasticnet => Penalty::ElasticNet,
            PenaltyArg::None => Penalty::None,
        },
        alpha: a.alpha,
        l1_ratio: a.l1_ratio,
        fit_intercept: !a.no_intercept,
        max_iter: positive("--max-iter", a.max_iter)?,
        tol,
        shuffle: !a.no_shuffle,
        seed: a.rows.seed,
        learning_rate,
        eta0: a
            .eta0
            .unwrap_or(if a.rows.input.is_some() { 0.01 } else { 1e-4 }),
        power_t: a.power_t.unwrap_or(if classes > 0 { 0.5 } else { 0.25 }),
        early_stopping: a.early_stopping,
        validation_fraction: a.validation_fraction,
        n_iter_no_change: positive("--n-iter-no-change", a.n_iter_no_change)?,
        warm: None,
        class_weight: Vec::new(),
        average: a.average,
    })
}
