//! `cargo xtask test`: everything CI runs, in order, stopping at the first failure.

use anyhow::Result;

use crate::cmd;
use crate::vm::{self, VmTestArgs};

/// Arguments of `cargo xtask test`.
#[derive(Debug, clap::Args)]
pub(crate) struct TestArgs {
    /// Skip the VM tests (quick local check; CI never uses this).
    #[arg(long)]
    pub no_vm: bool,
}

pub(crate) fn run(args: &TestArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let bed = crate::setup::run()?;
    let _ = bed;
    cmd::report_free_disk("after setup");
    eprintln!("== cargo fmt --check");
    cmd::run(cmd::cargo().args(["fmt", "--all", "--", "--check"]))?;
    eprintln!("== cargo clippy -D warnings");
    cmd::run(cmd::cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "governor-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    cmd::report_free_disk("after clippy");
    eprintln!("== unit and host tests");
    cmd::run(cmd::cargo().args(["test", "--workspace", "--exclude", "governor-ebpf"]))?;
    cmd::report_free_disk("after host tests");
    if args.no_vm {
        eprintln!("== VM tests skipped (--no-vm)");
    } else {
        vm::run_vm_test(&VmTestArgs {
            filter: None,
            nodes: None,
            timeout_minutes: 45,
        })?;
        vm::run_vm_test(&VmTestArgs {
            filter: None,
            nodes: Some(3),
            timeout_minutes: 30,
        })?;
    }
    cmd::report_free_disk("at the end");
    eprintln!(
        "== all tests passed in {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}
