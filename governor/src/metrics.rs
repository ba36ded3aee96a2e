//! `/metrics`: the daemon's view in the Prometheus text format (OpenMetrics, through
//! `prometheus-client`), served on `[metrics] listen` (off unless configured).
//!
//! Each scrape renders a snapshot of `governor status` into a fresh registry, so a job that
//! ends leaves the metrics with its last scrape: the series are bounded by the jobs and GPUs
//! the node has now (labels `node`, `job_name`, `cgroup`; `category` takes four values; `gpu` and
//! `uuid` one per device). Names follow the ecosystem's rules: one prefix (`governor_`), base
//! units (seconds, bytes, joules, watts, ratios), `_total` for counters.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use prometheus_client::metrics::histogram::Histogram;

use crate::cgroup::{ApplyOutcome, CgroupError};
use crate::control::PendingRequest;
use crate::status::NodeStatus;
use governor_proto::control_socket::{Request, Response};
use governor_proto::http::{self, Reply};
use tokio::sync::{mpsc, oneshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FileLabels {
    file: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FormatLabels {
    format: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// The daemon's own counters, kept for its life (the job gauges are rendered from each
/// snapshot instead). Label values are bounded: `file` by the cgroup files the actuator
/// writes (six), `format` by the log formats the parsers know, `kind` by the problem kinds
/// below. Clones share their values.
#[derive(Clone, Debug)]
pub struct DaemonMetrics {
    decisions: Counter,
    decision_seconds: Histogram,
    writes: Family<FileLabels, Counter>,
    write_errors: Counter,
    drift: Family<FileLabels, Counter>,
    records: Family<FormatLabels, Counter>,
    problems: Family<KindLabels, Counter>,
}

impl Default for DaemonMetrics {
    fn default() -> Self {
        DaemonMetrics {
            decisions: Counter::default(),
            // 10 µs .. ~1.3 s: a decision on a few jobs takes tens of microseconds, on 1,000
            // jobs ~2 ms; in the TCG test VM ~5 ms.
            decision_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(1e-5, 4.0, 9),
            ),
            writes: Family::default(),
            write_errors: Counter::default(),
            drift: Family::default(),
            records: Family::default(),
            problems: Family::default(),
        }
    }
}

impl DaemonMetrics {
    /// A decision round ran and took `took`.
    pub fn decided(&self, took: std::time::Duration) {
        self.decisions.inc();
        self.decision_seconds.observe(took.as_secs_f64());
    }

    /// What one actuator call wrote, found changed behind its back, or failed at.
    pub fn applied(&self, result: &Result<ApplyOutcome, CgroupError>) {
        match result {
            Ok(outcome) => {
                for w in &outcome.written {
                    self.writes
                        .get_or_create(&FileLabels {
                            file: w.knob.file_name().to_owned(),
                        })
                        .inc();
                }
                for d in &outcome.drift {
                    self.drift
                        .get_or_create(&FileLabels {
                            file: d.knob.file_name().to_owned(),
                        })
                        .inc();
                }
                if !outcome.errors.is_empty() {
                    self.write_errors.inc_by(outcome.errors.len() as u64);
                    self.problem("cgroup");
                }
            }
            Err(_) => {
                self.write_errors.inc();
                self.problem("cgroup");
            }
        }
    }

    /// A log record of `format` was parsed.
    pub fn log_record(&self, format: &str) {
        self.records
            .get_or_create(&FormatLabels {
                format: format.to_owned(),
            })
            .inc();
    }

    /// A problem was reported: `log` (a job's log unreadable or unparsable) or `cgroup` (a
    /// write failed).
    pub fn problem(&self, kind: &'static str) {
        self.problems
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "decisions",
            "Decision rounds of the node policy",
            self.decisions.clone(),
        );
        registry.register_with_unit(
            "decision_duration",
            "Time a decision round took (the policy's plan and the cgroup writes)",
            Unit::Seconds,
            self.decision_seconds.clone(),
        );
        registry.register(
            "cgroup_writes",
            "Writes to cgroup files, by file",
            self.writes.clone(),
        );
        registry.register(
            "cgroup_write_errors",
            "Writes to cgroup files that failed",
            self.write_errors.clone(),
        );
        registry.register(
            "drift_events",
            "Governed cgroup files found changed by someone else, by file",
            self.drift.clone(),
        );
        registry.register(
            "log_records",
            "Training-log records parsed, by log format",
            self.records.clone(),
        );
        registry.register(
            "problems",
            "Problems reported, by kind",
            self.problems.clone(),
        );
    }
}

/// A job's labels: `pod_uid` only where the job is a Kubernetes pod's (its cgroup path says
/// so; the namespace is not in the cgroup, and the daemon asks no API server).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct JobLabels {
    node: String,
    /// Not `job`: Prometheus sets `job` to the scrape job's name on every series (ours would
    /// become `exported_job`).
    job_name: String,
    cgroup: String,
    pod_uid: Option<String>,
}

impl JobLabels {
    fn pairs(&self) -> Vec<(&str, &str)> {
        let mut pairs = vec![
            ("node", self.node.as_str()),
            ("job_name", self.job_name.as_str()),
            ("cgroup", self.cgroup.as_str()),
        ];
        if let Some(pod) = &self.pod_uid {
            pairs.push(("pod_uid", pod.as_str()));
        }
        pairs
    }
}

impl EncodeLabelSet for JobLabels {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        self.pairs().as_slice().encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct CategoryLabels {
    job: JobLabels,
    category: String,
}

impl EncodeLabelSet for CategoryLabels {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let mut pairs = self.job.pairs();
        pairs.push(("category", self.category.as_str()));
        pairs.as_slice().encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    gpu: String,
    uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

type G = Family<JobLabels, Gauge<f64, AtomicU64>>;
type GpuG = Family<GpuLabels, Gauge<f64, AtomicU64>>;

/// Render `status` as the text `/metrics` serves.
pub fn render(status: &NodeStatus, counters: &DaemonMetrics) -> String {
    let mut registry = Registry::with_prefix("governor");
    counters.register(&mut registry);
    let jobs = Family::<NodeLabels, Gauge<i64>>::default();
    registry.register("jobs", "Governed jobs on the node", jobs.clone());
    jobs.get_or_create(&NodeLabels {
        node: status.node.clone(),
    })
    .set(status.jobs.len() as i64);

    let cpu = G::default();
    let weight = G::default();
    let cap = G::default();
    let memory = G::default();
    let high = G::default();
    let max = G::default();
    let progress = G::default();
    let ttq = G::default();
    let category = Family::<CategoryLabels, Gauge<i64>>::default();
    let job_energy = Family::<JobLabels, Counter<f64, AtomicU64>>::default();
    registry.register_with_unit(
        "job_cpu_usage",
        "CPU in use over the last sample interval",
        Unit::Other("cores".into()),
        cpu.clone(),
    );
    registry.register(
        "job_cpu_weight",
        "Applied cpu.weight (v1: from cpu.shares)",
        weight.clone(),
    );
    registry.register_with_unit(
        "job_cpu_max",
        "Applied cpu.max cap",
        Unit::Other("cores".into()),
        cap.clone(),
    );
    registry.register_with_unit("job_memory", "Memory in use", Unit::Bytes, memory.clone());
    registry.register_with_unit(
        "job_memory_high",
        "Applied memory.high",
        Unit::Bytes,
        high.clone(),
    );
    registry.register_with_unit(
        "job_memory_max",
        "Applied memory.max",
        Unit::Bytes,
        max.clone(),
    );
    registry.register(
        "job_progress_value",
        "Latest value of the job's progress signal (its loss, accuracy...)",
        progress.clone(),
    );
    registry.register(
        "job_category",
        "The job's learning stage (1 for the current one)",
        category.clone(),
    );
    registry.register_with_unit(
        "job_time_to_quality",
        "Time to quality, from adoption (reached)",
        Unit::Seconds,
        ttq.clone(),
    );
    registry.register_with_unit(
        "job_gpu_energy",
        "GPU energy attributed to the job since the daemon found it on a GPU",
        Unit::Joules,
        job_energy.clone(),
    );
    for j in &status.jobs {
        let l = JobLabels {
            node: status.node.clone(),
            job_name: j.name.clone(),
            cgroup: j.cgroup.clone(),
            pod_uid: crate::discovery::names::identify(&j.cgroup).pod_uid,
        };
        if let Some(v) = j.cpu_usage_cores {
            cpu.get_or_create(&l).set(v);
        }
        if let Some(v) = j.cpu_weight {
            weight.get_or_create(&l).set(f64::from(v));
        }
        if let Some(v) = j.cpu_max_cores {
            cap.get_or_create(&l).set(v);
        }
        if let Some(v) = j.memory_bytes {
            memory.get_or_create(&l).set(v as f64);
        }
        if let Some(v) = j.memory_high_bytes {
            high.get_or_create(&l).set(v as f64);
        }
        if let Some(v) = j.memory_max_bytes {
            max.get_or_create(&l).set(v as f64);
        }
        if let Some(v) = j.signal_value.filter(|v| v.is_finite()) {
            progress.get_or_create(&l).set(v);
        }
        if let Some(v) = j.time_to_quality_s {
            ttq.get_or_create(&l).set(v);
        }
        if let Some(v) = j.gpu_energy_joules.filter(|v| v.is_finite() && *v >= 0.0) {
            job_energy.get_or_create(&l).inc_by(v);
        }
        category
            .get_or_create(&CategoryLabels {
                job: l,
                category: j.category.to_string(),
            })
            .set(1);
    }

    let power = GpuG::default();
    let limit = GpuG::default();
    let util = GpuG::default();
    let gpu_memory = GpuG::default();
    let gpu_energy = Family::<GpuLabels, Counter<f64, AtomicU64>>::default();
    registry.register_with_unit(
        "gpu_power",
        "GPU power draw",
        Unit::Other("watts".into()),
        power.clone(),
    );
    registry.register_with_unit(
        "gpu_power_limit",
        "GPU power limit in force",
        Unit::Other("watts".into()),
        limit.clone(),
    );
    registry.register_with_unit(
        "gpu_utilization",
        "Share of the last sample period a kernel ran",
        Unit::Other("ratio".into()),
        util.clone(),
    );
    registry.register_with_unit(
        "gpu_memory_used",
        "GPU memory in use",
        Unit::Bytes,
        gpu_memory.clone(),
    );
    registry.register_with_unit(
        "gpu_energy",
        "GPU energy since the daemon started (NVML's counter)",
        Unit::Joules,
        gpu_energy.clone(),
    );
    for g in &status.gpus {
        let l = GpuLabels {
            node: status.node.clone(),
            gpu: g.index.to_string(),
            uuid: g.uuid.clone(),
        };
        if let Some(w) = g.power_watts {
            power.get_or_create(&l).set(w);
        }
        if let Some(w) = g.limit_watts {
            limit.get_or_create(&l).set(w);
        }
        util.get_or_create(&l)
            .set(f64::from(g.utilization_percent) / 100.0);
        gpu_memory.get_or_create(&l).set(g.memory_used_bytes as f64);
        if let Some(e) = g.energy_joules.filter(|e| e.is_finite() && *e >= 0.0) {
            gpu_energy.get_or_create(&l).inc_by(e);
        }
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Every family `/metrics` can show: rendered from a status with every field set and every
/// counter moved once (families without a sample are not written, so a scrape of a node with
/// no GPU shows no GPU family). The dashboard's test checks its queries against this.
pub fn every_family() -> String {
    use crate::cgroup::{DriftAction, DriftEvent, Knob, WriteReason, WriteRecord};
    let job = crate::status::JobStatus {
        name: "a".into(),
        cgroup: "/a".into(),
        cpu_usage_cores: Some(1.0),
        cpu_weight: Some(100),
        cpu_max_cores: Some(1.0),
        memory_bytes: Some(1),
        memory_high_bytes: Some(1),
        memory_max_bytes: Some(1),
        signal_value: Some(1.0),
        time_to_quality_s: Some(1.0),
        gpu_energy_joules: Some(1.0),
        ..Default::default()
    };
    let gpu = governor_proto::control_socket::GpuStatus {
        power_watts: Some(1.0),
        limit_watts: Some(1.0),
        energy_joules: Some(1.0),
        ..Default::default()
    };
    let status = NodeStatus {
        jobs: vec![job],
        gpus: vec![gpu],
        ..Default::default()
    };
    let counters = DaemonMetrics::default();
    counters.decided(std::time::Duration::from_micros(1));
    counters.log_record("any");
    counters.problem("log");
    counters.applied(&Ok(ApplyOutcome {
        written: vec![WriteRecord {
            knob: Knob::CpuWeight,
            value: "100".into(),
            reason: WriteReason::Apply,
        }],
        drift: vec![DriftEvent {
            knob: Knob::CpuWeight,
            ours: "1".into(),
            theirs: "2".into(),
            action: DriftAction::GaveUp,
        }],
        ..Default::default()
    }));
    counters.applied(&Err(CgroupError::NoHierarchy {
        root: std::path::PathBuf::from("/x"),
        reason: String::new(),
    }));
    render(&status, &counters)
}

/// Serve `GET /metrics` on `listener` (plain or TLS): each scrape asks the control loop for a
/// status snapshot, like `governor status`, and renders it with the daemon's counters.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    requests: mpsc::Sender<PendingRequest>,
    counters: DaemonMetrics,
) {
    http::serve(listener, tls, "/metrics", move |path: String| {
        let requests = requests.clone();
        let counters = counters.clone();
        async move {
            if path != "/metrics" {
                return Reply::not_found("only GET /metrics is served here");
            }
            let (reply, answer) = oneshot::channel();
            let asked = requests
                .send(PendingRequest {
                    request: Request::Status,
                    peer: None,
                    reply,
                })
                .await;
            match (asked, answer.await) {
                (Ok(()), Ok(Response::Status(s))) => {
                    Reply::ok(http::OPENMETRICS, render(&s, &counters))
                }
                _ => Reply::unavailable("the daemon is stopping"),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Category;
    use crate::status::JobStatus;

    #[test]
    fn jobs_and_gpus_render_with_base_units_and_bounded_labels() {
        let s = NodeStatus {
            node: "n1".into(),
            jobs: vec![JobStatus {
                name: "a".into(),
                cgroup: "/governor.slice/jobs/a".into(),
                category: Category::Converged,
                cpu_usage_cores: Some(1.5),
                cpu_weight: Some(400),
                memory_bytes: Some(1 << 20),
                signal_value: Some(0.25),
                time_to_quality_s: Some(42.0),
                gpu_energy_joules: Some(1500.0),
                ..Default::default()
            }],
            gpus: vec![governor_proto::control_socket::GpuStatus {
                index: 0,
                uuid: "GPU-1".into(),
                power_watts: Some(420.0),
                limit_watts: Some(420.0),
                utilization_percent: 95,
                energy_joules: Some(2000.0),
                ..Default::default()
            }],
            ..Default::default()
        };
        let counters = DaemonMetrics::default();
        counters.decided(std::time::Duration::from_micros(50));
        counters.log_record("keras-csv");
        counters.problem("log");
        let text = render(&s, &counters);
        for line in [
            "governor_jobs{node=\"n1\"} 1",
            "governor_job_cpu_usage_cores{node=\"n1\",job_name=\"a\",cgroup=\"/governor.slice/jobs/a\"} 1.5",
            "governor_job_cpu_weight{node=\"n1\",job_name=\"a\",cgroup=\"/governor.slice/jobs/a\"} 400.0",
            "governor_job_category{node=\"n1\",job_name=\"a\",cgroup=\"/governor.slice/jobs/a\",category=\"converged\"} 1",
            "governor_job_time_to_quality_seconds{node=\"n1\",job_name=\"a\",cgroup=\"/governor.slice/jobs/a\"} 42.0",
            "governor_job_gpu_energy_joules_total{node=\"n1\",job_name=\"a\",cgroup=\"/governor.slice/jobs/a\"} 1500.0",
            "governor_gpu_power_limit_watts{node=\"n1\",gpu=\"0\",uuid=\"GPU-1\"} 420.0",
            "governor_gpu_utilization_ratio{node=\"n1\",gpu=\"0\",uuid=\"GPU-1\"} 0.95",
            "governor_gpu_energy_joules_total{node=\"n1\",gpu=\"0\",uuid=\"GPU-1\"} 2000.0",
            "governor_decisions_total 1",
            "governor_decision_duration_seconds_count 1",
            "governor_log_records_total{format=\"keras-csv\"} 1",
            "governor_problems_total{kind=\"log\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(!text.contains("pod_uid"), "no pod, no pod label: {text}");
    }

    #[test]
    fn a_kubernetes_pods_job_carries_its_pod_uid() {
        let cgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234abcd_5678_90ef_aaaa_bbbbccccdddd.slice/cri-containerd-0123456789abcdef.scope";
        let s = NodeStatus {
            node: "n1".into(),
            jobs: vec![JobStatus {
                name: "bert".into(),
                cgroup: cgroup.into(),
                category: Category::Progressing,
                cpu_usage_cores: Some(2.0),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = render(&s, &DaemonMetrics::default());
        let line = format!(
            "governor_job_cpu_usage_cores{{node=\"n1\",job_name=\"bert\",cgroup=\"{cgroup}\",pod_uid=\"1234abcd-5678-90ef-aaaa-bbbbccccdddd\"}} 2.0"
        );
        assert!(text.contains(&line), "{line} missing in:\n{text}");
        assert!(
            text.contains(
                "pod_uid=\"1234abcd-5678-90ef-aaaa-bbbbccccdddd\",category=\"progressing\"} 1"
            ),
            "{text}"
        );
    }
}
