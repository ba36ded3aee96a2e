//! Learning-curve prediction: from a job's loss curve so far, its final loss and the point at
//! which it comes within [`QUALITY_FRACTION`] of its whole reduction (its quality point, as
//! [`crate::quality::time_to_quality`] defines it for a finished run), with an uncertainty.
//!
//! Methods (issue 32, item 1), each a pure function of the points seen:
//! - **Parametric families fitted online** (the LC-extrapolation literature, Domhan et al.
//!   2015 fit an ensemble of such families): an exponential decay `c + a·e^(−b·x)` and a power
//!   law `c + a·(x/x₀ + 1)^(−b)` in the progress `x` (epochs, or the fraction of the run), `x₀`
//!   the first point's position (so the power law runs in epochs however `x` is counted). Each is
//!   fitted by least squares: a grid over the rate `b` (log-spaced) and, for each rate, the
//!   closed-form linear fit of `a` and `c`. Fits whose asymptote lies above the best value seen
//!   or whose amplitude is negative are discarded (a loss curve falls).
//! - **Last-k slope** (the usual baseline): the line through the last `k` points, flattened at
//!   the best value seen once it stops falling.
//!
//! [`predict`] returns the family with the smaller residual error; its uncertainty is the spread
//! between the predictions of the families that fit about as well plus the residual's standard
//! deviation (a single family's residual alone is too confident early on).
//! [`past_quality_point`] is the one verdict built on them (the default node policy's). `govsim
//! predict` measures the error of each method on the real curves of the fixtures at 25%, 50% and
//! 75% of each run, and when each verdict fires against the true quality point; the power law
//! was chosen by it (docs/evaluation/simulator.md).

use crate::quality::QUALITY_FRACTION;

/// Keeps a curve fed one value at a time to at most `max` values: beyond it every other value
/// is dropped (the first and the latest kept), so a run logged at every step costs a fit over
/// `max` values, not over all of them, and its shape is kept.
pub fn thin<T>(curve: &mut Vec<T>, max: usize) {
    if curve.len() <= max {
        return;
    }
    let last = curve.len() - 1;
    let mut i = 0;
    curve.retain(|_| {
        let keep = i % 2 == 0 || i == last;
        i += 1;
        keep
    });
}

/// What a method predicts for a curve, at the end of its run (`horizon`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// The loss at `horizon`.
    pub final_value: f64,
    /// Where it first comes within [`QUALITY_FRACTION`] of its whole reduction (first value to
    /// `final_value`), in the same units as the points' `x`; `None` if not by `horizon`.
    pub quality_at: Option<f64>,
    /// An uncertainty of `final_value` (one standard deviation, in the loss' units).
    pub spread: f64,
    /// The method that made it.
    pub method: Method,
}

/// A prediction method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Exponential,
    PowerLaw,
    LastSlope,
}

impl Method {
    /// Every method, in the order `govsim predict` reports them.
    pub const ALL: [Method; 3] = [Method::Exponential, Method::PowerLaw, Method::LastSlope];

    pub fn name(self) -> &'static str {
        match self {
            Method::Exponential => "exponential",
            Method::PowerLaw => "power-law",
            Method::LastSlope => "last-k slope",
        }
    }
}

/// Points the last-k slope uses.
pub const LAST_K: usize = 5;

/// A fitted curve `c + a·f(b, x)`.
#[derive(Clone, Copy, Debug)]
struct Fit {
    a: f64,
    b: f64,
    c: f64,
    /// Root mean squared residual.
    rmse: f64,
}

fn shape(method: Method, b: f64, x: f64) -> f64 {
    match method {
        Method::Exponential => (-b * x).exp(),
        Method::PowerLaw => (x + 1.0).powf(-b),
        Method::LastSlope => unreachable!("not a parametric family"),
    }
}

/// Least squares fit of `c + a·shape(b, x)` over a grid of rates `b` scaled to the span of the
/// points.
fn fit(method: Method, points: &[(f64, f64)]) -> Option<Fit> {
    let span = points.last()?.0 - points.first()?.0;
    if points.len() < 3 || span <= 0.0 {
        return None;
    }
    let best_seen = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let mut best: Option<Fit> = None;
    // Rates from a hundredth to a hundred times the inverse of the span (exponential), or
    // exponents 0.05 to 10 (power law).
    for k in 0..=60 {
        let t = f64::from(k) / 60.0;
        let b = match method {
            Method::Exponential => 10f64.powf(-2.0 + 4.0 * t) / span,
            Method::PowerLaw => 10f64.powf(-1.3 + 2.3 * t),
            Method::LastSlope => unreachable!(),
        };
        if let Some(f) = fit_at(method, points, b, best_seen)
            && best.is_none_or(|g| f.rmse < g.rmse)
        {
            best = Some(f);
        }
    }
    // Refine the rate between the grid's neighbours (golden section on the residual).
    let coarse = best?;
    let (mut lo, mut hi) = (coarse.b / 1.2, coarse.b * 1.2);
    let rmse = |b: f64| fit_at(method, points, b, best_seen).map_or(f64::INFINITY, |f| f.rmse);
    let g = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..40 {
        let (m1, m2) = (hi - g * (hi - lo), lo + g * (hi - lo));
        if rmse(m1) <= rmse(m2) {
            hi = m2;
        } else {
            lo = m1;
        }
    }
    match fit_at(method, points, (lo + hi) / 2.0, best_seen) {
        Some(f) if f.rmse <= coarse.rmse => Some(f),
        _ => Some(coarse),
    }
}

/// The closed-form least squares fit of `a` and `c` at rate `b`; `None` when it does not fall
/// towards an asymptote at or below the best value seen.
fn fit_at(method: Method, points: &[(f64, f64)], b: f64, best_seen: f64) -> Option<Fit> {
    let n = points.len() as f64;
    let (mut sf, mut sy, mut sff, mut sfy) = (0.0, 0.0, 0.0, 0.0);
    for &(x, y) in points {
        let f = shape(method, b, x);
        sf += f;
        sy += y;
        sff += f * f;
        sfy += f * y;
    }
    let den = n * sff - sf * sf;
    if den.abs() < 1e-12 {
        return None;
    }
    let a = (n * sfy - sf * sy) / den;
    let c = (sy - a * sf) / n;
    // A loss curve falls towards its asymptote.
    if a < 0.0 || c > best_seen + 1e-12 {
        return None;
    }
    let sse: f64 = points
        .iter()
        .map(|&(x, y)| (c + a * shape(method, b, x) - y).powi(2))
        .sum();
    Some(Fit {
        a,
        b,
        c,
        rmse: (sse / n).sqrt(),
    })
}

/// What `method` predicts for the curve `points` (`(x, loss)` in order of `x`) at `horizon`.
/// `None` when it has too few points or finds no falling fit.
pub fn predict_with(method: Method, points: &[(f64, f64)], horizon: f64) -> Option<Prediction> {
    // The power law is fitted in units of the first point's position: in epochs (or logged
    // steps) where the first report is one epoch in, the scale the literature fits it in; in
    // shares of the run `(x + 1)^-b` could only bend gently over [0, 1].
    let unit = points.first()?.0;
    if method == Method::PowerLaw && unit > 0.0 && unit.is_finite() {
        let scaled: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x / unit, y)).collect();
        let p = predict_unscaled(method, &scaled, horizon / unit)?;
        return Some(Prediction {
            quality_at: p.quality_at.map(|q| q * unit),
            ..p
        });
    }
    predict_unscaled(method, points, horizon)
}

fn predict_unscaled(method: Method, points: &[(f64, f64)], horizon: f64) -> Option<Prediction> {
    let first = points.first()?.1;
    // A parametric family's residual is its spread; the slope claims none.
    let mut spread = 0.0;
    let value_at: Box<dyn Fn(f64) -> f64> = match method {
        Method::LastSlope => {
            if points.len() < 2 {
                return None;
            }
            let tail = &points[points.len().saturating_sub(LAST_K)..];
            let (x0, y0) = tail[0];
            let (x1, y1) = tail[tail.len() - 1];
            let slope = if x1 > x0 {
                ((y1 - y0) / (x1 - x0)).min(0.0)
            } else {
                0.0
            };
            let floor = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
            // Falling on its latest slope, never below zero nor rising.
            Box::new(move |x: f64| {
                if x <= x1 {
                    floor.max(y1 + slope * (x - x1)).min(y1.max(floor))
                } else {
                    (y1 + slope * (x - x1)).max(0.0).min(floor)
                }
            })
        }
        _ => {
            let f = fit(method, points)?;
            spread = f.rmse;
            Box::new(move |x: f64| f.c + f.a * shape(method, f.b, x))
        }
    };
    let final_value = value_at(horizon);
    let threshold = final_value + QUALITY_FRACTION * (first - final_value);
    // The first point seen, else the first step of a fine walk to the horizon, within it.
    let last_x = points.last()?.0;
    let quality_at = points
        .iter()
        .find(|p| p.1 <= threshold)
        .map(|p| p.0)
        .or_else(|| {
            (1..=200)
                .map(|k| last_x + (horizon - last_x) * f64::from(k) / 200.0)
                .find(|&x| value_at(x) <= threshold)
        });
    Some(Prediction {
        final_value,
        quality_at,
        spread,
        method,
    })
}

/// The prediction for `points` at `horizon`: the parametric family that fits them best, its
/// spread widened by how much the families that fit about as well disagree (a family whose
/// residual is more than twice the best one's, plus 1% of the values' range, has been ruled out
/// by the points and does not widen it); the last-k slope when neither fits.
pub fn predict(points: &[(f64, f64)], horizon: f64) -> Option<Prediction> {
    // Each family fitted once: its prediction's spread is its residual.
    let fits: Vec<Prediction> = [Method::Exponential, Method::PowerLaw]
        .into_iter()
        .filter_map(|m| predict_with(m, points, horizon))
        .collect();
    let Some(&best) = fits.iter().min_by(|a, b| a.spread.total_cmp(&b.spread)) else {
        return predict_with(Method::LastSlope, points, horizon);
    };
    let (lo_seen, hi_seen) = points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), p| {
            (l.min(p.1), h.max(p.1))
        });
    let tolerance = 2.0 * best.spread + 0.01 * (hi_seen - lo_seen);
    let plausible = fits.iter().filter(|f| f.spread <= tolerance);
    let (lo, hi) = plausible.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), f| {
        (l.min(f.final_value), h.max(f.final_value))
    });
    Some(Prediction {
        spread: (best.spread.powi(2) + ((hi - lo) / 2.0).powi(2)).sqrt(),
        ..best
    })
}

/// Whether the curve `points` (`(x, loss)`, `x` in the units of `horizon`, the end of its run) is
/// confidently past its quality point: the best value seen is within [`QUALITY_FRACTION`] of the
/// reduction from its first value to the predicted final value lowered by `confidence` spreads
/// (an uncertain end is judged as one that may fall further). `method` `None` is [`predict`].
/// Returns the prediction that says so, `None` when it does not (or cannot) say so.
pub fn past_quality_point(
    points: &[(f64, f64)],
    horizon: f64,
    confidence: f64,
    method: Option<Method>,
) -> Option<Prediction> {
    let prediction = match method {
        None => predict(points, horizon),
        Some(m) => predict_with(m, points, horizon),
    }?;
    let first = points.first()?.1;
    let best = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let low = prediction.final_value - confidence * prediction.spread;
    if first.partial_cmp(&low) != Some(std::cmp::Ordering::Greater) {
        return None;
    }
    (best <= low + QUALITY_FRACTION * (first - low)).then_some(prediction)
}

#[cfg(test)]
#[path = "predict_tests.rs"]
mod tests;
