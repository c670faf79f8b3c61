//! Least squares under the cap: linear regression and ridge regression
//! (`outcore linear`), on the [job interface](crate::job).
//!
//! Two passes over the rows: the (weighted) means of the columns and
//! targets, then the Gram matrix of the centred rows and targets, summed
//! in float64 in the interface's fixed order. The normal equations
//! `(X'WX + alpha I) b = X'Wy` of the centred data are then solved by
//! Cholesky; the intercept is `mean(y) - mean(x) . b`, not penalised, as
//! scikit-learn's `Ridge` and `LinearRegression` fit it. Without a
//! penalty the Gram matrix's eigenvalues give the rank and the singular
//! values, and a singular or nearly singular system is solved by its
//! pseudo-inverse (the least-norm solution, as `lstsq` gives).
//!
//! Every target has its own `alpha` when several are given.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::job::linalg::{cholesky, cholesky_solve, eigh, eigh_bytes};
use crate::job::moments::{add_centred_gram, add_means, means, means_len};
use crate::job::{Algorithm, Rows, Shape, Step};

mod nnls;

/// Settings of a least-squares fit.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearConfig {
    /// Fit an intercept (the data centred first).
    pub fit_intercept: bool,
    /// The L2 penalty: one value for every target, or one per target.
    /// 0 is plain least squares.
    pub alpha: Vec<f64>,
    /// Coefficients constrained to be >= 0 (non-negative least squares).
    pub positive: bool,
}

impl Default for LinearConfig {
    fn default() -> LinearConfig {
        LinearConfig {
            fit_intercept: true,
            alpha: vec![0.0],
            positive: false,
        }
    }
}

/// A fitted linear model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinearFit {
    /// Coefficients, `targets x dims`, row-major.
    pub coef: Vec<f64>,
    /// One intercept per target (0 without `fit_intercept`).
    pub intercept: Vec<f64>,
    /// Rank of the centred data (without a penalty; else `dims`).
    pub rank: usize,
    /// Singular values of the centred (weighted) data, descending
    /// (without a penalty; else empty).
    pub singular: Vec<f64>,
    /// How the system was solved: "cholesky", "pseudo-inverse" or "nnls"
    /// (non-negative, by active sets).
    pub solver: &'static str,
    /// Total sample weight (the rows, without weights).
    pub weight: f64,
    /// The coefficient of determination on the rows fitted, per target
    /// (weighted): `1 - SS_res / SS_tot`, from the Gram matrix.
    pub r2: Vec<f64>,
}

/// The passes of a least-squares fit.
#[derive(Debug)]
pub enum Pass {
    /// The means.
    Means,
    /// The centred Gram matrix, about these means.
    Gram {
        /// Column means.
        x: Vec<f64>,
        /// Target means.
        y: Vec<f64>,
        /// Total weight.
        weight: f64,
    },
}

/// Linear or ridge regression on the job interface.
#[derive(Debug)]
pub struct Linear {
    cfg: LinearConfig,
}

impl Linear {
    /// A fit with these settings.
    pub fn new(cfg: LinearConfig) -> Linear {
        Linear { cfg }
    }

    /// The penalty of target `t`.
    fn alpha(&self, t: usize) -> f64 {
        self.cfg
            .alpha
            .get(t)
            .or(self.cfg.alpha.first())
            .copied()
            .unwrap_or(0.0)
    }
}

impl Algorithm for Linear {
    type State = Pass;
    type Fitted = LinearFit;

    fn describe(&self, shape: &Shape) -> String {
        let what = if self.cfg.alpha.iter().all(|&a| a == 0.0) {
            "linear regression"
        } else {
            "ridge regression"
        };
        format!(
            "{what} on {} columns and {} target{}",
            shape.dims,
            shape.targets,
            if shape.targets == 1 { "" } else { "s" }
        )
    }

    fn start(&mut self, shape: &Shape) -> Result<Pass> {
        if shape.targets == 0 {
            return Err(Error::Input("linear regression needs targets".into()));
        }
        let n = self.cfg.alpha.len();
        if n != 1 && n != shape.targets {
            return Err(Error::Input(format!(
                "{n} penalties (alpha) for {} targets: give one, or one per target",
                shape.targets
            )));
        }
        if let Some(a) = self
            .cfg
            .alpha
            .iter()
            .find(|a| !(a.is_finite() && **a >= 0.0))
        {
            return Err(Error::Input(format!(
                "alpha must be a finite number >= 0, not {a}"
            )));
        }
        Ok(if self.cfg.fit_intercept {
            Pass::Means
        } else {
            Pass::Gram {
                x: vec![0.0; shape.dims],
                y: vec![0.0; shape.targets],
                weight: f64::NAN,
            }
        })
    }

    fn sums(&self, state: &Pass, shape: &Shape) -> usize {
        match state {
            Pass::Means => means_len(shape.dims, shape.targets),
            Pass::Gram { .. } => (shape.dims + shape.targets).pow(2),
        }
    }

    fn most_sums(&self, shape: &Shape) -> usize {
        (shape.dims + shape.targets).pow(2)
    }

    fn step_memory(&self, shape: &Shape) -> Option<(&'static str, u64)> {
        // The Gram matrix of the columns, its Cholesky factor and the
        // spectrum's eigendecomposition.
        let d = shape.dims;
        let bytes = eigh_bytes(d) + 2 * (d as u64).pow(2) * 8;
        Some(("the solve and its eigendecomposition", bytes))
    }

    fn task(state: &Pass, rows: &Rows<'_>, out: &mut [f64]) {
        match state {
            Pass::Means => add_means(rows, out),
            Pass::Gram { x, y, .. } => add_centred_gram(rows, x, y, out),
        }
    }

    fn step(
        &mut self,
        state: Pass,
        sums: Vec<f64>,
        shape: &Shape,
    ) -> Result<Step<Pass, LinearFit>> {
        match state {
            Pass::Means => {
                let (x, y, weight) = means(&sums, shape.dims)?;
                Ok(Step::Pass(Pass::Gram { x, y, weight }))
            }
            Pass::Gram { x, y, weight } => {
                self.solve(&sums, shape, (&x, &y, weight)).map(Step::Done)
            }
        }
    }
}

impl Linear {
    /// The coefficients from the centred Gram matrix `g` of the columns
    /// and targets, and the intercepts from the `means`.
    fn solve(
        &self,
        g: &[f64],
        shape: &Shape,
        (mx, my, weight): (&[f64], &[f64], f64),
    ) -> Result<LinearFit> {
        let (d, t) = (shape.dims, shape.targets);
        let cols = d + t;
        let xx: Vec<f64> = (0..d)
            .flat_map(|i| g[i * cols..i * cols + d].iter().copied())
            .collect();
        let plain = (0..t).all(|j| self.alpha(j) == 0.0);
        let scale = (0..d).map(|i| xx[i * d + i]).fold(0.0, f64::max);
        let mut fit = LinearFit {
            coef: Vec::with_capacity(t * d),
            intercept: Vec::with_capacity(t),
            rank: d,
            singular: Vec::new(),
            solver: "cholesky",
            weight,
            r2: Vec::with_capacity(t),
        };
        // Without a penalty the spectrum gives the rank and singular
        // values; with one it is needed only when Cholesky fails.
        let mut eig = None;
        if plain {
            let e = Spectrum::of(&xx, d)?;
            fit.rank = e.rank();
            fit.singular = e.values.iter().map(|&v| v.max(0.0).sqrt()).collect();
            eig = Some(e);
        }
        for (j, &my_j) in my.iter().enumerate().take(t) {
            let alpha = self.alpha(j);
            let mut a = xx.clone();
            for i in 0..d {
                a[i * d + i] += alpha;
            }
            let mut b: Vec<f64> = (0..d).map(|i| g[i * cols + d + j]).collect();
            let singular = eig.as_ref().is_some_and(|e| plain && e.rank() < d);
            b = self.coefficients(
                (&xx, &a, b),
                (d, alpha, scale, singular),
                &mut eig,
                &mut fit,
            )?;
            fit.r2.push(r2(g, (d, t, j), &xx, &b));
            let b0 = my_j - mx.iter().zip(&b).map(|(m, c)| m * c).sum::<f64>();
            fit.intercept
                .push(if self.cfg.fit_intercept { b0 } else { 0.0 });
            fit.coef.extend(b);
        }
        Ok(fit)
    }
}

impl Linear {
    /// One target's coefficients from `a = X^T X + alpha I` and
    /// `b = X^T y` (`scale`: the largest diagonal of `xx`): by Cholesky, or (`singular`, or Cholesky failing) the
    /// pseudo-inverse from the spectrum of `xx` (made once, into `eig`);
    /// non-negative by active sets with `positive`. `fit.solver` says how.
    fn coefficients(
        &self,
        (xx, a, mut b): (&[f64], &[f64], Vec<f64>),
        (d, alpha, scale, singular): (usize, f64, f64, bool),
        eig: &mut Option<Spectrum>,
        fit: &mut LinearFit,
    ) -> Result<Vec<f64>> {
        if self.cfg.positive {
            fit.solver = "nnls";
            return Ok(nnls::nnls(a, &b, d));
        }
        match cholesky(a, d, (scale + alpha) * 1e-13).filter(|_| !singular) {
            Some(l) => cholesky_solve(&l, d, &mut b),
            None => {
                if eig.is_none() {
                    *eig = Some(Spectrum::of(xx, d)?);
                }
                if let Some(e) = eig.as_ref() {
                    b = e.solve(alpha, &b);
                }
                fit.solver = "pseudo-inverse";
            }
        }
        Ok(b)
    }
}

/// Target `j`'s R^2 on the rows fitted, from the centred Gram matrix `g`
/// of the `d` columns and `t` targets (its columns' block `xx`) and the
/// coefficients `b`: `SS_res = y'y - 2 b'X'y + b'X'X b`, `SS_tot = y'y`
/// (centred; without an intercept the data is not centred and this is
/// the uncentred R^2). 1 when the target is constant and fitted exactly.
fn r2(g: &[f64], (d, t, j): (usize, usize, usize), xx: &[f64], b: &[f64]) -> f64 {
    let cols = d + t;
    let yy = g[(d + j) * cols + d + j];
    let xy: f64 = (0..d).map(|i| b[i] * g[i * cols + d + j]).sum();
    let bxxb: f64 = (0..d)
        .map(|i| b[i] * (0..d).map(|k| xx[i * d + k] * b[k]).sum::<f64>())
        .sum();
    let res = (yy - 2.0 * xy + bxxb).max(0.0);
    if yy > 0.0 {
        1.0 - res / yy
    } else if res == 0.0 {
        1.0
    } else {
        0.0
    }
}

/// The eigendecomposition of a Gram matrix, and the cut under which its
/// eigenvalues count as 0.
struct Spectrum {
    values: Vec<f64>,
    vectors: Vec<f64>,
    cut: f64,
    d: usize,
}

impl Spectrum {
    fn of(xx: &[f64], d: usize) -> Result<Spectrum> {
        let (values, vectors) = eigh(xx, d)
            .ok_or_else(|| Error::Input("the Gram matrix's eigenvalues did not converge".into()))?;
        let top = values.first().copied().unwrap_or(0.0).max(0.0);
        Ok(Spectrum {
            values,
            vectors,
            cut: top * f64::EPSILON * d.max(1) as f64 * 16.0,
            d,
        })
    }

    /// Eigenvalues over the cut.
    fn rank(&self) -> usize {
        self.values.iter().filter(|&&v| v > self.cut).count()
    }

    /// `(A + alpha I)^+ b`: the least-norm solution.
    fn solve(&self, alpha: f64, b: &[f64]) -> Vec<f64> {
        pseudo_solve(&self.values, &self.vectors, self.d, (self.cut, alpha), b)
    }
}

/// `(A + alpha I)^+ b` for the symmetric `A = V diag(vals) V^T` (the
/// rows of `vecs` its eigenvectors), eigenvalues at most `cut` taken as
/// 0.
fn pseudo_solve(
    vals: &[f64],
    vecs: &[f64],
    d: usize,
    (cut, alpha): (f64, f64),
    b: &[f64],
) -> Vec<f64> {
    let mut out = vec![0.0; d];
    for (k, &v) in vals.iter().enumerate() {
        let v = if v <= cut { 0.0 } else { v } + alpha;
        if v <= cut {
            continue;
        }
        let u = &vecs[k * d..(k + 1) * d];
        let c = u.iter().zip(b).map(|(a, b)| a * b).sum::<f64>() / v;
        for (o, a) in out.iter_mut().zip(u) {
            *o += c * a;
        }
    }
    out
}
