//! The cluster side of the daemon: the agent's report channel and commands, the launcher of
//! the coordinator's jobs, checkpoints carried between nodes and CRIU dumps, and the loop's
//! handlers for their events.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::node_core::{CoreSettings, CoreShell};
use super::requests::status_with_gpus;
use super::startup::agent_config;
use super::{Shell, carry, job_sources, launcher, node_report};
use crate::config::{CoordinatorConfig, DaemonConfig};
use crate::coordinator_client::{AgentStatus, NodeAgent, NodeCommand, NodeReport};

/// Tell the launcher which of its jobs the daemon is stopping as they asked (converged, or cut
/// from their sweep).
fn note_converging(launcher: &mut launcher::Launcher, status: &crate::status::NodeStatus) {
    for j in &status.jobs {
        if let Some(why) = &j.finish {
            launcher.note_converging(&j.cgroup, why);
        }
    }
}

/// The receiving ends of the cluster side, polled by the main loop.
pub(super) struct ClusterReceivers {
    pub(super) commands: mpsc::Receiver<NodeCommand>,
    pub(super) exits: mpsc::UnboundedReceiver<launcher::JobExit>,
    pub(super) agent: watch::Receiver<AgentStatus>,
    pub(super) dumps: mpsc::UnboundedReceiver<DumpDone>,
}

/// A CRIU dump for a transparent move ended (its task runs beside the loop: seconds).
pub(super) struct DumpDone {
    job_id: String,
    replica: u32,
    result: Result<u64, crate::criu::CriuError>,
}

pub(super) async fn next_dump(
    rx: &mut Option<mpsc::UnboundedReceiver<DumpDone>>,
) -> Option<DumpDone> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

pub(super) async fn next_command(
    rx: &mut Option<mpsc::Receiver<NodeCommand>>,
) -> Option<NodeCommand> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

pub(super) async fn next_exit(
    rx: &mut Option<mpsc::UnboundedReceiver<launcher::JobExit>>,
) -> Option<launcher::JobExit> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

pub(super) async fn agent_changed(
    rx: &mut Option<watch::Receiver<AgentStatus>>,
) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(r) => r.changed().await,
        None => std::future::pending().await,
    }
}

/// The daemon's half of the cluster link: the report channel of the agent, the launcher of
/// the coordinator's jobs, the node's GPUs.
pub(super) struct ClusterSide {
    address: String,
    reports: watch::Sender<NodeReport>,
    pub(super) launcher: launcher::Launcher,
    /// Checkpoints carried through the coordinator (moves without a shared path).
    carrier: carry::Carrier,
    /// Where the tasks running CRIU dumps report.
    dumps: mpsc::UnboundedSender<DumpDone>,
    /// One CRIU dump at a time on this node: two moves asked together dump one after the
    /// other. Two jobs dumped at once on one node once left a move neither done nor rolled
    /// back for 240 s (the 3-node VM test, 2026-11-27); a dump takes seconds, and the
    /// coordinator waits for a save far longer, so the second one waiting costs little.
    dump_slot: std::sync::Arc<tokio::sync::Semaphore>,
    gpus: crate::gpu::Gpus,
    /// Where the agent stands, for `governor status`.
    agent: AgentStatus,
    /// What the coordinator has acknowledged: the fence's clock and the jobs it covers.
    contact: watch::Receiver<crate::coordinator_client::Contact>,
    last_error: Option<String>,
    _agent_task: tokio::task::JoinHandle<()>,
}

impl ClusterSide {
    pub(super) fn start(
        c: &CoordinatorConfig,
        settings: &CoreSettings,
        config: &DaemonConfig,
        core: &CoreShell,
    ) -> Result<(ClusterSide, ClusterReceivers)> {
        let gpus = crate::gpu::Gpus::open(
            &config.node.simulated_gpus,
            config.gpu.nvml_library.as_deref(),
        );
        let inventory = gpus.inventory();
        let capacity = node_report::node_capacity(&settings.resources, &inventory);
        // Transparent (CRIU) moves: asked for, a criu found, and the right to make PID
        // namespaces (root). Otherwise jobs without a declared checkpoint do not move.
        let criu = c
            .transparent_moves
            .then(|| crate::criu::find_program(&c.criu))
            .flatten()
            .filter(|_| nix::unistd::geteuid().is_root());
        if c.transparent_moves && criu.is_none() {
            info!(criu = %c.criu.display(), "no transparent moves on this node (no criu found, or not root): only jobs with a declared checkpoint move");
        }
        let criu = criu.filter(|program| match crate::criu::check(program) {
            Ok(()) => true,
            Err(why) => {
                warn!(reason = %why, "no transparent moves on this node (CRIU does not work with this kernel): only jobs with a declared checkpoint move");
                false
            }
        });
        let mut agent_config = agent_config(c, &settings.node_name, capacity);
        agent_config.can_dump = criu.is_some();
        agent_config.job_output_dir = Some(c.job_output_dir.clone());
        agent_config.validate().with_context(|| {
            format!(
                "cannot connect to the coordinator at {} (set the node name with --node-name or [node] name)",
                c.address
            )
        })?;
        let (launcher, exits) = launcher::Launcher::new(launcher::LauncherConfig {
            subtree: core.actuator().config().jobs_subtree.clone(),
            output_dir: c.job_output_dir.clone(),
            gpus: inventory.iter().map(|g| g.index).collect(),
            stop_grace: c.stop_grace,
            finished_retention: c.finished_retention,
            journal: Some(
                config
                    .state_file
                    .with_file_name(launcher::JOURNAL_FILE_NAME),
            ),
            // This very binary, even if an upgrade replaced or removed its file meanwhile.
            supervisor: Some(PathBuf::from("/proc/self/exe")),
            criu,
            allow_root_jobs: c.allow_root_jobs,
        });
        let (reports, report_rx) = watch::channel(NodeReport::default());
        let (command_tx, commands) = mpsc::channel(64);
        let (uploads_tx, uploads) = mpsc::channel(4);
        let carrier = carry::Carrier::new(c.job_output_dir.join("carry"), uploads_tx);
        let (dumps_tx, dumps) = mpsc::unbounded_channel();
        let (task, agent, contact) =
            NodeAgent::spawn_with_contact(agent_config, report_rx, command_tx, uploads);
        info!(coordinator = %c.address, node = %settings.node_name, tls = !c.insecure, gpus = inventory.len(), "cluster agent started");
        Ok((
            ClusterSide {
                address: c.address.clone(),
                reports,
                launcher,
                carrier,
                dumps: dumps_tx,
                dump_slot: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
                gpus,
                agent: AgentStatus::Connecting { attempt: 1 },
                contact,
                last_error: None,
                _agent_task: task,
            },
            ClusterReceivers {
                commands,
                exits,
                agent,
                dumps,
            },
        ))
    }
}

impl ClusterSide {
    /// Run a CRIU dump beside the loop, one at a time on this node (`dump_slot`); its end
    /// comes back as a [`DumpDone`].
    fn spawn_dump(&self, request: crate::criu::DumpRequest) {
        let done = self.dumps.clone();
        let slot = self.dump_slot.clone();
        if slot.available_permits() == 0 {
            info!(job = %request.job_id, "another CRIU dump runs on this node: this one waits for it to end");
        }
        tokio::spawn(async move {
            // Held until the dump ends; never closed, so the acquire cannot fail.
            let _slot = slot.acquire_owned().await;
            let result = crate::criu::dump(&request).await;
            let _ = done.send(DumpDone {
                job_id: request.job_id,
                replica: request.replica,
                result,
            });
        });
    }
}

impl Shell {
    /// Show the agent's state in `governor status`.
    pub(super) fn refresh_coordinator_state(&mut self) {
        let state = self
            .cluster
            .as_ref()
            .map(|c| node_report::describe_agent(&c.address, &c.agent, c.last_error.as_deref()));
        self.core.set_coordinator_state(state);
    }

    pub(super) fn refresh_agent_status(&mut self, status: Option<AgentStatus>) {
        let (Some(c), Some(status)) = (self.cluster.as_mut(), status) else {
            return;
        };
        match &status {
            AgentStatus::Waiting { error, .. } => c.last_error = Some(error.clone()),
            AgentStatus::Connected { .. } => c.last_error = None,
            _ => {}
        }
        c.agent = status;
        self.refresh_coordinator_state();
    }

    /// Build the node's report and hand it to the agent (latest wins; never waits).
    pub(super) fn publish_report(&mut self, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let due = c.contact.borrow().due(now).to_vec();
        if !due.is_empty() {
            let bound = c.contact.borrow().fence_after.unwrap_or_default();
            let why = {
                let contact = c.contact.borrow();
                format!(
                    "fenced: the coordinator has acknowledged nothing from this node for {:.0} s \
                     (bound {:.0} s); it may start the job elsewhere",
                    contact
                        .confirmed_at
                        .map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64()),
                    contact.fence_after.unwrap_or_default().as_secs_f64()
                )
            };
            let fs = self.core.actuator().fs();
            for job in due {
                if let Some(launcher::SaveAction::Dump(request)) =
                    c.launcher.fence(fs, &job, now, bound, &why)
                {
                    c.spawn_dump(request);
                }
            }
        }
        c.launcher.poll(self.core.actuator().fs(), now);
        let status = status_with_gpus(&self.core, self.gpu.as_ref(), now);
        note_converging(&mut c.launcher, &status);
        let gpus = c.gpus.usage();
        let report = node_report::node_report(&status, c.launcher.jobs(), &gpus);
        c.reports.send_replace(report);
    }

    /// A command from the coordinator. Bad ones are logged once by the launcher and answered
    /// with a `failed` job in the next report; nothing here can stop the daemon.
    pub(super) async fn on_command(&mut self, now: Instant, cmd: NodeCommand) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        match cmd {
            NodeCommand::Start(start) => {
                if start.carried_checkpoint && !c.launcher.is_duplicate(&start) {
                    // Its checkpoint came first, in pieces: unpacked whole, or no start.
                    let dir = c.launcher.carried_dir(&start).unwrap_or_default();
                    let transparent = start.checkpoint.as_ref().is_some_and(|k| k.transparent);
                    let roots = c.launcher.carry_roots(&start);
                    let unpacked = c
                        .carrier
                        .unpack_for(&start.job_id, start.attempt, &dir, transparent)
                        .await
                        .and_then(|files| {
                            // A CRIU dump: the files the job wrote go back where they were.
                            let placed = if transparent {
                                crate::criu::place_files(&dir, &roots)?
                            } else {
                                0
                            };
                            Ok((files, placed))
                        });
                    match unpacked {
                        Ok((files, placed)) => {
                            info!(job = %start.job_id, dir = %dir.display(), files, placed, "carried checkpoint unpacked")
                        }
                        Err(reason) => {
                            // The edge: the refusal is reported as text.
                            c.launcher.refuse(start, reason.to_string());
                            self.publish_report(now);
                            return;
                        }
                    }
                }
                let outcome = c.launcher.start(self.core.actuator().fs(), start);
                if let launcher::StartOutcome::Started(started) = outcome {
                    self.govern_coordinator_job(now, &started.job_id, &started)
                        .await;
                    self.core.decide_and_apply(now);
                }
            }
            NodeCommand::Stop(stop) => {
                c.launcher.stop(self.core.actuator().fs(), &stop, now);
            }
            NodeCommand::Save(save) => {
                let fs = self.core.actuator().fs();
                if let launcher::SaveAction::Dump(request) = c.launcher.save(fs, &save) {
                    c.spawn_dump(request);
                }
            }
            NodeCommand::Upload(mut upload) => {
                match c.launcher.upload_dir(&upload.job_id, &upload.dir) {
                    Some(dir) => {
                        upload.dir = dir.to_string_lossy().into_owned();
                        c.carrier.upload(upload);
                    }
                    None => {
                        warn!(job = %upload.job_id, "asked to upload the dump of a job this node does not know; ignored")
                    }
                }
            }
            NodeCommand::Chunk(piece) => c.carrier.receive(piece),
        }
        self.publish_report(now);
    }

    /// Govern a job the launcher started (or took back after a restart). The launcher follows
    /// the job's end (its main process), not discovery.
    async fn govern_coordinator_job(
        &mut self,
        now: Instant,
        job_id: &str,
        started: &launcher::StartedJob,
    ) {
        // Its logs are read with the rights of the user it runs as.
        match job_sources::launched_job(&started.adopt, started.owner.clone()) {
            Ok(mut found) => {
                found.job.runtime = format!("coordinator job {job_id}");
                found.job.spec.priority = started.priority;
                if started.maximise {
                    found.job.spec.direction = crate::policy::Direction::Maximise;
                    found.job.signal.direction = Some(crate::policy::Direction::Maximise);
                }
                self.start_jobs(now, vec![found]).await;
            }
            Err(e) => {
                warn!(job = %job_id, error = %e, "a coordinator job runs but is not governed")
            }
        }
    }

    /// Take back the coordinator's jobs a previous run of the daemon started (before discovery
    /// could mistake them for local jobs).
    pub(super) async fn recover_coordinator_jobs(&mut self, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let resumed = c.launcher.recover(self.core.actuator().fs(), now);
        for started in &resumed {
            self.govern_coordinator_job(now, &started.job_id, started)
                .await;
        }
    }

    /// A CRIU dump ended: the job is saved (and gone), or runs on with the reason reported.
    pub(super) async fn on_dumped(&mut self, now: Instant, done: DumpDone) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        let fs = self.core.actuator().fs();
        if let Some(group) = c
            .launcher
            .on_dumped(fs, &done.job_id, done.replica, done.result, now)
            && self.core.contains(&group)
        {
            self.stop_job(now, &group, "dumped by CRIU for a move")
                .await;
        }
        self.publish_report(now);
    }

    /// A coordinator job's main process ended.
    pub(super) async fn on_job_exit(&mut self, now: Instant, exit: launcher::JobExit) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        // A job the daemon was stopping at convergence ends completed, not failed.
        note_converging(&mut c.launcher, &self.core.status(now));
        if let Some(group) = c.launcher.on_exit(self.core.actuator().fs(), exit, now)
            && self.core.contains(&group)
        {
            self.stop_job(now, &group, "its main process exited").await;
        }
        self.publish_report(now);
    }
}
