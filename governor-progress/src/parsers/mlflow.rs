//! MLflow's file store: one file per metric and run, `mlruns/<experiment>/<run>/metrics/<key>`
//! (a key with `/` in it is a sub-directory), one line per logged value:
//!
//! ```text
//! 1732790112345 0.6931 0
//! 1732790112891 0.5120 1
//! ```
//!
//! `timestamp(ms) value step` (before MLflow 1.0 the step was missing: it is then absent). The
//! metric's name is the key, which only the path says: the parser is built with it (see
//! [`metric_key`]). One record per line; `eval` when the key is named so (`val_loss`).
//! MLflow writes `nan`/`inf` as Python prints them.

use std::path::Path;
use std::sync::Arc;

use super::{LineParser, Status, split_by_names};
use crate::num::parse_plain;
use crate::record::{Metrics, RecordData};

pub(crate) struct MetricFile {
    key: Arc<str>,
    status: Status,
}

impl MetricFile {
    pub(crate) fn new(key: &str) -> Self {
        MetricFile {
            key: Arc::from(key),
            status: Status::Undetermined,
        }
    }
}

/// `(value, step)` of one line.
pub(crate) fn metric_line(line: &str) -> Option<(f64, Option<u64>)> {
    let mut f = line.split_ascii_whitespace();
    let ts = f.next()?;
    if ts.is_empty() || !ts.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value = parse_plain(f.next()?)?;
    // A negative step is kept as no step; a step that is no integer is no MLflow line.
    let step = match f.next() {
        Some(s) => u64::try_from(s.parse::<i64>().ok()?).ok(),
        None => None,
    };
    if f.next().is_some() {
        return None;
    }
    Some((value, step))
}

impl LineParser for MetricFile {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        let Some((value, step)) = metric_line(line) else {
            return;
        };
        self.status = Status::Recognized;
        let mut metrics = Metrics::with_capacity(1);
        metrics.push_unique(self.key.clone(), value);
        out.push(RecordData {
            epoch: None,
            step,
            split: split_by_names(&metrics),
            metrics,
        });
    }

    fn status(&self) -> Status {
        self.status
    }
}

/// The metric key of a file of MLflow's file store: the path below the `metrics` directory of a
/// run directory (`mlruns/0/<32 hex digits>/metrics/train/loss` is `train/loss`). `None` for any
/// other path.
pub(crate) fn metric_key(path: &Path) -> Option<String> {
    let parts: Vec<&str> = path
        .components()
        .map(|c| c.as_os_str().to_str())
        .collect::<Option<_>>()?;
    let at = parts.iter().rposition(|p| *p == "metrics")?;
    let run = *parts.get(at.checked_sub(1)?)?;
    if at + 1 >= parts.len() || !is_run_id(run) {
        return None;
    }
    Some(parts[at + 1..].join("/"))
}

/// MLflow run ids are 32 lowercase hexadecimal digits (a UUID without dashes).
fn is_run_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Split;

    #[test]
    fn lines_are_timestamp_value_step() {
        assert_eq!(metric_line("1732790112345 0.5 3"), Some((0.5, Some(3))));
        assert_eq!(
            metric_line("1732790112345 nan 4").map(|v| v.0.is_nan()),
            Some(true)
        );
        assert_eq!(
            metric_line("1732790112345 -inf 4").map(|v| v.0),
            Some(f64::NEG_INFINITY)
        );
        assert_eq!(metric_line("1732790112345 1.5"), Some((1.5, None)));
        assert_eq!(metric_line("epoch loss"), None);
        assert_eq!(metric_line("1 2 3 4"), None);
        assert_eq!(metric_line("1 2 3.5"), None);
        assert_eq!(metric_line("1 2 -1"), Some((2.0, None)));
    }

    #[test]
    fn keys_come_from_the_path() {
        let run = "/w/mlruns/0/0123456789abcdef0123456789abcdef";
        assert_eq!(
            metric_key(Path::new(&format!("{run}/metrics/val_loss"))).as_deref(),
            Some("val_loss")
        );
        assert_eq!(
            metric_key(Path::new(&format!("{run}/metrics/train/loss"))).as_deref(),
            Some("train/loss")
        );
        assert_eq!(metric_key(Path::new("/w/metrics/loss")), None);
        assert_eq!(metric_key(Path::new(&format!("{run}/params/lr"))), None);
    }

    #[test]
    fn one_record_per_line_split_by_name() {
        let mut p = MetricFile::new("val_loss");
        let mut out = Vec::new();
        p.line("1732790112345 0.5 3", &mut out);
        p.line("garbage", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].split, Split::Eval);
        assert_eq!(out[0].step, Some(3));
        assert_eq!(p.status(), Status::Recognized);
    }
}
