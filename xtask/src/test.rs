//! `cargo xtask test`: everything CI runs, in order, stopping at the first failure: fmt, the pure
//! crates' dependency check, clippy, unit and host tests, the privileged host tests
//! (`root_host_*`), the demo's short version (`cargo xtask demo --short`), about a minute of
//! fuzzing (`cargo xtask fuzz`), then the VM tests.
//!
//! A privileged group runs where its precondition holds (root, kernel BTF, the v1 cpu
//! controller). Where it does not, a developer's machine says so and goes on; in CI (`CI` set)
//! or under `GOVERNOR_REQUIRE_PRIVILEGED=1` the command fails at once, naming the group and what
//! is missing, unless the machine opts out of that group by saying why:
//! `GOVERNOR_SKIP_ROOT_HOST_EBPF="this runner's kernel has no BTF"` (the log shows the reason).

use std::path::Path;

use anyhow::{Result, bail};
use governor_testbed::cmd;

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

/// What a privileged group needs of the machine.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Need {
    Root,
    Btf,
    V1Cpu,
}

impl Need {
    fn present(self) -> bool {
        match self {
            Need::Root => cmd::is_root(),
            Need::Btf => Path::new("/sys/kernel/btf/vmlinux").exists(),
            Need::V1Cpu => Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Need::Root => "root",
            Need::Btf => "kernel BTF (/sys/kernel/btf/vmlinux)",
            Need::V1Cpu => "a cgroup v1 cpu controller at /sys/fs/cgroup/cpu (a hybrid host)",
        }
    }
}

/// A group of host tests that need root and the host's own kernel (`#[ignore = "root-host:
/// ..."]`, named `root_host_<group>_*`).
struct Group {
    prefix: &'static str,
    what: &'static str,
    needs: &'static [Need],
}

const GROUPS: [Group; 4] = [
    Group {
        prefix: "root_host_ebpf_",
        what: "eBPF programs loaded into the host kernel",
        needs: &[Need::Root, Need::Btf],
    },
    Group {
        prefix: "root_host_proc_",
        what: "the kernel's process connector (netlink, CAP_NET_ADMIN)",
        needs: &[Need::Root],
    },
    Group {
        prefix: "root_host_user_",
        what: "cluster jobs started as another user (setuid)",
        needs: &[Need::Root],
    },
    Group {
        prefix: "root_host_v1_",
        what: "the host's cgroup v1 cpu controller",
        needs: &[Need::Root, Need::V1Cpu],
    },
];

/// Set (to anything but `0`) to make a privileged group that cannot run fail `cargo xtask test`,
/// as CI (`CI` set) does.
const REQUIRE_ENV: &str = "GOVERNOR_REQUIRE_PRIVILEGED";

/// The variable through which a machine opts out of a group, its value saying why:
/// `GOVERNOR_SKIP_ROOT_HOST_V1="this runner is an unprivileged container"`.
fn opt_out_var(prefix: &str) -> String {
    format!(
        "GOVERNOR_SKIP_{}",
        prefix.trim_end_matches('_').to_ascii_uppercase()
    )
}

/// Whether every privileged group must run: in CI (`CI` set, as `.ci/run` and most CI services
/// do, and not `false`/`0`) or when `GOVERNOR_REQUIRE_PRIVILEGED` is set (not `0`).
fn privileged_required(ci: Option<&str>, require: Option<&str>) -> bool {
    let on = |v: Option<&str>| {
        v.map(str::trim)
            .is_some_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
    };
    on(ci) || on(require)
}

/// What `cargo xtask test` does with one privileged group.
#[derive(Debug, PartialEq)]
enum Decision {
    Run,
    /// The machine opted out, saying why (logged).
    OptedOut(String),
    /// It cannot run here and nothing requires it (a developer's machine): said, not failed.
    NotRun(String),
    /// The command fails with this line.
    Fail(String),
}

/// The decision for group `prefix` given what it lacks on this machine (`missing`, described),
/// whether groups are required to run, and the machine's opt-out statement (its variable's
/// value), if any. Pure, so that every case is unit-tested.
fn decide(prefix: &str, missing: &[&str], required: bool, opt_out: Option<&str>) -> Decision {
    let var = opt_out_var(prefix);
    match opt_out.map(str::trim) {
        Some("") => {
            return Decision::Fail(format!(
                "{prefix}*: {var} is set but says no reason; set it to why this machine cannot run the group"
            ));
        }
        Some(reason) => return Decision::OptedOut(format!("{var} says: {reason}")),
        None => {}
    }
    if missing.is_empty() {
        return Decision::Run;
    }
    let missing = format!("missing {}", missing.join(", "));
    if required {
        Decision::Fail(format!(
            "{prefix}* cannot run on this machine: {missing} (CI or {REQUIRE_ENV} requires it; \
             to skip it here, set {var} to the reason, which the log then shows)"
        ))
    } else {
        Decision::NotRun(missing)
    }
}

/// Each privileged group's decision on this machine; fails, one line per group, when one is
/// required and cannot run (checked before anything is built, so CI fails at once).
fn privileged_plan() -> Result<Vec<(&'static Group, Decision)>> {
    let required = privileged_required(
        std::env::var("CI").ok().as_deref(),
        std::env::var(REQUIRE_ENV).ok().as_deref(),
    );
    let plan: Vec<_> = GROUPS
        .iter()
        .map(|g| {
            let missing: Vec<&str> = g
                .needs
                .iter()
                .filter(|n| !n.present())
                .map(|n| n.describe())
                .collect();
            let opt_out = std::env::var(opt_out_var(g.prefix)).ok();
            (g, decide(g.prefix, &missing, required, opt_out.as_deref()))
        })
        .collect();
    let failures: Vec<&str> = plan
        .iter()
        .filter_map(|(_, d)| match d {
            Decision::Fail(line) => Some(line.as_str()),
            _ => None,
        })
        .collect();
    if !failures.is_empty() {
        bail!(
            "privileged host tests cannot run:\n  {}",
            failures.join("\n  ")
        );
    }
    // Said at the start too, so that a log that ends before the stage still shows it.
    for (g, d) in &plan {
        if let Decision::OptedOut(why) = d {
            eprintln!(
                "== privileged host tests {}* will be skipped: {why}",
                g.prefix
            );
        }
    }
    Ok(plan)
}

/// Runs the groups the plan allows, saying for each of the others why it did not run.
fn privileged_host_tests(plan: &[(&'static Group, Decision)], writers: &Path) -> Result<()> {
    for (g, d) in plan {
        match d {
            Decision::Run => {
                eprintln!("== privileged host tests: {} ({}*)", g.what, g.prefix);
                let mut c = cmd::cargo();
                c.args([
                    "test",
                    "--workspace",
                    "--exclude",
                    "governor-ebpf",
                    "--",
                    "--ignored",
                    g.prefix,
                ]);
                if g.prefix == "root_host_v1_" {
                    // The jobs that log only to a tracking back-end
                    // (tests/tests/tracking_backends.rs) run in the writers' environment.
                    c.env("GOVERNOR_WRITERS_PYTHON", writers);
                }
                cmd::run(&mut c)?;
            }
            Decision::OptedOut(why) => {
                eprintln!(
                    "== privileged host tests SKIPPED: {} ({}*): {why}",
                    g.what, g.prefix
                )
            }
            Decision::NotRun(missing) => {
                eprintln!(
                    "== privileged host tests NOT RUN: {} ({}*): {missing} (CI would fail here)",
                    g.what, g.prefix
                )
            }
            Decision::Fail(line) => bail!("{line}"),
        }
    }
    Ok(())
}

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
    // Before anything is built: a privileged group that must run here and cannot fails at once.
    let privileged = privileged_plan()?;
    timed("setup", governor_testbed::setup::run)?;
    cmd::report_free_disk("after setup");
    // The tracking back-ends' environment (6.6 GB from PyPI, mostly download and unpacking,
    // 193 s on an idle machine): installed beside clippy's build, joined where its tests run.
    let writers_install = std::thread::spawn(|| {
        let started = std::time::Instant::now();
        (crate::writers::python(), started.elapsed())
    });
    eprintln!("== cargo fmt --check");
    cmd::run(cmd::cargo().args(["fmt", "--all", "--", "--check"]))?;
    eprintln!(
        "== pure crates' dependencies (no {} in {})",
        crate::purity::FORBIDDEN.join(", "),
        crate::purity::PURE_CRATES.join(", ")
    );
    timed("pure crates' dependencies", crate::purity::check)?;
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
    // The real tracking back-ends (PyTorch, Lightning, TensorFlow/Keras, MLflow): the jobs that
    // log only through one of them are governed in the privileged host tests, and the watcher
    // follows them live here. Installed from PyPI once per environment (see `writers`).
    let waited = std::time::Instant::now();
    let (writers, took) = writers_install
        .join()
        .map_err(|_| anyhow::anyhow!("installing the tracking back-ends panicked"))?;
    eprintln!(
        "== [timing] tracking back-ends' environment: {:.0} s beside the stages above, {:.0} s waited for",
        took.as_secs_f64(),
        waited.elapsed().as_secs_f64()
    );
    let writers = writers?;
    eprintln!("== real writers followed live (governor-watch/tests/progress_live_writers.rs)");
    timed("tracking back-ends, live", || {
        cmd::run(
            cmd::cargo()
                .args([
                    "test",
                    "-p",
                    "governor-watch",
                    "--test",
                    "progress_live_writers",
                ])
                .args(["--", "--ignored"])
                .env("GOVERNOR_WRITERS_PYTHON", &writers),
        )
    })?;
    timed("privileged host tests", || {
        privileged_host_tests(&privileged, &writers)
    })?;
    cmd::report_free_disk("after host tests");
    // The README's first command, small: it must not break unnoticed again.
    eprintln!("== the demo, short (`cargo xtask demo --short`)");
    timed("demo (short)", || {
        crate::demo::run(&crate::demo::DemoArgs {
            short: true,
            policy: governor_policy::DEFAULT_POLICY.into(),
            ..Default::default()
        })
    })?;
    cmd::report_free_disk("after the demo");
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
                // 17-25 min measured (2026-11-26, with the preemption scenario); 21 min with
                // the replicas on etcd (2026-11-30, about 2 min of it).
                timeout_minutes: 45,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_or_the_requirement_variable_makes_every_group_required() {
        assert!(!privileged_required(None, None));
        assert!(privileged_required(Some("true"), None));
        assert!(privileged_required(Some("1"), None));
        assert!(privileged_required(None, Some("1")));
        assert!(privileged_required(Some("false"), Some("yes")));
        for off in ["", " ", "0", "false", "FALSE"] {
            assert!(!privileged_required(Some(off), None), "CI={off:?}");
            assert!(
                !privileged_required(None, Some(off)),
                "{REQUIRE_ENV}={off:?}"
            );
        }
    }

    #[test]
    fn a_group_runs_where_nothing_is_missing() {
        assert_eq!(decide("root_host_v1_", &[], false, None), Decision::Run);
        assert_eq!(decide("root_host_v1_", &[], true, None), Decision::Run);
    }

    #[test]
    fn a_group_that_cannot_run_is_reported_outside_ci_and_fails_in_ci() {
        assert_eq!(
            decide("root_host_ebpf_", &["root", "kernel BTF"], false, None),
            Decision::NotRun("missing root, kernel BTF".into())
        );
        let Decision::Fail(line) = decide("root_host_ebpf_", &["kernel BTF"], true, None) else {
            panic!("a required group that cannot run must fail");
        };
        assert!(line.starts_with("root_host_ebpf_* cannot run"), "{line}");
        assert!(line.contains("missing kernel BTF"), "{line}");
        assert!(line.contains("GOVERNOR_SKIP_ROOT_HOST_EBPF"), "{line}");
        assert!(!line.contains('\n'), "one line: {line}");
    }

    #[test]
    fn a_machine_opts_out_of_a_group_only_by_saying_why() {
        let why = "this runner is an unprivileged container";
        for (missing, required) in [
            (&["root"][..], true),
            (&["root"][..], false),
            (&[][..], true),
        ] {
            assert_eq!(
                decide("root_host_v1_", missing, required, Some(why)),
                Decision::OptedOut(format!("GOVERNOR_SKIP_ROOT_HOST_V1 says: {why}"))
            );
        }
        for empty in ["", "  "] {
            let d = decide("root_host_v1_", &["root"], true, Some(empty));
            assert!(
                matches!(&d, Decision::Fail(l) if l.contains("says no reason")),
                "{d:?}"
            );
        }
    }

    #[test]
    fn every_group_has_its_own_opt_out_variable() {
        let vars: Vec<String> = GROUPS.iter().map(|g| opt_out_var(g.prefix)).collect();
        assert_eq!(
            vars,
            [
                "GOVERNOR_SKIP_ROOT_HOST_EBPF",
                "GOVERNOR_SKIP_ROOT_HOST_PROC",
                "GOVERNOR_SKIP_ROOT_HOST_USER",
                "GOVERNOR_SKIP_ROOT_HOST_V1"
            ]
        );
    }
}
