//! One node on its own ([`crate::node::run_node`]: `govsim node`, `govsim sweep`, bench-real's
//! calibration, the order bound's checks): the cluster engine with one worker whose policy is
//! the caller's, every job started at its submission (no start delay; no memory declared, a
//! node on its own never queued for it), the planner placing on the one node. So the simulator
//! has one node engine: what a node does with its jobs is the same code alone and in a cluster.

use governor_policy::quality::time_to_quality;
use governor_policy::{
    Direction, JobId, JobSpec, NodePolicy, NodeResources, Plan, ProgressPoint, Seconds, Usage,
};

use super::{ClusterConfig, Engine, PolicySpec, WorkerSpec};
use crate::job::JobModel;
use crate::node::{JobResult, NodeConfig, NodeRun, makespan_lower_bound};
use crate::trace::{TRACE_VERSION, Trace, TraceJob};

/// Run `jobs` on one node under `policy` (see [`crate::node::run_node`]).
pub(crate) fn run_one_node(
    jobs: &[JobModel],
    config: &NodeConfig,
    policy: &mut dyn NodePolicy,
    seed: u64,
) -> NodeRun {
    let name = policy.name();
    let trace = Trace {
        version: TRACE_VERSION,
        description: String::new(),
        generator: None,
        jobs: jobs.iter().cloned().map(TraceJob::new).collect(),
    };
    let cluster = ClusterConfig {
        workers: vec![WorkerSpec {
            name: "node".into(),
            cores: config.cores,
            memory_bytes: config.memory_bytes,
            gpus: 0,
        }],
        usage_interval: config.usage_interval,
        progress_delay: config.progress_delay,
        start_delay: 0.0,
        horizon: config.horizon,
        record_timeline: config.record_timeline,
        enforcement: config.enforcement,
        record_decisions: config.record_decisions,
        ..ClusterConfig::default()
    };
    // Nothing to move a job to, nothing reserved: the node's policy alone divides the node.
    let spec = PolicySpec {
        name: name.to_owned(),
        node: name.to_owned(),
        placement: "spread".into(),
        allow_moves: false,
        reserve_cores: false,
        rebalance: false,
        pays: false,
        preempt: false,
        elastic: false,
        least: false,
        scratch: false,
        gpu_power: false,
        gpu_fixed: false,
    };
    let mut engine = Engine::new(
        &trace,
        &cluster,
        &spec,
        seed,
        vec![Box::new(Lent(policy))],
        true,
    )
    .expect("`spread` is a known placement policy");
    engine.start();
    engine.run();
    engine.node_run(name, jobs, config)
}

impl Engine<'_> {
    /// The one worker's run, as [`NodeRun`] reports it.
    fn node_run(&self, policy: &str, jobs: &[JobModel], config: &NodeConfig) -> NodeRun {
        let results: Vec<JobResult> = jobs
            .iter()
            .zip(&self.rt)
            .map(|(job, rt)| JobResult {
                id: job.id.clone(),
                submit: job.submit,
                finish: rt.finish,
                jct: rt.finish.map(|f| f - job.submit),
                work: job.work,
                parallelism: job.parallelism,
                alone: job.alone_seconds(config.cores),
                cpu_seconds: rt.cpu,
                move_requested_at: rt.move_requested_at,
                ttq: time_to_quality(&rt.written, Direction::Minimise),
                best_loss: rt.written.iter().map(|w| w.1).reduce(f64::min),
                stopped: rt.stopped.clone(),
                timeline: rt.timeline.clone(),
            })
            .collect();
        let mean = |xs: Vec<f64>| {
            if xs.is_empty() {
                0.0
            } else {
                xs.iter().sum::<f64>() / xs.len() as f64
            }
        };
        let first_submit = jobs
            .iter()
            .map(|j| j.submit)
            .fold(f64::INFINITY, f64::min)
            .max(0.0);
        let last_finish = results
            .iter()
            .filter_map(|r| r.finish)
            .fold(f64::NEG_INFINITY, f64::max);
        NodeRun {
            policy: policy.to_owned(),
            avg_jct: mean(results.iter().filter_map(|r| r.jct).collect()),
            avg_ttq: mean(results.iter().filter_map(|r| r.ttq).collect()),
            jobs: results,
            makespan: if last_finish.is_finite() {
                last_finish - first_submit
            } else {
                0.0
            },
            idle_core_seconds: self.workers.iter().map(|w| w.idle_core_seconds).sum(),
            makespan_lower_bound: makespan_lower_bound(jobs, config.cores),
            decisions: self.decisions,
            move_requests: self.move_requests.clone(),
            decision_log: self.decision_log.clone(),
        }
    }
}

/// The caller's policy, lent to the engine for one run.
struct Lent<'p>(&'p mut dyn NodePolicy);

impl NodePolicy for Lent<'_> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn job_added(&mut self, now: Seconds, spec: &JobSpec) {
        self.0.job_added(now, spec);
    }
    fn job_removed(&mut self, now: Seconds, id: &JobId) {
        self.0.job_removed(now, id);
    }
    fn progress(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        self.0.progress(now, id, point);
    }
    fn usage(&mut self, now: Seconds, id: &JobId, usage: Usage) {
        self.0.usage(now, id, usage);
    }
    fn work_done(&mut self, now: Seconds, id: &JobId, fraction: f64) {
        self.0.work_done(now, id, fraction);
    }
    fn quality(&mut self, now: Seconds, id: &JobId, point: ProgressPoint) {
        self.0.quality(now, id, point);
    }
    fn hold(&mut self, now: Seconds, id: &JobId, held: bool) {
        self.0.hold(now, id, held);
    }
    fn decides_on_progress(&self) -> bool {
        self.0.decides_on_progress()
    }
    fn decide(&mut self, now: Seconds, node: &NodeResources) -> Plan {
        self.0.decide(now, node)
    }
}
