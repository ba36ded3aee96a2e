//! A coordinator replica as its own process (`coordinator --config`, the real binary) on a test
//! etcd cluster: it can be killed (SIGKILL, as a machine's loss), paused (SIGSTOP) and started
//! again on the same configuration.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use coordinator::etcd::EtcdConfig;

/// One replica; killed when dropped.
pub struct Replica {
    pub listen: SocketAddr,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Replica {
    /// Write `NAME.toml` in `dir` (mTLS with the certificates of [`crate::loopback_certs`] in
    /// `dir`, `first-fit`, the etcd backend on `etcd`; `state` is added to its `[state]` table)
    /// and start the replica. Its log is `dir/NAME.log` (and `.err`).
    pub fn start(
        dir: &Path,
        name: &str,
        listen: SocketAddr,
        etcd: &EtcdConfig,
        state: &str,
    ) -> Replica {
        let config = dir.join(format!("{name}.toml"));
        let endpoints: Vec<String> = etcd.endpoints.iter().map(|e| format!("{e:?}")).collect();
        std::fs::write(
            &config,
            format!(
                "listen = \"{listen}\"\nstore = \"{store}\"\npolicy = \"first-fit\"\n\
                 [tls]\nca = \"{d}/ca.pem\"\ncert = \"{d}/coordinator.pem\"\nkey = \"{d}/coordinator-key.pem\"\n\
                 [state]\nbackend = \"etcd\"\n{state}\n\
                 [state.etcd]\nendpoints = [{e}]\nprefix = {prefix:?}\nlease_ttl_s = {ttl}\nrequest_timeout_ms = {timeout}\n",
                store = dir.join(format!("{name}.redb")).display(),
                d = dir.display(),
                e = endpoints.join(", "),
                prefix = etcd.prefix,
                ttl = etcd.lease_ttl_s,
                timeout = etcd.request_timeout_ms,
            ),
        )
        .unwrap();
        let mut replica = Replica {
            listen,
            config,
            log: dir.join(format!("{name}.log")),
            child: None,
        };
        replica.spawn();
        replica
    }

    fn spawn(&mut self) {
        let append = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap()
        };
        let child = Command::new(crate::daemon::bin("coordinator"))
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(append(&self.log))
            .stderr(append(&self.log.with_extension("err")))
            .spawn()
            .expect("the coordinator binary starts");
        self.child = Some(child);
    }

    /// Whether its process runs (or is paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Send `sig` to its process (none when it is not running).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// SIGKILL it and reap it (a machine's loss).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on its configuration (killed first if it runs).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Its log so far (stdout, then stderr).
    pub fn log(&self) -> String {
        let mut s = std::fs::read_to_string(&self.log).unwrap_or_default();
        s.push_str(&std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default());
        s
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}
