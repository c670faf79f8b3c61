//! The training job with local SGD (`--solver sgd`): accuracy on
//! separable data, identical results with and without a cap, dirty model
//! state written back. L-BFGS: tests/train_lbfgs.rs.

mod bin_common;

/// Runs the binary; whether it succeeded, and its stderr.
fn outcore(args: &[&str]) -> (bool, String) {
    let (code, err) = bin_common::outcore_cli(args);
    (code == Some(0), err)
}

fn stats(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const BASE: [&str; 15] = [
    "train",
    "--solver",
    "sgd",
    "--synthetic",
    "6MiB",
    "--dims",
    "24",
    "--classes",
    "5",
    "--rounds",
    "3",
    "--workers",
    "2",
    "--partitions",
    "12",
];

#[test]
fn accuracy_on_separable_data_exceeds_90_percent() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("s.json");
    let mut args = BASE.to_vec();
    args.extend(["--mem-cap", "none", "--stats", s.to_str().unwrap()]);
    let (ok, err) = outcore(&args);
    assert!(ok, "{err}");
    let v = stats(&s);
    let acc: Vec<f64> = v["accuracy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_f64().unwrap())
        .collect();
    assert_eq!(acc.len(), 3);
    assert!(*acc.last().unwrap() > 0.9, "held-out accuracy {acc:?}");
    assert!(
        err.contains("held-out accuracy"),
        "per-round report missing: {err}"
    );
}

#[test]
fn results_are_identical_with_and_without_a_cap() {
    let dir = tempfile::tempdir().unwrap();
    let mut models = Vec::new();
    for (name, cap) in [("none", "none"), ("capped", "2MiB")] {
        let m = dir.path().join(format!("{name}.npy"));
        let s = dir.path().join(format!("{name}.json"));
        let mut args = BASE.to_vec();
        args.extend([
            "--mem-cap",
            cap,
            "--output",
            m.to_str().unwrap(),
            "--stats",
            s.to_str().unwrap(),
        ]);
        let (ok, err) = outcore(&args);
        assert!(ok, "{name}: {err}");
        let v = stats(&s);
        if name == "capped" {
            // The replicas are dirty every round: evicted shards are
            // written back, and read back.
            assert!(v["evictions"].as_u64().unwrap() > 0);
            let written = v["bytes_written"].as_u64().unwrap();
            assert!(
                written > 6 << 20,
                "only {written} bytes written: model state not written back each round"
            );
            assert!(v["loads"].as_u64().unwrap() > 0);
        }
        models.push(std::fs::read(&m).unwrap());
    }
    assert!(models[0] == models[1], "the model differs with a cap");
}

#[test]
fn labels_that_do_not_match_the_data_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    let y = dir.path().join("y.npy");
    let data: Vec<f32> = (0..40).map(|i| i as f32).collect();
    outcore_jobs::npy::write_array(&x, &[10, 4], &data).unwrap();
    outcore_jobs::npy::write_array(&y, &[9], &[0i32, 1, 0, 1, 0, 1, 0, 1, 0]).unwrap();
    let out = dir.path().join("m.npy");
    let (ok, err) = outcore(&[
        "train",
        "--input",
        x.to_str().unwrap(),
        "--targets",
        y.to_str().unwrap(),
        "--mem-cap",
        "none",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("9 labels for 10 rows"), "{err}");
    assert!(!out.exists());
    // And with matching labels it trains.
    outcore_jobs::npy::write_array(&y, &[10], &[0i32, 1, 0, 1, 0, 1, 0, 1, 0, 1]).unwrap();
    let (ok, err) = outcore(&[
        "train",
        "--input",
        x.to_str().unwrap(),
        "--targets",
        y.to_str().unwrap(),
        "--holdout",
        "0",
        "--mem-cap",
        "none",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (w, rows, cols) = outcore_jobs::npy::read_matrix(&out).unwrap();
    assert_eq!((rows, cols), (2, 5));
    assert!(w.iter().all(|v| v.is_finite()));
}
