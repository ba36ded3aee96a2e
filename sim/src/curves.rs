//! Real loss curves: read training logs with the daemon's own parsers and turn each into a loss
//! as a function of the fraction of the job's work done.
//!
//! Every file under the directory is read whole and parsed with
//! [`governor_progress::parse_bytes_with`] (format auto-detected, exactly as the daemon would) and its records are fed, in order, to the
//! daemon's [`SignalTracker`] with the default configuration, so the curve is the signal the
//! policies would see on a real node: the training loss under its framework's name.
//!
//! From the signal values to a curve:
//! - **Segments.** A log with several runs appended (counters restarted) holds several curves;
//!   the longest segment is kept.
//! - **Position.** A value's position in the run is its step when every value of the segment
//!   has one and they increase, else its epoch under the same condition, else its index. The
//!   fraction of work done is `position / last position` (a run starts at position 0, before
//!   the first logged value: the first value is logged after some work was done).
//! - **Usable curves.** At least [`MIN_POINTS`] finite values, all strictly positive (the
//!   policies compare relative changes; a GAN critic's negative loss has no such meaning), and
//!   a signal that is minimised. Others are skipped with the reason.
//! - **Size.** Curves with more than [`MAX_POINTS`] values are thinned evenly (first and last
//!   kept), and numbers are rounded to 6 significant digits so traces stay small and
//!   round-trip exactly through JSON.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use governor_policy::Direction;
use governor_progress::{
    FormatChoice, SignalConfig, SignalTracker, SignalUpdate, parse_bytes_with,
};
use serde::{Deserialize, Serialize};

/// Fewest values a usable curve has.
pub const MIN_POINTS: usize = 5;
/// Most points kept per curve.
pub const MAX_POINTS: usize = 200;

/// One real training run's loss curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RealCurve {
    /// The log's path relative to the directory it was read from.
    pub source: String,
    /// The detected log format.
    pub format: String,
    /// The signal's metric name.
    pub metric: String,
    /// Values the run logged (before thinning): its natural log granularity.
    pub logged_values: usize,
    /// `(fraction of work done, loss)`, sorted by fraction, last fraction 1.
    pub points: Vec<(f64, f64)>,
}

/// A file that gave no usable curve, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub source: String,
    pub reason: String,
}

/// Every usable curve under `dir` (recursively, files in name order) and the files skipped.
pub fn load_dir(dir: &Path) -> std::io::Result<(Vec<RealCurve>, Vec<Skipped>)> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    files.sort();
    let mut curves = Vec::new();
    let mut skipped = Vec::new();
    for path in files {
        let source = path
            .strip_prefix(dir)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        // The directory's own documentation is not a log.
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "README.md" || name == "INDEX.tsv" {
            continue;
        }
        match curve_from_file(&path, &source) {
            Ok(c) => curves.push(c),
            Err(reason) => skipped.push(Skipped { source, reason }),
        }
    }
    Ok((curves, skipped))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            collect_files(&path, out)?;
        } else if kind.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// One loss value and where it was logged: (epoch, step, value).
type CurvePoint = (Option<f64>, Option<u64>, f64);

/// The curve of one log file (see the module documentation), or why there is none.
pub fn curve_from_file(path: &Path, source: &str) -> Result<RealCurve, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // The curve uses no wall time: a fixed one keeps the simulator deterministic.
    let log = parse_bytes_with(
        path,
        &bytes,
        FormatChoice::Auto,
        None,
        SystemTime::UNIX_EPOCH,
    )
    .map_err(|e| e.to_string())?;
    let mut tracker = SignalTracker::new(SignalConfig::default());
    // Segments of (epoch, step, value).
    let mut segments: Vec<Vec<CurvePoint>> = Vec::new();
    for record in &log.records {
        if let SignalUpdate::Value { value, new_segment } = tracker.observe(record) {
            if new_segment || segments.is_empty() {
                segments.push(Vec::new());
            }
            segments
                .last_mut()
                .expect("pushed above")
                .push((record.epoch, record.step, value));
        }
    }
    if tracker.direction() != Direction::Minimise {
        return Err("the signal is maximised, not a loss".to_owned());
    }
    let metric = tracker.metric().unwrap_or("").to_owned();
    let segment = segments
        .into_iter()
        .max_by_key(|s| s.len())
        .ok_or_else(|| "no training-loss values".to_owned())?;
    if segment.len() < MIN_POINTS {
        return Err(format!(
            "{} loss values, fewer than {MIN_POINTS}",
            segment.len()
        ));
    }
    if let Some(bad) = segment.iter().find(|p| p.2.is_nan() || p.2 <= 0.0) {
        return Err(format!("non-positive loss value {}", bad.2));
    }
    let positions = positions(&segment);
    let last = *positions.last().expect("non-empty");
    let mut points: Vec<(f64, f64)> = positions
        .iter()
        .zip(&segment)
        .map(|(&p, s)| (round_sig(p / last, 6), round_sig(s.2, 6)))
        .collect();
    let logged_values = points.len();
    if points.len() > MAX_POINTS {
        let n = points.len();
        points = (0..MAX_POINTS)
            .map(|k| points[k * (n - 1) / (MAX_POINTS - 1)])
            .collect();
    }
    Ok(RealCurve {
        source: source.to_owned(),
        format: log.format.name().to_owned(),
        metric,
        logged_values,
        points,
    })
}

/// Positions of the values in their run: steps, else epochs, else indices (1-based), whichever
/// is present on every value and strictly increasing first.
fn positions(segment: &[(Option<f64>, Option<u64>, f64)]) -> Vec<f64> {
    let increasing = |xs: &[f64]| xs.windows(2).all(|w| w[1] > w[0]) && xs[0] >= 0.0;
    let steps: Option<Vec<f64>> = segment.iter().map(|s| s.1.map(|v| v as f64)).collect();
    if let Some(s) = steps
        && increasing(&s)
        && *s.last().expect("non-empty") > 0.0
    {
        return shift_to_start(s);
    }
    let epochs: Option<Vec<f64>> = segment.iter().map(|s| s.0).collect();
    if let Some(e) = epochs
        && increasing(&e)
        && *e.last().expect("non-empty") > 0.0
    {
        return shift_to_start(e);
    }
    (1..=segment.len()).map(|i| i as f64).collect()
}

/// A first position of 0 (a log that counts from 0 and logs before any work) would make the
/// first value "at the start"; positions counted from 0 are shifted by one interval so every
/// logged value comes after some work.
fn shift_to_start(mut xs: Vec<f64>) -> Vec<f64> {
    if xs[0] == 0.0 {
        let gap = if xs.len() > 1 { xs[1] - xs[0] } else { 1.0 };
        for x in &mut xs {
            *x += gap;
        }
    }
    xs
}

/// `x` rounded to `digits` significant digits.
pub fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(digits - 1 - x.abs().log10().floor() as i32);
    let r = (x * scale).round() / scale;
    // Going through the shortest decimal text makes the value exactly what JSON will read back.
    r.to_string().parse().unwrap_or(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_keras_csv_log_becomes_a_curve_by_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let text = "epoch,accuracy,loss\n0,0.5,2.0\n1,0.6,1.5\n2,0.7,1.2\n3,0.75,1.1\n4,0.8,1.05\n";
        let p = write(dir.path(), "training.log", text);
        let c = curve_from_file(&p, "training.log").unwrap();
        assert_eq!(c.metric, "loss");
        assert_eq!(c.logged_values, 5);
        // Epochs 0..4 counted from 0: shifted to 1..5, fractions k/5.
        assert_eq!(
            c.points,
            vec![(0.2, 2.0), (0.4, 1.5), (0.6, 1.2), (0.8, 1.1), (1.0, 1.05)]
        );
    }

    #[test]
    fn the_longest_run_of_an_appended_log_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("epoch,loss\n");
        for e in 0..3 {
            text.push_str(&format!("{e},{}\n", 3.0 - e as f64 * 0.1));
        }
        for e in 0..6 {
            text.push_str(&format!("{e},{}\n", 2.0 - e as f64 * 0.2));
        }
        let p = write(dir.path(), "training.log", &text);
        let c = curve_from_file(&p, "x").unwrap();
        assert_eq!(c.points.len(), 6);
        assert_eq!(c.points[0].1, 2.0);
    }

    #[test]
    fn short_or_non_positive_curves_are_skipped_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "short.log", "epoch,loss\n0,1.0\n1,0.5\n");
        write(
            dir.path(),
            "neg.log",
            "epoch,loss\n0,1.0\n1,-0.5\n2,0.4\n3,0.3\n4,0.2\n",
        );
        write(dir.path(), "README.md", "# not a log\n");
        let (curves, skipped) = load_dir(dir.path()).unwrap();
        assert!(curves.is_empty(), "{curves:?}");
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped.iter().any(|s| s.reason.contains("fewer than")));
        assert!(skipped.iter().any(|s| s.reason.contains("non-positive")));
    }

    #[test]
    fn rounding_keeps_six_significant_digits() {
        assert_eq!(round_sig(0.123456789, 6), 0.123457);
        assert_eq!(round_sig(123456.789, 6), 123457.0);
        assert_eq!(round_sig(0.0, 6), 0.0);
    }
}
