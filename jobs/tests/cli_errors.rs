//! Bad input to the `outcore` command line.
//!
//! The contract for every bad-input case: the exit code is exactly 2, stderr
//! is exactly one line starting with `outcore: error:` (no panic, no
//! backtrace), and no output file is left behind: the `--output`, `--labels`
//! and `--stats` paths do not exist afterwards and the directory holds
//! nothing the test did not create itself.
//!
//! Every run is tiny: a few KiB of synthetic data or a hand-written .npy file
//! of a handful of rows.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

#[path = "cli_errors/files.rs"]
mod files;
#[path = "cli_errors/limits.rs"]
mod limits;

/// Small synthetic data that runs in well under a second.
const SYNTH: &[&str] = &[
    "--synthetic",
    "256KiB",
    "--dims",
    "8",
    "--k",
    "4",
    "--epochs",
    "1",
    "--mem-cap",
    "none",
];

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs the binary with `args`, in `cwd`.
fn outcore(cwd: &Path, args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outcore"))
        .args(args)
        .current_dir(cwd)
        // A panic would then print a backtrace, which the checks look for.
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("failed to start outcore")
}

fn s(p: &Path) -> String {
    p.to_str().expect("temporary paths are UTF-8").to_string()
}

fn strs(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Every name in `dir`, hidden ones included, recursively (as relative
/// paths), so a leftover spill subdirectory is noticed too.
fn listing(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("dir entry");
            let p = e.path();
            out.insert(
                p.strip_prefix(root)
                    .expect("under root")
                    .display()
                    .to_string(),
            );
            if e.file_type().expect("file type").is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// A scratch directory with the output paths a bad command is given.
struct Scratch {
    dir: TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.join(name);
        fs::write(&p, bytes).expect("write test file");
        p
    }

    fn output(&self) -> PathBuf {
        self.join("c.npy")
    }

    fn labels(&self) -> PathBuf {
        self.join("l.npy")
    }

    fn stats(&self) -> PathBuf {
        self.join("s.json")
    }

    /// `--output`, `--labels`, `--stats` and `--spill-dir`, all in the
    /// scratch directory.
    fn kmeans_outputs(&self) -> Vec<String> {
        vec![
            "--output".into(),
            s(&self.output()),
            "--labels".into(),
            s(&self.labels()),
            "--stats".into(),
            s(&self.stats()),
            "--spill-dir".into(),
            s(self.path()),
        ]
    }

    /// Runs `outcore kmeans <args> <outputs>` and checks the bad-input
    /// contract. Returns stderr.
    fn kmeans_fails(&self, args: &[String]) -> String {
        let mut full = vec!["kmeans".to_string()];
        full.extend_from_slice(args);
        full.extend(self.kmeans_outputs());
        let outputs = [self.output(), self.labels(), self.stats()];
        self.fails(&full, &outputs)
    }

    /// [`Scratch::kmeans_fails`] for bad data that is only found when the
    /// run reads it (K-means reads its input lazily, with no load phase):
    /// the start lines may come first, then the one error line.
    fn kmeans_fails_mid_run(&self, args: &[String]) -> String {
        let mut full = vec!["kmeans".to_string()];
        full.extend_from_slice(args);
        full.extend(self.kmeans_outputs());
        let outputs = [self.output(), self.labels(), self.stats()];
        let out = outcore(self.path(), &full);
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let last = stderr.lines().last().unwrap_or("").to_string();
        let ctx = format!(
            "outcore {}\nstatus: {:?}\nstderr:\n{stderr}",
            full.join(" "),
            out.status
        );
        assert_eq!(out.status.code(), Some(2), "exit code should be 2\n{ctx}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("backtrace"),
            "{ctx}"
        );
        assert!(
            last.starts_with("outcore: error:"),
            "the last line is the error\n{ctx}"
        );
        assert_eq!(stderr.matches("error").count(), 1, "one error line\n{ctx}");
        for p in &outputs {
            assert!(!p.exists(), "output {} was left behind\n{ctx}", p.display());
        }
        last
    }

    /// Runs `outcore <args>` and checks the bad-input contract, including
    /// that none of `outputs` exists afterwards and the scratch directory is
    /// unchanged. Returns stderr.
    fn fails(&self, args: &[String], outputs: &[PathBuf]) -> String {
        let before = listing(self.path());
        let out = outcore(self.path(), args);
        let stderr = check_bad_input(args, &out);
        for p in outputs {
            assert!(
                !p.exists(),
                "outcore {args:?}: output {} was left behind",
                p.display()
            );
        }
        let after = listing(self.path());
        assert_eq!(
            before, after,
            "outcore {args:?}: the directory changed (stray files?)"
        );
        stderr
    }
}

/// Checks exit code 2 and one `outcore: error:` line on stderr (argument
/// errors may add up to two indented lines: clap's tip or the allowed
/// values); returns the trimmed stderr.
fn check_bad_input(args: &[String], out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let ctx = format!(
        "outcore {}\nstatus: {:?}\nstdout: {}\nstderr:\n{stderr}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(2), "exit code should be 2\n{ctx}");
    assert!(!stderr.contains("panicked"), "panic\n{ctx}");
    assert!(
        !stderr.contains("stack backtrace") && !stderr.contains("RUST_BACKTRACE"),
        "backtrace\n{ctx}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 || (lines.len() <= 3 && lines[1..].iter().all(|l| l.starts_with("  "))),
        "stderr should be one line (plus at most two indented notes)\n{ctx}"
    );
    assert!(
        stderr.starts_with("outcore: error:"),
        "stderr should start with 'outcore: error:'\n{ctx}"
    );
    stderr
}

fn assert_mentions(stderr: &str, what: &str) {
    assert!(
        stderr.to_lowercase().contains(&what.to_lowercase()),
        "error message should mention {what:?}: {stderr}"
    );
}

/// A `.npy` file, byte by byte: magic, version 1.0, little-endian u16
/// header length, header text padded with spaces so that the data starts
/// at a multiple of 64, ending in a newline; then `data`.
fn npy(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let order = if fortran { "True" } else { "False" };
    let mut text = format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
    let unpadded = 10 + text.len() + 1;
    text.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    text.push('\n');
    assert_eq!((10 + text.len()) % 64, 0);
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(text.len() as u16).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
    out
}

/// `n` little-endian float32 values, spread out so K-means has distinct
/// points.
fn f32s(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i * 7 % 13) as f32 + 0.25 * i as f32).to_le_bytes())
        .collect()
}

/// A valid 10 x 3 float32 .npy.
fn ok_npy() -> Vec<u8> {
    npy("<f4", false, "(10, 3)", &f32s(30))
}

/// Checks `bytes` is a version 1.0 .npy of `descr` and `shape` holding
/// exactly `elements` items of `size` bytes.
fn check_npy(bytes: &[u8], descr: &str, shape: &str, elements: usize, size: usize) {
    assert!(bytes.len() >= 10, "too short for a .npy file");
    assert_eq!(&bytes[..6], b"\x93NUMPY", "magic");
    assert_eq!(bytes[6], 1, "version");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + hlen) % 64, 0, "header padded to 64 bytes");
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).expect("ASCII header");
    assert!(
        header.ends_with('\n'),
        "header ends in a newline: {header:?}"
    );
    assert!(
        header.contains(&format!("'descr': '{descr}'")),
        "descr {descr}: {header}"
    );
    assert!(
        header.contains("'fortran_order': False"),
        "C order: {header}"
    );
    assert!(
        header.contains(&format!("'shape': {shape}")),
        "shape {shape}: {header}"
    );
    assert_eq!(
        bytes.len(),
        10 + hlen + elements * size,
        "file length for shape {shape}"
    );
}

// ---------------------------------------------------------------------------
// Positive controls: the same commands, with good input, succeed.
// ---------------------------------------------------------------------------

#[test]
fn control_kmeans_on_a_valid_npy_writes_all_outputs() {
    let t = Scratch::new();
    let input = t.write("ok.npy", &ok_npy());
    let args = vec![
        "kmeans".to_string(),
        "--input".into(),
        s(&input),
        "--k".into(),
        "2".into(),
        "--output".into(),
        s(&t.output()),
        "--labels".into(),
        s(&t.labels()),
        "--stats".into(),
        s(&t.stats()),
        "--mem-cap".into(),
        "none".into(),
    ];
    let out = outcore(t.path(), &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    check_npy(&fs::read(t.output()).unwrap(), "<f4", "(2, 3)", 6, 4);
    check_npy(&fs::read(t.labels()).unwrap(), "<i4", "(10,)", 10, 4);

    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(t.stats()).unwrap()).expect("stats are JSON");
    for key in [
        "epoch_seconds",
        "inertia",
        "evictions",
        "trap_evictions",
        "clean_evictions",
        "loads",
        "bytes_written",
        "bytes_read",
        "peak_bytes",
        "wall_seconds",
        "mem_cap_bytes",
    ] {
        assert!(json.get(key).is_some(), "stats lack {key}: {json}");
    }
    // The distance kernel's seconds: one figure per epoch, within what the
    // workers could spend in that epoch.
    let epochs = json["epoch_seconds"].as_array().expect("epoch_seconds");
    let kernel = json["epoch_kernel_seconds"]
        .as_array()
        .expect("epoch_kernel_seconds");
    let workers = json["workers"].as_f64().expect("workers");
    assert_eq!(kernel.len(), epochs.len(), "{json}");
    for (k, e) in kernel.iter().zip(epochs) {
        let (k, e) = (k.as_f64().unwrap(), e.as_f64().unwrap());
        assert!(
            k > 0.0 && k <= e * workers,
            "kernel {k} s in an epoch of {e} s: {json}"
        );
    }

    // Nothing else is left in the directory (no temporary files).
    let want: BTreeSet<String> = ["ok.npy", "c.npy", "l.npy", "s.json"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(listing(t.path()), want);
}

#[test]
fn control_kmeans_on_small_synthetic_data_succeeds() {
    // The base arguments the synthetic bad-input cases vary.
    let t = Scratch::new();
    let mut args = vec!["kmeans".to_string()];
    args.extend(strs(SYNTH));
    args.extend(t.kmeans_outputs());
    let out = outcore(t.path(), &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_npy(&fs::read(t.output()).unwrap(), "<f4", "(4, 8)", 32, 4);
    let want: BTreeSet<String> = ["c.npy", "l.npy", "s.json"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(listing(t.path()), want, "spill directory removed at exit");
}

#[test]
fn control_gen_writes_a_valid_npy() {
    let t = Scratch::new();
    let g = t.join("g.npy");
    let args = strs(&["gen", "--synthetic", "64KiB", "--dims", "8", "--output"]);
    let args = [args, vec![s(&g)]].concat();
    let out = outcore(t.path(), &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_npy(&fs::read(&g).unwrap(), "<f4", "(2048, 8)", 2048 * 8, 4);
    let want: BTreeSet<String> = std::iter::once("g.npy".to_string()).collect();
    assert_eq!(listing(t.path()), want);
}

// ---------------------------------------------------------------------------
// No subcommand
// ---------------------------------------------------------------------------

#[test]
fn no_subcommand_exits_2() {
    let t = Scratch::new();
    let out = outcore(t.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
    // The help is shown (on stderr, as an error), so this is not one line.
    assert!(stderr.contains("Usage"), "help on stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(listing(t.path()).is_empty());
}

// ---------------------------------------------------------------------------
// `outcore kmeans`: bad .npy input
// ---------------------------------------------------------------------------

/// `kmeans --input <path> --k 2 --epochs 1 --mem-cap none` plus `extra`.
fn input_args(input: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "--input".to_string(),
        s(input),
        "--k".into(),
        "2".into(),
        "--epochs".into(),
        "1".into(),
        "--mem-cap".into(),
        "none".into(),
    ];
    a.extend(strs(extra));
    a
}

#[test]
fn kmeans_input_that_is_not_a_regular_file() {
    // Standard input, a device, a FIFO: the run reads its input again by
    // position, so it must be a file (a FIFO .npy said "truncated", raw
    // data from /dev/stdin "the data has no rows").
    let t = Scratch::new();
    let fifo = t.join("pipe.npy");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for (input, extra) in [
        (PathBuf::from("-"), &[][..]),
        (PathBuf::from("/dev/null"), &["--dims", "4"][..]),
        (fifo, &[][..]),
    ] {
        let e = t.kmeans_fails(&input_args(&input, extra));
        assert_mentions(&e, "not a regular file");
    }
}

#[test]
fn kmeans_npy_without_rows_is_named() {
    let t = Scratch::new();
    let p = t.write("none.npy", &npy("<f4", false, "(0, 3)", &[]));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "none.npy: the data has no rows");
}

#[test]
fn kmeans_truncated_npy() {
    let t = Scratch::new();
    // The header promises 10 x 3 float32 (120 bytes); 40 are there.
    let p = t.write("trunc.npy", &npy("<f4", false, "(10, 3)", &f32s(10)));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "truncated");
    assert_mentions(&e, "trunc.npy");

    // Cut inside the header too.
    let whole = ok_npy();
    let p = t.write("cut.npy", &whole[..40]);
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "cut.npy");
}

#[test]
fn kmeans_npy_that_is_not_npy() {
    let t = Scratch::new();
    let p = t.write(
        "text.npy",
        b"this is a text file pretending to be a numpy array\n",
    );
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "not a .npy file");

    let p = t.write("tiny.npy", b"hi");
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "not a .npy file");

    let p = t.write("empty.npy", b"");
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "not a .npy file");
}

#[test]
fn kmeans_npy_unsupported_dtype() {
    let t = Scratch::new();
    let p = t.write("i2.npy", &npy("<i2", false, "(10, 3)", &[0u8; 60]));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "<i2");

    let p = t.write("c8.npy", &npy("<c8", false, "(10, 3)", &[0u8; 240]));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "<c8");

    // A dtype outcore can read but K-means cannot use.
    let p = t.write("i4.npy", &npy("<i4", false, "(10, 3)", &[0u8; 120]));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "float32 or float64");
}

#[test]
fn kmeans_npy_one_dimensional() {
    let t = Scratch::new();
    let p = t.write("flat.npy", &npy("<f4", false, "(30,)", &f32s(30)));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "2-D");
}

#[test]
fn kmeans_npy_fortran_order() {
    let t = Scratch::new();
    let p = t.write("fortran.npy", &npy("<f4", true, "(10, 3)", &f32s(30)));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "Fortran");
}

#[test]
fn kmeans_input_is_a_directory() {
    let t = Scratch::new();
    let p = t.join("dir.npy");
    fs::create_dir(&p).unwrap();
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "dir.npy: is a directory");
    // Without an extension, it was "not a .npy, .npz or .fvecs file; for
    // raw float32 data give --dims".
    let p = t.join("data");
    fs::create_dir(&p).unwrap();
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "data: is a directory");
    assert!(!e.contains("--dims"), "{e}");
}

#[test]
fn kmeans_npy_garbage_header_is_one_line() {
    // The header parser's message took six lines.
    let t = Scratch::new();
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let text = "{'descr': <f4, shape: ((10, 3), }                       \n";
    bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend_from_slice(&f32s(30));
    let p = t.write("garbage.npy", &bytes);
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "garbage.npy: malformed .npy header");
}

/// An `.npz` archive holding `x.npy`, `member`, stored as is (`deflate`
/// false) or compressed.
fn npz(member: &[u8], deflate: bool) -> Vec<u8> {
    use std::io::Write;
    let mut buf = std::io::Cursor::new(Vec::new());
    let mut z = zip::ZipWriter::new(&mut buf);
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    z.start_file("x.npy", opts).unwrap();
    z.write_all(member).unwrap();
    z.finish().unwrap();
    buf.into_inner()
}

#[test]
fn kmeans_npz_member_with_a_bad_crc_is_refused() {
    // A flipped byte in a stored member: numpy says "Bad CRC-32"; the run
    // exited 0 with a centroid of 5.4e34. The member is read by position
    // in blocks (7 partitions here, and the initialisation's reads), whose
    // CRC-32s are combined; the small one is a single block.
    let t = Scratch::new();
    for (rows, extra) in [(10, &[][..]), (20000, &["--partitions", "7"][..])] {
        let npy = npy("<f4", false, &format!("({rows}, 3)"), &f32s(rows * 3));
        let good = npz(&npy, false);
        let at = good
            .windows(npy.len())
            .position(|w| w == &npy[..])
            .expect("the member is stored as is");
        let p = t.write("good.npz", &good);
        let mut args = vec!["kmeans".to_string()];
        args.extend(input_args(&p, extra));
        let out = outcore(t.path(), &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        fs::remove_file(&p).unwrap();
        let mut bad = good.clone();
        // The exponent byte of a value in the middle of the data.
        let mid = at + 128 + (npy.len() - 128) / 8 * 4 + 3;
        bad[mid] ^= 0x40;
        let p = t.write("flipped.npz", &bad);
        let e = t.kmeans_fails_mid_run(&input_args(&p, extra));
        assert_mentions(&e, "flipped.npz[x]: bad CRC-32");
        fs::remove_file(&p).unwrap();
    }

    // A compressed member read in order (its CRC-32 changed in the
    // archive's directory and local header).
    let npy = ok_npy();
    let good = npz(&npy, true);
    let crc = {
        let mut c = flate2::Crc::new();
        c.update(&npy);
        c.sum().to_le_bytes()
    };
    let mut bad = good.clone();
    let mut hits = 0;
    for i in 0..bad.len() - 4 {
        if bad[i..i + 4] == crc {
            bad[i] ^= 1;
            hits += 1;
        }
    }
    assert_eq!(
        hits, 2,
        "the CRC-32 is in the local header and the directory"
    );
    let p = t.write("deflated.npz", &bad);
    let e = t.kmeans_fails_mid_run(&input_args(&p, &[]));
    assert_mentions(&e, "deflated.npz[x]: bad CRC-32");
}

// ---------------------------------------------------------------------------
// `outcore kmeans`: --init and --k
// ---------------------------------------------------------------------------

#[test]
fn kmeans_init_dimension_mismatch() {
    let t = Scratch::new();
    let data = t.write("ok.npy", &ok_npy());
    let init = t.write("init.npy", &npy("<f4", false, "(4, 5)", &f32s(20)));
    let mut args = vec!["--input".to_string(), s(&data)];
    args.extend(strs(&["--epochs", "1", "--mem-cap", "none", "--init"]));
    args.push(s(&init));
    let e = t.kmeans_fails(&args);
    assert_mentions(&e, "5 dimensions");
    assert_mentions(&e, "has 3");
}

#[test]
fn kmeans_init_rows_differ_from_k() {
    let t = Scratch::new();
    let data = t.write("ok.npy", &ok_npy());
    let init = t.write("init.npy", &npy("<f4", false, "(4, 3)", &f32s(12)));
    let mut args = vec!["--input".to_string(), s(&data)];
    args.extend(strs(&[
        "--k",
        "3",
        "--epochs",
        "1",
        "--mem-cap",
        "none",
        "--init",
    ]));
    args.push(s(&init));
    let e = t.kmeans_fails(&args);
    assert_mentions(&e, "4 centres");
    assert_mentions(&e, "--k is 3");
}

#[test]
fn kmeans_init_file_bad() {
    let t = Scratch::new();
    let data = t.write("ok.npy", &ok_npy());
    // Missing.
    let missing = t.join("missing-init.npy");
    let mut args = vec!["--input".to_string(), s(&data)];
    args.extend(strs(&["--epochs", "1", "--mem-cap", "none", "--init"]));
    args.push(s(&missing));
    let e = t.kmeans_fails(&args);
    assert_mentions(&e, "missing-init.npy");
    // Truncated.
    let init = t.write("init.npy", &npy("<f4", false, "(2, 3)", &f32s(3)));
    let mut args = vec!["--input".to_string(), s(&data)];
    args.extend(strs(&["--epochs", "1", "--mem-cap", "none", "--init"]));
    args.push(s(&init));
    let e = t.kmeans_fails(&args);
    assert_mentions(&e, "truncated");
}

#[test]
fn kmeans_k_zero() {
    let t = Scratch::new();
    let mut args = strs(SYNTH);
    let k = args.iter().position(|a| a == "--k").unwrap();
    args[k + 1] = "0".into();
    let e = t.kmeans_fails(&args);
    assert_mentions(&e, "--k");

    let data = t.write("ok.npy", &ok_npy());
    let mut args = input_args(&data, &[]);
    let k = args.iter().position(|a| a == "--k").unwrap();
    args[k + 1] = "0".into();
    let e = t.kmeans_fails(&args);
    assert_mentions(&e, "--k");
}

#[test]
fn kmeans_k_larger_than_points() {
    let t = Scratch::new();
    let data = t.write("ok.npy", &ok_npy());
    let mut args = input_args(&data, &[]);
    let k = args.iter().position(|a| a == "--k").unwrap();
    args[k + 1] = "11".into();
    let e = t.kmeans_fails(&args);
    assert_mentions(&e, "11");
    assert_mentions(&e, "(10)");
}

// ---------------------------------------------------------------------------
// `outcore kmeans`: nonsense sizes and negative numbers
// ---------------------------------------------------------------------------

/// The synthetic arguments with `flag`'s value replaced by `value` (given
/// as two arguments, or as `--flag=value` when `equals`).
fn synth_with(flag: &str, value: &str, equals: bool) -> Vec<String> {
    let mut args = strs(SYNTH);
    let i = args.iter().position(|a| a == flag).unwrap();
    if equals {
        args[i] = format!("{flag}={value}");
        args.remove(i + 1);
    } else {
        args[i + 1] = value.to_string();
    }
    args
}

#[test]
fn kmeans_mem_cap_bad_unit() {
    let t = Scratch::new();
    let e = t.kmeans_fails(&synth_with("--mem-cap", "12XB", false));
    assert_mentions(&e, "12XB");
}

#[test]
fn kmeans_mem_cap_negative() {
    let t = Scratch::new();
    t.kmeans_fails(&synth_with("--mem-cap", "-5M", false));
    let e = t.kmeans_fails(&synth_with("--mem-cap", "-5M", true));
    assert_mentions(&e, "-5M");
}

#[test]
fn kmeans_mem_cap_zero() {
    let t = Scratch::new();
    t.kmeans_fails(&synth_with("--mem-cap", "0", false));
}

#[test]
fn kmeans_synthetic_not_a_size() {
    let t = Scratch::new();
    let e = t.kmeans_fails(&synth_with("--synthetic", "abc", false));
    assert_mentions(&e, "abc");
}

#[test]
fn kmeans_synthetic_zero() {
    let t = Scratch::new();
    let e = t.kmeans_fails(&synth_with("--synthetic", "0", false));
    assert_mentions(&e, "--synthetic");
}

#[test]
fn kmeans_k_negative() {
    let t = Scratch::new();
    t.kmeans_fails(&synth_with("--k", "-3", false));
    let e = t.kmeans_fails(&synth_with("--k", "-3", true));
    assert_mentions(&e, "-3");
}

#[test]
fn kmeans_epochs_negative() {
    let t = Scratch::new();
    t.kmeans_fails(&synth_with("--epochs", "-1", false));
    let e = t.kmeans_fails(&synth_with("--epochs", "-1", true));
    assert_mentions(&e, "-1");
}

#[test]
fn kmeans_dims_zero_and_negative() {
    let t = Scratch::new();
    let e = t.kmeans_fails(&synth_with("--dims", "0", false));
    assert_mentions(&e, "--dims");
    t.kmeans_fails(&synth_with("--dims", "-8", true));
}
