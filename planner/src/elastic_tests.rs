//! Elastic jobs driven by hand: each resize is a save and a start again at the new size, on
//! the job's node or (Schedulearn's elastic FIFO) on another one.

use governor_proto::control::{JobSpec, JobState, MovePhase};
use governor_proto::job_env;
use governor_proto::node::{Checkpoint, NodeCommand, RunState};

use super::super::moves::tests::hello;
use super::super::preemption::tests::{config, report, status};
use super::super::{ClusterState, StateConfig};

/// Cores in `cores`, elastic up to `max` when given, with a framework checkpoint in the node's
/// own directory (`carry`: carried by the coordinator should it move).
fn job(name: &str, cores: f64, max: Option<f64>, priority: i32) -> JobSpec {
    JobSpec {
        cores: Some(cores),
        max_cores: max,
        priority,
        checkpoint: Some(Checkpoint {
            dir: format!("/var/ck/{name}"),
            save_signal: 10,
            carry: true,
            transparent: false,
        }),
        ..JobSpec::new(name, vec!["train".into()], "/shared/train.log")
    }
}

/// The commands sent, starts with their size (and its GOVERNOR_CORES).
fn commands(s: &mut ClusterState) -> Vec<String> {
    s.take_outbox()
        .into_iter()
        .map(|(node, c)| match c {
            NodeCommand::Start(st) => {
                let env = st.env.get(job_env::CORES).cloned().unwrap_or_default();
                assert_eq!(
                    Some(env.as_str()),
                    st.cores.map(|c| super::super::cores(Some(c))).as_deref(),
                    "GOVERNOR_CORES follows the size"
                );
                format!(
                    "start {} on {node} attempt {} cores {env}{}",
                    st.job_id,
                    st.attempt,
                    if st.carried_checkpoint {
                        " carried"
                    } else {
                        ""
                    }
                )
            }
            NodeCommand::Save(st) => format!("save {} on {node}", st.job_id),
            NodeCommand::Upload(u) => format!("upload {} from {node}", u.job_id),
            NodeCommand::Stop(st) => format!("stop {} on {node}", st.job_id),
            other => format!("{other:?}"),
        })
        .collect()
}

fn quick() -> StateConfig {
    StateConfig {
        resize_min_run_s: 30.0,
        ..config()
    }
}

#[test]
fn an_elastic_job_starts_with_the_free_cores_and_shrinks_for_a_newcomer() {
    let mut s = ClusterState::new(quick(), "soonest").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, job("sweep", 1.0, Some(4.0), 0));
    // On the only node it keeps room for a newcomer of its own least size (1 core).
    assert_eq!(commands(&mut s), ["start j1 on a attempt 0 cores 3"]);
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    assert_eq!(s.job_detail("j1").unwrap().summary.cores, Some(3.0));

    // A 2-core job of the same priority arrives before the minimum run time: it waits.
    s.submit(10.0, job("eval", 2.0, None, 0));
    assert_eq!(status(&s, "j2"), JobState::Queued);
    assert!(commands(&mut s).is_empty());
    // Then j1 gives back exactly 1 core: saved, and started again with 2 on its own node,
    // from its own directory (nothing carried).
    s.tick(40.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    let d = s.job_detail("j1").unwrap();
    assert_eq!(
        d.summary.moving.as_deref(),
        Some("saving on a to resize from 3 to 2 cores (room for j2)")
    );
    assert!(
        d.moves[0]
            .reason
            .contains("j1 shrinks from 3 to 2 cores on a"),
        "{}",
        d.moves[0].reason
    );
    // One shrink at a time: no preemption, no second shrink while it saves.
    s.tick(41.0);
    assert!(commands(&mut s).is_empty());
    s.report(45.0, "a", a, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    s.dispatch_if_needed(45.0);
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 1 cores 2",
            "start j2 on a attempt 0 cores 2"
        ]
    );
    s.report(
        46.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Running, 1, false),
            ("j2", RunState::Running, 0, false),
        ]),
    )
    .unwrap();
    s.tick(60.0);
    let d = s.job_detail("j1").unwrap();
    assert_eq!(d.summary.cores, Some(2.0));
    assert_eq!(d.moves[0].phase, MovePhase::Done);
    assert_eq!(
        (
            d.moves[0].from_cores,
            d.moves[0].to_cores,
            d.moves[0].resized_for.as_deref()
        ),
        (Some(3.0), Some(2.0), Some("j2"))
    );
    assert_eq!(status(&s, "j1"), JobState::Running);

    // j2 completes: j1 grows back into the 2 cores once it has run its minimum time again.
    s.report(
        70.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Running, 1, false),
            ("j2", RunState::Exited, 0, false),
        ]),
    )
    .unwrap();
    s.tick(70.0);
    assert!(
        commands(&mut s).is_empty(),
        "not within resize_min_run_s of its start"
    );
    s.tick(80.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    s.report(82.0, "a", a, report(&[("j1", RunState::Exited, 1, true)]))
        .unwrap();
    assert_eq!(commands(&mut s), ["start j1 on a attempt 2 cores 4"]);
}

#[test]
fn ours_starts_a_job_on_every_free_core_where_another_node_has_room_for_the_next() {
    let mut s = ClusterState::new(quick(), "soonest").unwrap();
    let _a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let _b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.submit(1.0, job("sweep", 1.0, Some(4.0), 0));
    let started = commands(&mut s);
    assert_eq!(started.len(), 1);
    assert!(started[0].ends_with("cores 4"), "{started:?}");
    // Kubeflow starts a job on what its node leaves free, as its write-up does, even on the
    // only node.
    let mut k = ClusterState::new(quick(), "kubeflow").unwrap();
    let _a = k.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    k.submit(1.0, job("sweep", 1.0, Some(4.0), 0));
    assert_eq!(commands(&mut k), ["start j1 on a attempt 0 cores 4"]);
}

#[test]
fn a_start_that_fails_at_the_new_size_goes_back_to_the_old_one() {
    let mut s = ClusterState::new(quick(), "soonest").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, job("fixed", 2.0, None, 0));
    s.submit(1.0, job("sweep", 1.0, Some(4.0), 0));
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 0 cores 2",
            "start j2 on a attempt 0 cores 1"
        ]
    );
    s.report(
        2.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Running, 0, false),
            ("j2", RunState::Running, 0, false),
        ]),
    )
    .unwrap();
    s.report(
        50.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Exited, 0, false),
            ("j2", RunState::Running, 0, false),
        ]),
    )
    .unwrap();
    s.tick(50.0);
    assert_eq!(commands(&mut s), ["save j2 on a"]);
    s.report(52.0, "a", a, report(&[("j2", RunState::Exited, 0, true)]))
        .unwrap();
    assert_eq!(commands(&mut s), ["start j2 on a attempt 1 cores 4"]);
    // It cannot run with 4 (it exits at once): started again with its old 1.
    let mut failed = report(&[("j2", RunState::Failed, 1, false)]);
    failed.jobs[0].message = "out of memory with 4 workers".into();
    s.report(53.0, "a", a, failed).unwrap();
    assert_eq!(commands(&mut s), ["start j2 on a attempt 2 cores 1"]);
    let d = s.job_detail("j2").unwrap();
    assert_eq!(d.moves[0].phase, MovePhase::RollingBack);
    assert_eq!(d.summary.cores, Some(1.0));
}

#[test]
fn elastic_fifo_grows_the_longest_running_job_on_each_completion_even_on_another_node() {
    let mut s = ClusterState::new(quick(), "elastic-fifo").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    // j1 (elastic, starts at its least: FIFO does not grow at admission) and j3 fill a; j2 b.
    s.submit(1.0, job("old", 1.0, Some(4.0), 0));
    s.submit(2.0, job("wide", 4.0, None, 0));
    s.submit(3.0, job("rest", 3.0, None, 0));
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 0 cores 1",
            "start j2 on b attempt 0 cores 4",
            "start j3 on a attempt 0 cores 3"
        ]
    );
    s.report(
        4.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Running, 0, false),
            ("j3", RunState::Running, 0, false),
        ]),
    )
    .unwrap();
    s.report(4.0, "b", b, report(&[("j2", RunState::Running, 0, false)]))
        .unwrap();
    // Idle cores alone grow nothing under elastic FIFO: only a completion does.
    s.tick(40.0);
    assert!(commands(&mut s).is_empty());
    // j2 completes: j1 has run longest; a is full, so it moves to b and grows to 4 there,
    // its checkpoint carried (no shared path).
    s.report(50.0, "b", b, report(&[("j2", RunState::Exited, 0, false)]))
        .unwrap();
    s.tick(50.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    let d = s.job_detail("j1").unwrap();
    assert!(
        d.moves[0]
            .reason
            .contains("moves to b to grow from 1 to 4 cores"),
        "{}",
        d.moves[0].reason
    );
    s.report(
        52.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Exited, 0, true),
            ("j3", RunState::Running, 0, false),
        ]),
    )
    .unwrap();
    assert_eq!(commands(&mut s), ["upload j1 from a"]);
}

#[test]
fn kubeflow_grows_while_jobs_wait_and_shrinks_only_for_higher_priority() {
    let mut s = ClusterState::new(quick(), "kubeflow").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, job("sweep", 2.0, Some(4.0), 0));
    assert_eq!(commands(&mut s), ["start j1 on a attempt 0 cores 4"]);
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    // Same priority: it waits (Kubeflow scales down only for a higher weight).
    s.submit(40.0, job("peer", 2.0, None, 0));
    s.tick(41.0);
    assert!(commands(&mut s).is_empty());
    assert_eq!(status(&s, "j2"), JobState::Queued);
    // Higher priority: j1 shrinks to its least (2) for it.
    s.submit(42.0, job("urgent", 2.0, None, 5));
    s.tick(43.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    s.report(45.0, "a", a, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    s.dispatch_if_needed(45.0);
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 1 cores 2",
            "start j3 on a attempt 0 cores 2"
        ]
    );
}

#[test]
fn off_by_configuration_or_under_plain_fifo_jobs_keep_their_least_size() {
    for (config, policy) in [
        (
            StateConfig {
                elastic: false,
                ..quick()
            },
            "soonest",
        ),
        (quick(), "first-fit"),
    ] {
        let mut s = ClusterState::new(config, policy).unwrap();
        let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
        s.submit(1.0, job("sweep", 1.0, Some(4.0), 0));
        assert_eq!(
            commands(&mut s),
            ["start j1 on a attempt 0 cores 1"],
            "{policy}"
        );
        s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
            .unwrap();
        s.tick(100.0);
        assert!(commands(&mut s).is_empty(), "{policy}");
    }
}

#[test]
fn a_restarted_coordinator_finishes_a_resize_at_the_new_size() {
    let mut s = ClusterState::new(quick(), "soonest").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, job("sweep", 1.0, Some(4.0), 0));
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    s.submit(40.0, job("eval", 2.0, None, 0));
    s.tick(41.0);
    commands(&mut s);
    // The coordinator dies while j1 saves for its shrink from 4 to 2.
    let nodes = s.nodes.values().map(|n| n.record.clone()).collect();
    let jobs = s.jobs.values().cloned().collect();
    let mut r = ClusterState::restore(quick(), 50.0, Some(s.meta()), nodes, jobs).unwrap();
    let ra = r.register(51.0, hello("a"), "10.0.0.1:1".into()).session_id;
    assert_eq!(
        commands(&mut r),
        ["save j1 on a"],
        "the save is asked again"
    );
    r.report(52.0, "a", ra, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    r.dispatch_if_needed(52.0);
    assert_eq!(
        commands(&mut r),
        [
            "start j1 on a attempt 1 cores 2",
            "start j2 on a attempt 0 cores 2"
        ]
    );
    assert_eq!(r.job_detail("j1").unwrap().summary.cores, Some(2.0));
}

#[test]
fn elastic_fifo_scales_a_job_only_once_it_has_run_longer_than_the_completed_jobs_took() {
    let mut s = ClusterState::new(quick(), "elastic-fifo").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.submit(1.0, job("wide", 4.0, None, 0));
    s.submit(2.0, job("elastic", 1.0, Some(4.0), 0));
    s.submit(3.0, job("rest", 3.0, None, 0));
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 0 cores 4",
            "start j2 on b attempt 0 cores 1",
            "start j3 on b attempt 0 cores 3"
        ]
    );
    s.report(4.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    let both = |r| report(&[("j2", RunState::Running, 0, false), ("j3", r, 0, false)]);
    s.report(4.0, "b", b, both(RunState::Running)).unwrap();
    // j1 completes after 49 s; j2 has been in the system 48 s: not running too long.
    s.report(50.0, "a", a, report(&[("j1", RunState::Exited, 0, false)]))
        .unwrap();
    s.tick(50.0);
    assert!(commands(&mut s).is_empty());
    // j3 completes after 67 s (mean 58 s); j2 has been in 68 s: it is scaled.
    s.report(70.0, "b", b, both(RunState::Exited)).unwrap();
    s.tick(70.0);
    assert_eq!(commands(&mut s), ["save j2 on b"]);
    let d = s.job_detail("j2").unwrap();
    assert!(
        d.moves[0]
            .reason
            .contains("68 s, longer than the completed jobs' 58 s"),
        "{}",
        d.moves[0].reason
    );
}

#[test]
fn kubeflow_scales_down_only_for_a_waiting_job_that_outranks_every_running_one() {
    // The write-up's loop: scale-down when the highest waiting utility exceeds the highest
    // running one (U > u). j2 (priority 5) runs on b: a waiting job of priority 5 does not
    // shrink j1 (priority 0), one of priority 7 does.
    let mut s = ClusterState::new(quick(), "kubeflow").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.submit(1.0, job("sweep", 2.0, Some(4.0), 0));
    s.dispatch_if_needed(1.0);
    s.submit(1.5, job("rigid", 4.0, None, 5));
    s.dispatch_if_needed(1.5);
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 0 cores 4",
            "start j2 on b attempt 0 cores 4"
        ]
    );
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    s.report(2.0, "b", b, report(&[("j2", RunState::Running, 0, false)]))
        .unwrap();
    s.submit(40.0, job("peer", 2.0, None, 5));
    s.tick(41.0);
    assert!(
        commands(&mut s).is_empty(),
        "5 does not outrank the running 5"
    );
    assert_eq!(status(&s, "j3"), JobState::Queued);
    s.submit(42.0, job("urgent", 2.0, None, 7));
    s.tick(43.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
}

#[test]
fn kubeflow_admits_one_job_per_round_and_runs_the_next_round_at_once() {
    let mut s = ClusterState::new(quick(), "kubeflow").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, job("wide", 4.0, None, 0));
    s.submit(1.0, job("one", 1.0, None, 0));
    s.submit(1.0, job("two", 1.0, None, 0));
    assert_eq!(commands(&mut s), ["start j1 on a attempt 0 cores 4"]);
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    // j1 ends: both wait and both fit, the round admits one, the next round the other.
    s.report(50.0, "a", a, report(&[("j1", RunState::Exited, 0, false)]))
        .unwrap();
    assert_eq!(s.dispatch_if_needed(50.0), 1);
    assert_eq!(commands(&mut s), ["start j2 on a attempt 0 cores 1"]);
    assert_eq!(
        s.dispatch_if_needed(50.0),
        1,
        "the next round is due at once"
    );
    assert_eq!(commands(&mut s), ["start j3 on a attempt 0 cores 1"]);
}

#[test]
fn dragon_scales_others_down_for_a_job_waiting_30_s_whatever_the_priorities() {
    // DRAGON's phase 1: the oldest waiting job, after 30 s, has running jobs scaled down for it
    // (Kubeflow would not: the running job has the higher priority), and not before.
    let mut s = ClusterState::new(quick(), "dragon").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, job("sweep", 1.0, Some(4.0), 5));
    assert_eq!(
        commands(&mut s),
        ["start j1 on a attempt 0 cores 1"],
        "it starts with its declared (least) workers"
    );
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    // A quiet minute after its admission: it scales up to its most.
    s.tick(62.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    s.report(63.0, "a", a, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    s.dispatch_if_needed(63.0);
    assert_eq!(commands(&mut s), ["start j1 on a attempt 1 cores 4"]);
    s.report(64.0, "a", a, report(&[("j1", RunState::Running, 1, false)]))
        .unwrap();
    s.submit(70.0, job("eval", 2.0, None, 0));
    s.report(99.0, "a", a, report(&[("j1", RunState::Running, 1, false)]))
        .unwrap();
    s.tick(99.0);
    assert!(commands(&mut s).is_empty(), "waited 29 s: not yet");
    assert_eq!(status(&s, "j2"), JobState::Queued);
    s.tick(100.5);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    let d = s.job_detail("j1").unwrap();
    assert!(
        d.moves[1]
            .reason
            .contains("j1 shrinks from 4 to 2 cores on a"),
        "{}",
        d.moves[1].reason
    );
    s.report(105.0, "a", a, report(&[("j1", RunState::Exited, 1, true)]))
        .unwrap();
    s.dispatch_if_needed(105.0);
    s.dispatch_if_needed(105.0);
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 2 cores 2",
            "start j2 on a attempt 0 cores 2"
        ]
    );
}

#[test]
fn dragon_admits_nobody_past_a_starving_job_it_cannot_make_room_for() {
    // A rigid job holds 3 of a's 4 cores; j2 (2 cores) waits. Before 30 s a 1-core job behind
    // it is placed (the first job that fits); after 30 s nothing can shrink for j2, so a later
    // 1-core job waits behind it until j2 is placed.
    let mut s = ClusterState::new(quick(), "dragon").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, job("big", 3.0, None, 0));
    s.submit(2.0, job("mid", 2.0, None, 0));
    s.tick(3.0);
    assert_eq!(commands(&mut s), ["start j1 on a attempt 0 cores 3"]);
    s.report(3.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    s.submit(40.0, job("small", 1.0, None, 0));
    s.tick(41.0);
    assert!(
        commands(&mut s).is_empty(),
        "j2 starves: j3 waits behind it"
    );
    assert_eq!(status(&s, "j3"), JobState::Queued);
    assert!(
        s.job_detail("j2")
            .unwrap()
            .summary
            .message
            .contains("no other job is admitted before it"),
        "{:?}",
        s.job_detail("j2").unwrap().summary.message
    );
    // Under first-fit the small job would have started at once.
    let mut ff = ClusterState::new(quick(), "first-fit").unwrap();
    ff.register(0.0, hello("a"), "10.0.0.1:1".into());
    ff.submit(1.0, job("big", 3.0, None, 0));
    ff.submit(2.0, job("mid", 2.0, None, 0));
    ff.submit(40.0, job("small", 1.0, None, 0));
    assert_eq!(status(&ff, "j3"), JobState::Starting);
    // j1 ends: j2 first, then j3 in the next round.
    s.report(50.0, "a", a, report(&[("j1", RunState::Exited, 0, false)]))
        .unwrap();
    s.dispatch_if_needed(50.0);
    s.dispatch_if_needed(50.0);
    assert_eq!(
        commands(&mut s),
        [
            "start j2 on a attempt 0 cores 2",
            "start j3 on a attempt 0 cores 1"
        ]
    );
}

#[test]
fn dragon_scales_up_only_after_60_s_without_an_action() {
    let mut s = ClusterState::new(quick(), "dragon").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(0.5, job("rigid", 2.0, None, 0));
    s.submit(1.0, job("sweep", 1.0, Some(4.0), 0));
    s.dispatch_if_needed(1.0);
    assert_eq!(
        commands(&mut s),
        [
            "start j1 on a attempt 0 cores 2",
            "start j2 on a attempt 0 cores 1"
        ]
    );
    let both = |st| report(&[("j1", st, 0, false), ("j2", RunState::Running, 0, false)]);
    s.report(2.0, "a", a, both(RunState::Running)).unwrap();
    s.report(20.0, "a", a, both(RunState::Exited)).unwrap();
    s.report(60.0, "a", a, report(&[("j2", RunState::Running, 0, false)]))
        .unwrap();
    s.tick(60.5);
    let early = commands(&mut s);
    assert!(
        early.is_empty(),
        "59.5 s since the last admission: no scale-up yet: {early:?}"
    );
    s.tick(61.5);
    assert_eq!(commands(&mut s), ["save j2 on a"]);
    let d = s.job_detail("j2").unwrap();
    assert!(
        d.moves[0].reason.contains("grows from 1 to 4 cores"),
        "{}",
        d.moves[0].reason
    );
}

#[test]
fn ours_moves_a_job_to_grow_on_a_node_that_has_more_room_and_kubeflow_does_not() {
    for policy in ["soonest", "kubeflow"] {
        let mut s = ClusterState::new(quick(), policy).unwrap();
        let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
        // On a alone, a rigid job takes 3 cores and the elastic one starts with the last core.
        s.submit(1.0, job("rigid", 3.0, None, 0));
        s.submit(2.0, job("sweep", 1.0, Some(4.0), 0));
        assert_eq!(
            commands(&mut s),
            [
                "start j1 on a attempt 0 cores 3",
                "start j2 on a attempt 0 cores 1"
            ],
            "{policy}"
        );
        s.report(
            3.0,
            "a",
            a,
            report(&[
                ("j1", RunState::Running, 0, false),
                ("j2", RunState::Running, 0, false),
            ]),
        )
        .unwrap();
        // An empty node joins: nothing waits, and b can give j2 all 4 cores a never will.
        let b = s.register(10.0, hello("b"), "10.0.0.2:1".into()).session_id;
        s.report(11.0, "b", b, report(&[])).unwrap();
        s.tick(40.0);
        if policy == "kubeflow" {
            // Its scale-up grows a job where it runs.
            assert!(commands(&mut s).is_empty(), "{policy}");
            continue;
        }
        assert_eq!(commands(&mut s), ["save j2 on a"], "{policy}");
        let d = s.job_detail("j2").unwrap();
        assert!(
            d.moves[0]
                .reason
                .contains("b has room for j2 at 4 cores, its node a for 1 at most: it moves there to grow from 1 to 4 cores"),
            "{}",
            d.moves[0].reason
        );
        assert_eq!(
            (d.moves[0].from_cores, d.moves[0].to_cores),
            (Some(1.0), Some(4.0))
        );
        // Saved on a, its checkpoint carried to b and started there with its 4 cores.
        s.report(
            42.0,
            "a",
            a,
            report(&[
                ("j1", RunState::Running, 0, false),
                ("j2", RunState::Exited, 0, true),
            ]),
        )
        .unwrap();
        assert_eq!(commands(&mut s), ["upload j2 from a"]);
    }
}
