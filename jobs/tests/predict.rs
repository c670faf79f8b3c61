//! `outcore predict`: labels against brute force and numpy, the same
//! outputs under a cap, agreement with `outcore kmeans --labels`, models
//! from `outcore train`, and one-line errors.

mod bin_common;

use std::path::{Path, PathBuf};

use bin_common::npy_words;

fn outcore(args: &[&str]) -> (bool, String) {
    let (code, err) = bin_common::outcore_cli(args);
    (code == Some(0), err)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ints(p: &Path) -> Vec<i32> {
    let (descr, w) = npy_words(p);
    assert_eq!(descr, "<i4", "{}", p.display());
    w.into_iter().map(i32::from_le_bytes).collect()
}

fn floats(p: &Path) -> Vec<f32> {
    let (descr, w) = npy_words(p);
    assert_eq!(descr, "<f4", "{}", p.display());
    w.into_iter().map(f32::from_le_bytes).collect()
}

/// A data file of blobs and trained centroids for it.
struct Fixture {
    dir: tempfile::TempDir,
    x: PathBuf,
    centroids: PathBuf,
    kmeans_labels: PathBuf,
}

const DIMS: usize = 24;

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    let centroids = dir.path().join("c.npy");
    let kmeans_labels = dir.path().join("kl.npy");
    let (ok, err) = outcore(&[
        "gen",
        "--synthetic",
        "6MiB",
        "--dims",
        &DIMS.to_string(),
        "--true-k",
        "12",
        "--output",
        s(&x),
    ]);
    assert!(ok, "{err}");
    let (ok, err) = outcore(&[
        "kmeans",
        "--input",
        s(&x),
        "--k",
        "12",
        "--mem-cap",
        "none",
        "--output",
        s(&centroids),
        "--labels",
        s(&kmeans_labels),
    ]);
    assert!(ok, "{err}");
    Fixture {
        dir,
        x,
        centroids,
        kmeans_labels,
    }
}

fn matrix(p: &Path) -> (Vec<f32>, usize, usize) {
    outcore_jobs::npy::read_matrix(p).unwrap()
}

#[test]
fn labels_and_distances_match_brute_force_and_kmeans() {
    let f = fixture();
    let labels = f.dir.path().join("l.npy");
    let dists = f.dir.path().join("d.npy");
    let (ok, err) = outcore(&[
        "predict",
        "--centroids",
        s(&f.centroids),
        "--input",
        s(&f.x),
        "--labels",
        s(&labels),
        "--distances",
        s(&dists),
        "--mem-cap",
        "none",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("done in"), "{err}");
    let (x, rows, d) = matrix(&f.x);
    let (c, k, _) = matrix(&f.centroids);
    let got = ints(&labels);
    let got_d = floats(&dists);
    assert_eq!((got.len(), got_d.len()), (rows, rows));
    let mut near_ties = 0;
    for i in 0..rows {
        let xi = &x[i * d..(i + 1) * d];
        let mut all: Vec<(f64, usize)> = (0..k)
            .map(|j| {
                let cj = &c[j * d..(j + 1) * d];
                let dist: f64 = xi
                    .iter()
                    .zip(cj)
                    .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                    .sum();
                (dist, j)
            })
            .collect();
        all.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let scale: f64 = xi.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>()
            + c[all[0].1 * d..(all[0].1 + 1) * d]
                .iter()
                .map(|v| f64::from(*v).powi(2))
                .sum::<f64>();
        if got[i] as usize != all[0].1 {
            // Only where the two nearest are within rounding of each other.
            assert!(
                all[1].0 - all[0].0 <= 1e-4 * scale,
                "row {i}: label {} but centre {} is nearer ({:?})",
                got[i],
                all[0].1,
                &all[..2]
            );
            near_ties += 1;
        }
        assert!(
            (f64::from(got_d[i]) - all[0].0).abs() <= 1e-4 * scale,
            "row {i}: distance {} against {}",
            got_d[i],
            all[0].0
        );
    }
    assert!(near_ties <= rows / 1000, "{near_ties} near ties");
    // The labels of the run that trained the centroids, byte for byte.
    assert_eq!(
        std::fs::read(&labels).unwrap(),
        std::fs::read(&f.kmeans_labels).unwrap()
    );
}

#[test]
fn a_cap_changes_nothing_and_files_are_read_again() {
    let f = fixture();
    let mut outs = Vec::new();
    for cap in ["none", "2MiB"] {
        let l = f.dir.path().join(format!("l-{cap}.npy"));
        let d = f.dir.path().join(format!("d-{cap}.npy"));
        let st = f.dir.path().join(format!("s-{cap}.json"));
        let (ok, err) = outcore(&[
            "predict",
            "--centroids",
            s(&f.centroids),
            "--input",
            s(&f.x),
            "--labels",
            s(&l),
            "--distances",
            s(&d),
            "--mem-cap",
            cap,
            "--partitions",
            "24",
            "--stats",
            s(&st),
        ]);
        assert!(ok, "{cap}: {err}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
        if cap != "none" {
            assert!(v["evictions"].as_u64().unwrap() > 0, "{v}");
            assert_eq!(v["bytes_written"].as_u64().unwrap(), 0, "{v}");
            // Never the whole input (6 MiB) at once: the partitions
            // stream through, plus the reader's buffers (4 MiB).
            assert!(v["peak_bytes"].as_u64().unwrap() < 6 << 20, "{v}");
        }
        outs.push((std::fs::read(&l).unwrap(), std::fs::read(&d).unwrap()));
    }
    assert!(outs[0] == outs[1], "outputs differ under a cap");
}

/// A cap smaller than one partition used to be run over with no line
/// (`--mem-cap 1KiB` labelled 6 MiB at a peak of 2.7 MiB, in partitions
/// of at least 1 MiB). Partitions now shrink with small caps, and a cap
/// that cannot hold the centres and one task is refused in one line.
#[test]
fn a_cap_too_small_for_one_task_is_refused_and_small_caps_are_kept() {
    let f = fixture();
    let l = f.dir.path().join("tiny.npy");
    let (code, err) = bin_common::outcore_cli(&[
        "predict",
        "--centroids",
        s(&f.centroids),
        "--input",
        s(&f.x),
        "--labels",
        s(&l),
        "--mem-cap",
        "1KiB",
    ]);
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("outcore: error: labelling with 12 centres on 24 dimensions needs")
            && lines[0].ends_with("more than the memory cap of 1.0 KiB"),
        "{err}"
    );
    assert!(!l.exists());
    let st = f.dir.path().join("small.json");
    let (ok, err) = outcore(&[
        "predict",
        "--centroids",
        s(&f.centroids),
        "--input",
        s(&f.x),
        "--labels",
        s(&l),
        "--mem-cap",
        "2MiB",
        "--workers",
        "1",
        "--stats",
        s(&st),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains(", 1 worker\n"), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
    let parts = v["partitions"].as_u64().unwrap();
    assert!(parts > 6, "6 MiB in {parts} partitions under a 2 MiB cap");
    assert!(err.contains("(cap 2.0 MiB)"), "{err}");
}

#[test]
fn labels_match_numpy() {
    if !bin_common::have_python("numpy") {
        return;
    }
    let f = fixture();
    let labels = f.dir.path().join("l.npy");
    let (ok, err) = outcore(&[
        "predict",
        "--centroids",
        s(&f.centroids),
        "--input",
        s(&f.x),
        "--labels",
        s(&labels),
    ]);
    assert!(ok, "{err}");
    let out = bin_common::python(
        r#"
import sys, numpy as np
X = np.load(sys.argv[1]).astype(np.float64)
C = np.load(sys.argv[2]).astype(np.float64)
L = np.load(sys.argv[3])
D = ((X[:, None, :] - C[None]) ** 2).sum(-1)
best = D.argmin(1)
srt = np.sort(D, 1)
tie = (srt[:, 1] - srt[:, 0]) <= 1e-4 * ((X ** 2).sum(1) + (C[best] ** 2).sum(1))
print(int(((best != L) & ~tie).sum()), L.dtype)
"#,
        &[s(&f.x), s(&f.centroids), s(&labels)],
    );
    assert_eq!(out.trim(), "0 int32", "mismatches against numpy's argmin");
}

#[test]
fn a_trained_model_labels_rows_by_its_largest_score() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    let model = dir.path().join("m.npy");
    let labels = dir.path().join("l.npy");
    let (ok, err) = outcore(&[
        "gen",
        "--synthetic",
        "2MiB",
        "--dims",
        "16",
        "--true-k",
        "4",
        "--output",
        s(&x),
    ]);
    assert!(ok, "{err}");
    let (ok, err) = outcore(&[
        "train",
        "--synthetic",
        "2MiB",
        "--dims",
        "16",
        "--classes",
        "4",
        "--max-iter",
        "5",
        "--output",
        s(&model),
    ]);
    assert!(ok, "{err}");
    let (ok, err) = outcore(&[
        "predict",
        "--model",
        s(&model),
        "--input",
        s(&x),
        "--labels",
        s(&labels),
        "--mem-cap",
        "2MiB",
    ]);
    assert!(ok, "{err}");
    let (xs, rows, d) = matrix(&x);
    let (w, classes, cols) = matrix(&model);
    assert_eq!((classes, cols), (4, d + 1));
    let got = ints(&labels);
    assert_eq!(got.len(), rows);
    let mut seen = [false; 4];
    for i in 0..rows {
        let xi = &xs[i * d..(i + 1) * d];
        let scores: Vec<f64> = (0..classes)
            .map(|c| {
                let wc = &w[c * cols..(c + 1) * cols];
                f64::from(wc[d])
                    + wc[..d]
                        .iter()
                        .zip(xi)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
            })
            .collect();
        let mut order: Vec<usize> = (0..classes).collect();
        order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap());
        let g = got[i] as usize;
        seen[g] = true;
        if g != order[0] {
            assert!(
                scores[order[0]] - scores[g] <= 1e-4 * scores[order[0]].abs().max(1.0),
                "row {i}: class {g}, best {} ({scores:?})",
                order[0]
            );
        }
    }
    assert!(seen.iter().all(|&s| s), "every class predicted somewhere");
}

#[test]
fn bad_invocations_are_one_line_errors_with_no_output() {
    let f = fixture();
    let out = f.dir.path().join("out.npy");
    let other = f.dir.path().join("other.npy");
    let narrow = f.dir.path().join("narrow.npy");
    outcore_jobs::npy::write_array(&narrow, &[2, 3], &[0f32; 6]).unwrap();
    // Centres, or a model, of nothing (they made predict panic).
    let no_rows = f.dir.path().join("no_rows.npy");
    outcore_jobs::npy::write_array::<f32>(&no_rows, &[0, DIMS as u64], &[]).unwrap();
    let no_cols = f.dir.path().join("no_cols.npy");
    outcore_jobs::npy::write_array::<f32>(&no_cols, &[3, 0], &[]).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--centroids", s(&no_rows), "--input", s(&f.x)],
            "the array is empty (0 x 24)",
        ),
        (
            vec!["--model", s(&no_rows), "--input", s(&f.x)],
            "the array is empty (0 x 24)",
        ),
        (
            vec!["--model", s(&no_cols), "--input", s(&f.x)],
            "has 0 columns",
        ),
        (
            vec!["--centroids", s(&narrow), "--input", s(&f.x)],
            "centres have 3 dimensions, the input has 24",
        ),
        (
            vec!["--model", s(&narrow), "--input", s(&f.x)],
            "a model for 2 features",
        ),
        (vec!["--input", s(&f.x)], "--centroids"),
        (
            vec![
                "--centroids",
                s(&f.centroids),
                "--model",
                s(&narrow),
                "--input",
                s(&f.x),
            ],
            "cannot be used with",
        ),
        (
            vec![
                "--model",
                s(&narrow),
                "--input",
                s(&f.x),
                "--distances",
                s(&other),
            ],
            "--distances applies to --centroids",
        ),
        (
            vec![
                "--centroids",
                s(&f.centroids),
                "--input",
                "/nonexistent.npy",
            ],
            "/nonexistent.npy",
        ),
    ];
    for (args, want) in cases {
        let mut full = vec!["predict", "--labels", s(&out)];
        full.extend(&args);
        let (ok, err) = outcore(&full);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(!out.exists() && !other.exists(), "{args:?} left output");
    }
}
