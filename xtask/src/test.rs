//! `cargo xtask test`: everything CI runs, in order, stopping at the first failure: fmt, clippy,
//! unit and host tests, the privileged host tests this machine allows, about a minute of fuzzing
//! (`cargo xtask fuzz`), then the VM tests.

use std::path::Path;

use anyhow::Result;

use crate::cmd;
use crate::fuzz::FuzzArgs;
use crate::vm::{self, VmTestArgs};

/// Arguments of `cargo xtask test`.
#[derive(Debug, clap::Args)]
pub(crate) struct TestArgs {
    /// Skip the VM tests (quick local check; CI never uses this).
    #[arg(long)]
    pub no_vm: bool,
}

/// Clippy on the eBPF programs as they are built: nightly, `bpfel-unknown-none`, `core` only
/// (in a target directory of its own: the build's RUSTFLAGS differ).
fn ebpf_clippy() -> std::process::Command {
    let mut c = cmd::nightly("cargo");
    c.args(["clippy", "-p", "governor-ebpf", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(cmd::target_dir().join("ebpf-clippy"))
        .args(["--", "-D", "warnings"]);
    c
}

/// The host tests that need root and the host's own kernel (`#[ignore = "root-host: ..."]`,
/// named `root_host_*`): each group runs where its precondition holds, and the output says which
/// ran and which could not.
fn privileged_host_tests() -> Result<()> {
    let root = cmd::is_root();
    let v1_cpu = Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists();
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    let groups = [
        (
            "root_host_ebpf_",
            "eBPF programs loaded into the host kernel",
            root && btf,
            "needs root and /sys/kernel/btf/vmlinux",
        ),
        (
            "root_host_proc_",
            "the kernel's process connector (netlink)",
            root,
            "needs root (CAP_NET_ADMIN)",
        ),
        (
            "root_host_v1_",
            "the host's cgroup v1 cpu controller",
            root && v1_cpu,
            "needs root and a cgroup v1 cpu controller at /sys/fs/cgroup/cpu (a hybrid host)",
        ),
    ];
    // The jobs that log only to a tracking back-end (tests/tests/tracking_backends.rs) need the
    // real writers: PyTorch, Lightning, TensorFlow/Keras, MLflow, ~7.7 GB and ~26 min to install
    // from PyPI on this machine kind (2026-11-28), too much for a CI run to pay each time. They run
    // where that environment was installed once (`cargo xtask writer-fixtures` installs it).
    let writers = crate::writers::installed();
    for (prefix, what, can, why_not) in groups {
        if can {
            eprintln!("== privileged host tests: {what} ({prefix}*)");
            let mut c = cmd::cargo();
            c.args([
                "test",
                "--workspace",
                "--exclude",
                "governor-ebpf",
                "--",
                "--ignored",
                prefix,
            ]);
            if prefix == "root_host_v1_" {
                match &writers {
                    Some(python) => {
                        c.env("GOVERNOR_WRITERS_PYTHON", python);
                    }
                    None => {
                        eprintln!(
                            "== privileged host test NOT RUN: {TRACKING_TEST} (needs the tracking back-ends' Python environment, {}: `cargo xtask writer-fixtures` installs it)",
                            crate::writers::venv().display()
                        );
                        c.args(["--skip", TRACKING_TEST]);
                    }
                }
            }
            cmd::run(&mut c)?;
        } else {
            eprintln!("== privileged host tests NOT RUN: {what} ({prefix}*): {why_not}");
        }
    }
    Ok(())
}

/// The host test that runs the real tracking back-ends under `governor run-job`.
const TRACKING_TEST: &str = "root_host_v1_jobs_logging_only_to_a_tracking_backend";

/// Run one stage and say how long it took (`== [timing] NAME: N s`), so that a CI log that
/// ends in a failure or a time-out still shows where the time went before it.
fn timed<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = std::time::Instant::now();
    let result = f();
    eprintln!(
        "== [timing] {name}: {:.0} s{}",
        started.elapsed().as_secs_f64(),
        if result.is_err() { " (failed)" } else { "" }
    );
    result
}

pub(crate) fn run(args: &TestArgs) -> Result<()> {
    let started = std::time::Instant::now();
    timed("setup", crate::setup::run)?;
    cmd::report_free_disk("after setup");
    eprintln!("== cargo fmt --check");
    cmd::run(cmd::cargo().args(["fmt", "--all", "--", "--check"]))?;
    eprintln!("== cargo clippy -D warnings");
    timed("clippy", || {
        cmd::run(cmd::cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    eprintln!("== cargo clippy -D warnings (the eBPF crate, for its BPF target)");
    timed("clippy (eBPF)", || cmd::run(&mut ebpf_clippy()))?;
    cmd::report_free_disk("after clippy");
    eprintln!("== unit and host tests (need neither root nor a particular cgroup layout)");
    // Setup installed Prometheus and Chromium: the observability test must not skip here.
    timed("unit and host tests (build and run)", || {
        cmd::run(
            cmd::cargo()
                .args(["test", "--workspace", "--exclude", "governor-ebpf"])
                .env("GOVERNOR_REQUIRE_TOOLS", "1"),
        )
    })?;
    timed(
        "tracking back-ends, live",
        || match crate::writers::installed() {
            Some(python) => {
                eprintln!(
                    "== real writers followed live (governor-progress/tests/progress_live_writers.rs)"
                );
                cmd::run(
                    cmd::cargo()
                        .args([
                            "test",
                            "-p",
                            "governor-progress",
                            "--test",
                            "progress_live_writers",
                        ])
                        .args(["--", "--ignored"])
                        .env("GOVERNOR_WRITERS_PYTHON", python),
                )
            }
            None => {
                eprintln!(
                    "== live tracking back-end tests NOT RUN: no writers' environment at {} (`cargo xtask writer-fixtures` installs it: 7.7 GB, ~26 min measured)",
                    crate::writers::venv().display()
                );
                Ok(())
            }
        },
    )?;
    timed("privileged host tests", privileged_host_tests)?;
    cmd::report_free_disk("after host tests");
    timed("fuzzing", || crate::fuzz::run(&FuzzArgs::default()))?;
    cmd::report_free_disk("after fuzzing");
    if args.no_vm {
        eprintln!("== VM tests skipped (--no-vm)");
    } else {
        timed("VM tests, one node", || {
            vm::run_vm_test(&VmTestArgs {
                filter: None,
                nodes: None,
                timeout_minutes: 45,
                unprivileged: false,
            })
        })?;
        timed("VM tests, three nodes", || {
            vm::run_vm_test(&VmTestArgs {
                filter: None,
                nodes: Some(3),
                // 17-25 min measured (2026-11-26, with the preemption scenario).
                timeout_minutes: 40,
                unprivileged: false,
            })
        })?;
    }
    cmd::report_free_disk("at the end");
    eprintln!(
        "== all tests passed in {:.1} min",
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(())
}
