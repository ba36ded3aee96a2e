//! What a cluster run yields: each job's outcome, the move decisions, the workers' timelines
//! and the run's totals ([`ClusterRun`]), the errors that stop a run from starting, and the
//! engine's summing-up of its jobs into them.

use governor_policy::Direction;
use governor_policy::quality::time_to_quality;
use serde::{Deserialize, Serialize};

use super::Engine;

/// One job's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub id: String,
    pub submit: f64,
    /// When it first ran on a worker.
    pub start: Option<f64>,
    pub finish: Option<f64>,
    /// `finish - submit`: queueing, running and any move's downtime.
    pub jct: Option<f64>,
    /// The worker it started on.
    pub worker: Option<String>,
    /// Times it was moved.
    pub moves: u32,
    /// Time to quality from submission (see [`crate::node::JobResult::ttq`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttq: Option<f64>,
    #[serde(default)]
    pub priority: i32,
    /// Times it was displaced by a higher-priority job (`+preempt`).
    #[serde(default)]
    pub preemptions: u32,
    /// Times it was resized (`+elastic`).
    #[serde(default)]
    pub resizes: u32,
    /// GPU jobs: energy of its GPUs, joules, all told and after its time to quality.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_j: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_after_ttq_j: Option<f64>,
    /// Its best noiseless loss logged (a sweep's result is its trials' best), CPU-seconds it
    /// used, and why it was stopped before its work was done (converged, cut from its sweep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_loss: Option<f64>,
    #[serde(default)]
    pub cpu_seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// One move between nodes the planner made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoveRecord {
    pub at: f64,
    pub job: String,
    pub from: String,
    /// Where it went (always set since the planner runs moves; kept optional for the
    /// records of earlier versions, where `None` was Algorithm 2 keeping it in place).
    pub to: Option<String>,
    /// Seconds from the save's request to its report running on the target.
    pub downtime: f64,
}

/// Each job's cores over time on one worker (`(time, cores)` at every change).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerTimeline {
    pub worker: String,
    pub cores: f64,
    pub jobs: Vec<(String, Vec<(f64, f64)>)>,
}

/// The outcome of a cluster run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterRun {
    pub policy: String,
    pub jobs: Vec<JobOutcome>,
    /// Mean JCT of the finished jobs.
    pub avg_jct: f64,
    /// Mean time to quality of the jobs that logged a loss.
    #[serde(default)]
    pub avg_ttq: f64,
    /// Last finish minus first submit.
    pub makespan: f64,
    /// Jobs without a finish time (still queued or running at the horizon).
    pub unfinished: usize,
    /// `decide` calls over all workers.
    pub decisions: u64,
    /// Placements made by the coordinator's planner (its admission rounds: first starts and
    /// preempted jobs resumed; moves and resizes excluded).
    pub placements: u64,
    pub moves: Vec<MoveRecord>,
    /// Events handled (arrivals and worker steps).
    pub events: u64,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub timelines: Vec<WorkerTimeline>,
}

/// A run that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("node policy: {0}")]
    NodePolicy(#[from] governor_policy::PolicySpecError),
    #[error("placement policy: {0}")]
    Placement(#[from] governor_placement::UnknownPolicy),
    #[error("the cluster has no workers")]
    NoWorkers,
}

impl Engine<'_> {
    pub(super) fn result(&self) -> ClusterRun {
        let mut moves: Vec<MoveRecord> = Vec::new();
        let jobs: Vec<JobOutcome> = self
            .jobs
            .iter()
            .zip(&self.rt)
            .enumerate()
            .map(|(k, (j, rt))| {
                let (job_moves, preemptions, resizes) = self.moves_of(k);
                let moved = job_moves.len() as u32;
                moves.extend(job_moves);
                let ttq = time_to_quality(&rt.written, Direction::Minimise);
                let gpu_energy = (j.gpus > 0 && rt.gpu_energy_j > 0.0).then_some(rt.gpu_energy_j);
                JobOutcome {
                    id: j.model.id.clone(),
                    submit: j.model.submit,
                    start: rt.first_start,
                    finish: rt.finish,
                    jct: rt.finish.map(|f| f - j.model.submit),
                    worker: rt.first_worker.map(|w| self.config.workers[w].name.clone()),
                    moves: moved,
                    ttq,
                    priority: j.model.priority,
                    preemptions,
                    resizes,
                    gpu_energy_j: gpu_energy,
                    gpu_energy_after_ttq_j: match (ttq, gpu_energy) {
                        (Some(q), Some(total)) => {
                            let k = rt.written.partition_point(|w| w.0 <= q);
                            let at_q = if k == 0 {
                                0.0
                            } else {
                                rt.gpu_energy_at_lines[k - 1]
                            };
                            Some(total - at_q)
                        }
                        _ => None,
                    },
                    best_loss: rt.written.iter().map(|w| w.1).min_by(f64::total_cmp),
                    cpu_seconds: rt.cpu,
                    stopped: rt.stopped.clone(),
                }
            })
            .collect();
        moves.sort_by(|a, b| a.at.total_cmp(&b.at).then_with(|| a.job.cmp(&b.job)));
        let ttqs: Vec<f64> = jobs.iter().filter_map(|j| j.ttq).collect();
        let avg_ttq = if ttqs.is_empty() {
            0.0
        } else {
            ttqs.iter().sum::<f64>() / ttqs.len() as f64
        };
        let jcts: Vec<f64> = jobs.iter().filter_map(|j| j.jct).collect();
        let avg_jct = if jcts.is_empty() {
            0.0
        } else {
            jcts.iter().sum::<f64>() / jcts.len() as f64
        };
        let first = self
            .jobs
            .iter()
            .map(|j| j.model.submit)
            .fold(f64::INFINITY, f64::min);
        let last = jobs
            .iter()
            .filter_map(|j| j.finish)
            .fold(f64::NEG_INFINITY, f64::max);
        let timelines = if self.config.record_timeline {
            self.workers
                .iter()
                .zip(&self.config.workers)
                .map(|(w, spec)| {
                    let mut by_job: Vec<(usize, Vec<(f64, f64)>)> = Vec::new();
                    for &(t, j, cores) in &w.timeline {
                        match by_job.iter_mut().find(|(k, _)| *k == j) {
                            Some((_, pts)) => pts.push((t, cores)),
                            None => by_job.push((j, vec![(t, cores)])),
                        }
                    }
                    WorkerTimeline {
                        worker: spec.name.clone(),
                        cores: spec.cores,
                        jobs: by_job
                            .into_iter()
                            .map(|(j, pts)| (self.jobs[j].model.id.clone(), pts))
                            .collect(),
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        ClusterRun {
            policy: self.spec.name.clone(),
            avg_jct,
            avg_ttq,
            makespan: if last.is_finite() { last - first } else { 0.0 },
            unfinished: jobs.iter().filter(|j| j.finish.is_none()).count(),
            jobs,
            decisions: self.decisions,
            placements: self.planner.placements(),
            moves,
            events: self.events,
            timelines,
        }
    }
}
