//! Seeded synthetic single-node workloads: a handful of training jobs with staggered arrivals,
//! different sizes, parallelism, scaling, loss scales and log formats.
//!
//! Every random choice is drawn from one ChaCha stream seeded by `seed`, in a fixed order, so a
//! seed names a workload. Distributions (documented because every result depends on them):
//! - work: log-uniform in `[work_min, work_max]` seconds on one core (default 300-3000 s: the
//!   papers' CPU jobs, MNIST to VAE, take 2-40 minutes on a few cores);
//! - parallelism: uniform over {1, 2, 4, 8} cores, at most the node's cores (intra-op threads);
//! - speed-up: Amdahl with parallel fraction uniform in `parallel_fraction` (default
//!   [0.80, 0.98]);
//! - arrivals: the first job at 0, the others uniform in `[0, arrival_window]`, by default a
//!   quarter of the time the whole workload would take on the node at perfect efficiency;
//! - loss: initial value log-uniform in [0.05, 200] (cross-entropy to VAE reconstruction
//!   scales), floor 2-40% of it, exponential (rate such that 95% of the drop is reached at
//!   15-90% of the work) or power-law shaped, with relative noise 0.5-5% per logged value;
//! - logging: 70% of jobs log once per epoch (5, 10, 20 or 50 epochs), 30% every 5-60 s;
//! - `reports_total` ("epoch k/N" in the line) with probability `reports_total`.

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::job::{JobModel, LogEvery, LossCurve, Speedup};

/// Parameters of a generated workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadParams {
    pub jobs: usize,
    pub cores: f64,
    pub seed: u64,
    /// Arrivals spread over this many seconds (None: a quarter of total work / cores).
    pub arrival_window: Option<f64>,
    pub work_min: f64,
    pub work_max: f64,
    /// Probability that a job's log lines say how far along it is.
    pub reports_total: f64,
    /// Range of the Amdahl parallel fraction (1.0 = perfect scaling).
    pub parallel_fraction: (f64, f64),
}

impl Default for WorkloadParams {
    fn default() -> Self {
        WorkloadParams {
            jobs: 6,
            cores: 4.0,
            seed: 1,
            arrival_window: None,
            work_min: 300.0,
            work_max: 3000.0,
            reports_total: 1.0,
            parallel_fraction: (0.80, 0.98),
        }
    }
}

/// Generate the workload named by `params`.
pub fn generate(params: &WorkloadParams) -> Vec<JobModel> {
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let mut jobs: Vec<JobModel> = (0..params.jobs)
        .map(|i| {
            let work = log_uniform(&mut rng, params.work_min, params.work_max);
            let parallelism = [1.0, 2.0, 4.0, 8.0][rng.random_range(0..4)];
            let parallelism = f64::min(parallelism, params.cores.max(1.0));
            let (lo, hi) = params.parallel_fraction;
            let parallel_fraction = lo + rng.random_range(0.0..=1.0) * (hi - lo).max(0.0);
            let initial = log_uniform(&mut rng, 0.05, 200.0);
            let floor = initial * rng.random_range(0.02..=0.40);
            let x95: f64 = rng.random_range(0.15..=0.90);
            let loss = if rng.random_bool(0.5) {
                LossCurve::Exponential {
                    initial,
                    floor,
                    rate: 3.0 / x95,
                }
            } else {
                // (1 + x/s)^-2 reaches 5% of the drop at x = s·(√20 - 1).
                LossCurve::PowerLaw {
                    initial,
                    floor,
                    scale: x95 / (20f64.sqrt() - 1.0),
                    exponent: 2.0,
                }
            };
            let noise = rng.random_range(0.005..=0.05);
            let log_every = if rng.random_bool(0.7) {
                let epochs = [5.0, 10.0, 20.0, 50.0][rng.random_range(0..4)];
                LogEvery::Work {
                    fraction: 1.0 / epochs,
                }
            } else {
                LogEvery::Seconds {
                    seconds: rng.random_range(5.0..=60.0),
                }
            };
            let reports_total = rng.random_bool(params.reports_total.clamp(0.0, 1.0));
            let memory_bytes = (rng.random_range(0.5..=8.0) * f64::from(1u32 << 30)) as u64;
            JobModel {
                id: format!("job-{i:02}"),
                submit: 0.0,
                work,
                parallelism,
                speedup: Speedup::Amdahl { parallel_fraction },
                loss,
                noise,
                log_every,
                reports_total,
                memory_bytes,
                priority: 0,
                startup: 0.0,
                quiet: Vec::new(),
                finish: None,
                sweep: None,
            }
        })
        .collect();
    let total_work: f64 = jobs.iter().map(|j| j.work).sum();
    let window = params
        .arrival_window
        .unwrap_or(0.25 * total_work / params.cores.max(1.0));
    for (i, job) in jobs.iter_mut().enumerate() {
        job.submit = if i == 0 {
            0.0
        } else {
            (rng.random_range(0.0..=1.0) * window).round()
        };
    }
    jobs
}

fn log_uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    let (lo, hi) = (lo.max(1e-9), hi.max(lo.max(1e-9)));
    (lo.ln() + rng.random_range(0.0..=1.0) * (hi.ln() - lo.ln())).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_a_workload() {
        let p = WorkloadParams::default();
        assert_eq!(generate(&p), generate(&p));
        let q = WorkloadParams {
            seed: 2,
            ..p.clone()
        };
        assert_ne!(generate(&p), generate(&q));
    }

    #[test]
    fn generated_jobs_respect_the_parameters() {
        let p = WorkloadParams {
            jobs: 50,
            cores: 2.0,
            reports_total: 0.0,
            ..WorkloadParams::default()
        };
        let jobs = generate(&p);
        assert_eq!(jobs.len(), 50);
        assert_eq!(jobs[0].submit, 0.0);
        for j in &jobs {
            assert!(j.work >= 300.0 - 1e-9 && j.work <= 3000.0 + 1e-9, "{j:?}");
            assert!(j.parallelism <= 2.0, "{j:?}");
            assert!(!j.reports_total);
            assert!(j.loss.value(0.0) > j.loss.value(1.0), "{j:?}");
        }
    }
}
