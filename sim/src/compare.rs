//! Run several policies on the same workload and compare each with `fair`.

use governor_policy::NodePolicy;
use serde::{Deserialize, Serialize};

use crate::job::JobModel;
use crate::node::{NodeConfig, NodeRun, run_node};

/// One job under one policy, next to its fair-sharing outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub id: String,
    pub submit: f64,
    pub finish: Option<f64>,
    pub jct: Option<f64>,
    /// JCT over the job's JCT under `fair` on the same workload.
    pub slowdown_vs_fair: Option<f64>,
}

/// One policy's outcome on a workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyOutcome {
    pub policy: String,
    pub jobs: Vec<JobOutcome>,
    pub avg_jct: f64,
    pub makespan: f64,
    /// The worst per-job slowdown against `fair`.
    pub max_slowdown_vs_fair: f64,
    /// `avg_jct / avg_jct(fair)`.
    pub avg_jct_vs_fair: f64,
    /// Average time to quality over fair's.
    pub avg_ttq_vs_fair: f64,
    /// `makespan / makespan(fair)`.
    pub makespan_vs_fair: f64,
    /// `makespan / (a lower bound on any policy's makespan)`.
    pub makespan_vs_lower_bound: f64,
    pub move_requests: usize,
    pub decisions: u64,
    /// Full run (timeline included when recorded), for `--verbose` output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<NodeRun>,
}

/// Compare `fair` (always run first, as the reference) with each named policy. `make` builds a
/// policy from a name or spec.
pub fn compare<E>(
    jobs: &[JobModel],
    config: &NodeConfig,
    seed: u64,
    policies: &[String],
    make: impl Fn(&str) -> Result<Box<dyn NodePolicy>, E>,
    keep_runs: bool,
) -> Result<Vec<PolicyOutcome>, E> {
    let mut fair_policy = make("fair")?;
    let fair = run_node(jobs, config, fair_policy.as_mut(), seed);
    let mut out = Vec::new();
    for name in policies {
        let run = if name == "fair" {
            fair.clone()
        } else {
            let mut policy = make(name)?;
            run_node(jobs, config, policy.as_mut(), seed)
        };
        out.push(outcome(name, run, &fair, keep_runs));
    }
    Ok(out)
}

fn outcome(name: &str, run: NodeRun, fair: &NodeRun, keep_run: bool) -> PolicyOutcome {
    let jobs: Vec<JobOutcome> = run
        .jobs
        .iter()
        .zip(&fair.jobs)
        .map(|(r, f)| JobOutcome {
            id: r.id.clone(),
            submit: r.submit,
            finish: r.finish,
            jct: r.jct,
            slowdown_vs_fair: match (r.jct, f.jct) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            },
        })
        .collect();
    let max_slowdown_vs_fair = jobs
        .iter()
        .map(|j| j.slowdown_vs_fair.unwrap_or(f64::INFINITY))
        .fold(0.0, f64::max);
    PolicyOutcome {
        policy: name.to_owned(),
        avg_jct: run.avg_jct,
        makespan: run.makespan,
        max_slowdown_vs_fair,
        avg_jct_vs_fair: ratio(run.avg_jct, fair.avg_jct),
        avg_ttq_vs_fair: ratio(run.avg_ttq, fair.avg_ttq),
        makespan_vs_fair: ratio(run.makespan, fair.makespan),
        makespan_vs_lower_bound: ratio(run.makespan, run.makespan_lower_bound),
        move_requests: run.move_requests.len(),
        decisions: run.decisions,
        jobs,
        run: keep_run.then_some(run),
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

/// Aggregate of one policy over many workloads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    pub policy: String,
    pub workloads: usize,
    /// Geometric mean of `avg_jct / avg_jct(fair)`.
    pub avg_jct_vs_fair: f64,
    /// Geometric mean of the average time to quality over fair's.
    pub avg_ttq_vs_fair: f64,
    /// Geometric mean of `makespan / makespan(fair)`.
    pub makespan_vs_fair: f64,
    /// Worst per-job slowdown against `fair` over every workload.
    pub max_slowdown_vs_fair: f64,
    /// Geometric mean of `makespan / lower bound`.
    pub makespan_vs_lower_bound: f64,
    /// Fraction of workloads where no job was more than 10% slower than under `fair`.
    pub within_10pct: f64,
    /// Best and worst `avg_jct / avg_jct(fair)` over the workloads.
    pub best_avg_jct_vs_fair: f64,
    pub worst_avg_jct_vs_fair: f64,
}

/// Summarise per-workload outcomes (one `Vec<PolicyOutcome>` per workload, same policy order).
pub fn summarise(per_workload: &[Vec<PolicyOutcome>]) -> Vec<SweepRow> {
    let Some(first) = per_workload.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|k| {
            let outcomes: Vec<&PolicyOutcome> = per_workload.iter().map(|w| &w[k]).collect();
            let n = outcomes.len() as f64;
            let geo = |f: &dyn Fn(&PolicyOutcome) -> f64| {
                (outcomes.iter().map(|o| f(o).ln()).sum::<f64>() / n).exp()
            };
            SweepRow {
                policy: first[k].policy.clone(),
                workloads: outcomes.len(),
                avg_jct_vs_fair: geo(&|o| o.avg_jct_vs_fair),
                avg_ttq_vs_fair: geo(&|o| o.avg_ttq_vs_fair),
                makespan_vs_fair: geo(&|o| o.makespan_vs_fair),
                makespan_vs_lower_bound: geo(&|o| o.makespan_vs_lower_bound),
                max_slowdown_vs_fair: outcomes
                    .iter()
                    .map(|o| o.max_slowdown_vs_fair)
                    .fold(0.0, f64::max),
                within_10pct: outcomes
                    .iter()
                    .filter(|o| o.max_slowdown_vs_fair <= 1.10 + 1e-9)
                    .count() as f64
                    / n,
                best_avg_jct_vs_fair: outcomes
                    .iter()
                    .map(|o| o.avg_jct_vs_fair)
                    .fold(f64::INFINITY, f64::min),
                worst_avg_jct_vs_fair: outcomes
                    .iter()
                    .map(|o| o.avg_jct_vs_fair)
                    .fold(0.0, f64::max),
            }
        })
        .collect()
}
