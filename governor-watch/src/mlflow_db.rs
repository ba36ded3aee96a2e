//! MLflow's SQLite tracking store, read-only.
//!
//! MLflow 3 writes a local run to `sqlite:///mlflow.db` in the working directory by default
//! (its file store `mlruns/` is in "maintenance mode" and needs `MLFLOW_ALLOW_FILE_STORE`).
//! Each logged value is a row of the `metrics` table (`key, value, timestamp, step, is_nan,
//! run_uuid`); `runs` has each run's `start_time`.
//!
//! **Crate.** rusqlite (maintained, the usual SQLite binding) with its `bundled` feature:
//! rusqlite 0.43 needs SQLite 3.44 or later and Debian 12 ships 3.40.1, so SQLite's own C
//! source is compiled in (which also spares nodes a libsqlite3 dependency). It sits behind the
//! `mlflow-sqlite` feature (default on) so that the crate can be built without any C code.
//!
//! **Never in the writer's way.** The database is opened with `SQLITE_OPEN_READ_ONLY` and the
//! URI parameter `mode=ro` (`immutable` is never set: SQLite's locking stays on, so no torn
//! page is ever read). Each read is one statement in autocommit mode, bounded to
//! [`BATCH_ROWS`] rows: the shared lock it takes lasts milliseconds and is never held between
//! reads, so MLflow's writer (which waits up to 5 s for a lock) is never locked out. A reader
//! that finds the writer committing waits at most [`BUSY_TIMEOUT`] and otherwise tries again at
//! the next change (the journal's removal at the end of the commit is one).
//!
//! **Rows to records.** History: every row, runs in the order they started, rows in the order
//! they were written. Then new rows by `rowid` (SQLite gives a new row the largest rowid plus
//! one). Turning rows into records needs no database and is the progress crate's
//! ([`governor_progress::mlflow_rows`]): this module only reads.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use governor_progress::mlflow_rows::{MetricRow, RowGrouper};
use governor_progress::{Format, ProgressError, RecordData};

/// Rows read by one statement.
pub const BATCH_ROWS: usize = 5000;
/// How long a read waits for the writer's commit to end.
pub const BUSY_TIMEOUT: Duration = Duration::from_millis(100);

/// A read-only follower of one MLflow database.
pub struct MlflowDb {
    conn: Connection,
    path: Arc<Path>,
    last_rowid: i64,
    grouper: RowGrouper,
    history_read: bool,
    /// The `metrics` table was seen (checked at open, or at the first read when the writer held
    /// its lock at open).
    checked: bool,
}

fn sql_error(path: &Path, e: rusqlite::Error) -> ProgressError {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseLocked};
    let kind = match e.sqlite_error_code() {
        Some(DatabaseBusy | DatabaseLocked) => std::io::ErrorKind::WouldBlock,
        _ => std::io::ErrorKind::Other,
    };
    ProgressError::Read {
        path: path.to_owned(),
        source: std::io::Error::new(kind, format!("reading the MLflow database: {e}")),
    }
}

/// `file:` URI of a path (`?`, `#` and `%` escaped).
fn uri(path: &Path) -> String {
    let mut out = String::from("file:");
    for b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'?' | b'#' | b'%' => out.push_str(&format!("%{b:02X}")),
            _ if b.is_ascii() => out.push(char::from(*b)),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out.push_str("?mode=ro");
    out
}

impl MlflowDb {
    /// Opens `path` read-only; fails when it is no MLflow database (no `metrics` table).
    pub fn open(path: &Path) -> Result<Self, ProgressError> {
        let conn = Connection::open_with_flags(
            uri(path),
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| sql_error(path, e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| sql_error(path, e))?;
        let mut db = MlflowDb {
            conn,
            path: Arc::from(path),
            last_rowid: 0,
            grouper: RowGrouper::new(),
            history_read: false,
            checked: false,
        };
        match db.check() {
            // A writer mid-commit: opened all the same, checked at the first read (which the
            // caller retries while the database is busy), never refused for being busy.
            Err(e) if Self::is_busy(&e) => Ok(db),
            Err(e) => Err(e),
            Ok(()) => Ok(db),
        }
    }

    /// Fails unless the database has MLflow's `metrics` table.
    fn check(&mut self) -> Result<(), ProgressError> {
        if self.checked {
            return Ok(());
        }
        let has_metrics: bool = self
            .conn
            .query_row(
                "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'metrics'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| sql_error(&self.path, e))?;
        if !has_metrics {
            return Err(ProgressError::FormatNotFound {
                file: self.path.display().to_string(),
                format: Format::MlflowSqlite,
            });
        }
        self.checked = true;
        Ok(())
    }

    /// The database's path.
    pub fn path(&self) -> &Arc<Path> {
        &self.path
    }

    /// Reads what is new: the whole history on the first call (runs in the order they
    /// started), then rows written since. A database busy beyond [`BUSY_TIMEOUT`] is an error
    /// the caller retries at the next change.
    pub fn read_new(&mut self, out: &mut Vec<RecordData>) -> Result<(), ProgressError> {
        self.check()?;
        let rows = if self.history_read {
            self.new_rows()
        } else {
            self.history()
        }
        .map_err(|e| sql_error(&self.path, e))?;
        self.history_read = true;
        self.grouper.group(rows, out);
        Ok(())
    }

    /// True when a read failed only because the writer held its lock.
    pub fn is_busy(e: &ProgressError) -> bool {
        matches!(e, ProgressError::Read { source, .. } if source.kind() == std::io::ErrorKind::WouldBlock)
    }

    fn history(&mut self) -> rusqlite::Result<Vec<MetricRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT m.rowid, m.key, m.value, m.is_nan, m.step, m.timestamp, m.run_uuid
             FROM metrics m LEFT JOIN runs r ON r.run_uuid = m.run_uuid
             ORDER BY r.start_time, m.run_uuid, m.rowid",
        )?;
        let rows = stmt
            .query_map([], row)?
            .collect::<rusqlite::Result<Vec<MetricRow>>>()?;
        if let Some(max) = rows.iter().map(|r| r.rowid).max() {
            self.last_rowid = max;
        }
        Ok(rows)
    }

    fn new_rows(&mut self) -> rusqlite::Result<Vec<MetricRow>> {
        let mut all = Vec::new();
        loop {
            let mut stmt = self.conn.prepare_cached(
                "SELECT rowid, key, value, is_nan, step, timestamp, run_uuid FROM metrics
                 WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
            )?;
            let rows = stmt
                .query_map((self.last_rowid, BATCH_ROWS as i64), row)?
                .collect::<rusqlite::Result<Vec<MetricRow>>>()?;
            let n = rows.len();
            if let Some(last) = rows.last() {
                self.last_rowid = last.rowid;
            }
            all.extend(rows);
            if n < BATCH_ROWS {
                return Ok(all);
            }
        }
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MetricRow> {
    let is_nan: Option<bool> = r.get(3)?;
    let value: Option<f64> = r.get(2)?;
    Ok(MetricRow {
        rowid: r.get(0)?,
        key: r.get(1)?,
        value: if is_nan.unwrap_or(false) {
            f64::NAN
        } else {
            value.unwrap_or(f64::NAN)
        },
        step: r.get::<_, Option<i64>>(4)?.unwrap_or(0),
        timestamp: r.get::<_, Option<i64>>(5)?.unwrap_or(0),
        run: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MLflow 3's tables, as its migrations leave them (the columns read here).
    pub(crate) const SCHEMA: &str = "
        CREATE TABLE runs (run_uuid VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(250),
            status VARCHAR(9), start_time BIGINT, end_time BIGINT, experiment_id INTEGER);
        CREATE TABLE metrics (key VARCHAR(250) NOT NULL, value FLOAT NOT NULL,
            timestamp BIGINT NOT NULL, run_uuid VARCHAR(32) NOT NULL, step BIGINT DEFAULT '0' NOT NULL,
            is_nan BOOLEAN DEFAULT '0' NOT NULL,
            CONSTRAINT metric_pk PRIMARY KEY (key, timestamp, step, run_uuid, value, is_nan));";

    #[test]
    fn uri_escapes_what_sqlite_would_read_as_parameters() {
        assert_eq!(uri(Path::new("/a b/m?.db")), "file:/a b/m%3F.db?mode=ro");
        assert_eq!(uri(Path::new("/x/%#")), "file:/x/%25%23?mode=ro");
    }

    #[test]
    fn rows_of_one_call_are_one_record_and_new_rows_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlflow.db");
        let w = Connection::open(&path).unwrap();
        w.execute_batch(SCHEMA).unwrap();
        w.execute_batch(
            "INSERT INTO runs VALUES ('b', 'second', 'RUNNING', 200, NULL, 0);
             INSERT INTO runs VALUES ('a', 'first', 'FINISHED', 100, 150, 0);
             INSERT INTO metrics VALUES ('loss', 0.9, 1000, 'b', 0, 0);
             INSERT INTO metrics VALUES ('loss', 0.5, 10, 'a', 0, 0);
             INSERT INTO metrics VALUES ('val_loss', 0.6, 10, 'a', 0, 0);
             INSERT INTO metrics VALUES ('loss', 0, 20, 'a', 1, 1);",
        )
        .unwrap();
        let mut db = MlflowDb::open(&path).unwrap();
        let mut out = Vec::new();
        db.read_new(&mut out).unwrap();
        // Run a (started first): one record of two metrics, then the NaN; then run b.
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].metrics.len(), 2);
        assert_eq!(out[0].metrics.get("val_loss"), Some(0.6));
        assert!(out[1].metrics.get("loss").unwrap().is_nan());
        assert_eq!(out[2].metrics.get("loss"), Some(0.9));
        out.clear();
        w.execute(
            "INSERT INTO metrics VALUES ('loss', 0.8, 1100, 'b', 1, 0)",
            [],
        )
        .unwrap();
        db.read_new(&mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].step, Some(1));
        out.clear();
        db.read_new(&mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn a_database_without_metrics_is_not_mlflow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        assert!(matches!(
            MlflowDb::open(&path),
            Err(ProgressError::FormatNotFound { .. })
        ));
    }

    #[test]
    fn a_database_busy_when_opened_is_opened_and_read_once_the_writer_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlflow.db");
        let w = Connection::open(&path).unwrap();
        w.execute_batch(SCHEMA).unwrap();
        // The writer holds its lock through the open (a rollback journal: readers wait).
        w.execute_batch(
            "BEGIN EXCLUSIVE; INSERT INTO metrics VALUES ('loss', 0.5, 10, 'a', 0, 0);",
        )
        .unwrap();
        let mut db = MlflowDb::open(&path).expect("a busy database is still opened");
        let mut out = Vec::new();
        let busy = db.read_new(&mut out).unwrap_err();
        assert!(MlflowDb::is_busy(&busy), "{busy}");
        w.execute_batch("COMMIT").unwrap();
        db.read_new(&mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].metrics.get("loss"), Some(0.5));
        // A database without MLflow's tables, busy at open, is refused at its first read.
        let other = dir.path().join("other.db");
        let w = Connection::open(&other).unwrap();
        w.execute_batch("CREATE TABLE t (x); BEGIN EXCLUSIVE; INSERT INTO t VALUES (1);")
            .unwrap();
        let mut db = MlflowDb::open(&other).unwrap();
        w.execute_batch("COMMIT").unwrap();
        assert!(matches!(
            db.read_new(&mut out),
            Err(ProgressError::FormatNotFound { .. })
        ));
    }

    #[test]
    fn the_reader_never_blocks_a_writer() {
        // A writer inserting rows one transaction at a time while the reader polls as fast as
        // it can: every insert succeeds within its own busy timeout and the reader sees them
        // all.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlflow.db");
        let w = Connection::open(&path).unwrap();
        w.execute_batch(SCHEMA).unwrap();
        w.execute(
            "INSERT INTO runs VALUES ('a', 'r', 'RUNNING', 1, NULL, 0)",
            [],
        )
        .unwrap();
        let writer_path = path.clone();
        let writer = std::thread::spawn(move || {
            let w = Connection::open(&writer_path).unwrap();
            // MLflow's SQLAlchemy engine waits for locks like this (Python's default 5 s).
            w.busy_timeout(Duration::from_secs(5)).unwrap();
            for i in 0..300i64 {
                w.execute(
                    "INSERT INTO metrics VALUES ('loss', ?1, ?2, 'a', ?2, 0)",
                    (1.0 / (i + 1) as f64, i),
                )
                .expect("the writer was locked out");
            }
        });
        let mut db = MlflowDb::open(&path).unwrap();
        let mut seen = 0;
        let mut busy = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while seen < 300 && std::time::Instant::now() < deadline {
            let mut out = Vec::new();
            match db.read_new(&mut out) {
                Ok(()) => seen += out.len(),
                Err(e) if MlflowDb::is_busy(&e) => busy += 1,
                Err(e) => panic!("{e}"),
            }
        }
        writer.join().unwrap();
        let mut out = Vec::new();
        db.read_new(&mut out).unwrap();
        seen += out.len();
        assert_eq!(seen, 300, "{busy} reads found the writer committing");
    }
}
