//! Node registration and reports: sessions, each report's jobs into the registry, move
//! requests, local jobs.

use std::collections::{BTreeSet, HashMap, VecDeque};

use governor_proto::control::{CategoryChange, JobState, MovePhase, NodeState, ProgressSample};
use governor_proto::node::{
    Category, Hello, JobOrigin, JobReport, NodeCommand, NodeReport, RunState, StopJob, Welcome,
};
use tracing::{debug, info, warn};

use governor_placement::queue::Seconds;

use super::{
    ClusterState, Dirty, JobRecord, MemberRecord, MoveAsk, Node, NodeRecord, SessionError,
};

impl ClusterState {
    /// A node said hello on a new session. Starts the coordinator placed there and has not seen
    /// reported are sent again (nodes ignore starts of jobs they already run).
    pub fn register(&mut self, now: Seconds, hello: Hello, address: String) -> Welcome {
        let session = self.next_session;
        self.next_session += 1;
        let name = hello.node_name.clone();
        let record = NodeRecord {
            name: name.clone(),
            capacity: hello.capacity,
            address,
            agent_version: hello.agent_version,
            registered_at: now,
            can_dump: hello.can_dump,
        };
        match self.nodes.get_mut(&name) {
            Some(node) => {
                info!(node = %name, session, was = %node.status, "node re-registered");
                node.record.capacity = record.capacity;
                node.record.address = record.address;
                node.record.agent_version = record.agent_version;
                node.record.can_dump = record.can_dump;
                node.status = NodeState::Ready;
                node.session = Some(session);
                node.last_seen = now;
                node.synced = false;
            }
            None => {
                info!(node = %name, session, "node registered");
                self.nodes.insert(
                    name.clone(),
                    Node {
                        record,
                        status: NodeState::Ready,
                        session: Some(session),
                        last_seen: now,
                        report: NodeReport::default(),
                        synced: false,
                    },
                );
                self.insert_into_view(&name);
            }
        }
        self.dirty.nodes.insert(name.clone());
        self.needs_dispatch = true;
        // Resend the starts this node has not confirmed.
        let resend: Vec<(String, u32)> = self
            .jobs_on(&name)
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|j| !j.is_local())
            .flat_map(|j| {
                j.members
                    .iter()
                    .filter(|m| m.node == name && !m.seen && m.state == RunState::Starting)
                    .map(|m| (j.id.clone(), m.replica))
            })
            .collect();
        for (job, replica) in resend {
            if let Some(cmd) = self.start_command(&job, replica) {
                self.outbox.push((name.clone(), cmd));
                if let Some(j) = self.jobs.get_mut(&job) {
                    // Handed over now: the start timeout counts from here, not from the
                    // placement (the node may have been away longer than the timeout).
                    if let Some(m) = j.members.iter_mut().find(|m| m.replica == replica) {
                        m.placed_at = now;
                    }
                    if let Some(mv) = j.moves.last_mut().filter(|mv| !mv.phase.is_over()) {
                        mv.start_sent_at_unix = Some(now);
                    }
                    self.dirty.jobs.insert(job.clone());
                }
            }
        }
        self.resend_saves(&name);
        self.refresh_jobs_on(&name, now);
        self.sync_view(&name);
        // Nothing of this session's reports is acknowledged yet.
        self.heartbeat(&name, session, 0)
    }

    /// The heartbeat for `node`'s session `session`, acknowledging its report `sequence`.
    pub fn heartbeat(&mut self, node: &str, session: u64, sequence: u64) -> Welcome {
        Welcome {
            session_id: session,
            report_interval_ms: self.config.report_interval_ms,
            fence_after_ms: (self.config.fence_after_s() * 1000.0).min(f64::from(u32::MAX)) as u32,
            acknowledged_sequence: sequence,
            fence_jobs: self.fence_jobs(node),
        }
    }

    /// The jobs on `node` this coordinator would start elsewhere if it lost the node: those
    /// moved there whose move waits for them to run (`restoring`: past
    /// `lost_target_wait_s` such a move starts the job on its source again). A job placed
    /// there afresh, or whose move is done, is never started elsewhere while the node is away.
    pub fn fence_jobs(&mut self, node: &str) -> Vec<String> {
        let mut ids = self.jobs_on(node);
        ids.retain(|id| {
            self.jobs.get(id).is_some_and(|j| {
                j.active_move()
                    .is_some_and(|m| m.phase == MovePhase::Restoring && m.to_node == node)
            })
        });
        ids.sort();
        ids
    }

    /// A node's session ended (stream closed). The node stays known; it is lost if it does not
    /// come back within the timeout.
    pub fn disconnected(&mut self, node: &str, session: u64) {
        if let Some(n) = self.nodes.get_mut(node)
            && n.session == Some(session)
        {
            info!(node, session, "node disconnected");
            n.session = None;
            self.sync_view(node);
        }
    }

    /// A node's report.
    pub fn report(
        &mut self,
        now: Seconds,
        node_name: &str,
        session: u64,
        report: NodeReport,
    ) -> Result<(), SessionError> {
        let node = self
            .nodes
            .get_mut(node_name)
            .ok_or_else(|| SessionError::NotRegistered {
                node: node_name.into(),
            })?;
        if node.session != Some(session) {
            return Err(SessionError::Stale {
                node: node_name.into(),
            });
        }
        self.reports += 1;
        if node.status != NodeState::Ready {
            info!(node = node_name, was = %node.status, "node is back");
            node.status = NodeState::Ready;
            self.dirty.nodes.insert(node_name.into());
        }
        node.last_seen = now;
        node.synced = true;
        node.report = report;
        let reported: Vec<JobReport> = node.report.jobs.clone();

        let mut present: BTreeSet<(String, u32)> = BTreeSet::new();
        for job in &reported {
            match job.origin {
                JobOrigin::Local => {
                    let id = local_id(node_name, &job.job_id);
                    present.insert((id.clone(), job.replica));
                    self.update_local(now, node_name, &id, job);
                }
                // A member placed on another node is not this node's to report: it changes
                // nothing (not even a move request), whatever the node claims.
                JobOrigin::Coordinator => {
                    if self.update_member(now, node_name, session, job) {
                        present.insert((job.job_id.clone(), job.replica));
                    }
                }
            }
        }
        self.forget_vanished(now, node_name, &present);
        self.note_move_requests(now, node_name, &present);
        self.advance_moves_on(node_name, now);
        self.refresh_jobs_on(node_name, now);
        // Trials of cluster sweeps are judged once their status reflects this report (only the
        // members placed here: `present`). Every report passes here: jobs that are no trial
        // cost one lookup, no allocation.
        for job in &reported {
            if job.origin != JobOrigin::Coordinator || self.sweeps.sweep_of(&job.job_id).is_none() {
                continue;
            }
            if present.contains(&(job.job_id.clone(), job.replica)) {
                self.observe_sweep(now, job);
            }
        }
        self.sync_view(node_name);
        Ok(())
    }

    /// Record the node's move requests on its jobs (and clear those it withdrew).
    pub(super) fn note_move_requests(
        &mut self,
        now: Seconds,
        node_name: &str,
        present: &BTreeSet<(String, u32)>,
    ) {
        let Some(node) = self.nodes.get(node_name) else {
            return;
        };
        // Nearly every report asks for nothing: then only requests made earlier are cleared.
        let origin: HashMap<&str, JobOrigin> = if node.report.move_requests.is_empty() {
            HashMap::new()
        } else {
            node.report
                .jobs
                .iter()
                .map(|j| (j.job_id.as_str(), j.origin))
                .collect()
        };
        let asked: HashMap<String, String> = node
            .report
            .move_requests
            .iter()
            .filter_map(|m| {
                let id = match origin.get(m.job_id.as_str())? {
                    JobOrigin::Local => local_id(node_name, &m.job_id),
                    JobOrigin::Coordinator => m.job_id.clone(),
                };
                Some((id, m.reason.clone()))
            })
            .collect();
        let ids: BTreeSet<&String> = present.iter().map(|(id, _)| id).collect();
        for id in ids {
            let Some(job) = self.jobs.get_mut(id) else {
                continue;
            };
            let from_here = job
                .move_request
                .as_ref()
                .is_some_and(|m| m.node == node_name);
            let next = match asked.get(id) {
                Some(_) if job.status.is_finished() => None,
                Some(reason) => {
                    let standing = job.move_request.as_ref().filter(|m| m.node == node_name);
                    Some(MoveAsk {
                        node: node_name.to_owned(),
                        reason: reason.clone(),
                        since: standing.map_or(now, |m| m.since),
                        stayed: standing.is_some_and(|m| m.stayed),
                    })
                }
                None if from_here => None,
                None => continue,
            };
            if job.move_request != next {
                match &next {
                    Some(m) if !from_here => {
                        info!(node = node_name, job = %id, reason = %m.reason, "node asks to move a job elsewhere")
                    }
                    None => {
                        info!(node = node_name, job = %id, "node no longer asks to move the job")
                    }
                    _ => {}
                }
                job.move_request = next;
                self.dirty.jobs.insert(id.clone());
            }
        }
    }

    pub(super) fn update_local(&mut self, now: Seconds, node: &str, id: &str, report: &JobReport) {
        // Local jobs sort after the jobs submitted before they were found, without using up a
        // submitted job's id.
        let seq = self.next_seq;
        let mut created = false;
        let job = self.jobs.entry(id.to_owned()).or_insert_with(|| {
            created = true;
            info!(node, job = id, "local job found by a node");
            JobRecord {
                id: id.to_owned(),
                spec: None,
                name: report.name.clone(),
                status: JobState::Running,
                seq,
                submitted_at: now,
                started_at: Some(now),
                finished_at: None,
                message: String::new(),
                members: vec![MemberRecord {
                    replica: report.replica,
                    node: node.to_owned(),
                    gpus: report.gpu_indices.clone(),
                    state: report.state,
                    placed_at: now,
                    seen: true,
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
                }],
                category: Category::Unknown,
                categories: Vec::new(),
                progress: VecDeque::new(),
                progress_step_s: 0.0,
                placements: Vec::new(),
                deadline: None,
                move_request: None,
                time_to_quality_s: None,
                moves: Vec::new(),
                cores_now: None,
                sweep_curve: Vec::new(),
                specon_marked_at: None,
                start_s: None,
            }
        });
        let limit = self.config.progress_samples;
        if let Some(m) = job.members.first_mut() {
            apply_report(m, report);
            m.gpus = report.gpu_indices.clone();
        }
        track_progress(job, now, report, limit, &mut self.dirty);
        job.status = match report.state {
            RunState::Exited if report.exit_code.unwrap_or(0) == 0 || report.converged => {
                JobState::Completed
            }
            RunState::Exited | RunState::Failed => JobState::Failed,
            _ => JobState::Running,
        };
        if created {
            self.index_job(id);
        }
    }

    /// Apply a node's report of a coordinator job's member. False when the job is unknown or
    /// the member is not placed on this node (the report is ignored).
    pub(super) fn update_member(
        &mut self,
        now: Seconds,
        node: &str,
        session: u64,
        report: &JobReport,
    ) -> bool {
        let limit = self.config.progress_samples;
        let Some(job) = self.jobs.get_mut(&report.job_id) else {
            warn!(node, job = %report.job_id, "node reports a coordinator job this coordinator does not know; ignoring it");
            return false;
        };
        let Some(member) = job
            .members
            .iter_mut()
            .find(|m| m.replica == report.replica && m.node == node)
        else {
            // The node a job moved away from reports its saved run for a while: expected.
            let moved_away = job
                .moves
                .iter()
                .any(|m| m.from_node == node || m.to_node == node);
            if !moved_away {
                warn!(node, job = %report.job_id, replica = report.replica, "node reports a member placed elsewhere; ignoring it");
            } else if !report.state.is_finished() {
                // A target lost mid-move that comes back running the job, which was started
                // again on its source meanwhile: it must run on one node only.
                let key = (job.id.clone(), report.replica);
                if self.stops_sent.get(&key) != Some(&session) {
                    warn!(node, job = %report.job_id, "a moved job runs on a node it moved away from; stopping it there");
                    self.stops_sent.insert(key, session);
                    self.outbox.push((
                        node.to_owned(),
                        NodeCommand::Stop(StopJob {
                            job_id: job.id.clone(),
                            reason: "the job runs on another node after a move".into(),
                        }),
                    ));
                }
            }
            return false;
        };
        // An earlier start of a job moved back here: its end is not the new start's.
        if report.attempt < member.attempt {
            return true;
        }
        // A job we consider over (cancelled, failed gang) that still runs there: stop it, once
        // per session.
        if job.status.is_finished() && !report.state.is_finished() {
            let key = (job.id.clone(), report.replica);
            if self.stops_sent.get(&key) != Some(&session) {
                self.stops_sent.insert(key, session);
                self.outbox.push((
                    node.to_owned(),
                    NodeCommand::Stop(StopJob {
                        job_id: job.id.clone(),
                        reason: format!("job is {}", job.status),
                    }),
                ));
            }
            return true;
        }
        let was = member.state;
        member.seen = true;
        apply_report(member, report);
        if job.start_s.is_none()
            && let Some(start) = measured_start(member.placed_at, now, report)
        {
            debug!(job = %job.id, start_s = start, "its start measured");
            job.start_s = Some(start);
            self.dirty.jobs.insert(job.id.clone());
        }
        if was != member.state {
            self.dirty.jobs.insert(job.id.clone());
        }
        if !report.message.is_empty() {
            member.message = report.message.clone();
        }
        track_progress(job, now, report, limit, &mut self.dirty);
        true
    }

    /// Members this node should have but did not report.
    pub(super) fn forget_vanished(
        &mut self,
        now: Seconds,
        node: &str,
        present: &BTreeSet<(String, u32)>,
    ) {
        let mut ended_local = Vec::new();
        for id in self.jobs_on(node) {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            for m in job.members.iter_mut().filter(|m| m.node == node) {
                if present.contains(&(job.id.clone(), m.replica)) || m.state.is_finished() {
                    continue;
                }
                if job.spec.is_none() {
                    ended_local.push(job.id.clone());
                } else if m.seen {
                    m.state = RunState::Failed;
                    m.message = format!(
                        "vanished from node {node}'s reports (it ended while the coordinator could not see it, or the node restarted)"
                    );
                    self.dirty.jobs.insert(job.id.clone());
                } else if now - m.placed_at > self.config.start_timeout_s {
                    m.state = RunState::Failed;
                    m.message = format!(
                        "node {node} did not start it within {:.0} s",
                        self.config.start_timeout_s
                    );
                    self.dirty.jobs.insert(job.id.clone());
                }
            }
        }
        for id in ended_local {
            self.needs_dispatch = true;
            self.jobs.remove(&id);
            self.dirty.removed_jobs.insert(id);
        }
    }
}

/// The seconds a job's first start took before it trained: from its placement (`placed_at`,
/// when the coordinator sent the start) to the report that first shows an epoch done, less
/// those epochs. It holds the node's start, the runtime's and the framework's (TensorFlow's
/// import and graph building: 5.3 s in `bench-real --workload elastic`, 2026-11-30), all of
/// which a move by a framework checkpoint pays again on its target. Measured only on the
/// first start of replica 0 (a resumed start rereads its epochs from before the move at
/// once), and late by up to one report interval (1 s by default), never below 0.
pub(super) fn measured_start(placed_at: Seconds, now: Seconds, report: &JobReport) -> Option<f64> {
    if report.attempt != 0 || report.replica != 0 {
        return None;
    }
    let epochs = report.epoch.filter(|&e| e >= 1)?;
    let each = report
        .epoch_seconds
        .filter(|s| s.is_finite() && *s >= 0.0)?;
    let start = (now - placed_at) - epochs as f64 * each;
    start.is_finite().then_some(start.max(0.0))
}

/// The id a local job is listed under.
pub(super) fn local_id(node: &str, job: &str) -> String {
    format!("{node}/{job}")
}

pub(super) fn apply_report(member: &mut MemberRecord, report: &JobReport) {
    member.state = match report.state {
        // The node has it; "starting" on the node is as good as running for placement.
        RunState::Starting => RunState::Starting,
        s => s,
    };
    member.cpu_cores = report.cpu_cores;
    member.cpu_limit_cores = report.cpu_limit_cores;
    member.memory_bytes = report.memory_bytes;
    member.exit_code = report.exit_code;
    member.saved = report.saved;
    member.save_error = report.save_error.clone();
    member.decision.clone_from(&report.decision);
    member.converged = report.converged;
    if report.gpu_energy_joules.is_some() {
        member.gpu_energy_joules = report.gpu_energy_joules;
    }
}

/// Record category changes and progress samples. Replica 0 speaks for a gang.
pub(super) fn track_progress(
    job: &mut JobRecord,
    now: Seconds,
    report: &JobReport,
    limit: usize,
    dirty: &mut Dirty,
) {
    if report.replica != 0 {
        return;
    }
    if report.category != job.category || job.categories.is_empty() {
        if report.category != job.category {
            info!(job = %job.id, from = %job.category, to = %report.category, "category");
        }
        job.category = report.category;
        job.categories.push(CategoryChange {
            at_unix: now,
            category: report.category,
        });
        dirty.jobs.insert(job.id.clone());
    }
    // A node that resumed a moved job reads the records from before the move all at once and
    // times them from its own start: its time to quality would be made up. The job's keeps
    // the figure of its first start (known limitation: a quality reached after a move is not
    // shown).
    if report.attempt == 0
        && report.time_to_quality_s.is_some()
        && report.time_to_quality_s != job.time_to_quality_s
    {
        job.time_to_quality_s = report.time_to_quality_s;
        dirty.jobs.insert(job.id.clone());
    }
    if let Some(value) = report.progress {
        record_progress(
            job,
            ProgressSample {
                at_unix: now,
                value,
            },
            limit,
        );
    }
}

/// Add a progress sample to a job's history, keeping at most `limit` samples spread evenly over
/// the job's life (plus the newest, which always holds the latest value).
///
/// Samples arriving closer than the current spacing replace the newest one. When the history is
/// full, every other sample is dropped and the spacing doubles, so memory stays bounded (a
/// 10,000-node cluster reports 40,000 jobs a second) and `govctl job` still shows the curve from
/// the start rather than the last few minutes.
pub(super) fn record_progress(job: &mut JobRecord, sample: ProgressSample, limit: usize) {
    let limit = limit.max(4);
    let history = &mut job.progress;
    let n = history.len();
    if n >= 2 && sample.at_unix - history[n - 2].at_unix < job.progress_step_s {
        history[n - 1] = sample;
    } else {
        history.push_back(sample);
    }
    if history.len() > limit {
        let newest = history.pop_back();
        let mut index = 0;
        history.retain(|_| {
            index += 1;
            index % 2 == 1
        });
        history.extend(newest);
        let span = history.back().map_or(0.0, |b| b.at_unix) - history[0].at_unix;
        job.progress_step_s = (2.0 * job.progress_step_s).max(span / (history.len() - 1) as f64);
    }
}
