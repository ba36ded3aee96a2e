//! Pieces of a coordinator job's output file, for `govctl logs` ([`ReadOutput`]).
//!
//! The file is the one [`super::Launcher::start`] opened for the job's stdout and stderr:
//! `<job_output_dir>/<group>.out`, the group named by [`super::group_name`] from what the
//! coordinator sends, so a request can only ever name a file in that directory. The daemon
//! created the file itself; it is still opened without following a symbolic link and read only
//! when it is a regular file, so that nothing put in its place is read with root's rights.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use governor_proto::node::{MAX_OUTPUT_CHUNK, OutputChunk, ReadOutput};

/// Where the output of the job a request names is.
pub fn output_path(output_dir: &Path, r: &ReadOutput) -> PathBuf {
    let group = super::group_name(&r.name, &r.job_id, r.replica, r.replicas);
    output_dir.join(format!("{group}.out"))
}

/// Read the piece a request asks for (blocking: call it off the async threads).
pub fn read_piece(output_dir: &Path, r: &ReadOutput) -> OutputChunk {
    let path = output_path(output_dir, r);
    match read_at(&path, r) {
        Ok((offset, data, size)) => OutputChunk {
            request_id: r.request_id,
            offset,
            data,
            size,
            error: String::new(),
        },
        Err(e) => OutputChunk::failed(r.request_id, format!("cannot read {}: {e}", path.display())),
    }
}

fn read_at(path: &Path, r: &ReadOutput) -> std::io::Result<(u64, Vec<u8>, u64)> {
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let size = meta.len();
    let start = if r.from_end {
        size.saturating_sub(r.offset)
    } else {
        r.offset.min(size)
    };
    let want = u64::from(r.max_bytes.clamp(1, MAX_OUTPUT_CHUNK)).min(size - start);
    file.seek(SeekFrom::Start(start))?;
    let mut data = Vec::with_capacity(want as usize);
    file.take(want).read_to_end(&mut data)?;
    Ok((start, data, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(offset: u64, from_end: bool, max_bytes: u32) -> ReadOutput {
        ReadOutput {
            request_id: 3,
            job_id: "j1".into(),
            replica: 0,
            replicas: 1,
            name: "resnet".into(),
            offset,
            from_end,
            max_bytes,
        }
    }

    #[test]
    fn pieces_come_from_the_offset_or_the_end_and_never_past_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("resnet-j1.out"), b"0123456789").unwrap();
        let p = read_piece(dir.path(), &request(2, false, 4));
        assert_eq!((p.offset, &p.data[..], p.size), (2, &b"2345"[..], 10));
        assert_eq!(p.request_id, 3);
        assert!(p.error.is_empty());
        let p = read_piece(dir.path(), &request(3, true, 100));
        assert_eq!((p.offset, &p.data[..]), (7, &b"789"[..]));
        let p = read_piece(dir.path(), &request(50, true, 100));
        assert_eq!((p.offset, p.data.len()), (0, 10));
        // Past the end: nothing yet, at the end.
        let p = read_piece(dir.path(), &request(12, false, 100));
        assert_eq!((p.offset, p.data.len(), p.size), (10, 0, 10));
    }

    #[test]
    fn a_missing_file_a_link_or_a_directory_is_an_error_not_a_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = read_piece(dir.path(), &request(0, false, 10));
        assert!(p.error.contains("resnet-j1.out"), "{}", p.error);
        std::fs::write(dir.path().join("secret"), b"root only").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("resnet-j1.out"))
            .unwrap();
        let p = read_piece(dir.path(), &request(0, false, 10));
        assert!(p.data.is_empty() && !p.error.is_empty(), "{p:?}");
        std::fs::remove_file(dir.path().join("resnet-j1.out")).unwrap();
        std::fs::create_dir(dir.path().join("resnet-j1.out")).unwrap();
        let p = read_piece(dir.path(), &request(0, false, 10));
        assert!(p.error.contains("not a regular file"), "{}", p.error);
    }

    #[test]
    fn a_name_cannot_leave_the_output_directory() {
        let mut r = request(0, false, 10);
        r.name = "../../etc/shadow".into();
        let path = output_path(Path::new("/var/log/governor/jobs"), &r);
        assert_eq!(path.parent(), Some(Path::new("/var/log/governor/jobs")));
    }
}
