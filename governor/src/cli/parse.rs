//! `governor parse` and `governor formats`.
//!
//! A path may be a log file, an MLflow SQLite database, or a log directory (TensorBoard's
//! `--logdir`, MLflow's `mlruns/`): a directory is read as the daemon follows it, every event
//! file, MLflow metric file and database under it, records labelled with their own file, and
//! `--summary` gives one summary for the whole directory.
//!
//! Other tools call these: the output is one JSON object per line, fields in a fixed order,
//! and the exit status says what went wrong (0 success; 1 a file could not be read; 2 bad
//! arguments; 3 a file is in no known format — or not in the `--format` asked for). With
//! several files every file is processed and the status is the first failure's.

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use crate::progress::{
    CustomFormat, Format, FormatChoice, Metrics, ProgressError, SignalConfig, Split, summarize,
};
use crate::watch::parse_path;

/// Arguments of `governor parse`.
#[derive(Debug, clap::Args)]
pub struct ParseArgs {
    /// Log format: `auto` (detect) or a name from `governor formats`.
    #[arg(long, default_value = "auto", value_name = "auto|NAME")]
    pub format: FormatChoice,

    /// Progress-signal metric for --summary (default: the training loss under its common
    /// names). Without --summary, only records carrying this metric are printed.
    #[arg(long, value_name = "NAME")]
    pub metric: Option<String>,

    /// Print one summary object per file instead of one object per record.
    #[arg(long)]
    pub summary: bool,

    /// Custom format: a regex with named captures (`epoch`, `step`, `split`, anything else is
    /// a metric). Implies --format custom.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,

    /// Files, MLflow databases or log directories to parse.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Exit statuses of `governor parse`.
const EXIT_READ: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_UNKNOWN_FORMAT: u8 = 3;

#[derive(Serialize)]
struct RecordLine<'a> {
    file: &'a str,
    record: u64,
    format: Format,
    split: Split,
    epoch: Option<f64>,
    step: Option<u64>,
    metrics: &'a Metrics,
}

/// Run `governor parse`.
pub fn run_parse(args: ParseArgs) -> ExitCode {
    let custom = args.regex.as_ref().map(|regex| CustomFormat {
        regex: regex.clone(),
        split: None,
    });
    if let Some(c) = &custom
        && let Err(e) = c.validate()
    {
        eprintln!("governor parse: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    if custom.is_none() && args.format == FormatChoice::Fixed(Format::Custom) {
        eprintln!("governor parse: {}", ProgressError::CustomMissing);
        return ExitCode::from(EXIT_USAGE);
    }
    let signal = SignalConfig {
        metric: args.metric.clone(),
        direction: None,
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut status: Option<u8> = None;
    for path in &args.files {
        let log = match parse_path(path, args.format, custom.as_ref()) {
            Ok(log) => log,
            Err(e) => {
                eprintln!("governor parse: {e}");
                let code = match e {
                    ProgressError::UnknownFormat { .. } | ProgressError::FormatNotFound { .. } => {
                        EXIT_UNKNOWN_FORMAT
                    }
                    ProgressError::CustomRegex { .. }
                    | ProgressError::CustomNoMetric { .. }
                    | ProgressError::CustomMissing
                    | ProgressError::NotLines { .. } => EXIT_USAGE,
                    ProgressError::Read { .. } | ProgressError::NotRegularFile { .. } => EXIT_READ,
                };
                status.get_or_insert(code);
                continue;
            }
        };
        if log.skipped_long_lines > 0 {
            eprintln!(
                "governor parse: {}: skipped {} line(s) longer than {} bytes",
                path.display(),
                log.skipped_long_lines,
                crate::progress::MAX_LINE_BYTES
            );
        }
        if log.skipped_records > 0 {
            eprintln!(
                "governor parse: {}: skipped {} record(s) whose checksum did not match or that did not decode",
                path.display(),
                log.skipped_records
            );
        }
        let file = path.display().to_string();
        let directory = path.is_dir();
        let written = if args.summary {
            let mut s = summarize(&log, &signal);
            s.file = file;
            write_json(&mut out, &s)
        } else {
            log.records
                .iter()
                .filter(|r| args.metric.as_deref().is_none_or(|m| r.metrics.contains(m)))
                .try_for_each(|r| {
                    let own;
                    write_json(
                        &mut out,
                        &RecordLine {
                            file: if directory {
                                own = r.file.display().to_string();
                                &own
                            } else {
                                &file
                            },
                            record: r.index,
                            format: r.format,
                            split: r.split,
                            epoch: r.epoch,
                            step: r.step,
                            metrics: &r.metrics,
                        },
                    )
                })
        };
        if let Err(e) = written {
            return output_error(e);
        }
    }
    if let Err(e) = out.flush() {
        return output_error(e);
    }
    status.map_or(ExitCode::SUCCESS, ExitCode::from)
}

fn write_json(out: &mut impl Write, value: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, value).map_err(io::Error::other)?;
    out.write_all(b"\n")
}

fn output_error(e: io::Error) -> ExitCode {
    if e.kind() == io::ErrorKind::BrokenPipe {
        // `governor parse ... | head`: the reader has what it wanted.
        return ExitCode::SUCCESS;
    }
    eprintln!("governor parse: cannot write output: {e}");
    ExitCode::from(EXIT_READ)
}

/// Run `governor formats`: one line per format, `NAME<TAB>DESCRIPTION<TAB>EXAMPLE`.
pub fn run_formats() -> ExitCode {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for f in Format::ALL {
        if writeln!(out, "{}\t{}\t{}", f.name(), f.description(), f.example()).is_err() {
            return ExitCode::SUCCESS;
        }
    }
    let _ = out.flush();
    ExitCode::SUCCESS
}
