//! Transport set-up shared by the coordinator, govctl and the node agent: mTLS with rustls (the
//! `ring` provider) through tonic, or plain text when the operator asked for `--insecure`.
//!
//! Every party holds a certificate signed by the cluster CA (`govctl certs init` makes them); the
//! coordinator requires and verifies client certificates, clients verify the coordinator's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// Make rustls use `ring` (the only provider compiled in). Idempotent; call before any TLS use.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The three PEM files a party needs: the cluster CA, its certificate and its private key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The contents of a [`TlsFiles`].
struct Pems {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// A TLS file is unreadable or not what it should be.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {path}: {source} (make one with `govctl certs init`)")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} does not hold a PEM {what} (expected a `-----BEGIN {marker}` block)")]
    NotPem {
        what: &'static str,
        path: PathBuf,
        marker: &'static str,
    },
    #[error("bad coordinator address {address:?}: {reason}")]
    Address { address: String, reason: String },
}

impl TlsFiles {
    /// The layout `govctl certs init` writes: `DIR/ca.pem`, `DIR/NAME.pem`, `DIR/NAME-key.pem`.
    pub fn in_dir(dir: &Path, name: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        }
    }

    fn read(&self) -> Result<Pems, TlsError> {
        Ok(Pems {
            ca: read_pem(&self.ca, "CA certificate", "CERTIFICATE")?,
            cert: read_pem(&self.cert, "certificate", "CERTIFICATE")?,
            key: read_pem(&self.key, "private key", "PRIVATE KEY")?,
        })
    }

    /// Server side: present our certificate, require a client certificate signed by the CA.
    pub fn server_config(&self) -> Result<ServerTlsConfig, TlsError> {
        install_crypto_provider();
        let Pems { ca, cert, key } = self.read()?;
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(false))
    }

    /// Client side: verify the server against the CA and present our certificate.
    pub fn client_config(&self) -> Result<ClientTlsConfig, TlsError> {
        install_crypto_provider();
        let Pems { ca, cert, key } = self.read()?;
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key)))
    }
}

fn read_pem(path: &Path, what: &'static str, marker: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    // "PRIVATE KEY" matches PKCS#8 ("BEGIN PRIVATE KEY"), SEC1 and PKCS#1 ("BEGIN EC/RSA ...").
    if !text.contains("-----BEGIN ") || !text.contains(marker) {
        return Err(TlsError::NotPem {
            what,
            path: path.to_owned(),
            marker,
        });
    }
    Ok(bytes)
}

/// The addresses in a coordinator address list: one `HOST:PORT`, or several separated by commas
/// (every replica of a replicated coordinator; only the leader listens).
pub fn addresses(list: &str) -> Vec<&str> {
    let v: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if v.is_empty() { vec![list] } else { v }
}

/// A client endpoint for the coordinator at `address` (`host:port`, or a URL with `http://` or
/// `https://`). With `tls`, the connection is mTLS; without, plain text (the caller checked that
/// the operator asked for `--insecure`). A bare `host` gets the default port.
pub fn endpoint(address: &str, tls: Option<&TlsFiles>) -> Result<Endpoint, TlsError> {
    let bad = |reason: String| TlsError::Address {
        address: address.to_owned(),
        reason,
    };
    let rest = address
        .strip_prefix("https://")
        .or_else(|| address.strip_prefix("http://"))
        .unwrap_or(address);
    if rest.is_empty() || rest.contains('/') {
        return Err(bad("expected HOST:PORT".into()));
    }
    let with_port = if rest
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        rest.to_owned()
    } else {
        format!("{rest}:{}", crate::DEFAULT_PORT)
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut ep = Endpoint::from_shared(format!("{scheme}://{with_port}"))
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if let Some(files) = tls {
        ep = ep
            .tls_config(files.client_config()?)
            .map_err(|e| bad(format!("TLS set-up failed: {e}")))?;
    }
    Ok(ep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_name_the_path_and_the_fix() {
        let files = TlsFiles::in_dir(Path::new("/nonexistent/certs"), "node1");
        let e = files.client_config().unwrap_err().to_string();
        assert!(e.contains("/nonexistent/certs/ca.pem"), "{e}");
        assert!(e.contains("govctl certs init"), "{e}");
    }

    #[test]
    fn non_pem_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("gov-proto-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TlsFiles::in_dir(&dir, "x");
        std::fs::write(&files.ca, "hello").unwrap();
        let e = files.server_config().unwrap_err().to_string();
        assert!(e.contains("does not hold a PEM CA certificate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn endpoint_accepts_host_port_and_urls() {
        assert_eq!(
            endpoint("10.10.0.1:7070", None).unwrap().uri().to_string(),
            "http://10.10.0.1:7070/"
        );
        assert_eq!(
            endpoint("http://localhost", None)
                .unwrap()
                .uri()
                .to_string(),
            "http://localhost:7070/"
        );
        assert!(endpoint("", None).is_err());
        assert!(endpoint("a:1/x", None).is_err());
    }
}
