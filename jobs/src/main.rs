//! The `outcore` command line: memory-capped K-means (`outcore kmeans`),
//! labelling with its centroids or a model (`outcore predict`),
//! logistic-regression training (`outcore train`), linear and ridge
//! regression (`outcore linear`), PCA (`outcore pca`), SGD (`outcore
//! sgd`), synthetic data
//! (`outcore gen`) and memory timelines (`outcore plot`); the reference is
//! `docs/cli.md`. The application, not the library, installs outcore's
//! allocator: the line below.

// At most 80 lines a function (the threshold is in clippy.toml).
#![deny(clippy::too_many_lines)]

mod cli;
mod launcher;

use std::io::Write;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

fn main() -> ExitCode {
    // Under a small stack limit (`ulimit -s` below 1 MiB: at 64 KiB the
    // argument parser alone overflowed the main thread's stack), the
    // program runs on a thread of its own with a stack of 8 MiB. Not
    // otherwise: that stack would be address space mapped at once, which
    // `ulimit -v` counts.
    if main_stack_is_small() {
        let big = std::thread::Builder::new()
            .name("outcore-main".into())
            .stack_size(8 << 20)
            .spawn(run_main);
        if let Ok(code) = big.map(std::thread::JoinHandle::join) {
            return code.unwrap_or(ExitCode::from(2));
        }
    }
    run_main()
}

/// Whether the main thread's stack limit (`RLIMIT_STACK`) is below 1 MiB.
fn main_stack_is_small() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut lim) } == 0;
    ok && lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < 1 << 20
}

fn run_main() -> ExitCode {
    let parsed = cli::Cli::command()
        .try_get_matches()
        .and_then(|m| cli::Cli::from_arg_matches(&m).map(|c| (c, cli::Given::from_matches(&m))));
    let args = match parsed {
        Ok(a) => a,
        Err(e) => return arguments_failed(&e),
    };
    // Before anything starts: a limit too small for the program itself
    // would end the run in an allocation failure.
    if let Some((which, line)) = cli::limit_too_small(&args.0) {
        // Before MPI starts, so without it: under mpirun, once.
        match launched_rank() {
            None | Some(0) => tell(&line),
            Some(r) if !launcher::limit_inherited(which.proc_row()) => {
                // A limit of this rank's own (a wrapper's), which rank 0
                // may not have.
                tell(&ranked(&line, r, launcher::size().unwrap_or(r + 1)));
            }
            Some(_) => let_rank_0_speak(),
        }
        return ExitCode::from(2);
    }
    let role = match (args.0.lends(), args.0.shares()) {
        (true, _) => Process::Lender,
        (false, true) => Process::Sharing,
        (false, false) => Process::Worker,
    };
    let ranks = match ranks_as(role) {
        Ok(r) => r,
        Err(e) => {
            tell(&format!("outcore: error: {e}"));
            return ExitCode::from(2);
        }
    };
    if let Err(code) = arguments_parsed_everywhere(&ranks, None) {
        return code;
    }
    let outcome = cli::run(args.0, &args.1, &ranks);
    // The runtime is gone: a spill directory still there is said (after
    // a signal, its handler is removing them).
    if !cli::interrupted() {
        for line in cli::spill_left() {
            tell(&line);
        }
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) if cli::interrupted() => {
            // The signal handler is removing the spill files and exits the
            // process with code 130.
            loop {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        Err(e) if ranks.size() > 1 => rank_failed(&ranks, &e),
        Err(e) => {
            tell(&format!("outcore: error: {e}"));
            ExitCode::from(2)
        }
    }
}

/// The command line did not parse: help and version are printed, an
/// error is one line. Under `mpirun` the ranks agree on it first
/// ([`arguments_parsed_everywhere`]), so that the line is printed once
/// even when only some ranks were given the bad value.
fn arguments_failed(e: &clap::Error) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // No subcommand: show the help, but as an error.
        let _ = write!(std::io::stderr(), "{}", e.render());
        return ExitCode::from(2);
    }
    let line = condense(&e.to_string());
    let mpi = launched_rank()
        .and_then(|_| ranks().ok())
        .filter(outcore_jobs::ranks::Ranks::is_mpi);
    if let Some(ranks) = mpi {
        let agreed = arguments_parsed_everywhere(&ranks, Some(&line));
        return agreed.err().unwrap_or(ExitCode::from(2));
    }
    // Without MPI to agree through, every rank parses the same arguments:
    // rank 0 alone says what is wrong.
    if launched_rank().is_none_or(|r| r == 0) {
        tell(&line);
    } else {
        let_rank_0_speak();
    }
    ExitCode::from(2)
}

/// On a rank other than 0 that ends, before MPI, for a reason rank 0
/// says alone (every rank found the same): a pause first. `mpirun` ends
/// every process as soon as one exits with an error, and a silent rank
/// that exited at once could take rank 0 down before its line was out
/// (seen under load: no line at all).
fn let_rank_0_speak() {
    std::thread::sleep(std::time::Duration::from_secs(2));
}

/// Under MPI, every rank says whether its command line parsed (`failed`:
/// its error line), before anything else: when one did not, the lowest
/// such rank prints its line (naming itself, unless it is rank 0) and
/// every rank ends with exit code 2, none left waiting. A rank's
/// arguments can differ from rank 0's (a wrapper script, a node's own
/// paths); a rank that failed alone used to exit before MPI started,
/// silently. Collective (not for a rank spawned by growth, whose
/// parents are past this point).
fn arguments_parsed_everywhere(
    ranks: &outcore_jobs::ranks::Ranks,
    failed: Option<&str>,
) -> Result<(), ExitCode> {
    if ranks.size() > 1 && !ranks.joined() {
        let all = ranks.all_gather_u64(&[u64::from(failed.is_some())]);
        let Some(first) = all.iter().position(|&f| f == 1) else {
            return Ok(());
        };
        if let (true, Some(line)) = (first == ranks.rank(), failed) {
            tell(&ranked(line, first, ranks.size()));
        }
        return Err(ExitCode::from(2));
    }
    match failed {
        Some(line) => {
            tell(line);
            Err(ExitCode::from(2))
        }
        None => Ok(()),
    }
}

/// `line` (`outcore: error: ...`) naming rank `rank` of `size` (rank 0
/// speaks for all ranks, as one process does: its line is unchanged).
fn ranked(line: &str, rank: usize, size: usize) -> String {
    match line.strip_prefix("outcore: error: ") {
        Some(rest) if rank > 0 => format!("outcore: error: rank {rank} of {size}: {rest}"),
        _ => line.to_string(),
    }
}

/// This process's rank in `MPI_COMM_WORLD` as its launcher says before
/// `MPI_Init` (`None`: not started by an MPI launcher).
fn launched_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .and_then(|r| r.parse().ok())
}

/// A line on stderr, in one write: under `mpirun`, which forwards each
/// rank's stderr as the pieces come, a line written in pieces can have
/// another rank's output land inside it. Lost, not a panic, when stderr
/// is closed.
fn tell(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// The MPI ranks this process is one of (built with the `mpi` feature and
/// started by an MPI launcher), or a single process: started directly,
/// the MPI-enabled binary does not initialise MPI at all (no address
/// space mapped for it, the same code path as the plain binary).
fn ranks() -> outcore_jobs::Result<outcore_jobs::ranks::Ranks> {
    ranks_as(Process::Worker)
}

/// What this process is to the others under `mpirun`.
#[derive(Clone, Copy)]
enum Process {
    /// Runs a job.
    Worker,
    /// Runs a job and lends the memory its work leaves.
    Sharing,
    /// Lends its memory (`outcore lend`).
    Lender,
}

/// [`ranks`] for a process of the given role.
#[cfg(feature = "mpi")]
fn ranks_as(p: Process) -> outcore_jobs::Result<outcore_jobs::ranks::Ranks> {
    use outcore_jobs::ranks::{Ranks, Role};
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if !launched {
        return Ok(Ranks::single());
    }
    Ranks::init_as(match p {
        Process::Worker => Role::Worker,
        Process::Sharing => Role::Sharing,
        Process::Lender => Role::Lender,
    })
}

/// A single process (built without the `mpi` feature).
#[cfg(not(feature = "mpi"))]
fn ranks_as(_: Process) -> outcore_jobs::Result<outcore_jobs::ranks::Ranks> {
    Ok(outcore_jobs::ranks::Ranks::single())
}

/// clap's error message in at most three lines: what is wrong (with the
/// arguments it lists, such as the missing ones, on the same line), then
/// its tip or the allowed values; without the usage block.
fn condense(text: &str) -> String {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"));
    let first = lines.next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let rest: Vec<&str> = lines.collect();
    let (listed, notes): (Vec<&str>, Vec<&str>) = if first.ends_with(':') {
        // "the following required arguments were not provided:" and the
        // like: the arguments belong on the same line.
        rest.iter()
            .partition(|l| !l.starts_with("tip:") && !l.starts_with('['))
    } else {
        (Vec::new(), rest)
    };
    let mut out = format!("outcore: error: {first}");
    if !listed.is_empty() {
        out.push(' ');
        out.push_str(&listed.join(", "));
    }
    out.push_str(" (see 'outcore --help')");
    match notes.len() {
        0 => {}
        1 | 2 => {
            for n in notes {
                out.push_str("\n  ");
                out.push_str(n);
            }
        }
        _ => {
            out.push_str("\n  ");
            out.push_str(notes[0]);
            out.push_str("\n  ");
            out.push_str(&notes[1..].join("; "));
        }
    }
    out
}

/// A run that failed on one of several MPI ranks: one line naming the
/// rank, then every rank ends (MPI_Abort), none left waiting in a
/// collective. The other ranks wait a moment first, so that an error
/// every rank meets (a missing file) is printed once, by rank 0.
fn rank_failed(ranks: &outcore_jobs::ranks::Ranks, e: &outcore_jobs::Error) -> ExitCode {
    if !ranks.is_root() {
        // An error every rank has at once (a collective check):
        // rank 0 says it and ends the job; this rank waits for
        // that, silent, however slow rank 0 is (under load, 300
        // ms were not always enough: two lines). A bound, should
        // rank 0 be gone.
        let wait = if matches!(e, outcore_jobs::Error::Collective(_)) {
            60_000
        } else {
            300
        };
        std::thread::sleep(std::time::Duration::from_millis(wait));
        if wait > 300 {
            ranks.abort(2);
        }
    }
    tell(&format!(
        "outcore: error: rank {} of {}: {e}",
        ranks.rank(),
        ranks.size()
    ));
    ranks.abort(2)
}
