//! `govsim`: a simulator that drives the real node policies and the coordinator's queue and
//! placement through their traits, with a simulated clock, cgroup sharing and log-granular
//! progress.
//!
//! - [`node::run_node`]: one node (`govsim node`, `govsim sweep`): the cluster engine with one
//!   worker;
//! - [`cluster::run_cluster`]: a cluster replaying a [`trace::Trace`] under a
//!   [`cluster::PolicySpec`] (`govsim run`), with moves;
//! - [`evaluate::evaluate`]: policies against `fair` on the same trace (`govsim compare`),
//!   [`paper`]: the papers' setups (`govsim paper`), [`priority`]: a mixed-priority trace with
//!   and without preemption (`govsim priority`), [`plot`]: SVG charts;
//! - [`trace::generate`] with [`curves::load_dir`]: traces from real logs (`govsim trace`);
//! - [`bound`]: what any order of CPU shares could gain on one node (a fluid model with perfect
//!   knowledge), beside what the policies reach.
#![forbid(unsafe_code)]

pub mod bound;
pub mod cluster;
pub mod compare;
pub mod curves;
pub mod elastic;
pub mod evaluate;
pub mod gpu;
pub mod hpo;
pub mod job;
pub mod node;
pub mod paper;
pub mod plot;
pub mod predict;
pub mod priority;
pub mod trace;
pub mod workload;

use serde::{Deserialize, Serialize};

/// A single-node scenario file: the node and its jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    #[serde(default)]
    pub node: node::NodeConfig,
    pub jobs: Vec<job::JobModel>,
}
