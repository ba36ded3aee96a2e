//! The loop's handlers for the node's own events: jobs found and ended (discovery, process
//! events, rescans), log records, the sampling tick and SIGHUP's reload.

use std::time::Instant;

use tracing::{error, info, warn};

use super::node_core::CpuSampler;
use super::startup::{load_config, node_resources};
use super::{Shell, job_sources};
use crate::cgroup::JobCgroup;
use crate::policy;
use crate::sys::proc_events::ProcEvent;
use crate::watch::WatchEvent;

impl Shell {
    pub(super) async fn initial_discovery(&mut self, now: Instant) {
        self.discovery.find_joined(&self.core);
        let found = self.discovery.initial(&self.core);
        self.start_jobs(now, found).await;
        self.core.decide_and_apply(now);
    }

    pub(super) async fn start_jobs(&mut self, now: Instant, jobs: Vec<job_sources::Found>) {
        for mut found in jobs {
            found.scope_sweep_to_owner();
            let key = found.job.cgroup.to_string();
            let name = found.job.name.clone();
            if !self.core.add_job(now, found.job) {
                continue;
            }
            if let Err(e) = self.watcher.add(&key, found.watch).await {
                warn!(job = %name, error = %e, "cannot follow the job's logs; it is governed without progress");
                self.core
                    .on_log_problem(&JobCgroup::new(&key).expect("valid key"), e.to_string());
            }
        }
    }

    pub(super) async fn stop_job(&mut self, now: Instant, cgroup: &JobCgroup, why: &str) {
        let key = cgroup.to_string();
        let _ = self.watcher.remove(&key).await;
        self.core.remove_job(now, cgroup, why);
        self.discovery.forget(cgroup, &self.core);
    }

    pub(super) fn on_watch_event(&mut self, now: Instant, ev: WatchEvent) {
        // Sub-second reaction: decide as soon as the signal moves (batched when decisions
        // would cost more than their CPU budget).
        self.core.on_watch_event(now, &ev);
    }

    pub(super) async fn on_proc_events(&mut self, now: Instant, events: &[ProcEvent]) {
        let (found, finished) = self.discovery.on_proc_events(&self.core, events);
        self.start_jobs(now, found).await;
        for cgroup in finished {
            self.stop_job(now, &cgroup, "its last process exited").await;
        }
        if self.core.decision_due(now) {
            self.core.decide_and_apply(now);
        }
    }

    pub(super) async fn on_tick(&mut self, now: Instant, cpu: &mut dyn CpuSampler) {
        for cgroup in self.discovery.finished_jobs(&self.core) {
            self.stop_job(now, &cgroup, "its cgroup has no process left")
                .await;
        }
        self.discovery.remove_ended_groups(&self.core, None);
        let pending = self.discovery.pending_declared(&self.core);
        self.start_jobs(now, pending).await;
        self.core.sample(now, cpu);
        self.core.decide_and_apply(now);
        self.core.poll_actuator(now);
        if let Some(gpu) = self.gpu.as_mut() {
            let status = self.core.status(now);
            let clock = status.uptime_seconds;
            let jobs: Vec<crate::gpu::governance::GpuJob> = status
                .jobs
                .into_iter()
                .map(|j| crate::gpu::governance::GpuJob {
                    name: j.name,
                    cgroup: j.cgroup,
                    category: j.category,
                    records: j.records,
                    last_record_at: j.last_record_age_s.map(|age| clock - age),
                })
                .collect();
            gpu.step(clock, &jobs);
        }
    }

    pub(super) async fn rescan(&mut self, now: Instant) {
        let found = self.discovery.rescan(&self.core);
        self.start_jobs(now, found).await;
    }

    pub(super) async fn reload(&mut self, now: Instant) {
        info!(path = %self.config_path.display(), "SIGHUP: reloading the configuration and the jobs directory");
        let config = match load_config(&self.opts) {
            Ok(c) => c,
            Err(e) => {
                error!(error = %e, "reload failed: keeping the current configuration");
                return;
            }
        };
        // The spec as configured (`specon:interval=10` is not `specon`): a reload that leaves
        // it alone keeps the running policy and its state.
        if config.policy != self.policy_spec {
            match policy::by_spec(&config.policy) {
                Ok(p) => {
                    info!(from = %self.policy_spec, to = %config.policy, "policy changed");
                    self.core.set_policy(p, now);
                    self.policy_spec.clone_from(&config.policy);
                }
                Err(e) => error!(error = %e, "reload: keeping the current policy"),
            }
        }
        if config.coordinator != self.discovery.config().coordinator {
            warn!("the [coordinator] settings changed: they take effect when the daemon restarts");
        }
        self.core.set_resources(node_resources(&config));
        let (found, gone) = self.discovery.reload(config, &self.core);
        for cgroup in gone {
            self.stop_job(now, &cgroup, "its job file was removed")
                .await;
        }
        self.start_jobs(now, found).await;
        self.core.decide_and_apply(now);
    }
}
