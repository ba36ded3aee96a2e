//! Logs written by the tracking back-ends themselves (`governor-progress/tests/data/real_writers/`,
//! the progress crate's fixtures, made by
//! `make_fixtures.py` with `cargo xtask writer-fixtures`): PyTorch's `SummaryWriter`, Keras'
//! `TensorBoard` callback, Lightning's default logger, MLflow's SQLite and file stores, and the
//! JSON-lines logger of Keras' documentation. Each is read as the job's log directory is
//! followed, with the expected format, record counts, signal, first and last values, and runs
//! (restarts: a second event file whose steps go back, Lightning's `version_1/`, a resumed
//! MLflow run and a resumed Keras run that repeat their last counter).
//!
//! The expected values were read with TensorBoard's own `EventAccumulator`, Python's `sqlite3`
//! and plain reads of the files, not with this crate.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use governor_progress::{Format, FormatChoice, LogStream, SignalConfig, summarize};
use governor_watch::{log_dir_files, parse_path};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../governor-progress/tests/data/real_writers")
        .join(name)
}

struct Expect {
    dir: &'static str,
    format: Format,
    files: usize,
    records: u64,
    train: u64,
    eval: u64,
    signal: &'static str,
    first: f64,
    last: f64,
    runs: u32,
}

#[rustfmt::skip]
const EXPECTED: &[Expect] = &[
    Expect { dir: "pytorch_summarywriter", format: Format::TensorBoard, files: 2, records: 77, train: 70, eval: 7, signal: "Loss/train", first: 9.922430992126465, last: 0.006251499522477388, runs: 2 },
    Expect { dir: "keras_tensorboard", format: Format::TensorBoard, files: 2, records: 42, train: 18, eval: 24, signal: "epoch_loss", first: 0.7397449612617493, last: 0.6849231719970703, runs: 1 },
    Expect { dir: "lightning_tensorboard", format: Format::TensorBoard, files: 2, records: 36, train: 30, eval: 6, signal: "train_loss", first: 5.9946489334106445, last: 0.10642021149396896, runs: 2 },
    Expect { dir: "mlflow_sqlite", format: Format::MlflowSqlite, files: 1, records: 12, train: 6, eval: 6, signal: "loss", first: 0.7397449612617493, last: 0.6849231719970703, runs: 1 },
    Expect { dir: "mlflow_file", format: Format::MlflowFile, files: 2, records: 38, train: 31, eval: 7, signal: "loss", first: 8.92335980985099, last: 0.059944190863254046, runs: 2 },
    Expect { dir: "keras_jsonl", format: Format::JsonLines, files: 0, records: 8, train: 8, eval: 0, signal: "loss", first: 0.7397449612617493, last: 0.679875910282135, runs: 2 },
];

#[test]
fn every_real_writer_log_reads_with_its_format_counts_signal_and_runs() {
    let mut failures = Vec::new();
    for e in EXPECTED {
        let path = if e.files == 0 {
            data(e.dir).join("loss_log.json")
        } else {
            data(e.dir)
        };
        let log = parse_path(&path, FormatChoice::Auto, None)
            .unwrap_or_else(|err| panic!("{}: {err}", e.dir));
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
            failures.push(format!("{}:\n  got  {got:?}\n  want {want:?}", e.dir));
        }
        if e.files > 0 {
            assert_eq!(log_dir_files(&data(e.dir)).len(), e.files, "{}", e.dir);
        }
        assert_eq!(log.skipped_records, 0, "{}", e.dir);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn keras_validation_run_and_lightning_validation_are_eval_with_validation_names() {
    let log = parse_path(&data("keras_tensorboard"), FormatChoice::Auto, None).unwrap();
    let val: Vec<f64> = log
        .records
        .iter()
        .filter_map(|r| r.metrics.get("validation/epoch_loss"))
        .collect();
    assert_eq!(val.len(), 6);
    assert_eq!(val[0], 0.686359167098999);
    assert!(
        log.records
            .iter()
            .filter(|r| r.file.parent().unwrap().ends_with("validation"))
            .all(|r| r.split.as_str() == "eval")
    );
    // The validation loss is the job's quality signal.
    let quality: Vec<f64> = log
        .records
        .iter()
        .filter_map(governor_progress::quality_value)
        .collect();
    assert_eq!(quality.first(), Some(&0.686359167098999));
    let log = parse_path(&data("lightning_tensorboard"), FormatChoice::Auto, None).unwrap();
    let epochs: Vec<f64> = log.records.iter().filter_map(|r| r.epoch).collect();
    assert_eq!(
        epochs.len(),
        18,
        "Lightning's `epoch` scalar is the records' epoch"
    );
    assert_eq!(epochs[8], 2.0);
}

/// Every file of every fixture read in appends of `chunk` bytes gives the records it gives
/// read whole (as the watcher reads a growing file).
#[test]
fn appends_of_any_size_give_the_same_records() {
    for dir in [
        "pytorch_summarywriter",
        "keras_tensorboard",
        "lightning_tensorboard",
    ] {
        for file in log_dir_files(&data(dir)) {
            let bytes = std::fs::read(&file).unwrap();
            let whole = read(&file, &bytes, bytes.len());
            assert!(!whole.is_empty(), "{}", file.display());
            for chunk in [1, 3, 12, 13, 100, 4096] {
                assert_eq!(
                    read(&file, &bytes, chunk),
                    whole,
                    "{} in {chunk}-byte appends",
                    file.display()
                );
            }
        }
    }
}

fn read(file: &Path, bytes: &[u8], chunk: usize) -> Vec<String> {
    let mut s = LogStream::new(file, FormatChoice::Auto, None).unwrap();
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk) {
        s.push(piece, SystemTime::UNIX_EPOCH, &mut out);
    }
    s.finish(SystemTime::UNIX_EPOCH, &mut out);
    out.iter()
        .map(|r| format!("{:?} {:?} {} {:?}", r.epoch, r.step, r.split, r.metrics))
        .collect()
}

#[test]
fn a_damaged_real_event_file_loses_only_the_damaged_record() {
    let file = log_dir_files(&data("pytorch_summarywriter")).remove(0);
    let bytes = std::fs::read(&file).unwrap();
    let whole = read(&file, &bytes, bytes.len());
    // Flip one byte in the data of the 10th record: that record is skipped, the rest read.
    let mut at = 0;
    for _ in 0..10 {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        at += 12 + len + 4;
    }
    let mut damaged = bytes.clone();
    damaged[at + 14] ^= 0x55;
    let mut s = LogStream::new(file.as_path(), FormatChoice::Auto, None).unwrap();
    let mut out = Vec::new();
    s.push(&damaged, SystemTime::UNIX_EPOCH, &mut out);
    assert_eq!(s.skipped_records(), 1);
    assert_eq!(out.len(), whole.len() - 1);
    // Cut in the middle of its last record (a writer between two writes): that record waits.
    let mut s = LogStream::new(file.as_path(), FormatChoice::Auto, None).unwrap();
    let mut out = Vec::new();
    s.push(&bytes[..bytes.len() - 5], SystemTime::UNIX_EPOCH, &mut out);
    assert_eq!(out.len(), whole.len() - 1);
    s.push(&bytes[bytes.len() - 5..], SystemTime::UNIX_EPOCH, &mut out);
    assert_eq!(out.len(), whole.len());
    assert_eq!(s.skipped_records(), 0);
}
