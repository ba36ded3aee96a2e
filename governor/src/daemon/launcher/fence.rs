//! The fence: a node out of the coordinator's reach too long stops the jobs the coordinator
//! would start elsewhere (moved here, not yet confirmed running), so that no job ever runs on
//! two nodes. Each is asked to save as for a move (its save signal, or a CRIU dump) and, if it
//! has not ended [`FENCE_SAVE_WAIT`] later, stopped (SIGTERM, SIGKILL after `stop_grace`).
//! The bound and why the two intervals cannot overlap: `governor_planner::StateConfig::fence_after_s`.

use std::time::{Duration, Instant};

use tracing::warn;

use crate::cgroup::CgroupFs;
use crate::coordinator_client::{SaveJob, StopJob};

use super::{Launcher, SaveAction};

/// How long a fenced job has to save before it is stopped. With the coordinator's default
/// bound (155 s of the 310 s after which it may start the job elsewhere) this and the stop's
/// grace (10 s by default) leave more than a minute to spare.
pub(crate) const FENCE_SAVE_WAIT: Duration = Duration::from_secs(60);

impl Launcher {
    /// Fence job `job_id` (the coordinator named it and has acknowledged nothing for longer than
    /// its bound): ask it to save, and stop it [`FENCE_SAVE_WAIT`] later if it still runs (at
    /// once if it cannot save). Once per run of a job; `None` when there is nothing to do.
    pub fn fence(
        &mut self,
        fs: &CgroupFs,
        job_id: &str,
        now: Instant,
        why: &str,
    ) -> Option<SaveAction> {
        let l = self.jobs.values_mut().find(|l| {
            l.info.job_id == job_id && !l.info.state.is_finished() && l.fence_stop_at.is_none()
        })?;
        warn!(job = %job_id, reason = %why, "fencing a job: saving it, then stopping it");
        l.fence_stop_at = Some(now + FENCE_SAVE_WAIT);
        let already_saving = l.saving;
        let action = if already_saving {
            SaveAction::Nothing
        } else {
            self.save(
                fs,
                &SaveJob {
                    job_id: job_id.to_owned(),
                    reason: why.to_owned(),
                },
            )
        };
        if matches!(action, SaveAction::Nothing) && !already_saving {
            // It cannot save: stop it now rather than let it run on beside a copy.
            self.stop(
                fs,
                &StopJob {
                    job_id: job_id.to_owned(),
                    reason: format!("{why} (it cannot save)"),
                },
                now,
            );
        }
        Some(action)
    }

    /// Stop the fenced jobs still running after their save's wait.
    pub(super) fn stop_fenced(&mut self, fs: &CgroupFs, now: Instant) {
        let due: Vec<String> = self
            .jobs
            .values()
            .filter(|l| l.fence_stop_due().is_some_and(|t| t <= now))
            .map(|l| l.info.job_id.clone())
            .collect();
        for job_id in due {
            self.stop(
                fs,
                &StopJob {
                    reason: "fenced: it did not save in time".into(),
                    job_id,
                },
                now,
            );
        }
    }
}
