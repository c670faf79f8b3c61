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

// ---------------------------------------------------------------------------
// `outcore kmeans`: input files that cannot be read
// ---------------------------------------------------------------------------

#[test]
fn kmeans_missing_input() {
    let t = Scratch::new();
    for name in ["missing.npy", "missing.fvecs"] {
        let e = t.kmeans_fails(&input_args(&t.join(name), &[]));
        assert_mentions(&e, name);
    }
    let e = t.kmeans_fails(&input_args(&t.join("missing.bin"), &["--dims", "3"]));
    assert_mentions(&e, "missing.bin");
}

#[test]
fn kmeans_unreadable_input() {
    let t = Scratch::new();
    let p = t.write("locked.npy", &ok_npy());
    fs::set_permissions(&p, fs::Permissions::from_mode(0o000)).unwrap();
    // Tests often run as root, and root reads a mode-000 file anyway
    // (CAP_DAC_OVERRIDE). Detect that at run time by trying to open it: if
    // this process can, outcore can too and the input is not bad, so the
    // bad-input assertions are skipped (only for this case).
    if fs::File::open(&p).is_ok() {
        eprintln!("kmeans_unreadable_input: mode 000 does not stop this user reading; skipped");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        return;
    }
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "locked.npy");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
}

// ---------------------------------------------------------------------------
// `outcore kmeans`: outputs that cannot be written
// ---------------------------------------------------------------------------

#[test]
fn kmeans_output_in_a_missing_directory() {
    let t = Scratch::new();
    let mut args = vec!["kmeans".to_string()];
    args.extend(strs(SYNTH));
    args.extend(strs(&["--output", "/nonexistent-dir/c.npy"]));
    let e = t.fails(&args, &[PathBuf::from("/nonexistent-dir/c.npy")]);
    assert_mentions(&e, "/nonexistent-dir/c.npy");
    // The output's name, not the temporary file's.
    assert!(
        !e.contains("outcore-partial") && !e.contains("at path"),
        "{e}"
    );

    // The same for --labels and --stats, with the other outputs writable.
    for flag in ["--labels", "--stats"] {
        let mut args = vec!["kmeans".to_string()];
        args.extend(strs(SYNTH));
        args.extend(strs(&["--output"]));
        args.push(s(&t.output()));
        args.extend(strs(&[flag, "/nonexistent-dir/x"]));
        let e = t.fails(&args, &[t.output(), PathBuf::from("/nonexistent-dir/x")]);
        assert_mentions(&e, "/nonexistent-dir/x");
    }
    assert!(!Path::new("/nonexistent-dir").exists());
}

#[test]
fn kmeans_output_is_a_directory() {
    let t = Scratch::new();
    let d = t.join("outdir");
    fs::create_dir(&d).unwrap();
    for flag in ["--output", "--labels", "--stats"] {
        let mut args = vec!["kmeans".to_string()];
        args.extend(strs(SYNTH));
        args.push(flag.into());
        args.push(s(&d));
        let e = t.fails(&args, &[]);
        assert_mentions(&e, "directory");
        assert!(d.is_dir(), "the directory is still there");
        assert!(
            fs::read_dir(&d).unwrap().next().is_none(),
            "nothing written inside {}",
            d.display()
        );
    }
}

// ---------------------------------------------------------------------------
// `outcore kmeans`: raw and .fvecs input
// ---------------------------------------------------------------------------

#[test]
fn kmeans_raw_without_dims() {
    let t = Scratch::new();
    let p = t.write("data.bin", &f32s(30));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "--dims");
}

#[test]
fn kmeans_raw_size_not_a_multiple_of_a_row() {
    let t = Scratch::new();
    // 10 rows of 3 floats and 2 stray bytes.
    let mut bytes = f32s(30);
    bytes.extend_from_slice(&[1, 2]);
    let p = t.write("data.bin", &bytes);
    let e = t.kmeans_fails(&input_args(&p, &["--dims", "3"]));
    assert_mentions(&e, "not a whole number");

    // 30 floats do not make rows of 4.
    let p = t.write("data2.bin", &f32s(30));
    let e = t.kmeans_fails(&input_args(&p, &["--dims", "4"]));
    assert_mentions(&e, "not a whole number");

    // An empty raw file has no rows.
    let p = t.write("empty.bin", b"");
    t.kmeans_fails(&input_args(&p, &["--dims", "3"]));
}

/// One `.fvecs` record: its dimension, then the values.
fn fvecs_record(dim: i32, values: &[f32]) -> Vec<u8> {
    let mut r = dim.to_le_bytes().to_vec();
    for v in values {
        r.extend_from_slice(&v.to_le_bytes());
    }
    r
}

#[test]
fn kmeans_fvecs_bad_second_record() {
    let t = Scratch::new();
    // Three records of the same length, so the file size is consistent; the
    // second claims 4 dimensions instead of 3.
    let mut bytes = fvecs_record(3, &[1.0, 2.0, 3.0]);
    bytes.extend(fvecs_record(4, &[4.0, 5.0, 6.0]));
    bytes.extend(fvecs_record(3, &[7.0, 8.0, 9.0]));
    let p = t.write("bad.fvecs", &bytes);
    let e = t.kmeans_fails_mid_run(&input_args(&p, &[]));
    assert_mentions(&e, "record 1");
    assert!(!e.contains("lineage") && !e.contains("executor"), "{e}");
}

#[test]
fn kmeans_fvecs_bad_first_record() {
    let t = Scratch::new();
    let p = t.write("zero.fvecs", &fvecs_record(0, &[]));
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "dimension");

    let mut bytes = fvecs_record(3, &[1.0, 2.0, 3.0]);
    bytes.extend_from_slice(&[0, 0, 0]);
    let p = t.write("ragged.fvecs", &bytes);
    let e = t.kmeans_fails(&input_args(&p, &[]));
    assert_mentions(&e, "not a whole number");
}

// ---------------------------------------------------------------------------
// `outcore gen`
// ---------------------------------------------------------------------------

fn gen_args(synthetic: &str, dims: &str, output: &Path) -> Vec<String> {
    let mut a = strs(&["gen", "--synthetic", synthetic, "--dims", dims, "--output"]);
    a.push(s(output));
    a
}

#[test]
fn gen_synthetic_bad_unit() {
    let t = Scratch::new();
    let g = t.join("g.npy");
    let e = t.fails(&gen_args("12XB", "8", &g), std::slice::from_ref(&g));
    assert_mentions(&e, "12XB");
}

#[test]
fn gen_dims_zero() {
    let t = Scratch::new();
    let g = t.join("g.npy");
    let e = t.fails(&gen_args("64KiB", "0", &g), std::slice::from_ref(&g));
    assert_mentions(&e, "--dims");
}

#[test]
fn gen_synthetic_smaller_than_a_point() {
    let t = Scratch::new();
    let g = t.join("g.npy");
    t.fails(&gen_args("0", "8", &g), std::slice::from_ref(&g));
    t.fails(&gen_args("31", "8", &g), std::slice::from_ref(&g));
}

#[test]
fn gen_unwritable_output() {
    let t = Scratch::new();
    let g = PathBuf::from("/nonexistent-dir/g.npy");
    let e = t.fails(&gen_args("64KiB", "8", &g), std::slice::from_ref(&g));
    assert_mentions(&e, "/nonexistent-dir/g.npy");

    let d = t.join("outdir");
    fs::create_dir(&d).unwrap();
    let e = t.fails(&gen_args("64KiB", "8", &d), &[]);
    assert_mentions(&e, "directory");
    assert!(fs::read_dir(&d).unwrap().next().is_none());
}

#[test]
fn gen_larger_than_the_free_space_is_refused_at_once() {
    // `gen --synthetic 99999TB` wrote until the disk was full. The child
    // may write 64 MiB at most (`ulimit -f`), in case it is not refused.
    use std::os::unix::process::CommandExt;
    let t = Scratch::new();
    let out_path = t.join("huge.npy");
    let args = gen_args("99999TB", "8", &out_path);
    let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
    c.args(&args).current_dir(t.path());
    // SAFETY: setrlimit and signal are async-signal-safe and touch only
    // the child.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64 << 20,
                rlim_max: 64 << 20,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = c.output().unwrap();
    let e = check_bad_input(&args, &out);
    assert_mentions(&e, "huge.npy: ");
    assert!(
        e.contains("to write, but its filesystem has") && e.contains(" free"),
        "{e}"
    );
    assert_eq!(listing(t.path()), BTreeSet::new(), "{e}");
}

#[test]
fn an_address_space_limit_too_small_for_the_program_is_one_line() {
    // Under about 55 MB of `ulimit -v` the run aborted after an
    // `outcore: out of memory` line.
    use std::os::unix::process::CommandExt;
    let t = Scratch::new();
    for (limit_mib, args) in [
        (
            40u64,
            strs(&["kmeans", "--synthetic", "8MiB", "--dims", "8", "--k", "4"]),
        ),
        (
            52,
            strs(&[
                "kmeans",
                "--synthetic",
                "8MiB",
                "--dims",
                "8",
                "--k",
                "4",
                "--workers",
                "1",
            ]),
        ),
        (40, gen_args("8MiB", "8", &t.join("g.npy"))),
        // gen holds no runtime to evict from: at 74-80 MiB it aborted
        // with the standard library's line alone.
        (80, gen_args("128MiB", "32", &t.join("g.npy"))),
    ] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_outcore"));
        c.args(&args).current_dir(t.path());
        // SAFETY: setrlimit is async-signal-safe and touches only the
        // child.
        unsafe {
            c.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit_mib << 20,
                    rlim_max: libc::RLIM_INFINITY,
                };
                libc::setrlimit(libc::RLIMIT_AS, &lim);
                Ok(())
            });
        }
        let out = c.output().unwrap();
        let e = check_bad_input(&args, &out);
        assert_mentions(&e, &format!("(ulimit -v {})", limit_mib << 10));
        assert_mentions(&e, "too small for outcore itself");
        assert_mentions(&e, "it needs at least");
        if args[0] == "gen" {
            assert!(!e.contains("--workers"), "gen has no --workers: {e}");
        }
        assert_eq!(listing(t.path()), BTreeSet::new(), "{e}");
    }
}

#[test]
fn gen_missing_required_flags() {
    let t = Scratch::new();
    t.fails(&strs(&["gen", "--dims", "8", "--output", "g.npy"]), &[]);
    t.fails(&strs(&["gen", "--synthetic", "64KiB"]), &[]);
    t.fails(&strs(&["frobnicate"]), &[]);
}

/// Argument errors keep clap's detail, in at most three lines: what is
/// missing, the suggestion for a typo, the allowed values.
#[test]
fn argument_errors_keep_the_detail() {
    let t = Scratch::new();
    let e = t.fails(&strs(&["gen", "--dims", "8"]), &[]);
    assert_mentions(
        &e,
        "required arguments were not provided: --synthetic <SIZE>, --output <FILE>",
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    let e = t.fails(&strs(&["kmeans", "--iteration", "3"]), &[]);
    assert_mentions(&e, "unexpected argument '--iteration'");
    assert_mentions(&e, "\n  tip: a similar argument exists: '--iterations'");
    let e = t.fails(&strs(&["kmeans", "--algorithm", "foo"]), &[]);
    assert_mentions(&e, "\n  [possible values: minibatch, lloyd]");
    let e = t.fails(&strs(&["kmeans", "--k", "abc"]), &[]);
    assert_mentions(&e, "invalid value 'abc' for '--k <K>': invalid digit");
    assert!(
        !e.contains("Usage:") && !e.contains("For more information"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------
// `outcore kmeans`: other flags out of range
// ---------------------------------------------------------------------------

#[test]
fn kmeans_other_flags_out_of_range() {
    let t = Scratch::new();
    for extra in [
        &["--workers", "0"][..],
        &["--workers", "100000"],
        &["--partitions", "0"],
        &["--task-points", "0"],
        &["--batch-tasks", "0"],
        &["--true-k", "0"],
        &["--algorithm", "foo"],
        &["--policy", "foo"],
        &["--no-such-flag"],
    ] {
        let mut args = strs(SYNTH);
        args.extend(strs(extra));
        let e = t.kmeans_fails(&args);
        assert_mentions(&e, extra[0]);
    }
    // --spill-dir in a missing directory (the scratch outputs without the
    // scratch --spill-dir: a flag may be given only once).
    let mut args = vec!["kmeans".to_string()];
    args.extend(strs(SYNTH));
    let outs = t.kmeans_outputs();
    args.extend_from_slice(&outs[..6]);
    args.extend(strs(&["--spill-dir", "/nonexistent-dir/spill"]));
    let e = t.fails(&args, &[t.output(), t.labels(), t.stats()]);
    assert_mentions(&e, "/nonexistent-dir/spill");
}

/// Under `ulimit -v`, a cap that does not fit (or no cap) is warned about
/// with the start lines: only the allocation trap would evict, and the
/// data may be read many times over. A cap that fits, or no limit, gets no
/// such line.
#[test]
fn a_cap_over_the_address_space_limit_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.npy");
    let run = |limit: Option<&str>, cap: &str| {
        let limit = limit.map_or(String::new(), |l| format!("ulimit -v {l}; "));
        let o = std::process::Command::new("sh")
            .args(["-c", &format!("{limit}exec \"$@\""), "sh"])
            .arg(env!("CARGO_BIN_EXE_outcore"))
            .args(["kmeans", "--synthetic", "16MiB", "--dims", "16", "--k", "4"])
            .args(["--epochs", "1", "--mem-cap", cap, "--output"])
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{cap}: {err}");
        err
    };
    const WARNING: &str = "under an address-space limit of";
    for cap in ["4GiB", "none"] {
        let err = run(Some("1500000"), cap);
        assert!(err.contains(WARNING), "{cap}: {err}");
        assert!(err.contains("--mem-cap auto"), "{cap}: {err}");
    }
    for (limit, cap) in [
        (Some("1500000"), "64MiB"),
        (Some("1500000"), "auto"),
        (None, "4GiB"),
    ] {
        let err = run(limit, cap);
        assert!(!err.contains(WARNING), "{limit:?} {cap}: {err}");
    }
}

/// `ulimit -d` (`RLIMIT_DATA`), which counts the heap, the allocator's
/// mappings and thread stacks: below what outcore needs for itself, one
/// line at start (it used to die of the standard library's "memory
/// allocation of 1 bytes failed" at 28 MiB, and of an out-of-memory abort
/// at 58-78 MiB); above, the run evicts at the limit, says that its cap
/// does not fit under it, and gives the same bytes as without a limit.
#[test]
fn a_data_size_limit_is_checked_at_start_and_held() {
    let dir = tempfile::tempdir().unwrap();
    let args = "kmeans --synthetic 96MiB --dims 32 --k 8 --epochs 1 --seed 3";
    let run =
        |limit: &str, out: &str| under_ulimit(&format!("-d {limit}"), args, &dir.path().join(out));
    for limit in ["29000", "60000"] {
        let o = run(limit, "small.npy");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{limit}: {err}");
        assert_eq!(err.lines().count(), 1, "{limit}: {err}");
        assert!(
            err.starts_with(&format!(
                "outcore: error: the data size limit (ulimit -d {limit})"
            )),
            "{err}"
        );
        assert!(!dir.path().join("small.npy").exists());
    }
    let o = run("unlimited", "free.npy");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run("90000", "limited.npy");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("under a data size limit of"), "{err}");
    let free = std::fs::read(dir.path().join("free.npy")).unwrap();
    let limited = std::fs::read(dir.path().join("limited.npy")).unwrap();
    assert!(free == limited, "the centroids differ under ulimit -d");
}

/// Under `ulimit -s 64` (KiB) the argument parser alone overflowed the
/// main thread's stack (SIGABRT, "has overflowed its stack"); the program
/// now runs on a thread with a stack of its own, and the run gives the
/// same bytes as under the default limit.
#[test]
fn a_small_stack_limit_runs() {
    let dir = tempfile::tempdir().unwrap();
    let args = "kmeans --synthetic 16MiB --dims 16 --k 4 --epochs 1 --seed 5 --mem-cap 8MiB";
    let run =
        |limit: &str, out: &str| under_ulimit(&format!("-s {limit}"), args, &dir.path().join(out));
    let small = run("64", "small.npy");
    let err = String::from_utf8_lossy(&small.stderr);
    assert!(small.status.success(), "{err}");
    let default = run("8192", "default.npy");
    assert!(default.status.success());
    let a = std::fs::read(dir.path().join("small.npy")).unwrap();
    let b = std::fs::read(dir.path().join("default.npy")).unwrap();
    assert!(a == b, "the centroids differ under ulimit -s 64");
}

/// Runs outcore with `args` (split at spaces) and `--output out`, under
/// `ulimit` with `limit` (such as "-d 60000"), set in the child only.
fn under_ulimit(limit: &str, args: &str, out: &Path) -> std::process::Output {
    std::process::Command::new("sh")
        .args(["-c", &format!("ulimit {limit}; exec \"$@\""), "sh"])
        .arg(env!("CARGO_BIN_EXE_outcore"))
        .args(args.split(' '))
        .arg("--output")
        .arg(out)
        .output()
        .unwrap()
}
