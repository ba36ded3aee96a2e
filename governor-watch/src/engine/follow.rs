//! The engine's following of paths: watching the directories a pattern needs, opening the file
//! (or a log directory's files) it designates, and closing files that are gone or replaced.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use governor_progress::LogStream;

use super::{
    DirWatch, Engine, FINGERPRINT, FileId, FileWatch, MAX_RESYNC_ROUNDS, PathProblem, Tailed,
    Trigger, dir_mask, file_mask,
};
use crate::{Format, WatchEvent, WatchEventKind, open_regular, open_regular_with};

impl Engine {
    /// Brings a pattern's watched directories and followed file in line with the filesystem.
    pub(super) fn resync(&mut self, key: &Arc<str>, idx: usize) {
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

    pub(super) fn release_dir(&mut self, wd: i32, key: &Arc<str>, idx: usize) {
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
    pub(super) fn close(&mut self, id: FileId, drain: bool, announce: bool) -> Option<LogStream> {
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
}

/// Opens an MLflow database the watcher already opened as a file (with the job owner's rights,
/// so the owner can read it), checking that SQLite opened the same file.
#[cfg(feature = "mlflow-sqlite")]
pub(super) fn open_db(
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<crate::mlflow_db::MlflowDb, String> {
    let db = crate::mlflow_db::MlflowDb::open(path).map_err(|e| e.to_string())?;
    match std::fs::metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) => Ok(db),
        _ => Err(format!(
            "cannot read {}: the file changed while it was being opened",
            path.display()
        )),
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
