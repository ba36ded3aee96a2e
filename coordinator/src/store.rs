//! The coordinator's store: a redb database (one file, crash-safe: every commit is durable and
//! atomic) holding nodes, jobs and settings as JSON values.
//!
//! JSON rather than a binary encoding so the records can grow fields (serde defaults) without a
//! migration, and so an operator can read them with a redb tool when things go wrong.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::state::{Dirty, JobRecord, Meta, NodeRecord};

const NODES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("nodes");
const JOBS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("jobs");
const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
const META_KEY: &str = "meta";

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot open the coordinator store {path}: {source} (is another coordinator using it?)"
    )]
    Open {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("coordinator store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("coordinator store {path}: record {key:?} in table {table} is not valid: {source}")]
    Corrupt {
        path: PathBuf,
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
}

/// Everything the store holds, as loaded at start-up.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub meta: Option<Meta>,
    pub nodes: Vec<NodeRecord>,
    pub jobs: Vec<JobRecord>,
}

/// The open store.
pub struct Store {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Open (or create) the store at `path`, creating its directory.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
                path: dir.to_owned(),
                source,
            })?;
        }
        let db = Database::create(path).map_err(|e| StoreError::Open {
            path: path.to_owned(),
            source: Box::new(e.into()),
        })?;
        let store = Store {
            db,
            path: path.to_owned(),
        };
        // Create the tables so reads of a fresh store find them.
        store.write(|_| Ok(()))?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            source: Box::new(e.into()),
        }
    }

    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(|e| self.io(e))?;
        {
            tx.open_table(NODES).map_err(|e| self.io(e))?;
            tx.open_table(JOBS).map_err(|e| self.io(e))?;
            tx.open_table(META).map_err(|e| self.io(e))?;
        }
        f(&tx).map_err(|e| self.io(e))?;
        tx.commit().map_err(|e| self.io(e))
    }

    /// Load everything.
    pub fn load(&self) -> Result<Snapshot, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.io(e))?;
        let mut snap = Snapshot::default();
        let nodes = tx.open_table(NODES).map_err(|e| self.io(e))?;
        for row in nodes.iter().map_err(|e| self.io(e))? {
            let (k, v) = row.map_err(|e| self.io(e))?;
            snap.nodes.push(self.decode("nodes", k.value(), v.value())?);
        }
        let jobs = tx.open_table(JOBS).map_err(|e| self.io(e))?;
        for row in jobs.iter().map_err(|e| self.io(e))? {
            let (k, v) = row.map_err(|e| self.io(e))?;
            snap.jobs.push(self.decode("jobs", k.value(), v.value())?);
        }
        let meta = tx.open_table(META).map_err(|e| self.io(e))?;
        if let Some(v) = meta.get(META_KEY).map_err(|e| self.io(e))? {
            snap.meta = Some(self.decode("meta", META_KEY, v.value())?);
        }
        Ok(snap)
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        table: &'static str,
        key: &str,
        bytes: &[u8],
    ) -> Result<T, StoreError> {
        serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
            path: self.path.clone(),
            table,
            key: key.to_owned(),
            source,
        })
    }

    /// Write what changed, in one transaction: it all lands or none of it does.
    pub fn save(
        &self,
        dirty: &Dirty,
        meta: &Meta,
        node: impl Fn(&str) -> Option<NodeRecord>,
        job: impl Fn(&str) -> Option<JobRecord>,
    ) -> Result<(), StoreError> {
        if dirty.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let mut nodes = tx.open_table(NODES)?;
            for name in &dirty.nodes {
                if let Some(r) = node(name) {
                    nodes.insert(name.as_str(), encode(&r).as_slice())?;
                }
            }
            let mut jobs = tx.open_table(JOBS)?;
            for id in &dirty.jobs {
                if let Some(r) = job(id) {
                    jobs.insert(id.as_str(), encode(&r).as_slice())?;
                }
            }
            for id in &dirty.removed_jobs {
                jobs.remove(id.as_str())?;
            }
            if dirty.meta {
                let mut m = tx.open_table(META)?;
                m.insert(META_KEY, encode(meta).as_slice())?;
            }
            Ok(())
        })
    }
}

/// JSON encoding of a record (the record types always serialise).
fn encode<T: serde::Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).expect("records serialise to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ClusterState, StateConfig};
    use governor_proto::control::{JobSpec, JobState};
    use governor_proto::node::{Hello, NodeCapacity};

    fn save_all(store: &Store, s: &mut ClusterState) {
        let dirty = s.take_dirty();
        store
            .save(
                &dirty,
                &s.meta(),
                |n| s.node_record(n).cloned(),
                |j| s.job_record(j).cloned(),
            )
            .unwrap();
    }

    #[test]
    fn state_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/coordinator.redb");
        {
            let store = Store::open(&path).unwrap();
            let mut s = ClusterState::new(StateConfig::default(), "procon").unwrap();
            s.register(
                0.0,
                Hello {
                    node_name: "n1".into(),
                    capacity: NodeCapacity::cpu_only(4.0, 1 << 30),
                    agent_version: "t".into(),
                    can_dump: false,
                },
                "1.2.3.4:5".into(),
            );
            s.submit(1.0, JobSpec::new("a", vec!["x".into()], "/tmp/a.log"));
            s.submit(1.0, JobSpec::new("b", vec!["x".into()], "/tmp/b.log"));
            save_all(&store, &mut s);
        }
        let store = Store::open(&path).unwrap();
        let snap = store.load().unwrap();
        assert_eq!(snap.meta.as_ref().unwrap().policy, "procon");
        assert_eq!(snap.meta.as_ref().unwrap().next_seq, 3);
        assert_eq!(snap.nodes.len(), 1);
        assert_eq!(snap.nodes[0].address, "1.2.3.4:5");
        let mut ids: Vec<_> = snap
            .jobs
            .iter()
            .map(|j| (j.id.as_str(), j.status))
            .collect();
        ids.sort_by_key(|(id, _)| *id);
        assert_eq!(
            ids,
            [("j1", JobState::Starting), ("j2", JobState::Starting)]
        );
    }

    #[test]
    fn a_fresh_store_is_empty_and_a_corrupt_record_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let store = Store::open(&path).unwrap();
        let snap = store.load().unwrap();
        assert!(snap.meta.is_none() && snap.nodes.is_empty() && snap.jobs.is_empty());
        store
            .write(|tx| {
                tx.open_table(JOBS)?.insert("j7", b"{not json".as_slice())?;
                Ok(())
            })
            .unwrap();
        let e = store.load().unwrap_err().to_string();
        assert!(
            e.contains("record \"j7\" in table jobs is not valid"),
            "{e}"
        );
    }

    #[test]
    fn a_second_coordinator_on_the_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let _first = Store::open(&path).unwrap();
        let e = Store::open(&path).unwrap_err().to_string();
        assert!(e.contains("is another coordinator using it?"), "{e}");
    }
}
