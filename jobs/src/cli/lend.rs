//! `outcore lend`: a memory-only rank beside a job under `mpirun`.

use clap::Args;
use outcore::MemoryCap;
use outcore_jobs::ranks::Ranks;
use outcore_jobs::Result;

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
#[cfg(feature = "mpi")]
pub fn run(a: &LendArgs, ranks: &Ranks) -> Result<()> {
    let budget = outcore_jobs::remote::lender_budget(a.mem_cap)?;
    let lent = ranks.lend(budget)?;
    let line = lent.line(ranks.rank(), budget);
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    Ok(())
}

/// Without MPI there is no job to lend to.
#[cfg(not(feature = "mpi"))]
pub fn run(a: &LendArgs, _: &Ranks) -> Result<()> {
    let _ = a.mem_cap;
    Err(outcore_jobs::Error::Input(
        "outcore lend needs outcore built with MPI (the mpi feature)".into(),
    ))
}
