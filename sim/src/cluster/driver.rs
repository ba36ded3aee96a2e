//! The simulated cluster's side of the planner: the workers join it, jobs are submitted to it,
//! each worker reports to it as a node daemon does, the coordinator's tick runs, and the
//! commands it answers with (start, save, stop) are carried out by the modelled nodes.
//!
//! Everything the coordinator decides (admission, queueing, gangs, preemption, elastic
//! resizing, moves by SpeCon's Algorithms 2 and 3, the payoff gate) is decided here by
//! [`governor_planner::ClusterState`], the code the coordinator runs, through the one entry
//! point it uses ([`ClusterState::handle`](governor_planner::ClusterState::handle)). The
//! simulator only models what the nodes do with the commands: a start takes `start_delay` (and
//! a restore, for a later attempt), a save takes the checkpoint's write.

use governor_planner::{Answer, Input, StateConfig, payoff};
use governor_proto::control::{JobSpec, MovePhase};
use governor_proto::node::{
    Checkpoint, DEFAULT_SAVE_SIGNAL, GpuDevice, GpuUsage, Hello, JobOrigin, JobReport, MoveRequest,
    NodeCapacity, NodeCommand, NodeReport, RunState,
};
use serde::{Deserialize, Serialize};

use super::{ClusterConfig, Ended, Engine, MoveRecord, Phase, PolicySpec};
use crate::job::LogEvery;

/// One input the planner was fed and the commands it answered with, `(node, command)` in
/// order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannerStep {
    pub at: f64,
    pub input: Input,
    pub commands: Vec<(String, NodeCommand)>,
}

/// The coordinator's configuration for a simulated run of `spec`.
///
/// The simulator models no failures: nodes are never lost (they report only while they have
/// jobs), starts and saves never time out. A node's move request is acted on at the next tick
/// (SpeCon acts when a job converges), and a job moves at most `max_moves_per_job` times.
pub fn planner_config(config: &ClusterConfig, spec: &PolicySpec) -> StateConfig {
    let bytes_s = |rate: f64| {
        if rate > 0.0 {
            f64::from(1u32 << 30) / rate
        } else {
            0.0
        }
    };
    let cost = &config.move_cost;
    let move_cost = payoff::MoveCost {
        fixed_s: cost.fixed_seconds,
        per_gib_s: bytes_s(cost.checkpoint_bytes_per_second)
            + bytes_s(cost.transfer_bytes_per_second)
            + bytes_s(cost.restore_bytes_per_second),
    };
    StateConfig {
        lost_after_s: f64::INFINITY,
        start_timeout_s: f64::INFINITY,
        save_timeout_s: f64::INFINITY,
        report_interval_ms: (config.usage_interval * 1000.0).round().max(1.0) as u32,
        auto_move: spec.allow_moves,
        move_after_s: 0.0,
        move_cooldown_s: 0.0,
        move_payoff: if spec.pays { 2.0 } else { 0.0 },
        rebalance: spec.rebalance,
        max_auto_moves: Some(config.max_moves_per_job),
        framework_move_cost: move_cost,
        criu_move_cost: move_cost,
        preemption: spec.preempt,
        elastic: spec.elastic,
        resize_min_run_s: config.resize_min_run_s,
        ..StateConfig::default()
    }
}

impl Engine<'_> {
    /// Feed the planner one input at `t` (recorded with what it answers).
    fn feed(&mut self, t: f64, input: Input) -> Answer {
        let recorded = self.recorded.is_some().then(|| input.clone());
        let answer = self.planner.handle(t, input);
        let commands = self.planner.take_outbox();
        if let (Some(steps), Some(input)) = (self.recorded.as_mut(), recorded) {
            steps.push(super::PlannerStep {
                at: t,
                input,
                commands: commands.clone(),
            });
        }
        // Commands come after the answer (the submitted job's id is known first).
        self.pending.extend(commands);
        answer
    }

    /// Carry out the commands the planner gave, in order (one may feed it again).
    fn carry_out(&mut self, t: f64) {
        while !self.pending.is_empty() {
            let commands = std::mem::take(&mut self.pending);
            for (node, command) in commands {
                self.execute(t, &node, command);
            }
        }
    }

    /// Every worker opens its session at time 0.
    pub(super) fn join_workers(&mut self) {
        for w in 0..self.workers.len() {
            let spec = &self.config.workers[w];
            let hello = Hello {
                node_name: spec.name.clone(),
                capacity: NodeCapacity {
                    cores: spec.cores,
                    memory_bytes: spec.memory_bytes,
                    gpus: (0..spec.gpus)
                        .map(|index| GpuDevice {
                            index,
                            model: "sim".into(),
                            memory_bytes: 0,
                        })
                        .collect(),
                },
                agent_version: "govsim".into(),
                can_dump: false,
            };
            let input = Input::Hello {
                hello,
                address: format!("sim:{w}"),
            };
            if let Answer::Welcome(welcome) = self.feed(0.0, input) {
                self.workers[w].session = welcome.session_id;
            }
        }
        self.carry_out(0.0);
    }

    /// Job `j` is submitted at `t`.
    pub(super) fn submit(&mut self, j: usize, t: f64) {
        self.rt[j].phase = Phase::Queued;
        let spec = self.job_spec(j);
        if let Answer::Job(job) = self.feed(t, Input::Submit(spec)) {
            self.by_planner_id.insert(job.id.clone(), j);
            self.rt[j].planner_id = job.id;
        }
        self.carry_out(t);
        self.schedule_tick(t);
    }

    /// The coordinator's tick.
    pub(super) fn tick(&mut self, t: f64) {
        self.feed(t, Input::Tick);
        self.carry_out(t);
        if self.jobs_in_cluster() {
            self.schedule_tick(t);
        }
    }

    /// Worker `w` reports to the planner, as a node daemon does: its jobs running, starting
    /// or saving, each job that left since its last report once, its standing move requests.
    pub(super) fn send_report(&mut self, w: usize, t: f64) {
        let report = self.node_report(w, t);
        self.workers[w].ended.clear();
        let input = Input::Report {
            node: self.config.workers[w].name.clone(),
            session: self.workers[w].session,
            report,
        };
        self.feed(t, input);
        self.carry_out(t);
    }

    /// What the daemon submits for job `j`: its GPUs, memory and priority; cores when the
    /// policy reserves them (`reserve`) or the job is elastic (`--cores MIN:MAX`); a framework
    /// checkpoint on a path every node mounts (a move is a save and a start).
    fn job_spec(&self, j: usize) -> JobSpec {
        let m = &self.jobs[j];
        let most = m.model.parallelism.min(self.max_cores);
        let elastic = m.min_cores.filter(|_| self.spec.elastic || self.spec.least);
        let mut spec = JobSpec::new(
            m.model.id.clone(),
            vec!["govsim-job".into()],
            format!("/sim/{}.log", m.model.id),
        );
        spec.gpus = m.gpus;
        spec.priority = m.model.priority;
        // One node on its own does not queue for memory (the single-node model never did).
        spec.memory_bytes = (!self.single_node).then_some(m.model.memory_bytes);
        spec.checkpoint = Some(Checkpoint {
            dir: format!("/sim/checkpoints/{}", m.model.id),
            save_signal: DEFAULT_SAVE_SIGNAL,
            carry: false,
            transparent: false,
        });
        // A trial of a sweep in a cluster is judged by the planner (`govctl submit --sweep`);
        // one node on its own judges its trials itself (`run-job --sweep`).
        if let Some(trial) = m.model.sweep.as_ref().filter(|_| !self.single_node) {
            spec.env
                .insert(governor_proto::job_env::SWEEP.into(), trial.to_string());
            if let Some(epochs) = m.model.declared_epochs() {
                spec.env
                    .insert(governor_proto::job_env::EPOCHS.into(), epochs.to_string());
            }
        }
        match elastic {
            Some(least) => {
                spec.cores = Some(least.min(most));
                spec.max_cores = Some(most);
            }
            None if self.spec.reserve_cores => spec.cores = Some(most),
            None => {}
        }
        spec
    }

    /// Carry out one command on `node`.
    fn execute(&mut self, t: f64, node: &str, command: NodeCommand) {
        let Some(&w) = self.by_worker_name.get(node) else {
            return;
        };
        let Some(&j) = self.by_planner_id.get(command.job_id()) else {
            return;
        };
        match command {
            NodeCommand::Start(start) => {
                // Idempotent, as on a node: a start it already has is ignored.
                let rt = &self.rt[j];
                let has_it = rt.worker == w
                    && rt.attempt == start.attempt
                    && matches!(rt.phase, Phase::Starting | Phase::Running | Phase::Saving);
                if has_it {
                    return;
                }
                let m = &self.jobs[j];
                let scratch = self.spec.scratch && start.attempt > 0;
                let restore = if start.attempt > 0 && !scratch {
                    self.config.move_cost.restore_seconds(m.checkpoint_bytes())
                } else {
                    0.0
                };
                let rt = &mut self.rt[j];
                if scratch {
                    rt.start_over();
                }
                rt.attempt = start.attempt;
                rt.size = start.cores.unwrap_or(m.model.parallelism);
                let at = t + self.config.start_delay.max(0.0) + restore;
                self.start_on(j, w, start.gpu_indices, at);
            }
            NodeCommand::Save(_) => {
                if self.rt[j].phase != Phase::Running || self.rt[j].worker != w {
                    return;
                }
                let save = self
                    .config
                    .move_cost
                    .save_seconds(self.jobs[j].checkpoint_bytes());
                self.leave(w, j, t);
                self.rt[j].phase = Phase::Saving;
                let worker = &mut self.workers[w];
                worker.force_decide = true;
                worker.saving.push((t + save, j));
                self.update_shares(w, t);
                self.schedule(w);
            }
            NodeCommand::Stop(_) => {
                let rt = &self.rt[j];
                if rt.worker != w
                    || !matches!(rt.phase, Phase::Starting | Phase::Running | Phase::Saving)
                {
                    return;
                }
                if rt.phase == Phase::Running {
                    self.leave(w, j, t);
                }
                // A trial its sweep cut completed (the planner's record says so): it ends now.
                let cut = self
                    .planner
                    .job_record(&self.rt[j].planner_id)
                    .filter(|r| r.status == governor_proto::control::JobState::Completed)
                    .map(|r| r.message.clone());
                if let Some(why) = cut {
                    self.rt[j].finish = Some(t);
                    self.rt[j].stopped = Some(why);
                }
                let worker = &mut self.workers[w];
                worker.arriving.retain(|&(_, k)| k != j);
                worker.saving.retain(|&(_, k)| k != j);
                worker.ended.push((j, Ended::Stopped));
                worker.force_decide = true;
                self.rt[j].phase = Phase::Done;
                self.update_shares(w, t);
                self.schedule(w);
            }
            NodeCommand::Upload(upload) => {
                // Checkpoints are on a path every node mounts: nothing to carry. Should the
                // planner ask anyway, the upload arrives at once (its time is in the restore).
                let bytes = self.jobs[j].checkpoint_bytes();
                let input = Input::CheckpointArrived {
                    id: upload.job_id,
                    node: node.to_owned(),
                    result: Ok(bytes),
                };
                self.feed(t, input);
            }
            NodeCommand::Chunk(_) => {}
        }
    }

    /// Worker `w`'s report at `t`; its CPU use leaves out the jobs started less than
    /// [`ClusterConfig::usage_lag`] ago.
    fn node_report(&self, w: usize, t: f64) -> NodeReport {
        let worker = &self.workers[w];
        let mut jobs: Vec<JobReport> = Vec::new();
        let mut move_requests = Vec::new();
        for &j in &worker.running {
            let report = self.job_report(j);
            if let Some(reason) = &self.rt[j].move_request {
                move_requests.push(MoveRequest {
                    job_id: report.job_id.clone(),
                    reason: reason.clone(),
                });
            }
            jobs.push(report);
        }
        for &(_, j) in &worker.arriving {
            let mut report = self.bare_report(j);
            report.state = RunState::Starting;
            jobs.push(report);
        }
        for &(_, j) in &worker.saving {
            // It runs until its checkpoint is written, then exits.
            jobs.push(self.bare_report(j));
        }
        for &(j, how) in &worker.ended {
            let mut report = self.bare_report(j);
            match how {
                Ended::Finished | Ended::Saved | Ended::Converged => {
                    report.state = RunState::Exited;
                    report.exit_code = Some(0);
                    report.saved = how == Ended::Saved;
                    report.converged = how == Ended::Converged;
                }
                Ended::Stopped => {
                    report.state = RunState::Failed;
                    report.message = "stopped by the coordinator".into();
                }
            }
            jobs.push(report);
        }
        NodeReport {
            sequence: 0,
            cpu_used_cores: worker
                .running
                .iter()
                .filter(|&&j| self.rt[j].last_start <= t - self.config.usage_lag)
                .map(|&j| self.rt[j].cores)
                .sum(),
            memory_used_bytes: worker
                .running
                .iter()
                .map(|&j| self.jobs[j].model.memory_bytes)
                .sum(),
            jobs,
            move_requests,
            gpus: worker
                .gpu_owner
                .iter()
                .enumerate()
                .map(|(index, owner)| GpuUsage {
                    index: index as u32,
                    utilization: if owner.is_some() { 1.0 } else { 0.0 },
                    memory_used_bytes: 0,
                })
                .collect(),
        }
    }

    /// A coordinator job's report with nothing measured.
    fn bare_report(&self, j: usize) -> JobReport {
        let rt = &self.rt[j];
        let mut report = JobReport::running(rt.planner_id.clone(), self.jobs[j].model.id.clone());
        report.origin = JobOrigin::Coordinator;
        report.attempt = rt.attempt;
        report.memory_bytes = self.jobs[j].model.memory_bytes;
        report
    }

    /// What the node reports about a running job: the policy's category, FlowCon's growth and
    /// growth efficiency between its last two observed log lines, ProCon's epoch counters when
    /// its log says how far along it is, its CPU, memory and GPUs.
    fn job_report(&self, j: usize) -> JobReport {
        let m = &self.jobs[j].model;
        let rt = &self.rt[j];
        let mut report = self.bare_report(j);
        report.category = rt.category;
        report.cpu_cores = rt.cores;
        report.gpu_indices = rt.gpus.clone();
        report.progress = rt.last.map(|l| l.value);
        if let (Some(prev), Some(last)) = (rt.previous, rt.last) {
            let dv = (last.value - prev.value).abs();
            let dt = last.at - prev.at;
            if dt > 0.0 {
                report.growth = Some(dv / dt);
            }
            let dcpu = last.cpu - prev.cpu;
            if dcpu > 0.0 {
                report.growth_efficiency = Some(dv / dcpu);
            }
        }
        if m.reports_total
            && let Some(last) = rt.last
        {
            match m.log_every {
                LogEvery::Work { fraction } => {
                    report.epoch = Some(rt.lines_seen);
                    report.max_epochs = Some((1.0 / fraction.max(1e-6)).round() as u64);
                    report.epoch_seconds = rt.previous.map(|p| last.at - p.at);
                }
                LogEvery::Seconds { .. } => {
                    report.epoch = Some((last.fraction * 100.0).floor() as u64);
                    report.max_epochs = Some(100);
                    report.epoch_seconds = rt.previous.and_then(|p| {
                        let dx = last.fraction - p.fraction;
                        (dx > 0.0).then(|| (last.at - p.at) / (100.0 * dx))
                    });
                }
            }
        }
        report
    }

    /// The moves the planner made, from its records: `(moves, preemptions, resizes)` of job
    /// `j`, and the moves between nodes as the run's records.
    pub(super) fn moves_of(&self, j: usize) -> (Vec<MoveRecord>, u32, u32) {
        let Some(job) = self.planner.job_record(&self.rt[j].planner_id) else {
            return (Vec::new(), 0, 0);
        };
        let mut moves = Vec::new();
        let (mut preemptions, mut resizes) = (0, 0);
        for m in &job.moves {
            if m.preempted_for.is_some() {
                preemptions += 1;
            } else if m.from_node == m.to_node {
                resizes += u32::from(m.to_cores.is_some());
            } else if m.phase == MovePhase::Done {
                moves.push(MoveRecord {
                    at: m.requested_at_unix,
                    job: self.jobs[j].model.id.clone(),
                    from: m.from_node.clone(),
                    to: Some(m.to_node.clone()),
                    downtime: m
                        .running_at_unix
                        .map_or(0.0, |r| (r - m.requested_at_unix).max(0.0)),
                });
            }
        }
        (moves, preemptions, resizes)
    }
}
