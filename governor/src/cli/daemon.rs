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
    /// Node policy, overriding the configuration: fair, flowcon, specon or governor, with
    /// parameters as NAME:KEY=VALUE[:KEY=VALUE] (e.g. `specon:interval=10`).
    #[arg(long)]
    pub policy: Option<String>,
    /// Compute and log decisions without writing any cgroup file.
    #[arg(long)]
    pub dry_run: bool,
    /// Join the cluster: report to the coordinator at HOST:PORT and run the jobs it places
    /// here (overrides `[coordinator] address`).
    #[arg(long, value_name = "HOST:PORT")]
    pub coordinator: Option<String>,
    /// Directory with the cluster's mTLS files: `ca.pem`, `NODE.pem` and `NODE-key.pem`
    /// (`govctl certs init --node NODE`), NODE being the node name.
    #[arg(long, value_name = "DIR")]
    pub certs: Option<std::path::PathBuf>,
    /// Connect to the coordinator in plain text, without authentication (test clusters only).
    #[arg(long)]
    pub insecure: bool,
    /// The node's name (a DNS label; the name in its certificate). Default: `[node] name`, else
    /// the host name.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
}

/// Run the daemon until SIGTERM/SIGINT; every limit it set is restored before it exits.
pub fn run(args: DaemonArgs) -> ExitCode {
    match run_blocking(DaemonOptions {
        config_path: args.config,
        policy: args.policy,
        dry_run: args.dry_run,
        coordinator: args.coordinator,
        certs: args.certs,
        insecure: args.insecure,
        node_name: args.node_name,
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("governor daemon: {e:#}");
            ExitCode::FAILURE
        }
    }
}
