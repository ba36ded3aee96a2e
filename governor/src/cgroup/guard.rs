//! The memory guard: turns a policy's memory proposal into one that cannot get the job
//! OOM-killed because of the governor. Pure and deterministic (the caller passes the clock).
//!
//! Rules, in order:
//! 1. **Back off at once on pressure.** If any of the `high`, `max`, `oom`, `oom_kill` counters of
//!    `memory.events` grew since the previous check, the guard drops every limit of ours (the
//!    actuator restores the original values immediately, bypassing its rate limit) and holds off
//!    tightening for a cool-down. The cool-down doubles with each back-off that follows soon
//!    after the previous one (capped), and resets after a long quiet spell.
//! 2. **Never below usage plus headroom.** A proposed `memory.high` or `memory.max` below
//!    `usage + headroom` (headroom = max(fraction × usage, minimum)) is raised. The usage is
//!    `memory.current`, which includes page cache: conservative, the limit can only be higher than
//!    with anonymous memory alone.
//! 3. **Throttle before killing.** `memory.high` only throttles and reclaims; `memory.max` invokes
//!    the OOM killer. So `memory.max` is kept at least one headroom above `memory.high`, and when a
//!    policy proposes only `memory.max` the guard adds a `memory.high` one headroom below it
//!    (`throttle_before_max`). A job that grows towards the hard limit is then slowed by the kernel
//!    first, the `high` counter grows, and rule 1 lifts the limits before the job reaches them.
//! 4. **Hysteresis.** When the floor binds (the proposal is below it), the limit is set to one
//!    headroom above the floor and left alone while it stays between the floor and two headrooms
//!    above it, so a slowly growing job does not cause a write per tick.
//!
//! The guard never returns a limit above what the policy proposed unless a rule above demanded
//! it, and `None` (leave the original value) is never turned into a limit except by rule 3.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::fs::MemoryEvents;
use crate::policy::MemoryAllocation;

/// Tunables of the memory guard.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryGuardConfig {
    /// Headroom as a fraction of current usage (default 0.10).
    pub headroom_fraction: f64,
    /// Minimum headroom in bytes (default 64 MiB).
    pub headroom_min_bytes: u64,
    /// Cool-down after a back-off during which no limit is tightened, in milliseconds
    /// (default 60 000).
    pub cooldown_ms: u64,
    /// Longest cool-down after repeated back-offs, in milliseconds (default 900 000).
    pub max_cooldown_ms: u64,
    /// Add a `memory.high` below a proposed `memory.max` (default true).
    pub throttle_before_max: bool,
}

impl Default for MemoryGuardConfig {
    fn default() -> Self {
        MemoryGuardConfig {
            headroom_fraction: 0.10,
            headroom_min_bytes: 64 << 20,
            cooldown_ms: 60_000,
            max_cooldown_ms: 900_000,
            throttle_before_max: true,
        }
    }
}

impl MemoryGuardConfig {
    /// The headroom for `usage` bytes: max(fraction × usage, minimum). A negative or NaN fraction
    /// counts as 0.
    pub fn headroom(&self, usage: u64) -> u64 {
        let fraction = if self.headroom_fraction.is_finite() && self.headroom_fraction > 0.0 {
            self.headroom_fraction
        } else {
            0.0
        };
        let proportional = (usage as f64 * fraction).min(u64::MAX as f64) as u64;
        proportional.max(self.headroom_min_bytes)
    }

    fn cooldown_after(&self, consecutive_backoffs: u32) -> Duration {
        let base = self.cooldown_ms;
        let factor = 1u64 << consecutive_backoffs.saturating_sub(1).min(16);
        Duration::from_millis(
            base.saturating_mul(factor)
                .min(self.max_cooldown_ms.max(base)),
        )
    }
}

/// What the guard remembers about a job between checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardState {
    /// Counters at the previous check (`None` before the first).
    pub last_events: Option<MemoryEvents>,
    /// No tightening before this instant.
    pub cooldown_until: Option<Instant>,
    /// Back-offs in a row (each within a quiet spell of the previous).
    pub consecutive_backoffs: u32,
    /// When the last back-off happened.
    pub last_backoff_at: Option<Instant>,
}

/// One check's inputs.
#[derive(Clone, Copy, Debug)]
pub struct GuardInput {
    /// What the policy proposes.
    pub proposed: MemoryAllocation,
    /// Memory charged to the job now (`memory.current`).
    pub usage_bytes: u64,
    /// `memory.events` now.
    pub events: MemoryEvents,
    /// The limits of ours in effect now (`None` = the original value is in effect).
    pub in_effect: MemoryAllocation,
    /// The caller's clock.
    pub now: Instant,
}

/// Why the guard returned what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardVerdict {
    /// The proposal was safe as it stood.
    Accepted,
    /// At least one limit was raised to keep usage plus headroom (or added by rule 3).
    Raised,
    /// Pressure appeared: every limit of ours is lifted, no tightening until `until`.
    BackedOff {
        until: Instant,
        previous: MemoryEvents,
        now: MemoryEvents,
    },
    /// Still cooling down after a back-off: no limits of ours until `until`.
    CoolingDown { until: Instant },
}

/// The guard's answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuardDecision {
    /// The safe allocation to apply (`None` fields: restore/leave the original value).
    pub allocation: MemoryAllocation,
    /// State to pass to the next check.
    pub state: GuardState,
    pub verdict: GuardVerdict,
}

/// Make `input.proposed` safe (see the module doc for the rules).
pub fn memory_guard(
    config: &MemoryGuardConfig,
    input: &GuardInput,
    state: &GuardState,
) -> GuardDecision {
    let now = input.now;
    let mut next = GuardState {
        last_events: Some(input.events),
        ..*state
    };
    let lifted = MemoryAllocation::default();

    // Rule 1: pressure since the last check.
    if let Some(previous) = state.last_events
        && input.events.pressure_since(&previous)
    {
        let quiet_spell = Duration::from_millis(config.max_cooldown_ms.max(config.cooldown_ms));
        let recent = state
            .last_backoff_at
            .is_some_and(|t| now.saturating_duration_since(t) <= quiet_spell * 2);
        next.consecutive_backoffs = if recent {
            state.consecutive_backoffs.saturating_add(1)
        } else {
            1
        };
        let until = now + config.cooldown_after(next.consecutive_backoffs);
        next.cooldown_until = Some(until);
        next.last_backoff_at = Some(now);
        return GuardDecision {
            allocation: lifted,
            state: next,
            verdict: GuardVerdict::BackedOff {
                until,
                previous,
                now: input.events,
            },
        };
    }
    if let Some(until) = state.cooldown_until {
        if now < until {
            return GuardDecision {
                allocation: lifted,
                state: next,
                verdict: GuardVerdict::CoolingDown { until },
            };
        }
        next.cooldown_until = None;
    }

    // Rules 2-4.
    let usage = input.usage_bytes;
    let headroom = config.headroom(usage);
    let floor = usage.saturating_add(headroom);
    let mut raised = false;

    let proposed_high = match (input.proposed.high_bytes, input.proposed.max_bytes) {
        (Some(h), _) => Some(h),
        (None, Some(m)) if config.throttle_before_max => {
            raised = true;
            Some(m.saturating_sub(headroom))
        }
        (None, _) => None,
    };
    let high = proposed_high.map(|p| {
        let (v, r) = above_floor(p, input.in_effect.high_bytes, floor, headroom);
        raised |= r;
        v
    });
    let max_floor = match high {
        Some(h) => floor.max(h.saturating_add(headroom)),
        None => floor,
    };
    let max = input.proposed.max_bytes.map(|p| {
        let (v, r) = above_floor(p, input.in_effect.max_bytes, max_floor, headroom);
        raised |= r;
        v
    });
    GuardDecision {
        allocation: MemoryAllocation {
            high_bytes: high,
            max_bytes: max,
        },
        state: next,
        verdict: if raised {
            GuardVerdict::Raised
        } else {
            GuardVerdict::Accepted
        },
    }
}

/// One limit against its floor, with hysteresis: returns the limit and whether it was raised.
fn above_floor(proposed: u64, in_effect: Option<u64>, floor: u64, headroom: u64) -> (u64, bool) {
    if proposed >= floor {
        return (proposed, false);
    }
    let keep_up_to = floor.saturating_add(headroom.saturating_mul(2));
    match in_effect {
        Some(current) if current >= floor && current <= keep_up_to => (current, true),
        _ => (floor.saturating_add(headroom), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn cfg() -> MemoryGuardConfig {
        MemoryGuardConfig::default()
    }

    fn alloc(high: Option<u64>, max: Option<u64>) -> MemoryAllocation {
        MemoryAllocation {
            high_bytes: high,
            max_bytes: max,
        }
    }

    fn input(proposed: MemoryAllocation, usage: u64, events: MemoryEvents) -> GuardInput {
        GuardInput {
            proposed,
            usage_bytes: usage,
            events,
            in_effect: MemoryAllocation::default(),
            now: Instant::now(),
        }
    }

    fn high_events(n: u64) -> MemoryEvents {
        MemoryEvents {
            high: n,
            ..Default::default()
        }
    }

    #[test]
    fn headroom_is_the_larger_of_fraction_and_minimum() {
        let c = cfg();
        assert_eq!(c.headroom(0), 64 * MIB);
        assert_eq!(c.headroom(100 * MIB), 64 * MIB);
        assert_eq!(c.headroom(1000 * MIB), 100 * MIB);
        let absurd = c.headroom(u64::MAX);
        assert!(
            absurd > u64::MAX / 11 && absurd < u64::MAX / 9,
            "10% of an absurd usage, without overflow: {absurd}"
        );
        let bad = MemoryGuardConfig {
            headroom_fraction: f64::NAN,
            ..c
        };
        assert_eq!(bad.headroom(1000 * MIB), 64 * MIB);
        let negative = MemoryGuardConfig {
            headroom_fraction: -1.0,
            ..c
        };
        assert_eq!(negative.headroom(1000 * MIB), 64 * MIB);
    }

    #[test]
    fn a_generous_proposal_is_accepted_unchanged() {
        let d = memory_guard(
            &cfg(),
            &input(
                alloc(Some(2000 * MIB), Some(3000 * MIB)),
                500 * MIB,
                high_events(0),
            ),
            &GuardState::default(),
        );
        assert_eq!(d.allocation, alloc(Some(2000 * MIB), Some(3000 * MIB)));
        assert_eq!(d.verdict, GuardVerdict::Accepted);
        assert_eq!(d.state.last_events, Some(high_events(0)));
    }

    #[test]
    fn no_proposal_stays_no_limit() {
        let d = memory_guard(
            &cfg(),
            &input(alloc(None, None), 500 * MIB, high_events(0)),
            &GuardState::default(),
        );
        assert_eq!(d.allocation, alloc(None, None));
        assert_eq!(d.verdict, GuardVerdict::Accepted);
    }

    #[test]
    fn a_limit_below_usage_plus_headroom_is_raised_with_slack() {
        // usage 1000 MiB, headroom 100 MiB: floor 1100, set at floor + headroom = 1200.
        let d = memory_guard(
            &cfg(),
            &input(alloc(Some(100 * MIB), None), 1000 * MIB, high_events(0)),
            &GuardState::default(),
        );
        assert_eq!(d.allocation.high_bytes, Some(1200 * MIB));
        assert_eq!(d.allocation.max_bytes, None);
        assert_eq!(d.verdict, GuardVerdict::Raised);
    }

    #[test]
    fn a_limit_exactly_at_the_floor_is_accepted() {
        let d = memory_guard(
            &cfg(),
            &input(alloc(Some(1100 * MIB), None), 1000 * MIB, high_events(0)),
            &GuardState::default(),
        );
        assert_eq!(d.allocation.high_bytes, Some(1100 * MIB));
        assert_eq!(d.verdict, GuardVerdict::Accepted);
    }

    #[test]
    fn max_stays_a_headroom_above_high() {
        // high proposed 1500 (safe), max proposed 1500: max raised to high + headroom.
        let d = memory_guard(
            &cfg(),
            &input(
                alloc(Some(1500 * MIB), Some(1500 * MIB)),
                1000 * MIB,
                high_events(0),
            ),
            &GuardState::default(),
        );
        assert_eq!(d.allocation.high_bytes, Some(1500 * MIB));
        let max = d.allocation.max_bytes.unwrap();
        assert!(max >= 1600 * MIB, "max {max} not a headroom above high");
        assert_eq!(d.verdict, GuardVerdict::Raised);
    }

    #[test]
    fn a_max_only_proposal_gets_a_high_below_it() {
        let d = memory_guard(
            &cfg(),
            &input(alloc(None, Some(3000 * MIB)), 1000 * MIB, high_events(0)),
            &GuardState::default(),
        );
        assert_eq!(d.allocation.high_bytes, Some(2900 * MIB));
        assert_eq!(d.allocation.max_bytes, Some(3000 * MIB));
        let no_throttle = MemoryGuardConfig {
            throttle_before_max: false,
            ..cfg()
        };
        let d = memory_guard(
            &no_throttle,
            &input(alloc(None, Some(3000 * MIB)), 1000 * MIB, high_events(0)),
            &GuardState::default(),
        );
        assert_eq!(d.allocation, alloc(None, Some(3000 * MIB)));
    }

    #[test]
    fn a_tiny_max_only_proposal_is_made_safe_on_both_files() {
        let d = memory_guard(
            &cfg(),
            &input(alloc(None, Some(MIB)), 1000 * MIB, high_events(0)),
            &GuardState::default(),
        );
        let high = d.allocation.high_bytes.unwrap();
        let max = d.allocation.max_bytes.unwrap();
        assert!(high >= 1100 * MIB, "high {high}");
        assert!(max >= high + 100 * MIB, "max {max} high {high}");
    }

    #[test]
    fn hysteresis_keeps_a_safe_limit_while_usage_creeps_up() {
        let c = cfg();
        let mut state = GuardState::default();
        let mut in_effect = alloc(None, None);
        let mut writes = 0;
        // A policy squeezing to 64 MiB while usage grows 1 MiB per check from 100 to 300 MiB.
        for usage_mib in 100..=300u64 {
            let usage = usage_mib * MIB;
            let d = memory_guard(
                &c,
                &GuardInput {
                    proposed: alloc(Some(64 * MIB), None),
                    usage_bytes: usage,
                    events: high_events(0),
                    in_effect,
                    now: Instant::now(),
                },
                &state,
            );
            let high = d.allocation.high_bytes.unwrap();
            assert!(
                high >= usage + c.headroom(usage),
                "high {high} below usage {usage} + headroom"
            );
            if Some(high) != in_effect.high_bytes {
                writes += 1;
            }
            in_effect = d.allocation;
            state = d.state;
        }
        assert!(
            writes <= 5,
            "{writes} writes for 200 MiB of growth: no hysteresis"
        );
    }

    #[test]
    fn hysteresis_lowers_a_limit_left_far_above_a_shrunken_usage() {
        let d = memory_guard(
            &cfg(),
            &GuardInput {
                proposed: alloc(Some(10 * MIB), None),
                usage_bytes: 100 * MIB,
                events: high_events(0),
                in_effect: alloc(Some(2000 * MIB), None),
                now: Instant::now(),
            },
            &GuardState::default(),
        );
        // floor 164, slack limit 228: 2000 is beyond floor + 2 headrooms, so it comes down.
        assert_eq!(d.allocation.high_bytes, Some(228 * MIB));
    }

    #[test]
    fn pressure_backs_off_at_once_and_cools_down() {
        let c = cfg();
        let t0 = Instant::now();
        let first = memory_guard(
            &c,
            &input(
                alloc(Some(200 * MIB), Some(400 * MIB)),
                100 * MIB,
                high_events(3),
            ),
            &GuardState::default(),
        );
        assert_eq!(first.verdict, GuardVerdict::Accepted);

        for (counter, events) in [
            ("high", high_events(4)),
            (
                "max",
                MemoryEvents {
                    high: 3,
                    max: 1,
                    ..Default::default()
                },
            ),
            (
                "oom",
                MemoryEvents {
                    high: 3,
                    oom: 1,
                    ..Default::default()
                },
            ),
            (
                "oom_kill",
                MemoryEvents {
                    high: 3,
                    oom_kill: 1,
                    ..Default::default()
                },
            ),
        ] {
            let d = memory_guard(
                &c,
                &GuardInput {
                    proposed: alloc(Some(200 * MIB), Some(400 * MIB)),
                    usage_bytes: 150 * MIB,
                    events,
                    in_effect: alloc(Some(200 * MIB), Some(400 * MIB)),
                    now: t0,
                },
                &first.state,
            );
            assert_eq!(
                d.allocation,
                alloc(None, None),
                "{counter} growth did not lift the limits"
            );
            match d.verdict {
                GuardVerdict::BackedOff { until, .. } => {
                    assert_eq!(until, t0 + Duration::from_millis(c.cooldown_ms))
                }
                v => panic!("{counter}: expected a back-off, got {v:?}"),
            }
        }
    }

    #[test]
    fn no_tightening_during_the_cool_down_then_back_to_normal() {
        let c = cfg();
        let t0 = Instant::now();
        let state = GuardState {
            last_events: Some(high_events(1)),
            ..Default::default()
        };
        let backoff = memory_guard(
            &c,
            &GuardInput {
                proposed: alloc(Some(200 * MIB), None),
                usage_bytes: 100 * MIB,
                events: high_events(2),
                in_effect: alloc(Some(200 * MIB), None),
                now: t0,
            },
            &state,
        );
        let during = memory_guard(
            &c,
            &GuardInput {
                proposed: alloc(Some(200 * MIB), None),
                usage_bytes: 100 * MIB,
                events: high_events(2),
                in_effect: alloc(None, None),
                now: t0 + Duration::from_secs(30),
            },
            &backoff.state,
        );
        assert_eq!(during.allocation, alloc(None, None));
        assert!(matches!(during.verdict, GuardVerdict::CoolingDown { .. }));
        let after = memory_guard(
            &c,
            &GuardInput {
                proposed: alloc(Some(200 * MIB), None),
                usage_bytes: 100 * MIB,
                events: high_events(2),
                in_effect: alloc(None, None),
                now: t0 + Duration::from_secs(61),
            },
            &during.state,
        );
        assert_eq!(after.allocation, alloc(Some(200 * MIB), None));
        assert_eq!(after.state.cooldown_until, None);
    }

    #[test]
    fn repeated_back_offs_lengthen_the_cool_down_up_to_the_cap() {
        let c = cfg();
        let t0 = Instant::now();
        let mut state = GuardState {
            last_events: Some(high_events(0)),
            ..Default::default()
        };
        let mut cooldowns = Vec::new();
        let mut now = t0;
        for i in 1..=8u64 {
            let d = memory_guard(
                &c,
                &GuardInput {
                    proposed: alloc(Some(200 * MIB), None),
                    usage_bytes: 100 * MIB,
                    events: high_events(i),
                    in_effect: alloc(Some(200 * MIB), None),
                    now,
                },
                &state,
            );
            let GuardVerdict::BackedOff { until, .. } = d.verdict else {
                panic!("expected a back-off at step {i}, got {:?}", d.verdict)
            };
            cooldowns.push((until - now).as_secs());
            now = until;
            state = d.state;
        }
        assert_eq!(cooldowns, vec![60, 120, 240, 480, 900, 900, 900, 900]);

        // After a long quiet spell the next back-off starts from the base cool-down again.
        let later = now + Duration::from_secs(3 * 3600);
        let d = memory_guard(
            &c,
            &GuardInput {
                proposed: alloc(Some(200 * MIB), None),
                usage_bytes: 100 * MIB,
                events: high_events(100),
                in_effect: alloc(None, None),
                now: later,
            },
            &state,
        );
        let GuardVerdict::BackedOff { until, .. } = d.verdict else {
            panic!("expected a back-off")
        };
        assert_eq!((until - later).as_secs(), 60);
    }

    #[test]
    fn the_first_check_cannot_see_pressure() {
        let d = memory_guard(
            &cfg(),
            &input(alloc(Some(500 * MIB), None), 100 * MIB, high_events(1000)),
            &GuardState::default(),
        );
        assert_eq!(d.verdict, GuardVerdict::Accepted);
    }

    #[test]
    fn counters_that_went_down_are_a_new_cgroup_not_pressure() {
        let state = GuardState {
            last_events: Some(high_events(50)),
            ..Default::default()
        };
        let d = memory_guard(
            &cfg(),
            &input(alloc(Some(500 * MIB), None), 100 * MIB, high_events(0)),
            &state,
        );
        assert_eq!(d.verdict, GuardVerdict::Accepted);
    }

    #[test]
    fn absurd_inputs_saturate_instead_of_panicking() {
        let d = memory_guard(
            &cfg(),
            &input(alloc(Some(0), Some(0)), u64::MAX - 5, high_events(0)),
            &GuardState::default(),
        );
        assert_eq!(d.allocation, alloc(Some(u64::MAX), Some(u64::MAX)));
        let zero_cooldown = MemoryGuardConfig {
            cooldown_ms: 0,
            max_cooldown_ms: 0,
            ..cfg()
        };
        let d = memory_guard(
            &zero_cooldown,
            &GuardInput {
                proposed: alloc(Some(10), None),
                usage_bytes: 0,
                events: high_events(u64::MAX),
                in_effect: alloc(None, None),
                now: Instant::now(),
            },
            &GuardState {
                last_events: Some(high_events(0)),
                consecutive_backoffs: u32::MAX,
                last_backoff_at: Some(Instant::now()),
                ..Default::default()
            },
        );
        assert!(matches!(d.verdict, GuardVerdict::BackedOff { .. }));
    }

    /// Property: whatever the policy proposes, every limit the guard returns is at least usage
    /// plus headroom, and max is at least high plus headroom.
    #[test]
    fn property_limits_are_never_below_the_floor() {
        use proptest::prelude::*;
        proptest!(|(
            high in proptest::option::of(0u64..(64 << 30)),
            max in proptest::option::of(0u64..(64 << 30)),
            usage in 0u64..(64 << 30),
            eff_high in proptest::option::of(0u64..(64 << 30)),
            eff_max in proptest::option::of(0u64..(64 << 30)),
        )| {
            let c = cfg();
            let d = memory_guard(&c, &GuardInput {
                proposed: alloc(high, max),
                usage_bytes: usage,
                events: MemoryEvents::default(),
                in_effect: alloc(eff_high, eff_max),
                now: Instant::now(),
            }, &GuardState::default());
            let floor = usage + c.headroom(usage);
            if let Some(h) = d.allocation.high_bytes {
                prop_assert!(h >= floor);
                if let Some(p) = high { prop_assert!(h >= p.min(floor)); }
            }
            if let Some(m) = d.allocation.max_bytes {
                prop_assert!(m >= floor);
                if let Some(h) = d.allocation.high_bytes {
                    prop_assert!(m >= h + c.headroom(usage));
                }
            }
            prop_assert_eq!(d.allocation.max_bytes.is_some(), max.is_some());
            prop_assert_eq!(d.allocation.high_bytes.is_some(), high.is_some() || max.is_some());
        });
    }
}
