//! Domain types of the govctl <-> coordinator half of the protocol, and their conversions.
//!
//! They serialise with serde for `govctl --json` and for the coordinator's store.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::node::{Category, Checkpoint, NodeCapacity, RunState};

#[cfg(feature = "messages")]
mod wire;

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
    /// The user it runs as on its nodes (their uid, gid and groups there); empty: root, which a
    /// node refuses unless its `[coordinator] allow_root_jobs` is set.
    #[serde(default)]
    pub user: String,
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
            user: String::new(),
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
pub enum NodeState {
    /// Connected and reporting.
    Ready,
    /// Known from the store after a coordinator restart, not reconnected yet.
    Resyncing,
    /// Stopped reporting for longer than the timeout.
    Lost,
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeState::Ready => "ready",
            NodeState::Resyncing => "resyncing",
            NodeState::Lost => "lost",
        })
    }
}

/// One row of `govctl nodes`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub name: String,
    pub status: NodeState,
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
pub enum JobState {
    Queued,
    Starting,
    Running,
    Completed,
    Failed,
    Cancelled,
    /// Its node is lost: it may still run, nobody can tell.
    Unknown,
}

impl JobState {
    /// Completed, failed or cancelled: it will not change again.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Unknown => "unknown",
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
    pub status: JobState,
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
    #[serde(
        default,
        alias = "migration_request",
        skip_serializing_if = "Option::is_none"
    )]
    pub move_request: Option<String>,
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

#[cfg(all(test, feature = "grpc"))]
#[path = "control_tests.rs"]
mod tests;
