//! How an eBPF reading is made (steps 1 to 3 of the module documentation): the maps read and
//! summed per cgroup id, the CPUs' pending charges and the slices in flight added, the groups
//! asked for resolved to ids and summed with their descendants.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use governor_common::RunningTask;

use super::cgroupfs::CgroupIndex;
use super::{
    CgroupCpuStats, CgroupUsage, CpuReading, EbpfBackend, EbpfError, MIN_WALK_INTERVAL, absolute,
};

impl EbpfBackend {
    /// Whether this process attached the programs (and so maintains the map).
    fn owner(&self) -> bool {
        self.loaded.is_some()
    }

    /// Reads the maps, keeps the tree current, deletes entries of removed cgroups (owner only).
    /// Returns each id's own usage (the map's figures plus the charges pending on each CPU;
    /// retired totals not included) and the slices in flight. The pending charges of a removed
    /// cgroup reach the map (and so its ancestor) when that CPU next charges another cgroup.
    fn collect(&mut self, root: &Path) -> Result<Collected, EbpfError> {
        let mut snap = self.maps.snapshot()?;
        let mut in_flight = resolve_running(root, &snap.running, self.run_queue_wait);
        let pending = pending_parents(&snap.running);
        let stats = std::mem::take(&mut snap.stats);
        let unknown = stats.keys().any(|&id| self.tree.is_unknown(id))
            || pending.keys().any(|&id| self.tree.is_unknown(id))
            || in_flight.iter().any(|f| self.tree.is_unknown(f.cgroup_id));
        let walked = if unknown {
            self.tree.refresh(false)
        } else {
            self.tree.recheck_foreign_due()
        };
        // Only the process that attached the program maintains its map (and folds the totals of
        // removed cgroups); `governor top` reading the daemon's maps leaves that to the daemon.
        if walked && self.owner() {
            let maps = &self.maps;
            let gone = self
                .tree
                .reconcile(&stats, &pending, |id| maps.parent_of(id));
            for id in gone {
                if let Err(e) = self.maps.remove(id) {
                    tracing::debug!(cgroup_id = id, error = %e, "cannot delete a removed cgroup's entry");
                }
            }
        }
        if walked {
            // A walk takes a while on a big tree: read again so that the figures are of now.
            snap = self.maps.snapshot()?;
            in_flight = resolve_running(root, &snap.running, self.run_queue_wait);
        }
        let mut own = std::mem::take(&mut snap.stats);
        add_pending(&mut own, &snap.running);
        Ok(Collected { own, in_flight })
    }

    pub(super) fn read(
        &mut self,
        root: &Path,
        groups: &[PathBuf],
    ) -> Result<Vec<CpuReading>, EbpfError> {
        let Collected { mut own, in_flight } = self.collect(root)?;
        for (&holder, &t) in &self.tree.retired {
            let e = own.entry(holder).or_default();
            *e = e.add(t);
        }
        add_in_flight(&mut own, &in_flight);

        // Resolve the groups to ids of the index. Their directories are looked up again at most
        // once per MIN_WALK_INTERVAL and after every walk (a stat per group is the costliest part
        // of a read of 1,000 groups); a group removed meanwhile is reported a little longer.
        if self.group_ids_walks != self.tree.walks
            || self
                .group_ids_checked
                .is_none_or(|t| t.elapsed() >= MIN_WALK_INTERVAL)
        {
            self.group_ids.clear();
            self.group_ids_walks = self.tree.walks;
            self.group_ids_checked = Some(Instant::now());
        }
        let mut wanted: Vec<Option<u64>> = Vec::with_capacity(groups.len());
        for group in groups {
            if let Some(&id) = self.group_ids.get(group) {
                wanted.push(Some(id));
                continue;
            }
            let abs = absolute(root, group);
            let id = match std::fs::metadata(&abs) {
                Ok(m) => m.ino(),
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::debug!(group = %abs.display(), error = %e, "cannot stat cgroup");
                    }
                    wanted.push(None);
                    continue;
                }
            };
            if !self.tree.index.contains(id) && abs.starts_with(root) {
                // A group created since the last walk.
                self.tree.refresh(true);
            }
            let known = self.tree.index.contains(id).then_some(id);
            if let Some(id) = known {
                self.group_ids.insert(group.clone(), id);
            }
            wanted.push(known);
        }
        self.tree.redirect_removed(&mut own);
        let wanted_set: HashSet<u64> = wanted.iter().flatten().copied().collect();
        let sums = aggregate(&own, &self.tree.index, &wanted_set);
        let mut out = Vec::with_capacity(groups.len());
        for (group, id) in groups.iter().zip(wanted) {
            let Some(id) = id else { continue };
            let sum = sums.get(&id).copied().unwrap_or_default();
            let reported = self.tree.apply_floor(id, sum);
            out.push(CpuReading {
                path: group.clone(),
                cpu_seconds_total: reported.on_cpu_ns as f64 / 1e9,
                run_queue_wait_seconds: self
                    .run_queue_wait
                    .then(|| reported.run_queue_wait_ns as f64 / 1e9),
                context_switches: Some(reported.context_switches),
            });
        }
        Ok(out)
    }

    pub(super) fn usage_by_cgroup(&mut self, root: &Path) -> Result<Vec<CgroupUsage>, EbpfError> {
        let Collected { mut own, in_flight } = self.collect(root)?;
        add_in_flight(&mut own, &in_flight);
        let mut out: Vec<CgroupUsage> = own
            .into_iter()
            .map(|(id, stats)| CgroupUsage {
                id,
                path: self.tree.index.get(id).map(|n| n.path.clone()),
                stats,
            })
            .collect();
        out.sort_by_key(|u| u.id);
        Ok(out)
    }
}

/// One read of the maps, with the tasks on the CPUs placed in their cgroups.
struct Collected {
    own: HashMap<u64, CgroupCpuStats>,
    in_flight: Vec<InFlight>,
}

/// What a task on a CPU has used since it was switched in (not charged until it is switched
/// out), and its cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct InFlight {
    pub(super) cgroup_id: u64,
    pub(super) on_cpu_ns: u64,
    pub(super) wait_ns: u64,
}

/// The slice in flight of the task on each CPU, from `/proc/<tid>/schedstat` (its
/// `sum_exec_runtime`, brought up to date by the read, and `run_delay`) minus the totals the
/// program recorded at its switch-in, placed in its cgroup from `/proc/<tid>/cgroup`. The
/// program does not record the cgroup: that would cost four dependent loads on every switch, and
/// a task moved while it runs would keep its old cgroup until its next switch, seconds away on an
/// otherwise idle CPU. Two small reads per busy CPU. The daemon must see the host's pid and
/// cgroup namespaces, as it must anyway to govern the node.
pub(super) fn resolve_running(
    root: &Path,
    running: &[RunningTask],
    run_queue_wait: bool,
) -> Vec<InFlight> {
    // A task that moved to another CPU while the slots were copied shows twice: keep the older
    // start, which covers both slices.
    let mut by_pid: HashMap<u32, RunningTask> = HashMap::new();
    for r in running.iter().filter(|r| r.pid != 0) {
        by_pid
            .entry(r.pid)
            .and_modify(|e| {
                if r.start_runtime_ns < e.start_runtime_ns {
                    *e = *r;
                }
            })
            .or_insert(*r);
    }
    by_pid
        .values()
        .filter_map(|r| {
            // A task that exited meanwhile: its CPU has switched; the next read has it.
            let sched = std::fs::read_to_string(format!("/proc/{}/schedstat", r.pid)).ok()?;
            let mut fields = sched.split_whitespace().map(|f| f.parse::<u64>().ok());
            let runtime = fields.next()??;
            let delay = fields.next()??;
            let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", r.pid)).ok()?;
            let rel = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
            let path = root.join(rel.trim().trim_start_matches('/'));
            Some(InFlight {
                cgroup_id: std::fs::metadata(path).ok()?.ino(),
                on_cpu_ns: runtime.saturating_sub(r.start_runtime_ns),
                wait_ns: if run_queue_wait {
                    delay.saturating_sub(r.start_run_delay_ns)
                } else {
                    0
                },
            })
        })
        .collect()
}

/// Adds the charges each CPU has summed but not yet written to the map.
pub(super) fn add_pending(own: &mut HashMap<u64, CgroupCpuStats>, running: &[RunningTask]) {
    for p in running.iter().flat_map(|r| r.pending.iter()) {
        if p.cgroup_id != 0 {
            let e = own.entry(p.cgroup_id).or_default();
            *e = e.add(p.stats);
        }
    }
}

/// The cgroups with pending charges on some CPU, with the parent the program recorded.
pub(super) fn pending_parents(running: &[RunningTask]) -> HashMap<u64, u64> {
    running
        .iter()
        .flat_map(|r| r.pending.iter())
        .filter(|p| p.cgroup_id != 0)
        .map(|p| (p.cgroup_id, p.parent_id))
        .collect()
}

/// Adds each task's slice in flight to its cgroup.
pub(super) fn add_in_flight(own: &mut HashMap<u64, CgroupCpuStats>, in_flight: &[InFlight]) {
    for f in in_flight.iter().filter(|f| f.cgroup_id != 0) {
        let e = own.entry(f.cgroup_id).or_default();
        e.on_cpu_ns += f.on_cpu_ns;
        e.run_queue_wait_ns += f.wait_ns;
    }
}

/// Each wanted id's usage: its own plus that of every descendant in the index.
pub(super) fn aggregate(
    own: &HashMap<u64, CgroupCpuStats>,
    index: &CgroupIndex,
    wanted: &HashSet<u64>,
) -> HashMap<u64, CgroupCpuStats> {
    let mut sums: HashMap<u64, CgroupCpuStats> = HashMap::with_capacity(wanted.len());
    if wanted.is_empty() {
        return sums;
    }
    for (&id, &stats) in own {
        for ancestor in index.ancestry(id) {
            if wanted.contains(&ancestor) {
                let e = sums.entry(ancestor).or_default();
                *e = e.add(stats);
            }
        }
    }
    sums
}
