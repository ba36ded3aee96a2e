//! Turning processes into jobs: which processes carry `GOVERNOR_LOG`, which cgroup each job is,
//! and whether that cgroup belongs to the job alone.
//!
//! A job is a cgroup. A process found through its environment is governed through the cgroup it
//! lives in when that cgroup holds only the job's process tree (a container, a pod, a systemd
//! service). When the cgroup is shared with unrelated processes (a login session scope, the
//! root cgroup), limiting it would limit them too, so the job's process tree is moved into a
//! cgroup of its own under the governor's subtree instead ("adoption"); see [`Placement`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::procfs::{CgroupLine, JobEnvironment, ProcFs};

/// A process whose environment marks it as (part of) a training job.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvProcess {
    pub pid: u32,
    pub cgroup: String,
    pub env: JobEnvironment,
}

/// Check one process (after an exec event, or during a full scan).
pub fn env_process(proc: &ProcFs, pid: u32, line: CgroupLine<'_>) -> Option<EnvProcess> {
    let env = proc.job_environment(pid)?;
    let cgroup = proc.cgroup(pid, line)?;
    Some(EnvProcess { pid, cgroup, env })
}

/// Every process with `GOVERNOR_LOG`, grouped by cgroup.
pub fn scan(proc: &ProcFs, line: CgroupLine<'_>) -> BTreeMap<String, Vec<EnvProcess>> {
    let mut by_cgroup: BTreeMap<String, Vec<EnvProcess>> = BTreeMap::new();
    for pid in proc.pids() {
        if let Some(p) = env_process(proc, pid, line) {
            by_cgroup.entry(p.cgroup.clone()).or_default().push(p);
        }
    }
    by_cgroup
}

/// The processes of a job: the topmost processes carrying `GOVERNOR_LOG` in a cgroup (a
/// launcher and the python it starts both inherit the variable; the launcher is the job's root).
pub fn job_roots(proc: &ProcFs, members: &[EnvProcess]) -> Vec<u32> {
    let pids: BTreeSet<u32> = members.iter().map(|p| p.pid).collect();
    pids.iter()
        .copied()
        .filter(|&pid| !ancestors(proc, pid).iter().any(|a| pids.contains(a)))
        .collect()
}

/// Parent, grandparent, ... of `pid` (bounded; stops at init).
pub fn ancestors(proc: &ProcFs, pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut cur = pid;
    // Bounded walk: a pid cycle in a fake or racing /proc must not loop forever.
    for _ in 0..64 {
        match proc.parent(cur) {
            Some(p) if p > 1 && p != cur => {
                out.push(p);
                cur = p;
            }
            _ => break,
        }
    }
    out
}

/// Where a discovered job is governed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The cgroup holds only the job's processes: govern it where it is.
    InPlace,
    /// The cgroup is shared (or is the root cgroup, which has no cpu.max): move these processes
    /// (the job's roots and their descendants) into a cgroup of their own.
    Adopt { pids: Vec<u32> },
}

/// Decide [`Placement`] from the cgroup's member processes (`cgroup.procs`).
pub fn placement(proc: &ProcFs, cgroup: &str, roots: &[u32], members: &[u32]) -> Placement {
    let parent_of: HashMap<u32, u32> = members
        .iter()
        .filter_map(|&p| Some((p, proc.parent(p)?)))
        .collect();
    let root_set: BTreeSet<u32> = roots.iter().copied().collect();
    let in_job = |pid: u32| -> bool {
        let mut cur = pid;
        for _ in 0..64 {
            if root_set.contains(&cur) {
                return true;
            }
            match parent_of.get(&cur).copied().or_else(|| proc.parent(cur)) {
                Some(p) if p > 1 && p != cur => cur = p,
                _ => return false,
            }
        }
        false
    };
    let job_pids: Vec<u32> = members.iter().copied().filter(|&p| in_job(p)).collect();
    let foreign = members
        .iter()
        .any(|&p| !in_job(p) && !proc.is_kernel_thread(p));
    if cgroup == "/" || foreign {
        Placement::Adopt { pids: job_pids }
    } else {
        Placement::InPlace
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// pid, ppid, environ, cgroup
    fn fake(procs: &[(u32, u32, &str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (pid, ppid, env, cg) in procs {
            let dir = d.path().join(pid.to_string());
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("environ"), env.replace(';', "\0")).unwrap();
            fs::write(dir.join("cgroup"), format!("0::{cg}\n")).unwrap();
            fs::write(dir.join("stat"), format!("{pid} (p) S {ppid} 0")).unwrap();
        }
        d
    }

    #[test]
    fn scan_groups_job_processes_by_cgroup_and_finds_roots() {
        let d = fake(&[
            (10, 1, "GOVERNOR_LOG=/l/a.csv;", "/system.slice/a.service"),
            (
                11,
                10,
                "GOVERNOR_LOG=/l/a.csv;GOVERNOR_JOB=a;",
                "/system.slice/a.service",
            ),
            (20, 1, "HOME=/root;", "/user.slice"),
            (30, 1, "GOVERNOR_LOG=/l/b.log;", "/"),
        ]);
        let proc = ProcFs::at(d.path());
        let jobs = scan(&proc, CgroupLine::Unified);
        assert_eq!(
            jobs.keys().collect::<Vec<_>>(),
            vec!["/", "/system.slice/a.service"]
        );
        assert_eq!(job_roots(&proc, &jobs["/system.slice/a.service"]), vec![10]);
    }

    #[test]
    fn placement_in_place_for_a_dedicated_cgroup() {
        let d = fake(&[
            (10, 1, "GOVERNOR_LOG=/x;", "/c"),
            (11, 10, "", "/c"),
            (12, 11, "", "/c"),
        ]);
        let proc = ProcFs::at(d.path());
        assert_eq!(
            placement(&proc, "/c", &[10], &[10, 11, 12]),
            Placement::InPlace
        );
    }

    #[test]
    fn placement_adopts_from_shared_or_root_cgroups() {
        let d = fake(&[
            (5, 1, "", "/session"),
            (10, 5, "GOVERNOR_LOG=/x;", "/session"),
            (11, 10, "", "/session"),
            (40, 1, "", "/session"),
        ]);
        let proc = ProcFs::at(d.path());
        // The shell (5) and an unrelated process (40) share the session scope: move 10 and 11 only.
        assert_eq!(
            placement(&proc, "/session", &[10], &[5, 10, 11, 40]),
            Placement::Adopt { pids: vec![10, 11] }
        );
        // The root cgroup cannot be limited at all.
        assert_eq!(
            placement(&proc, "/", &[10], &[10, 11]),
            Placement::Adopt { pids: vec![10, 11] }
        );
    }

    #[test]
    fn parent_cycles_in_a_racing_proc_do_not_hang() {
        let d = fake(&[
            (10, 11, "GOVERNOR_LOG=/x;", "/c"),
            (11, 10, "GOVERNOR_LOG=/x;", "/c"),
        ]);
        let proc = ProcFs::at(d.path());
        let members = scan(&proc, CgroupLine::Unified);
        let _ = job_roots(&proc, &members["/c"]);
        let _ = placement(&proc, "/c", &[], &[10, 11]);
    }
}
