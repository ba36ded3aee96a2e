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

use crate::state::{ClusterState, StateConfig};
use crate::store::{Store, StoreError};

/// How the coordinator runs (`coordinator --config FILE`, flags override).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The redb store.
    pub store: PathBuf,
    /// mTLS files; `None` only with `--insecure`.
    pub tls: Option<TlsFiles>,
    /// Placement policy for a fresh store (a restarted coordinator keeps the one it had).
    pub policy: String,
    /// Timeouts.
    pub state: StateConfig,
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
            state: StateConfig::default(),
            web: web::WebConfig::default(),
        }
    }
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
}

impl RunningServer {
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
    }

    /// Stop abruptly, as a crash would: drop every connection without a goodbye. The store keeps
    /// what was committed.
    pub async fn kill(self) {
        if let Some(w) = &self.web {
            w.abort();
        }
        self.join.abort();
        let _ = self.join.await;
        self.coordinator.shutdown().await;
    }
}

/// Open the store, restore the state and start serving on `config.listen`.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    let store = Store::open(&config.store)?;
    let snapshot = store.load()?;
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
        config.state.clone(),
        now,
        meta,
        snapshot.nodes,
        snapshot.jobs,
    )?;
    info!(
        store = %config.store.display(),
        nodes,
        jobs,
        policy = %state.policy_state().current,
        "state restored"
    );
    let coordinator = actor::spawn(state, store, config.web.listen.is_some());
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
    })
}

/// Serve until `shutdown` completes.
pub async fn run(
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let server = start(config).await?;
    shutdown.await;
    info!("shutting down");
    server.stop().await;
    Ok(())
}
