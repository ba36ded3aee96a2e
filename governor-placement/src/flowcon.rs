//! FlowCon, Algorithm 4: "Container Placement for Incoming c_j on Manager".
//!
//! FlowCon sorts each worker's containers into three lists by growth efficiency
//! G = P / R (progress per second per unit of resource, Eq. 1-2): NL (new, growing fast), WL
//! (watching) and CL (completing). For an incoming container the manager:
//!
//! 1. (lines 2-5) if some worker runs only CL containers, hosts the job there, choosing among
//!    such workers the one with the fewest containers ("the algorithm selects w_i with minimum
//!    number of active containers": the new job is then prioritised over the converged ones by
//!    the worker's Algorithm 1);
//! 2. (lines 6-13) otherwise scores every worker with
//!    `S = (|NL| + 1)·D_NL + |WL|·D_WL + |CL|·D_CL`, where `D_X` is the sum of G over the
//!    worker's containers in list X, and hosts the job on the worker with the smallest S.
//!
//! Readings we took where the paper is ambiguous:
//! - Lines 3-5 sit inside the `for w_i` loop, which read literally would host the job on the
//!   first all-CL worker met and then keep looping; the prose says "select w_i with minimum
//!   number of active containers", so we take the all-CL branch when *any* worker is all-CL and
//!   choose the one with the fewest containers among them.
//! - A worker with no containers is all-CL (vacuously) with zero containers, so empty workers are
//!   chosen first. This matches the prose's intent (the new job competes with nobody).
//! - `|NL + 1|` in line 10 is `|NL| + 1` ("For NL, FlowCon add 1 to assume that the incoming
//!   container is assigned to this worker").
//! - Jobs the node has not categorised yet (and jobs the coordinator placed that no report has
//!   shown yet) are in NL: Algorithm 2 inserts every new container into NL, and Section 6 says
//!   the manager counts the incoming container in NL until the next report, "assuming that it
//!   would be a fast growing one". Their G is not measured yet; counting it as 0 would make a
//!   node whose jobs all just started score ~0, the minimum, and every arrival until the next
//!   report would pile onto it (the failure fixed for ProCon, where a job without epoch data
//!   counted as 0 remaining). We count such a job as fast growing: the largest G measured among
//!   the NL jobs of the candidate nodes (0 when none is measured anywhere).
//! - G is the node's per-CPU growth efficiency (the node reports G for CPU, the resource it
//!   governs). Different jobs' G are in different units (loss per core-second vs accuracy per
//!   core-second); the paper sums them anyway and so do we.
//! - Ties go to the first worker by name.

use super::{
    ClusterView, JobRequest, NoFit, Placement, PlacementPolicy, choose_min, feasible_nodes,
};
use governor_policy::Category;

/// FlowCon's placement (Algorithm 4). Stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct FlowCon;

/// A worker's lists as Algorithm 4 sees them: sizes and sums of growth efficiency.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Lists {
    pub nl: usize,
    pub d_nl: f64,
    pub wl: usize,
    pub d_wl: f64,
    pub cl: usize,
    pub d_cl: f64,
}

impl Lists {
    /// The lists of `node`, counting a job whose G is not measured yet as `assumed_g`.
    pub fn of(node: &super::NodeView, assumed_g: f64) -> Lists {
        let mut l = Lists::default();
        for j in &node.jobs {
            let g = j.growth_efficiency.unwrap_or(assumed_g);
            match j.category {
                Category::Unknown | Category::Progressing => {
                    l.nl += 1;
                    l.d_nl += g;
                }
                Category::Watching => {
                    l.wl += 1;
                    l.d_wl += g;
                }
                Category::Converged => {
                    l.cl += 1;
                    l.d_cl += g;
                }
            }
        }
        l
    }

    /// Algorithm 4, line 10: `(|NL| + 1)·D_NL + |WL|·D_WL + |CL|·D_CL`.
    pub fn score(&self) -> f64 {
        (self.nl as f64 + 1.0) * self.d_nl + self.wl as f64 * self.d_wl + self.cl as f64 * self.d_cl
    }
}

/// The G an unmeasured job is assumed to have ("fast growing"): the largest G measured among
/// the NL jobs of `nodes`.
pub fn assumed_growth<'a>(nodes: impl Iterator<Item = &'a super::NodeView>) -> f64 {
    nodes
        .flat_map(|n| &n.jobs)
        .filter(|j| matches!(j.category, Category::Unknown | Category::Progressing))
        .filter_map(|j| j.growth_efficiency)
        .filter(|g| g.is_finite())
        .fold(0.0, f64::max)
}

/// Algorithm 4, line 10, with unmeasured jobs counted as `assumed_g`.
pub fn score(node: &super::NodeView, assumed_g: f64) -> f64 {
    Lists::of(node, assumed_g).score()
}

impl PlacementPolicy for FlowCon {
    fn name(&self) -> &'static str {
        "flowcon"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        let all_cl: Vec<usize> = feasible
            .iter()
            .copied()
            .filter(|&i| {
                cluster.nodes[i]
                    .jobs
                    .iter()
                    .all(|j| j.category == Category::Converged)
            })
            .collect();
        if !all_cl.is_empty() {
            return Ok(choose_min(
                cluster,
                job,
                &all_cl,
                |n| n.jobs.len() as f64,
                |n| format!("{} jobs, all converged (CL)", n.jobs.len()),
                |n, _| {
                    format!(
                        "flowcon: every job on {} is converged (CL) and it has the fewest ({}) of such nodes",
                        n.name,
                        n.jobs.len()
                    )
                },
            ));
        }
        let assumed = assumed_growth(feasible.iter().map(|&i| &cluster.nodes[i]));
        Ok(choose_min(
            cluster,
            job,
            &feasible,
            |n| score(n, assumed),
            |n| {
                let l = Lists::of(n, assumed);
                format!(
                    "NL {} (D {:.3}), WL {} (D {:.3}), CL {} (D {:.3})",
                    l.nl, l.d_nl, l.wl, l.d_wl, l.cl, l.d_cl
                )
            },
            |n, s| {
                format!(
                    "flowcon: no node runs only converged jobs; {} has the lowest score (|NL|+1)·D_NL+|WL|·D_WL+|CL|·D_CL = {s:.3}",
                    n.name
                )
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobView;
    use crate::testing::*;
    use Category::*;

    #[test]
    fn an_all_converged_node_wins_and_the_smallest_one_among_them() {
        let c = cluster(vec![
            node("w1", vec![job_g("a", Progressing, 0.01)]),
            node(
                "w2",
                vec![job_g("b", Converged, 0.0), job_g("c", Converged, 0.0)],
            ),
            node("w3", vec![job_g("d", Converged, 0.0)]),
        ]);
        let p = FlowCon.place(&c, &JobRequest::new("new", 0)).unwrap();
        assert_eq!(chosen(&c, &p), "w3");
        assert!(p.reason.contains("converged"), "{}", p.reason);
    }

    #[test]
    fn an_empty_node_counts_as_all_converged_with_no_jobs() {
        let c = cluster(vec![
            node("w1", vec![job_g("b", Converged, 0.0)]),
            node("w2", vec![]),
        ]);
        let p = FlowCon.place(&c, &JobRequest::new("new", 0)).unwrap();
        assert_eq!(chosen(&c, &p), "w2");
    }

    #[test]
    fn otherwise_the_growth_efficiency_score_decides() {
        // w1: NL {0.4}, CL {0.1}      -> (1+1)*0.4 + 1*0.1          = 0.9
        // w2: NL {0.1, 0.1}, WL {0.2} -> (2+1)*0.2 + 1*0.2          = 0.8
        // w3: WL {0.3, 0.2}           -> (0+1)*0   + 2*0.5          = 1.0
        let c = cluster(vec![
            node(
                "w1",
                vec![job_g("a", Progressing, 0.4), job_g("b", Converged, 0.1)],
            ),
            node(
                "w2",
                vec![
                    job_g("c", Progressing, 0.1),
                    job_g("d", Progressing, 0.1),
                    job_g("e", Watching, 0.2),
                ],
            ),
            node(
                "w3",
                vec![job_g("f", Watching, 0.3), job_g("g", Watching, 0.2)],
            ),
        ]);
        let scores: Vec<f64> = c.nodes.iter().map(|n| score(n, 0.4)).collect();
        for (got, want) in scores.iter().zip([0.9, 0.8, 1.0]) {
            assert!((got - want).abs() < 1e-9, "scores {scores:?}");
        }
        let p = FlowCon.place(&c, &JobRequest::new("new", 0)).unwrap();
        assert_eq!(chosen(&c, &p), "w2");
        assert_eq!(p.candidates.len(), 3);
        assert_eq!(p.candidates[0].node, "w2");
        assert!(p.candidates[0].note.contains("NL 2"), "{:?}", p.candidates);
    }

    #[test]
    fn a_pending_placement_counts_in_nl() {
        // Two identical nodes; the first already got a job placed a moment ago (pending, G
        // unknown). The pending job is in NL, which raises (|NL|+1) on w1: the next job goes to w2.
        let req = JobRequest::new("x", 0);
        let c = cluster(vec![
            node(
                "w1",
                vec![job_g("a", Progressing, 0.2), JobView::pending("p", &req)],
            ),
            node("w2", vec![job_g("b", Progressing, 0.2)]),
        ]);
        let p = FlowCon.place(&c, &JobRequest::new("new", 0)).unwrap();
        assert_eq!(chosen(&c, &p), "w2");
    }

    #[test]
    fn ties_go_to_the_first_node_by_name() {
        let c = cluster(vec![
            node("w1", vec![job_g("a", Watching, 0.2)]),
            node("w2", vec![job_g("b", Watching, 0.2)]),
        ]);
        assert_eq!(
            chosen(&c, &FlowCon.place(&c, &JobRequest::new("n", 0)).unwrap()),
            "w1"
        );
    }

    #[test]
    fn jobs_not_measured_yet_count_as_fast_growing_so_arrivals_do_not_pile_up() {
        // w1's jobs all just started (no G yet), w2's learn at 0.3 and 0.1. Counted as 0, w1
        // would score 0 and take every arrival until the next report; counted as fast growing
        // (the largest NL G, 0.3), w1 scores (2+1)*0.6 = 1.8 and w2 (2+1)*0.4 = 1.2.
        let req = JobRequest::new("x", 0);
        let c = cluster(vec![
            node("w1", vec![job("a", Unknown), JobView::pending("p", &req)]),
            node(
                "w2",
                vec![job_g("b", Progressing, 0.3), job_g("c", Progressing, 0.1)],
            ),
        ]);
        assert!((assumed_growth(c.nodes.iter()) - 0.3).abs() < 1e-12);
        let p = FlowCon.place(&c, &JobRequest::new("new", 0)).unwrap();
        assert_eq!(chosen(&c, &p), "w2");
    }
}
