//! `shortest-left` (formerly `governor`, a name still accepted): the default node policy until
//! [`learning-first`](crate::learning_first) replaced it (an order cannot promise to do no harm
//! to time to quality; see that module). Jobs
//! that are still learning and closest to done run first, at the speed they can use; no job is
//! let fall more than `slack` (10%) behind where the kernel's fair sharing would have it; every
//! job always keeps its floor.
//!
//! # What the measurements say (docs/evaluation/real-jobs.md)
//!
//! On this machine's cores, a TensorFlow/Keras or scikit-learn training process keeps about one
//! core busy however many it is offered (its steps are small; more threads wait on each other),
//! spends its first ~6 CPU-seconds starting (imports, data) without a log line, and logs one
//! line per epoch. Six such jobs on two cores under fair sharing each get a third of a core and
//! all finish together at the end; run two at a time instead, each at the full core it can use,
//! and the first pair finishes after a third of the time, the second after two thirds, the last
//! at the same time as under fair sharing. Processor sharing is the worst order for the average
//! completion when jobs are alike; the gain needs no knowledge of the loss at all, only
//! (1) an order, (2) each job's usable parallelism, so the cores a job cannot use go to the next
//! job in the order and not back to everyone, and (3) a guard so that jobs that arrive later or
//! are larger are not pushed back without bound.
//!
//! The guard projects completions in CPU-seconds with each job's measured usable parallelism,
//! and lets equal jobs be ordered: a guard that marks as late every job the fair makespan hangs
//! on would mark every job of a sweep (six alike jobs all end at the makespan) and fall back to
//! equal weights.
//!
//! # The algorithm
//!
//! **Per job** it learns from the daemon's events:
//! - *usable cores*: when a job uses clearly less than it was offered without its threads waiting
//!   for a CPU, it cannot use more for now (its demand limit). A limit is dropped as soon as the
//!   job waits for CPU (cgroup v2 `cpu.pressure`, v1 run delay, eBPF run-queue wait), and in any
//!   case after [`DEMAND_PROBE`] seconds if it is below the job's fair share (a job that was
//!   quiet, loading data, is never locked out), after [`LONG_PROBE`] otherwise;
//! - *remaining work*, in CPU-seconds, where the job's size is known (its log says epoch k of N,
//!   or it declared its epochs): the CPU it spent per fraction of its work since its first
//!   report, times the fraction left. A job whose size is unknown has none;
//! - its *learning stage* from its progress signal ([`LossTracker`]): progressing, watching,
//!   converged (shown by `governor status`);
//! - its *fair twin*: the CPU-seconds it would have had so far under the kernel's fair sharing
//!   with the same usable cores (advanced at every decision).
//!
//! **Order** (first served first): jobs the guard promoted (earliest fair deadline first); then
//! by operator priority; then jobs still learning before jobs that converged (`learning_first`:
//! a job past its quality point has learnt what it will learn, and the cores it yields bring the
//! others to theirs sooner); then by remaining work, smallest first (or, size unknown, by CPU
//! attained so far, least first: newcomers first); ties by arrival. A job overtakes its
//! neighbour only when its key is smaller by the hysteresis, or, within it, when it still learns
//! and the neighbour's learning slowed down (watching).
//!
//! **Division**: in that order each job is given the cores it can use, until none are left; every
//! job keeps at least its floor, `floor` × its equal share of the node. The targets become
//! `cpu.weight`s proportional to them, so the kernel hands any core a job does not use to the
//! others (work-conserving: no cap, no idle core).
//!
//! **Guard**: for jobs of known size, the plan is projected forward (no further arrivals, the
//! order recomputed at each completion), and so is fair sharing from the fair twins' positions.
//! A job projected to finish later than its fair completion by more than `slack` × its fair
//! completion time is promoted to the front (earliest fair deadline first) until, projected
//! without its own promotion, it is back within half of that. A job of unknown size cannot be
//! projected: it is promoted while it has had less than `1 - slack` of its fair twin's CPU
//! (with a grace of `lag_grace` CPU-seconds), so it is never much more than 10% behind fair
//! sharing at any moment. Projections cannot see future arrivals: the bound is a target, and
//! docs/evaluation/real-jobs.md reports how often it held.
//!
//! # Parameters (`--policy shortest-left:KEY=VALUE`)
//!
//! `floor` (0.1), `slack` (0.1), `hysteresis` (0.1), `smoothing` (0.5, EWMA weight of each loss
//! value for the stage), `interval` (1 s between decisions when nothing happens),
//! `learning_first` (true), `guard` (true), `lag_grace` (2 CPU-seconds), `pace_learning` (false:
//! hold every job still learning, whatever its size, to the pace guard of jobs of unknown size),
//! `probe_offer` (every
//! core: a job whose demand is unknown again may be given the whole node; a number: that many
//! times its fair share at most, until the long probe lifts it).

use std::collections::{BTreeMap, BTreeSet};

use super::ParamError;
use super::share::{ShareRequest, fair_shares, water_fill};
use super::stage::{LossTracker, StageThresholds};
use super::{
    Allocation, Category, CpuAllocation, JobId, JobSpec, MemoryAllocation, NodePolicy,
    NodeResources, Plan, ProgressPoint, Seconds, Usage, clamp_cores,
};

mod job;
mod projection;

use crate::work::Work;
use job::{Demand, Job};
use projection::{SimJob, greedy_targets, plan_shares, project, weight_of};

/// A demand limit below the job's fair share is forgotten after this many seconds (the probe):
/// a job that was quiet (loading data, waiting for a file, compiling) and then needs CPU is
/// offered its share again within it, even on a node that cannot measure CPU wait.
pub const DEMAND_PROBE: Seconds = 2.0;

/// A demand limit at or above the job's fair share is re-checked after this long: it cannot
/// lock the job out, and each re-check takes the next job's cores for a moment.
pub const LONG_PROBE: Seconds = 20.0;

/// Waiting for a CPU for more than this fraction of an interval, while getting less than its
/// fair share, is unmet demand: the job could use more than it got, so no demand limit holds
/// it. (A job at or above its fair share that still uses less than it is offered is limited by
/// its own parallelism, whatever its spare threads wait for: a TensorFlow job's thread pools
/// always have threads waiting.)
pub const UNMET_DEMAND: f64 = 0.1;

/// Ranked by CPU attained (size unknown), a job overtakes another only when it has had this many
/// CPU-seconds less: least-attained-first in quanta, so alike newcomers start one after another
/// instead of all together (a start-up, imports and data, costs ~6 CPU-seconds here).
pub const ATTAINED_QUANTUM: f64 = 5.0;

/// The shortest-left policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShortestLeftParams {
    /// Every job gets at least this fraction of its equal share of the node.
    pub floor: f64,
    /// The guard's bound: no job to finish later than its fair completion by more than this
    /// fraction of its fair completion time.
    pub slack: f64,
    /// A job overtakes another only when its key is smaller by this fraction.
    pub hysteresis: f64,
    /// EWMA weight of each new loss value (the learning stage).
    pub smoothing: f64,
    /// Re-decide at least this often, seconds.
    pub interval: Seconds,
    /// Jobs still learning go before jobs whose learning slowed down or stopped.
    pub learning_first: bool,
    /// The fairness guard (off: pure order, for measurements).
    pub guard: bool,
    /// CPU-seconds a job of unknown size may lag its fair twin before the slack applies.
    pub lag_grace: f64,
    /// Hold every job still learning (not `behind`: not converged) to the pace guard of jobs of
    /// unknown size, known size or not: promoted while it has had less than `1 - slack` of its
    /// fair twin's CPU. The completion guard protects a job's JCT; a job that reaches its
    /// quality early can still be held back in its first epochs, its time to quality much
    /// later than under fair sharing (measured on `threads`: 1.50x). Off by default until
    /// measured on real runs.
    pub pace_learning: bool,
    /// What a job whose demand is unknown again (it waited for CPU below its fair share, or its
    /// low demand limit was probed) is offered: this many times its fair share. Infinite: every
    /// core its rank gives it (a job served first then takes the whole node for a moment and
    /// the weights flip).
    pub probe_offer: f64,
}

impl Default for ShortestLeftParams {
    fn default() -> Self {
        ShortestLeftParams {
            floor: 0.1,
            slack: 0.1,
            hysteresis: 0.1,
            smoothing: 0.5,
            interval: 1.0,
            learning_first: true,
            guard: true,
            lag_grace: 2.0,
            pace_learning: false,
            probe_offer: f64::INFINITY,
        }
    }
}

impl ShortestLeftParams {
    /// Set a parameter by name.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let num = |min: f64, max: f64| super::parse_number_in(key, value, min, max);
        match key {
            "floor" => self.floor = num(0.0, 1.0)?,
            "slack" => self.slack = num(0.0, 1000.0)?,
            "hysteresis" => self.hysteresis = num(0.0, 0.99)?,
            "smoothing" => self.smoothing = num(0.001, 1.0)?,
            "interval" => self.interval = num(0.001, 3600.0)?,
            "lag_grace" => self.lag_grace = num(0.0, 1e9)?,
            "probe_offer" => self.probe_offer = num(1.0, 1e9)?,
            "learning_first" => self.learning_first = super::parse_param(key, value)?,
            "guard" => self.guard = super::parse_param(key, value)?,
            "pace_learning" => self.pace_learning = super::parse_param(key, value)?,
            _ => return Err(ParamError::Unknown(key.to_owned())),
        }
        Ok(())
    }
}

/// Our policy.
#[derive(Debug)]
pub struct ShortestLeft {
    params: ShortestLeftParams,
    jobs: BTreeMap<JobId, Job>,
    next_seq: u64,
    /// The order of the previous decision (hysteresis starts from it).
    order: Vec<JobId>,
    last_decision: Option<Seconds>,
    cores: f64,
}

impl Default for ShortestLeft {
    fn default() -> Self {
        Self::new(ShortestLeftParams::default())
    }
}

impl ShortestLeft {
    pub fn new(params: ShortestLeftParams) -> Self {
        ShortestLeft {
            params,
            jobs: BTreeMap::new(),
            next_seq: 0,
            order: Vec::new(),
            last_decision: None,
            cores: 0.0,
        }
    }

    fn floor_cores(&self) -> f64 {
        self.params.floor.clamp(0.0, 1.0) * self.cores / (self.jobs.len().max(1) as f64)
    }

    /// Advance every fair twin to `now` at the shares fair sharing would give (usable cores as
    /// demand), and note the twins that finished.
    fn advance_fair_twins(&mut self, now: Seconds) {
        let Some(last) = self.last_decision else {
            return;
        };
        let dt = now - last;
        if dt <= 0.0 || self.jobs.is_empty() {
            return;
        }
        let cores = self.cores;
        let caps: Vec<f64> = self.jobs.values().map(|j| j.usable(cores)).collect();
        let shares = fair_shares(cores, &caps);
        for (job, s) in self.jobs.values_mut().zip(shares) {
            // A job offered at least its fair share got what fair sharing would have given it,
            // or could not use more: the twin follows what it used. Counting the full share
            // instead made a job that ran alone at the one core it can use look behind its twin
            // (which "had" both cores) and promoted every job, so that the order fell back to
            // fair deadlines and newcomers of unknown size sat at their floor.
            let used = (job.cpu_seconds - job.twin_mark).max(0.0);
            job.twin_mark = job.cpu_seconds;
            job.fair_ceiling += s * dt;
            let step = if job.offered >= 0.999 * s {
                used
            } else {
                s * dt
            };
            job.fair_cpu = (job.fair_cpu + step).min(job.fair_ceiling);
            if let Some(r) = job.work.remaining() {
                let total = job.cpu_seconds + r;
                if job.fair_done_at.is_none() && job.fair_cpu >= total {
                    let over = (job.fair_cpu - total) / s.max(1e-9);
                    job.fair_done_at = Some(now - over.min(dt));
                } else if job.fair_cpu < total {
                    // The size estimate grew past the twin: not done after all.
                    job.fair_done_at = None;
                }
            }
        }
    }

    /// Reopen the demand limits whose probe is due.
    fn expire_demand_limits(&mut self, now: Seconds) {
        let fair = self.cores / self.jobs.len().max(1) as f64;
        let offer = self.probe_limit(fair);
        for job in self.jobs.values_mut() {
            let d = &mut job.demand;
            if let (Some(limit), Some(at)) = (d.limit, d.limit_at) {
                let probe = if limit < fair {
                    DEMAND_PROBE
                } else {
                    LONG_PROBE
                };
                if now - at >= probe {
                    // A limit at or above the probe offer was the offer itself (or more): the
                    // long probe lifts it to every core.
                    d.reopen(now, offer.filter(|o| *o > limit));
                }
            }
        }
    }

    /// The demand limit of a job whose demand is unknown again (`probe_offer`), if any.
    fn probe_limit(&self, fair: f64) -> Option<f64> {
        let offer = self.params.probe_offer * fair;
        (offer.is_finite() && offer < self.cores).then_some(offer)
    }

    /// The ranking key of a job.
    fn key(&self, job: &Job) -> Key {
        let (work, attained) = match job.work.remaining() {
            Some(r) => (r, false),
            None => (job.cpu_seconds, true),
        };
        let class = job.class(self.params.learning_first);
        Key {
            class,
            neg_priority: -i64::from(job.spec.priority),
            work,
            attained,
            slowing: self.params.learning_first
                && class == 1
                && job.tracker.category() == Category::Watching,
        }
    }

    /// Jobs in serving order: by key, ties by arrival, starting from the previous order and
    /// letting a job overtake its neighbour only when its work key is smaller by the
    /// hysteresis (class and priority changes take effect at once).
    fn rank(&self) -> Vec<JobId> {
        self.rank_keyed().into_iter().map(|(id, _)| id).collect()
    }

    /// [`Self::rank`] with each job's key.
    fn rank_keyed(&self) -> Vec<(JobId, Key)> {
        let key_of = |id: &JobId| {
            let j = &self.jobs[id];
            (self.key(j), j.seq)
        };
        let mut order: Vec<(JobId, (Key, u64))> = self
            .order
            .iter()
            .filter(|id| self.jobs.contains_key(*id))
            .map(|id| (id.clone(), key_of(id)))
            .collect();
        let known: BTreeSet<JobId> = order.iter().map(|(id, _)| id.clone()).collect();
        let mut newcomers: Vec<(JobId, (Key, u64))> = self
            .jobs
            .keys()
            .filter(|id| !known.contains(*id))
            .map(|id| (id.clone(), key_of(id)))
            .collect();
        newcomers.sort_by(|a, b| cmp_keys(&a.1, &b.1, 0.0));
        for n in newcomers {
            let pos = order
                .iter()
                .position(|o| cmp_keys(&n.1, &o.1, 0.0).is_lt())
                .unwrap_or(order.len());
            order.insert(pos, n);
        }
        let h = self.params.hysteresis.clamp(0.0, 0.99);
        // Bubble passes: a neighbour swap needs a strictly better class/priority or a work key
        // smaller by the hysteresis.
        for _ in 0..order.len() {
            let mut swapped = false;
            for i in 1..order.len() {
                if cmp_keys(&order[i].1, &order[i - 1].1, h).is_lt() {
                    order.swap(i - 1, i);
                    swapped = true;
                }
            }
            if !swapped {
                break;
            }
        }
        order.into_iter().map(|(id, (key, _))| (id, key)).collect()
    }

    /// The guard: mark jobs at risk of finishing (or, size unknown, running) more than the
    /// slack behind fair sharing, and release those back within half of it.
    fn guard(&mut self, now: Seconds) {
        if !self.params.guard {
            for j in self.jobs.values_mut() {
                j.urgent = false;
            }
            return;
        }
        let slack = self.params.slack.max(0.0);
        // Jobs of unknown size: against their fair twin's CPU so far.
        let grace = self.params.lag_grace;
        let pace_learning = self.params.pace_learning;
        for j in self.jobs.values_mut() {
            if !(j.size_unknown() || (pace_learning && !j.behind)) {
                if j.lagging {
                    j.lagging = false;
                    j.urgent = false;
                }
                continue;
            }
            let behind = j.fair_cpu - j.cpu_seconds;
            j.lagging = if j.lagging {
                behind > grace + 0.5 * slack * j.fair_cpu
            } else {
                behind > grace + slack * j.fair_cpu
            };
            if j.size_unknown() || j.lagging {
                j.urgent = j.lagging;
            }
        }
        // Jobs of known size: projected completions.
        if !self.jobs.values().any(|j| j.work.remaining().is_some()) {
            return;
        }
        let ids: Vec<JobId> = self.jobs.keys().cloned().collect();
        let cores = self.cores;
        let sim: Vec<SimJob> = ids
            .iter()
            .map(|id| {
                let j = &self.jobs[id];
                SimJob {
                    remaining: j.work.remaining().unwrap_or(f64::INFINITY),
                    cap: j.usable(cores),
                }
            })
            .collect();
        // Fair completion of each job, from its twin's position.
        let fair_sim: Vec<SimJob> = ids
            .iter()
            .zip(&sim)
            .map(|(id, s)| {
                let j = &self.jobs[id];
                SimJob {
                    remaining: if s.remaining.is_finite() {
                        (j.cpu_seconds + s.remaining - j.fair_cpu).max(0.0)
                    } else {
                        f64::INFINITY
                    },
                    cap: s.cap,
                }
            })
            .collect();
        let fair_finish = project(cores, &fair_sim, |sub, _| {
            fair_shares(cores, &sub.iter().map(|s| s.cap).collect::<Vec<_>>())
        });
        // Each job's fair completion, and how late the plan may let it finish: promoted past
        // `slack` of its fair completion time, released once back within half of it.
        let bounds: Vec<(f64, f64)> = ids
            .iter()
            .zip(&fair_finish)
            .map(|(id, f)| {
                let j = &self.jobs[id];
                let fair_at = j.fair_done_at.unwrap_or(now + f);
                let span = (fair_at - j.submitted).max(0.0);
                (fair_at + slack * span, fair_at + 0.5 * slack * span)
            })
            .collect();
        let deadline: Vec<f64> = bounds.iter().map(|b| b.0).collect();
        let release: Vec<f64> = bounds.iter().map(|b| b.1).collect();
        let floor = self.floor_cores();
        let index: BTreeMap<&JobId, usize> =
            ids.iter().enumerate().map(|(i, id)| (id, i)).collect();
        // Add at-risk jobs until the plan puts nobody else at risk (each round promotes at least
        // one job, so at most n rounds).
        for _ in 0..ids.len() {
            let order: Vec<usize> = self.rank().iter().map(|id| index[id]).collect();
            let ours = self.project_plan(&sim, &order, floor);
            let mut promoted = false;
            for (i, id) in ids.iter().enumerate() {
                let j = self.jobs.get_mut(id).expect("listed");
                if !j.urgent && sim[i].remaining.is_finite() && now + ours[i] > deadline[i] {
                    j.urgent = true;
                    promoted = true;
                }
            }
            if !promoted {
                break;
            }
        }
        // Release promoted jobs that are back on time without their own promotion.
        for (i, id) in ids.iter().enumerate() {
            if !self.jobs[id].urgent || self.jobs[id].lagging || !sim[i].remaining.is_finite() {
                continue;
            }
            self.jobs.get_mut(id).expect("listed").urgent = false;
            let order: Vec<usize> = self.rank().iter().map(|id| index[id]).collect();
            let without = self.project_plan(&sim, &order, floor);
            if now + without[i] > release[i] {
                self.jobs.get_mut(id).expect("listed").urgent = true;
            }
        }
    }

    /// Projected completions (seconds from now) under the plan rule with `order`.
    fn project_plan(&self, sim: &[SimJob], order: &[usize], floor: f64) -> Vec<f64> {
        let cores = self.cores;
        project(cores, sim, |sub, live| {
            // `order` restricted to the live jobs, as positions in `sub`.
            let pos: BTreeMap<usize, usize> =
                live.iter().enumerate().map(|(k, &i)| (i, k)).collect();
            let sub_order: Vec<usize> = order.iter().filter_map(|i| pos.get(i).copied()).collect();
            plan_shares(cores, sub, &sub_order, floor)
        })
    }
}

/// A job's ranking key.
#[derive(Debug, Clone, Copy)]
struct Key {
    /// [`Job::class`]: promoted, learning, converged, held.
    class: u8,
    /// Operator priority, negated (higher first).
    neg_priority: i64,
    /// Remaining work, or (size unknown) CPU attained so far.
    work: f64,
    /// Whether `work` is CPU attained rather than remaining work.
    attained: bool,
    /// Its learning slowed down (watching) while it is still ranked with the learners.
    slowing: bool,
}

/// Compare ranking keys: class, then priority, then work (the later one must be smaller by
/// `h` of the larger, and by [`ATTAINED_QUANTUM`] where either is CPU attained, to count as
/// smaller), then arrival. Within the hysteresis a job still learning overtakes one whose
/// learning slowed: alike jobs served in turns hand the turn to the learner at once instead of
/// when the detector is sure the other converged (a slowing job stays in the learners' class,
/// so a "watching" that comes and goes on noisy losses only swaps near-equal neighbours).
fn cmp_keys(a: &(Key, u64), b: &(Key, u64), h: f64) -> std::cmp::Ordering {
    let (ka, sa) = *a;
    let (kb, sb) = *b;
    let (wa, wb) = (ka.work, kb.work);
    ka.class
        .cmp(&kb.class)
        .then(ka.neg_priority.cmp(&kb.neg_priority))
        .then_with(|| {
            let quantum = if h > 0.0 && (ka.attained || kb.attained) {
                ATTAINED_QUANTUM
            } else {
                1.0
            };
            let margin = (h * wa.abs().max(wb.abs())).max(if h > 0.0 { quantum } else { 0.0 });
            if wa < wb - margin {
                std::cmp::Ordering::Less
            } else if wb < wa - margin {
                std::cmp::Ordering::Greater
            } else if h > 0.0 {
                // Within the hysteresis: keep the current order (a is after b in the list),
                // unless a still learns and b slowed down.
                if !ka.slowing && kb.slowing {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Greater
                }
            } else {
                ka.slowing
                    .cmp(&kb.slowing)
                    .then(wa.total_cmp(&wb))
                    .then(sa.cmp(&sb))
            }
        })
}

impl NodePolicy for ShortestLeft {
    fn name(&self) -> &'static str {
        "shortest-left"
    }

    fn job_added(&mut self, now: Seconds, spec: &JobSpec) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.jobs.insert(
            spec.id.clone(),
            Job {
                spec: spec.clone(),
                submitted: now,
                seq,
                cpu_seconds: 0.0,
                last_usage: None,
                recent_cores: 0.0,
                demand: Demand::default(),
                work: Work::default(),
                tracker: LossTracker::new(
                    spec.direction,
                    self.params.smoothing,
                    StageThresholds::default(),
                ),
                quality_fed: false,
                fair_cpu: 0.0,
                fair_ceiling: 0.0,
                twin_mark: 0.0,
                offered: f64::INFINITY,
                fair_done_at: None,
                urgent: false,
                lagging: false,
                behind: false,
                held: false,
            },
        );
    }

    fn hold(&mut self, _now: Seconds, id: &JobId, held: bool) {
        if let Some(job) = self.jobs.get_mut(id) {
            job.held = held;
        }
    }

    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        self.jobs.remove(id);
        self.order.retain(|o| o != id);
    }

    fn progress(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        if let Some(job) = self.jobs.get_mut(id) {
            if point.new_segment {
                job.tracker.restart();
                job.quality_fed = false;
            }
            if !job.quality_fed {
                job.tracker.observe(now, point.value, job.cpu_seconds);
                job.update_behind();
            }
        }
    }

    fn quality(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        if let Some(job) = self.jobs.get_mut(id) {
            if !job.quality_fed || point.new_segment {
                // From now on the stage follows the validation loss (a loss: smaller is
                // better): a training loss that keeps falling on an overfitting model says
                // nothing about what it still learns.
                job.tracker = LossTracker::new(
                    super::Direction::Minimise,
                    self.params.smoothing,
                    StageThresholds::default(),
                );
                job.quality_fed = true;
            }
            job.tracker.observe(now, point.value, job.cpu_seconds);
            job.update_behind();
        }
    }

    fn usage(&mut self, now: Seconds, id: &JobId, usage: Usage) {
        let fair = if self.cores > 0.0 {
            self.cores / self.jobs.len().max(1) as f64
        } else {
            f64::INFINITY
        };
        let offer = self.probe_limit(fair);
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let d = &mut job.demand;
        if let Some((t0, cpu0)) = job.last_usage {
            let dt = now - t0;
            if dt > 0.0 {
                let cores = (usage.cpu_seconds - cpu0).max(0.0) / dt;
                job.recent_cores = cores;
                d.seen = d.seen.max(cores);
                // The kernel's own signal of unmet demand: its tasks waited for a CPU.
                let waited = match (usage.cpu_wait_seconds, d.last_wait) {
                    (Some(w), Some(w0)) => Some((w - w0).max(0.0) / dt),
                    _ => None,
                };
                if waited.is_some_and(|w| w > UNMET_DEMAND) && cores < 0.9 * fair {
                    // It wants more than it got, and got less than its fair share: what it used
                    // says nothing of its demand.
                    d.reopen(now, offer);
                } else if let Some(offered) = d.min_offered
                    && cores < 0.9 * offered
                {
                    // Clearly less than every plan of the interval offered it, without waiting:
                    // it cannot use more than it ever has, for now (see the probes).
                    d.limit = Some(d.seen.max(cores));
                    d.limit_at = Some(now);
                }
                if let Some(limit) = d.limit
                    && d.seen > limit
                {
                    d.limit = Some(d.seen);
                }
            }
        }
        d.last_wait = usage.cpu_wait_seconds;
        d.min_offered = None;
        job.last_usage = Some((now, usage.cpu_seconds));
        job.cpu_seconds = job.cpu_seconds.max(usage.cpu_seconds);
    }

    fn work_done(&mut self, now: Seconds, id: &JobId, fraction: f64) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if !fraction.is_finite() || fraction <= 0.0 {
            return;
        }
        // CPU at the report, extrapolated from the latest sample (up to a second old).
        let cpu = match job.last_usage {
            Some((t, cpu)) if now > t => cpu + job.recent_cores * (now - t),
            _ => job.cpu_seconds,
        };
        // A new run of the same job (counters went back) starts over.
        job.work.report(fraction, cpu);
    }

    fn decide(&mut self, now: Seconds, node: &NodeResources) -> Plan {
        self.cores = node.cores;
        self.advance_fair_twins(now);
        self.last_decision = Some(now);
        self.expire_demand_limits(now);
        self.guard(now);
        let (order, keys): (Vec<JobId>, Vec<Key>) = self.rank_keyed().into_iter().unzip();
        self.order = order.clone();
        let cores = self.cores;
        let floor = self.floor_cores();
        let sim: Vec<SimJob> = order
            .iter()
            .map(|id| SimJob {
                remaining: f64::INFINITY,
                cap: self.jobs[id].usable(cores),
            })
            .collect();
        let in_order: Vec<usize> = (0..order.len()).collect();
        let targets = greedy_targets(cores, &sim, &in_order, floor);
        let total: f64 = targets.iter().sum();
        let n = order.len();
        // Operator bounds: a minimum raises the target (a maximum is a cap, below).
        let targets: Vec<f64> = order
            .iter()
            .zip(&targets)
            .map(|(id, t)| t.max(self.jobs[id].spec.bounds.min_cores.unwrap_or(0.0)))
            .collect();
        let weights: Vec<u32> = targets
            .iter()
            .map(|t| weight_of(*t, total.max(targets.iter().sum()), n))
            .collect();
        // What the kernel will give each job under these weights (demand detection).
        let requests: Vec<ShareRequest> = order
            .iter()
            .zip(&weights)
            .map(|(id, w)| ShareRequest {
                weight: *w,
                max_cores: None,
                demand: self.jobs[id].demand.limit.unwrap_or(cores),
            })
            .collect();
        let expected = water_fill(cores, &requests);
        let mut allocations = BTreeMap::new();
        for (rank, ((id, weight), expected)) in
            order.iter().zip(&weights).zip(&expected).enumerate()
        {
            let job = self.jobs.get_mut(id).expect("ranked");
            job.offered = *expected;
            job.demand.min_offered = Some(
                job.demand
                    .min_offered
                    .map_or(*expected, |m| m.min(*expected)),
            );
            let work = match job.work.remaining() {
                Some(r) => format!("~{r:.0} CPU-s left"),
                None => format!("size unknown, {:.0} CPU-s so far", job.cpu_seconds),
            };
            let why = if job.held {
                "served after the others: at its sweep's rung".to_owned()
            } else if job.urgent {
                "promoted: behind its fair-share pace".to_owned()
            } else {
                let key = keys[rank];
                if key.class == 2 {
                    "converged: after the jobs still learning".to_owned()
                } else if key.slowing {
                    "learning slowed: its turn goes to the jobs still learning".to_owned()
                } else {
                    "in order".to_owned()
                }
            };
            let reason = format!(
                "shortest-left: #{} ({why}; {work}), ~{expected:.2} cores",
                rank + 1
            );
            allocations.insert(
                id.clone(),
                Allocation {
                    category: job.tracker.category(),
                    cpu: CpuAllocation {
                        weight: *weight,
                        max_cores: clamp_cores(None, &job.spec.bounds),
                    },
                    memory: MemoryAllocation::default(),
                    reason,
                },
            );
        }
        Plan {
            allocations,
            move_requests: Vec::new(),
            next_decision_at: (!self.jobs.is_empty()).then_some(now + self.params.interval),
        }
    }
}

#[cfg(test)]
#[path = "shortest_left_tests.rs"]
mod tests;
