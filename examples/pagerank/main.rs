//! PageRank out of core: a synthetic power-law graph whose edges are in
//! blocks of a grid (executors), its ranks in node blocks (executors), and
//! one task per edge block and iteration that joins the block with the
//! ranks of its sources (read) and the sums of its destinations (written).
//!
//! ```text
//! cargo run --release --example pagerank -- --edges 1GiB --nodes 4M --mem-cap 128MiB
//! ```
//!
//! Progress goes to standard error; the last line of standard output is
//! one JSON object: the iterations, each one's seconds, a digest of the
//! final ranks' bits (the same capped and uncapped, with any number of
//! workers) and the runtime's stats.

mod job;

use std::process::ExitCode;
use std::time::Instant;

use outcore::{parse_size, MemoryCap, Runtime};

/// outcore's allocator, installed by the program (one line).
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

struct Args {
    edges: u64,
    nodes: u64,
    blocks: Option<usize>,
    cap: MemoryCap,
    iters: usize,
    workers: Option<usize>,
    spill_dir: Option<String>,
    seed: u64,
    verify: bool,
}

const USAGE: &str = "usage: pagerank [--edges SIZE] [--nodes N] [--blocks B] \
[--mem-cap SIZE|auto|none] [--iters N] [--workers N] [--spill-dir DIR] [--seed N] [--verify]

  --edges SIZE   bytes of edges, 8 bytes each (default 256MiB; 1GiB = 134M edges)
  --nodes N      nodes (default 1M; K, M and G are powers of 1024)
  --blocks B     node blocks; the edges are in B x B blocks (default: node
                 blocks of at most 128Ki nodes)
  --mem-cap      the runtime's memory cap (default none)
  --iters N      iterations (default 10)
  --workers N    worker threads (default: one per core)
  --verify       also compute the ranks on plain vectors and compare the bits";

fn number(flag: &str, v: &str) -> Result<u64, String> {
    v.parse()
        .map_err(|_| format!("{flag} takes a whole number, not '{v}'"))
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        edges: 256 << 20,
        nodes: 1 << 20,
        blocks: None,
        cap: MemoryCap::None,
        iters: 10,
        workers: None,
        spill_dir: None,
        seed: 1,
        verify: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--verify" {
            a.verify = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let size = |v: &str| parse_size(v).map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--edges" => a.edges = size(&v)?,
            "--nodes" => a.nodes = size(&v)?,
            "--blocks" => a.blocks = Some(number(&flag, &v)? as usize),
            "--mem-cap" => a.cap = MemoryCap::parse(&v).map_err(|e| format!("{flag}: {e}"))?,
            "--iters" => a.iters = number(&flag, &v)? as usize,
            "--workers" => a.workers = Some(number(&flag, &v)? as usize),
            "--spill-dir" => a.spill_dir = Some(v),
            "--seed" => a.seed = number(&flag, &v)?,
            other => return Err(format!("unknown argument '{other}' (try --help)")),
        }
    }
    let blocks = a.blocks.unwrap_or_else(|| auto_blocks(a.nodes));
    if blocks == 0 || a.nodes < blocks as u64 || a.nodes > u64::from(u32::MAX) {
        return Err(format!(
            "--nodes must be between the number of blocks ({blocks}) and {}",
            u32::MAX
        ));
    }
    a.blocks = Some(blocks);
    if a.edges < 8 {
        return Err("--edges must be at least 8 bytes (one edge)".into());
    }
    Ok(a)
}

/// Node blocks of at most 128Ki nodes (1 MiB of shares and 1 MiB of
/// sums, which the tasks read and add into at random: about a core's L2
/// cache), a power of two from 4 to 256. Smaller node blocks make the
/// edge blocks smaller too (B x B of them): under a cap, each of their
/// loads costs the same fixed time, and 1 GiB of edges under 128 MiB ran
/// 1.32x its bound with 16 x 16 blocks of 4 MiB against 1.66x with
/// 32 x 32 blocks of 1 MiB.
fn auto_blocks(nodes: u64) -> usize {
    let mut b = 4usize;
    while b < 256 && nodes.div_ceil(b as u64) > 1 << 17 {
        b *= 2;
    }
    b
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pagerank: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pagerank: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    let mut b = Runtime::builder().mem_cap(a.cap);
    if let Some(w) = a.workers {
        b = b.workers(w);
    }
    if let Some(d) = &a.spill_dir {
        b = b.spill_dir(d);
    }
    let rt = b.build().map_err(|e| e.to_string())?;
    let g = job::Graph {
        nodes: a.nodes,
        edges: a.edges / 8,
        blocks: a.blocks.unwrap_or(16),
        seed: a.seed,
    };
    eprintln!(
        "pagerank: {} edges ({}) over {} nodes, {} x {} edge blocks, cap {}, {} workers",
        g.edges,
        outcore::format_bytes(g.edges * 8),
        g.nodes,
        g.blocks,
        g.blocks,
        rt.cap().map_or("none".into(), outcore::format_bytes),
        rt.workers()
    );
    let start = Instant::now();
    let report = job::run(&rt, &g, a.iters, |it, secs, change| {
        eprintln!(
            "iteration {}/{}: {secs:.2} s, rank change {change:.3e}",
            it + 1,
            a.iters
        );
    })
    .map_err(|e| e.to_string())?;
    let total = start.elapsed().as_secs_f64();
    let digest = job::digest(&report.ranks);
    let rank_sum: f64 = report.ranks.iter().sum();
    let verified = if a.verify {
        let plain = job::plain(&g, a.iters);
        let same = plain.len() == report.ranks.len()
            && plain
                .iter()
                .zip(&report.ranks)
                .all(|(p, r)| p.to_bits() == r.to_bits());
        eprintln!(
            "verify: the plain computation gives {} bits",
            if same { "the same" } else { "DIFFERENT" }
        );
        if !same {
            return Err("the ranks differ from the plain computation's".into());
        }
        ",\"verified\":true"
    } else {
        ""
    };
    let secs: Vec<String> = report
        .iteration_seconds
        .iter()
        .map(|s| format!("{s:.4}"))
        .collect();
    println!(
        "{{\"iterations\":{},\"iteration_seconds\":[{}],\"digest\":\"{digest}\",\"rank_sum\":{rank_sum},\
         \"edges\":{},\"nodes\":{},\"blocks\":{},\"seconds\":{total:.3}{verified},\"stats\":{}}}",
        a.iters,
        secs.join(","),
        g.edges,
        g.nodes,
        g.blocks,
        rt.stats().to_json()
    );
    Ok(())
}
