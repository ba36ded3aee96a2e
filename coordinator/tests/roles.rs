//! The coordinator's roles over real mTLS: a real server on 127.0.0.1 with certificates made by
//! `coordinator::certs` (what `govctl certs` writes), and real tonic clients holding node, admin
//! and role-less certificates of the same CA. The role table is in `coordinator::server::auth`.

use std::path::Path;
use std::time::Duration;

use coordinator::certs::{self, Kind};
use coordinator::server::{self, RunningServer, ServerConfig};
use governor_proto::control::JobSpec;
use governor_proto::node::{
    Category, Hello, JobReport, MoveRequest, NodeCapacity, NodeMessage, NodeReport, RunState,
};
use governor_proto::pb;
use governor_proto::pb::control_service_client::ControlServiceClient;
use governor_proto::pb::node_service_client::NodeServiceClient;
use governor_proto::tls::TlsFiles;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// A CA with the coordinator's certificate, two nodes and an admin.
fn make_certs(dir: &Path) {
    certs::init(
        dir,
        &[
            Kind::Coordinator {
                hosts: vec!["127.0.0.1".into()],
            },
            Kind::Node {
                name: "node-a".into(),
            },
            Kind::Node {
                name: "node-b".into(),
            },
            Kind::Admin {
                name: "admin".into(),
            },
        ],
        false,
    )
    .expect("certificates for the test cluster");
}

/// A client certificate of the same CA with the subject entries given, as another PKI (or a
/// careless operator) might issue: `DIR/STEM.pem` and `DIR/STEM-key.pem`.
fn issue_odd(dir: &Path, stem: &str, subject: &[(DnType, &str)]) {
    let ca_pem = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
    let ca_key =
        KeyPair::from_pem(&std::fs::read_to_string(dir.join("ca-key.pem")).unwrap()).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = DistinguishedName::new();
    for (ty, value) in subject {
        params.distinguished_name.push(ty.clone(), *value);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join(format!("{stem}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{stem}-key.pem")), key.serialize_pem()).unwrap();
}

/// The organisational unit under its OID as a second entry (rcgen keeps one value per type).
fn second_ou() -> DnType {
    DnType::CustomDnType(vec![2, 5, 4, 11])
}

async fn start(dir: &Path) -> RunningServer {
    server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: dir.join("coordinator.redb"),
        tls: Some(TlsFiles::in_dir(dir, certs::COORDINATOR)),
        policy: "first-fit".into(),
        state: Default::default(),
        web: Default::default(),
    })
    .await
    .expect("the coordinator starts")
}

async fn channel(dir: &Path, server: &RunningServer, cert: &str) -> Channel {
    governor_proto::tls::endpoint(&server.addr.to_string(), Some(&TlsFiles::in_dir(dir, cert)))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the TLS handshake with certificate {cert} failed: {e}"))
}

async fn control(dir: &Path, server: &RunningServer, cert: &str) -> ControlServiceClient<Channel> {
    ControlServiceClient::new(channel(dir, server, cert).await)
}

fn spec(name: &str) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        spec: Some(JobSpec::new(name, vec!["train".into()], format!("/tmp/{name}.log")).into()),
    }
}

fn hello(node: &str) -> pb::NodeMessage {
    NodeMessage::Hello(Hello {
        node_name: node.into(),
        capacity: NodeCapacity::cpu_only(4.0, 8 << 30),
        agent_version: "test".into(),
        can_dump: false,
    })
    .into()
}

/// An open node session: the sender of its messages and the coordinator's answers.
struct Session {
    tx: mpsc::Sender<pb::NodeMessage>,
    inbound: Streaming<pb::CoordinatorMessage>,
}

/// Open a session with certificate `cert` whose hello names `node`; `Err` is the coordinator's
/// refusal.
async fn session(
    dir: &Path,
    server: &RunningServer,
    cert: &str,
    node: &str,
) -> Result<Session, Status> {
    let mut client = NodeServiceClient::new(channel(dir, server, cert).await);
    let (tx, rx) = mpsc::channel(8);
    tx.send(hello(node)).await.unwrap();
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        client.session(ReceiverStream::new(rx)),
    )
    .await
    .expect("the coordinator answers a session's hello within 10 s")?;
    let mut inbound = response.into_inner();
    let welcome = inbound.message().await?.expect("a welcome");
    assert!(
        matches!(
            welcome.body,
            Some(pb::coordinator_message::Body::Welcome(_))
        ),
        "{welcome:?}"
    );
    Ok(Session { tx, inbound })
}

fn assert_denied<T: std::fmt::Debug>(what: &str, result: Result<T, Status>, says: &str) {
    match result {
        Err(status) => {
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{what}: {}",
                status.message()
            );
            assert!(
                status.message().contains(says),
                "{what}: {:?} should say {says:?}",
                status.message()
            );
        }
        Ok(v) => panic!("{what} must be refused, got {v:?}"),
    }
}

async fn node_names(admin: &mut ControlServiceClient<Channel>) -> Vec<String> {
    admin
        .list_nodes(pb::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner()
        .nodes
        .into_iter()
        .map(|n| n.name)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_certificate_may_read_the_cluster_view_but_not_act_as_an_admin() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let server = start(dir.path()).await;
    let mut admin = control(dir.path(), &server, "admin").await;
    let job = admin
        .submit_job(spec("resnet"))
        .await
        .expect("an admin may submit")
        .into_inner()
        .job
        .unwrap()
        .id;

    let mut node = control(dir.path(), &server, "node-a").await;
    let admin_fix = "use an admin certificate";
    assert_denied(
        "SubmitJob with a node certificate",
        node.submit_job(spec("x")).await,
        "CN=node-a (node) may not submit jobs: use an admin certificate",
    );
    assert_denied(
        "CancelJob with a node certificate",
        node.cancel_job(pb::CancelJobRequest {
            job_id: job.clone(),
        })
        .await,
        admin_fix,
    );
    assert_denied(
        "SetPolicy with a node certificate",
        node.set_policy(pb::SetPolicyRequest {
            name: "round-robin".into(),
        })
        .await,
        admin_fix,
    );
    // A job's detail holds its command and environment: admins only.
    assert_denied(
        "GetJob with a node certificate",
        node.get_job(pb::GetJobRequest {
            job_id: job.clone(),
        })
        .await,
        "may not read a job's details",
    );
    // A job's output may hold anything it prints: admins only.
    assert_denied(
        "JobOutput with a node certificate",
        node.job_output(pb::JobOutputRequest {
            job_id: job.clone(),
            ..Default::default()
        })
        .await
        .map(drop),
        "may not read a job's output",
    );
    // The cluster view (summaries) is open to nodes.
    node.list_nodes(pb::ListNodesRequest {}).await.unwrap();
    let jobs = node
        .list_jobs(pb::ListJobsRequest { all: true })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1);
    node.get_stats(pb::GetStatsRequest {}).await.unwrap();
    node.get_policy(pb::GetPolicyRequest {}).await.unwrap();

    // Nothing the node asked changed the cluster.
    let policy = admin
        .get_policy(pb::GetPolicyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(policy.current, "first-fit");
    let jobs = admin
        .list_jobs(pb::ListJobsRequest { all: true })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].status, pb::JobStatus::Queued as i32, "{jobs:?}");
    admin
        .get_job(pb::GetJobRequest { job_id: job })
        .await
        .expect("an admin may read a job's details");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_certificate_may_not_pose_as_a_node() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let server = start(dir.path()).await;

    // With a hello under its own name or a node's.
    for node in ["admin", "node-a"] {
        assert_denied(
            &format!("a session as {node} with the admin certificate"),
            session(dir.path(), &server, "admin", node).await.map(drop),
            "CN=admin (admin) may not open a node session",
        );
    }
    // Refused at once, without the coordinator waiting for a hello the admin never sends.
    let mut client = NodeServiceClient::new(channel(dir.path(), &server, "admin").await);
    let (_tx, rx) = mpsc::channel::<pb::NodeMessage>(1);
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        client.session(ReceiverStream::new(rx)),
    )
    .await
    .expect("an admin's session is refused before any hello");
    assert_denied(
        "a session without a hello",
        answer.map(drop),
        "node session",
    );

    let mut admin = control(dir.path(), &server, "admin").await;
    assert!(node_names(&mut admin).await.is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_speaks_only_for_the_node_in_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let server = start(dir.path()).await;
    let mut admin = control(dir.path(), &server, "admin").await;

    // A hello naming another node is refused.
    assert_denied(
        "node-a's certificate registering node-b",
        session(dir.path(), &server, "node-a", "node-b")
            .await
            .map(drop),
        "CN=node-a (node) may not register node node-b",
    );
    assert!(node_names(&mut admin).await.is_empty());

    // Each under its own name is fine.
    let a = session(dir.path(), &server, "node-a", "node-a")
        .await
        .expect("node-a registers as node-a");
    let mut b = session(dir.path(), &server, "node-b", "node-b")
        .await
        .expect("node-b registers as node-b");
    assert_eq!(node_names(&mut admin).await, ["node-a", "node-b"]);

    // First-fit places the job on node-a.
    let job = admin
        .submit_job(spec("resnet"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(job.members[0].node, "node-a");

    // node-b reports node-a's job as failed and asks to move it: neither sticks.
    let mut claim = JobReport::running(&job.id, "resnet");
    claim.state = RunState::Failed;
    claim.exit_code = Some(1);
    claim.category = Category::Converged;
    let report = NodeReport {
        cpu_used_cores: 3.5,
        jobs: vec![claim],
        move_requests: vec![MoveRequest {
            job_id: job.id.clone(),
            reason: "node-b wants it gone".into(),
        }],
        ..NodeReport::default()
    };
    b.tx.send(NodeMessage::Report(report).into()).await.unwrap();
    // Wait until the coordinator has applied node-b's report (its CPU use shows).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let nodes = admin
            .list_nodes(pb::ListNodesRequest {})
            .await
            .unwrap()
            .into_inner()
            .nodes;
        if nodes
            .iter()
            .any(|n| n.name == "node-b" && n.cpu_used_cores == 3.5)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node-b's report never applied: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let detail = admin
        .get_job(pb::GetJobRequest {
            job_id: job.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let summary = detail.summary.unwrap();
    assert_eq!(
        summary.move_request, "",
        "node-b asked to move node-a's job"
    );
    assert_eq!(summary.members[0].node, "node-a");
    assert_ne!(
        summary.members[0].state,
        pb::RunState::Failed as i32,
        "node-b failed node-a's job"
    );
    assert_ne!(summary.category, pb::Category::Converged as i32);
    // The session stays open (an ignored claim is not an error).
    assert!(
        tokio::time::timeout(Duration::from_millis(200), b.inbound.message())
            .await
            .is_err(),
        "node-b's session should stay open"
    );
    // The nodes hang up (else the server waits 5 s for their sessions to end).
    drop((a, b));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_without_exactly_one_known_role_may_do_nothing() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    // Signed by the cluster CA, but with an OU that is no role...
    issue_odd(
        dir.path(),
        "operator",
        &[
            (DnType::CommonName, "operator"),
            (DnType::OrganizationalUnitName, "operator"),
        ],
    );
    // ...or with two roles: neither counts.
    issue_odd(
        dir.path(),
        "both",
        &[
            (DnType::CommonName, "node-a"),
            (DnType::OrganizationalUnitName, "admin"),
            (second_ou(), "node"),
        ],
    );
    // ...or without a common name.
    issue_odd(
        dir.path(),
        "nameless",
        &[(DnType::OrganizationalUnitName, "admin")],
    );
    let server = start(dir.path()).await;

    for cert in ["operator", "both", "nameless"] {
        let mut c = control(dir.path(), &server, cert).await;
        assert_denied(
            &format!("ListNodes with certificate {cert}"),
            c.list_nodes(pb::ListNodesRequest {}).await,
            "(no known role) may not list the nodes",
        );
        assert_denied(
            &format!("GetStats with certificate {cert}"),
            c.get_stats(pb::GetStatsRequest {}).await,
            "no known role",
        );
        assert_denied(
            &format!("SubmitJob with certificate {cert}"),
            c.submit_job(spec("x")).await,
            "no known role",
        );
        assert_denied(
            &format!("SetPolicy with certificate {cert}"),
            c.set_policy(pb::SetPolicyRequest {
                name: "round-robin".into(),
            })
            .await,
            "no known role",
        );
        assert_denied(
            &format!("a node session with certificate {cert}"),
            session(dir.path(), &server, cert, "node-a").await.map(drop),
            "no known role",
        );
    }
    let mut admin = control(dir.path(), &server, "admin").await;
    assert!(node_names(&mut admin).await.is_empty());
    assert!(
        admin
            .list_jobs(pb::ListJobsRequest { all: true })
            .await
            .unwrap()
            .into_inner()
            .jobs
            .is_empty()
    );
    server.stop().await;
}
