//! The coordinator's `[web]` endpoint over TLS: a client that trusts the cluster CA reads
//! `/metrics` and the page; a plain-text request gets no answer; with a client CA (mutual TLS)
//! a client without a cluster certificate is not served.

use std::sync::Arc;

use coordinator::certs::{self, Kind};
use coordinator::server::{self, ServerConfig, web::WebConfig};
use governor_proto::http::HttpTls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

/// A coordinator (plain gRPC) serving `[web]` over HTTPS with the certificates in `dir`, to
/// clients of `client_ca` only when given.
async fn start(
    dir: &std::path::Path,
    client_ca: Option<std::path::PathBuf>,
) -> server::RunningServer {
    server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: dir.join("coordinator.redb"),
        tls: None,
        policy: "first-fit".into(),
        state: Default::default(),
        web: WebConfig {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            tls: Some(HttpTls {
                cert: dir.join("coordinator.pem"),
                key: dir.join("coordinator-key.pem"),
                client_ca,
            }),
        },
    })
    .await
    .expect("the coordinator starts")
}

/// The roots a client that trusts only the cluster CA (`DIR/ca.pem`) verifies the server with.
fn cluster_roots(dir: &std::path::Path) -> Arc<tokio_rustls::rustls::RootCertStore> {
    governor_proto::tls::install_crypto_provider();
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(dir.join("ca.pem")).unwrap())
        .unwrap();
    Arc::new(roots)
}

#[tokio::test]
async fn the_web_endpoint_serves_https_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    certs::init(
        dir.path(),
        &[Kind::Coordinator {
            hosts: vec!["127.0.0.1".into()],
        }],
        false,
    )
    .unwrap();
    let server = start(dir.path(), None).await;
    let addr = server.web_addr.expect("served");

    let config = tokio_rustls::rustls::ClientConfig::builder()
        .with_root_certificates(cluster_roots(dir.path()))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    for (path, expect) in [
        ("/metrics", "governor_cluster_queue_length"),
        ("/", "Governor cluster"),
    ] {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = connector
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .expect("the TLS handshake");
        tls.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        let _ = tls.read_to_string(&mut out).await;
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{path}: {out}");
        assert!(out.contains(expect), "{path}: {out}");
    }
    // Plain text on the TLS port: no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(6),
        plain.read_to_end(&mut out),
    )
    .await;
    assert!(
        !out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    server.stop().await;
}

/// `client_ca` (what `coordinator --web-mtls` sets): only a client with a certificate of the
/// cluster CA is served, like govctl and the nodes on the gRPC port.
#[tokio::test]
async fn with_a_client_ca_only_clients_with_a_cluster_certificate_are_served() {
    let dir = tempfile::tempdir().unwrap();
    certs::init(
        dir.path(),
        &[
            Kind::Coordinator {
                hosts: vec!["127.0.0.1".into()],
            },
            Kind::Admin {
                name: "admin".into(),
            },
        ],
        false,
    )
    .unwrap();
    let server = start(dir.path(), Some(dir.path().join("ca.pem"))).await;
    let addr = server.web_addr.expect("served");

    let roots = cluster_roots(dir.path());
    let get = |config: tokio_rustls::rustls::ClientConfig| async move {
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = connector
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await?;
        tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await?;
        let mut out = String::new();
        tls.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };

    // No client certificate: no answer (TLS 1.3 reports the refusal on the first read).
    let anonymous = tokio_rustls::rustls::ClientConfig::builder()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let refused = get(anonymous).await;
    assert!(
        refused
            .as_ref()
            .map_or(true, |o| !o.starts_with("HTTP/1.1 200")),
        "{refused:?}"
    );

    // govctl's admin certificate: served.
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(dir.path().join("admin.pem"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    let key = tokio_rustls::rustls::pki_types::PrivateKeyDer::from_pem_file(
        dir.path().join("admin-key.pem"),
    )
    .unwrap();
    let admin = tokio_rustls::rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let page = get(admin).await.expect("served with a cluster certificate");
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    assert!(page.contains("governor_cluster_queue_length"), "{page}");
    server.stop().await;
}
