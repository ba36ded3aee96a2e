//! How much co-running jobs slow each other beyond their CPU shares, measured on the real runs.
//!
//! On a shared node a job's CPU-seconds per epoch are not constant: caches, memory bandwidth and
//! thread pools that spin on shared cores make each epoch cost more CPU when other jobs run at
//! the same time. From a workload's `fair` runs this fits, per job, `CPU-s per epoch =
//! base × (1 + c × others)`, where `others` is the number of other jobs using more than
//! [`sim::cluster::ACTIVE_CORES`] cores during that epoch (least squares over every epoch of
//! every fair run). `c` is what govsim's `--contention` models
//! ([`sim::cluster::ClusterConfig::contention`]).

use serde::Serialize;

use crate::bench_real::{JobResult, RunResult};
use sim::cluster::ACTIVE_CORES;

/// One job's fitted contention.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct ContentionFit {
    pub name: String,
    /// Epochs the fit used.
    pub epochs: usize,
    /// CPU-seconds per epoch with no other job running (the fit's intercept).
    pub base: f64,
    /// Growth of that per other running job, as a fraction of `base`.
    pub per_other_job: f64,
}

/// CPU-seconds `tl` (samples of `(time, cores)`, each the mean over the interval since the one
/// before, the first over `first_interval`) records between `a` and `b`.
fn cpu_between(tl: &[(f64, f64)], a: f64, b: f64, first_interval: f64) -> f64 {
    let mut sum = 0.0;
    let mut prev: Option<f64> = None;
    for &(t, cores) in tl {
        let lo = prev.unwrap_or(t - first_interval);
        let overlap = (t.min(b) - lo.max(a)).max(0.0);
        sum += cores * overlap;
        prev = Some(t);
    }
    sum
}

/// The cores a job used at `t` (0 outside its samples).
fn cores_at(tl: &[(f64, f64)], t: f64, first_interval: f64) -> f64 {
    let mut prev: Option<f64> = None;
    for &(s, cores) in tl {
        let lo = prev.unwrap_or(s - first_interval);
        if lo <= t && t <= s {
            return cores;
        }
        prev = Some(s);
    }
    0.0
}

/// The daemon's sampling interval as the timeline shows it (its median step; 0.5 s if unknown).
fn interval(tl: &[(f64, f64)]) -> f64 {
    let mut steps: Vec<f64> = tl.windows(2).map(|w| w[1].0 - w[0].0).collect();
    steps.sort_by(f64::total_cmp);
    steps.get(steps.len() / 2).copied().unwrap_or(0.5)
}

/// Every epoch of `job` in `run`: (other running jobs, CPU-seconds it took).
fn epochs(run: &RunResult, job: &JobResult) -> Vec<(f64, f64)> {
    let step = interval(&job.cpu_timeline);
    let times: Vec<f64> = job.curve.iter().map(|c| job.submitted + c.0).collect();
    times
        .windows(2)
        .filter(|w| w[1] > w[0])
        .map(|w| {
            let mid = 0.5 * (w[0] + w[1]);
            let others = run
                .jobs
                .iter()
                .filter(|o| o.name != job.name)
                .filter(|o| {
                    cores_at(&o.cpu_timeline, mid, interval(&o.cpu_timeline)) > ACTIVE_CORES
                })
                .count();
            (
                others as f64,
                cpu_between(&job.cpu_timeline, w[0], w[1], step),
            )
        })
        .collect()
}

/// Fit each job of `fair` (in the order of the first run); jobs whose epochs never saw two
/// different numbers of co-runners are left out (nothing to fit).
pub(crate) fn fit(fair: &[RunResult]) -> Vec<ContentionFit> {
    let Some(first) = fair.first() else {
        return Vec::new();
    };
    first
        .jobs
        .iter()
        .filter_map(|j| {
            let points: Vec<(f64, f64)> = fair
                .iter()
                .flat_map(|run| {
                    run.jobs
                        .iter()
                        .filter(|o| o.name == j.name)
                        .flat_map(|o| epochs(run, o))
                        .collect::<Vec<_>>()
                })
                .collect();
            if points.len() < 3 {
                return None;
            }
            let (base, slope) = crate::least_squares(&points)?;
            (base > 0.0).then(|| ContentionFit {
                name: j.name.clone(),
                epochs: points.len(),
                base,
                per_other_job: slope / base,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_real::Sizes;

    /// A job logging an epoch every `epoch_s` seconds from `start` to `end`, using `cores`.
    fn job(name: &str, start: f64, end: f64, epoch_s: f64, cores: f64) -> JobResult {
        let mut curve = Vec::new();
        let mut t = start;
        while t <= end + 1e-9 {
            curve.push((t, 1.0, 1.0));
            t += epoch_s;
        }
        let mut timeline = Vec::new();
        let mut s = 0.5;
        while s <= end + 1e-9 {
            timeline.push((s, if s > start - 1e-9 { cores } else { 0.0 }));
            s += 0.5;
        }
        JobResult {
            name: name.into(),
            submitted: 0.0,
            jct: end,
            ttq: None,
            cpu_seconds: None,
            epochs_done: curve.len() as u32,
            exit_ok: true,
            curve,
            cpu_timeline: timeline,
        }
    }

    #[test]
    fn an_epoch_that_costs_a_fifth_more_cpu_beside_another_job_fits_a_contention_of_a_fifth() {
        // One core each. Alone, `a` does an epoch per second (1 CPU-s); while `b` runs beside
        // it (from 10 s), an epoch takes 1.2 s: 1.2 CPU-s, a fifth more.
        let mut a = job("a", 0.0, 10.0, 1.0, 1.0);
        let later = job("a", 10.0, 22.0, 1.2, 1.0);
        a.curve.extend(later.curve.into_iter().skip(1));
        a.cpu_timeline = job("a", 0.0, 22.0, 1.0, 1.0).cpu_timeline;
        let b = job("b", 10.0, 22.0, 1.0, 1.0);
        let run = RunResult {
            workload: "w".into(),
            policy: "fair".into(),
            rep: 1,
            sizes: Sizes::Unknown,
            makespan: 22.0,
            daemon_cpu_seconds: 0.0,
            jobs: vec![a, b],
        };
        let fits = fit(&[run]);
        let a = fits.iter().find(|f| f.name == "a").expect("a is fitted");
        assert!((a.base - 1.0).abs() < 0.03, "{a:?}");
        assert!((a.per_other_job - 0.2).abs() < 0.03, "{a:?}");
        // `b` always ran beside `a`: nothing to fit.
        assert!(fits.iter().all(|f| f.name != "b"), "{fits:?}");
    }
}
