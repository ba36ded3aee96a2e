//! `cargo xtask`: the project's chores. Every command that needs tools runs `setup` first, so the
//! two README commands (`cargo xtask demo`, `cargo xtask test`) work on a fresh machine.
//!
//! xtask keeps the set-up, the tests (host, privileged, VM), fuzzing, the writers' fixtures and
//! the demo. The evaluation (`bench-real` with govsim calibrated to it, `bench-daemon`,
//! `bench-move`, `bench-ebpf`) is the `governor-eval` crate's (`goveval`): its subcommands are
//! flattened into xtask's, so `cargo xtask bench-real ...` parses and runs exactly what
//! `goveval bench-real ...` does. Running commands, the set-up and booting VM guests are
//! `governor-testbed`'s, which both use.
#![forbid(unsafe_code)]

mod demo;
mod fuzz;
mod purity;
mod soak;
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
    /// The replicated control plane (three coordinator replicas on etcd, three daemons) under a
    /// few dozen random faults; checks that every job completed once, unharmed, on one node.
    Soak(soak::SoakArgs),
    /// Run the integration tests inside the VM (real cgroup v2 kernel), or a multi-node scenario.
    VmTest(vm::VmTestArgs),
    /// The main job: real training jobs on this machine's cores, sized to it, under fair and
    /// under Governor, then a sweep with and without its trial budget (`--short`: CI's version;
    /// in the VM bed where this host does not let it govern).
    Demo(demo::DemoArgs),
    /// The evaluation (`bench-daemon`, `bench-ebpf`, `bench-real`, `bench-move`): governor-eval's
    /// commands, the same as `goveval`'s.
    #[command(flatten)]
    Eval(governor_eval::Command),
    /// Regenerate governor-progress's real-writer fixtures (TensorBoard event files, MLflow
    /// stores, Keras JSON lines) with the writers themselves, installed from PyPI into
    /// target/writers/venv.
    WriterFixtures,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => governor_testbed::setup::run().map(|_| ()),
        Command::Test(args) => test::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Soak(args) => soak::run(&args),
        Command::VmTest(args) => vm::run_vm_test(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Eval(command) => governor_eval::run(&command),
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
