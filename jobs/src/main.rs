//! The `outcore` command line: memory-capped K-means (`outcore kmeans`),
//! logistic-regression training (`outcore train`) and synthetic data
//! (`outcore gen`). The application, not the library, installs outcore's
//! allocator: the line below.

mod cli;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;

#[global_allocator]
static GLOBAL: outcore::TrapAlloc = outcore::TrapAlloc::new();

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
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
            // One readable line, not clap's usage block.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("outcore: error: {first} (see 'outcore --help')");
            return ExitCode::from(2);
        }
    };
    match cli::run(args) {
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
