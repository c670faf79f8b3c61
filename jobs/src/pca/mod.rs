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
use crate::job::linalg::eigh;
use crate::job::moments::{add_centred_gram, add_means, means, means_len};
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

/// The passes of a PCA.
#[derive(Debug)]
pub enum Pass {
    /// The means.
    Means,
    /// The Gram matrix of the rows centred on these means.
    Gram(Vec<f64>),
}

/// PCA on the job interface.
#[derive(Debug)]
pub struct Pca {
    components: Components,
    keep_gram: bool,
}

impl Pca {
    /// A PCA keeping `components`.
    pub fn new(components: Components) -> Pca {
        Pca {
            components,
            keep_gram: false,
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
            _ => Ok(Pass::Means),
        }
    }

    fn sums(&self, state: &Pass, shape: &Shape) -> usize {
        match state {
            Pass::Means => means_len(shape.dims, 0),
            Pass::Gram(_) => shape.dims * shape.dims,
        }
    }

    fn most_sums(&self, shape: &Shape) -> usize {
        shape.dims * shape.dims
    }

    fn task(state: &Pass, rows: &Rows<'_>, out: &mut [f64]) {
        match state {
            Pass::Means => add_means(rows, out),
            Pass::Gram(m) => add_centred_gram(rows, m, &[], out),
        }
    }

    fn step(&mut self, state: Pass, sums: Vec<f64>, shape: &Shape) -> Result<Step<Pass, PcaFit>> {
        match state {
            Pass::Means => Ok(Step::Pass(Pass::Gram(means(&sums, shape.dims)?.0))),
            Pass::Gram(mean) => self.decompose(&sums, shape, mean).map(Step::Done),
        }
    }
}

impl Pca {
    /// The components from the centred Gram matrix `g`.
    fn decompose(&self, g: &[f64], shape: &Shape, mean: Vec<f64>) -> Result<PcaFit> {
        let d = shape.dims;
        let (vals, mut vecs) = eigh(g, d)
            .ok_or_else(|| Error::Input("the covariance's eigenvalues did not converge".into()))?;
        let dof = (shape.rows - 1) as f64;
        let most = (shape.rows.min(d as u64)) as usize;
        let var: Vec<f64> = vals.iter().take(most).map(|&v| v.max(0.0) / dof).collect();
        let total: f64 = var.iter().sum();
        let ratio: Vec<f64> = var
            .iter()
            .map(|&v| if total > 0.0 { v / total } else { 0.0 })
            .collect();
        let k = match self.components {
            Components::All => most,
            Components::Count(k) => k,
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
        let rest = &var[k.min(var.len())..];
        Ok(PcaFit {
            n_components: k,
            components: vecs,
            singular_values: var[..k].iter().map(|v| (v * dof).sqrt()).collect(),
            explained_variance: var[..k].to_vec(),
            explained_variance_ratio: ratio[..k].to_vec(),
            mean,
            noise_variance: if rest.is_empty() {
                0.0
            } else {
                rest.iter().sum::<f64>() / rest.len() as f64
            },
            gram: if self.keep_gram {
                g.to_vec()
            } else {
                Vec::new()
            },
        })
    }
}
