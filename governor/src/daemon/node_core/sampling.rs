//! The periodic usage sample: each job's CPU and memory usage handed to the policy. The reads
//! are the shell's ([`CpuSampler`], and the job's cgroup usage through `read_usage`); the core
//! only turns them into the policy's view.

use std::time::Instant;

use crate::cgroup::{CgroupUsage, JobCgroup};
use crate::policy::Usage;

use super::{CpuSampler, NodeCore};

impl NodeCore {
    /// Sample every job's CPU and memory usage and hand it to the policy. `read_usage` reads a
    /// job's cgroup usage (`None`: unreadable, or the cgroup is gone); it is called once per
    /// job, in table order, after the CPU sampler.
    pub fn sample(
        &mut self,
        now: Instant,
        cpu: &mut dyn CpuSampler,
        read_usage: &mut dyn FnMut(&JobCgroup) -> Option<CgroupUsage>,
    ) {
        let t = self.secs(now);
        let groups: Vec<JobCgroup> = self.jobs.keys().cloned().collect();
        let cpu_seconds = cpu.cpu_seconds(&groups);
        let wait_seconds = cpu.wait_seconds(&groups);
        // `groups` are the table's keys in order: walk the table alongside (a lookup per job
        // compares paths component by component).
        for (((cgroup, entry), cpu_s), wait_s) in
            self.jobs.iter_mut().zip(cpu_seconds).zip(wait_seconds)
        {
            let usage = read_usage(cgroup);
            let cpu_s = cpu_s.or_else(|| {
                usage
                    .as_ref()
                    .and_then(|u| u.cpu_usage_usec)
                    .map(|us| us as f64 / 1e6)
            });
            if let Some(c) = cpu_s {
                if let Some((t0, c0)) = entry.cpu_prev {
                    let dt = now.saturating_duration_since(t0).as_secs_f64();
                    if dt > 0.0 {
                        entry.cpu_cores = Some(((c - c0) / dt).max(0.0));
                    }
                }
                entry.cpu_prev = Some((now, c));
                entry.cpu_seconds = Some(c);
            }
            let memory = usage.as_ref().and_then(|u| u.memory_current).unwrap_or(0);
            let pressure = usage
                .as_ref()
                .and_then(|u| u.memory_events.as_ref())
                .map(|e| e.high + e.max + e.oom)
                .unwrap_or(0);
            if let Some(c) = entry.cpu_seconds {
                self.policy.usage(
                    t,
                    &entry.spec.id,
                    Usage {
                        at: t,
                        cpu_seconds: c,
                        memory_bytes: memory,
                        memory_pressure_events: pressure,
                        cpu_wait_seconds: wait_s.or_else(|| {
                            usage
                                .as_ref()
                                .and_then(|u| u.cpu_wait_usec)
                                .map(|us| us as f64 / 1e6)
                        }),
                    },
                );
            }
            entry.usage = usage;
            // The memory guard must see the new usage: the next round applies this job.
            entry.applied = None;
        }
    }
}
