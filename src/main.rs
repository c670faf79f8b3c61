//! The `outcore` command line: memory-capped K-means (`outcore kmeans`),
//! synthetic data (`outcore gen`) and a training job (`outcore train`).

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outcore: error: {e}");
            ExitCode::from(2)
        }
    }
}
