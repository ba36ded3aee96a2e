//! Whether a job that exited while asked to save did save.
//!
//! A framework asked to save finishes its epoch, writes its checkpoint and exits with status 0,
//! but a job that ends its last epoch just as the signal arrives also exits with status 0,
//! without saving (Keras' `BackupAndRestore` even deletes its backup at the end of training).
//! Taking that end for a save makes the coordinator start a finished job again from an older
//! checkpoint, or from nothing: epochs run twice. So the daemon looks at the declared
//! checkpoint directory when it sends the signal and again when the job ends: a save is an end
//! that left a checkpoint there which differs from the one at the signal. When it cannot tell
//! (the directory unreadable, too large to look at or not answering within 2 s, the look lost
//! with a daemon restart) it trusts the exit status as before: a finished job started once more
//! loses nothing, a saved job taken for finished would lose its remaining epochs.
//!
//! The daemon looks with its own rights, as it starts the coordinator's jobs with them
//! (`carry` reads and writes the same directories).

use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A directory this large is not looked through (a save is then trusted on its exit status).
const MAX_ENTRIES: usize = 10_000;
/// A look that takes longer (a hung network mount) is given up, so that the daemon's loop goes
/// on; the save is then trusted on its exit status.
pub(super) const LOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`look`] on a thread of its own, given up after `timeout`.
pub(super) fn look_within(
    dir: &Path,
    timeout: std::time::Duration,
) -> Result<CheckpointLook, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("checkpoint-look".into())
        .spawn(move || {
            let _ = tx.send(look(&owned));
        });
    if let Err(e) = spawned {
        return Err(format!("cannot look at {}: {e}", dir.display()));
    }
    rx.recv_timeout(timeout).unwrap_or_else(|_| {
        Err(format!(
            "{} did not answer within {} s",
            dir.display(),
            timeout.as_secs_f64()
        ))
    })
}

/// What a checkpoint directory held: enough to tell whether anything in it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CheckpointLook {
    /// Regular files in it (at any depth).
    files: usize,
    /// Every entry's path, kind, size, inode and change times, in path order.
    digest: u64,
}

/// Look through `dir` (not following links). A directory that is not there holds nothing.
pub(super) fn look(dir: &Path) -> Result<CheckpointLook, String> {
    let mut entries: Vec<(PathBuf, std::fs::Metadata)> = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let read = match std::fs::read_dir(&d) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d == dir => break,
            Err(e) => return Err(format!("{}: {e}", d.display())),
        };
        for entry in read {
            let entry = entry.map_err(|e| format!("{}: {e}", d.display()))?;
            let meta = entry
                .metadata()
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
            if meta.is_dir() {
                pending.push(entry.path());
            }
            entries.push((entry.path(), meta));
            if entries.len() > MAX_ENTRIES {
                return Err(format!(
                    "{} holds more than {MAX_ENTRIES} entries",
                    dir.display()
                ));
            }
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for (path, m) in &entries {
        path.hash(&mut hasher);
        (m.is_file(), m.len(), m.ino(), m.mtime(), m.mtime_nsec()).hash(&mut hasher);
        (m.ctime(), m.ctime_nsec()).hash(&mut hasher);
    }
    Ok(CheckpointLook {
        files: entries.iter().filter(|(_, m)| m.is_file()).count(),
        digest: hasher.finish(),
    })
}

/// What an exit with status 0 after a save signal was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum SaveVerdict {
    /// It left a new checkpoint.
    Saved,
    /// It ended on its own: why this is not a save.
    EndedOnItsOwn(&'static str),
    /// Cannot tell (why): taken for a save, as the exit status says.
    Unknown(String),
}

/// Judge an exit with status 0 from the looks at the signal (`None`: not taken) and at the end.
pub(super) fn judge(
    at_signal: Option<&Result<CheckpointLook, String>>,
    at_end: &Result<CheckpointLook, String>,
) -> SaveVerdict {
    let after = match at_end {
        Ok(after) => after,
        Err(e) => return SaveVerdict::Unknown(e.clone()),
    };
    if after.files == 0 {
        return SaveVerdict::EndedOnItsOwn("it left no checkpoint");
    }
    match at_signal {
        None => {
            SaveVerdict::Unknown("its checkpoint was not looked at when it was signalled".into())
        }
        Some(Err(e)) => SaveVerdict::Unknown(e.clone()),
        Some(Ok(before)) if before == after => {
            SaveVerdict::EndedOnItsOwn("its checkpoint did not change after the save signal")
        }
        Some(Ok(_)) => SaveVerdict::Saved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_is_a_changed_checkpoint_and_an_end_without_one_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ckpt");
        let nothing = look(&dir).unwrap();
        assert_eq!(nothing.files, 0, "a directory not there holds nothing");
        // The first save of a job: nothing before, a checkpoint after.
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/state.json"), b"{\"epoch\": 31}").unwrap();
        let first = look(&dir);
        assert_eq!(
            judge(Some(&Ok(nothing.clone())), &first),
            SaveVerdict::Saved
        );
        // Ended on its own: the checkpoint of the last save, untouched.
        assert!(matches!(
            judge(Some(&first), &look(&dir)),
            SaveVerdict::EndedOnItsOwn(_)
        ));
        // A save rewrites it (a new file renamed over the old one, or written in place).
        std::fs::write(dir.join("sub/state.json.tmp"), b"{\"epoch\": 39}").unwrap();
        std::fs::rename(dir.join("sub/state.json.tmp"), dir.join("sub/state.json")).unwrap();
        assert_eq!(judge(Some(&first), &look(&dir)), SaveVerdict::Saved);
        // Training ended and the framework removed its backup: nothing to resume from.
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(
            judge(Some(&first), &look(&dir)),
            SaveVerdict::EndedOnItsOwn(_)
        ));
    }

    #[test]
    fn when_it_cannot_tell_the_exit_status_is_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("model.ckpt"), b"w").unwrap();
        let now = look(tmp.path());
        assert!(matches!(judge(None, &now), SaveVerdict::Unknown(_)));
        let unreadable = Err("permission denied".to_string());
        assert!(matches!(
            judge(Some(&unreadable), &now),
            SaveVerdict::Unknown(_)
        ));
        assert!(matches!(
            judge(Some(&now), &unreadable),
            SaveVerdict::Unknown(_)
        ));
        // Not a directory: an error, not an empty one.
        assert!(look(&tmp.path().join("model.ckpt")).is_err());
        // Through the bounded look: the same answer; none in time is an error.
        assert_eq!(look_within(tmp.path(), LOOK_TIMEOUT), now);
    }
}
