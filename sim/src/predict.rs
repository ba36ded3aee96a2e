//! `govsim predict`: how well each learning-curve predictor
//! ([`governor_policy::predict`]) foresees a run from its start, on the real curves of the
//! fixtures. For each curve and each share of it seen (25%, 50%, 75% of the run), each method
//! predicts the final loss and the quality point (where the run first comes within 5% of its
//! whole reduction, [`governor_policy::quality::time_to_quality`] on the whole curve); the
//! errors are reported as medians and 90th percentiles over the curves: the quality point's in
//! shares of the run, the final loss's in shares of the curve's whole reduction.

use std::path::Path;

use anyhow::{Context, Result};
use governor_policy::Direction;
use governor_policy::learning_first::{LearningFirstParams, judged_learnt};
use governor_policy::predict::{Method, predict, predict_with};
use governor_policy::quality::time_to_quality;
use serde::Serialize;

use crate::curves::{RealCurve, load_dir};

/// The shares of a run seen before predicting.
pub const SEEN: [f64; 3] = [0.25, 0.5, 0.75];

/// One method's errors at one share seen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorRow {
    pub method: String,
    pub seen: f64,
    /// Curves it predicted (some methods decline a curve).
    pub curves: usize,
    /// |predicted − true| quality point, in shares of the run: median and 90th percentile.
    pub quality_median: f64,
    pub quality_p90: f64,
    /// |predicted − true| final loss over the curve's whole reduction: median and p90.
    pub final_median: f64,
    pub final_p90: f64,
}

/// The errors of every method (and the ensemble, `best fit`) on `curves`.
pub fn evaluate(curves: &[RealCurve]) -> Vec<ErrorRow> {
    let mut rows = Vec::new();
    let methods: Vec<Option<Method>> = std::iter::once(None)
        .chain(Method::ALL.into_iter().map(Some))
        .collect();
    for &seen in &SEEN {
        for &method in &methods {
            let (mut quality, mut fin) = (Vec::new(), Vec::new());
            for c in curves {
                let Some(truth) = Truth::of(c) else {
                    continue;
                };
                let known: Vec<(f64, f64)> =
                    c.points.iter().copied().filter(|p| p.0 <= seen).collect();
                let p = match method {
                    None => predict(&known, 1.0),
                    Some(m) => predict_with(m, &known, 1.0),
                };
                let Some(p) = p else { continue };
                quality.push((p.quality_at.unwrap_or(1.0) - truth.quality_at).abs());
                fin.push((p.final_value - truth.final_value).abs() / truth.reduction);
            }
            rows.push(ErrorRow {
                method: method
                    .map_or("best fit (ensemble)", Method::name)
                    .to_owned(),
                seen,
                curves: quality.len(),
                quality_median: percentile(&mut quality, 0.5),
                quality_p90: percentile(&mut quality, 0.9),
                final_median: percentile(&mut fin, 0.5),
                final_p90: percentile(&mut fin, 0.9),
            });
        }
    }
    rows
}

/// How one verdict rule ("past its quality point", as `learning-first` judges it) fares on the
/// curves, walking each curve point by point as a job would log it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VerdictRow {
    pub method: String,
    pub confidence: f64,
    pub curves: usize,
    /// Curves on which it fired before the true quality point (a job sent back too early).
    pub early: usize,
    /// Median of how early, over those, in shares of the run.
    pub early_median: f64,
    /// Curves on which it fired at or after the true quality point.
    pub late: usize,
    /// Median delay after the true quality point, in shares of the run, over those.
    pub late_median: f64,
    /// Curves on which it never fired.
    pub never: usize,
}

/// Confidences compared (the policy's default is among them).
pub const CONFIDENCES: [f64; 3] = [0.0, 1.0, 2.0];

/// Every verdict rule's record on `curves`: the policy's own rule ([`judged_learnt`]) with each
/// predictor and confidence, its other thresholds at their defaults.
pub fn verdicts(curves: &[RealCurve]) -> Vec<VerdictRow> {
    let methods = [None, Some(Method::PowerLaw), Some(Method::Exponential)];
    let mut rows = Vec::new();
    for &method in &methods {
        for &confidence in &CONFIDENCES {
            let (mut early, mut late, mut never, mut n) = (Vec::new(), Vec::new(), 0, 0);
            for c in curves {
                let Some(truth) = Truth::of(c) else {
                    continue;
                };
                n += 1;
                let params = LearningFirstParams {
                    confidence,
                    predictor: method,
                    ..LearningFirstParams::default()
                };
                let fired = (1..=c.points.len()).find_map(|k| {
                    let seen = &c.points[..k];
                    judged_learnt(seen, &params).map(|_| seen[k - 1].0)
                });
                match fired {
                    Some(x) if x < truth.quality_at - 1e-9 => early.push(truth.quality_at - x),
                    Some(x) => late.push(x - truth.quality_at),
                    None => never += 1,
                }
            }
            rows.push(VerdictRow {
                method: method
                    .map_or("best fit (ensemble)", Method::name)
                    .to_owned(),
                confidence,
                curves: n,
                early: early.len(),
                early_median: percentile(&mut early, 0.5),
                late: late.len(),
                late_median: percentile(&mut late, 0.5),
                never,
            });
        }
    }
    rows
}

/// What a whole curve did.
struct Truth {
    final_value: f64,
    quality_at: f64,
    reduction: f64,
}

impl Truth {
    fn of(c: &RealCurve) -> Option<Truth> {
        let first = c.points.first()?.1;
        let final_value = c.points.last()?.1;
        let reduction = first - final_value;
        // Curves that do not fall (or barely) have no quality point worth predicting.
        if reduction.is_nan() || reduction <= 1e-9 * first.abs().max(1.0) || c.points.len() < 8 {
            return None;
        }
        let quality_at = time_to_quality(&c.points, Direction::Minimise)?;
        Some(Truth {
            final_value,
            quality_at,
            reduction,
        })
    }
}

fn percentile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

/// `govsim predict`: the table for the curves under `logs`.
pub fn command(logs: &Path, json: bool) -> Result<()> {
    let (curves, _) =
        load_dir(logs).with_context(|| format!("cannot read logs in {}", logs.display()))?;
    let rows = evaluate(&curves);
    let verdict_rows = verdicts(&curves);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "errors": rows,
                "verdicts": verdict_rows,
            }))?
        );
        return Ok(());
    }
    println!(
        "Learning-curve prediction on {} real curves from {} (errors: quality point in shares of the run, final loss in shares of the whole reduction)\n",
        curves.len(),
        logs.display()
    );
    println!("| seen | method | curves | quality point: median / p90 | final loss: median / p90 |");
    println!("| --- | --- | ---: | --- | --- |");
    for r in rows {
        println!(
            "| {:.0}% | {} | {} | {:.3} / {:.3} | {:.1}% / {:.1}% |",
            100.0 * r.seen,
            r.method,
            r.curves,
            r.quality_median,
            r.quality_p90,
            100.0 * r.final_median,
            100.0 * r.final_p90
        );
    }
    println!(
        "\nThe verdict \"past its quality point\" (`learning-first`), walking each curve value by value: fired before the true point (too early), at or after it (delay), never\n"
    );
    println!(
        "| method | confidence | curves | too early: curves, median by | after: curves, median delay | never |"
    );
    println!("| --- | ---: | ---: | --- | --- | ---: |");
    for r in verdict_rows {
        println!(
            "| {} | {} | {} | {}, {:.3} | {}, {:.3} | {} |",
            r.method,
            r.confidence,
            r.curves,
            r.early,
            r.early_median,
            r.late,
            r.late_median,
            r.never
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(points: Vec<(f64, f64)>) -> RealCurve {
        RealCurve {
            source: "test".into(),
            format: "test".into(),
            metric: "loss".into(),
            logged_values: points.len(),
            points,
        }
    }

    #[test]
    fn an_exponential_run_is_foreseen_from_its_first_quarter() {
        let points: Vec<(f64, f64)> = (0..=40)
            .map(|i| {
                let x = f64::from(i) / 40.0;
                (x, 0.2 + 2.0 * (-8.0 * x).exp())
            })
            .collect();
        let rows = evaluate(&[curve(points)]);
        let row = rows
            .iter()
            .find(|r| r.method == "exponential" && r.seen == 0.25)
            .unwrap();
        assert_eq!(row.curves, 1);
        assert!(row.quality_median < 0.03, "{row:?}");
        assert!(row.final_median < 0.02, "{row:?}");
    }
}
