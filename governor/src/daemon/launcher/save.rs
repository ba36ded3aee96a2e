//! Saving a job for a move: its declared save signal to its main process, or (without a
//! declared checkpoint) a CRIU dump, whose result comes back through [`Launcher::on_dumped`].

use std::path::PathBuf;
use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{info, warn};

use crate::cgroup::{CgroupFs, JobCgroup};
use crate::coordinator_client::SaveJob;

use super::{Dump, Launcher, SaveAction, checkpoint};

impl Launcher {
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
}
