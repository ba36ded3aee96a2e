//! The cluster simulator: a trace's jobs arrive at the coordinator, which queues and places them
//! with a real [`PlacementPolicy`] and [`Queue`]; each worker runs its own real [`NodePolicy`]
//! instance, driven exactly as the daemon drives it; migrations requested by a node policy are
//! executed with a checkpoint + transfer + restore cost.
//!
//! # Model
//!
//! - **Workers** have cores, memory and whole GPUs ([`WorkerSpec`]).
//! - **Speed.** A job runs at `speedup(min(cores, parallelism))` units of work per second
//!   ([`crate::job::Speedup`], the single-node simulator's sub-linear curve); `work` is
//!   CPU-seconds on one core.
//! - **Shares.** On a worker, cores are divided by
//!   [`governor_policy::share::water_fill`]: the cgroup v2 semantics the daemon writes
//!   (`cpu.weight` work-conserving, `cpu.max` a hard cap, demand = parallelism).
//! - **Observation.** A job writes a log line every [`crate::job::LogEvery`]; the line reaches the
//!   worker's policy `progress_delay` later (inotify + parse). Usage counters are sampled every
//!   `usage_interval` (the daemon's sampler), and the node's report to the coordinator is
//!   refreshed at the same ticks, so the coordinator places on a view up to one interval old,
//!   plus its own not-yet-reported placements (as `coordinator::state` does).
//! - **Placement.** Arrivals enter the coordinator's [`Queue`]; an admission round runs at every
//!   arrival and whenever a job leaves a worker. Requests carry the job's GPUs and memory; with
//!   `reserve_cores` (Schedulearn-style FIFO) they also reserve `parallelism` cores, so jobs wait
//!   instead of sharing. A placed job starts on its worker `start_delay` later.
//! - **Migration.** When a node policy's [`Plan::migrations`] names a job, the coordinator runs
//!   SpeCon's Algorithm 2 ([`SpeCon::migration_target`]). `Stay` marks the job as migrated (it
//!   is not moved later); `MoveTo` stops it on its worker at once (its CPU is free, the source's
//!   policy sees `job_removed`), reserves the destination, and restarts it there after
//!   [`MigrationCost::seconds`] of its checkpoint size with all its work kept (CRIU or a framework
//!   checkpoint). A job migrates at most `max_migrations_per_job` times (SpeCon marks a moved
//!   container and never moves it again). `migrate = false` ignores every request.
//! - **Preemption** (`+preempt`, the coordinator's rule: [`governor_placement::preempt`]).
//!   After each admission round, a waiting job that fits nowhere displaces the lower-priority
//!   jobs the rule picks on one node (run at least [`PREEMPT_MIN_RUN_S`] since their latest
//!   start, no GPUs, never preempted themselves: no chains). A displaced job stops at once with
//!   all its work kept (its checkpoint), goes back to the queue at the head of its priority, and
//!   pays [`MigrationCost::seconds`] of its checkpoint when it starts again (save and restore).
//!   The job it made room for is not delayed by the save: optimistic for it by one save
//!   (seconds, against minutes of waiting without preemption).
//!
//! # Event order
//!
//! A global heap orders arrivals (first at equal times) and worker steps. A worker step advances
//! its jobs to the step's time and then handles, in the single-node simulator's order
//! ([`crate::node`]): finishes, log writes, jobs starting, log lines delivered, the usage tick,
//! the policy's own deadline; then asks the policy to `decide` and applies the plan at once.
//! A one-worker cluster with `start_delay = 0` therefore reproduces `node::run_node` exactly (a
//! test checks it).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use governor_placement::queue::{Queue, QueuedJob};
use governor_placement::specon::{ConvergedJob, MigrationTarget, SpeCon};
use governor_placement::{
    ClusterView, JobRequest, JobView, NodeView, PlacementPolicy, feasible_nodes,
};
use governor_policy::quality::time_to_quality;
use governor_policy::share::{ShareRequest, water_fill};
use governor_policy::{
    Category, CpuAllocation, Direction, JobId, JobSpec, NodePolicy, NodeResources, Plan,
    ProgressPoint, Usage,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::baseline::placement_by_name;
use crate::job::LogEvery;
use crate::trace::{Trace, TraceJob};

/// One worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub name: String,
    pub cores: f64,
    pub memory_bytes: u64,
    #[serde(default)]
    pub gpus: u32,
}

/// What moving a job costs. The job makes no progress for
/// `fixed_seconds + bytes/checkpoint + bytes/transfer + bytes/restore`.
///
/// Defaults: a 2 s fixed part (freeze, process tree, cgroup and mount set-up: SpeCon measured
/// under 5 s save + resume for its small models), CRIU dumping at 500 MB/s to local disk, a
/// 10 Gbit/s network (1.25 GB/s) and restoring at 1 GB/s. A 4 GiB job is down for about 18 s.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MigrationCost {
    pub fixed_seconds: f64,
    pub checkpoint_bytes_per_second: f64,
    pub transfer_bytes_per_second: f64,
    pub restore_bytes_per_second: f64,
}

impl Default for MigrationCost {
    fn default() -> Self {
        MigrationCost {
            fixed_seconds: 2.0,
            checkpoint_bytes_per_second: 500e6,
            transfer_bytes_per_second: 1.25e9,
            restore_bytes_per_second: 1e9,
        }
    }
}

impl MigrationCost {
    /// A framework-checkpoint move as `cargo xtask bench-move --framework` measured it on the
    /// development host (2026-11-26; local disk as the shared path): 0.3 s fixed (exit, start,
    /// the coordinator's report and command), the save at ~330 MB/s (write and fsync), nothing
    /// carried, the load from the page cache at ~1.5 GB/s. 64 MiB: 0.32 s lost, 1 GiB: 3.9 s.
    pub fn framework_measured() -> Self {
        MigrationCost {
            fixed_seconds: 0.3,
            checkpoint_bytes_per_second: 330e6,
            transfer_bytes_per_second: 0.0,
            restore_bytes_per_second: 1.5e9,
        }
    }

    /// A CRIU move as `cargo xtask bench-move` measured it in the VM bed (2026-11-26, TCG:
    /// several times slower than real hardware): dump 0.7 s + 126 MB/s, restore 0.5 s +
    /// 85 MB/s, images carried over a 10 Gbit/s network. 64 MiB: 2.8 s, 1 GiB: 22 s.
    pub fn criu_measured_tcg() -> Self {
        MigrationCost {
            fixed_seconds: 1.2,
            checkpoint_bytes_per_second: 126e6,
            transfer_bytes_per_second: 1.25e9,
            restore_bytes_per_second: 85e6,
        }
    }

    /// A named preset: `default`, `framework` or `criu-tcg`.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "default" => Some(MigrationCost::default()),
            "framework" => Some(MigrationCost::framework_measured()),
            "criu-tcg" => Some(MigrationCost::criu_measured_tcg()),
            _ => None,
        }
    }

    /// Seconds a job with a checkpoint of `bytes` is down while it moves.
    pub fn seconds(&self, bytes: u64) -> f64 {
        let b = bytes as f64;
        let per = |rate: f64| if rate > 0.0 { b / rate } else { 0.0 };
        self.fixed_seconds.max(0.0)
            + per(self.checkpoint_bytes_per_second)
            + per(self.transfer_bytes_per_second)
            + per(self.restore_bytes_per_second)
    }
}

/// The simulated cluster and the daemon's and coordinator's timings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterConfig {
    pub workers: Vec<WorkerSpec>,
    /// Seconds between usage samples and node reports (the daemon samples every second).
    pub usage_interval: f64,
    /// Seconds between a log write and the policy seeing it.
    pub progress_delay: f64,
    /// Seconds between a placement and the job running on its worker.
    pub start_delay: f64,
    pub migration: MigrationCost,
    /// A job is moved at most this many times.
    pub max_migrations_per_job: u32,
    /// Stop at this simulated time (jobs still running have no finish time).
    pub horizon: f64,
    /// Record each job's cores over time, per worker (for plots).
    pub record_timeline: bool,
}

impl ClusterConfig {
    /// `workers` identical workers named `w01`, `w02`, ... (zero-padded so name order is index
    /// order, which the placement policies use to break ties).
    pub fn homogeneous(workers: usize, cores: f64, memory_bytes: u64, gpus: u32) -> Self {
        let width = workers.max(1).to_string().len().max(2);
        ClusterConfig {
            workers: (1..=workers)
                .map(|i| WorkerSpec {
                    name: format!("w{i:0width$}"),
                    cores,
                    memory_bytes,
                    gpus,
                })
                .collect(),
            ..ClusterConfig::default()
        }
    }

    /// Workers of the given `(cores, memory, gpus)` shapes, named in order.
    pub fn heterogeneous(shapes: &[(f64, u64, u32)]) -> Self {
        let width = shapes.len().max(1).to_string().len().max(2);
        ClusterConfig {
            workers: shapes
                .iter()
                .enumerate()
                .map(|(i, &(cores, memory_bytes, gpus))| WorkerSpec {
                    name: format!("w{:0width$}", i + 1),
                    cores,
                    memory_bytes,
                    gpus,
                })
                .collect(),
            ..ClusterConfig::default()
        }
    }

    /// The most cores any worker has.
    pub fn max_cores(&self) -> f64 {
        self.workers.iter().map(|w| w.cores).fold(0.0, f64::max)
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            workers: Vec::new(),
            usage_interval: 1.0,
            progress_delay: 0.2,
            start_delay: 1.0,
            migration: MigrationCost::default(),
            max_migrations_per_job: 1,
            horizon: 30.0 * 24.0 * 3600.0,
            record_timeline: false,
        }
    }
}

/// A node policy, a placement policy and the switches between them.
///
/// Written `NODE[/PLACEMENT][+FLAG...]`: `NODE` is a node policy spec
/// ([`governor_policy::by_spec`], e.g. `flowcon:interval=30`), `PLACEMENT` a placement policy
/// ([`placement_by_name`]); flags are `+no-migrate` (ignore migration requests), `+migrate` and
/// `+reserve` (requests reserve the job's parallelism in cores: no sharing). Without a
/// placement, each node policy comes with its paper's placement, and a few names stand for whole
/// systems:
///
/// | name | node policy | placement | |
/// | --- | --- | --- | --- |
/// | `fair` | fair | spread | the papers' default schedulers |
/// | `flowcon` | flowcon | flowcon | FlowCon, Algorithms 1-4 |
/// | `specon` | specon | specon | SpeCon, Algorithms 1-2, migration on |
/// | `procon` | fair | procon | ProCon (placement only) |
/// | `fifo` | fair | first-fit +reserve | Schedulearn FIFO |
/// | `governor`, `ours` | governor | soonest | ours |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// The spec as written (the name results are reported under).
    pub name: String,
    pub node: String,
    pub placement: String,
    pub migrate: bool,
    pub reserve_cores: bool,
    /// SpeCon's Algorithm 3 (`+rebalance`): after every departure and every round of
    /// Algorithm 2, move recently converged jobs toward idle or underloaded workers.
    #[serde(default)]
    pub rebalance: bool,
    /// Ours (`+pays`): a move Algorithm 2 or 3 chooses is made only if it gives back twice its
    /// downtime in core-seconds ([`governor_placement::payoff`], the coordinator's own gate).
    #[serde(default)]
    pub pays: bool,
    /// Preemption without loss (`+preempt`): a job that fits nowhere displaces lower-priority
    /// ones by checkpoint (the coordinator's rule).
    #[serde(default)]
    pub preempt: bool,
    /// Elastic jobs (`+elastic`, with `+reserve`): jobs that declare a least size
    /// ([`crate::trace::TraceJob::min_cores`]) are admitted at it and grown and shrunk as the
    /// placement policy says ([`governor_placement::elastic`], the coordinator's rule); each
    /// resize stops the job and starts it again at the new size after its save and restore.
    #[serde(default)]
    pub elastic: bool,
    /// Jobs that declare a least size run at it and are never resized (`+least`: FIFO without
    /// elasticity, each job at the size it is sure to get); without it and without `+elastic`
    /// they run at their parallelism (the most they can use).
    #[serde(default)]
    pub least: bool,
    /// GPU power by training progress (`+gpu-power`, the daemon's `[gpu] govern`): a GPU job's
    /// limit follows its learning stage ([`governor_policy::gpu_power`]), its speed and draw
    /// follow the limit ([`crate::gpu::GpuModel`]).
    #[serde(default)]
    pub gpu_power: bool,
    /// With `+gpu-power`: the fixed fractions only, no search (`+gpu-fixed`).
    #[serde(default)]
    pub gpu_fixed: bool,
}

/// An elastic job is resized only after running this long since its latest start (the
/// coordinator's `resize_min_run_s` default).
pub const RESIZE_MIN_RUN_S: f64 = 60.0;

/// A job is displaced only after running this long since its latest start (the coordinator's
/// `preempt_min_run_s` default).
pub const PREEMPT_MIN_RUN_S: f64 = 60.0;

impl std::str::FromStr for PolicySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.trim().split('+');
        let head = parts.next().unwrap_or_default().trim();
        let (node, placement, mut reserve) = match head.split_once('/') {
            Some((n, p)) => (n.trim().to_owned(), p.trim().to_owned(), false),
            None => {
                let base = head.split(':').next().unwrap_or_default();
                let (node, placement, reserve) = match base {
                    "fair" => (head, "spread", false),
                    // The default scheduler as the papers' explanations describe it: kernel
                    // sharing on the node, placement by instant resource usage.
                    "default" => ("fair", "usage", false),
                    "flowcon" => (head, "flowcon", false),
                    "specon" => (head, "specon", false),
                    "governor" => (head, "soonest", false),
                    "ours" => ("governor", "soonest", false),
                    "procon" => ("fair", "procon", false),
                    "fifo" | "schedulearn" => ("fair", "first-fit", true),
                    other => {
                        return Err(format!(
                            "{other:?} is neither a node policy ({}) nor one of ours, procon, fifo; \
                             write NODE/PLACEMENT to choose a placement",
                            governor_policy::POLICY_NAMES.join(", ")
                        ));
                    }
                };
                (node.to_owned(), placement.to_owned(), reserve)
            }
        };
        let mut migrate = true;
        let mut rebalance = false;
        let mut pays = false;
        let mut preempt = false;
        let mut elastic = false;
        let mut least = false;
        let mut gpu_power = false;
        let mut gpu_fixed = false;
        for flag in parts {
            match flag.trim() {
                "migrate" => migrate = true,
                "no-migrate" => migrate = false,
                "reserve" => reserve = true,
                "rebalance" => rebalance = true,
                "pays" => pays = true,
                "preempt" => preempt = true,
                "elastic" => elastic = true,
                "least" => least = true,
                "gpu-power" => gpu_power = true,
                "gpu-fixed" => {
                    gpu_power = true;
                    gpu_fixed = true;
                }
                f => {
                    return Err(format!(
                        "unknown flag +{f} in {s:?} (migrate, no-migrate, reserve, rebalance, pays, preempt, elastic, least, gpu-power, gpu-fixed)"
                    ));
                }
            }
        }
        governor_policy::by_spec(&node).map_err(|e| format!("{s:?}: {e}"))?;
        placement_by_name(&placement).map_err(|e| format!("{s:?}: {e}"))?;
        Ok(PolicySpec {
            name: s.trim().to_owned(),
            node,
            placement,
            migrate,
            reserve_cores: reserve,
            rebalance,
            pays,
            preempt,
            elastic,
            least,
            gpu_power,
            gpu_fixed,
        })
    }
}

/// One job's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub id: String,
    pub submit: f64,
    /// When it first ran on a worker.
    pub start: Option<f64>,
    pub finish: Option<f64>,
    /// `finish - submit`: queueing, running and any migration downtime.
    pub jct: Option<f64>,
    /// The worker it started on.
    pub worker: Option<String>,
    /// Times it was moved.
    pub migrations: u32,
    /// Time to quality from submission (see [`crate::node::JobResult::ttq`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttq: Option<f64>,
    #[serde(default)]
    pub priority: i32,
    /// Times it was displaced by a higher-priority job (`+preempt`).
    #[serde(default)]
    pub preemptions: u32,
    /// Times it was resized (`+elastic`).
    #[serde(default)]
    pub resizes: u32,
    /// GPU jobs: energy of its GPUs, joules, all told and after its time to quality.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_j: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_after_ttq_j: Option<f64>,
}

/// One migration decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MigrationRecord {
    pub at: f64,
    pub job: String,
    pub from: String,
    /// `None`: Algorithm 2 kept it where it was.
    pub to: Option<String>,
    /// Seconds it was down (0 when it stayed).
    pub downtime: f64,
}

/// Each job's cores over time on one worker (`(time, cores)` at every change).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerTimeline {
    pub worker: String,
    pub cores: f64,
    pub jobs: Vec<(String, Vec<(f64, f64)>)>,
}

/// The outcome of a cluster run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterRun {
    pub policy: String,
    pub jobs: Vec<JobOutcome>,
    /// Mean JCT of the finished jobs.
    pub avg_jct: f64,
    /// Mean time to quality of the jobs that logged a loss.
    #[serde(default)]
    pub avg_ttq: f64,
    /// Last finish minus first submit.
    pub makespan: f64,
    /// Jobs without a finish time (still queued or running at the horizon).
    pub unfinished: usize,
    /// `decide` calls over all workers.
    pub decisions: u64,
    /// Placements made by the coordinator (migrations excluded).
    pub placements: u64,
    pub migrations: Vec<MigrationRecord>,
    /// Events handled (arrivals and worker steps).
    pub events: u64,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub timelines: Vec<WorkerTimeline>,
}

/// A run that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("node policy: {0}")]
    NodePolicy(#[from] governor_policy::PolicySpecError),
    #[error("placement policy: {0}")]
    Placement(#[from] governor_placement::UnknownPolicy),
    #[error("the cluster has no workers")]
    NoWorkers,
}

/// Relative tolerance for "reached its work or a log threshold" (as in [`crate::node`]).
const EPS: f64 = 1e-9;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    NotSubmitted,
    Queued,
    /// Placed (or moving), not running yet; `Rt::worker` is where it will run.
    Starting,
    Running,
    Done,
}

#[derive(Clone, Copy, Debug)]
struct Observation {
    at: f64,
    value: f64,
    /// The job's CPU-seconds when the line was written.
    cpu: f64,
    fraction: f64,
}

struct Rt {
    phase: Phase,
    worker: usize,
    done: f64,
    cpu: f64,
    next_log: f64,
    log_started: bool,
    cores: f64,
    alloc: CpuAllocation,
    category: Category,
    rng: ChaCha8Rng,
    first_start: Option<f64>,
    first_worker: Option<usize>,
    finish: Option<f64>,
    migrations: u32,
    no_more_migrations: bool,
    gpus: Vec<u32>,
    lines_seen: u64,
    last: Option<Observation>,
    previous: Option<Observation>,
    /// (seconds since submission, noiseless loss) of every log line written.
    written: Vec<(f64, f64)>,
    /// When it last started on a worker.
    last_start: f64,
    /// Times it was displaced; a displaced job never displaces others.
    preemptions: u32,
    /// Seconds its next start is delayed (a displaced job's save and restore).
    resume_delay: f64,
    /// Cores it runs with: its parallelism, or an elastic job's current size.
    size: f64,
    resizes: u32,
    /// Its GPUs' power limit, a fraction of the default (1 without `+gpu-power`).
    gpu_limit: f64,
    /// GPU joules so far, and their value when each line of `written` was written (for the
    /// energy after its time to quality, which is one of those lines' times).
    gpu_energy_j: f64,
    gpu_energy_at_lines: Vec<f64>,
    /// Zeus's search of its GPUs' limit once it stopped learning (the daemon's `[gpu] slowdown`).
    gpu_search: Option<governor_policy::gpu_power::LimitSearch>,
}

#[derive(Clone, Copy)]
struct Delivery {
    at: f64,
    job: usize,
    point: ProgressPoint,
    obs: Observation,
}

struct Worker {
    policy: Box<dyn NodePolicy>,
    node: NodeResources,
    t: f64,
    /// Running jobs, by trace index.
    running: Vec<usize>,
    /// `(start time, job)` of jobs placed here that have not started.
    arriving: Vec<(f64, usize)>,
    deliveries: Vec<Delivery>,
    next_usage: Option<f64>,
    next_decision: Option<f64>,
    version: u64,
    force_decide: bool,
    gpu_owner: Vec<Option<usize>>,
    timeline: Vec<(f64, usize, f64)>,
}

#[derive(Clone, Copy, Debug)]
struct Ev {
    t: f64,
    /// 0: an arrival (job index); 1: a worker step (worker index).
    class: u8,
    idx: usize,
    version: u64,
}

impl PartialEq for Ev {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ev {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.t
            .total_cmp(&other.t)
            .then(self.class.cmp(&other.class))
            .then(self.idx.cmp(&other.idx))
            .then(self.version.cmp(&other.version))
    }
}

struct Engine<'a> {
    jobs: &'a [TraceJob],
    config: &'a ClusterConfig,
    spec: &'a PolicySpec,
    ids: Vec<JobId>,
    index: HashMap<String, usize>,
    rt: Vec<Rt>,
    workers: Vec<Worker>,
    view: ClusterView,
    queue: Queue,
    placement: Box<dyn PlacementPolicy>,
    specon: SpeCon,
    heap: BinaryHeap<Reverse<Ev>>,
    max_cores: f64,
    decisions: u64,
    placements: u64,
    events: u64,
    migrations: Vec<MigrationRecord>,
    /// Migration requests of the current step: (worker, job).
    requests: Vec<(usize, usize)>,
    /// Jobs Algorithm 2 has processed, for Algorithm 3 (its set D).
    converged: Vec<ConvergedJob>,
    /// Jobs finished since the last elastic round (Schedulearn's elastic FIFO grows on each).
    completions: u32,
}

/// Simulate `trace` on the cluster under `spec`. Deterministic for a given `seed` (it seeds
/// log noise; each job has its own stream, so every policy sees the same noise for the same
/// log line).
pub fn run_cluster(
    trace: &Trace,
    config: &ClusterConfig,
    spec: &PolicySpec,
    seed: u64,
) -> Result<ClusterRun, RunError> {
    if config.workers.is_empty() {
        return Err(RunError::NoWorkers);
    }
    let jobs = &trace.jobs;
    let workers = config
        .workers
        .iter()
        .map(|w| {
            Ok(Worker {
                policy: governor_policy::by_spec(&spec.node)?,
                node: NodeResources {
                    cores: w.cores,
                    memory_bytes: w.memory_bytes,
                },
                t: 0.0,
                running: Vec::new(),
                arriving: Vec::new(),
                deliveries: Vec::new(),
                next_usage: None,
                next_decision: None,
                version: 0,
                force_decide: false,
                gpu_owner: vec![None; w.gpus as usize],
                timeline: Vec::new(),
            })
        })
        .collect::<Result<Vec<_>, RunError>>()?;
    let view = ClusterView {
        nodes: config
            .workers
            .iter()
            .map(|w| {
                let n = NodeView::new(w.name.clone(), w.cores, w.memory_bytes);
                if w.gpus > 0 {
                    n.with_gpus(w.gpus, "sim", 0)
                } else {
                    n
                }
            })
            .collect(),
    };
    let mut engine = Engine {
        jobs,
        config,
        spec,
        ids: jobs.iter().map(|j| JobId(j.model.id.clone())).collect(),
        index: jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (j.model.id.clone(), i))
            .collect(),
        rt: (0..jobs.len())
            .map(|i| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(i as u64 + 1);
                Rt {
                    phase: Phase::NotSubmitted,
                    worker: 0,
                    done: 0.0,
                    cpu: 0.0,
                    next_log: 0.0,
                    log_started: false,
                    cores: 0.0,
                    alloc: CpuAllocation::DEFAULT,
                    category: Category::Unknown,
                    rng,
                    first_start: None,
                    first_worker: None,
                    finish: None,
                    migrations: 0,
                    no_more_migrations: false,
                    gpus: Vec::new(),
                    lines_seen: 0,
                    last: None,
                    previous: None,
                    written: Vec::new(),
                    last_start: 0.0,
                    preemptions: 0,
                    resume_delay: 0.0,
                    size: jobs[i].model.parallelism,
                    resizes: 0,
                    gpu_limit: 1.0,
                    gpu_energy_j: 0.0,
                    gpu_energy_at_lines: Vec::new(),
                    gpu_search: None,
                }
            })
            .collect(),
        workers,
        view,
        queue: Queue::new(),
        placement: placement_by_name(&spec.placement)?,
        specon: SpeCon::default(),
        heap: BinaryHeap::new(),
        max_cores: config.max_cores(),
        decisions: 0,
        placements: 0,
        events: 0,
        migrations: Vec::new(),
        requests: Vec::new(),
        converged: Vec::new(),
        completions: 0,
    };
    for (i, j) in jobs.iter().enumerate() {
        engine.heap.push(Reverse(Ev {
            t: j.model.submit,
            class: 0,
            idx: i,
            version: 0,
        }));
    }
    engine.run();
    Ok(engine.result())
}

/// A GPU job's power limit (fraction of its default) at its learning stage: the daemon's rule,
/// Zeus's search (2% slowdown) on the pace of its log lines once it stopped learning, the fixed
/// fractions until the search has a pace.
fn gpu_limit_for(category: Category, now: f64, submit: f64, search: bool, rt: &mut Rt) -> f64 {
    use governor_policy::gpu_power::{
        GpuPowerParams, LimitSearch, PowerRange, SearchState, target_limit,
    };
    let model = crate::gpu::GpuModel::default();
    let scale = 1_000_000.0;
    let range = PowerRange {
        min_mw: (model.min_limit * scale) as u32,
        default_mw: scale as u32,
        original_mw: scale as u32,
    };
    let fixed = || {
        target_limit(range, &[category], GpuPowerParams::default())
            .map_or(1.0, |l| f64::from(l) / scale)
    };
    if !search || !matches!(category, Category::Watching | Category::Converged) {
        rt.gpu_search = None;
        return fixed();
    }
    let Some(&(last, _)) = rt.written.last() else {
        return fixed();
    };
    let records = rt.written.len() as u64;
    let current = (rt.gpu_limit * scale).round() as u32;
    let search = rt
        .gpu_search
        .get_or_insert_with(|| LimitSearch::new(range, 0.02));
    match search.observe(now, current, records, submit + last) {
        SearchState::Trying(l) | SearchState::Settled(l) => f64::from(l) / scale,
        SearchState::NoSignal => fixed(),
    }
}

/// Work per second of job `j`: its CPU speed, times its GPUs' throughput at their limit.
fn speed_with(job: &TraceJob, rt: &Rt) -> f64 {
    let cpu = job.model.speed(rt.cores);
    if job.gpus > 0 && rt.gpu_limit < 1.0 {
        cpu * crate::gpu::GpuModel::default().throughput(rt.gpu_limit)
    } else {
        cpu
    }
}

impl Engine<'_> {
    fn speed_of(&self, j: usize) -> f64 {
        speed_with(&self.jobs[j], &self.rt[j])
    }

    fn run(&mut self) {
        while let Some(Reverse(ev)) = self.heap.pop() {
            if ev.t > self.config.horizon {
                break;
            }
            if ev.class == 0 {
                self.events += 1;
                self.submit(ev.idx, ev.t);
            } else {
                if ev.version != self.workers[ev.idx].version {
                    continue;
                }
                self.events += 1;
                self.step(ev.idx, ev.t);
            }
        }
    }

    fn request(&self, j: usize) -> JobRequest {
        let m = &self.jobs[j];
        JobRequest {
            id: m.model.id.clone(),
            gpus: m.gpus,
            cores: self
                .spec
                .reserve_cores
                .then(|| self.least_size(j).min(self.max_cores)),
            memory_bytes: Some(m.model.memory_bytes),
            priority: m.model.priority,
            avoid: Vec::new(),
        }
    }

    /// Whether job `j` is resized in this run.
    fn is_elastic(&self, j: usize) -> bool {
        self.spec.elastic && self.jobs[j].min_cores.is_some()
    }

    /// The size job `j` is admitted at: an elastic job's least, else its parallelism.
    fn least_size(&self, j: usize) -> f64 {
        let m = &self.jobs[j];
        match m.min_cores {
            Some(min) if self.spec.elastic || self.spec.least => min.min(m.model.parallelism),
            _ => m.model.parallelism,
        }
    }

    fn submit(&mut self, j: usize, t: f64) {
        self.rt[j].phase = Phase::Queued;
        let q = self.queued(j, t);
        self.queue.push(q);
        self.admit(t);
    }

    /// Job `j` as the queue holds it, queued at `t`.
    fn queued(&self, j: usize, t: f64) -> QueuedJob {
        let request = self.request(j);
        let mut q = QueuedJob::new(request.id, request.priority, j as u64, t);
        q.gpus = request.gpus;
        q.cores = request.cores;
        q.memory_bytes = request.memory_bytes;
        q
    }

    /// One admission round of the coordinator's queue; with `+preempt`, then displace
    /// lower-priority jobs for those still waiting and admit again.
    fn admit(&mut self, t: f64) {
        self.admit_round(t);
        let room_being_made = self.shrink_for_waiting(t);
        if self.spec.preempt {
            self.preempt(t, &room_being_made);
        }
        self.grow_elastic(t);
    }

    fn admit_round(&mut self, t: f64) {
        if self.queue.is_empty() {
            return;
        }
        let round = self.queue.admit(t, &mut self.view, self.placement.as_mut());
        for a in round.admitted {
            let Some(&j) = self.index.get(&a.job.id) else {
                continue;
            };
            let Some(p) = a.members.first() else { continue };
            self.placements += 1;
            let gpus = p.gpus.clone();
            let delay = std::mem::take(&mut self.rt[j].resume_delay);
            self.rt[j].size = self.least_size(j);
            self.initial_size(j, p.node);
            self.start_on(
                j,
                p.node,
                gpus,
                t + self.config.start_delay.max(0.0) + delay,
            );
        }
        for e in round.expired {
            if let Some(&j) = self.index.get(&e.job.id) {
                self.rt[j].phase = Phase::Done;
            }
        }
    }

    /// Displace lower-priority jobs for the waiting ones (the coordinator's rule), each
    /// followed by an admission round (the room is the waiting job's).
    fn preempt(&mut self, t: f64, room_being_made: &[usize]) {
        let waiting: Vec<(usize, JobRequest)> = self
            .queue
            .iter()
            .filter(|q| !q.waiting_reason.is_empty() && q.replicas == 1)
            .filter_map(|q| self.index.get(&q.id).copied())
            .filter(|j| !room_being_made.contains(j))
            .filter(|&j| self.rt[j].preemptions == 0)
            .map(|j| (j, self.request(j)))
            .collect();
        for (_, request) in waiting {
            let candidates: Vec<governor_placement::preempt::Candidate> = self
                .rt
                .iter()
                .enumerate()
                .filter(|(k, rt)| {
                    rt.phase == Phase::Running
                        && self.jobs[*k].gpus == 0
                        && self.jobs[*k].model.priority < request.priority
                        && t - rt.last_start >= PREEMPT_MIN_RUN_S
                })
                .map(|(k, rt)| governor_placement::preempt::Candidate {
                    id: self.jobs[k].model.id.clone(),
                    node: rt.worker,
                    priority: self.jobs[k].model.priority,
                    started_at: rt.last_start,
                    gpus: Vec::new(),
                })
                .collect();
            let Some(plan) = governor_placement::preempt::plan(&self.view, &request, &candidates)
            else {
                continue;
            };
            for victim in &plan.victims {
                if let Some(&k) = self.index.get(victim) {
                    self.displace(k, t);
                }
            }
            // The freed room is this job's: admit before planning for the next.
            self.admit_round(t);
        }
    }

    /// Stop job `k` on its worker with its work kept (saved), and queue it again at the head
    /// of its priority; its next start pays its save and restore.
    fn displace(&mut self, k: usize, t: f64) {
        let w = self.rt[k].worker;
        self.leave(w, k, t);
        self.workers[w].force_decide = true;
        let cost = self
            .config
            .migration
            .seconds(self.jobs[k].checkpoint_bytes());
        let rt = &mut self.rt[k];
        rt.phase = Phase::Queued;
        rt.preemptions += 1;
        rt.resume_delay = cost;
        let mut q = self.queued(k, self.jobs[k].model.submit);
        q.head = true;
        self.queue.push(q);
        self.update_shares(w, t);
        self.report(w);
        self.schedule(w);
    }

    /// Running elastic jobs that may be resized now (the coordinator's candidates).
    fn elastic_candidates(&self, t: f64) -> Vec<governor_placement::elastic::ElasticJob> {
        self.rt
            .iter()
            .enumerate()
            .filter(|(k, rt)| {
                rt.phase == Phase::Running
                    && self.is_elastic(*k)
                    && self.jobs[*k].gpus == 0
                    && t - rt.last_start >= RESIZE_MIN_RUN_S
            })
            .map(|(k, rt)| governor_placement::elastic::ElasticJob {
                id: self.jobs[k].model.id.clone(),
                node: rt.worker,
                cores: rt.size,
                min_cores: self.least_size(k),
                max_cores: self.jobs[k].model.parallelism.min(self.max_cores),
                priority: self.jobs[k].model.priority,
                started_at: rt.last_start,
                submitted_at: self.jobs[k].model.submit,
            })
            .collect()
    }

    /// An elastic job just admitted on `w` starts at the largest size there that its policy
    /// allows (the coordinator's `initial_size`).
    fn initial_size(&mut self, j: usize, w: usize) {
        use governor_placement::elastic::{ElasticJob, Grow};
        let grow = self.placement.elasticity().grow;
        if !self.is_elastic(j)
            || !matches!(grow, Grow::WhenNoneWait | Grow::Always)
            || (grow == Grow::WhenNoneWait && !self.queue.is_empty())
        {
            return;
        }
        let m = &self.jobs[j];
        let job = ElasticJob {
            id: m.model.id.clone(),
            node: w,
            cores: self.rt[j].size,
            min_cores: self.least_size(j),
            max_cores: m.model.parallelism.min(self.max_cores),
            priority: m.model.priority,
            started_at: 0.0,
            submitted_at: m.model.submit,
        };
        let Some(to) = governor_placement::elastic::grown_size(&self.view.nodes[w], &job) else {
            return;
        };
        self.rt[j].size = to;
        if let Some(v) = self.view.nodes[w]
            .jobs_mut()
            .iter_mut()
            .find(|v| v.id == job.id)
        {
            v.requested_cores = Some(to);
        }
    }

    /// Shrink elastic jobs for the jobs that still wait (before any preemption); returns the
    /// waiting jobs room was made for.
    fn shrink_for_waiting(&mut self, t: f64) -> Vec<usize> {
        use governor_placement::elastic::{Shrink, shrink_plan};
        let rule = self.placement.elasticity().shrink;
        if !self.spec.elastic || rule == Shrink::Never {
            return Vec::new();
        }
        let waiting: Vec<(usize, JobRequest)> = self
            .queue
            .iter()
            .filter(|q| !q.waiting_reason.is_empty() && q.replicas == 1)
            .filter_map(|q| self.index.get(&q.id).copied())
            .map(|j| (j, self.request(j)))
            .collect();
        let mut served = Vec::new();
        for (j, request) in waiting {
            let candidates = self.elastic_candidates(t);
            if candidates.is_empty() {
                break;
            }
            let Some(plan) = shrink_plan(&self.view, &request, &candidates, rule) else {
                continue;
            };
            for r in &plan.resizes {
                if let Some(&k) = self.index.get(&r.id) {
                    self.resize(k, r.node, r.to, t);
                }
            }
            served.push(j);
            // The freed room is this job's.
            self.admit_round(t);
        }
        served
    }

    /// Grow elastic jobs as the placement policy says.
    fn grow_elastic(&mut self, t: f64) {
        use governor_placement::elastic::{Grow, grow_into_idle, grow_slowest};
        let completions = std::mem::take(&mut self.completions);
        if !self.spec.elastic {
            return;
        }
        let resizes = match self.placement.elasticity().grow {
            Grow::Never => return,
            Grow::WhenNoneWait if !self.queue.is_empty() => return,
            Grow::WhenNoneWait | Grow::Always => {
                let candidates = self.elastic_candidates(t);
                if candidates.is_empty() {
                    return;
                }
                grow_into_idle(&self.view, &candidates)
            }
            Grow::OnCompletion => {
                let mut candidates = self.elastic_candidates(t);
                let mut resizes = Vec::new();
                for _ in 0..completions {
                    let Some(r) = grow_slowest(&self.view, &candidates, |_, _| true) else {
                        break;
                    };
                    candidates.retain(|c| c.id != r.id);
                    resizes.push(r);
                }
                resizes
            }
        };
        for r in resizes {
            if let Some(&k) = self.index.get(&r.id) {
                self.resize(k, r.node, r.to, t);
            }
        }
    }

    /// Save job `j` and start it again with `size` cores on worker `to` after its save and
    /// restore (all its work kept).
    fn resize(&mut self, j: usize, to: usize, size: f64, t: f64) {
        let rt = &mut self.rt[j];
        rt.size = size;
        rt.resizes += 1;
        let request = JobRequest {
            cores: Some(size),
            ..self.request(j)
        };
        self.restart_on(j, to, Vec::new(), &request, t);
    }

    /// Stop job `j` on its worker with all its work kept (its checkpoint) and start it on `to`
    /// after its save and restore, `request` reserved there meanwhile (a move, a resize).
    /// Returns the downtime.
    fn restart_on(
        &mut self,
        j: usize,
        to: usize,
        gpus: Vec<u32>,
        request: &JobRequest,
        t: f64,
    ) -> f64 {
        let w = self.rt[j].worker;
        let downtime = self
            .config
            .migration
            .seconds(self.jobs[j].checkpoint_bytes());
        self.leave(w, j, t);
        self.workers[w].force_decide = true;
        self.rt[j].phase = Phase::Starting;
        // The view: gone from its worker (first: `to` may be the same worker), pending where
        // it starts again.
        self.report(w);
        self.view
            .reserve(to, JobView::pending(request.id.clone(), request), &gpus);
        self.update_shares(w, t);
        self.start_on(j, to, gpus, t + downtime);
        self.schedule(w);
        downtime
    }

    /// The job will start on worker `w` at `at` (the view already holds its reservation).
    fn start_on(&mut self, j: usize, w: usize, gpus: Vec<u32>, at: f64) {
        for &g in &gpus {
            if let Some(slot) = self.workers[w].gpu_owner.get_mut(g as usize) {
                *slot = Some(j);
            }
        }
        let rt = &mut self.rt[j];
        rt.phase = Phase::Starting;
        rt.worker = w;
        rt.gpus = gpus;
        self.workers[w].arriving.push((at, j));
        self.schedule(w);
    }

    fn schedule(&mut self, w: usize) {
        let t = self.next_time(w);
        let worker = &mut self.workers[w];
        worker.version += 1;
        if t.is_finite() {
            self.heap.push(Reverse(Ev {
                t,
                class: 1,
                idx: w,
                version: worker.version,
            }));
        }
    }

    /// The worker's next event (the single-node simulator's rule).
    fn next_time(&self, w: usize) -> f64 {
        let worker = &self.workers[w];
        let t = worker.t;
        let mut next = f64::INFINITY;
        if worker.force_decide {
            next = t;
        }
        for &(at, _) in &worker.arriving {
            next = next.min(at.max(t));
        }
        for &j in &worker.running {
            let m = &self.jobs[j].model;
            let rt = &self.rt[j];
            let speed = self.speed_of(j);
            if speed > 0.0 {
                next = next.min(t + (m.work - rt.done).max(0.0) / speed);
                if let LogEvery::Work { .. } = m.log_every {
                    let target = m.log_at(rt.next_log);
                    next = next.min(t + (target - rt.done).max(0.0) / speed);
                }
            }
            if let LogEvery::Seconds { .. } = m.log_every {
                next = next.min(rt.next_log.max(t));
            }
        }
        for d in &worker.deliveries {
            next = next.min(d.at.max(t));
        }
        if !worker.running.is_empty() {
            if let Some(at) = worker.next_usage {
                next = next.min(at.max(t));
            }
            if let Some(at) = worker.next_decision {
                next = next.min(at.max(t));
            }
        }
        next
    }

    fn step(&mut self, w: usize, t: f64) {
        // Run everyone until now.
        {
            let worker = &mut self.workers[w];
            let dt = t - worker.t;
            if dt > 0.0 {
                for &j in &worker.running {
                    let speed = speed_with(&self.jobs[j], &self.rt[j]);
                    let rt = &mut self.rt[j];
                    rt.done += speed * dt;
                    rt.cpu += rt.cores * dt;
                    let gpus = self.jobs[j].gpus;
                    if gpus > 0 {
                        let model = crate::gpu::GpuModel::default();
                        rt.gpu_energy_j += f64::from(gpus) * model.busy_watts(rt.gpu_limit) * dt;
                    }
                }
            }
            worker.t = t;
        }
        let active_at_start = self.workers[w].running.clone();
        let mut changed = std::mem::take(&mut self.workers[w].force_decide);
        let mut departed = false;
        let mut report = false;

        // 1. Finishes.
        for &j in &active_at_start {
            let m = &self.jobs[j].model;
            if m.work - self.rt[j].done <= EPS * m.work.max(1.0) {
                self.rt[j].done = m.work;
                self.rt[j].finish = Some(t);
                self.rt[j].phase = Phase::Done;
                self.leave(w, j, t);
                self.completions += 1;
                changed = true;
                departed = true;
            }
        }
        // 2. Log writes.
        for &j in &active_at_start {
            if self.rt[j].phase != Phase::Running {
                continue;
            }
            self.write_logs(w, j, t);
        }
        // 3. Jobs starting here.
        let mut starting: Vec<(f64, usize)> = Vec::new();
        self.workers[w].arriving.retain(|&(at, j)| {
            if at <= t + EPS {
                starting.push((at, j));
                false
            } else {
                true
            }
        });
        starting.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, j) in starting {
            self.arrive(w, j, t);
            changed = true;
        }
        // 4. Log lines delivered.
        let mut due: Vec<Delivery> = Vec::new();
        self.workers[w].deliveries.retain(|d| {
            if d.at <= t + EPS {
                due.push(*d);
                false
            } else {
                true
            }
        });
        for d in due {
            let reports_total = self.jobs[d.job].model.reports_total;
            let worker = &mut self.workers[w];
            worker.policy.progress(t, &self.ids[d.job], d.point);
            if reports_total {
                worker.policy.work_done(t, &self.ids[d.job], d.obs.fraction);
            }
            let rt = &mut self.rt[d.job];
            rt.previous = rt.last.replace(d.obs);
            rt.lines_seen += 1;
            changed = true;
        }
        // 5. Usage tick (and the node's report).
        if let Some(next_usage) = self.workers[w].next_usage
            && t >= next_usage - EPS
        {
            for &j in &active_at_start {
                if self.rt[j].phase != Phase::Running || self.rt[j].worker != w {
                    continue;
                }
                let usage = Usage {
                    at: t,
                    cpu_seconds: self.rt[j].cpu,
                    memory_bytes: self.jobs[j].model.memory_bytes,
                    memory_pressure_events: 0,
                    cpu_wait_seconds: None,
                };
                self.workers[w].policy.usage(t, &self.ids[j], usage);
            }
            let interval = self.config.usage_interval.max(1e-3);
            let worker = &mut self.workers[w];
            let mut next = next_usage;
            while next <= t + EPS {
                next += interval;
            }
            worker.next_usage = Some(next);
            changed = true;
            report = true;
        }
        // 6. The policy's own deadline.
        if self.workers[w]
            .next_decision
            .is_some_and(|at| at <= t + EPS)
        {
            changed = true;
        }
        if changed {
            let plan = {
                let worker = &mut self.workers[w];
                worker.policy.decide(t, &worker.node)
            };
            self.decisions += 1;
            self.apply(w, t, plan);
        }
        self.update_shares(w, t);
        if report || departed {
            self.report(w);
        }
        if departed {
            self.admit(t);
        } else if report && self.spec.elastic {
            // The coordinator's tick: jobs that ran their minimum time may grow now.
            self.grow_elastic(t);
        }
        let requested = !self.requests.is_empty();
        if requested {
            self.migrate_requested(t);
        }
        if departed || requested {
            self.rebalance(t);
        }
        self.schedule(w);
    }

    fn write_logs(&mut self, w: usize, j: usize, t: f64) {
        let m = &self.jobs[j].model;
        let delay = self.config.progress_delay;
        let rt = &mut self.rt[j];
        let mut out = Vec::new();
        match m.log_every {
            LogEvery::Work { fraction } => {
                let step = fraction.max(1e-6);
                while rt.next_log < 1.0 - EPS
                    && rt.done >= m.log_at(rt.next_log) - EPS * m.work.max(1.0)
                {
                    let x = rt.next_log;
                    out.push((x, m.logged_loss(x, &mut rt.rng)));
                    rt.written.push((t - m.submit, m.loss.value(x)));
                    rt.next_log += step;
                }
            }
            LogEvery::Seconds { seconds } => {
                let step = seconds.max(1e-3);
                while rt.next_log <= t + EPS {
                    rt.next_log += step;
                    if m.starting(rt.done) {
                        // Nothing is logged before the training starts.
                        continue;
                    }
                    let x = m.training_fraction(rt.done);
                    out.push((x, m.logged_loss(x, &mut rt.rng)));
                    rt.written.push((t - m.submit, m.loss.value(x)));
                }
            }
        }
        rt.gpu_energy_at_lines
            .resize(rt.written.len(), rt.gpu_energy_j);
        let cpu = rt.cpu;
        for (x, value) in out {
            self.workers[w].deliveries.push(Delivery {
                at: t + delay,
                job: j,
                point: ProgressPoint {
                    at: t + delay,
                    value,
                    new_segment: false,
                },
                obs: Observation {
                    at: t + delay,
                    value,
                    cpu,
                    fraction: x,
                },
            });
        }
    }

    fn arrive(&mut self, w: usize, j: usize, t: f64) {
        let m = &self.jobs[j].model;
        let rt = &mut self.rt[j];
        rt.phase = Phase::Running;
        rt.worker = w;
        rt.last_start = t;
        if rt.first_start.is_none() {
            rt.first_start = Some(t);
            rt.first_worker = Some(w);
        }
        if !rt.log_started {
            rt.log_started = true;
            rt.next_log = match m.log_every {
                LogEvery::Work { fraction } => fraction.max(1e-6),
                LogEvery::Seconds { seconds } => t + seconds.max(1e-3),
            };
        } else if let LogEvery::Seconds { seconds } = m.log_every
            && rt.next_log < t
        {
            // A time-based logger restarts its timer when the process is restored.
            rt.next_log = t + seconds.max(1e-3);
        }
        rt.alloc = CpuAllocation::DEFAULT;
        rt.category = Category::Unknown;
        let worker = &mut self.workers[w];
        let pos = worker.running.partition_point(|&k| k < j);
        worker.running.insert(pos, j);
        if worker.next_usage.is_none() {
            worker.next_usage = Some(t);
        }
        worker.policy.job_added(
            t,
            &JobSpec {
                priority: m.priority,
                ..JobSpec::new(m.id.clone())
            },
        );
    }

    /// Take job `j` off worker `w` (finished or moving away).
    fn leave(&mut self, w: usize, j: usize, t: f64) {
        let worker = &mut self.workers[w];
        worker.running.retain(|&k| k != j);
        worker.deliveries.retain(|d| d.job != j);
        worker.policy.job_removed(t, &self.ids[j]);
        for slot in worker.gpu_owner.iter_mut() {
            if *slot == Some(j) {
                *slot = None;
            }
        }
        if self.config.record_timeline {
            worker.timeline.push((t, j, 0.0));
        }
        let rt = &mut self.rt[j];
        rt.cores = 0.0;
        rt.gpus.clear();
    }

    fn apply(&mut self, w: usize, t: f64, plan: Plan) {
        for &j in &self.workers[w].running {
            self.rt[j].alloc = CpuAllocation::DEFAULT;
        }
        for (id, a) in plan.allocations {
            if let Some(&j) = self.index.get(&id.0)
                && self.rt[j].phase == Phase::Running
                && self.rt[j].worker == w
            {
                self.rt[j].alloc = a.cpu;
                self.rt[j].category = a.category;
                if self.spec.gpu_power && self.jobs[j].gpus > 0 {
                    let submit = self.jobs[j].model.submit;
                    let search = !self.spec.gpu_fixed;
                    let rt = &mut self.rt[j];
                    rt.gpu_limit = gpu_limit_for(a.category, t, submit, search, rt);
                }
            }
        }
        let worker = &mut self.workers[w];
        // A policy asking to be called "now" again would stall the clock.
        worker.next_decision = plan.next_decision_at.map(|at| at.max(t + 1e-3));
        for m in plan.migrations {
            if let Some(&j) = self.index.get(&m.job.0) {
                self.requests.push((w, j));
            }
        }
    }

    fn update_shares(&mut self, w: usize, t: f64) {
        let worker = &mut self.workers[w];
        let requests: Vec<ShareRequest> = worker
            .running
            .iter()
            .map(|&j| ShareRequest {
                weight: self.rt[j].alloc.weight,
                max_cores: self.rt[j].alloc.max_cores,
                demand: self.rt[j].size,
            })
            .collect();
        let shares = water_fill(worker.node.cores, &requests);
        for (&j, &cores) in worker.running.iter().zip(&shares) {
            let rt = &mut self.rt[j];
            if self.config.record_timeline && (rt.cores - cores).abs() > 1e-9 {
                worker.timeline.push((t, j, cores));
            }
            rt.cores = cores;
        }
    }

    /// The node's report: the coordinator's view of worker `w` now.
    fn report(&mut self, w: usize) {
        let worker = &self.workers[w];
        let mut jobs: Vec<JobView> = worker.running.iter().map(|&j| self.job_view(j)).collect();
        for &(_, j) in &worker.arriving {
            // At the size it will run with (an elastic job's may differ from its request).
            let request = JobRequest {
                cores: self
                    .spec
                    .reserve_cores
                    .then(|| self.rt[j].size.min(self.max_cores)),
                ..self.request(j)
            };
            jobs.push(JobView::pending(self.jobs[j].model.id.clone(), &request));
        }
        let node = &mut self.view.nodes[w];
        node.cpu_used_cores = worker.running.iter().map(|&j| self.rt[j].cores).sum();
        node.memory_used_bytes = worker
            .running
            .iter()
            .map(|&j| self.jobs[j].model.memory_bytes)
            .sum();
        for (g, owner) in node.gpus.iter_mut().zip(&worker.gpu_owner) {
            g.assigned = owner.is_some();
        }
        node.set_jobs(jobs);
    }

    /// What the node reports about a running job: the policy's category, FlowCon's growth and
    /// growth efficiency between its last two observed log lines, ProCon's epoch counters when
    /// its log says how far along it is, its CPU and memory.
    fn job_view(&self, j: usize) -> JobView {
        let m = &self.jobs[j].model;
        let rt = &self.rt[j];
        let (mut growth, mut growth_efficiency) = (None, None);
        let (mut epoch, mut max_epochs, mut epoch_seconds) = (None, None, None);
        if let (Some(prev), Some(last)) = (rt.previous, rt.last) {
            let dv = (last.value - prev.value).abs();
            let dt = last.at - prev.at;
            if dt > 0.0 {
                growth = Some(dv / dt);
            }
            let dcpu = last.cpu - prev.cpu;
            if dcpu > 0.0 {
                growth_efficiency = Some(dv / dcpu);
            }
        }
        if m.reports_total
            && let Some(last) = rt.last
        {
            match m.log_every {
                LogEvery::Work { fraction } => {
                    epoch = Some(rt.lines_seen);
                    max_epochs = Some((1.0 / fraction.max(1e-6)).round() as u64);
                    epoch_seconds = rt.previous.map(|p| last.at - p.at);
                }
                LogEvery::Seconds { .. } => {
                    epoch = Some((last.fraction * 100.0).floor() as u64);
                    max_epochs = Some(100);
                    epoch_seconds = rt.previous.and_then(|p| {
                        let dx = last.fraction - p.fraction;
                        (dx > 0.0).then(|| (last.at - p.at) / (100.0 * dx))
                    });
                }
            }
        }
        JobView {
            id: m.id.clone(),
            category: rt.category,
            pending: false,
            growth,
            growth_efficiency,
            cpu_cores: rt.cores,
            memory_bytes: m.memory_bytes,
            requested_cores: self.spec.reserve_cores.then(|| rt.size.min(self.max_cores)),
            requested_memory_bytes: Some(m.memory_bytes),
            epoch,
            max_epochs,
            epoch_seconds,
        }
    }

    /// Execute the migration requests of the last step (SpeCon's Algorithm 2 chooses).
    fn migrate_requested(&mut self, t: f64) {
        let requests = std::mem::take(&mut self.requests);
        for (w, j) in requests {
            let rt = &self.rt[j];
            if !self.spec.migrate
                || rt.no_more_migrations
                || rt.phase != Phase::Running
                || rt.worker != w
            {
                continue;
            }
            let request = self.request(j);
            let from = self.config.workers[w].name.clone();
            let target = self.specon.migration_target(&self.view, &request, w);
            match target {
                Ok(MigrationTarget::MoveTo(p))
                    if p.node != w && self.move_pays(j, w, p.node, t) =>
                {
                    self.converged.push(ConvergedJob {
                        job: request.id.clone(),
                        node: p.node,
                        marked_at: t,
                    });
                    self.move_job(j, w, p.node, p.gpus, t);
                }
                _ => {
                    self.converged.push(ConvergedJob {
                        job: request.id.clone(),
                        node: w,
                        marked_at: t,
                    });
                    self.rt[j].no_more_migrations = true;
                    self.migrations.push(MigrationRecord {
                        at: t,
                        job: request.id.clone(),
                        from,
                        to: None,
                        downtime: 0.0,
                    });
                }
            }
        }
    }

    /// Whether moving job `j` from worker `w` to `to` pays for its downtime (always, without
    /// `+pays`): the coordinator's rule, on what the coordinator would see (the job's last
    /// report, the nodes' use).
    fn move_pays(&self, j: usize, w: usize, to: usize, t: f64) -> bool {
        if !self.spec.pays {
            return true;
        }
        let id = &self.jobs[j].model.id;
        let (source, target) = (&self.view.nodes[w], &self.view.nodes[to]);
        let Some(job) = source.jobs().iter().find(|v| &v.id == id) else {
            return true;
        };
        let free = |n: &NodeView| (n.cores - n.cpu_used_cores).max(0.0);
        let remaining_s = match (job.epoch, job.max_epochs, job.epoch_seconds) {
            (Some(done), Some(all), Some(each)) => Some(all.saturating_sub(done) as f64 * each),
            _ => None,
        };
        let case = governor_placement::payoff::MoveCase {
            cores_now: job.cpu_cores,
            cores_wanted: job.requested_cores,
            source_free: free(source),
            target_free: free(target),
            memory_bytes: job.memory_bytes,
            remaining_s,
            ran_s: t - self.rt[j].first_start.unwrap_or(t),
        };
        let cost_s = self
            .config
            .migration
            .seconds(self.jobs[j].checkpoint_bytes());
        governor_placement::payoff::payoff(&case, cost_s, 2.0).pays
    }

    /// Checkpoint job `j` on worker `w` and restore it on `to` after the migration downtime.
    fn move_job(&mut self, j: usize, w: usize, to: usize, gpus: Vec<u32>, t: f64) {
        let request = self.request(j);
        let rt = &mut self.rt[j];
        rt.migrations += 1;
        if rt.migrations >= self.config.max_migrations_per_job {
            rt.no_more_migrations = true;
        }
        let downtime = self.restart_on(j, to, gpus, &request, t);
        self.migrations.push(MigrationRecord {
            at: t,
            job: request.id.clone(),
            from: self.config.workers[w].name.clone(),
            to: Some(self.config.workers[to].name.clone()),
            downtime,
        });
    }

    /// One round of SpeCon's Algorithm 3 (with `+rebalance`). A job moves at most
    /// `max_migrations_per_job` times in all ("containers in SpeCon will be reallocated at most
    /// once", §V-A): with the default of 1, Algorithm 3 moves only jobs Algorithm 2 left where
    /// they were. Jobs that need GPUs are not rebalanced.
    fn rebalance(&mut self, t: f64) {
        if !self.spec.rebalance {
            return;
        }
        let live: Vec<ConvergedJob> = self
            .converged
            .iter()
            .filter(|c| {
                self.index.get(&c.job).is_some_and(|&j| {
                    let rt = &self.rt[j];
                    rt.phase == Phase::Running
                        && rt.worker == c.node
                        && rt.migrations < self.config.max_migrations_per_job
                        && self.jobs[j].gpus == 0
                })
            })
            .cloned()
            .collect();
        self.converged = live;
        if self.converged.is_empty() {
            return;
        }
        let moves = {
            let engine = &*self;
            SpeCon::rebalance(&engine.view, &engine.converged, |job, node| {
                engine.index.get(job).is_some_and(|&j| {
                    feasible_nodes(&engine.view, &engine.request(j))
                        .is_ok_and(|fit| fit.contains(&node))
                })
            })
        };
        for m in moves {
            let Some(&j) = self.index.get(&m.job) else {
                continue;
            };
            if !self.move_pays(j, m.from, m.to, t) {
                continue;
            }
            self.converged.retain(|c| c.job != m.job);
            self.move_job(j, m.from, m.to, Vec::new(), t);
        }
    }

    fn result(&self) -> ClusterRun {
        let jobs: Vec<JobOutcome> = self
            .jobs
            .iter()
            .zip(&self.rt)
            .map(|(j, rt)| {
                let ttq = time_to_quality(&rt.written, Direction::Minimise);
                let gpu_energy = (j.gpus > 0 && rt.gpu_energy_j > 0.0).then_some(rt.gpu_energy_j);
                JobOutcome {
                    id: j.model.id.clone(),
                    submit: j.model.submit,
                    start: rt.first_start,
                    finish: rt.finish,
                    jct: rt.finish.map(|f| f - j.model.submit),
                    worker: rt.first_worker.map(|w| self.config.workers[w].name.clone()),
                    migrations: rt.migrations,
                    ttq,
                    priority: j.model.priority,
                    preemptions: rt.preemptions,
                    resizes: rt.resizes,
                    gpu_energy_j: gpu_energy,
                    gpu_energy_after_ttq_j: match (ttq, gpu_energy) {
                        (Some(q), Some(total)) => {
                            let k = rt.written.partition_point(|w| w.0 <= q);
                            let at_q = if k == 0 {
                                0.0
                            } else {
                                rt.gpu_energy_at_lines[k - 1]
                            };
                            Some(total - at_q)
                        }
                        _ => None,
                    },
                }
            })
            .collect();
        let ttqs: Vec<f64> = jobs.iter().filter_map(|j| j.ttq).collect();
        let avg_ttq = if ttqs.is_empty() {
            0.0
        } else {
            ttqs.iter().sum::<f64>() / ttqs.len() as f64
        };
        let jcts: Vec<f64> = jobs.iter().filter_map(|j| j.jct).collect();
        let avg_jct = if jcts.is_empty() {
            0.0
        } else {
            jcts.iter().sum::<f64>() / jcts.len() as f64
        };
        let first = self
            .jobs
            .iter()
            .map(|j| j.model.submit)
            .fold(f64::INFINITY, f64::min);
        let last = jobs
            .iter()
            .filter_map(|j| j.finish)
            .fold(f64::NEG_INFINITY, f64::max);
        let timelines = if self.config.record_timeline {
            self.workers
                .iter()
                .zip(&self.config.workers)
                .map(|(w, spec)| {
                    let mut by_job: Vec<(usize, Vec<(f64, f64)>)> = Vec::new();
                    for &(t, j, cores) in &w.timeline {
                        match by_job.iter_mut().find(|(k, _)| *k == j) {
                            Some((_, pts)) => pts.push((t, cores)),
                            None => by_job.push((j, vec![(t, cores)])),
                        }
                    }
                    WorkerTimeline {
                        worker: spec.name.clone(),
                        cores: spec.cores,
                        jobs: by_job
                            .into_iter()
                            .map(|(j, pts)| (self.jobs[j].model.id.clone(), pts))
                            .collect(),
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        ClusterRun {
            policy: self.spec.name.clone(),
            avg_jct,
            avg_ttq,
            makespan: if last.is_finite() { last - first } else { 0.0 },
            unfinished: jobs.iter().filter(|j| j.finish.is_none()).count(),
            jobs,
            decisions: self.decisions,
            placements: self.placements,
            migrations: self.migrations.clone(),
            events: self.events,
            timelines,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobModel, LossCurve, Speedup};
    use crate::node::{NodeConfig, run_node};
    use crate::trace::TRACE_VERSION;
    use crate::workload::{WorkloadParams, generate};

    const GIB: u64 = 1 << 30;

    fn job(id: &str, submit: f64, work: f64, parallelism: f64) -> TraceJob {
        TraceJob::new(JobModel {
            id: id.into(),
            submit,
            work,
            parallelism,
            speedup: Speedup::Linear,
            loss: LossCurve::Exponential {
                initial: 2.0,
                floor: 0.1,
                rate: 4.0,
            },
            noise: 0.0,
            log_every: LogEvery::Work { fraction: 0.1 },
            reports_total: true,
            memory_bytes: GIB,
            priority: 0,
            startup: 0.0,
            quiet: Vec::new(),
            finish: None,
            sweep: None,
        })
    }

    fn trace(jobs: Vec<TraceJob>) -> Trace {
        Trace {
            version: TRACE_VERSION,
            description: String::new(),
            generator: None,
            jobs,
        }
    }

    fn spec(s: &str) -> PolicySpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * a.abs().max(1.0)
    }

    #[test]
    fn one_worker_reproduces_the_single_node_simulator_for_every_policy() {
        for seed in 1..=3 {
            let jobs = generate(&WorkloadParams {
                jobs: 6,
                cores: 4.0,
                seed,
                ..WorkloadParams::default()
            });
            let t = trace(jobs.iter().cloned().map(TraceJob::new).collect());
            // Memory large enough that no job waits for it: the single-node simulator does not
            // model memory.
            let mut config = ClusterConfig::homogeneous(1, 4.0, 1024 * GIB, 0);
            config.start_delay = 0.0;
            for name in governor_policy::POLICY_NAMES {
                let node = run_node(
                    &jobs,
                    &NodeConfig {
                        cores: 4.0,
                        ..NodeConfig::default()
                    },
                    governor_policy::by_name(name).unwrap().as_mut(),
                    seed,
                );
                let cluster = run_cluster(
                    &t,
                    &config,
                    &spec(&format!("{name}/spread+no-migrate")),
                    seed,
                )
                .unwrap();
                for (n, c) in node.jobs.iter().zip(&cluster.jobs) {
                    let (Some(a), Some(b)) = (n.finish, c.finish) else {
                        panic!("{name} seed {seed}: {n:?} vs {c:?}");
                    };
                    assert!(
                        close(a, b),
                        "{name} seed {seed} {}: node {a} vs cluster {b}",
                        n.id
                    );
                }
                assert_eq!(node.decisions, cluster.decisions, "{name} seed {seed}");
            }
        }
    }

    #[test]
    fn a_tiny_trace_has_the_answer_worked_out_by_hand() {
        // One worker, 2 cores, fair sharing, no start delay. a (work 100, 2 threads) starts at 0
        // alone: 2 cores. b (work 50, 1 thread) arrives at 20: b gets 1 core, a the other
        // (water-filling: both saturate at level 1). At 20, a has done 40; at 70 b finishes
        // (50 s on 1 core), a has done 40 + 50 = 90; a alone again on 2 cores: 10 left, 5 s.
        let t = trace(vec![job("a", 0.0, 100.0, 2.0), job("b", 20.0, 50.0, 1.0)]);
        let mut config = ClusterConfig::homogeneous(1, 2.0, 16 * GIB, 0);
        config.start_delay = 0.0;
        let run = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
        assert!(close(run.jobs[0].finish.unwrap(), 75.0), "{:?}", run.jobs);
        assert!(close(run.jobs[1].finish.unwrap(), 70.0), "{:?}", run.jobs);
        assert!(close(run.avg_jct, (75.0 + 50.0) / 2.0));
        assert!(close(run.makespan, 75.0));
        // With a start delay each job starts (and so finishes) that much later.
        config.start_delay = 1.0;
        let run = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
        assert!(close(run.jobs[0].finish.unwrap(), 76.0), "{:?}", run.jobs);
        assert!(close(run.jobs[1].finish.unwrap(), 71.0), "{:?}", run.jobs);
    }

    #[test]
    fn spread_puts_concurrent_jobs_on_different_workers() {
        let t = trace(vec![
            job("a", 0.0, 100.0, 2.0),
            job("b", 0.5, 100.0, 2.0),
            job("c", 0.7, 100.0, 2.0),
        ]);
        let mut config = ClusterConfig::homogeneous(3, 2.0, 16 * GIB, 0);
        config.start_delay = 0.0;
        let run = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
        let workers: Vec<_> = run.jobs.iter().map(|j| j.worker.clone().unwrap()).collect();
        assert_eq!(workers, ["w01", "w02", "w03"], "{run:?}");
        for j in &run.jobs {
            assert!(close(j.jct.unwrap(), 50.0), "{j:?}");
        }
    }

    #[test]
    fn reserving_cores_queues_jobs_instead_of_sharing() {
        // FIFO with reservations on one 2-core worker: b waits until a is done.
        let t = trace(vec![job("a", 0.0, 100.0, 2.0), job("b", 10.0, 100.0, 2.0)]);
        let mut config = ClusterConfig::homogeneous(1, 2.0, 16 * GIB, 0);
        config.start_delay = 0.0;
        let fifo = run_cluster(&t, &config, &spec("fifo"), 1).unwrap();
        assert!(close(fifo.jobs[0].finish.unwrap(), 50.0), "{fifo:?}");
        assert!(close(fifo.jobs[1].start.unwrap(), 50.0), "{fifo:?}");
        assert!(close(fifo.jobs[1].finish.unwrap(), 100.0), "{fifo:?}");
        // Sharing: both run from 10, a finishes at 10 + 80/1 = 90... b at 100.
        let fair = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
        assert!(close(fair.jobs[0].finish.unwrap(), 90.0), "{fair:?}");
        assert!(close(fair.jobs[1].finish.unwrap(), 100.0), "{fair:?}");
    }

    #[test]
    fn gpu_jobs_wait_for_whole_gpus() {
        let mut a = job("a", 0.0, 100.0, 1.0);
        a.gpus = 2;
        let mut b = job("b", 1.0, 100.0, 1.0);
        b.gpus = 1;
        let mut config = ClusterConfig::homogeneous(1, 8.0, 16 * GIB, 2);
        config.start_delay = 0.0;
        let run = run_cluster(&trace(vec![a, b]), &config, &spec("fair"), 1).unwrap();
        assert!(close(run.jobs[0].finish.unwrap(), 100.0));
        assert!(close(run.jobs[1].start.unwrap(), 100.0), "{run:?}");
        assert!(close(run.jobs[1].finish.unwrap(), 200.0), "{run:?}");
    }

    #[test]
    fn measured_move_costs_match_their_benchmarks() {
        let gib = 1u64 << 30;
        let fw = MigrationCost::by_name("framework").unwrap().seconds(gib);
        assert!(
            (3.5..4.5).contains(&fw),
            "framework, 1 GiB: {fw:.2} s (measured 3.9 s)"
        );
        let criu = MigrationCost::by_name("criu-tcg").unwrap().seconds(gib);
        assert!(
            (18.0..26.0).contains(&criu),
            "CRIU, 1 GiB: {criu:.2} s (measured 21.9 s)"
        );
        assert!(MigrationCost::by_name("teleport").is_none());
    }

    #[test]
    fn migration_costs_checkpoint_transfer_and_restore_in_proportion_to_the_checkpoint() {
        let cost = MigrationCost {
            fixed_seconds: 2.0,
            checkpoint_bytes_per_second: 1e9,
            transfer_bytes_per_second: 2e9,
            restore_bytes_per_second: 4e9,
        };
        assert!(close(cost.seconds(0), 2.0));
        assert!(close(cost.seconds(4_000_000_000), 2.0 + 4.0 + 2.0 + 1.0));
        assert!(cost.seconds(8 * GIB) > cost.seconds(4 * GIB));
    }

    /// Three workers: w01 hosts a converging job `slow` with two learners; SpeCon's monitor asks
    /// to move `slow`; Algorithm 2 sends it to the emptiest worker, where it restarts after its
    /// migration cost with its work kept.
    fn specon_cluster() -> (Trace, ClusterConfig) {
        let mut slow = job("slow", 0.0, 3000.0, 1.0);
        slow.model.loss = LossCurve::Exponential {
            initial: 1.0,
            floor: 0.5,
            rate: 60.0,
        };
        slow.model.log_every = LogEvery::Seconds { seconds: 5.0 };
        slow.checkpoint_bytes = Some(4_000_000_000);
        let mut learners = Vec::new();
        for (k, submit) in [(1, 0.1), (2, 0.2)] {
            let mut l = job(&format!("learner{k}"), submit, 3000.0, 1.0);
            // Loss falls by 1 - e^(-10/300) ≈ 3.3% per 30 s interval at a third of a core: above
            // SpeCon's α = 1%, so the learners stay progressing and `slow` has two learning
            // neighbours when it converges.
            l.model.loss = LossCurve::Exponential {
                initial: 1.0,
                floor: 0.0,
                rate: 10.0,
            };
            l.model.log_every = LogEvery::Seconds { seconds: 5.0 };
            learners.push(l);
        }
        let mut jobs = vec![slow];
        jobs.extend(learners);
        let mut config = ClusterConfig::homogeneous(3, 1.0, 16 * GIB, 0);
        config.start_delay = 0.0;
        config.migration = MigrationCost {
            fixed_seconds: 2.0,
            checkpoint_bytes_per_second: 1e9,
            transfer_bytes_per_second: 1e9,
            restore_bytes_per_second: 1e9,
        };
        (trace(jobs), config)
    }

    #[test]
    fn specon_migrates_a_converged_job_and_pays_for_it() {
        let (t, config) = specon_cluster();
        // Every job on w01 (first-fit), so the node has somewhere to send `slow`.
        let moved = run_cluster(&t, &config, &spec("specon/first-fit"), 1).unwrap();
        let m = moved
            .migrations
            .iter()
            .find(|m| m.job == "slow")
            .unwrap_or_else(|| panic!("no migration of slow: {moved:?}"));
        assert_eq!(m.from, "w01");
        assert_eq!(m.to.as_deref(), Some("w02"), "{m:?}");
        assert!(close(m.downtime, 2.0 + 3.0 * 4.0), "{m:?}");
        let slow = &moved.jobs[0];
        assert_eq!(slow.migrations, 1);
        // Never moved twice.
        assert_eq!(
            moved.migrations.iter().filter(|m| m.job == "slow").count(),
            1
        );
        // The same run with migration switched off keeps everyone on w01.
        let kept = run_cluster(&t, &config, &spec("specon/first-fit+no-migrate"), 1).unwrap();
        assert!(kept.migrations.is_empty());
        assert!(kept.jobs.iter().all(|j| j.migrations == 0));
        // Moving frees w01 for the learners (3 jobs on 1 core vs 2), and `slow` gets a core of
        // its own after its 14 s of downtime: everyone finishes sooner.
        for (a, b) in moved.jobs.iter().zip(&kept.jobs) {
            assert!(a.finish.unwrap() < b.finish.unwrap(), "{a:?} vs {b:?}");
        }
        // Its work is conserved: alone on w02 from (migration + downtime) it needs exactly the
        // work it had left.
        let at = m.at + m.downtime;
        assert!(slow.finish.unwrap() > at);
    }

    #[test]
    fn specon_rebalancing_moves_a_converged_job_to_a_worker_that_went_idle() {
        // Two workers of one core, spread by count: w01 gets a, c, e and w02 gets b, d, f.
        // `a` learns in its first tenth and barely after; everyone else keeps learning. When
        // `a` converges, Algorithm 2 keeps it (w01 scores 1 + 2 + 2 = 5, w02 2 + 2 + 2 = 6):
        // it enters D. b, d and f are short: once they are done w02 is idle, and Algorithm 3
        // sends `a` there.
        let learner = |id: &str, at: f64, work: f64| {
            let mut j = job(id, at, work, 1.0);
            j.model.loss = LossCurve::Exponential {
                initial: 2.0,
                floor: 0.0,
                rate: 1.0,
            };
            j.model.log_every = LogEvery::Work { fraction: 0.02 };
            j
        };
        let mut a = learner("a", 0.0, 900.0);
        a.model.loss = LossCurve::Exponential {
            initial: 2.0,
            floor: 0.5,
            rate: 40.0,
        };
        let jobs = vec![
            a,
            learner("b", 0.1, 300.0),
            learner("c", 0.2, 900.0),
            learner("d", 0.3, 300.0),
            learner("e", 0.4, 900.0),
            learner("f", 0.5, 300.0),
        ];
        let t = trace(jobs);
        let config = ClusterConfig::homogeneous(2, 1.0, 16 * GIB, 0);
        let plain = run_cluster(&t, &config, &spec("specon/spread"), 1).unwrap();
        assert!(
            plain.migrations.iter().all(|m| m.to.is_none()),
            "Algorithm 2 alone should keep every job: {:?}",
            plain.migrations
        );
        let rebalanced = run_cluster(&t, &config, &spec("specon/spread+rebalance"), 1).unwrap();
        let m = rebalanced
            .migrations
            .iter()
            .find(|m| m.to.is_some())
            .unwrap_or_else(|| panic!("no rebalancing move: {:?}", rebalanced.migrations));
        assert_eq!((m.job.as_str(), m.from.as_str()), ("a", "w01"), "{m:?}");
        assert_eq!(m.to.as_deref(), Some("w02"));
        let w02_done = ["b", "d", "f"]
            .iter()
            .map(|id| {
                rebalanced
                    .jobs
                    .iter()
                    .find(|j| j.id == *id)
                    .unwrap()
                    .finish
                    .unwrap()
            })
            .fold(0.0, f64::max);
        assert!(
            m.at >= w02_done - 1e-6,
            "moved at {} before w02 was idle at {w02_done}",
            m.at
        );
        // It moved once, and c and e on w01 finish sooner for it.
        assert_eq!(
            rebalanced
                .migrations
                .iter()
                .filter(|m| m.to.is_some())
                .count(),
            1
        );
        let finish =
            |r: &ClusterRun, id: &str| r.jobs.iter().find(|j| j.id == id).unwrap().finish.unwrap();
        assert!(finish(&rebalanced, "c") < finish(&plain, "c"));
        assert!(finish(&rebalanced, "e") < finish(&plain, "e"));
    }

    #[test]
    fn runs_are_deterministic_for_a_seed() {
        let jobs = generate(&WorkloadParams {
            jobs: 12,
            cores: 4.0,
            seed: 5,
            ..WorkloadParams::default()
        });
        let mut jobs: Vec<TraceJob> = jobs.into_iter().map(TraceJob::new).collect();
        for (k, j) in jobs.iter_mut().enumerate() {
            j.model.noise = 0.05;
            j.model.submit = k as f64 * 20.0;
        }
        let t = trace(jobs);
        let config = ClusterConfig::homogeneous(3, 4.0, 16 * GIB, 0);
        for s in ["fair", "flowcon", "specon", "procon", "fifo", "ours"] {
            let a = run_cluster(&t, &config, &spec(s), 7).unwrap();
            let b = run_cluster(&t, &config, &spec(s), 7).unwrap();
            assert_eq!(a, b, "{s}: two runs with the same seed differ");
            assert_eq!(a.unfinished, 0, "{s}");
        }
    }

    #[test]
    fn policy_specs_resolve_aliases_and_flags() {
        let s = spec("fifo");
        assert_eq!(
            (s.node.as_str(), s.placement.as_str()),
            ("fair", "first-fit")
        );
        assert!(s.reserve_cores);
        let s = spec("specon+no-migrate");
        assert_eq!(s.placement, "specon");
        assert!(!s.migrate);
        let s = spec("governor:floor=0.5/procon");
        assert_eq!(
            (s.node.as_str(), s.placement.as_str()),
            ("governor:floor=0.5", "procon")
        );
        assert_eq!(spec("ours").node, "governor");
        for bad in ["nope", "fair/nope", "fair+bogus", "bogus/spread"] {
            assert!(bad.parse::<PolicySpec>().is_err(), "{bad} accepted");
        }
    }
}
