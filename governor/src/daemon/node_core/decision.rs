//! The decision round: when to decide (within the decision budget), and the policy's plan
//! clamped to the operator's bounds, returned as the writes and releases ([`Effect`]s) the shell
//! carries out; their outcomes come back through [`NodeCore::limits_applied`] (and, for the
//! writes the actuator held back, [`NodeCore::held_back_write_done`]).

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::cgroup::{ApplyOutcome, CgroupError, JobCgroup};
use crate::policy::{Allocation, Category, CpuAllocation, JobSpec, MemoryAllocation};

use super::{Effect, NodeCore, RoundStats, decision_budget};

impl NodeCore {
    /// A job's progress signal moved: whether to decide now. Not when the last decision was so
    /// recent that deciding again would spend more than [`decision_budget`] of a core on
    /// decisions; then the decision is moved to when the budget allows (it sees every record
    /// that arrived in between). On a small node a decision takes tens of microseconds, so every
    /// record is acted on at once; with 1,000 jobs one takes ~3 ms and records arrive ~180 times
    /// a second, so they are batched every ~400 ms instead of costing 60% of a core.
    /// Returns true when the decision is to be made now (false: batched, due at
    /// [`Self::next_decision_at`]).
    pub fn on_progress_moved(&mut self, now: Instant) -> bool {
        let budget = decision_budget(self.jobs.len());
        let earliest = self
            .last_decision
            .map(|(at, took)| at + took.mul_f64(1.0 / budget));
        match earliest {
            Some(t) if t > now => {
                self.next_decision_at = Some(self.next_decision_at.map_or(t, |n| n.min(t)));
                false
            }
            _ => true,
        }
    }

    /// Whether the policy asked to be consulted by now.
    pub fn decision_due(&self, now: Instant) -> bool {
        self.next_decision_at.is_some_and(|t| t <= now)
    }

    /// When the next decision is due (the policy's timer, or a batched decision).
    pub fn next_decision_at(&self) -> Option<Instant> {
        self.next_decision_at
    }

    /// Ask the policy for a plan: each job's clamped allocation is pushed to `effects` as an
    /// [`Effect::ApplyLimits`], or, for a job the policy lets go after the governor wrote its
    /// files, an [`Effect::Release`] (none in dry-run). Returns the round's figures so far; the
    /// shell adds what the writes did, then ends the round with [`Self::round_done`].
    ///
    /// Only jobs whose clamped allocation differs from the one last applied without error, or
    /// whose usage was sampled since, are handed to the actuator: a decision after one log
    /// record usually changes one job, and walking the actuator for the others cost ~1 µs per
    /// job (1,000 jobs: ~1 ms per record). Writes the actuator held back (rate limit, drift
    /// back-off) and periodic drift checks need no decision: the shell runs them when the
    /// actuator says they are due.
    pub fn decide(&mut self, now: Instant, effects: &mut Vec<Effect>) -> RoundStats {
        let t = self.secs(now);
        let plan = self.policy.decide(t, &self.settings.resources);
        self.next_decision_at = plan.next_decision_at.map(|s| self.at(s));
        let mut stats = RoundStats {
            jobs: self.jobs.len(),
            ..Default::default()
        };
        // One pass over the job table. The plan is usually in the table's order (job ids are
        // the cgroup paths): each job's allocation is the plan's next one, else looked up.
        let mut in_order = plan.allocations.iter().peekable();
        for (cgroup, entry) in &mut self.jobs {
            let proposed = match in_order.next_if(|(id, _)| **id == entry.spec.id) {
                Some((_, a)) => a,
                None => match plan.allocations.get(&entry.spec.id) {
                    Some(a) => a,
                    None => continue,
                },
            };
            let mut cpu = proposed.cpu;
            let mut memory = proposed.memory;
            if self.settings.govern_memory {
                let usage = entry.usage.as_ref().and_then(|u| u.memory_current);
                memory = memory_proposal(proposed.category, memory, usage);
            }
            clamp_to_bounds(&mut cpu, &mut memory, &entry.spec);
            if !self.settings.govern_memory {
                // Memory files are not governed (the actuator would not write them anyway).
                memory = MemoryAllocation::default();
            }
            let changed = entry.allocation.as_ref().is_none_or(|a| {
                a.cpu != cpu || a.category != proposed.category || a.memory != memory
            });
            if changed {
                info!(
                    job = %entry.name,
                    category = %proposed.category,
                    weight = cpu.weight,
                    max_cores = ?cpu.max_cores,
                    memory_high = ?memory.high_bytes,
                    reason = %proposed.reason,
                    dry_run = self.settings.dry_run,
                    "decision"
                );
            }
            // The kernel default (weight 100, no cap, no memory limit) means "hands off": the
            // files keep whatever the kernel or the orchestrator set, and anything the governor
            // wrote earlier is put back. So `fair` never writes, and a job a policy lets go is
            // restored rather than pinned to weight 100.
            let hands_off = cpu == CpuAllocation::DEFAULT && memory == MemoryAllocation::default();
            if hands_off {
                if entry.touched && !self.settings.dry_run {
                    effects.push(Effect::Release {
                        cgroup: cgroup.clone(),
                    });
                }
                entry.touched = false;
                entry.applied = None;
            } else if !self.settings.dry_run && entry.applied != Some((cpu, memory)) {
                entry.touched = true;
                let alloc = Allocation {
                    category: proposed.category,
                    cpu,
                    memory,
                    reason: String::new(),
                };
                stats.applied += 1;
                // Applied once the write succeeds (`limits_applied`); until then the next
                // round tries again.
                entry.applied = None;
                effects.push(Effect::ApplyLimits {
                    cgroup: cgroup.clone(),
                    alloc,
                    usage: entry.usage,
                });
            }
            // Keep the allocation shown in status; its reason is copied only when it changed.
            match &mut entry.allocation {
                Some(a) if !changed => {
                    if a.reason != proposed.reason {
                        a.reason.clone_from(&proposed.reason);
                    }
                }
                slot => {
                    *slot = Some(Allocation {
                        category: proposed.category,
                        cpu,
                        memory,
                        reason: proposed.reason.clone(),
                    })
                }
            }
        }
        // Migration requests are events (SpeCon asks once per job and then leaves the job
        // alone): a job keeps its request until it leaves the node or the policy is changed,
        // so the coordinator sees it in every report until it acts. Logged once.
        if !plan.move_requests.is_empty() {
            let requested: std::collections::HashMap<&crate::policy::JobId, &str> = plan
                .move_requests
                .iter()
                .map(|m| (&m.job, m.reason.as_str()))
                .collect();
            for entry in self.jobs.values_mut() {
                let Some(&reason) = requested.get(&entry.spec.id) else {
                    continue;
                };
                if entry.move_request.as_deref() != Some(reason) {
                    if entry.move_request.is_none() {
                        info!(job = %entry.name, reason, "the policy asks to move this job to another node");
                    }
                    entry.move_request = Some(reason.to_owned());
                }
            }
        }
        self.last_plan = plan;
        stats
    }

    /// The outcome of an [`Effect::ApplyLimits`] the shell carried out: without errors, the job
    /// counts as applied until its allocation or usage changes; a failure is logged once per
    /// failing spell (decisions come every second) and retried next round.
    pub fn limits_applied(
        &mut self,
        cgroup: &JobCgroup,
        alloc: &Allocation,
        result: &Result<ApplyOutcome, CgroupError>,
    ) {
        self.metrics.applied(result);
        let Some(entry) = self.jobs.get_mut(cgroup) else {
            // No longer governed (not in practice: the shell carries out a round at once).
            if let Err(e) = result {
                log_apply_error(&cgroup.to_string(), cgroup, e, &mut false);
            }
            return;
        };
        match result {
            Ok(outcome) => {
                if outcome.errors.is_empty() {
                    entry.applied = Some((alloc.cpu, alloc.memory));
                }
                if entry.apply_failing {
                    info!(job = %entry.name, "decisions apply again");
                    entry.apply_failing = false;
                }
            }
            Err(e) => log_apply_error(&entry.name, cgroup, e, &mut entry.apply_failing),
        }
    }

    /// The round is over: `took` is what it cost (the policy's plan and the shell's writes),
    /// which the decision budget spaces the next decisions by.
    pub fn round_done(&mut self, now: Instant, took: Duration) {
        self.metrics.decided(took);
        self.last_decision = Some((now, took));
        // The policy's own next decision time stays within the budget too (the shortest-left
        // policy asks every second; with 1,000 jobs a decision takes ~2 ms).
        let earliest = now + took.mul_f64(1.0 / decision_budget(self.jobs.len()));
        if let Some(next) = self.next_decision_at.as_mut() {
            *next = (*next).max(earliest);
        }
    }

    /// The outcome of a write the actuator held back (rate limit, drift back-off) and made when
    /// it fell due: counted, and a failure logged as a round's would be.
    pub fn held_back_write_done(
        &mut self,
        cgroup: &JobCgroup,
        result: &Result<ApplyOutcome, CgroupError>,
    ) {
        self.metrics.applied(result);
        if let Err(e) = result {
            let mut failing_elsewhere = false;
            let (name, failing) = match self.jobs.get_mut(cgroup) {
                Some(entry) => (entry.name.clone(), &mut entry.apply_failing),
                None => (cgroup.to_string(), &mut failing_elsewhere),
            };
            log_apply_error(&name, cgroup, e, failing);
        }
    }
}

/// The memory policy (with `govern_memory`): a job that is still learning keeps whatever memory
/// limits its orchestrator set; a job the policy sees as slowing down or converged is asked to
/// shrink to its current usage (`memory.high`), which reclaims its cold page cache for the jobs
/// that still learn. The actuator's memory guard turns "current usage" into usage plus headroom,
/// raises the limit as the job grows, and lifts it at once on any pressure event, so the
/// proposal can never get a job OOM-killed. A policy's own memory proposal takes precedence.
pub(super) fn memory_proposal(
    category: Category,
    proposed: MemoryAllocation,
    usage: Option<u64>,
) -> MemoryAllocation {
    if proposed != MemoryAllocation::default() {
        return proposed;
    }
    match (category, usage) {
        (Category::Watching | Category::Converged, Some(bytes)) if bytes > 0 => MemoryAllocation {
            high_bytes: Some(bytes),
            max_bytes: None,
        },
        _ => MemoryAllocation::default(),
    }
}

/// Operator bounds override any policy: a cap never below `min_cores`, never above `max_cores`.
pub(super) fn clamp_to_bounds(
    cpu: &mut CpuAllocation,
    memory: &mut MemoryAllocation,
    spec: &JobSpec,
) {
    let b = &spec.bounds;
    if let Some(max) = b.max_cores {
        cpu.max_cores = Some(cpu.max_cores.map_or(max, |c| c.min(max)));
    }
    if let (Some(min), Some(c)) = (b.min_cores, cpu.max_cores)
        && c < min
    {
        cpu.max_cores = Some(min);
    }
    if let Some(max) = b.max_memory_bytes {
        memory.max_bytes = Some(memory.max_bytes.map_or(max, |m| m.min(max)));
    }
    if let Some(min) = b.min_memory_bytes {
        for v in [&mut memory.high_bytes, &mut memory.max_bytes]
            .into_iter()
            .flatten()
        {
            *v = (*v).max(min);
        }
    }
}

/// A failed application: a warning the first time, then debug lines until it succeeds again.
pub(super) fn log_apply_error(job: &str, cgroup: &JobCgroup, e: &CgroupError, failing: &mut bool) {
    if e.is_gone() {
        debug!(job, cgroup = %cgroup, "cgroup vanished while applying");
    } else if *failing {
        debug!(job, cgroup = %cgroup, error = %e, "cannot apply the decision, still");
    } else {
        warn!(job, cgroup = %cgroup, error = %e, "cannot apply the decision; will retry");
        *failing = true;
    }
}
