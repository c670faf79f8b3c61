//! The jobs on MPI ranks (`--features mpi`): the same bytes out for any
//! number of processes, and one failing rank ending them all.
//!
//! These tests start `mpirun` (OpenMPI) and skip when it is missing,
//! unless `OUTCORE_REQUIRE_MPI=1` (set by CI) makes that a failure. Every
//! `mpirun` runs under `timeout`, so a hang fails the test instead of
//! blocking it.
#![cfg(feature = "mpi")]

mod bin_common;
#[path = "mpi/failures.rs"]
mod failures;
#[path = "mpi/fit.rs"]
mod fit;
#[path = "mpi/grow.rs"]
mod grow;
#[path = "mpi/remote.rs"]
mod remote;

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_outcore");

/// Whether `mpirun` can be used (else the test is skipped, or fails in CI).
fn have_mpirun() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("OUTCORE_REQUIRE_MPI").as_deref() != Ok("1"),
            "mpirun is required (OUTCORE_REQUIRE_MPI=1) but cannot be run"
        );
        eprintln!("skipped: mpirun is not installed");
    }
    ok
}

/// `cmd` (a program and its arguments) to run in `dir` under a watchdog
/// of `seconds`, allowed to run `mpirun` as root.
///
/// OpenMPI's session directory goes under `dir`: by default every
/// `mpirun` of a user on a node makes and removes the same one
/// (`$TMPDIR/ompi.<host>.<uid>`), and two starting at once race for it:
/// one fails with "A call to mkdir was unable to create the desired
/// directory ... File exists" and no line of ours (open-mpi/ompi#8510).
/// The tests run in parallel, so their first `mpirun`s start together:
/// that made the NaN case of
/// `one_failing_rank_ends_every_rank_with_one_line` fail now and then.
fn watchdog(dir: &Path, seconds: u32, cmd: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.args(["-k", "5", &seconds.to_string()])
        .args(cmd)
        .current_dir(dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", dir);
    c
}

/// Runs `cmd` in `dir` under a watchdog: its exit code (`None`: killed)
/// and stderr.
fn watched(dir: &Path, seconds: u32, cmd: &[&str]) -> (Option<i32>, String) {
    let out = watchdog(dir, seconds, cmd)
        .output()
        .expect("timeout(1) runs");
    let code = out.status.code();
    assert_ne!(code, Some(124), "timed out (a hang): {cmd:?}");
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Runs `args` on one process without MPI in `dir/single`, and checks
/// that its `output` is the same bytes as the one in `dir` (`what`: the
/// run it is compared with).
fn same_as_one_process(dir: &Path, args: &[&str], output: &str, what: &str) {
    let single = dir.join("single");
    std::fs::create_dir(&single).unwrap();
    outcore(&single, 0, args);
    assert!(
        std::fs::read(dir.join(output)).unwrap() == std::fs::read(single.join(output)).unwrap(),
        "{output} differs between {what} and one process"
    );
}

/// Writes a NaN into the last value of the `.npy` file `x`: only the rank
/// holding the last row reads it.
fn nan_in_last_row(x: &Path) {
    let mut bytes = std::fs::read(x).unwrap();
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(x, bytes).unwrap();
}

/// `dir/tmp`, made.
fn tmp_in(dir: &Path) -> PathBuf {
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    tmp
}

/// The spill directories left in `tmp`.
fn spill_left(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("outcore-spill-"))
        .collect()
}

/// `outcore args` on `np` ranks spread over two simulated nodes
/// (tests/mpi/netns.sh; `envs` for the script, such as `NETNS_SLOTS`),
/// in `dir` under a watchdog: its exit code and stderr, or `None` when
/// the script cannot make the nodes here (it says why).
fn on_two_nodes(
    dir: &Path,
    envs: &[(&str, &str)],
    np: &str,
    args: &[&str],
) -> Option<(Option<i32>, String)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mpi/netns.sh");
    let mut cmd = vec!["bash", script, np, BIN];
    cmd.extend(args);
    let out = watchdog(dir, 300, &cmd)
        .envs(envs.iter().copied())
        .output()
        .expect("timeout(1) runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() == Some(77) {
        eprintln!("skipped: {}", err.trim());
        return None;
    }
    assert_ne!(out.status.code(), Some(124), "timed out (a hang): {cmd:?}");
    Some((out.status.code(), err))
}

/// `outcore args` on `n` ranks (0: started directly, no MPI); panics
/// unless it succeeds.
fn outcore(dir: &Path, n: usize, args: &[&str]) -> String {
    let np = n.to_string();
    let mut cmd: Vec<&str> = Vec::new();
    if n > 0 {
        cmd.extend(["mpirun", "-np", &np, "--oversubscribe", "--bind-to", "none"]);
    }
    cmd.push(BIN);
    cmd.extend(args);
    let (code, err) = watched(dir, 300, &cmd);
    assert_eq!(code, Some(0), "{cmd:?} failed:\n{err}");
    err
}

/// Runs `cmd` in `dir` under the watchdog and expects it to fail with
/// exactly one line of ours (`outcore: ...`), which it returns.
fn one_error_line(dir: &Path, what: &str, cmd: &[&str]) -> String {
    let (code, err) = watched(dir, 120, cmd);
    assert_ne!(code, Some(0), "{what}: {err}");
    // Every line of ours: ranks that mpirun stops because another failed
    // add none (they used to say "interrupted by SIGTERM").
    let ours: Vec<&str> = err.lines().filter(|l| l.starts_with("outcore:")).collect();
    assert_eq!(ours.len(), 1, "{what}: {err}");
    ours[0].to_string()
}

fn stats(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Runs `args` (which write `outputs` into the current directory) directly
/// and on 1 to 4 ranks, under a cap that evicts on every rank: every
/// output is the same file, byte for byte, and the statistics' `exact`
/// fields (double precision, where a different order of the additions
/// shows in the last bits) are the same numbers. The last run's stats.
fn same_bytes_for_every_count(
    args: &[&str],
    outputs: &[&str],
    exact: &[&str],
) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let mut reference: Option<Vec<Vec<u8>>> = None;
    let mut last = serde_json::Value::Null;
    for n in [0, 1, 2, 3, 4] {
        let sub = dir.path().join(format!("n{n}"));
        std::fs::create_dir(&sub).unwrap();
        let mut a = args.to_vec();
        a.extend(["--stats", "s.json", "--workers", "1"]);
        outcore(&sub, n, &a);
        let s = stats(&sub.join("s.json"));
        let mut files: Vec<Vec<u8>> = outputs
            .iter()
            .map(|o| std::fs::read(sub.join(o)).unwrap())
            .collect();
        for f in exact {
            let v = f
                .split('.')
                .try_fold(&s, |v, key| match key.parse::<usize>() {
                    Ok(i) => v.get(i),
                    Err(_) => v.get(key),
                });
            let v = v.unwrap_or_else(|| panic!("no {f} in {s}"));
            assert!(v.is_number() || v.is_array(), "{f}: {v}");
            files.push(v.to_string().into_bytes());
        }
        let per = s["per_process"].as_array().unwrap();
        assert_eq!(per.len(), n.max(1), "{s}");
        assert_eq!(s["processes"].as_u64(), Some(n.max(1) as u64));
        for r in per {
            assert!(
                r["evictions"].as_u64().unwrap() > 0,
                "a rank did not evict on {n} ranks: {r}"
            );
        }
        let total: u64 = per.iter().map(|r| r["loads"].as_u64().unwrap()).sum();
        assert_eq!(s["loads"].as_u64(), Some(total), "totals are the sums");
        match &reference {
            None => reference = Some(files),
            Some(r) => {
                for (i, (a, b)) in r.iter().zip(&files).enumerate() {
                    let what = outputs
                        .get(i)
                        .copied()
                        .unwrap_or_else(|| exact[i - outputs.len()]);
                    assert!(
                        a == b,
                        "{what} differs on {n} ranks from the single process: {} / {}",
                        String::from_utf8_lossy(&a[..a.len().min(200)]),
                        String::from_utf8_lossy(&b[..b.len().min(200)])
                    );
                }
            }
        }
        last = s;
    }
    last
}

/// A float32 `.npy` file `name` in `dir` of shape `shape` (`"(n,)"` or
/// `"(k, d)"`) holding `values`.
fn npy_f32(dir: &Path, name: &str, shape: &str, values: impl Iterator<Item = f32>) -> PathBuf {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    for v in values {
        b.extend(v.to_le_bytes());
    }
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    p
}

/// A 1-D float32 `.npy` of `n` pseudo-random sample weights in [0.5, 2).
fn weights(dir: &Path, n: usize) -> PathBuf {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let w = (0..n).map(move |_| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        0.5 + 1.5 * ((x >> 40) as f32 / (1u64 << 24) as f32)
    });
    npy_f32(dir, "w.npy", &format!("({n},)"), w)
}

/// A `.npy` file of synthetic data written by `outcore gen`.
fn gen(dir: &Path, size: &str, dims: usize) -> PathBuf {
    let p = dir.join("x.npy");
    let d = dims.to_string();
    let (code, err) = watched(
        dir,
        120,
        &[
            BIN,
            "gen",
            "--synthetic",
            size,
            "--dims",
            &d,
            "--true-k",
            "8",
            "--output",
            p.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    p
}

#[test]
fn minibatch_kmeans_is_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // 6 MiB of 32-D rows; weights make the sums inexact in double
    // precision, so their order shows.
    let w = weights(data.path(), (6 << 20) / (32 * 4));
    same_bytes_for_every_count(
        &[
            "kmeans",
            "--sample-weight",
            w.to_str().unwrap(),
            "--synthetic",
            "6MiB",
            "--dims",
            "32",
            "--k",
            "8",
            "--true-k",
            "8",
            "--epochs",
            "3",
            "--shards",
            "4",
            // Runs of 2 and 3 tasks per shard; 49,152 rows are not a whole
            // number of tasks.
            "--batch-tasks",
            "10",
            "--n-init",
            "2",
            "--max-no-improvement",
            "20",
            "--task-points",
            "500",
            "--mem-cap",
            "2MiB",
            "--partitions",
            "24",
            "--output",
            "c.npy",
            "--labels",
            "l.npy",
        ],
        &["c.npy", "l.npy"],
        &[
            "inertia",
            "epoch_inertia",
            "init_inertia",
            "steps",
            "best_init",
        ],
    );
}

/// Eight initial centres of 24 columns, for `gen`'s data, three of them
/// far from every row.
fn far_init(dir: &Path) -> PathBuf {
    let init = (0..8 * 24).map(|i| if i < 3 * 24 { 1e4 } else { (i % 7) as f32 });
    npy_f32(dir, "init.npy", "(8, 24)", init)
}

#[test]
fn lloyd_from_a_file_is_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let x = gen(data.path(), "6MiB", 24);
    let w = weights(data.path(), (6 << 20) / (24 * 4));
    // Empty after the first assignment, the far centres take the
    // farthest rows (found on every rank and merged).
    let init = far_init(data.path());
    let s = same_bytes_for_every_count(
        &[
            "kmeans",
            "--input",
            x.to_str().unwrap(),
            "--sample-weight",
            w.to_str().unwrap(),
            "--init",
            init.to_str().unwrap(),
            "--k",
            "8",
            "--algorithm",
            "lloyd",
            "--iterations",
            "4",
            // The tolerance's variance comes from the first pass's column
            // sums, added like the rest.
            "--tol",
            "1e-4",
            "--task-points",
            "500",
            "--mem-cap",
            "2MiB",
            "--partitions",
            "24",
            "--output",
            "c.npy",
            "--labels",
            "l.npy",
        ],
        &["c.npy", "l.npy"],
        &["inertia", "epoch_inertia", "relocated"],
    );
    assert!(s["relocated"].as_u64().unwrap() >= 3, "{s}");
}

/// k-means||: the cost, the draws, the candidates' weights (sample
/// weights make their sums inexact) and the variance behind mini-batch's
/// tolerance, over every rank's rows.
#[test]
fn k_means_parallel_is_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let x = gen(data.path(), "6MiB", 24);
    let w = weights(data.path(), (6 << 20) / (24 * 4));
    same_bytes_for_every_count(
        &[
            "kmeans",
            "--input",
            x.to_str().unwrap(),
            "--sample-weight",
            w.to_str().unwrap(),
            "--init",
            "k-means||",
            "--k",
            "8",
            "--epochs",
            "2",
            "--tol",
            "1e-2",
            "--task-points",
            "500",
            "--mem-cap",
            "2MiB",
            "--partitions",
            "24",
            "--output",
            "c.npy",
            "--labels",
            "l.npy",
        ],
        &["c.npy", "l.npy"],
        &["inertia", "init_inertia", "steps"],
    );
}

#[test]
fn minibatch_reassignment_is_the_same_on_any_number_of_ranks() {
    if !have_mpirun() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let x = gen(data.path(), "6MiB", 24);
    // Empty after the first step, the far centres move onto rows of the
    // batch (drawn by hash on every rank, sent by the rank holding them).
    let init = far_init(data.path());
    let s = same_bytes_for_every_count(
        &[
            "kmeans",
            "--input",
            x.to_str().unwrap(),
            "--init",
            init.to_str().unwrap(),
            "--k",
            "8",
            "--epochs",
            "2",
            "--shards",
            "4",
            "--batch-tasks",
            "10",
            "--task-points",
            "500",
            "--mem-cap",
            "2MiB",
            "--partitions",
            "24",
            "--output",
            "c.npy",
        ],
        &["c.npy"],
        &["inertia", "epoch_inertia", "relocated"],
    );
    assert!(s["relocated"].as_u64().unwrap() >= 3, "{s}");
}

/// `--labels` of tall thin data on 2 ranks: each rank streams its rows'
/// labels (rank 0 into the file, rank 1 to rank 0 a piece at a time once
/// the run is done), so no rank's accounted peak grows by the labels (4
/// bytes a row; rank 0 used to gather them all), and the file is one
/// process's, byte for byte.
#[test]
fn labels_of_tall_thin_data_stream_on_two_ranks() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (rows, cap) = ((32u64 << 20) / 16, 4u64 << 20);
    let mut files = Vec::new();
    for n in [0, 2] {
        let (l, st) = (format!("l{n}.npy"), format!("s{n}.json"));
        outcore(
            dir.path(),
            n,
            &[
                "kmeans",
                "--synthetic",
                "32MiB",
                "--dims",
                "4",
                "--true-k",
                "4",
                "--k",
                "4",
                "--epochs",
                "1",
                "--workers",
                "1",
                "--mem-cap",
                "4MiB",
                "--labels",
                &l,
                "--stats",
                &st,
            ],
        );
        let s = stats(&dir.path().join(&st));
        // The slack of tests/timeline.rs (a flush threshold per thread,
        // the allocation being trapped), the labels' write buffer (1 MiB)
        // and one partition (at least 1 MiB of values, and their norms):
        // not the labels (8 MiB in all).
        let bound = cap + bin_common::flush_slack(cap) + cap / 64 + (1 << 20) + (2 << 20);
        for r in s["per_process"].as_array().unwrap() {
            let peak = r["peak_bytes"].as_u64().unwrap();
            assert!(peak <= bound, "{n} ranks: peak {peak} > {bound}: {r}");
        }
        files.push(std::fs::read(dir.path().join(&l)).unwrap());
    }
    assert_eq!(files[0].len() as u64, 128 + 4 * rows, "header and labels");
    assert!(files[0] == files[1], "the labels differ on 2 ranks");
}
