//! The admission queue: priorities, FIFO within a priority, gangs admitted all-or-nothing.
//!
//! Pure and deterministic like the placement policies: time is the caller's (`now`, seconds on
//! any clock that does not go backwards), so the coordinator and the simulator share it.
//!
//! - **Order.** Higher priority first; equal priorities in submission order (FIFO), except
//!   that a job preempted to make room for a higher-priority one goes back at the head of its
//!   priority (`head`), before the jobs that never ran.
//! - **Adapted first-come-first-served.** Each admission round walks the queue in that order and
//!   admits every job that fits now; a job that does not fit waits without blocking the jobs
//!   behind it (the Kubeflow/DRAGON scheduler's "schedule the first feasible job"). A big job can
//!   therefore be overtaken by small ones while it waits; raising its priority does not stop
//!   that, but its gang timeout bounds how long it waits before it fails with the reason.
//! - **Gangs.** A job with several members (one per node) or several GPUs is admitted only if
//!   *every* member can be placed in the same round: members are placed one by one on the view
//!   (so later members see earlier ones, and go to distinct nodes), and when one does not fit
//!   the earlier reservations are undone and the whole job waits. (Gang scheduling as in the
//!   Kubeflow scheduler: all or nothing.) Several GPUs of one member are always on one node.
//! - **Timeout.** A gang not admitted within its timeout leaves the queue as expired, with the
//!   reason it could not be placed; a single job without a timeout waits until capacity frees.
//! - **Kubeflow order** (a policy's [`PlacementPolicy::queue_order`]): the DRAGON/OASIS-style
//!   Kubeflow scheduler's weighting, higher priority ("utility") first and, within a priority,
//!   the larger resource demand first (its CPU + memory requirement: here cores + GiB), then
//!   submission order. A queue re-sorts when the policy's order changes.
//! - **Arrival order** (DRAGON's): submission order only, priorities ignored; a preempted job
//!   still goes first.
//! - **One-node gangs** (a policy's [`PlacementPolicy::gangs_on_one_node`]): the Kubeflow
//!   scheduler's gang scheduling first looks for one node that holds every member (less
//!   communication), and only then places them "in a regular manner": each member where the
//!   policy puts a single job, several on one node if it comes to that (the write-up's
//!   Kubernetes pods are placed independently), so a 4-member gang fits on 3 nodes.
//! - **Cheap rounds.** Within a round, a job that asks for at least as much as a job that did not
//!   fit (same or more GPUs, cores, memory and members) is not tried again.

use crate::{ClusterView, JobRequest, JobView, Placement, PlacementPolicy};

/// Seconds on the caller's clock.
pub type Seconds = f64;

/// A job waiting for admission.
#[derive(Clone, Debug, PartialEq)]
pub struct QueuedJob {
    pub id: String,
    pub priority: i32,
    /// Submission order (unique, increasing): FIFO within a priority.
    pub seq: u64,
    pub enqueued_at: Seconds,
    /// Members, each on its own node (>= 1).
    pub replicas: u32,
    /// What every member needs.
    pub gpus: u32,
    pub cores: Option<f64>,
    pub memory_bytes: Option<u64>,
    /// Gangs only: give up when not admitted by this time.
    pub deadline: Option<Seconds>,
    /// Why it waited in the last round (empty until then).
    pub waiting_reason: String,
    /// Preempted and waiting to resume: at the head of its priority.
    pub head: bool,
}

impl QueuedJob {
    /// A single-member job without GPUs or resource requests.
    pub fn new(id: impl Into<String>, priority: i32, seq: u64, enqueued_at: Seconds) -> Self {
        QueuedJob {
            id: id.into(),
            priority,
            seq,
            enqueued_at,
            replicas: 1,
            gpus: 0,
            cores: None,
            memory_bytes: None,
            deadline: None,
            waiting_reason: String::new(),
            head: false,
        }
    }

    /// Its place in admission order under `order`: priority (higher first), preempted jobs
    /// first, (Kubeflow) the larger demand first, then submission order.
    fn order(&self, order: QueueOrder) -> (i64, bool, i64, u64) {
        let demand = match order {
            QueueOrder::Fifo | QueueOrder::Arrival => 0,
            // Milli-units so that the key is an integer (total order).
            QueueOrder::KubeflowWeight => -((self.demand() * 1000.0).round() as i64),
        };
        let priority = match order {
            QueueOrder::Arrival => 0,
            QueueOrder::Fifo | QueueOrder::KubeflowWeight => -(self.priority as i64),
        };
        (priority, !self.head, demand, self.seq)
    }

    /// The Kubeflow scheduler's resource requirement R: CPU + memory (cores + GiB), per member
    /// times members.
    pub fn demand(&self) -> f64 {
        (self.cores.unwrap_or(0.0) + self.memory_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64)
            * self.replicas.max(1) as f64
    }

    /// The request for member `replica`, avoiding the nodes of the members placed before it.
    pub fn member_request(&self, replica: u32, avoid: Vec<String>) -> JobRequest {
        JobRequest {
            id: member_id(&self.id, replica, self.replicas),
            gpus: self.gpus,
            cores: self.cores,
            memory_bytes: self.memory_bytes,
            priority: self.priority,
            avoid,
        }
    }

    /// Needs at least as much as `other` in every respect.
    fn needs_at_least(&self, other: &QueuedJob) -> bool {
        self.replicas >= other.replicas
            && self.gpus >= other.gpus
            && self.cores.unwrap_or(0.0) >= other.cores.unwrap_or(0.0)
            && self.memory_bytes.unwrap_or(0) >= other.memory_bytes.unwrap_or(0)
    }
}

/// A node being cleared for a waiting job (its lower-priority jobs are being saved for it): jobs
/// of lower priority than `priority` are not placed there meanwhile, so the room goes to the
/// job it is made for, not back to the jobs just saved nor to others of lower priority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The node's name.
    pub node: String,
    /// The waiting job's priority.
    pub priority: i32,
}

/// The id a member's pending placement has in the view: the job id, or `JOB#REPLICA` for gangs.
pub fn member_id(job: &str, replica: u32, replicas: u32) -> String {
    if replicas > 1 {
        format!("{job}#{replica}")
    } else {
        job.to_owned()
    }
}

/// A job admitted in a round: one placement per member, in member order. The view already has
/// their reservations.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    pub job: QueuedJob,
    pub members: Vec<Placement>,
}

/// A gang that timed out.
#[derive(Clone, Debug, PartialEq)]
pub struct Expired {
    pub job: QueuedJob,
    pub reason: String,
}

/// What a round did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Round {
    pub admitted: Vec<Admission>,
    pub expired: Vec<Expired>,
}

/// How the queue orders jobs of equal priority.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueOrder {
    /// Submission order.
    #[default]
    Fifo,
    /// The Kubeflow scheduler's weight: larger CPU + memory demand first.
    KubeflowWeight,
    /// Submission order whatever the priority (DRAGON's waiting queue: its jobs carry none).
    Arrival,
}

/// The queue.
#[derive(Clone, Debug, Default)]
pub struct Queue {
    /// Sorted by [`QueuedJob::order`] under `order`.
    jobs: Vec<QueuedJob>,
    order: QueueOrder,
}

impl Queue {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a job in its place. A job id already queued is replaced.
    pub fn push(&mut self, job: QueuedJob) {
        self.remove(&job.id);
        let order = self.order;
        let at = self
            .jobs
            .partition_point(|q| q.order(order) < job.order(order));
        self.jobs.insert(at, job);
    }

    /// Take a job out (cancelled).
    pub fn remove(&mut self, id: &str) -> Option<QueuedJob> {
        let pos = self.jobs.iter().position(|q| q.id == id)?;
        Some(self.jobs.remove(pos))
    }

    pub fn get(&self, id: &str) -> Option<&QueuedJob> {
        self.jobs.iter().find(|q| q.id == id)
    }

    /// 0-based position in admission order.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.jobs.iter().position(|q| q.id == id)
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The jobs in admission order.
    pub fn iter(&self) -> impl Iterator<Item = &QueuedJob> {
        self.jobs.iter()
    }

    /// One admission round at `now`: expire timed-out gangs, then admit every job that fits, in
    /// order, reserving its members in `cluster`.
    pub fn admit(
        &mut self,
        now: Seconds,
        cluster: &mut ClusterView,
        policy: &mut dyn PlacementPolicy,
    ) -> Round {
        self.admit_holding(now, cluster, policy, &[])
    }

    /// [`Queue::admit`], keeping each node of `holds` for jobs of at least its priority.
    pub fn admit_holding(
        &mut self,
        now: Seconds,
        cluster: &mut ClusterView,
        policy: &mut dyn PlacementPolicy,
        holds: &[Hold],
    ) -> Round {
        let order = policy.queue_order();
        if order != self.order {
            self.order = order;
            self.jobs.sort_by_key(|q| q.order(order));
        }
        let mut round = Round::default();
        let mut did_not_fit: Vec<QueuedJob> = Vec::new();
        let mut kept = Vec::with_capacity(self.jobs.len());
        let most = policy.admits_per_round().unwrap_or(usize::MAX);
        for mut job in std::mem::take(&mut self.jobs) {
            if round.admitted.len() >= most {
                // The policy's round is over: the rest wait for the next one, as they were.
                kept.push(job);
                continue;
            }
            if let Some(deadline) = job.deadline
                && now >= deadline
            {
                let waited = now - job.enqueued_at;
                let why = if job.waiting_reason.is_empty() {
                    "it was never tried".to_owned()
                } else {
                    job.waiting_reason.clone()
                };
                round.expired.push(Expired {
                    reason: format!(
                        "gang of {} member(s) with {} GPU(s) each was not admitted within {waited:.0} s: {why}",
                        job.replicas, job.gpus
                    ),
                    job,
                });
                continue;
            }
            if let Some(bigger_than) = did_not_fit.iter().find(|d| job.needs_at_least(d)) {
                job.waiting_reason = bigger_than.waiting_reason.clone();
                kept.push(job);
                continue;
            }
            let held: Vec<String> = holds
                .iter()
                .filter(|h| job.priority < h.priority)
                .map(|h| h.node.clone())
                .collect();
            match place_all(&job, cluster, policy, &held) {
                Ok(members) => round.admitted.push(Admission { job, members }),
                Err(reason) => {
                    job.waiting_reason = reason;
                    did_not_fit.push(job.clone());
                    kept.push(job);
                }
            }
        }
        self.jobs = kept;
        round
    }
}

/// Place every member of `job` or none: on failure the view is as before and the error says
/// which member did not fit and why.
fn place_all(
    job: &QueuedJob,
    cluster: &mut ClusterView,
    policy: &mut dyn PlacementPolicy,
    held: &[String],
) -> Result<Vec<Placement>, String> {
    if job.replicas > 1
        && policy.gangs_on_one_node()
        && let Some(members) = place_on_one_node(job, cluster, held)
    {
        return Ok(members);
    }
    // Our gangs put each member on its own node; the Kubeflow scheduler's fallback places the
    // members "in a regular manner" (each where the scheduler would put a pod: members may
    // share a node), so a gang larger than the cluster can still be placed.
    let distinct = !policy.gangs_on_one_node();
    let mut placed: Vec<(Placement, JobRequest)> = Vec::new();
    for replica in 0..job.replicas {
        let avoid = held
            .iter()
            .cloned()
            .chain(
                placed
                    .iter()
                    .filter(|_| distinct)
                    .map(|(p, _)| cluster.nodes[p.node].name.clone()),
            )
            .collect();
        let request = job.member_request(replica, avoid);
        match policy.place(cluster, &request) {
            Ok(p) => {
                cluster.reserve(
                    p.node,
                    JobView::pending(request.id.clone(), &request),
                    &p.gpus,
                );
                placed.push((p, request));
            }
            Err(no_fit) => {
                for (p, r) in placed.iter().rev() {
                    cluster.unreserve(p.node, &r.id, &p.gpus);
                }
                return Err(if job.replicas > 1 {
                    format!(
                        "member {} of {} does not fit: {}",
                        replica + 1,
                        job.replicas,
                        no_fit.reason
                    )
                } else {
                    no_fit.reason
                });
            }
        }
    }
    Ok(placed.into_iter().map(|(p, _)| p).collect())
}

/// The Kubeflow scheduler's gang step: the first node (by name) that holds every member at
/// once, each member reserved there; `None` when no node can.
fn place_on_one_node(
    job: &QueuedJob,
    cluster: &mut ClusterView,
    held: &[String],
) -> Option<Vec<Placement>> {
    let n = job.replicas;
    let whole = JobRequest {
        id: job.id.clone(),
        gpus: job.gpus * n,
        cores: job.cores.map(|c| c * n as f64),
        memory_bytes: job.memory_bytes.map(|m| m * n as u64),
        priority: job.priority,
        avoid: held.to_vec(),
    };
    let node = *crate::feasible_nodes(cluster, &whole).ok()?.first()?;
    let mut members = Vec::new();
    for replica in 0..n {
        let request = job.member_request(replica, Vec::new());
        let gpus: Vec<u32> = cluster.nodes[node]
            .free_gpus()
            .into_iter()
            .take(job.gpus as usize)
            .collect();
        cluster.reserve(node, JobView::pending(request.id.clone(), &request), &gpus);
        members.push(Placement {
            node,
            gpus,
            reason: format!(
                "gang on one node: {} holds all {n} members (the Kubeflow scheduler's gang step)",
                cluster.nodes[node].name
            ),
            candidates: Vec::new(),
        });
    }
    Some(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeView;
    use crate::first_fit::FirstFit;

    const GIB: u64 = 1 << 30;

    fn gpu_cluster(free: &[u32]) -> ClusterView {
        ClusterView {
            nodes: free
                .iter()
                .enumerate()
                .map(|(i, &g)| {
                    NodeView::new(format!("n{i}"), 8.0, 64 * GIB).with_gpus(g, "A100", 40 * GIB)
                })
                .collect(),
        }
    }

    fn ids(q: &Queue) -> Vec<&str> {
        q.iter().map(|j| j.id.as_str()).collect()
    }

    fn gpu_job(id: &str, priority: i32, seq: u64, gpus: u32) -> QueuedJob {
        QueuedJob {
            gpus,
            ..QueuedJob::new(id, priority, seq, 0.0)
        }
    }

    #[test]
    fn higher_priority_first_then_fifo() {
        let mut q = Queue::new();
        q.push(QueuedJob::new("a", 0, 1, 0.0));
        q.push(QueuedJob::new("b", 5, 2, 0.0));
        q.push(QueuedJob::new("c", 0, 3, 0.0));
        q.push(QueuedJob::new("d", 5, 4, 0.0));
        q.push(QueuedJob::new("e", -1, 5, 0.0));
        assert_eq!(ids(&q), ["b", "d", "a", "c", "e"]);
        assert_eq!(q.position("a"), Some(2));
        assert_eq!(q.remove("d").unwrap().id, "d");
        assert_eq!(ids(&q), ["b", "a", "c", "e"]);
        // A preempted job goes back at the head of its priority.
        q.push(QueuedJob {
            head: true,
            ..QueuedJob::new("p", 0, 9, 0.0)
        });
        assert_eq!(ids(&q), ["b", "p", "a", "c", "e"]);
    }

    #[test]
    fn admission_follows_priority_when_capacity_is_short() {
        // One GPU free: the high-priority job, submitted last, gets it.
        let mut c = gpu_cluster(&[1]);
        let mut q = Queue::new();
        q.push(gpu_job("low", 0, 1, 1));
        q.push(gpu_job("high", 9, 2, 1));
        let r = q.admit(0.0, &mut c, &mut FirstFit);
        assert_eq!(r.admitted.len(), 1);
        assert_eq!(r.admitted[0].job.id, "high");
        assert_eq!(ids(&q), ["low"]);
        assert!(
            q.get("low")
                .unwrap()
                .waiting_reason
                .contains("fewer than 1 free GPUs")
        );
    }

    #[test]
    fn a_job_that_does_not_fit_does_not_block_smaller_ones() {
        let mut c = gpu_cluster(&[2]);
        let mut q = Queue::new();
        q.push(gpu_job("big", 0, 1, 4));
        q.push(gpu_job("small", 0, 2, 1));
        let r = q.admit(0.0, &mut c, &mut FirstFit);
        assert_eq!(
            r.admitted
                .iter()
                .map(|a| a.job.id.as_str())
                .collect::<Vec<_>>(),
            ["small"]
        );
        assert_eq!(ids(&q), ["big"]);
    }

    #[test]
    fn a_gang_is_admitted_all_or_nothing() {
        // 3 members of 2 GPUs each, on distinct nodes; only 2 nodes have 2 free GPUs.
        let mut c = gpu_cluster(&[2, 1, 2]);
        let before = c.clone();
        let mut q = Queue::new();
        q.push(QueuedJob {
            replicas: 3,
            gpus: 2,
            ..QueuedJob::new("gang", 0, 1, 0.0)
        });
        let r = q.admit(0.0, &mut c, &mut FirstFit);
        assert!(r.admitted.is_empty());
        assert_eq!(
            c, before,
            "a gang that did not fit must leave no reservation behind"
        );
        let why = &q.get("gang").unwrap().waiting_reason;
        assert!(why.starts_with("member 3 of 3 does not fit"), "{why}");
        // Capacity frees on n1: now every member fits, each on its own node.
        c.nodes[1] = NodeView::new("n1", 8.0, 64 * GIB).with_gpus(2, "A100", 40 * GIB);
        let r = q.admit(1.0, &mut c, &mut FirstFit);
        assert_eq!(r.admitted.len(), 1);
        let nodes: Vec<usize> = r.admitted[0].members.iter().map(|m| m.node).collect();
        assert_eq!(nodes, [0, 1, 2]);
        assert!(c.nodes.iter().all(|n| n.free_gpu_count() == 0));
        assert_eq!(c.nodes[0].jobs()[0].id, "gang#0");
        assert!(q.is_empty());
    }

    #[test]
    fn a_gang_that_waits_too_long_expires_with_the_reason() {
        let mut c = gpu_cluster(&[1]);
        let mut q = Queue::new();
        q.push(QueuedJob {
            gpus: 4,
            deadline: Some(60.0),
            ..QueuedJob::new("gang", 0, 1, 0.0)
        });
        q.push(gpu_job("single", 0, 2, 2));
        assert!(q.admit(10.0, &mut c, &mut FirstFit).expired.is_empty());
        let r = q.admit(60.0, &mut c, &mut FirstFit);
        assert_eq!(r.expired.len(), 1);
        assert_eq!(r.expired[0].job.id, "gang");
        assert!(
            r.expired[0].reason.contains("not admitted within 60 s")
                && r.expired[0].reason.contains("fewer than 4 free GPUs"),
            "{}",
            r.expired[0].reason
        );
        // A single job without a deadline keeps waiting.
        assert_eq!(ids(&q), ["single"]);
        assert!(q.admit(1e9, &mut c, &mut FirstFit).expired.is_empty());
    }

    #[test]
    fn a_waiting_job_is_placed_when_capacity_frees() {
        let mut c = gpu_cluster(&[1]);
        c.nodes[0].gpus[0].assigned = true;
        let mut q = Queue::new();
        q.push(gpu_job("j", 0, 1, 1));
        assert!(q.admit(0.0, &mut c, &mut FirstFit).admitted.is_empty());
        c.nodes[0].gpus[0].assigned = false;
        assert_eq!(
            q.admit(5.0, &mut c, &mut FirstFit).admitted[0].members[0].gpus,
            [0]
        );
    }

    #[test]
    fn jobs_bigger_than_one_that_did_not_fit_are_not_tried_again() {
        #[derive(Debug)]
        struct Counting(FirstFit, usize);
        impl PlacementPolicy for Counting {
            fn name(&self) -> &'static str {
                "counting"
            }
            fn place(
                &mut self,
                c: &ClusterView,
                j: &JobRequest,
            ) -> Result<Placement, crate::NoFit> {
                self.1 += 1;
                self.0.place(c, j)
            }
        }
        let mut c = gpu_cluster(&[1]);
        let mut q = Queue::new();
        for k in 0..10 {
            q.push(gpu_job(&format!("j{k}"), 0, k, 2));
        }
        let mut p = Counting(FirstFit, 0);
        q.admit(0.0, &mut c, &mut p);
        assert_eq!(p.1, 1);
        assert!(
            q.iter()
                .all(|j| j.waiting_reason.contains("fewer than 2 free GPUs"))
        );
    }
}
