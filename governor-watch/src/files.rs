//! Reading log files whole: a file, an MLflow SQLite database, or a log directory, for
//! `governor parse`. The bytes go to `governor-progress`'s parsers; this module opens the files
//! (never a FIFO or a device) and stamps the records with the time it read them.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use governor_progress::mlflow_rows::is_sqlite_header;
use governor_progress::{
    CustomFormat, FormatChoice, LogStream, ParsedLog, ProgressError, event_file_time,
    is_log_dir_file,
};
#[cfg(feature = "mlflow-sqlite")]
use governor_progress::{Format, Record};

/// Parses a whole log file (read in chunks, never all in memory at once).
pub fn parse_file(path: &Path, choice: FormatChoice) -> Result<ParsedLog, ProgressError> {
    parse_file_with(path, choice, None)
}

/// [`parse_file`] with an optional custom format. An MLflow SQLite database (by its first
/// bytes) is read through [`crate::mlflow_db`] (with the `mlflow-sqlite` feature).
pub fn parse_file_with(
    path: &Path,
    choice: FormatChoice,
    custom: Option<&CustomFormat>,
) -> Result<ParsedLog, ProgressError> {
    let mut file = open_regular(path)?;
    if custom.is_none() && is_sqlite(&file) {
        return parse_sqlite(path, choice);
    }
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

/// True when the file starts like an SQLite database.
pub(crate) fn is_sqlite(file: &File) -> bool {
    let mut head = [0u8; 16];
    matches!(file.read_at(&mut head, 0), Ok(16)) && is_sqlite_header(&head)
}

#[cfg(feature = "mlflow-sqlite")]
fn parse_sqlite(path: &Path, choice: FormatChoice) -> Result<ParsedLog, ProgressError> {
    if !matches!(
        choice,
        FormatChoice::Auto | FormatChoice::Fixed(Format::MlflowSqlite)
    ) {
        return Err(ProgressError::FormatNotFound {
            file: path.display().to_string(),
            format: match choice {
                FormatChoice::Fixed(f) => f,
                FormatChoice::Auto => Format::MlflowSqlite,
            },
        });
    }
    let mut db = crate::mlflow_db::MlflowDb::open(path)?;
    let mut data = Vec::new();
    db.read_new(&mut data)?;
    let file: Arc<Path> = Arc::from(path);
    let now = SystemTime::now();
    let records = data
        .into_iter()
        .enumerate()
        .map(|(i, d)| Record::from_data(file.clone(), Format::MlflowSqlite, i as u64, now, d))
        .collect();
    Ok(ParsedLog {
        file,
        format: Format::MlflowSqlite,
        records,
        skipped_long_lines: 0,
        skipped_records: 0,
    })
}

#[cfg(not(feature = "mlflow-sqlite"))]
fn parse_sqlite(path: &Path, _choice: FormatChoice) -> Result<ParsedLog, ProgressError> {
    Err(ProgressError::UnknownFormat {
        file: path.display().to_string(),
    })
}

/// Deepest directory level searched under a log directory.
pub const MAX_LOG_DIR_DEPTH: usize = 8;
/// Most directory entries looked at under one log directory (a job pointing at `/` must not
/// make the daemon walk the disk).
pub const MAX_LOG_DIR_ENTRIES: usize = 20_000;

/// The files a log directory holds (see [`is_log_dir_file`]), in the order their writers
/// started (an event file's name says when), then by path. Symbolic links are not followed;
/// the walk stops at [`MAX_LOG_DIR_DEPTH`] levels and [`MAX_LOG_DIR_ENTRIES`] entries.
pub fn log_dir_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut seen = 0usize;
    let mut stack = vec![(dir.to_owned(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > MAX_LOG_DIR_ENTRIES {
                break;
            }
            let Ok(t) = e.file_type() else { continue };
            let p = e.path();
            if t.is_dir() && depth < MAX_LOG_DIR_DEPTH {
                stack.push((p, depth + 1));
            } else if t.is_file() && is_log_dir_file(&p) {
                files.push(p);
            }
        }
    }
    files.sort_by_cached_key(|p| (event_file_time(p), p.clone()));
    files
}

/// The directories under a log directory (itself included), as [`log_dir_files`] walks them.
pub fn log_dir_directories(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut stack = vec![(dir.to_owned(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        if dirs.len() >= MAX_LOG_DIR_ENTRIES {
            break;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        dirs.push(d);
        if depth >= MAX_LOG_DIR_DEPTH {
            continue;
        }
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    dirs
}

/// Parses a log file, an MLflow database, or a log directory: every file of
/// [`log_dir_files`], in that order, as one log (the records of all of them, as a job that
/// logs there is followed). Files under a directory in no known format are left out.
pub fn parse_path(
    path: &Path,
    choice: FormatChoice,
    custom: Option<&CustomFormat>,
) -> Result<ParsedLog, ProgressError> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return parse_file_with(path, choice, custom);
    }
    let mut merged: Option<ParsedLog> = None;
    let mut first_error = None;
    for f in log_dir_files(path) {
        match parse_file_with(&f, choice, custom) {
            Ok(log) => match merged.as_mut() {
                None => merged = Some(log),
                Some(m) => {
                    m.records.extend(log.records);
                    m.skipped_long_lines += log.skipped_long_lines;
                    m.skipped_records += log.skipped_records;
                }
            },
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match merged {
        Some(mut m) => {
            m.file = Arc::from(path);
            Ok(m)
        }
        None => Err(match first_error {
            Some(e @ (ProgressError::Read { .. } | ProgressError::NotRegularFile { .. })) => e,
            _ => ProgressError::UnknownFormat {
                file: path.display().to_string(),
            },
        }),
    }
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
/// [`crate::OpenAs`]); the file must still be a regular file.
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
}
