//! Command-line interface of the `governor` binary. Each subcommand lives in its own module;
//! `main.rs` only calls [`main`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod parse;
pub mod top;

/// Governor: a per-node resource governor for deep-learning training jobs.
#[derive(Debug, Parser)]
#[command(name = "governor", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax, e.g. `info`, `governor=debug`); RUST_LOG also works.
    #[arg(long, global = true, env = "GOVERNOR_LOG_LEVEL")]
    pub log_level: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parse training-log files and print their records (or a summary) as JSON lines.
    Parse(parse::ParseArgs),
    /// List the supported training-log formats with a one-line example each.
    Formats,
    /// Live per-cgroup CPU use, run-queue wait and context switches from the eBPF maps.
    Top(top::TopArgs),
}

/// Initialise tracing to stderr from `--log-level` or RUST_LOG (default `warn` for one-shot
/// commands so that their stdout stays machine-readable).
pub fn init_tracing(level: Option<&str>, default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(l) => EnvFilter::new(l),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_level.as_deref(), "warn");
    match cli.command {
        Command::Parse(args) => parse::run_parse(args),
        Command::Formats => parse::run_formats(),
        Command::Top(args) => top::run_top(args),
    }
}
