//! GPU governance: which governed job uses which GPU, each GPU's energy split among its jobs,
//! and (opt-in, `[gpu] govern = true`) its power limit by the learning stage of its jobs
//! ([`governor_policy::gpu_power`]).
//!
//! The guarantees are the cgroup actuator's, for devices:
//! - **Originals first.** Before a GPU's power limit is first changed, its value is recorded in
//!   the GPU journal (`gpu-state.json` beside the state file, written atomically) and only then
//!   set. The original goes back when the GPU has no governed job left, when the daemon stops,
//!   and on the next start after a crash (the journal is read at start).
//! - **Someone else's change wins.** A limit found different from the one the governor set
//!   (`nvidia-smi -pl`, another agent) is logged once and adopted as the new original: it is
//!   what the governor restores from then on.
//! - **Refusals stop governance of that GPU.** `NO_PERMISSION` or `NOT_SUPPORTED` on a setting
//!   is reported once; the GPU is then only read (its note in `governor status` says why).
//! - **MIG** devices are read and left alone.
//!
//! A job is found on a GPU through its compute processes: NVML's pids, mapped to the job whose
//! cgroup holds them (`/proc/PID/cgroup`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use governor_policy::Category;
use governor_policy::gpu_power::{
    GpuPowerParams, LimitSearch, PowerRange, SearchState, target_limit,
};
use governor_proto::control_socket::GpuStatus;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::device::{GpuDevices, GpuError, Snapshot};

/// The journal's file name, beside the cgroup state file.
pub const JOURNAL_FILE_NAME: &str = "gpu-state.json";

/// A governed job as the GPU governor needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuJob {
    pub name: String,
    /// Its cgroup, relative to the cgroup root (as `governor status` shows it).
    pub cgroup: String,
    pub category: Category,
    /// Log records so far, and when the latest arrived (seconds, the governor's clock): its
    /// pace, for the power-limit search.
    pub records: u64,
    pub last_record_at: Option<f64>,
}

/// What the governor knows of one job's GPU use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobGpuUse {
    pub gpus: Vec<u32>,
    pub memory_bytes: u64,
    pub energy_joules: f64,
    /// Its share of its GPUs' utilisation (percent points summed over its GPUs) and power
    /// draw: a shared GPU's split by the jobs' GPU memory, as its energy.
    pub utilization_percent: f64,
    pub power_watts: f64,
}

/// One changed device: the limit to put back, and the one the governor set; or (`locked_mhz`)
/// the clock the governor locked, to be unlocked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Original {
    index: u32,
    original_mw: u32,
    set_mw: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    locked_mhz: Option<u32>,
}

/// What the governor changes on a GPU whose jobs stopped learning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// Its power limit (NVML `SetPowerManagementLimit`).
    #[default]
    Power,
    /// Its graphics clock, locked at the same fraction of its maximum (NVML
    /// `SetGpuLockedClocks`), unlocked to restore. NVML cannot read a lock back, so a lock
    /// someone else changes is not detected: the journal's is what is undone.
    Clocks,
}

/// A locked clock never goes below this fraction of the maximum.
const MIN_CLOCK_FRACTION: f64 = 0.3;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Journal {
    /// By device UUID.
    devices: BTreeMap<String, Original>,
}

/// The node's GPUs under the governor.
pub struct GpuGovernor {
    devices: Box<dyn GpuDevices>,
    govern: bool,
    params: GpuPowerParams,
    journal_path: PathBuf,
    journal: Journal,
    proc_root: PathBuf,
    /// Devices no longer governed, and why (by UUID).
    stopped: HashMap<String, String>,
    /// Problems already logged (logged once each).
    logged: HashSet<String>,
    /// Last energy reading per device (UUID), millijoules; and the first (for the status).
    last_energy: HashMap<String, u64>,
    first_energy: HashMap<String, u64>,
    jobs: BTreeMap<String, JobGpuUse>,
    status: Vec<GpuStatus>,
    /// Zeus's search per GPU (UUID) for its one job that stopped learning (`None`: the fixed
    /// fractions only).
    slowdown: Option<f64>,
    searches: HashMap<String, (String, LimitSearch)>,
    mechanism: Mechanism,
}

impl GpuGovernor {
    /// A governor over `devices`; restores what a previous run left in the journal.
    pub fn new(
        devices: Box<dyn GpuDevices>,
        govern: bool,
        params: GpuPowerParams,
        journal_path: PathBuf,
    ) -> GpuGovernor {
        crate::sys::durable::sweep_temporaries(&journal_path);
        let journal = match fs::read_to_string(&journal_path) {
            Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
                warn!(path = %journal_path.display(), error = %e, "GPU journal unreadable: power limits a previous run changed cannot be restored");
                Journal::default()
            }),
            Err(_) => Journal::default(),
        };
        let mut g = GpuGovernor {
            devices,
            govern,
            params,
            journal_path,
            journal,
            proc_root: PathBuf::from("/proc"),
            stopped: HashMap::new(),
            logged: HashSet::new(),
            last_energy: HashMap::new(),
            first_energy: HashMap::new(),
            jobs: BTreeMap::new(),
            status: Vec::new(),
            slowdown: None,
            searches: HashMap::new(),
            mechanism: Mechanism::Power,
        };
        if !g.journal.devices.is_empty() {
            let n = g.journal.devices.len();
            let restored = g.restore_all();
            warn!(
                devices = n,
                restored,
                "restored GPU power limits and clocks left by a previous run that did not stop cleanly"
            );
        }
        g
    }

    /// Search each GPU's limit within `slowdown` (Zeus) where one job that stopped learning
    /// runs on it and its log gives a pace.
    pub fn with_search(mut self, slowdown: f64) -> Self {
        self.slowdown = Some(slowdown);
        self
    }

    /// Lock clocks instead of lowering power limits.
    pub fn with_mechanism(mut self, mechanism: Mechanism) -> Self {
        self.mechanism = mechanism;
        self
    }

    /// Read `/proc` elsewhere (tests).
    pub fn with_proc_root(mut self, root: PathBuf) -> Self {
        self.proc_root = root;
        self
    }

    /// The GPUs as last read.
    pub fn status(&self) -> &[GpuStatus] {
        &self.status
    }

    /// A job's GPU use, if it has any.
    pub fn job(&self, name: &str) -> Option<&JobGpuUse> {
        self.jobs.get(name)
    }

    fn log_once(&mut self, key: String, f: impl FnOnce()) {
        if self.logged.insert(key) {
            f();
        }
    }

    /// One round: read every device, attribute its processes and energy to jobs, and (when
    /// governing) set its power limit by its jobs' stages.
    pub fn step(&mut self, now: f64, jobs: &[GpuJob]) {
        let count = match self.devices.count() {
            Ok(c) => c,
            Err(e) => {
                self.log_once(
                    "count".into(),
                    || warn!(error = %e, "NVML cannot count the GPUs"),
                );
                return;
            }
        };
        let mut status = Vec::new();
        let mut uses: BTreeMap<String, JobGpuUse> = BTreeMap::new();
        for index in 0..count {
            let snap = match self.devices.snapshot(index) {
                Ok(s) => s,
                Err(e) => {
                    self.log_once(format!("read {index}"), || {
                        warn!(gpu = index, error = %e, "NVML cannot read a GPU; it is skipped");
                    });
                    continue;
                }
            };
            // Who is on it: job index -> GPU memory.
            let mut here: BTreeMap<usize, u64> = BTreeMap::new();
            for &(pid, bytes) in &snap.processes {
                if let Some(j) = job_of_pid(&self.proc_root, pid, jobs) {
                    *here.entry(j).or_default() += bytes;
                }
            }
            // Energy since the last round, split by GPU memory (equally if none is known).
            let delta_mj = snap.energy_mj.map_or(0, |now| {
                let last = self.last_energy.insert(snap.uuid.clone(), now);
                self.first_energy.entry(snap.uuid.clone()).or_insert(now);
                last.map_or(0, |l| now.saturating_sub(l))
            });
            let total_mem: u64 = here.values().sum();
            for (&j, &bytes) in &here {
                let share = if total_mem > 0 {
                    bytes as f64 / total_mem as f64
                } else {
                    1.0 / here.len() as f64
                };
                let previous = self
                    .jobs
                    .get(&jobs[j].name)
                    .map_or(0.0, |u| u.energy_joules);
                let u = uses
                    .entry(jobs[j].name.clone())
                    .or_insert_with(|| JobGpuUse {
                        energy_joules: previous,
                        ..JobGpuUse::default()
                    });
                u.gpus.push(index);
                u.memory_bytes += bytes;
                u.energy_joules += share * delta_mj as f64 / 1000.0;
                u.utilization_percent += share * f64::from(snap.utilization_percent);
                u.power_watts += share * snap.power_mw.map_or(0.0, |p| f64::from(p) / 1000.0);
            }
            let stages: Vec<Category> = here.keys().map(|&j| jobs[j].category).collect();
            let alone = match here.keys().collect::<Vec<_>>().as_slice() {
                [j] => Some(&jobs[**j]),
                _ => None,
            };
            let mut snap = snap;
            if self.govern
                && let Some(set) = self.govern_device(now, &snap, &stages, alone)
            {
                // Its limit after this round's change (its draw shows at the next read).
                snap.limit_mw = Some(set);
            }
            status.push(GpuStatus {
                index,
                uuid: snap.uuid.clone(),
                model: snap.model.clone(),
                utilization_percent: snap.utilization_percent,
                memory_used_bytes: snap.memory_used_bytes,
                memory_total_bytes: snap.memory_total_bytes,
                power_watts: snap.power_mw.map(|p| f64::from(p) / 1000.0),
                limit_watts: snap.limit_mw.map(|p| f64::from(p) / 1000.0),
                original_limit_watts: self
                    .journal
                    .devices
                    .get(&snap.uuid)
                    .map(|o| f64::from(o.original_mw) / 1000.0),
                energy_joules: snap.energy_mj.and_then(|now| {
                    let first = self.first_energy.get(&snap.uuid)?;
                    Some(now.saturating_sub(*first) as f64 / 1000.0)
                }),
                jobs: here.keys().map(|&j| jobs[j].name.clone()).collect(),
                note: if snap.mig {
                    Some("MIG mode: read only, never governed".into())
                } else {
                    self.stopped.get(&snap.uuid).cloned()
                },
            });
        }
        self.jobs = uses;
        self.status = status;
    }

    /// The limit Zeus's search asks for, if it applies: one job on the GPU, stopped learning,
    /// with a pace to measure.
    fn searched_limit(
        &mut self,
        now: f64,
        snap: &Snapshot,
        range: PowerRange,
        current: u32,
        job: Option<&GpuJob>,
    ) -> Option<u32> {
        let slowdown = self.slowdown?;
        let job = job.filter(|j| matches!(j.category, Category::Watching | Category::Converged));
        let Some(job) = job else {
            self.searches.remove(&snap.uuid);
            return None;
        };
        let last = job.last_record_at?;
        let entry = self
            .searches
            .entry(snap.uuid.clone())
            .or_insert_with(|| (job.name.clone(), LimitSearch::new(range, slowdown)));
        if entry.0 != job.name {
            *entry = (job.name.clone(), LimitSearch::new(range, slowdown));
        }
        match entry.1.observe(now, current, job.records, last) {
            SearchState::Trying(l) | SearchState::Settled(l) => Some(l),
            SearchState::NoSignal => None,
        }
    }

    fn govern_device(
        &mut self,
        now: f64,
        snap: &Snapshot,
        stages: &[Category],
        alone: Option<&GpuJob>,
    ) -> Option<u32> {
        if snap.mig || self.stopped.contains_key(&snap.uuid) {
            return None;
        }
        if self.mechanism == Mechanism::Clocks {
            // The snapshot shows nothing of a clock lock.
            self.govern_clocks(snap, stages);
            return None;
        }
        let current = snap.limit_mw?;
        if let Some(o) = self.journal.devices.get(&snap.uuid).cloned()
            && o.set_mw != current
        {
            // Someone else set it: theirs is the limit to restore from now on.
            warn!(gpu = snap.index, uuid = %snap.uuid, set_w = f64::from(o.set_mw) / 1000.0, found_w = f64::from(current) / 1000.0, "a GPU's power limit was changed by someone else; adopted as its original");
            let o = Original {
                original_mw: current,
                set_mw: current,
                ..o
            };
            self.journal.devices.insert(snap.uuid.clone(), o);
            self.save_journal();
        }
        let original = self
            .journal
            .devices
            .get(&snap.uuid)
            .map_or(current, |o| o.original_mw);
        let range = PowerRange {
            min_mw: snap.min_limit_mw.unwrap_or(0),
            default_mw: snap.default_limit_mw.unwrap_or(original),
            original_mw: original,
        };
        let target = match self.searched_limit(now, snap, range, current, alone) {
            Some(l) => l,
            None => target_limit(range, stages, self.params).unwrap_or(original),
        };
        if target == current {
            if target == original && self.journal.devices.remove(&snap.uuid).is_some() {
                self.save_journal();
            }
            return None;
        }
        if !self.journal.devices.contains_key(&snap.uuid) {
            // Recorded (and on disk) before the first change.
            self.journal.devices.insert(
                snap.uuid.clone(),
                Original {
                    index: snap.index,
                    original_mw: current,
                    set_mw: current,
                    locked_mhz: None,
                },
            );
            if !self.save_journal() {
                self.journal.devices.remove(&snap.uuid);
                return None;
            }
        }
        match self.devices.set_power_limit(snap.index, target) {
            Ok(()) => {
                info!(gpu = snap.index, uuid = %snap.uuid, from_w = f64::from(current) / 1000.0, to_w = f64::from(target) / 1000.0, stages = ?stages, "GPU power limit set by its jobs' learning stage");
                if target == original {
                    self.journal.devices.remove(&snap.uuid);
                } else if let Some(o) = self.journal.devices.get_mut(&snap.uuid) {
                    o.set_mw = target;
                }
                self.save_journal();
                Some(target)
            }
            Err(e) => {
                self.stop(snap, stop_reason(&e, "set its power limit"));
                if self
                    .journal
                    .devices
                    .get(&snap.uuid)
                    .is_some_and(|o| o.set_mw == o.original_mw)
                {
                    self.journal.devices.remove(&snap.uuid);
                    self.save_journal();
                }
                None
            }
        }
    }

    /// Locked clocks: the stage's fraction of the maximum graphics clock (at least 30% of it),
    /// unlocked while a job learns.
    fn govern_clocks(&mut self, snap: &Snapshot, stages: &[Category]) {
        let Some(max) = snap.max_clock_mhz else {
            self.stop(
                snap,
                "governance stopped: NVML gives no maximum clock to lock at".into(),
            );
            return;
        };
        let scale = 1_000_000u32;
        let range = PowerRange {
            min_mw: (MIN_CLOCK_FRACTION * f64::from(scale)) as u32,
            default_mw: scale,
            original_mw: scale,
        };
        let fraction = target_limit(range, stages, self.params)
            .map_or(1.0, |t| f64::from(t) / f64::from(scale));
        let wanted = (fraction < 1.0).then(|| (fraction * f64::from(max)).round() as u32);
        let locked = self
            .journal
            .devices
            .get(&snap.uuid)
            .and_then(|o| o.locked_mhz);
        if wanted == locked {
            return;
        }
        if let Some(mhz) = wanted {
            // Recorded before the lock.
            self.journal.devices.insert(
                snap.uuid.clone(),
                Original {
                    index: snap.index,
                    original_mw: 0,
                    set_mw: 0,
                    locked_mhz: Some(mhz),
                },
            );
            if !self.save_journal() {
                self.journal.devices.remove(&snap.uuid);
                return;
            }
        }
        match self.devices.lock_clocks(snap.index, wanted) {
            Ok(()) => {
                info!(gpu = snap.index, uuid = %snap.uuid, locked_mhz = ?wanted, stages = ?stages, "GPU clock set by its jobs' learning stage");
                if wanted.is_none() {
                    self.journal.devices.remove(&snap.uuid);
                    self.save_journal();
                }
            }
            Err(e) => {
                // Nothing changed: forget the record written for it.
                if locked.is_none() {
                    self.journal.devices.remove(&snap.uuid);
                } else if let Some(o) = self.journal.devices.get_mut(&snap.uuid) {
                    o.locked_mhz = locked;
                }
                self.save_journal();
                self.stop(snap, stop_reason(&e, "lock its clocks"));
            }
        }
    }

    fn stop(&mut self, snap: &Snapshot, why: String) {
        if !self.stopped.contains_key(&snap.uuid) {
            warn!(gpu = snap.index, uuid = %snap.uuid, reason = %why, "GPU no longer governed");
            self.stopped.insert(snap.uuid.clone(), why);
        }
    }

    /// Put every changed limit back (the daemon stops, or a previous run left them). A limit
    /// someone else changed since is left as they set it. Returns how many were restored.
    pub fn restore_all(&mut self) -> usize {
        let mut restored = 0;
        let entries: Vec<(String, Original)> = std::mem::take(&mut self.journal.devices)
            .into_iter()
            .collect();
        let mut kept = BTreeMap::new();
        for (uuid, o) in entries {
            if o.locked_mhz.is_some() {
                match self.devices.lock_clocks(o.index, None) {
                    Ok(()) => {
                        info!(gpu = o.index, uuid = %uuid, "GPU clocks unlocked");
                        restored += 1;
                    }
                    Err(e) => {
                        warn!(gpu = o.index, uuid = %uuid, error = %e, "cannot unlock a GPU's clocks; kept in the journal for the next start");
                        kept.insert(uuid, o);
                    }
                }
                continue;
            }
            let current = match self.devices.snapshot(o.index) {
                Ok(s) if s.uuid == uuid => s.limit_mw,
                Ok(_) => {
                    warn!(uuid = %uuid, index = o.index, "the GPU recorded in the journal is no longer at its index; its power limit is left alone");
                    continue;
                }
                Err(e) => {
                    warn!(uuid = %uuid, error = %e, "cannot read a GPU to restore its power limit; kept in the journal for the next start");
                    kept.insert(uuid, o);
                    continue;
                }
            };
            if current != Some(o.set_mw) {
                info!(uuid = %uuid, "a GPU's power limit was changed by someone else since; left as they set it");
                continue;
            }
            match self.devices.set_power_limit(o.index, o.original_mw) {
                Ok(()) => {
                    info!(gpu = o.index, uuid = %uuid, to_w = f64::from(o.original_mw) / 1000.0, "GPU power limit restored");
                    restored += 1;
                }
                Err(e) => {
                    warn!(gpu = o.index, uuid = %uuid, error = %e, "cannot restore a GPU's power limit; kept in the journal for the next start");
                    kept.insert(uuid, o);
                }
            }
        }
        self.journal.devices = kept;
        self.save_journal();
        restored
    }

    /// Write the journal durably (removed when empty). False if it could not be written:
    /// then nothing is changed on the device.
    fn save_journal(&mut self) -> bool {
        let path = self.journal_path.clone();
        if self.journal.devices.is_empty() {
            let _ = crate::sys::durable::remove_durably(&path);
            return true;
        }
        match write_journal(&path, &self.journal) {
            Ok(()) => true,
            Err(e) => {
                self.log_once(format!("journal {}", path.display()), || {
                    warn!(path = %path.display(), error = %e, "cannot write the GPU journal: power limits are left as they are");
                });
                false
            }
        }
    }
}

/// Why governance of a GPU stopped, from the error of `what` ("set its power limit").
fn stop_reason(e: &GpuError, what: &str) -> String {
    match e {
        GpuError::NoPermission => {
            format!("governance stopped: no permission to {what} (run the daemon as root)")
        }
        GpuError::NotSupported => format!("governance stopped: the device cannot {what}"),
        GpuError::Other(m) => format!("governance stopped: trying to {what} failed: {m}"),
    }
}

fn write_journal(path: &Path, journal: &Journal) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    crate::sys::durable::write_durably(path, serde_json::to_string_pretty(journal)?.as_bytes())
}

/// The job whose cgroup holds `pid` (its `/proc/PID/cgroup` lines: the v2 line, or the v1 cpu
/// controller's, at or below the job's cgroup).
fn job_of_pid(proc_root: &Path, pid: u32, jobs: &[GpuJob]) -> Option<usize> {
    let text = fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if !(controllers.is_empty() || controllers.split(',').any(|c| c == "cpu")) {
            continue;
        }
        let path = path.trim_start_matches('/');
        if let Some(j) = jobs.iter().position(|job| {
            let c = job.cgroup.trim_matches('/');
            !c.is_empty() && (path == c || path.starts_with(&format!("{c}/")))
        }) {
            return Some(j);
        }
    }
    None
}

#[cfg(test)]
#[path = "governance_tests.rs"]
mod tests;
