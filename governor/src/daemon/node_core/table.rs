//! The job table: jobs start and stop being governed (the policy is told; what the governor
//! wrote is released: an [`Effect`] for the shell), and every job is let go at shutdown.

use std::collections::VecDeque;
use std::time::Instant;

use tracing::{info, warn};

use crate::cgroup::JobCgroup;
use crate::policy::Direction;
use crate::policy::quality::{EarlyStop, QualityTracker};
use crate::progress::SignalTracker;

use super::{Effect, JobEntry, NewJob, NodeCore};

impl NodeCore {
    /// Start governing a job. Returns false if the cgroup is already governed.
    pub fn add_job(&mut self, now: Instant, job: NewJob) -> bool {
        if self.jobs.contains_key(&job.cgroup) {
            return false;
        }
        info!(job = %job.name, cgroup = %job.cgroup, source = job.source.label(), runtime = %job.runtime, "governing job");
        self.policy.job_added(self.secs(now), &job.spec);
        if let Some(t) = &job.sweep {
            // A sweep compares losses: what falls (validation loss, else a falling signal).
            if !self.sweeps.join(
                &t.sweep,
                t.rule,
                Direction::Minimise,
                job.cgroup.clone(),
                job.epochs,
            ) {
                let kept = self.sweeps.get(&t.sweep).map(|s| s.rule());
                warn!(job = %job.name, sweep = %t.sweep, asked = ?t.rule, kept = ?kept, "this trial asks for another halving rule than its sweep's first trial: the sweep keeps the first (reported once per sweep)");
            }
        }
        let entry = JobEntry {
            name: job.name,
            source: job.source,
            runtime: job.runtime,
            spec: job.spec,
            tracker: SignalTracker::new(job.signal),
            epochs: job.epochs,
            adopted_at: now,
            adopted_secs: self.secs(now),
            records: 0,
            last_record_at: None,
            last_value: None,
            epochs_done: None,
            epoch_timer: Default::default(),
            history: VecDeque::new(),
            first_value: None,
            quality: QualityTracker::new(Direction::Minimise),
            quality_from_validation: false,
            finish: job.finish.map(|r| EarlyStop::new(r, Direction::Minimise)),
            finishing: None,
            sweep: job.sweep.map(|t| t.sweep),
            waiting_at_rung: None,
            held: false,
            log_file: None,
            log_problem: None,
            cpu_prev: None,
            cpu_cores: None,
            cpu_seconds: None,
            usage: None,
            allocation: None,
            touched: false,
            applied: None,
            move_request: None,
            apply_failing: false,
        };
        self.jobs.insert(job.cgroup, entry);
        self.next_decision_at = Some(now);
        true
    }

    /// Stop governing a job; every file the governor changed in its cgroup is to be restored
    /// (and trials its sweep cuts now to be stopped): pushed to `effects`.
    pub fn remove_job(
        &mut self,
        now: Instant,
        cgroup: &JobCgroup,
        why: &str,
        effects: &mut Vec<Effect>,
    ) -> Option<JobEntry> {
        let entry = self.jobs.remove(cgroup)?;
        info!(job = %entry.name, cgroup = %cgroup, reason = why, "job no longer governed");
        self.policy.job_removed(self.secs(now), &entry.spec.id);
        if !self.settings.dry_run {
            effects.push(Effect::Release {
                cgroup: cgroup.clone(),
            });
        }
        self.next_decision_at = Some(now);
        // A rung of its sweep that waited only for this trial is judged now.
        if entry.sweep.is_some() {
            let cuts = self.sweeps.leave(cgroup);
            self.cut_trials(now, cuts, effects);
            self.sync_holds(now);
        }
        Some(entry)
    }

    /// Forget every job (shutdown): everything the governor wrote is to be restored.
    pub fn shutdown(&mut self, effects: &mut Vec<Effect>) {
        effects.push(Effect::RestoreAll);
        self.jobs.clear();
    }
}
