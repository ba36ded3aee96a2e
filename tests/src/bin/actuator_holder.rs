//! `actuator_holder STATE_FILE JOB [--recover-only]`: a stand-in for the daemon's actuation
//! life cycle, used by the VM tests to check restore on real signals. It recovers what a previous
//! run left, applies a fixed allocation to JOB (a cgroup path relative to /sys/fs/cgroup), prints
//! `applied`, then waits for SIGTERM or SIGINT and restores every original before exiting 0.
//! With `--recover-only` it only recovers (the restart after a SIGKILL) and prints `recovered N`.
use std::io::Write;
use std::time::Instant;

use governor::cgroup::{Actuator, ActuatorConfig, Hierarchy, JobCgroup};
use governor::policy::{Allocation, Category, CpuAllocation, MemoryAllocation};
use nix::sys::signal::{SigSet, Signal};

/// What the holder applies (the VM test checks these values).
const WEIGHT: u32 = 321;
const MAX_CORES: f64 = 0.25;
const MEMORY_HIGH: u64 = 256 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(state), Some(job)) = (args.first(), args.get(1)) else {
        eprintln!("usage: actuator_holder STATE_FILE JOB [--recover-only]");
        std::process::exit(2);
    };
    let recover_only = args.iter().any(|a| a == "--recover-only");
    // Block the signals before anything else so one sent early is not lost.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().expect("block SIGTERM/SIGINT");

    let hierarchy = Hierarchy::detect("/sys/fs/cgroup").expect("cgroup hierarchy");
    let config = ActuatorConfig {
        state_file: state.into(),
        ..ActuatorConfig::default()
    };
    let mut actuator = Actuator::new(hierarchy, config).expect("actuator");
    let report = actuator.recover();
    assert!(
        report.errors.is_empty(),
        "recover failed: {:?}",
        report.errors
    );
    if recover_only {
        println!("recovered {}", report.restored.len());
        return;
    }
    let job = JobCgroup::new(job).expect("job cgroup path");
    let alloc = Allocation {
        category: Category::Converged,
        cpu: CpuAllocation {
            weight: WEIGHT,
            max_cores: Some(MAX_CORES),
        },
        memory: MemoryAllocation {
            high_bytes: Some(MEMORY_HIGH),
            max_bytes: None,
        },
        reason: "actuator_holder".into(),
    };
    let out = actuator.apply(&job, &alloc, Instant::now()).expect("apply");
    assert!(out.errors.is_empty(), "apply failed: {:?}", out.errors);
    println!("applied {}", out.written.len());
    std::io::stdout().flush().expect("stdout");
    let signal = signals.wait().expect("sigwait");
    let report = actuator.restore_all();
    assert!(
        report.errors.is_empty(),
        "restore failed: {:?}",
        report.errors
    );
    println!("{signal:?}: restored {}", report.restored.len());
}
