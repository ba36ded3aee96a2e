//! Starts and stops the coordinator's jobs on this node.
//!
//! Path of a submitted job: `govctl submit` → coordinator placement → `NodeCommand::Start` on
//! the node's session → [`Launcher::start`] creates `governor.slice/jobs/<name>-<id>`, starts the
//! command inside it (under `governor supervise`, stdout/stderr to
//! `<job_output_dir>/<group>.out`, `CUDA_VISIBLE_DEVICES` from the reserved GPUs) → the daemon
//! governs it like a `governor run-job` job → the main process exits: the job is reported
//! `exited` with its status, kept in the reports for `finished_retention`, and its cgroup
//! removed.
//!
//! Running jobs are recorded in a journal ([`journal`]: `coordinator-jobs.json` beside the
//! state file); a restarted daemon takes them back with [`Launcher::recover`] ([`recovery`])
//! before discovery runs, so they stay the coordinator's jobs instead of turning into local
//! ones.

mod checkpoint;
mod journal;
pub mod output;
mod recovery;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use governor_proto::job_env;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::cgroup::jobs::signal_child;
use crate::cgroup::{CgroupFs, JobCgroup};
use crate::control::AdoptJob;
use crate::coordinator_client::{RunState, SaveJob, StartJob, StopJob};

pub use journal::JOURNAL_FILE_NAME;

/// Why a job the coordinator asked for could not be started here (reported as its message).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("no program to run (argv is empty)")]
    NoProgram,
    #[error("log path {0:?} is not absolute")]
    RelativeLog(String),
    #[error("GPU list {0:?} names a GPU twice")]
    GpuTwice(Vec<u32>),
    #[error("GPU {gpu} does not exist on this node (it has {has:?})")]
    NoSuchGpu { gpu: u32, has: BTreeSet<u32> },
    #[error("cannot create the job's cgroup: {0}")]
    Cgroup(#[source] crate::cgroup::CgroupError),
    #[error("cannot create the output directory {}: {source}", .path.display())]
    OutputDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open {}: {source}", .path.display())]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot prepare the job to start in its cgroup: {0}")]
    Prepare(#[source] crate::cgroup::CgroupError),
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
}
use journal::JournalEntry;
use recovery::take_exit_record;

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
    /// It exited with status 0 after a save for a move and left a new checkpoint (an end that
    /// left none is its own end: [`checkpoint`]).
    pub saved: bool,
    /// Which start of the job this is (the coordinator's attempt number).
    pub attempt: u32,
    /// Why it could not be saved for a move (it runs on), if it could not.
    pub save_error: String,
    /// It ended because the daemon stopped it at convergence, as it asked.
    pub converged: bool,
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
    /// The `criu` program: jobs start in a PID namespace of their own (under the supervisor)
    /// and those without a declared checkpoint move by CRIU ([`crate::criu`]); `None`: no
    /// transparent moves here.
    pub criu: Option<PathBuf>,
}

/// What [`Launcher::save`] did, or asks the daemon to do.
#[derive(Debug, PartialEq)]
pub enum SaveAction {
    /// Nothing (not running here, already saving, or it cannot be saved: logged, reported).
    Nothing,
    /// Its save signal went to its main process.
    Signalled,
    /// Dump it with CRIU (a task: seconds), then hand the result to [`Launcher::on_dumped`].
    Dump(crate::criu::DumpRequest),
}

/// A transparent save under way or done.
#[derive(Debug, Default)]
enum Dump {
    #[default]
    None,
    InFlight,
    Done,
}

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
    /// The signal that asks it to save for a move (its declared checkpoint), if any.
    save_signal: Option<i32>,
    /// It was asked to save and has not exited yet.
    saving: bool,
    /// Its declared checkpoint directory, if it declared one.
    checkpoint_dir: Option<PathBuf>,
    /// That directory when the save signal was sent (an end that did not change it is no save).
    checkpoint_at_signal: Option<Result<checkpoint::CheckpointLook, String>>,
    /// Runs in a PID namespace of its own: CRIU can dump it into `bundle`.
    bundle: Option<PathBuf>,
    /// Where its log is: files a transparent move carries must be below it or the output
    /// directory.
    log_dir: Option<PathBuf>,
    dump: Dump,
    /// Its end, held while a dump of it is under way (CRIU kills it when the dump is done;
    /// the end is a save only if the dump succeeded).
    held_exit: Option<JobExit>,
    /// The daemon is stopping it as it asked: why ("stopped: converged ...", "stopped:
    /// outranked in its sweep ...").
    converging: Option<String>,
}

impl Launched {
    /// The entry of a start not tried yet.
    fn starting(s: &StartJob) -> Launched {
        // A framework checkpoint it declared (a transparent one is CRIU's: no signal, no dir).
        let declared = s.checkpoint.as_ref().filter(|c| !c.transparent);
        Launched {
            info: CoordinatorJob {
                job_id: s.job_id.clone(),
                replica: s.replica,
                name: s.name.clone(),
                cgroup: None,
                state: RunState::Starting,
                exit_code: None,
                message: String::new(),
                gpu_indices: s.gpu_indices.clone(),
                saved: false,
                attempt: s.attempt,
                save_error: String::new(),
                converged: false,
            },
            record: None,
            exit_file: None,
            group: None,
            signals: None,
            stop_reason: None,
            kill_at: None,
            finished_at: None,
            save_signal: declared.map(|c| c.save_signal),
            saving: false,
            checkpoint_dir: declared.map(|c| PathBuf::from(&c.dir)),
            checkpoint_at_signal: None,
            bundle: None,
            log_dir: Path::new(&s.log_path).parent().map(Path::to_owned),
            dump: Dump::None,
            held_exit: None,
            converging: None,
        }
    }
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

    /// Where this node keeps the CRIU dump of the job `s` starts (its bundle).
    fn bundle_for(&self, s: &StartJob) -> PathBuf {
        self.config
            .output_dir
            .join("criu")
            .join(group_name(&s.name, &s.job_id, s.replica, s.replicas))
    }

    /// Where the checkpoint carried for the start `s` goes: its declared directory, or for a
    /// transparent move this node's bundle for it.
    pub fn carried_dir(&self, s: &StartJob) -> Option<PathBuf> {
        let c = s.checkpoint.as_ref()?;
        Some(if c.transparent {
            self.bundle_for(s)
        } else {
            PathBuf::from(&c.dir)
        })
    }

    /// The directories a transparent move of `s` may write its carried files to: the job
    /// output directory and its log's directory.
    pub fn carry_roots(&self, s: &StartJob) -> Vec<PathBuf> {
        std::iter::once(self.config.output_dir.clone())
            .chain(Path::new(&s.log_path).parent().map(Path::to_owned))
            .collect()
    }

    /// The directory to upload for a move of `job_id`: `declared` when the job declared one,
    /// else (a transparent move) its CRIU bundle here.
    pub fn upload_dir(&self, job_id: &str, declared: &str) -> Option<PathBuf> {
        if !declared.is_empty() {
            return Some(PathBuf::from(declared));
        }
        self.jobs
            .values()
            .filter(|l| l.info.job_id == job_id)
            .max_by_key(|l| l.info.attempt)
            .and_then(|l| l.bundle.clone())
            .or_else(|| {
                // Dumped before a restart of the daemon, which no longer knows the ended job:
                // its newest dump on disk (bundles are named `<name>-<id>`).
                let suffix = format!("-{job_id}");
                std::fs::read_dir(self.config.output_dir.join("criu"))
                    .ok()?
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(&suffix))
                    .map(|e| e.path())
                    .filter(|p| crate::criu::has_images(p))
                    .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            })
    }

    /// Whether `s` is a resend of a start this node already has (running, or this attempt or a
    /// later one ended here): nothing to do for it.
    pub fn is_duplicate(&self, s: &StartJob) -> bool {
        self.jobs
            .get(&(s.job_id.clone(), s.replica))
            .is_some_and(|known| !known.info.state.is_finished() || s.attempt <= known.info.attempt)
    }

    /// Record a start this node refuses before trying it (its carried checkpoint did not
    /// arrive whole): reported `failed` with the reason, like a start that could not run.
    pub fn refuse(&mut self, s: StartJob, reason: String) {
        if self.is_duplicate(&s) {
            return;
        }
        warn!(job = %s.job_id, replica = s.replica, %reason, "refusing to start a job for the coordinator");
        let mut refused = Launched::starting(&s);
        refused.info.state = RunState::Failed;
        refused.info.message = reason;
        refused.finished_at = Some(Instant::now());
        self.jobs.insert((s.job_id, s.replica), refused);
    }

    /// Start a job (idempotent per job id and replica). Must run inside a tokio runtime.
    pub fn start(&mut self, fs: &CgroupFs, s: StartJob) -> StartOutcome {
        let key = (s.job_id.clone(), s.replica);
        if self.is_duplicate(&s) {
            return StartOutcome::Duplicate;
        }
        // A newer start of a job that ended here (moved back after a failed move) runs again.
        if self.jobs.remove(&key).is_some() {
            // Its previous run's teardown must not signal the new run in the same group.
            let group = format!("/{}", group_name(&s.name, &s.job_id, s.replica, s.replicas));
            self.teardowns
                .retain(|t| !t.group.to_string().ends_with(&group));
        }
        let mut launched = Launched::starting(&s);
        if self.config.criu.is_some() && self.config.supervisor.is_some() {
            launched.bundle = Some(self.bundle_for(&s));
        }
        let mut info = launched.info.clone();
        match self.spawn(fs, &s, &mut launched) {
            Ok(started) => {
                info!(job = %s.job_id, replica = s.replica, name = %s.name, cgroup = %started.adopt.cgroup, pid = started.adopt.pid, "started a job for the coordinator");
                launched.record = Some(journal_entry(&s, &launched, &started.adopt));
                self.jobs.insert(key, launched);
                self.persist();
                StartOutcome::Started(Box::new(started))
            }
            Err(error) => {
                // The edge: the node's report says why as text.
                let reason = error.to_string();
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
                // Its entry may have been written before the spawn: it did not start.
                self.persist();
                StartOutcome::Failed(reason)
            }
        }
    }

    fn spawn(
        &mut self,
        fs: &CgroupFs,
        s: &StartJob,
        launched: &mut Launched,
    ) -> Result<StartedJob, LaunchError> {
        if s.argv.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(LaunchError::NoProgram);
        }
        if !Path::new(&s.log_path).is_absolute() {
            return Err(LaunchError::RelativeLog(s.log_path.clone()));
        }
        let distinct: BTreeSet<u32> = s.gpu_indices.iter().copied().collect();
        if distinct.len() != s.gpu_indices.len() {
            return Err(LaunchError::GpuTwice(s.gpu_indices.clone()));
        }
        if let Some(&missing) = distinct.iter().find(|g| !self.config.gpus.contains(g)) {
            return Err(LaunchError::NoSuchGpu {
                gpu: missing,
                has: self.config.gpus.clone(),
            });
        }
        let group_name = group_name(&s.name, &s.job_id, s.replica, s.replicas);
        let group = fs
            .create_job_group(&self.config.subtree, &group_name)
            .map_err(LaunchError::Cgroup)?;
        launched.group = Some(group.clone());
        launched.info.cgroup = Some(group.to_string());
        std::fs::create_dir_all(&self.config.output_dir).map_err(|source| {
            LaunchError::OutputDir {
                path: self.config.output_dir.clone(),
                source,
            }
        })?;
        let output_path = self.config.output_dir.join(format!("{group_name}.out"));
        let open_error = |source| LaunchError::Output {
            path: output_path.clone(),
            source,
        };
        let output = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&output_path)
            .map_err(open_error)?;
        let errors = output.try_clone().map_err(open_error)?;
        let mut command = match &self.config.supervisor {
            Some(governor) => {
                let exit_file = self.config.output_dir.join(format!("{group_name}.exit"));
                // A record left by an earlier run of the same job id is not this run's (nor
                // the temporary file of one whose supervisor was killed while writing it).
                let _ = std::fs::remove_file(&exit_file);
                crate::sys::durable::sweep_temporaries(&exit_file);
                let mut command = std::process::Command::new(governor);
                command
                    .arg("supervise")
                    .arg("--status-file")
                    .arg(&exit_file);
                if let (Some(bundle), Some(criu)) = (&launched.bundle, &self.config.criu) {
                    command.arg("--pid-namespace");
                    let transparent = s.checkpoint.as_ref().is_some_and(|c| c.transparent);
                    if transparent && s.attempt > 0 && crate::criu::has_images(bundle) {
                        // A later start of a job moved by CRIU: restore its dump.
                        command
                            .arg("--restore")
                            .arg(bundle.join(crate::criu::IMAGES))
                            .arg("--criu")
                            .arg(criu);
                        launched.info.message = "restored from its CRIU dump".into();
                    }
                }
                command.arg("--");
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
            .env(job_env::LOG, &s.log_path)
            .env(job_env::JOB, &s.name)
            .stdin(std::process::Stdio::null())
            .stdout(output)
            .stderr(errors);
        // Its own process group: a Ctrl-C meant for a foreground daemon must not reach the jobs.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        if !s.metric.is_empty() {
            command.env(job_env::METRIC, &s.metric);
        }
        if !s.gpu_indices.is_empty() {
            let list: Vec<String> = s.gpu_indices.iter().map(u32::to_string).collect();
            command.env("CUDA_VISIBLE_DEVICES", list.join(","));
        }
        fs.prepare_command(&group, &mut command)
            .map_err(LaunchError::Prepare)?;
        launched.info.message = if launched.info.message.is_empty() {
            format!("output in {}", output_path.display())
        } else {
            format!(
                "{}; output in {}",
                launched.info.message,
                output_path.display()
            )
        };
        let mut adopt = AdoptJob {
            name: s.name.clone(),
            cgroup: group.to_string(),
            logs: vec![s.log_path.clone()],
            metric: (!s.metric.is_empty()).then(|| s.metric.clone()),
            format: None,
            // Not known until it is spawned.
            pid: 0,
            // `govctl submit --epochs N` passes GOVERNOR_EPOCHS, as for any job.
            epochs: declared_epochs(&s.env),
            // `govctl submit --env GOVERNOR_FINISH=5:0.001` asks to end it at convergence.
            finish: s
                .env
                .get(job_env::FINISH)
                .and_then(|v| job_env::parse_finish(v).ok()),
            // `govctl submit --sweep NAME` passes GOVERNOR_SWEEP: a trial of a sweep.
            sweep: s
                .env
                .get(job_env::SWEEP)
                .and_then(|v| job_env::parse_sweep(v).ok()),
        };
        // Journalled before the spawn: a daemon killed before the entry with the pid is written
        // still knows the start, and finds its process in the cgroup when it comes back.
        self.persist_with(Some(&journal_entry(s, launched, &adopt)));
        let mut child = tokio::process::Command::from(command)
            .kill_on_drop(false)
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                program: s.argv[0].clone(),
                source,
            })?;
        let pid = child.id().unwrap_or(0);
        adopt.pid = pid;
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
        Ok(StartedJob {
            job_id: s.job_id.clone(),
            adopt,
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

    /// Ask a job to save and exit for a move: its declared save signal to its main process
    /// (the supervisor passes it on; never to the whole cgroup, whose helper processes may
    /// die of it). Nothing else: no grace period, no kill; the coordinator gives up on the move
    /// if it does not save in time, and the job runs on. Returns whether it was signalled.
    pub fn save(&mut self, fs: &CgroupFs, s: &SaveJob) -> SaveAction {
        let output_dir = self.config.output_dir.clone();
        let criu = self.config.criu.clone();
        let Some(l) = self
            .jobs
            .values_mut()
            .find(|l| l.info.job_id == s.job_id && !l.info.state.is_finished())
        else {
            self.warn_once(
                format!("save:{}", s.job_id),
                &format!(
                    "the coordinator asked job {} to save, which is not running here; ignored",
                    s.job_id
                ),
            );
            return SaveAction::Nothing;
        };
        if l.saving || l.stop_reason.is_some() {
            return SaveAction::Nothing;
        }
        if l.save_signal.is_none()
            && let (Some(bundle), Some(criu), Some(group)) = (&l.bundle, criu, &l.group)
        {
            // No declared checkpoint: a transparent move (CRIU).
            let pids = fs.procs(group);
            let proc_root = fs.proc_root();
            let request = crate::criu::namespace_init(proc_root, &pids)
                .ok_or_else(|| "it does not run in a PID namespace of its own (started without the right to make one?)".to_string())
                .and_then(|init_pid| {
                    let members = crate::criu::namespace_members(proc_root, &pids);
                    let files = crate::criu::written_files(proc_root, &members);
                    let roots: Vec<PathBuf> =
                        std::iter::once(output_dir).chain(l.log_dir.clone()).collect();
                    crate::criu::check_carried(&files, &roots).map_err(|e| e.to_string())?;
                    Ok(crate::criu::DumpRequest {
                        job_id: s.job_id.clone(),
                        replica: l.info.replica,
                        init_pid,
                        bundle: bundle.clone(),
                        files,
                        criu,
                    })
                });
            return match request {
                Ok(request) => {
                    info!(job = %s.job_id, pid = request.init_pid, files = request.files.len(), reason = %s.reason, "dumping a job with CRIU for a move");
                    l.saving = true;
                    l.dump = Dump::InFlight;
                    l.info.save_error.clear();
                    l.info.message = format!("dumping for a move ({})", s.reason);
                    SaveAction::Dump(request)
                }
                Err(why) => {
                    let why = format!("cannot move it without a declared checkpoint: {why}");
                    warn!(job = %s.job_id, reason = %why, "not saving a job for a move; it runs on");
                    l.info.save_error = why;
                    SaveAction::Nothing
                }
            };
        }
        let signal = l.save_signal.and_then(|n| Signal::try_from(n).ok());
        let (Some(signal), Some(tx)) = (signal, l.signals.as_ref()) else {
            let id = l.info.job_id.clone();
            self.warn_once(
                format!("save:{id}"),
                &format!(
                    "the coordinator asked job {id} to save, but it declared no checkpoint (or its process cannot be signalled); it runs on"
                ),
            );
            return SaveAction::Nothing;
        };
        info!(job = %s.job_id, signal = %signal, reason = %s.reason, "asking a job to save for a move");
        // Looked at before the signal, so that a save, however quick, changes what was seen.
        l.checkpoint_at_signal = l
            .checkpoint_dir
            .as_deref()
            .map(|dir| checkpoint::look_within(dir, checkpoint::LOOK_TIMEOUT));
        let _ = tx.send(signal);
        l.saving = true;
        l.info.message = format!("saving for a move ({})", s.reason);
        SaveAction::Signalled
    }

    /// A CRIU dump of a job ended. On success the job is gone (CRIU killed it) and reported
    /// saved; on failure it runs on (CRIU resumed it) and the reason is reported. Returns the
    /// job's cgroup if its end was held for the dump (as [`Self::on_exit`] does).
    pub fn on_dumped(
        &mut self,
        fs: &CgroupFs,
        job_id: &str,
        replica: u32,
        result: Result<u64, crate::criu::CriuError>,
        now: Instant,
    ) -> Option<JobCgroup> {
        let l = self.jobs.get_mut(&(job_id.to_owned(), replica))?;
        if !matches!(l.dump, Dump::InFlight) {
            return None;
        }
        match result {
            Ok(bytes) => {
                info!(job = %job_id, carried_file_bytes = bytes, "dumped by CRIU");
                l.dump = Dump::Done;
            }
            Err(why) => {
                warn!(job = %job_id, reason = %why, "the CRIU dump failed; the job runs on");
                l.dump = Dump::None;
                l.saving = false;
                // The edge: the report carries the reason as text.
                l.info.save_error = why.to_string();
                l.info.message = "running (its dump for a move failed)".into();
            }
        }
        let held = l.held_exit.take()?;
        self.on_exit(fs, held, now)
    }

    /// A job's main process ended. Returns its cgroup, which the daemon stops governing; the
    /// launcher tears it down (stragglers signalled, group removed).
    pub fn on_exit(&mut self, fs: &CgroupFs, exit: JobExit, now: Instant) -> Option<JobCgroup> {
        let l = self.jobs.get_mut(&(exit.job_id.clone(), exit.replica))?;
        if matches!(l.dump, Dump::InFlight) {
            // CRIU kills the job when its dump is complete: whether this end is a save is
            // known when the dump reports ([`Self::on_dumped`]).
            l.held_exit = Some(exit);
            return None;
        }
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
        if let Some(why) = l.converging.take()
            && l.stop_reason.is_none()
            && !l.saving
            && status.is_ok()
            && l.info.state == RunState::Exited
        {
            // Stopped at convergence, as it asked: completed, whatever the interrupted
            // process exited with (SIGINT ends a Python job with 130 or a traceback).
            l.info.converged = true;
            l.info.message = match l.info.exit_code {
                Some(0) | None => why,
                Some(code) => format!("{why}; the interrupted process exited with {code}"),
            };
        }
        if l.saving && matches!(l.dump, Dump::Done) && l.stop_reason.is_none() {
            // Killed by CRIU after a complete dump (however its supervisor saw that end):
            // saved; the dump resumes it.
            l.info.state = RunState::Exited;
            l.info.saved = true;
            l.info.exit_code = None;
            l.info.message = "dumped by CRIU for a move; the dump resumes it".into();
        } else if l.saving && l.info.state == RunState::Exited && l.info.exit_code == Some(0) {
            let verdict = match &l.checkpoint_dir {
                Some(dir) => checkpoint::judge(
                    l.checkpoint_at_signal.as_ref(),
                    &checkpoint::look_within(dir, checkpoint::LOOK_TIMEOUT),
                ),
                None => {
                    checkpoint::SaveVerdict::Unknown("it declared no checkpoint directory".into())
                }
            };
            if let checkpoint::SaveVerdict::EndedOnItsOwn(why) = verdict {
                // Finished as the signal came (its last epoch): its own end, not a save.
                info!(job = %exit.job_id, reason = why, "a job asked to save ended on its own; not a save");
                l.info.message = format!("ended on its own while asked to save ({why})");
            } else {
                if let checkpoint::SaveVerdict::Unknown(why) = &verdict {
                    warn!(job = %exit.job_id, reason = %why, "cannot tell whether a job saved; its exit status 0 is taken for a save");
                }
                l.info.saved = true;
                l.info.message = "saved for a move; the same command resumes it".into();
            }
        }
        l.checkpoint_at_signal = None;
        l.saving = false;
        l.dump = Dump::None;
        info!(job = %exit.job_id, replica = exit.replica, state = %l.info.state, exit_code = ?l.info.exit_code, saved = l.info.saved, "a coordinator job ended");
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
}

/// Total epochs a coordinator job declared through `GOVERNOR_EPOCHS` in its environment (the
/// same rule as for discovered jobs: a positive number, anything else ignored with a warning).
fn declared_epochs(env: &BTreeMap<String, String>) -> Option<f64> {
    let value = env.get(job_env::EPOCHS)?;
    let epochs = job_env::parse_epochs(value).ok();
    if epochs.is_none() {
        warn!(value = %value, "GOVERNOR_EPOCHS is not a positive number; the job's remaining work stays unknown");
    }
    epochs
}

/// What the journal keeps of the start `s` of `launched`, its process as `adopt` says (pid 0:
/// the start is under way, its process not spawned yet).
fn journal_entry(s: &StartJob, launched: &Launched, adopt: &AdoptJob) -> JournalEntry {
    JournalEntry {
        job_id: s.job_id.clone(),
        replica: s.replica,
        name: s.name.clone(),
        gpu_indices: s.gpu_indices.clone(),
        message: launched.info.message.clone(),
        adopt: adopt.clone(),
        maximise: s.maximise,
        priority: s.priority,
        start_ticks: (adopt.pid != 0)
            .then(|| crate::sys::process_start_ticks(adopt.pid))
            .flatten(),
        exit_file: launched.exit_file.clone(),
        attempt: s.attempt,
        save_signal: launched.save_signal,
        bundle: launched.bundle.clone(),
        log_dir: launched.log_dir.clone(),
        checkpoint_dir: launched.checkpoint_dir.clone(),
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

impl Launcher {
    /// The daemon is stopping the job in `cgroup` as it asked, converged or cut from its sweep (`why`: what
    /// `governor status` says): its end is then reported as completed. Unknown cgroups (local
    /// jobs) are ignored.
    pub fn note_converging(&mut self, cgroup: &str, why: &str) {
        for l in self
            .jobs
            .values_mut()
            .filter(|l| !l.info.state.is_finished() && l.info.cgroup.as_deref() == Some(cgroup))
        {
            if l.converging.is_none() {
                l.converging = Some(why.to_owned());
            }
        }
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
mod tests;
