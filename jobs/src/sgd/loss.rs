//! The losses of SGD and their derivatives in the prediction `p`, as
//! scikit-learn defines them (`y` is +1/-1 for the classification
//! losses, the target for the regression ones).

/// A loss.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loss {
    /// `max(0, 1 - y p)`: a linear SVM.
    Hinge,
    /// `max(0, -y p)`.
    Perceptron,
    /// `max(0, 1 - y p)^2`.
    SquaredHinge,
    /// `log(1 + exp(-y p))`: logistic regression.
    LogLoss,
    /// Smoothed hinge: `max(0, 1 - y p)^2` for `y p >= -1`, else
    /// `-4 y p`.
    ModifiedHuber,
    /// `(p - y)^2 / 2`.
    SquaredError,
    /// Squared up to `epsilon` from the target, linear beyond.
    Huber(f64),
    /// `max(0, |y - p| - epsilon)`.
    EpsilonInsensitive(f64),
    /// `max(0, |y - p| - epsilon)^2`.
    SquaredEpsilonInsensitive(f64),
}

impl Loss {
    /// Whether it is a classification loss.
    pub fn classifies(self) -> bool {
        matches!(
            self,
            Loss::Hinge
                | Loss::Perceptron
                | Loss::SquaredHinge
                | Loss::LogLoss
                | Loss::ModifiedHuber
        )
    }

    /// The loss at prediction `p` for target `y`.
    pub fn loss(self, y: f64, p: f64) -> f64 {
        let z = p * y;
        match self {
            Loss::Hinge => (1.0 - z).max(0.0),
            Loss::Perceptron => (-z).max(0.0),
            Loss::SquaredHinge => (1.0 - z).max(0.0).powi(2),
            // scikit-learn's half binomial loss, labels 0 and 1.
            Loss::LogLoss => log1pexp(p) - (y + 1.0) / 2.0 * p,
            Loss::ModifiedHuber => {
                if z >= 1.0 {
                    0.0
                } else if z >= -1.0 {
                    (1.0 - z) * (1.0 - z)
                } else {
                    -4.0 * z
                }
            }
            Loss::SquaredError => 0.5 * (p - y) * (p - y),
            Loss::Huber(c) => {
                let r = (p - y).abs();
                if r <= c {
                    0.5 * r * r
                } else {
                    c * r - 0.5 * c * c
                }
            }
            Loss::EpsilonInsensitive(e) => ((y - p).abs() - e).max(0.0),
            Loss::SquaredEpsilonInsensitive(e) => ((y - p).abs() - e).max(0.0).powi(2),
        }
    }

    /// The loss's derivative in `p`.
    pub fn gradient(self, y: f64, p: f64) -> f64 {
        let z = p * y;
        match self {
            Loss::Hinge => {
                if z <= 1.0 {
                    -y
                } else {
                    0.0
                }
            }
            Loss::Perceptron => {
                if z <= 0.0 {
                    -y
                } else {
                    0.0
                }
            }
            Loss::SquaredHinge => {
                let m = 1.0 - z;
                if m > 0.0 {
                    -2.0 * y * m
                } else {
                    0.0
                }
            }
            Loss::LogLoss => {
                let y01 = (y + 1.0) / 2.0;
                if p > -37.0 {
                    let e = (-p).exp();
                    ((1.0 - y01) - y01 * e) / (1.0 + e)
                } else {
                    p.exp() - y01
                }
            }
            Loss::ModifiedHuber => {
                if z >= 1.0 {
                    0.0
                } else if z >= -1.0 {
                    2.0 * (1.0 - z) * -y
                } else {
                    -4.0 * y
                }
            }
            Loss::SquaredError => p - y,
            Loss::Huber(c) => (p - y).clamp(-c, c),
            Loss::EpsilonInsensitive(e) => {
                if y - p > e {
                    -1.0
                } else if p - y > e {
                    1.0
                } else {
                    0.0
                }
            }
            Loss::SquaredEpsilonInsensitive(e) => {
                let r = y - p;
                if r > e {
                    -2.0 * (r - e)
                } else if r < -e {
                    2.0 * (-r - e)
                } else {
                    0.0
                }
            }
        }
    }
}

/// `log(1 + exp(x))`, without overflow or loss of precision.
fn log1pexp(x: f64) -> f64 {
    if x <= -37.0 {
        x.exp()
    } else if x <= -2.0 {
        x.exp().ln_1p()
    } else if x <= 18.0 {
        (1.0 + x.exp()).ln()
    } else if x <= 33.3 {
        x + (-x).exp()
    } else {
        x
    }
}
