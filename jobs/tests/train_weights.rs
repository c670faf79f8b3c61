//! `outcore train --sample-weight`: scikit-learn's weighted objective
//! (`fit(X, y, sample_weight=w)`), the same model under a cap, and a
//! one-line refusal from the solver that cannot take weights.

mod bin_common;

use std::path::Path;

use outcore_jobs::npy::write_array;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Digits scaled to [0, 1], their labels, and weights in [0, 3) (some
/// rows nearly ignored), written by numpy.
const MAKE_DATA: &str = r#"
import sys, numpy as np
from sklearn.datasets import load_digits
d = sys.argv[1]
X, y = load_digits(return_X_y=True)
np.save(d + '/x.npy', (X / 16).astype(np.float32))
np.save(d + '/y.npy', y.astype(np.int64))
w = np.random.default_rng(5).uniform(0.0, 3.0, len(y))
np.save(d + '/w.npy', w)
"#;

#[test]
fn weighted_training_equals_scikit_learn_capped_or_not() {
    if !bin_common::have_python("sklearn, numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    bin_common::python(MAKE_DATA, &[s(dir.path())]);
    let mut models = Vec::new();
    for cap in ["none", "1MiB"] {
        let m = p(&format!("m-{cap}.npy"));
        let (code, err) = bin_common::outcore_cli(&[
            "train",
            "--input",
            s(&p("x.npy")),
            "--targets",
            s(&p("y.npy")),
            "--sample-weight",
            s(&p("w.npy")),
            "--holdout",
            "0",
            "--tol",
            "1e-8",
            "--max-iter",
            "1000",
            "--mem-cap",
            cap,
            "--output",
            s(&m),
        ]);
        assert_eq!(code, Some(0), "{err}");
        models.push(std::fs::read(&m).unwrap());
    }
    assert!(models[0] == models[1], "the capped model differs");
    // Against scikit-learn's weighted fit, and unlike its unweighted one.
    let out = bin_common::python(
        r#"
import sys, numpy as np
from sklearn.linear_model import LogisticRegression
d = sys.argv[1]
X, y, w = np.load(d + '/x.npy').astype(np.float64), np.load(d + '/y.npy'), np.load(d + '/w.npy')
M = np.load(d + '/m-none.npy').astype(np.float64)
sk = LogisticRegression(C=1.0, tol=1e-10, max_iter=5000).fit(X, y, sample_weight=w)
un = LogisticRegression(C=1.0, tol=1e-10, max_iter=5000).fit(X, y)
ref = np.column_stack([sk.coef_, sk.intercept_])
unw = np.column_stack([un.coef_, un.intercept_])
# The multinomial model is defined up to a constant per column.
c = lambda A: A - A.mean(0)
scale = np.abs(c(ref)).max()
print(np.abs(c(M) - c(ref)).max() / scale, np.abs(c(M) - c(unw)).max() / scale)
"#,
        &[s(dir.path())],
    );
    let v: Vec<f64> = out.split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert!(v[0] < 1e-4, "weighted model off scikit-learn's by {}", v[0]);
    assert!(v[1] > 1e-2, "the weights changed nothing ({})", v[1]);
}

#[test]
fn local_sgd_refuses_sample_weights_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let (code, err) = bin_common::outcore_cli(&[
        "gen",
        "--synthetic",
        "64KiB",
        "--dims",
        "8",
        "--output",
        s(&p("x.npy")),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let rows: i32 = (64 << 10) / (8 * 4);
    let y: Vec<i32> = (0..rows).map(|i| i % 3).collect();
    write_array(&p("y.npy"), &[rows as u64], &y).unwrap();
    write_array(&p("w.npy"), &[rows as u64], &vec![1f32; rows as usize]).unwrap();
    let (code, err) = bin_common::outcore_cli(&[
        "train",
        "--solver",
        "sgd",
        "--input",
        s(&p("x.npy")),
        "--targets",
        s(&p("y.npy")),
        "--sample-weight",
        s(&p("w.npy")),
    ]);
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("local SGD does not take sample weights"),
        "{err}"
    );
}
