//! Spill throughput: evicting and loading a 256 MiB executor of f32 data
//! through the runtime, against writing and reading the same bytes with
//! plain file I/O, in one criterion run. The ratios printed at the end are
//! throughput relative to plain I/O (target: at least 0.8 both ways).
//!
//! Both sides follow the spill store's page-cache policy: a write ends by
//! dropping the file's pages, and every read starts from a file that is not
//! cached (a spill file is read back long after it was written, and the
//! store drops what it read), so the reads measure the device.
//!
//! ```text
//! cargo bench --bench spill
//! ```

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::Criterion;
use outcore::{Handle, PodVec, Runtime};

#[path = "common.rs"]
mod common;

/// outcore's allocator, installed by the program (one line).
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

const ELEMS: usize = 64 << 20; // 256 MiB of f32

/// CPU seconds (user + system) the process has used so far.
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` fills the struct it is given; a zeroed `rusage`
    // is a valid value to pass.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF covers every thread (loads may run on
    // a worker).
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(r.ru_utime) + t(r.ru_stime)
}

/// Drops the file's pages from the page cache.
fn drop_cached(file: &File) {
    // SAFETY: a plain syscall on an open descriptor; no memory is passed.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Makes every spill file in `dir` (and `plain`) clean and uncached.
fn uncache(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("spill dir").flatten() {
        if let Ok(f) = File::open(e.path()) {
            let _ = f.sync_all();
            drop_cached(&f);
        }
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    let rt = Runtime::builder()
        .workers(1)
        .prefetch(false)
        .build()
        .expect("runtime");
    let h = rt
        .insert(PodVec::from(
            (0..ELEMS).map(|i| i as f32).collect::<Vec<f32>>(),
        ))
        .expect("insert");
    let bytes: Vec<u8> = (0..ELEMS * 4).map(|i| i as u8).collect();
    let plain = rt.spill_dir().join("plain.bin");
    let mut g = c.benchmark_group("spill_256MiB");
    writes(&mut g, (&rt, &h), &plain, &bytes);
    let (load_cpu, plain_cpu) = reads(&mut g, (&rt, &h), &plain);
    let (reused_cpu, loads, direct) = reused_loads(&mut g);
    g.finish();
    c.final_summary();
    report([load_cpu, reused_cpu, plain_cpu], loads, direct);
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// CPU seconds and loads, summed over every timed load.
type Cpu = (f64, u64);

/// Evicting (writing) the executor, against plain writes.
fn writes(
    g: &mut Group<'_>,
    (rt, h): (&Runtime, &Handle<PodVec<f32>>),
    plain: &Path,
    bytes: &[u8],
) {
    g.bench_function("evict_write", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // Make it dirty (untimed), then time the eviction.
                rt.write(h, |v: &mut PodVec<f32>| v[0] += 0.0)
                    .expect("touch");
                let t = Instant::now();
                rt.evict_all().expect("evict");
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("plain_write", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                std::fs::write(plain, bytes).expect("write");
                drop_cached(&File::open(plain).expect("open"));
            }
            t.elapsed()
        })
    });
    // The durable twin: outcore's writes wait for `fdatasync` (an executor's
    // memory is freed only once the data is on disk), so compare with a
    // plain write that does too.
    g.bench_function("plain_write_synced", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let mut f = File::create(plain).expect("create");
                std::io::Write::write_all(&mut f, bytes).expect("write");
                f.sync_data().expect("sync");
                drop_cached(&f);
            }
            t.elapsed()
        })
    });
}

/// Loading (reading) the executor into fresh pages, against plain reads:
/// the CPU time of each.
fn reads(g: &mut Group<'_>, (rt, h): (&Runtime, &Handle<PodVec<f32>>), plain: &Path) -> (Cpu, Cpu) {
    let load_cpu = std::cell::Cell::new((0.0f64, 0u64));
    g.bench_function("load_read", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // Evicted clean (untimed), then time the load.
                rt.evict_all().expect("evict");
                uncache(rt.spill_dir());
                let c = cpu_seconds();
                let t = Instant::now();
                let n = rt.read(h, |v: &PodVec<f32>| v.len()).expect("load");
                total += t.elapsed();
                let (s, k) = load_cpu.get();
                load_cpu.set((s + cpu_seconds() - c, k + 1));
                assert_eq!(n, ELEMS);
            }
            total
        })
    });
    let plain_cpu = std::cell::Cell::new((0.0f64, 0u64));
    g.bench_function("plain_read", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                uncache(rt.spill_dir());
                let c = cpu_seconds();
                let t = Instant::now();
                let v = std::fs::read(plain).expect("read");
                total += t.elapsed();
                let (s, k) = plain_cpu.get();
                plain_cpu.set((s + cpu_seconds() - c, k + 1));
                assert_eq!(v.len(), ELEMS * 4);
            }
            total
        })
    });
    (load_cpu.get(), plain_cpu.get())
}

/// Loads into reused memory: the CPU time, the loads and their bytes read
/// with direct I/O.
fn reused_loads(g: &mut Group<'_>) -> (Cpu, u64, u64) {
    // Loads in a capped runtime: two executors that do not both fit take
    // turns, and each load reuses the memory the other one freed (as in a
    // capped job's steady state), where `load_read` above loads into fresh
    // pages (`evict_all` returns memory to the system).
    let capped = Runtime::builder()
        .workers(1)
        .prefetch(false)
        .mem_cap(outcore::MemoryCap::Bytes((ELEMS * 4 * 3 / 2) as u64))
        .build()
        .expect("capped runtime");
    let pair: Vec<_> = (0..2)
        .map(|k| {
            capped
                .insert(PodVec::from(vec![k as f32; ELEMS]))
                .expect("insert")
        })
        .collect();
    for h in &pair {
        capped
            .read(h, |v: &PodVec<f32>| v.len())
            .expect("first load");
    }
    let reused_cpu = std::cell::Cell::new((0.0f64, 0u64));
    let turn = std::cell::Cell::new(0usize);
    g.bench_function("load_reused", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let k = turn.get();
                turn.set(1 - k);
                uncache(capped.spill_dir());
                let c = cpu_seconds();
                let t = Instant::now();
                let v = capped
                    .read(&pair[k], |v: &PodVec<f32>| v[ELEMS - 1])
                    .expect("load");
                total += t.elapsed();
                let (s, n) = reused_cpu.get();
                reused_cpu.set((s + cpu_seconds() - c, n + 1));
                assert_eq!(v, k as f32);
            }
            total
        })
    });
    (
        reused_cpu.get(),
        capped.stats().loads,
        capped.stats().direct_bytes_read,
    )
}

/// The ratios to plain I/O.
fn report([load_cpu, reused_cpu, plain_cpu]: [Cpu; 3], loads: u64, direct: u64) {
    let m = |id| common::mean_ns("spill_256MiB", id).unwrap_or(f64::NAN);
    let gb = |ns: f64| (ELEMS * 4) as f64 / ns;
    println!("\nspill 256 MiB, GB/s (ratio to plain I/O):");
    println!(
        "  write: outcore {:.2}, plain {:.2} ({:.2}x)",
        gb(m("evict_write")),
        gb(m("plain_write")),
        m("plain_write") / m("evict_write")
    );
    println!(
        "  write, both synced: outcore {:.2}, plain {:.2} ({:.2}x)",
        gb(m("evict_write")),
        gb(m("plain_write_synced")),
        m("plain_write_synced") / m("evict_write")
    );
    println!(
        "  read:  outcore {:.2}, plain {:.2} ({:.2}x)",
        gb(m("load_read")),
        gb(m("plain_read")),
        m("plain_read") / m("load_read")
    );
    let per_gib = |(s, k): (f64, u64)| s / (k as f64 * (ELEMS * 4) as f64 / (1u64 << 30) as f64);
    println!(
        "  load into reused memory (capped runtime): {:.2} GB/s",
        gb(m("load_reused"))
    );
    println!(
        "  CPU seconds per GiB read: outcore load {:.3} (into reused memory {:.3}), plain read {:.3}",
        per_gib(load_cpu),
        per_gib(reused_cpu),
        per_gib(plain_cpu)
    );
    println!(
        "  read with direct I/O: {:.1}% of the capped runtime's load bytes ({loads} loads)",
        100.0 * direct as f64 / (loads as f64 * (ELEMS * 4) as f64)
    );
}
