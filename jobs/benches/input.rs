//! How fast K-means reads its input: the block reader (what a partition
//! does when it is built or rebuilt) against `dd iflag=direct bs=1M` on the
//! same file, in the same run, with the file dropped from the page cache
//! before every read (`posix_fadvise(DONTNEED)`).
//!
//! ```text
//! cargo bench -p outcore-jobs --bench input                # 2 GiB generated
//! OUTCORE_BENCH_INPUT=/path/data.npy cargo bench -p outcore-jobs --bench input
//! ```
//!
//! Target (issue 15): the reader at no less than 80% of dd's rate.

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use outcore_jobs::{BlockReader, Source};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

fn drop_cache(path: &Path) {
    let f = std::fs::File::open(path).expect("open");
    // SAFETY: a valid descriptor; the call only gives the kernel advice.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

fn dd(path: &Path) -> f64 {
    drop_cache(path);
    let t = Instant::now();
    let ok = Command::new("dd")
        .arg(format!("if={}", path.display()))
        .args(["of=/dev/null", "iflag=direct", "bs=1M"])
        .output()
        .expect("dd")
        .status
        .success();
    assert!(ok, "dd failed");
    t.elapsed().as_secs_f64()
}

/// Reads the whole file in blocks of `block_rows` rows, one block at a
/// time; returns the seconds taken.
fn blocks(path: &Path, block_rows: u64) -> f64 {
    drop_cache(path);
    let t = Instant::now();
    let r = BlockReader::open(&Source::Npy(path.to_path_buf())).expect("reader");
    let mut first = 0;
    while first < r.rows() {
        let n = block_rows.min(r.rows() - first);
        std::hint::black_box(r.read(first, n as usize).expect("read"));
        first += n;
    }
    t.elapsed().as_secs_f64()
}

fn main() {
    let path = match std::env::var_os("OUTCORE_BENCH_INPUT") {
        Some(p) => PathBuf::from(p),
        None => {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
            let p = dir.join("bench-input-2GiB.npy");
            if !p.exists() {
                eprintln!("writing {} ...", p.display());
                Source::synthetic(2 << 30, 1000, 100, 42)
                    .write_npy(&p, |_, _| {})
                    .expect("write the data");
            }
            p
        }
    };
    let bytes = std::fs::metadata(&path).expect("input").len() as f64;
    let dims = Source::Npy(path.clone()).shape().expect("shape").1 as u64;
    println!(
        "input {} ({:.2} GiB)",
        path.display(),
        bytes / f64::from(1u32 << 30)
    );
    println!("{:<28} {:>10} {:>10}", "", "GB/s", "of dd");
    for round in 1..=3 {
        let d = bytes / dd(&path) / 1e9;
        println!("round {round}: dd iflag=direct bs=1M {d:>10.2}");
        for mib in [12.6f64, 63.0] {
            let rows = ((mib * f64::from(1u32 << 20)) as u64 / (4 * dims)).max(1);
            let g = bytes / blocks(&path, rows) / 1e9;
            println!(
                "round {round}: blocks of {mib:>4} MiB     {g:>10.2} {:>9.0}%",
                100.0 * g / d
            );
        }
    }
}
