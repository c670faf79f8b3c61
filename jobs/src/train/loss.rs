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
    /// gradient to `part` (whose gradient is zero).
    fn add_task_loss(&self, rows: Range<usize>, w: &[f64], classes: usize, part: &mut Part) {
        let d = self.dims as usize;
        let stride = d + 1;
        let (a, b) = (rows.start, rows.end);
        let n = b - a;
        // The task's rows in f64, then two GEMMs: the scores
        // Z = X . W^T, and, once Z holds P - Y, the gradient P^T . X.
        let xd: Vec<f64> = self.x[a * d..b * d].iter().map(|&v| f64::from(v)).collect();
        let mut z = crate::zeros::<f64>(n * classes);
        // SAFETY:
        // - `xd` holds n*d values, row stride d, column stride 1;
        // - W^T (d x classes) is read from `w` (classes*(d+1) values)
        //   with row stride 1 and column stride d+1: element (j, c)
        //   is w[c*(d+1) + j], j < d, never the bias column;
        // - `z` holds n*classes values, row stride classes; beta = 0,
        //   so its prior contents are not read; nothing aliases.
        unsafe {
            matrixmultiply::dgemm(
                n,
                d,
                classes,
                1.0,
                xd.as_ptr(),
                d as isize,
                1,
                w.as_ptr(),
                1,
                stride as isize,
                0.0,
                z.as_mut_ptr(),
                classes as isize,
                1,
            );
        }
        // The binary model's row scores class 1; class 0 scores 0.
        let first = usize::from(classes == 1);
        for (r, zr) in z.chunks_exact_mut(classes).enumerate() {
            for (c, v) in zr.iter_mut().enumerate() {
                *v += w[c * stride + d];
            }
            let mut m = zr.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut e = zr.iter().map(|&v| (v - m).exp()).sum::<f64>();
            if first == 1 {
                m = m.max(0.0);
                e = (zr[0] - m).exp() + (-m).exp();
            }
            let lse = m + e.ln();
            let y = self.y[a + r] as usize;
            let sw = self.w.get(a + r).map_or(1.0, |&v| f64::from(v));
            let zy = if y >= first { zr[y - first] } else { 0.0 };
            part.wsum += sw;
            part.loss += sw * (lse - zy);
            for (c, v) in zr.iter_mut().enumerate() {
                let is_y = if c + first == y { 1.0 } else { 0.0 };
                *v = sw * ((*v - lse).exp() - is_y);
                part.grad[c * stride + d] += *v;
            }
        }
        // SAFETY:
        // - P^T (classes x n) is read from `z` (n*classes values) with
        //   row stride 1 and column stride classes;
        // - `xd` holds n*d values, row stride d, column stride 1;
        // - the gradient's weight columns (classes x d) are written
        //   in `part.grad` with row stride d+1 and column stride 1,
        //   never touching the bias column; beta = 0 (they are all
        //   zero), and `part.grad` aliases neither input.
        unsafe {
            matrixmultiply::dgemm(
                classes,
                n,
                d,
                1.0,
                z.as_ptr(),
                1,
                classes as isize,
                xd.as_ptr(),
                d as isize,
                1,
                0.0,
                part.grad.as_mut_ptr(),
                stride as isize,
                1,
            );
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
