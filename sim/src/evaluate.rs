//! Cluster runs compared with `fair` on the same trace: what `govsim run`, `govsim compare` and
//! `govsim paper` print.
//!
//! The reference is always the `fair` [`PolicySpec`] (every job gets the kernel's default
//! share, jobs spread by count: the papers' default schedulers), run on the same trace, cluster
//! and seed. A job's *slowdown* is its JCT over its JCT under that reference.

use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterConfig, ClusterRun, PolicySpec, RunError, run_cluster};
use crate::trace::Trace;

/// One job of a run, next to its outcome under `fair`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    pub id: String,
    pub submit: f64,
    pub finish: Option<f64>,
    pub jct: Option<f64>,
    /// JCT over the job's JCT under `fair` (None when either did not finish).
    pub slowdown_vs_fair: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    #[serde(skip_serializing_if = "is_zero")]
    pub moves: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One policy's run on a trace, summarised against `fair`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub policy: String,
    pub jobs: Vec<JobReport>,
    /// Mean JCT of the finished jobs, seconds.
    pub avg_jct: f64,
    /// Last finish minus first submit, seconds.
    pub makespan: f64,
    /// The largest per-job slowdown against `fair` (infinite when a job finished under `fair`
    /// but not here).
    pub max_slowdown_vs_fair: f64,
    /// `avg_jct / avg_jct(fair)`.
    pub avg_jct_vs_fair: f64,
    /// Average time to quality over fair's (see [`crate::node::JobResult::ttq`]).
    #[serde(default)]
    pub avg_ttq_vs_fair: f64,
    /// `makespan / makespan(fair)`.
    pub makespan_vs_fair: f64,
    /// Share of the jobs that finished strictly sooner (JCT) than under `fair`.
    pub faster_than_fair: f64,
    /// Best per-job change of JCT against `fair` (`slowdown - 1`, most negative).
    pub best_job_change: f64,
    /// Worst per-job change (`slowdown - 1`, most positive).
    pub worst_job_change: f64,
    /// Jobs that did not finish before the horizon.
    pub unfinished: usize,
    /// Jobs moved between workers.
    pub moves: usize,
    /// The full run (timelines included when recorded); not serialised.
    #[serde(skip)]
    pub run: Option<ClusterRun>,
}

/// Run `fair` and then each spec on the same trace and cluster; reports in `specs` order
/// (`fair` itself is reported only if listed).
pub fn evaluate(
    trace: &Trace,
    config: &ClusterConfig,
    specs: &[PolicySpec],
    seed: u64,
) -> Result<Vec<RunReport>, RunError> {
    let fair_spec: PolicySpec = "fair".parse().expect("fair is a valid spec");
    let fair = run_cluster(trace, config, &fair_spec, seed)?;
    specs
        .iter()
        .map(|spec| {
            let run = if *spec == fair_spec {
                fair.clone()
            } else {
                run_cluster(trace, config, spec, seed)?
            };
            Ok(report(run, &fair))
        })
        .collect()
}

/// Summarise `run` against the reference run `fair` (same trace, jobs in the same order).
pub fn report(run: ClusterRun, fair: &ClusterRun) -> RunReport {
    let jobs: Vec<JobReport> = run
        .jobs
        .iter()
        .zip(&fair.jobs)
        .map(|(r, f)| JobReport {
            id: r.id.clone(),
            submit: r.submit,
            finish: r.finish,
            jct: r.jct,
            slowdown_vs_fair: match (r.jct, f.jct) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            },
            worker: r.worker.clone(),
            moves: r.moves,
        })
        .collect();
    let slowdowns: Vec<f64> = jobs.iter().filter_map(|j| j.slowdown_vs_fair).collect();
    let lost = run
        .jobs
        .iter()
        .zip(&fair.jobs)
        .any(|(r, f)| r.jct.is_none() && f.jct.is_some());
    let max_slowdown_vs_fair = if lost {
        f64::INFINITY
    } else {
        slowdowns.iter().copied().fold(0.0, f64::max)
    };
    let faster = slowdowns.iter().filter(|&&s| s < 1.0 - 1e-9).count();
    RunReport {
        policy: run.policy.clone(),
        avg_jct: run.avg_jct,
        makespan: run.makespan,
        max_slowdown_vs_fair,
        avg_jct_vs_fair: ratio(run.avg_jct, fair.avg_jct),
        avg_ttq_vs_fair: ratio(run.avg_ttq, fair.avg_ttq),
        makespan_vs_fair: ratio(run.makespan, fair.makespan),
        faster_than_fair: if jobs.is_empty() {
            0.0
        } else {
            faster as f64 / jobs.len() as f64
        },
        best_job_change: slowdowns.iter().copied().fold(f64::INFINITY, f64::min) - 1.0,
        worst_job_change: slowdowns.iter().copied().fold(f64::NEG_INFINITY, f64::max) - 1.0,
        unfinished: run.unfinished,
        moves: run.moves.iter().filter(|m| m.to.is_some()).count(),
        jobs,
        run: Some(run),
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

/// A Markdown table of reports (one row per policy).
pub fn markdown_table(reports: &[RunReport]) -> String {
    let mut out = String::from(
        "| policy | avg JCT (s) | vs fair | makespan (s) | vs fair | jobs faster than fair | best / worst job | max slowdown | moves |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in reports {
        out.push_str(&format!(
            "| {} | {:.0} | {:+.1}% | {:.0} | {:+.1}% | {:.0}% | {:+.0}% / {:+.0}% | {:.2}x | {} |\n",
            r.policy,
            r.avg_jct,
            (r.avg_jct_vs_fair - 1.0) * 100.0,
            r.makespan,
            (r.makespan_vs_fair - 1.0) * 100.0,
            r.faster_than_fair * 100.0,
            r.best_job_change * 100.0,
            r.worst_job_change * 100.0,
            r.max_slowdown_vs_fair,
            r.moves,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobModel, LogEvery, LossCurve, Speedup};
    use crate::trace::{TRACE_VERSION, TraceJob};

    fn job(id: &str, submit: f64, work: f64, parallelism: f64) -> TraceJob {
        TraceJob::new(JobModel {
            id: id.into(),
            submit,
            work,
            parallelism,
            speedup: Speedup::Linear,
            loss: LossCurve::Exponential {
                initial: 2.0,
                floor: 0.1,
                rate: 4.0,
            },
            noise: 0.0,
            log_every: LogEvery::Work { fraction: 0.1 },
            reports_total: true,
            memory_bytes: 1 << 30,
            priority: 0,
            startup: 0.0,
            quiet: Vec::new(),
            finish: None,
            sweep: None,
        })
    }

    #[test]
    fn slowdowns_are_against_fair_on_the_same_trace() {
        // One 2-core worker. Fair shares: a and b run together. FIFO with reservations: b waits
        // for a, so a is faster than under fair and b slower, by amounts worked out by hand.
        let trace = Trace {
            version: TRACE_VERSION,
            description: String::new(),
            generator: None,
            jobs: vec![job("a", 0.0, 100.0, 2.0), job("b", 10.0, 100.0, 2.0)],
        };
        let mut config = ClusterConfig::homogeneous(1, 2.0, 16 << 30, 0);
        config.start_delay = 0.0;
        let specs: Vec<PolicySpec> = ["fair", "fifo"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let reports = evaluate(&trace, &config, &specs, 1).unwrap();
        let (fair, fifo) = (&reports[0], &reports[1]);
        // fair: a 90, b 100 - 10 = 90. fifo: a 50, b 100 - 10 = 90.
        assert!((fair.avg_jct - 90.0).abs() < 1e-6, "{fair:?}");
        assert_eq!(fair.max_slowdown_vs_fair, 1.0);
        assert_eq!(fair.faster_than_fair, 0.0);
        assert!((fifo.avg_jct - 70.0).abs() < 1e-6, "{fifo:?}");
        assert!((fifo.jobs[0].slowdown_vs_fair.unwrap() - 50.0 / 90.0).abs() < 1e-9);
        assert!((fifo.best_job_change - (50.0 / 90.0 - 1.0)).abs() < 1e-9);
        assert!((fifo.worst_job_change).abs() < 1e-9);
        assert_eq!(fifo.faster_than_fair, 0.5);
        assert!((fifo.makespan_vs_fair - 1.0).abs() < 1e-9);
        let table = markdown_table(&reports);
        assert!(table.contains("| fifo | 70 | -22.2% |"), "{table}");
    }
}
