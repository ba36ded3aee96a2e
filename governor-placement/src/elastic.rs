//! Elastic jobs: which jobs grow into cores that would otherwise idle, and which shrink to make
//! room for a job that waits.
//!
//! An elastic job declares a range of cores (`govctl submit --cores MIN:MAX`) and a framework
//! checkpoint. Every resize is a save and a start again at the new size (the coordinator does
//! that; this module only chooses), so resizes are few and whole: a job grows straight to the
//! most cores its node leaves unreserved (up to its maximum), and shrinks by no more whole
//! cores than the waiting job needs.
//!
//! Each placement policy says how its jobs scale ([`Elasticity`]):
//! - **ours** (`soonest` and the node-side papers' policies): grow when no job waits, shrink for
//!   a waiting job of the same or higher priority. The cores a job grew into were idle, so any
//!   job that arrives may have them back; growing while jobs wait would take their room. A job
//!   grows on its node or moves to grow on another where it can hold more (a resize is a save
//!   and a start again wherever it lands). A job admitted while none wait starts on what its
//!   node leaves free, less room for one more job of its least size where no other node has
//!   that room ([`admission_size`]): lent cores come back by a shrink, another restart.
//! - **Kubeflow** (DRAGON/OASIS): after every round, scale up every running job into the
//!   residual resources (its `ScaleUp`, run at the end of each scheduling pass), and scale down
//!   jobs of lower weight (priority) to admit a higher-priority job (its `ScaleDown`). The
//!   write-up scales worker replicas of a fixed size; we scale the cores of one member, a
//!   worker's worth at a time (whole cores), on its node: documented in docs/cluster.md.
//! - **Schedulearn's elastic FIFO**: "whenever a job completes, determine the slowest job that
//!   is still running … scale out the job by adding more GPUs to the job, or possibly migrate
//!   the job to another server with more GPUs". The slowest job is read as the one that has
//!   been running longest (the write-up's test: "how long the job has been running"); on each
//!   completion that job grows on its node, or moves to the node where it can grow most. One
//!   job per completion, as the algorithm says; where the slowest cannot grow anywhere the next
//!   slowest is taken (so a completion is not wasted on a job already at its maximum). It never
//!   shrinks jobs.
//! - **DRAGON** (the Kubeflow scheduler's predecessor, NTHU-LSALAB/DRAGON, its
//!   `scheduling.go`): the queue's oldest job, once it has waited 30 s, has running jobs scaled
//!   down (any of them, down to their least size) until it fits; when that cannot make room,
//!   no job is admitted in that round. Running jobs scale up into free cores once 60 s passed
//!   without an admission, a resize or a starving job. A job starts at its least size (its
//!   TFJob's declared workers, read as what tf-operator would run: see [`crate::dragon`]).
//! - plain **FIFO** and **round-robin** (Schedulearn's others) never resize: elastic jobs run at
//!   their least size.

use crate::queue::Seconds;
use crate::{ClusterView, JobRequest, NodeView, feasible_nodes};

/// An elastic job is resized only after running this long since its latest start (seconds): a
/// resize is a save and a start again. The coordinator's `resize_min_run_s` default and
/// govsim's rule.
pub const MIN_RUN_S: Seconds = 60.0;

/// When a policy's elastic jobs grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grow {
    Never,
    /// Into unreserved cores, but only while no job waits in the queue.
    WhenNoneWait,
    /// Into unreserved cores after every admission round that admitted no job (Kubeflow's
    /// scale-up: its loop returns after placing a job).
    Always,
    /// On each completion, the job running longest (Schedulearn's elastic FIFO).
    OnCompletion,
    /// Into unreserved cores once no job was admitted, scaled or found starving for
    /// [`DRAGON_QUIET_S`] (DRAGON's phase 3), whether or not jobs wait.
    AfterQuiet,
}

/// For which waiting jobs a policy's elastic jobs shrink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shrink {
    Never,
    /// Waiting jobs of strictly higher priority (Kubeflow's scale-down).
    ForHigherPriority,
    /// Waiting jobs of the same or higher priority (ours: grown cores are lent, not owned).
    ForSameOrHigherPriority,
    /// Only the queue's oldest job, once it has waited [`DRAGON_STARVING_S`], whatever the
    /// priorities; while that fails to make room, nothing else is admitted (DRAGON's phase 1).
    ForStarvingHead,
}

/// DRAGON's phase 1: the oldest waiting job becomes its "high priority job" after this long in
/// the queue (its `scheduling.go` compares the enqueue time with 30 s; its README's "more than
/// 30 seconds").
pub const DRAGON_STARVING_S: Seconds = 30.0;

/// DRAGON's phase 3: running jobs scale up after this long without a scheduling or scaling
/// action (`lastActionTime`, 60 s).
pub const DRAGON_QUIET_S: Seconds = 60.0;

/// How a placement policy resizes elastic jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elasticity {
    pub grow: Grow,
    pub shrink: Shrink,
}

impl Elasticity {
    pub const NONE: Elasticity = Elasticity {
        grow: Grow::Never,
        shrink: Shrink::Never,
    };
    pub const OURS: Elasticity = Elasticity {
        grow: Grow::WhenNoneWait,
        shrink: Shrink::ForSameOrHigherPriority,
    };
    pub const KUBEFLOW: Elasticity = Elasticity {
        grow: Grow::Always,
        shrink: Shrink::ForHigherPriority,
    };
    pub const ELASTIC_FIFO: Elasticity = Elasticity {
        grow: Grow::OnCompletion,
        shrink: Shrink::Never,
    };
    pub const DRAGON: Elasticity = Elasticity {
        grow: Grow::AfterQuiet,
        shrink: Shrink::ForStarvingHead,
    };
}

/// A running elastic job that may be resized now (the caller leaves out jobs being moved or
/// saved, and those that started too recently).
#[derive(Clone, Debug, PartialEq)]
pub struct ElasticJob {
    /// Its id in the view (the job id: elastic jobs have one member).
    pub id: String,
    /// Index of its node in the view.
    pub node: usize,
    /// Cores it holds now.
    pub cores: f64,
    pub min_cores: f64,
    pub max_cores: f64,
    pub priority: i32,
    /// Its latest start (a resize starts it again).
    pub started_at: Seconds,
    /// Its submission (how long it has been running, for Schedulearn's "slowest job").
    pub submitted_at: Seconds,
}

/// Resize one job: save it and start it again with `to` cores on node `node` (its own node, or
/// another one for Schedulearn's move-and-grow).
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    pub id: String,
    pub node: usize,
    pub from: f64,
    pub to: f64,
    pub reason: String,
}

/// Tolerance for comparing core counts built from sums.
const EPS: f64 = 1e-9;

/// The node with job `id`'s reservation set to `cores`.
fn with_cores(node: &NodeView, id: &str, cores: f64) -> NodeView {
    let mut n = node.clone();
    if let Some(j) = n.jobs_mut().iter_mut().find(|j| j.id == id) {
        j.requested_cores = Some(cores);
    }
    n
}

/// The size `job` can grow to on `node`: its cores plus the node's unreserved whole cores, up to
/// its maximum; `None` when that is not at least one core more (or up to its maximum).
pub fn grown_size(node: &NodeView, job: &ElasticJob) -> Option<f64> {
    if !node.schedulable {
        return None;
    }
    grown_into(job, node.unreserved_cores())
}

/// `job` grown into `spare` cores: straight to its maximum where that fits, else by the whole
/// cores there are (`None` under one).
fn grown_into(job: &ElasticJob, spare: f64) -> Option<f64> {
    let spare = spare.max(0.0);
    if job.cores + spare >= job.max_cores - EPS {
        // Its maximum fits: take it, however small the step.
        return (job.max_cores > job.cores + EPS).then_some(job.max_cores);
    }
    let whole = (spare + EPS).floor();
    (whole >= 1.0).then_some(job.cores + whole)
}

/// The size ours starts a just-admitted job at on node `node` when no job waits: what
/// [`grown_size`] gives, except on the last node with room for another job of the same least
/// size, where that much is kept free.
///
/// Why (measured, 2026-11-30): the cores lent at admission are taken back by a shrink when the
/// next job arrives, and a shrink is a save and a start again. On one node of 2 cores with 4
/// jobs of 1-2 cores arriving seconds apart (`bench-real --nodes 1 --workload elastic`, and
/// govsim's `reduced` built from those runs), the first job started on both cores and was
/// shrunk, at a 6 s restart of a 25 s job, for the second: +16.7% average JCT against static
/// sizes on real jobs, +18.8% in govsim. Keeping room for one newcomer where no other node has
/// it: +2.1% there, -1.4% with jobs 10 times longer, and every other elastic scenario the same
/// or better (`govsim elastic --seeds 1-5`: `kubeflow-4` 788 -> 785 s, `kubeflow` 1132 ->
/// 1119 s, `schedulearn` 911 -> 903 s, `priority` 1715 -> 1714 s). Keeping the room on every
/// node instead cost 0.2-1.9% there: a newcomer goes to an empty node anyway.
pub fn admission_size(cluster: &ClusterView, node: usize, job: &ElasticJob) -> Option<f64> {
    let here = cluster.nodes.get(node)?;
    if !here.schedulable {
        return None;
    }
    let room_elsewhere =
        cluster.nodes.iter().enumerate().any(|(i, n)| {
            i != node && n.schedulable && n.unreserved_cores() >= job.min_cores - EPS
        });
    let keep = if room_elsewhere { 0.0 } else { job.min_cores };
    grown_into(job, here.unreserved_cores() - keep)
}

/// Grow jobs into the cores nodes leave unreserved: higher priority first, then the earliest
/// submitted; each straight to the largest size that fits, whole cores at a time, on its own
/// node or, where `may_move_to(job, node)` allows, on another node where it would hold at least
/// one whole core more than it can at home (and its reserved memory fits).
///
/// Moving to grow is ours (`Grow::WhenNoneWait`): a resize is a save and a start again
/// wherever it lands, so a job shrunk to make room for a newcomer must not stay small beside a
/// node that has emptied since (`govsim elastic`'s `kubeflow-4`: the cores of the node that
/// emptied idled until the end). Kubeflow's and DRAGON's scale-up grow jobs in place (pass
/// `|_, _| false`). A job that moves keeps its reservation on its source in this round: those
/// cores are free only once it has saved, so no other job grows into them before then.
pub fn grow_into_idle(
    cluster: &ClusterView,
    jobs: &[ElasticJob],
    may_move_to: impl Fn(&ElasticJob, usize) -> bool,
) -> Vec<Resize> {
    let mut view = cluster.clone();
    let mut order: Vec<&ElasticJob> = jobs.iter().filter(|j| j.cores < j.max_cores).collect();
    order.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.submitted_at.total_cmp(&b.submitted_at))
            .then(a.id.cmp(&b.id))
    });
    let mut resizes = Vec::new();
    for job in order {
        let home = grown_size(&view.nodes[job.node], job);
        if let Some((target, to, mut held)) = roomier_node(&view, job, home, &may_move_to) {
            held.requested_cores = Some(to);
            view.nodes[target].jobs_mut().push(held);
            resizes.push(Resize {
                id: job.id.clone(),
                node: target,
                from: job.cores,
                to,
                reason: format!(
                    "{} has room for {} at {} cores, its node {} for {} at most: it moves there to grow from {} to {} cores",
                    view.nodes[target].name,
                    job.id,
                    to,
                    view.nodes[job.node].name,
                    home.unwrap_or(job.cores),
                    job.cores,
                    to
                ),
            });
            continue;
        }
        let Some(to) = home else {
            continue;
        };
        view.nodes[job.node] = with_cores(&view.nodes[job.node], &job.id, to);
        resizes.push(Resize {
            id: job.id.clone(),
            node: job.node,
            from: job.cores,
            to,
            reason: format!(
                "{} has {} unreserved core(s): {} grows from {} to {} cores",
                view.nodes[job.node].name,
                to - job.cores,
                job.id,
                job.cores,
                to
            ),
        });
    }
    resizes
}

/// The size `job` would start at on `node`, arriving there with nothing: the node's unreserved
/// whole cores, up to its maximum (`None` under one core, or where the node takes no jobs).
fn size_on_arrival(node: &NodeView, job: &ElasticJob) -> Option<f64> {
    let arriving = ElasticJob {
        cores: 0.0,
        ..job.clone()
    };
    grown_size(node, &arriving)
}

/// The node other than its own where `job` would hold the most cores, if that is at least one
/// whole core more than it can reach at home (`home`: its grown size there, if any), the node
/// has its reserved memory unreserved and `may_move_to` allows it: the node, the size, and the
/// job's reservation to hold there.
fn roomier_node(
    view: &ClusterView,
    job: &ElasticJob,
    home: Option<f64>,
    may_move_to: impl Fn(&ElasticJob, usize) -> bool,
) -> Option<(usize, f64, crate::JobView)> {
    let reservation = view.nodes[job.node].jobs().iter().find(|j| j.id == job.id);
    let memory = reservation
        .and_then(|r| r.requested_memory_bytes)
        .unwrap_or(0);
    let at_least = home.unwrap_or(job.cores) + 1.0 - EPS;
    let (node, to) = view
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| *i != job.node && n.unreserved_memory() >= memory && may_move_to(job, *i))
        .filter_map(|(i, n)| Some((i, size_on_arrival(n, job)?)))
        .filter(|(_, to)| *to >= at_least)
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))?;
    let held = reservation.cloned().unwrap_or_else(|| {
        crate::JobView::running(job.id.clone(), crate::Category::Progressing, job.cores)
    });
    Some((node, to, held))
}

/// Schedulearn's elastic FIFO after a completion: the job running longest grows on its node, or
/// moves to the node where it can grow most; `can_run_on(job, node)` says where it may go (the
/// caller's checks: ready, able to take its checkpoint). `None` when no job can grow anywhere.
///
/// Only a job *running too long* is scaled: the write-up "will verify how long the job has been
/// running. Knowing that it's running too long, the system will scale out the job" without
/// saying against what. Its scheduler knows one yardstick, the jobs that completed, so "too
/// long" is read as longer in the system (`now - submitted_at`) than the completed jobs took on
/// average (`completed_mean_s`, submission to completion); the caller passes 0 before any job
/// completed (there is then no completion to act on anyway).
pub fn grow_slowest(
    cluster: &ClusterView,
    jobs: &[ElasticJob],
    now: Seconds,
    completed_mean_s: Seconds,
    can_run_on: impl Fn(&ElasticJob, usize) -> bool,
) -> Option<Resize> {
    let too_long = |j: &ElasticJob| now - j.submitted_at > completed_mean_s;
    let mut order: Vec<&ElasticJob> = jobs
        .iter()
        .filter(|j| j.cores < j.max_cores && too_long(j))
        .collect();
    order.sort_by(|a, b| {
        a.submitted_at
            .total_cmp(&b.submitted_at)
            .then(a.id.cmp(&b.id))
    });
    for job in order {
        if let Some(to) = grown_size(&cluster.nodes[job.node], job) {
            return Some(Resize {
                id: job.id.clone(),
                node: job.node,
                from: job.cores,
                to,
                reason: format!(
                    "elastic FIFO: a job completed; {} has run longest ({:.0} s, longer than the completed jobs' {:.0} s) and grows from {} to {} cores on {}",
                    job.id,
                    now - job.submitted_at,
                    completed_mean_s,
                    job.cores,
                    to,
                    cluster.nodes[job.node].name
                ),
            });
        }
        // Elsewhere: the node where it would hold the most cores (it leaves its own).
        let elsewhere = cluster
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != job.node && can_run_on(job, *i))
            .filter_map(|(i, n)| {
                let to = size_on_arrival(n, job)?;
                (to >= job.cores + 1.0 - EPS || (to - job.max_cores).abs() < EPS && to > job.cores)
                    .then_some((i, to))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
        if let Some((node, to)) = elsewhere {
            return Some(Resize {
                id: job.id.clone(),
                node,
                from: job.cores,
                to,
                reason: format!(
                    "elastic FIFO: a job completed; {} has run longest ({:.0} s, longer than the completed jobs' {:.0} s), its node is full, and it moves to {} to grow from {} to {} cores",
                    job.id,
                    now - job.submitted_at,
                    completed_mean_s,
                    cluster.nodes[node].name,
                    job.cores,
                    to
                ),
            });
        }
    }
    None
}

/// Shrinks on one node that let a waiting job fit there.
#[derive(Clone, Debug, PartialEq)]
pub struct ShrinkPlan {
    pub node: usize,
    pub resizes: Vec<Resize>,
}

/// The fewest whole cores taken from elastic jobs on one node (never below their least size)
/// that let `job` fit, or `None`. Per node, jobs give back lowest priority first, then the most
/// recently started; across nodes, the one whose highest shrunk priority is lowest wins, then
/// the fewest resizes, the fewest cores taken, the first in the view.
pub fn shrink_plan(
    cluster: &ClusterView,
    job: &JobRequest,
    jobs: &[ElasticJob],
    rule: Shrink,
) -> Option<ShrinkPlan> {
    let eligible = |j: &ElasticJob| match rule {
        Shrink::Never => false,
        Shrink::ForHigherPriority => j.priority < job.priority,
        Shrink::ForSameOrHigherPriority => j.priority <= job.priority,
        Shrink::ForStarvingHead => true,
    };
    if rule == Shrink::Never || feasible_nodes(cluster, job).is_ok() {
        return None;
    }
    let fits = |node: &NodeView| {
        feasible_nodes(
            &ClusterView {
                nodes: vec![node.clone()],
            },
            job,
        )
        .is_ok()
    };
    let mut best: Option<((i32, usize, i64, usize), ShrinkPlan)> = None;
    for (i, node) in cluster.nodes.iter().enumerate() {
        if !node.schedulable || job.avoid.iter().any(|a| a == &node.name) {
            continue;
        }
        let mut on_node: Vec<&ElasticJob> = jobs
            .iter()
            .filter(|j| j.node == i && j.cores > j.min_cores + EPS && eligible(j))
            .collect();
        if on_node.is_empty() {
            continue;
        }
        on_node.sort_by(|a, b| {
            a.priority
                .cmp(&b.priority)
                .then(b.started_at.total_cmp(&a.started_at))
                .then(a.id.cmp(&b.id))
        });
        let mut shrunk = node.clone();
        let mut resizes = Vec::new();
        for j in on_node {
            if fits(&shrunk) {
                break;
            }
            // The fewest whole cores that make it fit, or down to its least size.
            let mut to = j.cores;
            loop {
                to = (to - 1.0).max(j.min_cores);
                if fits(&with_cores(&shrunk, &j.id, to)) || to <= j.min_cores + EPS {
                    break;
                }
            }
            shrunk = with_cores(&shrunk, &j.id, to);
            resizes.push(Resize {
                id: j.id.clone(),
                node: i,
                from: j.cores,
                to,
                reason: String::new(),
            });
        }
        if !fits(&shrunk) {
            continue;
        }
        let highest = on_node_priority(jobs, &resizes);
        let taken: f64 = resizes.iter().map(|r| r.from - r.to).sum();
        let key = (highest, resizes.len(), (taken * 1000.0).round() as i64, i);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, ShrinkPlan { node: i, resizes }));
        }
    }
    let (_, mut plan) = best?;
    let node = &cluster.nodes[plan.node].name;
    for r in &mut plan.resizes {
        r.reason = format!(
            "{} of priority {} does not fit anywhere; {} shrinks from {} to {} cores on {node} to make room",
            job.id, job.priority, r.id, r.from, r.to
        );
    }
    Some(plan)
}

fn on_node_priority(jobs: &[ElasticJob], resizes: &[Resize]) -> i32 {
    resizes
        .iter()
        .filter_map(|r| jobs.iter().find(|j| j.id == r.id).map(|j| j.priority))
        .max()
        .unwrap_or(i32::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use crate::{Category, JobView, NodeView};

    fn holding(id: &str, cores: f64) -> JobView {
        JobView {
            requested_cores: Some(cores),
            ..JobView::running(id, Category::Progressing, cores)
        }
    }

    fn elastic(id: &str, node: usize, cores: f64, range: (f64, f64), priority: i32) -> ElasticJob {
        ElasticJob {
            id: id.into(),
            node,
            cores,
            min_cores: range.0,
            max_cores: range.1,
            priority,
            started_at: 0.0,
            submitted_at: 0.0,
        }
    }

    fn eight(name: &str, jobs: Vec<JobView>) -> NodeView {
        node(name, jobs)
    }

    fn wants(cores: f64, priority: i32) -> JobRequest {
        JobRequest {
            cores: Some(cores),
            priority,
            ..JobRequest::new("new", 0)
        }
    }

    #[test]
    fn a_job_grows_straight_to_what_its_node_leaves_up_to_its_maximum() {
        let c = cluster(vec![
            eight("a", vec![holding("e1", 2.0), holding("x", 3.0)]),
            eight("b", vec![holding("e2", 1.0)]),
        ]);
        let jobs = [
            elastic("e1", 0, 2.0, (2.0, 16.0), 0),
            elastic("e2", 1, 1.0, (1.0, 4.0), 0),
        ];
        let r = grow_into_idle(&c, &jobs, |_, _| false);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].id.as_str(), r[0].from, r[0].to), ("e1", 2.0, 5.0));
        assert_eq!((r[1].id.as_str(), r[1].to), ("e2", 4.0));
        assert!(
            r[0].reason.contains("grows from 2 to 5 cores"),
            "{}",
            r[0].reason
        );
    }

    #[test]
    fn ours_keeps_room_for_a_newcomer_only_on_the_last_node_that_has_it() {
        // The real reduced runs' node: 2 cores, a job of 1-2 cores just admitted at 1.
        let mut two = NodeView::new("a", 2.0, 32 * GIB);
        two.set_jobs(vec![holding("e", 1.0)]);
        let job = elastic("e", 0, 1.0, (1.0, 2.0), 0);
        assert_eq!(grown_size(&two, &job), Some(2.0), "what is free");
        assert_eq!(
            admission_size(&cluster(vec![two.clone()]), 0, &job),
            None,
            "the only node: its second core stays free for the next job"
        );
        // Another node with a core free: the newcomer goes there, this job takes both.
        let mut other = NodeView::new("b", 2.0, 32 * GIB);
        other.set_jobs(vec![holding("x", 1.0)]);
        assert_eq!(
            admission_size(&cluster(vec![two.clone(), other.clone()]), 0, &job),
            Some(2.0)
        );
        // ... but not one without room for a job of this one's least size, nor one that takes
        // no jobs.
        other.set_jobs(vec![holding("x", 1.5)]);
        assert_eq!(
            admission_size(&cluster(vec![two.clone(), other.clone()]), 0, &job),
            None
        );
        other.set_jobs(Vec::new());
        other.schedulable = false;
        assert_eq!(admission_size(&cluster(vec![two, other]), 0, &job), None);
        // On 8 cores the last node keeps the job's least size (2) and lends the rest.
        let c = cluster(vec![eight("a", vec![holding("big", 2.0)])]);
        let big = elastic("big", 0, 2.0, (2.0, 8.0), 0);
        assert_eq!(admission_size(&c, 0, &big), Some(6.0));
        let c = cluster(vec![
            eight("a", vec![holding("big", 2.0)]),
            eight("b", vec![]),
        ]);
        assert_eq!(admission_size(&c, 0, &big), Some(8.0));
    }

    #[test]
    fn two_jobs_on_one_node_share_its_spare_cores_by_priority_then_age() {
        let c = cluster(vec![eight(
            "a",
            vec![holding("old", 1.0), holding("hi", 1.0)],
        )]);
        let mut old = elastic("old", 0, 1.0, (1.0, 8.0), 0);
        old.submitted_at = 1.0;
        let hi = ElasticJob {
            submitted_at: 5.0,
            ..elastic("hi", 0, 1.0, (1.0, 4.0), 3)
        };
        let r = grow_into_idle(&c, &[old, hi], |_, _| false);
        // hi takes 3 (to its max of 4), old the remaining 3.
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].id.as_str(), r[0].to), ("hi", 4.0));
        assert_eq!((r[1].id.as_str(), r[1].to), ("old", 4.0));
    }

    #[test]
    fn no_growth_by_less_than_a_core_or_on_an_unschedulable_node() {
        let c = cluster(vec![eight("a", vec![holding("e", 1.0), holding("x", 6.5)])]);
        assert!(
            grow_into_idle(&c, &[elastic("e", 0, 1.0, (1.0, 4.0), 0)], |_, _| false).is_empty()
        );
        // Half a core is enough when it reaches the maximum.
        let r = grow_into_idle(&c, &[elastic("e", 0, 1.0, (1.0, 1.5), 0)], |_, _| false);
        assert_eq!(r[0].to, 1.5);
        let mut n = eight("a", vec![holding("e", 1.0)]);
        n.schedulable = false;
        assert!(
            grow_into_idle(
                &cluster(vec![n]),
                &[elastic("e", 0, 1.0, (1.0, 4.0), 0)],
                |_, _| false
            )
            .is_empty()
        );
    }

    #[test]
    fn a_job_moves_to_grow_only_where_it_gets_a_whole_core_more_than_at_home() {
        let anywhere = |_: &ElasticJob, _: usize| true;
        // a is full; b is empty: e moves there and takes its maximum.
        let c = cluster(vec![
            eight("a", vec![holding("e", 2.0), holding("x", 6.0)]),
            eight("b", vec![]),
        ]);
        let e = elastic("e", 0, 2.0, (2.0, 8.0), 0);
        let r = grow_into_idle(&c, std::slice::from_ref(&e), anywhere);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].node, r[0].from, r[0].to), (1, 2.0, 8.0));
        assert!(
            r[0].reason
                .contains("b has room for e at 8 cores, its node a for 2 at most"),
            "{}",
            r[0].reason
        );
        // Not allowed to move (Kubeflow, DRAGON): nothing grows.
        assert!(grow_into_idle(&c, std::slice::from_ref(&e), |_, _| false).is_empty());
        // At home it can reach 5; b offers 5 too: it grows where it is.
        let c = cluster(vec![
            eight("a", vec![holding("e", 2.0), holding("x", 3.0)]),
            eight("b", vec![holding("y", 3.0)]),
        ]);
        let r = grow_into_idle(&c, std::slice::from_ref(&e), anywhere);
        assert_eq!((r[0].node, r[0].to), (0, 5.0));
    }

    #[test]
    fn two_jobs_do_not_move_to_the_same_free_cores_nor_into_those_a_mover_leaves() {
        let c = cluster(vec![
            eight(
                "a",
                vec![holding("e1", 2.0), holding("e2", 2.0), holding("x", 4.0)],
            ),
            eight("b", vec![]),
        ]);
        let mut e1 = elastic("e1", 0, 2.0, (2.0, 8.0), 0);
        e1.submitted_at = 1.0;
        let mut e2 = elastic("e2", 0, 2.0, (2.0, 8.0), 0);
        e2.submitted_at = 2.0;
        let r = grow_into_idle(&c, &[e2, e1], |_, _| true);
        // The older moves to b; the younger neither follows it nor takes e1's 2 cores on a
        // (free only once e1 has saved).
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].id.as_str(), r[0].node, r[0].to), ("e1", 1, 8.0));
    }

    #[test]
    fn a_job_does_not_move_to_a_node_without_its_reserved_memory() {
        let mut mine = holding("e", 2.0);
        mine.requested_memory_bytes = Some(8 << 30);
        let mut b = NodeView::new("b", 8.0, 4 << 30);
        b.schedulable = true;
        let c = cluster(vec![eight("a", vec![mine, holding("x", 6.0)]), b]);
        let e = elastic("e", 0, 2.0, (2.0, 8.0), 0);
        assert!(grow_into_idle(&c, &[e], |_, _| true).is_empty());
    }

    /// a is full (old, 2 cores, submitted at 1 s, and a rigid job); b has young (2 cores,
    /// submitted at 9 s) and 6 free cores. Both may grow to 8.
    fn old_and_young() -> (ClusterView, ElasticJob, ElasticJob) {
        let c = cluster(vec![
            eight("a", vec![holding("old", 2.0), holding("x", 6.0)]),
            eight("b", vec![holding("young", 2.0)]),
        ]);
        let mut old = elastic("old", 0, 2.0, (2.0, 8.0), 0);
        old.submitted_at = 1.0;
        let mut young = elastic("young", 1, 2.0, (2.0, 8.0), 0);
        young.submitted_at = 9.0;
        (c, old, young)
    }

    #[test]
    fn elastic_fifo_grows_the_longest_running_job_here_or_elsewhere() {
        let (c, old, young) = old_and_young();
        let r = grow_slowest(&c, &[young.clone(), old.clone()], 20.0, 0.0, |_, _| true).unwrap();
        assert_eq!((r.id.as_str(), r.node, r.to), ("old", 1, 6.0));
        assert!(r.reason.contains("moves to b"), "{}", r.reason);
        // Not allowed to move: the next slowest grows at home.
        let r = grow_slowest(&c, &[young, old], 20.0, 0.0, |_, _| false).unwrap();
        assert_eq!((r.id.as_str(), r.node, r.to), ("young", 1, 8.0));
    }

    #[test]
    fn elastic_fifo_scales_only_a_job_running_longer_than_the_completed_jobs_took() {
        // At 20 s, completed jobs took 15 s on average: old (19 s in the system) is running too
        // long, young (11 s) is not.
        let (c, old, young) = old_and_young();
        let r = grow_slowest(&c, &[young.clone(), old.clone()], 20.0, 15.0, |_, _| true).unwrap();
        assert_eq!(r.id, "old");
        assert!(
            r.reason
                .contains("19 s, longer than the completed jobs' 15 s"),
            "{}",
            r.reason
        );
        // Neither has run longer than 25 s: nobody is scaled.
        assert_eq!(
            grow_slowest(&c, &[young, old], 20.0, 25.0, |_, _| true),
            None
        );
    }

    #[test]
    fn a_shrink_takes_the_fewest_cores_lowest_priority_newest_first() {
        let c = cluster(vec![eight(
            "a",
            vec![holding("low", 4.0), holding("mid", 4.0)],
        )]);
        let low = elastic("low", 0, 4.0, (1.0, 4.0), 0);
        let mid = ElasticJob {
            started_at: 10.0,
            ..elastic("mid", 0, 4.0, (2.0, 4.0), 1)
        };
        // 2 cores: low gives 2.
        let p = shrink_plan(
            &c,
            &wants(2.0, 5),
            &[low.clone(), mid.clone()],
            Shrink::ForHigherPriority,
        )
        .unwrap();
        assert_eq!(p.resizes.len(), 1);
        assert_eq!((p.resizes[0].id.as_str(), p.resizes[0].to), ("low", 2.0));
        assert!(
            p.resizes[0]
                .reason
                .contains("shrinks from 4 to 2 cores on a")
        );
        // 5 cores: low down to 1 (3), mid gives 2.
        let p = shrink_plan(
            &c,
            &wants(5.0, 5),
            &[low.clone(), mid.clone()],
            Shrink::ForHigherPriority,
        )
        .unwrap();
        let sizes: Vec<(&str, f64)> = p.resizes.iter().map(|r| (r.id.as_str(), r.to)).collect();
        assert_eq!(sizes, vec![("low", 1.0), ("mid", 2.0)]);
        // 6 cores cannot be made (1 + 2 held at least).
        assert!(
            shrink_plan(
                &c,
                &wants(6.0, 5),
                &[low.clone(), mid.clone()],
                Shrink::ForHigherPriority
            )
            .is_none()
        );
    }

    #[test]
    fn who_may_shrink_for_whom() {
        let c = cluster(vec![eight("a", vec![holding("e", 8.0)])]);
        let e = [elastic("e", 0, 8.0, (2.0, 8.0), 1)];
        assert!(shrink_plan(&c, &wants(2.0, 1), &e, Shrink::ForHigherPriority).is_none());
        assert!(shrink_plan(&c, &wants(2.0, 1), &e, Shrink::ForSameOrHigherPriority).is_some());
        assert!(shrink_plan(&c, &wants(2.0, 0), &e, Shrink::ForSameOrHigherPriority).is_none());
        assert!(shrink_plan(&c, &wants(2.0, 9), &e, Shrink::Never).is_none());
        // A job that fits already needs no shrink.
        let roomy = cluster(vec![eight("a", vec![holding("e", 4.0)])]);
        assert!(shrink_plan(&roomy, &wants(2.0, 9), &e, Shrink::ForHigherPriority).is_none());
    }

    #[test]
    fn the_node_with_the_lowest_priority_shrunk_is_chosen() {
        let c = cluster(vec![
            eight("a", vec![holding("p3", 8.0)]),
            eight("b", vec![holding("p1", 8.0)]),
        ]);
        let jobs = [
            elastic("p3", 0, 8.0, (1.0, 8.0), 3),
            elastic("p1", 1, 8.0, (1.0, 8.0), 1),
        ];
        let p = shrink_plan(&c, &wants(2.0, 5), &jobs, Shrink::ForHigherPriority).unwrap();
        assert_eq!(p.node, 1);
        assert_eq!(p.resizes[0].to, 6.0);
    }
}
