//! Domain types of the govctl <-> coordinator half of the protocol, and their conversions.
//!
//! They serialise with serde for `govctl --json` and for the coordinator's store.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InvalidMessage;
use crate::error::{finite, non_negative, opt, positive, short, text};
use crate::node::{
    Category, Checkpoint, MAX_MESSAGE_LEN, MAX_NAME_LEN, NodeCapacity, RunState, check_argv,
    check_log_path,
};
use crate::pb;

/// Most members a job may ask for.
pub const MAX_REPLICAS: u32 = 1024;
/// Most GPUs a member may ask for.
pub const MAX_GPUS_PER_MEMBER: u32 = 64;

/// What a user asks to run (`govctl submit`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub argv: Vec<String>,
    /// Absolute path of the log the job writes.
    pub log_path: String,
    /// Progress signal in the log ("loss"); empty: the node's default.
    #[serde(default)]
    pub metric: String,
    #[serde(default)]
    pub maximise: bool,
    /// Whole GPUs per member, all on the member's node.
    #[serde(default)]
    pub gpus: u32,
    #[serde(default)]
    pub priority: i32,
    /// Members, each on its own node (>= 1).
    #[serde(default = "one")]
    pub replicas: u32,
    /// Cores the job needs per member, if it says.
    #[serde(default)]
    pub cores: Option<f64>,
    /// Memory the job needs per member, if it says.
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// A gang (several members or GPUs) not admitted within this many seconds fails.
    #[serde(default)]
    pub gang_timeout_s: Option<f64>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// How it saves itself for a move; `None`: it is never moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,
    /// Elastic: the most cores it can use (`cores` is then the least). Grown and shrunk by
    /// save and resume; needs a framework checkpoint, one member, no GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cores: Option<f64>,
}

fn one() -> u32 {
    1
}

impl JobSpec {
    /// A single-member CPU job.
    pub fn new(name: impl Into<String>, argv: Vec<String>, log_path: impl Into<String>) -> Self {
        JobSpec {
            name: name.into(),
            argv,
            log_path: log_path.into(),
            metric: String::new(),
            maximise: false,
            gpus: 0,
            priority: 0,
            replicas: 1,
            cores: None,
            memory_bytes: None,
            gang_timeout_s: None,
            env: BTreeMap::new(),
            checkpoint: None,
            max_cores: None,
        }
    }

    /// Declared a range of cores (`--cores MIN:MAX`) it can be resized within.
    pub fn is_elastic(&self) -> bool {
        self.max_cores.is_some()
    }

    /// A gang needs all-or-nothing admission: several members or several GPUs.
    pub fn is_gang(&self) -> bool {
        self.replicas > 1 || self.gpus > 1
    }
}

/// A node as the coordinator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// Connected and reporting.
    Ready,
    /// Known from the store after a coordinator restart, not reconnected yet.
    Resyncing,
    /// Stopped reporting for longer than the timeout.
    Lost,
}

impl fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeStatus::Ready => "ready",
            NodeStatus::Resyncing => "resyncing",
            NodeStatus::Lost => "lost",
        })
    }
}

/// One row of `govctl nodes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub name: String,
    pub status: NodeStatus,
    pub capacity: NodeCapacity,
    pub address: String,
    pub agent_version: String,
    pub cpu_used_cores: f64,
    pub memory_used_bytes: u64,
    pub free_gpus: Vec<u32>,
    pub jobs: u32,
    pub last_report_age_s: f64,
    /// Jobs per category, in [`Category::ALL`] order.
    pub category_counts: [u32; 4],
    /// It can dump and restore jobs with CRIU (jobs without a checkpoint move to and from it).
    #[serde(default)]
    pub can_dump: bool,
}

/// A job's status in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    Queued,
    Starting,
    Running,
    Completed,
    Failed,
    Cancelled,
    /// Its node is lost: it may still run, nobody can tell.
    Unknown,
}

impl JobStatus {
    /// Completed, failed or cancelled: it will not change again.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::Failed | JobStatus::Cancelled
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobStatus::Queued => "queued",
            JobStatus::Starting => "starting",
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Unknown => "unknown",
        })
    }
}

/// Where one member of a job runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMember {
    pub replica: u32,
    pub node: String,
    pub gpu_indices: Vec<u32>,
    pub state: RunState,
}

/// One row of `govctl jobs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: String,
    pub name: String,
    pub status: JobStatus,
    pub priority: i32,
    pub gpus: u32,
    pub replicas: u32,
    pub members: Vec<JobMember>,
    pub category: Category,
    pub progress: Option<f64>,
    pub cpu_cores: f64,
    pub cpu_limit_cores: Option<f64>,
    pub memory_bytes: u64,
    pub submitted_at_unix: f64,
    pub started_at_unix: Option<f64>,
    pub finished_at_unix: Option<f64>,
    /// Why it waits, failed or is unknown.
    pub message: String,
    /// Found by a node, not submitted.
    pub local: bool,
    /// A node asks for the job to be moved elsewhere, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_request: Option<String>,
    /// Time to quality so far, seconds from submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_quality_s: Option<f64>,
    /// The phase of its current move, if one is under way ("saving on node-a for node-b").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<String>,
    /// The cores it holds now (an elastic job's current size; else what it declared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<f64>,
    /// GPU energy its nodes attribute to it, joules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_joules: Option<f64>,
    /// What its node's policy does to it now and why (empty: nothing reported).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub decision: String,
}

/// The phase of a job's move between nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MovePhase {
    /// The source was asked to save the job; it still runs there.
    Saving,
    /// Saved; started on the target from its checkpoint, not reported running there yet.
    Restoring,
    /// Running on the target: the move is over.
    Done,
    /// The target could not run it: being started again on the source from its checkpoint.
    RollingBack,
    /// Running on the source again after a failed move.
    RolledBack,
    /// The move did not happen (the job did not save, or ended on its own).
    Failed,
    /// Saved; its checkpoint is being carried to the coordinator (no shared path).
    Transferring,
    /// Preempted: saved to make room for a higher-priority job, queued to resume.
    Requeued,
}

impl MovePhase {
    /// True once the move is over, whichever way.
    pub fn is_over(self) -> bool {
        matches!(
            self,
            MovePhase::Done | MovePhase::RolledBack | MovePhase::Failed
        )
    }
}

impl fmt::Display for MovePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MovePhase::Saving => "saving",
            MovePhase::Restoring => "restoring",
            MovePhase::Done => "done",
            MovePhase::RollingBack => "rolling back",
            MovePhase::RolledBack => "rolled back",
            MovePhase::Failed => "failed",
            MovePhase::Transferring => "transferring",
            MovePhase::Requeued => "requeued",
        })
    }
}

/// One move of a job between nodes, with its phases' times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobMove {
    pub from_node: String,
    pub to_node: String,
    /// Who asked and why.
    pub reason: String,
    pub phase: MovePhase,
    pub requested_at_unix: f64,
    /// When the source reported the job saved and exited.
    #[serde(default)]
    pub saved_at_unix: Option<f64>,
    /// When it was reported running again (on the target, or on the source after a roll-back).
    #[serde(default)]
    pub running_at_unix: Option<f64>,
    #[serde(default)]
    pub message: String,
    /// Bytes of checkpoint the coordinator carried (0 with a shared path).
    #[serde(default)]
    pub bytes: u64,
    /// A preemption: the higher-priority job it made room for (`to_node` is empty until the
    /// job is placed again to resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_for: Option<String>,
    /// A resize of an elastic job: its cores before and after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_cores: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_cores: Option<f64>,
    /// A shrink to make room: the job it made room for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resized_for: Option<String>,
    /// When the job's start was last handed to the session of the node it is starting on (the
    /// target, or the source after a roll-back): from then on that node may be running it, so a
    /// move does not give up on that node the moment it is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_sent_at_unix: Option<f64>,
}

impl JobMove {
    /// Seconds the job did not run: from its save until it ran again (so far, at `now`).
    pub fn pause_s(&self, now: f64) -> Option<f64> {
        let saved = self.saved_at_unix?;
        Some((self.running_at_unix.unwrap_or(now) - saved).max(0.0))
    }
}

/// One point of a job's progress curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgressSample {
    pub at_unix: f64,
    pub value: f64,
}

/// A change of a job's category.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CategoryChange {
    pub at_unix: f64,
    pub category: Category,
}

/// A node a placement policy considered, with its score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateScore {
    pub node: String,
    pub score: f64,
    pub note: String,
}

/// Why a member of a job went where it went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementDecision {
    pub at_unix: f64,
    pub policy: String,
    pub replica: u32,
    pub node: String,
    pub gpu_indices: Vec<u32>,
    pub reason: String,
    pub candidates: Vec<CandidateScore>,
}

/// `govctl job JOB`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobDetail {
    pub summary: JobSummary,
    /// `None` for local jobs (not submitted).
    pub spec: Option<JobSpec>,
    pub progress: Vec<ProgressSample>,
    pub categories: Vec<CategoryChange>,
    pub placements: Vec<PlacementDecision>,
    /// Its moves between nodes, oldest first.
    #[serde(default)]
    pub moves: Vec<JobMove>,
}

/// A placement policy's name and one line about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub summary: String,
}

/// `govctl policy`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyState {
    pub current: String,
    pub available: Vec<PolicyInfo>,
}

/// `govctl stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub uptime_s: f64,
    pub nodes: u64,
    pub ready_nodes: u64,
    pub jobs: u64,
    pub queued_jobs: u64,
    pub reports: u64,
    pub placements: u64,
    pub placement_p50_ms: f64,
    pub placement_p99_ms: f64,
    pub placement_max_ms: f64,
    pub policy: String,
}

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
        }
        .checked_elastic()
    }
}

impl JobSpec {
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

fn node_status(v: i32) -> Result<NodeStatus, InvalidMessage> {
    match pb::NodeStatus::try_from(v) {
        Ok(pb::NodeStatus::Ready) => Ok(NodeStatus::Ready),
        Ok(pb::NodeStatus::Resyncing) => Ok(NodeStatus::Resyncing),
        Ok(pb::NodeStatus::Lost) => Ok(NodeStatus::Lost),
        _ => Err(InvalidMessage::new("status", format!("unknown value {v}"))),
    }
}

fn job_status(v: i32) -> Result<JobStatus, InvalidMessage> {
    match pb::JobStatus::try_from(v) {
        Ok(pb::JobStatus::Queued) => Ok(JobStatus::Queued),
        Ok(pb::JobStatus::Starting) => Ok(JobStatus::Starting),
        Ok(pb::JobStatus::Running) => Ok(JobStatus::Running),
        Ok(pb::JobStatus::Completed) => Ok(JobStatus::Completed),
        Ok(pb::JobStatus::Failed) => Ok(JobStatus::Failed),
        Ok(pb::JobStatus::Cancelled) => Ok(JobStatus::Cancelled),
        Ok(pb::JobStatus::Unknown) => Ok(JobStatus::Unknown),
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
            migration_request: if m.migration_request.is_empty() {
                None
            } else {
                Some(short(
                    "migration_request",
                    m.migration_request,
                    MAX_MESSAGE_LEN,
                )?)
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
        }
    }
}

impl From<NodeStatus> for pb::NodeStatus {
    fn from(s: NodeStatus) -> Self {
        match s {
            NodeStatus::Ready => pb::NodeStatus::Ready,
            NodeStatus::Resyncing => pb::NodeStatus::Resyncing,
            NodeStatus::Lost => pb::NodeStatus::Lost,
        }
    }
}

impl From<JobStatus> for pb::JobStatus {
    fn from(s: JobStatus) -> Self {
        match s {
            JobStatus::Queued => pb::JobStatus::Queued,
            JobStatus::Starting => pb::JobStatus::Starting,
            JobStatus::Running => pb::JobStatus::Running,
            JobStatus::Completed => pb::JobStatus::Completed,
            JobStatus::Failed => pb::JobStatus::Failed,
            JobStatus::Cancelled => pb::JobStatus::Cancelled,
            JobStatus::Unknown => pb::JobStatus::Unknown,
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
            migration_request: j.migration_request.unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        let mut s = JobSpec::new(
            "resnet",
            vec!["python3".into(), "train.py".into()],
            "/tmp/resnet.log",
        );
        s.gpus = 2;
        s.priority = 3;
        s.cores = Some(2.0);
        s.gang_timeout_s = Some(60.0);
        s
    }

    #[test]
    fn spec_round_trips() {
        let s = spec();
        assert_eq!(JobSpec::try_from(pb::JobSpec::from(s.clone())).unwrap(), s);
        assert!(s.is_gang());
    }

    #[test]
    fn spec_rejects_what_a_node_could_not_run() {
        let mut m = pb::JobSpec::from(spec());
        m.argv.clear();
        assert_eq!(JobSpec::try_from(m).unwrap_err().field, "argv");
        let mut m = pb::JobSpec::from(spec());
        m.log_path = "train.log".into();
        assert_eq!(JobSpec::try_from(m).unwrap_err().field, "log_path");
        let mut m = pb::JobSpec::from(spec());
        m.cores = Some(f64::NAN);
        assert_eq!(JobSpec::try_from(m).unwrap_err().field, "cores");
        let mut m = pb::JobSpec::from(spec());
        m.gpus = 1000;
        assert_eq!(JobSpec::try_from(m).unwrap_err().field, "gpus");
        let mut m = pb::JobSpec::from(spec());
        m.name = "  ".into();
        assert_eq!(JobSpec::try_from(m).unwrap_err().field, "name");
    }

    #[test]
    fn an_elastic_job_declares_a_range_from_its_cores_and_a_framework_checkpoint() {
        let elastic = || {
            let mut s = spec();
            s.gpus = 0;
            s.max_cores = Some(4.0);
            s.checkpoint = Some(Checkpoint {
                dir: "/shared/ck".into(),
                save_signal: 10,
                carry: false,
                transparent: false,
            });
            s
        };
        let s = elastic();
        assert!(s.is_elastic());
        assert_eq!(JobSpec::try_from(pb::JobSpec::from(s.clone())).unwrap(), s);
        let refused = |s: JobSpec| {
            let e = JobSpec::try_from(pb::JobSpec::from(s)).unwrap_err();
            assert_eq!(e.field, "max_cores");
            e.to_string()
        };
        let mut s = elastic();
        s.max_cores = Some(1.0);
        assert!(refused(s).contains("below the job's least cores"));
        let mut s = elastic();
        s.cores = None;
        assert!(refused(s).contains("least cores"));
        let mut s = elastic();
        s.gpus = 1;
        assert!(refused(s).contains("single-member"));
        let mut s = elastic();
        s.checkpoint = Some(Checkpoint::transparent());
        assert!(refused(s).contains("framework checkpoint"));
        let mut s = elastic();
        s.checkpoint = None;
        assert!(refused(s).contains("framework checkpoint"));
    }

    #[test]
    fn zero_replicas_means_one() {
        let mut m = pb::JobSpec::from(spec());
        m.replicas = 0;
        assert_eq!(JobSpec::try_from(m).unwrap().replicas, 1);
    }

    #[test]
    fn summary_and_detail_round_trip() {
        let summary = JobSummary {
            id: "j1".into(),
            name: "resnet".into(),
            status: JobStatus::Running,
            priority: 0,
            gpus: 1,
            replicas: 1,
            members: vec![JobMember {
                replica: 0,
                node: "node2".into(),
                gpu_indices: vec![0],
                state: RunState::Running,
            }],
            category: Category::Watching,
            progress: Some(0.3),
            cpu_cores: 1.0,
            cpu_limit_cores: Some(0.5),
            memory_bytes: 5,
            submitted_at_unix: 1.0,
            started_at_unix: Some(2.0),
            finished_at_unix: None,
            message: String::new(),
            local: false,
            migration_request: Some("node n1 asks: converged".into()),
            time_to_quality_s: Some(42.0),
            moving: Some("saving on node2 for node3".into()),
            cores: Some(2.0),
            gpu_energy_joules: Some(1500.0),
            decision: "weight 9000: progressing".into(),
        };
        let detail = JobDetail {
            summary: summary.clone(),
            spec: Some(spec()),
            progress: vec![ProgressSample {
                at_unix: 3.0,
                value: 0.3,
            }],
            categories: vec![CategoryChange {
                at_unix: 3.0,
                category: Category::Watching,
            }],
            placements: vec![PlacementDecision {
                at_unix: 1.5,
                policy: "flowcon".into(),
                replica: 0,
                node: "node2".into(),
                gpu_indices: vec![0],
                reason: "lowest score".into(),
                candidates: vec![CandidateScore {
                    node: "node2".into(),
                    score: 0.0,
                    note: "empty".into(),
                }],
            }],
            moves: vec![JobMove {
                from_node: "node1".into(),
                to_node: "node2".into(),
                reason: "govctl migrate".into(),
                phase: MovePhase::Done,
                requested_at_unix: 10.0,
                saved_at_unix: Some(12.5),
                running_at_unix: Some(14.0),
                message: "checkpoint in /shared/ckpt (shared path)".into(),
                bytes: 0,
                preempted_for: None,
                from_cores: Some(1.0),
                to_cores: Some(3.0),
                resized_for: None,
                start_sent_at_unix: None,
            }],
        };
        assert_eq!(
            JobDetail::try_from(pb::JobDetail::from(detail.clone())).unwrap(),
            detail
        );
        let json = serde_json::to_string(&summary).unwrap();
        assert!(json.contains("\"status\":\"running\""), "{json}");
    }
}
