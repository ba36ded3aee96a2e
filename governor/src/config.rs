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
    /// Node policy: `learning-first` (the default), `fair`, `flowcon`, `specon` or
    /// `shortest-left` (`governor`, its old name, is still accepted), with parameters as
    /// `NAME:KEY=VALUE[:KEY=VALUE]`.
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
            policy: governor_policy::DEFAULT_POLICY.into(),
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
    /// `host:port` of the coordinator; a replicated one's replicas, separated by commas (the
    /// node finds the leader among them).
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
    /// Run the coordinator's jobs that ask to run as root (uid 0; a submission naming no
    /// user). Off: such a job fails to start here, with the reason. Every other job runs with
    /// its user's uid, gid and groups on this node.
    pub allow_root_jobs: bool,
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
            allow_root_jobs: false,
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
    /// Opt-in: the job is a trial of a sweep, `"NAME[:ETA:FIRST_RUNG[:seen]]"` (see `governor run-job
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

/// A job file's `sweep = "NAME[:ETA:FIRST_RUNG[:seen]]"`.
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
pub const EXAMPLE_CONFIG: &str = include_str!("governor.example.toml");

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
