//! One job's application: the drift check, the memory guard, then what each file should hold
//! (within the original limits when they are ceilings) and in which order to write them.

use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::{ApplyOutcome, Core, Desired, JobState, KnobState};
use crate::cgroup::error::CgroupError;
use crate::cgroup::fs::CgroupUsage;
use crate::cgroup::guard::{GuardInput, GuardVerdict, memory_guard};
use crate::cgroup::hierarchy::{Controller, JobCgroup};
use crate::cgroup::knob::{
    Knob, WEIGHT_RANGE, cores_to_quota, encode_cpu_max, encode_memory, parse_cfs_quota,
    parse_cpu_max, parse_memory_limit, weight_to_shares,
};
use crate::policy::{CpuAllocation, MemoryAllocation};

impl Core {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply_job(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        cpu: CpuAllocation,
        memory: MemoryAllocation,
        usage: Option<&CgroupUsage>,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<(), CgroupError> {
        if js.next_verify_at.is_none_or(|t| now >= t) {
            self.verify(job, js, now, out)?;
            js.next_verify_at =
                Some(now + Duration::from_millis(self.config.drift_check_interval_ms));
        }
        let memory = if self.config.manage_memory {
            self.guarded_memory(job, js, memory, usage, now, out)?
        } else {
            MemoryAllocation::default()
        };
        let request = (cpu, memory);
        let pending = js.knobs.iter().any(|k| k.deferred_until.is_some());
        if js.settled == Some(request) && !pending {
            out.skipped += js.knobs.len();
            return Ok(());
        }
        let plan = self.plan(job, js, cpu, memory, out)?;
        let errors_before = out.errors.len();
        for (knob, desired) in plan {
            let Some(ks) = js.knob_mut(knob) else {
                continue;
            };
            self.execute(job, ks, desired, now, out)?;
        }
        let clean = out.errors.len() == errors_before
            && js.knobs.iter().all(|k| k.deferred_until.is_none());
        js.settled = clean.then_some(request);
        Ok(())
    }

    /// Run the memory guard when there is anything to guard.
    pub(super) fn guarded_memory(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        mut proposed: MemoryAllocation,
        usage: Option<&CgroupUsage>,
        now: Instant,
        out: &mut ApplyOutcome,
    ) -> Result<MemoryAllocation, CgroupError> {
        let v2 = self.kind().is_v2();
        let (high_knob, max_knob) = if v2 {
            (Knob::MemoryHigh, Knob::MemoryMax)
        } else {
            (Knob::MemorySoftLimit, Knob::MemoryLimit)
        };
        // Proposals for files this hierarchy/configuration does not govern are dropped first.
        if js.knob(max_knob).is_none() {
            proposed.max_bytes = None;
        }
        if js.knob(high_knob).is_none() {
            proposed.high_bytes = None;
        }
        let in_effect_of = |knob| {
            js.knob(knob)
                .and_then(|k: &KnobState| k.ours.as_deref())
                .and_then(parse_memory_limit)
                .flatten()
        };
        let in_effect = MemoryAllocation {
            high_bytes: in_effect_of(high_knob),
            max_bytes: in_effect_of(max_knob),
        };
        let cooling = js.guard.cooldown_until.is_some_and(|t| now < t);
        if !cooling {
            // An expired cool-down must not keep `next_wakeup` in the past.
            js.guard.cooldown_until = None;
        }
        let anything = proposed.high_bytes.is_some()
            || proposed.max_bytes.is_some()
            || in_effect.high_bytes.is_some()
            || in_effect.max_bytes.is_some()
            || cooling;
        if !anything {
            return Ok(proposed);
        }
        let observed = usage.and_then(|u| Some((u.memory_current?, u.memory_events?)));
        let (usage_bytes, events) = match observed {
            Some(o) => o,
            None => match self.fs.memory_usage(job)? {
                Some(o) => o,
                None => {
                    // Without usage the guard cannot vouch for any limit: set none.
                    if !js.memory_unavailable_reported {
                        js.memory_unavailable_reported = true;
                        let e = CgroupError::ControllerUnavailable {
                            job: job.clone(),
                            controller: Controller::Memory,
                            path: self
                                .fs
                                .file_path(job, Controller::Memory, "memory.current")
                                .unwrap_or_default(),
                        };
                        warn!(job = %job, error = %e, "no memory usage: memory limits not applied");
                        out.errors.push(e);
                    }
                    return Ok(MemoryAllocation::default());
                }
            },
        };
        let decision = memory_guard(
            &self.config.memory_guard,
            &GuardInput {
                proposed,
                usage_bytes,
                events,
                in_effect,
                now,
            },
            &js.guard,
        );
        js.guard = decision.state;
        out.guard = Some(decision.verdict);
        match decision.verdict {
            GuardVerdict::BackedOff {
                until,
                previous,
                now: events_now,
            } => {
                warn!(
                    job = %job,
                    usage_bytes,
                    high_events = events_now.high - previous.high.min(events_now.high),
                    max_events = events_now.max - previous.max.min(events_now.max),
                    oom_events = events_now.oom - previous.oom.min(events_now.oom),
                    oom_kills = events_now.oom_kill - previous.oom_kill.min(events_now.oom_kill),
                    cooldown_s = until.saturating_duration_since(now).as_secs(),
                    "memory pressure: lifting the governor's memory limits"
                );
                js.settled = None;
            }
            GuardVerdict::Raised => {
                debug!(job = %job, usage_bytes, proposed = ?proposed, safe = ?decision.allocation,
                    "memory guard raised the proposed limits");
            }
            GuardVerdict::Accepted | GuardVerdict::CoolingDown { .. } => {}
        }
        Ok(decision.allocation)
    }

    /// What each knob should hold for (cpu, memory), in the order to write them.
    pub(super) fn plan(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        cpu: CpuAllocation,
        memory: MemoryAllocation,
        out: &mut ApplyOutcome,
    ) -> Result<Vec<(Knob, Desired)>, CgroupError> {
        let period = self.config.cpu_period_us;
        let ceilings = self.config.original_limits_are_ceilings;
        let page = self.fs.page_size();
        let weight = cpu.weight.clamp(*WEIGHT_RANGE.start(), *WEIGHT_RANGE.end());
        let quota = cores_to_quota(cpu.max_cores, period);
        let mut plan: Vec<(Knob, Desired)> = Vec::with_capacity(js.knobs.len());
        let knobs: Vec<Knob> = js.knobs.iter().map(|k| k.knob).collect();
        for knob in knobs {
            let desired = match knob {
                Knob::CpuWeight => Desired::Set(weight.to_string()),
                Knob::CpuShares => Desired::Set(weight_to_shares(weight).to_string()),
                Knob::CpuMax => match quota {
                    None => Desired::Theirs,
                    Some(q) => {
                        let theirs = self.theirs(job, js, knob, out)?;
                        let cap = theirs.as_deref().and_then(parse_cpu_max);
                        match cap {
                            None if theirs.is_some() && ceilings => {
                                self.bad_original(job, js, knob, theirs, out);
                                Desired::Theirs
                            }
                            Some((Some(tq), tp)) if ceilings => {
                                let their_cores = tq as f64 / tp.unwrap_or(period).max(1) as f64;
                                if q as f64 / period as f64 >= their_cores {
                                    Desired::Theirs
                                } else {
                                    Desired::Set(encode_cpu_max(Some(q), period))
                                }
                            }
                            _ => Desired::Set(encode_cpu_max(Some(q), period)),
                        }
                    }
                },
                Knob::CfsQuota => match quota {
                    None => Desired::Theirs,
                    Some(q) => {
                        let theirs_q = self.theirs(job, js, Knob::CfsQuota, out)?;
                        let theirs_p = self.theirs(job, js, Knob::CfsPeriod, out)?;
                        let tq = theirs_q.as_deref().and_then(parse_cfs_quota);
                        let tp = theirs_p.as_deref().and_then(|p| p.parse::<u64>().ok());
                        match (tq, tp) {
                            (Some(Some(tq)), Some(tp)) if ceilings => {
                                if q as f64 / period as f64 >= tq as f64 / tp.max(1) as f64 {
                                    Desired::Theirs
                                } else {
                                    Desired::Set(q.to_string())
                                }
                            }
                            (None, _) | (_, None) if ceilings && theirs_q.is_some() => {
                                self.bad_original(job, js, knob, theirs_q, out);
                                Desired::Theirs
                            }
                            _ => Desired::Set(q.to_string()),
                        }
                    }
                },
                Knob::CfsPeriod => Desired::Theirs, // decided with the quota below
                Knob::MemoryHigh | Knob::MemorySoftLimit | Knob::MemoryMax | Knob::MemoryLimit => {
                    let bytes = if matches!(knob, Knob::MemoryHigh | Knob::MemorySoftLimit) {
                        memory.high_bytes
                    } else {
                        memory.max_bytes
                    };
                    match bytes {
                        None => Desired::Theirs,
                        Some(b) => {
                            let value = encode_memory(knob, Some(b), page);
                            let theirs = self.theirs(job, js, knob, out)?;
                            match theirs.as_deref().map(parse_memory_limit) {
                                Some(Some(Some(t))) if ceilings && b >= t => Desired::Theirs,
                                Some(None) if ceilings => {
                                    self.bad_original(job, js, knob, theirs, out);
                                    Desired::Theirs
                                }
                                _ => Desired::Set(value),
                            }
                        }
                    }
                }
            };
            plan.push((knob, desired));
        }
        // v1: the period follows the quota (written only together with a quota of ours).
        let quota_set = plan
            .iter()
            .any(|(k, d)| *k == Knob::CfsQuota && matches!(d, Desired::Set(_)));
        if quota_set && let Some(p) = plan.iter_mut().find(|(k, _)| *k == Knob::CfsPeriod) {
            p.1 = Desired::Set(period.to_string());
        }
        self.order(js, &mut plan);
        Ok(plan)
    }

    /// An original value that cannot be parsed: the file is left alone; said once per job.
    pub(super) fn bad_original(
        &self,
        job: &JobCgroup,
        js: &mut JobState,
        knob: Knob,
        content: Option<String>,
        out: &mut ApplyOutcome,
    ) {
        let Some(ks) = js.knob_mut(knob) else {
            return;
        };
        if std::mem::replace(&mut ks.bad_original_reported, true) {
            return;
        }
        let e = CgroupError::Parse {
            path: ks.path.clone(),
            content: content.unwrap_or_default(),
            reason: "cannot read the original limit; the file is left alone",
        };
        warn!(job = %job, file = %knob, error = %e, "not governing this file");
        out.errors.push(e);
    }

    /// Loosening writes first (in restore order), then the others in reverse restore order, so
    /// that a job is never briefly held tighter than both the old and the new settings allow:
    /// memory.max goes up before memory.high does, and memory.high comes down before memory.max.
    pub(super) fn order(&self, js: &JobState, plan: &mut [(Knob, Desired)]) {
        let page = self.fs.page_size();
        let loosening = |knob: Knob, desired: &Desired| -> bool {
            let Some(ks) = js.knob(knob) else {
                return false;
            };
            let from = ks.ours.as_deref().or(ks.theirs.as_deref());
            let to = match desired {
                Desired::Set(v) => Some(v.as_str()),
                Desired::Theirs => ks.theirs.as_deref(),
            };
            match (from, to) {
                (Some(f), Some(t)) => is_loosening(knob, f, t, page),
                _ => false,
            }
        };
        plan.sort_by_key(|(knob, desired)| {
            if loosening(*knob, desired) {
                (0, knob.restore_rank() as isize)
            } else {
                (1, -(knob.restore_rank() as isize))
            }
        });
    }

    /// Their value of `knob`, reading the file the first time it is needed.
    pub(super) fn theirs(
        &mut self,
        job: &JobCgroup,
        js: &mut JobState,
        knob: Knob,
        out: &mut ApplyOutcome,
    ) -> Result<Option<String>, CgroupError> {
        let Some(ks) = js.knob_mut(knob) else {
            return Ok(None);
        };
        if ks.theirs.is_none() && !ks.unavailable {
            match self.fs.read_job_file(job, knob.controller(), &ks.path) {
                Ok(c) => ks.theirs = Some(c.trim().to_owned()),
                Err(e @ CgroupError::CgroupGone { .. }) => return Err(e),
                Err(e @ CgroupError::ControllerUnavailable { .. }) => {
                    ks.unavailable = true;
                    warn!(job = %job, file = %knob, error = %e, "cannot govern this file");
                    out.errors.push(e);
                }
                Err(e) => out.errors.push(e),
            }
        }
        Ok(ks.theirs.clone())
    }
}

/// True when going from `from` to `to` gives the job more room (a higher memory or CPU limit,
/// unlimited included). Weights, shares and periods are neither.
pub(super) fn is_loosening(knob: Knob, from: &str, to: &str, page: u64) -> bool {
    let as_limit = |v: Option<u64>| v.unwrap_or(u64::MAX);
    match knob {
        Knob::MemoryMax | Knob::MemoryHigh | Knob::MemoryLimit | Knob::MemorySoftLimit => {
            match (parse_memory_limit(from), parse_memory_limit(to)) {
                (Some(f), Some(t)) => as_limit(t) > as_limit(f) && !knob.equivalent(from, to, page),
                _ => false,
            }
        }
        Knob::CpuMax => match (parse_cpu_max(from), parse_cpu_max(to)) {
            (Some((fq, fp)), Some((tq, tp))) => {
                let cores = |q: Option<u64>, p: Option<u64>| match q {
                    None => f64::INFINITY,
                    Some(q) => q as f64 / p.unwrap_or(100_000).max(1) as f64,
                };
                cores(tq, tp) > cores(fq, fp)
            }
            _ => false,
        },
        Knob::CfsQuota => match (parse_cfs_quota(from), parse_cfs_quota(to)) {
            (Some(f), Some(t)) => as_limit(t) > as_limit(f),
            _ => false,
        },
        Knob::CpuWeight | Knob::CpuShares | Knob::CfsPeriod => false,
    }
}
