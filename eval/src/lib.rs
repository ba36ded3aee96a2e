//! Governor's evaluation: the benchmarks that measure it on real processes, real kernels and
//! the VM bed, and govsim calibrated to the real runs.
//!
//! - [`bench_real`]: real training processes (TensorFlow/Keras, scikit-learn, the scripts in
//!   `eval/realjobs/`) under each node policy against `fair`; its summary carries govsim
//!   calibrated to the runs (`calibrate`);
//! - [`bench_daemon`]: CPU and memory of the release daemon governing 1,000 simulated jobs;
//! - [`bench_move`]: what moving a job costs (CRIU in the VM bed, or a framework checkpoint
//!   through the real coordinator);
//! - [`bench_ebpf`]: the eBPF CPU accounting's overhead, host and VM.
//!
//! Each is a subcommand of the `goveval` binary, and `cargo xtask bench-*` forwards to the same
//! [`Command`] (xtask flattens it into its own subcommands and calls [`run`]), so the commands
//! users know keep working. The demo (`cargo xtask demo`) stays in xtask and runs the real-job
//! benchmark's jobs through [`bench_real`]'s public items.
//!
//! Running commands, the tool set-up and the VM bed are `governor-testbed`'s, which xtask uses
//! too: a crate below both, because xtask depends on this one (the demo, the forwarding) and a
//! dependency back on xtask would be a cycle.
#![forbid(unsafe_code)]

use anyhow::Result;

pub mod bench_daemon;
pub mod bench_ebpf;
pub mod bench_move;
pub mod bench_real;
mod calibrate;
mod contention;
mod procfs;

/// The evaluation's commands: `goveval <COMMAND>`, and the same under `cargo xtask`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
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
}

/// Run one of the evaluation's commands.
pub fn run(command: &Command) -> Result<()> {
    match command {
        Command::BenchDaemon(args) => bench_daemon::run(args),
        Command::BenchEbpf(args) => bench_ebpf::run(args),
        Command::BenchReal(args) => bench_real::run(args),
        Command::BenchMove(args) => bench_move::run(args),
    }
}

/// The least-squares line through `points`: `(intercept, slope)`, or `None` with fewer than two
/// points or no spread in x.
pub(crate) fn least_squares(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx;
    Some((my - slope * mx, slope))
}
