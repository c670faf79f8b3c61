//! K-means on your own executors: the data lives in executors you define,
//! and each Lloyd iteration is one batch of read-only tasks whose partial
//! sums are added up in submission order.
//!
//! ```text
//! cargo run --release --example kmeans_executors -- 256MiB 64MiB
//! ```
//! (data size, memory cap; defaults 256MiB and 64MiB)

use std::process::ExitCode;

use outcore::{format_bytes, parse_size, MemoryCap, PodVec, Runtime};
use serde::{Deserialize, Serialize};

/// outcore's allocator, installed by the program (one line).
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

/// Your executor: a block of 2-D points.
#[derive(Serialize, Deserialize)]
struct Block {
    points: PodVec<f32>, // x0, y0, x1, y1, ...
}

/// Bytes of points in one executor.
const BLOCK_BYTES: u64 = 4 << 20;

/// Per-cluster sums (x, y), counts and the squared-distance total.
type Partial = (Vec<[f64; 2]>, Vec<u64>, f64);

fn main() -> ExitCode {
    // Ctrl-C or SIGTERM removes the spill files before the process ends.
    outcore::remove_spill_on_signal();
    let (data, cap) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kmeans_executors: error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(data, cap) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kmeans_executors: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The data size and the memory cap: two optional arguments.
fn parse_args() -> Result<(u64, MemoryCap), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: kmeans_executors [DATA_SIZE [MEMORY_CAP]] (defaults 256MiB 64MiB)");
        std::process::exit(0);
    }
    if let Some(extra) = args.get(2) {
        return Err(format!("unexpected argument '{extra}' (try --help)"));
    }
    let data = parse_size(args.first().map_or("256MiB", String::as_str))
        .map_err(|e| format!("data size: {e}"))?;
    if data < BLOCK_BYTES {
        return Err(format!(
            "data size: {} is less than one executor ({})",
            format_bytes(data),
            format_bytes(BLOCK_BYTES)
        ));
    }
    let cap = MemoryCap::parse(args.get(1).map_or("64MiB", String::as_str))
        .map_err(|e| format!("memory cap: {e}"))?;
    Ok((data, cap))
}

fn run(data: u64, cap: MemoryCap) -> Result<(), outcore::Error> {
    let rt = Runtime::builder().mem_cap(cap).build()?;

    // Points on four rings of clusters; 4 MiB per executor (the data size
    // rounded down to whole executors).
    let per_block = BLOCK_BYTES as usize / 8;
    let blocks = (data / BLOCK_BYTES) as usize;
    let truth = [[0.0f32, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]];
    let mut handles = Vec::new();
    for b in 0..blocks {
        let mut v = Vec::with_capacity(per_block * 2);
        for i in 0..per_block {
            let c = truth[(b + i) % 4];
            let t = ((b * per_block + i) as f32) * 0.618;
            v.push(c[0] + t.sin());
            v.push(c[1] + t.cos());
        }
        handles.push(rt.insert(Block {
            points: PodVec::from(v),
        })?);
    }
    // Tell the runtime the sweep order, so it evicts the block used last
    // and prefetches the next ones.
    rt.hint_cycle(handles.iter().map(|h| h.id()));

    let mut centres: Vec<[f32; 2]> = vec![[1.0, 1.0], [9.0, 1.0], [1.0, 9.0], [9.0, 9.0]];
    for it in 0..5 {
        let mut batch = rt.batch::<Partial>();
        for h in &handles {
            let c = centres.clone();
            batch.read(h, move |b: &Block| {
                let mut sums = vec![[0f64; 2]; c.len()];
                let mut counts = vec![0u64; c.len()];
                let mut inertia = 0.0;
                for p in b.points.chunks_exact(2) {
                    let (j, d) = c
                        .iter()
                        .map(|q| (p[0] - q[0]).powi(2) + (p[1] - q[1]).powi(2))
                        .enumerate()
                        .fold(
                            (0, f32::INFINITY),
                            |a, (j, d)| if d < a.1 { (j, d) } else { a },
                        );
                    sums[j][0] += f64::from(p[0]);
                    sums[j][1] += f64::from(p[1]);
                    counts[j] += 1;
                    inertia += f64::from(d);
                }
                (sums, counts, inertia)
            });
        }
        // Add the partial results in submission order: deterministic.
        let mut sums = vec![[0f64; 2]; centres.len()];
        let mut counts = vec![0u64; centres.len()];
        let mut inertia = 0.0;
        for (s, n, i) in batch.run()? {
            for j in 0..centres.len() {
                sums[j][0] += s[j][0];
                sums[j][1] += s[j][1];
                counts[j] += n[j];
            }
            inertia += i;
        }
        for j in 0..centres.len() {
            if counts[j] > 0 {
                centres[j] = [
                    (sums[j][0] / counts[j] as f64) as f32,
                    (sums[j][1] / counts[j] as f64) as f32,
                ];
            }
        }
        let s = rt.stats();
        println!(
            "iteration {}: inertia {inertia:.4e}, centres {centres:?}, evictions {}, loads {}",
            it + 1,
            s.evictions,
            s.loads
        );
    }
    let s = rt.stats();
    // What the runtime found wrong in the way it was used (an executor
    // larger than the cap, say), once each.
    for w in &s.warnings {
        eprintln!("kmeans_executors: warning: {w}");
    }
    println!(
        "{} of points in {blocks} executors under cap {cap}: read {}, written {} (clean evictions {})",
        format_bytes(blocks as u64 * BLOCK_BYTES),
        format_bytes(s.bytes_read),
        format_bytes(s.bytes_written),
        s.clean_evictions
    );
    Ok(())
}
