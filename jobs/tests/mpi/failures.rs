//! Failures on MPI ranks: one failing rank, bad arguments, data that
//! differs between ranks, a too small address space or memory, and a stale
//! copy each end every rank with one line, and leave no spill behind.

use super::*;

#[test]
fn one_failing_rank_ends_every_rank_with_one_line() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = gen(dir.path(), "2MiB", 16);
    // A NaN in the last row: only the last rank reads it.
    nan_in_last_row(&x);
    let kmeans = |what: &str, args: &[&str]| {
        let mut cmd = vec!["mpirun", "-np", "3", "--oversubscribe", BIN, "kmeans"];
        cmd.extend(args);
        cmd.extend(["--k", "4", "--workers", "1"]);
        one_error_line(dir.path(), what, &cmd)
    };
    let line = kmeans(
        "NaN",
        &[
            "--input",
            x.to_str().unwrap(),
            "--shards",
            "3",
            "--output",
            "c.npy",
        ],
    );
    assert!(
        line.starts_with("outcore: error: rank 2 of 3: ") && line.contains("is NaN"),
        "{line}"
    );
    assert!(!dir.path().join("c.npy").exists());

    // More processes than shards: rank 0 says so, once, and all exit.
    let synthetic = ["--synthetic", "1MiB", "--dims", "16"];
    let line = kmeans("shards", &[&synthetic[..], &["--shards", "2"]].concat());
    assert!(line.contains("give --shards"), "{line}");

    // Fewer tasks than processes: more shards would not help, smaller
    // tasks do (the advice used to be more shards).
    let line = kmeans(
        "tasks",
        &[&synthetic[..], &["--task-points", "100000"]].concat(),
    );
    assert!(
        line.contains("give a smaller --task-points (at most 5461)"),
        "{line}"
    );
}

/// Every `mpirun` of the tests has a session directory of its own (see
/// [`watchdog`]): with the shared one unusable (here `TMPDIR` is a file,
/// which makes its mkdir fail at once, as the race does now and then), a
/// job still runs. It failed on the old helper, as the NaN case did.
#[test]
fn each_mpirun_has_its_own_session_directory() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let blocked = dir.path().join("not-a-directory");
    std::fs::write(&blocked, b"").unwrap();
    let spill = tmp_in(dir.path());
    let cmd = [
        "mpirun",
        "-np",
        "2",
        "--oversubscribe",
        BIN,
        "kmeans",
        "--synthetic",
        "256KiB",
        "--dims",
        "4",
        "--k",
        "2",
        "--epochs",
        "1",
        "--workers",
        "1",
        "--spill-dir",
        spill.to_str().unwrap(),
    ];
    let out = watchdog(dir.path(), 120, &cmd)
        .env("TMPDIR", &blocked)
        .output()
        .expect("timeout(1) runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn ranks_on_two_simulated_nodes_over_tcp_give_the_same_bytes() {
    if !have_mpirun() {
        return;
    }
    // Two network namespaces joined by a veth pair, OpenMPI's TCP
    // transport between them (tests/mpi/netns.sh; root only).
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "kmeans",
        "--synthetic",
        "4MiB",
        "--dims",
        "32",
        "--k",
        "8",
        "--true-k",
        "8",
        "--epochs",
        "2",
        "--shards",
        "4",
        "--task-points",
        "500",
        "--mem-cap",
        "3MiB",
        "--workers",
        "1",
        "--output",
        "c.npy",
    ];
    let Some((code, err)) = on_two_nodes(dir.path(), &[], "3", &args) else {
        return;
    };
    assert_eq!(code, Some(0), "{err}");
    same_as_one_process(dir.path(), &args, "c.npy", "two nodes");
}

/// Ranks given different data (a stale copy of the file on one node) or
/// different flags stop with one line that says so. They used to stop
/// with an MPI error of their own (a truncated message) or, with Lloyd and
/// fewer rows on one rank, to finish with a different result.
#[test]
fn ranks_that_disagree_on_the_data_stop_with_one_line() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = gen(dir.path(), "2MiB", 16);
    let fewer = dir.path().join("fewer.npy");
    let (v, rows, dims) = outcore_jobs::npy::read_matrix(&x).unwrap();
    outcore_jobs::npy::write_array(
        &fewer,
        &[rows as u64 - 100, dims as u64],
        &v[..(rows - 100) * dims],
    )
    .unwrap();
    for (what, rank1, want) in [
        (
            "rows",
            format!("--input {} --k 4", fewer.display()),
            "on the rows: rank 0 has",
        ),
        (
            "k",
            format!("--input {} --k 5", x.display()),
            "on k: rank 0 has 4, rank 1 has 5",
        ),
        (
            "settings",
            format!("--input {} --k 4 --seed 9", x.display()),
            "on the settings",
        ),
    ] {
        for algorithm in ["lloyd", "minibatch"] {
            let script = format!(
                "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then set -- {rank1}; else set -- --input {} --k 4; fi; exec {BIN} kmeans \"$@\" --algorithm {algorithm} --shards 2 --workers 1 --output c.npy",
                x.display()
            );
            let line = one_error_line(
                dir.path(),
                &format!("{what} {algorithm}"),
                &["mpirun", "-np", "2", "--oversubscribe", "sh", "-c", &script],
            );
            assert!(line.contains(want), "{what} {algorithm}: {line}");
            assert!(!dir.path().join("c.npy").exists());
        }
    }
    // Training, with one more class on rank 1 (as a different labels
    // file would give).
    let script = format!(
        "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then c=5; else c=4; fi; exec {BIN} train --synthetic 2MiB --dims 16 --classes $c --max-iter 2 --partitions 8 --workers 1 --output m.npy"
    );
    let line = one_error_line(
        dir.path(),
        "train",
        &["mpirun", "-np", "2", "--oversubscribe", "sh", "-c", &script],
    );
    assert!(
        line.contains("on the classes: rank 0 has 4, rank 1 has 5"),
        "train: {line}"
    );
    assert!(!dir.path().join("m.npy").exists());
}

/// A bad argument on one rank only (a wrapper script's, a path that
/// exists on one node only) ends every rank with one line naming that
/// rank; on every rank, with one line as on one process. A value that
/// did not parse on a rank other than 0 used to end the job with no line
/// of ours (that rank alone stayed quiet, so that rank 0 would speak for
/// all).
#[test]
fn an_argument_bad_on_one_rank_ends_every_rank_with_one_line() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    gen(dir.path(), "2MiB", 16);
    // The bad rank's value replaces one of the good ones.
    let cases = [
        (
            "k",
            "1",
            "k=x",
            "outcore: error: rank 1 of 3: invalid value 'x' for '--k",
        ),
        (
            "all",
            "*",
            "k=x",
            "outcore: error: invalid value 'x' for '--k",
        ),
        (
            "input",
            "2",
            "input=nope.npy",
            "outcore: error: rank 2 of 3: nope.npy: cannot open",
        ),
        (
            "workers",
            "1",
            "workers=0",
            "outcore: error: rank 1 of 3: --workers must be at least 1",
        ),
    ];
    for (what, rank, bad, want) in cases {
        let script = format!(
            "k=4 input=x.npy workers=1; case \"$OMPI_COMM_WORLD_RANK\" in {rank}) {bad};; esac; exec {BIN} kmeans --input $input --k $k --workers $workers --shards 3"
        );
        let cmd = ["mpirun", "-np", "3", "--oversubscribe", "sh", "-c", &script];
        let line = one_error_line(dir.path(), what, &cmd);
        assert!(line.starts_with(want), "{what}: {line}");
    }
}

/// An address-space limit too small for outcore itself, refused before
/// MPI starts: set before `mpirun` (every rank has it), one line, rank
/// 0's; set for rank 1 alone by a wrapper, one line naming rank 1. Every
/// rank used to print the line (3 lines on 3 ranks).
#[test]
fn an_address_space_too_small_is_refused_once() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = "--oversubscribe {BIN} kmeans --synthetic 1MiB --dims 4 --k 4 --workers 16";
    let run = run.replace("{BIN}", BIN);
    // 16 workers need 160 MiB; mpirun itself runs under 97.7 MiB.
    let all = format!("ulimit -v 100000; exec mpirun -np 3 {run}");
    let line = one_error_line(dir.path(), "every rank", &["sh", "-c", &all]);
    assert!(
        line.starts_with("outcore: error: the address-space limit (ulimit -v 100000)"),
        "{line}"
    );
    let one = format!(
        "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then ulimit -v 100000; fi; exec {BIN} kmeans --synthetic 1MiB --dims 4 --k 4 --workers 16"
    );
    let cmd = ["mpirun", "-np", "3", "--oversubscribe", "sh", "-c", &one];
    let line = one_error_line(dir.path(), "rank 1", &cmd);
    assert!(
        line.starts_with("outcore: error: rank 1 of 3: the address-space limit"),
        "{line}"
    );
}

/// A rank given a stale copy of an input file (the same rows and
/// columns, other bytes: a copy on one node that was not updated) stops
/// every rank with one line naming the file and the rank, and leaves no
/// spill behind. The ranks used to check only the shape, and finished
/// with other centroids (exit 0).
#[test]
fn a_stale_copy_on_one_rank_stops_every_rank_with_one_line() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 8 MiB: sampled, not read whole.
    let x = gen(dir.path(), "8MiB", 16);
    let (v, rows, dims) = outcore_jobs::npy::read_matrix(&x).unwrap();
    let stale = dir.path().join("stale");
    std::fs::create_dir(&stale).unwrap();
    // The same shape, the values scaled a little (as an older version of
    // the preprocessing would give).
    let older: Vec<f32> = v.iter().map(|x| x * 1.001).collect();
    outcore_jobs::npy::write_array(&stale.join("x.npy"), &[rows as u64, dims as u64], &older)
        .unwrap();
    let labels: Vec<i32> = (0..rows as i32).map(|i| i % 3).collect();
    let y = dir.path().join("y.npy");
    outcore_jobs::npy::write_array(&y, &[rows as u64], &labels).unwrap();
    let tmp = tmp_in(dir.path());
    let tmpdir = format!("TMPDIR={}", tmp.display());
    let runs = [
        ("lloyd", "kmeans --k 4 --algorithm lloyd --output c.npy"),
        ("minibatch", "kmeans --k 4 --output c.npy"),
        ("train", "train --max-iter 2 --output c.npy --targets"),
    ];
    for (what, args) in runs {
        let targets = if what == "train" {
            y.to_str().unwrap()
        } else {
            ""
        };
        // Rank 1 runs where its relative x.npy is the stale copy.
        let script = format!(
            "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then cd stale; fi; exec {BIN} {args} {targets} --input x.npy --shards 3 --workers 1"
        );
        let cmd = [
            "mpirun",
            "-np",
            "3",
            "--oversubscribe",
            "-x",
            &tmpdir,
            "sh",
            "-c",
            &script,
        ];
        let line = one_error_line(dir.path(), what, &cmd);
        assert!(
            line.contains("disagree on the contents of x.npy")
                && line.contains("rank 1 has")
                && !line.contains("ranks 1"),
            "{what}: {line}"
        );
        assert!(!dir.path().join("c.npy").exists(), "{what}");
        let left = spill_left(&tmp);
        assert!(left.is_empty(), "{what}: spill left behind: {left:?}");
    }
}

#[test]
fn a_rank_out_of_memory_ends_every_rank_with_one_line_and_no_spill() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // Rank 1 alone runs under an address-space limit that MPI and the
    // program fit in, but not its shard's partition (3 shards: 256 MiB
    // each, loaded in one allocation): its allocation fails with nothing
    // to evict, and the process aborts. With 8 shards (96 MiB partitions)
    // rank 1 sometimes got through by evicting in the trap, reading 60 GiB;
    // with 3 it waited for ever for room until the load's wait stopped
    // counting the prefetcher's given-back tries as progress.
    let script = format!(
        "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then ulimit -v 250000; fi; exec {BIN} \"$@\""
    );
    let tmpdir = format!("TMPDIR={}", tmp.display());
    let cmd = [
        "mpirun",
        "-np",
        "3",
        "--oversubscribe",
        "-x",
        &tmpdir,
        "-x",
        "RUST_BACKTRACE=0",
        "sh",
        "-c",
        &script,
        "sh",
        "kmeans",
        "--synthetic",
        "768MiB",
        "--dims",
        "64",
        "--k",
        "16",
        "--epochs",
        "1",
        "--mem-cap",
        "none",
        "--partitions",
        "3",
        "--shards",
        "3",
        "--workers",
        "1",
    ];
    let line = one_error_line(dir.path(), "out of memory", &cmd);
    assert!(
        line.starts_with("outcore: rank 1 of 3: out of memory: "),
        "{line}"
    );
    let left = spill_left(&tmp);
    assert!(left.is_empty(), "spill left behind: {left:?}");
}
