//! Growth onto free MPI slots (`--max-ranks`): a job whose data does not
//! fit its cap spawns ranks, hands them its shards and gives the same
//! bytes as one process; without a free slot it says why and goes on out
//! of core, with the same bytes.

use std::path::Path;

use super::{
    have_mpirun, nan_in_last_row, on_two_nodes, same_as_one_process, spill_left, stats, tmp_in,
    watchdog, BIN,
};

/// Runs `cmd` in `dir` with `TMPDIR` set to `tmp`, under a watchdog: its
/// stderr; panics unless it succeeds and leaves `tmp` empty.
fn run_clean(dir: &Path, tmp: &Path, envs: &[(&str, &str)], cmd: &[&str]) -> String {
    let out = watchdog(dir, 300, cmd)
        .env("TMPDIR", tmp)
        .envs(envs.iter().copied())
        .output()
        .expect("timeout(1) runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{cmd:?} failed:\n{err}");
    let left: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}\n{err}");
    err
}

/// `mpirun -np 1` with `slots` slots on this machine, `outcore args`.
fn on_slots(slots: usize, args: &[&str]) -> Vec<String> {
    let host = format!("localhost:{slots}");
    let mut cmd: Vec<String> = [
        "mpirun",
        "-np",
        "1",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--host",
        &host,
        BIN,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    cmd.extend(args.iter().map(|s| s.to_string()));
    cmd
}

/// Runs `args` (writing `outputs`) grown from one rank with 4 slots, with
/// one slot, and on one process without MPI; every output is the same
/// bytes. Returns the grown run's statistics.
fn grows_with_the_same_bytes(args: &[&str], outputs: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for (name, slots) in [("grown", 4), ("one-slot", 1), ("single", 0)] {
        let sub = dir.path().join(name);
        let tmp = dir.path().join(format!("{name}-tmp"));
        std::fs::create_dir(&sub).unwrap();
        std::fs::create_dir(&tmp).unwrap();
        let mut a = args.to_vec();
        a.extend(["--stats", "s.json", "--workers", "1"]);
        if slots > 0 {
            a.extend(["--max-ranks", "auto"]);
        }
        let err = if slots > 0 {
            let cmd = on_slots(slots, &a);
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            run_clean(&sub, &tmp, &[], &cmd)
        } else {
            let mut cmd = vec![BIN];
            cmd.extend(&a);
            run_clean(&sub, &tmp, &[], &cmd)
        };
        let files: Vec<Vec<u8>> = outputs
            .iter()
            .map(|o| std::fs::read(sub.join(o)).unwrap())
            .collect();
        runs.push((name, err, stats(&sub.join("s.json")), files));
    }
    let (_, err, grown, files) = &runs[0];
    let ranks = grown["ranks"].as_u64().unwrap();
    assert!(ranks >= 3, "grew to {ranks} ranks only: {err}");
    let g = &grown["growth"][0];
    assert_eq!(
        (g["from"].as_u64(), g["to"].as_u64()),
        (Some(1), Some(ranks))
    );
    assert!(g["seconds"].as_f64().unwrap() > 0.0, "{g}");
    assert_eq!(grown["per_process"].as_array().unwrap().len() as u64, ranks);
    let line = format!("grew from 1 to {ranks} ranks: ");
    assert_eq!(
        err.lines().filter(|l| l.starts_with(&line)).count(),
        1,
        "{err}"
    );
    let (_, err, one, _) = &runs[1];
    assert_eq!(one["ranks"].as_u64(), Some(1));
    assert!(one["growth"].as_array().unwrap().is_empty());
    let warned: Vec<&str> = err.lines().filter(|l| l.contains("cannot grow")).collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(warned[0].contains("MPI_UNIVERSE_SIZE"), "{err}");
    for (name, _, _, other) in &runs[1..] {
        for (o, (a, b)) in outputs.iter().zip(files.iter().zip(other)) {
            assert!(a == b, "{o} differs between the grown run and {name}");
        }
    }
    grown.clone()
}

#[test]
fn kmeans_grows_onto_free_slots_with_the_same_bytes() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 48 MiB of data, 3x a cap of 16 MiB.
    let x = super::gen(dir.path(), "48MiB", 32);
    let s = grows_with_the_same_bytes(
        &[
            "kmeans",
            "--input",
            x.to_str().unwrap(),
            "--k",
            "8",
            "--epochs",
            "2",
            "--mem-cap",
            "16MiB",
            "--output",
            "c.npy",
            "--labels",
            "l.npy",
        ],
        &["c.npy", "l.npy"],
    );
    // Bytes read per epoch are every rank's.
    let per_epoch = s["epoch_bytes_read"].as_array().unwrap();
    assert_eq!(per_epoch.len(), 2, "{s}");
}

#[test]
fn training_grows_onto_free_slots_with_the_same_model() {
    if !have_mpirun() {
        return;
    }
    for solver in ["lbfgs", "sgd"] {
        grows_with_the_same_bytes(
            &[
                "train",
                "--synthetic",
                "48MiB",
                "--dims",
                "32",
                "--classes",
                "4",
                "--solver",
                solver,
                "--mem-cap",
                "16MiB",
                "--output",
                "m.npy",
            ],
            &["m.npy"],
        );
    }
}

#[test]
fn the_job_interfaces_jobs_grow_onto_free_slots_with_the_same_model() {
    if !have_mpirun() {
        return;
    }
    // 48 MiB of data, 3x a cap of 16 MiB.
    for job in ["linear", "pca", "sgd"] {
        grows_with_the_same_bytes(
            &[
                job,
                "--synthetic",
                "48MiB",
                "--dims",
                "32",
                "--mem-cap",
                "16MiB",
                "--output",
                "m.npy",
            ],
            &["m.npy"],
        );
    }
}

#[test]
fn a_job_started_on_one_simulated_node_grows_onto_the_other() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = tmp_in(dir.path());
    let args = [
        "kmeans",
        "--synthetic",
        "24MiB",
        "--dims",
        "32",
        "--k",
        "8",
        "--true-k",
        "8",
        "--epochs",
        "2",
        "--mem-cap",
        "12MiB",
        "--workers",
        "1",
        "--output",
        "c.npy",
        "--stats",
        "s.json",
    ];
    // One rank on node A, which has 2 slots; node B has 2 more.
    let grown = [&args[..], &["--max-ranks", "auto"]].concat();
    let tmpdir = tmp.to_string_lossy();
    let envs = [("NETNS_SLOTS", "2 2"), ("TMPDIR", &tmpdir)];
    let Some((code, err)) = on_two_nodes(dir.path(), &envs, "1", &grown) else {
        return;
    };
    assert_eq!(code, Some(0), "{err}");
    let s = stats(&dir.path().join("s.json"));
    let ranks = s["ranks"].as_u64().unwrap();
    assert!(
        ranks >= 3,
        "grew to {ranks} ranks only (so none on node B): {err}"
    );
    same_as_one_process(dir.path(), &args, "c.npy", "the job grown over two nodes");
}

#[test]
fn a_spawned_rank_that_fails_ends_every_rank_with_one_line_and_no_spill() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = tmp_in(dir.path());
    let x = super::gen(dir.path(), "48MiB", 32);
    // A NaN in the last row: only the last rank, a spawned one, reads it
    // (rank 0's load reads rows only as the run needs them).
    nan_in_last_row(&x);
    let args = [
        "kmeans",
        "--input",
        x.to_str().unwrap(),
        "--k",
        "8",
        "--mem-cap",
        "16MiB",
        "--max-ranks",
        "auto",
        "--workers",
        "1",
        "--output",
        "c.npy",
    ];
    let cmd = on_slots(4, &args);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let out = watchdog(dir.path(), 120, &cmd)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !matches!(out.status.code(), Some(0) | Some(124)),
        "{:?}: {err}",
        out.status
    );
    let ours: Vec<&str> = err.lines().filter(|l| l.starts_with("outcore:")).collect();
    assert_eq!(ours.len(), 1, "{err}");
    assert!(
        ours[0].starts_with("outcore: error: rank 3 of 4: ") && ours[0].contains("is NaN"),
        "{err}"
    );
    assert!(!dir.path().join("c.npy").exists());
    let left = spill_left(&tmp);
    assert!(left.is_empty(), "spill left behind: {left:?}");
}

/// Ranks spawned on a node whose copy of the input is stale (the same
/// shape, other bytes) are caught as the first ranks are: one line, no
/// output, no spill. The simulated node B sees the stale file at the
/// input's path (a bind mount in its own mount namespace).
#[test]
fn spawned_ranks_with_a_stale_copy_stop_every_rank_with_one_line() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = tmp_in(dir.path());
    let x = super::gen(dir.path(), "48MiB", 32);
    let (v, rows, dims) = outcore_jobs::npy::read_matrix(&x).unwrap();
    let stale = dir.path().join("stale.npy");
    let older: Vec<f32> = v.iter().map(|x| x * 1.001).collect();
    outcore_jobs::npy::write_array(&stale, &[rows as u64, dims as u64], &older).unwrap();
    let args = [
        "kmeans",
        "--input",
        "x.npy",
        "--k",
        "8",
        "--mem-cap",
        "16MiB",
        "--max-ranks",
        "auto",
        "--workers",
        "1",
        "--output",
        "c.npy",
    ];
    let bind = format!("{}:{}", stale.display(), x.display());
    let tmpdir = tmp.to_string_lossy();
    let envs = [
        ("NETNS_SLOTS", "2 2"),
        ("NETNS_B_BIND", bind.as_str()),
        ("TMPDIR", &tmpdir),
    ];
    let Some((code, err)) = super::on_two_nodes(dir.path(), &envs, "1", &args) else {
        return;
    };
    assert_ne!(code, Some(0), "{err}");
    let ours: Vec<&str> = err.lines().filter(|l| l.starts_with("outcore:")).collect();
    assert_eq!(ours.len(), 1, "{err}");
    assert!(
        ours[0].contains("disagree on the contents of x.npy")
            && ours[0].contains("differ from rank 0"),
        "{err}"
    );
    assert!(err.contains("grew from 1 to"), "{err}");
    assert!(!dir.path().join("c.npy").exists());
    let left = spill_left(&tmp);
    assert!(left.is_empty(), "spill left behind: {left:?}");
}

/// One epoch of a small K-means on 24 MiB of synthetic data under an
/// 8 MiB cap per rank, one worker: it needs more ranks than one.
const SMALL_KMEANS: &[&str] = &[
    "kmeans",
    "--synthetic",
    "24MiB",
    "--dims",
    "32",
    "--k",
    "8",
    "--epochs",
    "1",
    "--mem-cap",
    "8MiB",
    "--workers",
    "1",
];

#[test]
fn the_timeline_counts_the_ranks_before_and_after_growth() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = tmp_in(dir.path());
    let args = [SMALL_KMEANS, &["--max-ranks", "2", "--timeline", "t.csv"]].concat();
    let cmd = on_slots(4, &args);
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    run_clean(dir.path(), &tmp, &[], &cmd);
    let t = outcore_jobs::timeline::read(&dir.path().join("t.csv")).unwrap();
    assert_eq!(t[0].ranks, 1);
    assert_eq!(t.last().unwrap().ranks, 2);
    let first_two = t.iter().position(|s| s.ranks == 2).unwrap();
    assert!(t[first_two..].iter().all(|s| s.ranks == 2));
    let png = dir.path().join("t.png");
    super::outcore(
        dir.path(),
        0,
        &["plot", "t.csv", "--output", png.to_str().unwrap()],
    );
}

/// A spawn that MPI refuses (here: more ranks than the allocation has
/// slots, which the job never asks for unless `MPI_UNIVERSE_SIZE` says so:
/// the test hook `OUTCORE_FAULT_UNIVERSE_SIZE` makes it claim 4 of 2) is
/// an error code under `MPI_ERRORS_RETURN`: one warning, and the run goes
/// on out of core to the same bytes. It used to panic in the wrapper of
/// the communicator the failed call left. (OpenMPI 4.1's `mpirun` then
/// stays up after the ranks have finished: the test ends it once the run
/// has said it is done.)
#[test]
fn a_refused_spawn_is_a_warning_and_the_run_goes_on_out_of_core() {
    use std::io::BufRead;
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = [SMALL_KMEANS, &["--output", "c.npy"]].concat();
    let mut cmd = vec!["mpirun", "-np", "1", "--host", "localhost:2"];
    cmd.extend(["-x", "OUTCORE_FAULT_UNIVERSE_SIZE=4", BIN]);
    cmd.extend(&args);
    cmd.extend(["--max-ranks", "auto"]);
    let mut child = watchdog(dir.path(), 120, &cmd)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let done = line.starts_with("done in");
        err.push(line);
        if done {
            break;
        }
    }
    // SIGTERM to timeout(1), which passes it on to mpirun.
    // SAFETY: a signal to our own child process.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
    let err = err.join("\n");
    assert!(err.contains("done in"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("outcore: warning:"))
        .collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(
        warned[0].contains("could not grow to 4 ranks") && warned[0].contains("MPI_Comm_spawn"),
        "{err}"
    );
    same_as_one_process(dir.path(), &args, "c.npy", "a run after a refused spawn");
}
