//! The cluster planner: the coordinator's state machine (the node and job registry, the queue
//! and the placement policy; admission, gangs, moves, preemption, elastic resizing and
//! rebalancing), driven by events stamped with the caller's clock.
//!
//! One code for two drivers: the coordinator (`coordinator::server`) drives it with real time
//! and real nodes over gRPC; govsim (`sim::cluster`) drives it with simulated time and modelled
//! nodes, so every figure the simulator gives about the coordinator is about this code. Both
//! feed it through [`ClusterState::handle`] ([`Input`] in, node commands out).
//!
//! It does no I/O (`#![forbid(unsafe_code)]`, no async runtime, no system crate: `cargo xtask
//! test` checks its dependency tree): the server feeds it registrations, reports, submissions and ticks, then sends
//! the commands it leaves in the outbox ([`ClusterState::take_outbox`]) and persists the records it
//! marks dirty ([`ClusterState::take_dirty`]). Everything here is therefore testable with a fake
//! clock, and a restarted coordinator rebuilds the same state from its store
//! ([`ClusterState::restore`]).
//!
//! Lifecycle of a submitted job: `queued` -> (admitted by the queue and the policy) `starting`
//! -> (every member reported running) `running` -> `completed` / `failed`, or `cancelled`. When a
//! member's node is lost the job is `unknown` until the node reports again. Jobs a node found by
//! itself ("local" jobs) are listed too, under `NODE/ID`, and are never started or stopped by the
//! coordinator.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use governor_proto::control::{
    CategoryChange, JobMember, JobMove, JobSpec, JobState, JobSummary, NodeState,
    PlacementDecision, ProgressSample,
};
use governor_proto::node::{Category, NodeCapacity, NodeCommand, NodeReport, RunState};
use serde::{Deserialize, Serialize};

use governor_placement::queue::{Queue, Seconds};
use governor_placement::{self as placement, ClusterView, PlacementPolicy, UnknownPolicy};

mod elastic;
mod input;
mod jobs;
mod move_phases;
mod move_requests;
mod moves;
mod nodes;
mod preemption;
pub use governor_placement::payoff;
mod queries;
mod sweeps;
mod view;

pub use input::{Answer, Input};
use jobs::queued;
pub use moves::MoveError;
use nodes::local_id;
pub use queries::{Counters, OutputSource};

/// How the coordinator picks the node a job a node asked to move goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoveTarget {
    /// SpeCon's Algorithm 2 as the paper gives it: the node with the lowest weighted count of
    /// its jobs by stage (progressing 2, watching 1.5, converged 1; least CPU and memory in use
    /// among ties), unless the job's own node is among the lowest
    /// ([`governor_placement::specon::SpeCon::move_target`], the code govsim runs). Nodes
    /// that cannot take the job now (not connected, without the declared cores or memory
    /// unreserved, unable to restore a CRIU dump) are passed over for the next best.
    #[default]
    Specon,
    /// The node with the most free cores (capacity less reported use), then the fewest jobs,
    /// and only if it has more free cores than the job's node: a simpler rule of our own.
    MostFree,
}

/// Timeouts and sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StateConfig {
    /// A node that has not reported for this long is lost (its jobs become `unknown`).
    pub lost_after_s: f64,
    /// After a coordinator restart, a known node that has not reconnected yet is lost only after
    /// `lost_after_s` plus this long. Its agent was backing off while the coordinator was down
    /// (up to 30 s between attempts, `governor::coordinator_client::Backoff`): without the
    /// grace a slow restart would lose healthy nodes and roll back the moves in flight.
    pub resync_grace_s: f64,
    /// A member placed on a node that has not reported it within this long has failed to start.
    pub start_timeout_s: f64,
    /// A move's target lost after it was handed the job's start may be running the job (its
    /// governor died or hangs; the job does not stop with it). The move waits this long after
    /// the node is lost for it to come back before it starts the job again on its source:
    /// starting it sooner would run it twice, both copies writing one checkpoint directory.
    pub lost_target_wait_s: f64,
    /// How often nodes should report.
    pub report_interval_ms: u32,
    /// Gangs (several members or GPUs) without their own timeout fail after waiting this long.
    pub gang_timeout_s: f64,
    /// Progress samples kept per job (the sparkline in `govctl job`). The history covers the
    /// job's whole life: when it is full, every other sample goes and the spacing doubles.
    pub progress_samples: usize,
    /// A job asked to save for a move that has not within this long keeps running where it is
    /// (the move fails). Its save waits for the end of an epoch: leave room for a long one.
    pub save_timeout_s: f64,
    /// Act on the nodes' move requests (SpeCon Algorithm 2) for jobs that declared a
    /// checkpoint: move them to the node [`StateConfig::move_target`] picks.
    pub auto_move: bool,
    /// How the target of a move a node asks for is chosen.
    pub move_target: MoveTarget,
    /// A move request must stand this long before the coordinator acts on it.
    pub move_after_s: f64,
    /// A job is not moved automatically again within this long of its last move.
    pub move_cooldown_s: f64,
    /// A moved job must run this long on its new node before the move is over; should it fail
    /// sooner (its restore failed), it goes back to its source.
    pub move_confirm_s: f64,
    /// An automatic move must give back this many times what it costs ([`payoff`]); 0 turns
    /// this gate (ours, not the papers') off.
    pub move_payoff: f64,
    /// With `auto_move`: SpeCon's Algorithm 3, jobs whose node asks to move them and that stay
    /// (no better node yet) go to a node that turns idle or falls below the balance factor.
    pub rebalance: bool,
    /// A job is moved automatically (Algorithms 2 and 3) at most this many times; `None`: no
    /// limit beyond `move_cooldown_s`. SpeCon moves a container at most once (§V-A); govsim's
    /// SpeCon runs set 1.
    pub max_auto_moves: Option<u32>,
    /// A move's pause by framework checkpoint and by CRIU (fitted to `cargo xtask
    /// bench-move`; set them from a run on your own nodes). A framework checkpoint's move
    /// also pays the job's start again: its own measured start ([`JobRecord::start_s`]) is
    /// added to `framework_move_cost`.
    pub framework_move_cost: payoff::MoveCost,
    pub criu_move_cost: payoff::MoveCost,
    /// A higher-priority job that fits nowhere displaces lower-priority jobs by checkpoint
    /// (saved, requeued at the head of their priority, resumed later; never killed).
    pub preemption: bool,
    /// A job is displaced only after running this long since its latest start.
    pub preempt_min_run_s: f64,
    /// Grow and shrink elastic jobs (`--cores MIN:MAX`) as the placement policy says
    /// ([`governor_placement::elastic`]); off: they keep the size they started with.
    pub elastic: bool,
    /// An elastic job is resized only after running this long since its latest start (a
    /// resize is a save and a start again).
    pub resize_min_run_s: f64,
}

impl StateConfig {
    /// The fence a node keeps ([`governor_proto::node::Welcome::fence_after_ms`]): a node that
    /// has had none of its reports acknowledged for this long stops the jobs the coordinator
    /// would start elsewhere if it lost the node. The coordinator starts such a job elsewhere
    /// only once it has heard nothing from the node for `lost_after_s + lost_target_wait_s`
    /// (the node lost, then the wait for a lost move target), counted from the last report it
    /// received. The node counts from when it sent the last report acknowledged, which is no
    /// later than when that report arrived, so its clock starts first. Half the interval leaves
    /// the other half (155 s by default) for the job to save and be stopped, with the node's
    /// `stop_grace` well inside it: the two intervals cannot overlap.
    pub fn fence_after_s(&self) -> f64 {
        0.5 * (self.lost_after_s + self.lost_target_wait_s).max(0.0)
    }
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            lost_after_s: 10.0,
            resync_grace_s: 30.0,
            start_timeout_s: 60.0,
            lost_target_wait_s: 300.0,
            report_interval_ms: 1000,
            gang_timeout_s: 600.0,
            progress_samples: 120,
            save_timeout_s: 600.0,
            auto_move: true,
            move_target: MoveTarget::default(),
            move_after_s: 10.0,
            move_cooldown_s: 300.0,
            move_confirm_s: 10.0,
            move_payoff: 2.0,
            rebalance: true,
            max_auto_moves: None,
            framework_move_cost: payoff::MoveCost::FRAMEWORK,
            criu_move_cost: payoff::MoveCost::CRIU,
            preemption: true,
            preempt_min_run_s: governor_placement::preempt::MIN_RUN_S,
            elastic: true,
            resize_min_run_s: governor_placement::elastic::MIN_RUN_S,
        }
    }
}

/// What the store keeps about a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub capacity: NodeCapacity,
    pub address: String,
    pub agent_version: String,
    pub registered_at: Seconds,
    /// It can dump and restore jobs with CRIU (jobs without a checkpoint move to and from it).
    #[serde(default)]
    pub can_dump: bool,
}

/// One member of a job: where it runs and how it is doing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub replica: u32,
    pub node: String,
    pub gpus: Vec<u32>,
    pub state: RunState,
    pub placed_at: Seconds,
    /// A report has shown this member (so its absence later means it vanished).
    #[serde(default)]
    pub seen: bool,
    /// Latest figures from its node.
    #[serde(default)]
    pub cpu_cores: f64,
    #[serde(default)]
    pub cpu_limit_cores: Option<f64>,
    #[serde(default)]
    pub memory_bytes: u64,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub message: String,
    /// Its node reported it exited after a save for a move (its checkpoint is complete).
    #[serde(default)]
    pub saved: bool,
    /// Its node could not save it for a move (it runs on): why.
    #[serde(default)]
    pub save_error: String,
    /// GPU energy its node attributes to it (joules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_joules: Option<f64>,
    /// Which start of the job runs here (0, then one more per start after a move); reports of
    /// an earlier start are ignored.
    #[serde(default)]
    pub attempt: u32,
    /// Its start waits for the checkpoint the coordinator carries to it.
    #[serde(default)]
    pub carried: bool,
    /// What its node's policy does to it now and why (the latest report's; not stored: the
    /// next report says it again).
    #[serde(skip)]
    pub decision: String,
    /// Its node stopped it at convergence, as it asked: its end is a completion.
    #[serde(default)]
    pub converged: bool,
}

/// What the store keeps about a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    /// `None` for a job a node found by itself.
    pub spec: Option<JobSpec>,
    pub name: String,
    pub status: JobState,
    /// Submission order.
    pub seq: u64,
    pub submitted_at: Seconds,
    pub started_at: Option<Seconds>,
    pub finished_at: Option<Seconds>,
    /// Why it waits, failed or is unknown.
    pub message: String,
    pub members: Vec<MemberRecord>,
    pub category: Category,
    pub categories: Vec<CategoryChange>,
    pub progress: VecDeque<ProgressSample>,
    /// Seconds between kept progress samples (0 until the history first fills up).
    #[serde(default)]
    pub progress_step_s: f64,
    pub placements: Vec<PlacementDecision>,
    /// Gangs: fail when not admitted by this time.
    pub deadline: Option<Seconds>,
    /// A node's policy asks for the job to be moved elsewhere (SpeCon's converged jobs). Acted
    /// on for jobs that declared a checkpoint ([`StateConfig::auto_move`]).
    #[serde(default)]
    pub move_request: Option<MoveAsk>,
    /// Time to quality so far as its node reports it (seconds from its start there).
    #[serde(default)]
    pub time_to_quality_s: Option<f64>,
    /// Its moves between nodes, oldest first; the last one may be under way.
    #[serde(default)]
    pub moves: Vec<JobMove>,
    /// An elastic job's current size in cores (`None`: the cores it declared, its least).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_now: Option<f64>,
    /// A trial of a cluster sweep: `(epochs, value)` as its node reported them (thinned), the
    /// record its sweep is rebuilt from after a restart (`sweeps`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweep_curve: Vec<(f64, f64)>,
    /// When SpeCon's Algorithm 2 decided on its node's request, moving it or leaving it where
    /// it was (the paper's `c.migrated = True`, lines 9, 15 and 20): its `t_cj`, from which
    /// Algorithm 3 counts its converged duration, wherever it runs since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub specon_marked_at: Option<Seconds>,
    /// Seconds its first start took before it trained, as measured from its reports (see
    /// [`nodes::measured_start`]): what a move by its framework's checkpoint loses again on the
    /// target, beside the save ([`StateConfig::framework_move_cost`]). `None` until its first
    /// start has reported an epoch; it stays `None` for a job that reports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_s: Option<f64>,
}

/// A node's request to move one of its jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoveAsk {
    pub node: String,
    pub reason: String,
    /// When the node first asked (this time).
    pub since: Seconds,
    /// SpeCon's Algorithm 2 decided once on this request and kept the job where it is (its node
    /// among the lowest scores, or the move did not pay): it is not asked again for this
    /// request, and the job is one of Algorithm 3's set D (the paper runs Algorithm 2 once, when
    /// the job converges).
    #[serde(default)]
    pub stayed: bool,
}

impl JobRecord {
    pub fn is_local(&self) -> bool {
        self.spec.is_none()
    }

    /// Its move under way, if any.
    pub fn active_move(&self) -> Option<&JobMove> {
        self.moves.last().filter(|m| !m.phase.is_over())
    }

    fn replicas(&self) -> u32 {
        self.spec.as_ref().map_or(1, |s| s.replicas)
    }

    /// The cores it holds per member: an elastic job's current size, else what it declared.
    pub fn cores(&self) -> Option<f64> {
        self.cores_now
            .or_else(|| self.spec.as_ref().and_then(|s| s.cores))
    }

    fn summary(&self) -> JobSummary {
        let spec = self.spec.as_ref();
        JobSummary {
            id: self.id.clone(),
            name: self.name.clone(),
            status: self.status,
            priority: spec.map_or(0, |s| s.priority),
            gpus: spec.map_or_else(
                || self.members.iter().map(|m| m.gpus.len() as u32).sum(),
                |s| s.gpus,
            ),
            replicas: self.replicas(),
            members: self
                .members
                .iter()
                .map(|m| JobMember {
                    replica: m.replica,
                    node: m.node.clone(),
                    gpu_indices: m.gpus.clone(),
                    state: m.state,
                })
                .collect(),
            category: self.category,
            progress: self.progress.back().map(|p| p.value),
            cpu_cores: self.members.iter().map(|m| m.cpu_cores).sum(),
            cpu_limit_cores: self
                .members
                .iter()
                .map(|m| m.cpu_limit_cores)
                .sum::<Option<f64>>(),
            memory_bytes: self.members.iter().map(|m| m.memory_bytes).sum(),
            submitted_at_unix: self.submitted_at,
            started_at_unix: self.started_at,
            finished_at_unix: self.finished_at,
            message: self.message.clone(),
            local: self.is_local(),
            move_request: self
                .move_request
                .as_ref()
                .map(|m| format!("node {} asks: {}", m.node, m.reason)),
            cores: self.cores(),
            gpu_energy_joules: self
                .members
                .iter()
                .filter_map(|m| m.gpu_energy_joules)
                .reduce(|a, b| a + b),
            decision: self
                .members
                .iter()
                .find(|m| !m.decision.is_empty() && !m.state.is_finished())
                .map(|m| m.decision.clone())
                .unwrap_or_default(),
            moving: self.active_move().map(|m| match m.phase {
                governor_proto::control::MovePhase::Saving
                    if m.to_cores.is_some() && m.from_node == m.to_node =>
                {
                    format!(
                        "saving on {} to resize from {} to {} cores{}",
                        m.from_node,
                        cores(m.from_cores),
                        cores(m.to_cores),
                        m.resized_for
                            .as_deref()
                            .map(|j| format!(" (room for {j})"))
                            .unwrap_or_default()
                    )
                }
                governor_proto::control::MovePhase::Restoring
                    if m.to_cores.is_some() && m.from_node == m.to_node =>
                {
                    format!(
                        "starting again on {} with {} cores",
                        m.to_node,
                        cores(m.to_cores)
                    )
                }
                governor_proto::control::MovePhase::Saving if m.preempted_for.is_some() => {
                    format!(
                        "saving on {} to make room for {} (preempted)",
                        m.from_node,
                        m.preempted_for.as_deref().unwrap_or_default()
                    )
                }
                governor_proto::control::MovePhase::Transferring if m.to_node.is_empty() => {
                    format!(
                        "carrying its checkpoint from {} to the coordinator (preempted)",
                        m.from_node
                    )
                }
                governor_proto::control::MovePhase::Requeued => format!(
                    "preempted on {} for {}; queued to resume",
                    m.from_node,
                    m.preempted_for.as_deref().unwrap_or_default()
                ),
                governor_proto::control::MovePhase::Saving => {
                    format!("saving on {} for {}", m.from_node, m.to_node)
                }
                governor_proto::control::MovePhase::Restoring => {
                    format!("restoring on {} (from {})", m.to_node, m.from_node)
                }
                governor_proto::control::MovePhase::Transferring => {
                    format!(
                        "carrying its checkpoint from {} for {}",
                        m.from_node, m.to_node
                    )
                }
                _ => format!("rolling back to {} ({})", m.from_node, m.message),
            }),
            // From submission: the wait in the queue counts (a local job: from its start).
            time_to_quality_s: self.time_to_quality_s.map(|t| {
                t + self
                    .started_at
                    .filter(|_| !self.is_local())
                    .map_or(0.0, |s| (s - self.submitted_at).max(0.0))
            }),
        }
    }
}

/// Persisted settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub policy: String,
    pub next_seq: u64,
}

/// Records changed since the last [`ClusterState::take_dirty`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dirty {
    pub nodes: BTreeSet<String>,
    pub jobs: BTreeSet<String>,
    /// Jobs to delete from the store (local jobs that ended).
    pub removed_jobs: BTreeSet<String>,
    pub meta: bool,
}

impl Dirty {
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.jobs.is_empty() && self.removed_jobs.is_empty() && !self.meta
    }
}

/// A node as the state machine tracks it.
#[derive(Clone, Debug)]
struct Node {
    record: NodeRecord,
    status: NodeState,
    /// The live session, if connected.
    session: Option<u64>,
    last_seen: Seconds,
    report: NodeReport,
    /// A report arrived in the current session (until then its jobs are not confirmed).
    synced: bool,
}

/// Why a node's registration or report is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("node {node} has a newer session; this stream is stale (reconnect)")]
    Stale { node: String },
    #[error("node {node} is not registered: send a hello first")]
    NotRegistered { node: String },
}

/// Why a control request is refused; the server maps each to a gRPC status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("no job {id}: `govctl jobs --all` lists the known jobs")]
    NoSuchJob { id: String },
    #[error("job {id} already {status}; nothing to cancel")]
    AlreadyFinished { id: String, status: JobState },
    #[error("job {id} is a local job of node {node}; stop it on that node")]
    LocalJob { id: String, node: String },
    #[error("job {id} has no output to show: {why}")]
    NoOutput { id: String, why: String },
    #[error(transparent)]
    UnknownPolicy(#[from] UnknownPolicy),
    #[error(transparent)]
    Move(#[from] MoveError),
}

/// The coordinator's state.
#[derive(Debug)]
pub struct ClusterState {
    config: StateConfig,
    nodes: BTreeMap<String, Node>,
    /// Placement view, nodes in name order (the same order as `nodes`).
    view: ClusterView,
    view_index: HashMap<String, usize>,
    jobs: BTreeMap<String, JobRecord>,
    /// Ids of the jobs submitted to the coordinator (finished ones included), the only ones it
    /// can move, resize or preempt. At 10,000 nodes the nodes' own local jobs outnumber them
    /// many times over, and the rounds that scanned every record (elastic and preemption
    /// candidates, moves) made up most of the admission round's time
    /// (`cargo bench -p coordinator --bench cluster_load`, profiled: docs/performance.md).
    submitted: BTreeSet<String>,
    /// The submitted jobs that declared a range of cores (`--cores MIN:MAX`), which the elastic
    /// rounds after every admission look at.
    elastic: BTreeSet<String>,
    /// Node -> ids of the jobs with a member there (may hold finished or moved jobs; see
    /// [`ClusterState::jobs_on`]). Keeps per-report work proportional to the node's jobs.
    on_node: HashMap<String, BTreeSet<String>>,
    queue: Queue,
    policy: Box<dyn PlacementPolicy>,
    next_seq: u64,
    next_session: u64,
    outbox: Vec<(String, NodeCommand)>,
    dirty: Dirty,
    /// (job, replica) -> session in which a stop was last sent (so a stop is not resent every
    /// report).
    stops_sent: HashMap<(String, u32), u64>,
    reports: u64,
    placements: u64,
    /// Capacity may have freed since the last admission round.
    needs_dispatch: bool,
    /// Jobs whose carried checkpoint is no longer needed (their move is over).
    spent_checkpoints: Vec<String>,
    /// Coordinator jobs that completed since the last elastic round (Schedulearn's elastic
    /// FIFO grows a job on each).
    completions: u32,
    /// DRAGON's `lastActionTime`: the latest admission, resize or starving job (its scale-up
    /// waits 60 s after it). Not stored: a restarted coordinator starts counting afresh, as
    /// DRAGON's controller does.
    last_elastic_action: Option<Seconds>,
    /// Moves that ended since the coordinator started, by (kind, result) (`/metrics`).
    move_outcomes: BTreeMap<(&'static str, &'static str), u64>,
    /// The sweeps of submitted trials (`govctl submit --sweep`), judged across the cluster.
    sweeps: governor_policy::sweep::Sweeps<String>,
}

impl ClusterState {
    /// A fresh coordinator.
    pub fn new(config: StateConfig, policy: &str) -> Result<Self, UnknownPolicy> {
        Ok(ClusterState {
            config,
            nodes: BTreeMap::new(),
            view: ClusterView::default(),
            view_index: HashMap::new(),
            jobs: BTreeMap::new(),
            submitted: BTreeSet::new(),
            elastic: BTreeSet::new(),
            on_node: HashMap::new(),
            queue: Queue::new(),
            policy: placement::by_name(policy)?,
            next_seq: 1,
            next_session: 1,
            outbox: Vec::new(),
            dirty: Dirty::default(),
            stops_sent: HashMap::new(),
            reports: 0,
            placements: 0,
            needs_dispatch: false,
            spent_checkpoints: Vec::new(),
            completions: 0,
            last_elastic_action: None,
            move_outcomes: BTreeMap::new(),
            sweeps: sweeps::cluster_sweeps(),
        })
    }

    /// A coordinator restarted at `now` from its store. Known nodes are `resyncing` until they
    /// reconnect (or lost after `lost_after_s + resync_grace_s`); their unfinished jobs are `unknown` until then;
    /// queued jobs keep their place.
    pub fn restore(
        config: StateConfig,
        now: Seconds,
        meta: Option<Meta>,
        nodes: Vec<NodeRecord>,
        jobs: Vec<JobRecord>,
    ) -> Result<Self, UnknownPolicy> {
        let meta = meta.unwrap_or(Meta {
            policy: placement::DEFAULT_POLICY.into(),
            next_seq: 1,
        });
        let mut s = ClusterState::new(config, &meta.policy)?;
        s.next_seq = meta.next_seq;
        for record in nodes {
            s.nodes.insert(
                record.name.clone(),
                Node {
                    record,
                    status: NodeState::Resyncing,
                    session: None,
                    last_seen: now,
                    report: NodeReport::default(),
                    synced: false,
                },
            );
        }
        let mut restored = Vec::new();
        for mut job in jobs {
            s.next_seq = s.next_seq.max(job.seq + 1);
            if job.is_local() {
                continue; // the node reports it again when it reconnects
            }
            match job.status {
                JobState::Queued => s.queue.push(queued(&job)),
                st if st.is_finished() => {}
                _ => {
                    job.status = JobState::Unknown;
                    job.message =
                        "the coordinator restarted; waiting for its node(s) to re-sync".into();
                }
            }
            let id = job.id.clone();
            s.index_submitted(&job);
            s.jobs.insert(id.clone(), job);
            s.index_job(&id);
            restored.push(id);
        }
        // In submission order, as they joined their sweeps.
        restored.sort_by_key(|id| s.jobs[id].seq);
        for id in &restored {
            s.rejoin_sweep(id);
        }
        s.rebuild_view();
        Ok(s)
    }

    pub fn config(&self) -> &StateConfig {
        &self.config
    }

    /// The placement view (for tests, the simulator and the benchmark).
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// Commands to send to nodes, in order.
    pub fn take_outbox(&mut self) -> Vec<(String, NodeCommand)> {
        std::mem::take(&mut self.outbox)
    }

    /// Records to persist.
    pub fn take_dirty(&mut self) -> Dirty {
        std::mem::take(&mut self.dirty)
    }

    /// Put back records whose save failed, to be saved with the next batch.
    pub fn mark_dirty(&mut self, dirty: Dirty) {
        self.dirty.nodes.extend(dirty.nodes);
        self.dirty.jobs.extend(dirty.jobs);
        self.dirty.removed_jobs.extend(dirty.removed_jobs);
        self.dirty.meta |= dirty.meta;
    }

    pub fn node_record(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.get(name).map(|n| &n.record)
    }

    pub fn job_record(&self, id: &str) -> Option<&JobRecord> {
        self.jobs.get(id)
    }

    pub fn meta(&self) -> Meta {
        Meta {
            policy: self.policy.name().to_owned(),
            next_seq: self.next_seq,
        }
    }

    /// The session a node is connected with.
    pub fn session_of(&self, node: &str) -> Option<u64> {
        self.nodes.get(node).and_then(|n| n.session)
    }

    // ---- node events ----------------------------------------------------------------------

    // ---- control --------------------------------------------------------------------------

    // ---- queries --------------------------------------------------------------------------

    // ---- the node -> jobs index ------------------------------------------------------------

    // ---- the placement view ---------------------------------------------------------------
}

/// Cores as govctl shows them: "4", "1.5" ("?" for none).
pub fn cores(c: Option<f64>) -> String {
    match c {
        Some(c) if c.fract() == 0.0 => format!("{c:.0}"),
        Some(c) => format!("{c}"),
        None => "?".into(),
    }
}

#[cfg(test)]
mod tests;
