//! The end of the coordinator's jobs: stops on the coordinator's request (SIGTERM, SIGKILL
//! after the grace period), a main process's exit turned into what is reported (exit status,
//! save, convergence), and the teardown of ended jobs' cgroups.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tracing::{info, warn};

use crate::cgroup::{CgroupFs, JobCgroup};
use crate::coordinator_client::{RunState, StopJob};

use super::recovery::take_exit_record;
use super::{Dump, JobExit, Launched, Launcher, Teardown, checkpoint, completion};

impl Launcher {
    /// Stop every replica of a job: SIGTERM to its cgroup and main process now, SIGKILL after
    /// the grace period. An unknown or finished job is logged (once) and ignored.
    pub fn stop(&mut self, fs: &CgroupFs, s: &StopJob, now: Instant) -> usize {
        self.stop_within(fs, s, now, self.config.stop_grace)
    }

    /// [`Launcher::stop`] with SIGKILL `grace` after SIGTERM (the fence's may be shorter).
    pub(super) fn stop_within(
        &mut self,
        fs: &CgroupFs,
        s: &StopJob,
        now: Instant,
        grace: Duration,
    ) -> usize {
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
        } else if l.saving
            && l.info.state == RunState::Exited
            // The status the supervisor passes on (128 + the signal, as a shell reports it).
            && l.save_signal.is_some_and(|s| l.info.exit_code == Some(128 + s))
        {
            // Killed by the save signal itself: the job had no handler for it at that moment,
            // before its program set one or in its own exit after its last epoch (a Python job
            // the signal reaches during interpreter shutdown; seen on real Keras jobs). Its
            // work is in its last checkpoint (or it starts over if it has none): resumed
            // there, it loses at most the epoch under way, where "failed" would lose the job.
            warn!(job = %exit.job_id, signal = ?l.save_signal, "a job asked to save was killed by its save signal; it resumes from its last checkpoint");
            l.info.saved = true;
            l.info.exit_code = None;
            l.info.message =
                "killed by its save signal (no handler at that moment); resumes from its last checkpoint"
                    .into();
        }
        if l.info.state == RunState::Exited
            && l.info.exit_code == Some(0)
            && !l.info.saved
            && l.stop_reason.is_none()
            && let Some(dir) = &l.completion_witness
        {
            completion::record(dir, &exit.job_id, l.info.attempt);
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
        self.stop_fenced(fs, now);
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
        let kills = self
            .jobs
            .values()
            .flat_map(|l| [l.kill_at, l.fence_stop_due().map(|(at, _)| at)])
            .flatten();
        let teardowns = self
            .teardowns
            .iter()
            .filter(|t| !t.killed)
            .map(|t| t.kill_at);
        kills.chain(teardowns).min()
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
