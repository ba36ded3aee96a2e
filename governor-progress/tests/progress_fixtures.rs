//! Every real training log in `shared/fixtures/logs` parses with its expected format, record
//! counts and first/last progress-signal values — as stored, with the line endings its
//! original had (INDEX.tsv), and fed in small appends as a watcher would.
//!
//! The expected values were read off the files independently of the parser (Python's csv,
//! json and ast modules, grep) and are written down here, not computed.

mod common;

use std::path::Path;
use std::time::SystemTime;

use common::{fixtures_dir, seen};
use governor_progress::{
    Format, FormatChoice, LogStream, ParsedLog, SignalConfig, parse_bytes_with, summarize,
};

/// How the original file ended its lines (INDEX.tsv), restored before parsing again.
#[derive(Clone, Copy, Debug)]
enum Original {
    Lf,
    Crlf,
    /// tqdm refreshed its bar with `\r`; the copy has them as separate lines or fused.
    TqdmCr,
}

struct Expect {
    path: &'static str,
    format: Format,
    records: u64,
    train: u64,
    eval: u64,
    signal: &'static str,
    first: f64,
    last: f64,
    runs: u32,
    original: Original,
}

#[rustfmt::skip]
const EXPECTED: &[Expect] = &[
    Expect { path: "hf_trainer/lora-imdb-distilbert_trainer_state.json", format: Format::HfTrainerState, records: 21, train: 18, eval: 3, signal: "loss", first: 0.6899, last: 0.349, runs: 1, original: Original::Lf },
    Expect { path: "hf_trainer/bert-weibo-rumor_trainer_state.json", format: Format::HfTrainerState, records: 52, train: 52, eval: 0, signal: "loss", first: 0.981, last: 0.1636, runs: 1, original: Original::Lf },
    Expect { path: "hf_trainer/financial-news-sentiment_trainer_state.json", format: Format::HfTrainerState, records: 30, train: 20, eval: 10, signal: "loss", first: 1.497, last: 1.1573, runs: 1, original: Original::Lf },
    Expect { path: "hf_console/interviewmate-falcon-lora_README_InterviewMate.md", format: Format::HfConsole, records: 48, train: 48, eval: 0, signal: "loss", first: 3.0122, last: 2.819, runs: 3, original: Original::TqdmCr },
    Expect { path: "hf_console/indot5-lora-colab_domain-adapt-finetune.md", format: Format::HfConsole, records: 27, train: 21, eval: 6, signal: "loss", first: 19.85, last: 18.3, runs: 1, original: Original::TqdmCr },
    Expect { path: "lightning_csv/slm-training-lm_metrics.csv", format: Format::LightningCsv, records: 154, train: 134, eval: 20, signal: "train_loss_step", first: 8.620475769042969, last: 5.1495232582092285, runs: 1, original: Original::Crlf },
    Expect { path: "lightning_csv/cv-image-classification_metrics.csv", format: Format::LightningCsv, records: 178, train: 171, eval: 7, signal: "train_loss", first: 0.634955883026123, last: 0.021989192813634872, runs: 1, original: Original::Crlf },
    Expect { path: "lightning_csv/conditional-wgan-solar_version_1_metrics.csv", format: Format::LightningCsv, records: 28, train: 28, eval: 0, signal: "critic_loss", first: -3.098510205745697e-05, last: -1.3938173651695251e-05, runs: 1, original: Original::Crlf },
    Expect { path: "keras_csv/cat-classifier_training.log", format: Format::KerasCsv, records: 50, train: 50, eval: 0, signal: "loss", first: 7.258389949798584, last: 0.2605608403682709, runs: 2, original: Original::Crlf },
    Expect { path: "keras_csv/car-prediction-cnn_training.log", format: Format::KerasCsv, records: 100, train: 100, eval: 0, signal: "loss", first: 1.7800995111465454, last: 0.3073320984840393, runs: 1, original: Original::Lf },
    Expect { path: "keras_csv/tomato-leaf-cnn_training_log.csv", format: Format::KerasCsv, records: 29, train: 29, eval: 0, signal: "loss", first: 1.843022346496582, last: 0.091253668, runs: 1, original: Original::Crlf },
    Expect { path: "yolo_results_csv/yolov8-fire-smoke_results.csv", format: Format::UltralyticsCsv, records: 25, train: 25, eval: 0, signal: "train/box_loss", first: 1.6878, last: 0.93868, runs: 1, original: Original::Lf },
    Expect { path: "yolo_results_csv/yolov5-anpr_results.csv", format: Format::UltralyticsCsv, records: 20, train: 20, eval: 0, signal: "train/box_loss", first: 0.067453, last: 0.024024, runs: 1, original: Original::Lf },
    Expect { path: "yolo_results_csv/yolov8-cls-fruits-veg_results.csv", format: Format::UltralyticsCsv, records: 20, train: 20, eval: 0, signal: "train/loss", first: 2.9436, last: 0.1859, runs: 1, original: Original::Lf },
    Expect { path: "detectron2_metrics/train-detectron2-maskrcnn_metrics.json", format: Format::Detectron2Json, records: 15, train: 15, eval: 0, signal: "total_loss", first: 2.0359768134658225, last: 0.26559973329131026, runs: 1, original: Original::Lf },
    Expect { path: "detectron2_metrics/orbital-object-detector_metrics.json", format: Format::Detectron2Json, records: 28, train: 28, eval: 0, signal: "total_loss", first: 2.1299018138088286, last: 0.4102901240767096, runs: 1, original: Original::Lf },
    Expect { path: "mmengine_scalars/mmdet-fish-multihead_vis_20250709_234619.json", format: Format::MmengineJson, records: 41, train: 14, eval: 27, signal: "loss", first: 2.4471621322631836, last: 17.95837257385254, runs: 1, original: Original::Lf },
    Expect { path: "mmengine_scalars/mmseg-smoketest_scalars.json", format: Format::MmengineJson, records: 12, train: 6, eval: 6, signal: "loss", first: 2.2310495376586914, last: 1.9954503575960796, runs: 1, original: Original::Lf },
    Expect { path: "nanogpt_style/nanogpt-shakespeare-char-termux_train.log", format: Format::Nanogpt, records: 96, train: 91, eval: 5, signal: "loss", first: 4.2709, last: 3.5023, runs: 1, original: Original::Lf },
    Expect { path: "other_formats/caffe-lenet-mnist_train.log", format: Format::CaffeGlog, records: 2, train: 2, eval: 0, signal: "loss", first: 2.40473, last: 0.224371, runs: 1, original: Original::Lf },
    Expect { path: "pytorch_print/cls-homework-multirun_train.log", format: Format::PrintKv, records: 222, train: 222, eval: 0, signal: "loss", first: 5.216239929199219, last: 3.326362371444702, runs: 3, original: Original::Crlf },
    Expect { path: "pytorch_print/mobilenetv2-liveness_train.log", format: Format::PrintKv, records: 355, train: 323, eval: 32, signal: "train_loss", first: 0.5644293498992919, last: 0.0015599694522173497, runs: 1, original: Original::Crlf },
    Expect { path: "keras_console/carnd-behavioral-cloning_training_output.txt", format: Format::KerasConsole, records: 40, train: 40, eval: 0, signal: "loss", first: 194.3781, last: 0.0154, runs: 1, original: Original::Crlf },
    Expect { path: "pytorch_print/numpy-cnn-fashion-mnist_training_output.txt", format: Format::PrintKv, records: 33, train: 33, eval: 0, signal: "loss", first: 2.1796, last: 0.7147, runs: 1, original: Original::Lf },
    Expect { path: "tqdm_progress/yolov5-insect-console_training_output.txt", format: Format::UltralyticsConsole, records: 21, train: 10, eval: 11, signal: "box", first: 0.05812, last: 0.03722, runs: 1, original: Original::Lf },
    Expect { path: "keras_console/cat-or-dog-keras_training_log.txt", format: Format::KerasConsole, records: 40, train: 40, eval: 0, signal: "loss", first: 0.6855, last: 0.3206, runs: 1, original: Original::Lf },
    Expect { path: "pytorch_print/pytorch-examples-mnist-docker_output.txt", format: Format::PytorchExamples, records: 122, train: 121, eval: 1, signal: "loss", first: 2.329474, last: 0.023585, runs: 2, original: Original::Lf },
    Expect { path: "other_formats/basicsr-pyiqa-tail_nohup.out", format: Format::Basicsr, records: 7, train: 7, eval: 0, signal: "l_mos", first: 8.1951e-03, last: 3.1917e-03, runs: 1, original: Original::Lf },
];

/// (file, record index, epoch, step, split, metric, value; NaN means "is NaN")
type SpotCheck = (
    &'static str,
    u64,
    Option<f64>,
    Option<u64>,
    &'static str,
    &'static str,
    f64,
);

/// Individual values worth pinning: eval records, NaN, counters, derived metrics.
#[rustfmt::skip]
const SPOT_CHECKS: &[SpotCheck] = &[
    ("nanogpt_style/nanogpt-shakespeare-char-termux_train.log", 0, None, Some(0), "eval", "val_loss", 4.2475),
    ("nanogpt_style/nanogpt-shakespeare-char-termux_train.log", 1, None, Some(0), "train", "mfu", -100.0),
    ("nanogpt_style/nanogpt-shakespeare-char-termux_train.log", 95, None, Some(450), "train", "loss", f64::NAN),
    ("hf_console/indot5-lora-colab_domain-adapt-finetune.md", 3, Some(1.0), None, "eval", "eval_loss", 9.86),
    ("hf_console/interviewmate-falcon-lora_README_InterviewMate.md", 15, Some(3.0), None, "train", "train_loss", 1.1657305240631104),
    ("hf_trainer/lora-imdb-distilbert_trainer_state.json", 6, Some(1.0), Some(125), "eval", "eval_loss", 0.3951033353805542),
    ("hf_trainer/bert-weibo-rumor_trainer_state.json", 51, Some(100.0), Some(25800), "train", "total_flos", 1.18478524985856e+17),
    ("lightning_csv/slm-training-lm_metrics.csv", 5, Some(0.0), Some(286), "eval", "val_loss", 6.833683967590332),
    ("lightning_csv/cv-image-classification_metrics.csv", 177, Some(5.0), Some(8595), "eval", "test_loss", 0.0322248712182045),
    ("keras_csv/cat-classifier_training.log", 2, Some(0.0), None, "train", "val_F1_score", 0.9668579697608948),
    ("yolo_results_csv/yolov5-anpr_results.csv", 0, Some(0.0), None, "train", "metrics/mAP_0.5:0.95", 0.39306),
    ("detectron2_metrics/orbital-object-detector_metrics.json", 24, None, Some(499), "train", "bbox/APl", f64::NAN),
    ("mmengine_scalars/mmseg-smoketest_scalars.json", 1, None, Some(1), "eval", "mIoU", 43.75),
    ("mmengine_scalars/mmdet-fish-multihead_vis_20250709_234619.json", 2, None, Some(1), "eval", "coco/bbox_mAP_s", -1.0),
    ("tqdm_progress/yolov5-insect-console_training_output.txt", 1, Some(0.0), None, "eval", "mAP@.5", 0.0166),
    ("tqdm_progress/yolov5-insect-console_training_output.txt", 0, Some(0.0), Some(401), "train", "labels", 54.0),
    ("pytorch_print/pytorch-examples-mnist-docker_output.txt", 94, Some(1.0), None, "eval", "accuracy", 98.36),
    ("pytorch_print/pytorch-examples-mnist-docker_output.txt", 1, Some(1.0), Some(640), "train", "loss", 1.425063),
    ("pytorch_print/mobilenetv2-liveness_train.log", 10, Some(1.0), None, "eval", "val_acc", 86.0026235026235),
    ("pytorch_print/cls-homework-multirun_train.log", 134, Some(0.0), Some(1300), "train", "loss", 3.5879061222076416),
    ("pytorch_print/numpy-cnn-fashion-mnist_training_output.txt", 10, Some(1.0), None, "train", "avg_loss", 1.2973),
    ("other_formats/basicsr-pyiqa-tail_nohup.out", 0, Some(0.0), Some(100), "train", "train_metrics/srcc", 8.9118e-01),
    ("other_formats/caffe-lenet-mnist_train.log", 1, None, Some(100), "train", "loss", 0.224371),
    ("keras_console/cat-or-dog-keras_training_log.txt", 39, Some(40.0), Some(313), "train", "val_acc", 0.8488),
];

fn read(path: &str) -> Vec<u8> {
    let full = fixtures_dir().join(path);
    std::fs::read(&full).unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", full.display()))
}

fn parse(path: &str, bytes: &[u8]) -> ParsedLog {
    parse_bytes_with(
        Path::new(path),
        bytes,
        FormatChoice::Auto,
        None,
        SystemTime::UNIX_EPOCH,
    )
    .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn crlf(bytes: &[u8], terminator: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        if b == b'\n' {
            out.extend_from_slice(terminator);
        } else {
            out.push(b);
        }
    }
    out
}

/// Puts back the `\r` refreshes of tqdm: bar-only lines (and the blank lines tqdm leaves when
/// it clears a nested bar) end with `\r`, and a bar fused with the next output (`...s/it]/Users`)
/// gets its `\r` back.
fn tqdm_cr(bytes: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(bytes);
    let bar = regex::Regex::new(r"^\s*\d+%[ |]").unwrap();
    let fused = regex::Regex::new(r"(it/s\]|s/it\]|\?it/s\])(\S)").unwrap();
    let mut out = String::with_capacity(text.len() + 64);
    let mut lines = text.split('\n').peekable();
    while let Some(line) = lines.next() {
        let line = fused.replace_all(line, "$1\r$2");
        out.push_str(&line);
        if lines.peek().is_some() {
            let is_bar = bar.is_match(&line) && !line.contains('\r');
            out.push(if is_bar || (line.trim().is_empty() && !line.is_empty()) {
                '\r'
            } else {
                '\n'
            });
        }
    }
    out.into_bytes()
}

#[test]
fn fixtures_index_and_table_agree() {
    let index = String::from_utf8(read("INDEX.tsv")).unwrap();
    let listed: Vec<&str> = index
        .lines()
        .skip(1)
        .filter_map(|l| l.split('\t').next())
        .filter(|p| !p.is_empty())
        .collect();
    for p in &listed {
        assert!(
            EXPECTED.iter().any(|e| e.path == *p),
            "{p} is in INDEX.tsv but has no expectation here"
        );
    }
    assert_eq!(
        listed.len(),
        EXPECTED.len(),
        "expectations for files not in INDEX.tsv"
    );
}

#[test]
fn every_fixture_parses_with_expected_format_counts_and_signal() {
    let mut failures = Vec::new();
    for e in EXPECTED {
        let log = parse(e.path, &read(e.path));
        let s = summarize(&log, &SignalConfig::default());
        let got = (
            log.format,
            s.records,
            s.train_records,
            s.eval_records,
            s.signal.as_deref(),
            s.first,
            s.last,
            s.runs,
        );
        let want = (
            e.format,
            e.records,
            e.train,
            e.eval,
            Some(e.signal),
            Some(e.first),
            Some(e.last),
            e.runs,
        );
        if got != want {
            failures.push(format!("{}:\n   got {got:?}\n  want {want:?}", e.path));
        }
    }
    assert!(
        failures.is_empty(),
        "fixtures differ:\n{}",
        failures.join("\n")
    );
}

#[test]
fn restored_line_endings_give_identical_records() {
    for e in EXPECTED {
        let stored = read(e.path);
        let baseline = seen(&parse(e.path, &stored).records);
        let original = match e.original {
            Original::Lf => None,
            Original::Crlf => Some(crlf(&stored, b"\r\n")),
            Original::TqdmCr => Some(tqdm_cr(&stored)),
        };
        if let Some(bytes) = &original {
            assert_ne!(bytes, &stored, "{}: restoring changed nothing", e.path);
        }
        let variants = [
            ("original", original),
            ("CRLF", Some(crlf(&stored, b"\r\n"))),
            ("CR CR LF", Some(crlf(&stored, b"\r\r\n"))),
        ];
        for (name, bytes) in variants {
            let Some(bytes) = bytes else { continue };
            let log = parse(e.path, &bytes);
            assert_eq!(log.format, e.format, "{} ({name})", e.path);
            assert!(
                seen(&log.records) == baseline,
                "{} ({name} line endings): records differ from the stored file's",
                e.path
            );
        }
    }
}

#[test]
fn appending_in_small_pieces_gives_the_same_records() {
    for e in EXPECTED {
        let bytes = read(e.path);
        let baseline = seen(&parse(e.path, &bytes).records);
        for chunk in [1usize, 7, 4096] {
            let mut stream = LogStream::new(Path::new(e.path), FormatChoice::Auto, None).unwrap();
            let mut records = Vec::new();
            for piece in bytes.chunks(chunk) {
                stream.push(piece, SystemTime::now(), &mut records);
            }
            stream.finish(SystemTime::now(), &mut records);
            assert_eq!(
                stream.format(),
                Some(e.format),
                "{} in {chunk}-byte appends",
                e.path
            );
            assert!(
                seen(&records) == baseline,
                "{}: {chunk}-byte appends give other records",
                e.path
            );
        }
    }
}

#[test]
fn forcing_the_format_gives_the_detected_records() {
    for e in EXPECTED {
        let bytes = read(e.path);
        let auto = seen(&parse(e.path, &bytes).records);
        let forced = parse_bytes_with(
            Path::new(e.path),
            &bytes,
            FormatChoice::Fixed(e.format),
            None,
            SystemTime::UNIX_EPOCH,
        )
        .unwrap_or_else(|err| panic!("{}: {err}", e.path));
        assert!(
            seen(&forced.records) == auto,
            "{}: --format {} differs",
            e.path,
            e.format
        );
    }
}

#[test]
fn spot_checks() {
    for &(path, index, epoch, step, split, metric, value) in SPOT_CHECKS {
        let log = parse(path, &read(path));
        let r = log
            .records
            .iter()
            .find(|r| r.index == index)
            .unwrap_or_else(|| panic!("{path}: no record {index}"));
        assert_eq!(
            (r.epoch, r.step, r.split.as_str()),
            (epoch, step, split),
            "{path} #{index}"
        );
        let got = r
            .metrics
            .get(metric)
            .unwrap_or_else(|| panic!("{path} #{index}: no {metric} in {:?}", r.metrics));
        if value.is_nan() {
            assert!(got.is_nan(), "{path} #{index} {metric}: {got} is not NaN");
        } else {
            assert_eq!(got, value, "{path} #{index} {metric}");
        }
    }
}
