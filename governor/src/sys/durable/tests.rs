use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_content_is_replaced_whole_and_no_temporary_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.json");
    write_durably(&path, b"a first, rather long content\n").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"a first, rather long content\n");
    write_durably(&path, b"short\n").unwrap();
    assert_eq!(
        fs::read(&path).unwrap(),
        b"short\n",
        "no tail of the old content"
    );
    write_durably(&path, b"").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"");
    assert!(temporaries(&path).is_empty());
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_file_gets_the_mode_asked_for_whatever_the_replaced_ones_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    fs::write(&path, b"old").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    write_durably_with_mode(&path, b"secret", 0o600).unwrap();
    assert_eq!(mode_of(&path), 0o600);
    // Without a mode: what `fs::write` gives a new file (0666 less the umask).
    let reference = dir.path().join("reference");
    fs::write(&reference, b"").unwrap();
    write_durably(&path, b"public").unwrap();
    assert_eq!(mode_of(&path), mode_of(&reference));
}

#[test]
fn a_failed_write_leaves_the_target_as_it_was_and_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    // The target is a directory: the temporary is written, the rename fails, it goes.
    let target = dir.path().join("target");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("inside"), b"kept").unwrap();
    let e = write_durably(&target, b"new").unwrap_err();
    assert!(target.is_dir(), "{e}");
    assert_eq!(fs::read(target.join("inside")).unwrap(), b"kept");
    assert!(temporaries(&target).is_empty(), "{e}");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);

    // The directory is missing.
    let e = write_durably(&dir.path().join("none/file"), b"new").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");

    // A path that names no file.
    write_durably(Path::new("/"), b"new").unwrap_err();

    // The directory is not writable (root writes anyway, so only checked as another user).
    if !nix::unistd::geteuid().is_root() {
        let locked = dir.path().join("locked");
        fs::create_dir(&locked).unwrap();
        let path = locked.join("journal.json");
        fs::write(&path, b"old").unwrap();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o500)).unwrap();
        let e = write_durably(&path, b"new").unwrap_err();
        fs::set_permissions(&locked, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(&locked).unwrap().count(), 1);
    }
}

#[test]
fn a_sweep_removes_only_the_files_own_temporaries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("doc.json");
    let others = [
        "doc.json",
        ".doc.json.12.tmp",
        ".doc.json.x.3.tmp",
        ".doc.json.12.3.tmp.bak",
        ".other.json.12.3.tmp",
        "doc.json.12.3.tmp",
    ];
    for name in others {
        fs::write(dir.path().join(name), b"").unwrap();
    }
    for name in [".doc.json.12.3.tmp", ".doc.json.4567.0.tmp"] {
        fs::write(dir.path().join(name), b"").unwrap();
    }
    assert_eq!(temporaries(&path).len(), 2);
    assert_eq!(sweep_temporaries(&path), 2);
    assert!(temporaries(&path).is_empty());
    for name in others {
        assert!(dir.path().join(name).exists(), "{name} was removed");
    }
    assert_eq!(sweep_temporaries(&dir.path().join("none/doc.json")), 0);
}

#[test]
fn a_removal_of_a_missing_file_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.json");
    remove_durably(&path).unwrap();
    write_durably(&path, b"x").unwrap();
    remove_durably(&path).unwrap();
    assert!(!path.exists());
}

/// Where the writer of the kill test writes (set only in that test's child process).
const WRITER_DIR_VAR: &str = "GOVERNOR_DURABLE_WRITER_DIR";
/// What the writer prints once it is about to write.
const WRITER_READY: &str = "durable writer: writing";
/// Payload of each document: large enough that a kill often lands in the middle of a write.
const PAYLOAD_BYTES: usize = 4 << 20;
/// Kills the test makes.
const KILLS: usize = 24;

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Document `n` (0 or 1) of the two the writer alternates: its number, its payload, and the
/// payload's size and checksum.
fn document(n: u64) -> Vec<u8> {
    let payload: String = (0..PAYLOAD_BYTES as u64)
        .map(|i| char::from(b'a' + ((i * 7 + n * 13) % 26) as u8))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "doc": n,
        "bytes": payload.len(),
        "fnv1a": fnv1a(payload.as_bytes()),
        "payload": payload,
    }))
    .unwrap()
}

/// Panics unless `bytes` is one of `docs`, whole.
fn assert_whole(bytes: &[u8], docs: &[Vec<u8>; 2], context: &str) {
    let value: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_else(|e| {
        panic!(
            "{context}: the file is no whole document ({} bytes): {e}",
            bytes.len()
        )
    });
    let payload = value["payload"].as_str().unwrap_or_else(|| {
        panic!("{context}: no payload");
    });
    assert_eq!(
        value["fnv1a"].as_u64(),
        Some(fnv1a(payload.as_bytes())),
        "{context}: the payload's checksum does not match"
    );
    assert_eq!(
        value["bytes"].as_u64(),
        Some(payload.len() as u64),
        "{context}"
    );
    let n = value["doc"].as_u64().expect("a document number") as usize;
    assert!(
        docs.get(n).is_some_and(|d| d == bytes),
        "{context}: not document {n} as written"
    );
}

/// The writer of [`a_writer_killed_at_any_moment_leaves_a_whole_document`], run in a child
/// process of the test binary: writes the two documents in turn until killed (or a minute
/// passes, should its parent be gone). A no-op as an ordinary test.
#[test]
fn durable_writer_child() {
    let Some(dir) = std::env::var_os(WRITER_DIR_VAR) else {
        return;
    };
    let target = PathBuf::from(dir).join("doc.json");
    let docs = [document(0), document(1)];
    println!("{WRITER_READY}");
    let deadline = Instant::now() + Duration::from_secs(60);
    for n in 0.. {
        if Instant::now() > deadline {
            break;
        }
        write_durably(&target, &docs[n % 2]).expect("the writer could not write");
    }
}

#[test]
fn a_writer_killed_at_any_moment_leaves_a_whole_document() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("doc.json");
    let docs = [document(0), document(1)];
    write_durably(&target, &docs[0]).unwrap();
    let writer = concat!(module_path!(), "::durable_writer_child")
        .split_once("::")
        .expect("a crate name in the module path")
        .1;
    // A fixed seed (xorshift64): a failure is rerun with the same delays.
    let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
    let mut killed_mid_write = 0;
    for kill in 0..KILLS {
        let before = temporaries(&target);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([writer, "--exact", "--nocapture", "--test-threads=1"])
            .env(WRITER_DIR_VAR, dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        if !lines.any(|l| l.is_ok_and(|l| l.contains(WRITER_READY))) {
            panic!("the writer ended before it wrote: {:?}", child.wait());
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = Duration::from_micros(rng % 80_000);
        std::thread::sleep(delay);
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let context = format!("kill {kill}, {delay:?} after the writer started");
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "{context}: the writer ended by itself ({status})"
        );
        let bytes = fs::read(&target).unwrap_or_else(|e| panic!("{context}: {e}"));
        assert_whole(&bytes, &docs, &context);
        let left: Vec<PathBuf> = temporaries(&target)
            .into_iter()
            .filter(|t| !before.contains(t))
            .collect();
        assert!(left.len() <= 1, "{context}: temporaries left: {left:?}");
        killed_mid_write += left.len();
        // Every other time the file's owner "restarts" and sweeps; in between, the next
        // writer has to get past the stray temporary.
        if kill % 2 == 1 {
            sweep_temporaries(&target);
            assert!(temporaries(&target).is_empty());
        }
    }
    assert!(
        killed_mid_write > 0,
        "no kill landed in the middle of a write: the test proved nothing"
    );
    write_durably(&target, &docs[1]).unwrap();
    assert_eq!(fs::read(&target).unwrap(), docs[1]);
    sweep_temporaries(&target);
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only the document is left"
    );
}
