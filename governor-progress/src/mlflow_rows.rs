//! Rows of MLflow's SQLite tracking store to records; the database itself is read by
//! `governor-watch` (its `mlflow_db`, behind its `mlflow-sqlite` feature), which hands the rows
//! here.
//!
//! MLflow 3 writes a local run to `sqlite:///mlflow.db` by default. Each logged value is a row
//! of the `metrics` table (`key, value, timestamp, step, is_nan, run_uuid`). Consecutive rows of
//! one run with the same step and timestamp — what one `mlflow.log_metrics({...})` or one
//! autologged epoch writes — are one record; `is_nan` rows are NaN.

use crate::parsers::{Names, split_by_names};
use crate::record::{Metrics, RecordData};

/// The first 16 bytes of every SQLite database.
pub const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// True when `head` (a file's first bytes) starts like an SQLite database.
pub fn is_sqlite_header(head: &[u8]) -> bool {
    head.starts_with(SQLITE_MAGIC)
}

/// One row of `metrics`, as read (a NaN row already has `value` NaN).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricRow {
    pub rowid: i64,
    pub key: String,
    pub value: f64,
    pub step: i64,
    pub timestamp: i64,
    pub run: String,
}

/// Groups rows into records; keeps the metric names interned across calls.
#[derive(Default)]
pub struct RowGrouper {
    names: Names,
}

impl RowGrouper {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the records `rows` make to `out`, rows in the order given.
    pub fn group(&mut self, rows: Vec<MetricRow>, out: &mut Vec<RecordData>) {
        let mut current: Option<(String, i64, i64, Metrics)> = None;
        let flush = |c: Option<(String, i64, i64, Metrics)>, out: &mut Vec<RecordData>| {
            if let Some((_, step, _, metrics)) = c {
                out.push(RecordData {
                    epoch: None,
                    step: u64::try_from(step).ok(),
                    split: split_by_names(&metrics),
                    metrics,
                });
            }
        };
        for r in rows {
            let same = current.as_ref().is_some_and(|(run, step, ts, m)| {
                *run == r.run && *step == r.step && *ts == r.timestamp && !m.contains(&r.key)
            });
            if !same {
                flush(current.take(), out);
                current = Some((r.run.clone(), r.step, r.timestamp, Metrics::new()));
            }
            let name = self.names.get(&r.key);
            if let Some((_, _, _, m)) = current.as_mut() {
                m.insert(name, r.value);
            }
        }
        flush(current, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rowid: i64, key: &str, value: f64, step: i64, timestamp: i64, run: &str) -> MetricRow {
        MetricRow {
            rowid,
            key: key.into(),
            value,
            step,
            timestamp,
            run: run.into(),
        }
    }

    #[test]
    fn rows_of_one_call_are_one_record() {
        let mut g = RowGrouper::new();
        let mut out = Vec::new();
        g.group(
            vec![
                row(2, "loss", 0.5, 0, 10, "a"),
                row(3, "val_loss", 0.6, 0, 10, "a"),
                // The same key again at the same step and time: a second call.
                row(4, "loss", 0.4, 0, 10, "a"),
                row(5, "loss", f64::NAN, 1, 20, "a"),
                row(1, "loss", 0.9, 0, 10, "b"),
            ],
            &mut out,
        );
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].metrics.len(), 2);
        assert_eq!(out[0].metrics.get("val_loss"), Some(0.6));
        assert_eq!(out[1].metrics.get("loss"), Some(0.4));
        assert!(out[2].metrics.get("loss").unwrap().is_nan());
        assert_eq!(out[2].step, Some(1));
        assert_eq!(out[3].metrics.get("loss"), Some(0.9));
    }

    #[test]
    fn sqlite_header() {
        assert!(is_sqlite_header(b"SQLite format 3\0\x10\x00"));
        assert!(!is_sqlite_header(b"SQLite format 3"));
        assert!(!is_sqlite_header(b"epoch,loss\n"));
    }
}
