//! Cluster sweeps driven by hand: trials on three nodes, judged on arrival at a rung.

use governor_proto::control::{JobSpec, JobState};
use governor_proto::job_env;
use governor_proto::node::{
    GpuDevice, Hello, JobReport, NodeCapacity, NodeCommand, NodeReport, RunState,
};

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::{NodeRecord, StateConfig};

fn node(name: &str) -> Hello {
    Hello {
        node_name: name.into(),
        capacity: NodeCapacity {
            cores: 4.0,
            memory_bytes: 8 << 30,
            // One GPU each: one trial per node, the fourth waits in the queue.
            gpus: vec![GpuDevice {
                index: 0,
                model: "A100".into(),
                memory_bytes: 40 << 30,
            }],
        },
        agent_version: "test".into(),
        can_dump: false,
    }
}

/// A trial of sweep `lr` (rungs at 2 and 6 epochs, η 3, ranked by the loss seen: the
/// mechanism, not the ranking, is under test here).
fn trial(name: &str) -> JobSpec {
    let mut spec = JobSpec::new(name, vec!["train".into()], "/tmp/train.log");
    spec.gpus = 1;
    spec.env.insert(job_env::SWEEP.into(), "lr:3:2:seen".into());
    spec
}

fn at(id: &str, epoch: u64, loss: f64) -> JobReport {
    JobReport {
        epoch: Some(epoch),
        progress: Some(loss),
        gpu_indices: vec![0],
        ..JobReport::running(id, id)
    }
}

struct Bed {
    s: ClusterState,
    sessions: BTreeMap<String, u64>,
    /// Job id -> node.
    on: BTreeMap<String, String>,
}

impl Bed {
    fn new() -> Bed {
        let mut s = ClusterState::new(StateConfig::default(), "first-fit").unwrap();
        let sessions = ["a", "b", "c"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    s.register(0.0, node(n), format!("{n}:1")).session_id,
                )
            })
            .collect();
        Bed {
            s,
            sessions,
            on: BTreeMap::new(),
        }
    }

    /// Carry out the outbox: where each trial started, which were stopped.
    fn commands(&mut self) -> Vec<(String, String)> {
        let mut stops = Vec::new();
        for (n, c) in self.s.take_outbox() {
            match c {
                NodeCommand::Start(st) => {
                    self.on.insert(st.job_id, n);
                }
                NodeCommand::Stop(st) => stops.push((n, st.job_id)),
                _ => {}
            }
        }
        stops
    }

    fn report(&mut self, t: f64, jobs: Vec<JobReport>) {
        let mut by_node: BTreeMap<String, Vec<JobReport>> = BTreeMap::new();
        for j in jobs {
            by_node
                .entry(self.on[&j.job_id].clone())
                .or_default()
                .push(j);
        }
        for (n, jobs) in by_node {
            let session = self.sessions[&n];
            let report = NodeReport {
                jobs,
                ..NodeReport::default()
            };
            self.s.report(t, &n, session, report).unwrap();
        }
    }
}

#[test]
fn a_trial_is_judged_when_it_reaches_a_rung_on_any_node_and_its_place_goes_to_a_queued_trial() {
    let mut bed = Bed::new();
    for name in ["t1", "t2", "t3", "t4"] {
        bed.s.submit(0.0, trial(name));
    }
    assert!(bed.commands().is_empty());
    assert_eq!(bed.on.len(), 3, "one trial per node: {:?}", bed.on);
    assert_eq!(bed.s.job_record("j4").unwrap().status, JobState::Queued);
    let nodes: BTreeSet<&String> = bed.on.values().collect();
    assert_eq!(nodes.len(), 3, "on three nodes");
    bed.report(
        1.0,
        vec![at("j1", 1, 0.9), at("j2", 1, 0.8), at("j3", 1, 0.95)],
    );
    // j1 reaches the first rung first: alone there, it goes on, nothing waits for the others.
    bed.report(2.0, vec![at("j1", 2, 0.3)]);
    assert!(bed.commands().is_empty());
    assert_eq!(bed.s.job_record("j1").unwrap().status, JobState::Running);
    // j2 arrives better: it goes on too.
    bed.report(3.0, vec![at("j2", 2, 0.2)]);
    assert!(bed.commands().is_empty());
    // j3 arrives worst of three (the best 1 goes on): stopped at once on its node.
    let j3_node = bed.on["j3"].clone();
    bed.report(4.0, vec![at("j3", 2, 0.5)]);
    let stops = bed.commands();
    assert_eq!(stops, [(j3_node.clone(), "j3".to_string())]);
    let j3 = bed.s.job_record("j3").unwrap();
    assert_eq!(j3.status, JobState::Completed);
    assert!(
        j3.message
            .starts_with("stopped: outranked in its sweep at 2 epochs"),
        "{}",
        j3.message
    );
    assert_eq!(j3.finished_at, Some(4.0));
    // Its GPU goes to the queued trial once its node says it stopped (never two on one GPU).
    assert_eq!(bed.on.get("j4"), None);
    bed.report(
        5.0,
        vec![JobReport {
            state: RunState::Exited,
            exit_code: Some(130),
            ..at("j3", 2, 0.5)
        }],
    );
    bed.s.tick(5.0);
    bed.commands();
    assert_eq!(bed.on.get("j4"), Some(&j3_node), "{:?}", bed.on);
    assert_eq!(bed.s.job_record("j4").unwrap().status, JobState::Starting);
    assert_eq!(
        bed.s.job_record("j3").unwrap().status,
        JobState::Completed,
        "its interrupted exit does not make it failed"
    );
}

#[test]
fn a_restarted_coordinator_judges_newcomers_against_the_results_from_before() {
    let mut bed = Bed::new();
    for name in ["t1", "t2", "t3"] {
        bed.s.submit(0.0, trial(name));
    }
    bed.commands();
    bed.report(1.0, vec![at("j1", 2, 0.2), at("j2", 2, 0.1)]);
    assert!(bed.commands().is_empty());
    let nodes: Vec<NodeRecord> = ["a", "b", "c"]
        .iter()
        .map(|n| bed.s.node_record(n).unwrap().clone())
        .collect();
    let jobs: Vec<JobRecord> = ["j1", "j2", "j3"]
        .iter()
        .map(|j| bed.s.job_record(j).unwrap().clone())
        .collect();
    assert_eq!(
        jobs[0].sweep_curve,
        [(2.0, 0.2)],
        "the curve is in the record"
    );
    // The records go through the store's encoding.
    let jobs: Vec<JobRecord> = jobs
        .iter()
        .map(|j| serde_json::from_str(&serde_json::to_string(j).unwrap()).unwrap())
        .collect();
    let mut r = ClusterState::restore(
        StateConfig::default(),
        10.0,
        Some(bed.s.meta()),
        nodes,
        jobs,
    )
    .unwrap();
    for (n, session) in bed.sessions.iter_mut() {
        *session = r.register(10.0, node(n), format!("{n}:1")).session_id;
    }
    bed.s = r;
    // The nodes re-sync with their jobs still running; j3 arrives at the rung third and worst.
    bed.report(
        11.0,
        vec![at("j1", 2, 0.2), at("j2", 2, 0.1), at("j3", 1, 0.6)],
    );
    assert!(bed.commands().is_empty(), "nothing judged twice");
    bed.report(12.0, vec![at("j3", 2, 0.5)]);
    assert_eq!(bed.commands(), [(bed.on["j3"].clone(), "j3".to_string())]);
}
