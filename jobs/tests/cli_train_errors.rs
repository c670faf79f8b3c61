//! Bad input to `outcore train` (and a few more for `gen`): one readable
//! line, exit code 2, no backtrace, no output file left behind.

use std::path::Path;

mod bin_common;
use bin_common::outcore_cli as run;

fn bad(args: &[&str], want: &str, out: &Path) {
    let (code, err) = run(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    let lines: Vec<&str> = err.trim().lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(lines[0].starts_with("outcore: error:"), "{err}");
    assert!(
        lines[0].contains(want),
        "{args:?}: '{}' should mention '{want}'",
        lines[0]
    );
    assert!(!err.contains("panicked"));
    assert!(!out.exists(), "{args:?} left {}", out.display());
}

#[test]
fn train_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let x = d("x.npy");
    let y = d("y.npy");
    let m = d("model.npy");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let data: Vec<f32> = (0..40).map(|i| i as f32).collect();
    outcore_jobs::npy::write_array(&x, &[10, 4], &data).unwrap();
    outcore_jobs::npy::write_array(&y, &[10], &[0i32, 1, 0, 1, 0, 1, 0, 1, 0, 1]).unwrap();
    let base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "train",
            "--input",
            &s(&x),
            "--targets",
            &s(&y),
            "--mem-cap",
            "none",
            "--output",
            &s(&m),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    let call = |extra: &[&str], want: &str| {
        let args = base(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        bad(&refs, want, &m);
    };
    // Truncated inputs.
    let bytes = std::fs::read(&x).unwrap();
    let tx = d("trunc.npy");
    std::fs::write(&tx, &bytes[..bytes.len() - 7]).unwrap();
    bad(
        &[
            "train",
            "--input",
            &s(&tx),
            "--targets",
            &s(&y),
            "--output",
            &s(&m),
        ],
        "truncated",
        &m,
    );
    // A label far past the classes meant: its model could not be held
    // (it ended in an allocation failure and a backtrace).
    let huge = d("huge.npy");
    outcore_jobs::npy::write_array(&huge, &[10], &[0i32, 1, 0, 1, 0, 1, 0, 1, 0, 16_777_215])
        .unwrap();
    for cap in ["64MiB", "none"] {
        // Under an address-space limit, so that a regression fails here
        // instead of taking the machine's memory.
        let out = std::process::Command::new("sh")
            .args(["-c", "ulimit -v 4000000; exec \"$@\"", "sh"])
            .arg(env!("CARGO_BIN_EXE_outcore"))
            .args(["train", "--input", &s(&x), "--targets", &s(&huge)])
            .args(["--mem-cap", cap, "--output", &s(&m)])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cap}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{cap}: {err}");
        assert!(
            err.contains("16777216 classes of 4 features need about"),
            "{cap}: {err}"
        );
        assert!(!m.exists());
    }
    // Labels of the wrong dtype, shape or values.
    let fy = d("float_labels.npy");
    outcore_jobs::npy::write_array(&fy, &[10], &[0.5f32; 10]).unwrap();
    bad(
        &[
            "train",
            "--input",
            &s(&x),
            "--targets",
            &s(&fy),
            "--output",
            &s(&m),
        ],
        "int32 or int64",
        &m,
    );
    let ny = d("negative.npy");
    outcore_jobs::npy::write_array(&ny, &[10], &[0i32, -1, 0, 1, 0, 1, 0, 1, 0, 1]).unwrap();
    bad(
        &[
            "train",
            "--input",
            &s(&x),
            "--targets",
            &s(&ny),
            "--output",
            &s(&m),
        ],
        "not a class index",
        &m,
    );
    // Options.
    call(&["--classes", "1"], "classes");
    // The labels file is named.
    call(
        &["--classes", "1"],
        "y.npy: a label is 1, but there are only 1 classes",
    );
    call(&["--solver", "sgd", "--lr", "-1"], "--lr");
    call(&["--solver", "sgd", "--batch", "0"], "--batch");
    call(&["--solver", "sgd", "--rounds", "0"], "--rounds");
    call(&["--C", "-1"], "--C");
    call(&["--max-iter", "0"], "--max-iter");
    call(&["--holdout", "1.5"], "--holdout");
    bad(
        &[
            "train",
            "--input",
            &s(&x),
            "--targets",
            &s(&y),
            "--mem-cap",
            "12XB",
            "--output",
            &s(&m),
        ],
        "12XB",
        &m,
    );
    // A missing input, an unwritable output.
    bad(
        &[
            "train",
            "--input",
            &s(&d("missing.npy")),
            "--targets",
            &s(&y),
            "--output",
            &s(&m),
        ],
        "cannot open",
        &m,
    );
    let (code, err) = run(&[
        "train",
        "--input",
        &s(&x),
        "--targets",
        &s(&y),
        "--output",
        "/nonexistent-dir/m.npy",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // --input without --targets is a usage error.
    let (code, err) = run(&["train", "--input", &s(&x)]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn gen_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g.npy");
    let o = out.to_str().unwrap();
    bad(&["gen", "--synthetic", "-5M", "--output", o], "-5M", &out);
    bad(
        &["gen", "--synthetic", "1MiB", "--true-k", "0", "--output", o],
        "--true-k",
        &out,
    );
    bad(
        &["gen", "--synthetic", "1MiB", "--dims", "0", "--output", o],
        "--dims",
        &out,
    );
}
