//! The node's side of a checkpoint the coordinator carries (a move without a shared path; the
//! coordinator's side is `coordinator::server::carry`).
//!
//! On `UploadCheckpoint` the node packs the job's checkpoint directory
//! ([`governor_proto::archive`]) into a file beside the job outputs while hashing it, then sends
//! it in pieces through the cluster agent; a newer upload of the same job supersedes an older
//! one. The pieces of a checkpoint coming to this node are written to a file and hashed; the
//! start that follows them (`carried_checkpoint`) unpacks it into the job's directory only if it
//! arrived whole and its SHA-256 matches, and is refused otherwise (the coordinator then starts
//! the job again on its source).
//!
//! The daemon reads and writes these directories with its own rights, as it starts the
//! coordinator's jobs with them.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use governor_proto::archive::{self, Pieces, Sha256};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::coordinator_client::{CheckpointChunk, UploadCheckpoint};

struct Incoming {
    attempt: u32,
    file: fs::File,
    hash: Sha256,
    next: u64,
}

/// Why a carried checkpoint cannot be used for a start (the start is refused with this text).
#[derive(Debug, thiserror::Error)]
pub(super) enum CarryError {
    #[error("its checkpoint did not arrive")]
    NotArrived,
    /// What the download said (checksum, size, the source's own packing error).
    #[error("its checkpoint did not arrive intact: {0}")]
    NotIntact(String),
    #[error("cannot open its checkpoint {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot unpack its checkpoint: {0}")]
    Unpack(#[from] governor_proto::archive::ArchiveError),
    #[error("the unpacking task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A CRIU dump's files could not go back where the job wrote them.
    #[error(transparent)]
    Place(#[from] crate::criu::CriuError),
}

/// Uploads and downloads of carried checkpoints.
pub(super) struct Carrier {
    dir: PathBuf,
    uploads: mpsc::Sender<CheckpointChunk>,
    /// The newest upload of each job; an older one stops at its next piece.
    generations: HashMap<String, Arc<AtomicU64>>,
    incoming: HashMap<String, Incoming>,
    /// (job, attempt) -> the verified archive, or why it is not there.
    received: HashMap<(String, u32), Result<PathBuf, String>>,
}

impl Carrier {
    /// Files go to `dir` (the job output directory's `carry/`).
    pub(super) fn new(dir: PathBuf, uploads: mpsc::Sender<CheckpointChunk>) -> Carrier {
        Carrier {
            dir,
            uploads,
            generations: HashMap::new(),
            incoming: HashMap::new(),
            received: HashMap::new(),
        }
    }

    /// Pack and send a job's checkpoint directory (a task; returns at once).
    pub(super) fn upload(&mut self, u: UploadCheckpoint) {
        let generation = self
            .generations
            .entry(u.job_id.clone())
            .or_insert_with(|| Arc::new(AtomicU64::new(0)))
            .clone();
        let mine = generation.fetch_add(1, Ordering::SeqCst) + 1;
        let file = self.dir.join(format!("{}-a{}.upload", u.job_id, u.attempt));
        let dir = self.dir.clone();
        let tx = self.uploads.clone();
        info!(job = %u.job_id, dir = %u.dir, "uploading a checkpoint to the coordinator");
        tokio::spawn(async move {
            let current = || generation.load(Ordering::SeqCst) == mine;
            let (job, attempt) = (u.job_id.clone(), u.attempt);
            let packed = tokio::task::spawn_blocking({
                let file = file.clone();
                move || -> Result<u64, String> {
                    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                    let out =
                        fs::File::create(&file).map_err(|e| format!("{}: {e}", file.display()))?;
                    let mut w = std::io::BufWriter::new(out);
                    let n = archive::pack(Path::new(&u.dir), &mut w).map_err(|e| e.to_string())?;
                    w.flush().map_err(|e| e.to_string())?;
                    Ok(n)
                }
            })
            .await
            .unwrap_or_else(|e| Err(format!("the packing task failed: {e}")));
            let total = match packed {
                Ok(n) => n,
                Err(error) => {
                    warn!(job = %job, %error, "cannot pack the checkpoint for the coordinator");
                    let _ = tx
                        .send(CheckpointChunk {
                            job_id: job,
                            attempt,
                            offset: 0,
                            data: Vec::new(),
                            last: true,
                            sha256: String::new(),
                            total_bytes: 0,
                            error,
                        })
                        .await;
                    let _ = fs::remove_file(&file);
                    return;
                }
            };
            let pieces = match Pieces::open(&file, &job, attempt) {
                Ok(p) => p,
                Err(e) => {
                    warn!(job = %job, error = %e, "cannot read back the packed checkpoint");
                    let _ = fs::remove_file(&file);
                    return;
                }
            };
            for piece in pieces {
                if !current() {
                    break; // a newer upload of this job took over
                }
                match piece {
                    Ok(p) => {
                        if tx.send(p).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        warn!(job = %job, error = %e, "cannot read back the packed checkpoint");
                        break;
                    }
                }
            }
            let _ = fs::remove_file(&file);
            info!(job = %job, bytes = total, "checkpoint sent to the coordinator");
        });
    }

    /// A piece of a checkpoint coming to this node.
    pub(super) fn receive(&mut self, c: CheckpointChunk) {
        let key = (c.job_id.clone(), c.attempt);
        if c.offset == 0 {
            self.received.remove(&key);
            let path = self
                .dir
                .join(format!("{}-a{}.incoming", c.job_id, c.attempt));
            match fs::create_dir_all(&self.dir).and_then(|()| fs::File::create(&path)) {
                Ok(file) => {
                    self.incoming.insert(
                        c.job_id.clone(),
                        Incoming {
                            attempt: c.attempt,
                            file,
                            hash: Sha256::default(),
                            next: 0,
                        },
                    );
                }
                Err(e) => {
                    self.received
                        .insert(key, Err(format!("cannot write {}: {e}", path.display())));
                    return;
                }
            }
        }
        let Some(inc) = self.incoming.get_mut(&c.job_id) else {
            return; // the rest of a transfer that already failed
        };
        if inc.attempt != c.attempt || inc.next != c.offset {
            self.incoming.remove(&c.job_id);
            self.received
                .insert(key, Err("its pieces came out of order".into()));
            return;
        }
        if let Err(e) = inc.file.write_all(&c.data) {
            self.incoming.remove(&c.job_id);
            self.received
                .insert(key, Err(format!("cannot write it: {e}")));
            return;
        }
        inc.hash.update(&c.data);
        inc.next += c.data.len() as u64;
        if !c.last {
            return;
        }
        let inc = self.incoming.remove(&c.job_id).expect("present");
        let path = self
            .dir
            .join(format!("{}-a{}.incoming", c.job_id, c.attempt));
        let sum = inc.hash.hex();
        let result = if inc.next != c.total_bytes || sum != c.sha256 {
            let _ = fs::remove_file(&path);
            Err(format!(
                "checksum mismatch: {} bytes with SHA-256 {sum}, the node that saved it sent {} bytes with {}",
                inc.next, c.total_bytes, c.sha256
            ))
        } else {
            Ok(path)
        };
        self.received.insert(key, result);
    }

    /// The checkpoint carried for a start of `job` (attempt `attempt`), unpacked into `dir`;
    /// `Err` says why the start must be refused.
    /// `fresh`: empty `dir` first (a CRIU dump replaces the older one whole).
    pub(super) async fn unpack_for(
        &mut self,
        job: &str,
        attempt: u32,
        dir: &Path,
        fresh: bool,
    ) -> Result<u64, CarryError> {
        let archive = match self.received.remove(&(job.to_owned(), attempt)) {
            Some(Ok(path)) => path,
            Some(Err(why)) => return Err(CarryError::NotIntact(why)),
            None => return Err(CarryError::NotArrived),
        };
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || {
            if fresh {
                let _ = fs::remove_dir_all(&dir);
            }
            let result = fs::File::open(&archive)
                .map_err(|source| CarryError::Open {
                    path: archive.clone(),
                    source,
                })
                .and_then(|f| Ok(archive::unpack(&mut std::io::BufReader::new(f), &dir)?));
            let _ = fs::remove_file(&archive);
            result
        })
        .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor_proto::archive::CHUNK_BYTES;

    #[tokio::test]
    async fn a_checkpoint_goes_up_in_pieces_and_comes_down_whole_or_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("ckpt");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("state.json"), b"{\"epoch\": 7}").unwrap();
        fs::write(src.join("weights.bin"), vec![3u8; 3 * CHUNK_BYTES / 2]).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let mut source = Carrier::new(tmp.path().join("a"), tx);
        source.upload(UploadCheckpoint {
            job_id: "j1".into(),
            attempt: 0,
            dir: src.display().to_string(),
        });
        let mut pieces = Vec::new();
        while let Some(p) = rx.recv().await {
            let last = p.last;
            pieces.push(p);
            if last {
                break;
            }
        }
        assert!(pieces.len() >= 2, "{} pieces", pieces.len());
        assert!(pieces.iter().all(|p| p.error.is_empty()));

        // Downloaded as attempt 1 on another node: whole, unpacked into the job's directory.
        let (tx2, _rx2) = mpsc::channel(1);
        let mut target = Carrier::new(tmp.path().join("b"), tx2);
        for p in &pieces {
            target.receive(CheckpointChunk {
                attempt: 1,
                ..p.clone()
            });
        }
        let dest = tmp.path().join("restored");
        let files = target.unpack_for("j1", 1, &dest, false).await.unwrap();
        assert_eq!(files, 2);
        assert_eq!(
            fs::read(dest.join("weights.bin")).unwrap(),
            vec![3u8; 3 * CHUNK_BYTES / 2]
        );

        // One byte flipped on the way: refused.
        let mut bad = pieces.clone();
        bad[0].data[10] ^= 1;
        for p in &bad {
            target.receive(CheckpointChunk {
                attempt: 2,
                ..p.clone()
            });
        }
        let e = target.unpack_for("j1", 2, &dest, false).await.unwrap_err();
        assert!(matches!(e, CarryError::NotIntact(_)), "{e:?}");
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        // Nothing arrived at all.
        let e = target
            .unpack_for("j1", 3, Path::new("/nonexistent"), false)
            .await
            .unwrap_err();
        assert!(matches!(e, CarryError::NotArrived), "{e:?}");
    }

    #[tokio::test]
    async fn a_directory_that_cannot_be_packed_is_reported_in_the_last_piece() {
        let tmp = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let mut source = Carrier::new(tmp.path().join("a"), tx);
        source.upload(UploadCheckpoint {
            job_id: "j9".into(),
            attempt: 0,
            dir: tmp.path().join("missing").display().to_string(),
        });
        let p = rx.recv().await.unwrap();
        assert!(p.last && !p.error.is_empty(), "{p:?}");
    }
}
