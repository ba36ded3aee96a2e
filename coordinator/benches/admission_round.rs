//! The admission round alone: the planner's `ClusterState` (`governor-planner`, what the
//! coordinator runs) driven in this process with no gRPC, no store and no other thread, so that
//! the figure is the decision's own cost and not queueing behind reports (which `cluster_load`
//! measures with it).
//!
//! ```text
//! cargo bench -p coordinator --bench admission_round -- [--nodes 10000] [--jobs 1000]
//!     [--local-jobs 4] [--policy soonest]
//! ```
//!
//! Each of `--nodes` nodes (32 cores, 256 GiB, every tenth with 8 GPUs, as `cluster_load`'s)
//! registers and reports `--local-jobs` jobs of its own; then `--jobs` jobs are submitted one by
//! one (every third asks for no GPU, one or two) with 500 node reports between two submissions
//! (10,000 reports/s at 20 submissions/s, `cluster_load`'s rates). Reported: the wall time of
//! each submission's admission round (`ClusterState::submit`, which places the job: what the
//! coordinator's `placement decision` histogram times), p50/p99/max.

use std::collections::HashMap;
use std::time::Instant;

use coordinator::state::{ClusterState, StateConfig};
use governor_proto::control::JobSpec;
use governor_proto::node::{JobReport, NodeCommand, NodeReport};

mod common;
use common::{arg, local_job, node_hello, percentile};

fn main() {
    let nodes: usize = arg("--nodes", 10_000);
    let jobs: usize = arg("--jobs", 1_000);
    let local_jobs: usize = arg("--local-jobs", 4);
    let policy: String = arg("--policy", "soonest".to_owned());
    let mut state = ClusterState::new(StateConfig::default(), &policy).expect("a known policy");
    let mut now = 1_000.0;
    let names: Vec<String> = (0..nodes).map(|i| format!("sim{i:06}")).collect();
    let mut sessions = Vec::with_capacity(nodes);
    let started = Instant::now();
    for (i, name) in names.iter().enumerate() {
        let hello = node_hello(name.clone(), i);
        sessions.push(state.register(now, hello, format!("10.0.0.{i}")).session_id);
    }
    let mut t = 1u64;
    let index: HashMap<String, usize> = names.iter().cloned().zip(0..).collect();
    // What each node was told to start, reported back as running from then on.
    let mut started_on: Vec<Vec<JobReport>> = vec![Vec::new(); nodes];
    let take_starts = |state: &mut ClusterState, started_on: &mut Vec<Vec<JobReport>>| {
        for (node, cmd) in state.take_outbox() {
            if let NodeCommand::Start(s) = cmd {
                let mut j = JobReport::running(&s.job_id, &s.name);
                j.replica = s.replica;
                j.gpu_indices = s.gpu_indices;
                started_on[index[&node]].push(j);
            }
        }
    };
    let report =
        |state: &mut ClusterState, started_on: &[Vec<JobReport>], i: usize, t: u64, now: f64| {
            let mut jobs: Vec<JobReport> = (0..local_jobs).map(|k| local_job(k, i, t)).collect();
            jobs.extend(started_on[i].iter().cloned());
            let r = NodeReport {
                sequence: t,
                cpu_used_cores: 8.0,
                memory_used_bytes: 16 << 30,
                jobs,
                ..NodeReport::default()
            };
            state
                .report(now, &names[i], sessions[i], r)
                .expect("a registered node");
            state.dispatch_if_needed(now);
        };
    for i in 0..nodes {
        report(&mut state, &started_on, i, t, now);
    }
    take_starts(&mut state, &mut started_on);
    println!(
        "{nodes} nodes with {local_jobs} local jobs each set up in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let mut rounds_ms = Vec::with_capacity(jobs);
    let mut next_node = 0usize;
    for k in 0..jobs {
        // 500 reports between two submissions: 10,000 reports/s at 20 submissions/s.
        for _ in 0..500 {
            report(&mut state, &started_on, next_node, t, now);
            next_node = (next_node + 1) % nodes;
            if next_node == 0 {
                t += 1;
            }
            now += 1.0 / 10_000.0;
        }
        take_starts(&mut state, &mut started_on);
        let mut spec = JobSpec::new(format!("bench-{k}"), vec!["train".into()], "/tmp/bench.log");
        spec.gpus = (k % 3) as u32;
        let placed_before = state.placements();
        let started = Instant::now();
        std::hint::black_box(state.submit(now, spec));
        let took = started.elapsed().as_secs_f64() * 1000.0;
        assert!(
            state.placements() > placed_before,
            "job {k} was not placed: the cluster is large enough for every job"
        );
        rounds_ms.push(took);
    }
    rounds_ms.sort_by(f64::total_cmp);
    println!(
        "admission_round: {nodes} nodes, {} local jobs, {jobs} jobs submitted and placed, policy {policy}",
        nodes * local_jobs
    );
    println!(
        "  placement decision        p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  (ClusterState::submit, in process)",
        percentile(&rounds_ms, 0.5),
        percentile(&rounds_ms, 0.99),
        percentile(&rounds_ms, 1.0)
    );
}
