//! The error type of the actuation module: one variant per thing an operator has to act on, each
//! with the path (and the value, for writes) it concerns.
//!
//! Each message carries its cause (`cannot create cgroup X: Permission denied (os error 13)`),
//! because the daemon logs these errors with `%e` and the operator must see why. The cause is
//! therefore *not* also returned by `source()`: a reporter that walks the chain (anyhow's
//! `{:#}`, as the CLI prints) would print it twice ("...(os error 13): Permission denied (os
//! error 13)"). The underlying error stays in the variant's `error` field for code that needs
//! its kind.

use std::io;
use std::path::PathBuf;

use super::hierarchy::{Controller, JobCgroup};

/// Everything that can go wrong while reading or writing cgroupfs, the state file or a job group.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Neither a cgroup v2 nor a cgroup v1 hierarchy was found under the configured root.
    #[error("no cgroup hierarchy found at {root}: {reason}")]
    NoHierarchy { root: PathBuf, reason: String },

    /// A cgroup path that cannot name a governed job (`..`, the root cgroup, ...).
    #[error("invalid cgroup path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },

    /// A job name for `run-job` that cannot be a cgroup directory name.
    #[error("invalid job name {name:?}: {reason}")]
    InvalidJobName { name: String, reason: &'static str },

    /// The job's cgroup directory no longer exists (the job ended, its container was removed).
    #[error("cgroup {job} no longer exists (no directory {path})")]
    CgroupGone { job: JobCgroup, path: PathBuf },

    /// The cgroup exists but the file does not: the controller is not enabled for it (cgroup v2:
    /// missing from the parent's `cgroup.subtree_control`) or not mounted (cgroup v1).
    #[error(
        "{path} does not exist: the {controller} controller is not enabled for cgroup {job} \
         (check the parent's cgroup.subtree_control)"
    )]
    ControllerUnavailable {
        job: JobCgroup,
        controller: Controller,
        path: PathBuf,
    },

    /// Reading a cgroup file failed.
    #[error("cannot read {path}: {error}")]
    ReadFailed { path: PathBuf, error: io::Error },

    /// Writing a cgroup file failed; the file keeps its previous value.
    #[error("cannot write {value:?} to {path}: {error}")]
    WriteFailed {
        path: PathBuf,
        value: String,
        error: io::Error,
    },

    /// A cgroup file held something the kernel never writes there.
    #[error("unexpected content in {path}: {content:?} ({reason})")]
    Parse {
        path: PathBuf,
        content: String,
        reason: &'static str,
    },

    /// The allocation cannot be expressed in cgroup terms (e.g. a NaN core count).
    #[error("invalid allocation for cgroup {job}: {reason}")]
    InvalidAllocation { job: JobCgroup, reason: String },

    /// The actuator's configuration is out of the kernel's accepted ranges.
    #[error("invalid actuator configuration: {reason}")]
    InvalidConfig { reason: String },

    /// Reading, writing or syncing the state file failed. A write that needs a recorded original
    /// is not made when the original could not be recorded.
    #[error("state file {path}: {error}")]
    StateIo { path: PathBuf, error: io::Error },

    /// The state file exists but is not what the governor writes; it was set aside.
    #[error("state file {path} is not valid ({reason}); set aside as {set_aside}")]
    StateCorrupt {
        path: PathBuf,
        reason: String,
        set_aside: PathBuf,
    },

    /// Another governor holds the state file's lock.
    #[error(
        "state file {path} is locked by another running governor (lock file {lock}); \
         only one governor may run per node"
    )]
    StateLocked { path: PathBuf, lock: PathBuf },

    /// Creating a job's cgroup failed.
    #[error("cannot create cgroup {path}: {error}")]
    CreateFailed { path: PathBuf, error: io::Error },

    /// A job group with this name exists and still holds processes.
    #[error("cgroup {path} already exists and holds processes (another job with this name?)")]
    JobGroupBusy { path: PathBuf },

    /// Removing a job's cgroup failed (typically: processes are still in it).
    #[error("cannot remove cgroup {path}: {error}")]
    RemoveFailed { path: PathBuf, error: io::Error },

    /// Handing a job group to the user it was created for (`chown`) failed.
    #[error("cannot delegate {path} to uid {uid}: {error}")]
    DelegateFailed {
        path: PathBuf,
        uid: u32,
        error: io::Error,
    },

    /// Sending a signal to a process of a job group failed.
    #[error("cannot signal process {pid} of cgroup {job}: {error}")]
    SignalFailed {
        job: JobCgroup,
        pid: u32,
        error: nix::Error,
    },
}

impl CgroupError {
    /// True when the job's cgroup vanished: the daemon should forget the job, nothing is wrong.
    pub fn is_gone(&self) -> bool {
        matches!(self, CgroupError::CgroupGone { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message run-job printed: "cannot create the job's cgroup ...: cannot create cgroup
    /// ...: Permission denied (os error 13): Permission denied (os error 13)".
    #[test]
    fn a_cause_is_printed_once_through_a_chain() {
        let denied = || io::Error::from_raw_os_error(libc::EACCES);
        let path = PathBuf::from("/sys/fs/cgroup/cpu/governor.slice/jobs/probe");
        let errors = [
            CgroupError::CreateFailed {
                path: path.clone(),
                error: denied(),
            },
            CgroupError::ReadFailed {
                path: path.clone(),
                error: denied(),
            },
            CgroupError::WriteFailed {
                path: path.clone(),
                value: "1".into(),
                error: denied(),
            },
            CgroupError::StateIo {
                path: path.clone(),
                error: denied(),
            },
            CgroupError::RemoveFailed {
                path: path.clone(),
                error: denied(),
            },
            CgroupError::DelegateFailed {
                path: path.clone(),
                uid: 1000,
                error: denied(),
            },
            CgroupError::SignalFailed {
                job: JobCgroup::new("governor.slice/jobs/probe").unwrap(),
                pid: 7,
                error: nix::Error::EACCES,
            },
        ];
        for e in errors {
            let alone = e.to_string();
            assert!(
                alone.contains("ermission denied"),
                "the cause is in: {alone}"
            );
            let chain = format!(
                "{:#}",
                anyhow::Error::new(e).context("cannot create the job's cgroup")
            );
            assert_eq!(
                chain.matches("ermission denied").count(),
                1,
                "the cause once: {chain}"
            );
        }
    }
}
