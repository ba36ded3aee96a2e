//! The benchmark's environment (the Python environment, the release daemon, the host's cgroup
//! layout) and one run of a workload under one policy: the daemon started, each job launched at
//! its arrival, its CPU sampled, the daemon stopped and the results read.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use governor_policy::Direction;
use governor_policy::quality::time_to_quality;
use governor_testbed::cmd;

use super::{Framework, JobPlan, JobResult, RunResult, Sizes, Workload, node_spec, policy_option};
use crate::procfs;

/// PyPI packages of the benchmark's environment, pinned (the versions measured).
const PYTHON_PACKAGES: &[&str] = &[
    "tensorflow-cpu==2.21.0",
    "keras==3.15.1",
    "scikit-learn==1.9.1",
];

/// The Python environment, the governor binary, and the host's cgroup layout.
pub struct RealEnv {
    pub python: PathBuf,
    pub governor: PathBuf,
    pub scripts: PathBuf,
    pub cgroup: CgroupLayout,
}

/// Where a job group's CPU time is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLayout {
    /// `cpuacct/<group>/cpuacct.usage` (ns): v1 or hybrid.
    V1,
    /// `<group>/cpu.stat` `usage_usec`: unified.
    V2,
}

/// A run's clock and its workload's arrivals: the jobs handed out in arrival order as their
/// times come, and the run's time limit.
pub(super) struct Schedule<'a> {
    t0: Instant,
    /// The run's start in Unix seconds (the jobs' logs and the coordinator stamp Unix times).
    pub(super) wall0: f64,
    pending: std::collections::VecDeque<&'a JobPlan>,
}

impl<'a> Schedule<'a> {
    /// How long a run may take before it is abandoned.
    pub(super) const LIMIT: Duration = Duration::from_secs(1800);

    pub(super) fn start(w: &'a Workload) -> Schedule<'a> {
        let mut pending: Vec<&JobPlan> = w.jobs.iter().collect();
        pending.sort_by(|a, b| a.at.total_cmp(&b.at));
        Schedule {
            t0: Instant::now(),
            wall0: unix_now(),
            pending: pending.into(),
        }
    }

    /// Seconds since the run started.
    pub(super) fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// The next job due by `now`, each once.
    pub(super) fn next_due(&mut self, now: f64) -> Option<&'a JobPlan> {
        if self.pending.front().is_some_and(|j| j.at <= now) {
            self.pending.pop_front()
        } else {
            None
        }
    }

    pub(super) fn all_submitted(&self) -> bool {
        self.pending.is_empty()
    }

    pub(super) fn past_limit(&self) -> bool {
        self.t0.elapsed() > Self::LIMIT
    }
}

impl RealEnv {
    /// The benchmark's environment: the Python environment and the release daemon (and, for a
    /// cluster, the coordinator and govctl beside it).
    pub fn prepare(cluster: bool) -> Result<RealEnv> {
        // A fresh checkout has no eBPF build tools, and the release build requires them.
        governor_testbed::setup::ebpf_tools_or_build_without();
        let python = python_env()?;
        eprintln!("== building the release daemon");
        let mut build = cmd::cargo();
        build.args(["build", "--release", "-p", "governor"]);
        if cluster {
            build.args(["-p", "coordinator"]);
        }
        cmd::run(&mut build)?;
        RealEnv::new(python, cmd::target_dir().join("release/governor"))
    }

    /// Real jobs run with `python` under the daemon binary `governor`; fails where this host
    /// cannot govern them (not root, no cgroup CPU controller).
    pub fn new(python: PathBuf, governor: PathBuf) -> Result<RealEnv> {
        if !cmd::is_root() {
            bail!("real jobs run under a root daemon that writes cgroups: run it as root");
        }
        let cgroup = if Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists() {
            CgroupLayout::V1
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            CgroupLayout::V2
        } else {
            bail!("no usable cgroup CPU controller under /sys/fs/cgroup");
        };
        Ok(RealEnv {
            python,
            governor,
            scripts: cmd::workspace_root().join("eval/realjobs"),
            cgroup,
        })
    }

    fn job_cpu_seconds(&self, group: &str) -> Option<f64> {
        match self.cgroup {
            CgroupLayout::V1 => fs::read_to_string(format!(
                "/sys/fs/cgroup/cpuacct/governor.slice/jobs/{group}/cpuacct.usage"
            ))
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .map(|ns| ns / 1e9),
            CgroupLayout::V2 => {
                let text = fs::read_to_string(format!(
                    "/sys/fs/cgroup/governor.slice/jobs/{group}/cpu.stat"
                ))
                .ok()?;
                text.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))?
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .map(|us| us / 1e6)
            }
        }
    }

    /// Starts the daemon with `policy`; returns it once its socket answers.
    pub fn start_daemon(&self, policy: &str, dir: &Path, extra_config: &[String]) -> Result<Child> {
        let policy = node_spec(policy);
        let config = dir.join("governor.toml");
        let mut text = format!(
            "jobs_dir = \"{d}/jobs.d\"\nstate_file = \"{d}/state.json\"\nsocket = \"{s}\"\npolicy = \"{policy}\"\n",
            d = dir.display(),
            s = socket_path(dir).display()
        );
        for line in extra_config {
            text.push_str(line);
            text.push('\n');
        }
        fs::write(&config, text)?;
        fs::create_dir_all(dir.join("jobs.d"))?;
        let log = fs::File::create(dir.join("daemon.log"))?;
        let child = Command::new(&self.governor)
            .arg("daemon")
            .arg("--config")
            .arg(&config)
            .env("GOVERNOR_LOG_LEVEL", "governor=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start the governor daemon")?;
        let socket = socket_path(dir);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!(
                    "the daemon did not open its socket within 20 s; see {}",
                    dir.join("daemon.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(child)
    }

    /// Job `j`'s training process, as given after `--`: the interpreter and `script`, writing
    /// its log, its epoch times and its exit summary in `dir` (`NAME.log`, `NAME.times`,
    /// `NAME.summary.json`, which the run reads back), the workload's own arguments last.
    pub(super) fn training_argv(&self, j: &JobPlan, script: &str, dir: &Path) -> Vec<OsString> {
        let file = |ext: &str| dir.join(format!("{}.{ext}", j.name)).into_os_string();
        let mut argv: Vec<OsString> = vec![
            self.python.clone().into_os_string(),
            self.scripts.join(script).into_os_string(),
            "--epochs".into(),
            j.epochs.to_string().into(),
            "--log".into(),
            file("log"),
            "--times".into(),
            file("times"),
            "--summary".into(),
            file("summary.json"),
        ];
        argv.extend(j.args.iter().map(OsString::from));
        argv
    }

    /// The command that starts job `j` under `governor run-job`.
    pub fn job_command(&self, j: &JobPlan, sizes: Sizes, dir: &Path, policy: &str) -> Command {
        let script = match j.framework {
            Framework::Keras => "train_keras.py",
            Framework::Sklearn => "train_sklearn.py",
        };
        let log = dir.join(format!("{}.log", j.name));
        let mut c = Command::new(&self.governor);
        c.arg("run-job")
            .args(["--name", &j.name])
            .arg("--log")
            .arg(&log)
            .arg("--socket")
            .arg(socket_path(dir));
        if sizes == Sizes::Known {
            c.args(["--epochs", &j.epochs.to_string()]);
        }
        if let Some(rule) = policy_option(policy, "finish") {
            c.args(["--finish", &rule]);
        }
        if let Some(sweep) = policy_option(policy, "sweep") {
            c.args(["--sweep", &sweep]);
        }
        c.arg("--")
            .args(self.training_argv(j, script, dir))
            .envs(j.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        c
    }

    pub fn run_once(
        &self,
        w: &Workload,
        policy: &str,
        sizes: Sizes,
        rep: u32,
        dir: &Path,
        extra_config: &[String],
    ) -> Result<RunResult> {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir)?;
        let slices_before = governor_slices();
        let mut daemon = self.start_daemon(policy, dir, extra_config)?;
        let result = self.drive(w, policy, sizes, rep, dir, &mut daemon);
        let daemon_cpu = procfs::cpu_seconds(daemon.id()).unwrap_or(f64::NAN);
        stop(&mut daemon);
        remove_new_empty_slices(&slices_before);
        let mut r = result?;
        r.daemon_cpu_seconds = daemon_cpu;
        fs::write(dir.join("run.json"), serde_json::to_string_pretty(&r)?)?;
        Ok(r)
    }

    fn drive(
        &self,
        w: &Workload,
        policy: &str,
        sizes: Sizes,
        rep: u32,
        dir: &Path,
        daemon: &mut Child,
    ) -> Result<RunResult> {
        let mut schedule = Schedule::start(w);
        let wall0 = schedule.wall0;
        let mut running: Vec<(String, Child, f64)> = Vec::new();
        let mut ended: BTreeMap<String, (f64, f64, bool)> = BTreeMap::new();
        let mut timelines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut last_cpu: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let mut next_sample = 0.0;
        let mut next_status = 0.0;
        let mut status_log = fs::File::create(dir.join("status.jsonl"))?;
        loop {
            let now = schedule.now();
            while let Some(j) = schedule.next_due(now) {
                let out = fs::File::create(dir.join(format!("{}.out", j.name)))?;
                let child = self
                    .job_command(j, sizes, dir, policy)
                    .stdout(out.try_clone()?)
                    .stderr(out)
                    .spawn()
                    .with_context(|| format!("cannot start job {}", j.name))?;
                running.push((j.name.clone(), child, now));
            }
            if now >= next_sample {
                for (name, _, _) in &running {
                    if let Some(c) = self.job_cpu_seconds(name) {
                        if let Some((t, c0)) = last_cpu.get(name)
                            && now > *t
                        {
                            timelines
                                .entry(name.clone())
                                .or_default()
                                .push((now, ((c - c0) / (now - t)).max(0.0)));
                        }
                        last_cpu.insert(name.clone(), (now, c));
                    }
                }
                next_sample = now + 0.5;
            }
            if now >= next_status {
                // The daemon's own view (categories, weights, reasons), for the plots and for
                // finding out why a policy did what it did.
                if let Ok(out) = Command::new(&self.governor)
                    .args(["status", "--json", "--socket"])
                    .arg(socket_path(dir))
                    .stderr(Stdio::null())
                    .output()
                    && out.status.success()
                {
                    use std::io::Write as _;
                    let _ = writeln!(
                        status_log,
                        "{{\"t\":{now:.2},\"status\":{}}}",
                        String::from_utf8_lossy(&out.stdout).trim()
                    );
                }
                next_status = now + 2.0;
            }
            let mut k = 0;
            while k < running.len() {
                if let Some(status) = running[k].1.try_wait()? {
                    let (name, _, submitted) = running.remove(k);
                    ended.insert(name, (submitted, now - submitted, status.success()));
                } else {
                    k += 1;
                }
            }
            if schedule.all_submitted() && running.is_empty() {
                break;
            }
            if let Some(status) = daemon.try_wait()? {
                bail!(
                    "the daemon exited during the run ({status}); see {}",
                    dir.join("daemon.log").display()
                );
            }
            if schedule.past_limit() {
                for (_, c, _) in &mut running {
                    let _ = c.kill();
                }
                bail!("the workload did not finish within {:?}", Schedule::LIMIT);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let makespan = schedule.now();
        let mut jobs = Vec::new();
        for j in &w.jobs {
            let (submitted, jct, ok) = ended[&j.name];
            let summary = read_summary(dir, &j.name);
            jobs.push(JobResult {
                cpu_seconds: summary.as_ref().and_then(|s| s["cpu_seconds"].as_f64()),
                cpu_timeline: timelines.remove(&j.name).unwrap_or_default(),
                ..job_result(dir, &j.name, wall0, submitted, jct, ok)
            });
        }
        Ok(RunResult {
            workload: w.name.clone(),
            policy: policy.to_owned(),
            rep,
            sizes,
            makespan,
            daemon_cpu_seconds: 0.0,
            jobs,
        })
    }
}

/// The `governor.slice` groups (and their `jobs`) that exist in any hierarchy.
pub(super) fn governor_slices() -> Vec<PathBuf> {
    ["", "cpu", "cpuacct", "pids", "unified"]
        .iter()
        .flat_map(|m| {
            let base = Path::new("/sys/fs/cgroup").join(m).join("governor.slice");
            [base.join("jobs"), base]
        })
        .filter(|p| p.is_dir())
        .collect()
}

/// The daemon stops with its job groups removed but leaves the empty `governor.slice/jobs` it
/// made: the benchmark removes those it created (never one that was there before its run; a
/// group that is not empty cannot be removed). A job group the kernel is still tearing down as
/// the daemons stop keeps its parent busy for a moment, so a failed removal is tried again for
/// up to 2 s (once one run left them, every later run counted them as there before it).
pub(super) fn remove_new_empty_slices(before: &[PathBuf]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        // Children first: `governor_slices` lists each `jobs` before its slice.
        let left: Vec<PathBuf> = governor_slices()
            .into_iter()
            .filter(|dir| !before.contains(dir))
            .filter(|dir| fs::remove_dir(dir).is_err())
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(super) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The exit summary job `name` wrote in the run directory `dir` (`NAME.summary.json`), if any.
pub(super) fn read_summary(dir: &Path, name: &str) -> Option<serde_json::Value> {
    fs::read_to_string(dir.join(format!("{name}.summary.json")))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
}

/// Job `name`'s result from its curve in the run directory `dir` (`NAME.times`): its time to
/// quality counted from `submitted` (seconds after the run's start at unix time `wall0`); no
/// CPU figures (the caller's).
pub(super) fn job_result(
    dir: &Path,
    name: &str,
    wall0: f64,
    submitted: f64,
    jct: f64,
    exit_ok: bool,
) -> JobResult {
    let curve = read_times(&dir.join(format!("{name}.times")), wall0 + submitted);
    let quality: Vec<(f64, f64)> = curve
        .iter()
        .map(|&(t, loss, val)| (t, if val.is_finite() { val } else { loss }))
        .collect();
    JobResult {
        name: name.to_owned(),
        submitted,
        jct,
        ttq: time_to_quality(&quality, Direction::Minimise),
        cpu_seconds: None,
        epochs_done: curve.len() as u32,
        exit_ok,
        curve,
        cpu_timeline: Vec::new(),
    }
}

/// `epoch unix_time loss val_loss` lines as (seconds since `origin`, loss, val_loss).
pub(super) fn read_times(path: &Path, origin: f64) -> Vec<(f64, f64, f64)> {
    let Ok(f) = fs::File::open(path) else {
        return Vec::new();
    };
    std::io::BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            let num = |i: usize| v.get(i).and_then(|s| s.parse::<f64>().ok());
            Some((
                num(1)? - origin,
                num(2).unwrap_or(f64::NAN),
                num(3).unwrap_or(f64::NAN),
            ))
        })
        .collect()
}

/// SIGTERM (the daemon restores every limit), then wait.
pub(super) fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The control socket of the daemon whose run directory is `dir`: `dir/governor.sock`, or,
/// where that path is too long for a Unix socket (108 bytes with its NUL: a deep `--out` and a
/// long policy name), a short one in the temporary directory named by a hash of `dir`.
pub(crate) fn socket_path(dir: &Path) -> PathBuf {
    let path = dir.join("governor.sock");
    if path.as_os_str().len() < 100 {
        return path;
    }
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same name for the same directory in every process.
    let mut hasher = std::hash::DefaultHasher::new();
    dir.hash(&mut hasher);
    std::env::temp_dir().join(format!("governor-bench-{:016x}.sock", hasher.finish()))
}

/// The benchmark's Python environment: created and filled once, then reused (a stamp names the
/// packages installed).
pub fn python_env() -> Result<PathBuf> {
    cmd::python_venv(
        &cmd::target_dir().join("bench/venv"),
        PYTHON_PACKAGES,
        &[],
        "the real jobs",
    )
}
