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
mod reading;
mod sys;
mod tree;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use ebpf::{AttachKind, AttachMode, EbpfError};
pub use governor_common::{CgroupCpuStats, ProgramCounters};

use cgroupfs::CgroupFsKind;
use tree::CgroupTree;

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

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
