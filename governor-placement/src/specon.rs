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
//!   current host, so only lines 2-7 and 11-21 apply. [`SpeCon::move_target`] implements
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
pub enum MoveDecision {
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
    pub fn move_target(
        &self,
        cluster: &ClusterView,
        job: &JobRequest,
        current: usize,
    ) -> Result<MoveDecision, NoFit> {
        let mut nodes = feasible_nodes(cluster, job).unwrap_or_default();
        if !nodes.contains(&current) {
            nodes.push(current);
            nodes.sort_unstable();
        }
        let (ranked, _) = self.ranked(cluster, &nodes);
        let min = Self::key(ranked[0].1);
        if Self::key(self.score(&cluster.nodes[current])) == min {
            return Ok(MoveDecision::Stay);
        }
        Ok(MoveDecision::MoveTo(finish(
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

/// A job Algorithm 2 has processed ("marked as migrated" at `marked_at`, on `node` where it now
/// runs): Algorithm 3's set D. Its converged duration is `now - marked_at`.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvergedJob {
    pub job: String,
    pub node: usize,
    pub marked_at: f64,
}

/// One move of Algorithm 3.
#[derive(Clone, Debug, PartialEq)]
pub struct Rebalance {
    pub job: String,
    pub from: usize,
    pub to: usize,
    pub reason: String,
}

impl SpeCon {
    /// Algorithm 3 ("rebalancing by converged duration", on the manager): one round.
    ///
    /// With `|w|` the active jobs of a worker (pending placements included), the balance factor
    /// is `bf = ⌊Σ|w| / |W|⌋` over the schedulable workers. If some workers are idle, each idle
    /// worker with `|w| < bf` receives the job of D with the smallest converged duration (the
    /// most recently converged), lines 10-18. Otherwise the workers with `|w| < bf - 1` form T
    /// and one job (smallest converged duration, on a worker outside T) moves to the member of T
    /// with the fewest jobs, lines 19-31.
    ///
    /// Readings (docs/paper-readings in the repository's notes; the paper is silent on each):
    /// - Line 27 tests `|w_i|` of the *source*; "which has room for an additional container"
    ///   only makes sense of the target, so T is tested on the target.
    /// - The prose moves one job per round in the second branch; the first branch moves one
    ///   job per idle worker (its loop).
    /// - `can_take(job, node)` says whether the node has room for the job (cores, memory,
    ///   GPUs), which the paper assumes; a job that fits nowhere in T is skipped.
    /// - The caller decides how often rounds run (the paper gives no period; §VI-C2 shows it
    ///   firing after completions): govsim runs one after every departure and every round of
    ///   Algorithm 2.
    pub fn rebalance(
        cluster: &ClusterView,
        converged: &[ConvergedJob],
        can_take: impl Fn(&str, usize) -> bool,
    ) -> Vec<Rebalance> {
        let workers: Vec<usize> = (0..cluster.nodes.len())
            .filter(|&i| cluster.nodes[i].schedulable)
            .collect();
        if workers.is_empty() {
            return Vec::new();
        }
        let mut count: Vec<usize> = cluster.nodes.iter().map(|n| n.jobs().len()).collect();
        let sum: usize = workers.iter().map(|&i| count[i]).sum();
        let bf = sum / workers.len();
        // D, most recently converged first; only jobs still where D says they are.
        let mut d: Vec<&ConvergedJob> = converged
            .iter()
            .filter(|c| {
                cluster
                    .nodes
                    .get(c.node)
                    .is_some_and(|n| n.jobs().iter().any(|j| j.id == c.job && !j.pending))
            })
            .collect();
        d.sort_by(|a, b| b.marked_at.total_cmp(&a.marked_at).then(a.job.cmp(&b.job)));
        let mut moves = Vec::new();
        let idle: Vec<usize> = workers.iter().copied().filter(|&i| count[i] == 0).collect();
        if !idle.is_empty() {
            for w in idle {
                if count[w] >= bf {
                    continue;
                }
                let Some(pos) = d.iter().position(|c| c.node != w && can_take(&c.job, w)) else {
                    continue;
                };
                let c = d.remove(pos);
                count[c.node] -= 1;
                count[w] += 1;
                moves.push(Rebalance {
                    job: c.job.clone(),
                    from: c.node,
                    to: w,
                    reason: format!(
                        "specon rebalance: {} is idle (balance factor {bf}); {} converged most \
                         recently",
                        cluster.nodes[w].name, c.job
                    ),
                });
            }
            return moves;
        }
        let short: Vec<usize> = workers
            .iter()
            .copied()
            .filter(|&i| count[i] + 1 < bf)
            .collect();
        if short.is_empty() {
            return moves;
        }
        for c in d.iter().filter(|c| !short.contains(&c.node)) {
            let target = short
                .iter()
                .copied()
                .filter(|&w| can_take(&c.job, w))
                .min_by_key(|&w| (count[w], w));
            if let Some(w) = target {
                moves.push(Rebalance {
                    job: c.job.clone(),
                    from: c.node,
                    to: w,
                    reason: format!(
                        "specon rebalance: {} has {} jobs, below the balance factor {bf} - 1; \
                         {} converged most recently",
                        cluster.nodes[w].name, count[w], c.job
                    ),
                });
                break;
            }
        }
        moves
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

    fn converged(job: &str, node: usize, marked_at: f64) -> ConvergedJob {
        ConvergedJob {
            job: job.into(),
            node,
            marked_at,
        }
    }

    #[test]
    fn an_idle_worker_gets_the_most_recently_converged_job() {
        // 6 jobs on 3 workers (bf 2), w3 idle: it gets b (converged at 20, after a at 10).
        let c = cluster(vec![
            node(
                "w1",
                vec![
                    job("a", Converged),
                    job("x", Progressing),
                    job("y", Progressing),
                ],
            ),
            node(
                "w2",
                vec![
                    job("b", Converged),
                    job("z", Progressing),
                    job("v", Progressing),
                ],
            ),
            node("w3", vec![]),
        ]);
        let d = [converged("a", 0, 10.0), converged("b", 1, 20.0)];
        let moves = SpeCon::rebalance(&c, &d, |_, _| true);
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!(
            (moves[0].job.as_str(), moves[0].from, moves[0].to),
            ("b", 1, 2)
        );
        // A job that does not fit is skipped for the next one.
        let moves = SpeCon::rebalance(&c, &d, |job, _| job != "b");
        assert_eq!(moves[0].job, "a");
        // Jobs never processed by Algorithm 2 are not moved.
        assert!(SpeCon::rebalance(&c, &[], |_, _| true).is_empty());
    }

    #[test]
    fn without_idle_workers_one_job_moves_to_a_worker_below_bf_minus_one() {
        // 9 jobs on 3 workers: bf 3; w3 has 1 < bf - 1 = 2.
        let many = |p: &str, k: usize| -> Vec<JobView> {
            (0..k).map(|i| job(&format!("{p}{i}"), Converged)).collect()
        };
        let c = cluster(vec![
            node("w1", many("a", 4)),
            node("w2", many("b", 4)),
            node("w3", many("c", 1)),
        ]);
        let d = [
            converged("a0", 0, 5.0),
            converged("b0", 1, 7.0),
            converged("c0", 2, 9.0),
        ];
        let moves = SpeCon::rebalance(&c, &d, |_, _| true);
        // c0 converged last but is already on w3 (in T): b0 moves.
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!((moves[0].job.as_str(), moves[0].to), ("b0", 2));
        // Balanced enough (every worker at bf - 1 or more): nothing moves.
        let c = cluster(vec![
            node("w1", many("a", 4)),
            node("w2", many("b", 3)),
            node("w3", many("c", 2)),
        ]);
        assert!(SpeCon::rebalance(&c, &d, |_, _| true).is_empty());
    }

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
    fn the_papers_example_moves_job_14_to_worker_1() {
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
        match s.move_target(&c, &JobRequest::new("job-14", 0), 1).unwrap() {
            MoveDecision::MoveTo(p) => assert_eq!(chosen(&c, &p), "worker-1"),
            MoveDecision::Stay => panic!("job-14 should move to worker-1"),
        }
        // A job converged on worker-1, already the best: it stays (lines 8-10).
        assert_eq!(
            s.move_target(&c, &JobRequest::new("j", 0), 0).unwrap(),
            MoveDecision::Stay
        );
    }
}
