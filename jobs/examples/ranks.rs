//! A parallel application on MPI ranks, each with its own outcore runtime
//! and cap: every rank holds its share of a large array in executors
//! (spilled to disk under the cap), computes per-shard partial sums with
//! tasks, and the shards' sums are combined in global shard order, so
//! the result is bit for bit the same on any number of ranks.
//!
//! ```text
//! cargo build --release -p outcore-jobs --features mpi --example ranks
//! mpirun -np 3 target/release/examples/ranks
//! ```

use outcore::{MemoryCap, PodVec, Runtime};
use outcore_jobs::ranks::{Ranks, Shards};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

/// Values per block (one executor, one task): 4 MiB of f64.
const BLOCK: u64 = 1 << 19;

fn main() -> Result<(), outcore_jobs::Error> {
    let ranks = Ranks::init()?;
    // An error on one rank ends every rank: returning would leave the
    // others waiting in a collective.
    if let Err(e) = run(&ranks) {
        eprintln!("rank {} of {}: {e}", ranks.rank(), ranks.size());
        ranks.abort(1);
    }
    Ok(())
}

fn run(ranks: &Ranks) -> Result<(), outcore_jobs::Error> {
    // The runtime is per rank: its cap, workers and spill directory.
    let rt = Runtime::builder()
        .mem_cap(MemoryCap::parse("16MiB")?)
        .build()?;
    // 64 blocks (256 MiB in all) in 8 shards, whatever the number of
    // ranks; this rank's shards are a contiguous run of them.
    let shards = Shards::new(64, 8);
    let mine = shards.of_rank(ranks.rank(), ranks.size());
    let mut handles = Vec::new();
    for s in mine.clone() {
        for b in shards.tasks(s) {
            // Values that do not add up exactly in double precision.
            let v: Vec<f64> = (b * BLOCK..(b + 1) * BLOCK)
                .map(|i| 1.0 / (1.0 + i as f64))
                .collect();
            handles.push((s, rt.insert(PodVec::from(v))?));
        }
    }
    // One read-only task per block; the partials added per shard, in
    // block order.
    let mut batch = rt.batch();
    for (_, h) in &handles {
        batch.read(h, |v: &PodVec<f64>| {
            let s: f64 = v.iter().sum();
            let sq: f64 = v.iter().map(|x| x * x).sum();
            vec![s, sq]
        });
    }
    let mut per_shard = vec![vec![0.0; 2]; mine.len()];
    for ((s, _), p) in handles.iter().zip(batch.run()?) {
        let acc = &mut per_shard[s - mine.start];
        acc[0] += p[0];
        acc[1] += p[1];
    }
    // Every rank gets the same totals.
    let total = ranks.ordered_sum(&per_shard, 2)?;
    let st = rt.stats();
    println!(
        "rank {} of {}: shards {:?}, evictions {}, loads {}",
        ranks.rank(),
        ranks.size(),
        mine,
        st.evictions,
        st.loads
    );
    ranks.barrier();
    if ranks.is_root() {
        println!("sum {:e}, sum of squares {:e}", total[0], total[1]);
    }
    Ok(())
}
