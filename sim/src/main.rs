//! `govsim`: the simulator's command line.
use std::process::ExitCode;

fn main() -> ExitCode {
    sim::cli::main()
}
