//! Certificates for a test cluster (`govctl certs`): a CA, the coordinator's server certificate,
//! one client certificate per node and one per admin, all in one directory:
//!
//! ```text
//! DIR/ca.pem  DIR/ca-key.pem                  the cluster CA (keep ca-key.pem off the nodes)
//! DIR/coordinator.pem  DIR/coordinator-key.pem server certificate (SANs: the names given)
//! DIR/NODE.pem  DIR/NODE-key.pem               a node daemon (CN=NODE, OU=node)
//! DIR/NAME.pem  DIR/NAME-key.pem               a govctl user (CN=NAME, OU=admin)
//! ```
//!
//! The coordinator reads a caller's name and role from CN and OU (see `server::auth`). Keys are
//! ECDSA P-256, written with mode 0600. Certificates are valid from the start of last year to the
//! start of the year after next. This is for test clusters; production clusters use their own PKI
//! with the same CN/OU convention.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The file name stem of the coordinator's certificate.
pub const COORDINATOR: &str = "coordinator";

/// What a certificate is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The coordinator's server certificate, valid for these DNS names and IP addresses.
    Coordinator { hosts: Vec<String> },
    /// A node daemon.
    Node { name: String },
    /// A govctl user allowed to submit, cancel and set the policy.
    Admin { name: String },
}

impl Kind {
    fn stem(&self) -> &str {
        match self {
            Kind::Coordinator { .. } => COORDINATOR,
            Kind::Node { name } | Kind::Admin { name } => name,
        }
    }
}

/// Certificate generation failed.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} already exists; pass --force to replace the cluster CA (every certificate signed by it stops working)"
    )]
    Exists { path: PathBuf },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{0}")]
    Name(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io {
        path: path.to_owned(),
        source,
    }
}

fn validity(params: &mut CertificateParams) {
    let year = 1970
        + (SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            / 31_556_952) as i32;
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + 2, 1, 1);
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), CertError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(io(path))?;
    f.write_all(contents.as_bytes()).map_err(io(path))
}

/// Make a new cluster CA in `dir` and the certificates listed in `kinds`. Returns the files
/// written.
pub fn init(dir: &Path, kinds: &[Kind], force: bool) -> Result<Vec<PathBuf>, CertError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    let ca_path = dir.join("ca.pem");
    let ca_key_path = dir.join("ca-key.pem");
    if ca_path.exists() && !force {
        return Err(CertError::Exists { path: ca_path });
    }
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "governor cluster CA");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "governor cluster");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    write_file(&ca_key_path, &key.serialize_pem(), true)?;
    write_file(&ca_path, &cert.pem(), false)?;
    let issuer = Issuer::new(params, key);
    let mut written = vec![ca_path, ca_key_path];
    for kind in kinds {
        written.extend(issue_with(dir, &issuer, kind)?);
    }
    Ok(written)
}

/// Issue one more certificate with the CA in `dir` (made by [`init`]).
pub fn issue(dir: &Path, kind: &Kind) -> Result<Vec<PathBuf>, CertError> {
    let ca_path = dir.join("ca.pem");
    let ca_key_path = dir.join("ca-key.pem");
    let ca_pem = fs::read_to_string(&ca_path).map_err(io(&ca_path))?;
    let key_pem = fs::read_to_string(&ca_key_path).map_err(io(&ca_key_path))?;
    let key = KeyPair::from_pem(&key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, key)?;
    issue_with(dir, &issuer, kind)
}

fn issue_with(
    dir: &Path,
    issuer: &Issuer<'_, KeyPair>,
    kind: &Kind,
) -> Result<Vec<PathBuf>, CertError> {
    let (mut params, ou, eku) = match kind {
        Kind::Coordinator { hosts } => {
            let mut names: Vec<String> = hosts.clone();
            for default in ["localhost", "127.0.0.1"] {
                if !names.iter().any(|n| n == default) {
                    names.push(default.into());
                }
            }
            (
                CertificateParams::new(names)?,
                "coordinator",
                ExtendedKeyUsagePurpose::ServerAuth,
            )
        }
        Kind::Node { name } => {
            governor_proto::node::validate_node_name(name).map_err(CertError::Name)?;
            (
                CertificateParams::new(vec![name.clone()])?,
                "node",
                ExtendedKeyUsagePurpose::ClientAuth,
            )
        }
        Kind::Admin { name } => {
            if name.is_empty() || name.contains('/') || name == "ca" || name == COORDINATOR {
                return Err(CertError::Name(format!(
                    "admin name {name:?} must be non-empty, without '/', and not \"ca\" or \"{COORDINATOR}\""
                )));
            }
            (
                CertificateParams::new(Vec::<String>::new())?,
                "admin",
                ExtendedKeyUsagePurpose::ClientAuth,
            )
        }
    };
    params
        .distinguished_name
        .push(DnType::CommonName, kind.stem());
    params
        .distinguished_name
        .push(DnType::OrganizationalUnitName, ou);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "governor cluster");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![eku];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    let cert_path = dir.join(format!("{}.pem", kind.stem()));
    let key_path = dir.join(format!("{}-key.pem", kind.stem()));
    write_file(&key_path, &key.serialize_pem(), true)?;
    write_file(&cert_path, &cert.pem(), false)?;
    Ok(vec![cert_path, key_path])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn init_writes_a_ca_and_the_certificates_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let files = init(
            dir.path(),
            &[
                Kind::Coordinator {
                    hosts: vec!["10.10.0.1".into(), "coord.example".into()],
                },
                Kind::Node {
                    name: "node2".into(),
                },
                Kind::Admin {
                    name: "admin".into(),
                },
            ],
            false,
        )
        .unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "ca.pem",
                "ca-key.pem",
                "coordinator.pem",
                "coordinator-key.pem",
                "node2.pem",
                "node2-key.pem",
                "admin.pem",
                "admin-key.pem"
            ]
        );
        let mode = fs::metadata(dir.path().join("node2-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let e = init(dir.path(), &[], false).unwrap_err().to_string();
        assert!(e.contains("--force"), "{e}");
        // More certificates from the same CA.
        issue(
            dir.path(),
            &Kind::Node {
                name: "node3".into(),
            },
        )
        .unwrap();
        assert!(dir.path().join("node3.pem").exists());
        assert!(
            issue(
                dir.path(),
                &Kind::Node {
                    name: "Bad_Name".into()
                }
            )
            .is_err()
        );
    }
}
