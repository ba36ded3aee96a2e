//! A real etcd cluster on loopback for the replicated coordinator's tests: Debian's
//! `etcd-server` (installed by `cargo xtask setup`), each member a process of its own with its
//! data in a temporary directory, killed and restarted by the tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::free_port;

/// One member: its ports and, while it runs, its process.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// A running etcd cluster; its members are killed when it is dropped.
pub struct EtcdCluster {
    etcd: PathBuf,
    dir: tempfile::TempDir,
    members: Vec<Member>,
    /// Clients over mutual TLS: the certificates of [`crate::loopback_certs`] in this directory
    /// (the members serve with the coordinator's, for 127.0.0.1, and ask every client for one
    /// signed by its CA; peers talk plain http).
    tls: Option<PathBuf>,
}

impl EtcdCluster {
    /// Start `n` members and wait until the cluster serves writes. `None` (the test skips) when
    /// etcd is not installed, unless `GOVERNOR_REQUIRE_TOOLS` is set (`cargo xtask test`).
    pub fn start(n: usize) -> Option<EtcdCluster> {
        EtcdCluster::start_with(n, None)
    }

    /// [`EtcdCluster::start`] with clients over mutual TLS, the certificates in `certs`
    /// ([`crate::loopback_certs`]); [`EtcdCluster::config`] presents the `admin` certificate.
    pub fn start_tls(n: usize, certs: &Path) -> Option<EtcdCluster> {
        EtcdCluster::start_with(n, Some(certs.to_owned()))
    }

    fn start_with(n: usize, tls: Option<PathBuf>) -> Option<EtcdCluster> {
        let etcd = crate::tool(&["etcd"])?;
        let members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            etcd,
            dir: tempfile::tempdir().expect("a directory for etcd's data"),
            members,
            tls,
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        cluster.wait_serving();
        Some(cluster)
    }

    fn spawn(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect();
        let m = &self.members[i];
        let data = self.dir.path().join(&m.name);
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", m.name)))
            .expect("etcd's log file");
        let scheme = self.scheme();
        let mut command = Command::new(&self.etcd);
        if let Some(certs) = &self.tls {
            command
                .arg("--cert-file")
                .arg(certs.join("coordinator.pem"))
                .arg("--key-file")
                .arg(certs.join("coordinator-key.pem"))
                .arg("--trusted-ca-file")
                .arg(certs.join("ca.pem"))
                .arg("--client-cert-auth");
        }
        let child = command
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .arg(format!(
                "--listen-client-urls={scheme}://127.0.0.1:{}",
                m.client
            ))
            .arg(format!(
                "--advertise-client-urls={scheme}://127.0.0.1:{}",
                m.client
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{}", m.peer))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                m.peer
            ))
            .arg(format!("--initial-cluster={}", initial.join(",")))
            .arg("--initial-cluster-state=new")
            .arg("--initial-cluster-token=governor-test")
            // A loopback cluster: elect within half a second of losing a member.
            .args(["--heartbeat-interval=50", "--election-timeout=500"])
            .args(["--logger=zap", "--log-level=warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.members[i].child = Some(child);
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", self.scheme(), m.client))
            .collect()
    }

    /// Kill member `i` (SIGKILL, as a machine's loss).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start member `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// Where the members' logs are.
    pub fn log_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client of this cluster.
    pub fn client(&self) -> coordinator::etcd::Etcd {
        coordinator::etcd::Etcd::new(&self.config()).expect("the test's etcd endpoints")
    }

    /// `[state.etcd]` for this cluster (a coordinator's lease of `lease_ttl_s` 2 s).
    pub fn config(&self) -> coordinator::etcd::EtcdConfig {
        coordinator::etcd::EtcdConfig {
            endpoints: self.endpoints(),
            request_timeout_ms: 500,
            lease_ttl_s: 2,
            tls: self
                .tls
                .as_ref()
                .map(|d| governor_proto::tls::TlsFiles::in_dir(d, "admin")),
            ..Default::default()
        }
    }

    /// [`EtcdCluster::wait_serving`] from inside a runtime.
    pub async fn serving(&self) {
        let etcd = self.client();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while etcd.txn(Default::default()).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "etcd does not serve writes 30 s after its restart (logs in {})",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Wait until a write through the members succeeds (a leader is elected). Not from inside
    /// a runtime: it runs one of its own.
    fn wait_serving(&self) {
        let etcd = self.client();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let logs = self.dir.path().to_owned();
        crate::poll_until(
            "etcd serves writes",
            Duration::from_secs(30),
            Duration::from_millis(200),
            || rt.block_on(etcd.txn(Default::default())).ok().map(|_| ()),
            || {
                let mut s = String::new();
                for e in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
                    if e.path().extension().is_some_and(|x| x == "log") {
                        s.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
                    }
                }
                s
            },
        );
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
