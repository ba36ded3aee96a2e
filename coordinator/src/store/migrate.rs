//! `coordinator migrate`: a cluster that switches from the embedded store to etcd keeps its
//! state. The redb file's records (nodes, jobs, the next job id, the policy) are copied under
//! the etcd prefix, unchanged, before any replica runs there; the first replica elected then
//! loads them as a restarted coordinator loads its own file: the nodes resync, their running
//! jobs are found where they run and not started again, and job ids go on.
//!
//! Without it a replica starts the cluster empty while the nodes still hold jobs under ids
//! the new state issues again (`j1` ...): a node would take a new `j1` for one it knows.
//!
//! Safety: the file is opened by redb, which refuses it while a coordinator has it open; the
//! prefix must hold nothing, no records and no leader (a replica already serving there has
//! loaded an empty state and would not see what is written behind it); each transaction
//! compares the leader key's absence, so a replica elected during the copy stops it.

use std::path::{Path, PathBuf};

use governor_proto::etcd::TxnRequest;

use super::etcd::{leader_key, record_key};
use super::redb::RedbStore;
use super::{Batch, StoreError, Table, encode};
use crate::etcd::{Etcd, EtcdConfig, created_at, put};

/// Why a migration did not happen (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("no redb store at {0}")]
    NoSource(PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Etcd(#[from] crate::etcd::EtcdError),
    #[error(
        "etcd already holds {keys} key(s) under {prefix}/ (a replica ran there, or a migration did): \
         migrate only into an empty prefix (stop the replicas; `etcdctl del --prefix {prefix}/` \
         drops what is there)"
    )]
    NotEmpty { prefix: String, keys: usize },
    #[error(
        "a coordinator replica was elected under {prefix}/ during the migration; {written} of \
         {total} records were written: stop the replicas, delete the prefix and migrate again"
    )]
    Raced {
        prefix: String,
        written: usize,
        total: usize,
    },
}

/// What was copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    pub nodes: usize,
    pub jobs: usize,
    /// The placement policy the store had (none: a store never written).
    pub policy: Option<String>,
}

/// Copy the redb store at `from` under `etcd.prefix`.
pub async fn redb_to_etcd(from: &Path, etcd: &EtcdConfig) -> Result<Migrated, MigrateError> {
    if !from.is_file() {
        return Err(MigrateError::NoSource(from.to_owned()));
    }
    let snapshot = RedbStore::open(from)?.load()?;
    let prefix = etcd.prefix.trim_end_matches('/').to_owned();
    let client = Etcd::new(etcd)?;
    let there = client
        .range_prefix(format!("{prefix}/").as_bytes(), 1000)
        .await?;
    if !there.is_empty() {
        return Err(MigrateError::NotEmpty {
            prefix,
            keys: there.len(),
        });
    }
    // The same records as the leader's flushes encode them, the meta record (the next job
    // id) first, as there.
    let mut batch = Batch::default();
    if let Some(meta) = &snapshot.meta {
        batch.puts.push((Table::Meta, String::new(), encode(meta)));
    }
    for n in &snapshot.nodes {
        batch.puts.push((Table::Nodes, n.name.clone(), encode(n)));
    }
    for j in &snapshot.jobs {
        batch.puts.push((Table::Jobs, j.id.clone(), encode(j)));
    }
    let leader = leader_key(&prefix);
    let total = batch.len();
    let mut written = 0;
    for chunk in batch.puts.chunks(etcd.max_txn_ops.max(1)) {
        let resp = client
            .txn(TxnRequest {
                compare: vec![created_at(&leader, 0)],
                success: chunk
                    .iter()
                    .map(|(t, k, v)| put(record_key(&prefix, *t, k), v.clone(), 0))
                    .collect(),
                failure: Vec::new(),
            })
            .await?;
        if !resp.succeeded {
            return Err(MigrateError::Raced {
                prefix,
                written,
                total,
            });
        }
        written += chunk.len();
    }
    Ok(Migrated {
        nodes: snapshot.nodes.len(),
        jobs: snapshot.jobs.len(),
        policy: snapshot.meta.map(|m| m.policy),
    })
}
