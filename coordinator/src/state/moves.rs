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

use governor_proto::control::{JobMove, JobStatus, MovePhase, NodeStatus};
use governor_proto::node::{Checkpoint, NodeCommand, RunState, SaveJob, UploadCheckpoint};
use tracing::{info, warn};

use crate::queue::Seconds;
use governor_placement::specon::{ConvergedJob, MigrationTarget, SpeCon};

use super::{ClusterState, JobRecord, MigrationAsk};

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
    NotRunning { id: String, status: JobStatus },
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
    TargetNotReady { node: String, status: NodeStatus },
    #[error("no node {node}: `govctl nodes` lists them")]
    NoSuchNode { node: String },
    #[error("job {id} already runs on {node}")]
    SameNode { id: String, node: String },
    #[error("no other ready node has room for job {id}")]
    NoTarget { id: String },
}

/// How a move's record begins while (and after) it waits for a target lost after it was
/// handed the job's start.
fn lost_after_start(target: &str) -> String {
    format!("target {target} was lost after it was sent the start")
}

/// Whether the job moves by CRIU: it declared no checkpoint, or its earlier moves were by CRIU.
fn needs_dump(job: &JobRecord) -> bool {
    job.spec
        .as_ref()
        .is_some_and(|s| s.checkpoint.as_ref().is_none_or(|c| c.transparent))
}

impl ClusterState {
    /// Move a running job to `target` (or the node the coordinator picks): ask its node to save
    /// it. Returns the move as recorded.
    pub fn migrate(
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
                if node.status != NodeStatus::Ready || node.session.is_none() {
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
            Some(m) if job.status == JobStatus::Running && m.state == RunState::Running => {
                Ok(m.node.clone())
            }
            _ => Err(MoveError::NotRunning {
                id: id(),
                status: job.status,
            }
            .into()),
        }
    }

    /// The target of a move `govctl migrate` asks for without `--to` (and of a node's standing
    /// request under [`super::MoveTarget::MostFree`]): the ready node, other than the source,
    /// with the most free cores (capacity less its reported use), then the fewest jobs, then by
    /// name; it must have the cores and memory the job declared.
    fn pick_target(&self, job: &JobRecord, source: &str) -> Option<String> {
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
    fn free_cores(&self, name: &str) -> f64 {
        self.nodes.get(name).map_or(0.0, |n| {
            (n.record.capacity.cores - n.report.cpu_used_cores).max(0.0)
        })
    }

    /// The free cores of `node` if it can take `job` now (ready, connected, the cores and
    /// memory the job declared free, and able to restore a CRIU dump if the job moves by one).
    fn room_for(&self, job: &JobRecord, node: &super::Node) -> Option<f64> {
        let spec = job.spec.as_ref()?;
        if node.status != NodeStatus::Ready
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

    /// Advance the moves of the jobs with a member on `node` after its report (before the
    /// jobs' status is derived, so that a saved exit does not read as the job's completion).
    pub(super) fn advance_moves_on(&mut self, node: &str, now: Seconds) {
        for id in self.jobs_on(node) {
            self.advance_move(&id, now);
        }
    }

    /// One step of a job's move from what its member's node reported.
    pub(super) fn advance_move(&mut self, id: &str, now: Seconds) {
        let Some(job) = self.jobs.get(id) else { return };
        let Some(member) = job.members.first() else {
            return;
        };
        let node = self.nodes.get(&member.node);
        let (state, saved, node_status, node_seen) = (
            member.state,
            member.saved,
            node.map(|n| n.status),
            node.map(|n| n.last_seen),
        );
        // Reporting now: ready, its session open and reported on since it (re)connected (a node
        // whose stream closed is not lost yet, but its last report is all there is).
        let reporting =
            node.is_some_and(|n| n.status == NodeStatus::Ready && n.session.is_some() && n.synced);
        // Every report of every job passes here: nothing to do (no clone) unless a move is
        // under way or the job exited saved.
        if job.active_move().is_none() && !(state == RunState::Exited && saved) {
            return;
        }
        let save_error = member.save_error.clone();
        let Some(mv) = job.moves.last().cloned() else {
            if state == RunState::Exited && saved && !job.status.is_finished() {
                // Saved for a move this coordinator does not know (lost in a crash): it has not
                // completed, it waits to be resumed. Start it again where it was.
                let here = member.node.clone();
                warn!(job = id, node = %here, "a job saved for a move no one remembers; starting it again where it was");
                self.repoint(id, now, &here, MovePhase::Failed, false, |_| {});
            }
            return;
        };
        if job.status.is_finished() {
            // Cancelled (or failed) while it moved: nothing more to do.
            if !mv.phase.is_over() {
                let status = job.status;
                self.set_move(id, |m| {
                    m.phase = MovePhase::Failed;
                    m.message = format!("the job ended ({status}) during the move");
                });
            }
            return;
        }
        let carry = job
            .spec
            .as_ref()
            .and_then(|s| s.checkpoint.as_ref())
            .map(|c| (c.carry, c.dir.clone()));
        match mv.phase {
            MovePhase::Saving if state == RunState::Exited && saved => {
                if let Some((true, dir)) = carry.filter(|_| mv.to_node != mv.from_node) {
                    // No shared path: the checkpoint comes to the coordinator first.
                    let attempt = member.attempt;
                    self.set_move(id, |m| {
                        m.phase = MovePhase::Transferring;
                        m.saved_at_unix = Some(now);
                    });
                    self.outbox.push((
                        mv.from_node.clone(),
                        NodeCommand::Upload(UploadCheckpoint {
                            job_id: id.to_owned(),
                            attempt,
                            dir,
                        }),
                    ));
                    info!(job = id, from = %mv.from_node, "saved; carrying its checkpoint");
                    return;
                }
                if mv.preempted_for.is_some() {
                    self.set_move(id, |m| m.saved_at_unix = Some(now));
                    self.requeue(id);
                    return;
                }
                self.repoint(id, now, &mv.to_node, MovePhase::Restoring, false, |m| {
                    m.saved_at_unix = Some(now);
                });
                info!(job = id, from = %mv.from_node, to = %mv.to_node, "saved; starting it on the target");
            }
            MovePhase::Saving if state == RunState::Running && !save_error.is_empty() => {
                // Its node could not save it (a CRIU dump that failed): it runs on there.
                warn!(job = id, node = %mv.from_node, reason = %save_error, "the job could not be saved for its move; it runs on");
                self.set_move(id, |m| {
                    m.phase = MovePhase::Failed;
                    m.message = format!("{} could not save it: {save_error}", m.from_node);
                });
            }
            MovePhase::Saving if state.is_finished() => {
                // It ended on its own (finished, crashed) before it saved: its own outcome.
                self.set_move(id, |m| {
                    m.phase = MovePhase::Failed;
                    m.message = format!(
                        "the job ended on {} before it saved ({state}); nothing to move",
                        m.from_node
                    );
                });
            }
            MovePhase::Restoring | MovePhase::RollingBack
                if state == RunState::Running && reporting =>
            {
                // Started is not restored: a restore that fails does so in its first seconds
                // (measured in the VM bed: exit 0.2 s after "running"). The move is over once
                // the job has run there for `move_confirm_s`; until then a failure rolls back.
                // Only a node that reports confirms it: the state of a lost, disconnected or
                // not yet re-synced node is its last report, not what runs there now.
                let Some(since) = mv.running_at_unix else {
                    self.set_move(id, |m| m.running_at_unix = Some(now));
                    return;
                };
                if now - since < self.config.move_confirm_s {
                    return;
                }
                let done = if mv.phase == MovePhase::Restoring {
                    MovePhase::Done
                } else {
                    MovePhase::RolledBack
                };
                info!(job = id, node = %job.members[0].node, phase = %done, "a moved job runs again");
                let came_back = mv.phase == MovePhase::Restoring
                    && mv.message.starts_with(&lost_after_start(&mv.to_node));
                self.set_move(id, |m| {
                    m.phase = done;
                    if came_back {
                        m.message = format!(
                            "{} and came back running the job",
                            lost_after_start(&m.to_node)
                        );
                    }
                });
            }
            MovePhase::Restoring | MovePhase::RollingBack
                if state == RunState::Exited && job.members[0].exit_code.is_none_or(|c| c == 0) =>
            {
                // Resumed and finished at once (it had saved after its last epoch), or ended
                // while its node's governor was down (taken back after a restart, its status
                // unknown: counted a success, as for any job, `refresh_job`).
                let done = if mv.phase == MovePhase::Restoring {
                    MovePhase::Done
                } else {
                    MovePhase::RolledBack
                };
                self.set_move(id, |m| {
                    m.phase = done;
                    m.running_at_unix.get_or_insert(now);
                });
            }
            MovePhase::Restoring
                if node_status == Some(NodeStatus::Lost)
                    && mv.start_sent_at_unix.is_some()
                    && !state.is_finished()
                    && now - node_seen.unwrap_or(now)
                        <= self.config.lost_after_s + self.config.lost_target_wait_s =>
            {
                // The target had the start: it may be running the job with its governor dead or
                // hung (the job does not stop with it). Starting it again on the source now
                // would run it twice; wait for the target to come back (it is sent the start
                // again and reports the job), up to `lost_target_wait_s`.
                let wait = self.config.lost_target_wait_s;
                let message = format!(
                    "{}; waiting up to {wait:.0} s for it to come back before starting the job again on {} (it may be running there)",
                    lost_after_start(&mv.to_node),
                    mv.from_node
                );
                if mv.message != message {
                    warn!(job = id, node = %mv.to_node, wait_s = wait, "a move's target was lost after it was sent the start; waiting for it");
                    self.set_move(id, |m| m.message = message);
                }
            }
            MovePhase::Restoring
                if state.is_finished() || node_status == Some(NodeStatus::Lost) =>
            {
                let why = if node_status == Some(NodeStatus::Lost) {
                    if mv.start_sent_at_unix.is_some() {
                        format!(
                            "{} and did not come back within {:.0} s",
                            lost_after_start(&mv.to_node),
                            self.config.lost_target_wait_s
                        )
                    } else {
                        format!(
                            "target {} was lost before it was sent the start",
                            mv.to_node
                        )
                    }
                } else {
                    let m = &job.members[0];
                    format!(
                        "target {} could not run it ({state}{}{})",
                        mv.to_node,
                        m.exit_code
                            .map(|c| format!(", status {c}"))
                            .unwrap_or_default(),
                        if m.message.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", m.message)
                        }
                    )
                };
                warn!(job = id, reason = %why, "move failed; starting the job again on its source");
                // Should a lost target come back running it, it is told to stop there
                // (`update_member`): the job runs on one node only.
                // The source resumes from its own directory (the copy came from there).
                self.repoint(id, now, &mv.from_node, MovePhase::RollingBack, false, |m| {
                    m.message = why.clone();
                });
            }
            // A save that came after the move gave up: the job exited on the source, saved.
            MovePhase::Failed | MovePhase::Done | MovePhase::RolledBack
                if state == RunState::Exited && saved =>
            {
                let here = job.members[0].node.clone();
                info!(job = id, node = %here, "a job saved after its move ended; starting it again where it was");
                self.repoint(id, now, &here, mv.phase, false, |m| {
                    m.message
                        .push_str("; it saved later and was started again where it was");
                });
            }
            _ => {}
        }
    }

    /// Point the job's member at `node` as a new start (next attempt), send the start, and
    /// update the move.
    #[allow(clippy::too_many_arguments)]
    fn repoint(
        &mut self,
        id: &str,
        now: Seconds,
        node: &str,
        phase: MovePhase,
        carried: bool,
        update: impl FnOnce(&mut JobMove),
    ) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let Some(member) = job.members.first_mut() else {
            return;
        };
        let previous = member.node.clone();
        member.node = node.to_owned();
        member.state = RunState::Starting;
        member.seen = false;
        member.saved = false;
        member.save_error = String::new();
        member.exit_code = None;
        member.message = String::new();
        member.placed_at = now;
        member.attempt += 1;
        member.cpu_cores = 0.0;
        member.memory_bytes = 0;
        member.decision = String::new();
        member.converged = false;
        member.carried = carried;
        let mut ended = None;
        if let Some(m) = job.moves.last_mut() {
            let before = m.phase;
            m.phase = phase;
            // Running again is counted from this start.
            m.running_at_unix = None;
            update(m);
            ended = (m.phase.is_over() && !before.is_over()).then(|| outcome_of(m));
        }
        if let Some(key) = ended {
            *self.move_outcomes.entry(key).or_default() += 1;
        }
        self.dirty.jobs.insert(id.to_owned());
        self.size_for_start(id, phase);
        self.index_job(id);
        let mut sent = false;
        if let Some(cmd) = self.start_command(id, 0)
            && self.session_of(node).is_some()
        {
            self.outbox.push((node.to_owned(), cmd));
            sent = true;
        }
        if let Some(m) = self
            .jobs
            .get_mut(id)
            .and_then(|j| j.moves.last_mut())
            .filter(|m| !m.phase.is_over())
        {
            // Not handed over yet (no session): it is sent when the node connects (`register`).
            m.start_sent_at_unix = sent.then_some(now);
        }
        self.sync_view(&previous);
        self.sync_view(node);
        self.refresh_job(id, now);
    }

    fn set_move(&mut self, id: &str, update: impl FnOnce(&mut JobMove)) {
        if let Some(m) = self.jobs.get_mut(id).and_then(|j| j.moves.last_mut()) {
            let before = m.phase;
            update(m);
            if m.phase.is_over() && m.bytes > 0 {
                self.spent_checkpoints.push(id.to_owned());
            }
            if m.phase.is_over() && !before.is_over() {
                *self.move_outcomes.entry(outcome_of(m)).or_default() += 1;
            }
            self.dirty.jobs.insert(id.to_owned());
        }
    }

    /// Moves that ended since the coordinator started, by (kind, result): kind `migration`,
    /// `preemption` or `resize`; result `done`, `rolled_back` or `failed`.
    pub fn move_outcomes(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.move_outcomes
            .iter()
            .map(|((k, r), n)| (*k, *r, *n))
            .collect()
    }

    /// The checkpoint a node uploaded arrived whole (`Ok(bytes)`) or not: start the job on the
    /// target with it, or back on its source from its own directory.
    pub fn checkpoint_arrived(
        &mut self,
        now: Seconds,
        id: &str,
        node: &str,
        result: Result<u64, String>,
    ) {
        let Some(mv) = self
            .jobs
            .get(id)
            .and_then(|j| j.active_move())
            .filter(|m| m.phase == MovePhase::Transferring && m.from_node == node)
            .cloned()
        else {
            warn!(
                job = id,
                node, "a checkpoint arrived for no move waiting for it; dropped"
            );
            self.spent_checkpoints.push(id.to_owned());
            return;
        };
        match result {
            Ok(bytes) if mv.preempted_for.is_some() => {
                self.set_move(id, |m| m.bytes = bytes);
                self.requeue(id);
            }
            Ok(bytes) => {
                info!(job = id, to = %mv.to_node, bytes, "checkpoint carried; starting the job on the target");
                self.repoint(id, now, &mv.to_node, MovePhase::Restoring, true, |m| {
                    m.bytes = bytes;
                });
            }
            Err(reason) => {
                warn!(job = id, %reason, "the checkpoint did not arrive; starting the job again on its source");
                self.repoint(id, now, &mv.from_node, MovePhase::RollingBack, false, |m| {
                    m.message = format!("the checkpoint did not reach the coordinator: {reason}");
                });
            }
        }
    }

    /// Carried checkpoints whose move is over (the server deletes its copies).
    pub fn take_spent_checkpoints(&mut self) -> Vec<String> {
        std::mem::take(&mut self.spent_checkpoints)
    }

    /// Time passes for moves: saves that never came, targets lost mid-move, and the nodes'
    /// standing migration requests acted on.
    pub(super) fn tick_moves(&mut self, now: Seconds) {
        let timeout = self.config.save_timeout_s;
        let moving: Vec<String> = self
            .submitted_jobs()
            .filter(|j| j.active_move().is_some())
            .map(|j| j.id.clone())
            .collect();
        for id in moving {
            let mv = self.jobs[&id].moves.last().cloned().expect("active");
            if mv.phase == MovePhase::Transferring
                && now - mv.saved_at_unix.unwrap_or(mv.requested_at_unix) > timeout
            {
                warn!(job = %id, node = %mv.from_node, "the checkpoint did not arrive in time; starting the job again on its source");
                self.repoint(
                    &id,
                    now,
                    &mv.from_node,
                    MovePhase::RollingBack,
                    false,
                    |m| {
                        m.message = format!(
                            "the checkpoint did not reach the coordinator within {timeout:.0} s"
                        );
                    },
                );
            } else if mv.phase == MovePhase::Saving && now - mv.requested_at_unix > timeout {
                warn!(job = %id, node = %mv.from_node, timeout_s = timeout, "the job did not save in time; it keeps running where it is");
                self.set_move(&id, |m| {
                    m.phase = MovePhase::Failed;
                    m.message = format!(
                        "the job did not save within {timeout:.0} s; it keeps running on {}",
                        m.from_node
                    );
                });
            } else {
                self.advance_move(&id, now);
            }
        }
        if self.config.auto_move {
            self.act_on_migration_requests(now);
            if self.config.rebalance {
                self.rebalance_converged(now);
            }
        }
    }

    /// SpeCon Algorithm 3 (rebalancing by converged duration): the jobs whose node asks to
    /// move them and that Algorithm 2 left where they were (their node among the lowest scores, or
    /// the move did not pay) form D; when a node is idle, or has fewer jobs than the balance
    /// factor less one, the most recently converged job of D goes there
    /// ([`governor_placement::specon::SpeCon::rebalance`], the same code govsim runs). As with
    /// Algorithm 2, only if the move pays for itself ([`super::payoff`]).
    fn rebalance_converged(&mut self, now: Seconds) {
        let converged: Vec<ConvergedJob> = self
            .submitted_jobs()
            .filter_map(|j| {
                let ask = self.standing_request(j, now)?;
                let here = self.check_movable(j).ok().filter(|n| *n == ask.node)?;
                Some(ConvergedJob {
                    job: j.id.clone(),
                    node: self.view_index[&here],
                    marked_at: ask.since,
                })
            })
            .collect();
        if converged.is_empty() {
            return;
        }
        let moves = SpeCon::rebalance(&self.view, &converged, |id, w| {
            let (Some(job), Some(view)) = (self.jobs.get(id), self.view.nodes.get(w)) else {
                return false;
            };
            self.nodes
                .get(&view.name)
                .is_some_and(|n| self.room_for(job, n).is_some())
        });
        for m in moves {
            let (source, target) = (
                self.view.nodes[m.from].name.clone(),
                self.view.nodes[m.to].name.clone(),
            );
            self.move_if_it_pays(now, &m.job, &source, &target, &m.reason);
        }
    }

    /// A node's request to move `job` that has stood `move_after_s`, the job not moved within
    /// `move_cooldown_s`: one the coordinator acts on (Algorithms 2 and 3).
    fn standing_request<'a>(&self, job: &'a JobRecord, now: Seconds) -> Option<&'a MigrationAsk> {
        let ask = job.migration_request.as_ref()?;
        let cooldown = self.config.move_cooldown_s;
        (now - ask.since >= self.config.move_after_s
            && job
                .moves
                .last()
                .is_none_or(|m| now - m.requested_at_unix >= cooldown))
        .then_some(ask)
    }

    /// Move `id` from `source` to `target` if the move pays for its cost ([`super::payoff`]),
    /// the estimate added to `reason`.
    fn move_if_it_pays(
        &mut self,
        now: Seconds,
        id: &str,
        source: &str,
        target: &str,
        reason: &str,
    ) {
        // With the gate off (`move_payoff` 0) every move Algorithm 2 (or 3) asks for is made.
        let why = if self.config.move_payoff <= 0.0 {
            reason.to_owned()
        } else {
            let (source_free, target_free) = (self.free_cores(source), self.free_cores(target));
            let Some(estimate) = self
                .jobs
                .get(id)
                .and_then(|job| self.move_payoff(job, source, source_free, target_free, now))
                .filter(|e| e.pays)
            else {
                return;
            };
            format!(
                "{reason}; pays: {:.0} core-s back for a {:.1} s pause over ~{:.0} s left",
                estimate.gain, estimate.cost_s, estimate.remaining_s
            )
        };
        if let Err(e) = self.migrate(now, id, Some(target), &why) {
            warn!(job = %id, error = %e, "cannot act on a migration request");
        }
    }

    /// After SpeCon Algorithm 2: a node asks for a job to go elsewhere; the coordinator picks
    /// the target as [`StateConfig::move_target`](super::StateConfig) says. Only jobs that can
    /// move, whose request has stood for `move_after_s`, not moved within `move_cooldown_s`,
    /// and (unless `move_payoff` is 0) only when the move pays for its measured cost
    /// ([`super::payoff`]; SpeCon itself takes a move as free).
    fn act_on_migration_requests(&mut self, now: Seconds) {
        let candidates: Vec<(String, String, String)> = self
            .submitted_jobs()
            .filter_map(|j| {
                let ask = self.standing_request(j, now)?;
                Some((j.id.clone(), ask.node.clone(), ask.reason.clone()))
            })
            .collect();
        for (id, source, reason) in candidates {
            let job = &self.jobs[&id];
            if self.check_movable(job).ok().as_deref() != Some(source.as_str()) {
                continue;
            }
            let target = match self.config.move_target {
                super::MoveTarget::Specon => self.specon_target(job, &source),
                super::MoveTarget::MostFree => self
                    .pick_target(job, &source)
                    .filter(|t| self.free_cores(t) > self.free_cores(&source)),
            };
            let Some(target) = target else {
                continue;
            };
            let why = format!("node {source} asks: {reason}");
            self.move_if_it_pays(now, &id, &source, &target, &why);
        }
    }

    /// SpeCon's Algorithm 2 for `job` on `source`: the best-scored node that can take it now,
    /// if it scores lower than `source` (see [`super::MoveTarget::Specon`]).
    fn specon_target(&self, job: &JobRecord, source: &str) -> Option<String> {
        let current = *self.view_index.get(source)?;
        let specon = SpeCon::default();
        let request = super::jobs::queued(job).member_request(0, Vec::new());
        let MigrationTarget::MoveTo(best) = specon
            .migration_target(&self.view, &request, current)
            .ok()?
        else {
            return None;
        };
        let here = specon.score(&self.view.nodes[current]);
        best.candidates
            .iter()
            // Below the job's own node (which is never below itself).
            .filter(|c| c.score < here)
            .find(|c| {
                self.nodes
                    .get(&c.node)
                    .is_some_and(|n| self.room_for(job, n).is_some())
            })
            .map(|c| c.node.clone())
    }

    /// The estimate of what moving `job` from `source` to a node with `target_free` cores gives
    /// back against its cost, from its last report on `source`.
    fn move_payoff(
        &self,
        job: &JobRecord,
        source: &str,
        source_free: f64,
        target_free: f64,
        now: Seconds,
    ) -> Option<super::payoff::Payoff> {
        let member = job.members.first()?;
        let report = self
            .nodes
            .get(source)?
            .report
            .jobs
            .iter()
            .find(|r| r.job_id == job.id)?;
        let remaining_s = match (report.epoch, report.max_epochs, report.epoch_seconds) {
            (Some(done), Some(all), Some(each)) => Some(all.saturating_sub(done) as f64 * each),
            _ => None,
        };
        let case = super::payoff::MoveCase {
            cores_now: report.cpu_cores,
            cores_wanted: job.spec.as_ref().and_then(|s| s.cores),
            source_free,
            target_free,
            memory_bytes: report.memory_bytes,
            remaining_s,
            ran_s: now - member.placed_at,
        };
        let cost = if needs_dump(job) {
            self.config.criu_move_cost
        } else {
            self.config.framework_move_cost
        };
        Some(super::payoff::payoff(
            &case,
            cost.seconds(case.memory_bytes),
            self.config.move_payoff,
        ))
    }

    /// Saves (and checkpoint uploads) this node has not confirmed, sent again when it
    /// reconnects.
    pub(super) fn resend_saves(&mut self, node: &str) {
        let resend: Vec<NodeCommand> = self
            .jobs_on(node)
            .iter()
            .filter_map(|id| {
                let j = self.jobs.get(id)?;
                let m = j.active_move().filter(|m| m.from_node == node)?;
                let member = j.members.first()?;
                match m.phase {
                    MovePhase::Saving if !member.state.is_finished() => {
                        Some(NodeCommand::Save(SaveJob {
                            job_id: j.id.clone(),
                            reason: m.reason.clone(),
                        }))
                    }
                    MovePhase::Transferring => Some(NodeCommand::Upload(UploadCheckpoint {
                        job_id: j.id.clone(),
                        attempt: member.attempt,
                        dir: j.spec.as_ref()?.checkpoint.as_ref()?.dir.clone(),
                    })),
                    _ => None,
                }
            })
            .collect();
        self.outbox
            .extend(resend.into_iter().map(|c| (node.to_owned(), c)));
    }
}

#[cfg(test)]
#[path = "move_tests.rs"]
pub(super) mod tests;

/// The (kind, result) a move that ended is counted under.
fn outcome_of(m: &JobMove) -> (&'static str, &'static str) {
    let kind = if m.from_cores.is_some() {
        "resize"
    } else if m.preempted_for.is_some() {
        "preemption"
    } else {
        "migration"
    };
    let result = match m.phase {
        MovePhase::Done => "done",
        MovePhase::RolledBack => "rolled_back",
        _ => "failed",
    };
    (kind, result)
}
