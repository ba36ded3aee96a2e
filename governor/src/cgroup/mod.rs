//! Cgroup actuation: the only module of the product that writes cgroupfs (and the only one with
//! raw process syscalls). Everything here can be pointed at a fake root, a directory laid out like
//! cgroupfs, which is how the unit tests run.
//!
//! - [`hierarchy`]: detect unified (v2), hybrid and legacy (v1) layouts; [`JobCgroup`] names a
//!   job's cgroup by its path relative to the root (the same relative path under each v1
//!   controller's mount).
//! - [`fs`]: [`CgroupFs`], every read and write, usage ([`CgroupUsage`]: `cpu.stat`,
//!   `memory.current`, `memory.events`, `memory.stat`, and the v1 equivalents).
//! - [`knob`]: the files written and the encodings: v2 `cpu.weight`, `cpu.max`, `memory.high`,
//!   `memory.max`; v1 `cpu.shares` (weight mapped with the inverse of the runtimes'
//!   shares→weight formula), `cpu.cfs_quota_us`/`cpu.cfs_period_us`,
//!   `memory.soft_limit_in_bytes` (for `memory.high`, which v1 lacks) and, only when enabled,
//!   `memory.limit_in_bytes`.
//! - [`actuator`]: [`Actuator`] applies [`Allocation`](crate::policy::Allocation)s with write
//!   skipping, per-file rate limits, drift detection, original-value recording and restore.
//! - [`guard`]: the pure memory guard that keeps the governor from ever getting a job OOM-killed.
//! - [`state`]: the state file of original values (`/run/governor/state.json`).
//! - [`jobs`]: cgroups for jobs the governor starts itself (`run-job`).
//! - [`adoption`]: moving a job out of a shared cgroup (never out of a limit) and back, with
//!   its journal.
//! - [`delegation`]: job groups the daemon makes for a user's `run-job`: what the user is
//!   given (cgroup v2 delegation) and why it is no more than its job.
//! - [`fake`]: a fake cgroup root for tests and benchmarks.
//!
//! # Daemon integration
//! ```text
//! let hierarchy = Hierarchy::detect("/sys/fs/cgroup")?;
//! let mut actuator = Actuator::new(hierarchy, config)?;   // locks the state file
//! let report = actuator.recover();                       // restore what a crashed run left
//! loop {
//!     let usage = actuator.usage(&job)?;                  // feed the policy
//!     let outcome = actuator.apply_with_usage(&job, &alloc, &usage, Instant::now())?;
//!     // sleep until min(next tick, actuator.next_wakeup()), then actuator.poll(now)
//! }
//! actuator.release(&job);                                 // job finished / no longer governed
//! actuator.restore_all();                                 // shutdown, SIGTERM
//! ```
//!
//! # Why cgroups-rs is not used here
//! The design names cgroups-rs; it was checked (0.5.1) and files are written directly instead:
//! - its hierarchy detection is fixed to `/sys/fs/cgroup` and `/proc/self/mountinfo`
//!   (`hierarchies::auto`, `V1::new`), so it cannot be pointed at a fake root, which every unit
//!   test of this module needs;
//! - write skipping, drift detection and restore need the raw text of a file (to record
//!   "max 100000" and put it back byte for byte, and to compare what we wrote with what is there),
//!   whereas its getters parse into typed values and its setters always open and write, with
//!   `File::create`, which would silently create a file a disabled controller does not have;
//! - the v1/v2 differences the governor cares about (weight vs shares, mapped default to default,
//!   `memory.high` vs the soft limit, "max" vs -1 vs 9223372036854771712) need our own mapping
//!   anyway (its `set_shares` writes the number unchanged to `cpu.weight` on v2);
//! - errors: its error kinds carry no path/value pair for the operator.
//!
//! It is used where it serves: the VM tests read back what the actuator wrote through cgroups-rs's
//! own controllers, as an independent check that the values are what the ecosystem parses.
//!
//! # Safety rules (enforced here, tested in the unit and VM tests)
//! - The original of every file is on disk (state file, fsync'd) before the file is first written.
//! - `release`, `restore_all` and `recover` put originals back; a vanished cgroup is not an error.
//! - Memory limits are never below usage plus headroom, `memory.max` stays above `memory.high`, and
//!   any pressure event lifts the governor's memory limits at once (see [`guard`]).
//! - With the default `original_limits_are_ceilings`, the governor never loosens a limit set by
//!   the orchestrator.

pub mod actuator;
pub mod adoption;
pub mod delegation;
pub mod error;
pub mod fake;
pub mod fs;
pub mod guard;
pub mod hierarchy;
pub mod jobs;
pub mod knob;
pub mod state;

#[cfg(test)]
mod tests;

pub use actuator::{
    Actuator, ActuatorConfig, ApplyOutcome, DriftAction, DriftEvent, RestoreReport, WriteReason,
    WriteRecord,
};
pub use error::CgroupError;
pub use fs::{CgroupFs, CgroupUsage, MemoryEvents};
pub use guard::{
    GuardDecision, GuardInput, GuardState, GuardVerdict, MemoryGuardConfig, memory_guard,
};
pub use hierarchy::{Controller, Hierarchy, HierarchyKind, JobCgroup};
pub use knob::{Knob, shares_to_weight, weight_to_shares};
pub use state::{DEFAULT_STATE_FILE, StateEntry};
