//! Elastic jobs (`+elastic`): the resize candidates, an admitted job's first size, shrinking
//! for the jobs that wait, growing as the placement policy says, and the resize itself.

use governor_placement::JobRequest;

use super::{Engine, Phase, RESIZE_MIN_RUN_S};

impl Engine<'_> {
    /// Whether job `j` is resized in this run.
    fn is_elastic(&self, j: usize) -> bool {
        self.spec.elastic && self.jobs[j].min_cores.is_some()
    }

    /// Running elastic jobs that may be resized now (the coordinator's candidates).
    fn elastic_candidates(&self, t: f64) -> Vec<governor_placement::elastic::ElasticJob> {
        self.rt
            .iter()
            .enumerate()
            .filter(|(k, rt)| {
                rt.phase == Phase::Running
                    && self.is_elastic(*k)
                    && self.jobs[*k].gpus == 0
                    && t - rt.last_start >= RESIZE_MIN_RUN_S
            })
            .map(|(k, rt)| governor_placement::elastic::ElasticJob {
                id: self.jobs[k].model.id.clone(),
                node: rt.worker,
                cores: rt.size,
                min_cores: self.least_size(k),
                max_cores: self.jobs[k].model.parallelism.min(self.max_cores),
                priority: self.jobs[k].model.priority,
                started_at: rt.last_start,
                submitted_at: self.jobs[k].model.submit,
            })
            .collect()
    }

    /// An elastic job just admitted on `w` starts at the largest size there that its policy
    /// allows (the coordinator's `initial_size`).
    pub(super) fn initial_size(&mut self, j: usize, w: usize) {
        use governor_placement::elastic::{ElasticJob, Grow};
        let grow = self.placement.elasticity().grow;
        if !self.is_elastic(j)
            || !matches!(grow, Grow::WhenNoneWait | Grow::Always)
            || (grow == Grow::WhenNoneWait && !self.queue.is_empty())
        {
            return;
        }
        let m = &self.jobs[j];
        let job = ElasticJob {
            id: m.model.id.clone(),
            node: w,
            cores: self.rt[j].size,
            min_cores: self.least_size(j),
            max_cores: m.model.parallelism.min(self.max_cores),
            priority: m.model.priority,
            started_at: 0.0,
            submitted_at: m.model.submit,
        };
        let Some(to) = governor_placement::elastic::grown_size(&self.view.nodes[w], &job) else {
            return;
        };
        self.rt[j].size = to;
        if let Some(v) = self.view.nodes[w]
            .jobs_mut()
            .iter_mut()
            .find(|v| v.id == job.id)
        {
            v.requested_cores = Some(to);
        }
    }

    /// Shrink elastic jobs for the jobs that still wait (before any preemption); returns the
    /// waiting jobs room was made for.
    pub(super) fn shrink_for_waiting(&mut self, t: f64) -> Vec<usize> {
        use governor_placement::elastic::{Shrink, shrink_plan};
        let rule = self.placement.elasticity().shrink;
        if !self.spec.elastic || rule == Shrink::Never {
            return Vec::new();
        }
        let waiting: Vec<(usize, JobRequest)> = self
            .queue
            .iter()
            .filter(|q| !q.waiting_reason.is_empty() && q.replicas == 1)
            .filter_map(|q| self.index.get(&q.id).copied())
            .map(|j| (j, self.request(j)))
            .collect();
        let mut served = Vec::new();
        for (j, request) in waiting {
            let candidates = self.elastic_candidates(t);
            if candidates.is_empty() {
                break;
            }
            let Some(plan) = shrink_plan(&self.view, &request, &candidates, rule) else {
                continue;
            };
            for r in &plan.resizes {
                if let Some(&k) = self.index.get(&r.id) {
                    self.resize(k, r.node, r.to, t);
                }
            }
            served.push(j);
            // The freed room is this job's.
            self.admit_round(t);
        }
        served
    }

    /// Grow elastic jobs as the placement policy says.
    pub(super) fn grow_elastic(&mut self, t: f64) {
        use governor_placement::elastic::{Grow, grow_into_idle, grow_slowest};
        let completions = std::mem::take(&mut self.completions);
        if !self.spec.elastic {
            return;
        }
        let resizes = match self.placement.elasticity().grow {
            Grow::Never => return,
            Grow::WhenNoneWait if !self.queue.is_empty() => return,
            Grow::WhenNoneWait | Grow::Always => {
                let candidates = self.elastic_candidates(t);
                if candidates.is_empty() {
                    return;
                }
                grow_into_idle(&self.view, &candidates)
            }
            Grow::OnCompletion => {
                let mut candidates = self.elastic_candidates(t);
                let mut resizes = Vec::new();
                for _ in 0..completions {
                    let Some(r) = grow_slowest(&self.view, &candidates, |_, _| true) else {
                        break;
                    };
                    candidates.retain(|c| c.id != r.id);
                    resizes.push(r);
                }
                resizes
            }
        };
        for r in resizes {
            if let Some(&k) = self.index.get(&r.id) {
                self.resize(k, r.node, r.to, t);
            }
        }
    }

    /// Save job `j` and start it again with `size` cores on worker `to` after its save and
    /// restore (all its work kept).
    pub(super) fn resize(&mut self, j: usize, to: usize, size: f64, t: f64) {
        let rt = &mut self.rt[j];
        rt.size = size;
        rt.resizes += 1;
        let request = JobRequest {
            cores: Some(size),
            ..self.request(j)
        };
        self.restart_on(j, to, Vec::new(), &request, t);
    }
}
