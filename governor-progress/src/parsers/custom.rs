//! A job's own format: a regular expression with named captures, from its configuration.
//!
//! ```toml
//! [job.progress.custom]
//! regex = '^it=(?P<step>\d+) ep=(?P<epoch>[\d.]+) L=(?P<loss>\S+) (?P<split>train|val)$'
//! split = "train"   # optional default when there is no `split` group
//! ```
//!
//! Every line the regex matches (anywhere in the line; anchor it if needed) is one record.
//! Groups named `epoch` and `step` are the counters, a group named `split` holds a split word
//! (`train`, `val`, `eval`, `test`...), every other named group is a metric of that name
//! (a capture that is not a number is left out). The regex must have at least one metric group.

use std::sync::Arc;

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

use super::LineParser;
use crate::ProgressError;
use crate::num::parse_number;
use crate::record::{Metrics, RecordData, Split, step_from_f64};

/// A custom format as written in a job's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomFormat {
    /// Regular expression (Rust `regex` syntax) with named captures.
    pub regex: String,
    /// Split of the records when the regex has no `split` group (default `train`).
    #[serde(default)]
    pub split: Option<Split>,
}

/// Largest compiled regex accepted (the pattern comes from a job's configuration).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
enum Role {
    Epoch,
    Step,
    Split,
    Metric,
}

/// A compiled custom format.
#[derive(Clone, Debug)]
pub(crate) struct CustomParser {
    regex: Regex,
    groups: Vec<(usize, Role, Arc<str>)>,
    default_split: Split,
}

impl CustomFormat {
    /// Compiles and checks the regex.
    pub(crate) fn compile(&self) -> Result<CustomParser, ProgressError> {
        let regex = RegexBuilder::new(&self.regex)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| ProgressError::CustomRegex {
                message: e.to_string(),
            })?;
        let mut groups = Vec::new();
        for (i, name) in regex.capture_names().enumerate() {
            let Some(name) = name else { continue };
            let role = match name {
                "epoch" => Role::Epoch,
                "step" => Role::Step,
                "split" => Role::Split,
                _ => Role::Metric,
            };
            groups.push((i, role, Arc::from(name)));
        }
        if !groups.iter().any(|(_, r, _)| matches!(r, Role::Metric)) {
            return Err(ProgressError::CustomNoMetric {
                regex: self.regex.clone(),
            });
        }
        Ok(CustomParser {
            regex,
            groups,
            default_split: self.split.unwrap_or_default(),
        })
    }

    /// Checks the regex without keeping it (for configuration validation).
    pub fn validate(&self) -> Result<(), ProgressError> {
        self.compile().map(drop)
    }
}

impl LineParser for CustomParser {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        let Some(c) = self.regex.captures(line) else {
            return;
        };
        let mut rec = RecordData {
            split: self.default_split,
            metrics: Metrics::with_capacity(self.groups.len()),
            ..RecordData::default()
        };
        for (i, role, name) in &self.groups {
            let Some(m) = c.get(*i) else { continue };
            match role {
                Role::Split => {
                    if let Some(s) = Split::from_word(m.as_str()) {
                        rec.split = s;
                    }
                }
                Role::Epoch => rec.epoch = parse_number(m.as_str()).filter(|v| v.is_finite()),
                Role::Step => {
                    rec.step = parse_number(&m.as_str().replace(',', "")).and_then(step_from_f64)
                }
                Role::Metric => {
                    if let Some(v) = parse_number(m.as_str()) {
                        rec.metrics.push_unique(name.clone(), v);
                    }
                }
            }
        }
        if !rec.metrics.is_empty() {
            out.push(rec);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_groups_become_counters_split_and_metrics() {
        let f: CustomFormat = toml::from_str(
            r#"regex = '^it=(?P<step>\d+) ep=(?P<epoch>[\d.]+) L=(?P<loss>\S+) acc=(?P<acc>\S+) (?P<split>\w+)$'"#,
        )
        .unwrap();
        let mut p = f.compile().unwrap();
        let mut out = Vec::new();
        p.line("it=10 ep=0.5 L=0.25 acc=91% val", &mut out);
        p.line("it=11 ep=0.5 L=nan acc=x train", &mut out);
        p.line("unrelated", &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].step, Some(10));
        assert_eq!(out[0].epoch, Some(0.5));
        assert_eq!(out[0].split, Split::Eval);
        assert_eq!(out[0].metrics.get("acc"), Some(91.0));
        assert!(out[1].metrics.get("loss").unwrap().is_nan());
        assert!(!out[1].metrics.contains("acc"));
        assert_eq!(out[1].split, Split::Train);
    }

    #[test]
    fn bad_configurations_are_refused() {
        let no_metric = CustomFormat {
            regex: r"(?P<step>\d+)".into(),
            split: None,
        };
        assert!(matches!(
            no_metric.validate(),
            Err(ProgressError::CustomNoMetric { .. })
        ));
        let invalid = CustomFormat {
            regex: r"(?P<loss>".into(),
            split: None,
        };
        assert!(matches!(
            invalid.validate(),
            Err(ProgressError::CustomRegex { .. })
        ));
        let default_split: CustomFormat =
            toml::from_str("regex = '(?P<loss>\\S+)'\nsplit = 'val'").unwrap();
        assert_eq!(default_split.split, Some(Split::Eval));
    }
}
