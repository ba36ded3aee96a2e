//! The state file: the original value of every cgroup file the governor has changed, so that a
//! governor that is stopped, killed or crashes leaves (or, on its next start, puts) every job
//! back as it found it.
//!
//! JSON, written atomically (temporary file in the same directory, `fsync`, `rename`, `fsync` of
//! the directory), before the first write to a file is made. The default location is under
//! `/run`, which is a tmpfs: a reboot clears it together with the cgroups it describes. One
//! governor per node: an exclusive `flock` on `<state file>.lock` is held while the actuator lives.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::error::CgroupError;
use super::knob::Knob;

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
struct StateFileContent {
    version: u32,
    /// Pid of the governor that wrote the file (for operators reading it).
    pid: u32,
    entries: Vec<StateEntry>,
}

/// The locked state file.
#[derive(Debug)]
pub struct StateStore {
    path: PathBuf,
    _lock: Flock<File>,
}

/// What [`StateStore::open`] found.
#[derive(Debug, Default)]
pub struct LoadedState {
    /// Entries left by a previous run (empty after a clean shutdown).
    pub entries: Vec<StateEntry>,
    /// Set when the file was unreadable and was set aside.
    pub corrupt: Option<CgroupError>,
}

impl StateStore {
    /// Lock and load the state file at `path`, creating its directory (mode 0700) if needed. An
    /// unparsable file is renamed to `<path>.corrupt` and reported, never fatal.
    pub fn open(path: &Path) -> Result<(StateStore, LoadedState), CgroupError> {
        let io_err = |source| CgroupError::StateIo {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err)?;
        }
        let lock_path = lock_path(path);
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
        let store = StateStore {
            path: path.to_owned(),
            _lock: lock,
        };
        let loaded = match fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => LoadedState::default(),
            Err(e) => return Err(io_err(e)),
            Ok(bytes) => match serde_json::from_slice::<StateFileContent>(&bytes) {
                Ok(content) if content.version == FORMAT_VERSION => LoadedState {
                    entries: content.entries,
                    corrupt: None,
                },
                Ok(content) => store.set_aside(format!(
                    "format version {} (this governor reads version {FORMAT_VERSION})",
                    content.version
                ))?,
                Err(e) => store.set_aside(e.to_string())?,
            },
        };
        Ok((store, loaded))
    }

    fn set_aside(&self, reason: String) -> Result<LoadedState, CgroupError> {
        let mut set_aside = self.path.clone().into_os_string();
        set_aside.push(".corrupt");
        let set_aside = PathBuf::from(set_aside);
        fs::rename(&self.path, &set_aside).map_err(|source| CgroupError::StateIo {
            path: self.path.clone(),
            source,
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

    /// Replace the file's content with `entries` atomically; remove the file when there are none
    /// (a clean state leaves nothing behind).
    pub fn save<'a>(
        &self,
        entries: impl IntoIterator<Item = &'a StateEntry>,
    ) -> Result<(), CgroupError> {
        let entries: Vec<StateEntry> = entries.into_iter().cloned().collect();
        let io_err = |source| CgroupError::StateIo {
            path: self.path.clone(),
            source,
        };
        if entries.is_empty() {
            return match fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(e)),
                _ => sync_dir(&self.path).map_err(io_err),
            };
        }
        let content = StateFileContent {
            version: FORMAT_VERSION,
            pid: std::process::id(),
            entries,
        };
        let json = serde_json::to_vec_pretty(&content)
            .map_err(|e| io_err(std::io::Error::other(e.to_string())))?;
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err)?;
        file.write_all(&json).map_err(io_err)?;
        file.sync_all().map_err(io_err)?;
        drop(file);
        fs::rename(&tmp, &self.path).map_err(io_err)?;
        sync_dir(&self.path).map_err(io_err)
    }
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.to_owned().into_os_string();
    p.push(".lock");
    PathBuf::from(p)
}

/// fsync the directory holding `path` so a rename or removal survives a power cut.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
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

    #[test]
    fn saved_entries_load_back_and_an_empty_state_removes_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        {
            let (store, loaded) = StateStore::open(&path).unwrap();
            assert!(loaded.entries.is_empty());
            store.save(&[entry(1), entry(2)]).unwrap();
            let text = fs::read_to_string(&path).unwrap();
            assert!(text.contains("\"cpu.max\""), "{text}");
            assert!(!dir.path().join("sub/state.json.tmp").exists());
        }
        let (store, loaded) = StateStore::open(&path).unwrap();
        assert_eq!(loaded.entries, vec![entry(1), entry(2)]);
        store.save(&[]).unwrap();
        assert!(!path.exists(), "an empty state should leave no file");
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
        fs::write(&path, "{ not json").unwrap();
        let (_store, loaded) = StateStore::open(&path).unwrap();
        assert!(loaded.entries.is_empty());
        let err = loaded.corrupt.expect("corruption reported");
        assert!(matches!(err, CgroupError::StateCorrupt { .. }), "{err}");
        assert!(!path.exists());
        assert_eq!(
            fs::read_to_string(dir.path().join("state.json.corrupt")).unwrap(),
            "{ not json"
        );
    }

    #[test]
    fn a_state_file_from_a_future_version_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        fs::write(&path, r#"{"version": 99, "pid": 1, "entries": []}"#).unwrap();
        let (_store, loaded) = StateStore::open(&path).unwrap();
        let err = loaded.corrupt.expect("version mismatch reported");
        assert!(err.to_string().contains("version 99"), "{err}");
    }
}
