//! The guard's projections: the plan rule's shares ([`plan_shares`], [`greedy_targets`],
//! [`weight_of`]) and each job's completion under a division of the cores ([`project`]).

use crate::share::{ShareRequest, water_fill};

/// A job as the projections see it.
#[derive(Clone, Copy, Debug)]
pub(super) struct SimJob {
    /// CPU-seconds left (infinite: unknown).
    pub(super) remaining: f64,
    /// Cores it can use.
    pub(super) cap: f64,
}

/// Each job's cores under the plan rule: in `order`, each is given what it can use until none
/// are left, then everyone is raised to `floor_cores`; the kernel shares by the resulting
/// weights, each job using at most its cap.
pub(super) fn plan_shares(
    cores: f64,
    jobs: &[SimJob],
    order: &[usize],
    floor_cores: f64,
) -> Vec<f64> {
    let targets = greedy_targets(cores, jobs, order, floor_cores);
    let requests: Vec<ShareRequest> = jobs
        .iter()
        .zip(&targets)
        .map(|(j, t)| ShareRequest {
            weight: weight_of(*t, targets.iter().sum(), jobs.len()),
            max_cores: None,
            demand: j.cap,
        })
        .collect();
    water_fill(cores, &requests)
}

pub(super) fn greedy_targets(
    cores: f64,
    jobs: &[SimJob],
    order: &[usize],
    floor_cores: f64,
) -> Vec<f64> {
    let mut targets = vec![0.0; jobs.len()];
    let mut left = cores;
    for &i in order {
        let t = jobs[i].cap.min(left).max(0.0);
        targets[i] = t;
        left -= t;
    }
    for t in &mut targets {
        *t = t.max(floor_cores);
    }
    targets
}

/// `cpu.weight` for a target of `target` cores when the targets sum to `total` over `n` jobs:
/// proportional, normalised so that the weights average 100 (the kernel default).
pub(super) fn weight_of(target: f64, total: f64, n: usize) -> u32 {
    (target / total.max(1e-9) * 100.0 * n as f64)
        .round()
        .clamp(1.0, 10_000.0) as u32
}

/// When each job finishes (seconds from now) if the cores are divided by `shares` (recomputed
/// from the jobs still running at each completion) and nothing arrives; infinite for unknown
/// work.
pub(super) fn project(
    cores: f64,
    jobs: &[SimJob],
    shares: impl Fn(&[SimJob], &[usize]) -> Vec<f64>,
) -> Vec<f64> {
    let mut finish = vec![f64::INFINITY; jobs.len()];
    let mut left: Vec<f64> = jobs.iter().map(|j| j.remaining).collect();
    let mut live: Vec<usize> = (0..jobs.len()).collect();
    let mut t = 0.0;
    while live.iter().any(|&i| left[i].is_finite()) {
        let sub: Vec<SimJob> = live
            .iter()
            .map(|&i| SimJob {
                remaining: left[i],
                cap: jobs[i].cap,
            })
            .collect();
        let s = shares(&sub, &live);
        let step = live
            .iter()
            .zip(&s)
            .filter(|(i, v)| **v > 1e-12 && left[**i].is_finite())
            .map(|(i, v)| left[*i] / v)
            .fold(f64::INFINITY, f64::min);
        if !step.is_finite() {
            break;
        }
        t += step;
        for (&i, v) in live.iter().zip(&s) {
            left[i] -= v * step;
            if left[i].is_finite() && left[i] <= 1e-9 * (1.0 + jobs[i].remaining) {
                finish[i] = t;
            }
        }
        live.retain(|&i| finish[i].is_infinite());
        let _ = cores;
    }
    finish
}
