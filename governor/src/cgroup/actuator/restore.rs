//! Putting originals back: a released job's files, everything at shutdown, and what a
//! previous run left in the state file (recovery after a crash).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use tracing::{debug, info, warn};

use super::{Actuator, Core, RestoreReport};
use crate::cgroup::error::CgroupError;
use crate::cgroup::hierarchy::JobCgroup;
use crate::cgroup::state::StateEntry;

impl Actuator {
    /// Restore everything a previous run left in the state file (a crash or SIGKILL), then clear
    /// those entries. Call once at start, before the first `apply`. Entries whose cgroup is gone
    /// or was recreated are dropped; entries whose restore fails stay for `restore_all`.
    pub fn recover(&mut self) -> RestoreReport {
        let mut report = RestoreReport {
            corrupt_state: self.corrupt_state.take(),
            ..Default::default()
        };
        let leftovers: Vec<PathBuf> = std::mem::take(&mut self.core.leftovers)
            .into_iter()
            .collect();
        let mut entries: Vec<StateEntry> = leftovers
            .iter()
            .filter_map(|p| self.core.records.get(p).cloned())
            .collect();
        entries.sort_by_key(|e| (e.job.clone(), e.knob.restore_rank()));
        if !entries.is_empty() {
            info!(
                entries = entries.len(),
                "restoring cgroup values left by a previous governor run"
            );
        }
        let before = self.core.records.len();
        for entry in entries {
            self.core.restore_entry(&entry, None, &mut report);
        }
        // Failed restores stay leftovers: `restore_all` (or the next start) tries again.
        self.core.leftovers = leftovers
            .into_iter()
            .filter(|p| self.core.records.contains_key(p))
            .collect();
        self.core.persist_if_changed(before, &mut report.errors);
        report
    }
    /// Stop governing `job`: put back the original of every file the governor changed (unless
    /// someone else changed it since), forget the job. A vanished cgroup is not an error.
    pub fn release(&mut self, job: &JobCgroup) -> RestoreReport {
        let mut report = RestoreReport::default();
        let js = self.jobs.remove(job);
        let name = job.to_string();
        let mut entries: Vec<StateEntry> = self
            .core
            .records
            .values()
            .filter(|e| e.job == name)
            .cloned()
            .collect();
        entries.sort_by_key(|e| e.knob.restore_rank());
        let before = self.core.records.len();
        for entry in entries {
            let ours = js.as_ref().and_then(|js| {
                js.knobs
                    .iter()
                    .find(|k| k.path == entry.path)
                    .and_then(|k| k.ours.clone())
            });
            self.core
                .restore_entry(&entry, ours.as_deref(), &mut report);
        }
        self.core.persist_if_changed(before, &mut report.errors);
        report
    }

    /// Restore every recorded original (all jobs, leftovers of a previous run, restores that
    /// failed earlier) and forget every job: call on shutdown and on SIGTERM. The state file is
    /// removed when everything was restored; what could not be restored stays in it for the next
    /// start's `recover`.
    pub fn restore_all(&mut self) -> RestoreReport {
        let mut report = RestoreReport::default();
        let mut jobs: Vec<JobCgroup> = self.jobs.keys().cloned().collect();
        jobs.sort();
        for job in jobs {
            let r = self.release(&job);
            report.restored.extend(r.restored);
            report.left_to_others.extend(r.left_to_others);
            report.gone.extend(r.gone);
            report.errors.extend(r.errors);
        }
        // Everything else: leftovers of a previous run and restores that failed earlier.
        report.corrupt_state = self.corrupt_state.take();
        let mut rest: Vec<StateEntry> = self.core.records.values().cloned().collect();
        rest.sort_by_key(|e| (e.job.clone(), e.knob.restore_rank()));
        let before = self.core.records.len();
        for entry in rest {
            self.core.restore_entry(&entry, None, &mut report);
        }
        self.core
            .leftovers
            .retain(|p| self.core.records.contains_key(p));
        self.core.persist_if_changed(before, &mut report.errors);
        info!(
            restored = report.restored.len(),
            left_to_others = report.left_to_others.len(),
            gone = report.gone.len(),
            failed = report.errors.len(),
            "cgroup values restored"
        );
        report
    }
}

impl Core {
    /// Put one recorded original back. With `ours` (a live job) the file is restored only if it
    /// still holds our value; without (recovery) it is restored unless its cgroup was replaced.
    pub(super) fn restore_entry(
        &mut self,
        entry: &StateEntry,
        ours: Option<&str>,
        report: &mut RestoreReport,
    ) {
        let dir = entry.path.parent().unwrap_or(&entry.path);
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(_) => {
                debug!(job = %entry.job, file = %entry.knob, "cgroup gone: nothing to restore");
                report.gone.push((entry.job.clone(), entry.knob));
                self.records.remove(&entry.path);
                return;
            }
        };
        if ours.is_none() && entry.cgroup_ino.is_some_and(|ino| ino != meta.ino()) {
            info!(job = %entry.job, file = %entry.knob,
                "cgroup was recreated since the original was recorded: not restoring");
            report.gone.push((entry.job.clone(), entry.knob));
            self.records.remove(&entry.path);
            return;
        }
        let page = self.fs.page_size();
        let current = std::fs::read_to_string(&entry.path).map(|c| c.trim().to_owned());
        if let (Some(ours), Ok(current)) = (ours, &current)
            && !entry.knob.equivalent(current, ours, page)
        {
            info!(job = %entry.job, file = %entry.knob, theirs = %current,
                "changed by another program since our last write: leaving its value");
            report.left_to_others.push((entry.job.clone(), entry.knob));
            self.records.remove(&entry.path);
            return;
        }
        if let Ok(current) = &current
            && entry.knob.equivalent(current, &entry.original, page)
        {
            self.records.remove(&entry.path);
            return;
        }
        match crate::cgroup::fs::write_file(&entry.path, &entry.original) {
            Ok(()) => {
                info!(job = %entry.job, file = %entry.knob, path = %entry.path.display(),
                    to = %entry.original, "cgroup file restored to its original value");
                report
                    .restored
                    .push((entry.job.clone(), entry.knob, entry.original.clone()));
                self.records.remove(&entry.path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                debug!(job = %entry.job, file = %entry.knob, "cgroup gone: nothing to restore");
                report.gone.push((entry.job.clone(), entry.knob));
                self.records.remove(&entry.path);
            }
            Err(source) => {
                let e = CgroupError::WriteFailed {
                    path: entry.path.clone(),
                    value: entry.original.clone(),
                    error: source,
                };
                warn!(job = %entry.job, error = %e, "cannot restore original value; kept in the state file");
                report.errors.push(e);
            }
        }
    }
}
