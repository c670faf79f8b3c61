//! Lenders (`outcore lend` beside the job, `mpirun ... : -np 1 outcore
//! lend`): evicted partitions go to their memory and come back from it,
//! with the same bytes out; a lender without room, or killed mid-run,
//! costs time and never a result.

use super::*;

/// A K-means run from an input file under a cap that evicts, on the
/// workers `mpirun` starts before the `:`.
fn kmeans_args(input: &str, extra: &[&'static str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "kmeans",
        "--input",
        input,
        "--k",
        "6",
        "--algorithm",
        "lloyd",
        "--iterations",
        "4",
        "--tol",
        "0",
        "--mem-cap",
        "12MiB",
        "--workers",
        "1",
        "--output",
        "c.npy",
        "--stats",
        "s.json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The input is read about once (the first pass, and the few partitions
/// evicted before they could be put, inside the allocation trap); the
/// later loads, more than the data again, come from the lender. Without
/// it the same run reads the input 3 to 4 times.
fn loads_come_from_the_lender(s: &serde_json::Value) {
    let data = 24u64 << 20;
    let loaded = s["remote_bytes_loaded"].as_u64().unwrap();
    let read = s["bytes_read"].as_u64().unwrap();
    assert!(
        loaded > data && read < data + data / 4,
        "{loaded} B from the lender, {read} B read of {data}: {s}"
    );
}

/// 24 MiB of rows in `dir/x.npy`.
fn data(dir: &Path) -> String {
    super::gen(dir, "24MiB", 16).to_string_lossy().into_owned()
}

/// `workers` ranks of `job` and one lender (`lend`: its flags), under
/// `mpirun` with `flags` and `envs`: the exit code and stderr.
fn with_a_lender(
    dir: &Path,
    workers: usize,
    job: &[String],
    lend: &[&str],
    flags: &[&str],
    envs: &[(&str, &str)],
) -> (Option<i32>, String) {
    let np = workers.to_string();
    let mut cmd: Vec<&str> = vec!["mpirun"];
    cmd.extend(flags);
    cmd.extend(["-np", &np, "--oversubscribe", "--bind-to", "none", BIN]);
    cmd.extend(job.iter().map(String::as_str));
    cmd.extend([":", "-np", "1", BIN, "lend"]);
    cmd.extend(lend);
    let out = watchdog(dir, 120, &cmd)
        .envs(envs.iter().copied())
        .output()
        .expect("timeout(1) runs");
    let code = out.status.code();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_ne!(code, Some(124), "timed out (a hang): {cmd:?}\n{err}");
    (code, err)
}

#[test]
fn a_lender_holds_evicted_partitions_with_the_same_bytes_out() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = data(dir.path());
    let job = kmeans_args(&x, &["--timeline", "t.csv"]);
    let (code, err) = with_a_lender(dir.path(), 2, &job, &["--mem-cap", "256MiB"], &[], &[]);
    assert_eq!(code, Some(0), "{err}");
    let s = stats(&dir.path().join("s.json"));
    assert_eq!(s["lenders"].as_u64(), Some(1), "{s}");
    // Rank 0's timeline shows the traffic to and from the lender.
    let t = outcore_jobs::timeline::read(&dir.path().join("t.csv")).unwrap();
    let last = t.last().unwrap();
    assert!(
        last.remote_bytes_sent > 0 && last.remote_bytes_loaded > last.remote_bytes_sent,
        "{last:?}"
    );
    loads_come_from_the_lender(&s);
    assert_eq!(s["remote_fallbacks"].as_u64(), Some(0), "{s}");
    let lent: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("outcore lend:"))
        .collect();
    assert_eq!(lent.len(), 1, "{err}");
    assert!(lent[0].contains("declined 0"), "{err}");
    // The same centres as one process without a lender.
    let args: Vec<&str> = job.iter().map(String::as_str).collect();
    same_as_one_process(dir.path(), &args, "c.npy", "two ranks and a lender");
    // And with the tier off, none of it goes there.
    let off = dir.path().join("off");
    std::fs::create_dir(&off).unwrap();
    let job = kmeans_args(&x, &["--remote-memory", "off"]);
    let (code, err) = with_a_lender(&off, 2, &job, &[], &[], &[]);
    assert_eq!(code, Some(0), "{err}");
    let s = stats(&off.join("s.json"));
    assert_eq!(s["remote_bytes_sent"].as_u64(), Some(0), "{s}");
    assert!(
        std::fs::read(off.join("c.npy")).unwrap()
            == std::fs::read(dir.path().join("c.npy")).unwrap()
    );
}

#[test]
fn a_lender_without_room_leaves_the_evictions_to_the_disk() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = data(dir.path());
    let job = kmeans_args(&x, &[]);
    // 40 MiB less the lender's own 32: room for 8 MiB of the 24.
    let (code, err) = with_a_lender(dir.path(), 1, &job, &["--mem-cap", "40MiB"], &[], &[]);
    assert_eq!(code, Some(0), "{err}");
    let s = stats(&dir.path().join("s.json"));
    let sent = s["remote_bytes_sent"].as_u64().unwrap();
    assert!(sent > 0 && sent <= 8 << 20, "{sent} B sent: {s}");
    assert_eq!(s["remote_fallbacks"].as_u64(), Some(0), "{s}");
    let args: Vec<&str> = job.iter().map(String::as_str).collect();
    same_as_one_process(dir.path(), &args, "c.npy", "a rank and a full lender");
}

/// The lender dies (SIGKILL) after handing back 40 images: under
/// `mpirun --enable-recovery` the job goes on from the disk and its
/// input, with one line about it, and the same bytes.
#[test]
fn a_lender_killed_mid_run_costs_time_not_bytes() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = data(dir.path());
    let job = kmeans_args(&x, &[]);
    let (code, err) = with_a_lender(
        dir.path(),
        1,
        &job,
        &["--mem-cap", "256MiB"],
        &["--enable-recovery"],
        &[
            ("OUTCORE_FAULT_LENDER_DIES_AFTER", "40"),
            ("OUTCORE_REMOTE_PATIENCE_MS", "2000"),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let gone: Vec<&str> = err.lines().filter(|l| l.starts_with("outcore:")).collect();
    assert_eq!(gone.len(), 1, "{err}");
    assert!(gone[0].contains("the lender at rank 1 is gone"), "{err}");
    let s = stats(&dir.path().join("s.json"));
    assert!(s["remote_fallbacks"].as_u64().unwrap() > 0, "{s}");
    let args: Vec<&str> = job.iter().map(String::as_str).collect();
    same_as_one_process(dir.path(), &args, "c.npy", "a rank whose lender died");
}

/// `--lenders 1` spawns a lender on a free slot (`--host localhost:3`
/// for two ranks): the same centres as one process, the later loads from
/// the lender.
#[test]
fn a_spawned_lender_holds_evicted_partitions_with_the_same_bytes_out() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = data(dir.path());
    let job = kmeans_args(&x, &[]);
    let mut cmd = vec![
        "mpirun",
        "-np",
        "2",
        "--host",
        "localhost:3",
        "--bind-to",
        "none",
        BIN,
    ];
    cmd.extend(job.iter().map(String::as_str));
    cmd.extend(["--lenders", "1"]);
    let (code, err) = watched(dir.path(), 120, &cmd);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("outcore lend:"))
            .count(),
        1,
        "{err}"
    );
    let s = stats(&dir.path().join("s.json"));
    assert_eq!(s["lenders"].as_u64(), Some(1), "{s}");
    loads_come_from_the_lender(&s);
    let args: Vec<&str> = job.iter().map(String::as_str).collect();
    same_as_one_process(dir.path(), &args, "c.npy", "two ranks and a spawned lender");
}

/// `mpirun` running `tight` on one rank and `roomy` on a second (`:`
/// gives each its own flags): the exit code and stderr.
fn side_by_side(dir: &Path, tight: &[String], roomy: &[String]) -> (Option<i32>, String) {
    let mut cmd: Vec<&str> = vec!["mpirun", "--bind-to", "none", "-np", "1", BIN];
    cmd.extend(tight.iter().map(String::as_str));
    cmd.extend([":", "-np", "1", BIN]);
    cmd.extend(roomy.iter().map(String::as_str));
    watched(dir, 120, &cmd)
}

/// `args` with the cap `from` changed to `to`.
fn with_cap(args: &[String], from: &str, to: &str) -> Vec<String> {
    args.iter()
        .map(|a| if a == from { to.into() } else { a.clone() })
        .collect()
}

/// Two working ranks, the second with room to spare (`mpirun`'s `:`
/// gives each its own cap): the first's evictions go to the second's
/// memory and come back from it, with the same centres as one process.
#[test]
fn a_rank_with_room_to_spare_keeps_another_ranks_evictions() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let x = data(dir.path());
    let tight = kmeans_args(&x, &[]);
    let roomy = with_cap(&tight, "12MiB", "256MiB");
    let (code, err) = side_by_side(dir.path(), &tight, &roomy);
    assert_eq!(code, Some(0), "{err}");
    let s = stats(&dir.path().join("s.json"));
    assert_eq!(s["lenders"].as_u64(), Some(0), "{s}");
    let p = &s["per_process"];
    let kept = p[1]["remote_bytes_kept"].as_u64().unwrap();
    assert!(kept > 0, "rank 1 kept nothing: {s}");
    assert_eq!(p[0]["remote_bytes_kept"].as_u64(), Some(0), "{s}");
    let loaded = p[0]["remote_bytes_loaded"].as_u64().unwrap();
    let read = p[0]["bytes_read"].as_u64().unwrap();
    assert!(loaded > read, "{loaded} B from rank 1, {read} B read: {s}");
    assert_eq!(s["remote_fallbacks"].as_u64(), Some(0), "{s}");
    // Rank 1 stayed within its own cap and never evicted.
    assert_eq!(p[1]["evictions"].as_u64(), Some(0), "{s}");
    let args: Vec<&str> = tight.iter().map(String::as_str).collect();
    same_as_one_process(dir.path(), &args, "c.npy", "a rank lending to another");
}

/// The second rank keeps the first one's evictions while its own
/// partitions come in, then its own work needs the room: it gives
/// images back (their owner reads them from its input instead, without
/// a warning), never evicts its own, and stays within its cap; the same
/// centres as one process.
#[test]
fn a_rank_gives_back_what_it_kept_when_its_own_work_needs_the_room() {
    if !have_mpirun() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 96 MiB of rows a rank: 16 MiB holds little of them, 128 MiB all of
    // them and, early on, much of the other rank's.
    let x = super::gen(dir.path(), "192MiB", 16);
    let x = x.to_str().unwrap();
    let tight = with_cap(&kmeans_args(x, &[]), "12MiB", "16MiB");
    let roomy = with_cap(&tight, "16MiB", "128MiB");
    let (code, err) = side_by_side(dir.path(), &tight, &roomy);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("warning"), "{err}");
    let s = stats(&dir.path().join("s.json"));
    let p = &s["per_process"];
    let kept = p[1]["remote_bytes_kept"].as_u64().unwrap();
    let back = p[1]["remote_bytes_given_back"].as_u64().unwrap();
    assert!(
        kept > 0 && back > 0,
        "kept {kept} B, gave back {back} B: {s}"
    );
    assert!(p[0]["remote_fallbacks"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(p[1]["evictions"].as_u64(), Some(0), "{s}");
    assert!(p[1]["peak_bytes"].as_u64().unwrap() <= 128 << 20, "{s}");
    let args: Vec<&str> = tight.iter().map(String::as_str).collect();
    same_as_one_process(
        dir.path(),
        &args,
        "c.npy",
        "a rank giving back what it kept",
    );
}
