//! A node's standing requests to move its jobs (SpeCon): the target picked by Algorithm 2 (or
//! the most free cores), converged jobs rebalanced by Algorithm 3, and a move made only when it
//! pays for its cost.

use tracing::warn;

use governor_placement::queue::Seconds;
use governor_placement::specon::{ConvergedJob, MoveDecision, SpeCon};

use super::moves::needs_dump;
use super::{ClusterState, JobRecord, MoveAsk};

impl ClusterState {
    /// SpeCon Algorithm 3 (rebalancing by converged duration): the jobs Algorithm 2 marked
    /// (moved, or left where they were: their node among the lowest scores, or the move did not
    /// pay), and those whose node asks to move them now, form D, each from the moment it was
    /// marked (or asked); when a node is idle, or has fewer jobs than the balance
    /// factor less one, the most recently converged job of D goes there
    /// ([`governor_placement::specon::SpeCon::rebalance`], the same code govsim runs). As with
    /// Algorithm 2, only if the move pays for itself ([`super::payoff`]).
    pub(super) fn rebalance_converged(&mut self, now: Seconds) {
        let converged = self.specon_converged(now);
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

    /// Algorithm 3's set D now: the movable jobs Algorithm 2 marked (if they may move again)
    /// and those whose node asks to move them, each with when it was marked (or asked).
    pub(super) fn specon_converged(&self, now: Seconds) -> Vec<ConvergedJob> {
        self.submitted_jobs()
            .filter_map(|j| {
                let here = self.check_movable(j).ok()?;
                // Marked by Algorithm 2 (moved or left in place), or asking to move now.
                let marked_at = match (j.specon_marked_at, self.standing_request(j, now)) {
                    (Some(at), _) if self.may_move_again(j, now) => at,
                    (_, Some(ask)) if ask.node == here => ask.since,
                    _ => return None,
                };
                Some(ConvergedJob {
                    job: j.id.clone(),
                    node: self.view_index[&here],
                    marked_at,
                })
            })
            .collect()
    }

    /// A node's request to move `job` that has stood `move_after_s`, the job not moved within
    /// `move_cooldown_s` nor `max_auto_moves` times already: one the coordinator acts on
    /// (Algorithms 2 and 3).
    fn standing_request<'a>(&self, job: &'a JobRecord, now: Seconds) -> Option<&'a MoveAsk> {
        let ask = job.move_request.as_ref()?;
        (now - ask.since >= self.config.move_after_s && self.may_move_again(job, now))
            .then_some(ask)
    }

    /// `job` was not moved within `move_cooldown_s` nor `max_auto_moves` times already.
    fn may_move_again(&self, job: &JobRecord, now: Seconds) -> bool {
        let cooldown = self.config.move_cooldown_s;
        let moved = || {
            job.moves
                .iter()
                .filter(|m| m.preempted_for.is_none() && m.from_node != m.to_node)
                .count() as u32
        };
        job.moves
            .last()
            .is_none_or(|m| now - m.requested_at_unix >= cooldown)
            && self.config.max_auto_moves.is_none_or(|most| moved() < most)
    }

    /// Algorithm 2 kept `id` where it is for its current request: not asked again, and marked
    /// (Algorithm 3's set D).
    fn mark_stayed(&mut self, id: &str) {
        if let Some(job) = self.jobs.get_mut(id)
            && let Some(ask) = job.move_request.as_mut()
            && !ask.stayed
        {
            ask.stayed = true;
            job.specon_marked_at.get_or_insert(ask.since);
            self.dirty.jobs.insert(id.to_owned());
        }
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
        if let Err(e) = self.move_job(now, id, Some(target), &why) {
            warn!(job = %id, error = %e, "cannot act on a move request");
        }
    }

    /// After SpeCon Algorithm 2: a node asks for a job to go elsewhere; the coordinator picks
    /// the target as [`StateConfig::move_target`](super::StateConfig) says. Only jobs that can
    /// move, whose request has stood for `move_after_s`, not moved within `move_cooldown_s`,
    /// and (unless `move_payoff` is 0) only when the move pays for its measured cost
    /// ([`super::payoff`]; SpeCon itself takes a move as free).
    pub(super) fn act_on_move_requests(&mut self, now: Seconds) {
        let candidates: Vec<(String, String, String)> = self
            .submitted_jobs()
            .filter_map(|j| {
                let ask = self.standing_request(j, now).filter(|a| !a.stayed)?;
                Some((j.id.clone(), ask.node.clone(), ask.reason.clone()))
            })
            .collect();
        for (id, source, reason) in candidates {
            let job = &self.jobs[&id];
            if self.check_movable(job).ok().as_deref() != Some(source.as_str()) {
                continue;
            }
            let specon = self.config.move_target == super::MoveTarget::Specon;
            let target = if specon {
                self.specon_target(job, &source)
            } else {
                self.pick_target(job, &source)
                    .filter(|t| self.free_cores(t) > self.free_cores(&source))
            };
            let Some(target) = target else {
                // Algorithm 2 decides once per request (the paper runs it when the job
                // converges); our most-free rule asks again each round.
                if specon {
                    self.mark_stayed(&id);
                }
                continue;
            };
            // A move our payoff gate holds back is weighed again next round: what it frees
            // and what is left of the job change as the cluster does.
            let why = format!("node {source} asks: {reason}");
            self.move_if_it_pays(now, &id, &source, &target, &why);
            // Moved by Algorithm 2: marked (Algorithm 3's set D) where it goes.
            if specon
                && let Some(job) = self.jobs.get_mut(&id)
                && job.active_move().is_some()
                && job.specon_marked_at.is_none()
            {
                job.specon_marked_at = job.move_request.as_ref().map(|a| a.since);
                self.dirty.jobs.insert(id.clone());
            }
        }
    }

    /// SpeCon's Algorithm 2 for `job` on `source`: the best-scored node that can take it now,
    /// if it scores lower than `source` (see [`super::MoveTarget::Specon`]).
    fn specon_target(&self, job: &JobRecord, source: &str) -> Option<String> {
        let current = *self.view_index.get(source)?;
        let specon = SpeCon::default();
        let request = super::jobs::queued(job).member_request(0, Vec::new());
        let MoveDecision::MoveTo(best) = specon.move_target(&self.view, &request, current).ok()?
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
        // A CRIU image resumes the process as it was; a framework checkpoint starts the job
        // again on the target, which costs what its first start took.
        let cost_s = if needs_dump(job) {
            self.config.criu_move_cost.seconds(case.memory_bytes)
        } else {
            self.config.framework_move_cost.seconds(case.memory_bytes) + job.start_s.unwrap_or(0.0)
        };
        Some(super::payoff::payoff(
            &case,
            cost_s,
            self.config.move_payoff,
        ))
    }
}
