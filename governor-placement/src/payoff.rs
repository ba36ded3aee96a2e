//! When an automatic move pays: the time it frees against what it costs, in core-seconds
//! (the coordinator's gate on its automatic moves, and govsim's `+pays`).
//!
//! SpeCon (Algorithm 2) moves a converged job as soon as its node asks and another node has
//! more free cores. Its paper takes a move's cost as small; measured here it is not always
//! (`cargo xtask bench-move`: a framework checkpoint loses the job 0.3 s at 64 MiB and 3.9 s at
//! 1 GiB; CRIU under the VM bed's emulation pauses it 2.8 s at 64 MiB and 22 s at 1 GiB). So the
//! coordinator moves only when the move gives back more than it takes:
//!
//! - **gain** over the job's remaining time `R`: the cores it frees on its source, if the
//!   source is saturated (its other jobs take them: that is why SpeCon moves converged jobs),
//!   plus what it gains or loses itself, `min(free on target, cores it wants) - cores now`
//!   (undeclared, it wants what the target has free if its source holds it back, else no more
//!   than it uses: a job with room where it is gains nothing by a move);
//! - **cost**: the job stands still for the move's pause, `cost_s(memory)` seconds at the
//!   cores it has now;
//! - it pays when `gain >= payoff × cost` (`move_payoff`, 2 by default: the estimate of `R`
//!   is rough).
//!
//! `R` is the job's remaining epochs × its epoch time when its log shows them; otherwise the
//! time it has run so far on this node (a job that has run T is taken to run about T more:
//! the usual estimate for a lifetime of unknown length, and the one that holds the median).

use serde::{Deserialize, Serialize};

/// A move's cost: `fixed_s + per_gib_s × memory in GiB` seconds of pause.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoveCost {
    pub fixed_s: f64,
    pub per_gib_s: f64,
}

impl MoveCost {
    /// Fitted to `cargo xtask bench-move --framework` (host, 64 MiB to 1 GiB: 0.32 / 0.75 /
    /// 3.92 s lost to the job).
    pub const FRAMEWORK: MoveCost = MoveCost {
        fixed_s: 0.1,
        per_gib_s: 3.8,
    };
    /// Fitted to `cargo xtask bench-move` (CRIU in the VM bed, plain dump: pause 2.8 / 6.2 /
    /// 21.9 s at 64 / 256 / 1024 MiB). Emulated CPUs: real hardware is several times faster.
    pub const CRIU: MoveCost = MoveCost {
        fixed_s: 1.5,
        per_gib_s: 20.0,
    };

    /// Seconds of pause for a job holding `memory_bytes`.
    pub fn seconds(&self, memory_bytes: u64) -> f64 {
        self.fixed_s + self.per_gib_s * memory_bytes as f64 / (1u64 << 30) as f64
    }
}

/// What the coordinator knows of a job it might move.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoveCase {
    /// Cores it uses now on its source (its last report).
    pub cores_now: f64,
    /// Cores it would take if it could (declared, else as many as the target has free).
    pub cores_wanted: Option<f64>,
    /// Free cores on the source, without the job, and on the target.
    pub source_free: f64,
    pub target_free: f64,
    pub memory_bytes: u64,
    /// Remaining seconds from its epochs, when known.
    pub remaining_s: Option<f64>,
    /// Seconds it has run on its source (for an unknown remaining time).
    pub ran_s: f64,
}

/// The estimate behind a decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Payoff {
    pub remaining_s: f64,
    pub cost_s: f64,
    /// Core-seconds the move gives (the freed cores used on the source, plus the job's own
    /// gain or loss on the target) and takes (the job's pause).
    pub gain: f64,
    pub cost: f64,
    pub pays: bool,
}

/// Below this many free cores a node is saturated: what a job leaves there, others take.
const SATURATED_BELOW: f64 = 0.5;

/// Whether moving the job pays (see the module's doc), with the estimate, for a move that
/// pauses it `cost_s` seconds ([`MoveCost::seconds`]).
pub fn payoff(case: &MoveCase, cost_s: f64, factor: f64) -> Payoff {
    let remaining_s = case.remaining_s.unwrap_or(case.ran_s).max(0.0);
    let cores_now = case.cores_now.max(0.0);
    let held_back = case.source_free < SATURATED_BELOW;
    // Undeclared, a job wants more only if its source holds it back (it is saturated); one
    // that has room where it is would use no more elsewhere.
    let cores_there = match case.cores_wanted {
        Some(wanted) => wanted.min(case.target_free),
        None if held_back => case.target_free,
        None => cores_now.min(case.target_free),
    }
    .max(0.0);
    let freed = if held_back { cores_now } else { 0.0 };
    let gain = (freed + cores_there - cores_now) * remaining_s;
    // Even a job using next to nothing stops for the pause: count at least a tenth of a core.
    let cost = cost_s * cores_now.max(0.1);
    Payoff {
        remaining_s,
        cost_s,
        gain,
        cost,
        pays: gain > 0.0 && gain >= factor * cost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case() -> MoveCase {
        MoveCase {
            cores_now: 1.0,
            cores_wanted: None,
            source_free: 0.0,
            target_free: 2.0,
            memory_bytes: 256 << 20,
            remaining_s: Some(600.0),
            ran_s: 60.0,
        }
    }

    #[test]
    fn moving_a_job_off_a_full_node_to_an_idle_one_pays() {
        let p = payoff(
            &case(),
            MoveCost::FRAMEWORK.seconds(case().memory_bytes),
            2.0,
        );
        // Frees 1 core for 600 s, gains 1 more itself: 1200 core-s against ~1 s of pause.
        assert!(p.pays, "{p:?}");
        assert!((p.gain - 1200.0).abs() < 1e-9);
        assert!((p.cost_s - (0.1 + 3.8 / 4.0)).abs() < 1e-9);
    }

    #[test]
    fn a_move_near_the_end_of_a_job_does_not_pay() {
        let mut c = case();
        c.remaining_s = Some(1.0);
        c.memory_bytes = 4 << 30;
        let p = payoff(&c, MoveCost::CRIU.seconds(c.memory_bytes), 2.0);
        assert!(!p.pays, "{p:?}");
    }

    #[test]
    fn a_target_no_freer_than_the_job_has_now_gains_nothing_unless_the_source_is_full() {
        let mut c = case();
        c.target_free = 1.0;
        c.source_free = 1.5; // the source has room: nobody takes what the job leaves
        let p = payoff(&c, MoveCost::FRAMEWORK.seconds(c.memory_bytes), 2.0);
        assert_eq!(p.gain, 0.0);
        assert!(!p.pays);
        c.source_free = 0.0;
        assert!(payoff(&c, MoveCost::FRAMEWORK.seconds(c.memory_bytes), 2.0).pays);
    }

    #[test]
    fn an_unknown_remaining_time_is_taken_as_the_time_run_so_far() {
        let mut c = case();
        c.remaining_s = None;
        let p = payoff(&c, MoveCost::CRIU.seconds(c.memory_bytes), 2.0);
        assert_eq!(p.remaining_s, 60.0);
        // 120 core-s against 2 × 6.5 s at 1 core.
        assert!(p.pays, "{p:?}");
        c.ran_s = 5.0;
        assert!(!payoff(&c, MoveCost::CRIU.seconds(c.memory_bytes), 2.0).pays);
    }

    #[test]
    fn a_job_with_room_on_an_unsaturated_node_gains_nothing_by_moving() {
        let mut c = case();
        c.source_free = 1.0;
        c.cores_now = 0.05;
        c.target_free = 4.0;
        let p = payoff(&c, MoveCost::FRAMEWORK.seconds(c.memory_bytes), 2.0);
        assert_eq!(p.gain, 0.0);
        assert!(!p.pays);
    }

    #[test]
    fn a_declared_core_count_caps_what_the_target_gives() {
        let mut c = case();
        c.cores_wanted = Some(1.0);
        c.source_free = 2.0;
        let p = payoff(&c, MoveCost::FRAMEWORK.seconds(c.memory_bytes), 2.0);
        assert_eq!(p.gain, 0.0, "it has what it wants already");
    }
}
