//! The transparent move of a job that declared no checkpoint: CRIU dumps its whole process
//! tree on the source node, the coordinator carries the dump, CRIU restores it on the target.
//!
//! A job the coordinator starts runs in a PID namespace of its own under `governor supervise`'s
//! init (see [`crate::supervise`]), so its PIDs are free on any node and its tree holds its
//! own session. A dump is a *bundle* directory of the node's own
//! (`<job_output_dir>/criu/<job group>`):
//! - `images/`: `criu dump` of the namespace's init and everything under it (CRIU kills the
//!   tree once the dump is complete, and resumes it if the dump fails);
//! - `files/`: the regular files the job held open for writing (its stdout/stderr file, its
//!   training log), at their absolute paths below `files/`, copied after the dump so that their
//!   size is the one CRIU recorded (CRIU refuses to restore a file whose size changed).
//!
//! Files a job only reads (its program, libraries, data) must exist at the same paths with the
//! same contents on every node, as for any job the coordinator places. Files it writes are
//! carried only from below the job output directory and its log's directory; a job writing
//! elsewhere cannot move transparently (a clear error, and it runs on).
//!
//! Why CRIU's own `--manage-cgroups=ignore` on restore: the restored tree must stay in the
//! cgroup the target's launcher made for it (criu is started there), not go back to the path
//! it had on the source. Why restore in the foreground (no `-d`): the restored init keeps its
//! parent-death signal, and with `-d` that parent (criu) exits at once and the job would die.
//! Measured in the VM bed (Debian kernel 6.1, criu 3.17.1).

use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// CRIU's images inside a bundle.
pub const IMAGES: &str = "images";
/// The job's written files inside a bundle.
pub const FILES: &str = "files";
/// CRIU's logs, inside the images directory.
pub const DUMP_LOG: &str = "dump.log";
pub const RESTORE_LOG: &str = "restore.log";

/// The arguments of `criu dump` of the tree under `pid` into `images`.
pub fn dump_args(pid: u32, images: &Path) -> Vec<OsString> {
    vec![
        "dump".into(),
        "-t".into(),
        pid.to_string().into(),
        "-D".into(),
        images.into(),
        "-o".into(),
        DUMP_LOG.into(),
    ]
}

/// The arguments of `criu restore` from `images`, writing the restored init's pid (as this
/// node sees it) to `pidfile`.
pub fn restore_args(images: &Path, pidfile: &Path) -> Vec<OsString> {
    vec![
        "restore".into(),
        "-D".into(),
        images.into(),
        "-o".into(),
        RESTORE_LOG.into(),
        "--manage-cgroups=ignore".into(),
        "--pidfile".into(),
        pidfile.into(),
    ]
}

/// The last few errors of a CRIU log, for a message.
pub fn log_errors(log: &Path) -> String {
    let Ok(text) = fs::read_to_string(log) else {
        return format!("no log at {}", log.display());
    };
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error"))
        .map(str::trim)
        .collect();
    if errors.is_empty() {
        return format!("see {}", log.display());
    }
    let tail = &errors[errors.len().saturating_sub(3)..];
    format!("{} (log: {})", tail.join("; "), log.display())
}

/// Whether a bundle holds a complete dump to restore.
pub fn has_images(bundle: &Path) -> bool {
    bundle.join(IMAGES).join("inventory.img").is_file()
}

/// Whether `/proc/<pid>/status` text is that of a PID namespace's init as seen from outside
/// (`NSpid:` lists the pid in each namespace, outermost first; the innermost is 1).
pub fn is_namespace_init(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|rest| rest.split_whitespace().collect::<Vec<_>>())
        .is_some_and(|pids| pids.len() >= 2 && pids.last() == Some(&"1"))
}

/// Whether `/proc/<pid>/status` text is that of a process in a PID namespace below the one
/// `/proc` shows (its `NSpid:` lists more than one pid).
pub fn in_child_namespace(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .is_some_and(|rest| rest.split_whitespace().count() >= 2)
}

/// The processes among `pids` that run in a PID namespace of their own: the tree CRIU dumps
/// (the supervisor outside it is not dumped, nor are the files it holds).
pub fn namespace_members(proc_root: &Path, pids: &[u32]) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            fs::read_to_string(proc_root.join(pid.to_string()).join("status"))
                .is_ok_and(|s| in_child_namespace(&s))
        })
        .collect()
}

/// The init of the job's PID namespace among `pids` (the job's cgroup).
pub fn namespace_init(proc_root: &Path, pids: &[u32]) -> Option<u32> {
    pids.iter().copied().find(|pid| {
        fs::read_to_string(proc_root.join(pid.to_string()).join("status"))
            .is_ok_and(|s| is_namespace_init(&s))
    })
}

/// Whether `/proc/<pid>/fdinfo/<fd>` text is that of a descriptor open for writing.
pub fn fdinfo_writable(fdinfo: &str) -> bool {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & 0o3 != 0)
}

/// The regular files the processes `pids` hold open for writing (sorted, once each).
pub fn written_files(proc_root: &Path, pids: &[u32]) -> Vec<PathBuf> {
    let mut files = std::collections::BTreeSet::new();
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        let Ok(fds) = fs::read_dir(dir.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = fs::read_link(fd.path()) else {
                continue;
            };
            // Pipes, sockets and deleted files are CRIU's to dump, not ours to carry.
            if !target.is_absolute() || target.to_string_lossy().ends_with(" (deleted)") {
                continue;
            }
            let writable = fs::read_to_string(dir.join("fdinfo").join(fd.file_name()))
                .is_ok_and(|t| fdinfo_writable(&t));
            if writable && fs::metadata(&target).is_ok_and(|m| m.is_file()) {
                files.insert(target);
            }
        }
    }
    files.into_iter().collect()
}

/// Whether `path` is an absolute path without `..` below one of `roots`.
fn is_below(path: &Path, roots: &[PathBuf]) -> bool {
    path.is_absolute()
        && !path.components().any(|c| c == Component::ParentDir)
        && roots.iter().any(|r| path.starts_with(r))
}

/// Why a transparent move could not dump or place a job. Its text is what the job's report
/// (and `govctl job`) says.
#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error(
        "it writes {}, outside the directories a move carries ({roots}); only jobs that write below those can move without a declared checkpoint",
        .file.display()
    )]
    WritesOutside { file: PathBuf, roots: String },
    #[error("the carried dump holds {}, outside the directories a move may write", .0.display())]
    CarriedOutside(PathBuf),
    #[error("{}: {source}", .path.display())]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot copy {}: {source}", .path.display())]
    Copy {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run {}: {source}", .program.display())]
    Run {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("criu dump failed ({status}): {errors}")]
    DumpFailed {
        status: std::process::ExitStatus,
        errors: String,
    },
    #[error("`{} check` failed ({status}): {errors}", .program.display())]
    CheckFailed {
        program: PathBuf,
        status: std::process::ExitStatus,
        errors: String,
    },
    #[error("the dump's task ended before it finished: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Refuse files a transparent move may not carry (written outside `roots`).
pub fn check_carried(files: &[PathBuf], roots: &[PathBuf]) -> Result<(), CriuError> {
    match files.iter().find(|f| !is_below(f, roots)) {
        Some(f) => Err(CriuError::WritesOutside {
            file: f.clone(),
            roots: roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
        None => Ok(()),
    }
}

/// Copy `files` into the bundle's `files/` at their absolute paths (after the dump: their size
/// is then the one CRIU recorded). Returns the bytes copied.
pub fn stage_files(bundle: &Path, files: &[PathBuf]) -> Result<u64, CriuError> {
    let mut bytes = 0;
    for file in files {
        let relative = file.strip_prefix("/").unwrap_or(file);
        let copy = bundle.join(FILES).join(relative);
        if let Some(parent) = copy.parent() {
            fs::create_dir_all(parent).map_err(|source| CriuError::Directory {
                path: parent.to_owned(),
                source,
            })?;
        }
        bytes += fs::copy(file, &copy).map_err(|source| CriuError::Copy {
            path: file.clone(),
            source,
        })?;
    }
    Ok(bytes)
}

/// Put a carried bundle's files back at their absolute paths, each below one of `roots`
/// (checked again here: the bundle came over the network). Returns how many.
pub fn place_files(bundle: &Path, roots: &[PathBuf]) -> Result<usize, CriuError> {
    let base = bundle.join(FILES);
    let mut placed = 0;
    let mut pending = vec![base.clone()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let kind = entry.file_type().map_err(|source| CriuError::Directory {
                path: path.clone(),
                source,
            })?;
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            if !kind.is_file() {
                continue;
            }
            let relative = path.strip_prefix(&base).expect("below the base");
            let dest = Path::new("/").join(relative);
            if !is_below(&dest, roots) {
                return Err(CriuError::CarriedOutside(dest));
            }
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent).map_err(|source| CriuError::Directory {
                    path: parent.to_owned(),
                    source,
                })?;
            }
            fs::copy(&path, &dest).map_err(|source| CriuError::Write {
                path: dest.clone(),
                source,
            })?;
            placed += 1;
        }
    }
    Ok(placed)
}

/// What a transparent save needs: the tree to dump and the files to carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpRequest {
    pub job_id: String,
    pub replica: u32,
    /// The init of the job's PID namespace, as this node sees it.
    pub init_pid: u32,
    pub bundle: PathBuf,
    pub files: Vec<PathBuf>,
    pub criu: PathBuf,
}

/// Dump the job into its bundle (replacing an older one) and stage its written files. Takes as
/// long as CRIU does (seconds); the job is frozen meanwhile and gone once it succeeds.
pub async fn dump(request: &DumpRequest) -> Result<u64, CriuError> {
    let images = request.bundle.join(IMAGES);
    let bundle = request.bundle.clone();
    tokio::task::spawn_blocking(move || {
        let _ = fs::remove_dir_all(&bundle);
        fs::create_dir_all(bundle.join(IMAGES)).map_err(|source| CriuError::Directory {
            path: bundle.clone(),
            source,
        })
    })
    .await??;
    let output = tokio::process::Command::new(&request.criu)
        .args(dump_args(request.init_pid, &images))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| CriuError::Run {
            program: request.criu.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(CriuError::DumpFailed {
            status: output.status,
            errors: log_errors(&images.join(DUMP_LOG)),
        });
    }
    let (bundle, files) = (request.bundle.clone(), request.files.clone());
    tokio::task::spawn_blocking(move || stage_files(&bundle, &files)).await?
}

/// `criu check`: whether CRIU works with this kernel (Debian's criu 3.17 does not on 6.18: it
/// fails before it touches any process). Seconds at most (it loads CRIU's kernel modules,
/// which the first dump would otherwise).
pub fn check(criu: &Path) -> Result<(), CriuError> {
    let out = std::process::Command::new(criu)
        .arg("check")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| CriuError::Run {
            program: criu.to_owned(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).collect();
    Err(CriuError::CheckFailed {
        program: criu.to_owned(),
        status: out.status,
        errors: errors[errors.len().saturating_sub(2)..].join("; "),
    })
}

/// Whether `criu` names a program this node can run (a path, or a name on `PATH` or in the
/// system's sbin directories, where distributions install it and a service's PATH may not
/// look).
pub fn find_program(criu: &Path) -> Option<PathBuf> {
    if criu.components().count() > 1 {
        return criu.is_file().then(|| criu.to_owned());
    }
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"])
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(criu))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_init_is_told_from_other_processes() {
        assert!(is_namespace_init(
            "Name:\tgovernor\nNSpid:\t134\t1\nNSpgid:\t1\n"
        ));
        assert!(!is_namespace_init("NSpid:\t135\t2\n"));
        assert!(!is_namespace_init("NSpid:\t1\n")); // the node's own init
        assert!(!is_namespace_init("Name:\tx\n"));
        assert!(in_child_namespace("NSpid:\t135\t2\n"));
        assert!(!in_child_namespace("NSpid:\t135\n"));
    }

    #[test]
    fn descriptors_open_for_writing_are_told_from_read_only_ones() {
        assert!(fdinfo_writable("pos:\t0\nflags:\t0102001\nmnt_id:\t21\n")); // O_APPEND|O_WRONLY
        assert!(fdinfo_writable("flags:\t02\n")); // O_RDWR
        assert!(!fdinfo_writable("flags:\t0100000\n")); // O_RDONLY|O_LARGEFILE
        assert!(!fdinfo_writable("pos:\t0\n"));
    }

    #[test]
    fn only_files_below_the_carried_roots_move_and_they_land_where_they_were() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let logs = tmp.path().join("logs");
        fs::create_dir_all(&out).unwrap();
        fs::create_dir_all(&logs).unwrap();
        let roots = vec![out.clone(), logs.clone()];
        let job_out = out.join("job.out");
        let log = logs.join("train.csv");
        fs::write(&job_out, b"epoch 1\n").unwrap();
        fs::write(&log, b"epoch,loss\n1,0.5\n").unwrap();
        let files = vec![job_out.clone(), log.clone()];
        check_carried(&files, &roots).unwrap();
        let err = check_carried(&[tmp.path().join("elsewhere")], &roots)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("outside the directories a move carries"),
            "{err}"
        );
        let sneaky = out.join("..").join("escape");
        assert!(check_carried(&[sneaky], &roots).is_err());

        let bundle = tmp.path().join("bundle");
        let bytes = stage_files(&bundle, &files).unwrap();
        assert_eq!(bytes, 8 + 17);
        // The target: the files are gone (another node), then put back from the bundle.
        fs::remove_file(&job_out).unwrap();
        fs::write(&log, b"something else").unwrap();
        assert_eq!(place_files(&bundle, &roots).unwrap(), 2);
        assert_eq!(fs::read(&job_out).unwrap(), b"epoch 1\n");
        assert_eq!(fs::read(&log).unwrap(), b"epoch,loss\n1,0.5\n");
        // A bundle holding a file outside the roots is refused.
        let err = place_files(&bundle, std::slice::from_ref(&logs))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("outside the directories a move may write"),
            "{err}"
        );
    }

    #[test]
    fn the_written_files_of_a_process_are_found_in_proc() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("written.log");
        let _w = fs::File::create(&path).unwrap();
        let _r = fs::File::open(env!("CARGO_MANIFEST_DIR").to_owned() + "/Cargo.toml").unwrap();
        let files = written_files(Path::new("/proc"), &[std::process::id()]);
        assert!(files.contains(&path), "{files:?}");
        assert!(
            !files.iter().any(|f| f.ends_with("Cargo.toml")),
            "{files:?}"
        );
    }

    #[test]
    fn a_criu_that_fails_its_check_is_refused_with_its_errors() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let path = tmp.path().join(name);
            fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            path
        };
        // A script just written may be "busy" while another test thread forks (ETXTBSY).
        let check = |p: &Path| {
            for _ in 0..20 {
                match check(p) {
                    Err(e) if e.to_string().contains("Text file busy") => {
                        std::thread::sleep(std::time::Duration::from_millis(50))
                    }
                    other => return other,
                }
            }
            check(p)
        };
        let good = script("good", "[ \"$1\" = check ] && echo 'Looks good.'");
        assert!(check(&good).is_ok());
        let bad = script(
            "bad",
            "echo 'Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds' >&2\necho 'Error (criu/crtools.c:260): Could not initialize kernel features detection.' >&2\nexit 1",
        );
        let err = check(&bad).unwrap_err().to_string();
        assert!(err.contains("check` failed"), "{err}");
        assert!(
            err.contains("Unexpected rt vDSO area bounds; Error (criu/crtools.c:260)"),
            "{err}"
        );
        assert!(check(&tmp.path().join("absent")).is_err());
    }

    #[test]
    fn the_criu_command_lines_name_the_images_and_keep_the_cgroup() {
        let d = dump_args(42, Path::new("/b/images"));
        assert_eq!(
            d,
            ["dump", "-t", "42", "-D", "/b/images", "-o", "dump.log"].map(OsString::from)
        );
        let r = restore_args(Path::new("/b/images"), Path::new("/b/images/restored.pid"));
        assert!(r.contains(&OsString::from("--manage-cgroups=ignore")));
        assert!(
            !r.contains(&OsString::from("-d")),
            "restores in the foreground"
        );
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("dump.log");
        fs::write(
            &log,
            "(00.1) Warn x\n(00.2) Error (criu/a.c:1): one\n(00.3) Error (criu/b.c:2): two\n",
        )
        .unwrap();
        let e = log_errors(&log);
        assert!(
            e.starts_with("(00.2) Error (criu/a.c:1): one; (00.3) Error"),
            "{e}"
        );
        assert!(!has_images(tmp.path()));
    }
}
