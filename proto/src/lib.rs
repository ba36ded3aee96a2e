//! The cluster protocol: the code tonic generates from `proto/governor/cluster/v1/cluster.proto`
//! (module [`pb`]) and the domain types the rest of the workspace uses instead (modules [`node`]
//! and [`control`]); also the JSON wire types of a node daemon's local control socket
//! ([`control_socket`]).
//!
//! Every generated message that crosses a trust boundary has a hand-written `TryFrom` into its
//! domain type that checks it field by field; a bad message becomes an [`InvalidMessage`] naming
//! the field (`report.jobs[2].cpu_cores: must be finite and >= 0, got NaN`), which converts into a
//! gRPC `INVALID_ARGUMENT` status. Domain types convert back into messages with `From`.
//!
//! Without its default feature `grpc` the crate is the domain types alone (no tonic, no tokio,
//! no TLS): what the cluster planner (`governor-planner`, pure) and the simulator build on.
//!
//! The generated code is not checked in: `build.rs` compiles the `.proto` with protox, a
//! pure-Rust compiler, so no `protoc` is needed.
#![forbid(unsafe_code)]

#[cfg(feature = "grpc")]
pub mod archive;
#[cfg(feature = "grpc")]
pub mod codec;
pub mod control;
pub mod control_socket;
mod error;
#[cfg(feature = "grpc")]
pub mod http;
pub mod job_env;
pub mod node;
#[cfg(feature = "grpc")]
pub mod tls;
pub mod units;

pub use error::{InvalidMessage, check_user_name};

/// Generated messages and services (`governor.cluster.v1`; the services with feature `grpc`).
#[cfg(feature = "messages")]
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/governor.cluster.v1.rs"));
}

/// etcd's key-value and lease services, the subset the coordinator's etcd store uses
/// (`proto/etcd/kv_lease.proto`; clients only, with tonic's default codec).
#[cfg(feature = "messages")]
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod etcd {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}

/// The port the coordinator listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7070;
