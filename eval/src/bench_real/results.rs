//! What a run measured and the figures drawn from it: per-job and per-run results, the paired
//! comparison with fair, a sweep's result, and the median and range of a sample.

use std::collections::BTreeMap;

use governor_policy::spec::SpecText;
use serde::{Deserialize, Serialize};

use super::Sizes;

/// What one job did in one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobResult {
    pub name: String,
    /// Submission, seconds after the run's start.
    pub submitted: f64,
    pub jct: f64,
    /// Time to quality from submission (None: no loss was logged).
    pub ttq: Option<f64>,
    pub cpu_seconds: Option<f64>,
    pub epochs_done: u32,
    pub exit_ok: bool,
    /// (seconds since submission, loss, val_loss) per epoch.
    pub curve: Vec<(f64, f64, f64)>,
    /// (seconds since the run's start, cores) every sample.
    pub cpu_timeline: Vec<(f64, f64)>,
}

/// One run: a workload under one policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub workload: String,
    pub policy: String,
    pub rep: u32,
    pub sizes: Sizes,
    pub makespan: f64,
    pub daemon_cpu_seconds: f64,
    pub jobs: Vec<JobResult>,
}

impl RunResult {
    pub fn avg_jct(&self) -> f64 {
        mean(self.jobs.iter().map(|j| j.jct))
    }
    pub fn avg_ttq(&self) -> Option<f64> {
        let v: Vec<f64> = self.jobs.iter().filter_map(|j| j.ttq).collect();
        (v.len() == self.jobs.len() && !v.is_empty()).then(|| mean(v.into_iter()))
    }
}

/// One job's figure `f` in each of `runs` (where the job has it).
pub(crate) fn job_values(
    runs: &[RunResult],
    name: &str,
    f: &dyn Fn(&JobResult) -> Option<f64>,
) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| f(r.jobs.iter().find(|x| x.name == name)?))
        .collect()
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { f64::NAN } else { s / n as f64 }
}

/// Paired comparison of one policy against fair in one repetition.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Pair {
    pub rep: u32,
    /// avg JCT(policy) / avg JCT(fair) - 1.
    pub avg_jct: f64,
    pub avg_ttq: Option<f64>,
    pub makespan: f64,
    /// The largest per-job JCT ratio policy/fair.
    pub worst_jct: f64,
    pub worst_ttq: Option<f64>,
    pub daemon_cpu: f64,
    /// The jobs' CPU-seconds, policy over fair, minus 1.
    pub cpu_seconds: Option<f64>,
    /// The jobs' best validation loss, policy over fair, minus 1 (mean over jobs): what
    /// stopping early gave up.
    pub best_loss: Option<f64>,
}

pub(crate) fn pair(fair: &RunResult, other: &RunResult) -> Pair {
    let by_name = |r: &RunResult| -> BTreeMap<String, JobResult> {
        r.jobs.iter().map(|j| (j.name.clone(), j.clone())).collect()
    };
    let (f, o) = (by_name(fair), by_name(other));
    let worst_jct = o
        .iter()
        .filter_map(|(n, j)| f.get(n).map(|fj| j.jct / fj.jct))
        .fold(0.0, f64::max);
    let ttq_ratios: Vec<f64> = o
        .iter()
        .filter_map(|(n, j)| Some(j.ttq? / f.get(n)?.ttq?))
        .collect();
    Pair {
        rep: other.rep,
        avg_jct: other.avg_jct() / fair.avg_jct() - 1.0,
        avg_ttq: match (other.avg_ttq(), fair.avg_ttq()) {
            (Some(a), Some(b)) => Some(a / b - 1.0),
            _ => None,
        },
        makespan: other.makespan / fair.makespan - 1.0,
        worst_jct,
        worst_ttq: (!ttq_ratios.is_empty()).then(|| ttq_ratios.iter().copied().fold(0.0, f64::max)),
        daemon_cpu: other.daemon_cpu_seconds,
        cpu_seconds: {
            let sum = |r: &RunResult| -> Option<f64> { r.jobs.iter().map(|j| j.cpu_seconds).sum() };
            match (sum(other), sum(fair)) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b - 1.0),
                _ => None,
            }
        },
        best_loss: {
            let rel: Vec<f64> = o
                .iter()
                .filter_map(|(n, j)| {
                    let (a, b) = (best_quality(j)?, best_quality(f.get(n)?)?);
                    (b > 0.0).then(|| a / b - 1.0)
                })
                .collect();
            (!rel.is_empty()).then(|| rel.iter().sum::<f64>() / rel.len() as f64)
        },
    }
}

/// The value of a `+KEY=VALUE` flag of a policy (`shortest-left+finish=5:0.001+sweep=lr`), read in
/// the one policy grammar ([`SpecText`]).
pub fn policy_option(policy: &str, key: &str) -> Option<String> {
    let spec: SpecText = policy.parse().ok()?;
    spec.option(key).map(str::to_owned)
}

/// The node policy spec of a benchmark policy (without its flags), as the daemon's `policy`
/// setting takes it.
pub fn node_spec(policy: &str) -> String {
    policy
        .parse::<SpecText>()
        .map_or_else(|_| policy.to_owned(), |s| s.node)
}

/// The same benchmark policy under the old names of its node policy
/// ([`governor_policy::POLICY_ALIASES`]): `shortest-left:slack=0.2+finish=5` was run as
/// `governor:slack=0.2+finish=5` before the rename, and its stored runs are under that name.
pub fn old_spellings(policy: &str) -> Vec<String> {
    let Ok(spec) = policy.parse::<SpecText>() else {
        return Vec::new();
    };
    let name = spec.node_name().to_owned();
    let params = spec.node.trim_start()[name.len()..].to_owned();
    governor_policy::POLICY_ALIASES
        .iter()
        .filter(|(_, canonical)| *canonical == name)
        .map(|(alias, _)| {
            SpecText {
                node: format!("{alias}{params}"),
                ..spec.clone()
            }
            .to_string()
        })
        .collect()
}

/// A run's result as the one who launched a sweep sees it: its best job (lowest best loss), that
/// loss, and when that job reached its quality (seconds since the run's start).
pub fn sweep_result(r: &RunResult) -> Option<(String, f64, Option<f64>)> {
    r.jobs
        .iter()
        .filter_map(|j| Some((j, best_quality(j)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(j, loss)| (j.name.clone(), loss, j.ttq.map(|t| j.submitted + t)))
}

/// The best quality value (validation loss, else loss) a job reached.
fn best_quality(j: &JobResult) -> Option<f64> {
    j.curve
        .iter()
        .map(|&(_, l, v)| if v.is_finite() { v } else { l })
        .filter(|v| v.is_finite())
        .reduce(f64::min)
}

/// Seconds in a table cell, "12.3 s", or "-" when there is no figure (the calibration's table
/// and the demo's).
pub fn secs(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1} s"))
}

/// Median and range of a sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

pub(crate) fn spread(mut v: Vec<f64>) -> Option<Spread> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}
