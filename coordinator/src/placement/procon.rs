//! ProCon: progress-based container placement (Algorithms 1 and 2 of the ProCon report).
//!
//! Each worker's contention rate c(W) is the largest remaining-time indicator of its jobs
//! (Algorithm 1):
//!
//! ```text
//! u(J, t) = 0.8 · CPU(J, t) / Σ_W CPU + 0.2 · MEM(J, t) / Σ_W MEM      (Eq. 2)
//! i(J, t) = f(J, t) / u(J, t) · (MAX − n)                             (Eq. 3)
//! c(W)    = max_J i(J, t)
//! ```
//!
//! where f is the time between the job's last two epochs, n the epochs done and MAX the epochs
//! planned. Algorithm 2 keeps the workers whose remaining resources exceed the job's needs and
//! picks the one with the minimum c(W); equal contention goes to the worker with fewer containers.
//!
//! Readings we took:
//! - Eq. 3 divides the epoch time f by the job's share u, although f was measured *at* that
//!   share (f/u is not the time "alone"); we implement Eq. 3 as printed, since that is what the
//!   authors evaluated.
//! - A job without epoch information (no f, n or MAX in its log yet, or placed and not reported)
//!   has indicator 0: ProCon cannot estimate it. Empty workers have c = 0. With the tie rule
//!   (fewest containers) this reproduces the paper's observation that ProCon "acts like a
//!   round-robin" while jobs are young.
//! - When no job on the worker uses CPU (or memory), Σ is 0 and that term of u is the equal
//!   share 1/|W| instead of 0/0.
//! - u is floored at 1%: a job measured at 0% share would otherwise make i infinite and every
//!   such worker tie.
//! - A job past its MAX (n > MAX) has no epochs left: i = 0.
//! - Remaining ties go to the first worker by name. Algorithm 2's "sleep 2 s and retry" when no
//!   worker qualifies is the coordinator's queue.

use super::{
    ClusterView, JobRequest, JobView, NoFit, NodeView, Placement, PlacementPolicy, feasible_nodes,
    finish,
};

/// ProCon with the report's weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProCon {
    /// Weight of the CPU share in u (0.8).
    pub cpu_weight: f64,
    /// Weight of the memory share in u (0.2).
    pub memory_weight: f64,
}

impl Default for ProCon {
    /// ProCon's weights: CPU 0.8, memory 0.2 ("the batch jobs are computationally intensive").
    fn default() -> Self {
        ProCon {
            cpu_weight: 0.8,
            memory_weight: 0.2,
        }
    }
}

/// Smallest share u used in Eq. 3.
const MIN_SHARE: f64 = 0.01;

impl ProCon {
    /// u(J, t) for `job` on `node` (Eq. 2).
    pub fn share(&self, node: &NodeView, job: &JobView) -> f64 {
        let jobs = node.jobs.len().max(1) as f64;
        let cpu_total: f64 = node.jobs.iter().map(|j| j.cpu_cores).sum();
        let mem_total: u64 = node.jobs.iter().map(|j| j.memory_bytes).sum();
        let cpu = if cpu_total > 0.0 {
            job.cpu_cores / cpu_total
        } else {
            1.0 / jobs
        };
        let mem = if mem_total > 0 {
            job.memory_bytes as f64 / mem_total as f64
        } else {
            1.0 / jobs
        };
        (self.cpu_weight * cpu + self.memory_weight * mem).max(MIN_SHARE)
    }

    /// i(J, t) (Eq. 3); 0 when the job's epochs are not known.
    pub fn indicator(&self, node: &NodeView, job: &JobView) -> f64 {
        match (job.epoch_seconds, job.epoch, job.max_epochs) {
            (Some(f), Some(n), Some(max)) if !job.pending => {
                f / self.share(node, job) * max.saturating_sub(n) as f64
            }
            _ => 0.0,
        }
    }

    /// c(W): the node's contention rate.
    pub fn contention(&self, node: &NodeView) -> f64 {
        node.jobs
            .iter()
            .map(|j| self.indicator(node, j))
            .fold(0.0, f64::max)
    }
}

impl PlacementPolicy for ProCon {
    fn name(&self) -> &'static str {
        "procon"
    }

    fn place(&mut self, cluster: &ClusterView, job: &JobRequest) -> Result<Placement, NoFit> {
        let feasible = feasible_nodes(cluster, job)?;
        let mut ranked: Vec<(usize, f64, String)> = feasible
            .iter()
            .map(|&i| {
                let n = &cluster.nodes[i];
                let c = self.contention(n);
                (
                    i,
                    c,
                    format!("{} jobs, longest remaining ≈ {c:.0} s", n.jobs.len()),
                )
            })
            .collect();
        // Minimum contention; equal contention: fewer containers; then view order (stable sort).
        ranked.sort_by(|a, b| {
            a.1.total_cmp(&b.1).then(
                cluster.nodes[a.0]
                    .jobs
                    .len()
                    .cmp(&cluster.nodes[b.0].jobs.len()),
            )
        });
        Ok(finish(cluster, job, ranked, |n, c| {
            format!(
                "procon: {} has the lowest contention (longest remaining-time indicator {c:.0} s), fewest jobs ({}) among equals",
                n.name,
                n.jobs.len()
            )
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::testing::*;
    use governor_proto::node::Category::*;

    fn epoch_job(id: &str, cpu: f64, mem: u64, f: f64, n: u64, max: u64) -> JobView {
        JobView {
            memory_bytes: mem,
            epoch_seconds: Some(f),
            epoch: Some(n),
            max_epochs: Some(max),
            ..JobView::running(id, Progressing, cpu)
        }
    }

    #[test]
    fn the_papers_motivating_example_prefers_the_node_whose_jobs_end_soon() {
        // Section 1: worker 1 runs two jobs about to finish, worker 2 one long job. The default
        // scheduler balances by count and picks worker 2; ProCon picks worker 1.
        let c = cluster(vec![
            node(
                "worker-1",
                vec![
                    epoch_job("a", 2.0, GIB, 30.0, 98, 100),
                    epoch_job("b", 2.0, GIB, 30.0, 99, 100),
                ],
            ),
            node("worker-2", vec![epoch_job("c", 4.0, GIB, 30.0, 5, 100)]),
        ]);
        let p = ProCon::default()
            .place(&c, &JobRequest::new("new", 0))
            .unwrap();
        assert_eq!(chosen(&c, &p), "worker-1");
    }

    #[test]
    fn indicator_follows_equations_2_and_3() {
        // Two jobs: a uses 3 of 4 cores and 1 of 4 GiB; b the rest.
        let n = node(
            "w",
            vec![
                epoch_job("a", 3.0, GIB, 60.0, 10, 20),
                epoch_job("b", 1.0, 3 * GIB, 10.0, 0, 100),
            ],
        );
        let p = ProCon::default();
        let u_a = 0.8 * 0.75 + 0.2 * 0.25;
        assert!((p.share(&n, &n.jobs[0]) - u_a).abs() < 1e-12);
        assert!((p.indicator(&n, &n.jobs[0]) - 60.0 / u_a * 10.0).abs() < 1e-9);
        let u_b = 0.8 * 0.25 + 0.2 * 0.75;
        assert!((p.indicator(&n, &n.jobs[1]) - 10.0 / u_b * 100.0).abs() < 1e-9);
        assert!((p.contention(&n) - 10.0 / u_b * 100.0).abs() < 1e-9);
    }

    #[test]
    fn equal_contention_goes_to_the_node_with_fewer_jobs_like_round_robin() {
        // No epoch data anywhere: every node has contention 0; the fewest jobs wins.
        let c = cluster(vec![
            node("w1", vec![job("a", Unknown), job("b", Unknown)]),
            node("w2", vec![job("c", Unknown)]),
            node("w3", vec![job("d", Unknown), job("e", Unknown)]),
        ]);
        let p = ProCon::default()
            .place(&c, &JobRequest::new("n", 0))
            .unwrap();
        assert_eq!(chosen(&c, &p), "w2");
    }

    #[test]
    fn a_starved_job_does_not_divide_by_zero() {
        let n = node(
            "w",
            vec![
                epoch_job("a", 0.0, 0, 10.0, 1, 2),
                epoch_job("b", 4.0, GIB, 10.0, 1, 2),
            ],
        );
        let i = ProCon::default().indicator(&n, &n.jobs[0]);
        assert!(i.is_finite() && (i - 10.0 / MIN_SHARE).abs() < 1e-9, "{i}");
    }
}
