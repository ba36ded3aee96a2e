//! A worker's step: advancing its jobs, finishes, log writes, jobs starting, log lines
//! delivered, the usage tick and the policy's decision; applying the plan, the kernel's
//! shares and the node's report to the coordinator.

use governor_policy::share::{ShareRequest, water_fill};
use governor_policy::sweep::Outranked;
use governor_policy::{Category, CpuAllocation, Direction, JobSpec, Plan, ProgressPoint, Usage};

use super::{Delivery, EPS, Ended, Engine, Observation, Phase, gpu_limit_for, speed_with};
use crate::job::LogEvery;

impl Engine<'_> {
    /// Run worker `w`'s jobs until `t` at their current shares.
    pub(super) fn advance(&mut self, w: usize, t: f64) {
        let worker = &mut self.workers[w];
        let dt = t - worker.t;
        if dt > 0.0 {
            let (mut wanted, mut used) = (0.0, 0.0);
            for &j in &worker.running {
                let speed = speed_with(&self.jobs[j], &self.rt[j]);
                let rt = &mut self.rt[j];
                wanted += rt.demand(worker.t);
                used += rt.cores;
                rt.done += speed * dt;
                rt.cpu += rt.cores * dt;
                let gpus = self.jobs[j].gpus;
                if gpus > 0 {
                    let model = crate::gpu::GpuModel::default();
                    rt.gpu_energy_j += f64::from(gpus) * model.busy_watts(rt.gpu_limit) * dt;
                }
            }
            let wanted = f64::min(wanted, worker.node.cores);
            worker.idle_core_seconds += (wanted - used).max(0.0) * dt;
        }
        worker.t = worker.t.max(t);
    }

    pub(super) fn step(&mut self, w: usize, t: f64) {
        // Run everyone until now.
        self.advance(w, t);
        let active_at_start = self.workers[w].running.clone();
        let mut changed = std::mem::take(&mut self.workers[w].force_decide);
        let mut departed = false;
        let mut report = false;

        // 1. Finishes.
        for &j in &active_at_start {
            let m = &self.jobs[j].model;
            if m.work - self.rt[j].done <= EPS * m.work.max(1.0) {
                self.rt[j].done = m.work;
                self.rt[j].finish = Some(t);
                self.rt[j].phase = Phase::Done;
                self.leave(w, j, t);
                self.workers[w].ended.push((j, Ended::Finished));
                changed = true;
                departed = true;
                // A rung that waited only for it is judged now.
                let stops = cuts(self.workers[w].sweeps.leave(&j));
                self.stop_jobs(w, t, stops);
            }
        }
        // 2. Quiet phases starting or ending, and log writes.
        for &j in &active_at_start {
            if self.rt[j].phase != Phase::Running {
                continue;
            }
            changed |= self.quiet(j, t);
            self.write_logs(w, j, t);
        }
        // 2b. Checkpoints written: the saved jobs exit.
        for j in take_due(&mut self.workers[w].saving, t) {
            self.rt[j].phase = Phase::Saved;
            self.workers[w].ended.push((j, Ended::Saved));
            departed = true;
        }
        // 3. Jobs starting here.
        for j in take_due(&mut self.workers[w].arriving, t) {
            self.arrive(w, j, t);
            changed = true;
            report = true;
        }
        // 4. Log lines delivered.
        let mut due: Vec<Delivery> = Vec::new();
        self.workers[w].deliveries.retain(|d| {
            if d.at <= t + EPS {
                due.push(*d);
                false
            } else {
                true
            }
        });
        for d in due {
            if self.rt[d.job].phase != Phase::Running || self.rt[d.job].worker != w {
                continue;
            }
            let reports_total = self.jobs[d.job].model.reports_total;
            let worker = &mut self.workers[w];
            worker.policy.progress(t, &self.ids[d.job], d.point);
            if reports_total {
                worker.policy.work_done(t, &self.ids[d.job], d.obs.fraction);
            }
            let rt = &mut self.rt[d.job];
            rt.previous = rt.last.replace(d.obs);
            rt.lines_seen += 1;
            changed = true;
            // The daemon stops a job as it reads the line that says so (SIGINT); its exit is
            // taken as immediate. Both rules see every value, its finish rule first.
            let mut stops = match self.jobs[d.job].model.epochs_at(d.obs.fraction) {
                Some(epochs) => cuts(
                    self.workers[w]
                        .sweeps
                        .observe(&d.job, epochs, d.point.value),
                ),
                None => Vec::new(),
            };
            // The daemon's rule sees the job's place in its run where its log says it.
            let fraction = reports_total.then_some(d.obs.fraction);
            if self.rt[d.job]
                .early_stop
                .as_mut()
                .is_some_and(|s| s.observe_at(d.point.value, fraction))
            {
                // Last in, first stopped: its reason is "converged".
                stops.push((d.job, "converged".to_owned()));
            }
            departed |= self.stop_jobs(w, t, stops);
        }
        // 4b. Trials at a rung waiting for the others are served last, as the daemon holds them.
        for j in self.workers[w].running.clone() {
            let held = self.workers[w].sweeps.waiting_at(&j).is_some();
            if held != self.rt[j].held {
                self.rt[j].held = held;
                self.workers[w].policy.hold(t, &self.ids[j], held);
                changed = true;
            }
        }
        // 5. Usage tick (and the node's report).
        if let Some(next_usage) = self.workers[w].next_usage
            && t >= next_usage - EPS
        {
            for &j in &active_at_start {
                if self.rt[j].phase != Phase::Running || self.rt[j].worker != w {
                    continue;
                }
                let usage = Usage {
                    at: t,
                    cpu_seconds: self.rt[j].cpu,
                    memory_bytes: self.jobs[j].model.memory_bytes,
                    memory_pressure_events: 0,
                    cpu_wait_seconds: None,
                };
                self.workers[w].policy.usage(t, &self.ids[j], usage);
            }
            let interval = self.config.usage_interval.max(1e-3);
            let worker = &mut self.workers[w];
            let mut next = next_usage;
            while next <= t + EPS {
                next += interval;
            }
            worker.next_usage = Some(next);
            changed = true;
            report = true;
        }
        // 6. The policy's own deadline.
        if self.workers[w]
            .next_decision
            .is_some_and(|at| at <= t + EPS)
        {
            changed = true;
        }
        if changed {
            let plan = {
                let worker = &mut self.workers[w];
                worker.policy.decide(t, &worker.node)
            };
            self.decisions += 1;
            report |= self.apply(w, t, plan);
        }
        self.update_shares(w, t);
        // The daemon reports about once a second and on every change (a job the planner
        // stopped is one: until the worker says so, its cores and GPUs stay held).
        if report || departed || !self.workers[w].ended.is_empty() {
            self.send_report(w, t);
        }
        self.schedule(w);
    }

    fn write_logs(&mut self, w: usize, j: usize, t: f64) {
        let m = &self.jobs[j].model;
        let delay = self.config.progress_delay;
        let rt = &mut self.rt[j];
        let mut out = Vec::new();
        match m.log_every {
            LogEvery::Work { fraction } => {
                let step = fraction.max(1e-6);
                while rt.next_log < 1.0 - EPS
                    && rt.done >= m.log_at(rt.next_log) - EPS * m.work.max(1.0)
                {
                    let x = rt.next_log;
                    out.push((x, m.logged_loss(x, &mut rt.rng)));
                    rt.written.push((t - m.submit, m.loss.value(x)));
                    rt.next_log += step;
                }
            }
            LogEvery::Seconds { seconds } => {
                let step = seconds.max(1e-3);
                while rt.next_log <= t + EPS {
                    rt.next_log += step;
                    if m.starting(rt.done) {
                        // Nothing is logged before the training starts.
                        continue;
                    }
                    let x = m.training_fraction(rt.done);
                    out.push((x, m.logged_loss(x, &mut rt.rng)));
                    rt.written.push((t - m.submit, m.loss.value(x)));
                }
            }
        }
        rt.gpu_energy_at_lines
            .resize(rt.written.len(), rt.gpu_energy_j);
        let cpu = rt.cpu;
        // The first line of a run that started over begins a new run in its log.
        let mut new_segment = !out.is_empty() && std::mem::take(&mut rt.restarted);
        for (x, value) in out {
            self.workers[w].deliveries.push(Delivery {
                at: t + delay,
                job: j,
                point: ProgressPoint {
                    at: t + delay,
                    value,
                    new_segment: std::mem::take(&mut new_segment),
                },
                obs: Observation {
                    at: t + delay,
                    value,
                    cpu,
                    fraction: x,
                },
            });
        }
    }

    fn arrive(&mut self, w: usize, j: usize, t: f64) {
        let m = &self.jobs[j].model;
        let rt = &mut self.rt[j];
        rt.phase = Phase::Running;
        rt.worker = w;
        rt.last_start = t;
        if rt.first_start.is_none() {
            rt.first_start = Some(t);
            rt.first_worker = Some(w);
        }
        if !rt.log_started {
            rt.log_started = true;
            rt.next_log = match m.log_every {
                LogEvery::Work { fraction } => fraction.max(1e-6),
                LogEvery::Seconds { seconds } => t + seconds.max(1e-3),
            };
        } else if let LogEvery::Seconds { seconds } = m.log_every
            && rt.next_log < t
        {
            // A time-based logger restarts its timer when the process is restored.
            rt.next_log = t + seconds.max(1e-3);
        }
        rt.alloc = CpuAllocation::DEFAULT;
        rt.category = Category::Unknown;
        rt.move_request = None;
        let worker = &mut self.workers[w];
        let pos = worker.running.partition_point(|&k| k < j);
        worker.running.insert(pos, j);
        if worker.next_usage.is_none() {
            worker.next_usage = Some(t);
        }
        worker.policy.job_added(
            t,
            &JobSpec {
                priority: m.priority,
                ..JobSpec::new(m.id.clone())
            },
        );
        // In a cluster the planner judges a sweep's trials (`cluster/driver.rs`).
        if let Some(trial) = m.sweep.as_ref().filter(|_| self.single_node) {
            worker.sweeps.join(
                &trial.sweep,
                trial.rule,
                Direction::Minimise,
                j,
                m.declared_epochs(),
            );
        }
    }

    /// Job `j`'s quiet phases at `t`: one starts when its work reaches it, and ends after its
    /// seconds. True when its demand changed.
    fn quiet(&mut self, j: usize, t: f64) -> bool {
        let m = &self.jobs[j].model;
        let rt = &mut self.rt[j];
        if rt.quiet_until > t + EPS {
            return false;
        }
        if let Some(q) = m.quiet.get(rt.next_quiet)
            && rt.done >= q.after - EPS * m.work.max(1.0)
        {
            rt.quiet_until = t + q.seconds.max(0.0);
            rt.next_quiet += 1;
            true
        } else if rt.quiet_until > f64::NEG_INFINITY {
            rt.quiet_until = f64::NEG_INFINITY;
            true
        } else {
            false
        }
    }

    /// Stop each job (with its reason) on worker `w` at `t`, as its node does when it asks it
    /// to (finish at convergence, cut from its sweep), and the trials each leaving cuts from its
    /// sweep. True when one was stopped.
    fn stop_jobs(&mut self, w: usize, t: f64, mut work: Vec<(usize, String)>) -> bool {
        let mut any = false;
        while let Some((j, why)) = work.pop() {
            if self.rt[j].phase != Phase::Running || self.rt[j].worker != w {
                continue;
            }
            let rt = &mut self.rt[j];
            rt.finish = Some(t);
            rt.phase = Phase::Done;
            rt.stopped = Some(why);
            self.leave(w, j, t);
            self.workers[w].ended.push((j, Ended::Converged));
            work.extend(cuts(self.workers[w].sweeps.leave(&j)));
            any = true;
        }
        any
    }

    /// Take job `j` off worker `w` (finished or moving away).
    pub(super) fn leave(&mut self, w: usize, j: usize, t: f64) {
        let worker = &mut self.workers[w];
        worker.running.retain(|&k| k != j);
        worker.deliveries.retain(|d| d.job != j);
        worker.policy.job_removed(t, &self.ids[j]);
        for slot in worker.gpu_owner.iter_mut() {
            if *slot == Some(j) {
                *slot = None;
            }
        }
        if self.config.record_timeline {
            worker.timeline.push((t, j, 0.0));
        }
        let rt = &mut self.rt[j];
        rt.cores = 0.0;
        rt.gpus.clear();
    }

    /// Apply a plan on worker `w`. True when it asks to move a job it did not ask about
    /// before (the node reports at once).
    fn apply(&mut self, w: usize, t: f64, plan: Plan) -> bool {
        if self.config.record_decisions {
            for (id, a) in &plan.allocations {
                self.decision_log.push((
                    t,
                    id.0.clone(),
                    a.cpu.weight,
                    a.cpu.max_cores,
                    a.reason.clone(),
                ));
            }
        }
        for &j in &self.workers[w].running {
            self.rt[j].alloc = CpuAllocation::DEFAULT;
        }
        for (id, a) in plan.allocations {
            if let Some(&j) = self.index.get(&id.0)
                && self.rt[j].phase == Phase::Running
                && self.rt[j].worker == w
            {
                self.rt[j].alloc = a.cpu;
                self.rt[j].category = a.category;
                if self.spec.gpu_power && self.jobs[j].gpus > 0 {
                    let submit = self.jobs[j].model.submit;
                    let search = !self.spec.gpu_fixed;
                    let rt = &mut self.rt[j];
                    rt.gpu_limit = gpu_limit_for(a.category, t, submit, search, rt);
                }
            }
        }
        let worker = &mut self.workers[w];
        // A policy asking to be called "now" again would stall the clock.
        worker.next_decision = plan.next_decision_at.map(|at| at.max(t + 1e-3));
        // A request stands while the job runs here (the daemon keeps the latest reason).
        let mut asked = false;
        for m in plan.move_requests {
            if let Some(&j) = self.index.get(&m.job.0)
                && self.rt[j].phase == Phase::Running
                && self.rt[j].worker == w
            {
                asked |= self.rt[j].move_request.is_none();
                self.rt[j].move_request = Some(m.reason.clone());
                self.rt[j].move_requested_at.get_or_insert(t);
            }
            self.move_requests.push((t, m));
        }
        asked
    }

    pub(super) fn update_shares(&mut self, w: usize, t: f64) {
        let worker = &mut self.workers[w];
        let requests: Vec<ShareRequest> = worker
            .running
            .iter()
            .map(|&j| ShareRequest {
                weight: self.rt[j].alloc.weight,
                max_cores: self.rt[j].alloc.max_cores,
                demand: self.rt[j].demand(t),
            })
            .collect();
        let mut shares = water_fill(worker.node.cores, &requests);
        // The kernel delivers only part of the weights' order (caps are always exact).
        let enforcement = self.config.enforcement.clamp(0.0, 1.0);
        if enforcement < 1.0 {
            let equal: Vec<ShareRequest> = requests
                .iter()
                .map(|r| ShareRequest {
                    weight: CpuAllocation::DEFAULT.weight,
                    ..*r
                })
                .collect();
            let fair = water_fill(worker.node.cores, &equal);
            for (s, f) in shares.iter_mut().zip(fair) {
                *s = enforcement * *s + (1.0 - enforcement) * f;
            }
        }
        let slowdowns = self.config.contention_factors(&shares);
        for ((&j, &cores), slowdown) in worker.running.iter().zip(&shares).zip(slowdowns) {
            let rt = &mut self.rt[j];
            rt.slowdown = slowdown;
            if self.config.record_timeline {
                if (rt.cores - cores).abs() > 1e-9 {
                    worker.timeline.push((t, j, cores));
                }
                if rt
                    .timeline
                    .last()
                    .is_none_or(|&(_, c)| (c - cores).abs() > 1e-9)
                {
                    rt.timeline.push((t, cores));
                }
            }
            rt.cores = cores;
        }
    }
}

/// The trials a sweep's verdicts stop, with the daemon's reason.
fn cuts(outranked: Vec<Outranked<usize>>) -> Vec<(usize, String)> {
    outranked
        .into_iter()
        .map(|o| (o.trial, o.describe()))
        .collect()
}

/// Take the jobs of `list` (`(time, job)`) due by `t`, in time order (then job order).
fn take_due(list: &mut Vec<(f64, usize)>, t: f64) -> Vec<usize> {
    let mut due: Vec<(f64, usize)> = Vec::new();
    list.retain(|&(at, j)| {
        let now = at <= t + EPS;
        if now {
            due.push((at, j));
        }
        !now
    });
    due.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    due.into_iter().map(|(_, j)| j).collect()
}
