//! `governor supervise`: the small parent the daemon puts between itself and each job it starts
//! for the coordinator, so that a job's exit status survives a restart of the daemon.
//!
//! Why: a job is the daemon's child, and only a parent can learn how its child ended. When the
//! daemon restarts (an upgrade, a crash) its jobs run on, but the new daemon is not their
//! parent: it can see them end (a pidfd) but not with which status, and the coordinator could
//! only say "ended, status unknown". The supervisor is the job's parent for the job's whole
//! life; it writes the status to a file ([`ExitRecord`]) before it exits, the same way whoever
//! is running then, and ends itself the same way (same code, or the same signal), so the
//! daemon that started it sees the job's own status too.
//!
//! It runs in the job's cgroup, in the job's process group, with the job's environment and
//! output; it uses no runtime and no threads (2.2 MB resident, 0.6 MB of it private, charged to
//! the job). Signals sent to it (TERM, INT, HUP, QUIT, USR1, USR2) are passed on to the job,
//! and the job is killed if the supervisor itself is (PR_SET_PDEATHSIG), as it was when it was
//! the main process. A program that cannot be started is recorded with its error (and code 127, as a shell would),
//! so the daemon reports the job `failed` with the reason rather than a bare exit code.
//!
//! With `--pid-namespace` the job runs in a PID namespace of its own under a small init (this
//! same program, `--namespace-init`), so that CRIU can dump its whole tree and restore it on
//! another node with the same PIDs (a transparent move). The init is PID 1 there: it calls
//! `setsid` (a dumped tree must hold its own session), passes the signals on, reaps orphans,
//! and writes the job's record itself, because a PID 1 cannot end itself by a signal and its
//! parent would only see "exited 128+N". With `--restore DIR` the supervisor runs `criu
//! restore` of a dump in DIR instead of the command (criu stays the restored init's parent and
//! forwards nothing: signals go to the restored init, whose pid criu writes to a file). The
//! restored init still writes the job's record, at the same path. If no record is left, the
//! init was killed (CRIU's dump kills the tree once it is saved; an OOM kill): recorded as
//! SIGKILL, and the daemon, which knows whether it dumped the job, tells the two apart.

use crate::discovery::procfs::Credentials;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};

/// How a supervised job ended, as `governor supervise` writes it (JSON, one object).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitRecord {
    /// Its exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it could not be started (then `code` is 127).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ExitRecord {
    /// The record of a status from `wait`.
    pub fn from_status(status: ExitStatus) -> ExitRecord {
        ExitRecord {
            code: status.code(),
            signal: status.signal(),
            error: None,
        }
    }

    /// The status as `wait` would have given it (`None` for a record with neither code nor
    /// signal).
    pub fn status(&self) -> Option<ExitStatus> {
        match (self.code, self.signal) {
            (Some(code), _) => Some(ExitStatus::from_raw((code & 0xff) << 8)),
            (None, Some(signal)) => Some(ExitStatus::from_raw(signal & 0x7f)),
            (None, None) => None,
        }
    }

    /// Read a record; `None` when the file is missing or not a record (a supervisor killed
    /// before it could write one leaves nothing).
    pub fn read(path: &Path) -> Option<ExitRecord> {
        let text = std::fs::read(path).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Write the record durably ([`crate::sys::durable`]): a supervisor killed while it
    /// writes leaves no half record, and a record written survives a power cut.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::sys::durable::write_durably(path, &text)
    }
}

/// Arguments of `governor supervise`.
#[derive(Debug, clap::Args)]
pub struct SuperviseArgs {
    /// Where to write how the command ended (JSON: {"code":N} or {"signal":N}, or {"error":..}
    /// when it could not start).
    #[arg(long)]
    pub status_file: PathBuf,
    /// Run the job in a PID namespace of its own, under a small init (so that CRIU can dump
    /// and restore its whole process tree). Without the right to (CAP_SYS_ADMIN) the job runs
    /// without one, and says so on stderr.
    #[arg(long)]
    pub pid_namespace: bool,
    /// Restore the job from the CRIU images in this directory instead of starting the command
    /// (the end of a transparent move on this node; the command is kept for the record).
    #[arg(long, value_name = "DIR")]
    pub restore: Option<PathBuf>,
    /// The `criu` program (for `--restore`).
    #[arg(long, default_value = "criu")]
    pub criu: PathBuf,
    /// Internal: be the init of the job's PID namespace (started by `--pid-namespace`).
    #[arg(long, hide = true)]
    pub namespace_init: bool,
    /// Run the job (not the supervisor, which keeps its rights for the namespace and CRIU) as
    /// `UID:GID` with the supplementary groups `G1,G2,...` after a second colon.
    #[arg(long, value_name = "UID:GID[:GROUPS]", value_parser = parse_credentials)]
    pub user: Option<Credentials>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// `UID:GID` or `UID:GID:G1,G2,...`.
pub fn parse_credentials(s: &str) -> Result<Credentials, String> {
    let bad = || format!("{s:?} is not UID:GID[:G1,G2,...]");
    let mut parts = s.splitn(3, ':');
    let uid = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let gid = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let groups = match parts.next() {
        None | Some("") => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|g| g.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?,
    };
    Ok(Credentials { uid, gid, groups })
}

/// The `--user` argument for `creds` ([`parse_credentials`] reads it back).
pub fn credentials_arg(creds: &Credentials) -> String {
    let groups: Vec<String> = creds.groups.iter().map(u32::to_string).collect();
    format!("{}:{}:{}", creds.uid, creds.gid, groups.join(","))
}

/// Signals passed on to the job.
const FORWARDED: [nix::sys::signal::Signal; 6] = {
    use nix::sys::signal::Signal::*;
    [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2]
};

/// Run the command, wait for it, record how it ended, and end the same way.
pub fn run(args: SuperviseArgs) -> ExitCode {
    if let Err(e) = crate::sys::catch_signals_for_forwarding(&FORWARDED) {
        eprintln!("governor supervise: cannot pass signals on to the job: {e}");
    }
    if args.namespace_init {
        return run_namespace_init(&args);
    }
    if let Some(images) = &args.restore {
        return run_restore(&args, images);
    }
    if args.pid_namespace {
        match crate::sys::unshare_pid_namespace() {
            Ok(()) => return run_namespaced(&args),
            Err(e) => eprintln!(
                "governor supervise: cannot give the job a PID namespace of its own ({e}); it runs without one and cannot be moved by CRIU"
            ),
        }
    }
    run_plain(&args)
}

/// The job as the supervisor's own child.
fn run_plain(args: &SuperviseArgs) -> ExitCode {
    let program = &args.command[0];
    let mut command = std::process::Command::new(program);
    command.args(&args.command[1..]);
    // The user first: a change of credentials clears the parent-death signal set after it.
    if let Some(creds) = &args.user {
        crate::sys::run_as(&mut command, creds);
    }
    crate::sys::kill_when_parent_dies(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return record_start_error(args, format!("cannot start {program:?}: {e}")),
    };
    crate::sys::forward_signals_to(child.id());
    // std retries the wait on EINTR, so a forwarded signal does not end the wait.
    let status = match child.wait() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("governor supervise: cannot wait for the job: {e}");
            return ExitCode::from(125);
        }
    };
    let record = ExitRecord::from_status(status);
    write_or_say(&record, &args.status_file);
    end_like(&record)
}

/// End the way the record says the job ended.
fn end_like(record: &ExitRecord) -> ExitCode {
    match (record.code, record.signal) {
        (Some(code), _) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)),
        (None, Some(signal)) => crate::sys::end_like_signal(signal),
        (None, None) => ExitCode::from(125),
    }
}

/// The supervisor of a job in its own PID namespace (already unshared): start the init, which
/// starts the job; wait for it.
fn run_namespaced(args: &SuperviseArgs) -> ExitCode {
    let mut command = std::process::Command::new("/proc/self/exe");
    command
        .arg("supervise")
        .arg("--namespace-init")
        .arg("--status-file")
        .arg(&args.status_file);
    if let Some(creds) = &args.user {
        command.arg("--user").arg(credentials_arg(creds));
    }
    command.arg("--").args(&args.command);
    crate::sys::kill_when_parent_dies(&mut command);
    let mut init = match command.spawn() {
        Ok(init) => init,
        Err(e) => {
            eprintln!(
                "governor supervise: cannot start the job's namespace init ({e}); running it without one"
            );
            return run_plain(args);
        }
    };
    crate::sys::forward_signals_to(init.id());
    let status = match init.wait() {
        Ok(status) => status,
        Err(e) => {
            eprintln!("governor supervise: cannot wait for the job: {e}");
            return ExitCode::from(125);
        }
    };
    finish_namespaced(args, Some(status))
}

/// After the job's init ended: its own record (it writes one when the job ends), else how the
/// init itself ended (`None`: unknown, after a restore, where criu is the init's parent).
fn finish_namespaced(args: &SuperviseArgs, init: Option<ExitStatus>) -> ExitCode {
    let record = ExitRecord::read(&args.status_file).unwrap_or_else(|| {
        let record = match init {
            Some(status) if status.signal().is_some() => ExitRecord::from_status(status),
            // No record and no signal: killed where we could not see it (a dump, an OOM kill).
            _ => ExitRecord {
                code: None,
                signal: Some(libc::SIGKILL),
                error: None,
            },
        };
        write_or_say(&record, &args.status_file);
        record
    });
    end_like(&record)
}

/// PID 1 of the job's namespace: its own session, the job as its child, orphans reaped, the
/// job's record written here (a PID 1 cannot end itself by a signal), its code as the exit.
fn run_namespace_init(args: &SuperviseArgs) -> ExitCode {
    crate::sys::close_inherited_descriptors();
    if let Err(e) = crate::sys::new_session() {
        eprintln!("governor supervise: cannot start a session for the job ({e})");
    }
    let program = &args.command[0];
    let mut command = std::process::Command::new(program);
    command.args(&args.command[1..]);
    if let Some(creds) = &args.user {
        crate::sys::run_as(&mut command, creds);
    }
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return record_start_error(args, format!("cannot start {program:?}: {e}")),
    };
    crate::sys::forward_signals_to(child.id());
    let status = match crate::sys::reap_until(child.id()) {
        Ok(status) => status,
        Err(e) => {
            eprintln!("governor supervise: cannot wait for the job: {e}");
            return ExitCode::from(125);
        }
    };
    let record = ExitRecord::from_status(status);
    write_or_say(&record, &args.status_file);
    let code = record
        .code
        .or(record.signal.map(|s| 128 + s))
        .unwrap_or(125);
    ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1))
}

/// Restore a dumped job (`criu restore` in the foreground: criu stays the parent of the
/// restored init and waits for it); signals go to the restored init once criu names it.
fn run_restore(args: &SuperviseArgs, images: &Path) -> ExitCode {
    let pidfile = images.join("restored.pid");
    let _ = std::fs::remove_file(&pidfile);
    let mut command = std::process::Command::new(&args.criu);
    command
        .args(crate::criu::restore_args(images, &pidfile))
        .stdin(std::process::Stdio::null());
    crate::sys::kill_when_parent_dies(&mut command);
    let mut criu = match command.spawn() {
        Ok(criu) => criu,
        Err(e) => {
            return record_start_error(
                args,
                format!("cannot run {} to restore the job: {e}", args.criu.display()),
            );
        }
    };
    // Restored once criu names the restored init (the file may be gone later: a new dump of
    // the job replaces the images directory).
    let mut restored = false;
    let status = loop {
        match criu.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            restored = true;
            crate::sys::forward_signals_to(pid);
            break criu.wait();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    match status {
        Ok(status) if !restored => record_start_error(
            args,
            format!(
                "criu could not restore the job ({status}): {}",
                crate::criu::log_errors(&images.join(crate::criu::RESTORE_LOG))
            ),
        ),
        Ok(_) => finish_namespaced(args, None),
        Err(e) => {
            eprintln!("governor supervise: cannot wait for criu: {e}");
            ExitCode::from(125)
        }
    }
}

/// The job could not start (or be restored): recorded with the reason and code 127.
fn record_start_error(args: &SuperviseArgs, error: String) -> ExitCode {
    eprintln!("governor supervise: {error}");
    write_or_say(
        &ExitRecord {
            code: Some(127),
            signal: None,
            error: Some(error),
        },
        &args.status_file,
    );
    ExitCode::from(127)
}

fn write_or_say(record: &ExitRecord, path: &Path) {
    if let Err(e) = record.write(path) {
        eprintln!(
            "governor supervise: cannot record the job's exit status in {}: {e}",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_users_credentials_pass_to_the_supervisor_and_back() {
        let c = Credentials {
            uid: 1000,
            gid: 100,
            groups: vec![100, 27, 44],
        };
        assert_eq!(parse_credentials(&credentials_arg(&c)).unwrap(), c);
        let bare = parse_credentials("65534:65534").unwrap();
        assert_eq!((bare.uid, bare.gid, bare.groups.len()), (65534, 65534, 0));
        for bad in ["", "1000", "x:1", "1:2:a,b", "-1:0"] {
            assert!(parse_credentials(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_record_gives_back_the_status_it_was_made_from() {
        for raw in [0, 3 << 8, 255 << 8, 9, 15, 6 | 0x80] {
            let status = ExitStatus::from_raw(raw);
            let record = ExitRecord::from_status(status);
            let back = record.status().unwrap();
            assert_eq!(back.code(), status.code(), "raw {raw:#x}");
            assert_eq!(back.signal(), status.signal(), "raw {raw:#x}");
        }
        assert_eq!(ExitRecord::default().status(), None);
    }

    #[test]
    fn records_round_trip_through_their_file_and_garbage_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.exit");
        assert_eq!(ExitRecord::read(&path), None);
        let record = ExitRecord {
            code: Some(127),
            signal: None,
            error: Some("cannot start /nope: No such file or directory".into()),
        };
        record.write(&path).unwrap();
        assert_eq!(ExitRecord::read(&path), Some(record));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            r#"{"code":127,"error":"cannot start /nope: No such file or directory"}"#
        );
        std::fs::write(&path, b"\xff not json").unwrap();
        assert_eq!(ExitRecord::read(&path), None);
    }
}
