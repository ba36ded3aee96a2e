//! Configuration: the daemon's `governor.toml` and declared jobs (`jobs.d/*.toml`).
//!
//! Every field has a serde default documented in the `Default` impl, so an empty file is a valid
//! configuration. `governor --example-config` prints [`EXAMPLE_CONFIG`], a commented example that
//! a unit test keeps in sync with these types.

use std::collections::BTreeMap;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::policy::{Bounds, Direction};

/// Errors reading configuration; each names the file and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error(
        "--certs and --insecure need a coordinator: --coordinator HOST:PORT, or [coordinator] address in the configuration"
    )]
    NoCoordinator,
    #[error(
        "the coordinator's address is missing: --coordinator HOST:PORT, or [coordinator] address in the configuration"
    )]
    NoCoordinatorAddress,
    #[error(
        "the coordinator connection needs mTLS files ({missing} missing): --certs DIR (ca.pem, NODE.pem and NODE-key.pem from `govctl certs init`), or ca, cert and key in [coordinator]; --insecure (insecure = true) for a test cluster only"
    )]
    NoCoordinatorTls { missing: String },
    #[error("--certs and --insecure contradict each other: give one")]
    CertsAndInsecure,
}

/// The command-line options of `governor daemon` that concern the cluster. They combine with
/// the configuration file: each one given overrides (or fills in) its setting there.
///
/// | flag | setting |
/// | --- | --- |
/// | `--coordinator HOST:PORT` | `[coordinator] address` (and makes a `[coordinator]` table) |
/// | `--certs DIR` | `[coordinator] ca`, `cert`, `key` = `DIR/ca.pem`, `DIR/NODE.pem`, `DIR/NODE-key.pem`; `insecure = false` |
/// | `--insecure` | `[coordinator] insecure = true` |
/// | `--node-name NAME` | `[node] name` (and the NODE of `--certs`) |
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterFlags {
    pub coordinator: Option<String>,
    pub certs: Option<PathBuf>,
    pub insecure: bool,
    pub node_name: Option<String>,
}

/// The daemon's configuration (`/etc/governor/governor.toml`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Node policy: `fair`, `flowcon`, `specon` or `governor`.
    pub policy: String,
    /// Directory of declared jobs, one TOML file per job.
    pub jobs_dir: PathBuf,
    /// Mount point of the cgroup filesystem.
    pub cgroup_root: PathBuf,
    /// Where the original value of every cgroup file the governor writes is recorded.
    pub state_file: PathBuf,
    /// Control socket (`governor status` talks to it).
    pub socket: PathBuf,
    /// Group that owns the control socket (mode 0660); `None` keeps root's group.
    pub socket_group: Option<String>,
    /// How often resource usage is sampled.
    #[serde(with = "humantime_serde")]
    pub sample_interval: Duration,
    /// Capacity the policy divides among governed jobs.
    pub node: NodeConfig,
    pub discovery: DiscoveryConfig,
    pub actuation: ActuationConfig,
    /// Who besides root may start jobs with `governor run-job`.
    pub run_job: RunJobConfig,
    /// Cluster coordinator; absent: the node governs on its own.
    pub coordinator: Option<CoordinatorConfig>,
    /// GPUs: who uses which, their energy, and (opt-in) power by training progress.
    pub gpu: GpuConfig,
    /// `/metrics` for Prometheus.
    pub metrics: MetricsConfig,
}

/// `[metrics]`: a `/metrics` endpoint (Prometheus text format), off unless `listen` is set.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address to serve on, e.g. `127.0.0.1:9464` (bind it to localhost or a management
    /// network: it shows job names and cgroups).
    pub listen: Option<String>,
    /// Serve HTTPS with this PEM certificate chain and key instead of plain HTTP.
    pub tls: Option<governor_proto::http::HttpTls>,
}

/// `[gpu]`: NVIDIA GPUs through NVML.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpuConfig {
    /// Lower the power limit of GPUs whose jobs stopped learning, and restore it after
    /// (needs root or the driver's permission to set power limits). Off: GPUs are only read.
    pub govern: bool,
    /// The NVML library to load (default: the driver's `libnvidia-ml.so.1`).
    pub nvml_library: Option<PathBuf>,
    /// Power limit of a GPU whose jobs are all `watching`, as a fraction of its original.
    pub watching_power: f64,
    /// Power limit of a GPU whose jobs are all `converged`, as a fraction of its original.
    pub converged_power: f64,
    /// Zeus's search: a GPU with one job that stopped learning and logs often enough runs at
    /// the lowest limit (in steps of 10% of its original) that keeps the job's pace within this
    /// fraction of its pace at the original. 0 (or unset): the fixed fractions only.
    pub slowdown: Option<f64>,
    /// `power` (lower the power limit) or `clocks` (lock the graphics clock at the same
    /// fraction of its maximum; the fixed fractions only).
    pub mechanism: crate::gpu::governance::Mechanism,
}

impl Default for GpuConfig {
    fn default() -> Self {
        let p = governor_policy::gpu_power::GpuPowerParams::default();
        GpuConfig {
            govern: false,
            nvml_library: None,
            watching_power: p.watching,
            converged_power: p.converged,
            slowdown: Some(0.02),
            mechanism: crate::gpu::governance::Mechanism::Power,
        }
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            policy: "governor".into(),
            jobs_dir: "/etc/governor/jobs.d".into(),
            cgroup_root: "/sys/fs/cgroup".into(),
            state_file: "/run/governor/state.json".into(),
            socket: "/run/governor/governor.sock".into(),
            socket_group: None,
            sample_interval: Duration::from_millis(1000),
            node: NodeConfig::default(),
            discovery: DiscoveryConfig::default(),
            actuation: ActuationConfig::default(),
            run_job: RunJobConfig::default(),
            coordinator: None,
            gpu: GpuConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

/// Capacity available to governed jobs. Unset values are read from the machine.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Cores (default: online CPUs).
    pub cores: Option<f64>,
    /// Memory (default: MemTotal).
    pub memory: Option<ByteSize>,
    /// Name reported to the coordinator (default: the host name).
    pub name: Option<String>,
    /// GPUs to report on a machine without NVIDIA GPUs (tests, the VM bed). Real GPUs are
    /// found through NVML.
    pub simulated_gpus: Vec<crate::gpu::SimulatedGpu>,
}

/// How jobs are found.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Find processes whose environment has `GOVERNOR_LOG=<path>`.
    pub environment: bool,
    /// Full rescan of /proc as a safety net, in case an event was missed (process events
    /// and cgroup inotify events notice jobs within a second; this is not the main path).
    #[serde(with = "humantime_serde")]
    pub rescan_interval: Duration,
    /// A discovered job whose cgroup has no process left is dropped after this long.
    #[serde(with = "humantime_serde")]
    pub finished_grace: Duration,
    /// Whose processes found through their environment may be moved into a cgroup of the
    /// governor's when they share theirs with other processes: `"none"`, `"any"`, or a
    /// comma-separated list of `root`, `user:NAME`, `group:NAME`. Processes of anyone else are
    /// governed only where they already have a cgroup of their own. Default
    /// `"root,group:governor"`.
    pub adopt: String,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            environment: true,
            rescan_interval: Duration::from_secs(30),
            finished_grace: Duration::from_millis(0),
            adopt: crate::discovery::adopt::DEFAULT_ADOPT.to_owned(),
        }
    }
}

/// `[run_job]`: jobs started by users who are not root. Such a user's `governor run-job` asks
/// the daemon (`join_job` on the control socket) to create the job's cgroup, move the job's
/// process into it and delegate it to the user (cgroup v2; see `governor::cgroup::delegation`
/// for what that gives); root's `run-job` creates the group itself.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunJobConfig {
    /// Who besides root may: `"any"`, `"none"`, or a comma-separated list of `user:NAME` and
    /// `group:NAME` (the grammar of `[discovery] adopt`; numeric ids work too). Only those who
    /// can connect to the control socket can ask at all (root and the members of
    /// `socket_group`), so the default `"any"` means: every member of `socket_group`.
    pub users: String,
}

impl Default for RunJobConfig {
    fn default() -> Self {
        RunJobConfig {
            users: "any".to_owned(),
        }
    }
}

/// How allocations are written.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActuationConfig {
    /// Compute and log decisions without writing any cgroup file.
    pub dry_run: bool,
    /// `cpu.max` period in microseconds.
    pub cpu_period_us: u64,
    /// Minimum time between two writes of the same CPU file.
    #[serde(with = "humantime_serde")]
    pub cpu_min_write_interval: Duration,
    /// Minimum time between two writes of the same memory file.
    #[serde(with = "humantime_serde")]
    pub memory_min_write_interval: Duration,
    /// Apply the policy's memory proposals (`memory.high`/`memory.max`). Off by default: the
    /// governor then touches only CPU files.
    pub govern_memory: bool,
    /// Never limit memory below usage plus this fraction of usage...
    pub memory_headroom_fraction: f64,
    /// ...or plus this many bytes, whichever is larger.
    pub memory_headroom_min: ByteSize,
    /// Never loosen a CPU cap or memory limit beyond the value found (a pod's limits stay in
    /// force). Default true.
    pub original_limits_are_ceilings: bool,
    /// cgroup v1: apply `memory.max` proposals to `memory.limit_in_bytes`. Default false: v1 has
    /// no `memory.high` to throttle a growing job first, so a hard limit could kill it.
    pub v1_memory_limit: bool,
}

impl Default for ActuationConfig {
    fn default() -> Self {
        ActuationConfig {
            dry_run: false,
            cpu_period_us: 100_000,
            cpu_min_write_interval: Duration::from_millis(100),
            memory_min_write_interval: Duration::from_secs(1),
            govern_memory: false,
            memory_headroom_fraction: 0.10,
            memory_headroom_min: ByteSize(64 << 20),
            original_limits_are_ceilings: true,
            v1_memory_limit: false,
        }
    }
}

/// Connection to the cluster coordinator.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// `host:port` of the coordinator.
    pub address: String,
    /// CA certificate (PEM) that signed the coordinator's certificate.
    pub ca: Option<PathBuf>,
    /// This node's client certificate and key (PEM).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Plain-text gRPC without TLS. Only for test clusters.
    pub insecure: bool,
    /// Where the stdout and stderr of jobs the coordinator starts go
    /// (`<dir>/<job cgroup name>.out`).
    pub job_output_dir: PathBuf,
    /// How long a job the coordinator stops gets between SIGTERM and SIGKILL.
    #[serde(with = "humantime_serde")]
    pub stop_grace: Duration,
    /// How long a finished coordinator job stays in the node's reports (the coordinator must
    /// see its exit status, also across a short disconnection).
    #[serde(with = "humantime_serde")]
    pub finished_retention: Duration,
    /// Start the coordinator's jobs in a PID namespace of their own, so that CRIU can move
    /// those that declared no checkpoint (needs root and a working `criu`).
    pub transparent_moves: bool,
    /// The `criu` program (a path, or a name looked up on PATH).
    pub criu: PathBuf,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            address: String::new(),
            ca: None,
            cert: None,
            key: None,
            insecure: false,
            job_output_dir: "/var/log/governor/jobs".into(),
            stop_grace: Duration::from_secs(10),
            finished_retention: Duration::from_secs(600),
            transparent_moves: true,
            criu: "criu".into(),
        }
    }
}

/// A declared job (`jobs.d/<name>.toml`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Name shown in `governor status`; defaults to the file's stem.
    #[serde(default)]
    pub name: Option<String>,
    /// The job's cgroup, relative to the cgroup root (e.g. `/system.slice/train.service`).
    pub cgroup: String,
    /// Log files, glob patterns (newest match wins) or log directories (every TensorBoard event
    /// file, MLflow metric file and MLflow database under them) the job writes its progress to.
    pub logs: Vec<String>,
    /// Log format (`auto` or a name from `governor formats`).
    #[serde(default)]
    pub format: Option<String>,
    /// Progress metric (default: the training loss).
    #[serde(default)]
    pub metric: Option<String>,
    /// Whether the metric should go down (`minimise`, default for losses) or up (`maximise`).
    #[serde(default)]
    pub direction: Option<Direction>,
    /// Larger is more important.
    #[serde(default)]
    pub priority: i32,
    /// Total epochs of the run, if known: with the epoch the log reports, the governor learns
    /// how much work the job has left and serves the jobs closest to finishing first.
    #[serde(default)]
    pub epochs: Option<f64>,
    /// Opt-in: end the job once it has converged, `"PATIENCE[:MIN_DELTA]"` (see `governor
    /// run-job --finish`).
    #[serde(default, deserialize_with = "finish_rule")]
    pub finish: Option<crate::policy::quality::FinishRule>,
    /// Opt-in: the job is a trial of a sweep, `"NAME[:ETA:FIRST_RUNG]"` (see `governor run-job
    /// --sweep`).
    #[serde(default, deserialize_with = "sweep_trial")]
    pub sweep: Option<crate::policy::sweep::SweepTrial>,
    /// Never cap the job below this many cores.
    #[serde(default)]
    pub min_cpu: Option<f64>,
    /// Never let the job use more than this many cores.
    #[serde(default)]
    pub max_cpu: Option<f64>,
    #[serde(default)]
    pub min_memory: Option<ByteSize>,
    #[serde(default)]
    pub max_memory: Option<ByteSize>,
    /// A custom line format: `[custom] regex = '...'` with named captures (`step`, `epoch`,
    /// `split`, any other name is a metric) and an optional `split` for the records.
    #[serde(default)]
    pub custom: Option<crate::progress::CustomFormat>,
}

impl JobConfig {
    /// The operator's bounds in policy terms.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            min_cores: self.min_cpu,
            max_cores: self.max_cpu,
            min_memory_bytes: self.min_memory.map(|b| b.0),
            max_memory_bytes: self.max_memory.map(|b| b.0),
        }
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        if !self.cgroup.starts_with('/') {
            return Err(invalid(format!(
                "cgroup {:?} must be a path relative to the cgroup root, starting with '/'",
                self.cgroup
            )));
        }
        if self.cgroup.split('/').any(|c| c == "..") {
            return Err(invalid(format!(
                "cgroup {:?} must not contain '..'",
                self.cgroup
            )));
        }
        if self.logs.is_empty() {
            return Err(invalid(
                "logs is empty: name at least one log file or glob".into(),
            ));
        }
        if let Some(e) = self.epochs
            && !governor_proto::job_env::valid_epochs(e)
        {
            return Err(invalid(format!("epochs = {e} must be a positive number")));
        }
        for (name, v) in [("min_cpu", self.min_cpu), ("max_cpu", self.max_cpu)] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(invalid(format!(
                    "{name} = {v} must be a positive number of cores"
                )));
            }
        }
        if let (Some(lo), Some(hi)) = (self.min_cpu, self.max_cpu)
            && lo > hi
        {
            return Err(invalid(format!("min_cpu = {lo} is above max_cpu = {hi}")));
        }
        if let (Some(lo), Some(hi)) = (self.min_memory, self.max_memory)
            && lo.0 > hi.0
        {
            return Err(invalid(format!(
                "min_memory = {lo} is above max_memory = {hi}"
            )));
        }
        if let Some(custom) = &self.custom
            && let Err(e) = regex::Regex::new(&custom.regex)
        {
            return Err(invalid(format!("custom.regex does not compile: {e}")));
        }
        for log in &self.logs {
            if !Path::new(log).is_absolute() {
                return Err(invalid(format!("log path {log:?} must be absolute")));
            }
        }
        Ok(())
    }
}

impl DaemonConfig {
    /// Read and validate a configuration file.
    pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parse and validate configuration text (`path` only names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<DaemonConfig, ConfigError> {
        let config: DaemonConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        if let Err(e) = crate::policy::by_spec(&self.policy) {
            return Err(invalid(e.to_string()));
        }
        if self.sample_interval < Duration::from_millis(50) {
            return Err(invalid(format!(
                "sample_interval = {:?} is below the 50ms minimum",
                self.sample_interval
            )));
        }
        if !(1_000..=1_000_000).contains(&self.actuation.cpu_period_us) {
            return Err(invalid(format!(
                "actuation.cpu_period_us = {} must be within 1000..=1000000 (the kernel's range)",
                self.actuation.cpu_period_us
            )));
        }
        crate::discovery::adopt::AdoptRule::parse(&self.discovery.adopt)
            .map_err(|e| invalid(format!("discovery.{e}")))?;
        crate::discovery::adopt::AdoptRule::parse(&self.run_job.users).map_err(|e| {
            invalid(format!(
                "run_job.users: {:?} is not understood (use \"any\", \"none\", or a comma-separated list of \"user:NAME\", \"group:NAME\")",
                e.0
            ))
        })?;
        let f = self.actuation.memory_headroom_fraction;
        if !(f.is_finite() && (0.0..=10.0).contains(&f)) {
            return Err(invalid(format!(
                "actuation.memory_headroom_fraction = {f} must be within 0..=10"
            )));
        }
        if let Some(c) = self.node.cores
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(format!("node.cores = {c} must be positive")));
        }
        // `[coordinator]` is checked once the command line has filled it in
        // (`apply_cluster_flags`): its address and mTLS files may come from the flags.
        Ok(())
    }

    /// Combine the command line's cluster flags with this configuration (see [`ClusterFlags`]:
    /// a flag given overrides or fills in its setting), then check the coordinator connection
    /// that results. `host_name` gives the node name when neither `--node-name` nor `[node]
    /// name` does (only asked for by `--certs`).
    pub fn apply_cluster_flags(
        &mut self,
        flags: &ClusterFlags,
        host_name: impl FnOnce() -> String,
    ) -> Result<(), ConfigError> {
        if flags.certs.is_some() && flags.insecure {
            return Err(ConfigError::CertsAndInsecure);
        }
        if let Some(name) = &flags.node_name {
            self.node.name = Some(name.clone());
        }
        if let Some(address) = &flags.coordinator {
            self.coordinator
                .get_or_insert_with(CoordinatorConfig::default)
                .address = address.clone();
        }
        let Some(c) = self.coordinator.as_mut() else {
            if flags.certs.is_some() || flags.insecure {
                return Err(ConfigError::NoCoordinator);
            }
            return Ok(());
        };
        if let Some(dir) = &flags.certs {
            let node = self.node.name.clone().unwrap_or_else(host_name);
            let files = governor_proto::tls::TlsFiles::in_dir(dir, &node);
            c.ca = Some(files.ca);
            c.cert = Some(files.cert);
            c.key = Some(files.key);
            c.insecure = false;
        }
        if flags.insecure {
            c.insecure = true;
        }
        c.check()
    }
}

impl CoordinatorConfig {
    /// The connection can be made: an address, and mTLS files unless `insecure`.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.address.trim().is_empty() {
            return Err(ConfigError::NoCoordinatorAddress);
        }
        if !self.insecure {
            let missing: Vec<&str> = [
                ("ca", self.ca.is_none()),
                ("cert", self.cert.is_none()),
                ("key", self.key.is_none()),
            ]
            .into_iter()
            .filter_map(|(name, absent)| absent.then_some(name))
            .collect();
            if !missing.is_empty() {
                return Err(ConfigError::NoCoordinatorTls {
                    missing: missing.join(", "),
                });
            }
        }
        Ok(())
    }
}

/// Load every `*.toml` in `dir`. A bad file is reported in the error list and skipped; the
/// others still load (one broken job file must not stop governing the rest).
pub fn load_jobs_dir(dir: &Path) -> (BTreeMap<PathBuf, JobConfig>, Vec<ConfigError>) {
    let mut jobs = BTreeMap::new();
    let mut errors = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (jobs, errors),
        Err(source) => {
            errors.push(ConfigError::Read {
                path: dir.to_owned(),
                source,
            });
            return (jobs, errors);
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    for path in paths {
        match load_job(&path) {
            Ok(job) => {
                jobs.insert(path, job);
            }
            Err(e) => errors.push(e),
        }
    }
    (jobs, errors)
}

/// Read one declared job; its name defaults to the file stem.
pub fn load_job(path: &Path) -> Result<JobConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut job: JobConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    if job.name.is_none() {
        job.name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    }
    job.validate(path)?;
    Ok(job)
}

pub use governor_proto::units::ByteSize;

/// A job file's `finish = "PATIENCE[:MIN_DELTA]"`.
fn finish_rule<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::policy::quality::FinishRule>, D::Error> {
    let s = String::deserialize(d)?;
    governor_proto::job_env::parse_finish(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// A job file's `sweep = "NAME[:ETA:FIRST_RUNG]"`.
fn sweep_trial<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::policy::sweep::SweepTrial>, D::Error> {
    let s = String::deserialize(d)?;
    governor_proto::job_env::parse_sweep(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// Durations in TOML as humantime strings (`"250ms"`, `"1s"`, `"2m"`).
mod humantime_serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| {
            serde::de::Error::custom(format!("{s:?}: {e} (examples: \"250ms\", \"1s\", \"2m\")"))
        })
    }
}

/// The commented example printed by `governor --example-config`.
pub const EXAMPLE_CONFIG: &str = r#"# /etc/governor/governor.toml: configuration of the Governor node daemon.
# Every setting is optional; the values shown are the defaults.

# Node policy: fair (kernel default sharing), flowcon, specon or governor.
policy = "governor"

# Declared jobs: one TOML file per job (see the example job below).
jobs_dir = "/etc/governor/jobs.d"

# Mount point of the cgroup filesystem (v2 unified, or v1/hybrid: detected automatically).
cgroup_root = "/sys/fs/cgroup"

# The original value of every cgroup file the governor writes is recorded here and restored on
# shutdown, on SIGTERM and on the next start after a crash.
state_file = "/run/governor/state.json"

# Control socket used by `governor status` and `governor run-job` (mode 0660, owned by root and
# socket_group: only they can connect; a group name or a numeric gid).
socket = "/run/governor/governor.sock"
# socket_group = "governor"

# How often CPU and memory usage are sampled.
sample_interval = "1s"

[node]
# Capacity the policy divides among governed jobs (default: all online CPUs and MemTotal).
# cores = 16
# memory = "64GiB"
# name = "gpu-node-7"
# GPUs are found through NVML. For test clusters without GPUs, declare simulated ones:
# [[node.simulated_gpus]]
# model = "NVIDIA H200"
# memory = "141GiB"

[gpu]
# Read-only unless govern = true: then a GPU whose jobs stopped learning runs at a lower power
# limit (searched within `slowdown` of the job's pace, else the fractions below), restored when
# the jobs learn again or leave, when the daemon stops, and at the next start after a crash.
# Setting power limits needs root.
govern = false
watching_power = 0.8
converged_power = 0.6
slowdown = 0.02          # 0: no search, the fractions only
mechanism = "power"      # or "clocks": lock the graphics clock at the same fraction of its maximum
# nvml_library = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

[metrics]
# Serve /metrics (Prometheus text format) here; off unless set. Bind it to localhost or a
# management network; plain HTTP unless `tls` is set.
# listen = "127.0.0.1:9464"
# tls = { cert = "/etc/governor/metrics.pem", key = "/etc/governor/metrics-key.pem" }
#   (add client_ca = "/etc/governor/certs/ca.pem" to serve only clients with a cluster certificate)

[discovery]
# Adopt processes started with GOVERNOR_LOG=<path> in their environment
# (optional GOVERNOR_METRIC, GOVERNOR_JOB).
environment = true
# Safety-net full rescan; process events and cgroup inotify notice jobs within a second.
rescan_interval = "30s"
finished_grace = "0s"
# Whose processes may be moved out of a shared cgroup (a login session, the root cgroup) into
# one of the governor's: "none", "any", or a list of root, user:NAME, group:NAME. Never out of a
# cgroup with a CPU, memory or pids limit; moved processes go back when released or stopped.
adopt = "root,group:governor"

[run_job]
# Who besides root may start jobs with `governor run-job`: the daemon then creates the job's
# cgroup (governor.slice/jobs/<name>), moves the job's process into it and, on cgroup v2,
# delegates it to the user (sub-groups of its own, never its own limits). "any": everyone who
# can connect to the control socket, i.e. the members of socket_group (without socket_group,
# root only); "none": root only; or a list of user:NAME, group:NAME.
users = "any"

[actuation]
# Compute and log decisions without writing (also: governor daemon --dry-run).
dry_run = false
cpu_period_us = 100000
cpu_min_write_interval = "100ms"
memory_min_write_interval = "1s"
# Apply memory proposals (memory.high / memory.max). The memory guard never sets a limit below
# usage + max(memory_headroom_fraction * usage, memory_headroom_min) and backs off at once when
# memory.events reports pressure.
govern_memory = false
memory_headroom_fraction = 0.1
memory_headroom_min = "64MiB"
# Never loosen a CPU cap or memory limit beyond the value found (a pod's limits stay in force).
original_limits_are_ceilings = true
# cgroup v1 only: apply memory.max proposals to memory.limit_in_bytes (v1 has no memory.high to
# throttle a growing job first, so this is off by default).
v1_memory_limit = false

# Report to a cluster coordinator (optional). Without it the node governs on its own.
# [coordinator]
# address = "10.10.0.1:7070"
# ca = "/etc/governor/certs/ca.pem"      # or: governor daemon --certs /etc/governor/certs
# cert = "/etc/governor/certs/node2.pem"   # NODE.pem and NODE-key.pem from `govctl certs init`
# key = "/etc/governor/certs/node2-key.pem"
# insecure = false
# job_output_dir = "/var/log/governor/jobs"   # stdout/stderr of jobs the coordinator starts
# stop_grace = "10s"                          # SIGTERM -> SIGKILL when the coordinator stops a job
# finished_retention = "10m"                  # finished jobs stay in the reports this long
# transparent_moves = true   # jobs in their own PID namespace: movable by CRIU without a checkpoint
# criu = "criu"              # the criu program (path or name on PATH); root only

# ---------------------------------------------------------------------------------------------
# Example declared job, /etc/governor/jobs.d/bert.toml:
#
# name = "bert-finetune"
# cgroup = "/system.slice/docker-4f3a9c.scope"   # relative to cgroup_root
# logs = ["/data/bert/out/trainer_state.json", "/data/bert/lightning_logs/version_*/metrics.csv"]
# format = "auto"              # or a name from `governor formats`
# metric = "loss"              # default: the training loss
# direction = "minimise"       # or "maximise" (accuracy-like metrics)
# priority = 0
# epochs = 90                  # total epochs of the run, if known (lets the governor see how far along it is)
# finish = "5:0.001"           # opt-in: stop it gracefully once converged (5 values without a 0.001 gain)
# sweep = "lr:3:5"             # opt-in: a trial of sweep "lr", cut by successive halving (1 in 3 go on at 5, 15, 45... epochs)
# min_cpu = 1.0                # cores
# max_cpu = 8.0
# min_memory = "4GiB"
# max_memory = "32GiB"
# [custom]                     # for a log format Governor does not know
# regex = 'step (?P<step>\d+) loss (?P<loss>[0-9.eE+-]+)'
# split = "train"              # the records' split when the regex has no `split` group
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        let c = DaemonConfig::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(c, DaemonConfig::default());
    }

    #[test]
    fn example_config_parses_to_the_defaults() {
        // Keeps EXAMPLE_CONFIG honest: it shows exactly the defaults.
        let c = DaemonConfig::parse(EXAMPLE_CONFIG, Path::new("example")).unwrap();
        assert_eq!(c, DaemonConfig::default());
    }

    #[test]
    fn example_job_in_the_example_config_is_valid() {
        let job: String = EXAMPLE_CONFIG
            .lines()
            .skip_while(|l| !l.contains("Example declared job"))
            .skip(2)
            .filter_map(|l| l.strip_prefix("# "))
            .collect::<Vec<_>>()
            .join("\n");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bert.toml");
        std::fs::write(&p, job).unwrap();
        let j = load_job(&p).unwrap();
        assert_eq!(j.name.as_deref(), Some("bert-finetune"));
        assert_eq!(j.max_memory, Some(ByteSize(32 << 30)));
        assert_eq!(j.direction, Some(Direction::Minimise));
        assert_eq!(j.bounds().min_cores, Some(1.0));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected_with_the_file_named() {
        let e = DaemonConfig::parse("polcy = \"fair\"", Path::new("/etc/g.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/g.toml") && e.contains("polcy"), "{e}");
        let e = DaemonConfig::parse("policy = \"nope\"", Path::new("g.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown policy"), "{e}");
        // Parameters as the command line takes them.
        let c =
            DaemonConfig::parse("policy = \"specon:interval=10\"", Path::new("g.toml")).unwrap();
        assert_eq!(c.policy, "specon:interval=10");
        let e = DaemonConfig::parse("policy = \"specon:intervl=10\"", Path::new("g.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("g.toml") && e.contains("intervl"), "{e}");
        let e = DaemonConfig::parse("sample_interval = \"1ms\"", Path::new("g.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("50ms"), "{e}");
        let e = DaemonConfig::parse("sample_interval = \"soon\"", Path::new("g.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("soon"), "{e}");
        // A `[coordinator]` table is checked only with the command line applied (below).
        assert!(
            DaemonConfig::parse("[coordinator]\naddress = \"a:1\"", Path::new("g.toml")).is_ok()
        );
    }

    #[test]
    fn who_may_start_jobs_is_checked_when_the_configuration_loads() {
        let c = DaemonConfig::parse(
            "[run_job]\nusers = \"group:ml, user:alice\"\n",
            Path::new("g.toml"),
        )
        .unwrap();
        assert_eq!(c.run_job.users, "group:ml, user:alice");
        assert_eq!(DaemonConfig::default().run_job.users, "any");
        let e = DaemonConfig::parse("[run_job]\nusers = \"everyone\"\n", Path::new("g.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("g.toml") && e.contains("run_job.users") && e.contains("everyone"),
            "{e}"
        );
    }

    fn host() -> String {
        "host1".into()
    }

    fn merged(text: &str, flags: ClusterFlags) -> Result<DaemonConfig, ConfigError> {
        let mut config = DaemonConfig::parse(text, Path::new("g.toml")).unwrap();
        config.apply_cluster_flags(&flags, host).map(|()| config)
    }

    fn tls_of(config: &DaemonConfig) -> (PathBuf, PathBuf, PathBuf) {
        let c = config.coordinator.as_ref().unwrap();
        (
            c.ca.clone().unwrap(),
            c.cert.clone().unwrap(),
            c.key.clone().unwrap(),
        )
    }

    fn paths(ca: &str, cert: &str, key: &str) -> (PathBuf, PathBuf, PathBuf) {
        (ca.into(), cert.into(), key.into())
    }

    const FULL: &str = "[node]\nname = \"node2\"\n[coordinator]\naddress = \"10.0.0.1:7070\"\nca = \"/c/ca.pem\"\ncert = \"/c/node2.pem\"\nkey = \"/c/node2-key.pem\"\n";

    #[test]
    fn cluster_settings_from_the_configuration_only() {
        let c = merged(FULL, ClusterFlags::default()).unwrap();
        assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.1:7070");
        assert_eq!(
            tls_of(&c),
            paths("/c/ca.pem", "/c/node2.pem", "/c/node2-key.pem")
        );
        assert_eq!(c.node.name.as_deref(), Some("node2"));
        // No coordinator anywhere: the node governs alone.
        let c = merged("", ClusterFlags::default()).unwrap();
        assert_eq!(c.coordinator, None);
        let c = merged(
            "[coordinator]\naddress = \"a:1\"\ninsecure = true",
            ClusterFlags::default(),
        )
        .unwrap();
        assert!(c.coordinator.unwrap().insecure);
    }

    #[test]
    fn cluster_settings_from_the_flags_only() {
        let c = merged(
            "",
            ClusterFlags {
                coordinator: Some("10.0.0.1:7070".into()),
                certs: Some("/etc/governor/certs".into()),
                insecure: false,
                node_name: Some("node3".into()),
            },
        )
        .unwrap();
        let coordinator = c.coordinator.as_ref().unwrap();
        assert_eq!(coordinator.address, "10.0.0.1:7070");
        assert!(!coordinator.insecure);
        assert_eq!(
            tls_of(&c),
            paths(
                "/etc/governor/certs/ca.pem",
                "/etc/governor/certs/node3.pem",
                "/etc/governor/certs/node3-key.pem"
            )
        );
        assert_eq!(c.node.name.as_deref(), Some("node3"));
        // Without --node-name and [node] name, the host name names the files.
        let c = merged(
            "",
            ClusterFlags {
                coordinator: Some("a:1".into()),
                certs: Some("/d".into()),
                ..ClusterFlags::default()
            },
        )
        .unwrap();
        assert_eq!(tls_of(&c).1, PathBuf::from("/d/host1.pem"));
        assert_eq!(c.node.name, None);
        let c = merged(
            "",
            ClusterFlags {
                coordinator: Some("a:1".into()),
                insecure: true,
                ..ClusterFlags::default()
            },
        )
        .unwrap();
        assert!(c.coordinator.unwrap().insecure);
    }

    #[test]
    fn the_configurations_address_with_the_flags_certificates() {
        // The case the help promises: [coordinator] address in the file, --certs on the line.
        let c = merged(
            "[node]\nname = \"node2\"\n[coordinator]\naddress = \"10.0.0.1:7070\"\n",
            ClusterFlags {
                certs: Some("/etc/governor/certs".into()),
                ..ClusterFlags::default()
            },
        )
        .unwrap();
        assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.1:7070");
        assert_eq!(
            tls_of(&c),
            paths(
                "/etc/governor/certs/ca.pem",
                "/etc/governor/certs/node2.pem",
                "/etc/governor/certs/node2-key.pem"
            )
        );
        // And the other way round: the certificates in the file, the address on the line.
        let c = merged(
            "[coordinator]\nca = \"/c/ca.pem\"\ncert = \"/c/n.pem\"\nkey = \"/c/n-key.pem\"\n",
            ClusterFlags {
                coordinator: Some("10.0.0.9:7070".into()),
                ..ClusterFlags::default()
            },
        )
        .unwrap();
        assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.9:7070");
        assert_eq!(tls_of(&c), paths("/c/ca.pem", "/c/n.pem", "/c/n-key.pem"));
    }

    #[test]
    fn flags_override_the_configuration() {
        let c = merged(
            FULL,
            ClusterFlags {
                coordinator: Some("10.0.0.2:7071".into()),
                certs: Some("/d".into()),
                insecure: false,
                node_name: Some("node7".into()),
            },
        )
        .unwrap();
        assert_eq!(c.coordinator.as_ref().unwrap().address, "10.0.0.2:7071");
        assert_eq!(c.node.name.as_deref(), Some("node7"));
        // --certs uses the name from --node-name, not [node] name.
        assert_eq!(
            tls_of(&c),
            paths("/d/ca.pem", "/d/node7.pem", "/d/node7-key.pem")
        );
        // --node-name alone renames the node and keeps the configured files.
        let c = merged(
            FULL,
            ClusterFlags {
                node_name: Some("node8".into()),
                ..ClusterFlags::default()
            },
        )
        .unwrap();
        assert_eq!(c.node.name.as_deref(), Some("node8"));
        assert_eq!(tls_of(&c).1, PathBuf::from("/c/node2.pem"));
        // --certs turns a configured insecure = true off; --insecure turns it on.
        let c = merged(
            "[coordinator]\naddress = \"a:1\"\ninsecure = true",
            ClusterFlags {
                certs: Some("/d".into()),
                node_name: Some("n".into()),
                ..ClusterFlags::default()
            },
        )
        .unwrap();
        assert!(!c.coordinator.unwrap().insecure);
        let c = merged(
            FULL,
            ClusterFlags {
                insecure: true,
                ..ClusterFlags::default()
            },
        )
        .unwrap();
        assert!(c.coordinator.unwrap().insecure);
    }

    #[test]
    fn an_incomplete_cluster_setting_is_refused_after_merging() {
        // An address but no certificates from anywhere, and not insecure.
        let e = merged("[coordinator]\naddress = \"a:1\"", ClusterFlags::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("mTLS files (ca, cert, key missing)"), "{e}");
        assert!(e.contains("--certs DIR"), "{e}");
        let e = merged(
            "",
            ClusterFlags {
                coordinator: Some("a:1".into()),
                ..ClusterFlags::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs mTLS files"), "{e}");
        let e = merged(
            "[coordinator]\naddress = \"a:1\"\nca = \"/c/ca.pem\"",
            ClusterFlags::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("(cert, key missing)"), "{e}");
        // Certificates but no address from anywhere.
        let e = merged(
            "[coordinator]\n",
            ClusterFlags {
                certs: Some("/d".into()),
                ..ClusterFlags::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("address is missing"), "{e}");
        // --certs or --insecure without any coordinator.
        for flags in [
            ClusterFlags {
                certs: Some("/d".into()),
                ..ClusterFlags::default()
            },
            ClusterFlags {
                insecure: true,
                ..ClusterFlags::default()
            },
        ] {
            let e = merged("", flags).unwrap_err().to_string();
            assert!(e.contains("need a coordinator"), "{e}");
        }
        let e = merged(
            FULL,
            ClusterFlags {
                certs: Some("/d".into()),
                insecure: true,
                ..ClusterFlags::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("contradict"), "{e}");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(ByteSize::parse("65536").unwrap(), ByteSize(65536));
        assert_eq!(ByteSize::parse("512MiB").unwrap(), ByteSize(512 << 20));
        assert_eq!(ByteSize::parse("2G").unwrap(), ByteSize(2 << 30));
        assert_eq!(ByteSize::parse("1.5 GiB").unwrap(), ByteSize(3 << 29));
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("lots").is_err());
        assert_eq!(ByteSize(512 << 20).to_string(), "512MiB");
        assert_eq!(ByteSize(1000).to_string(), "1000");
    }

    #[test]
    fn jobs_dir_loads_good_files_and_reports_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.toml"),
            "cgroup = \"/a\"\nlogs = [\"/l/a.csv\"]\nmax_cpu = 2",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.toml"),
            "cgroup = \"relative\"\nlogs = [\"/l\"]",
        )
        .unwrap();
        std::fs::write(dir.path().join("c.toml"), "this is not toml").unwrap();
        std::fs::write(
            dir.path().join("d.toml"),
            "cgroup = \"/d\"\nlogs = [\"/l\"]\nmin_cpu = 4\nmax_cpu = 2",
        )
        .unwrap();
        std::fs::write(dir.path().join("e.toml"), "cgroup = \"/e\"\nlogs = []").unwrap();
        std::fs::write(
            dir.path().join("f.toml"),
            "cgroup = \"/f/../../etc\"\nlogs = [\"/l\"]",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("g.toml"),
            "cgroup = \"/g\"\nlogs = [\"/l\"]\n[custom]\nregex = \"(?P<loss>\"",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("h.toml"),
            "cgroup = \"/h\"\nlogs = [\"rel/log.csv\"]",
        )
        .unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let (jobs, errors) = load_jobs_dir(dir.path());
        assert_eq!(jobs.len(), 1);
        let a = jobs.values().next().unwrap();
        assert_eq!(a.name.as_deref(), Some("a"));
        assert_eq!(a.max_cpu, Some(2.0));
        let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 7, "{messages:#?}");
        assert!(
            messages
                .iter()
                .any(|m| m.contains("b.toml") && m.contains("starting with '/'"))
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("d.toml") && m.contains("above max_cpu"))
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("e.toml") && m.contains("logs is empty"))
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("f.toml") && m.contains("'..'"))
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("g.toml") && m.contains("custom.regex"))
        );
        assert!(
            messages
                .iter()
                .any(|m| m.contains("h.toml") && m.contains("must be absolute"))
        );
    }

    #[test]
    fn missing_jobs_dir_is_not_an_error() {
        let (jobs, errors) = load_jobs_dir(Path::new("/nonexistent/governor/jobs.d"));
        assert!(jobs.is_empty() && errors.is_empty());
    }
}
