//! One incremental parser per format. Each is fed complete, cleaned lines (see
//! [`super::lines`]) and keeps whatever state its format needs between lines: a CSV header,
//! the epoch announced by a Keras `Epoch 3/40` line, the table header of a YOLO console, the
//! document being rewritten by Hugging Face.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::format::Format;
use super::record::{Metrics, RecordData, Split, is_eval_metric_name};

pub(crate) mod csv;
pub(crate) mod custom;
pub(crate) mod hf;
pub(crate) mod jsonl;
pub(crate) mod keras;
pub(crate) mod kv;
pub(crate) mod mlflow;
pub(crate) mod text;
pub(crate) mod ultralytics;

/// What a parser can say about the input so far, for auto-detection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Nothing conclusive yet.
    Undetermined,
    /// The format's structure was seen (a header, a document): this is the format, even if
    /// no record has been produced yet.
    Recognized,
    /// The input cannot be in this format (a CSV whose first line is no header).
    Rejected,
}

/// An incremental parser of one format.
pub(crate) trait LineParser: Send {
    /// Parses one complete line (no terminator, never empty) and appends the records it
    /// completes.
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>);

    /// The input ended (or the writer closed the file): emit what is held back.
    fn flush(&mut self, _out: &mut Vec<RecordData>) {}

    /// Detection status (see [`Status`]).
    fn status(&self) -> Status {
        Status::Undetermined
    }

    /// The file was truncated or replaced: a document format starts over; line formats keep
    /// their state (a logger that copytruncates goes on writing rows under the same header).
    fn restart(&mut self) {}
}

/// Builds the parser of a built-in format (not [`Format::Custom`], which needs its regex).
pub(crate) fn parser_for(format: Format) -> Option<Box<dyn LineParser>> {
    Some(match format {
        Format::HfTrainerState => Box::new(hf::TrainerState::new()),
        Format::HfConsole => Box::new(hf::ConsoleDicts::new()),
        Format::LightningCsv => Box::new(csv::CsvParser::new(csv::Dialect::Lightning)),
        Format::KerasCsv => Box::new(csv::CsvParser::new(csv::Dialect::Keras)),
        Format::UltralyticsCsv => Box::new(csv::CsvParser::new(csv::Dialect::Ultralytics)),
        Format::Detectron2Json => Box::new(jsonl::JsonlParser::new(jsonl::Dialect::Detectron2)),
        Format::MmengineJson => Box::new(jsonl::JsonlParser::new(jsonl::Dialect::Mmengine)),
        Format::DeitJsonl => Box::new(jsonl::JsonlParser::new(jsonl::Dialect::Deit)),
        Format::JsonLines => Box::new(jsonl::JsonlParser::new(jsonl::Dialect::Generic)),
        Format::KerasConsole => Box::new(keras::KerasConsole::new()),
        Format::UltralyticsConsole => Box::new(ultralytics::Console::new()),
        Format::PytorchExamples => Box::new(text::PytorchExamples::new()),
        Format::Nanogpt => Box::new(text::Nanogpt::new()),
        Format::CaffeGlog => Box::new(text::Caffe::new()),
        Format::Basicsr => Box::new(text::Basicsr::new()),
        Format::Tqdm => Box::new(text::Tqdm::new()),
        Format::PrintKv => Box::new(kv::PrintKv::new()),
        // Named by the file's path: see `LogStream::new`.
        Format::MlflowFile => Box::new(mlflow::MetricFile::new("value")),
        Format::TensorBoard | Format::MlflowSqlite | Format::Custom => return None,
    })
}

/// Shares metric-name strings between the records of one file. Bounded: hostile input with
/// endless distinct keys stops being interned (names are then allocated per record), which
/// also bounds what colliding keys can cost with the fast, non-keyed hash used here.
#[derive(Debug, Default)]
pub(crate) struct Names {
    map: HashMap<Box<str>, Arc<str>, BuildHasherDefault<NameHasher>>,
}

/// FxHash-style multiply-rotate hash: metric names are short, SipHash showed up in profiles.
#[derive(Default)]
pub(crate) struct NameHasher(u64);

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Names {
    const MAX: usize = 4096;

    pub(crate) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(a) = self.map.get(name) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(name);
        if self.map.len() < Self::MAX {
            self.map.insert(name.into(), a.clone());
        }
        a
    }
}

/// `Eval` when every metric of the record is named as a held-out measurement (`val_*`,
/// `eval_*`, `test_*`), `Train` otherwise.
pub(crate) fn split_by_names(metrics: &Metrics) -> Split {
    if !metrics.is_empty() && metrics.iter().all(|(k, _)| is_eval_metric_name(k)) {
        Split::Eval
    } else {
        Split::Train
    }
}

/// Words that make a key look like a training metric (used by the generic formats to tell a
/// metric from any other number a program prints).
pub(crate) fn is_metric_like(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    if lower.contains("loss")
        || lower.contains("acc")
        || lower.contains("perplexity")
        || lower.contains("top1")
        || lower.contains("top5")
    {
        return true;
    }
    const WORDS: [&str; 21] = [
        "ppl",
        "f1",
        "map",
        "miou",
        "iou",
        "auc",
        "bleu",
        "rouge",
        "psnr",
        "ssim",
        "mse",
        "mae",
        "rmse",
        "reward",
        "precision",
        "recall",
        "dice",
        "wer",
        "cer",
        "nll",
        "err",
    ];
    lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| !t.is_empty())
        .any(|tok| {
            WORDS.iter().any(|w| {
                tok == *w
                    || (tok.starts_with(w)
                        && tok.len() > w.len()
                        && tok[w.len()..].bytes().all(|b| b.is_ascii_digit()))
            })
        })
}

/// Role of a key in formats that mix counters and metrics in one mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyRole {
    Epoch,
    Step,
    Metric,
}

/// Counter names shared by the generic formats.
pub(crate) fn generic_key_role(key: &str) -> KeyRole {
    match key.to_ascii_lowercase().as_str() {
        "epoch" | "ep" => KeyRole::Epoch,
        "step"
        | "global_step"
        | "globalstep"
        | "iter"
        | "iters"
        | "iteration"
        | "it"
        | "_step"
        | "trainer/global_step"
        | "train/global_step"
        | "iteration_step"
        | "batch"
        | "steps"
        | "update"
        | "updates" => KeyRole::Step,
        _ => KeyRole::Metric,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_like_keys() {
        for k in [
            "loss",
            "train loss",
            "val_acc",
            "Accuracy",
            "mAP50",
            "top 1 acc",
            "bleu4",
            "f1",
            "PPL",
            "mIoU",
        ] {
            assert!(is_metric_like(k), "{k}");
        }
        for k in [
            "learning rate",
            "lr",
            "total sample is",
            "Epochs",
            "Size",
            "mapping",
            "time",
            "HTTP Error",
        ] {
            assert!(!is_metric_like(k), "{k}");
        }
    }

    #[test]
    fn split_follows_metric_names() {
        let m: Metrics = [("val_loss".into(), 1.0), ("val_acc".into(), 0.5)]
            .into_iter()
            .collect();
        assert_eq!(split_by_names(&m), Split::Eval);
        let m: Metrics = [("loss".into(), 1.0), ("val_acc".into(), 0.5)]
            .into_iter()
            .collect();
        assert_eq!(split_by_names(&m), Split::Train);
        assert_eq!(split_by_names(&Metrics::new()), Split::Train);
    }
}
