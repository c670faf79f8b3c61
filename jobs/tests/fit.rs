//! The jobs of the job interface (`outcore linear`, `outcore pca`): the
//! same bytes under any cap, partitioning and worker count, against
//! numpy, and one-line errors.

mod bin_common;

use std::path::{Path, PathBuf};

use bin_common::outcore_cli;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `outcore args`; panics with its stderr unless it succeeds.
fn ok(args: &[&str]) -> String {
    let (code, err) = outcore_cli(args);
    assert_eq!(code, Some(0), "{args:?}:\n{err}");
    err
}

/// Runs `outcore args`, which must fail with exit code 2 and one line.
fn one_line(args: &[&str]) -> String {
    let (code, err) = outcore_cli(args);
    assert_eq!(code, Some(2), "{args:?}:\n{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}:\n{err}");
    assert!(lines[0].starts_with("outcore: error: "), "{err}");
    lines[0].to_string()
}

/// Rows (`x.npy`, `dims` columns) and two targets (`y.npy`) written by
/// `outcore gen`, in `dir`.
fn data(dir: &Path, bytes: u64, dims: usize) -> (PathBuf, PathBuf) {
    let (x, y) = (dir.join("x.npy"), dir.join("y.npy"));
    let (d, size) = (dims.to_string(), bytes.to_string());
    ok(&["gen", "--synthetic", &size, "--dims", &d, "--output", s(&x)]);
    let rows = bytes / (4 * dims as u64);
    // Two columns of the same number of rows (the generator's first rows
    // do not depend on the size asked for).
    let ybytes = format!("{}", rows * 8);
    ok(&[
        "gen",
        "--synthetic",
        &ybytes,
        "--dims",
        "2",
        "--seed",
        "7",
        "--output",
        s(&y),
    ]);
    (x, y)
}

fn stats(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn linear_and_pca_give_the_same_bytes_under_any_cap_partitions_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = data(dir.path(), 8 << 20, 32);
    let runs: [&[&str]; 3] = [
        &["--mem-cap", "none", "--workers", "2"],
        &["--mem-cap", "3MiB", "--workers", "1", "--partitions", "40"],
        &["--mem-cap", "6MiB", "--workers", "2", "--partitions", "7"],
    ];
    for (job, extra) in [
        ("linear", vec!["--targets", s(&y), "--alpha", "0.5,2"]),
        ("pca", vec!["--n-components", "6"]),
    ] {
        let mut outputs = Vec::new();
        for (i, flags) in runs.iter().enumerate() {
            let out = dir.path().join(format!("{job}{i}.npy"));
            let st = dir.path().join(format!("{job}{i}.json"));
            let mut args = vec![
                job,
                "--input",
                s(&x),
                "--output",
                s(&out),
                "--stats",
                s(&st),
            ];
            args.extend(&extra);
            args.extend(*flags);
            ok(&args);
            let st = stats(&st);
            if i == 1 {
                assert!(st["evictions"].as_u64().unwrap() > 0, "{st}");
            }
            assert_eq!(st["passes"].as_array().unwrap().len(), 2, "{st}");
            outputs.push(std::fs::read(&out).unwrap());
        }
        for (i, o) in outputs.iter().enumerate().skip(1) {
            assert!(*o == outputs[0], "{job}: run {i} differs from run 0");
        }
    }
}

#[test]
fn sgd_gives_the_same_bytes_under_any_cap_partitions_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let (x, _) = data(dir.path(), 8 << 20, 32);
    // Class indices 0..3 from a column of the data (whole numbers are
    // exact in float32).
    let y = dir.path().join("classes.npy");
    let rows = (8 << 20) / (4 * 32);
    write_classes(&y, rows, 3);
    let runs: [&[&str]; 3] = [
        &["--mem-cap", "none", "--workers", "2"],
        &["--mem-cap", "3MiB", "--workers", "1", "--partitions", "40"],
        &["--mem-cap", "6MiB", "--workers", "2", "--partitions", "7"],
    ];
    let mut outputs = Vec::new();
    for (i, flags) in runs.iter().enumerate() {
        let out = dir.path().join(format!("sgd{i}.npy"));
        let st = dir.path().join(format!("sgd{i}.json"));
        let mut args = vec![
            "sgd",
            "--input",
            s(&x),
            "--targets",
            s(&y),
            "--classes",
            "3",
        ];
        args.extend([
            "--loss",
            "log_loss",
            "--penalty",
            "elasticnet",
            "--max-iter",
            "3",
            "--average",
            "1000",
        ]);
        args.extend([
            "--tol",
            "none",
            "--early-stopping",
            "--output",
            s(&out),
            "--stats",
            s(&st),
        ]);
        args.extend(*flags);
        ok(&args);
        let st = stats(&st);
        if i == 1 {
            assert!(st["evictions"].as_u64().unwrap() > 0, "{st}");
        }
        assert_eq!(st["n_iter"].as_u64(), Some(3), "{st}");
        outputs.push(std::fs::read(&out).unwrap());
    }
    for (i, o) in outputs.iter().enumerate().skip(1) {
        assert!(*o == outputs[0], "sgd: run {i} differs from run 0");
    }
}

/// A 1-D float32 `.npy` of `rows` class indices in `0..classes`.
fn write_classes(path: &Path, rows: u64, classes: u64) {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows},), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    for r in 0..rows {
        b.extend((((r * 7 + r / 5) % classes) as f32).to_le_bytes());
    }
    std::fs::write(path, b).unwrap();
}

#[test]
fn linear_and_pca_agree_with_numpy() {
    if !bin_common::have_python("numpy") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = data(dir.path(), 2 << 20, 12);
    let (m, c, st) = (
        dir.path().join("m.npy"),
        dir.path().join("c.npy"),
        dir.path().join("s.json"),
    );
    ok(&[
        "linear",
        "--input",
        s(&x),
        "--targets",
        s(&y),
        "--alpha",
        "3",
        "--output",
        s(&m),
    ]);
    ok(&[
        "pca",
        "--input",
        s(&x),
        "--n-components",
        "0.9",
        "--output",
        s(&c),
        "--stats",
        s(&st),
    ]);
    let out = bin_common::python(
        r#"
import json, sys
import numpy as np
x = np.load(sys.argv[1]).astype(np.float64); y = np.load(sys.argv[2]).astype(np.float64)
m = np.load(sys.argv[3]); c = np.load(sys.argv[4]); st = json.load(open(sys.argv[5]))
xc, yc = x - x.mean(0), y - y.mean(0)
coef = np.linalg.solve(xc.T @ xc + 3 * np.eye(x.shape[1]), xc.T @ yc).T
b = y.mean(0) - coef @ x.mean(0)
assert np.allclose(m[:, :-1], coef, rtol=1e-9, atol=1e-12), (m, coef)
assert np.allclose(m[:, -1], b, rtol=1e-9, atol=1e-12)
vals, vecs = np.linalg.eigh(xc.T @ xc / (len(x) - 1))
vals, vecs = vals[::-1], vecs[:, ::-1].T
k = int(np.searchsorted(np.cumsum(vals) / vals.sum(), 0.9, side="right")) + 1
assert c.shape == (k, x.shape[1]), (c.shape, k)
signs = np.sign(vecs[np.arange(k), np.abs(vecs[:k]).argmax(1)])
assert np.allclose(c, vecs[:k] * signs[:, None], atol=1e-9)
assert np.allclose(st["explained_variance"], vals[:k], rtol=1e-9)
assert np.allclose(st["mean"], x.mean(0), rtol=1e-9)
print("ok", k)
"#,
        &[s(&x), s(&y), s(&m), s(&c), s(&st)],
    );
    assert!(out.starts_with("ok"), "{out}");
}

#[test]
fn bad_settings_and_inputs_end_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = data(dir.path(), 256 << 10, 8);
    let short = dir.path().join("short.npy");
    ok(&[
        "gen",
        "--synthetic",
        "1KiB",
        "--dims",
        "1",
        "--output",
        s(&short),
    ]);
    let cases: [(&[&str], &str); 7] = [
        (&["linear", "--input", s(&x)], "--input needs --targets"),
        (
            &["linear", "--input", s(&x), "--targets", s(&short)],
            "targets for 8192 rows",
        ),
        (
            &[
                "linear",
                "--input",
                s(&x),
                "--targets",
                s(&y),
                "--alpha",
                "-1",
            ],
            "--alpha must be a number >= 0",
        ),
        (
            &[
                "linear",
                "--input",
                s(&x),
                "--targets",
                s(&y),
                "--alpha",
                "1,2,3",
            ],
            "3 penalties (alpha) for 2 targets",
        ),
        (
            &["pca", "--input", s(&x), "--n-components", "0"],
            "--n-components must be at least 1",
        ),
        (
            &["pca", "--input", s(&x), "--n-components", "1.5"],
            "--n-components must be a count",
        ),
        (
            &["pca", "--input", s(&x), "--n-components", "9"],
            "n_components=9 must be between 1 and min(n_samples, n_features)=8",
        ),
    ];
    for (args, want) in cases {
        let line = one_line(args);
        assert!(line.contains(want), "{args:?}: {line}");
    }
}

#[test]
fn a_flag_that_does_not_apply_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    ok(&[
        "gen",
        "--synthetic",
        "1MiB",
        "--dims",
        "8",
        "--output",
        s(&x),
    ]);
    let err = ok(&["pca", "--input", s(&x), "--synthetic", "1MiB"]);
    assert!(
        err.lines().any(|l| l
            == "outcore: warning: --synthetic applies to synthetic data, not to --input; ignored"),
        "{err}"
    );
    // --max-ranks applies (the job grows under mpirun): no warning when
    // the data fits.
    let err = ok(&["pca", "--input", s(&x), "--max-ranks", "4"]);
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn a_model_too_large_for_the_cap_is_refused_with_its_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("wide.npy");
    ok(&[
        "gen",
        "--synthetic",
        "2MiB",
        "--dims",
        "1500",
        "--output",
        s(&x),
    ]);
    // A task's sums alone are a 1500 x 1500 float64 matrix, 17 MiB.
    let line = one_line(&[
        "pca",
        "--input",
        s(&x),
        "--mem-cap",
        "24MiB",
        "--workers",
        "1",
    ]);
    assert!(
        line.contains("PCA on 1500 columns needs")
            && line.contains("the partial sums of the tasks in flight")
            && line.contains("memory cap of 24.0 MiB"),
        "{line}"
    );
    // The passes fit 72 MiB (four such matrices and the scratch), the
    // eigendecomposition after them does not: refused before any pass,
    // naming it, rather than run over the cap at the end.
    let line = one_line(&[
        "pca",
        "--input",
        s(&x),
        "--mem-cap",
        "80MiB",
        "--workers",
        "1",
    ]);
    assert!(
        line.contains("PCA on 1500 columns needs") && line.contains("the eigendecomposition"),
        "{line}"
    );
    // Where both fit, the fit holds the cap.
    let out = ok(&[
        "pca",
        "--input",
        s(&x),
        "--mem-cap",
        "100MiB",
        "--workers",
        "1",
    ]);
    assert!(out.contains("components kept"), "{out}");
}

/// `--positive`: every coefficient >= 0, at least one of the unconstrained
/// ones negative made 0, and the same bytes under a cap that evicts.
#[test]
fn positive_coefficients_are_non_negative_under_any_cap() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = data(dir.path(), 4 << 20, 6);
    let run = |name: &str, extra: &[&str]| {
        let st = dir.path().join(name);
        let mut args = vec!["linear", "--input", s(&x), "--targets", s(&y)];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--stats", s(&st)]);
        ok(&args);
        stats(&st)
    };
    let coef = |v: &serde_json::Value| -> Vec<f64> {
        v["coef"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_f64().unwrap())
            .collect()
    };
    let free = run("free.json", &[]);
    let pos = run("pos.json", &["--positive"]);
    let capped = run(
        "capped.json",
        &[
            "--positive",
            "--mem-cap",
            "3MiB",
            "--workers",
            "1",
            "--partitions",
            "40",
        ],
    );
    assert_eq!(pos["solver"], "nnls", "{pos}");
    assert!(coef(&pos).iter().all(|&c| c >= 0.0), "{pos}");
    assert!(coef(&free).iter().any(|&c| c < 0.0), "{free}");
    assert_eq!(coef(&pos), coef(&capped));
    assert!(capped["evictions"].as_u64().unwrap() > 0, "{capped}");
}
