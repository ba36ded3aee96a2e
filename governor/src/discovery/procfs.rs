//! Reading `/proc` for discovery: environments, cgroup membership, parent pids, and paths seen
//! from inside a process's mount namespace. The root is injectable so tests use a fake `/proc`.

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Largest environment block read from `/proc/<pid>/environ` (the kernel's ARG_MAX is 2 MiB;
/// GOVERNOR_* variables in a bigger block would be an attack or a bug, not a training job).
const MAX_ENVIRON_BYTES: u64 = 1 << 20;

use governor_proto::job_env;
/// Environment variables that mark a process as a training job.
pub use governor_proto::job_env::{JOB as ENV_JOB, LOG as ENV_LOG, METRIC as ENV_METRIC};

/// What a job's environment says about it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobEnvironment {
    /// `GOVERNOR_LOG`: one or more log paths or globs, separated by `:`.
    pub logs: Vec<String>,
    pub metric: Option<String>,
    pub job: Option<String>,
    /// `GOVERNOR_EPOCHS`: total epochs of the run (a positive number; anything else ignored).
    pub epochs: Option<f64>,
    /// `GOVERNOR_FINISH`: end the job at convergence (a malformed rule is ignored).
    pub finish: Option<governor_policy::quality::FinishRule>,
    /// `GOVERNOR_SWEEP`: a trial of a sweep (a malformed declaration is ignored).
    pub sweep: Option<governor_policy::sweep::SweepTrial>,
}

/// Parse a NUL-separated environment block for the GOVERNOR_* variables.
pub fn parse_environ(block: &[u8]) -> Option<JobEnvironment> {
    let mut env = JobEnvironment {
        logs: Vec::new(),
        metric: None,
        job: None,
        epochs: None,
        finish: None,
        sweep: None,
    };
    let mut found = false;
    for entry in block.split(|&b| b == 0) {
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (key, value) = (&entry[..eq], &entry[eq + 1..]);
        // Values must be valid UTF-8; anything else is ignored rather than guessed at.
        let Ok(value) = std::str::from_utf8(value) else {
            continue;
        };
        let value = value.trim();
        match key {
            k if k == job_env::LOG.as_bytes() && !value.is_empty() => {
                env.logs = value
                    .split(':')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                found = !env.logs.is_empty();
            }
            k if k == job_env::METRIC.as_bytes() && !value.is_empty() => {
                env.metric = Some(value.to_owned())
            }
            k if k == job_env::JOB.as_bytes() && !value.is_empty() => {
                env.job = Some(value.to_owned())
            }
            k if k == job_env::EPOCHS.as_bytes() => {
                env.epochs = job_env::parse_epochs(value).ok();
            }
            k if k == job_env::FINISH.as_bytes() => {
                env.finish = job_env::parse_finish(value).ok();
            }
            k if k == job_env::SWEEP.as_bytes() => {
                env.sweep = job_env::parse_sweep(value).ok();
            }
            _ => {}
        }
    }
    found.then_some(env)
}

/// Who a process runs as: what the daemon checks before acting for it, and the rights it
/// reads the process's log files with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// Real user id.
    pub uid: u32,
    /// Real group id.
    pub gid: u32,
    /// Supplementary groups (without `gid`).
    pub groups: Vec<u32>,
}

impl Credentials {
    /// Root's credentials (paths the operator configured are read with these).
    pub const ROOT: Credentials = Credentials {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    };

    /// Whether the process holds group `gid` (as its primary or a supplementary group).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// The watcher's owner with these rights (the files of a job are read with them).
    pub fn file_owner(&self) -> crate::watch::FileOwner {
        crate::watch::FileOwner {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Which line of `/proc/<pid>/cgroup` names the group to govern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupLine<'a> {
    /// cgroup v2: the `0::<path>` line.
    Unified,
    /// cgroup v1: the hierarchy whose controller list contains this controller (e.g. `cpu`).
    Controller(&'a str),
}

/// Parse `/proc/<pid>/cgroup` content and return the path for `which`.
pub fn parse_cgroup_file(content: &str, which: CgroupLine<'_>) -> Option<String> {
    for line in content.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = match which {
            CgroupLine::Unified => id == "0" && controllers.is_empty(),
            CgroupLine::Controller(c) => controllers.split(',').any(|x| x == c),
        };
        if matches {
            // A group removed under a live process reads "/path (deleted)".
            return Some(path.strip_suffix(" (deleted)").unwrap_or(path).to_owned());
        }
    }
    None
}

/// Access to a `/proc` tree.
#[derive(Clone, Debug)]
pub struct ProcFs {
    root: PathBuf,
}

impl Default for ProcFs {
    fn default() -> Self {
        ProcFs {
            root: PathBuf::from("/proc"),
        }
    }
}

impl ProcFs {
    /// A `/proc` at another place (tests).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        ProcFs { root: root.into() }
    }

    /// The root this reads from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// All numeric entries (processes).
    pub fn pids(&self) -> Vec<u32> {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut pids: Vec<u32> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort_unstable();
        pids
    }

    /// The GOVERNOR_* variables of a process, if it has GOVERNOR_LOG. Processes that vanished
    /// or deny access yield `None`.
    pub fn job_environment(&self, pid: u32) -> Option<JobEnvironment> {
        let file = fs::File::open(self.root.join(pid.to_string()).join("environ")).ok()?;
        let mut block = Vec::new();
        file.take(MAX_ENVIRON_BYTES).read_to_end(&mut block).ok()?;
        parse_environ(&block)
    }

    /// The cgroup path of a process (relative to the cgroup root).
    pub fn cgroup(&self, pid: u32, which: CgroupLine<'_>) -> Option<String> {
        let content = fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")).ok()?;
        parse_cgroup_file(&content, which)
    }

    /// Parent pid from `/proc/<pid>/stat`.
    pub fn parent(&self, pid: u32) -> Option<u32> {
        let stat = fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 1..];
        after.split_whitespace().nth(1)?.parse().ok()
    }

    /// Whether a process still runs: it exists and is neither a zombie nor dead. An exited
    /// process's `/proc/<pid>/cgroup` no longer names the group it ran in (the kernel shows the
    /// root), so discovery must not act on what it reads there.
    pub fn is_live(&self, pid: u32) -> bool {
        let Ok(stat) = fs::read_to_string(self.root.join(pid.to_string()).join("stat")) else {
            return false;
        };
        let Some(close) = stat.rfind(')') else {
            return false;
        };
        !matches!(
            stat[close + 1..].split_whitespace().next(),
            Some("Z" | "X" | "x") | None
        )
    }

    /// The owner of a process: its real uid and every group it holds (real gid and the
    /// supplementary groups), from `/proc/<pid>/status`.
    pub fn credentials(&self, pid: u32) -> Option<Credentials> {
        let status = fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        let field = |name: &str| -> Option<Vec<u32>> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            Some(
                line[name.len()..]
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect(),
            )
        };
        let uid = *field("Uid:")?.first()?;
        let gid = *field("Gid:")?.first()?;
        let mut groups = field("Groups:").unwrap_or_default();
        groups.retain(|&g| g != gid);
        Some(Credentials { uid, gid, groups })
    }

    /// Whether a process is a kernel thread (kthreadd's children have no memory map and ppid 2).
    pub fn is_kernel_thread(&self, pid: u32) -> bool {
        pid == 2 || self.parent(pid) == Some(2)
    }

    /// Turn a path as a process sees it into a path the daemon can open.
    ///
    /// Relative paths are taken from the process's working directory. A process in another mount
    /// namespace (a container) sees its own root: its paths are reached through
    /// `/proc/<pid>/root`, which the kernel resolves inside that namespace.
    pub fn host_path(&self, pid: u32, path: &str) -> PathBuf {
        let proc_dir = self.root.join(pid.to_string());
        let absolute = if path.starts_with('/') {
            PathBuf::from(path)
        } else {
            let cwd = fs::read_link(proc_dir.join("cwd")).unwrap_or_else(|_| PathBuf::from("/"));
            cwd.join(path)
        };
        if self.same_mount_namespace(pid) {
            return absolute;
        }
        let inside = absolute.strip_prefix("/").unwrap_or(&absolute).to_owned();
        proc_dir.join("root").join(inside)
    }

    /// Whether `pid` shares the daemon's mount namespace.
    pub fn same_mount_namespace(&self, pid: u32) -> bool {
        let theirs = fs::read_link(self.root.join(pid.to_string()).join("ns/mnt"));
        let ours = fs::read_link(self.root.join("self/ns/mnt"));
        match (theirs, ours) {
            (Ok(a), Ok(b)) => a == b,
            // Without namespace links (old kernels, fake roots) compare the root links.
            _ => fs::read_link(self.root.join(pid.to_string()).join("root"))
                .map(|r| r == Path::new("/"))
                .unwrap_or(true),
        }
    }

    /// The command name (`comm`) of a process, for messages.
    pub fn comm(&self, pid: u32) -> Option<String> {
        let c = fs::read(self.root.join(pid.to_string()).join("comm")).ok()?;
        Some(
            String::from_utf8_lossy(OsStr::from_bytes(&c).as_bytes())
                .trim()
                .to_owned(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_parsing() {
        let block = b"PATH=/bin\0GOVERNOR_LOG=/runs/a/metrics.csv:/runs/a/log.txt\0GOVERNOR_METRIC=val_loss\0GOVERNOR_JOB=bert\0";
        let env = parse_environ(block).unwrap();
        assert_eq!(env.logs, vec!["/runs/a/metrics.csv", "/runs/a/log.txt"]);
        assert_eq!(env.metric.as_deref(), Some("val_loss"));
        assert_eq!(env.job.as_deref(), Some("bert"));
        assert_eq!(parse_environ(b"PATH=/bin\0HOME=/root\0"), None);
        assert_eq!(
            parse_environ(b"GOVERNOR_LOG=\0"),
            None,
            "empty GOVERNOR_LOG is not a job"
        );
        assert_eq!(
            parse_environ(b"GOVERNOR_LOG=/a\xff\xfe\0"),
            None,
            "non-UTF-8 value ignored"
        );
        assert_eq!(parse_environ(b"\0\0=\0GOVERNOR_LOG\0garbage"), None);
        assert!(
            parse_environ(b"GOVERNOR_LOG=/x").is_some(),
            "no trailing NUL"
        );
    }

    #[test]
    fn environ_epochs_must_be_a_positive_number() {
        let env = parse_environ(b"GOVERNOR_LOG=/l\0GOVERNOR_EPOCHS=12\0").unwrap();
        assert_eq!(env.epochs, Some(12.0));
        for bad in ["0", "-3", "NaN", "ten", ""] {
            let block = format!("GOVERNOR_LOG=/l\0GOVERNOR_EPOCHS={bad}\0");
            assert_eq!(
                parse_environ(block.as_bytes()).unwrap().epochs,
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn cgroup_file_parsing() {
        let hybrid = "12:memory:/user.slice\n4:cpu,cpuacct:/user.slice/x\n1:name=systemd:/user.slice\n0::/user.slice/user-0.slice\n";
        assert_eq!(
            parse_cgroup_file(hybrid, CgroupLine::Unified).as_deref(),
            Some("/user.slice/user-0.slice")
        );
        assert_eq!(
            parse_cgroup_file(hybrid, CgroupLine::Controller("cpu")).as_deref(),
            Some("/user.slice/x")
        );
        assert_eq!(
            parse_cgroup_file(hybrid, CgroupLine::Controller("cpuset")),
            None
        );
        assert_eq!(
            parse_cgroup_file("0::/jobs/a (deleted)\n", CgroupLine::Unified).as_deref(),
            Some("/jobs/a")
        );
        assert_eq!(parse_cgroup_file("garbage", CgroupLine::Unified), None);
    }

    fn fake_proc() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        for (pid, ppid, env, cgroup) in [
            (
                100u32,
                1u32,
                &b"GOVERNOR_LOG=out/log.csv\0"[..],
                "0::/system.slice/train.service\n",
            ),
            (101, 100, b"A=b\0", "0::/system.slice/train.service\n"),
            (200, 2, b"", "0::/\n"),
        ] {
            let dir = p.join(pid.to_string());
            fs::create_dir_all(dir.join("ns")).unwrap();
            fs::write(dir.join("environ"), env).unwrap();
            fs::write(dir.join("cgroup"), cgroup).unwrap();
            fs::write(dir.join("stat"), format!("{pid} (py thon) S {ppid} 1 1 0")).unwrap();
            std::os::unix::fs::symlink("/work", dir.join("cwd")).unwrap();
        }
        fs::create_dir_all(p.join("self/ns")).unwrap();
        std::os::unix::fs::symlink("mnt:[4026531841]", p.join("self/ns/mnt")).unwrap();
        std::os::unix::fs::symlink("mnt:[4026531841]", p.join("100/ns/mnt")).unwrap();
        std::os::unix::fs::symlink("mnt:[4026532999]", p.join("101/ns/mnt")).unwrap();
        d
    }

    #[test]
    fn exited_processes_are_not_live_and_owners_are_read_from_status() {
        let d = fake_proc();
        let p = d.path();
        fs::write(p.join("101/stat"), "101 (sleep) Z 100 1 1 0").unwrap();
        fs::write(
            p.join("100/status"),
            "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nGroups:\t27 1000 990 \n",
        )
        .unwrap();
        let proc = ProcFs::at(p);
        assert!(proc.is_live(100));
        assert!(!proc.is_live(101), "a zombie's cgroup line is meaningless");
        assert!(!proc.is_live(999));
        let who = proc.credentials(100).unwrap();
        assert_eq!(
            who,
            Credentials {
                uid: 1000,
                gid: 1000,
                groups: vec![27, 990]
            }
        );
        assert!(who.in_group(990) && who.in_group(1000) && !who.in_group(0));
        assert_eq!(proc.credentials(101), None, "no status file");
    }

    #[test]
    fn fake_proc_reading() {
        let d = fake_proc();
        let proc = ProcFs::at(d.path());
        assert_eq!(proc.pids(), vec![100, 101, 200]);
        assert_eq!(proc.job_environment(100).unwrap().logs, vec!["out/log.csv"]);
        assert_eq!(proc.job_environment(101), None);
        assert_eq!(proc.job_environment(999), None, "vanished process");
        assert_eq!(
            proc.cgroup(100, CgroupLine::Unified).as_deref(),
            Some("/system.slice/train.service")
        );
        assert_eq!(proc.parent(101), Some(100));
        assert!(proc.is_kernel_thread(200));
        assert!(!proc.is_kernel_thread(100));
        // Same namespace: relative paths resolve against the working directory.
        assert_eq!(
            proc.host_path(100, "out/log.csv"),
            PathBuf::from("/work/out/log.csv")
        );
        // Another namespace: through /proc/<pid>/root.
        assert_eq!(
            proc.host_path(101, "/data/log.csv"),
            d.path().join("101/root/data/log.csv")
        );
        assert_eq!(
            proc.host_path(101, "log.csv"),
            d.path().join("101/root/work/log.csv")
        );
    }
}
