//! A move under way: its phases advanced from the nodes' reports and by time (saves that never
//! came, checkpoints carried or not, targets lost mid-move), the job re-pointed at its target or
//! back at its source, and the count of the moves that ended.

use governor_proto::control::{JobMove, MovePhase, NodeState};
use governor_proto::node::{NodeCommand, RunState, SaveJob, UploadCheckpoint};
use tracing::{info, warn};

use governor_placement::queue::Seconds;

use super::ClusterState;

/// How a move's record begins while (and after) it waits for a target lost after it was
/// handed the job's start.
fn lost_after_start(target: &str) -> String {
    format!("target {target} was lost after it was sent the start")
}

impl ClusterState {
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
            node.is_some_and(|n| n.status == NodeState::Ready && n.session.is_some() && n.synced);
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
                if node_status == Some(NodeState::Lost)
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
            MovePhase::Restoring if state.is_finished() || node_status == Some(NodeState::Lost) => {
                let why = if node_status == Some(NodeState::Lost) {
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

    /// Moves that ended since the coordinator started, by (kind, result): kind `move`,
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
    /// standing move requests acted on.
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
            self.act_on_move_requests(now);
            if self.config.rebalance {
                self.rebalance_converged(now);
            }
        }
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

/// The (kind, result) a move that ended is counted under.
fn outcome_of(m: &JobMove) -> (&'static str, &'static str) {
    let kind = if m.from_cores.is_some() {
        "resize"
    } else if m.preempted_for.is_some() {
        "preemption"
    } else {
        "move"
    };
    let result = match m.phase {
        MovePhase::Done => "done",
        MovePhase::RolledBack => "rolled_back",
        _ => "failed",
    };
    (kind, result)
}
