//! The daemon's side of the cluster: what it tells the coordinator and what it does on the
//! coordinator's commands.
//!
//! Path of a submitted job: `govctl submit` → coordinator placement → [`NodeCommand::Start`] on
//! the node's session → [`Launcher::start`] creates `governor.slice/jobs/<name>-<id>`, starts the
//! command inside it (stdout/stderr to `<job_output_dir>/<group>.out`, `CUDA_VISIBLE_DEVICES`
//! from the reserved GPUs) → the daemon governs it like a `governor run-job` job → every sample
//! round [`node_report`] turns the daemon's status and the launcher's jobs into the
//! [`NodeReport`] the agent streams → the main process exits: the job is reported `exited` with
//! its status, kept in the reports for `finished_retention`, and its cgroup removed.
//!
//! [`node_report`] is pure (the daemon's [`NodeStatus`] in, the wire report out) and makes
//! every value valid for the protocol (finite, non-negative, bounded text), so one odd value can
//! never get the node's whole report refused.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use governor_proto::node::{MAX_MESSAGE_LEN, MAX_NAME_LEN};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::cgroup::jobs::signal_child;
use crate::cgroup::{CgroupFs, JobCgroup};
use crate::cluster::{
    AgentStatus, GpuDevice, GpuUsage as WireGpuUsage, JobOrigin, JobReport, NodeCapacity,
    NodeReport, RunState, StartJob, StopJob, WireCategory,
};
use crate::control::AdoptJob;
use crate::gpu::{GpuInfo, GpuUsage};
use crate::policy::NodeResources;
use crate::status::NodeStatus;

/// What the node registers with: its cores, memory and GPUs (real or simulated).
pub fn node_capacity(resources: &NodeResources, gpus: &[GpuInfo]) -> NodeCapacity {
    NodeCapacity {
        cores: resources.cores,
        memory_bytes: resources.memory_bytes,
        gpus: gpus
            .iter()
            .map(|g| GpuDevice {
                index: g.index,
                model: clip(&g.model, MAX_NAME_LEN),
                memory_bytes: g.memory_bytes,
            })
            .collect(),
    }
}

/// A job the coordinator started on this node, as reported.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinatorJob {
    pub job_id: String,
    pub replica: u32,
    pub name: String,
    /// Its cgroup (`/governor.slice/jobs/...`) once created.
    pub cgroup: Option<String>,
    pub state: RunState,
    pub exit_code: Option<i32>,
    pub message: String,
    pub gpu_indices: Vec<u32>,
}

/// The node's report: every coordinator job (running or recently finished, with its figures
/// when the daemon governs it) and every other governed job as a local one.
///
/// - progress is the latest finite value of the job's signal E(t);
/// - growth is P(t) per second, normalised by the signal's first value (the status shows it
///   per minute), never negative; growth efficiency is growth per core used;
/// - a local job's id is its cgroup path (unique on the node);
/// - node CPU and memory use are the sums over governed jobs;
/// - a job's GPU utilisation is the mean over its GPUs, its GPU memory their sum (GPUs are
///   reserved per job).
pub fn node_report<'a>(
    status: &NodeStatus,
    coordinator_jobs: impl IntoIterator<Item = &'a CoordinatorJob>,
    gpus: &[GpuUsage],
) -> NodeReport {
    let by_cgroup: HashMap<&str, &crate::status::JobStatus> =
        status.jobs.iter().map(|j| (j.cgroup.as_str(), j)).collect();
    let gpu_by_index: BTreeMap<u32, &GpuUsage> = gpus.iter().map(|g| (g.index, g)).collect();
    let mut claimed: HashSet<&str> = HashSet::new();
    let mut jobs = Vec::new();
    let mut seen_ids: BTreeSet<(String, u32)> = BTreeSet::new();
    for cj in coordinator_jobs {
        let job_id = clip(&cj.job_id, MAX_NAME_LEN);
        if job_id.trim().is_empty() || !seen_ids.insert((job_id.clone(), cj.replica)) {
            continue;
        }
        let governed = cj
            .cgroup
            .as_deref()
            .and_then(|c| by_cgroup.get(c).copied());
        if let Some(c) = cj.cgroup.as_deref()
            && governed.is_some()
        {
            claimed.insert(c);
        }
        let mut report = JobReport::running(job_id, clip(&cj.name, MAX_NAME_LEN));
        report.replica = cj.replica;
        report.origin = JobOrigin::Coordinator;
        report.state = cj.state;
        report.exit_code = cj.exit_code;
        report.message = clip(&cj.message, MAX_MESSAGE_LEN);
        if let Some(g) = governed
            && !cj.state.is_finished()
        {
            fill_figures(&mut report, g);
        }
        let distinct: BTreeSet<u32> = cj.gpu_indices.iter().copied().collect();
        report.gpu_indices = distinct.into_iter().collect();
        let used: Vec<&GpuUsage> = report
            .gpu_indices
            .iter()
            .filter_map(|i| gpu_by_index.get(i).copied())
            .collect();
        if !used.is_empty() && !cj.state.is_finished() {
            let sum: f64 = used
                .iter()
                .map(|g| (g.utilization_percent.min(100) as f64) / 100.0)
                .sum();
            report.gpu_utilization = (sum / used.len() as f64).clamp(0.0, 1.0);
            report.gpu_memory_bytes = used.iter().map(|g| g.memory_used_bytes).sum();
        }
        jobs.push(report);
    }
    for j in &status.jobs {
        if claimed.contains(j.cgroup.as_str()) {
            continue;
        }
        let job_id = clip(&j.cgroup, MAX_NAME_LEN);
        if job_id.trim().is_empty() || !seen_ids.insert((job_id.clone(), 0)) {
            continue;
        }
        let name = if j.name.trim().is_empty() {
            job_id.clone()
        } else {
            clip(&j.name, MAX_NAME_LEN)
        };
        let mut report = JobReport::running(job_id, name);
        report.origin = JobOrigin::Local;
        fill_figures(&mut report, j);
        jobs.push(report);
    }
    let cpu_used: f64 = status
        .jobs
        .iter()
        .filter_map(|j| j.cpu_usage_cores)
        .filter(|c| c.is_finite() && *c > 0.0)
        .sum();
    NodeReport {
        sequence: 0,
        cpu_used_cores: cpu_used,
        memory_used_bytes: status.jobs.iter().filter_map(|j| j.memory_bytes).sum(),
        jobs,
        migrations: Vec::new(),
        gpus: gpus
            .iter()
            .map(|g| WireGpuUsage {
                index: g.index,
                utilization: (g.utilization_percent.min(100) as f64) / 100.0,
                memory_used_bytes: g.memory_used_bytes,
            })
            .collect(),
    }
}

/// The governed job's figures, made valid for the protocol.
fn fill_figures(report: &mut JobReport, j: &crate::status::JobStatus) {
    report.category = WireCategory::from(j.category);
    report.progress = j.signal_value.filter(|v| v.is_finite());
    let cores = j
        .cpu_usage_cores
        .filter(|c| c.is_finite() && *c > 0.0)
        .unwrap_or(0.0);
    report.cpu_cores = cores;
    report.growth = j
        .growth_per_minute
        .filter(|g| g.is_finite())
        .map(|g| (g / 60.0).max(0.0));
    report.growth_efficiency = report
        .growth
        .and_then(|g| (cores >= 0.01).then(|| g / cores));
    report.memory_bytes = j.memory_bytes.unwrap_or(0);
    report.cpu_limit_cores = j.cpu_max_cores.filter(|c| c.is_finite() && *c > 0.0);
    report.cpu_weight = j.cpu_weight.unwrap_or(0);
}

/// `s` cut to at most `max` bytes on a character boundary.
fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// One line for `governor status`: where the agent stands.
pub fn describe_agent(address: &str, status: &AgentStatus, last_error: Option<&str>) -> String {
    let last = last_error
        .map(|e| format!("; last error: {e}"))
        .unwrap_or_default();
    match status {
        AgentStatus::Connected { session } => format!("{address} connected (session {session})"),
        AgentStatus::Connecting { attempt: 1 } if last_error.is_none() => {
            format!("{address} connecting")
        }
        AgentStatus::Connecting { attempt } => {
            format!("{address} retrying (attempt {attempt}{last})")
        }
        AgentStatus::Waiting { error, retry_in } => format!(
            "{address} retrying in {:.1}s: {error}",
            retry_in.as_secs_f64()
        ),
        AgentStatus::Stopped => format!("{address} stopped (not connected{last})"),
    }
}

/// The end of a job's main process, from its waiting task.
#[derive(Debug)]
pub struct JobExit {
    pub job_id: String,
    pub replica: u32,
    pub status: std::io::Result<ExitStatus>,
}

/// What [`Launcher::start`] did.
#[derive(Debug)]
pub enum StartOutcome {
    /// The job is known already (the coordinator resends unconfirmed starts): nothing done.
    Duplicate,
    /// It could not start; it is reported `failed` with the reason.
    Failed(String),
    /// Started: govern it like a `governor run-job` job.
    Started(Box<StartedJob>),
}

/// A job the launcher started, for the daemon to govern.
#[derive(Debug)]
pub struct StartedJob {
    pub adopt: AdoptJob,
    pub maximise: bool,
    pub priority: i32,
}

/// Settings of the launcher.
#[derive(Clone, Debug)]
pub struct LauncherConfig {
    /// Parent of the job cgroups (`governor.slice/jobs`).
    pub subtree: PathBuf,
    /// stdout/stderr files go here.
    pub output_dir: PathBuf,
    /// GPU indices the node has.
    pub gpus: BTreeSet<u32>,
    pub stop_grace: Duration,
    pub finished_retention: Duration,
}

struct Launched {
    info: CoordinatorJob,
    group: Option<JobCgroup>,
    /// Sends signals to the main process through its waiting task (which knows whether it has
    /// been reaped, so a signal never reaches a reused pid).
    signals: Option<mpsc::UnboundedSender<Signal>>,
    stop_reason: Option<String>,
    /// SIGKILL is due then (a stop's grace period).
    kill_at: Option<Instant>,
    finished_at: Option<Instant>,
}

/// A job cgroup whose main process ended: stragglers get SIGTERM, then SIGKILL, then the group
/// is removed.
struct Teardown {
    group: JobCgroup,
    kill_at: Instant,
    termed: bool,
    killed: bool,
}

/// Starts and stops the coordinator's jobs and remembers their state for the reports.
pub struct Launcher {
    config: LauncherConfig,
    jobs: BTreeMap<(String, u32), Launched>,
    teardowns: Vec<Teardown>,
    exits: mpsc::UnboundedSender<JobExit>,
    /// Problems already logged (a resent bad command is logged once).
    logged: HashSet<String>,
}

impl Launcher {
    /// A launcher; job exits arrive on the returned channel (hand them to [`Self::on_exit`]).
    pub fn new(config: LauncherConfig) -> (Launcher, mpsc::UnboundedReceiver<JobExit>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Launcher {
                config,
                jobs: BTreeMap::new(),
                teardowns: Vec::new(),
                exits: tx,
                logged: HashSet::new(),
            },
            rx,
        )
    }

    /// Every coordinator job still reported.
    pub fn jobs(&self) -> impl Iterator<Item = &CoordinatorJob> {
        self.jobs.values().map(|l| &l.info)
    }

    /// The coordinator job running in `cgroup`, if any.
    pub fn job_in(&self, cgroup: &JobCgroup) -> Option<&CoordinatorJob> {
        self.jobs
            .values()
            .find(|l| l.group.as_ref() == Some(cgroup))
            .map(|l| &l.info)
    }

    fn warn_once(&mut self, key: String, message: &str) {
        if self.logged.insert(key) {
            warn!("{message}");
        }
    }

    /// Start a job (idempotent per job id and replica). Must run inside a tokio runtime.
    pub fn start(&mut self, fs: &CgroupFs, s: StartJob) -> StartOutcome {
        let key = (s.job_id.clone(), s.replica);
        if self.jobs.contains_key(&key) {
            return StartOutcome::Duplicate;
        }
        let mut info = CoordinatorJob {
            job_id: s.job_id.clone(),
            replica: s.replica,
            name: s.name.clone(),
            cgroup: None,
            state: RunState::Starting,
            exit_code: None,
            message: String::new(),
            gpu_indices: s.gpu_indices.clone(),
        };
        let mut launched = Launched {
            info: info.clone(),
            group: None,
            signals: None,
            stop_reason: None,
            kill_at: None,
            finished_at: None,
        };
        match self.spawn(fs, &s, &mut launched) {
            Ok(started) => {
                info!(job = %s.job_id, replica = s.replica, name = %s.name, cgroup = %started.adopt.cgroup, pid = started.adopt.pid, "started a job for the coordinator");
                self.jobs.insert(key, launched);
                StartOutcome::Started(Box::new(started))
            }
            Err(reason) => {
                self.warn_once(
                    format!("start:{}:{}", s.job_id, s.replica),
                    &format!(
                        "cannot start job {} ({}) for the coordinator: {reason}",
                        s.job_id, s.name
                    ),
                );
                if let Some(group) = launched.group.take() {
                    let _ = fs.remove_job_group(&group);
                }
                info.state = RunState::Failed;
                info.message = reason.clone();
                launched.info = info;
                launched.finished_at = Some(Instant::now());
                self.jobs.insert(key, launched);
                StartOutcome::Failed(reason)
            }
        }
    }

    fn spawn(
        &mut self,
        fs: &CgroupFs,
        s: &StartJob,
        launched: &mut Launched,
    ) -> Result<StartedJob, String> {
        if s.argv.first().is_none_or(|p| p.trim().is_empty()) {
            return Err("no program to run (argv is empty)".into());
        }
        if !Path::new(&s.log_path).is_absolute() {
            return Err(format!("log path {:?} is not absolute", s.log_path));
        }
        let distinct: BTreeSet<u32> = s.gpu_indices.iter().copied().collect();
        if distinct.len() != s.gpu_indices.len() {
            return Err(format!("GPU list {:?} names a GPU twice", s.gpu_indices));
        }
        if let Some(missing) = distinct.iter().find(|g| !self.config.gpus.contains(g)) {
            return Err(format!(
                "GPU {missing} does not exist on this node (it has {:?})",
                self.config.gpus
            ));
        }
        let group_name = group_name(&s.name, &s.job_id, s.replica, s.replicas);
        let group = fs
            .create_job_group(&self.config.subtree, &group_name)
            .map_err(|e| format!("cannot create the job's cgroup: {e}"))?;
        launched.group = Some(group.clone());
        launched.info.cgroup = Some(group.to_string());
        std::fs::create_dir_all(&self.config.output_dir).map_err(|e| {
            format!(
                "cannot create the output directory {}: {e}",
                self.config.output_dir.display()
            )
        })?;
        let output_path = self.config.output_dir.join(format!("{group_name}.out"));
        let output = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&output_path)
            .map_err(|e| format!("cannot open {}: {e}", output_path.display()))?;
        let errors = output
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", output_path.display()))?;
        let mut command = std::process::Command::new(&s.argv[0]);
        command
            .args(&s.argv[1..])
            .envs(&s.env)
            .env("GOVERNOR_LOG", &s.log_path)
            .env("GOVERNOR_JOB", &s.name)
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(errors);
        if !s.metric.is_empty() {
            command.env("GOVERNOR_METRIC", &s.metric);
        }
        if !s.gpu_indices.is_empty() {
            let list: Vec<String> = s.gpu_indices.iter().map(u32::to_string).collect();
            command.env("CUDA_VISIBLE_DEVICES", list.join(","));
        }
        fs.prepare_command(&group, &mut command)
            .map_err(|e| format!("cannot prepare the job to start in its cgroup: {e}"))?;
        let mut child = tokio::process::Command::from(command)
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", s.argv[0]))?;
        let pid = child.id().unwrap_or(0);
        let (sig_tx, mut sig_rx) = mpsc::unbounded_channel::<Signal>();
        let exits = self.exits.clone();
        let (job_id, replica) = (s.job_id.clone(), s.replica);
        tokio::spawn(async move {
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status,
                    Some(sig) = sig_rx.recv() => {
                        // `id()` is None once reaped: the pid is still ours while it is Some.
                        if let Some(pid) = child.id() {
                            let _ = signal_child(pid, sig);
                        }
                    }
                }
            };
            let _ = exits.send(JobExit {
                job_id,
                replica,
                status,
            });
        });
        launched.signals = Some(sig_tx);
        launched.info.state = RunState::Running;
        launched.info.message = format!("output in {}", output_path.display());
        Ok(StartedJob {
            adopt: AdoptJob {
                name: s.name.clone(),
                cgroup: group.to_string(),
                logs: vec![s.log_path.clone()],
                metric: (!s.metric.is_empty()).then(|| s.metric.clone()),
                format: None,
                pid,
            },
            maximise: s.maximise,
            priority: s.priority,
        })
    }

    /// Stop every replica of a job: SIGTERM to its cgroup and main process now, SIGKILL after
    /// the grace period. An unknown or finished job is logged (once) and ignored.
    pub fn stop(&mut self, fs: &CgroupFs, s: &StopJob, now: Instant) -> usize {
        let grace = self.config.stop_grace;
        let mut stopped = 0;
        for ((id, _), l) in self.jobs.iter_mut() {
            if *id != s.job_id || l.info.state.is_finished() || l.stop_reason.is_some() {
                continue;
            }
            info!(job = %id, reason = %s.reason, grace = ?grace, "stopping a job on the coordinator's request");
            l.stop_reason = Some(s.reason.clone());
            l.kill_at = Some(now + grace);
            signal_job(fs, l, Signal::SIGTERM);
            stopped += 1;
        }
        if stopped == 0 {
            let known = self.jobs.keys().any(|(id, _)| *id == s.job_id);
            let what = if known {
                "has already ended or is being stopped"
            } else {
                "is not running here"
            };
            self.warn_once(
                format!("stop:{}", s.job_id),
                &format!(
                    "the coordinator asked to stop job {}, which {what}; ignored",
                    s.job_id
                ),
            );
        }
        stopped
    }

    /// A job's main process ended. Returns its cgroup, which the daemon stops governing; the
    /// launcher tears it down (stragglers signalled, group removed).
    pub fn on_exit(&mut self, fs: &CgroupFs, exit: JobExit, now: Instant) -> Option<JobCgroup> {
        let l = self.jobs.get_mut(&(exit.job_id.clone(), exit.replica))?;
        use std::os::unix::process::ExitStatusExt;
        let stopped = l.stop_reason.clone();
        match (&exit.status, stopped) {
            (Ok(status), None) => {
                l.info.state = RunState::Exited;
                l.info.exit_code = Some(
                    status
                        .code()
                        .or_else(|| status.signal().map(|s| 128 + s))
                        .unwrap_or(-1),
                );
                if let Some(sig) = status.signal() {
                    l.info.message = format!("killed by signal {sig}");
                }
            }
            (Ok(status), Some(reason)) => {
                l.info.state = RunState::Failed;
                l.info.exit_code = status.code();
                l.info.message = format!("stopped by the coordinator: {reason}");
            }
            (Err(e), _) => {
                l.info.state = RunState::Failed;
                l.info.message = format!("lost track of the process: {e}");
            }
        }
        info!(job = %exit.job_id, replica = exit.replica, state = %l.info.state, exit_code = ?l.info.exit_code, "a coordinator job ended");
        l.signals = None;
        l.kill_at = None;
        l.finished_at = Some(now);
        let group = l.group.clone()?;
        self.teardowns.push(Teardown {
            group: group.clone(),
            kill_at: now + self.config.stop_grace,
            termed: false,
            killed: false,
        });
        self.poll(fs, now);
        Some(group)
    }

    /// Due work: SIGKILL after a stop's grace, teardown of ended jobs' cgroups, forgetting jobs
    /// finished longer ago than the retention.
    pub fn poll(&mut self, fs: &CgroupFs, now: Instant) {
        for l in self.jobs.values_mut() {
            if l.kill_at.is_some_and(|t| t <= now) {
                warn!(job = %l.info.job_id, "the job did not stop within the grace period: SIGKILL");
                l.kill_at = None;
                signal_job(fs, l, Signal::SIGKILL);
            }
        }
        self.teardowns.retain_mut(|t| {
            if fs.procs(&t.group).is_empty() {
                if let Err(e) = fs.remove_job_group(&t.group) {
                    warn!(cgroup = %t.group, error = %e, "cannot remove a finished job's cgroup");
                }
                return false;
            }
            if !t.termed {
                let _ = fs.signal_job_group(&t.group, Signal::SIGTERM);
                t.termed = true;
            } else if !t.killed && t.kill_at <= now {
                let _ = fs.signal_job_group(&t.group, Signal::SIGKILL);
                t.killed = true;
            }
            true
        });
        let retention = self.config.finished_retention;
        self.jobs.retain(|_, l| {
            l.finished_at
                .is_none_or(|t| now.saturating_duration_since(t) < retention)
        });
    }

    /// When [`Self::poll`] next has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let kills = self.jobs.values().filter_map(|l| l.kill_at);
        let teardowns = self.teardowns.iter().filter(|t| !t.killed).map(|t| t.kill_at);
        kills.chain(teardowns).min()
    }

    /// Whether a teardown waits for stragglers (poll it on every tick).
    pub fn has_teardowns(&self) -> bool {
        !self.teardowns.is_empty()
    }
}

/// Signal a job's cgroup and its main process (the main process directly too: on a fake root
/// or a v1 hierarchy the cgroup may not list it).
fn signal_job(fs: &CgroupFs, l: &Launched, signal: Signal) {
    if let Some(group) = &l.group
        && let Err(e) = fs.signal_job_group(group, signal)
    {
        warn!(job = %l.info.job_id, error = %e, "cannot signal the job's cgroup");
    }
    if let Some(tx) = &l.signals {
        let _ = tx.send(signal);
    }
}

/// The cgroup directory name of a coordinator job: `<name>-<id>` (`-r<replica>` for a member
/// of a multi-node job), made safe for a cgroup name.
pub fn group_name(name: &str, job_id: &str, replica: u32, replicas: u32) -> String {
    let safe = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.@".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect::<String>()
            .trim_matches(|c| c == '.' || c == '-')
            .to_owned()
    };
    let name: String = safe(name).chars().take(64).collect();
    let id: String = safe(job_id).chars().take(48).collect();
    let mut out = match (name.is_empty(), id.is_empty()) {
        (true, true) => "job".to_owned(),
        (true, false) => format!("job-{id}"),
        (false, true) => name,
        (false, false) => format!("{name}-{id}"),
    };
    if replicas > 1 {
        out.push_str(&format!("-r{replica}"));
    }
    out
}
