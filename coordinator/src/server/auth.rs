//! Who is calling: the identity in the client's certificate.
//!
//! `govctl certs` writes the party's name in the certificate's common name and its role in the
//! organisational unit: `OU=node` for node daemons, `OU=admin` for govctl users. The CA has
//! already verified the certificate (tonic/rustls, mTLS) before a request gets here.
//!
//! Rules: a node may only open a session under its own name; submitting, cancelling and changing
//! the policy need an admin; any certificate of the cluster may read. Without TLS (`--insecure`)
//! there is nobody to check and everything is allowed.

use tonic::{Request, Status};
use x509_parser::prelude::{FromDer, X509Certificate};

/// A caller's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Node,
    Admin,
    /// A certificate of the cluster CA without a role we know.
    Other,
}

/// A verified caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Identity {
    pub name: String,
    pub role: Role,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = match self.role {
            Role::Node => "node",
            Role::Admin => "admin",
            Role::Other => "no known role",
        };
        write!(f, "certificate CN={} ({role})", self.name)
    }
}

/// Read the caller's identity from its certificate; `None` on a plain-text connection.
pub(super) fn identity<T>(request: &Request<T>) -> Option<Identity> {
    let certs = request.peer_certs()?;
    let der = certs.first()?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    let role = match subject
        .iter_organizational_unit()
        .next()
        .and_then(|ou| ou.as_str().ok())
    {
        Some("node") => Role::Node,
        Some("admin") => Role::Admin,
        _ => Role::Other,
    };
    Some(Identity { name, role })
}

/// On a TLS server, require an admin certificate.
pub(super) fn require_admin<T>(
    secure: bool,
    request: &Request<T>,
    action: &str,
) -> Result<(), Status> {
    if !secure {
        return Ok(());
    }
    match identity(request) {
        Some(id) if id.role == Role::Admin => Ok(()),
        Some(id) => Err(Status::permission_denied(format!(
            "{id} may not {action}: use an admin certificate (`govctl certs issue --admin NAME`)"
        ))),
        None => Err(Status::unauthenticated(format!(
            "{action} needs a client certificate"
        ))),
    }
}

/// On a TLS server, a node may only speak for itself.
pub(super) fn require_node(
    secure: bool,
    peer: Option<&Identity>,
    node: &str,
) -> Result<(), Status> {
    if !secure {
        return Ok(());
    }
    match peer {
        Some(id) if id.role == Role::Node && id.name == node => Ok(()),
        Some(id) => Err(Status::permission_denied(format!(
            "{id} may not register node {node}: each node needs its own certificate \
             (`govctl certs issue --node {node}`)"
        ))),
        None => Err(Status::unauthenticated(format!(
            "node {node} connected without a client certificate"
        ))),
    }
}
