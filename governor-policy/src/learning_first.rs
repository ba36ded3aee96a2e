//! `learning-first`: the default node policy. The kernel's fair sharing, except that a job the
//! learning-curve predictor ([`crate::predict`]) says is confidently past its quality point
//! yields part of its share to the jobs still before theirs, within a budget that keeps its own
//! completion within `slack` of fair sharing's.
//!
//! # Why this and not an order (issue 32)
//!
//! Measured on real Keras and scikit-learn jobs and in the simulator, ordering the jobs
//! (`shortest-left`: closest to done first, the cores a job can use) shortens the average
//! fixed-epoch completion on some workloads but makes jobs reach their quality *later* than fair
//! sharing on others (a large job held back in exactly the early epochs in which it learns most,
//! 1.45x later), and in the simulator's cluster scenarios it loses to fair by 4-20% (giving the
//! first jobs every thread loses throughput where speed-ups are sub-linear). An order cannot
//! promise "no harm". What can: leave every job at fair sharing while it learns, and take CPU
//! only from a job that has learnt what it will learn (its time to quality is already behind it,
//! so it loses nothing there), and only as much as its completion can spare. The jobs still
//! learning get that CPU, so they reach their quality points sooner.
//!
//! # The algorithm
//!
//! **Per job**: its quality signal (validation loss once the log has one, else its progress
//! signal, signed so that smaller is better) as points `(fraction of its work done, value)`, the
//! fraction from its log ("epoch 7/20") or its declared epochs; the CPU it has used; a *fair
//! twin* of the CPU it would have had under fair sharing while it yields.
//!
//! **Learnt**: a job of known size is *past its quality point* when the best value it has reached
//! is within [`QUALITY_FRACTION`](crate::quality::QUALITY_FRACTION) of the whole reduction the
//! predictor expects by the end of its run, with the predicted final value lowered by
//! `confidence` standard deviations of the prediction (a curve whose end is uncertain is not
//! judged learnt), after at least `min_points` values spanning `min_fraction` of its run
//! ([`past_quality_point`]). A job of unknown size cannot be extrapolated to an end: it is learnt
//! when its learning stage is converged ([`LossTracker`]), as `shortest-left` judges it.
//!
//! *The predictor and its confidence were chosen by measurement* (`govsim predict`, on the real
//! curves of the fixtures, walking each curve value by value as a job logs it): the power law in
//! epochs, at 2 standard deviations, judged 13 of 23 falling curves learnt, 7 of them after
//! their true quality point (median 0.075 of the run after it) and 6 before it; at 1 standard
//! deviation 10 of 19 were early, with the exponential family 13 of 18. An early verdict is
//! what the pace bound below is for.
//!
//! **Weights**: every job `cpu.weight` 100 (the kernel's default: the daemon writes nothing),
//! except a learnt job while another job on the node is still learning: weight `yield` × 100, and
//! a held job (a sweep's trial waiting at its rung): `floor` × 100. Weights
//! are work-conserving: a core nobody else uses still goes to the yielding job.
//!
//! **Pace bound** (the guard): while a job yields, its fair twin advances at the share the
//! kernel's fair sharing would give it (the node shared among what every job uses now, the
//! yielding job at the most it has been seen to use) and its *lag* is the twin's CPU less what
//! it got. It yields only while its lag is under `budget` × `slack` of the CPU it has had, and
//! runs at weight 100 again as soon as it is not (until it has run far enough at its fair share
//! for the bound to exceed its lag by [`RESUME`]). Being behind its fair-share pace by at most
//! that fraction at every moment, it reaches every point of its run, its end and (judged learnt
//! too early) its real quality point, at most about that fraction later than under fair
//! sharing; `budget` < 1 leaves room for the estimates' error.
//!
//! What it promises, to first order: a job still learning gets at least its fair share (its
//! time to quality no later than under fair sharing); a learnt job (rightly or not) reaches
//! every point of its run within `slack` of fair; and the node does the same total work. The
//! gain is bounded by the same bound: it moves at most `budget` × `slack` of each learnt job's
//! CPU to the jobs still learning.
//!
//! # Parameters (`--policy learning-first:KEY=VALUE`)
//!
//! `yield` (0.5), `slack` (0.1), `budget` (0.8), `confidence` (2.0 standard deviations),
//! `predictor` (`power-law`; `exponential`, `last-k`, `best-fit`),
//! `min_points` (4), `min_fraction` (0.1), `floor` (0.1, the weight of a held job over 100),
//! `smoothing` (0.5, for the learning stage of jobs of unknown size), `interval` (1 s).

use std::collections::BTreeMap;

use super::ParamError;
use super::predict::{Method, Prediction, past_quality_point};
use super::share::fair_shares;
use super::stage::{LossTracker, StageThresholds};
use super::work::Work;
use super::{
    Allocation, Category, CpuAllocation, Direction, JobId, JobSpec, MemoryAllocation, NodePolicy,
    NodeResources, Plan, ProgressPoint, Seconds, Usage, clamp_cores,
};

/// The learning-first policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LearningFirstParams {
    /// A learnt job's weight while it yields, as a fraction of the default weight (100).
    pub yield_share: f64,
    /// The bound on a yielding job's completion: no later than fair sharing's by more than
    /// this fraction.
    pub slack: f64,
    /// The part of `slack` the budget uses (the rest is margin for the estimates).
    pub budget: f64,
    /// Standard deviations of the predicted final value a learnt verdict must withstand.
    pub confidence: f64,
    /// The predictor (`None`: the best-fitting family, [`crate::predict::predict`]).
    pub predictor: Option<Method>,
    /// Values of its quality signal a job needs before it can be judged learnt.
    pub min_points: usize,
    /// Fraction of its run its values must span before it can be judged learnt.
    pub min_fraction: f64,
    /// A held job's weight, as a fraction of the default weight.
    pub floor: f64,
    /// EWMA weight of each loss value (the learning stage of jobs of unknown size).
    pub smoothing: f64,
    /// Re-decide at least this often, seconds (the budget is spent between events).
    pub interval: Seconds,
}

impl Default for LearningFirstParams {
    fn default() -> Self {
        LearningFirstParams {
            yield_share: 0.5,
            slack: 0.1,
            budget: 0.8,
            confidence: 2.0,
            predictor: Some(Method::PowerLaw),
            min_points: 4,
            min_fraction: 0.1,
            floor: 0.1,
            smoothing: 0.5,
            interval: 1.0,
        }
    }
}

impl LearningFirstParams {
    /// The least part of its fair share a job judged learnt keeps over time: it yields only
    /// while it is less than `budget` × `slack` behind its fair twin (0.92 by default). What a
    /// placement should expect such a job to take from a newcomer
    /// (`governor_placement::Soonest`'s claim of a converged job).
    pub fn least_kept_share(&self) -> f64 {
        (1.0 - self.budget * self.slack).clamp(0.0, 1.0)
    }

    /// Set a parameter by name.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let num = |min: f64, max: f64| super::parse_number_in(key, value, min, max);
        match key {
            "yield" => self.yield_share = num(0.01, 1.0)?,
            "slack" => self.slack = num(0.0, 10.0)?,
            "budget" => self.budget = num(0.0, 1.0)?,
            "confidence" => self.confidence = num(0.0, 10.0)?,
            "predictor" => {
                self.predictor = match value {
                    "power-law" => Some(Method::PowerLaw),
                    "exponential" => Some(Method::Exponential),
                    "last-k" => Some(Method::LastSlope),
                    "best-fit" => None,
                    _ => {
                        return Err(ParamError::invalid(
                            key,
                            format!(
                                "predictor must be power-law, exponential, last-k or best-fit, not {value}"
                            ),
                        ));
                    }
                }
            }
            "min_points" => self.min_points = num(2.0, 1e6)? as usize,
            "min_fraction" => self.min_fraction = num(0.0, 1.0)?,
            "floor" => self.floor = num(0.01, 1.0)?,
            "smoothing" => self.smoothing = num(0.001, 1.0)?,
            "interval" => self.interval = num(0.001, 3600.0)?,
            _ => return Err(ParamError::Unknown(key.to_owned())),
        }
        Ok(())
    }
}

/// Where a job stands, as the plan's reason says it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    /// Still learning, or not judged yet.
    Learning,
    /// Past its (predicted) quality point.
    Learnt(Option<Prediction>),
}

#[derive(Clone, Debug)]
struct Job {
    spec: JobSpec,
    /// The quality signal so far: (when, value signed so that smaller is better, fraction of
    /// its work done when known).
    curve: Vec<(Seconds, f64, Option<f64>)>,
    /// Changes with every change of the curve or of the stage: the verdict is recomputed only
    /// then (a job logs once per epoch; the policy decides every second).
    revision: u64,
    /// The verdict at `revision`.
    cached: Option<(u64, Verdict)>,
    /// The curve follows the validation loss (its quality signal) rather than progress.
    quality_fed: bool,
    /// Its learning stage (jobs of unknown size).
    tracker: LossTracker,
    /// Its size, where known: the work it has left.
    work: Work,
    cpu_seconds: f64,
    last_usage: Option<(Seconds, f64)>,
    /// The most cores it has been seen using in one sample.
    seen_cores: f64,
    /// Cores it used in its latest sample.
    recent_cores: f64,
    /// Cores fair sharing would give it now (set at each decision): its fair twin's pace.
    twin_rate: f64,
    /// CPU-seconds it has lost against its fair twin while yielding.
    lag: f64,
    /// The latest plan had it yield.
    yielding: bool,
    /// Its lag reached its allowance: it runs at its fair share until it has run far enough at
    /// it for the allowance to exceed its lag by a quarter ([`RESUME`]).
    paced: bool,
    held: bool,
}

impl Job {
    fn new(spec: JobSpec, smoothing: f64) -> Self {
        Job {
            tracker: LossTracker::new(spec.direction, smoothing, StageThresholds::default()),
            spec,
            curve: Vec::new(),
            revision: 0,
            cached: None,
            quality_fed: false,
            work: Work::default(),
            cpu_seconds: 0.0,
            last_usage: None,
            seen_cores: 0.0,
            recent_cores: 0.0,
            twin_rate: 0.0,
            lag: 0.0,
            yielding: false,
            paced: false,
            held: false,
        }
    }

    /// CPU-seconds it may lag its fair twin: `budget` × `slack` of the CPU it has had. A pace
    /// bound at every moment, not only at its end: a job judged learnt too early reaches its
    /// real quality point, as every later point of its run, at most about that much later.
    fn allowance(&self, params: &LearningFirstParams) -> f64 {
        params.budget * params.slack * self.cpu_seconds
    }

    /// Brings its verdict up to date: judged again only when its curve or stage changed.
    fn refresh_verdict(&mut self, params: &LearningFirstParams) {
        if self
            .cached
            .is_none_or(|(revision, _)| revision != self.revision)
        {
            self.cached = Some((self.revision, self.judge(params)));
        }
    }

    /// Its verdict as of the latest [`Job::refresh_verdict`].
    fn verdict(&self) -> Verdict {
        self.cached.map_or(Verdict::Learning, |(_, v)| v)
    }

    /// A new value of its curve (thinned to at most [`MAX_CURVE`] values: a log of every step
    /// of a long run would otherwise cost a fit over all of them at every new value).
    fn push(&mut self, at: Seconds, value: f64) {
        self.curve.push((at, value, None));
        crate::predict::thin(&mut self.curve, MAX_CURVE);
        self.revision += 1;
    }

    fn judge(&self, params: &LearningFirstParams) -> Verdict {
        let points: Vec<(f64, f64)> = self
            .curve
            .iter()
            .filter_map(|&(_, v, x)| Some((x?, v)))
            .collect();
        if self.work.done().is_some() && !points.is_empty() {
            return match judged_learnt(&points, params) {
                Some(p) => Verdict::Learnt(Some(p)),
                None => Verdict::Learning,
            };
        }
        if self.tracker.category() == Category::Converged {
            Verdict::Learnt(None)
        } else {
            Verdict::Learning
        }
    }
}

/// The policy's verdict on a curve of `(fraction of the run, loss)` points: confidently past
/// its quality point ([`past_quality_point`] with `params`' confidence and predictor), once it
/// has `min_points` values over `min_fraction` of its run. The prediction that says so, or
/// `None`. (`govsim predict` measures this rule on the fixtures' curves.)
pub fn judged_learnt(points: &[(f64, f64)], params: &LearningFirstParams) -> Option<Prediction> {
    let span = points.last().map_or(0.0, |p| p.0) - points.first().map_or(0.0, |p| p.0);
    if points.len() < params.min_points || span < params.min_fraction {
        return None;
    }
    past_quality_point(points, 1.0, params.confidence, params.predictor)
}

/// The most values of a job's curve kept (every other one is dropped beyond it).
pub const MAX_CURVE: usize = 512;

/// A paced job yields again once its allowance exceeds its lag by this fraction of it
/// (hysteresis: without it, it would flip between yielding and not at every decision).
pub const RESUME: f64 = 0.25;

/// The default node policy.
#[derive(Debug)]
pub struct LearningFirst {
    params: LearningFirstParams,
    jobs: BTreeMap<JobId, Job>,
}

impl Default for LearningFirst {
    fn default() -> Self {
        Self::new(LearningFirstParams::default())
    }
}

impl LearningFirst {
    pub fn new(params: LearningFirstParams) -> Self {
        LearningFirst {
            params,
            jobs: BTreeMap::new(),
        }
    }

    fn observe(&mut self, now: Seconds, id: &JobId, point: ProgressPoint, quality: bool) {
        let smoothing = self.params.smoothing;
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if point.new_segment {
            // A new run: its curve, stage and size start over (its budget does not: it has
            // yielded what it may).
            job.curve.clear();
            job.revision += 1;
            job.tracker =
                LossTracker::new(job.spec.direction, smoothing, StageThresholds::default());
            job.work = Work::default();
            job.quality_fed = false;
        }
        if quality && !job.quality_fed {
            // From now on the curve follows the validation loss: a training loss that keeps
            // falling on an overfitting model says nothing about its quality.
            job.curve.clear();
            job.revision += 1;
            job.tracker =
                LossTracker::new(Direction::Minimise, smoothing, StageThresholds::default());
            job.quality_fed = true;
        }
        if quality != job.quality_fed {
            return;
        }
        let direction = if quality {
            Direction::Minimise
        } else {
            job.spec.direction
        };
        let signed = match direction {
            Direction::Minimise => point.value,
            Direction::Maximise => -point.value,
        };
        job.push(now, signed);
        job.tracker.observe(now, point.value, job.cpu_seconds);
    }
}

impl NodePolicy for LearningFirst {
    fn name(&self) -> &'static str {
        "learning-first"
    }

    fn job_added(&mut self, _now: Seconds, spec: &JobSpec) {
        self.jobs
            .entry(spec.id.clone())
            .or_insert_with(|| Job::new(spec.clone(), self.params.smoothing));
    }

    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        self.jobs.remove(id);
    }

    fn progress(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        self.observe(now, id, point, false);
    }

    fn quality(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        self.observe(now, id, point, true);
    }

    fn work_done(&mut self, now: Seconds, id: &JobId, fraction: f64) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if !fraction.is_finite() || fraction <= 0.0 {
            return;
        }
        let f = fraction.min(1.0);
        if job.work.report(f, job.cpu_seconds) {
            // Its counters went back without a new segment: a new run, its curve afresh.
            job.curve.retain(|p| p.0 >= now);
        }
        // The values the same log line carried are at this point of the run.
        for p in job.curve.iter_mut().rev() {
            if p.0 < now || p.2.is_some() {
                break;
            }
            p.2 = Some(f);
        }
        job.revision += 1;
    }

    fn usage(&mut self, now: Seconds, id: &JobId, usage: Usage) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        if let Some((t0, cpu0)) = job.last_usage {
            let dt = now - t0;
            if dt > 0.0 {
                let used = (usage.cpu_seconds - cpu0).max(0.0);
                let rate = used / dt;
                job.recent_cores = rate;
                if job.yielding {
                    job.lag += (job.twin_rate * dt - used).max(0.0);
                } else {
                    job.seen_cores = job.seen_cores.max(rate);
                }
            }
        }
        job.last_usage = Some((now, usage.cpu_seconds));
        job.cpu_seconds = job.cpu_seconds.max(usage.cpu_seconds);
    }

    fn hold(&mut self, _now: Seconds, id: &JobId, held: bool) {
        if let Some(job) = self.jobs.get_mut(id) {
            job.held = held;
        }
    }

    fn decide(&mut self, now: Seconds, node: &NodeResources) -> Plan {
        let params = self.params;
        // Each job's fair twin: the kernel's sharing of the node among what every job uses now
        // (a yielding job: the most it has been seen to use, what it could take back), so a job
        // beside a quiet one is owed more than an equal split.
        let demands: Vec<f64> = self
            .jobs
            .values()
            .map(|j| {
                if j.yielding {
                    j.seen_cores.max(j.recent_cores)
                } else {
                    j.recent_cores
                }
            })
            .collect();
        let twin_rates = fair_shares(node.cores, &demands);
        for (job, rate) in self.jobs.values_mut().zip(twin_rates) {
            job.twin_rate = rate;
        }
        for job in self.jobs.values_mut() {
            job.refresh_verdict(&params);
        }
        let learners: Vec<&Job> = self
            .jobs
            .values()
            .filter(|job| !job.held && job.verdict() == Verdict::Learning)
            .collect();
        let learning = learners.len();
        // The work the learners of known size have left, on average.
        let known: Vec<f64> = learners.iter().filter_map(|j| j.work.remaining()).collect();
        let learners_left =
            (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64);
        let mut allocations = BTreeMap::new();
        for (id, job) in &mut self.jobs {
            let verdict = job.verdict();
            let allowance = job.allowance(&params);
            if job.yielding && job.lag >= allowance {
                job.paced = true;
            } else if job.paced && job.lag <= (1.0 - RESUME) * allowance {
                job.paced = false;
            }
            let others_learning = learning > usize::from(verdict == Verdict::Learning);
            let (weight, category, why) = if job.held {
                job.yielding = false;
                (
                    scaled(params.floor),
                    job.tracker.category(),
                    "served after the others: at its sweep's rung".to_owned(),
                )
            } else {
                match verdict {
                    Verdict::Learning => {
                        job.yielding = false;
                        (100, job.tracker.category(), learning_reason(job))
                    }
                    Verdict::Learnt(prediction) => {
                        let past = match prediction {
                            Some(p) => format!(
                                "past its predicted quality point (final {:.4} ± {:.4})",
                                p.final_value, p.spread
                            ),
                            None => "converged".to_owned(),
                        };
                        // Its CPU to jobs with more work left than it has would finish them
                        // sooner and it later: the average completion would suffer for what
                        // the learners gain in time to quality. It yields only to jobs that
                        // have less left on average (or whose sizes are unknown).
                        let nearly_done = matches!(
                            (job.work.remaining(), learners_left),
                            (Some(mine), Some(theirs)) if mine < theirs
                        );
                        job.yielding = !job.paced && others_learning && !nearly_done;
                        if job.yielding {
                            (
                                scaled(params.yield_share),
                                Category::Converged,
                                format!(
                                    "{past}: yields to the jobs still learning (lag {:.1} of {:.1} CPU-s allowed)",
                                    job.lag, allowance
                                ),
                            )
                        } else if others_learning && nearly_done && !job.paced {
                            (
                                100,
                                Category::Converged,
                                format!(
                                    "{past}; fair share: it has less work left than the jobs still learning"
                                ),
                            )
                        } else if job.paced {
                            (
                                100,
                                Category::Converged,
                                format!(
                                    "{past}; at its fair share: it lags its fair-share pace by {:.1} CPU-s, its allowance",
                                    job.lag
                                ),
                            )
                        } else {
                            (
                                100,
                                Category::Converged,
                                format!("{past}; no other job is learning"),
                            )
                        }
                    }
                }
            };
            allocations.insert(
                id.clone(),
                Allocation {
                    category,
                    cpu: CpuAllocation {
                        weight,
                        max_cores: clamp_cores(None, &job.spec.bounds),
                    },
                    memory: MemoryAllocation::default(),
                    reason: format!("learning-first: {why}"),
                },
            );
        }
        Plan {
            allocations,
            move_requests: Vec::new(),
            next_decision_at: (!self.jobs.is_empty()).then_some(now + params.interval),
        }
    }
}

fn scaled(fraction: f64) -> u32 {
    ((fraction * 100.0).round() as u32).clamp(1, 100)
}

fn learning_reason(job: &Job) -> String {
    match job.work.done() {
        Some(f) => format!(
            "still learning ({:.0}% of its run done): fair share",
            f * 100.0
        ),
        None if job.curve.is_empty() => "no progress yet: fair share".to_owned(),
        None => "still learning (size unknown): fair share".to_owned(),
    }
}

#[cfg(test)]
#[path = "learning_first_tests.rs"]
mod tests;
