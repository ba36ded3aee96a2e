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
mod completion;
mod fence;
mod journal;
pub mod output;
mod recovery;
mod save;
mod start;
mod stop;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::warn;

use crate::cgroup::JobCgroup;
use crate::control::AdoptJob;
use crate::coordinator_client::{RunState, StartJob};

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
    #[error("cannot run it as {user:?}: {reason}")]
    User { user: String, reason: String },
    #[error(
        "it runs as root ({user}), which this node refuses: submit it with `govctl submit --user NAME`, or set [coordinator] allow_root_jobs = true on the node"
    )]
    Root { user: String },
}
use journal::JournalEntry;

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
    /// Not run: an earlier attempt ended on its own on a node the coordinator had lost
    /// ([`completion`]); it is reported exited 0.
    AlreadyCompleted,
}

/// A job the launcher started, for the daemon to govern.
#[derive(Debug)]
pub struct StartedJob {
    /// The coordinator's id of the job.
    pub job_id: String,
    pub adopt: AdoptJob,
    pub maximise: bool,
    pub priority: i32,
    /// The user it runs as, whose rights its logs are read with (`None`: root).
    pub owner: Option<crate::watch::FileOwner>,
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
    /// Start jobs that run as root (`[coordinator] allow_root_jobs`).
    pub allow_root_jobs: bool,
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
    /// Where to record that it ended on its own ([`completion`]): its shared checkpoint
    /// directory, for a job moved here (attempt > 0) that runs as root.
    completion_witness: Option<PathBuf>,
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
    /// Fenced (the coordinator out of reach too long, [`Launcher::fence`]): stopped then, with
    /// that grace, if it has not ended after its save.
    fence_stop_at: Option<(Instant, Duration)>,
}

impl Launched {
    /// When the fence stops it, if it still runs then and nothing else is stopping it.
    fn fence_stop_due(&self) -> Option<(Instant, Duration)> {
        self.fence_stop_at
            .filter(|_| self.stop_reason.is_none() && !self.info.state.is_finished())
    }

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
            completion_witness: None,
            checkpoint_at_signal: None,
            bundle: None,
            log_dir: Path::new(&s.log_path).parent().map(Path::to_owned),
            dump: Dump::None,
            held_exit: None,
            converging: None,
            fence_stop_at: None,
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
