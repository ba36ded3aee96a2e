//! The root daemon acts only for those entitled to it, on the real kernel, with a
//! second user (uid 65534, `nobody`):
//! - a job's log is read with its owner's rights: a file only root may read is refused for a
//!   job of `nobody` (and read for a job of root, which shows the check is what stops it);
//! - a process of a user the operator did not grant (`[discovery] adopt`) is not moved out of
//!   the cgroup it shares with other processes;
//! - no process is moved out of a cgroup with a CPU limit, whoever asks;
//! - a moved process goes back to its cgroup when the daemon stops, and after a crash when the
//!   daemon starts again; an adopted job is named after its command and pid, not `/`.
//!
//! Host cgroup v1 (`root_host_v1_*`, run by `cargo xtask test` as root on hybrid hosts) and
//! cgroup v2 in the VM (`vm_*`, `cargo xtask vm-test privilege`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use governor_integration_tests::daemon::Daemon;
use governor_integration_tests::{
    Layout, TestCgroup, enable_controllers, require_v1_cpu_host, require_vm,
};

const NOBODY: u32 = 65534;

/// Leaves no empty governor subtree behind when a scenario ends (after its daemon and groups,
/// which are declared after it and so dropped first).
struct Tidy;

impl Drop for Tidy {
    fn drop(&mut self) {
        governor_integration_tests::remove_empty_governor_subtree();
    }
}

/// A scenario's start: one at a time (they share the daemon's job subtree and the host's
/// cores), the tidy-up when it ends, and a running daemon with `extra` configuration. Bound
/// as `let (_one, _tidy, d)`, the daemon stops first and the lock goes last.
fn scenario(extra: &str) -> (std::sync::MutexGuard<'static, ()>, Tidy, Daemon) {
    let one = ONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut d = Daemon::configure("shortest-left", extra);
    d.spawn();
    (one, Tidy, d)
}

/// One scenario at a time: they share the daemon's job subtree and the host's cores.
static ONE: Mutex<()> = Mutex::new(());

/// Where test cgroups are made (the hierarchy discovery reads on this layout).
fn test_parent(layout: Layout) -> PathBuf {
    match layout {
        Layout::HostV1 => PathBuf::from("/sys/fs/cgroup/cpu"),
        Layout::V2 => {
            let root = PathBuf::from("/sys/fs/cgroup");
            enable_controllers(&root, &["cpu", "pids"]);
            root
        }
    }
}

/// Put a CPU limit (half a core) on `group`.
fn limit(layout: Layout, group: &TestCgroup) {
    match layout {
        Layout::HostV1 => group.write("cpu.cfs_quota_us", "50000"),
        Layout::V2 => group.write("cpu.max", "50000 100000"),
    }
}

/// A `sleep 60` with the given environment, started inside `group` (it joins the group
/// between fork and exec, so discovery first sees it there), optionally as `nobody`; killed
/// when dropped.
struct Proc(Child);

impl Proc {
    fn start(env: &[(&str, &str)], as_nobody: bool, group: &TestCgroup) -> Proc {
        Proc::spawn_in("sleep", &["60"], env, as_nobody, group)
    }

    /// `program args` started in `group` as [`Proc::start`] starts `sleep 60`.
    fn command(program: &str, args: &[&str], env: &[(&str, &str)], group: &TestCgroup) -> Proc {
        Proc::spawn_in(program, args, env, false, group)
    }

    fn spawn_in(
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        as_nobody: bool,
        group: &TestCgroup,
    ) -> Proc {
        use std::os::fd::AsRawFd;
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(group.path().join("cgroup.procs"))
            .expect("open cgroup.procs");
        let fd = procs.as_raw_fd();
        let mut c = Command::new(program);
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        // SAFETY: only async-signal-safe calls (write, setgroups, setgid, setuid) on a
        // descriptor opened before the fork; the join happens before the uid drop.
        unsafe {
            c.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                if as_nobody
                    && (libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(NOBODY) != 0
                        || libc::setuid(NOBODY) != 0)
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = c.spawn().expect("start the process");
        drop(procs);
        Proc(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A log only root may read (in a 0700 directory, mode 0600) holding a recognisable value.
fn root_only_log(dir: &Path) -> PathBuf {
    let secret = dir.join("secret");
    fs::create_dir_all(&secret).unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o700)).unwrap();
    let log = secret.join("log.csv");
    fs::write(&log, "epoch,loss\n0,4242.5\n1,4242.25\n").unwrap();
    fs::set_permissions(&log, fs::Permissions::from_mode(0o600)).unwrap();
    log
}

/// A log anyone may read.
fn open_log(dir: &Path) -> PathBuf {
    let log = dir.join("open.csv");
    fs::write(&log, "epoch,loss\n0,1.5\n").unwrap();
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&log, fs::Permissions::from_mode(0o644)).unwrap();
    log
}

fn reads_with_the_owners_rights(layout: Layout, prefix: &str) {
    let (_one, _tidy, d) = scenario("[discovery]\nadopt = \"any\"\n");
    let log = root_only_log(d.dir.path());
    let parent = test_parent(layout);
    // Each job alone in a cgroup of its own: governed in place, nothing is moved.
    let theirs = TestCgroup::create(&parent, &format!("{prefix}-nobody"));
    let ours = TestCgroup::create(&parent, &format!("{prefix}-root"));
    let log_s = log.display().to_string();
    let nobody = Proc::start(
        &[("GOVERNOR_LOG", &log_s), ("GOVERNOR_JOB", "nobody-job")],
        true,
        &theirs,
    );
    let root = Proc::start(
        &[("GOVERNOR_LOG", &log_s), ("GOVERNOR_JOB", "root-job")],
        false,
        &ours,
    );
    let root_job = d.wait_job(
        "root-job",
        Duration::from_secs(40),
        "root's job read its log",
        |j| j["records"].as_u64().unwrap_or(0) >= 2,
    );
    let nobody_job = d.wait_job(
        "nobody-job",
        Duration::from_secs(40),
        "a log problem for nobody's job",
        |j| !j["log_problem"].is_null(),
    );
    eprintln!("{prefix}: root's job {root_job}\nnobody's job {nobody_job}");
    assert_eq!(root_job["signal_value"].as_f64(), Some(4242.25));
    assert_eq!(nobody_job["records"].as_u64(), Some(0), "{nobody_job}");
    assert!(nobody_job["signal_value"].is_null(), "{nobody_job}");
    let problem = nobody_job["log_problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("ermission denied") && problem.contains("uid 65534"),
        "the refusal should say why: {problem}"
    );
    drop((nobody, root));
}

fn second_user_stays_in_a_shared_cgroup(layout: Layout, prefix: &str) {
    let (_one, _tidy, mut d) = scenario("");
    let log = open_log(d.dir.path());
    let shared = TestCgroup::create(&test_parent(layout), &format!("{prefix}-shared"));
    let log_s = log.display().to_string();
    let other = Proc::start(&[], false, &shared);
    let nobody = Proc::start(
        &[("GOVERNOR_LOG", &log_s), ("GOVERNOR_JOB", "nobody-shared")],
        true,
        &shared,
    );
    let root = Proc::start(&[("GOVERNOR_LOG", &log_s)], false, &shared);
    // Root's process is adopted (the default grants root), named after its command and pid.
    let name = format!("sleep-{}", root.pid());
    let job = d.wait_job(
        &name,
        Duration::from_secs(40),
        "adoption of root's job",
        |_| true,
    );
    assert!(
        job["cgroup"].as_str().unwrap_or_default().contains(&name),
        "{job}"
    );
    // The refusal for nobody's process is logged.
    d.wait_for_log(
        "does not let the governor move processes of its owner",
        1,
        Duration::from_secs(5),
    );
    assert!(
        d.job("nobody-shared").is_none(),
        "nobody's process was governed"
    );
    let here = format!("/{prefix}-shared");
    assert_eq!(
        layout.cgroup_of(nobody.pid()),
        here,
        "nobody's process was moved"
    );
    assert_eq!(layout.cgroup_of(other.pid()), here);
    assert!(layout.cgroup_of(root.pid()).contains(&name));
    // Stopping the daemon puts root's process back where it was.
    d.terminate();
    assert_eq!(
        layout.cgroup_of(root.pid()),
        here,
        "the adopted process did not go back when the daemon stopped"
    );
    drop((other, nobody, root));
}

fn no_escape_from_a_limit(layout: Layout, prefix: &str) {
    let (_one, _tidy, d) = scenario("[discovery]\nadopt = \"any\"\n");
    let log = open_log(d.dir.path());
    let limited = TestCgroup::create(&test_parent(layout), &format!("{prefix}-limited"));
    limit(layout, &limited);
    let log_s = log.display().to_string();
    let other = Proc::start(&[], false, &limited);
    let job = Proc::start(
        &[("GOVERNOR_LOG", &log_s), ("GOVERNOR_JOB", "limited")],
        false,
        &limited,
    );
    // The refusal for the limited job is logged.
    d.wait_for_log(
        "out of a limit it is subject to",
        1,
        Duration::from_secs(10),
    );
    assert_eq!(layout.cgroup_of(job.pid()), format!("/{prefix}-limited"));
    assert!(d.job("limited").is_none());
    drop((other, job));
}

fn back_after_a_crash(layout: Layout, prefix: &str) {
    let (_one, _tidy, mut d) = scenario("");
    let log = open_log(d.dir.path());
    let shared = TestCgroup::create(&test_parent(layout), &format!("{prefix}-crash"));
    let log_s = log.display().to_string();
    let other = Proc::start(&[], false, &shared);
    let job = Proc::start(
        &[("GOVERNOR_LOG", &log_s), ("GOVERNOR_JOB", "crash")],
        false,
        &shared,
    );
    d.wait_job("crash", Duration::from_secs(40), "adoption", |_| true);
    assert!(
        layout
            .cgroup_of(job.pid())
            .contains("governor.slice/jobs/crash")
    );
    d.kill();
    assert!(
        layout
            .cgroup_of(job.pid())
            .contains("governor.slice/jobs/crash"),
        "still in the governor's group after SIGKILL (nothing ran to put it back)"
    );
    // The next daemon, told to adopt nothing, puts it back from the journal.
    let mut config = fs::read_to_string(&d.config).unwrap();
    config.push_str("\n[discovery]\nadopt = \"none\"\n");
    fs::write(&d.config, config).unwrap();
    d.spawn();
    assert_eq!(
        layout.cgroup_of(job.pid()),
        format!("/{prefix}-crash"),
        "the restarted daemon did not put the adopted process back\n{}",
        d.log_tail()
    );
    let mut journal = d.state_file.clone().into_os_string();
    journal.push(".adopted");
    assert!(
        !Path::new(&journal).exists(),
        "the adoption journal was kept"
    );
    drop((other, job));
}

/// Run `f` on a thread of its own whose effective uid and gid are `nobody`'s (raw per-thread
/// system calls; the thread ends with `f`, the rest of the test keeps root's rights). A socket
/// connected there carries `nobody` in its `SO_PEERCRED`.
fn on_a_nobody_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let keep = u32::MAX as libc::c_long;
            let nobody = libc::c_long::from(NOBODY);
            // SAFETY: credential system calls with integer arguments (setgroups with none), on
            // this thread only; it exits when `f` returns.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                    0
                );
                assert_eq!(libc::syscall(libc::SYS_setresgid, keep, nobody, keep), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, keep, nobody, keep), 0);
            }
            f()
        })
        .join()
        .expect("nobody's thread")
    })
}

fn control_socket_checks_its_callers(layout: Layout, prefix: &str) {
    use governor::control::{AdoptJob, Request, Response, request};
    // nobody's group may connect (as an operator would let a group read status).
    let (_one, _tidy, d) = scenario("socket_group = \"nogroup\"\n");
    let subtree = match layout {
        Layout::HostV1 => PathBuf::from("/sys/fs/cgroup/cpu/governor.slice/jobs"),
        Layout::V2 => PathBuf::from("/sys/fs/cgroup/governor.slice/jobs"),
    };
    fs::create_dir_all(&subtree).unwrap();
    let group = TestCgroup::create(&subtree, &format!("{prefix}-sock"));
    let roots = Proc::start(&[], false, &group);
    let adopt = Request::Adopt(AdoptJob {
        name: format!("{prefix}-sock"),
        cgroup: format!("/governor.slice/jobs/{prefix}-sock"),
        logs: vec![],
        metric: None,
        format: None,
        pid: roots.pid(),
        epochs: None,
        finish: None,
        sweep: None,
    });
    let socket = d.socket.clone();
    let ask = |req: &Request| request(&socket, req, Duration::from_secs(5)).expect("answer");
    let (status, reload, theirs) =
        on_a_nobody_thread(|| (ask(&Request::Status), ask(&Request::Reload), ask(&adopt)));
    assert!(matches!(status, Response::Status(_)), "{status:?}");
    match reload {
        Response::Error { message } => assert!(message.contains("root only"), "{message}"),
        other => panic!("nobody reloaded the daemon: {other:?}"),
    }
    match theirs {
        Response::Error { message } => {
            assert!(message.contains("belongs to uid 0"), "{message}")
        }
        other => panic!("nobody handed root's process to the daemon: {other:?}"),
    }
    assert!(d.job(&format!("{prefix}-sock")).is_none());
    // Root may.
    assert!(matches!(ask(&adopt), Response::Ok { .. }));
    d.wait_job(
        &format!("{prefix}-sock"),
        Duration::from_secs(10),
        "root's hand-over",
        |_| true,
    );
    let release = Request::Release {
        cgroup: format!("/governor.slice/jobs/{prefix}-sock"),
    };
    match on_a_nobody_thread(|| ask(&release)) {
        Response::Error { message } => assert!(message.contains("may not release"), "{message}"),
        other => panic!("nobody released root's job: {other:?}"),
    }
    assert!(d.job(&format!("{prefix}-sock")).is_some());
    drop(roots);
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_second_user_cannot_read_a_root_only_file_through_the_daemon() {
    require_v1_cpu_host();
    reads_with_the_owners_rights(Layout::HostV1, "priv-v1-read");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_second_user_is_not_moved_out_of_a_shared_cgroup() {
    require_v1_cpu_host();
    second_user_stays_in_a_shared_cgroup(Layout::HostV1, "priv-v1");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_no_process_is_moved_out_of_a_cpu_limit() {
    require_v1_cpu_host();
    no_escape_from_a_limit(Layout::HostV1, "priv-v1");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_adopted_processes_go_back_after_a_crash() {
    require_v1_cpu_host();
    back_after_a_crash(Layout::HostV1, "priv-v1");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test privilege`"]
fn vm_a_second_user_cannot_read_a_root_only_file_through_the_daemon() {
    require_vm();
    reads_with_the_owners_rights(Layout::V2, "priv-v2-read");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test privilege`"]
fn vm_a_second_user_is_not_moved_out_of_a_shared_cgroup() {
    require_vm();
    second_user_stays_in_a_shared_cgroup(Layout::V2, "priv-v2");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test privilege`"]
fn vm_no_process_is_moved_out_of_a_cpu_limit() {
    require_vm();
    no_escape_from_a_limit(Layout::V2, "priv-v2");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test privilege`"]
fn vm_adopted_processes_go_back_after_a_crash() {
    require_vm();
    back_after_a_crash(Layout::V2, "priv-v2");
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_the_control_socket_acts_only_for_those_entitled() {
    require_v1_cpu_host();
    control_socket_checks_its_callers(Layout::HostV1, "priv-v1");
}

#[test]
#[ignore = "vm: runs the daemon against real cgroups; run with `cargo xtask vm-test privilege`"]
fn vm_the_control_socket_acts_only_for_those_entitled() {
    require_vm();
    control_socket_checks_its_callers(Layout::V2, "priv-v2");
}

/// The governor's groups in every v1 hierarchy (and the unified one) whose name starts with
/// `prefix`.
fn governor_groups(prefix: &str) -> Vec<PathBuf> {
    ["cpu", "cpuacct", "pids", "unified", ""]
        .iter()
        .filter_map(|m| {
            fs::read_dir(
                Path::new("/sys/fs/cgroup")
                    .join(m)
                    .join("governor.slice/jobs"),
            )
            .ok()
        })
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect()
}

/// A job that forks all the time (a shell loop of short `sleep`s), adopted out of a cgroup it
/// shares: when the daemon stops, every one of its processes goes back and the group the
/// daemon made for it is gone, in every hierarchy. (A child forked while the processes were
/// being moved back was born in the governor's group; the group stayed behind, empty once that
/// child exited.)
fn a_forking_job_leaves_no_group_behind(layout: Layout, prefix: &str) {
    for round in 0..20 {
        let (_one, _tidy, mut d) = scenario("");
        let log = open_log(d.dir.path());
        let shared = TestCgroup::create(&test_parent(layout), &format!("{prefix}-fork{round}"));
        let log_s = log.display().to_string();
        let other = Proc::start(&[], false, &shared);
        let job = Proc::command(
            "sh",
            &["-c", "while :; do /bin/true; done"],
            &[("GOVERNOR_LOG", &log_s), ("GOVERNOR_JOB", "forker")],
            &shared,
        );
        d.wait_job("forker", Duration::from_secs(40), "adoption", |_| true);
        assert!(
            layout
                .cgroup_of(job.pid())
                .contains("governor.slice/jobs/forker"),
            "round {round}: adopted into a group of its own"
        );
        d.terminate();
        assert_eq!(
            layout.cgroup_of(job.pid()),
            format!("/{prefix}-fork{round}"),
            "round {round}: the shell went back"
        );
        let left = governor_groups("forker");
        assert!(
            left.is_empty(),
            "round {round}: the daemon stopped and left {left:?}\n{}",
            d.log_tail()
        );
        drop((other, job));
    }
}

#[test]
#[ignore = "root-host: runs the daemon on the host's cgroup v1 cpu controller (root, a hybrid host); `cargo xtask test` runs it where it can"]
fn root_host_v1_a_forking_adopted_job_leaves_no_group_behind_when_the_daemon_stops() {
    require_v1_cpu_host();
    a_forking_job_leaves_no_group_behind(Layout::HostV1, "priv-v1");
}
