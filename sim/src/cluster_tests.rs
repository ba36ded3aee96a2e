use super::*;
use crate::job::{JobModel, LossCurve, Speedup};
use crate::node::{NodeConfig, run_node};
use crate::trace::TRACE_VERSION;
use crate::workload::{WorkloadParams, generate};

const GIB: u64 = 1 << 30;

fn job(id: &str, submit: f64, work: f64, parallelism: f64) -> TraceJob {
    TraceJob::new(JobModel {
        id: id.into(),
        submit,
        work,
        parallelism,
        speedup: Speedup::Linear,
        loss: LossCurve::Exponential {
            initial: 2.0,
            floor: 0.1,
            rate: 4.0,
        },
        noise: 0.0,
        log_every: LogEvery::Work { fraction: 0.1 },
        reports_total: true,
        memory_bytes: GIB,
        priority: 0,
        startup: 0.0,
        quiet: Vec::new(),
        finish: None,
        sweep: None,
    })
}

fn trace(jobs: Vec<TraceJob>) -> Trace {
    Trace {
        version: TRACE_VERSION,
        description: String::new(),
        generator: None,
        jobs,
    }
}

fn spec(s: &str) -> PolicySpec {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(1.0)
}

#[test]
fn a_one_worker_cluster_and_run_node_agree_for_every_policy() {
    for seed in 1..=3 {
        let jobs = generate(&WorkloadParams {
            jobs: 6,
            cores: 4.0,
            seed,
            ..WorkloadParams::default()
        });
        let t = trace(jobs.iter().cloned().map(TraceJob::new).collect());
        // Memory large enough that no job waits for it: the single-node simulator does not
        // model memory.
        let mut config = ClusterConfig::homogeneous(1, 4.0, 1024 * GIB, 0);
        config.start_delay = 0.0;
        for name in governor_policy::POLICY_NAMES {
            let node = run_node(
                &jobs,
                &NodeConfig {
                    cores: 4.0,
                    ..NodeConfig::default()
                },
                governor_policy::by_name(name).unwrap().as_mut(),
                seed,
            );
            let cluster =
                run_cluster(&t, &config, &spec(&format!("{name}/spread+no-move")), seed).unwrap();
            for (n, c) in node.jobs.iter().zip(&cluster.jobs) {
                let (Some(a), Some(b)) = (n.finish, c.finish) else {
                    panic!("{name} seed {seed}: {n:?} vs {c:?}");
                };
                assert!(
                    close(a, b),
                    "{name} seed {seed} {}: node {a} vs cluster {b}",
                    n.id
                );
            }
            assert_eq!(node.decisions, cluster.decisions, "{name} seed {seed}");
        }
    }
}

#[test]
fn a_tiny_trace_has_the_answer_worked_out_by_hand() {
    // One worker, 2 cores, fair sharing, no start delay. a (work 100, 2 threads) starts at 0
    // alone: 2 cores. b (work 50, 1 thread) arrives at 20: b gets 1 core, a the other
    // (water-filling: both saturate at level 1). At 20, a has done 40; at 70 b finishes
    // (50 s on 1 core), a has done 40 + 50 = 90; a alone again on 2 cores: 10 left, 5 s.
    let t = trace(vec![job("a", 0.0, 100.0, 2.0), job("b", 20.0, 50.0, 1.0)]);
    let mut config = ClusterConfig::homogeneous(1, 2.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    let run = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
    assert!(close(run.jobs[0].finish.unwrap(), 75.0), "{:?}", run.jobs);
    assert!(close(run.jobs[1].finish.unwrap(), 70.0), "{:?}", run.jobs);
    assert!(close(run.avg_jct, (75.0 + 50.0) / 2.0));
    assert!(close(run.makespan, 75.0));
    // With a start delay each job starts (and so finishes) that much later.
    config.start_delay = 1.0;
    let run = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
    assert!(close(run.jobs[0].finish.unwrap(), 76.0), "{:?}", run.jobs);
    assert!(close(run.jobs[1].finish.unwrap(), 71.0), "{:?}", run.jobs);
}

#[test]
fn contention_slows_only_the_jobs_running_together_by_its_share_per_other_job() {
    // The hand-worked trace above with contention 0.25: a alone does 40 by 20; then each of a
    // and b needs 1.25 CPU-s per unit of work: b's 50 take 62.5 s (done at 82.5), in which a
    // does 50 (90 in all); a alone again at full speed: 10 left on 2 cores, 5 s.
    let t = trace(vec![job("a", 0.0, 100.0, 2.0), job("b", 20.0, 50.0, 1.0)]);
    let mut config = ClusterConfig::homogeneous(1, 2.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    config.contention = 0.25;
    let run = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
    assert!(close(run.jobs[1].finish.unwrap(), 82.5), "{:?}", run.jobs);
    assert!(close(run.jobs[0].finish.unwrap(), 87.5), "{:?}", run.jobs);
    // The same jobs on two workers never run together: no contention.
    let mut two = ClusterConfig::homogeneous(2, 2.0, 16 * GIB, 0);
    two.start_delay = 0.0;
    two.contention = 0.25;
    let run = run_cluster(&t, &two, &spec("fair"), 1).unwrap();
    assert!(close(run.jobs[0].finish.unwrap(), 50.0), "{:?}", run.jobs);
    assert!(close(run.jobs[1].finish.unwrap(), 70.0), "{:?}", run.jobs);
}

#[test]
fn a_job_held_below_the_active_threshold_does_not_count_as_a_co_runner() {
    let mut config = ClusterConfig::homogeneous(1, 4.0, 16 * GIB, 0);
    config.contention = 0.2;
    let f = config.contention_factors(&[2.0, 1.0, ACTIVE_CORES / 2.0]);
    assert!(close(f[0], 1.2) && close(f[1], 1.2), "{f:?}");
    // The held job itself still runs beside the two others.
    assert!(close(f[2], 1.4), "{f:?}");
    config.contention = 0.0;
    assert!(
        config
            .contention_factors(&[1.0, 1.0])
            .iter()
            .all(|&x| close(x, 1.0))
    );
}

#[test]
fn spread_puts_concurrent_jobs_on_different_workers() {
    let t = trace(vec![
        job("a", 0.0, 100.0, 2.0),
        job("b", 0.5, 100.0, 2.0),
        job("c", 0.7, 100.0, 2.0),
    ]);
    let mut config = ClusterConfig::homogeneous(3, 2.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    let run = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
    let workers: Vec<_> = run.jobs.iter().map(|j| j.worker.clone().unwrap()).collect();
    assert_eq!(workers, ["w01", "w02", "w03"], "{run:?}");
    for j in &run.jobs {
        assert!(close(j.jct.unwrap(), 50.0), "{j:?}");
    }
}

#[test]
fn placement_by_usage_stacks_the_jobs_that_arrive_within_the_reports_lag() {
    // Three jobs on three workers: placed by usage, each sees the others' CPU at once and goes
    // to an idle worker; with usage reports 10 s late, the second (5 s after the first) sees
    // an idle cluster and joins the first, the third (12 s after) sees the first only. Counting
    // placements (`fair`) does not care.
    let t = trace(vec![
        job("a", 0.0, 100.0, 2.0),
        job("b", 5.0, 100.0, 2.0),
        job("c", 12.0, 100.0, 2.0),
    ]);
    let mut config = ClusterConfig::homogeneous(3, 2.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    let workers = |config: &ClusterConfig, policy: &str| -> Vec<String> {
        let run = run_cluster(&t, config, &spec(policy), 1).unwrap();
        run.jobs.iter().map(|j| j.worker.clone().unwrap()).collect()
    };
    assert_eq!(workers(&config, "default"), ["w01", "w02", "w03"]);
    config.usage_lag = 10.0;
    assert_eq!(workers(&config, "default"), ["w01", "w01", "w02"]);
    assert_eq!(workers(&config, "fair"), ["w01", "w02", "w03"]);
}

#[test]
fn reserving_cores_queues_jobs_instead_of_sharing() {
    // FIFO with reservations on one 2-core worker: b waits until a is done.
    let t = trace(vec![job("a", 0.0, 100.0, 2.0), job("b", 10.0, 100.0, 2.0)]);
    let mut config = ClusterConfig::homogeneous(1, 2.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    let fifo = run_cluster(&t, &config, &spec("fifo"), 1).unwrap();
    assert!(close(fifo.jobs[0].finish.unwrap(), 50.0), "{fifo:?}");
    assert!(close(fifo.jobs[1].start.unwrap(), 50.0), "{fifo:?}");
    assert!(close(fifo.jobs[1].finish.unwrap(), 100.0), "{fifo:?}");
    // Sharing: both run from 10, a finishes at 10 + 80/1 = 90... b at 100.
    let fair = run_cluster(&t, &config, &spec("fair"), 1).unwrap();
    assert!(close(fair.jobs[0].finish.unwrap(), 90.0), "{fair:?}");
    assert!(close(fair.jobs[1].finish.unwrap(), 100.0), "{fair:?}");
}

#[test]
fn gpu_jobs_wait_for_whole_gpus() {
    let mut a = job("a", 0.0, 100.0, 1.0);
    a.gpus = 2;
    let mut b = job("b", 1.0, 100.0, 1.0);
    b.gpus = 1;
    let mut config = ClusterConfig::homogeneous(1, 8.0, 16 * GIB, 2);
    config.start_delay = 0.0;
    let run = run_cluster(&trace(vec![a, b]), &config, &spec("fair"), 1).unwrap();
    assert!(close(run.jobs[0].finish.unwrap(), 100.0));
    assert!(close(run.jobs[1].start.unwrap(), 100.0), "{run:?}");
    assert!(close(run.jobs[1].finish.unwrap(), 200.0), "{run:?}");
}

#[test]
fn measured_move_costs_match_their_benchmarks() {
    let gib = 1u64 << 30;
    let fw = MoveDowntime::by_name("framework").unwrap().seconds(gib);
    assert!(
        (3.5..4.5).contains(&fw),
        "framework, 1 GiB: {fw:.2} s (measured 3.9 s)"
    );
    let criu = MoveDowntime::by_name("criu-tcg").unwrap().seconds(gib);
    assert!(
        (18.0..26.0).contains(&criu),
        "CRIU, 1 GiB: {criu:.2} s (measured 21.9 s)"
    );
    assert!(MoveDowntime::by_name("teleport").is_none());
}

#[test]
fn move_costs_checkpoint_transfer_and_restore_in_proportion_to_the_checkpoint() {
    let cost = MoveDowntime {
        fixed_seconds: 2.0,
        checkpoint_bytes_per_second: 1e9,
        transfer_bytes_per_second: 2e9,
        restore_bytes_per_second: 4e9,
    };
    assert!(close(cost.seconds(0), 2.0));
    assert!(close(cost.seconds(4_000_000_000), 2.0 + 4.0 + 2.0 + 1.0));
    assert!(cost.seconds(8 * GIB) > cost.seconds(4 * GIB));
}

/// Three workers: w01 hosts a converging job `slow` with two learners; SpeCon's monitor asks
/// to move `slow`; Algorithm 2 sends it to the emptiest worker, where it restarts after its
/// move cost with its work kept.
fn specon_cluster() -> (Trace, ClusterConfig) {
    let mut slow = job("slow", 0.0, 3000.0, 1.0);
    slow.model.loss = LossCurve::Exponential {
        initial: 1.0,
        floor: 0.5,
        rate: 60.0,
    };
    slow.model.log_every = LogEvery::Seconds { seconds: 5.0 };
    slow.checkpoint_bytes = Some(4_000_000_000);
    let mut learners = Vec::new();
    for (k, submit) in [(1, 0.1), (2, 0.2)] {
        let mut l = job(&format!("learner{k}"), submit, 3000.0, 1.0);
        // Loss falls by 1 - e^(-10/300) ≈ 3.3% per 30 s interval at a third of a core: above
        // SpeCon's α = 1%, so the learners stay progressing and `slow` has two learning
        // neighbours when it converges.
        l.model.loss = LossCurve::Exponential {
            initial: 1.0,
            floor: 0.0,
            rate: 10.0,
        };
        l.model.log_every = LogEvery::Seconds { seconds: 5.0 };
        learners.push(l);
    }
    let mut jobs = vec![slow];
    jobs.extend(learners);
    let mut config = ClusterConfig::homogeneous(3, 1.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    config.move_cost = MoveDowntime {
        fixed_seconds: 2.0,
        checkpoint_bytes_per_second: 1e9,
        transfer_bytes_per_second: 1e9,
        restore_bytes_per_second: 1e9,
    };
    (trace(jobs), config)
}

#[test]
fn specon_moves_a_converged_job_and_pays_for_it() {
    let (t, config) = specon_cluster();
    // Every job on w01 (first-fit), so the node has somewhere to send `slow`.
    let moved = run_cluster(&t, &config, &spec("specon/first-fit"), 1).unwrap();
    let m = moved
        .moves
        .iter()
        .find(|m| m.job == "slow")
        .unwrap_or_else(|| panic!("no move of slow: {moved:?}"));
    assert_eq!(m.from, "w01");
    assert_eq!(m.to.as_deref(), Some("w02"), "{m:?}");
    assert!(close(m.downtime, 2.0 + 3.0 * 4.0), "{m:?}");
    let slow = &moved.jobs[0];
    assert_eq!(slow.moves, 1);
    // Never moved twice.
    assert_eq!(moved.moves.iter().filter(|m| m.job == "slow").count(), 1);
    // The same run with moves switched off keeps everyone on w01.
    let kept = run_cluster(&t, &config, &spec("specon/first-fit+no-move"), 1).unwrap();
    assert!(kept.moves.is_empty());
    assert!(kept.jobs.iter().all(|j| j.moves == 0));
    // Moving frees w01 for the learners (3 jobs on 1 core vs 2), and `slow` gets a core of
    // its own after its 14 s of downtime: everyone finishes sooner.
    for (a, b) in moved.jobs.iter().zip(&kept.jobs) {
        assert!(a.finish.unwrap() < b.finish.unwrap(), "{a:?} vs {b:?}");
    }
    // Its work is conserved: alone on w02 from (move + downtime) it needs exactly the
    // work it had left.
    let at = m.at + m.downtime;
    assert!(slow.finish.unwrap() > at);
}

#[test]
fn specon_rebalancing_moves_a_converged_job_to_a_worker_that_went_idle() {
    // Two workers of one core, spread by count: w01 gets a, c, e and w02 gets b, d, f.
    // `a` learns in its first tenth and barely after; everyone else keeps learning. When
    // `a` converges, Algorithm 2 keeps it (w01 scores 1 + 2 + 2 = 5, w02 2 + 2 + 2 = 6):
    // it enters D. b, d and f are short: once they are done w02 is idle, and Algorithm 3
    // sends `a` there.
    let learner = |id: &str, at: f64, work: f64| {
        let mut j = job(id, at, work, 1.0);
        j.model.loss = LossCurve::Exponential {
            initial: 2.0,
            floor: 0.0,
            rate: 1.0,
        };
        j.model.log_every = LogEvery::Work { fraction: 0.02 };
        j
    };
    let mut a = learner("a", 0.0, 900.0);
    a.model.loss = LossCurve::Exponential {
        initial: 2.0,
        floor: 0.5,
        rate: 40.0,
    };
    let jobs = vec![
        a,
        learner("b", 0.1, 300.0),
        learner("c", 0.2, 900.0),
        learner("d", 0.3, 300.0),
        learner("e", 0.4, 900.0),
        learner("f", 0.5, 300.0),
    ];
    let t = trace(jobs);
    let config = ClusterConfig::homogeneous(2, 1.0, 16 * GIB, 0);
    let plain = run_cluster(&t, &config, &spec("specon/spread"), 1).unwrap();
    assert!(
        plain.moves.iter().all(|m| m.to.is_none()),
        "Algorithm 2 alone should keep every job: {:?}",
        plain.moves
    );
    let rebalanced = run_cluster(&t, &config, &spec("specon/spread+rebalance"), 1).unwrap();
    let m = rebalanced
        .moves
        .iter()
        .find(|m| m.to.is_some())
        .unwrap_or_else(|| panic!("no rebalancing move: {:?}", rebalanced.moves));
    assert_eq!((m.job.as_str(), m.from.as_str()), ("a", "w01"), "{m:?}");
    assert_eq!(m.to.as_deref(), Some("w02"));
    let w02_done = ["b", "d", "f"]
        .iter()
        .map(|id| {
            rebalanced
                .jobs
                .iter()
                .find(|j| j.id == *id)
                .unwrap()
                .finish
                .unwrap()
        })
        .fold(0.0, f64::max);
    assert!(
        m.at >= w02_done - 1e-6,
        "moved at {} before w02 was idle at {w02_done}",
        m.at
    );
    // It moved once, and c and e on w01 finish sooner for it.
    assert_eq!(
        rebalanced.moves.iter().filter(|m| m.to.is_some()).count(),
        1
    );
    let finish =
        |r: &ClusterRun, id: &str| r.jobs.iter().find(|j| j.id == id).unwrap().finish.unwrap();
    assert!(finish(&rebalanced, "c") < finish(&plain, "c"));
    assert!(finish(&rebalanced, "e") < finish(&plain, "e"));
}

#[test]
fn runs_are_deterministic_for_a_seed() {
    let jobs = generate(&WorkloadParams {
        jobs: 12,
        cores: 4.0,
        seed: 5,
        ..WorkloadParams::default()
    });
    let mut jobs: Vec<TraceJob> = jobs.into_iter().map(TraceJob::new).collect();
    for (k, j) in jobs.iter_mut().enumerate() {
        j.model.noise = 0.05;
        j.model.submit = k as f64 * 20.0;
    }
    let t = trace(jobs);
    let config = ClusterConfig::homogeneous(3, 4.0, 16 * GIB, 0);
    for s in ["fair", "flowcon", "specon", "procon", "fifo", "ours"] {
        let a = run_cluster(&t, &config, &spec(s), 7).unwrap();
        let b = run_cluster(&t, &config, &spec(s), 7).unwrap();
        assert_eq!(a, b, "{s}: two runs with the same seed differ");
        assert_eq!(a.unfinished, 0, "{s}");
    }
}

#[test]
fn policy_specs_resolve_aliases_and_flags() {
    let s = spec("fifo");
    assert_eq!(
        (s.node.as_str(), s.placement.as_str()),
        ("fair", "first-fit")
    );
    assert!(s.reserve_cores);
    let s = spec("specon+no-migrate");
    assert_eq!(s.placement, "specon");
    assert!(!s.allow_moves);
    let s = spec("governor:floor=0.5/procon");
    assert_eq!(
        (s.node.as_str(), s.placement.as_str()),
        ("governor:floor=0.5", "procon")
    );
    assert_eq!(spec("ours").node, governor_policy::DEFAULT_POLICY);
    assert_eq!(spec("ours").placement, "soonest");
    // The old name of the node policy still reads.
    assert_eq!(spec("governor").placement, "soonest");
    assert_eq!(spec("shortest-left").placement, "soonest");
    for bad in ["nope", "fair/nope", "fair+bogus", "bogus/spread"] {
        assert!(bad.parse::<PolicySpec>().is_err(), "{bad} accepted");
    }
}

/// Eight jobs on two workers of 4 cores: every third urgent, every other elastic (1 to 4
/// cores), arriving 5 s apart: room for preemptions, resizes and moves.
fn mixed_cluster() -> (Trace, ClusterConfig) {
    let jobs = (0..8)
        .map(|k| {
            let mut j = job(&format!("m{k}"), f64::from(k) * 5.0, 400.0, 4.0);
            j.model.priority = if k % 3 == 2 { 10 } else { 0 };
            if k % 2 == 0 {
                j.min_cores = Some(1.0);
            }
            j.model.log_every = LogEvery::Seconds { seconds: 5.0 };
            j
        })
        .collect();
    (trace(jobs), ClusterConfig::homogeneous(2, 4.0, 16 * GIB, 0))
}

#[test]
fn the_planner_makes_the_same_decisions_on_the_same_event_trace() {
    let (specon, specon_config) = specon_cluster();
    let (mixed, mixed_config) = mixed_cluster();
    let cases = [
        (&specon, &specon_config, "specon/first-fit+rebalance"),
        (
            &mixed,
            &mixed_config,
            "fair/kubeflow+reserve+elastic+preempt",
        ),
        (
            &mixed,
            &mixed_config,
            "shortest-left/soonest+reserve+elastic+preempt",
        ),
        (&mixed, &mixed_config, "fair/elastic-fifo+reserve+elastic"),
    ];
    for (trace, config, name) in cases {
        let spec = spec(name);
        let (run, steps) = run_cluster_recorded(trace, config, &spec, 1).unwrap();
        assert_eq!(run.unfinished, 0, "{name}");
        let saves = steps
            .iter()
            .flat_map(|s| &s.commands)
            .filter(|(_, c)| matches!(c, NodeCommand::Save(_)))
            .count();
        assert!(saves > 0, "{name}: nothing moved, resized or preempted");
        // The trace is an artefact: written out and read back, then replayed into a fresh
        // planner (as another driver, the coordinator's server, would feed it).
        let json = serde_json::to_string(&steps).unwrap();
        let steps: Vec<PlannerStep> = serde_json::from_str(&json).unwrap();
        let mut replay = ClusterState::new(planner_config(config, &spec), &spec.placement).unwrap();
        for (k, step) in steps.iter().enumerate() {
            replay.handle(step.at, step.input.clone());
            assert_eq!(
                replay.take_outbox(),
                step.commands,
                "{name}: step {k} at {} ({:?})",
                step.at,
                step.input
            );
        }
    }
}

#[test]
fn a_job_its_node_stops_at_convergence_completes_in_the_cluster_and_frees_its_room() {
    use governor_policy::quality::FinishRule;
    // One worker of one core, cores reserved: b waits for a. a's loss stops improving at half
    // its work; with the finish rule its node stops it there, the planner takes the stop as a
    // completion, and b starts at once.
    let flat = |id: &str, submit: f64| {
        let mut j = job(id, submit, 100.0, 1.0);
        j.model.loss = LossCurve::Exponential {
            initial: 2.0,
            floor: 0.1,
            rate: 40.0,
        };
        j
    };
    let mut a = flat("a", 0.0);
    a.model.finish = Some(FinishRule {
        patience: 2,
        min_delta: 0.001,
        predict: false,
    });
    let t = trace(vec![a, flat("b", 0.1)]);
    let mut config = ClusterConfig::homogeneous(1, 1.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    let stopped = run_cluster(&t, &config, &spec("fifo"), 1).unwrap();
    let plain_trace = trace(vec![flat("a", 0.0), flat("b", 0.1)]);
    let plain = run_cluster(&plain_trace, &config, &spec("fifo"), 1).unwrap();
    let (a, b) = (&stopped.jobs[0], &stopped.jobs[1]);
    assert_eq!(stopped.unfinished, 0);
    assert!(a.finish.unwrap() < 50.0, "{a:?}");
    assert!(
        b.start.unwrap() < a.finish.unwrap() + 2.0,
        "b starts once a is stopped: {b:?} after {a:?}"
    );
    assert!(b.finish.unwrap() < plain.jobs[1].finish.unwrap() - 40.0);
}

#[test]
fn under_scratch_a_resized_job_starts_over_and_its_lost_work_is_paid_again() {
    // Schedulearn's elastic FIFO: wide (4 cores) completes after ~100 s; elastic (1 to 4
    // cores, in the system longer) then moves to wide's worker and grows to 4. With a
    // checkpoint it keeps its ~100 CPU-s of work; as written (`+scratch`) it starts over.
    let mut elastic = job("elastic", 0.0, 400.0, 4.0);
    elastic.min_cores = Some(1.0);
    let t = trace(vec![
        elastic,
        job("wide", 1.0, 400.0, 4.0),
        job("rest", 2.0, 2000.0, 3.0),
    ]);
    let mut config = ClusterConfig::homogeneous(2, 4.0, 16 * GIB, 0);
    config.start_delay = 0.0;
    let kept = run_cluster(&t, &config, &spec("fair/elastic-fifo+reserve+elastic"), 1).unwrap();
    let lost = run_cluster(
        &t,
        &config,
        &spec("fair/elastic-fifo+reserve+elastic+scratch"),
        1,
    )
    .unwrap();
    let (k, l) = (&kept.jobs[0], &lost.jobs[0]);
    // Resized on another worker: counted as its move.
    assert_eq!((k.moves, l.moves), (1, 1), "{k:?}\n{l:?}");
    // The lost run's ~100 CPU-s are done again at 4 cores: ~25 s later, ~100 CPU-s more.
    assert!(
        l.finish.unwrap() > k.finish.unwrap() + 15.0,
        "kept {k:?}\nlost {l:?}"
    );
    assert!(
        l.cpu_seconds > k.cpu_seconds + 80.0,
        "kept {k:?}\nlost {l:?}"
    );
}
