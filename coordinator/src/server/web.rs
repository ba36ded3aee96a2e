//! The coordinator's read-only web endpoint (`[web] listen`, off unless set): `/metrics` for
//! Prometheus, the live cluster page at `/` and its data at `/api/cluster` (JSON).
//!
//! Everything is rendered from one [`Snapshot`] the actor takes between two messages, so a page
//! and a scrape see one consistent cluster. Cardinality is bounded: per-job series exist for
//! the jobs the coordinator lists (unfinished ones, and finished ones for
//! `finished_retention_s`); `state`, `kind` and `result` take a handful of fixed values.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;

use governor_proto::control::{JobSummary, NodeSummary};
use governor_proto::http::{self, HttpTls, Reply};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use serde::{Deserialize, Serialize};

use super::actor::Coordinator;
use crate::state::Counters;

/// `[web]` of the coordinator's configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// Serve `/metrics`, the cluster page and its JSON here (e.g. `127.0.0.1:9465`); off unless
    /// set. The page has no login: bind it to localhost or a management network, like the
    /// daemon's `/metrics`.
    pub listen: Option<SocketAddr>,
    /// HTTPS with this PEM certificate chain and key instead of plain HTTP.
    pub tls: Option<HttpTls>,
}

/// Placement latencies as a Prometheus histogram (clones share their values).
#[derive(Clone, Debug)]
pub struct PlacementHistogram(Histogram);

impl Default for PlacementHistogram {
    fn default() -> Self {
        // 10 µs .. ~2.6 s: a placement on a few nodes takes microseconds, on 10,000 ~1 ms.
        PlacementHistogram(Histogram::new(exponential_buckets(1e-5, 4.0, 10)))
    }
}

impl PlacementHistogram {
    pub fn observe(&self, seconds: f64) {
        self.0.observe(seconds);
    }
}

/// Points kept per job for the page's sparklines.
const HISTORY_POINTS: usize = 300;

/// Seconds between two points (10 minutes of history).
const HISTORY_EVERY_S: f64 = 2.0;

/// One sample of a job: (unix seconds, progress value, cores in use).
pub type Point = (f64, Option<f64>, f64);

/// Recent progress and CPU of each listed job (kept in memory only: a restart starts over).
#[derive(Clone, Debug, Default, Serialize)]
pub struct History {
    jobs: BTreeMap<String, VecDeque<Point>>,
    #[serde(skip)]
    last_at: f64,
}

impl History {
    /// Whether [`HISTORY_EVERY_S`] passed since the last sample (checked before the jobs are
    /// listed for [`Self::sample`]).
    pub fn due(&self, now: f64) -> bool {
        now - self.last_at >= HISTORY_EVERY_S
    }

    /// Sample `jobs` (the unfinished ones, as `list_jobs(false)` gives them); a job no longer
    /// among them (finished, or gone) loses its history.
    pub fn sample(&mut self, now: f64, jobs: &[JobSummary]) {
        self.last_at = now;
        for j in jobs {
            if j.status.is_finished() {
                continue;
            }
            let points = self.jobs.entry(j.id.clone()).or_default();
            if points.len() == HISTORY_POINTS {
                points.pop_front();
            }
            points.push_back((now, j.progress.filter(|v| v.is_finite()), j.cpu_cores));
        }
        let listed: std::collections::HashSet<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        self.jobs.retain(|id, _| listed.contains(id.as_str()));
    }
}

/// What one page load or scrape shows.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub at_unix: f64,
    pub policy: String,
    pub nodes: Vec<NodeSummary>,
    /// Every job the coordinator lists (finished ones within the retention).
    pub jobs: Vec<JobSummary>,
    pub counters: Counters,
    /// Moves that ended, by (kind, result).
    pub moves: Vec<(&'static str, &'static str, u64)>,
    pub placement: PlacementHistogram,
    pub history: History,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MoveLabels {
    kind: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    /// Not `job`: Prometheus sets `job` to the scrape job's name on every series.
    job_id: String,
    job_name: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CategoryLabels {
    job_id: String,
    job_name: String,
    node: String,
    category: String,
}

type F = Family<JobLabels, Gauge<f64, AtomicU64>>;

/// Render `snap` as `/metrics` text (prefix `governor_cluster_`).
pub fn render_metrics(snap: &Snapshot) -> String {
    let mut registry = Registry::with_prefix("governor_cluster");
    let nodes = Family::<StateLabels, Gauge>::default();
    registry.register(
        "nodes",
        "Nodes known to the coordinator, by state",
        nodes.clone(),
    );
    for state in ["ready", "resyncing", "lost"] {
        let n = snap
            .nodes
            .iter()
            .filter(|n| n.status.to_string() == state)
            .count();
        nodes
            .get_or_create(&StateLabels {
                state: state.into(),
            })
            .set(n as i64);
    }
    let jobs = Family::<StateLabels, Gauge>::default();
    registry.register("jobs", "Jobs the coordinator lists, by state", jobs.clone());
    let mut by_state: BTreeMap<String, i64> = BTreeMap::new();
    for j in &snap.jobs {
        *by_state.entry(j.status.to_string()).or_default() += 1;
    }
    for (state, n) in by_state {
        jobs.get_or_create(&StateLabels { state }).set(n);
    }
    let queue = Gauge::<i64>::default();
    registry.register("queue_length", "Jobs waiting to be placed", queue.clone());
    queue.set(snap.counters.queued_jobs as i64);
    let reports = Counter::<u64>::default();
    registry.register("node_reports", "Node reports received", reports.clone());
    reports.inc_by(snap.counters.reports);
    let placements = Counter::<u64>::default();
    registry.register("placements", "Job members placed", placements.clone());
    placements.inc_by(snap.counters.placements);
    registry.register_with_unit(
        "placement_duration",
        "Wall time of the admission rounds that placed jobs",
        Unit::Seconds,
        snap.placement.0.clone(),
    );
    let moves = Family::<MoveLabels, Counter>::default();
    registry.register(
        "moves",
        "Moves of running jobs that ended, by kind (move, preemption, resize) and result",
        moves.clone(),
    );
    for (kind, result, n) in &snap.moves {
        moves
            .get_or_create(&MoveLabels {
                kind: (*kind).into(),
                result: (*result).into(),
            })
            .inc_by(*n);
    }
    let cpu = F::default();
    let progress = F::default();
    let ttq = F::default();
    let energy = Family::<JobLabels, Counter<f64, AtomicU64>>::default();
    let category = Family::<CategoryLabels, Gauge>::default();
    registry.register_with_unit(
        "job_cpu_usage",
        "CPU the job's members use, from their nodes' reports",
        Unit::Other("cores".into()),
        cpu.clone(),
    );
    registry.register(
        "job_progress_value",
        "Latest value of the job's progress signal",
        progress.clone(),
    );
    registry.register_with_unit(
        "job_time_to_quality",
        "Time to quality from submission (reached)",
        Unit::Seconds,
        ttq.clone(),
    );
    registry.register_with_unit(
        "job_gpu_energy",
        "GPU energy of the job's members (their nodes' NVML counters)",
        Unit::Joules,
        energy.clone(),
    );
    registry.register(
        "job_category",
        "The job's learning stage (1 for the current one)",
        category.clone(),
    );
    for j in snap.jobs.iter().filter(|j| !j.status.is_finished()) {
        let l = JobLabels {
            job_id: j.id.clone(),
            job_name: j.name.clone(),
            node: j
                .members
                .first()
                .map(|m| m.node.clone())
                .unwrap_or_default(),
        };
        cpu.get_or_create(&l).set(j.cpu_cores);
        if let Some(v) = j.progress.filter(|v| v.is_finite()) {
            progress.get_or_create(&l).set(v);
        }
        if let Some(v) = j.time_to_quality_s {
            ttq.get_or_create(&l).set(v);
        }
        if let Some(v) = j.gpu_energy_joules.filter(|v| v.is_finite() && *v >= 0.0) {
            energy.get_or_create(&l).inc_by(v);
        }
        category
            .get_or_create(&CategoryLabels {
                job_id: l.job_id,
                job_name: l.job_name,
                node: l.node,
                category: j.category.to_string(),
            })
            .set(1);
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Every family the coordinator's `/metrics` can show (see the daemon's
/// `governor::metrics::every_family`): one job of each kind of value, one move, one placement.
pub fn every_family() -> String {
    let mut job: JobSummary = serde_json::from_value(serde_json::json!({
        "id": "j1", "name": "a", "status": "running", "priority": 0, "gpus": 0, "replicas": 1,
        "members": [], "category": "progressing", "progress": 1.0, "cpu_cores": 1.0,
        "cpu_limit_cores": null, "memory_bytes": 0, "submitted_at_unix": 0.0,
        "started_at_unix": null, "finished_at_unix": null, "message": "", "local": false,
        "move_request": null
    }))
    .expect("a job summary");
    job.time_to_quality_s = Some(1.0);
    job.gpu_energy_joules = Some(1.0);
    let snap = Snapshot {
        at_unix: 0.0,
        policy: String::new(),
        nodes: Vec::new(),
        jobs: vec![job],
        counters: Counters {
            nodes: 0,
            ready_nodes: 0,
            jobs: 1,
            queued_jobs: 0,
            reports: 1,
            placements: 1,
            policy: String::new(),
        },
        moves: vec![("move", "done", 1)],
        placement: PlacementHistogram::default(),
        history: History::default(),
    };
    render_metrics(&snap)
}

/// The page's data: the snapshot as JSON.
pub fn render_json(snap: &Snapshot) -> String {
    let moves: Vec<serde_json::Value> = snap
        .moves
        .iter()
        .map(|(k, r, n)| serde_json::json!({"kind": k, "result": r, "count": n}))
        .collect();
    serde_json::json!({
        "at_unix": snap.at_unix,
        "policy": snap.policy,
        "nodes": snap.nodes,
        "jobs": snap.jobs,
        "queued": snap.counters.queued_jobs,
        "placements": snap.counters.placements,
        "moves": moves,
        "history": snap.history.jobs,
    })
    .to_string()
}

/// The page itself: static HTML that fetches `/api/cluster` every 2 s and draws it.
const PAGE: &str = include_str!("page.html");

/// Serve the endpoint on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    coordinator: Coordinator,
) {
    http::serve(
        listener,
        tls,
        "the cluster page and /metrics",
        move |path: String| {
            let coordinator = coordinator.clone();
            async move {
                if path == "/" || path == "/index.html" {
                    return Reply::ok("text/html; charset=utf-8", PAGE);
                }
                if path != "/metrics" && path != "/api/cluster" {
                    return Reply::not_found("served here: /, /api/cluster, /metrics");
                }
                let Ok(snap) = coordinator.web_snapshot().await else {
                    return Reply::unavailable("the coordinator is stopping");
                };
                if path == "/metrics" {
                    Reply::ok(http::OPENMETRICS, render_metrics(&snap))
                } else {
                    Reply::ok("application/json", render_json(&snap))
                }
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_name_every_state_and_end_with_eof() {
        let snap = Snapshot {
            at_unix: 0.0,
            policy: "soonest".into(),
            nodes: Vec::new(),
            jobs: Vec::new(),
            counters: Counters {
                nodes: 0,
                ready_nodes: 0,
                jobs: 0,
                queued_jobs: 2,
                reports: 5,
                placements: 1,
                policy: "soonest".into(),
            },
            moves: vec![("move", "done", 3)],
            placement: PlacementHistogram::default(),
            history: History::default(),
        };
        snap.placement.observe(0.001);
        let text = render_metrics(&snap);
        for line in [
            "governor_cluster_nodes{state=\"ready\"} 0",
            "governor_cluster_nodes{state=\"lost\"} 0",
            "governor_cluster_queue_length 2",
            "governor_cluster_node_reports_total 5",
            "governor_cluster_placement_duration_seconds_count 1",
            "governor_cluster_moves_total{kind=\"move\",result=\"done\"} 3",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        let json: serde_json::Value = serde_json::from_str(&render_json(&snap)).unwrap();
        assert_eq!(json["queued"], 2);
        let all = every_family();
        for family in [
            "governor_cluster_job_gpu_energy_joules",
            "governor_cluster_moves",
        ] {
            assert!(all.contains(&format!("# TYPE {family} ")), "{all}");
        }
    }
}
