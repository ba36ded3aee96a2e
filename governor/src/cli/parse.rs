//! `governor parse` and `governor formats`.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `governor parse`.
#[derive(Debug, clap::Args)]
pub struct ParseArgs {
    /// Files to parse.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Run `governor parse`.
pub fn run_parse(_args: ParseArgs) -> ExitCode {
    eprintln!("governor parse: not implemented yet");
    ExitCode::from(2)
}

/// Run `governor formats`.
pub fn run_formats() -> ExitCode {
    ExitCode::SUCCESS
}
