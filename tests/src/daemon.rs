//! Running the real `governor` daemon binary in tests (inside the VM).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::poll_until;

/// `govctl` (the real binary) talking to the coordinator at `address` with the certificates in
/// `certs` (as their `admin`). Its jobs are root's (`USER=root`, whoever runs the tests): the
/// tests' nodes allow root jobs, and no other user need exist on them.
pub fn govctl_command(address: &str, certs: &Path) -> Command {
    let mut c = Command::new(bin("govctl"));
    c.env("USER", "root");
    c.arg("--coordinator")
        .arg(address)
        .arg("--certs")
        .arg(certs);
    c
}

/// Run `govctl ARGS` ([`govctl_command`]): its stdout, or its stderr as the error.
pub fn try_govctl(address: &str, certs: &Path, args: &[&str]) -> Result<String, String> {
    let out = govctl_command(address, certs)
        .args(args)
        .output()
        .expect("run govctl");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Path of a binary built by the workspace: `$GOVERNOR_BIN_DIR/NAME` (set by `cargo xtask
/// vm-test`), else the one cargo built next to the running test (`cargo test --workspace` and
/// `cargo xtask test` build it; after `cargo test -p governor-integration-tests` alone, build it
/// with `cargo build -p governor -p coordinator`).
pub fn bin(name: &str) -> PathBuf {
    let dir = match std::env::var_os("GOVERNOR_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()
            .expect("current_exe")
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf(),
    };
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} was not built (`cargo build -p governor -p coordinator`)",
        p.display()
    );
    p
}

/// The stand-in NVML library (`nvml-standin`) cargo built beside the test binaries.
pub fn nvml_standin_library() -> PathBuf {
    let deps = bin("governor").parent().unwrap().join("deps");
    for p in [
        bin("governor").with_file_name("libnvml_standin.so"),
        deps.join("libnvml_standin.so"),
    ] {
        if p.exists() {
            return p;
        }
    }
    panic!("libnvml_standin.so was not built (`cargo build -p nvml-standin`)");
}

/// A governor daemon started with its own configuration, socket and state file.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub state_file: PathBuf,
    pub config: PathBuf,
    pub jobs_dir: PathBuf,
    /// Arguments added after `daemon --config FILE` (e.g. `--coordinator ...`).
    pub extra_args: Vec<String>,
    /// Environment added to the daemon's (e.g. the stand-in NVML's state file).
    pub env: Vec<(String, String)>,
    log: PathBuf,
}

impl Daemon {
    /// Write a configuration (`extra` is appended to the TOML) without starting the daemon.
    pub fn configure(policy: &str, extra: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("governor.sock");
        let state_file = dir.path().join("state.json");
        let jobs_dir = dir.path().join("jobs.d");
        fs::create_dir_all(&jobs_dir).unwrap();
        let config = dir.path().join("governor.toml");
        let text = format!(
            "policy = \"{policy}\"\njobs_dir = \"{}\"\nsocket = \"{}\"\nstate_file = \"{}\"\nsample_interval = \"250ms\"\n{extra}\n",
            jobs_dir.display(),
            socket.display(),
            state_file.display()
        );
        fs::write(&config, text).unwrap();
        let log = dir.path().join("daemon.log");
        Daemon {
            dir,
            child: None,
            socket,
            state_file,
            config,
            jobs_dir,
            extra_args: Vec::new(),
            env: Vec::new(),
            log,
        }
    }

    /// `governor run-job --name NAME --log LOG` against this daemon's control socket, its
    /// standard streams closed; the test adds its options and `-- COMMAND`.
    pub fn run_job(&self, name: &str, log: &Path) -> Command {
        let mut command = Command::new(bin("governor"));
        command
            .args(["run-job", "--name", name, "--log"])
            .arg(log)
            .arg("--socket")
            .arg(&self.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    /// Configure and start; waits until the control socket answers.
    pub fn start(policy: &str, extra: &str) -> Daemon {
        let mut d = Daemon::configure(policy, extra);
        d.spawn();
        d
    }

    /// Start (or restart) the daemon process.
    pub fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(bin("governor"))
            .args(["daemon", "--config"])
            .arg(&self.config)
            .args(["--log-level", "governor=debug,info"])
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("cannot start governor daemon");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.status_json().is_none() {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "governor daemon exited at start-up ({status}); its log:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "governor daemon did not answer within 60 s; log:\n{}",
                self.log_text()
            );
            sleep(Duration::from_millis(100));
        }
    }

    /// Declare a job (`jobs.d/<name>.toml`); call before `spawn` or send SIGHUP after.
    pub fn declare_job(&self, name: &str, toml: &str) {
        fs::write(self.jobs_dir.join(format!("{name}.toml")), toml).unwrap();
    }

    /// `governor status --json`, parsed; None if the daemon does not answer.
    pub fn status_json(&self) -> Option<serde_json::Value> {
        let out = Command::new(bin("governor"))
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The status entry of one job, by name.
    pub fn job(&self, name: &str) -> Option<serde_json::Value> {
        let s = self.status_json()?;
        s["jobs"]
            .as_array()?
            .iter()
            .find(|j| j["name"] == name)
            .cloned()
    }

    /// Wait until `pred` holds for the named job's status (panics with the log after `within`).
    pub fn wait_job(
        &self,
        name: &str,
        within: Duration,
        what: &str,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        poll_until(
            &format!("job {name}: {what}"),
            within,
            Duration::from_millis(100),
            || self.job(name).filter(|j| pred(j)),
            || {
                format!(
                    "status: {:?}\nlog:\n{}",
                    self.status_json(),
                    self.log_tail()
                )
            },
        )
    }

    /// Wait until the daemon's log holds `needle` at least `count` times (panics with its tail
    /// after `within`).
    pub fn wait_for_log(&self, needle: &str, count: usize, within: Duration) {
        poll_until(
            &format!("`{needle}` {count} time(s) in the daemon's log"),
            within,
            Duration::from_millis(100),
            || (self.log_text().matches(needle).count() >= count).then_some(()),
            || format!("log:\n{}", self.log_tail()),
        )
    }

    fn signal(&mut self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// SIGTERM and wait; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait()
    }

    /// SIGKILL (simulated crash) and wait.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.wait();
    }

    /// SIGHUP (reload).
    pub fn reload(&mut self) {
        self.signal(libc::SIGHUP);
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("daemon not running");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!(
                    "governor daemon did not exit within 30 s; log:\n{}",
                    self.log_tail()
                );
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's whole log.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last 60 lines of the daemon's log.
    pub fn log_tail(&self) -> String {
        let t = self.log_text();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGTERM);
            let _ = self.wait();
        }
    }
}

/// Appends Keras-CSVLogger rows (`epoch,loss`) to a log file, as a training job would.
pub struct KerasLog {
    path: PathBuf,
    epoch: u64,
}

impl KerasLog {
    /// Create the file with its header.
    pub fn create(path: &Path) -> KerasLog {
        if let Some(d) = path.parent() {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(path, "epoch,loss\n").unwrap();
        KerasLog {
            path: path.to_owned(),
            epoch: 0,
        }
    }

    /// Append one epoch's loss.
    pub fn append(&mut self, loss: f64) {
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .unwrap();
        writeln!(f, "{},{loss}", self.epoch).unwrap();
        self.epoch += 1;
    }
}

/// Cumulative CPU seconds of a cgroup (`cpu.stat` usage_usec).
pub fn cgroup_cpu_seconds(group: &Path) -> f64 {
    crate::read_keyed(&group.join("cpu.stat"))["usage_usec"] as f64 / 1e6
}
