//! Job groups the daemon makes for a user who is not root (`governor run-job` sends
//! `join_job`): what the user is given, and how the daemon later tells such groups apart.
//!
//! # What a user is given
//! On cgroup v2 the job's directory and its `cgroup.procs`, `cgroup.threads` and
//! `cgroup.subtree_control` are handed to the user (`chown`), as systemd's `Delegate=yes` does
//! for a user's scope (the kernel lists the same files in `/sys/kernel/cgroup/delegate`). With
//! them the job may make sub-groups of its own group, move its own processes between them and
//! enable controllers for them: useful for a launcher that wants its data loaders apart, or a
//! rootless container runtime inside the job. Why that gives the user nothing beyond its job:
//! - every other file of the job's group (`cpu.weight`, `cpu.max`, `memory.high`, `memory.max`,
//!   `pids.max`, `cgroup.kill`, `cgroup.max.*`) stays root's: the user cannot change what the
//!   daemon sets for the job, nor lift a limit;
//! - limits set on the sub-groups only divide what the job's group gets (v2 limits are
//!   hierarchical);
//! - cgroup v2 lets a process move only with write access to the `cgroup.procs` of the common
//!   ancestor of where it is and where it goes: inside the job's group the user has it, between
//!   the job and anywhere else the common ancestor is root's, so nothing moves in or out;
//! - how many sub-groups, and how deep, is bounded ([`DELEGATED_MAX_DESCENDANTS`],
//!   [`DELEGATED_MAX_DEPTH`], in root's `cgroup.max.descendants` and `cgroup.max.depth`);
//! - the group's parent (`governor.slice/jobs`) stays root's: the user cannot remove or rename
//!   the group, which the daemon removes when the job has ended.
//!
//! cgroup v1 groups are not delegated at all: v1 has no common-ancestor rule (write access to
//! a group's `tasks` or `cgroup.procs` and the same uid as the process are enough), so a user
//! given a job's v1 `cgroup.procs` could move any of its other processes into the job, out of
//! a limit set on its session. (systemd likewise delegates v1 controllers to no unprivileged
//! user.) On a hybrid host only the job's directory in the controller-less v2 tree is
//! delegated, which moves no process between v1 groups.
//!
//! # Which groups the daemon made for a user
//! A delegated group's directory belongs to its user: [`CgroupFs::delegated_job_groups`] finds
//! them again after a restart, so that those whose job ended are removed.

use std::path::{Path, PathBuf};

use tracing::{debug, info};

use super::error::CgroupError;
use super::fs::{CgroupFs, read_file, write_file};
use super::hierarchy::{Controller, JobCgroup};
use super::jobs::subtree_procs;

/// The files of a cgroup v2 group that delegation hands over, besides the directory itself.
pub const DELEGATED_FILES: [&str; 3] = ["cgroup.procs", "cgroup.threads", "cgroup.subtree_control"];

/// How many groups a job's user may make below its delegated group (`cgroup.max.descendants`).
pub const DELEGATED_MAX_DESCENDANTS: u32 = 256;

/// How deep below its delegated group a job's user may make groups (`cgroup.max.depth`).
pub const DELEGATED_MAX_DEPTH: u32 = 8;

impl CgroupFs {
    /// The job's directory in the cgroup v2 tree (the only tree on v2; the controller-less
    /// `unified` tree of a hybrid host), if this hierarchy has one.
    fn v2_dir(&self, job: &JobCgroup) -> Option<PathBuf> {
        self.hierarchy()
            .unified_dir()
            .map(|u| u.join(job.relative()))
    }

    /// Hand `job`'s cgroup v2 directory and its [`DELEGATED_FILES`] to user `uid` (see the
    /// module doc for what that gives and why v1 groups are not delegated), after bounding the
    /// groups the user may make below it. Files this group does not have (a fake root) are
    /// skipped. Root's own groups (`uid` 0) are left as they are.
    pub fn delegate_job_group(&self, job: &JobCgroup, uid: u32) -> Result<(), CgroupError> {
        let Some(dir) = self.v2_dir(job) else {
            return Ok(());
        };
        if uid == 0 {
            return Ok(());
        }
        for (file, value) in [
            ("cgroup.max.descendants", DELEGATED_MAX_DESCENDANTS),
            ("cgroup.max.depth", DELEGATED_MAX_DEPTH),
        ] {
            let path = dir.join(file);
            if path.exists() {
                let value = value.to_string();
                write_file(&path, &value).map_err(|error| CgroupError::WriteFailed {
                    path: path.clone(),
                    value,
                    error,
                })?;
            }
        }
        let chown = |path: &Path| {
            std::os::unix::fs::chown(path, Some(uid), None).map_err(|error| {
                CgroupError::DelegateFailed {
                    path: path.to_owned(),
                    uid,
                    error,
                }
            })
        };
        for file in DELEGATED_FILES {
            let path = dir.join(file);
            if path.exists() {
                chown(&path)?;
            }
        }
        // The directory last: until then the user cannot make a group below it.
        chown(&dir)?;
        info!(job = %job, uid, dir = %dir.display(), "job cgroup delegated to its user");
        Ok(())
    }

    /// The user a job group under `subtree` was delegated to, from its v2 directory's owner
    /// (`None`: no v2 tree, no such group, or root's own).
    pub fn delegated_to(&self, job: &JobCgroup) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata(self.v2_dir(job)?).ok()?.uid();
        (uid != 0).then_some(uid)
    }

    /// The job groups directly under `subtree` that were delegated to a user, with the user:
    /// after a restart, the groups the daemon made for users whose jobs may have ended since.
    pub fn delegated_job_groups(&self, subtree: &Path) -> Vec<(JobCgroup, u32)> {
        let Some(base) = self.hierarchy().unified_dir().map(|u| u.join(subtree)) else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir(&base) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| {
                let job = JobCgroup::new(subtree.join(e.file_name())).ok()?;
                let uid = self.delegated_to(&job)?;
                Some((job, uid))
            })
            .collect()
    }

    /// Whether any process lives in `job`'s cgroup or a group below it. On cgroup v2 the
    /// kernel's `populated` flag (`cgroup.events`) counts the descendants; elsewhere (v1, a
    /// fake root) the `cgroup.procs` of the group and of every group below it are read.
    pub fn populated(&self, job: &JobCgroup) -> bool {
        let Some(dir) = self.job_dirs(job).into_iter().next() else {
            return false;
        };
        if self.hierarchy().on_cgroupfs()
            && let Ok(events) = read_file(&dir.join("cgroup.events"))
            && let Some(flag) = events.lines().find_map(|l| l.strip_prefix("populated "))
        {
            return flag.trim() == "1";
        }
        !subtree_procs(&dir).is_empty()
    }

    /// The smallest `pids.max` on `dirs` (a process's groups, [`CgroupFs::process_dirs`]) and
    /// their ancestors within their mounts: the bound on the number of tasks a process is under
    /// (systemd puts one on every user's slice).
    pub fn pids_ceiling(&self, dirs: &[PathBuf]) -> Option<u64> {
        self.ancestry(dirs)
            .into_iter()
            .filter_map(|d| read_file(&d.join("pids.max")).ok())
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .min()
    }

    /// Put `job` under at most `max` tasks (`pids.max`), where the pids controller is
    /// available to it.
    pub fn set_pids_max(&self, job: &JobCgroup, max: u64) -> Result<(), CgroupError> {
        let path = match self.file_path(job, Controller::Pids, "pids.max") {
            Ok(p) => p,
            Err(CgroupError::ControllerUnavailable { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        match self.write_job_file(job, Controller::Pids, &path, &max.to_string()) {
            Err(CgroupError::ControllerUnavailable { .. }) => {
                debug!(job = %job, "no pids controller for the job: its task bound is not carried");
                Ok(())
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::FakeCgroupRoot;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_v2_group_is_handed_over_with_its_three_files_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        let group = fake.add_group("governor.slice/jobs/alice");
        for f in [
            "cgroup.threads",
            "cgroup.max.descendants",
            "cgroup.max.depth",
        ] {
            std::fs::write(group.join(f), "max\n").unwrap();
        }
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let job = JobCgroup::new("governor.slice/jobs/alice").unwrap();
        // Unprivileged test runs may only give files to themselves: the ownership is then
        // unchanged, and what is written still shows.
        let me = nix::unistd::geteuid().as_raw();
        let user = if me == 0 { 4242 } else { me };
        fs.delegate_job_group(&job, user).unwrap();
        let owner = |f: &str| std::fs::metadata(group.join(f)).unwrap().uid();
        for f in DELEGATED_FILES {
            assert_eq!(owner(f), user, "{f}");
        }
        assert_eq!(owner(""), user, "the directory");
        if me == 0 {
            for f in [
                "cpu.weight",
                "cpu.max",
                "memory.max",
                "pids.max",
                "cgroup.max.depth",
            ] {
                assert_eq!(owner(f), 0, "{f} must stay root's");
            }
            assert_eq!(fs.delegated_to(&job), Some(4242));
            assert_eq!(
                fs.delegated_job_groups(Path::new("governor.slice/jobs")),
                vec![(job.clone(), 4242)]
            );
        }
        assert_eq!(
            fake.get("governor.slice/jobs/alice", "cgroup.max.descendants"),
            "256"
        );
        assert_eq!(
            fake.get("governor.slice/jobs/alice", "cgroup.max.depth"),
            "8"
        );
    }

    #[test]
    fn root_and_v1_groups_are_not_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::legacy(dir.path());
        fake.add_group("governor.slice/jobs/bob");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let job = JobCgroup::new("governor.slice/jobs/bob").unwrap();
        fs.delegate_job_group(&job, 4242).unwrap();
        let cpu = fake.dir(Controller::Cpu, "governor.slice/jobs/bob");
        let me = nix::unistd::geteuid().as_raw();
        for f in ["", "cgroup.procs", "tasks", "cpu.shares"] {
            assert_eq!(std::fs::metadata(cpu.join(f)).unwrap().uid(), me, "{f}");
        }
        assert_eq!(fs.delegated_to(&job), None);
        assert!(
            fs.delegated_job_groups(Path::new("governor.slice/jobs"))
                .is_empty()
        );
    }

    #[test]
    fn a_group_is_populated_while_a_process_lives_below_it_and_removed_with_its_subgroups() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("governor.slice/jobs/carol/workers/a");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let job = JobCgroup::new("governor.slice/jobs/carol").unwrap();
        assert!(!fs.populated(&job));
        fake.set(
            "governor.slice/jobs/carol/workers/a",
            "cgroup.procs",
            "77\n",
        );
        assert!(fs.populated(&job), "a process two levels below");
        fake.set("governor.slice/jobs/carol/workers/a", "cgroup.procs", "");
        assert!(!fs.populated(&job));
        fs.remove_job_group(&job).unwrap();
        assert!(!dir.path().join("governor.slice/jobs/carol").exists());
        assert!(!fs.populated(&job), "a group that is gone holds nothing");
    }

    #[test]
    fn the_smallest_task_bound_on_the_way_up_is_carried() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeCgroupRoot::unified(dir.path());
        fake.add_group("user.slice/user-1000.slice/session-1.scope");
        fake.set("user.slice", "pids.max", "90000\n");
        fake.set("user.slice/user-1000.slice", "pids.max", "38502\n");
        fake.add_group("governor.slice/jobs/dave");
        let fs = CgroupFs::detect(dir.path()).unwrap();
        let from = vec![
            dir.path()
                .join("user.slice/user-1000.slice/session-1.scope"),
        ];
        assert_eq!(fs.pids_ceiling(&from), Some(38502));
        assert_eq!(fs.pids_ceiling(&[dir.path().join("governor.slice")]), None);
        let job = JobCgroup::new("governor.slice/jobs/dave").unwrap();
        fs.set_pids_max(&job, 38502).unwrap();
        assert_eq!(fake.get("governor.slice/jobs/dave", "pids.max"), "38502");
    }
}
