//! Out-of-core PageRank on outcore's runtime: a synthetic power-law graph
//! cut into a grid of edge blocks, the ranks in node blocks, one task per
//! edge block and iteration that joins it with the rank block of its
//! sources and the sums of its destinations.
//!
//! Shared by the example (`main.rs`) and its test (`tests/pagerank.rs`),
//! which also holds [`plain`], the same computation on plain vectors.

use std::time::Instant;

use outcore::{Handle, Plain, PodVec, Runtime};
use serde::{Deserialize, Serialize};

/// The damping factor.
pub const DAMPING: f64 = 0.85;

/// An edge, by the indices of its ends in their node blocks.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Edge {
    pub src: u32,
    pub dst: u32,
}

// SAFETY: `repr(C)`, two `u32` fields, 8 bytes with no padding; every bit
// pattern is a valid `Edge`.
unsafe impl Plain for Edge {}

/// A synthetic graph: `edges` edges over `nodes` nodes, cut into
/// `blocks` x `blocks` edge blocks (by the node blocks of their source and
/// destination). Out- and in-degrees follow power laws; every block is
/// generated on its own from `seed`, so the graph is the same whatever
/// the order blocks are made in.
#[derive(Clone, Copy, Debug)]
pub struct Graph {
    pub nodes: u64,
    pub edges: u64,
    pub blocks: usize,
    pub seed: u64,
}

/// A SplitMix64 step: a deterministic stream of 64-bit draws.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A node index in `0..n` drawn with a power law of exponent `skew`
/// (small indices are drawn far more often), then scattered over the
/// block by a bijection so that the heavy nodes are spread out.
fn power_law(state: &mut u64, n: u64, skew: i32) -> u32 {
    let u = (next(state) >> 11) as f64 / (1u64 << 53) as f64;
    let idx = ((n as f64 * u.powi(skew)) as u64).min(n - 1);
    // 2654435761 is prime and larger than any block, so it is coprime
    // with `n`: `idx -> idx * p mod n` is a bijection.
    ((idx * 2_654_435_761 + 12_345) % n) as u32
}

impl Graph {
    /// The nodes of block `b`: `start..end`.
    pub fn block_nodes(&self, b: usize) -> (u64, u64) {
        let n = self.nodes as u128;
        let k = self.blocks as u128;
        let start = n * b as u128 / k;
        let end = n * (b as u128 + 1) / k;
        (start as u64, end as u64)
    }

    /// Number of nodes in block `b`.
    pub fn block_len(&self, b: usize) -> usize {
        let (s, e) = self.block_nodes(b);
        (e - s) as usize
    }

    /// The edges of block (`i`, `j`): from node block `i` to node block
    /// `j`, as indices within them.
    pub fn block_edges(&self, i: usize, j: usize) -> Vec<Edge> {
        let k = (self.blocks * self.blocks) as u128;
        let at = (i * self.blocks + j) as u128;
        let e = self.edges as u128;
        let count = (e * (at + 1) / k - e * at / k) as usize;
        let (ni, nj) = (self.block_len(i) as u64, self.block_len(j) as u64);
        let mut state = self.seed ^ ((at as u64 + 1) << 32);
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            out.push(Edge {
                src: power_law(&mut state, ni, 3),
                dst: power_law(&mut state, nj, 2),
            });
        }
        out
    }

    /// The order the edge blocks are swept in: by diagonals, so that two
    /// tasks in a row meet different rank blocks and different sums (and
    /// run side by side), and each block of sums gets its blocks in one
    /// fixed order (so its additions, and the result's bits).
    pub fn sweep(&self) -> Vec<(usize, usize)> {
        let b = self.blocks;
        (0..b)
            .flat_map(|d| (0..b).map(move |i| (i, (i + d) % b)))
            .collect()
    }
}

/// A block of nodes: their ranks, what each gives each of its out-edges
/// (its rank over its out-degree), and their out-degrees.
#[derive(Serialize, Deserialize)]
pub struct Nodes {
    pub rank: PodVec<f64>,
    pub contrib: PodVec<f64>,
    pub outdeg: PodVec<u32>,
}

impl Nodes {
    /// Sets every node's rank to `rank[v]` and its contribution from it;
    /// returns the rank of the nodes without out-edges (their rank is
    /// spread over every node).
    fn set_ranks(&mut self, mut rank: impl FnMut(usize, f64) -> f64) -> f64 {
        let mut dangling = 0.0;
        for v in 0..self.rank.len() {
            let r = rank(v, self.rank[v]);
            self.rank[v] = r;
            let d = self.outdeg[v];
            if d == 0 {
                dangling += r;
                self.contrib[v] = 0.0;
            } else {
                self.contrib[v] = r / f64::from(d);
            }
        }
        dangling
    }
}

/// The graph's executors in a runtime.
pub struct Blocks {
    /// Edge blocks, `edges[i][j]`.
    pub edges: Vec<Vec<Handle<PodVec<Edge>>>>,
    pub nodes: Vec<Handle<Nodes>>,
    /// Sums of what each node receives in an iteration.
    pub sums: Vec<Handle<PodVec<f64>>>,
    /// The rank of the nodes without out-edges.
    pub dangling: f64,
}

/// Builds the graph's executors: each edge block is generated and inserted
/// in the order the iterations sweep them (the runtime spills what does not
/// fit under the cap, so the spill files lie on disk in the order they are
/// read back), then the node blocks with every rank at 1 / nodes.
pub fn build(rt: &Runtime, g: &Graph) -> outcore::Result<Blocks> {
    let b = g.blocks;
    let mut blocks = Blocks {
        edges: Vec::with_capacity(b),
        nodes: Vec::with_capacity(b),
        sums: Vec::with_capacity(b),
        dangling: 0.0,
    };
    let mut grid: Vec<Vec<Option<Handle<PodVec<Edge>>>>> =
        (0..b).map(|_| (0..b).map(|_| None).collect()).collect();
    let mut outdeg: Vec<Vec<u32>> = (0..b).map(|i| vec![0u32; g.block_len(i)]).collect();
    // A run stopped while the blocks are made (its cap cannot be kept)
    // stops here.
    let stop = rt.interrupter();
    for (i, j) in g.sweep() {
        if stop.is_interrupted() {
            return Err(outcore::Error::Interrupted);
        }
        let e = g.block_edges(i, j);
        for edge in &e {
            outdeg[i][edge.src as usize] += 1;
        }
        grid[i][j] = Some(rt.insert_named(Some(&format!("edges {i},{j}")), PodVec::from(e))?);
    }
    for (i, (row, outdeg)) in grid.into_iter().zip(outdeg).enumerate() {
        blocks.edges.push(row.into_iter().flatten().collect());
        let n = outdeg.len();
        let mut nodes = Nodes {
            rank: PodVec::from(vec![0.0; n]),
            contrib: PodVec::from(vec![0.0; n]),
            outdeg: PodVec::from(outdeg),
        };
        let start = 1.0 / g.nodes as f64;
        blocks.dangling += nodes.set_ranks(|_, _| start);
        blocks
            .nodes
            .push(rt.insert_named(Some(&format!("ranks {i}")), nodes)?);
        let sums = PodVec::from(vec![0.0f64; n]);
        blocks
            .sums
            .push(rt.insert_named(Some(&format!("sums {i}")), sums)?);
    }
    Ok(blocks)
}

/// What a run gives back.
#[derive(Debug)]
pub struct Report {
    pub iteration_seconds: Vec<f64>,
    /// The final ranks, in node order.
    pub ranks: Vec<f64>,
}

/// The base rank every node gets in an iteration: the teleport share and
/// the spread rank of the nodes without out-edges.
fn base(g: &Graph, dangling: f64) -> f64 {
    (1.0 - DAMPING) / g.nodes as f64 + DAMPING * dangling / g.nodes as f64
}

/// One iteration, as one batch: every edge block adds its sources'
/// contributions into its destinations' sums, then every node block takes
/// its new ranks from its sums (and clears them). The tasks on a block of
/// sums run in submission order, so its update comes after every edge
/// block that adds into it; and in one batch, the rank and sum blocks have
/// tasks pending from the start to the end of the iteration, so the plan
/// keeps them in memory throughout (with a batch for each half, they had
/// none in between, and were the first executors evicted). Returns the
/// iteration's total change of rank.
pub fn iterate(rt: &Runtime, g: &Graph, bl: &mut Blocks) -> outcore::Result<f64> {
    let mut batch = rt.batch::<(f64, f64)>();
    for (i, j) in g.sweep() {
        let (e, n, s) = (&bl.edges[i][j], &bl.nodes[i], &bl.sums[j]);
        let (ke, kn, ks) = (e.key(), n.key(), s.key());
        batch.task(&[e, n], &[s], move |t| {
            let contrib = &t.read(kn).contrib;
            let sums = t.write(ks);
            for edge in t.read(ke).iter() {
                sums[edge.dst as usize] += contrib[edge.src as usize];
            }
            (0.0, 0.0)
        });
    }
    let base = base(g, bl.dangling);
    for (n, s) in bl.nodes.iter().zip(&bl.sums) {
        let (kn, ks) = (n.key(), s.key());
        batch.task(&[], &[n, s], move |t| {
            let sums = t.write(ks);
            let mut change = 0.0;
            let dangling = t.write(kn).set_ranks(|v, old| {
                let r = base + DAMPING * sums[v];
                change += (r - old).abs();
                r
            });
            sums.fill(0.0);
            (dangling, change)
        });
    }
    let edge_tasks = g.blocks * g.blocks;
    let mut change = 0.0;
    let mut dangling = 0.0;
    let mut failed = None;
    batch.run_in_order(|i, r| match r {
        Ok((d, c)) if i >= edge_tasks => {
            dangling += d;
            change += c;
        }
        Ok(_) => {}
        Err(e) => {
            failed.get_or_insert(e);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    bl.dangling = dangling;
    Ok(change)
}

/// Builds the graph in `rt`, runs `iters` iterations (calling `each` with
/// the iteration, its seconds and its change of rank) and reads the ranks
/// back.
pub fn run(
    rt: &Runtime,
    g: &Graph,
    iters: usize,
    mut each: impl FnMut(usize, f64, f64),
) -> outcore::Result<Report> {
    let mut bl = build(rt, g)?;
    // Every iteration runs the same tasks in the same order: declare them
    // as a cycle of steps, each naming the executors its task joins, so
    // the plan knows the next iteration's first blocks while this one ends
    // (when the batch has no task left for them).
    let edge_steps = g
        .sweep()
        .into_iter()
        .map(|(i, j)| vec![bl.edges[i][j].id(), bl.nodes[i].id(), bl.sums[j].id()]);
    let update_steps = bl
        .nodes
        .iter()
        .zip(&bl.sums)
        .map(|(n, s)| vec![n.id(), s.id()]);
    rt.hint_cycle_steps(edge_steps.chain(update_steps));
    let mut iteration_seconds = Vec::with_capacity(iters);
    for it in 0..iters {
        let t = Instant::now();
        let change = iterate(rt, g, &mut bl)?;
        let s = t.elapsed().as_secs_f64();
        iteration_seconds.push(s);
        each(it, s, change);
    }
    let mut ranks = Vec::with_capacity(g.nodes as usize);
    for n in &bl.nodes {
        ranks.extend_from_slice(&rt.read(n, |n: &Nodes| n.rank.0.clone())?);
    }
    Ok(Report {
        iteration_seconds,
        ranks,
    })
}

/// The same computation on plain vectors, in one address space and in the
/// same order of additions: the ranks after `iters` iterations.
pub fn plain(g: &Graph, iters: usize) -> Vec<f64> {
    let n = g.nodes as usize;
    let first = |b: usize| g.block_nodes(b).0 as usize;
    let mut outdeg = vec![0u32; n];
    let mut edges = Vec::new();
    for (i, j) in g.sweep() {
        for e in g.block_edges(i, j) {
            let (s, d) = (first(i) + e.src as usize, first(j) + e.dst as usize);
            outdeg[s] += 1;
            edges.push((s, d));
        }
    }
    let mut rank = vec![1.0 / g.nodes as f64; n];
    let mut sums = vec![0.0f64; n];
    for _ in 0..iters {
        let mut dangling = 0.0;
        // Summed block by block, in node order within each block, as the
        // node blocks' partial sums are added in block order.
        for b in 0..g.blocks {
            let (s, e) = g.block_nodes(b);
            let mut part = 0.0;
            for v in s as usize..e as usize {
                if outdeg[v] == 0 {
                    part += rank[v];
                }
            }
            dangling += part;
        }
        for &(s, d) in &edges {
            sums[d] += rank[s] / f64::from(outdeg[s]);
        }
        let base = base(g, dangling);
        for v in 0..n {
            rank[v] = base + DAMPING * sums[v];
            sums[v] = 0.0;
        }
    }
    rank
}

/// FNV-1a over the ranks' bits, as 16 hex digits.
pub fn digest(ranks: &[f64]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in ranks {
        for byte in r.to_bits().to_le_bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}
