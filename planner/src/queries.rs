//! What `govctl` reads: node and job listings, a job's detail, the service's counters.

use governor_proto::control::{JobDetail, JobState, JobSummary, NodeState, NodeSummary};

use governor_placement::queue::Seconds;

use super::{ClusterState, ControlError, JobRecord};

/// Where a job's output is ([`ClusterState::output_source`]).
#[derive(Clone, Debug, PartialEq)]
pub enum OutputSource {
    /// In the job's output file on `node`, named after `name` and `replicas` as at its start.
    Node {
        node: String,
        name: String,
        replicas: u32,
        /// The job has ended: its output grows no more.
        finished: bool,
    },
    /// Queued: not on any node (yet, or again).
    NotPlaced,
}

/// What `govctl stats` shows of the state (beside the server's own timings).
#[derive(Clone, Debug, PartialEq)]
pub struct Counters {
    /// Nodes known (any status).
    pub nodes: u64,
    pub ready_nodes: u64,
    /// Jobs not finished.
    pub jobs: u64,
    pub queued_jobs: u64,
    /// Reports received since the start.
    pub reports: u64,
    /// Members placed since the start.
    pub placements: u64,
    pub policy: String,
}

impl ClusterState {
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
                    can_dump: n.record.can_dump,
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

    /// Where the output of a job's member is (`govctl logs`): the node it runs on, or last ran
    /// on, and the names its file is found by there.
    pub fn output_source(&self, id: &str, replica: u32) -> Result<OutputSource, ControlError> {
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| ControlError::NoSuchJob { id: id.into() })?;
        let Some(spec) = job.spec.as_ref() else {
            let node = job.members.first().map_or("?", |m| m.node.as_str());
            return Err(ControlError::NoOutput {
                id: id.into(),
                why: format!(
                    "it is a local job of node {node}; its output is where it was started there"
                ),
            });
        };
        if replica >= spec.replicas {
            return Err(ControlError::NoOutput {
                id: id.into(),
                why: format!(
                    "it has {} member(s); there is no replica {replica}",
                    spec.replicas
                ),
            });
        }
        let finished = job.status.is_finished();
        match job.members.iter().find(|m| m.replica == replica) {
            Some(m) => Ok(OutputSource::Node {
                node: m.node.clone(),
                name: spec.name.clone(),
                replicas: spec.replicas,
                finished,
            }),
            None if finished => Err(ControlError::NoOutput {
                id: id.into(),
                why: format!("it is {} and never ran on a node", job.status),
            }),
            None => Ok(OutputSource::NotPlaced),
        }
    }

    pub fn job_detail(&self, id: &str) -> Result<JobDetail, ControlError> {
        let job = self
            .jobs
            .get(id)
            .ok_or_else(|| ControlError::NoSuchJob { id: id.into() })?;
        let mut summary = job.summary();
        if job.status == JobState::Queued
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
            moves: job.moves.clone(),
        })
    }

    /// Members placed since start (cheap: the server reads it around every request).
    pub fn placements(&self) -> u64 {
        self.placements
    }

    /// The service's counters (`govctl stats`).
    pub fn counters(&self) -> Counters {
        Counters {
            nodes: self.nodes.len() as u64,
            ready_nodes: self
                .nodes
                .values()
                .filter(|n| n.status == NodeState::Ready)
                .count() as u64,
            jobs: self
                .jobs
                .values()
                .filter(|j| !j.status.is_finished())
                .count() as u64,
            queued_jobs: self.queue.len() as u64,
            reports: self.reports,
            placements: self.placements,
            policy: self.policy.name().to_owned(),
        }
    }
}
