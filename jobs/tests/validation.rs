//! A NaN or an infinity in the input is an error naming its row and
//! column: exit code 2, one line, no output, whatever the format and
//! whether the partitions are read once or again under a cap.

mod bin_common;

use std::path::{Path, PathBuf};

const ROWS: usize = 20_000;
const DIMS: usize = 16;

/// Blob-like values with `bad` placed at (`row`, `col`).
fn values(row: usize, col: usize, bad: f32) -> Vec<f32> {
    let mut x: Vec<f32> = (0..ROWS * DIMS)
        .map(|i| ((i * 7919) % 997) as f32 / 97.0 + (i / DIMS % 5) as f32 * 10.0)
        .collect();
    x[row * DIMS + col] = bad;
    x
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs a failing command: exit 2, one `outcore: error:` line naming
/// `want`, none of `outputs` written.
fn fails(args: &[&str], want: &str, outputs: &[&PathBuf]) {
    let (code, err) = bin_common::outcore_cli(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    let lines: Vec<&str> = err.trim().lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(lines[0].starts_with("outcore: error:"), "{err}");
    assert!(lines[0].contains(want), "{args:?}: {err} (want {want:?})");
    for p in outputs {
        assert!(!p.exists(), "{args:?} wrote {}", p.display());
    }
}

#[test]
fn nan_and_inf_in_npy_files_name_the_row_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.npy");
    let labels = dir.path().join("l.npy");
    for (name, row, col, bad, what) in [
        ("nan.npy", 12_345, 7, f32::NAN, "NaN"),
        ("inf.npy", 3, 0, f32::INFINITY, "infinite"),
        (
            "ninf.npy",
            ROWS - 1,
            DIMS - 1,
            f32::NEG_INFINITY,
            "infinite",
        ),
        // Finite, but its square overflows float32: every distance was
        // infinite, every point in one cluster, and nothing said so.
        ("big.npy", 77, 3, -1e20, "-1e20, too large"),
    ] {
        let p = dir.path().join(name);
        outcore_jobs::npy::write_array(&p, &[ROWS as u64, DIMS as u64], &values(row, col, bad))
            .unwrap();
        let want = format!("{name}: row {row}, column {col} is {what}");
        // Read once (no cap), and read in small partitions evicted and
        // read again (a cap).
        for cap in [
            &["--mem-cap", "none"][..],
            &["--mem-cap", "1300KiB", "--partitions", "20"],
        ] {
            for algo in ["minibatch", "lloyd"] {
                let mut args = vec![
                    "kmeans",
                    "--input",
                    s(&p),
                    "--k",
                    "4",
                    "--algorithm",
                    algo,
                    "--output",
                    s(&out),
                    "--labels",
                    s(&labels),
                ];
                args.extend(cap);
                fails(&args, &want, &[&out, &labels]);
            }
        }
    }
}

#[test]
fn raw_fvecs_init_centroids_and_training_data_are_checked_too() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.npy");
    let x = values(100, 3, f32::NAN);
    // Raw float32.
    let raw = dir.path().join("x.f32");
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&raw, &bytes).unwrap();
    fails(
        &[
            "kmeans",
            "--input",
            s(&raw),
            "--dims",
            "16",
            "--k",
            "4",
            "--output",
            s(&out),
        ],
        "row 100, column 3 is NaN",
        &[&out],
    );
    // .fvecs: each record its dimension, then the values.
    let fv = dir.path().join("x.fvecs");
    let mut rec = Vec::new();
    for r in x.chunks_exact(DIMS) {
        rec.extend_from_slice(&(DIMS as i32).to_le_bytes());
        rec.extend(r.iter().flat_map(|v| v.to_le_bytes()));
    }
    std::fs::write(&fv, &rec).unwrap();
    fails(
        &[
            "kmeans",
            "--input",
            s(&fv),
            "--k",
            "4",
            "--mem-cap",
            "2200KiB",
            "--output",
            s(&out),
        ],
        "row 100, column 3 is NaN",
        &[&out],
    );
    // Initial centres, centroids and a model with a bad value.
    let good = dir.path().join("good.npy");
    outcore_jobs::npy::write_array(&good, &[ROWS as u64, DIMS as u64], &values(0, 0, 1.0)).unwrap();
    let mut c = vec![0.5f32; 4 * DIMS];
    c[DIMS + 2] = f32::INFINITY;
    let cf = dir.path().join("c.npy");
    outcore_jobs::npy::write_array(&cf, &[4, DIMS as u64], &c).unwrap();
    fails(
        &[
            "kmeans",
            "--input",
            s(&good),
            "--init",
            s(&cf),
            "--output",
            s(&out),
        ],
        "c.npy: row 1, column 2 is infinite",
        &[&out],
    );
    fails(
        &[
            "predict",
            "--centroids",
            s(&cf),
            "--input",
            s(&good),
            "--labels",
            s(&out),
        ],
        "c.npy: row 1, column 2 is infinite",
        &[&out],
    );
    // Training data.
    let bad = dir.path().join("bad.npy");
    outcore_jobs::npy::write_array(&bad, &[ROWS as u64, DIMS as u64], &x).unwrap();
    let y = dir.path().join("y.npy");
    let labels: Vec<i32> = (0..ROWS as i32).map(|i| i % 3).collect();
    outcore_jobs::npy::write_array(&y, &[ROWS as u64], &labels).unwrap();
    let (code, err) = bin_common::outcore_cli(&[
        "train",
        "--input",
        s(&bad),
        "--targets",
        s(&y),
        "--output",
        s(&out),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.trim()
            .lines()
            .last()
            .unwrap()
            .contains("bad.npy: row 100, column 3 is NaN"),
        "{err}"
    );
    assert!(!out.exists());
}

/// Small messages of issue 52: an empty `TMPDIR` is unset (as `mktemp`
/// reads it), a `-` output with standard output closed is an error, and
/// an unreadable dtype's message does not list int32 as readable data.
#[test]
fn an_empty_tmpdir_a_closed_stdout_and_bool_data_are_handled() {
    use std::process::{Command, Stdio};
    let run = |tmpdir: Option<&str>, stdout: Stdio, extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
        c.args(["kmeans", "--synthetic", "1MiB", "--dims", "8", "--k", "4"])
            .args(["--epochs", "1", "--mem-cap", "none"])
            .args(extra)
            .stdout(stdout);
        if let Some(t) = tmpdir {
            c.env("TMPDIR", t);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(Some(""), Stdio::null(), &[]);
    assert_eq!(code, Some(0), "TMPDIR=: {err}");
    // A closed standard output: the child's fd 1 is closed before exec.
    let closed = {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
        c.args(["kmeans", "--synthetic", "1MiB", "--dims", "8", "--k", "4"])
            .args(["--epochs", "1", "--mem-cap", "none", "--stats", "-"]);
        // SAFETY: close is async-signal-safe and touches only the child.
        unsafe {
            c.pre_exec(|| {
                libc::close(1);
                Ok(())
            });
        }
        c.output().unwrap()
    };
    let err = String::from_utf8_lossy(&closed.stderr);
    assert_eq!(closed.status.code(), Some(2), "{err}");
    assert!(err.contains("standard output is closed"), "{err}");
    assert!(!err.contains("epoch"), "the run worked first: {err}");
    // Standard output on /dev/null, as a shell's `> /dev/null` opens it,
    // is written as asked.
    let (code, err) = run(None, Stdio::null(), &["--stats", "-"]);
    assert_eq!(code, Some(0), "--stats - > /dev/null: {err}");
    // A bool .npy.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.npy");
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '|b1', 'fortran_order': False, 'shape': (4, 2), }";
    let pad = 64 - (10 + header.len() + 1) % 64;
    let h = format!("{header}{}\n", " ".repeat(pad));
    b.extend_from_slice(&(h.len() as u16).to_le_bytes());
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(&[0u8; 8]);
    std::fs::write(&p, b).unwrap();
    let (code, err) = bin_common::outcore_cli(&["kmeans", "--input", s(&p), "--k", "2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("reads data as float16, float32 or float64, and labels as int32"),
        "{err}"
    );
}
