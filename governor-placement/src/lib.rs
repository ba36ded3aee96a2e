//! Placement policies: where an incoming job (or one member of a gang) should run.
//!
//! A policy is pure and deterministic: it reads a [`ClusterView`] (a snapshot the caller builds
//! from node reports and its own pending placements), never a clock, a socket or a file, and the
//! same view and request give the same answer. The coordinator calls it from its dispatcher, the
//! simulator (`govsim`) from its simulated clock, unit tests from hand-built views.
//!
//! Every policy first keeps only the nodes that can take the job ([`feasible_nodes`]: the node
//! is connected, has the job's whole GPUs free on the one node, and the cores and memory the job
//! asked for), then ranks those by its own rule. When no node can take the job the policy says
//! why ([`NoFit`]) and the job waits in the queue.
//!
//! | name | source | rule |
//! | --- | --- | --- |
//! | `flowcon` | FlowCon, Algorithm 4 | all-converged nodes first (fewest jobs), else min (|NL|+1)·D_NL + |WL|·D_WL + |CL|·D_CL |
//! | `procon` | ProCon, Algorithms 1-2 | min over nodes of the max remaining-time indicator of their jobs; ties: fewest jobs |
//! | `specon` | SpeCon, Algorithm 2 scoring | min 2·|PC| + 1.5·|WC| + 1·|CC|; ties: least resource use |
//! | `round-robin` | Schedulearn RR | the next node after the previous choice that fits |
//! | `first-fit` | Schedulearn FIFO | the first node (by name) that fits |
//! | `soonest` | ours | the node where the job is predicted the largest CPU share, packing GPUs |

#![forbid(unsafe_code)]

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use governor_policy::Category;

pub mod baseline;
pub mod dragon;
pub mod elastic;
pub mod first_fit;
pub mod flowcon;
pub mod kubeflow;
pub mod payoff;
pub mod preempt;
pub mod procon;
pub mod queue;
pub mod round_robin;
pub mod soonest;
pub mod specon;

/// What the coordinator knows about the cluster when it places a job. Nodes are in a fixed order
/// (by name); ties between equally good nodes go to the first in that order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    pub nodes: Vec<NodeView>,
}

/// One node.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub name: String,
    /// Connected and reporting. Lost and resyncing nodes are never chosen.
    pub schedulable: bool,
    pub cores: f64,
    pub memory_bytes: u64,
    pub gpus: Vec<GpuView>,
    /// CPU in use on the node, in cores (all processes).
    pub cpu_used_cores: f64,
    pub memory_used_bytes: u64,
    /// The jobs on the node: reported ones and the coordinator's pending placements. Private so
    /// that every change goes through [`NodeView::jobs_mut`] or [`NodeView::set_jobs`], which
    /// give the node a new [`NodeView::revision`].
    jobs: Vec<JobView>,
    revision: u64,
}

/// Views are equal when their contents are (revisions only say when a view last changed).
impl PartialEq for NodeView {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.schedulable == other.schedulable
            && self.cores == other.cores
            && self.memory_bytes == other.memory_bytes
            && self.gpus == other.gpus
            && self.cpu_used_cores == other.cpu_used_cores
            && self.memory_used_bytes == other.memory_used_bytes
            && self.jobs == other.jobs
    }
}

/// A revision number no node view has had before (process-wide, so a view moved to another
/// index or replaced by a new one never matches a cached revision).
fn next_revision() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One GPU of a node.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuView {
    pub index: u32,
    pub model: String,
    pub memory_bytes: u64,
    /// Reserved for a job by the coordinator or reported in use by one.
    pub assigned: bool,
    /// Device memory in use (from the node's report), whoever uses it.
    pub memory_used_bytes: u64,
}

impl GpuView {
    /// Free for a new job: not assigned, and (Schedulearn's rule) less than 90% of its memory
    /// used by anything else.
    pub fn is_free(&self) -> bool {
        !self.assigned
            && (self.memory_bytes == 0
                || (self.memory_used_bytes as f64) < 0.9 * self.memory_bytes as f64)
    }
}

/// One job (or one member of a gang) on a node.
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    pub id: String,
    pub category: Category,
    /// Placed by the coordinator and not in a node report yet.
    pub pending: bool,
    /// Per-second progress P(t) (FlowCon Eq. 1).
    pub growth: Option<f64>,
    /// Growth efficiency G(t) = P(t) / cores (FlowCon Eq. 2).
    pub growth_efficiency: Option<f64>,
    /// CPU in use, in cores.
    pub cpu_cores: f64,
    pub memory_bytes: u64,
    /// What the job asked for at submission, if it said.
    pub requested_cores: Option<f64>,
    pub requested_memory_bytes: Option<u64>,
    /// Epoch progress (ProCon's n, MAX and f), when the node knows it.
    pub epoch: Option<u64>,
    pub max_epochs: Option<u64>,
    pub epoch_seconds: Option<f64>,
}

impl JobView {
    /// A job the coordinator has just placed: nothing measured, category unknown.
    pub fn pending(id: impl Into<String>, request: &JobRequest) -> JobView {
        JobView {
            id: id.into(),
            category: Category::Unknown,
            pending: true,
            growth: None,
            growth_efficiency: None,
            cpu_cores: 0.0,
            memory_bytes: 0,
            requested_cores: request.cores,
            requested_memory_bytes: request.memory_bytes,
            epoch: None,
            max_epochs: None,
            epoch_seconds: None,
        }
    }

    /// A reported job in `category` using `cpu_cores` (handy for tests and the simulator).
    pub fn running(id: impl Into<String>, category: Category, cpu_cores: f64) -> JobView {
        JobView {
            id: id.into(),
            category,
            pending: false,
            growth: None,
            growth_efficiency: None,
            cpu_cores,
            memory_bytes: 0,
            requested_cores: None,
            requested_memory_bytes: None,
            epoch: None,
            max_epochs: None,
            epoch_seconds: None,
        }
    }
}

impl NodeView {
    /// A connected CPU-only node with no jobs.
    pub fn new(name: impl Into<String>, cores: f64, memory_bytes: u64) -> NodeView {
        NodeView {
            name: name.into(),
            schedulable: true,
            cores,
            memory_bytes,
            gpus: Vec::new(),
            cpu_used_cores: 0.0,
            memory_used_bytes: 0,
            jobs: Vec::new(),
            revision: next_revision(),
        }
    }

    /// The jobs on the node: reported ones and the coordinator's pending placements.
    pub fn jobs(&self) -> &[JobView] {
        &self.jobs
    }

    /// Change the node's jobs (the node gets a new revision).
    pub fn jobs_mut(&mut self) -> &mut Vec<JobView> {
        self.revision = next_revision();
        &mut self.jobs
    }

    /// Replace the node's jobs (the node gets a new revision).
    pub fn set_jobs(&mut self, jobs: Vec<JobView>) {
        self.revision = next_revision();
        self.jobs = jobs;
    }

    /// Changes whenever the node's jobs may have changed, and differs between any two views
    /// built separately: policies cache per-node sums over the jobs under it, so a placement
    /// on a 10,000-node cluster reads only the nodes that reported since the last one (reading
    /// every node's jobs each time cost ~1 ms in cache misses in the load benchmark).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Add `count` unassigned GPUs of `model` (indices continue from the existing ones).
    pub fn with_gpus(mut self, count: u32, model: &str, memory_bytes: u64) -> NodeView {
        let first = self.gpus.len() as u32;
        for i in first..first + count {
            self.gpus.push(GpuView {
                index: i,
                model: model.to_owned(),
                memory_bytes,
                assigned: false,
                memory_used_bytes: 0,
            });
        }
        self
    }

    /// Add a job (tests and the simulator).
    pub fn with_job(mut self, job: JobView) -> NodeView {
        self.jobs_mut().push(job);
        self
    }

    /// Indices of the free GPUs, lowest first.
    pub fn free_gpus(&self) -> Vec<u32> {
        self.gpus
            .iter()
            .filter(|g| g.is_free())
            .map(|g| g.index)
            .collect()
    }

    /// Number of free GPUs.
    pub fn free_gpu_count(&self) -> usize {
        self.gpus.iter().filter(|g| g.is_free()).count()
    }

    /// Cores not promised to jobs that asked for cores.
    pub fn unreserved_cores(&self) -> f64 {
        self.cores
            - self
                .jobs
                .iter()
                .map(|j| j.requested_cores.unwrap_or(0.0))
                .sum::<f64>()
    }

    /// Memory neither promised to jobs nor in use by them.
    pub fn unreserved_memory(&self) -> u64 {
        let held: u64 = self
            .jobs
            .iter()
            .map(|j| j.requested_memory_bytes.unwrap_or(0).max(j.memory_bytes))
            .sum();
        self.memory_bytes.saturating_sub(held)
    }

    /// Number of jobs in each category ([`Category::ALL`] order), pending jobs as `Unknown`.
    pub fn category_counts(&self) -> [usize; 4] {
        let mut counts = [0; 4];
        for j in &self.jobs {
            counts[j.category.index()] += 1;
        }
        counts
    }
}

/// A job, or one member of a gang, to place. Every member of a gang asks for the same.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRequest {
    /// The job id (for a gang member: `JOB#REPLICA`).
    pub id: String,
    /// Whole GPUs on one node.
    pub gpus: u32,
    pub cores: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub priority: i32,
    /// Nodes that already host another member of the same gang: members go to distinct nodes.
    pub avoid: Vec<String>,
}

impl JobRequest {
    /// A request for a job that only says how many GPUs it needs.
    pub fn new(id: impl Into<String>, gpus: u32) -> JobRequest {
        JobRequest {
            id: id.into(),
            gpus,
            cores: None,
            memory_bytes: None,
            priority: 0,
            avoid: Vec::new(),
        }
    }
}

/// A node a policy scored, for `govctl job` ("placement decisions and why").
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub node: String,
    /// The policy's score, in the policy's own units (see its documentation).
    pub score: f64,
    pub note: String,
}

/// A policy's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Index of the chosen node in [`ClusterView::nodes`].
    pub node: usize,
    /// The GPUs reserved for the job on that node (lowest free indices).
    pub gpus: Vec<u32>,
    /// One sentence: why this node.
    pub reason: String,
    /// The best few candidates with their scores, the chosen one first.
    pub candidates: Vec<Candidate>,
}

/// No node can take the job now; `reason` says what is missing (for the queue and `govctl`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct NoFit {
    pub reason: String,
}

/// A placement policy. Implementations are deterministic: the same calls in the same order give
/// the same answers. `place` may keep state between calls (round-robin's cursor); it must not
/// change the view: the caller reserves the chosen GPUs.
pub trait PlacementPolicy: Send + fmt::Debug {
    /// The name it is selected by (`govctl policy set NAME`).
    fn name(&self) -> &'static str;
    /// Choose a node for `job`.
    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit>;
    /// How the queue orders jobs of equal priority under this policy.
    fn queue_order(&self) -> queue::QueueOrder {
        queue::QueueOrder::Fifo
    }
    /// Try one node for all the members of a gang before placing them on distinct nodes.
    fn gangs_on_one_node(&self) -> bool {
        false
    }
    /// How it grows and shrinks elastic jobs ([`elastic`]): ours by default.
    fn elasticity(&self) -> elastic::Elasticity {
        elastic::Elasticity::OURS
    }
    /// At most this many jobs admitted per admission round (`None`: every job that fits).
    fn admits_per_round(&self) -> Option<usize> {
        None
    }
}

/// How many candidates a placement keeps for explanation.
pub const CANDIDATES_KEPT: usize = 5;

/// Policy names in documentation order, with one line each.
pub const POLICIES: &[(&str, &str)] = &[
    (
        "soonest",
        "ours: the node where the job gets the largest predicted CPU share (each job there counted at the share its node policy leaves it), GPUs packed best-fit",
    ),
    (
        "flowcon",
        "FlowCon Alg. 4: all-converged nodes first, else the lowest growth-efficiency score",
    ),
    (
        "procon",
        "ProCon: the node whose longest remaining job (contention indicator) is shortest",
    ),
    (
        "specon",
        "SpeCon Alg. 2 scoring: min 2|PC|+1.5|WC|+1|CC|, ties to the least loaded node",
    ),
    (
        "round-robin",
        "Schedulearn round-robin: the next node after the previous choice that fits",
    ),
    (
        "first-fit",
        "Schedulearn FIFO: the first node by name that fits; elastic jobs keep their least size",
    ),
    (
        "elastic-fifo",
        "Schedulearn elastic FIFO: first fit; on each completion the longest-running elastic job, if it has run longer than the completed jobs took, grows on its node or on another",
    ),
    (
        "kubeflow",
        "Kubeflow (DRAGON/OASIS) scheduler: queue by priority then larger CPU+memory demand, one job per round, a gang on one node if one holds it, else first fit",
    ),
    (
        "dragon",
        "DRAGON (the Kubeflow scheduler's predecessor): FIFO queue without priorities, first fit, one job per round; a job waiting 30 s scales the others down or blocks the queue; scale-up after 60 s without action",
    ),
    (
        "spread",
        "baseline (Docker Swarm spread, Kubernetes' default in the papers): the node running the fewest jobs",
    ),
    (
        "usage",
        "baseline (the papers' default scheduler by instant usage): the lowest CPU use in the latest reports",
    ),
];

/// The policy the coordinator starts with.
pub const DEFAULT_POLICY: &str = "soonest";

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement policy {name:?}; known policies: {known}")]
pub struct UnknownPolicy {
    pub name: String,
    pub known: String,
}

/// Build a policy by name with its default parameters.
pub fn by_name(name: &str) -> Result<Box<dyn PlacementPolicy>, UnknownPolicy> {
    if let Some(params) = name.strip_prefix("soonest:") {
        return soonest::Soonest::with_params(params)
            .map(|p| Box::new(p) as Box<dyn PlacementPolicy>)
            .map_err(|why| UnknownPolicy {
                name: format!("{name} ({why})"),
                known: "soonest:contention=C,converged=CLAIM,horizon=SECONDS".into(),
            });
    }
    Ok(match name {
        "soonest" => Box::new(soonest::Soonest::default()),
        "flowcon" => Box::new(flowcon::FlowCon),
        "procon" => Box::new(procon::ProCon::default()),
        "specon" => Box::new(specon::SpeCon::default()),
        "round-robin" => Box::new(round_robin::RoundRobin::default()),
        "first-fit" => Box::new(first_fit::FirstFit),
        "elastic-fifo" => Box::new(first_fit::ElasticFifo),
        "kubeflow" => Box::new(kubeflow::Kubeflow),
        "dragon" => Box::new(dragon::Dragon),
        "spread" => Box::new(baseline::Spread),
        "usage" => Box::new(baseline::Usage),
        _ => {
            return Err(UnknownPolicy {
                name: name.to_owned(),
                known: POLICIES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    })
}

/// Indices of the nodes that can take `job` now, in view order; when there are none, why not.
///
/// A node can take a job when it is schedulable, does not already host a member of the job's
/// gang, has `job.gpus` free GPUs, and has the cores and memory the job asked for left
/// unreserved. (ProCon's filtering phase; FlowCon's and Docker Swarm's constraint filter;
/// Schedulearn's "enough available GPUs on one server".)
pub fn feasible_nodes(cluster: &ClusterView, job: &JobRequest) -> Result<Vec<usize>, NoFit> {
    let mut fit = Vec::new();
    let (mut down, mut avoided, mut short_gpus, mut short_cores, mut short_memory) =
        (0, 0, 0, 0, 0);
    let mut most_free_gpus: Option<(usize, &str)> = None;
    for (i, n) in cluster.nodes.iter().enumerate() {
        if !n.schedulable {
            down += 1;
            continue;
        }
        if job.avoid.iter().any(|a| a == &n.name) {
            avoided += 1;
            continue;
        }
        // (A CPU-only job skips the count: it is one more walk over every node's GPUs.)
        let free = if job.gpus == 0 { 0 } else { n.free_gpu_count() };
        if free < job.gpus as usize {
            short_gpus += 1;
            if most_free_gpus.is_none_or(|(f, _)| free > f) {
                most_free_gpus = Some((free, &n.name));
            }
            continue;
        }
        if let Some(c) = job.cores
            && n.unreserved_cores() + 1e-9 < c
        {
            short_cores += 1;
            continue;
        }
        if let Some(m) = job.memory_bytes
            && n.unreserved_memory() < m
        {
            short_memory += 1;
            continue;
        }
        fit.push(i);
    }
    if !fit.is_empty() {
        return Ok(fit);
    }
    if cluster.nodes.is_empty() {
        return Err(NoFit {
            reason: "no node has registered with the coordinator".into(),
        });
    }
    let mut why = Vec::new();
    if down > 0 {
        why.push(format!("{down} not connected"));
    }
    if avoided > 0 {
        why.push(format!(
            "{avoided} avoided (another member of this job runs there, or it is being cleared for a job of higher priority)"
        ));
    }
    if short_gpus > 0 {
        let most = most_free_gpus
            .map(|(f, n)| format!(" (most free: {n} with {f})"))
            .unwrap_or_default();
        why.push(format!(
            "{short_gpus} have fewer than {} free GPUs{most}",
            job.gpus
        ));
    }
    if short_cores > 0 {
        why.push(format!(
            "{short_cores} have fewer than {} unreserved cores",
            job.cores.unwrap_or(0.0)
        ));
    }
    if short_memory > 0 {
        why.push(format!(
            "{short_memory} have less than {} MiB unreserved memory",
            job.memory_bytes.unwrap_or(0) >> 20
        ));
    }
    Err(NoFit {
        reason: format!(
            "no node can take it now: of {} nodes, {}",
            cluster.nodes.len(),
            why.join(", ")
        ),
    })
}

/// The best [`CANDIDATES_KEPT`] of `items` under `cmp` (best first), ties going to the first
/// node in view order. Selects before sorting, so ranking 10,000 nodes costs O(n).
pub(crate) fn best_k<T>(
    mut items: Vec<T>,
    node: impl Fn(&T) -> usize,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Vec<T> {
    let full = |a: &T, b: &T| cmp(a, b).then(node(a).cmp(&node(b)));
    let k = CANDIDATES_KEPT.min(items.len());
    if items.len() > k && k > 0 {
        items.select_nth_unstable_by(k - 1, full);
        items.truncate(k);
    }
    items.sort_by(full);
    items
}

/// Choose the feasible node with the smallest `score`; ties go to the first node in view order.
/// `note` explains a candidate's score (only called for the kept candidates).
pub(crate) fn choose_min(
    cluster: &ClusterView,
    job: &JobRequest,
    feasible: &[usize],
    score: impl Fn(&NodeView) -> f64,
    note: impl Fn(&NodeView) -> String,
    reason: impl FnOnce(&NodeView, f64) -> String,
) -> Placement {
    let scored: Vec<(usize, f64)> = feasible
        .iter()
        .map(|&i| (i, score(&cluster.nodes[i])))
        .collect();
    let ranked = best_k(scored, |s| s.0, |a, b| a.1.total_cmp(&b.1));
    finish(cluster, job, &ranked, note, reason)
}

/// Build the [`Placement`] for the first of `ranked` (node index, score; best first).
pub fn finish(
    cluster: &ClusterView,
    job: &JobRequest,
    ranked: &[(usize, f64)],
    note: impl Fn(&NodeView) -> String,
    reason: impl FnOnce(&NodeView, f64) -> String,
) -> Placement {
    let (best, best_score) = ranked[0];
    let node = &cluster.nodes[best];
    Placement {
        node: best,
        gpus: node
            .free_gpus()
            .into_iter()
            .take(job.gpus as usize)
            .collect(),
        reason: reason(node, best_score),
        candidates: ranked
            .iter()
            .take(CANDIDATES_KEPT)
            .map(|&(i, score)| Candidate {
                node: cluster.nodes[i].name.clone(),
                score,
                note: note(&cluster.nodes[i]),
            })
            .collect(),
    }
}

impl ClusterView {
    /// Index of the node called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Record a placement: add the pending job to the node and mark its GPUs assigned. The
    /// queue does this between the members of a gang, and undoes it with [`Self::unreserve`]
    /// when a later member does not fit.
    pub fn reserve(&mut self, node: usize, job: JobView, gpus: &[u32]) {
        let n = &mut self.nodes[node];
        for g in n.gpus.iter_mut().filter(|g| gpus.contains(&g.index)) {
            g.assigned = true;
        }
        n.jobs_mut().push(job);
    }

    /// Undo [`Self::reserve`].
    pub fn unreserve(&mut self, node: usize, job_id: &str, gpus: &[u32]) {
        let n = &mut self.nodes[node];
        for g in n.gpus.iter_mut().filter(|g| gpus.contains(&g.index)) {
            g.assigned = false;
        }
        if let Some(pos) = n.jobs.iter().rposition(|j| j.id == job_id) {
            n.jobs_mut().remove(pos);
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Builders for hand-made cluster states.
    use super::*;

    pub(crate) const GIB: u64 = 1 << 30;

    pub(crate) fn job(id: &str, category: Category) -> JobView {
        JobView::running(id, category, 1.0)
    }

    pub(crate) fn job_g(id: &str, category: Category, growth_efficiency: f64) -> JobView {
        JobView {
            growth_efficiency: Some(growth_efficiency),
            ..JobView::running(id, category, 1.0)
        }
    }

    pub(crate) fn node(name: &str, jobs: Vec<JobView>) -> NodeView {
        let mut n = NodeView::new(name, 8.0, 32 * GIB);
        n.set_jobs(jobs);
        n
    }

    pub(crate) fn cluster(nodes: Vec<NodeView>) -> ClusterView {
        ClusterView { nodes }
    }

    pub(crate) fn chosen(cluster: &ClusterView, p: &Placement) -> String {
        cluster.nodes[p.node].name.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn every_documented_policy_builds_and_reports_its_name() {
        for (name, _) in POLICIES {
            assert_eq!(by_name(name).unwrap().name(), *name);
        }
        let e = by_name("fastest").unwrap_err().to_string();
        assert!(e.contains("known policies: soonest, flowcon"), "{e}");
    }

    #[test]
    fn gpu_jobs_go_only_where_that_many_whole_gpus_are_free() {
        let mut busy = NodeView::new("a", 8.0, 0).with_gpus(4, "H100", 80 * GIB);
        for g in &mut busy.gpus[..3] {
            g.assigned = true;
        }
        let c = cluster(vec![
            busy,
            NodeView::new("b", 8.0, 0).with_gpus(2, "H100", 80 * GIB),
        ]);
        for (name, _) in POLICIES {
            let mut p = by_name(name).unwrap();
            let e = p.place(&c, &JobRequest::new("j", 3)).unwrap_err();
            assert_eq!(
                e.reason,
                "no node can take it now: of 2 nodes, 2 have fewer than 3 free GPUs (most free: b with 2)",
                "{name}"
            );
            let placed = p.place(&c, &JobRequest::new("j", 2)).unwrap();
            assert_eq!(chosen(&c, &placed), "b", "{name}");
            assert_eq!(placed.gpus, vec![0, 1], "{name}");
        }
    }

    #[test]
    fn a_gpu_nine_tenths_full_of_someone_elses_memory_is_not_free() {
        let mut n = NodeView::new("a", 8.0, 0).with_gpus(2, "A100", 40 * GIB);
        n.gpus[0].memory_used_bytes = 38 * GIB;
        assert_eq!(n.free_gpus(), vec![1]);
    }

    #[test]
    fn lost_nodes_and_gang_siblings_are_never_chosen() {
        let mut lost = node("a", vec![]);
        lost.schedulable = false;
        let c = cluster(vec![lost, node("b", vec![]), node("c", vec![])]);
        let mut req = JobRequest::new("j#1", 0);
        req.avoid = vec!["b".into()];
        for (name, _) in POLICIES {
            let p = by_name(name).unwrap().place(&c, &req).unwrap();
            assert_eq!(chosen(&c, &p), "c", "{name}");
        }
        req.avoid.push("c".into());
        let e = feasible_nodes(&c, &req).unwrap_err();
        assert_eq!(
            e.reason,
            "no node can take it now: of 3 nodes, 1 not connected, 2 avoided (another member of this job runs there, or it is being cleared for a job of higher priority)"
        );
    }

    #[test]
    fn requested_cores_and_memory_are_reserved() {
        let mut full = node("a", vec![]);
        full.jobs.push(JobView {
            requested_cores: Some(6.0),
            requested_memory_bytes: Some(30 * GIB),
            ..JobView::running("x", Category::Progressing, 6.0)
        });
        let c = cluster(vec![full, node("b", vec![])]);
        let mut req = JobRequest::new("j", 0);
        req.cores = Some(4.0);
        assert_eq!(feasible_nodes(&c, &req).unwrap(), vec![1]);
        req.cores = None;
        req.memory_bytes = Some(4 * GIB);
        assert_eq!(feasible_nodes(&c, &req).unwrap(), vec![1]);
        req.memory_bytes = Some(64 * GIB);
        assert!(
            feasible_nodes(&c, &req)
                .unwrap_err()
                .reason
                .contains("65536 MiB")
        );
    }

    #[test]
    fn reserve_and_unreserve_are_inverse() {
        let mut c = cluster(vec![NodeView::new("a", 4.0, 0).with_gpus(2, "T4", GIB)]);
        let before = c.clone();
        let req = JobRequest::new("j", 1);
        c.reserve(0, JobView::pending("j", &req), &[1]);
        assert_eq!(c.nodes[0].free_gpus(), vec![0]);
        assert_eq!(c.nodes[0].jobs.len(), 1);
        c.unreserve(0, "j", &[1]);
        assert_eq!(c, before);
    }
}
