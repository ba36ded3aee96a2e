//! `goveval`: Governor's evaluation (the benchmarks); `cargo xtask bench-*` runs the same
//! commands.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

/// Governor's evaluation: benchmarks on real processes, real kernels and the VM bed.
#[derive(Debug, Parser)]
#[command(name = "goveval", about)]
struct Cli {
    #[command(subcommand)]
    command: governor_eval::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match governor_eval::run(&cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ngoveval: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
