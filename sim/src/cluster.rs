//! The cluster simulator: a trace's jobs are submitted to the coordinator's own planner
//! ([`governor_planner::ClusterState`], the code `coordinator` runs), which queues, places,
//! preempts, resizes and moves them with a real [`governor_placement::PlacementPolicy`]; each
//! worker runs its own real [`NodePolicy`] instance, driven exactly as the daemon drives it, and
//! reports to the planner as the daemon does. The simulator keeps no orchestration of its own:
//! it models time, the jobs and what the nodes do with the planner's commands
//! (`cluster/driver.rs`).
//!
//! # Model
//!
//! - **Workers** have cores, memory and whole GPUs ([`WorkerSpec`]).
//! - **Speed.** A job runs at `speedup(min(cores, parallelism))` units of work per second
//!   ([`crate::job::Speedup`], the single-node simulator's sub-linear curve); `work` is
//!   CPU-seconds on one core.
//! - **Shares.** On a worker, cores are divided by
//!   [`governor_policy::share::water_fill`]: the cgroup v2 semantics the daemon writes
//!   (`cpu.weight` work-conserving, `cpu.max` a hard cap, demand = the cores it starts with).
//! - **Observation.** A job writes a log line every [`crate::job::LogEvery`]; the line reaches the
//!   worker's policy `progress_delay` later (inotify + parse). Usage counters are sampled every
//!   `usage_interval` (the daemon's sampler). A worker reports to the planner at those ticks and
//!   at every change (a job started, ended or saved; a new move request), so the planner places
//!   on a view up to one interval old plus its own unreported placements.
//! - **The planner.** Submissions, reports and the coordinator's once-a-second tick go to
//!   [`ClusterState::handle`](governor_planner::ClusterState::handle), as the coordinator's
//!   server sends them; its configuration is [`planner_config`] (no node is ever lost, nothing
//!   times out; move requests acted on at the next tick; at most `max_moves_per_job` moves).
//!   Jobs submit what the daemon would: GPUs, memory, priority, cores when the policy reserves
//!   them (`+reserve`) or the job is elastic, and a framework checkpoint on a shared path.
//! - **Commands.** A start runs the job on its worker `start_delay` later, plus the restore part
//!   of [`MoveDowntime`] for a later attempt (after a move, a resize or a preemption). A save
//!   takes the job off its cores at once and reports it saved after the save part of
//!   [`MoveDowntime`] (all its work kept); the planner then starts it elsewhere, again with
//!   another size, or queues it again (preempted). A stop ends it.
//!
//! # Event order
//!
//! A global heap orders arrivals (first at equal times), worker steps, then the coordinator's
//! tick. A worker step advances its jobs to the step's time and then handles, in order:
//! finishes, quiet phases and log writes, checkpoints written, jobs starting, log lines
//! delivered (and the jobs its node stops at convergence or cuts from a sweep, the trials it
//! holds at a rung), the usage tick, the policy's own deadline; then asks the policy to
//! `decide`, applies the plan at once and reports.
//!
//! One node engine: [`crate::node::run_node`] is this engine with one worker
//! (`cluster/single.rs`), so a node's model (quiet phases, the kernel's enforcement, finish at
//! convergence, sweeps) is the same alone and in a cluster.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use governor_planner::ClusterState;
use governor_policy::quality::EarlyStop;
use governor_policy::sweep::Sweeps;
use governor_policy::{
    Category, CpuAllocation, Direction, JobId, MoveRequest, NodePolicy, NodeResources,
    ProgressPoint,
};
use governor_proto::node::NodeCommand;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::job::LogEvery;
use crate::trace::{Trace, TraceJob};

mod config;
mod driver;
mod policy_spec;
mod results;
mod single;
mod step;

pub use config::{ACTIVE_CORES, ClusterConfig, MoveDowntime, WorkerSpec};
pub use driver::{PlannerStep, planner_config};
pub use policy_spec::{PREEMPT_MIN_RUN_S, PolicySpec, RESIZE_MIN_RUN_S};
pub use results::{ClusterRun, JobOutcome, MoveRecord, RunError, WorkerTimeline};
pub(crate) use single::run_one_node;

/// Relative tolerance for "reached its work or a log threshold" (as in [`crate::node`]).
const EPS: f64 = 1e-9;

/// Seconds between the coordinator's ticks (its server ticks once a second).
const TICK_S: f64 = 1.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    NotSubmitted,
    /// In the planner's queue (first, or again after a preemption's save).
    Queued,
    /// A start arrived on `Rt::worker`, the job is not running yet.
    Starting,
    Running,
    /// Asked to save (a move, a resize, a preemption): off its cores, its checkpoint being
    /// written; `Rt::worker` reports it saved when done.
    Saving,
    /// Saved, waiting for the planner's next start.
    Saved,
    Done,
}

/// How a job left its worker, as the worker's next report says once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// Its work is done (exit status 0).
    Finished,
    /// It saved for the planner (exit status 0, `saved`).
    Saved,
    /// The planner stopped it.
    Stopped,
    /// Its node stopped it, as it asked (finish at convergence, cut from its sweep): complete.
    Converged,
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
    gpus: Vec<u32>,
    lines_seen: u64,
    last: Option<Observation>,
    previous: Option<Observation>,
    /// (seconds since submission, noiseless loss) of every log line written.
    written: Vec<(f64, f64)>,
    /// When it last started on a worker.
    last_start: f64,
    /// Cores it runs with: what its start says (an elastic job's current size, a reservation),
    /// else its parallelism.
    size: f64,
    /// The planner's id for it (`j1`, ...), once submitted.
    planner_id: String,
    /// Which start of the job runs (the planner's attempt number).
    attempt: u32,
    /// Its node policy asked to move it (kept, as the daemon keeps it, while it runs there).
    move_request: Option<String>,
    /// Its GPUs' power limit, a fraction of the default (1 without `+gpu-power`).
    gpu_limit: f64,
    /// GPU joules so far, and their value when each line of `written` was written (for the
    /// energy after its time to quality, which is one of those lines' times).
    gpu_energy_j: f64,
    gpu_energy_at_lines: Vec<f64>,
    /// Zeus's search of its GPUs' limit once it stopped learning (the daemon's `[gpu] slowdown`).
    gpu_search: Option<governor_policy::gpu_power::LimitSearch>,
    /// Quiet (no CPU demand) until then; the next of its quiet phases.
    quiet_until: f64,
    next_quiet: usize,
    /// Its finish rule, fed each log line as its node's policy sees it.
    early_stop: Option<EarlyStop>,
    /// Why its node stopped it before its work was done (converged, cut from its sweep).
    stopped: Option<String>,
    /// Held by its sweep at a rung (its node's policy was told so).
    held: bool,
    /// When its node's policy first asked to move it.
    move_requested_at: Option<f64>,
    /// `(time, cores)` at each change of its share (with `record_timeline`).
    timeline: Vec<(f64, f64)>,
    /// It started over (`+scratch`): its next log line begins a new run.
    restarted: bool,
    /// Its CPU-seconds per unit of work over what it would need alone on its worker
    /// ([`ClusterConfig::contention`]); 1 without contention.
    slowdown: f64,
}

impl Rt {
    /// Start again from scratch (`+scratch`: no checkpoint restored): its work, its log and its
    /// quiet phases start over, and the lines the lost run wrote no longer count towards its
    /// quality (their weights are gone). Its CPU-seconds so far stay spent.
    fn start_over(&mut self) {
        self.done = 0.0;
        self.log_started = false;
        self.next_log = 0.0;
        self.written.clear();
        self.gpu_energy_at_lines.clear();
        self.quiet_until = f64::NEG_INFINITY;
        self.next_quiet = 0;
        self.restarted = true;
    }

    /// Cores it wants at `t`: none while quiet, else what it runs with.
    fn demand(&self, t: f64) -> f64 {
        if self.quiet_until > t + EPS {
            0.0
        } else {
            self.size
        }
    }
}

#[derive(Clone, Copy)]
struct Delivery {
    at: f64,
    job: usize,
    point: ProgressPoint,
    obs: Observation,
}

struct Worker<'a> {
    policy: Box<dyn NodePolicy + 'a>,
    node: NodeResources,
    t: f64,
    /// Its session with the planner.
    session: u64,
    /// Running jobs, by trace index.
    running: Vec<usize>,
    /// `(start time, job)` of jobs the planner started here that are not running yet.
    arriving: Vec<(f64, usize)>,
    /// `(time its checkpoint is written, job)` of jobs saving here.
    saving: Vec<(f64, usize)>,
    /// Jobs that left since the last report, and how: reported once.
    ended: Vec<(usize, Ended)>,
    deliveries: Vec<Delivery>,
    next_usage: Option<f64>,
    next_decision: Option<f64>,
    version: u64,
    force_decide: bool,
    gpu_owner: Vec<Option<usize>>,
    timeline: Vec<(f64, usize, f64)>,
    /// Its sweeps: the daemon judges a sweep's trials on their node (one node on its own;
    /// in a cluster the planner judges them).
    sweeps: Sweeps<usize>,
    /// Core-seconds left idle while a job here could have used them.
    idle_core_seconds: f64,
}

#[derive(Clone, Copy, Debug)]
struct Ev {
    t: f64,
    /// 0: an arrival (job index); 1: a worker step (worker index); 2: the coordinator's tick.
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
    workers: Vec<Worker<'a>>,
    /// The coordinator's planner: the code `coordinator` runs.
    planner: ClusterState,
    /// Planner id -> trace index.
    by_planner_id: HashMap<String, usize>,
    /// Worker name -> index.
    by_worker_name: HashMap<String, usize>,
    heap: BinaryHeap<Reverse<Ev>>,
    /// The coordinator's next tick, when one is scheduled.
    next_tick: Option<f64>,
    max_cores: f64,
    decisions: u64,
    events: u64,
    /// Commands the planner gave that the nodes have not carried out yet.
    pending: Vec<(String, NodeCommand)>,
    /// One node run on its own (`node::run_node`): jobs declare no memory (a node does not queue
    /// for it).
    single_node: bool,
    /// Every decision, with `record_decisions`: `(time, job, weight, cap, reason)`.
    decision_log: Vec<(f64, String, u32, Option<f64>, String)>,
    /// Every move request a node policy made: `(time, request)`.
    move_requests: Vec<(f64, MoveRequest)>,
    /// Every input fed to the planner and the commands it gave back (same-trace test).
    recorded: Option<Vec<PlannerStep>>,
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
    run(trace, config, spec, seed, false).map(|(run, _)| run)
}

/// [`run_cluster`], also returning every input the planner was fed, at its time, and the
/// commands it answered with: the trace another driver of the planner must reproduce.
pub fn run_cluster_recorded(
    trace: &Trace,
    config: &ClusterConfig,
    spec: &PolicySpec,
    seed: u64,
) -> Result<(ClusterRun, Vec<PlannerStep>), RunError> {
    run(trace, config, spec, seed, true)
}

fn run(
    trace: &Trace,
    config: &ClusterConfig,
    spec: &PolicySpec,
    seed: u64,
    record: bool,
) -> Result<(ClusterRun, Vec<PlannerStep>), RunError> {
    if config.workers.is_empty() {
        return Err(RunError::NoWorkers);
    }
    let policies = config
        .workers
        .iter()
        .map(|_| governor_policy::by_spec(&spec.node).map_err(RunError::from))
        .collect::<Result<Vec<_>, RunError>>()?;
    let mut engine = Engine::new(trace, config, spec, seed, policies, false)?;
    engine.recorded = record.then(Vec::new);
    engine.start();
    engine.run();
    let run = engine.result();
    Ok((run, engine.recorded.take().unwrap_or_default()))
}

impl<'a> Engine<'a> {
    /// The engine for `trace` on `config`'s workers, each with its node policy (in worker
    /// order).
    fn new(
        trace: &'a Trace,
        config: &'a ClusterConfig,
        spec: &'a PolicySpec,
        seed: u64,
        policies: Vec<Box<dyn NodePolicy + 'a>>,
        single_node: bool,
    ) -> Result<Self, RunError> {
        let jobs = &trace.jobs;
        let workers = config
            .workers
            .iter()
            .zip(policies)
            .map(|(w, policy)| Worker {
                policy,
                node: NodeResources {
                    cores: w.cores,
                    memory_bytes: w.memory_bytes,
                },
                t: 0.0,
                session: 0,
                running: Vec::new(),
                arriving: Vec::new(),
                saving: Vec::new(),
                ended: Vec::new(),
                deliveries: Vec::new(),
                next_usage: None,
                next_decision: None,
                version: 0,
                force_decide: false,
                gpu_owner: vec![None; w.gpus as usize],
                timeline: Vec::new(),
                sweeps: Sweeps::default(),
                idle_core_seconds: 0.0,
            })
            .collect();
        let planner = ClusterState::new(driver::planner_config(config, spec), &spec.placement)?;
        Ok(Engine {
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
                        gpus: Vec::new(),
                        lines_seen: 0,
                        last: None,
                        previous: None,
                        written: Vec::new(),
                        last_start: 0.0,
                        size: jobs[i].model.parallelism,
                        planner_id: String::new(),
                        attempt: 0,
                        move_request: None,
                        gpu_limit: 1.0,
                        gpu_energy_j: 0.0,
                        gpu_energy_at_lines: Vec::new(),
                        gpu_search: None,
                        quiet_until: f64::NEG_INFINITY,
                        next_quiet: 0,
                        early_stop: jobs[i]
                            .model
                            .finish
                            .map(|r| EarlyStop::new(r, Direction::Minimise)),
                        stopped: None,
                        held: false,
                        move_requested_at: None,
                        timeline: Vec::new(),
                        restarted: false,
                        slowdown: 1.0,
                    }
                })
                .collect(),
            workers,
            planner,
            by_planner_id: HashMap::new(),
            by_worker_name: config
                .workers
                .iter()
                .enumerate()
                .map(|(i, w)| (w.name.clone(), i))
                .collect(),
            heap: BinaryHeap::new(),
            next_tick: None,
            max_cores: config.max_cores(),
            decisions: 0,
            events: 0,
            pending: Vec::new(),
            single_node,
            decision_log: Vec::new(),
            move_requests: Vec::new(),
            recorded: None,
        })
    }

    /// The workers join the planner and the trace's arrivals are scheduled.
    fn start(&mut self) {
        self.join_workers();
        for (i, j) in self.jobs.iter().enumerate() {
            self.heap.push(Reverse(Ev {
                t: j.model.submit,
                class: 0,
                idx: i,
                version: 0,
            }));
        }
    }
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
    let cpu = job.model.speed(rt.cores) / rt.slowdown;
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
                // Jobs still running ran until the horizon.
                for w in 0..self.workers.len() {
                    self.advance(w, self.config.horizon);
                }
                break;
            }
            match ev.class {
                0 => {
                    self.events += 1;
                    self.submit(ev.idx, ev.t);
                }
                1 => {
                    if ev.version != self.workers[ev.idx].version {
                        continue;
                    }
                    self.events += 1;
                    self.step(ev.idx, ev.t);
                }
                _ => {
                    self.events += 1;
                    self.next_tick = None;
                    self.tick(ev.t);
                }
            }
        }
    }

    /// The coordinator's next tick after `t`, unless one is scheduled (ticks run while jobs
    /// are in the cluster: they act on move requests, grow elastic jobs, admit).
    fn schedule_tick(&mut self, t: f64) {
        if self.next_tick.is_some() {
            return;
        }
        let at = ((t / TICK_S).floor() + 1.0) * TICK_S;
        self.next_tick = Some(at);
        self.heap.push(Reverse(Ev {
            t: at,
            class: 2,
            idx: 0,
            version: 0,
        }));
    }

    /// Whether any job is queued, starting, running or saving.
    fn jobs_in_cluster(&self) -> bool {
        self.rt
            .iter()
            .any(|r| !matches!(r.phase, Phase::NotSubmitted | Phase::Done))
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
        for &(at, _) in worker.arriving.iter().chain(&worker.saving) {
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
                if let Some(q) = m.quiet.get(rt.next_quiet) {
                    next = next.min(t + (q.after - rt.done).max(0.0) / speed);
                }
            }
            if let LogEvery::Seconds { .. } = m.log_every {
                next = next.min(rt.next_log.max(t));
            }
            if rt.quiet_until > t {
                next = next.min(rt.quiet_until);
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
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
