//! What the coordinator's benchmarks share: the simulated node (32 cores, 256 GiB, every tenth
//! with 8 GPUs, reporting 4 jobs of its own), their command-line arguments and percentiles.

#![allow(dead_code)] // each bench uses its part

use governor_proto::node::{Category, GpuDevice, Hello, JobOrigin, JobReport, NodeCapacity};

/// The value after `--name` on the command line, or `default`.
pub(crate) fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `q` quantile of sorted values (0 for none).
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Simulated node `index`'s hello: 32 cores, 256 GiB, and 8 GPUs on every tenth node.
pub(crate) fn node_hello(name: String, index: usize) -> Hello {
    let gpus = if index.is_multiple_of(10) {
        (0..8)
            .map(|g| GpuDevice {
                index: g,
                model: "H100".into(),
                memory_bytes: 80 << 30,
            })
            .collect()
    } else {
        Vec::new()
    };
    Hello {
        node_name: name,
        capacity: NodeCapacity {
            cores: 32.0,
            memory_bytes: 256 << 30,
            gpus,
        },
        agent_version: "bench".into(),
        can_dump: false,
    }
}

/// Local job `k` of node `node` at report `t`: its stage turns every minute, its progress
/// slows, it knows its epochs.
pub(crate) fn local_job(k: usize, node: usize, t: u64) -> JobReport {
    let mut j = JobReport::running(format!("local-{k}"), format!("train-{k}"));
    j.origin = JobOrigin::Local;
    j.category = Category::ALL[(node + k + (t as usize / 60)) % 4];
    j.progress = Some(1.0 / (1.0 + t as f64 + k as f64));
    j.growth = Some(0.01);
    j.growth_efficiency = Some(0.005);
    j.cpu_cores = 2.0;
    j.memory_bytes = 4 << 30;
    j.epoch = Some(t / 30);
    j.max_epochs = Some(100);
    j.epoch_seconds = Some(30.0);
    j
}

/// An etcd cluster of `n` members on loopback (Debian's `etcd-server`; `cargo xtask setup`
/// installs it), killed when dropped.
pub(crate) struct Etcd {
    members: Vec<(std::process::Child, String)>,
}

impl Etcd {
    pub(crate) fn start(dir: &std::path::Path, n: usize) -> Etcd {
        use std::process::{Command, Stdio};
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free(), free())).collect();
        let cluster: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let url = format!("http://127.0.0.1:{client}");
                let child = Command::new("etcd")
                    .arg(format!("--name=m{i}"))
                    .arg("--data-dir")
                    .arg(dir.join(format!("etcd-m{i}")))
                    .arg(format!("--listen-client-urls={url}"))
                    .arg(format!("--advertise-client-urls={url}"))
                    .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                    .arg(format!(
                        "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                    ))
                    .arg(format!("--initial-cluster={}", cluster.join(",")))
                    .args(["--logger=zap", "--log-level=error"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("start etcd (Debian's etcd-server; `cargo xtask setup` installs it)");
                (child, url)
            })
            .collect();
        let e = Etcd { members };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !e
            .metrics()
            .is_some_and(|m| m.contains("etcd_server_has_leader 1"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "etcd did not elect a leader in 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        e
    }

    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|(_, u)| u.clone()).collect()
    }

    /// `/metrics` of the first member (plain HTTP on its client port).
    pub(crate) fn metrics(&self) -> Option<String> {
        use std::io::{Read, Write};
        let addr = self.members[0].1.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.contains("etcd_mvcc").then_some(body)
    }

    /// The first member's puts, transactions, WAL fsyncs so far, and its CPU seconds by `cpu`.
    pub(crate) fn counters(&self, cpu: impl Fn(u32) -> (f64, u64, u64)) -> [f64; 4] {
        let m = self.metrics().unwrap_or_default();
        let get = |name: &str| {
            m.lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        [
            get("etcd_mvcc_put_total"),
            get("etcd_mvcc_txn_total"),
            get("etcd_disk_wal_fsync_duration_seconds_count"),
            cpu(self.members[0].0.id()).0,
        ]
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for (c, _) in &mut self.members {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
