//! The replicated backend: the records as keys of the cluster's etcd, written by the leader only.
//!
//! Keys: `PREFIX/nodes/NAME`, `PREFIX/jobs/ID`, `PREFIX/meta` (and `PREFIX/leader`, the
//! election's, [`crate::leader`]). Every write is one transaction whose first compare is the
//! leader key's create revision ([`crate::leader::Fence`]): a replica that no longer leads
//! writes nothing, and learns it from the refusal.
//!
//! A flush's batch is one transaction when it has at most `max_txn_ops` writes (etcd refuses
//! larger ones), else several, each fenced. What must change together is in one record: a job's
//! record holds its members, its node and its move's phase, so every job's state is atomic; a
//! leader lost between two parts of a batch leaves some jobs at their previous flush, as a
//! crash between two flushes would. The meta record (the next job id) goes first.

use governor_proto::etcd::{RequestOp, TxnRequest};

use super::{Batch, Snapshot, StoreError, Table};
use crate::etcd::{Etcd, created_at, delete, put};
use crate::leader::{Fence, LeaseClock};

/// Keys read per request when loading.
const PAGE: i64 = 1000;

#[derive(Debug)]
pub struct EtcdStore {
    etcd: Etcd,
    prefix: String,
    fence: Fence,
    clock: LeaseClock,
    max_txn_ops: usize,
}

/// The key of a record under `prefix` (without its trailing `/`).
pub fn record_key(prefix: &str, table: Table, name: &str) -> Vec<u8> {
    match table {
        Table::Meta => format!("{prefix}/meta"),
        t => format!("{prefix}/{}/{name}", t.name()),
    }
    .into_bytes()
}

/// The leader key under `prefix`.
pub fn leader_key(prefix: &str) -> Vec<u8> {
    format!("{}/leader", prefix.trim_end_matches('/')).into_bytes()
}

impl EtcdStore {
    pub fn new(
        etcd: Etcd,
        prefix: &str,
        fence: Fence,
        clock: LeaseClock,
        max_txn_ops: usize,
    ) -> EtcdStore {
        EtcdStore {
            etcd,
            prefix: prefix.trim_end_matches('/').to_owned(),
            fence,
            clock,
            max_txn_ops: max_txn_ops.max(1),
        }
    }

    /// The leadership its writes are fenced on.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    pub fn describe(&self) -> String {
        format!("etcd {:?} under {}", self.etcd, self.prefix)
    }

    fn key(&self, table: Table, name: &str) -> Vec<u8> {
        record_key(&self.prefix, table, name)
    }

    /// Every record under the prefix, at one revision.
    pub async fn load(&self) -> Result<Snapshot, StoreError> {
        let mut snap = Snapshot::default();
        let root = format!("{}/", self.prefix);
        for kv in self.etcd.range_prefix(root.as_bytes(), PAGE).await? {
            let key = String::from_utf8_lossy(&kv.key);
            let rest = &key[root.len()..];
            if rest == "meta" {
                snap.meta = Some(super::decode("meta", rest, &kv.value)?);
            } else if let Some(name) = rest.strip_prefix("nodes/") {
                snap.nodes.push(super::decode("nodes", name, &kv.value)?);
            } else if let Some(id) = rest.strip_prefix("jobs/") {
                snap.jobs.push(super::decode("jobs", id, &kv.value)?);
            }
        }
        Ok(snap)
    }

    /// Write a batch, fenced on this replica's leadership.
    pub async fn save(&self, batch: &Batch) -> Result<(), StoreError> {
        let ops: Vec<RequestOp> = batch
            .puts
            .iter()
            .map(|(t, k, v)| put(self.key(*t, k), v.clone(), 0))
            .chain(batch.deletes.iter().map(|(t, k)| delete(self.key(*t, k))))
            .collect();
        for chunk in ops.chunks(self.max_txn_ops) {
            if !self.clock.valid() {
                return Err(StoreError::Deposed);
            }
            let resp = self
                .etcd
                .txn(TxnRequest {
                    compare: vec![created_at(&self.fence.key, self.fence.revision)],
                    success: chunk.to_vec(),
                    failure: Vec::new(),
                })
                .await?;
            if !resp.succeeded {
                self.clock.expire();
                return Err(StoreError::Deposed);
            }
        }
        Ok(())
    }
}
