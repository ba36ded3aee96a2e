//! `cargo xtask soak`: the replicated control plane under a few dozen random faults (issue 34):
//! three coordinator replicas on a three-member etcd cluster on loopback, three real daemons,
//! jobs submitted and moved while the leader is killed and paused, etcd members are killed and
//! nodes are cut off; then every job must have completed exactly once, with the loss curve of
//! the run that never moved, and never on two nodes at once. The test is
//! `soak_random_faults` in `tests/tests/cluster_soak.rs`; `cargo xtask test` runs its short
//! version (each kind of fault once).

use anyhow::Result;
use governor_testbed::cmd;

/// Arguments of `cargo xtask soak`.
#[derive(Debug, clap::Args)]
pub(crate) struct SoakArgs {
    /// How many faults to inject (each kind once first, then random kinds).
    #[arg(long, default_value_t = 36)]
    pub faults: u32,
    /// The seed of the faults' order, kinds and durations (a failing run names its seed).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub(crate) fn run(args: &SoakArgs) -> Result<()> {
    governor_testbed::setup::run()?;
    let started = std::time::Instant::now();
    // The daemon and coordinator binaries the soak starts.
    cmd::run(cmd::cargo().args(["build", "-p", "governor", "-p", "coordinator"]))?;
    let mut c = cmd::cargo();
    c.args([
        "test",
        "-p",
        "governor-integration-tests",
        "--test",
        "cluster_soak",
        "--",
        "--ignored",
        "--exact",
        "soak_random_faults",
        "--nocapture",
    ])
    .env("GOVERNOR_SOAK_FAULTS", args.faults.to_string())
    .env("GOVERNOR_SOAK_SEED", args.seed.to_string())
    .env("GOVERNOR_REQUIRE_TOOLS", "1");
    cmd::run(&mut c)?;
    eprintln!(
        "== soak passed: {} faults, seed {}, in {:.0} s",
        args.faults,
        args.seed,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
