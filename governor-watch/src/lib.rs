//! Live watching: follow many log files at once and deliver their records as they are written.
//! The I/O half of progress ingestion: this crate opens, watches and reads the files (and
//! MLflow's SQLite store, with the `mlflow-sqlite` feature); `governor-progress` turns the bytes
//! into records and the progress signal.
//!
//! One [`Watcher`] owns one inotify instance and either a thread running a single-threaded
//! tokio runtime ([`Watcher::spawn`]) or a task on the caller's runtime
//! ([`Watcher::spawn_task`], what the daemon uses); [`WatcherHandle::add`] asks it to follow a job's paths, and every record, format
//! detection and problem arrives on one `mpsc` channel as a [`WatchEvent`] tagged with the
//! job's key. The thread sleeps in `epoll` until the kernel reports a change: an idle watcher
//! costs no CPU, and there is no polling anywhere.
//!
//! For each path (or glob) of a job:
//! - the directories that decide which file it designates are watched (create, delete, move):
//!   a file that does not exist yet is picked up when it appears, a directory that does not
//!   exist yet by watching its deepest existing ancestor, and a glob such as
//!   `lightning_logs/version_*/metrics.csv` follows its most recently modified match, switching
//!   when a newer one appears;
//! - the file itself is watched by inode (modify, close-after-write): only appended bytes are
//!   read (`pread` from the last offset), at most 1 MiB per turn so one large file cannot
//!   starve the others;
//! - a line is parsed only once its terminator arrived; when the writer closes the file the
//!   unterminated last line is parsed too;
//! - truncation (copytruncate) is noticed when the file shrinks below the offset or the bytes
//!   just before the offset changed: reading restarts at 0;
//! - rename-rotation: a file renamed away is followed until a new file takes its path, then
//!   read to its end and dropped; a deleted file is read to its end and dropped, and followed
//!   again if it reappears;
//! - `trainer_state.json` (rewritten whole by Hugging Face) is re-read from the start after
//!   every close-after-write and only new `log_history` entries are delivered;
//! - problems (unreadable path, not a regular file, over-long lines, no known format) are
//!   reported once per file, never with any of the file's content.
//!
//! Paths are absolute host paths (the daemon resolves a container's paths through
//! `/proc/<pid>/root` before calling [`WatcherHandle::add`]).
//!
//! [`parse_file`] and [`parse_path`] read a file, a database or a log directory whole (what
//! `governor parse` does).
//!
//! Nothing here ever puts a file's content into an error or a log message: the daemon runs as
//! root and a job may point it at any path.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use governor_progress::{
    CustomFormat, Format, FormatChoice, ProgressConfig, ProgressError, Record,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

mod engine;
mod files;
#[cfg(feature = "mlflow-sqlite")]
pub mod mlflow_db;
mod pattern;

pub use files::{
    MAX_LOG_DIR_DEPTH, MAX_LOG_DIR_ENTRIES, log_dir_directories, log_dir_files, parse_file,
    parse_file_with, parse_path,
};
pub(crate) use files::{open_regular, open_regular_with};

/// What to follow for one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchSpec {
    /// Absolute paths or glob patterns (`*`, `?`, `[...]`; `*` does not cross `/`). Each is
    /// followed on its own; a glob follows its most recently modified match.
    pub paths: Vec<PathBuf>,
    /// Format of the files (default: detect).
    #[serde(default)]
    pub format: FormatChoice,
    /// A custom format; when given it is used whatever `format` says.
    #[serde(default)]
    pub custom: Option<CustomFormat>,
    /// Whose rights the files are opened with: the job's owner for paths that come from the job
    /// (its environment, a `run-job` request, a coordinator job), `None` (the watcher's own)
    /// for paths from the operator's configuration. See [`OpenAs`].
    #[serde(default)]
    pub owner: Option<FileOwner>,
}

impl From<&ProgressConfig> for WatchSpec {
    /// What to follow for a job configured so, with the watcher's own rights.
    fn from(c: &ProgressConfig) -> Self {
        WatchSpec {
            paths: c.paths.clone(),
            format: c.format,
            custom: c.custom.clone(),
            owner: None,
        }
    }
}

/// A user's credentials to open a job's log files with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileOwner {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    #[serde(default)]
    pub groups: Vec<u32>,
}

/// Opens a file read-only with a [`FileOwner`]'s rights, so that the whole path walk (every
/// directory, every symlink, `..`) is checked as that user would be checked: the watcher, which
/// runs as root in the daemon, never reads a file for a job that the job's owner could not
/// read. The daemon supplies one that switches the filesystem uid and groups of the calling
/// thread around `open` (this crate makes no system calls of that kind). Without one, a spec
/// with a non-root owner is refused.
pub type OpenAs = std::sync::Arc<
    dyn Fn(&std::path::Path, &FileOwner) -> std::io::Result<std::fs::File> + Send + Sync,
>;

/// Something that happened to a followed file.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchEvent {
    /// The job's key given to [`WatcherHandle::add`].
    pub key: Arc<str>,
    /// The file concerned (for a problem before any file was found: the path or pattern).
    pub file: Arc<Path>,
    pub kind: WatchEventKind,
}

/// Kinds of [`WatchEvent`].
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEventKind {
    /// Started following this file; its existing content is read first.
    Opened,
    /// The file's format is known (detected or configured).
    Format(Format),
    /// A record, in file order.
    Record(Record),
    /// The file was truncated or rewritten in place: reading restarted at its beginning.
    Truncated,
    /// Stopped following this file (deleted, or replaced by a newer file); everything it held
    /// was delivered.
    Closed,
    /// A problem with this file, reported once; the message names the file and never quotes
    /// its content.
    Problem(String),
}

/// Errors of [`WatcherHandle`] requests.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("watch paths must be absolute: {}", .0.display())]
    RelativePath(PathBuf),
    #[error("invalid glob pattern {pattern:?}: {message}")]
    BadPattern { pattern: String, message: String },
    #[error("a watch needs at least one path")]
    NoPaths,
    #[error(transparent)]
    Format(#[from] ProgressError),
    #[error("the watcher has stopped")]
    Stopped,
}

/// Counters of what the watcher holds (for tests and stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Keys added and not removed.
    pub keys: usize,
    /// Files open and followed.
    pub files: usize,
    /// inotify watches on files.
    pub file_watches: usize,
    /// inotify watches on directories.
    pub dir_watches: usize,
}

pub(crate) enum Command {
    Add {
        key: Arc<str>,
        spec: WatchSpec,
        reply: oneshot::Sender<Result<(), WatchError>>,
    },
    Remove {
        key: Arc<str>,
        reply: oneshot::Sender<()>,
    },
    Stats {
        reply: oneshot::Sender<WatchStats>,
    },
}

/// Starts watchers.
pub struct Watcher;

impl Watcher {
    /// Starts a watcher thread with its own inotify instance. Events are delivered on the
    /// returned channel (bounded by `capacity`: a consumer that falls behind slows reading
    /// down, the kernel queues the changes meanwhile). The watcher stops when every
    /// [`WatcherHandle`] is dropped or the receiver is.
    pub fn spawn(capacity: usize) -> std::io::Result<(WatcherHandle, mpsc::Receiver<WatchEvent>)> {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::channel(capacity.max(1));
        let (init_tx, init_rx) = std::sync::mpsc::channel::<std::io::Result<()>>();
        std::thread::Builder::new()
            .name("governor-watch".into())
            .spawn(move || engine::run_thread(cmd_rx, ev_tx, init_tx))?;
        init_rx
            .recv()
            .map_err(|_| std::io::Error::other("watcher thread exited during start-up"))??;
        Ok((WatcherHandle { tx: cmd_tx }, ev_rx))
    }

    /// Like [`Watcher::spawn`], but the watcher runs as a task on the current tokio runtime
    /// (which must have IO enabled) instead of on a thread of its own. On a single-threaded
    /// runtime this is the cheaper choice: handing a record to a consumer on the same thread
    /// costs no wake-up of another thread (with 1,000 jobs writing 176 rows/s, the daemon spent
    /// ~20% of its CPU on the two threads waking each other). The task stops like the thread.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn_task(
        capacity: usize,
    ) -> std::io::Result<(WatcherHandle, mpsc::Receiver<WatchEvent>)> {
        Self::spawn_task_opening_as(capacity, None)
    }

    /// [`Watcher::spawn_task`] with the function that opens files of specs that name an owner.
    pub fn spawn_task_opening_as(
        capacity: usize,
        open_as: Option<OpenAs>,
    ) -> std::io::Result<(WatcherHandle, mpsc::Receiver<WatchEvent>)> {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::channel(capacity.max(1));
        let stream = engine::open_stream()?;
        tokio::spawn(engine::run(stream, cmd_rx, ev_tx, open_as));
        Ok((WatcherHandle { tx: cmd_tx }, ev_rx))
    }
}

/// Adds and removes watches. Cheap to clone; the watcher stops when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct WatcherHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl WatcherHandle {
    /// Follows `spec`'s paths for `key` (replacing what `key` followed before). Fails on a
    /// relative path, a bad glob or a bad custom format; paths that do not exist yet are fine.
    pub async fn add(&self, key: &str, spec: WatchSpec) -> Result<(), WatchError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Add {
                key: Arc::from(key),
                spec,
                reply,
            })
            .map_err(|_| WatchError::Stopped)?;
        rx.await.map_err(|_| WatchError::Stopped)?
    }

    /// Stops following `key`'s files (no event is delivered for them afterwards). Removing an
    /// unknown key does nothing.
    pub async fn remove(&self, key: &str) -> Result<(), WatchError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Remove {
                key: Arc::from(key),
                reply,
            })
            .map_err(|_| WatchError::Stopped)?;
        rx.await.map_err(|_| WatchError::Stopped)
    }

    /// What the watcher holds now.
    pub async fn stats(&self) -> Result<WatchStats, WatchError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Stats { reply })
            .map_err(|_| WatchError::Stopped)?;
        rx.await.map_err(|_| WatchError::Stopped)
    }
}
