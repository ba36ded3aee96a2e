//! How the kernel divides CPU among sibling cgroups under the knobs the daemon writes: the model
//! behind `governor status`'s expected shares and behind `govsim`'s job speeds.
//!
//! cgroup v2 semantics modelled (Documentation/admin-guide/cgroup-v2.rst, "CPU"):
//! - `cpu.weight` (1..=10000) is *work-conserving proportional sharing*: among the groups that
//!   have runnable threads, each receives capacity in proportion to its weight, and capacity a
//!   group cannot use is redistributed to the others;
//! - `cpu.max` is a *hard cap* (quota per period): a group never runs more than `max_cores`, even
//!   on an idle machine;
//! - a job cannot run on more cores than it has runnable threads: its *demand* (its parallelism
//!   limit in the simulator; what it used when unconstrained in the daemon).
//!
//! The result is the classic weighted max-min fair allocation ("water-filling"): every job gets
//! `min(limit_j, λ·weight_j)` where `limit_j = min(demand_j, max_cores_j)` and the water level
//! `λ` is the largest value for which the total does not exceed the capacity. When the limits
//! add up to less than the capacity every job simply gets its limit and the rest stays idle.
//!
//! What this model ignores, knowingly: scheduler latency and the period granularity of `cpu.max`
//! (a job capped at 0.5 core runs 50 ms of every 100 ms rather than at half speed; over a second
//! the two are the same), SMT, cache and memory-bandwidth interference, and the kernel's small
//! bias in favour of groups that have just woken up.

/// One job's knobs and demand, as the share model sees them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShareRequest {
    /// `cpu.weight`; 0 is treated as 1, the kernel's minimum.
    pub weight: u32,
    /// `cpu.max` in cores; `None` is "max" (no cap).
    pub max_cores: Option<f64>,
    /// Cores the job can keep busy (runnable threads). Non-finite or negative means 0.
    pub demand: f64,
}

/// Divide `capacity` cores among `jobs` the way the kernel would; returns each job's cores in the
/// order given. Deterministic, O(n log n), never returns more than a job's cap or demand, and
/// the total is `min(capacity, Σ limits)` up to rounding.
pub fn water_fill(capacity: f64, jobs: &[ShareRequest]) -> Vec<f64> {
    let capacity = if capacity.is_finite() && capacity > 0.0 {
        capacity
    } else {
        0.0
    };
    let limits: Vec<f64> = jobs.iter().map(effective_limit).collect();
    let weights: Vec<f64> = jobs.iter().map(|j| f64::from(j.weight.max(1))).collect();
    let mut share = vec![0.0; jobs.len()];

    // Jobs sorted by the water level at which they saturate (limit / weight): the ones that
    // saturate first are served their limit, the rest split what remains by weight.
    let mut order: Vec<usize> = (0..jobs.len()).filter(|&i| limits[i] > 0.0).collect();
    order.sort_by(|&a, &b| {
        (limits[a] / weights[a])
            .total_cmp(&(limits[b] / weights[b]))
            .then(a.cmp(&b))
    });
    let mut remaining_capacity = capacity;
    let mut remaining_weight: f64 = order.iter().map(|&i| weights[i]).sum();
    for (pos, &i) in order.iter().enumerate() {
        let level = remaining_capacity / remaining_weight;
        if limits[i] <= level * weights[i] {
            share[i] = limits[i];
            remaining_capacity -= limits[i];
            remaining_weight -= weights[i];
        } else {
            // Every job from here on saturates later than the water level: split by weight.
            for &j in &order[pos..] {
                share[j] = level * weights[j];
            }
            break;
        }
    }
    share
}

/// The share each job would get with every knob at the kernel default (weight 100, no cap): the
/// "fair share" baseline that policies compare with.
pub fn fair_shares(capacity: f64, demands: &[f64]) -> Vec<f64> {
    let requests: Vec<ShareRequest> = demands
        .iter()
        .map(|&demand| ShareRequest {
            weight: 100,
            max_cores: None,
            demand,
        })
        .collect();
    water_fill(capacity, &requests)
}

fn effective_limit(job: &ShareRequest) -> f64 {
    let demand = if job.demand.is_finite() && job.demand > 0.0 {
        job.demand
    } else {
        0.0
    };
    match job.max_cores {
        Some(cap) if cap.is_finite() => demand.min(cap.max(0.0)),
        Some(cap) if cap.is_nan() => 0.0,
        _ => demand,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(weight: u32, max_cores: Option<f64>, demand: f64) -> ShareRequest {
        ShareRequest {
            weight,
            max_cores,
            demand,
        }
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn equal_weights_split_a_contended_node_evenly() {
        let s = water_fill(4.0, &[req(100, None, 4.0), req(100, None, 4.0)]);
        assert_close(&s, &[2.0, 2.0]);
    }

    #[test]
    fn weights_split_in_proportion_when_everyone_wants_more() {
        let s = water_fill(4.0, &[req(300, None, 8.0), req(100, None, 8.0)]);
        assert_close(&s, &[3.0, 1.0]);
    }

    #[test]
    fn capacity_a_job_cannot_use_goes_to_the_others() {
        // The heavy job can only use 1 core; the light one takes the other 3 (work-conserving).
        let s = water_fill(4.0, &[req(1000, None, 1.0), req(100, None, 8.0)]);
        assert_close(&s, &[1.0, 3.0]);
    }

    #[test]
    fn a_cap_binds_even_on_an_idle_node() {
        let s = water_fill(8.0, &[req(100, Some(0.5), 4.0)]);
        assert_close(&s, &[0.5]);
    }

    #[test]
    fn capped_capacity_is_redistributed_by_weight() {
        let s = water_fill(
            6.0,
            &[
                req(100, Some(1.0), 6.0),
                req(100, None, 6.0),
                req(300, None, 6.0),
            ],
        );
        // 1 core to the capped job, the other 5 split 1:3.
        assert_close(&s, &[1.0, 1.25, 3.75]);
    }

    #[test]
    fn an_uncontended_node_gives_everyone_their_demand() {
        let s = water_fill(16.0, &[req(1, None, 2.0), req(10000, None, 4.0)]);
        assert_close(&s, &[2.0, 4.0]);
    }

    #[test]
    fn zero_weight_is_the_kernel_minimum_not_starvation() {
        let s = water_fill(2.0, &[req(0, None, 2.0), req(1, None, 2.0)]);
        assert_close(&s, &[1.0, 1.0]);
    }

    #[test]
    fn bad_numbers_give_nothing_instead_of_poisoning_the_others() {
        let s = water_fill(
            2.0,
            &[
                req(100, None, f64::NAN),
                req(100, Some(f64::NAN), 2.0),
                req(100, None, -1.0),
                req(100, Some(f64::INFINITY), 2.0),
            ],
        );
        assert_close(&s, &[0.0, 0.0, 0.0, 2.0]);
        assert_close(&water_fill(f64::NAN, &[req(100, None, 1.0)]), &[0.0]);
        assert!(water_fill(4.0, &[]).is_empty());
    }

    #[test]
    fn total_never_exceeds_capacity_and_no_job_exceeds_its_limit() {
        // A small deterministic sweep over mixed weights, caps and demands.
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as f64 / (1u64 << 31) as f64
        };
        for _ in 0..500 {
            let n = 1 + (next() * 8.0) as usize;
            let capacity = 1.0 + next() * 15.0;
            let jobs: Vec<ShareRequest> = (0..n)
                .map(|_| {
                    let cap = if next() < 0.3 {
                        Some(next() * 4.0)
                    } else {
                        None
                    };
                    req(1 + (next() * 1000.0) as u32, cap, next() * 8.0)
                })
                .collect();
            let s = water_fill(capacity, &jobs);
            let total: f64 = s.iter().sum();
            let limit_total: f64 = jobs.iter().map(effective_limit).sum();
            assert!(
                (total - capacity.min(limit_total)).abs() < 1e-6,
                "total {total} vs capacity {capacity} and limits {limit_total}: {jobs:?}"
            );
            for (share, job) in s.iter().zip(&jobs) {
                assert!(*share <= effective_limit(job) + 1e-9, "{job:?} got {share}");
            }
        }
    }

    #[test]
    fn fair_shares_are_water_filling_with_default_knobs() {
        assert_close(&fair_shares(4.0, &[1.0, 4.0, 4.0]), &[1.0, 1.5, 1.5]);
    }
}
