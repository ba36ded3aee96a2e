//! `soonest`, our placement: put the job where it is predicted to get the most CPU, so it
//! finishes soonest, and pack GPU jobs so that large GPU gangs still find whole nodes.
//!
//! What a new job will get on a node depends on *which* jobs the node runs (how much each takes
//! under the node's policy, how soon each ends) and how many cores the node has, not only on *how
//! many* jobs it runs. For each node that can take the job we predict its CPU share:
//!
//! ```text
//! background = max(0, CPU used on the node − CPU used by its jobs)       (not ours to govern)
//! available  = max(cores − background, 10% of cores)
//! claim(j)   = weight[category(j)] · soon(j)        weight = unknown 1, progressing 1,
//!                                                            watching 1, converged 0.92
//! soon(j)    = clamp(remaining(j) / horizon, 0.25, 1) when the job's epochs are known
//!              (remaining = epoch time · epochs left, ProCon's estimate), else 1
//! share      = available / (1 + Σ claim)            capped at the cores the job asked for
//! ```
//!
//! halved when the job's requested memory would take the node past 90% of its memory. The weights
//! are what a job of each category takes beside the newcomer under the default node policy,
//! `learning-first`: a learning job its fair share (it does not treat watching jobs apart), a job
//! judged learnt at least `1 − budget × slack` of it over time, its pace bound
//! ([`governor_policy::learning_first::LearningFirstParams::least_kept_share`]). A node policy
//! that caps converged jobs (`shortest-left`, `flowcon`) is modelled by
//! `soonest:watching=0.5,converged=0.15`, the weights before 2026-12-01. A new job
//! claims like a progressing one (it is unknown, and the node treats unknown jobs as fast
//! learners), and the coordinator's pending placements are in the view, so a burst of submissions
//! spreads out instead of herding onto the node that looked best in the last report (the stale-
//! report problem FlowCon's Section 6 describes).
//!
//! Nodes within 15% of the best share are equally good; among them the job goes where it leaves
//! the fewest free GPUs (best fit: a 1-GPU job takes the last GPU of a busy node rather than
//! breaking up an idle 8-GPU node, and CPU-only jobs prefer nodes without free GPUs), then to the
//! node using the least of its CPU (measured, where the share is a prediction: spread by count's
//! tie-break), then to the larger share, then to the first node by name.
//!
//! Why it should beat the papers' policies (the simulator measures it): FlowCon sums growth
//! efficiencies of different metrics and ignores node size; SpeCon counts jobs and ignores node
//! size and background load; ProCon sees only jobs with epoch logs and ignores converged jobs
//! yielding CPU; round-robin and first-fit ignore load. None of them packs GPUs.

use governor_policy::Category;
use governor_policy::learning_first::LearningFirstParams;

use super::{
    ClusterView, JobRequest, JobView, NoFit, NodeView, Placement, PlacementPolicy, best_k,
    feasible_nodes, finish,
};

/// Our policy and its parameters.
#[derive(Clone, Debug)]
pub struct Soonest {
    /// Relative CPU claim of a job in each category, in [`Category::ALL`] order: what it takes
    /// from a newcomer under the default node policy (module documentation).
    ///
    /// Measured (2026-12-01, `govsim paper S --seeds 6-25 --contention W --also
    /// learning-first/soonest:converged=0.92,watching=1` for the six multi-worker scenarios of
    /// FlowCon and SpeCon) against the 0.5 and 0.15 it was for watching and converged jobs, the
    /// caps of the node policy before `learning-first`
    /// (docs/evaluation/paper-scenarios.md#what-the-placements-gap-is-not).
    pub claim: [f64; 4],
    /// Nodes whose predicted share is within this fraction of the best are equally good.
    ///
    /// 0.15, chosen by measurement (2026-12-01, `govsim paper S --seeds 6-25 --contention W`
    /// for the six multi-worker scenarios of FlowCon and SpeCon, against the 0.05 it was,
    /// when the tie-break among the equals was the larger share). With the least-busy node
    /// taking the tie, average JCT against fair improved in most of the six scenarios in each
    /// world (W = 0, 0.3, 1), most on `flowcon-60-hetero` and `specon-50`
    /// (docs/evaluation/paper-scenarios.md#what-the-placements-gap-is-not).
    pub tolerance: f64,
    /// A competitor with less than this many seconds left claims proportionally less; 0 weighs
    /// every competitor by its category alone (`soonest:horizon=0`).
    pub horizon_s: f64,
    /// What each job already on a node costs the newcomer beyond its CPU claim (caches, memory
    /// bandwidth, thread pools on shared cores): the predicted share is divided by
    /// `1 + contention × jobs on the node`. A converged job yields its CPU but still runs;
    /// this is what makes a node of five converged jobs worse than an empty one.
    /// `cargo xtask bench-real --report-only` measures it per job on real cores
    /// (docs/evaluation/simulator.md#contention: up to 0.1 for Keras jobs, 1.0 for OpenBLAS
    /// with more threads than cores); 0 ignores it (`soonest:contention=0`).
    ///
    /// Default 0.3, chosen by measurement in govsim (`govsim paper all --contention 0,0.1,0.3
    /// --also learning-first/soonest:contention=0.3`, 2026-11-29): against 0 it shortens ours'
    /// average JCT summed over the papers' 11 scenarios by 5.9, 10.5 and 33.0 points in worlds
    /// of contention 0, 0.1 and 0.3, worse by more than a point only on `specon-30` at 0.1
    /// (+2.1). Higher than the Keras jobs' own contention because a co-runner also competes
    /// for the CPU a converged job gives back when it speeds up again.
    pub contention: f64,
    sums: SumsCache,
}

impl Default for Soonest {
    fn default() -> Self {
        Soonest {
            claim: [
                1.0,
                1.0,
                1.0,
                LearningFirstParams::default().least_kept_share(),
            ],
            tolerance: 0.15,
            horizon_s: 600.0,
            contention: 0.3,
            sums: SumsCache::default(),
        }
    }
}

impl Soonest {
    /// `KEY=VALUE[,KEY=VALUE]`: `contention` (0 or more), `converged` and `watching` (the
    /// claims of a converged and of a watching job, 0 to 1) and `horizon` (seconds, 0 or more;
    /// 0: no remaining-time weighting).
    pub fn with_params(params: &str) -> Result<Self, String> {
        let mut policy = Soonest::default();
        for pair in params.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?}: expected KEY=VALUE"))?;
            let value: f64 = value
                .trim()
                .parse()
                .map_err(|_| format!("{key}={value:?}: not a number"))?;
            match key.trim() {
                "contention" if value.is_finite() && value >= 0.0 => policy.contention = value,
                "converged" if (0.0..=1.0).contains(&value) => {
                    policy.claim[Category::Converged.index()] = value;
                }
                "watching" if (0.0..=1.0).contains(&value) => {
                    policy.claim[Category::Watching.index()] = value;
                }
                "horizon" if value.is_finite() && value >= 0.0 => policy.horizon_s = value,
                "contention" | "converged" | "watching" | "horizon" => {
                    return Err(format!("{key}={value} is out of range"));
                }
                other => {
                    return Err(format!(
                        "unknown parameter {other:?} (contention, converged, watching, horizon)"
                    ));
                }
            }
        }
        Ok(policy)
    }
}

/// What the estimate needs from a node's jobs, and its free GPUs.
#[derive(Clone, Copy, Debug, Default)]
struct JobSums {
    cpu_cores: f64,
    claims: f64,
    /// Jobs on the node, pending placements included.
    jobs: usize,
    /// Counted once per revision too: walking every GPU node's GPUs at each placement was a
    /// fifth of the admission round at 10,000 nodes (`perf` on `admission_round`).
    free_gpus: usize,
}

/// [`JobSums`] per node index, each valid for the node revision it was computed at (see
/// [`NodeView::revision`]) and the claim parameters it was computed with.
#[derive(Clone, Debug, Default)]
struct SumsCache {
    parameters: Option<([u64; 4], u64)>,
    nodes: Vec<Option<(u64, JobSums)>>,
}

impl Soonest {
    fn claim_of(&self, job: &JobView) -> f64 {
        let soon = match (job.epoch_seconds, job.epoch, job.max_epochs) {
            (Some(f), Some(n), Some(max)) if !job.pending && self.horizon_s > 0.0 => {
                let remaining = f * max.saturating_sub(n) as f64;
                (remaining / self.horizon_s).clamp(0.25, 1.0)
            }
            _ => 1.0,
        };
        self.claim[job.category.index()] * soon
    }

    fn sums(&self, node: &NodeView) -> JobSums {
        JobSums {
            cpu_cores: node.jobs().iter().map(|j| j.cpu_cores).sum(),
            claims: node.jobs().iter().map(|j| self.claim_of(j)).sum(),
            jobs: node.jobs().len(),
            free_gpus: node.free_gpu_count(),
        }
    }

    /// The sums of every node, from the cache where the node has not changed since.
    fn refresh_sums(&mut self, cluster: &ClusterView) {
        // The contention is applied to the sums, not inside them: it is not a cache key.
        let parameters = (self.claim.map(f64::to_bits), self.horizon_s.to_bits());
        let mut cache = std::mem::take(&mut self.sums);
        if cache.parameters != Some(parameters) {
            cache.nodes.clear();
            cache.parameters = Some(parameters);
        }
        cache.nodes.resize(cluster.nodes.len(), None);
        for (slot, node) in cache.nodes.iter_mut().zip(&cluster.nodes) {
            if !matches!(slot, Some((revision, _)) if *revision == node.revision()) {
                *slot = Some((node.revision(), self.sums(node)));
            }
        }
        self.sums = cache;
    }

    fn estimate(&self, node: &NodeView, job: &JobRequest) -> Estimate {
        self.estimate_from(node, job, self.sums(node))
    }

    fn estimate_from(&self, node: &NodeView, job: &JobRequest, sums: JobSums) -> Estimate {
        let background = (node.cpu_used_cores - sums.cpu_cores).max(0.0);
        let available = (node.cores - background).max(0.1 * node.cores);
        let claims = sums.claims;
        let mut share = available / (1.0 + claims);
        if let Some(c) = job.cores {
            share = share.min(c);
        }
        let memory_tight = node.memory_bytes > 0
            && (node.memory_used_bytes + job.memory_bytes.unwrap_or(0)) as f64
                > 0.9 * node.memory_bytes as f64;
        if memory_tight {
            share *= 0.5;
        }
        let slowdown = 1.0 + self.contention.max(0.0) * sums.jobs as f64;
        Estimate {
            available,
            claims,
            share: share / slowdown,
            memory_tight,
            co_runners: sums.jobs,
            slowdown,
        }
    }

    /// The CPU share (cores) `job` is predicted to get on `node`, and a note saying why.
    pub fn predicted_share(&self, node: &NodeView, job: &JobRequest) -> (f64, String) {
        let e = self.estimate(node, job);
        (e.share, e.note())
    }
}

/// The parts of a predicted share.
struct Estimate {
    available: f64,
    claims: f64,
    /// Cores' worth of progress: the predicted cores over the contention's slowdown.
    share: f64,
    memory_tight: bool,
    co_runners: usize,
    slowdown: f64,
}

impl Estimate {
    fn note(&self) -> String {
        format!(
            "{:.1} cores available, competing claims {:.2}{} -> {:.2} cores{}",
            self.available,
            self.claims,
            if self.slowdown > 1.0 {
                format!(
                    ", {} jobs beside it (x{:.2} contention)",
                    self.co_runners, self.slowdown
                )
            } else {
                String::new()
            },
            self.share,
            if self.memory_tight {
                ", memory over 90%: halved"
            } else {
                ""
            }
        )
    }
}

impl PlacementPolicy for Soonest {
    fn name(&self) -> &'static str {
        "soonest"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        self.refresh_sums(cluster);
        // (node, predicted share, GPUs it would leave free, fraction of its CPU in use)
        let scored: Vec<(usize, f64, usize, f64)> = feasible
            .iter()
            .map(|&i| {
                let n = &cluster.nodes[i];
                let sums = self.sums.nodes[i].map_or_else(|| self.sums(n), |(_, s)| s);
                let share = self.estimate_from(n, job, sums).share;
                let busy = n.cpu_used_cores / n.cores.max(f64::MIN_POSITIVE);
                (i, share, sums.free_gpus - job.gpus as usize, busy)
            })
            .collect();
        let best = scored.iter().map(|s| s.1).fold(0.0, f64::max);
        // The node the share alone would choose (first with the best share, in view order).
        let by_share = scored.iter().find(|s| s.1 >= best).copied();
        let good_enough = best * (1.0 - self.tolerance);
        // Good-enough nodes first, among them the fewest GPUs left, then the least busy, then
        // the larger share.
        let ranked = best_k(
            scored,
            |s| s.0,
            |a, b| {
                let (a_good, b_good) = (a.1 >= good_enough, b.1 >= good_enough);
                b_good
                    .cmp(&a_good)
                    .then(if a_good && b_good {
                        a.2.cmp(&b.2).then(a.3.total_cmp(&b.3))
                    } else {
                        std::cmp::Ordering::Equal
                    })
                    .then(b.1.total_cmp(&a.1))
            },
        );
        let chosen = ranked[0];
        // Why not the node of the best share: it would leave more GPUs free, or it is busier.
        let packed = by_share.is_some_and(|b| b.0 != chosen.0 && chosen.2 < b.2);
        let quieter = by_share.is_some_and(|b| b.0 != chosen.0 && chosen.2 == b.2);
        let tolerance = self.tolerance * 100.0;
        let (gpus_left, busy) = (chosen.2, chosen.3 * 100.0);
        let ranked: Vec<(usize, f64)> = ranked.into_iter().map(|(i, s, _, _)| (i, s)).collect();
        let this = &*self;
        Ok(finish(
            cluster,
            job,
            &ranked,
            |n| {
                format!(
                    "{}; leaves {} GPUs free",
                    this.estimate(n, job).note(),
                    n.free_gpu_count() - job.gpus as usize
                )
            },
            |n, share| {
                if packed {
                    format!(
                        "soonest: {} is within {tolerance:.0}% of the best predicted CPU share ({share:.2} cores) and leaves the fewest GPUs free ({gpus_left})",
                        n.name
                    )
                } else if quieter {
                    format!(
                        "soonest: {} is within {tolerance:.0}% of the best predicted CPU share ({share:.2} cores) and uses the least of its CPU ({busy:.0}%)",
                        n.name
                    )
                } else {
                    format!(
                        "soonest: the job is predicted the largest CPU share on {} ({share:.2} cores)",
                        n.name
                    )
                }
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use Category::*;

    fn place(c: &ClusterView, req: &JobRequest) -> Placement {
        Soonest::default().place(c, req).unwrap()
    }

    #[test]
    fn a_learnt_neighbour_claims_what_learning_first_lets_it_keep() {
        // A learnt job keeps at least 92% of its fair share under the default node policy, and
        // a watching one all of it: beside either a newcomer gets about what it gets beside a
        // learner.
        let s = Soonest::default();
        let req = JobRequest::new("n", 0);
        for (category, claim) in [(Progressing, 1.0), (Watching, 1.0), (Converged, 0.92)] {
            let n = node("a", vec![job("x", category)]);
            let (share, _) = s.predicted_share(&n, &req);
            assert!(
                (share - 8.0 / (1.0 + claim) / 1.3).abs() < 1e-9,
                "{category:?}: {share}"
            );
        }
        // So a node whose learnt job keeps all 8 cores busy is no better than one whose learner
        // uses 2: the least busy takes the job, as spread by count would send it. (With the
        // caps of `shortest-left`, a learnt job claiming 0.15, "a" looked 74% better.)
        let mut a = node("a", vec![JobView::running("x", Converged, 8.0)]);
        a.cpu_used_cores = 8.0;
        let mut b = node("b", vec![JobView::running("y", Progressing, 2.0)]);
        b.cpu_used_cores = 2.0;
        let c = cluster(vec![a, b]);
        assert_eq!(chosen(&c, &place(&c, &req)), "b");
        let mut capping = Soonest::with_params("watching=0.5,converged=0.15").unwrap();
        assert_eq!(chosen(&c, &capping.place(&c, &req).unwrap()), "a");
    }

    #[test]
    fn with_contention_a_node_of_many_converged_jobs_loses_to_one_with_a_single_learner() {
        let c = cluster(vec![
            node(
                "a",
                (0..4).map(|k| job(&format!("c{k}"), Converged)).collect(),
            ),
            node("b", vec![job("p", Progressing)]),
        ]);
        let req = JobRequest::new("n", 0);
        // Under a node policy that caps converged jobs (claim 0.15) and without contention the
        // four look lighter than one learner (1 + 4 x 0.15 = 1.6 against 2).
        let mut ignoring = Soonest::with_params("contention=0,converged=0.15").unwrap();
        assert_eq!(chosen(&c, &ignoring.place(&c, &req).unwrap()), "a");
        // Each of them still runs beside the newcomer: at 0.3 a job, 1.6 x 2.2 against 2 x 1.3.
        let mut capping = Soonest::with_params("converged=0.15").unwrap();
        assert_eq!(chosen(&c, &capping.place(&c, &req).unwrap()), "b");
        let placed = place(&c, &req);
        assert_eq!(chosen(&c, &placed), "b");
        assert!(
            placed.candidates[0].note.contains("x1.30 contention"),
            "{:?}",
            placed.candidates
        );
    }

    #[test]
    fn soonest_parameters_are_checked() {
        assert!(Soonest::with_params("contention=0.1,converged=0.5,watching=0.5").is_ok());
        assert!(Soonest::with_params("horizon=0").is_ok());
        for bad in [
            "contention=-1",
            "converged=2",
            "watching=-0.1",
            "horizon=-1",
            "speed=1",
            "contention",
        ] {
            assert!(Soonest::with_params(bad).is_err(), "{bad}");
        }
        assert!(crate::by_name("soonest:contention=0.1").is_ok());
        let e = crate::by_name("soonest:contention=x")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a number"), "{e}");
    }

    #[test]
    fn cached_node_sums_follow_every_change_of_the_view() {
        let mut policy = Soonest::with_params("converged=0.15").unwrap();
        let mut c = cluster(vec![
            node("a", vec![job("x", Progressing)]),
            node("b", vec![job("z", Converged)]),
        ]);
        let req = JobRequest::new("n", 0);
        assert_eq!(chosen(&c, &policy.place(&c, &req).unwrap()), "b");
        // b fills up with learning jobs: the same policy instance must see it.
        for k in 0..3 {
            c.nodes[1]
                .jobs_mut()
                .push(job(&format!("p{k}"), Progressing));
        }
        assert_eq!(chosen(&c, &policy.place(&c, &req).unwrap()), "a");
        // A node joins in front: indices shift, the cache must not mix nodes up.
        c.nodes.insert(0, node("0", vec![job("q", Progressing); 5]));
        assert_eq!(chosen(&c, &policy.place(&c, &req).unwrap()), "a");
        // A parameter change invalidates every sum.
        let c = cluster(vec![
            node("a", vec![job("x", Progressing)]),
            node("b", vec![job("y", Converged), job("z", Converged)]),
        ]);
        assert_eq!(chosen(&c, &policy.place(&c, &req).unwrap()), "b");
        policy.claim = [1.0, 1.0, 0.5, 5.0];
        assert_eq!(chosen(&c, &policy.place(&c, &req).unwrap()), "a");
    }

    #[test]
    fn a_big_busy_node_can_beat_a_small_idle_one() {
        // 32 cores shared by 3 (32/3 = 10.7), slowed by its two co-runners (x 1.6 at the
        // default contention: 6.7), beat 4 cores alone (4).
        let mut big = node("big", vec![job("x", Progressing), job("y", Progressing)]);
        big.cores = 32.0;
        let mut small = node("small", vec![]);
        small.cores = 4.0;
        let c = cluster(vec![big, small]);
        let p = place(&c, &JobRequest::new("n", 0));
        assert_eq!(chosen(&c, &p), "big");
        assert!((p.candidates[0].score - 32.0 / 3.0 / 1.6).abs() < 1e-9);
    }

    #[test]
    fn pending_placements_spread_a_burst() {
        let mut c = cluster(vec![node("a", vec![]), node("b", vec![])]);
        let mut policy = Soonest::default();
        let mut got = Vec::new();
        for k in 0..4 {
            let req = JobRequest::new(format!("j{k}"), 0);
            let p = policy.place(&c, &req).unwrap();
            got.push(chosen(&c, &p));
            c.reserve(p.node, JobView::pending(req.id.clone(), &req), &p.gpus);
        }
        assert_eq!(got, ["a", "b", "a", "b"]);
    }

    #[test]
    fn gpu_jobs_are_packed_best_fit() {
        // Both nodes idle with the same CPUs: the 1-GPU job takes the node with 1 free GPU and
        // keeps the 4-GPU node whole.
        let mut partly = NodeView::new("a", 8.0, 0).with_gpus(2, "A100", 40 * GIB);
        partly.gpus[0].assigned = true;
        let whole = NodeView::new("b", 8.0, 0).with_gpus(4, "A100", 40 * GIB);
        let c = cluster(vec![whole, partly]);
        let p = place(&c, &JobRequest::new("n", 1));
        assert_eq!((chosen(&c, &p).as_str(), p.gpus.clone()), ("a", vec![1]));
        assert!(p.reason.contains("fewest GPUs free"), "{}", p.reason);
        // CPU-only jobs keep off GPU nodes when they can.
        let c = cluster(vec![
            NodeView::new("gpu", 8.0, 0).with_gpus(4, "A100", 40 * GIB),
            NodeView::new("cpu", 8.0, 0),
        ]);
        assert_eq!(chosen(&c, &place(&c, &JobRequest::new("n", 0))), "cpu");
    }

    #[test]
    fn packing_never_costs_more_than_the_tolerance() {
        // The GPU node is much less loaded: the CPU job goes there despite its free GPUs.
        let gpu = NodeView::new("gpu", 8.0, 0).with_gpus(4, "A100", 40 * GIB);
        let cpu = node("cpu", vec![job("x", Progressing)]);
        let c = cluster(vec![gpu, cpu]);
        assert_eq!(chosen(&c, &place(&c, &JobRequest::new("n", 0))), "gpu");
    }

    #[test]
    fn competitors_about_to_finish_claim_less() {
        let ending = JobView {
            epoch_seconds: Some(10.0),
            epoch: Some(99),
            max_epochs: Some(100),
            ..JobView::running("e", Progressing, 4.0)
        };
        let c = cluster(vec![
            node("a", vec![job("x", Progressing)]),
            node("b", vec![ending]),
        ]);
        assert_eq!(chosen(&c, &place(&c, &JobRequest::new("n", 0))), "b");
        // Without the remaining-time weighting it claims as much as any other learner: "a" is
        // as good, and first in view order.
        let mut by_category = Soonest::with_params("horizon=0").unwrap();
        assert_eq!(
            chosen(
                &c,
                &by_category.place(&c, &JobRequest::new("n", 0)).unwrap()
            ),
            "a"
        );
    }

    #[test]
    fn a_competitor_past_its_last_epoch_claims_a_number_without_the_horizon() {
        // Epochs all done (0 s left) and no horizon: 0 / 0 must not make every share NaN.
        let done = JobView {
            epoch_seconds: Some(10.0),
            epoch: Some(100),
            max_epochs: Some(100),
            ..JobView::running("d", Progressing, 4.0)
        };
        let c = cluster(vec![node("a", vec![done])]);
        let s = Soonest::with_params("horizon=0").unwrap();
        let (share, _) = s.predicted_share(&c.nodes[0], &JobRequest::new("n", 0));
        assert!((share - 8.0 / 2.0 / 1.3).abs() < 1e-9, "{share}");
    }

    #[test]
    fn among_nodes_of_about_the_same_share_the_least_busy_one_takes_the_job() {
        // One learner on each: the same predicted share. On "b" it keeps 2 of 8 cores busy,
        // on "a" all 8: the job goes to "b", as spread by count would send it.
        let mut a = node("a", vec![JobView::running("x", Progressing, 8.0)]);
        a.cpu_used_cores = 8.0;
        let mut b = node("b", vec![JobView::running("y", Progressing, 2.0)]);
        b.cpu_used_cores = 2.0;
        let c = cluster(vec![a, b]);
        let p = place(&c, &JobRequest::new("n", 0));
        assert_eq!(chosen(&c, &p), "b");
        assert!(
            p.reason.contains("uses the least of its CPU (25%)"),
            "{}",
            p.reason
        );
        // A clearly larger share still wins over a quieter node: an empty node with a core of
        // background load (7 cores) against "b" (8 / 2 / 1.3 = 3.1).
        let mut empty = node("e", vec![]);
        empty.cpu_used_cores = 1.0;
        let c = cluster(vec![c.nodes[1].clone(), empty]);
        assert_eq!(chosen(&c, &place(&c, &JobRequest::new("n", 0))), "e");
    }

    #[test]
    fn background_load_and_memory_pressure_count() {
        let mut loaded = node("a", vec![]);
        loaded.cpu_used_cores = 6.0; // nobody governed uses it: background
        let mut tight = node("b", vec![]);
        tight.memory_used_bytes = 31 * GIB;
        let free = node("c", vec![]);
        let c = cluster(vec![loaded, tight, free]);
        let s = Soonest::default();
        let req = JobRequest::new("n", 0);
        assert!((s.predicted_share(&c.nodes[0], &req).0 - 2.0).abs() < 1e-9);
        assert!((s.predicted_share(&c.nodes[1], &req).0 - 4.0).abs() < 1e-9);
        assert!((s.predicted_share(&c.nodes[2], &req).0 - 8.0).abs() < 1e-9);
        assert_eq!(chosen(&c, &place(&c, &req)), "c");
    }
}
