//! The read-only HTTP endpoint the daemon and the coordinator serve (`/metrics`, the
//! coordinator's cluster page): HTTP/1.1, `GET` only, one request per connection, plain or TLS
//! (rustls with `ring`, like the gRPC side).
//!
//! Why no HTTP framework: the endpoints answer a few fixed paths with a body rendered from a
//! snapshot; a request head is read within a size and time bound and nothing else of the
//! request is used. That is ~100 lines, where hyper and a router would add a dozen crates to
//! two binaries that run as root.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// The most bytes of a request head read (a scrape's is ~200).
const HEAD_LIMIT: usize = 8192;

/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// What a handler answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status line, e.g. `200 OK`.
    pub status: &'static str,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: "200 OK",
            content_type,
            body: body.into(),
        }
    }

    pub fn not_found(message: &str) -> Reply {
        Reply {
            status: "404 Not Found",
            content_type: "text/plain; charset=utf-8",
            body: format!("{message}\n").into_bytes(),
        }
    }

    pub fn unavailable(message: &str) -> Reply {
        Reply {
            status: "503 Service Unavailable",
            content_type: "text/plain; charset=utf-8",
            body: format!("{message}\n").into_bytes(),
        }
    }
}

/// The content type Prometheus negotiates for OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// TLS for the endpoint: a PEM certificate chain and its PEM private key, and optionally the
/// CA whose certificates clients must present.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HttpTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Serve only clients with a certificate this CA signed (mutual TLS): the cluster's
    /// `ca.pem` admits what `govctl certs` issues (govctl users, nodes; give Prometheus one in
    /// its scrape's `tls_config`). `None`: any client (the endpoint is read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<PathBuf>,
}

/// The endpoint's TLS files are unusable.
#[derive(Debug, thiserror::Error)]
pub enum HttpTlsError {
    #[error("cannot read the PEM {what} {path}: {reason}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the certificate {cert} and key {key} do not make a TLS server: {reason}")]
    Config {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

impl HttpTls {
    /// A TLS acceptor for these files: the server authenticates itself; with `client_ca`, a
    /// client must too, with a certificate that CA signed, or the handshake fails.
    pub fn acceptor(&self) -> Result<TlsAcceptor, HttpTlsError> {
        crate::tls::install_crypto_provider();
        let pem_error =
            |what: &'static str, path: &Path, e: &dyn std::fmt::Display| HttpTlsError::Pem {
                what,
                path: path.to_owned(),
                reason: e.to_string(),
            };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| pem_error("certificate", &self.cert, &e))?
            .collect::<Result<_, _>>()
            .map_err(|e| pem_error("certificate", &self.cert, &e))?;
        if certs.is_empty() {
            return Err(pem_error(
                "certificate",
                &self.cert,
                &"no certificate in it",
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| pem_error("private key", &self.key, &e))?;
        let builder = rustls::ServerConfig::builder();
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in
                    CertificateDer::pem_file_iter(ca).map_err(|e| pem_error("client CA", ca, &e))?
                {
                    let cert = cert.map_err(|e| pem_error("client CA", ca, &e))?;
                    roots
                        .add(cert)
                        .map_err(|e| pem_error("client CA", ca, &e))?;
                }
                if roots.is_empty() {
                    return Err(pem_error("client CA", ca, &"no certificate in it"));
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| pem_error("client CA", ca, &e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(certs, key)
            .map_err(|e| HttpTlsError::Config {
                cert: self.cert.clone(),
                key: self.key.clone(),
                reason: e.to_string(),
            })?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// The path of a `GET` request head (without its query), or `None` for anything else.
pub fn get_path(head: &str) -> Option<&str> {
    let mut words = head.split_whitespace();
    if words.next()? != "GET" {
        return None;
    }
    let target = words.next()?;
    Some(target.split('?').next().unwrap_or(target))
}

/// Serve `handler` on `listener` until the task is dropped: each connection's request head is
/// read (bounded), its `GET` path handed to `handler`, the reply written and the connection
/// closed. Anything but `GET` is answered 405.
pub async fn serve<H, F>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    what: &'static str,
    handler: H,
) where
    H: Fn(String) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, tls = tls.is_some(), "serving {what}");
    }
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "{what}: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = handler.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let result = match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(conn)).await {
                        Ok(Ok(stream)) => answer(stream, handler).await,
                        Ok(Err(e)) => Err(e),
                        Err(_) => return,
                    }
                }
                None => answer(conn, handler).await,
            };
            if let Err(e) = result {
                debug!(%peer, error = %e, "{what}: the client went away");
            }
        });
    }
}

async fn answer<S, H, F>(mut conn: S, handler: H) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    H: Fn(String) -> F,
    F: Future<Output = Reply>,
{
    let mut buf = vec![0u8; HEAD_LIMIT];
    let mut got = 0;
    let read = tokio::time::timeout(HEAD_TIMEOUT, async {
        while got < buf.len() {
            let n = conn.read(&mut buf[got..]).await?;
            if n == 0 {
                break;
            }
            got += n;
            if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let head = String::from_utf8_lossy(&buf[..got]).into_owned();
    let reply = match get_path(&head) {
        Some(path) => handler(path.to_owned()).await,
        None => Reply {
            status: "405 Method Not Allowed",
            content_type: "text/plain; charset=utf-8",
            body: b"only GET is served here\n".to_vec(),
        },
    };
    let mut response = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        reply.status,
        reply.content_type,
        reply.body.len()
    )
    .into_bytes();
    response.extend_from_slice(&reply.body);
    conn.write_all(&response).await?;
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_paths_are_taken_without_their_query() {
        assert_eq!(get_path("GET /metrics HTTP/1.1\r\n"), Some("/metrics"));
        assert_eq!(get_path("GET /metrics?x=1 HTTP/1.1\r\n"), Some("/metrics"));
        assert_eq!(get_path("POST /metrics HTTP/1.1\r\n"), None);
        assert_eq!(get_path(""), None);
    }

    #[tokio::test]
    async fn serves_a_reply_and_refuses_other_methods() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, None, "test", |path: String| async move {
            if path == "/hello" {
                Reply::ok("text/plain", "hi")
            } else {
                Reply::not_found("no")
            }
        }));
        let ask = |req: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = ask("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nhi"),
            "{ok}"
        );
        assert!(
            ask("GET /nope HTTP/1.1\r\n\r\n")
                .await
                .starts_with("HTTP/1.1 404")
        );
        assert!(
            ask("DELETE /hello HTTP/1.1\r\n\r\n")
                .await
                .starts_with("HTTP/1.1 405")
        );
    }
}
