//! The actor that owns the state: one task, one channel, requests handled in order.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use governor_proto::control::{
    JobDetail, JobMove, JobSpec, JobSummary, NodeSummary, PolicyState, Stats,
};
use governor_proto::node::{
    CheckpointChunk, CoordinatorMessage, Hello, MAX_OUTPUT_CHUNK, NodeCommand, NodeReport,
    OutputChunk, ReadOutput, Welcome,
};
use governor_proto::pb;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;
use tracing::{debug, error, warn};

use crate::leader::LeaseClock;
use crate::state::{Answer, ClusterState, ControlError, Input, OutputSource, SessionError};
use crate::store::{Batch, Store, StoreError};

/// Seconds since the Unix epoch: the coordinator's clock (persisted times survive restarts).
pub(super) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One message to a node's session. Boxed: a session queue allocates its slots in blocks of
/// 32, and 32 unboxed messages (with tonic's `Status`) took 7.7 KB per node, a fifth of the
/// coordinator's memory per connected node (heaptrack of `cluster_load`).
pub(super) type SessionItem = Box<Result<pb::CoordinatorMessage, Status>>;

/// The stream of messages to one node's session.
pub(super) type SessionTx = mpsc::Sender<SessionItem>;

/// Capacity of a session's outgoing queue. Commands are rare; a node that lets this fill up is
/// not reading its stream.
pub(super) const SESSION_QUEUE: usize = 256;

enum Msg {
    Hello {
        hello: Hello,
        address: String,
        tx: SessionTx,
        reply: oneshot::Sender<Welcome>,
    },
    Report {
        node: String,
        session: u64,
        report: NodeReport,
        reply: oneshot::Sender<Result<(), SessionError>>,
    },
    Disconnected {
        node: String,
        session: u64,
    },
    Chunk {
        node: String,
        session: u64,
        chunk: CheckpointChunk,
    },
    Output {
        node: String,
        session: u64,
        piece: OutputChunk,
    },
    ReadOutput {
        id: String,
        replica: u32,
        offset: u64,
        from_end: bool,
        on_node: Option<String>,
        reply: oneshot::Sender<Result<OutputRead, ControlError>>,
    },
    Submit {
        spec: JobSpec,
        reply: oneshot::Sender<JobSummary>,
    },
    Cancel {
        id: String,
        reply: oneshot::Sender<Result<JobSummary, ControlError>>,
    },
    Move {
        id: String,
        target: Option<String>,
        reply: oneshot::Sender<Result<JobMove, ControlError>>,
    },
    Nodes(oneshot::Sender<Vec<NodeSummary>>),
    Jobs {
        all: bool,
        reply: oneshot::Sender<Vec<JobSummary>>,
    },
    Job {
        id: String,
        reply: oneshot::Sender<Result<JobDetail, ControlError>>,
    },
    Policy(oneshot::Sender<PolicyState>),
    SetPolicy {
        name: String,
        reply: oneshot::Sender<Result<PolicyState, ControlError>>,
    },
    Stats(oneshot::Sender<Stats>),
    Web(oneshot::Sender<super::web::Snapshot>),
    Shutdown(oneshot::Sender<()>),
}

/// The answer to a read of a job's output ([`Coordinator::read_output`]).
#[derive(Debug)]
pub(super) enum OutputRead {
    /// The job is queued: on no node.
    NotPlaced,
    /// Its node is not connected now.
    NodeAway {
        node: String,
        /// The job has ended (a follower stops waiting for the node).
        finished: bool,
    },
    /// What its node read (or why it could not: `piece.error`).
    Piece {
        node: String,
        /// The job has ended: its output grows no more.
        finished: bool,
        piece: OutputChunk,
    },
}

/// A read of a job's output sent to a node, waiting for its answer.
struct PendingRead {
    node: String,
    session: u64,
    finished: bool,
    reply: oneshot::Sender<Result<OutputRead, ControlError>>,
}

/// Placement decision latencies (wall time of the admission rounds that placed jobs).
#[derive(Debug, Default)]
pub struct LatencyStats {
    samples: Vec<f64>,
    next: usize,
    count: u64,
}

impl LatencyStats {
    const KEPT: usize = 100_000;

    fn record(&mut self, seconds: f64) {
        self.count += 1;
        if self.samples.len() < Self::KEPT {
            self.samples.push(seconds);
        } else {
            self.samples[self.next] = seconds;
            self.next = (self.next + 1) % Self::KEPT;
        }
    }

    /// (p50, p99, max) in milliseconds over the kept samples.
    pub fn percentiles_ms(&self) -> (f64, f64, f64) {
        if self.samples.is_empty() {
            return (0.0, 0.0, 0.0);
        }
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize] * 1000.0;
        (at(0.5), at(0.99), s[s.len() - 1] * 1000.0)
    }
}

/// A handle to the coordinator's actor. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Coordinator {
    tx: mpsc::Sender<Msg>,
}

fn gone() -> Status {
    Status::unavailable("the coordinator is shutting down")
}

impl Coordinator {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Msg) -> Result<T, Status> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    pub(crate) async fn hello(
        &self,
        hello: Hello,
        address: String,
        tx: SessionTx,
    ) -> Result<Welcome, Status> {
        self.ask(|reply| Msg::Hello {
            hello,
            address,
            tx,
            reply,
        })
        .await
    }

    pub(crate) async fn report(
        &self,
        node: String,
        session: u64,
        report: NodeReport,
    ) -> Result<Result<(), SessionError>, Status> {
        self.ask(|reply| Msg::Report {
            node,
            session,
            report,
            reply,
        })
        .await
    }

    /// A piece of a checkpoint a node uploads (no answer: a bad piece fails the transfer).
    pub(crate) async fn chunk(&self, node: String, session: u64, chunk: CheckpointChunk) {
        let _ = self
            .tx
            .send(Msg::Chunk {
                node,
                session,
                chunk,
            })
            .await;
    }

    /// A node's answer to a read of a job's output.
    pub(crate) async fn output(&self, node: String, session: u64, piece: OutputChunk) {
        let _ = self
            .tx
            .send(Msg::Output {
                node,
                session,
                piece,
            })
            .await;
    }

    /// Read a piece of a job's output from its node: from `offset`, or `offset` bytes before
    /// the end with `from_end`; `on_node`: from that node instead (one the job left, whose
    /// output is then complete). Waits for the node's answer (the caller bounds the wait).
    pub(super) async fn read_output(
        &self,
        id: String,
        replica: u32,
        offset: u64,
        from_end: bool,
        on_node: Option<String>,
    ) -> Result<Result<OutputRead, ControlError>, Status> {
        self.ask(|reply| Msg::ReadOutput {
            id,
            replica,
            offset,
            from_end,
            on_node,
            reply,
        })
        .await
    }

    pub(crate) async fn disconnected(&self, node: String, session: u64) {
        let _ = self.tx.send(Msg::Disconnected { node, session }).await;
    }

    pub async fn submit(&self, spec: JobSpec) -> Result<JobSummary, Status> {
        self.ask(|reply| Msg::Submit { spec, reply }).await
    }

    pub async fn cancel(&self, id: String) -> Result<Result<JobSummary, ControlError>, Status> {
        self.ask(|reply| Msg::Cancel { id, reply }).await
    }

    pub async fn move_job(
        &self,
        id: String,
        target: Option<String>,
    ) -> Result<Result<JobMove, ControlError>, Status> {
        self.ask(|reply| Msg::Move { id, target, reply }).await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeSummary>, Status> {
        self.ask(Msg::Nodes).await
    }

    pub async fn jobs(&self, all: bool) -> Result<Vec<JobSummary>, Status> {
        self.ask(|reply| Msg::Jobs { all, reply }).await
    }

    pub async fn job(&self, id: String) -> Result<Result<JobDetail, ControlError>, Status> {
        self.ask(|reply| Msg::Job { id, reply }).await
    }

    pub async fn policy(&self) -> Result<PolicyState, Status> {
        self.ask(Msg::Policy).await
    }

    pub async fn set_policy(
        &self,
        name: String,
    ) -> Result<Result<PolicyState, ControlError>, Status> {
        self.ask(|reply| Msg::SetPolicy { name, reply }).await
    }

    pub async fn stats(&self) -> Result<Stats, Status> {
        self.ask(Msg::Stats).await
    }

    /// Everything the cluster page and `/metrics` show, in one consistent snapshot.
    pub async fn web_snapshot(&self) -> Result<super::web::Snapshot, Status> {
        self.ask(Msg::Web).await
    }

    /// Stop the actor after it has persisted everything.
    pub async fn shutdown(&self) {
        let _ = self.ask(Msg::Shutdown).await;
    }
}

/// How the actor runs besides its state and store.
pub(super) struct Settings {
    /// Sample the jobs' progress for the cluster page (only when `[web]` serves it: listing
    /// every job each round is work a coordinator without the page need not do).
    pub keep_history: bool,
    /// Checkpoints carried between nodes are kept beside this path.
    pub carry_beside: std::path::PathBuf,
    /// Until when this coordinator may act (a replica's leader lease).
    pub clock: LeaseClock,
}

/// Start the actor.
pub(super) fn spawn(state: ClusterState, store: Store, settings: Settings) -> Coordinator {
    let (tx, rx) = mpsc::channel(4096);
    let mut actor = Actor::new(state, store, &settings.carry_beside, settings.clock);
    actor.history = settings.keep_history.then(super::web::History::default);
    tokio::spawn(actor.run(rx));
    Coordinator { tx }
}

struct Actor {
    state: ClusterState,
    store: Store,
    sessions: HashMap<String, (u64, SessionTx)>,
    /// The latest report sequence received from each node's current session: its heartbeat
    /// acknowledges it (the node's fence counts from when it sent that report).
    acknowledged: HashMap<String, u64>,
    latency: LatencyStats,
    /// The same latencies as a Prometheus histogram (`/metrics`).
    latency_histogram: super::web::PlacementHistogram,
    /// Recent progress and CPU of each job, for the page's sparklines (`None`: no page).
    history: Option<super::web::History>,
    started: Instant,
    store_failing: bool,
    /// The leader lease: past it the actor handles nothing and sends nothing.
    clock: LeaseClock,
    /// Answered once the store is closed, so a new coordinator can open it at once.
    shutdown_reply: Option<oneshot::Sender<()>>,
    /// Checkpoints carried between nodes (moves without a shared path).
    carried: super::carry::Carried,
    /// Reads of jobs' output waiting for their nodes, by request id.
    output_reads: HashMap<u64, PendingRead>,
    next_read: u64,
    /// Answers to requests that changed the state (a submission, a cancel, a move, a policy),
    /// sent once the store holds the change: a client told "submitted as j15" by a leader that
    /// then lost its store must not see j15 given to another job by the next leader (the soak
    /// saw it, 2026-11-30). Dropped unanswered if this coordinator stops acting first: the
    /// client sees an error and the change is not in the store.
    answers_after_persist: Vec<Box<dyn FnOnce() + Send>>,
}

impl Actor {
    fn new(
        state: ClusterState,
        store: Store,
        carry_beside: &std::path::Path,
        clock: LeaseClock,
    ) -> Self {
        let carried = super::carry::Carried::beside(carry_beside);
        Actor {
            clock,
            state,
            store,
            sessions: HashMap::new(),
            acknowledged: HashMap::new(),
            latency: LatencyStats::default(),
            latency_histogram: super::web::PlacementHistogram::default(),
            history: None,
            started: Instant::now(),
            store_failing: false,
            shutdown_reply: None,
            carried,
            output_reads: HashMap::new(),
            next_read: 0,
            answers_after_persist: Vec::new(),
        }
    }

    /// Answer `reply` with `value` once the state that produced it is in the store.
    fn answer_after_persist<T: Send + 'static>(&mut self, reply: oneshot::Sender<T>, value: T) {
        self.answers_after_persist.push(Box::new(move || {
            let _ = reply.send(value);
        }));
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let clock = self.clock.clone();
        loop {
            tokio::select! {
                msg = rx.recv() => {
                    let Some(msg) = msg else { break };
                    if !self.clock.valid() || self.handle(msg) {
                        break;
                    }
                    // Drain what else is waiting, then flush once for the batch.
                    let mut stop = false;
                    for _ in 0..1024 {
                        match rx.try_recv() {
                            Ok(m) => if self.handle(m) { stop = true; break; },
                            Err(_) => break,
                        }
                    }
                    self.flush().await;
                    if stop {
                        break;
                    }
                }
                _ = tick.tick() => {
                    if !self.clock.valid() {
                        break;
                    }
                    self.timed(|s, now| s.handle(now, Input::Tick));
                    self.send_heartbeats();
                    // Reads whose callers stopped waiting (their node never answered).
                    self.output_reads.retain(|_, r| !r.reply.is_closed());
                    let now = unix_now();
                    if let Some(h) = self.history.as_mut().filter(|h| h.due(now)) {
                        h.sample(now, &self.state.list_jobs(false));
                    }
                    self.flush().await;
                }
                // A deposed leader stops at once, whatever it was waiting for.
                _ = clock.expired() => break,
            }
        }
        if self.clock.valid() {
            self.flush().await;
        } else {
            warn!(
                "the leader lease ran out: this coordinator stops acting (nothing more is written or sent)"
            );
        }
        let reply = self.shutdown_reply.take();
        drop(self); // closes the store
        debug!("coordinator actor stopped");
        if let Some(reply) = reply {
            let _ = reply.send(());
        }
    }

    /// Every open session's heartbeat: the latest report received and the jobs its fence
    /// covers (a full queue skips one; the next follows within a second).
    fn send_heartbeats(&mut self) {
        for (node, (session, tx)) in &self.sessions {
            let sequence = self.acknowledged.get(node).copied().unwrap_or(0);
            let beat = self.state.heartbeat(node, *session, sequence);
            let _ = tx.try_send(Box::new(Ok(CoordinatorMessage::Welcome(beat).into())));
        }
    }

    /// Run a state call that may place jobs and record how long the placement took.
    fn timed<T>(&mut self, f: impl FnOnce(&mut ClusterState, f64) -> T) -> T {
        let before = self.state.placements();
        let started = Instant::now();
        let out = f(&mut self.state, unix_now());
        let placed = self.state.placements() - before;
        if placed > 0 {
            let took = started.elapsed().as_secs_f64();
            self.latency.record(took);
            self.latency_histogram.observe(took);
        }
        out
    }

    /// Handle one message; true to stop.
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Hello {
                hello,
                address,
                tx,
                reply,
            } => {
                let node = hello.node_name.clone();
                let welcome =
                    match self.timed(|s, now| s.handle(now, Input::Hello { hello, address })) {
                        Answer::Welcome(w) => w,
                        other => unreachable!("a hello is answered with a welcome, not {other:?}"),
                    };
                // The welcome goes first on the stream, before any command.
                let _ = tx.try_send(Box::new(Ok(
                    CoordinatorMessage::Welcome(welcome.clone()).into()
                )));
                self.acknowledged.remove(&node);
                self.sessions.insert(node, (welcome.session_id, tx));
                let _ = reply.send(welcome);
            }
            Msg::Report {
                node,
                session,
                report,
                reply,
            } => {
                if self.sessions.get(&node).is_some_and(|(s, _)| *s == session) {
                    self.acknowledged.insert(node.clone(), report.sequence);
                }
                let input = Input::Report {
                    node,
                    session,
                    report,
                };
                let result = match self.timed(|s, now| s.handle(now, input)) {
                    Answer::Report(r) => r,
                    other => unreachable!("a report is answered with its result, not {other:?}"),
                };
                let _ = reply.send(result);
            }
            Msg::Chunk {
                node,
                session,
                chunk,
            } => {
                if self.sessions.get(&node).is_some_and(|(s, _)| *s == session) {
                    self.on_chunk(&node, chunk);
                }
            }
            Msg::Output {
                node,
                session,
                piece,
            } => {
                let ours = self
                    .output_reads
                    .get(&piece.request_id)
                    .is_some_and(|r| r.node == node && r.session == session);
                if let Some(r) = ours
                    .then(|| self.output_reads.remove(&piece.request_id))
                    .flatten()
                {
                    let _ = r.reply.send(Ok(OutputRead::Piece {
                        node,
                        finished: r.finished,
                        piece,
                    }));
                }
            }
            Msg::ReadOutput {
                id,
                replica,
                offset,
                from_end,
                on_node,
                reply,
            } => self.read_output(&id, replica, (offset, from_end), on_node, reply),
            Msg::Disconnected { node, session } => {
                let away: Vec<u64> = self
                    .output_reads
                    .iter()
                    .filter(|(_, r)| r.node == node && r.session == session)
                    .map(|(&id, _)| id)
                    .collect();
                for id in away {
                    if let Some(r) = self.output_reads.remove(&id) {
                        let _ = r.reply.send(Ok(OutputRead::NodeAway {
                            node: node.clone(),
                            finished: r.finished,
                        }));
                    }
                }
                self.state.handle(
                    unix_now(),
                    Input::Disconnected {
                        node: node.clone(),
                        session,
                    },
                );
                if self.sessions.get(&node).is_some_and(|(s, _)| *s == session) {
                    self.sessions.remove(&node);
                    self.acknowledged.remove(&node);
                }
            }
            Msg::Submit { spec, reply } => {
                let job = match self.timed(|s, now| s.handle(now, Input::Submit(spec))) {
                    Answer::Job(job) => job,
                    other => unreachable!("a submission is answered with its job, not {other:?}"),
                };
                self.answer_after_persist(reply, job);
            }
            Msg::Cancel { id, reply } => {
                let r = match self.timed(|s, now| s.handle(now, Input::Cancel { id })) {
                    Answer::Cancelled(r) => r,
                    other => unreachable!("a cancel is answered with its result, not {other:?}"),
                };
                self.answer_after_persist(reply, r);
            }
            Msg::Move { id, target, reply } => {
                let input = Input::Move {
                    id,
                    target,
                    reason: "govctl move".into(),
                };
                let r = match self.timed(|s, now| s.handle(now, input)) {
                    Answer::Moved(r) => r,
                    other => unreachable!("a move is answered with its result, not {other:?}"),
                };
                self.answer_after_persist(reply, r);
            }
            Msg::Nodes(reply) => {
                let _ = reply.send(self.state.list_nodes(unix_now()));
            }
            Msg::Jobs { all, reply } => {
                let _ = reply.send(self.state.list_jobs(all));
            }
            Msg::Job { id, reply } => {
                let _ = reply.send(self.state.job_detail(&id));
            }
            Msg::Policy(reply) => {
                let _ = reply.send(self.state.policy_state());
            }
            Msg::SetPolicy { name, reply } => {
                let r = self.timed(|s, now| s.set_policy(now, &name));
                self.answer_after_persist(reply, r);
            }
            Msg::Stats(reply) => {
                let crate::state::Counters {
                    nodes,
                    ready_nodes,
                    jobs,
                    queued_jobs,
                    reports,
                    placements,
                    policy,
                } = self.state.counters();
                let (p50, p99, max) = self.latency.percentiles_ms();
                let _ = reply.send(Stats {
                    uptime_s: self.started.elapsed().as_secs_f64(),
                    nodes,
                    ready_nodes,
                    jobs,
                    queued_jobs,
                    reports,
                    placements,
                    placement_p50_ms: p50,
                    placement_p99_ms: p99,
                    placement_max_ms: max,
                    policy,
                });
            }
            Msg::Web(reply) => {
                let now = unix_now();
                let _ = reply.send(super::web::Snapshot {
                    at_unix: now,
                    policy: self.state.policy_state().current,
                    nodes: self.state.list_nodes(now),
                    jobs: self.state.list_jobs(true),
                    counters: self.state.counters(),
                    moves: self.state.move_outcomes(),
                    placement: self.latency_histogram.clone(),
                    history: self.history.clone().unwrap_or_default(),
                });
            }
            Msg::Shutdown(reply) => {
                self.shutdown_reply = Some(reply);
                return true;
            }
        }
        false
    }

    /// Persist what changed, then send the commands it produced. A command never goes out for
    /// a state the store does not hold, so commands wait while the store fails: a node must
    /// never act on a decision a restarted (or the next) coordinator does not know of (a save
    /// for a move a crash would forget would read, after the restart, as the job's completion;
    /// a start could run a job twice).
    async fn flush(&mut self) {
        if !self.persist().await || !self.clock.valid() {
            return;
        }
        for answer in std::mem::take(&mut self.answers_after_persist) {
            answer();
        }
        for job in self.state.take_spent_checkpoints() {
            self.carried.discard(&job);
        }
        for (node, cmd) in self.state.take_outbox() {
            let Some((_, tx)) = self.sessions.get(&node) else {
                debug!(%node, job = cmd.job_id(), "node not connected; the command is resent when it reconnects");
                continue;
            };
            if let NodeCommand::Start(start) = &cmd
                && start.carried_checkpoint
            {
                self.carried.inject_fault(start);
                let archive = self.carried.archive(&start.job_id);
                let source = self.carried.source_sum(&start.job_id);
                super::carry::send_with_checkpoint(archive, source, start.clone(), tx.clone());
                continue;
            }
            if let Err(e) = tx.try_send(Box::new(Ok(
                CoordinatorMessage::Command(cmd.clone()).into()
            ))) {
                warn!(%node, job = cmd.job_id(), error = %e, "cannot queue a command to the node; dropping its session");
                self.sessions.remove(&node);
            }
        }
    }

    /// Ask the node of a job's member for a piece of its output; the answer comes as a
    /// `Msg::Output` (or `NodeAway` when the node goes first).
    fn read_output(
        &mut self,
        id: &str,
        replica: u32,
        (offset, from_end): (u64, bool),
        on_node: Option<String>,
        reply: oneshot::Sender<Result<OutputRead, ControlError>>,
    ) {
        let (mut node, name, replicas, mut finished) = match self.state.output_source(id, replica) {
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
            Ok(OutputSource::NotPlaced) => {
                let _ = reply.send(Ok(OutputRead::NotPlaced));
                return;
            }
            Ok(OutputSource::Node {
                node,
                name,
                replicas,
                finished,
            }) => (node, name, replicas, finished),
        };
        if let Some(left) = on_node.filter(|n| *n != node) {
            node = left;
            finished = true;
        }
        let Some((session, tx)) = self.sessions.get(&node) else {
            let _ = reply.send(Ok(OutputRead::NodeAway { node, finished }));
            return;
        };
        self.next_read += 1;
        let request_id = self.next_read;
        let msg = CoordinatorMessage::ReadOutput(ReadOutput {
            request_id,
            job_id: id.to_owned(),
            replica,
            replicas,
            name,
            offset,
            from_end,
            max_bytes: MAX_OUTPUT_CHUNK,
        });
        if tx.try_send(Box::new(Ok(msg.into()))).is_err() {
            // Its queue is full or closed: as good as away for a read (no command is lost).
            let _ = reply.send(Ok(OutputRead::NodeAway { node, finished }));
            return;
        }
        self.output_reads.insert(
            request_id,
            PendingRead {
                node,
                session: *session,
                finished,
                reply,
            },
        );
    }

    /// A piece of a checkpoint a node uploads; the whole (or a broken) upload goes to the state.
    fn on_chunk(&mut self, node: &str, chunk: CheckpointChunk) {
        use super::carry::Arrival;
        match self.carried.receive(node, chunk) {
            Arrival::More => {}
            Arrival::Whole { job, bytes } => {
                let input = Input::CheckpointArrived {
                    id: job,
                    node: node.to_owned(),
                    result: Ok(bytes),
                };
                self.timed(|s, now| s.handle(now, input));
            }
            Arrival::Broken { job, reason } => {
                warn!(%node, %job, %reason, "a carried checkpoint did not arrive intact");
                let input = Input::CheckpointArrived {
                    id: job,
                    node: node.to_owned(),
                    result: Err(reason),
                };
                self.timed(|s, now| s.handle(now, input));
            }
        }
    }

    /// Write the records that changed to the store (kept dirty for the next try on failure);
    /// false when they could not be.
    async fn persist(&mut self) -> bool {
        let dirty = self.state.take_dirty();
        if dirty.is_empty() {
            return !self.store_failing;
        }
        let state = &self.state;
        let batch = Batch::of(
            &dirty,
            &state.meta(),
            |n| state.node_record(n).cloned(),
            // Local jobs are not persisted: their nodes report them again after a restart.
            |j| state.job_record(j).filter(|r| !r.is_local()).cloned(),
        );
        match self.store.save(&batch).await {
            Ok(()) => {
                if self.store_failing {
                    warn!(store = %self.store.describe(), "the store works again");
                    self.store_failing = false;
                }
                true
            }
            Err(StoreError::Deposed) => {
                // The clock has expired: the run loop stops.
                self.clock.expire();
                false
            }
            Err(e) => {
                if !self.store_failing {
                    error!(error = %e, "cannot persist the coordinator's state; commands to nodes wait until it works again");
                    self.store_failing = true;
                }
                self.state.mark_dirty(dirty);
                false
            }
        }
    }
}
