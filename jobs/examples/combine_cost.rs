//! What `Ranks::ordered_sum` costs per mini-batch step: the shards' sums
//! of K-means at k = 100, d = 1000 (k x (d + 1) + 1 values each), 8
//! shards spread over the ranks, added in shard order on every rank.
//! Prints the mean and the slowest rank's time per combine.
//!
//! ```text
//! cargo build --release -p outcore-jobs --features mpi --example combine_cost
//! mpirun -np 2 target/release/examples/combine_cost [k] [d] [shards]
//! ```

use std::time::Instant;

use outcore_jobs::ranks::{Ranks, Shards};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

fn main() {
    let ranks = match Ranks::init() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (k, d, shards) = (arg(1, 100), arg(2, 1000), arg(3, 8));
    let len = k * (d + 1) + 1;
    let sh = Shards::new(shards as u64, shards);
    let mine = sh.of_rank(ranks.rank(), ranks.size());
    let local: Vec<Vec<f64>> = mine
        .clone()
        .map(|s| (0..len).map(|i| (i * (s + 1)) as f64 * 1e-3).collect())
        .collect();
    let rounds = 50;
    // A warm-up round, then the timed ones.
    let mut check = 0.0;
    let mut secs = 0.0;
    for r in 0..=rounds {
        ranks.barrier();
        let t = Instant::now();
        match ranks.ordered_sum(&local, len) {
            Ok(v) => check += v[len - 1],
            Err(e) => {
                eprintln!("{e}");
                ranks.abort(1);
            }
        }
        if r > 0 {
            secs += t.elapsed().as_secs_f64();
        }
    }
    let per = secs / rounds as f64;
    let all = match ranks.gather_rows(&[per]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            ranks.abort(1);
        }
    };
    if let Some(all) = all {
        let times: Vec<f64> = all.iter().map(|r| r[0]).collect();
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let max = times.iter().cloned().fold(0.0, f64::max);
        println!(
            "ranks {}, shards {}, {} values ({:.2} MB) per shard: {:.2} ms per combine (slowest rank {:.2} ms); check {check:e}",
            ranks.size(),
            sh.count(),
            len,
            len as f64 * 8.0 / 1e6,
            mean * 1e3,
            max * 1e3
        );
    }
}
