//! The `outcore` command line: memory-capped K-means (`outcore kmeans`),
//! logistic-regression training (`outcore train`) and synthetic data
//! (`outcore gen`). The application, not the library, installs outcore's
//! allocator: the line below.

mod cli;

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
                eprint!("{}", e.render());
                return ExitCode::from(2);
            }
            eprintln!("{}", condense(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    match cli::run(args.0, &args.1) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) if cli::interrupted() => {
            // The signal handler is removing the spill files and exits the
            // process with code 130.
            loop {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        Err(e) => {
            eprintln!("outcore: error: {e}");
            ExitCode::from(2)
        }
    }
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
