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
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinishRule {
    /// Values in a row without improvement before the job counts as converged.
    pub patience: u32,
    /// The least change that counts as an improvement.
    pub min_delta: f64,
}

impl FinishRule {
    /// Parse `PATIENCE[:MIN_DELTA]`, the one syntax of a finish rule (`GOVERNOR_FINISH`,
    /// `run-job --finish`, a job file's `finish`, `govctl submit --finish`, bench-real's
    /// `+finish=`): a whole PATIENCE >= 1 and a MIN_DELTA >= 0 (0 when left out).
    pub fn parse(s: &str) -> Option<FinishRule> {
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
        })
    }
}

/// Follows one job's quality signal against its [`FinishRule`].
#[derive(Clone, Debug, PartialEq)]
pub struct EarlyStop {
    rule: FinishRule,
    direction: Direction,
    best: Option<f64>,
    since_best: u32,
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
        }
    }

    /// One value (non-finite ones are ignored); returns true once the job has converged (and
    /// from then on).
    pub fn observe(&mut self, value: f64) -> bool {
        if !value.is_finite() || self.converged() {
            return self.converged();
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

    /// The rule has been met.
    pub fn converged(&self) -> bool {
        self.rule.patience > 0 && self.since_best >= self.rule.patience
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
}
