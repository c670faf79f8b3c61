//! `outcore lend`: a memory-only rank beside a job under `mpirun`.

use clap::Args;
use outcore::{format_bytes, MemoryCap};
use outcore_jobs::ranks::Ranks;
use outcore_jobs::{Error, Result};

/// Flags of `outcore lend`.
#[derive(Args, Debug)]
pub struct LendArgs {
    /// The most memory this process holds for the job: a size (4GiB) or
    /// `auto` (the memory the system and its limits leave, shared with the
    /// other processes mpirun started on this node).
    #[arg(long, value_name = "SIZE|auto", default_value = "auto")]
    mem_cap: MemoryCap,
}

/// Lends this process's memory until every worker is done, then says
/// what it held (one line, on stderr).
pub fn run(a: &LendArgs, ranks: &Ranks) -> Result<()> {
    let cap = match a.mem_cap {
        MemoryCap::None => {
            return Err(Error::Input(
                "outcore lend needs a cap (a size or auto), not none".into(),
            ))
        }
        MemoryCap::Auto => {
            let on_node = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1usize);
            MemoryCap::Auto.resolve_shared(on_node)
        }
        c => c.resolve(),
    };
    let cap =
        cap.ok_or_else(|| Error::Input("outcore lend: no memory limit found for auto".into()))?;
    // What the process itself takes beside the images: MPI's buffers, a
    // piece in flight.
    let budget = cap.saturating_sub((cap / 16).max(32 << 20));
    lend(ranks, budget)
}

#[cfg(feature = "mpi")]
fn lend(ranks: &Ranks, budget: u64) -> Result<()> {
    let lent = ranks.lend(budget)?;
    let line = format!(
        "outcore lend: rank {}: kept {} images (at most {} at once, of {} allowed), handed back {}, declined {}\n",
        ranks.rank(),
        lent.puts,
        format_bytes(lent.peak_bytes),
        format_bytes(budget),
        lent.gets,
        lent.declined,
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn lend(_: &Ranks, budget: u64) -> Result<()> {
    Err(Error::Input(format!(
        "outcore lend needs outcore built with MPI (the mpi feature); it would have lent {}",
        format_bytes(budget)
    )))
}
