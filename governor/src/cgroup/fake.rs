//! A fake cgroup root for unit tests, integration tests and benchmarks: a directory tree laid out
//! like cgroupfs (unified, hybrid or legacy) with the files a fresh kernel cgroup has. Writes are
//! plain file writes; [`FakeCgroupRoot::kernel_write`] simulates a write made by someone else
//! through the kernel (kubelet, `docker update`), including the kernel's normalisation of the
//! value, which is what drift detection must see through.
//!
//! Never used against the real `/sys/fs/cgroup`: it creates regular files.

use std::path::{Path, PathBuf};

use super::hierarchy::{Controller, HierarchyKind};
use super::knob::{Knob, page_size, parse_cpu_max};

const V2_GROUP_FILES: &[(&str, &str)] = &[
    ("cgroup.procs", ""),
    ("cgroup.controllers", "cpu memory pids\n"),
    ("cgroup.subtree_control", "\n"),
    ("cgroup.events", "populated 0\nfrozen 0\n"),
    ("cpu.weight", "100\n"),
    ("cpu.max", "max 100000\n"),
    (
        "cpu.stat",
        "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
    ),
    ("memory.current", "0\n"),
    ("memory.low", "0\n"),
    ("memory.high", "max\n"),
    ("memory.max", "max\n"),
    (
        "memory.events",
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    ),
    ("memory.stat", "anon 0\nfile 0\nkernel 0\n"),
    ("pids.current", "0\n"),
    ("pids.max", "max\n"),
];

const V1_UNLIMITED: &str = "9223372036854771712\n";

fn v1_group_files(controller: Controller) -> &'static [(&'static str, &'static str)] {
    match controller {
        Controller::Cpu => &[
            ("cgroup.procs", ""),
            ("tasks", ""),
            ("cpu.shares", "1024\n"),
            ("cpu.cfs_quota_us", "-1\n"),
            ("cpu.cfs_period_us", "100000\n"),
            (
                "cpu.stat",
                "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
            ),
        ],
        Controller::CpuAcct => &[
            ("cgroup.procs", ""),
            ("tasks", ""),
            ("cpuacct.usage", "0\n"),
        ],
        Controller::Memory => &[
            ("cgroup.procs", ""),
            ("tasks", ""),
            ("memory.limit_in_bytes", V1_UNLIMITED),
            ("memory.soft_limit_in_bytes", V1_UNLIMITED),
            ("memory.usage_in_bytes", "0\n"),
            ("memory.failcnt", "0\n"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
            ),
            ("memory.stat", "cache 0\nrss 0\n"),
        ],
        Controller::Pids => &[
            ("cgroup.procs", ""),
            ("tasks", ""),
            ("pids.max", "max\n"),
            ("pids.current", "0\n"),
        ],
    }
}

/// A fake cgroup root in a directory the caller owns (typically a `tempfile::TempDir`).
#[derive(Clone, Debug)]
pub struct FakeCgroupRoot {
    root: PathBuf,
    kind: HierarchyKind,
}

impl FakeCgroupRoot {
    /// A cgroup v2 root: `cgroup.controllers` at the top.
    pub fn unified(root: &Path) -> FakeCgroupRoot {
        let fake = FakeCgroupRoot {
            root: root.to_owned(),
            kind: HierarchyKind::Unified,
        };
        fake.write_files(
            root,
            &[
                ("cgroup.controllers", "cpuset cpu io memory hugetlb pids\n"),
                ("cgroup.subtree_control", "cpu memory pids\n"),
                ("cgroup.procs", ""),
            ],
        );
        fake
    }

    /// A hybrid root: v1 `cpu`, `cpuacct`, `memory`, `pids` mounts and a controller-less
    /// `unified` v2 tree, like this project's development hosts.
    pub fn hybrid(root: &Path) -> FakeCgroupRoot {
        let fake = FakeCgroupRoot {
            root: root.to_owned(),
            kind: HierarchyKind::Hybrid,
        };
        for c in ["cpu", "cpuacct", "memory", "pids"] {
            fake.write_files(&root.join(c), &[("cgroup.procs", "")]);
        }
        fake.write_files(
            &root.join("unified"),
            &[("cgroup.controllers", "hugetlb\n"), ("cgroup.procs", "")],
        );
        fake
    }

    /// A pure v1 root with `cpu` and `cpuacct` co-mounted at `cpu,cpuacct` and the usual
    /// `cpu`/`cpuacct` symlinks, plus `memory` and `pids`.
    pub fn legacy(root: &Path) -> FakeCgroupRoot {
        let fake = FakeCgroupRoot {
            root: root.to_owned(),
            kind: HierarchyKind::Legacy,
        };
        fake.write_files(&root.join("cpu,cpuacct"), &[("cgroup.procs", "")]);
        for link in ["cpu", "cpuacct"] {
            std::os::unix::fs::symlink("cpu,cpuacct", root.join(link))
                .unwrap_or_else(|e| panic!("cannot create fake symlink {link}: {e}"));
        }
        for c in ["memory", "pids"] {
            fake.write_files(&root.join(c), &[("cgroup.procs", "")]);
        }
        fake
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The fake's layout.
    pub fn kind(&self) -> HierarchyKind {
        self.kind
    }

    fn write_files(&self, dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create fake cgroup dir {}: {e}", dir.display()));
        for (name, content) in files {
            let p = dir.join(name);
            std::fs::write(&p, content)
                .unwrap_or_else(|e| panic!("cannot write fake {}: {e}", p.display()));
        }
    }

    fn v1_mount(&self, controller: Controller) -> PathBuf {
        self.root.join(controller.name())
    }

    /// The directory of `rel` for `controller` (the v2 directory on a unified root).
    pub fn dir(&self, controller: Controller, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        match self.kind {
            HierarchyKind::Unified => self.root.join(rel),
            _ => self.v1_mount(controller).join(rel),
        }
    }

    /// Create the group `rel` (and its missing ancestors) with a fresh cgroup's files in every
    /// hierarchy; returns its directory (v2) or its `cpu` directory (v1).
    pub fn add_group(&self, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        let mut prefix = PathBuf::new();
        for part in Path::new(rel).components() {
            prefix.push(part);
            let prefix = prefix.to_string_lossy().into_owned();
            match self.kind {
                HierarchyKind::Unified => {
                    let dir = self.root.join(&prefix);
                    if !dir.exists() {
                        self.write_files(&dir, V2_GROUP_FILES);
                    }
                }
                HierarchyKind::Hybrid | HierarchyKind::Legacy => {
                    for c in [
                        Controller::Cpu,
                        Controller::CpuAcct,
                        Controller::Memory,
                        Controller::Pids,
                    ] {
                        let dir = self.v1_mount(c).join(&prefix);
                        // Co-mounted controllers share a directory: add the files of each.
                        self.write_files(&dir, v1_group_files(c));
                    }
                    if self.kind == HierarchyKind::Hybrid {
                        let dir = self.root.join("unified").join(&prefix);
                        if !dir.exists() {
                            self.write_files(&dir, &[("cgroup.procs", ""), ("cgroup.events", "")]);
                        }
                    }
                }
            }
        }
        self.dir(Controller::Cpu, rel)
    }

    /// Remove the group `rel` from every hierarchy, as if its container went away.
    pub fn remove_group(&self, rel: &str) {
        let rel = rel.trim_start_matches('/');
        let dirs: Vec<PathBuf> = match self.kind {
            HierarchyKind::Unified => vec![self.root.join(rel)],
            _ => {
                let mut d: Vec<PathBuf> = ["cpu,cpuacct", "cpu", "cpuacct", "memory", "pids"]
                    .iter()
                    .map(|m| self.root.join(m))
                    .filter(|m| m.is_dir() && !m.is_symlink())
                    .map(|m| m.join(rel))
                    .collect();
                d.push(self.root.join("unified").join(rel));
                d
            }
        };
        for d in dirs {
            if d.exists() {
                std::fs::remove_dir_all(&d)
                    .unwrap_or_else(|e| panic!("cannot remove fake group {}: {e}", d.display()));
            }
        }
    }

    /// Overwrite a v2 file (or the `cpu` controller's file on v1) verbatim.
    pub fn set(&self, rel: &str, file: &str, value: &str) {
        self.set_v1(controller_of(file), rel, file, value)
    }

    /// Overwrite `file` of `controller` verbatim.
    pub fn set_v1(&self, controller: Controller, rel: &str, file: &str, value: &str) {
        let p = self.dir(controller, rel).join(file);
        std::fs::write(&p, value)
            .unwrap_or_else(|e| panic!("cannot write fake {}: {e}", p.display()));
    }

    /// The content of `file` of `controller`.
    pub fn get_v1(&self, controller: Controller, rel: &str, file: &str) -> String {
        let p = self.dir(controller, rel).join(file);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("cannot read fake {}: {e}", p.display()))
    }

    /// The content of a file (controller from the file name's prefix).
    pub fn get(&self, rel: &str, file: &str) -> String {
        let p = self.dir(controller_of(file), rel).join(file);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("cannot read fake {}: {e}", p.display()))
    }

    /// Write `value` to `file` the way the kernel would store it if another program wrote it:
    /// `cpu.max` keeps its period when only a quota is given, memory limits are stored in pages
    /// and v1 spells unlimited as a huge number, v1 quotas are -1 when negative, shares clamp.
    pub fn kernel_write(&self, rel: &str, file: &str, value: &str) {
        let page = page_size();
        let v = value.trim();
        let stored = match file {
            "cpu.max" => {
                let current = self.get(rel, "cpu.max");
                let period = parse_cpu_max(&current)
                    .and_then(|(_, p)| p)
                    .unwrap_or(100_000);
                match parse_cpu_max(v) {
                    Some((q, p)) => {
                        let q = q.map_or("max".to_owned(), |q| q.to_string());
                        format!("{q} {}", p.unwrap_or(period))
                    }
                    None => panic!("the kernel rejects cpu.max {v:?} (EINVAL)"),
                }
            }
            "memory.high" | "memory.max" => match v {
                "max" => "max".to_owned(),
                n => (n.parse::<u64>().expect("memory limit") / page * page).to_string(),
            },
            "memory.limit_in_bytes" | "memory.soft_limit_in_bytes" => match v.parse::<i64>() {
                Ok(n) if n < 0 => V1_UNLIMITED.trim().to_owned(),
                Ok(n) => (n as u64 / page * page).to_string(),
                Err(_) => panic!("the kernel rejects {file} {v:?} (EINVAL)"),
            },
            "cpu.cfs_quota_us" => match v.parse::<i64>() {
                Ok(n) if n < 0 => "-1".to_owned(),
                Ok(n) => n.to_string(),
                Err(_) => panic!("the kernel rejects cpu.cfs_quota_us {v:?} (EINVAL)"),
            },
            "cpu.shares" => v
                .parse::<u64>()
                .expect("cpu.shares")
                .clamp(2, 262_144)
                .to_string(),
            _ => v.to_owned(),
        };
        self.set(rel, file, &format!("{stored}\n"));
    }

    /// The content of `knob`'s file of `rel`, trimmed.
    pub fn knob(&self, rel: &str, knob: Knob) -> String {
        self.get(rel, knob.file_name()).trim().to_owned()
    }
}

/// The controller a file belongs to, from its name.
fn controller_of(file: &str) -> Controller {
    if file.starts_with("memory.") {
        Controller::Memory
    } else if file.starts_with("cpuacct.") {
        Controller::CpuAcct
    } else if file.starts_with("pids.") {
        Controller::Pids
    } else {
        Controller::Cpu
    }
}
