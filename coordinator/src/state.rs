//! The coordinator's state machine: the node and job registry, the queue and the placement
//! policy, driven by events stamped with the caller's clock.
//!
//! It does no I/O: the server feeds it registrations, reports, submissions and ticks, then sends
//! the commands it leaves in the outbox ([`ClusterState::take_outbox`]) and persists the records it
//! marks dirty ([`ClusterState::take_dirty`]). Everything here is therefore testable with a fake
//! clock, and a restarted coordinator rebuilds the same state from its store
//! ([`ClusterState::restore`]).
//!
//! Lifecycle of a submitted job: `queued` -> (admitted by the queue and the policy) `starting`
//! -> (every member reported running) `running` -> `completed` / `failed`, or `cancelled`. When a
//! member's node is lost the job is `unknown` until the node reports again. Jobs a node found by
//! itself ("local" jobs) are listed too, under `NODE/ID`, and are never started or stopped by the
//! coordinator.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use governor_proto::control::{
    CategoryChange, JobDetail, JobMember, JobSpec, JobStatus, JobSummary, NodeStatus, NodeSummary,
    PlacementDecision, PolicyInfo, PolicyState, ProgressSample,
};
use governor_proto::node::{
    Category, Hello, JobOrigin, JobReport, NodeCapacity, NodeCommand, NodeReport, RunState,
    StartJob, StopJob, Welcome,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::placement::{
    self, ClusterView, GpuView, JobRequest, JobView, NodeView, PlacementPolicy, UnknownPolicy,
};
use crate::queue::{Queue, QueuedJob, Seconds, member_id};

/// Timeouts and sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StateConfig {
    /// A node that has not reported for this long is lost (its jobs become `unknown`).
    pub lost_after_s: f64,
    /// A member placed on a node that has not reported it within this long has failed to start.
    pub start_timeout_s: f64,
    /// How often nodes should report.
    pub report_interval_ms: u32,
    /// Gangs (several members or GPUs) without their own timeout fail after waiting this long.
    pub gang_timeout_s: f64,
    /// Progress samples kept per job (the sparkline in `govctl job`). The history covers the
    /// job's whole life: when it is full, every other sample goes and the spacing doubles.
    pub progress_samples: usize,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            lost_after_s: 10.0,
            start_timeout_s: 60.0,
            report_interval_ms: 1000,
            gang_timeout_s: 600.0,
            progress_samples: 120,
        }
    }
}

/// What the store keeps about a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub capacity: NodeCapacity,
    pub address: String,
    pub agent_version: String,
    pub registered_at: Seconds,
}

/// One member of a job: where it runs and how it is doing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub replica: u32,
    pub node: String,
    pub gpus: Vec<u32>,
    pub state: RunState,
    pub placed_at: Seconds,
    /// A report has shown this member (so its absence later means it vanished).
    #[serde(default)]
    pub seen: bool,
    /// Latest figures from its node.
    #[serde(default)]
    pub cpu_cores: f64,
    #[serde(default)]
    pub cpu_limit_cores: Option<f64>,
    #[serde(default)]
    pub memory_bytes: u64,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub message: String,
}

/// What the store keeps about a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    /// `None` for a job a node found by itself.
    pub spec: Option<JobSpec>,
    pub name: String,
    pub status: JobStatus,
    /// Submission order.
    pub seq: u64,
    pub submitted_at: Seconds,
    pub started_at: Option<Seconds>,
    pub finished_at: Option<Seconds>,
    /// Why it waits, failed or is unknown.
    pub message: String,
    pub members: Vec<MemberRecord>,
    pub category: Category,
    pub categories: Vec<CategoryChange>,
    pub progress: VecDeque<ProgressSample>,
    /// Seconds between kept progress samples (0 until the history first fills up).
    #[serde(default)]
    pub progress_step_s: f64,
    pub placements: Vec<PlacementDecision>,
    /// Gangs: fail when not admitted by this time.
    pub deadline: Option<Seconds>,
    /// A node's policy asks for the job to be moved elsewhere (SpeCon's converged jobs). Kept
    /// and shown; moving jobs (CRIU, framework checkpoints) is the next step.
    #[serde(default)]
    pub migration_request: Option<MigrationAsk>,
}

/// A node's request to move one of its jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MigrationAsk {
    pub node: String,
    pub reason: String,
    /// When the node first asked (this time).
    pub since: Seconds,
}

impl JobRecord {
    pub fn is_local(&self) -> bool {
        self.spec.is_none()
    }

    fn replicas(&self) -> u32 {
        self.spec.as_ref().map_or(1, |s| s.replicas)
    }

    fn summary(&self) -> JobSummary {
        let spec = self.spec.as_ref();
        JobSummary {
            id: self.id.clone(),
            name: self.name.clone(),
            status: self.status,
            priority: spec.map_or(0, |s| s.priority),
            gpus: spec.map_or_else(
                || self.members.iter().map(|m| m.gpus.len() as u32).sum(),
                |s| s.gpus,
            ),
            replicas: self.replicas(),
            members: self
                .members
                .iter()
                .map(|m| JobMember {
                    replica: m.replica,
                    node: m.node.clone(),
                    gpu_indices: m.gpus.clone(),
                    state: m.state,
                })
                .collect(),
            category: self.category,
            progress: self.progress.back().map(|p| p.value),
            cpu_cores: self.members.iter().map(|m| m.cpu_cores).sum(),
            cpu_limit_cores: self
                .members
                .iter()
                .map(|m| m.cpu_limit_cores)
                .sum::<Option<f64>>(),
            memory_bytes: self.members.iter().map(|m| m.memory_bytes).sum(),
            submitted_at_unix: self.submitted_at,
            started_at_unix: self.started_at,
            finished_at_unix: self.finished_at,
            message: self.message.clone(),
            local: self.is_local(),
            migration_request: self
                .migration_request
                .as_ref()
                .map(|m| format!("node {} asks: {}", m.node, m.reason)),
        }
    }
}

/// Persisted settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub policy: String,
    pub next_seq: u64,
}

/// Records changed since the last [`ClusterState::take_dirty`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dirty {
    pub nodes: BTreeSet<String>,
    pub jobs: BTreeSet<String>,
    /// Jobs to delete from the store (local jobs that ended).
    pub removed_jobs: BTreeSet<String>,
    pub meta: bool,
}

impl Dirty {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.jobs.is_empty() && self.removed_jobs.is_empty() && !self.meta
    }
}

/// A node as the state machine tracks it.
#[derive(Clone, Debug)]
struct Node {
    record: NodeRecord,
    status: NodeStatus,
    /// The live session, if connected.
    session: Option<u64>,
    last_seen: Seconds,
    report: NodeReport,
    /// A report arrived in the current session (until then its jobs are not confirmed).
    synced: bool,
}

/// Why a node's registration or report is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("node {node} has a newer session; this stream is stale (reconnect)")]
    Stale { node: String },
    #[error("node {node} is not registered: send a hello first")]
    NotRegistered { node: String },
}

/// Why a control request is refused; the server maps each to a gRPC status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("no job {id}: `govctl jobs --all` lists the known jobs")]
    NoSuchJob { id: String },
    #[error("job {id} already {status}; nothing to cancel")]
    AlreadyFinished { id: String, status: JobStatus },
    #[error("job {id} is a local job of node {node}; stop it on that node")]
    LocalJob { id: String, node: String },
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
}

/// The coordinator's state.
#[derive(Debug)]
pub struct ClusterState {
    config: StateConfig,
    nodes: BTreeMap<String, Node>,
    /// Placement view, nodes in name order (the same order as `nodes`).
    view: ClusterView,
    view_index: HashMap<String, usize>,
    jobs: BTreeMap<String, JobRecord>,
    /// Node -> ids of the jobs with a member there (may hold finished or moved jobs; see
    /// [`ClusterState::jobs_on`]). Keeps per-report work proportional to the node's jobs.
    on_node: HashMap<String, BTreeSet<String>>,
    queue: Queue,
    policy: Box<dyn PlacementPolicy>,
    next_seq: u64,
    next_session: u64,
    outbox: Vec<(String, NodeCommand)>,
    dirty: Dirty,
    /// (job, replica) -> session in which a stop was last sent (so a stop is not resent every
    /// report).
    stops_sent: HashMap<(String, u32), u64>,
    reports: u64,
    placements: u64,
    /// Capacity may have freed since the last admission round.
    needs_dispatch: bool,
}

impl ClusterState {
    /// A fresh coordinator.
    pub fn new(config: StateConfig, policy: &str) -> Result<Self, UnknownPolicy> {
        Ok(ClusterState {
            config,
            nodes: BTreeMap::new(),
            view: ClusterView::default(),
            view_index: HashMap::new(),
            jobs: BTreeMap::new(),
            on_node: HashMap::new(),
            queue: Queue::new(),
            policy: placement::by_name(policy)?,
            next_seq: 1,
            next_session: 1,
            outbox: Vec::new(),
            dirty: Dirty::default(),
            stops_sent: HashMap::new(),
            reports: 0,
            placements: 0,
            needs_dispatch: false,
        })
    }

    /// A coordinator restarted at `now` from its store. Known nodes are `resyncing` until they
    /// reconnect (or lost after the timeout); their unfinished jobs are `unknown` until then;
    /// queued jobs keep their place.
    pub fn restore(
        config: StateConfig,
        now: Seconds,
        meta: Option<Meta>,
        nodes: Vec<NodeRecord>,
        jobs: Vec<JobRecord>,
    ) -> Result<Self, UnknownPolicy> {
        let meta = meta.unwrap_or(Meta {
            policy: placement::DEFAULT_POLICY.into(),
            next_seq: 1,
        });
        let mut s = ClusterState::new(config, &meta.policy)?;
        s.next_seq = meta.next_seq;
        for record in nodes {
            s.nodes.insert(
                record.name.clone(),
                Node {
                    record,
                    status: NodeStatus::Resyncing,
                    session: None,
                    last_seen: now,
                    report: NodeReport::default(),
                    synced: false,
                },
            );
        }
        for mut job in jobs {
            s.next_seq = s.next_seq.max(job.seq + 1);
            if job.is_local() {
                continue; // the node reports it again when it reconnects
            }
            match job.status {
                JobStatus::Queued => s.queue.push(queued(&job)),
                st if st.is_finished() => {}
                _ => {
                    job.status = JobStatus::Unknown;
                    job.message =
                        "the coordinator restarted; waiting for its node(s) to re-sync".into();
                }
            }
            let id = job.id.clone();
            s.jobs.insert(id.clone(), job);
            s.index_job(&id);
        }
        s.rebuild_view();
        Ok(s)
    }

    pub fn config(&self) -> &StateConfig {
        &self.config
    }

    /// The placement view (for tests, the simulator and the benchmark).
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// Commands to send to nodes, in order.
    pub fn take_outbox(&mut self) -> Vec<(String, NodeCommand)> {
        std::mem::take(&mut self.outbox)
    }

    /// Records to persist.
    pub fn take_dirty(&mut self) -> Dirty {
        std::mem::take(&mut self.dirty)
    }

    /// Put back records whose save failed, to be saved with the next batch.
    pub fn mark_dirty(&mut self, dirty: Dirty) {
        self.dirty.nodes.extend(dirty.nodes);
        self.dirty.jobs.extend(dirty.jobs);
        self.dirty.removed_jobs.extend(dirty.removed_jobs);
        self.dirty.meta |= dirty.meta;
    }

    pub fn node_record(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.get(name).map(|n| &n.record)
    }

    pub fn job_record(&self, id: &str) -> Option<&JobRecord> {
        self.jobs.get(id)
    }

    pub fn meta(&self) -> Meta {
        Meta {
            policy: self.policy.name().to_owned(),
            next_seq: self.next_seq,
        }
    }

    /// The session a node is connected with.
    pub fn session_of(&self, node: &str) -> Option<u64> {
        self.nodes.get(node).and_then(|n| n.session)
    }

    // ---- node events ----------------------------------------------------------------------

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
        };
        match self.nodes.get_mut(&name) {
            Some(node) => {
                info!(node = %name, session, was = %node.status, "node re-registered");
                node.record.capacity = record.capacity;
                node.record.address = record.address;
                node.record.agent_version = record.agent_version;
                node.status = NodeStatus::Ready;
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
                        status: NodeStatus::Ready,
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
            }
        }
        self.refresh_jobs_on(&name, now);
        self.sync_view(&name);
        Welcome {
            session_id: session,
            report_interval_ms: self.config.report_interval_ms,
        }
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
        if node.status != NodeStatus::Ready {
            info!(node = node_name, was = %node.status, "node is back");
            node.status = NodeStatus::Ready;
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
                JobOrigin::Coordinator => {
                    present.insert((job.job_id.clone(), job.replica));
                    self.update_member(now, node_name, session, job);
                }
            }
        }
        self.forget_vanished(now, node_name, &present);
        self.note_migration_requests(now, node_name, &present);
        self.refresh_jobs_on(node_name, now);
        self.sync_view(node_name);
        Ok(())
    }

    /// Record the node's migration requests on its jobs (and clear those it withdrew).
    fn note_migration_requests(
        &mut self,
        now: Seconds,
        node_name: &str,
        present: &BTreeSet<(String, u32)>,
    ) {
        let Some(node) = self.nodes.get(node_name) else {
            return;
        };
        // Nearly every report asks for nothing: then only requests made earlier are cleared.
        let origin: HashMap<&str, JobOrigin> = if node.report.migrations.is_empty() {
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
            .migrations
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
                .migration_request
                .as_ref()
                .is_some_and(|m| m.node == node_name);
            let next = match asked.get(id) {
                Some(_) if job.status.is_finished() => None,
                Some(reason) => Some(MigrationAsk {
                    node: node_name.to_owned(),
                    reason: reason.clone(),
                    since: job
                        .migration_request
                        .as_ref()
                        .filter(|m| m.node == node_name)
                        .map_or(now, |m| m.since),
                }),
                None if from_here => None,
                None => continue,
            };
            if job.migration_request != next {
                match &next {
                    Some(m) if !from_here => {
                        info!(node = node_name, job = %id, reason = %m.reason, "node asks to move a job elsewhere")
                    }
                    None => {
                        info!(node = node_name, job = %id, "node no longer asks to move the job")
                    }
                    _ => {}
                }
                job.migration_request = next;
                self.dirty.jobs.insert(id.clone());
            }
        }
    }

    fn update_local(&mut self, now: Seconds, node: &str, id: &str, report: &JobReport) {
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
                status: JobStatus::Running,
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
                }],
                category: Category::Unknown,
                categories: Vec::new(),
                progress: VecDeque::new(),
                progress_step_s: 0.0,
                placements: Vec::new(),
                deadline: None,
                migration_request: None,
            }
        });
        let limit = self.config.progress_samples;
        if let Some(m) = job.members.first_mut() {
            apply_report(m, report);
            m.gpus = report.gpu_indices.clone();
        }
        track_progress(job, now, report, limit, &mut self.dirty);
        job.status = match report.state {
            RunState::Exited if report.exit_code.unwrap_or(0) == 0 => JobStatus::Completed,
            RunState::Exited | RunState::Failed => JobStatus::Failed,
            _ => JobStatus::Running,
        };
        if created {
            self.index_job(id);
        }
    }

    fn update_member(&mut self, now: Seconds, node: &str, session: u64, report: &JobReport) {
        let limit = self.config.progress_samples;
        let Some(job) = self.jobs.get_mut(&report.job_id) else {
            warn!(node, job = %report.job_id, "node reports a coordinator job this coordinator does not know; ignoring it");
            return;
        };
        let Some(member) = job
            .members
            .iter_mut()
            .find(|m| m.replica == report.replica && m.node == node)
        else {
            warn!(node, job = %report.job_id, replica = report.replica, "node reports a member placed elsewhere; ignoring it");
            return;
        };
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
            return;
        }
        let was = member.state;
        member.seen = true;
        apply_report(member, report);
        if was != member.state {
            self.dirty.jobs.insert(job.id.clone());
        }
        if !report.message.is_empty() {
            member.message = report.message.clone();
        }
        track_progress(job, now, report, limit, &mut self.dirty);
    }

    /// Members this node should have but did not report.
    fn forget_vanished(&mut self, now: Seconds, node: &str, present: &BTreeSet<(String, u32)>) {
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

    /// Recompute the status of every job with a member on `node`.
    fn refresh_jobs_on(&mut self, node: &str, now: Seconds) {
        for id in self.jobs_on(node) {
            self.refresh_job(&id, now);
        }
    }

    /// Derive a job's status from its members and their nodes.
    fn refresh_job(&mut self, id: &str, now: Seconds) {
        let Some(job) = self.jobs.get(id) else { return };
        if job.status.is_finished() || job.status == JobStatus::Queued || job.is_local() {
            return;
        }
        let node_down = job.members.iter().find_map(|m| {
            let n = self.nodes.get(&m.node)?;
            // A node that reconnected has not confirmed its jobs until its first report.
            let unconfirmed = n.status != NodeStatus::Ready || (!n.synced && m.seen);
            (unconfirmed && !m.state.is_finished()).then(|| (m.node.clone(), n.status))
        });
        let failed = job.members.iter().find(|m| {
            m.state == RunState::Failed
                || (m.state == RunState::Exited && m.exit_code.unwrap_or(0) != 0)
        });
        let all_exited_ok = job
            .members
            .iter()
            .all(|m| m.state == RunState::Exited && m.exit_code.unwrap_or(0) == 0);
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
                JobStatus::Failed,
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
            let unknown = job.members.iter().find(|m| m.exit_code.is_none());
            (
                JobStatus::Completed,
                match unknown {
                    Some(m) => format!("on node {}: {}", m.node, m.message),
                    None => String::new(),
                },
            )
        } else if let Some((node, st)) = node_down {
            (
                JobStatus::Unknown,
                match st {
                    NodeStatus::Resyncing => {
                        format!("waiting for node {node} to re-sync after a coordinator restart")
                    }
                    NodeStatus::Ready => {
                        format!("node {node} reconnected; waiting for its first report")
                    }
                    NodeStatus::Lost => format!(
                        "node {node} is lost (no report for over {:.0} s); the job may still run there",
                        self.config.lost_after_s
                    ),
                },
            )
        } else if all_running {
            (JobStatus::Running, String::new())
        } else {
            (JobStatus::Starting, String::new())
        };
        let job = self.jobs.get_mut(id).expect("checked above");
        if job.status == status && job.message == message {
            return;
        }
        info!(job = id, from = %job.status, to = %status, %message, "job status");
        job.status = status;
        job.message = message;
        if status == JobStatus::Running && job.started_at.is_none() {
            job.started_at = Some(now);
        }
        if status.is_finished() {
            self.needs_dispatch = true;
            job.finished_at = Some(now);
            if status == JobStatus::Failed {
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
        let newly_lost: Vec<String> = self
            .nodes
            .values_mut()
            .filter(|n| n.status != NodeStatus::Lost && now - n.last_seen > lost_after)
            .map(|n| {
                warn!(node = %n.record.name, silent_s = now - n.last_seen, "node lost");
                n.status = NodeStatus::Lost;
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
            .filter(|j| j.status == JobStatus::Starting)
        {
            for m in job.members.iter_mut() {
                let ready = self
                    .nodes
                    .get(&m.node)
                    .is_some_and(|n| n.status == NodeStatus::Ready);
                if ready && !m.seen && m.state == RunState::Starting && now - m.placed_at > timeout
                {
                    m.state = RunState::Failed;
                    m.message = format!("node {} did not start it within {timeout:.0} s", m.node);
                    late.push(job.id.clone());
                }
            }
        }
        for id in late {
            self.refresh_job(&id, now);
        }
        self.dispatch(now);
    }

    // ---- control --------------------------------------------------------------------------

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
            status: JobStatus::Queued,
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
            migration_request: None,
        };
        info!(job = %id, name = %job.name, "job submitted");
        self.queue.push(queued(&job));
        self.jobs.insert(id.clone(), job);
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
        job.status = JobStatus::Cancelled;
        job.message = "cancelled with govctl".into();
        job.finished_at = Some(now);
        self.dirty.jobs.insert(id.into());
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
        if self.queue.is_empty() {
            return 0;
        }
        let round = self.queue.admit(now, &mut self.view, self.policy.as_mut());
        let policy = self.policy.name().to_owned();
        for expired in round.expired {
            if let Some(job) = self.jobs.get_mut(&expired.job.id) {
                warn!(job = %job.id, reason = %expired.reason, "gang timed out");
                job.status = JobStatus::Failed;
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
            job.status = JobStatus::Starting;
            job.message = String::new();
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
            self.index_job(&id);
            for replica in 0..a.members.len() as u32 {
                if let Some(cmd) = self.start_command(&id, replica) {
                    let node = self.jobs[&id].members[replica as usize].node.clone();
                    if self.session_of(&node).is_some() {
                        self.outbox.push((node, cmd));
                    }
                }
            }
        }
        admitted
    }

    fn start_command(&self, job_id: &str, replica: u32) -> Option<NodeCommand> {
        let job = self.jobs.get(job_id)?;
        let spec = job.spec.as_ref()?;
        let member = job.members.iter().find(|m| m.replica == replica)?;
        let mut env = spec.env.clone();
        env.insert("GOVERNOR_JOB_ID".into(), job.id.clone());
        env.insert("GOVERNOR_RANK".into(), replica.to_string());
        env.insert("GOVERNOR_WORLD_SIZE".into(), spec.replicas.to_string());
        if let Some(first) = job.members.first()
            && let Some(n) = self.nodes.get(&first.node)
        {
            let host = n
                .record
                .address
                .rsplit_once(':')
                .map_or(n.record.address.as_str(), |(h, _)| h);
            env.insert("GOVERNOR_MASTER_ADDR".into(), host.to_owned());
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
            cores: spec.cores,
            memory_bytes: spec.memory_bytes,
        }))
    }

    // ---- queries --------------------------------------------------------------------------

    pub fn list_nodes(&self, now: Seconds) -> Vec<NodeSummary> {
        self.nodes
            .values()
            .map(|n| {
                let view = self
                    .view_index
                    .get(&n.record.name)
                    .map(|&i| &self.view.nodes[i]);
                let counts = view.map(|v| v.category_counts()).unwrap_or_default();
                NodeSummary {
                    name: n.record.name.clone(),
                    status: n.status,
                    capacity: n.record.capacity.clone(),
                    address: n.record.address.clone(),
                    agent_version: n.record.agent_version.clone(),
                    cpu_used_cores: n.report.cpu_used_cores,
                    memory_used_bytes: n.report.memory_used_bytes,
                    free_gpus: view.map(|v| v.free_gpus()).unwrap_or_default(),
                    jobs: view.map_or(0, |v| v.jobs().len() as u32),
                    last_report_age_s: (now - n.last_seen).max(0.0),
                    category_counts: counts.map(|c| c as u32),
                }
            })
            .collect()
    }

    /// Jobs in submission order; finished ones only with `all`.
    pub fn list_jobs(&self, all: bool) -> Vec<JobSummary> {
        let mut jobs: Vec<&JobRecord> = self
            .jobs
            .values()
            .filter(|j| all || !j.status.is_finished())
            .collect();
        jobs.sort_by_key(|j| j.seq);
        jobs.into_iter().map(JobRecord::summary).collect()
    }

    pub fn job_detail(&self, id: &str) -> Result<JobDetail, ControlError> {
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| ControlError::NoSuchJob { id: id.into() })?;
        let mut summary = job.summary();
        if job.status == JobStatus::Queued
            && let Some(pos) = self.queue.position(id)
        {
            summary.message = format!("position {} in the queue; {}", pos + 1, summary.message);
        }
        Ok(JobDetail {
            summary,
            spec: job.spec.clone(),
            progress: job.progress.iter().copied().collect(),
            categories: job.categories.clone(),
            placements: job.placements.clone(),
        })
    }

    /// Members placed since start (cheap: the server reads it around every request).
    pub fn placements(&self) -> u64 {
        self.placements
    }

    /// (nodes, ready nodes, jobs, queued jobs, reports, placements, policy)
    pub fn counters(&self) -> (u64, u64, u64, u64, u64, u64, String) {
        (
            self.nodes.len() as u64,
            self.nodes
                .values()
                .filter(|n| n.status == NodeStatus::Ready)
                .count() as u64,
            self.jobs
                .values()
                .filter(|j| !j.status.is_finished())
                .count() as u64,
            self.queue.len() as u64,
            self.reports,
            self.placements,
            self.policy.name().to_owned(),
        )
    }

    // ---- the node -> jobs index ------------------------------------------------------------

    /// Record the nodes of a job's members in the index.
    fn index_job(&mut self, id: &str) {
        let Some(job) = self.jobs.get(id) else { return };
        for m in &job.members {
            self.on_node
                .entry(m.node.clone())
                .or_default()
                .insert(id.to_owned());
        }
    }

    /// Ids of the unfinished jobs with a member on `node`, dropping stale index entries.
    fn jobs_on(&mut self, node: &str) -> Vec<String> {
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

    // ---- the placement view ---------------------------------------------------------------

    fn rebuild_view(&mut self) {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        self.view.nodes = names
            .iter()
            .map(|n| NodeView::new(n.clone(), 1.0, 0))
            .collect();
        self.view_index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        for n in names {
            self.sync_view(&n);
        }
    }

    /// Add a newly registered node to the view at its place in name order. Shifting the later
    /// entries is a memmove and an index update each; rebuilding the whole view here instead
    /// made registering N nodes cost O(N²) node syncs (10,000 nodes never finished registering
    /// in the load benchmark).
    fn insert_into_view(&mut self, name: &str) {
        let at = self.view.nodes.partition_point(|n| n.name.as_str() < name);
        self.view
            .nodes
            .insert(at, NodeView::new(name.to_owned(), 1.0, 0));
        for (i, n) in self.view.nodes.iter().enumerate().skip(at) {
            if let Some(slot) = self.view_index.get_mut(&n.name) {
                *slot = i;
            }
        }
        self.view_index.insert(name.to_owned(), at);
        self.sync_view(name);
    }

    /// Rebuild one node's view from its latest report and the coordinator's placements there.
    fn sync_view(&mut self, name: &str) {
        let on_node = self.jobs_on(name);
        let (Some(node), Some(&i)) = (self.nodes.get(name), self.view_index.get(name)) else {
            return;
        };
        let mut jobs: Vec<JobView> = Vec::new();
        let mut assigned: BTreeSet<u32> = BTreeSet::new();
        let mut reported: BTreeSet<(String, u32)> = BTreeSet::new();
        for r in &node.report.jobs {
            if r.state.is_finished() {
                continue;
            }
            let (id, replicas) = match r.origin {
                JobOrigin::Local => (local_id(name, &r.job_id), 1),
                // Still running there, whatever we think of it: it holds resources.
                JobOrigin::Coordinator => (
                    r.job_id.clone(),
                    self.jobs.get(&r.job_id).map_or(1, JobRecord::replicas),
                ),
            };
            reported.insert((id.clone(), r.replica));
            assigned.extend(r.gpu_indices.iter().copied());
            let requested = self.jobs.get(&id).and_then(|j| j.spec.as_ref());
            jobs.push(JobView {
                id: member_id(&id, r.replica, replicas),
                category: r.category,
                pending: false,
                growth: r.growth,
                growth_efficiency: r.growth_efficiency,
                cpu_cores: r.cpu_cores,
                memory_bytes: r.memory_bytes,
                requested_cores: requested.and_then(|s| s.cores),
                requested_memory_bytes: requested.and_then(|s| s.memory_bytes),
                epoch: r.epoch,
                max_epochs: r.max_epochs,
                epoch_seconds: r.epoch_seconds,
            });
        }
        // Placements not reported yet (and members of jobs whose node is down: they still hold
        // their resources in case the job is running).
        for id in on_node {
            let Some(job) = self.jobs.get(&id).filter(|j| !j.is_local()) else {
                continue;
            };
            for m in job
                .members
                .iter()
                .filter(|m| m.node == name && !m.state.is_finished())
            {
                if reported.contains(&(job.id.clone(), m.replica)) {
                    continue;
                }
                assigned.extend(m.gpus.iter().copied());
                let spec = job.spec.as_ref().expect("not local");
                let request = JobRequest {
                    id: member_id(&job.id, m.replica, spec.replicas),
                    gpus: spec.gpus,
                    cores: spec.cores,
                    memory_bytes: spec.memory_bytes,
                    priority: spec.priority,
                    avoid: Vec::new(),
                };
                jobs.push(JobView::pending(request.id.clone(), &request));
            }
        }
        let usage: HashMap<u32, u64> = node
            .report
            .gpus
            .iter()
            .map(|g| (g.index, g.memory_used_bytes))
            .collect();
        let mut view = NodeView::new(
            name,
            node.record.capacity.cores,
            node.record.capacity.memory_bytes,
        );
        view.schedulable = node.status == NodeStatus::Ready && node.session.is_some();
        view.gpus = node
            .record
            .capacity
            .gpus
            .iter()
            .map(|g| GpuView {
                index: g.index,
                model: g.model.clone(),
                memory_bytes: g.memory_bytes,
                assigned: assigned.contains(&g.index),
                memory_used_bytes: usage.get(&g.index).copied().unwrap_or(0),
            })
            .collect();
        view.cpu_used_cores = node.report.cpu_used_cores;
        view.memory_used_bytes = node.report.memory_used_bytes;
        view.set_jobs(jobs);
        self.view.nodes[i] = view;
    }
}

/// The id a local job is listed under.
fn local_id(node: &str, job: &str) -> String {
    format!("{node}/{job}")
}

fn queued(job: &JobRecord) -> QueuedJob {
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
    }
}

fn apply_report(member: &mut MemberRecord, report: &JobReport) {
    member.state = match report.state {
        // The node has it; "starting" on the node is as good as running for placement.
        RunState::Starting => RunState::Starting,
        s => s,
    };
    member.cpu_cores = report.cpu_cores;
    member.cpu_limit_cores = report.cpu_limit_cores;
    member.memory_bytes = report.memory_bytes;
    member.exit_code = report.exit_code;
}

/// Record category changes and progress samples. Replica 0 speaks for a gang.
fn track_progress(
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
fn record_progress(job: &mut JobRecord, sample: ProgressSample, limit: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use governor_proto::node::GpuDevice;

    const GIB: u64 = 1 << 30;

    fn hello(name: &str, gpus: u32) -> Hello {
        Hello {
            node_name: name.into(),
            capacity: NodeCapacity {
                cores: 8.0,
                memory_bytes: 32 * GIB,
                gpus: (0..gpus)
                    .map(|i| GpuDevice {
                        index: i,
                        model: "A100".into(),
                        memory_bytes: 40 * GIB,
                    })
                    .collect(),
            },
            agent_version: "test".into(),
        }
    }

    fn spec(name: &str, gpus: u32) -> JobSpec {
        JobSpec {
            gpus,
            ..JobSpec::new(name, vec!["train".into()], "/tmp/train.log")
        }
    }

    fn starts(out: &[(String, NodeCommand)]) -> Vec<(String, String, u32)> {
        out.iter()
            .filter_map(|(n, c)| match c {
                NodeCommand::Start(s) => Some((n.clone(), s.job_id.clone(), s.replica)),
                NodeCommand::Stop(_) => None,
            })
            .collect()
    }

    fn running(id: &str, category: Category) -> JobReport {
        JobReport {
            category,
            ..JobReport::running(id, id)
        }
    }

    fn report_of(jobs: Vec<JobReport>) -> NodeReport {
        NodeReport {
            jobs,
            ..NodeReport::default()
        }
    }

    /// Two connected nodes under first-fit.
    fn two_nodes() -> (ClusterState, u64, u64) {
        let mut s = ClusterState::new(StateConfig::default(), "first-fit").unwrap();
        let a = s
            .register(0.0, hello("a", 2), "10.0.0.1:1".into())
            .session_id;
        let b = s
            .register(0.0, hello("b", 2), "10.0.0.2:1".into())
            .session_id;
        (s, a, b)
    }

    #[test]
    fn a_nodes_migration_requests_are_kept_on_its_jobs_until_withdrawn() {
        let (mut s, a, _) = two_nodes();
        s.submit(1.0, spec("vae", 1));
        s.take_outbox();
        let mut report = report_of(vec![
            running("j1", Category::Converged),
            JobReport {
                origin: JobOrigin::Local,
                ..running("/docker/abc", Category::Progressing)
            },
        ]);
        report.migrations = vec![
            governor_proto::node::MigrationRequest {
                job_id: "j1".into(),
                reason: "converged while others progress".into(),
            },
            // A request for a job the report does not carry is ignored.
            governor_proto::node::MigrationRequest {
                job_id: "j9".into(),
                reason: "?".into(),
            },
        ];
        s.report(2.0, "a", a, report.clone()).unwrap();
        let asked = s.job_detail("j1").unwrap().summary.migration_request;
        assert_eq!(
            asked.as_deref(),
            Some("node a asks: converged while others progress")
        );
        assert_eq!(
            s.jobs
                .get("j1")
                .unwrap()
                .migration_request
                .as_ref()
                .unwrap()
                .since,
            2.0
        );
        assert_eq!(
            s.job_detail("a//docker/abc")
                .unwrap()
                .summary
                .migration_request,
            None
        );
        // Asked again: the request keeps its start.
        s.report(3.0, "a", a, report.clone()).unwrap();
        assert_eq!(
            s.jobs
                .get("j1")
                .unwrap()
                .migration_request
                .as_ref()
                .unwrap()
                .since,
            2.0
        );
        // Withdrawn.
        report.migrations.clear();
        s.report(4.0, "a", a, report).unwrap();
        assert_eq!(s.job_detail("j1").unwrap().summary.migration_request, None);
    }

    #[test]
    fn nodes_joining_in_any_order_keep_the_view_in_name_order() {
        let mut s = ClusterState::new(StateConfig::default(), "round-robin").unwrap();
        for name in ["m", "c", "x", "a", "q", "b"] {
            s.register(0.0, hello(name, 1), format!("{name}:1"));
        }
        let names: Vec<&str> = s.view().nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "m", "q", "x"]);
        for (i, n) in s.view().nodes.iter().enumerate() {
            assert_eq!(s.view_index[&n.name], i, "index of {}", n.name);
            assert_eq!(n.gpus.len(), 1, "{} synced from its hello", n.name);
        }
        // A job is placed on a node that joined after others (the view works, not just sorts).
        s.submit(1.0, spec("j", 1));
        assert_eq!(starts(&s.take_outbox()).len(), 1);
    }

    #[test]
    fn a_submitted_job_is_placed_started_and_runs() {
        let (mut s, a, _) = two_nodes();
        let job = s.submit(1.0, spec("resnet", 1));
        assert_eq!(job.id, "j1");
        assert_eq!(job.status, JobStatus::Starting);
        let out = s.take_outbox();
        assert_eq!(starts(&out), [("a".to_string(), "j1".to_string(), 0)]);
        let NodeCommand::Start(start) = &out[0].1 else {
            unreachable!()
        };
        assert_eq!(start.gpu_indices, [0]);
        assert_eq!(start.env["GOVERNOR_JOB_ID"], "j1");
        assert_eq!(start.env["GOVERNOR_MASTER_ADDR"], "10.0.0.1");
        s.report(
            2.0,
            "a",
            a,
            report_of(vec![running("j1", Category::Progressing)]),
        )
        .unwrap();
        let j = &s.list_jobs(false)[0];
        assert_eq!(j.status, JobStatus::Running);
        assert_eq!(j.category, Category::Progressing);
        let d = s.job_detail("j1").unwrap();
        assert_eq!(d.placements[0].policy, "first-fit");
        assert_eq!(d.placements[0].node, "a");
        assert!(d.placements[0].reason.contains("first node"));
    }

    #[test]
    fn gpus_are_reserved_until_the_job_ends() {
        let (mut s, a, _) = two_nodes();
        s.submit(0.0, spec("x", 2));
        s.submit(0.0, spec("y", 2));
        let third = s.submit(0.0, spec("z", 1));
        assert_eq!(third.status, JobStatus::Queued);
        assert!(
            third.message.contains("fewer than 1 free GPUs"),
            "{}",
            third.message
        );
        // x finishes on a: z gets a GPU there.
        let mut done = running("j1", Category::Converged);
        done.state = RunState::Exited;
        done.exit_code = Some(0);
        s.report(5.0, "a", a, report_of(vec![done])).unwrap();
        assert_eq!(s.job_record("j1").unwrap().status, JobStatus::Completed);
        s.tick(5.5);
        assert_eq!(s.job_record("j3").unwrap().status, JobStatus::Starting);
        assert_eq!(s.job_record("j3").unwrap().members[0].node, "a");
    }

    #[test]
    fn a_silent_node_is_lost_and_its_jobs_unknown_until_it_reports_again() {
        let (mut s, a, b) = two_nodes();
        s.submit(0.0, spec("x", 0));
        s.report(
            1.0,
            "a",
            a,
            report_of(vec![running("j1", Category::Watching)]),
        )
        .unwrap();
        s.report(1.0, "b", b, report_of(vec![])).unwrap();
        s.tick(5.0);
        assert_eq!(s.job_record("j1").unwrap().status, JobStatus::Running);
        // b keeps reporting, a stops.
        s.report(11.5, "b", b, report_of(vec![])).unwrap();
        s.tick(11.5);
        let nodes = s.list_nodes(11.5);
        assert_eq!(nodes[0].status, NodeStatus::Lost);
        assert_eq!(nodes[1].status, NodeStatus::Ready);
        let job = s.job_record("j1").unwrap();
        assert_eq!(job.status, JobStatus::Unknown);
        assert!(job.message.contains("node a is lost"), "{}", job.message);
        // New jobs avoid the lost node.
        s.submit(12.0, spec("y", 0));
        assert_eq!(s.job_record("j2").unwrap().members[0].node, "b");
        // a comes back (new session) and re-syncs: the job runs again, nothing was dropped.
        let a2 = s
            .register(20.0, hello("a", 2), "10.0.0.1:2".into())
            .session_id;
        let job = s.job_record("j1").unwrap();
        assert_eq!(
            job.status,
            JobStatus::Unknown,
            "not confirmed before the node's first report"
        );
        assert!(
            job.message.contains("waiting for its first report"),
            "{}",
            job.message
        );
        s.report(
            20.0,
            "a",
            a2,
            report_of(vec![running("j1", Category::Watching)]),
        )
        .unwrap();
        assert_eq!(s.job_record("j1").unwrap().status, JobStatus::Running);
        // The old session is refused.
        assert_eq!(
            s.report(20.0, "a", a, report_of(vec![])),
            Err(SessionError::Stale { node: "a".into() })
        );
    }

    #[test]
    fn a_start_the_node_never_confirms_fails_after_the_timeout() {
        let (mut s, a, _) = two_nodes();
        s.submit(0.0, spec("x", 0));
        s.report(30.0, "a", a, report_of(vec![])).unwrap();
        assert_eq!(s.job_record("j1").unwrap().status, JobStatus::Starting);
        s.report(61.0, "a", a, report_of(vec![])).unwrap();
        let job = s.job_record("j1").unwrap();
        assert_eq!(job.status, JobStatus::Failed);
        assert!(
            job.message.contains("did not start it within 60 s"),
            "{}",
            job.message
        );
    }

    #[test]
    fn a_node_that_reconnects_gets_the_unconfirmed_starts_again() {
        let (mut s, a, _) = two_nodes();
        s.submit(0.0, spec("x", 0));
        s.take_outbox();
        s.disconnected("a", a);
        let w = s.register(2.0, hello("a", 2), "10.0.0.1:2".into());
        assert_ne!(w.session_id, a);
        assert_eq!(
            starts(&s.take_outbox()),
            [("a".to_string(), "j1".to_string(), 0)]
        );
    }

    #[test]
    fn a_failed_gang_member_stops_the_others() {
        let (mut s, a, b) = two_nodes();
        let mut gang = spec("ddp", 1);
        gang.replicas = 2;
        s.submit(0.0, gang);
        let out = s.take_outbox();
        assert_eq!(
            starts(&out),
            [
                ("a".to_string(), "j1".to_string(), 0),
                ("b".to_string(), "j1".to_string(), 1)
            ]
        );
        let NodeCommand::Start(st) = &out[1].1 else {
            unreachable!()
        };
        assert_eq!(st.env["GOVERNOR_WORLD_SIZE"], "2");
        assert_eq!(st.env["GOVERNOR_RANK"], "1");
        s.report(
            1.0,
            "a",
            a,
            report_of(vec![running("j1", Category::Unknown)]),
        )
        .unwrap();
        let mut failed = running("j1", Category::Unknown);
        failed.replica = 1;
        failed.state = RunState::Failed;
        failed.message = "CUDA out of memory".into();
        s.report(1.0, "b", b, report_of(vec![failed])).unwrap();
        let job = s.job_record("j1").unwrap();
        assert_eq!(job.status, JobStatus::Failed);
        assert!(
            job.message
                .contains("member 1 on node b failed: CUDA out of memory"),
            "{}",
            job.message
        );
        let out = s.take_outbox();
        assert!(
            out.iter()
                .any(|(n, c)| n == "a" && matches!(c, NodeCommand::Stop(st) if st.job_id == "j1")),
            "{out:?}"
        );
    }

    #[test]
    fn cancel_stops_a_running_job_and_refuses_twice() {
        let (mut s, a, _) = two_nodes();
        s.submit(0.0, spec("x", 0));
        s.report(
            1.0,
            "a",
            a,
            report_of(vec![running("j1", Category::Unknown)]),
        )
        .unwrap();
        s.take_outbox();
        assert_eq!(s.cancel(2.0, "j1").unwrap().status, JobStatus::Cancelled);
        assert!(matches!(&s.take_outbox()[..], [(n, NodeCommand::Stop(_))] if n == "a"));
        assert_eq!(
            s.cancel(3.0, "j1").unwrap_err().to_string(),
            "job j1 already cancelled; nothing to cancel"
        );
        assert_eq!(
            s.cancel(3.0, "j9").unwrap_err().to_string(),
            "no job j9: `govctl jobs --all` lists the known jobs"
        );
        // Still running there on the next report: stop is resent once per session, not per report.
        s.report(
            4.0,
            "a",
            a,
            report_of(vec![running("j1", Category::Unknown)]),
        )
        .unwrap();
        s.report(
            5.0,
            "a",
            a,
            report_of(vec![running("j1", Category::Unknown)]),
        )
        .unwrap();
        assert_eq!(s.take_outbox().len(), 1);
    }

    #[test]
    fn local_jobs_are_listed_under_their_node_and_leave_when_the_node_drops_them() {
        let (mut s, a, _) = two_nodes();
        let mut local = running("pytorch-1234", Category::Progressing);
        local.origin = JobOrigin::Local;
        local.gpu_indices = vec![1];
        s.report(1.0, "a", a, report_of(vec![local])).unwrap();
        let jobs = s.list_jobs(false);
        assert_eq!(jobs[0].id, "a/pytorch-1234");
        assert!(jobs[0].local);
        // Its GPU is not free for placement.
        assert_eq!(s.view().nodes[0].free_gpus(), vec![0]);
        assert!(matches!(
            s.cancel(2.0, "a/pytorch-1234"),
            Err(ControlError::LocalJob { .. })
        ));
        s.report(2.0, "a", a, report_of(vec![])).unwrap();
        assert!(s.list_jobs(true).is_empty());
        assert!(s.take_dirty().removed_jobs.contains("a/pytorch-1234"));
    }

    #[test]
    fn category_history_and_progress_are_kept() {
        let (mut s, a, _) = two_nodes();
        s.submit(0.0, spec("x", 0));
        for (t, cat, loss) in [
            (1.0, Category::Unknown, 2.0),
            (2.0, Category::Progressing, 1.0),
            (3.0, Category::Progressing, 0.5),
            (4.0, Category::Converged, 0.49),
        ] {
            let mut r = running("j1", cat);
            r.progress = Some(loss);
            s.report(t, "a", a, report_of(vec![r])).unwrap();
        }
        let d = s.job_detail("j1").unwrap();
        assert_eq!(
            d.categories
                .iter()
                .map(|c| (c.at_unix, c.category))
                .collect::<Vec<_>>(),
            [
                (1.0, Category::Unknown),
                (2.0, Category::Progressing),
                (4.0, Category::Converged)
            ]
        );
        assert_eq!(d.progress.len(), 4);
        assert_eq!(d.summary.progress, Some(0.49));
    }

    #[test]
    fn progress_history_covers_the_whole_job_in_bounded_memory() {
        let (mut s, a, _) = two_nodes();
        s.submit(0.0, spec("x", 0));
        let limit = s.config().progress_samples;
        for t in 1..=10_000 {
            let mut r = running("j1", Category::Progressing);
            r.progress = Some(1.0 / t as f64);
            s.report(t as f64, "a", a, report_of(vec![r])).unwrap();
        }
        let d = s.job_detail("j1").unwrap();
        assert!(d.progress.len() <= limit && d.progress.len() >= limit / 2);
        assert_eq!(d.progress[0].at_unix, 1.0, "the start is kept");
        let newest = d.progress[d.progress.len() - 1];
        assert_eq!((newest.at_unix, newest.value), (10_000.0, 1e-4));
        // Evenly spread: no gap much wider than the average.
        let gaps: Vec<f64> = d
            .progress
            .windows(2)
            .map(|w| w[1].at_unix - w[0].at_unix)
            .collect();
        let mean = 9_999.0 / gaps.len() as f64;
        assert!(gaps.iter().all(|&g| g <= 2.0 * mean), "{gaps:?}");
    }

    #[test]
    fn restore_keeps_every_job_and_resyncs() {
        let (mut s, a, _) = two_nodes();
        s.submit(0.0, spec("running", 0));
        s.submit(0.0, spec("waiting", 8));
        s.set_policy(0.0, "specon").unwrap();
        s.report(
            1.0,
            "a",
            a,
            report_of(vec![running("j1", Category::Progressing)]),
        )
        .unwrap();
        let nodes: Vec<NodeRecord> = ["a", "b"]
            .iter()
            .map(|n| s.node_record(n).unwrap().clone())
            .collect();
        let jobs: Vec<JobRecord> = ["j1", "j2"]
            .iter()
            .map(|j| s.job_record(j).unwrap().clone())
            .collect();
        let mut r =
            ClusterState::restore(StateConfig::default(), 100.0, Some(s.meta()), nodes, jobs)
                .unwrap();
        assert_eq!(r.policy_state().current, "specon");
        assert_eq!(r.list_nodes(100.0)[0].status, NodeStatus::Resyncing);
        assert_eq!(r.job_record("j1").unwrap().status, JobStatus::Unknown);
        assert_eq!(r.job_record("j2").unwrap().status, JobStatus::Queued);
        let a2 = r.register(101.0, hello("a", 2), "x:1".into()).session_id;
        r.report(
            101.0,
            "a",
            a2,
            report_of(vec![running("j1", Category::Progressing)]),
        )
        .unwrap();
        assert_eq!(r.job_record("j1").unwrap().status, JobStatus::Running);
        // New ids continue after the restored ones.
        assert_eq!(r.submit(102.0, spec("next", 0)).id, "j3");
        // b never comes back: lost after the timeout.
        r.tick(111.0);
        assert_eq!(r.list_nodes(111.0)[1].status, NodeStatus::Lost);
    }
}
