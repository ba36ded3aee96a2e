//! A small etcd v3 client: key ranges, transactions and leases, over the workspace's own tonic
//! (`governor_proto::etcd`, generated from our subset of etcd's API by protox).
//!
//! Why not the `etcd-client` crate, which the design suggested: its build script runs `protoc`,
//! and `cargo xtask` builds the coordinator before it can install anything, so a fresh machine's
//! first command would fail ("Could not find `protoc`", tried 2026-11-29). What the coordinator
//! needs of etcd is five calls; they are here, with the one behaviour it needs that a generic
//! client leaves to its user: every request has a deadline, and a member that does not answer in
//! time (down, or cut off from the quorum, where etcd makes requests wait instead of failing) is
//! left for the next endpoint.

use std::sync::Arc;
use std::time::Duration;

use governor_proto::etcd::compare::{CompareResult, CompareTarget, TargetUnion};
use governor_proto::etcd::kv_client::KvClient;
use governor_proto::etcd::lease_client::LeaseClient;
use governor_proto::etcd::request_op::Request;
use governor_proto::etcd::{
    Compare, DeleteRangeRequest, KeyValue, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};
use governor_proto::tls::TlsFiles;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, warn};

/// `[state.etcd]`: where the cluster's etcd is and how the coordinator uses it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// The members' client URLs (`https://HOST:2379`, or `HOST:PORT`: https with `tls`, else
    /// http).
    pub endpoints: Vec<String>,
    /// Every key the coordinator writes starts with this (several clusters can share one etcd).
    pub prefix: String,
    /// The leader's lease: a leader that cannot renew it for this long stops leading, and
    /// another replica takes over after it has expired in etcd.
    pub lease_ttl_s: u64,
    /// How long one request may take before the next endpoint is tried.
    pub request_timeout_ms: u64,
    /// At most this many writes per transaction (etcd's `--max-txn-ops`, 128 by default).
    pub max_txn_ops: usize,
    /// The CA of etcd's server certificates and this replica's client certificate.
    pub tls: Option<TlsFiles>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/governor".into(),
            lease_ttl_s: 5,
            request_timeout_ms: 2000,
            max_txn_ops: 128,
            tls: None,
        }
    }
}

/// An etcd request failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("bad etcd endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("no etcd endpoint answered ({endpoints}); the last said: {last}")]
    Unreachable { endpoints: String, last: String },
    #[error("etcd refused the request: {0}")]
    Refused(String),
}

/// A handle on the cluster's etcd (cheap to clone; one connection, moved to the next member
/// when the current one does not answer).
#[derive(Clone)]
pub struct Etcd {
    endpoints: Arc<Vec<(String, Endpoint)>>,
    current: Arc<Mutex<(usize, Option<Channel>)>>,
    timeout: Duration,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.endpoints.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Etcd").field("endpoints", &names).finish()
    }
}

impl Etcd {
    /// A client for `config.endpoints` (connects on first use).
    pub fn new(config: &EtcdConfig) -> Result<Etcd, EtcdError> {
        if config.endpoints.is_empty() {
            return Err(EtcdError::Endpoint {
                endpoint: String::new(),
                reason: "[state.etcd] endpoints is empty".into(),
            });
        }
        let tls = config
            .tls
            .as_ref()
            .map(|t| t.client_config())
            .transpose()
            .map_err(|e| EtcdError::Endpoint {
                endpoint: config.endpoints.join(","),
                reason: e.to_string(),
            })?;
        let timeout = Duration::from_millis(config.request_timeout_ms.max(100));
        let mut endpoints = Vec::new();
        for name in &config.endpoints {
            let bad = |reason: String| EtcdError::Endpoint {
                endpoint: name.clone(),
                reason,
            };
            let url = if name.contains("://") {
                name.clone()
            } else if tls.is_some() {
                format!("https://{name}")
            } else {
                format!("http://{name}")
            };
            if url.starts_with("https://") && tls.is_none() {
                return Err(bad("https needs [state.etcd] tls (ca, cert, key)".into()));
            }
            let mut ep = Endpoint::from_shared(url)
                .map_err(|e| bad(e.to_string()))?
                .connect_timeout(timeout)
                .tcp_nodelay(true);
            if let Some(tls) = &tls
                && (name.starts_with("https://") || !name.contains("://"))
            {
                ep = ep.tls_config(tls.clone()).map_err(|e| bad(e.to_string()))?;
            }
            endpoints.push((name.clone(), ep));
        }
        Ok(Etcd {
            endpoints: Arc::new(endpoints),
            current: Arc::new(Mutex::new((0, None))),
            timeout,
        })
    }

    /// Run `call` on a member: the current one, else each of the others in turn. A member that
    /// cannot be reached, answers `Unavailable` or `DeadlineExceeded`, or takes longer than the
    /// request timeout is passed over; any other answer is final.
    async fn call<T, F, Fut>(&self, what: &'static str, call: F) -> Result<T, EtcdError>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut current = self.current.lock().await;
        let mut last = String::new();
        for _ in 0..self.endpoints.len() {
            let (index, channel) = &mut *current;
            let (name, endpoint) = &self.endpoints[*index];
            let ch = match channel {
                Some(ch) => ch.clone(),
                None => match endpoint.connect().await {
                    Ok(ch) => {
                        *channel = Some(ch.clone());
                        ch
                    }
                    Err(e) => {
                        last = format!("{name}: {e}");
                        debug!(endpoint = %name, error = %e, "etcd member unreachable");
                        *index = (*index + 1) % self.endpoints.len();
                        *channel = None;
                        continue;
                    }
                },
            };
            match tokio::time::timeout(self.timeout, call(ch)).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(s))
                    if !matches!(
                        s.code(),
                        tonic::Code::Unavailable
                            | tonic::Code::DeadlineExceeded
                            | tonic::Code::Unknown
                            | tonic::Code::Cancelled
                    ) =>
                {
                    return Err(EtcdError::Refused(format!("{what}: {}", s.message())));
                }
                Ok(Err(s)) => last = format!("{name}: {:?} {}", s.code(), s.message()),
                Err(_) => last = format!("{name}: no answer within {:?}", self.timeout),
            }
            debug!(endpoint = %name, %last, "etcd member did not serve {what}; trying the next");
            *index = (*index + 1) % self.endpoints.len();
            *channel = None;
        }
        Err(EtcdError::Unreachable {
            endpoints: self
                .endpoints
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            last,
        })
    }

    /// Every key starting with `prefix`, read in pages of `page` keys at one revision (so the
    /// result is one consistent snapshot however large).
    pub async fn range_prefix(&self, prefix: &[u8], page: i64) -> Result<Vec<KeyValue>, EtcdError> {
        let end = prefix_end(prefix);
        let mut out = Vec::new();
        let mut from = prefix.to_vec();
        let mut revision = 0;
        loop {
            let req = RangeRequest {
                key: from.clone(),
                range_end: end.clone(),
                limit: page,
                revision,
            };
            let resp = self
                .call("range", |ch| {
                    let req = req.clone();
                    async move { KvClient::new(ch).range(req).await.map(|r| r.into_inner()) }
                })
                .await?;
            if revision == 0 {
                revision = resp.header.map_or(0, |h| h.revision);
            }
            let more = resp.more;
            if let Some(last) = resp.kvs.last() {
                from = last.key.clone();
                from.push(0);
            }
            out.extend(resp.kvs);
            if !more {
                return Ok(out);
            }
        }
    }

    /// One key, if it exists.
    pub async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let req = RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        };
        let resp = self
            .call("get", |ch| {
                let req = req.clone();
                async move { KvClient::new(ch).range(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// A transaction. Sent again to the next member if the current one did not answer: the
    /// coordinator's transactions are compare-guarded puts and deletes, so applying one twice
    /// changes nothing the first did not.
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.call("txn", |ch| {
            let req = req.clone();
            async move { KvClient::new(ch).txn(req).await.map(|r| r.into_inner()) }
        })
        .await
    }

    /// A new lease of `ttl_s` seconds: its id and the TTL etcd granted.
    pub async fn grant(&self, ttl_s: u64) -> Result<(i64, i64), EtcdError> {
        let resp = self
            .call("lease grant", |ch| async move {
                LeaseClient::new(ch)
                    .lease_grant(LeaseGrantRequest {
                        ttl: ttl_s as i64,
                        id: 0,
                    })
                    .await
                    .map(|r| r.into_inner())
            })
            .await?;
        if !resp.error.is_empty() {
            return Err(EtcdError::Refused(format!("lease grant: {}", resp.error)));
        }
        Ok((resp.id, resp.ttl))
    }

    /// Renew lease `id` once: the TTL it has now, 0 or less when it is gone.
    pub async fn keep_alive(&self, id: i64) -> Result<i64, EtcdError> {
        self.call("lease keep-alive", |ch| async move {
            let once = tokio_stream::once(LeaseKeepAliveRequest { id });
            let mut answers = LeaseClient::new(ch)
                .lease_keep_alive(once)
                .await?
                .into_inner();
            match answers.message().await? {
                Some(a) => Ok(a.ttl),
                None => Err(tonic::Status::unavailable("keep-alive stream closed")),
            }
        })
        .await
    }

    /// Give lease `id` up at once (its keys go with it).
    pub async fn revoke(&self, id: i64) {
        let r = self
            .call("lease revoke", |ch| async move {
                LeaseClient::new(ch)
                    .lease_revoke(LeaseRevokeRequest { id })
                    .await
                    .map(|_| ())
            })
            .await;
        if let Err(e) = r {
            warn!(error = %e, "could not revoke the leader lease; it expires on its own");
        }
    }
}

/// The end of the range of keys starting with `prefix` (its last byte below 0xff plus one).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// `key`'s create revision equals `revision` (0: the key does not exist).
pub fn created_at(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
    }
}

pub fn put(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(PutRequest { key, value, lease })),
    }
}

pub fn delete(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
            key,
            range_end: Vec::new(),
        })),
    }
}

pub fn read(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestRange(RangeRequest {
            key,
            ..Default::default()
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_after_the_last_key_with_the_prefix() {
        assert_eq!(prefix_end(b"/governor/jobs/"), b"/governor/jobs0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }

    #[test]
    fn endpoints_are_checked_before_use() {
        let c = |endpoints: &[&str]| EtcdConfig {
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert!(Etcd::new(&c(&["127.0.0.1:2379", "http://10.0.0.2:2379"])).is_ok());
        let e = Etcd::new(&c(&[])).unwrap_err().to_string();
        assert!(e.contains("endpoints is empty"), "{e}");
        let e = Etcd::new(&c(&["https://10.0.0.2:2379"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("https needs [state.etcd] tls"), "{e}");
    }
}
