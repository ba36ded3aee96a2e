//! The single-node simulator: jobs from a [`JobModel`] list share one node's cores under a real
//! [`NodePolicy`], driven exactly as the daemon drives it.
//!
//! The loop is event-driven on a simulated clock. Between events every job runs at the speed its
//! share of the node gives it; shares follow [`governor_policy::share::water_fill`], the same
//! cgroup v2 model `governor status` uses (weights work-conserving, `cpu.max` a hard cap, demand =
//! the job's parallelism). Events, in the order they are handled when they coincide:
//! 1. a job finishes its work: `job_removed` (its undelivered log lines are dropped);
//! 2. a job writes a log line (every [`LogEvery`] of work or of time): the line is delivered to the
//!    policy `progress_delay` later, as the daemon's inotify tailer would;
//! 3. a job arrives: `job_added`;
//! 4. a log line is delivered: `progress` (and `work_done` when the line carries "k/N");
//! 5. the usage sampler fires (every `usage_interval`, 1 s like the daemon): `usage` for every job;
//! 6. the policy's `next_decision_at` is reached.
//!
//! After any of these the policy's `decide` runs and its plan takes effect immediately (the
//! daemon's cgroup writes take microseconds). Log noise comes from one seeded RNG stream per job,
//! so every policy sees the same noise for the same log line.

use std::collections::BTreeMap;

use governor_policy::quality::{EarlyStop, time_to_quality};
use governor_policy::share::{ShareRequest, water_fill};
use governor_policy::sweep::{Outranked, Sweeps};
use governor_policy::{
    CpuAllocation, Direction, JobId, JobSpec, MoveRequest, NodePolicy, NodeResources,
    ProgressPoint, Usage,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::job::{JobModel, LogEvery};

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

struct Live {
    started: bool,
    finished: Option<f64>,
    done: f64,
    cpu: f64,
    /// Next log threshold: a fraction of the work (`Work`) or an absolute time (`Seconds`).
    next_log: f64,
    cores: f64,
    rng: ChaCha8Rng,
    move_requested_at: Option<f64>,
    timeline: Vec<(f64, f64)>,
    /// (seconds since submission, noiseless loss) of every log line written.
    written: Vec<(f64, f64)>,
    /// Quiet (no CPU demand) until then.
    quiet_until: f64,
    /// The next of the job's quiet phases.
    next_quiet: usize,
    /// Its finish rule, fed each log line as the policy sees it.
    early_stop: Option<EarlyStop>,
    stopped: Option<String>,
    /// Held by its sweep (at a rung, waiting for the other trials): the policy was told so.
    held: bool,
}

#[derive(Clone, Copy)]
struct Delivery {
    at: f64,
    job: usize,
    point: ProgressPoint,
    fraction: f64,
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

/// The trials a sweep's verdicts stop, with the daemon's reason.
fn cuts(outranked: Vec<Outranked<usize>>) -> Vec<(usize, String)> {
    outranked
        .into_iter()
        .map(|o| (o.trial, o.describe()))
        .collect()
}

/// Stop each job (with its reason) at `t`, and the trials its leaving cuts from its sweep.
fn stop_jobs(
    t: f64,
    mut work: Vec<(usize, String)>,
    live: &mut [Live],
    deliveries: &mut Vec<Delivery>,
    sweeps: &mut Sweeps<usize>,
    ids: &[JobId],
    policy: &mut dyn NodePolicy,
) {
    while let Some((j, why)) = work.pop() {
        let l = &mut live[j];
        if l.finished.is_some() {
            continue;
        }
        l.finished = Some(t);
        l.stopped = Some(why);
        policy.job_removed(t, &ids[j]);
        deliveries.retain(|d| d.job != j);
        work.extend(cuts(sweeps.leave(&j)));
    }
}

/// Relative tolerance when deciding that a job reached its work or a log threshold.
const EPS: f64 = 1e-9;

/// Run `jobs` on one node under `policy`. Deterministic for a given `seed` (the seed only drives
/// log noise).
pub fn run_node(
    jobs: &[JobModel],
    config: &NodeConfig,
    policy: &mut dyn NodePolicy,
    seed: u64,
) -> NodeRun {
    let node = NodeResources {
        cores: config.cores,
        memory_bytes: config.memory_bytes,
    };
    let ids: Vec<JobId> = jobs.iter().map(|j| JobId(j.id.clone())).collect();
    let mut live: Vec<Live> = jobs
        .iter()
        .enumerate()
        .map(|(i, job)| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(i as u64 + 1);
            Live {
                started: false,
                finished: None,
                done: 0.0,
                cpu: 0.0,
                next_log: 0.0,
                cores: 0.0,
                rng,
                move_requested_at: None,
                timeline: Vec::new(),
                written: Vec::new(),
                quiet_until: f64::NEG_INFINITY,
                next_quiet: 0,
                early_stop: job.finish.map(|r| EarlyStop::new(r, Direction::Minimise)),
                stopped: None,
                held: false,
            }
        })
        .collect();
    let mut arrivals: Vec<usize> = (0..jobs.len()).collect();
    arrivals.sort_by(|&a, &b| jobs[a].submit.total_cmp(&jobs[b].submit).then(a.cmp(&b)));
    let mut next_arrival = 0;
    let mut deliveries: Vec<Delivery> = Vec::new();
    let mut allocations: BTreeMap<JobId, CpuAllocation> = BTreeMap::new();
    let mut next_decision: Option<f64> = None;
    let mut move_requests = Vec::new();
    let mut decisions = 0u64;
    let mut decision_log = Vec::new();
    let mut idle_core_seconds = 0.0;
    let first_submit = arrivals.first().map_or(0.0, |&i| jobs[i].submit.max(0.0));
    let mut t = first_submit;
    let mut next_usage = t;
    let mut sweeps: Sweeps<usize> = Sweeps::default();

    loop {
        let active: Vec<usize> = (0..jobs.len())
            .filter(|&i| live[i].started && live[i].finished.is_none())
            .collect();
        if active.is_empty() && next_arrival == arrivals.len() {
            break;
        }

        // Shares and speeds under the current allocations.
        let requests: Vec<ShareRequest> = active
            .iter()
            .map(|&i| {
                let a = allocations
                    .get(&ids[i])
                    .copied()
                    .unwrap_or(CpuAllocation::DEFAULT);
                ShareRequest {
                    weight: a.weight,
                    max_cores: a.max_cores,
                    demand: if live[i].quiet_until > t + EPS {
                        0.0
                    } else {
                        jobs[i].parallelism
                    },
                }
            })
            .collect();
        let mut shares = water_fill(config.cores, &requests);
        let enforcement = config.enforcement.clamp(0.0, 1.0);
        if enforcement < 1.0 {
            let equal: Vec<ShareRequest> = requests
                .iter()
                .map(|r| ShareRequest {
                    weight: CpuAllocation::DEFAULT.weight,
                    ..*r
                })
                .collect();
            let fair = water_fill(config.cores, &equal);
            for (s, f) in shares.iter_mut().zip(fair) {
                *s = enforcement * *s + (1.0 - enforcement) * f;
            }
        }
        for (&i, &cores) in active.iter().zip(&shares) {
            if config.record_timeline
                && live[i]
                    .timeline
                    .last()
                    .is_none_or(|&(_, c)| (c - cores).abs() > 1e-9)
            {
                live[i].timeline.push((t, cores));
            }
            live[i].cores = cores;
        }
        let wanted: f64 = requests
            .iter()
            .map(|r| r.demand)
            .sum::<f64>()
            .min(config.cores);
        let used: f64 = shares.iter().sum();

        // The next event.
        let mut t_next = f64::INFINITY;
        if let Some(&i) = arrivals.get(next_arrival) {
            t_next = t_next.min(jobs[i].submit.max(t));
        }
        for &i in &active {
            let speed = jobs[i].speed(live[i].cores);
            if speed > 0.0 {
                t_next = t_next.min(t + (jobs[i].work - live[i].done).max(0.0) / speed);
                if let LogEvery::Work { .. } = jobs[i].log_every {
                    let target = jobs[i].log_at(live[i].next_log);
                    t_next = t_next.min(t + (target - live[i].done).max(0.0) / speed);
                }
                if let Some(q) = jobs[i].quiet.get(live[i].next_quiet) {
                    t_next = t_next.min(t + (q.after - live[i].done).max(0.0) / speed);
                }
            }
            if let LogEvery::Seconds { .. } = jobs[i].log_every {
                t_next = t_next.min(live[i].next_log.max(t));
            }
            if live[i].quiet_until > t {
                t_next = t_next.min(live[i].quiet_until);
            }
        }
        for d in &deliveries {
            t_next = t_next.min(d.at.max(t));
        }
        if !active.is_empty() {
            t_next = t_next.min(next_usage.max(t));
            if let Some(at) = next_decision {
                t_next = t_next.min(at.max(t));
            }
        }
        if !t_next.is_finite() {
            break;
        }
        let stop = t_next > config.horizon;
        let t_next = t_next.min(config.horizon);

        // Run everyone until then.
        let dt = t_next - t;
        for &i in &active {
            live[i].done += jobs[i].speed(live[i].cores) * dt;
            live[i].cpu += live[i].cores * dt;
        }
        idle_core_seconds += (wanted - used).max(0.0) * dt;
        t = t_next;
        if stop {
            break;
        }

        // Events at t.
        let mut changed = false;
        for &i in &active {
            if jobs[i].work - live[i].done <= EPS * jobs[i].work.max(1.0) {
                live[i].done = jobs[i].work;
                live[i].finished = Some(t);
                policy.job_removed(t, &ids[i]);
                deliveries.retain(|d| d.job != i);
                changed = true;
                // A rung that waited only for it is judged now.
                let stops = cuts(sweeps.leave(&i));
                stop_jobs(
                    t,
                    stops,
                    &mut live,
                    &mut deliveries,
                    &mut sweeps,
                    &ids,
                    policy,
                );
            }
        }
        for &i in &active {
            if live[i].finished.is_some() {
                continue;
            }
            let job = &jobs[i];
            if live[i].quiet_until <= t + EPS {
                if let Some(q) = job.quiet.get(live[i].next_quiet)
                    && live[i].done >= q.after - EPS * job.work.max(1.0)
                {
                    live[i].quiet_until = t + q.seconds.max(0.0);
                    live[i].next_quiet += 1;
                    changed = true;
                } else if live[i].quiet_until > f64::NEG_INFINITY {
                    live[i].quiet_until = f64::NEG_INFINITY;
                    changed = true;
                }
            }
            match job.log_every {
                LogEvery::Work { fraction } => {
                    let step = fraction.max(1e-6);
                    while live[i].next_log < 1.0 - EPS
                        && live[i].done >= job.log_at(live[i].next_log) - EPS * job.work.max(1.0)
                    {
                        let x = live[i].next_log;
                        let value = job.logged_loss(x, &mut live[i].rng);
                        live[i].written.push((t - job.submit, job.loss.value(x)));
                        deliveries.push(Delivery {
                            at: t + config.progress_delay,
                            job: i,
                            point: ProgressPoint {
                                at: t + config.progress_delay,
                                value,
                                new_segment: false,
                            },
                            fraction: x,
                        });
                        live[i].next_log += step;
                    }
                }
                LogEvery::Seconds { seconds } => {
                    let step = seconds.max(1e-3);
                    while live[i].next_log <= t + EPS {
                        live[i].next_log += step;
                        if job.starting(live[i].done) {
                            // Nothing is logged before the training starts.
                            continue;
                        }
                        let x = job.training_fraction(live[i].done);
                        let value = job.logged_loss(x, &mut live[i].rng);
                        live[i].written.push((t - job.submit, job.loss.value(x)));
                        deliveries.push(Delivery {
                            at: t + config.progress_delay,
                            job: i,
                            point: ProgressPoint {
                                at: t + config.progress_delay,
                                value,
                                new_segment: false,
                            },
                            fraction: x,
                        });
                    }
                }
            }
        }
        while let Some(&i) = arrivals.get(next_arrival) {
            if jobs[i].submit > t + EPS {
                break;
            }
            next_arrival += 1;
            let job = &jobs[i];
            live[i].started = true;
            live[i].next_log = match job.log_every {
                LogEvery::Work { fraction } => fraction.max(1e-6),
                LogEvery::Seconds { seconds } => t + seconds.max(1e-3),
            };
            policy.job_added(
                t,
                &JobSpec {
                    priority: job.priority,
                    ..JobSpec::new(job.id.clone())
                },
            );
            if let Some(trial) = &job.sweep {
                sweeps.join(
                    &trial.sweep,
                    trial.rule,
                    Direction::Minimise,
                    i,
                    job.declared_epochs(),
                );
            }
            changed = true;
        }
        let mut due: Vec<Delivery> = Vec::new();
        deliveries.retain(|d| {
            if d.at <= t + EPS {
                due.push(*d);
                false
            } else {
                true
            }
        });
        for d in due {
            if live[d.job].finished.is_some() {
                continue;
            }
            policy.progress(t, &ids[d.job], d.point);
            if jobs[d.job].reports_total {
                policy.work_done(t, &ids[d.job], d.fraction);
            }
            changed = true;
            // The daemon stops a job as it reads the line that says so (SIGINT); its exit is
            // taken as immediate: the rest of its work is never done.
            // Both rules see every value, as in the daemon (its finish rule first).
            let mut stops = match jobs[d.job].epochs_at(d.fraction) {
                Some(epochs) => cuts(sweeps.observe(&d.job, epochs, d.point.value)),
                None => Vec::new(),
            };
            if live[d.job]
                .early_stop
                .as_mut()
                .is_some_and(|s| s.observe(d.point.value))
            {
                // Last in, first stopped: its reason is "converged".
                stops.push((d.job, "converged".to_owned()));
            }
            stop_jobs(
                t,
                stops,
                &mut live,
                &mut deliveries,
                &mut sweeps,
                &ids,
                policy,
            );
        }
        // Trials at a rung waiting for the others are served last, as the daemon holds them.
        for i in 0..jobs.len() {
            let held =
                live[i].started && live[i].finished.is_none() && sweeps.waiting_at(&i).is_some();
            if held != live[i].held {
                live[i].held = held;
                policy.hold(t, &ids[i], held);
                changed = true;
            }
        }
        if t >= next_usage - EPS {
            for &i in &active {
                if live[i].finished.is_none() {
                    policy.usage(
                        t,
                        &ids[i],
                        Usage {
                            at: t,
                            cpu_seconds: live[i].cpu,
                            memory_bytes: jobs[i].memory_bytes,
                            memory_pressure_events: 0,
                            cpu_wait_seconds: None,
                        },
                    );
                }
            }
            while next_usage <= t + EPS {
                next_usage += config.usage_interval.max(1e-3);
            }
            changed = true;
        }
        if next_decision.is_some_and(|at| at <= t + EPS) {
            changed = true;
        }
        if changed {
            let plan = policy.decide(t, &node);
            decisions += 1;
            if config.record_decisions {
                for (id, a) in &plan.allocations {
                    decision_log.push((
                        t,
                        id.0.clone(),
                        a.cpu.weight,
                        a.cpu.max_cores,
                        a.reason.clone(),
                    ));
                }
            }
            allocations = plan
                .allocations
                .into_iter()
                .map(|(id, a)| (id, a.cpu))
                .collect();
            // A policy asking to be called "now" again would stall the clock.
            next_decision = plan.next_decision_at.map(|at| at.max(t + 1e-3));
            for m in plan.move_requests {
                if let Some(i) = ids.iter().position(|id| *id == m.job) {
                    live[i].move_requested_at.get_or_insert(t);
                }
                move_requests.push((t, m));
            }
        }
    }

    let results: Vec<JobResult> = jobs
        .iter()
        .zip(&live)
        .map(|(job, l)| JobResult {
            id: job.id.clone(),
            submit: job.submit,
            finish: l.finished,
            jct: l.finished.map(|f| f - job.submit),
            work: job.work,
            parallelism: job.parallelism,
            alone: job.alone_seconds(config.cores),
            cpu_seconds: l.cpu,
            move_requested_at: l.move_requested_at,
            ttq: time_to_quality(&l.written, Direction::Minimise),
            best_loss: l.written.iter().map(|w| w.1).reduce(f64::min),
            stopped: l.stopped.clone(),
            timeline: l.timeline.clone(),
        })
        .collect();
    let ttqs: Vec<f64> = results.iter().filter_map(|r| r.ttq).collect();
    let avg_ttq = if ttqs.is_empty() {
        0.0
    } else {
        ttqs.iter().sum::<f64>() / ttqs.len() as f64
    };
    let jcts: Vec<f64> = results.iter().filter_map(|r| r.jct).collect();
    let avg_jct = if jcts.is_empty() {
        0.0
    } else {
        jcts.iter().sum::<f64>() / jcts.len() as f64
    };
    let last_finish = results
        .iter()
        .filter_map(|r| r.finish)
        .fold(f64::NEG_INFINITY, f64::max);
    NodeRun {
        policy: policy.name().to_owned(),
        jobs: results,
        avg_jct,
        avg_ttq,
        makespan: if last_finish.is_finite() {
            last_finish - first_submit
        } else {
            0.0
        },
        idle_core_seconds,
        makespan_lower_bound: makespan_lower_bound(jobs, config.cores),
        decisions,
        move_requests,
        decision_log,
    }
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
