//! Dividing a node's cores among jobs by marginal value: each job has a value per unit of work
//! (how much finishing it sooner is worth), a speed-up curve, and bounds; cores go to the job
//! whose next slice of a core buys the most valued work. With concave speed-ups this equalises
//! `value × marginal speed-up` across jobs (the optimum of `Σ value_j · speed_j(cores_j)` under
//! the capacity), which is a throughput-maximising split when all values are equal and strict
//! priority when speed-ups are linear.
//!
//! The split is computed exactly (water-filling on the Lagrange multiplier λ, the marginal value
//! every job is filled up to), not by handing out quanta: it is the limit of the quantum-by-
//! quantum greedy as the quantum shrinks (the tests check it against that greedy). Below one
//! core a job's speed is linear, so its marginal value there is a constant `value`; above one
//! core it is `value_above_one · f / ((1 − f)·c + f)²` (Amdahl with parallel fraction f), which
//! decreases, so for a given λ every job's cores follow in closed form and the total is
//! `A/√λ + B` between breakpoints. Greedy ties (equal marginal values, e.g. two linear jobs)
//! go to the earlier claim: callers list claims by rank.

/// One job's claim on the node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Claim {
    /// Worth of one unit of this job's work done on its first core (≥ 0).
    pub value: f64,
    /// Worth of one unit of its work done on cores beyond the first (≥ 0).
    pub value_above_one: f64,
    /// Amdahl parallel fraction of its speed-up curve.
    pub parallel_fraction: f64,
    /// Cores it gets before anyone gets more (its floor or guarantee).
    pub min: f64,
    /// Most cores it can use.
    pub max: f64,
}

/// A claim with its numbers made safe: NaN or negative values are worth nothing.
#[derive(Clone, Copy, Debug)]
struct Curve {
    /// Marginal value below one core.
    v0: f64,
    /// `value_above_one`.
    v1: f64,
    /// Parallel fraction in [0, 1].
    f: f64,
    /// Floor (what it starts with) and ceiling.
    lo: f64,
    hi: f64,
}

fn positive(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 { x } else { 0.0 }
}

impl Curve {
    /// Marginal value of more cores at `c` ≥ 1.
    fn marginal_above_one(&self, c: f64) -> f64 {
        let d = (1.0 - self.f) * c + self.f;
        self.v1 * self.f / (d * d)
    }

    /// Where the job has climbed to for multiplier `lambda` > 0: every slice whose marginal
    /// value exceeds λ (with `ties`, also the slices worth exactly λ).
    fn cores_at(&self, lambda: f64, ties: bool) -> f64 {
        let takes = |m: f64| m > 0.0 && (m > lambda || (ties && m == lambda));
        let mut c = self.lo;
        if c >= self.hi {
            return self.hi;
        }
        if c < 1.0 {
            if !takes(self.v0) {
                return c;
            }
            c = self.hi.min(1.0);
            if c >= self.hi {
                return self.hi;
            }
        }
        if self.v1 <= 0.0 || self.f <= 0.0 {
            return c;
        }
        if self.f >= 1.0 {
            return if takes(self.v1) { self.hi } else { c };
        }
        // v1·f/((1−f)c+f)² = λ  ⇔  c = (√(v1·f/λ) − f)/(1 − f)
        let level = ((self.v1 * self.f / lambda).sqrt() - self.f) / (1.0 - self.f);
        level.clamp(c, self.hi)
    }

    /// The multipliers at which `cores_at` changes form (jumps or kinks).
    fn breakpoints(&self, out: &mut Vec<f64>) {
        if self.lo >= self.hi {
            return;
        }
        if self.lo < 1.0 {
            out.push(self.v0);
        }
        if self.v1 > 0.0 && self.f > 0.0 {
            if self.f >= 1.0 {
                out.push(self.v1);
            } else {
                out.push(self.marginal_above_one(self.lo.max(1.0).min(self.hi)));
                out.push(self.marginal_above_one(self.hi));
            }
        }
    }
}

/// Cores for each claim, in order. Minimums are honoured first (scaled down together if they
/// exceed the capacity); the total never exceeds the capacity nor any claim its maximum.
pub fn allocate(capacity: f64, claims: &[Claim]) -> Vec<f64> {
    let capacity = positive(capacity);
    let curves: Vec<Curve> = claims
        .iter()
        .map(|c| {
            let hi = if c.max.is_finite() {
                c.max.max(0.0)
            } else {
                capacity
            };
            let lo = if c.min.is_finite() {
                c.min.clamp(0.0, hi)
            } else {
                0.0
            };
            Curve {
                v0: positive(c.value),
                v1: positive(c.value_above_one),
                f: if c.parallel_fraction.is_nan() {
                    0.0
                } else {
                    c.parallel_fraction.clamp(0.0, 1.0)
                },
                lo,
                hi,
            }
        })
        .collect();
    let floor_total: f64 = curves.iter().map(|c| c.lo).sum();
    if floor_total > capacity && floor_total > 0.0 {
        let scale = capacity / floor_total;
        return curves.iter().map(|c| c.lo * scale).collect();
    }
    let total =
        |lambda: f64, ties: bool| -> f64 { curves.iter().map(|c| c.cores_at(lambda, ties)).sum() };
    let mut cores = fill(capacity, &curves, &total);
    // Float rounding must never take the total past the capacity.
    let excess = cores.iter().sum::<f64>() - capacity;
    if excess > 0.0
        && let Some(biggest) = cores.iter_mut().max_by(|a, b| a.total_cmp(b))
    {
        *biggest = (*biggest - excess).max(0.0);
    }
    cores
}

fn fill(capacity: f64, curves: &[Curve], total: &dyn Fn(f64, bool) -> f64) -> Vec<f64> {
    // Everything any positive marginal value asks for fits: take it all, then what is left goes,
    // in claim order, to jobs that can still use cores worth nothing more (Amdahl f = 0 above
    // one core), as the greedy would hand out zero-gain quanta.
    let tiny = f64::MIN_POSITIVE;
    if total(tiny, true) <= capacity {
        let mut cores: Vec<f64> = curves.iter().map(|c| c.cores_at(tiny, true)).collect();
        let mut left = capacity - cores.iter().sum::<f64>();
        for (c, cur) in cores.iter_mut().zip(curves) {
            if left <= 0.0 {
                break;
            }
            if *c >= 1.0 && cur.v1 > 0.0 && *c < cur.hi {
                let more = (cur.hi - *c).min(left);
                *c += more;
                left -= more;
            }
        }
        return cores;
    }
    // λ* is the largest multiplier at which the jobs, ties included, ask for the capacity.
    // total(λ, ·) falls as λ rises; find the breakpoint interval holding λ* by binary search.
    let mut points = Vec::with_capacity(curves.len() * 3);
    for c in curves {
        c.breakpoints(&mut points);
    }
    points.retain(|p| p.is_finite() && *p > 0.0);
    points.sort_by(|a, b| b.total_cmp(a));
    points.dedup();
    // The first breakpoint (descending) where the jobs, ties included, fill the capacity.
    let at = points.partition_point(|&p| total(p, true) < capacity);
    if let Some(&lambda) = points.get(at)
        && total(lambda, false) <= capacity
    {
        // λ* is this breakpoint: jobs worth exactly λ* share what is left, earlier claims first.
        let mut cores: Vec<f64> = curves.iter().map(|c| c.cores_at(lambda, false)).collect();
        let mut left = capacity - cores.iter().sum::<f64>();
        for (c, cur) in cores.iter_mut().zip(curves) {
            let more = (cur.cores_at(lambda, true) - *c).min(left).max(0.0);
            *c += more;
            left -= more;
        }
        return cores;
    }
    // λ* lies strictly between two breakpoints, where every job either sits at a bound or
    // follows (√(v1·f/λ) − f)/(1 − f): the total is A/√λ + B, solved in closed form.
    let lower = points.get(at).copied().unwrap_or(0.0);
    let upper = if at == 0 {
        f64::INFINITY
    } else {
        points[at - 1]
    };
    let probe = match (lower > 0.0, upper.is_finite()) {
        (true, true) => (lower * upper).sqrt(),
        (true, false) => lower * 2.0,
        (false, true) => upper / 2.0,
        (false, false) => 1.0,
    };
    let (mut a, mut b) = (0.0, 0.0);
    let mut following = vec![false; curves.len()];
    for (i, cur) in curves.iter().enumerate() {
        let c = cur.cores_at(probe, false);
        let base = if cur.lo < 1.0 && cur.v0 > probe {
            cur.hi.min(1.0)
        } else {
            cur.lo
        };
        if cur.f > 0.0 && cur.f < 1.0 && cur.v1 > 0.0 && c > base && c < cur.hi {
            following[i] = true;
            a += (cur.v1 * cur.f).sqrt() / (1.0 - cur.f);
            b -= cur.f / (1.0 - cur.f);
        } else {
            b += c;
        }
    }
    if a > 0.0 && capacity > b {
        let lambda = (a / (capacity - b)).powi(2);
        curves
            .iter()
            .zip(&following)
            .map(|(cur, &f)| {
                if f {
                    cur.cores_at(lambda, false)
                } else {
                    cur.cores_at(probe, false)
                }
            })
            .collect()
    } else {
        // No job follows a curve here (cannot happen with a consistent total): the allocation
        // at the probe is a safe answer.
        curves.iter().map(|c| c.cores_at(probe, false)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speedup::amdahl_speed;
    use proptest::prelude::*;

    /// The quantum-by-quantum greedy the exact split is the limit of (it was the implementation
    /// before: 400 quanta per call cost half of the simulator's time at 1,000 workers).
    fn greedy(capacity: f64, claims: &[Claim], quanta: f64) -> Vec<f64> {
        let mut cores: Vec<f64> = claims.iter().map(|c| c.min.clamp(0.0, c.max)).collect();
        let mut left = capacity - cores.iter().sum::<f64>();
        let quantum = capacity / quanta;
        let gain = |i: usize, cores: &[f64]| -> Option<(f64, f64)> {
            let mut step = quantum.min(claims[i].max - cores[i]);
            if step <= 1e-12 {
                return None;
            }
            if cores[i] < 1.0 {
                step = step.min(1.0 - cores[i]);
            }
            let value = if cores[i] < 1.0 {
                claims[i].value
            } else {
                claims[i].value_above_one
            };
            if value <= 0.0 {
                return None;
            }
            let f = claims[i].parallel_fraction;
            let g = value * (amdahl_speed(cores[i] + step, f) - amdahl_speed(cores[i], f)) / step;
            Some((g, step))
        };
        while left > 1e-12 {
            // Highest gain; ties to the earlier claim.
            let best = (0..claims.len())
                .filter_map(|i| gain(i, &cores).map(|(g, step)| (i, g, step)))
                .fold(None::<(usize, f64, f64)>, |acc, x| match acc {
                    Some(a) if a.1 >= x.1 => Some(a),
                    _ => Some(x),
                });
            let Some((i, _, step)) = best else { break };
            let step = step.min(left);
            cores[i] += step;
            left -= step;
        }
        cores
    }

    fn arbitrary_claim() -> impl Strategy<Value = Claim> {
        (
            prop_oneof![Just(0.0), 0.1f64..10.0],
            prop_oneof![Just(0.0), 0.1f64..10.0],
            prop_oneof![Just(0.0), Just(1.0), 0.0f64..1.0],
            prop_oneof![Just(0.0), 0.0f64..2.0],
            prop_oneof![Just(f64::INFINITY), 0.2f64..6.0],
        )
            .prop_map(|(value, above, f, min, max)| Claim {
                value,
                value_above_one: above.min(value),
                parallel_fraction: f,
                min,
                max,
            })
    }

    proptest! {
        #[test]
        fn the_exact_split_is_the_limit_of_the_greedy(
            capacity in 0.5f64..16.0,
            claims in proptest::collection::vec(arbitrary_claim(), 1..6),
        ) {
            let exact = allocate(capacity, &claims);
            let total: f64 = exact.iter().sum();
            prop_assert!(total <= capacity + 1e-9, "{exact:?}");
            for (c, claim) in exact.iter().zip(&claims) {
                prop_assert!(*c >= -1e-12 && *c <= claim.max.min(capacity) + 1e-9);
            }
            let floors: f64 = claims.iter().map(|c| c.min.min(c.max)).sum();
            if floors <= capacity {
                let reference = greedy(capacity, &claims, 20_000.0);
                for (e, g) in exact.iter().zip(&reference) {
                    prop_assert!((e - g).abs() < 0.005 * capacity.max(1.0),
                        "exact {exact:?} greedy {reference:?}");
                }
            }
        }
    }

    fn claim(value: f64, f: f64, min: f64, max: f64) -> Claim {
        Claim {
            value,
            value_above_one: value,
            parallel_fraction: f,
            min,
            max,
        }
    }

    #[test]
    fn linear_speedups_make_strict_priority_up_to_each_max() {
        let c = allocate(
            4.0,
            &[
                claim(3.0, 1.0, 0.0, 3.0),
                claim(2.0, 1.0, 0.0, 8.0),
                claim(1.0, 1.0, 0.0, 8.0),
            ],
        );
        assert!(
            (c[0] - 3.0).abs() < 1e-9 && (c[1] - 1.0).abs() < 1e-9 && c[2] < 1e-9,
            "{c:?}"
        );
    }

    #[test]
    fn equal_values_and_curves_split_evenly() {
        let c = allocate(8.0, &[claim(1.0, 0.9, 0.0, 8.0), claim(1.0, 0.9, 0.0, 8.0)]);
        assert!(
            (c[0] - 4.0).abs() < 0.03 && (c[1] - 4.0).abs() < 0.03,
            "{c:?}"
        );
    }

    #[test]
    fn cores_go_where_they_scale() {
        // Same value: the job that scales (f = 0.98) gets more than the one that does not.
        let c = allocate(
            8.0,
            &[claim(1.0, 0.98, 0.0, 8.0), claim(1.0, 0.6, 0.0, 8.0)],
        );
        assert!(c[0] > 5.0 && c[1] >= 1.0, "{c:?}");
        assert!((c[0] + c[1] - 8.0).abs() < 1e-9);
    }

    #[test]
    fn every_job_gets_a_core_before_anyone_scales_past_one() {
        // Below one core speed is linear; above it, marginal speed drops to f: with values
        // 1.0 and 0.95 and f = 0.9 the second job still gets its first core first.
        let c = allocate(
            2.0,
            &[claim(1.0, 0.9, 0.0, 8.0), claim(0.95, 0.9, 0.0, 8.0)],
        );
        assert!(c[1] >= 1.0 - 1e-9, "{c:?}");
    }

    #[test]
    fn minimums_come_first_and_are_scaled_when_they_do_not_fit() {
        let c = allocate(
            4.0,
            &[claim(10.0, 1.0, 0.0, 8.0), claim(0.0, 0.9, 1.0, 8.0)],
        );
        assert!(
            (c[1] - 1.0).abs() < 1e-9 && (c[0] - 3.0).abs() < 1e-9,
            "{c:?}"
        );
        let c = allocate(2.0, &[claim(1.0, 0.9, 2.0, 8.0), claim(1.0, 0.9, 2.0, 8.0)]);
        assert!(
            (c[0] - 1.0).abs() < 1e-9 && (c[1] - 1.0).abs() < 1e-9,
            "{c:?}"
        );
    }

    #[test]
    fn capacity_nobody_can_use_stays_unallocated() {
        let c = allocate(8.0, &[claim(1.0, 0.9, 0.0, 1.0), claim(1.0, 0.9, 0.0, 2.0)]);
        assert!(
            (c[0] - 1.0).abs() < 1e-9 && (c[1] - 2.0).abs() < 1e-9,
            "{c:?}"
        );
        assert!(allocate(0.0, &[claim(1.0, 0.9, 0.0, 1.0)])[0] == 0.0);
        assert!(allocate(4.0, &[]).is_empty());
    }

    #[test]
    fn bad_numbers_do_not_poison_the_split() {
        let c = allocate(
            4.0,
            &[
                claim(f64::NAN, 0.9, f64::NAN, f64::INFINITY),
                claim(1.0, 0.9, 0.0, 4.0),
            ],
        );
        assert_eq!(c[0], 0.0);
        assert!((c[1] - 4.0).abs() < 1e-9, "{c:?}");
    }
}
