//! The actuator's bookkeeping: the files governed for a job and their per-file state, and the
//! originals recorded durably in the state file before a first write.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{Core, JobState, KnobState};
use crate::cgroup::error::CgroupError;
use crate::cgroup::guard::GuardState;
use crate::cgroup::hierarchy::{HierarchyKind, JobCgroup};
use crate::cgroup::knob::Knob;
use crate::cgroup::state::StateEntry;

impl Core {
    pub(super) fn kind(&self) -> HierarchyKind {
        self.fs.kind()
    }

    /// The knobs governed for a job on this hierarchy with this configuration.
    pub(super) fn knobs_for(&self) -> Vec<Knob> {
        let c = &self.config;
        let v2 = self.kind().is_v2();
        let mut knobs = Vec::new();
        if c.manage_cpu {
            if v2 {
                knobs.extend([Knob::CpuMax, Knob::CpuWeight]);
            } else {
                knobs.extend([Knob::CfsQuota, Knob::CfsPeriod, Knob::CpuShares]);
            }
        }
        if c.manage_memory {
            if v2 {
                knobs.extend([Knob::MemoryMax, Knob::MemoryHigh]);
            } else {
                if c.v1_memory_limit {
                    knobs.push(Knob::MemoryLimit);
                }
                if c.v1_high_as_soft_limit {
                    knobs.push(Knob::MemorySoftLimit);
                }
            }
        }
        knobs
    }

    pub(super) fn new_job_state(&self, job: &JobCgroup) -> JobState {
        let knobs = self
            .knobs_for()
            .into_iter()
            .filter_map(|knob| {
                // A controller that is not mounted (v1) simply has no knob here.
                let path = self.fs.knob_path(job, knob).ok()?;
                let mut ks = KnobState::new(knob, path);
                // A record from a previous run (not recovered yet) is the true original.
                if let Some(entry) = self.records.get(&ks.path) {
                    ks.theirs = Some(entry.original.clone());
                }
                Some(ks)
            })
            .collect();
        JobState {
            knobs,
            guard: GuardState::default(),
            last_request: None,
            settled: None,
            next_verify_at: None,
            memory_unavailable_reported: false,
        }
    }

    /// Record `original` for `ks` durably (the caller checked that no record exists).
    pub(super) fn record(
        &mut self,
        job: &JobCgroup,
        ks: &mut KnobState,
        original: String,
    ) -> Result<(), CgroupError> {
        let cgroup_ino = ks
            .path
            .parent()
            .and_then(|d| std::fs::metadata(d).ok())
            .map(|m| m.ino());
        let entry = StateEntry {
            job: job.to_string(),
            knob: ks.knob,
            path: ks.path.clone(),
            original,
            cgroup_ino,
        };
        self.records.insert(ks.path.clone(), entry.clone());
        if let Err(e) = self
            .store
            .append(std::slice::from_ref(&entry), &[], self.records.values())
        {
            self.records.remove(&ks.path);
            return Err(e);
        }
        Ok(())
    }

    pub(super) fn unrecord(&mut self, path: &Path) -> Result<(), CgroupError> {
        if self.records.remove(path).is_some() {
            self.leftovers.remove(path);
            self.store
                .append(&[], &[path.to_owned()], self.records.values())?;
        }
        Ok(())
    }

    pub(super) fn forget_records_of(&mut self, job: &JobCgroup) {
        let name = job.to_string();
        self.records.retain(|_, e| e.job != name);
    }

    /// Rewrite the state file after restores removed records (`before`: the count before).
    pub(super) fn persist_if_changed(&mut self, before: usize, errors: &mut Vec<CgroupError>) {
        if self.records.len() == before {
            return;
        }
        self.leftovers.retain(|p| self.records.contains_key(p));
        if let Err(e) = self.store.rewrite(self.records.values()) {
            tracing::error!(error = %e, "cannot update the state file");
            errors.push(e);
        }
    }
}
