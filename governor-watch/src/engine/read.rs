//! The engine's reading: budgeted `pread`s of appended bytes, truncation and rewrite detection,
//! MLflow database rows, and the problems reported once per file.

use std::io;
use std::os::unix::fs::FileExt;
use std::time::SystemTime;

use governor_progress::MAX_LINE_BYTES;

use super::{Engine, FINGERPRINT, FileId, READ_BUDGET, Tailed, Trigger, UNDETECTED_REPORT_BYTES};
#[cfg(feature = "mlflow-sqlite")]
use crate::Record;
use crate::{Format, WatchEvent, WatchEventKind};

impl Engine {
    pub(super) fn continue_ready(&mut self) {
        if let Some(id) = self.ready.pop_front() {
            if let Some(t) = self.files.get_mut(&id) {
                t.queued = false;
            }
            self.read(id, Trigger::Continue);
        }
    }

    /// Reads what was appended to a file and delivers its records.
    pub(super) fn read(&mut self, id: FileId, trigger: Trigger) {
        let Engine {
            files,
            buf,
            records,
            outbox,
            ready,
            ..
        } = self;
        let Some(t) = files.get_mut(&id) else { return };
        let now = SystemTime::now();
        #[cfg(feature = "mlflow-sqlite")]
        if t.db.is_none()
            && t.offset == 0
            && t.stream.format().is_none()
            && crate::files::is_sqlite(&t.file)
        {
            // Opened before it was a database: SQLite creates the file empty and writes its
            // header (page 1, whole) with the first commit (MLflow's writer creating its
            // tables), so nothing was read of it as text yet. Followed as a database from now
            // on; a file already read as text is never looked at again.
            match t
                .file
                .metadata()
                .map_err(|e| e.to_string())
                .and_then(|meta| super::follow::open_db(&t.path, &meta))
            {
                Ok(db) => {
                    tracing::debug!(file = %t.path.display(), "the file became an SQLite database: following it as one");
                    t.db = Some(Box::new(db));
                }
                Err(message) => {
                    if !t.read_error_reported {
                        t.read_error_reported = true;
                        push_problem(t, outbox, message);
                    }
                    return;
                }
            }
        }
        #[cfg(feature = "mlflow-sqlite")]
        if t.db.is_some() {
            read_db(t, now, outbox);
            return;
        }
        let document = t.stream.format().is_some_and(Format::is_document);
        if document {
            match trigger {
                // A document is complete only once its writer closed it.
                Trigger::Modified | Trigger::Drain => return,
                Trigger::ClosedWrite | Trigger::Rescan => {
                    t.offset = 0;
                    t.fingerprint_len = 0;
                    t.stream.restart();
                }
                Trigger::Opened | Trigger::Continue => {}
            }
        }
        if trigger == Trigger::ClosedWrite {
            t.close_pending = true;
        }
        let size = match t.file.metadata() {
            Ok(m) => m.len(),
            Err(e) => {
                report_read_error(t, outbox, &e);
                return;
            }
        };
        if t.offset > 0 && (size < t.offset || !fingerprint_matches(t)) {
            t.offset = 0;
            t.fingerprint_len = 0;
            t.stream.restart();
            outbox.push(WatchEvent {
                key: t.key.clone(),
                file: t.path.clone(),
                kind: WatchEventKind::Truncated,
            });
        }
        let budget = if trigger == Trigger::Drain {
            u64::MAX
        } else {
            READ_BUDGET
        };
        // Read up to the size just seen (bytes written since will bring their own event),
        // except when draining a file that is being dropped: then up to the very end.
        let limit = if trigger == Trigger::Drain {
            u64::MAX
        } else {
            size
        };
        let mut read_now = 0u64;
        let mut at_end = false;
        while read_now < budget {
            let remaining = limit.saturating_sub(t.offset);
            if remaining == 0 {
                at_end = true;
                break;
            }
            let want = (buf.len() as u64).min(budget - read_now).min(remaining) as usize;
            match t.file.read_at(&mut buf[..want], t.offset) {
                Ok(0) => {
                    at_end = true;
                    break;
                }
                Ok(n) => {
                    t.stream.push(&buf[..n], now, records);
                    t.offset += n as u64;
                    remember_tail(t, &buf[..n]);
                    read_now += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    report_read_error(t, outbox, &e);
                    break;
                }
            }
        }
        if !at_end && read_now >= budget && !t.queued {
            t.queued = true;
            ready.push_back(id);
        }
        if at_end && (t.close_pending || trigger == Trigger::Drain) {
            t.stream.writer_closed(now, records);
            t.close_pending = false;
        }
        if !t.format_announced
            && let Some(format) = t.stream.format()
        {
            t.format_announced = true;
            outbox.push(WatchEvent {
                key: t.key.clone(),
                file: t.path.clone(),
                kind: WatchEventKind::Format(format),
            });
        }
        outbox.extend(records.drain(..).map(|r| WatchEvent {
            key: t.key.clone(),
            file: t.path.clone(),
            kind: WatchEventKind::Record(r),
        }));
        if !t.bad_records_reported && (t.stream.skipped_records() > 0 || t.stream.framing_lost()) {
            t.bad_records_reported = true;
            let message = if t.stream.framing_lost() {
                format!(
                    "the record framing of {} is broken (a length whose checksum does not match); the rest of the file is not read",
                    t.path.display()
                )
            } else {
                format!(
                    "skipping a record of {} whose checksum does not match or that does not decode (reported once; the file is still followed)",
                    t.path.display()
                )
            };
            push_problem(t, outbox, message);
        }
        if !t.long_lines_reported && t.stream.skipped_long_lines() > 0 {
            t.long_lines_reported = true;
            let message = format!(
                "skipping lines longer than {MAX_LINE_BYTES} bytes in {}",
                t.path.display()
            );
            push_problem(t, outbox, message);
        }
        if !t.unknown_reported && !t.stream.recognized() && t.offset >= UNDETECTED_REPORT_BYTES {
            t.unknown_reported = true;
            let message = match t.stream.format() {
                Some(format) => format!(
                    "no {format} records recognised in {} (first {} bytes); still watching",
                    t.path.display(),
                    t.offset
                ),
                None => format!(
                    "no known training-log format recognised in {} (first {} bytes); still watching",
                    t.path.display(),
                    t.offset
                ),
            };
            push_problem(t, outbox, message);
        }
    }
}

/// Reads an MLflow database's new rows. A writer mid-commit is waited for briefly, then left
/// to the next change; other errors are reported once.
#[cfg(feature = "mlflow-sqlite")]
fn read_db(t: &mut Tailed, now: SystemTime, outbox: &mut Vec<WatchEvent>) {
    let Some(db) = t.db.as_mut() else { return };
    let mut data = Vec::new();
    match db.read_new(&mut data) {
        Ok(()) => {}
        Err(e) if crate::mlflow_db::MlflowDb::is_busy(&e) => {}
        Err(e) => {
            if !t.read_error_reported {
                t.read_error_reported = true;
                push_problem(t, outbox, e.to_string());
            }
            return;
        }
    }
    if !t.format_announced {
        t.format_announced = true;
        outbox.push(WatchEvent {
            key: t.key.clone(),
            file: t.path.clone(),
            kind: WatchEventKind::Format(Format::MlflowSqlite),
        });
    }
    for d in data {
        let record = Record::from_data(t.path.clone(), Format::MlflowSqlite, t.offset, now, d);
        t.offset += 1;
        outbox.push(WatchEvent {
            key: t.key.clone(),
            file: t.path.clone(),
            kind: WatchEventKind::Record(record),
        });
    }
}

fn push_problem(t: &Tailed, outbox: &mut Vec<WatchEvent>, message: String) {
    tracing::warn!(key = %t.key, file = %t.path.display(), problem = %message, "log file problem");
    outbox.push(WatchEvent {
        key: t.key.clone(),
        file: t.path.clone(),
        kind: WatchEventKind::Problem(message),
    });
}

fn report_read_error(t: &mut Tailed, outbox: &mut Vec<WatchEvent>, e: &io::Error) {
    if !t.read_error_reported {
        t.read_error_reported = true;
        let message = format!("cannot read {}: {e}", t.path.display());
        push_problem(t, outbox, message);
    }
}

/// Remembers the last bytes read, to notice later that the file was rewritten in place.
fn remember_tail(t: &mut Tailed, chunk: &[u8]) {
    let take = chunk.len().min(FINGERPRINT);
    let keep = (FINGERPRINT - take).min(t.fingerprint_len);
    let mut next = [0u8; FINGERPRINT];
    next[..keep].copy_from_slice(&t.fingerprint[t.fingerprint_len - keep..t.fingerprint_len]);
    next[keep..keep + take].copy_from_slice(&chunk[chunk.len() - take..]);
    t.fingerprint = next;
    t.fingerprint_len = keep + take;
}

/// True when the bytes just before the offset are still those that were read there.
fn fingerprint_matches(t: &Tailed) -> bool {
    let n = t.fingerprint_len;
    if n == 0 || (t.offset as usize) < n {
        return true;
    }
    let mut now = [0u8; FINGERPRINT];
    match t.file.read_at(&mut now[..n], t.offset - n as u64) {
        Ok(got) if got == n => now[..n] == t.fingerprint[..n],
        // Shorter: the file shrank under us; the size check catches it next time.
        Ok(_) => false,
        Err(_) => true,
    }
}
