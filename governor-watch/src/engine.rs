//! The watcher's state machine: one task owning the inotify instance, the followed files and
//! the watches. Everything here runs on the watcher's own thread; reads are `pread`s of regular
//! files (never FIFOs or devices: [`open_regular`] refuses them).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt;
use inotify::{EventMask, EventOwned, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc;

use super::pattern::PathPattern;
use super::{Command, WatchError, WatchEvent, WatchEventKind, WatchSpec, WatchStats};
use crate::{Format, Record, open_regular, open_regular_with};
use governor_progress::{LogStream, MAX_LINE_BYTES};

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

    /// Brings a pattern's watched directories and followed file in line with the filesystem.
    fn resync(&mut self, key: &Arc<str>, idx: usize) {
        // Watch first, look second: an entry created after a directory's listing but before its
        // watch existed would otherwise never be seen. Each round watches what the previous one
        // found (a directory that appeared meanwhile), until nothing new turns up.
        for _ in 0..MAX_RESYNC_ROUNDS {
            if !self.sync_directories(key, idx) {
                break;
            }
        }
        let Some(ps) = self.pattern_mut(key, idx) else {
            return;
        };
        if ps.pattern.log_dir().is_some() || !ps.dir_files.is_empty() {
            self.resync_dir(key, idx);
            return;
        }
        let candidate = ps.pattern.current_file();
        let current = ps.current;
        let cand_inode = candidate
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map(|m| (m.dev(), m.ino()));
        match (current, candidate) {
            (None, None) => {}
            (None, Some(path)) => self.open(key, idx, path, None),
            (Some(id), candidate) => {
                let Some(t) = self.files.get(&id) else { return };
                if cand_inode == Some(t.dev_ino) {
                    // An MLflow database's writer ended a commit (its journal went away).
                    #[cfg(feature = "mlflow-sqlite")]
                    if t.db.is_some() {
                        self.read(id, Trigger::Modified);
                    }
                    return;
                }
                let linked = t.file.metadata().map(|m| m.nlink() > 0).unwrap_or(false);
                match candidate {
                    Some(path) if cand_inode.is_some() => {
                        // Another file took over: finish this one, follow that one.
                        let stream = self.close(id, true, true);
                        let carried =
                            stream.filter(|s| s.format().is_some_and(Format::is_document));
                        self.open(key, idx, path, carried);
                    }
                    _ if !linked => {
                        self.close(id, true, true);
                    }
                    // Renamed away and nothing new yet: keep following it.
                    _ => {}
                }
            }
        }
    }

    /// A log directory: follows every file of it that [`crate::log_dir_files`] lists (new
    /// runs, new files), in that order; files that are gone are read to their end and dropped;
    /// a file replaced by another of the same name is followed anew.
    fn resync_dir(&mut self, key: &Arc<str>, idx: usize) {
        let Some(ps) = self.pattern_mut(key, idx) else {
            return;
        };
        let wanted = ps
            .pattern
            .log_dir()
            .map(|d| crate::log_dir_files(&d))
            .unwrap_or_default();
        let followed: Vec<(PathBuf, FileId)> = ps
            .dir_files
            .iter()
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        let wanted_set: HashSet<&PathBuf> = wanted.iter().collect();
        for (path, id) in followed {
            let same_inode = std::fs::metadata(&path)
                .ok()
                .map(|m| (m.dev(), m.ino()))
                .zip(self.files.get(&id).map(|t| t.dev_ino))
                .is_some_and(|(a, b)| a == b);
            if !wanted_set.contains(&path) || !same_inode {
                self.close(id, true, true);
                continue;
            }
            // An MLflow database's writer ended a commit (its journal went away).
            #[cfg(feature = "mlflow-sqlite")]
            if self.files.get(&id).is_some_and(|t| t.db.is_some()) {
                self.read(id, Trigger::Modified);
            }
        }
        for path in wanted {
            let known = self
                .pattern_mut(key, idx)
                .is_some_and(|ps| ps.dir_files.contains_key(&path));
            if !known {
                self.open(key, idx, path, None);
            }
        }
    }

    /// Watches the directories the pattern needs now and drops the others; true when a new
    /// watch was added.
    fn sync_directories(&mut self, key: &Arc<str>, idx: usize) -> bool {
        let Some(ps) = self.pattern_mut(key, idx) else {
            return false;
        };
        let needed: HashSet<PathBuf> = ps.pattern.directories().into_iter().collect();
        let stale: Vec<(PathBuf, i32)> = ps
            .dirs
            .iter()
            .filter(|(d, _)| !needed.contains(*d))
            .map(|(d, wd)| (d.clone(), *wd))
            .collect();
        let fresh: Vec<PathBuf> = needed
            .into_iter()
            .filter(|d| !ps.dirs.contains_key(d))
            .collect();
        for (dir, wd) in stale {
            if let Some(ps) = self.pattern_mut(key, idx) {
                ps.dirs.remove(&dir);
            }
            self.release_dir(wd, key, idx);
        }
        let mut added = false;
        for dir in fresh {
            match self.watches.add(&dir, dir_mask()) {
                Ok(wd) => {
                    let id = wd.get_watch_descriptor_id();
                    self.dir_watches
                        .entry(id)
                        .or_insert_with(|| DirWatch {
                            wd,
                            users: HashSet::new(),
                        })
                        .users
                        .insert((key.clone(), idx));
                    if let Some(ps) = self.pattern_mut(key, idx) {
                        ps.dirs.insert(dir, id);
                    }
                    added = true;
                }
                // Gone again already: the parent's event will bring us back here.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let message = watch_error_message(&dir, &e);
                    self.path_problem(key, idx, PathProblem::Watch, &dir, message);
                }
            }
        }
        added
    }

    fn release_dir(&mut self, wd: i32, key: &Arc<str>, idx: usize) {
        if let Some(dw) = self.dir_watches.get_mut(&wd) {
            dw.users.remove(&(key.clone(), idx));
            if dw.users.is_empty()
                && let Some(dw) = self.dir_watches.remove(&wd)
            {
                let _ = self.watches.remove(dw.wd);
            }
        }
    }

    fn path_problem(
        &mut self,
        key: &Arc<str>,
        idx: usize,
        kind: PathProblem,
        path: &Path,
        message: String,
    ) {
        let Some(ps) = self.pattern_mut(key, idx) else {
            return;
        };
        if ps.reported.insert((kind, path.to_owned())) {
            tracing::warn!(key = %key, file = %path.display(), problem = %message, "log file problem");
            self.outbox.push(WatchEvent {
                key: key.clone(),
                file: Arc::from(path),
                kind: WatchEventKind::Problem(message),
            });
        }
    }

    fn open(&mut self, key: &Arc<str>, idx: usize, path: PathBuf, carried: Option<LogStream>) {
        let owner = self.keys.get(key).and_then(|k| k.spec.owner.clone());
        let opened = match owner {
            Some(o) if o.uid != 0 => match &self.open_as {
                Some(open_as) => open_regular_with(&path, |p| open_as(p, &o)).map_err(|e| {
                    format!(
                        "{e} (the log is read with the rights of its job's owner, uid {})",
                        o.uid
                    )
                }),
                None => Err(format!(
                    "cannot read {} as uid {}: this watcher cannot take a job owner's rights",
                    path.display(),
                    o.uid
                )),
            },
            _ => open_regular(&path).map_err(|e| e.to_string()),
        };
        let file = match opened {
            Ok(f) => f,
            Err(e) => {
                // The error names the path and the OS reason, nothing of the content.
                self.path_problem(key, idx, PathProblem::Unreadable, &path, e);
                return;
            }
        };
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => {
                let message = format!("cannot read {}: {e}", path.display());
                self.path_problem(key, idx, PathProblem::Unreadable, &path, message);
                return;
            }
        };
        // Watch the very inode opened (not whatever the path names a moment later).
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let wd = match self
            .watches
            .add(&by_fd, file_mask())
            .or_else(|_| self.watches.add(&path, file_mask()))
        {
            Ok(wd) => wd,
            Err(e) => {
                let message = watch_error_message(&path, &e);
                self.path_problem(key, idx, PathProblem::Watch, &path, message);
                return;
            }
        };
        #[cfg(feature = "mlflow-sqlite")]
        let db = if crate::files::is_sqlite(&file) {
            match open_db(&path, &meta) {
                Ok(db) => Some(Box::new(db)),
                Err(message) => {
                    self.path_problem(key, idx, PathProblem::Unreadable, &path, message);
                    return;
                }
            }
        } else {
            None
        };
        let Some(ks) = self.keys.get(key) else { return };
        let in_dir = ks
            .patterns
            .get(idx)
            .is_some_and(|ps| ps.pattern.log_dir().is_some());
        let label: Arc<Path> = Arc::from(path.as_path());
        let stream = match carried {
            Some(mut s) => {
                s.reopen(label.clone());
                s
            }
            None => match LogStream::new(label.clone(), ks.spec.format, ks.spec.custom.as_ref()) {
                Ok(s) => s,
                Err(e) => {
                    let message = e.to_string();
                    self.path_problem(key, idx, PathProblem::Unreadable, &path, message);
                    return;
                }
            },
        };
        let id = self.next_file;
        self.next_file += 1;
        let wd_id = wd.get_watch_descriptor_id();
        self.file_watches
            .entry(wd_id)
            .or_insert_with(|| FileWatch {
                wd,
                files: Vec::new(),
            })
            .files
            .push(id);
        self.files.insert(
            id,
            Tailed {
                key: key.clone(),
                pattern: idx,
                path: label.clone(),
                file,
                dev_ino: (meta.dev(), meta.ino()),
                wd: wd_id,
                offset: 0,
                fingerprint: [0; FINGERPRINT],
                fingerprint_len: 0,
                stream,
                #[cfg(feature = "mlflow-sqlite")]
                db,
                format_announced: false,
                bad_records_reported: false,
                long_lines_reported: false,
                unknown_reported: false,
                read_error_reported: false,
                close_pending: false,
                queued: false,
            },
        );
        if let Some(ps) = self.pattern_mut(key, idx) {
            if in_dir {
                ps.dir_files.insert(path.clone(), id);
            } else {
                ps.current = Some(id);
            }
            ps.reported.retain(|(_, p)| p != &path);
        }
        tracing::debug!(key = %key, file = %path.display(), "following log file");
        self.outbox.push(WatchEvent {
            key: key.clone(),
            file: label,
            kind: WatchEventKind::Opened,
        });
        self.read(id, Trigger::Opened);
    }

    /// Stops following a file; with `drain`, what it still holds is delivered first.
    fn close(&mut self, id: FileId, drain: bool, announce: bool) -> Option<LogStream> {
        if drain {
            self.read(id, Trigger::Drain);
        }
        let t = self.files.remove(&id)?;
        if let Some(fw) = self.file_watches.get_mut(&t.wd) {
            fw.files.retain(|f| *f != id);
            if fw.files.is_empty()
                && let Some(fw) = self.file_watches.remove(&t.wd)
            {
                let _ = self.watches.remove(fw.wd);
            }
        }
        self.ready.retain(|f| *f != id);
        if let Some(ps) = self.pattern_mut(&t.key, t.pattern) {
            if ps.current == Some(id) {
                ps.current = None;
            }
            ps.dir_files.retain(|_, f| *f != id);
        }
        if announce {
            tracing::debug!(key = %t.key, file = %t.path.display(), "stopped following log file");
            self.outbox.push(WatchEvent {
                key: t.key.clone(),
                file: t.path.clone(),
                kind: WatchEventKind::Closed,
            });
        }
        Some(t.stream)
    }

    fn continue_ready(&mut self) {
        if let Some(id) = self.ready.pop_front() {
            if let Some(t) = self.files.get_mut(&id) {
                t.queued = false;
            }
            self.read(id, Trigger::Continue);
        }
    }

    /// Reads what was appended to a file and delivers its records.
    fn read(&mut self, id: FileId, trigger: Trigger) {
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

/// Opens an MLflow database the watcher already opened as a file (with the job owner's rights,
/// so the owner can read it), checking that SQLite opened the same file.
#[cfg(feature = "mlflow-sqlite")]
fn open_db(path: &Path, meta: &std::fs::Metadata) -> Result<crate::mlflow_db::MlflowDb, String> {
    let db = crate::mlflow_db::MlflowDb::open(path).map_err(|e| e.to_string())?;
    match std::fs::metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) => Ok(db),
        _ => Err(format!(
            "cannot read {}: the file changed while it was being opened",
            path.display()
        )),
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

fn watch_error_message(path: &Path, e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        format!(
            "cannot watch {}: inotify watch limit reached (raise fs.inotify.max_user_watches)",
            path.display()
        )
    } else {
        format!("cannot watch {}: {e}", path.display())
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
