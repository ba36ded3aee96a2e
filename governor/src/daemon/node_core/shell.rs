//! The core's shell: the only part of the node core that acts. It carries out the [`Effect`]s
//! [`NodeCore`] returns against the real [`Actuator`] (cgroup writes, restores, signals), hands
//! their outcomes back, reads what the core decides on (usage, the writes the actuator held
//! back) and times the decision round for the decision budget. The daemon's control loop, the
//! tests against a fake cgroup root and the decision-latency benchmark drive the core through
//! it.

use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{debug, info, warn};

use crate::cgroup::{Actuator, CgroupFs, JobCgroup, RestoreReport};
use crate::policy::{NodePolicy, NodeResources};
use crate::progress::Record;
use crate::status::NodeStatus;
use crate::watch::{WatchEvent, WatchEventKind};

use super::{CoreSettings, CpuSampler, Effect, JobEntry, NewJob, NodeCore, RoundStats};

/// A [`NodeCore`] and the actuator that carries out its effects.
pub struct CoreShell {
    pub(super) core: NodeCore,
    actuator: Actuator,
}

/// What carrying out a batch of effects did.
#[derive(Default)]
struct Carried {
    files_written: usize,
    errors: usize,
    /// The report of an [`Effect::RestoreAll`].
    restored: Option<RestoreReport>,
}

impl CoreShell {
    /// A new core (no jobs) with an already-recovered actuator.
    pub fn new(
        settings: CoreSettings,
        policy: Box<dyn NodePolicy>,
        actuator: Actuator,
        now: Instant,
    ) -> CoreShell {
        let core = NodeCore::new(settings, policy, actuator.fs().kind(), now);
        CoreShell { core, actuator }
    }

    /// The core (its job table, its policy, its status).
    pub fn core(&self) -> &NodeCore {
        &self.core
    }

    /// The actuator (for job cgroup creation and usage reads).
    pub fn actuator(&self) -> &Actuator {
        &self.actuator
    }

    /// Carry out `effects` in order. Each write's outcome goes back to the core.
    fn carry_out(&mut self, now: Instant, effects: Vec<Effect>) -> Carried {
        let mut carried = Carried::default();
        for effect in effects {
            match effect {
                Effect::ApplyLimits {
                    cgroup,
                    alloc,
                    usage,
                } => {
                    let result = match &usage {
                        Some(u) => self.actuator.apply_with_usage(&cgroup, &alloc, u, now),
                        None => self.actuator.apply(&cgroup, &alloc, now),
                    };
                    match &result {
                        Ok(outcome) => {
                            carried.files_written += outcome.written.len();
                            carried.errors += outcome.errors.len();
                        }
                        Err(_) => carried.errors += 1,
                    }
                    self.core.limits_applied(&cgroup, &alloc, &result);
                }
                Effect::Release { cgroup } => log_restore(&self.actuator.release(&cgroup)),
                Effect::Signal {
                    cgroup,
                    signal,
                    job,
                } => signal_group(self.actuator.fs(), &cgroup, signal, &job),
                Effect::RestoreAll => {
                    let report = self.actuator.restore_all();
                    log_restore(&report);
                    carried.restored = Some(report);
                }
            }
        }
        carried
    }

    /// Start governing a job. Returns false if the cgroup is already governed.
    pub fn add_job(&mut self, now: Instant, job: NewJob) -> bool {
        self.core.add_job(now, job)
    }

    /// Stop governing a job and restore every file the governor changed in its cgroup.
    pub fn remove_job(&mut self, now: Instant, cgroup: &JobCgroup, why: &str) -> Option<JobEntry> {
        let mut effects = Vec::new();
        let entry = self.core.remove_job(now, cgroup, why, &mut effects);
        self.carry_out(now, effects);
        entry
    }

    /// A record from one of a job's logs (and the stops it causes). Returns true when it moved
    /// the progress signal.
    pub fn on_record(&mut self, now: Instant, cgroup: &JobCgroup, record: &Record) -> bool {
        let mut effects = Vec::new();
        let moved = self.core.on_record(now, cgroup, record, &mut effects);
        self.carry_out(now, effects);
        moved
    }

    /// A problem with a job's logs (shown in status; the watcher logs it once).
    pub fn on_log_problem(&mut self, cgroup: &JobCgroup, message: String) {
        self.core.on_log_problem(cgroup, message);
    }

    /// The control loop's handling of one event of the log watcher: a record goes to its job's
    /// signal and, when it moved the signal, to a decision (at once, or batched within the
    /// decision budget: [`Self::on_progress_moved`]); a problem is shown in status. Returns the
    /// decision's figures when it decided now. (The daemon and the decision-latency benchmark
    /// both call this.)
    pub fn on_watch_event(&mut self, now: Instant, ev: &WatchEvent) -> Option<RoundStats> {
        let Ok(cgroup) = JobCgroup::new(&*ev.key) else {
            return None;
        };
        match &ev.kind {
            WatchEventKind::Record(record) => {
                if self.on_record(now, &cgroup, record) {
                    return self.on_progress_moved(now);
                }
                None
            }
            WatchEventKind::Problem(message) => {
                self.on_log_problem(&cgroup, message.clone());
                None
            }
            WatchEventKind::Format(_)
            | WatchEventKind::Opened
            | WatchEventKind::Truncated
            | WatchEventKind::Closed => None,
        }
    }

    /// A job's progress signal moved: decide now, or batched within the decision budget
    /// ([`NodeCore::on_progress_moved`]). Returns the decision's figures when it decided now
    /// (`None`: batched, see [`Self::on_wakeup`]).
    pub fn on_progress_moved(&mut self, now: Instant) -> Option<RoundStats> {
        self.core
            .on_progress_moved(now)
            .then(|| self.decide_and_apply(now))
    }

    /// The control loop's wake-up at [`Self::next_wakeup`]: writes the actuator held back,
    /// then the decision when one is due (returning its figures).
    pub fn on_wakeup(&mut self, now: Instant) -> Option<RoundStats> {
        self.poll_actuator(now);
        self.core
            .decision_due(now)
            .then(|| self.decide_and_apply(now))
    }

    /// Whether a decision is due by now.
    pub fn decision_due(&self, now: Instant) -> bool {
        self.core.decision_due(now)
    }

    /// Ask the policy for a plan ([`NodeCore::decide`]) and carry out its writes and releases.
    /// What the round took, writes included, spaces the next decisions within the budget.
    pub fn decide_and_apply(&mut self, now: Instant) -> RoundStats {
        let started = Instant::now();
        let mut effects = Vec::new();
        let mut stats = self.core.decide(now, &mut effects);
        let carried = self.carry_out(now, effects);
        stats.files_written += carried.files_written;
        stats.errors += carried.errors;
        stats.took = started.elapsed();
        self.core.round_done(now, stats.took);
        stats
    }

    /// Apply writes the actuator held back (rate limits, drift back-off), if due.
    pub fn poll_actuator(&mut self, now: Instant) {
        if self.core.settings.dry_run {
            return;
        }
        for (cgroup, result) in self.actuator.poll(now) {
            self.core.held_back_write_done(&cgroup, &result);
        }
    }

    /// The earliest instant something is due (policy decision or held-back write).
    pub fn next_wakeup(&self) -> Option<Instant> {
        let held_back = if self.core.settings.dry_run {
            None
        } else {
            self.actuator.next_wakeup()
        };
        match (self.core.next_decision_at(), held_back) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The sampling tick: jobs that outstayed their stop's grace period are sent SIGTERM, then
    /// every job's CPU and memory usage is read and handed to the policy.
    pub fn sample(&mut self, now: Instant, cpu: &mut dyn CpuSampler) {
        let mut effects = Vec::new();
        self.core.terminate_overdue_stops(now, &mut effects);
        self.carry_out(now, effects);
        let actuator = &self.actuator;
        self.core
            .sample(now, cpu, &mut |cgroup| match actuator.usage(cgroup) {
                Ok(u) => Some(u),
                Err(e) if e.is_gone() => None,
                Err(e) => {
                    debug!(cgroup = %cgroup, error = %e, "usage unreadable");
                    None
                }
            });
    }

    /// Restore everything and forget every job (shutdown).
    pub fn shutdown(&mut self) -> RestoreReport {
        let mut effects = Vec::new();
        self.core.shutdown(&mut effects);
        self.carry_out(Instant::now(), effects)
            .restored
            .unwrap_or_default()
    }

    /// The status snapshot `governor status` shows.
    pub fn status(&self, now: Instant) -> NodeStatus {
        self.core.status(now)
    }

    /// Whether a cgroup is governed.
    pub fn contains(&self, cgroup: &JobCgroup) -> bool {
        self.core.contains(cgroup)
    }

    /// Governed jobs.
    pub fn jobs(&self) -> impl Iterator<Item = (&JobCgroup, &JobEntry)> {
        self.core.jobs()
    }

    /// Number of governed jobs.
    pub fn job_count(&self) -> usize {
        self.core.job_count()
    }

    /// The daemon's counters and histograms (cheap to clone: they share their values).
    pub fn metrics(&self) -> crate::metrics::DaemonMetrics {
        self.core.metrics()
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.core.policy_name()
    }

    /// Replace the policy (SIGHUP with a new policy): every job is re-announced to it.
    pub fn set_policy(&mut self, policy: Box<dyn NodePolicy>, now: Instant) {
        self.core.set_policy(policy, now);
    }

    /// Update the capacity the policy divides.
    pub fn set_resources(&mut self, resources: NodeResources) {
        self.core.set_resources(resources);
    }

    /// Record which CPU source is in use (for status).
    pub fn set_cpu_source(&mut self, name: String, note: Option<String>) {
        self.core.set_cpu_source(name, note);
    }

    /// Record the coordinator connection state (for status).
    pub fn set_coordinator_state(&mut self, state: Option<String>) {
        self.core.set_coordinator_state(state);
    }
}

/// Signal every process of a job's cgroup (a stop it asked for); a failure is logged, never
/// fatal.
fn signal_group(fs: &CgroupFs, cgroup: &JobCgroup, signal: Signal, name: &str) {
    match fs.signal_job_group(cgroup, signal) {
        Ok(n) => debug!(job = %name, ?signal, processes = n, "signalled the job"),
        Err(e) => warn!(job = %name, ?signal, error = %e, "cannot signal the job"),
    }
}

fn log_restore(report: &RestoreReport) {
    for (job, knob, value) in &report.restored {
        debug!(job = %job, file = ?knob, value = %value, "restored");
    }
    for (job, knob) in &report.left_to_others {
        info!(job = %job, file = ?knob, "left as another writer set it");
    }
    for e in &report.errors {
        warn!(error = %e, "restore failed (kept in the state file for the next attempt)");
    }
}
