//! First-fit (Schedulearn's FIFO): the first node, in a fixed order, that can take the job.
//!
//! Schedulearn's `fifo(required_gpus)` walks the servers in a fixed list and returns the first
//! with enough available GPUs (a GPU is available when less than 90% of its memory is used; our
//! [`super::GpuView::is_free`] adds "and not reserved for a job"). Our fixed order is the node
//! name. The "FIFO" part (jobs in arrival order) is the coordinator's queue.

use super::elastic::Elasticity;
use super::{
    CANDIDATES_KEPT, ClusterView, JobRequest, NoFit, Placement, PlacementPolicy, feasible_nodes,
    finish,
};

/// First-fit. Stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstFit;

impl PlacementPolicy for FirstFit {
    fn name(&self) -> &'static str {
        "first-fit"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        let ranked: Vec<(usize, f64)> = feasible
            .iter()
            .take(CANDIDATES_KEPT)
            .enumerate()
            .map(|(k, &i)| (i, k as f64))
            .collect();
        Ok(finish(
            cluster,
            job,
            &ranked,
            |_| "position among the nodes that fit, by name".into(),
            |n, _| format!("first-fit: {} is the first node by name that fits", n.name),
        ))
    }

    /// Schedulearn's FIFO does not scale jobs.
    fn elasticity(&self) -> Elasticity {
        Elasticity::NONE
    }
}

/// Schedulearn's elastic FIFO: first-fit placement in arrival order, and on each completion the
/// longest-running elastic job grows ([`crate::elastic::grow_slowest`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ElasticFifo;

impl PlacementPolicy for ElasticFifo {
    fn name(&self) -> &'static str {
        "elastic-fifo"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let mut p = FirstFit.place(cluster, job)?;
        p.reason = p.reason.replace("first-fit:", "elastic-fifo: first fit:");
        Ok(p)
    }

    fn elasticity(&self) -> Elasticity {
        Elasticity::ELASTIC_FIFO
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeView;
    use crate::testing::*;

    #[test]
    fn the_first_node_with_enough_gpus_wins_like_schedulearns_fifo() {
        // Schedulearn's set-up: servers gpu3, gpu4, gpu5 with 4 GPUs each.
        let mut gpu3 = NodeView::new("gpu3", 48.0, 128 * GIB).with_gpus(4, "GTX 1080 Ti", 11 * GIB);
        for g in &mut gpu3.gpus[..2] {
            g.assigned = true;
        }
        let c = cluster(vec![
            gpu3,
            NodeView::new("gpu4", 48.0, 128 * GIB).with_gpus(4, "GTX 1080 Ti", 11 * GIB),
            NodeView::new("gpu5", 48.0, 128 * GIB).with_gpus(4, "GTX 1080 Ti", 11 * GIB),
        ]);
        let p = FirstFit.place(&c, &JobRequest::new("2gpu", 2)).unwrap();
        assert_eq!(
            (chosen(&c, &p).as_str(), p.gpus.clone()),
            ("gpu3", vec![2, 3])
        );
        let p = FirstFit.place(&c, &JobRequest::new("4gpu", 4)).unwrap();
        assert_eq!(chosen(&c, &p), "gpu4");
    }

    #[test]
    fn load_is_ignored() {
        let c = cluster(vec![
            node(
                "a",
                vec![job("x", governor_policy::Category::Progressing); 6],
            ),
            node("b", vec![]),
        ]);
        assert_eq!(
            chosen(&c, &FirstFit.place(&c, &JobRequest::new("n", 0)).unwrap()),
            "a"
        );
    }
}
