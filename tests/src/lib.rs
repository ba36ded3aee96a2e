//! Helpers shared by the integration tests.
//!
//! Two kinds of tests live in this crate:
//! - host tests, run by `cargo test` on the development machine (e.g. the cgroup v1 cpu test);
//! - real-kernel tests, marked `#[ignore = "vm: ..."]`, which change the kernel's cgroups and run
//!   only inside the virtme-ng guest started by `cargo xtask vm-test` (it runs the ignored tests of
//!   this crate as root with cgroup v2 mounted and `+cpu +memory +pids` delegated).
//!
//! Tests panic with a clear message instead of returning errors.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Environment variable the VM guest script sets; real-kernel tests refuse to run without it so
/// that `cargo test -- --ignored` on a workstation never rewrites the host's cgroups.
pub const IN_VM_ENV: &str = "GOVERNOR_IN_VM";

/// Call `f` every `every` until it returns `Some`, and return that; past `within`, panic saying
/// what was awaited and, after it, `context()` (a daemon's log tail, the last state seen). The
/// one polling loop of the integration tests: each file's `wait_for` says only what it shows on
/// a timeout.
pub fn poll_until<T>(
    what: &str,
    within: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            let context = context();
            let sep = if context.is_empty() { "" } else { "; " };
            panic!("timed out after {within:?} waiting for {what}{sep}{context}");
        }
        sleep(every);
    }
}

/// Panic unless running inside the test VM.
pub fn require_vm() {
    assert!(
        std::env::var_os(IN_VM_ENV).is_some(),
        "this test changes the kernel's cgroups and runs only inside the test VM: \
         use `cargo xtask vm-test` (the guest sets {IN_VM_ENV}=1)"
    );
}

/// Panic unless running as root on a host with the cgroup v1 cpu and cpuacct controllers (the
/// hybrid development machines), with a message that names what is missing.
pub fn require_v1_cpu_host() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "prerequisite missing: this root-host test writes the host's cgroups and needs root"
    );
    for file in [
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        "/sys/fs/cgroup/cpuacct/cpuacct.usage",
    ] {
        assert!(
            std::path::Path::new(file).exists(),
            "prerequisite missing: {file} (a cgroup v1 cpu/cpuacct host)"
        );
    }
}

/// The cgroup v2 mount point in the guest.
pub const CGROUP2_ROOT: &str = "/sys/fs/cgroup";

/// A process that burns one CPU until dropped.
pub struct Burner {
    child: Child,
}

impl Burner {
    /// Start a busy loop (`sh -c 'while :; do :; done'`).
    pub fn start() -> Burner {
        let child = Command::new("/bin/sh")
            .args(["-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("failed to start a busy loop with /bin/sh");
        Burner { child }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Restrict a process to one CPU (so that tests of CPU sharing control where contention happens).
pub fn pin_to_cpu(pid: u32, cpu: usize) {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut set = CpuSet::new();
    set.set(cpu)
        .unwrap_or_else(|e| panic!("cannot select CPU {cpu}: {e}"));
    sched_setaffinity(nix::unistd::Pid::from_raw(pid as i32), &set)
        .unwrap_or_else(|e| panic!("cannot pin process {pid} to CPU {cpu}: {e}"));
}

/// CPU time (user + system) a process has used, from `/proc/<pid>/stat`.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/stat: {e}"));
    // Fields after the command name, which is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')').expect("malformed /proc/pid/stat") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line, 12 and 13 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

/// Parse a flat-keyed cgroup file (`cpu.stat`, `memory.events`): `key value` per line.
pub fn read_keyed(path: &Path) -> std::collections::BTreeMap<String, u64> {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_owned(), it.next()?.parse().ok()?))
        })
        .collect()
}

/// The pids listed in a cgroup's `cgroup.procs` (none if it cannot be read: the group is gone).
pub fn cgroup_procs(group: &Path) -> Vec<u32> {
    fs::read_to_string(group.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The cgroup layout a test of `governor run-job` or of discovery runs on: the hybrid host's
/// cgroup v1 hierarchies (root-host tests) or the unified hierarchy (the VM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Hybrid host: the v1 `cpu`, `cpuacct` and `pids` hierarchies beside `unified`.
    HostV1,
    /// Unified (the VM).
    V2,
}

impl Layout {
    /// Every directory of job `name`'s group (`governor.slice/jobs/<name>`), one per hierarchy;
    /// the first is [`Layout::job_dir`].
    pub fn job_dirs(self, name: &str) -> Vec<PathBuf> {
        let mounts: &[&str] = match self {
            Layout::HostV1 => &["cpu", "cpuacct", "pids", "unified"],
            Layout::V2 => &[""],
        };
        mounts
            .iter()
            .map(|m| {
                Path::new("/sys/fs/cgroup")
                    .join(m)
                    .join("governor.slice/jobs")
                    .join(name)
            })
            .collect()
    }

    /// The directory of job `name`'s group whose `cgroup.procs` discovery reads (v1 `cpu`,
    /// the v2 group).
    pub fn job_dir(self, name: &str) -> PathBuf {
        self.job_dirs(name).remove(0)
    }

    /// The pids in job `name`'s group.
    pub fn job_pids(self, name: &str) -> Vec<u32> {
        cgroup_procs(&self.job_dir(name))
    }

    /// Job `name`'s CPU time so far, as the kernel accounts it (v1 `cpuacct.usage`, v2
    /// `cpu.stat` `usage_usec`); `None` before its group exists (or if a read fails).
    pub fn job_cpu_seconds(self, name: &str) -> Option<f64> {
        match self {
            Layout::HostV1 => fs::read_to_string(format!(
                "/sys/fs/cgroup/cpuacct/governor.slice/jobs/{name}/cpuacct.usage"
            ))
            .ok()
            .and_then(|t| t.trim().parse::<f64>().ok())
            .map(|ns| ns / 1e9),
            Layout::V2 => fs::read_to_string(format!(
                "/sys/fs/cgroup/governor.slice/jobs/{name}/cpu.stat"
            ))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .map(|us| us / 1e6),
        }
    }

    /// The cgroup process `pid` is in, as discovery sees it (the v1 `cpu` hierarchy's path, or
    /// the unified one's); empty if it cannot be read.
    pub fn cgroup_of(self, pid: u32) -> String {
        let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        text.lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (id, list, path) = (parts.next()?, parts.next()?, parts.next()?);
                let hit = match self {
                    Layout::HostV1 => list.split(',').any(|c| c == "cpu"),
                    Layout::V2 => id == "0" && list.is_empty(),
                };
                hit.then(|| path.to_owned())
            })
            .unwrap_or_default()
    }
}

/// A child cgroup created for one test and removed (after killing its processes) when dropped.
pub struct TestCgroup {
    path: PathBuf,
}

impl TestCgroup {
    /// Create `<parent>/<name>`; panics with the reason if that fails.
    pub fn create(parent: &Path, name: &str) -> TestCgroup {
        let path = parent.join(name);
        if path.exists() {
            // Left over from an aborted run: remove it first.
            drop(TestCgroup { path: path.clone() });
        }
        fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", path.display()));
        TestCgroup { path }
    }

    /// Directory of the group.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write `value` to the group's `file`.
    pub fn write(&self, file: &str, value: &str) {
        let p = self.path.join(file);
        fs::write(&p, value)
            .unwrap_or_else(|e| panic!("cannot write {value:?} to {}: {e}", p.display()));
    }

    /// Read the group's `file`.
    pub fn read(&self, file: &str) -> String {
        let p = self.path.join(file);
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    }

    /// Move a process into the group.
    pub fn add_pid(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// Pids currently in the group.
    pub fn pids(&self) -> Vec<u32> {
        cgroup_procs(&self.path)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                // SAFETY: kill(2) with a pid we read from the group; no memory is touched.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            if Instant::now() > deadline {
                eprintln!(
                    "warning: processes still in {} after 10 s",
                    self.path.display()
                );
                break;
            }
            sleep(Duration::from_millis(20));
        }
        if let Err(e) = fs::remove_dir(&self.path) {
            eprintln!(
                "warning: cannot remove test cgroup {}: {e}",
                self.path.display()
            );
        }
    }
}

/// Enable controllers for the children of a cgroup v2 group (`+cpu +memory +pids`).
pub fn enable_controllers(group: &Path, controllers: &[&str]) {
    let want: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
    let p = group.join("cgroup.subtree_control");
    fs::write(&p, want.join(" "))
        .unwrap_or_else(|e| panic!("cannot enable {want:?} in {}: {e}", p.display()));
}
pub mod daemon;
pub mod etcd;
pub mod proxy;
pub mod replica;

/// A tool from Debian's packages (the first of `names` found), or `None`: the test skips, saying
/// so, unless `GOVERNOR_REQUIRE_TOOLS` is set (`cargo xtask test`, after its set-up installed
/// them), where a missing tool fails it.
pub fn tool(names: &[&str]) -> Option<PathBuf> {
    for name in names {
        for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
            let p = Path::new(dir).join(name);
            if p.exists() {
                return Some(p);
            }
        }
    }
    if std::env::var_os("GOVERNOR_REQUIRE_TOOLS").is_some() {
        panic!("{names:?} not installed: run `cargo xtask setup`");
    }
    eprintln!("SKIPPED: {names:?} not installed (cargo xtask setup installs it)");
    None
}

/// The certificates of a test cluster on loopback in `dir`: the coordinator's (for 127.0.0.1),
/// one per node in `nodes`, and the admin `admin`.
pub fn loopback_certs(dir: &Path, nodes: &[&str]) {
    use coordinator::certs::{self, Kind};
    let mut kinds = vec![
        Kind::Coordinator {
            hosts: vec!["127.0.0.1".into()],
        },
        Kind::Admin {
            name: "admin".into(),
        },
    ];
    kinds.extend(nodes.iter().map(|n| Kind::Node {
        name: (*n).to_owned(),
    }));
    certs::init(dir, &kinds, false).expect("certificates for the test cluster");
}

/// A free local port (bound, then released for a daemon or server to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Remove the governor's job subtree (`governor.slice/jobs`, `governor.slice`) from every
/// hierarchy where it is empty, so that tests that ran the daemon or `run-job` leave nothing
/// under /sys/fs/cgroup (`rmdir` fails harmlessly where something still lives there).
pub fn remove_empty_governor_subtree() {
    for mount in ["", "cpu", "cpuacct", "pids", "unified"] {
        let base = std::path::Path::new("/sys/fs/cgroup").join(mount);
        let _ = fs::remove_dir(base.join("governor.slice/jobs"));
        let _ = fs::remove_dir(base.join("governor.slice"));
    }
}

/// The (epoch, loss) records of a Keras CSV log (`epoch,accuracy,loss`, as `demo-trainer`
/// writes it); the loss kept as written, so that runs compare bit for bit.
pub fn keras_epochs(log: &Path) -> Vec<(u64, String)> {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split(',');
            let epoch = f.next()?.parse().ok()?;
            let loss = f.nth(1)?.to_owned();
            Some((epoch, loss))
        })
        .collect()
}

/// `demo-trainer`'s command line for a small deterministic run (8 features, 8 hidden units,
/// batches of 64) that logs Keras CSV to `log`.
pub fn demo_trainer_argv(
    trainer: &Path,
    log: &Path,
    epochs: u64,
    samples: u32,
    seed: u32,
) -> Vec<String> {
    let mut argv = vec![trainer.display().to_string(), "--log".into()];
    argv.push(log.display().to_string());
    for (flag, value) in [
        ("--format", "keras-csv".to_owned()),
        ("--epochs", epochs.to_string()),
        ("--samples", samples.to_string()),
        ("--features", "8".into()),
        ("--hidden", "8".into()),
        ("--batch", "64".into()),
        ("--seed", seed.to_string()),
    ] {
        argv.push(flag.into());
        argv.push(value);
    }
    argv
}

/// A stand-in node's answers to the coordinator (the node agent library without a daemon):
/// every start is reported running at its attempt, every save exited 0 and `saved`. Runs until
/// the agent drops its end of `commands`.
pub async fn answer_starts_and_saves(
    mut commands: tokio::sync::mpsc::Receiver<governor::coordinator_client::NodeCommand>,
    reports: tokio::sync::watch::Sender<governor::coordinator_client::NodeReport>,
) {
    use governor::coordinator_client::{JobReport, NodeCommand, RunState};
    while let Some(cmd) = commands.recv().await {
        match cmd {
            NodeCommand::Start(s) => reports.send_modify(|r| {
                r.jobs.retain(|j| j.job_id != s.job_id);
                let mut j = JobReport::running(&s.job_id, &s.name);
                j.attempt = s.attempt;
                r.jobs.push(j);
            }),
            NodeCommand::Save(s) => reports.send_modify(|r| {
                for j in r.jobs.iter_mut().filter(|j| j.job_id == s.job_id) {
                    j.state = RunState::Exited;
                    j.exit_code = Some(0);
                    j.saved = true;
                }
            }),
            _ => {}
        }
    }
}
