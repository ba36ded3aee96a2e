//! Governor: a per-node resource governor for deep-learning training jobs.
//!
//! Data flows from a job's log line to a cgroup write like this (see docs/architecture.md):
//! [`progress`] tails and parses the logs into records and a progress signal; [`policy`] turns
//! progress and resource usage into per-job allocations; the daemon applies them through
//! [`cgroup`], the only module that writes cgroupfs. [`accounting`] measures each job's CPU use
//! (eBPF on `sched_switch`, cgroupfs counters as the fallback).
// Raw system interfaces live in the `sys` modules (`sys`, `accounting::sys`), the only places
// allowed `unsafe`; everything else is checked safe code.
#![deny(unsafe_code)]

pub mod accounting;
pub mod cgroup;
pub mod cli;
pub mod config;
pub mod control;
pub mod coordinator_client;
pub mod criu;
pub mod daemon;
pub mod discovery;
pub mod gpu;
pub mod metrics;
pub mod status;
pub mod supervise;
pub mod sys;

/// The node policies (crate `governor-policy`, pure: no I/O), under the name the daemon's
/// modules use.
pub use governor_policy as policy;
/// Log parsing and the progress signal (crate `governor-progress`, pure: bytes and times in),
/// under the name the daemon's modules use.
pub use governor_progress as progress;
/// Following log files live and reading them (crate `governor-watch`: inotify, file opening,
/// MLflow's SQLite store).
pub use governor_watch as watch;
