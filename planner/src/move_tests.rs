//! Moves driven by hand: every path ends with the job running on exactly one node.

use governor_proto::control::{JobMove, JobSpec, JobState, MovePhase};
use governor_proto::node::{
    Category, Checkpoint, Hello, JobReport, MoveRequest, NodeCapacity, NodeCommand, NodeReport,
    RunState,
};

use super::super::{ClusterState, ControlError, MoveTarget, StateConfig};
use super::MoveError;

/// A node of 4 cores and 16 GiB that cannot dump (shared with the preemption tests).
pub(crate) fn hello(name: &str) -> Hello {
    Hello {
        node_name: name.into(),
        capacity: NodeCapacity::cpu_only(4.0, 16 << 30),
        agent_version: "test".into(),
        can_dump: false,
    }
}

fn movable(name: &str) -> JobSpec {
    JobSpec {
        checkpoint: Some(Checkpoint {
            dir: format!("/shared/ckpt/{name}"),
            save_signal: 10,
            carry: false,
            transparent: false,
        }),
        ..JobSpec::new(name, vec!["train".into()], "/shared/train.log")
    }
}

/// The report of j1 on a node, in `state`, from start `attempt`.
fn j1(state: RunState, attempt: u32, saved: bool) -> NodeReport {
    let mut job = JobReport::running("j1", "train");
    job.state = state;
    job.attempt = attempt;
    job.saved = saved;
    if state == RunState::Exited {
        job.exit_code = Some(0);
    }
    NodeReport {
        jobs: vec![job],
        ..NodeReport::default()
    }
}

fn idle() -> NodeReport {
    NodeReport::default()
}

/// Nodes a and b; j1 (movable) placed on a by first-fit and reported running there.
fn running_on_a() -> (ClusterState, u64, u64) {
    let mut s = ClusterState::new(StateConfig::default(), "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.submit(1.0, movable("train"));
    let placed = s.job_record("j1").unwrap().members[0].node.clone();
    assert_eq!(placed, "a");
    s.report(2.0, "a", a, j1(RunState::Running, 0, false))
        .unwrap();
    s.report(2.0, "b", b, idle()).unwrap();
    s.take_outbox();
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Running);
    (s, a, b)
}

fn commands(s: &mut ClusterState) -> Vec<String> {
    s.take_outbox()
        .into_iter()
        .map(|(node, c)| match c {
            NodeCommand::Start(st) => {
                format!("start {} on {node} attempt {}", st.job_id, st.attempt)
            }
            NodeCommand::Stop(st) => format!("stop {} on {node}", st.job_id),
            NodeCommand::Save(st) => format!("save {} on {node}", st.job_id),
            other => format!("{other:?}"),
        })
        .collect()
}

fn phase(s: &ClusterState) -> MovePhase {
    s.job_record("j1").unwrap().moves.last().unwrap().phase
}

fn runs_on(s: &ClusterState) -> (String, RunState, JobState) {
    let j = s.job_record("j1").unwrap();
    (j.members[0].node.clone(), j.members[0].state, j.status)
}

#[test]
fn a_moved_job_saves_on_its_source_and_runs_on_the_target() {
    let (mut s, a, b) = running_on_a();
    let mut with_quality = j1(RunState::Running, 0, false);
    with_quality.jobs[0].time_to_quality_s = Some(5.0);
    s.report(3.0, "a", a, with_quality).unwrap();
    let m = s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    assert_eq!((m.from_node.as_str(), m.to_node.as_str()), ("a", "b"));
    assert!(m.message.contains("/shared/ckpt/train"), "{}", m.message);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    assert_eq!(
        s.job_detail("j1").unwrap().summary.moving.as_deref(),
        Some("saving on a for b")
    );
    // Still running on a until it saved.
    s.report(11.0, "a", a, j1(RunState::Running, 0, false))
        .unwrap();
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Running, JobState::Running)
    );
    // Saved and exited: started on b, next attempt; not "completed".
    s.report(14.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(commands(&mut s), ["start j1 on b attempt 1"]);
    assert_eq!(phase(&s), MovePhase::Restoring);
    assert_eq!(
        runs_on(&s),
        ("b".into(), RunState::Starting, JobState::Starting)
    );
    // a keeps reporting the saved run for a while: ignored, nothing sent.
    s.report(15.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert!(commands(&mut s).is_empty());
    let mut resumed = j1(RunState::Running, 1, false);
    // The target read the records from before the move at once: its figure is not the job's.
    resumed.jobs[0].time_to_quality_s = Some(1.0);
    s.report(16.0, "b", b, resumed.clone()).unwrap();
    // Started is not yet restored: over once it has run there for `move_confirm_s`.
    assert_eq!(phase(&s), MovePhase::Restoring);
    s.report(27.0, "b", b, resumed).unwrap();
    assert_eq!(phase(&s), MovePhase::Done);
    // Counted once for `/metrics`, however many reports follow.
    assert_eq!(s.move_outcomes(), vec![("move", "done", 1)]);
    assert_eq!(s.job_record("j1").unwrap().time_to_quality_s, Some(5.0));
    assert_eq!(
        runs_on(&s),
        ("b".into(), RunState::Running, JobState::Running)
    );
    let mv = &s.job_detail("j1").unwrap().moves[0];
    assert_eq!(mv.saved_at_unix, Some(14.0));
    assert_eq!(mv.running_at_unix, Some(16.0));
    assert_eq!(mv.pause_s(99.0), Some(2.0));
    assert_eq!(s.job_detail("j1").unwrap().summary.moving, None);
    // It ends on b: completed there.
    s.report(30.0, "b", b, j1(RunState::Exited, 1, false))
        .unwrap();
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Completed);
}

#[test]
fn what_cannot_move_is_refused_with_the_reason() {
    let (mut s, _, _) = running_on_a();
    let err = |r: Result<_, ControlError>| r.unwrap_err().to_string();
    assert!(err(s.move_job(10.0, "j1", Some("a"), "x")).contains("already runs on a"));
    assert!(err(s.move_job(10.0, "j1", Some("zz"), "x")).contains("no node zz"));
    assert!(err(s.move_job(10.0, "j9", None, "x")).contains("no job j9"));
    s.submit(10.0, JobSpec::new("plain", vec!["t".into()], "/tmp/p.log"));
    assert!(matches!(
        s.move_job(10.0, "j2", None, "x"),
        Err(ControlError::Move(MoveError::NoCheckpoint { .. }))
    ));
    // The coordinator picks b (the only other node); a second move waits for the first.
    assert_eq!(s.move_job(10.0, "j1", None, "x").unwrap().to_node, "b");
    assert!(matches!(
        s.move_job(11.0, "j1", None, "x"),
        Err(ControlError::Move(MoveError::AlreadyMoving { .. }))
    ));
    assert_eq!(
        commands(&mut s),
        ["start j2 on a attempt 0", "save j1 on a"]
    );
}

#[test]
fn a_target_that_cannot_run_the_job_hands_it_back_to_its_source() {
    let (mut s, a, b) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    commands(&mut s);
    let mut failed = j1(RunState::Failed, 1, false);
    failed.jobs[0].message = "cannot start \"train\": not found".into();
    s.report(13.0, "b", b, failed).unwrap();
    assert_eq!(commands(&mut s), ["start j1 on a attempt 2"]);
    assert_eq!(phase(&s), MovePhase::RollingBack);
    let why = &s.job_record("j1").unwrap().moves[0].message;
    assert!(
        why.contains("target b could not run it") && why.contains("not found"),
        "{why}"
    );
    // a's report of the saved run (attempt 0) is not the new start's end.
    s.report(13.5, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Starting, JobState::Starting)
    );
    s.report(14.0, "a", a, j1(RunState::Running, 2, false))
        .unwrap();
    s.report(25.0, "a", a, j1(RunState::Running, 2, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::RolledBack);
    assert_eq!(s.move_outcomes(), vec![("move", "rolled_back", 1)]);
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Running, JobState::Running)
    );
    // b's failed report no longer counts.
    s.report(15.0, "b", b, j1(RunState::Failed, 1, false))
        .unwrap();
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Running, JobState::Running)
    );
    assert!(commands(&mut s).is_empty());
}

#[test]
fn a_target_lost_mid_move_hands_the_job_back_and_must_not_run_it_if_it_returns() {
    let (mut s, a, _) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(
        commands(&mut s),
        ["save j1 on a", "start j1 on b attempt 1"]
    );
    // b goes silent (its last report at 2 s); a keeps reporting. b had the start, so it may be
    // running the job: nothing starts on a while the move waits for b.
    let wait = s.config().lost_target_wait_s;
    let give_up = 2.0 + s.config().lost_after_s + wait;
    for t in [20.0, give_up - 1.0] {
        s.report(t, "a", a, idle()).unwrap();
        s.tick(t);
        assert!(commands(&mut s).is_empty(), "at {t} s");
        assert_eq!(phase(&s), MovePhase::Restoring);
        let message = &s.job_record("j1").unwrap().moves[0].message;
        assert!(message.contains("waiting up to 300 s"), "{message}");
    }
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Unknown);
    // It did not come back in time: the job starts again on a.
    let t = give_up + 1.0;
    s.report(t, "a", a, idle()).unwrap();
    s.tick(t);
    assert_eq!(commands(&mut s), ["start j1 on a attempt 2"]);
    assert_eq!(phase(&s), MovePhase::RollingBack);
    let message = &s.job_record("j1").unwrap().moves[0].message;
    assert!(
        message.contains(
            "target b was lost after it was sent the start and did not come back within 300 s"
        ),
        "{message}"
    );
    let t = t + 1.0;
    s.report(t, "a", a, j1(RunState::Running, 2, false))
        .unwrap();
    s.report(t + 11.0, "a", a, j1(RunState::Running, 2, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::RolledBack);
    let message = &s.job_record("j1").unwrap().moves[0].message;
    assert!(
        message.ends_with("did not come back within 300 s"),
        "{message}"
    );
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Running, JobState::Running)
    );
    // b comes back running it after all: it is told to stop there.
    let t = t + 10.0;
    let b2 = s.register(t, hello("b"), "10.0.0.2:1".into()).session_id;
    s.report(t, "b", b2, j1(RunState::Running, 1, false))
        .unwrap();
    assert_eq!(commands(&mut s), ["stop j1 on b"]);
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Running, JobState::Running)
    );
}

#[test]
fn a_target_lost_after_it_got_the_start_is_waited_for_and_keeps_the_job() {
    // Its governor died after it started the job (before or after its first report of it): the
    // job ran on there. Back within the wait, it reports the job (taken back from its
    // journal): the move is done, never run twice.
    for reported_before in [false, true] {
        let (mut s, a, b) = running_on_a();
        s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
        s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
            .unwrap();
        assert_eq!(
            commands(&mut s),
            ["save j1 on a", "start j1 on b attempt 1"]
        );
        if reported_before {
            s.report(13.0, "b", b, j1(RunState::Running, 1, false))
                .unwrap();
            // Its governor dies: the stream closes at once, the node is lost only after
            // `lost_after_s`. Meanwhile the clock passes `move_confirm_s` since that report.
            s.disconnected("b", b);
            s.report(23.0, "a", a, idle()).unwrap();
            s.tick(23.0);
            assert_eq!(phase(&s), MovePhase::Restoring);
        }
        for t in [30.0, 60.0] {
            s.report(t, "a", a, idle()).unwrap();
            s.tick(t);
            assert!(commands(&mut s).is_empty());
            // Its last report said running, but a lost node confirms nothing.
            assert_eq!(phase(&s), MovePhase::Restoring, "at {t} s");
        }
        let b2 = s.register(90.0, hello("b"), "10.0.0.2:1".into()).session_id;
        if !reported_before {
            // Sent again (idempotent on the node); its start timeout counts from now, not from
            // 12 s.
            assert_eq!(commands(&mut s), ["start j1 on b attempt 1"]);
        }
        s.tick(91.0);
        s.report(91.0, "b", b2, j1(RunState::Running, 1, false))
            .unwrap();
        s.report(102.0, "b", b2, j1(RunState::Running, 1, false))
            .unwrap();
        assert_eq!(phase(&s), MovePhase::Done);
        assert_eq!(
            s.job_record("j1").unwrap().moves[0].message,
            "target b was lost after it was sent the start and came back running the job"
        );
        assert!(commands(&mut s).is_empty());
        assert_eq!(
            runs_on(&s),
            ("b".into(), RunState::Running, JobState::Running)
        );
    }
}

#[test]
fn a_target_lost_before_it_got_the_start_hands_the_job_back_at_once() {
    let (mut s, a, b) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    commands(&mut s);
    // b's session ends while the job saves; it is lost before the save comes.
    s.disconnected("b", b);
    s.report(20.0, "a", a, j1(RunState::Running, 0, false))
        .unwrap();
    s.tick(20.0);
    s.report(21.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    s.tick(21.0);
    assert_eq!(commands(&mut s), ["start j1 on a attempt 2"]);
    assert_eq!(phase(&s), MovePhase::RollingBack);
    let message = &s.job_record("j1").unwrap().moves[0].message;
    assert!(
        message.contains("target b was lost before it was sent the start"),
        "{message}"
    );
}

#[test]
fn a_job_that_does_not_save_in_time_keeps_running_and_a_late_save_restarts_it_in_place() {
    let (mut s, a, b) = running_on_a();
    let timeout = s.config().save_timeout_s;
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    commands(&mut s);
    let later = 10.0 + timeout + 1.0;
    s.report(later, "a", a, j1(RunState::Running, 0, false))
        .unwrap();
    s.report(later, "b", b, idle()).unwrap();
    s.tick(later);
    assert_eq!(phase(&s), MovePhase::Failed);
    assert!(
        s.job_record("j1").unwrap().moves[0]
            .message
            .contains("did not save")
    );
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Running, JobState::Running)
    );
    assert!(commands(&mut s).is_empty());
    // The save signal took effect after all: it exited saved on a, so it starts there again.
    s.report(later + 1.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(commands(&mut s), ["start j1 on a attempt 1"]);
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Starting, JobState::Starting)
    );
}

#[test]
fn a_job_that_ends_on_its_own_while_saving_keeps_its_own_outcome() {
    let (mut s, a, _) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    commands(&mut s);
    s.report(11.0, "a", a, j1(RunState::Exited, 0, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::Failed);
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Completed);
    assert!(commands(&mut s).is_empty());
}

#[test]
fn a_restarted_coordinator_carries_on_with_the_move() {
    for saved in [false, true] {
        let (mut s, a, _) = running_on_a();
        s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
        if saved {
            s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
                .unwrap();
        }
        commands(&mut s);
        let nodes = s.nodes.values().map(|n| n.record.clone()).collect();
        let jobs = s.jobs.values().cloned().collect();
        let mut r =
            ClusterState::restore(StateConfig::default(), 20.0, Some(s.meta()), nodes, jobs)
                .unwrap();
        let ra = r.register(21.0, hello("a"), "10.0.0.1:1".into()).session_id;
        let rb = r.register(21.0, hello("b"), "10.0.0.2:1".into()).session_id;
        if saved {
            // The start on the target it has not confirmed is sent again.
            assert_eq!(commands(&mut r), ["start j1 on b attempt 1"]);
            r.report(22.0, "a", ra, j1(RunState::Exited, 0, true))
                .unwrap();
            r.report(22.0, "b", rb, j1(RunState::Running, 1, false))
                .unwrap();
            r.report(33.0, "b", rb, j1(RunState::Running, 1, false))
                .unwrap();
            assert_eq!(phase(&r), MovePhase::Done);
            assert_eq!(
                runs_on(&r),
                ("b".into(), RunState::Running, JobState::Running)
            );
        } else {
            // The save it has not confirmed is sent again.
            assert_eq!(commands(&mut r), ["save j1 on a"]);
            r.report(22.0, "a", ra, j1(RunState::Exited, 0, true))
                .unwrap();
            assert_eq!(commands(&mut r), ["start j1 on b attempt 1"]);
        }
    }
}

#[test]
fn a_target_slow_to_reconnect_after_a_restart_still_gets_the_move() {
    // The multi-node VM test's case: the coordinator was killed mid-move and took a while to
    // come back; the agents were backing off, so the source reconnected past `lost_after_s` and
    // the target later still. The target is not lost yet: the move waits for it.
    let (mut s, _, _) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    commands(&mut s);
    let nodes = s.nodes.values().map(|n| n.record.clone()).collect();
    let jobs = s.jobs.values().cloned().collect();
    let config = StateConfig::default();
    let late = 20.0 + config.lost_after_s + 2.0;
    let mut r = ClusterState::restore(config, 20.0, Some(s.meta()), nodes, jobs).unwrap();
    r.tick(late);
    let ra = r.register(late, hello("a"), "10.0.0.1:1".into()).session_id;
    r.report(late, "a", ra, j1(RunState::Exited, 0, true))
        .unwrap();
    r.tick(late + 5.0);
    assert_eq!(phase(&r), MovePhase::Restoring);
    let rb = r
        .register(late + 5.0, hello("b"), "10.0.0.2:1".into())
        .session_id;
    assert!(commands(&mut r).contains(&"start j1 on b attempt 1".to_string()));
    r.report(late + 6.0, "b", rb, j1(RunState::Running, 1, false))
        .unwrap();
    r.report(late + 17.0, "b", rb, j1(RunState::Running, 1, false))
        .unwrap();
    assert_eq!(phase(&r), MovePhase::Done);
    assert_eq!(
        runs_on(&r),
        ("b".into(), RunState::Running, JobState::Running)
    );
}

#[test]
fn a_standing_move_request_moves_a_job_that_declared_a_checkpoint() {
    let (mut s, a, b) = running_on_a();
    let mut report = j1(RunState::Running, 0, false);
    report.cpu_used_cores = 3.9;
    report.move_requests = vec![MoveRequest {
        job_id: "j1".into(),
        reason: "converged while others progress".into(),
    }];
    s.report(20.0, "a", a, report.clone()).unwrap();
    s.report(20.0, "b", b, idle()).unwrap();
    s.tick(20.0);
    assert!(
        commands(&mut s).is_empty(),
        "the request must stand a while first"
    );
    let after = 20.0 + s.config().move_after_s;
    s.report(after, "a", a, report).unwrap();
    s.report(after, "b", b, idle()).unwrap();
    s.tick(after);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    let m = s.job_record("j1").unwrap().moves[0].clone();
    assert_eq!(m.to_node, "b");
    assert!(
        m.reason
            .starts_with("node a asks: converged while others progress; pays: "),
        "{}",
        m.reason
    );
}

#[test]
fn a_standing_request_is_not_acted_on_when_the_move_would_not_pay_for_itself() {
    let (mut s, a, b) = running_on_a();
    // One short epoch left and 4 GiB to carry: the pause outweighs what the move frees.
    let mut report = j1(RunState::Running, 0, false);
    report.cpu_used_cores = 3.9;
    let job = &mut report.jobs[0];
    (job.cpu_cores, job.memory_bytes) = (1.0, 4 << 30);
    (job.epoch, job.max_epochs, job.epoch_seconds) = (Some(99), Some(100), Some(0.5));
    report.move_requests = vec![MoveRequest {
        job_id: "j1".into(),
        reason: "converged while others progress".into(),
    }];
    for t in [20.0, 40.0] {
        s.report(t, "a", a, report.clone()).unwrap();
        s.report(t, "b", b, idle()).unwrap();
        s.tick(t);
    }
    assert!(commands(&mut s).is_empty(), "not worth moving");
    // Many epochs left: now it pays.
    report.jobs[0].epoch = Some(10);
    s.report(41.0, "a", a, report).unwrap();
    s.tick(41.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
}

#[test]
fn a_job_cancelled_while_it_moves_ends_its_move_and_runs_nowhere() {
    let (mut s, a, _) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    commands(&mut s);
    s.cancel(13.0, "j1").unwrap();
    assert_eq!(commands(&mut s), ["stop j1 on b"]);
    s.tick(14.0);
    assert_eq!(phase(&s), MovePhase::Failed);
    assert!(
        s.job_record("j1").unwrap().moves[0]
            .message
            .contains("cancelled")
    );
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Cancelled);
}

#[test]
fn a_saved_exit_without_a_known_move_is_resumed_not_completed() {
    let (mut s, a, _) = running_on_a();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(commands(&mut s), ["start j1 on a attempt 1"]);
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Starting, JobState::Starting)
    );
}

/// Nodes a and b; j1 (its checkpoint carried by the coordinator) running on a.
fn carried_running_on_a() -> (ClusterState, u64, u64) {
    let mut s = ClusterState::new(StateConfig::default(), "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    let mut spec = movable("train");
    spec.checkpoint.as_mut().unwrap().carry = true;
    s.submit(1.0, spec);
    s.report(2.0, "a", a, j1(RunState::Running, 0, false))
        .unwrap();
    s.report(2.0, "b", b, idle()).unwrap();
    s.take_outbox();
    (s, a, b)
}

fn carried_starts(s: &mut ClusterState) -> Vec<String> {
    s.take_outbox()
        .into_iter()
        .map(|(node, c)| match c {
            NodeCommand::Start(st) => format!(
                "start {} on {node} attempt {} carried {}",
                st.job_id, st.attempt, st.carried_checkpoint
            ),
            NodeCommand::Upload(u) => format!("upload {} from {node} ({})", u.job_id, u.dir),
            other => format!("{other:?}"),
        })
        .collect()
}

#[test]
fn a_carried_checkpoint_goes_through_the_coordinator_before_the_target_starts() {
    let (mut s, a, b) = carried_running_on_a();
    let m = s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    assert!(
        m.message.contains("carried by the coordinator"),
        "{}",
        m.message
    );
    s.take_outbox();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(
        carried_starts(&mut s),
        ["upload j1 from a (/shared/ckpt/train)"]
    );
    assert_eq!(phase(&s), MovePhase::Transferring);
    // Saved is not completed: it waits to be resumed.
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Starting);
    assert_eq!(
        s.job_detail("j1").unwrap().summary.moving.as_deref(),
        Some("carrying its checkpoint from a for b")
    );
    s.checkpoint_arrived(14.0, "j1", "a", Ok(4096));
    assert_eq!(
        carried_starts(&mut s),
        ["start j1 on b attempt 1 carried true"]
    );
    assert_eq!(phase(&s), MovePhase::Restoring);
    s.report(15.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    s.report(26.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::Done);
    assert_eq!(s.job_record("j1").unwrap().moves[0].bytes, 4096);
    assert_eq!(s.take_spent_checkpoints(), ["j1"]);
}

#[test]
fn a_checkpoint_that_does_not_arrive_whole_sends_the_job_back_to_its_source() {
    let (mut s, a, _) = carried_running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    s.take_outbox();
    s.checkpoint_arrived(14.0, "j1", "a", Err("checksum mismatch".into()));
    // The source resumes from its own directory: nothing carried.
    assert_eq!(
        carried_starts(&mut s),
        ["start j1 on a attempt 1 carried false"]
    );
    assert_eq!(phase(&s), MovePhase::RollingBack);
    assert!(
        s.job_record("j1").unwrap().moves[0]
            .message
            .contains("checksum mismatch")
    );
    s.report(15.0, "a", a, j1(RunState::Running, 1, false))
        .unwrap();
    s.report(26.0, "a", a, j1(RunState::Running, 1, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::RolledBack);
    // A piece from a node no move waits for is dropped.
    s.checkpoint_arrived(16.0, "j1", "a", Ok(1));
    assert_eq!(phase(&s), MovePhase::RolledBack);
}

#[test]
fn an_upload_that_never_ends_times_out_and_a_reconnecting_source_is_asked_again() {
    let (mut s, a, b) = carried_running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    s.take_outbox();
    // a reconnects mid-upload: asked again.
    let a2 = s.register(20.0, hello("a"), "10.0.0.1:1".into()).session_id;
    assert_eq!(
        carried_starts(&mut s),
        ["upload j1 from a (/shared/ckpt/train)"]
    );
    let later = 12.0 + s.config().save_timeout_s + 1.0;
    s.report(later, "a", a2, j1(RunState::Exited, 0, true))
        .unwrap();
    s.report(later, "b", b, idle()).unwrap();
    s.tick(later);
    assert_eq!(phase(&s), MovePhase::RollingBack);
    assert!(carried_starts(&mut s).contains(&"start j1 on a attempt 1 carried false".to_owned()));
}

#[test]
fn a_restore_that_fails_just_after_it_started_goes_back_to_the_source() {
    // Seen in the 3-guest bed: the target reported the job running, and 0.2 s later it exited
    // 3 (its restore failed). That must roll back, not fail the job.
    let (mut s, a, b) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    commands(&mut s);
    s.report(13.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    let mut failed = j1(RunState::Exited, 1, false);
    failed.jobs[0].exit_code = Some(3);
    s.report(13.2, "b", b, failed).unwrap();
    assert_eq!(phase(&s), MovePhase::RollingBack);
    assert_eq!(commands(&mut s), ["start j1 on a attempt 2"]);
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Starting, JobState::Starting)
    );
    s.report(14.0, "a", a, j1(RunState::Running, 2, false))
        .unwrap();
    s.report(25.0, "a", a, j1(RunState::Running, 2, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::RolledBack);
    assert_eq!(
        s.job_record("j1").unwrap().moves[0].running_at_unix,
        Some(14.0)
    );
}

/// Nodes a, b (both able to dump with CRIU) and c (not); j1, which declared no checkpoint,
/// running on a.
fn plain_running_on_a() -> (ClusterState, u64, u64) {
    let mut s = ClusterState::new(StateConfig::default(), "first-fit").unwrap();
    let dumps = |name: &str| Hello {
        can_dump: true,
        ..hello(name)
    };
    let a = s.register(0.0, dumps("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, dumps("b"), "10.0.0.2:1".into()).session_id;
    let c = s.register(0.0, hello("c"), "10.0.0.3:1".into()).session_id;
    s.submit(1.0, JobSpec::new("train", vec!["t".into()], "/tmp/t.log"));
    s.report(2.0, "a", a, j1(RunState::Running, 0, false))
        .unwrap();
    s.report(2.0, "b", b, idle()).unwrap();
    s.report(2.0, "c", c, idle()).unwrap();
    s.take_outbox();
    (s, a, b)
}

/// j1's report after a CRIU dump: killed by CRIU, reported saved with no exit code.
fn dumped() -> NodeReport {
    let mut r = j1(RunState::Exited, 0, true);
    r.jobs[0].exit_code = None;
    r
}

#[test]
fn a_job_without_a_checkpoint_moves_by_criu_between_nodes_that_can_dump() {
    let (mut s, a, b) = plain_running_on_a();
    // c cannot restore a dump: named, refused; picked, never.
    assert!(matches!(
        s.move_job(10.0, "j1", Some("c"), "x"),
        Err(ControlError::Move(MoveError::TargetCannotDump { .. }))
    ));
    let m = s.move_job(10.0, "j1", None, "govctl move").unwrap();
    assert_eq!(m.to_node, "b");
    assert!(m.message.contains("CRIU dump"), "{}", m.message);
    let spec = s.job_record("j1").unwrap().spec.clone().unwrap();
    assert_eq!(spec.checkpoint, Some(Checkpoint::transparent()));
    assert_eq!(
        carried_starts(&mut s),
        ["Save(SaveJob { job_id: \"j1\", reason: \"govctl move\" })"]
    );
    // Dumped (CRIU killed it): not completed, not failed; its dump goes up (the node knows
    // where its dump is: no directory named).
    s.report(12.0, "a", a, dumped()).unwrap();
    assert_eq!(carried_starts(&mut s), ["upload j1 from a ()"]);
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Starting);
    s.checkpoint_arrived(14.0, "j1", "a", Ok(1 << 20));
    let starts: Vec<_> = s
        .take_outbox()
        .into_iter()
        .filter_map(|(node, c)| match c {
            NodeCommand::Start(st) => Some((node, st)),
            _ => None,
        })
        .collect();
    assert_eq!(starts.len(), 1);
    let (node, st) = &starts[0];
    assert_eq!(
        (node.as_str(), st.attempt, st.carried_checkpoint),
        ("b", 1, true)
    );
    assert!(st.checkpoint.as_ref().is_some_and(|c| c.transparent));
    s.report(15.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    s.report(26.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::Done);
    assert_eq!(runs_on(&s).0, "b");
}

#[test]
fn a_dump_that_fails_ends_the_move_and_the_job_runs_on_where_it_was() {
    let (mut s, a, _) = plain_running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.take_outbox();
    let mut r = j1(RunState::Running, 0, false);
    r.jobs[0].save_error = "criu dump failed: Error (criu/files-reg.c:1): x".into();
    s.report(12.0, "a", a, r).unwrap();
    assert_eq!(phase(&s), MovePhase::Failed);
    let mv = s.job_record("j1").unwrap().moves[0].clone();
    assert!(
        mv.message.contains("a could not save it: criu dump failed"),
        "{}",
        mv.message
    );
    assert!(s.take_outbox().is_empty(), "nothing started anywhere");
    assert_eq!(
        runs_on(&s),
        ("a".into(), RunState::Running, JobState::Running)
    );
}

#[test]
fn a_job_without_a_checkpoint_on_a_node_that_cannot_dump_does_not_move() {
    let mut s = ClusterState::new(StateConfig::default(), "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.register(
        0.0,
        Hello {
            can_dump: true,
            ..hello("b")
        },
        "10.0.0.2:1".into(),
    );
    s.submit(1.0, JobSpec::new("train", vec!["t".into()], "/tmp/t.log"));
    s.report(2.0, "a", a, j1(RunState::Running, 0, false))
        .unwrap();
    let err = s.move_job(10.0, "j1", Some("b"), "x").unwrap_err();
    assert!(
        err.to_string().contains("node a cannot dump it with CRIU"),
        "{err}"
    );
}

/// a is full (j1 and a job of its own), b runs one job, c none but its cores are taken (no
/// freer than a): the most-free-cores target (`MoveTarget::MostFree`; the paper's Algorithm 2
/// would pick c, which has no jobs) leaves j1 where it is. Returns j1's first move and when.
fn left_behind_by_algorithm_2(config: StateConfig) -> Option<(f64, JobMove)> {
    let mut s = ClusterState::new(config, "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    let c = s.register(0.0, hello("c"), "10.0.0.3:1".into()).session_id;
    s.submit(1.0, movable("train"));
    let local = |id: &str| {
        let mut r = JobReport::running(id, id);
        r.origin = governor_proto::node::JobOrigin::Local;
        r
    };
    let mut on_a = j1(RunState::Running, 0, false);
    on_a.jobs[0].cpu_cores = 1.0;
    on_a.jobs.push(local("l1"));
    on_a.cpu_used_cores = 3.9;
    on_a.move_requests = vec![MoveRequest {
        job_id: "j1".into(),
        reason: "converged while others progress".into(),
    }];
    let on_b = NodeReport {
        jobs: vec![local("l2")],
        cpu_used_cores: 3.9,
        ..NodeReport::default()
    };
    let on_c = NodeReport {
        cpu_used_cores: 3.9,
        ..NodeReport::default()
    };
    for t in [2.0, 20.0, 40.0] {
        s.report(t, "a", a, on_a.clone()).unwrap();
        s.report(t, "b", b, on_b.clone()).unwrap();
        s.report(t, "c", c, on_c.clone()).unwrap();
        s.tick(t);
        if let Some(m) = s.job_record("j1").unwrap().moves.first() {
            return Some((t, m.clone()));
        }
    }
    None
}

#[test]
fn a_job_algorithm_2_moved_stays_in_algorithm_3s_set_from_when_it_was_marked() {
    // SpeCon's Algorithm 2 marks a job migrated whether it moves it or leaves it (lines 9, 15
    // and 20); Algorithm 3 counts its converged duration from then, wherever it runs.
    let config = StateConfig {
        move_target: MoveTarget::Specon,
        rebalance: false,
        move_payoff: 0.0,
        ..StateConfig::default()
    };
    let (t, m) = left_behind_by_algorithm_2(config.clone()).expect("Algorithm 2 moved j1");
    assert_eq!((m.to_node.as_str(), t), ("c", 20.0), "{m:?}");
    let mut s = ClusterState::new(config, "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    let c = s.register(0.0, hello("c"), "10.0.0.3:1".into()).session_id;
    s.submit(1.0, movable("train"));
    let mut asks = j1(RunState::Running, 0, false);
    asks.move_requests = vec![MoveRequest {
        job_id: "j1".into(),
        reason: "converged while others progress".into(),
    }];
    asks.jobs.push(JobReport::running("l1", "l1"));
    asks.jobs[1].origin = governor_proto::node::JobOrigin::Local;
    let mut on_b = idle();
    on_b.jobs.push(JobReport::running("l2", "l2"));
    on_b.jobs[0].origin = governor_proto::node::JobOrigin::Local;
    for t in [2.0, 20.0] {
        s.report(t, "a", a, asks.clone()).unwrap();
        s.report(t, "b", b, on_b.clone()).unwrap();
        s.report(t, "c", c, idle()).unwrap();
        s.tick(t);
        if t == 2.0 {
            assert!(s.job_record("j1").unwrap().specon_marked_at.is_none());
        }
    }
    assert_eq!(phase(&s), MovePhase::Saving);
    assert_eq!(s.job_record("j1").unwrap().specon_marked_at, Some(2.0));
    // It saves on a and runs on c: in D there, marked at 2 s, once it may move again.
    s.report(22.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    s.report(24.0, "c", c, j1(RunState::Running, 1, false))
        .unwrap();
    s.report(40.0, "c", c, j1(RunState::Running, 1, false))
        .unwrap();
    assert_eq!(runs_on(&s).0, "c");
    assert!(
        s.specon_converged(100.0).is_empty(),
        "within its move's cooldown"
    );
    let d = s.specon_converged(1000.0);
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!((d[0].job.as_str(), d[0].marked_at), ("j1", 2.0));
    assert_eq!(s.view.nodes[d[0].node].name, "c");
}

#[test]
fn specon_rebalancing_sends_a_job_algorithm_2_left_behind_to_a_node_with_no_jobs() {
    // Balance factor ⌊3 jobs / 3 workers⌋ = 1: c, idle, takes the most recently converged job.
    let most_free = StateConfig {
        move_target: MoveTarget::MostFree,
        ..StateConfig::default()
    };
    let (t, m) = left_behind_by_algorithm_2(most_free.clone()).expect("Algorithm 3 moved j1");
    assert!(t > 2.0, "the request stands first");
    assert_eq!((m.from_node.as_str(), m.to_node.as_str()), ("a", "c"));
    assert!(
        m.reason.starts_with("specon rebalance: c is idle"),
        "{}",
        m.reason
    );
    assert!(m.reason.contains("pays:"), "{}", m.reason);
    let off = StateConfig {
        rebalance: false,
        ..most_free
    };
    assert_eq!(
        left_behind_by_algorithm_2(off),
        None,
        "Algorithm 2 alone leaves it"
    );
}

/// Nodes a, b and c (4 cores each; which can dump and restore with CRIU: `can_dump`); j1
/// (converged; with a framework checkpoint or moved by CRIU) on a beside `on_a` (local jobs in
/// those stages), b and c running `on_b` and `on_c`; a asks to move j1. Returns j1's first
/// move, if any, after the request has stood.
fn algorithm_2_move(
    config: StateConfig,
    on_a: &[Category],
    on_b: &[Category],
    on_c: &[Category],
    can_dump: [bool; 3],
    j1_checkpoint: bool,
) -> Option<JobMove> {
    let mut s = ClusterState::new(config, "first-fit").unwrap();
    let mut session = |name: &str, dumps: bool, address: &str| {
        let hello = Hello {
            can_dump: dumps,
            ..hello(name)
        };
        s.register(0.0, hello, address.into()).session_id
    };
    let a = session("a", can_dump[0], "10.0.0.1:1");
    let b = session("b", can_dump[1], "10.0.0.2:1");
    let c = session("c", can_dump[2], "10.0.0.3:1");
    let spec = if j1_checkpoint {
        movable("train")
    } else {
        JobSpec::new("train", vec!["train".into()], "/shared/train.log")
    };
    s.submit(1.0, spec);
    let local = |node: &str, stages: &[Category]| -> Vec<JobReport> {
        stages
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let id = format!("{node}-l{i}");
                let mut r = JobReport::running(&id, &id);
                r.origin = governor_proto::node::JobOrigin::Local;
                r.category = *st;
                r
            })
            .collect()
    };
    let mut report_a = j1(RunState::Running, 0, false);
    report_a.jobs[0].category = Category::Converged;
    report_a.jobs[0].cpu_cores = 0.5;
    report_a.jobs.extend(local("a", on_a));
    report_a.cpu_used_cores = 3.9;
    report_a.move_requests = vec![MoveRequest {
        job_id: "j1".into(),
        reason: "converged while others progress".into(),
    }];
    let report = |node: &str, stages: &[Category]| NodeReport {
        jobs: local(node, stages),
        cpu_used_cores: stages.len() as f64,
        ..NodeReport::default()
    };
    for t in [2.0, 20.0, 40.0] {
        s.report(t, "a", a, report_a.clone()).unwrap();
        s.report(t, "b", b, report("b", on_b)).unwrap();
        s.report(t, "c", c, report("c", on_c)).unwrap();
        s.tick(t);
    }
    s.job_record("j1").unwrap().moves.first().cloned()
}

#[test]
fn a_node_s_request_goes_to_the_node_specon_algorithm_2_scores_lowest() {
    use Category::{Converged as Cc, Progressing as Pc, Watching as Wc};
    // Scores (2 per progressing, 1.5 per watching, 1 per converged job): a 1 + 2 + 2 = 5,
    // b 1.5 + 1.5 = 3, c 1 + 1 = 2. c has fewer free cores than b (2 used against 2): Algorithm
    // 2 goes by the score, where the most-free rule would take b or neither.
    let m = algorithm_2_move(
        StateConfig::default(),
        &[Pc, Pc],
        &[Wc, Wc],
        &[Cc, Cc],
        [false; 3],
        true,
    )
    .expect("Algorithm 2 moves j1");
    assert_eq!((m.from_node.as_str(), m.to_node.as_str()), ("a", "c"));
    assert!(m.reason.starts_with("node a asks: "), "{}", m.reason);
    assert!(m.reason.contains("pays:"), "{}", m.reason);
    // Its node among the lowest scores: j1 stays (lines 8-10 of Algorithm 2).
    assert_eq!(
        algorithm_2_move(
            StateConfig {
                rebalance: false,
                ..StateConfig::default()
            },
            &[],
            &[Pc],
            &[Pc, Cc],
            [false; 3],
            true,
        ),
        None,
        "a (1) scores below b (2) and c (3)"
    );
}

#[test]
fn specon_s_target_that_cannot_restore_a_dump_is_passed_over_for_the_next_best() {
    use Category::Progressing as Pc;
    let config = StateConfig {
        rebalance: false,
        ..StateConfig::default()
    };
    // j1 declared no checkpoint: it moves by CRIU. Scores: a 1 + 2 + 2 = 5, b 2, c 0; c cannot
    // restore a dump, so b, the next best and still below a, takes it.
    let m = algorithm_2_move(
        config.clone(),
        &[Pc, Pc],
        &[Pc],
        &[],
        [true, true, false],
        false,
    )
    .expect("moved to the next best");
    assert_eq!((m.from_node.as_str(), m.to_node.as_str()), ("a", "b"));
    // Neither b nor c can: it stays.
    assert_eq!(
        algorithm_2_move(config, &[Pc, Pc], &[Pc], &[], [true, false, false], false),
        None
    );
}

#[test]
fn the_payback_gate_is_ours_and_can_be_turned_off() {
    use Category::{Converged as Cc, Progressing as Pc};
    // c is as busy as a (3.9 of 4 cores in use by a's report; c's jobs use 2): the move does
    // not pay under the default gate...
    let busy_c = |payoff: f64| {
        algorithm_2_move(
            StateConfig {
                move_payoff: payoff,
                rebalance: false,
                ..StateConfig::default()
            },
            &[Pc, Pc, Pc],
            &[Pc, Pc, Pc, Pc],
            &[Cc, Cc, Cc, Cc],
            [false; 3],
            true,
        )
    };
    assert_eq!(busy_c(2.0), None, "does not pay: c has no more room than a");
    // ... and Algorithm 2 alone, as in the paper (a move taken as free), makes it.
    let m = busy_c(0.0).expect("the gate off: Algorithm 2 moves j1");
    assert_eq!(m.to_node, "c");
    assert_eq!(m.reason, "node a asks: converged while others progress");
}

#[test]
fn algorithm_2_decides_once_per_request_and_a_job_it_kept_is_not_weighed_again() {
    use Category::{Converged as Cc, Progressing as Pc};
    let mut s = ClusterState::new(
        StateConfig {
            rebalance: false,
            // Algorithm 2 alone (a move taken as free, as in the paper).
            move_payoff: 0.0,
            ..StateConfig::default()
        },
        "first-fit",
    )
    .unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.submit(1.0, movable("train"));
    let local = |id: &str, stage: Category| {
        let mut r = JobReport::running(id, id);
        r.origin = governor_proto::node::JobOrigin::Local;
        r.category = stage;
        r
    };
    let mut on_a = j1(RunState::Running, 0, false);
    on_a.jobs[0].category = Cc;
    on_a.move_requests = vec![MoveRequest {
        job_id: "j1".into(),
        reason: "converged while others progress".into(),
    }];
    // a scores 1 (j1 converged), b 2 (one progressing job): j1 stays (Algorithm 2, lines 8-10).
    let busy_b = NodeReport {
        jobs: vec![local("l1", Pc)],
        cpu_used_cores: 1.0,
        ..NodeReport::default()
    };
    for t in [2.0, 20.0] {
        s.report(t, "a", a, on_a.clone()).unwrap();
        s.report(t, "b", b, busy_b.clone()).unwrap();
        s.tick(t);
    }
    let ask = s.job_record("j1").unwrap().move_request.clone().unwrap();
    assert!(ask.stayed, "Algorithm 2 kept j1 on a");
    // b empties: by score it is now below a, but Algorithm 2 decided on this request already.
    for t in [40.0, 60.0] {
        s.report(t, "a", a, on_a.clone()).unwrap();
        s.report(t, "b", b, idle()).unwrap();
        s.tick(t);
    }
    assert!(s.job_record("j1").unwrap().moves.is_empty());
    // The node withdraws its request and asks again: a new request, decided afresh.
    let mut quiet_a = on_a.clone();
    quiet_a.move_requests.clear();
    s.report(70.0, "a", a, quiet_a).unwrap();
    for t in [71.0, 90.0] {
        s.report(t, "a", a, on_a.clone()).unwrap();
        s.report(t, "b", b, idle()).unwrap();
        s.tick(t);
    }
    let moves = &s.job_record("j1").unwrap().moves;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].to_node, "b");
}

#[test]
fn a_job_is_moved_automatically_at_most_max_auto_moves_times() {
    use Category::{Converged as Cc, Progressing as Pc, Watching as Wc};
    let with_limit = |most: Option<u32>| {
        algorithm_2_move(
            StateConfig {
                max_auto_moves: most,
                rebalance: false,
                move_payoff: 0.0,
                ..StateConfig::default()
            },
            &[Pc, Pc],
            &[Wc, Wc],
            &[Cc, Cc],
            [false; 3],
            true,
        )
    };
    assert_eq!(with_limit(None).map(|m| m.to_node), Some("c".into()));
    assert_eq!(with_limit(Some(1)).map(|m| m.to_node), Some("c".into()));
    assert_eq!(with_limit(Some(0)), None, "no automatic move allowed");
}

/// The fence's side in the coordinator: a moved job is named to its target in every heartbeat
/// while its move waits for it to run (the coordinator would start it again on its source if
/// it lost the target), and no longer once the move is done; the bound is half the time after
/// which the coordinator may do so.
#[test]
fn a_move_target_is_told_to_fence_the_job_until_its_move_is_done() {
    let (mut s, a, b) = running_on_a();
    let config = s.config().clone();
    assert_eq!(config.fence_after_s(), 155.0);
    assert_eq!(
        s.heartbeat("b", b, 3).fence_after_ms,
        155_000,
        "{:?}",
        s.heartbeat("b", b, 3)
    );
    assert!(s.fence_jobs("a").is_empty() && s.fence_jobs("b").is_empty());
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::Restoring);
    let beat = s.heartbeat("b", b, 3);
    assert_eq!(
        (beat.acknowledged_sequence, beat.fence_jobs),
        (3, vec!["j1".to_owned()])
    );
    assert!(
        s.fence_jobs("a").is_empty(),
        "the source has nothing to fence"
    );
    // A target that reconnects hears it in its welcome too.
    let b2 = s.register(13.0, hello("b"), "10.0.0.2:1".into());
    assert_eq!(b2.fence_jobs, ["j1"]);
    let b = b2.session_id;
    s.report(14.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    s.report(25.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    assert_eq!(phase(&s), MovePhase::Done);
    assert!(s.fence_jobs("b").is_empty());
}

/// What the coordinator does with a move's target that saved and stopped the job on its own
/// while the move waited for it (the node's fence, after losing the coordinator): the job did
/// not complete; it is started again, on one node, from its checkpoint.
#[test]
fn a_target_that_saved_the_job_on_its_own_during_the_move_has_it_started_again_not_completed() {
    let (mut s, a, b) = running_on_a();
    s.move_job(10.0, "j1", Some("b"), "govctl move").unwrap();
    s.report(12.0, "a", a, j1(RunState::Exited, 0, true))
        .unwrap();
    assert_eq!(
        commands(&mut s),
        ["save j1 on a", "start j1 on b attempt 1"]
    );
    s.report(13.0, "b", b, j1(RunState::Running, 1, false))
        .unwrap();
    // Cut off, b fenced it: saved and exited. It comes back and says so.
    let b2 = s.register(60.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.take_outbox();
    s.report(61.0, "b", b2, j1(RunState::Exited, 1, true))
        .unwrap();
    s.tick(61.0);
    s.report(62.0, "b", b2, j1(RunState::Exited, 1, true))
        .unwrap();
    s.tick(62.0);
    // The move counts done (the job ran on its target); the saved run is started again
    // where it is, from the checkpoint it just wrote.
    assert_eq!(commands(&mut s), ["start j1 on b attempt 2"]);
    assert_eq!(phase(&s), MovePhase::Done);
    assert_ne!(s.job_record("j1").unwrap().status, JobState::Completed);
    assert!(!s.job_record("j1").unwrap().status.is_finished());
}

/// j1 (a framework checkpoint, converged, 0.5 core) on a full `a` that asks to move it, `b`
/// idle; j1's first epoch (of 5 s, one of two) is reported at `first_epoch_at` (it was placed at
/// 1 s), then `a` asks. Returns the start measured and whether j1 moved.
fn move_after_a_start_of(first_epoch_at: f64) -> (Option<f64>, bool) {
    let mut s = ClusterState::new(
        StateConfig {
            rebalance: false,
            ..StateConfig::default()
        },
        "first-fit",
    )
    .unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.submit(1.0, movable("train"));
    let on_a = |epoch: Option<u64>, ask: bool| {
        let mut r = j1(RunState::Running, 0, false);
        let job = &mut r.jobs[0];
        job.category = Category::Converged;
        job.cpu_cores = 0.5;
        job.epoch = epoch;
        job.max_epochs = Some(2);
        job.epoch_seconds = epoch.map(|_| 5.0);
        r.cpu_used_cores = 3.9;
        if ask {
            r.move_requests = vec![MoveRequest {
                job_id: "j1".into(),
                reason: "converged while others progress".into(),
            }];
        }
        r
    };
    s.report(2.0, "a", a, on_a(None, false)).unwrap();
    s.report(first_epoch_at, "a", a, on_a(Some(1), false))
        .unwrap();
    for t in [1.0, 20.0, 40.0].map(|d| first_epoch_at + d) {
        s.report(t, "a", a, on_a(Some(1), true)).unwrap();
        s.report(t, "b", b, idle()).unwrap();
        s.tick(t);
    }
    let job = s.job_record("j1").unwrap();
    (job.start_s, !job.moves.is_empty())
}

#[test]
fn a_framework_move_pays_for_the_jobs_measured_start_as_well_as_its_save() {
    // Gain: b's 4 free cores for the 5 s left = 20 core-s, against twice the pause of half a
    // core. A 1 s start: a 1.1 s pause, 1.1 core-s doubled: the move pays.
    let (start, moved) = move_after_a_start_of(7.0);
    assert_eq!(start, Some(1.0), "7 s - 1 s placed - one 5 s epoch");
    assert!(moved, "a short start: the move pays");
    // A 30 s start (a framework's import and graph building, slow): a 30.1 s pause, 30.1
    // core-s doubled against 20: the save alone (0.1 s) would have let it through.
    let (start, moved) = move_after_a_start_of(36.0);
    assert_eq!(start, Some(30.0));
    assert!(
        !moved,
        "the start again on the target costs more than the move gives back"
    );
}

#[test]
fn a_start_is_measured_on_the_first_start_s_first_epoch_only() {
    use super::super::nodes::measured_start;
    let mut r = JobReport::running("j1", "train");
    r.epoch = Some(2);
    r.epoch_seconds = Some(4.0);
    assert_eq!(
        measured_start(10.0, 25.0, &r),
        Some(7.0),
        "15 s less two 4 s epochs"
    );
    assert_eq!(measured_start(10.0, 15.0, &r), Some(0.0), "never below 0");
    r.attempt = 1;
    assert_eq!(
        measured_start(10.0, 25.0, &r),
        None,
        "a resumed start rereads old epochs"
    );
    r.attempt = 0;
    r.replica = 1;
    assert_eq!(
        measured_start(10.0, 25.0, &r),
        None,
        "replica 0 speaks for a gang"
    );
    r.replica = 0;
    r.epoch = Some(0);
    assert_eq!(measured_start(10.0, 25.0, &r), None, "no epoch done yet");
    r.epoch = Some(1);
    r.epoch_seconds = None;
    assert_eq!(
        measured_start(10.0, 25.0, &r),
        None,
        "an epoch of unknown length"
    );
    r.epoch_seconds = Some(f64::NAN);
    assert_eq!(measured_start(10.0, 25.0, &r), None);
}
