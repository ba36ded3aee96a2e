//! A user who is not root runs a job: `governor run-job` as uid 65534 (`nobody`),
//! given a private socket group (a gid no account holds, handed to `nobody` by `setpriv`
//! alone), against the real daemon running as root with `socket_group` set to that gid:
//! - the job runs in a group of its own, `governor.slice/jobs/<name>` in every hierarchy, is
//!   governed (its log read with nobody's rights), and the group is gone when run-job returns,
//!   with what the job left running in it and the sub-group it made;
//! - the user got its job and nothing more: the job's own checks, run as nobody from inside
//!   it, find its `cpu.shares`/`cpu.weight`/`cpu.max` and the cgroups outside it closed, and
//!   its v1 groups not delegated; on cgroup v2 the group is delegated (directory,
//!   `cgroup.procs`, `cgroup.threads`, `cgroup.subtree_control`): the job makes a sub-group and
//!   moves itself there, and stays governed;
//! - where it is not allowed (not in the socket's group; a name another user's job holds;
//!   `[run_job] users = "none"`), run-job prints one line that says what to ask for, exits 125
//!   and never starts the command.
//!
//! Host cgroup v1 (`root_host_v1_*`, run by `cargo xtask test` as root on hybrid hosts) and
//! cgroup v2 in the VM (`vm_*`, `cargo xtask vm-test run_job_user`).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use governor_integration_tests::daemon::{Daemon, bin};
use governor_integration_tests::{Layout, cgroup_procs, require_v1_cpu_host, require_vm};

const NOBODY: u32 = 65534;

/// The control socket's group: a gid that no account on the machine holds, so that only the
/// runs this test gives it to may connect.
const SOCKET_GID: u32 = 4_000_321;

/// One scenario at a time: they share the daemon's job subtree.
static ONE: Mutex<()> = Mutex::new(());

/// Leaves no empty governor subtree behind (dropped after the daemon).
struct Tidy;

impl Drop for Tidy {
    fn drop(&mut self) {
        governor_integration_tests::remove_empty_governor_subtree();
    }
}

/// A daemon whose socket `nobody` can reach (its directory searchable, the socket mode 0660
/// and [`SOCKET_GID`]'s), with `extra` configuration; a directory `nobody` may write for its
/// job. Bound as `let (_one, _tidy, d, user_dir)`: the daemon stops first, the lock goes last.
fn scenario(extra: &str) -> (std::sync::MutexGuard<'static, ()>, Tidy, Daemon, PathBuf) {
    let one = ONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut d = Daemon::configure(
        "shortest-left",
        &format!("socket_group = \"{SOCKET_GID}\"\n{extra}"),
    );
    fs::set_permissions(d.dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
    let user_dir = d.dir.path().join("user");
    fs::create_dir(&user_dir).unwrap();
    fs::set_permissions(&user_dir, fs::Permissions::from_mode(0o777)).unwrap();
    d.spawn();
    (one, Tidy, d, user_dir)
}

/// `governor run-job --name NAME --socket S --log LOG -- /bin/sh -c SCRIPT` as `nobody`, with
/// the socket's group when `in_group`.
fn run_job_as_nobody(d: &Daemon, in_group: bool, name: &str, log: &Path, script: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"));
    if in_group {
        c.arg(format!("--groups={SOCKET_GID}"));
    } else {
        c.arg("--clear-groups");
    }
    c.arg("--")
        .arg(bin("governor"))
        .args(["run-job", "--name", name, "--socket"])
        .arg(&d.socket)
        .arg("--log")
        .arg(log)
        .args(["--", "/bin/sh", "-c", script])
        .current_dir("/")
        .env("HOME", "/")
        .stdin(Stdio::null());
    c
}

/// A running `run-job`. Dropped before it ended (a failed assertion), it lets the job end
/// (`stop`), then kills what is left in the job's group and `run-job` itself: nothing the test
/// started outlives it, and the daemon (dropped after) removes the group.
struct RunJob {
    child: Option<Child>,
    stop: Option<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl RunJob {
    fn wait_for_end(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            match self.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(None)) => sleep(Duration::from_millis(50)),
                _ => return true,
            }
        }
        false
    }

    /// Its output once it has ended.
    fn output(mut self) -> Output {
        self.child.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for RunJob {
    fn drop(&mut self) {
        if self.child.is_none() || self.wait_for_end(Duration::ZERO) {
            return;
        }
        if let Some(stop) = &self.stop {
            let _ = fs::write(stop, "");
            if self.wait_for_end(Duration::from_secs(5)) {
                return;
            }
        }
        for dir in &self.dirs {
            for pid in cgroup_procs(dir)
                .into_iter()
                .chain(cgroup_procs(&dir.join("sub")))
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !self.wait_for_end(Duration::from_secs(10)) {
            let c = self.child.as_mut().unwrap();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `try WHAT COMMAND` shell function that records whether COMMAND, run by the job itself
/// (as nobody), was allowed or denied.
fn try_fn(results: &Path) -> String {
    format!(
        "try() {{ if sh -c \"$2\" 2>/dev/null; then echo \"$1 allowed\" >> '{r}'; else echo \"$1 denied\" >> '{r}'; fi; }}\n",
        r = results.display()
    )
}

/// Shell lines that wait (at most two minutes) for `path` to exist.
fn wait_for_file(path: &Path) -> String {
    format!(
        "i=0; while [ ! -e '{}' ] && [ $i -lt 1200 ]; do i=$((i+1)); sleep 0.1; done\n",
        path.display()
    )
}

/// Whether process `pid` still runs (a zombie waiting for its parent does not).
fn running(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Wait for `path` to hold a line `done` (written by a job's script); its lines.
fn wait_for_results(path: &Path, d: &Daemon) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l == "done") {
            return text.lines().map(str::to_owned).collect();
        }
        assert!(
            Instant::now() < deadline,
            "the job never finished its checks (so far: {text:?})\n{}",
            d.log_tail()
        );
        sleep(Duration::from_millis(100));
    }
}

fn uid_of_process(pid: u32) -> Option<u32> {
    fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

fn owner(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .uid()
}

/// The user's job end to end; see the module doc.
fn a_user_runs_a_governed_job_in_its_own_group(layout: Layout, prefix: &str) {
    let (_one, _tidy, d, user_dir) = scenario("");
    let name = format!("{prefix}-job");
    let log = user_dir.join("job.csv");
    let stop = user_dir.join("stop");
    let results = user_dir.join("results");
    let main = layout.job_dir(&name);
    let g = main.display();
    // The job's own checks, as nobody from inside its group; then a process left behind, and
    // the job waits for the test to let it end.
    let checks = match layout {
        Layout::HostV1 => format!(
            "try shares \"echo 4096 > {g}/cpu.shares\"\n\
             try quota \"echo -1 > {g}/cpu.cfs_quota_us\"\n\
             try out \"echo $$ > /sys/fs/cgroup/cpu/cgroup.procs\"\n\
             try v1-subgroup \"mkdir {g}/sub\"\n\
             try v2-subgroup \"mkdir /sys/fs/cgroup/unified/governor.slice/jobs/{name}/sub\"\n"
        ),
        Layout::V2 => format!(
            "try weight \"echo 10000 > {g}/cpu.weight\"\n\
             try max \"echo max > {g}/cpu.max\"\n\
             try out \"echo $$ > /sys/fs/cgroup/cgroup.procs\"\n\
             try sibling \"mkdir {g}-x\"\n\
             try v2-subgroup \"mkdir {g}/sub && echo $$ > {g}/sub/cgroup.procs\"\n"
        ),
    };
    // It waits for `go` (once governed) before its checks, and for `stop` before it ends.
    let go = user_dir.join("go");
    let script = format!(
        "printf 'epoch,loss\\n0,0.9\\n1,0.8\\n' > '{log}'\n{wait_go}{try_fn}{checks}sleep 300 &\n\
         echo done >> '{results}'\n{wait_stop}exit 7\n",
        log = log.display(),
        wait_go = wait_for_file(&go),
        try_fn = try_fn(&results),
        results = results.display(),
        wait_stop = wait_for_file(&stop),
    );
    let run = RunJob {
        child: Some(
            run_job_as_nobody(&d, true, &name, &log, &script)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("setpriv ... governor run-job"),
        ),
        stop: Some(stop.clone()),
        dirs: layout.job_dirs(&name),
    };
    let job = d.wait_job(
        &name,
        Duration::from_secs(60),
        "nobody's job governed, its log read",
        |j| j["signal_value"].as_f64() == Some(0.8),
    );
    assert_eq!(job["source"], "launched", "{job}");
    assert_eq!(
        job["cgroup"],
        format!("/governor.slice/jobs/{name}"),
        "{job}"
    );
    fs::write(&go, "").unwrap();
    let lines = wait_for_results(&results, &d);
    eprintln!("{prefix}: the job's own checks: {lines:?}");
    let expect: &[(&str, &str)] = match layout {
        Layout::HostV1 => &[
            ("shares", "denied"),
            ("quota", "denied"),
            ("out", "denied"),
            ("v1-subgroup", "denied"),
            ("v2-subgroup", "allowed"),
        ],
        Layout::V2 => &[
            ("weight", "denied"),
            ("max", "denied"),
            ("out", "denied"),
            ("sibling", "denied"),
            ("v2-subgroup", "allowed"),
        ],
    };
    for (what, verdict) in expect {
        let line = format!("{what} {verdict}");
        assert!(lines.contains(&line), "expected `{line}` in {lines:?}");
    }
    // Its processes are nobody's, in its group (below it, on v2, where it moved itself).
    let here = format!("/governor.slice/jobs/{name}");
    let mut pids: Vec<u32> = cgroup_procs(&main);
    if layout == Layout::V2 {
        pids.extend(cgroup_procs(&main.join("sub")));
    }
    assert!(
        pids.len() >= 2,
        "the job and its leftover in {}: {pids:?}",
        main.display()
    );
    for pid in &pids {
        assert_eq!(uid_of_process(*pid), Some(NOBODY), "process {pid}");
        assert!(
            layout.cgroup_of(*pid).starts_with(&here),
            "process {pid}: {}",
            layout.cgroup_of(*pid)
        );
    }
    // Ownership: v1 groups stay root's; the v2 group and its three files are nobody's, its
    // limits root's.
    for dir in layout.job_dirs(&name) {
        let v2 = layout == Layout::V2 || dir.starts_with("/sys/fs/cgroup/unified");
        let want = if v2 { NOBODY } else { 0 };
        assert_eq!(owner(&dir), want, "{}", dir.display());
        assert_eq!(
            owner(&dir.join("cgroup.procs")),
            want,
            "{}/cgroup.procs",
            dir.display()
        );
        if v2 {
            for f in ["cgroup.threads", "cgroup.subtree_control"] {
                assert_eq!(owner(&dir.join(f)), NOBODY, "{}/{f}", dir.display());
            }
        } else {
            assert_eq!(owner(&dir.join("tasks")), 0, "{}/tasks", dir.display());
        }
    }
    if layout == Layout::V2 {
        for f in ["cpu.weight", "cpu.max", "cgroup.kill", "cgroup.max.depth"] {
            assert_eq!(owner(&main.join(f)), 0, "{f} must stay root's");
        }
        // Still governed after moving below its group (the group is not empty).
        sleep(Duration::from_millis(1500));
        assert!(
            d.job(&name).is_some(),
            "the job was dropped once it moved into its sub-group\n{}",
            d.log_tail()
        );
    }
    fs::write(&stop, "").unwrap();
    let out = run.output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(7),
        "run-job exits with the job's status; stderr: {stderr}"
    );
    assert!(stderr.trim().is_empty(), "run-job said: {stderr}");
    for dir in layout.job_dirs(&name) {
        assert!(
            !dir.exists(),
            "{} left behind\n{}",
            dir.display(),
            d.log_tail()
        );
    }
    for pid in pids {
        assert!(!running(pid), "process {pid} of the job still runs");
    }
    assert!(
        d.job(&name).is_none(),
        "still governed after run-job returned"
    );
}

/// `run-job` as nobody that must be refused: its output, and that the command never ran.
fn refused(d: &Daemon, in_group: bool, name: &str, user_dir: &Path) -> String {
    let started = user_dir.join(format!("{name}.started"));
    let script = format!("touch '{}'", started.display());
    let out: Output = run_job_as_nobody(d, in_group, name, &user_dir.join("x.csv"), &script)
        .output()
        .expect("setpriv ... governor run-job");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(125), "run-job must fail: {stderr}");
    assert!(!started.exists(), "the command ran: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr:?}");
    assert!(lines[0].starts_with("governor run-job: "), "{stderr}");
    assert!(
        !stderr.contains("os error"),
        "an OS error where a reason is due: {stderr}"
    );
    stderr.trim().to_owned()
}

/// The three refusals; see the module doc.
fn a_user_who_may_not_is_told_what_to_ask_for(layout: Layout, prefix: &str) {
    let (_one, _tidy, mut d, user_dir) = scenario("");
    // Not in the socket's group: it cannot connect.
    let name = format!("{prefix}-nogroup");
    let line = refused(&d, false, &name, &user_dir);
    eprintln!("{prefix}: {line}");
    assert!(
        line.contains(&format!(
            "ask the operator to add you to group `{SOCKET_GID}` (socket_group in /etc/governor/governor.toml)"
        )),
        "{line}"
    );
    assert!(!layout.job_dir(&name).exists());

    // A name held by another user's (root's) running job.
    let taken = format!("{prefix}-taken");
    let mut roots = RunJob {
        child: Some(
            Command::new(bin("governor"))
                .args(["run-job", "--name", &taken, "--socket"])
                .arg(&d.socket)
                .arg("--log")
                .arg(user_dir.join("root.csv"))
                .args(["--", "sleep", "60"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("root's run-job"),
        ),
        stop: None,
        dirs: layout.job_dirs(&taken),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while layout.job_pids(&taken).is_empty() {
        assert!(Instant::now() < deadline, "root's job never started");
        sleep(Duration::from_millis(50));
    }
    let line = refused(&d, true, &taken, &user_dir);
    eprintln!("{prefix}: {line}");
    assert!(
        line.contains("is in use by a job of uid 0") && line.contains("choose another --name"),
        "{line}"
    );
    assert_eq!(
        owner(&layout.job_dir(&taken)),
        0,
        "root's group was handed over"
    );
    for pid in layout.job_pids(&taken) {
        assert_eq!(
            uid_of_process(pid),
            Some(0),
            "nobody's process joined root's job"
        );
    }
    for pid in layout.job_pids(&taken) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        roots.wait_for_end(Duration::from_secs(10)),
        "root's run-job did not end"
    );

    // The operator allows no user.
    let mut config = fs::read_to_string(&d.config).unwrap();
    config.push_str("\n[run_job]\nusers = \"none\"\n");
    fs::write(&d.config, config).unwrap();
    let reloads = d.log_text().matches("reloading the configuration").count();
    d.reload();
    d.wait_for_log(
        "reloading the configuration",
        reloads + 1,
        Duration::from_secs(60),
    );
    let name = format!("{prefix}-none");
    let line = refused(&d, true, &name, &user_dir);
    eprintln!("{prefix}: {line}");
    assert!(
        line.contains("uid 65534 may not start jobs on this node: ask the operator to allow you in [run_job] users")
            && line.contains(&d.config.display().to_string()),
        "{line}"
    );
    assert!(!layout.job_dir(&name).exists());
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller and a job as uid 65534 (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_user_runs_a_governed_job_in_its_own_group() {
    require_v1_cpu_host();
    a_user_runs_a_governed_job_in_its_own_group(Layout::HostV1, "user-v1");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller and a job as uid 65534 (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_user_who_may_not_is_told_what_to_ask_for() {
    require_v1_cpu_host();
    a_user_who_may_not_is_told_what_to_ask_for(Layout::HostV1, "user-v1");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups and a job as uid 65534; run with `cargo xtask vm-test run_job_user`"]
fn vm_a_user_runs_a_governed_job_in_its_own_delegated_group() {
    require_vm();
    a_user_runs_a_governed_job_in_its_own_group(Layout::V2, "user-v2");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups and a job as uid 65534; run with `cargo xtask vm-test run_job_user`"]
fn vm_a_user_who_may_not_is_told_what_to_ask_for() {
    require_vm();
    a_user_who_may_not_is_told_what_to_ask_for(Layout::V2, "user-v2");
}
