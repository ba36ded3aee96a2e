//! `governor daemon`: one control loop (`select!`) over progress events, process events
//! (discovery), a sampling tick, control requests and signals. The decisions themselves are made
//! by [`node_core::NodeCore`], which returns them as effects (cgroup writes, restores, signals)
//! that [`node_core::CoreShell`] carries out; this module wires the event sources to the shell.
//!
//! Start-up order matters for safety: the actuator is created first and immediately restores
//! anything a crashed previous run left in place (state file), before any job is governed.
//! Shutdown (SIGTERM, SIGINT, or an error in the loop) restores every file the daemon changed.

mod access;
mod carry;
mod cluster;
mod events;
mod job_sources;
mod join;
pub mod launcher;
pub mod node_core;
pub mod node_report;
mod pacing;
mod requests;
mod startup;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use self::cluster::{ClusterSide, agent_changed, next_command, next_dump, next_exit};
use self::job_sources::Discovery;
use self::node_core::{CoreSettings, CoreShell, CpuSampler};
use self::pacing::SamplePacer;
use self::startup::{
    AccountedCpu, actuator_config, load_config, open_gpu_governor, raise_open_file_limit,
};
pub use self::startup::{host_name, node_resources};
use crate::accounting::{AccountingOptions, CpuAccounting};
use crate::cgroup::{Actuator, Hierarchy};
use crate::control::{self, PendingRequest};
use crate::policy;
use crate::sys::proc_events::{ProcEvent, ProcEvents};
use crate::watch::{Watcher, WatcherHandle};

/// Command-line options of `governor daemon`.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    pub config_path: PathBuf,
    /// Overrides the configured policy.
    pub policy: Option<String>,
    /// Compute and log decisions without writing.
    pub dry_run: bool,
    /// Coordinator address (`--coordinator`), overriding `[coordinator] address`.
    pub coordinator: Option<String>,
    /// Directory with `ca.pem`, `NODE.pem`, `NODE-key.pem` (`--certs`), overriding the
    /// `[coordinator]` ca/cert/key.
    pub certs: Option<PathBuf>,
    /// Plain-text connection to the coordinator (`--insecure`, test clusters only).
    pub insecure: bool,
    /// Node name (`--node-name`), overriding `[node] name`.
    pub node_name: Option<String>,
}

/// Run the daemon until SIGTERM/SIGINT. Builds its own single-threaded runtime: the daemon's
/// work is small and sequential, and one thread keeps its CPU cost and memory low.
pub fn run_blocking(opts: DaemonOptions) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(run(opts))
}

async fn run(opts: DaemonOptions) -> Result<()> {
    let config = load_config(&opts)?;
    let hierarchy = Hierarchy::detect(&config.cgroup_root).with_context(|| {
        format!(
            "cannot use the cgroup filesystem at {}",
            config.cgroup_root.display()
        )
    })?;
    let kind = hierarchy.kind();
    let mut actuator = Actuator::new(hierarchy, actuator_config(&config))
        .with_context(|| format!("cannot open the state file {}", config.state_file.display()))?;
    let recovered = actuator.recover();
    if !recovered.restored.is_empty() || !recovered.errors.is_empty() {
        warn!(
            restored = recovered.restored.len(),
            failed = recovered.errors.len(),
            "restored cgroup values left by a previous run that did not stop cleanly"
        );
    }
    let now = Instant::now();
    let settings = CoreSettings {
        node_name: config.node.name.clone().unwrap_or_else(host_name),
        resources: node_resources(&config),
        dry_run: config.actuation.dry_run,
        govern_memory: config.actuation.govern_memory,
    };
    let policy = policy::by_spec(&config.policy)?;
    let mut core = CoreShell::new(settings.clone(), policy, actuator, now);
    // eBPF accounting (sched_switch), or cpu.stat / cpuacct where it cannot load; the reason
    // is logged once and shown by `governor status`.
    let mut cpu: Box<dyn CpuSampler> = Box::new(AccountedCpu {
        accounting: CpuAccounting::open(&config.cgroup_root, &AccountingOptions::default()),
        last_waits: Vec::new(),
    });
    core.set_cpu_source(cpu.name(), cpu.note());
    info!(policy = core.policy_name(), cgroup = ?kind, cores = settings.resources.cores, memory = settings.resources.memory_bytes, dry_run = settings.dry_run, "governor daemon starting");

    raise_open_file_limit();
    // A job's log paths are opened with its owner's rights (root must not read, for
    // anyone, what they could not read themselves).
    let open_as: crate::watch::OpenAs = std::sync::Arc::new(|path, owner| {
        if owner.uid == nix::unistd::geteuid().as_raw() {
            use std::os::unix::fs::OpenOptionsExt;
            // Our own user: nothing to switch (never block on a FIFO: O_NONBLOCK).
            return std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
                .open(path);
        }
        crate::sys::open_as_user(path, owner.uid, owner.gid, &owner.groups)
    });
    let (watcher, mut watch_events) = Watcher::spawn_task_opening_as(4096, Some(open_as))
        .context("cannot start the log watcher (inotify)")?;
    let listener = control::bind(&config.socket, config.socket_group.as_deref())?;
    let (request_tx, mut requests) = mpsc::channel::<PendingRequest>(64);
    // /metrics, if configured: snapshots through the same channel as `governor status`.
    let metrics = match &config.metrics.listen {
        Some(addr) => {
            let tls = match &config.metrics.tls {
                Some(t) => Some(t.acceptor().context("[metrics] tls")?),
                None => None,
            };
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for /metrics on {addr}"))?;
            Some(tokio::spawn(crate::metrics::serve(
                l,
                tls,
                request_tx.clone(),
                core.metrics(),
            )))
        }
        None => None,
    };
    let server = tokio::spawn(control::serve(listener, request_tx));

    let mut proc_events = match ProcEvents::subscribe() {
        Ok(p) => Some(p),
        Err(e) => {
            warn!(error = %e, rescan = ?config.discovery.rescan_interval, "process events unavailable (needs root and CONFIG_PROC_EVENTS): new jobs are found by periodic rescans only");
            None
        }
    };
    if let Err(e) = crate::sys::become_child_subreaper() {
        warn!(error = %e, "cannot become a child subreaper");
    }

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;

    // The cluster side: an agent streaming reports and bringing commands, a launcher for the
    // coordinator's jobs. Without a coordinator (or while it is unreachable) the node governs
    // on its own; a bad configuration (node name, TLS files) stops the start-up here.
    let (cluster, (mut commands_rx, mut exits_rx, mut agent_rx, mut dumps_rx)) =
        match &config.coordinator {
            Some(c) => {
                let (side, rx) = ClusterSide::start(c, &settings, &config, &core)?;
                (
                    Some(side),
                    (
                        Some(rx.commands),
                        Some(rx.exits),
                        Some(rx.agent),
                        Some(rx.dumps),
                    ),
                )
            }
            None => (None, (None, None, None, None)),
        };

    let discovery = Discovery::new(config.clone(), kind, &opts.config_path);
    let mut shell = Shell {
        core,
        policy_spec: config.policy.clone(),
        watcher,
        discovery,
        config_path: opts.config_path.clone(),
        opts: opts.clone(),
        cluster,
        gpu: open_gpu_governor(&config),
    };
    shell.refresh_coordinator_state();
    shell.recover_coordinator_jobs(Instant::now()).await;
    shell.initial_discovery(Instant::now()).await;

    let mut sampling = SamplePacer::new(config.sample_interval);
    let mut rescan = tokio::time::interval(config.discovery.rescan_interval);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rescan.tick().await;
    let mut proc_buf = Vec::new();

    let exit_reason = loop {
        let launcher_due = shell
            .cluster
            .as_ref()
            .and_then(|c| c.launcher.next_deadline());
        let wake = match (shell.core.next_wakeup(), launcher_due) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a
                .or(b)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
        };
        // Unbiased: a stream of exec or log events must not starve control requests.
        tokio::select! {
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
            _ = sighup.recv() => shell.reload(Instant::now()).await,
            Some(ev) = watch_events.recv() => {
                let now = Instant::now();
                shell.on_watch_event(now, ev);
                // Records that arrived together are taken together (bounded, so that a flood
                // of rows cannot keep the other branches waiting).
                for _ in 0..WATCH_EVENTS_PER_TURN {
                    let Ok(ev) = watch_events.try_recv() else { break };
                    shell.on_watch_event(now, ev);
                }
            }
            result = next_proc_events(&mut proc_events, &mut proc_buf) => {
                match result {
                    Ok(()) => shell.on_proc_events(Instant::now(), &proc_buf).await,
                    Err(e) => {
                        warn!(error = %e, "process event socket failed: falling back to periodic rescans");
                        proc_events = None;
                    }
                }
                proc_buf.clear();
            }
            Some(req) = requests.recv() => shell.on_request(Instant::now(), req).await,
            Some(cmd) = next_command(&mut commands_rx) => shell.on_command(Instant::now(), cmd).await,
            Some(exit) = next_exit(&mut exits_rx) => shell.on_job_exit(Instant::now(), exit).await,
            Some(done) = next_dump(&mut dumps_rx) => shell.on_dumped(Instant::now(), done).await,
            changed = agent_changed(&mut agent_rx) => match changed {
                Ok(()) => {
                    let status = agent_rx.as_ref().map(|r| r.borrow().clone());
                    shell.refresh_agent_status(status);
                }
                // The agent task ended (it only does when the daemon drops its reports).
                Err(_) => agent_rx = None,
            },
            _ = tokio::time::sleep_until(sampling.next.into()) => {
                let started = Instant::now();
                shell.on_tick(started, cpu.as_mut()).await;
                shell.publish_report(Instant::now());
                sampling.done(started, Instant::now(), shell.core.job_count());
            }
            _ = rescan.tick() => shell.rescan(Instant::now()).await,
            _ = tokio::time::sleep_until(wake.into()) => {
                let now = Instant::now();
                shell.core.on_wakeup(now);
                if let Some(c) = shell.cluster.as_mut() {
                    c.launcher.poll(shell.core.actuator().fs(), now);
                }
            }
        }
    };
    info!(
        reason = exit_reason,
        "shutting down: restoring every cgroup value the governor changed"
    );
    server.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    // Jobs the coordinator started keep running (they are not the governor's to end); a
    // restarted daemon finds them again through GOVERNOR_LOG in their environment.
    drop(shell.cluster.take());
    let report = shell.core.shutdown();
    if let Some(gpu) = shell.gpu.as_mut() {
        let restored = gpu.restore_all();
        info!(restored, "GPU power limits restored");
    }
    shell.discovery.cleanup_adopted_groups(&shell.core);
    // Users' job groups whose job has ended; those still running are found again at the next
    // start.
    shell.discovery.remove_ended_groups(&shell.core, None);
    let _ = std::fs::remove_file(&config.socket);
    if report.errors.is_empty() {
        info!(
            restored = report.restored.len(),
            "governor stopped; all limits restored"
        );
        Ok(())
    } else {
        error!(
            failed = report.errors.len(),
            "governor stopped; some values could not be restored (kept in the state file: the next start retries)"
        );
        anyhow::bail!(
            "{} cgroup values could not be restored",
            report.errors.len()
        )
    }
}

/// Watch events handled in one turn of the control loop after the one that woke it.
const WATCH_EVENTS_PER_TURN: usize = 255;

async fn next_proc_events(
    events: &mut Option<ProcEvents>,
    buf: &mut Vec<ProcEvent>,
) -> std::io::Result<()> {
    match events {
        Some(e) => e.next_events(buf).await,
        None => std::future::pending().await,
    }
}

/// The loop's state, borrowed by each event handler.
struct Shell {
    core: CoreShell,
    /// The node policy as configured (name and parameters).
    policy_spec: String,
    watcher: WatcherHandle,
    discovery: Discovery,
    config_path: PathBuf,
    opts: DaemonOptions,
    cluster: Option<ClusterSide>,
    /// The node's GPUs (NVML), if it has any: jobs on them, energy, power by progress.
    gpu: Option<crate::gpu::governance::GpuGovernor>,
}

/// Whether `path` looks absolute (log paths must be).
pub(crate) fn is_absolute(path: &str) -> bool {
    Path::new(path).is_absolute()
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
