//! Preemption (`+preempt`): displacing lower-priority jobs, with their work kept, for a job
//! that fits nowhere (the coordinator's rule).

use governor_placement::JobRequest;

use super::{Engine, PREEMPT_MIN_RUN_S, Phase};

impl Engine<'_> {
    /// Displace lower-priority jobs for the waiting ones (the coordinator's rule), each
    /// followed by an admission round (the room is the waiting job's).
    pub(super) fn preempt(&mut self, t: f64, room_being_made: &[usize]) {
        let waiting: Vec<(usize, JobRequest)> = self
            .queue
            .iter()
            .filter(|q| !q.waiting_reason.is_empty() && q.replicas == 1)
            .filter_map(|q| self.index.get(&q.id).copied())
            .filter(|j| !room_being_made.contains(j))
            .filter(|&j| self.rt[j].preemptions == 0)
            .map(|j| (j, self.request(j)))
            .collect();
        for (_, request) in waiting {
            let candidates: Vec<governor_placement::preempt::Candidate> = self
                .rt
                .iter()
                .enumerate()
                .filter(|(k, rt)| {
                    rt.phase == Phase::Running
                        && self.jobs[*k].gpus == 0
                        && self.jobs[*k].model.priority < request.priority
                        && t - rt.last_start >= PREEMPT_MIN_RUN_S
                })
                .map(|(k, rt)| governor_placement::preempt::Candidate {
                    id: self.jobs[k].model.id.clone(),
                    node: rt.worker,
                    priority: self.jobs[k].model.priority,
                    started_at: rt.last_start,
                    gpus: Vec::new(),
                })
                .collect();
            let Some(plan) = governor_placement::preempt::plan(&self.view, &request, &candidates)
            else {
                continue;
            };
            for victim in &plan.victims {
                if let Some(&k) = self.index.get(victim) {
                    self.displace(k, t);
                }
            }
            // The freed room is this job's: admit before planning for the next.
            self.admit_round(t);
        }
    }

    /// Stop job `k` on its worker with its work kept (saved), and queue it again at the head
    /// of its priority; its next start pays its save and restore.
    fn displace(&mut self, k: usize, t: f64) {
        let w = self.rt[k].worker;
        self.leave(w, k, t);
        self.workers[w].force_decide = true;
        let cost = self
            .config
            .move_cost
            .seconds(self.jobs[k].checkpoint_bytes());
        let rt = &mut self.rt[k];
        rt.phase = Phase::Queued;
        rt.preemptions += 1;
        rt.resume_delay = cost;
        let mut q = self.queued(k, self.jobs[k].model.submit);
        q.head = true;
        self.queue.push(q);
        self.update_shares(w, t);
        self.report(w);
        self.schedule(w);
    }
}
