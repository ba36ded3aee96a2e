//! The cluster coordinator: it knows every node and job, places incoming jobs with a
//! run-time-selectable policy, and serves `govctl`.
//!
//! - [`placement`] — the placement policies (FlowCon, ProCon, SpeCon, round-robin, first-fit
//!   and ours), pure functions of a [`placement::ClusterView`];
//! - [`queue`] — priorities, FIFO, gang admission with timeouts (pure, injected time);
//! - [`state`] — the registry and its state machine: the cluster planner (crate
//!   `governor-planner`, pure, injected time; govsim drives the same code);
//! - [`store`] — where the state is persisted: a crash-safe redb file, or the cluster's etcd
//!   ([`etcd`], a small client) written only by the replica [`leader`] elects;
//! - [`server`] — the gRPC services (node sessions, govctl's control service) around the state;
//! - [`certs`] — the CA and certificates of a test cluster (`govctl certs`);
//! - [`cli`] — `govctl`.
#![forbid(unsafe_code)]

/// The placement policies and the queue (crate `governor-placement`, pure: no I/O), under the
/// names the coordinator's modules use.
pub use governor_placement::{self as placement, queue};

/// The cluster planner (crate `governor-planner`), under the name the coordinator's modules use.
pub use governor_planner as state;

pub mod certs;
pub mod cli;
pub mod etcd;
pub mod leader;
pub mod server;
pub mod store;
