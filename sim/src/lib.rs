//! `govsim`: a simulator that drives the real node policies (and, later, the coordinator's
//! placement) through their traits, with a simulated clock, cgroup sharing and log-granular
//! progress.
//!
//! Today it simulates one node ([`node::run_node`]); the cluster simulator will run one
//! [`node`] engine per worker under a placement policy, read traces in JSON ([`Scenario`]) and
//! add migration costs.
#![forbid(unsafe_code)]

pub mod baseline;
pub mod cli;
pub mod cluster;
pub mod compare;
pub mod curves;
pub mod evaluate;
pub mod job;
pub mod node;
pub mod paper;
pub mod plot;
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
