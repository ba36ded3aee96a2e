//! What the daemon is built from at start-up (and on SIGHUP): its configuration with the
//! command line's overrides, the actuator's and the cluster agent's settings, the node's
//! capacity, its CPU accounting and its GPUs.

use std::path::{Path, PathBuf};

use anyhow::Result;
use tracing::{info, warn};

use super::DaemonOptions;
use super::node_core::CpuSampler;
use crate::accounting::CpuAccounting;
use crate::cgroup::{ActuatorConfig, JobCgroup, MemoryGuardConfig};
use crate::config::{CoordinatorConfig, DaemonConfig};
use crate::coordinator_client::{AgentConfig, TlsFiles};
use crate::policy::{self, NodeResources};

/// Load the configuration, applying command-line overrides.
pub(super) fn load_config(opts: &DaemonOptions) -> Result<DaemonConfig> {
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
pub(super) fn apply_cluster_options(config: &mut DaemonConfig, opts: &DaemonOptions) -> Result<()> {
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

/// The agent's configuration from the daemon's.
pub(super) fn agent_config(
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

pub(super) fn actuator_config(config: &DaemonConfig) -> ActuatorConfig {
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
pub(super) struct AccountedCpu {
    pub(super) accounting: CpuAccounting,
    /// Run-queue wait of the groups of the last `cpu_seconds` read (eBPF only).
    pub(super) last_waits: Vec<Option<f64>>,
}

impl CpuSampler for AccountedCpu {
    fn name(&self) -> String {
        self.accounting.source().as_str().into()
    }
    fn note(&self) -> Option<String> {
        self.accounting.fallback_reason().map(str::to_owned)
    }
    fn cpu_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>> {
        // Without eBPF the source is the job's own `cpu.stat` (or `cpuacct.usage`), which
        // `CoreShell::sample` reads for the job's usage anyway: say "not provided" so that file
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

/// The node's GPUs through NVML (the configured library, else the driver's), or `None` on a
/// node without one (said once). Restores power limits a previous run left changed.
pub(super) fn open_gpu_governor(
    config: &DaemonConfig,
) -> Option<crate::gpu::governance::GpuGovernor> {
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

/// The watcher keeps one descriptor per followed log file: raise the soft RLIMIT_NOFILE to the
/// hard limit so a node with thousands of jobs does not run out.
pub(super) fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        warn!(error = %e, soft, hard, "cannot raise the open-file limit");
    }
}
