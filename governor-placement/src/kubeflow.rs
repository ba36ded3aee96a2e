//! The Kubeflow scheduler after DRAGON and OASIS (seed 002): its queue order and its gang step.
//!
//! - **Queue** ("Weighting Algorithm"): a job goes before every queued job of lower utility,
//!   and before those of equal utility that need less CPU + memory. We read utility as the
//!   job's priority (the write-up: "jobs that have been assigned high priority by users,
//!   regardless of its resource requirements") and the requirement as cores + GiB of memory
//!   (the write-up adds CPU and memory without units). [`crate::queue::QueueOrder::KubeflowWeight`].
//! - **Gang scheduling**: first a node that can hold every worker of the job at once; failing
//!   that, "schedule all r in the first available node" / "schedule the workers in a regular
//!   manner" (its §Gang Scheduling): each member on the first node by name that fits it, with
//!   the members before it reserved, so members may share a node as Kubernetes' pods do (our
//!   other policies keep a gang's members on distinct nodes).
//! - **Placement** of a single job: the first node by name that fits (its "first feasible
//!   job ... first available node"; Adapted First Come First Served is the queue's).
//! - Its scale-up into residual resources and its scale-down for a higher-priority job act on
//!   elastic jobs (`govctl submit --cores MIN:MAX`, [`crate::elastic::Elasticity::KUBEFLOW`]);
//!   a rigid job it cannot shrink is displaced by the coordinator's preemption by checkpoint
//!   (`governor_placement::preempt`).
//! - **Its round** ("Scheduling Algorithm"): one job is admitted per round (the loop places the
//!   first job that fits and returns, [`PlacementPolicy::admits_per_round`]), so the scale-up
//!   runs only in a round that admitted none; the scale-down is tried only for the first
//!   waiting job and only when the highest waiting utility exceeds the highest running one
//!   (`U > u`, lines 3-5): a waiting job of the same priority as a running one never shrinks
//!   anybody. The planner carries both out (`governor_planner`'s elastic round).

use super::queue::QueueOrder;
use super::{ClusterView, JobRequest, NoFit, Placement, PlacementPolicy, first_fit::FirstFit};

/// The Kubeflow scheduler's placement. Stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kubeflow;

impl PlacementPolicy for Kubeflow {
    fn name(&self) -> &'static str {
        "kubeflow"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let mut p = FirstFit.place(cluster, job)?;
        p.reason = p
            .reason
            .replace("first-fit:", "kubeflow: first available node:");
        Ok(p)
    }

    fn queue_order(&self) -> QueueOrder {
        QueueOrder::KubeflowWeight
    }

    fn gangs_on_one_node(&self) -> bool {
        true
    }

    /// Its scale-up after every round, its scale-down for higher weights only.
    fn elasticity(&self) -> crate::elastic::Elasticity {
        crate::elastic::Elasticity::KUBEFLOW
    }

    /// Its scheduling loop places one job and returns (lines 18-22 of "Scheduling Algorithm").
    fn admits_per_round(&self) -> Option<usize> {
        Some(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeView;
    use crate::queue::{Queue, QueuedJob};
    use crate::testing::*;

    fn job(id: &str, priority: i32, seq: u64, cores: f64, memory_gib: u64) -> QueuedJob {
        QueuedJob {
            cores: Some(cores),
            memory_bytes: Some(memory_gib * GIB),
            ..QueuedJob::new(id, priority, seq, 0.0)
        }
    }

    #[test]
    fn the_queue_weighs_utility_then_demand_then_arrival() {
        // Nothing fits: every job stays queued, in the scheduler's order.
        let mut c = cluster(vec![NodeView::new("n1", 0.5, GIB)]);
        let mut q = Queue::new();
        q.push(job("small", 0, 1, 1.0, 1));
        q.push(job("big", 0, 2, 8.0, 16));
        q.push(job("urgent-small", 5, 3, 2.0, 2));
        q.push(job("mid", 0, 4, 2.0, 4));
        q.push(job("mid-later", 0, 5, 2.0, 4));
        q.admit(0.0, &mut c, &mut Kubeflow);
        let order: Vec<&str> = q.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(order, ["urgent-small", "big", "mid", "mid-later", "small"]);
        // Back to FIFO under another policy.
        q.admit(1.0, &mut c, &mut FirstFit);
        let order: Vec<&str> = q.iter().map(|j| j.id.as_str()).collect();
        assert_eq!(order, ["urgent-small", "small", "big", "mid", "mid-later"]);
    }

    #[test]
    fn a_gang_goes_on_one_node_when_one_holds_it_else_spreads() {
        let mut c = cluster(vec![
            NodeView::new("n1", 2.0, 16 * GIB),
            NodeView::new("n2", 8.0, 32 * GIB),
            NodeView::new("n3", 2.0, 16 * GIB),
        ]);
        let mut q = Queue::new();
        q.push(QueuedJob {
            replicas: 3,
            ..job("gang", 0, 1, 2.0, 4)
        });
        let r = q.admit(0.0, &mut c, &mut Kubeflow);
        let nodes: Vec<usize> = r.admitted[0].members.iter().map(|m| m.node).collect();
        assert_eq!(nodes, [1, 1, 1], "all three workers on n2");
        assert!(r.admitted[0].members[0].reason.contains("gang on one node"));

        // No node holds 3 x 2 cores now (n2 has 2 left): one member per node.
        q.push(QueuedJob {
            replicas: 3,
            ..job("spread", 0, 2, 2.0, 1)
        });
        let r = q.admit(1.0, &mut c, &mut Kubeflow);
        let nodes: Vec<usize> = r.admitted[0].members.iter().map(|m| m.node).collect();
        assert_eq!(nodes, [0, 1, 2]);

        // Regular placement may put several members on one node: 4 members of 2 cores on 3
        // nodes none of which holds all 4.
        let three_nodes = || {
            cluster(vec![
                NodeView::new("n1", 4.0, 32 * GIB),
                NodeView::new("n2", 4.0, 32 * GIB),
                NodeView::new("n3", 2.0, 32 * GIB),
            ])
        };
        let mut c4 = three_nodes();
        let mut q4 = Queue::new();
        q4.push(QueuedJob {
            replicas: 4,
            ..job("four", 0, 1, 2.0, 1)
        });
        let r = q4.admit(0.0, &mut c4, &mut Kubeflow);
        let nodes: Vec<usize> = r.admitted[0].members.iter().map(|m| m.node).collect();
        assert_eq!(nodes, [0, 0, 1, 1], "first available node for each member");
        let mut c4 = three_nodes();
        q4.push(QueuedJob {
            replicas: 4,
            ..job("four-apart", 0, 2, 2.0, 1)
        });
        let r = q4.admit(1.0, &mut c4, &mut FirstFit);
        assert!(
            r.admitted.is_empty() && q4.iter().count() == 1,
            "our gangs keep one member per node: 4 do not fit on 3 nodes"
        );

        // Other policies keep the members on distinct nodes.
        let mut c = cluster(vec![
            NodeView::new("n1", 8.0, 32 * GIB),
            NodeView::new("n2", 8.0, 32 * GIB),
        ]);
        q.push(QueuedJob {
            replicas: 2,
            ..job("apart", 0, 3, 1.0, 1)
        });
        let r = q.admit(2.0, &mut c, &mut FirstFit);
        let nodes: Vec<usize> = r.admitted[0].members.iter().map(|m| m.node).collect();
        assert_eq!(nodes, [0, 1]);
    }
}
