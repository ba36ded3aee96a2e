//! Round-robin (Schedulearn's RR): jobs go to the nodes in turn.
//!
//! Schedulearn describes RR as scheduling "based on the order of their arrival time and the
//! number of GPUs available" without pseudocode. Our reading: keep a cursor on the node chosen
//! last; the next job goes to the first node after it (by name, wrapping around) that can take
//! it. The cursor is a node name, not an index, so nodes joining or leaving do not reset the turn.

use super::{
    CANDIDATES_KEPT, ClusterView, JobRequest, NoFit, Placement, PlacementPolicy, feasible_nodes,
    finish,
};

/// Round-robin with its cursor.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    /// The node chosen last.
    last: Option<String>,
}

impl PlacementPolicy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        // First feasible node strictly after the cursor, else wrap to the first feasible node.
        let start = match &self.last {
            Some(last) => feasible
                .iter()
                .position(|&i| cluster.nodes[i].name.as_str() > last.as_str())
                .unwrap_or(0),
            None => 0,
        };
        let ranked: Vec<(usize, f64)> = feasible[start..]
            .iter()
            .chain(&feasible[..start])
            .take(CANDIDATES_KEPT)
            .enumerate()
            .map(|(turn, &i)| (i, turn as f64))
            .collect();
        let after = self.last.clone();
        let p = finish(
            cluster,
            job,
            &ranked,
            |_| "turns until this node".into(),
            |n, _| match after {
                Some(a) => format!(
                    "round-robin: {} is the next node after {a} that fits",
                    n.name
                ),
                None => format!("round-robin: {} is the first node that fits", n.name),
            },
        );
        self.last = Some(cluster.nodes[p.node].name.clone());
        Ok(p)
    }

    /// Schedulearn's round-robin does not scale jobs.
    fn elasticity(&self) -> crate::elastic::Elasticity {
        crate::elastic::Elasticity::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeView;
    use crate::testing::*;

    #[test]
    fn jobs_go_to_the_nodes_in_turn_and_wrap() {
        let c = cluster(vec![
            node("a", vec![]),
            node("b", vec![]),
            node("c", vec![]),
        ]);
        let mut rr = RoundRobin::default();
        let got: Vec<String> = (0..5)
            .map(|k| {
                chosen(
                    &c,
                    &rr.place(&c, &JobRequest::new(format!("j{k}"), 0)).unwrap(),
                )
            })
            .collect();
        assert_eq!(got, ["a", "b", "c", "a", "b"]);
    }

    #[test]
    fn nodes_that_do_not_fit_are_skipped_without_losing_the_turn() {
        let c = cluster(vec![
            NodeView::new("a", 4.0, 0).with_gpus(1, "T4", GIB),
            NodeView::new("b", 4.0, 0),
            NodeView::new("c", 4.0, 0).with_gpus(1, "T4", GIB),
        ]);
        let mut rr = RoundRobin::default();
        assert_eq!(
            chosen(&c, &rr.place(&c, &JobRequest::new("1", 0)).unwrap()),
            "a"
        );
        // A GPU job skips b.
        assert_eq!(
            chosen(&c, &rr.place(&c, &JobRequest::new("2", 1)).unwrap()),
            "c"
        );
        assert_eq!(
            chosen(&c, &rr.place(&c, &JobRequest::new("3", 0)).unwrap()),
            "a"
        );
    }

    #[test]
    fn the_turn_survives_the_last_node_leaving() {
        let mut rr = RoundRobin::default();
        let c = cluster(vec![
            node("a", vec![]),
            node("b", vec![]),
            node("c", vec![]),
        ]);
        rr.place(&c, &JobRequest::new("1", 0)).unwrap();
        rr.place(&c, &JobRequest::new("2", 0)).unwrap(); // b
        let c = cluster(vec![node("a", vec![]), node("c", vec![])]); // b left
        assert_eq!(
            chosen(&c, &rr.place(&c, &JobRequest::new("3", 0)).unwrap()),
            "c"
        );
    }
}
