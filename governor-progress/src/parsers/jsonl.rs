//! JSON-lines loggers: Detectron2 `metrics.json`, MMEngine `scalars.json`, DeiT/DETR
//! `log.txt`, and any other JSON-lines log.
//!
//! Each line holding exactly one JSON object is a candidate record; other lines are ignored.
//! Numbers, Python's `NaN`/`Infinity`, and numbers written as strings become metrics under
//! their key (nested objects flattened with `/`); arrays are skipped.
//!
//! - Detectron2: lines with `iteration` (the step). A line is a train record when it has
//!   `total_loss` or a `loss*` key (periodic evaluation merged into a training line stays a
//!   train record); lines with only evaluation results are eval records.
//! - MMEngine: lines with `step` and `data_time` or `iter`. Train lines carry `lr`, `iter` or
//!   a loss; the others are validation results, whose `step` is the epoch for epoch-based
//!   loops (kept as written).
//! - DeiT/DETR: one line per epoch with `epoch`, `train_*` and `test_*` or `n_parameters`
//!   (dropped: not a metric); a train record carrying the epoch's test values.
//! - Generic: `epoch`, `step`/`global_step`/`iter`/`iteration`/`_step` are counters; a string
//!   `split`/`mode`/`phase` key sets the split, otherwise lines whose metrics are all
//!   `val*`/`eval*`/`test*` are eval records. A line needs a metric-like key and either a
//!   counter or a second metric.

use super::{KeyRole, LineParser, Names, Status, generic_key_role, is_metric_like, split_by_names};
use crate::json::{Scalar, scan_object};
use crate::num::parse_number;
use crate::record::{Metrics, RecordData, Split, step_from_f64};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Detectron2,
    Mmengine,
    Deit,
    Generic,
}

pub(crate) struct JsonlParser {
    dialect: Dialect,
    names: Names,
    path: String,
    recognized: bool,
}

impl JsonlParser {
    pub(crate) fn new(dialect: Dialect) -> Self {
        JsonlParser {
            dialect,
            names: Names::default(),
            path: String::new(),
            recognized: false,
        }
    }
}

/// Keys seen on a line that decide dialect and split.
#[derive(Default)]
struct Seen {
    iteration: bool,
    step: bool,
    data_time: bool,
    iter: bool,
    lr: bool,
    loss: bool,
    total_loss: bool,
    epoch: bool,
    train_prefixed: bool,
    test_prefixed: bool,
    n_parameters: bool,
    split: Option<Split>,
}

impl LineParser for JsonlParser {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        let t = line.trim();
        if !(t.starts_with('{') && t.ends_with('}')) {
            return;
        }
        let dialect = self.dialect;
        let names = &mut self.names;
        let mut rec = RecordData {
            metrics: Metrics::with_capacity(24),
            ..RecordData::default()
        };
        let mut seen = Seen::default();
        let mut counters = 0usize;
        let ok = scan_object(t.as_bytes(), &mut self.path, &mut |k, v| {
            let value = match v {
                Scalar::Num(x) => x,
                Scalar::Str(s) => {
                    if dialect == Dialect::Generic
                        && matches!(k, "split" | "mode" | "phase" | "stage")
                    {
                        seen.split = Split::from_word(&s);
                        return;
                    }
                    match parse_number(&s) {
                        Some(x) => x,
                        None => return,
                    }
                }
                Scalar::Bool(_) | Scalar::Null => return,
            };
            match dialect {
                Dialect::Detectron2 => {
                    if k == "iteration" {
                        seen.iteration = true;
                        rec.step = step_from_f64(value);
                        counters += 1;
                        return;
                    }
                    if k == "total_loss" {
                        seen.total_loss = true;
                    } else if k.starts_with("loss") {
                        seen.loss = true;
                    }
                }
                Dialect::Mmengine => match k {
                    "step" => {
                        seen.step = true;
                        rec.step = step_from_f64(value);
                        counters += 1;
                        return;
                    }
                    "epoch" => {
                        rec.epoch = Some(value).filter(|v| v.is_finite());
                        counters += 1;
                        return;
                    }
                    "iter" => {
                        seen.iter = true;
                        return;
                    }
                    "data_time" => seen.data_time = true,
                    "lr" => seen.lr = true,
                    _ => {
                        if k.contains("loss") && !crate::record::is_eval_metric_name(k) {
                            seen.loss = true;
                        }
                    }
                },
                Dialect::Deit => {
                    if k == "epoch" {
                        seen.epoch = true;
                        rec.epoch = Some(value).filter(|v| v.is_finite());
                        counters += 1;
                        return;
                    }
                    if k == "n_parameters" {
                        seen.n_parameters = true;
                        return;
                    }
                    if k.starts_with("train_") {
                        seen.train_prefixed = true;
                    } else if k.starts_with("test_") {
                        seen.test_prefixed = true;
                    }
                }
                Dialect::Generic => match generic_key_role(k) {
                    KeyRole::Epoch => {
                        rec.epoch = Some(value).filter(|v| v.is_finite());
                        counters += 1;
                        return;
                    }
                    KeyRole::Step => {
                        if rec.step.is_none() {
                            rec.step = step_from_f64(value);
                        }
                        counters += 1;
                        return;
                    }
                    KeyRole::Metric => {}
                },
            }
            rec.metrics.insert(names.get(k), value);
        });
        if ok.is_none() || rec.metrics.is_empty() {
            return;
        }
        let accepted = match dialect {
            Dialect::Detectron2 => seen.iteration,
            Dialect::Mmengine => seen.step && (seen.data_time || seen.iter),
            Dialect::Deit => {
                seen.epoch && seen.train_prefixed && (seen.test_prefixed || seen.n_parameters)
            }
            Dialect::Generic => {
                rec.metrics.iter().any(|(k, _)| is_metric_like(k))
                    && (counters > 0 || rec.metrics.len() >= 2)
            }
        };
        if !accepted {
            return;
        }
        rec.split = match dialect {
            Dialect::Detectron2 => {
                if seen.total_loss || seen.loss {
                    Split::Train
                } else {
                    Split::Eval
                }
            }
            Dialect::Mmengine => {
                if seen.iter || seen.lr || seen.loss {
                    Split::Train
                } else {
                    Split::Eval
                }
            }
            Dialect::Deit => Split::Train,
            Dialect::Generic => seen.split.unwrap_or_else(|| split_by_names(&rec.metrics)),
        };
        self.recognized = true;
        out.push(rec);
    }

    fn status(&self) -> Status {
        if self.recognized {
            Status::Recognized
        } else {
            Status::Undetermined
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(d: Dialect, text: &str) -> Vec<RecordData> {
        let mut p = JsonlParser::new(d);
        let mut out = Vec::new();
        for l in text.lines() {
            p.line(l, &mut out);
        }
        out
    }

    #[test]
    fn detectron2_train_and_eval_lines() {
        let recs = feed(
            Dialect::Detectron2,
            "{\"iteration\": 19, \"loss_cls\": 0.7, \"total_loss\": 2.0}\n\
             {\"bbox/AP\": NaN, \"iteration\": 499}\n\
             {\"no\": 1}\n",
        );
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].step, Some(19));
        assert_eq!(recs[0].split, Split::Train);
        assert_eq!(recs[1].split, Split::Eval);
        assert!(recs[1].metrics.get("bbox/AP").unwrap().is_nan());
    }

    #[test]
    fn mmengine_train_and_val_lines() {
        let recs = feed(
            Dialect::Mmengine,
            "{\"lr\": 0.001, \"data_time\": 0.07, \"loss\": 2.2, \"epoch\": 1, \"iter\": 1, \"step\": 1}\n\
             {\"aAcc\": 87.5, \"data_time\": 0.07, \"time\": 0.6, \"step\": 1}\n",
        );
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].split, Split::Train);
        assert_eq!(recs[0].epoch, Some(1.0));
        assert!(!recs[0].metrics.contains("iter"));
        assert_eq!(recs[1].split, Split::Eval);
    }

    #[test]
    fn deit_log_txt_lines() {
        let recs = feed(
            Dialect::Deit,
            "{\"train_lr\": 1e-06, \"train_loss\": 6.9, \"test_loss\": 6.8, \"test_acc1\": 0.1, \"epoch\": 0, \"n_parameters\": 5717416}\n",
        );
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].epoch, Some(0.0));
        assert!(!recs[0].metrics.contains("n_parameters"));
        assert_eq!(recs[0].metrics.get("train_loss"), Some(6.9));
    }

    #[test]
    fn generic_lines_need_a_metric_and_context() {
        let recs = feed(
            Dialect::Generic,
            "{\"global_step\": 5, \"loss\": \"0.5\"}\n\
             {\"split\": \"val\", \"epoch\": 1, \"accuracy\": 0.9}\n\
             {\"loss\": 0.5}\n\
             {\"pid\": 1, \"port\": 80}\n\
             {\"train\": {\"loss\": 0.4, \"acc\": 0.8}}\n",
        );
        assert_eq!(recs.len(), 3, "{recs:?}");
        assert_eq!(recs[0].step, Some(5));
        assert_eq!(recs[0].metrics.get("loss"), Some(0.5));
        assert_eq!(recs[1].split, Split::Eval);
        assert_eq!(recs[2].metrics.get("train/loss"), Some(0.4));
    }
}
