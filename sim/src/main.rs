//! `govsim`: the simulator's command line.
use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    cli::main()
}
