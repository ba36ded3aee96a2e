//! Starting the coordinator's jobs: checks of the start command, the job's cgroup and output
//! file, its command (under `governor supervise`, restored from a CRIU dump for a transparent
//! move), its journal entry and the task that waits for its end.

use crate::discovery::procfs::Credentials;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::path::Path;
use std::time::Instant;

use governor_proto::job_env;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::cgroup::CgroupFs;
use crate::cgroup::jobs::signal_child;
use crate::control::AdoptJob;
use crate::coordinator_client::{RunState, StartJob};

use super::journal::JournalEntry;
use super::{
    JobExit, LaunchError, Launched, Launcher, StartOutcome, StartedJob, completion, group_name,
};

/// The checkpoint directory `s` declared, when the nodes share it (not carried, not CRIU's).
fn shared_checkpoint(s: &StartJob) -> Option<&Path> {
    s.checkpoint
        .as_ref()
        .filter(|c| !c.transparent && !c.carry && !c.dir.is_empty())
        .map(|c| Path::new(&c.dir))
}

impl Launcher {
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
        // Only a root job's record is written (and read): the daemon reads it as root, at a
        // path the submission names.
        if s.attempt > 0
            && let Some(dir) = shared_checkpoint(&s)
            && self.credentials(&s.user).is_ok_and(|c| c.uid == 0)
            && let Some(ended) = completion::recorded(dir, &s.job_id)
            && ended < s.attempt
        {
            info!(job = %s.job_id, attempt = s.attempt, ended_at_attempt = ended, "not running a job again: it ended on its own on the node it was moved to, which the coordinator had lost");
            launched.info.state = RunState::Exited;
            launched.info.exit_code = Some(0);
            launched.info.message = format!(
                "not run again: its attempt {ended} ended on its own on a node the coordinator had lost (recorded beside its checkpoint)"
            );
            launched.finished_at = Some(Instant::now());
            self.jobs.insert(key, launched);
            self.persist();
            return StartOutcome::AlreadyCompleted;
        }
        if self.config.criu.is_some() && self.config.supervisor.is_some() {
            launched.bundle = Some(self.bundle_for(&s));
        }
        let mut info = launched.info.clone();
        match self.spawn(fs, &s, &mut launched) {
            Ok(started) => {
                info!(job = %s.job_id, replica = s.replica, name = %s.name, cgroup = %started.adopt.cgroup, pid = started.adopt.pid, "started a job for the coordinator");
                launched.record = Some(journal_entry(
                    &s,
                    &launched,
                    &started.adopt,
                    started.owner.clone(),
                ));
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
        let creds = self.credentials(&s.user)?;
        if creds.uid == 0 && s.attempt > 0 {
            launched.completion_witness = shared_checkpoint(s).map(Path::to_path_buf);
        }
        // A job run as a user is not moved by CRIU: a transparent move packs and unpacks the
        // files below its log directory as root, at paths the user names.
        if creds.uid != 0 {
            launched.bundle = None;
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
                if creds.uid != 0 {
                    command
                        .arg("--user")
                        .arg(crate::supervise::credentials_arg(&creds));
                }
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
            None => {
                let mut command = std::process::Command::new(&s.argv[0]);
                if creds.uid != 0 {
                    crate::sys::run_as(&mut command, &creds);
                }
                command
            }
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
            // `govctl submit --sweep NAME` passes GOVERNOR_SWEEP to the job, but the
            // coordinator judges the trials of such a sweep across the cluster (the planner's
            // `sweeps`); the node judging them too would cut by its own trials' ranks.
            sweep: None,
        };
        // Journalled before the spawn: a daemon killed before the entry with the pid is written
        // still knows the start, and finds its process in the cgroup when it comes back.
        self.persist_with(Some(&journal_entry(s, launched, &adopt, owner_of(&creds))));
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
            owner: owner_of(&creds),
        })
    }

    /// Who a job runs as: its user's credentials from this node's user database (`getpwnam`,
    /// `getgrouplist`; an empty user is root), root only where the node allows it.
    fn credentials(&self, user: &str) -> Result<Credentials, LaunchError> {
        let name = if user.is_empty() { "root" } else { user };
        let refused = |reason: String| LaunchError::User {
            user: name.to_owned(),
            reason,
        };
        let found = nix::unistd::User::from_name(name)
            .map_err(|e| refused(format!("cannot look the user up: {e}")))?
            .ok_or_else(|| refused(format!("no user {name:?} on this node")))?;
        let c_name = std::ffi::CString::new(name).map_err(|_| refused("a NUL byte".into()))?;
        let groups = nix::unistd::getgrouplist(&c_name, found.gid)
            .map_err(|e| refused(format!("cannot list its groups: {e}")))?;
        let creds = Credentials {
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
            groups: groups.into_iter().map(|g| g.as_raw()).collect(),
        };
        if creds.uid == 0 && !self.config.allow_root_jobs {
            return Err(LaunchError::Root {
                user: name.to_owned(),
            });
        }
        Ok(creds)
    }
}

/// The rights a job's logs are read with: its user's (`None`: root's, the daemon's own).
fn owner_of(creds: &Credentials) -> Option<crate::watch::FileOwner> {
    (creds.uid != 0).then(|| creds.file_owner())
}

/// Total epochs a coordinator job declared through `GOVERNOR_EPOCHS` in its environment (the
/// same rule as for discovered jobs: a positive number, anything else ignored with a warning).
pub(super) fn declared_epochs(env: &BTreeMap<String, String>) -> Option<f64> {
    let value = env.get(job_env::EPOCHS)?;
    let epochs = job_env::parse_epochs(value).ok();
    if epochs.is_none() {
        warn!(value = %value, "GOVERNOR_EPOCHS is not a positive number; the job's remaining work stays unknown");
    }
    epochs
}

/// What the journal keeps of the start `s` of `launched`, its process as `adopt` says (pid 0:
/// the start is under way, its process not spawned yet).
fn journal_entry(
    s: &StartJob,
    launched: &Launched,
    adopt: &AdoptJob,
    owner: Option<crate::watch::FileOwner>,
) -> JournalEntry {
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
        owner,
        completion_witness: launched.completion_witness.clone(),
    }
}
