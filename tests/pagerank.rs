//! The PageRank example (`examples/pagerank/`) against a plain in-memory
//! computation: the same bits uncapped, capped (evicting and loading its
//! blocks) and with one or two workers.

mod common;

#[allow(dead_code)]
#[path = "../examples/pagerank/job.rs"]
mod job;

use std::time::Duration;

use common::{child_ok, is_child};
use outcore::{MemoryCap, Runtime};

/// 512Ki edges (4 MiB) over 64Ki nodes, in 8 x 8 blocks.
const GRAPH: job::Graph = job::Graph {
    nodes: 1 << 16,
    edges: 1 << 19,
    blocks: 8,
    seed: 7,
};

const ITERS: usize = 6;

fn run(cap: MemoryCap, workers: usize) -> (Vec<f64>, outcore::Stats) {
    let rt = Runtime::builder()
        .mem_cap(cap)
        .workers(workers)
        .build()
        .unwrap();
    let report = job::run(&rt, &GRAPH, ITERS, |_, _, _| {}).unwrap();
    assert_eq!(report.iteration_seconds.len(), ITERS);
    (report.ranks, rt.stats())
}

#[test]
fn the_ranks_are_the_plain_computations_bit_for_bit() {
    let plain = job::plain(&GRAPH, ITERS);
    let (ranks, _) = run(MemoryCap::None, 2);
    assert_eq!(ranks.len(), plain.len());
    let differ = ranks
        .iter()
        .zip(&plain)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "{differ} ranks differ");
    // A probability distribution (the nodes without out-edges give their
    // rank to every node).
    let sum: f64 = ranks.iter().sum();
    assert!((sum - 1.0).abs() < 1e-9, "ranks sum to {sum}");
    // A power law: the largest rank is far above the mean.
    let max = ranks.iter().cloned().fold(0.0, f64::max);
    assert!(max > 20.0 / GRAPH.nodes as f64, "largest rank {max}");
}

#[test]
fn capped_and_with_any_worker_count_the_bits_stay_the_same() {
    let test = "capped_and_with_any_worker_count_the_bits_stay_the_same";
    if is_child(test) {
        for workers in [1, 2] {
            // About 6 MiB of blocks under a 3 MiB cap.
            let (ranks, s) = run(MemoryCap::Bytes(3 << 20), workers);
            println!("DIGEST{workers}={}", job::digest(&ranks));
            println!("LOADS{workers}={}", s.loads);
            println!("EVICTIONS{workers}={}", s.evictions);
        }
        return;
    }
    let out = child_ok(test, None, Duration::from_secs(300), &[]);
    let plain = job::digest(&job::plain(&GRAPH, ITERS));
    for workers in [1, 2] {
        assert_eq!(
            out.value(&format!("DIGEST{workers}")).as_deref(),
            Some(plain.as_str()),
            "{workers} workers: {}",
            out.stdout
        );
        // The blocks went to disk and came back every iteration.
        assert!(
            out.num(&format!("EVICTIONS{workers}")) > 0,
            "{}",
            out.stdout
        );
        assert!(
            out.num(&format!("LOADS{workers}")) >= (ITERS * 32) as u64,
            "{}",
            out.stdout
        );
    }
}
