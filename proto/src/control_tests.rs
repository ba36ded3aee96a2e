use super::*;
use crate::pb;

fn spec() -> JobSpec {
    let mut s = JobSpec::new(
        "resnet",
        vec!["python3".into(), "train.py".into()],
        "/tmp/resnet.log",
    );
    s.gpus = 2;
    s.priority = 3;
    s.cores = Some(2.0);
    s.gang_timeout_s = Some(60.0);
    s
}

#[test]
fn spec_round_trips() {
    let s = spec();
    assert_eq!(JobSpec::try_from(pb::JobSpec::from(s.clone())).unwrap(), s);
    assert!(s.is_gang());
}

#[test]
fn spec_rejects_what_a_node_could_not_run() {
    let mut m = pb::JobSpec::from(spec());
    m.argv.clear();
    assert_eq!(JobSpec::try_from(m).unwrap_err().field, "argv");
    let mut m = pb::JobSpec::from(spec());
    m.log_path = "train.log".into();
    assert_eq!(JobSpec::try_from(m).unwrap_err().field, "log_path");
    let mut m = pb::JobSpec::from(spec());
    m.cores = Some(f64::NAN);
    assert_eq!(JobSpec::try_from(m).unwrap_err().field, "cores");
    let mut m = pb::JobSpec::from(spec());
    m.gpus = 1000;
    assert_eq!(JobSpec::try_from(m).unwrap_err().field, "gpus");
    let mut m = pb::JobSpec::from(spec());
    m.name = "  ".into();
    assert_eq!(JobSpec::try_from(m).unwrap_err().field, "name");
}

#[test]
fn an_elastic_job_declares_a_range_from_its_cores_and_a_framework_checkpoint() {
    let elastic = || {
        let mut s = spec();
        s.gpus = 0;
        s.max_cores = Some(4.0);
        s.checkpoint = Some(Checkpoint {
            dir: "/shared/ck".into(),
            save_signal: 10,
            carry: false,
            transparent: false,
        });
        s
    };
    let s = elastic();
    assert!(s.is_elastic());
    assert_eq!(JobSpec::try_from(pb::JobSpec::from(s.clone())).unwrap(), s);
    let refused = |s: JobSpec| {
        let e = JobSpec::try_from(pb::JobSpec::from(s)).unwrap_err();
        assert_eq!(e.field, "max_cores");
        e.to_string()
    };
    let mut s = elastic();
    s.max_cores = Some(1.0);
    assert!(refused(s).contains("below the job's least cores"));
    let mut s = elastic();
    s.cores = None;
    assert!(refused(s).contains("least cores"));
    let mut s = elastic();
    s.gpus = 1;
    assert!(refused(s).contains("single-member"));
    let mut s = elastic();
    s.checkpoint = Some(Checkpoint::transparent());
    assert!(refused(s).contains("framework checkpoint"));
    let mut s = elastic();
    s.checkpoint = None;
    assert!(refused(s).contains("framework checkpoint"));
}

#[test]
fn zero_replicas_means_one() {
    let mut m = pb::JobSpec::from(spec());
    m.replicas = 0;
    assert_eq!(JobSpec::try_from(m).unwrap().replicas, 1);
}

#[test]
fn summary_and_detail_round_trip() {
    let summary = JobSummary {
        id: "j1".into(),
        name: "resnet".into(),
        status: JobState::Running,
        priority: 0,
        gpus: 1,
        replicas: 1,
        members: vec![JobMember {
            replica: 0,
            node: "node2".into(),
            gpu_indices: vec![0],
            state: RunState::Running,
        }],
        category: Category::Watching,
        progress: Some(0.3),
        cpu_cores: 1.0,
        cpu_limit_cores: Some(0.5),
        memory_bytes: 5,
        submitted_at_unix: 1.0,
        started_at_unix: Some(2.0),
        finished_at_unix: None,
        message: String::new(),
        local: false,
        move_request: Some("node n1 asks: converged".into()),
        time_to_quality_s: Some(42.0),
        moving: Some("saving on node2 for node3".into()),
        cores: Some(2.0),
        gpu_energy_joules: Some(1500.0),
        decision: "weight 9000: progressing".into(),
    };
    let detail = JobDetail {
        summary: summary.clone(),
        spec: Some(spec()),
        progress: vec![ProgressSample {
            at_unix: 3.0,
            value: 0.3,
        }],
        categories: vec![CategoryChange {
            at_unix: 3.0,
            category: Category::Watching,
        }],
        placements: vec![PlacementDecision {
            at_unix: 1.5,
            policy: "flowcon".into(),
            replica: 0,
            node: "node2".into(),
            gpu_indices: vec![0],
            reason: "lowest score".into(),
            candidates: vec![CandidateScore {
                node: "node2".into(),
                score: 0.0,
                note: "empty".into(),
            }],
        }],
        moves: vec![JobMove {
            from_node: "node1".into(),
            to_node: "node2".into(),
            reason: "govctl move".into(),
            phase: MovePhase::Done,
            requested_at_unix: 10.0,
            saved_at_unix: Some(12.5),
            running_at_unix: Some(14.0),
            message: "checkpoint in /shared/ckpt (shared path)".into(),
            bytes: 0,
            preempted_for: None,
            from_cores: Some(1.0),
            to_cores: Some(3.0),
            resized_for: None,
            start_sent_at_unix: None,
        }],
    };
    assert_eq!(
        JobDetail::try_from(pb::JobDetail::from(detail.clone())).unwrap(),
        detail
    );
    let json = serde_json::to_string(&summary).unwrap();
    assert!(json.contains("\"status\":\"running\""), "{json}");
}

#[test]
fn a_job_names_a_plain_user_and_one_run_as_a_user_has_no_carried_checkpoint() {
    for good in ["", "alice", "svc_train-2", "a.b", "root"] {
        let mut s = spec();
        s.user = good.into();
        assert_eq!(
            JobSpec::try_from(pb::JobSpec::from(s.clone())).unwrap(),
            s,
            "{good:?}"
        );
    }
    for bad in ["-rf", "a/b", "a:b", "al ice", "x\0", &"u".repeat(33)] {
        let mut m = pb::JobSpec::from(spec());
        m.user = bad.into();
        let e = JobSpec::try_from(m).unwrap_err();
        assert_eq!(e.field, "user", "{bad:?}");
    }
    let carried = |user: &str| {
        let mut s = spec();
        s.user = user.into();
        s.checkpoint = Some(Checkpoint {
            dir: "/scratch/ck".into(),
            save_signal: 10,
            carry: true,
            transparent: false,
        });
        JobSpec::try_from(pb::JobSpec::from(s))
    };
    assert_eq!(carried("alice").unwrap_err().field, "checkpoint.carry");
    assert!(carried("root").is_ok() && carried("").is_ok());
}
