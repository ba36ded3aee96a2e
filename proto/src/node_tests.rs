use super::*;
use crate::pb;

fn report() -> NodeReport {
    let mut job = JobReport::running("j1", "resnet");
    job.category = Category::Progressing;
    job.progress = Some(-0.5);
    job.growth = Some(0.01);
    job.cpu_cores = 1.5;
    job.gpu_indices = vec![0, 1];
    job.gpu_utilization = 0.9;
    NodeReport {
        sequence: 7,
        cpu_used_cores: 1.5,
        memory_used_bytes: 1 << 30,
        jobs: vec![job],
        move_requests: vec![MoveRequest {
            job_id: "j1".into(),
            reason: "converged".into(),
        }],
        gpus: vec![GpuUsage {
            index: 0,
            utilization: 0.5,
            memory_used_bytes: 10,
        }],
    }
}

#[test]
fn report_round_trips_through_the_wire_type() {
    let r = report();
    let wire: pb::NodeMessage = NodeMessage::Report(r.clone()).into();
    assert_eq!(NodeMessage::try_from(wire).unwrap(), NodeMessage::Report(r));
}

#[test]
fn output_requests_and_pieces_round_trip_and_are_bounded() {
    let read = ReadOutput {
        request_id: 9,
        job_id: "j1".into(),
        replica: 0,
        replicas: 1,
        name: "resnet".into(),
        offset: 4096,
        from_end: true,
        max_bytes: MAX_OUTPUT_CHUNK,
    };
    let wire: pb::CoordinatorMessage = CoordinatorMessage::ReadOutput(read.clone()).into();
    assert_eq!(
        CoordinatorMessage::try_from(wire).unwrap(),
        CoordinatorMessage::ReadOutput(read.clone())
    );
    let mut too_much = pb::ReadOutput::from(read);
    too_much.max_bytes = MAX_OUTPUT_CHUNK + 1;
    assert_eq!(
        ReadOutput::try_from(too_much).unwrap_err().field,
        "max_bytes"
    );

    let piece = OutputChunk {
        request_id: 9,
        offset: 10,
        data: b"epoch 1/3\n".to_vec(),
        size: 21,
        error: String::new(),
    };
    let wire: pb::NodeMessage = NodeMessage::Output(piece.clone()).into();
    assert_eq!(
        NodeMessage::try_from(wire).unwrap(),
        NodeMessage::Output(piece)
    );
    let big = pb::NodeMessage {
        body: Some(pb::node_message::Body::OutputChunk(pb::OutputChunk {
            data: vec![0; MAX_OUTPUT_CHUNK as usize + 1],
            ..Default::default()
        })),
    };
    assert_eq!(
        NodeMessage::try_from(big).unwrap_err().field,
        "output_chunk.data"
    );
}

#[test]
fn nan_cpu_names_the_field() {
    let mut wire: pb::NodeMessage = NodeMessage::Report(report()).into();
    let Some(pb::node_message::Body::Report(r)) = wire.body.as_mut() else {
        unreachable!()
    };
    r.jobs[0].cpu_cores = f64::NAN;
    let e = NodeMessage::try_from(wire).unwrap_err();
    assert_eq!(e.field, "report.jobs[0].cpu_cores");
    assert!(e.problem.contains("NaN"), "{e}");
}

#[test]
fn unspecified_category_is_rejected_with_advice() {
    let mut wire = pb::JobReport::from(JobReport::running("j1", "x"));
    wire.category = 0;
    let e = JobReport::try_from(wire).unwrap_err();
    assert_eq!(e.field, "category");
    assert!(e.problem.contains("CATEGORY_UNKNOWN"), "{e}");
    let mut wire = pb::JobReport::from(JobReport::running("j1", "x"));
    wire.category = 99;
    assert_eq!(
        JobReport::try_from(wire).unwrap_err().problem,
        "unknown value 99"
    );
}

#[test]
fn duplicate_jobs_in_a_report_are_rejected() {
    let mut r = report();
    r.jobs.push(r.jobs[0].clone());
    let e = NodeReport::try_from(pb::NodeReport::from(r)).unwrap_err();
    assert_eq!(e.field, "jobs");
}

#[test]
fn a_transparent_checkpoint_names_no_directory_and_no_signal_and_round_trips() {
    let t = Checkpoint::transparent();
    t.check().unwrap();
    let back = Checkpoint::try_from(pb::Checkpoint::from(t.clone())).unwrap();
    assert_eq!(back, t);
    let mut bad = t.clone();
    bad.dir = "/x".into();
    assert_eq!(bad.check().unwrap_err().field, "checkpoint.transparent");
    let mut bad = t;
    bad.carry = false;
    assert!(bad.check().is_err());
}

#[test]
fn hello_needs_capacity_and_a_dns_name() {
    let hello = pb::Hello {
        node_name: "node1".into(),
        capacity: None,
        agent_version: "0.1".into(),
        can_dump: false,
    };
    assert_eq!(
        Hello::try_from(hello).unwrap_err().to_string(),
        "invalid capacity: is missing"
    );
    let hello = pb::Hello {
        node_name: "Node_1".into(),
        capacity: Some(NodeCapacity::cpu_only(4.0, 1).into()),
        agent_version: String::new(),
        can_dump: false,
    };
    assert_eq!(Hello::try_from(hello).unwrap_err().field, "node_name");
    let hello = pb::Hello {
        node_name: "n".into(),
        capacity: Some(pb::NodeCapacity {
            cores: 0.0,
            memory_bytes: 1,
            gpus: vec![],
        }),
        agent_version: String::new(),
        can_dump: false,
    };
    assert_eq!(Hello::try_from(hello).unwrap_err().field, "capacity.cores");
}

#[test]
fn duplicate_gpu_indices_are_rejected() {
    let cap = pb::NodeCapacity {
        cores: 4.0,
        memory_bytes: 0,
        gpus: vec![
            pb::GpuDevice {
                index: 1,
                model: "A".into(),
                memory_bytes: 0,
            },
            pb::GpuDevice {
                index: 1,
                model: "A".into(),
                memory_bytes: 0,
            },
        ],
    };
    let e = NodeCapacity::try_from(cap).unwrap_err();
    assert_eq!(e.to_string(), "invalid gpus: lists GPU 1 twice");
}

#[test]
fn start_job_round_trips_and_checks_replicas() {
    let s = StartJob {
        job_id: "j3".into(),
        replica: 1,
        replicas: 2,
        name: "bert".into(),
        argv: vec!["python".into(), "train.py".into()],
        log_path: "/var/log/bert.log".into(),
        metric: "loss".into(),
        maximise: false,
        gpu_indices: vec![2, 3],
        priority: 5,
        env: [("A".to_string(), "b".to_string())].into(),
        cores: Some(4.0),
        memory_bytes: None,
        checkpoint: Some(Checkpoint {
            dir: "/shared/ckpt/bert".into(),
            save_signal: DEFAULT_SAVE_SIGNAL,
            carry: true,
            transparent: false,
        }),
        attempt: 2,
        carried_checkpoint: true,
        user: String::new(),
    };
    let chunk = CoordinatorMessage::Command(NodeCommand::Chunk(CheckpointChunk {
        job_id: "j3".into(),
        attempt: 2,
        offset: 4096,
        data: vec![1, 2, 3],
        last: true,
        sha256: "ab".repeat(32),
        total_bytes: 4099,
        error: String::new(),
    }));
    assert_eq!(
        CoordinatorMessage::try_from(pb::CoordinatorMessage::from(chunk.clone())).unwrap(),
        chunk
    );
    let save = CoordinatorMessage::Command(NodeCommand::Save(SaveJob {
        job_id: "j3".into(),
        reason: "govctl move".into(),
    }));
    assert_eq!(
        CoordinatorMessage::try_from(pb::CoordinatorMessage::from(save.clone())).unwrap(),
        save
    );
    let mut bad = pb::StartJob::from(s.clone());
    bad.checkpoint.as_mut().unwrap().save_signal = 0;
    assert_eq!(
        StartJob::try_from(bad).unwrap_err().field,
        "checkpoint.save_signal"
    );
    let wire: pb::CoordinatorMessage =
        CoordinatorMessage::Command(NodeCommand::Start(s.clone())).into();
    assert_eq!(
        CoordinatorMessage::try_from(wire).unwrap(),
        CoordinatorMessage::Command(NodeCommand::Start(s.clone()))
    );
    let mut bad = pb::StartJob::from(s.clone());
    bad.replica = 2;
    assert_eq!(StartJob::try_from(bad).unwrap_err().field, "replica");
    let mut bad = pb::StartJob::from(s);
    bad.log_path = "relative.log".into();
    assert_eq!(StartJob::try_from(bad).unwrap_err().field, "log_path");
}

#[test]
fn empty_messages_are_missing_a_body() {
    assert_eq!(
        NodeMessage::try_from(pb::NodeMessage { body: None })
            .unwrap_err()
            .to_string(),
        "invalid body: is missing"
    );
}
