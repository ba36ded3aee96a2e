//! The node's side of the cluster protocol: the [`NodeAgent`] keeps a session with the
//! coordinator, streams the daemon's latest [`NodeReport`] and hands the coordinator's
//! [`NodeCommand`]s to the daemon.
//!
//! The agent never blocks or stops the daemon: it runs on its own task, reads reports from a
//! `watch` channel (latest value wins, the daemon never waits), and when the coordinator is
//! unreachable it retries with capped exponential back-off while the node keeps governing on its
//! own. It stops when the daemon drops its end of the `watch` channel.
//!
//! ```no_run
//! # async fn demo() {
//! use governor::coordinator_client::{AgentConfig, NodeAgent};
//! use governor_proto::node::{NodeCapacity, NodeReport};
//! let (report_tx, report_rx) = tokio::sync::watch::channel(NodeReport::default());
//! let (command_tx, mut command_rx) = tokio::sync::mpsc::channel(64);
//! let config = AgentConfig::new("10.10.0.1:7070", "node2", NodeCapacity::cpu_only(8.0, 32 << 30));
//! let agent = NodeAgent::spawn(config, report_rx, command_tx);
//! // The daemon: report_tx.send_replace(report) whenever its state changes; handle
//! // command_rx.recv() in its control loop; drop report_tx to stop the agent.
//! # drop((report_tx, agent));
//! # }
//! ```

use std::time::Duration;

pub use governor_proto::node::{
    CheckpointChunk, GpuDevice, GpuUsage, JobOrigin, JobReport, MoveRequest, NodeCapacity,
    NodeCommand, NodeReport, RunState, SaveJob, StartJob, StopJob, UploadCheckpoint,
};
use governor_proto::node::{CoordinatorMessage, Hello, NodeMessage, Welcome};
use governor_proto::pb;
use governor_proto::pb::node_service_client::NodeServiceClient;
pub use governor_proto::tls::TlsFiles;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

/// Capped exponential back-off between connection attempts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Wait after the first failure.
    pub initial: Duration,
    /// Never wait longer than this.
    pub max: Duration,
    /// A session that lasted this long resets the back-off to `initial`.
    pub reset_after: Duration,
}

/// After a session that had been welcomed and lasted [`HEALTHY_SESSION`] ends, the agent
/// retries every `initial` (not doubling) for this long: the coordinator that ended it is
/// restarting, or a replica is being elected in its place (a lease of a few seconds, then it
/// listens), and a node that doubled its wait meanwhile would come back many seconds after
/// the new leader serves (measured 2026-11-29: 4-30 s against the leader's 2-5 s). A session
/// that failed before its welcome, or a coordinator that ends sessions at once, gets the
/// doubling back-off: nothing is retried in a tight loop.
pub const FAST_RETRY_WINDOW: Duration = Duration::from_secs(15);

/// A session at least this long, welcomed, counts as healthy for [`FAST_RETRY_WINDOW`].
pub const HEALTHY_SESSION: Duration = Duration::from_secs(3);

impl Default for Backoff {
    /// 0.5 s, doubling, at most 30 s; reset after a session of a minute.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait before attempt `failures + 1` (failures >= 1), with ±20% jitter from `seed` so
    /// that a rack of nodes does not reconnect in lock-step after a coordinator restart.
    pub fn delay(&self, failures: u32, seed: u64) -> Duration {
        let exp = self.initial.saturating_mul(
            1u32.checked_shl(failures.saturating_sub(1).min(31))
                .unwrap_or(u32::MAX),
        );
        let base = exp.min(self.max);
        // Deterministic jitter in [0.8, 1.2).
        let h = seed
            .wrapping_add(failures as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(17);
        let jitter = 0.8 + 0.4 * ((h >> 11) as f64 / (1u64 << 53) as f64);
        base.mul_f64(jitter).min(self.max)
    }
}

/// How the agent connects.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The coordinator's address, `HOST:PORT` (the daemon's `--coordinator`), or every
    /// replica's, separated by commas: the agent tries them in turn (only the leader listens).
    pub coordinator: String,
    /// mTLS files (`ca.pem`, `NODE.pem`, `NODE-key.pem`), or `None` for plain text (only with
    /// the daemon's explicit `--insecure`).
    pub tls: Option<TlsFiles>,
    /// The node's name: a DNS label, and the common name of its certificate.
    pub node_name: String,
    /// What the node offers to governed jobs.
    pub capacity: NodeCapacity,
    /// Send the latest report at least this often (the coordinator's welcome may shorten it).
    pub report_interval: Duration,
    /// Never send reports closer together than this, however often the daemon updates.
    pub min_report_gap: Duration,
    pub backoff: Backoff,
    /// Reported in `govctl nodes`.
    pub agent_version: String,
    /// The node can dump and restore jobs with CRIU (told to the coordinator).
    pub can_dump: bool,
    /// Where the coordinator's jobs write their output (the daemon's `job_output_dir`): pieces
    /// of it are read from here for `govctl logs`; `None`: such requests are answered with an
    /// error.
    pub job_output_dir: Option<std::path::PathBuf>,
}

impl AgentConfig {
    /// Plain-text defaults: 1 s reports, default back-off. Set `tls` for mTLS.
    pub fn new(
        coordinator: impl Into<String>,
        node_name: impl Into<String>,
        capacity: NodeCapacity,
    ) -> Self {
        AgentConfig {
            coordinator: coordinator.into(),
            tls: None,
            node_name: node_name.into(),
            capacity,
            report_interval: Duration::from_secs(1),
            min_report_gap: Duration::from_millis(100),
            backoff: Backoff::default(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            can_dump: false,
            job_output_dir: None,
        }
    }

    /// Check what can be checked before connecting (the daemon calls this at start-up to fail
    /// early with a clear message).
    pub fn validate(&self) -> Result<(), AgentError> {
        governor_proto::node::validate_node_name(&self.node_name).map_err(AgentError::Config)?;
        if !(self.capacity.cores.is_finite() && self.capacity.cores > 0.0) {
            return Err(AgentError::Config(format!(
                "node capacity must have a positive number of cores, got {}",
                self.capacity.cores
            )));
        }
        for address in governor_proto::tls::addresses(&self.coordinator) {
            governor_proto::tls::endpoint(address, self.tls.as_ref())
                .map_err(|e| AgentError::Config(e.to_string()))?;
        }
        Ok(())
    }
}

/// What the coordinator has acknowledged of this node, for the node's fence: a node that has had
/// none of its reports acknowledged for `fence_after` stops (saves, then stops) the jobs the
/// coordinator would start elsewhere if it lost the node (`fence_jobs`, as it last named them),
/// so that no job runs on two nodes ([`governor_proto::node::Welcome`]; the bound's argument is
/// `governor_planner::StateConfig::fence_after_s`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Contact {
    /// When this node sent the latest report (or hello) the coordinator acknowledged.
    pub confirmed_at: Option<std::time::Instant>,
    /// The coordinator's bound (`None`: it set none).
    pub fence_after: Option<Duration>,
    /// The jobs the fence covers.
    pub fence_jobs: Vec<String>,
}

impl Contact {
    /// The jobs to fence at `now`: every one the coordinator named, once nothing sent since
    /// `fence_after` before `now` has been acknowledged; none otherwise.
    pub fn due(&self, now: std::time::Instant) -> &[String] {
        match (self.confirmed_at, self.fence_after) {
            (Some(at), Some(after)) if now.saturating_duration_since(at) > after => {
                &self.fence_jobs
            }
            _ => &[],
        }
    }

    /// A start of `job_id` arrived: a later start of a job (after a move, `attempt` > 0) is
    /// covered by the fence at once, before the next heartbeat names it (the coordinator may
    /// lose this node within that second). The next heartbeat's list replaces this one.
    fn starting(&mut self, job_id: &str, attempt: u32) {
        if attempt > 0 && !self.fence_jobs.iter().any(|j| j == job_id) {
            self.fence_jobs.push(job_id.to_owned());
        }
    }

    /// A heartbeat `w` acknowledging what was sent at `sent_at` (`None`: nothing this session
    /// sent is acknowledged yet).
    fn acknowledge(&mut self, sent_at: Option<std::time::Instant>, w: &Welcome) {
        if let Some(at) = sent_at {
            self.confirmed_at = Some(self.confirmed_at.map_or(at, |c| c.max(at)));
        }
        self.fence_after =
            (w.fence_after_ms > 0).then(|| Duration::from_millis(u64::from(w.fence_after_ms)));
        self.fence_jobs.clone_from(&w.fence_jobs);
    }
}

/// Recent report sends kept for the heartbeats that acknowledge them (a heartbeat a second,
/// reports at most a few a second).
const SENT_KEPT: usize = 256;

/// A session's report stream: numbers each report and remembers when the recent ones were sent,
/// for the heartbeats that acknowledge them.
struct ReportStream {
    tx: mpsc::Sender<pb::NodeMessage>,
    sequence: u64,
    sent: std::collections::VecDeque<(u64, Instant)>,
}

impl ReportStream {
    /// Send the latest report; false once the stream is closed. Latest wins: if the stream is
    /// backed up, this one is skipped (the next is newer anyway).
    fn send_latest(&mut self, reports: &mut watch::Receiver<NodeReport>) -> bool {
        self.sequence += 1;
        let mut report = reports.borrow_and_update().clone();
        report.sequence = self.sequence;
        match self.tx.try_send(NodeMessage::Report(report).into()) {
            Ok(()) => {
                if self.sent.len() >= SENT_KEPT {
                    self.sent.pop_front();
                }
                self.sent.push_back((self.sequence, Instant::now()));
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                debug!("report stream busy; skipping a report");
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// When report `sequence` was sent, if it is recent.
    fn sent_at(&self, sequence: u64) -> Option<std::time::Instant> {
        self.sent
            .iter()
            .find(|(seq, _)| *seq == sequence)
            .map(|(_, at)| at.into_std())
    }
}

/// Where the agent stands (for the daemon's status output).
#[derive(Clone, Debug, PartialEq)]
pub enum AgentStatus {
    /// Trying to connect (attempt number, from 1).
    Connecting { attempt: u32 },
    /// In a session.
    Connected { session: u64 },
    /// The last attempt failed; the next one is in `retry_in`.
    Waiting { error: String, retry_in: Duration },
    /// The daemon dropped its report channel, or the configuration is invalid.
    Stopped,
}

/// An agent configuration or session error.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid cluster agent configuration: {0}")]
    Config(String),
    #[error("cannot reach the coordinator at {address}: {detail}")]
    Connect { address: String, detail: String },
    #[error("the coordinator at {address} ended the session: {detail}")]
    Session { address: String, detail: String },
}

/// The node agent. See the module documentation.
#[derive(Debug)]
pub struct NodeAgent;

/// How a session ended.
enum End {
    /// The daemon dropped the report channel: stop.
    Shutdown,
    /// The coordinator closed the stream cleanly.
    Closed,
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let text = inner.to_string();
        if !s.contains(&text) {
            s = format!("{s}: {text}");
        }
        src = inner.source();
    }
    s
}

impl NodeAgent {
    /// Start the agent on the current tokio runtime.
    pub fn spawn(
        config: AgentConfig,
        reports: watch::Receiver<NodeReport>,
        commands: mpsc::Sender<NodeCommand>,
    ) -> JoinHandle<()> {
        Self::spawn_with_status(config, reports, commands).0
    }

    /// [`Self::spawn`], also returning a channel with the agent's status.
    pub fn spawn_with_status(
        config: AgentConfig,
        reports: watch::Receiver<NodeReport>,
        commands: mpsc::Sender<NodeCommand>,
    ) -> (JoinHandle<()>, watch::Receiver<AgentStatus>) {
        // No uploads: a closed channel.
        let (_, uploads) = mpsc::channel(1);
        Self::spawn_with_uploads(config, reports, commands, uploads)
    }

    /// [`Self::spawn_with_status`], also sending the checkpoint pieces the daemon uploads
    /// (in order, waiting for room in the session's stream).
    pub fn spawn_with_uploads(
        config: AgentConfig,
        reports: watch::Receiver<NodeReport>,
        commands: mpsc::Sender<NodeCommand>,
        uploads: mpsc::Receiver<CheckpointChunk>,
    ) -> (JoinHandle<()>, watch::Receiver<AgentStatus>) {
        let (handle, status, _) = Self::spawn_with_contact(config, reports, commands, uploads);
        (handle, status)
    }

    /// [`Self::spawn_with_uploads`], also returning what the coordinator has acknowledged
    /// ([`Contact`], for the node's fence).
    pub fn spawn_with_contact(
        config: AgentConfig,
        reports: watch::Receiver<NodeReport>,
        commands: mpsc::Sender<NodeCommand>,
        uploads: mpsc::Receiver<CheckpointChunk>,
    ) -> (
        JoinHandle<()>,
        watch::Receiver<AgentStatus>,
        watch::Receiver<Contact>,
    ) {
        let (status_tx, status_rx) = watch::channel(AgentStatus::Connecting { attempt: 1 });
        let (contact_tx, contact_rx) = watch::channel(Contact::default());
        let handle = tokio::spawn(run(
            config, reports, commands, uploads, status_tx, contact_tx,
        ));
        (handle, status_rx, contact_rx)
    }
}

async fn run(
    config: AgentConfig,
    mut reports: watch::Receiver<NodeReport>,
    commands: mpsc::Sender<NodeCommand>,
    mut uploads: mpsc::Receiver<CheckpointChunk>,
    status: watch::Sender<AgentStatus>,
    contact: watch::Sender<Contact>,
) {
    let mut uploads_open = true;
    if let Err(e) = config.validate() {
        warn!(error = %e, "cluster agent not started; the node keeps governing on its own");
        status.send_replace(AgentStatus::Stopped);
        return;
    }
    let seed = config
        .node_name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
    let mut failures = 0u32;
    // Retry at the initial pace until then (a healthy session just ended).
    let mut fast_until: Option<Instant> = None;
    let mut last_error = String::new();
    let mut daemon_gone_logged = false;
    let mut preferred = 0usize;
    loop {
        status.send_replace(AgentStatus::Connecting {
            attempt: failures + 1,
        });
        let started = Instant::now();
        let result = session(
            &config,
            &mut preferred,
            &mut reports,
            &commands,
            (&mut uploads, &mut uploads_open),
            (&status, &contact),
            &mut daemon_gone_logged,
        )
        .await;
        match result {
            Ok(End::Shutdown) => break,
            Ok(End::Closed) => {
                info!(coordinator = %config.coordinator, "the coordinator closed the session; reconnecting");
            }
            Err(e) => {
                let text = e.to_string();
                if text != last_error {
                    warn!(error = %text, "cluster session failed; the node keeps governing on its own and retries");
                    last_error = text;
                } else {
                    debug!(error = %text, "cluster session failed again");
                }
            }
        }
        let welcomed = matches!(*status.borrow(), AgentStatus::Connected { .. });
        if started.elapsed() >= config.backoff.reset_after {
            failures = 0;
        }
        if welcomed && started.elapsed() >= HEALTHY_SESSION {
            failures = 0;
            fast_until = Some(Instant::now() + FAST_RETRY_WINDOW);
        }
        let fast = fast_until.is_some_and(|t| Instant::now() < t);
        failures = if fast { 1 } else { failures.saturating_add(1) };
        let wait = config.backoff.delay(failures, seed);
        status.send_replace(AgentStatus::Waiting {
            error: last_error.clone(),
            retry_in: wait,
        });
        // Wait, but stop at once if the daemon goes away.
        let deadline = Instant::now() + wait;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                changed = reports.changed() => if changed.is_err() {
                    status.send_replace(AgentStatus::Stopped);
                    return;
                },
            }
        }
    }
    info!("cluster agent stopped");
    status.send_replace(AgentStatus::Stopped);
}

/// Read the piece of a job's output the coordinator asks for, off the session's task, and send
/// it on the session (a read of at most 256 KiB; the coordinator waits for the answer).
fn answer_output_request(
    dir: Option<std::path::PathBuf>,
    request: governor_proto::node::ReadOutput,
    tx: mpsc::Sender<pb::NodeMessage>,
) {
    tokio::spawn(async move {
        let request_id = request.request_id;
        let job = request.job_id.clone();
        let piece = match dir {
            Some(dir) => tokio::task::spawn_blocking(move || {
                crate::daemon::launcher::output::read_piece(&dir, &request)
            })
            .await
            .unwrap_or_else(|e| {
                governor_proto::node::OutputChunk::failed(
                    request_id,
                    format!("the read failed: {e}"),
                )
            }),
            None => governor_proto::node::OutputChunk::failed(
                request_id,
                "this node keeps no job output",
            ),
        };
        if !piece.error.is_empty() {
            debug!(%job, error = %piece.error, "a job's output could not be read");
        }
        let _ = tx.send(NodeMessage::Output(piece).into()).await;
    });
}

/// How long a coordinator has to answer a hello with its welcome.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// A session whose coordinator has sent nothing for this long (it heartbeats every second) is
/// given up. Ten beats, so that a coordinator busy for a few seconds does not see its nodes
/// leave together.
const SILENCE_LIMIT: Duration = Duration::from_secs(10);

/// An open session: the address that served it, the stream to the coordinator, the stream from
/// it, its welcome and when the hello went.
type Opened = (
    String,
    mpsc::Sender<pb::NodeMessage>,
    tonic::Streaming<pb::CoordinatorMessage>,
    governor_proto::node::Welcome,
    Instant,
);

/// Connect to the coordinator at `address`, say hello and wait for its welcome.
async fn open_session(config: &AgentConfig, address: &str) -> Result<Opened, AgentError> {
    let connect_err = |detail: String| AgentError::Connect {
        address: address.to_owned(),
        detail,
    };
    let endpoint = governor_proto::tls::endpoint(address, config.tls.as_ref())
        .map_err(|e| connect_err(e.to_string()))?;
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| connect_err(chain(&e)))?;
    let mut client = NodeServiceClient::new(channel);
    let (tx, rx) = mpsc::channel::<pb::NodeMessage>(8);
    let hello = Hello {
        node_name: config.node_name.clone(),
        capacity: config.capacity.clone(),
        agent_version: config.agent_version.clone(),
        can_dump: config.can_dump,
    };
    let hello_sent = Instant::now();
    tx.try_send(NodeMessage::Hello(hello).into())
        .expect("a fresh channel has room");
    let mut inbound = client
        .session(ReceiverStream::new(rx))
        .await
        .map_err(|s| connect_err(format!("{:?}: {}", s.code(), s.message())))?
        .into_inner();
    let session_err = |detail: String| AgentError::Session {
        address: address.to_owned(),
        detail,
    };
    let welcome = match inbound.message().await {
        Ok(Some(m)) => match CoordinatorMessage::try_from(m) {
            Ok(CoordinatorMessage::Welcome(w)) => w,
            Ok(other) => return Err(session_err(format!("expected a welcome, got {other:?}"))),
            Err(e) => return Err(session_err(e.to_string())),
        },
        Ok(None) => return Err(session_err("closed before the welcome".into())),
        Err(s) => return Err(session_err(format!("{:?}: {}", s.code(), s.message()))),
    };
    Ok((address.to_owned(), tx, inbound, welcome, hello_sent))
}

async fn session(
    config: &AgentConfig,
    preferred: &mut usize,
    reports: &mut watch::Receiver<NodeReport>,
    commands: &mpsc::Sender<NodeCommand>,
    (uploads, uploads_open): (&mut mpsc::Receiver<CheckpointChunk>, &mut bool),
    (status, contact): (&watch::Sender<AgentStatus>, &watch::Sender<Contact>),
    daemon_gone_logged: &mut bool,
) -> Result<End, AgentError> {
    // Every replica's address may be given; only the leader listens. Try them in turn, from
    // the one that served last.
    let addresses = governor_proto::tls::addresses(&config.coordinator);
    let mut failures = Vec::new();
    let mut opened = None;
    for k in 0..addresses.len() {
        let i = (*preferred + k) % addresses.len();
        // A coordinator that accepts the connection and then never answers (paused, hung)
        // must not hold the node: past the bound, the next address.
        let opening = tokio::time::timeout(OPEN_TIMEOUT, open_session(config, addresses[i]));
        match opening.await.unwrap_or_else(|_| {
            Err(AgentError::Connect {
                address: addresses[i].to_owned(),
                detail: format!("no welcome within {OPEN_TIMEOUT:?}"),
            })
        }) {
            Ok(o) => {
                *preferred = i;
                opened = Some(o);
                break;
            }
            Err(e) => failures.push(e),
        }
    }
    let Some((address, tx, mut inbound, welcome, hello_sent)) = opened else {
        return Err(if failures.len() == 1 {
            failures.pop().expect("one failure")
        } else {
            AgentError::Connect {
                address: config.coordinator.clone(),
                detail: failures
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            }
        });
    };
    let session_err = |detail: String| AgentError::Session {
        address: address.clone(),
        detail,
    };
    let interval = if welcome.report_interval_ms > 0 {
        config
            .report_interval
            .min(Duration::from_millis(welcome.report_interval_ms as u64))
    } else {
        config.report_interval
    };
    // The welcome answers the hello: the coordinator has seen this node since it was sent.
    contact.send_modify(|c| c.acknowledge(Some(hello_sent.into_std()), &welcome));
    info!(coordinator = %address, session = welcome.session_id, "connected to the coordinator");
    status.send_replace(AgentStatus::Connected {
        session: welcome.session_id,
    });

    let mut stream = ReportStream {
        tx: tx.clone(),
        sequence: 0,
        sent: std::collections::VecDeque::new(),
    };
    stream.send_latest(reports);
    let mut last_sent = Instant::now();
    let mut pending = false;
    let mut tick = tokio::time::interval_at(Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A coordinator that heartbeats (it sends a fence bound) and falls silent is paused, hung or
    // cut off: a replicated one has another leader by then. Leave it for the next address.
    let heartbeats = welcome.fence_after_ms > 0;
    let mut heard = Instant::now();
    loop {
        let flush_at = last_sent + config.min_report_gap;
        tokio::select! {
            _ = tokio::time::sleep_until(heard + SILENCE_LIMIT), if heartbeats => {
                *preferred = (*preferred + 1) % addresses.len();
                return Err(session_err(format!("no heartbeat for {SILENCE_LIMIT:?}")));
            }
            msg = inbound.message() => match msg.inspect(|_| heard = Instant::now()) {
                Ok(Some(m)) => match CoordinatorMessage::try_from(m) {
                    Ok(CoordinatorMessage::Command(cmd)) => {
                        debug!(job = cmd.job_id(), "command from the coordinator");
                        if let NodeCommand::Start(start) = &cmd {
                            contact.send_modify(|c| c.starting(&start.job_id, start.attempt));
                        }
                        if commands.send(cmd).await.is_err() && !*daemon_gone_logged {
                            warn!("the daemon no longer takes cluster commands; dropping them");
                            *daemon_gone_logged = true;
                        }
                    }
                    Ok(CoordinatorMessage::ReadOutput(r)) => {
                        answer_output_request(config.job_output_dir.clone(), r, tx.clone());
                    }
                    Ok(CoordinatorMessage::Welcome(beat)) => {
                        // A heartbeat: the reports up to `acknowledged_sequence` arrived.
                        let at = stream.sent_at(beat.acknowledged_sequence);
                        contact.send_modify(|c| c.acknowledge(at, &beat));
                    }
                    Err(e) => warn!(error = %e, "ignoring an invalid message from the coordinator"),
                },
                Ok(None) => return Ok(End::Closed),
                Err(s) => return Err(session_err(format!("{:?}: {}", s.code(), s.message()))),
            },
            piece = uploads.recv(), if *uploads_open => match piece {
                // Waits for room: an upload is paced by the stream, reports are not held up for
                // long (a piece is 1 MiB).
                Some(p) => {
                    if tx.send(NodeMessage::Chunk(p).into()).await.is_err() {
                        return Err(session_err("the stream closed during an upload".into()));
                    }
                }
                None => *uploads_open = false,
            },
            changed = reports.changed(), if !pending => {
                if changed.is_err() {
                    return Ok(End::Shutdown);
                }
                pending = true;
            }
            _ = tokio::time::sleep_until(flush_at), if pending => {
                pending = false;
                if !stream.send_latest(reports) {
                    return Err(session_err("the report stream closed".into()));
                }
                last_sent = Instant::now();
            }
            _ = tick.tick() => {
                pending = false;
                if !stream.send_latest(reports) {
                    return Err(session_err("the report stream closed".into()));
                }
                last_sent = Instant::now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_is_due_once_nothing_sent_within_its_bound_is_acknowledged() {
        let t0 = std::time::Instant::now();
        let beat = |ack: u64, jobs: &[&str]| Welcome {
            session_id: 1,
            report_interval_ms: 1000,
            fence_after_ms: 10_000,
            acknowledged_sequence: ack,
            fence_jobs: jobs.iter().map(|j| (*j).to_owned()).collect(),
        };
        let mut c = Contact::default();
        // Never acknowledged: no clock, nothing due.
        assert!(c.due(t0 + Duration::from_secs(3600)).is_empty());
        c.acknowledge(Some(t0), &beat(0, &["j1"]));
        assert!(c.due(t0 + Duration::from_secs(10)).is_empty());
        assert_eq!(c.due(t0 + Duration::from_millis(10_001)), ["j1"]);
        // A later acknowledgement moves the clock; an older one (a late heartbeat) does not.
        c.acknowledge(Some(t0 + Duration::from_secs(5)), &beat(7, &["j1", "j2"]));
        c.acknowledge(Some(t0 + Duration::from_secs(2)), &beat(6, &["j1", "j2"]));
        assert!(c.due(t0 + Duration::from_secs(15)).is_empty());
        assert_eq!(c.due(t0 + Duration::from_secs(16)), ["j1", "j2"]);
        // A heartbeat that acknowledges nothing this node remembers keeps the clock running,
        // and the coordinator's latest list is the one fenced.
        c.acknowledge(None, &beat(99, &[]));
        assert!(c.due(t0 + Duration::from_secs(16)).is_empty());
        // A job moved here is covered from its start, before a heartbeat names it; a first
        // start is not.
        c.starting("j3", 1);
        c.starting("j4", 0);
        assert_eq!(c.due(t0 + Duration::from_secs(16)), ["j3"]);
        // No bound from the coordinator: no fence.
        c.acknowledge(
            None,
            &Welcome {
                fence_after_ms: 0,
                ..beat(0, &["j1"])
            },
        );
        assert!(c.due(t0 + Duration::from_secs(3600)).is_empty());
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered() {
        let b = Backoff::default();
        let d: Vec<Duration> = (1..=10).map(|f| b.delay(f, 42)).collect();
        for (f, delay) in d.iter().enumerate() {
            let base = (0.5 * 2f64.powi(f as i32)).min(30.0);
            let s = delay.as_secs_f64();
            assert!(
                s >= 0.8 * base - 1e-9 && s <= (1.2 * base).min(30.0) + 1e-9,
                "failure {}: {s} s",
                f + 1
            );
        }
        assert!(b.delay(1000, 1) <= Duration::from_secs(30));
        assert_ne!(
            b.delay(3, 1),
            b.delay(3, 2),
            "different nodes should not retry in lock-step"
        );
    }

    #[test]
    fn validate_names_the_problem() {
        let mut c = AgentConfig::new("10.0.0.1:7070", "Node_2", NodeCapacity::cpu_only(4.0, 0));
        assert!(c.validate().unwrap_err().to_string().contains("a-z, 0-9"));
        c.node_name = "node2".into();
        c.capacity.cores = 0.0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("positive number of cores")
        );
        c.capacity.cores = 2.0;
        c.validate().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_coordinator_is_retried_and_the_agent_stops_with_the_daemon() {
        // Nothing listens on port 1 of localhost: every attempt fails at once.
        let (report_tx, report_rx) = watch::channel(NodeReport::default());
        let (cmd_tx, _cmd_rx) = mpsc::channel(4);
        let config = AgentConfig::new("127.0.0.1:1", "node9", NodeCapacity::cpu_only(1.0, 0));
        let (handle, mut status) = NodeAgent::spawn_with_status(config, report_rx, cmd_tx);
        let mut waits = Vec::new();
        while waits.len() < 3 {
            status.changed().await.unwrap();
            if let AgentStatus::Waiting { retry_in, error } = status.borrow().clone() {
                assert!(error.contains("127.0.0.1:1"), "{error}");
                waits.push(retry_in);
            }
        }
        assert!(waits[1] > waits[0] && waits[2] > waits[1], "{waits:?}");
        // The daemon keeps updating its report without ever blocking.
        for _ in 0..100 {
            report_tx.send_replace(NodeReport::default());
        }
        drop(report_tx);
        tokio::time::timeout(Duration::from_secs(60), handle)
            .await
            .expect("the agent stops when the daemon drops the report channel")
            .unwrap();
        assert_eq!(*status.borrow(), AgentStatus::Stopped);
    }
}
