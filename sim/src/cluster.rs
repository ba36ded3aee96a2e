//! The cluster simulator: a trace's jobs arrive at the coordinator, which queues and places them
//! with a real [`PlacementPolicy`] and [`Queue`]; each worker runs its own real [`NodePolicy`]
//! instance, driven exactly as the daemon drives it; moves requested by a node policy are
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
//! - **Moves** (the papers' migrations). When a node policy's [`Plan::move_requests`] names a job,
//!   the coordinator runs SpeCon's Algorithm 2 ([`SpeCon::move_target`]). `Stay` marks the job
//!   as asked (it is not moved later); `MoveTo` stops it on its worker at once (its CPU is free, the source's
//!   policy sees `job_removed`), reserves the destination, and restarts it there after
//!   [`MoveDowntime::seconds`] of its checkpoint size with all its work kept (CRIU or a framework
//!   checkpoint). A job moves at most `max_moves_per_job` times (SpeCon marks a moved
//!   container and never moves it again). `allow_moves = false` ignores every request.
//! - **Preemption** (`+preempt`, the coordinator's rule: [`governor_placement::preempt`]).
//!   After each admission round, a waiting job that fits nowhere displaces the lower-priority
//!   jobs the rule picks on one node (run at least [`PREEMPT_MIN_RUN_S`] since their latest
//!   start, no GPUs, never preempted themselves: no chains). A displaced job stops at once with
//!   all its work kept (its checkpoint), goes back to the queue at the head of its priority, and
//!   pays [`MoveDowntime::seconds`] of its checkpoint when it starts again (save and restore).
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
//!
//! [`Plan::move_requests`]: governor_policy::Plan::move_requests

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use governor_placement::queue::{Queue, QueuedJob};
use governor_placement::specon::{ConvergedJob, SpeCon};
use governor_placement::{ClusterView, JobRequest, NodeView, PlacementPolicy};
use governor_policy::{Category, CpuAllocation, JobId, NodePolicy, NodeResources, ProgressPoint};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::baseline::placement_by_name;
use crate::job::LogEvery;
use crate::trace::{Trace, TraceJob};

mod config;
mod elastic;
mod moves;
mod policy_spec;
mod preempt;
mod results;
mod step;

pub use config::{ClusterConfig, MoveDowntime, WorkerSpec};
pub use policy_spec::{PREEMPT_MIN_RUN_S, PolicySpec, RESIZE_MIN_RUN_S};
pub use results::{ClusterRun, JobOutcome, MoveRecord, RunError, WorkerTimeline};

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
    moves: u32,
    no_more_moves: bool,
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
    moves: Vec<MoveRecord>,
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
                    moves: 0,
                    no_more_moves: false,
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
        moves: Vec::new(),
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
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
