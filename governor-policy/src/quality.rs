//! Time to quality: when a job has learnt what it will learn.
//!
//! A job's *time to quality* is the time from its submission until its quality signal (the
//! validation loss where its log has one, else its training loss) first comes within
//! [`QUALITY_FRACTION`] (5%) of its total reduction, the reduction from its first value to the
//! best value of the whole run. Users launch many trials and care about when each has reached
//! the loss it will reach, not only when its fixed number of epochs ends; a job that has reached
//! quality and keeps training is doing work nobody will use.
//!
//! The definition needs the whole run (the best value is only known at the end), so it is
//! computed after the fact for benchmarks and the simulator ([`time_to_quality`]). While a job
//! runs, [`QualityTracker`] gives the same figure *so far* (against the best value seen so far):
//! it can only move later as the job improves further, and equals the final figure once the job
//! has reached its best. It keeps only the record values (each new best), so its memory is
//! bounded by how often a job improves, not by how long it runs.

use serde::{Deserialize, Serialize};

use crate::{Direction, Seconds};

/// Within 5% of the total reduction counts as "learnt what it will learn".
pub const QUALITY_FRACTION: f64 = 0.05;

/// A new best is kept as a record only when it improves on the last one by more than this
/// fraction of the reduction so far: it bounds the records of a job that improves by tiny steps
/// at every logged step (the answer moves by less than the fraction's own resolution).
const RECORD_RESOLUTION: f64 = 0.001;

/// Online time to quality of one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QualityTracker {
    direction: Direction,
    /// (time, value) of the first value and of each new best, in time order; values strictly
    /// improving.
    records: Vec<(Seconds, f64)>,
}

impl QualityTracker {
    pub fn new(direction: Direction) -> Self {
        QualityTracker {
            direction,
            records: Vec::new(),
        }
    }

    /// A finite value of the quality signal at time `at` (non-finite values are ignored).
    pub fn observe(&mut self, at: Seconds, value: f64) {
        if !value.is_finite() {
            return;
        }
        let better = |a: f64, b: f64| match self.direction {
            Direction::Minimise => a < b,
            Direction::Maximise => a > b,
        };
        match self.records.last() {
            None => self.records.push((at, value)),
            Some(&(_, best)) if better(value, best) => {
                let first = self.records[0].1;
                let step = (best - value).abs();
                let reduction = (first - value).abs();
                if self.records.len() > 1 && step <= RECORD_RESOLUTION * reduction {
                    // Too small to change the answer: move the last record's value, keep its
                    // time (it was reached then, within the resolution).
                    let last = self.records.len() - 1;
                    self.records[last].1 = value;
                } else {
                    self.records.push((at, value));
                }
            }
            Some(_) => {}
        }
    }

    /// The first value seen.
    pub fn first(&self) -> Option<f64> {
        self.records.first().map(|r| r.1)
    }

    /// The best value seen.
    pub fn best(&self) -> Option<f64> {
        self.records.last().map(|r| r.1)
    }

    /// When the signal first came within [`QUALITY_FRACTION`] of the reduction seen so far
    /// (the caller's clock; `None` before the first value). A job that never improved reached
    /// quality with its first value.
    pub fn reached_at(&self) -> Option<Seconds> {
        let (&(first_at, first), &(_, best)) = (self.records.first()?, self.records.last()?);
        let threshold = best + QUALITY_FRACTION * (first - best);
        let within = |v: f64| match self.direction {
            Direction::Minimise => v <= threshold,
            Direction::Maximise => v >= threshold,
        };
        Some(
            self.records
                .iter()
                .find(|(_, v)| within(*v))
                .map_or(first_at, |r| r.0),
        )
    }

    /// Records kept (for tests of the memory bound).
    pub fn records(&self) -> usize {
        self.records.len()
    }
}

/// Time to quality of a whole run: `points` are (time since submission, value) in time order.
/// `None` when no value is finite.
pub fn time_to_quality(points: &[(Seconds, f64)], direction: Direction) -> Option<Seconds> {
    let mut t = QualityTracker::new(direction);
    for &(at, v) in points {
        t.observe(at, v);
    }
    t.reached_at()
}

/// When a job that asked to finish at convergence has converged: like Keras `EarlyStopping`,
/// after `patience` values of its quality signal in a row without a new best by more than
/// `min_delta` (absolute, in the signal's units). Opt-in per job; the daemon then stops the job
/// gracefully.
///
/// With `predict` (`PATIENCE:MIN_DELTA:predict`), a job whose size is known (its log says
/// `epoch k/N`, or it declared its epochs) is stopped instead when the learning-curve predictor
/// ([`crate::predict`], the power law the default node policy uses) says, with
/// [`PREDICT_CONFIDENCE`] standard deviations to spare, that the rest of its run would improve
/// its best value by less than `min_delta`, and so does its latest slope carried to the end (a
/// curve still falling straight fits a power law about to flatten as tightly); `patience` is then the least number of values
/// before it may judge. A job of unknown size follows the patience rule.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinishRule {
    /// Values in a row without improvement before the job counts as converged.
    pub patience: u32,
    /// The least change that counts as an improvement.
    pub min_delta: f64,
    /// Judge by the predicted rest of the run where the job's size is known.
    #[serde(default)]
    pub predict: bool,
}

/// Standard deviations of the predicted final value a predicted stop must withstand.
pub const PREDICT_CONFIDENCE: f64 = 2.0;

/// A predicted stop needs the values to span this much of the run.
pub const PREDICT_MIN_SPAN: f64 = 0.1;

/// Values of a curve kept for prediction (every other one is dropped beyond it).
const PREDICT_MAX_POINTS: usize = 512;

impl FinishRule {
    /// Parse `PATIENCE[:MIN_DELTA[:predict]]`, the one syntax of a finish rule
    /// (`GOVERNOR_FINISH`, `run-job --finish`, a job file's `finish`, `govctl submit --finish`,
    /// bench-real's `+finish=`): a whole PATIENCE >= 1 and a MIN_DELTA >= 0 (0 when left out);
    /// `predict` judges by the predicted rest of the run.
    pub fn parse(s: &str) -> Option<FinishRule> {
        let (s, predict) = match s.trim().strip_suffix(":predict") {
            Some(rest) => (rest, true),
            None => (s.trim(), false),
        };
        let (p, d) = match s.trim().split_once(':') {
            Some((p, d)) => (p, Some(d)),
            None => (s.trim(), None),
        };
        let patience: u32 = p.trim().parse().ok()?;
        let min_delta: f64 = match d {
            Some(d) => d.trim().parse().ok()?,
            None => 0.0,
        };
        (patience > 0 && min_delta.is_finite() && min_delta >= 0.0).then_some(FinishRule {
            patience,
            min_delta,
            predict,
        })
    }
}

impl std::fmt::Display for FinishRule {
    /// The syntax [`FinishRule::parse`] reads.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.patience, self.min_delta)?;
        if self.predict {
            f.write_str(":predict")?;
        }
        Ok(())
    }
}

/// Follows one job's quality signal against its [`FinishRule`].
#[derive(Clone, Debug, PartialEq)]
pub struct EarlyStop {
    rule: FinishRule,
    direction: Direction,
    best: Option<f64>,
    since_best: u32,
    /// (fraction of the run, value signed so that smaller is better) of the values whose place
    /// in the run is known (with `predict`), thinned to [`PREDICT_MAX_POINTS`].
    curve: Vec<(f64, f64)>,
    /// Values seen.
    seen: u32,
    /// The predicted rule fired.
    predicted_stop: bool,
}

impl EarlyStop {
    /// The rule followed.
    pub fn rule(&self) -> FinishRule {
        self.rule
    }

    pub fn new(rule: FinishRule, direction: Direction) -> Self {
        EarlyStop {
            rule,
            direction,
            best: None,
            since_best: 0,
            curve: Vec::new(),
            seen: 0,
            predicted_stop: false,
        }
    }

    /// One value (non-finite ones are ignored); returns true once the job has converged (and
    /// from then on).
    pub fn observe(&mut self, value: f64) -> bool {
        self.observe_at(value, None)
    }

    /// One value at `fraction` of the job's run where its size is known: with `predict`, the
    /// predicted rule judges (see [`FinishRule`]); returns true once the job has converged.
    pub fn observe_at(&mut self, value: f64, fraction: Option<f64>) -> bool {
        if !value.is_finite() || self.converged() {
            return self.converged();
        }
        self.seen = self.seen.saturating_add(1);
        let signed = match self.direction {
            Direction::Minimise => value,
            Direction::Maximise => -value,
        };
        if self.rule.predict
            && let Some(f) = fraction.filter(|f| f.is_finite() && *f > 0.0)
        {
            if self.curve.last().is_some_and(|p| f < p.0 - 1e-9) {
                // Its counters went back: a new run, judged afresh.
                self.curve.clear();
            }
            self.curve.push((f.min(1.0), signed));
            crate::predict::thin(&mut self.curve, PREDICT_MAX_POINTS);
            self.predicted_stop = self.little_left();
        }
        let improved = match self.best {
            None => true,
            Some(best) => match self.direction {
                Direction::Minimise => value < best - self.rule.min_delta,
                Direction::Maximise => value > best + self.rule.min_delta,
            },
        };
        if improved {
            self.best = Some(value);
            self.since_best = 0;
        } else if !self.converged() {
            self.since_best += 1;
        }
        self.converged()
    }

    /// The rule has been met: the predicted rule where it judges (`predict` and the job's size
    /// known), the patience rule otherwise.
    pub fn converged(&self) -> bool {
        if self.rule.predict && !self.curve.is_empty() {
            return self.predicted_stop;
        }
        self.rule.patience > 0 && self.since_best >= self.rule.patience
    }

    /// Whether the rest of the run is predicted, with [`PREDICT_CONFIDENCE`] deviations to
    /// spare, to improve the best value by less than `min_delta`.
    fn little_left(&self) -> bool {
        let n = self.curve.len();
        let span = self.curve[n - 1].0 - self.curve[0].0;
        if self.seen < self.rule.patience.max(4) || n < 4 || span < PREDICT_MIN_SPAN {
            return false;
        }
        use crate::predict::{Method, predict_with};
        let Some(p) = predict_with(Method::PowerLaw, &self.curve, 1.0) else {
            return false;
        };
        // A curve still falling straight fits a power law about to flatten just as well (and
        // as tightly): the run's latest slope, carried to its end, must agree.
        let Some(slope) = predict_with(Method::LastSlope, &self.curve, 1.0) else {
            return false;
        };
        let best = self.curve.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
        // The fit's residual is the noise of one value; its asymptote, fitted to all of them,
        // is known to about that over the square root of their number.
        let uncertainty = p.spread / (n as f64).sqrt();
        let lowest = (p.final_value - PREDICT_CONFIDENCE * uncertainty).min(slope.final_value);
        best - lowest < self.rule.min_delta
    }

    /// The best value seen.
    pub fn best(&self) -> Option<f64> {
        self.best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quality_is_reached_within_five_percent_of_the_total_reduction() {
        // 1.0 -> 0.1: the threshold is 0.1 + 0.05 * 0.9 = 0.145.
        let pts = [
            (1.0, 1.0),
            (2.0, 0.5),
            (3.0, 0.2),
            (4.0, 0.14),
            (5.0, 0.12),
            (6.0, 0.1),
        ];
        assert_eq!(time_to_quality(&pts, Direction::Minimise), Some(4.0));
        // Noise above the best after it was reached changes nothing.
        let mut noisy = pts.to_vec();
        noisy.push((7.0, 0.3));
        assert_eq!(time_to_quality(&noisy, Direction::Minimise), Some(4.0));
    }

    #[test]
    fn accuracy_like_signals_count_upwards() {
        let pts = [(0.0, 0.1), (1.0, 0.8), (2.0, 0.95), (3.0, 0.96)];
        // 0.1 -> 0.96: threshold 0.96 - 0.05 * 0.86 = 0.917.
        assert_eq!(time_to_quality(&pts, Direction::Maximise), Some(2.0));
    }

    #[test]
    fn online_figure_moves_later_as_the_job_improves_and_ends_at_the_final_one() {
        let mut t = QualityTracker::new(Direction::Minimise);
        assert_eq!(t.reached_at(), None);
        t.observe(0.0, 2.0);
        assert_eq!(
            t.reached_at(),
            Some(0.0),
            "no reduction yet: its first value"
        );
        t.observe(1.0, 1.0);
        assert_eq!(t.reached_at(), Some(1.0));
        t.observe(2.0, 0.5);
        t.observe(3.0, f64::NAN);
        assert_eq!(t.reached_at(), Some(2.0));
        t.observe(4.0, 0.45);
        // 2.0 -> 0.45: threshold 0.5275; 0.5 at t=2 is within it.
        assert_eq!(t.reached_at(), Some(2.0));
        t.observe(5.0, 0.1);
        assert_eq!(t.reached_at(), Some(5.0));
    }

    #[test]
    fn tiny_steps_keep_the_record_list_short() {
        let mut t = QualityTracker::new(Direction::Minimise);
        // 100,000 steps improving by a hair each after a big drop.
        t.observe(0.0, 10.0);
        t.observe(1.0, 1.0);
        for i in 0..100_000 {
            t.observe(2.0 + i as f64, 1.0 - 1e-9 * i as f64);
        }
        assert!(t.records() < 10, "{} records", t.records());
        assert_eq!(t.reached_at(), Some(1.0));
    }

    #[test]
    fn early_stop_waits_for_patience_values_without_a_real_improvement() {
        let rule = FinishRule {
            patience: 3,
            min_delta: 0.01,
            predict: false,
        };
        let mut e = EarlyStop::new(rule, Direction::Minimise);
        for v in [1.0, 0.5, 0.3] {
            assert!(!e.observe(v));
        }
        // Improvements smaller than min_delta do not reset the count.
        assert!(!e.observe(0.295));
        assert!(!e.observe(f64::NAN));
        assert!(!e.observe(0.31));
        assert!(e.observe(0.299), "three values without a 0.01 improvement");
        assert_eq!(e.best(), Some(0.3));
        // Once converged it stays so.
        assert!(e.observe(0.1));
    }

    #[test]
    fn a_predicted_stop_waits_for_the_rest_of_the_run_not_for_patience() {
        let rule = FinishRule::parse("5:0.015:predict").unwrap();
        assert!(rule.predict);
        assert_eq!(rule.to_string(), "5:0.015:predict");
        assert_eq!(FinishRule::parse(&rule.to_string()), Some(rule));
        // A loss falling 0.002 an epoch of 40, steadily: five values improve by less than
        // min_delta, so patience stops it, but the 20 epochs left take it 0.04 lower.
        let straight = |k: u32| 2.0 - 0.002 * f64::from(k);
        let mut patient = EarlyStop::new(
            FinishRule {
                predict: false,
                ..rule
            },
            Direction::Minimise,
        );
        let mut predicted = EarlyStop::new(rule, Direction::Minimise);
        let mut patience_stopped_at = None;
        for k in 1..=20 {
            let f = f64::from(k) / 40.0;
            if patient.observe_at(straight(k), Some(f)) && patience_stopped_at.is_none() {
                patience_stopped_at = Some(k);
            }
            assert!(
                !predicted.observe_at(straight(k), Some(f)),
                "stopped at epoch {k} with 0.04 still to come"
            );
        }
        assert_eq!(patience_stopped_at, Some(6));
        // A loss that has flattened (a power law in epochs): stopped once the rest of the run
        // cannot add min_delta, well before its end.
        let flattening = |k: u32| 0.1 + 2.0 * f64::from(k + 1).powi(-3);
        let mut predicted = EarlyStop::new(rule, Direction::Minimise);
        let stopped_at =
            (1..=40).find(|&k| predicted.observe_at(flattening(k), Some(f64::from(k) / 40.0)));
        assert!(
            stopped_at.is_some_and(|k| (5..=12).contains(&k)),
            "stopped at {stopped_at:?}"
        );
        assert!(predicted.converged(), "it stays stopped");
    }

    #[test]
    fn a_predicted_rule_without_the_jobs_size_follows_patience() {
        let mut e = EarlyStop::new(
            FinishRule::parse("3:0.01:predict").unwrap(),
            Direction::Minimise,
        );
        for v in [1.0, 0.5, 0.3, 0.299, 0.298] {
            assert!(!e.observe(v));
        }
        assert!(e.observe(0.297), "three values without a 0.01 improvement");
    }
}
