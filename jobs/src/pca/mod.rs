//! Principal component analysis under the cap (`outcore pca`), on the
//! [job interface](crate::job), scikit-learn's `svd_solver =
//! "covariance_eigh"`.
//!
//! Two passes over the rows: the column means, then the Gram matrix of
//! the centred rows, summed in float64 in the interface's fixed order.
//! Its eigendecomposition gives the components (each signed so that its
//! largest entry in absolute value is positive, as scikit-learn's
//! `svd_flip` does) and the explained variances (`eigenvalue / (n - 1)`).
//! Memory: a `d x d` float64 matrix per task in flight, so the exact
//! solver suits up to a few thousand columns.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::job::linalg::{eigh, eigh_bytes};
use crate::job::moments::{add_centred_gram, add_means, add_projected, means, means_len};

mod randomized;
use crate::job::{Algorithm, Rows, Shape, Step};

/// How many components to keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Components {
    /// All of them: `min(rows, dims)`.
    All,
    /// This many.
    Count(usize),
    /// The fewest whose explained variance ratios add up to more than
    /// this share (in `(0, 1)`).
    Share(f64),
}

/// A fitted PCA.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PcaFit {
    /// Components kept.
    pub n_components: usize,
    /// The components, `n_components x dims`, row-major (not in the
    /// statistics: `--output` writes them).
    #[serde(skip)]
    pub components: Vec<f64>,
    /// Variance explained by each.
    pub explained_variance: Vec<f64>,
    /// Its share of the total variance.
    pub explained_variance_ratio: Vec<f64>,
    /// The singular values of the centred data.
    pub singular_values: Vec<f64>,
    /// The column means.
    pub mean: Vec<f64>,
    /// The mean variance of the components not kept (0 when all are).
    pub noise_variance: f64,
    /// The Gram matrix of the centred rows, `dims x dims`, when asked for
    /// ([`Pca::keep_gram`]): what an incremental PCA goes on from.
    #[serde(skip)]
    pub gram: Vec<f64>,
}

/// How the components are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Solver {
    /// The eigendecomposition of the covariance (`covariance_eigh`).
    Exact,
    /// Randomized subspace iteration on the covariance: `oversamples`
    /// extra directions, `iterations` power iterations as scikit-learn
    /// counts them (`iterations + 2` passes after the means), the start
    /// from `seed`.
    Randomized {
        /// Directions beyond the components kept.
        oversamples: usize,
        /// Power iterations (scikit-learn's `iterated_power`).
        iterations: usize,
        /// Seed of the starting subspace.
        seed: u64,
    },
}

/// The passes of a PCA.
#[derive(Debug)]
pub enum Pass {
    /// The means.
    Means,
    /// The Gram matrix of the rows centred on these means.
    Gram(Vec<f64>),
    /// A pass of subspace iteration (the randomized solver).
    Power(Power),
}

/// A pass of the randomized solver: `G Q` for the orthonormal `dims x
/// width` matrix `q`, with the rows centred on `mean`.
#[derive(Debug)]
pub struct Power {
    mean: Vec<f64>,
    q: Vec<f64>,
    width: usize,
    /// Power passes left after this one.
    left: usize,
}

/// PCA on the job interface.
#[derive(Debug)]
pub struct Pca {
    components: Components,
    keep_gram: bool,
    solver: Solver,
}

impl Pca {
    /// A PCA keeping `components`.
    pub fn new(components: Components) -> Pca {
        Pca {
            components,
            keep_gram: false,
            solver: Solver::Exact,
        }
    }

    /// With this solver.
    pub fn solver(mut self, solver: Solver) -> Pca {
        self.solver = solver;
        self
    }

    /// The randomized solver's width: the components and the oversamples,
    /// at most the columns.
    fn width(&self, dims: usize) -> usize {
        match (self.solver, self.components) {
            (Solver::Randomized { oversamples, .. }, Components::Count(k)) => {
                (k + oversamples).min(dims)
            }
            _ => dims,
        }
    }

    /// Keeps the Gram matrix of the centred rows in the fit
    /// ([`PcaFit::gram`]).
    pub fn keep_gram(mut self) -> Pca {
        self.keep_gram = true;
        self
    }
}

impl Algorithm for Pca {
    type State = Pass;
    type Fitted = PcaFit;

    fn describe(&self, shape: &Shape) -> String {
        format!("PCA on {} columns", shape.dims)
    }

    fn start(&mut self, shape: &Shape) -> Result<Pass> {
        let most = (shape.rows.min(shape.dims as u64)) as usize;
        match self.components {
            Components::Count(k) if k == 0 || k > most => Err(Error::Input(format!(
                "n_components={k} must be between 1 and min(n_samples, n_features)={most}"
            ))),
            Components::Share(s) if !(s > 0.0 && s < 1.0) => Err(Error::Input(format!(
                "a share of the variance must be in (0, 1), not {s}"
            ))),
            _ if shape.rows < 2 => Err(Error::Input(format!(
                "PCA needs at least 2 rows, the data has {}",
                shape.rows
            ))),
            Components::All | Components::Share(_)
                if matches!(self.solver, Solver::Randomized { .. }) =>
            {
                Err(Error::Input(
                    "the randomized solver needs a number of components".into(),
                ))
            }
            _ => Ok(Pass::Means),
        }
    }

    fn sums(&self, state: &Pass, shape: &Shape) -> usize {
        match state {
            Pass::Means => means_len(shape.dims, 0),
            Pass::Gram(_) => shape.dims * shape.dims,
            Pass::Power(p) => shape.dims * (p.width + 1),
        }
    }

    fn most_sums(&self, shape: &Shape) -> usize {
        match self.solver {
            Solver::Exact => shape.dims * shape.dims,
            Solver::Randomized { .. } => shape.dims * (self.width(shape.dims) + 1),
        }
    }

    fn step_memory(&self, shape: &Shape) -> Option<(&'static str, u64)> {
        let d = shape.dims;
        match self.solver {
            Solver::Exact => Some(("the eigendecomposition", eigh_bytes(d))),
            Solver::Randomized { .. } => None,
        }
    }

    fn task(state: &Pass, rows: &Rows<'_>, out: &mut [f64]) {
        match state {
            Pass::Means => add_means(rows, out),
            Pass::Gram(m) => add_centred_gram(rows, m, &[], out),
            Pass::Power(p) => add_projected(rows, &p.mean, &p.q, p.width, out),
        }
    }

    fn step(&mut self, state: Pass, sums: Vec<f64>, shape: &Shape) -> Result<Step<Pass, PcaFit>> {
        match state {
            Pass::Means => {
                let mean = means(&sums, shape.dims)?.0;
                Ok(Step::Pass(match self.solver {
                    Solver::Exact => Pass::Gram(mean),
                    Solver::Randomized {
                        iterations, seed, ..
                    } => {
                        let width = self.width(shape.dims);
                        Pass::Power(Power {
                            mean,
                            q: randomized::start(shape.dims, width, seed),
                            width,
                            // scikit-learn's count: its range finder's
                            // subspace is `G^(iterations + 1)` of the start
                            // (the final products with the data count once
                            // more), one power pass beyond `iterations`.
                            left: iterations + 1,
                        })
                    }
                }))
            }
            Pass::Gram(mean) => self.decompose(&sums, shape, mean).map(Step::Done),
            Pass::Power(p) => self.power(p, sums, shape),
        }
    }
}

impl Pca {
    /// After a pass of subspace iteration: the next one, or the
    /// components by Rayleigh-Ritz on the last subspace.
    fn power(&self, p: Power, mut sums: Vec<f64>, shape: &Shape) -> Result<Step<Pass, PcaFit>> {
        let (d, w) = (shape.dims, p.width);
        if p.left > 0 {
            sums.truncate(d * w);
            randomized::orthonormalise(&mut sums, d, w);
            return Ok(Step::Pass(Pass::Power(Power {
                q: sums,
                left: p.left - 1,
                ..p
            })));
        }
        let (vals, vecs) = randomized::ritz(&p.q, &sums[..d * w], d, w)
            .ok_or_else(|| Error::Input("the subspace's eigenvalues did not converge".into()))?;
        let total: f64 = sums[d * w..].iter().sum();
        self.finish(shape, (vals, vecs), total, p.mean)
            .map(Step::Done)
    }

    /// The components from the centred Gram matrix `g`.
    fn decompose(&self, g: &[f64], shape: &Shape, mean: Vec<f64>) -> Result<PcaFit> {
        let (vals, vecs) = eigh(g, shape.dims)
            .ok_or_else(|| Error::Input("the covariance's eigenvalues did not converge".into()))?;
        let total = vals.iter().map(|v| v.max(0.0)).sum();
        let mut fit = self.finish(shape, (vals, vecs), total, mean)?;
        if self.keep_gram {
            fit.gram = g.to_vec();
        }
        Ok(fit)
    }

    /// The fit from eigenvalues of the centred Gram matrix (descending)
    /// and their eigenvectors (rows, `dims` values each; as many as the
    /// values), with `total` the Gram matrix's trace: the components
    /// kept, signed as scikit-learn's, their variances and shares.
    fn finish(
        &self,
        shape: &Shape,
        (vals, mut vecs): (Vec<f64>, Vec<f64>),
        total: f64,
        mean: Vec<f64>,
    ) -> Result<PcaFit> {
        let d = shape.dims;
        let dof = (shape.rows - 1) as f64;
        let most = (shape.rows.min(d as u64)) as usize;
        let var: Vec<f64> = vals.iter().take(most).map(|&v| v.max(0.0) / dof).collect();
        let total = total / dof;
        let ratio: Vec<f64> = var
            .iter()
            .map(|&v| if total > 0.0 { v / total } else { 0.0 })
            .collect();
        let k = match self.components {
            Components::All => most,
            Components::Count(k) => k.min(var.len()),
            Components::Share(s) => {
                let mut acc = 0.0;
                let mut k = most;
                for (i, r) in ratio.iter().enumerate() {
                    acc += r;
                    if acc > s {
                        k = i + 1;
                        break;
                    }
                }
                k
            }
        };
        for row in vecs.chunks_exact_mut(d.max(1)).take(k) {
            let big = row
                .iter()
                .copied()
                .fold(0.0f64, |b, v| if v.abs() > b.abs() { v } else { b });
            if big < 0.0 {
                row.iter_mut().for_each(|v| *v = -*v);
            }
        }
        vecs.truncate(k * d);
        let kept: f64 = var[..k].iter().sum();
        let noise = match self.solver {
            Solver::Exact => {
                let rest = &var[k.min(var.len())..];
                if rest.is_empty() {
                    0.0
                } else {
                    rest.iter().sum::<f64>() / rest.len() as f64
                }
            }
            // Only the kept variances are known: the rest of the trace,
            // spread over the other directions (scikit-learn's).
            Solver::Randomized { .. } if k < most => (total - kept).max(0.0) / (most - k) as f64,
            Solver::Randomized { .. } => 0.0,
        };
        Ok(PcaFit {
            n_components: k,
            components: vecs,
            singular_values: var[..k].iter().map(|v| (v * dof).sqrt()).collect(),
            explained_variance: var[..k].to_vec(),
            explained_variance_ratio: ratio[..k].to_vec(),
            mean,
            noise_variance: noise,
            gram: Vec::new(),
        })
    }
}
