//! Reading cgroupfs for CPU accounting (never writing): the fallback counters (`cpu.stat`
//! `usage_usec` on v2, `cpuacct.usage` on v1) and the index from cgroup v2 ids to directories.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Which cgroupfs file the fallback reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CgroupFsKind {
    /// cgroup v2: `<group>/cpu.stat`, line `usage_usec`.
    CpuStat,
    /// cgroup v1: `<group>/cpuacct.usage` (nanoseconds).
    Cpuacct,
}

/// v2 if the root has `cgroup.controllers`; v1 if it (or its `cpuacct` hierarchy) has
/// `cpuacct.usage`; v2 otherwise (reads then fail per group with a clear error).
pub(super) fn detect(root: &Path) -> CgroupFsKind {
    if root.join("cgroup.controllers").exists() {
        CgroupFsKind::CpuStat
    } else if root.join("cpuacct.usage").exists() || root.join("cpuacct/cpuacct.usage").exists() {
        CgroupFsKind::Cpuacct
    } else {
        CgroupFsKind::CpuStat
    }
}

/// Why a group's counter could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} has no valid {field} value")]
    Parse { path: PathBuf, field: &'static str },
}

impl ReadError {
    /// The group is gone (or never existed): not worth a warning.
    pub(super) fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Cumulative CPU time of `group` in nanoseconds.
pub(super) fn read_usage_ns(
    kind: CgroupFsKind,
    root: &Path,
    group: &Path,
) -> Result<u64, ReadError> {
    match kind {
        CgroupFsKind::CpuStat => {
            let path = group.join("cpu.stat");
            let text = fs::read_to_string(&path).map_err(|source| ReadError::Io {
                path: path.clone(),
                source,
            })?;
            parse_keyed(&text, "usage_usec")
                .and_then(|us| us.checked_mul(1_000))
                .ok_or(ReadError::Parse {
                    path,
                    field: "usage_usec",
                })
        }
        CgroupFsKind::Cpuacct => {
            let path = cpuacct_file(root, group);
            let text = fs::read_to_string(&path).map_err(|source| ReadError::Io {
                path: path.clone(),
                source,
            })?;
            text.trim().parse().map_err(|_| ReadError::Parse {
                path,
                field: "cpuacct.usage",
            })
        }
    }
}

/// `cpuacct.usage` of a v1 group. The group may be given in another v1 hierarchy (e.g.
/// `<root>/cpu/job` when cpu and cpuacct are mounted apart): the same relative path under the
/// `cpuacct` hierarchy is used then.
fn cpuacct_file(root: &Path, group: &Path) -> PathBuf {
    let direct = group.join("cpuacct.usage");
    if direct.exists() {
        return direct;
    }
    if let Ok(rel) = group.strip_prefix(root) {
        let mut parts = rel.components();
        if parts.next().is_some() {
            let alt = root
                .join("cpuacct")
                .join(parts.as_path())
                .join("cpuacct.usage");
            if alt.exists() {
                return alt;
            }
        }
    }
    direct
}

/// The value of `key` in a flat-keyed file (`key value` per line).
pub(super) fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        (it.next()? == key).then(|| it.next()?.parse().ok())?
    })
}

/// One cgroup directory in the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CgroupNode {
    pub path: PathBuf,
    /// Id of the parent directory (`None` for the root of the walk).
    pub parent: Option<u64>,
}

/// cgroup v2 ids of every directory under a root, and back. On cgroup v2 the id the kernel uses
/// (`bpf_get_current_cgroup_id`) is the inode number of the group's directory.
#[derive(Clone, Debug, Default)]
pub(super) struct CgroupIndex {
    by_id: HashMap<u64, CgroupNode>,
}

/// Walks give up after this many directories (a runaway tree must not stall the daemon).
const MAX_CGROUPS_WALKED: usize = 200_000;

impl CgroupIndex {
    /// Walks every directory under `root` (the root included).
    pub(super) fn walk(root: &Path) -> io::Result<CgroupIndex> {
        let root_id = fs::metadata(root)?.ino();
        let mut by_id = HashMap::new();
        by_id.insert(
            root_id,
            CgroupNode {
                path: root.to_path_buf(),
                parent: None,
            },
        );
        let mut stack = vec![(root.to_path_buf(), root_id)];
        while let Some((dir, dir_id)) = stack.pop() {
            // A group removed during the walk is simply not there any more.
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                // The inode as stat(2) gives it, like every other id lookup: on cgroupfs the
                // directory entry's d_ino is the same number, but not on every filesystem
                // (overlayfs), and the ids must agree wherever the tree is.
                let Ok(id) = entry.metadata().map(|m| m.ino()) else {
                    continue;
                };
                let path = entry.path();
                by_id.insert(
                    id,
                    CgroupNode {
                        path: path.clone(),
                        parent: Some(dir_id),
                    },
                );
                if by_id.len() >= MAX_CGROUPS_WALKED {
                    return Err(io::Error::other(format!(
                        "more than {MAX_CGROUPS_WALKED} cgroups under {}",
                        root.display()
                    )));
                }
                stack.push((path, id));
            }
        }
        Ok(CgroupIndex { by_id })
    }

    /// Builds an index from (id, path, parent) triples (tests).
    #[cfg(test)]
    pub(super) fn from_nodes(nodes: &[(u64, &str, Option<u64>)]) -> CgroupIndex {
        CgroupIndex {
            by_id: nodes
                .iter()
                .map(|&(id, path, parent)| {
                    (
                        id,
                        CgroupNode {
                            path: PathBuf::from(path),
                            parent,
                        },
                    )
                })
                .collect(),
        }
    }

    pub(super) fn get(&self, id: u64) -> Option<&CgroupNode> {
        self.by_id.get(&id)
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// `id` and its ancestors in the index, nearest first.
    pub(super) fn ancestry(&self, id: u64) -> impl Iterator<Item = u64> + '_ {
        let mut next = self.contains(id).then_some(id);
        let mut steps = 0;
        std::iter::from_fn(move || {
            let cur = next?;
            steps += 1;
            next = if steps > 256 {
                None // a cycle cannot happen in a directory tree; do not trust that blindly
            } else {
                self.by_id.get(&cur).and_then(|n| n.parent)
            };
            Some(cur)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_stat() {
        let text = "usage_usec 1121077161\nuser_usec 1003577805\nsystem_usec 117499356\n";
        assert_eq!(parse_keyed(text, "usage_usec"), Some(1_121_077_161));
        assert_eq!(parse_keyed(text, "system_usec"), Some(117_499_356));
        assert_eq!(parse_keyed(text, "nr_throttled"), None);
        assert_eq!(parse_keyed("usage_usec lots\n", "usage_usec"), None);
        assert_eq!(parse_keyed("usage_usec_x 5\n", "usage_usec"), None);
    }

    #[test]
    fn detects_the_hierarchy_kind() {
        let v2 = tempfile::tempdir().unwrap();
        fs::write(v2.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        assert_eq!(detect(v2.path()), CgroupFsKind::CpuStat);
        let v1 = tempfile::tempdir().unwrap();
        fs::create_dir(v1.path().join("cpuacct")).unwrap();
        fs::write(v1.path().join("cpuacct/cpuacct.usage"), "5\n").unwrap();
        assert_eq!(detect(v1.path()), CgroupFsKind::Cpuacct);
    }

    #[test]
    fn reads_v1_usage_through_the_cpuacct_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("cpu/job")).unwrap();
        fs::create_dir_all(root.path().join("cpuacct/job")).unwrap();
        fs::write(root.path().join("cpuacct/job/cpuacct.usage"), "123456789\n").unwrap();
        let got = read_usage_ns(
            CgroupFsKind::Cpuacct,
            root.path(),
            &root.path().join("cpu/job"),
        )
        .unwrap();
        assert_eq!(got, 123_456_789);
    }

    #[test]
    fn missing_and_malformed_files_are_errors_not_panics() {
        let root = tempfile::tempdir().unwrap();
        let gone = root.path().join("gone");
        let e = read_usage_ns(CgroupFsKind::CpuStat, root.path(), &gone).unwrap_err();
        assert!(e.is_not_found(), "{e}");
        fs::create_dir(root.path().join("bad")).unwrap();
        fs::write(root.path().join("bad/cpu.stat"), "usage_usec -1\n").unwrap();
        let e = read_usage_ns(CgroupFsKind::CpuStat, root.path(), &root.path().join("bad"))
            .unwrap_err();
        assert!(!e.is_not_found());
        assert!(e.to_string().contains("usage_usec"), "{e}");
    }

    #[test]
    fn walk_indexes_directories_by_inode_with_parents() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("a/b")).unwrap();
        fs::create_dir_all(root.path().join("c")).unwrap();
        fs::write(root.path().join("a/cpu.stat"), "usage_usec 1\n").unwrap();
        let index = CgroupIndex::walk(root.path()).unwrap();
        assert_eq!(index.len(), 4, "root, a, a/b, c; files are not groups");
        let id = |p: &str| fs::metadata(root.path().join(p)).unwrap().ino();
        let b = index.get(id("a/b")).unwrap();
        assert_eq!(b.path, root.path().join("a/b"));
        assert_eq!(b.parent, Some(id("a")));
        let chain: Vec<u64> = index.ancestry(id("a/b")).collect();
        assert_eq!(chain, vec![id("a/b"), id("a"), id(".")]);
        assert_eq!(index.ancestry(999_999_999).count(), 0);
    }
}
