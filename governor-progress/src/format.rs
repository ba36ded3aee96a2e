//! The supported log formats: names (stable: printed by `governor parse`, accepted by
//! `--format` and job configurations), one-line examples, and how strongly a match identifies
//! the format during auto-detection.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A training-log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// Hugging Face `trainer_state.json` (`log_history`), rewritten whole at every save.
    HfTrainerState,
    /// PyTorch Lightning `CSVLogger` `metrics.csv` (sparse rows sharing `step`).
    LightningCsv,
    /// Keras `CSVLogger` (`epoch,...` one row per epoch).
    KerasCsv,
    /// Ultralytics YOLO `results.csv` (v5, v8, 11, 26; padded or not).
    UltralyticsCsv,
    /// Detectron2 `metrics.json` (JSON lines with `iteration`).
    Detectron2Json,
    /// MMEngine `scalars.json` / `vis_data/*.json` (JSON lines with `step`).
    MmengineJson,
    /// DeiT / DETR / MAE-style `log.txt` (JSON lines, one per epoch, `train_*`/`test_*`).
    DeitJsonl,
    /// Hugging Face Trainer console dicts `{'loss': 0.69, ...}` (numbers quoted or not).
    HfConsole,
    /// Keras `fit()` console output (Keras 1, 2 and 3).
    KerasConsole,
    /// Ultralytics YOLO console table (`Epoch GPU_mem box_loss ...` + the `all` val row).
    UltralyticsConsole,
    /// pytorch/examples-style `Train Epoch: 1 [0/60000 (0%)]\tLoss: ...`.
    PytorchExamples,
    /// nanoGPT `iter N: loss X, time Yms, mfu Z%` and `step N: train loss X, val loss Y`.
    Nanogpt,
    /// Caffe glog `Iteration N (...), loss = X` and `Test net output #k: name = v`.
    CaffeGlog,
    /// BasicSR / pyiqa `MessageLogger` `[epoch:  0, iter:   100, lr:(...)] ... l_pix: 1e-2`.
    Basicsr,
    /// tqdm progress bars with a numeric postfix (`loss=0.23`), e.g. Lightning's bar.
    Tqdm,
    /// Any JSON-lines log with metric-like keys.
    JsonLines,
    /// Generic print/logging lines (`epoch 3, loss 0.25, acc 91.2%`, `Epoch [5/50], Loss: ...`).
    PrintKv,
    /// TensorBoard event files `events.out.tfevents.*` (TFRecord framing, `Event` messages).
    TensorBoard,
    /// MLflow's file store: `mlruns/<experiment>/<run>/metrics/<key>`, `timestamp value step`.
    MlflowFile,
    /// MLflow's SQLite tracking store (`mlflow.db`, MLflow 3's default for a local run).
    MlflowSqlite,
    /// A job's own regular expression with named captures.
    Custom,
}

/// How a format competes during auto-detection (see [`crate::detect`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strength {
    /// One recognised structure (a header, a document, a line no other log writes) decides.
    Strong,
    /// Generic shapes that noise can imitate: several records are needed.
    Weak,
}

impl Format {
    /// Every format, in auto-detection priority order (earlier wins a tie).
    pub const ALL: [Format; 21] = [
        Format::HfTrainerState,
        Format::UltralyticsCsv,
        Format::LightningCsv,
        Format::KerasCsv,
        Format::Detectron2Json,
        Format::MmengineJson,
        Format::DeitJsonl,
        Format::HfConsole,
        Format::KerasConsole,
        Format::UltralyticsConsole,
        Format::PytorchExamples,
        Format::Nanogpt,
        Format::CaffeGlog,
        Format::Basicsr,
        Format::Tqdm,
        Format::JsonLines,
        Format::PrintKv,
        Format::TensorBoard,
        Format::MlflowFile,
        Format::MlflowSqlite,
        Format::Custom,
    ];

    /// The stable name.
    pub fn name(self) -> &'static str {
        match self {
            Format::HfTrainerState => "hf_trainer_state",
            Format::LightningCsv => "lightning_csv",
            Format::KerasCsv => "keras_csv",
            Format::UltralyticsCsv => "ultralytics_csv",
            Format::Detectron2Json => "detectron2_json",
            Format::MmengineJson => "mmengine_json",
            Format::DeitJsonl => "deit_jsonl",
            Format::HfConsole => "hf_console",
            Format::KerasConsole => "keras_console",
            Format::UltralyticsConsole => "ultralytics_console",
            Format::PytorchExamples => "pytorch_examples",
            Format::Nanogpt => "nanogpt",
            Format::CaffeGlog => "caffe_glog",
            Format::Basicsr => "basicsr",
            Format::Tqdm => "tqdm",
            Format::JsonLines => "json_lines",
            Format::PrintKv => "print_kv",
            Format::TensorBoard => "tensorboard",
            Format::MlflowFile => "mlflow_file",
            Format::MlflowSqlite => "mlflow_sqlite",
            Format::Custom => "custom",
        }
    }

    /// Other names accepted by `--format` (those of the fixtures' INDEX.tsv among them).
    fn aliases(self) -> &'static [&'static str] {
        match self {
            Format::HfTrainerState => &["trainer_state", "trainer_state.json"],
            Format::LightningCsv => &["lightning_csvlogger", "lightning"],
            Format::KerasCsv => &["keras_csvlogger"],
            Format::UltralyticsCsv => &["ultralytics_results_csv", "yolo_csv", "results.csv"],
            Format::Detectron2Json => &["detectron2_metrics_json", "detectron2"],
            Format::MmengineJson => &["mmengine_scalars_json", "mmengine"],
            Format::DeitJsonl => &["deit", "detr", "log.txt"],
            Format::HfConsole => &["hf_stdout"],
            Format::KerasConsole => &["keras_stdout"],
            Format::UltralyticsConsole => &["yolov5_console_tqdm", "yolo_console"],
            Format::PytorchExamples => &["pytorch_examples_mnist_stdout"],
            Format::Nanogpt => &["nanogpt_stdout"],
            Format::CaffeGlog => &["caffe"],
            Format::Basicsr => &["basicsr_pyiqa_logger"],
            Format::Tqdm => &["tqdm_postfix"],
            Format::JsonLines => &["jsonl", "json"],
            Format::PrintKv => &[
                "print",
                "pytorch_print_logging",
                "pytorch_print_stdout",
                "print_stdout",
            ],
            Format::TensorBoard => &["tfevents", "tensorboard_events", "tensorboardx"],
            Format::MlflowFile => &["mlruns", "mlflow_file_store"],
            Format::MlflowSqlite => &["mlflow", "mlflow.db", "mlflow_db"],
            Format::Custom => &["regex"],
        }
    }

    /// Looks a format up by name or alias (case-insensitive).
    pub fn from_name(name: &str) -> Option<Format> {
        let name = name.trim();
        Format::ALL.into_iter().find(|f| {
            f.name().eq_ignore_ascii_case(name)
                || f.aliases().iter().any(|a| a.eq_ignore_ascii_case(name))
        })
    }

    /// One line saying what the format is.
    pub fn description(self) -> &'static str {
        match self {
            Format::HfTrainerState => {
                "Hugging Face Trainer trainer_state.json (log_history; re-read when rewritten)"
            }
            Format::LightningCsv => "PyTorch Lightning CSVLogger metrics.csv",
            Format::KerasCsv => "Keras CSVLogger (append=True runs become segments)",
            Format::UltralyticsCsv => "Ultralytics YOLO results.csv (v5/v8/11/26)",
            Format::Detectron2Json => "Detectron2 metrics.json (JSON lines)",
            Format::MmengineJson => "MMEngine scalars.json / vis_data JSON lines",
            Format::DeitJsonl => "DeiT/DETR-style log.txt (one JSON object per epoch)",
            Format::HfConsole => "Hugging Face Trainer console dicts",
            Format::KerasConsole => "Keras fit() console (Keras 1/2/3, TTY or not)",
            Format::UltralyticsConsole => "Ultralytics YOLO console table",
            Format::PytorchExamples => "pytorch/examples-style Train Epoch lines",
            Format::Nanogpt => "nanoGPT train.py output",
            Format::CaffeGlog => "Caffe glog solver output",
            Format::Basicsr => "BasicSR / pyiqa MessageLogger",
            Format::Tqdm => "tqdm bars with a numeric postfix (Lightning progress bar)",
            Format::JsonLines => "generic JSON lines with metric-like keys",
            Format::PrintKv => "generic print/logging key-value lines",
            Format::TensorBoard => {
                "TensorBoard event files (SummaryWriter, tf.summary, Keras, Lightning; a log directory)"
            }
            Format::MlflowFile => "MLflow file store metrics (mlruns/<exp>/<run>/metrics/<key>)",
            Format::MlflowSqlite => "MLflow SQLite tracking store (mlflow.db; read-only)",
            Format::Custom => "a job's regex with named captures (epoch, step, split, metrics)",
        }
    }

    /// A one-line example of the format.
    pub fn example(self) -> &'static str {
        match self {
            Format::HfTrainerState => {
                r#"{ "log_history": [ {"epoch": 0.16, "loss": 0.6899, "step": 20}, ... ] }"#
            }
            Format::LightningCsv => "epoch,step,train_loss,val_loss / 0,49,0.63,",
            Format::KerasCsv => "epoch,accuracy,loss,val_accuracy,val_loss / 0,0.28,1.78,0.17,1.90",
            Format::UltralyticsCsv => {
                "epoch,train/box_loss,train/cls_loss,metrics/mAP50(B),val/box_loss / 1,1.69,3.39,0.16,2.34"
            }
            Format::Detectron2Json => {
                r#"{"iteration": 19, "loss_cls": 0.73, "lr": 1.6e-05, "total_loss": 2.04}"#
            }
            Format::MmengineJson => {
                r#"{"lr": 0.001, "loss": 2.23, "epoch": 1, "iter": 50, "step": 50}"#
            }
            Format::DeitJsonl => {
                r#"{"train_lr": 0.001, "train_loss": 6.91, "test_acc1": 0.17, "epoch": 0, "n_parameters": 5717416}"#
            }
            Format::HfConsole => {
                "{'loss': 0.6899, 'grad_norm': 0.75, 'learning_rate': 0.00019, 'epoch': 0.16}"
            }
            Format::KerasConsole => {
                "313/313 [==============================] - 351s 1s/step - loss: 0.6855 - acc: 0.5609 - val_loss: 0.6710"
            }
            Format::UltralyticsConsole => {
                "      1/100      2.61G      1.234      2.345      1.456         12        640: 100%|██████████| 401/401"
            }
            Format::PytorchExamples => "Train Epoch: 1 [640/60000 (1%)]    Loss: 1.425063",
            Format::Nanogpt => "iter 100: loss 3.4880, time 105.35ms, mfu 0.01%",
            Format::CaffeGlog => {
                "I0728 23:56:00.280272  4259 solver.cpp:218] Iteration 100 (4.71 iter/s, 21.2s/100 iters), loss = 0.224371"
            }
            Format::Basicsr => {
                "INFO: [train..][epoch:  0, iter:     100, lr:(3.000e-05,)] [eta: 4:06:17, time (data): 1.663 (0.247)] l_pix: 8.1951e-03"
            }
            Format::Tqdm => {
                "Epoch 3:  45%|████▌     | 450/1000 [00:30<00:36, 15.0it/s, loss=0.234, v_num=0]"
            }
            Format::JsonLines => r#"{"epoch": 3, "step": 1200, "loss": 0.25, "val_loss": 0.31}"#,
            Format::PrintKv => "Epoch [3/50], Step [100/600], Loss: 0.2534, Acc: 91.2%",
            Format::TensorBoard => {
                "runs/exp1/events.out.tfevents.1732790112.node1.4242.0 (binary: step 120, Loss/train 0.53)"
            }
            Format::MlflowFile => "mlruns/0/<run id>/metrics/loss: 1732790112345 0.5312 120",
            Format::MlflowSqlite => {
                "mlflow.db: metrics(key, value, timestamp, step, run_uuid) rows, followed by rowid"
            }
            Format::Custom => r#"regex = '^it=(?P<step>\d+) L=(?P<loss>\S+)$'"#,
        }
    }

    pub(crate) fn strength(self) -> Strength {
        match self {
            Format::JsonLines | Format::PrintKv => Strength::Weak,
            _ => Strength::Strong,
        }
    }

    /// Metric names this format's training loss goes by, tried before the common list (see
    /// [`crate::signal`]).
    pub(crate) fn preferred_signal_names(self) -> &'static [&'static str] {
        match self {
            Format::Detectron2Json => &["total_loss"],
            Format::UltralyticsCsv => &["train/box_loss", "train/loss"],
            Format::UltralyticsConsole => &["box_loss", "box", "loss"],
            Format::LightningCsv => &[
                "train_loss_step",
                "train_loss",
                "loss_step",
                "loss",
                "train/loss_step",
                "train/loss",
                "train_loss_epoch",
                "loss_epoch",
            ],
            // Tags as PyTorch's tutorials, Lightning, Hugging Face and Keras write them, per
            // step before per epoch.
            Format::TensorBoard => &[
                "train_loss_step",
                "loss",
                "train/loss",
                "train_loss",
                "batch_loss",
                "Loss/train",
                "loss/train",
                "training loss",
                "train/epoch_loss",
                "epoch_loss",
                "train_loss_epoch",
            ],
            _ => &[],
        }
    }

    /// True for formats that are a whole document rewritten in place (re-read on every
    /// close-after-write) rather than an append-only log.
    pub fn is_document(self) -> bool {
        matches!(self, Format::HfTrainerState)
    }

    /// True for formats whose records are written once per counter value, so that a record
    /// repeating the counters of the previous one in the same file is a restarted run (see
    /// [`crate::signal`]): the logger files. Console output is not: a running average printed
    /// several times an epoch, a tqdm bar refreshed at one step, Hugging Face's epoch rounded
    /// to two decimals all repeat counters within one run. Nor is a TensorBoard event file:
    /// each writer opens a file of its own, and a loop may log one tag twice at one step.
    pub fn counters_identify_records(self) -> bool {
        matches!(
            self,
            Format::HfTrainerState
                | Format::LightningCsv
                | Format::KerasCsv
                | Format::UltralyticsCsv
                | Format::Detectron2Json
                | Format::MmengineJson
                | Format::DeitJsonl
                | Format::JsonLines
                | Format::PytorchExamples
                | Format::Nanogpt
                | Format::CaffeGlog
                | Format::Basicsr
                | Format::MlflowFile
                | Format::MlflowSqlite
        )
    }

    /// True for formats read from bytes that are not lines (or not bytes at all): they are not
    /// candidates of line-based detection.
    pub(crate) fn is_line_format(self) -> bool {
        !matches!(
            self,
            Format::TensorBoard | Format::MlflowFile | Format::MlflowSqlite | Format::Custom
        )
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = UnknownFormatName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::from_name(s).ok_or_else(|| UnknownFormatName(s.to_owned()))
    }
}

impl Serialize for Format {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Format {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A format name that no format has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown log format {0:?} (`governor formats` lists them)")]
pub struct UnknownFormatName(pub String);

/// Which format(s) to parse a file as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FormatChoice {
    /// Detect the format from the content (the default).
    #[default]
    Auto,
    /// Parse as this format only.
    Fixed(Format),
}

impl FromStr for FormatChoice {
    type Err = UnknownFormatName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(FormatChoice::Auto)
        } else {
            s.parse().map(FormatChoice::Fixed)
        }
    }
}

impl fmt::Display for FormatChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatChoice::Auto => f.write_str("auto"),
            FormatChoice::Fixed(format) => f.write_str(format.name()),
        }
    }
}

impl Serialize for FormatChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FormatChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for f in Format::ALL {
            assert_eq!(Format::from_name(f.name()), Some(f));
            assert!(seen.insert(f.name()), "duplicate name {}", f.name());
            for a in f.aliases() {
                assert_eq!(Format::from_name(a), Some(f), "alias {a}");
            }
        }
    }

    #[test]
    fn format_choice_parses_auto_and_names() {
        assert_eq!("auto".parse::<FormatChoice>(), Ok(FormatChoice::Auto));
        assert_eq!(
            "keras_csv".parse::<FormatChoice>(),
            Ok(FormatChoice::Fixed(Format::KerasCsv))
        );
        assert!("nope".parse::<FormatChoice>().is_err());
    }

    #[test]
    fn examples_are_one_line() {
        for f in Format::ALL {
            // `governor formats` prints tab-separated columns.
            assert!(
                !f.example().contains(['\n', '\t']),
                "{f} example has a newline or tab"
            );
            assert!(!f.description().contains(['\n', '\t']), "{f} description");
        }
    }
}
