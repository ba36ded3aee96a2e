//! Moving a job's processes out of a shared cgroup into one of the governor's, and back.
//!
//! Adoption must never be a way out of a limit: a process is moved only when neither the
//! cgroup it is in nor any ancestor (in each hierarchy the move touches) carries a CPU, memory
//! or pids limit ([`CgroupFs::limit_on`]). Where it came from is journalled in
//! `<state file>.adopted` before the first move, so that a release, a stop, or the start after a
//! crash puts the processes back ([`AdoptionJournal`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::fs::{CgroupFs, write_file};
use super::hierarchy::JobCgroup;
use super::jobs::read_procs;
use crate::sys::durable;

/// Files whose value, anywhere from a process's cgroup up to the root, limits it; with the value
/// that means "no limit". A `cpu.weight`/`cpu.shares` below the default is a limit too (a batch
/// slice), one above it is not.
const LIMIT_FILES: &[(&str, &str)] = &[
    ("cpu.max", "max"),
    ("memory.max", "max"),
    ("memory.high", "max"),
    ("pids.max", "max"),
    ("cpu.cfs_quota_us", "-1"),
];

impl CgroupFs {
    /// Where `pid` is now in each hierarchy a governor job group spans (the order of
    /// [`CgroupFs::job_dirs`]); `None` when the process is gone or a line is missing.
    pub fn process_dirs(&self, pid: u32) -> Option<Vec<PathBuf>> {
        let text =
            fs::read_to_string(self.proc_root().join(pid.to_string()).join("cgroup")).ok()?;
        self.hierarchy()
            .group_mounts(self.job_controllers())
            .into_iter()
            .map(|(mount, controller)| {
                let path = text.lines().find_map(|line| {
                    let mut parts = line.splitn(3, ':');
                    let (id, list, path) = (parts.next()?, parts.next()?, parts.next()?);
                    let hit = match controller {
                        None => id == "0" && list.is_empty(),
                        Some(c) => list.split(',').any(|x| x == c.name()),
                    };
                    hit.then(|| path.strip_suffix(" (deleted)").unwrap_or(path).to_owned())
                })?;
                Some(mount.join(path.trim_start_matches('/')))
            })
            .collect()
    }

    /// `dirs` and their ancestors, each up to (not including) the mount it is in: the groups
    /// whose limits a process in `dirs` is under.
    pub(crate) fn ancestry(&self, dirs: &[PathBuf]) -> Vec<PathBuf> {
        let mounts: Vec<PathBuf> = self
            .hierarchy()
            .group_mounts(self.job_controllers())
            .into_iter()
            .map(|(m, _)| m)
            .collect();
        let mut out = Vec::new();
        for dir in dirs {
            let Some(mount) = mounts.iter().find(|m| dir.starts_with(m)) else {
                continue;
            };
            let mut level = Some(dir.as_path());
            while let Some(d) = level {
                // The mount (the root cgroup) carries no limits of its own.
                if d == mount.as_path() {
                    break;
                }
                out.push(d.to_path_buf());
                level = d.parent();
            }
        }
        out
    }

    /// The first limit found on `dirs` or their ancestors within their mounts, as
    /// `"<dir>/<file> = <value>"`; `None` when moving out of `dirs` escapes nothing.
    pub fn limit_on(&self, dirs: &[PathBuf]) -> Option<String> {
        self.first_limit(dirs, |_| true)
    }

    /// [`CgroupFs::limit_on`] without `pids.max`: the CPU and memory limits a process must not
    /// leave when the daemon makes a job group for it at its user's request (its task bound is
    /// carried onto the job's group instead: [`CgroupFs::pids_ceiling`]).
    pub fn cpu_or_memory_limit_on(&self, dirs: &[PathBuf]) -> Option<String> {
        self.first_limit(dirs, |file| file != "pids.max")
    }

    fn first_limit(&self, dirs: &[PathBuf], counts: impl Fn(&str) -> bool) -> Option<String> {
        for d in self.ancestry(dirs) {
            for (file, unlimited) in LIMIT_FILES.iter().filter(|(f, _)| counts(f)) {
                if let Ok(v) = fs::read_to_string(d.join(file)) {
                    let v = v.trim();
                    let quota = v.split_whitespace().next().unwrap_or("");
                    if quota != *unlimited {
                        return Some(format!("{}/{file} = {v}", d.display()));
                    }
                }
            }
            for (file, default) in [("cpu.weight", 100u64), ("cpu.shares", 1024)] {
                if let Some(w) = fs::read_to_string(d.join(file))
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    && w < default
                {
                    return Some(format!("{}/{file} = {w}", d.display()));
                }
            }
        }
        None
    }

    /// Move every process of `job` back to `origins` (one directory per hierarchy, as recorded
    /// by [`CgroupFs::process_dirs`]); an origin that is gone is replaced by its nearest existing
    /// ancestor, which still carries every limit the process was under. Returns how many moved.
    pub fn return_processes(&self, job: &JobCgroup, origins: &[PathBuf]) -> usize {
        let mut moved = 0;
        for pid in self.procs_anywhere(job) {
            let mut ok = true;
            for origin in origins {
                let mut target = origin.as_path();
                while !target.join("cgroup.procs").exists() {
                    match target.parent() {
                        Some(p) => target = p,
                        None => break,
                    }
                }
                if let Err(e) = write_file(&target.join("cgroup.procs"), &pid.to_string()) {
                    // A process that exits meanwhile is no problem.
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        warn!(job = %job, pid, to = %target.display(), error = %e, "cannot move a process back to its cgroup");
                    }
                    ok = false;
                }
            }
            moved += usize::from(ok);
        }
        if moved > 0 {
            info!(job = %job, processes = moved, "adopted processes moved back to their own cgroup");
        }
        moved
    }

    /// The processes in `job`'s group in any of its hierarchies: a child forked while its
    /// parent was being moved back, hierarchy by hierarchy, can be left in some only.
    pub fn procs_anywhere(&self, job: &JobCgroup) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .job_dirs(job)
            .iter()
            .flat_map(|d| read_procs(d))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Give an adopted job's processes back to `origins` and remove the governor's group;
    /// true once the group is gone. A job that forks while its processes are moved has
    /// children born in the group after its list was read: they are moved back in the next
    /// round, for up to [`RELEASE_ROUNDS`] rounds [`RELEASE_PAUSE`] apart (a shell loop that
    /// forks without pause left its group behind in about one stop of five with one round,
    /// `root_host_v1_a_forking_adopted_job_leaves_no_group_behind_when_the_daemon_stops`).
    /// False when processes kept appearing: the journal keeps the adoption, and the next start
    /// undoes it.
    pub fn release_adopted(&self, job: &JobCgroup, origins: Option<&[PathBuf]>) -> bool {
        for round in 0..RELEASE_ROUNDS {
            if let Some(origins) = origins {
                self.return_processes(job, origins);
            }
            if self.procs_anywhere(job).is_empty() && self.remove_job_group(job).is_ok() {
                return true;
            }
            if round + 1 < RELEASE_ROUNDS {
                std::thread::sleep(RELEASE_PAUSE);
            }
        }
        warn!(job = %job, rounds = RELEASE_ROUNDS, "processes kept appearing in an adopted job's group while they were moved back; the group is left to the next start");
        false
    }
}

/// Rounds of [`CgroupFs::release_adopted`].
pub const RELEASE_ROUNDS: u32 = 20;
/// Pause between them.
pub const RELEASE_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// One adoption: the governor's group and where its processes came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adoption {
    /// The governor's group (`/governor.slice/jobs/<name>`).
    pub group: String,
    /// Origin directories, one per hierarchy.
    pub origins: Vec<PathBuf>,
}

/// `<state file>.adopted`: the adoptions in force, rewritten atomically on each change
/// (adoptions are rare: a whole-file rewrite is simple and cheap enough).
#[derive(Debug)]
pub struct AdoptionJournal {
    path: PathBuf,
    entries: BTreeMap<String, Vec<PathBuf>>,
}

impl AdoptionJournal {
    /// The journal next to `state_file`, with what a previous run left in it.
    pub fn open(state_file: &Path) -> AdoptionJournal {
        let mut name = state_file.as_os_str().to_owned();
        name.push(".adopted");
        let path = PathBuf::from(name);
        durable::sweep_temporaries(&path);
        let entries = match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Vec<Adoption>>(&bytes) {
                Ok(list) => list.into_iter().map(|a| (a.group, a.origins)).collect(),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "adoption journal unreadable; ignored");
                    BTreeMap::new()
                }
            },
            Err(_) => BTreeMap::new(),
        };
        AdoptionJournal { path, entries }
    }

    /// Adoptions recorded (by this run or a previous one).
    pub fn entries(&self) -> Vec<Adoption> {
        self.entries
            .iter()
            .map(|(g, o)| Adoption {
                group: g.clone(),
                origins: o.clone(),
            })
            .collect()
    }

    /// Where the processes of `group` came from.
    pub fn origins(&self, group: &JobCgroup) -> Option<&[PathBuf]> {
        self.entries.get(&group.to_string()).map(Vec::as_slice)
    }

    /// Record an adoption (before the first process moves).
    pub fn record(&mut self, group: &JobCgroup, origins: Vec<PathBuf>) -> std::io::Result<()> {
        self.entries.insert(group.to_string(), origins);
        self.save()
    }

    /// Forget an adoption (after its processes went back or ended).
    pub fn forget(&mut self, group: &str) {
        if self.entries.remove(group).is_some()
            && let Err(e) = self.save()
        {
            warn!(path = %self.path.display(), error = %e, "cannot update the adoption journal");
        }
    }

    fn save(&self) -> std::io::Result<()> {
        if self.entries.is_empty() {
            return durable::remove_durably(&self.path);
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)?;
        }
        durable::write_durably(&self.path, &serde_json::to_vec_pretty(&self.entries())?)
    }
}

/// Pids in a cgroup directory (for the recovery of a previous run's adoptions).
pub fn procs_in(dir: &Path) -> Vec<u32> {
    read_procs(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::FakeCgroupRoot;
    use crate::cgroup::hierarchy::{Controller, Hierarchy};

    struct Bed {
        _dir: tempfile::TempDir,
        fake: FakeCgroupRoot,
        fs: CgroupFs,
        proc_root: PathBuf,
    }

    fn bed(hybrid: bool, lines: &str) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cgroup");
        let fake = if hybrid {
            FakeCgroupRoot::hybrid(&root)
        } else {
            FakeCgroupRoot::unified(&root)
        };
        let proc_root = dir.path().join("proc");
        fs::create_dir_all(proc_root.join("42")).unwrap();
        fs::write(proc_root.join("42/cgroup"), lines).unwrap();
        let mut fs = CgroupFs::new(Hierarchy::detect(&root).unwrap()).with_proc_root(&proc_root);
        if hybrid {
            fs.set_job_controllers(&[Controller::Cpu, Controller::CpuAcct]);
        }
        Bed {
            _dir: dir,
            fake,
            fs,
            proc_root,
        }
    }

    #[test]
    fn where_a_process_is_in_every_hierarchy_a_job_group_spans() {
        let b = bed(
            true,
            "4:cpu:/a\n3:cpuacct:/b\n2:memory:/m\n0::/user.slice/s\n",
        );
        let root = b.fake.root().to_owned();
        assert_eq!(
            b.fs.process_dirs(42).unwrap(),
            vec![
                root.join("cpu/a"),
                root.join("cpuacct/b"),
                root.join("unified/user.slice/s")
            ]
        );
        assert_eq!(b.fs.process_dirs(43), None, "gone");
        let _ = &b.proc_root;
    }

    #[test]
    fn no_move_out_of_a_cpu_memory_pids_or_weight_limit_here_or_above() {
        let b = bed(false, "0::/user.slice/user-1000.slice/session-1.scope\n");
        b.fake
            .add_group("user.slice/user-1000.slice/session-1.scope");
        let dirs = b.fs.process_dirs(42).unwrap();
        assert_eq!(b.fs.limit_on(&dirs), None, "a plain session scope");
        for (file, value) in [
            ("cpu.max", "50000 100000"),
            ("memory.max", "1073741824"),
            ("memory.high", "536870912"),
            ("pids.max", "100"),
            ("cpu.weight", "20"),
        ] {
            let before = b.fake.get("user.slice/user-1000.slice", file);
            b.fake.set("user.slice/user-1000.slice", file, value);
            let found = b.fs.limit_on(&dirs);
            assert!(
                found.as_deref().is_some_and(|f| f.contains(file)),
                "{file} = {value} on the user's slice must block the move: {found:?}"
            );
            b.fake.set("user.slice/user-1000.slice", file, &before);
        }
        // A higher weight is no limit.
        b.fake.set("user.slice", "cpu.weight", "500");
        assert_eq!(b.fs.limit_on(&dirs), None);
    }

    #[test]
    fn v1_quota_and_shares_are_limits_too() {
        let b = bed(true, "4:cpu:/batch/x\n3:cpuacct:/batch/x\n0::/\n");
        b.fake.add_group("batch/x");
        let dirs = b.fs.process_dirs(42).unwrap();
        assert_eq!(b.fs.limit_on(&dirs), None);
        b.fake
            .set_v1(Controller::Cpu, "batch", "cpu.cfs_quota_us", "50000");
        assert!(b.fs.limit_on(&dirs).unwrap().contains("cpu.cfs_quota_us"));
        b.fake
            .set_v1(Controller::Cpu, "batch", "cpu.cfs_quota_us", "-1");
        b.fake.set_v1(Controller::Cpu, "batch", "cpu.shares", "256");
        assert!(b.fs.limit_on(&dirs).unwrap().contains("cpu.shares"));
    }

    #[test]
    fn processes_go_back_to_their_origin_or_its_nearest_ancestor() {
        let b = bed(false, "0::/user.slice/s\n");
        b.fake.add_group("user.slice/s");
        b.fake.add_group("governor.slice/jobs/train-42");
        let job = JobCgroup::new("governor.slice/jobs/train-42").unwrap();
        b.fake
            .set("governor.slice/jobs/train-42", "cgroup.procs", "42\n43\n");
        let origins = vec![b.fake.root().join("user.slice/s")];
        assert_eq!(b.fs.return_processes(&job, &origins), 2);
        // The fake keeps the last write.
        assert_eq!(b.fake.get("user.slice/s", "cgroup.procs"), "43");
        b.fake.remove_group("user.slice/s");
        assert_eq!(b.fs.return_processes(&job, &origins), 2);
        assert_eq!(b.fake.get("user.slice", "cgroup.procs"), "43");
    }

    #[test]
    fn a_process_left_in_one_hierarchy_only_is_still_found_and_moved_back() {
        // A child forked while its parent was moved back hierarchy by hierarchy: in the
        // governor's cpuacct group, no longer in its cpu group.
        let b = bed(true, "4:cpu:/a\n3:cpuacct:/a\n0::/\n");
        b.fake.add_group("a");
        b.fake.add_group("governor.slice/jobs/train-42");
        let job = JobCgroup::new("governor.slice/jobs/train-42").unwrap();
        b.fake.set_v1(
            Controller::CpuAcct,
            "governor.slice/jobs/train-42",
            "cgroup.procs",
            "77\n",
        );
        assert_eq!(
            b.fs.procs(&job),
            Vec::<u32>::new(),
            "not in the first hierarchy"
        );
        assert_eq!(b.fs.procs_anywhere(&job), vec![77]);
        let origins = b.fs.process_dirs(42).unwrap();
        assert_eq!(b.fs.return_processes(&job, &origins), 1);
        assert_eq!(
            b.fake.get_v1(Controller::CpuAcct, "a", "cgroup.procs"),
            "77"
        );
    }

    #[test]
    fn the_journal_survives_a_restart_and_disappears_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("run/state.json");
        let group = JobCgroup::new("governor.slice/jobs/a-1").unwrap();
        let mut j = AdoptionJournal::open(&state);
        assert!(j.entries().is_empty());
        j.record(&group, vec![PathBuf::from("/sys/fs/cgroup/user.slice")])
            .unwrap();
        let again = AdoptionJournal::open(&state);
        assert_eq!(
            again.origins(&group),
            Some(&[PathBuf::from("/sys/fs/cgroup/user.slice")][..])
        );
        j.forget(&group.to_string());
        assert!(!dir.path().join("run/state.json.adopted").exists());
        // A corrupt journal is reported and ignored, never fatal.
        fs::write(dir.path().join("run/state.json.adopted"), "\0garbage").unwrap();
        assert!(AdoptionJournal::open(&state).entries().is_empty());
    }
}
