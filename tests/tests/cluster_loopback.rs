//! The coordinator and the node agent library together over real gRPC on loopback, with mTLS:
//! registration, placement, commands, reports, categories, authorisation, lost nodes, invalid
//! messages and a coordinator restart. Host test (no VM needed): the "daemons" here are tasks that
//! answer start commands with synthetic reports.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use coordinator::certs;
use coordinator::cli::Client;
use coordinator::server::{self, RunningServer, ServerConfig};
use coordinator::state::StateConfig;
use governor::coordinator_client::{
    AgentConfig, AgentStatus, Backoff, JobReport, NodeAgent, NodeCapacity, NodeCommand, NodeReport,
    RunState, TlsFiles,
};
use governor_proto::control::{JobSpec, JobState, NodeState};
use governor_proto::pb;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

fn make_certs(dir: &Path) {
    governor_integration_tests::loopback_certs(dir, &["node-a", "node-b"]);
}

async fn start(dir: &Path, listen: SocketAddr) -> RunningServer {
    server::start(ServerConfig {
        listen,
        store: dir.join("coordinator.redb"),
        tls: Some(TlsFiles::in_dir(dir, certs::COORDINATOR)),
        policy: "first-fit".into(),
        state: StateConfig {
            lost_after_s: 2.0,
            ..StateConfig::default()
        }
        .into(),
        web: Default::default(),
    })
    .await
    .expect("the coordinator starts")
}

/// A stand-in for the node daemon: runs an agent, "starts" jobs it is told to start and reports
/// them running in the category the test sets.
struct FakeNode {
    report: watch::Sender<NodeReport>,
    status: watch::Receiver<AgentStatus>,
    agent: JoinHandle<()>,
    commands: JoinHandle<()>,
    started: watch::Receiver<Vec<String>>,
}

fn fake_node(dir: &Path, name: &str, cert_of: &str, addr: SocketAddr) -> FakeNode {
    let (report_tx, report_rx) = watch::channel(NodeReport::default());
    let (cmd_tx, mut cmd_rx) = mpsc::channel::<NodeCommand>(16);
    let mut config = AgentConfig::new(addr.to_string(), name, NodeCapacity::cpu_only(4.0, 8 << 30));
    config.tls = Some(TlsFiles::in_dir(dir, cert_of));
    config.backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(500),
        reset_after: Duration::from_secs(60),
    };
    let (agent, status) = NodeAgent::spawn_with_status(config, report_rx, cmd_tx);
    let (started_tx, started) = watch::channel(Vec::new());
    let reports = report_tx.clone();
    let commands = tokio::spawn(async move {
        while let Some(cmd) = cmd_rx.recv().await {
            if let NodeCommand::Start(s) = cmd {
                started_tx.send_modify(|v| v.push(s.job_id.clone()));
                reports.send_modify(|r| {
                    if !r.jobs.iter().any(|j| j.job_id == s.job_id) {
                        let mut j = JobReport::running(&s.job_id, &s.name);
                        j.category = governor::policy::Category::Progressing;
                        j.progress = Some(2.0);
                        j.cpu_cores = 1.0;
                        r.jobs.push(j);
                    }
                });
            }
        }
    });
    FakeNode {
        report: report_tx,
        status,
        agent,
        commands,
        started,
    }
}

async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after 20 s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn admin(dir: &Path, addr: SocketAddr) -> Client {
    Client::connect(&addr.to_string(), Some(&TlsFiles::in_dir(dir, "admin")))
        .await
        .expect("admin connects")
}

fn spec(name: &str) -> JobSpec {
    JobSpec::new(name, vec!["train".into()], format!("/tmp/{name}.log"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_and_govctl_work_together_over_mtls() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("info")
        .try_init();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let server = start(dir.path(), "127.0.0.1:0".parse().unwrap()).await;
    let addr = server.addr;
    let a = fake_node(dir.path(), "node-a", "node-a", addr);
    let b = fake_node(dir.path(), "node-b", "node-b", addr);
    let mut govctl = admin(dir.path(), addr).await;

    // Both nodes register.
    eventually("both nodes ready", async || {
        let nodes = govctl.nodes().await.unwrap();
        (nodes.len() == 2 && nodes.iter().all(|n| n.status == NodeState::Ready)).then_some(())
    })
    .await;

    // A job lands where first-fit says (node-a), its start reaches the "daemon", the daemon's
    // report makes it running with its category.
    let job = govctl.submit(spec("resnet")).await.unwrap();
    assert_eq!(job.members[0].node, "node-a");
    let job_id = job.id.clone();
    eventually("the job running and progressing", async || {
        let jobs = govctl.jobs(false).await.unwrap();
        let j = jobs.iter().find(|j| j.id == job_id)?;
        (j.status == JobState::Running && j.category == governor::policy::Category::Progressing)
            .then_some(())
    })
    .await;
    assert_eq!(*a.started.borrow(), vec![job_id.clone()]);
    let detail = govctl.job(&job_id).await.unwrap();
    assert!(
        detail.placements[0].reason.contains("first-fit"),
        "{detail:?}"
    );
    assert_eq!(detail.progress.last().map(|p| p.value), Some(2.0));

    // The policy switches at run time: round-robin after node-a goes to node-b.
    assert_eq!(
        govctl.set_policy("round-robin").await.unwrap().current,
        "round-robin"
    );
    assert_eq!(
        govctl.submit(spec("bert")).await.unwrap().members[0].node,
        "node-a"
    );
    assert_eq!(
        govctl.submit(spec("gpt")).await.unwrap().members[0].node,
        "node-b"
    );
    let err = govctl.set_policy("fastest").await.unwrap_err().to_string();
    assert!(
        err.contains("unknown placement policy \"fastest\""),
        "{err}"
    );
    let err = govctl.job("j404").await.unwrap_err().to_string();
    assert!(err.contains("no job j404"), "{err}");

    // node-b stops (the daemon drops its report channel): its session closes, it is lost after
    // the timeout and its job is unknown, not dropped.
    // (Its command task holds a clone of the report sender: stop it first.)
    b.commands.abort();
    let _ = b.commands.await;
    drop(b.report);
    tokio::time::timeout(Duration::from_secs(10), b.agent)
        .await
        .expect("the agent stops when the daemon drops its report channel")
        .unwrap();
    eventually("node-b lost and its job unknown", async || {
        let nodes = govctl.nodes().await.unwrap();
        let lost = nodes
            .iter()
            .any(|n| n.name == "node-b" && n.status == NodeState::Lost);
        let jobs = govctl.jobs(false).await.unwrap();
        let unknown = jobs.iter().any(|j| {
            j.name == "gpt"
                && j.status == JobState::Unknown
                && j.message.contains("node node-b is lost")
        });
        (lost && unknown).then_some(())
    })
    .await;

    // The coordinator crashes and restarts on the same store and port: no job is lost and
    // node-a re-syncs by itself.
    let before: BTreeMap<String, String> = govctl
        .jobs(true)
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j.name))
        .collect();
    server.kill().await;
    let server = start(dir.path(), addr).await;
    let mut govctl = admin(dir.path(), addr).await;
    let after: BTreeMap<String, String> = govctl
        .jobs(true)
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j.name))
        .collect();
    assert_eq!(before, after, "a restart must not lose jobs");
    assert_eq!(govctl.policy().await.unwrap().current, "round-robin");
    eventually("node-a re-synced and its jobs running again", async || {
        let jobs = govctl.jobs(false).await.unwrap();
        let a_jobs: Vec<_> = jobs
            .iter()
            .filter(|j| j.members.iter().any(|m| m.node == "node-a"))
            .collect();
        (a_jobs.len() == 2 && a_jobs.iter().all(|j| j.status == JobState::Running)).then_some(())
    })
    .await;
    let status = a.status.borrow().clone();
    assert!(
        matches!(status, AgentStatus::Connected { .. }),
        "node-a's agent: {status:?}"
    );
    a.commands.abort();
    drop(a.report);
    tokio::time::timeout(Duration::from_secs(10), a.agent)
        .await
        .expect("node-a's agent stops")
        .unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_decide_who_may_do_what() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let server = start(dir.path(), "127.0.0.1:0".parse().unwrap()).await;
    let addr = server.addr;

    // node-b presenting node-a's certificate is refused, and keeps retrying without crashing.
    let mut impostor = fake_node(dir.path(), "node-b", "node-a", addr);
    let error = eventually("the impostor refused", async || {
        match impostor.status.borrow_and_update().clone() {
            AgentStatus::Waiting { error, .. } => Some(error),
            _ => None,
        }
    })
    .await;
    assert!(
        error.contains("CN=node-a (node) may not register node node-b"),
        "{error}"
    );
    impostor.agent.abort();

    // A node certificate may read but not submit.
    let mut as_node = Client::connect(
        &addr.to_string(),
        Some(&TlsFiles::in_dir(dir.path(), "node-a")),
    )
    .await
    .unwrap();
    as_node
        .nodes()
        .await
        .expect("any cluster certificate may read");
    let err = as_node.submit(spec("x")).await.unwrap_err().to_string();
    assert!(
        err.contains("may not submit jobs: use an admin certificate"),
        "{err}"
    );

    // Plain text to an mTLS coordinator does not get through.
    let plain = Client::connect(&addr.to_string(), None).await;
    let refused = match plain {
        Err(_) => true,
        Ok(mut c) => c.nodes().await.is_err(),
    };
    assert!(
        refused,
        "a plain-text client must not reach an mTLS coordinator"
    );

    // A certificate from another CA is refused at the handshake.
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path());
    let foreign = Client::connect(
        &addr.to_string(),
        Some(&TlsFiles {
            ca: dir.path().join("ca.pem"),
            cert: other.path().join("admin.pem"),
            key: other.path().join("admin-key.pem"),
        }),
    )
    .await;
    let refused = match foreign {
        Err(_) => true,
        Ok(mut c) => c.nodes().await.is_err(),
    };
    assert!(refused, "a certificate of another CA must be refused");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_report_gets_invalid_argument_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let server = start(dir.path(), "127.0.0.1:0".parse().unwrap()).await;
    let ep = governor_proto::tls::endpoint(
        &server.addr.to_string(),
        Some(&TlsFiles::in_dir(dir.path(), "node-a")),
    )
    .unwrap();
    let mut client = pb::node_service_client::NodeServiceClient::new(ep.connect().await.unwrap());
    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::NodeMessage {
        body: Some(pb::node_message::Body::Hello(pb::Hello {
            node_name: "node-a".into(),
            capacity: Some(NodeCapacity::cpu_only(2.0, 1 << 30).into()),
            agent_version: "test".into(),
            can_dump: false,
        })),
    })
    .await
    .unwrap();
    let mut inbound = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let welcome = inbound.message().await.unwrap().unwrap();
    assert!(matches!(
        welcome.body,
        Some(pb::coordinator_message::Body::Welcome(_))
    ));
    let mut bad = pb::JobReport::from(JobReport::running("j1", "x"));
    bad.cpu_cores = f64::NAN;
    bad.state = pb::RunState::from(RunState::Running) as i32;
    tx.send(pb::NodeMessage {
        body: Some(pb::node_message::Body::Report(pb::NodeReport {
            jobs: vec![bad],
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let status = inbound.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "invalid report.jobs[0].cpu_cores: must be finite and >= 0, got NaN"
    );
    // The coordinator is fine.
    let mut govctl = admin(dir.path(), server.addr).await;
    assert_eq!(govctl.nodes().await.unwrap().len(), 1);
    server.stop().await;
}

/// The codec's buffers start at 1 KiB (governor_proto::codec): messages far larger than that,
/// and than tonic's usual 8 KiB, still cross in both directions, here a node report with 400
/// jobs (~60 KB) and the job list govctl gets back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_much_larger_than_the_codec_buffers_cross_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let server = start(dir.path(), "127.0.0.1:0".parse().unwrap()).await;
    let node = fake_node(dir.path(), "node-a", "node-a", server.addr);
    node.report.send_modify(|r| {
        for i in 0..400 {
            let mut j = JobReport::running(
                format!("local-{i:04}"),
                format!("a-rather-long-training-job-name-for-job-number-{i:04}"),
            );
            j.origin = governor::coordinator_client::JobOrigin::Local;
            j.message = "x".repeat(64);
            j.cpu_cores = 0.01;
            r.jobs.push(j);
        }
    });
    let wire = pb::NodeReport::from(node.report.borrow().clone());
    assert!(
        prost::Message::encoded_len(&wire) > 50_000,
        "{}",
        prost::Message::encoded_len(&wire)
    );
    let mut govctl = admin(dir.path(), server.addr).await;
    let jobs = eventually("400 jobs listed", async || {
        let jobs = govctl.jobs(true).await.ok()?;
        (jobs.len() == 400).then_some(jobs)
    })
    .await;
    assert!(
        jobs.iter()
            .any(|j| j.name == "a-rather-long-training-job-name-for-job-number-0399"),
        "{:?}",
        jobs.last()
    );
    node.agent.abort();
    node.commands.abort();
    server.stop().await;
}

/// The fence over the real coordinator and agent: the coordinator's heartbeats acknowledge the
/// node's reports and carry its bound (half of `lost_after_s + lost_target_wait_s`); a job moved
/// to a node is named in that node's heartbeats while its move waits for it; and once the
/// coordinator is gone the node's fence falls due for that job after the bound, counted from
/// the last report acknowledged (the daemon then saves and stops it: the launcher's tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_coordinator_fences_the_job_moved_to_it_after_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = server::start(ServerConfig {
        listen: addr,
        store: dir.path().join("coordinator.redb"),
        tls: Some(TlsFiles::in_dir(dir.path(), certs::COORDINATOR)),
        policy: "first-fit".into(),
        state: StateConfig {
            lost_after_s: 2.0,
            lost_target_wait_s: 4.0,
            // The test moves the job by hand; nothing else moves.
            auto_move: false,
            ..StateConfig::default()
        }
        .into(),
        web: Default::default(),
    })
    .await
    .expect("the coordinator starts");
    let addr = server.addr;
    // Two agents; each "runs" what it is told to start, and a saves its job when asked.
    let mut nodes = Vec::new();
    for name in ["node-a", "node-b"] {
        let (report_tx, report_rx) = watch::channel(NodeReport::default());
        let (cmd_tx, cmd_rx) = mpsc::channel::<NodeCommand>(16);
        let mut config =
            AgentConfig::new(addr.to_string(), name, NodeCapacity::cpu_only(4.0, 8 << 30));
        config.tls = Some(TlsFiles::in_dir(dir.path(), name));
        let (_uploads_tx, uploads) = mpsc::channel(1);
        let (agent, _status, contact) =
            NodeAgent::spawn_with_contact(config, report_rx, cmd_tx, uploads);
        let commands = tokio::spawn(governor_integration_tests::answer_starts_and_saves(
            cmd_rx,
            report_tx.clone(),
        ));
        nodes.push((name, report_tx, agent, commands, contact));
    }
    let mut govctl = admin(dir.path(), addr).await;
    eventually("both nodes ready", async || {
        let n = govctl.nodes().await.ok()?;
        (n.iter().filter(|n| n.status == NodeState::Ready).count() == 2).then_some(())
    })
    .await;
    // Reports are acknowledged, with the coordinator's bound: (2 + 4) / 2 = 3 s.
    let contact_b = nodes[1].4.clone();
    let first = eventually("node-b's reports acknowledged", async || {
        let c = contact_b.borrow().clone();
        (c.fence_after == Some(Duration::from_secs(3))).then_some(c.confirmed_at?)
    })
    .await;
    eventually("a later report acknowledged", async || {
        (contact_b.borrow().confirmed_at? > first).then_some(())
    })
    .await;
    let mut movable = spec("train");
    movable.checkpoint = Some(governor_proto::node::Checkpoint {
        dir: dir.path().join("ckpt").display().to_string(),
        save_signal: 10,
        carry: false,
        transparent: false,
    });
    let job = govctl.submit(movable).await.unwrap();
    let on = eventually("the job running", async || {
        let j = govctl.job(&job.id).await.ok()?;
        (j.summary.status == JobState::Running)
            .then(|| j.summary.members.first().map(|m| m.node.clone()))
            .flatten()
    })
    .await;
    let to = if on == "node-a" { "node-b" } else { "node-a" };
    let target = nodes.iter().position(|n| n.0 == to).unwrap();
    govctl.move_job(&job.id, Some(to)).await.unwrap();
    let contact = nodes[target].4.clone();
    eventually("the target told to fence the moved job", async || {
        (contact.borrow().fence_jobs == [job.id.clone()]).then_some(())
    })
    .await;
    assert!(contact.borrow().due(std::time::Instant::now()).is_empty());
    // The coordinator goes; the target's fence falls due 3 s after its last acknowledged
    // report, not before.
    server.stop().await;
    let last = contact.borrow().confirmed_at.unwrap();
    assert!(
        contact
            .borrow()
            .due(last + Duration::from_millis(2900))
            .is_empty()
    );
    eventually("the fence due", async || {
        let due = contact.borrow().due(std::time::Instant::now()).to_vec();
        (due == [job.id.clone()]).then_some(())
    })
    .await;
    assert!(last.elapsed() >= Duration::from_secs(3));
    for (_, _, agent, commands, _) in nodes {
        agent.abort();
        commands.abort();
    }
}

/// A node whose healthy session ended (its coordinator died, or a leader was replaced) retries
/// at its first back-off step, not doubling, for a while: a coordinator back on its address
/// 10 s later has the node again within a second and a half. With the doubling back-off alone
/// (0.5, 1, 2, 4, 8 s) the node's next try after 10 s came 12.4-18.6 s after the death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_session_ended_reconnects_at_once_when_its_coordinator_is_back() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let addr: SocketAddr = format!("127.0.0.1:{}", governor_integration_tests::free_port())
        .parse()
        .unwrap();
    let server = start(dir.path(), addr).await;
    let (_report_tx, report_rx) = watch::channel(NodeReport::default());
    let (cmd_tx, _cmd_rx) = mpsc::channel::<NodeCommand>(16);
    let mut config = AgentConfig::new(
        addr.to_string(),
        "node-a",
        NodeCapacity::cpu_only(4.0, 8 << 30),
    );
    config.tls = Some(TlsFiles::in_dir(dir.path(), "node-a"));
    // The daemon's default back-off.
    assert_eq!(config.backoff, Backoff::default());
    let (_agent, mut status) = NodeAgent::spawn_with_status(config, report_rx, cmd_tx);
    let connected = |s: &AgentStatus| matches!(s, AgentStatus::Connected { .. });
    eventually("the node connected", async || {
        connected(&status.borrow()).then_some(())
    })
    .await;
    // A healthy session: longer than `HEALTHY_SESSION`.
    tokio::time::sleep(governor::coordinator_client::HEALTHY_SESSION + Duration::from_secs(1))
        .await;
    server.kill().await;
    eventually("the node noticed", async || {
        (!connected(&status.borrow())).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let _server = start(dir.path(), addr).await;
    let back = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(20), status.wait_for(connected))
        .await
        .expect("the node reconnects")
        .unwrap();
    let took = back.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "the node came back {took:?} after its coordinator"
    );
}
