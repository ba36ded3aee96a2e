//! The archive a checkpoint directory travels in when the coordinator carries it from one node
//! to another (a job moved without a shared path), and its end-to-end checksum.
//!
//! Format, all integers little-endian: the magic `GOVCKPT1`; then for every regular file under
//! the directory (sorted by path): the path's length (u32), the path (UTF-8, relative,
//! `/`-separated, no `.`/`..` component), its mode (u32, permission bits only), its size (u64)
//! and its bytes; then `u32::MAX` ends it. Directories are implied by the paths; symlinks,
//! devices and sockets are refused (a checkpoint is data). A SHA-256 over the whole stream,
//! computed by the sender and checked by the coordinator and by the receiver, covers transport.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use crate::node::CheckpointChunk;

/// The archive's first bytes.
pub const MAGIC: &[u8; 8] = b"GOVCKPT1";

pub use crate::node::CHUNK_BYTES;

/// Why an archive cannot be made or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: not a regular file or directory (symlinks, devices and sockets are not carried)"
    )]
    NotRegular { path: String },
    #[error("not a checkpoint archive: {0}")]
    Malformed(String),
}

fn io_err(path: &Path, source: io::Error) -> ArchiveError {
    ArchiveError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Every regular file under `dir`, as (relative path, absolute path), sorted.
fn files(dir: &Path) -> Result<Vec<(String, PathBuf)>, ArchiveError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).map_err(|e| io_err(&d, e))? {
            let entry = entry.map_err(|e| io_err(&d, e))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(|e| io_err(&path, e))?;
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let rel = path
                    .strip_prefix(dir)
                    .expect("under dir")
                    .to_str()
                    .ok_or_else(|| ArchiveError::Malformed(format!("{path:?}: not UTF-8")))?
                    .to_owned();
                out.push((rel, path));
            } else {
                return Err(ArchiveError::NotRegular {
                    path: path.display().to_string(),
                });
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Write the archive of `dir` to `out`; returns its size in bytes.
pub fn pack(dir: &Path, out: &mut impl Write) -> Result<u64, ArchiveError> {
    use std::os::unix::fs::PermissionsExt;
    let mut n = 0u64;
    let mut put = |out: &mut dyn Write, b: &[u8]| -> io::Result<()> {
        n += b.len() as u64;
        out.write_all(b)
    };
    put(out, MAGIC).map_err(|e| io_err(dir, e))?;
    for (rel, path) in files(dir)? {
        let mut f = fs::File::open(&path).map_err(|e| io_err(&path, e))?;
        let meta = f.metadata().map_err(|e| io_err(&path, e))?;
        let len = u32::try_from(rel.len())
            .map_err(|_| ArchiveError::Malformed(format!("{rel}: path too long")))?;
        put(out, &len.to_le_bytes()).map_err(|e| io_err(&path, e))?;
        put(out, rel.as_bytes()).map_err(|e| io_err(&path, e))?;
        put(out, &(meta.permissions().mode() & 0o777).to_le_bytes())
            .map_err(|e| io_err(&path, e))?;
        put(out, &meta.len().to_le_bytes()).map_err(|e| io_err(&path, e))?;
        let mut buf = vec![0u8; 1 << 16];
        let mut left = meta.len();
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let got = f.read(&mut buf[..want]).map_err(|e| io_err(&path, e))?;
            if got == 0 {
                return Err(ArchiveError::Malformed(format!(
                    "{rel}: shrank while it was read"
                )));
            }
            put(out, &buf[..got]).map_err(|e| io_err(&path, e))?;
            left -= got as u64;
        }
    }
    put(out, &u32::MAX.to_le_bytes()).map_err(|e| io_err(dir, e))?;
    out.flush().map_err(|e| io_err(dir, e))?;
    Ok(n)
}

/// A relative path that stays under its directory.
fn safe_relative(rel: &str) -> Option<PathBuf> {
    let p = Path::new(rel);
    (!rel.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_))))
        .then(|| p.to_path_buf())
}

/// Unpack an archive into `dir` (created if missing; files of the same paths replaced, others
/// left). Refuses paths that would leave `dir`, and never follows a symlink found there.
pub fn unpack(input: &mut impl Read, dir: &Path) -> Result<u64, ArchiveError> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |what: String| ArchiveError::Malformed(what);
    let mut magic = [0u8; 8];
    input
        .read_exact(&mut magic)
        .map_err(|_| bad("too short".into()))?;
    if &magic != MAGIC {
        return Err(bad("wrong magic".into()));
    }
    fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let mut files = 0u64;
    loop {
        let mut len = [0u8; 4];
        input
            .read_exact(&mut len)
            .map_err(|_| bad("truncated".into()))?;
        let len = u32::from_le_bytes(len);
        if len == u32::MAX {
            return Ok(files);
        }
        if len > 4096 {
            return Err(bad(format!("a path of {len} bytes")));
        }
        let mut name = vec![0u8; len as usize];
        input
            .read_exact(&mut name)
            .map_err(|_| bad("truncated".into()))?;
        let name = String::from_utf8(name).map_err(|_| bad("a path is not UTF-8".into()))?;
        let rel = safe_relative(&name).ok_or_else(|| bad(format!("unsafe path {name:?}")))?;
        let mut mode = [0u8; 4];
        let mut size = [0u8; 8];
        input
            .read_exact(&mut mode)
            .and_then(|()| input.read_exact(&mut size))
            .map_err(|_| bad("truncated".into()))?;
        let target = dir.join(&rel);
        // No component of the way may be a symlink (it could lead out of `dir`).
        let mut at = dir.to_path_buf();
        for c in rel.parent().into_iter().flat_map(Path::components) {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(bad(format!("{} is a symlink", at.display())));
                }
                Ok(_) => {}
                Err(_) => fs::create_dir(&at).map_err(|e| io_err(&at, e))?,
            }
        }
        if fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(bad(format!("{} is a symlink", target.display())));
        }
        let tmp = target.with_extension("govckpt-part");
        let mut f = fs::File::create(&tmp).map_err(|e| io_err(&tmp, e))?;
        let copied = io::copy(&mut input.take(u64::from_le_bytes(size)), &mut f)
            .map_err(|e| io_err(&tmp, e))?;
        if copied != u64::from_le_bytes(size) {
            let _ = fs::remove_file(&tmp);
            return Err(bad(format!("{name}: truncated")));
        }
        f.set_permissions(fs::Permissions::from_mode(u32::from_le_bytes(mode) & 0o777))
            .map_err(|e| io_err(&tmp, e))?;
        f.sync_all().map_err(|e| io_err(&tmp, e))?;
        fs::rename(&tmp, &target).map_err(|e| io_err(&target, e))?;
        files += 1;
    }
}

/// The next piece of a stream: [`CHUNK_BYTES`] bytes, fewer only at its end (empty there).
fn read_piece(f: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            got => n += got,
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// An archive file as the pieces that carry it ([`CheckpointChunk`]s), in order; the last one
/// holds the SHA-256 and the size of the whole, hashed while it is read.
pub struct Pieces {
    file: fs::File,
    job_id: String,
    attempt: u32,
    offset: u64,
    total: u64,
    hash: Sha256,
    done: bool,
}

impl Pieces {
    pub fn open(path: &Path, job_id: &str, attempt: u32) -> io::Result<Pieces> {
        let file = fs::File::open(path)?;
        let total = file.metadata()?.len();
        Ok(Pieces {
            file,
            job_id: job_id.to_owned(),
            attempt,
            offset: 0,
            total,
            hash: Sha256::default(),
            done: false,
        })
    }
}

impl Iterator for Pieces {
    type Item = io::Result<CheckpointChunk>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let data = match read_piece(&mut self.file) {
            Ok(d) => d,
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        self.hash.update(&data);
        let offset = self.offset;
        self.offset += data.len() as u64;
        let last = self.offset >= self.total;
        self.done = last;
        Some(Ok(CheckpointChunk {
            job_id: self.job_id.clone(),
            attempt: self.attempt,
            offset,
            data,
            last,
            sha256: if last {
                std::mem::take(&mut self.hash).hex()
            } else {
                String::new()
            },
            total_bytes: self.total,
            error: String::new(),
        }))
    }
}

/// SHA-256 of a stream being written, as lowercase hex at the end.
pub struct Sha256 {
    ctx: ring::digest::Context,
}

impl Default for Sha256 {
    fn default() -> Self {
        Sha256 {
            ctx: ring::digest::Context::new(&ring::digest::SHA256),
        }
    }
}

impl Sha256 {
    pub fn update(&mut self, data: &[u8]) {
        self.ctx.update(data);
    }

    pub fn hex(self) -> String {
        self.ctx
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_round_trips_with_its_modes_and_nested_files() {
        use std::os::unix::fs::PermissionsExt;
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("ckpt/sub")).unwrap();
        fs::write(src.path().join("ckpt/state.json"), b"{\"epoch\": 3}").unwrap();
        fs::write(src.path().join("ckpt/sub/weights.bin"), vec![7u8; 300_000]).unwrap();
        fs::set_permissions(
            src.path().join("ckpt/state.json"),
            fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        let mut bytes = Vec::new();
        let n = pack(&src.path().join("ckpt"), &mut bytes).unwrap();
        assert_eq!(n, bytes.len() as u64);
        let dst = tempfile::tempdir().unwrap();
        let files = unpack(&mut bytes.as_slice(), &dst.path().join("restored")).unwrap();
        assert_eq!(files, 2);
        assert_eq!(
            fs::read(dst.path().join("restored/sub/weights.bin")).unwrap(),
            vec![7u8; 300_000]
        );
        let mode = fs::metadata(dst.path().join("restored/state.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
    }

    #[test]
    fn archives_that_would_escape_or_are_cut_are_refused() {
        let dst = tempfile::tempdir().unwrap();
        let mut evil = MAGIC.to_vec();
        let name = b"../outside";
        evil.extend((name.len() as u32).to_le_bytes());
        evil.extend(name);
        evil.extend(0o644u32.to_le_bytes());
        evil.extend(1u64.to_le_bytes());
        evil.push(b'x');
        evil.extend(u32::MAX.to_le_bytes());
        let e = unpack(&mut evil.as_slice(), dst.path()).unwrap_err();
        assert!(e.to_string().contains("unsafe path"), "{e}");
        assert!(!dst.path().parent().unwrap().join("outside").exists());

        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("a"), b"hello").unwrap();
        let mut bytes = Vec::new();
        pack(src.path(), &mut bytes).unwrap();
        bytes.truncate(bytes.len() - 6);
        assert!(unpack(&mut bytes.as_slice(), dst.path()).is_err());
        assert!(unpack(&mut &b"NOTANARCHIVE"[..], dst.path()).is_err());
    }

    #[test]
    fn the_checksum_is_sha256() {
        let mut h = Sha256::default();
        h.update(b"abc");
        assert_eq!(
            h.hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
