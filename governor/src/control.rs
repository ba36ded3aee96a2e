//! The control socket: a Unix stream socket (mode 0660) carrying one JSON request line and one
//! JSON response line per connection. `governor status` and `governor run-job` are its clients;
//! the daemon answers requests inside its control loop, so answers reflect its current state.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};

/// Largest request accepted (a request is a small JSON object).
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The wire types (one JSON line each way) live in the protocol crate, where they are tested
/// and fuzzed without the daemon.
pub use governor_proto::control_socket::{AdoptJob, Request, Response};

/// Errors talking to the daemon, written for the operator (or the user) who reads them. Each
/// message carries its cause, which is therefore not also its `source()` (a reporter walking
/// the chain would print it twice).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(
        "cannot reach the governor daemon at {path}: {error} (is `governor daemon` running? is the socket path right?)"
    )]
    Connect {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The caller may not connect: the socket is mode 0660, root's and `socket_group`'s.
    #[error("{}", not_allowed(path, group.as_deref()))]
    NotAllowed {
        path: PathBuf,
        /// The socket's group (`None`: root's, or it cannot be told).
        group: Option<String>,
    },
    #[error("talking to the governor daemon at {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("the governor daemon at {path} sent an unreadable answer: {message}")]
    Protocol { path: PathBuf, message: String },
    #[error("cannot create the control socket {path}: {error}")]
    Bind {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("control socket {path}: another governor daemon is already listening there")]
    InUse { path: PathBuf },
}

/// Where an operator sets who may use the socket (the packaged default).
const CONFIG_HINT: &str = "socket_group in /etc/governor/governor.toml";

fn not_allowed(path: &Path, group: Option<&str>) -> String {
    match group {
        Some(g) => format!(
            "you may not use the governor's control socket {}: ask the operator to add you to group `{g}` ({CONFIG_HINT})",
            path.display()
        ),
        None => format!(
            "you may not use the governor's control socket {} (only root may): ask the operator to set {CONFIG_HINT} and add you to that group",
            path.display()
        ),
    }
}

/// The error for a failed `connect` to the socket at `path`: a refusal by its permissions is
/// told apart (with the group to ask for) from a daemon that is not there.
pub fn connect_error(path: &Path, error: std::io::Error) -> ControlError {
    use std::os::unix::fs::MetadataExt;
    if error.kind() != std::io::ErrorKind::PermissionDenied {
        return ControlError::Connect {
            path: path.to_owned(),
            error,
        };
    }
    let group = std::fs::metadata(path)
        .ok()
        .map(|m| m.gid())
        .filter(|&gid| gid != 0)
        .map(|gid| {
            nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
                .ok()
                .flatten()
                .map_or_else(|| gid.to_string(), |g| g.name)
        });
    ControlError::NotAllowed {
        path: path.to_owned(),
        group,
    }
}

/// Send one request and wait for the answer (blocking; for the CLI).
pub fn request(path: &Path, req: &Request, timeout: Duration) -> Result<Response, ControlError> {
    let io_err = |error| ControlError::Io {
        path: path.to_owned(),
        error,
    };
    let mut stream = StdUnixStream::connect(path).map_err(|e| connect_error(path, e))?;
    stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
    let mut line = serde_json::to_string(req).expect("requests always serialise");
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(io_err)?;
    let mut answer = String::new();
    BufReader::new(stream)
        .read_line(&mut answer)
        .map_err(io_err)?;
    serde_json::from_str(&answer).map_err(|e| ControlError::Protocol {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// A request waiting for the control loop's answer.
pub struct PendingRequest {
    pub request: Request,
    /// Who sent it (`SO_PEERCRED`: the kernel's word, not the client's); `None` if the kernel
    /// could not tell, which allows nothing but status.
    pub peer: Option<Peer>,
    pub reply: oneshot::Sender<Response>,
}

/// The credentials of the process at the other end of a control connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<u32>,
}

/// Bind the control socket: create its directory, replace a stale socket file, set mode 0660 and
/// the configured group (a name, or a numeric gid). Refuses to steal the socket of a live daemon.
pub fn bind(path: &Path, group: Option<&str>) -> Result<UnixListener, ControlError> {
    let bind_err = |error| ControlError::Bind {
        path: path.to_owned(),
        error,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(bind_err)?;
    }
    if path.exists() {
        if StdUnixStream::connect(path).is_ok() {
            return Err(ControlError::InUse {
                path: path.to_owned(),
            });
        }
        std::fs::remove_file(path).map_err(bind_err)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_err)?;
    if let Some(group) = group {
        let gid = match group.parse::<u32>() {
            Ok(id) => nix::unistd::Gid::from_raw(id),
            Err(_) => {
                nix::unistd::Group::from_name(group)
                    .map_err(|e| bind_err(std::io::Error::from(e)))?
                    .ok_or_else(|| {
                        bind_err(std::io::Error::other(format!(
                            "group {group:?} does not exist"
                        )))
                    })?
                    .gid
            }
        };
        nix::unistd::chown(path, None, Some(gid)).map_err(|e| bind_err(std::io::Error::from(e)))?;
    }
    Ok(listener)
}

/// Accept connections forever, handing each request to the control loop through `requests`.
pub async fn serve(listener: UnixListener, requests: mpsc::Sender<PendingRequest>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let requests = requests.clone();
        let peer = stream.peer_cred().ok().map(|c| Peer {
            uid: c.uid(),
            gid: c.gid(),
            pid: c.pid().and_then(|p| u32::try_from(p).ok()),
        });
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut reader = TokioBufReader::new(read.take(MAX_REQUEST_BYTES as u64));
            let mut line = String::new();
            let response =
                match tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line))
                    .await
                {
                    Ok(Ok(_)) => match serde_json::from_str::<Request>(&line) {
                        Ok(request) => {
                            let (reply, answer) = oneshot::channel();
                            if requests
                                .send(PendingRequest {
                                    request,
                                    peer,
                                    reply,
                                })
                                .await
                                .is_err()
                            {
                                Response::Error {
                                    message: "the daemon is shutting down".into(),
                                }
                            } else {
                                answer.await.unwrap_or(Response::Error {
                                    message: "the daemon dropped the request".into(),
                                })
                            }
                        }
                        // Never echo the request back: it is untrusted input.
                        Err(e) => Response::Error {
                            message: format!(
                                "malformed request ({} at line {} column {})",
                                e.classify_name(),
                                e.line(),
                                e.column()
                            ),
                        },
                    },
                    Ok(Err(e)) => Response::Error {
                        message: format!("cannot read request: {e}"),
                    },
                    Err(_) => Response::Error {
                        message: "no request within 5 s".into(),
                    },
                };
            let mut out = serde_json::to_string(&response).expect("responses always serialise");
            out.push('\n');
            let _ = write.write_all(out.as_bytes()).await;
        });
    }
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "I/O error",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "unknown request",
            serde_json::error::Category::Eof => "truncated",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::NodeStatus;

    #[tokio::test]
    async fn request_and_answer_over_a_real_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/governor.sock");
        let listener = bind(&path, None).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let (tx, mut rx) = mpsc::channel(4);
        tokio::spawn(serve(listener, tx));
        tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                let answer = match p.request {
                    Request::Status => Response::Status(Box::new(NodeStatus {
                        node: "n1".into(),
                        ..Default::default()
                    })),
                    other => Response::Ok {
                        message: format!("{other:?}"),
                    },
                };
                let _ = p.reply.send(answer);
            }
        });
        let p = path.clone();
        let status = tokio::task::spawn_blocking(move || {
            request(&p, &Request::Status, Duration::from_secs(5))
        })
        .await
        .unwrap()
        .unwrap();
        assert!(matches!(status, Response::Status(s) if s.node == "n1"));
        let p = path.clone();
        let release = tokio::task::spawn_blocking(move || {
            request(
                &p,
                &Request::Release {
                    cgroup: "/x".into(),
                },
                Duration::from_secs(5),
            )
        })
        .await
        .unwrap()
        .unwrap();
        assert!(matches!(release, Response::Ok { message } if message.contains("/x")));

        // A second daemon must not steal the socket.
        assert!(matches!(bind(&path, None), Err(ControlError::InUse { .. })));

        // Garbage gets an error that does not echo it.
        let p = path.clone();
        let raw = tokio::task::spawn_blocking(move || {
            let mut s = StdUnixStream::connect(&p).unwrap();
            s.write_all(b"{\"request\":\"rm -rf secret\"}\n").unwrap();
            let mut a = String::new();
            BufReader::new(s).read_line(&mut a).unwrap();
            a
        })
        .await
        .unwrap();
        assert!(
            raw.contains("unknown request") && !raw.contains("secret"),
            "{raw}"
        );
    }

    #[test]
    fn stale_socket_is_replaced_and_missing_daemon_is_explained() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { bind(&path, None).unwrap() });
        let e = request(
            &dir.path().join("none.sock"),
            &Request::Status,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("is `governor daemon` running"),
            "{e}"
        );
        // Its cause once, through a chain as the CLI prints it.
        let chain = format!("{:#}", anyhow::Error::new(e).context("governor status"));
        assert_eq!(chain.matches("os error").count(), 1, "{chain}");
    }

    #[test]
    fn a_caller_the_socket_refuses_is_told_which_group_to_ask_for() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("governor.sock");
        std::fs::write(&path, "").unwrap();
        if nix::unistd::geteuid().is_root() {
            // A gid no group on this machine is likely to have: named by its number.
            std::os::unix::fs::chown(&path, None, Some(4_000_123)).unwrap();
        }
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        let e = connect_error(&path, denied);
        assert!(matches!(e, ControlError::NotAllowed { .. }), "{e:?}");
        let line = format!("{:#}", anyhow::Error::new(e).context("governor run-job"));
        assert!(!line.contains('\n') && !line.contains("os error"), "{line}");
        let gid = std::fs::metadata(&path).unwrap().gid();
        if gid == 0 {
            assert!(line.contains("only root may"), "{line}");
        } else {
            assert!(
                line.contains("ask the operator to add you to group `"),
                "{line}"
            );
            assert!(
                line.contains("(socket_group in /etc/governor/governor.toml)"),
                "{line}"
            );
        }
        if nix::unistd::geteuid().is_root() {
            assert!(line.contains("group `4000123`"), "{line}");
        }
        // Anything else is a daemon that is not there.
        let gone = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert!(matches!(
            connect_error(&path, gone),
            ControlError::Connect { .. }
        ));
    }
}
