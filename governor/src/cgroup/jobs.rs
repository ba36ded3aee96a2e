//! Cgroups the governor creates for the jobs it starts itself (`governor run-job`): create one
//! under the governor's own subtree, start a command inside it, signal it, remove it.
//!
//! This is the only place in the product with raw process-level syscalls (`write(2)` in the child
//! between fork and exec, `kill(2)`), through nix.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::{debug, info, warn};

use super::error::CgroupError;
use super::fs::{CgroupFs, write_file};
use super::hierarchy::JobCgroup;

/// Controllers enabled along the way down to a job group on cgroup v2.
const WANTED_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// Longest job name accepted (a cgroup directory name).
const MAX_NAME_LEN: usize = 128;

/// Check that `name` can be a cgroup directory: ASCII letters, digits, `-`, `_`, `.`, `@`, not
/// starting with `.`, at most 128 bytes.
pub fn validate_job_name(name: &str) -> Result<(), CgroupError> {
    let invalid = |reason| CgroupError::InvalidJobName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("longer than 128 bytes"));
    }
    if name.starts_with('.') {
        return Err(invalid("starts with `.`"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
    {
        return Err(invalid(
            "only ASCII letters, digits, `-`, `_`, `.` and `@` are allowed",
        ));
    }
    if name.starts_with("cgroup.")
        || WANTED_CONTROLLERS
            .iter()
            .any(|c| name.starts_with(&format!("{c}.")))
    {
        return Err(invalid("collides with a cgroup interface file name"));
    }
    Ok(())
}

impl CgroupFs {
    /// Create `<subtree>/<name>` in every hierarchy the job needs (one on v2; on v1 one per
    /// controller mount plus the v2 tree on hybrid hosts). On v2, `+cpu +memory +pids` are
    /// enabled in `cgroup.subtree_control` from the root down to the subtree where available and
    /// missing. A leftover empty group of the same name (a previous run that crashed) is reused;
    /// one that still holds processes is an error.
    pub fn create_job_group(&self, subtree: &Path, name: &str) -> Result<JobCgroup, CgroupError> {
        validate_job_name(name)?;
        let job = JobCgroup::new(subtree.join(name))?;
        let parent = JobCgroup::new(subtree)?;
        for dir in self.job_dirs(&parent) {
            create_dir_all(&dir)?;
        }
        if self.kind().is_v2()
            && let Some(unified) = self.hierarchy().unified_dir()
        {
            let mut level = unified.to_path_buf();
            self.enable_controllers(&level)?;
            for component in parent.relative().components() {
                level.push(component);
                self.enable_controllers(&level)?;
            }
        }
        for dir in self.job_dirs(&job) {
            match std::fs::create_dir(&dir) {
                // A fake root (a dry run's, a test's) holds the interface files as plain files:
                // make the one a start writes to, as the kernel would (and as
                // `remove_group_dir` removes them).
                Ok(()) if !self.hierarchy().on_cgroupfs() => {
                    std::fs::write(dir.join("cgroup.procs"), "").map_err(|source| {
                        CgroupError::CreateFailed {
                            path: dir.clone(),
                            error: source,
                        }
                    })?;
                }
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !read_procs(&dir).is_empty() {
                        return Err(CgroupError::JobGroupBusy { path: dir });
                    }
                    debug!(path = %dir.display(), "reusing an empty job cgroup left by a previous run");
                }
                Err(source) => {
                    return Err(CgroupError::CreateFailed {
                        path: dir,
                        error: source,
                    });
                }
            }
        }
        info!(job = %job, "job cgroup created");
        Ok(job)
    }

    /// Enable the wanted controllers in `dir`'s `cgroup.subtree_control` (those the directory
    /// has in `cgroup.controllers` and has not enabled yet).
    fn enable_controllers(&self, dir: &Path) -> Result<(), CgroupError> {
        let Ok(available) = std::fs::read_to_string(dir.join("cgroup.controllers")) else {
            // Not a cgroup directory the kernel manages (a fake root's plain directory).
            return Ok(());
        };
        let path = dir.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&path).unwrap_or_default();
        let enabled: Vec<&str> = enabled
            .split_whitespace()
            .map(|c| c.trim_start_matches('+'))
            .collect();
        let missing: Vec<String> = WANTED_CONTROLLERS
            .iter()
            .filter(|c| available.split_whitespace().any(|a| a == **c))
            .filter(|c| !enabled.contains(c))
            .map(|c| format!("+{c}"))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let value = missing.join(" ");
        write_file(&path, &value).map_err(|source| CgroupError::WriteFailed {
            path: path.clone(),
            value: value.clone(),
            error: source,
        })?;
        info!(path = %path.display(), controllers = %value, "controllers enabled for child cgroups");
        Ok(())
    }

    /// Move process `pid` (all its threads) into `job`'s cgroup in every hierarchy.
    pub fn add_process(&self, job: &JobCgroup, pid: u32) -> Result<(), CgroupError> {
        for dir in self.job_dirs(job) {
            let path = dir.join("cgroup.procs");
            let value = pid.to_string();
            write_file(&path, &value).map_err(|source| {
                if source.kind() == io::ErrorKind::NotFound && !dir.is_dir() {
                    CgroupError::CgroupGone {
                        job: job.clone(),
                        path: dir.clone(),
                    }
                } else {
                    CgroupError::WriteFailed {
                        path: path.clone(),
                        value,
                        error: source,
                    }
                }
            })?;
        }
        debug!(job = %job, pid, "process moved into job cgroup");
        Ok(())
    }

    /// Make `command` start inside `job`'s cgroup: the child joins every hierarchy of the group
    /// between fork and exec (by writing "0", meaning itself, to each `cgroup.procs`), so the job
    /// never runs a single instruction outside its group and cannot fork before being moved.
    pub fn prepare_command(
        &self,
        job: &JobCgroup,
        command: &mut Command,
    ) -> Result<(), CgroupError> {
        let mut fds: Vec<OwnedFd> = Vec::new();
        for dir in self.job_dirs(job) {
            let path = dir.join("cgroup.procs");
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|source| {
                    if source.kind() == io::ErrorKind::NotFound && !dir.is_dir() {
                        CgroupError::CgroupGone {
                            job: job.clone(),
                            path: dir.clone(),
                        }
                    } else {
                        CgroupError::WriteFailed {
                            path: path.clone(),
                            value: "0".into(),
                            error: source,
                        }
                    }
                })?;
            fds.push(file.into());
        }
        crate::sys::write_before_exec(command, fds, b"0");
        Ok(())
    }

    /// Pids in `job`'s cgroup (its first hierarchy); empty when it is gone.
    pub fn procs(&self, job: &JobCgroup) -> Vec<u32> {
        self.job_dirs(job)
            .first()
            .map(|d| read_procs(d))
            .unwrap_or_default()
    }

    /// Send `signal` to every process of `job`'s cgroup and of the groups below it (a delegated
    /// group's user may have made some); returns how many were signalled. On v2 SIGKILL goes
    /// through `cgroup.kill` (Linux 5.14+) when available (and writable: not for the job's
    /// user), which also catches processes forked meanwhile. Processes that exit meanwhile are
    /// not an error, nor are processes the caller may not signal (another user's, for a user's
    /// `run-job`): those are left to the daemon.
    pub fn signal_job_group(&self, job: &JobCgroup, signal: Signal) -> Result<usize, CgroupError> {
        let dirs = self.job_dirs(job);
        let Some(dir) = dirs.first() else {
            return Ok(0);
        };
        let pids = subtree_procs(dir);
        if signal == Signal::SIGKILL
            && self.kind().is_v2()
            && self.hierarchy().on_cgroupfs()
            && dir.join("cgroup.kill").exists()
            && write_file(&dir.join("cgroup.kill"), "1").is_ok()
        {
            debug!(job = %job, processes = pids.len(), "job cgroup killed through cgroup.kill");
            return Ok(pids.len());
        }
        let mut signalled = 0;
        for pid in pids {
            let Ok(raw) = i32::try_from(pid) else {
                continue;
            };
            match kill(Pid::from_raw(raw), signal) {
                Ok(()) => signalled += 1,
                Err(nix::errno::Errno::ESRCH) => {}
                Err(nix::errno::Errno::EPERM) if !nix::unistd::geteuid().is_root() => {}
                Err(source) => {
                    return Err(CgroupError::SignalFailed {
                        job: job.clone(),
                        pid,
                        error: source,
                    });
                }
            }
        }
        debug!(job = %job, signal = %signal, signalled, "job cgroup signalled");
        Ok(signalled)
    }

    /// Remove `job`'s cgroup from every hierarchy, with the empty groups below it (made by the
    /// user of a delegated group) first (best effort: call after its processes have exited). A
    /// group that is already gone is not an error; one that still holds processes is
    /// [`CgroupError::RemoveFailed`] (EBUSY).
    pub fn remove_job_group(&self, job: &JobCgroup) -> Result<(), CgroupError> {
        let mut dirs = self.job_dirs(job);
        dirs.reverse();
        let mut first_error = None;
        for dir in dirs {
            let mut below = subtree_dirs(&dir);
            // Deepest first: a cgroup is removed only once it has no children.
            below.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for sub in below.iter().filter(|d| **d != dir) {
                if let Err(e) = self.remove_group_dir(sub)
                    && e.kind() != io::ErrorKind::NotFound
                {
                    debug!(path = %sub.display(), error = %e, "cannot remove a group below a job cgroup");
                }
            }
            match self.remove_group_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    warn!(path = %dir.display(), error = %source, "cannot remove job cgroup");
                    first_error.get_or_insert(CgroupError::RemoveFailed {
                        path: dir,
                        error: source,
                    });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => {
                info!(job = %job, "job cgroup removed");
                Ok(())
            }
        }
    }

    fn remove_group_dir(&self, dir: &Path) -> io::Result<()> {
        if !self.hierarchy().on_cgroupfs() && dir.is_dir() {
            // A fake root holds its interface files as plain files; the kernel removes them
            // with the directory.
            for entry in std::fs::read_dir(dir)? {
                let path = entry?.path();
                if path.is_file() {
                    std::fs::remove_file(path)?;
                }
            }
        }
        std::fs::remove_dir(dir)
    }
}

fn create_dir_all(dir: &PathBuf) -> Result<(), CgroupError> {
    std::fs::create_dir_all(dir).map_err(|source| CgroupError::CreateFailed {
        path: dir.clone(),
        error: source,
    })
}

/// The pids listed in `dir/cgroup.procs`. Pid 0 is never a member: the kernel never lists it,
/// and on a fake root it is what [`CgroupFs::prepare_command`] wrote ("0" = the writer itself);
/// signalling it would signal the governor's own process group.
pub(crate) fn read_procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&pid: &u32| pid != 0)
        .collect()
}

/// Most cgroups looked at below one job group (its user may make sub-groups of a delegated
/// group; the daemon limits them to [`super::delegation::DELEGATED_MAX_DESCENDANTS`], this
/// bounds any walk).
const MAX_WALK: usize = 4096;

/// `dir` and every directory below it (breadth first, at most [`MAX_WALK`]): on cgroupfs, the
/// group and its descendants. Symbolic links are not followed.
pub(crate) fn subtree_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut next = 0;
    while next < out.len() && out.len() < MAX_WALK {
        let Ok(entries) = std::fs::read_dir(&out[next]) else {
            next += 1;
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) && out.len() < MAX_WALK {
                out.push(entry.path());
            }
        }
        next += 1;
    }
    out
}

/// The pids of `dir` and of every group below it.
pub(crate) fn subtree_procs(dir: &Path) -> Vec<u32> {
    subtree_dirs(dir)
        .iter()
        .flat_map(|d| read_procs(d))
        .collect()
}

/// Send `signal` to one process the governor started and has not reaped yet (so its pid cannot
/// have been reused). Returns false when it is already gone.
pub fn signal_child(pid: u32, signal: Signal) -> Result<bool, nix::errno::Errno> {
    let raw = i32::try_from(pid).map_err(|_| nix::errno::Errno::EINVAL)?;
    if raw <= 0 {
        return Err(nix::errno::Errno::EINVAL);
    }
    match kill(Pid::from_raw(raw), signal) {
        Ok(()) => Ok(true),
        Err(nix::errno::Errno::ESRCH) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::FakeCgroupRoot;
    use crate::cgroup::hierarchy::Controller;

    #[test]
    fn job_names_are_validated() {
        for ok in ["train-1", "resnet50_run.3", "a@b", &"x".repeat(128)] {
            validate_job_name(ok).unwrap_or_else(|e| panic!("{ok:?} rejected: {e}"));
        }
        for bad in [
            "",
            ".hidden",
            "a/b",
            "..",
            "a b",
            "tab\t",
            "é",
            "cgroup.procs",
            "cpu.max",
            "memory.high",
            &"x".repeat(129),
        ] {
            assert!(validate_job_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn v2_job_group_is_created_with_controllers_enabled_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        std::fs::write(dir.path().join("cgroup.subtree_control"), "memory\n").unwrap();
        // The subtree exists already, as a cgroup with controllers available but not enabled.
        fake.add_group("governor.slice");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let job = fs
            .create_job_group(Path::new("governor.slice/jobs"), "train")
            .unwrap();
        assert_eq!(job.to_string(), "/governor.slice/jobs/train");
        assert!(dir.path().join("governor.slice/jobs/train").is_dir());
        // The kernel creates a new group's interface files; on a fake root the test does.
        std::fs::write(
            dir.path().join("governor.slice/jobs/train/cgroup.procs"),
            "",
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cgroup.subtree_control")).unwrap(),
            "+cpu +pids",
            "only the missing controllers are enabled at the root"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("governor.slice/cgroup.subtree_control"))
                .unwrap(),
            "+cpu +memory +pids"
        );

        fs.add_process(&job, 4242).unwrap();
        assert_eq!(
            fake.get("governor.slice/jobs/train", "cgroup.procs"),
            "4242"
        );
        assert_eq!(fs.procs(&job), vec![4242]);
        // Busy: a second job of the same name is refused.
        let err = fs
            .create_job_group(Path::new("governor.slice/jobs"), "train")
            .unwrap_err();
        assert!(matches!(err, CgroupError::JobGroupBusy { .. }), "{err}");
        // Empty again: a leftover group is reused.
        std::fs::write(
            dir.path().join("governor.slice/jobs/train/cgroup.procs"),
            "",
        )
        .unwrap();
        fs.create_job_group(Path::new("governor.slice/jobs"), "train")
            .unwrap();

        fs.remove_job_group(&job).unwrap();
        assert!(!dir.path().join("governor.slice/jobs/train").exists());
        fs.remove_job_group(&job)
            .expect("removing a group that is gone is not an error");
    }

    #[test]
    fn v1_job_group_lives_in_every_controller_and_the_unified_tree() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::hybrid(dir.path());
        let mut fs = CgroupFs::detect(dir.path()).unwrap();
        // By default nothing is made under the v1 memory hierarchy (run-job on a hybrid host).
        fs.create_job_group(Path::new("governor"), "j0").unwrap();
        assert!(!dir.path().join("memory/governor").exists());
        assert!(dir.path().join("cpu/governor/j0").is_dir());
        // When memory is managed, the group lives in every controller.
        fs.set_job_controllers(&[
            Controller::Cpu,
            Controller::CpuAcct,
            Controller::Memory,
            Controller::Pids,
        ]);
        let job = fs.create_job_group(Path::new("governor"), "j1").unwrap();
        for c in ["cpu", "cpuacct", "memory", "pids", "unified"] {
            assert!(
                dir.path().join(c).join("governor/j1").is_dir(),
                "no group under {c}"
            );
        }
        // Fake v1 groups need their files for the process move to succeed.
        for c in ["cpu", "cpuacct", "memory", "pids", "unified"] {
            std::fs::write(dir.path().join(c).join("governor/j1/cgroup.procs"), "").unwrap();
        }
        fs.add_process(&job, 7).unwrap();
        assert_eq!(
            std::fs::read_to_string(
                fake.dir(Controller::Memory, "governor/j1")
                    .join("cgroup.procs")
            )
            .unwrap(),
            "7"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("unified/governor/j1/cgroup.procs")).unwrap(),
            "7"
        );
        fs.remove_job_group(&job).unwrap();
        for c in ["cpu", "cpuacct", "memory", "pids", "unified"] {
            assert!(!dir.path().join(c).join("governor/j1").exists());
        }
    }

    #[test]
    fn co_mounted_v1_controllers_get_one_directory() {
        let dir = tempfile::tempdir().unwrap();
        FakeCgroupRoot::legacy(dir.path());
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let job = JobCgroup::new("x/y").unwrap();
        let dirs = fs.job_dirs(&job);
        assert_eq!(
            dirs.len(),
            2,
            "cpu,cpuacct + pids (no memory unless asked): {dirs:?}"
        );
    }

    #[test]
    fn adding_a_process_to_a_vanished_group_says_gone() {
        let dir = tempfile::tempdir().unwrap();
        FakeCgroupRoot::unified(dir.path());
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let err = fs
            .add_process(&JobCgroup::new("nope").unwrap(), 1)
            .unwrap_err();
        assert!(err.is_gone(), "{err}");
        let mut cmd = Command::new("true");
        let err = fs
            .prepare_command(&JobCgroup::new("nope").unwrap(), &mut cmd)
            .unwrap_err();
        assert!(err.is_gone(), "{err}");
    }

    #[test]
    fn a_prepared_command_writes_0_to_the_groups_procs_file_before_exec() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("jobs/echo");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let job = JobCgroup::new("jobs/echo").unwrap();
        let mut cmd = Command::new("/bin/true");
        fs.prepare_command(&job, &mut cmd).unwrap();
        let status = cmd.status().expect("spawn /bin/true");
        assert!(status.success());
        // On a fake root the write lands in the plain file: "0" is how a process moves itself.
        assert_eq!(fake.get("jobs/echo", "cgroup.procs"), "0");
        // ...and it is not a member to signal (kill(0, ..) would hit our own process group).
        assert!(fs.procs(&job).is_empty());
        assert_eq!(fs.signal_job_group(&job, Signal::SIGTERM).unwrap(), 0);
    }

    #[test]
    fn signalling_an_empty_or_vanished_group_signals_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("quiet");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let quiet = JobCgroup::new("quiet").unwrap();
        assert_eq!(fs.signal_job_group(&quiet, Signal::SIGTERM).unwrap(), 0);
        assert_eq!(
            fs.signal_job_group(&JobCgroup::new("gone").unwrap(), Signal::SIGKILL)
                .unwrap(),
            0
        );
    }

    #[test]
    fn signalling_a_group_reaches_its_processes() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("sleepers");
        let mut child = Command::new("/bin/sleep").arg("30").spawn().unwrap();
        fake.set("sleepers", "cgroup.procs", &format!("{}\n", child.id()));
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let job = JobCgroup::new("sleepers").unwrap();
        assert_eq!(fs.signal_job_group(&job, Signal::SIGTERM).unwrap(), 1);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }
}
