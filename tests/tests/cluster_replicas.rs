//! The replicated coordinator on a real three-member etcd cluster on loopback (Debian's
//! `etcd-server`, started by the tests): leader election and its fence, failover with nodes and
//! `govctl` finding the new leader from the list of replicas, the loss of an etcd member, and a
//! leader paused past its lease (SIGSTOP) that must write nothing when it resumes. The nodes
//! are the agent library with stand-in answers, as in `cluster_loopback`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use coordinator::certs;
use coordinator::cli::Client;
use coordinator::etcd::{Etcd, EtcdConfig};
use coordinator::leader::{self, LeaseClock};
use coordinator::server::{self, Backend, ServerConfig, StateSection};
use coordinator::state::StateConfig;
use coordinator::store::etcd::{EtcdStore, leader_key};
use coordinator::store::{Batch, StoreError, Table};
use governor::coordinator_client::{
    AgentConfig, AgentStatus, Backoff, NodeAgent, NodeCapacity, NodeCommand, NodeReport, TlsFiles,
};
use governor_integration_tests::etcd::EtcdCluster;
use governor_integration_tests::replica::Replica;
use governor_proto::control::{JobSpec, JobState};
use tokio::sync::{mpsc, watch};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn replica_config(dir: &Path, name: &str, listen: SocketAddr, etcd: EtcdConfig) -> ServerConfig {
    ServerConfig {
        listen,
        store: dir.join(format!("{name}.redb")),
        tls: Some(TlsFiles::in_dir(dir, certs::COORDINATOR)),
        policy: "first-fit".into(),
        state: StateSection {
            planner: StateConfig {
                lost_after_s: 5.0,
                ..StateConfig::default()
            },
            backend: Backend::Etcd,
            etcd,
        },
        web: Default::default(),
    }
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], governor_integration_tests::free_port()))
}

/// A stand-in node connected to every replica's address: it records every start it is sent and
/// answers starts and saves at once, or holds them back while `hold` is true (a move then
/// waits in its phase).
struct Node {
    status: watch::Receiver<AgentStatus>,
    starts: watch::Receiver<Vec<(String, u32)>>,
    hold: watch::Sender<bool>,
    agent: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.agent.abort();
    }
}

fn node(dir: &Path, addresses: &str) -> Node {
    named_node(dir, "node-a", addresses)
}

fn named_node(dir: &Path, name: &str, addresses: &str) -> Node {
    let (report_tx, report_rx) = watch::channel(NodeReport::default());
    let (cmd_tx, mut cmd_rx) = mpsc::channel::<NodeCommand>(16);
    let mut config = AgentConfig::new(addresses, name, NodeCapacity::cpu_only(4.0, 8 << 30));
    config.tls = Some(TlsFiles::in_dir(dir, name));
    config.backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(300),
        reset_after: Duration::from_secs(60),
    };
    config.report_interval = Duration::from_millis(200);
    config.min_report_gap = Duration::from_millis(50);
    let (agent, status) = NodeAgent::spawn_with_status(config, report_rx, cmd_tx);
    let (starts_tx, starts) = watch::channel(Vec::new());
    let (hold, mut held) = watch::channel(false);
    let (fwd_tx, fwd_rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut waiting: Vec<NodeCommand> = Vec::new();
        loop {
            tokio::select! {
                cmd = cmd_rx.recv() => match cmd {
                    Some(cmd) => waiting.push(cmd),
                    None => return,
                },
                r = held.changed() => if r.is_err() { return },
            }
            if *held.borrow() {
                continue;
            }
            for cmd in waiting.drain(..) {
                if let NodeCommand::Start(s) = &cmd {
                    starts_tx.send_modify(|v| v.push((s.job_id.clone(), s.attempt)));
                }
                if fwd_tx.send(cmd).await.is_err() {
                    return;
                }
            }
        }
    });
    tokio::spawn(governor_integration_tests::answer_starts_and_saves(
        fwd_rx, report_tx,
    ));
    Node {
        status,
        starts,
        hold,
        agent,
    }
}

async fn wait_until<T>(what: &str, within: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn job_state(addresses: &str, dir: &Path, id: &str) -> Option<(JobState, Vec<String>)> {
    let tls = TlsFiles::in_dir(dir, "admin");
    let mut c = Client::connect(addresses, Some(&tls)).await.ok()?;
    let j = c.job(id).await.ok()?;
    let nodes = j.summary.members.iter().map(|m| m.node.clone()).collect();
    Some((j.summary.status, nodes))
}

/// Submit a job named `name` and wait until it runs: its id.
async fn submit_and_wait_running(
    govctl: &mut Client,
    addresses: &str,
    dir: &Path,
    name: &str,
) -> String {
    let log = format!("/tmp/{name}.log");
    let id = govctl
        .submit(JobSpec::new(name, vec!["x".into()], log))
        .await
        .unwrap()
        .id;
    wait_until("the job runs", Duration::from_secs(10), async || {
        job_state(addresses, dir, &id)
            .await
            .filter(|(s, _)| *s == JobState::Running)
    })
    .await;
    id
}

/// Two replicas on `cluster`, the first elected before the second starts: (the leader, the
/// standby, both addresses as `govctl` and nodes are given them).
async fn leader_and_standby(
    dir: &Path,
    cluster: &EtcdCluster,
) -> (server::Replica, server::Replica, String) {
    let (a, b) = (loopback(), loopback());
    let mut first = server::replica(replica_config(dir, "a", a, cluster.config()));
    tokio::time::timeout(Duration::from_secs(10), first.elected())
        .await
        .expect("the first replica leads");
    let second = server::replica(replica_config(dir, "b", b, cluster.config()));
    (first, second, format!("{a},{b}"))
}

/// Submit a job named `name` to whichever replica leads, retrying for `within`: its id.
async fn submit_to_the_leader(
    addresses: &str,
    admin: &TlsFiles,
    name: &str,
    within: Duration,
) -> String {
    wait_until(
        "a replica leads and takes the submission",
        within,
        async || {
            let mut c = Client::connect(addresses, Some(admin)).await.ok()?;
            c.submit(JobSpec::new(
                name,
                vec!["x".into()],
                format!("/tmp/{name}.log"),
            ))
            .await
            .ok()
            .map(|j| j.id)
        },
    )
    .await
}

#[test]
fn a_leader_whose_lease_ran_out_has_its_writes_refused_by_etcd() {
    let Some(cluster) = EtcdCluster::start(3) else {
        return;
    };
    runtime().block_on(async {
        let config = EtcdConfig {
            prefix: "/fence-test".into(),
            ..cluster.config()
        };
        let key = leader_key(&config.prefix);
        let first = leader::campaign(cluster.client(), key.clone(), "first", 2)
            .await
            .unwrap();
        let first_clock = first.clock();
        // The first leader's store without its own clock check, so that only etcd's fence can
        // refuse its writes.
        let store = |fence| {
            EtcdStore::new(
                Etcd::new(&config).unwrap(),
                &config.prefix,
                fence,
                LeaseClock::forever(),
                128,
            )
        };
        let stale = store(first.fence());
        let batch = |id: &str| Batch {
            puts: vec![(Table::Jobs, id.into(), b"{}".to_vec())],
            deletes: vec![],
        };
        stale.save(&batch("j1")).await.expect("the leader writes");

        // The first leader stops renewing (paused, cut off): the second is elected only once
        // the first's lease has run out in etcd, after the first's own clock says so.
        let abandoned = Instant::now();
        first.abandon();
        let second = leader::campaign(cluster.client(), key.clone(), "second", 2)
            .await
            .unwrap();
        let waited = abandoned.elapsed();
        assert!(
            waited >= Duration::from_millis(1500),
            "elected {waited:?} after the first leader stopped renewing a 2 s lease"
        );
        assert!(
            !first_clock.valid(),
            "the first leader's clock outlived its lease"
        );
        assert_ne!(second.fence().revision, stale.fence().revision);

        let refused = stale.save(&batch("j2")).await;
        assert!(
            matches!(refused, Err(StoreError::Deposed)),
            "the deposed leader's write was not refused: {refused:?}"
        );
        let etcd = cluster.client();
        assert!(etcd.get(b"/fence-test/jobs/j2").await.unwrap().is_none());
        assert!(etcd.get(b"/fence-test/jobs/j1").await.unwrap().is_some());
        store(second.fence())
            .save(&batch("j3"))
            .await
            .expect("the new leader writes");
        assert_eq!(
            etcd.get(&key).await.unwrap().unwrap().value,
            b"second".to_vec()
        );
    });
}

#[test]
fn when_the_leader_dies_another_replica_serves_and_the_running_job_stays_where_it_is() {
    let Some(mut cluster) = EtcdCluster::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    governor_integration_tests::loopback_certs(dir.path(), &["node-a"]);
    runtime().block_on(async {
        let (first, second, addresses) = leader_and_standby(dir.path(), &cluster).await;
        let node = node(dir.path(), &addresses);
        let admin = TlsFiles::in_dir(dir.path(), "admin");
        let mut govctl = Client::connect(&addresses, Some(&admin)).await.unwrap();
        let id = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "train").await;
        assert!(!second.leads(), "two replicas lead at once");

        // The loss of one etcd member changes nothing: the leader keeps its lease and writes.
        cluster.kill(0);
        let id2 = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "second").await;
        assert!(first.leads() && !second.leads());
        cluster.restart(0);

        // The leader dies. The other replica serves within the lease (2 s) and a little.
        let died = Instant::now();
        first.crash().await;
        let id3 = submit_to_the_leader(&addresses, &admin, "third", Duration::from_secs(10)).await;
        let failover = died.elapsed();
        assert!(second.leads());
        assert!(
            failover < Duration::from_secs(5),
            "placements served again {failover:?} after the leader died"
        );
        eprintln!("failover: {failover:?}");
        // The node found the new leader and resynced; its jobs were never started again.
        for job in [&id, &id2, &id3] {
            wait_until(
                "every job runs under the new leader",
                Duration::from_secs(15),
                async || {
                    job_state(&addresses, dir.path(), job)
                        .await
                        .filter(|(s, n)| *s == JobState::Running && n == &["node-a".to_string()])
                },
            )
            .await;
        }
        assert!(matches!(
            *node.status.borrow(),
            AgentStatus::Connected { .. }
        ));
        let starts = node.starts.borrow().clone();
        for job in [&id, &id2, &id3] {
            assert_eq!(
                starts.iter().filter(|(j, _)| j == job).count(),
                1,
                "{job} was started more than once: {starts:?}"
            );
        }
        assert_ne!(id3, id, "the new leader reused a job id");
        second.crash().await;
    });
}

#[test]
fn a_leader_paused_past_its_lease_acts_no_more_when_it_resumes_and_no_job_runs_twice() {
    use nix::sys::signal::Signal;
    let Some(cluster) = EtcdCluster::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    governor_integration_tests::loopback_certs(dir.path(), &["node-a"]);
    let (a, b) = (loopback(), loopback());
    let addresses = format!("{a},{b}");
    let first = Replica::start(dir.path(), "a", a, &cluster.config(), "lost_after_s = 5.0");
    runtime().block_on(async {
        let admin = TlsFiles::in_dir(dir.path(), "admin");
        wait_until(
            "the first replica leads",
            Duration::from_secs(20),
            async || Client::connect(&a.to_string(), Some(&admin)).await.ok(),
        )
        .await;
        let second = Replica::start(dir.path(), "b", b, &cluster.config(), "lost_after_s = 5.0");
        let node = node(dir.path(), &addresses);
        let mut govctl = Client::connect(&addresses, Some(&admin)).await.unwrap();
        let id = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "train").await;

        // Pause the leader past its lease (2 s): the other replica is elected and serves.
        first.signal(Signal::SIGSTOP);
        let id2 = wait_until(
            "the second replica takes submissions",
            Duration::from_secs(15),
            async || {
                let mut c = Client::connect(&b.to_string(), Some(&admin)).await.ok()?;
                c.submit(JobSpec::new("second", vec!["x".into()], "/tmp/second.log"))
                    .await
                    .ok()
                    .map(|j| j.id)
            },
        )
        .await;
        wait_until(
            "the node follows the new leader and runs the new job",
            Duration::from_secs(30),
            async || {
                job_state(&b.to_string(), dir.path(), &id2)
                    .await
                    .filter(|(s, _)| *s == JobState::Running)
            },
        )
        .await;

        // Resumed, the old leader finds its lease gone: it stops acting and stops listening,
        // before handling anything its paused sessions had queued.
        first.signal(Signal::SIGCONT);
        wait_until(
            "the resumed replica says it no longer leads",
            Duration::from_secs(10),
            async || {
                first
                    .log()
                    .contains("the leader lease ran out: this coordinator stops acting")
                    .then_some(())
            },
        )
        .await;
        wait_until(
            "the resumed replica stops listening",
            Duration::from_secs(10),
            async || {
                Client::connect(&a.to_string(), Some(&admin))
                    .await
                    .is_err()
                    .then_some(())
            },
        )
        .await;
        let etcd = cluster.client();
        let leader = etcd.get(&leader_key("/governor")).await.unwrap().unwrap();
        assert!(
            String::from_utf8_lossy(&leader.value).ends_with(&b.to_string()),
            "the leader key names {:?}",
            String::from_utf8_lossy(&leader.value)
        );
        // Each job was started once, on the one node; both still run under the new leader.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let starts = node.starts.borrow().clone();
        for job in [&id, &id2] {
            assert_eq!(
                starts.iter().filter(|(j, _)| j == job).count(),
                1,
                "{job} was started more than once: {starts:?}"
            );
            let (state, _) = job_state(&b.to_string(), dir.path(), job).await.unwrap();
            assert_eq!(state, JobState::Running, "{job}");
        }
        assert_eq!(
            first.log().matches("elected leader").count(),
            1,
            "the resumed replica was elected again while the other led:\n{}",
            first.log()
        );
        drop(second);
    });
}

#[test]
fn a_move_resumes_from_its_phase_when_the_leader_dies_in_it_and_each_attempt_runs_on_one_node() {
    use governor_proto::control::MovePhase;
    let Some(cluster) = EtcdCluster::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    governor_integration_tests::loopback_certs(dir.path(), &["node-a", "node-b"]);
    runtime().block_on(async {
        let (a, b, c) = (loopback(), loopback(), loopback());
        let addresses = format!("{a},{b},{c}");
        let config = |listen: SocketAddr| {
            let mut c = replica_config(dir.path(), &listen.to_string(), listen, cluster.config());
            c.state.auto_move = false;
            c
        };
        let mut leader = server::replica(config(a));
        tokio::time::timeout(Duration::from_secs(10), leader.elected())
            .await
            .expect("a replica leads");
        let mut standby = server::replica(config(b));
        let mut spare = Some(c);
        let nodes = [
            named_node(dir.path(), "node-a", &addresses),
            named_node(dir.path(), "node-b", &addresses),
        ];
        let admin = TlsFiles::in_dir(dir.path(), "admin");
        let govctl = async || Client::connect(&addresses, Some(&admin)).await.ok();
        wait_until("both nodes ready", Duration::from_secs(15), async || {
            let n = govctl().await?.nodes().await.ok()?;
            (n.len() == 2).then_some(())
        })
        .await;
        let mut spec = JobSpec::new("mover", vec!["x".into()], "/tmp/mover.log");
        spec.checkpoint = Some(governor_proto::node::Checkpoint {
            dir: "/shared/mover".into(),
            save_signal: governor_proto::node::DEFAULT_SAVE_SIGNAL,
            carry: false,
            transparent: false,
        });
        let id = govctl().await.unwrap().submit(spec).await.unwrap().id;
        let on_node = async |node: &str| {
            wait_until(
                "the job runs where the move left it",
                Duration::from_secs(30),
                async || {
                    let d = govctl().await?.job(&id).await.ok()?;
                    let last = d.moves.last().map(|m| m.phase);
                    (d.summary.status == JobState::Running
                        && d.summary.members.first().is_some_and(|m| m.node == node)
                        && last.is_none_or(|p| p.is_over()))
                    .then_some(last)
                },
            )
            .await
        };
        on_node("node-a").await;

        // Each phase: hold the node that answers it, ask for the move, wait for the phase,
        // crash the leader, let the standby take over (a fresh replica becomes the standby),
        // release the node. The move must end done on its target.
        for (phase, from, to, held) in [
            (MovePhase::Saving, "node-a", "node-b", 0),
            (MovePhase::Restoring, "node-b", "node-a", 0),
        ] {
            nodes[held].hold.send_replace(true);
            govctl()
                .await
                .unwrap()
                .move_job(&id, Some(to))
                .await
                .unwrap();
            wait_until(
                "the move reaches the phase",
                Duration::from_secs(15),
                async || {
                    let d = govctl().await?.job(&id).await.ok()?;
                    (d.moves.last()?.phase == phase).then_some(())
                },
            )
            .await;
            leader.crash().await;
            tokio::time::timeout(Duration::from_secs(10), standby.elected())
                .await
                .unwrap_or_else(|_| panic!("no replica took over in {phase:?}"));
            leader = standby;
            let next = spare.take().unwrap();
            standby = server::replica(config(next));
            spare = Some(if next == a {
                b
            } else if next == b {
                c
            } else {
                a
            });
            nodes[held].hold.send_replace(false);
            let last = on_node(to).await;
            assert_eq!(
                last,
                Some(MovePhase::Done),
                "the move from {from} in {phase:?}"
            );
        }

        // Every attempt of the job was started on one node only (a resent start of the same
        // attempt to the same node is idempotent on a real node).
        let mut where_started: std::collections::BTreeMap<u32, Vec<&str>> = Default::default();
        let starts: Vec<(usize, Vec<(String, u32)>)> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (i, n.starts.borrow().clone()))
            .collect();
        for (i, list) in &starts {
            for (_, attempt) in list.iter().filter(|(j, _)| j == &id) {
                let name = ["node-a", "node-b"][*i];
                let v = where_started.entry(*attempt).or_default();
                if !v.contains(&name) {
                    v.push(name);
                }
            }
        }
        assert_eq!(
            where_started.len(),
            3,
            "attempts 0, 1, 2: {where_started:?}"
        );
        assert!(
            where_started.values().all(|v| v.len() == 1),
            "an attempt started on two nodes: {where_started:?}"
        );
        leader.crash().await;
        standby.crash().await;
    });
}

#[test]
fn the_whole_cluster_restarted_keeps_its_jobs_and_starts_none_of_them_again() {
    let Some(mut cluster) = EtcdCluster::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    governor_integration_tests::loopback_certs(dir.path(), &["node-a"]);
    runtime().block_on(async {
        let (a, b) = (loopback(), loopback());
        let addresses = format!("{a},{b}");
        let admin = TlsFiles::in_dir(dir.path(), "admin");
        let mut first = server::replica(replica_config(dir.path(), "a", a, cluster.config()));
        tokio::time::timeout(Duration::from_secs(10), first.elected())
            .await
            .expect("a replica leads");
        let second = server::replica(replica_config(dir.path(), "b", b, cluster.config()));
        let node = node(dir.path(), &addresses);
        let mut govctl = Client::connect(&addresses, Some(&admin)).await.unwrap();
        let id = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "train").await;

        // Every coordinator and every etcd member down (a power cut), then all back.
        first.crash().await;
        second.crash().await;
        for m in 0..3 {
            cluster.kill(m);
        }
        for m in 0..3 {
            cluster.restart(m);
        }
        cluster.serving().await;
        let first = server::replica(replica_config(dir.path(), "a", a, cluster.config()));
        let second = server::replica(replica_config(dir.path(), "b", b, cluster.config()));
        wait_until(
            "the job runs on its node under the restarted cluster",
            Duration::from_secs(30),
            async || {
                job_state(&addresses, dir.path(), &id)
                    .await
                    .filter(|(s, n)| *s == JobState::Running && n == &["node-a".to_string()])
            },
        )
        .await;
        let mut govctl = Client::connect(&addresses, Some(&admin)).await.unwrap();
        let id2 = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "after").await;
        assert_ne!(id2, id, "a job id was reused after the restart");
        let starts = node.starts.borrow().clone();
        assert_eq!(
            starts.iter().filter(|(j, _)| j == &id).count(),
            1,
            "the job was started again after the restart: {starts:?}"
        );
        first.crash().await;
        second.crash().await;
    });
}

/// `[state.etcd] tls`: the members ask every client for a certificate signed by the cluster's
/// CA. A replica given its files is elected, stores what it places and serves; a client with no
/// certificate, or with one another CA signed, is refused.
#[test]
fn a_replica_reaches_etcd_over_mutual_tls_and_a_client_without_a_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    governor_integration_tests::loopback_certs(dir.path(), &["node-a"]);
    let Some(cluster) = EtcdCluster::start_tls(3, dir.path()) else {
        return;
    };
    let config = cluster.config();
    assert!(config.endpoints.iter().all(|e| e.starts_with("https://")));
    runtime().block_on(async {
        let a = loopback();
        let mut replica = server::replica(replica_config(dir.path(), "a", a, config.clone()));
        tokio::time::timeout(Duration::from_secs(10), replica.elected())
            .await
            .expect("the replica leads over TLS");
        let _node = node(dir.path(), &a.to_string());
        let admin = TlsFiles::in_dir(dir.path(), "admin");
        let mut govctl = Client::connect(&a.to_string(), Some(&admin)).await.unwrap();
        let id = submit_and_wait_running(&mut govctl, &a.to_string(), dir.path(), "train").await;
        let etcd = cluster.client();
        let stored = etcd
            .get(format!("/governor/jobs/{id}").as_bytes())
            .await
            .expect("a client with the cluster's certificate reads");
        assert!(stored.is_some(), "the job's record is not in etcd");

        // Without a certificate: refused in the handshake.
        let plain = Etcd::new(&EtcdConfig {
            endpoints: config.endpoints.clone(),
            tls: None,
            ..config.clone()
        });
        match plain {
            Err(e) => assert!(e.to_string().contains("https needs"), "{e}"),
            Ok(c) => assert!(c.get(b"/governor/leader").await.is_err()),
        }
        // Trusting the cluster's CA but presenting a certificate another CA signed: etcd
        // refuses it.
        let stranger = tempfile::tempdir().unwrap();
        governor_integration_tests::loopback_certs(stranger.path(), &[]);
        let foreign_identity = TlsFiles::in_dir(stranger.path(), "admin");
        let foreign = Etcd::new(&EtcdConfig {
            tls: Some(TlsFiles {
                ca: admin.ca.clone(),
                ..foreign_identity
            }),
            ..config.clone()
        })
        .unwrap();
        assert!(foreign.get(b"/governor/leader").await.is_err());
        replica.crash().await;
    });
}

/// `coordinator migrate`: a cluster on the embedded store switches to replicas on etcd and
/// keeps its state. The redb coordinator's running job is found on its node by the replica
/// that loads the copy, and not started again; job ids go on past the copied ones; a second
/// migration into the prefix the replicas now use is refused, as is one from a missing file.
#[test]
fn a_redb_store_migrated_to_etcd_keeps_its_jobs_running_where_they_run() {
    let Some(cluster) = EtcdCluster::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    governor_integration_tests::loopback_certs(dir.path(), &["node-a"]);
    let etcd = cluster.config();
    // The replicas' configuration, as the operator writes it: what `migrate` reads.
    let endpoints: Vec<String> = etcd.endpoints.iter().map(|e| format!("{e:?}")).collect();
    let replicas_toml = dir.path().join("replicas.toml");
    std::fs::write(
        &replicas_toml,
        format!(
            "[state]\nbackend = \"etcd\"\n[state.etcd]\nendpoints = [{}]\nprefix = {:?}\n",
            endpoints.join(", "),
            etcd.prefix
        ),
    )
    .unwrap();
    let old_store = dir.path().join("old.redb");
    let migrate = |from: &Path| {
        std::process::Command::new(governor_integration_tests::daemon::bin("coordinator"))
            .args(["migrate", "--config"])
            .arg(&replicas_toml)
            .arg("--from")
            .arg(from)
            .output()
            .expect("the coordinator binary runs")
    };
    runtime().block_on(async {
        let (a, b) = (loopback(), loopback());
        let addresses = format!("{a},{b}");
        let admin = TlsFiles::in_dir(dir.path(), "admin");
        // One coordinator on its redb file, on `a`; the node knows `a` and the replica to come.
        let mut embedded = replica_config(dir.path(), "old", a, EtcdConfig::default());
        embedded.state.backend = Backend::Redb;
        embedded.store = old_store.clone();
        embedded.policy = "round-robin".into();
        let old = server::start(embedded)
            .await
            .expect("the redb coordinator starts");
        let node = node(dir.path(), &addresses);
        let mut govctl = Client::connect(&addresses, Some(&admin)).await.unwrap();
        let first = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "train").await;
        let second = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "eval").await;
        drop(govctl);
        old.stop().await;

        let out = migrate(&old_store);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            said.contains("1 node(s), 2 job(s), policy round-robin"),
            "{said}"
        );

        let replica_a = server::replica(replica_config(dir.path(), "a", a, cluster.config()));
        let replica_b = server::replica(replica_config(dir.path(), "b", b, cluster.config()));
        for id in [&first, &second] {
            wait_until(
                "the job runs on its node under the replicas",
                Duration::from_secs(30),
                async || {
                    job_state(&addresses, dir.path(), id)
                        .await
                        .filter(|(s, n)| *s == JobState::Running && n == &["node-a".to_string()])
                },
            )
            .await;
        }
        let mut govctl = Client::connect(&addresses, Some(&admin)).await.unwrap();
        assert_eq!(
            govctl.policy().await.unwrap().current,
            "round-robin",
            "the policy came with the state"
        );
        let third = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "after").await;
        assert!(
            third != first && third != second,
            "a copied job id was issued again: {third}"
        );
        let starts = node.starts.borrow().clone();
        for id in [&first, &second] {
            assert_eq!(
                starts.iter().filter(|(j, _)| j == id).count(),
                1,
                "{id} was started again after the migration: {starts:?}"
            );
        }

        // Into the prefix the replicas use now: refused, nothing written.
        let out = migrate(&old_store);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a second migration was accepted");
        assert!(err.contains("already holds"), "{err}");
        let out = migrate(&dir.path().join("missing.redb"));
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no redb store at"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        replica_a.crash().await;
        replica_b.crash().await;
    });
}

/// A submission is answered only once etcd holds it. With etcd's quorum gone the leader can
/// store nothing: a submission made then is not acknowledged (before, it was answered at once
/// with an id that the store never held, and the next leader gave that id to another job: the
/// soak saw `train14` and `train15` both told `j15`). Once etcd is back, every id ever
/// acknowledged names the job it was given to.
#[test]
fn a_submission_is_acknowledged_only_once_stored_and_no_acknowledged_id_is_given_again() {
    let Some(mut cluster) = EtcdCluster::start(3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    governor_integration_tests::loopback_certs(dir.path(), &["node-a"]);
    runtime().block_on(async {
        let (first, second, addresses) = leader_and_standby(dir.path(), &cluster).await;
        let _node = node(dir.path(), &addresses);
        let admin = TlsFiles::in_dir(dir.path(), "admin");
        let mut acknowledged: Vec<(String, String)> = Vec::new();
        let mut govctl = Client::connect(&addresses, Some(&admin)).await.unwrap();
        let id = submit_and_wait_running(&mut govctl, &addresses, dir.path(), "before").await;
        acknowledged.push((id, "before".into()));

        // No quorum: nothing can be stored.
        cluster.kill(1);
        cluster.kill(2);
        let answer = tokio::time::timeout(
            Duration::from_secs(4),
            govctl.submit(JobSpec::new(
                "unstored",
                vec!["x".into()],
                "/tmp/unstored.log",
            )),
        )
        .await;
        match answer {
            Ok(Ok(job)) => panic!(
                "{} was acknowledged while etcd had no quorum: nothing held it",
                job.id
            ),
            Ok(Err(e)) => eprintln!("without quorum the submission failed: {e}"),
            Err(_) => eprintln!("without quorum the submission got no answer in 4 s"),
        }

        cluster.restart(1);
        cluster.restart(2);
        cluster.serving().await;
        // Whichever replica leads now, new submissions get ids never acknowledged before.
        for name in ["after-1", "after-2"] {
            let id = submit_to_the_leader(&addresses, &admin, name, Duration::from_secs(20)).await;
            acknowledged.push((id, name.into()));
        }
        for (id, name) in &acknowledged {
            let named = wait_until(
                "every acknowledged job is known by its id",
                Duration::from_secs(10),
                async || {
                    let tls = TlsFiles::in_dir(dir.path(), "admin");
                    let mut c = Client::connect(&addresses, Some(&tls)).await.ok()?;
                    c.job(id).await.ok().map(|j| j.summary.name)
                },
            )
            .await;
            assert_eq!(
                &named, name,
                "{id} was acknowledged for {name} but names {named}"
            );
        }
        let ids: std::collections::BTreeSet<&String> =
            acknowledged.iter().map(|(i, _)| i).collect();
        assert_eq!(
            ids.len(),
            acknowledged.len(),
            "an id was given twice: {acknowledged:?}"
        );
        first.crash().await;
        second.crash().await;
    });
}
