//! The watcher's state machine: one task owning the inotify instance, the followed files and
//! the watches. Everything here runs on the watcher's own thread; reads are `pread`s of regular
//! files (never FIFOs or devices: [`open_regular`](crate::open_regular) refuses them).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc;

use super::pattern::PathPattern;
use super::{Command, WatchError, WatchEvent, WatchSpec, WatchStats};
use crate::{Format, Record};
use governor_progress::LogStream;

mod follow;
mod read;

/// Bytes read from one file before the others get a turn.
const READ_BUDGET: u64 = 1 << 20;
/// Size of one `pread`.
const READ_CHUNK: usize = 256 << 10;
/// A file still in no known format after this many bytes is reported (once).
const UNDETECTED_REPORT_BYTES: u64 = 1 << 20;
/// Bytes before the read offset remembered to notice a file rewritten in place. Log lines
/// often end alike (`, mfu 0.01%`): the window covers whole lines, values included.
const FINGERPRINT: usize = 256;
/// Rounds of watching newly found directories in one resync (a path being created level by
/// level while we watch it).
const MAX_RESYNC_ROUNDS: usize = 16;
/// Size of the buffer inotify events are read into.
const EVENT_BUFFER: usize = 64 << 10;

type FileId = u64;

fn dir_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ATTRIB
        | WatchMask::ONLYDIR
}

fn file_mask() -> WatchMask {
    WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
}

/// Problems reported once per path of a pattern until the path opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PathProblem {
    Unreadable,
    Watch,
}

struct PatternState {
    pattern: PathPattern,
    /// Watched directories and their watch ids.
    dirs: HashMap<PathBuf, i32>,
    current: Option<FileId>,
    /// A log directory's files (the pattern names a directory: every event file, MLflow metric
    /// file and database under it is followed).
    dir_files: HashMap<PathBuf, FileId>,
    reported: HashSet<(PathProblem, PathBuf)>,
}

struct KeyState {
    spec: WatchSpec,
    patterns: Vec<PatternState>,
}

struct Tailed {
    key: Arc<str>,
    pattern: usize,
    path: Arc<Path>,
    file: File,
    dev_ino: (u64, u64),
    wd: i32,
    offset: u64,
    fingerprint: [u8; FINGERPRINT],
    fingerprint_len: usize,
    stream: LogStream,
    /// An MLflow database is read by SQL, not by bytes (`stream` is then unused).
    #[cfg(feature = "mlflow-sqlite")]
    db: Option<Box<crate::mlflow_db::MlflowDb>>,
    format_announced: bool,
    /// Skipped event records (bad checksum) or lost framing were reported.
    bad_records_reported: bool,
    long_lines_reported: bool,
    unknown_reported: bool,
    read_error_reported: bool,
    /// The writer closed the file; flush when the (budgeted) read reaches the end.
    close_pending: bool,
    queued: bool,
}

struct DirWatch {
    wd: WatchDescriptor,
    users: HashSet<(Arc<str>, usize)>,
}

struct FileWatch {
    wd: WatchDescriptor,
    files: Vec<FileId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    /// First read after opening.
    Opened,
    /// The file was written.
    Modified,
    /// The writer closed it after writing.
    ClosedWrite,
    /// More to read after a budgeted turn.
    Continue,
    /// Events may have been lost (queue overflow): read what is there.
    Rescan,
    /// Last read before dropping the file: to the end, then flush.
    Drain,
}

pub(super) struct Engine {
    watches: Watches,
    keys: HashMap<Arc<str>, KeyState>,
    files: HashMap<FileId, Tailed>,
    next_file: FileId,
    dir_watches: HashMap<i32, DirWatch>,
    file_watches: HashMap<i32, FileWatch>,
    ready: VecDeque<FileId>,
    outbox: Vec<WatchEvent>,
    buf: Vec<u8>,
    records: Vec<Record>,
    open_as: Option<super::OpenAs>,
}

/// Body of the watcher thread.
pub(super) fn run_thread(
    cmds: mpsc::UnboundedReceiver<Command>,
    events: mpsc::Sender<WatchEvent>,
    init: std::sync::mpsc::Sender<io::Result<()>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = init.send(Err(e));
            return;
        }
    };
    rt.block_on(async move {
        let stream = match open_stream() {
            Ok(s) => s,
            Err(e) => {
                let _ = init.send(Err(e));
                return;
            }
        };
        let _ = init.send(Ok(()));
        run(stream, cmds, events, None).await;
    });
}

/// A new inotify instance as a stream (needs a tokio runtime with IO enabled).
pub(super) fn open_stream() -> io::Result<EventStream<Vec<u8>>> {
    Inotify::init().and_then(|i| i.into_event_stream(vec![0u8; EVENT_BUFFER]))
}

/// The watcher's loop. Events wait in `pending` until the channel has room; meanwhile commands
/// are still answered (a consumer that awaits an `add` while the channel is full must not
/// deadlock), but no more is read from the files: a slow consumer slows reading down.
pub(super) async fn run(
    mut stream: EventStream<Vec<u8>>,
    mut cmds: mpsc::UnboundedReceiver<Command>,
    events: mpsc::Sender<WatchEvent>,
    open_as: Option<super::OpenAs>,
) {
    let mut engine = Engine::new(stream.watches());
    engine.open_as = open_as;
    let mut pending: VecDeque<WatchEvent> = VecDeque::new();
    loop {
        let has_ready = !engine.ready.is_empty();
        let delivering = !pending.is_empty();
        tokio::select! {
            biased;
            cmd = cmds.recv() => match cmd {
                Some(cmd) => {
                    if let Command::Remove { key, .. } = &cmd {
                        // Nothing of a removed key is delivered after its removal.
                        pending.retain(|ev| ev.key != *key);
                    }
                    engine.command(cmd);
                }
                None => break,
            },
            permit = events.reserve(), if delivering => {
                let Ok(permit) = permit else { return };
                permit.send(pending.pop_front().expect("delivering"));
                while let Some(ev) = pending.pop_front() {
                    match events.try_reserve() {
                        Ok(permit) => permit.send(ev),
                        Err(mpsc::error::TrySendError::Full(())) => {
                            pending.push_front(ev);
                            break;
                        }
                        Err(mpsc::error::TrySendError::Closed(())) => return,
                    }
                }
            },
            ev = stream.next(), if !delivering => match ev {
                Some(Ok(ev)) => engine.inotify_event(&ev),
                Some(Err(error)) => {
                    tracing::error!(%error, "reading inotify events failed; the watcher stops");
                    break;
                }
                None => break,
            },
            () = std::future::ready(()), if has_ready && !delivering => {
                engine.continue_ready();
                // A backlog (a job's long existing log, read at most 1 MiB a turn) must not keep
                // the thread: as a task on the daemon's thread, the control loop runs between
                // chunks (yielding costs nothing measurable next to parsing 1 MiB).
                tokio::task::yield_now().await;
            }
        }
        pending.extend(engine.outbox.drain(..));
        if events.is_closed() {
            return;
        }
    }
}

impl Engine {
    fn new(watches: Watches) -> Self {
        Engine {
            watches,
            keys: HashMap::new(),
            files: HashMap::new(),
            next_file: 0,
            dir_watches: HashMap::new(),
            file_watches: HashMap::new(),
            ready: VecDeque::new(),
            outbox: Vec::new(),
            buf: vec![0u8; READ_CHUNK],
            records: Vec::new(),
            open_as: None,
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Add { key, spec, reply } => {
                let _ = reply.send(self.add(key, spec));
            }
            Command::Remove { key, reply } => {
                self.remove(&key);
                let _ = reply.send(());
            }
            Command::Stats { reply } => {
                let _ = reply.send(WatchStats {
                    keys: self.keys.len(),
                    files: self.files.len(),
                    file_watches: self.file_watches.len(),
                    dir_watches: self.dir_watches.len(),
                });
            }
        }
    }

    fn add(&mut self, key: Arc<str>, spec: WatchSpec) -> Result<(), WatchError> {
        if spec.paths.is_empty() {
            return Err(WatchError::NoPaths);
        }
        let patterns = spec
            .paths
            .iter()
            .map(|p| PathPattern::new(p))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(custom) = &spec.custom {
            custom.validate()?;
        } else if spec.format == crate::FormatChoice::Fixed(Format::Custom) {
            return Err(crate::ProgressError::CustomMissing.into());
        }
        self.remove(&key);
        let n = patterns.len();
        self.keys.insert(
            key.clone(),
            KeyState {
                spec,
                patterns: patterns
                    .into_iter()
                    .map(|pattern| PatternState {
                        pattern,
                        dirs: HashMap::new(),
                        current: None,
                        dir_files: HashMap::new(),
                        reported: HashSet::new(),
                    })
                    .collect(),
            },
        );
        tracing::debug!(key = %key, patterns = n, "watching");
        for idx in 0..n {
            self.resync(&key, idx);
        }
        Ok(())
    }

    fn remove(&mut self, key: &Arc<str>) {
        let Some(ks) = self.keys.get(key) else { return };
        let n = ks.patterns.len();
        for idx in 0..n {
            let (dirs, current, dir_files) = {
                let ps = &mut self.keys.get_mut(key).expect("present").patterns[idx];
                (
                    std::mem::take(&mut ps.dirs),
                    ps.current.take(),
                    std::mem::take(&mut ps.dir_files),
                )
            };
            for (_, wd) in dirs {
                self.release_dir(wd, key, idx);
            }
            for id in current.into_iter().chain(dir_files.into_values()) {
                self.close(id, false, false);
            }
        }
        self.keys.remove(key);
    }

    fn pattern_mut(&mut self, key: &Arc<str>, idx: usize) -> Option<&mut PatternState> {
        self.keys.get_mut(key)?.patterns.get_mut(idx)
    }

    fn inotify_event(&mut self, ev: &EventOwned) {
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            tracing::warn!("inotify queue overflowed; rescanning every watched file");
            self.rescan_everything();
            return;
        }
        let id = ev.wd.get_watch_descriptor_id();
        if ev.mask.contains(EventMask::IGNORED) {
            self.watch_gone(id);
            return;
        }
        if let Some(fw) = self.file_watches.get(&id) {
            for f in fw.files.clone() {
                self.file_event(f, ev.mask);
            }
        }
        if let Some(dw) = self.dir_watches.get(&id) {
            let users: Vec<(Arc<str>, usize)> = dw.users.iter().cloned().collect();
            for (key, idx) in users {
                let relevant = match (&ev.name, self.pattern_mut(&key, idx)) {
                    (Some(name), Some(ps)) => ps
                        .dirs
                        .iter()
                        .find(|(_, wd)| **wd == id)
                        .is_none_or(|(dir, _)| ps.pattern.affected_by(dir, name)),
                    // The directory itself changed.
                    _ => true,
                };
                if relevant {
                    self.resync(&key, idx);
                }
            }
        }
    }

    fn file_event(&mut self, id: FileId, mask: EventMask) {
        if mask.contains(EventMask::MODIFY) {
            self.read(id, Trigger::Modified);
        }
        if mask.contains(EventMask::CLOSE_WRITE) {
            self.read(id, Trigger::ClosedWrite);
        }
        if mask.intersects(EventMask::ATTRIB | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
            && let Some(t) = self.files.get(&id)
        {
            let (key, idx) = (t.key.clone(), t.pattern);
            self.resync(&key, idx);
        }
    }

    /// The kernel dropped a watch (its directory was deleted, its filesystem unmounted).
    fn watch_gone(&mut self, id: i32) {
        let mut to_resync = Vec::new();
        if let Some(dw) = self.dir_watches.remove(&id) {
            for (key, idx) in dw.users {
                if let Some(ps) = self.pattern_mut(&key, idx) {
                    ps.dirs.retain(|_, wd| *wd != id);
                }
                to_resync.push((key, idx));
            }
        }
        if let Some(fw) = self.file_watches.remove(&id) {
            for f in fw.files {
                if let Some(t) = self.files.get_mut(&f) {
                    t.wd = -1;
                    to_resync.push((t.key.clone(), t.pattern));
                }
            }
        }
        for (key, idx) in to_resync {
            self.resync(&key, idx);
        }
    }

    fn rescan_everything(&mut self) {
        let all: Vec<(Arc<str>, usize)> = self
            .keys
            .iter()
            .flat_map(|(k, ks)| (0..ks.patterns.len()).map(move |i| (k.clone(), i)))
            .collect();
        for (key, idx) in all {
            self.resync(&key, idx);
        }
        let ids: Vec<FileId> = self.files.keys().copied().collect();
        for id in ids {
            self.read(id, Trigger::Rescan);
        }
    }
}
