//! Bad input to `outcore kmeans`: files that cannot be read or written,
//! and raw and .fvecs input.

use super::*;

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
