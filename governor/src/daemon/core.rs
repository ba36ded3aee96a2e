//! The daemon's decision core, free of I/O scheduling: a job table, the node policy and the
//! actuator. The async shell ([`super::run`]) feeds it events; tests and benchmarks drive it
//! directly against a fake cgroup root with their own clock.
//!
//! Path of a log line to a cgroup write: the watcher delivers a [`Record`] →
//! [`NodeCore::on_record`] turns it into the job's progress signal (SignalTracker) and hands a
//! [`ProgressPoint`] to the policy → [`NodeCore::decide_and_apply`] asks the policy for a
//! [`Plan`] and applies each job's [`Allocation`] through the [`Actuator`] (which skips unchanged
//! writes, rate-limits, guards memory and records originals for restore).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tracing::{debug, info, warn};

use crate::cgroup::{Actuator, CgroupError, CgroupUsage, HierarchyKind, JobCgroup, RestoreReport};
use crate::policy::quality::{EarlyStop, FinishRule, QualityTracker};
use crate::policy::sweep::{Outranked, SweepTrial, Sweeps};
use crate::policy::{
    Allocation, Category, CpuAllocation, Direction, JobSpec, MemoryAllocation, NodePolicy,
    NodeResources, Plan, ProgressPoint, Usage,
};
use crate::progress::{Format, Record, SignalConfig, SignalTracker, SignalUpdate};
use crate::status::{JobStatus, NodeStatus};
use crate::watch::{WatchEvent, WatchEventKind};

/// How a job came to be governed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobSource {
    /// A file in the jobs directory.
    Declared(PathBuf),
    /// A process with `GOVERNOR_LOG` in its environment.
    Environment { pid: u32 },
    /// Started by `governor run-job` (or by the coordinator).
    Launched { pid: u32 },
}

impl JobSource {
    fn label(&self) -> &'static str {
        match self {
            JobSource::Declared(_) => "declared",
            JobSource::Environment { .. } => "environment",
            JobSource::Launched { .. } => "launched",
        }
    }
}

/// A job to start governing.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub cgroup: JobCgroup,
    pub name: String,
    pub source: JobSource,
    /// Runtime recognised from the cgroup path, for display.
    pub runtime: String,
    pub spec: JobSpec,
    pub signal: SignalConfig,
    /// Total epochs of the run, when the operator declared it: with the epoch the log reports,
    /// the policy learns how far along the job is ([`NodePolicy::work_done`]).
    pub epochs: Option<f64>,
    /// Opt-in: end the job once it has converged (stopped gracefully by the daemon).
    pub finish: Option<FinishRule>,
    /// Opt-in: a trial of a sweep, stopped gracefully when successive halving cuts it.
    pub sweep: Option<SweepTrial>,
}

/// A job that asked to be stopped (converged, or outranked in its sweep) is being stopped.
#[derive(Clone, Debug)]
struct Finishing {
    /// When the stop began (SIGINT sent then).
    at: Instant,
    /// "stopped: converged (best loss X)", "stopped: outranked in its sweep ...".
    why: String,
    /// SIGTERM sent after the grace period.
    terminated: bool,
}

/// How long a job stopped at convergence (or cut from its sweep) gets to end by itself after
/// SIGINT (Keras finishes its batch, writes its log) before SIGTERM.
pub const FINISH_GRACE: Duration = Duration::from_secs(30);

/// One governed job.
#[derive(Debug)]
pub struct JobEntry {
    pub name: String,
    pub source: JobSource,
    pub runtime: String,
    pub spec: JobSpec,
    tracker: SignalTracker,
    /// Total epochs declared for the run.
    epochs: Option<f64>,
    adopted_at: Instant,
    /// The same on the daemon's clock (seconds since it started).
    adopted_secs: f64,
    records: u64,
    /// When its latest record arrived (the GPU governor's pace measurement).
    last_record_at: Option<Instant>,
    last_value: Option<f64>,
    /// Recent (time, value) pairs for the growth figure shown in status.
    history: VecDeque<(Instant, f64)>,
    first_value: Option<f64>,
    log_file: Option<String>,
    log_problem: Option<String>,
    cpu_prev: Option<(Instant, f64)>,
    cpu_cores: Option<f64>,
    cpu_seconds: Option<f64>,
    usage: Option<CgroupUsage>,
    allocation: Option<Allocation>,
    /// The actuator holds written values for this job (released when the policy lets go).
    touched: bool,
    /// The allocation last handed to the actuator without error, while nothing new (usage)
    /// needs it to run again; `None`: the next round applies.
    applied: Option<(CpuAllocation, MemoryAllocation)>,
    /// The policy asks for this job to be moved to another node (SpeCon), and why; reported to
    /// the coordinator.
    migration_request: Option<String>,
    /// The last application failed (logged once per failing spell: decisions come every second).
    apply_failing: bool,
    /// Time to quality so far, on the daemon's clock (seconds since it started).
    quality: QualityTracker,
    /// `quality` follows the validation loss (else the progress signal).
    quality_from_validation: bool,
    /// Finish at convergence (opt-in): the rule's state, and the stop under way (also for a
    /// trial cut from its sweep).
    finish: Option<EarlyStop>,
    finishing: Option<Finishing>,
    /// The sweep it is a trial of.
    sweep: Option<String>,
    /// The rung (epochs) it waits at for its sweep's other trials.
    waiting_at_rung: Option<f64>,
    /// Served after the others, as the policy was last told ([`NodePolicy::hold`]): it waits at
    /// its sweep's rung, or it is being stopped (its work is done; only its exit is awaited).
    held: bool,
}

/// Signal every process of a job's cgroup (finish at convergence); a failure is logged, never
/// fatal.
fn signal_group(actuator: &Actuator, cgroup: &JobCgroup, signal: Signal, name: &str) {
    match actuator.fs().signal_job_group(cgroup, signal) {
        Ok(n) => debug!(job = %name, ?signal, processes = n, "signalled the job"),
        Err(e) => warn!(job = %name, ?signal, error = %e, "cannot signal the job"),
    }
}

/// Feed a job's quality value to its finish rule; once it has converged, stop the job
/// (SIGINT to its cgroup, SIGTERM after [`FINISH_GRACE`]).
fn finish_on_quality(
    entry: &mut JobEntry,
    actuator: &Actuator,
    cgroup: &JobCgroup,
    now: Instant,
    value: f64,
) {
    if let Some(stop) = entry.finish.as_mut()
        && stop.observe(value)
        && entry.finishing.is_none()
    {
        let best = stop.best().unwrap_or(value);
        info!(job = %entry.name, best_loss = best, "converged: stopping the job as it asked (SIGINT; SIGTERM after {}s)", FINISH_GRACE.as_secs());
        entry.finishing = Some(Finishing {
            at: now,
            why: format!("stopped: converged (best loss {best:.6})"),
            terminated: false,
        });
        signal_group(actuator, cgroup, Signal::SIGINT, &entry.name);
    }
}

/// A trial logged a loss with `epochs` done: hand it to its sweep, whose verdicts (this trial
/// or others cut at a rung) are returned for [`NodeCore::cut_trials`].
fn sweep_on_quality(
    sweeps: &mut Sweeps<JobCgroup>,
    entry: &JobEntry,
    cgroup: &JobCgroup,
    epochs: Option<f64>,
    loss: f64,
    cuts: &mut Vec<Outranked<JobCgroup>>,
) {
    if let (Some(_), Some(done)) = (&entry.sweep, epochs) {
        cuts.extend(sweeps.observe(cgroup, done, loss));
    }
}

/// Where CPU usage comes from (eBPF maps or cgroup files).
pub trait CpuSource {
    /// `ebpf`, `cpu.stat` or `cpuacct`.
    fn name(&self) -> String;
    /// Why the preferred source is not in use, if it is not.
    fn note(&self) -> Option<String> {
        None
    }
    /// Cumulative CPU seconds of each group (None where unreadable, or where the group's own
    /// cgroupfs counters, which the daemon reads anyway, are the source).
    fn cpu_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>>;
    /// Cumulative seconds each group's tasks waited for a CPU, where this source measures it
    /// (eBPF run-queue wait); `None` leaves it to the group's cgroupfs figures.
    fn wait_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>> {
        vec![None; groups.len()]
    }
}

/// Outcome of one decision round, for logs and benchmarks.
#[derive(Debug, Default, Clone, Copy)]
pub struct RoundStats {
    pub jobs: usize,
    /// Jobs handed to the actuator (changed allocation, or usage sampled since the last round).
    pub applied: usize,
    pub files_written: usize,
    pub errors: usize,
    /// What the round cost: the policy's plan and the actuator's writes.
    pub took: Duration,
}

/// Static settings of the core.
#[derive(Clone, Debug)]
pub struct CoreSettings {
    pub node_name: String,
    pub resources: NodeResources,
    pub dry_run: bool,
    /// Pass the policy's memory proposals to the actuator (off: CPU only).
    pub govern_memory: bool,
}

/// The job table, the policy and the actuator.
pub struct NodeCore {
    settings: CoreSettings,
    policy: Box<dyn NodePolicy>,
    actuator: Actuator,
    epoch: Instant,
    jobs: BTreeMap<JobCgroup, JobEntry>,
    next_decision_at: Option<Instant>,
    /// When the last decision ran and how long it took (see [`Self::on_progress_moved`]).
    last_decision: Option<(Instant, Duration)>,
    cpu_source: String,
    cpu_source_note: Option<String>,
    coordinator: Option<String>,
    last_plan: Plan,
    /// The daemon's counters and histograms (`/metrics`).
    metrics: crate::metrics::DaemonMetrics,
    /// The sweeps whose trials run here (opt-in, `run-job --sweep`).
    sweeps: Sweeps<JobCgroup>,
}

const GROWTH_WINDOW: Duration = Duration::from_secs(60);

/// Nodes with more jobs than this are "large": their periodic work is paced to a CPU budget.
/// Below it, work is cheap on real hardware (tens of microseconds a decision) and reaction time
/// comes first; only emulated machines (the TCG test VM, where a 3-job decision with its cgroup
/// writes takes ~5 ms) would otherwise be slowed down by the budget.
pub const LARGE_NODE_JOBS: usize = 64;

/// Share of one core that decisions (triggered by log records or by the policy's own timer) may
/// use on a large node (see [`NodeCore::on_progress_moved`]).
pub const DECISION_BUDGET: f64 = 0.005;

/// The decision budget for a node with `jobs` jobs: [`DECISION_BUDGET`] on large nodes, 2% of a
/// core on small ones.
pub fn decision_budget(jobs: usize) -> f64 {
    if jobs > LARGE_NODE_JOBS {
        DECISION_BUDGET
    } else {
        0.02
    }
}

impl NodeCore {
    /// A core with an already-recovered actuator.
    pub fn new(
        settings: CoreSettings,
        policy: Box<dyn NodePolicy>,
        actuator: Actuator,
        now: Instant,
    ) -> NodeCore {
        NodeCore {
            settings,
            policy,
            actuator,
            epoch: now,
            jobs: BTreeMap::new(),
            next_decision_at: None,
            last_decision: None,
            cpu_source: "cpu.stat".into(),
            cpu_source_note: None,
            coordinator: None,
            last_plan: Plan::default(),
            metrics: crate::metrics::DaemonMetrics::default(),
            sweeps: Sweeps::default(),
        }
    }

    /// The daemon's counters and histograms (cheap to clone: they share their values).
    pub fn metrics(&self) -> crate::metrics::DaemonMetrics {
        self.metrics.clone()
    }

    fn secs(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.epoch).as_secs_f64()
    }

    fn at(&self, secs: f64) -> Instant {
        self.epoch + Duration::from_secs_f64(secs.max(0.0))
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Replace the policy (SIGHUP with a new policy): every job is re-announced to it.
    pub fn set_policy(&mut self, policy: Box<dyn NodePolicy>, now: Instant) {
        self.policy = policy;
        let t = self.secs(now);
        for entry in self.jobs.values_mut() {
            self.policy.job_added(t, &entry.spec);
            // The old policy's requests to move jobs are withdrawn with it.
            if entry.migration_request.take().is_some() {
                info!(job = %entry.name, "the policy changed: its request to move this job is withdrawn");
            }
        }
        self.next_decision_at = Some(now);
    }

    /// Update the capacity the policy divides.
    pub fn set_resources(&mut self, resources: NodeResources) {
        self.settings.resources = resources;
    }

    /// Record which CPU source is in use (for status).
    pub fn set_cpu_source(&mut self, name: String, note: Option<String>) {
        self.cpu_source = name;
        self.cpu_source_note = note;
    }

    /// Record the coordinator connection state (for status).
    pub fn set_coordinator_state(&mut self, state: Option<String>) {
        self.coordinator = state;
    }

    /// The actuator (for job cgroup creation and usage reads).
    pub fn actuator(&self) -> &Actuator {
        &self.actuator
    }

    /// Governed jobs.
    /// Number of governed jobs.
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    pub fn jobs(&self) -> impl Iterator<Item = (&JobCgroup, &JobEntry)> {
        self.jobs.iter()
    }

    /// Whether a cgroup is governed.
    pub fn contains(&self, cgroup: &JobCgroup) -> bool {
        self.jobs.contains_key(cgroup)
    }

    /// The latest plan.
    pub fn last_plan(&self) -> &Plan {
        &self.last_plan
    }

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
            migration_request: None,
            apply_failing: false,
        };
        self.jobs.insert(job.cgroup, entry);
        self.next_decision_at = Some(now);
        true
    }

    /// Stop governing a job and restore every file the governor changed in its cgroup.
    pub fn remove_job(&mut self, now: Instant, cgroup: &JobCgroup, why: &str) -> Option<JobEntry> {
        let entry = self.jobs.remove(cgroup)?;
        info!(job = %entry.name, cgroup = %cgroup, reason = why, "job no longer governed");
        self.policy.job_removed(self.secs(now), &entry.spec.id);
        if !self.settings.dry_run {
            log_restore(&self.actuator.release(cgroup));
        }
        self.next_decision_at = Some(now);
        // A rung of its sweep that waited only for this trial is judged now.
        if entry.sweep.is_some() {
            let cuts = self.sweeps.leave(cgroup);
            self.cut_trials(now, cuts);
            self.sync_holds(now);
        }
        Some(entry)
    }

    /// Tell the policy which jobs to serve after the others, and which no longer: trials that
    /// wait at their sweep's rung for the others, and jobs being stopped (converged, or cut from
    /// their sweep: their work is done, they keep their floor until they exit).
    fn sync_holds(&mut self, now: Instant) {
        let t = self.secs(now);
        for (cgroup, entry) in &mut self.jobs {
            if entry.sweep.is_none() && entry.finish.is_none() {
                continue;
            }
            let at = self.sweeps.waiting_at(cgroup);
            let held = at.is_some() || entry.finishing.is_some();
            if held != entry.held {
                debug!(job = %entry.name, rung_epochs = ?at, stopping = entry.finishing.is_some(), held, "served after the others");
                self.policy.hold(t, &entry.spec.id, held);
                self.next_decision_at = Some(now);
            }
            entry.waiting_at_rung = at;
            entry.held = held;
        }
    }

    /// Stop the trials their sweep cut (SIGINT now, SIGTERM after [`FINISH_GRACE`]), as they
    /// asked by joining it. A trial already being stopped is left as it is.
    fn cut_trials(&mut self, now: Instant, cuts: Vec<Outranked<JobCgroup>>) {
        for cut in cuts {
            let Some(entry) = self.jobs.get_mut(&cut.trial) else {
                continue;
            };
            if entry.finishing.is_some() {
                continue;
            }
            let sweep = entry.sweep.clone().unwrap_or_default();
            info!(job = %entry.name, sweep = %sweep, rung_epochs = cut.rung_epochs, loss = cut.loss, place = cut.place, of = cut.of, kept = cut.kept, "outranked in its sweep: stopping the trial as it asked (SIGINT; SIGTERM after {}s)", FINISH_GRACE.as_secs());
            entry.finishing = Some(Finishing {
                at: now,
                why: format!("stopped: {}", cut.describe()),
                terminated: false,
            });
            signal_group(&self.actuator, &cut.trial, Signal::SIGINT, &entry.name);
        }
    }

    /// A record from one of a job's logs. Returns true when it moved the progress signal.
    pub fn on_record(&mut self, now: Instant, cgroup: &JobCgroup, record: &Record) -> bool {
        let mut cuts = Vec::new();
        let moved = self.on_record_inner(now, cgroup, record, &mut cuts);
        // Only a trial's record can move its sweep, and only a job with a finish rule or a
        // sweep can come to be stopped.
        if self
            .jobs
            .get(cgroup)
            .is_some_and(|e| e.sweep.is_some() || e.finish.is_some())
        {
            self.cut_trials(now, cuts);
            self.sync_holds(now);
        }
        moved
    }

    fn on_record_inner(
        &mut self,
        now: Instant,
        cgroup: &JobCgroup,
        record: &Record,
        cuts: &mut Vec<Outranked<JobCgroup>>,
    ) -> bool {
        let t = self.secs(now);
        let Some(entry) = self.jobs.get_mut(cgroup) else {
            return false;
        };
        let epochs = epochs_done(record);
        entry.records += 1;
        self.metrics.log_record(record.format.name());
        entry.last_record_at = Some(now);
        entry.log_file = Some(record.file.display().to_string());
        entry.log_problem = None;
        // The quality signal (validation loss): time to quality, and the policy's view of what
        // the job still learns.
        if let Some(v) = crate::progress::quality_value(record) {
            if !entry.quality_from_validation {
                entry.quality = QualityTracker::new(Direction::Minimise);
                entry.quality_from_validation = true;
                // The finish rule followed the training signal until now: start over on
                // validation (unless the stop is already under way).
                if let Some(stop) = entry.finish.as_mut()
                    && entry.finishing.is_none()
                {
                    *stop = EarlyStop::new(stop.rule(), Direction::Minimise);
                }
            }
            entry.quality.observe(t, v);
            finish_on_quality(entry, &self.actuator, cgroup, now, v);
            sweep_on_quality(&mut self.sweeps, entry, cgroup, epochs, v, cuts);
            self.policy.quality(
                t,
                &entry.spec.id,
                ProgressPoint {
                    at: t,
                    value: v,
                    new_segment: false,
                },
            );
        }
        match entry.tracker.observe(record) {
            SignalUpdate::Value { value, new_segment } => {
                if new_segment {
                    info!(job = %entry.name, file = %record.file.display(), "the log restarted its counters: new run segment");
                    entry.history.clear();
                    entry.first_value = None;
                }
                entry.first_value.get_or_insert(value);
                entry.last_value = Some(value);
                entry.history.push_back((now, value));
                while entry
                    .history
                    .front()
                    .is_some_and(|(t0, _)| now.saturating_duration_since(*t0) > GROWTH_WINDOW)
                {
                    entry.history.pop_front();
                }
                self.policy.progress(
                    t,
                    &entry.spec.id,
                    ProgressPoint {
                        at: t,
                        value,
                        new_segment,
                    },
                );
                if new_segment {
                    entry.quality = QualityTracker::new(entry.spec.direction);
                    entry.quality_from_validation = false;
                }
                if !entry.quality_from_validation {
                    if entry.quality.first().is_none() {
                        entry.quality = QualityTracker::new(entry.spec.direction);
                        if let Some(stop) = entry.finish.as_mut() {
                            *stop = EarlyStop::new(stop.rule(), entry.spec.direction);
                        }
                    }
                    entry.quality.observe(t, value);
                    // A job that logs no validation loss: its training signal is its quality.
                    finish_on_quality(entry, &self.actuator, cgroup, now, value);
                    // Its sweep compares losses: a signal that rises (accuracy) is not one.
                    if entry.spec.direction == Direction::Minimise {
                        sweep_on_quality(&mut self.sweeps, entry, cgroup, epochs, value, cuts);
                    }
                }
                if let Some(fraction) = work_fraction(record, entry.epochs) {
                    self.policy.work_done(t, &entry.spec.id, fraction);
                }
                self.policy.decides_on_progress()
            }
            SignalUpdate::NonFinite { value } => {
                if entry.tracker.non_finite() == 1 {
                    warn!(job = %entry.name, file = %record.file.display(), value, "the progress signal is not finite (NaN/inf): ignored, never used as progress (reported once)");
                }
                false
            }
            SignalUpdate::Absent => false,
        }
    }

    /// A problem with a job's logs (shown in status; the watcher logs it once).
    pub fn on_log_problem(&mut self, cgroup: &JobCgroup, message: String) {
        self.metrics.problem("log");
        if let Some(entry) = self.jobs.get_mut(cgroup) {
            entry.log_problem = Some(message);
        }
    }

    /// Sample every job's CPU and memory usage and hand it to the policy.
    pub fn sample(&mut self, now: Instant, cpu: &mut dyn CpuSource) {
        // Jobs stopped at convergence that did not end within the grace period: SIGTERM.
        for (cgroup, entry) in &mut self.jobs {
            if let Some(f) = entry.finishing.as_mut()
                && !f.terminated
                && now.saturating_duration_since(f.at) >= FINISH_GRACE
            {
                f.terminated = true;
                info!(job = %entry.name, "still running {}s after SIGINT: SIGTERM", FINISH_GRACE.as_secs());
                signal_group(&self.actuator, cgroup, Signal::SIGTERM, &entry.name);
            }
        }
        let t = self.secs(now);
        let groups: Vec<JobCgroup> = self.jobs.keys().cloned().collect();
        let cpu_seconds = cpu.cpu_seconds(&groups);
        let wait_seconds = cpu.wait_seconds(&groups);
        // `groups` are the table's keys in order: walk the table alongside (a lookup per job
        // compares paths component by component).
        for (((cgroup, entry), cpu_s), wait_s) in
            self.jobs.iter_mut().zip(cpu_seconds).zip(wait_seconds)
        {
            let usage = match self.actuator.usage(cgroup) {
                Ok(u) => Some(u),
                Err(e) if e.is_gone() => None,
                Err(e) => {
                    debug!(cgroup = %cgroup, error = %e, "usage unreadable");
                    None
                }
            };
            let cpu_s = cpu_s.or_else(|| {
                usage
                    .as_ref()
                    .and_then(|u| u.cpu_usage_usec)
                    .map(|us| us as f64 / 1e6)
            });
            if let Some(c) = cpu_s {
                if let Some((t0, c0)) = entry.cpu_prev {
                    let dt = now.saturating_duration_since(t0).as_secs_f64();
                    if dt > 0.0 {
                        entry.cpu_cores = Some(((c - c0) / dt).max(0.0));
                    }
                }
                entry.cpu_prev = Some((now, c));
                entry.cpu_seconds = Some(c);
            }
            let memory = usage.as_ref().and_then(|u| u.memory_current).unwrap_or(0);
            let pressure = usage
                .as_ref()
                .and_then(|u| u.memory_events.as_ref())
                .map(|e| e.high + e.max + e.oom)
                .unwrap_or(0);
            if let Some(c) = entry.cpu_seconds {
                self.policy.usage(
                    t,
                    &entry.spec.id,
                    Usage {
                        at: t,
                        cpu_seconds: c,
                        memory_bytes: memory,
                        memory_pressure_events: pressure,
                        cpu_wait_seconds: wait_s.or_else(|| {
                            usage
                                .as_ref()
                                .and_then(|u| u.cpu_wait_usec)
                                .map(|us| us as f64 / 1e6)
                        }),
                    },
                );
            }
            entry.usage = usage;
            // The memory guard must see the new usage: the next round applies this job.
            entry.applied = None;
        }
    }

    /// Whether the policy asked to be consulted by now.
    /// A job's progress signal moved: decide now, unless the last decision was so recent that
    /// deciding again would spend more than [`decision_budget`] of a core on decisions; then
    /// the decision is moved to when the budget allows (it sees every record that arrived in
    /// between). On a small node a decision takes tens of microseconds, so every record is
    /// acted on at once; with 1,000 jobs one takes ~3 ms and records arrive ~180 times a second,
    /// so they are batched every ~400 ms instead of costing 60% of a core.
    /// Returns the decision's figures when it decided now (`None`: batched, see
    /// [`Self::on_wakeup`]).
    pub fn on_progress_moved(&mut self, now: Instant) -> Option<RoundStats> {
        let budget = decision_budget(self.jobs.len());
        let earliest = self
            .last_decision
            .map(|(at, took)| at + took.mul_f64(1.0 / budget));
        match earliest {
            Some(t) if t > now => {
                self.next_decision_at = Some(self.next_decision_at.map_or(t, |n| n.min(t)));
                None
            }
            _ => Some(self.decide_and_apply(now)),
        }
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

    /// The control loop's wake-up at [`Self::next_wakeup`]: writes the actuator held back,
    /// then the decision when one is due (returning its figures).
    pub fn on_wakeup(&mut self, now: Instant) -> Option<RoundStats> {
        self.poll_actuator(now);
        self.decision_due(now).then(|| self.decide_and_apply(now))
    }

    pub fn decision_due(&self, now: Instant) -> bool {
        self.next_decision_at.is_some_and(|t| t <= now)
    }

    /// Ask the policy for a plan and apply it.
    ///
    /// Only jobs whose clamped allocation differs from the one last applied without error, or
    /// whose usage was sampled since, are handed to the actuator: a decision after one log
    /// record usually changes one job, and walking the actuator for the others cost ~1 µs per
    /// job (1,000 jobs: ~1 ms per record). Writes the actuator held back (rate limit, drift
    /// back-off) and periodic drift checks do not need this call: [`Self::poll_actuator`] runs
    /// them when [`Self::next_wakeup`] says they are due.
    pub fn decide_and_apply(&mut self, now: Instant) -> RoundStats {
        let started = Instant::now();
        let mut stats = self.decide_and_apply_inner(now);
        let took = started.elapsed();
        stats.took = took;
        self.metrics.decided(took);
        self.last_decision = Some((now, took));
        // The policy's own next decision time stays within the budget too (the governor policy
        // asks every second; with 1,000 jobs a decision takes ~2 ms).
        let earliest = now + took.mul_f64(1.0 / decision_budget(self.jobs.len()));
        if let Some(next) = self.next_decision_at.as_mut() {
            *next = (*next).max(earliest);
        }
        stats
    }

    fn decide_and_apply_inner(&mut self, now: Instant) -> RoundStats {
        let t = self.secs(now);
        let plan = self.policy.decide(t, &self.settings.resources);
        self.next_decision_at = plan.next_decision_at.map(|s| self.at(s));
        let mut stats = RoundStats {
            jobs: self.jobs.len(),
            ..Default::default()
        };
        // One pass over the job table. The plan is usually in the table's order (job ids are
        // the cgroup paths): each job's allocation is the plan's next one, else looked up.
        let mut in_order = plan.allocations.iter().peekable();
        for (cgroup, entry) in &mut self.jobs {
            let proposed = match in_order.next_if(|(id, _)| **id == entry.spec.id) {
                Some((_, a)) => a,
                None => match plan.allocations.get(&entry.spec.id) {
                    Some(a) => a,
                    None => continue,
                },
            };
            let mut cpu = proposed.cpu;
            let mut memory = proposed.memory;
            if self.settings.govern_memory {
                let usage = entry.usage.as_ref().and_then(|u| u.memory_current);
                memory = memory_proposal(proposed.category, memory, usage);
            }
            clamp_to_bounds(&mut cpu, &mut memory, &entry.spec);
            if !self.settings.govern_memory {
                // Memory files are not governed (the actuator would not write them anyway).
                memory = MemoryAllocation::default();
            }
            let changed = entry.allocation.as_ref().is_none_or(|a| {
                a.cpu != cpu || a.category != proposed.category || a.memory != memory
            });
            if changed {
                info!(
                    job = %entry.name,
                    category = %proposed.category,
                    weight = cpu.weight,
                    max_cores = ?cpu.max_cores,
                    memory_high = ?memory.high_bytes,
                    reason = %proposed.reason,
                    dry_run = self.settings.dry_run,
                    "decision"
                );
            }
            // The kernel default (weight 100, no cap, no memory limit) means "hands off": the
            // files keep whatever the kernel or the orchestrator set, and anything the governor
            // wrote earlier is put back. So `fair` never writes, and a job a policy lets go is
            // restored rather than pinned to weight 100.
            let hands_off = cpu == CpuAllocation::DEFAULT && memory == MemoryAllocation::default();
            if hands_off {
                if entry.touched && !self.settings.dry_run {
                    log_restore(&self.actuator.release(cgroup));
                }
                entry.touched = false;
                entry.applied = None;
            } else if !self.settings.dry_run && entry.applied != Some((cpu, memory)) {
                entry.touched = true;
                let alloc = Allocation {
                    category: proposed.category,
                    cpu,
                    memory,
                    reason: String::new(),
                };
                stats.applied += 1;
                let result = match &entry.usage {
                    Some(u) => self.actuator.apply_with_usage(cgroup, &alloc, u, now),
                    None => self.actuator.apply(cgroup, &alloc, now),
                };
                entry.applied = None;
                self.metrics.applied(&result);
                match result {
                    Ok(outcome) => {
                        stats.files_written += outcome.written.len();
                        stats.errors += outcome.errors.len();
                        if outcome.errors.is_empty() {
                            entry.applied = Some((cpu, memory));
                        }
                        if entry.apply_failing {
                            info!(job = %entry.name, "decisions apply again");
                            entry.apply_failing = false;
                        }
                    }
                    Err(e) => {
                        stats.errors += 1;
                        log_apply_error(&entry.name, cgroup, &e, &mut entry.apply_failing);
                    }
                }
            }
            // Keep the allocation shown in status; its reason is copied only when it changed.
            match &mut entry.allocation {
                Some(a) if !changed => {
                    if a.reason != proposed.reason {
                        a.reason.clone_from(&proposed.reason);
                    }
                }
                slot => {
                    *slot = Some(Allocation {
                        category: proposed.category,
                        cpu,
                        memory,
                        reason: proposed.reason.clone(),
                    })
                }
            }
        }
        // Migration requests are events (SpeCon asks once per job and then leaves the job
        // alone): a job keeps its request until it leaves the node or the policy is changed,
        // so the coordinator sees it in every report until it acts. Logged once.
        if !plan.migrations.is_empty() {
            let requested: std::collections::HashMap<&crate::policy::JobId, &str> = plan
                .migrations
                .iter()
                .map(|m| (&m.job, m.reason.as_str()))
                .collect();
            for entry in self.jobs.values_mut() {
                let Some(&reason) = requested.get(&entry.spec.id) else {
                    continue;
                };
                if entry.migration_request.as_deref() != Some(reason) {
                    if entry.migration_request.is_none() {
                        info!(job = %entry.name, reason, "the policy asks to move this job to another node");
                    }
                    entry.migration_request = Some(reason.to_owned());
                }
            }
        }
        self.last_plan = plan;
        stats
    }

    /// Apply writes the actuator held back (rate limits, drift back-off), if due.
    pub fn poll_actuator(&mut self, now: Instant) {
        if self.settings.dry_run {
            return;
        }
        for (cgroup, result) in self.actuator.poll(now) {
            self.metrics.applied(&result);
            if let Err(e) = result {
                let mut failing_elsewhere = false;
                let (name, failing) = match self.jobs.get_mut(&cgroup) {
                    Some(entry) => (entry.name.clone(), &mut entry.apply_failing),
                    None => (cgroup.to_string(), &mut failing_elsewhere),
                };
                log_apply_error(&name, &cgroup, &e, failing);
            }
        }
    }

    /// The earliest instant something is due (policy decision or held-back write).
    pub fn next_wakeup(&self) -> Option<Instant> {
        let actuator = if self.settings.dry_run {
            None
        } else {
            self.actuator.next_wakeup()
        };
        match (self.next_decision_at, actuator) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Restore everything and forget every job (shutdown).
    pub fn shutdown(&mut self) -> RestoreReport {
        let report = self.actuator.restore_all();
        log_restore(&report);
        self.jobs.clear();
        report
    }

    /// The status snapshot `governor status` shows.
    pub fn status(&self, now: Instant) -> NodeStatus {
        let kind = match self.actuator.fs().kind() {
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
            migration_request: self.migration_request.clone(),
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
        }
    }
}

/// How far along a job is, from the epoch its log reports and the total epochs the operator
/// declared. Logs count epochs differently: Keras' `CSVLogger` writes a 0-based epoch when the
/// epoch has ended (epoch 0 = one done); Hugging Face writes the fraction done (1.5 = one and a
/// half); the others write the epoch they are in or have just finished, 1-based, or 0-based on
/// rows written during the epoch (Lightning: epoch 1 rows start once epoch 0 is done). So the
/// number done is the epoch, plus one for Keras CSV.
fn work_fraction(record: &Record, total_epochs: Option<f64>) -> Option<f64> {
    let total = total_epochs.filter(|t| t.is_finite() && *t > 0.0)?;
    Some((epochs_done(record)? / total).min(1.0))
}

/// Epochs a record says are done (see [`work_fraction`] for how logs count them).
fn epochs_done(record: &Record) -> Option<f64> {
    let epoch = record.epoch.filter(|e| e.is_finite() && *e >= 0.0)?;
    Some(if record.format == Format::KerasCsv {
        epoch + 1.0
    } else {
        epoch
    })
}

/// The memory policy (with `govern_memory`): a job that is still learning keeps whatever memory
/// limits its orchestrator set; a job the policy sees as slowing down or converged is asked to
/// shrink to its current usage (`memory.high`), which reclaims its cold page cache for the jobs
/// that still learn. The actuator's memory guard turns "current usage" into usage plus headroom,
/// raises the limit as the job grows, and lifts it at once on any pressure event, so the
/// proposal can never get a job OOM-killed. A policy's own memory proposal takes precedence.
fn memory_proposal(
    category: Category,
    proposed: MemoryAllocation,
    usage: Option<u64>,
) -> MemoryAllocation {
    if proposed != MemoryAllocation::default() {
        return proposed;
    }
    match (category, usage) {
        (Category::Watching | Category::Converged, Some(bytes)) if bytes > 0 => MemoryAllocation {
            high_bytes: Some(bytes),
            max_bytes: None,
        },
        _ => MemoryAllocation::default(),
    }
}

/// Operator bounds override any policy: a cap never below `min_cores`, never above `max_cores`.
fn clamp_to_bounds(cpu: &mut CpuAllocation, memory: &mut MemoryAllocation, spec: &JobSpec) {
    let b = &spec.bounds;
    if let Some(max) = b.max_cores {
        cpu.max_cores = Some(cpu.max_cores.map_or(max, |c| c.min(max)));
    }
    if let (Some(min), Some(c)) = (b.min_cores, cpu.max_cores)
        && c < min
    {
        cpu.max_cores = Some(min);
    }
    if let Some(max) = b.max_memory_bytes {
        memory.max_bytes = Some(memory.max_bytes.map_or(max, |m| m.min(max)));
    }
    if let Some(min) = b.min_memory_bytes {
        for v in [&mut memory.high_bytes, &mut memory.max_bytes]
            .into_iter()
            .flatten()
        {
            *v = (*v).max(min);
        }
    }
}

/// A failed application: a warning the first time, then debug lines until it succeeds again.
fn log_apply_error(job: &str, cgroup: &JobCgroup, e: &CgroupError, failing: &mut bool) {
    if e.is_gone() {
        debug!(job, cgroup = %cgroup, "cgroup vanished while applying");
    } else if *failing {
        debug!(job, cgroup = %cgroup, error = %e, "cannot apply the decision, still");
    } else {
        warn!(job, cgroup = %cgroup, error = %e, "cannot apply the decision; will retry");
        *failing = true;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Bounds;

    fn alloc(max: Option<f64>) -> Allocation {
        let mut a = Allocation::unmanaged(Category::Progressing, "t");
        a.cpu.max_cores = max;
        a
    }

    #[test]
    fn work_fraction_counts_epochs_as_each_format_does() {
        let record = |format: Format, epoch: Option<f64>| Record {
            file: std::sync::Arc::from(std::path::Path::new("/l")),
            format,
            index: 0,
            observed_at: std::time::SystemTime::UNIX_EPOCH,
            epoch,
            step: None,
            split: Default::default(),
            metrics: Default::default(),
        };
        // Keras CSV: 0-based, written when the epoch ends.
        assert_eq!(
            work_fraction(&record(Format::KerasCsv, Some(0.0)), Some(4.0)),
            Some(0.25)
        );
        // Hugging Face: the fraction of epochs done.
        assert_eq!(
            work_fraction(&record(Format::HfConsole, Some(1.5)), Some(3.0)),
            Some(0.5)
        );
        // Never past the end, nothing without a total or an epoch, bad values ignored.
        assert_eq!(
            work_fraction(&record(Format::KerasCsv, Some(9.0)), Some(4.0)),
            Some(1.0)
        );
        assert_eq!(
            work_fraction(&record(Format::KerasCsv, Some(1.0)), None),
            None
        );
        assert_eq!(
            work_fraction(&record(Format::KerasCsv, None), Some(4.0)),
            None
        );
        assert_eq!(
            work_fraction(&record(Format::KerasCsv, Some(f64::NAN)), Some(4.0)),
            None
        );
        assert_eq!(
            work_fraction(&record(Format::KerasCsv, Some(1.0)), Some(0.0)),
            None
        );
    }

    #[test]
    fn memory_policy_shrinks_only_jobs_that_stopped_learning() {
        let mut a = alloc(None);
        assert_eq!(
            memory_proposal(a.category, a.memory, Some(500 << 20)),
            MemoryAllocation::default(),
            "a progressing job keeps its limits"
        );
        a.category = Category::Converged;
        assert_eq!(
            memory_proposal(a.category, a.memory, Some(500 << 20)).high_bytes,
            Some(500 << 20)
        );
        assert_eq!(
            memory_proposal(a.category, a.memory, None),
            MemoryAllocation::default(),
            "no usage reading: no proposal"
        );
        a.category = Category::Unknown;
        assert_eq!(
            memory_proposal(a.category, a.memory, Some(500 << 20)),
            MemoryAllocation::default(),
            "no progress seen yet: hands off"
        );
        a.category = Category::Watching;
        a.memory.max_bytes = Some(1 << 30);
        assert_eq!(
            memory_proposal(a.category, a.memory, Some(500 << 20)).max_bytes,
            Some(1 << 30),
            "the policy's own proposal wins"
        );
    }

    #[test]
    fn operator_bounds_override_the_policy() {
        let mut spec = JobSpec::new("j");
        spec.bounds = Bounds {
            min_cores: Some(1.0),
            max_cores: Some(3.0),
            min_memory_bytes: Some(100),
            max_memory_bytes: Some(1000),
        };
        let mut a = alloc(None);
        clamp_to_bounds(&mut a.cpu, &mut a.memory, &spec);
        assert_eq!(
            a.cpu.max_cores,
            Some(3.0),
            "no cap becomes the operator's max"
        );
        let mut a = alloc(Some(0.2));
        clamp_to_bounds(&mut a.cpu, &mut a.memory, &spec);
        assert_eq!(
            a.cpu.max_cores,
            Some(1.0),
            "a cap never goes below the operator's min"
        );
        let mut a = alloc(Some(2.0));
        a.memory.high_bytes = Some(50);
        clamp_to_bounds(&mut a.cpu, &mut a.memory, &spec);
        assert_eq!(a.cpu.max_cores, Some(2.0));
        assert_eq!(a.memory.high_bytes, Some(100));
        assert_eq!(a.memory.max_bytes, Some(1000));
    }

    use std::sync::{Arc, Mutex};

    use crate::cgroup::fake::FakeCgroupRoot;
    use crate::cgroup::{ActuatorConfig, Hierarchy};
    use crate::policy::JobId;

    /// Caps each job at the number of cores the test sets for it (none set: hands off).
    struct SetCaps(Arc<Mutex<BTreeMap<JobId, (f64, String)>>>);

    impl NodePolicy for SetCaps {
        fn name(&self) -> &'static str {
            "set-caps"
        }
        fn job_added(&mut self, _now: f64, _spec: &JobSpec) {}
        fn job_removed(&mut self, _now: f64, _id: &JobId) {}
        fn progress(&mut self, _now: f64, _id: &JobId, _point: ProgressPoint) {}
        fn usage(&mut self, _now: f64, _id: &JobId, _usage: Usage) {}
        /// A held job's reason says so (what the tests read back through the status).
        fn hold(&mut self, _now: f64, id: &JobId, held: bool) {
            if let Some((_, reason)) = self.0.lock().unwrap().get_mut(id) {
                let base = reason.trim_end_matches(" (held)").to_owned();
                *reason = if held { format!("{base} (held)") } else { base };
            }
        }
        fn decide(&mut self, _now: f64, _node: &NodeResources) -> Plan {
            let caps = self.0.lock().unwrap();
            Plan {
                allocations: caps
                    .iter()
                    .map(|(id, (cores, reason))| {
                        let mut a = Allocation::unmanaged(Category::Progressing, reason.clone());
                        a.cpu.max_cores = Some(*cores);
                        (id.clone(), a)
                    })
                    .collect(),
                ..Plan::default()
            }
        }
    }

    struct Bed {
        _dir: tempfile::TempDir,
        fake: FakeCgroupRoot,
        core: NodeCore,
        caps: Arc<Mutex<BTreeMap<JobId, (f64, String)>>>,
        now: Instant,
        id: fn(&str) -> JobId,
    }

    const JOBS: [&str; 3] = ["a", "b", "c"];

    fn id(job: &str) -> JobId {
        JobId(format!("/jobs/{job}"))
    }

    /// Three jobs `a`, `b`, `c` in a fake v2 root, each capped at 1 core and applied once.
    fn bed() -> Bed {
        bed_with(id)
    }

    /// [`bed`] with the policy's job ids made by `id`.
    fn bed_with(id: fn(&str) -> JobId) -> Bed {
        bed_full(id, None, None)
    }

    /// [`bed_with`], every job a trial of `sweep` (declared 20 epochs) if given.
    fn bed_full(
        id: fn(&str) -> JobId,
        sweep: Option<SweepTrial>,
        finish: Option<FinishRule>,
    ) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cgroup");
        std::fs::create_dir(&root).unwrap();
        let fake = FakeCgroupRoot::unified(&root);
        let actuator = Actuator::new(
            Hierarchy::detect(&root).unwrap(),
            ActuatorConfig {
                state_file: dir.path().join("state.json"),
                cpu_min_write_interval_ms: 0,
                ..ActuatorConfig::default()
            },
        )
        .unwrap();
        let caps = Arc::new(Mutex::new(BTreeMap::new()));
        let settings = CoreSettings {
            node_name: "test".into(),
            resources: NodeResources {
                cores: 8.0,
                memory_bytes: 1 << 34,
            },
            dry_run: false,
            govern_memory: false,
        };
        let now = Instant::now();
        let mut core = NodeCore::new(settings, Box::new(SetCaps(caps.clone())), actuator, now);
        for job in JOBS {
            fake.add_group(&format!("jobs/{job}"));
            let cgroup = JobCgroup::new(format!("jobs/{job}")).unwrap();
            caps.lock().unwrap().insert(id(job), (1.0, "start".into()));
            assert!(core.add_job(
                now,
                NewJob {
                    spec: JobSpec::new(id(job).0),
                    cgroup,
                    name: job.into(),
                    source: JobSource::Declared(format!("/{job}.toml").into()),
                    runtime: "test".into(),
                    signal: SignalConfig::default(),
                    epochs: sweep.as_ref().map(|_| 20.0),
                    finish,
                    sweep: sweep.clone(),
                },
            ));
        }
        let mut bed = Bed {
            _dir: dir,
            fake,
            core,
            caps,
            now,
            id,
        };
        let stats = bed.round();
        assert_eq!((stats.applied, stats.files_written), (3, 3), "{stats:?}");
        bed
    }

    impl Bed {
        fn round(&mut self) -> RoundStats {
            self.now += Duration::from_millis(10);
            self.core.decide_and_apply(self.now)
        }
        fn set_cap(&self, job: &str, cores: f64, reason: &str) {
            self.caps
                .lock()
                .unwrap()
                .insert((self.id)(job), (cores, reason.into()));
        }
        fn cpu_max(&self, job: &str) -> String {
            self.fake
                .get(&format!("jobs/{job}"), "cpu.max")
                .trim()
                .to_owned()
        }
    }

    struct NoCpuSource;

    impl CpuSource for NoCpuSource {
        fn name(&self) -> String {
            "none".into()
        }
        fn cpu_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>> {
            vec![None; groups.len()]
        }
    }

    #[test]
    fn progress_right_after_a_decision_is_batched_within_the_cpu_budget() {
        let mut bed = bed();
        let (at, took) = bed.core.last_decision.expect("the bed decided once");
        bed.set_cap("a", 2.0, "a learns");
        // At the same instant: deciding again would exceed the budget, so it is deferred...
        bed.core.on_progress_moved(at);
        assert_eq!(bed.cpu_max("a"), "100000 100000", "not applied yet");
        let due = at + took.mul_f64(1.0 / decision_budget(bed.core.job_count()));
        assert!(bed.core.next_wakeup().is_some_and(|w| w <= due));
        assert!(bed.core.decision_due(due));
        // ...and made once the budget allows, with everything that arrived meanwhile.
        bed.core.decide_and_apply(due);
        assert_eq!(bed.cpu_max("a"), "200000 100000");
        // Long after the last decision, progress is acted on at once.
        bed.set_cap("b", 3.0, "b learns");
        bed.core.on_progress_moved(due + Duration::from_secs(1));
        assert_eq!(bed.cpu_max("b"), "300000 100000");
    }

    /// A Keras CSVLogger row: `epoch`, its validation loss, a training loss twice that.
    fn keras_record(epoch: f64, val_loss: f64) -> Record {
        Record {
            file: std::sync::Arc::from(std::path::Path::new("/l")),
            format: Format::KerasCsv,
            index: 0,
            observed_at: std::time::SystemTime::UNIX_EPOCH,
            epoch: Some(epoch),
            step: None,
            split: Default::default(),
            metrics: [
                (std::sync::Arc::from("loss"), val_loss * 2.0),
                (std::sync::Arc::from("val_loss"), val_loss),
            ]
            .into_iter()
            .collect(),
        }
    }

    /// A job stopped at convergence is served after the others until it exits.
    #[test]
    fn a_job_stopped_at_convergence_is_served_last_until_it_exits() {
        let mut bed = bed_full(
            id,
            None,
            Some(FinishRule {
                patience: 2,
                min_delta: 0.01,
            }),
        );
        let a = JobCgroup::new("jobs/a").unwrap();
        let now = bed.now;
        let held = |bed: &mut Bed, job: &str| {
            bed.round();
            let status = bed.core.status(bed.now);
            let j = status.jobs.into_iter().find(|j| j.name == job).unwrap();
            (j.finish.is_some(), j.decision.contains("(held)"))
        };
        bed.core.on_record(now, &a, &keras_record(0.0, 1.0));
        bed.core.on_record(now, &a, &keras_record(1.0, 0.5));
        assert_eq!(held(&mut bed, "a"), (false, false), "still learning");
        bed.core.on_record(now, &a, &keras_record(2.0, 0.5));
        bed.core.on_record(now, &a, &keras_record(3.0, 0.5));
        assert_eq!(
            held(&mut bed, "a"),
            (true, true),
            "converged: stopped, served last"
        );
        assert_eq!(held(&mut bed, "b"), (false, false));
    }

    #[test]
    fn a_sweep_stops_the_trials_it_cuts_and_says_why() {
        let rule = crate::policy::sweep::HalvingRule {
            eta: 3,
            first_rung: 2.0,
        };
        let mut bed = bed_full(
            id,
            Some(SweepTrial {
                sweep: "lr".into(),
                rule,
            }),
            None,
        );
        let record = keras_record;
        let cgroup = |job: &str| JobCgroup::new(format!("jobs/{job}")).unwrap();
        let now = bed.now;
        // Keras epoch 1 = two done: the first rung. c and a get there; b, the best, last.
        bed.core.on_record(now, &cgroup("c"), &record(0.0, 0.9));
        bed.core.on_record(now, &cgroup("c"), &record(1.0, 0.5));
        bed.core.on_record(now, &cgroup("a"), &record(1.0, 0.3));
        let status_of =
            |core: &NodeCore, job: &str| core.status(now).jobs.into_iter().find(|j| j.name == job);
        let finish = |core: &NodeCore, job: &str| status_of(core, job).and_then(|j| j.finish);
        let sweep_of = |core: &NodeCore, job: &str| status_of(core, job).and_then(|j| j.sweep);
        let held = |bed: &mut Bed, job: &str| {
            bed.round();
            status_of(&bed.core, job).is_some_and(|j| j.decision.contains("(held)"))
        };
        assert_eq!(
            finish(&bed.core, "c"),
            None,
            "judged only once all are there"
        );
        assert_eq!(
            sweep_of(&bed.core, "c").as_deref(),
            Some("lr (at its 2-epoch rung: waits for the other trials)")
        );
        assert!(held(&mut bed, "c"), "served after the trials on their way");
        assert!(!held(&mut bed, "b"));
        bed.core.on_record(now, &cgroup("b"), &record(1.0, 0.1));
        let c = finish(&bed.core, "c").expect("c is cut");
        assert!(
            c.starts_with("stopped: outranked in its sweep at 2 epochs: loss 0.500000, 3 of 3"),
            "{c}"
        );
        assert!(finish(&bed.core, "a").is_some(), "a is cut too");
        assert_eq!(finish(&bed.core, "b"), None, "the best goes on");
        assert_eq!(sweep_of(&bed.core, "b").as_deref(), Some("lr"));
        // The cut trials stay served last until they exit; the best one is served as before.
        assert!(held(&mut bed, "c") && held(&mut bed, "a"), "being stopped");
        assert!(!held(&mut bed, "b"));
        // The cut trials end; b runs on alone to its end (no rung at 20 epochs).
        bed.core.remove_job(now, &cgroup("a"), "exited");
        bed.core.remove_job(now, &cgroup("c"), "exited");
        bed.core.on_record(now, &cgroup("b"), &record(19.0, 0.01));
        assert_eq!(finish(&bed.core, "b"), None);
    }

    #[test]
    fn a_round_hands_only_changed_allocations_to_the_actuator() {
        let mut bed = bed();
        let stats = bed.round();
        assert_eq!(
            (stats.applied, stats.files_written),
            (0, 0),
            "nothing changed: {stats:?}"
        );
        bed.set_cap("b", 2.5, "b sped up");
        let stats = bed.round();
        assert_eq!(
            (stats.applied, stats.files_written, stats.errors),
            (1, 1, 0),
            "only b changed: {stats:?}"
        );
        assert_eq!(bed.cpu_max("b"), "250000 100000");
        assert_eq!(bed.cpu_max("a"), "100000 100000");
        // A new reason alone writes nothing but is what status shows.
        bed.set_cap("a", 1.0, "a: same cap, new reason");
        let stats = bed.round();
        assert_eq!(stats.applied, 0, "{stats:?}");
        let status = bed.core.status(bed.now);
        let a = status.jobs.iter().find(|j| j.name == "a").unwrap();
        assert_eq!(a.decision, "a: same cap, new reason");
    }

    #[test]
    fn each_job_gets_its_own_allocation_whatever_the_order_of_the_ids() {
        // Ids in the reverse order of the cgroups: the plan cannot be walked in table order.
        let mut bed = bed_with(|job| JobId(format!("id-{}", (b'z' - job.as_bytes()[0]) as char)));
        bed.set_cap("a", 1.5, "a");
        bed.set_cap("b", 2.5, "b");
        bed.set_cap("c", 3.5, "c");
        let stats = bed.round();
        assert_eq!((stats.applied, stats.files_written), (3, 3), "{stats:?}");
        assert_eq!(bed.cpu_max("a"), "150000 100000");
        assert_eq!(bed.cpu_max("b"), "250000 100000");
        assert_eq!(bed.cpu_max("c"), "350000 100000");
    }

    #[test]
    fn sampled_usage_makes_the_next_round_apply_every_job() {
        let mut bed = bed();
        bed.core.sample(bed.now, &mut NoCpuSource);
        let stats = bed.round();
        assert_eq!(
            (stats.applied, stats.files_written),
            (3, 0),
            "the actuator (memory guard) sees each job's new usage: {stats:?}"
        );
        assert_eq!(bed.round().applied, 0, "and only once");
    }

    #[test]
    fn a_failed_apply_is_retried_on_every_round_until_it_succeeds() {
        let mut bed = bed();
        // c's cgroup disappears (its container is being recreated under the same name).
        bed.fake.remove_group("jobs/c");
        bed.set_cap("c", 3.0, "c sped up");
        let stats = bed.round();
        assert_eq!(
            (stats.applied, stats.files_written, stats.errors),
            (1, 0, 1),
            "{stats:?}"
        );
        let stats = bed.round();
        assert_eq!(
            (stats.applied, stats.errors),
            (1, 1),
            "the failed job is tried again: {stats:?}"
        );
        bed.fake.add_group("jobs/c");
        let stats = bed.round();
        assert_eq!(
            (stats.applied, stats.files_written, stats.errors),
            (1, 1, 0),
            "{stats:?}"
        );
        assert_eq!(bed.cpu_max("c"), "300000 100000");
        assert_eq!(bed.round().applied, 0, "applied: nothing left to do");
    }

    #[test]
    fn a_job_the_policy_lets_go_is_restored_and_applied_again_when_capped_again() {
        let mut bed = bed();
        // Hands off for `a` (weight 100, no cap): its original is put back.
        let mut hands_off = SetCaps(bed.caps.clone()).decide(0.0, &bed.core.settings.resources);
        hands_off.allocations.insert(
            id("a"),
            Allocation::unmanaged(Category::Converged, "let go"),
        );
        bed.core.policy = Box::new(FixedPlan(hands_off));
        let stats = bed.round();
        assert_eq!(stats.applied, 0, "{stats:?}");
        assert_eq!(bed.cpu_max("a"), "max 100000", "a's original is restored");
        bed.core.policy = Box::new(SetCaps(bed.caps.clone()));
        bed.set_cap("a", 1.0, "capped again");
        let stats = bed.round();
        assert_eq!((stats.applied, stats.files_written), (1, 1), "{stats:?}");
        assert_eq!(bed.cpu_max("a"), "100000 100000");
    }

    #[test]
    fn a_migration_request_stays_in_status_until_the_policy_is_changed() {
        let mut bed = bed();
        let mut asking = Plan::default();
        asking.migrations.push(crate::policy::MigrationRequest {
            job: id("b"),
            reason: "converged while others progress".into(),
        });
        bed.core.policy = Box::new(FixedPlan(asking));
        bed.round();
        let requests = |bed: &Bed| -> Vec<(String, Option<String>)> {
            bed.core
                .status(bed.now)
                .jobs
                .into_iter()
                .map(|j| (j.name, j.migration_request))
                .collect()
        };
        let asked = [
            ("a".to_owned(), None),
            (
                "b".to_owned(),
                Some("converged while others progress".to_owned()),
            ),
            ("c".to_owned(), None),
        ];
        assert_eq!(requests(&bed), asked);
        // SpeCon asks once: later plans without the request keep it.
        bed.core.policy = Box::new(FixedPlan(Plan::default()));
        bed.round();
        assert_eq!(requests(&bed), asked, "kept until acted on");
        bed.core
            .set_policy(Box::new(FixedPlan(Plan::default())), bed.now);
        bed.round();
        assert!(requests(&bed).iter().all(|(_, r)| r.is_none()));
    }

    /// Returns the same plan every time.
    struct FixedPlan(Plan);

    impl NodePolicy for FixedPlan {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn job_added(&mut self, _now: f64, _spec: &JobSpec) {}
        fn job_removed(&mut self, _now: f64, _id: &JobId) {}
        fn progress(&mut self, _now: f64, _id: &JobId, _point: ProgressPoint) {}
        fn usage(&mut self, _now: f64, _id: &JobId, _usage: Usage) {}
        fn decide(&mut self, _now: f64, _node: &NodeResources) -> Plan {
            self.0.clone()
        }
    }
}
