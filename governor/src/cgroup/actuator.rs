//! The actuator: applies allocations to jobs' cgroups, records and restores original values,
//! detects and tolerates other writers, and keeps memory limits safe.
//!
//! Per job and per file ("knob") it remembers the value that is *theirs* (the original, or the
//! value someone else set later) and the value that is *ours* (what the governor last wrote).
//! A write is made only when the wanted value differs from ours (or, before our first write, from
//! theirs), no sooner than the file's minimum interval after the previous write (memory limits
//! that go *up* are exempt: they are how the governor gets out of a job's way), and only after the
//! original has been recorded durably in the state file.
//!
//! **Drift.** Before every write, and for every file every `drift_check_interval`, the current
//! content is compared with ours. If it differs, someone else (kubelet, `docker update`, an
//! operator) wrote it: the actuator logs it once (warn), adopts their value as the new original
//! (the orchestrator's latest intent is what a restore must bring back, not the value it had
//! before the orchestrator changed its mind), and re-applies its own value only after a back-off
//! that doubles with each episode (capped). After `drift_give_up_after` episodes in a row it stops
//! governing that file for the job and says so once. Episodes are forgotten after a quiet spell.
//!
//! **Ceilings.** With `original_limits_are_ceilings` (the default) the governor only ever tightens
//! the limits it finds: `cpu.max`/CFS quota and memory limits are never set looser than the
//! original (a pod's CPU limit or memory limit stays in force). Weights are not limits and are
//! written as the policy says.
//!
//! **Nothing changed, nothing done.** When a job's allocation (after the memory guard) is the one
//! already applied and no write is pending, `apply` returns without touching the filesystem;
//! files are re-read only by the periodic drift check. The daemon passes the usage it has just
//! read ([`Actuator::apply_with_usage`]) so that the memory guard costs no extra read either.
//!
//! The actuator never sleeps: a write held back by the rate limit or a drift back-off is reported
//! in [`ApplyOutcome::deferred_until`]; [`Actuator::next_wakeup`] says when to call
//! [`Actuator::poll`], which re-applies the last allocation of every job with something due.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::error::CgroupError;
use super::fs::{CgroupFs, CgroupUsage};
use super::guard::{GuardInput, GuardState, GuardVerdict, MemoryGuardConfig, memory_guard};
use super::hierarchy::{Controller, Hierarchy, HierarchyKind, JobCgroup};
use super::knob::{
    CFS_PERIOD_RANGE_US, Knob, KnobClass, WEIGHT_RANGE, cores_to_quota, encode_cpu_max,
    encode_memory, parse_cfs_quota, parse_cpu_max, parse_memory_limit, weight_to_shares,
};
use super::state::{DEFAULT_STATE_FILE, StateEntry, StateStore};
use crate::policy::{Allocation, CpuAllocation, MemoryAllocation};

/// Actuator settings. Durations are in milliseconds so the struct reads straight from TOML.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActuatorConfig {
    /// Where original values are recorded (default `/run/governor/state.json`).
    pub state_file: PathBuf,
    /// CFS period written with every CPU cap, in microseconds (default 100 000; 1000..=1000000).
    pub cpu_period_us: u64,
    /// Minimum time between two writes of one CPU file (default 100 ms).
    pub cpu_min_write_interval_ms: u64,
    /// Minimum time between two tightening writes of one memory file (default 1000 ms; writes
    /// that raise a memory limit are never held back).
    pub memory_min_write_interval_ms: u64,
    /// How often each governed file is re-read to detect other writers (default 5000 ms).
    pub drift_check_interval_ms: u64,
    /// First back-off before re-applying a value someone else overwrote (default 1000 ms);
    /// doubles with each episode.
    pub drift_backoff_initial_ms: u64,
    /// Longest back-off (default 300 000 ms).
    pub drift_backoff_max_ms: u64,
    /// Stop governing a file after this many overwrites in a row (default 5).
    pub drift_give_up_after: u32,
    /// Forget past overwrites after this long without one (default 600 000 ms).
    pub drift_forget_after_ms: u64,
    /// Write CPU files (default true).
    pub manage_cpu: bool,
    /// Write memory files (default true).
    pub manage_memory: bool,
    /// Never loosen a limit beyond its original value (default true; see the module doc).
    pub original_limits_are_ceilings: bool,
    /// cgroup v1: apply `max_bytes` to `memory.limit_in_bytes` (default false: v1 has no
    /// `memory.high` to throttle a growing job before the hard limit kills it, so a hard limit
    /// below the job's own is not safe there).
    pub v1_memory_limit: bool,
    /// cgroup v1: apply `high_bytes` to `memory.soft_limit_in_bytes`, the closest v1 knob
    /// (reclaim target under global memory pressure; never throttles or kills). Default true.
    pub v1_high_as_soft_limit: bool,
    /// The memory guard's tunables.
    pub memory_guard: MemoryGuardConfig,
    /// Parent of the cgroups `run-job` creates, relative to the hierarchy root
    /// (default `governor.slice/jobs`).
    pub jobs_subtree: PathBuf,
}

impl Default for ActuatorConfig {
    fn default() -> Self {
        ActuatorConfig {
            state_file: PathBuf::from(DEFAULT_STATE_FILE),
            cpu_period_us: 100_000,
            cpu_min_write_interval_ms: 100,
            memory_min_write_interval_ms: 1_000,
            drift_check_interval_ms: 5_000,
            drift_backoff_initial_ms: 1_000,
            drift_backoff_max_ms: 300_000,
            drift_give_up_after: 5,
            drift_forget_after_ms: 600_000,
            manage_cpu: true,
            manage_memory: true,
            original_limits_are_ceilings: true,
            v1_memory_limit: false,
            v1_high_as_soft_limit: true,
            memory_guard: MemoryGuardConfig::default(),
            jobs_subtree: PathBuf::from("governor.slice/jobs"),
        }
    }
}

impl ActuatorConfig {
    fn validate(&self) -> Result<(), CgroupError> {
        if !CFS_PERIOD_RANGE_US.contains(&self.cpu_period_us) {
            return Err(CgroupError::InvalidConfig {
                reason: format!(
                    "cpu_period_us = {} is outside the kernel's range {:?}",
                    self.cpu_period_us, CFS_PERIOD_RANGE_US
                ),
            });
        }
        if JobCgroup::new(&self.jobs_subtree).is_err() {
            return Err(CgroupError::InvalidConfig {
                reason: format!(
                    "jobs_subtree = {:?} must be a relative cgroup path without `..`",
                    self.jobs_subtree
                ),
            });
        }
        Ok(())
    }

    fn min_interval(&self, class: KnobClass) -> Duration {
        Duration::from_millis(match class {
            KnobClass::Cpu => self.cpu_min_write_interval_ms,
            KnobClass::Memory => self.memory_min_write_interval_ms,
        })
    }
}

/// Why a file was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteReason {
    /// The allocation asked for it.
    Apply,
    /// The original value was put back (the allocation no longer needs the file, the job was
    /// released, the memory guard backed off, or recovery after a crash).
    Restore,
}

/// One write the actuator made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    pub knob: Knob,
    pub value: String,
    pub reason: WriteReason,
}

/// What the actuator did about someone else's write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriftAction {
    /// Their value is the new original; ours is re-applied at this instant.
    ReapplyAt(Instant),
    /// Overwritten too often: the file is theirs for the rest of the job's life.
    GaveUp,
}

/// A file found changed behind the governor's back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriftEvent {
    pub knob: Knob,
    /// What the governor had written.
    pub ours: String,
    /// What the file holds now.
    pub theirs: String,
    pub action: DriftAction,
}

/// The result of one [`Actuator::apply`].
#[derive(Debug, Default)]
pub struct ApplyOutcome {
    /// Files written, in order.
    pub written: Vec<WriteRecord>,
    /// Files that needed nothing.
    pub skipped: usize,
    /// Earliest instant at which a held-back write becomes due (call [`Actuator::poll`] then).
    pub deferred_until: Option<Instant>,
    /// Other writers detected during this call.
    pub drift: Vec<DriftEvent>,
    /// The memory guard's verdict, when it ran.
    pub guard: Option<GuardVerdict>,
    /// Per-file failures (the other files were still handled). Each is logged by the actuator,
    /// once per episode.
    pub errors: Vec<CgroupError>,
}

impl ApplyOutcome {
    fn defer(&mut self, until: Instant) {
        self.deferred_until = Some(self.deferred_until.map_or(until, |d| d.min(until)));
    }
}

/// The result of [`Actuator::release`] / [`Actuator::restore_all`] / [`Actuator::recover`].
#[derive(Debug, Default)]
pub struct RestoreReport {
    /// Files put back to their original value: (job, file, value).
    pub restored: Vec<(String, Knob, String)>,
    /// Files someone else had changed since our write: their value was left in place.
    pub left_to_others: Vec<(String, Knob)>,
    /// Files whose cgroup is gone (nothing to restore) or was replaced by a new cgroup of the
    /// same name (not ours to restore).
    pub gone: Vec<(String, Knob)>,
    /// Restores that failed; their entries stay in the state file for a later attempt.
    pub errors: Vec<CgroupError>,
    /// Set by `recover` when the state file could not be read (it was set aside).
    pub corrupt_state: Option<CgroupError>,
}

/// Per job, per file memory.
#[derive(Debug)]
struct KnobState {
    knob: Knob,
    path: PathBuf,
    /// Their value: the original, or the last value someone else set (trimmed).
    theirs: Option<String>,
    /// Ours: what the governor last wrote and is in effect.
    ours: Option<String>,
    last_write_at: Option<Instant>,
    /// A write is held back until then (rate limit or drift back-off).
    deferred_until: Option<Instant>,
    /// No write before then (drift back-off).
    hold_until: Option<Instant>,
    drift_episodes: u32,
    last_drift_at: Option<Instant>,
    abandoned: bool,
    /// The file is missing (controller not enabled); skipped until the next drift check.
    unavailable: bool,
    /// The last write failed (for logging once).
    failing: bool,
    /// Its original value could not be parsed (reported once).
    bad_original_reported: bool,
}

impl KnobState {
    fn new(knob: Knob, path: PathBuf) -> KnobState {
        KnobState {
            knob,
            path,
            theirs: None,
            ours: None,
            last_write_at: None,
            deferred_until: None,
            hold_until: None,
            drift_episodes: 0,
            last_drift_at: None,
            abandoned: false,
            unavailable: false,
            failing: false,
            bad_original_reported: false,
        }
    }
}

#[derive(Debug)]
struct JobState {
    knobs: Vec<KnobState>,
    guard: GuardState,
    /// The last (cpu, memory) request, re-applied by `poll`.
    last_request: Option<(CpuAllocation, MemoryAllocation)>,
    /// The (cpu, guarded memory) last applied completely: nothing to do while it is unchanged.
    settled: Option<(CpuAllocation, MemoryAllocation)>,
    next_verify_at: Option<Instant>,
    /// The memory controller's absence was reported (once per job).
    memory_unavailable_reported: bool,
}

/// What a knob should hold.
#[derive(Debug, PartialEq, Eq)]
enum Desired {
    /// Their value (restore it if ours is in effect).
    Theirs,
    Set(String),
}

/// The parts of the actuator that per-job code borrows mutably alongside a job's state.
struct Core {
    fs: CgroupFs,
    config: ActuatorConfig,
    store: StateStore,
    /// Recorded originals by file path (the state file's content).
    records: BTreeMap<PathBuf, StateEntry>,
    /// Records left by a previous run that `recover` has not handled yet.
    leftovers: BTreeSet<PathBuf>,
}

/// Applies allocations to cgroups. One per node (it locks the state file).
pub struct Actuator {
    core: Core,
    jobs: HashMap<JobCgroup, JobState>,
    corrupt_state: Option<CgroupError>,
}

impl std::fmt::Debug for Actuator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actuator")
            .field("root", &self.core.fs.hierarchy().root())
            .field("kind", &self.core.fs.kind())
            .field("jobs", &self.jobs.len())
            .field("records", &self.core.records.len())
            .finish()
    }
}

impl Actuator {
    /// An actuator over `hierarchy`. Locks and loads the state file: entries left by a previous
    /// run are kept (and stay in the file) until [`Actuator::recover`] restores them.
    pub fn new(hierarchy: Hierarchy, config: ActuatorConfig) -> Result<Actuator, CgroupError> {
        config.validate()?;
        let (store, loaded) = StateStore::open(&config.state_file)?;
        if let Some(e) = &loaded.corrupt {
            tracing::error!(error = %e, "state file unreadable: originals from a previous run cannot be restored");
        }
        let records: BTreeMap<PathBuf, StateEntry> = loaded
            .entries
            .into_iter()
            .map(|e| (e.path.clone(), e))
            .collect();
        let leftovers = records.keys().cloned().collect();
        info!(
            root = %hierarchy.root().display(),
            kind = %hierarchy.kind(),
            state_file = %config.state_file.display(),
            leftover_entries = records.len(),
            "cgroup actuator ready"
        );
        let mut fs = CgroupFs::new(hierarchy);
        let mut job_controllers = vec![Controller::Cpu, Controller::CpuAcct, Controller::Pids];
        if config.manage_memory {
            job_controllers.push(Controller::Memory);
        }
        fs.set_job_controllers(&job_controllers);
        Ok(Actuator {
            core: Core {
                fs,
                config,
                store,
                records,
                leftovers,
            },
            jobs: HashMap::new(),
            corrupt_state: loaded.corrupt,
        })
    }

    /// The filesystem layer (usage reads, job groups).
    pub fn fs(&self) -> &CgroupFs {
        &self.core.fs
    }

    /// The configuration in use.
    pub fn config(&self) -> &ActuatorConfig {
        &self.core.config
    }

    /// Usage of a job (see [`CgroupFs::usage`]).
    pub fn usage(&self, job: &JobCgroup) -> Result<CgroupUsage, CgroupError> {
        self.core.fs.usage(job)
    }

    /// Jobs the actuator holds state for.
    pub fn jobs(&self) -> impl Iterator<Item = &JobCgroup> {
        self.jobs.keys()
    }

    /// Entries in the state file (originals recorded and not yet restored).
    pub fn recorded(&self) -> impl Iterator<Item = &StateEntry> {
        self.core.records.values()
    }

    /// Restore everything a previous run left in the state file (a crash or SIGKILL), then clear
    /// those entries. Call once at start, before the first `apply`. Entries whose cgroup is gone
    /// or was recreated are dropped; entries whose restore fails stay for `restore_all`.
    pub fn recover(&mut self) -> RestoreReport {
        let mut report = RestoreReport {
            corrupt_state: self.corrupt_state.take(),
            ..Default::default()
        };
        let leftovers: Vec<PathBuf> = std::mem::take(&mut self.core.leftovers)
            .into_iter()
            .collect();
        let mut entries: Vec<StateEntry> = leftovers
            .iter()
            .filter_map(|p| self.core.records.get(p).cloned())
            .collect();
        entries.sort_by_key(|e| (e.job.clone(), e.knob.restore_rank()));
        if !entries.is_empty() {
            info!(
                entries = entries.len(),
                "restoring cgroup values left by a previous governor run"
            );
        }
        let before = self.core.records.len();
        for entry in entries {
            self.core.restore_entry(&entry, None, &mut report);
        }
        // Failed restores stay leftovers: `restore_all` (or the next start) tries again.
        self.core.leftovers = leftovers
            .into_iter()
            .filter(|p| self.core.records.contains_key(p))
            .collect();
        self.core.persist_if_changed(before, &mut report.errors);
        report
    }

    /// Apply `alloc` to `job`, reading the memory usage the guard needs itself.
    pub fn apply(
        &mut self,
        job: &JobCgroup,
        alloc: &Allocation,
        now: Instant,
    ) -> Result<ApplyOutcome, CgroupError> {
        self.apply_parts(job, alloc.cpu, alloc.memory, None, now)
    }

    /// Apply `alloc` to `job` with a usage the caller has just read (no extra reads).
    pub fn apply_with_usage(
        &mut self,
        job: &JobCgroup,
        alloc: &Allocation,
        usage: &CgroupUsage,
        now: Instant,
    ) -> Result<ApplyOutcome, CgroupError> {
        self.apply_parts(job, alloc.cpu, alloc.memory, Some(usage), now)
    }

    /// When the next held-back write, drift re-apply, cool-down end or drift check is due.
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.jobs.values().filter_map(JobState::next_due).min()
    }

    /// Re-apply the last allocation of every job with something due at `now`. Returns each
    /// such job's outcome (a job whose cgroup vanished is forgotten and reported as an error).
    pub fn poll(&mut self, now: Instant) -> Vec<(JobCgroup, Result<ApplyOutcome, CgroupError>)> {
        let due: Vec<(JobCgroup, (CpuAllocation, MemoryAllocation))> = self
            .jobs
            .iter()
            .filter(|(_, js)| js.next_due().is_some_and(|t| t <= now))
            .filter_map(|(job, js)| Some((job.clone(), js.last_request?)))
            .collect();
        due.into_iter()
            .map(|(job, (cpu, memory))| {
                let r = self.apply_parts(&job, cpu, memory, None, now);
                (job, r)
            })
            .collect()
    }

    /// Stop governing `job`: put back the original of every file the governor changed (unless
    /// someone else changed it since), forget the job. A vanished cgroup is not an error.
    pub fn release(&mut self, job: &JobCgroup) -> RestoreReport {
        let mut report = RestoreReport::default();
        let js = self.jobs.remove(job);
        let name = job.to_string();
        let mut entries: Vec<StateEntry> = self
            .core
            .records
            .values()
            .filter(|e| e.job == name)
            .cloned()
            .collect();
        entries.sort_by_key(|e| e.knob.restore_rank());
        let before = self.core.records.len();
        for entry in entries {
            let ours = js.as_ref().and_then(|js| {
                js.knobs
                    .iter()
                    .find(|k| k.path == entry.path)
                    .and_then(|k| k.ours.clone())
            });
            self.core
                .restore_entry(&entry, ours.as_deref(), &mut report);
        }
        self.core.persist_if_changed(before, &mut report.errors);
        report
    }

    /// Restore every recorded original (all jobs, leftovers of a previous run, restores that
    /// failed earlier) and forget every job: call on shutdown and on SIGTERM. The state file is
    /// removed when everything was restored; what could not be restored stays in it for the next
    /// start's `recover`.
    pub fn restore_all(&mut self) -> RestoreReport {
        let mut report = RestoreReport::default();
        let mut jobs: Vec<JobCgroup> = self.jobs.keys().cloned().collect();
        jobs.sort();
        for job in jobs {
            let r = self.release(&job);
            report.restored.extend(r.restored);
            report.left_to_others.extend(r.left_to_others);
            report.gone.extend(r.gone);
            report.errors.extend(r.errors);
        }
        // Everything else: leftovers of a previous run and restores that failed earlier.
        report.corrupt_state = self.corrupt_state.take();
        let mut rest: Vec<StateEntry> = self.core.records.values().cloned().collect();
        rest.sort_by_key(|e| (e.job.clone(), e.knob.restore_rank()));
        let before = self.core.records.len();
        for entry in rest {
            self.core.restore_entry(&entry, None, &mut report);
        }
        self.core
            .leftovers
            .retain(|p| self.core.records.contains_key(p));
        self.core.persist_if_changed(before, &mut report.errors);
        info!(
            restored = report.restored.len(),
            left_to_others = report.left_to_others.len(),
            gone = report.gone.len(),
            failed = report.errors.len(),
            "cgroup values restored"
        );
        report
    }

    /// Create a cgroup for a job started by `governor run-job` under the configured subtree
    /// (see [`CgroupFs::create_job_group`]).
    pub fn create_job_group(&self, name: &str) -> Result<JobCgroup, CgroupError> {
        self.core
            .fs
            .create_job_group(&self.core.config.jobs_subtree, name)
    }

    fn apply_parts(
        &mut self,
        job: &JobCgroup,
        cpu: CpuAllocation,
        memory: MemoryAllocation,
        usage: Option<&CgroupUsage>,
        now: Instant,
    ) -> Result<ApplyOutcome, CgroupError> {
        if let Some(c) = cpu.max_cores
            && c.is_nan()
        {
            return Err(CgroupError::InvalidAllocation {
                job: job.clone(),
                reason: "max_cores is NaN".into(),
            });
        }
        if !self.jobs.contains_key(job) {
            let js = self.core.new_job_state(job);
            self.jobs.insert(job.clone(), js);
        }
        let js = self.jobs.get_mut(job).expect("inserted above");
        js.last_request = Some((cpu, memory));
        let mut out = ApplyOutcome::default();
        let result = self
            .core
            .apply_job(job, js, cpu, memory, usage, now, &mut out);
        match result {
            Ok(()) => Ok(out),
            Err(e) if e.is_gone() => {
                debug!(job = %job, "cgroup vanished: forgetting the job (nothing to restore)");
                self.jobs.remove(job);
                let before = self.core.records.len();
                self.core.forget_records_of(job);
                let mut errors = Vec::new();
                self.core.persist_if_changed(before, &mut errors);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

impl JobState {
    fn next_due(&self) -> Option<Instant> {
        let knobs = self.knobs.iter().filter_map(|k| k.deferred_until);
        let cooldown = self.guard.cooldown_until;
        knobs.chain(cooldown).chain(self.next_verify_at).min()
    }

    fn knob_mut(&mut self, knob: Knob) -> Option<&mut KnobState> {
        self.knobs.iter_mut().find(|k| k.knob == knob)
    }

    fn knob(&self, knob: Knob) -> Option<&KnobState> {
        self.knobs.iter().find(|k| k.knob == knob)
    }
}

impl Core {
    fn kind(&self) -> HierarchyKind {
        self.fs.kind()
    }

    /// The knobs governed for a job on this hierarchy with this configuration.
    fn knobs_for(&self) -> Vec<Knob> {
        let c = &self.config;
        let v2 = self.kind().is_v2();
        let mut knobs = Vec::new();
        if c.manage_cpu {
            if v2 {
                knobs.extend([Knob::CpuMax, Knob::CpuWeight]);
            } else {
                knobs.extend([Knob::CfsQuota, Knob::CfsPeriod, Knob::CpuShares]);
            }
        }
        if c.manage_memory {
            if v2 {
                knobs.extend([Knob::MemoryMax, Knob::MemoryHigh]);
            } else {
                if c.v1_memory_limit {
                    knobs.push(Knob::MemoryLimit);
                }
                if c.v1_high_as_soft_limit {
                    knobs.push(Knob::MemorySoftLimit);
                }
            }
        }
        knobs
    }

    fn new_job_state(&self, job: &JobCgroup) -> JobState {
        let knobs = self
            .knobs_for()
            .into_iter()
            .filter_map(|knob| {
                // A controller that is not mounted (v1) simply has no knob here.
                let path = self.fs.knob_path(job, knob).ok()?;
                let mut ks = KnobState::new(knob, path);
                // A record from a previous run (not recovered yet) is the true original.
                if let Some(entry) = self.records.get(&ks.path) {
                    ks.theirs = Some(entry.original.clone());
                }
                Some(ks)
            })
            .collect();
        JobState {
            knobs,
            guard: GuardState::default(),
            last_request: None,
            settled: None,
            next_verify_at: None,
            memory_unavailable_reported: false,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_job(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        cpu: CpuAllocation,
        memory: MemoryAllocation,
        usage: Option<&CgroupUsage>,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        if js.next_verify_at.is_none_or(|t| now >= t) {
            self.verify(job, js, now, out)?;
            js.next_verify_at =
                Some(now + Duration::from_millis(self.config.drift_check_interval_ms));
        }
        let memory = if self.config.manage_memory {
            self.guarded_memory(job, js, memory, usage, now, out)?
        } else {
            MemoryAllocation::default()
        };
        let request = (cpu, memory);
        let pending = js.knobs.iter().any(|k| k.deferred_until.is_some());
        if js.settled == Some(request) && !pending {
            out.skipped += js.knobs.len();
            return Ok(());
        }
        let plan = self.plan(job, js, cpu, memory, out)?;
        let errors_before = out.errors.len();
        for (knob, desired) in plan {
            let Some(ks) = js.knob_mut(knob) else {
                continue;
            };
            self.execute(job, ks, desired, now, out)?;
        }
        let clean = out.errors.len() == errors_before
            && js.knobs.iter().all(|k| k.deferred_until.is_none());
        js.settled = clean.then_some(request);
        Ok(())
    }

    /// The drift check: re-read every file we have written (someone else's write?) or whose
    /// original we know (refresh it).
    fn verify(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        let mut changed = false;
        for ks in js.knobs.iter_mut() {
            if ks.abandoned || (ks.ours.is_none() && ks.theirs.is_none() && !ks.unavailable) {
                continue;
            }
            let current = match self.fs.read_job_file(job, ks.knob.controller(), &ks.path) {
                Ok(c) => c.trim().to_owned(),
                Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
                Err(CgroupError::ControllerUnavailable { .. }) => {
                    ks.unavailable = true;
                    continue;
                }
                Err(e) => {
                    warn!(job = %job, file = %ks.knob, error = %e, "drift check: cannot read");
                    out.errors.push(e);
                    continue;
                }
            };
            if ks.unavailable {
                ks.unavailable = false;
                changed = true;
            }
            match &ks.ours {
                Some(ours) if !ks.knob.equivalent(&current, ours, self.fs.page_size()) => {
                    self.on_drift(job, ks, current, now, out)?;
                    changed = true;
                }
                Some(_) => {}
                // A previous run's record holds the true original: the file holds its value.
                None if self.records.contains_key(&ks.path) => {}
                None => {
                    if ks.theirs.as_deref() != Some(current.as_str()) {
                        ks.theirs = Some(current);
                        changed = true;
                    }
                }
            }
        }
        if changed {
            js.settled = None;
        }
        Ok(())
    }

    /// Run the memory guard when there is anything to guard.
    fn guarded_memory(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        mut proposed: MemoryAllocation,
        usage: Option<&CgroupUsage>,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<MemoryAllocation, CgroupError> {
        let v2 = self.kind().is_v2();
        let (high_knob, max_knob) = if v2 {
            (Knob::MemoryHigh, Knob::MemoryMax)
        } else {
            (Knob::MemorySoftLimit, Knob::MemoryLimit)
        };
        // Proposals for files this hierarchy/configuration does not govern are dropped first.
        if js.knob(max_knob).is_none() {
            proposed.max_bytes = None;
        }
        if js.knob(high_knob).is_none() {
            proposed.high_bytes = None;
        }
        let in_effect_of = |knob| {
            js.knob(knob)
                .and_then(|k: &KnobState| k.ours.as_deref())
                .and_then(parse_memory_limit)
                .flatten()
        };
        let in_effect = MemoryAllocation {
            high_bytes: in_effect_of(high_knob),
            max_bytes: in_effect_of(max_knob),
        };
        let cooling = js.guard.cooldown_until.is_some_and(|t| now < t);
        if !cooling {
            // An expired cool-down must not keep `next_wakeup` in the past.
            js.guard.cooldown_until = None;
        }
        let anything = proposed.high_bytes.is_some()
            || proposed.max_bytes.is_some()
            || in_effect.high_bytes.is_some()
            || in_effect.max_bytes.is_some()
            || cooling;
        if !anything {
            return Ok(proposed);
        }
        let observed = usage.and_then(|u| Some((u.memory_current?, u.memory_events?)));
        let (usage_bytes, events) = match observed {
            Some(o) => o,
            None => match self.fs.memory_usage(job)? {
                Some(o) => o,
                None => {
                    // Without usage the guard cannot vouch for any limit: set none.
                    if !js.memory_unavailable_reported {
                        js.memory_unavailable_reported = true;
                        let e = CgroupError::ControllerUnavailable {
                            job: job.clone(),
                            controller: Controller::Memory,
                            path: self
                                .fs
                                .file_path(job, Controller::Memory, "memory.current")
                                .unwrap_or_default(),
                        };
                        warn!(job = %job, error = %e, "no memory usage: memory limits not applied");
                        out.errors.push(e);
                    }
                    return Ok(MemoryAllocation::default());
                }
            },
        };
        let decision = memory_guard(
            &self.config.memory_guard,
            &GuardInput {
                proposed,
                usage_bytes,
                events,
                in_effect,
                now,
            },
            &js.guard,
        );
        js.guard = decision.state;
        out.guard = Some(decision.verdict);
        match decision.verdict {
            GuardVerdict::BackedOff {
                until,
                previous,
                now: events_now,
            } => {
                warn!(
                    job = %job,
                    usage_bytes,
                    high_events = events_now.high - previous.high.min(events_now.high),
                    max_events = events_now.max - previous.max.min(events_now.max),
                    oom_events = events_now.oom - previous.oom.min(events_now.oom),
                    oom_kills = events_now.oom_kill - previous.oom_kill.min(events_now.oom_kill),
                    cooldown_s = until.saturating_duration_since(now).as_secs(),
                    "memory pressure: lifting the governor's memory limits"
                );
                js.settled = None;
            }
            GuardVerdict::Raised => {
                debug!(job = %job, usage_bytes, proposed = ?proposed, safe = ?decision.allocation,
                    "memory guard raised the proposed limits");
            }
            GuardVerdict::Accepted | GuardVerdict::CoolingDown { .. } => {}
        }
        Ok(decision.allocation)
    }

    /// What each knob should hold for (cpu, memory), in the order to write them.
    fn plan(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        cpu: CpuAllocation,
        memory: MemoryAllocation,
        out: &mut ApplyOutcome,
    ) -> Result<Vec<(Knob, Desired)>, CgroupError> {
        let period = self.config.cpu_period_us;
        let ceilings = self.config.original_limits_are_ceilings;
        let page = self.fs.page_size();
        let weight = cpu.weight.clamp(*WEIGHT_RANGE.start(), *WEIGHT_RANGE.end());
        let quota = cores_to_quota(cpu.max_cores, period);
        let mut plan: Vec<(Knob, Desired)> = Vec::with_capacity(js.knobs.len());
        let knobs: Vec<Knob> = js.knobs.iter().map(|k| k.knob).collect();
        for knob in knobs {
            let desired = match knob {
                Knob::CpuWeight => Desired::Set(weight.to_string()),
                Knob::CpuShares => Desired::Set(weight_to_shares(weight).to_string()),
                Knob::CpuMax => match quota {
                    None => Desired::Theirs,
                    Some(q) => {
                        let theirs = self.theirs(job, js, knob, out)?;
                        let cap = theirs.as_deref().and_then(parse_cpu_max);
                        match cap {
                            None if theirs.is_some() && ceilings => {
                                self.bad_original(job, js, knob, theirs, out);
                                Desired::Theirs
                            }
                            Some((Some(tq), tp)) if ceilings => {
                                let their_cores = tq as f64 / tp.unwrap_or(period).max(1) as f64;
                                if q as f64 / period as f64 >= their_cores {
                                    Desired::Theirs
                                } else {
                                    Desired::Set(encode_cpu_max(Some(q), period))
                                }
                            }
                            _ => Desired::Set(encode_cpu_max(Some(q), period)),
                        }
                    }
                },
                Knob::CfsQuota => match quota {
                    None => Desired::Theirs,
                    Some(q) => {
                        let theirs_q = self.theirs(job, js, Knob::CfsQuota, out)?;
                        let theirs_p = self.theirs(job, js, Knob::CfsPeriod, out)?;
                        let tq = theirs_q.as_deref().and_then(parse_cfs_quota);
                        let tp = theirs_p.as_deref().and_then(|p| p.parse::<u64>().ok());
                        match (tq, tp) {
                            (Some(Some(tq)), Some(tp)) if ceilings => {
                                if q as f64 / period as f64 >= tq as f64 / tp.max(1) as f64 {
                                    Desired::Theirs
                                } else {
                                    Desired::Set(q.to_string())
                                }
                            }
                            (None, _) | (_, None) if ceilings && theirs_q.is_some() => {
                                self.bad_original(job, js, knob, theirs_q, out);
                                Desired::Theirs
                            }
                            _ => Desired::Set(q.to_string()),
                        }
                    }
                },
                Knob::CfsPeriod => Desired::Theirs, // decided with the quota below
                Knob::MemoryHigh | Knob::MemorySoftLimit | Knob::MemoryMax | Knob::MemoryLimit => {
                    let bytes = if matches!(knob, Knob::MemoryHigh | Knob::MemorySoftLimit) {
                        memory.high_bytes
                    } else {
                        memory.max_bytes
                    };
                    match bytes {
                        None => Desired::Theirs,
                        Some(b) => {
                            let value = encode_memory(knob, Some(b), page);
                            let theirs = self.theirs(job, js, knob, out)?;
                            match theirs.as_deref().map(parse_memory_limit) {
                                Some(Some(Some(t))) if ceilings && b >= t => Desired::Theirs,
                                Some(None) if ceilings => {
                                    self.bad_original(job, js, knob, theirs, out);
                                    Desired::Theirs
                                }
                                _ => Desired::Set(value),
                            }
                        }
                    }
                }
            };
            plan.push((knob, desired));
        }
        // v1: the period follows the quota (written only together with a quota of ours).
        let quota_set = plan
            .iter()
            .any(|(k, d)| *k == Knob::CfsQuota && matches!(d, Desired::Set(_)));
        if quota_set && let Some(p) = plan.iter_mut().find(|(k, _)| *k == Knob::CfsPeriod) {
            p.1 = Desired::Set(period.to_string());
        }
        self.order(js, &mut plan);
        Ok(plan)
    }

    /// An original value that cannot be parsed: the file is left alone; said once per job.
    fn bad_original(
        &self,
        job: &JobCgroup,
        js: &mut JobState,
        knob: Knob,
        content: Option<String>,
        out: &mut ApplyOutcome,
    ) {
        let Some(ks) = js.knob_mut(knob) else {
            return;
        };
        if std::mem::replace(&mut ks.bad_original_reported, true) {
            return;
        }
        let e = CgroupError::Parse {
            path: ks.path.clone(),
            content: content.unwrap_or_default(),
            reason: "cannot read the original limit; the file is left alone",
        };
        warn!(job = %job, file = %knob, error = %e, "not governing this file");
        out.errors.push(e);
    }

    /// Loosening writes first (in restore order), then the others in reverse restore order, so
    /// that a job is never briefly held tighter than both the old and the new settings allow:
    /// memory.max goes up before memory.high does, and memory.high comes down before memory.max.
    fn order(&self, js: &JobState, plan: &mut [(Knob, Desired)]) {
        let page = self.fs.page_size();
        let loosening = |knob: Knob, desired: &Desired| -> bool {
            let Some(ks) = js.knob(knob) else {
                return false;
            };
            let from = ks.ours.as_deref().or(ks.theirs.as_deref());
            let to = match desired {
                Desired::Set(v) => Some(v.as_str()),
                Desired::Theirs => ks.theirs.as_deref(),
            };
            match (from, to) {
                (Some(f), Some(t)) => is_loosening(knob, f, t, page),
                _ => false,
            }
        };
        plan.sort_by_key(|(knob, desired)| {
            if loosening(*knob, desired) {
                (0, knob.restore_rank() as isize)
            } else {
                (1, -(knob.restore_rank() as isize))
            }
        });
    }

    /// Their value of `knob`, reading the file the first time it is needed.
    fn theirs(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        knob: Knob,
        out: &mut ApplyOutcome,
    ) -> Result<Option<String>, CgroupError> {
        let Some(ks) = js.knob_mut(knob) else {
            return Ok(None);
        };
        if ks.theirs.is_none() && !ks.unavailable {
            match self.fs.read_job_file(job, knob.controller(), &ks.path) {
                Ok(c) => ks.theirs = Some(c.trim().to_owned()),
                Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
                Err(e @ CgroupError::ControllerUnavailable { .. }) => {
                    ks.unavailable = true;
                    warn!(job = %job, file = %knob, error = %e, "cannot govern this file");
                    out.errors.push(e);
                }
                Err(e) => out.errors.push(e),
            }
        }
        Ok(ks.theirs.clone())
    }

    /// Bring one knob to `desired`, subject to the rate limit, drift back-off and recording.
    fn execute(
        &mut self,
        job: &JobCgroup,
        ks: &mut KnobState,
        desired: Desired,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        ks.deferred_until = None;
        if ks.abandoned || ks.unavailable {
            out.skipped += 1;
            return Ok(());
        }
        let page = self.fs.page_size();
        let (target, reason) = match &desired {
            Desired::Set(v) => (v.clone(), WriteReason::Apply),
            Desired::Theirs => match (&ks.ours, &ks.theirs) {
                (Some(_), Some(theirs)) => (theirs.clone(), WriteReason::Restore),
                _ => {
                    out.skipped += 1;
                    return Ok(());
                }
            },
        };
        match &ks.ours {
            Some(ours) if *ours == target && reason == WriteReason::Apply => {
                out.skipped += 1;
                return Ok(());
            }
            None if ks
                .theirs
                .as_deref()
                .is_some_and(|t| ks.knob.equivalent(t, &target, page)) =>
            {
                out.skipped += 1;
                return Ok(());
            }
            _ => {}
        }
        if let Some(hold) = ks.hold_until {
            if now < hold {
                ks.deferred_until = Some(hold);
                out.defer(hold);
                return Ok(());
            }
            ks.hold_until = None;
        }
        let from = ks.ours.as_deref().or(ks.theirs.as_deref()).unwrap_or("");
        let exempt =
            ks.knob.class() == KnobClass::Memory && is_loosening(ks.knob, from, &target, page);
        if !exempt && let Some(last) = ks.last_write_at {
            let due = last + self.config.min_interval(ks.knob.class());
            if now < due {
                ks.deferred_until = Some(due);
                out.defer(due);
                return Ok(());
            }
        }

        // Read what is there now: someone else's write is adopted, never overwritten blindly.
        let current = match self.fs.read_job_file(job, ks.knob.controller(), &ks.path) {
            Ok(c) => c.trim().to_owned(),
            Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
            Err(e) => {
                if matches!(e, CgroupError::ControllerUnavailable { .. }) {
                    ks.unavailable = true;
                }
                // Logged once per failing spell, like a failed write (decisions come every second).
                if ks.failing {
                    debug!(job = %job, file = %ks.knob, error = %e, "cannot read before writing, still");
                } else {
                    warn!(job = %job, file = %ks.knob, error = %e, "cannot read before writing; will retry");
                    ks.failing = true;
                }
                out.errors.push(e);
                return Ok(());
            }
        };
        match &ks.ours {
            Some(ours) if !ks.knob.equivalent(&current, ours, page) => {
                return self.on_drift(job, ks, current, now, out);
            }
            Some(_) => {}
            None => {
                if let Some(existing) = self.records.get(&ks.path) {
                    // A previous run's write is still in effect (not recovered yet): its recorded
                    // original stays theirs, and what the file holds is ours.
                    ks.theirs = Some(existing.original.clone());
                    self.leftovers.remove(&ks.path);
                    if ks.knob.equivalent(&current, &target, page) {
                        ks.ours = Some(target);
                        out.skipped += 1;
                        return Ok(());
                    }
                } else {
                    if ks.knob.equivalent(&current, &target, page) {
                        ks.theirs = Some(current);
                        out.skipped += 1;
                        return Ok(());
                    }
                    // First write: the original must be on disk before the file changes.
                    ks.theirs = Some(current.clone());
                    self.record(job, ks, current.clone())?;
                }
            }
        }

        match self
            .fs
            .write_job_file(job, ks.knob.controller(), &ks.path, &target)
        {
            Ok(()) => {
                ks.last_write_at = Some(now);
                if ks.failing {
                    info!(job = %job, file = %ks.knob, "cgroup write succeeds again");
                    ks.failing = false;
                }
                match reason {
                    WriteReason::Apply => {
                        debug!(job = %job, file = %ks.knob, path = %ks.path.display(),
                            from = %current, to = %target, "cgroup file written");
                        ks.ours = Some(target.clone());
                    }
                    WriteReason::Restore => {
                        info!(job = %job, file = %ks.knob, path = %ks.path.display(),
                            from = %current, to = %target, "cgroup file restored to its original value");
                        ks.ours = None;
                        self.unrecord(&ks.path)?;
                    }
                }
                out.written.push(WriteRecord {
                    knob: ks.knob,
                    value: target,
                    reason,
                });
            }
            Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
            Err(e) => {
                ks.last_write_at = Some(now);
                if ks.failing {
                    debug!(job = %job, file = %ks.knob, error = %e, "cgroup write still failing");
                } else {
                    warn!(job = %job, file = %ks.knob, error = %e, "cgroup write failed; will retry");
                    ks.failing = true;
                }
                out.errors.push(e);
            }
        }
        Ok(())
    }

    /// Someone else wrote `theirs` over our value.
    fn on_drift(
        &mut self,
        job: &JobCgroup,
        ks: &mut KnobState,
        theirs: String,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        let forget = Duration::from_millis(self.config.drift_forget_after_ms);
        if ks
            .last_drift_at
            .is_some_and(|t| now.saturating_duration_since(t) > forget)
        {
            ks.drift_episodes = 0;
        }
        ks.drift_episodes = ks.drift_episodes.saturating_add(1);
        ks.last_drift_at = Some(now);
        let ours = ks.ours.take().unwrap_or_default();
        ks.theirs = Some(theirs.clone());
        // Their value is in the file: nothing of ours to restore until we write again, and the
        // next write records their value as the original.
        self.unrecord(&ks.path)?;
        let action = if ks.drift_episodes > self.config.drift_give_up_after {
            ks.abandoned = true;
            ks.deferred_until = None;
            warn!(job = %job, file = %ks.knob, ours = %ours, theirs = %theirs,
                overwrites = ks.drift_episodes,
                "another program keeps overwriting this file: no longer governing it for this job");
            DriftAction::GaveUp
        } else {
            let exp = ks.drift_episodes.saturating_sub(1).min(20);
            let backoff = Duration::from_millis(
                self.config
                    .drift_backoff_initial_ms
                    .saturating_mul(1 << exp)
                    .min(self.config.drift_backoff_max_ms),
            );
            let at = now + backoff;
            ks.hold_until = Some(at);
            ks.deferred_until = Some(at);
            out.defer(at);
            if ks.drift_episodes == 1 {
                warn!(job = %job, file = %ks.knob, ours = %ours, theirs = %theirs,
                    reapply_in_ms = backoff.as_millis() as u64,
                    "cgroup file changed by another program: adopting its value as the original");
            } else {
                debug!(job = %job, file = %ks.knob, ours = %ours, theirs = %theirs,
                    overwrites = ks.drift_episodes, reapply_in_ms = backoff.as_millis() as u64,
                    "cgroup file overwritten again");
            }
            DriftAction::ReapplyAt(at)
        };
        out.drift.push(DriftEvent {
            knob: ks.knob,
            ours,
            theirs,
            action,
        });
        Ok(())
    }

    /// Record `original` for `ks` durably (the caller checked that no record exists).
    fn record(
        &mut self,
        job: &JobCgroup,
        ks: &mut KnobState,
        original: String,
    ) -> Result<(), CgroupError> {
        let cgroup_ino = ks
            .path
            .parent()
            .and_then(|d| std::fs::metadata(d).ok())
            .map(|m| m.ino());
        let entry = StateEntry {
            job: job.to_string(),
            knob: ks.knob,
            path: ks.path.clone(),
            original,
            cgroup_ino,
        };
        self.records.insert(ks.path.clone(), entry.clone());
        if let Err(e) = self
            .store
            .append(std::slice::from_ref(&entry), &[], self.records.values())
        {
            self.records.remove(&ks.path);
            return Err(e);
        }
        Ok(())
    }

    fn unrecord(&mut self, path: &Path) -> Result<(), CgroupError> {
        if self.records.remove(path).is_some() {
            self.leftovers.remove(path);
            self.store
                .append(&[], &[path.to_owned()], self.records.values())?;
        }
        Ok(())
    }

    fn forget_records_of(&mut self, job: &JobCgroup) {
        let name = job.to_string();
        self.records.retain(|_, e| e.job != name);
    }

    /// Rewrite the state file after restores removed records (`before`: the count before).
    fn persist_if_changed(&mut self, before: usize, errors: &mut Vec<CgroupError>) {
        if self.records.len() == before {
            return;
        }
        self.leftovers.retain(|p| self.records.contains_key(p));
        if let Err(e) = self.store.rewrite(self.records.values()) {
            tracing::error!(error = %e, "cannot update the state file");
            errors.push(e);
        }
    }

    /// Put one recorded original back. With `ours` (a live job) the file is restored only if it
    /// still holds our value; without (recovery) it is restored unless its cgroup was replaced.
    fn restore_entry(
        &mut self,
        entry: &StateEntry,
        ours: Option<&str>,
        report: &mut RestoreReport,
    ) {
        let dir = entry.path.parent().unwrap_or(&entry.path);
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(_) => {
                debug!(job = %entry.job, file = %entry.knob, "cgroup gone: nothing to restore");
                report.gone.push((entry.job.clone(), entry.knob));
                self.records.remove(&entry.path);
                return;
            }
        };
        if ours.is_none() && entry.cgroup_ino.is_some_and(|ino| ino != meta.ino()) {
            info!(job = %entry.job, file = %entry.knob,
                "cgroup was recreated since the original was recorded: not restoring");
            report.gone.push((entry.job.clone(), entry.knob));
            self.records.remove(&entry.path);
            return;
        }
        let page = self.fs.page_size();
        let current = std::fs::read_to_string(&entry.path).map(|c| c.trim().to_owned());
        if let (Some(ours), Ok(current)) = (ours, &current)
            && !entry.knob.equivalent(current, ours, page)
        {
            info!(job = %entry.job, file = %entry.knob, theirs = %current,
                "changed by another program since our last write: leaving its value");
            report.left_to_others.push((entry.job.clone(), entry.knob));
            self.records.remove(&entry.path);
            return;
        }
        if let Ok(current) = &current
            && entry.knob.equivalent(current, &entry.original, page)
        {
            self.records.remove(&entry.path);
            return;
        }
        match super::fs::write_file(&entry.path, &entry.original) {
            Ok(()) => {
                info!(job = %entry.job, file = %entry.knob, path = %entry.path.display(),
                    to = %entry.original, "cgroup file restored to its original value");
                report
                    .restored
                    .push((entry.job.clone(), entry.knob, entry.original.clone()));
                self.records.remove(&entry.path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                debug!(job = %entry.job, file = %entry.knob, "cgroup gone: nothing to restore");
                report.gone.push((entry.job.clone(), entry.knob));
                self.records.remove(&entry.path);
            }
            Err(source) => {
                let e = CgroupError::WriteFailed {
                    path: entry.path.clone(),
                    value: entry.original.clone(),
                    error: source,
                };
                warn!(job = %entry.job, error = %e, "cannot restore original value; kept in the state file");
                report.errors.push(e);
            }
        }
    }
}

/// True when going from `from` to `to` gives the job more room (a higher memory or CPU limit,
/// unlimited included). Weights, shares and periods are neither.
fn is_loosening(knob: Knob, from: &str, to: &str, page: u64) -> bool {
    let as_limit = |v: Option<u64>| v.unwrap_or(u64::MAX);
    match knob {
        Knob::MemoryMax | Knob::MemoryHigh | Knob::MemoryLimit | Knob::MemorySoftLimit => {
            match (parse_memory_limit(from), parse_memory_limit(to)) {
                (Some(f), Some(t)) => as_limit(t) > as_limit(f) && !knob.equivalent(from, to, page),
                _ => false,
            }
        }
        Knob::CpuMax => match (parse_cpu_max(from), parse_cpu_max(to)) {
            (Some((fq, fp)), Some((tq, tp))) => {
                let cores = |q: Option<u64>, p: Option<u64>| match q {
                    None => f64::INFINITY,
                    Some(q) => q as f64 / p.unwrap_or(100_000).max(1) as f64,
                };
                cores(tq, tp) > cores(fq, fp)
            }
            _ => false,
        },
        Knob::CfsQuota => match (parse_cfs_quota(from), parse_cfs_quota(to)) {
            (Some(f), Some(t)) => as_limit(t) > as_limit(f),
            _ => false,
        },
        Knob::CpuWeight | Knob::CpuShares | Knob::CfsPeriod => false,
    }
}
