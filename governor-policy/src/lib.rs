//! Node policies: pure, deterministic decision code that turns each job's progress and resource
//! usage into CPU and memory allocations.
//!
//! A policy never reads a clock, a file or a cgroup: the caller (the daemon, the simulator, a
//! test) feeds it events stamped with its own clock (`now`, seconds since an arbitrary epoch) and
//! asks for a [`Plan`]. The same code therefore runs in the daemon, in `govsim` and in unit tests.
//!
//! Call protocol (the daemon and the simulator both follow it):
//! 1. [`NodePolicy::job_added`] / [`NodePolicy::job_removed`] when the job set changes
//!    (FlowCon's listeners);
//! 2. [`NodePolicy::progress`] for every new finite value of a job's progress signal;
//!    followed by [`NodePolicy::work_done`] when the log line also says how far along the job is
//!    ("epoch 3/10");
//! 3. [`NodePolicy::usage`] with cumulative resource counters whenever they are sampled;
//! 4. [`NodePolicy::decide`] at any time: after events and at [`Plan::next_decision_at`] at the
//!    latest. A policy that acts only on its own interval returns its previous allocations when
//!    asked early; the actuator skips writes that change nothing.
//!
//! Selectable by name through [`by_name`] (or a spec with parameters, [`by_spec`]); the default
//! node policy is [`learning_first`]; [`shortest_left`] (once called `governor`,
//! [`POLICY_ALIASES`]) was the default before it.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub mod allocate;
pub mod fair;
pub mod flowcon;
pub mod gpu_power;
pub mod learning_first;
pub mod predict;
pub mod quality;
pub mod share;
pub mod shortest_left;
pub mod spec;
pub mod specon;
pub mod speedup;
pub mod stage;
pub mod sweep;
mod work;

/// Seconds on the caller's clock (monotonic in the daemon, simulated in `govsim`).
pub type Seconds = f64;

/// Identifies a job on a node. Stable for the job's lifetime.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub String);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for JobId {
    fn from(s: &str) -> Self {
        JobId(s.to_owned())
    }
}

/// Whether a smaller or a larger value of the progress signal means progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Loss-like signals (the default).
    #[default]
    Minimise,
    /// Accuracy-like signals.
    Maximise,
}

/// Operator-set bounds on what a policy may give a job. `None` means unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Bounds {
    /// Never cap the job below this many cores.
    pub min_cores: Option<f64>,
    /// Never let the job use more than this many cores.
    pub max_cores: Option<f64>,
    /// Never set a memory limit below this many bytes.
    pub min_memory_bytes: Option<u64>,
    /// Never let the job use more than this many bytes.
    pub max_memory_bytes: Option<u64>,
}

/// What a policy knows about a job when it arrives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: JobId,
    /// Larger is more important. 0 is the default.
    pub priority: i32,
    pub direction: Direction,
    pub bounds: Bounds,
}

impl JobSpec {
    /// A job with default priority, a loss-like signal and no bounds.
    pub fn new(id: impl Into<String>) -> Self {
        JobSpec {
            id: JobId(id.into()),
            priority: 0,
            direction: Direction::Minimise,
            bounds: Bounds::default(),
        }
    }
}

/// One observation of a job's progress signal E(t).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgressPoint {
    /// When the record was observed (caller's clock).
    pub at: Seconds,
    /// The signal's value (finite; NaN/inf never reach a policy).
    pub value: f64,
    /// True when this value starts a new run segment (counters restarted in the log).
    pub new_segment: bool,
}

/// Cumulative resource counters of a job at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// When the counters were read (caller's clock).
    pub at: Seconds,
    /// CPU time consumed since the job started, in seconds (monotonic).
    pub cpu_seconds: f64,
    /// Memory in use now, in bytes.
    pub memory_bytes: u64,
    /// Cumulative count of memory pressure events (cgroup v2 `memory.events` high + max).
    pub memory_pressure_events: u64,
    /// Cumulative seconds the job's tasks were runnable but waiting for a CPU (its unmet
    /// demand: cgroup v2 `cpu.pressure`, the run delay of its threads on v1, or eBPF's run-queue
    /// wait), where the node measures it. It may fall when a thread exits: use its growth,
    /// floored at 0.
    pub cpu_wait_seconds: Option<f64>,
}

/// The node's capacity a policy divides.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeResources {
    /// CPU cores available to the governed jobs.
    pub cores: f64,
    /// Memory available to the governed jobs, in bytes.
    pub memory_bytes: u64,
}

/// The stage of a job's training as a policy sees it (FlowCon's NL/WL/CL, SpeCon's PC/WC/CC).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Not enough progress observed yet to judge.
    #[default]
    Unknown,
    /// Learning fast (FlowCon NL, SpeCon PC).
    Progressing,
    /// Slowing down, under watch (FlowCon WL, SpeCon WC).
    Watching,
    /// Nearly converged (FlowCon CL, SpeCon CC).
    Converged,
}

impl Category {
    /// All categories in their order (the order of a node summary's category counts).
    pub const ALL: [Category; 4] = [
        Category::Unknown,
        Category::Progressing,
        Category::Watching,
        Category::Converged,
    ];

    /// Position in [`Category::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Category::Unknown => "unknown",
            Category::Progressing => "progressing",
            Category::Watching => "watching",
            Category::Converged => "converged",
        })
    }
}

/// CPU allocation in cgroup terms. `weight` is work-conserving sharing (`cpu.weight`, 1..=10000,
/// 100 = the kernel's default); `max_cores` is a hard cap (`cpu.max` quota / period), `None` = no cap.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuAllocation {
    pub weight: u32,
    pub max_cores: Option<f64>,
}

impl CpuAllocation {
    /// The kernel's default: weight 100 and no cap.
    pub const DEFAULT: CpuAllocation = CpuAllocation {
        weight: 100,
        max_cores: None,
    };
}

impl Default for CpuAllocation {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Memory allocation in cgroup terms: `memory.high` (throttle/reclaim point) and `memory.max`
/// (hard limit). `None` leaves the file at its original value. The daemon's memory guard raises any
/// proposal below current usage plus headroom, whatever the policy says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAllocation {
    pub high_bytes: Option<u64>,
    pub max_bytes: Option<u64>,
}

/// A policy's decision for one job, with the reason an operator reads in `governor status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub category: Category,
    pub cpu: CpuAllocation,
    pub memory: MemoryAllocation,
    /// Short human-readable explanation of the decision.
    pub reason: String,
}

impl Allocation {
    /// Leave the job as the kernel would (used by `fair`).
    pub fn unmanaged(category: Category, reason: impl Into<String>) -> Self {
        Allocation {
            category,
            cpu: CpuAllocation::DEFAULT,
            memory: MemoryAllocation::default(),
            reason: reason.into(),
        }
    }
}

/// A request to move a job to another node (SpeCon); consumed by the coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoveRequest {
    pub job: JobId,
    pub reason: String,
}

/// The outcome of [`NodePolicy::decide`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// One entry per known job.
    pub allocations: BTreeMap<JobId, Allocation>,
    /// Jobs this node would like moved elsewhere.
    pub move_requests: Vec<MoveRequest>,
    /// Ask to be called again at this time at the latest (`None`: only on events).
    pub next_decision_at: Option<Seconds>,
}

/// A node policy. Implementations must be deterministic: the same calls in the same order give
/// the same plans.
pub trait NodePolicy: Send {
    /// The name the policy is selected by (`--policy NAME`).
    fn name(&self) -> &'static str;
    /// A job arrived on the node.
    fn job_added(&mut self, now: Seconds, spec: &JobSpec);
    /// A job left the node (finished, killed, moved away).
    fn job_removed(&mut self, now: Seconds, id: &JobId);
    /// A new finite value of a job's progress signal.
    fn progress(&mut self, now: Seconds, id: &JobId, point: ProgressPoint);
    /// New cumulative resource counters of a job.
    fn usage(&mut self, now: Seconds, id: &JobId, usage: Usage);
    /// The fraction (0..=1) of its planned work a job has done, when its log says so
    /// ("Epoch 3/10", "step 1200/5000"): called after [`NodePolicy::progress`] for a log line
    /// that carries a position and a total. Policies that rank jobs by remaining work use it;
    /// the default ignores it, so logs without totals work everywhere.
    fn work_done(&mut self, _now: Seconds, _id: &JobId, _fraction: f64) {}
    /// A value of the job's quality signal (its validation loss, where the log has one; see
    /// `governor_progress::quality_value`): what time to quality is judged by. Policies that
    /// judge learning by it use it instead of [`NodePolicy::progress`] once it arrives.
    fn quality(&mut self, _now: Seconds, _id: &JobId, _point: ProgressPoint) {}
    /// Serve a job after the others (`held`), or no longer: a trial of a sweep that reached a
    /// rung waiting for the sweep's other trials (so that the rung is judged sooner and less of
    /// a trial that may be cut is run). Its floor stays. A policy that orders jobs serves it
    /// last; the default ignores it. (A job being stopped is not held: its exit needs CPU.)
    fn hold(&mut self, _now: Seconds, _id: &JobId, _held: bool) {}
    /// Whether a new progress value can change the plan, so the daemon should decide as soon
    /// as one arrives. `fair` ignores progress: deciding after each log row would only cost CPU.
    fn decides_on_progress(&self) -> bool {
        true
    }
    /// Decide every job's allocation now.
    fn decide(&mut self, now: Seconds, node: &NodeResources) -> Plan;
}

/// The smallest cap the daemon writes: one 1 ms slice per 100 ms period (the kernel's minimum
/// quota is 1 ms).
pub const MIN_CAP_CORES: f64 = 0.01;

/// Apply operator bounds to a proposed `cpu.max` (in cores, `None` = no cap): never above
/// `bounds.max_cores`, never below `bounds.min_cores` nor [`MIN_CAP_CORES`]. Non-finite or
/// non-positive proposals mean "no cap".
pub fn clamp_cores(cap: Option<f64>, bounds: &Bounds) -> Option<f64> {
    let cap = cap.filter(|c| c.is_finite() && *c > 0.0);
    let cap = match (cap, bounds.max_cores.filter(|m| m.is_finite() && *m > 0.0)) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (None, Some(m)) => Some(m),
        (c, None) => c,
    };
    cap.map(|c| {
        let floor = bounds
            .min_cores
            .filter(|m| m.is_finite())
            .unwrap_or(0.0)
            .max(MIN_CAP_CORES);
        c.max(floor)
    })
}

/// Names accepted by [`by_name`], in the order they are documented.
pub const POLICY_NAMES: &[&str] = &["fair", "flowcon", "specon", "shortest-left", DEFAULT_POLICY];

/// The daemon's node policy unless its configuration names another.
pub const DEFAULT_POLICY: &str = "learning-first";

/// Old names still accepted by [`by_name`] and [`by_spec`] (in configurations, on command lines,
/// in benchmark lists), each with the name of the policy it stands for: the policy built reports
/// its own name. Not listed in [`POLICY_NAMES`].
pub const POLICY_ALIASES: &[(&str, &str)] = &[("governor", "shortest-left")];

/// The name a policy name stands for: an alias's ([`POLICY_ALIASES`]) policy, any other name
/// itself (known or not).
pub fn canonical_name(name: &str) -> &str {
    POLICY_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, canonical)| canonical)
}

/// Error for an unknown policy name.
#[derive(Debug, thiserror::Error)]
#[error("unknown policy {name:?}; known policies: {known}")]
pub struct UnknownPolicy {
    pub name: String,
    pub known: String,
}

/// A policy parameter that does not exist or has a value out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("unknown parameter {0:?}")]
    Unknown(String),
    #[error("{message}")]
    Invalid { key: String, message: String },
    #[error("expected KEY=VALUE, got {0:?}")]
    Syntax(String),
    #[error("takes no parameters")]
    NoParameters,
}

impl ParamError {
    fn invalid(key: &str, message: String) -> ParamError {
        ParamError::Invalid {
            key: key.to_owned(),
            message,
        }
    }
}

/// Error for a policy spec ([`by_spec`]) that names an unknown policy or parameter.
#[derive(Debug, thiserror::Error)]
pub enum PolicySpecError {
    #[error(transparent)]
    Unknown(#[from] UnknownPolicy),
    /// (The parameter's error is part of the message, not a source: it is this crate's own
    /// detail, not a lower layer's failure.)
    #[error("policy {policy}: {error}")]
    Parameter { policy: String, error: ParamError },
}

/// Build a policy from a spec `NAME[:KEY=VALUE]...`, e.g. `flowcon:interval=30` or
/// `shortest-left:floor=0.5:slack=0.2`: the named policy with the given parameters changed
/// from their defaults (the parameters each policy accepts are listed in its module doc).
/// `NAME` may be an old name ([`POLICY_ALIASES`]).
pub fn by_spec(spec: &str) -> Result<Box<dyn NodePolicy>, PolicySpecError> {
    let mut parts = spec.split(':');
    let name = canonical_name(parts.next().unwrap_or_default().trim());
    let params: Vec<(&str, &str)> = parts
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| PolicySpecError::Parameter {
                    policy: name.to_owned(),
                    error: ParamError::Syntax(kv.to_owned()),
                })
        })
        .collect::<Result<_, _>>()?;
    if params.is_empty() {
        return Ok(by_name(name)?);
    }
    let bad = |error: ParamError| PolicySpecError::Parameter {
        policy: name.to_owned(),
        error,
    };
    match name {
        "flowcon" => {
            let mut p = flowcon::FlowConParams::default();
            for (k, v) in params {
                p.set(k, v).map_err(bad)?;
            }
            Ok(Box::new(flowcon::FlowCon::new(p)))
        }
        "specon" => {
            let mut p = specon::SpeConParams::default();
            for (k, v) in params {
                p.set(k, v).map_err(bad)?;
            }
            Ok(Box::new(specon::SpeCon::new(p)))
        }
        "learning-first" => {
            let mut p = learning_first::LearningFirstParams::default();
            for (k, v) in params {
                p.set(k, v).map_err(bad)?;
            }
            Ok(Box::new(learning_first::LearningFirst::new(p)))
        }
        "shortest-left" => {
            let mut p = shortest_left::ShortestLeftParams::default();
            for (k, v) in params {
                p.set(k, v).map_err(bad)?;
            }
            Ok(Box::new(shortest_left::ShortestLeft::new(p)))
        }
        "fair" => Err(bad(ParamError::NoParameters)),
        _ => Err(PolicySpecError::Unknown(UnknownPolicy {
            name: name.to_owned(),
            known: POLICY_NAMES.join(", "),
        })),
    }
}

/// Parse a parameter value, with an error naming the key.
fn parse_param<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ParamError> {
    value
        .parse()
        .map_err(|_| ParamError::invalid(key, format!("invalid value {value:?} for {key}")))
}

/// Parse a number parameter within `[min, max]`, with an error naming the key and the range.
fn parse_number_in(key: &str, value: &str, min: f64, max: f64) -> Result<f64, ParamError> {
    let v: f64 = parse_param(key, value)?;
    if v.is_finite() && v >= min && v <= max {
        Ok(v)
    } else {
        Err(ParamError::invalid(
            key,
            format!("{key} must be in [{min}, {max}], not {value}"),
        ))
    }
}

/// Build a policy by its name (or an old name, [`POLICY_ALIASES`]), with its default parameters.
pub fn by_name(name: &str) -> Result<Box<dyn NodePolicy>, UnknownPolicy> {
    match canonical_name(name) {
        "fair" => Ok(Box::new(fair::Fair::default())),
        "flowcon" => Ok(Box::new(flowcon::FlowCon::default())),
        "specon" => Ok(Box::new(specon::SpeCon::default())),
        "shortest-left" => Ok(Box::new(shortest_left::ShortestLeft::default())),
        "learning-first" => Ok(Box::new(learning_first::LearningFirst::default())),
        _ => Err(UnknownPolicy {
            name: name.to_owned(),
            known: POLICY_NAMES.join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_name_builds_a_policy_of_that_name() {
        for name in POLICY_NAMES {
            let policy = by_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(policy.name(), *name);
        }
        let err = by_name("nope").err().expect("unknown name rejected");
        assert!(err.to_string().contains("fair"), "{err}");
    }

    #[test]
    fn specs_set_parameters_and_reject_mistakes() {
        for spec in [
            "fair",
            "flowcon:interval=30",
            "flowcon:threshold_lists=nl_wl:max_interval=60",
            "specon:alpha=0.05:interval=20:relative_gain=false:min_learning_others=1",
        ] {
            let p = by_spec(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(p.name(), spec.split(':').next().unwrap());
        }
        for bad in [
            "nope",
            "fair:x=1",
            "flowcon:interval",
            "flowcon:bogus=1",
            "flowcon:interval=abc",
            "specon:alpha=x",
            "shortest-left:bogus=1",
            "governor:bogus=1",
        ] {
            assert!(by_spec(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn the_old_name_governor_is_an_alias_of_shortest_left() {
        assert!(POLICY_NAMES.contains(&"shortest-left"), "{POLICY_NAMES:?}");
        assert!(!POLICY_NAMES.contains(&"governor"), "{POLICY_NAMES:?}");
        assert_eq!(DEFAULT_POLICY, "learning-first");
        assert_eq!(canonical_name("governor"), "shortest-left");
        assert_eq!(canonical_name("fair"), "fair");
        assert_eq!(by_name("governor").unwrap().name(), "shortest-left");
        for spec in [
            "governor",
            "governor:slack=0.2",
            " governor :slack=0.2:floor=0.5",
        ] {
            let p = by_spec(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(p.name(), "shortest-left", "{spec}");
        }
        // The alias takes the same parameters, with the same checks, as the policy.
        let err = by_spec("governor:slack=-1")
            .err()
            .expect("bad slack rejected");
        assert!(err.to_string().contains("shortest-left"), "{err}");
        // An unknown name lists the canonical names, not the alias.
        let err = by_name("nope").err().expect("unknown name rejected");
        assert!(err.to_string().contains("shortest-left"), "{err}");
        assert!(!err.to_string().contains("governor"), "{err}");
    }

    #[test]
    fn bounds_clamp_caps() {
        let none = Bounds::default();
        assert_eq!(clamp_cores(None, &none), None);
        assert_eq!(clamp_cores(Some(2.0), &none), Some(2.0));
        assert_eq!(clamp_cores(Some(0.0), &none), None, "a zero cap is no cap");
        assert_eq!(clamp_cores(Some(f64::NAN), &none), None);
        assert_eq!(clamp_cores(Some(0.001), &none), Some(MIN_CAP_CORES));
        let b = Bounds {
            min_cores: Some(1.0),
            max_cores: Some(3.0),
            ..Bounds::default()
        };
        assert_eq!(clamp_cores(None, &b), Some(3.0));
        assert_eq!(clamp_cores(Some(5.0), &b), Some(3.0));
        assert_eq!(clamp_cores(Some(0.5), &b), Some(1.0));
        assert_eq!(clamp_cores(Some(2.0), &b), Some(2.0));
    }
}
