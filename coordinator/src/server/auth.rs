//! Who is calling, and what they may do: the role in the client's certificate.
//!
//! `govctl certs` writes the party's name in the certificate's common name and its role in the
//! organisational unit: `OU=node` for node daemons, `OU=admin` for govctl users (see
//! [`crate::certs`]). The CA has already verified the certificate (tonic/rustls, mTLS, client
//! certificates required) before a request gets here; every method of both services then checks
//! the role with [`authorize`] before it touches the state.
//!
//! A certificate has a role only when its subject holds exactly one non-empty common name and
//! exactly one organisational unit, `node` or `admin`. Anything else (no OU, two OUs, another
//! OU such as the coordinator's own `OU=coordinator`, no CN) is a certificate of the cluster
//! without a role, and it may call nothing.
//!
//! # Who may call what
//!
//! | method                                    | admin (`OU=admin`) | node (`OU=node`, `CN=NAME`)   | no role |
//! |-------------------------------------------|--------------------|-------------------------------|---------|
//! | `NodeService/Session`                     | no                 | yes, as node `NAME` only      | no      |
//! | `ControlService/SubmitJob`                | yes                | no                            | no      |
//! | `ControlService/CancelJob`                | yes                | no                            | no      |
//! | `ControlService/MoveJob`                  | yes                | no                            | no      |
//! | `ControlService/SetPolicy`                | yes                | no                            | no      |
//! | `ControlService/GetJob`                   | yes                | no (the detail holds the job's command and environment) | no |
//! | `ControlService/JobOutput`                | yes                | no (a job's output may hold anything it prints) | no |
//! | `ControlService/ListNodes`, `ListJobs`, `GetPolicy`, `GetStats` | yes | yes (the cluster view: summaries only) | no |
//!
//! A node session speaks for one node: its hello must name the node in the certificate's CN
//! (else `PERMISSION_DENIED`), and every later report of the session is that node's. Reports of a
//! coordinator job member placed on another node are ignored (logged) and change nothing, its
//! move request included; a node's local jobs are listed under `NODE/ID`, so they cannot
//! collide with another node's.
//!
//! Without TLS (`--insecure`) there is nobody to check and everything is allowed.

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

/// A method of the coordinator's services, as the table in the module doc names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Method {
    NodeSession,
    SubmitJob,
    CancelJob,
    MoveJob,
    SetPolicy,
    GetJob,
    JobOutput,
    ListNodes,
    ListJobs,
    GetPolicy,
    GetStats,
}

/// Which roles may call a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Allowed {
    NodeOnly,
    AdminOnly,
    NodeOrAdmin,
}

impl Method {
    /// The role table.
    fn allowed(self) -> Allowed {
        match self {
            Method::NodeSession => Allowed::NodeOnly,
            Method::SubmitJob
            | Method::CancelJob
            | Method::MoveJob
            | Method::SetPolicy
            | Method::GetJob
            | Method::JobOutput => Allowed::AdminOnly,
            Method::ListNodes | Method::ListJobs | Method::GetPolicy | Method::GetStats => {
                Allowed::NodeOrAdmin
            }
        }
    }

    /// What the caller tried to do, for the refusal.
    fn action(self) -> &'static str {
        match self {
            Method::NodeSession => "open a node session",
            Method::SubmitJob => "submit jobs",
            Method::CancelJob => "cancel jobs",
            Method::MoveJob => "move jobs between nodes",
            Method::SetPolicy => "change the placement policy",
            Method::GetJob => "read a job's details (its command and environment)",
            Method::JobOutput => "read a job's output",
            Method::ListNodes => "list the nodes",
            Method::ListJobs => "list the jobs",
            Method::GetPolicy => "read the placement policy",
            Method::GetStats => "read the coordinator's statistics",
        }
    }

    fn permits(self, role: Role) -> bool {
        matches!(
            (self.allowed(), role),
            (Allowed::NodeOnly, Role::Node)
                | (Allowed::AdminOnly, Role::Admin)
                | (Allowed::NodeOrAdmin, Role::Node | Role::Admin)
        )
    }
}

/// Read the caller's identity from its certificate; `None` on a plain-text connection (or a
/// certificate that does not parse, which the TLS layer would not have accepted).
pub(super) fn identity<T>(request: &Request<T>) -> Option<Identity> {
    let certs = request.peer_certs()?;
    let der = certs.first()?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).ok()?;
    let subject = cert.subject();
    let names: Vec<Option<&str>> = subject
        .iter_common_name()
        .map(|cn| cn.as_str().ok())
        .collect();
    let units: Vec<Option<&str>> = subject
        .iter_organizational_unit()
        .map(|ou| ou.as_str().ok())
        .collect();
    // Exactly one CN and one OU: a certificate that names two parties or two roles has none.
    let role = match (names.as_slice(), units.as_slice()) {
        ([Some(cn)], [Some("node")]) if !cn.is_empty() => Role::Node,
        ([Some(cn)], [Some("admin")]) if !cn.is_empty() => Role::Admin,
        _ => Role::Other,
    };
    let name = names
        .iter()
        .map(|n| n.unwrap_or("?"))
        .collect::<Vec<_>>()
        .join(",");
    Some(Identity { name, role })
}

/// On a TLS server, check that the caller's role may call `method` (the table in the module
/// doc). Returns the caller's identity (`None` without TLS).
pub(super) fn authorize<T>(
    secure: bool,
    request: &Request<T>,
    method: Method,
) -> Result<Option<Identity>, Status> {
    if !secure {
        return Ok(None);
    }
    let Some(id) = identity(request) else {
        return Err(Status::unauthenticated(format!(
            "a client certificate of the cluster is needed to {}",
            method.action()
        )));
    };
    if method.permits(id.role) {
        return Ok(Some(id));
    }
    let fix = match method.allowed() {
        Allowed::NodeOnly => {
            "only node daemons may, each with its own certificate (`govctl certs issue --node NAME`)"
        }
        Allowed::AdminOnly => "use an admin certificate (`govctl certs issue --admin NAME`)",
        Allowed::NodeOrAdmin => {
            "use an admin certificate (`govctl certs issue --admin NAME`); a certificate needs \
             exactly one CN and exactly one OU, node or admin"
        }
    };
    Err(Status::permission_denied(format!(
        "{id} may not {}: {fix}",
        method.action()
    )))
}

/// On a TLS server, a node may only speak for itself: the node its hello names must be the one
/// in its certificate (already checked to be a node's by [`authorize`]).
pub(super) fn require_own_node(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_table() {
        use Method::*;
        let all = [
            NodeSession,
            SubmitJob,
            CancelJob,
            MoveJob,
            SetPolicy,
            GetJob,
            ListNodes,
            ListJobs,
            GetPolicy,
            GetStats,
        ];
        let for_role =
            |role| -> Vec<Method> { all.iter().copied().filter(|m| m.permits(role)).collect() };
        assert_eq!(
            for_role(Role::Node),
            [NodeSession, ListNodes, ListJobs, GetPolicy, GetStats]
        );
        assert_eq!(
            for_role(Role::Admin),
            [
                SubmitJob, CancelJob, MoveJob, SetPolicy, GetJob, ListNodes, ListJobs, GetPolicy,
                GetStats
            ]
        );
        assert_eq!(for_role(Role::Other), []);
    }
}
