//! `spread`: the papers' baseline placement, the default schedulers they compare with (Docker
//! Swarm's `spread` strategy in FlowCon, Kubernetes' default scheduler in SpeCon and ProCon),
//! behind the coordinator's own [`PlacementPolicy`] trait so the simulator drives it exactly
//! like the real policies.
//!
//! Rule: among the nodes that can take the job ([`feasible_nodes`], the coordinator's filter),
//! the one running the fewest jobs (placed-but-unreported ones included, like Swarm's container
//! count), ties to the least CPU in use, then to the first by name. With jobs that never request
//! CPU (the papers' containers had no requests) Kubernetes' least-allocated scoring degenerates
//! to the same balance by count, which is what SpeCon's evaluation used explicitly ("workload
//! evenly distributed based on the number of containers").
//!
//! These are baselines, not policies under comparison. They sit beside the others (and the
//! coordinator offers them) because govsim evaluates the coordinator's own planner, which builds
//! its placement policy by name ([`crate::by_name`]).

use crate::{ClusterView, JobRequest, NoFit, Placement, PlacementPolicy, feasible_nodes, finish};

/// Fewest jobs first.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread;

impl PlacementPolicy for Spread {
    fn name(&self) -> &'static str {
        "spread"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        let mut ranked: Vec<(usize, usize, f64)> = feasible
            .iter()
            .map(|&i| {
                let n = &cluster.nodes[i];
                (i, n.jobs().len(), utilisation(n.cpu_used_cores, n.cores))
            })
            .collect();
        ranked.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)).then(a.0.cmp(&b.0)));
        let ranked: Vec<(usize, f64)> = ranked
            .iter()
            .map(|&(i, jobs, _)| (i, jobs as f64))
            .collect();
        Ok(finish(
            cluster,
            job,
            &ranked,
            |n| {
                format!(
                    "{} jobs, CPU {:.0}% in use",
                    n.jobs().len(),
                    100.0 * utilisation(n.cpu_used_cores, n.cores)
                )
            },
            |n, jobs| format!("spread: {} runs the fewest jobs ({jobs})", n.name),
        ))
    }
}

/// `usage`: the default scheduler as the papers describe it when they explain its mistakes,
/// placing by *instant resource usage* (ProCon §7: "default scheduler prioritizes the worker
/// based on instant resource usage when the incoming job arrives", which put 6 of 15 jobs on one
/// worker and 2 on another; FlowCon §6.4: Docker Swarm reads the workers' periodic reports, so
/// "the manager still reads the Worker-4's report from the previous round" and misses the job it
/// just placed).
///
/// Rule: among the feasible nodes, the lowest CPU utilisation in the latest report (cores in
/// use over cores, rounded to whole percent as kube-scheduler's integer scores are), ties to the
/// lowest memory utilisation, then to the first by name. A job placed but not yet reported adds
/// nothing: neither usage nor count (so arrivals within one report period land on the same idle
/// node). Job counts never break ties (that would turn it back into `spread`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage;

impl PlacementPolicy for Usage {
    fn name(&self) -> &'static str {
        "usage"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        let mut ranked: Vec<(usize, f64, f64)> = feasible
            .iter()
            .map(|&i| {
                let n = &cluster.nodes[i];
                (
                    i,
                    (100.0 * utilisation(n.cpu_used_cores, n.cores)).round(),
                    utilisation(n.memory_used_bytes as f64, n.memory_bytes as f64),
                )
            })
            .collect();
        ranked.sort_by(|a, b| {
            a.1.total_cmp(&b.1)
                .then(a.2.total_cmp(&b.2))
                .then(a.0.cmp(&b.0))
        });
        let ranked: Vec<(usize, f64)> = ranked.iter().map(|&(i, cpu, _)| (i, cpu)).collect();
        Ok(finish(
            cluster,
            job,
            &ranked,
            |n| {
                format!(
                    "CPU {:.0}%, memory {:.0}% in use",
                    100.0 * utilisation(n.cpu_used_cores, n.cores),
                    100.0 * utilisation(n.memory_used_bytes as f64, n.memory_bytes as f64)
                )
            },
            |n, cpu| format!("usage: {} reported the lowest CPU use ({cpu:.0}%)", n.name),
        ))
    }
}

/// `used / total`, 0 for a node that reports no capacity.
fn utilisation(used: f64, total: f64) -> f64 {
    if total > 0.0 { used / total } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JobView, NodeView, by_name};
    use governor_policy::Category;

    #[test]
    fn the_node_with_fewest_jobs_wins_then_the_least_loaded() {
        let mut a = NodeView::new("a", 4.0, 1 << 34);
        a.jobs_mut()
            .push(JobView::running("x", Category::Progressing, 2.0));
        let mut b = NodeView::new("b", 4.0, 1 << 34);
        b.cpu_used_cores = 3.0;
        let c = NodeView::new("c", 4.0, 1 << 34);
        let view = ClusterView {
            nodes: vec![a, b, c],
        };
        let p = Spread.place(&view, &JobRequest::new("j", 0)).unwrap();
        assert_eq!(view.nodes[p.node].name, "c", "{}", p.reason);
    }

    #[test]
    fn infeasible_nodes_are_never_chosen() {
        let view = ClusterView {
            nodes: vec![
                NodeView::new("a", 4.0, 1 << 34),
                NodeView::new("b", 4.0, 1 << 34).with_gpus(2, "T4", 1 << 34),
            ],
        };
        let p = Spread.place(&view, &JobRequest::new("j", 2)).unwrap();
        assert_eq!(p.node, 1);
        assert_eq!(p.gpus, vec![0, 1]);
        assert!(Spread.place(&view, &JobRequest::new("j", 3)).is_err());
    }

    #[test]
    fn names_resolve_to_the_policies_and_the_baselines() {
        for name in [
            "spread",
            "soonest",
            "flowcon",
            "procon",
            "specon",
            "round-robin",
            "first-fit",
            "usage",
        ] {
            assert_eq!(by_name(name).unwrap().name(), name);
        }
        let e = by_name("nope").unwrap_err().to_string();
        assert!(e.contains("spread") && e.contains("soonest"), "{e}");
    }
}
