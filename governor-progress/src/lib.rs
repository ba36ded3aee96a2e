//! Progress ingestion without I/O: the bytes of the log files a job's framework already writes
//! in, records and the job's progress signal out (parsers, format detection, progress signal).
//! The caller reads the files and says when it read them; following files live (inotify, file
//! opening, MLflow's SQLite store) is `governor-watch`'s, so that the simulator and the fuzz
//! targets build this crate without a runtime or a C library.
//!
//! Pieces, from bytes to progress:
//! - [`lines`]: appended bytes to complete lines (`\n`, CRLF, `\r\r\n`, tqdm `\r` refreshes;
//!   over-long lines skipped);
//! - [`LogParser`] ([`detect`]): detects the format (or takes the one configured) and turns
//!   lines into [`RecordData`]; one incremental parser per format lives in `parsers/`;
//! - [`LogStream`]: splitter + parser for one file, numbering records and stamping them;
//! - [`parse_bytes`]: a whole log held in memory (the simulator, the fuzz targets; the
//!   `parse_file` of `governor-watch` for `governor parse`);
//! - [`SignalTracker`] ([`signal`]): records to the job's progress signal E(t), with run
//!   segments and NaN/inf reports;
//! - [`mlflow_rows`]: rows of MLflow's SQLite `metrics` table to records (the reading is the
//!   watcher's).
//!
//! Nothing here ever puts a file's content into an error or a log message: the daemon runs as
//! root and a job may point it at any path.

#![forbid(unsafe_code)]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

pub mod detect;
pub mod format;
pub mod json;
pub mod lines;
pub mod mlflow_rows;
pub mod num;
mod parsers;
pub mod record;
pub mod signal;
pub mod tensorboard;
pub mod tfrecord;

pub use detect::LogParser;
pub use format::{Format, FormatChoice, UnknownFormatName};
pub use lines::{LineSplitter, MAX_LINE_BYTES};
pub use parsers::custom::CustomFormat;
pub use record::{Metrics, Record, RecordData, Split};
pub use signal::{SignalConfig, SignalTracker, SignalUpdate, Summary, quality_value, summarize};

/// A job's progress configuration, as written in its TOML section:
///
/// ```toml
/// paths = ["/proc/4242/root/workspace/out/lightning_logs/version_*/metrics.csv"]
/// format = "auto"
/// [signal]
/// metric = "val_loss"
/// direction = "minimise"
/// [custom]
/// regex = '^it=(?P<step>\d+) L=(?P<loss>\S+)$'
/// ```
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressConfig {
    /// Absolute paths or globs of the job's log files (host paths).
    pub paths: Vec<PathBuf>,
    /// Format of the files (default: detect).
    #[serde(default)]
    pub format: FormatChoice,
    /// Which metric is the progress signal (default: the training loss).
    #[serde(default)]
    pub signal: SignalConfig,
    /// A custom format, used instead of detection when given.
    #[serde(default)]
    pub custom: Option<CustomFormat>,
}

impl ProgressConfig {
    /// A fresh tracker of the job's progress signal.
    pub fn signal_tracker(&self) -> SignalTracker {
        SignalTracker::new(self.signal.clone())
    }
}

/// Errors of progress ingestion. Messages name files, never quote them.
#[derive(Debug, thiserror::Error)]
pub enum ProgressError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {}: not a regular file", path.display())]
    NotRegularFile { path: PathBuf },
    #[error("no known training-log format recognised in {file}")]
    UnknownFormat { file: String },
    #[error("no {format} records recognised in {file}")]
    FormatNotFound { file: String, format: Format },
    #[error("invalid custom format regex: {message}")]
    CustomRegex { message: String },
    #[error("custom format regex {regex:?} has no named group for a metric")]
    CustomNoMetric { regex: String },
    #[error("format `custom` needs a regex (the job's `custom` section, or --regex)")]
    CustomMissing,
    #[error("{format} is not a line format: give the file or directory itself")]
    NotLines { format: Format },
}

/// One file parsed whole.
#[derive(Clone, Debug)]
pub struct ParsedLog {
    pub file: Arc<Path>,
    pub format: Format,
    pub records: Vec<Record>,
    /// Lines over [`MAX_LINE_BYTES`] that were skipped.
    pub skipped_long_lines: u64,
    /// Binary records skipped (bad checksum, undecodable event).
    pub skipped_records: u64,
}

/// The incremental reader of one file: bytes in, numbered records out. Used by
/// [`parse_bytes`] and by the watcher for each file it follows.
///
/// A text log goes through the line splitter and [`LogParser`]; a TensorBoard event file (by
/// its name, or, with format `auto`, by a first record whose length checksum holds) through
/// [`tensorboard::EventsDecoder`]; a file of MLflow's file store (by its path) through the
/// metric-file parser named after its key.
pub struct LogStream {
    file: Arc<Path>,
    decoder: Decoder,
    next_index: u64,
    scratch: Vec<RecordData>,
}

enum Decoder {
    /// Format `auto` on a file whose name says nothing: the first bytes decide between an event
    /// file and a text log (held here until there are enough of them).
    Sniffing {
        head: Vec<u8>,
        lines: Box<Decoder>,
    },
    Lines {
        splitter: LineSplitter,
        parser: LogParser,
    },
    Events(tensorboard::EventsDecoder),
}

/// Bytes that tell an event file from a text log: a TFRecord length and its checksum.
const SNIFF_BYTES: usize = 12;

impl LogStream {
    /// A stream for `file` (the name labels records, and says what an event file or an MLflow
    /// metric file is).
    pub fn new(
        file: impl Into<Arc<Path>>,
        choice: FormatChoice,
        custom: Option<&CustomFormat>,
    ) -> Result<Self, ProgressError> {
        let file: Arc<Path> = file.into();
        let lines = |parser| Decoder::Lines {
            splitter: LineSplitter::new(),
            parser,
        };
        let decoder = match (choice, custom) {
            (_, Some(_)) => lines(LogParser::new(choice, custom)?),
            (FormatChoice::Fixed(Format::TensorBoard), None) => {
                Decoder::Events(tensorboard::EventsDecoder::new(&file))
            }
            (FormatChoice::Fixed(Format::MlflowSqlite), None) => {
                return Err(ProgressError::NotLines {
                    format: Format::MlflowSqlite,
                });
            }
            (FormatChoice::Fixed(Format::MlflowFile), None) => {
                let key = parsers::mlflow::metric_key(&file).unwrap_or_else(|| {
                    file.file_name()
                        .map_or_else(|| "value".into(), |n| n.to_string_lossy().into_owned())
                });
                lines(mlflow_parser(&key))
            }
            (FormatChoice::Fixed(_), None) => lines(LogParser::new(choice, None)?),
            (FormatChoice::Auto, None) => {
                if let Some(key) = parsers::mlflow::metric_key(&file) {
                    lines(mlflow_parser(&key))
                } else if file
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(tensorboard::is_event_file_name)
                {
                    Decoder::Events(tensorboard::EventsDecoder::new(&file))
                } else {
                    Decoder::Sniffing {
                        head: Vec::new(),
                        lines: Box::new(lines(LogParser::new(choice, None)?)),
                    }
                }
            }
        };
        Ok(LogStream {
            file,
            decoder,
            next_index: 0,
            scratch: Vec::new(),
        })
    }

    /// The file this stream reads.
    pub fn file(&self) -> &Arc<Path> {
        &self.file
    }

    /// Feeds appended bytes; records completed by them are appended to `out`.
    pub fn push(&mut self, bytes: &[u8], observed_at: SystemTime, out: &mut Vec<Record>) {
        let bytes = match &mut self.decoder {
            Decoder::Sniffing { head, .. } => {
                head.extend_from_slice(bytes);
                if head.len() < SNIFF_BYTES && !tfrecord::cannot_be_tfrecord(head) {
                    return;
                }
                let head = std::mem::take(head);
                self.decide_sniffed(&head);
                self.push_decided(&head);
                self.drain(observed_at, out);
                return;
            }
            _ => bytes,
        };
        self.push_decided(bytes);
        self.drain(observed_at, out);
    }

    fn decide_sniffed(&mut self, head: &[u8]) {
        let decoder = std::mem::replace(
            &mut self.decoder,
            Decoder::Events(tensorboard::EventsDecoder::new(&self.file)),
        );
        if let Decoder::Sniffing { lines, .. } = decoder
            && !tfrecord::looks_like_tfrecord(head)
        {
            self.decoder = *lines;
        }
    }

    /// Still sniffing at the end: the few bytes seen are a (very short) text log.
    fn end_sniffing(&mut self) {
        if let Decoder::Sniffing { head, .. } = &mut self.decoder {
            let head = std::mem::take(head);
            if let Decoder::Sniffing { lines, .. } = std::mem::replace(
                &mut self.decoder,
                Decoder::Events(tensorboard::EventsDecoder::new(&self.file)),
            ) {
                self.decoder = *lines;
            }
            self.push_decided(&head);
        }
    }

    fn push_decided(&mut self, bytes: &[u8]) {
        let scratch = &mut self.scratch;
        match &mut self.decoder {
            Decoder::Lines { splitter, parser } => {
                splitter.push(bytes, |line| parser.line(line, scratch))
            }
            Decoder::Events(d) => d.push(bytes, scratch),
            Decoder::Sniffing { .. } => unreachable!("decided before"),
        }
    }

    /// The writer is done (closed the file, or the input ended): the unterminated last line is
    /// parsed and held-back records are released. (A torn event record stays held: it is never
    /// complete.)
    pub fn finish(&mut self, observed_at: SystemTime, out: &mut Vec<Record>) {
        self.end_sniffing();
        let scratch = &mut self.scratch;
        if let Decoder::Lines { splitter, parser } = &mut self.decoder {
            splitter.finish(|line| parser.line(line, scratch));
            parser.finish(scratch);
        }
        self.drain(observed_at, out);
    }

    /// The writer closed the file (it may reopen it and append): the unterminated last line is
    /// parsed, as the writer will not finish it, and held-back records are released, but format
    /// detection is not forced.
    pub fn writer_closed(&mut self, observed_at: SystemTime, out: &mut Vec<Record>) {
        if matches!(&self.decoder, Decoder::Sniffing { head, .. } if head.is_empty()) {
            return;
        }
        self.end_sniffing();
        let scratch = &mut self.scratch;
        if let Decoder::Lines { splitter, parser } = &mut self.decoder {
            splitter.finish(|line| parser.line(line, scratch));
            parser.flush_pending(scratch);
        }
        self.drain(observed_at, out);
    }

    /// Follows another file with the same parser state (a glob's newest match replaced the
    /// previous file: a rewritten document keeps knowing which entries it already emitted).
    pub fn reopen(&mut self, file: Arc<Path>) {
        self.file = file;
        self.restart();
    }

    /// The file was truncated or replaced: the unterminated bytes are dropped and a document
    /// format starts over. Record numbering continues.
    pub fn restart(&mut self) {
        match &mut self.decoder {
            Decoder::Sniffing { head, .. } => head.clear(),
            Decoder::Lines { splitter, parser } => {
                splitter.reset();
                parser.restart();
            }
            Decoder::Events(d) => d.reset(),
        }
    }

    fn drain(&mut self, observed_at: SystemTime, out: &mut Vec<Record>) {
        if self.scratch.is_empty() {
            return;
        }
        // Records are only released once the format is decided.
        debug_assert!(self.format().is_some());
        let format = self.format().unwrap_or(Format::PrintKv);
        for d in self.scratch.drain(..) {
            out.push(Record::from_data(
                self.file.clone(),
                format,
                self.next_index,
                observed_at,
                d,
            ));
            self.next_index += 1;
        }
    }

    /// The format, once detected.
    pub fn format(&self) -> Option<Format> {
        match &self.decoder {
            Decoder::Sniffing { .. } => None,
            Decoder::Lines { parser, .. } => parser.format(),
            Decoder::Events(_) => Some(Format::TensorBoard),
        }
    }

    /// See [`LogParser::recognized`]; an event file once one event decoded.
    pub fn recognized(&self) -> bool {
        match &self.decoder {
            Decoder::Sniffing { .. } => false,
            Decoder::Lines { parser, .. } => parser.recognized(),
            Decoder::Events(d) => d.recognized(),
        }
    }

    /// See [`LogParser::is_document`].
    pub fn is_document(&self) -> bool {
        match &self.decoder {
            Decoder::Sniffing { lines, .. } => match &**lines {
                Decoder::Lines { parser, .. } => parser.is_document(),
                _ => false,
            },
            Decoder::Lines { parser, .. } => parser.is_document(),
            Decoder::Events(_) => false,
        }
    }

    /// Over-long lines skipped so far.
    pub fn skipped_long_lines(&self) -> u64 {
        match &self.decoder {
            Decoder::Lines { splitter, .. } => splitter.skipped_lines(),
            _ => 0,
        }
    }

    /// Binary records skipped so far: event records whose checksum did not match, or that
    /// did not decode as an event.
    pub fn skipped_records(&self) -> u64 {
        match &self.decoder {
            Decoder::Events(d) => d.framing_errors().bad_data_crc + d.undecodable(),
            _ => 0,
        }
    }

    /// True when an event file's framing was lost (a length whose checksum failed): nothing
    /// after it is read.
    pub fn framing_lost(&self) -> bool {
        matches!(&self.decoder, Decoder::Events(d) if d.framing_errors().lost)
    }

    /// The whole log, once the input ended ([`LogStream::finish`]): `records` are what the
    /// stream delivered. An error when no format was recognised (or not the one chosen).
    pub fn into_parsed(
        self,
        choice: FormatChoice,
        records: Vec<Record>,
    ) -> Result<ParsedLog, ProgressError> {
        let file = self.file.display().to_string();
        match self.format() {
            Some(format) if self.recognized() => Ok(ParsedLog {
                file: self.file.clone(),
                format,
                records,
                skipped_long_lines: self.skipped_long_lines(),
                skipped_records: self.skipped_records(),
            }),
            Some(format) if choice != FormatChoice::Auto || format == Format::Custom => {
                Err(ProgressError::FormatNotFound { file, format })
            }
            _ => Err(ProgressError::UnknownFormat { file }),
        }
    }
}

/// Parses a whole log held in memory; records are labelled with the file name `<bytes>` and
/// stamped `observed_at` (when the caller read the bytes).
pub fn parse_bytes(
    bytes: &[u8],
    choice: FormatChoice,
    observed_at: SystemTime,
) -> Result<ParsedLog, ProgressError> {
    parse_bytes_with(Path::new("<bytes>"), bytes, choice, None, observed_at)
}

/// [`parse_bytes`] with a file name for the records (it also says what an event file or an
/// MLflow metric file is) and an optional custom format.
pub fn parse_bytes_with(
    file: &Path,
    bytes: &[u8],
    choice: FormatChoice,
    custom: Option<&CustomFormat>,
    observed_at: SystemTime,
) -> Result<ParsedLog, ProgressError> {
    let mut stream = LogStream::new(file, choice, custom)?;
    let mut records = Vec::new();
    stream.push(bytes, observed_at, &mut records);
    stream.finish(observed_at, &mut records);
    stream.into_parsed(choice, records)
}

fn mlflow_parser(key: &str) -> LogParser {
    LogParser::with_parser(
        Format::MlflowFile,
        Box::new(parsers::mlflow::MetricFile::new(key)),
    )
}

/// True for a file a log directory's follower reads: a TensorBoard event file, a metric file of
/// MLflow's file store, an SQLite database (`*.db`: MLflow's store, checked when opened).
pub fn is_log_dir_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    tensorboard::is_event_file_name(name)
        || name.ends_with(".db")
        || parsers::mlflow::metric_key(path).is_some()
}

/// The creation time an event file's name carries (`events.out.tfevents.<seconds>.<host>...`),
/// 0 for any other name: the order a log directory's writers started in.
pub fn event_file_time(path: &Path) -> u64 {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.split("tfevents.").nth(1))
        .and_then(|rest| rest.split('.').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_detects_and_numbers_records() {
        let log = parse_bytes(
            b"epoch,loss\n0,1.5\n1,1.0",
            FormatChoice::Auto,
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(log.format, Format::KerasCsv);
        assert_eq!(log.records.len(), 2, "the unterminated last line counts");
        assert_eq!(log.records[1].index, 1);
        assert_eq!(log.records[1].metrics.get("loss"), Some(1.0));
    }

    #[test]
    fn unknown_input_is_an_error_that_does_not_quote_it() {
        let secret = b"root:x:0:0:root:/root:/bin/bash\n";
        let err = parse_bytes(secret, FormatChoice::Auto, SystemTime::UNIX_EPOCH).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no known training-log format recognised in <bytes>"
        );
        let err = parse_bytes(
            secret,
            FormatChoice::Fixed(Format::KerasCsv),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "no keras_csv records recognised in <bytes>"
        );
    }

    #[test]
    fn job_configuration_from_toml() {
        let text = r#"
            paths = ["/proc/4242/root/workspace/out/lightning_logs/version_*/metrics.csv"]
            format = "auto"

            [signal]
            metric = "val_loss"
            direction = "minimise"

            [custom]
            regex = '^it=(?P<step>\d+) ep=(?P<epoch>[\d.]+) L=(?P<loss>\S+)$'
            split = "train"
        "#;
        let c: ProgressConfig = toml::from_str(text).unwrap();
        assert_eq!(c.format, FormatChoice::Auto);
        assert_eq!(c.signal.metric.as_deref(), Some("val_loss"));
        assert_eq!(
            c.signal.direction,
            Some(governor_policy::Direction::Minimise)
        );
        assert_eq!(c.custom.as_ref().unwrap().split, Some(Split::Train));
        assert!(c.custom.as_ref().unwrap().validate().is_ok());
        assert_eq!(c.signal_tracker().metric(), Some("val_loss"));
        let minimal: ProgressConfig = toml::from_str("paths = ['/var/log/train.log']").unwrap();
        assert_eq!(minimal.signal, SignalConfig::default());
        assert!(
            toml::from_str::<ProgressConfig>(
                "paths = []
bogus = 1"
            )
            .is_err()
        );
        let fixed: ProgressConfig = toml::from_str(
            "paths = ['/x']
format = 'keras_csv'",
        )
        .unwrap();
        assert_eq!(fixed.format, FormatChoice::Fixed(Format::KerasCsv));
    }

    #[test]
    fn a_recognised_file_without_records_is_not_an_error() {
        let log = parse_bytes(
            b"epoch,step,train_loss\n",
            FormatChoice::Auto,
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(log.format, Format::LightningCsv);
        assert!(log.records.is_empty());
    }
}
