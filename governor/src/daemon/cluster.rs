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
//! Running jobs are recorded in a journal (`coordinator-jobs.json` beside the state file); a
//! restarted daemon takes them back with [`Launcher::recover`] before discovery runs, so they
//! stay the coordinator's jobs instead of turning into local ones.
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
    NodeReport, RunState, StartJob, StopJob,
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
    let mut migrations = Vec::new();
    let mut asked: HashSet<String> = HashSet::new();
    for cj in coordinator_jobs {
        let job_id = clip(&cj.job_id, MAX_NAME_LEN);
        if job_id.trim().is_empty() || !seen_ids.insert((job_id.clone(), cj.replica)) {
            continue;
        }
        let governed = cj.cgroup.as_deref().and_then(|c| by_cgroup.get(c).copied());
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
            push_migration(&mut migrations, &mut asked, &report.job_id, g);
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
        push_migration(&mut migrations, &mut asked, &report.job_id, j);
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
        migrations,
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

/// The policy's request to move a job elsewhere, under the id the report gives the job (a
/// replicated job's replicas are asked for once).
fn push_migration(
    migrations: &mut Vec<crate::cluster::MigrationRequest>,
    asked: &mut HashSet<String>,
    job_id: &str,
    j: &crate::status::JobStatus,
) {
    let Some(reason) = &j.migration_request else {
        return;
    };
    if !asked.insert(job_id.to_owned()) {
        return;
    }
    migrations.push(crate::cluster::MigrationRequest {
        job_id: job_id.to_owned(),
        reason: clip(reason, MAX_MESSAGE_LEN),
    });
}

/// The governed job's figures, made valid for the protocol.
fn fill_figures(report: &mut JobReport, j: &crate::status::JobStatus) {
    report.category = j.category;
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
    /// `Ok(None)`: it ended but its status is unknown (a job recovered after a restart of the
    /// daemon is not the daemon's child, so it cannot be waited for).
    pub status: std::io::Result<Option<ExitStatus>>,
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
    /// The coordinator's id of the job.
    pub job_id: String,
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
    /// Where the running jobs are recorded (`coordinator-jobs.json` beside the daemon's state
    /// file), so that a restarted daemon takes them back ([`Launcher::recover`]); `None`: not
    /// recorded.
    pub journal: Option<PathBuf>,
    /// The `governor` binary, to start each job under `governor supervise` (the job's parent
    /// for its whole life), so that its exit status is known even when it ends after a restart
    /// of the daemon; `None`: the job is started directly (then such a status is lost).
    pub supervisor: Option<PathBuf>,
}

/// What the journal keeps of a running job: enough to report it under its coordinator id and
/// govern it again after a restart of the daemon.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct JournalEntry {
    job_id: String,
    replica: u32,
    name: String,
    gpu_indices: Vec<u32>,
    message: String,
    adopt: AdoptJob,
    maximise: bool,
    priority: i32,
    /// The main process's start ([`crate::sys::process_start_ticks`]): a pid reused by another
    /// process is not taken for the job.
    start_ticks: Option<u64>,
    /// Where its supervisor records how it ended ([`crate::supervise::ExitRecord`]).
    #[serde(default)]
    exit_file: Option<PathBuf>,
}

/// The journal file's content.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Journal {
    version: u32,
    jobs: Vec<JournalEntry>,
}

const JOURNAL_VERSION: u32 = 1;

/// The journal's file name, in the directory of the daemon's state file.
pub const JOURNAL_FILE_NAME: &str = "coordinator-jobs.json";

struct Launched {
    info: CoordinatorJob,
    /// Recorded in the journal while the job runs.
    record: Option<JournalEntry>,
    /// Where its supervisor records how it ended (read and removed when it ends).
    exit_file: Option<PathBuf>,
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
            record: None,
            exit_file: None,
            group: None,
            signals: None,
            stop_reason: None,
            kill_at: None,
            finished_at: None,
        };
        match self.spawn(fs, &s, &mut launched) {
            Ok(started) => {
                info!(job = %s.job_id, replica = s.replica, name = %s.name, cgroup = %started.adopt.cgroup, pid = started.adopt.pid, "started a job for the coordinator");
                launched.record = Some(JournalEntry {
                    job_id: s.job_id.clone(),
                    replica: s.replica,
                    name: s.name.clone(),
                    gpu_indices: s.gpu_indices.clone(),
                    message: launched.info.message.clone(),
                    adopt: started.adopt.clone(),
                    maximise: started.maximise,
                    priority: started.priority,
                    start_ticks: crate::sys::process_start_ticks(started.adopt.pid),
                    exit_file: launched.exit_file.clone(),
                });
                self.jobs.insert(key, launched);
                self.persist();
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
        let mut command = match &self.config.supervisor {
            Some(governor) => {
                let exit_file = self.config.output_dir.join(format!("{group_name}.exit"));
                // A record left by an earlier run of the same job id is not this run's.
                let _ = std::fs::remove_file(&exit_file);
                let mut command = std::process::Command::new(governor);
                command
                    .arg("supervise")
                    .arg("--status-file")
                    .arg(&exit_file)
                    .arg("--");
                launched.exit_file = Some(exit_file);
                command
            }
            None => std::process::Command::new(&s.argv[0]),
        };
        let program_args = if self.config.supervisor.is_some() {
            &s.argv[..]
        } else {
            &s.argv[1..]
        };
        command
            .args(program_args)
            .envs(&s.env)
            .env("GOVERNOR_LOG", &s.log_path)
            .env("GOVERNOR_JOB", &s.name)
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(errors);
        // Its own process group: a Ctrl-C meant for a foreground daemon must not reach the jobs.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
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
                status: status.map(Some),
            });
        });
        launched.signals = Some(sig_tx);
        launched.info.state = RunState::Running;
        launched.info.message = format!("output in {}", output_path.display());
        Ok(StartedJob {
            job_id: s.job_id.clone(),
            adopt: AdoptJob {
                name: s.name.clone(),
                cgroup: group.to_string(),
                logs: vec![s.log_path.clone()],
                metric: (!s.metric.is_empty()).then(|| s.metric.clone()),
                format: None,
                pid,
                // `govctl submit --epochs N` passes GOVERNOR_EPOCHS, as for any job.
                epochs: declared_epochs(&s.env),
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
        // The supervisor's record: the job's own status even when the daemon is not its
        // supervisor's parent (recovered after a restart), and why a program did not start.
        let record = l.exit_file.take().and_then(|file| take_exit_record(&file));
        let status = match (&record, exit.status) {
            (Some(r), Ok(_)) if r.status().is_some() => Ok(r.status()),
            (_, status) => status,
        };
        let start_error = record.and_then(|r| r.error);
        match (&status, stopped) {
            (Ok(_), None) if start_error.is_some() => {
                l.info.state = RunState::Failed;
                l.info.exit_code = Some(127);
                l.info.message = start_error.unwrap_or_default();
            }
            (Ok(None), None) => {
                l.info.state = RunState::Exited;
                l.info.exit_code = None;
                l.info.message = "ended after the governor restarted; its exit status is unknown (it was not the restarted daemon's child)".into();
            }
            (Ok(None), Some(reason)) => {
                l.info.state = RunState::Failed;
                l.info.message = format!("stopped by the coordinator: {reason}");
            }
            (Ok(Some(status)), None) => {
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
            (Ok(Some(status)), Some(reason)) => {
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
        l.record = None;
        let group = l.group.clone();
        self.persist();
        let group = group?;
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
        let teardowns = self
            .teardowns
            .iter()
            .filter(|t| !t.killed)
            .map(|t| t.kill_at);
        kills.chain(teardowns).min()
    }

    /// Whether a teardown waits for stragglers (poll it on every tick).
    pub fn has_teardowns(&self) -> bool {
        !self.teardowns.is_empty()
    }

    /// Write the running jobs to the journal (atomically: a crash leaves the old or the new
    /// file). A failure is logged once; the jobs run on, only a restart would not know them.
    fn persist(&mut self) {
        let Some(path) = self.config.journal.clone() else {
            return;
        };
        let journal = Journal {
            version: JOURNAL_VERSION,
            jobs: self
                .jobs
                .values()
                .filter(|l| !l.info.state.is_finished())
                .filter_map(|l| l.record.clone())
                .collect(),
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("json.tmp");
            let text = serde_json::to_vec_pretty(&journal).map_err(std::io::Error::other)?;
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, &path)
        };
        match write() {
            Ok(()) => {
                self.logged.remove("journal");
            }
            Err(e) => self.warn_once(
                "journal".into(),
                &format!(
                    "cannot record the coordinator's jobs in {}: {e}; a restarted daemon would report them as local jobs",
                    path.display()
                ),
            ),
        }
    }

    /// Take back the jobs a previous run of the daemon started (from the journal): a job whose
    /// main process still runs is reported under its coordinator id again and returned, for the
    /// daemon to govern; its end is noticed through a pidfd, and its exit status read from its
    /// supervisor's record (without a supervisor it is lost: the job is not this process's
    /// child). A job that ended meanwhile is reported with the status its supervisor recorded
    /// (unknown without one) and its cgroup torn down. A missing journal is a first start; an unreadable one is
    /// logged and set aside (`.bad`), never fatal. Must run inside a tokio runtime.
    pub fn recover(&mut self, fs: &CgroupFs, now: Instant) -> Vec<StartedJob> {
        let Some(path) = self.config.journal.clone() else {
            return Vec::new();
        };
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read the journal of the coordinator's jobs: their jobs are reported as local ones");
                return Vec::new();
            }
        };
        let journal: Journal = match serde_json::from_slice(&text) {
            Ok(j) => j,
            Err(e) => {
                let aside = path.with_extension("json.bad");
                let _ = std::fs::rename(&path, &aside);
                warn!(path = %path.display(), moved_to = %aside.display(), error = %e, "the journal of the coordinator's jobs is not valid: set aside; their jobs are reported as local ones");
                return Vec::new();
            }
        };
        let mut resumed = Vec::new();
        for entry in journal.jobs {
            let key = (entry.job_id.clone(), entry.replica);
            if self.jobs.contains_key(&key) {
                continue;
            }
            let group = JobCgroup::new(&entry.adopt.cgroup).ok();
            let mut launched = Launched {
                info: CoordinatorJob {
                    job_id: entry.job_id.clone(),
                    replica: entry.replica,
                    name: entry.name.clone(),
                    cgroup: group.as_ref().map(ToString::to_string),
                    state: RunState::Running,
                    exit_code: None,
                    message: entry.message.clone(),
                    gpu_indices: entry.gpu_indices.clone(),
                },
                record: Some(entry.clone()),
                exit_file: entry.exit_file.clone(),
                group: group.clone(),
                signals: None,
                stop_reason: None,
                kill_at: None,
                finished_at: None,
            };
            match follow_running(&entry, self.exits.clone()) {
                Some(signals) => {
                    info!(job = %entry.job_id, replica = entry.replica, name = %entry.name, pid = entry.adopt.pid, "took back a job the coordinator placed here before the restart");
                    launched.signals = Some(signals);
                    resumed.push(StartedJob {
                        job_id: entry.job_id.clone(),
                        adopt: entry.adopt.clone(),
                        maximise: entry.maximise,
                        priority: entry.priority,
                    });
                }
                None => {
                    info!(job = %entry.job_id, replica = entry.replica, name = %entry.name, "a job the coordinator placed here ended while the governor was not running");
                    describe_end_while_away(&mut launched);
                    launched.record = None;
                    launched.finished_at = Some(now);
                    if let Some(group) = group {
                        self.teardowns.push(Teardown {
                            group,
                            kill_at: now + self.config.stop_grace,
                            termed: false,
                            killed: false,
                        });
                    }
                }
            }
            self.jobs.insert(key, launched);
        }
        self.persist();
        self.poll(fs, now);
        resumed
    }
}

/// Read a supervisor's record and remove its file. Only a file that is a record is removed: the
/// path comes from the journal, and a damaged journal must not make the daemon delete anything
/// else.
fn take_exit_record(file: &Path) -> Option<crate::supervise::ExitRecord> {
    let record = crate::supervise::ExitRecord::read(file)?;
    let _ = std::fs::remove_file(file);
    Some(record)
}

/// Set the state of a job that ended while no daemon ran, from its supervisor's record when
/// there is one (which is then removed).
fn describe_end_while_away(launched: &mut Launched) {
    let record = launched
        .exit_file
        .take()
        .and_then(|file| take_exit_record(&file));
    let info = &mut launched.info;
    match record {
        Some(crate::supervise::ExitRecord {
            error: Some(error), ..
        }) => {
            info.state = RunState::Failed;
            info.exit_code = Some(127);
            info.message = error;
        }
        Some(record) if record.status().is_some() => {
            use std::os::unix::process::ExitStatusExt;
            let status = record.status().unwrap_or_default();
            info.state = RunState::Exited;
            info.exit_code = status.code().or_else(|| status.signal().map(|s| 128 + s));
            info.message = match status.signal() {
                Some(sig) => format!("killed by signal {sig} while the governor was not running"),
                None => "ended while the governor was not running".into(),
            };
        }
        _ => {
            info.state = RunState::Exited;
            info.message =
                "ended while the governor was not running; its exit status is unknown".into();
        }
    }
}

/// Follow a recovered job's main process through a pidfd: the returned channel signals it (never
/// a process that reused its pid), and its end arrives on `exits` with an unknown status. `None`
/// when the process is gone (or its pid now names another process).
fn follow_running(
    entry: &JournalEntry,
    exits: mpsc::UnboundedSender<JobExit>,
) -> Option<mpsc::UnboundedSender<Signal>> {
    let pid = entry.adopt.pid;
    if pid == 0 {
        return None;
    }
    let pidfd = crate::sys::pidfd_open(pid).ok()?;
    // Checked after pidfd_open: if the start matches now, the pidfd holds the job's process.
    let start = crate::sys::process_start_ticks(pid)?;
    if entry.start_ticks.is_some_and(|s| s != start) {
        return None;
    }
    let pidfd = crate::sys::async_readable(pidfd)
        .map_err(|e| warn!(pid, error = %e, "cannot follow a recovered job's process"))
        .ok()?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Signal>();
    let (job_id, replica) = (entry.job_id.clone(), entry.replica);
    tokio::spawn(async move {
        let status = loop {
            tokio::select! {
                ready = pidfd.readable() => break ready.map(|_| None),
                Some(sig) = rx.recv() => {
                    use std::os::fd::AsFd;
                    let _ = crate::sys::pidfd_send_signal(pidfd.get_ref().as_fd(), sig);
                }
            }
        };
        let _ = exits.send(JobExit {
            job_id,
            replica,
            status,
        });
    });
    Some(tx)
}

/// Signal a job's cgroup and its main process (the main process directly too: on a fake root
/// or a v1 hierarchy the cgroup may not list it).
/// Total epochs a coordinator job declared through `GOVERNOR_EPOCHS` in its environment (the
/// same rule as for discovered jobs: a positive number, anything else ignored with a warning).
fn declared_epochs(env: &BTreeMap<String, String>) -> Option<f64> {
    let value = env.get("GOVERNOR_EPOCHS")?;
    let epochs = value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|e| e.is_finite() && *e > 0.0);
    if epochs.is_none() {
        warn!(value = %value, "GOVERNOR_EPOCHS is not a positive number; the job's remaining work stays unknown");
    }
    epochs
}

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
    // `cgroup.procs-j1` would read as an interface file of the parent.
    if crate::cgroup::jobs::validate_job_name(&out).is_err() {
        out = format!("job-{out}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::FakeCgroupRoot;
    use crate::policy::Category;
    use crate::status::JobStatus;
    use governor_proto::pb;

    /// The report as the coordinator receives it: through the wire types and their validation.
    fn over_the_wire(report: &NodeReport) -> NodeReport {
        NodeReport::try_from(pb::NodeReport::from(report.clone()))
            .unwrap_or_else(|e| panic!("the coordinator would refuse the report: {e}\n{report:#?}"))
    }

    fn governed(name: &str, cgroup: &str) -> JobStatus {
        JobStatus {
            name: name.into(),
            cgroup: cgroup.into(),
            source: "launched".into(),
            category: Category::Progressing,
            signal: Some("loss".into()),
            signal_value: Some(0.75),
            growth_per_minute: Some(0.6),
            cpu_usage_cores: Some(1.5),
            cpu_weight: Some(400),
            cpu_max_cores: Some(2.0),
            memory_bytes: Some(300 << 20),
            ..JobStatus::default()
        }
    }

    fn coordinator_job(
        id: &str,
        name: &str,
        cgroup: Option<&str>,
        state: RunState,
    ) -> CoordinatorJob {
        CoordinatorJob {
            job_id: id.into(),
            replica: 0,
            name: name.into(),
            cgroup: cgroup.map(str::to_owned),
            state,
            exit_code: None,
            message: String::new(),
            gpu_indices: Vec::new(),
        }
    }

    #[test]
    fn the_report_carries_coordinator_and_local_jobs_with_their_figures() {
        let status = NodeStatus {
            node: "node2".into(),
            jobs: vec![
                governed("resnet", "/governor.slice/jobs/resnet-j1"),
                JobStatus {
                    source: "declared".into(),
                    category: Category::Converged,
                    growth_per_minute: Some(-0.3),
                    ..governed("bert", "/system.slice/bert.service")
                },
            ],
            ..NodeStatus::default()
        };
        let mut running = coordinator_job(
            "j1",
            "resnet",
            Some("/governor.slice/jobs/resnet-j1"),
            RunState::Running,
        );
        running.gpu_indices = vec![1];
        let mut done = coordinator_job("j2", "gpt", None, RunState::Exited);
        done.exit_code = Some(0);
        let gpus = [
            GpuUsage {
                index: 0,
                utilization_percent: 10,
                memory_used_bytes: 1 << 30,
                power_milliwatts: None,
            },
            GpuUsage {
                index: 1,
                utilization_percent: 80,
                memory_used_bytes: 2 << 30,
                power_milliwatts: Some(250_000),
            },
        ];
        let report = over_the_wire(&node_report(&status, [&running, &done], &gpus));

        assert_eq!(report.jobs.len(), 3, "{report:#?}");
        let j1 = &report.jobs[0];
        assert_eq!(
            (j1.job_id.as_str(), j1.name.as_str(), j1.origin, j1.state),
            ("j1", "resnet", JobOrigin::Coordinator, RunState::Running)
        );
        assert_eq!(j1.category, Category::Progressing);
        assert_eq!(j1.progress, Some(0.75));
        let growth = j1.growth.unwrap();
        assert!((growth - 0.01).abs() < 1e-12, "0.6/min is 0.01/s: {growth}");
        assert!((j1.growth_efficiency.unwrap() - 0.01 / 1.5).abs() < 1e-12);
        assert_eq!(j1.cpu_cores, 1.5);
        assert_eq!(j1.cpu_limit_cores, Some(2.0));
        assert_eq!(j1.cpu_weight, 400);
        assert_eq!(j1.memory_bytes, 300 << 20);
        assert_eq!(j1.gpu_indices, vec![1]);
        assert_eq!(j1.gpu_utilization, 0.8, "its own GPU only");
        assert_eq!(j1.gpu_memory_bytes, 2 << 30);

        let j2 = &report.jobs[1];
        assert_eq!(
            (j2.job_id.as_str(), j2.state, j2.exit_code),
            ("j2", RunState::Exited, Some(0)),
            "a finished job stays in the report with its exit status"
        );
        assert_eq!(j2.cpu_cores, 0.0);

        let local = &report.jobs[2];
        assert_eq!(local.job_id, "/system.slice/bert.service");
        assert_eq!(local.name, "bert");
        assert_eq!(local.origin, JobOrigin::Local);
        assert_eq!(local.state, RunState::Running);
        assert_eq!(local.category, Category::Converged);
        assert_eq!(local.growth, Some(0.0), "a worsening signal is no growth");

        assert_eq!(report.cpu_used_cores, 3.0);
        assert_eq!(report.memory_used_bytes, 600 << 20);
        assert_eq!(report.gpus.len(), 2);
        assert_eq!(report.gpus[1].utilization, 0.8);
    }

    #[test]
    fn migration_requests_name_the_job_as_the_report_does() {
        let mut vae = governed("vae", "/governor.slice/jobs/vae-j3");
        vae.migration_request = Some("converged while others progress".into());
        let mut local = governed("bert", "/docker/abc");
        local.migration_request = Some("converged".into());
        let status = NodeStatus {
            jobs: vec![vae, local, governed("gpt", "/docker/def")],
            ..NodeStatus::default()
        };
        let jobs = [coordinator_job(
            "j3",
            "vae",
            Some("/governor.slice/jobs/vae-j3"),
            RunState::Running,
        )];
        let report = over_the_wire(&node_report(&status, &jobs, &[]));
        let asked: Vec<(&str, &str)> = report
            .migrations
            .iter()
            .map(|m| (m.job_id.as_str(), m.reason.as_str()))
            .collect();
        assert_eq!(
            asked,
            [
                ("j3", "converged while others progress"),
                ("/docker/abc", "converged")
            ]
        );
    }

    #[test]
    fn odd_values_never_make_the_report_invalid() {
        let status = NodeStatus {
            jobs: vec![
                JobStatus {
                    name: "é".repeat(300),
                    signal_value: Some(f64::NAN),
                    growth_per_minute: Some(f64::INFINITY),
                    cpu_usage_cores: Some(-0.5),
                    cpu_max_cores: Some(0.0),
                    ..governed("x", "/a")
                },
                JobStatus {
                    name: "  ".into(),
                    ..governed("x", "/b")
                },
            ],
            ..NodeStatus::default()
        };
        let mut failed = coordinator_job("j9", "bad", None, RunState::Failed);
        failed.message = "x".repeat(10_000);
        failed.gpu_indices = vec![3, 3];
        let twice = failed.clone();
        let gpus = [GpuUsage {
            index: 3,
            utilization_percent: 250,
            ..GpuUsage::default()
        }];
        let report = over_the_wire(&node_report(&status, [&failed, &twice], &gpus));
        assert_eq!(
            report.jobs.len(),
            3,
            "a job reported twice is reported once"
        );
        let a = report.jobs.iter().find(|j| j.job_id == "/a").unwrap();
        assert!(a.name.len() <= MAX_NAME_LEN && a.name.starts_with('é'));
        assert_eq!((a.progress, a.growth, a.cpu_cores), (None, None, 0.0));
        assert_eq!(a.cpu_limit_cores, None);
        let b = report.jobs.iter().find(|j| j.job_id == "/b").unwrap();
        assert_eq!(b.name, "/b", "a blank name is replaced by the cgroup");
        let j9 = report.jobs.iter().find(|j| j.job_id == "j9").unwrap();
        assert_eq!(j9.message.len(), MAX_MESSAGE_LEN);
        assert_eq!(j9.gpu_indices, vec![3]);
        assert_eq!(report.gpus[0].utilization, 1.0);
    }

    #[test]
    fn capacity_lists_the_gpus() {
        let cap = node_capacity(
            &NodeResources {
                cores: 8.0,
                memory_bytes: 64 << 30,
            },
            &[GpuInfo {
                index: 0,
                uuid: "GPU-0".into(),
                model: "NVIDIA H200".into(),
                memory_bytes: 141 << 30,
            }],
        );
        assert_eq!((cap.cores, cap.memory_bytes), (8.0, 64 << 30));
        assert_eq!(cap.gpus[0].model, "NVIDIA H200");
        assert_eq!(cap.gpus[0].memory_bytes, 141 << 30);
    }

    #[test]
    fn the_agent_state_reads_well_in_status() {
        let a = "10.10.0.1:7070";
        assert_eq!(
            describe_agent(a, &AgentStatus::Connected { session: 4 }, None),
            "10.10.0.1:7070 connected (session 4)"
        );
        assert_eq!(
            describe_agent(a, &AgentStatus::Connecting { attempt: 1 }, None),
            "10.10.0.1:7070 connecting"
        );
        let waiting = AgentStatus::Waiting {
            error: "cannot reach the coordinator: connection refused".into(),
            retry_in: Duration::from_millis(1500),
        };
        assert_eq!(
            describe_agent(a, &waiting, None),
            "10.10.0.1:7070 retrying in 1.5s: cannot reach the coordinator: connection refused"
        );
        assert_eq!(
            describe_agent(a, &AgentStatus::Connecting { attempt: 3 }, Some("refused")),
            "10.10.0.1:7070 retrying (attempt 3; last error: refused)"
        );
    }

    #[test]
    fn declared_epochs_must_be_a_positive_number() {
        let env = |v: &str| BTreeMap::from([("GOVERNOR_EPOCHS".to_owned(), v.to_owned())]);
        assert_eq!(declared_epochs(&env("12")), Some(12.0));
        assert_eq!(declared_epochs(&env(" 2.5 ")), Some(2.5));
        for bad in ["0", "-3", "NaN", "inf", "many", ""] {
            assert_eq!(declared_epochs(&env(bad)), None, "{bad:?}");
        }
        assert_eq!(declared_epochs(&BTreeMap::new()), None);
    }

    #[test]
    fn group_names_are_safe_and_distinct_per_job() {
        assert_eq!(group_name("resnet", "j1", 0, 1), "resnet-j1");
        assert_eq!(
            group_name("bert finetune/v2", "j12", 0, 1),
            "bert-finetune-v2-j12"
        );
        assert_eq!(group_name("ddp", "j3", 2, 4), "ddp-j3-r2");
        assert_eq!(group_name("..", "", 0, 1), "job");
        assert_eq!(group_name("", "j4", 0, 1), "job-j4");
        assert_eq!(group_name("cpu.max", "j5", 0, 1), "job-cpu.max-j5");
        for name in [
            group_name(&"x".repeat(300), &"y".repeat(300), 7, 8),
            group_name("cgroup.procs", "j1", 0, 1),
            group_name("memory.high", "j1", 0, 1),
        ] {
            crate::cgroup::jobs::validate_job_name(&name)
                .unwrap_or_else(|e| panic!("{name:?}: {e}"));
        }
    }

    // ---- the launcher, on a fake cgroup root ------------------------------------------------

    struct Bed {
        dir: tempfile::TempDir,
        fake: FakeCgroupRoot,
        fs: CgroupFs,
        launcher: Launcher,
        exits: mpsc::UnboundedReceiver<JobExit>,
    }

    fn bed(stop_grace: Duration) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cgroup");
        std::fs::create_dir(&root).unwrap();
        let fake = FakeCgroupRoot::unified(&root);
        let fs = CgroupFs::detect(&root).unwrap();
        let (launcher, exits) = Launcher::new(LauncherConfig {
            subtree: "governor.slice/jobs".into(),
            output_dir: dir.path().join("out"),
            gpus: [0, 1].into_iter().collect(),
            stop_grace,
            finished_retention: Duration::from_secs(60),
            journal: Some(dir.path().join("run/coordinator-jobs.json")),
            supervisor: None,
        });
        Bed {
            dir,
            fake,
            fs,
            launcher,
            exits,
        }
    }

    fn start_job(id: &str, name: &str, script: &str) -> StartJob {
        StartJob {
            job_id: id.into(),
            replica: 0,
            replicas: 1,
            name: name.into(),
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            log_path: "/tmp/train.log".into(),
            metric: "loss".into(),
            maximise: false,
            gpu_indices: Vec::new(),
            priority: 0,
            env: [("GOVERNOR_JOB_ID".to_owned(), id.to_owned())].into(),
            cores: None,
            memory_bytes: None,
        }
    }

    impl Bed {
        /// The kernel creates a group's files on mkdir; on a fake root the test does.
        fn prepare_group(&self, group: &str) {
            self.fake.add_group(&format!("governor.slice/jobs/{group}"));
        }
        fn state(&self, id: &str) -> CoordinatorJob {
            self.launcher
                .jobs()
                .find(|j| j.job_id == id)
                .unwrap_or_else(|| panic!("{id} is not reported"))
                .clone()
        }
        /// The daemon stops (the jobs run on) and starts again with the same configuration.
        fn restart(&mut self) {
            let config = self.launcher.config.clone();
            let (launcher, exits) = Launcher::new(config);
            self.launcher = launcher;
            self.exits = exits;
        }
        fn journal(&self) -> Journal {
            let path = self.dir.path().join("run/coordinator-jobs.json");
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
        }
        async fn next_exit(&mut self) -> JobExit {
            tokio::time::timeout(Duration::from_secs(20), self.exits.recv())
                .await
                .expect("the job did not end within 20 s")
                .expect("the exit channel is open")
        }
    }

    #[tokio::test]
    async fn a_started_job_runs_in_its_cgroup_and_reports_its_exit_status() {
        let mut bed = bed(Duration::from_secs(5));
        bed.prepare_group("resnet-j1");
        let mut s = start_job(
            "j1",
            "resnet",
            "echo \"id=$GOVERNOR_JOB_ID log=$GOVERNOR_LOG gpus=$CUDA_VISIBLE_DEVICES\"; echo oops >&2; exit 3",
        );
        s.gpu_indices = vec![1, 0];
        s.env.insert("GOVERNOR_EPOCHS".into(), "48".into());
        let started = match bed.launcher.start(&bed.fs, s.clone()) {
            StartOutcome::Started(started) => started,
            other => panic!("not started: {other:?}"),
        };
        assert_eq!(started.adopt.cgroup, "/governor.slice/jobs/resnet-j1");
        assert_eq!(started.adopt.logs, vec!["/tmp/train.log".to_owned()]);
        assert_eq!(started.adopt.metric.as_deref(), Some("loss"));
        assert_eq!(started.adopt.epochs, Some(48.0), "govctl submit --epochs");
        assert!(started.adopt.pid > 0);
        let job = bed.state("j1");
        assert_eq!(job.state, RunState::Running);
        assert_eq!(
            job.cgroup.as_deref(),
            Some("/governor.slice/jobs/resnet-j1")
        );
        assert_eq!(
            bed.fake
                .get("governor.slice/jobs/resnet-j1", "cgroup.procs"),
            "0",
            "the job joined its cgroup before exec"
        );
        assert!(
            matches!(bed.launcher.start(&bed.fs, s), StartOutcome::Duplicate),
            "a resent start is ignored"
        );

        let exit = bed.next_exit().await;
        let group = bed.launcher.on_exit(&bed.fs, exit, Instant::now());
        assert_eq!(
            group.map(|g| g.to_string()).as_deref(),
            Some("/governor.slice/jobs/resnet-j1")
        );
        let job = bed.state("j1");
        assert_eq!((job.state, job.exit_code), (RunState::Exited, Some(3)));
        let output = std::fs::read_to_string(bed.dir.path().join("out/resnet-j1.out")).unwrap();
        assert_eq!(
            output, "id=j1 log=/tmp/train.log gpus=1,0\noops\n",
            "stdout and stderr go to the output file; CUDA_VISIBLE_DEVICES lists the reserved GPUs"
        );
        assert!(
            !bed.fake
                .root()
                .join("governor.slice/jobs/resnet-j1")
                .exists(),
            "the ended job's cgroup is removed"
        );
        // It stays in the reports for the retention period, then goes.
        bed.launcher
            .poll(&bed.fs, Instant::now() + Duration::from_secs(59));
        assert_eq!(bed.launcher.jobs().count(), 1);
        bed.launcher
            .poll(&bed.fs, Instant::now() + Duration::from_secs(61));
        assert_eq!(bed.launcher.jobs().count(), 0);
    }

    #[tokio::test]
    async fn bad_starts_are_reported_failed_and_leave_nothing_behind() {
        let mut bed = bed(Duration::from_secs(5));
        let mut s = start_job("j2", "needs-gpu", "true");
        s.gpu_indices = vec![7];
        match bed.launcher.start(&bed.fs, s) {
            StartOutcome::Failed(reason) => {
                assert!(reason.contains("GPU 7 does not exist"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let job = bed.state("j2");
        assert_eq!(job.state, RunState::Failed);
        assert!(job.message.contains("GPU 7"), "{}", job.message);
        assert!(
            !bed.fake
                .root()
                .join("governor.slice/jobs/needs-gpu-j2")
                .exists()
        );

        bed.prepare_group("missing-j3");
        let mut s = start_job("j3", "missing", "");
        s.argv = vec!["/nonexistent/train".into()];
        match bed.launcher.start(&bed.fs, s) {
            StartOutcome::Failed(reason) => {
                assert!(
                    reason.contains("cannot start \"/nonexistent/train\""),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(
            !bed.fake
                .root()
                .join("governor.slice/jobs/missing-j3")
                .exists(),
            "the cgroup made for a job that could not start is removed"
        );

        let mut s = start_job("j4", "relative", "true");
        s.log_path = "train.log".into();
        assert!(
            matches!(bed.launcher.start(&bed.fs, s), StartOutcome::Failed(r) if r.contains("not absolute"))
        );
        let mut s = start_job("j5", "empty", "true");
        s.argv.clear();
        assert!(
            matches!(bed.launcher.start(&bed.fs, s), StartOutcome::Failed(r) if r.contains("argv is empty"))
        );

        // Stopping a job that is not here is not an error.
        let stop = StopJob {
            job_id: "j404".into(),
            reason: "cancelled".into(),
        };
        assert_eq!(bed.launcher.stop(&bed.fs, &stop, Instant::now()), 0);
        assert!(bed.exits.try_recv().is_err(), "nothing ran");
    }

    #[tokio::test]
    async fn stop_terminates_the_job_and_kills_it_after_the_grace_period() {
        let mut bed = bed(Duration::from_millis(300));
        bed.prepare_group("polite-j1");
        bed.prepare_group("stubborn-j2");
        let polite = start_job("j1", "polite", "exec sleep 30");
        // Ignores SIGTERM: only SIGKILL after the grace period ends it.
        let stubborn = start_job(
            "j2",
            "stubborn",
            "trap '' TERM; while :; do sleep 0.05; done",
        );
        for s in [polite, stubborn] {
            assert!(matches!(
                bed.launcher.start(&bed.fs, s),
                StartOutcome::Started(_)
            ));
        }
        // Let the shell install its trap.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t0 = Instant::now();
        for id in ["j1", "j2"] {
            let stop = StopJob {
                job_id: id.into(),
                reason: "cancelled by admin".into(),
            };
            assert_eq!(bed.launcher.stop(&bed.fs, &stop, t0), 1);
        }
        assert_eq!(
            bed.launcher.next_deadline(),
            Some(t0 + Duration::from_millis(300))
        );
        let exit = bed.next_exit().await;
        assert_eq!(exit.job_id, "j1", "SIGTERM ends the polite job at once");
        bed.launcher.on_exit(&bed.fs, exit, Instant::now());
        let j1 = bed.state("j1");
        assert_eq!(j1.state, RunState::Failed);
        assert!(j1.message.contains("cancelled by admin"), "{}", j1.message);

        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(
            bed.exits.try_recv().is_err(),
            "the stubborn job survived SIGTERM"
        );
        bed.launcher.poll(&bed.fs, Instant::now());
        let exit = bed.next_exit().await;
        assert_eq!(exit.job_id, "j2");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            exit.status.as_ref().unwrap().unwrap().signal(),
            Some(libc::SIGKILL)
        );
        bed.launcher.on_exit(&bed.fs, exit, Instant::now());
        assert_eq!(bed.state("j2").state, RunState::Failed);
        assert_eq!(bed.launcher.next_deadline(), None);
    }

    #[tokio::test]
    async fn a_restarted_daemon_takes_back_the_running_jobs_and_reports_the_ended_ones() {
        let mut bed = bed(Duration::from_secs(5));
        bed.prepare_group("long-j1");
        bed.prepare_group("short-j2");
        let mut long = start_job("j1", "long", "exec sleep 60");
        long.gpu_indices = vec![1];
        long.priority = 3;
        let StartOutcome::Started(started) = bed.launcher.start(&bed.fs, long.clone()) else {
            panic!("long did not start")
        };
        let long_pid = started.adopt.pid;
        let short = start_job("j2", "short", "sleep 0.3");
        assert!(matches!(
            bed.launcher.start(&bed.fs, short),
            StartOutcome::Started(_)
        ));
        let recorded: Vec<String> = bed
            .journal()
            .jobs
            .iter()
            .map(|e| e.job_id.clone())
            .collect();
        assert_eq!(recorded, ["j1", "j2"]);

        // The daemon goes away; `short` ends while it is away (its old waiting task reaps it).
        bed.restart();
        tokio::time::sleep(Duration::from_millis(600)).await;

        let resumed = bed.launcher.recover(&bed.fs, Instant::now());
        assert_eq!(resumed.len(), 1, "{resumed:?}");
        assert_eq!(resumed[0].job_id, "j1");
        assert_eq!(resumed[0].adopt, started.adopt, "governed as before");
        assert_eq!(resumed[0].priority, 3);
        let j1 = bed.state("j1");
        assert_eq!(j1.state, RunState::Running);
        assert_eq!(j1.cgroup.as_deref(), Some("/governor.slice/jobs/long-j1"));
        assert_eq!(j1.gpu_indices, vec![1]);
        let j2 = bed.state("j2");
        assert_eq!((j2.state, j2.exit_code), (RunState::Exited, None));
        assert!(j2.message.contains("exit status is unknown"), "{j2:?}");
        let recorded: Vec<String> = bed
            .journal()
            .jobs
            .iter()
            .map(|e| e.job_id.clone())
            .collect();
        assert_eq!(recorded, ["j1"], "only the running job stays recorded");
        assert!(
            matches!(bed.launcher.start(&bed.fs, long), StartOutcome::Duplicate),
            "the coordinator's resent start does not start it twice"
        );

        // The coordinator cancels it: the signal goes through the pidfd, the end is noticed.
        let stop = StopJob {
            job_id: "j1".into(),
            reason: "cancelled".into(),
        };
        assert_eq!(bed.launcher.stop(&bed.fs, &stop, Instant::now()), 1);
        let exit = bed.next_exit().await;
        assert_eq!((exit.job_id.as_str(), exit.replica), ("j1", 0));
        assert!(matches!(exit.status, Ok(None)), "{:?}", exit.status);
        bed.launcher.on_exit(&bed.fs, exit, Instant::now());
        let j1 = bed.state("j1");
        assert_eq!(j1.state, RunState::Failed);
        assert!(j1.message.contains("cancelled"), "{j1:?}");
        assert!(bed.journal().jobs.is_empty());
        assert!(
            crate::sys::process_start_ticks(long_pid).is_none()
                || std::fs::read_to_string(format!("/proc/{long_pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "the job's process is gone"
        );
    }

    #[tokio::test]
    async fn a_journal_that_names_a_reused_pid_or_is_garbage_starts_nothing_and_keeps_the_daemon_up()
     {
        let mut bed = bed(Duration::from_secs(5));
        let path = bed.dir.path().join("run/coordinator-jobs.json");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // This very test process under the job's pid, but with another start: a reused pid.
        let me = std::process::id();
        let entry = JournalEntry {
            job_id: "j7".into(),
            replica: 0,
            name: "old".into(),
            gpu_indices: Vec::new(),
            message: String::new(),
            adopt: AdoptJob {
                name: "old".into(),
                cgroup: "/governor.slice/jobs/old-j7".into(),
                logs: vec!["/tmp/old.log".into()],
                metric: None,
                format: None,
                pid: me,
                epochs: None,
            },
            maximise: false,
            priority: 0,
            start_ticks: crate::sys::process_start_ticks(me).map(|t| t + 1),
            exit_file: None,
        };
        let journal = Journal {
            version: JOURNAL_VERSION,
            jobs: vec![entry],
        };
        std::fs::write(&path, serde_json::to_vec(&journal).unwrap()).unwrap();
        assert!(bed.launcher.recover(&bed.fs, Instant::now()).is_empty());
        assert_eq!(bed.state("j7").state, RunState::Exited);

        bed.restart();
        std::fs::write(&path, b"{ not json").unwrap();
        assert!(bed.launcher.recover(&bed.fs, Instant::now()).is_empty());
        assert!(path.with_extension("json.bad").exists(), "set aside");
        assert_eq!(bed.launcher.jobs().count(), 0);
        // Nothing recorded: a later start writes a fresh journal.
        bed.prepare_group("next-j8");
        assert!(matches!(
            bed.launcher
                .start(&bed.fs, start_job("j8", "next", "sleep 0.1")),
            StartOutcome::Started(_)
        ));
        assert_eq!(bed.journal().jobs.len(), 1);
        let exit = bed.next_exit().await;
        bed.launcher.on_exit(&bed.fs, exit, Instant::now());
    }

    fn journal_entry(
        id: &str,
        pid: u32,
        start_ticks: Option<u64>,
        exit_file: &Path,
    ) -> JournalEntry {
        JournalEntry {
            job_id: id.into(),
            replica: 0,
            name: format!("job-{id}"),
            gpu_indices: Vec::new(),
            message: String::new(),
            adopt: AdoptJob {
                name: format!("job-{id}"),
                cgroup: format!("/governor.slice/jobs/job-{id}"),
                logs: vec!["/tmp/train.log".into()],
                metric: None,
                format: None,
                pid,
                epochs: None,
            },
            maximise: false,
            priority: 0,
            start_ticks,
            exit_file: Some(exit_file.to_owned()),
        }
    }

    /// The supervisor's records (written here by hand; `governor supervise` itself is tested
    /// through the binary in governor/tests/supervise.rs and the daemon in tests/cluster_daemon.rs)
    /// give a recovered job's real end: after it ended while no daemon ran, and when it ends
    /// under the restarted daemon, which is not its parent.
    #[tokio::test]
    async fn a_restarted_daemon_reports_the_exit_status_its_supervisor_recorded() {
        use crate::supervise::ExitRecord;
        let mut bed = bed(Duration::from_secs(5));
        let out = bed.dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let me = std::process::id();
        let reused = crate::sys::process_start_ticks(me).map(|t| t + 1);
        let (ended, failed, running) = (
            out.join("job-j1.exit"),
            out.join("job-j2.exit"),
            out.join("job-j3.exit"),
        );
        ExitRecord {
            code: Some(3),
            ..ExitRecord::default()
        }
        .write(&ended)
        .unwrap();
        ExitRecord {
            code: Some(127),
            signal: None,
            error: Some("cannot start /opt/missing: No such file or directory".into()),
        }
        .write(&failed)
        .unwrap();
        let precious = out.join("precious.txt");
        std::fs::write(&precious, "not a record").unwrap();
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let journal = Journal {
            version: JOURNAL_VERSION,
            jobs: vec![
                journal_entry("j1", me, reused, &ended),
                journal_entry("j2", me, reused, &failed),
                // A damaged journal naming a file that is not a record: kept, status unknown.
                journal_entry("j4", me, reused, &precious),
                journal_entry(
                    "j3",
                    sleeper.id(),
                    crate::sys::process_start_ticks(sleeper.id()),
                    &running,
                ),
            ],
        };
        let path = bed.dir.path().join("run/coordinator-jobs.json");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, serde_json::to_vec(&journal).unwrap()).unwrap();

        let resumed = bed.launcher.recover(&bed.fs, Instant::now());
        assert_eq!(resumed.len(), 1);
        let j1 = bed.state("j1");
        assert_eq!(
            (j1.state, j1.exit_code),
            (RunState::Exited, Some(3)),
            "{j1:?}"
        );
        assert!(!j1.message.contains("unknown"), "{j1:?}");
        let j2 = bed.state("j2");
        assert_eq!(
            (j2.state, j2.exit_code),
            (RunState::Failed, Some(127)),
            "{j2:?}"
        );
        assert!(j2.message.contains("/opt/missing"), "{j2:?}");
        assert!(
            !ended.exists() && !failed.exists(),
            "records are removed once read"
        );

        // j3 runs on; it is killed by a signal, which its supervisor records.
        assert_eq!(bed.state("j3").state, RunState::Running);
        ExitRecord {
            signal: Some(libc::SIGTERM),
            ..ExitRecord::default()
        }
        .write(&running)
        .unwrap();
        sleeper.kill().unwrap();
        let _ = sleeper.wait();
        let exit = bed.next_exit().await;
        assert!(
            matches!(exit.status, Ok(None)),
            "not our child: {:?}",
            exit.status
        );
        bed.launcher.on_exit(&bed.fs, exit, Instant::now());
        let j3 = bed.state("j3");
        assert_eq!(j3.exit_code, Some(128 + libc::SIGTERM), "{j3:?}");
        assert!(j3.message.contains("signal 15"), "{j3:?}");
        assert!(!running.exists());
    }
}
