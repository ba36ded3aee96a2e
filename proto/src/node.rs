//! Domain types of the node <-> coordinator half of the protocol, and their conversions.
//!
//! The node daemon fills a [`NodeReport`] and receives [`NodeCommand`]s; the coordinator receives
//! [`NodeMessage`]s and sends [`CoordinatorMessage`]s. `TryFrom<pb::...>` validates what arrives
//! from the network; `From<...> for pb::...` builds what is sent.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InvalidMessage;

#[cfg(feature = "messages")]
mod wire;
#[cfg(feature = "messages")]
pub(crate) use wire::{category_from_wire, check_argv, check_log_path};

/// Longest job, node or model name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Longest free-text message (reasons, errors) accepted, in bytes.
pub const MAX_MESSAGE_LEN: usize = 4096;
/// Bytes per checkpoint chunk on the wire (well under gRPC's 4 MiB message limit; a chunk of
/// more than twice this is refused).
pub const CHUNK_BYTES: usize = 1 << 20;

/// One GPU of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// NVML index on the node (unique per node).
    pub index: u32,
    pub model: String,
    pub memory_bytes: u64,
}

/// What a node offers to governed jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeCapacity {
    pub cores: f64,
    pub memory_bytes: u64,
    pub gpus: Vec<GpuDevice>,
}

impl NodeCapacity {
    /// A CPU-only node.
    pub fn cpu_only(cores: f64, memory_bytes: u64) -> Self {
        NodeCapacity {
            cores,
            memory_bytes,
            gpus: Vec::new(),
        }
    }
}

/// Registration: the first message a node sends on its `Session` stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// A DNS label (see [`crate::node::check_node_name`]); with mTLS, the certificate's name.
    ///
    /// [`crate::node::check_node_name`]: crate::error::check_node_name
    pub node_name: String,
    pub capacity: NodeCapacity,
    pub agent_version: String,
    /// It can dump and restore a job's process tree with CRIU (jobs that declared no
    /// checkpoint can move to and from it).
    #[serde(default)]
    pub can_dump: bool,
}

pub use crate::error::check_node_name as validate_node_name;

/// The coordinator's answer to a [`Hello`], and its heartbeat on the session after that.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub session_id: u64,
    pub report_interval_ms: u32,
    /// The fence: a node with none of its reports acknowledged for this long stops (saves,
    /// then stops) the jobs it received by a move, before the coordinator may start them
    /// elsewhere. 0: none.
    #[serde(default)]
    pub fence_after_ms: u32,
    /// The latest [`NodeReport::sequence`] of this session the coordinator has received.
    #[serde(default)]
    pub acknowledged_sequence: u64,
    /// The jobs on this node the coordinator would start elsewhere if it lost the node (moved
    /// here, not yet confirmed running): the ones the fence stops.
    #[serde(default)]
    pub fence_jobs: Vec<String>,
}

/// A job's training stage (FlowCon NL/WL/CL, SpeCon PC/WC/CC): the node policies' own type,
/// carried as is in reports.
pub use governor_policy::Category;

/// Where a job on a node came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobOrigin {
    /// Started on the coordinator's [`StartJob`].
    Coordinator,
    /// Found by the node itself.
    Local,
}

/// The life of a job's process on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Starting,
    Running,
    /// Exited by itself (see `exit_code`).
    Exited,
    /// Could not start, or was killed (see `message`).
    Failed,
}

impl RunState {
    /// True once the process is gone.
    pub fn is_finished(self) -> bool {
        matches!(self, RunState::Exited | RunState::Failed)
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RunState::Starting => "starting",
            RunState::Running => "running",
            RunState::Exited => "exited",
            RunState::Failed => "failed",
        })
    }
}

/// The latest state of one job on a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    /// The coordinator's id for coordinator jobs, the node's own id for local ones.
    pub job_id: String,
    /// Member index of a multi-node job (0 otherwise).
    pub replica: u32,
    pub name: String,
    pub origin: JobOrigin,
    pub state: RunState,
    pub exit_code: Option<i32>,
    /// Why it failed, or any note for the operator (may be empty).
    pub message: String,
    pub category: Category,
    /// Latest value of the progress signal E(t).
    pub progress: Option<f64>,
    /// Per-second progress P(t) (FlowCon Eq. 1), >= 0.
    pub growth: Option<f64>,
    /// Growth efficiency G(t) = P(t) / cores used (FlowCon Eq. 2), >= 0.
    pub growth_efficiency: Option<f64>,
    /// Mean CPU use over the last interval, in cores.
    pub cpu_cores: f64,
    pub memory_bytes: u64,
    /// The node's hard cap (cpu.max) in cores; `None` when uncapped.
    pub cpu_limit_cores: Option<f64>,
    /// The node's cpu.weight (1..=10000), 0 when unknown.
    pub cpu_weight: u32,
    pub gpu_indices: Vec<u32>,
    /// Mean utilisation of its GPUs, 0..=1.
    pub gpu_utilization: f64,
    pub gpu_memory_bytes: u64,
    /// Epochs done (ProCon's n), when the log shows them.
    pub epoch: Option<u64>,
    /// Epochs planned (ProCon's MAX).
    pub max_epochs: Option<u64>,
    /// Duration of the last epoch in seconds (ProCon's f).
    pub epoch_seconds: Option<f64>,
    /// Time to quality so far, seconds from the job's start on the node.
    pub time_to_quality_s: Option<f64>,
    /// It exited with status 0 after the node asked it to save ([`SaveJob`]): its checkpoint
    /// is complete and the same command resumes it.
    #[serde(default)]
    pub saved: bool,
    /// Which start of the job this is ([`StartJob::attempt`]).
    #[serde(default)]
    pub attempt: u32,
    /// The node could not save it for a move (a CRIU dump that failed): why. It runs on.
    #[serde(default)]
    pub save_error: String,
    /// GPU energy its node attributes to it (joules since the node found it on a GPU).
    #[serde(default)]
    pub gpu_energy_joules: Option<f64>,
    /// What the node's policy does to the job now and why, as `governor status` shows it.
    #[serde(default)]
    pub decision: String,
    /// It ended because its node stopped it as it asked (at convergence, or cut from its sweep
    /// by successive halving): completed, whatever status the interrupted process exited with.
    #[serde(default)]
    pub converged: bool,
}

impl JobReport {
    /// A running coordinator job with nothing measured yet (tests and harnesses fill the rest).
    pub fn running(job_id: impl Into<String>, name: impl Into<String>) -> Self {
        JobReport {
            job_id: job_id.into(),
            replica: 0,
            name: name.into(),
            origin: JobOrigin::Coordinator,
            state: RunState::Running,
            exit_code: None,
            message: String::new(),
            category: Category::Unknown,
            progress: None,
            growth: None,
            growth_efficiency: None,
            cpu_cores: 0.0,
            memory_bytes: 0,
            cpu_limit_cores: None,
            cpu_weight: 0,
            gpu_indices: Vec::new(),
            gpu_utilization: 0.0,
            gpu_memory_bytes: 0,
            epoch: None,
            max_epochs: None,
            epoch_seconds: None,
            time_to_quality_s: None,
            saved: false,
            attempt: 0,
            save_error: String::new(),
            gpu_energy_joules: None,
            decision: String::new(),
            converged: false,
        }
    }
}

/// A node's request to move a job elsewhere (SpeCon).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    pub job_id: String,
    pub reason: String,
}

/// Use of one GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuUsage {
    pub index: u32,
    /// 0..=1.
    pub utilization: f64,
    pub memory_used_bytes: u64,
}

/// The state of a node, sent about once a second and on every change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Increases with every report; the agent sets it, the daemon may leave it 0.
    pub sequence: u64,
    pub cpu_used_cores: f64,
    pub memory_used_bytes: u64,
    pub jobs: Vec<JobReport>,
    pub move_requests: Vec<MoveRequest>,
    pub gpus: Vec<GpuUsage>,
}

/// Start a job's process on the node.
///
/// Idempotent: a node that already runs (`job_id`, `replica`) must ignore it, because the
/// coordinator resends the starts it has not seen in a report after the node reconnects. The node
/// reports the job as [`RunState::Starting`]/[`RunState::Running`] once it has it, or as
/// [`RunState::Failed`] with a message when it cannot start it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StartJob {
    pub job_id: String,
    pub replica: u32,
    /// Number of members (1 for a single-node job).
    pub replicas: u32,
    pub name: String,
    /// Program and arguments; never empty.
    pub argv: Vec<String>,
    /// Absolute path of the log the job writes and the node follows.
    pub log_path: String,
    /// Progress signal in the log ("loss"...), empty for the node's default.
    pub metric: String,
    /// True when larger is better (accuracy).
    pub maximise: bool,
    /// GPUs reserved on this node (set CUDA_VISIBLE_DEVICES to them).
    pub gpu_indices: Vec<u32>,
    pub priority: i32,
    /// Environment to add; includes GOVERNOR_JOB_ID, GOVERNOR_RANK, GOVERNOR_WORLD_SIZE.
    pub env: BTreeMap<String, String>,
    pub cores: Option<f64>,
    pub memory_bytes: Option<u64>,
    /// How the job saves itself for a move; `None`: it cannot be moved.
    pub checkpoint: Option<Checkpoint>,
    /// Which start of the job this is: 0 at first, one more for each start after a move. A
    /// node that ran an earlier attempt to its end starts a newer one again.
    pub attempt: u32,
    /// Its checkpoint arrives in [`CheckpointChunk`]s before this start: unpack it into
    /// `checkpoint.dir`, and start only if it arrived whole.
    pub carried_checkpoint: bool,
    /// The user it runs as (the submission's); empty: root.
    pub user: String,
}

/// Upload a saved job's checkpoint directory to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadCheckpoint {
    pub job_id: String,
    /// The attempt that saved it.
    pub attempt: u32,
    /// The directory (absolute).
    pub dir: String,
}

/// A piece of a checkpoint archive ([`crate::archive`]), in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointChunk {
    pub job_id: String,
    pub attempt: u32,
    pub offset: u64,
    pub data: Vec<u8>,
    /// The last piece: `sha256` and `total_bytes` describe the whole archive.
    pub last: bool,
    pub sha256: String,
    pub total_bytes: u64,
    /// The sender could not make the archive: why (on the last piece, with no data).
    pub error: String,
}

/// How a job saves itself so that it can be moved: a framework checkpoint (Keras
/// `BackupAndRestore`, Lightning `ckpt_path="last"`, Hugging Face `resume_from_checkpoint`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The directory it saves to and resumes from (absolute). Today it must be on storage every
    /// node mounts at the same path: the coordinator does not carry it.
    pub dir: String,
    /// The signal that asks it to save at its next epoch boundary and exit with status 0.
    pub save_signal: i32,
    /// The nodes do not share `dir`: the coordinator carries it from the node that saved it to
    /// the node that resumes it.
    #[serde(default)]
    pub carry: bool,
    /// Not declared by the job: it moves by CRIU. Its node dumps its process tree into a
    /// directory of the node's own (`dir` is empty, `save_signal` 0) and the coordinator
    /// carries it; a start with a later attempt restores the dump.
    #[serde(default)]
    pub transparent: bool,
}

/// SIGUSR1: the save signal unless a job names another.
pub const DEFAULT_SAVE_SIGNAL: i32 = 10;

impl Checkpoint {
    /// The transparent (CRIU) move of a job that declared no checkpoint.
    pub fn transparent() -> Checkpoint {
        Checkpoint {
            dir: String::new(),
            save_signal: 0,
            carry: true,
            transparent: true,
        }
    }

    /// Check a checkpoint declaration (absolute directory, a real signal number; or a
    /// transparent one as [`Checkpoint::transparent`] makes it).
    pub fn check(&self) -> Result<(), InvalidMessage> {
        if self.transparent {
            if !self.dir.is_empty() || self.save_signal != 0 || !self.carry {
                return Err(InvalidMessage::new(
                    "checkpoint.transparent",
                    "a transparent (CRIU) checkpoint has no directory and no save signal, and is carried",
                ));
            }
            return Ok(());
        }
        if !self.dir.starts_with('/') || self.dir.contains('\0') {
            return Err(InvalidMessage::new(
                "checkpoint.dir",
                format!("must be an absolute path, got {:?}", self.dir),
            ));
        }
        if !(1..=64).contains(&self.save_signal) {
            return Err(InvalidMessage::new(
                "checkpoint.save_signal",
                format!("is a signal number in 1..=64, got {}", self.save_signal),
            ));
        }
        Ok(())
    }
}

/// Ask a job to save and exit (its [`Checkpoint::save_signal`]), to be started elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveJob {
    pub job_id: String,
    pub reason: String,
}

/// Stop a job's process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopJob {
    pub job_id: String,
    pub reason: String,
}

/// A command from the coordinator to a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeCommand {
    Start(StartJob),
    Stop(StopJob),
    Save(SaveJob),
    Upload(UploadCheckpoint),
    Chunk(CheckpointChunk),
}

impl NodeCommand {
    /// The job the command is about.
    pub fn job_id(&self) -> &str {
        match self {
            NodeCommand::Start(s) => &s.job_id,
            NodeCommand::Stop(s) => &s.job_id,
            NodeCommand::Save(s) => &s.job_id,
            NodeCommand::Upload(u) => &u.job_id,
            NodeCommand::Chunk(c) => &c.job_id,
        }
    }
}

/// Most bytes of a job's output one [`ReadOutput`] returns.
pub const MAX_OUTPUT_CHUNK: u32 = 256 * 1024;

/// Read a piece of the output file of a job the coordinator started on the node (`govctl
/// logs`). Not a [`NodeCommand`]: it changes nothing and is not part of the cluster's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadOutput {
    /// Echoed in the answer.
    pub request_id: u64,
    pub job_id: String,
    pub replica: u32,
    pub replicas: u32,
    /// The job's name as at its start (the file is named after its cgroup's group).
    pub name: String,
    /// Where to start; with `from_end`, how many bytes before the end.
    pub offset: u64,
    pub from_end: bool,
    /// At most this many bytes (1..=[`MAX_OUTPUT_CHUNK`]).
    pub max_bytes: u32,
}

/// A piece of a job's output, [`ReadOutput`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub request_id: u64,
    /// Where `data` starts in the file.
    pub offset: u64,
    pub data: Vec<u8>,
    /// The file's length when it was read.
    pub size: u64,
    /// The node could not read it: why (no data then).
    pub error: String,
}

impl OutputChunk {
    /// The answer to request `request_id` when the node cannot read the output: why.
    pub fn failed(request_id: u64, why: impl Into<String>) -> Self {
        OutputChunk {
            request_id,
            offset: 0,
            data: Vec::new(),
            size: 0,
            error: why.into(),
        }
    }
}

/// What a node sends on its stream.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeMessage {
    Hello(Hello),
    Report(NodeReport),
    Chunk(CheckpointChunk),
    Output(OutputChunk),
}

/// What the coordinator sends on a node's stream.
#[derive(Clone, Debug, PartialEq)]
pub enum CoordinatorMessage {
    Welcome(Welcome),
    Command(NodeCommand),
    ReadOutput(ReadOutput),
}

#[cfg(all(test, feature = "grpc"))]
#[path = "node_tests.rs"]
mod tests;
