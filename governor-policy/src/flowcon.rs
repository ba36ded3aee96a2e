//! `flowcon`: FlowCon's worker-side algorithms (Mao et al., "Elastic Resource Management for Deep
//! Learning Applications in a Container Cluster", IEEE TCC 2023): dynamic limits from growth
//! efficiency (Algorithm 1), listeners (Algorithm 2) and the adaptive threshold (Algorithm 3).
//! Placement (Algorithm 4) belongs to the coordinator.
//!
//! # The algorithm, as implemented
//!
//! Every job is in one of three lists: NL (new, learning fast; [`Category::Progressing`]), WL
//! (watching; [`Category::Watching`]) and CL (completing; [`Category::Converged`]). Each job has a
//! *limit* `L ∈ (0, 1]`, a fraction of the node's CPU; it starts at 1.
//!
//! *Growth efficiency* (Eq. 1-2) is progress per second divided by the average resource used in
//! the same interval: `G = (|ΔE|/Δt) / (Δcpu/Δt) = |ΔE| / Δcpu`, the change of the evaluation
//! function per CPU-second. It is measured between the job's latest progress value at the previous
//! evaluation and its latest value now, with the job's cumulative CPU time at the moment each value
//! was observed.
//!
//! An *evaluation* runs every `itval` seconds and immediately when a listener fires (a job arrived
//! or left: Algorithm 2 puts a new job in NL with `L = 1`, forgets a departed one, resets `itval`
//! to its initial value and runs the evaluation). An evaluation is:
//! 1. measure `G` for every job that has logged a new value since it was last measured;
//! 2. Algorithm 3 (threshold `α`), when a listener fired (a job arrived or left): all jobs in CL
//!    → `α = -1` (Algorithm 1 deactivated, free competition); a single job → `α = G/2`;
//!    otherwise `α = (mean G over NL + mean G over CL)/2`, where the mean of a list with no
//!    measured job counts as 0. Between listener events `α` stays as it was (see below);
//! 3. Algorithm 1 (lists), unless `α = -1`, for every job measured in step 1: `G ≥ α` → NL;
//!    `G < α` moves NL → WL and WL → CL; a CL job with `G < α` stays in CL;
//! 4. Algorithm 1 (limits): if every job is in CL, `α = -1`, every limit is 1 and `itval`
//!    doubles (exponential back-off: the free-competition stage, left only when a job arrives);
//!    otherwise a CL job gets `max(G/ΣG, cl_floor)`, a WL job keeps its limit and an NL job gets
//!    1 (`nl_uncapped`, the prose) or `G/ΣG` (the pseudocode), where `ΣG` sums every job's
//!    latest `G`.
//!
//! A limit is *soft*, as the paper says twice (§5.1: "soft limits, which means that even if the
//! container cannot maximize its own resource, the unused option will be utilized by others";
//! §6.4: "the unused resource will not waste"): it is written as a `cpu.weight` proportional to
//! `L` (the limits of the node's jobs, normalised so that the weights average 100), never as a
//! cap, so a core a job leaves idle goes to the others. `hard_limits = true` writes
//! `cpu.max = L × cores` instead (Docker's `--cpus`, which the paper names as its mechanism:
//! a hard cap, kept for comparison). Memory is left alone (the paper's evaluation manages CPU
//! only). Operator [`Bounds`] win over the algorithm.
//!
//! # Where the paper is ambiguous, and the reading taken
//!
//! - **Algorithm 3, line 13** averages NL and *WL*; the prose ("the half of the average gain of NL
//!   and CL") averages NL and *CL*. We take the prose by default: the threshold is then the
//!   midpoint between the fast and the slow group, which is what a threshold separating them
//!   should be. [`ThresholdLists::NewAndWatching`] selects the pseudocode's reading; the
//!   single-node comparison in docs/evaluation/simulator.md measures both.
//! - **Algorithm 3 uses per-second progress `P`, Algorithm 1 compares growth efficiency `G = P/R`
//!   with the result.** The two have different units (they differ by the cores a job uses), so we
//!   compute `α` from `G`, the quantity it is compared with.
//! - **Empty lists in Algorithm 3, line 13** divide by zero. An empty second list (CL, or WL)
//!   counts as 0, which makes the multi-job rule agree with the single-job rule (`α = G/2`) when
//!   every measured job is in NL, and so does an empty NL (the remaining jobs are then ranked
//!   among themselves). **NL whose jobs have no measurement** beside measured others is the
//!   moment a newcomer joins a node whose jobs are all in WL/CL (after free competition too):
//!   the newcomer has no progress yet, so the line's `α_nl/|NL|` is 0 and `α` would be half the
//!   others' mean, promoting most of them back to NL uncapped exactly when the paper favours the
//!   newcomer. §6 reports the opposite ("Even when Job-3 joins the system, resources for Job-2
//!   will not reduce too much since it is still in the WL, not CL": Job-2 keeps its list). We
//!   read an unmeasured job's progress as unknown, not 0: the threshold is kept (the lists stay
//!   as they were; after free competition `α` stays -1, so the older jobs keep their list while
//!   the newcomer runs uncapped in NL) and Algorithm 3 runs again at each evaluation until an NL
//!   job has been measured.
//! - **Algorithm 1, line 17** doubles `itval` inside the per-container loop; the prose says the
//!   interval doubles. We double once per evaluation, capped at [`FlowConParams::max_interval`]
//!   (the paper has no cap; the cap only bounds how stale limits can get between listener events).
//! - **Algorithm 1, line 22**: the lower bound `1/|c_id|`, read as one over the number of jobs,
//!   would keep every completing job at its equal share, so FlowCon could never take CPU from a
//!   converged job; the paper's own runs show completing jobs far below it (Job-8 at ~3% beside
//!   two others, §6.4). We read it as the small lower bound the prose describes ("to prevent
//!   abnormal behavior caused by limited resources"): `cl_floor`, 5% of the node.
//! - **When `α` is computed.** Recomputed at every evaluation from the current lists, the last NL
//!   job always has `G ≥ α` (it is part of the NL mean), so the free-competition stage of
//!   Algorithm 3 could never be reached, yet the paper reports FlowCon in it for 31-62% of its
//!   60-job runs. §5.4 runs Algorithm 3 "when a new container joins this worker": we compute `α`
//!   on listener events (arrivals and departures) and keep it between them, so the jobs' decaying
//!   `G` fall below it one by one until all are in CL.
//! - **Algorithm 1, line 24** ("limits in WL remain unchanged") is taken literally: a watched job
//!   keeps whatever limit it had, including 1.
//! - **Line 26** gives an NL job `G/ΣG` although the prose says NL jobs get *more* resources and
//!   §6.3 sets an NL job's "resource limit to 1, allowing for the maximum resource"; we follow the
//!   prose and the experiment (`nl_uncapped = true`; `false` gives the pseudocode's `G/ΣG`).
//! - **Jobs without a new value since the last evaluation** (their log interval is longer than
//!   `itval`) cannot have `G` computed; they keep their list and limit, and their latest `G` still
//!   counts in `ΣG`. Reading "no new value" as `G = 0` would demote every job that logs less often
//!   than FlowCon looks.
//! - **Initial values**: the paper gives none for `itval` or `α`. `α` needs none (Algorithm 3 runs
//!   before Algorithm 1 at every evaluation); `itval` defaults to 10 s (see [`FlowConParams`]).

use std::collections::BTreeMap;

use super::ParamError;
use super::{
    Allocation, Bounds, Category, CpuAllocation, JobId, JobSpec, MemoryAllocation, NodePolicy,
    NodeResources, Plan, ProgressPoint, Seconds, Usage, clamp_cores,
};

/// Which lists Algorithm 3 averages to set the threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ThresholdLists {
    /// NL and CL, as the paper's prose says (the default).
    #[default]
    NewAndCompleting,
    /// NL and WL, as the pseudocode's line 13 says.
    NewAndWatching,
}

/// FlowCon's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowConParams {
    /// Initial evaluation interval `itval`, seconds. The paper gives no value; 10 s lets FlowCon
    /// see a few log lines of a typical job per interval and reacts within the 13-40 s arrival
    /// gaps of the paper's experiments. Default 10.
    pub interval: Seconds,
    /// Cap on the exponential back-off of `itval`, seconds. Default 320 (five doublings).
    pub max_interval: Seconds,
    /// Which lists set the threshold (Algorithm 3). Default: NL and CL (the prose).
    pub threshold_lists: ThresholdLists,
    /// NL jobs get the full node (the prose: "allocate more resources to containers in NL";
    /// §6.3: "resource limit to 1") instead of `G/ΣG` (line 26). Default true.
    pub nl_uncapped: bool,
    /// The lower bound of a CL job's limit, a fraction of the node. Default 0.05.
    pub cl_floor: f64,
    /// Write limits as `cpu.max` caps (Docker `--cpus`) instead of soft weights. Default false.
    pub hard_limits: bool,
}

impl Default for FlowConParams {
    fn default() -> Self {
        FlowConParams {
            interval: 10.0,
            max_interval: 320.0,
            threshold_lists: ThresholdLists::default(),
            nl_uncapped: true,
            cl_floor: 0.05,
            hard_limits: false,
        }
    }
}

impl FlowConParams {
    /// Set a parameter by name (`interval`, `max_interval`, `threshold_lists` = `nl_cl` | `nl_wl`,
    /// `nl_uncapped` = `true` | `false`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        match key {
            "interval" => self.interval = positive(key, value)?,
            "max_interval" => self.max_interval = positive(key, value)?,
            "nl_uncapped" => self.nl_uncapped = super::parse_param(key, value)?,
            "hard_limits" => self.hard_limits = super::parse_param(key, value)?,
            "cl_floor" => {
                let v: f64 = super::parse_param(key, value)?;
                if !(v.is_finite() && v > 0.0 && v <= 1.0) {
                    return Err(ParamError::invalid(
                        key,
                        format!("cl_floor must be in (0, 1], not {value}"),
                    ));
                }
                self.cl_floor = v;
            }
            "threshold_lists" => {
                self.threshold_lists = match value {
                    "nl_cl" => ThresholdLists::NewAndCompleting,
                    "nl_wl" => ThresholdLists::NewAndWatching,
                    _ => {
                        return Err(ParamError::invalid(
                            key,
                            format!("threshold_lists is nl_cl or nl_wl, not {value:?}"),
                        ));
                    }
                }
            }
            _ => return Err(ParamError::Unknown(key.to_owned())),
        }
        Ok(())
    }
}

fn positive(key: &str, value: &str) -> Result<f64, ParamError> {
    let v: f64 = super::parse_param(key, value)?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(ParamError::invalid(
            key,
            format!("{key} must be a positive number, not {value}"),
        ))
    }
}

/// FlowCon's lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    New,
    Watching,
    Completing,
}

impl List {
    fn category(self) -> Category {
        match self {
            List::New => Category::Progressing,
            List::Watching => Category::Watching,
            List::Completing => Category::Converged,
        }
    }
}

/// A progress value with the job's cumulative CPU time when it was observed.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Observation {
    at: Seconds,
    value: f64,
    cpu_seconds: f64,
}

#[derive(Clone, Debug)]
struct JobState {
    bounds: Bounds,
    list: List,
    /// Fraction of the node's CPU, in (0, 1].
    limit: f64,
    /// Latest growth efficiency measured (None until two observations with CPU in between).
    growth: Option<f64>,
    /// Growth measured in the evaluation that is running (None: no new value this time).
    fresh_growth: Option<f64>,
    /// Latest cumulative CPU seconds reported.
    cpu_seconds: f64,
    /// Latest observed progress value.
    latest: Option<Observation>,
    /// The observation the next growth is measured from.
    baseline: Option<Observation>,
}

impl JobState {
    fn new(bounds: Bounds) -> Self {
        JobState {
            bounds,
            list: List::New,
            limit: 1.0,
            growth: None,
            fresh_growth: None,
            cpu_seconds: 0.0,
            latest: None,
            baseline: None,
        }
    }
}

/// FlowCon's Algorithms 1-3 on one node.
#[derive(Debug)]
pub struct FlowCon {
    params: FlowConParams,
    jobs: BTreeMap<JobId, JobState>,
    /// Current threshold; -1 deactivates Algorithm 1.
    alpha: f64,
    /// `alpha` was computed from measured growth (before that, every evaluation computes it).
    alpha_set: bool,
    itval: Seconds,
    /// When the next periodic evaluation is due (None: at the next decide).
    next_run_at: Option<Seconds>,
    /// A listener fired: evaluate at the next decide.
    listener_fired: bool,
    cores_seen: f64,
}

impl Default for FlowCon {
    fn default() -> Self {
        Self::new(FlowConParams::default())
    }
}

impl FlowCon {
    pub fn new(params: FlowConParams) -> Self {
        FlowCon {
            params,
            jobs: BTreeMap::new(),
            alpha: 0.0,
            alpha_set: false,
            itval: params.interval,
            next_run_at: None,
            listener_fired: false,
            cores_seen: 0.0,
        }
    }

    /// The current threshold `α` (-1 when Algorithm 1 is deactivated).
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The current evaluation interval `itval`.
    pub fn interval(&self) -> Seconds {
        self.itval
    }

    /// A job's limit as a fraction of the node, if the job is known.
    pub fn limit(&self, id: &JobId) -> Option<f64> {
        self.jobs.get(id).map(|j| j.limit)
    }

    /// A job's latest growth efficiency, if measured.
    pub fn growth(&self, id: &JobId) -> Option<f64> {
        self.jobs.get(id).and_then(|j| j.growth)
    }

    fn listener(&mut self) {
        // Algorithm 2, lines 8/16-17: reset the interval and run Algorithm 1 now.
        self.itval = self.params.interval;
        self.listener_fired = true;
    }

    /// One evaluation: measurement, Algorithm 3 (on listener events), Algorithm 1.
    fn evaluate(&mut self, now: Seconds) {
        self.measure();
        if self.listener_fired || !self.alpha_set {
            match self.adaptive_threshold() {
                Some(alpha) => {
                    self.alpha = alpha;
                    self.alpha_set = self.jobs.values().any(|j| j.fresh_growth.is_some());
                }
                // No NL job measured yet beside measured others (a newcomer's first interval):
                // the lists keep the threshold they had until the newcomer's progress is known.
                None => self.alpha_set = false,
            }
        }
        if self.alpha != -1.0 {
            self.categorise();
        }
        self.set_limits();
        self.next_run_at = Some(now + self.itval);
        self.listener_fired = false;
    }

    fn measure(&mut self) {
        for job in self.jobs.values_mut() {
            job.fresh_growth = None;
            let (Some(latest), Some(baseline)) = (job.latest, job.baseline) else {
                job.baseline = job.latest;
                continue;
            };
            let cpu = latest.cpu_seconds - baseline.cpu_seconds;
            if latest.at <= baseline.at || cpu <= 0.0 {
                // No new value, or no CPU accounted in between yet: nothing to measure; keep
                // the baseline so the next measurement spans the whole interval.
                continue;
            }
            let g = (latest.value - baseline.value).abs() / cpu;
            job.fresh_growth = Some(g);
            job.growth = Some(g);
            job.baseline = Some(latest);
        }
    }

    /// Algorithm 3; `None` while it cannot be formed yet: the NL jobs (a newcomer) have no
    /// measurement while jobs of the other list do (see the module's readings).
    fn adaptive_threshold(&self) -> Option<f64> {
        if !self.jobs.is_empty() && self.jobs.values().all(|j| j.list == List::Completing) {
            return Some(-1.0);
        }
        if self.jobs.len() == 1 {
            let job = self.jobs.values().next().expect("one job");
            return Some(match job.fresh_growth {
                Some(g) => g / 2.0,
                None => self.alpha.max(0.0),
            });
        }
        let second = match self.params.threshold_lists {
            ThresholdLists::NewAndCompleting => List::Completing,
            ThresholdLists::NewAndWatching => List::Watching,
        };
        let measured = |list: List| -> Vec<f64> {
            self.jobs
                .values()
                .filter(|j| j.list == list)
                .filter_map(|j| j.fresh_growth)
                .collect()
        };
        let (new, other) = (measured(List::New), measured(second));
        let newcomer = self.jobs.values().any(|j| j.list == List::New);
        if newcomer && new.is_empty() && !other.is_empty() {
            return None;
        }
        let mean = |gs: &[f64]| {
            if gs.is_empty() {
                0.0
            } else {
                gs.iter().sum::<f64>() / gs.len() as f64
            }
        };
        Some((mean(&new) + mean(&other)) / 2.0)
    }

    /// Algorithm 1, lines 2-13.
    fn categorise(&mut self) {
        let alpha = self.alpha;
        for job in self.jobs.values_mut() {
            let Some(g) = job.fresh_growth else { continue };
            job.list = if g >= alpha {
                List::New
            } else {
                match job.list {
                    List::New => List::Watching,
                    List::Watching | List::Completing => List::Completing,
                }
            };
        }
    }

    /// Algorithm 1, lines 14-26.
    fn set_limits(&mut self) {
        if self.jobs.values().all(|j| j.list == List::Completing) {
            // Free competition (Algorithm 3, line 3): α = -1 until a job arrives.
            for job in self.jobs.values_mut() {
                job.limit = 1.0;
            }
            if !self.jobs.is_empty() {
                self.alpha = -1.0;
                self.itval = (self.itval * 2.0).min(self.params.max_interval);
            }
            return;
        }
        let total: f64 = self.jobs.values().filter_map(|j| j.growth).sum();
        let cl_floor = self.params.cl_floor;
        for job in self.jobs.values_mut() {
            if job.list == List::New && self.params.nl_uncapped {
                job.limit = 1.0;
                continue;
            }
            let Some(g) = job.growth else { continue };
            let share = if total > 0.0 { g / total } else { 1.0 };
            match job.list {
                List::Completing => job.limit = share.max(cl_floor).min(1.0),
                List::Watching => {}
                List::New => job.limit = share.clamp(f64::MIN_POSITIVE, 1.0),
            }
        }
    }

    fn allocations(&self) -> BTreeMap<JobId, Allocation> {
        let cores = self.cores_seen;
        let n = self.jobs.len() as f64;
        let total_limit: f64 = self.jobs.values().map(|j| j.limit).sum::<f64>().max(1e-9);
        self.jobs
            .iter()
            .map(|(id, job)| {
                let (weight, cap) = if self.params.hard_limits {
                    let cap = if job.limit >= 1.0 || cores <= 0.0 {
                        None
                    } else {
                        Some(job.limit * cores)
                    };
                    (100, cap)
                } else {
                    // Soft: a weight proportional to the limit; the kernel gives a core a job
                    // leaves idle to the others.
                    let w = (job.limit / total_limit * 100.0 * n)
                        .round()
                        .clamp(1.0, 10_000.0);
                    (w as u32, None)
                };
                let reason = match job.growth {
                    Some(g) => format!(
                        "flowcon: {} (G={g:.3e}/cpu-s, alpha={:.3e}), limit {:.0}% of node",
                        list_name(job.list),
                        self.alpha,
                        job.limit * 100.0
                    ),
                    None => format!(
                        "flowcon: {} (no growth measured yet), limit {:.0}% of node",
                        list_name(job.list),
                        job.limit * 100.0
                    ),
                };
                (
                    id.clone(),
                    Allocation {
                        category: job.list.category(),
                        cpu: CpuAllocation {
                            weight,
                            max_cores: clamp_cores(cap, &job.bounds),
                        },
                        memory: MemoryAllocation::default(),
                        reason,
                    },
                )
            })
            .collect()
    }
}

fn list_name(list: List) -> &'static str {
    match list {
        List::New => "NL",
        List::Watching => "WL",
        List::Completing => "CL",
    }
}

impl NodePolicy for FlowCon {
    fn name(&self) -> &'static str {
        "flowcon"
    }

    fn job_added(&mut self, _now: Seconds, spec: &JobSpec) {
        // Algorithm 2, lines 5-7: a new job goes to NL with no limit.
        self.jobs
            .insert(spec.id.clone(), JobState::new(spec.bounds));
        self.listener();
    }

    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        // Algorithm 2, lines 10-15: forget it and release its resources.
        if self.jobs.remove(id).is_some() {
            self.listener();
        }
    }

    fn progress(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let observation = Observation {
            at: now,
            value: point.value,
            cpu_seconds: job.cpu_seconds,
        };
        if point.new_segment {
            // A restarted run: its first value says nothing about progress since the old one.
            job.baseline = None;
        }
        job.latest = Some(observation);
    }

    fn usage(&mut self, _now: Seconds, id: &JobId, usage: Usage) {
        if let Some(job) = self.jobs.get_mut(id) {
            job.cpu_seconds = job.cpu_seconds.max(usage.cpu_seconds);
        }
    }

    fn decide(&mut self, now: Seconds, node: &NodeResources) -> Plan {
        self.cores_seen = node.cores;
        let due = self.next_run_at.is_none_or(|at| now >= at);
        if self.listener_fired || due {
            self.evaluate(now);
        }
        Plan {
            allocations: self.allocations(),
            move_requests: Vec::new(),
            next_decision_at: if self.jobs.is_empty() {
                None
            } else {
                self.next_run_at
            },
        }
    }
}

#[cfg(test)]
#[path = "flowcon_tests.rs"]
mod tests;
