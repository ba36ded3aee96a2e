//! Command-line interface of the `governor` binary. Each subcommand lives in its own module;
//! `main.rs` only calls [`main`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod daemon;
pub mod gpus;
pub mod parse;
pub mod run_job;
pub mod status;
pub mod top;

/// Governor: a per-node resource governor for deep-learning training jobs.
#[derive(Debug, Parser)]
#[command(name = "governor", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax, e.g. `info`, `governor=debug`); RUST_LOG also works.
    #[arg(long, global = true, env = "GOVERNOR_LOG_LEVEL")]
    pub log_level: Option<String>,

    /// Print a commented example configuration (/etc/governor/governor.toml) and exit.
    #[arg(long)]
    pub example_config: bool,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node daemon: find training jobs, follow their progress, govern their cgroups.
    Daemon(daemon::DaemonArgs),
    /// Show every governed job: category, progress, CPU and memory, last decision and why.
    Status(status::StatusArgs),
    /// Start a command as a governed job in a cgroup of its own (under governor.slice/jobs).
    RunJob(run_job::RunJobArgs),
    /// Parse training-log files and print their records (or a summary) as JSON lines.
    Parse(parse::ParseArgs),
    /// List the supported training-log formats with a one-line example each.
    Formats,
    /// Live per-cgroup CPU use, run-queue wait and context switches from the eBPF maps.
    Top(top::TopArgs),
    /// Read-only check of the GPUs through NVML: inventory, compute processes and their
    /// cgroups, energy over an interval. Changes no device setting.
    Gpus(gpus::GpusArgs),
    /// Internal: the parent the daemon puts between itself and a coordinator job, so that the
    /// job's exit status survives a restart of the daemon (see the `supervise` module).
    #[command(hide = true)]
    Supervise(crate::supervise::SuperviseArgs),
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
    if cli.example_config {
        print!("{}", crate::config::EXAMPLE_CONFIG);
        return ExitCode::SUCCESS;
    }
    let Some(command) = cli.command else {
        eprintln!("governor: a subcommand is required (see `governor --help`)");
        return ExitCode::from(2);
    };
    let default_level = if matches!(command, Command::Daemon(_)) {
        "info"
    } else {
        "warn"
    };
    init_tracing(cli.log_level.as_deref(), default_level);
    match command {
        Command::Daemon(args) => daemon::run(args),
        Command::Status(args) => status::run(args),
        Command::RunJob(args) => run_job::run(args),
        Command::Parse(args) => parse::run_parse(args),
        Command::Formats => parse::run_formats(),
        Command::Top(args) => top::run_top(args),
        Command::Gpus(args) => gpus::run(args),
        Command::Supervise(args) => crate::supervise::run(args),
    }
}
