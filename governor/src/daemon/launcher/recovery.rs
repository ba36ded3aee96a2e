//! Taking back the coordinator's jobs after a restart of the daemon: the journal says what ran,
//! a pidfd follows each job still running, its supervisor's record says how a job ended.

use std::path::Path;
use std::time::Instant;

use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::cgroup::{CgroupFs, JobCgroup};
use crate::coordinator_client::RunState;

use super::journal::{Journal, JournalEntry};
use super::{CoordinatorJob, JobExit, Launched, Launcher, StartedJob, Teardown};

impl Launcher {
    /// Take back the jobs a previous run of the daemon started (from the journal): a job whose
    /// main process still runs is reported under its coordinator id again and returned, for the
    /// daemon to govern; its end is noticed through a pidfd, and its exit status read from its
    /// supervisor's record (without a supervisor it is lost: the job is not this process's
    /// child). A job that ended meanwhile is reported with the status its supervisor recorded
    /// (unknown without one) and its cgroup torn down. A start journalled before its spawn and
    /// not since (the daemon died in between: no pid) is its cgroup's main process if the
    /// cgroup holds one; if not, and no record says it ended, it never ran and is forgotten, its
    /// empty cgroup removed, so that the coordinator's resent start (never confirmed: it was not
    /// reported) runs it once. A missing journal is a first start; an unreadable one is
    /// logged and set aside (`.bad`), never fatal. Must run inside a tokio runtime.
    pub fn recover(&mut self, fs: &CgroupFs, now: Instant) -> Vec<StartedJob> {
        let Some(path) = self.config.journal.clone() else {
            return Vec::new();
        };
        crate::sys::durable::sweep_temporaries(&path);
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
        for mut entry in journal.jobs {
            let key = (entry.job_id.clone(), entry.replica);
            if self.jobs.contains_key(&key) {
                continue;
            }
            let group = JobCgroup::new(&entry.adopt.cgroup).ok();
            if entry.adopt.pid == 0 {
                // Its start was under way when the daemon stopped (journalled before the spawn).
                match group.as_ref().and_then(|g| main_process_in(fs, g)) {
                    Some((pid, start)) => {
                        info!(job = %entry.job_id, replica = entry.replica, pid, "a start under way when the governor stopped did run: its process found in its cgroup");
                        entry.adopt.pid = pid;
                        entry.start_ticks = Some(start);
                    }
                    // It ran and ended: its supervisor's record says how (below).
                    None if entry.exit_file.as_deref().is_some_and(Path::exists) => {}
                    None => {
                        // Never spawned (or gone without a trace): forgotten, so that the
                        // coordinator's resent start runs it; its empty cgroup goes.
                        info!(job = %entry.job_id, replica = entry.replica, name = %entry.name, "a start under way when the governor stopped did not run; the coordinator's resent start will run it");
                        if let Some(group) = &group {
                            let _ = fs.remove_job_group(group);
                        }
                        continue;
                    }
                }
            }
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
                    saved: false,
                    attempt: entry.attempt,
                    save_error: String::new(),
                    converged: false,
                },
                record: Some(entry.clone()),
                exit_file: entry.exit_file.clone(),
                group: group.clone(),
                signals: None,
                stop_reason: None,
                kill_at: None,
                finished_at: None,
                save_signal: entry.save_signal,
                saving: false,
                bundle: entry.bundle.clone(),
                log_dir: entry.log_dir.clone(),
                checkpoint_dir: entry.checkpoint_dir.clone(),
                checkpoint_at_signal: None,
                dump: super::Dump::None,
                held_exit: None,
                converging: None,
                fence_stop_at: None,
                completion_witness: entry.completion_witness.clone(),
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
                        owner: entry.owner.clone(),
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

/// The main process of a job's cgroup: the oldest of its processes whose parent is not in it
/// (the supervisor, or the job's program without one), with its start. `None` when the cgroup
/// holds no process.
fn main_process_in(fs: &CgroupFs, group: &JobCgroup) -> Option<(u32, u64)> {
    let procs = fs.procs(group);
    let (pid, start) = procs
        .iter()
        .filter(|&&pid| crate::sys::parent_pid(pid).is_none_or(|parent| !procs.contains(&parent)))
        .filter_map(|&pid| Some((pid, crate::sys::process_start_ticks(pid)?)))
        .min_by_key(|&(pid, start)| (start, pid))?;
    // Still in the group after its start was read: the start is this member's, not that of a
    // process that took over its pid meanwhile.
    fs.procs(group).contains(&pid).then_some((pid, start))
}

/// Read a supervisor's record and remove its file. Only a file that is a record is removed: the
/// path comes from the journal, and a damaged journal must not make the daemon delete anything
/// else.
pub(super) fn take_exit_record(file: &Path) -> Option<crate::supervise::ExitRecord> {
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
