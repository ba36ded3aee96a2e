//! `governor daemon`: one control loop (`select!`) over progress events, process events
//! (discovery), a sampling tick, control requests and signals. The decisions themselves are made
//! by [`core::NodeCore`]; this module wires the event sources to it.
//!
//! Start-up order matters for safety: the actuator is created first and immediately restores
//! anything a crashed previous run left in place (state file), before any job is governed.
//! Shutdown (SIGTERM, SIGINT, or an error in the loop) restores every file the daemon changed.

mod access;
mod carry;
pub mod core;
mod job_sources;
mod join;
pub mod launcher;
pub mod node_report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

use self::core::{CoreSettings, CpuSource, NodeCore};
use self::job_sources::Discovery;
use crate::accounting::{AccountingOptions, CpuAccounting};
use crate::cgroup::{Actuator, ActuatorConfig, Hierarchy, JobCgroup, MemoryGuardConfig};
use crate::config::{CoordinatorConfig, DaemonConfig};
use crate::control::{self, Peer, PendingRequest, Request, Response};
use crate::coordinator_client::{
    AgentConfig, AgentStatus, NodeAgent, NodeCommand, NodeReport, TlsFiles,
};
use crate::policy::{self, NodeResources};
use crate::sys::proc_events::{ProcEvent, ProcEvents};
use crate::watch::{WatchEvent, Watcher, WatcherHandle};

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

/// Load the configuration, applying command-line overrides.
fn load_config(opts: &DaemonOptions) -> Result<DaemonConfig> {
    let mut config = if opts.config_path.exists() {
        DaemonConfig::load(&opts.config_path)?
    } else {
        warn!(path = %opts.config_path.display(), "configuration file not found: using defaults (governor --example-config prints one)");
        DaemonConfig::default()
    };
    if let Some(p) = &opts.policy {
        policy::by_spec(p)?;
        config.policy = p.clone();
    }
    if opts.dry_run {
        config.actuation.dry_run = true;
    }
    apply_cluster_options(&mut config, opts)?;
    Ok(config)
}

/// Apply `--node-name`, `--coordinator`, `--certs` and `--insecure` to the configuration.
fn apply_cluster_options(config: &mut DaemonConfig, opts: &DaemonOptions) -> Result<()> {
    // One merge of the configuration's [coordinator] with the command line (config.rs).
    config.apply_cluster_flags(
        &crate::config::ClusterFlags {
            coordinator: opts.coordinator.clone(),
            certs: opts.certs.clone(),
            insecure: opts.insecure,
            node_name: opts.node_name.clone(),
        },
        host_name,
    )?;
    Ok(())
}

/// Tell the launcher which of its jobs the daemon is stopping as they asked (converged, or cut
/// from their sweep).
fn note_converging(launcher: &mut launcher::Launcher, status: &crate::status::NodeStatus) {
    for j in &status.jobs {
        if let Some(why) = &j.finish {
            launcher.note_converging(&j.cgroup, why);
        }
    }
}

/// The agent's configuration from the daemon's.
fn agent_config(
    c: &CoordinatorConfig,
    node_name: &str,
    capacity: crate::coordinator_client::NodeCapacity,
) -> AgentConfig {
    let mut agent = AgentConfig::new(c.address.clone(), node_name, capacity);
    if !c.insecure
        && let (Some(ca), Some(cert), Some(key)) = (&c.ca, &c.cert, &c.key)
    {
        agent.tls = Some(TlsFiles {
            ca: ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
        });
    }
    agent
}

fn actuator_config(config: &DaemonConfig) -> ActuatorConfig {
    let a = &config.actuation;
    ActuatorConfig {
        state_file: config.state_file.clone(),
        cpu_period_us: a.cpu_period_us,
        cpu_min_write_interval_ms: a.cpu_min_write_interval.as_millis() as u64,
        memory_min_write_interval_ms: a.memory_min_write_interval.as_millis() as u64,
        manage_memory: a.govern_memory,
        original_limits_are_ceilings: a.original_limits_are_ceilings,
        v1_memory_limit: a.v1_memory_limit,
        memory_guard: MemoryGuardConfig {
            headroom_fraction: a.memory_headroom_fraction,
            headroom_min_bytes: a.memory_headroom_min.0,
            ..MemoryGuardConfig::default()
        },
        ..ActuatorConfig::default()
    }
}

/// The node's capacity: configured, or read from the machine.
pub fn node_resources(config: &DaemonConfig) -> NodeResources {
    let cores = config.node.cores.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get() as f64)
            .unwrap_or(1.0)
    });
    let memory_bytes = config.node.memory.map(|m| m.0).unwrap_or_else(mem_total);
    NodeResources {
        cores,
        memory_bytes,
    }
}

fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// The host name, for status and the coordinator.
pub fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

/// CPU usage from the eBPF accounting program, or from `cpu.stat`/`cpuacct` where it cannot
/// load (see [`crate::accounting`]).
struct AccountedCpu {
    accounting: CpuAccounting,
    /// Run-queue wait of the groups of the last `cpu_seconds` read (eBPF only).
    last_waits: Vec<Option<f64>>,
}

impl CpuSource for AccountedCpu {
    fn name(&self) -> String {
        self.accounting.source().as_str().into()
    }
    fn note(&self) -> Option<String> {
        self.accounting.fallback_reason().map(str::to_owned)
    }
    fn cpu_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>> {
        // Without eBPF the source is the job's own `cpu.stat` (or `cpuacct.usage`), which
        // `NodeCore::sample` reads for the job's usage anyway: say "not provided" so that file
        // is opened once per job per sample, not twice.
        if self.accounting.source() != crate::accounting::CpuSource::Ebpf {
            return vec![None; groups.len()];
        }
        let paths: Vec<PathBuf> = groups.iter().map(|g| g.relative().to_path_buf()).collect();
        let readings = self.accounting.read(&paths);
        let by_path: std::collections::HashMap<&Path, (f64, Option<f64>)> = readings
            .iter()
            .map(|r| {
                (
                    r.path.as_path(),
                    (r.cpu_seconds_total, r.run_queue_wait_seconds),
                )
            })
            .collect();
        let found: Vec<Option<(f64, Option<f64>)>> = paths
            .iter()
            .map(|p| by_path.get(p.as_path()).copied())
            .collect();
        self.last_waits = found.iter().map(|f| f.and_then(|(_, w)| w)).collect();
        found.iter().map(|f| f.map(|(c, _)| c)).collect()
    }
    fn wait_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>> {
        // From the read `cpu_seconds` just made for the same groups.
        let waits = std::mem::take(&mut self.last_waits);
        if waits.len() == groups.len() {
            waits
        } else {
            vec![None; groups.len()]
        }
    }
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
    let mut core = NodeCore::new(settings.clone(), policy, actuator, now);
    // eBPF accounting (sched_switch), or cpu.stat / cpuacct where it cannot load; the reason
    // is logged once and shown by `governor status`.
    let mut cpu: Box<dyn CpuSource> = Box::new(AccountedCpu {
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

/// The node's GPUs through NVML (the configured library, else the driver's), or `None` on a
/// node without one (said once). Restores power limits a previous run left changed.
fn open_gpu_governor(config: &DaemonConfig) -> Option<crate::gpu::governance::GpuGovernor> {
    use crate::gpu::device::NvmlDevices;
    use crate::gpu::governance::{GpuGovernor, JOURNAL_FILE_NAME};
    let nvml = match crate::gpu::open_nvml(config.gpu.nvml_library.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            if config.gpu.govern {
                warn!(error = %e, "[gpu] govern is set but NVML does not load: GPUs are not governed");
            } else {
                info!(reason = %e, "no NVML: GPU use is not followed");
            }
            return None;
        }
    };
    let params = governor_policy::gpu_power::GpuPowerParams {
        watching: config.gpu.watching_power,
        converged: config.gpu.converged_power,
    };
    info!(govern = config.gpu.govern, slowdown = ?config.gpu.slowdown, "GPUs followed through NVML");
    let governor = GpuGovernor::new(
        Box::new(NvmlDevices(nvml)),
        config.gpu.govern,
        params,
        config.state_file.with_file_name(JOURNAL_FILE_NAME),
    )
    .with_mechanism(config.gpu.mechanism);
    Some(match config.gpu.slowdown.filter(|s| *s > 0.0) {
        Some(s) => governor.with_search(s),
        None => governor,
    })
}

/// `governor status`: the core's view, with each GPU and each job's GPU use.
fn status_with_gpus(
    core: &NodeCore,
    gpu: Option<&crate::gpu::governance::GpuGovernor>,
    now: Instant,
) -> governor_proto::control_socket::NodeStatus {
    let mut status = core.status(now);
    if let Some(g) = gpu {
        status.gpus = g.status().to_vec();
        for j in &mut status.jobs {
            if let Some(u) = g.job(&j.name) {
                j.gpus.clone_from(&u.gpus);
                j.gpu_memory_bytes = Some(u.memory_bytes);
                j.gpu_energy_joules = Some(u.energy_joules);
                j.gpu_utilization_percent = Some(u.utilization_percent);
                j.gpu_power_watts = Some(u.power_watts);
            }
        }
    }
    status
}

/// Watch events handled in one turn of the control loop after the one that woke it.
const WATCH_EVENTS_PER_TURN: usize = 255;

/// Share of one core the periodic sampling round (usage of every job, vanished cgroups, the
/// decision that follows) may take on a node with many jobs: beyond it the round is spaced out.
const SAMPLE_BUDGET: f64 = 0.005;

/// Nodes with at most this many jobs always sample at the configured interval: the policies'
/// reaction to a change (the 2-second shift) depends on fresh usage, and a few jobs cost well
/// under the budget on real hardware (in the TCG test VM a 2-job round takes 6-20 ms of
/// emulated time, which would otherwise stretch the interval).
const PACE_ABOVE_JOBS: usize = self::core::LARGE_NODE_JOBS;

/// When the next sampling round is due: every `sample_interval`, or less often when a node with
/// many jobs spends more than [`SAMPLE_BUDGET`] of a core on the rounds. With 1,000 jobs a
/// round reads ~3,000 cgroup files (~20 ms) and is repeated every ~4 s instead of every second.
/// Progress records still trigger decisions at once (see `NodeCore::on_progress_moved`): only
/// usage readings become less frequent.
struct SamplePacer {
    configured: Duration,
    current: Duration,
    next: Instant,
}

impl SamplePacer {
    fn new(configured: Duration) -> Self {
        SamplePacer {
            configured,
            current: configured,
            next: Instant::now(),
        }
    }

    fn done(&mut self, started: Instant, finished: Instant, jobs: usize) {
        let took = finished.saturating_duration_since(started);
        let interval = pace(self.configured, took, jobs);
        let ratio = interval.as_secs_f64() / self.current.as_secs_f64();
        if !(0.8..=1.25).contains(&ratio) {
            let was_paced = self.current > self.configured;
            let paced = interval > self.configured;
            if paced && !was_paced {
                info!(jobs, round_ms = took.as_secs_f64() * 1e3, interval = ?interval, "sampling less often to stay within 0.5% of a core");
            } else if !paced && was_paced {
                info!(jobs, interval = ?interval, "sampling at the configured interval again");
            } else {
                debug!(jobs, round_ms = took.as_secs_f64() * 1e3, interval = ?interval, "sampling interval");
            }
            self.current = interval;
        }
        self.next = started + self.current;
    }
}

/// The interval after a round with `jobs` jobs that took `took`.
fn pace(configured: Duration, took: Duration, jobs: usize) -> Duration {
    if jobs <= PACE_ABOVE_JOBS {
        return configured;
    }
    configured
        .max(took.mul_f64(1.0 / SAMPLE_BUDGET))
        .min(configured * 10)
}

/// The watcher keeps one descriptor per followed log file: raise the soft RLIMIT_NOFILE to the
/// hard limit so a node with thousands of jobs does not run out.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        warn!(error = %e, soft, hard, "cannot raise the open-file limit");
    }
}

async fn next_proc_events(
    events: &mut Option<ProcEvents>,
    buf: &mut Vec<ProcEvent>,
) -> std::io::Result<()> {
    match events {
        Some(e) => e.next_events(buf).await,
        None => std::future::pending().await,
    }
}

/// The receiving ends of the cluster side, polled by the main loop.
struct ClusterReceivers {
    commands: mpsc::Receiver<NodeCommand>,
    exits: mpsc::UnboundedReceiver<launcher::JobExit>,
    agent: watch::Receiver<AgentStatus>,
    dumps: mpsc::UnboundedReceiver<DumpDone>,
}

/// A CRIU dump for a transparent move ended (its task runs beside the loop: seconds).
struct DumpDone {
    job_id: String,
    replica: u32,
    result: Result<u64, crate::criu::CriuError>,
}

async fn next_dump(rx: &mut Option<mpsc::UnboundedReceiver<DumpDone>>) -> Option<DumpDone> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_command(rx: &mut Option<mpsc::Receiver<NodeCommand>>) -> Option<NodeCommand> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_exit(
    rx: &mut Option<mpsc::UnboundedReceiver<launcher::JobExit>>,
) -> Option<launcher::JobExit> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn agent_changed(
    rx: &mut Option<watch::Receiver<AgentStatus>>,
) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(r) => r.changed().await,
        None => std::future::pending().await,
    }
}

/// The daemon's half of the cluster link: the report channel of the agent, the launcher of
/// the coordinator's jobs, the node's GPUs.
struct ClusterSide {
    address: String,
    reports: watch::Sender<NodeReport>,
    launcher: launcher::Launcher,
    /// Checkpoints carried through the coordinator (moves without a shared path).
    carrier: carry::Carrier,
    /// Where the tasks running CRIU dumps report.
    dumps: mpsc::UnboundedSender<DumpDone>,
    gpus: crate::gpu::Gpus,
    /// Where the agent stands, for `governor status`.
    agent: AgentStatus,
    last_error: Option<String>,
    _agent_task: tokio::task::JoinHandle<()>,
}

impl ClusterSide {
    fn start(
        c: &CoordinatorConfig,
        settings: &CoreSettings,
        config: &DaemonConfig,
        core: &NodeCore,
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
        });
        let (reports, report_rx) = watch::channel(NodeReport::default());
        let (command_tx, commands) = mpsc::channel(64);
        let (uploads_tx, uploads) = mpsc::channel(4);
        let carrier = carry::Carrier::new(c.job_output_dir.join("carry"), uploads_tx);
        let (dumps_tx, dumps) = mpsc::unbounded_channel();
        let (task, agent) =
            NodeAgent::spawn_with_uploads(agent_config, report_rx, command_tx, uploads);
        info!(coordinator = %c.address, node = %settings.node_name, tls = !c.insecure, gpus = inventory.len(), "cluster agent started");
        Ok((
            ClusterSide {
                address: c.address.clone(),
                reports,
                launcher,
                carrier,
                dumps: dumps_tx,
                gpus,
                agent: AgentStatus::Connecting { attempt: 1 },
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

/// The loop's state, borrowed by each event handler.
struct Shell {
    core: NodeCore,
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

impl Shell {
    /// Show the agent's state in `governor status`.
    fn refresh_coordinator_state(&mut self) {
        let state = self
            .cluster
            .as_ref()
            .map(|c| node_report::describe_agent(&c.address, &c.agent, c.last_error.as_deref()));
        self.core.set_coordinator_state(state);
    }

    fn refresh_agent_status(&mut self, status: Option<AgentStatus>) {
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
    fn publish_report(&mut self, now: Instant) {
        let Some(c) = self.cluster.as_mut() else {
            return;
        };
        c.launcher.poll(self.core.actuator().fs(), now);
        let status = status_with_gpus(&self.core, self.gpu.as_ref(), now);
        note_converging(&mut c.launcher, &status);
        let gpus = c.gpus.usage();
        let report = node_report::node_report(&status, c.launcher.jobs(), &gpus);
        c.reports.send_replace(report);
    }

    /// A command from the coordinator. Bad ones are logged once by the launcher and answered
    /// with a `failed` job in the next report; nothing here can stop the daemon.
    async fn on_command(&mut self, now: Instant, cmd: NodeCommand) {
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
                    let done = c.dumps.clone();
                    tokio::spawn(async move {
                        let result = crate::criu::dump(&request).await;
                        let _ = done.send(DumpDone {
                            job_id: request.job_id,
                            replica: request.replica,
                            result,
                        });
                    });
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
        match job_sources::launched_job(&started.adopt, None) {
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
    async fn recover_coordinator_jobs(&mut self, now: Instant) {
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
    async fn on_dumped(&mut self, now: Instant, done: DumpDone) {
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
    async fn on_job_exit(&mut self, now: Instant, exit: launcher::JobExit) {
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

    async fn initial_discovery(&mut self, now: Instant) {
        self.discovery.find_joined(&self.core);
        let found = self.discovery.initial(&self.core);
        self.start_jobs(now, found).await;
        self.core.decide_and_apply(now);
    }

    async fn start_jobs(&mut self, now: Instant, jobs: Vec<job_sources::Found>) {
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

    async fn stop_job(&mut self, now: Instant, cgroup: &JobCgroup, why: &str) {
        let key = cgroup.to_string();
        let _ = self.watcher.remove(&key).await;
        self.core.remove_job(now, cgroup, why);
        self.discovery.forget(cgroup, &self.core);
    }

    fn on_watch_event(&mut self, now: Instant, ev: WatchEvent) {
        // Sub-second reaction: decide as soon as the signal moves (batched when decisions
        // would cost more than their CPU budget).
        self.core.on_watch_event(now, &ev);
    }

    async fn on_proc_events(&mut self, now: Instant, events: &[ProcEvent]) {
        let (found, finished) = self.discovery.on_proc_events(&self.core, events);
        self.start_jobs(now, found).await;
        for cgroup in finished {
            self.stop_job(now, &cgroup, "its last process exited").await;
        }
        if self.core.decision_due(now) {
            self.core.decide_and_apply(now);
        }
    }

    async fn on_tick(&mut self, now: Instant, cpu: &mut dyn CpuSource) {
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

    async fn rescan(&mut self, now: Instant) {
        let found = self.discovery.rescan(&self.core);
        self.start_jobs(now, found).await;
    }

    async fn reload(&mut self, now: Instant) {
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

    async fn on_request(&mut self, now: Instant, req: PendingRequest) {
        let facts = RequestFacts {
            discovery: &self.discovery,
            fs: self.core.actuator().fs(),
            subtree: &self.core.actuator().config().jobs_subtree,
        };
        if let Err(message) = access::check(&req.request, req.peer.as_ref(), &facts) {
            warn!(peer = ?req.peer, request = ?req.request, reason = %message, "control request refused");
            let _ = req.reply.send(Response::Error { message });
            return;
        }
        let response = match req.request {
            Request::Status => Response::Status(Box::new(status_with_gpus(
                &self.core,
                self.gpu.as_ref(),
                now,
            ))),
            Request::Reload => {
                self.reload(now).await;
                Response::Ok {
                    message: "configuration reloaded".into(),
                }
            }
            Request::Adopt(job) => match self.discovery.adopt_launched(&self.core, &job) {
                Ok(found) => {
                    let name = found.job.name.clone();
                    self.start_jobs(now, vec![found]).await;
                    self.core.decide_and_apply(now);
                    Response::Ok {
                        message: format!("governing {name}"),
                    }
                }
                Err(e) => Response::Error { message: e },
            },
            Request::Release { cgroup } => match JobCgroup::new(cgroup.trim_start_matches('/')) {
                Ok(c) => {
                    self.note_users_group(req.peer.as_ref(), &c);
                    let governed = self.core.contains(&c);
                    if governed {
                        self.stop_job(now, &c, "run-job reported its end").await;
                    }
                    let removed = !self
                        .discovery
                        .remove_ended_groups(&self.core, Some(&c))
                        .is_empty();
                    let message = match (governed, removed) {
                        (true, false) => format!("released {cgroup}"),
                        (true, true) => format!("released {cgroup}; its cgroup removed"),
                        (false, false) => format!("{cgroup} was not governed"),
                        (false, true) => format!("{cgroup} was not governed; its cgroup removed"),
                    };
                    Response::Ok { message }
                }
                Err(e) => Response::Error {
                    message: e.to_string(),
                },
            },
            Request::JoinJob { name } => match req.peer.as_ref() {
                Some(peer) => self.join_job(peer, &name),
                None => Response::Error {
                    message: "the caller's credentials are unknown".into(),
                },
            },
        };
        let _ = req.reply.send(response);
    }
}

impl Shell {
    /// A non-root user reports the end of a job of theirs in the governor's job subtree: the
    /// group is theirs to have removed (also one a previous run of the daemon made for them on a
    /// node without a cgroup v2 tree, where nothing on disk tells).
    fn note_users_group(&mut self, peer: Option<&Peer>, group: &JobCgroup) {
        let Some(peer) = peer.filter(|p| p.uid != 0) else {
            return;
        };
        let subtree = &self.core.actuator().config().jobs_subtree;
        if group.relative().parent() == Some(subtree.as_path())
            && self.discovery.job_owner(&group.to_string()) == Some(peer.uid)
        {
            self.discovery.note_joined(group.clone(), peer.uid);
        }
    }
}

/// What [`access::check`] needs, from discovery and the cgroup filesystem.
struct RequestFacts<'a> {
    discovery: &'a Discovery,
    fs: &'a crate::cgroup::CgroupFs,
    /// The job subtree, relative to the cgroup root (`governor.slice/jobs`).
    subtree: &'a Path,
}

impl access::Facts for RequestFacts<'_> {
    fn process_owner(&self, pid: u32) -> Option<u32> {
        self.discovery.process_owner(pid)
    }
    fn process_cgroup(&self, pid: u32) -> Option<String> {
        self.discovery.process_cgroup(pid)
    }
    fn job_owner(&self, cgroup: &str) -> Option<u32> {
        self.discovery.job_owner(cgroup)
    }
    fn job_subtree(&self) -> String {
        format!("/{}", self.subtree.display())
    }
    fn process_groups(&self, pid: u32) -> Vec<u32> {
        self.discovery.process_groups(pid)
    }
    fn process_limit(&self, pid: u32) -> Option<String> {
        let dirs = self.fs.process_dirs(pid)?;
        self.fs.cpu_or_memory_limit_on(&dirs)
    }
    fn job_group(&self, name: &str) -> Option<access::JobGroup> {
        let group = JobCgroup::new(self.subtree.join(name)).ok()?;
        if !self.fs.job_dirs(&group).first().is_some_and(|d| d.is_dir()) {
            return None;
        }
        let owner = self
            .discovery
            .job_owner(&group.to_string())
            .or_else(|| self.fs.delegated_to(&group))
            .unwrap_or(0);
        Some(access::JobGroup {
            owner,
            populated: self.fs.populated(&group),
        })
    }
    fn run_job_grant(&self) -> &access::RunJobGrant {
        self.discovery.run_job_grant()
    }
}

/// Whether `path` looks absolute (log paths must be).
pub(crate) fn is_absolute(path: &str) -> bool {
    Path::new(path).is_absolute()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_actuation_settings_reach_the_actuator() {
        let config = DaemonConfig::parse(
            "[actuation]\noriginal_limits_are_ceilings = false\nv1_memory_limit = true\ngovern_memory = true\n",
            Path::new("g.toml"),
        )
        .unwrap();
        let a = actuator_config(&config);
        assert!(!a.original_limits_are_ceilings);
        assert!(a.v1_memory_limit);
        assert!(a.manage_memory);
        let defaults = actuator_config(&DaemonConfig::default());
        assert!(defaults.original_limits_are_ceilings && !defaults.v1_memory_limit);
    }

    fn opts() -> DaemonOptions {
        DaemonOptions {
            config_path: "/nonexistent/governor.toml".into(),
            policy: None,
            dry_run: false,
            coordinator: None,
            certs: None,
            insecure: false,
            node_name: None,
        }
    }

    #[test]
    fn sampling_is_spaced_out_only_when_a_round_costs_more_than_its_budget() {
        let second = Duration::from_secs(1);
        // A small node: a round of 0.2 ms keeps the configured interval.
        assert_eq!(pace(second, Duration::from_micros(200), 1000), second);
        // 1,000 jobs: a 25 ms round is sampled every 5 s (0.5% of a core).
        assert_eq!(
            pace(second, Duration::from_millis(25), 1000),
            Duration::from_millis(5000)
        );
        // A few jobs on a slow machine (the TCG test VM) keep the configured interval.
        assert_eq!(pace(second, Duration::from_millis(25), 2), second);
        // Never slower than ten times the configured interval.
        assert_eq!(
            pace(second, Duration::from_secs(1), 1000),
            Duration::from_secs(10)
        );
        let mut pacer = SamplePacer::new(second);
        let t = Instant::now();
        pacer.done(t, t + Duration::from_millis(25), 1000);
        assert_eq!(pacer.next, t + Duration::from_millis(5000));
        // Small changes do not move the interval (no flapping, no log line per round).
        pacer.done(t, t + Duration::from_millis(27), 1000);
        assert_eq!(pacer.next, t + Duration::from_millis(5000));
        pacer.done(t, t + Duration::from_micros(300), 1000);
        assert_eq!(pacer.next, t + second);
        pacer.done(t, t + Duration::from_millis(25), 3);
        assert_eq!(pacer.next, t + second);
    }

    #[test]
    fn coordinator_flags_fill_the_coordinator_table() {
        let mut config = DaemonConfig::default();
        let o = DaemonOptions {
            coordinator: Some("10.10.0.1:7070".into()),
            certs: Some("/etc/governor/certs".into()),
            node_name: Some("node2".into()),
            ..opts()
        };
        apply_cluster_options(&mut config, &o).unwrap();
        let c = config.coordinator.as_ref().unwrap();
        assert_eq!(c.address, "10.10.0.1:7070");
        assert_eq!(
            c.ca.as_deref(),
            Some(Path::new("/etc/governor/certs/ca.pem"))
        );
        assert_eq!(
            c.cert.as_deref(),
            Some(Path::new("/etc/governor/certs/node2.pem"))
        );
        assert_eq!(
            c.key.as_deref(),
            Some(Path::new("/etc/governor/certs/node2-key.pem"))
        );
        assert_eq!(config.node.name.as_deref(), Some("node2"));
        let agent = agent_config(
            c,
            "node2",
            crate::coordinator_client::NodeCapacity::cpu_only(2.0, 1 << 30),
        );
        assert_eq!(
            agent.tls.unwrap().cert,
            PathBuf::from("/etc/governor/certs/node2.pem")
        );
    }

    #[test]
    fn coordinator_flags_are_checked() {
        let mut config = DaemonConfig::default();
        let e = apply_cluster_options(
            &mut config,
            &DaemonOptions {
                coordinator: Some("10.10.0.1:7070".into()),
                ..opts()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--certs DIR"), "{e}");
        let e = apply_cluster_options(
            &mut DaemonConfig::default(),
            &DaemonOptions {
                insecure: true,
                ..opts()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("need a coordinator"), "{e}");
        let mut config = DaemonConfig::default();
        apply_cluster_options(
            &mut config,
            &DaemonOptions {
                coordinator: Some("127.0.0.1:7070".into()),
                insecure: true,
                ..opts()
            },
        )
        .unwrap();
        let c = config.coordinator.unwrap();
        assert!(c.insecure);
        assert!(
            agent_config(
                &c,
                "n",
                crate::coordinator_client::NodeCapacity::cpu_only(1.0, 1)
            )
            .tls
            .is_none()
        );
    }
}
