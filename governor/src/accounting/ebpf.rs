//! Loading, attaching and reading the `sched_switch` accounting programs (aya).

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;
use std::thread::JoinHandle;

use aya::maps::{
    HashMap as BpfHashMap, Map, MapData, MapError, MapInfo, PerCpuArray, PerCpuHashMap,
};
use aya::programs::{BtfTracePoint, Program, RawTracePoint, loaded_programs};
use aya::{Ebpf, EbpfLoader};
use governor_common::{
    CGROUP_CPU_MAP, CGROUP_PARENT_MAP, CONFIG_GLOBAL, CONFIG_TRACK_RUN_QUEUE_WAIT, COUNTERS_MAP,
    CgroupCpuStats, ProgramCounters, RUNNING_MAP, RunningTask, program,
};

use super::btf::{Btf, BtfError};
use super::sys;

/// Why the accounting programs could not be loaded, attached or read. [`describe`] gives the
/// one line an operator reads (the error, its sources and the likely cause).
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("this governor binary was built without the eBPF programs: {}", env!("GOVERNOR_EBPF_MISSING"))]
    NotBuilt,
    #[error("eBPF disabled by {0}")]
    Disabled(String),
    #[error("{} is not a cgroup v2 mount (the programs key usage by v2 cgroup id)", .0.display())]
    NotCgroup2(std::path::PathBuf),
    #[error("cannot stat the cgroup root {}", .path.display())]
    CgroupRoot {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no usable kernel BTF; the program needs it to find the task and cgroup fields")]
    KernelBtf(#[source] BtfError),
    #[error("kernel BTF lacks a field the program reads")]
    MissingField(#[source] BtfError),
    #[error("aya cannot parse the kernel BTF")]
    AyaBtf(#[source] aya::BtfError),
    #[error("loading the eBPF object failed")]
    Load(#[source] aya::EbpfError),
    #[error("the eBPF object has no program {0}")]
    NoProgram(&'static str),
    #[error("{0} has an unexpected program type")]
    ProgramType(&'static str),
    #[error("{program}")]
    Program {
        program: &'static str,
        #[source]
        source: aya::programs::ProgramError,
    },
    #[error("attaching to sched_switch failed ({})", attach_failures(.0))]
    Attach(Vec<(AttachKind, EbpfError)>),
    #[error("the eBPF object has no map {0}")]
    NoMap(String),
    #[error("eBPF map {name}")]
    Map {
        name: String,
        #[source]
        source: MapError,
    },
    #[error("counting the possible CPUs ({what})")]
    PossibleCpus {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn attach_failures(failures: &[(AttachKind, EbpfError)]) -> String {
    failures
        .iter()
        .map(|(kind, e)| format!("{}: {}", kind.as_str(), error_chain(e)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn map_error(name: &str) -> impl FnOnce(MapError) -> EbpfError + '_ {
    move |source| EbpfError::Map {
        name: name.to_owned(),
        source,
    }
}

/// The error on one line with its sources, and the likely cause where operators often meet it.
pub(super) fn describe(e: &EbpfError) -> String {
    explain(&error_chain(e))
}

/// The programs, built by `build.rs` (empty when it built without them; `GOVERNOR_EBPF_MISSING`
/// says why).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/governor-ebpf"));

/// Which flavour of the program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachKind {
    /// BTF tracepoint (`tp_btf`): typed arguments, direct field loads.
    Btf,
    /// Raw tracepoint (`raw_tp`): `bpf_probe_read_kernel` for the fields.
    Raw,
}

impl AttachKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachKind::Btf => "tp_btf",
            AttachKind::Raw => "raw_tp",
        }
    }
}

/// Which flavour to try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachMode {
    /// The BTF tracepoint, the raw tracepoint if that fails.
    #[default]
    Auto,
    /// Only the BTF tracepoint.
    Btf,
    /// Only the raw tracepoint.
    Raw,
}

/// Userspace handles on the programs' maps.
pub(super) struct Maps {
    stats: PerCpuHashMap<MapData, u64, CgroupCpuStats>,
    /// The stats map's descriptor, for batched reads (`None`: the kernel has no batch lookup,
    /// entries are read one by one).
    stats_fd: Option<std::os::fd::OwnedFd>,
    /// Cleared once the kernel refuses a batched read (then never tried again).
    batch_reads: std::cell::Cell<bool>,
    possible_cpus: usize,
    parents: BpfHashMap<MapData, u64, u64>,
    running: PerCpuArray<MapData, RunningTask>,
    counters: PerCpuArray<MapData, ProgramCounters>,
}

/// One read of the maps.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    /// Per cgroup id, summed over CPUs, without the slices in flight.
    pub stats: HashMap<u64, CgroupCpuStats>,
    /// The task on each CPU (read after `stats`).
    pub running: Vec<RunningTask>,
}

impl Maps {
    fn from_maps(stats: Map, parents: Map, running: Map, counters: Map) -> Result<Maps, EbpfError> {
        let stats_fd = match &stats {
            Map::PerCpuHashMap(data) => data.fd().as_fd().try_clone_to_owned().ok(),
            _ => None,
        };
        let possible_cpus =
            aya::util::nr_cpus().map_err(|(what, source)| EbpfError::PossibleCpus {
                what: what.to_owned(),
                source,
            })?;
        Ok(Maps {
            batch_reads: std::cell::Cell::new(stats_fd.is_some()),
            stats_fd,
            possible_cpus,
            stats: stats.try_into().map_err(map_error(CGROUP_CPU_MAP))?,
            parents: parents.try_into().map_err(map_error(CGROUP_PARENT_MAP))?,
            running: running.try_into().map_err(map_error(RUNNING_MAP))?,
            counters: counters.try_into().map_err(map_error(COUNTERS_MAP))?,
        })
    }

    /// Reads every cgroup's counters, then the running slots. In this order nothing is counted
    /// twice: a slot read as "task X since its totals were T" means X's slice from T had not
    /// ended when the slots were read, so it was not in the counters read before; a slice that
    /// ends in between is missing from this read only (the next one has it).
    pub(super) fn snapshot(&self) -> Result<Snapshot, EbpfError> {
        let stats = match self.batched_stats() {
            Some(stats) => stats,
            None => self.stats_one_by_one()?,
        };
        let running = self.running.get(&0, 0).map_err(map_error(RUNNING_MAP))?;
        Ok(Snapshot {
            stats,
            running: running.iter().copied().collect(),
        })
    }

    /// Every entry in a few batched syscalls; `None` where the kernel cannot (then never again).
    fn batched_stats(&self) -> Option<HashMap<u64, CgroupCpuStats>> {
        if !self.batch_reads.get() {
            return None;
        }
        let fd = self.stats_fd.as_ref()?.as_fd();
        let stride = size_of::<CgroupCpuStats>().next_multiple_of(8);
        let per_key = stride * self.possible_cpus;
        match sys::lookup_batch_u64_keys(fd, per_key) {
            Ok((keys, values)) => Some(
                keys.iter()
                    .zip(values.chunks_exact(per_key))
                    .map(|(&id, per_cpu)| {
                        let sum = per_cpu
                            .chunks_exact(stride)
                            .fold(CgroupCpuStats::default(), |acc, v| {
                                acc.add(sys::read_cpu_stats(v))
                            });
                        (id, sum)
                    })
                    .collect(),
            ),
            Err(e) => {
                tracing::debug!(error = %e, "batched map reads unavailable; reading entries one by one");
                self.batch_reads.set(false);
                None
            }
        }
    }

    fn stats_one_by_one(&self) -> Result<HashMap<u64, CgroupCpuStats>, EbpfError> {
        let mut stats = HashMap::new();
        for item in self.stats.iter() {
            let (id, per_cpu) = item.map_err(map_error(CGROUP_CPU_MAP))?;
            let sum = per_cpu
                .iter()
                .fold(CgroupCpuStats::default(), |acc, v| acc.add(*v));
            stats.insert(id, sum);
        }
        Ok(stats)
    }

    /// Cgroup ids that have an entry.
    pub(super) fn ids(&self) -> Vec<u64> {
        self.stats.keys().filter_map(Result::ok).collect()
    }

    /// The parent the programs recorded for a cgroup.
    pub(super) fn parent_of(&self, id: u64) -> Option<u64> {
        self.parents.get(&id, 0).ok()
    }

    /// Deletes the entries of a cgroup (gone ones).
    pub(super) fn remove(&mut self, id: u64) -> Result<(), EbpfError> {
        let not_found = |r: Result<(), MapError>| match r {
            Err(MapError::KeyNotFound) => Ok(()),
            other => other,
        };
        not_found(self.parents.remove(&id)).map_err(map_error(CGROUP_PARENT_MAP))?;
        not_found(self.stats.remove(&id)).map_err(map_error(CGROUP_CPU_MAP))
    }

    /// The programs' error counters, summed over CPUs.
    pub(super) fn counters(&self) -> Option<ProgramCounters> {
        let per_cpu = self.counters.get(&0, 0).ok()?;
        Some(
            per_cpu
                .iter()
                .fold(ProgramCounters::default(), |a, c| ProgramCounters {
                    stats_map_full: a.stats_map_full + c.stats_map_full,
                    kernel_read_failed: a.kernel_read_failed + c.kernel_read_failed,
                    unknown_slice: a.unknown_slice + c.unknown_slice,
                }),
        )
    }
}

/// What `load` needs to know.
#[derive(Clone, Debug)]
pub(super) struct LoadOptions<'a> {
    pub attach: AttachMode,
    pub run_queue_wait: bool,
    pub btf_path: &'a Path,
}

/// Programs loaded and attached by this process; detached when dropped.
pub(super) struct Loaded {
    pub kind: AttachKind,
    pub run_queue_wait: bool,
    /// Kernel id of the attached program (for the kernel's run-time statistics).
    pub program_id: u32,
    // Dropped after the log pump (field order): the pump owns a map of this object.
    _log: Option<LogPump>,
    _ebpf: Ebpf,
}

/// Loads the object and attaches the `sched_switch` program ([`describe`] says why not, for the
/// operator).
pub(super) fn load(opts: &LoadOptions<'_>) -> Result<(Maps, Loaded), EbpfError> {
    if OBJECT.is_empty() {
        return Err(EbpfError::NotBuilt);
    }
    let btf = Btf::from_file(opts.btf_path).map_err(EbpfError::KernelBtf)?;
    let (mut config, has_run_delay) = btf.program_offsets().map_err(EbpfError::MissingField)?;
    drop(btf);
    let run_queue_wait = opts.run_queue_wait && has_run_delay;
    if opts.run_queue_wait && !has_run_delay {
        tracing::warn!(
            "this kernel keeps no sched_info (CONFIG_SCHED_INFO off): run-queue wait is not measured"
        );
    }
    if run_queue_wait {
        config.flags |= CONFIG_TRACK_RUN_QUEUE_WAIT;
    }
    let aya_btf = aya::Btf::parse_file(opts.btf_path, aya::Endianness::default())
        .map_err(EbpfError::AyaBtf)?;

    let mut ebpf = EbpfLoader::new()
        .btf(Some(&aya_btf))
        .override_global(CONFIG_GLOBAL, &config, true)
        .load(OBJECT)
        .map_err(EbpfError::Load)?;

    let kinds: &[AttachKind] = match opts.attach {
        AttachMode::Auto => &[AttachKind::Btf, AttachKind::Raw],
        AttachMode::Btf => &[AttachKind::Btf],
        AttachMode::Raw => &[AttachKind::Raw],
    };
    let mut failures = Vec::new();
    let mut attached = None;
    for &kind in kinds {
        match attach(&mut ebpf, &aya_btf, kind) {
            Ok(id) => {
                attached = Some((kind, id));
                break;
            }
            Err(e) => {
                tracing::debug!(kind = kind.as_str(), error = %error_chain(&e), "eBPF attach failed");
                failures.push((kind, e));
            }
        }
    }
    let Some((kind, program_id)) = attached else {
        return Err(EbpfError::Attach(failures));
    };

    match super::sys::switch_every_cpu_once() {
        Ok(cpus) => tracing::debug!(cpus, "switched every CPU once after the attach"),
        Err(e) => tracing::debug!(error = %e, "cannot switch every CPU after the attach"),
    }

    let log = match aya_log::EbpfLogger::init_with_logger(&mut ebpf, TracingLog) {
        Ok(logger) => LogPump::start(logger)
            .map_err(|e| tracing::warn!(error = %e, "cannot start the eBPF log reader"))
            .ok(),
        Err(e) => {
            tracing::warn!(error = %error_chain(&e), "eBPF log output unavailable");
            None
        }
    };

    let take = |ebpf: &mut Ebpf, name: &str| {
        ebpf.take_map(name)
            .ok_or_else(|| EbpfError::NoMap(name.to_owned()))
    };
    let maps = Maps::from_maps(
        take(&mut ebpf, CGROUP_CPU_MAP)?,
        take(&mut ebpf, CGROUP_PARENT_MAP)?,
        take(&mut ebpf, RUNNING_MAP)?,
        take(&mut ebpf, COUNTERS_MAP)?,
    )?;
    Ok((
        maps,
        Loaded {
            kind,
            run_queue_wait,
            program_id,
            _log: log,
            _ebpf: ebpf,
        },
    ))
}

/// The program of a kind.
fn program_name(kind: AttachKind) -> &'static str {
    match kind {
        AttachKind::Btf => program::SWITCH_BTF,
        AttachKind::Raw => program::SWITCH_RAW,
    }
}

/// Loads and attaches the program of `kind` to `sched_switch`; returns its kernel id.
fn attach(ebpf: &mut Ebpf, btf: &aya::Btf, kind: AttachKind) -> Result<u32, EbpfError> {
    let name = program_name(kind);
    let program_error = |source| EbpfError::Program {
        program: name,
        source,
    };
    match (kind, ebpf.program_mut(name)) {
        (AttachKind::Btf, Some(Program::BtfTracePoint(p))) => {
            attach_btf(p, btf, "sched_switch").map_err(program_error)
        }
        (AttachKind::Raw, Some(Program::RawTracePoint(p))) => {
            attach_raw(p, "sched_switch").map_err(program_error)
        }
        (_, None) => Err(EbpfError::NoProgram(name)),
        _ => Err(EbpfError::ProgramType(name)),
    }
}

fn attach_btf(
    p: &mut BtfTracePoint,
    btf: &aya::Btf,
    tracepoint: &str,
) -> Result<u32, aya::programs::ProgramError> {
    p.load(tracepoint, btf)?;
    p.attach()?;
    Ok(p.info()?.id())
}

fn attach_raw(p: &mut RawTracePoint, tracepoint: &str) -> Result<u32, aya::programs::ProgramError> {
    p.load()?;
    p.attach(tracepoint)?;
    Ok(p.info()?.id())
}

/// The maps of accounting programs another process (the daemon) has attached, found through
/// the kernel's list of loaded programs. `None` when no such program is loaded.
pub(super) fn open_running() -> Result<Option<(Maps, AttachKind, u32)>, EbpfError> {
    let mut best: Option<(std::time::SystemTime, u32, AttachKind, Vec<u32>)> = None;
    for info in loaded_programs().filter_map(Result::ok) {
        let kind = match info.name_as_str() {
            Some(program::SWITCH_BTF) => AttachKind::Btf,
            Some(program::SWITCH_RAW) => AttachKind::Raw,
            _ => continue,
        };
        let Ok(Some(map_ids)) = info.map_ids() else {
            continue;
        };
        let loaded_at = info.loaded_at().unwrap_or(std::time::UNIX_EPOCH);
        if best.as_ref().is_none_or(|b| loaded_at >= b.0) {
            best = Some((loaded_at, info.id(), kind, map_ids));
        }
    }
    let Some((_, prog_id, kind, map_ids)) = best else {
        return Ok(None);
    };
    let mut found: HashMap<String, Map> = HashMap::new();
    for id in map_ids {
        let Ok(info) = MapInfo::from_id(id) else {
            continue;
        };
        let Some(name) = info.name_as_str().map(str::to_owned) else {
            continue;
        };
        if [CGROUP_CPU_MAP, CGROUP_PARENT_MAP, RUNNING_MAP, COUNTERS_MAP].contains(&name.as_str()) {
            let data = MapData::from_id(id).map_err(map_error(&name))?;
            let map = Map::from_map_data(data).map_err(map_error(&name))?;
            found.insert(name, map);
        }
    }
    let mut take = |name: &str| {
        found
            .remove(name)
            .ok_or_else(|| EbpfError::NoMap(format!("{name} (program {prog_id})")))
    };
    let maps = Maps::from_maps(
        take(CGROUP_CPU_MAP)?,
        take(CGROUP_PARENT_MAP)?,
        take(RUNNING_MAP)?,
        take(COUNTERS_MAP)?,
    )?;
    Ok(Some((maps, kind, prog_id)))
}

/// An error and its sources on one line (aya's errors keep the errno in their sources).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        let t = src.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = src.source();
    }
    one_line(&s, 900)
}

/// Collapses whitespace (verifier logs are multi-line) and bounds the length, keeping the start
/// (what failed) and the end (a verifier log ends with the reason).
fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.len() <= max {
        return flat;
    }
    let head_len = max / 3;
    let mut head = head_len;
    while !flat.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = flat.len() - (max - head_len);
    while !flat.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{} ... {}", &flat[..head], &flat[tail..])
}

/// Adds the likely cause to errors operators see often.
fn explain(msg: &str) -> String {
    let lower = msg.to_ascii_lowercase();
    if lower.contains("operation not permitted") {
        format!(
            "{msg} (eBPF needs root or CAP_BPF + CAP_PERFMON, and a kernel not locked down against BPF)"
        )
    } else {
        msg.to_owned()
    }
}

/// Forwards aya-log records from the kernel into tracing (target `governor::ebpf`).
struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let msg = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "governor::ebpf", "{msg}"),
            log::Level::Warn => tracing::warn!(target: "governor::ebpf", "{msg}"),
            log::Level::Info => tracing::info!(target: "governor::ebpf", "{msg}"),
            log::Level::Debug => tracing::debug!(target: "governor::ebpf", "{msg}"),
            log::Level::Trace => tracing::trace!(target: "governor::ebpf", "{msg}"),
        }
    }

    fn flush(&self) {}
}

/// A thread that drains the programs' log ring buffer into tracing until dropped.
struct LogPump {
    wake: std::io::PipeWriter,
    thread: Option<JoinHandle<()>>,
}

impl LogPump {
    fn start(mut logger: aya_log::EbpfLogger<TracingLog>) -> std::io::Result<LogPump> {
        let (wake_r, wake) = std::io::pipe()?;
        let thread = std::thread::Builder::new()
            .name("ebpf-log".into())
            .spawn(move || {
                loop {
                    let stop = sys::wait_readable(logger.as_fd(), wake_r.as_fd(), 1_000);
                    logger.flush();
                    if stop {
                        break;
                    }
                }
            })?;
        Ok(LogPump {
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for LogPump {
    fn drop(&mut self) {
        let _ = self.wake.write_all(b"x");
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_flattens_and_bounds() {
        assert_eq!(one_line("a\n  b\tc", 100), "a b c");
        let long = format!("start{}end", "x".repeat(1000));
        let short = one_line(&long, 30);
        assert!(
            short.starts_with("start") && short.ends_with("xxend"),
            "{short}"
        );
        assert!(short.len() <= 35, "{short}");
    }

    #[test]
    fn permission_errors_get_a_hint() {
        assert!(explain("bpf_prog_load: Operation not permitted (os error 1)").contains("CAP_BPF"));
        assert_eq!(explain("verifier said no"), "verifier said no");
    }

    /// Needs root (it loads the program), like the host tests of `tests/`.
    #[test]
    #[ignore = "root-host: loads eBPF programs into the host kernel (root, BTF); `cargo xtask test` runs it where it can"]
    fn root_host_ebpf_batched_reads_match_entry_by_entry_reads() {
        let btf = std::path::PathBuf::from(super::super::KERNEL_BTF);
        let (mut maps, _loaded) = load(&LoadOptions {
            attach: AttachMode::Auto,
            run_queue_wait: true,
            btf_path: &btf,
        })
        .unwrap_or_else(|e| panic!("the program must load on the host (as root): {e}"));
        // More entries than one batch holds, with a different value on every CPU. The program
        // only charges real cgroup ids; these are far above any.
        let cpus = maps.possible_cpus;
        for i in 0..700u64 {
            let values: Vec<CgroupCpuStats> = (0..cpus as u64)
                .map(|c| CgroupCpuStats {
                    on_cpu_ns: i * 1000 + c,
                    run_queue_wait_ns: i,
                    context_switches: c + 1,
                })
                .collect();
            maps.stats
                .insert(
                    (1 << 60) + i,
                    aya::maps::PerCpuValues::try_from(values).unwrap(),
                    0,
                )
                .unwrap();
        }
        let batched = maps
            .batched_stats()
            .expect("BPF_MAP_LOOKUP_BATCH works on 6.18");
        let one_by_one = maps.stats_one_by_one().unwrap();
        for i in 0..700u64 {
            let id = (1 << 60) + i;
            let n = cpus as u64;
            let want = CgroupCpuStats {
                on_cpu_ns: n * i * 1000 + n * (n - 1) / 2,
                run_queue_wait_ns: n * i,
                context_switches: n * (n + 1) / 2,
            };
            assert_eq!(batched.get(&id), Some(&want), "batched read of {id}");
            assert_eq!(one_by_one.get(&id), Some(&want), "entry read of {id}");
        }
    }

    #[test]
    fn each_kind_has_its_program() {
        assert_eq!(program_name(AttachKind::Btf), program::SWITCH_BTF);
        assert_eq!(program_name(AttachKind::Raw), program::SWITCH_RAW);
    }
}
