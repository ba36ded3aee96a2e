//! The status snapshot `governor status` shows: the node's and each job's.

use std::time::Instant;

use crate::cgroup::{HierarchyKind, JobCgroup};
use crate::policy::Category;
use crate::status::{JobStatus, NodeStatus};

use super::{JobEntry, NodeCore};

impl NodeCore {
    /// The status snapshot `governor status` shows.
    pub fn status(&self, now: Instant) -> NodeStatus {
        let kind = match self.hierarchy {
            HierarchyKind::Unified => "v2",
            HierarchyKind::Hybrid => "hybrid",
            HierarchyKind::Legacy => "v1",
        };
        NodeStatus {
            node: self.settings.node_name.clone(),
            policy: self.policy.name().into(),
            dry_run: self.settings.dry_run,
            cpu_source: self.cpu_source.clone(),
            cpu_source_note: self.cpu_source_note.clone(),
            cgroup_mode: kind.into(),
            cores: self.settings.resources.cores,
            memory_bytes: self.settings.resources.memory_bytes,
            coordinator: self.coordinator.clone(),
            uptime_seconds: self.secs(now),
            jobs: self
                .jobs
                .iter()
                .map(|(cgroup, e)| e.status(cgroup, now))
                .collect(),
            gpus: Vec::new(),
        }
    }
}

impl JobEntry {
    /// Progress per minute over the last minute, relative to the first value of the run
    /// (positive = improving, whatever the direction).
    fn growth_per_minute(&self) -> Option<f64> {
        let (t0, v0) = *self.history.front()?;
        let (t1, v1) = *self.history.back()?;
        let minutes = t1.saturating_duration_since(t0).as_secs_f64() / 60.0;
        let scale = self.first_value?.abs().max(1e-12);
        if minutes < 1.0 / 60.0 {
            return None;
        }
        let delta = match self.tracker.direction() {
            crate::policy::Direction::Minimise => v0 - v1,
            crate::policy::Direction::Maximise => v1 - v0,
        };
        Some(delta / scale / minutes)
    }

    fn status(&self, cgroup: &JobCgroup, now: Instant) -> JobStatus {
        let alloc = self.allocation.as_ref();
        JobStatus {
            name: self.name.clone(),
            cgroup: format!("/{}", cgroup.relative().display()),
            source: self.source.label().into(),
            runtime: self.runtime.clone(),
            category: alloc.map(|a| a.category).unwrap_or(Category::Unknown),
            signal: self.tracker.metric().map(str::to_owned),
            signal_value: self.last_value,
            growth_per_minute: self.growth_per_minute(),
            records: self.records,
            log_file: self.log_file.clone(),
            log_problem: self.log_problem.clone(),
            cpu_usage_cores: self.cpu_cores,
            cpu_weight: alloc.map(|a| a.cpu.weight),
            cpu_max_cores: alloc.and_then(|a| a.cpu.max_cores),
            memory_bytes: self.usage.as_ref().and_then(|u| u.memory_current),
            memory_high_bytes: alloc.and_then(|a| a.memory.high_bytes),
            memory_max_bytes: alloc.and_then(|a| a.memory.max_bytes),
            decision: alloc
                .map(|a| a.reason.clone())
                .unwrap_or_else(|| "waiting for the first decision".into()),
            age_seconds: now.saturating_duration_since(self.adopted_at).as_secs_f64(),
            move_request: self.move_request.clone(),
            time_to_quality_s: self
                .quality
                .reached_at()
                .map(|at| (at - self.adopted_secs).max(0.0)),
            finish: self.finishing.as_ref().map(|f| {
                format!(
                    "{}{}",
                    f.why,
                    if f.terminated { ", SIGTERM sent" } else { "" }
                )
            }),
            sweep: self.sweep.as_ref().map(|s| match self.waiting_at_rung {
                Some(e) => format!("{s} (at its {e}-epoch rung: waits for the other trials)"),
                None => s.clone(),
            }),
            quality_signal: if self.quality_from_validation {
                Some("validation loss".into())
            } else {
                self.tracker.metric().map(str::to_owned)
            },
            gpus: Vec::new(),
            gpu_memory_bytes: None,
            gpu_energy_joules: None,
            gpu_utilization_percent: None,
            gpu_power_watts: None,
            last_record_age_s: self
                .last_record_at
                .map(|at| now.saturating_duration_since(at).as_secs_f64()),
            epochs_done: self.epochs_done,
            epochs_total: self.epochs,
            epoch_seconds: self.epoch_timer.seconds(),
        }
    }
}
