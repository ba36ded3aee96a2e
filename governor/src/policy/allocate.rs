//! Dividing a node's cores among jobs by marginal value: each job has a value per unit of work
//! (how much finishing it sooner is worth), a speed-up curve, and bounds; cores go, a small
//! quantum at a time, to the job whose next quantum buys the most valued work. With concave
//! speed-ups this equalises `value × marginal speed-up` across jobs (the optimum of
//! `Σ value_j · speed_j(cores_j)` under the capacity), which is a throughput-maximising split
//! when all values are equal and strict priority when speed-ups are linear.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::speedup::amdahl_speed;

/// Quanta the capacity is divided into.
const QUANTA: f64 = 400.0;

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

#[derive(PartialEq)]
struct Candidate {
    gain: f64,
    index: usize,
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Highest gain first; on ties the earlier claim (callers list claims by rank).
        self.gain
            .total_cmp(&other.gain)
            .then(other.index.cmp(&self.index))
    }
}

/// Cores for each claim, in order. Minimums are honoured first (scaled down together if they
/// exceed the capacity); the total never exceeds the capacity nor any claim its maximum.
pub fn allocate(capacity: f64, claims: &[Claim]) -> Vec<f64> {
    let capacity = if capacity.is_finite() && capacity > 0.0 {
        capacity
    } else {
        0.0
    };
    let max: Vec<f64> = claims
        .iter()
        .map(|c| {
            if c.max.is_finite() {
                c.max.max(0.0)
            } else {
                capacity
            }
        })
        .collect();
    let mut cores: Vec<f64> = claims
        .iter()
        .zip(&max)
        .map(|(c, m)| {
            if c.min.is_finite() {
                c.min.clamp(0.0, *m)
            } else {
                0.0
            }
        })
        .collect();
    let floor_total: f64 = cores.iter().sum();
    if floor_total > capacity && floor_total > 0.0 {
        let scale = capacity / floor_total;
        cores.iter_mut().for_each(|c| *c *= scale);
        return cores;
    }
    let mut left = capacity - floor_total;
    let quantum = capacity / QUANTA;
    if quantum.is_nan() || quantum <= 0.0 {
        return cores;
    }
    let gain = |i: usize, cores: &[f64]| -> Option<(f64, f64)> {
        let step = quantum.min(max[i] - cores[i]);
        if step <= 1e-12 {
            return None;
        }
        let f = claims[i].parallel_fraction;
        // Quanta straddle one core only at its boundary: value the step by where it starts.
        let step = if cores[i] < 1.0 {
            step.min(1.0 - cores[i])
        } else {
            step
        };
        let value = if cores[i] < 1.0 {
            claims[i].value
        } else {
            claims[i].value_above_one
        };
        if value.is_nan() || value <= 0.0 {
            return None;
        }
        let g = value * (amdahl_speed(cores[i] + step, f) - amdahl_speed(cores[i], f)) / step;
        Some((g, step))
    };
    let mut heap: BinaryHeap<Candidate> = (0..claims.len())
        .filter_map(|i| gain(i, &cores).map(|(g, _)| Candidate { gain: g, index: i }))
        .collect();
    while left > 1e-12 {
        let Some(Candidate { index, .. }) = heap.pop() else {
            break;
        };
        let Some((_, step)) = gain(index, &cores) else {
            continue;
        };
        let step = step.min(left);
        cores[index] += step;
        left -= step;
        if let Some((g, _)) = gain(index, &cores) {
            heap.push(Candidate { gain: g, index });
        }
    }
    cores
}

#[cfg(test)]
mod tests {
    use super::*;

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
