//! Input formats numpy writes: float16 and big-endian `.npy`, `.npz`
//! archives (stored and compressed, `--key`), read to the same values as
//! numpy's own conversion and giving the same results as the float32 file
//! (the files come from numpy; skipped without it unless
//! `OUTCORE_REQUIRE_SKLEARN=1`).

mod bin_common;

use std::path::{Path, PathBuf};

use bin_common::{have_python, python};
use outcore_jobs::npy::read_matrix;
use outcore_jobs::{BlockReader, Source};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const MAKE: &str = r#"
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(5)
# Blobs: 20000 rows, 12 columns, 6 centres.
c = rng.uniform(-20, 20, (6, 12))
X = (c[rng.integers(0, 6, 20000)] + rng.normal(0, 1.5, (20000, 12))).astype(np.float32)
np.save(d + '/x.npy', X)
np.save(d + '/be4.npy', X.astype('>f4'))
np.save(d + '/be8.npy', X.astype('>f8'))
np.save(d + '/le8.npy', X.astype('<f8'))
h = X.astype(np.float16)
np.save(d + '/f16.npy', h)
np.save(d + '/f16be.npy', h.astype('>f2'))
np.save(d + '/f16as32.npy', h.astype(np.float32))
np.savez(d + '/stored.npz', meta=np.arange(3), data=X)
np.savez_compressed(d + '/packed.npz', data=X, meta=np.arange(3))
np.savez(d + '/first.npz', X, np.arange(3))
# Every finite float16, as numpy converts them.
allh = np.arange(65536, dtype=np.uint16).view(np.float16)
allh = allh[np.isfinite(allh)][:63488].reshape(-1, 16)
np.save(d + '/allh.npy', allh)
np.save(d + '/allh32.npy', allh.astype(np.float32))
"#;

fn files() -> Option<tempfile::TempDir> {
    if !have_python("numpy") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    python(MAKE, &[s(dir.path())]);
    Some(dir)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn float16_and_big_endian_read_as_numpy_converts_them() {
    let Some(dir) = files() else { return };
    let p = |n: &str| dir.path().join(n);
    // Sequential reads (read_matrix) and block reads (the lineage of
    // evicted partitions) both.
    let block = |path: PathBuf| {
        let r = BlockReader::open(&Source::from_path(&path, None).unwrap()).unwrap();
        r.read(0, r.rows() as usize).unwrap()
    };
    let (want, _, _) = read_matrix(&p("allh32.npy")).unwrap();
    let (got, rows, cols) = read_matrix(&p("allh.npy")).unwrap();
    assert_eq!((rows, cols), (63488 / 16, 16));
    assert_eq!(bits(&got), bits(&want), "every finite float16");
    assert_eq!(bits(&block(p("allh.npy"))), bits(&want));

    let (x, _, _) = read_matrix(&p("x.npy")).unwrap();
    for name in ["be4.npy", "be8.npy", "le8.npy"] {
        assert_eq!(bits(&read_matrix(&p(name)).unwrap().0), bits(&x), "{name}");
        assert_eq!(bits(&block(p(name))), bits(&x), "{name} by block");
    }
    let (h, _, _) = read_matrix(&p("f16as32.npy")).unwrap();
    for name in ["f16.npy", "f16be.npy"] {
        assert_eq!(bits(&read_matrix(&p(name)).unwrap().0), bits(&h), "{name}");
        assert_eq!(bits(&block(p(name))), bits(&h), "{name} by block");
    }
}

/// Runs `outcore kmeans` on `input` (extra flags after it) under a cap
/// that evicts; the centroids' bytes and the stats.
fn kmeans(dir: &Path, tag: &str, input: &Path, extra: &[&str]) -> (Vec<u8>, serde_json::Value) {
    let out = dir.join(format!("{tag}-c.npy"));
    let stats = dir.join(format!("{tag}.json"));
    let mut args = vec![
        "kmeans",
        "--input",
        s(input),
        "--k",
        "6",
        "--epochs",
        "2",
        "--batch-tasks",
        "4",
        "--task-points",
        "500",
        "--partitions",
        "8",
        "--mem-cap",
        "1100KiB",
        "--output",
        s(&out),
        "--stats",
        s(&stats),
    ];
    args.extend_from_slice(extra);
    let (code, err) = bin_common::outcore_cli(&args);
    assert_eq!(code, Some(0), "{tag}: {err}");
    let st = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    (std::fs::read(&out).unwrap(), st)
}

#[test]
fn every_format_gives_the_float32_result() {
    let Some(dir) = files() else { return };
    let d = dir.path();
    let (want, st) = kmeans(d, "x", &d.join("x.npy"), &[]);
    assert!(st["evictions"].as_u64().unwrap() > 0, "no eviction: {st}");
    assert_eq!(st["bytes_written"], 0, "a .npy is read again, not spilled");
    for (tag, file, extra) in [
        ("be4", "be4.npy", vec![]),
        ("be8", "be8.npy", vec![]),
        ("stored", "stored.npz", vec!["--key", "data"]),
        ("stored-suffix", "stored.npz", vec!["--key", "data.npy"]),
        ("packed", "packed.npz", vec!["--key", "data"]),
        ("packed-default", "packed.npz", vec![]),
        ("first", "first.npz", vec![]),
    ] {
        let (got, st) = kmeans(d, tag, &d.join(file), &extra);
        assert!(
            got == want,
            "{tag}: centroids differ from the float32 file's"
        );
        let written = st["bytes_written"].as_u64().unwrap();
        if tag.starts_with("packed") {
            // A compressed member cannot be read at a position: evicted
            // partitions are spilled.
            assert!(written > 0, "{tag}: {st}");
        } else {
            assert_eq!(written, 0, "{tag}: spilled although it can be read again");
        }
    }
    // Under another name, a .npy or .npz is still read as one (its first
    // bytes say so), not as raw floats.
    std::fs::copy(d.join("x.npy"), d.join("x.dat")).unwrap();
    std::fs::copy(d.join("stored.npz"), d.join("stored.bin")).unwrap();
    for (tag, file, extra) in [
        ("renamed-npy", "x.dat", vec![]),
        ("renamed-npy-dims", "x.dat", vec!["--dims", "12"]),
        ("renamed-npz", "stored.bin", vec!["--key", "data"]),
    ] {
        let (got, _) = kmeans(d, tag, &d.join(file), &extra);
        assert!(got == want, "{tag}: centroids differ from the .npy's");
    }
    // float16 data: the result of the same data converted by numpy.
    let (want16, _) = kmeans(d, "f16as32", &d.join("f16as32.npy"), &[]);
    let (got16, _) = kmeans(d, "f16", &d.join("f16.npy"), &[]);
    assert!(got16 == want16, "float16 centroids differ");
}

#[test]
fn npz_errors_name_the_archive_and_its_arrays() {
    let Some(dir) = files() else { return };
    let d = dir.path();
    let out = d.join("c.npy");
    let run = |extra: &[&str]| {
        let mut args = vec!["kmeans", "--k", "3", "--mem-cap", "none"];
        args.extend_from_slice(extra);
        args.extend(["--output", s(&out)]);
        bin_common::outcore_cli(&args)
    };
    let stored = d.join("stored.npz");
    let (code, err) = run(&["--input", s(&stored), "--key", "nope"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("stored.npz") && err.contains("'nope'"),
        "{err}"
    );
    assert!(err.contains("meta, data"), "{err}");
    // The default is the first array, here a 1-D one.
    let (code, err) = run(&["--input", s(&stored)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("stored.npz[meta]") && err.contains("<i8"),
        "{err}"
    );
    // Not an archive.
    let fake = d.join("fake.npz");
    std::fs::write(&fake, b"not a zip file").unwrap();
    let (code, err) = run(&["--input", s(&fake)]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("fake.npz") && err.contains(".npz"), "{err}");
    assert!(!out.exists());
    // --key with a .npy is a warning, and the run goes on.
    let (code, err) = run(&["--input", s(&d.join("x.npy")), "--key", "data"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: --key"), "{err}");
}

#[test]
fn predict_and_train_read_npz_and_float16() {
    let Some(dir) = files() else { return };
    let d = dir.path();
    let c = d.join("c.npy");
    let (code, err) = bin_common::outcore_cli(&[
        "kmeans",
        "--input",
        s(&d.join("x.npy")),
        "--k",
        "6",
        "--mem-cap",
        "none",
        "--output",
        s(&c),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let mut outs = Vec::new();
    for (i, (file, key)) in [
        ("x.npy", None),
        ("stored.npz", Some("data")),
        ("packed.npz", Some("data")),
        ("be8.npy", None),
    ]
    .into_iter()
    .enumerate()
    {
        let l = d.join(format!("l{i}.npy"));
        let mut args = vec![
            "predict",
            "--centroids",
            s(&c),
            "--input",
            file,
            "--labels",
            s(&l),
        ];
        let input = d.join(file);
        args[4] = s(&input);
        if let Some(k) = key {
            args.extend(["--key", k]);
        }
        let (code, err) = bin_common::outcore_cli(&args);
        assert_eq!(code, Some(0), "{file}: {err}");
        outs.push(std::fs::read(&l).unwrap());
    }
    assert!(
        outs.iter().all(|o| o == &outs[0]),
        "labels differ by format"
    );

    // Training on float16 data with int64 big-endian labels.
    python(
        r#"
import sys, numpy as np
X = np.load(sys.argv[1] + '/f16.npy').astype(np.float32)
y = (X[:, 0] > X[:, 1]).astype('>i8')
np.save(sys.argv[1] + '/y.npy', y)
"#,
        &[s(d)],
    );
    let m = d.join("m.npy");
    let (code, err) = bin_common::outcore_cli(&[
        "train",
        "--input",
        s(&d.join("f16.npy")),
        "--targets",
        s(&d.join("y.npy")),
        "--max-iter",
        "30",
        "--mem-cap",
        "none",
        "--output",
        s(&m),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (w, classes, cols) = read_matrix(&m).unwrap();
    assert_eq!((classes, cols), (2, 13));
    assert!(w.iter().all(|v| v.is_finite()));
}
