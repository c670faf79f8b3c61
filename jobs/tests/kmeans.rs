//! K-means correctness: Lloyd against an independent reference, results
//! independent of the cap and the policy, mini-batch close to Lloyd, empty
//! clusters.

use std::path::Path;

mod bin_common;

use outcore::Runtime;
use outcore_jobs::kmeans::{self, Algorithm, Config, Event, Init};
use outcore_jobs::{npy, Session, Source};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

/// Test data from the test's own generator (not the library's): `n`
/// points around `centres`, with Box-Muller noise of scale `sd`.
fn blobs(n: usize, centres: &[Vec<f64>], sd: f64, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut out = Vec::new();
    for i in 0..n {
        let c = &centres[i % centres.len()];
        for &m in c {
            let (u1, u2) = (uniform(), uniform());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            out.push((m + sd * z) as f32);
        }
    }
    out
}

/// A plain Lloyd in f64: assign each point to the nearest centre by direct
/// distance, move each centre to the mean of its points, keep a centre with
/// no point where it is.
fn reference_lloyd(x: &[f32], d: usize, init: &[f32], iters: usize) -> Vec<f64> {
    let n = x.len() / d;
    let k = init.len() / d;
    let mut c: Vec<f64> = init.iter().map(|&v| f64::from(v)).collect();
    for _ in 0..iters {
        let mut sums = vec![0f64; k * d];
        let mut counts = vec![0usize; k];
        for i in 0..n {
            let p = &x[i * d..(i + 1) * d];
            let mut best = (f64::INFINITY, 0);
            for j in 0..k {
                let dist: f64 = (0..d)
                    .map(|t| (f64::from(p[t]) - c[j * d + t]).powi(2))
                    .sum();
                if dist < best.0 {
                    best = (dist, j);
                }
            }
            counts[best.1] += 1;
            for t in 0..d {
                sums[best.1 * d + t] += f64::from(p[t]);
            }
        }
        for j in 0..k {
            if counts[j] > 0 {
                for t in 0..d {
                    c[j * d + t] = sums[j * d + t] / counts[j] as f64;
                }
            }
        }
    }
    c
}

fn write_data(dir: &Path, x: &[f32], d: usize) -> std::path::PathBuf {
    let p = dir.join("data.npy");
    npy::write_array(&p, &[(x.len() / d) as u64, d as u64], x).unwrap();
    p
}

fn centres() -> Vec<Vec<f64>> {
    vec![
        vec![0.0, 0.0, 0.0, 5.0, 1.0, -2.0],
        vec![8.0, 1.0, -3.0, 0.0, 2.0, 4.0],
        vec![-6.0, 7.0, 2.0, -1.0, -5.0, 0.5],
        vec![3.0, -8.0, 6.0, 2.0, 0.0, -6.0],
        vec![-4.0, -3.0, -7.0, 6.0, 5.0, 3.0],
    ]
}

#[test]
fn lloyd_matches_an_independent_reference() {
    let d = 6;
    let x = blobs(5000, &centres(), 1.5, 7);
    // Initial centres: deliberately poor (points of only some blobs, one
    // far away), so several iterations do real work.
    let mut init: Vec<f32> = Vec::new();
    for i in [0usize, 5, 10, 1, 3] {
        init.extend_from_slice(&x[i * d..(i + 1) * d]);
    }
    init[4 * d] += 3.0;
    let want = reference_lloyd(&x, d, &init, 8);

    let dir = tempfile::tempdir().unwrap();
    let path = write_data(dir.path(), &x, d);
    let session = Session::new(Runtime::builder().workers(2).build().unwrap());
    // Small partitions, so the data spans several executors.
    let ds = kmeans::load(
        &session,
        &Source::Npy(path),
        None,
        None,
        16 << 10,
        |_, _| {},
    )
    .unwrap();
    assert!(ds.parts.len() > 5);
    let cfg = Config {
        k: 5,
        algorithm: Algorithm::Lloyd,
        init: Init::Given(init.clone()),
        iterations: 8,
        ..Config::default()
    };
    let out = kmeans::run(&session, &ds, &cfg, |_| {}).unwrap();
    assert_eq!(out.centers.values.len(), want.len());
    for (i, (&got, &w)) in out.centers.values.iter().zip(&want).enumerate() {
        let rel = (f64::from(got) - w).abs() / w.abs().max(1.0);
        assert!(rel < 1e-4, "centre value {i}: got {got}, reference {w}");
    }
    // The centres moved away from the poor start.
    assert_ne!(out.centers.values, init);
}

/// A centre no point chose: Lloyd moves it onto the point farthest from
/// its centre (as scikit-learn); mini-batch reassigns it onto a row of the
/// batch, the same whatever the partitions and workers, unless told not to.
#[test]
fn an_empty_cluster_moves_in_lloyd_and_in_mini_batch() {
    let d = 6;
    let mut x = blobs(600, &centres(), 1.0, 3);
    // Row 321 is an outlier: the farthest point from every centre.
    x[321 * d..322 * d].fill(40.0);
    let mut init: Vec<f32> = x[..4 * d].to_vec();
    let far = vec![1.0e6f32; d];
    init.extend_from_slice(&far);
    let dir = tempfile::tempdir().unwrap();
    let path = write_data(dir.path(), &x, d);
    let session = Session::new(Runtime::builder().build().unwrap());
    let ds = kmeans::load(
        &session,
        &Source::Npy(path.clone()),
        None,
        None,
        1 << 20,
        |_, _| {},
    );
    let ds = ds.unwrap();
    for algorithm in [Algorithm::Lloyd, Algorithm::MiniBatch] {
        let cfg = Config {
            k: 5,
            algorithm,
            init: Init::Given(init.clone()),
            iterations: 3,
            epochs: 2,
            ..Config::default()
        };
        let out = kmeans::run(&session, &ds, &cfg, |_| {}).unwrap();
        assert!(out.inertia.is_finite());
        if algorithm == Algorithm::MiniBatch {
            assert!(
                out.centers.row(4).iter().all(|v| v.abs() < 100.0),
                "not reassigned"
            );
            assert!(out.relocated >= 1);
            // Other partitions and one worker: the same bytes.
            let small = Session::new(Runtime::builder().workers(1).build().unwrap());
            let parts = kmeans::load(
                &small,
                &Source::Npy(path.clone()),
                None,
                None,
                16 << 10,
                |_, _| {},
            );
            let again = kmeans::run(&small, &parts.unwrap(), &cfg, |_| {}).unwrap();
            assert_eq!(again.centers.values, out.centers.values);
            assert_eq!(again.relocated, out.relocated);
            let off = Config {
                reassignment_ratio: 0.0,
                ..cfg
            };
            let out = kmeans::run(&session, &ds, &off, |_| {}).unwrap();
            assert_eq!(out.centers.row(4), &far[..], "reassignment off moved it");
            assert_eq!(out.relocated, 0);
            continue;
        }
        // The first iteration put the outlier alone in centre 4; it stays
        // its only point.
        assert_eq!(out.relocated, 1, "one relocation, in the first iteration");
        assert_eq!(
            out.centers.row(4),
            &x[321 * d..322 * d],
            "not on the outlier"
        );
    }
}

/// More centres than distinct rows: every row sits on its centre, so the
/// empty centre stays (scikit-learn's rule) and Lloyd stops at once.
#[test]
fn an_empty_cluster_stays_when_every_row_sits_on_its_centre() {
    let x: Vec<f32> = vec![0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0];
    let dir = tempfile::tempdir().unwrap();
    let path = write_data(dir.path(), &x, 2);
    let session = Session::new(Runtime::builder().build().unwrap());
    let ds = kmeans::load(&session, &Source::Npy(path), None, None, 1 << 20, |_, _| {}).unwrap();
    let cfg = Config {
        k: 5,
        algorithm: Algorithm::Lloyd,
        init: Init::Given(x.clone()),
        iterations: 10,
        ..Config::default()
    };
    let out = kmeans::run(&session, &ds, &cfg, |_| {}).unwrap();
    assert_eq!(out.relocated, 0);
    assert_eq!(out.iterations, 1);
    assert_eq!(out.centers.values, x);
    assert_eq!(out.inertia, 0.0);
}

#[test]
fn k_larger_than_the_data_is_an_error() {
    let session = Session::new(Runtime::builder().build().unwrap());
    let ds = kmeans::load(
        &session,
        &Source::synthetic(4 * 8 * 10, 8, 2, 1),
        None,
        None,
        1 << 20,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(ds.rows, 10);
    let cfg = Config {
        k: 11,
        ..Config::default()
    };
    let err = kmeans::run(&session, &ds, &cfg, |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("larger than the number of points"), "{err}");
    let cfg = Config {
        k: 0,
        ..Config::default()
    };
    assert!(kmeans::run(&session, &ds, &cfg, |_| {}).is_err());
}

#[test]
fn minibatch_inertia_is_within_two_percent_of_lloyd() {
    let session = Session::new(Runtime::builder().build().unwrap());
    // Well-separated blobs from the library's generator: 30,000 points,
    // 16 dimensions, 8 blobs.
    let src = Source::synthetic(30_000 * 16 * 4, 16, 8, 11);
    let ds = kmeans::load(&session, &src, None, None, 256 << 10, |_, _| {}).unwrap();
    let base = Config {
        k: 8,
        seed: 5,
        batch_tasks: 10,
        task_points: 500,
        ..Config::default()
    };
    let lloyd = kmeans::run(
        &session,
        &ds,
        &Config {
            algorithm: Algorithm::Lloyd,
            iterations: 20,
            ..base.clone()
        },
        |_| {},
    )
    .unwrap();
    let mb = kmeans::run(
        &session,
        &ds,
        &Config {
            algorithm: Algorithm::MiniBatch,
            epochs: 5,
            ..base
        },
        |_| {},
    )
    .unwrap();
    let ratio = mb.inertia / lloyd.inertia;
    assert!(
        ratio <= 1.02,
        "mini-batch inertia {} vs Lloyd {} (ratio {ratio})",
        mb.inertia,
        lloyd.inertia
    );
    // Sanity: each point is about 16 unit variances from its blob centre.
    let per_point = lloyd.inertia / 30_000.0;
    assert!(
        per_point < 20.0,
        "Lloyd did not find the blobs: {per_point} per point"
    );
}

/// Same seed and worker count: identical centroids with and without a cap,
/// under either policy, and with the default partitioning (which depends on
/// the cap) or another one, for both algorithms.
#[test]
fn results_are_identical_with_and_without_a_cap() {
    let dir = tempfile::tempdir().unwrap();
    for (algo, init) in [
        ("minibatch", "k-means++"),
        ("lloyd", "k-means++"),
        ("minibatch", "k-means||"),
        ("lloyd", "k-means||"),
    ] {
        let mut outputs = Vec::new();
        for (name, extra) in [
            ("none", vec!["--mem-cap", "none", "--partitions", "16"]),
            ("capped", vec!["--mem-cap", "4MiB", "--partitions", "16"]),
            (
                "lru",
                vec!["--mem-cap", "4MiB", "--policy", "lru", "--partitions", "16"],
            ),
            ("default partitions, capped", vec!["--mem-cap", "4MiB"]),
            (
                "5 partitions, no cap",
                vec!["--mem-cap", "none", "--partitions", "5"],
            ),
        ] {
            let out = dir.path().join(format!("{algo}-{init}-{name}.npy"));
            let stats = dir.path().join(format!("{algo}-{init}-{name}.json"));
            let mut args = vec![
                "kmeans",
                "--synthetic",
                "8MiB",
                "--dims",
                "16",
                "--true-k",
                "6",
                "--k",
                "6",
                "--epochs",
                "2",
                "--iterations",
                "3",
                "--batch-tasks",
                "8",
                "--task-points",
                "300",
                "--workers",
                "2",
                "--algorithm",
                algo,
                "--init",
                init,
                "--output",
                out.to_str().unwrap(),
                "--stats",
                stats.to_str().unwrap(),
            ];
            args.extend(extra.iter());
            let (code, err) = bin_common::outcore_cli(&args);
            assert_eq!(code, Some(0), "{algo} {name} failed: {err}");
            let s: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
            if name.contains("capped") || name == "lru" {
                assert!(
                    s["evictions"].as_u64().unwrap() > 0,
                    "{algo} {name}: no eviction under the cap"
                );
                assert!(s["loads"].as_u64().unwrap() > 0);
            }
            outputs.push((name, std::fs::read(&out).unwrap()));
        }
        for (name, bytes) in &outputs[1..] {
            assert!(
                bytes == &outputs[0].1,
                "{algo} {init}: centroids with {name} differ from the uncapped run"
            );
        }
    }
}

/// k-means||: five passes over data that does not fit (two rounds of two,
/// then the candidates' weights), and starting centres as good as
/// k-means++'s on well-separated blobs.
#[test]
fn k_means_parallel_reads_the_data_five_times_and_finds_the_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let d = 6;
    let x = blobs(40_000, &centres(), 0.5, 7);
    let data = write_data(dir.path(), &x, d);
    let bytes = (x.len() * 4) as u64;
    let run = |init: &str, cap: &str| {
        let stats = dir.path().join(format!("{init}-{cap}.json"));
        let args = [
            "kmeans",
            "--input",
            data.to_str().unwrap(),
            "--k",
            "5",
            "--init",
            init,
            "--algorithm",
            "lloyd",
            "--iterations",
            "1",
            "--mem-cap",
            cap,
            "--partitions",
            "8",
            "--stats",
            stats.to_str().unwrap(),
        ];
        let (code, err) = bin_common::outcore_cli(&args);
        assert_eq!(code, Some(0), "{init} {cap}: {err}");
        stats_of(&stats)
    };
    let capped = run("k-means||", "256KiB");
    let read = capped["init_bytes_read"].as_u64().unwrap();
    assert!(
        read >= 4 * bytes && read <= 6 * bytes,
        "k-means|| read {read} bytes of {bytes}: {capped}"
    );
    let parallel = run("k-means||", "none")["inertia"].as_f64().unwrap();
    let plus_plus = run("k-means++", "none")["inertia"].as_f64().unwrap();
    // One Lloyd iteration from either start: every blob has its centre
    // (a missed blob would cost about 40x the inertia of the noise).
    assert!(
        parallel < plus_plus * 1.05,
        "k-means|| {parallel} against k-means++ {plus_plus}"
    );
}

/// A `.npy` input is never copied to spill files: under a cap, evicted
/// partitions are dropped and read again from the input (checked against
/// the first read), and the centroids equal the uncapped run's.
#[test]
fn file_input_under_a_cap_is_read_again_not_spilled() {
    let dir = tempfile::tempdir().unwrap();
    let c: Vec<Vec<f64>> = (0..6)
        .map(|i| (0..16).map(|j| ((i * 16 + j) % 11) as f64).collect())
        .collect();
    let x = blobs(120_000, &c, 1.0, 5);
    let data = write_data(dir.path(), &x, 16);
    let mut outputs = Vec::new();
    for cap in ["none", "2MiB"] {
        let out = dir.path().join(format!("c-{cap}.npy"));
        let stats = dir.path().join(format!("s-{cap}.json"));
        let args = [
            "kmeans",
            "--input",
            data.to_str().unwrap(),
            "--k",
            "6",
            "--epochs",
            "2",
            "--partitions",
            "16",
            "--workers",
            "2",
            "--mem-cap",
            cap,
            "--output",
            out.to_str().unwrap(),
            "--stats",
            stats.to_str().unwrap(),
        ];
        let (code, err) = bin_common::outcore_cli(&args);
        assert_eq!(code, Some(0), "cap {cap}: {err}");
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        assert_eq!(s["bytes_written"].as_u64(), Some(0), "cap {cap}: {s}");
        // Everything read came from the input: at least the whole file once.
        let input = s["input_bytes_read"].as_u64().unwrap();
        assert_eq!(s["bytes_read"].as_u64(), Some(input), "{s}");
        assert!(input >= 120_000 * 16 * 4, "{s}");
        let rebuilds = s["runtime"]["rebuilds"].as_u64().unwrap();
        if cap != "none" {
            assert!(s["evictions"].as_u64().unwrap() > 0, "{s}");
            assert!(
                rebuilds > s["partitions"].as_u64().unwrap(),
                "partitions were not read again: {s}"
            );
        } else {
            assert_eq!(Some(rebuilds), s["partitions"].as_u64(), "{s}");
        }
        outputs.push(std::fs::read(&out).unwrap());
    }
    assert!(outputs[0] == outputs[1], "capped centroids differ");
}

/// The initialisation's sample of a file not read yet is read row by row
/// only where that costs less than reading the rows whole: narrow rows
/// (16 columns, 64 bytes) would cost a 4 KiB page each, more than the
/// whole file for a sample of 10,000 of 200,000 rows, so the sample comes
/// from the partitions (`.npy`, weighted `.npy`, `.fvecs`). Either way
/// the results are the same bits as a run from resident partitions.
#[test]
fn narrow_rows_are_not_sampled_a_page_each() {
    let dir = tempfile::tempdir().unwrap();
    let (n, d) = (200_000, 16);
    let c: Vec<Vec<f64>> = (0..6)
        .map(|i| (0..d).map(|j| ((i * d + j) % 13) as f64).collect())
        .collect();
    let x = blobs(n, &c, 1.0, 11);
    let npy = write_data(dir.path(), &x, d);
    let fvecs = dir.path().join("data.fvecs");
    let mut bytes = Vec::with_capacity(n * (d + 1) * 4);
    for row in x.chunks_exact(d) {
        bytes.extend_from_slice(&(d as i32).to_le_bytes());
        for v in row {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(&fvecs, bytes).unwrap();
    let weights = dir.path().join("weights.npy");
    let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32).collect();
    npy::write_array(&weights, &[n as u64], &w).unwrap();
    for (name, src, w) in [
        ("npy", Source::Npy(npy.clone()), None),
        (
            "npy, weighted",
            Source::Npy(npy.clone()),
            Some(weights.as_path()),
        ),
        ("fvecs", Source::Fvecs(fvecs.clone()), None),
    ] {
        // No prefetcher: nothing builds partitions behind the first run's
        // back, and after it every partition is built and resident.
        let session = Session::new(
            Runtime::builder()
                .workers(2)
                .prefetch(false)
                .build()
                .unwrap(),
        );
        let ds = kmeans::load(&session, &src, w, None, 256 << 10, |_, _| {}).unwrap();
        assert!(ds.lazy, "{name}");
        let file = match &src {
            Source::Npy(p) | Source::Fvecs(p) => std::fs::metadata(p).unwrap().len(),
            _ => unreachable!(),
        };
        let reads = ds.input_reads();
        let cfg = Config {
            k: 6,
            epochs: 1,
            ..Config::default()
        };
        let mut runs = Vec::new();
        for _ in 0..2 {
            let before = reads.bytes();
            let mut at_init = None;
            let out = kmeans::run(&session, &ds, &cfg, |e| {
                if let Event::Initialized { .. } = e {
                    at_init = Some(reads.bytes() - before);
                }
            })
            .unwrap();
            runs.push((at_init.unwrap(), out));
        }
        let (first_init, first) = &runs[0];
        assert!(
            *first_init <= file,
            "{name}: the first initialisation read {first_init} bytes of a {file}-byte file"
        );
        let (resident, second) = &runs[1];
        assert_eq!(
            *resident, 0,
            "{name}: the second sample was read from the file"
        );
        assert_eq!(first.centers.values, second.centers.values, "{name}");
        assert_eq!(first.inertia.to_bits(), second.inertia.to_bits(), "{name}");
    }
}

/// The `outcore` binary under a watchdog, in `dir`: panics with its
/// stderr unless it succeeds.
fn outcore_in(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("timeout")
        .args(["-k", "5", "600", env!("CARGO_BIN_EXE_outcore")])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("timeout(1) runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--labels` on tall thin data (4 bytes of labels for 16 of data a row)
/// streams the labels to their file as the final pass makes them: the
/// accounted peak stays near the cap instead of growing by the labels
/// (several times, as they were gathered, converted and written whole),
/// and the file is the uncapped run's, byte for byte.
#[test]
fn labels_of_tall_thin_data_stream_under_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, cap) = ((64u64 << 20) / 16, 8u64 << 20);
    let run = |cap: &str, labels: &str, stats: &str| {
        outcore_in(
            dir.path(),
            &[
                "kmeans",
                "--synthetic",
                "64MiB",
                "--dims",
                "4",
                "--true-k",
                "4",
                "--k",
                "4",
                "--epochs",
                "1",
                "--mem-cap",
                cap,
                "--labels",
                labels,
                "--stats",
                stats,
            ],
        )
    };
    run("8MiB", "capped.npy", "capped.json");
    run("none", "free.npy", "free.json");
    let peak = stats_of(&dir.path().join("capped.json"))["peak_bytes"]
        .as_u64()
        .unwrap();
    // The slack of tests/timeline.rs (one flush threshold per thread, the
    // allocation being trapped), the labels file's write buffer (1 MiB),
    // and one partition (at least 1 MiB of values, and their norms): the
    // labels (4 bytes a row, 16 MiB) are not held.
    let bound = cap + bin_common::flush_slack(cap) + cap / 64 + (1 << 20) + (2 << 20);
    assert!(peak <= bound, "peak {peak} > {bound} under a cap of {cap}");
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let (capped, free) = (read("capped.npy"), read("free.npy"));
    assert_eq!(capped.len() as u64, 128 + 4 * rows, "header and labels");
    assert!(capped == free, "the labels differ under a cap");
}

/// The stats of a run (`--stats`).
fn stats_of(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Tall thin data (one column: 4 bytes of values a row) keeps no row-sized
/// state outside the executors: a K-means run and a predict run of 64 MiB
/// under a 16 MiB cap stay within the cap (plus the slack of
/// `tests/timeline.rs`: one flush threshold per thread and one partition)
/// and give the uncapped run's centres and labels. A partition's row norms
/// kept for its rebuilds took as much memory as the data (peak 74 MiB).
#[test]
fn tall_thin_data_stays_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let data = p("x.npy");
    outcore_in(
        dir.path(),
        &[
            "gen",
            "--synthetic",
            "64MiB",
            "--dims",
            "1",
            "--true-k",
            "4",
            "--output",
            &data,
        ],
    );
    let cap: u64 = 16 << 20;
    // One partition: 1 MiB of values (the smallest partitions, under
    // small caps) and, on one column, as many bytes of norms.
    let slack = bin_common::flush_slack(cap) + (2 << 20);
    let mut centres = Vec::new();
    for c in ["none", "16MiB"] {
        let (out, st) = (p(&format!("c-{c}.npy")), p(&format!("s-{c}.json")));
        outcore_in(
            dir.path(),
            &[
                "kmeans",
                "--input",
                &data,
                "--k",
                "4",
                "--epochs",
                "1",
                "--workers",
                "2",
                "--mem-cap",
                c,
                "--output",
                &out,
                "--stats",
                &st,
            ],
        );
        centres.push(std::fs::read(&out).unwrap());
        if c != "none" {
            let s = stats_of(Path::new(&st));
            let peak = s["peak_bytes"].as_u64().unwrap();
            assert!(
                peak <= cap + slack,
                "kmeans: peak {peak} > {cap} + {slack}: {s}"
            );
            // A batch uses every shard's partition side by side: they
            // must fit together, or each batch evicts what the next one
            // needs (partitions of 1 MiB and their norms read the data
            // 50 times over an epoch; now about 3 times, with the
            // initialisation's and the first pass's reads).
            let read = s["epoch_bytes_read"][0].as_u64().unwrap();
            assert!(
                read <= 5 * (64 << 20),
                "kmeans: {read} bytes read in an epoch: {s}"
            );
        }
    }
    assert!(centres[0] == centres[1], "capped centres differ");
    let mut labels = Vec::new();
    for c in ["none", "16MiB"] {
        let (l, st) = (p(&format!("l-{c}.npy")), p(&format!("t-{c}.json")));
        outcore_in(
            dir.path(),
            &[
                "predict",
                "--centroids",
                &p("c-none.npy"),
                "--input",
                &data,
                "--labels",
                &l,
                "--workers",
                "2",
                "--mem-cap",
                c,
                "--stats",
                &st,
            ],
        );
        labels.push(std::fs::read(&l).unwrap());
        if c != "none" {
            let s = stats_of(Path::new(&st));
            let peak = s["peak_bytes"].as_u64().unwrap();
            assert!(
                peak <= cap + slack,
                "predict: peak {peak} > {cap} + {slack}: {s}"
            );
        }
    }
    assert!(labels[0] == labels[1], "capped labels differ");
}

/// A model as large as the data's partitions (100 centres of 10,000
/// dimensions, the seed's width: 8 MB of sums a step, 4 MB of centres)
/// keeps the cap: the accounted peak within the cap (plus the accounting
/// slack of `tall_thin_data_stays_within_the_cap`), the resident set
/// within 1.05 x the cap + 32 MiB, and the centres the uncapped run's,
/// whatever the partitioning. Every shard's sums (8 x 8 MB), the tasks'
/// own sums and a copy of the centres were held at once outside the
/// executors: over 90 MiB under the 48 MiB cap.
#[test]
fn a_wide_model_stays_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (data, init) = (p("x.npy"), p("init.npy"));
    for (size, to) in [("48MiB", &data), ("4000000", &init)] {
        outcore_in(
            dir.path(),
            &[
                "gen",
                "--synthetic",
                size,
                "--dims",
                "10000",
                "--true-k",
                "20",
                "--output",
                to,
            ],
        );
    }
    let cap: u64 = 48 << 20;
    let slack = bin_common::flush_slack(cap) + (4 << 20);
    for algorithm in [["--epochs", "2"], ["--algorithm", "lloyd"]] {
        let mut centres = Vec::new();
        for (c, parts) in [("none", None), ("48MiB", None), ("48MiB", Some("40"))] {
            let tag = format!("{}-{c}-{}", algorithm[0], parts.unwrap_or("auto"));
            let (out, st) = (p(&format!("c{tag}.npy")), p(&format!("s{tag}.json")));
            let mut args = vec![
                "kmeans",
                "--input",
                &data,
                "--init",
                &init,
                "--k",
                "100",
                "--task-points",
                "100",
                "--workers",
                "2",
                "--mem-cap",
                c,
                "--output",
                &out,
                "--stats",
                &st,
            ];
            args.extend(algorithm);
            if algorithm[0] == "--algorithm" {
                args.extend(["--iterations", "2"]);
            }
            if let Some(n) = parts {
                args.extend(["--partitions", n]);
            }
            outcore_in(dir.path(), &args);
            centres.push(std::fs::read(&out).unwrap());
            if c == "none" {
                continue;
            }
            let s = stats_of(Path::new(&st));
            let peak = s["peak_bytes"].as_u64().unwrap();
            assert!(peak <= cap + slack, "{tag}: peak {peak} > {cap} + {slack}");
            let resident = s["peak_resident_bytes"].as_u64().unwrap();
            let most = cap + cap / 20 + (32 << 20);
            assert!(resident <= most, "{tag}: resident {resident} > {most}");
        }
        assert!(
            centres.iter().all(|c| *c == centres[0]),
            "{}: the centres differ between capped and uncapped runs",
            algorithm[0]
        );
    }
}
