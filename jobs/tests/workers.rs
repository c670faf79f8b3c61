//! The worker count is in the plan: under a cap, a run starts only the
//! workers whose tasks and threads the cap holds, says so in one line, and
//! its resident set stays within the cap (issue 52: 256 workers under a
//! 64 MiB cap peaked at 250-380 MiB resident, exit 0, no warning).

mod bin_common;

use bin_common::outcore_rss;

const CAP: u64 = 64 << 20;

/// The bound the soak holds every run to: 1.05 x cap + 32 MiB (code,
/// stacks, the allocator's own pages).
fn within(rss: u64) -> bool {
    rss <= CAP + CAP / 20 + (32 << 20)
}

fn check(args: &[&str]) {
    let (code, err, rss) = outcore_rss(args);
    assert_eq!(code, Some(0), "{err}");
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("256 workers asked for"))
        .collect();
    assert_eq!(warned.len(), 1, "one line says fewer workers run:\n{err}");
    assert!(
        within(rss),
        "peak resident set {} MiB under a {} MiB cap:\n{err}",
        rss >> 20,
        CAP >> 20
    );
}

#[test]
fn kmeans_with_256_workers_keeps_the_cap_and_says_how_many_run() {
    check(&[
        "kmeans",
        "--synthetic",
        "256MiB",
        "--dims",
        "64",
        "--k",
        "16",
        "--epochs",
        "1",
        "--mem-cap",
        "64MiB",
        "--workers",
        "256",
    ]);
}

#[test]
fn predict_with_256_workers_keeps_the_cap_and_says_how_many_run() {
    let dir = tempfile::tempdir().unwrap();
    let (data, centres, labels) = (
        dir.path().join("d.npy"),
        dir.path().join("c.npy"),
        dir.path().join("l.npy"),
    );
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (code, err, _) = outcore_rss(&[
        "gen",
        "--synthetic",
        "256MiB",
        "--dims",
        "64",
        "--output",
        &s(&data),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err, _) = outcore_rss(&[
        "kmeans",
        "--input",
        &s(&data),
        "--k",
        "16",
        "--epochs",
        "1",
        "--mem-cap",
        "256MiB",
        "--output",
        &s(&centres),
    ]);
    assert_eq!(code, Some(0), "{err}");
    check(&[
        "predict",
        "--input",
        &s(&data),
        "--centroids",
        &s(&centres),
        "--labels",
        &s(&labels),
        "--mem-cap",
        "64MiB",
        "--workers",
        "256",
    ]);
}

/// With room for every worker asked for, nothing is said.
#[test]
fn with_room_for_every_worker_nothing_is_said() {
    let (code, err, _) = outcore_rss(&[
        "kmeans",
        "--synthetic",
        "16MiB",
        "--dims",
        "16",
        "--k",
        "4",
        "--epochs",
        "1",
        "--mem-cap",
        "256MiB",
        "--workers",
        "2",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("asked for"), "{err}");
}
