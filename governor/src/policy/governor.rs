//! `governor`: our policy. (Module doc: see the end of this task.)

use std::collections::{BTreeMap, BTreeSet};

use super::allocate::{Claim, allocate};
use super::share::{ShareRequest, fair_shares, water_fill};
use super::signal::{LossTracker, StageThresholds};
use super::speedup::{PRIOR_PARALLEL_FRACTION, SpeedupFit, amdahl_speed};
use super::{
    Allocation, CpuAllocation, JobId, JobSpec, MIN_CAP_CORES, MemoryAllocation, NodePolicy,
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
    /// Completion time under fair sharing, stretched by the slack (earliest first).
    FairDeadline,
    /// Time to spare before that deadline if the job ran as fast as it can from now on.
    Laxity,
}

/// The governor policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GovernorParams {
    /// Exponent of the rank values: the job with the `k`-th most remaining work of `n` is worth
    /// `k^concentration`. 0 ignores remaining work (pure throughput); 1 is the fluid optimum
    /// of mean completion time; larger values approach strict shortest-remaining-first.
    pub concentration: f64,
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
}

impl Default for GovernorParams {
    fn default() -> Self {
        GovernorParams {
            concentration: 1.0,
            spread: 0.0,
            floor: 0.1,
            slack: 0.1,
            urgency_margin: 0.5,
            makespan_guard: 0.05,
            hysteresis: 0.1,
            smoothing: 0.3,
            interval: 1.0,
            order: RankBy::default(),
            unknown: UnknownWork::default(),
            project_boosts: true,
        }
    }
}

impl GovernorParams {
    /// Set a parameter by name.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let num = |min: f64, max: f64| -> Result<f64, String> {
            let v: f64 = super::parse_param(key, value)?;
            if v.is_finite() && v >= min && v <= max {
                Ok(v)
            } else {
                Err(format!("{key} must be in [{min}, {max}], not {value}"))
            }
        };
        match key {
            "concentration" => self.concentration = num(0.0, 100.0)?,
            "floor" => self.floor = num(0.0, 1.0)?,
            "spread" => self.spread = num(0.0, 1.0)?,
            "slack" => self.slack = num(0.0, 1000.0)?,
            "urgency_margin" => self.urgency_margin = num(0.0, 10.0)?,
            "makespan_guard" => self.makespan_guard = num(0.0, 1.0)?,
            "hysteresis" => self.hysteresis = num(0.0, 0.99)?,
            "smoothing" => self.smoothing = num(0.001, 1.0)?,
            "interval" => self.interval = num(0.001, 3600.0)?,
            "project_boosts" => self.project_boosts = super::parse_param(key, value)?,
            "unknown" => {
                self.unknown = match value {
                    "attained" => UnknownWork::Attained,
                    "neutral" => UnknownWork::Neutral,
                    _ => return Err(format!("unknown is attained or neutral, not {value:?}")),
                }
            }
            "order" => {
                self.order = match value {
                    "remaining" => RankBy::Remaining,
                    "fair_deadline" => RankBy::FairDeadline,
                    "laxity" => RankBy::Laxity,
                    _ => return Err(format!("order is remaining or fair_deadline, not {value:?}")),
                }
            }
            _ => return Err(format!("unknown parameter {key:?}")),
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
    tracker: LossTracker,
}

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
        let key = |id: &JobId| (self.jobs[id].spec.priority, keys[id]);
        let mut order: Vec<JobId> = self
            .order
            .iter()
            .filter(|id| keys.contains_key(*id))
            .cloned()
            .collect();
        let mut newcomers: Vec<JobId> = keys
            .keys()
            .filter(|id| !order.contains(id))
            .cloned()
            .collect();
        newcomers.sort_by(|a, b| {
            let (pa, ka) = key(a);
            let (pb, kb) = key(b);
            pb.cmp(&pa).then(ka.total_cmp(&kb)).then(a.cmp(b))
        });
        for n in newcomers {
            let (pn, kn) = key(&n);
            let pos = order
                .iter()
                .position(|o| {
                    let (po, ko) = key(o);
                    pn > po || (pn == po && kn < ko)
                })
                .unwrap_or(order.len());
            order.insert(pos, n);
        }
        let h = self.params.hysteresis.clamp(0.0, 0.99);
        loop {
            let mut swapped = false;
            for i in 1..order.len() {
                let (pa, ka) = key(&order[i - 1]);
                let (pb, kb) = key(&order[i]);
                if pb > pa || (pb == pa && kb < ka - h * ka.abs().max(kb.abs()).max(1.0)) {
                    order.swap(i - 1, i);
                    swapped = true;
                }
            }
            if !swapped {
                break;
            }
        }
        order
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
            RankBy::FairDeadline | RankBy::Laxity => remaining
                .iter()
                .map(|(id, left)| {
                    let job = &self.jobs[id];
                    let fair = fair_finish.get(id).copied().unwrap_or(f64::INFINITY);
                    let deadline = fair + self.params.slack * (fair - job.submitted).max(0.0);
                    let key = if self.params.order == RankBy::Laxity {
                        // Time to spare if it ran as fast as it can from now on.
                        let fastest = job.fit.speed(job.demand_limit.unwrap_or(cores));
                        deadline - now - left / fastest.max(1e-9)
                    } else {
                        deadline - now
                    };
                    (id.clone(), key)
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
                PlanJob {
                    remaining: remaining.get(id).copied(),
                    parallel_fraction: job.parallel_fraction(),
                    limit: job.demand_limit.unwrap_or(cores),
                    urgent: self.params.project_boosts && self.urgent.contains(id),
                }
            })
            .collect();
        // Where the current plan leads if nothing else arrives, against where fair sharing
        // leads. A promoted job looks on time with its promotion, so it is only demoted once it
        // looks early by the margin (no flapping).
        let projected = project(cores, &plan, &self.params);
        let margin = self.params.urgency_margin.max(0.0);
        let last_fair = fair_finish
            .iter()
            .filter(|(id, _)| self.jobs.contains_key(*id))
            .map(|(_, f)| *f)
            .filter(|f| f.is_finite())
            .fold(now, f64::max);
        let mut urgent = BTreeSet::new();
        for ((id, p), offset) in ids.iter().zip(plan.iter_mut()).zip(&projected) {
            let Some(&fair) = fair_finish.get(id) else {
                continue;
            };
            if p.remaining.is_none() || !fair.is_finite() || !offset.is_finite() {
                continue;
            }
            // The job the node's fair makespan hangs on gets no slack: delaying it delays
            // everyone's last completion.
            let budget = if fair >= last_fair - self.params.makespan_guard * (last_fair - now) {
                0.0
            } else {
                self.params.slack * (fair - self.jobs[id].submitted)
            };
            let delay = now + offset - fair;
            let threshold = match (self.urgent.contains(id), self.params.project_boosts) {
                (true, true) => -margin * budget,
                (true, false) => margin * budget / 2.0,
                (false, _) => margin * budget,
            };
            p.urgent = delay > threshold;
            if p.urgent {
                urgent.insert(id.clone());
            }
        }
        self.urgent = urgent;
        self.order = order;
        let targets = allocate(cores, &claims(cores, &plan, &self.params));
        ids.into_iter().zip(targets).collect()
    }
}

/// How far above its fair share an urgent job is lifted (when that fits).
const URGENT_BOOST: f64 = 0.25;

/// A job as the planner sees it.
#[derive(Clone, Debug)]
struct PlanJob {
    /// Work units left (None: unknown).
    remaining: Option<f64>,
    parallel_fraction: f64,
    /// Most cores it can use.
    limit: f64,
    urgent: bool,
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
                    min: *fair_share,
                    max: *fair_share,
                };
            }
            let value = (ranked - position).powf(params.concentration.max(0.0));
            position += 1.0;
            // An urgent job is guaranteed its fair share (fair shares always fit together) and
            // a boost above it, so it wins back the time it lent; the boosts are scaled down
            // together when they do not fit beside everyone's guarantee.
            let min = if job.urgent {
                (*fair_share * (1.0 + URGENT_BOOST * boost_scale)).min(job.limit)
            } else {
                params.floor.clamp(0.0, 1.0) * fair_share
            };
            Claim {
                value,
                value_above_one: value.powf(params.spread.clamp(0.0, 1.0)),
                parallel_fraction: job.parallel_fraction,
                min,
                max: job.limit,
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
            if left[i].is_finite() && left[i] <= 1e-9 * jobs[i].remaining.unwrap_or(1.0).max(1.0)
            {
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
                // Clearly less than every plan of the interval offered it: it cannot use more
                // than it ever has.
                if let Some(offered) = job.min_expected_cores
                    && cores < 0.9 * offered
                {
                    job.demand_limit = Some(job.demand_seen);
                }
                if let Some(limit) = job.demand_limit
                    && job.demand_seen > limit
                {
                    job.demand_limit = Some(job.demand_seen);
                }
            }
        }
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
        self.advance_virtual(now);
        let targets = self.targets(now);
        let total: f64 = targets.values().sum::<f64>().max(1e-9);
        let m = self.jobs.len() as f64;
        let ids: Vec<JobId> = self.jobs.keys().cloned().collect();
        let weights: Vec<u32> = ids
            .iter()
            .map(|id| {
                (targets.get(id).copied().unwrap_or(0.0) / total * 100.0 * m)
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
                    None => format!(
                        "governor: remaining work unknown, fair share (~{expected:.2} cores)"
                    ),
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
