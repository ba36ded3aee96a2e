//! The node daemon's local control socket: one JSON [`Request`] line in, one JSON [`Response`]
//! line out per connection (`governor status`, `governor run-job`).
//!
//! Only the wire types live here, so that they can be tested and fuzzed without the daemon
//! (`fuzz/fuzz_targets/control_request.rs`); the socket itself (binding, serving, the client)
//! is `governor::control`, which re-exports these types, and what `governor status` shows of a
//! [`NodeStatus`] is `governor::status`.

use serde::{Deserialize, Serialize};

use governor_policy::Category;
use governor_policy::quality::FinishRule;

/// A request to the daemon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// The node's status.
    Status,
    /// Re-read the configuration and the jobs directory (as SIGHUP does).
    Reload,
    /// Govern a job started by `governor run-job` in a cgroup it created.
    Adopt(AdoptJob),
    /// A job started by `governor run-job` has ended: restore and forget it.
    Release { cgroup: String },
    /// Put the calling process into the cgroup of job `name` under the governor's job subtree,
    /// which the daemon creates for the caller: `governor run-job` run by a user who is not
    /// root sends it from the job's own process, between fork and exec. The process moved is
    /// the one the kernel names as the caller (`SO_PEERCRED`), never one named in the request.
    JoinJob { name: String },
}

/// A job handed to the daemon by `governor run-job`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdoptJob {
    pub name: String,
    /// cgroup path relative to the cgroup root.
    pub cgroup: String,
    pub logs: Vec<String>,
    pub metric: Option<String>,
    pub format: Option<String>,
    pub pid: u32,
    /// Total epochs of the run (`run-job --epochs`).
    #[serde(default)]
    pub epochs: Option<f64>,
    /// End the job at convergence (`run-job --finish`).
    #[serde(default)]
    pub finish: Option<FinishRule>,
    /// A trial of a sweep, cut by successive halving (`run-job --sweep`).
    #[serde(default)]
    pub sweep: Option<governor_policy::sweep::SweepTrial>,
}

/// The daemon's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    Status(Box<NodeStatus>),
    Ok { message: String },
    Error { message: String },
}

impl Response {
    /// How an [`Response::Ok`] line starts (the tag comes first): a client that may not parse
    /// JSON (a process between fork and exec) tells a yes from these bytes.
    pub const OK_PREFIX: &'static str = r#"{"response":"ok""#;
}

/// The daemon's view of the node at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node name (host name unless configured).
    pub node: String,
    /// Active node policy.
    pub policy: String,
    /// Decisions are computed and logged but not written.
    pub dry_run: bool,
    /// Where CPU usage comes from: `ebpf`, `cpu.stat` or `cpuacct`.
    pub cpu_source: String,
    /// Why eBPF accounting is not in use, if it is not.
    pub cpu_source_note: Option<String>,
    /// cgroup hierarchy in use: `v2`, `v1` or `hybrid`.
    pub cgroup_mode: String,
    /// Cores and bytes the policy divides.
    pub cores: f64,
    pub memory_bytes: u64,
    /// Coordinator connection state, if one is configured.
    pub coordinator: Option<String>,
    /// Seconds since the daemon started.
    pub uptime_seconds: f64,
    pub jobs: Vec<JobStatus>,
    /// The node's GPUs (NVML), with the jobs on each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuStatus>,
}

/// One GPU as the daemon sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub utilization_percent: u32,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub power_watts: Option<f64>,
    /// Its power limit now.
    pub limit_watts: Option<f64>,
    /// The limit it had before the governor changed it (only while changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_limit_watts: Option<f64>,
    /// Energy since the daemon started (NVML's total-energy counter).
    pub energy_joules: Option<f64>,
    /// Governed jobs with a compute process on it.
    pub jobs: Vec<String>,
    /// Why it is not governed (MIG, no permission, not supported), if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One governed job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub name: String,
    /// cgroup path relative to the cgroup root.
    pub cgroup: String,
    /// `declared`, `environment` or `launched`.
    pub source: String,
    /// Runtime recognised from the cgroup path (docker-…, pod-…/containerd-…, unit name).
    pub runtime: String,
    pub category: Category,
    /// Name of the progress signal (the metric followed).
    pub signal: Option<String>,
    /// Latest finite value of the signal.
    pub signal_value: Option<f64>,
    /// Progress per minute, normalised by the signal's initial value (positive = improving).
    pub growth_per_minute: Option<f64>,
    /// Records received from the job's logs.
    pub records: u64,
    /// Log file currently followed.
    pub log_file: Option<String>,
    /// Last problem with the job's logs (parse errors, missing file), if any.
    pub log_problem: Option<String>,
    /// CPU cores used over the last sample interval.
    pub cpu_usage_cores: Option<f64>,
    /// Applied `cpu.weight` (None: untouched).
    pub cpu_weight: Option<u32>,
    /// Applied `cpu.max` in cores (None: no cap).
    pub cpu_max_cores: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub memory_high_bytes: Option<u64>,
    pub memory_max_bytes: Option<u64>,
    /// The policy's last decision for the job, and why.
    pub decision: String,
    /// Seconds since the job was adopted.
    pub age_seconds: f64,
    /// The policy asks for the job to be moved to another node (SpeCon), and why.
    #[serde(
        default,
        alias = "migration_request",
        skip_serializing_if = "Option::is_none"
    )]
    pub move_request: Option<String>,
    /// Time to quality so far: seconds from the job's adoption until its quality signal
    /// (validation loss, else the progress signal) first came within 5% of its reduction so far
    /// (`governor_policy::quality`); it only moves later as the job keeps improving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_quality_s: Option<f64>,
    /// A job the daemon is stopping as it asked: "stopped: converged (best loss X)" (finish at
    /// convergence) or "stopped: outranked in its sweep ..." (a trial cut by its sweep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// The sweep the job is a trial of (`run-job --sweep`), and the rung it waits at for the
    /// sweep's other trials if it does: `lr`, `lr (at its 5-epoch rung: waits for the other
    /// trials)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<String>,
    /// What time to quality is judged by: `validation loss` or the progress signal's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality_signal: Option<String>,
    /// GPUs it has compute processes on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// GPU memory its processes hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_bytes: Option<u64>,
    /// GPU energy attributed to it since the daemon found it on a GPU (a shared GPU's energy is
    /// split by the jobs' GPU memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_energy_joules: Option<f64>,
    /// Its share of its GPUs' utilisation (percent points) and power (split as its energy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_utilization_percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_power_watts: Option<f64>,
    /// Seconds since its latest log record arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_record_age_s: Option<f64>,
    /// Epochs done, as its log says (a cluster sweep's rungs are judged by them), and the
    /// epochs it declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs_done: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs_total: Option<f64>,
    /// Seconds between its last two epoch ends, as its records arrived (the first epoch, which
    /// holds the job's start, and a backlog read at once are not timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_seconds: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Serialize + serde::de::DeserializeOwned>(v: &T) -> T {
        serde_json::from_str(&serde_json::to_string(v).unwrap()).unwrap()
    }

    #[test]
    fn requests_are_one_tagged_json_object() {
        let adopt = Request::Adopt(AdoptJob {
            name: "train".into(),
            cgroup: "governor/train-1".into(),
            logs: vec!["/tmp/train.csv".into()],
            metric: Some("val_loss".into()),
            format: None,
            pid: 42,
            epochs: Some(10.0),
            finish: Some(FinishRule {
                patience: 3,
                min_delta: 0.01,
                predict: false,
            }),
            sweep: None,
        });
        let line = serde_json::to_string(&adopt).unwrap();
        assert!(
            line.starts_with(r#"{"request":"adopt","name":"train""#),
            "{line}"
        );
        assert_eq!(round_trip(&adopt), adopt);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"request":"status"}"#).unwrap(),
            Request::Status
        );
        // `epochs` and `finish` came later: older clients leave them out.
        let old = r#"{"request":"adopt","name":"n","cgroup":"c","logs":[],"metric":null,"format":null,"pid":1}"#;
        assert!(matches!(
            serde_json::from_str::<Request>(old).unwrap(),
            Request::Adopt(AdoptJob {
                epochs: None,
                finish: None,
                ..
            })
        ));
        assert!(serde_json::from_str::<Request>(r#"{"request":"rm -rf /"}"#).is_err());
        // What run-job's child sends between fork and exec (its bytes are made before the fork).
        let join = Request::JoinJob {
            name: "probe".into(),
        };
        assert_eq!(
            serde_json::to_string(&join).unwrap(),
            r#"{"request":"join_job","name":"probe"}"#
        );
        assert_eq!(round_trip(&join), join);
    }

    #[test]
    fn numbers_arrive_as_sent() {
        // Found by the `control_request` fuzz target: without serde_json's `float_roundtrip`
        // the value decoded right, but its encoding (`1.3333333333333333e+29`, what a client
        // sends) decoded one ulp low.
        let line = r#"{"request":"adopt","name":"x","cgroup":"c","logs":[],"metric":null,"format":null,"pid":0,"epochs":133333333333333333333333333333333.333333333333333e-3}"#;
        let Request::Adopt(job) = serde_json::from_str::<Request>(line).unwrap() else {
            panic!("not an adopt request");
        };
        let want: f64 = "133333333333333333333333333333333.333333333333333e-3"
            .parse()
            .unwrap();
        assert_eq!(job.epochs, Some(want));
        let again = Request::Adopt(job);
        assert_eq!(round_trip(&again), again);
    }

    #[test]
    fn responses_round_trip() {
        let status = Response::Status(Box::new(NodeStatus {
            node: "n1".into(),
            jobs: vec![JobStatus {
                name: "j".into(),
                time_to_quality_s: Some(12.5),
                ..Default::default()
            }],
            ..Default::default()
        }));
        assert_eq!(round_trip(&status), status);
        let err = Response::Error {
            message: "no".into(),
        };
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"response":"error","message":"no"}"#
        );
        // run-job's child tells a yes from these first bytes alone (no parsing before exec).
        let ok = serde_json::to_string(&Response::Ok {
            message: "joined".into(),
        })
        .unwrap();
        assert!(ok.starts_with(Response::OK_PREFIX), "{ok}");
        assert!(
            !serde_json::to_string(&err)
                .unwrap()
                .starts_with(Response::OK_PREFIX)
        );
    }
}
