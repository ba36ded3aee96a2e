//! DRAGON (NTHU-LSALAB, "A Dynamic Scheduling and Scaling Controller for Managing Distributed
//! Deep Learning Jobs in Kubernetes Cluster"): the scheduler the Kubeflow write-up (seed 002)
//! builds on and compares against. Read from its README ("Scheduling and Scaling Strategies")
//! and its `pkg/controller.v1/DRAGON/scheduling/scheduling.go`:
//!
//! - **Queue**: its waiting queue in enqueue order; its TFJobs carry no priority, so none is
//!   read here ([`QueueOrder::Arrival`]).
//! - **Phase 1** (starvation): when the oldest waiting job has waited 30 s, running jobs are
//!   scaled down (any of them, never below their least size) until it fits at its least size;
//!   when that cannot make room, no job is admitted in that round (its phase 2 runs only
//!   without a starving job or after a successful scale-down).
//!   [`crate::elastic::Shrink::ForStarvingHead`].
//! - **Phase 2**: the first job in the queue that fits is placed, one per round.
//! - **Phase 3**: after 60 s without an admission, a resize or a starving job, running jobs
//!   scale up into free cores ([`crate::elastic::Grow::AfterQuiet`]).
//! - **Placement**: its `ScheduleJob` takes a node that holds every replica the job asks for
//!   (its parameter servers and its declared workers), else spreads them from the node that
//!   holds most. A job here is one member whose cores are its workers, so: a node that holds
//!   it. Which one is Go's map iteration order over the nodes, which Go randomises on every
//!   iteration: any node that holds the job, uniformly. Ours is that choice made reproducible,
//!   by a hash of the job's id over the nodes that hold it (taking the first by name instead
//!   would stack every small job on one node, which DRAGON does not do).
//! - **Start size**: the TFJob's `Worker.replicas`, between its `min-instances` and
//!   `max-instances`. Our jobs declare `--cores MIN:MAX` and nothing between, so a job starts at
//!   its least, the size we read as tf-operator's (which never resizes) too: what DRAGON adds
//!   over tf-operator is then its scaling, which is what the Kubeflow write-up compares. (Its
//!   README's example declares 4 workers with at most 4; reading the start as the most would
//!   make DRAGON's scale-up moot and the write-up's comparison with it empty.)
//! - **Gangs**: "DRAGON prefers to schedule all replicas within one node": one node first,
//!   then members where they fit (as the Kubeflow scheduler's fallback).

use super::elastic::Elasticity;
use super::queue::QueueOrder;
use super::{
    CANDIDATES_KEPT, ClusterView, JobRequest, NoFit, Placement, PlacementPolicy, feasible_nodes,
    finish,
};

/// DRAGON's placement. Stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dragon;

impl PlacementPolicy for Dragon {
    fn name(&self) -> &'static str {
        "dragon"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        let pick = (fnv1a(&job.id) % feasible.len() as u64) as usize;
        let mut ranked: Vec<(usize, f64)> = feasible
            .iter()
            .enumerate()
            .map(|(k, &i)| (i, ((k + feasible.len() - pick) % feasible.len()) as f64))
            .collect();
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
        ranked.truncate(CANDIDATES_KEPT);
        Ok(finish(
            cluster,
            job,
            &ranked,
            |_| {
                "order after the node drawn (Go's random map order, by a hash of the job id)".into()
            },
            |n, _| {
                format!(
                    "dragon: {} holds all its workers (drawn among the {} nodes that do, as Go's map order draws)",
                    n.name,
                    feasible.len()
                )
            },
        ))
    }

    fn queue_order(&self) -> QueueOrder {
        QueueOrder::Arrival
    }

    fn gangs_on_one_node(&self) -> bool {
        true
    }

    fn elasticity(&self) -> Elasticity {
        Elasticity::DRAGON
    }

    /// Its phase 2 places the first job that fits and stops.
    fn admits_per_round(&self) -> Option<usize> {
        Some(1)
    }
}

/// FNV-1a over the id's bytes: a stable stand-in for Go's random map order.
fn fnv1a(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeView;
    use crate::queue::{Queue, QueuedJob};
    use crate::testing::*;

    #[test]
    fn a_job_goes_to_a_node_that_holds_it_drawn_by_its_id_not_always_the_first() {
        let c = cluster(vec![
            NodeView::new("n1", 2.0, 16 * GIB),
            NodeView::new("n2", 4.0, 16 * GIB),
            NodeView::new("n3", 8.0, 16 * GIB),
        ]);
        let wants = |id: &str, cores: f64| JobRequest {
            cores: Some(cores),
            ..JobRequest::new(id, 0)
        };
        let mut chosen = std::collections::BTreeSet::new();
        for k in 0..30 {
            let id = format!("j{k}");
            let p = Dragon.place(&c, &wants(&id, 3.0)).unwrap();
            assert!(p.node >= 1, "n1 does not hold 3 cores: {p:?}");
            assert!(p.reason.contains("holds all its workers"), "{}", p.reason);
            assert_eq!(
                Dragon.place(&c, &wants(&id, 3.0)).unwrap().node,
                p.node,
                "stable"
            );
            chosen.insert(p.node);
            chosen.insert(Dragon.place(&c, &wants(&id, 1.0)).unwrap().node);
        }
        assert_eq!(
            chosen.len(),
            3,
            "small jobs are spread over every node: {chosen:?}"
        );
        assert!(Dragon.place(&c, &wants("big", 9.0)).is_err());
    }

    #[test]
    fn its_queue_is_arrival_order_whatever_the_priority() {
        let mut c = cluster(vec![NodeView::new("n1", 0.5, GIB)]);
        let mut q = Queue::new();
        for (id, priority, seq) in [("first", 0, 1), ("urgent", 10, 2), ("third", 0, 3)] {
            q.push(QueuedJob {
                cores: Some(1.0),
                ..QueuedJob::new(id, priority, seq, 0.0)
            });
        }
        q.admit(0.0, &mut c, &mut Dragon);
        let order: Vec<&str> = q.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(order, ["first", "urgent", "third"]);
    }
}
