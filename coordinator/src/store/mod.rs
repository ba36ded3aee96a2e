//! The coordinator's store: nodes, jobs and settings as JSON records, in one of two backends
//! (`[state] backend`):
//!
//! - [`redb`] (default): one file on the coordinator's disk, crash-safe (every commit durable and
//!   atomic). One coordinator; if its machine is lost, so is the cluster's scheduler until an
//!   operator brings the file up elsewhere.
//! - [`etcd`]: the cluster's etcd, written only by the elected leader among the coordinator
//!   replicas, every transaction fenced on its leadership (see [`crate::leader`]), so the state
//!   survives the loss of any one machine and a deposed leader cannot change it.
//!
//! JSON rather than a binary encoding so the records can grow fields (serde defaults) without a
//! migration, and so an operator can read them with `etcdctl get` or a redb tool.

pub mod etcd;
pub mod migrate;
pub mod redb;

use std::path::PathBuf;

use crate::state::{Dirty, JobRecord, Meta, NodeRecord};

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot open the coordinator store {path}: {source} (is another coordinator using it?)"
    )]
    Open {
        path: PathBuf,
        #[source]
        source: Box<::redb::Error>,
    },
    #[error("coordinator store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: Box<::redb::Error>,
    },
    #[error("coordinator store: record {key:?} in {table} is not valid: {source}")]
    Corrupt {
        table: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot create the directory of the coordinator store {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("coordinator store on etcd: {0}")]
    Etcd(#[from] crate::etcd::EtcdError),
    /// The write was refused because this replica no longer leads: another was elected after
    /// its lease ran out. Nothing of the batch was written.
    #[error("this coordinator is no longer the leader: its write was refused")]
    Deposed,
}

/// Everything the store holds, as loaded at start-up.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub meta: Option<Meta>,
    pub nodes: Vec<NodeRecord>,
    pub jobs: Vec<JobRecord>,
}

/// The kinds of record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Nodes,
    Jobs,
    Meta,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Nodes => "nodes",
            Table::Jobs => "jobs",
            Table::Meta => "meta",
        }
    }
}

/// The records one flush writes and deletes, encoded.
#[derive(Debug, Default)]
pub struct Batch {
    pub puts: Vec<(Table, String, Vec<u8>)>,
    pub deletes: Vec<(Table, String)>,
}

impl Batch {
    /// What `dirty` names, read from the state (`node`, `job`; a record they do not return is
    /// left as it is stored).
    pub fn of(
        dirty: &Dirty,
        meta: &Meta,
        node: impl Fn(&str) -> Option<NodeRecord>,
        job: impl Fn(&str) -> Option<JobRecord>,
    ) -> Batch {
        let mut batch = Batch::default();
        // The meta record (the next job id) first: should a batch be split (etcd) and only its
        // first part land, the stored counter is still past every stored job.
        if dirty.meta {
            batch.puts.push((Table::Meta, String::new(), encode(meta)));
        }
        for name in &dirty.nodes {
            if let Some(r) = node(name) {
                batch.puts.push((Table::Nodes, name.clone(), encode(&r)));
            }
        }
        for id in &dirty.jobs {
            if let Some(r) = job(id) {
                batch.puts.push((Table::Jobs, id.clone(), encode(&r)));
            }
        }
        for id in &dirty.removed_jobs {
            batch.deletes.push((Table::Jobs, id.clone()));
        }
        batch
    }

    pub fn is_empty(&self) -> bool {
        self.puts.is_empty() && self.deletes.is_empty()
    }

    pub fn len(&self) -> usize {
        self.puts.len() + self.deletes.len()
    }
}

/// The open store, either backend.
#[derive(Debug)]
pub enum Store {
    Redb(redb::RedbStore),
    Etcd(etcd::EtcdStore),
}

impl Store {
    pub async fn load(&self) -> Result<Snapshot, StoreError> {
        match self {
            Store::Redb(s) => s.load(),
            Store::Etcd(s) => s.load().await,
        }
    }

    /// Write a batch. redb: one transaction. etcd: one fenced transaction, or several of at most
    /// `max_txn_ops` writes each when the batch is larger (each fenced).
    pub async fn save(&self, batch: &Batch) -> Result<(), StoreError> {
        match self {
            Store::Redb(s) => s.save(batch),
            Store::Etcd(s) => s.save(batch).await,
        }
    }

    /// Where the store is, for logs.
    pub fn describe(&self) -> String {
        match self {
            Store::Redb(s) => s.path().display().to_string(),
            Store::Etcd(s) => s.describe(),
        }
    }
}

/// JSON encoding of a record (the record types always serialise).
pub(crate) fn encode<T: serde::Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).expect("records serialise to JSON")
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    table: &'static str,
    key: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        table,
        key: key.to_owned(),
        source,
    })
}
