//! Per-cgroup CPU accounting: the denominator of a job's growth efficiency.
//!
//! [`CpuAccounting::open`] loads the `sched_switch` program of `governor-ebpf` and falls back to
//! cgroupfs counters (`cpu.stat usage_usec` on v2, `cpuacct.usage` on v1) where it cannot load,
//! logging one line that says why. [`CpuAccounting::read`] returns cumulative, monotonic counters
//! per job cgroup (CPU time, run-queue wait, context switches); the daemon differences them.
//!
//! The program charges the task switched out with the growth of the kernel's own per-task totals
//! since it was switched in: `se.sum_exec_runtime` (what `cpu.stat` is made of) and
//! `sched_info.run_delay` (time runnable but waiting for a CPU), summed per CPU for the last few
//! cgroups charged there and written to a per-CPU hash map keyed by cgroup v2 id when another
//! cgroup needs the room (see `governor-ebpf/src/main.rs`).
//!
//! How an eBPF reading is made (1,000 cgroups every 250 ms cost about 1% of a CPU, see
//! `cargo xtask bench-ebpf`):
//! 1. the hash map is read in batches and summed per cgroup id, then each CPU's slot: its pending
//!    charges, and the slice of the task still on the CPU, from `/proc/<tid>/schedstat`, placed
//!    by `/proc/<tid>/cgroup` (a busy job that is never switched out would otherwise look idle,
//!    and a task moved while it runs counts for its new cgroup);
//! 2. ids are mapped to directories through an index of the cgroup v2 tree (the id of a v2
//!    cgroup is its directory's inode number), walked again when an unknown id or group appears;
//! 3. a group's figures are those of its own id plus every descendant, like `cpu.stat`;
//! 4. entries of cgroups that are gone are deleted from the map and their totals kept by the
//!    nearest live ancestor, so a parent's counter never goes backwards when a child is removed
//!    (the kernel's `cpu.stat` behaves the same way); the program records each new cgroup's
//!    parent, which places cgroups created and removed between two readings.

pub mod btf;
mod cgroupfs;
mod ebpf;
mod sys;

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use ebpf::{AttachKind, AttachMode, EbpfError};
use governor_common::RunningTask;
pub use governor_common::{CgroupCpuStats, ProgramCounters};

use cgroupfs::{CgroupFsKind, CgroupIndex};
use sys::CgroupHandles;

/// Setting this environment variable to anything but `0` or an empty string makes
/// [`CpuAccounting::open`] skip eBPF (and say so): the way to exercise the fallback.
pub const DISABLE_EBPF_ENV: &str = "GOVERNOR_DISABLE_EBPF";

/// Where the kernel publishes its BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Index walks triggered by unknown cgroup ids happen at most this often.
const MIN_WALK_INTERVAL: Duration = Duration::from_secs(1);
/// Removed cgroup ids are remembered this long, so late charges (a task exiting after its cgroup
/// was removed) still go to the same ancestor.
const GRAVEYARD_TTL: Duration = Duration::from_secs(300);

/// Where CPU usage comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuSource {
    /// The `sched_switch` eBPF programs.
    Ebpf,
    /// cgroup v2 `cpu.stat` `usage_usec`.
    CpuStat,
    /// cgroup v1 `cpuacct.usage`.
    Cpuacct,
}

impl CpuSource {
    /// `"ebpf"`, `"cpu.stat"` or `"cpuacct"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CpuSource::Ebpf => "ebpf",
            CpuSource::CpuStat => "cpu.stat",
            CpuSource::Cpuacct => "cpuacct",
        }
    }
}

impl std::fmt::Display for CpuSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options of [`CpuAccounting::open`].
#[derive(Clone, Debug)]
pub struct AccountingOptions {
    /// Do not try eBPF (the fallback reason says so). [`DISABLE_EBPF_ENV`] has the same effect.
    pub disable_ebpf: bool,
    /// Measure run-queue wait (`sched_info.run_delay`; nearly free, kernels without
    /// CONFIG_SCHED_INFO have none).
    pub run_queue_wait: bool,
    /// Which tracepoint flavour to attach.
    pub attach: AttachMode,
    /// The kernel BTF to read field offsets from (tests point it elsewhere to make loading fail).
    pub btf_path: PathBuf,
}

impl Default for AccountingOptions {
    fn default() -> Self {
        AccountingOptions {
            disable_ebpf: false,
            run_queue_wait: true,
            attach: AttachMode::Auto,
            btf_path: PathBuf::from(KERNEL_BTF),
        }
    }
}

/// Cumulative counters of one cgroup (it and its descendants).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuReading {
    /// The group, as it was asked for.
    pub path: PathBuf,
    /// CPU time used since the cgroup was created (eBPF: since the programs were attached).
    pub cpu_seconds_total: f64,
    /// Time its tasks were runnable but waiting for a CPU (eBPF with run-queue wait only).
    pub run_queue_wait_seconds: Option<f64>,
    /// Times its tasks were switched out (eBPF only).
    pub context_switches: Option<u64>,
}

/// Usage of one cgroup's own tasks (not its descendants), for `governor top`.
#[derive(Clone, Debug, PartialEq)]
pub struct CgroupUsage {
    pub id: u64,
    /// Its directory, `None` if not (or no longer) found under the root.
    pub path: Option<PathBuf>,
    pub stats: CgroupCpuStats,
}

enum Backend {
    Ebpf(EbpfBackend),
    CgroupFs(CgroupFsKind),
}

struct EbpfBackend {
    maps: ebpf::Maps,
    kind: AttachKind,
    run_queue_wait: bool,
    /// Programs this process attached (`None`: it reads another process's maps and must not
    /// delete entries, that is the owner's job).
    loaded: Option<ebpf::Loaded>,
    shared_program_id: Option<u32>,
    tree: CgroupTree,
    /// Ids of the groups `read` was asked for, by path as given.
    group_ids: HashMap<PathBuf, u64>,
    /// `tree.walks` when `group_ids` was last cleared.
    group_ids_walks: u64,
    group_ids_checked: Option<Instant>,
}

impl EbpfBackend {
    fn new(
        maps: ebpf::Maps,
        kind: AttachKind,
        run_queue_wait: bool,
        loaded: Option<ebpf::Loaded>,
        shared_program_id: Option<u32>,
        root: &Path,
    ) -> EbpfBackend {
        EbpfBackend {
            maps,
            kind,
            run_queue_wait,
            loaded,
            shared_program_id,
            tree: CgroupTree::new(root),
            group_ids: HashMap::new(),
            group_ids_walks: 0,
            group_ids_checked: None,
        }
    }
}

/// Per-cgroup CPU accounting; see the module documentation.
pub struct CpuAccounting {
    root: PathBuf,
    backend: Backend,
    fallback_reason: Option<String>,
    /// Groups whose read failed once (warned about once, not at every tick).
    warned: HashSet<PathBuf>,
    /// A failed map read was logged (until one succeeds again).
    map_error_logged: bool,
}

impl CpuAccounting {
    /// Tries eBPF, falls back to cgroupfs. Never fails: the reason for a fallback is logged once
    /// (warn) and kept in [`fallback_reason`](Self::fallback_reason).
    pub fn open(cgroup_root: &Path, options: &AccountingOptions) -> CpuAccounting {
        let root = cgroup_root.to_path_buf();
        match try_ebpf(&root, options) {
            Ok(backend) => {
                tracing::info!(
                    source = "ebpf",
                    attach = backend.kind.as_str(),
                    run_queue_wait = backend.run_queue_wait,
                    cgroup_root = %root.display(),
                    "CPU accounting: eBPF programs attached to sched_switch"
                );
                CpuAccounting {
                    root,
                    backend: Backend::Ebpf(backend),
                    fallback_reason: None,
                    warned: HashSet::new(),
                    map_error_logged: false,
                }
            }
            Err(error) => {
                let reason = ebpf::describe(&error);
                let kind = cgroupfs::detect(&root);
                let source = match kind {
                    CgroupFsKind::CpuStat => CpuSource::CpuStat,
                    CgroupFsKind::Cpuacct => CpuSource::Cpuacct,
                };
                tracing::warn!(
                    source = source.as_str(),
                    reason = %reason,
                    "CPU accounting: eBPF unavailable, using {source}"
                );
                CpuAccounting {
                    root,
                    backend: Backend::CgroupFs(kind),
                    fallback_reason: Some(reason),
                    warned: HashSet::new(),
                    map_error_logged: false,
                }
            }
        }
    }

    /// Reads the maps of the accounting programs the daemon attached, if it runs; otherwise
    /// [`open`](Self::open) (for `governor top`).
    pub fn open_shared(cgroup_root: &Path, options: &AccountingOptions) -> CpuAccounting {
        if !disabled(options) {
            match ebpf::open_running() {
                Ok(Some((maps, kind, prog_id))) => {
                    return CpuAccounting {
                        root: cgroup_root.to_path_buf(),
                        backend: Backend::Ebpf(EbpfBackend::new(
                            maps,
                            kind,
                            true,
                            None,
                            Some(prog_id),
                            cgroup_root,
                        )),
                        fallback_reason: None,
                        warned: HashSet::new(),
                        map_error_logged: false,
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(error = %ebpf::describe(&e), "cannot open the running programs' maps")
                }
            }
        }
        CpuAccounting::open(cgroup_root, options)
    }

    /// The source in use.
    pub fn source(&self) -> CpuSource {
        match &self.backend {
            Backend::Ebpf(_) => CpuSource::Ebpf,
            Backend::CgroupFs(CgroupFsKind::CpuStat) => CpuSource::CpuStat,
            Backend::CgroupFs(CgroupFsKind::Cpuacct) => CpuSource::Cpuacct,
        }
    }

    /// Why eBPF is not in use (`None` when it is).
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// One line for `governor status`, e.g. `ebpf (tp_btf on sched_switch, run-queue wait)` or
    /// `cpu.stat (eBPF unavailable: ...)`.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Ebpf(b) => match b.shared_program_id {
                Some(id) => format!(
                    "ebpf ({} on sched_switch; maps of the running program {id})",
                    b.kind.as_str()
                ),
                None if b.run_queue_wait => {
                    format!("ebpf ({} on sched_switch, run-queue wait)", b.kind.as_str())
                }
                None => format!("ebpf ({} on sched_switch)", b.kind.as_str()),
            },
            Backend::CgroupFs(_) => format!(
                "{} (eBPF unavailable: {})",
                self.source(),
                self.fallback_reason.as_deref().unwrap_or("unknown")
            ),
        }
    }

    /// Which tracepoint flavour is attached (eBPF only).
    pub fn attach_kind(&self) -> Option<AttachKind> {
        match &self.backend {
            Backend::Ebpf(b) => Some(b.kind),
            Backend::CgroupFs(_) => None,
        }
    }

    /// Kernel id of the program this process attached, for the kernel's BPF run-time
    /// statistics (`None` for the fallback or when reading another process's maps).
    pub fn program_id(&self) -> Option<u32> {
        match &self.backend {
            Backend::Ebpf(EbpfBackend {
                loaded: Some(l), ..
            }) => Some(l.program_id),
            _ => None,
        }
    }

    /// The cgroup root this instance reads.
    pub fn cgroup_root(&self) -> &Path {
        &self.root
    }

    /// Cumulative counters of each group (a group's figures include its descendants). Groups
    /// that do not exist (any more) are left out; a group whose counters cannot be read is left
    /// out and warned about once. Paths may be absolute or relative to the cgroup root.
    pub fn read(&mut self, groups: &[PathBuf]) -> Vec<CpuReading> {
        let root = self.root.clone();
        match &mut self.backend {
            Backend::Ebpf(b) => match b.read(&root, groups) {
                Ok(r) => {
                    self.map_error_logged = false;
                    r
                }
                Err(e) => {
                    if !self.map_error_logged {
                        tracing::warn!(error = %ebpf::describe(&e), "cannot read the eBPF accounting maps");
                        self.map_error_logged = true;
                    }
                    Vec::new()
                }
            },
            Backend::CgroupFs(kind) => {
                let kind = *kind;
                let mut out = Vec::with_capacity(groups.len());
                for group in groups {
                    let abs = absolute(&root, group);
                    match cgroupfs::read_usage_ns(kind, &root, &abs) {
                        Ok(ns) => {
                            self.warned.remove(group);
                            out.push(CpuReading {
                                path: group.clone(),
                                cpu_seconds_total: ns as f64 / 1e9,
                                run_queue_wait_seconds: None,
                                context_switches: None,
                            })
                        }
                        Err(e) if e.is_not_found() => {
                            tracing::debug!(group = %group.display(), "cgroup gone")
                        }
                        Err(e) => {
                            if self.warned.insert(group.clone()) {
                                tracing::warn!(group = %group.display(), error = %e, "cannot read CPU usage");
                            }
                        }
                    }
                }
                out
            }
        }
    }

    /// Every cgroup the programs have an entry for, with its own usage (in-flight slices
    /// included). Empty for the cgroupfs fallback.
    pub fn usage_by_cgroup(&mut self) -> Vec<CgroupUsage> {
        let root = self.root.clone();
        match &mut self.backend {
            Backend::Ebpf(b) => b.usage_by_cgroup(&root).unwrap_or_else(|e| {
                tracing::warn!(error = %ebpf::describe(&e), "cannot read the eBPF accounting maps");
                Vec::new()
            }),
            Backend::CgroupFs(_) => Vec::new(),
        }
    }

    /// Cgroup ids that have an entry in the eBPF hash map (`None` for the fallback); charges
    /// still pending on a CPU are not entries yet.
    pub fn tracked_cgroup_ids(&self) -> Option<Vec<u64>> {
        match &self.backend {
            Backend::Ebpf(b) => Some(b.maps.ids()),
            Backend::CgroupFs(_) => None,
        }
    }

    /// What the programs could not do (map full, failed kernel reads), summed over CPUs.
    pub fn program_counters(&self) -> Option<ProgramCounters> {
        match &self.backend {
            Backend::Ebpf(b) => b.maps.counters(),
            Backend::CgroupFs(_) => None,
        }
    }
}

fn disabled(options: &AccountingOptions) -> bool {
    options.disable_ebpf
        || std::env::var_os(DISABLE_EBPF_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

fn try_ebpf(root: &Path, options: &AccountingOptions) -> Result<EbpfBackend, EbpfError> {
    if options.disable_ebpf {
        return Err(EbpfError::Disabled("configuration".into()));
    }
    if let Some(v) = std::env::var_os(DISABLE_EBPF_ENV).filter(|v| !v.is_empty() && v != "0") {
        return Err(EbpfError::Disabled(format!(
            "{DISABLE_EBPF_ENV}={}",
            v.to_string_lossy()
        )));
    }
    match sys::is_cgroup2(root) {
        Ok(true) => {}
        Ok(false) => return Err(EbpfError::NotCgroup2(root.to_path_buf())),
        Err(source) => {
            return Err(EbpfError::CgroupRoot {
                path: root.to_path_buf(),
                source,
            });
        }
    }
    let (maps, loaded) = ebpf::load(&ebpf::LoadOptions {
        attach: options.attach,
        run_queue_wait: options.run_queue_wait,
        btf_path: &options.btf_path,
    })?;
    Ok(EbpfBackend::new(
        maps,
        loaded.kind,
        loaded.run_queue_wait,
        Some(loaded),
        None,
        root,
    ))
}

fn absolute(root: &Path, group: &Path) -> PathBuf {
    if group.is_absolute() {
        group.to_path_buf()
    } else {
        root.join(group)
    }
}

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

    fn read(&mut self, root: &Path, groups: &[PathBuf]) -> Result<Vec<CpuReading>, EbpfError> {
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

    fn usage_by_cgroup(&mut self, root: &Path) -> Result<Vec<CgroupUsage>, EbpfError> {
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
struct InFlight {
    cgroup_id: u64,
    on_cpu_ns: u64,
    wait_ns: u64,
}

/// The slice in flight of the task on each CPU, from `/proc/<tid>/schedstat` (its
/// `sum_exec_runtime`, brought up to date by the read, and `run_delay`) minus the totals the
/// program recorded at its switch-in, placed in its cgroup from `/proc/<tid>/cgroup`. The
/// program does not record the cgroup: that would cost four dependent loads on every switch, and
/// a task moved while it runs would keep its old cgroup until its next switch, seconds away on an
/// otherwise idle CPU. Two small reads per busy CPU. The daemon must see the host's pid and
/// cgroup namespaces, as it must anyway to govern the node.
fn resolve_running(root: &Path, running: &[RunningTask], run_queue_wait: bool) -> Vec<InFlight> {
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
fn add_pending(own: &mut HashMap<u64, CgroupCpuStats>, running: &[RunningTask]) {
    for p in running.iter().flat_map(|r| r.pending.iter()) {
        if p.cgroup_id != 0 {
            let e = own.entry(p.cgroup_id).or_default();
            *e = e.add(p.stats);
        }
    }
}

/// The cgroups with pending charges on some CPU, with the parent the program recorded.
fn pending_parents(running: &[RunningTask]) -> HashMap<u64, u64> {
    running
        .iter()
        .flat_map(|r| r.pending.iter())
        .filter(|p| p.cgroup_id != 0)
        .map(|p| (p.cgroup_id, p.parent_id))
        .collect()
}

/// Adds each task's slice in flight to its cgroup.
fn add_in_flight(own: &mut HashMap<u64, CgroupCpuStats>, in_flight: &[InFlight]) {
    for f in in_flight.iter().filter(|f| f.cgroup_id != 0) {
        let e = own.entry(f.cgroup_id).or_default();
        e.on_cpu_ns += f.on_cpu_ns;
        e.run_queue_wait_ns += f.wait_ns;
    }
}

/// Each wanted id's usage: its own plus that of every descendant in the index.
fn aggregate(
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

/// The cgroup tree as the eBPF backend sees it: ids to directories, the totals removed cgroups
/// left to their ancestors, and the monotonic floor of each group it reported.
struct CgroupTree {
    root: PathBuf,
    index: CgroupIndex,
    last_walk: Option<Instant>,
    /// Index before the last walk: where removed cgroups were.
    previous: CgroupIndex,
    /// Totals of removed cgroups, held by their nearest live ancestor (holder id -> totals).
    retired: HashMap<u64, CgroupCpuStats>,
    /// Removed ids -> (holder of their totals, when removed): late charges follow them.
    graveyard: HashMap<u64, (Option<u64>, Instant)>,
    /// Ids that exist but not under our root (not ours to name or delete) -> when checked.
    foreign: HashMap<u64, Instant>,
    /// Highest figures reported per group id (counters must not go backwards).
    floor: HashMap<u64, CgroupCpuStats>,
    /// Whether a cgroup id exists (`None`: cannot tell); file handles on the real root.
    exists: Box<dyn Fn(u64) -> Option<bool> + Send>,
    walk_error_logged: bool,
    /// Successful walks so far.
    walks: u64,
}

/// Foreign ids are checked again this often (they may have been removed meanwhile).
const FOREIGN_RECHECK: Duration = Duration::from_secs(60);

impl CgroupTree {
    fn new(root: &Path) -> CgroupTree {
        let handles = CgroupHandles::open(root)
            .map_err(|e| {
                tracing::debug!(error = %e, "cgroup file handles unavailable: entries of cgroups removed before they were indexed cannot be cleaned up")
            })
            .ok();
        CgroupTree::with_existence(root, Box::new(move |id| handles.as_ref()?.exists(id)))
    }

    fn with_existence(root: &Path, exists: Box<dyn Fn(u64) -> Option<bool> + Send>) -> CgroupTree {
        CgroupTree {
            root: root.to_path_buf(),
            index: CgroupIndex::default(),
            last_walk: None,
            previous: CgroupIndex::default(),
            retired: HashMap::new(),
            graveyard: HashMap::new(),
            foreign: HashMap::new(),
            floor: HashMap::new(),
            exists,
            walk_error_logged: false,
            walks: 0,
        }
    }

    /// Not in the index, not known to be foreign or removed: a walk may tell where it is.
    fn is_unknown(&self, id: u64) -> bool {
        !self.index.contains(id)
            && !self.foreign.contains_key(&id)
            && !self.graveyard.contains_key(&id)
    }

    /// Walks the tree again (at most once per [`MIN_WALK_INTERVAL`] unless `force`). Returns
    /// whether it did.
    fn refresh(&mut self, force: bool) -> bool {
        let now = Instant::now();
        if !force && self.last_walk.is_some_and(|t| now - t < MIN_WALK_INTERVAL) {
            return false;
        }
        self.last_walk = Some(now);
        match CgroupIndex::walk(&self.root) {
            Ok(index) => {
                self.previous = std::mem::replace(&mut self.index, index);
                self.walk_error_logged = false;
                self.walks += 1;
                true
            }
            Err(e) => {
                if !self.walk_error_logged {
                    tracing::warn!(root = %self.root.display(), error = %e, "cannot walk the cgroup tree");
                    self.walk_error_logged = true;
                }
                false
            }
        }
    }

    /// A walk when a foreign id is due for a new look (they may be gone).
    fn recheck_foreign_due(&mut self) -> bool {
        let now = Instant::now();
        if self.foreign.values().any(|&t| now - t > FOREIGN_RECHECK) {
            self.refresh(false)
        } else {
            false
        }
    }

    /// The nearest ancestor of a removed `id` (by the previous index) that is still there.
    fn holder_of(&self, id: u64) -> Option<u64> {
        self.previous
            .ancestry(id)
            .skip(1)
            .find(|&a| self.index.contains(a))
    }

    /// Where the totals of a removed cgroup go when only its parent's id is known (it was created
    /// and removed between two walks): the parent if it is live, else the parent's own holder.
    fn holder_via_parent(&self, parent: Option<u64>) -> Option<u64> {
        let p = parent?;
        if self.index.contains(p) {
            Some(p)
        } else if let Some(&(holder, _)) = self.graveyard.get(&p) {
            holder
        } else {
            self.holder_of(p)
        }
    }

    /// After a walk: finds which map entries belong to removed cgroups, moves their totals to the
    /// nearest live ancestor and returns their ids (to delete from the map). `pending` are the
    /// ids (and parents) of the CPUs' pending charges; `parent_of` gives the parent the program
    /// recorded for an id.
    fn reconcile(
        &mut self,
        stats: &HashMap<u64, CgroupCpuStats>,
        pending: &HashMap<u64, u64>,
        parent_of: impl Fn(u64) -> Option<u64>,
    ) -> Vec<u64> {
        let now = Instant::now();
        // Holders that were removed themselves pass their retired totals up.
        let orphaned: Vec<u64> = self
            .retired
            .keys()
            .copied()
            .filter(|&h| !self.index.contains(h))
            .collect();
        for h in orphaned {
            let totals = self.retired.remove(&h).unwrap_or_default();
            if let Some(up) = self.holder_of(h) {
                let e = self.retired.entry(up).or_default();
                *e = e.add(totals);
            }
        }
        for (holder, _) in self.graveyard.values_mut() {
            if let Some(h) = *holder
                && !self.index.contains(h)
            {
                *holder = self
                    .previous
                    .ancestry(h)
                    .skip(1)
                    .find(|&a| self.index.contains(a));
            }
        }
        self.graveyard.retain(|_, (_, t)| now - *t < GRAVEYARD_TTL);
        self.floor.retain(|id, _| self.index.contains(*id));

        let mut gone = Vec::new();
        for (&id, &totals) in stats {
            let Some(holder) = self.classify(id, || parent_of(id), now) else {
                continue;
            };
            if let Some(h) = holder {
                let e = self.retired.entry(h).or_default();
                *e = e.add(totals);
            }
            tracing::debug!(cgroup_id = id, holder = ?holder, "cgroup removed: entry deleted, totals kept by its ancestor");
            gone.push(id);
        }
        // Ids only in the CPUs' pending charges: classified, so that reads count their charges
        // for the holder until they reach the map (and then the entry is deleted as above).
        for (&id, &parent) in pending {
            if !stats.contains_key(&id) {
                self.classify(
                    id,
                    || Some(parent).filter(|&p| p != 0).or_else(|| parent_of(id)),
                    now,
                );
            }
        }
        gone
    }

    /// For an id not in the (fresh) index: `Some(holder)` if its cgroup is gone (recorded in the
    /// graveyard), `None` if it is live or exists outside our root (recorded as foreign).
    fn classify(
        &mut self,
        id: u64,
        parent: impl FnOnce() -> Option<u64>,
        now: Instant,
    ) -> Option<Option<u64>> {
        if self.index.contains(id) {
            return None;
        }
        let holder = if let Some(&(holder, _)) = self.graveyard.get(&id) {
            holder
        } else if self.previous.contains(id) {
            self.holder_of(id)
        } else {
            match (self.exists)(id) {
                Some(false) => self.holder_via_parent(parent()),
                // Exists outside our root, or the kernel will not say: leave it alone.
                _ => {
                    self.foreign.insert(id, now);
                    return None;
                }
            }
        };
        self.foreign.remove(&id);
        self.graveyard.insert(id, (holder, now));
        Some(holder)
    }

    /// Moves the figures of removed cgroups (late or pending charges not yet folded into
    /// `retired`) to the ancestor that holds their totals.
    fn redirect_removed(&self, own: &mut HashMap<u64, CgroupCpuStats>) {
        let removed: Vec<(u64, u64)> = own
            .keys()
            .filter(|&&id| !self.index.contains(id))
            .filter_map(|&id| Some((id, self.graveyard.get(&id)?.0?)))
            .collect();
        for (id, holder) in removed {
            if let Some(t) = own.remove(&id) {
                let e = own.entry(holder).or_default();
                *e = e.add(t);
            }
        }
    }

    /// Reports at least what was reported before for this group.
    fn apply_floor(&mut self, id: u64, stats: CgroupCpuStats) -> CgroupCpuStats {
        let floor = self.floor.entry(id).or_default();
        let out = CgroupCpuStats {
            on_cpu_ns: stats.on_cpu_ns.max(floor.on_cpu_ns),
            run_queue_wait_ns: stats.run_queue_wait_ns.max(floor.run_queue_wait_ns),
            context_switches: stats.context_switches.max(floor.context_switches),
        };
        *floor = out;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor_common::PendingCharge;
    use std::fs;

    fn stats(on_cpu_ns: u64) -> CgroupCpuStats {
        CgroupCpuStats {
            on_cpu_ns,
            run_queue_wait_ns: on_cpu_ns / 10,
            context_switches: 1,
        }
    }

    /// A fake cgroup v2 root: `cgroup.controllers` and groups with `cpu.stat` files.
    fn fake_v2_root() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        for (group, usec) in [("job-a", 2_500_000u64), ("job-b", 750_000)] {
            fs::create_dir(root.path().join(group)).unwrap();
            fs::write(
                root.path().join(group).join("cpu.stat"),
                format!("usage_usec {usec}\nuser_usec {usec}\nsystem_usec 0\n"),
            )
            .unwrap();
        }
        root
    }

    #[test]
    fn falls_back_to_cpu_stat_on_a_non_cgroup2_root_and_says_why() {
        let root = fake_v2_root();
        let mut acct = CpuAccounting::open(root.path(), &AccountingOptions::default());
        assert_eq!(acct.source(), CpuSource::CpuStat);
        assert_eq!(acct.source().as_str(), "cpu.stat");
        let reason = acct.fallback_reason().expect("a fallback reason");
        assert!(reason.contains("not a cgroup v2 mount"), "{reason}");
        assert!(
            acct.describe().starts_with("cpu.stat (eBPF unavailable: "),
            "{}",
            acct.describe()
        );

        // Absolute and relative paths; a missing group is left out.
        let groups = vec![
            root.path().join("job-a"),
            PathBuf::from("job-b"),
            PathBuf::from("job-gone"),
        ];
        let readings = acct.read(&groups);
        assert_eq!(readings.len(), 2, "{readings:?}");
        assert_eq!(readings[0].path, root.path().join("job-a"));
        assert!((readings[0].cpu_seconds_total - 2.5).abs() < 1e-9);
        assert_eq!(readings[1].path, PathBuf::from("job-b"));
        assert!((readings[1].cpu_seconds_total - 0.75).abs() < 1e-9);
        assert_eq!(readings[0].run_queue_wait_seconds, None);
        assert_eq!(readings[0].context_switches, None);
        assert_eq!(acct.tracked_cgroup_ids(), None);
    }

    #[test]
    fn the_disable_option_is_the_reported_reason() {
        let root = fake_v2_root();
        let acct = CpuAccounting::open(
            root.path(),
            &AccountingOptions {
                disable_ebpf: true,
                ..AccountingOptions::default()
            },
        );
        assert_eq!(acct.source(), CpuSource::CpuStat);
        assert_eq!(
            acct.fallback_reason(),
            Some("eBPF disabled by configuration")
        );
    }

    #[test]
    fn falls_back_to_cpuacct_on_a_v1_root() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("cpuacct/job")).unwrap();
        fs::write(root.path().join("cpuacct/cpuacct.usage"), "1\n").unwrap();
        fs::write(
            root.path().join("cpuacct/job/cpuacct.usage"),
            "3000000000\n",
        )
        .unwrap();
        let mut acct = CpuAccounting::open(root.path(), &AccountingOptions::default());
        assert_eq!(acct.source(), CpuSource::Cpuacct);
        let r = acct.read(&[PathBuf::from("cpuacct/job")]);
        assert_eq!(r.len(), 1);
        assert!((r[0].cpu_seconds_total - 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_malformed_cpu_stat_is_left_out_not_fatal() {
        let root = fake_v2_root();
        fs::write(root.path().join("job-a/cpu.stat"), "garbage\n").unwrap();
        let mut acct = CpuAccounting::open(root.path(), &AccountingOptions::default());
        let r = acct.read(&[PathBuf::from("job-a"), PathBuf::from("job-b")]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].path, PathBuf::from("job-b"));
        // Warned once, still left out on the next read.
        assert_eq!(acct.read(&[PathBuf::from("job-a")]).len(), 0);
    }

    #[test]
    fn in_flight_slices_are_added_to_the_running_cgroup() {
        let mut own = HashMap::from([(7, stats(1_000))]);
        let in_flight = [
            InFlight {
                cgroup_id: 7,
                on_cpu_ns: 5_000,
                wait_ns: 300,
            },
            // A task whose cgroup is unknown: nothing added.
            InFlight {
                cgroup_id: 0,
                on_cpu_ns: 9_000,
                wait_ns: 9,
            },
            InFlight {
                cgroup_id: 8,
                on_cpu_ns: 50,
                wait_ns: 0,
            },
        ];
        add_in_flight(&mut own, &in_flight);
        assert_eq!(own[&7].on_cpu_ns, 1_000 + 5_000);
        assert_eq!(own[&7].run_queue_wait_ns, 100 + 300);
        assert_eq!(own[&8].on_cpu_ns, 50);
        assert!(!own.contains_key(&0));
    }

    #[test]
    fn pending_charges_are_added_to_their_cgroup() {
        let mut own = HashMap::from([(7, stats(1_000))]);
        let mut cpu0 = RunningTask::default();
        cpu0.pending[0] = PendingCharge {
            cgroup_id: 7,
            parent_id: 1,
            stats: stats(500),
        };
        cpu0.pending[5] = PendingCharge {
            cgroup_id: 9,
            parent_id: 7,
            stats: stats(40),
        };
        let mut cpu1 = RunningTask::default();
        cpu1.pending[2] = PendingCharge {
            cgroup_id: 7,
            parent_id: 1,
            stats: stats(60),
        };
        let running = [cpu0, cpu1];
        add_pending(&mut own, &running);
        assert_eq!(own[&7].on_cpu_ns, 1_560);
        assert_eq!(own[&7].context_switches, 3);
        assert_eq!(own[&9].on_cpu_ns, 40);
        assert!(!own.contains_key(&0), "free slots add nothing");
        assert_eq!(pending_parents(&running), HashMap::from([(7, 1), (9, 7)]));
    }

    #[test]
    fn pending_charges_of_a_removed_cgroup_count_for_its_parent() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("job")).unwrap();
        let job = fs::metadata(root.path().join("job")).unwrap().ino();
        let ghost = 987_654_321;
        let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| Some(false)));
        assert!(tree.refresh(true));
        // Only pending on a CPU: classified, not deleted (it is not in the map).
        let gone = tree.reconcile(&HashMap::new(), &HashMap::from([(ghost, job)]), |_| None);
        assert!(gone.is_empty());
        let mut own = HashMap::from([(job, stats(10)), (ghost, stats(500))]);
        tree.redirect_removed(&mut own);
        assert_eq!(own[&job].on_cpu_ns, 510);
        assert!(!own.contains_key(&ghost));
        // Later written to the map: folded into the parent's retired totals and deleted.
        let map = HashMap::from([(ghost, stats(500))]);
        assert!(tree.refresh(true));
        assert_eq!(tree.reconcile(&map, &HashMap::new(), |_| None), vec![ghost]);
        assert_eq!(tree.retired[&job].on_cpu_ns, 500);
    }

    #[test]
    fn running_tasks_are_measured_and_placed_through_proc() {
        let root = tempfile::tempdir().unwrap();
        let text = fs::read_to_string("/proc/self/cgroup").unwrap();
        let rel = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .expect("no cgroup v2 line in /proc/self/cgroup")
            .trim()
            .trim_start_matches('/');
        let dir = root.path().join(rel);
        fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let sched = fs::read_to_string(format!("/proc/{me}/schedstat")).unwrap();
        let mut fields = sched.split_whitespace().map(|f| f.parse::<u64>().unwrap());
        let (runtime, delay) = (fields.next().unwrap(), fields.next().unwrap());
        let task = |pid, start_runtime_ns| RunningTask {
            start_runtime_ns,
            pid,
            seen: 1,
            ..RunningTask::default()
        };
        let running = [
            task(me, runtime),                           // switched in just now
            task(me, runtime.saturating_sub(2_000_000)), // the same task seen on another CPU, earlier
            task(0, 0),                                  // idle
            task(u32::MAX - 1, 0),                       // no such task (exited)
        ];
        let got = resolve_running(root.path(), &running, true);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].cgroup_id, fs::metadata(&dir).unwrap().ino());
        assert!(
            got[0].on_cpu_ns >= 2_000_000,
            "the older start covers both slices: {got:?}"
        );
        assert!(
            got[0].wait_ns >= delay,
            "all its run_delay ({delay}): {got:?}"
        );
        let no_wait = resolve_running(root.path(), &running, false);
        assert_eq!(no_wait[0].wait_ns, 0);
    }

    #[test]
    fn a_group_includes_its_descendants() {
        let index = CgroupIndex::from_nodes(&[
            (1, "/cg", None),
            (10, "/cg/job", Some(1)),
            (11, "/cg/job/worker-0", Some(10)),
            (12, "/cg/job/worker-1", Some(10)),
            (20, "/cg/other", Some(1)),
        ]);
        let own = HashMap::from([
            (10, stats(1)),
            (11, stats(100)),
            (12, stats(1000)),
            (20, stats(5)),
            (99, stats(7)), // not under the root
        ]);
        let sums = aggregate(&own, &index, &HashSet::from([10, 11, 1]));
        assert_eq!(sums[&10].on_cpu_ns, 1101);
        assert_eq!(sums[&10].context_switches, 3);
        assert_eq!(sums[&11].on_cpu_ns, 100);
        assert_eq!(sums[&1].on_cpu_ns, 1106);
        assert!(!sums.contains_key(&20), "not asked for");
    }

    #[test]
    fn removed_cgroups_are_deleted_and_their_totals_kept_by_the_parent() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("job/step-1/inner")).unwrap();
        let ino = |p: &str| fs::metadata(root.path().join(p)).unwrap().ino();
        let (job, step, inner) = (ino("job"), ino("job/step-1"), ino("job/step-1/inner"));
        let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
        assert!(tree.refresh(true));
        let mut map = HashMap::from([(job, stats(10)), (step, stats(200)), (inner, stats(3000))]);
        assert!(
            tree.reconcile(&map, &HashMap::new(), |_| None).is_empty(),
            "nothing removed yet"
        );
        let before = aggregate(&map, &tree.index, &HashSet::from([job]))[&job];
        assert_eq!(before.on_cpu_ns, 3210);
        tree.apply_floor(job, before);

        fs::remove_dir(root.path().join("job/step-1/inner")).unwrap();
        fs::remove_dir(root.path().join("job/step-1")).unwrap();
        assert!(tree.refresh(true));
        let mut gone = tree.reconcile(&map, &HashMap::new(), |_| None);
        gone.sort();
        let mut expected = vec![step, inner];
        expected.sort();
        assert_eq!(gone, expected, "both removed groups' entries are deleted");
        for id in &gone {
            map.remove(id);
        }
        assert_eq!(
            tree.retired[&job].on_cpu_ns, 3200,
            "job holds its removed children's totals"
        );

        let mut own = map.clone();
        for (&h, &t) in &tree.retired {
            let e = own.entry(h).or_default();
            *e = e.add(t);
        }
        let after = aggregate(&own, &tree.index, &HashSet::from([job]))[&job];
        assert_eq!(
            after.on_cpu_ns, 3210,
            "the parent's counter did not go backwards"
        );

        // A late charge to a removed id (a task exiting after rmdir) follows the same way.
        let late = HashMap::from([(inner, stats(5))]);
        assert!(tree.refresh(true));
        assert_eq!(
            tree.reconcile(&late, &HashMap::new(), |_| None),
            vec![inner]
        );
        assert_eq!(tree.retired[&job].on_cpu_ns, 3205);
    }

    #[test]
    fn ids_never_seen_under_the_root_are_left_alone_when_existence_is_unknown() {
        let root = tempfile::tempdir().unwrap();
        let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
        assert!(tree.refresh(true));
        let map = HashMap::from([(123_456_789, stats(1))]);
        assert!(tree.reconcile(&map, &HashMap::new(), |_| None).is_empty());
        assert!(
            !tree.is_unknown(123_456_789),
            "remembered as foreign: no walk on every read"
        );
    }

    #[test]
    fn a_cgroup_removed_before_any_walk_goes_to_the_parent_the_programs_recorded() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("job")).unwrap();
        let job = fs::metadata(root.path().join("job")).unwrap().ino();
        let ghost = 987_654_321;
        let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| Some(false)));
        assert!(tree.refresh(true));
        let map = HashMap::from([(job, stats(10)), (ghost, stats(500))]);
        let gone = tree.reconcile(&map, &HashMap::new(), |id| (id == ghost).then_some(job));
        assert_eq!(gone, vec![ghost]);
        assert_eq!(tree.retired[&job].on_cpu_ns, 500);
        // Without a recorded parent the totals cannot be placed: dropped, but the entry goes.
        let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| Some(false)));
        assert!(tree.refresh(true));
        assert_eq!(tree.reconcile(&map, &HashMap::new(), |_| None), vec![ghost]);
        assert!(tree.retired.is_empty());
    }

    #[test]
    fn accounting_can_move_to_another_thread() {
        // The daemon keeps it in a task of its own.
        fn assert_send<T: Send>() {}
        assert_send::<CpuAccounting>();
    }

    #[test]
    fn the_floor_keeps_counters_monotonic() {
        let root = tempfile::tempdir().unwrap();
        let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
        assert_eq!(tree.apply_floor(5, stats(100)).on_cpu_ns, 100);
        assert_eq!(tree.apply_floor(5, stats(90)).on_cpu_ns, 100);
        assert_eq!(tree.apply_floor(5, stats(150)).on_cpu_ns, 150);
    }

    #[test]
    fn walks_are_rate_limited_unless_forced() {
        let root = tempfile::tempdir().unwrap();
        let mut tree = CgroupTree::with_existence(root.path(), Box::new(|_| None));
        assert!(tree.refresh(false));
        assert!(!tree.refresh(false));
        assert!(tree.refresh(true));
    }
}
