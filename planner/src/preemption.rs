//! Preemption without loss: a higher-priority job that fits nowhere displaces lower-priority
//! work by checkpoint, never by kill.
//!
//! After an admission round, each waiting single-member job (in queue order) gets the cheapest
//! set of lower-priority jobs on one node whose departure makes it fit
//! ([`governor_placement::preempt::plan`]). Each of them is saved as for a move
//! ([`ClusterState::begin_save`]): its framework checkpoint, or a CRIU dump where its node can
//! make one. Once saved (and, without a shared path, carried to the coordinator) it goes back
//! to the queue at the head of its priority, `requeued`, and the room it left goes to the job
//! it made room for (first in the queue by priority). When it is admitted again it resumes from
//! its checkpoint on whichever node the policy picks, as the target of a move would: if that
//! start fails it goes back to the node it was saved on.
//!
//! Limits that keep it sane:
//! - only jobs that have run [`StateConfig::preempt_min_run_s`](super::StateConfig) since their
//!   latest start are displaced (a job saved and resumed is not displaced again at once);
//! - no chains: a job that was itself preempted never displaces others;
//! - one preemption at a time per waiting job: while its victims save, it waits, and the node
//!   they leave is held for it (no job of lower priority is placed there, the saved ones
//!   included, until it is admitted: [`ClusterState::holds`]);
//! - gangs and GPU jobs are never displaced (they cannot be saved as one yet), so a gang is
//!   never preempted in part; a waiting gang does not preempt either.
//!
//! A job that declared no cores, memory or GPUs reserves nothing and always fits: preemption
//! acts on declared resources only, as Kubernetes' does on requests.

use governor_placement::preempt::{self, Candidate};
use governor_placement::queue::Hold;
use governor_proto::control::{JobState, MovePhase};
use governor_proto::node::RunState;
use tracing::info;

use super::ClusterState;
use super::jobs::queued;
use governor_placement::queue::Seconds;

impl ClusterState {
    /// After an admission round: displace lower-priority work for the jobs that still wait.
    /// `room_being_made`: waiting jobs elastic jobs are shrinking for (they wait for that).
    pub(super) fn preempt_for_waiting(
        &mut self,
        now: Seconds,
        room_being_made: &std::collections::HashSet<String>,
    ) {
        if !self.config.preemption {
            return;
        }
        // Runs after every admission round that leaves jobs waiting: one pass over the jobs
        // for the candidates, and none at all in the usual case of equal priorities.
        let mut candidates = self.preemption_candidates(now);
        let Some(lowest) = candidates.iter().map(|c| c.priority).min() else {
            return;
        };
        let waiting: Vec<(String, governor_placement::JobRequest)> = self
            .queue
            .iter()
            .filter(|q| !q.waiting_reason.is_empty() && q.replicas == 1 && q.priority > lowest)
            .map(|q| (q.id.clone(), q.member_request(0, Vec::new())))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let making_room = self.jobs_room_is_made_for();
        for (id, request) in waiting {
            let Some(job) = self.jobs.get(&id) else {
                continue;
            };
            // No chains: a preempted job waits its turn.
            if job.moves.iter().any(|m| m.preempted_for.is_some())
                || making_room.contains(&id)
                || room_being_made.contains(&id)
            {
                continue;
            }
            let Some(plan) = preempt::plan(&self.view, &request, &candidates) else {
                continue;
            };
            // A job saved for one waiting job is not offered to the next.
            candidates.retain(|c| !plan.victims.contains(&c.id));
            info!(job = %id, node = %self.view.nodes[plan.node].name, victims = ?plan.victims, "preempting by checkpoint");
            for victim in &plan.victims {
                let Some(source) = self
                    .jobs
                    .get(victim)
                    .and_then(|j| self.check_movable(j).ok())
                else {
                    continue;
                };
                self.begin_save(
                    now,
                    victim,
                    source,
                    String::new(),
                    Some(id.clone()),
                    &format!("preempted: {}", plan.reason),
                );
            }
        }
    }

    /// The nodes being cleared for waiting jobs: where a job preempted for one that still waits
    /// is saving, or saved and queued to resume. Until the waiting job is admitted, jobs of lower
    /// priority are not placed there (not the saved jobs themselves, which would otherwise take
    /// the room back as soon as the first of them is saved, nor any other).
    pub(super) fn holds(&self) -> Vec<Hold> {
        if !self.config.preemption {
            return Vec::new();
        }
        self.submitted_jobs()
            .filter_map(|j| j.active_move())
            .filter(|m| {
                matches!(
                    m.phase,
                    MovePhase::Saving | MovePhase::Transferring | MovePhase::Requeued
                )
            })
            .filter_map(|m| {
                let waiting = self.queue.get(m.preempted_for.as_deref()?)?;
                Some(Hold {
                    node: m.from_node.clone(),
                    priority: waiting.priority,
                })
            })
            .collect()
    }

    /// The waiting jobs for which some job is being saved now (one preemption at a time each).
    fn jobs_room_is_made_for(&self) -> std::collections::HashSet<String> {
        self.submitted_jobs()
            .filter_map(|j| j.active_move())
            .filter(|m| matches!(m.phase, MovePhase::Saving | MovePhase::Transferring))
            .filter_map(|m| m.preempted_for.clone())
            .collect()
    }

    /// Running jobs that can be saved and have run long enough since their latest start
    /// ([`preempt::plan`] keeps those of lower priority than the job it makes room for).
    fn preemption_candidates(&self, now: Seconds) -> Vec<Candidate> {
        let min_run = self.config.preempt_min_run_s;
        self.submitted_jobs()
            .filter(|j| j.status == JobState::Running)
            .filter_map(|j| {
                let spec = j.spec.as_ref()?;
                let m = j.members.first()?;
                let node = *self.view_index.get(&m.node)?;
                (m.state == RunState::Running
                    && now - m.placed_at >= min_run
                    && self.check_movable(j).is_ok())
                .then(|| Candidate {
                    id: j.id.clone(),
                    node,
                    priority: spec.priority,
                    started_at: m.placed_at,
                    gpus: m.gpus.clone(),
                })
            })
            .collect()
    }

    /// A preempted job saved (and carried, without a shared path): back to the queue, at the
    /// head of its priority, to resume from its checkpoint.
    pub(super) fn requeue(&mut self, id: &str) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let for_job = job
            .moves
            .last()
            .and_then(|m| m.preempted_for.clone())
            .unwrap_or_default();
        let from = job
            .members
            .first()
            .map(|m| m.node.clone())
            .unwrap_or_default();
        info!(job = id, node = %from, preempted_for = %for_job, "preempted job saved; queued to resume");
        job.status = JobState::Queued;
        // An elastic job resumes at its least size (and grows again if there is room).
        job.cores_now = None;
        job.message =
            format!("preempted on {from} for {for_job}; waiting to resume from its checkpoint");
        if let Some(m) = job.moves.last_mut() {
            m.phase = MovePhase::Requeued;
        }
        self.queue.push(queued(job));
        self.dirty.jobs.insert(id.to_owned());
        self.sync_view(&from);
        self.needs_dispatch = true;
    }

    /// A requeued job admitted on `node`: its next start resumes from its checkpoint (carried
    /// by the coordinator when it resumes elsewhere and the checkpoint came up), and its
    /// preemption continues as a move to `node`.
    pub(super) fn resume_admitted(&mut self, id: &str, node: &str, previous_attempt: u32) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let Some(mv) = job
            .moves
            .last_mut()
            .filter(|m| m.phase == MovePhase::Requeued)
        else {
            return;
        };
        mv.to_node = node.to_owned();
        mv.phase = MovePhase::Restoring;
        mv.running_at_unix = None;
        let carried = mv.bytes > 0 && mv.from_node != node;
        if let Some(m) = job.members.first_mut() {
            m.attempt = previous_attempt + 1;
            m.carried = carried;
        }
        info!(job = id, %node, carried, "resuming a preempted job");
    }
}

#[cfg(test)]
#[path = "preemption_tests.rs"]
pub(super) mod tests;
