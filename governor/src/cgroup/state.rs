//! The state file: the original value of every cgroup file the governor has changed, so that a
//! governor that is stopped, killed or crashes leaves (or, on its next start, puts) every job
//! back as it found it.
//!
//! Format: JSON lines. The first line is a header (`{"governor_state":1,"pid":N}`), each further
//! line records an original (`{"record":{...}}`) or forgets one (`{"forget":"/sys/fs/..."}`).
//! A new original is *appended* and `fdatasync`ed before the cgroup file is first written, so
//! recording costs the same with 1 or 1,000 governed jobs (rewriting a whole JSON document per
//! record made the first apply of 1,000 jobs take 8.6 s; see the actuation benchmark). The file is
//! rewritten atomically (temporary file, `fsync`, `rename`, `fsync` of the directory) when it is
//! created, when forgotten lines outnumber live ones, and after restores; it is removed when
//! nothing is left to restore. A crash in the middle of an append leaves a torn last line: it is
//! ignored on load, correctly, since the cgroup write it announced was never made.
//!
//! The default location is under `/run`, a tmpfs: a reboot clears it together with the cgroups it
//! describes. One governor per node: an exclusive `flock` on `<state file>.lock` is held while the
//! actuator lives.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::error::CgroupError;
use super::knob::Knob;
use crate::sys::durable;

/// The default state file.
pub const DEFAULT_STATE_FILE: &str = "/run/governor/state.json";

const FORMAT_VERSION: u32 = 1;

/// One changed file and the value to put back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateEntry {
    /// The job's cgroup as shown in logs (`/kubepods/...`).
    pub job: String,
    /// Which file.
    pub knob: Knob,
    /// Absolute path of the file.
    pub path: PathBuf,
    /// Its content before the governor's first write (or the value someone else set later, see
    /// drift in the actuator), trimmed.
    pub original: String,
    /// Inode number of the cgroup directory when the original was recorded: a cgroup recreated
    /// under the same name (a new container) is not "restored" to an older one's value.
    pub cgroup_ino: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    governor_state: u32,
    /// Pid of the governor that wrote the file (for operators reading it).
    pid: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Record(StateEntry),
    Forget(PathBuf),
}

/// The locked state file.
#[derive(Debug)]
pub struct StateStore {
    path: PathBuf,
    _lock: Flock<File>,
    /// Append handle, when the file exists.
    appender: Option<File>,
    /// Lines after the header.
    lines: usize,
}

/// What [`StateStore::open`] found.
#[derive(Debug, Default)]
pub struct LoadedState {
    /// Entries left by a previous run (empty after a clean shutdown).
    pub entries: Vec<StateEntry>,
    /// Set when the file was unreadable and was set aside.
    pub corrupt: Option<CgroupError>,
}

/// Read the entries of a state file without locking it (for status displays and tests). A
/// missing file has no entries.
pub fn read_entries(path: &Path) -> Result<Vec<StateEntry>, CgroupError> {
    match fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(CgroupError::StateIo {
            path: path.to_owned(),
            error: source,
        }),
        Ok(bytes) => parse(&bytes).map_err(|reason| CgroupError::StateCorrupt {
            path: path.to_owned(),
            reason,
            set_aside: PathBuf::new(),
        }),
    }
}

/// Replay a state file's lines into its live entries, in recording order.
fn parse(bytes: &[u8]) -> Result<Vec<StateEntry>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut lines = text.split_inclusive('\n').peekable();
    let header = lines.next().ok_or("empty file")?;
    let header: Header =
        serde_json::from_str(header).map_err(|e| format!("bad header line: {e}"))?;
    if header.governor_state != FORMAT_VERSION {
        return Err(format!(
            "format version {} (this governor reads version {FORMAT_VERSION})",
            header.governor_state
        ));
    }
    let mut entries: Vec<StateEntry> = Vec::new();
    let mut number = 1;
    while let Some(line) = lines.next() {
        number += 1;
        match serde_json::from_str::<Line>(line) {
            Ok(Line::Record(entry)) => {
                entries.retain(|e| e.path != entry.path);
                entries.push(entry);
            }
            Ok(Line::Forget(path)) => entries.retain(|e| e.path != path),
            // A torn append (the governor died mid-write): the cgroup write it announced was
            // never made, so the line is rightly ignored.
            Err(_) if lines.peek().is_none() && !line.ends_with('\n') => {
                tracing::warn!(line = number, "state file ends with a torn line; ignored");
            }
            Err(e) => return Err(format!("line {number}: {e}")),
        }
    }
    Ok(entries)
}

impl StateStore {
    /// Lock and load the state file at `path`, creating its directory (mode 0700) if needed. An
    /// unparsable file is renamed to `<path>.corrupt` and reported, never fatal.
    pub fn open(path: &Path) -> Result<(StateStore, LoadedState), CgroupError> {
        let io_err = |source| CgroupError::StateIo {
            path: path.to_owned(),
            error: source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err)?;
        }
        let lock_path = with_suffix(path, ".lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err)?;
        let lock =
            Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
                if errno == nix::errno::Errno::EWOULDBLOCK {
                    CgroupError::StateLocked {
                        path: path.to_owned(),
                        lock: lock_path.clone(),
                    }
                } else {
                    io_err(std::io::Error::from(errno))
                }
            })?;
        // The lock makes this the file's only writer: what a killed one left can go.
        durable::sweep_temporaries(path);
        let mut store = StateStore {
            path: path.to_owned(),
            _lock: lock,
            appender: None,
            lines: 0,
        };
        let loaded = match fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => LoadedState::default(),
            Err(e) => return Err(io_err(e)),
            Ok(bytes) => match parse(&bytes) {
                Ok(entries) => {
                    // Start from a compact file: later appends go after a clean last line.
                    store.rewrite(entries.iter())?;
                    LoadedState {
                        entries,
                        corrupt: None,
                    }
                }
                Err(reason) => store.set_aside(reason)?,
            },
        };
        Ok((store, loaded))
    }

    fn set_aside(&self, reason: String) -> Result<LoadedState, CgroupError> {
        let set_aside = with_suffix(&self.path, ".corrupt");
        fs::rename(&self.path, &set_aside).map_err(|source| CgroupError::StateIo {
            path: self.path.clone(),
            error: source,
        })?;
        Ok(LoadedState {
            entries: Vec::new(),
            corrupt: Some(CgroupError::StateCorrupt {
                path: self.path.clone(),
                reason,
                set_aside,
            }),
        })
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io_err(&self, source: std::io::Error) -> CgroupError {
        CgroupError::StateIo {
            path: self.path.clone(),
            error: source,
        }
    }

    /// Record `added` and forget `removed` durably; `live` is the complete resulting set (used
    /// when the file is created or compacted instead of appended to).
    pub fn append<'a>(
        &mut self,
        added: &[StateEntry],
        removed: &[PathBuf],
        live: impl ExactSizeIterator<Item = &'a StateEntry>,
    ) -> Result<(), CgroupError> {
        let new_lines = added.len() + removed.len();
        if new_lines == 0 {
            return Ok(());
        }
        let live_count = live.len();
        let compact = live_count == 0 || self.lines + new_lines > 2 * live_count + 64;
        let Some(file) = self.appender.as_mut().filter(|_| !compact) else {
            return self.rewrite(live);
        };
        let mut buf = Vec::with_capacity(256 * new_lines);
        for entry in added {
            serde_json::to_writer(&mut buf, &Line::Record(entry.clone()))
                .map_err(|e| std::io::Error::other(e.to_string()))
                .map_err(|e| CgroupError::StateIo {
                    path: self.path.clone(),
                    error: e,
                })?;
            buf.push(b'\n');
        }
        for path in removed {
            serde_json::to_writer(&mut buf, &Line::Forget(path.clone()))
                .map_err(|e| std::io::Error::other(e.to_string()))
                .map_err(|e| CgroupError::StateIo {
                    path: self.path.clone(),
                    error: e,
                })?;
            buf.push(b'\n');
        }
        let result = file.write_all(&buf).and_then(|()| file.sync_data());
        if let Err(e) = result {
            // The file may now end with a torn line: the next change rewrites it whole.
            self.appender = None;
            return Err(self.io_err(e));
        }
        self.lines += new_lines;
        Ok(())
    }

    /// Replace the file with exactly `live` (atomically), or remove it when `live` is empty.
    pub fn rewrite<'a>(
        &mut self,
        live: impl IntoIterator<Item = &'a StateEntry>,
    ) -> Result<(), CgroupError> {
        let mut buf = Vec::new();
        let header = Header {
            governor_state: FORMAT_VERSION,
            pid: std::process::id(),
        };
        let to_io = |e: serde_json::Error| std::io::Error::other(e.to_string());
        serde_json::to_writer(&mut buf, &header).map_err(|e| self.io_err(to_io(e)))?;
        buf.push(b'\n');
        let mut count = 0;
        for entry in live {
            serde_json::to_writer(&mut buf, &Line::Record(entry.clone()))
                .map_err(|e| self.io_err(to_io(e)))?;
            buf.push(b'\n');
            count += 1;
        }
        self.appender = None;
        self.lines = 0;
        if count == 0 {
            return durable::remove_durably(&self.path).map_err(|e| self.io_err(e));
        }
        // Its owner's alone, as its directory (0700) and its lock.
        let appender = durable::write_durably_with_mode(&self.path, &buf, 0o600)
            .and_then(|()| OpenOptions::new().append(true).open(&self.path))
            .map_err(|e| self.io_err(e))?;
        self.appender = Some(appender);
        self.lines = count;
        Ok(())
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.to_owned().into_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u32) -> StateEntry {
        StateEntry {
            job: format!("/job{n}"),
            knob: Knob::CpuMax,
            path: PathBuf::from(format!("/sys/fs/cgroup/job{n}/cpu.max")),
            original: "max 100000".into(),
            cgroup_ino: Some(u64::from(n)),
        }
    }

    fn line_count(path: &Path) -> usize {
        fs::read_to_string(path).unwrap().lines().count()
    }

    #[test]
    fn appended_records_and_forgets_load_back_and_an_empty_state_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        {
            let (mut store, loaded) = StateStore::open(&path).unwrap();
            assert!(loaded.entries.is_empty());
            let live = [entry(1)];
            store.append(&live, &[], live.iter()).unwrap();
            let live = [entry(1), entry(2)];
            store.append(&live[1..], &[], live.iter()).unwrap();
            let live = [entry(2)];
            store.append(&[], &[entry(1).path], live.iter()).unwrap();
            assert_eq!(line_count(&path), 4, "header, record 1, record 2, forget 1");
            assert!(durable::temporaries(&path).is_empty());
            assert_eq!(read_entries(&path).unwrap(), vec![entry(2)]);
        }
        let (mut store, loaded) = StateStore::open(&path).unwrap();
        assert_eq!(loaded.entries, vec![entry(2)]);
        assert_eq!(line_count(&path), 2, "compacted on open");
        store.append(&[], &[entry(2).path], [].iter()).unwrap();
        assert!(!path.exists(), "an empty state should leave no file");
    }

    #[test]
    fn the_journal_is_compacted_when_forgotten_lines_pile_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let (mut store, _) = StateStore::open(&path).unwrap();
        let keep = entry(0);
        store
            .append(std::slice::from_ref(&keep), &[], [&keep].into_iter())
            .unwrap();
        for n in 1..500 {
            let e = entry(n);
            let live = [keep.clone(), e.clone()];
            store
                .append(std::slice::from_ref(&e), &[], live.iter())
                .unwrap();
            store
                .append(&[], std::slice::from_ref(&e.path), [&keep].into_iter())
                .unwrap();
        }
        assert!(
            line_count(&path) < 100,
            "{} lines: never compacted",
            line_count(&path)
        );
        assert_eq!(read_entries(&path).unwrap(), vec![keep]);
    }

    #[test]
    fn a_torn_last_line_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        {
            let (mut store, _) = StateStore::open(&path).unwrap();
            let live = [entry(1)];
            store.append(&live, &[], live.iter()).unwrap();
        }
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"record":{"job":"/job2","kn"#).unwrap();
        drop(f);
        let (_store, loaded) = StateStore::open(&path).unwrap();
        assert!(loaded.corrupt.is_none());
        assert_eq!(loaded.entries, vec![entry(1)]);
    }

    #[test]
    fn a_second_governor_is_refused_while_the_first_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let (first, _) = StateStore::open(&path).unwrap();
        let err = StateStore::open(&path).unwrap_err();
        assert!(matches!(err, CgroupError::StateLocked { .. }), "{err}");
        drop(first);
        StateStore::open(&path).expect("the lock is released with the store");
    }

    #[test]
    fn a_corrupt_state_file_is_set_aside_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        for garbage in [
            "{ not json\n".to_owned(),
            "{\"governor_state\":1,\"pid\":1}\ngarbage in the middle\n{\"forget\":\"/x\"}\n"
                .to_owned(),
        ] {
            fs::write(&path, &garbage).unwrap();
            let (_store, loaded) = StateStore::open(&path).unwrap();
            assert!(loaded.entries.is_empty());
            let err = loaded.corrupt.expect("corruption reported");
            assert!(matches!(err, CgroupError::StateCorrupt { .. }), "{err}");
            assert!(!path.exists());
            assert_eq!(
                fs::read_to_string(dir.path().join("state.json.corrupt")).unwrap(),
                garbage
            );
        }
    }

    #[test]
    fn a_state_file_from_a_future_version_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        fs::write(&path, "{\"governor_state\":99,\"pid\":1}\n").unwrap();
        let (_store, loaded) = StateStore::open(&path).unwrap();
        let err = loaded.corrupt.expect("version mismatch reported");
        assert!(err.to_string().contains("version 99"), "{err}");
    }
}
