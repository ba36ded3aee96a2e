//! Checkpoints the coordinator carries between nodes (a move without a shared path).
//!
//! Relayed rather than sent node to node: the nodes hold only their mTLS session to the
//! coordinator (no node listens, no node needs to trust another), and the coordinator keeps
//! the verified copy until the move is over, so a source that dies after its upload does not
//! take the job's work with it. The cost is the bytes crossing the coordinator twice.
//!
//! The node that saved the job uploads its archive ([`governor_proto::archive`]) in pieces on its
//! session; they are written to `<store>.checkpoints/<job>.part`, hashed on the way, and on the
//! last piece checked against the sender's SHA-256 and size, then kept as `<job>.ckpt` with that
//! sum in `<job>.sha256`. A start command with `carried_checkpoint` is preceded, on the target's
//! session, by that file in pieces (with backpressure: a task awaits room in the session's
//! queue) and ends with the *source's* sum, not one the coordinator computes again: the node
//! checks it before it unpacks and starts, so a copy that changed at rest on the coordinator is
//! caught too (end to end).
//!
//! Fault injection for tests (as CRIU's `CRIU_FAULT`): with `GOVERNOR_FAULT=corrupt-carried:NAME`
//! in its environment, the coordinator flips one byte of the kept copy of job NAME's checkpoint
//! before sending it, as a disk would; the multi-node test checks that the move rolls back.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use governor_proto::archive::{Pieces, Sha256};
use governor_proto::node::{CheckpointChunk, CoordinatorMessage, NodeCommand, StartJob};
use tracing::{info, warn};

use super::actor::SessionTx;

/// What a piece completed.
#[derive(Debug, PartialEq)]
pub(super) enum Arrival {
    /// More pieces to come.
    More,
    /// The whole archive arrived intact.
    Whole { job: String, bytes: u64 },
    /// The upload failed (the sender said so, a piece was out of order, or the checksum did not
    /// match).
    Broken { job: String, reason: String },
}

struct Incoming {
    node: String,
    attempt: u32,
    file: fs::File,
    hash: Sha256,
    next: u64,
}

/// The checkpoints on their way through the coordinator.
pub(super) struct Carried {
    dir: PathBuf,
    incoming: HashMap<String, Incoming>,
    /// `GOVERNOR_FAULT=corrupt-carried:NAME`: the job whose kept copy is corrupted (tests).
    corrupt: Option<String>,
}

/// The SHA-256 and size of a kept archive, as the node that saved it sent them.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct SourceSum {
    pub sha256: String,
    pub bytes: u64,
}

impl Carried {
    /// Kept beside the store: `<store>.checkpoints/`.
    pub(super) fn beside(store: &Path) -> Carried {
        let corrupt = std::env::var("GOVERNOR_FAULT")
            .ok()
            .and_then(|f| f.strip_prefix("corrupt-carried:").map(str::to_owned));
        if let Some(name) = &corrupt {
            warn!(job = %name, "fault injection: the kept checkpoint of this job is corrupted before it is sent");
        }
        Carried {
            dir: store.with_extension("checkpoints"),
            incoming: HashMap::new(),
            corrupt,
        }
    }

    /// The sum the source sent for a kept archive (`None`: unknown, e.g. its file is lost).
    pub(super) fn source_sum(&self, job: &str) -> Option<SourceSum> {
        let text = fs::read_to_string(self.dir.join(format!("{job}.sha256"))).ok()?;
        let (sha256, bytes) = text.trim().split_once(' ')?;
        Some(SourceSum {
            sha256: sha256.to_owned(),
            bytes: bytes.parse().ok()?,
        })
    }

    /// Fault injection (tests): flip one byte in the middle of the kept copy of the job started
    /// by `start` when `GOVERNOR_FAULT` names it.
    pub(super) fn inject_fault(&self, start: &StartJob) {
        if self.corrupt.as_deref() != Some(start.name.as_str()) {
            return;
        }
        let path = self.archive(&start.job_id);
        let flipped = (|| -> std::io::Result<u64> {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = fs::OpenOptions::new().read(true).write(true).open(&path)?;
            let at = f.metadata()?.len() / 2;
            let mut byte = [0u8];
            f.seek(SeekFrom::Start(at))?;
            f.read_exact(&mut byte)?;
            byte[0] ^= 0x5a;
            f.seek(SeekFrom::Start(at))?;
            f.write_all(&byte)?;
            Ok(at)
        })();
        match flipped {
            Ok(at) => {
                warn!(job = %start.job_id, name = %start.name, at, "fault injection: one byte of the kept checkpoint flipped")
            }
            Err(e) => {
                warn!(job = %start.job_id, error = %e, "fault injection: cannot corrupt the kept checkpoint")
            }
        }
    }

    /// The verified archive of a job, once it arrived.
    pub(super) fn archive(&self, job: &str) -> PathBuf {
        self.dir.join(format!("{job}.ckpt"))
    }

    /// Take one uploaded piece from `node`.
    pub(super) fn receive(&mut self, node: &str, c: CheckpointChunk) -> Arrival {
        let job = c.job_id.clone();
        let broken = |reason: String| Arrival::Broken {
            job: job.clone(),
            reason,
        };
        if c.offset == 0 {
            // A (new) upload starts: whatever came before is dropped.
            if let Err(e) = fs::create_dir_all(&self.dir) {
                return broken(format!("cannot create {}: {e}", self.dir.display()));
            }
            let part = self.dir.join(format!("{job}.part"));
            match fs::File::create(&part) {
                Ok(file) => {
                    self.incoming.insert(
                        job.clone(),
                        Incoming {
                            node: node.to_owned(),
                            attempt: c.attempt,
                            file,
                            hash: Sha256::default(),
                            next: 0,
                        },
                    );
                }
                Err(e) => return broken(format!("cannot create {}: {e}", part.display())),
            }
        }
        let Some(inc) = self.incoming.get_mut(&job) else {
            return broken(format!("a piece at {} with no upload under way", c.offset));
        };
        if inc.node != node || inc.attempt != c.attempt || inc.next != c.offset {
            self.incoming.remove(&job);
            return broken(format!(
                "a piece out of order (at {} from {node}, attempt {})",
                c.offset, c.attempt
            ));
        }
        if let Err(e) = inc.file.write_all(&c.data) {
            self.incoming.remove(&job);
            return broken(format!("cannot write the checkpoint: {e}"));
        }
        inc.hash.update(&c.data);
        inc.next += c.data.len() as u64;
        if !c.last {
            return Arrival::More;
        }
        let inc = self.incoming.remove(&job).expect("present");
        let part = self.dir.join(format!("{job}.part"));
        if !c.error.is_empty() {
            let _ = fs::remove_file(&part);
            return broken(format!("node {node} could not send it: {}", c.error));
        }
        let sum = inc.hash.hex();
        if inc.next != c.total_bytes || sum != c.sha256 {
            let _ = fs::remove_file(&part);
            return broken(format!(
                "checksum mismatch: {} bytes with SHA-256 {sum}, the sender sent {} bytes with {}",
                inc.next, c.total_bytes, c.sha256
            ));
        }
        if let Err(e) = self.keep(&job, inc.file, &part, &format!("{sum} {}\n", inc.next)) {
            let _ = fs::remove_file(&part);
            return broken(format!("cannot keep the checkpoint: {e}"));
        }
        info!(job = %job, bytes = inc.next, from = node, "a carried checkpoint arrived intact");
        Arrival::Whole {
            job,
            bytes: inc.next,
        }
    }

    /// Keep a whole upload durably before its arrival is recorded in the store: the upload
    /// (`file`, at `part`) and its sum are `fsync`ed, the upload renamed to the archive's name,
    /// then the directory `fsync`ed, so that a store that says "arrived" after a power cut finds
    /// the archive whole with its sum. The same steps as the daemon's durable writes
    /// (`governor::sys::durable`), which the coordinator does not depend on; the archive is
    /// streamed in pieces, so it is renamed where it was written.
    fn keep(&self, job: &str, file: fs::File, part: &Path, sum: &str) -> std::io::Result<()> {
        file.sync_all()?;
        drop(file);
        let mut sum_file = fs::File::create(self.dir.join(format!("{job}.sha256")))?;
        sum_file.write_all(sum.as_bytes())?;
        sum_file.sync_all()?;
        fs::rename(part, self.archive(job))?;
        fs::File::open(&self.dir)?.sync_all()
    }

    /// Forget a job's archive (its move is over).
    pub(super) fn discard(&mut self, job: &str) {
        self.incoming.remove(job);
        let _ = fs::remove_file(self.archive(job));
        let _ = fs::remove_file(self.dir.join(format!("{job}.part")));
        let _ = fs::remove_file(self.dir.join(format!("{job}.sha256")));
    }
}

/// Send the job's archive in pieces, then its start, on a node's session (a task: it waits for
/// room in the session's queue). The last piece carries the source's sum (`source`) where it is
/// known, so the node checks what the source saved, not what the coordinator holds. A missing
/// archive sends the start alone: the node refuses it ("did not arrive") and the move rolls
/// back.
pub(super) fn send_with_checkpoint(
    archive: PathBuf,
    source: Option<SourceSum>,
    start: StartJob,
    tx: SessionTx,
) {
    tokio::spawn(async move {
        let (job, attempt) = (start.job_id.clone(), start.attempt);
        // A reader thread hands pieces over a small channel: at most a few MiB in memory.
        let (pieces_tx, mut pieces) =
            tokio::sync::mpsc::channel::<std::io::Result<CheckpointChunk>>(4);
        tokio::task::spawn_blocking(move || match Pieces::open(&archive, &job, attempt) {
            Ok(all) => {
                for mut piece in all {
                    if let (Ok(p), Some(s)) = (&mut piece, &source)
                        && p.last
                    {
                        p.sha256.clone_from(&s.sha256);
                        p.total_bytes = s.bytes;
                    }
                    if pieces_tx.blocking_send(piece).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = pieces_tx.blocking_send(Err(e));
            }
        });
        while let Some(piece) = pieces.recv().await {
            match piece {
                Ok(p) => {
                    let msg = CoordinatorMessage::Command(NodeCommand::Chunk(p)).into();
                    if tx.send(Box::new(Ok(msg))).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    warn!(job = %start.job_id, error = %e, "cannot read the carried checkpoint; sending the start alone");
                    break;
                }
            }
        }
        let msg = CoordinatorMessage::Command(NodeCommand::Start(start)).into();
        let _ = tx.send(Box::new(Ok(msg))).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(job: &str, offset: u64, data: &[u8], last: Option<(&str, u64)>) -> CheckpointChunk {
        CheckpointChunk {
            job_id: job.into(),
            attempt: 0,
            offset,
            data: data.to_vec(),
            last: last.is_some(),
            sha256: last.map(|l| l.0.to_owned()).unwrap_or_default(),
            total_bytes: last.map_or(0, |l| l.1),
            error: String::new(),
        }
    }

    #[test]
    fn pieces_in_order_with_the_right_checksum_arrive_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Carried::beside(&dir.path().join("coordinator.redb"));
        let mut h = Sha256::default();
        h.update(b"hello world");
        let sum = h.hex();
        assert_eq!(
            c.receive("a", piece("j1", 0, b"hello ", None)),
            Arrival::More
        );
        assert_eq!(
            c.receive("a", piece("j1", 6, b"world", Some((&sum, 11)))),
            Arrival::Whole {
                job: "j1".into(),
                bytes: 11
            }
        );
        assert_eq!(fs::read(c.archive("j1")).unwrap(), b"hello world");

        // A corrupted piece: the checksum does not match.
        c.receive("a", piece("j2", 0, b"hellO ", None));
        let got = c.receive("a", piece("j2", 6, b"world", Some((&sum, 11))));
        assert!(
            matches!(&got, Arrival::Broken { reason, .. } if reason.contains("checksum mismatch")),
            "{got:?}"
        );
        assert!(!c.archive("j2").exists());

        // A piece out of order, or from another node.
        c.receive("a", piece("j3", 0, b"hello ", None));
        assert!(matches!(
            c.receive("b", piece("j3", 6, b"world", None)),
            Arrival::Broken { .. }
        ));
        assert!(matches!(
            c.receive("a", piece("j4", 5, b"x", None)),
            Arrival::Broken { .. }
        ));
        c.discard("j1");
        assert!(!c.archive("j1").exists());
        assert_eq!(c.source_sum("j1"), None);
    }

    /// The target is sent the source's sum, so a kept copy that changed at rest (here flipped
    /// by the fault switch, as a disk would) does not match it there.
    #[tokio::test]
    async fn a_copy_corrupted_at_rest_is_sent_with_the_sources_sum() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Carried::beside(&dir.path().join("coordinator.redb"));
        let data = b"the job's saved state".repeat(100);
        let mut h = Sha256::default();
        h.update(&data);
        let sum = h.hex();
        let bytes = data.len() as u64;
        assert!(matches!(
            c.receive("a", piece("j1", 0, &data, Some((&sum, bytes)))),
            Arrival::Whole { .. }
        ));
        assert_eq!(
            c.source_sum("j1"),
            Some(SourceSum {
                sha256: sum.clone(),
                bytes
            })
        );
        c.corrupt = Some("mlp".into());
        let start = StartJob {
            job_id: "j1".into(),
            replica: 0,
            replicas: 1,
            name: "mlp".into(),
            argv: vec!["train".into()],
            log_path: "/data/train.log".into(),
            metric: String::new(),
            maximise: false,
            gpu_indices: Vec::new(),
            priority: 0,
            env: Default::default(),
            cores: None,
            memory_bytes: None,
            checkpoint: None,
            attempt: 1,
            carried_checkpoint: true,
            user: String::new(),
        };
        c.inject_fault(&start);
        assert_ne!(fs::read(c.archive("j1")).unwrap(), data);

        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        send_with_checkpoint(c.archive("j1"), c.source_sum("j1"), start, tx);
        let mut sent = Vec::new();
        let mut last = None;
        while let Some(item) = rx.recv().await {
            let msg = CoordinatorMessage::try_from((*item).unwrap()).unwrap();
            match msg {
                CoordinatorMessage::Command(NodeCommand::Chunk(p)) => {
                    sent.extend_from_slice(&p.data);
                    if p.last {
                        last = Some((p.sha256, p.total_bytes));
                    }
                }
                CoordinatorMessage::Command(NodeCommand::Start(s)) => {
                    assert_eq!(s.job_id, "j1");
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let mut got = Sha256::default();
        got.update(&sent);
        assert_eq!(last, Some((sum.clone(), bytes)), "the source's sum is sent");
        assert_ne!(got.hex(), sum, "what was sent is the corrupted copy");
    }
}
