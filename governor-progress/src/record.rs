//! The record model: what one logged event of a training run says.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use super::format::Format;

/// Which phase of training a record describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training-step or training-epoch values (the default).
    #[default]
    Train,
    /// Validation / evaluation / test values.
    #[serde(alias = "val", alias = "valid", alias = "validation", alias = "test")]
    Eval,
}

impl Split {
    /// `"train"` or `"eval"`, as printed by `governor parse`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
        }
    }

    /// Reads a split from the words frameworks use (`train`, `val`, `eval`, `test`...).
    pub fn from_word(word: &str) -> Option<Split> {
        let w = word.trim().to_ascii_lowercase();
        match w.as_str() {
            "train" | "training" | "trn" => Some(Split::Train),
            "val" | "valid" | "validation" | "eval" | "evaluation" | "test" | "testing" | "dev" => {
                Some(Split::Eval)
            }
            _ => None,
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// True when a metric name says it was measured on held-out data (`val_loss`, `eval/acc`,
/// `test_loss`, `validation_accuracy`..., and TensorBoard-style tags whose later `/` part names
/// the split: `Loss/val`, `loss/validation`).
pub fn is_eval_metric_name(name: &str) -> bool {
    if name
        .split('/')
        .skip(1)
        .any(|part| matches!(Split::from_word(part), Some(Split::Eval)))
    {
        return true;
    }
    let lower = |s: &str, p: &str| {
        s.len() >= p.len() && s.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
    };
    for prefix in ["validation", "valid", "val", "eval", "test"] {
        if lower(name, prefix) {
            // `val_loss`, `val/loss`, `val.loss`, `valloss`... but not `value` or `testimony`.
            let rest = &name[prefix.len()..];
            return match rest.bytes().next() {
                None => true,
                Some(b) => !b.is_ascii_lowercase() || rest.starts_with("loss"),
            };
        }
    }
    false
}

/// Metric values of one record, in the order the log wrote them.
///
/// A small vector rather than a map: records carry a handful of metrics, names are shared
/// (`Arc<str>`) between the records of one file, and insertion order is what a reader of the
/// log expects to see.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics(Vec<(Arc<str>, f64)>);

impl Metrics {
    /// An empty set.
    pub fn new() -> Self {
        Metrics(Vec::new())
    }

    /// An empty set with room for `n` metrics.
    pub fn with_capacity(n: usize) -> Self {
        Metrics(Vec::with_capacity(n))
    }

    /// The value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| &**k == name).map(|(_, v)| *v)
    }

    /// True when `name` is present.
    pub fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| &**k == name)
    }

    /// Sets `name` to `value`, replacing an earlier value of the same name.
    pub fn insert(&mut self, name: Arc<str>, value: f64) {
        // Names of one file are shared: pointer equality settles most comparisons.
        let same = |k: &Arc<str>| Arc::ptr_eq(k, &name) || (k.len() == name.len() && *k == name);
        if let Some(slot) = self.0.iter_mut().find(|(k, _)| same(k)) {
            slot.1 = value;
        } else {
            self.0.push((name, value));
        }
    }

    /// Appends without looking for a duplicate: for callers whose names are already unique
    /// (a CSV header, checked once).
    pub(crate) fn push_unique(&mut self, name: Arc<str>, value: f64) {
        self.0.push((name, value));
    }

    /// Number of metrics.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Name/value pairs in log order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        self.0.iter().map(|(k, v)| (&**k, *v))
    }

    /// Name/value pairs with shared names.
    pub fn entries(&self) -> &[(Arc<str>, f64)] {
        &self.0
    }
}

impl FromIterator<(Arc<str>, f64)> for Metrics {
    fn from_iter<T: IntoIterator<Item = (Arc<str>, f64)>>(iter: T) -> Self {
        let mut m = Metrics::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl Serialize for Metrics {
    /// A JSON object in log order. NaN and infinities have no JSON form and print as `null`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            if v.is_finite() {
                map.serialize_entry(&**k, v)?;
            } else {
                map.serialize_entry(&**k, &Option::<f64>::None)?;
            }
        }
        map.end()
    }
}

/// What a format parser extracts from the log: one record without its provenance.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordData {
    /// Epoch as the log wrote it (0- or 1-based, fractional for Hugging Face).
    pub epoch: Option<f64>,
    /// Step / iteration counter as the log wrote it (see each format's documentation).
    pub step: Option<u64>,
    pub split: Split,
    pub metrics: Metrics,
}

/// One record of a training log.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// The file it was read from.
    pub file: Arc<Path>,
    /// The file's format (detected or configured).
    pub format: Format,
    /// 0-based position among the records of this file (keeps counting across truncation and
    /// rotation while the file is being watched).
    pub index: u64,
    /// Wall-clock time the record was read.
    pub observed_at: SystemTime,
    /// Epoch as the log wrote it (0- or 1-based, fractional for Hugging Face).
    pub epoch: Option<f64>,
    /// Step / iteration counter as the log wrote it.
    pub step: Option<u64>,
    pub split: Split,
    /// Metric name -> value, in log order. May hold NaN or infinities: they are reported by
    /// the signal tracker and never used as progress.
    pub metrics: Metrics,
}

impl Record {
    /// A record of `file` from what its parser extracted.
    pub fn from_data(
        file: Arc<Path>,
        format: Format,
        index: u64,
        observed_at: SystemTime,
        d: RecordData,
    ) -> Self {
        Record {
            file,
            format,
            index,
            observed_at,
            epoch: d.epoch,
            step: d.step,
            split: d.split,
            metrics: d.metrics,
        }
    }
}

/// Converts a counter the log wrote as a number into a step: only non-negative integers
/// (possibly written as `100.0`) qualify.
pub(crate) fn step_from_f64(v: f64) -> Option<u64> {
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1.8e19 {
        Some(v as u64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_metric_names_are_recognised_by_prefix() {
        for name in [
            "val_loss",
            "val/loss",
            "valloss",
            "eval_loss",
            "test_acc1",
            "validation_accuracy",
            "val",
            "Loss/val",
            "loss/validation",
            "Accuracy/test",
        ] {
            assert!(is_eval_metric_name(name), "{name} should be an eval metric");
        }
        for name in [
            "loss",
            "value",
            "train_loss",
            "testimony",
            "evaluated",
            "lr",
            "Loss/train",
            "train/loss",
        ] {
            assert!(
                !is_eval_metric_name(name),
                "{name} should not be an eval metric"
            );
        }
    }

    #[test]
    fn metrics_keep_log_order_and_replace_duplicates() {
        let mut m = Metrics::new();
        m.insert("b".into(), 1.0);
        m.insert("a".into(), 2.0);
        m.insert("b".into(), 3.0);
        let got: Vec<_> = m.iter().collect();
        assert_eq!(got, vec![("b", 3.0), ("a", 2.0)]);
    }

    #[test]
    fn non_finite_metrics_serialise_as_null() {
        let mut m = Metrics::new();
        m.insert("loss".into(), f64::NAN);
        m.insert("acc".into(), 0.5);
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"loss":null,"acc":0.5}"#
        );
    }

    #[test]
    fn steps_must_be_non_negative_integers() {
        assert_eq!(step_from_f64(100.0), Some(100));
        assert_eq!(step_from_f64(-1.0), None);
        assert_eq!(step_from_f64(1.5), None);
        assert_eq!(step_from_f64(f64::NAN), None);
    }
}
