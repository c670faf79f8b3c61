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

mod guard;
mod job;

use std::process::ExitCode;
use std::time::Instant;

use outcore::{parse_size, MemoryCap, Runtime, MAX_WORKERS};

/// outcore's allocator, installed by the program (one line).
#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

struct Args {
    edges: u64,
    nodes: u64,
    blocks: Option<usize>,
    cap: Option<MemoryCap>,
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
  --blocks B     node blocks, 1 to 1024; the edges are in B x B blocks
                 (default: node blocks of at most 128Ki nodes)
  --mem-cap      the runtime's memory cap (default: auto, the machine's or
                 the container's limit less some headroom, or the memory
                 available at the start if that is less)
  --iters N      iterations (default 10)
  --workers N    worker threads (default: one per core)
  --spill-dir    where the spill files go (default: the temporary directory)
  --verify       also compute the ranks on plain vectors and compare the bits";

/// At most this many node blocks (a million edge blocks).
const MAX_BLOCKS: u64 = 1024;

/// `v` as a whole number from `min` to `max`.
fn number(flag: &str, v: &str, min: u64, max: u64) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag} takes a whole number from {min} to {max}, not '{v}'"
        )),
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        edges: 256 << 20,
        nodes: 1 << 20,
        blocks: None,
        cap: None,
        iters: 10,
        workers: None,
        spill_dir: None,
        seed: 1,
        verify: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--verify" => a.verify = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--edges" | "--nodes" | "--blocks" | "--mem-cap" | "--iters" | "--workers"
            | "--spill-dir" | "--seed" => {
                let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
                set(&mut a, &flag, v)?;
            }
            other => return Err(format!("unknown argument '{other}' (try --help)")),
        }
    }
    let blocks = a.blocks.unwrap_or_else(|| auto_blocks(a.nodes));
    if a.nodes < blocks as u64 {
        return Err(format!(
            "--nodes ({}) must be at least the number of node blocks ({blocks})",
            a.nodes
        ));
    }
    a.blocks = Some(blocks);
    Ok(a)
}

/// Sets the value of `flag` (one that takes a value).
fn set(a: &mut Args, flag: &str, v: String) -> Result<(), String> {
    let size = |v: &str| parse_size(v).map_err(|e| format!("{flag}: {e}"));
    match flag {
        "--edges" => {
            a.edges = size(&v)?;
            if a.edges < 8 {
                return Err(format!(
                    "--edges must be at least 8 bytes (one edge), not '{v}'"
                ));
            }
        }
        "--nodes" => {
            a.nodes = size(&v)?;
            if a.nodes == 0 || a.nodes > u64::from(u32::MAX) {
                return Err(format!("--nodes must be from 1 to {}, not '{v}'", u32::MAX));
            }
        }
        "--blocks" => a.blocks = Some(number(flag, &v, 1, MAX_BLOCKS)? as usize),
        "--mem-cap" => a.cap = Some(MemoryCap::parse(&v).map_err(|e| format!("{flag}: {e}"))?),
        "--iters" => a.iters = number(flag, &v, 1, 1 << 20)? as usize,
        "--workers" => a.workers = Some(number(flag, &v, 1, MAX_WORKERS as u64)? as usize),
        "--spill-dir" => a.spill_dir = Some(v),
        _ => a.seed = number(flag, &v, 0, u64::MAX)?,
    }
    Ok(())
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
    // Ctrl-C or SIGTERM removes the spill files before the process ends.
    outcore::remove_spill_on_signal();
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pagerank: error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pagerank: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    let cap = a.cap.unwrap_or_else(guard::default_cap);
    let mut b = Runtime::builder().mem_cap(cap);
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
    guard::check(&rt, &g, a.verify)?;
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
    warn_failed_writes(&rt);
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

/// One line when spill writes failed (those executors stayed in memory),
/// as the command line `outcore` says it.
fn warn_failed_writes(rt: &Runtime) {
    let s = rt.stats();
    if s.failed_writes > 0 {
        let over = s.peak_bytes.saturating_sub(rt.cap().unwrap_or(u64::MAX));
        eprintln!(
            "pagerank: warning: {} spill write(s) to {} failed ({}); those executors stayed \
             in memory, {} over the cap at the peak; free space in the spill directory or \
             choose another with --spill-dir",
            s.failed_writes,
            rt.spill_dir().display(),
            rt.last_spill_error().unwrap_or_default(),
            outcore::format_bytes(over)
        );
    }
}
