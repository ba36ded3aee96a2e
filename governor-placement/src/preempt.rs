//! Preemption without loss: which running jobs make room for a higher-priority job that does
//! not fit anywhere.
//!
//! The Kubeflow/DRAGON scheduler scales jobs down to admit high-priority ones; Kubernetes'
//! scheduler preempts pods by priority. Here a displaced job is *saved* (its framework
//! checkpoint or a CRIU dump), requeued at the head of its priority and resumed later where it
//! stopped: nothing is killed. This module only chooses; the coordinator saves and requeues.
//!
//! - **Candidates** are the caller's: running jobs that can be saved, of strictly lower
//!   priority, that have run at least the minimum time, are not being moved, and were not
//!   themselves preempted to make room for the same job (the caller filters; see
//!   `coordinator::state`).
//! - **Per node**, candidates are taken lowest priority first, then the most recently started
//!   (it has the least progress since its last save, and it is likely the shortest to save),
//!   until the job fits on that node as [`crate::feasible_nodes`] judges it (cores, memory and
//!   GPUs declared). A second pass gives back, newest first, any taken job the fit does not
//!   need (Kubernetes' "reprieve").
//! - **Across nodes**, the node whose highest displaced priority is lowest wins, then the one
//!   that displaces the fewest jobs, then the first by name (the view's order).
//!
//! A job that declared no cores, memory or GPUs reserves nothing and always fits: it never
//! preempts, and never needs to.

use crate::queue::Seconds;
use crate::{ClusterView, JobRequest, feasible_nodes};

/// A job is displaced only after running this long since its latest start (seconds): a start is
/// a save and a restore, so a job preempted at once would spend its time moving. The
/// coordinator's `preempt_min_run_s` default and govsim's rule.
pub const MIN_RUN_S: Seconds = 60.0;

/// A running job that may be saved to make room.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its id in the view (the job id for a single-member job).
    pub id: String,
    /// Index of its node in the view.
    pub node: usize,
    pub priority: i32,
    /// When it started (its latest start).
    pub started_at: Seconds,
    /// GPUs it holds there.
    pub gpus: Vec<u32>,
}

/// The jobs to save on one node so that the job fits there.
#[derive(Clone, Debug, PartialEq)]
pub struct Preemption {
    pub node: usize,
    pub victims: Vec<String>,
    pub reason: String,
}

/// The cheapest set of candidates on one node whose removal lets `job` fit, or `None`.
pub fn plan(
    cluster: &ClusterView,
    job: &JobRequest,
    candidates: &[Candidate],
) -> Option<Preemption> {
    if feasible_nodes(cluster, job).is_ok() {
        return None; // it fits without displacing anyone
    }
    let mut best: Option<(i32, usize, usize, Vec<String>)> = None;
    for (i, node) in cluster.nodes.iter().enumerate() {
        if !node.schedulable || job.avoid.iter().any(|a| a == &node.name) {
            continue;
        }
        let mut on_node: Vec<&Candidate> = candidates
            .iter()
            .filter(|c| c.node == i && c.priority < job.priority)
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
        let fits = |taken: &[&Candidate]| {
            let mut alone = ClusterView {
                nodes: vec![node.clone()],
            };
            for c in taken {
                alone.unreserve(0, &c.id, &c.gpus);
            }
            feasible_nodes(&alone, job).is_ok()
        };
        let mut taken: Vec<&Candidate> = Vec::new();
        for c in on_node {
            taken.push(c);
            if fits(&taken) {
                break;
            }
        }
        if !fits(&taken) {
            continue;
        }
        // Reprieve: give back, newest taken first, every job the fit does not need.
        for k in (0..taken.len()).rev() {
            let mut without = taken.clone();
            without.remove(k);
            if fits(&without) {
                taken = without;
            }
        }
        let highest = taken.iter().map(|c| c.priority).max().unwrap_or(i32::MIN);
        let key = (highest, taken.len(), i);
        if best.as_ref().is_none_or(|b| key < (b.0, b.1, b.2)) {
            best = Some((
                highest,
                taken.len(),
                i,
                taken.iter().map(|c| c.id.clone()).collect(),
            ));
        }
    }
    let (highest, _, node, victims) = best?;
    let reason = format!(
        "{} of priority {} does not fit anywhere; saving {} (priority {highest} at most) on {} makes room",
        job.id,
        job.priority,
        victims.join(", "),
        cluster.nodes[node].name
    );
    Some(Preemption {
        node,
        victims,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use crate::{JobView, NodeView};

    fn running(id: &str, cores: f64) -> JobView {
        let mut j = JobView::running(id, governor_policy::Category::Progressing, cores);
        j.requested_cores = Some(cores);
        j
    }

    fn urgent(cores: f64) -> JobRequest {
        JobRequest {
            id: "urgent".into(),
            gpus: 0,
            cores: Some(cores),
            memory_bytes: None,
            priority: 10,
            avoid: Vec::new(),
        }
    }

    fn candidate(id: &str, node: usize, priority: i32, started_at: Seconds) -> Candidate {
        Candidate {
            id: id.into(),
            node,
            priority,
            started_at,
            gpus: Vec::new(),
        }
    }

    #[test]
    fn the_lowest_priority_then_newest_job_makes_room_and_no_more_than_needed() {
        let c = cluster(vec![
            NodeView::new("a", 4.0, 8 * GIB)
                .with_job(running("old", 2.0))
                .with_job(running("new", 2.0)),
            NodeView::new("b", 4.0, 8 * GIB)
                .with_job(running("vip", 2.0))
                .with_job(running("mid", 2.0)),
        ]);
        let cands = vec![
            candidate("old", 0, 0, 10.0),
            candidate("new", 0, 0, 50.0),
            candidate("vip", 1, 5, 10.0),
            candidate("mid", 1, 1, 20.0),
        ];
        let p = plan(&c, &urgent(2.0), &cands).unwrap();
        assert_eq!(
            (p.node, p.victims.clone()),
            (0, vec!["new".to_owned()]),
            "{p:?}"
        );
        assert!(p.reason.contains("saving new"), "{}", p.reason);

        // Needing the whole node takes both jobs on a (priority 0) rather than b's.
        let p = plan(&c, &urgent(4.0), &cands).unwrap();
        assert_eq!(p.node, 0);
        assert_eq!(p.victims.len(), 2);
    }

    #[test]
    fn a_taken_job_the_fit_does_not_need_is_given_back() {
        // Lowest priority first takes the small job, then the big one; the big one alone is
        // enough, so the small one stays.
        let c = cluster(vec![
            NodeView::new("a", 4.0, 8 * GIB)
                .with_job(running("small", 1.0))
                .with_job(running("big", 3.0)),
        ]);
        let cands = vec![candidate("small", 0, 0, 10.0), candidate("big", 0, 1, 10.0)];
        let p = plan(&c, &urgent(3.0), &cands).unwrap();
        assert_eq!(p.victims, vec!["big".to_owned()]);
    }

    #[test]
    fn no_preemption_for_equal_priorities_for_too_little_or_for_an_unschedulable_node() {
        let mut down = NodeView::new("down", 4.0, 8 * GIB).with_job(running("x", 4.0));
        down.schedulable = false;
        let c = cluster(vec![
            NodeView::new("a", 4.0, 8 * GIB).with_job(running("peer", 4.0)),
            NodeView::new("b", 2.0, 8 * GIB).with_job(running("low", 2.0)),
            down,
        ]);
        let cands = vec![
            candidate("peer", 0, 10, 1.0),
            candidate("low", 1, 0, 1.0),
            candidate("x", 2, 0, 1.0),
        ];
        // Equal priority on a, too small a node at b, c down.
        assert_eq!(plan(&c, &urgent(3.0), &cands), None);
        // A job that declared nothing fits anywhere and preempts nothing.
        let mut nothing = urgent(0.0);
        nothing.cores = None;
        assert_eq!(plan(&c, &nothing, &cands), None);
    }
}
