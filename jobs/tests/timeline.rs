//! `--timeline` and `outcore plot`: the samples follow the run (phases in
//! order, counters that end at the run's totals), accounted memory stays
//! within the cap plus the documented slack during a capped run, and the
//! plot is a PNG of the size asked for.

mod bin_common;

use std::path::Path;

use outcore_jobs::timeline::{self, Sample};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(args: &[&str]) -> String {
    let (code, err) = bin_common::outcore_cli(args);
    assert_eq!(code, Some(0), "{args:?}: {err}");
    err
}

fn stats(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The phases in the order they appear, each once.
fn phases(t: &[Sample]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for x in t {
        if out.last() != Some(&x.phase) {
            out.push(x.phase.clone());
        }
    }
    out
}

/// Checks what every timeline must hold, against the run's stats.
fn check_common(t: &[Sample], st: &serde_json::Value, cap: Option<u64>) {
    assert!(t.len() >= 2, "{} samples", t.len());
    for w in t.windows(2) {
        assert!(w[1].time_s >= w[0].time_s, "time goes back: {w:?}");
        for (a, b, what) in [
            (w[0].evictions, w[1].evictions, "evictions"),
            (w[0].loads, w[1].loads, "loads"),
            (w[0].bytes_read, w[1].bytes_read, "bytes read"),
            (w[0].bytes_written, w[1].bytes_written, "bytes written"),
        ] {
            assert!(b >= a, "{what} decrease: {w:?}");
        }
    }
    assert!(t.iter().all(|x| x.cap_bytes == cap), "cap column");
    assert!(t.iter().any(|x| x.rss_bytes > 0), "no RSS");
    // The last row shows the run's totals: the counters the stats report,
    // even while a prefetch finishes in the background (a row sampled on
    // its own, just before the totals, differed from them by 3 evictions
    // once in CI).
    let last = &t[t.len() - 1];
    for (sampled, total, what) in [
        (
            last.evictions,
            st["evictions"].as_u64().unwrap(),
            "evictions",
        ),
        (last.loads, st["loads"].as_u64().unwrap(), "loads"),
    ] {
        assert_eq!(
            sampled, total,
            "{what}: {sampled} in the timeline, {total} in the stats"
        );
    }
    assert_eq!(last.bytes_written, st["bytes_written"].as_u64().unwrap());
}

#[test]
fn a_capped_kmeans_timeline_follows_the_run_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("t.csv");
    let st = dir.path().join("s.json");
    let cap: u64 = 16 << 20;
    run(&[
        "kmeans",
        "--synthetic",
        "96MiB",
        "--dims",
        "64",
        "--k",
        "16",
        "--true-k",
        "16",
        "--epochs",
        "3",
        "--workers",
        "2",
        "--mem-cap",
        "16MiB",
        "--timeline",
        s(&tl),
        "--stats",
        s(&st),
    ]);
    let t = timeline::read(&tl).unwrap();
    let st = stats(&st);
    check_common(&t, &st, Some(cap));
    assert!(st["evictions"].as_u64().unwrap() > 0);
    // A 50 ms period: about one sample per 50 ms of the run.
    let wall = st["wall_seconds"].as_f64().unwrap();
    assert!(
        t.len() as f64 >= wall / 0.05 * 0.5,
        "{} samples in {wall} s",
        t.len()
    );
    let p = phases(&t);
    let want = ["init", "epoch 1", "epoch 2", "epoch 3", "final pass"];
    let mut at = 0;
    for w in want {
        let found = p[at..].iter().position(|x| x == w);
        assert!(found.is_some(), "phase {w} missing or out of order: {p:?}");
        at += found.unwrap() + 1;
    }
    // The slack documented in docs/cli.md: per thread (the workers, the
    // prefetcher, the main thread) one flush threshold not yet published
    // (cap / 256, at least 64 KiB), plus the allocation being trapped (at
    // most a partition, cap / 64 here).
    let slack = bin_common::flush_slack(cap) + cap / 64;
    let worst = t.iter().map(|x| x.accounted_bytes).max().unwrap();
    assert!(
        worst <= cap + slack,
        "accounted {worst} > cap {cap} + slack {slack}"
    );
    // And the memory was used: the run worked near its cap.
    assert!(
        worst > cap / 2,
        "accounted at most {worst} under a cap of {cap}"
    );
}

#[test]
fn train_and_predict_timelines_name_their_phases() {
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("train.csv");
    let st = dir.path().join("train.json");
    let model = dir.path().join("m.npy");
    run(&[
        "train",
        "--synthetic",
        "8MiB",
        "--dims",
        "32",
        "--classes",
        "4",
        "--max-iter",
        "5",
        "--mem-cap",
        "none",
        "--output",
        s(&model),
        "--timeline",
        s(&tl),
        "--stats",
        s(&st),
    ]);
    let t = timeline::read(&tl).unwrap();
    check_common(&t, &stats(&st), None);
    let p = phases(&t);
    assert_eq!(p.first().map(String::as_str), Some("load"), "{p:?}");
    assert!(p.iter().any(|x| x == "iteration 1"), "{p:?}");
    assert_eq!(p.last().map(String::as_str), Some("output"), "{p:?}");

    let x = dir.path().join("x.npy");
    run(&[
        "gen",
        "--synthetic",
        "4MiB",
        "--dims",
        "32",
        "--output",
        s(&x),
    ]);
    let tl = dir.path().join("predict.csv");
    let st = dir.path().join("predict.json");
    let labels = dir.path().join("l.npy");
    run(&[
        "predict",
        "--model",
        s(&model),
        "--input",
        s(&x),
        "--labels",
        s(&labels),
        "--mem-cap",
        "2MiB",
        "--timeline",
        s(&tl),
        "--stats",
        s(&st),
    ]);
    let t = timeline::read(&tl).unwrap();
    check_common(&t, &stats(&st), Some(2 << 20));
    assert!(phases(&t).iter().any(|x| x == "label"), "{:?}", phases(&t));
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

#[test]
fn plot_draws_a_png_and_rejects_what_is_not_a_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let tl = dir.path().join("t.csv");
    run(&[
        "kmeans",
        "--synthetic",
        "32MiB",
        "--dims",
        "32",
        "--k",
        "8",
        "--epochs",
        "2",
        "--mem-cap",
        "8MiB",
        "--timeline",
        s(&tl),
    ]);
    let png = dir.path().join("m.png");
    let err = run(&["plot", s(&tl), "--output", s(&png)]);
    assert!(err.contains("samples"), "{err}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(png_size(&bytes), (1200, 700));
    // Not a blank image: a PNG of one colour compresses far smaller.
    assert!(bytes.len() > 20_000, "{} bytes", bytes.len());
    let small = dir.path().join("s.png");
    run(&[
        "plot",
        s(&tl),
        "--output",
        s(&small),
        "--width",
        "640",
        "--height",
        "400",
        "--title",
        "a test",
    ]);
    assert_eq!(png_size(&std::fs::read(&small).unwrap()), (640, 400));

    let junk = dir.path().join("junk.csv");
    std::fs::write(&junk, "a,b,c\n1,2,3\n").unwrap();
    let out = dir.path().join("x.png");
    for (file, extra) in [
        (junk.clone(), vec![]),
        (dir.path().join("missing.csv"), vec![]),
        (tl.clone(), vec!["--width", "5"]),
    ] {
        let mut args = vec!["plot", s(&file), "--output", s(&out)];
        args.extend(extra);
        let (code, err) = bin_common::outcore_cli(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!out.exists());
    }
}

#[test]
fn a_timeline_can_go_to_standard_output() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args([
            "kmeans",
            "--synthetic",
            "8MiB",
            "--dims",
            "32",
            "--k",
            "4",
            "--mem-cap",
            "none",
            "--timeline",
            "-",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(timeline::HEADER));
    assert!(lines.count() >= 2, "{text}");
    assert!(!Path::new("-").exists(), "a file named '-' was created");
}

/// Every phase gets a row of its own when it starts, even one that ends
/// long before the next tick (a fast machine ran whole training runs
/// between two ticks, and the timeline then showed no iteration at all).
#[test]
fn every_phase_has_a_row_however_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let rt = outcore::Runtime::builder().workers(1).build().unwrap();
    let tl = timeline::Timeline::start(&rt, &path, std::time::Duration::from_secs(3600), "load")
        .unwrap();
    for name in ["init", "iteration 1", "iteration 2", "output"] {
        tl.phase(name);
    }
    let rows = tl.finish().unwrap();
    let t = timeline::read(&path).unwrap();
    assert_eq!(t.len() as u64, rows);
    assert_eq!(
        phases(&t),
        ["load", "init", "iteration 1", "iteration 2", "output"],
        "{t:?}"
    );
    for w in t.windows(2) {
        assert!(w[0].time_s <= w[1].time_s, "{t:?}");
    }
}
