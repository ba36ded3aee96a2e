//! `governor daemon`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::daemon::{DaemonOptions, run_blocking};

/// Arguments of `governor daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Configuration file (see `governor --example-config`); defaults apply when it is missing.
    #[arg(long, default_value = "/etc/governor/governor.toml")]
    pub config: PathBuf,
    /// Node policy, overriding the configuration: fair, flowcon, specon or governor.
    #[arg(long)]
    pub policy: Option<String>,
    /// Compute and log decisions without writing any cgroup file.
    #[arg(long)]
    pub dry_run: bool,
}

/// Run the daemon until SIGTERM/SIGINT; every limit it set is restored before it exits.
pub fn run(args: DaemonArgs) -> ExitCode {
    match run_blocking(DaemonOptions {
        config_path: args.config,
        policy: args.policy,
        dry_run: args.dry_run,
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("governor daemon: {e:#}");
            ExitCode::FAILURE
        }
    }
}
