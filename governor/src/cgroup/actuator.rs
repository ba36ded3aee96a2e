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

mod apply;
mod records;
mod restore;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use super::error::CgroupError;
use super::fs::{CgroupFs, CgroupUsage};
use super::guard::{GuardState, GuardVerdict, MemoryGuardConfig};
use super::hierarchy::{Controller, Hierarchy, JobCgroup};
use super::knob::{CFS_PERIOD_RANGE_US, Knob, KnobClass};
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
