//! Progress ingestion: follow every job's training progress from the log files its framework
//! already writes (parsers, format detection, progress signal, inotify tailer).
//!
//! Pieces, from bytes to progress:
//! - [`lines`]: appended bytes to complete lines (`\n`, CRLF, `\r\r\n`, tqdm `\r` refreshes;
//!   over-long lines skipped);
//! - [`LogParser`] ([`detect`]): detects the format (or takes the one configured) and turns
//!   lines into [`RecordData`]; one incremental parser per format lives in `parsers/`;
//! - [`LogStream`]: splitter + parser for one file, numbering records and stamping them;
//! - [`parse_bytes`] / [`parse_file`]: a whole file at once (`governor parse`, the simulator);
//! - [`SignalTracker`] ([`signal`]): records to the job's progress signal E(t), with run
//!   segments and NaN/inf reports;
//! - [`watch::Watcher`]: follows many files at once with one inotify instance and delivers
//!   records on a channel.
//!
//! Nothing here ever puts a file's content into an error or a log message: the daemon runs as
//! root and a job may point it at any path.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

pub mod detect;
pub mod format;
pub mod json;
pub mod lines;
pub mod num;
mod parsers;
pub mod record;
pub mod signal;
pub mod watch;

pub use detect::LogParser;
pub use format::{Format, FormatChoice, UnknownFormatName};
pub use lines::{LineSplitter, MAX_LINE_BYTES};
pub use parsers::custom::CustomFormat;
pub use record::{Metrics, Record, RecordData, Split};
pub use signal::{SignalConfig, SignalTracker, SignalUpdate, Summary, quality_value, summarize};
pub use watch::{FileOwner, OpenAs, WatchEvent, WatchEventKind, WatchSpec, Watcher, WatcherHandle};

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
    /// What the watcher should follow.
    pub fn watch_spec(&self) -> WatchSpec {
        WatchSpec {
            paths: self.paths.clone(),
            format: self.format,
            custom: self.custom.clone(),
            owner: None,
        }
    }

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
}

/// One file parsed whole.
#[derive(Clone, Debug)]
pub struct ParsedLog {
    pub file: Arc<Path>,
    pub format: Format,
    pub records: Vec<Record>,
    /// Lines over [`MAX_LINE_BYTES`] that were skipped.
    pub skipped_long_lines: u64,
}

/// The incremental reader of one file: bytes in, numbered records out. Used by
/// [`parse_file`] and by the watcher for each file it follows.
pub struct LogStream {
    file: Arc<Path>,
    splitter: LineSplitter,
    parser: LogParser,
    next_index: u64,
    scratch: Vec<RecordData>,
}

impl LogStream {
    /// A stream for `file` (the name is only used to label records).
    pub fn new(
        file: impl Into<Arc<Path>>,
        choice: FormatChoice,
        custom: Option<&CustomFormat>,
    ) -> Result<Self, ProgressError> {
        Ok(LogStream {
            file: file.into(),
            splitter: LineSplitter::new(),
            parser: LogParser::new(choice, custom)?,
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
        let parser = &mut self.parser;
        let scratch = &mut self.scratch;
        self.splitter.push(bytes, |line| parser.line(line, scratch));
        self.drain(observed_at, out);
    }

    /// The writer is done (closed the file, or the input ended): the unterminated last line is
    /// parsed and held-back records are released.
    pub fn finish(&mut self, observed_at: SystemTime, out: &mut Vec<Record>) {
        let parser = &mut self.parser;
        let scratch = &mut self.scratch;
        self.splitter.finish(|line| parser.line(line, scratch));
        parser.finish(scratch);
        self.drain(observed_at, out);
    }

    /// The writer closed the file (it may reopen it and append): the unterminated last line is
    /// parsed, as the writer will not finish it, and held-back records are released, but format
    /// detection is not forced.
    pub fn writer_closed(&mut self, observed_at: SystemTime, out: &mut Vec<Record>) {
        let parser = &mut self.parser;
        let scratch = &mut self.scratch;
        self.splitter.finish(|line| parser.line(line, scratch));
        parser.flush_pending(scratch);
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
        self.splitter.reset();
        self.parser.restart();
    }

    fn drain(&mut self, observed_at: SystemTime, out: &mut Vec<Record>) {
        if self.scratch.is_empty() {
            return;
        }
        // Records are only released once the format is decided.
        debug_assert!(self.parser.format().is_some());
        let format = self.parser.format().unwrap_or(Format::PrintKv);
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
        self.parser.format()
    }

    /// See [`LogParser::recognized`].
    pub fn recognized(&self) -> bool {
        self.parser.recognized()
    }

    /// See [`LogParser::is_document`].
    pub fn is_document(&self) -> bool {
        self.parser.is_document()
    }

    /// Over-long lines skipped so far.
    pub fn skipped_long_lines(&self) -> u64 {
        self.splitter.skipped_lines()
    }

    fn into_parsed(
        self,
        choice: FormatChoice,
        records: Vec<Record>,
    ) -> Result<ParsedLog, ProgressError> {
        let file = self.file.display().to_string();
        match self.parser.format() {
            Some(format) if self.parser.recognized() => Ok(ParsedLog {
                file: self.file.clone(),
                format,
                records,
                skipped_long_lines: self.splitter.skipped_lines(),
            }),
            Some(format) if choice != FormatChoice::Auto || format == Format::Custom => {
                Err(ProgressError::FormatNotFound { file, format })
            }
            _ => Err(ProgressError::UnknownFormat { file }),
        }
    }
}

/// Parses a whole log held in memory; records are labelled with the file name `<bytes>`.
pub fn parse_bytes(bytes: &[u8], choice: FormatChoice) -> Result<ParsedLog, ProgressError> {
    parse_bytes_with(Path::new("<bytes>"), bytes, choice, None)
}

/// [`parse_bytes`] with a file name for the records and an optional custom format.
pub fn parse_bytes_with(
    file: &Path,
    bytes: &[u8],
    choice: FormatChoice,
    custom: Option<&CustomFormat>,
) -> Result<ParsedLog, ProgressError> {
    let mut stream = LogStream::new(file, choice, custom)?;
    let now = SystemTime::now();
    let mut records = Vec::new();
    stream.push(bytes, now, &mut records);
    stream.finish(now, &mut records);
    stream.into_parsed(choice, records)
}

/// Parses a whole log file (read in chunks, never all in memory at once).
pub fn parse_file(path: &Path, choice: FormatChoice) -> Result<ParsedLog, ProgressError> {
    parse_file_with(path, choice, None)
}

/// [`parse_file`] with an optional custom format.
pub fn parse_file_with(
    path: &Path,
    choice: FormatChoice,
    custom: Option<&CustomFormat>,
) -> Result<ParsedLog, ProgressError> {
    let mut file = open_regular(path)?;
    let mut stream = LogStream::new(path, choice, custom)?;
    let now = SystemTime::now();
    let mut records = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(ProgressError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        stream.push(&buf[..n], now, &mut records);
    }
    stream.finish(now, &mut records);
    stream.into_parsed(choice, records)
}

/// Opens `path` for reading without blocking on FIFOs or devices, and refuses anything but a
/// regular file (a job could point the root daemon at `/dev/zero` or a FIFO).
pub(crate) fn open_regular(path: &Path) -> Result<File, ProgressError> {
    open_regular_with(path, |p| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(p)
    })
}

/// [`open_regular`] with another way to open (a job owner's rights, see
/// [`watch::OpenAs`]); the file must still be a regular file.
pub(crate) fn open_regular_with(
    path: &Path,
    open: impl FnOnce(&Path) -> std::io::Result<File>,
) -> Result<File, ProgressError> {
    let read_err = |source| ProgressError::Read {
        path: path.to_owned(),
        source,
    };
    let file = open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.file_type().is_file() {
        return Err(ProgressError::NotRegularFile {
            path: path.to_owned(),
        });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_detects_and_numbers_records() {
        let log = parse_bytes(b"epoch,loss\n0,1.5\n1,1.0", FormatChoice::Auto).unwrap();
        assert_eq!(log.format, Format::KerasCsv);
        assert_eq!(log.records.len(), 2, "the unterminated last line counts");
        assert_eq!(log.records[1].index, 1);
        assert_eq!(log.records[1].metrics.get("loss"), Some(1.0));
    }

    #[test]
    fn unknown_input_is_an_error_that_does_not_quote_it() {
        let secret = b"root:x:0:0:root:/root:/bin/bash\n";
        let err = parse_bytes(secret, FormatChoice::Auto).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no known training-log format recognised in <bytes>"
        );
        let err = parse_bytes(secret, FormatChoice::Fixed(Format::KerasCsv)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no keras_csv records recognised in <bytes>"
        );
    }

    #[test]
    fn special_files_are_refused() {
        let err = parse_file(Path::new("/dev/zero"), FormatChoice::Auto).unwrap_err();
        assert!(matches!(err, ProgressError::NotRegularFile { .. }), "{err}");
        let err = parse_file(Path::new("/nonexistent/x.log"), FormatChoice::Auto).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read /nonexistent/x.log: "),
            "{err}"
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
        assert_eq!(c.watch_spec().paths, c.paths);
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
        let log = parse_bytes(b"epoch,step,train_loss\n", FormatChoice::Auto).unwrap();
        assert_eq!(log.format, Format::LightningCsv);
        assert!(log.records.is_empty());
    }
}
