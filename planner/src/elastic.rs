//! Elastic jobs: grown into cores that would otherwise idle and shrunk to make room, each time
//! by save and resume (never by killing work).
//!
//! A job that declared `--cores MIN:MAX` and a framework checkpoint is elastic. The placement
//! policy says when its jobs grow and for whom they shrink
//! ([`governor_placement::elastic::Elasticity`]); this module carries it out:
//! - **at admission** an elastic job starts at the largest size its node leaves free (up to its
//!   maximum) when its policy grows jobs and no other job is queued: a start at the right size
//!   costs nothing, a resize costs a save;
//! - **a resize** is a move to its own node at another size ([`ClusterState::begin_save`] with
//!   `from_cores`/`to_cores`): its node saves it (SIGUSR1 or what it declared), the coordinator
//!   starts it again there from its own checkpoint directory with the new size in
//!   `GOVERNOR_CORES`; should that start fail, it is started again at its old size. Schedulearn's
//!   move-and-grow goes to another node the same way a move does (carried or shared path);
//! - **shrinks** come before preemption: a waiting job that fits nowhere first takes back cores
//!   that elastic jobs hold above their least size; only if that cannot make room are whole
//!   jobs saved and requeued ([`super::preemption`]);
//! - a job is resized only after [`StateConfig::resize_min_run_s`](super::StateConfig) since its
//!   latest start, and one resize or preemption at a time makes room for a waiting job.

use std::collections::HashSet;

use governor_placement::elastic::{self, ElasticJob, Grow};
use governor_proto::control::{JobState, MovePhase};
use governor_proto::node::RunState;
use tracing::info;

use super::{ClusterState, cores};
use governor_placement::queue::Seconds;

impl ClusterState {
    /// Running elastic jobs that may be resized now (ran long enough, not being moved).
    fn elastic_candidates(&self, now: Seconds) -> Vec<ElasticJob> {
        let min_run = self.config.resize_min_run_s;
        self.elastic_jobs()
            .filter(|j| j.status == JobState::Running)
            .filter_map(|j| {
                let spec = j.spec.as_ref().filter(|s| s.is_elastic())?;
                let m = j.members.first()?;
                let node = *self.view_index.get(&m.node)?;
                let min = spec.cores?;
                (m.state == RunState::Running
                    && now - m.placed_at >= min_run
                    && self.check_movable(j).is_ok())
                .then(|| ElasticJob {
                    id: j.id.clone(),
                    node,
                    cores: j.cores().unwrap_or(min),
                    min_cores: min,
                    max_cores: spec.max_cores.unwrap_or(min),
                    priority: spec.priority,
                    started_at: m.placed_at,
                    submitted_at: j.submitted_at,
                })
            })
            .collect()
    }

    /// A just-admitted elastic job's size: the most its node leaves free, up to its maximum,
    /// when the policy grows jobs into free cores and no other job waits; else its least.
    pub(super) fn initial_size(&mut self, id: &str, node: usize) {
        let grow = self.policy.elasticity().grow;
        // DRAGON starts a job with the workers it declared (its least here) and scales up
        // only after a quiet minute.
        if !self.config.elastic || !matches!(grow, Grow::WhenNoneWait | Grow::Always) {
            return;
        }
        // Only with nobody left in the queue: ours lends free cores while none wait, and
        // Kubeflow's loop admits the queue's next job before it scales up (with the queue
        // empty its next round would scale this job up at once: starting it larger spares
        // that restart).
        if !self.queue.is_empty() {
            return;
        }
        let Some(job) = self.jobs.get(id) else { return };
        let Some(spec) = job.spec.as_ref().filter(|s| s.is_elastic()) else {
            return;
        };
        let (Some(min), Some(max)) = (spec.cores, spec.max_cores) else {
            return;
        };
        let now_cores = job.cores().unwrap_or(min);
        let candidate = ElasticJob {
            id: id.to_owned(),
            node,
            cores: now_cores,
            min_cores: min,
            max_cores: max,
            priority: spec.priority,
            started_at: 0.0,
            submitted_at: job.submitted_at,
        };
        // The view holds the job's reservation at its current size already. Ours keeps room
        // for a newcomer on the last node that has it (a shrink later costs a restart);
        // Kubeflow starts a job at what its node leaves free, as its write-up does.
        let to = if grow == Grow::WhenNoneWait {
            elastic::admission_size(&self.view, node, &candidate)
        } else {
            elastic::grown_size(&self.view.nodes[node], &candidate)
        };
        let Some(to) = to else {
            return;
        };
        info!(job = id, node = %self.view.nodes[node].name, cores = to, "an elastic job starts larger: its node has the cores free");
        if let Some(job) = self.jobs.get_mut(id) {
            job.cores_now = Some(to);
        }
        if let Some(j) = self.view.nodes[node]
            .jobs_mut()
            .iter_mut()
            .find(|j| j.id == id)
        {
            j.requested_cores = Some(to);
        }
    }

    /// After an admission round: shrink elastic jobs for the jobs that still wait. Returns the
    /// waiting jobs room is being made for (by a shrink started now or earlier), which
    /// preemption leaves alone.
    pub(super) fn shrink_for_waiting(&mut self, now: Seconds) -> HashSet<String> {
        let mut served = self.room_being_made();
        let rule = self.policy.elasticity().shrink;
        // DRAGON shrinks for its starving job before the round
        // ([`ClusterState::starving_head_allows_admission`]).
        if !self.config.elastic
            || matches!(
                rule,
                elastic::Shrink::Never | elastic::Shrink::ForStarvingHead
            )
        {
            return served;
        }
        let mut candidates = self.elastic_candidates(now);
        if candidates.is_empty() {
            return served;
        }
        let mut waiting: Vec<(String, governor_placement::JobRequest)> = self
            .queue
            .iter()
            .filter(|q| !q.waiting_reason.is_empty() && q.replicas == 1)
            .filter(|q| !served.contains(&q.id))
            .map(|q| (q.id.clone(), q.member_request(0, Vec::new())))
            .collect();
        if rule == elastic::Shrink::ForHigherPriority {
            // Kubeflow's scale-down: for the first waiting job only, and only when it outranks
            // every running job (the highest waiting utility above the highest running one).
            waiting.truncate(1);
            if let Some((_, first)) = waiting.first() {
                let outranked = self
                    .submitted_jobs()
                    .filter(|j| j.status == JobState::Running)
                    .filter_map(|j| j.spec.as_ref().map(|s| s.priority))
                    .any(|p| p >= first.priority);
                if outranked {
                    waiting.clear();
                }
            }
        }
        for (id, request) in waiting {
            let Some(plan) = elastic::shrink_plan(&self.view, &request, &candidates, rule) else {
                continue;
            };
            candidates.retain(|c| !plan.resizes.iter().any(|r| r.id == c.id));
            for r in plan.resizes {
                self.begin_resize(now, &r, Some(id.clone()));
            }
            served.insert(id);
        }
        served
    }

    /// The waiting jobs a resize started earlier is making room for.
    fn room_being_made(&self) -> HashSet<String> {
        self.submitted_jobs()
            .filter_map(|j| j.active_move())
            .filter_map(|m| m.resized_for.clone())
            .collect()
    }

    /// DRAGON's phase 1, before an admission round: once the queue's oldest job has waited
    /// [`elastic::DRAGON_STARVING_S`], running elastic jobs (any priority) are shrunk until it
    /// fits at its least size; if it fits already, or room is being made for it, the round
    /// goes on (its phase 2 places the first job that fits), and if no shrink can make room
    /// the round admits nothing, so that the jobs behind it do not take what frees up first.
    /// Every other policy: always true.
    pub(super) fn starving_head_allows_admission(&mut self, now: Seconds) -> bool {
        if self.policy.elasticity().shrink != elastic::Shrink::ForStarvingHead {
            return true;
        }
        // The queue is in arrival order under DRAGON: its first job is the oldest.
        let Some(head) = self.queue.iter().next() else {
            return true;
        };
        if now - head.enqueued_at < elastic::DRAGON_STARVING_S || head.replicas != 1 {
            return true;
        }
        self.last_elastic_action = Some(now);
        let (id, request) = (head.id.clone(), head.member_request(0, Vec::new()));
        if governor_placement::feasible_nodes(&self.view, &request).is_ok() {
            return true;
        }
        if self.room_being_made().contains(&id) {
            return true;
        }
        if !self.config.elastic {
            return false;
        }
        let candidates = self.elastic_candidates(now);
        let Some(plan) = elastic::shrink_plan(
            &self.view,
            &request,
            &candidates,
            elastic::Shrink::ForStarvingHead,
        ) else {
            if let Some(job) = self.jobs.get_mut(&id) {
                let why = format!(
                    "dragon: waited {:.0} s and no scale-down makes room; no other job is admitted before it",
                    now - job.submitted_at
                );
                if job.message != why {
                    job.message = why;
                    self.dirty.jobs.insert(id);
                }
            }
            return false;
        };
        for r in plan.resizes {
            self.begin_resize(now, &r, Some(id.clone()));
        }
        true
    }

    /// Grow elastic jobs as the policy says: into free cores (ours when no job waits,
    /// Kubeflow after every round), or on each completion (Schedulearn's elastic FIFO).
    pub(super) fn grow_elastic(&mut self, now: Seconds, admitted: usize) {
        let completions = std::mem::take(&mut self.completions);
        let grow = self.policy.elasticity().grow;
        if !self.config.elastic {
            return;
        }
        let waiting = self.queue.iter().any(|q| !q.waiting_reason.is_empty());
        let resizes = match grow {
            Grow::Never => return,
            Grow::WhenNoneWait if waiting || !self.queue.is_empty() => return,
            // Kubeflow's loop returns after placing a job: its scale-up runs in the rounds
            // that placed none.
            Grow::Always if admitted > 0 => return,
            Grow::WhenNoneWait | Grow::Always => {
                let candidates = self.elastic_candidates(now);
                if candidates.is_empty() {
                    return;
                }
                // Ours moves a job to grow where another node has more room for it (a node
                // that can take it now, as a move's target must, and that no other job is on
                // its way to: the view holds a moving job on its source until it restarts);
                // Kubeflow scales in place.
                let arriving: HashSet<&str> = self
                    .submitted_jobs()
                    .filter_map(|j| j.active_move())
                    .filter(|m| m.to_node != m.from_node)
                    .map(|m| m.to_node.as_str())
                    .collect();
                let may_move_to = |c: &ElasticJob, i: usize| {
                    grow == Grow::WhenNoneWait
                        && !arriving.contains(self.view.nodes[i].name.as_str())
                        && self
                            .jobs
                            .get(&c.id)
                            .zip(self.nodes.get(&self.view.nodes[i].name))
                            .is_some_and(|(job, node)| self.room_for(job, node).is_some())
                };
                elastic::grow_into_idle(&self.view, &candidates, may_move_to)
            }
            Grow::AfterQuiet => {
                let last = *self.last_elastic_action.get_or_insert(now);
                if now - last < elastic::DRAGON_QUIET_S {
                    return;
                }
                // Its scale-up counts as an action whether or not a job grew.
                self.last_elastic_action = Some(now);
                // DRAGON's running queue is in admission order; its jobs carry no priority.
                let candidates: Vec<ElasticJob> = self
                    .elastic_candidates(now)
                    .into_iter()
                    .map(|c| ElasticJob { priority: 0, ..c })
                    .collect();
                elastic::grow_into_idle(&self.view, &candidates, |_, _| false)
            }
            Grow::OnCompletion if completions == 0 => return,
            Grow::OnCompletion => {
                let mut candidates = self.elastic_candidates(now);
                let completed_mean_s = self.completed_mean_s();
                let mut resizes = Vec::new();
                for _ in 0..completions {
                    let Some(r) = elastic::grow_slowest(
                        &self.view,
                        &candidates,
                        now,
                        completed_mean_s,
                        |_, i| self.view.nodes[i].schedulable,
                    ) else {
                        break;
                    };
                    candidates.retain(|c| c.id != r.id);
                    resizes.push(r);
                }
                resizes
            }
        };
        for r in resizes {
            self.begin_resize(now, &r, None);
        }
    }

    /// How long the completed coordinator jobs took on average, submission to completion
    /// (Schedulearn's yardstick for a job "running too long"; 0 before any completed). Read
    /// from the job records, so a restarted coordinator has it too.
    fn completed_mean_s(&self) -> Seconds {
        let (sum, n) = self
            .submitted_jobs()
            .filter(|j| j.status == JobState::Completed)
            .filter_map(|j| Some(j.finished_at? - j.submitted_at))
            .fold((0.0, 0u32), |(s, n), d| (s + d, n + 1));
        if n == 0 { 0.0 } else { sum / f64::from(n) }
    }

    /// Start a resize: ask the job's node to save it, to start it again with `r.to` cores on
    /// node `r.node`.
    fn begin_resize(&mut self, now: Seconds, r: &elastic::Resize, for_job: Option<String>) {
        let Some(source) = self
            .jobs
            .get(&r.id)
            .and_then(|j| self.check_movable(j).ok())
        else {
            return;
        };
        let target = self.view.nodes[r.node].name.clone();
        info!(job = %r.id, node = %source, to_node = %target, from = r.from, to = r.to, reason = %r.reason, "resizing an elastic job");
        self.begin_save(now, &r.id, source, target, None, &r.reason);
        if let Some(m) = self.jobs.get_mut(&r.id).and_then(|j| j.moves.last_mut()) {
            m.from_cores = Some(r.from);
            m.to_cores = Some(r.to);
            m.resized_for = for_job;
            if m.from_node == m.to_node {
                m.message = format!(
                    "resize from {} to {} cores: saved and started again on {}",
                    cores(Some(r.from)),
                    cores(Some(r.to)),
                    m.to_node
                );
            }
        }
    }

    /// A resize's phase moved on: the size the job runs at follows its start (the new size on
    /// the way forward, the old one when it goes back).
    pub(super) fn size_for_start(&mut self, id: &str, phase: MovePhase) {
        let Some(job) = self.jobs.get_mut(id) else {
            return;
        };
        let Some(m) = job.moves.last() else { return };
        let size = match phase {
            MovePhase::Restoring => m.to_cores,
            MovePhase::RollingBack => m.from_cores,
            _ => None,
        };
        if let Some(size) = size {
            job.cores_now = Some(size);
            // A shrink frees room for the job that waits.
            self.needs_dispatch = true;
        }
    }
}

#[cfg(test)]
#[path = "elastic_tests.rs"]
mod tests;
