//! `cargo xtask`: the project's chores. Every command that needs tools runs `setup` first, so the
//! two README commands (`cargo xtask demo`, `cargo xtask test`) work on a fresh machine.
#![forbid(unsafe_code)]

mod bench_daemon;
mod bench_ebpf;
mod bench_move;
mod bench_real;
mod calibrate;
mod cmd;
mod demo;
mod fuzz;
mod purity;
mod setup;
mod test;
mod vm;
mod writers;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Build, tool set-up, VM tests, demo and benchmarks for Governor.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install everything the project needs (idempotent; each step skips when already done).
    Setup,
    /// Everything CI runs: fmt check, clippy -D warnings, host tests, the privileged host tests
    /// (root), the demo's short version, fuzzing, VM tests (single and multi-node).
    Test(test::TestArgs),
    /// Every fuzz target (libFuzzer, built with nightly) for a bounded time on its committed corpus; a crash
    /// fails, naming the target and the input.
    Fuzz(fuzz::FuzzArgs),
    /// Run the integration tests inside the VM (real cgroup v2 kernel), or a multi-node scenario.
    VmTest(vm::VmTestArgs),
    /// The main job: real training jobs on this machine's cores, sized to it, under fair and
    /// under Governor, then a sweep with and without its trial budget (`--short`: CI's version;
    /// in the VM bed where this host does not let it govern).
    Demo(demo::DemoArgs),
    /// CPU and RSS of the release daemon governing 1,000 simulated jobs (fake cgroup root on tmpfs).
    BenchDaemon(bench_daemon::BenchDaemonArgs),
    /// Overhead of the eBPF CPU accounting (ns/event, events/s) and its read cost, host and VM.
    BenchEbpf(bench_ebpf::BenchEbpfArgs),
    /// Real training processes (TensorFlow/Keras, scikit-learn) on this machine's cores: each
    /// policy against fair on the same arrivals, repeated; JCT, time to quality, CPU, plots.
    BenchReal(bench_real::BenchRealArgs),
    /// What moving a job with CRIU costs in the VM bed: pause, dump, restore and bytes against
    /// the job's memory, with and without pre-dump.
    BenchMove(bench_move::BenchMoveArgs),
    /// Regenerate governor-progress's real-writer fixtures (TensorBoard event files, MLflow
    /// stores, Keras JSON lines) with the writers themselves, installed from PyPI into
    /// target/writers/venv.
    WriterFixtures,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => setup::run().map(|_| ()),
        Command::Test(args) => test::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::VmTest(args) => vm::run_vm_test(&args),
        Command::Demo(args) => demo::run(&args),
        Command::BenchDaemon(args) => bench_daemon::run(&args),
        Command::BenchEbpf(args) => bench_ebpf::run(&args),
        Command::BenchReal(args) => bench_real::run(&args),
        Command::BenchMove(args) => bench_move::run(&args),
        Command::WriterFixtures => writers::regenerate(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nxtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
