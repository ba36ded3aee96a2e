//! `governor`: our policy. It shortens the average job completion time by serving the jobs with
//! the least work left first where that costs no throughput, splits the rest of the node for
//! throughput, and guards every job against finishing much later than it would under the
//! kernel's fair sharing.
//!
//! # Where the gains can come from (and where they cannot)
//!
//! In the workload model this policy is built for, every job has a fixed amount of work (its
//! epochs); a job that has "converged" still runs to its last epoch. Total work is conserved, and
//! with the kernel's default sharing already work-conserving, a node policy can only gain by:
//! 1. **ordering**: serving jobs with the least remaining work first (SRPT) shortens the average
//!    completion time without delaying the total, as long as it does not waste cores;
//! 2. **efficiency**: with sub-linear speed-ups, a core is worth more to a job that scales well
//!    (or runs on less than one core) than to one that does not;
//! 3. **parallelism limits**: a job that cannot use more cores must not be counted as if it
//!    could (cgroup weights already give its unused share away).
//!
//! It cannot shorten the makespan much: single-node makespan is bounded below by the work and by
//! the longest job, and fair sharing is already within a few percent of that bound on the
//! workloads we measured (docs/evaluation.md). FlowCon's premise, giving cores to fast learners,
//! is the opposite of (1) when work is fixed: it favours young jobs, which have the most work
//! left, and its caps idle cores; measured, it lengthens the average completion time.
//!
//! # The algorithm
//!
//! **What it learns about each job.** The daemon's progress module reports, when a log line says
//! it ("epoch 3/10", "step 1200/5000"), the fraction of its work a job has done
//! ([`NodePolicy::work_done`]). From the fraction, the job's CPU time and the clock,
//! [`SpeedupFit`] learns the job's *size* in work units (seconds alone on one core) and its
//! Amdahl parallel fraction, so remaining work is comparable across jobs and independent of how
//! many cores each has had. A job that has not reported a position (a newcomer, or a log without
//! totals) is expected to need about as much again as the CPU time it has had (least attained
//! service first, as Tiresias does for jobs of unknown length), so newcomers run first and soon
//! show their size. From CPU usage it learns a job's *demand limit* when the job uses clearly less
//! than it was offered. The loss itself is smoothed and normalised ([`LossTracker`]) into the
//! job's category shown by `governor status`; it does not move cores (see "Measured choices").
//!
//! **Ranking.** Jobs are ranked by remaining work, smallest first (operator priority first of
//! all). A job overtakes its neighbour only when its remaining work is smaller by more than the
//! hysteresis (10%), so two similar jobs do not swap back and forth on estimation noise.
//!
//! **Division.** Cores go, a small quantum at a time, to the job whose next quantum buys the most
//! valued work ([`allocate`]): a job's first core is worth its rank (the last-ranked job 1, the
//! first `n`), every core beyond the first is worth the same for every job, so the first cores go
//! in rank order (below one core a job's speed is linear: no throughput is lost by ordering) and
//! further cores go where they speed jobs up the most (throughput). Every job keeps a floor of
//! 10% of its fair share. Targets become `cpu.weight`s proportional to them, so the kernel's
//! work-conserving sharing hands any core a job cannot use to the others.
//!
//! **The fairness guard.** The policy runs a *virtual fair system* alongside: the same jobs,
//! with the sizes and speed-ups it has learnt, sharing the node equally (water-filling), which
//! gives each job its completion time under fair sharing. At every decision it projects its own
//! plan forward (no further arrivals, allocations recomputed at each completion). A job projected
//! to finish later than its fair completion by more than `urgency_margin × slack × its fair
//! completion time` becomes *urgent*: it is guaranteed its fair share plus 25% (scaled down when
//! the boosts of several urgent jobs do not fit beside everyone's guarantees) until, with its
//! boost, it is projected to finish early by the same margin. The job that finishes last under
//! fair sharing (within 5% of the remaining fair makespan) gets no slack at all, so the ordering
//! never lengthens the node's makespan. The bound we choose is `slack = 10%`: the guard aims at
//! no job more than 10% slower than under fair sharing; it is a target, not a theorem, because
//! projections cannot see future arrivals. docs/evaluation.md reports how often it holds.
//!
//! **Reaction.** Every event (arrival, departure, log line, usage sample) leads to a fresh
//! decision; with nothing happening it re-decides every second.
//!
//! **Caps.** None, except the operator's [`Bounds`](super::Bounds): a cap can only idle cores
//! that weights would hand to someone, so caps never helped in any measurement. Memory is left
//! alone (the daemon's guard sets it from usage).
//!
//! # Measured choices (docs/evaluation.md, "Single-node policy comparison")
//!
//! Every default below was chosen on 120 seeded workloads (3-10 jobs, 2-16 cores) and checked
//! on the 40 contended ones (6-10 jobs on 2-4 cores):
//! - `spread = 0` (cores beyond the first split for throughput): 0.5 and 1 (rank value on every
//!   core) gave a little more average gain but broke the 10% bound in 3-5 times as many
//!   workloads and lengthened the makespan;
//! - `slack = 0.1`, `urgency_margin = 0.5`: tighter (0.05) gives up gain for no fairness,
//!   looser (0.2) breaks the bound more often;
//! - `makespan_guard = 0.05`; `floor = 0.1`; `hysteresis = 0.1`;
//! - `project_boosts = true`: judging urgency without the boosts flapped and broke the bound in
//!   9% of workloads instead of 2%;
//! - `order = remaining`: ranking by fair-share completion (the Fair Sojourn Protocol's order)
//!   lengthened the makespan;
//! - `unknown = attained`: leaving unreported jobs at their fair share delays learning their
//!   size;
//! - not moving cores by the loss *when the job's size is known*: with fixed work, a converged
//!   job still has to do its work; moving cores to fast learners (FlowCon) lengthened the
//!   average completion time.
//!
//! # Jobs of unknown size: learning decides
//!
//! Most real logs never say how much work is left, and then the ranking above is a guess and
//! the projection guard has nothing to project. For such a job the loss decides, as the product
//! promises: while it learns (or has not been judged yet) it is guaranteed its fair share; once
//! its normalised learning rate has fallen below a quarter of its peak (`watching`) it is
//! guaranteed and claims only `watching_share` (50%) of it, and so once below 5% (`converged`)
//! (`converged_share`, 50%), and it ranks behind every job still learning. The cores it yields go
//! to the learning jobs; the weights stay work-conserving, so it still gets whatever they cannot
//! use. The bound for these jobs is therefore the floor, not the 10% guard: a job that has
//! stopped learning runs at no less than half its fair share (at worst 2× slower for the rest
//! of its run), a job that learns is never below its fair share. A loss that moves again lifts
//! the job back (the categories have hysteresis).
//!
//! Measured (docs/evaluation.md, "The learning yield"): in govsim, where every job runs all its
//! epochs however flat its loss, yielding costs average JCT (+1% to +4% against no yield on the
//! paper scenarios), because the work a converged job still has to do is only postponed. We keep
//! the yield because that model gives no value to reaching a good loss early, which is the point
//! of the product; `converged_share = 1, watching_share = 1` switches it off. The shares and the
//! loss smoothing (0.5: a flat loss is seen as `watching` after ~4 log lines) are the mildest
//! that move CPU within 2 s of a loss going flat in the VM test
//! `daemon_shifts_cpu_from_a_converged_job_to_a_progressing_one_within_2s`.
//!
//! # Parameters (spec keys for `--policy governor:KEY=VALUE`)
//!
//! `spread` (0), `floor` (0.1), `slack` (0.1), `urgency_margin` (0.5), `makespan_guard` (0.05),
//! `hysteresis` (0.1), `smoothing` (0.5, EWMA weight of each loss value for the category),
//! `interval` (1 s), `order` (`remaining` | `fair_deadline`), `unknown` (`attained` |
//! `neutral`), `project_boosts` (true), `watching_share` (0.5), `converged_share` (0.5).

use std::collections::{BTreeMap, BTreeSet};

use super::ParamError;
use super::allocate::{Claim, allocate};
use super::share::{ShareRequest, fair_shares, water_fill};
use super::speedup::{PRIOR_PARALLEL_FRACTION, SpeedupFit, amdahl_speed};
use super::stage::{LossTracker, StageThresholds};
use super::{
    Allocation, Category, CpuAllocation, JobId, JobSpec, MemoryAllocation, NodePolicy,
    NodeResources, Plan, ProgressPoint, Seconds, Usage, clamp_cores,
};

/// How to treat a job whose remaining work is unknown (its log has not said how far along it
/// is, or never does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownWork {
    /// Rank it as if it needed as much work again as the CPU time it has had (least attained
    /// service first): newcomers are served first and soon report their size.
    #[default]
    Attained,
    /// Keep it at its fair share, outside the ranking.
    Neutral,
}

/// What jobs are ranked by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RankBy {
    /// Estimated remaining work (shortest first), with a projection-based guard.
    #[default]
    Remaining,
    /// Completion time under fair sharing, stretched by the slack, earliest first: the Fair
    /// Sojourn Protocol's order (measured worse here, see the module doc).
    FairDeadline,
}

/// The governor policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GovernorParams {
    /// How much of a job's rank value still counts for cores beyond its first: 0 splits them
    /// for throughput alone, 1 uses the full rank value everywhere.
    pub spread: f64,
    /// Every job gets at least this fraction of its fair share (what it would get with every
    /// knob at the kernel default).
    pub floor: f64,
    /// Each job's deadline is its completion under fair sharing stretched by `1 + slack`.
    pub slack: f64,
    /// A job becomes urgent when, running from now on at the speed it can show, it would have
    /// less than this fraction of its slack (`slack × its fair-share completion time`) to spare.
    pub urgency_margin: f64,
    /// Jobs whose fair-share completion is within this fraction of the remaining fair makespan
    /// from the last one get no slack at all (0 disables the guard).
    pub makespan_guard: f64,
    /// A job overtakes another in the ranking only when its remaining work is smaller by this
    /// fraction.
    pub hysteresis: f64,
    /// EWMA weight of each new loss value.
    pub smoothing: f64,
    /// Re-decide at least this often, seconds.
    pub interval: Seconds,
    pub order: RankBy,
    pub unknown: UnknownWork,
    pub project_boosts: bool,
    /// Share of its fair share guaranteed to a job of unknown size whose learning has slowed
    /// (`watching`): the rest goes to the jobs still learning.
    pub watching_share: f64,
    /// The same for a job of unknown size whose loss has stopped moving (`converged`).
    pub converged_share: f64,
}

impl Default for GovernorParams {
    fn default() -> Self {
        GovernorParams {
            spread: 0.0,
            floor: 0.1,
            slack: 0.1,
            urgency_margin: 0.5,
            makespan_guard: 0.05,
            hysteresis: 0.1,
            smoothing: 0.5,
            interval: 1.0,
            order: RankBy::default(),
            unknown: UnknownWork::default(),
            project_boosts: true,
            watching_share: 0.5,
            converged_share: 0.5,
        }
    }
}

impl GovernorParams {
    /// Set a parameter by name.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let num = |min: f64, max: f64| -> Result<f64, ParamError> {
            let v: f64 = super::parse_param(key, value)?;
            if v.is_finite() && v >= min && v <= max {
                Ok(v)
            } else {
                Err(ParamError::invalid(
                    key,
                    format!("{key} must be in [{min}, {max}], not {value}"),
                ))
            }
        };
        match key {
            "floor" => self.floor = num(0.0, 1.0)?,
            "spread" => self.spread = num(0.0, 1.0)?,
            "slack" => self.slack = num(0.0, 1000.0)?,
            "urgency_margin" => self.urgency_margin = num(0.0, 10.0)?,
            "makespan_guard" => self.makespan_guard = num(0.0, 1.0)?,
            "hysteresis" => self.hysteresis = num(0.0, 0.99)?,
            "smoothing" => self.smoothing = num(0.001, 1.0)?,
            "interval" => self.interval = num(0.001, 3600.0)?,
            "project_boosts" => self.project_boosts = super::parse_param(key, value)?,
            "watching_share" => self.watching_share = num(0.0, 1.0)?,
            "converged_share" => self.converged_share = num(0.0, 1.0)?,
            "unknown" => {
                self.unknown = match value {
                    "attained" => UnknownWork::Attained,
                    "neutral" => UnknownWork::Neutral,
                    _ => {
                        return Err(ParamError::invalid(
                            key,
                            format!("unknown is attained or neutral, not {value:?}"),
                        ));
                    }
                }
            }
            "order" => {
                self.order = match value {
                    "remaining" => RankBy::Remaining,
                    "fair_deadline" => RankBy::FairDeadline,
                    _ => {
                        return Err(ParamError::invalid(
                            key,
                            format!("order is remaining or fair_deadline, not {value:?}"),
                        ));
                    }
                }
            }
            _ => return Err(ParamError::Unknown(key.to_owned())),
        }
        Ok(())
    }
}

#[derive(Clone, Debug)]
struct JobState {
    spec: JobSpec,
    submitted: Seconds,
    cpu_seconds: f64,
    last_usage: Option<(Seconds, f64)>,
    /// Cores used over the latest usage interval.
    recent_cores: f64,
    fit: SpeedupFit,
    /// Most cores the job has been seen using (a lower bound on its demand).
    demand_seen: f64,
    /// Cores the job has shown it cannot exceed: it used clearly less than it was offered.
    /// None: never seen limited (its demand has no known upper bound).
    demand_limit: Option<f64>,
    /// Fewest cores any plan since the last usage sample expected it to get.
    min_expected_cores: Option<f64>,
    /// When `demand_limit` was last learnt: it is dropped after [`DEMAND_PROBE`] seconds, so a
    /// job whose demand grew is offered its share again even where no wait is measured.
    demand_limit_at: Option<Seconds>,
    /// Cumulative CPU wait at the latest usage sample (unmet demand), where measured.
    last_wait: Option<f64>,
    tracker: LossTracker,
}

/// A demand limit learnt from usage is forgotten after this many seconds (the probe): a job
/// that was quiet (loading data, waiting for a file, compiling) and then needs CPU is offered
/// its share again within it, even on a node that cannot measure CPU wait.
pub const DEMAND_PROBE: Seconds = 2.0;

/// Waiting for a CPU for more than this fraction of an interval is unmet demand: the job could
/// use more than it got, so no demand limit holds it.
pub const UNMET_DEMAND: f64 = 0.1;

impl JobState {
    fn parallel_fraction(&self) -> f64 {
        self.fit
            .parallel_fraction()
            .unwrap_or(PRIOR_PARALLEL_FRACTION)
    }
}

/// A job in the virtual fair-sharing system, in work units.
#[derive(Clone, Debug)]
struct VirtualJob {
    /// Size in work units (None: unknown, it never finishes virtually).
    size: Option<f64>,
    attained: f64,
    /// Cap on its cores (its known demand limit, or unbounded).
    demand: f64,
    parallel_fraction: f64,
}

impl VirtualJob {
    fn remaining(&self) -> f64 {
        self.size
            .map_or(f64::INFINITY, |w| (w - self.attained).max(0.0))
    }

    fn done(&self) -> bool {
        self.remaining() <= 1e-9 * self.size.unwrap_or(1.0).max(1.0)
    }
}

/// Run a virtual fair system for `duration` seconds (or until every job with a known size is
/// done, if `duration` is infinite); returns when each job finished, relative to the start.
fn run_virtual(
    jobs: &mut BTreeMap<JobId, VirtualJob>,
    cores: f64,
    duration: f64,
) -> Vec<(JobId, f64)> {
    let mut finished = Vec::new();
    let mut t = 0.0;
    while t < duration {
        let ids: Vec<JobId> = jobs.keys().cloned().collect();
        if !jobs.values().any(|j| j.size.is_some()) && !duration.is_finite() {
            break;
        }
        if ids.is_empty() {
            break;
        }
        let demands: Vec<f64> = ids.iter().map(|id| jobs[id].demand).collect();
        let shares = fair_shares(cores, &demands);
        let speeds: Vec<f64> = ids
            .iter()
            .zip(&shares)
            .map(|(id, s)| amdahl_speed(*s, jobs[id].parallel_fraction))
            .collect();
        let mut step = duration - t;
        for (id, v) in ids.iter().zip(&speeds) {
            if *v > 0.0 {
                step = step.min(jobs[id].remaining() / v);
            }
        }
        if !step.is_finite() {
            break;
        }
        t += step;
        for (id, v) in ids.iter().zip(&speeds) {
            let j = jobs.get_mut(id).expect("listed");
            j.attained += v * step;
            if j.done() {
                finished.push((id.clone(), t));
            }
        }
        jobs.retain(|_, j| !j.done());
    }
    finished
}

/// Our policy.
#[derive(Debug)]
pub struct Governor {
    params: GovernorParams,
    jobs: BTreeMap<JobId, JobState>,
    /// Ranking of the previous decision (hysteresis starts from it).
    order: Vec<JobId>,
    /// Jobs promoted because their fair-share deadline is at risk.
    urgent: BTreeSet<JobId>,
    /// The same jobs under fair sharing, advanced to `virtual_now`.
    virtual_jobs: BTreeMap<JobId, VirtualJob>,
    /// When each job finished in the virtual fair system.
    virtual_finish: BTreeMap<JobId, Seconds>,
    virtual_now: Option<Seconds>,
    cores: f64,
}

impl Default for Governor {
    fn default() -> Self {
        Self::new(GovernorParams::default())
    }
}

impl Governor {
    pub fn new(params: GovernorParams) -> Self {
        Governor {
            params,
            jobs: BTreeMap::new(),
            order: Vec::new(),
            urgent: BTreeSet::new(),
            virtual_jobs: BTreeMap::new(),
            virtual_finish: BTreeMap::new(),
            virtual_now: None,
            cores: 0.0,
        }
    }

    /// Advance the virtual fair system to `now`.
    fn advance_virtual(&mut self, now: Seconds) {
        if let Some(t) = self.virtual_now
            && now > t
        {
            for (id, at) in run_virtual(&mut self.virtual_jobs, self.cores, now - t) {
                self.virtual_finish.insert(id, t + at);
            }
        }
        self.virtual_now = Some(now);
    }

    /// When each job completes under fair sharing: recorded if it already has, projected
    /// otherwise (infinite when its size is unknown).
    fn fair_finish(&self, now: Seconds) -> BTreeMap<JobId, Seconds> {
        let mut finish = self.virtual_finish.clone();
        let mut v = self.virtual_jobs.clone();
        for (id, at) in run_virtual(&mut v, self.cores, f64::INFINITY) {
            finish.insert(id, now + at);
        }
        for id in v.keys() {
            finish.entry(id.clone()).or_insert(f64::INFINITY);
        }
        finish
    }

    /// Order jobs by `key` (smaller first; higher priority before anything), starting from the
    /// previous order and swapping neighbours only when the later one's key is smaller by more
    /// than the hysteresis (relative to the larger magnitude, at least one unit).
    fn rank(&self, keys: &BTreeMap<JobId, f64>) -> Vec<JobId> {
        // Operator priority first; among jobs ranked on a guess (size unknown), those still
        // learning before those that slowed down, before those that converged.
        let key = |id: &JobId| {
            let job = &self.jobs[id];
            let yielding = if job.fit.remaining().is_none() {
                learning_class(job.tracker.category())
            } else {
                0
            };
            (i64::from(job.spec.priority) * 4 - yielding, keys[id])
        };
        // Keys are computed once per job and travel with it: the passes below compare
        // neighbours many times, and looking jobs up by id there (string comparisons in two
        // maps) was most of a decision's cost with 1,000 jobs.
        let mut order: Vec<(JobId, (i64, f64))> = self
            .order
            .iter()
            .filter(|id| keys.contains_key(*id))
            .map(|id| (id.clone(), key(id)))
            .collect();
        let ranked: BTreeSet<&JobId> = self
            .order
            .iter()
            .filter(|id| keys.contains_key(*id))
            .collect();
        let mut newcomers: Vec<(JobId, (i64, f64))> = keys
            .keys()
            .filter(|id| !ranked.contains(id))
            .map(|id| (id.clone(), key(id)))
            .collect();
        newcomers.sort_by(|(a, (pa, ka)), (b, (pb, kb))| {
            pb.cmp(pa).then(ka.total_cmp(kb)).then(a.cmp(b))
        });
        for n in newcomers {
            let (pn, kn) = n.1;
            let pos = order
                .iter()
                .position(|(_, (po, ko))| pn > *po || (pn == *po && kn < *ko))
                .unwrap_or(order.len());
            order.insert(pos, n);
        }
        let h = self.params.hysteresis.clamp(0.0, 0.99);
        loop {
            let mut swapped = false;
            for i in 1..order.len() {
                let (pa, ka) = order[i - 1].1;
                let (pb, kb) = order[i].1;
                if pb > pa || (pb == pa && kb < ka - h * ka.abs().max(kb.abs()).max(1.0)) {
                    order.swap(i - 1, i);
                    swapped = true;
                }
            }
            if !swapped {
                break;
            }
        }
        order.into_iter().map(|(id, _)| id).collect()
    }

    /// Every job's target cores.
    fn targets(&mut self, now: Seconds) -> BTreeMap<JobId, f64> {
        let cores = self.cores;
        if self.jobs.is_empty() || cores <= 0.0 {
            return BTreeMap::new();
        }
        let remaining: BTreeMap<JobId, f64> = self
            .jobs
            .iter()
            .filter_map(|(id, j)| {
                let r = match (j.fit.remaining(), self.params.unknown) {
                    (Some(r), _) => Some(r),
                    // No position reported (yet): expect it to need about what it has had
                    // (work ≤ CPU time), so a newcomer is served first and soon shows its size.
                    (None, UnknownWork::Attained) => Some(j.cpu_seconds),
                    (None, UnknownWork::Neutral) => None,
                };
                r.map(|r| (id.clone(), r))
            })
            .collect();
        let fair_finish = self.fair_finish(now);
        let keys: BTreeMap<JobId, f64> = match self.params.order {
            RankBy::Remaining => remaining.clone(),
            RankBy::FairDeadline => remaining
                .keys()
                .map(|id| {
                    let fair = fair_finish.get(id).copied().unwrap_or(f64::INFINITY);
                    let submitted = self.jobs[id].submitted;
                    let deadline = fair + self.params.slack * (fair - submitted).max(0.0);
                    (id.clone(), deadline - now)
                })
                .collect(),
        };
        let order = self.rank(&keys);
        // Ranked jobs in rank order, then the others.
        let mut ids = order.clone();
        ids.extend(
            self.jobs
                .keys()
                .filter(|id| !remaining.contains_key(*id))
                .cloned(),
        );
        let mut plan: Vec<PlanJob> = ids
            .iter()
            .map(|id| {
                let job = &self.jobs[id];
                let bounds = &job.spec.bounds;
                let limit = job
                    .demand_limit
                    .unwrap_or(cores)
                    .min(bounds.max_cores.filter(|m| *m > 0.0).unwrap_or(f64::MAX));
                PlanJob {
                    remaining: remaining.get(id).copied(),
                    guessed: job.fit.remaining().is_none(),
                    parallel_fraction: job.parallel_fraction(),
                    limit,
                    min_cores: bounds.min_cores.unwrap_or(0.0).clamp(0.0, limit),
                    urgent: self.params.project_boosts && self.urgent.contains(id),
                    learning_share: match job.tracker.category() {
                        Category::Watching => self.params.watching_share,
                        Category::Converged => self.params.converged_share,
                        Category::Progressing | Category::Unknown => 1.0,
                    },
                }
            })
            .collect();
        // Where the current plan leads if nothing else arrives, against where fair sharing
        // leads. A promoted job looks on time with its promotion, so it is only demoted once it
        // looks early by the margin (no flapping).
        // Only a job whose size is known can be judged against fair sharing (a guessed size
        // has no fair-share completion): without one, the projection (quadratic in the number
        // of jobs) is skipped.
        let projected = if plan.iter().any(|j| j.remaining.is_some() && !j.guessed) {
            project(cores, &plan, &self.params)
        } else {
            vec![f64::INFINITY; plan.len()]
        };
        let margin = self.params.urgency_margin.max(0.0);
        let last_fair = fair_finish
            .iter()
            .filter(|(id, _)| self.jobs.contains_key(*id))
            .map(|(_, f)| *f)
            .filter(|f| f.is_finite())
            .fold(now, f64::max);
        let base = plan.clone();
        let mut urgent = BTreeSet::new();
        for (i, id) in ids.iter().enumerate() {
            let Some(&fair) = fair_finish.get(id) else {
                continue;
            };
            if base[i].remaining.is_none() || !fair.is_finite() {
                continue;
            }
            // Judge every job by where it would be *without* its own promotion (with everyone
            // else's): judged with it, a promoted job looks on time, is demoted, and is late
            // again at the next decision.
            let offset = if base[i].urgent {
                let mut without = base.clone();
                without[i].urgent = false;
                project(cores, &without, &self.params)[i]
            } else {
                projected[i]
            };
            if !offset.is_finite() {
                continue;
            }
            // The job the node's fair makespan hangs on gets no slack: delaying it delays
            // everyone's last completion.
            let guard = self.params.makespan_guard;
            let budget = if guard > 0.0 && fair >= last_fair - guard * (last_fair - now) {
                0.0
            } else {
                self.params.slack * (fair - self.jobs[id].submitted)
            };
            let delay = now + offset - fair;
            plan[i].urgent = is_urgent(self.urgent.contains(id), delay, margin * budget);
            if plan[i].urgent {
                urgent.insert(id.clone());
            }
        }
        self.urgent = urgent;
        self.order = order;
        let targets = allocate(cores, &claims(cores, &plan, &self.params));
        ids.into_iter().zip(targets).collect()
    }
}

/// Whether a job is urgent, given whether it was, its projected delay against fair sharing
/// without its own promotion, and the delay it is allowed (`margin × budget`): it enters above
/// the allowance and leaves below half of it.
fn is_urgent(was_urgent: bool, delay: f64, allowance: f64) -> bool {
    delay
        > if was_urgent {
            allowance / 2.0
        } else {
            allowance
        }
}

/// How far above its fair share an urgent job is lifted (when that fits).
const URGENT_BOOST: f64 = 0.25;

/// A job as the planner sees it.
#[derive(Clone, Debug)]
struct PlanJob {
    /// Work units left (None: unknown).
    remaining: Option<f64>,
    /// `remaining` is a guess from the CPU time it has had, not learnt from its reports.
    guessed: bool,
    parallel_fraction: f64,
    /// Most cores it can use (or may use: the operator's bound).
    limit: f64,
    /// The operator's guarantee.
    min_cores: f64,
    urgent: bool,
    /// Fraction of its fair share a job ranked on a guess is guaranteed: 1 while it learns,
    /// less once its loss has slowed down or stopped moving (see [`GovernorParams`]).
    learning_share: f64,
}

/// 0 for a job still learning (or not judged yet), 1 once its learning has slowed down, 2 once
/// it has converged: how far back a job of unknown size yields.
fn learning_class(category: Category) -> i64 {
    match category {
        Category::Progressing | Category::Unknown => 0,
        Category::Watching => 1,
        Category::Converged => 2,
    }
}

/// The claims of `jobs`, listed with the ranked ones (known remaining work) first, in rank
/// order.
fn claims(cores: f64, jobs: &[PlanJob], params: &GovernorParams) -> Vec<Claim> {
    let limits: Vec<f64> = jobs.iter().map(|j| j.limit).collect();
    let fair = fair_shares(cores, &limits);
    let ranked = jobs.iter().filter(|j| j.remaining.is_some()).count() as f64;
    let floor = params.floor.clamp(0.0, 1.0);
    let guaranteed: f64 = jobs
        .iter()
        .zip(&fair)
        .map(|(j, f)| {
            if j.remaining.is_none() || j.urgent {
                *f
            } else if j.guessed {
                f * j.learning_share.clamp(0.0, 1.0)
            } else {
                floor * f
            }
        })
        .sum();
    let boosts: f64 = jobs
        .iter()
        .zip(&fair)
        .filter(|(j, _)| j.remaining.is_some() && j.urgent)
        .map(|(j, f)| (f * URGENT_BOOST).min((j.limit - f).max(0.0)))
        .sum();
    let boost_scale = if boosts > 0.0 {
        ((cores - guaranteed).max(0.0) / boosts).min(1.0)
    } else {
        1.0
    };
    let mut position = 0.0;
    jobs.iter()
        .zip(&fair)
        .map(|(job, fair_share)| {
            if job.remaining.is_none() {
                // Nothing known about its remaining work: its fair share, pinned.
                return Claim {
                    value: 0.0,
                    value_above_one: 0.0,
                    parallel_fraction: job.parallel_fraction,
                    min: fair_share.max(job.min_cores),
                    max: fair_share.max(job.min_cores),
                };
            }
            let value = ranked - position;
            position += 1.0;
            // An urgent job is guaranteed its fair share (fair shares always fit together) and
            // a boost above it, so it wins back the time it lent; the boosts are scaled down
            // together when they do not fit beside everyone's guarantee.
            let min = if job.urgent {
                (*fair_share * (1.0 + URGENT_BOOST * boost_scale)).min(job.limit)
            } else if job.guessed {
                // Ranked on a guess, so the guard cannot protect it: never below fair while it
                // learns; a job whose loss has flattened yields part of its share.
                *fair_share * job.learning_share.clamp(0.0, 1.0)
            } else {
                params.floor.clamp(0.0, 1.0) * fair_share
            };
            // A job ranked on a guess that has stopped learning claims no more than its
            // reduced share: the cores it yields go to the learning jobs. The weights stay
            // work-conserving, so it still gets whatever they cannot use.
            let max = if job.guessed && job.learning_share < 1.0 && !job.urgent {
                job.limit.min(min)
            } else {
                job.limit
            };
            Claim {
                value,
                value_above_one: value.powf(params.spread.clamp(0.0, 1.0)),
                parallel_fraction: job.parallel_fraction,
                min: min.max(job.min_cores),
                max: max.max(job.min_cores),
            }
        })
        .collect()
}

/// When each job would finish (seconds from now) if the plan were followed and nothing else
/// arrived: the allocation is recomputed at every completion. Infinite for unknown work.
fn project(cores: f64, jobs: &[PlanJob], params: &GovernorParams) -> Vec<f64> {
    let mut finish = vec![f64::INFINITY; jobs.len()];
    let mut live: Vec<usize> = (0..jobs.len()).collect();
    let mut left: Vec<f64> = jobs
        .iter()
        .map(|j| j.remaining.unwrap_or(f64::INFINITY))
        .collect();
    let mut t = 0.0;
    while live.iter().any(|&i| left[i].is_finite()) {
        let subset: Vec<PlanJob> = live.iter().map(|&i| jobs[i].clone()).collect();
        let alloc = allocate(cores, &claims(cores, &subset, params));
        let speeds: Vec<f64> = live
            .iter()
            .zip(&alloc)
            .map(|(&i, c)| amdahl_speed(*c, jobs[i].parallel_fraction))
            .collect();
        let step = live
            .iter()
            .zip(&speeds)
            .filter(|(i, v)| **v > 0.0 && left[**i].is_finite())
            .map(|(i, v)| left[*i] / v)
            .fold(f64::INFINITY, f64::min);
        if !step.is_finite() {
            break;
        }
        t += step;
        for (&i, v) in live.iter().zip(&speeds) {
            left[i] -= v * step;
            if left[i].is_finite() && left[i] <= 1e-9 * jobs[i].remaining.unwrap_or(1.0).max(1.0) {
                finish[i] = t;
            }
        }
        live.retain(|&i| finish[i].is_infinite());
    }
    finish
}

impl NodePolicy for Governor {
    fn name(&self) -> &'static str {
        "governor"
    }

    fn job_added(&mut self, now: Seconds, spec: &JobSpec) {
        self.jobs.insert(
            spec.id.clone(),
            JobState {
                spec: spec.clone(),
                submitted: now,
                cpu_seconds: 0.0,
                last_usage: None,
                recent_cores: 0.0,
                fit: SpeedupFit::new(),
                demand_seen: 0.0,
                demand_limit: None,
                min_expected_cores: None,
                demand_limit_at: None,
                last_wait: None,
                tracker: LossTracker::new(
                    spec.direction,
                    self.params.smoothing,
                    StageThresholds::default(),
                ),
            },
        );
        self.virtual_jobs.insert(
            spec.id.clone(),
            VirtualJob {
                size: None,
                attained: 0.0,
                demand: f64::MAX,
                parallel_fraction: PRIOR_PARALLEL_FRACTION,
            },
        );
    }

    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        if let Some(job) = self.jobs.remove(id)
            && let Some(v) = self.virtual_jobs.get_mut(id)
        {
            // Its fair twin runs on until it has done the same work; a job whose size was never
            // learnt leaves the virtual system with it.
            v.size = Some(job.fit.size().unwrap_or(v.attained));
        }
        self.order.retain(|o| o != id);
        self.urgent.remove(id);
    }

    fn progress(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        if let Some(job) = self.jobs.get_mut(id) {
            if point.new_segment {
                job.tracker.restart();
            }
            job.tracker.observe(now, point.value, job.cpu_seconds);
        }
    }

    fn usage(&mut self, now: Seconds, id: &JobId, usage: Usage) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if let Some((t0, cpu0)) = job.last_usage {
            let dt = now - t0;
            if dt > 0.0 {
                let cores = (usage.cpu_seconds - cpu0).max(0.0) / dt;
                job.recent_cores = cores;
                job.demand_seen = job.demand_seen.max(cores);
                // The kernel's own signal of unmet demand: its tasks waited for a CPU.
                let waited = match (usage.cpu_wait_seconds, job.last_wait) {
                    (Some(w), Some(w0)) => Some((w - w0).max(0.0) / dt),
                    _ => None,
                };
                if waited.is_some_and(|w| w > UNMET_DEMAND) {
                    // It wants more than it got: whatever it used says nothing of its demand.
                    job.demand_limit = None;
                    job.demand_limit_at = None;
                } else if let Some(offered) = job.min_expected_cores
                    && cores < 0.9 * offered
                {
                    // Clearly less than every plan of the interval offered it, without waiting:
                    // it cannot use more than it ever has, for now (see DEMAND_PROBE).
                    job.demand_limit = Some(job.demand_seen);
                    job.demand_limit_at = Some(now);
                }
                if let Some(limit) = job.demand_limit
                    && job.demand_seen > limit
                {
                    job.demand_limit = Some(job.demand_seen);
                }
            }
        }
        job.last_wait = usage.cpu_wait_seconds;
        job.last_usage = Some((now, usage.cpu_seconds));
        job.min_expected_cores = None;
        job.cpu_seconds = job.cpu_seconds.max(usage.cpu_seconds);
        if let Some(v) = self.virtual_jobs.get_mut(id) {
            v.demand = job.demand_limit.unwrap_or(f64::MAX);
        }
    }

    fn work_done(&mut self, now: Seconds, id: &JobId, fraction: f64) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        // CPU time at the report, extrapolated from the latest sample (up to a second old):
        // a report every few seconds would otherwise see CPU arrive in one-second steps.
        let cpu = match job.last_usage {
            Some((t, cpu)) if now > t => cpu + job.recent_cores * (now - t),
            _ => job.cpu_seconds,
        };
        job.fit.report(job.submitted, now, fraction, cpu);
        if let Some(v) = self.virtual_jobs.get_mut(id) {
            v.size = job.fit.size();
            v.parallel_fraction = job.parallel_fraction();
        }
    }

    fn decide(&mut self, now: Seconds, node: &NodeResources) -> Plan {
        self.cores = node.cores;
        // Demand limits are provisional: after the probe the job is offered its share again.
        for job in self.jobs.values_mut() {
            if job
                .demand_limit_at
                .is_some_and(|at| now - at >= DEMAND_PROBE)
            {
                job.demand_limit = None;
                job.demand_limit_at = None;
            }
        }
        self.advance_virtual(now);
        let m = self.jobs.len() as f64;
        // Every job keeps at least its floor of the node against everyone, whatever its demand
        // limit or rank said: a job that becomes runnable gets it at once.
        let floor_cores = self.params.floor.clamp(0.0, 1.0) * self.cores / m.max(1.0);
        let targets: BTreeMap<JobId, f64> = self
            .targets(now)
            .into_iter()
            .map(|(id, t)| (id, t.max(floor_cores)))
            .collect();
        let total: f64 = targets.values().sum::<f64>().max(1e-9);
        let ids: Vec<JobId> = self.jobs.keys().cloned().collect();
        let weights: Vec<u32> = ids
            .iter()
            .map(|id| {
                (targets.get(id).copied().unwrap_or(0.0).max(floor_cores) / total * 100.0 * m)
                    .round()
                    .clamp(1.0, 10000.0) as u32
            })
            .collect();
        // What the kernel will give each job under these weights (for demand detection).
        let requests: Vec<ShareRequest> = ids
            .iter()
            .zip(&weights)
            .map(|(id, w)| ShareRequest {
                weight: *w,
                max_cores: None,
                demand: self.jobs[id].demand_limit.unwrap_or(self.cores),
            })
            .collect();
        let expected = water_fill(self.cores, &requests);
        for (id, e) in ids.iter().zip(&expected) {
            let job = self.jobs.get_mut(id).expect("listed");
            job.min_expected_cores = Some(job.min_expected_cores.map_or(*e, |m| m.min(*e)));
        }
        let allocations = ids
            .iter()
            .zip(&weights)
            .zip(&expected)
            .map(|((id, weight), expected)| {
                let job = &self.jobs[id];
                let reason = match job.fit.remaining() {
                    Some(r) => format!(
                        "governor: ~{r:.0} s of one-core work left{}, ~{expected:.2} cores",
                        if self.urgent.contains(id) {
                            ", behind its fair-share deadline"
                        } else {
                            ""
                        },
                    ),
                    None => match job.tracker.category() {
                        c @ (Category::Watching | Category::Converged) => format!(
                            "governor: remaining work unknown, learning {}, yields to learning \
                             jobs (~{expected:.2} cores)",
                            if c == Category::Watching {
                                "slowed"
                            } else {
                                "stopped"
                            }
                        ),
                        _ => format!(
                            "governor: remaining work unknown, fair share (~{expected:.2} cores)"
                        ),
                    },
                };
                (
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
                )
            })
            .collect();
        Plan {
            allocations,
            migrations: Vec::new(),
            next_decision_at: if self.jobs.is_empty() {
                None
            } else {
                Some(now + self.params.interval)
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Bounds;

    fn node(cores: f64) -> NodeResources {
        NodeResources {
            cores,
            memory_bytes: 8 << 30,
        }
    }

    fn id(s: &str) -> JobId {
        JobId::from(s)
    }

    fn usage(p: &mut Governor, now: Seconds, job: &str, cpu_seconds: f64) {
        p.usage(
            now,
            &id(job),
            Usage {
                at: now,
                cpu_seconds,
                ..Usage::default()
            },
        );
    }

    /// Teach the policy that `job` has done `seconds` of work on exactly one core (so its
    /// speed-up curve does not matter) and that this is `seconds / size` of its work.
    fn teach_size(p: &mut Governor, now: Seconds, job: &str, size: f64, seconds: f64) {
        usage(p, now - seconds, job, 0.0);
        usage(p, now, job, seconds);
        p.work_done(now, &id(job), seconds / size);
    }

    /// Cores each job gets under the plan's weights when every job can use `demand` cores.
    fn cores_under(plan: &Plan, cores: f64, demand: f64) -> BTreeMap<JobId, f64> {
        let ids: Vec<JobId> = plan.allocations.keys().cloned().collect();
        let requests: Vec<ShareRequest> = ids
            .iter()
            .map(|i| ShareRequest {
                weight: plan.allocations[i].cpu.weight,
                max_cores: plan.allocations[i].cpu.max_cores,
                demand,
            })
            .collect();
        ids.into_iter().zip(water_fill(cores, &requests)).collect()
    }

    /// No fairness guard: ordering and division alone.
    fn unguarded() -> GovernorParams {
        GovernorParams {
            slack: 1000.0,
            makespan_guard: 0.0,
            ..GovernorParams::default()
        }
    }

    fn with_jobs(params: GovernorParams, jobs: &[&str]) -> Governor {
        let mut p = Governor::new(params);
        for j in jobs {
            p.job_added(0.0, &JobSpec::new(*j));
        }
        p
    }

    #[test]
    fn first_cores_go_to_the_jobs_with_the_least_work_left() {
        let mut p = with_jobs(unguarded(), &["a", "b", "c"]);
        p.decide(0.0, &node(2.0));
        teach_size(&mut p, 10.0, "a", 200.0, 10.0);
        teach_size(&mut p, 10.0, "b", 1000.0, 10.0);
        teach_size(&mut p, 10.0, "c", 300.0, 10.0);
        let plan = p.decide(10.0, &node(2.0));
        let got = cores_under(&plan, 2.0, 2.0);
        assert!((got[&id("a")] - 1.0).abs() < 0.05, "{got:?}");
        // c has the rest but b's floor: 10% of its fair share (2/3 core).
        assert!((got[&id("c")] - (1.0 - 0.2 / 3.0)).abs() < 0.05, "{got:?}");
        assert!(got[&id("b")] < 0.1 && got[&id("b")] > 0.03, "{got:?}");
        assert_eq!(p.order, vec![id("a"), id("c"), id("b")]);
    }

    #[test]
    fn cores_beyond_the_first_go_where_they_speed_jobs_up() {
        let mut p = with_jobs(unguarded(), &["scales", "stalls"]);
        p.decide(0.0, &node(8.0));
        // Observed at 1, 2 and 4 cores: parallel fractions 0.98 and 0.6.
        for (job, f) in [("scales", 0.98), ("stalls", 0.6)] {
            let (mut t, mut cpu, mut done) = (0.0, 0.0, 0.0);
            usage(&mut p, t, job, cpu);
            for cores in [1.0, 2.0, 4.0] {
                t += 10.0;
                cpu += cores * 10.0;
                done += amdahl_speed(cores, f) * 10.0 / 1000.0;
                usage(&mut p, t, job, cpu);
                p.work_done(t, &id(job), done);
            }
        }
        let f = p.jobs[&id("stalls")].fit.parallel_fraction().unwrap();
        assert!((f - 0.6).abs() < 0.02, "fit {f}");
        let plan = p.decide(30.0, &node(8.0));
        let got = cores_under(&plan, 8.0, 8.0);
        assert!(
            got[&id("scales")] > 5.0 && got[&id("stalls")] >= 1.0,
            "cores should follow the speed-up: {got:?}"
        );
    }

    #[test]
    fn hysteresis_keeps_near_equal_jobs_in_place() {
        let mut p = with_jobs(unguarded(), &["a", "b"]);
        p.decide(0.0, &node(1.0));
        teach_size(&mut p, 10.0, "a", 110.0, 10.0); // 100 left
        teach_size(&mut p, 10.0, "b", 115.0, 10.0); // 105 left
        p.decide(10.0, &node(1.0));
        assert_eq!(p.order, vec![id("a"), id("b")]);
        // b now has 95 left against a's 100: within 10%, no swap.
        usage(&mut p, 20.0, "b", 20.0);
        p.work_done(20.0, &id("b"), 20.0 / 115.0);
        p.decide(20.0, &node(1.0));
        assert_eq!(
            p.order,
            vec![id("a"), id("b")],
            "swapped on a 5% difference"
        );
        // b at 85 left: more than 10% less, it overtakes.
        usage(&mut p, 30.0, "b", 30.0);
        p.work_done(30.0, &id("b"), 30.0 / 115.0);
        p.decide(30.0, &node(1.0));
        assert_eq!(p.order, vec![id("b"), id("a")]);
    }

    #[test]
    fn no_hysteresis_swaps_on_any_difference() {
        let mut p = with_jobs(
            GovernorParams {
                hysteresis: 0.0,
                ..unguarded()
            },
            &["a", "b"],
        );
        p.decide(0.0, &node(1.0));
        teach_size(&mut p, 10.0, "a", 110.0, 10.0);
        teach_size(&mut p, 10.0, "b", 115.0, 10.0);
        p.decide(10.0, &node(1.0));
        usage(&mut p, 20.0, "b", 20.0);
        p.work_done(20.0, &id("b"), 20.0 / 115.0);
        p.decide(20.0, &node(1.0));
        assert_eq!(p.order, vec![id("b"), id("a")]);
    }

    #[test]
    fn operator_priority_outranks_remaining_work() {
        let mut p = Governor::new(unguarded());
        p.job_added(0.0, &JobSpec::new("small"));
        p.job_added(
            0.0,
            &JobSpec {
                priority: 1,
                ..JobSpec::new("important")
            },
        );
        p.decide(0.0, &node(1.0));
        teach_size(&mut p, 10.0, "small", 20.0, 10.0);
        teach_size(&mut p, 10.0, "important", 1000.0, 10.0);
        p.decide(10.0, &node(1.0));
        assert_eq!(p.order, vec![id("important"), id("small")]);
    }

    #[test]
    fn newcomers_without_a_position_are_served_first_by_default() {
        let mut p = with_jobs(unguarded(), &["old"]);
        p.decide(0.0, &node(1.0));
        teach_size(&mut p, 50.0, "old", 100.0, 50.0); // 50 left
        p.job_added(50.0, &JobSpec::new("new"));
        let plan = p.decide(50.0, &node(1.0));
        assert_eq!(p.order.first(), Some(&id("new")));
        assert!(plan.allocations[&id("new")].reason.contains("unknown"));
    }

    #[test]
    fn neutral_keeps_unknown_jobs_at_their_fair_share() {
        let mut p = with_jobs(
            GovernorParams {
                unknown: UnknownWork::Neutral,
                ..unguarded()
            },
            &["old"],
        );
        p.decide(0.0, &node(2.0));
        teach_size(&mut p, 50.0, "old", 100.0, 50.0);
        p.job_added(50.0, &JobSpec::new("new"));
        let plan = p.decide(50.0, &node(2.0));
        assert!(!p.order.contains(&id("new")));
        let got = cores_under(&plan, 2.0, 2.0);
        assert!((got[&id("new")] - 1.0).abs() < 0.02, "{got:?}");
    }

    #[test]
    fn a_job_projected_late_against_fair_sharing_is_guaranteed_its_share() {
        // Two small jobs and a big one that can use only one core (operator bound) on two
        // cores. Shortest-first would leave the big one at its floor until a small one is done
        // and finish it ~90 s after fair sharing would (budget 0.5 × 10% × ~1100 s = 55 s).
        let params = GovernorParams {
            makespan_guard: 0.0,
            ..GovernorParams::default()
        };
        let mut p = Governor::new(params);
        p.job_added(0.0, &JobSpec::new("a"));
        p.job_added(0.0, &JobSpec::new("c"));
        p.job_added(
            0.0,
            &JobSpec {
                bounds: Bounds {
                    max_cores: Some(1.0),
                    ..Bounds::default()
                },
                ..JobSpec::new("big")
            },
        );
        p.decide(0.0, &node(2.0));
        teach_size(&mut p, 10.0, "a", 200.0, 10.0);
        teach_size(&mut p, 10.0, "c", 300.0, 10.0);
        teach_size(&mut p, 10.0, "big", 1000.0, 10.0);
        let plan = p.decide(10.0, &node(2.0));
        assert!(p.urgent.contains(&id("big")), "urgent: {:?}", p.urgent);
        assert!(!p.urgent.contains(&id("a")) && !p.urgent.contains(&id("c")));
        let got = cores_under(&plan, 2.0, 2.0);
        // Fair share 2/3 core, plus the boost; never above its bound.
        assert!(got[&id("big")] >= 2.0 / 3.0, "{got:?}");
        assert_eq!(plan.allocations[&id("big")].cpu.max_cores, Some(1.0));
        assert!(plan.allocations[&id("big")].reason.contains("behind"));
        // Without the guard it would have been left at its floor.
        let mut q = Governor::new(unguarded());
        for j in ["a", "c"] {
            q.job_added(0.0, &JobSpec::new(j));
        }
        q.job_added(
            0.0,
            &JobSpec {
                bounds: Bounds {
                    max_cores: Some(1.0),
                    ..Bounds::default()
                },
                ..JobSpec::new("big")
            },
        );
        q.decide(0.0, &node(2.0));
        teach_size(&mut q, 10.0, "a", 200.0, 10.0);
        teach_size(&mut q, 10.0, "c", 300.0, 10.0);
        teach_size(&mut q, 10.0, "big", 1000.0, 10.0);
        let plan = q.decide(10.0, &node(2.0));
        assert!(cores_under(&plan, 2.0, 2.0)[&id("big")] < 0.1);
    }

    #[test]
    fn the_job_the_fair_makespan_hangs_on_gets_no_slack() {
        // Same node and jobs, but a slack so large that only the makespan guard can act.
        let setup = |guard: f64| {
            let mut p = Governor::new(GovernorParams {
                slack: 10.0,
                makespan_guard: guard,
                ..GovernorParams::default()
            });
            for j in ["a", "c"] {
                p.job_added(0.0, &JobSpec::new(j));
            }
            p.job_added(
                0.0,
                &JobSpec {
                    bounds: Bounds {
                        max_cores: Some(1.0),
                        ..Bounds::default()
                    },
                    ..JobSpec::new("big")
                },
            );
            p.decide(0.0, &node(2.0));
            teach_size(&mut p, 10.0, "a", 200.0, 10.0);
            teach_size(&mut p, 10.0, "c", 300.0, 10.0);
            teach_size(&mut p, 10.0, "big", 1000.0, 10.0);
            p.decide(10.0, &node(2.0));
            p
        };
        assert!(setup(0.05).urgent.contains(&id("big")));
        assert!(!setup(0.0).urgent.contains(&id("big")));
    }

    #[test]
    fn urgency_enters_above_the_allowance_and_leaves_below_half() {
        assert!(is_urgent(false, 11.0, 10.0));
        assert!(!is_urgent(false, 9.0, 10.0));
        assert!(is_urgent(true, 6.0, 10.0));
        assert!(!is_urgent(true, 4.0, 10.0));
        // A zero allowance (the makespan guard): any delay at all.
        assert!(is_urgent(false, 0.1, 0.0));
        assert!(!is_urgent(false, 0.0, 0.0));
    }

    #[test]
    fn a_promoted_job_is_judged_without_its_own_promotion() {
        // The late job of the guard test stays urgent decision after decision: with its boost
        // it would look on time, without it it is still late.
        let mut p = Governor::new(GovernorParams {
            makespan_guard: 0.0,
            ..GovernorParams::default()
        });
        for j in ["a", "c"] {
            p.job_added(0.0, &JobSpec::new(j));
        }
        p.job_added(
            0.0,
            &JobSpec {
                bounds: Bounds {
                    max_cores: Some(1.0),
                    ..Bounds::default()
                },
                ..JobSpec::new("big")
            },
        );
        p.decide(0.0, &node(2.0));
        teach_size(&mut p, 10.0, "a", 200.0, 10.0);
        teach_size(&mut p, 10.0, "c", 300.0, 10.0);
        teach_size(&mut p, 10.0, "big", 1000.0, 10.0);
        for t in [10.0, 11.0, 12.0, 13.0] {
            p.decide(t, &node(2.0));
            assert!(p.urgent.contains(&id("big")), "not urgent at {t}");
        }
    }

    #[test]
    fn claims_honour_floors_guarantees_and_scale_boosts_to_fit() {
        let params = GovernorParams::default();
        let job = |remaining: Option<f64>, urgent: bool| PlanJob {
            remaining,
            guessed: false,
            parallel_fraction: 0.9,
            limit: 4.0,
            min_cores: 0.0,
            urgent,
            learning_share: 1.0,
        };
        // Four jobs on 4 cores: fair share 1 each.
        let c = claims(
            4.0,
            &[
                job(Some(10.0), false),
                job(Some(20.0), false),
                job(None, false),
                job(Some(30.0), true),
            ],
            &params,
        );
        assert_eq!(c[0].value, 3.0);
        assert_eq!(c[1].value, 2.0);
        assert!((c[1].min - 0.1).abs() < 1e-12, "floor: {:?}", c[1]);
        assert_eq!((c[2].min, c[2].max, c[2].value), (1.0, 1.0, 0.0), "pinned");
        assert!((c[3].min - 1.25).abs() < 1e-12, "boosted: {:?}", c[3]);
        assert_eq!(
            c[0].value_above_one, 1.0,
            "spread 0: throughput above one core"
        );
        // A job ranked on a guessed size keeps its fair share.
        let mut guessed = job(Some(5.0), false);
        guessed.guessed = true;
        let c = claims(4.0, &[job(Some(1.0), false), guessed], &params);
        assert!((c[1].min - 2.0).abs() < 1e-12, "{:?}", c[1]);
        // Three urgent jobs of four: guarantees 3 + floor 0.1 leave 0.9 for boosts of 0.75
        // requested: they fit. Four urgent: no room, no boost.
        let all: Vec<PlanJob> = (0..4).map(|i| job(Some(f64::from(i + 1)), true)).collect();
        let c = claims(4.0, &all, &params);
        assert!(c.iter().all(|c| (c.min - 1.0).abs() < 1e-12), "{c:?}");
    }

    #[test]
    fn projection_follows_the_plan_to_each_completion() {
        let params = unguarded();
        let job = |remaining: f64| PlanJob {
            remaining: Some(remaining),
            guessed: false,
            parallel_fraction: 1.0,
            limit: 1.0,
            min_cores: 0.0,
            urgent: false,
            learning_share: 1.0,
        };
        // One core, linear jobs of 10 and 30: the first runs first (floor aside).
        let f = project(1.0, &[job(10.0), job(30.0)], &params);
        assert!((f[0] - 10.0 / (1.0 - 0.05)).abs() < 0.5, "{f:?}");
        assert!((f[1] - 40.0).abs() < 1e-6, "{f:?}");
        let unknown = PlanJob {
            remaining: None,
            ..job(1.0)
        };
        assert!(project(1.0, &[unknown], &params)[0].is_infinite());
    }

    #[test]
    fn a_job_using_less_than_offered_reveals_its_limit() {
        let mut p = with_jobs(unguarded(), &["a"]);
        usage(&mut p, 0.0, "a", 0.0);
        p.decide(0.0, &node(8.0));
        usage(&mut p, 1.0, "a", 2.0);
        assert_eq!(p.jobs[&id("a")].demand_limit, Some(2.0));
        // It can grow again: a later sample above the limit raises it.
        p.decide(1.0, &node(8.0));
        usage(&mut p, 2.0, "a", 5.0);
        assert_eq!(p.jobs[&id("a")].demand_limit, Some(3.0));
    }

    #[test]
    fn a_job_using_all_it_was_offered_has_no_known_limit() {
        let mut p = with_jobs(unguarded(), &["a", "b"]);
        usage(&mut p, 0.0, "a", 0.0);
        p.decide(0.0, &node(2.0));
        usage(&mut p, 1.0, "a", 1.0);
        assert_eq!(p.jobs[&id("a")].demand_limit, None);
    }

    #[test]
    fn new_progress_changes_the_very_next_decision() {
        let mut p = with_jobs(unguarded(), &["a", "b"]);
        p.decide(0.0, &node(1.0));
        teach_size(&mut p, 10.0, "a", 1000.0, 10.0);
        teach_size(&mut p, 10.0, "b", 2000.0, 10.0);
        let before = p.decide(10.0, &node(1.0));
        assert_eq!(before.next_decision_at, Some(11.0));
        assert_eq!(p.order, vec![id("a"), id("b")]);
        // 0.3 s later b reports it is nearly done: the decision at 10.3 already ranks it first.
        p.work_done(10.3, &id("b"), 0.999);
        p.decide(10.3, &node(1.0));
        assert_eq!(p.order, vec![id("b"), id("a")]);
    }

    #[test]
    fn categories_come_from_the_normalised_loss() {
        let mut p = with_jobs(unguarded(), &["a"]);
        for (i, v) in [100.0, 60.0, 40.0, 30.0].iter().enumerate() {
            let t = i as f64 * 10.0;
            usage(&mut p, t, "a", t);
            p.progress(
                t,
                &id("a"),
                ProgressPoint {
                    at: t,
                    value: *v,
                    new_segment: false,
                },
            );
        }
        let plan = p.decide(30.0, &node(1.0));
        assert_eq!(
            plan.allocations[&id("a")].category,
            crate::Category::Progressing
        );
        // A restart forgets the curve.
        p.progress(
            40.0,
            &id("a"),
            ProgressPoint {
                at: 40.0,
                value: 100.0,
                new_segment: true,
            },
        );
        let plan = p.decide(40.0, &node(1.0));
        assert_eq!(
            plan.allocations[&id("a")].category,
            crate::Category::Unknown
        );
    }

    /// Feed both jobs one loss value per second from `from` to `to` (seconds), each using one
    /// core: `a` follows `loss_a(t)`, `b` follows `loss_b(t)`.
    fn learn(
        p: &mut Governor,
        (from, to): (usize, usize),
        loss_a: impl Fn(usize) -> f64,
        loss_b: impl Fn(usize) -> f64,
    ) {
        for k in from..to {
            let t = k as f64;
            for (job, v) in [("a", loss_a(k)), ("b", loss_b(k))] {
                usage(p, t, job, t);
                p.progress(
                    t,
                    &id(job),
                    ProgressPoint {
                        at: t,
                        value: v,
                        new_segment: false,
                    },
                );
            }
            p.decide(t, &node(2.0));
        }
    }

    #[test]
    fn a_converged_job_of_unknown_size_yields_to_a_learning_one() {
        // Loss falling at a steady pace: still learning.
        let learning = |k: usize| 2.0 - 0.01 * k as f64;
        let run = |params: GovernorParams| {
            let mut p = with_jobs(params, &["a", "b"]);
            learn(&mut p, (0, 10), learning, learning);
            let before = p.decide(10.0, &node(2.0));
            // a's loss stops moving, b keeps learning.
            learn(&mut p, (10, 40), |_| learning(10), learning);
            (before, p.decide(40.0, &node(2.0)))
        };
        let (before, after) = run(GovernorParams::default());
        let weight = |plan: &Plan, job: &str| plan.allocations[&id(job)].cpu.weight;
        assert_eq!(weight(&before, "a"), weight(&before, "b"), "{before:?}");
        let a = &after.allocations[&id("a")];
        assert_eq!(a.category, Category::Converged, "{after:?}");
        assert_eq!(
            after.allocations[&id("b")].category,
            Category::Progressing,
            "{after:?}"
        );
        assert!(
            f64::from(weight(&after, "b")) >= 1.9 * f64::from(weight(&after, "a")),
            "the learning job gets the converged one's share beyond its 50% floor: {after:?}"
        );
        assert!(a.reason.contains("yields"), "{}", a.reason);
        // With the yield switched off the converged job keeps its fair share.
        let (_, after) = run(GovernorParams {
            converged_share: 1.0,
            watching_share: 1.0,
            ..GovernorParams::default()
        });
        assert_eq!(weight(&after, "a"), weight(&after, "b"), "{after:?}");
    }

    #[test]
    fn yield_shares_are_validated() {
        let mut params = GovernorParams::default();
        params.set("converged_share", "0.1").unwrap();
        assert_eq!(params.converged_share, 0.1);
        assert!(params.set("watching_share", "1.5").is_err());
    }

    #[test]
    fn operator_minimum_is_guaranteed() {
        let mut p = Governor::new(unguarded());
        p.job_added(0.0, &JobSpec::new("small"));
        p.job_added(
            0.0,
            &JobSpec {
                bounds: Bounds {
                    min_cores: Some(1.5),
                    ..Bounds::default()
                },
                ..JobSpec::new("big")
            },
        );
        p.decide(0.0, &node(2.0));
        teach_size(&mut p, 10.0, "small", 100.0, 10.0);
        teach_size(&mut p, 10.0, "big", 10000.0, 10.0);
        let plan = p.decide(10.0, &node(2.0));
        let got = cores_under(&plan, 2.0, 2.0);
        assert!(got[&id("big")] >= 1.5 - 0.02, "{got:?}");
    }

    #[test]
    fn removed_jobs_leave_the_plan_and_an_empty_node_asks_for_nothing() {
        let mut p = with_jobs(GovernorParams::default(), &["a", "b"]);
        p.decide(0.0, &node(2.0));
        p.job_removed(5.0, &id("a"));
        let plan = p.decide(5.0, &node(2.0));
        assert_eq!(plan.allocations.len(), 1);
        p.job_removed(6.0, &id("b"));
        let plan = p.decide(6.0, &node(2.0));
        assert!(plan.allocations.is_empty());
        assert_eq!(plan.next_decision_at, None);
        // Unknown ids are ignored everywhere.
        p.usage(7.0, &id("zzz"), Usage::default());
        p.work_done(7.0, &id("zzz"), 0.5);
        p.job_removed(7.0, &id("zzz"));
    }

    #[test]
    fn the_virtual_fair_twin_outlives_a_job_that_finished_early() {
        let mut p = with_jobs(unguarded(), &["a", "b"]);
        p.decide(0.0, &node(1.0));
        teach_size(&mut p, 10.0, "a", 20.0, 10.0);
        teach_size(&mut p, 10.0, "b", 100.0, 10.0);
        p.decide(10.0, &node(1.0));
        p.job_removed(20.0, &id("a"));
        p.decide(20.0, &node(1.0));
        // Under fair sharing a (20 units) had 0.5 core: its twin finishes at 40, not 20.
        p.decide(50.0, &node(1.0));
        let finished = p.virtual_finish[&id("a")];
        assert!(
            (finished - 40.0).abs() < 1e-6,
            "twin finished at {finished}"
        );
    }

    #[test]
    fn the_same_calls_give_the_same_plans() {
        let run = || {
            let mut p = with_jobs(GovernorParams::default(), &["a", "b", "c"]);
            let mut plans = Vec::new();
            plans.push(p.decide(0.0, &node(2.0)));
            teach_size(&mut p, 10.0, "a", 200.0, 10.0);
            teach_size(&mut p, 10.0, "b", 900.0, 10.0);
            plans.push(p.decide(10.0, &node(2.0)));
            teach_size(&mut p, 20.0, "c", 300.0, 20.0);
            plans.push(p.decide(20.0, &node(2.0)));
            plans
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn spec_parameters_are_validated() {
        let mut params = GovernorParams::default();
        for (k, v) in [
            ("spread", "0.5"),
            ("floor", "0"),
            ("slack", "0.2"),
            ("urgency_margin", "1"),
            ("makespan_guard", "0"),
            ("hysteresis", "0.3"),
            ("smoothing", "0.5"),
            ("interval", "5"),
            ("order", "fair_deadline"),
            ("unknown", "neutral"),
            ("project_boosts", "false"),
        ] {
            params.set(k, v).unwrap_or_else(|e| panic!("{k}={v}: {e}"));
        }
        assert_eq!(params.order, RankBy::FairDeadline);
        assert_eq!(params.unknown, UnknownWork::Neutral);
        for (k, v) in [
            ("floor", "2"),
            ("order", "x"),
            ("unknown", "x"),
            ("nope", "1"),
        ] {
            assert!(params.set(k, v).is_err(), "{k}={v} accepted");
        }
    }

    /// The kernel's share of `cores` under the plan's weights, each job using at most its
    /// `demand`.
    fn kernel_shares(
        plan: &Plan,
        cores: f64,
        demand: &BTreeMap<JobId, f64>,
    ) -> BTreeMap<JobId, f64> {
        let ids: Vec<JobId> = plan.allocations.keys().cloned().collect();
        let requests: Vec<ShareRequest> = ids
            .iter()
            .map(|i| ShareRequest {
                weight: plan.allocations[i].cpu.weight,
                max_cores: plan.allocations[i].cpu.max_cores,
                demand: demand[i],
            })
            .collect();
        ids.into_iter().zip(water_fill(cores, &requests)).collect()
    }

    /// Three jobs of unknown size on 2 cores, all learning; `quiet` uses no CPU for its first
    /// 10 s (loading data), then wants 2 cores. Returns its share of the node each second after
    /// it became busy, with or without a measured CPU wait.
    fn quiet_job_shares(measure_wait: bool) -> Vec<f64> {
        let mut p = Governor::default();
        let jobs = ["busy1", "busy2", "quiet"];
        for j in jobs {
            p.job_added(0.0, &JobSpec::new(j));
        }
        let mut cpu: BTreeMap<JobId, f64> = jobs.iter().map(|j| (id(j), 0.0)).collect();
        let mut wait: BTreeMap<JobId, f64> = cpu.clone();
        let mut after = Vec::new();
        let mut plan = p.decide(0.0, &node(2.0));
        for step in 1..=20 {
            let now = step as f64;
            let demand: BTreeMap<JobId, f64> = jobs
                .iter()
                .map(|j| {
                    (
                        id(j),
                        if *j == "quiet" && now <= 10.0 {
                            0.0
                        } else {
                            2.0
                        },
                    )
                })
                .collect();
            let got = kernel_shares(&plan, 2.0, &demand);
            for j in jobs {
                *cpu.get_mut(&id(j)).unwrap() += got[&id(j)];
                *wait.get_mut(&id(j)).unwrap() += (demand[&id(j)].min(2.0) - got[&id(j)]).max(0.0);
                p.usage(
                    now,
                    &id(j),
                    Usage {
                        at: now,
                        cpu_seconds: cpu[&id(j)],
                        cpu_wait_seconds: measure_wait.then(|| wait[&id(j)]),
                        ..Usage::default()
                    },
                );
            }
            if now > 10.0 {
                after.push(got[&id("quiet")]);
            }
            plan = p.decide(now, &node(2.0));
        }
        after
    }

    #[test]
    fn a_job_that_was_quiet_gets_its_floor_at_once_and_its_fair_share_within_two_seconds() {
        let fair = 2.0 / 3.0;
        let floor = GovernorParams::default().floor * fair;
        for measure_wait in [true, false] {
            let shares = quiet_job_shares(measure_wait);
            // The first second it wants CPU it runs on the plan made while it was quiet.
            assert!(
                shares[0] >= floor * 0.99,
                "wait measured: {measure_wait}: {:.3} cores in its first busy second, floor {floor:.3}",
                shares[0]
            );
            // Within 2 s (the probe), and for good: its fair share.
            for (s, got) in shares.iter().enumerate().skip(2) {
                assert!(
                    *got >= 0.95 * fair,
                    "wait measured: {measure_wait}: {got:.3} cores {}s after it became busy (fair {fair:.3}): {shares:?}",
                    s + 1
                );
            }
        }
    }
}
