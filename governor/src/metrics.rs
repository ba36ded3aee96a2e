//! `/metrics`: the daemon's view in the Prometheus text format (OpenMetrics, through
//! `prometheus-client`), served on `[metrics] listen` (off unless configured).
//!
//! Each scrape renders a snapshot of `governor status` into a fresh registry, so a job that
//! ends leaves the metrics with its last scrape: the series are bounded by the jobs and GPUs
//! the node has now (labels `node`, `job`, `cgroup`; `category` takes four values; `gpu` and
//! `uuid` one per device). Names follow the ecosystem's rules: one prefix (`governor_`), base
//! units (seconds, bytes, joules, watts, ratios), `_total` for counters.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::control::PendingRequest;
use crate::status::NodeStatus;
use governor_proto::control_socket::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    node: String,
    job: String,
    cgroup: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabels {
    node: String,
    job: String,
    cgroup: String,
    category: String,
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
pub fn render(status: &NodeStatus) -> String {
    let mut registry = Registry::with_prefix("governor");
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
            job: j.name.clone(),
            cgroup: j.cgroup.clone(),
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
                node: l.node,
                job: l.job,
                cgroup: l.cgroup,
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

/// Serve `GET /metrics` on `listener` (HTTP/1.1, one request per connection): each scrape asks
/// the control loop for a status snapshot, like `governor status`, and renders it.
pub async fn serve(listener: tokio::net::TcpListener, requests: mpsc::Sender<PendingRequest>) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics");
    }
    loop {
        let (mut conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let requests = requests.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut got = 0;
            // The request head only (scrapes send no body); bounded in size and time.
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while got < buf.len() {
                    let n = conn.read(&mut buf[got..]).await?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                    if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..got]);
            let path = head.split_whitespace().nth(1).unwrap_or_default();
            let (status, body, kind) = if head.starts_with("GET ")
                && (path == "/metrics" || path.starts_with("/metrics?"))
            {
                let (reply, answer) = oneshot::channel();
                let asked = requests
                    .send(PendingRequest {
                        request: Request::Status,
                        peer: None,
                        reply,
                    })
                    .await;
                match (asked, answer.await) {
                    (Ok(()), Ok(Response::Status(s))) => (
                        "200 OK",
                        render(&s),
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                    _ => (
                        "503 Service Unavailable",
                        "the daemon is stopping\n".to_owned(),
                        "text/plain",
                    ),
                }
            } else {
                (
                    "404 Not Found",
                    "only GET /metrics is served here\n".to_owned(),
                    "text/plain",
                )
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = conn.write_all(response.as_bytes()).await {
                tracing::debug!(%peer, error = %e, "metrics: the scraper went away");
            }
        });
    }
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
        let text = render(&s);
        for line in [
            "governor_jobs{node=\"n1\"} 1",
            "governor_job_cpu_usage_cores{node=\"n1\",job=\"a\",cgroup=\"/governor.slice/jobs/a\"} 1.5",
            "governor_job_cpu_weight{node=\"n1\",job=\"a\",cgroup=\"/governor.slice/jobs/a\"} 400.0",
            "governor_job_category{node=\"n1\",job=\"a\",cgroup=\"/governor.slice/jobs/a\",category=\"converged\"} 1",
            "governor_job_time_to_quality_seconds{node=\"n1\",job=\"a\",cgroup=\"/governor.slice/jobs/a\"} 42.0",
            "governor_job_gpu_energy_joules_total{node=\"n1\",job=\"a\",cgroup=\"/governor.slice/jobs/a\"} 1500.0",
            "governor_gpu_power_limit_watts{node=\"n1\",gpu=\"0\",uuid=\"GPU-1\"} 420.0",
            "governor_gpu_utilization_ratio{node=\"n1\",gpu=\"0\",uuid=\"GPU-1\"} 0.95",
            "governor_gpu_energy_joules_total{node=\"n1\",gpu=\"0\",uuid=\"GPU-1\"} 2000.0",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
