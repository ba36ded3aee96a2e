//! Moves: stopping a job with its work kept and starting it elsewhere (a move, a resize),
//! SpeCon's Algorithm 2 on the nodes' move requests, the `+pays` gate, and Algorithm 3
//! (`+rebalance`).

use governor_placement::specon::{ConvergedJob, MoveDecision, SpeCon};
use governor_placement::{JobRequest, JobView, NodeView, feasible_nodes};

use super::{Engine, MoveRecord, Phase};

impl Engine<'_> {
    /// Stop job `j` on its worker with all its work kept (its checkpoint) and start it on `to`
    /// after its save and restore, `request` reserved there meanwhile (a move, a resize).
    /// Returns the downtime.
    pub(super) fn restart_on(
        &mut self,
        j: usize,
        to: usize,
        gpus: Vec<u32>,
        request: &JobRequest,
        t: f64,
    ) -> f64 {
        let w = self.rt[j].worker;
        let downtime = self
            .config
            .move_cost
            .seconds(self.jobs[j].checkpoint_bytes());
        self.leave(w, j, t);
        self.workers[w].force_decide = true;
        self.rt[j].phase = Phase::Starting;
        // The view: gone from its worker (first: `to` may be the same worker), pending where
        // it starts again.
        self.report(w);
        self.view
            .reserve(to, JobView::pending(request.id.clone(), request), &gpus);
        self.update_shares(w, t);
        self.start_on(j, to, gpus, t + downtime);
        self.schedule(w);
        downtime
    }

    /// Execute the move requests of the last step (SpeCon's Algorithm 2 chooses).
    pub(super) fn move_requested(&mut self, t: f64) {
        let requests = std::mem::take(&mut self.requests);
        for (w, j) in requests {
            let rt = &self.rt[j];
            if !self.spec.allow_moves
                || rt.no_more_moves
                || rt.phase != Phase::Running
                || rt.worker != w
            {
                continue;
            }
            let request = self.request(j);
            let from = self.config.workers[w].name.clone();
            let target = self.specon.move_target(&self.view, &request, w);
            match target {
                Ok(MoveDecision::MoveTo(p)) if p.node != w && self.move_pays(j, w, p.node, t) => {
                    self.converged.push(ConvergedJob {
                        job: request.id.clone(),
                        node: p.node,
                        marked_at: t,
                    });
                    self.move_job(j, w, p.node, p.gpus, t);
                }
                _ => {
                    self.converged.push(ConvergedJob {
                        job: request.id.clone(),
                        node: w,
                        marked_at: t,
                    });
                    self.rt[j].no_more_moves = true;
                    self.moves.push(MoveRecord {
                        at: t,
                        job: request.id.clone(),
                        from,
                        to: None,
                        downtime: 0.0,
                    });
                }
            }
        }
    }

    /// Whether moving job `j` from worker `w` to `to` pays for its downtime (always, without
    /// `+pays`): the coordinator's rule, on what the coordinator would see (the job's last
    /// report, the nodes' use).
    fn move_pays(&self, j: usize, w: usize, to: usize, t: f64) -> bool {
        if !self.spec.pays {
            return true;
        }
        let id = &self.jobs[j].model.id;
        let (source, target) = (&self.view.nodes[w], &self.view.nodes[to]);
        let Some(job) = source.jobs().iter().find(|v| &v.id == id) else {
            return true;
        };
        let free = |n: &NodeView| (n.cores - n.cpu_used_cores).max(0.0);
        let remaining_s = match (job.epoch, job.max_epochs, job.epoch_seconds) {
            (Some(done), Some(all), Some(each)) => Some(all.saturating_sub(done) as f64 * each),
            _ => None,
        };
        let case = governor_placement::payoff::MoveCase {
            cores_now: job.cpu_cores,
            cores_wanted: job.requested_cores,
            source_free: free(source),
            target_free: free(target),
            memory_bytes: job.memory_bytes,
            remaining_s,
            ran_s: t - self.rt[j].first_start.unwrap_or(t),
        };
        let cost_s = self
            .config
            .move_cost
            .seconds(self.jobs[j].checkpoint_bytes());
        governor_placement::payoff::payoff(&case, cost_s, 2.0).pays
    }

    /// Checkpoint job `j` on worker `w` and restore it on `to` after the move's downtime.
    fn move_job(&mut self, j: usize, w: usize, to: usize, gpus: Vec<u32>, t: f64) {
        let request = self.request(j);
        let rt = &mut self.rt[j];
        rt.moves += 1;
        if rt.moves >= self.config.max_moves_per_job {
            rt.no_more_moves = true;
        }
        let downtime = self.restart_on(j, to, gpus, &request, t);
        self.moves.push(MoveRecord {
            at: t,
            job: request.id.clone(),
            from: self.config.workers[w].name.clone(),
            to: Some(self.config.workers[to].name.clone()),
            downtime,
        });
    }

    /// One round of SpeCon's Algorithm 3 (with `+rebalance`). A job moves at most
    /// `max_moves_per_job` times in all ("containers in SpeCon will be reallocated at most
    /// once", §V-A): with the default of 1, Algorithm 3 moves only jobs Algorithm 2 left where
    /// they were. Jobs that need GPUs are not rebalanced.
    pub(super) fn rebalance(&mut self, t: f64) {
        if !self.spec.rebalance {
            return;
        }
        let live: Vec<ConvergedJob> = self
            .converged
            .iter()
            .filter(|c| {
                self.index.get(&c.job).is_some_and(|&j| {
                    let rt = &self.rt[j];
                    rt.phase == Phase::Running
                        && rt.worker == c.node
                        && rt.moves < self.config.max_moves_per_job
                        && self.jobs[j].gpus == 0
                })
            })
            .cloned()
            .collect();
        self.converged = live;
        if self.converged.is_empty() {
            return;
        }
        let moves = {
            let engine = &*self;
            SpeCon::rebalance(&engine.view, &engine.converged, |job, node| {
                engine.index.get(job).is_some_and(|&j| {
                    feasible_nodes(&engine.view, &engine.request(j))
                        .is_ok_and(|fit| fit.contains(&node))
                })
            })
        };
        for m in moves {
            let Some(&j) = self.index.get(&m.job) else {
                continue;
            };
            if !self.move_pays(j, m.from, m.to, t) {
                continue;
            }
            self.converged.retain(|c| c.job != m.job);
            self.move_job(j, m.from, m.to, Vec::new(), t);
        }
    }
}
