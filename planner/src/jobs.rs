//! Job lifecycle and dispatch: submissions, cancellation, the queue's admission rounds, start
//! commands, and each job's status from its members'.

use std::collections::{BTreeSet, VecDeque};

use governor_proto::control::{
    JobSpec, JobState, JobSummary, MovePhase, NodeState, PlacementDecision, PolicyInfo, PolicyState,
};
use governor_proto::job_env;
use governor_proto::node::{Category, NodeCommand, RunState, StartJob, StopJob};
use tracing::{info, warn};

use governor_placement::queue::{QueuedJob, Seconds};
use governor_placement::{self as placement};

use super::{ClusterState, ControlError, JobRecord, MemberRecord};

impl ClusterState {
    /// Recompute the status of every job with a member on `node`.
    pub(super) fn refresh_jobs_on(&mut self, node: &str, now: Seconds) {
        for id in self.jobs_on(node) {
            self.refresh_job(&id, now);
        }
    }

    /// Derive a job's status from its members and their nodes.
    pub(super) fn refresh_job(&mut self, id: &str, now: Seconds) {
        let Some(job) = self.jobs.get(id) else { return };
        if job.status.is_finished() || job.status == JobState::Queued || job.is_local() {
            return;
        }
        let node_down = job.members.iter().find_map(|m| {
            let n = self.nodes.get(&m.node)?;
            // A node that reconnected has not confirmed its jobs until its first report.
            let unconfirmed = n.status != NodeState::Ready || (!n.synced && m.seen);
            (unconfirmed && !m.state.is_finished()).then(|| (m.node.clone(), n.status))
        });
        // A member its node stopped at convergence (as the job asked) completed, whatever the
        // interrupted process exited with.
        let exited_ok = |m: &MemberRecord| m.exit_code.unwrap_or(0) == 0 || m.converged;
        let failed = job.members.iter().find(|m| {
            m.state == RunState::Failed || (m.state == RunState::Exited && !exited_ok(m))
        });
        // A member that exited saved for a move has not completed: it waits to be resumed.
        let all_exited_ok = job
            .members
            .iter()
            .all(|m| m.state == RunState::Exited && exited_ok(m) && !m.saved);
        let all_running = job.members.iter().all(|m| m.state == RunState::Running);
        let (status, message) = if let Some(m) = failed {
            let what = match m.state {
                RunState::Exited => format!("exited with status {}", m.exit_code.unwrap_or(-1)),
                _ => format!(
                    "failed: {}",
                    if m.message.is_empty() {
                        "no reason given"
                    } else {
                        &m.message
                    }
                ),
            };
            (
                JobState::Failed,
                if job.members.len() > 1 {
                    format!(
                        "member {} on node {} {what}; the other members were stopped",
                        m.replica, m.node
                    )
                } else {
                    format!("on node {} {what}", m.node)
                },
            )
        } else if all_exited_ok {
            // A node that restarted while the job ran takes it back but cannot learn its exit
            // status (the job is no longer its child): completed, and said so.
            let noted = job
                .members
                .iter()
                .find(|m| m.converged || m.exit_code.is_none());
            (
                JobState::Completed,
                match noted {
                    Some(m) => format!("on node {}: {}", m.node, m.message),
                    None => String::new(),
                },
            )
        } else if let Some((node, st)) = node_down {
            (
                JobState::Unknown,
                match st {
                    NodeState::Resyncing => {
                        format!("waiting for node {node} to re-sync after a coordinator restart")
                    }
                    NodeState::Ready => {
                        format!("node {node} reconnected; waiting for its first report")
                    }
                    NodeState::Lost => format!(
                        "node {node} is lost (no report for over {:.0} s); the job may still run there",
                        self.config.lost_after_s
                    ),
                },
            )
        } else if all_running {
            (JobState::Running, String::new())
        } else {
            (JobState::Starting, String::new())
        };
        let job = self.jobs.get_mut(id).expect("checked above");
        if job.status == status && job.message == message {
            return;
        }
        info!(job = id, from = %job.status, to = %status, %message, "job status");
        job.status = status;
        job.message = message;
        if status == JobState::Running && job.started_at.is_none() {
            job.started_at = Some(now);
        }
        if status.is_finished() {
            self.needs_dispatch = true;
            // Judged on arrival: a trial leaving its sweep decides nothing.
            let _ = self.sweeps.leave(&id.to_owned());
            if status == JobState::Completed {
                self.completions += 1;
            }
            job.finished_at = Some(now);
            if status == JobState::Failed {
                // All or nothing: stop the members still running.
                for m in job.members.iter().filter(|m| !m.state.is_finished()) {
                    self.outbox.push((
                        m.node.clone(),
                        NodeCommand::Stop(StopJob {
                            job_id: job.id.clone(),
                            reason: "another member of the job failed".into(),
                        }),
                    ));
                }
            }
        }
        self.dirty.jobs.insert(id.to_owned());
    }

    /// Time passes: lose silent nodes, time out starts, expire gangs, place what fits.
    pub fn tick(&mut self, now: Seconds) {
        let lost_after = self.config.lost_after_s;
        let resync_grace = self.config.resync_grace_s;
        let newly_lost: Vec<String> = self
            .nodes
            .values_mut()
            .filter(|n| {
                // A node still resyncing has not reconnected since the restart (`restore`).
                let allowed = match n.status {
                    NodeState::Lost => return false,
                    NodeState::Resyncing => lost_after + resync_grace,
                    NodeState::Ready => lost_after,
                };
                now - n.last_seen > allowed
            })
            .map(|n| {
                warn!(node = %n.record.name, silent_s = now - n.last_seen, "node lost");
                n.status = NodeState::Lost;
                n.session = None;
                n.record.name.clone()
            })
            .collect();
        for name in &newly_lost {
            self.dirty.nodes.insert(name.clone());
            self.refresh_jobs_on(name, now);
            self.sync_view(name);
        }
        // Starts that never showed up on a node that reports.
        let timeout = self.config.start_timeout_s;
        let mut late = Vec::new();
        for job in self
            .jobs
            .values_mut()
            .filter(|j| j.status == JobState::Starting)
        {
            for m in job.members.iter_mut() {
                let ready = self
                    .nodes
                    .get(&m.node)
                    .is_some_and(|n| n.status == NodeState::Ready);
                if ready && !m.seen && m.state == RunState::Starting && now - m.placed_at > timeout
                {
                    m.state = RunState::Failed;
                    m.message = format!("node {} did not start it within {timeout:.0} s", m.node);
                    late.push(job.id.clone());
                }
            }
        }
        for id in late {
            // A start that failed on a move's target rolls back to the source first.
            self.advance_move(&id, now);
            self.refresh_job(&id, now);
        }
        self.tick_moves(now);
        self.dispatch(now);
    }

    /// Queue a job and try to place it now.
    pub fn submit(&mut self, now: Seconds, spec: JobSpec) -> JobSummary {
        let seq = self.next_seq;
        self.next_seq += 1;
        let id = format!("j{seq}");
        let deadline = spec
            .is_gang()
            .then(|| now + spec.gang_timeout_s.unwrap_or(self.config.gang_timeout_s));
        let job = JobRecord {
            id: id.clone(),
            name: spec.name.clone(),
            spec: Some(spec),
            status: JobState::Queued,
            seq,
            submitted_at: now,
            started_at: None,
            finished_at: None,
            message: "waiting for its first placement round".into(),
            members: Vec::new(),
            category: Category::Unknown,
            categories: Vec::new(),
            progress: VecDeque::new(),
            progress_step_s: 0.0,
            placements: Vec::new(),
            deadline,
            move_request: None,
            time_to_quality_s: None,
            moves: Vec::new(),
            cores_now: None,
            sweep_curve: Vec::new(),
            specon_marked_at: None,
            start_s: None,
        };
        info!(job = %id, name = %job.name, "job submitted");
        self.queue.push(queued(&job));
        self.index_submitted(&job);
        self.jobs.insert(id.clone(), job);
        self.join_sweep(&id);
        self.dirty.jobs.insert(id.clone());
        self.dirty.meta = true;
        self.dispatch(now);
        self.jobs[&id].summary()
    }

    /// Cancel a queued or running job.
    pub fn cancel(&mut self, now: Seconds, id: &str) -> Result<JobSummary, ControlError> {
        let job = self
            .jobs
            .get_mut(id)
            .ok_or_else(|| ControlError::NoSuchJob { id: id.into() })?;
        if job.is_local() {
            return Err(ControlError::LocalJob {
                id: id.into(),
                node: job
                    .members
                    .first()
                    .map(|m| m.node.clone())
                    .unwrap_or_default(),
            });
        }
        if job.status.is_finished() {
            return Err(ControlError::AlreadyFinished {
                id: id.into(),
                status: job.status,
            });
        }
        self.queue.remove(id);
        for m in job.members.iter().filter(|m| !m.state.is_finished()) {
            self.outbox.push((
                m.node.clone(),
                NodeCommand::Stop(StopJob {
                    job_id: id.into(),
                    reason: "cancelled with govctl".into(),
                }),
            ));
        }
        job.status = JobState::Cancelled;
        job.message = "cancelled with govctl".into();
        job.finished_at = Some(now);
        self.dirty.jobs.insert(id.into());
        // Judged on arrival: a trial leaving its sweep decides nothing.
        let _ = self.sweeps.leave(&id.to_owned());
        let nodes: BTreeSet<String> = job.members.iter().map(|m| m.node.clone()).collect();
        let summary = job.summary();
        for n in nodes {
            self.sync_view(&n);
        }
        self.dispatch(now);
        Ok(summary)
    }

    /// Switch the placement policy; queued jobs are placed by the new one from now on.
    pub fn set_policy(&mut self, now: Seconds, name: &str) -> Result<PolicyState, ControlError> {
        self.policy = placement::by_name(name)?;
        info!(policy = name, "placement policy set");
        self.dirty.meta = true;
        self.dispatch(now);
        Ok(self.policy_state())
    }

    pub fn policy_state(&self) -> PolicyState {
        PolicyState {
            current: self.policy.name().to_owned(),
            available: placement::POLICIES
                .iter()
                .map(|(name, summary)| PolicyInfo {
                    name: (*name).into(),
                    summary: (*summary).into(),
                })
                .collect(),
        }
    }

    /// Place what fits if capacity may have freed since the last round (a job ended, a node
    /// joined). Cheap when nothing happened, so it can follow every report.
    pub fn dispatch_if_needed(&mut self, now: Seconds) -> usize {
        if std::mem::take(&mut self.needs_dispatch) {
            self.dispatch(now)
        } else {
            0
        }
    }

    /// Place what fits. Returns how many jobs were admitted.
    pub fn dispatch(&mut self, now: Seconds) -> usize {
        // DRAGON's phase 1: a job that waited too long is served first or nobody is.
        let admitted = if self.queue.is_empty() || !self.starving_head_allows_admission(now) {
            0
        } else {
            self.admission_round(now)
        };
        if admitted > 0 {
            self.last_elastic_action = Some(now);
        }
        if self
            .policy
            .admits_per_round()
            .is_some_and(|most| admitted >= most)
            && !self.queue.is_empty()
        {
            // The policy's round ended with jobs left to try: another round at once.
            self.needs_dispatch = true;
        }
        self.grow_elastic(now, admitted);
        admitted
    }

    /// One admission round, then shrinks and preemptions for the jobs that still wait.
    fn admission_round(&mut self, now: Seconds) -> usize {
        let holds = self.holds();
        let round = self
            .queue
            .admit_holding(now, &mut self.view, self.policy.as_mut(), &holds);
        let policy = self.policy.name().to_owned();
        for expired in round.expired {
            if let Some(job) = self.jobs.get_mut(&expired.job.id) {
                warn!(job = %job.id, reason = %expired.reason, "gang timed out");
                job.status = JobState::Failed;
                job.message = expired.reason;
                job.finished_at = Some(now);
                self.dirty.jobs.insert(job.id.clone());
            }
        }
        for q in self.queue.iter() {
            if let Some(job) = self.jobs.get_mut(&q.id)
                && job.message != q.waiting_reason
                && !q.waiting_reason.is_empty()
            {
                job.message = q.waiting_reason.clone();
            }
        }
        let admitted = round.admitted.len();
        for a in round.admitted {
            let Some(job) = self.jobs.get_mut(&a.job.id) else {
                continue;
            };
            job.status = JobState::Starting;
            job.message = String::new();
            // A preempted job resumes: its next start continues its attempts.
            let resuming = job
                .active_move()
                .is_some_and(|m| m.phase == MovePhase::Requeued)
                .then(|| job.members.first().map_or(0, |m| m.attempt));
            job.members.clear();
            for (replica, p) in a.members.iter().enumerate() {
                let node = self.view.nodes[p.node].name.clone();
                info!(job = %job.id, replica, node = %node, gpus = ?p.gpus, %policy, reason = %p.reason, "placed");
                job.members.push(MemberRecord {
                    replica: replica as u32,
                    node: node.clone(),
                    gpus: p.gpus.clone(),
                    state: RunState::Starting,
                    placed_at: now,
                    seen: false,
                    cpu_cores: 0.0,
                    cpu_limit_cores: None,
                    memory_bytes: 0,
                    exit_code: None,
                    message: String::new(),
                    saved: false,
                    save_error: String::new(),
                    attempt: 0,
                    carried: false,
                    gpu_energy_joules: None,
                    decision: String::new(),
                    converged: false,
                });
                job.placements.push(PlacementDecision {
                    at_unix: now,
                    policy: policy.clone(),
                    replica: replica as u32,
                    node,
                    gpu_indices: p.gpus.clone(),
                    reason: p.reason.clone(),
                    candidates: p
                        .candidates
                        .iter()
                        .map(|c| governor_proto::control::CandidateScore {
                            node: c.node.clone(),
                            score: c.score,
                            note: c.note.clone(),
                        })
                        .collect(),
                });
            }
            self.placements += a.members.len() as u64;
            self.dirty.jobs.insert(a.job.id.clone());
            let id = a.job.id.clone();
            if let (Some(previous), Some(p)) = (resuming, a.members.first()) {
                let node = self.view.nodes[p.node].name.clone();
                self.resume_admitted(&id, &node, previous);
            }
            self.index_job(&id);
            if let [only] = a.members.as_slice() {
                self.initial_size(&id, only.node);
            }
            for replica in 0..a.members.len() as u32 {
                if let Some(cmd) = self.start_command(&id, replica) {
                    let node = self.jobs[&id].members[replica as usize].node.clone();
                    if self.session_of(&node).is_some() {
                        self.outbox.push((node, cmd));
                    }
                }
            }
        }
        // Shrinks and preemptions are only ever for jobs that tried and did not fit.
        if self.queue.iter().any(|q| !q.waiting_reason.is_empty()) {
            let room_being_made = self.shrink_for_waiting(now);
            self.preempt_for_waiting(now, &room_being_made);
        }
        admitted
    }

    pub(super) fn start_command(&self, job_id: &str, replica: u32) -> Option<NodeCommand> {
        let job = self.jobs.get(job_id)?;
        let spec = job.spec.as_ref()?;
        let member = job.members.iter().find(|m| m.replica == replica)?;
        let mut env = spec.env.clone();
        env.insert(job_env::JOB_ID.into(), job.id.clone());
        env.insert(job_env::RANK.into(), replica.to_string());
        env.insert(job_env::WORLD_SIZE.into(), spec.replicas.to_string());
        if let Some(c) = job.cores() {
            env.insert(job_env::CORES.into(), super::cores(Some(c)));
        }
        if let Some(first) = job.members.first()
            && let Some(n) = self.nodes.get(&first.node)
        {
            let host = n
                .record
                .address
                .rsplit_once(':')
                .map_or(n.record.address.as_str(), |(h, _)| h);
            env.insert(job_env::MASTER_ADDR.into(), host.to_owned());
        }
        Some(NodeCommand::Start(StartJob {
            job_id: job.id.clone(),
            replica,
            replicas: spec.replicas,
            name: spec.name.clone(),
            argv: spec.argv.clone(),
            log_path: spec.log_path.clone(),
            metric: spec.metric.clone(),
            maximise: spec.maximise,
            gpu_indices: member.gpus.clone(),
            priority: spec.priority,
            env,
            cores: job.cores(),
            memory_bytes: spec.memory_bytes,
            checkpoint: spec.checkpoint.clone(),
            attempt: member.attempt,
            carried_checkpoint: member.carried,
            user: spec.user.clone(),
        }))
    }

    /// The jobs submitted to the coordinator, finished ones included, in id order (not the
    /// nodes' local jobs, which it can neither move nor resize nor preempt).
    pub(super) fn submitted_jobs(&self) -> impl Iterator<Item = &JobRecord> {
        self.submitted.iter().filter_map(|id| self.jobs.get(id))
    }

    /// The elastic submitted jobs, finished ones included.
    pub(super) fn elastic_jobs(&self) -> impl Iterator<Item = &JobRecord> {
        self.elastic.iter().filter_map(|id| self.jobs.get(id))
    }

    /// Note a job submitted to the coordinator (its spec does not change after submission).
    pub(super) fn index_submitted(&mut self, job: &JobRecord) {
        let Some(spec) = job.spec.as_ref() else {
            return;
        };
        self.submitted.insert(job.id.clone());
        if spec.is_elastic() {
            self.elastic.insert(job.id.clone());
        }
    }

    /// Record the nodes of a job's members in the index.
    pub(super) fn index_job(&mut self, id: &str) {
        let Some(job) = self.jobs.get(id) else { return };
        for m in &job.members {
            self.on_node
                .entry(m.node.clone())
                .or_default()
                .insert(id.to_owned());
        }
    }

    /// Ids of the unfinished jobs with a member on `node`, dropping stale index entries.
    pub(super) fn jobs_on(&mut self, node: &str) -> Vec<String> {
        let Some(ids) = self.on_node.get_mut(node) else {
            return Vec::new();
        };
        let jobs = &self.jobs;
        ids.retain(|id| {
            jobs.get(id).is_some_and(|j| {
                !j.status.is_finished() && j.members.iter().any(|m| m.node == node)
            })
        });
        ids.iter().cloned().collect()
    }
}

pub(super) fn queued(job: &JobRecord) -> QueuedJob {
    let spec = job.spec.as_ref().expect("only submitted jobs are queued");
    QueuedJob {
        id: job.id.clone(),
        priority: spec.priority,
        seq: job.seq,
        enqueued_at: job.submitted_at,
        replicas: spec.replicas,
        gpus: spec.gpus,
        cores: spec.cores,
        memory_bytes: spec.memory_bytes,
        deadline: job.deadline,
        waiting_reason: String::new(),
        head: job
            .active_move()
            .is_some_and(|m| m.phase == MovePhase::Requeued),
    }
}
