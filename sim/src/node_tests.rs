use super::*;
use crate::job::LogEvery;
use crate::job::{LossCurve, QuietPhase, Speedup};
use governor_policy::fair::Fair;
use governor_policy::{CpuAllocation, JobId, JobSpec, NodeResources, ProgressPoint, Usage};
use std::collections::BTreeMap;

fn job(id: &str, work: f64) -> JobModel {
    JobModel {
        id: id.into(),
        submit: 0.0,
        work,
        parallelism: 1.0,
        speedup: Speedup::Linear,
        // Loss 1.0 falling to 0.1 at half the training, flat after.
        loss: LossCurve::Points {
            points: vec![(0.0, 1.0), (0.5, 0.1), (1.0, 0.1)],
        },
        noise: 0.0,
        log_every: LogEvery::Work { fraction: 0.1 },
        reports_total: true,
        memory_bytes: 0,
        priority: 0,
        startup: 0.0,
        quiet: Vec::new(),
        finish: None,
        sweep: None,
    }
}

fn node(cores: f64) -> NodeConfig {
    NodeConfig {
        cores,
        ..NodeConfig::default()
    }
}

#[test]
fn time_to_quality_counts_the_start_up_and_the_lines_written() {
    let plain = run_node(&[job("a", 100.0)], &node(1.0), &mut Fair::default(), 1);
    // Quality (within 5% of the reduction 1.0 -> 0.1) is the line at half the training.
    assert!(
        (plain.jobs[0].ttq.unwrap() - 50.0).abs() < 1e-6,
        "{plain:?}"
    );
    let started = JobModel {
        startup: 20.0,
        ..job("a", 100.0)
    };
    let run = run_node(&[started], &node(1.0), &mut Fair::default(), 1);
    // 20 s of start-up, then half of the remaining 80.
    assert!((run.jobs[0].ttq.unwrap() - 60.0).abs() < 1e-6, "{run:?}");
    assert!((run.jobs[0].jct.unwrap() - 100.0).abs() < 1e-6);
    assert!((run.avg_ttq - 60.0).abs() < 1e-6);
}

#[test]
fn a_job_that_finishes_at_convergence_stops_when_the_daemon_reads_its_plateau() {
    use governor_policy::quality::FinishRule;
    let finishing = JobModel {
        finish: Some(FinishRule {
            patience: 2,
            min_delta: 0.001,
            predict: false,
        }),
        ..job("a", 100.0)
    };
    let run = run_node(
        &[finishing, job("b", 100.0)],
        &node(1.0),
        &mut Fair::default(),
        1,
    );
    let (a, b) = (&run.jobs[0], &run.jobs[1]);
    // Half a core each: its best (0.1) at the line of 50% (t = 100 s), no better at 60% and
    // 70% (t = 140 s): stopped as the daemon reads that line, 0.2 s later.
    assert_eq!(a.stopped.as_deref(), Some("converged"), "{a:?}");
    assert!((a.jct.unwrap() - 140.2).abs() < 1e-6, "{a:?}");
    assert!((a.best_loss.unwrap() - 0.1).abs() < 1e-9, "{a:?}");
    assert!(a.cpu_seconds < 71.0, "{a:?}");
    // b has the core to itself from then: 70.1 done, 29.9 to go.
    assert_eq!(b.stopped, None);
    assert!((b.jct.unwrap() - 170.1).abs() < 1e-6, "{b:?}");
    // Without the rule both take 200 s.
    let plain = run_node(
        &[job("a", 100.0), job("b", 100.0)],
        &node(1.0),
        &mut Fair::default(),
        1,
    );
    assert!(
        plain
            .jobs
            .iter()
            .all(|j| (j.jct.unwrap() - 200.0).abs() < 1e-6)
    );
}

/// Fair sharing that records what it is told to hold.
#[derive(Default)]
struct Holds {
    fair: Fair,
    log: Vec<(f64, String, bool)>,
}

impl NodePolicy for Holds {
    fn name(&self) -> &'static str {
        "holds"
    }
    fn job_added(&mut self, now: f64, spec: &JobSpec) {
        self.fair.job_added(now, spec);
    }
    fn job_removed(&mut self, now: f64, id: &JobId) {
        self.fair.job_removed(now, id);
    }
    fn progress(&mut self, now: f64, id: &JobId, point: ProgressPoint) {
        self.fair.progress(now, id, point);
    }
    fn usage(&mut self, now: f64, id: &JobId, usage: Usage) {
        self.fair.usage(now, id, usage);
    }
    fn hold(&mut self, now: f64, id: &JobId, held: bool) {
        self.log.push((now, id.0.clone(), held));
    }
    fn decide(&mut self, now: f64, node: &NodeResources) -> governor_policy::Plan {
        self.fair.decide(now, node)
    }
}

#[test]
fn a_sweep_holds_the_trial_at_its_rung_and_stops_the_outranked_one() {
    use governor_policy::sweep::{HalvingRule, SweepTrial};
    let trial = |id: &str, work: f64, floor: f64| JobModel {
        sweep: Some(SweepTrial {
            sweep: "lr".into(),
            rule: HalvingRule {
                eta: 2,
                first_rung: 3.0,
                ranking: governor_policy::sweep::Ranking::Seen,
            },
        }),
        loss: LossCurve::Points {
            points: vec![(0.0, 1.0), (1.0, floor)],
        },
        ..job(id, work)
    };
    // a has half b's work: at half a core each it reaches its 3rd epoch line (15 work) at
    // 30 s, b at 60 s. a waits at the rung, held; b's line judges it: b (the worse loss)
    // is stopped, a goes on, no longer held.
    let mut policy = Holds::default();
    let run = run_node(
        &[trial("a", 50.0, 0.1), trial("b", 100.0, 0.5)],
        &node(1.0),
        &mut policy,
        1,
    );
    assert_eq!(
        policy.log,
        [(30.2, "a".to_owned(), true), (60.2, "a".to_owned(), false)]
    );
    let (a, b) = (&run.jobs[0], &run.jobs[1]);
    assert_eq!(a.stopped, None);
    let why = b.stopped.as_deref().unwrap_or_default();
    assert!(
        why.starts_with("outranked in its sweep at 3 epochs") && why.contains("2 of 2"),
        "{why}"
    );
    assert!((b.jct.unwrap() - 60.2).abs() < 1e-6, "{b:?}");
    // a: 30.1 done at 60.2 s, the 19.9 left alone.
    assert!((a.jct.unwrap() - 80.1).abs() < 1e-6, "{a:?}");
}

#[test]
fn a_quiet_phase_needs_no_cpu_and_the_others_get_it() {
    let quiet = JobModel {
        quiet: vec![
            QuietPhase {
                after: 0.0,
                seconds: 10.0,
            },
            QuietPhase {
                after: 20.0,
                seconds: 5.0,
            },
        ],
        ..job("q", 40.0)
    };
    let run = run_node(
        std::slice::from_ref(&quiet),
        &node(1.0),
        &mut Fair::default(),
        1,
    );
    // 10 s quiet, 20 s of work, 5 s quiet, 20 s of work.
    assert!((run.jobs[0].jct.unwrap() - 55.0).abs() < 1e-6, "{run:?}");
    assert!((run.jobs[0].cpu_seconds - 40.0).abs() < 1e-6);
    // Beside a busy job on one core: the busy one has the core alone while q is quiet.
    let run = run_node(
        &[quiet, job("b", 40.0)],
        &node(1.0),
        &mut Fair::default(),
        1,
    );
    let b = run.jobs.iter().find(|j| j.id == "b").unwrap();
    let q = run.jobs.iter().find(|j| j.id == "q").unwrap();
    assert!(b.jct.unwrap() < q.jct.unwrap(), "{run:?}");
    assert!((b.cpu_seconds - 40.0).abs() < 1e-6 && (q.cpu_seconds - 40.0).abs() < 1e-6);
    // Nothing idles while b can run: both done within the total work plus q's sleeps
    // that b could not fill (b finished before q's second phase ended, or filled it).
    assert!(run.makespan <= 80.0 + 15.0 + 1e-6, "{run:?}");
}

/// A policy that gives the first job all the weight.
struct FirstOnly;
impl NodePolicy for FirstOnly {
    fn name(&self) -> &'static str {
        "first-only"
    }
    fn job_added(&mut self, _: f64, _: &JobSpec) {}
    fn job_removed(&mut self, _: f64, _: &JobId) {}
    fn progress(&mut self, _: f64, _: &JobId, _: ProgressPoint) {}
    fn usage(&mut self, _: f64, _: &JobId, _: Usage) {}
    fn decide(&mut self, now: f64, _: &NodeResources) -> governor_policy::Plan {
        let mut allocations = BTreeMap::new();
        for (id, weight) in [("a", 10_000), ("b", 1)] {
            allocations.insert(
                JobId(id.into()),
                governor_policy::Allocation {
                    cpu: CpuAllocation {
                        weight,
                        max_cores: None,
                    },
                    ..governor_policy::Allocation::unmanaged(
                        governor_policy::Category::Unknown,
                        "test",
                    )
                },
            );
        }
        governor_policy::Plan {
            allocations,
            move_requests: Vec::new(),
            next_decision_at: Some(now + 1.0),
        }
    }
}

#[test]
fn enforcement_mixes_the_weighted_share_with_the_equal_share() {
    let jobs = [job("a", 10.0), job("b", 10.0)];
    let strict = run_node(&jobs, &node(1.0), &mut FirstOnly, 1);
    let jct = |r: &NodeRun, id: &str| r.jobs.iter().find(|j| j.id == id).unwrap().jct.unwrap();
    assert!(jct(&strict, "a") < 10.1, "{strict:?}");
    let none = run_node(
        &jobs,
        &NodeConfig {
            enforcement: 0.0,
            ..node(1.0)
        },
        &mut FirstOnly,
        1,
    );
    // No enforcement: the weights change nothing, both share the core to the end.
    assert!((jct(&none, "a") - 20.0).abs() < 1e-6, "{none:?}");
    let half = run_node(
        &jobs,
        &NodeConfig {
            enforcement: 0.5,
            ..node(1.0)
        },
        &mut FirstOnly,
        1,
    );
    // a gets 0.5 × 1 + 0.5 × 0.5 = 0.75 of the core.
    assert!((jct(&half, "a") - 10.0 / 0.75).abs() < 1e-3, "{half:?}");
}
