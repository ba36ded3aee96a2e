//! `cargo xtask vm-test`: the integration tests in the VM bed (one guest, or N guests on one
//! network for the multi-node scenarios). Booting a guest and following its log is
//! [`governor_testbed::vm`]'s.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use governor_testbed::cmd;
use governor_testbed::setup::{self, Bed};
use governor_testbed::vm::{
    GuestSpec, LogFollower, guest_epilogue, guest_prologue, guest_rc, new_run_dir, spawn_guest,
    wait_guests,
};

/// Arguments of `cargo xtask vm-test`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct VmTestArgs {
    /// Run only the tests whose name contains FILTER (libtest filter).
    pub filter: Option<String>,
    /// Boot N guests on one shared L2 segment (10.10.0.1 .. 10.10.0.N) and run the multi-node
    /// scenarios (tests named `multinode_*`, or those FILTER names: it must start with
    /// `multinode_`) in every guest.
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    /// Give up on the guests after this many minutes.
    #[arg(long, default_value_t = 45)]
    pub timeout_minutes: u64,
    /// Instead of the VM tests: run the plain `cargo test` of the whole workspace (every test
    /// not marked ignored) as an unprivileged user (uid 65534) in the guest, whose kernel has
    /// only cgroup v2: the check that the default test run needs neither root nor a hybrid host.
    #[arg(long, conflicts_with = "nodes")]
    pub unprivileged: bool,
}

/// The project's binaries the guests run (from `target/debug`, shared with them over 9p).
const GUEST_BINARIES: [&str; 5] = [
    "governor",
    "govctl",
    "coordinator",
    "demo-trainer",
    "memhog",
];

/// Build every test of the workspace (`cargo test --workspace --exclude governor-ebpf
/// --no-run`, the very build of `cargo xtask test`'s unit stage, so that after it nothing is
/// built again) and return the test executables cargo reports, each with its `target.kind`
/// and package id, sorted by path.
///
/// Cargo builds a package's binaries with its integration tests, so this builds the daemon,
/// govctl, the coordinator and the test programs too. (A `cargo build --bins -p ...` of the
/// same packages resolves other features, `tokio/test-util` among them, and compiled tokio,
/// tonic and every crate of ours again: 153 s here.)
fn build_workspace_tests(what: &str) -> Result<Vec<(PathBuf, serde_json::Value)>> {
    eprintln!("== building {what} (host)");
    let json = cmd::output(cmd::cargo().args([
        "test",
        "--workspace",
        "--exclude",
        "governor-ebpf",
        "--no-run",
        "--message-format=json",
    ]))?;
    let mut exes: Vec<(PathBuf, serde_json::Value)> = json
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["profile"]["test"] == true)
        .filter_map(|v| Some((PathBuf::from(v["executable"].as_str()?), v)))
        .collect();
    exes.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(exes)
}

/// Build the integration test binaries and the project's binaries; return the integration
/// test executables of `governor-integration-tests`.
pub(crate) fn build_test_binaries() -> Result<Vec<PathBuf>> {
    let exes: Vec<PathBuf> = build_workspace_tests("the integration tests and binaries")?
        .into_iter()
        .filter(|(_, v)| {
            v["target"]["kind"][0] == "test"
                && v["package_id"]
                    .as_str()
                    .is_some_and(|id| id.contains("governor-integration-tests"))
        })
        .map(|(exe, _)| exe)
        .collect();
    if exes.is_empty() {
        bail!("cargo built no integration test executables for governor-integration-tests");
    }
    let missing: Vec<&str> = GUEST_BINARIES
        .into_iter()
        .filter(|name| !bin_dir().join(name).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "the test build left no {} in {}",
            missing.join(", "),
            bin_dir().display()
        );
    }
    Ok(exes)
}

/// Every test executable of the workspace (unit, integration and doc-less), built on the host.
fn build_workspace_test_binaries() -> Result<Vec<PathBuf>> {
    Ok(build_workspace_tests("every test of the workspace")?
        .into_iter()
        .map(|(exe, _)| exe)
        .collect())
}

/// Runs each executable as uid/gid 65534 with no capabilities, from /tmp.
fn unprivileged_loop(exes: &[&PathBuf]) -> String {
    let mut s = String::from("rc=0\nchmod 1777 /tmp\n");
    for exe in exes {
        let e = shell_quote(&exe.display().to_string());
        s.push_str(&format!(
            "echo \"== $(basename {e}) (uid 65534)\"\n(cd /tmp && setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all env HOME=/tmp TMPDIR=/tmp {e} --test-threads=2) || rc=1\n"
        ));
    }
    s
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `cargo xtask vm-test [FILTER] [--nodes N]`.
pub(crate) fn run_vm_test(args: &VmTestArgs) -> Result<()> {
    let bed = setup::run()?;
    if args.unprivileged {
        let exes = build_workspace_test_binaries()?;
        return run_single(&bed, &exes, args);
    }
    let exes = build_test_binaries()?;
    match args.nodes {
        None | Some(1) => run_single(&bed, &exes, args),
        Some(0) => bail!("--nodes must be at least 1"),
        Some(n) => run_multi(&bed, &exes, n, args),
    }
}

/// The test binary's name without cargo's hash suffix (`vm_daemon-1a2b...` -> `vm_daemon`).
fn binary_name(exe: &Path) -> String {
    let stem = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
        _ => stem,
    }
}

/// FILTER selects whole test binaries when it names one (`vm_daemon`), otherwise it is a
/// libtest name filter applied in every binary.
fn select<'a>(exes: &'a [PathBuf], filter: Option<&str>) -> (Vec<&'a PathBuf>, Option<String>) {
    match filter {
        Some(f) if exes.iter().any(|e| binary_name(e) == f) => {
            (exes.iter().filter(|e| binary_name(e) == f).collect(), None)
        }
        Some(f) => (exes.iter().collect(), Some(f.to_owned())),
        None => (exes.iter().collect(), None),
    }
}

/// Sum `N passed; M failed` over libtest's result lines; a run that executed nothing is a
/// failure (a filter that matches nothing must not pass silently).
fn tests_run(log: &str) -> usize {
    log.lines()
        .filter_map(|l| l.split("test result: ").nth(1))
        .map(|r| {
            let num = |word: &str| {
                r.split("; ")
                    .find_map(|p| {
                        p.trim_start_matches(|c: char| !c.is_ascii_digit())
                            .strip_suffix(word)?
                            .trim()
                            .parse::<usize>()
                            .ok()
                    })
                    .unwrap_or(0)
            };
            num("passed") + num("failed")
        })
        .sum()
}

/// Tests named so need root on the host itself (its kernel, its cgroup v1 controllers):
/// `cargo xtask test` runs them on the host, never in a guest.
pub(crate) const ROOT_HOST_PREFIX: &str = "root_host_";

/// Ignored tests named so are benchmarks an xtask command runs (`bench-move --framework`), not
/// tests for the VM bed.
pub(crate) const BENCH_PREFIX: &str = "bench_";

/// Ignored tests named so are the long soak `cargo xtask soak` runs (its short version is a plain
/// test); the one-node bed ran it by accident, 252 s of every `cargo xtask test` (2026-11-30).
pub(crate) const SOAK_PREFIX: &str = "soak_";

/// What the one-node bed leaves out of `--ignored` (libtest's `--skip` matches a part of the
/// name): the multi-node scenarios (`--nodes N` runs them) and the ignored tests of other
/// commands. Every other ignored integration test says `#[ignore = "vm: ..."]` and runs there.
const ONE_NODE_SKIPS: [&str; 4] = ["multinode_", ROOT_HOST_PREFIX, BENCH_PREFIX, SOAK_PREFIX];

/// libtest's arguments that leave [`ONE_NODE_SKIPS`] out.
fn one_node_skip_args() -> String {
    ONE_NODE_SKIPS
        .iter()
        .map(|p| format!("--skip {p}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn test_loop(exes: &[&PathBuf], test_args: &str) -> String {
    let mut s = String::from("rc=0\n");
    for exe in exes {
        let e = shell_quote(&exe.display().to_string());
        s.push_str(&format!("echo \"== $(basename {e})\"\n{e} --ignored --test-threads=1 --nocapture {test_args} || rc=1\n"));
    }
    s
}

fn bin_dir() -> PathBuf {
    cmd::target_dir().join("debug")
}

fn run_single(bed: &Bed, exes: &[PathBuf], args: &VmTestArgs) -> Result<()> {
    let run_dir = new_run_dir("vm-test")?;
    let name = "guest";
    let (selected, name_filter) = select(exes, args.filter.as_deref());
    let filter = name_filter.as_deref().map(shell_quote).unwrap_or_default();
    let script = run_dir.join("guest.sh");
    let body = format!(
        "export GOVERNOR_BIN_DIR={}\n{}",
        shell_quote(&bin_dir().display().to_string()),
        if args.unprivileged {
            unprivileged_loop(&selected)
        } else {
            test_loop(&selected, &format!("{filter} {}", one_node_skip_args()))
        }
    );
    fs::write(
        &script,
        format!(
            "{}{body}{}",
            guest_prologue(bed, &run_dir, name),
            guest_epilogue()
        ),
    )?;
    eprintln!(
        "== booting the VM ({}; 2 vCPUs, TCG); results in {}",
        bed.kernel_release,
        run_dir.display()
    );
    let started = Instant::now();
    let mut child = spawn_guest(
        bed,
        &run_dir,
        &GuestSpec {
            name: name.into(),
            cpus: 2,
            memory: "2G",
            qemu_opts: None,
            script,
        },
    )?;
    let mut follower = [LogFollower::new(run_dir.join(format!("{name}.log")), "")];
    wait_guests(
        std::slice::from_mut(&mut child),
        &mut follower,
        Duration::from_secs(args.timeout_minutes * 60),
    )?;
    let rc = guest_rc(&run_dir, name)?;
    eprintln!(
        "== vm-test finished in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        if rc == 0 { "passed" } else { "FAILED" }
    );
    if rc != 0 {
        bail!(
            "VM tests failed (rc={rc}); log: {}",
            run_dir.join(format!("{name}.log")).display()
        );
    }
    let log = fs::read_to_string(run_dir.join(format!("{name}.log"))).unwrap_or_default();
    let ran = tests_run(&log);
    if ran == 0 {
        bail!(
            "no VM test matched {:?} (FILTER is a test binary name such as `vm_daemon`, or part of a test name)",
            args.filter.as_deref().unwrap_or("")
        );
    }
    eprintln!("== {ran} VM test(s) ran");
    Ok(())
}

fn run_multi(bed: &Bed, exes: &[PathBuf], n: u32, args: &VmTestArgs) -> Result<()> {
    if n > 9 {
        bail!("--nodes {n}: at most 9 guests (MAC and address scheme)");
    }
    let run_dir = new_run_dir(&format!("vm-test-{n}-nodes"))?;
    // A multicast port per run keeps concurrent runs on separate segments.
    let mcast_port = 20000 + (std::process::id() % 20000);
    // libtest runs a test that matches any of its filters: a FILTER is passed alone, and must
    // name multi-node scenarios (every guest runs the same ones, each its own part).
    let filter = match args.filter.as_deref() {
        Some(f) if f.starts_with("multinode_") => shell_quote(f),
        Some(f) => {
            bail!("--nodes: FILTER {f:?} must start with multinode_ (a multi-node scenario)")
        }
        None => "multinode_".to_owned(),
    };
    let mut children = Vec::new();
    let mut followers = Vec::new();
    eprintln!(
        "== booting {n} guests (1 vCPU each, TCG) on 10.10.0.0/24 (mcast port {mcast_port}); results in {}",
        run_dir.display()
    );
    let started = Instant::now();
    for node in 1..=n {
        let name = format!("node{node}");
        let script = run_dir.join(format!("{name}.sh"));
        let body = format!(
            r#"export GOVERNOR_BIN_DIR={bins} GOVERNOR_NODE={node} GOVERNOR_NODES={n} GOVERNOR_SHARED_DIR="$RUN/shared"
mkdir -p "$GOVERNOR_SHARED_DIR"
ifc() {{ for i in /sys/class/net/*; do [ "$(cat $i/address)" = "$1" ] && basename $i; done; }}
modprobe virtio_net 2>/dev/null
for t in $(seq 100); do [ -n "$(ifc 52:54:00:aa:00:0{node})" ] && break; sleep 0.1; done
NIC=$(ifc 52:54:00:aa:00:0{node})
[ -n "$NIC" ] || {{ echo "== no NIC with MAC 52:54:00:aa:00:0{node}"; exit 1; }}
ip link set lo up
ip addr add 10.10.0.{node}/24 dev $NIC && ip link set $NIC up || exit 1
echo "== $NIC = 10.10.0.{node}/24"
{tests}"#,
            bins = shell_quote(&bin_dir().display().to_string()),
            tests = test_loop(&exes.iter().collect::<Vec<_>>(), &filter),
        );
        fs::write(
            &script,
            format!(
                "{}{body}{}",
                guest_prologue(bed, &run_dir, &name),
                guest_epilogue()
            ),
        )?;
        let qemu_opts = format!(
            "-device virtio-net-pci,netdev=m0,mac=52:54:00:aa:00:0{node} -netdev socket,id=m0,mcast=230.0.0.1:{mcast_port},localaddr=127.0.0.1"
        );
        children.push(spawn_guest(
            bed,
            &run_dir,
            &GuestSpec {
                name: name.clone(),
                cpus: 1,
                memory: "768M",
                qemu_opts: Some(qemu_opts),
                script,
            },
        )?);
        followers.push(LogFollower::new(
            run_dir.join(format!("{name}.log")),
            &format!("[{name}] "),
        ));
    }
    wait_guests(
        &mut children,
        &mut followers,
        Duration::from_secs(args.timeout_minutes * 60),
    )?;
    let mut failed = Vec::new();
    for node in 1..=n {
        let name = format!("node{node}");
        match guest_rc(&run_dir, &name) {
            Ok(0) => {}
            Ok(rc) => failed.push(format!("{name} rc={rc}")),
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    eprintln!(
        "== vm-test --nodes {n} finished in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        if failed.is_empty() {
            "passed"
        } else {
            "FAILED"
        }
    );
    if !failed.is_empty() {
        bail!(
            "multi-node VM tests failed: {}; logs in {}",
            failed.join("; "),
            run_dir.display()
        );
    }
    let ran = tests_run(&fs::read_to_string(run_dir.join("node1.log")).unwrap_or_default());
    if ran == 0 {
        bail!("no multi-node scenario (tests named multinode_*) matched");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_tests_that_ran_and_selects_binaries_by_name() {
        let log = "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out\n\
                   test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s\n";
        assert_eq!(tests_run(log), 3);
        assert_eq!(tests_run("nothing"), 0);
        let exes = vec![
            PathBuf::from("/t/deps/vm_daemon-0a1b2c3d"),
            PathBuf::from("/t/deps/vm_cgroup_v2-99ff"),
        ];
        assert_eq!(binary_name(&exes[0]), "vm_daemon");
        let (sel, f) = select(&exes, Some("vm_daemon"));
        assert_eq!((sel.len(), f), (1, None));
        let (sel, f) = select(&exes, Some("restores"));
        assert_eq!((sel.len(), f.as_deref()), (2, Some("restores")));
    }

    /// Every ignored test in `tests/tests/*.rs`: its name and the kind its reason starts with
    /// (`#[ignore = "vm: ..."]` -> `vm`).
    fn ignored_integration_tests() -> Vec<(String, String)> {
        let dir = cmd::workspace_root().join("tests/tests");
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).expect("tests/tests") {
            let path = entry.expect("an entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = fs::read_to_string(&path).expect("a test file");
            let mut kind: Option<String> = None;
            for line in text.lines().map(str::trim) {
                if let Some(reason) = line.strip_prefix("#[ignore = \"") {
                    let k = reason.split([':', '"']).next().unwrap_or_default();
                    kind = Some(k.to_owned());
                } else if let Some(k) = &kind {
                    let name = line
                        .strip_prefix("async fn ")
                        .or_else(|| line.strip_prefix("fn "))
                        .and_then(|rest| rest.split('(').next());
                    if let Some(name) = name {
                        found.push((name.to_owned(), k.clone()));
                        kind = None;
                    }
                }
            }
        }
        found
    }

    #[test]
    fn the_one_node_bed_runs_every_vm_test_and_no_other_commands_ignored_test() {
        let ignored = ignored_integration_tests();
        assert!(
            ignored.iter().any(|(n, _)| n == "soak_random_faults"),
            "the scan found the soak: {ignored:?}"
        );
        let skipped = |name: &str| ONE_NODE_SKIPS.iter().any(|p| name.contains(p));
        for (name, kind) in &ignored {
            if kind == "vm" && !name.starts_with("multinode_") {
                assert!(!skipped(name), "{name} needs the bed, yet the bed skips it");
            } else {
                assert!(
                    skipped(name),
                    "{name} (ignored as {kind:?}) is not for the one-node bed, yet it would run there"
                );
            }
        }
        assert!(one_node_skip_args().contains("--skip soak_"));
    }
}
