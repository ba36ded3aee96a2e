//! Progress-signal helpers shared by policies: smoothing noisy losses and normalising them so jobs
//! with different loss scales can be compared.
//!
//! A job's raw signal `E` can be a cross-entropy around 0.1 or a VAE reconstruction loss around
//! 100, and every logged value carries mini-batch noise of a few percent. [`LossTracker`] turns it
//! into a scale-free *stage*: the job's current rate of improvement (smoothed, per CPU-second,
//! relative to its initial value) divided by the best rate it has shown. A stage near 1 means the
//! job is learning as fast as it ever did; near 0, that it has stopped improving. The stage, not
//! the raw loss, is what two jobs can be compared on.

use super::{Category, Direction, Seconds};

/// Exponentially weighted moving average with smoothing factor `weight` for each new value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ewma {
    weight: f64,
    value: Option<f64>,
}

impl Ewma {
    /// `weight` in (0, 1]: 1 follows the input exactly, small values smooth more.
    pub fn new(weight: f64) -> Self {
        Ewma {
            weight: weight.clamp(f64::MIN_POSITIVE, 1.0),
            value: None,
        }
    }

    /// Fold in a new value (non-finite values are ignored) and return the average.
    pub fn push(&mut self, x: f64) -> Option<f64> {
        if x.is_finite() {
            self.value = Some(match self.value {
                None => x,
                Some(v) => v + self.weight * (x - v),
            });
        }
        self.value
    }

    pub fn value(&self) -> Option<f64> {
        self.value
    }

    pub fn reset(&mut self) {
        self.value = None;
    }
}

/// Stage thresholds of [`LossTracker::category`], with hysteresis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageThresholds {
    /// At or above this stage a job is progressing.
    pub progressing: f64,
    /// Below this stage a job has converged.
    pub converged: f64,
    /// A job leaves its category only when the stage crosses a threshold by this factor
    /// (e.g. 1.5: a converged job must reach 1.5 × `converged` to become watching again).
    pub hysteresis: f64,
    /// Observations needed before any judgement.
    pub min_points: u32,
}

impl Default for StageThresholds {
    fn default() -> Self {
        StageThresholds {
            progressing: 0.25,
            converged: 0.05,
            hysteresis: 1.5,
            min_points: 3,
        }
    }
}

/// Follows one job's progress signal: smoothed, normalised, staged.
#[derive(Clone, Debug)]
pub struct LossTracker {
    direction: Direction,
    smoothing: f64,
    thresholds: StageThresholds,
    /// First (smoothed) value of the current segment: the normalisation scale.
    initial: Option<f64>,
    smoothed: Ewma,
    /// (cpu seconds, normalised progress) at the previous observation.
    previous: Option<(f64, f64)>,
    rate: Ewma,
    peak_rate: f64,
    points: u32,
    category: Category,
    last_at: Option<Seconds>,
}

impl LossTracker {
    /// `smoothing` is the EWMA weight given to each new value (see [`Ewma::new`]).
    pub fn new(direction: Direction, smoothing: f64, thresholds: StageThresholds) -> Self {
        LossTracker {
            direction,
            smoothing,
            thresholds,
            initial: None,
            smoothed: Ewma::new(smoothing),
            previous: None,
            rate: Ewma::new(smoothing),
            peak_rate: 0.0,
            points: 0,
            category: Category::Unknown,
            last_at: None,
        }
    }

    /// Start over (a new run segment: the job restarted and its counters reset).
    pub fn restart(&mut self) {
        *self = LossTracker::new(self.direction, self.smoothing, self.thresholds);
    }

    /// Fold in one observed value at cumulative CPU time `cpu_seconds`.
    pub fn observe(&mut self, at: Seconds, value: f64, cpu_seconds: f64) {
        if !value.is_finite() {
            return;
        }
        let signed = match self.direction {
            Direction::Minimise => value,
            Direction::Maximise => -value,
        };
        let Some(smoothed) = self.smoothed.push(signed) else {
            return;
        };
        self.points += 1;
        self.last_at = Some(at);
        let initial = *self.initial.get_or_insert(smoothed);
        let scale = initial.abs().max(f64::MIN_POSITIVE);
        let progress = (initial - smoothed) / scale;
        if let Some((cpu0, progress0)) = self.previous {
            let cpu = cpu_seconds - cpu0;
            if cpu > 0.0 {
                // Not clipped at 0: noise must average out, not be rectified into progress.
                let rate = (progress - progress0) / cpu;
                if let Some(r) = self.rate.push(rate) {
                    self.peak_rate = self.peak_rate.max(r);
                }
                self.previous = Some((cpu_seconds, progress));
            }
        } else {
            self.previous = Some((cpu_seconds, progress));
        }
        self.update_category();
    }

    /// Fraction of the initial value removed so far (smoothed; 0 at start, towards 1 if the loss
    /// goes to 0). Comparable across loss scales.
    pub fn normalised_progress(&self) -> Option<f64> {
        let initial = self.initial?;
        let s = self.smoothed.value()?;
        Some((initial - s) / initial.abs().max(f64::MIN_POSITIVE))
    }

    /// Current improvement rate over the best rate seen, in [0, 1] (None until measured).
    pub fn stage(&self) -> Option<f64> {
        let r = self.rate.value()?;
        if self.peak_rate > 0.0 {
            Some((r / self.peak_rate).clamp(0.0, 1.0))
        } else {
            Some(0.0)
        }
    }

    /// When the latest value was observed.
    pub fn last_observed_at(&self) -> Option<Seconds> {
        self.last_at
    }

    /// The job's category, with hysteresis.
    pub fn category(&self) -> Category {
        self.category
    }

    fn update_category(&mut self) {
        let t = self.thresholds;
        let Some(stage) = self.stage() else { return };
        if self.points < t.min_points {
            return;
        }
        let h = t.hysteresis.max(1.0);
        self.category = match self.category {
            Category::Unknown => {
                if stage >= t.progressing {
                    Category::Progressing
                } else if stage < t.converged {
                    Category::Converged
                } else {
                    Category::Watching
                }
            }
            Category::Progressing => {
                if stage < t.converged {
                    Category::Converged
                } else if stage < t.progressing / h {
                    Category::Watching
                } else {
                    Category::Progressing
                }
            }
            Category::Watching => {
                if stage >= t.progressing * h {
                    Category::Progressing
                } else if stage < t.converged / h {
                    Category::Converged
                } else {
                    Category::Watching
                }
            }
            Category::Converged => {
                if stage >= t.progressing * h {
                    Category::Progressing
                } else if stage >= t.converged * h {
                    Category::Watching
                } else {
                    Category::Converged
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ewma_smooths_and_ignores_non_finite_values() {
        let mut e = Ewma::new(0.5);
        assert_eq!(e.value(), None);
        assert_eq!(e.push(10.0), Some(10.0));
        assert_eq!(e.push(20.0), Some(15.0));
        assert_eq!(e.push(f64::NAN), Some(15.0));
        e.reset();
        assert_eq!(e.push(1.0), Some(1.0));
    }

    fn feed(t: &mut LossTracker, values: &[f64]) {
        for (i, v) in values.iter().enumerate() {
            t.observe(i as f64, *v, i as f64 * 10.0);
        }
    }

    #[test]
    fn normalisation_makes_scales_comparable() {
        let mut small = LossTracker::new(Direction::Minimise, 1.0, StageThresholds::default());
        let mut large = LossTracker::new(Direction::Minimise, 1.0, StageThresholds::default());
        let curve: Vec<f64> = (0..20).map(|i| 1.0 + (-(i as f64) / 4.0).exp()).collect();
        feed(
            &mut small,
            &curve.iter().map(|v| v * 0.1).collect::<Vec<_>>(),
        );
        feed(
            &mut large,
            &curve.iter().map(|v| v * 100.0).collect::<Vec<_>>(),
        );
        let (a, b) = (
            small.normalised_progress().unwrap(),
            large.normalised_progress().unwrap(),
        );
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        let (a, b) = (small.stage().unwrap(), large.stage().unwrap());
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    }

    #[test]
    fn stage_falls_as_the_curve_flattens_and_categories_follow() {
        let mut t = LossTracker::new(Direction::Minimise, 1.0, StageThresholds::default());
        assert_eq!(t.category(), Category::Unknown);
        let curve: Vec<f64> = (0..40).map(|i| 1.0 + (-(i as f64) / 4.0).exp()).collect();
        let mut seen = Vec::new();
        for (i, v) in curve.iter().enumerate() {
            t.observe(i as f64, *v, i as f64 * 10.0);
            if seen.last() != Some(&t.category()) {
                seen.push(t.category());
            }
        }
        assert_eq!(
            seen,
            vec![
                Category::Unknown,
                Category::Progressing,
                Category::Watching,
                Category::Converged
            ]
        );
    }

    #[test]
    fn maximised_signals_progress_upwards() {
        let mut t = LossTracker::new(Direction::Maximise, 1.0, StageThresholds::default());
        feed(&mut t, &[0.1, 0.5, 0.7, 0.8]);
        assert!(t.normalised_progress().unwrap() > 0.0);
        assert_eq!(t.category(), Category::Progressing);
    }

    #[test]
    fn smoothing_damps_noise_in_the_stage() {
        // A real initial drop, then a flat loss with ±10% alternating noise. Unsmoothed, every
        // other step looks like progress at 40% of the initial rate; smoothed, the job is seen
        // to have converged.
        let mut values = vec![2.0, 1.5, 1.2];
        values.extend((0..60).map(|i| if i % 2 == 0 { 1.1 } else { 0.9 }));
        let stages = |smoothing: f64| {
            let mut t =
                LossTracker::new(Direction::Minimise, smoothing, StageThresholds::default());
            let stages: Vec<f64> = values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    t.observe(i as f64, *v, i as f64 * 10.0);
                    t.stage().unwrap_or(0.0)
                })
                .collect();
            (stages, t.category())
        };
        let (raw, _) = stages(1.0);
        assert!(
            raw.iter().skip(10).any(|s| *s >= 0.25),
            "noise looks like progress unsmoothed: {raw:?}"
        );
        let (smooth, category) = stages(0.2);
        assert!(
            smooth.iter().skip(40).all(|s| *s < 0.05),
            "smoothed stages: {smooth:?}"
        );
        assert_eq!(category, Category::Converged);
    }

    #[test]
    fn hysteresis_keeps_a_borderline_job_in_place() {
        let th = StageThresholds::default();
        let mut t = LossTracker::new(Direction::Minimise, 1.0, th);
        t.category = Category::Converged;
        t.points = 10;
        t.peak_rate = 1.0;
        t.rate = Ewma::new(1.0);
        // Just above the converged threshold but below 1.5x: stays converged.
        t.rate.push(0.06);
        t.update_category();
        assert_eq!(t.category(), Category::Converged);
        t.rate.push(0.08);
        t.update_category();
        assert_eq!(t.category(), Category::Watching);
        // Watching -> Progressing needs 1.5 × 0.25.
        t.rate.push(0.3);
        t.update_category();
        assert_eq!(t.category(), Category::Watching);
        t.rate.push(0.4);
        t.update_category();
        assert_eq!(t.category(), Category::Progressing);
        // Progressing -> Watching only below 0.25 / 1.5.
        t.rate.push(0.2);
        t.update_category();
        assert_eq!(t.category(), Category::Progressing);
        t.rate.push(0.1);
        t.update_category();
        assert_eq!(t.category(), Category::Watching);
        // Watching -> Converged only below 0.05 / 1.5.
        t.rate.push(0.04);
        t.update_category();
        assert_eq!(t.category(), Category::Watching);
        t.rate.push(0.02);
        t.update_category();
        assert_eq!(t.category(), Category::Converged);
    }

    #[test]
    fn restart_forgets_the_previous_segment() {
        let mut t = LossTracker::new(Direction::Minimise, 1.0, StageThresholds::default());
        feed(&mut t, &[2.0, 1.0, 0.5, 0.4]);
        t.restart();
        assert_eq!(t.normalised_progress(), None);
        assert_eq!(t.category(), Category::Unknown);
    }
}
