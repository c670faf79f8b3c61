//! What L-BFGS minimises, one task at a time: the multinomial log-loss of
//! a task's training rows (each times its sample weight), its gradient,
//! and the held-out rows predicted right. Row after row, in f64: a task's
//! sums depend only on its rows and the weights, never on the shard
//! executors or the timing.
//!
//! A model of one row is scikit-learn's binary model: the row scores
//! class 1, class 0's score is 0 (the softmax of `[0, z]` is the
//! logistic function of `z`).

use std::ops::Range;

use super::kernel::{self, BLOCK};
use super::load::Shard;

/// One L-BFGS task's partial sums.
#[derive(Debug)]
pub(super) struct Part {
    /// The log-loss of the task's rows.
    pub(super) loss: f64,
    /// The task's rows' sample weights added up (its rows without them).
    pub(super) wsum: f64,
    /// Its gradient (`classes x (dims + 1)`).
    pub(super) grad: Vec<f64>,
    /// Held-out rows predicted right.
    pub(super) correct: u64,
    /// Held-out rows seen.
    pub(super) held: u64,
}

impl Shard {
    /// The log-loss of task `task`'s training rows under the weights `w`
    /// (`classes x (dims + 1)`, f64; one row: the binary model), its
    /// gradient, and (when `held_out`) the correct predictions over the
    /// shard's held-out rows.
    pub(super) fn loss_part(&self, task: usize, w: &[f64], classes: usize, held_out: bool) -> Part {
        let stride = self.dims as usize + 1;
        let (a, b) = (self.tasks[task] as usize, self.tasks[task + 1] as usize);
        let mut part = Part {
            loss: 0.0,
            wsum: 0.0,
            grad: crate::zeros::<f64>(classes * stride),
            correct: 0,
            held: 0,
        };
        if b > a {
            self.add_task_loss(a..b, w, classes, &mut part);
        }
        if held_out {
            (part.correct, part.held) = self.held_out_hits(w, classes);
        }
        part
    }

    /// Adds the log-loss of the training rows `rows` under `w` and its
    /// gradient to `part` (whose gradient is zero), [`BLOCK`] rows at a
    /// time: their scores, then each row's loss and the coefficients of
    /// its gradient, then the gradient's update by those rows.
    fn add_task_loss(&self, rows: Range<usize>, w: &[f64], classes: usize, part: &mut Part) {
        let d = self.dims as usize;
        let stride = d + 1;
        // The block's rows in f64 (zeros past the task's last row, whose
        // coefficients are zero too), their scores and their coefficients.
        let mut xb = crate::zeros::<f64>(BLOCK * d);
        let mut z = crate::zeros::<f64>(BLOCK * classes);
        let mut g = crate::zeros::<f64>(BLOCK * classes);
        let isa = kernel::Isa::detect();
        for a in rows.clone().step_by(BLOCK) {
            let n = BLOCK.min(rows.end - a);
            for (o, &v) in xb.iter_mut().zip(&self.x[a * d..(a + n) * d]) {
                *o = f64::from(v);
            }
            xb[n * d..].fill(0.0);
            kernel::scores(isa, &xb, w, classes, &mut z);
            g.fill(0.0);
            for r in 0..n {
                let zr = &z[r * classes..(r + 1) * classes];
                let y = self.y[a + r] as usize;
                let sw = self.w.get(a + r).map_or(1.0, |&v| f64::from(v));
                part.wsum += sw;
                part.loss += sw * row_loss(zr, y, &mut g[r * classes..(r + 1) * classes], sw);
            }
            for c in 0..classes {
                part.grad[c * stride + d] += (0..n).map(|r| g[r * classes + c]).sum::<f64>();
            }
            kernel::add_outer(isa, &xb, &g, classes, &mut part.grad);
        }
    }

    /// The held-out rows `w` predicts right (the largest score, ties to
    /// the lowest class), and the held-out rows.
    fn held_out_hits(&self, w: &[f64], classes: usize) -> (u64, u64) {
        let d = self.dims as usize;
        let mut z = vec![0f64; classes];
        let mut xr = vec![0f64; d];
        let (mut correct, mut held) = (0, 0);
        for (r, &y) in self.test_y.iter().enumerate() {
            for (o, &v) in xr.iter_mut().zip(&self.test_x[r * d..(r + 1) * d]) {
                *o = f64::from(v);
            }
            scores64(w, &xr, &mut z);
            let mut best = 0;
            for c in 1..classes {
                if z[c] > z[best] {
                    best = c;
                }
            }
            if classes == 1 {
                best = usize::from(z[0] > 0.0);
            }
            correct += u64::from(best == y as usize);
            held += 1;
        }
        (correct, held)
    }
}

/// One row's log-loss from its scores `z` (with the bias) and its label
/// `y`, and its gradient coefficients `sw * (p_c - [c = y])` in `g`.
/// One score is scikit-learn's binary model: class 1's score against
/// class 0's 0.
fn row_loss(z: &[f64], y: usize, g: &mut [f64], sw: f64) -> f64 {
    if let [z1] = *z {
        // log(1 + e^z) and the logistic function, from e^-|z|.
        let e = (-z1.abs()).exp();
        let lse = z1.max(0.0) + e.ln_1p();
        let p = if z1 >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        };
        let is_y = if y == 1 { 1.0 } else { 0.0 };
        g[0] = sw * (p - is_y);
        return lse - is_y * z1;
    }
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut s = 0.0;
    for (gc, &zc) in g.iter_mut().zip(z) {
        *gc = (zc - m).exp();
        s += *gc;
    }
    for (c, gc) in g.iter_mut().enumerate() {
        let is_y = if c == y { 1.0 } else { 0.0 };
        *gc = sw * (*gc / s - is_y);
    }
    m + s.ln() - z[y]
}

/// Class scores `w_c . x + b_c` in f64 (`w` is `classes x (dims + 1)`),
/// each dot product summed in four lanes, always in the same order.
fn scores64(w: &[f64], x: &[f64], out: &mut [f64]) {
    let d = x.len();
    for (c, o) in out.iter_mut().enumerate() {
        let wc = &w[c * (d + 1)..(c + 1) * (d + 1)];
        let mut acc = [0f64; 4];
        let mut wi = wc[..d].chunks_exact(4);
        let mut xi = x.chunks_exact(4);
        for (a, b) in (&mut wi).zip(&mut xi) {
            for t in 0..4 {
                acc[t] += a[t] * b[t];
            }
        }
        let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for (a, b) in wi.remainder().iter().zip(xi.remainder()) {
            s += a * b;
        }
        *o = s + wc[d];
    }
}
