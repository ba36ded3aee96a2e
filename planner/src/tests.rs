//! The state machine driven by hand: registrations, reports, submissions, ticks.

use governor_proto::control::{JobSpec, JobState, NodeState};
use governor_proto::node::{
    Category, Hello, JobOrigin, JobReport, NodeCapacity, NodeCommand, NodeReport, RunState,
};

use super::*;
use governor_proto::node::GpuDevice;

const GIB: u64 = 1 << 30;

fn hello(name: &str, gpus: u32) -> Hello {
    Hello {
        node_name: name.into(),
        capacity: NodeCapacity {
            cores: 8.0,
            memory_bytes: 32 * GIB,
            gpus: (0..gpus)
                .map(|i| GpuDevice {
                    index: i,
                    model: "A100".into(),
                    memory_bytes: 40 * GIB,
                })
                .collect(),
        },
        agent_version: "test".into(),
        can_dump: false,
    }
}

fn spec(name: &str, gpus: u32) -> JobSpec {
    JobSpec {
        gpus,
        ..JobSpec::new(name, vec!["train".into()], "/tmp/train.log")
    }
}

fn starts(out: &[(String, NodeCommand)]) -> Vec<(String, String, u32)> {
    out.iter()
        .filter_map(|(n, c)| match c {
            NodeCommand::Start(s) => Some((n.clone(), s.job_id.clone(), s.replica)),
            _ => None,
        })
        .collect()
}

fn running(id: &str, category: Category) -> JobReport {
    JobReport {
        category,
        ..JobReport::running(id, id)
    }
}

fn report_of(jobs: Vec<JobReport>) -> NodeReport {
    NodeReport {
        jobs,
        ..NodeReport::default()
    }
}

/// Two connected nodes under first-fit.
fn two_nodes() -> (ClusterState, u64, u64) {
    let mut s = ClusterState::new(StateConfig::default(), "first-fit").unwrap();
    let a = s
        .register(0.0, hello("a", 2), "10.0.0.1:1".into())
        .session_id;
    let b = s
        .register(0.0, hello("b", 2), "10.0.0.2:1".into())
        .session_id;
    (s, a, b)
}

#[test]
fn a_nodes_move_requests_are_kept_on_its_jobs_until_withdrawn() {
    let (mut s, a, _) = two_nodes();
    s.submit(1.0, spec("vae", 1));
    s.take_outbox();
    let mut report = report_of(vec![
        running("j1", Category::Converged),
        JobReport {
            origin: JobOrigin::Local,
            ..running("/docker/abc", Category::Progressing)
        },
    ]);
    report.move_requests = vec![
        governor_proto::node::MoveRequest {
            job_id: "j1".into(),
            reason: "converged while others progress".into(),
        },
        // A request for a job the report does not carry is ignored.
        governor_proto::node::MoveRequest {
            job_id: "j9".into(),
            reason: "?".into(),
        },
    ];
    s.report(2.0, "a", a, report.clone()).unwrap();
    let asked = s.job_detail("j1").unwrap().summary.move_request;
    assert_eq!(
        asked.as_deref(),
        Some("node a asks: converged while others progress")
    );
    assert_eq!(
        s.jobs
            .get("j1")
            .unwrap()
            .move_request
            .as_ref()
            .unwrap()
            .since,
        2.0
    );
    assert_eq!(
        s.job_detail("a//docker/abc").unwrap().summary.move_request,
        None
    );
    // Asked again: the request keeps its start.
    s.report(3.0, "a", a, report.clone()).unwrap();
    assert_eq!(
        s.jobs
            .get("j1")
            .unwrap()
            .move_request
            .as_ref()
            .unwrap()
            .since,
        2.0
    );
    // Withdrawn.
    report.move_requests.clear();
    s.report(4.0, "a", a, report).unwrap();
    assert_eq!(s.job_detail("j1").unwrap().summary.move_request, None);
}

#[test]
fn a_node_cannot_report_or_ask_to_move_another_nodes_job() {
    let (mut s, a, b) = two_nodes();
    s.submit(1.0, spec("vae", 1));
    s.take_outbox();
    assert_eq!(s.job_detail("j1").unwrap().summary.members[0].node, "a");
    // Node b claims j1 (placed on a) has failed and asks to move it.
    let mut claim = JobReport {
        state: RunState::Failed,
        message: "claimed by b".into(),
        ..running("j1", Category::Converged)
    };
    claim.exit_code = Some(1);
    let mut report = report_of(vec![claim]);
    report.move_requests = vec![governor_proto::node::MoveRequest {
        job_id: "j1".into(),
        reason: "b wants it gone".into(),
    }];
    s.report(2.0, "b", b, report).unwrap();
    let job = s.job_detail("j1").unwrap().summary;
    assert_eq!(job.move_request, None, "{job:?}");
    assert_eq!(job.category, Category::Unknown, "{job:?}");
    assert_ne!(job.members[0].state, RunState::Failed, "{job:?}");
    // Its own node still can.
    let mut report = report_of(vec![running("j1", Category::Converged)]);
    report.move_requests = vec![governor_proto::node::MoveRequest {
        job_id: "j1".into(),
        reason: "converged".into(),
    }];
    s.report(3.0, "a", a, report).unwrap();
    assert_eq!(
        s.job_detail("j1").unwrap().summary.move_request.as_deref(),
        Some("node a asks: converged")
    );
}

#[test]
fn nodes_joining_in_any_order_keep_the_view_in_name_order() {
    let mut s = ClusterState::new(StateConfig::default(), "round-robin").unwrap();
    for name in ["m", "c", "x", "a", "q", "b"] {
        s.register(0.0, hello(name, 1), format!("{name}:1"));
    }
    let names: Vec<&str> = s.view().nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "m", "q", "x"]);
    for (i, n) in s.view().nodes.iter().enumerate() {
        assert_eq!(s.view_index[&n.name], i, "index of {}", n.name);
        assert_eq!(n.gpus.len(), 1, "{} synced from its hello", n.name);
    }
    // A job is placed on a node that joined after others (the view works, not just sorts).
    s.submit(1.0, spec("j", 1));
    assert_eq!(starts(&s.take_outbox()).len(), 1);
}

#[test]
fn a_jobs_output_is_on_its_members_node_and_its_decision_shows_while_it_runs() {
    let (mut s, a, _) = two_nodes();
    s.submit(1.0, spec("resnet", 1));
    s.take_outbox();
    assert_eq!(
        s.output_source("j1", 0),
        Ok(OutputSource::Node {
            node: "a".into(),
            name: "resnet".into(),
            replicas: 1,
            finished: false
        })
    );
    assert!(matches!(
        s.output_source("j1", 1),
        Err(ControlError::NoOutput { .. })
    ));
    assert!(matches!(
        s.output_source("j9", 0),
        Err(ControlError::NoSuchJob { .. })
    ));
    let mut r = running("j1", Category::Progressing);
    r.decision = "weight 9000: progressing".into();
    s.report(2.0, "a", a, report_of(vec![r])).unwrap();
    assert_eq!(s.list_jobs(false)[0].decision, "weight 9000: progressing");
    // A second job waits (the GPUs are taken): no output yet, nowhere.
    let queued = (0..6)
        .map(|i| s.submit(3.0, spec(&format!("more{i}"), 1)))
        .find(|j| j.status == JobState::Queued)
        .expect("a job waits for a GPU");
    assert_eq!(s.output_source(&queued.id, 0), Ok(OutputSource::NotPlaced));
}

#[test]
fn a_job_its_node_stopped_at_convergence_completed_whatever_its_exit_status() {
    let (mut s, a, _) = two_nodes();
    s.submit(1.0, spec("trial", 0));
    s.take_outbox();
    s.report(
        2.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Progressing)]),
    )
    .unwrap();
    let mut ended = running("j1", Category::Converged);
    ended.state = RunState::Exited;
    ended.exit_code = Some(130);
    ended.converged = true;
    ended.message =
        "stopped: converged (best loss 0.5); the interrupted process exited with 130".into();
    s.report(3.0, "a", a, report_of(vec![ended.clone()]))
        .unwrap();
    let j = &s.list_jobs(true)[0];
    assert_eq!(j.status, JobState::Completed, "{j:?}");
    assert!(j.message.contains("stopped: converged"), "{j:?}");
    // Without the node's word, the same exit is a failure.
    s.submit(4.0, spec("other", 0));
    s.take_outbox();
    let mut crashed = ended;
    crashed.job_id = "j2".into();
    crashed.converged = false;
    s.report(5.0, "a", a, report_of(vec![crashed])).unwrap();
    let j2 = s
        .list_jobs(true)
        .into_iter()
        .find(|j| j.id == "j2")
        .unwrap();
    assert_eq!(j2.status, JobState::Failed, "{j2:?}");
}

#[test]
fn a_submitted_job_is_placed_started_and_runs() {
    let (mut s, a, _) = two_nodes();
    let job = s.submit(1.0, spec("resnet", 1));
    assert_eq!(job.id, "j1");
    assert_eq!(job.status, JobState::Starting);
    let out = s.take_outbox();
    assert_eq!(starts(&out), [("a".to_string(), "j1".to_string(), 0)]);
    let NodeCommand::Start(start) = &out[0].1 else {
        unreachable!()
    };
    assert_eq!(start.gpu_indices, [0]);
    assert_eq!(start.env["GOVERNOR_JOB_ID"], "j1");
    assert_eq!(start.env["GOVERNOR_MASTER_ADDR"], "10.0.0.1");
    s.report(
        2.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Progressing)]),
    )
    .unwrap();
    let j = &s.list_jobs(false)[0];
    assert_eq!(j.status, JobState::Running);
    assert_eq!(j.category, Category::Progressing);
    let d = s.job_detail("j1").unwrap();
    assert_eq!(d.placements[0].policy, "first-fit");
    assert_eq!(d.placements[0].node, "a");
    assert!(d.placements[0].reason.contains("first node"));
}

#[test]
fn gpus_are_reserved_until_the_job_ends() {
    let (mut s, a, _) = two_nodes();
    s.submit(0.0, spec("x", 2));
    s.submit(0.0, spec("y", 2));
    let third = s.submit(0.0, spec("z", 1));
    assert_eq!(third.status, JobState::Queued);
    assert!(
        third.message.contains("fewer than 1 free GPUs"),
        "{}",
        third.message
    );
    // x finishes on a: z gets a GPU there.
    let mut done = running("j1", Category::Converged);
    done.state = RunState::Exited;
    done.exit_code = Some(0);
    s.report(5.0, "a", a, report_of(vec![done])).unwrap();
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Completed);
    s.tick(5.5);
    assert_eq!(s.job_record("j3").unwrap().status, JobState::Starting);
    assert_eq!(s.job_record("j3").unwrap().members[0].node, "a");
}

#[test]
fn a_silent_node_is_lost_and_its_jobs_unknown_until_it_reports_again() {
    let (mut s, a, b) = two_nodes();
    s.submit(0.0, spec("x", 0));
    s.report(
        1.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Watching)]),
    )
    .unwrap();
    s.report(1.0, "b", b, report_of(vec![])).unwrap();
    s.tick(5.0);
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Running);
    // b keeps reporting, a stops.
    s.report(11.5, "b", b, report_of(vec![])).unwrap();
    s.tick(11.5);
    let nodes = s.list_nodes(11.5);
    assert_eq!(nodes[0].status, NodeState::Lost);
    assert_eq!(nodes[1].status, NodeState::Ready);
    let job = s.job_record("j1").unwrap();
    assert_eq!(job.status, JobState::Unknown);
    assert!(job.message.contains("node a is lost"), "{}", job.message);
    // New jobs avoid the lost node.
    s.submit(12.0, spec("y", 0));
    assert_eq!(s.job_record("j2").unwrap().members[0].node, "b");
    // a comes back (new session) and re-syncs: the job runs again, nothing was dropped.
    let a2 = s
        .register(20.0, hello("a", 2), "10.0.0.1:2".into())
        .session_id;
    let job = s.job_record("j1").unwrap();
    assert_eq!(
        job.status,
        JobState::Unknown,
        "not confirmed before the node's first report"
    );
    assert!(
        job.message.contains("waiting for its first report"),
        "{}",
        job.message
    );
    s.report(
        20.0,
        "a",
        a2,
        report_of(vec![running("j1", Category::Watching)]),
    )
    .unwrap();
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Running);
    // The old session is refused.
    assert_eq!(
        s.report(20.0, "a", a, report_of(vec![])),
        Err(SessionError::Stale { node: "a".into() })
    );
}

#[test]
fn a_start_the_node_never_confirms_fails_after_the_timeout() {
    let (mut s, a, _) = two_nodes();
    s.submit(0.0, spec("x", 0));
    s.report(30.0, "a", a, report_of(vec![])).unwrap();
    assert_eq!(s.job_record("j1").unwrap().status, JobState::Starting);
    s.report(61.0, "a", a, report_of(vec![])).unwrap();
    let job = s.job_record("j1").unwrap();
    assert_eq!(job.status, JobState::Failed);
    assert!(
        job.message.contains("did not start it within 60 s"),
        "{}",
        job.message
    );
}

#[test]
fn a_node_that_reconnects_gets_the_unconfirmed_starts_again() {
    let (mut s, a, _) = two_nodes();
    s.submit(0.0, spec("x", 0));
    s.take_outbox();
    s.disconnected("a", a);
    let w = s.register(2.0, hello("a", 2), "10.0.0.1:2".into());
    assert_ne!(w.session_id, a);
    assert_eq!(
        starts(&s.take_outbox()),
        [("a".to_string(), "j1".to_string(), 0)]
    );
}

#[test]
fn a_failed_gang_member_stops_the_others() {
    let (mut s, a, b) = two_nodes();
    let mut gang = spec("ddp", 1);
    gang.replicas = 2;
    s.submit(0.0, gang);
    let out = s.take_outbox();
    assert_eq!(
        starts(&out),
        [
            ("a".to_string(), "j1".to_string(), 0),
            ("b".to_string(), "j1".to_string(), 1)
        ]
    );
    let NodeCommand::Start(st) = &out[1].1 else {
        unreachable!()
    };
    assert_eq!(st.env["GOVERNOR_WORLD_SIZE"], "2");
    assert_eq!(st.env["GOVERNOR_RANK"], "1");
    s.report(
        1.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Unknown)]),
    )
    .unwrap();
    let mut failed = running("j1", Category::Unknown);
    failed.replica = 1;
    failed.state = RunState::Failed;
    failed.message = "CUDA out of memory".into();
    s.report(1.0, "b", b, report_of(vec![failed])).unwrap();
    let job = s.job_record("j1").unwrap();
    assert_eq!(job.status, JobState::Failed);
    assert!(
        job.message
            .contains("member 1 on node b failed: CUDA out of memory"),
        "{}",
        job.message
    );
    let out = s.take_outbox();
    assert!(
        out.iter()
            .any(|(n, c)| n == "a" && matches!(c, NodeCommand::Stop(st) if st.job_id == "j1")),
        "{out:?}"
    );
}

#[test]
fn cancel_stops_a_running_job_and_refuses_twice() {
    let (mut s, a, _) = two_nodes();
    s.submit(0.0, spec("x", 0));
    s.report(
        1.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Unknown)]),
    )
    .unwrap();
    s.take_outbox();
    assert_eq!(s.cancel(2.0, "j1").unwrap().status, JobState::Cancelled);
    assert!(matches!(&s.take_outbox()[..], [(n, NodeCommand::Stop(_))] if n == "a"));
    assert_eq!(
        s.cancel(3.0, "j1").unwrap_err().to_string(),
        "job j1 already cancelled; nothing to cancel"
    );
    assert_eq!(
        s.cancel(3.0, "j9").unwrap_err().to_string(),
        "no job j9: `govctl jobs --all` lists the known jobs"
    );
    // Still running there on the next report: stop is resent once per session, not per report.
    s.report(
        4.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Unknown)]),
    )
    .unwrap();
    s.report(
        5.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Unknown)]),
    )
    .unwrap();
    assert_eq!(s.take_outbox().len(), 1);
}

#[test]
fn local_jobs_are_listed_under_their_node_and_leave_when_the_node_drops_them() {
    let (mut s, a, _) = two_nodes();
    let mut local = running("pytorch-1234", Category::Progressing);
    local.origin = JobOrigin::Local;
    local.gpu_indices = vec![1];
    s.report(1.0, "a", a, report_of(vec![local])).unwrap();
    let jobs = s.list_jobs(false);
    assert_eq!(jobs[0].id, "a/pytorch-1234");
    assert!(jobs[0].local);
    // Its GPU is not free for placement.
    assert_eq!(s.view().nodes[0].free_gpus(), vec![0]);
    assert!(matches!(
        s.cancel(2.0, "a/pytorch-1234"),
        Err(ControlError::LocalJob { .. })
    ));
    s.report(2.0, "a", a, report_of(vec![])).unwrap();
    assert!(s.list_jobs(true).is_empty());
    assert!(s.take_dirty().removed_jobs.contains("a/pytorch-1234"));
}

#[test]
fn category_history_and_progress_are_kept() {
    let (mut s, a, _) = two_nodes();
    s.submit(0.0, spec("x", 0));
    for (t, cat, loss) in [
        (1.0, Category::Unknown, 2.0),
        (2.0, Category::Progressing, 1.0),
        (3.0, Category::Progressing, 0.5),
        (4.0, Category::Converged, 0.49),
    ] {
        let mut r = running("j1", cat);
        r.progress = Some(loss);
        s.report(t, "a", a, report_of(vec![r])).unwrap();
    }
    let d = s.job_detail("j1").unwrap();
    assert_eq!(
        d.categories
            .iter()
            .map(|c| (c.at_unix, c.category))
            .collect::<Vec<_>>(),
        [
            (1.0, Category::Unknown),
            (2.0, Category::Progressing),
            (4.0, Category::Converged)
        ]
    );
    assert_eq!(d.progress.len(), 4);
    assert_eq!(d.summary.progress, Some(0.49));
}

#[test]
fn progress_history_covers_the_whole_job_in_bounded_memory() {
    let (mut s, a, _) = two_nodes();
    s.submit(0.0, spec("x", 0));
    let limit = s.config().progress_samples;
    for t in 1..=10_000 {
        let mut r = running("j1", Category::Progressing);
        r.progress = Some(1.0 / t as f64);
        s.report(t as f64, "a", a, report_of(vec![r])).unwrap();
    }
    let d = s.job_detail("j1").unwrap();
    assert!(d.progress.len() <= limit && d.progress.len() >= limit / 2);
    assert_eq!(d.progress[0].at_unix, 1.0, "the start is kept");
    let newest = d.progress[d.progress.len() - 1];
    assert_eq!((newest.at_unix, newest.value), (10_000.0, 1e-4));
    // Evenly spread: no gap much wider than the average.
    let gaps: Vec<f64> = d
        .progress
        .windows(2)
        .map(|w| w[1].at_unix - w[0].at_unix)
        .collect();
    let mean = 9_999.0 / gaps.len() as f64;
    assert!(gaps.iter().all(|&g| g <= 2.0 * mean), "{gaps:?}");
}

#[test]
fn restore_keeps_every_job_and_resyncs() {
    let (mut s, a, _) = two_nodes();
    s.submit(0.0, spec("running", 0));
    s.submit(0.0, spec("waiting", 8));
    s.set_policy(0.0, "specon").unwrap();
    s.report(
        1.0,
        "a",
        a,
        report_of(vec![running("j1", Category::Progressing)]),
    )
    .unwrap();
    let nodes: Vec<NodeRecord> = ["a", "b"]
        .iter()
        .map(|n| s.node_record(n).unwrap().clone())
        .collect();
    let jobs: Vec<JobRecord> = ["j1", "j2"]
        .iter()
        .map(|j| s.job_record(j).unwrap().clone())
        .collect();
    let mut r =
        ClusterState::restore(StateConfig::default(), 100.0, Some(s.meta()), nodes, jobs).unwrap();
    assert_eq!(r.policy_state().current, "specon");
    assert_eq!(r.list_nodes(100.0)[0].status, NodeState::Resyncing);
    assert_eq!(r.job_record("j1").unwrap().status, JobState::Unknown);
    assert_eq!(r.job_record("j2").unwrap().status, JobState::Queued);
    let a2 = r.register(101.0, hello("a", 2), "x:1".into()).session_id;
    r.report(
        101.0,
        "a",
        a2,
        report_of(vec![running("j1", Category::Progressing)]),
    )
    .unwrap();
    assert_eq!(r.job_record("j1").unwrap().status, JobState::Running);
    // New ids continue after the restored ones.
    assert_eq!(r.submit(102.0, spec("next", 0)).id, "j3");
    // b has not come back yet: its agent may be between reconnection attempts, so it gets the
    // resync grace on top of the timeout before it is lost.
    let grace = StateConfig::default().resync_grace_s;
    r.tick(111.0);
    assert_eq!(r.list_nodes(111.0)[1].status, NodeState::Resyncing);
    r.tick(110.0 + grace);
    assert_eq!(r.list_nodes(110.0 + grace)[1].status, NodeState::Resyncing);
    r.tick(111.0 + grace);
    assert_eq!(r.list_nodes(111.0 + grace)[1].status, NodeState::Lost);
    // A node that reconnected has only the plain timeout again.
    r.tick(111.0 + grace);
    assert_eq!(r.list_nodes(111.0 + grace)[0].status, NodeState::Lost);
}
