//! The embedded backend: a redb database (one file, crash-safe: every commit is durable and
//! atomic) holding nodes, jobs and settings as JSON values.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::{Batch, Snapshot, StoreError, Table};

const NODES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("nodes");
const JOBS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("jobs");
const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
const META_KEY: &str = "meta";

/// The open redb store.
pub struct RedbStore {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .finish()
    }
}

impl RedbStore {
    /// Open (or create) the store at `path`, creating its directory.
    pub fn open(path: &Path) -> Result<RedbStore, StoreError> {
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
        let store = RedbStore {
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
            snap.nodes
                .push(super::decode("nodes", k.value(), v.value())?);
        }
        let jobs = tx.open_table(JOBS).map_err(|e| self.io(e))?;
        for row in jobs.iter().map_err(|e| self.io(e))? {
            let (k, v) = row.map_err(|e| self.io(e))?;
            snap.jobs.push(super::decode("jobs", k.value(), v.value())?);
        }
        let meta = tx.open_table(META).map_err(|e| self.io(e))?;
        if let Some(v) = meta.get(META_KEY).map_err(|e| self.io(e))? {
            snap.meta = Some(super::decode("meta", META_KEY, v.value())?);
        }
        Ok(snap)
    }

    /// Write a batch in one transaction: it all lands or none of it does.
    pub fn save(&self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let mut nodes = tx.open_table(NODES)?;
            let mut jobs = tx.open_table(JOBS)?;
            let mut meta = tx.open_table(META)?;
            for (table, key, value) in &batch.puts {
                match table {
                    Table::Nodes => nodes.insert(key.as_str(), value.as_slice())?,
                    Table::Jobs => jobs.insert(key.as_str(), value.as_slice())?,
                    Table::Meta => meta.insert(META_KEY, value.as_slice())?,
                };
            }
            for (table, key) in &batch.deletes {
                match table {
                    Table::Nodes => nodes.remove(key.as_str())?,
                    Table::Jobs => jobs.remove(key.as_str())?,
                    Table::Meta => meta.remove(META_KEY)?,
                };
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ClusterState, StateConfig};
    use governor_proto::control::{JobSpec, JobState};
    use governor_proto::node::{Hello, NodeCapacity};

    fn save_all(store: &RedbStore, s: &mut ClusterState) {
        let dirty = s.take_dirty();
        let batch = Batch::of(
            &dirty,
            &s.meta(),
            |n| s.node_record(n).cloned(),
            |j| s.job_record(j).cloned(),
        );
        store.save(&batch).unwrap();
    }

    #[test]
    fn state_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/coordinator.redb");
        {
            let store = RedbStore::open(&path).unwrap();
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
        let store = RedbStore::open(&path).unwrap();
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
        let store = RedbStore::open(&path).unwrap();
        let snap = store.load().unwrap();
        assert!(snap.meta.is_none() && snap.nodes.is_empty() && snap.jobs.is_empty());
        store
            .write(|tx| {
                tx.open_table(JOBS)?.insert("j7", b"{not json".as_slice())?;
                Ok(())
            })
            .unwrap();
        let e = store.load().unwrap_err().to_string();
        assert!(e.contains("record \"j7\" in jobs is not valid"), "{e}");
    }

    #[test]
    fn a_second_coordinator_on_the_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.redb");
        let _first = RedbStore::open(&path).unwrap();
        let e = RedbStore::open(&path).unwrap_err().to_string();
        assert!(e.contains("is another coordinator using it?"), "{e}");
    }
}
