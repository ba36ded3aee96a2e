//! `governor`: our policy. Placeholder module doc, rewritten once measured (see bottom).

use std::collections::BTreeMap;

use super::signal::{LossTracker, StageThresholds};
use super::{
    Allocation, Category, CpuAllocation, JobId, JobSpec, MemoryAllocation, NodePolicy,
    NodeResources, Plan, ProgressPoint, Seconds, Usage, clamp_cores,
};

/// How to rank a job whose log does not say how far along it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownWork {
    /// Expect it to need as much again as it has used (least attained service first).
    #[default]
    Attained,
    /// Give it an equal share and rank only the jobs that report their position.
    Neutral,
}

/// The governor policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GovernorParams {
    /// How strongly CPU goes to the jobs with the least remaining work: 1 is an equal split,
    /// larger values approach strict shortest-remaining-first.
    pub concentration: f64,
    /// Every job gets at least this fraction of an equal share of the node.
    pub floor: f64,
    /// A job overtakes another in the ranking only when its estimated remaining work is smaller
    /// by this fraction.
    pub hysteresis: f64,
    /// EWMA weight of each new loss value.
    pub smoothing: f64,
    pub unknown: UnknownWork,
    /// Re-decide at least this often, seconds.
    pub interval: Seconds,
}

impl Default for GovernorParams {
    fn default() -> Self {
        GovernorParams {
            concentration: 2.0,
            floor: 0.5,
            hysteresis: 0.1,
            smoothing: 0.3,
            unknown: UnknownWork::Attained,
            interval: 1.0,
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
            "concentration" => self.concentration = num(1.0, 1000.0)?,
            "floor" => self.floor = num(0.0, 1.0)?,
            "hysteresis" => self.hysteresis = num(0.0, 0.99)?,
            "smoothing" => self.smoothing = num(0.001, 1.0)?,
            "interval" => self.interval = num(0.001, 3600.0)?,
            "unknown" => {
                self.unknown = match value {
                    "attained" => UnknownWork::Attained,
                    "neutral" => UnknownWork::Neutral,
                    _ => return Err(format!("unknown is attained or neutral, not {value:?}")),
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
    cpu_seconds: f64,
    /// Estimated total CPU-seconds (from the latest reported fraction).
    total_estimate: Option<f64>,
    tracker: LossTracker,
}

impl JobState {
    fn remaining(&self, unknown: UnknownWork) -> Option<f64> {
        match self.total_estimate {
            Some(total) => Some((total - self.cpu_seconds).max(0.0)),
            None => match unknown {
                UnknownWork::Attained => Some(self.cpu_seconds),
                UnknownWork::Neutral => None,
            },
        }
    }
}

/// Our policy.
#[derive(Debug)]
pub struct Governor {
    params: GovernorParams,
    jobs: BTreeMap<JobId, JobState>,
    /// Ranking of the previous decision (hysteresis starts from it).
    order: Vec<JobId>,
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
        }
    }

    /// Rank jobs by (priority desc, remaining asc), starting from the previous ranking and
    /// swapping neighbours only when the later one is better by more than the hysteresis.
    fn rank(&mut self, ranked: &[JobId]) -> Vec<JobId> {
        let key = |id: &JobId| {
            let j = &self.jobs[id];
            (
                j.spec.priority,
                j.remaining(self.params.unknown).unwrap_or(f64::INFINITY),
            )
        };
        // Previous order for known jobs, then newcomers in key order.
        let mut order: Vec<JobId> = self
            .order
            .iter()
            .filter(|id| ranked.contains(id))
            .cloned()
            .collect();
        let mut newcomers: Vec<JobId> = ranked
            .iter()
            .filter(|id| !order.contains(id))
            .cloned()
            .collect();
        newcomers.sort_by(|a, b| {
            let (pa, ra) = key(a);
            let (pb, rb) = key(b);
            pb.cmp(&pa).then(ra.total_cmp(&rb)).then(a.cmp(b))
        });
        for n in newcomers {
            let (pn, rn) = key(&n);
            let pos = order
                .iter()
                .position(|o| {
                    let (po, ro) = key(o);
                    pn > po || (pn == po && rn < ro)
                })
                .unwrap_or(order.len());
            order.insert(pos, n);
        }
        let h = self.params.hysteresis.clamp(0.0, 0.99);
        loop {
            let mut swapped = false;
            for i in 1..order.len() {
                let (pa, ra) = key(&order[i - 1]);
                let (pb, rb) = key(&order[i]);
                let better = pb > pa || (pb == pa && rb < ra * (1.0 - h));
                if better {
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

    fn shares(&mut self) -> BTreeMap<JobId, f64> {
        let m = self.jobs.len();
        let mut shares = BTreeMap::new();
        if m == 0 {
            return shares;
        }
        let ranked: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.remaining(self.params.unknown).is_some())
            .map(|(id, _)| id.clone())
            .collect();
        let order = self.rank(&ranked);
        let equal = 1.0 / m as f64;
        for (id, _) in self.jobs.iter() {
            if !ranked.contains(id) {
                shares.insert(id.clone(), equal);
            }
        }
        // heSRPT-shaped split of what the ranked jobs hold: the k-th of n from the back gets
        // (k/n)^c - ((k-1)/n)^c.
        let n = order.len();
        let pool = n as f64 * equal;
        let c = self.params.concentration.max(1.0);
        for (pos, id) in order.iter().enumerate() {
            let k = (n - pos) as f64;
            let nf = n as f64;
            let theta = (k / nf).powf(c) - ((k - 1.0) / nf).powf(c);
            shares.insert(id.clone(), theta * pool);
        }
        self.order = order;
        apply_floor(&mut shares, self.params.floor.clamp(0.0, 1.0) * equal);
        shares
    }
}

/// Raise every share below `floor` to it, taking the difference from the others in proportion
/// to their shares (repeated until no share falls below the floor). Shares sum to 1.
fn apply_floor(shares: &mut BTreeMap<JobId, f64>, floor: f64) {
    let n = shares.len() as f64;
    if n == 0.0 || floor * n > 1.0 + 1e-12 {
        return;
    }
    loop {
        let pinned: Vec<JobId> = shares
            .iter()
            .filter(|(_, s)| **s < floor - 1e-12)
            .map(|(id, _)| id.clone())
            .collect();
        if pinned.is_empty() {
            return;
        }
        for id in &pinned {
            shares.insert(id.clone(), floor);
        }
        let at_floor = shares.values().filter(|s| (**s - floor).abs() < 1e-12).count() as f64;
        let free_total: f64 = shares.values().filter(|s| **s > floor + 1e-12).sum();
        let target = 1.0 - at_floor * floor;
        if free_total <= 0.0 {
            return;
        }
        let scale = target / free_total;
        for s in shares.values_mut() {
            if *s > floor + 1e-12 {
                *s *= scale;
            }
        }
    }
}

impl NodePolicy for Governor {
    fn name(&self) -> &'static str {
        "governor"
    }

    fn job_added(&mut self, _now: Seconds, spec: &JobSpec) {
        self.jobs.insert(
            spec.id.clone(),
            JobState {
                spec: spec.clone(),
                cpu_seconds: 0.0,
                total_estimate: None,
                tracker: LossTracker::new(
                    spec.direction,
                    self.params.smoothing,
                    StageThresholds::default(),
                ),
            },
        );
    }

    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        self.jobs.remove(id);
        self.order.retain(|o| o != id);
    }

    fn progress(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        if let Some(job) = self.jobs.get_mut(id) {
            if point.new_segment {
                job.tracker.restart();
                job.total_estimate = None;
            }
            job.tracker.observe(now, point.value, job.cpu_seconds);
        }
    }

    fn usage(&mut self, _now: Seconds, id: &JobId, usage: Usage) {
        if let Some(job) = self.jobs.get_mut(id) {
            job.cpu_seconds = job.cpu_seconds.max(usage.cpu_seconds);
        }
    }

    fn work_done(&mut self, _now: Seconds, id: &JobId, fraction: f64) {
        if let Some(job) = self.jobs.get_mut(id)
            && fraction.is_finite()
            && fraction > 0.0
            && fraction <= 1.0
            && job.cpu_seconds > 0.0
        {
            job.total_estimate = Some(job.cpu_seconds / fraction);
        }
    }

    fn decide(&mut self, now: Seconds, _node: &NodeResources) -> Plan {
        let shares = self.shares();
        let m = self.jobs.len() as f64;
        let allocations = self
            .jobs
            .iter()
            .map(|(id, job)| {
                let share = shares.get(id).copied().unwrap_or(1.0 / m);
                let weight = (share * 100.0 * m).round().clamp(1.0, 10000.0) as u32;
                let remaining = job.remaining(self.params.unknown);
                let reason = match remaining {
                    Some(r) => format!(
                        "governor: ~{r:.0} cpu-s left{}, {:.0}% of the node when all are busy",
                        if job.total_estimate.is_some() { "" } else { " (guessed)" },
                        share * 100.0
                    ),
                    None => "governor: remaining work unknown, equal share".to_owned(),
                };
                (
                    id.clone(),
                    Allocation {
                        category: match job.tracker.category() {
                            Category::Unknown => Category::Unknown,
                            c => c,
                        },
                        cpu: CpuAllocation {
                            weight,
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
