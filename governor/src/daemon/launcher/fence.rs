//! The fence: a node out of the coordinator's reach too long stops the jobs the coordinator
//! would start elsewhere (moved here, not yet confirmed running), so that no job ever runs on
//! two nodes. Each is asked to save as for a move (its save signal, or a CRIU dump) and, if it
//! has not ended [`fence_timings`]'s wait later, stopped (SIGTERM, SIGKILL after the grace).
//! The bound and why the two intervals cannot overlap: `governor_planner::StateConfig::fence_after_s`.

use std::time::{Duration, Instant};

use tracing::warn;

use crate::cgroup::CgroupFs;
use crate::coordinator_client::{SaveJob, StopJob};

use super::{Launcher, SaveAction};

/// How long a fenced job has at most to save before it is stopped. With the coordinator's
/// default bound (155 s of the 310 s after which it may start the job elsewhere) this and the
/// stop's grace (10 s by default) leave more than a minute to spare.
pub(crate) const FENCE_SAVE_WAIT: Duration = Duration::from_secs(60);

/// How long a job fenced after `bound` has to save, and the grace of its stop after that:
/// [`FENCE_SAVE_WAIT`] and the node's `stop_grace`, each cut to fit a short bound. The node
/// fences at `bound` after the last acknowledged report and the coordinator may start the job
/// elsewhere at twice the bound (`StateConfig::fence_after_s`); the job must be gone before.
/// With the wait at most half the bound and the grace at most a quarter, the last signal
/// (SIGKILL) goes at 1.75 x the bound at the latest, whatever the coordinator's timeouts and the
/// node's `stop_grace` are (a coordinator configured with `lost_target_wait_s = 20` has a bound
/// of 15 s: a 60 s wait would let the copies overlap).
pub(crate) fn fence_timings(bound: Duration, stop_grace: Duration) -> (Duration, Duration) {
    (FENCE_SAVE_WAIT.min(bound / 2), stop_grace.min(bound / 4))
}

impl Launcher {
    /// Fence job `job_id` (the coordinator named it and has acknowledged nothing for longer than
    /// `bound`): ask it to save, and stop it when [`fence_timings`]'s wait is over if it still
    /// runs (at once if it cannot save). Once per run of a job; `None` when there is nothing
    /// to do.
    pub fn fence(
        &mut self,
        fs: &CgroupFs,
        job_id: &str,
        now: Instant,
        bound: Duration,
        why: &str,
    ) -> Option<SaveAction> {
        let (wait, grace) = fence_timings(bound, self.config.stop_grace);
        let l = self.jobs.values_mut().find(|l| {
            l.info.job_id == job_id && !l.info.state.is_finished() && l.fence_stop_at.is_none()
        })?;
        warn!(job = %job_id, reason = %why, "fencing a job: saving it, then stopping it");
        l.fence_stop_at = Some((now + wait, grace));
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
            self.stop_within(
                fs,
                &StopJob {
                    job_id: job_id.to_owned(),
                    reason: format!("{why} (it cannot save)"),
                },
                now,
                grace,
            );
        }
        Some(action)
    }

    /// Stop the fenced jobs still running after their save's wait.
    pub(super) fn stop_fenced(&mut self, fs: &CgroupFs, now: Instant) {
        let due: Vec<(String, Duration)> = self
            .jobs
            .values()
            .filter_map(|l| {
                let (at, grace) = l.fence_stop_due()?;
                (at <= now).then(|| (l.info.job_id.clone(), grace))
            })
            .collect();
        for (job_id, grace) in due {
            self.stop_within(
                fs,
                &StopJob {
                    reason: "fenced: it did not save in time".into(),
                    job_id,
                },
                now,
                grace,
            );
        }
    }
}
