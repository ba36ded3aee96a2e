//! The simulated training job: how much work it has, how fast it runs on a given number of cores,
//! what its loss looks like as it goes, and when it writes a log line.
//!
//! Units: *work* is measured in seconds of the job running alone on exactly one core, so a job
//! with `work = 600` takes 10 minutes on one core and `600 / speedup(c)` seconds on `c` cores.

use rand::Rng;
use serde::{Deserialize, Serialize};

/// How a job's speed grows with the cores it runs on, up to its parallelism limit.
///
/// Below one core a job runs proportionally slower (time slicing): `speed(c) = c` for `c ≤ 1`.
/// Above one core the curve is sub-linear and continuous at 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Speedup {
    /// Perfect scaling: `speed(c) = c`.
    Linear,
    /// Amdahl's law with parallel fraction `f`: `speed(c) = 1 / ((1 - f) + f / c)`.
    /// Data-parallel CPU training (intra-op threads) has `f` around 0.85-0.98.
    Amdahl { parallel_fraction: f64 },
    /// A power law `speed(c) = c^e` with `0 < e ≤ 1` (heSRPT's model).
    Power { exponent: f64 },
}

impl Speedup {
    /// Work per second on `cores` cores (the caller has already limited `cores` to the job's
    /// parallelism). Never negative; 0 for 0 cores.
    pub fn speed(&self, cores: f64) -> f64 {
        if cores.is_nan() || cores <= 0.0 {
            return 0.0;
        }
        if cores <= 1.0 {
            return cores;
        }
        match *self {
            Speedup::Linear => cores,
            Speedup::Amdahl { parallel_fraction } => {
                let f = parallel_fraction.clamp(0.0, 1.0);
                1.0 / ((1.0 - f) + f / cores)
            }
            Speedup::Power { exponent } => cores.powf(exponent.clamp(0.0, 1.0)),
        }
    }
}

/// A job's loss as a function of the fraction `x ∈ [0, 1]` of its work done. Pluggable: real
/// curves go in as [`LossCurve::Points`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LossCurve {
    /// `floor + (initial - floor) · exp(-rate · x)`.
    Exponential { initial: f64, floor: f64, rate: f64 },
    /// `floor + (initial - floor) · (1 + x/scale)^-exponent`: a long, slow tail.
    PowerLaw {
        initial: f64,
        floor: f64,
        scale: f64,
        exponent: f64,
    },
    /// A measured curve: `(fraction of work, loss)` points sorted by fraction, linearly
    /// interpolated and held flat outside the range.
    Points { points: Vec<(f64, f64)> },
}

impl LossCurve {
    /// The noiseless loss after fraction `x` of the work.
    pub fn value(&self, x: f64) -> f64 {
        let x = x.clamp(0.0, 1.0);
        match self {
            LossCurve::Exponential {
                initial,
                floor,
                rate,
            } => floor + (initial - floor) * (-rate * x).exp(),
            LossCurve::PowerLaw {
                initial,
                floor,
                scale,
                exponent,
            } => floor + (initial - floor) * (1.0 + x / scale.max(1e-9)).powf(-exponent),
            LossCurve::Points { points } => interpolate(points, x),
        }
    }
}

fn interpolate(points: &[(f64, f64)], x: f64) -> f64 {
    match points {
        [] => 0.0,
        [only] => only.1,
        _ => {
            if x <= points[0].0 {
                return points[0].1;
            }
            for w in points.windows(2) {
                let ((x0, y0), (x1, y1)) = (w[0], w[1]);
                if x <= x1 {
                    if x1 <= x0 {
                        return y1;
                    }
                    return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
                }
            }
            points[points.len() - 1].1
        }
    }
}

/// When a job writes a log line (and so when its progress can be observed at all).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LogEvery {
    /// Every this fraction of the work (an epoch, or every k steps of a fixed-step job).
    Work { fraction: f64 },
    /// Every this many seconds of wall-clock time while the job runs (time-based loggers).
    Seconds { seconds: f64 },
}

/// One simulated job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobModel {
    pub id: String,
    /// Arrival time on the node, seconds.
    pub submit: f64,
    /// Total work, seconds on one core.
    pub work: f64,
    /// Most cores the job can keep busy (its thread count).
    pub parallelism: f64,
    pub speedup: Speedup,
    pub loss: LossCurve,
    /// Relative noise of each logged loss value (standard deviation as a fraction of the value).
    #[serde(default)]
    pub noise: f64,
    pub log_every: LogEvery,
    /// Whether the log line says how far along the job is ("epoch 3/10", "step 120/500"); when
    /// true the policy is told the fraction of work done at each log line.
    #[serde(default)]
    pub reports_total: bool,
    /// Resident memory, bytes (reported in usage samples; moves will cost time in
    /// proportion to it).
    #[serde(default)]
    pub memory_bytes: u64,
    /// Scheduling priority given to the policy (0 = default).
    #[serde(default)]
    pub priority: i32,
    /// Work done before the first log line (imports, data loading: ~6 CPU-seconds for a
    /// TensorFlow job on this machine's cores), part of `work`. The loss curve and the log
    /// schedule cover the rest.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub startup: f64,
    /// Phases without CPU demand (waiting for a data set, uploading a checkpoint), in order of
    /// `after`. Simulated by the single-node simulator (`govsim sweep`, bench-real's
    /// calibration); the cluster simulator does not model them yet and refuses such traces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quiet: Vec<QuietPhase>,
    /// Finish at convergence (opt-in, `governor run-job --finish`): the job is stopped once its
    /// logged loss has gone `patience` lines without a new best by `min_delta`
    /// ([`governor_policy::quality::EarlyStop`], the daemon's own rule), as soon as the daemon
    /// would see that line; its remaining work is not done. Simulated by the single-node
    /// simulator; the cluster simulator refuses such traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<governor_policy::quality::FinishRule>,
    /// A trial of a sweep with a trial budget (opt-in): on one node (`governor run-job
    /// --sweep`) the trials of one sweep name go through the daemon's own successive halving
    /// ([`governor_policy::sweep::Sweeps`]); a trial waiting at a rung is held (the policy's
    /// `hold`), an outranked one is stopped as the daemon reads the line that decides it. In a
    /// cluster (`govctl submit --sweep`) the planner judges them across the workers from their
    /// reports. Its epochs are its log lines ([`JobModel::epochs_at`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<governor_policy::sweep::SweepTrial>,
}

/// A phase in which a job needs no CPU: once it has done `after` work, it sleeps `seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuietPhase {
    pub after: f64,
    pub seconds: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl JobModel {
    /// Work per second on `cores` cores, after the parallelism limit.
    pub fn speed(&self, cores: f64) -> f64 {
        self.speedup.speed(cores.min(self.parallelism))
    }

    /// The start-up, within `[0, work)`.
    fn startup_work(&self) -> f64 {
        self.startup.clamp(0.0, (self.work * (1.0 - 1e-9)).max(0.0))
    }

    /// Work done when the log line for training fraction `x` is written (after the start-up).
    pub fn log_at(&self, x: f64) -> f64 {
        let s = self.startup_work();
        s + x * (self.work - s)
    }

    /// Epochs done at the log line of training fraction `x`, for a log written every
    /// `fraction` of the training (each line an epoch, as in bench-real's calibrated models);
    /// `None` for a log written by time, which says no epoch (a sweep never cuts it).
    pub fn epochs_at(&self, x: f64) -> Option<f64> {
        match self.log_every {
            LogEvery::Work { fraction } if fraction > 0.0 => Some((x / fraction).round()),
            _ => None,
        }
    }

    /// The epochs it declares (`run-job --epochs`): all of them, when its log says how far
    /// along it is.
    pub fn declared_epochs(&self) -> Option<f64> {
        self.epochs_at(1.0).filter(|_| self.reports_total)
    }

    /// The fraction of the training (the work after the start-up) that `done` work covers.
    pub fn training_fraction(&self, done: f64) -> f64 {
        let s = self.startup_work();
        ((done - s) / (self.work - s).max(1e-12)).clamp(0.0, 1.0)
    }

    /// Whether `done` work is still in the start-up (no log lines yet).
    pub fn starting(&self, done: f64) -> bool {
        done < self.startup_work()
    }

    /// Seconds the job takes alone on a node with `cores` cores.
    pub fn alone_seconds(&self, cores: f64) -> f64 {
        self.work / self.speed(cores)
    }

    /// A logged loss value at fraction `x` of the work, with this job's noise.
    pub fn logged_loss(&self, x: f64, rng: &mut impl Rng) -> f64 {
        let clean = self.loss.value(x);
        if self.noise <= 0.0 {
            return clean;
        }
        clean * (1.0 + self.noise * standard_normal(rng))
    }
}

/// A standard normal sample (Box-Muller), from any RNG.
pub fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speedups_are_continuous_at_one_core_and_sub_linear_above() {
        for s in [
            Speedup::Linear,
            Speedup::Amdahl {
                parallel_fraction: 0.9,
            },
            Speedup::Power { exponent: 0.7 },
        ] {
            assert_eq!(s.speed(0.5), 0.5, "{s:?}");
            assert!((s.speed(1.0) - 1.0).abs() < 1e-12, "{s:?}");
            assert!((s.speed(1.0 + 1e-9) - 1.0).abs() < 1e-6, "{s:?}");
            let mut last = 1.0;
            for c in 2..=16 {
                let v = s.speed(f64::from(c));
                assert!(v >= last, "{s:?} not monotonic at {c}");
                assert!(v <= f64::from(c) + 1e-12, "{s:?} super-linear at {c}");
                last = v;
            }
            assert_eq!(s.speed(0.0), 0.0);
            assert_eq!(s.speed(f64::NAN), 0.0);
        }
        // Amdahl with f = 0.9 on 4 cores: 1 / (0.1 + 0.225).
        let a = Speedup::Amdahl {
            parallel_fraction: 0.9,
        };
        assert!((a.speed(4.0) - 1.0 / 0.325).abs() < 1e-12);
    }

    #[test]
    fn parallelism_limits_the_speed() {
        let job = JobModel {
            id: "a".into(),
            submit: 0.0,
            work: 100.0,
            parallelism: 2.0,
            speedup: Speedup::Linear,
            loss: LossCurve::Points { points: vec![] },
            noise: 0.0,
            log_every: LogEvery::Work { fraction: 0.1 },
            reports_total: false,
            memory_bytes: 0,
            priority: 0,
            startup: 0.0,
            quiet: Vec::new(),
            finish: None,
            sweep: None,
        };
        assert_eq!(job.speed(8.0), 2.0);
        assert_eq!(job.alone_seconds(8.0), 50.0);
    }

    #[test]
    fn loss_curves_start_at_initial_and_approach_the_floor() {
        let e = LossCurve::Exponential {
            initial: 2.0,
            floor: 0.5,
            rate: 5.0,
        };
        assert_eq!(e.value(0.0), 2.0);
        assert!((e.value(1.0) - (0.5 + 1.5 * (-5.0f64).exp())).abs() < 1e-12);
        let p = LossCurve::PowerLaw {
            initial: 2.0,
            floor: 0.5,
            scale: 0.1,
            exponent: 1.0,
        };
        assert_eq!(p.value(0.0), 2.0);
        assert!((p.value(0.1) - 1.25).abs() < 1e-12);
        let pts = LossCurve::Points {
            points: vec![(0.0, 3.0), (0.5, 1.0), (1.0, 0.5)],
        };
        assert_eq!(pts.value(0.25), 2.0);
        assert_eq!(pts.value(2.0), 0.5);
        assert_eq!(
            LossCurve::Points {
                points: vec![(0.2, 1.0)]
            }
            .value(0.9),
            1.0
        );
    }

    #[test]
    fn noise_is_relative_and_seeded() {
        use rand::SeedableRng;
        let job = JobModel {
            id: "a".into(),
            submit: 0.0,
            work: 100.0,
            parallelism: 1.0,
            speedup: Speedup::Linear,
            loss: LossCurve::Points {
                points: vec![(0.0, 10.0)],
            },
            noise: 0.05,
            log_every: LogEvery::Work { fraction: 0.1 },
            reports_total: false,
            memory_bytes: 0,
            priority: 0,
            startup: 0.0,
            quiet: Vec::new(),
            finish: None,
            sweep: None,
        };
        let mut a = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut b = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let xs: Vec<f64> = (0..1000).map(|_| job.logged_loss(0.5, &mut a)).collect();
        let ys: Vec<f64> = (0..1000).map(|_| job.logged_loss(0.5, &mut b)).collect();
        assert_eq!(xs, ys, "same seed, same noise");
        let mean = xs.iter().sum::<f64>() / 1000.0;
        let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 1000.0).sqrt();
        assert!((mean - 10.0).abs() < 0.1, "mean {mean}");
        assert!((sd - 0.5).abs() < 0.05, "sd {sd}");
    }
}
