//! `specon`: SpeCon's worker-side Algorithm 1, the container monitor (Mao et al., "Speculative
//! Container Scheduling for Deep Learning Applications in a Kubernetes Cluster", IEEE Systems
//! Journal 2022). Algorithms 2 (where to move a job) and 3 (rebalancing toward idle workers) are
//! `governor_placement::specon`, which govsim runs and the coordinator acts on: it moves the
//! jobs for real (framework checkpoint or CRIU), when the move pays for its measured cost.
//!
//! # The algorithm, as implemented
//!
//! Every categorisation interval (`t_m - t_{m-1}`, 30 s) the monitor reads each job's latest
//! value of its evaluation function `E(t_m)` and computes the *gain* over the interval,
//! `G(t_m) = |E(t_m) - E(t_{m-1})| / |E(t_{m-1})|`. Jobs start in PC (progressing,
//! [`Category::Progressing`]); then, for every job not yet sent away:
//! - `G(t_m) < G(t_{m-1})` and `G(t_m) < α` (slowing down and slow): PC → WC, WC → CC; a job
//!   already in CC stays there and, if more than one other job on the node is in PC or WC, the
//!   node asks the coordinator to move it ([`MoveRequest`]; the paper's "migrate") and marks it
//!   (the paper's "migrated"): a job is asked for at most once, and a marked job is no longer
//!   categorised;
//! - `G(t_m) ≥ G(t_{m-1})` and `G(t_m) < α` (slow, but bouncing): the job stays where it is;
//! - `G(t_m) > α`: back to PC, "to accommodate a sudden change of the evaluation function".
//!
//! SpeCon does not change any job's resources on the node: every allocation is the kernel's
//! default (weight 100, no cap). Its gains come entirely from moving converged jobs to other
//! nodes, so on a single node (nowhere to move to) it performs exactly like `fair`.
//!
//! # Where the paper is ambiguous, and the reading taken
//!
//! - **Lines 10-12** move a WC job "from PC to WC" again; the prose says WC → CC ("it indicates
//!   that this job has started its convergence process"). We take the prose: otherwise no job
//!   could ever reach CC.
//! - **The gain's units.** Eq. (1) is an absolute difference, but the threshold "is a percentage
//!   value" (α = 0.01 in the evaluation), and an absolute 0.01 means nothing across losses of
//!   scale 100 (VAE reconstruction) and 0.1 (MNIST cross-entropy). We read the gain as the
//!   relative change over the interval, so α = 0.01 is "less than 1% better in 30 s". Set
//!   [`SpeConParams::relative_gain`] to false for the literal absolute gain.
//! - **Line 15** asks for `|PC| + |WC| > 1` before requesting a migration; the prose gives no
//!   condition. We keep the pseudocode's (more than one other job still learning, counted when
//!   the job is examined), as [`SpeConParams::min_learning_others`] = 2.
//! - **The first intervals**: the gain needs two readings and the comparison needs two gains, so
//!   a job is first categorised at its third reading.
//! - **`G = α` exactly** matches none of the three branches; the job stays where it is.
//! - **Line 19** writes `G > α` where line 6 writes `G < α`; we keep both strict.
//! - **The interval** is node-wide: every job is read at the same ticks, as the loop over
//!   `c_j ∈ w_i` (line 3) suggests; a job that arrives between ticks is first read at the next.
//! - **A value of `E(t_{m-1})` equal to 0** makes the relative gain undefined; the absolute gain
//!   is used for that interval.

use std::collections::BTreeMap;

use super::ParamError;
use super::{
    Allocation, Category, JobId, JobSpec, MoveRequest, NodePolicy, NodeResources, Plan,
    ProgressPoint, Seconds, Usage,
};

/// SpeCon's parameters; defaults are the paper's (`|t_m - t_{m-1}| = 30`, `α = 0.01`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeConParams {
    /// Categorisation interval, seconds. Default 30.
    pub interval: Seconds,
    /// Categorisation threshold α. Default 0.01.
    pub alpha: f64,
    /// Gain relative to the previous value (true, default) or absolute (Eq. 1 literally).
    pub relative_gain: bool,
    /// A converged job is sent away only when at least this many jobs on the node are in PC or
    /// WC (line 15: `|PC| + |WC| > 1`). Default 2.
    pub min_learning_others: usize,
}

impl Default for SpeConParams {
    fn default() -> Self {
        SpeConParams {
            interval: 30.0,
            alpha: 0.01,
            relative_gain: true,
            min_learning_others: 2,
        }
    }
}

impl SpeConParams {
    /// Set a parameter by name (`interval`, `alpha`, `relative_gain`, `min_learning_others`).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        match key {
            "interval" => {
                let v: f64 = super::parse_param(key, value)?;
                if !(v.is_finite() && v > 0.0) {
                    return Err(ParamError::invalid(
                        key,
                        format!("interval must be positive, not {value}"),
                    ));
                }
                self.interval = v;
            }
            "alpha" => self.alpha = super::parse_param(key, value)?,
            "relative_gain" => self.relative_gain = super::parse_param(key, value)?,
            "min_learning_others" => self.min_learning_others = super::parse_param(key, value)?,
            _ => return Err(ParamError::Unknown(key.to_owned())),
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default)]
struct JobState {
    category: SpeConCategory,
    move_asked: bool,
    /// Latest observed value of E.
    latest: Option<f64>,
    /// E at the previous tick.
    previous: Option<f64>,
    /// Gain at the previous tick.
    previous_gain: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum SpeConCategory {
    #[default]
    Progressing,
    Watching,
    Converged,
}

impl SpeConCategory {
    fn category(self) -> Category {
        match self {
            SpeConCategory::Progressing => Category::Progressing,
            SpeConCategory::Watching => Category::Watching,
            SpeConCategory::Converged => Category::Converged,
        }
    }
}

/// SpeCon's container monitor on one node.
#[derive(Debug)]
pub struct SpeCon {
    params: SpeConParams,
    jobs: BTreeMap<JobId, JobState>,
    next_tick_at: Option<Seconds>,
    /// Requests made since the last plan.
    pending: Vec<MoveRequest>,
}

impl Default for SpeCon {
    fn default() -> Self {
        Self::new(SpeConParams::default())
    }
}

impl SpeCon {
    pub fn new(params: SpeConParams) -> Self {
        SpeCon {
            params,
            jobs: BTreeMap::new(),
            next_tick_at: None,
            pending: Vec::new(),
        }
    }

    /// A job's category, if known.
    pub fn category(&self, id: &JobId) -> Option<Category> {
        self.jobs.get(id).map(|j| j.category.category())
    }

    /// Whether a move has been requested for the job (the paper marks it "migrated").
    pub fn move_asked(&self, id: &JobId) -> bool {
        self.jobs.get(id).is_some_and(|j| j.move_asked)
    }

    fn gain(&self, now: f64, before: f64) -> f64 {
        let diff = (now - before).abs();
        if self.params.relative_gain && before != 0.0 {
            diff / before.abs()
        } else {
            diff
        }
    }

    /// One categorisation round (Algorithm 1, lines 3-22).
    fn tick(&mut self) {
        let ids: Vec<JobId> = self.jobs.keys().cloned().collect();
        for id in ids {
            let job = &self.jobs[&id];
            if job.move_asked {
                continue;
            }
            let Some(value) = job.latest else { continue };
            let gain = job.previous.map(|before| self.gain(value, before));
            let previous_gain = job.previous_gain;
            let job = self.jobs.get_mut(&id).expect("job listed above");
            job.previous = Some(value);
            let Some(gain) = gain else { continue };
            job.previous_gain = Some(gain);
            let Some(previous_gain) = previous_gain else {
                continue;
            };
            let alpha = self.params.alpha;
            if gain < previous_gain && gain < alpha {
                match job.category {
                    SpeConCategory::Progressing => job.category = SpeConCategory::Watching,
                    SpeConCategory::Watching => job.category = SpeConCategory::Converged,
                    SpeConCategory::Converged => {
                        let learning = self
                            .jobs
                            .values()
                            .filter(|j| j.category != SpeConCategory::Converged)
                            .count();
                        if learning >= self.params.min_learning_others {
                            let job = self.jobs.get_mut(&id).expect("job listed above");
                            job.move_asked = true;
                            self.pending.push(MoveRequest {
                                job: id.clone(),
                                reason: format!(
                                    "specon: converged (gain {gain:.2e} < {alpha} and falling) \
                                     while {learning} jobs here are still learning"
                                ),
                            });
                        }
                    }
                }
            } else if gain > alpha {
                job.category = SpeConCategory::Progressing;
            }
            // Otherwise (slow but not slowing, or exactly α): stay.
        }
    }
}

impl NodePolicy for SpeCon {
    fn name(&self) -> &'static str {
        "specon"
    }

    fn job_added(&mut self, _now: Seconds, spec: &JobSpec) {
        self.jobs.insert(spec.id.clone(), JobState::default());
    }

    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        self.jobs.remove(id);
        self.pending.retain(|m| &m.job != id);
    }

    fn progress(&mut self, _now: Seconds, id: &JobId, point: ProgressPoint) {
        if let Some(job) = self.jobs.get_mut(id) {
            if point.new_segment {
                job.previous = None;
                job.previous_gain = None;
            }
            job.latest = Some(point.value);
        }
    }

    fn usage(&mut self, _now: Seconds, _id: &JobId, _usage: Usage) {}

    fn decide(&mut self, now: Seconds, _node: &NodeResources) -> Plan {
        match self.next_tick_at {
            None => self.next_tick_at = Some(now + self.params.interval),
            Some(at) if now >= at => {
                self.tick();
                // Ticks stay on the node's grid even when a decide comes late.
                let behind = ((now - at) / self.params.interval).floor() + 1.0;
                self.next_tick_at = Some(at + behind * self.params.interval);
            }
            Some(_) => {}
        }
        let allocations = self
            .jobs
            .iter()
            .map(|(id, job)| {
                let reason = if job.move_asked {
                    "specon: converged, move requested; kernel default sharing".to_owned()
                } else {
                    format!(
                        "specon: {}; kernel default sharing",
                        job.category.category()
                    )
                };
                (
                    id.clone(),
                    Allocation::unmanaged(job.category.category(), reason),
                )
            })
            .collect();
        Plan {
            allocations,
            move_requests: std::mem::take(&mut self.pending),
            next_decision_at: if self.jobs.is_empty() {
                None
            } else {
                self.next_tick_at
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuAllocation;

    const NODE: NodeResources = NodeResources {
        cores: 4.0,
        memory_bytes: 8 << 30,
    };

    fn id(s: &str) -> JobId {
        JobId::from(s)
    }

    fn log(p: &mut SpeCon, now: Seconds, job: &str, value: f64) {
        p.progress(
            now,
            &id(job),
            ProgressPoint {
                at: now,
                value,
                new_segment: false,
            },
        );
    }

    /// Jobs `names` added at 0; the first decide schedules the first tick at 30.
    fn with_jobs(names: &[&str]) -> SpeCon {
        let mut p = SpeCon::default();
        for n in names {
            p.job_added(0.0, &JobSpec::new(*n));
        }
        assert_eq!(p.decide(0.0, &NODE).next_decision_at, Some(30.0));
        p
    }

    /// Drive one tick at `30 * round` with the given values; returns the plan.
    fn tick(p: &mut SpeCon, round: u32, values: &[(&str, f64)]) -> Plan {
        let t = 30.0 * f64::from(round);
        for (job, v) in values {
            log(p, t - 1.0, job, *v);
        }
        p.decide(t, &NODE)
    }

    #[test]
    fn starts_in_pc_and_leaves_resources_alone() {
        let mut p = with_jobs(&["a"]);
        let plan = p.decide(1.0, &NODE);
        let a = &plan.allocations[&id("a")];
        assert_eq!(a.category, Category::Progressing);
        assert_eq!(a.cpu, CpuAllocation::DEFAULT);
        assert!(plan.move_requests.is_empty());
    }

    #[test]
    fn needs_three_readings_before_the_first_categorisation() {
        let mut p = with_jobs(&["a"]);
        tick(&mut p, 1, &[("a", 1.0)]); // first reading
        tick(&mut p, 2, &[("a", 1.0)]); // first gain (0)
        assert_eq!(p.category(&id("a")), Some(Category::Progressing));
        tick(&mut p, 3, &[("a", 1.0)]); // gain 0, not < 0: stays
        assert_eq!(p.category(&id("a")), Some(Category::Progressing));
    }

    #[test]
    fn pc_to_wc_to_cc_then_move_requested_once() {
        let mut p = with_jobs(&["a", "b", "c"]);
        // b and c keep learning fast (20% per interval).
        let fast = |r: u32| 100.0 * 0.8f64.powi(r as i32);
        // a: gains 10%, 0.5%, 0.4%, 0.3%, 0.2%.
        let a = [100.0, 90.0, 89.55, 89.19, 88.92, 88.74];
        let mut plans = Vec::new();
        for (r, av) in a.iter().enumerate() {
            let r = r as u32 + 1;
            plans.push(tick(
                &mut p,
                r,
                &[("a", *av), ("b", fast(r)), ("c", fast(r))],
            ));
            match r {
                1..=2 => assert_eq!(p.category(&id("a")), Some(Category::Progressing)),
                3 => assert_eq!(p.category(&id("a")), Some(Category::Watching), "PC -> WC"),
                4 => assert_eq!(p.category(&id("a")), Some(Category::Converged), "WC -> CC"),
                _ => assert_eq!(p.category(&id("a")), Some(Category::Converged)),
            }
        }
        let requests: Vec<&MoveRequest> = plans.iter().flat_map(|p| &p.move_requests).collect();
        assert_eq!(requests.len(), 1, "at most once: {requests:?}");
        assert_eq!(requests[0].job, id("a"));
        assert!(
            !plans[4].move_requests.is_empty(),
            "requested at the first CC round that is still slowing"
        );
        assert!(p.move_asked(&id("a")));
        assert_eq!(
            p.decide(200.0, &NODE).allocations[&id("a")].cpu,
            CpuAllocation::DEFAULT
        );
    }

    #[test]
    fn no_move_while_fewer_than_two_others_learn() {
        let mut p = with_jobs(&["a", "b"]);
        let a = [100.0, 90.0, 89.55, 89.19, 88.92, 88.74];
        for (r, av) in a.iter().enumerate() {
            let r = r as u32 + 1;
            let plan = tick(
                &mut p,
                r,
                &[("a", *av), ("b", 100.0 * 0.8f64.powi(r as i32))],
            );
            assert!(plan.move_requests.is_empty(), "round {r}: {plan:?}");
        }
        assert_eq!(p.category(&id("a")), Some(Category::Converged));
        assert!(!p.move_asked(&id("a")));
    }

    #[test]
    fn slow_but_bouncing_stays_put() {
        let mut p = with_jobs(&["a"]);
        // Gains: 10%, 0.5% (-> WC), then 0.8% (rises, still < α): stays in WC.
        for (r, v) in [100.0, 90.0, 89.55, 88.83].iter().enumerate() {
            tick(&mut p, r as u32 + 1, &[("a", *v)]);
        }
        assert_eq!(p.category(&id("a")), Some(Category::Watching));
    }

    #[test]
    fn a_burst_of_progress_resets_to_pc() {
        let mut p = with_jobs(&["a"]);
        for (r, v) in [100.0, 90.0, 89.55, 89.19, 70.0].iter().enumerate() {
            tick(&mut p, r as u32 + 1, &[("a", *v)]);
            if r == 3 {
                assert_eq!(p.category(&id("a")), Some(Category::Converged));
            }
        }
        assert_eq!(
            p.category(&id("a")),
            Some(Category::Progressing),
            "CC -> PC"
        );
    }

    #[test]
    fn gain_exactly_alpha_changes_nothing() {
        // Absolute gains in powers of two: 1.0, then exactly α = 0.25 (smaller, but not < α).
        let mut p = SpeCon::new(SpeConParams {
            relative_gain: false,
            alpha: 0.25,
            ..SpeConParams::default()
        });
        p.job_added(0.0, &JobSpec::new("a"));
        p.decide(0.0, &NODE);
        for (r, v) in [2.0, 1.0, 0.75].iter().enumerate() {
            tick(&mut p, r as u32 + 1, &[("a", *v)]);
        }
        assert_eq!(p.category(&id("a")), Some(Category::Progressing));
    }

    #[test]
    fn absolute_gain_reading_uses_raw_differences() {
        let mut p = SpeCon::new(SpeConParams {
            relative_gain: false,
            ..SpeConParams::default()
        });
        p.job_added(0.0, &JobSpec::new("a"));
        p.decide(0.0, &NODE);
        // A loss of scale 1000 moving by 1 per interval: 0.1% relative but 1.0 absolute > α.
        for (r, v) in [1000.0, 990.0, 989.0, 988.0].iter().enumerate() {
            tick(&mut p, r as u32 + 1, &[("a", *v)]);
        }
        assert_eq!(p.category(&id("a")), Some(Category::Progressing));
        let mut q = with_jobs(&["a"]);
        for (r, v) in [1000.0, 990.0, 989.0].iter().enumerate() {
            tick(&mut q, r as u32 + 1, &[("a", *v)]);
        }
        assert_eq!(q.category(&id("a")), Some(Category::Watching));
    }

    #[test]
    fn zero_previous_value_falls_back_to_the_absolute_gain() {
        let mut p = with_jobs(&["a"]);
        for (r, v) in [0.0, 0.005, 0.00496].iter().enumerate() {
            tick(&mut p, r as u32 + 1, &[("a", *v)]);
        }
        // Gains: 0.005 (absolute: the previous value was 0), then 0.8% relative: below α but
        // above the previous gain, so the job stays in PC. An infinite first gain would have
        // made the second one "slowing down" and moved the job to WC.
        assert_eq!(p.category(&id("a")), Some(Category::Progressing));
    }

    #[test]
    fn a_new_segment_restarts_the_readings() {
        let mut p = with_jobs(&["a"]);
        tick(&mut p, 1, &[("a", 100.0)]);
        tick(&mut p, 2, &[("a", 90.0)]);
        p.progress(
            65.0,
            &id("a"),
            ProgressPoint {
                at: 65.0,
                value: 200.0,
                new_segment: true,
            },
        );
        p.decide(90.0, &NODE);
        tick(&mut p, 4, &[("a", 199.9)]);
        // Readings restarted at 200: one gain since, so still uncategorised (PC).
        assert_eq!(p.category(&id("a")), Some(Category::Progressing));
    }

    #[test]
    fn ticks_stay_on_the_grid_and_late_decides_catch_up() {
        let mut p = with_jobs(&["a"]);
        assert_eq!(p.decide(10.0, &NODE).next_decision_at, Some(30.0));
        assert_eq!(p.decide(95.0, &NODE).next_decision_at, Some(120.0));
        p.job_removed(100.0, &id("a"));
        assert_eq!(p.decide(100.0, &NODE).next_decision_at, None);
    }
}
