//! The single-node simulator: jobs from a [`JobModel`] list share one node's cores under a real
//! [`NodePolicy`], driven exactly as the daemon drives it. It is the cluster simulator's engine
//! with one worker ([`run_node`]); this module holds its configuration and results.
//!
//! The engine is event-driven on a simulated clock. Between events every job runs at the speed its
//! share of the node gives it; shares follow [`governor_policy::share::water_fill`], the same
//! cgroup v2 model `governor status` uses (weights work-conserving, `cpu.max` a hard cap, demand =
//! the job's parallelism). Events, in the order they are handled when they coincide:
//! 1. a job finishes its work: `job_removed` (its undelivered log lines are dropped);
//! 2. a job writes a log line (every [`LogEvery`] of work or of time): the line is delivered to the
//!    policy `progress_delay` later, as the daemon's inotify tailer would;
//! 3. a job arrives: `job_added` (a quiet phase starts or ends: its demand changes);
//! 4. a log line is delivered: `progress` (and `work_done` when the line carries "k/N"); a job
//!    whose finish rule or sweep says so is stopped (`job_removed`), and a trial at a rung
//!    waiting for the others is held (`hold`);
//! 5. the usage sampler fires (every `usage_interval`, 1 s like the daemon): `usage` for every job;
//! 6. the policy's `next_decision_at` is reached.
//!
//! After any of these the policy's `decide` runs and its plan takes effect immediately (the
//! daemon's cgroup writes take microseconds). Log noise comes from one seeded RNG stream per job,
//! so every policy sees the same noise for the same log line.

use governor_policy::{MoveRequest, NodePolicy};
use serde::{Deserialize, Serialize};

use crate::job::JobModel;

/// The simulated node and the daemon's observation delays.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeConfig {
    /// CPU cores shared by the jobs.
    pub cores: f64,
    /// Memory shared by the jobs, bytes (passed to the policy; not simulated yet).
    pub memory_bytes: u64,
    /// Seconds between usage samples (the daemon samples every second).
    pub usage_interval: f64,
    /// Seconds between a log write and the policy seeing it (inotify wake-up + parse).
    pub progress_delay: f64,
    /// Give up after this much simulated time (jobs still running have no finish time).
    pub horizon: f64,
    /// Record every job's cores over time in the result.
    pub record_timeline: bool,
    /// Record every decision's allocations (with the policy's reasons) in the result.
    pub record_decisions: bool,
    /// How much of the weights' order the kernel delivers, in [0, 1]: each job gets this
    /// fraction of its weighted share plus the rest of its equal (fair) share (caps are always
    /// exact). 1: the kernel follows the weights exactly (the default). Measured on this
    /// machine's cgroup v1 controller with TensorFlow jobs: about 0.35 (`cargo xtask
    /// bench-real` fits it from the daemon's own status: jobs held at their floor still got most
    /// of an equal share, because the jobs served first leave gaps whenever their threads wait
    /// on one another, and CFS hands the gaps to whoever is runnable).
    pub enforcement: f64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            cores: 4.0,
            memory_bytes: 16 << 30,
            usage_interval: 1.0,
            progress_delay: 0.2,
            horizon: 30.0 * 24.0 * 3600.0,
            record_timeline: false,
            record_decisions: false,
            enforcement: 1.0,
        }
    }
}

/// One job's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub id: String,
    pub submit: f64,
    /// Completion time (None: still running at the horizon).
    pub finish: Option<f64>,
    /// `finish - submit`.
    pub jct: Option<f64>,
    /// The job's work, seconds on one core.
    pub work: f64,
    pub parallelism: f64,
    /// Seconds the job would take alone on this node.
    pub alone: f64,
    /// CPU-seconds the job consumed.
    pub cpu_seconds: f64,
    /// When the policy first asked for the job to be moved, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub move_requested_at: Option<f64>,
    /// Time to quality, seconds from submission: when the job's log first showed a loss within
    /// 5% of its total reduction (first logged value to best), noiseless
    /// ([`governor_policy::quality::time_to_quality`], the definition bench-real uses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttq: Option<f64>,
    /// The best (lowest) loss its log showed, noiseless: what a job stopped at convergence
    /// gave up is this against the same job run to its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_loss: Option<f64>,
    /// Why it was stopped before its work was done, as the daemon says it: "converged"
    /// ([`JobModel::finish`]) or "outranked in its sweep at 5 epochs: ..." ([`JobModel::sweep`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// `(time, cores)` each time the job's share changed (only with `record_timeline`).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub timeline: Vec<(f64, f64)>,
}

/// The outcome of one simulation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRun {
    pub policy: String,
    pub jobs: Vec<JobResult>,
    /// Mean JCT over finished jobs.
    pub avg_jct: f64,
    /// Mean time to quality over the jobs that logged a loss.
    #[serde(default)]
    pub avg_ttq: f64,
    /// Last finish minus first submit.
    pub makespan: f64,
    /// Core-seconds left idle while some job could have used them, over the makespan.
    pub idle_core_seconds: f64,
    /// [`makespan_lower_bound`] of the workload.
    pub makespan_lower_bound: f64,
    /// Number of `decide` calls.
    pub decisions: u64,
    /// Migration requests the policy emitted (not executed on a single node).
    pub move_requests: Vec<(f64, MoveRequest)>,
    /// Every decision, when `record_decisions` is set: `(time, job, weight, cap, reason)`.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub decision_log: Vec<(f64, String, u32, Option<f64>, String)>,
}

/// A lower bound on any policy's makespan for `jobs` on `cores` cores: no job finishes before
/// it has run its work at its best speed, and no set of jobs submitted at or after `t` finishes
/// before `t + (their work) / cores` (a core does at most one unit of work per second).
pub fn makespan_lower_bound(jobs: &[JobModel], cores: f64) -> f64 {
    let first = jobs.iter().map(|j| j.submit).fold(f64::INFINITY, f64::min);
    if !first.is_finite() {
        return 0.0;
    }
    let by_job = jobs
        .iter()
        .map(|j| j.submit + j.alone_seconds(cores))
        .fold(0.0, f64::max);
    let by_work = jobs
        .iter()
        .map(|j| {
            let later: f64 = jobs
                .iter()
                .filter(|k| k.submit >= j.submit)
                .map(|k| k.work)
                .sum();
            j.submit + later / cores
        })
        .fold(0.0, f64::max);
    by_job.max(by_work) - first
}

/// Run `jobs` on one node under `policy`. Deterministic for a given `seed` (the seed only drives
/// log noise). The cluster simulator's engine with one worker (`sim/src/cluster/single.rs`):
/// one node engine, alone or in a cluster.
pub fn run_node(
    jobs: &[JobModel],
    config: &NodeConfig,
    policy: &mut dyn NodePolicy,
    seed: u64,
) -> NodeRun {
    crate::cluster::run_one_node(jobs, config, policy, seed)
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
