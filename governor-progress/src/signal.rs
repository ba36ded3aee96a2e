//! From records to a job's progress signal E(t).
//!
//! Each job has one signal: by default its training loss, or any metric configured with a
//! direction. The [`SignalTracker`] sees every record of the job, in order, and says for each
//! whether it carries a usable value.
//!
//! **Default signal (training loss).** Only train records are considered. The first train
//! record that has one of the names below fixes the signal's name for the rest of the file
//! (a Hugging Face summary's `train_loss` average is therefore never mistaken for progress
//! once `loss` was seen). Names are tried in this order:
//! 1. the format's own: Detectron2 `total_loss`; Ultralytics CSV `train/box_loss`,
//!    `train/loss` (classification); Ultralytics console `box_loss`, `box`, `loss`; Lightning
//!    `train_loss_step`, `train_loss`, `loss_step`, `loss`, ..., `train_loss_epoch`;
//! 2. the common ones: `loss`, `train_loss`, `train/loss`, `training_loss`, `train_loss_step`,
//!    `loss_step`, `total_loss`, `train/total_loss`, `train/box_loss`, `box_loss`,
//!    `train_loss_epoch`, `loss_epoch`, `avg_loss`, `average_loss`, `mean_loss`,
//!    `running_loss`;
//! 3. BasicSR's first `l_*` metric (`l_pix`, `l_mos`...);
//! 4. the first metric whose name contains `loss` and is not a `val*`/`eval*`/`test*` one
//!    (a GAN's `critic_loss`).
//!
//! **Configured signal.** The metric of that exact name, in records of any split. The
//! direction is the configured one, else inferred from the name (accuracy, mAP, F1, IoU, PSNR,
//! BLEU, reward, ... are maximised; anything else is minimised).
//!
//! **Segments: one rule for every format.** A run that restarts — from a checkpoint or from
//! scratch, appended to the same file, or in a new file its restarted writer opened (a new
//! TensorBoard event file, Lightning's next `version_N/`, a new MLflow run) — restarts its
//! counters. Each train record that carries the signal's metric is compared with the previous
//! one that did, by (epoch, step): epochs first when both have one, then steps when both have
//! one. It starts a new run when its counters
//! 1. go back, or
//! 2. repeat the previous ones exactly, and either it comes from another file, or its format
//!    writes one record per counter value ([`Format::counters_identify_records`]: the logger
//!    files — CSV, JSON lines, `trainer_state.json`, MLflow — where a repeated epoch or
//!    iteration only happens when a run resumed from a checkpoint of that point; not console
//!    output that prints a running value several times at one epoch, nor one TensorBoard
//!    file, where a loop may log a tag twice at one step).
//!
//! The first finite value after a restart is flagged `new_segment`. Only records with the
//! signal's metric are compared, so that the records of other files (MLflow writes one file
//! per metric, Keras' `validation/` run) never read as restarts; eval records never start
//! segments (MMEngine numbers its validation records by epoch, not by iteration).
//!
//! **Non-finite values** (a diverged run's `loss nan`) are reported as
//! [`SignalUpdate::NonFinite`] and never used as progress.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ParsedLog;
use super::format::Format;
use super::record::{Record, Split, is_eval_metric_name};
use governor_policy::Direction;

/// Which metric is a job's progress signal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalConfig {
    /// Metric name; `None` for the training loss under its common names.
    #[serde(default)]
    pub metric: Option<String>,
    /// Whether smaller or larger is progress; `None` to infer it from the name.
    #[serde(default)]
    pub direction: Option<Direction>,
}

/// What one record means for the signal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SignalUpdate {
    /// A finite value of the signal. `new_segment`: the first value after the log's counters
    /// restarted (a new run appended to the file).
    Value { value: f64, new_segment: bool },
    /// The record has the signal's metric but it is NaN or infinite: report, never use.
    NonFinite { value: f64 },
    /// The record does not carry the signal.
    Absent,
}

const COMMON_LOSS_NAMES: [&str; 16] = [
    "loss",
    "train_loss",
    "train/loss",
    "training_loss",
    "train_loss_step",
    "loss_step",
    "total_loss",
    "train/total_loss",
    "train/box_loss",
    "box_loss",
    "train_loss_epoch",
    "loss_epoch",
    "avg_loss",
    "average_loss",
    "mean_loss",
    "running_loss",
];

/// The record's validation loss, if it has one: the *quality signal* by which time to quality
/// is judged (`governor_policy::quality`) and by which the shortest-left policy tells a job that
/// has learnt what it will learn. The first finite metric with an eval-style name (`val_loss`,
/// `eval_loss`, `validation_loss`, `val/loss`, Lightning's `val_loss_epoch`...) that contains
/// `loss`, in records of any split; `test*` metrics are not validation. A log without one is
/// judged by its progress signal instead.
pub fn quality_value(record: &Record) -> Option<f64> {
    record.metrics.iter().find_map(|(name, value)| {
        let lower = name.to_ascii_lowercase();
        (is_eval_metric_name(name) && lower.contains("loss") && !lower.starts_with("test"))
            .then_some(value)
            .filter(|v: &f64| v.is_finite())
    })
}

/// Infers the direction of a metric from its name.
pub fn infer_direction(metric: &str) -> Direction {
    let lower = metric.to_ascii_lowercase();
    if lower.contains("loss") || lower.contains("err") || lower.contains("perplexity") {
        return Direction::Minimise;
    }
    const UP: [&str; 22] = [
        "acc",
        "map",
        "f1",
        "auc",
        "iou",
        "precision",
        "recall",
        "psnr",
        "ssim",
        "bleu",
        "rouge",
        "reward",
        "score",
        "dice",
        "top1",
        "top5",
        "srcc",
        "plcc",
        "ap50",
        "ap75",
        "return",
        "ndcg",
    ];
    let tokens: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .collect();
    let up = tokens
        .iter()
        .any(|t| UP.iter().any(|u| t.starts_with(u)) || *t == "ap" || *t == "r" || *t == "p");
    if up {
        Direction::Maximise
    } else {
        Direction::Minimise
    }
}

/// Turns a job's records into its progress signal (see the module documentation).
#[derive(Clone, Debug)]
pub struct SignalTracker {
    config: SignalConfig,
    metric: Option<Arc<str>>,
    direction: Direction,
    /// File and counters of the previous train record that carried the signal.
    last_signal: Option<(Arc<Path>, Counters)>,
    runs: u32,
    pending_new_segment: bool,
    values: u64,
    non_finite: u64,
}

impl SignalTracker {
    /// A tracker for one job's signal.
    pub fn new(config: SignalConfig) -> Self {
        let metric = config.metric.as_deref().map(Arc::from);
        let direction = config.direction.unwrap_or_else(|| {
            config
                .metric
                .as_deref()
                .map_or(Direction::Minimise, infer_direction)
        });
        SignalTracker {
            config,
            metric,
            direction,
            last_signal: None,
            runs: 0,
            pending_new_segment: false,
            values: 0,
            non_finite: 0,
        }
    }

    /// The signal's metric name, once known.
    pub fn metric(&self) -> Option<&str> {
        self.metric.as_deref()
    }

    /// Whether smaller or larger values are progress.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// Runs seen in the log so far (segments separated by counter restarts).
    pub fn runs(&self) -> u32 {
        self.runs
    }

    /// Finite values delivered so far.
    pub fn values(&self) -> u64 {
        self.values
    }

    /// NaN/infinite values reported so far.
    pub fn non_finite(&self) -> u64 {
        self.non_finite
    }

    /// Observes the next record of the job (records of all its files, in delivery order).
    pub fn observe(&mut self, record: &Record) -> SignalUpdate {
        self.runs = self.runs.max(1);
        let configured = self.config.metric.is_some();
        if !configured && record.split != Split::Train {
            return SignalUpdate::Absent;
        }
        if self.metric.is_none() {
            self.metric = resolve_default(record.format, record);
        }
        let Some(name) = &self.metric else {
            return SignalUpdate::Absent;
        };
        let Some(value) = record.metrics.get(name) else {
            return SignalUpdate::Absent;
        };
        if record.split == Split::Train {
            self.check_restart(record);
        }
        if !value.is_finite() {
            self.non_finite += 1;
            return SignalUpdate::NonFinite { value };
        }
        self.values += 1;
        let new_segment = std::mem::take(&mut self.pending_new_segment);
        SignalUpdate::Value { value, new_segment }
    }
}

impl SignalTracker {
    /// The restart rule (module documentation), for a train record with the signal's metric.
    fn check_restart(&mut self, record: &Record) {
        let counters = (record.epoch, record.step);
        if let Some((file, prev)) = &self.last_signal {
            let same_file = Arc::ptr_eq(file, &record.file) || **file == *record.file;
            let counted = counters.0.is_some() || counters.1.is_some();
            let repeated = counted
                && counters == *prev
                && (!same_file || record.format.counters_identify_records());
            if went_back(*prev, counters) || repeated {
                self.runs += 1;
                if self.values > 0 {
                    self.pending_new_segment = true;
                }
            }
        }
        match &mut self.last_signal {
            Some((file, prev)) if Arc::ptr_eq(file, &record.file) => *prev = counters,
            slot => *slot = Some((record.file.clone(), counters)),
        }
    }
}

/// A record's (epoch, step).
type Counters = (Option<f64>, Option<u64>);

/// True when the counters of `cur` are behind those of `prev`.
fn went_back(prev: Counters, cur: Counters) -> bool {
    if let (Some(a), Some(b)) = (prev.0, cur.0) {
        if b < a {
            return true;
        }
        if b > a {
            return false;
        }
    }
    matches!((prev.1, cur.1), (Some(a), Some(b)) if b < a)
}

fn resolve_default(format: Format, record: &Record) -> Option<Arc<str>> {
    let preferred = format.preferred_signal_names();
    for name in preferred.iter().chain(COMMON_LOSS_NAMES.iter()) {
        if let Some((k, _)) = record.metrics.entries().iter().find(|(k, _)| &**k == *name) {
            return Some(k.clone());
        }
    }
    let entries = record.metrics.entries();
    if format == Format::Basicsr
        && let Some((k, _)) = entries.iter().find(|(k, _)| k.starts_with("l_"))
    {
        return Some(k.clone());
    }
    entries
        .iter()
        .find(|(k, _)| k.to_ascii_lowercase().contains("loss") && !is_eval_metric_name(k))
        .map(|(k, _)| k.clone())
}

/// One line of `governor parse --summary`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub file: String,
    pub format: Format,
    pub records: u64,
    pub train_records: u64,
    pub eval_records: u64,
    /// The progress signal's metric name, if the log has one.
    pub signal: Option<String>,
    /// First and last finite values of the signal.
    pub first: Option<f64>,
    pub last: Option<f64>,
    pub runs: u32,
}

/// Summarises a parsed log under a signal configuration.
pub fn summarize(log: &ParsedLog, config: &SignalConfig) -> Summary {
    let mut tracker = SignalTracker::new(config.clone());
    let (mut first, mut last) = (None, None);
    let mut train = 0;
    for r in &log.records {
        if r.split == Split::Train {
            train += 1;
        }
        if let SignalUpdate::Value { value, .. } = tracker.observe(r) {
            first.get_or_insert(value);
            last = Some(value);
        }
    }
    let records = log.records.len() as u64;
    Summary {
        file: log.file.display().to_string(),
        format: log.format,
        records,
        train_records: train,
        eval_records: records - train,
        signal: tracker.metric().map(str::to_owned),
        first,
        last,
        runs: tracker.runs(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Metrics, RecordData};
    use std::path::Path;
    use std::time::SystemTime;

    fn rec(split: Split, epoch: Option<f64>, step: Option<u64>, m: &[(&str, f64)]) -> Record {
        rec_of(Format::PrintKv, split, epoch, step, m)
    }

    fn rec_of(
        format: Format,
        split: Split,
        epoch: Option<f64>,
        step: Option<u64>,
        m: &[(&str, f64)],
    ) -> Record {
        Record::from_data(
            Arc::from(Path::new("x")),
            format,
            0,
            SystemTime::UNIX_EPOCH,
            RecordData {
                epoch,
                step,
                split,
                metrics: m
                    .iter()
                    .map(|(k, v)| (Arc::from(*k), *v))
                    .collect::<Metrics>(),
            },
        )
    }

    #[test]
    fn default_signal_locks_on_the_first_loss_name() {
        let mut t = SignalTracker::new(SignalConfig::default());
        let u = t.observe(&rec(Split::Train, Some(0.1), None, &[("loss", 1.0)]));
        assert_eq!(
            u,
            SignalUpdate::Value {
                value: 1.0,
                new_segment: false
            }
        );
        // An HF summary with train_loss only is not progress.
        let u = t.observe(&rec(Split::Train, Some(3.0), None, &[("train_loss", 0.3)]));
        assert_eq!(u, SignalUpdate::Absent);
        // Eval records are not the training loss.
        let u = t.observe(&rec(Split::Eval, Some(3.0), None, &[("loss", 0.3)]));
        assert_eq!(u, SignalUpdate::Absent);
        assert_eq!(t.metric(), Some("loss"));
        assert_eq!(t.direction(), Direction::Minimise);
    }

    #[test]
    fn restarts_start_segments_and_nan_is_reported() {
        let mut t = SignalTracker::new(SignalConfig::default());
        let e = |ep: f64, v: f64| rec(Split::Train, Some(ep), None, &[("loss", v)]);
        assert!(matches!(
            t.observe(&e(0.0, 1.0)),
            SignalUpdate::Value {
                new_segment: false,
                ..
            }
        ));
        assert!(matches!(
            t.observe(&e(1.0, 0.5)),
            SignalUpdate::Value {
                new_segment: false,
                ..
            }
        ));
        assert!(matches!(
            t.observe(&e(0.0, f64::NAN)),
            SignalUpdate::NonFinite { .. }
        ));
        assert_eq!(
            t.observe(&e(1.0, 0.9)),
            SignalUpdate::Value {
                value: 0.9,
                new_segment: true
            }
        );
        assert_eq!(t.runs(), 2);
        assert_eq!(t.non_finite(), 1);
    }

    fn rec_in(
        file: &str,
        format: Format,
        epoch: Option<f64>,
        step: Option<u64>,
        m: (&str, f64),
    ) -> Record {
        let mut r = rec_of(format, Split::Train, epoch, step, &[m]);
        r.file = Arc::from(Path::new(file));
        r
    }

    #[test]
    fn a_repeated_counter_is_a_restart_in_logger_files_only() {
        // JSON lines: resumed from the checkpoint of iteration 20, it logs iteration 20 again.
        let mut t = SignalTracker::new(SignalConfig::default());
        let mut new_segments = Vec::new();
        for (step, v) in [(0, 1.0), (10, 0.8), (20, 0.6), (20, 0.7), (30, 0.5)] {
            let u = t.observe(&rec_in(
                "m.json",
                Format::JsonLines,
                None,
                Some(step),
                ("loss", v),
            ));
            if let SignalUpdate::Value { new_segment, .. } = u {
                new_segments.push(new_segment);
            }
        }
        assert_eq!(new_segments, [false, false, false, true, false]);
        assert_eq!(t.runs(), 2);
        // A running average printed ten times an epoch is one run.
        let mut t = SignalTracker::new(SignalConfig::default());
        for (epoch, v) in [(1.0, 0.5), (1.0, 0.4), (1.0, 0.35), (2.0, 0.3), (2.0, 0.3)] {
            t.observe(&rec_in(
                "train.log",
                Format::PrintKv,
                Some(epoch),
                None,
                ("loss", v),
            ));
        }
        assert_eq!(t.runs(), 1);
        // One TensorBoard file may log a tag twice at one step; a restarted writer's new file
        // that repeats the step is a new run.
        let mut t = SignalTracker::new(SignalConfig::default());
        let tb = |file, step, v| rec_in(file, Format::TensorBoard, None, Some(step), ("loss", v));
        t.observe(&tb("a/events.out.tfevents.1", 5, 1.0));
        t.observe(&tb("a/events.out.tfevents.1", 5, 0.9));
        assert_eq!(t.runs(), 1);
        t.observe(&tb("a/events.out.tfevents.2", 5, 0.8));
        assert_eq!(t.runs(), 2);
    }

    #[test]
    fn files_without_the_signal_never_restart_it() {
        // MLflow's file store: one file per metric, each read from its start.
        let mut t = SignalTracker::new(SignalConfig::default());
        for step in 0..5 {
            t.observe(&rec_in(
                "run/metrics/loss",
                Format::MlflowFile,
                None,
                Some(step),
                ("loss", 1.0),
            ));
        }
        for step in 0..5 {
            t.observe(&rec_in(
                "run/metrics/accuracy",
                Format::MlflowFile,
                None,
                Some(step),
                ("accuracy", 0.5),
            ));
        }
        assert_eq!(t.runs(), 1);
        // Lightning's next version_N/ starts its steps again: a new run.
        let u = t.observe(&rec_in(
            "v1/events.out.tfevents.9",
            Format::TensorBoard,
            None,
            Some(0),
            ("loss", 2.0),
        ));
        assert_eq!(
            u,
            SignalUpdate::Value {
                value: 2.0,
                new_segment: true
            }
        );
        assert_eq!(t.runs(), 2);
    }

    #[test]
    fn epochs_then_steps_decide_a_restart() {
        assert!(!went_back((Some(1.0), Some(1000)), (Some(2.0), Some(100))));
        assert!(went_back((Some(0.0), Some(2600)), (Some(0.0), Some(1300))));
        assert!(went_back((None, Some(500)), (None, Some(0))));
        assert!(!went_back((Some(1.0), Some(1000)), (Some(1.0), None)));
        assert!(!went_back((Some(1.0), None), (None, Some(0))));
    }

    #[test]
    fn fallbacks_and_configured_metrics() {
        let r = rec_of(
            Format::LightningCsv,
            Split::Train,
            None,
            None,
            &[
                ("cl_fake", -0.01),
                ("critic_loss", -3e-5),
                ("generator_loss", 0.01),
            ],
        );
        let mut t = SignalTracker::new(SignalConfig::default());
        t.observe(&r);
        assert_eq!(t.metric(), Some("critic_loss"));

        let r = rec_of(
            Format::Basicsr,
            Split::Train,
            None,
            None,
            &[("lr", 1e-5), ("l_mos", 8e-3)],
        );
        let mut t = SignalTracker::new(SignalConfig::default());
        t.observe(&r);
        assert_eq!(t.metric(), Some("l_mos"));
        // Without the format's hint, BasicSR's l_* losses are not recognised.
        let r = rec(Split::Train, None, None, &[("lr", 1e-5), ("l_mos", 8e-3)]);
        let mut t = SignalTracker::new(SignalConfig::default());
        t.observe(&r);
        assert_eq!(t.metric(), None);

        let mut t = SignalTracker::new(SignalConfig {
            metric: Some("val_accuracy".into()),
            direction: None,
        });
        assert_eq!(t.direction(), Direction::Maximise);
        let r = rec(Split::Eval, None, None, &[("val_accuracy", 0.9)]);
        assert!(matches!(t.observe(&r), SignalUpdate::Value { .. }));
    }

    #[test]
    fn direction_inference() {
        for up in [
            "val_accuracy",
            "metrics/mAP50(B)",
            "bbox/AP",
            "eval_f1",
            "top1",
            "psnr",
        ] {
            assert_eq!(infer_direction(up), Direction::Maximise, "{up}");
        }
        for down in ["loss", "val_loss", "perplexity", "top1_err", "lr", "cer"] {
            assert_eq!(infer_direction(down), Direction::Minimise, "{down}");
        }
    }

    #[test]
    fn the_quality_signal_is_the_validation_loss() {
        let rec = |pairs: &[(&str, f64)]| rec(Split::Train, Some(1.0), None, pairs);
        assert_eq!(
            quality_value(&rec(&[("loss", 0.5), ("val_loss", 0.7)])),
            Some(0.7)
        );
        assert_eq!(quality_value(&rec(&[("eval_loss", 0.3)])), Some(0.3));
        assert_eq!(
            quality_value(&rec(&[("val_acc", 0.9), ("val/loss", 0.2)])),
            Some(0.2)
        );
        assert_eq!(
            quality_value(&rec(&[("loss", 0.5), ("test_loss", 0.4)])),
            None
        );
        assert_eq!(quality_value(&rec(&[("val_loss", f64::NAN)])), None);
    }
}
