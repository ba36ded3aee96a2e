//! The conversions between the node <-> coordinator domain types of [`super`] and the generated
//! messages: `TryFrom<pb::...>` checks what arrives from the network, `From<...> for pb::...`
//! builds what is sent.

use std::collections::BTreeMap;

use super::{
    Category, Checkpoint, CheckpointChunk, CoordinatorMessage, GpuDevice, GpuUsage, Hello,
    JobOrigin, JobReport, MAX_MESSAGE_LEN, MAX_NAME_LEN, MAX_OUTPUT_CHUNK, MoveRequest,
    NodeCapacity, NodeCommand, NodeMessage, NodeReport, OutputChunk, ReadOutput, RunState, SaveJob,
    StartJob, StopJob, UploadCheckpoint, Welcome,
};
use crate::InvalidMessage;
use crate::error::{
    check_node_name, distinct_gpus, finite, non_negative, opt, positive, short, text,
};
use crate::pb;

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
        let move_requests = m
            .move_requests
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                Ok(MoveRequest {
                    job_id: text("job_id", r.job_id, MAX_NAME_LEN)?,
                    reason: short("reason", r.reason, MAX_MESSAGE_LEN)?,
                })
                .map_err(|e: InvalidMessage| e.within(format!("move_requests[{i}]")))
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
            move_requests,
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
            user: crate::error::check_user_name("user", m.user)?,
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
                fence_after_ms: w.fence_after_ms,
                acknowledged_sequence: w.acknowledged_sequence,
                fence_jobs: w.fence_jobs,
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
            move_requests: r
                .move_requests
                .into_iter()
                .map(|m| pb::MoveRequest {
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
            user: s.user,
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
                    fence_after_ms: w.fence_after_ms,
                    acknowledged_sequence: w.acknowledged_sequence,
                    fence_jobs: w.fence_jobs,
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

impl TryFrom<pb::CheckpointChunk> for CheckpointChunk {
    type Error = InvalidMessage;
    fn try_from(m: pb::CheckpointChunk) -> Result<Self, InvalidMessage> {
        if m.data.len() > 2 * super::CHUNK_BYTES {
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
