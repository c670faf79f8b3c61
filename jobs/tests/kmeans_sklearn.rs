//! The K-means workflow a scikit-learn user expects: `--tol` stops where
//! `KMeans(tol=...)` stops, weighted Lloyd equals `fit(..., sample_weight=...)`,
//! `--n-init` keeps the best run, mini-batch stops early on the smoothed
//! inertia, and sample weights behave as weights (the scikit-learn
//! comparisons skip when python3 with scikit-learn is missing, unless CI's
//! `OUTCORE_REQUIRE_SKLEARN=1` is set).

mod bin_common;

use std::path::{Path, PathBuf};

use bin_common::{have_python, python};
use outcore_jobs::npy::{read_matrix, write_array};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `outcore kmeans` with `args` and a stats file; the stats.
fn kmeans(dir: &Path, tag: &str, args: &[&str]) -> serde_json::Value {
    let stats = dir.join(format!("{tag}.json"));
    let mut all = vec!["kmeans", "--stats", s(&stats)];
    all.extend_from_slice(args);
    let (code, err) = bin_common::outcore_cli(&all);
    assert_eq!(code, Some(0), "{tag}: {err}");
    serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-30)
}

/// Overlapping blobs that take Lloyd a dozen iterations from a random
/// init, an init, and weights, written by numpy.
const MAKE_DATA: &str = r#"
import sys, numpy as np
from sklearn.datasets import make_blobs
d = sys.argv[1]
X, _ = make_blobs(6000, n_features=10, centers=12, cluster_std=4.0, random_state=3)
X = X.astype(np.float32)
rng = np.random.default_rng(1)
np.save(d + '/x.npy', X)
np.save(d + '/init.npy', X[rng.choice(len(X), 12, replace=False)])
np.save(d + '/w.npy', rng.uniform(0.0, 3.0, len(X)).astype(np.float32))
"#;

fn sklearn_data() -> Option<(tempfile::TempDir, PathBuf, PathBuf, PathBuf)> {
    if !have_python("numpy, sklearn") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    python(MAKE_DATA, &[s(dir.path())]);
    let x = dir.path().join("x.npy");
    let init = dir.path().join("init.npy");
    let w = dir.path().join("w.npy");
    Some((dir, x, init, w))
}

#[test]
fn tol_stops_within_one_iteration_of_scikit_learn() {
    let Some((dir, x, init, _)) = sklearn_data() else {
        return;
    };
    for tol in ["1e-2", "1e-3", "1e-4"] {
        let out = python(
            r#"
import sys, numpy as np
from sklearn.cluster import KMeans
X = np.load(sys.argv[1]); init = np.load(sys.argv[2])
km = KMeans(12, init=init, n_init=1, tol=float(sys.argv[3]), max_iter=300, algorithm='lloyd').fit(X)
print(km.n_iter_, km.inertia_)
"#,
            &[s(&x), s(&init), tol],
        );
        let mut it = out.split_whitespace();
        let sk_iter: i64 = it.next().unwrap().parse().unwrap();
        let sk_inertia: f64 = it.next().unwrap().parse().unwrap();
        let st = kmeans(
            dir.path(),
            &format!("tol{tol}"),
            &[
                "--input",
                s(&x),
                "--init",
                s(&init),
                "--algorithm",
                "lloyd",
                "--tol",
                tol,
                "--iterations",
                "300",
                "--mem-cap",
                "none",
            ],
        );
        let iters = st["iterations"].as_i64().unwrap();
        assert!(
            (iters - sk_iter).abs() <= 1,
            "tol {tol}: outcore stopped after {iters} iterations, scikit-learn after {sk_iter}"
        );
        assert_eq!(st["converged"], true, "tol {tol}: {st}");
        let inertia = st["inertia"].as_f64().unwrap();
        assert!(
            rel(inertia, sk_inertia) < 1e-4,
            "tol {tol}: inertia {inertia} against scikit-learn's {sk_inertia}"
        );
    }
}

#[test]
fn weighted_lloyd_equals_scikit_learn() {
    let Some((dir, x, init, w)) = sklearn_data() else {
        return;
    };
    let sk_c = dir.path().join("sk.npy");
    let out = python(
        r#"
import sys, numpy as np
from sklearn.cluster import KMeans
X = np.load(sys.argv[1]); init = np.load(sys.argv[2]); w = np.load(sys.argv[3])
km = KMeans(12, init=init, n_init=1, tol=0, max_iter=300, algorithm='lloyd').fit(X, sample_weight=w)
np.save(sys.argv[4], km.cluster_centers_.astype(np.float32))
print(km.inertia_)
"#,
        &[s(&x), s(&init), s(&w), s(&sk_c)],
    );
    let sk_inertia: f64 = out.trim().parse().unwrap();
    let c = dir.path().join("c.npy");
    let st = kmeans(
        dir.path(),
        "weighted",
        &[
            "--input",
            s(&x),
            "--init",
            s(&init),
            "--algorithm",
            "lloyd",
            "--tol",
            "0",
            "--iterations",
            "300",
            "--sample-weight",
            s(&w),
            "--mem-cap",
            "none",
            "--output",
            s(&c),
        ],
    );
    assert_eq!(st["weighted"], true);
    let inertia = st["inertia"].as_f64().unwrap();
    assert!(
        rel(inertia, sk_inertia) < 1e-4,
        "weighted inertia {inertia} against scikit-learn's {sk_inertia}"
    );
    let (ours, k, d) = read_matrix(&c).unwrap();
    let (theirs, k2, d2) = read_matrix(&sk_c).unwrap();
    assert_eq!((k, d), (k2, d2));
    let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    for (a, b) in ours.iter().zip(&theirs) {
        assert!(
            (f64::from(*a) - f64::from(*b)).abs() <= 1e-4 * scale,
            "weighted centre {a} against scikit-learn's {b}"
        );
    }
    // The unweighted run ends elsewhere: the weights did something.
    let st = kmeans(
        dir.path(),
        "unweighted",
        &[
            "--input",
            s(&x),
            "--init",
            s(&init),
            "--algorithm",
            "lloyd",
            "--tol",
            "0",
            "--iterations",
            "300",
            "--mem-cap",
            "none",
        ],
    );
    assert!(rel(st["inertia"].as_f64().unwrap(), sk_inertia) > 1e-2);
}

/// Centres that no point chooses (far from the data) are moved onto the
/// points farthest from their centres, as scikit-learn's Lloyd does: the
/// same centres and inertia, weighted or not, capped or not, and no
/// cluster left empty.
#[test]
fn empty_clusters_are_relocated_as_scikit_learn_does() {
    let Some((dir, x, init, w)) = sklearn_data() else {
        return;
    };
    // Three of the twelve initial centres far from every row.
    let (mut c0, k, d) = read_matrix(&init).unwrap();
    for (i, v) in c0[..3 * d].iter_mut().enumerate() {
        *v = 1e4 * (1 + i % 3) as f32;
    }
    let far = dir.path().join("far.npy");
    write_array(&far, &[k as u64, d as u64], &c0).unwrap();
    for weighted in [false, true] {
        let sk_c = dir.path().join(format!("sk-{weighted}.npy"));
        let out = python(
            r#"
import sys, numpy as np
from sklearn.cluster import KMeans
X = np.load(sys.argv[1]); init = np.load(sys.argv[2])
w = np.load(sys.argv[3]) if sys.argv[5] == 'true' else None
km = KMeans(12, init=init, n_init=1, tol=0, max_iter=300, algorithm='lloyd').fit(X, sample_weight=w)
np.save(sys.argv[4], km.cluster_centers_.astype(np.float32))
print(km.inertia_, len(np.unique(km.labels_)))
"#,
            &[s(&x), s(&far), s(&w), s(&sk_c), &weighted.to_string()],
        );
        let mut it = out.split_whitespace();
        let sk_inertia: f64 = it.next().unwrap().parse().unwrap();
        assert_eq!(it.next(), Some("12"), "scikit-learn left a cluster empty");
        let mut centres = Vec::new();
        for cap in ["none", "1MiB"] {
            let c = dir.path().join(format!("c-{weighted}-{cap}.npy"));
            let mut args = vec![
                "--input",
                s(&x),
                "--init",
                s(&far),
                "--algorithm",
                "lloyd",
                "--tol",
                "0",
                "--iterations",
                "300",
                "--mem-cap",
                cap,
                "--partitions",
                "6",
                "--output",
                s(&c),
            ];
            if weighted {
                args.extend(["--sample-weight", s(&w)]);
            }
            let st = kmeans(dir.path(), &format!("far-{weighted}-{cap}"), &args);
            let inertia = st["inertia"].as_f64().unwrap();
            assert!(
                rel(inertia, sk_inertia) < 1e-4,
                "weighted {weighted}, cap {cap}: inertia {inertia} against scikit-learn's {sk_inertia}"
            );
            assert!(st["relocated"].as_u64().unwrap() >= 3, "{st}");
            centres.push(std::fs::read(&c).unwrap());
        }
        assert!(centres[0] == centres[1], "capped centres differ");
        let (ours, _, _) = read_matrix(&dir.path().join(format!("c-{weighted}-none.npy"))).unwrap();
        let (theirs, _, _) = read_matrix(&sk_c).unwrap();
        let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        for (a, b) in ours.iter().zip(&theirs) {
            assert!(
                (f64::from(*a) - f64::from(*b)).abs() <= 1e-4 * scale,
                "weighted {weighted}: centre {a} against scikit-learn's {b}"
            );
        }
    }
}

/// Synthetic data written by `outcore gen`: its path and (rows, dims).
fn gen(dir: &Path, size: &str, dims: usize, true_k: usize) -> (PathBuf, usize) {
    let x = dir.join("g.npy");
    let (code, err) = bin_common::outcore_cli(&[
        "gen",
        "--synthetic",
        size,
        "--dims",
        &dims.to_string(),
        "--true-k",
        &true_k.to_string(),
        "--output",
        s(&x),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let rows = read_matrix(&x).unwrap().1;
    (x, rows)
}

fn common<'a>(x: &'a Path, algo: &'a str, epochs: &'a str) -> Vec<&'a str> {
    vec![
        "--input",
        s(x),
        "--algorithm",
        algo,
        "--k",
        "8",
        "--epochs",
        epochs,
        "--iterations",
        "4",
        "--tol",
        "0",
        "--batch-tasks",
        "8",
        "--task-points",
        "300",
        "--workers",
        "2",
    ]
}

#[test]
fn n_init_keeps_the_best_of_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (x, _) = gen(dir.path(), "2MiB", 8, 8);
    for algo in ["minibatch", "lloyd"] {
        let mut one = common(&x, algo, "2");
        one.extend(["--mem-cap", "none", "--init", "random"]);
        let st1 = kmeans(dir.path(), &format!("{algo}-1"), &one);
        let mut five = one.clone();
        five.extend(["--n-init", "5"]);
        let st5 = kmeans(dir.path(), &format!("{algo}-5"), &five);
        let inertias: Vec<f64> = st5["init_inertia"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(inertias.len(), 5, "{algo}: {st5}");
        let best = st5["inertia"].as_f64().unwrap();
        let best_i = st5["best_init"].as_u64().unwrap() as usize;
        assert_eq!(best, inertias[best_i], "{algo}");
        assert!(inertias.iter().all(|&v| v >= best), "{algo}: {inertias:?}");
        // The first initialisation is the single run's, and restarts differ.
        assert_eq!(inertias[0], st1["inertia"].as_f64().unwrap(), "{algo}");
        assert!(best <= st1["inertia"].as_f64().unwrap(), "{algo}");
        assert!(inertias.iter().any(|&v| v != inertias[0]), "{algo}");
        // Deterministic.
        let again = kmeans(dir.path(), &format!("{algo}-5b"), &five);
        assert_eq!(again["init_inertia"], st5["init_inertia"], "{algo}");
    }
}

#[test]
fn minibatch_stops_early_when_the_smoothed_inertia_stalls() {
    let dir = tempfile::tempdir().unwrap();
    let (x, _) = gen(dir.path(), "4MiB", 8, 8);
    let mut args = common(&x, "minibatch", "50");
    args.extend(["--max-no-improvement", "5"]);
    args.extend(["--mem-cap", "none"]);
    let st = kmeans(dir.path(), "early", &args);
    assert_eq!(st["converged"], true, "{st}");
    let steps = st["steps"].as_u64().unwrap();
    let epochs = st["epoch_seconds"].as_array().unwrap().len();
    assert!(epochs < 50, "ran all {epochs} epochs ({steps} steps)");
    assert!(st["stop"].as_str().unwrap().contains("improvement"), "{st}");
    // Without it, all epochs run.
    let mut args = common(&x, "minibatch", "3");
    args.extend(["--mem-cap", "none"]);
    let st = kmeans(dir.path(), "full", &args);
    assert_eq!(st["converged"], false, "{st}");
    assert_eq!(st["epoch_seconds"].as_array().unwrap().len(), 3);
}

fn weights(dir: &Path, name: &str, w: &[f32]) -> PathBuf {
    let p = dir.join(name);
    write_array(&p, &[w.len() as u64], w).unwrap();
    p
}

#[test]
fn unit_weights_change_nothing_and_weighted_runs_ignore_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let (x, rows) = gen(dir.path(), "8MiB", 16, 6);
    let ones = weights(dir.path(), "ones.npy", &vec![1.0; rows]);
    let varied: Vec<f32> = (0..rows).map(|i| ((i * 7919) % 13) as f32 * 0.25).collect();
    let varied = weights(dir.path(), "varied.npy", &varied);
    for algo in ["minibatch", "lloyd"] {
        let run = |tag: &str, extra: &[&str]| {
            let out = dir.path().join(format!("{algo}-{tag}.npy"));
            let mut args = common(&x, algo, "2");
            args.extend(["--output", s(&out)]);
            args.extend_from_slice(extra);
            let st = kmeans(dir.path(), &format!("{algo}-{tag}"), &args);
            (std::fs::read(&out).unwrap(), st)
        };
        let (plain, _) = run("plain", &["--mem-cap", "none"]);
        let (unit, _) = run("ones", &["--mem-cap", "none", "--sample-weight", s(&ones)]);
        assert!(plain == unit, "{algo}: unit weights changed the centroids");
        let (w, _) = run("w", &["--mem-cap", "none", "--sample-weight", s(&varied)]);
        assert!(w != plain, "{algo}: weights changed nothing");
        let (wc, st) = run("wc", &["--mem-cap", "4MiB", "--sample-weight", s(&varied)]);
        assert!(st["evictions"].as_u64().unwrap() > 0, "{algo}: no eviction");
        assert!(wc == w, "{algo}: weighted centroids differ under a cap");
    }
}

/// Rows of two tight, distant groups; row `i` in group `i % 2`.
fn two_groups(rows: usize, d: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * d);
    for i in 0..rows {
        let base = if i % 2 == 0 { 0.0 } else { 50.0 };
        for j in 0..d {
            x.push(base + (((i * 31 + j * 17) % 97) as f32) / 97.0 + j as f32 * 0.1);
        }
    }
    x
}

#[test]
fn an_integer_weight_counts_as_repeated_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, d) = (3000, 6);
    let x = two_groups(rows, d);
    // Weight 3 on every fifth row, 1 elsewhere; and the same data with
    // those rows written three times.
    let w: Vec<f32> = (0..rows)
        .map(|i| if i % 5 == 0 { 3.0 } else { 1.0 })
        .collect();
    let mut dup = Vec::new();
    for i in 0..rows {
        for _ in 0..w[i] as usize {
            dup.extend_from_slice(&x[i * d..(i + 1) * d]);
        }
    }
    let xp = dir.path().join("x.npy");
    write_array(&xp, &[rows as u64, d as u64], &x).unwrap();
    let dp = dir.path().join("dup.npy");
    write_array(&dp, &[(dup.len() / d) as u64, d as u64], &dup).unwrap();
    let wp = weights(dir.path(), "w.npy", &w);
    let init = dir.path().join("init.npy");
    let mut c0 = x[..d].to_vec();
    c0.extend_from_slice(&x[d..2 * d]);
    c0.extend_from_slice(&x[2 * d..3 * d]);
    write_array(&init, &[3, d as u64], &c0).unwrap();
    let run = |input: &Path, tag: &str, extra: &[&str]| {
        let out = dir.path().join(format!("{tag}.npy"));
        let mut args = vec![
            "--input",
            s(input),
            "--algorithm",
            "lloyd",
            "--init",
            s(&init),
            "--iterations",
            "20",
            "--mem-cap",
            "none",
            "--output",
            s(&out),
        ];
        args.extend_from_slice(extra);
        let st = kmeans(dir.path(), tag, &args);
        (
            read_matrix(&out).unwrap().0,
            st["inertia"].as_f64().unwrap(),
        )
    };
    let (cw, iw) = run(&xp, "weighted", &["--sample-weight", s(&wp)]);
    let (cd, id) = run(&dp, "duplicated", &[]);
    assert!(rel(iw, id) < 1e-5, "inertia {iw} against {id}");
    for (a, b) in cw.iter().zip(&cd) {
        assert!((a - b).abs() < 1e-4, "centre {a} against {b}");
    }
}

#[test]
fn kmeans_plus_plus_never_starts_from_a_zero_weight_row() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, d) = (4000, 4);
    let mut x = two_groups(rows, d);
    // Every tenth row is a far outlier with weight 0: unweighted k-means++
    // picks them, weighted k-means++ must not.
    let mut w = vec![1f32; rows];
    for i in (0..rows).step_by(10) {
        w[i] = 0.0;
        for v in &mut x[i * d..(i + 1) * d] {
            *v = 1.0e4 + i as f32;
        }
    }
    let xp = dir.path().join("x.npy");
    write_array(&xp, &[rows as u64, d as u64], &x).unwrap();
    let wp = weights(dir.path(), "w.npy", &w);
    let centres = |tag: &str, extra: &[&str]| {
        let out = dir.path().join(format!("{tag}.npy"));
        let mut args = vec![
            "--input",
            s(&xp),
            "--k",
            "4",
            "--algorithm",
            "lloyd",
            "--iterations",
            "1",
            "--mem-cap",
            "none",
            "--output",
            s(&out),
        ];
        args.extend_from_slice(extra);
        kmeans(dir.path(), tag, &args);
        read_matrix(&out).unwrap().0
    };
    let far = |c: &[f32]| c.iter().any(|v| *v > 1000.0);
    assert!(
        far(&centres("unweighted", &[])),
        "the outliers were not picked"
    );
    for seed in ["1", "2", "3"] {
        let c = centres(
            &format!("w{seed}"),
            &["--sample-weight", s(&wp), "--seed", seed],
        );
        assert!(
            !far(&c),
            "seed {seed}: a zero-weight row became a centre: {c:?}"
        );
    }
}

#[test]
fn bad_weights_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (x, rows) = gen(dir.path(), "256KiB", 8, 4);
    let mut neg = vec![1f32; rows];
    neg[7] = -1.0;
    let mut nan = vec![1f32; rows];
    nan[3] = f32::NAN;
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        ("negative", weights(dir.path(), "neg.npy", &neg), "7"),
        ("NaN", weights(dir.path(), "nan.npy", &nan), "3"),
        (
            "short",
            weights(dir.path(), "short.npy", &vec![1.0; rows - 1]),
            "",
        ),
        (
            "all zero",
            weights(dir.path(), "zero.npy", &vec![0.0; rows]),
            "",
        ),
        ("two-dimensional", x.clone(), ""),
    ];
    for (what, path, needle) in cases {
        let out = dir.path().join("c.npy");
        let (code, err) = bin_common::outcore_cli(&[
            "kmeans",
            "--input",
            s(&x),
            "--k",
            "4",
            "--mem-cap",
            "none",
            "--sample-weight",
            s(&path),
            "--output",
            s(&out),
        ]);
        assert_eq!(code, Some(2), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
        assert!(
            err.contains(path.file_name().unwrap().to_str().unwrap()),
            "{what}: {err}"
        );
        assert!(err.contains(needle), "{what}: {err}");
        assert!(!out.exists(), "{what}: an output was written");
    }
}
