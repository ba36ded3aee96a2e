//! Moving a running job to another node without losing its work, by one of three means:
//! - a framework checkpoint on a path every node mounts (`--checkpoint-dir`): the job saves
//!   there and the same command resumes from it on the target; nothing is carried;
//! - a framework checkpoint on the source's local disk (`--checkpoint-dir ... --carry`): the
//!   coordinator fetches the saved directory from the source ([`UploadCheckpoint`]) and hands it
//!   to the target before the start;
//! - a CRIU dump of the job's process tree, for a job that declared no checkpoint, where both
//!   nodes can dump and restore (root with `criu`): carried by the coordinator the same way.
//!
//! A move goes `saving` (the source node is sent [`SaveJob`]: the job gets its save signal,
//! saves at its next epoch boundary and exits with status 0, or is dumped; until then it runs)
//! → the source reports it exited *saved* → `restoring` (the member is re-pointed at the target
//! and started there with the next attempt number, from the shared or the carried checkpoint)
//! → the target reports it running → `done`.
//!
//! Every failure ends with the job running on exactly one node, and the job's record says what
//! happened ([`JobMove::message`]):
//! - it does not save within [`StateConfig::save_timeout_s`](super::StateConfig): the move
//!   `failed` and the job keeps running on the source. Should its save arrive later, it is
//!   started again on the source (it has exited there);
//! - it ends on its own while saving (its last epoch, a crash): the move `failed`, and the
//!   job's own outcome stands;
//! - the target cannot start it, reports it failed, or is lost before it was handed the start:
//!   `rolling back`, started again on the source from the checkpoint, `rolled back` once it
//!   runs (if the source cannot run it either, the job fails as any job whose start fails);
//! - the target is lost after it was handed the start: it may be running the job (a governor
//!   that dies leaves its jobs running), so starting it on the source at once would run it
//!   twice, both copies writing one checkpoint directory. The move waits
//!   [`StateConfig::lost_target_wait_s`](super::StateConfig) for the target to come back
//!   (it is sent the start again, idempotent there, and reports the job); only then does it
//!   roll back. A target that comes back later still running it is told to stop there;
//! - the coordinator restarts: the move is in the store with the job; a node that reconnects is
//!   sent again the save or the start it has not confirmed (both are idempotent on the node).
//!
//! Single-member CPU jobs only: a gang would need all members saved at the same epoch, and a
//! GPU job its devices on the target (and `cuda-checkpoint` for a transparent move).
//!
//! [`UploadCheckpoint`]: governor_proto::node::UploadCheckpoint

use governor_proto::control::{JobMove, JobState, MovePhase, NodeState};
use governor_proto::node::{Checkpoint, NodeCommand, RunState, SaveJob};
use tracing::info;

use governor_placement::queue::Seconds;

use super::{ClusterState, JobRecord};

/// Why a move is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error(
        "job {id} declared no checkpoint and node {node} cannot dump it with CRIU, so it cannot be moved without losing its work (submit it with --checkpoint-dir, or run the node's governor as root with criu installed)"
    )]
    NoCheckpoint { id: String, node: String },
    #[error(
        "job {id} moves by CRIU (it declared no checkpoint) and node {node} cannot restore a CRIU dump"
    )]
    TargetCannotDump { id: String, node: String },
    #[error("job {id} is {status}; only a running job can be moved")]
    NotRunning { id: String, status: JobState },
    #[error("job {id} has {members} members or GPUs; only single-member CPU jobs move for now")]
    Gang { id: String, members: u32 },
    #[error("job {id} is already moving ({phase} {from} -> {to})")]
    AlreadyMoving {
        id: String,
        phase: MovePhase,
        from: String,
        to: String,
    },
    #[error("node {node} is not ready ({status})")]
    TargetNotReady { node: String, status: NodeState },
    #[error("no node {node}: `govctl nodes` lists them")]
    NoSuchNode { node: String },
    #[error("job {id} already runs on {node}")]
    SameNode { id: String, node: String },
    #[error("no other ready node has room for job {id}")]
    NoTarget { id: String },
}

/// Whether the job moves by CRIU: it declared no checkpoint, or its earlier moves were by CRIU.
pub(super) fn needs_dump(job: &JobRecord) -> bool {
    job.spec
        .as_ref()
        .is_some_and(|s| s.checkpoint.as_ref().is_none_or(|c| c.transparent))
}

impl ClusterState {
    /// Move a running job to `target` (or the node the coordinator picks): ask its node to save
    /// it. Returns the move as recorded.
    pub fn move_job(
        &mut self,
        now: Seconds,
        id: &str,
        target: Option<&str>,
        reason: &str,
    ) -> Result<JobMove, super::ControlError> {
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| super::ControlError::NoSuchJob { id: id.into() })?;
        let source = self.check_movable(job)?;
        let target = match target {
            Some(t) => {
                let node = self
                    .nodes
                    .get(t)
                    .ok_or_else(|| MoveError::NoSuchNode { node: t.into() })?;
                if t == source {
                    return Err(MoveError::SameNode {
                        id: id.into(),
                        node: t.into(),
                    }
                    .into());
                }
                if node.status != NodeState::Ready || node.session.is_none() {
                    return Err(MoveError::TargetNotReady {
                        node: t.into(),
                        status: node.status,
                    }
                    .into());
                }
                if needs_dump(job) && !node.record.can_dump {
                    return Err(MoveError::TargetCannotDump {
                        id: id.into(),
                        node: t.into(),
                    }
                    .into());
                }
                t.to_owned()
            }
            None => self
                .pick_target(job, &source)
                .ok_or_else(|| MoveError::NoTarget { id: id.into() })?,
        };
        Ok(self.begin_save(now, id, source, target, None, reason))
    }

    /// Ask `source` to save job `id` (checked movable) for a move to `target`, or (with
    /// `preempted_for`) to make room for that job, the job then going back to the queue.
    pub(super) fn begin_save(
        &mut self,
        now: Seconds,
        id: &str,
        source: String,
        target: String,
        preempted_for: Option<String>,
        reason: &str,
    ) -> JobMove {
        let job = &self.jobs[id];
        let transparent = needs_dump(job);
        let (dir, carry) = job
            .spec
            .as_ref()
            .and_then(|s| s.checkpoint.as_ref())
            .map(|c| (c.dir.clone(), c.carry))
            .unwrap_or_default();
        let record = JobMove {
            from_node: source.clone(),
            to_node: target.clone(),
            reason: reason.to_owned(),
            phase: MovePhase::Saving,
            requested_at_unix: now,
            saved_at_unix: None,
            running_at_unix: None,
            message: if transparent {
                "CRIU dump of its process tree, carried by the coordinator".to_owned()
            } else if carry {
                format!("framework checkpoint in {dir}, carried by the coordinator")
            } else {
                format!("framework checkpoint in {dir} (a path both nodes mount)")
            },
            bytes: 0,
            preempted_for,
            from_cores: None,
            to_cores: None,
            resized_for: None,
            start_sent_at_unix: None,
        };
        info!(job = id, from = %source, to = %target, reason, "moving a job: asking its node to save it");
        let job = self.jobs.get_mut(id).expect("checked by the caller");
        if transparent && let Some(spec) = job.spec.as_mut() {
            // From now on it moves (and is restored) by CRIU.
            spec.checkpoint = Some(Checkpoint::transparent());
        }
        job.moves.push(record.clone());
        self.outbox.push((
            source,
            NodeCommand::Save(SaveJob {
                job_id: id.to_owned(),
                reason: reason.to_owned(),
            }),
        ));
        self.dirty.jobs.insert(id.to_owned());
        record
    }

    /// The node a movable job runs on, or why it cannot move.
    pub(super) fn check_movable(&self, job: &JobRecord) -> Result<String, super::ControlError> {
        // Called for every submitted job in each admission round: nothing is allocated on the
        // way to the answer, only for the error.
        let id = || job.id.clone();
        let on = job.members.first().map_or("", |m| m.node.as_str());
        let Some(spec) = job.spec.as_ref() else {
            return Err(super::ControlError::LocalJob {
                id: id(),
                node: on.to_owned(),
            });
        };
        if spec.checkpoint.is_none() && !self.nodes.get(on).is_some_and(|n| n.record.can_dump) {
            return Err(MoveError::NoCheckpoint {
                id: id(),
                node: on.to_owned(),
            }
            .into());
        }
        if spec.replicas > 1 || spec.gpus > 0 {
            return Err(MoveError::Gang {
                id: id(),
                members: spec.replicas.max(spec.gpus),
            }
            .into());
        }
        if let Some(m) = job.active_move() {
            return Err(MoveError::AlreadyMoving {
                id: id(),
                phase: m.phase,
                from: m.from_node.clone(),
                to: m.to_node.clone(),
            }
            .into());
        }
        let member = job.members.first();
        match member {
            Some(m) if job.status == JobState::Running && m.state == RunState::Running => {
                Ok(m.node.clone())
            }
            _ => Err(MoveError::NotRunning {
                id: id(),
                status: job.status,
            }
            .into()),
        }
    }

    /// The target of a move `govctl move` asks for without `--to` (and of a node's standing
    /// request under [`super::MoveTarget::MostFree`]): the ready node, other than the source,
    /// with the most free cores (capacity less its reported use), then the fewest jobs, then by
    /// name; it must have the cores and memory the job declared.
    pub(super) fn pick_target(&self, job: &JobRecord, source: &str) -> Option<String> {
        self.nodes
            .values()
            .filter(|n| n.record.name != source)
            .filter_map(|n| Some((n, self.room_for(job, n)?)))
            .max_by(|a, b| {
                a.1.total_cmp(&b.1)
                    .then(b.0.report.jobs.len().cmp(&a.0.report.jobs.len()))
                    .then(b.0.record.name.cmp(&a.0.record.name))
            })
            .map(|(n, _)| n.record.name.clone())
    }

    /// The cores `name` has free by its last report (capacity less use; 0 for no such node).
    pub(super) fn free_cores(&self, name: &str) -> f64 {
        self.nodes.get(name).map_or(0.0, |n| {
            (n.record.capacity.cores - n.report.cpu_used_cores).max(0.0)
        })
    }

    /// The free cores of `node` if it can take `job` now (ready, connected, the cores and
    /// memory the job declared free, and able to restore a CRIU dump if the job moves by one).
    pub(super) fn room_for(&self, job: &JobRecord, node: &super::Node) -> Option<f64> {
        let spec = job.spec.as_ref()?;
        if node.status != NodeState::Ready
            || node.session.is_none()
            || (needs_dump(job) && !node.record.can_dump)
        {
            return None;
        }
        let free = self.free_cores(&node.record.name);
        let free_memory = node
            .record
            .capacity
            .memory_bytes
            .saturating_sub(node.report.memory_used_bytes);
        (free >= job.cores().unwrap_or(0.0) && free_memory >= spec.memory_bytes.unwrap_or(0))
            .then_some(free)
    }
}

#[cfg(test)]
#[path = "move_tests.rs"]
pub(super) mod tests;
