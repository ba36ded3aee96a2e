//! The conversions between the govctl <-> coordinator domain types of [`super`] and the
//! generated messages: `TryFrom<pb::...>` checks what arrives, `From<...> for pb::...` builds
//! what is sent.

use std::collections::BTreeMap;

use super::{
    CandidateScore, CategoryChange, JobDetail, JobMember, JobMove, JobSpec, JobState, JobSummary,
    MAX_GPUS_PER_MEMBER, MAX_REPLICAS, MovePhase, NodeState, NodeSummary, PlacementDecision,
    PolicyInfo, PolicyState, ProgressSample, Stats,
};
use crate::InvalidMessage;
use crate::error::{finite, non_negative, opt, positive, short, text};
use crate::node::{Checkpoint, MAX_MESSAGE_LEN, MAX_NAME_LEN, check_argv, check_log_path};
use crate::pb;

// ---- wire -> domain ------------------------------------------------------------------------

impl TryFrom<pb::JobSpec> for JobSpec {
    type Error = InvalidMessage;
    fn try_from(m: pb::JobSpec) -> Result<Self, InvalidMessage> {
        check_argv(&m.argv)?;
        check_log_path(&m.log_path)?;
        let replicas = m.replicas.max(1);
        if replicas > MAX_REPLICAS {
            return Err(InvalidMessage::new(
                "replicas",
                format!("is {replicas}, at most {MAX_REPLICAS} allowed"),
            ));
        }
        if m.gpus > MAX_GPUS_PER_MEMBER {
            return Err(InvalidMessage::new(
                "gpus",
                format!(
                    "is {}, at most {MAX_GPUS_PER_MEMBER} per member allowed",
                    m.gpus
                ),
            ));
        }
        let env: BTreeMap<String, String> = m.env.into_iter().collect();
        for k in env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(InvalidMessage::new(
                    format!("env[{k:?}]"),
                    "names must be non-empty without '=' or NUL",
                ));
            }
        }
        JobSpec {
            name: text("name", m.name, MAX_NAME_LEN)?,
            argv: m.argv,
            log_path: m.log_path,
            metric: short("metric", m.metric, MAX_NAME_LEN)?,
            maximise: m.maximise,
            gpus: m.gpus,
            priority: m.priority,
            replicas,
            cores: opt(m.cores, |v| positive("cores", v))?,
            memory_bytes: m.memory_bytes,
            gang_timeout_s: opt(m.gang_timeout_s, |v| positive("gang_timeout_s", v))?,
            env,
            checkpoint: m.checkpoint.map(Checkpoint::try_from).transpose()?,
            max_cores: opt(m.max_cores, |v| positive("max_cores", v))?,
            user: crate::error::check_user_name("user", m.user)?,
        }
        .checked_elastic()
        .and_then(JobSpec::checked_user)
    }
}

impl JobSpec {
    /// A job run as a user does not have its checkpoint carried: the nodes pack and unpack it
    /// as root, at a path the submission names, which would let it read or write any file.
    fn checked_user(self) -> Result<Self, InvalidMessage> {
        let as_user = !self.user.is_empty() && self.user != "root";
        if as_user && self.checkpoint.as_ref().is_some_and(|c| c.carry) {
            return Err(InvalidMessage::new(
                "checkpoint.carry",
                "is not available to a job run as a user (the nodes would pack and unpack its \
                 checkpoint as root): put its checkpoint on storage every node mounts",
            ));
        }
        Ok(self)
    }

    /// An elastic job resumes at another size from its own checkpoint: it needs a range that
    /// starts at its `cores`, a framework checkpoint (a CRIU image keeps its old thread count),
    /// one member and no GPUs (members and GPUs are not resized).
    fn checked_elastic(self) -> Result<Self, InvalidMessage> {
        let Some(max) = self.max_cores else {
            return Ok(self);
        };
        let bad = |why: &str| Err(InvalidMessage::new("max_cores", why.to_owned()));
        match self.cores {
            None => return bad("an elastic job needs its least cores in `cores` as well"),
            Some(min) if max < min => {
                return bad(&format!("is {max}, below the job's least cores ({min})"));
            }
            _ => {}
        }
        if self.replicas > 1 || self.gpus > 0 {
            return bad("only single-member jobs without GPUs can be elastic");
        }
        if self.checkpoint.as_ref().is_none_or(|c| c.transparent) {
            return bad(
                "an elastic job needs a framework checkpoint (`--checkpoint-dir`) to resume at another size",
            );
        }
        Ok(self)
    }
}

fn node_status(v: i32) -> Result<NodeState, InvalidMessage> {
    match pb::NodeStatus::try_from(v) {
        Ok(pb::NodeStatus::Ready) => Ok(NodeState::Ready),
        Ok(pb::NodeStatus::Resyncing) => Ok(NodeState::Resyncing),
        Ok(pb::NodeStatus::Lost) => Ok(NodeState::Lost),
        _ => Err(InvalidMessage::new("status", format!("unknown value {v}"))),
    }
}

fn job_status(v: i32) -> Result<JobState, InvalidMessage> {
    match pb::JobStatus::try_from(v) {
        Ok(pb::JobStatus::Queued) => Ok(JobState::Queued),
        Ok(pb::JobStatus::Starting) => Ok(JobState::Starting),
        Ok(pb::JobStatus::Running) => Ok(JobState::Running),
        Ok(pb::JobStatus::Completed) => Ok(JobState::Completed),
        Ok(pb::JobStatus::Failed) => Ok(JobState::Failed),
        Ok(pb::JobStatus::Cancelled) => Ok(JobState::Cancelled),
        Ok(pb::JobStatus::Unknown) => Ok(JobState::Unknown),
        _ => Err(InvalidMessage::new("status", format!("unknown value {v}"))),
    }
}

impl TryFrom<pb::NodeSummary> for NodeSummary {
    type Error = InvalidMessage;
    fn try_from(m: pb::NodeSummary) -> Result<Self, InvalidMessage> {
        let mut category_counts = [0u32; 4];
        if m.category_counts.len() != 4 {
            return Err(InvalidMessage::new(
                "category_counts",
                format!("has {} entries, 4 expected", m.category_counts.len()),
            ));
        }
        category_counts.copy_from_slice(&m.category_counts);
        Ok(NodeSummary {
            capacity: m
                .capacity
                .ok_or_else(|| InvalidMessage::missing("capacity"))?
                .try_into()
                .map_err(|e: InvalidMessage| e.within("capacity"))?,
            name: m.name,
            status: node_status(m.status)?,
            address: m.address,
            agent_version: m.agent_version,
            cpu_used_cores: non_negative("cpu_used_cores", m.cpu_used_cores)?,
            memory_used_bytes: m.memory_used_bytes,
            free_gpus: m.free_gpus,
            jobs: m.jobs,
            last_report_age_s: non_negative("last_report_age_s", m.last_report_age_s)?,
            category_counts,
            can_dump: m.can_dump,
        })
    }
}

impl TryFrom<pb::JobSummary> for JobSummary {
    type Error = InvalidMessage;
    fn try_from(m: pb::JobSummary) -> Result<Self, InvalidMessage> {
        let members = m
            .members
            .into_iter()
            .enumerate()
            .map(|(i, mem)| {
                Ok(JobMember {
                    replica: mem.replica,
                    node: mem.node,
                    gpu_indices: mem.gpu_indices,
                    state: mem
                        .state
                        .try_into()
                        .map_err(|e: InvalidMessage| e.within(format!("members[{i}]")))?,
                })
            })
            .collect::<Result<Vec<_>, InvalidMessage>>()?;
        Ok(JobSummary {
            id: text("id", m.id, MAX_NAME_LEN)?,
            name: m.name,
            status: job_status(m.status)?,
            priority: m.priority,
            gpus: m.gpus,
            replicas: m.replicas,
            members,
            category: crate::node::category_from_wire(m.category)?,
            progress: opt(m.progress, |v| finite("progress", v))?,
            time_to_quality_s: opt(m.time_to_quality_s, |v| {
                non_negative("time_to_quality_s", v)
            })?,
            cpu_cores: non_negative("cpu_cores", m.cpu_cores)?,
            cpu_limit_cores: m.cpu_limit_cores,
            memory_bytes: m.memory_bytes,
            submitted_at_unix: m.submitted_at_unix,
            started_at_unix: m.started_at_unix,
            finished_at_unix: m.finished_at_unix,
            message: short("message", m.message, MAX_MESSAGE_LEN)?,
            local: m.local,
            move_request: if m.move_request.is_empty() {
                None
            } else {
                Some(short("move_request", m.move_request, MAX_MESSAGE_LEN)?)
            },
            moving: if m.moving.is_empty() {
                None
            } else {
                Some(short("moving", m.moving, MAX_MESSAGE_LEN)?)
            },
            cores: opt(m.cores, |v| positive("cores", v))?,
            gpu_energy_joules: opt(m.gpu_energy_joules, |v| {
                non_negative("gpu_energy_joules", v)
            })?,
            decision: short("decision", m.decision, MAX_MESSAGE_LEN)?,
        })
    }
}

impl TryFrom<pb::JobDetail> for JobDetail {
    type Error = InvalidMessage;
    fn try_from(m: pb::JobDetail) -> Result<Self, InvalidMessage> {
        Ok(JobDetail {
            summary: m
                .summary
                .ok_or_else(|| InvalidMessage::missing("summary"))?
                .try_into()
                .map_err(|e: InvalidMessage| e.within("summary"))?,
            spec: m
                .spec
                .map(JobSpec::try_from)
                .transpose()
                .map_err(|e| e.within("spec"))?,
            progress: m
                .progress
                .into_iter()
                .map(|p| ProgressSample {
                    at_unix: p.at_unix,
                    value: p.value,
                })
                .collect(),
            categories: m
                .categories
                .into_iter()
                .enumerate()
                .map(|(i, c)| {
                    Ok(CategoryChange {
                        at_unix: c.at_unix,
                        category: crate::node::category_from_wire(c.category)
                            .map_err(|e| e.within(format!("categories[{i}]")))?,
                    })
                })
                .collect::<Result<_, InvalidMessage>>()?,
            placements: m
                .placements
                .into_iter()
                .map(|p| PlacementDecision {
                    at_unix: p.at_unix,
                    policy: p.policy,
                    replica: p.replica,
                    node: p.node,
                    gpu_indices: p.gpu_indices,
                    reason: p.reason,
                    candidates: p
                        .candidates
                        .into_iter()
                        .map(|c| CandidateScore {
                            node: c.node,
                            score: c.score,
                            note: c.note,
                        })
                        .collect(),
                })
                .collect(),
            moves: m
                .moves
                .into_iter()
                .enumerate()
                .map(|(i, mv)| JobMove::try_from(mv).map_err(|e| e.within(format!("moves[{i}]"))))
                .collect::<Result<_, InvalidMessage>>()?,
        })
    }
}

impl TryFrom<pb::JobMove> for JobMove {
    type Error = InvalidMessage;
    fn try_from(m: pb::JobMove) -> Result<Self, InvalidMessage> {
        let phase = match pb::MovePhase::try_from(m.phase) {
            Ok(pb::MovePhase::Saving) => MovePhase::Saving,
            Ok(pb::MovePhase::Restoring) => MovePhase::Restoring,
            Ok(pb::MovePhase::Done) => MovePhase::Done,
            Ok(pb::MovePhase::RollingBack) => MovePhase::RollingBack,
            Ok(pb::MovePhase::RolledBack) => MovePhase::RolledBack,
            Ok(pb::MovePhase::Failed) => MovePhase::Failed,
            Ok(pb::MovePhase::Transferring) => MovePhase::Transferring,
            Ok(pb::MovePhase::Requeued) => MovePhase::Requeued,
            _ => {
                return Err(InvalidMessage::new(
                    "phase",
                    format!("unknown value {}", m.phase),
                ));
            }
        };
        Ok(JobMove {
            from_node: text("from_node", m.from_node, MAX_NAME_LEN)?,
            to_node: short("to_node", m.to_node, MAX_NAME_LEN)?,
            reason: short("reason", m.reason, MAX_MESSAGE_LEN)?,
            phase,
            requested_at_unix: m.requested_at_unix,
            saved_at_unix: m.saved_at_unix,
            running_at_unix: m.running_at_unix,
            message: short("message", m.message, MAX_MESSAGE_LEN)?,
            bytes: m.bytes,
            preempted_for: m
                .preempted_for
                .map(|p| text("preempted_for", p, MAX_NAME_LEN))
                .transpose()?,
            from_cores: opt(m.from_cores, |v| positive("from_cores", v))?,
            to_cores: opt(m.to_cores, |v| positive("to_cores", v))?,
            resized_for: m
                .resized_for
                .map(|p| text("resized_for", p, MAX_NAME_LEN))
                .transpose()?,
            start_sent_at_unix: m.start_sent_at_unix,
        })
    }
}

impl From<JobMove> for pb::JobMove {
    fn from(m: JobMove) -> Self {
        pb::JobMove {
            from_node: m.from_node,
            to_node: m.to_node,
            reason: m.reason,
            phase: match m.phase {
                MovePhase::Saving => pb::MovePhase::Saving,
                MovePhase::Restoring => pb::MovePhase::Restoring,
                MovePhase::Done => pb::MovePhase::Done,
                MovePhase::RollingBack => pb::MovePhase::RollingBack,
                MovePhase::RolledBack => pb::MovePhase::RolledBack,
                MovePhase::Failed => pb::MovePhase::Failed,
                MovePhase::Transferring => pb::MovePhase::Transferring,
                MovePhase::Requeued => pb::MovePhase::Requeued,
            } as i32,
            requested_at_unix: m.requested_at_unix,
            saved_at_unix: m.saved_at_unix,
            running_at_unix: m.running_at_unix,
            message: m.message,
            bytes: m.bytes,
            preempted_for: m.preempted_for,
            from_cores: m.from_cores,
            to_cores: m.to_cores,
            resized_for: m.resized_for,
            start_sent_at_unix: m.start_sent_at_unix,
        }
    }
}

impl From<pb::PolicyResponse> for PolicyState {
    fn from(m: pb::PolicyResponse) -> Self {
        PolicyState {
            current: m.current,
            available: m
                .available
                .into_iter()
                .map(|p| PolicyInfo {
                    name: p.name,
                    summary: p.summary,
                })
                .collect(),
        }
    }
}

impl From<pb::StatsResponse> for Stats {
    fn from(m: pb::StatsResponse) -> Self {
        Stats {
            uptime_s: m.uptime_s,
            nodes: m.nodes,
            ready_nodes: m.ready_nodes,
            jobs: m.jobs,
            queued_jobs: m.queued_jobs,
            reports: m.reports,
            placements: m.placements,
            placement_p50_ms: m.placement_p50_ms,
            placement_p99_ms: m.placement_p99_ms,
            placement_max_ms: m.placement_max_ms,
            policy: m.policy,
        }
    }
}

// ---- domain -> wire ------------------------------------------------------------------------

impl From<JobSpec> for pb::JobSpec {
    fn from(s: JobSpec) -> Self {
        pb::JobSpec {
            name: s.name,
            argv: s.argv,
            log_path: s.log_path,
            metric: s.metric,
            maximise: s.maximise,
            gpus: s.gpus,
            priority: s.priority,
            replicas: s.replicas,
            cores: s.cores,
            memory_bytes: s.memory_bytes,
            gang_timeout_s: s.gang_timeout_s,
            env: s.env.into_iter().collect(),
            checkpoint: s.checkpoint.map(Into::into),
            max_cores: s.max_cores,
            user: s.user,
        }
    }
}

impl From<NodeState> for pb::NodeStatus {
    fn from(s: NodeState) -> Self {
        match s {
            NodeState::Ready => pb::NodeStatus::Ready,
            NodeState::Resyncing => pb::NodeStatus::Resyncing,
            NodeState::Lost => pb::NodeStatus::Lost,
        }
    }
}

impl From<JobState> for pb::JobStatus {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Queued => pb::JobStatus::Queued,
            JobState::Starting => pb::JobStatus::Starting,
            JobState::Running => pb::JobStatus::Running,
            JobState::Completed => pb::JobStatus::Completed,
            JobState::Failed => pb::JobStatus::Failed,
            JobState::Cancelled => pb::JobStatus::Cancelled,
            JobState::Unknown => pb::JobStatus::Unknown,
        }
    }
}

impl From<NodeSummary> for pb::NodeSummary {
    fn from(n: NodeSummary) -> Self {
        pb::NodeSummary {
            name: n.name,
            status: pb::NodeStatus::from(n.status) as i32,
            capacity: Some(n.capacity.into()),
            address: n.address,
            agent_version: n.agent_version,
            cpu_used_cores: n.cpu_used_cores,
            memory_used_bytes: n.memory_used_bytes,
            free_gpus: n.free_gpus,
            jobs: n.jobs,
            last_report_age_s: n.last_report_age_s,
            category_counts: n.category_counts.to_vec(),
            can_dump: n.can_dump,
        }
    }
}

impl From<JobSummary> for pb::JobSummary {
    fn from(j: JobSummary) -> Self {
        pb::JobSummary {
            id: j.id,
            name: j.name,
            status: pb::JobStatus::from(j.status) as i32,
            priority: j.priority,
            gpus: j.gpus,
            replicas: j.replicas,
            members: j
                .members
                .into_iter()
                .map(|m| pb::JobMember {
                    replica: m.replica,
                    node: m.node,
                    gpu_indices: m.gpu_indices,
                    state: pb::RunState::from(m.state) as i32,
                })
                .collect(),
            category: pb::Category::from(j.category) as i32,
            progress: j.progress,
            cpu_cores: j.cpu_cores,
            cpu_limit_cores: j.cpu_limit_cores,
            memory_bytes: j.memory_bytes,
            submitted_at_unix: j.submitted_at_unix,
            started_at_unix: j.started_at_unix,
            finished_at_unix: j.finished_at_unix,
            message: j.message,
            local: j.local,
            move_request: j.move_request.unwrap_or_default(),
            time_to_quality_s: j.time_to_quality_s,
            moving: j.moving.unwrap_or_default(),
            cores: j.cores,
            gpu_energy_joules: j.gpu_energy_joules,
            decision: j.decision,
        }
    }
}

impl From<JobDetail> for pb::JobDetail {
    fn from(d: JobDetail) -> Self {
        pb::JobDetail {
            summary: Some(d.summary.into()),
            spec: d.spec.map(Into::into),
            progress: d
                .progress
                .into_iter()
                .map(|p| pb::ProgressSample {
                    at_unix: p.at_unix,
                    value: p.value,
                })
                .collect(),
            categories: d
                .categories
                .into_iter()
                .map(|c| pb::CategoryChange {
                    at_unix: c.at_unix,
                    category: pb::Category::from(c.category) as i32,
                })
                .collect(),
            placements: d
                .placements
                .into_iter()
                .map(|p| pb::PlacementDecision {
                    at_unix: p.at_unix,
                    policy: p.policy,
                    replica: p.replica,
                    node: p.node,
                    gpu_indices: p.gpu_indices,
                    reason: p.reason,
                    candidates: p
                        .candidates
                        .into_iter()
                        .map(|c| pb::CandidateScore {
                            node: c.node,
                            score: c.score,
                            note: c.note,
                        })
                        .collect(),
                })
                .collect(),
            moves: d.moves.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<PolicyState> for pb::PolicyResponse {
    fn from(p: PolicyState) -> Self {
        pb::PolicyResponse {
            current: p.current,
            available: p
                .available
                .into_iter()
                .map(|i| pb::PolicyInfo {
                    name: i.name,
                    summary: i.summary,
                })
                .collect(),
        }
    }
}

impl From<Stats> for pb::StatsResponse {
    fn from(s: Stats) -> Self {
        pb::StatsResponse {
            uptime_s: s.uptime_s,
            nodes: s.nodes,
            ready_nodes: s.ready_nodes,
            jobs: s.jobs,
            queued_jobs: s.queued_jobs,
            reports: s.reports,
            placements: s.placements,
            placement_p50_ms: s.placement_p50_ms,
            placement_p99_ms: s.placement_p99_ms,
            placement_max_ms: s.placement_max_ms,
            policy: s.policy,
        }
    }
}
