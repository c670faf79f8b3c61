//! The `outcore` command line: memory-capped K-means (`outcore kmeans`),
//! labelling with its centroids or a model (`outcore predict`),
//! logistic-regression training (`outcore train`), synthetic data
//! (`outcore gen`) and memory timelines (`outcore plot`); the reference is
//! `docs/cli.md`. The application, not the library, installs outcore's
//! allocator: the line below.

// At most 80 lines a function (the threshold is in clippy.toml).
#![deny(clippy::too_many_lines)]

mod cli;

use std::io::Write;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches};

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

fn main() -> ExitCode {
    let parsed = cli::Cli::command()
        .try_get_matches()
        .and_then(|m| cli::Cli::from_arg_matches(&m).map(|c| (c, cli::Given::from_matches(&m))));
    let args = match parsed {
        Ok(a) => a,
        Err(e) => {
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                // No subcommand: show the help, but as an error.
                let _ = write!(std::io::stderr(), "{}", e.render());
                return ExitCode::from(2);
            }
            // Under mpirun every rank parses the same arguments: rank 0
            // alone says what is wrong.
            let rank = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"]
                .iter()
                .find_map(|v| std::env::var(v).ok());
            if rank.is_none_or(|r| r == "0") {
                tell(&condense(&e.to_string()));
            }
            return ExitCode::from(2);
        }
    };
    // Before anything starts: a limit too small for the program itself
    // would end the run in an allocation failure.
    if let Some(line) = cli::address_space_too_small(&args.0) {
        tell(&line);
        return ExitCode::from(2);
    }
    let ranks = match ranks() {
        Ok(r) => r,
        Err(e) => {
            tell(&format!("outcore: error: {e}"));
            return ExitCode::from(2);
        }
    };
    match cli::run(args.0, &args.1, &ranks) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) if cli::interrupted() => {
            // The signal handler is removing the spill files and exits the
            // process with code 130.
            loop {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        Err(e) if ranks.size() > 1 => {
            // One line naming the rank, then every rank ends (MPI_Abort):
            // none is left waiting in a collective. The other ranks wait a
            // moment first, so that an error every rank meets (a missing
            // file) is printed once, by rank 0.
            if !ranks.is_root() {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            tell(&format!(
                "outcore: error: rank {} of {}: {e}",
                ranks.rank(),
                ranks.size()
            ));
            ranks.abort(2)
        }
        Err(e) => {
            tell(&format!("outcore: error: {e}"));
            ExitCode::from(2)
        }
    }
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
#[cfg(feature = "mpi")]
fn ranks() -> outcore_jobs::Result<outcore_jobs::ranks::Ranks> {
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if launched {
        outcore_jobs::ranks::Ranks::init()
    } else {
        Ok(outcore_jobs::ranks::Ranks::single())
    }
}

/// A single process (built without the `mpi` feature).
#[cfg(not(feature = "mpi"))]
fn ranks() -> outcore_jobs::Result<outcore_jobs::ranks::Ranks> {
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
