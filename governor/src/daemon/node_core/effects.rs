//! What the core asks the world to do. [`super::NodeCore`] only decides: every cgroup write,
//! restore and signal it wants is returned as an [`Effect`], in the order it is to happen, and
//! the shell ([`super::CoreShell`]) carries them out against the real actuator. So a decision
//! (a job capped, released, stopped at convergence, cut from its sweep) is tested by what the
//! core returns, without processes or files.

use nix::sys::signal::Signal;

use crate::cgroup::{CgroupUsage, JobCgroup};
use crate::policy::Allocation;

/// One side effect the core decided on.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Write a job's limits (`cpu.weight`, `cpu.max`, memory). The actuator skips unchanged
    /// files, rate-limits, records originals for restore and guards memory with `usage` (the
    /// job's latest sample; `None`: the actuator reads it itself). The outcome goes back to the
    /// core ([`super::NodeCore::limits_applied`]): the job is applied, or retried next round.
    ApplyLimits {
        cgroup: JobCgroup,
        alloc: Allocation,
        usage: Option<CgroupUsage>,
    },
    /// Put back every file the governor changed in a job's cgroup: the policy let the job go
    /// (hands off), or it is no longer governed.
    Release { cgroup: JobCgroup },
    /// Signal every process of a job's cgroup: the stop the job asked for (SIGINT when it
    /// converged or its sweep cut it, SIGTERM once it outstayed the grace period).
    Signal {
        cgroup: JobCgroup,
        signal: Signal,
        /// The job's name, for the shell's log line.
        job: String,
    },
    /// Put back every file the governor changed, in every cgroup (shutdown).
    RestoreAll,
}

#[cfg(test)]
#[path = "effects_tests.rs"]
mod tests;
