//! Learning a job's size and speed-up curve online, from nothing but its reported position
//! ("epoch k/N") and the CPU time it used.
//!
//! Model: Amdahl's law with the job's own parallel fraction `f`, linear below one core (time
//! slicing): the job's speed on `c` cores, in *work units* (seconds of the job alone on one core)
//! per second, is `s(c) = c` for `c ≤ 1` and `s(c) = 1 / ((1 - f) + f / c)` above. A job of
//! size `W` work units therefore advances its fraction done at `s(c) / W` per second.
//!
//! Each pair of consecutive reports gives one observation: the mean cores `c̄ = Δcpu / Δt` and
//! the fraction rate `r = Δfraction / Δt`. For a candidate `f`, each observation implies a size
//! `W_i = s(c̄_i) / r_i`; the fit picks the `f` (on a grid of 0.01 in `[0.5, 1]`) that makes
//! the implied sizes agree best (least squares on `ln W_i`, plus a small pull towards the prior
//! `f = 0.9` that only matters when every observation was made at the same core count, where `f`
//! cannot be identified), and `W` as their weighted geometric mean. Recent observations weigh
//! more (each older one counts 0.9 times the next), so a job whose behaviour changes is followed.
//!
//! Why not CPU-seconds: with sub-linear scaling a job spends more CPU per unit of work the more
//! cores it gets, so "CPU-seconds left" depends on the allocation history and ranks jobs wrongly.
//! Work units do not.

/// The parallel fraction assumed before the data can tell.
pub const PRIOR_PARALLEL_FRACTION: f64 = 0.9;

/// Most observations kept per job.
const MAX_POINTS: usize = 32;

/// Speed in work units per second on `cores` cores for parallel fraction `f`.
pub fn amdahl_speed(cores: f64, f: f64) -> f64 {
    if cores.is_nan() || cores <= 0.0 {
        return 0.0;
    }
    if cores <= 1.0 {
        return cores;
    }
    let f = f.clamp(0.0, 1.0);
    1.0 / ((1.0 - f) + f / cores)
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Observation {
    cores: f64,
    rate: f64,
}

/// Online estimate of one job's size and speed-up.
#[derive(Clone, Debug, Default)]
pub struct SpeedupFit {
    last: Option<(f64, f64, f64)>,
    points: Vec<Observation>,
    fit: Option<(f64, f64)>,
    fraction: f64,
}

impl SpeedupFit {
    pub fn new() -> Self {
        Self::default()
    }

    /// A report: the job has done `fraction` of its work at time `at`, having used
    /// `cpu_seconds` so far. `started` is when it started (fraction 0, cpu 0).
    pub fn report(&mut self, started: f64, at: f64, fraction: f64, cpu_seconds: f64) {
        if !(fraction.is_finite() && (0.0..=1.0).contains(&fraction) && at.is_finite()) {
            return;
        }
        let (t0, f0, c0) = self.last.unwrap_or((started, 0.0, 0.0));
        let (dt, df, dc) = (at - t0, fraction - f0, cpu_seconds - c0);
        if fraction < f0 {
            // The position went backwards: a restart. Start the series over, keep nothing.
            *self = SpeedupFit::new();
            self.last = Some((at, fraction, cpu_seconds));
            self.fraction = fraction;
            return;
        }
        self.fraction = fraction;
        if dt <= 1e-6 || df <= 0.0 || dc <= 0.0 {
            // Nothing measurable yet (same instant, no progress, or no CPU accounted): keep the
            // older anchor so the next observation spans the whole interval.
            return;
        }
        self.points.push(Observation {
            cores: dc / dt,
            rate: df / dt,
        });
        if self.points.len() > MAX_POINTS {
            self.points.remove(0);
        }
        self.last = Some((at, fraction, cpu_seconds));
        self.fit = Some(fit(&self.points));
    }

    /// Latest reported fraction done.
    pub fn fraction(&self) -> f64 {
        self.fraction
    }

    /// Estimated size in work units (seconds alone on one core), once observed.
    pub fn size(&self) -> Option<f64> {
        self.fit.map(|(w, _)| w)
    }

    /// Estimated parallel fraction, once observed.
    pub fn parallel_fraction(&self) -> Option<f64> {
        self.fit.map(|(_, f)| f)
    }

    /// Estimated work units left.
    pub fn remaining(&self) -> Option<f64> {
        self.size().map(|w| w * (1.0 - self.fraction).max(0.0))
    }

    /// Work units per second on `cores` cores (prior `f` when not fitted).
    pub fn speed(&self, cores: f64) -> f64 {
        amdahl_speed(
            cores,
            self.parallel_fraction().unwrap_or(PRIOR_PARALLEL_FRACTION),
        )
    }
}

fn fit(points: &[Observation]) -> (f64, f64) {
    let n = points.len();
    let weights: Vec<f64> = (0..n).map(|i| 0.9f64.powi((n - 1 - i) as i32)).collect();
    let total_weight: f64 = weights.iter().sum();
    let mut best = (f64::INFINITY, PRIOR_PARALLEL_FRACTION, 0.0);
    for step in 0..=50 {
        let f = 0.5 + 0.01 * f64::from(step);
        let logs: Vec<f64> = points
            .iter()
            .map(|p| (amdahl_speed(p.cores, f) / p.rate).ln())
            .collect();
        let mean = logs.iter().zip(&weights).map(|(l, w)| l * w).sum::<f64>() / total_weight;
        let spread = logs
            .iter()
            .zip(&weights)
            .map(|(l, w)| w * (l - mean).powi(2))
            .sum::<f64>()
            / total_weight;
        let cost = spread + 1e-4 * (f - PRIOR_PARALLEL_FRACTION).powi(2);
        if cost < best.0 - 1e-15 {
            best = (cost, f, mean);
        }
    }
    (best.2.exp(), best.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reports of a job of `size` work units with parallel fraction `f`, run on each of
    /// `cores` in turn for `seconds` each.
    fn drive(size: f64, f: f64, schedule: &[(f64, f64)]) -> SpeedupFit {
        let mut fit = SpeedupFit::new();
        let (mut t, mut done, mut cpu) = (0.0, 0.0, 0.0);
        for &(cores, seconds) in schedule {
            t += seconds;
            done += amdahl_speed(cores, f) * seconds / size;
            cpu += cores * seconds;
            fit.report(0.0, t, done, cpu);
        }
        fit
    }

    #[test]
    fn amdahl_speed_is_linear_below_one_core() {
        assert_eq!(amdahl_speed(0.5, 0.9), 0.5);
        assert!((amdahl_speed(4.0, 0.9) - 1.0 / 0.325).abs() < 1e-12);
        assert_eq!(amdahl_speed(0.0, 0.9), 0.0);
        assert_eq!(amdahl_speed(f64::NAN, 0.9), 0.0);
        assert_eq!(amdahl_speed(8.0, 1.0), 8.0);
    }

    #[test]
    fn size_and_parallel_fraction_are_recovered_from_varied_allocations() {
        let fit = drive(
            1200.0,
            0.8,
            &[
                (1.0, 30.0),
                (4.0, 30.0),
                (2.0, 30.0),
                (8.0, 30.0),
                (0.5, 30.0),
            ],
        );
        let f = fit.parallel_fraction().unwrap();
        assert!((f - 0.8).abs() < 0.011, "f {f}");
        let w = fit.size().unwrap();
        assert!((w - 1200.0).abs() / 1200.0 < 0.02, "size {w}");
        let done = fit.fraction();
        assert!((fit.remaining().unwrap() - 1200.0 * (1.0 - done)).abs() < 30.0);
    }

    #[test]
    fn a_single_core_count_gives_the_size_with_the_prior_curve() {
        // Always below one core: speed is linear whatever f is, so the size is exact.
        let fit = drive(600.0, 0.7, &[(0.5, 20.0), (0.5, 20.0), (0.5, 20.0)]);
        assert!((fit.size().unwrap() - 600.0).abs() < 1e-6);
        assert!((fit.parallel_fraction().unwrap() - PRIOR_PARALLEL_FRACTION).abs() < 0.011);
    }

    #[test]
    fn nothing_is_known_before_two_reports_span_some_cpu() {
        let mut fit = SpeedupFit::new();
        assert_eq!(fit.size(), None);
        assert_eq!(fit.speed(4.0), amdahl_speed(4.0, PRIOR_PARALLEL_FRACTION));
        fit.report(0.0, 0.0, 0.0, 0.0);
        assert_eq!(fit.size(), None);
        fit.report(0.0, 10.0, 0.1, 10.0);
        assert!((fit.size().unwrap() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_position_going_backwards_restarts_the_series() {
        let mut fit = drive(100.0, 0.9, &[(1.0, 10.0), (1.0, 10.0)]);
        assert!(fit.size().is_some());
        fit.report(0.0, 30.0, 0.05, 25.0);
        assert_eq!(fit.size(), None);
        assert_eq!(fit.fraction(), 0.05);
        fit.report(0.0, 40.0, 0.15, 35.0);
        assert!((fit.size().unwrap() - 100.0).abs() < 1e-9);
    }

    #[test]
    fn bad_reports_are_ignored() {
        let mut fit = drive(100.0, 0.9, &[(1.0, 10.0)]);
        let before = fit.size();
        fit.report(0.0, 20.0, f64::NAN, 20.0);
        fit.report(0.0, 20.0, 1.5, 20.0);
        fit.report(0.0, f64::INFINITY, 0.2, 20.0);
        assert_eq!(fit.size(), before);
    }
}
