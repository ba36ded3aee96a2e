//! The coordinator's gRPC server: the node service (one long-lived session per node) and the
//! control service (govctl), around one actor that owns the [`ClusterState`](crate::state).
//!
//! Requests reach the state only through the actor's channel, one at a time, so there is no lock
//! to contend for and the state stays a plain deterministic value. The actor persists what changed
//! after each batch of requests (one redb transaction per batch) and sends the commands the state
//! produced to the nodes' sessions without ever waiting on a node.

mod actor;
mod auth;
mod carry;
mod control;
mod node;
pub mod web;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use governor_proto::pb::control_service_server::ControlServiceServer;
use governor_proto::pb::node_service_server::NodeServiceServer;
use governor_proto::tls::{TlsError, TlsFiles};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::info;

pub use actor::{Coordinator, LatencyStats};

use crate::etcd::{Etcd, EtcdConfig};
use crate::leader::{Leadership, LeaseClock};
use crate::state::{ClusterState, StateConfig};
use crate::store::{Store, StoreError};

/// How the coordinator runs (`coordinator --config FILE`, flags override).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The redb store (`[state] backend = "redb"`); with etcd, checkpoints carried between
    /// nodes are kept beside this path.
    pub store: PathBuf,
    /// mTLS files; `None` only with `--insecure`.
    pub tls: Option<TlsFiles>,
    /// Placement policy for a fresh store (a restarted coordinator keeps the one it had).
    pub policy: String,
    /// The planner's timeouts and the store's backend.
    pub state: StateSection,
    /// `/metrics` and the live cluster page (off unless `listen` is set).
    pub web: web::WebConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], governor_proto::DEFAULT_PORT)),
            store: PathBuf::from("/var/lib/governor/coordinator.redb"),
            tls: None,
            policy: crate::placement::DEFAULT_POLICY.into(),
            state: StateSection::default(),
            web: web::WebConfig::default(),
        }
    }
}

/// `[state]`: the planner's settings ([`StateConfig`], flattened into the table) and where the
/// state is kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StateSection {
    #[serde(flatten)]
    pub planner: StateConfig,
    pub backend: Backend,
    /// `[state.etcd]`, used with `backend = "etcd"`.
    pub etcd: EtcdConfig,
}

impl From<StateConfig> for StateSection {
    fn from(planner: StateConfig) -> Self {
        StateSection {
            planner,
            ..Default::default()
        }
    }
}

impl std::ops::Deref for StateSection {
    type Target = StateConfig;
    fn deref(&self) -> &StateConfig {
        &self.planner
    }
}

impl std::ops::DerefMut for StateSection {
    fn deref_mut(&mut self) -> &mut StateConfig {
        &mut self.planner
    }
}

/// Where the coordinator keeps the cluster's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// One file on this machine (`store`); one coordinator.
    #[default]
    Redb,
    /// The cluster's etcd (`[state.etcd]`); any number of replicas, one elected leader.
    Etcd,
}

/// The server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the stored placement policy is unknown: {0} (set one with `--policy`)")]
    Policy(#[from] crate::placement::UnknownPolicy),
    #[error("TLS set-up of the server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("[web] tls: {0}")]
    WebTls(#[from] governor_proto::http::HttpTlsError),
    #[error("[state.etcd]: {0}")]
    Etcd(#[from] crate::etcd::EtcdError),
}

/// A running coordinator (for tests and the binary).
pub struct RunningServer {
    /// The address it listens on (the real port when the config asked for port 0).
    pub addr: SocketAddr,
    /// The actor handle (in-process access to the state).
    pub coordinator: Coordinator,
    /// Where `[web]` serves the page and `/metrics`, if it does.
    pub web_addr: Option<SocketAddr>,
    web: Option<tokio::task::JoinHandle<()>>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    join: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    /// With etcd: this replica's term as leader.
    leadership: Option<Leadership>,
    clock: LeaseClock,
}

impl RunningServer {
    /// Resolves when this replica stops leading (never with the redb backend). Its actor has
    /// stopped by then; [`RunningServer::kill`] closes the rest.
    pub async fn deposed(&self) {
        self.clock.expired().await
    }

    /// Stop serving: refuse new connections, give open requests and node sessions up to 5 s to
    /// end, then drop them, persist and close the store.
    pub async fn stop(self) {
        if let Some(w) = &self.web {
            w.abort();
        }
        let _ = self.shutdown.send(());
        let mut join = self.join;
        if tokio::time::timeout(Duration::from_secs(5), &mut join)
            .await
            .is_err()
        {
            info!("node sessions still open after 5 s; closing them");
            join.abort();
            let _ = join.await;
        }
        self.coordinator.shutdown().await;
        if let Some(l) = self.leadership {
            l.resign().await;
        }
    }

    /// Stop abruptly, as a crash would: drop every connection without a goodbye. The store keeps
    /// what was committed.
    pub async fn kill(self) {
        if let Some(w) = &self.web {
            w.abort();
        }
        self.join.abort();
        let _ = self.join.await;
        if let Some(l) = self.leadership {
            l.abandon();
        }
        self.coordinator.shutdown().await;
    }
}

/// Open the configured store; with etcd, first win the leadership (waits while another replica
/// leads).
async fn open_store(config: &ServerConfig) -> Result<(Store, Option<Leadership>), ServerError> {
    match config.state.backend {
        Backend::Redb => Ok((
            Store::Redb(crate::store::redb::RedbStore::open(&config.store)?),
            None,
        )),
        Backend::Etcd => {
            let etcd = &config.state.etcd;
            let key = crate::store::etcd::leader_key(&etcd.prefix);
            let name = format!("{} {}", hostname(), config.listen);
            // The lease's renewals on a connection of their own, never behind a large write.
            let leadership =
                crate::leader::campaign(Etcd::new(etcd)?, key, &name, etcd.lease_ttl_s).await?;
            let store = crate::store::etcd::EtcdStore::new(
                Etcd::new(etcd)?,
                &etcd.prefix,
                leadership.fence(),
                leadership.clock(),
                etcd.max_txn_ops,
            );
            Ok((Store::Etcd(store), Some(leadership)))
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "coordinator".into())
}

/// Open the store, restore the state and start serving on `config.listen`. With etcd this
/// waits until this replica is elected leader; it listens only from then on.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    let (store, leadership) = open_store(&config).await?;
    let clock = leadership
        .as_ref()
        .map_or_else(LeaseClock::forever, |l| l.clock());
    let snapshot = store.load().await?;
    let now = actor::unix_now();
    // A fresh store starts with the configured policy; a restarted coordinator keeps its own.
    let meta = snapshot.meta.or_else(|| {
        Some(crate::state::Meta {
            policy: config.policy.clone(),
            next_seq: 1,
        })
    });
    let (nodes, jobs) = (snapshot.nodes.len(), snapshot.jobs.len());
    let state = ClusterState::restore(
        config.state.planner.clone(),
        now,
        meta,
        snapshot.nodes,
        snapshot.jobs,
    )?;
    info!(
        store = %store.describe(),
        nodes,
        jobs,
        policy = %state.policy_state().current,
        "state restored"
    );
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServerError::Bind {
        addr: config.listen,
        source,
    })?;
    let coordinator = actor::spawn(
        state,
        store,
        actor::Settings {
            keep_history: config.web.listen.is_some(),
            carry_beside: config.store.clone(),
            clock: clock.clone(),
        },
    );
    let secure = config.tls.is_some();
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tcp_keepalive(Some(Duration::from_secs(30)))
        .max_concurrent_streams(Some(4096));
    if let Some(files) = &config.tls {
        builder = builder.tls_config(files.server_config()?)?;
    }
    let (shutdown, rx) = tokio::sync::oneshot::channel::<()>();
    let router = builder
        .add_service(NodeServiceServer::new(node::NodeSvc::new(
            coordinator.clone(),
            secure,
        )))
        .add_service(ControlServiceServer::new(control::ControlSvc::new(
            coordinator.clone(),
            secure,
        )));
    let incoming = TcpListenerStream::new(listener);
    let join = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = rx.await;
    }));
    info!(%addr, mtls = secure, "coordinator listening");
    let (web_addr, web) = match config.web.listen {
        Some(at) => {
            let tls = config.web.tls.as_ref().map(|t| t.acceptor()).transpose()?;
            let l = TcpListener::bind(at)
                .await
                .map_err(|source| ServerError::Bind { addr: at, source })?;
            let bound = l
                .local_addr()
                .map_err(|source| ServerError::Bind { addr: at, source })?;
            (
                Some(bound),
                Some(tokio::spawn(web::serve(l, tls, coordinator.clone()))),
            )
        }
        None => (None, None),
    };
    Ok(RunningServer {
        addr,
        web_addr,
        web,
        coordinator,
        shutdown,
        join,
        leadership,
        clock,
    })
}

/// A coordinator in this process that campaigns (etcd), serves while it leads and campaigns
/// again when deposed; with redb it serves at once. [`run`] is one until its shutdown; tests
/// and the failover benchmark hold several and crash them.
pub struct Replica {
    leading: tokio::sync::watch::Receiver<bool>,
    /// `true`: stop as a crash would (no resignation, no goodbye to the nodes); dropped: the
    /// same.
    stop: tokio::sync::oneshot::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

/// Start a [`Replica`] on the current runtime.
pub fn replica(config: ServerConfig) -> Replica {
    let (leading_tx, leading) = tokio::sync::watch::channel(false);
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<bool>();
    let task = tokio::spawn(async move {
        loop {
            let server = tokio::select! {
                s = start(config.clone()) => match s {
                    Ok(s) => s,
                    // Elected, then etcd failed before the state was loaded: campaign again.
                    Err(e @ ServerError::Store(StoreError::Etcd(_) | StoreError::Deposed)) => {
                        tracing::warn!(error = %e, "could not take over as leader; campaigning again");
                        tokio::time::sleep(crate::leader::RETRY).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                _ = &mut stopped => return Ok(()),
            };
            leading_tx.send_replace(true);
            tokio::select! {
                how = &mut stopped => {
                    if how == Ok(false) {
                        info!("shutting down");
                        server.stop().await;
                    } else {
                        server.kill().await;
                    }
                    leading_tx.send_replace(false);
                    return Ok(());
                }
                _ = server.deposed() => {
                    tracing::warn!("no longer the leader: stopped serving; campaigning again");
                    server.kill().await;
                    leading_tx.send_replace(false);
                }
            }
        }
    });
    Replica {
        leading,
        stop,
        task,
    }
}

impl Replica {
    /// It leads (serves) now.
    pub fn leads(&self) -> bool {
        *self.leading.borrow()
    }

    /// Wait until it leads.
    pub async fn elected(&mut self) {
        let _ = self.leading.wait_for(|l| *l).await;
    }

    /// Stop cleanly: nodes' sessions closed, the store flushed, the leadership resigned.
    pub async fn stop(self) -> Result<(), ServerError> {
        let _ = self.stop.send(false);
        self.task.await.unwrap_or(Ok(()))
    }

    /// Stop as a crash would: connections dropped, the lease left to run out.
    pub async fn crash(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Serve until `shutdown` completes. With etcd: campaign, serve while leading, and campaign
/// again after losing the leadership.
pub async fn run(
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let mut replica = replica(config);
    tokio::select! {
        _ = shutdown => {}
        // It ended on its own: an error that is not etcd's (a port taken, a bad store).
        ended = &mut replica.task => return ended.unwrap_or(Ok(())),
    }
    replica.stop().await
}
