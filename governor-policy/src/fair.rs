//! `fair`: change nothing and let the kernel share the node (weight 100, no caps). The baseline
//! every other policy is compared with.

use std::collections::BTreeSet;

use super::{
    Allocation, Category, JobId, JobSpec, NodePolicy, NodeResources, Plan, ProgressPoint, Seconds,
    Usage,
};

/// The kernel's default sharing.
#[derive(Debug, Default)]
pub struct Fair {
    jobs: BTreeSet<JobId>,
}

impl NodePolicy for Fair {
    fn name(&self) -> &'static str {
        "fair"
    }

    fn decides_on_progress(&self) -> bool {
        false
    }

    fn job_added(&mut self, _now: Seconds, spec: &JobSpec) {
        self.jobs.insert(spec.id.clone());
    }

    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        self.jobs.remove(id);
    }

    fn progress(&mut self, _now: Seconds, _id: &JobId, _point: ProgressPoint) {}

    fn usage(&mut self, _now: Seconds, _id: &JobId, _usage: Usage) {}

    fn decide(&mut self, _now: Seconds, _node: &NodeResources) -> Plan {
        Plan {
            allocations: self
                .jobs
                .iter()
                .map(|id| {
                    (
                        id.clone(),
                        Allocation::unmanaged(Category::Unknown, "fair: kernel default sharing"),
                    )
                })
                .collect(),
            move_requests: Vec::new(),
            next_decision_at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuAllocation;

    #[test]
    fn fair_leaves_every_job_at_the_kernel_default() {
        let mut p = Fair::default();
        p.job_added(0.0, &JobSpec::new("a"));
        p.job_added(1.0, &JobSpec::new("b"));
        p.job_removed(2.0, &JobId::from("a"));
        let plan = p.decide(
            3.0,
            &NodeResources {
                cores: 2.0,
                memory_bytes: 1 << 30,
            },
        );
        assert_eq!(plan.allocations.len(), 1);
        assert_eq!(
            plan.allocations[&JobId::from("b")].cpu,
            CpuAllocation::DEFAULT
        );
        assert!(plan.move_requests.is_empty());
    }
}
