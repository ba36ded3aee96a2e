//! The daemon's decision core: a job table and the node policy. [`NodeCore`] decides and acts
//! on nothing itself: every cgroup write, restore and signal it wants is an [`Effect`] it
//! returns, and the readings it decides on (usage, CPU time) are handed in. The shell
//! ([`CoreShell`]) carries the effects out against the [`Actuator`] and hands the outcomes back.
//! So every decision is tested by the effects it returns (`node_core/effects_tests.rs`), with
//! no processes or files; the daemon's control loop ([`super::run`]), tests against a fake
//! cgroup root and benchmarks drive the shell with their own clock.
//!
//! Path of a log line to a cgroup write: the watcher delivers a [`Record`] →
//! [`NodeCore::on_record`] turns it into the job's progress signal (SignalTracker) and hands a
//! [`ProgressPoint`] to the policy → [`NodeCore::decide`] asks the policy for a [`Plan`] and
//! returns each job's [`Allocation`] as an [`Effect::ApplyLimits`] → [`CoreShell`] applies it
//! through the [`Actuator`] (which skips unchanged writes, rate-limits, guards memory and records
//! originals for restore).
//!
//! [`Actuator`]: crate::cgroup::Actuator
//! [`Record`]: crate::progress::Record
//! [`ProgressPoint`]: crate::policy::ProgressPoint

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::info;

use crate::cgroup::{CgroupUsage, HierarchyKind, JobCgroup};
use crate::policy::quality::{EarlyStop, FinishRule, QualityTracker};
use crate::policy::sweep::{SweepTrial, Sweeps};
use crate::policy::{
    Allocation, CpuAllocation, JobSpec, MemoryAllocation, NodePolicy, NodeResources, Plan,
};
use crate::progress::{SignalConfig, SignalTracker};

mod decision;
mod effects;
mod records;
mod sampling;
mod shell;
mod status;
mod stop;
mod table;

pub use effects::Effect;
pub use shell::CoreShell;

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
    /// Epochs done, as its latest record with an epoch says.
    epochs_done: Option<f64>,
    /// How long its epochs take, from its records' arrival.
    epoch_timer: records::EpochTimer,
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
    move_request: Option<String>,
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
    /// its sweep's rung (and is not being stopped).
    held: bool,
}

/// What reads each group's CPU usage for a round (eBPF maps or cgroup files; which of them is
/// [`crate::accounting::CpuSource`]).
pub trait CpuSampler {
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

/// The job table and the policy: decides, and returns what is to be done as [`Effect`]s.
pub struct NodeCore {
    settings: CoreSettings,
    policy: Box<dyn NodePolicy>,
    /// The cgroup hierarchy the shell writes to (shown in status).
    hierarchy: HierarchyKind,
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
    /// A core with no jobs, for a node whose cgroup hierarchy is `hierarchy`.
    pub fn new(
        settings: CoreSettings,
        policy: Box<dyn NodePolicy>,
        hierarchy: HierarchyKind,
        now: Instant,
    ) -> NodeCore {
        NodeCore {
            settings,
            policy,
            hierarchy,
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
            if entry.move_request.take().is_some() {
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

    /// Number of governed jobs.
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// Governed jobs.
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
}

#[cfg(test)]
#[path = "node_core_tests.rs"]
mod tests;
