//! Durable replacement of small files: the daemon's state file and journals, and the exit
//! records its supervisors leave.
//!
//! [`write_durably`] writes the new content to a temporary file in the target's own directory,
//! `fsync`s it, renames it over the target and `fsync`s the directory. A process killed at any
//! point leaves the old content or the new one, never a mix (the rename is atomic), and once
//! the call returns the new content survives a power cut too (without the first `fsync` the
//! rename could reach the disk before the data, leaving an empty file; without the second, the
//! rename itself could be lost).
//!
//! Each temporary file is named `.<name>.<pid>.<n>.tmp` beside its target, unique per process
//! and call, so concurrent writers never share one and a temporary left by a killed writer is
//! never in the next one's way. Nothing reads those names; the owner of a file may remove the
//! leftovers when it starts ([`sweep_temporaries`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The mode a new file gets when the caller asks for none (the process umask applies), as with
/// [`std::fs::write`].
const DEFAULT_MODE: u32 = 0o666;

/// Replace the content of `path` with `bytes` durably (see the module's doc). A new file gets
/// mode 0666 less the umask, like [`std::fs::write`]. The directory must exist.
pub fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_durably_with_mode(path, bytes, DEFAULT_MODE)
}

/// [`write_durably`] with the file created with `mode` (less the umask): 0600 for a file only
/// its owner may read. The mode applies to every write, whatever the replaced file's was.
///
/// On an error the temporary file is removed and the target is untouched, except when only the
/// final `fsync` of the directory failed: the new content is then in place, but may not survive
/// a power cut.
pub fn write_durably_with_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let (tmp, file) = create_temporary(path, mode)?;
    let written = fill(file, bytes).and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_parent(path)
}

/// Write `bytes` to `file` and `fsync` it; the file is closed on return.
fn fill(mut file: File, bytes: &[u8]) -> io::Result<()> {
    file.write_all(bytes)?;
    file.sync_all()
}

/// Remove `path` durably (its directory `fsync`ed after the removal); a missing file is not an
/// error.
pub fn remove_durably(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(()) => sync_parent(path),
    }
}

/// `fsync` the directory holding `path`, so that a rename or removal in it survives a power
/// cut.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    File::open(parent(path))?.sync_all()
}

/// Remove the temporary files [`write_durably`] left for `path` (a writer killed in the middle
/// of a write leaves one). Only the file's sole writer may call it, before it writes: another
/// process's write under way would lose its temporary file and fail. Returns how many were
/// removed; a directory that cannot be listed has none to remove.
pub fn sweep_temporaries(path: &Path) -> usize {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return 0;
    };
    let Ok(entries) = fs::read_dir(parent(path)) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| is_temporary_of(n, name))
        })
        .filter(|e| fs::remove_file(e.path()).is_ok())
        .count()
}

/// The temporary files [`write_durably`] left for `path`.
#[cfg(test)]
pub(crate) fn temporaries(path: &Path) -> Vec<PathBuf> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir(parent(path)) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| is_temporary_of(n, name))
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Whether `entry` is a temporary file of `target`: `.<target>.<digits>.<digits>.tmp`.
fn is_temporary_of(entry: &str, target: &str) -> bool {
    let Some(middle) = entry
        .strip_prefix('.')
        .and_then(|e| e.strip_prefix(target))
        .and_then(|e| e.strip_prefix('.'))
        .and_then(|e| e.strip_suffix(".tmp"))
    else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    middle
        .split_once('.')
        .is_some_and(|(pid, n)| digits(pid) && digits(n))
}

/// A new temporary file beside `path`. Created exclusively (`O_EXCL`), so neither a leftover
/// nor a symlink put in its place is ever written through; a name taken (two writers with one
/// pid number, from different PID namespaces) moves on to the next.
fn create_temporary(path: &Path, mode: u32) -> io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let pid = std::process::id();
    let mut tries = 0;
    loop {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".{pid}.{}.tmp",
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = parent(path).join(tmp_name);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
