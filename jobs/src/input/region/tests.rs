//! Regions read back exactly: blocks and scattered rows, direct or where
//! direct I/O is refused, from threads at once, float64 and fvecs rows
//! converted, and a file changed under the run an error.

use super::*;
use std::io::Write;

/// A file of `rows x dims` float32 values after a `header`-byte prefix,
/// in `dir`; value `(r, c)` is `r * dims + c`.
fn file(dir: &Path, header: usize, rows: usize, dims: usize) -> PathBuf {
    let p = dir.join("rows.bin");
    let mut f = File::create(&p).unwrap();
    f.write_all(&vec![0xAB; header]).unwrap();
    let mut bytes = Vec::with_capacity(rows * dims * 4);
    for i in 0..rows * dims {
        bytes.extend_from_slice(&(i as f32).to_le_bytes());
    }
    f.write_all(&bytes).unwrap();
    p
}

fn check_blocks(dir: &Path) {
    // 9 MiB of rows after a 128-byte header: blocks cross the 4 MiB
    // pieces and start at unaligned offsets.
    let (rows, dims) = (2304, 1024);
    let p = file(dir, 128, rows, dims);
    let r = Region::open(&p, 128, dims, Encoding::F32).unwrap().unwrap();
    for (first, n) in [(0, 1), (3, 2000), (1, rows - 1), (rows - 7, 7)] {
        let sum = OnceLock::new();
        let v = r.read(first as u64, n, &sum).unwrap();
        assert_eq!(v.len(), n * dims);
        for (k, &x) in v.iter().enumerate() {
            assert_eq!(x, (first * dims + k) as f32, "block {first}+{n}, value {k}");
        }
        // A second read matches the first's checksum.
        assert_eq!(r.read(first as u64, n, &sum).unwrap(), v);
    }
    let past = r.read(rows as u64 - 1, 2, &OnceLock::new());
    assert!(past.is_err(), "a read past the end must fail");
}

#[test]
fn blocks_read_back_exactly_on_a_disk_filesystem() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    check_blocks(dir.path());
}

#[test]
fn blocks_read_in_place_hold_their_rows_after_the_page_start() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let (rows, dims) = (2304, 1000);
    let p = file(dir.path(), 128, rows, dims);
    let r = Region::open(&p, 128, dims, Encoding::F32).unwrap().unwrap();
    let mut placed = 0;
    for (first, n) in [
        (0, 1),
        (3, 1100),
        (1, rows - 1),
        (rows - 7, 7),
        (1100, 1100),
    ] {
        let sum = OnceLock::new();
        // The first read copies; the ones in place must agree with its
        // checksum, and with each other.
        let copied = r.read(first as u64, n, &sum).unwrap();
        for _ in 0..2 {
            let (v, skip) = r.read_in_place(first as u64, n, &sum).unwrap();
            assert!(v[skip..] == copied[..], "block {first}+{n}");
            let pos = 128 + first * dims * 4;
            if skip > 0 || pos % ALIGN == 0 {
                assert_eq!(skip * 4, pos % ALIGN, "block {first}+{n}");
                placed += 1;
            }
        }
    }
    // The allocator aligns large blocks to a page, so the three blocks
    // of 256 KiB and more are read in place (where the filesystem takes
    // direct I/O).
    if r.direct.is_some() {
        assert!(placed >= 6, "{placed} reads in place");
    }
    let past = r.read_in_place(rows as u64 - 1, 2, &OnceLock::new());
    assert!(past.is_err(), "a read past the end must fail");
}

#[test]
fn threads_reading_at_once_each_get_their_own_rows() {
    // More threads than readers, each reading its own blocks again and
    // again: every block comes back exactly, with its checksum.
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let (rows, dims) = (2304, 1024);
    let p = file(dir.path(), 128, rows, dims);
    let r = Region::open(&p, 128, dims, Encoding::F32).unwrap().unwrap();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let r = &r;
            s.spawn(move || {
                for round in 0..6 {
                    let first = (t * 500 + round * 13) % (rows - 600);
                    let n = 300 + 50 * t;
                    let sum = OnceLock::new();
                    for _ in 0..2 {
                        let v = r.read(first as u64, n, &sum).unwrap();
                        assert_eq!(v.len(), n * dims);
                        for (k, &x) in v.iter().enumerate() {
                            assert_eq!(x, (first * dims + k) as f32, "thread {t}, value {k}");
                        }
                    }
                }
            });
        }
    });
}

/// Scattered rows, more than the reads one queue holds, some crossing
/// a page boundary, come back exactly and in the order asked.
fn check_rows(dir: &Path) {
    let (rows, dims) = (3000, 1000);
    let p = file(dir, 128, rows, dims);
    let r = Region::open(&p, 128, dims, Encoding::F32).unwrap().unwrap();
    let want: Vec<u64> = (0..rows as u64)
        .filter(|i| i % 37 == 5 || *i == 1 || *i == rows as u64 - 1)
        .collect();
    let before = r.bytes_read();
    let v = r.read_rows(&want).unwrap();
    assert_eq!(v.len(), want.len() * dims);
    for (row, got) in want.iter().zip(v.chunks_exact(dims)) {
        for (c, &x) in got.iter().enumerate() {
            assert_eq!(
                x,
                (*row as usize * dims + c) as f32,
                "row {row}, column {c}"
            );
        }
    }
    // Whole pages: each row's 4000 bytes span one or two of them.
    let read = r.bytes_read() - before;
    assert_eq!(read, r.scattered_bytes(&want));
    let (least, most) = (want.len() * ALIGN, want.len() * 2 * ALIGN);
    assert!(
        read >= least as u64 && read <= most as u64,
        "{read} bytes read"
    );
    assert!(
        r.read_rows(&[rows as u64]).is_err(),
        "a row past the end must fail"
    );
    assert!(r.read_rows(&[]).unwrap().is_empty());
}

#[test]
fn scattered_rows_read_back_exactly_on_a_disk_filesystem() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    check_rows(dir.path());
}

#[test]
fn scattered_rows_read_back_exactly_where_direct_io_is_refused() {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let dir = tempfile::tempdir_in(shm).unwrap();
        check_rows(dir.path());
    }
}

#[test]
fn blocks_read_back_exactly_where_direct_io_is_refused() {
    // tmpfs refuses O_DIRECT: the plain path.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let dir = tempfile::tempdir_in(shm).unwrap();
        check_blocks(dir.path());
    }
}

#[test]
fn a_file_changed_under_the_run_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = file(dir.path(), 0, 64, 4);
    let r = Region::open(&p, 0, 4, Encoding::F32).unwrap().unwrap();
    let sum = OnceLock::new();
    r.read(8, 8, &sum).unwrap();

    // Rewritten in place with the same size and modification time: only
    // the checksum can tell.
    let meta = std::fs::metadata(&p).unwrap();
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&7f32.to_le_bytes(), 8 * 16 + 4).unwrap();
    f.set_modified(meta.modified().unwrap()).unwrap();
    drop(f);
    let e = r.read(8, 8, &sum).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("changed during the run"), "{e}");
    assert!(e.to_string().contains("rows 8..16"), "{e}");

    // Appended to: the size changed.
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    f.write_all(&[0; 16]).unwrap();
    drop(f);
    let e = r.read(0, 8, &OnceLock::new()).unwrap_err();
    assert!(e.to_string().contains("size or modification time"), "{e}");
}

#[test]
fn float64_and_fvecs_rows_convert() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.bin");
    let mut bytes = Vec::new();
    for i in 0..30 {
        bytes.extend_from_slice(&(i as f64 + 0.5).to_le_bytes());
    }
    std::fs::write(&p, &bytes).unwrap();
    let f64le = crate::npy::Stored {
        dtype: crate::npy::Dtype::F64,
        big: false,
    };
    let r = Region::open(&p, 0, 3, Encoding::Convert(f64le))
        .unwrap()
        .unwrap();
    let v = r.read(2, 3, &OnceLock::new()).unwrap();
    assert_eq!(v, (6..15).map(|i| i as f32 + 0.5).collect::<Vec<_>>());

    let p = dir.path().join("v.fvecs");
    let mut bytes = Vec::new();
    for row in 0..5 {
        bytes.extend_from_slice(&2i32.to_le_bytes());
        for c in 0..2 {
            bytes.extend_from_slice(&((row * 2 + c) as f32).to_le_bytes());
        }
    }
    std::fs::write(&p, &bytes).unwrap();
    let r = Region::open(&p, 0, 2, Encoding::Fvecs).unwrap().unwrap();
    assert_eq!(
        r.read(3, 2, &OnceLock::new()).unwrap(),
        [6.0, 7.0, 8.0, 9.0]
    );
}
