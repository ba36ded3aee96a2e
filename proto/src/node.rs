//! Domain types of the node <-> coordinator half of the protocol, and their conversions.
//!
//! The node daemon fills a [`NodeReport`] and receives [`NodeCommand`]s; the coordinator receives
//! [`NodeMessage`]s and sends [`CoordinatorMessage`]s. `TryFrom<pb::...>` validates what arrives
//! from the network; `From<...> for pb::...` builds what is sent.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InvalidMessage;
use crate::error::{
    check_node_name, distinct_gpus, finite, non_negative, opt, positive, short, text,
};
use crate::pb;

/// Longest job, node or model name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Longest free-text message (reasons, errors) accepted, in bytes.
pub const MAX_MESSAGE_LEN: usize = 4096;

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
    pub node_name: String,
    pub capacity: NodeCapacity,
    pub agent_version: String,
    /// It can dump and restore a job's process tree with CRIU (jobs that declared no
    /// checkpoint can move to and from it).
    #[serde(default)]
    pub can_dump: bool,
}

pub use crate::error::check_node_name as validate_node_name;

/// The coordinator's answer to a [`Hello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub session_id: u64,
    pub report_interval_ms: u32,
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
pub struct MigrationRequest {
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
    pub migrations: Vec<MigrationRequest>,
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

impl TryFrom<pb::CheckpointChunk> for CheckpointChunk {
    type Error = InvalidMessage;
    fn try_from(m: pb::CheckpointChunk) -> Result<Self, InvalidMessage> {
        if m.data.len() > 2 * crate::archive::CHUNK_BYTES {
            return Err(InvalidMessage::new(
                "data",
                format!("{} bytes in one piece", m.data.len()),
            ));
        }
        Ok(CheckpointChunk {
            job_id: text("job_id", m.job_id, MAX_NAME_LEN)?,
            attempt: m.attempt,
            offset: m.offset,
            data: m.data,
            last: m.last,
            sha256: short("sha256", m.sha256, 64)?,
            total_bytes: m.total_bytes,
            error: short("error", m.error, MAX_MESSAGE_LEN)?,
        })
    }
}

impl From<CheckpointChunk> for pb::CheckpointChunk {
    fn from(c: CheckpointChunk) -> Self {
        pb::CheckpointChunk {
            job_id: c.job_id,
            attempt: c.attempt,
            offset: c.offset,
            data: c.data,
            last: c.last,
            sha256: c.sha256,
            total_bytes: c.total_bytes,
            error: c.error,
        }
    }
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

impl TryFrom<pb::Checkpoint> for Checkpoint {
    type Error = InvalidMessage;
    fn try_from(m: pb::Checkpoint) -> Result<Self, InvalidMessage> {
        let c = Checkpoint {
            dir: short("checkpoint.dir", m.dir, MAX_MESSAGE_LEN)?,
            save_signal: m.save_signal,
            carry: m.carry,
            transparent: m.transparent,
        };
        c.check()?;
        Ok(c)
    }
}

impl From<Checkpoint> for pb::Checkpoint {
    fn from(c: Checkpoint) -> Self {
        pb::Checkpoint {
            dir: c.dir,
            save_signal: c.save_signal,
            carry: c.carry,
            transparent: c.transparent,
        }
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

impl TryFrom<pb::ReadOutput> for ReadOutput {
    type Error = InvalidMessage;
    fn try_from(m: pb::ReadOutput) -> Result<Self, InvalidMessage> {
        if !(1..=MAX_OUTPUT_CHUNK).contains(&m.max_bytes) {
            return Err(InvalidMessage::new(
                "max_bytes",
                format!("must be in 1..={MAX_OUTPUT_CHUNK}, got {}", m.max_bytes),
            ));
        }
        Ok(ReadOutput {
            request_id: m.request_id,
            job_id: text("job_id", m.job_id, MAX_NAME_LEN)?,
            replica: m.replica,
            replicas: m.replicas,
            name: short("name", m.name, MAX_NAME_LEN)?,
            offset: m.offset,
            from_end: m.from_end,
            max_bytes: m.max_bytes,
        })
    }
}

impl From<ReadOutput> for pb::ReadOutput {
    fn from(r: ReadOutput) -> Self {
        pb::ReadOutput {
            request_id: r.request_id,
            job_id: r.job_id,
            replica: r.replica,
            replicas: r.replicas,
            name: r.name,
            offset: r.offset,
            from_end: r.from_end,
            max_bytes: r.max_bytes,
        }
    }
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

impl TryFrom<pb::OutputChunk> for OutputChunk {
    type Error = InvalidMessage;
    fn try_from(m: pb::OutputChunk) -> Result<Self, InvalidMessage> {
        if m.data.len() > MAX_OUTPUT_CHUNK as usize {
            return Err(InvalidMessage::new(
                "data",
                format!(
                    "{} bytes in one piece, at most {MAX_OUTPUT_CHUNK}",
                    m.data.len()
                ),
            ));
        }
        Ok(OutputChunk {
            request_id: m.request_id,
            offset: m.offset,
            data: m.data,
            size: m.size,
            error: short("error", m.error, MAX_MESSAGE_LEN)?,
        })
    }
}

impl From<OutputChunk> for pb::OutputChunk {
    fn from(c: OutputChunk) -> Self {
        pb::OutputChunk {
            request_id: c.request_id,
            offset: c.offset,
            data: c.data,
            size: c.size,
            error: c.error,
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

// ---- wire -> domain ------------------------------------------------------------------------

fn enum_value<E: TryFrom<i32>>(field: &str, v: i32) -> Result<E, InvalidMessage> {
    E::try_from(v).map_err(|_| InvalidMessage::new(field, format!("unknown value {v}")))
}

/// The wire's category number as the domain's [`Category`] (a function, not `TryFrom`: both
/// `i32` and `Category` are foreign to this crate).
pub(crate) fn category_from_wire(v: i32) -> Result<Category, InvalidMessage> {
    {
        match enum_value::<pb::Category>("category", v)? {
            pb::Category::Unspecified => Err(InvalidMessage::new(
                "category",
                "is CATEGORY_UNSPECIFIED; send CATEGORY_UNKNOWN when the stage is not known",
            )),
            pb::Category::Unknown => Ok(Category::Unknown),
            pb::Category::Progressing => Ok(Category::Progressing),
            pb::Category::Watching => Ok(Category::Watching),
            pb::Category::Converged => Ok(Category::Converged),
        }
    }
}

impl TryFrom<i32> for JobOrigin {
    type Error = InvalidMessage;
    fn try_from(v: i32) -> Result<Self, InvalidMessage> {
        match enum_value::<pb::JobOrigin>("origin", v)? {
            pb::JobOrigin::Unspecified => {
                Err(InvalidMessage::new("origin", "is JOB_ORIGIN_UNSPECIFIED"))
            }
            pb::JobOrigin::Coordinator => Ok(JobOrigin::Coordinator),
            pb::JobOrigin::Local => Ok(JobOrigin::Local),
        }
    }
}

impl TryFrom<i32> for RunState {
    type Error = InvalidMessage;
    fn try_from(v: i32) -> Result<Self, InvalidMessage> {
        match enum_value::<pb::RunState>("state", v)? {
            pb::RunState::Unspecified => {
                Err(InvalidMessage::new("state", "is RUN_STATE_UNSPECIFIED"))
            }
            pb::RunState::Starting => Ok(RunState::Starting),
            pb::RunState::Running => Ok(RunState::Running),
            pb::RunState::Exited => Ok(RunState::Exited),
            pb::RunState::Failed => Ok(RunState::Failed),
        }
    }
}

impl TryFrom<pb::GpuDevice> for GpuDevice {
    type Error = InvalidMessage;
    fn try_from(m: pb::GpuDevice) -> Result<Self, InvalidMessage> {
        Ok(GpuDevice {
            index: m.index,
            model: short("model", m.model, MAX_NAME_LEN)?,
            memory_bytes: m.memory_bytes,
        })
    }
}

impl TryFrom<pb::NodeCapacity> for NodeCapacity {
    type Error = InvalidMessage;
    fn try_from(m: pb::NodeCapacity) -> Result<Self, InvalidMessage> {
        let gpus = m
            .gpus
            .into_iter()
            .enumerate()
            .map(|(i, g)| GpuDevice::try_from(g).map_err(|e| e.within(format!("gpus[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?;
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        distinct_gpus("gpus", &indices)?;
        Ok(NodeCapacity {
            cores: positive("cores", m.cores)?,
            memory_bytes: m.memory_bytes,
            gpus,
        })
    }
}

impl TryFrom<pb::Hello> for Hello {
    type Error = InvalidMessage;
    fn try_from(m: pb::Hello) -> Result<Self, InvalidMessage> {
        check_node_name(&m.node_name).map_err(|p| InvalidMessage::new("node_name", p))?;
        let capacity = m
            .capacity
            .ok_or_else(|| InvalidMessage::missing("capacity"))?
            .try_into()
            .map_err(|e: InvalidMessage| e.within("capacity"))?;
        Ok(Hello {
            node_name: m.node_name,
            capacity,
            agent_version: short("agent_version", m.agent_version, MAX_NAME_LEN)?,
            can_dump: m.can_dump,
        })
    }
}

impl TryFrom<pb::JobReport> for JobReport {
    type Error = InvalidMessage;
    fn try_from(m: pb::JobReport) -> Result<Self, InvalidMessage> {
        distinct_gpus("gpu_indices", &m.gpu_indices)?;
        let gpu_utilization = non_negative("gpu_utilization", m.gpu_utilization)?;
        if gpu_utilization > 1.0 {
            return Err(InvalidMessage::new(
                "gpu_utilization",
                format!("is a fraction in 0..=1, got {gpu_utilization}"),
            ));
        }
        Ok(JobReport {
            job_id: text("job_id", m.job_id, MAX_NAME_LEN)?,
            replica: m.replica,
            name: short("name", m.name, MAX_NAME_LEN)?,
            origin: m.origin.try_into()?,
            state: m.state.try_into()?,
            exit_code: m.exit_code,
            message: short("message", m.message, MAX_MESSAGE_LEN)?,
            category: category_from_wire(m.category)?,
            progress: opt(m.progress, |v| finite("progress", v))?,
            growth: opt(m.growth, |v| non_negative("growth", v))?,
            growth_efficiency: opt(m.growth_efficiency, |v| {
                non_negative("growth_efficiency", v)
            })?,
            cpu_cores: non_negative("cpu_cores", m.cpu_cores)?,
            memory_bytes: m.memory_bytes,
            cpu_limit_cores: opt(m.cpu_limit_cores, |v| positive("cpu_limit_cores", v))?,
            cpu_weight: m.cpu_weight,
            gpu_indices: m.gpu_indices,
            gpu_utilization,
            gpu_memory_bytes: m.gpu_memory_bytes,
            epoch: m.epoch,
            max_epochs: m.max_epochs,
            epoch_seconds: opt(m.epoch_seconds, |v| non_negative("epoch_seconds", v))?,
            time_to_quality_s: opt(m.time_to_quality_s, |v| {
                non_negative("time_to_quality_s", v)
            })?,
            saved: m.saved,
            attempt: m.attempt,
            save_error: short("save_error", m.save_error, MAX_MESSAGE_LEN)?,
            gpu_energy_joules: opt(m.gpu_energy_joules, |v| {
                non_negative("gpu_energy_joules", v)
            })?,
            decision: short("decision", m.decision, MAX_MESSAGE_LEN)?,
            converged: m.converged,
        })
    }
}

impl TryFrom<pb::NodeReport> for NodeReport {
    type Error = InvalidMessage;
    fn try_from(m: pb::NodeReport) -> Result<Self, InvalidMessage> {
        let jobs = m
            .jobs
            .into_iter()
            .enumerate()
            .map(|(i, j)| JobReport::try_from(j).map_err(|e| e.within(format!("jobs[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut keys: Vec<(&str, u32)> = jobs
            .iter()
            .map(|j| (j.job_id.as_str(), j.replica))
            .collect();
        keys.sort_unstable();
        if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
            return Err(InvalidMessage::new(
                "jobs",
                format!("reports job {} replica {} twice", w[0].0, w[0].1),
            ));
        }
        let migrations = m
            .migrations
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                Ok(MigrationRequest {
                    job_id: text("job_id", r.job_id, MAX_NAME_LEN)?,
                    reason: short("reason", r.reason, MAX_MESSAGE_LEN)?,
                })
                .map_err(|e: InvalidMessage| e.within(format!("migrations[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let gpus = m
            .gpus
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                let u = non_negative("utilization", g.utilization)
                    .and_then(|u| {
                        if u <= 1.0 {
                            Ok(u)
                        } else {
                            Err(InvalidMessage::new(
                                "utilization",
                                format!("is a fraction in 0..=1, got {u}"),
                            ))
                        }
                    })
                    .map_err(|e| e.within(format!("gpus[{i}]")))?;
                Ok(GpuUsage {
                    index: g.index,
                    utilization: u,
                    memory_used_bytes: g.memory_used_bytes,
                })
            })
            .collect::<Result<Vec<_>, InvalidMessage>>()?;
        Ok(NodeReport {
            sequence: m.sequence,
            cpu_used_cores: non_negative("cpu_used_cores", m.cpu_used_cores)?,
            memory_used_bytes: m.memory_used_bytes,
            jobs,
            migrations,
            gpus,
        })
    }
}

impl TryFrom<pb::NodeMessage> for NodeMessage {
    type Error = InvalidMessage;
    fn try_from(m: pb::NodeMessage) -> Result<Self, InvalidMessage> {
        match m.body {
            None => Err(InvalidMessage::missing("body")),
            Some(pb::node_message::Body::Hello(h)) => Hello::try_from(h)
                .map(NodeMessage::Hello)
                .map_err(|e| e.within("hello")),
            Some(pb::node_message::Body::Report(r)) => NodeReport::try_from(r)
                .map(NodeMessage::Report)
                .map_err(|e| e.within("report")),
            Some(pb::node_message::Body::CheckpointChunk(c)) => CheckpointChunk::try_from(c)
                .map(NodeMessage::Chunk)
                .map_err(|e| e.within("checkpoint_chunk")),
            Some(pb::node_message::Body::OutputChunk(c)) => OutputChunk::try_from(c)
                .map(NodeMessage::Output)
                .map_err(|e| e.within("output_chunk")),
        }
    }
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), InvalidMessage> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(InvalidMessage::new(
                format!("env[{k:?}]"),
                "names must be non-empty without '=' or NUL, values without NUL",
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_argv(argv: &[String]) -> Result<(), InvalidMessage> {
    match argv.first() {
        None => Err(InvalidMessage::new("argv", "must name a program to run")),
        Some(p) if p.trim().is_empty() => Err(InvalidMessage::new("argv[0]", "must not be empty")),
        Some(_) => match argv.iter().position(|a| a.contains('\0')) {
            Some(i) => Err(InvalidMessage::new(format!("argv[{i}]"), "contains NUL")),
            None => Ok(()),
        },
    }
}

pub(crate) fn check_log_path(p: &str) -> Result<(), InvalidMessage> {
    if !p.starts_with('/') {
        return Err(InvalidMessage::new(
            "log_path",
            format!("must be an absolute path, got {p:?}"),
        ));
    }
    Ok(())
}

impl TryFrom<pb::StartJob> for StartJob {
    type Error = InvalidMessage;
    fn try_from(m: pb::StartJob) -> Result<Self, InvalidMessage> {
        check_argv(&m.argv)?;
        check_log_path(&m.log_path)?;
        distinct_gpus("gpu_indices", &m.gpu_indices)?;
        let env: BTreeMap<String, String> = m.env.into_iter().collect();
        check_env(&env)?;
        if m.replicas == 0 || m.replica >= m.replicas {
            return Err(InvalidMessage::new(
                "replica",
                format!("is {} of {} members", m.replica, m.replicas),
            ));
        }
        Ok(StartJob {
            job_id: text("job_id", m.job_id, MAX_NAME_LEN)?,
            replica: m.replica,
            replicas: m.replicas,
            name: text("name", m.name, MAX_NAME_LEN)?,
            argv: m.argv,
            log_path: m.log_path,
            metric: short("metric", m.metric, MAX_NAME_LEN)?,
            maximise: m.maximise,
            gpu_indices: m.gpu_indices,
            priority: m.priority,
            env,
            cores: opt(m.cores, |v| positive("cores", v))?,
            memory_bytes: m.memory_bytes,
            checkpoint: m.checkpoint.map(Checkpoint::try_from).transpose()?,
            attempt: m.attempt,
            carried_checkpoint: m.carried_checkpoint,
        })
    }
}

impl TryFrom<pb::CoordinatorMessage> for CoordinatorMessage {
    type Error = InvalidMessage;
    fn try_from(m: pb::CoordinatorMessage) -> Result<Self, InvalidMessage> {
        use pb::coordinator_message::Body;
        match m.body {
            None => Err(InvalidMessage::missing("body")),
            Some(Body::Welcome(w)) => Ok(CoordinatorMessage::Welcome(Welcome {
                session_id: w.session_id,
                report_interval_ms: w.report_interval_ms,
            })),
            Some(Body::StartJob(s)) => StartJob::try_from(s)
                .map(|s| CoordinatorMessage::Command(NodeCommand::Start(s)))
                .map_err(|e| e.within("start_job")),
            Some(Body::StopJob(s)) => Ok(CoordinatorMessage::Command(NodeCommand::Stop(StopJob {
                job_id: text("stop_job.job_id", s.job_id, MAX_NAME_LEN)?,
                reason: short("stop_job.reason", s.reason, MAX_MESSAGE_LEN)?,
            }))),
            Some(Body::SaveJob(s)) => Ok(CoordinatorMessage::Command(NodeCommand::Save(SaveJob {
                job_id: text("save_job.job_id", s.job_id, MAX_NAME_LEN)?,
                reason: short("save_job.reason", s.reason, MAX_MESSAGE_LEN)?,
            }))),
            Some(Body::UploadCheckpoint(u)) => Ok(CoordinatorMessage::Command(
                NodeCommand::Upload(UploadCheckpoint {
                    job_id: text("upload_checkpoint.job_id", u.job_id, MAX_NAME_LEN)?,
                    attempt: u.attempt,
                    dir: short("upload_checkpoint.dir", u.dir, MAX_MESSAGE_LEN)?,
                }),
            )),
            Some(Body::CheckpointChunk(c)) => CheckpointChunk::try_from(c)
                .map(|c| CoordinatorMessage::Command(NodeCommand::Chunk(c)))
                .map_err(|e| e.within("checkpoint_chunk")),
            Some(Body::ReadOutput(r)) => ReadOutput::try_from(r)
                .map(CoordinatorMessage::ReadOutput)
                .map_err(|e| e.within("read_output")),
        }
    }
}

// ---- domain -> wire ------------------------------------------------------------------------

impl From<Category> for pb::Category {
    fn from(c: Category) -> Self {
        match c {
            Category::Unknown => pb::Category::Unknown,
            Category::Progressing => pb::Category::Progressing,
            Category::Watching => pb::Category::Watching,
            Category::Converged => pb::Category::Converged,
        }
    }
}

impl From<RunState> for pb::RunState {
    fn from(s: RunState) -> Self {
        match s {
            RunState::Starting => pb::RunState::Starting,
            RunState::Running => pb::RunState::Running,
            RunState::Exited => pb::RunState::Exited,
            RunState::Failed => pb::RunState::Failed,
        }
    }
}

impl From<JobOrigin> for pb::JobOrigin {
    fn from(o: JobOrigin) -> Self {
        match o {
            JobOrigin::Coordinator => pb::JobOrigin::Coordinator,
            JobOrigin::Local => pb::JobOrigin::Local,
        }
    }
}

impl From<GpuDevice> for pb::GpuDevice {
    fn from(g: GpuDevice) -> Self {
        pb::GpuDevice {
            index: g.index,
            model: g.model,
            memory_bytes: g.memory_bytes,
        }
    }
}

impl From<NodeCapacity> for pb::NodeCapacity {
    fn from(c: NodeCapacity) -> Self {
        pb::NodeCapacity {
            cores: c.cores,
            memory_bytes: c.memory_bytes,
            gpus: c.gpus.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<Hello> for pb::Hello {
    fn from(h: Hello) -> Self {
        pb::Hello {
            node_name: h.node_name,
            capacity: Some(h.capacity.into()),
            agent_version: h.agent_version,
            can_dump: h.can_dump,
        }
    }
}

impl From<JobReport> for pb::JobReport {
    fn from(j: JobReport) -> Self {
        pb::JobReport {
            job_id: j.job_id,
            replica: j.replica,
            name: j.name,
            origin: pb::JobOrigin::from(j.origin) as i32,
            state: pb::RunState::from(j.state) as i32,
            exit_code: j.exit_code,
            message: j.message,
            category: pb::Category::from(j.category) as i32,
            progress: j.progress,
            growth: j.growth,
            growth_efficiency: j.growth_efficiency,
            cpu_cores: j.cpu_cores,
            memory_bytes: j.memory_bytes,
            cpu_limit_cores: j.cpu_limit_cores,
            cpu_weight: j.cpu_weight,
            gpu_indices: j.gpu_indices,
            gpu_utilization: j.gpu_utilization,
            gpu_memory_bytes: j.gpu_memory_bytes,
            epoch: j.epoch,
            max_epochs: j.max_epochs,
            epoch_seconds: j.epoch_seconds,
            time_to_quality_s: j.time_to_quality_s,
            saved: j.saved,
            attempt: j.attempt,
            save_error: j.save_error,
            gpu_energy_joules: j.gpu_energy_joules,
            decision: j.decision,
            converged: j.converged,
        }
    }
}

impl From<NodeReport> for pb::NodeReport {
    fn from(r: NodeReport) -> Self {
        pb::NodeReport {
            sequence: r.sequence,
            cpu_used_cores: r.cpu_used_cores,
            memory_used_bytes: r.memory_used_bytes,
            jobs: r.jobs.into_iter().map(Into::into).collect(),
            migrations: r
                .migrations
                .into_iter()
                .map(|m| pb::MigrationRequest {
                    job_id: m.job_id,
                    reason: m.reason,
                })
                .collect(),
            gpus: r
                .gpus
                .into_iter()
                .map(|g| pb::GpuUsage {
                    index: g.index,
                    utilization: g.utilization,
                    memory_used_bytes: g.memory_used_bytes,
                })
                .collect(),
        }
    }
}

impl From<NodeMessage> for pb::NodeMessage {
    fn from(m: NodeMessage) -> Self {
        pb::NodeMessage {
            body: Some(match m {
                NodeMessage::Hello(h) => pb::node_message::Body::Hello(h.into()),
                NodeMessage::Report(r) => pb::node_message::Body::Report(r.into()),
                NodeMessage::Chunk(c) => pb::node_message::Body::CheckpointChunk(c.into()),
                NodeMessage::Output(c) => pb::node_message::Body::OutputChunk(c.into()),
            }),
        }
    }
}

impl From<StartJob> for pb::StartJob {
    fn from(s: StartJob) -> Self {
        pb::StartJob {
            job_id: s.job_id,
            replica: s.replica,
            replicas: s.replicas,
            name: s.name,
            argv: s.argv,
            log_path: s.log_path,
            metric: s.metric,
            maximise: s.maximise,
            gpu_indices: s.gpu_indices,
            priority: s.priority,
            env: s.env.into_iter().collect(),
            cores: s.cores,
            memory_bytes: s.memory_bytes,
            checkpoint: s.checkpoint.map(Into::into),
            attempt: s.attempt,
            carried_checkpoint: s.carried_checkpoint,
        }
    }
}

impl From<CoordinatorMessage> for pb::CoordinatorMessage {
    fn from(m: CoordinatorMessage) -> Self {
        use pb::coordinator_message::Body;
        pb::CoordinatorMessage {
            body: Some(match m {
                CoordinatorMessage::Welcome(w) => Body::Welcome(pb::Welcome {
                    session_id: w.session_id,
                    report_interval_ms: w.report_interval_ms,
                }),
                CoordinatorMessage::Command(NodeCommand::Start(s)) => Body::StartJob(s.into()),
                CoordinatorMessage::Command(NodeCommand::Stop(s)) => Body::StopJob(pb::StopJob {
                    job_id: s.job_id,
                    reason: s.reason,
                }),
                CoordinatorMessage::Command(NodeCommand::Save(s)) => Body::SaveJob(pb::SaveJob {
                    job_id: s.job_id,
                    reason: s.reason,
                }),
                CoordinatorMessage::Command(NodeCommand::Upload(u)) => {
                    Body::UploadCheckpoint(pb::UploadCheckpoint {
                        job_id: u.job_id,
                        attempt: u.attempt,
                        dir: u.dir,
                    })
                }
                CoordinatorMessage::Command(NodeCommand::Chunk(c)) => {
                    Body::CheckpointChunk(c.into())
                }
                CoordinatorMessage::ReadOutput(r) => Body::ReadOutput(r.into()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> NodeReport {
        let mut job = JobReport::running("j1", "resnet");
        job.category = Category::Progressing;
        job.progress = Some(-0.5);
        job.growth = Some(0.01);
        job.cpu_cores = 1.5;
        job.gpu_indices = vec![0, 1];
        job.gpu_utilization = 0.9;
        NodeReport {
            sequence: 7,
            cpu_used_cores: 1.5,
            memory_used_bytes: 1 << 30,
            jobs: vec![job],
            migrations: vec![MigrationRequest {
                job_id: "j1".into(),
                reason: "converged".into(),
            }],
            gpus: vec![GpuUsage {
                index: 0,
                utilization: 0.5,
                memory_used_bytes: 10,
            }],
        }
    }

    #[test]
    fn report_round_trips_through_the_wire_type() {
        let r = report();
        let wire: pb::NodeMessage = NodeMessage::Report(r.clone()).into();
        assert_eq!(NodeMessage::try_from(wire).unwrap(), NodeMessage::Report(r));
    }

    #[test]
    fn output_requests_and_pieces_round_trip_and_are_bounded() {
        let read = ReadOutput {
            request_id: 9,
            job_id: "j1".into(),
            replica: 0,
            replicas: 1,
            name: "resnet".into(),
            offset: 4096,
            from_end: true,
            max_bytes: MAX_OUTPUT_CHUNK,
        };
        let wire: pb::CoordinatorMessage = CoordinatorMessage::ReadOutput(read.clone()).into();
        assert_eq!(
            CoordinatorMessage::try_from(wire).unwrap(),
            CoordinatorMessage::ReadOutput(read.clone())
        );
        let mut too_much = pb::ReadOutput::from(read);
        too_much.max_bytes = MAX_OUTPUT_CHUNK + 1;
        assert_eq!(
            ReadOutput::try_from(too_much).unwrap_err().field,
            "max_bytes"
        );

        let piece = OutputChunk {
            request_id: 9,
            offset: 10,
            data: b"epoch 1/3\n".to_vec(),
            size: 21,
            error: String::new(),
        };
        let wire: pb::NodeMessage = NodeMessage::Output(piece.clone()).into();
        assert_eq!(
            NodeMessage::try_from(wire).unwrap(),
            NodeMessage::Output(piece)
        );
        let big = pb::NodeMessage {
            body: Some(pb::node_message::Body::OutputChunk(pb::OutputChunk {
                data: vec![0; MAX_OUTPUT_CHUNK as usize + 1],
                ..Default::default()
            })),
        };
        assert_eq!(
            NodeMessage::try_from(big).unwrap_err().field,
            "output_chunk.data"
        );
    }

    #[test]
    fn nan_cpu_names_the_field() {
        let mut wire: pb::NodeMessage = NodeMessage::Report(report()).into();
        let Some(pb::node_message::Body::Report(r)) = wire.body.as_mut() else {
            unreachable!()
        };
        r.jobs[0].cpu_cores = f64::NAN;
        let e = NodeMessage::try_from(wire).unwrap_err();
        assert_eq!(e.field, "report.jobs[0].cpu_cores");
        assert!(e.problem.contains("NaN"), "{e}");
    }

    #[test]
    fn unspecified_category_is_rejected_with_advice() {
        let mut wire = pb::JobReport::from(JobReport::running("j1", "x"));
        wire.category = 0;
        let e = JobReport::try_from(wire).unwrap_err();
        assert_eq!(e.field, "category");
        assert!(e.problem.contains("CATEGORY_UNKNOWN"), "{e}");
        let mut wire = pb::JobReport::from(JobReport::running("j1", "x"));
        wire.category = 99;
        assert_eq!(
            JobReport::try_from(wire).unwrap_err().problem,
            "unknown value 99"
        );
    }

    #[test]
    fn duplicate_jobs_in_a_report_are_rejected() {
        let mut r = report();
        r.jobs.push(r.jobs[0].clone());
        let e = NodeReport::try_from(pb::NodeReport::from(r)).unwrap_err();
        assert_eq!(e.field, "jobs");
    }

    #[test]
    fn a_transparent_checkpoint_names_no_directory_and_no_signal_and_round_trips() {
        let t = Checkpoint::transparent();
        t.check().unwrap();
        let back = Checkpoint::try_from(pb::Checkpoint::from(t.clone())).unwrap();
        assert_eq!(back, t);
        let mut bad = t.clone();
        bad.dir = "/x".into();
        assert_eq!(bad.check().unwrap_err().field, "checkpoint.transparent");
        let mut bad = t;
        bad.carry = false;
        assert!(bad.check().is_err());
    }

    #[test]
    fn hello_needs_capacity_and_a_dns_name() {
        let hello = pb::Hello {
            node_name: "node1".into(),
            capacity: None,
            agent_version: "0.1".into(),
            can_dump: false,
        };
        assert_eq!(
            Hello::try_from(hello).unwrap_err().to_string(),
            "invalid capacity: is missing"
        );
        let hello = pb::Hello {
            node_name: "Node_1".into(),
            capacity: Some(NodeCapacity::cpu_only(4.0, 1).into()),
            agent_version: String::new(),
            can_dump: false,
        };
        assert_eq!(Hello::try_from(hello).unwrap_err().field, "node_name");
        let hello = pb::Hello {
            node_name: "n".into(),
            capacity: Some(pb::NodeCapacity {
                cores: 0.0,
                memory_bytes: 1,
                gpus: vec![],
            }),
            agent_version: String::new(),
            can_dump: false,
        };
        assert_eq!(Hello::try_from(hello).unwrap_err().field, "capacity.cores");
    }

    #[test]
    fn duplicate_gpu_indices_are_rejected() {
        let cap = pb::NodeCapacity {
            cores: 4.0,
            memory_bytes: 0,
            gpus: vec![
                pb::GpuDevice {
                    index: 1,
                    model: "A".into(),
                    memory_bytes: 0,
                },
                pb::GpuDevice {
                    index: 1,
                    model: "A".into(),
                    memory_bytes: 0,
                },
            ],
        };
        let e = NodeCapacity::try_from(cap).unwrap_err();
        assert_eq!(e.to_string(), "invalid gpus: lists GPU 1 twice");
    }

    #[test]
    fn start_job_round_trips_and_checks_replicas() {
        let s = StartJob {
            job_id: "j3".into(),
            replica: 1,
            replicas: 2,
            name: "bert".into(),
            argv: vec!["python".into(), "train.py".into()],
            log_path: "/var/log/bert.log".into(),
            metric: "loss".into(),
            maximise: false,
            gpu_indices: vec![2, 3],
            priority: 5,
            env: [("A".to_string(), "b".to_string())].into(),
            cores: Some(4.0),
            memory_bytes: None,
            checkpoint: Some(Checkpoint {
                dir: "/shared/ckpt/bert".into(),
                save_signal: DEFAULT_SAVE_SIGNAL,
                carry: true,
                transparent: false,
            }),
            attempt: 2,
            carried_checkpoint: true,
        };
        let chunk = CoordinatorMessage::Command(NodeCommand::Chunk(CheckpointChunk {
            job_id: "j3".into(),
            attempt: 2,
            offset: 4096,
            data: vec![1, 2, 3],
            last: true,
            sha256: "ab".repeat(32),
            total_bytes: 4099,
            error: String::new(),
        }));
        assert_eq!(
            CoordinatorMessage::try_from(pb::CoordinatorMessage::from(chunk.clone())).unwrap(),
            chunk
        );
        let save = CoordinatorMessage::Command(NodeCommand::Save(SaveJob {
            job_id: "j3".into(),
            reason: "govctl migrate".into(),
        }));
        assert_eq!(
            CoordinatorMessage::try_from(pb::CoordinatorMessage::from(save.clone())).unwrap(),
            save
        );
        let mut bad = pb::StartJob::from(s.clone());
        bad.checkpoint.as_mut().unwrap().save_signal = 0;
        assert_eq!(
            StartJob::try_from(bad).unwrap_err().field,
            "checkpoint.save_signal"
        );
        let wire: pb::CoordinatorMessage =
            CoordinatorMessage::Command(NodeCommand::Start(s.clone())).into();
        assert_eq!(
            CoordinatorMessage::try_from(wire).unwrap(),
            CoordinatorMessage::Command(NodeCommand::Start(s.clone()))
        );
        let mut bad = pb::StartJob::from(s.clone());
        bad.replica = 2;
        assert_eq!(StartJob::try_from(bad).unwrap_err().field, "replica");
        let mut bad = pb::StartJob::from(s);
        bad.log_path = "relative.log".into();
        assert_eq!(StartJob::try_from(bad).unwrap_err().field, "log_path");
    }

    #[test]
    fn empty_messages_are_missing_a_body() {
        assert_eq!(
            NodeMessage::try_from(pb::NodeMessage { body: None })
                .unwrap_err()
                .to_string(),
            "invalid body: is missing"
        );
    }
}
