//! Load benchmark: the real `coordinator` binary with N simulated nodes (default 10,000) in this
//! one process, each on a real gRPC session reporting once a second, while jobs are submitted
//! through the control service. Reports the coordinator process's CPU and memory and the
//! placement decision latency.
//!
//! ```text
//! cargo bench -p coordinator --bench cluster_load -- [--nodes 10000] [--seconds 30]
//!     [--connections 100] [--submit-rate 20] [--etcd]
//! ```
//!
//! `--etcd`: the state on etcd (`[state] backend = "etcd"`) instead of redb: the bench starts a
//! one-member etcd on loopback (Debian's `etcd-server`; one member, because three on the same
//! two cores would measure the scheduler) and reports its write rate from its own counters
//! (`etcd_mvcc_put_total`, `etcd_mvcc_txn_total`, WAL fsyncs).
//!
//! Simulated nodes share `--connections` HTTP/2 connections (a real node has its own; the
//! coordinator's per-session work is the same, the per-connection TLS/TCP cost is not measured).
//! Plain text, so TLS record costs are not measured either. The nodes (and this process) run on
//! the same machine as the coordinator; they run at nice 10 so that they stand in for remote
//! machines instead of taking the coordinator's CPU (with 10,000 nodes they need more CPU than
//! the coordinator does, and on a 2-core machine the latencies would measure the scheduler).

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use governor_proto::control::JobSpec;
use governor_proto::node::{JobReport, NodeMessage, NodeReport};
use governor_proto::pb;
use governor_proto::pb::control_service_client::ControlServiceClient;
use governor_proto::pb::node_service_client::NodeServiceClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

mod common;
use common::{Etcd, arg, local_job, node_hello, percentile};

/// (CPU seconds, RSS bytes, peak RSS bytes) of a process.
fn proc_usage(pid: u32) -> (f64, u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (ticks / 100.0, kib("VmRSS:"), kib("VmHWM:"))
}

/// One simulated node: register, report every second (phase-shifted), start what it is told.
async fn node(channel: Channel, index: usize, phase: Duration) {
    let name = format!("sim{index:05}");
    let hello = node_hello(name, index);
    let mut client = NodeServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(4);
    tx.send(NodeMessage::Hello(hello).into()).await.unwrap();
    let mut inbound = match client.session(ReceiverStream::new(rx)).await {
        Ok(r) => r.into_inner(),
        Err(e) => panic!("node {index} could not open a session: {e}"),
    };
    let mut started: Vec<JobReport> = Vec::new();
    tokio::time::sleep(phase).await;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut t = 0u64;
    loop {
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(pb::CoordinatorMessage { body: Some(pb::coordinator_message::Body::StartJob(s)) })) => {
                    let mut j = JobReport::running(&s.job_id, &s.name);
                    j.replica = s.replica;
                    j.gpu_indices = s.gpu_indices;
                    started.push(j);
                }
                Ok(Some(_)) => {}
                _ => return,
            },
            _ = tick.tick() => {
                t += 1;
                let mut jobs: Vec<JobReport> = (0..4).map(|k| local_job(k, index, t)).collect();
                jobs.extend(started.iter().cloned());
                let report = NodeReport {
                    sequence: t,
                    cpu_used_cores: 8.0,
                    memory_used_bytes: 16 << 30,
                    jobs,
                    ..NodeReport::default()
                };
                if tx.send(NodeMessage::Report(report).into()).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[tokio::main]
async fn main() {
    let nodes = arg("--nodes", 10_000u64) as usize;
    let seconds = arg("--seconds", 30u64);
    let connections = arg("--connections", 100u64).max(1) as usize;
    let submit_rate = arg("--submit-rate", 20u64).max(1);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let address = format!("127.0.0.1:{port}");
    let etcd = std::env::args()
        .any(|a| a == "--etcd")
        .then(|| Etcd::start(dir.path(), 1));
    let mut coordinator = Command::new(env!("CARGO_BIN_EXE_coordinator"));
    coordinator
        .args([
            "--insecure",
            "--listen",
            &address,
            "--policy",
            "soonest",
            "--lost-after",
            "30",
        ])
        .arg("--store")
        .arg(dir.path().join("bench.redb"))
        .args(["--log-level", "warn"])
        .stdin(Stdio::null());
    if let Some(e) = &etcd {
        let config = dir.path().join("coordinator.toml");
        std::fs::write(
            &config,
            format!(
                "[state]\nbackend = \"etcd\"\n[state.etcd]\nendpoints = [\"{}\"]\n",
                e.endpoints()[0]
            ),
        )
        .unwrap();
        coordinator.arg("--config").arg(config);
    }
    let mut coordinator = coordinator.spawn().expect("start the coordinator binary");
    let pid = coordinator.id();
    // A failed run (a panic below) must not leave the coordinator running: it would load the
    // machine for every later measurement.
    let _reaper = KillOnDrop(pid);
    lower_own_priority();
    let endpoint = governor_proto::tls::endpoint(&address, None).unwrap();
    let mut control = loop {
        match endpoint.connect().await {
            Ok(ch) => break ControlServiceClient::new(ch),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let idle = proc_usage(pid);
    println!(
        "coordinator pid {pid} on {address}; idle RSS {:.1} MiB",
        idle.1 as f64 / 1048576.0
    );

    // Bring the nodes up over ~10 s.
    let mut channels = Vec::new();
    for _ in 0..connections {
        channels.push(endpoint.connect().await.expect("connect"));
    }
    let started = Instant::now();
    for i in 0..nodes {
        let ch = channels[i % connections].clone();
        let phase = Duration::from_millis((i as u64 * 7919) % 1000);
        tokio::spawn(node(ch, i, phase));
        if i % 1000 == 999 {
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
    }
    loop {
        let s = control
            .get_stats(pb::GetStatsRequest {})
            .await
            .unwrap()
            .into_inner();
        if s.ready_nodes as usize >= nodes {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "only {} of {nodes} nodes registered in 300 s",
            s.ready_nodes
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "{nodes} nodes registered in {:.1} s; warming up 5 s",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The measured window.
    let before = proc_usage(pid);
    let etcd0 = etcd.as_ref().map(|e| e.counters(proc_usage));
    let stats0 = control
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    let window = Instant::now();
    let mut submit_ms = Vec::new();
    let mut k = 0u64;
    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / submit_rate as f64));
    while window.elapsed() < Duration::from_secs(seconds) {
        pace.tick().await;
        k += 1;
        let mut spec = JobSpec::new(format!("bench-{k}"), vec!["train".into()], "/tmp/bench.log");
        spec.gpus = (k % 3) as u32;
        let t = Instant::now();
        control
            .submit_job(pb::SubmitJobRequest {
                spec: Some(spec.into()),
            })
            .await
            .expect("submit");
        submit_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let elapsed = window.elapsed().as_secs_f64();
    let after = proc_usage(pid);
    let etcd1 = etcd.as_ref().map(|e| e.counters(proc_usage));
    let stats = control
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    submit_ms.sort_by(f64::total_cmp);
    let reports_per_s = (stats.reports - stats0.reports) as f64 / elapsed;
    println!();
    println!(
        "cluster_load: {nodes} simulated nodes, {connections} connections, {seconds} s window, {submit_rate} submissions/s"
    );
    println!("  reports received          {reports_per_s:.0}/s");
    println!(
        "  coordinator CPU           {:.2} cores ({:.1}% of one core)",
        (after.0 - before.0) / elapsed,
        100.0 * (after.0 - before.0) / elapsed
    );
    println!(
        "  coordinator RSS           {:.1} MiB (peak {:.1} MiB, idle {:.1} MiB)",
        after.1 as f64 / 1048576.0,
        after.2 as f64 / 1048576.0,
        idle.1 as f64 / 1048576.0
    );
    println!(
        "  jobs placed               {} ({} queued)",
        stats.placements - stats0.placements,
        stats.queued_jobs
    );
    println!(
        "  placement decision        p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  (coordinator, admission round)",
        stats.placement_p50_ms, stats.placement_p99_ms, stats.placement_max_ms
    );
    println!(
        "  submit round trip         p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  (govctl's view, includes queueing behind reports)",
        percentile(&submit_ms, 0.5),
        percentile(&submit_ms, 0.99),
        percentile(&submit_ms, 1.0)
    );
    if let (Some(a), Some(b)) = (etcd0, etcd1) {
        let rate = |i: usize| (b[i] - a[i]) / elapsed;
        println!(
            "  etcd                      {:.0} puts/s in {:.0} transactions/s ({:.4} puts per node report), {:.0} WAL fsyncs/s; etcd CPU {:.2} cores",
            rate(0),
            rate(1),
            rate(0) / reports_per_s.max(1.0),
            rate(2),
            rate(3),
        );
    }
    let _ = coordinator.kill();
    let _ = coordinator.wait();
}

/// Nice 10 for every thread of this process (the coordinator, started before, keeps its own).
fn lower_own_priority() {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    let tids: Vec<String> = tasks
        .flatten()
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect();
    let _ = Command::new("renice")
        .args(["-n", "10", "-p"])
        .args(&tids)
        .stdout(Stdio::null())
        .status();
}

/// Kills a process when dropped (on a panic too).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-9")
            .arg(self.0.to_string())
            .status();
    }
}
