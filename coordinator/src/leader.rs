//! One leader among the coordinator replicas, elected through etcd.
//!
//! A replica campaigns with a compare-and-swap: it creates the leader key (`PREFIX/leader`,
//! value: its name) attached to a lease of its own, if and only if the key does not exist. The
//! winner renews the lease every third of its TTL; the others retry every half second and serve
//! nothing meanwhile (they do not even listen, so nodes and `govctl`, given every replica's
//! address, reach the leader by trying them in turn).
//!
//! **Fencing.** The key's create revision, unique to this term, is the leader's token: every
//! write the leader makes to the store is a transaction that first compares it
//! ([`crate::store::etcd`]). A leader that was deposed without noticing (paused past its lease,
//! cut off from etcd) writes nothing: its lease expired in etcd, the key went with it, and the
//! next leader's key has another create revision.
//!
//! **Acting on nodes.** Writes are fenced by etcd, commands to nodes only by the leader's own
//! clock: [`LeaseClock`] holds the moment its lease surely still stands (when the last renewal
//! that etcd answered was *sent*, plus the TTL granted, less a tenth for the two clocks' rates),
//! and the coordinator's actor stops before it handles anything past it. etcd counts the lease
//! from when the renewal *arrived*, so the key outlives the clock, and no other replica can be
//! elected before this one has stopped acting (the monotonic clock counts a paused process's
//! time, so a SIGSTOPped leader finds its clock expired the moment it resumes).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::etcd::{Etcd, EtcdError, created_at, put, read};

/// The moment until which this replica may act as leader (`None`: always; the redb backend has
/// one coordinator by construction).
#[derive(Clone, Debug)]
pub struct LeaseClock(Option<Arc<watch::Sender<Instant>>>);

impl LeaseClock {
    /// A clock that never runs out (one coordinator, no election).
    pub fn forever() -> LeaseClock {
        LeaseClock(None)
    }

    fn until(deadline: Instant) -> LeaseClock {
        LeaseClock(Some(Arc::new(watch::Sender::new(deadline))))
    }

    /// The lease still stands now.
    pub fn valid(&self) -> bool {
        self.0.as_ref().is_none_or(|d| Instant::now() < *d.borrow())
    }

    /// Stop leading now (a write was refused: someone else leads).
    pub fn expire(&self) {
        if let Some(d) = &self.0 {
            d.send_replace(Instant::now());
        }
    }

    fn extend_to(&self, deadline: Instant) {
        if let Some(d) = &self.0 {
            d.send_if_modified(|old| {
                // Never extend an expired lease: once deposed, a replica campaigns again.
                if *old > Instant::now() && deadline > *old {
                    *old = deadline;
                    true
                } else {
                    false
                }
            });
        }
    }

    /// Resolves once the lease has run out (never for [`LeaseClock::forever`]).
    pub async fn expired(&self) {
        let Some(d) = &self.0 else {
            return std::future::pending().await;
        };
        let mut rx = d.subscribe();
        loop {
            let deadline = *rx.borrow_and_update();
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = rx.changed() => {}
            }
        }
    }
}

/// What a leader needs to fence its writes.
#[derive(Clone, Debug)]
pub struct Fence {
    /// The leader key.
    pub key: Vec<u8>,
    /// Its create revision in this leader's term.
    pub revision: i64,
}

/// This replica leads until [`Leadership::clock`] runs out.
#[derive(Debug)]
pub struct Leadership {
    etcd: Etcd,
    lease: i64,
    fence: Fence,
    clock: LeaseClock,
    renew: tokio::task::JoinHandle<()>,
}

impl Leadership {
    pub fn clock(&self) -> LeaseClock {
        self.clock.clone()
    }

    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Give the leadership up at once (a clean stop): the lease is revoked, so another replica
    /// takes over within its retry interval instead of a TTL.
    pub async fn resign(self) {
        self.renew.abort();
        self.clock.expire();
        self.etcd.revoke(self.lease).await;
    }

    /// Stop renewing without a word, as a crash would: the lease runs out in etcd.
    pub fn abandon(self) {}
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.renew.abort();
        self.clock.expire();
    }
}

/// The share of a granted TTL the leader's clock counts on (the rest covers the two clocks'
/// rates differing and the time a renewal takes to arrive).
const CLOCK_SHARE: f64 = 0.9;
/// How often a follower tries to become the leader.
pub const RETRY: Duration = Duration::from_millis(500);

fn deadline(sent: Instant, ttl_s: i64) -> Instant {
    sent + Duration::from_secs_f64(ttl_s.max(0) as f64 * CLOCK_SHARE)
}

/// Campaign until this replica leads (`name` is what the leader key says: shown to operators).
/// `etcd` should be a handle of its own, so that renewals never wait behind the store's writes.
pub async fn campaign(
    etcd: Etcd,
    key: Vec<u8>,
    name: &str,
    ttl_s: u64,
) -> Result<Leadership, EtcdError> {
    let mut following: Option<String> = None;
    let mut logged_error = false;
    let mut lease: Option<(i64, Instant, i64)> = None; // id, last renewal sent, ttl
    loop {
        let attempt: Result<Option<Leadership>, EtcdError> = async {
            // A lease of our own, renewed while we wait, ready for the moment the key is free.
            let (id, sent, ttl) = match lease {
                Some((id, sent, ttl)) if sent.elapsed() < Duration::from_secs(ttl as u64) / 3 => {
                    (id, sent, ttl)
                }
                Some((id, _, _)) => {
                    let sent = Instant::now();
                    match etcd.keep_alive(id).await? {
                        ttl if ttl > 0 => (id, sent, ttl),
                        _ => {
                            let (id, ttl) = etcd.grant(ttl_s).await?;
                            (id, sent, ttl)
                        }
                    }
                }
                None => {
                    let sent = Instant::now();
                    let (id, ttl) = etcd.grant(ttl_s).await?;
                    (id, sent, ttl)
                }
            };
            lease = Some((id, sent, ttl));
            let resp = etcd
                .txn(governor_proto::etcd::TxnRequest {
                    compare: vec![created_at(&key, 0)],
                    success: vec![put(key.clone(), name.as_bytes().to_vec(), id)],
                    failure: vec![read(key.clone())],
                })
                .await?;
            let holder = if resp.succeeded {
                None
            } else {
                first_kv(&resp)
            };
            let revision = match &holder {
                // Won now.
                None => resp.header.map_or(0, |h| h.revision),
                // Won by an earlier try whose answer was lost (the key is on our lease).
                Some(kv) if kv.lease == id => kv.create_revision,
                Some(kv) => {
                    let leader = String::from_utf8_lossy(&kv.value).into_owned();
                    if following.as_deref() != Some(leader.as_str()) {
                        info!(%leader, "another coordinator leads; following");
                        following = Some(leader);
                    }
                    return Ok(None);
                }
            };
            let clock = LeaseClock::until(deadline(sent, ttl));
            let renew = tokio::spawn(renew(etcd.clone(), id, ttl_s, clock.clone()));
            Ok(Some(Leadership {
                etcd: etcd.clone(),
                lease: id,
                fence: Fence {
                    key: key.clone(),
                    revision,
                },
                clock,
                renew,
            }))
        }
        .await;
        match attempt {
            Ok(Some(l)) => {
                info!(revision = l.fence.revision, "elected leader");
                return Ok(l);
            }
            Ok(None) => logged_error = false,
            Err(e) => {
                if !logged_error {
                    warn!(error = %e, "cannot campaign for the leadership; retrying");
                    logged_error = true;
                }
                lease = None;
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Renew the leader's lease every third of its TTL, moving the clock on with each answer;
/// stop when etcd says the lease is gone or the clock ran out first.
async fn renew(etcd: Etcd, id: i64, ttl_s: u64, clock: LeaseClock) {
    let every = Duration::from_secs_f64(ttl_s as f64 / 3.0);
    let mut logged = false;
    loop {
        tokio::time::sleep(every).await;
        if !clock.valid() {
            warn!("the leader lease ran out before it could be renewed; stepping down");
            return;
        }
        let sent = Instant::now();
        match etcd.keep_alive(id).await {
            Ok(ttl) if ttl > 0 => {
                clock.extend_to(deadline(sent, ttl));
                logged = false;
            }
            Ok(_) => {
                warn!("etcd says the leader lease is gone; stepping down");
                clock.expire();
                return;
            }
            Err(e) => {
                if !logged {
                    warn!(error = %e, "cannot renew the leader lease; retrying until it runs out");
                    logged = true;
                }
            }
        }
    }
}

fn first_kv(resp: &governor_proto::etcd::TxnResponse) -> Option<governor_proto::etcd::KeyValue> {
    use governor_proto::etcd::response_op::Response;
    resp.responses.iter().find_map(|r| match &r.response {
        Some(Response::ResponseRange(range)) => range.kvs.first().cloned(),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_clock_runs_out_at_its_deadline_and_is_never_extended_after() {
        let clock = LeaseClock::until(Instant::now() + Duration::from_secs(3));
        assert!(clock.valid());
        clock.extend_to(Instant::now() + Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(4900)).await;
        assert!(clock.valid());
        let t0 = Instant::now();
        clock.expired().await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(100));
        assert!(!clock.valid());
        clock.extend_to(Instant::now() + Duration::from_secs(5));
        assert!(!clock.valid(), "an expired lease is never renewed");
        assert!(LeaseClock::forever().valid());
    }

    #[test]
    fn the_clock_counts_nine_tenths_of_the_ttl_from_when_the_renewal_was_sent() {
        let sent = Instant::now();
        assert_eq!(deadline(sent, 5) - sent, Duration::from_millis(4500));
        assert_eq!(deadline(sent, -1), sent);
    }
}
