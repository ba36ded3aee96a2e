//! Where the cgroup hierarchies are and how a job's cgroup maps onto them.
//!
//! Three layouts exist in the wild and are told apart by files alone, so a test can lay any of
//! them out in a temporary directory:
//! - **unified** (cgroup v2 only): `<root>/cgroup.controllers` exists. Every controller lives in
//!   one tree; a job is `<root>/<job>`.
//! - **hybrid** (systemd's default before v2 became the default, and this project's development
//!   hosts): v1 controllers mounted at `<root>/<controller>` (possibly co-mounted, e.g.
//!   `cpu,cpuacct`, with `cpu` a symlink) plus a v2 tree at `<root>/unified` that holds no
//!   resource controller we use. Actuation goes through the v1 controllers.
//! - **legacy** (pure v1): only the v1 controller mounts.
//!
//! A job is identified by its cgroup path relative to the hierarchy root ([`JobCgroup`]); on v1 the
//! same relative path is used under each controller's mount, which is what every runtime does.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::CgroupError;

/// Which cgroup layout the root holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HierarchyKind {
    /// cgroup v2 only.
    Unified,
    /// cgroup v1 controllers plus a controller-less v2 tree at `<root>/unified`.
    Hybrid,
    /// cgroup v1 only.
    Legacy,
}

impl HierarchyKind {
    /// True when resources are controlled through cgroup v2 files.
    pub fn is_v2(self) -> bool {
        self == HierarchyKind::Unified
    }
}

impl fmt::Display for HierarchyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HierarchyKind::Unified => "unified (cgroup v2)",
            HierarchyKind::Hybrid => "hybrid (cgroup v1 controllers + v2 tree)",
            HierarchyKind::Legacy => "legacy (cgroup v1)",
        })
    }
}

/// The controllers the governor reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    Cpu,
    /// v1 only: CPU usage accounting (`cpuacct.usage`). On v2 usage is in `cpu.stat`.
    CpuAcct,
    Memory,
    Pids,
}

impl Controller {
    /// The controller's name as the kernel spells it.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::CpuAcct => "cpuacct",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
        }
    }

    fn from_name(name: &str) -> Option<Controller> {
        Some(match name {
            "cpu" => Controller::Cpu,
            "cpuacct" => Controller::CpuAcct,
            "memory" => Controller::Memory,
            "pids" => Controller::Pids,
            _ => return None,
        })
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A job's cgroup, as a path relative to the hierarchy root (`kubepods.slice/pod1/ctr`), with no
/// `..`, no `.` and never the root cgroup itself. Displayed with a leading `/`, as
/// `/proc/<pid>/cgroup` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobCgroup {
    relative: PathBuf,
}

impl JobCgroup {
    /// Validate `path` (absolute as in `/proc/<pid>/cgroup`, or relative) as a job's cgroup.
    pub fn new(path: impl AsRef<Path>) -> Result<JobCgroup, CgroupError> {
        let path = path.as_ref();
        let invalid = |reason| CgroupError::InvalidPath {
            path: path.display().to_string(),
            reason,
        };
        let mut relative = PathBuf::new();
        for component in path.components() {
            match component {
                Component::RootDir => {}
                Component::Normal(name) => relative.push(name),
                Component::CurDir | Component::ParentDir => {
                    return Err(invalid("`.` and `..` are not allowed in a cgroup path"));
                }
                Component::Prefix(_) => return Err(invalid("not a Unix path")),
            }
        }
        if relative.as_os_str().is_empty() {
            return Err(invalid("the root cgroup cannot be governed"));
        }
        Ok(JobCgroup { relative })
    }

    /// The path relative to the hierarchy root.
    pub fn relative(&self) -> &Path {
        &self.relative
    }
}

impl fmt::Display for JobCgroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", self.relative.display())
    }
}

impl TryFrom<String> for JobCgroup {
    type Error = CgroupError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        JobCgroup::new(s)
    }
}

impl From<JobCgroup> for String {
    fn from(job: JobCgroup) -> String {
        job.to_string()
    }
}

/// The detected layout of a cgroup root. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Hierarchy {
    root: PathBuf,
    kind: HierarchyKind,
    /// The v2 tree: the root itself (unified) or `<root>/unified` (hybrid).
    unified: Option<PathBuf>,
    /// v1 controller mounts (hybrid, legacy).
    v1: BTreeMap<Controller, PathBuf>,
    /// Controllers listed in the v2 root's `cgroup.controllers`.
    v2_controllers: Vec<String>,
    /// True when the root is a real cgroup filesystem (statfs magic), false for a fake root laid
    /// out as plain files by a test.
    on_cgroupfs: bool,
}

impl Hierarchy {
    /// Find out which layout `root` holds (see the module doc). Only reads.
    pub fn detect(root: impl Into<PathBuf>) -> Result<Hierarchy, CgroupError> {
        let root = root.into();
        let no_hierarchy = |reason: &str| CgroupError::NoHierarchy {
            root: root.clone(),
            reason: reason.to_owned(),
        };
        if !root.is_dir() {
            return Err(no_hierarchy("not a directory"));
        }
        let v2_at = |dir: &Path| dir.join("cgroup.controllers").is_file();
        let (kind, unified, v1) = if v2_at(&root) {
            (HierarchyKind::Unified, Some(root.clone()), BTreeMap::new())
        } else {
            let v1 = scan_v1_mounts(&root);
            let unified_dir = root.join("unified");
            let unified = v2_at(&unified_dir).then_some(unified_dir);
            match (v1.is_empty(), unified) {
                (false, unified @ Some(_)) => (HierarchyKind::Hybrid, unified, v1),
                (false, None) => (HierarchyKind::Legacy, None, v1),
                // A v2 tree one level down and no v1 controller: govern through it.
                (true, unified @ Some(_)) => (HierarchyKind::Unified, unified, v1),
                (true, None) => {
                    return Err(no_hierarchy(
                        "neither cgroup.controllers (cgroup v2) nor a cgroup v1 controller mount \
                         (cpu, cpuacct, memory, pids) found",
                    ));
                }
            }
        };
        let v2_controllers = unified
            .as_ref()
            .and_then(|u| std::fs::read_to_string(u.join("cgroup.controllers")).ok())
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let probe = unified
            .clone()
            .or_else(|| v1.values().next().cloned())
            .unwrap_or_else(|| root.clone());
        let on_cgroupfs = is_cgroupfs(&probe);
        Ok(Hierarchy {
            root,
            kind,
            unified,
            v1,
            v2_controllers,
            on_cgroupfs,
        })
    }

    /// The root this hierarchy was detected at.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The detected layout.
    pub fn kind(&self) -> HierarchyKind {
        self.kind
    }

    /// The v2 tree, if any (the root for unified, `<root>/unified` for hybrid).
    pub fn unified_dir(&self) -> Option<&Path> {
        self.unified.as_deref()
    }

    /// The mount of a v1 controller (hybrid, legacy).
    pub fn v1_mount(&self, controller: Controller) -> Option<&Path> {
        self.v1.get(&controller).map(PathBuf::as_path)
    }

    /// Controllers available in the v2 root (`cgroup.controllers`).
    pub fn v2_controllers(&self) -> &[String] {
        &self.v2_controllers
    }

    /// True on a real cgroup filesystem, false on a fake root of plain files.
    pub fn on_cgroupfs(&self) -> bool {
        self.on_cgroupfs
    }

    /// The directory holding `job`'s files for `controller`, or `None` when that controller is
    /// not mounted (v1). On v2 every controller shares the job's one directory.
    pub fn controller_dir(&self, controller: Controller, job: &JobCgroup) -> Option<PathBuf> {
        if self.kind.is_v2() {
            self.unified.as_ref().map(|u| u.join(job.relative()))
        } else {
            self.v1.get(&controller).map(|m| m.join(job.relative()))
        }
    }

    /// Every directory that makes up `job`'s cgroup: one on v2; on v1 one per distinct mount of
    /// `controllers`, plus the v2 tree on hybrid hosts (so the job also has its own v2 cgroup id,
    /// which eBPF accounting keys on).
    pub fn group_dirs(&self, job: &JobCgroup, controllers: &[Controller]) -> Vec<PathBuf> {
        self.group_mounts(controllers)
            .into_iter()
            .map(|(m, _)| m.join(job.relative()))
            .collect()
    }

    /// The mounts [`Hierarchy::group_dirs`] writes to, each with the controller that names its
    /// line in `/proc/<pid>/cgroup` (`None`: the unified `0::` line).
    pub fn group_mounts(&self, controllers: &[Controller]) -> Vec<(PathBuf, Option<Controller>)> {
        let mut mounts: Vec<(PathBuf, Option<Controller>)> = Vec::new();
        if !self.kind.is_v2() {
            let selected = self.v1.iter().filter(|(c, _)| controllers.contains(c));
            for (c, m) in selected {
                // Co-mounted controllers (cpu,cpuacct) share one directory tree.
                let canonical = std::fs::canonicalize(m).unwrap_or_else(|_| m.clone());
                if !mounts.iter().any(|(seen, _)| {
                    std::fs::canonicalize(seen).unwrap_or_else(|_| seen.clone()) == canonical
                }) {
                    mounts.push((m.clone(), Some(*c)));
                }
            }
        }
        mounts.extend(self.unified.iter().map(|u| (u.clone(), None)));
        mounts
    }
}

/// v1 controller mounts directly under `root`: directories holding `cgroup.procs` whose name is a
/// comma-separated list of controllers (`cpu`, `cpu,cpuacct`, `memory`). Entries are scanned in
/// name order so that `cpu` wins over `cpu,cpuacct` when both exist (the usual symlink).
fn scan_v1_mounts(root: &Path) -> BTreeMap<Controller, PathBuf> {
    let mut mounts = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return mounts;
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    for name in names {
        let dir = root.join(&name);
        if !dir.is_dir() || !dir.join("cgroup.procs").exists() {
            continue;
        }
        for controller in name.split(',').filter_map(Controller::from_name) {
            mounts.entry(controller).or_insert_with(|| dir.clone());
        }
    }
    mounts
}

/// True when `path` is on a cgroup (v1 or v2) filesystem.
fn is_cgroupfs(path: &Path) -> bool {
    use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, statfs};
    statfs(path)
        .map(|s| {
            let t = s.filesystem_type();
            t == CGROUP2_SUPER_MAGIC || t == CGROUP_SUPER_MAGIC
        })
        .unwrap_or(false)
}
