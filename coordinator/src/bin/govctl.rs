//! `govctl`: the cluster view CLI (see `coordinator::cli`).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = coordinator::cli::Cli::parse();
    match coordinator::cli::main(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("govctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
