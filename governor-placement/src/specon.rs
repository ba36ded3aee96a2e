//! SpeCon, Algorithm 2 ("Speculative Scheduling of c_j in w_i on Manager"), its scoring used for
//! placing incoming jobs.
//!
//! SpeCon scores every worker by the categories of its containers,
//! `S = |PC|·w_pc + |WC|·w_wc + |CC|·w_cc` with `w_pc > w_wc > w_cc` (the evaluation uses
//! `w_pc = 2, w_wc = 1.5, w_cc = 1`), puts the workers with the minimum score in the candidate set
//! T, and (lines 11-21) takes the only candidate, or, when several tie, the candidate with the
//! lowest resource consumption R(w, t).
//!
//! Readings we took:
//! - Algorithm 2 is written for *migrating* a converged container c_j off its host w_i; lines
//!   8-10 keep c_j where it is when w_i is among the candidates. For an incoming job there is no
//!   current host, so only lines 2-7 and 11-21 apply. [`SpeCon::migration_target`] implements
//!   the whole algorithm for the migration issue.
//! - New containers are in PC (Algorithm 1, line 2: every container joins PC when it arrives),
//!   so jobs the node has not categorised yet and pending placements count as PC.
//! - R(w, t) is not defined further; we use the share of the node's cores in use, then the share
//!   of its memory in use, then the node order (by name) to break the remaining ties.
//! - Scores are multiples of 0.5 with the paper's weights, so "minimum" is an exact comparison;
//!   with other weights we compare scores rounded to 1e-9.

use super::{
    ClusterView, JobRequest, NoFit, NodeView, Placement, PlacementPolicy, best_k, feasible_nodes,
    finish,
};

/// SpeCon's weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeCon {
    pub w_pc: f64,
    pub w_wc: f64,
    pub w_cc: f64,
}

impl Default for SpeCon {
    /// The weights of SpeCon's evaluation (Section VI): 2, 1.5 and 1.
    fn default() -> Self {
        SpeCon {
            w_pc: 2.0,
            w_wc: 1.5,
            w_cc: 1.0,
        }
    }
}

/// Where Algorithm 2 sends a converged job.
#[derive(Clone, Debug, PartialEq)]
pub enum MigrationTarget {
    /// Lines 8-10: its host is among the best; it stays (and is marked migrated).
    Stay,
    /// Lines 11-21: move it to this node (index in the view).
    MoveTo(Placement),
}

impl SpeCon {
    /// Line 3: the worker's weighted score.
    pub fn score(&self, node: &NodeView) -> f64 {
        let [unknown, pc, wc, cc] = node.category_counts();
        (unknown + pc) as f64 * self.w_pc + wc as f64 * self.w_wc + cc as f64 * self.w_cc
    }

    /// R(w, t): (CPU share in use, memory share in use).
    fn consumption(node: &NodeView) -> (f64, f64) {
        let cpu = if node.cores > 0.0 {
            node.cpu_used_cores / node.cores
        } else {
            0.0
        };
        let mem = if node.memory_bytes > 0 {
            node.memory_used_bytes as f64 / node.memory_bytes as f64
        } else {
            0.0
        };
        (cpu, mem)
    }

    /// Scores compared exactly: quantised to 1e-9 so that float noise from other weights does
    /// not split a tie (with the paper's weights scores are multiples of 0.5 anyway).
    fn key(score: f64) -> i64 {
        (score * 1e9).round() as i64
    }

    /// Lines 2-7 and 18: the best candidates by (score, R(w,t)), best first, and the size of
    /// the candidate set T (the nodes at the minimum score).
    fn ranked(&self, cluster: &ClusterView, nodes: &[usize]) -> (Vec<(usize, f64)>, usize) {
        let scored: Vec<(usize, f64, i64, (f64, f64))> = nodes
            .iter()
            .map(|&i| {
                let n = &cluster.nodes[i];
                let s = self.score(n);
                (i, s, Self::key(s), Self::consumption(n))
            })
            .collect();
        let min = scored.iter().map(|c| c.2).min().unwrap_or(0);
        let ties = scored.iter().filter(|c| c.2 == min).count();
        let best = best_k(
            scored,
            |c| c.0,
            |a, b| {
                a.2.cmp(&b.2)
                    .then(a.3.0.total_cmp(&b.3.0))
                    .then(a.3.1.total_cmp(&b.3.1))
            },
        );
        (best.into_iter().map(|c| (c.0, c.1)).collect(), ties)
    }

    /// Why a node scored what it did.
    fn note(node: &NodeView) -> String {
        let [u, pc, wc, cc] = node.category_counts();
        let (cpu, mem) = Self::consumption(node);
        format!(
            "PC {} WC {wc} CC {cc}; CPU {:.0}% memory {:.0}% in use",
            u + pc,
            cpu * 100.0,
            mem * 100.0
        )
    }

    /// The whole of Algorithm 2 for a job on node `current` (a converged job a node asked to
    /// move). Nodes that cannot take the job are left out, except its current host.
    pub fn migration_target(
        &self,
        cluster: &ClusterView,
        job: &JobRequest,
        current: usize,
    ) -> Result<MigrationTarget, NoFit> {
        let mut nodes = feasible_nodes(cluster, job).unwrap_or_default();
        if !nodes.contains(&current) {
            nodes.push(current);
            nodes.sort_unstable();
        }
        let (ranked, _) = self.ranked(cluster, &nodes);
        let min = Self::key(ranked[0].1);
        if Self::key(self.score(&cluster.nodes[current])) == min {
            return Ok(MigrationTarget::Stay);
        }
        Ok(MigrationTarget::MoveTo(finish(
            cluster,
            job,
            &ranked,
            Self::note,
            |n, s| {
                format!(
                    "specon: {} has the lowest weighted score {s} (and least resource use among ties)",
                    n.name
                )
            },
        )))
    }
}

impl PlacementPolicy for SpeCon {
    fn name(&self) -> &'static str {
        "specon"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        let (ranked, ties) = self.ranked(cluster, &feasible);
        let (w_pc, w_wc, w_cc) = (self.w_pc, self.w_wc, self.w_cc);
        Ok(finish(cluster, job, &ranked, Self::note, |n, s| {
            if ties == 1 {
                format!(
                    "specon: {} has the lowest score {w_pc}·|PC|+{w_wc}·|WC|+{w_cc}·|CC| = {s}",
                    n.name
                )
            } else {
                format!(
                    "specon: {ties} nodes tie at the lowest score {s}; {} uses the least CPU",
                    n.name
                )
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobView;
    use crate::testing::*;
    use Category::*;
    use governor_policy::Category;

    #[test]
    fn the_papers_scores_use_weights_2_1_5_1() {
        let n = node(
            "w",
            vec![
                job("a", Progressing),
                job("b", Watching),
                job("c", Converged),
                job("d", Converged),
                job("e", Unknown),
            ],
        );
        assert_eq!(SpeCon::default().score(&n), 2.0 * 2.0 + 1.5 + 2.0);
    }

    #[test]
    fn the_lowest_score_wins() {
        // w1: 2 PC = 4; w2: 3 CC = 3; w3: PC + WC = 3.5.
        let c = cluster(vec![
            node("w1", vec![job("a", Progressing), job("b", Progressing)]),
            node(
                "w2",
                vec![
                    job("c", Converged),
                    job("d", Converged),
                    job("e", Converged),
                ],
            ),
            node("w3", vec![job("f", Progressing), job("g", Watching)]),
        ]);
        let p = SpeCon::default()
            .place(&c, &JobRequest::new("n", 0))
            .unwrap();
        assert_eq!(chosen(&c, &p), "w2");
        assert_eq!(
            p.candidates.iter().map(|c| c.score).collect::<Vec<_>>(),
            vec![3.0, 3.5, 4.0]
        );
    }

    #[test]
    fn ties_go_to_the_node_using_the_least_cpu() {
        let mut w1 = node("w1", vec![job("a", Converged)]);
        w1.cpu_used_cores = 6.0;
        let mut w2 = node("w2", vec![job("b", Converged)]);
        w2.cpu_used_cores = 2.0;
        let c = cluster(vec![w1, w2]);
        let p = SpeCon::default()
            .place(&c, &JobRequest::new("n", 0))
            .unwrap();
        assert_eq!(chosen(&c, &p), "w2");
        assert!(p.reason.contains("2 nodes tie"), "{}", p.reason);
    }

    #[test]
    fn pending_jobs_count_as_progressing() {
        let req = JobRequest::new("x", 0);
        let c = cluster(vec![
            node("w1", vec![JobView::pending("p", &req)]),
            node("w2", vec![job("a", Watching)]),
        ]);
        let p = SpeCon::default()
            .place(&c, &JobRequest::new("n", 0))
            .unwrap();
        assert_eq!(chosen(&c, &p), "w2");
    }

    #[test]
    fn the_papers_migration_example_moves_job_14_to_worker_1() {
        // Section VI-D: when Job-14 on Worker-2 converged, the workers scored 63, 88, 92, 72 and
        // Job-14 went to Worker-1. Category mixes giving exactly those scores with 2/1.5/1:
        // 63 = 2·20 + 1.5·10 + 8; 88 = 2·30 + 1.5·12 + 10; 92 = 2·30 + 1.5·16 + 8;
        // 72 = 2·24 + 1.5·12 + 6.
        let mixed = |name: &str, pc: usize, wc: usize, cc: usize| {
            let mut jobs = Vec::new();
            for (cat, n) in [(Progressing, pc), (Watching, wc), (Converged, cc)] {
                for k in 0..n {
                    jobs.push(job(&format!("{name}-{cat}-{k}"), cat));
                }
            }
            NodeView {
                cores: 64.0,
                ..node(name, jobs)
            }
        };
        let c = cluster(vec![
            mixed("worker-1", 20, 10, 8),
            mixed("worker-2", 30, 12, 10),
            mixed("worker-3", 30, 16, 8),
            mixed("worker-4", 24, 12, 6),
        ]);
        let s = SpeCon::default();
        let scores: Vec<f64> = c.nodes.iter().map(|n| s.score(n)).collect();
        assert_eq!(scores, vec![63.0, 88.0, 92.0, 72.0]);
        match s
            .migration_target(&c, &JobRequest::new("job-14", 0), 1)
            .unwrap()
        {
            MigrationTarget::MoveTo(p) => assert_eq!(chosen(&c, &p), "worker-1"),
            MigrationTarget::Stay => panic!("job-14 should move to worker-1"),
        }
        // A job converged on worker-1, already the best: it stays (lines 8-10).
        assert_eq!(
            s.migration_target(&c, &JobRequest::new("j", 0), 0).unwrap(),
            MigrationTarget::Stay
        );
    }
}
