//! Preemption by checkpoint, driven by hand: the displaced job is saved, requeued at the head
//! of its priority and resumed; nothing is killed.

use governor_proto::control::{JobSpec, JobState, MovePhase};
use governor_proto::node::{Checkpoint, JobReport, NodeCommand, NodeReport, RunState};

use super::super::moves::tests::hello;
use super::super::{ClusterState, StateConfig};

/// Nodes are never lost here (the tests report only when something changes).
pub(crate) fn config() -> StateConfig {
    StateConfig {
        lost_after_s: 1e6,
        ..StateConfig::default()
    }
}

/// A job reserving the whole of a 4-core node, with a framework checkpoint on a shared path
/// (`carry`: in the node's own directory, carried by the coordinator).
fn whole_node(name: &str, priority: i32, carry: bool) -> JobSpec {
    JobSpec {
        cores: Some(4.0),
        priority,
        checkpoint: Some(Checkpoint {
            dir: format!("/shared/ckpt/{name}"),
            save_signal: 10,
            carry,
            transparent: false,
        }),
        ..JobSpec::new(name, vec!["train".into()], "/shared/train.log")
    }
}

/// A node's report: (job, state, attempt, saved).
pub(crate) fn report(jobs: &[(&str, RunState, u32, bool)]) -> NodeReport {
    NodeReport {
        jobs: jobs
            .iter()
            .map(|&(id, state, attempt, saved)| {
                let mut j = JobReport::running(id, id);
                j.state = state;
                j.attempt = attempt;
                j.saved = saved;
                if state == RunState::Exited {
                    j.exit_code = Some(0);
                }
                j
            })
            .collect(),
        ..NodeReport::default()
    }
}

fn commands(s: &mut ClusterState) -> Vec<String> {
    s.take_outbox()
        .into_iter()
        .map(|(node, c)| match c {
            NodeCommand::Start(st) => format!(
                "start {} on {node} attempt {}{}",
                st.job_id,
                st.attempt,
                if st.carried_checkpoint {
                    " carried"
                } else {
                    ""
                }
            ),
            NodeCommand::Stop(st) => format!("stop {} on {node}", st.job_id),
            NodeCommand::Save(st) => format!("save {} on {node}", st.job_id),
            NodeCommand::Upload(u) => format!("upload {} from {node}", u.job_id),
            other => format!("{other:?}"),
        })
        .collect()
}

pub(crate) fn status(s: &ClusterState, id: &str) -> JobState {
    s.job_record(id).unwrap().status
}

/// Nodes a and b (4 cores each), j1 on a and j2 on b, each reserving its whole node at
/// priority 0, running since t=2.
fn full_cluster(carry: bool) -> (ClusterState, u64, u64) {
    let mut s = ClusterState::new(config(), "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let b = s.register(0.0, hello("b"), "10.0.0.2:1".into()).session_id;
    s.submit(1.0, whole_node("low1", 0, carry));
    s.submit(1.0, whole_node("low2", 0, carry));
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    s.report(2.0, "b", b, report(&[("j2", RunState::Running, 0, false)]))
        .unwrap();
    assert_eq!(
        commands(&mut s),
        ["start j1 on a attempt 0", "start j2 on b attempt 0"]
    );
    (s, a, b)
}

#[test]
fn a_high_priority_job_displaces_a_low_one_by_checkpoint_which_resumes_after_it() {
    let (mut s, a, _b) = full_cluster(false);
    // Urgent arrives before the low jobs ran their minimum time: it waits.
    s.submit(30.0, whole_node("urgent", 10, false));
    assert_eq!(status(&s, "j3"), JobState::Queued);
    assert!(commands(&mut s).is_empty());
    // Past the minimum run time: j1 (first by name among equals) is asked to save.
    s.tick(62.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    let j1 = s.job_detail("j1").unwrap();
    assert_eq!(
        j1.summary.moving.as_deref(),
        Some("saving on a to make room for j3 (preempted)")
    );
    assert!(
        j1.moves[0]
            .reason
            .starts_with("preempted: j3 of priority 10"),
        "{}",
        j1.moves[0].reason
    );
    // One preemption at a time: no second victim while j1 saves.
    s.tick(63.0);
    assert!(commands(&mut s).is_empty());
    assert_eq!(status(&s, "j2"), JobState::Running);

    // j1 saved and exited: requeued (not completed), urgent starts on a.
    s.report(65.0, "a", a, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    s.dispatch_if_needed(65.0);
    assert_eq!(status(&s, "j1"), JobState::Queued);
    assert_eq!(
        s.job_record("j1").unwrap().moves[0].phase,
        MovePhase::Requeued
    );
    assert_eq!(commands(&mut s), ["start j3 on a attempt 0"]);
    s.report(
        66.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Exited, 0, true),
            ("j3", RunState::Running, 0, false),
        ]),
    )
    .unwrap();
    assert_eq!(status(&s, "j3"), JobState::Running);
    // No chain: the requeued j1 does not displace j2 (same priority anyway) nor anyone.
    s.tick(200.0);
    assert!(commands(&mut s).is_empty());
    assert_eq!(status(&s, "j2"), JobState::Running);

    // Urgent completes: j1 resumes on a, its next attempt, from the shared checkpoint.
    s.report(
        210.0,
        "a",
        a,
        report(&[
            ("j1", RunState::Exited, 0, true),
            ("j3", RunState::Running, 0, false),
        ]),
    )
    .unwrap();
    s.report(300.0, "a", a, report(&[("j3", RunState::Exited, 0, false)]))
        .unwrap();
    s.dispatch_if_needed(300.0);
    assert_eq!(status(&s, "j3"), JobState::Completed);
    assert_eq!(commands(&mut s), ["start j1 on a attempt 1"]);
    s.report(
        301.0,
        "a",
        a,
        report(&[("j1", RunState::Running, 1, false)]),
    )
    .unwrap();
    s.report(
        312.0,
        "a",
        a,
        report(&[("j1", RunState::Running, 1, false)]),
    )
    .unwrap();
    let mv = &s.job_record("j1").unwrap().moves[0];
    assert_eq!(
        (mv.phase, mv.from_node.as_str(), mv.to_node.as_str()),
        (MovePhase::Done, "a", "a")
    );
    assert_eq!(mv.preempted_for.as_deref(), Some("j3"));
    assert_eq!(status(&s, "j1"), JobState::Running);
}

#[test]
fn a_requeued_job_goes_before_jobs_of_its_priority_that_never_ran() {
    let (mut s, a, _b) = full_cluster(false);
    s.submit(30.0, whole_node("urgent", 10, false));
    s.submit(31.0, whole_node("later", 0, false));
    s.tick(62.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    s.report(65.0, "a", a, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    s.dispatch_if_needed(65.0);
    assert_eq!(commands(&mut s), ["start j3 on a attempt 0"]);
    let queue: Vec<String> = s.queue.iter().map(|q| q.id.clone()).collect();
    assert_eq!(queue, ["j1", "j4"], "the preempted job first");
}

#[test]
fn without_a_shared_path_the_checkpoint_is_carried_and_a_resume_elsewhere_gets_it() {
    let (mut s, a, b) = full_cluster(true);
    s.submit(30.0, whole_node("urgent", 10, false));
    s.tick(62.0);
    assert_eq!(commands(&mut s), ["save j1 on a"]);
    s.report(65.0, "a", a, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    assert_eq!(commands(&mut s), ["upload j1 from a"]);
    assert_eq!(
        s.job_detail("j1").unwrap().summary.moving.as_deref(),
        Some("carrying its checkpoint from a to the coordinator (preempted)")
    );
    // Urgent may start at once on a (j1 has exited there).
    s.dispatch_if_needed(65.0);
    assert_eq!(commands(&mut s), ["start j3 on a attempt 0"]);
    s.checkpoint_arrived(66.0, "j1", "a", Ok(4096));
    s.dispatch_if_needed(66.0);
    assert_eq!(status(&s, "j1"), JobState::Queued);
    // b frees first: j1 resumes there, with the carried checkpoint.
    s.report(100.0, "b", b, report(&[("j2", RunState::Exited, 0, false)]))
        .unwrap();
    s.dispatch_if_needed(100.0);
    assert_eq!(commands(&mut s), ["start j1 on b attempt 1 carried"]);
}

#[test]
fn nothing_is_displaced_without_priority_checkpoint_or_when_switched_off() {
    // Equal priority: the newcomer waits.
    let (mut s, _a, _b) = full_cluster(false);
    s.submit(30.0, whole_node("peer", 0, false));
    s.tick(100.0);
    assert!(commands(&mut s).is_empty());

    // Switched off.
    let (mut s, _a, _b) = full_cluster(false);
    s.config.preemption = false;
    s.submit(30.0, whole_node("urgent", 10, false));
    s.tick(100.0);
    assert!(commands(&mut s).is_empty());

    // Running jobs that cannot be saved (no checkpoint, nodes without CRIU) stay.
    let mut s = ClusterState::new(config(), "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    let mut plain = whole_node("plain", 0, false);
    plain.checkpoint = None;
    s.submit(1.0, plain);
    s.report(2.0, "a", a, report(&[("j1", RunState::Running, 0, false)]))
        .unwrap();
    s.submit(30.0, whole_node("urgent", 10, false));
    s.tick(100.0);
    assert_eq!(commands(&mut s), ["start j1 on a attempt 0"]);
    assert_eq!(status(&s, "j2"), JobState::Queued);
}

#[test]
fn a_preempted_job_cancelled_while_queued_ends_cancelled_and_the_queue_forgets_it() {
    let (mut s, a, _b) = full_cluster(false);
    s.submit(30.0, whole_node("urgent", 10, false));
    s.tick(62.0);
    s.report(65.0, "a", a, report(&[("j1", RunState::Exited, 0, true)]))
        .unwrap();
    s.dispatch_if_needed(65.0);
    s.cancel(70.0, "j1").unwrap();
    assert_eq!(status(&s, "j1"), JobState::Cancelled);
    assert!(s.queue.get("j1").is_none());
}

/// A job reserving half of a 4-core node, with a framework checkpoint on a shared path.
fn half_node(name: &str, priority: i32) -> JobSpec {
    JobSpec {
        cores: Some(2.0),
        ..whole_node(name, priority, false)
    }
}

#[test]
fn the_room_a_preemption_makes_goes_to_the_job_it_is_made_for_not_back_to_the_saved_ones() {
    // One node of 4 cores, two low-priority jobs of 2 cores each on it.
    let mut s = ClusterState::new(config(), "first-fit").unwrap();
    let a = s.register(0.0, hello("a"), "10.0.0.1:1".into()).session_id;
    s.submit(1.0, half_node("low1", 0));
    s.submit(1.0, half_node("low2", 0));
    let both = |state: [RunState; 2], attempt: u32, saved: [bool; 2]| {
        report(&[
            ("j1", state[0], attempt, saved[0]),
            ("j2", state[1], attempt, saved[1]),
        ])
    };
    let running = [RunState::Running, RunState::Running];
    s.report(2.0, "a", a, both(running, 0, [false, false]))
        .unwrap();
    commands(&mut s);
    // The urgent job needs the whole node: both are asked to save.
    s.submit(70.0, whole_node("urgent", 10, false));
    assert_eq!(commands(&mut s), ["save j1 on a", "save j2 on a"]);
    // j1 is saved first: its 2 cores are free, not enough for j3. j1 is queued again, and must
    // not take its room back while j3 waits for j2's save.
    let half_saved = both([RunState::Exited, RunState::Running], 0, [true, false]);
    s.handle(
        72.0,
        crate::Input::Report {
            node: "a".into(),
            session: a,
            report: half_saved.clone(),
        },
    );
    s.handle(73.0, crate::Input::Tick);
    assert_eq!(status(&s, "j1"), JobState::Queued);
    assert!(commands(&mut s).is_empty(), "the node is held for j3");
    // j2 saved: the node is free, and j3 gets it.
    let saved = both([RunState::Exited, RunState::Exited], 0, [true, true]);
    s.handle(
        75.0,
        crate::Input::Report {
            node: "a".into(),
            session: a,
            report: saved,
        },
    );
    assert_eq!(commands(&mut s), ["start j3 on a attempt 0"]);
    assert_eq!(status(&s, "j2"), JobState::Queued);
}
