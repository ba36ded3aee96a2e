//! Writing the files: each write checked against what the file holds, rate-limited and preceded
//! by the original's record; another writer's value (found then or by the periodic drift check)
//! adopted as the original, ours re-applied after a back-off.

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::apply::is_loosening;
use super::{
    ApplyOutcome, Core, Desired, DriftAction, DriftEvent, JobState, KnobState, WriteReason,
    WriteRecord,
};
use crate::cgroup::error::CgroupError;
use crate::cgroup::hierarchy::JobCgroup;
use crate::cgroup::knob::KnobClass;

impl Core {
    /// The drift check: re-read every file we have written (someone else's write?) or whose
    /// original we know (refresh it).
    pub(super) fn verify(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        let mut changed = false;
        for ks in js.knobs.iter_mut() {
            if ks.abandoned || (ks.ours.is_none() && ks.theirs.is_none() && !ks.unavailable) {
                continue;
            }
            let current = match self.fs.read_job_file(job, ks.knob.controller(), &ks.path) {
                Ok(c) => c.trim().to_owned(),
                Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
                Err(CgroupError::ControllerUnavailable { .. }) => {
                    ks.unavailable = true;
                    continue;
                }
                Err(e) => {
                    warn!(job = %job, file = %ks.knob, error = %e, "drift check: cannot read");
                    out.errors.push(e);
                    continue;
                }
            };
            if ks.unavailable {
                ks.unavailable = false;
                changed = true;
            }
            match &ks.ours {
                Some(ours) if !ks.knob.equivalent(&current, ours, self.fs.page_size()) => {
                    self.on_drift(job, ks, current, now, out)?;
                    changed = true;
                }
                Some(_) => {}
                // A previous run's record holds the true original: the file holds its value.
                None if self.records.contains_key(&ks.path) => {}
                None => {
                    if ks.theirs.as_deref() != Some(current.as_str()) {
                        ks.theirs = Some(current);
                        changed = true;
                    }
                }
            }
        }
        if changed {
            js.settled = None;
        }
        Ok(())
    }

    /// Bring one knob to `desired`, subject to the rate limit, drift back-off and recording.
    pub(super) fn execute(
        &mut self,
        job: &JobCgroup,
        ks: &mut KnobState,
        desired: Desired,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        ks.deferred_until = None;
        if ks.abandoned || ks.unavailable {
            out.skipped += 1;
            return Ok(());
        }
        let page = self.fs.page_size();
        let (target, reason) = match &desired {
            Desired::Set(v) => (v.clone(), WriteReason::Apply),
            Desired::Theirs => match (&ks.ours, &ks.theirs) {
                (Some(_), Some(theirs)) => (theirs.clone(), WriteReason::Restore),
                _ => {
                    out.skipped += 1;
                    return Ok(());
                }
            },
        };
        match &ks.ours {
            Some(ours) if *ours == target && reason == WriteReason::Apply => {
                out.skipped += 1;
                return Ok(());
            }
            None if ks
                .theirs
                .as_deref()
                .is_some_and(|t| ks.knob.equivalent(t, &target, page)) =>
            {
                out.skipped += 1;
                return Ok(());
            }
            _ => {}
        }
        if let Some(hold) = ks.hold_until {
            if now < hold {
                ks.deferred_until = Some(hold);
                out.defer(hold);
                return Ok(());
            }
            ks.hold_until = None;
        }
        let from = ks.ours.as_deref().or(ks.theirs.as_deref()).unwrap_or("");
        let exempt =
            ks.knob.class() == KnobClass::Memory && is_loosening(ks.knob, from, &target, page);
        if !exempt && let Some(last) = ks.last_write_at {
            let due = last + self.config.min_interval(ks.knob.class());
            if now < due {
                ks.deferred_until = Some(due);
                out.defer(due);
                return Ok(());
            }
        }

        // Read what is there now: someone else's write is adopted, never overwritten blindly.
        let current = match self.fs.read_job_file(job, ks.knob.controller(), &ks.path) {
            Ok(c) => c.trim().to_owned(),
            Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
            Err(e) => {
                if matches!(e, CgroupError::ControllerUnavailable { .. }) {
                    ks.unavailable = true;
                }
                // Logged once per failing spell, like a failed write (decisions come every second).
                if ks.failing {
                    debug!(job = %job, file = %ks.knob, error = %e, "cannot read before writing, still");
                } else {
                    warn!(job = %job, file = %ks.knob, error = %e, "cannot read before writing; will retry");
                    ks.failing = true;
                }
                out.errors.push(e);
                return Ok(());
            }
        };
        match &ks.ours {
            Some(ours) if !ks.knob.equivalent(&current, ours, page) => {
                return self.on_drift(job, ks, current, now, out);
            }
            Some(_) => {}
            None => {
                if let Some(existing) = self.records.get(&ks.path) {
                    // A previous run's write is still in effect (not recovered yet): its recorded
                    // original stays theirs, and what the file holds is ours.
                    ks.theirs = Some(existing.original.clone());
                    self.leftovers.remove(&ks.path);
                    if ks.knob.equivalent(&current, &target, page) {
                        ks.ours = Some(target);
                        out.skipped += 1;
                        return Ok(());
                    }
                } else {
                    if ks.knob.equivalent(&current, &target, page) {
                        ks.theirs = Some(current);
                        out.skipped += 1;
                        return Ok(());
                    }
                    // First write: the original must be on disk before the file changes.
                    ks.theirs = Some(current.clone());
                    self.record(job, ks, current.clone())?;
                }
            }
        }

        match self
            .fs
            .write_job_file(job, ks.knob.controller(), &ks.path, &target)
        {
            Ok(()) => {
                ks.last_write_at = Some(now);
                if ks.failing {
                    info!(job = %job, file = %ks.knob, "cgroup write succeeds again");
                    ks.failing = false;
                }
                match reason {
                    WriteReason::Apply => {
                        debug!(job = %job, file = %ks.knob, path = %ks.path.display(),
                            from = %current, to = %target, "cgroup file written");
                        ks.ours = Some(target.clone());
                    }
                    WriteReason::Restore => {
                        info!(job = %job, file = %ks.knob, path = %ks.path.display(),
                            from = %current, to = %target, "cgroup file restored to its original value");
                        ks.ours = None;
                        self.unrecord(&ks.path)?;
                    }
                }
                out.written.push(WriteRecord {
                    knob: ks.knob,
                    value: target,
                    reason,
                });
            }
            Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
            Err(e) => {
                ks.last_write_at = Some(now);
                if ks.failing {
                    debug!(job = %job, file = %ks.knob, error = %e, "cgroup write still failing");
                } else {
                    warn!(job = %job, file = %ks.knob, error = %e, "cgroup write failed; will retry");
                    ks.failing = true;
                }
                out.errors.push(e);
            }
        }
        Ok(())
    }

    /// Someone else wrote `theirs` over our value.
    pub(super) fn on_drift(
        &mut self,
        job: &JobCgroup,
        ks: &mut KnobState,
        theirs: String,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        let forget = Duration::from_millis(self.config.drift_forget_after_ms);
        if ks
            .last_drift_at
            .is_some_and(|t| now.saturating_duration_since(t) > forget)
        {
            ks.drift_episodes = 0;
        }
        ks.drift_episodes = ks.drift_episodes.saturating_add(1);
        ks.last_drift_at = Some(now);
        let ours = ks.ours.take().unwrap_or_default();
        ks.theirs = Some(theirs.clone());
        // Their value is in the file: nothing of ours to restore until we write again, and the
        // next write records their value as the original.
        self.unrecord(&ks.path)?;
        let action = if ks.drift_episodes > self.config.drift_give_up_after {
            ks.abandoned = true;
            ks.deferred_until = None;
            warn!(job = %job, file = %ks.knob, ours = %ours, theirs = %theirs,
                overwrites = ks.drift_episodes,
                "another program keeps overwriting this file: no longer governing it for this job");
            DriftAction::GaveUp
        } else {
            let exp = ks.drift_episodes.saturating_sub(1).min(20);
            let backoff = Duration::from_millis(
                self.config
                    .drift_backoff_initial_ms
                    .saturating_mul(1 << exp)
                    .min(self.config.drift_backoff_max_ms),
            );
            let at = now + backoff;
            ks.hold_until = Some(at);
            ks.deferred_until = Some(at);
            out.defer(at);
            if ks.drift_episodes == 1 {
                warn!(job = %job, file = %ks.knob, ours = %ours, theirs = %theirs,
                    reapply_in_ms = backoff.as_millis() as u64,
                    "cgroup file changed by another program: adopting its value as the original");
            } else {
                debug!(job = %job, file = %ks.knob, ours = %ours, theirs = %theirs,
                    overwrites = ks.drift_episodes, reapply_in_ms = backoff.as_millis() as u64,
                    "cgroup file overwritten again");
            }
            DriftAction::ReapplyAt(at)
        };
        out.drift.push(DriftEvent {
            knob: ks.knob,
            ours,
            theirs,
            action,
        });
        Ok(())
    }
}
