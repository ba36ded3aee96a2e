//! Failover benchmark: two coordinator replicas (in this process) on a three-member etcd on
//! loopback; the leader is killed as a crash would (its lease left to run out) and the time
//! until a submission through the list of both addresses is placed again is measured, `--reps`
//! times, each on a fresh key prefix.
//!
//! ```text
//! cargo bench -p coordinator --bench failover -- [--reps 5] [--lease 5]
//! ```
//!
//! What it measures: the lease running out in etcd (`--lease` seconds from the last renewal,
//! which comes every third of it), the follower's next try (every 0.5 s), loading the state,
//! and `govctl`'s connection to the new leader. No nodes: their reconnection is the agent's
//! back-off and silence limit, not the election.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use coordinator::cli::Client;
use coordinator::etcd::EtcdConfig;
use coordinator::server::{self, Backend, ServerConfig, StateSection};
use governor_proto::control::JobSpec;

mod common;
use common::{Etcd, arg, percentile};

fn free() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn config(dir: &std::path::Path, listen: SocketAddr, etcd: EtcdConfig) -> ServerConfig {
    ServerConfig {
        listen,
        store: dir.join(format!("{}.redb", listen.port())),
        tls: None,
        policy: "first-fit".into(),
        state: StateSection {
            backend: Backend::Etcd,
            etcd,
            ..Default::default()
        },
        web: Default::default(),
    }
}

#[tokio::main]
async fn main() {
    let reps = arg("--reps", 5u64);
    let lease = arg("--lease", 5u64);
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), 3);
    let mut took = Vec::new();
    for rep in 0..reps {
        let etcd_config = EtcdConfig {
            endpoints: etcd.endpoints(),
            prefix: format!("/bench-failover-{rep}"),
            lease_ttl_s: lease,
            ..Default::default()
        };
        let (a, b) = (free(), free());
        let addresses = format!("{a},{b}");
        let mut first = server::replica(config(dir.path(), a, etcd_config.clone()));
        first.elected().await;
        let second = server::replica(config(dir.path(), b, etcd_config));
        let submit = |name: &'static str| {
            let addresses = addresses.clone();
            async move {
                let mut c = Client::connect(&addresses, None).await.ok()?;
                c.submit(JobSpec::new(name, vec!["x".into()], "/tmp/x.log"))
                    .await
                    .ok()
            }
        };
        assert!(submit("before").await.is_some(), "the first leader serves");
        // Let a renewal or two pass, as a leader that has served a while.
        tokio::time::sleep(Duration::from_secs(lease)).await;
        let killed = Instant::now();
        first.crash().await;
        loop {
            if submit("after").await.is_some() {
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(lease * 4 + 10),
                "no leader serves {:?} after the crash",
                killed.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let s = killed.elapsed().as_secs_f64();
        println!("rep {rep}: placements served again {s:.2} s after the leader died");
        took.push(s);
        second.crash().await;
    }
    took.sort_by(f64::total_cmp);
    println!(
        "failover ({reps} reps, {lease} s lease, 3 etcd members on loopback): median {:.2} s, min {:.2} s, max {:.2} s",
        percentile(&took, 0.5),
        percentile(&took, 0.0),
        percentile(&took, 1.0)
    );
}
