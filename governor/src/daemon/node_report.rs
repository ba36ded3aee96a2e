//! What the node tells the coordinator: its capacity at registration, and every sample round
//! a [`NodeReport`] built from the daemon's status and the launcher's jobs.
//!
//! [`node_report`] is pure (the daemon's [`NodeStatus`] in, the wire report out) and makes
//! every value valid for the protocol (finite, non-negative, bounded text), so one odd value can
//! never get the node's whole report refused.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use governor_proto::node::{MAX_MESSAGE_LEN, MAX_NAME_LEN};

use super::launcher::CoordinatorJob;
use crate::coordinator_client::{
    AgentStatus, GpuDevice, GpuUsage as WireGpuUsage, JobOrigin, JobReport, NodeCapacity,
    NodeReport,
};
use crate::gpu::{GpuInfo, GpuUsage};
use crate::policy::NodeResources;
use crate::status::NodeStatus;

/// What the node registers with: its cores, memory and GPUs (real or simulated).
pub fn node_capacity(resources: &NodeResources, gpus: &[GpuInfo]) -> NodeCapacity {
    NodeCapacity {
        cores: resources.cores,
        memory_bytes: resources.memory_bytes,
        gpus: gpus
            .iter()
            .map(|g| GpuDevice {
                index: g.index,
                model: clip(&g.model, MAX_NAME_LEN),
                memory_bytes: g.memory_bytes,
            })
            .collect(),
    }
}

/// The node's report: every coordinator job (running or recently finished, with its figures
/// when the daemon governs it) and every other governed job as a local one.
///
/// - progress is the latest finite value of the job's signal E(t);
/// - growth is P(t) per second, normalised by the signal's first value (the status shows it
///   per minute), never negative; growth efficiency is growth per core used;
/// - a local job's id is its cgroup path (unique on the node);
/// - node CPU and memory use are the sums over governed jobs;
/// - a job's GPU utilisation is the mean over its GPUs, its GPU memory their sum (GPUs are
///   reserved per job).
pub fn node_report<'a>(
    status: &NodeStatus,
    coordinator_jobs: impl IntoIterator<Item = &'a CoordinatorJob>,
    gpus: &[GpuUsage],
) -> NodeReport {
    let by_cgroup: HashMap<&str, &crate::status::JobStatus> =
        status.jobs.iter().map(|j| (j.cgroup.as_str(), j)).collect();
    let gpu_by_index: BTreeMap<u32, &GpuUsage> = gpus.iter().map(|g| (g.index, g)).collect();
    let mut claimed: HashSet<&str> = HashSet::new();
    let mut jobs = Vec::new();
    let mut seen_ids: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut move_requests = Vec::new();
    let mut asked: HashSet<String> = HashSet::new();
    for cj in coordinator_jobs {
        let job_id = clip(&cj.job_id, MAX_NAME_LEN);
        if job_id.trim().is_empty() || !seen_ids.insert((job_id.clone(), cj.replica)) {
            continue;
        }
        let governed = cj.cgroup.as_deref().and_then(|c| by_cgroup.get(c).copied());
        if let Some(c) = cj.cgroup.as_deref()
            && governed.is_some()
        {
            claimed.insert(c);
        }
        let mut report = JobReport::running(job_id, clip(&cj.name, MAX_NAME_LEN));
        report.replica = cj.replica;
        report.origin = JobOrigin::Coordinator;
        report.state = cj.state;
        report.exit_code = cj.exit_code;
        report.message = clip(&cj.message, MAX_MESSAGE_LEN);
        report.saved = cj.saved;
        report.attempt = cj.attempt;
        report.save_error = clip(&cj.save_error, MAX_MESSAGE_LEN);
        report.converged = cj.converged;
        if let Some(g) = governed
            && !cj.state.is_finished()
        {
            fill_figures(&mut report, g);
            push_move(&mut move_requests, &mut asked, &report.job_id, g);
        }
        let distinct: BTreeSet<u32> = cj.gpu_indices.iter().copied().collect();
        report.gpu_indices = distinct.into_iter().collect();
        let used: Vec<&GpuUsage> = report
            .gpu_indices
            .iter()
            .filter_map(|i| gpu_by_index.get(i).copied())
            .collect();
        if !used.is_empty() && !cj.state.is_finished() {
            let sum: f64 = used
                .iter()
                .map(|g| (g.utilization_percent.min(100) as f64) / 100.0)
                .sum();
            report.gpu_utilization = (sum / used.len() as f64).clamp(0.0, 1.0);
            report.gpu_memory_bytes = used.iter().map(|g| g.memory_used_bytes).sum();
        }
        jobs.push(report);
    }
    for j in &status.jobs {
        if claimed.contains(j.cgroup.as_str()) {
            continue;
        }
        let job_id = clip(&j.cgroup, MAX_NAME_LEN);
        if job_id.trim().is_empty() || !seen_ids.insert((job_id.clone(), 0)) {
            continue;
        }
        let name = if j.name.trim().is_empty() {
            job_id.clone()
        } else {
            clip(&j.name, MAX_NAME_LEN)
        };
        let mut report = JobReport::running(job_id, name);
        report.origin = JobOrigin::Local;
        fill_figures(&mut report, j);
        push_move(&mut move_requests, &mut asked, &report.job_id, j);
        jobs.push(report);
    }
    let cpu_used: f64 = status
        .jobs
        .iter()
        .filter_map(|j| j.cpu_usage_cores)
        .filter(|c| c.is_finite() && *c > 0.0)
        .sum();
    NodeReport {
        sequence: 0,
        cpu_used_cores: cpu_used,
        memory_used_bytes: status.jobs.iter().filter_map(|j| j.memory_bytes).sum(),
        jobs,
        move_requests,
        gpus: gpus
            .iter()
            .map(|g| WireGpuUsage {
                index: g.index,
                utilization: (g.utilization_percent.min(100) as f64) / 100.0,
                memory_used_bytes: g.memory_used_bytes,
            })
            .collect(),
    }
}

/// The policy's request to move a job elsewhere, under the id the report gives the job (a
/// replicated job's replicas are asked for once).
fn push_move(
    move_requests: &mut Vec<crate::coordinator_client::MoveRequest>,
    asked: &mut HashSet<String>,
    job_id: &str,
    j: &crate::status::JobStatus,
) {
    let Some(reason) = &j.move_request else {
        return;
    };
    if !asked.insert(job_id.to_owned()) {
        return;
    }
    move_requests.push(crate::coordinator_client::MoveRequest {
        job_id: job_id.to_owned(),
        reason: clip(reason, MAX_MESSAGE_LEN),
    });
}

/// The governed job's figures, made valid for the protocol.
fn fill_figures(report: &mut JobReport, j: &crate::status::JobStatus) {
    report.category = j.category;
    report.progress = j.signal_value.filter(|v| v.is_finite());
    let cores = j
        .cpu_usage_cores
        .filter(|c| c.is_finite() && *c > 0.0)
        .unwrap_or(0.0);
    report.cpu_cores = cores;
    report.growth = j
        .growth_per_minute
        .filter(|g| g.is_finite())
        .map(|g| (g / 60.0).max(0.0));
    report.growth_efficiency = report
        .growth
        .and_then(|g| (cores >= 0.01).then(|| g / cores));
    report.memory_bytes = j.memory_bytes.unwrap_or(0);
    report.cpu_limit_cores = j.cpu_max_cores.filter(|c| c.is_finite() && *c > 0.0);
    report.cpu_weight = j.cpu_weight.unwrap_or(0);
    report.time_to_quality_s = j.time_to_quality_s.filter(|t| t.is_finite() && *t >= 0.0);
    // Whole epochs done and declared (ProCon's n and MAX; a cluster sweep's rungs).
    report.epoch = j
        .epochs_done
        .filter(|e| e.is_finite() && *e >= 0.0)
        .map(|e| e.floor() as u64);
    report.max_epochs = j
        .epochs_total
        .filter(|e| e.is_finite() && *e > 0.0)
        .map(|e| e.ceil() as u64);
    report.epoch_seconds = j.epoch_seconds.filter(|s| s.is_finite() && *s > 0.0);
    report.gpu_energy_joules = j.gpu_energy_joules.filter(|e| e.is_finite() && *e >= 0.0);
    report.decision = clip(&j.decision, MAX_MESSAGE_LEN);
    if report.gpu_memory_bytes == 0 {
        report.gpu_memory_bytes = j.gpu_memory_bytes.unwrap_or(0);
    }
    // A job being stopped at convergence says so (the coordinator shows the message).
    if let Some(f) = &j.finish
        && report.message.is_empty()
    {
        report.message = clip(f, MAX_MESSAGE_LEN);
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// One line for `governor status`: where the agent stands.
pub fn describe_agent(address: &str, status: &AgentStatus, last_error: Option<&str>) -> String {
    let last = last_error
        .map(|e| format!("; last error: {e}"))
        .unwrap_or_default();
    match status {
        AgentStatus::Connected { session } => format!("{address} connected (session {session})"),
        AgentStatus::Connecting { attempt: 1 } if last_error.is_none() => {
            format!("{address} connecting")
        }
        AgentStatus::Connecting { attempt } => {
            format!("{address} retrying (attempt {attempt}{last})")
        }
        AgentStatus::Waiting { error, retry_in } => format!(
            "{address} retrying in {:.1}s: {error}",
            retry_in.as_secs_f64()
        ),
        AgentStatus::Stopped => format!("{address} stopped (not connected{last})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::coordinator_client::RunState;
    use crate::policy::Category;
    use crate::status::JobStatus;
    use governor_proto::pb;

    /// The report as the coordinator receives it: through the wire types and their validation.
    fn over_the_wire(report: &NodeReport) -> NodeReport {
        NodeReport::try_from(pb::NodeReport::from(report.clone()))
            .unwrap_or_else(|e| panic!("the coordinator would refuse the report: {e}\n{report:#?}"))
    }

    fn governed(name: &str, cgroup: &str) -> JobStatus {
        JobStatus {
            name: name.into(),
            cgroup: cgroup.into(),
            source: "launched".into(),
            category: Category::Progressing,
            signal: Some("loss".into()),
            signal_value: Some(0.75),
            growth_per_minute: Some(0.6),
            cpu_usage_cores: Some(1.5),
            cpu_weight: Some(400),
            cpu_max_cores: Some(2.0),
            memory_bytes: Some(300 << 20),
            gpu_energy_joules: Some(1234.5),
            epochs_done: Some(4.5),
            epochs_total: Some(20.0),
            epoch_seconds: Some(12.5),
            ..JobStatus::default()
        }
    }

    fn coordinator_job(
        id: &str,
        name: &str,
        cgroup: Option<&str>,
        state: RunState,
    ) -> CoordinatorJob {
        CoordinatorJob {
            job_id: id.into(),
            replica: 0,
            name: name.into(),
            cgroup: cgroup.map(str::to_owned),
            state,
            exit_code: None,
            message: String::new(),
            gpu_indices: Vec::new(),
            saved: false,
            attempt: 0,
            save_error: String::new(),
            converged: false,
        }
    }

    #[test]
    fn the_report_carries_coordinator_and_local_jobs_with_their_figures() {
        let status = NodeStatus {
            node: "node2".into(),
            jobs: vec![
                governed("resnet", "/governor.slice/jobs/resnet-j1"),
                JobStatus {
                    source: "declared".into(),
                    category: Category::Converged,
                    growth_per_minute: Some(-0.3),
                    ..governed("bert", "/system.slice/bert.service")
                },
            ],
            ..NodeStatus::default()
        };
        let mut running = coordinator_job(
            "j1",
            "resnet",
            Some("/governor.slice/jobs/resnet-j1"),
            RunState::Running,
        );
        running.gpu_indices = vec![1];
        let mut done = coordinator_job("j2", "gpt", None, RunState::Exited);
        done.exit_code = Some(0);
        let gpus = [
            GpuUsage {
                index: 0,
                utilization_percent: 10,
                memory_used_bytes: 1 << 30,
                power_milliwatts: None,
            },
            GpuUsage {
                index: 1,
                utilization_percent: 80,
                memory_used_bytes: 2 << 30,
                power_milliwatts: Some(250_000),
            },
        ];
        let report = over_the_wire(&node_report(&status, [&running, &done], &gpus));

        assert_eq!(report.jobs.len(), 3, "{report:#?}");
        let j1 = &report.jobs[0];
        assert_eq!(
            (j1.job_id.as_str(), j1.name.as_str(), j1.origin, j1.state),
            ("j1", "resnet", JobOrigin::Coordinator, RunState::Running)
        );
        assert_eq!(j1.category, Category::Progressing);
        assert_eq!(j1.progress, Some(0.75));
        assert_eq!(
            (j1.epoch, j1.max_epochs),
            (Some(4), Some(20)),
            "whole epochs done, for a cluster sweep's rungs"
        );
        assert_eq!(
            j1.epoch_seconds,
            Some(12.5),
            "the epoch time, for ProCon's placement and a move's payoff"
        );
        let growth = j1.growth.unwrap();
        assert!((growth - 0.01).abs() < 1e-12, "0.6/min is 0.01/s: {growth}");
        assert!((j1.growth_efficiency.unwrap() - 0.01 / 1.5).abs() < 1e-12);
        assert_eq!(j1.cpu_cores, 1.5);
        assert_eq!(j1.cpu_limit_cores, Some(2.0));
        assert_eq!(j1.cpu_weight, 400);
        assert_eq!(j1.memory_bytes, 300 << 20);
        assert_eq!(j1.gpu_indices, vec![1]);
        assert_eq!(j1.gpu_utilization, 0.8, "its own GPU only");
        assert_eq!(j1.gpu_energy_joules, Some(1234.5));
        assert_eq!(j1.gpu_memory_bytes, 2 << 30);

        let j2 = &report.jobs[1];
        assert_eq!(
            (j2.job_id.as_str(), j2.state, j2.exit_code),
            ("j2", RunState::Exited, Some(0)),
            "a finished job stays in the report with its exit status"
        );
        assert_eq!(j2.cpu_cores, 0.0);

        let local = &report.jobs[2];
        assert_eq!(local.job_id, "/system.slice/bert.service");
        assert_eq!(local.name, "bert");
        assert_eq!(local.origin, JobOrigin::Local);
        assert_eq!(local.state, RunState::Running);
        assert_eq!(local.category, Category::Converged);
        assert_eq!(local.growth, Some(0.0), "a worsening signal is no growth");

        assert_eq!(report.cpu_used_cores, 3.0);
        assert_eq!(report.memory_used_bytes, 600 << 20);
        assert_eq!(report.gpus.len(), 2);
        assert_eq!(report.gpus[1].utilization, 0.8);
    }

    #[test]
    fn move_requests_name_the_job_as_the_report_does() {
        let mut vae = governed("vae", "/governor.slice/jobs/vae-j3");
        vae.move_request = Some("converged while others progress".into());
        let mut local = governed("bert", "/docker/abc");
        local.move_request = Some("converged".into());
        let status = NodeStatus {
            jobs: vec![vae, local, governed("gpt", "/docker/def")],
            ..NodeStatus::default()
        };
        let jobs = [coordinator_job(
            "j3",
            "vae",
            Some("/governor.slice/jobs/vae-j3"),
            RunState::Running,
        )];
        let report = over_the_wire(&node_report(&status, &jobs, &[]));
        let asked: Vec<(&str, &str)> = report
            .move_requests
            .iter()
            .map(|m| (m.job_id.as_str(), m.reason.as_str()))
            .collect();
        assert_eq!(
            asked,
            [
                ("j3", "converged while others progress"),
                ("/docker/abc", "converged")
            ]
        );
    }

    #[test]
    fn odd_values_never_make_the_report_invalid() {
        let status = NodeStatus {
            jobs: vec![
                JobStatus {
                    name: "é".repeat(300),
                    signal_value: Some(f64::NAN),
                    growth_per_minute: Some(f64::INFINITY),
                    cpu_usage_cores: Some(-0.5),
                    cpu_max_cores: Some(0.0),
                    ..governed("x", "/a")
                },
                JobStatus {
                    name: "  ".into(),
                    ..governed("x", "/b")
                },
            ],
            ..NodeStatus::default()
        };
        let mut failed = coordinator_job("j9", "bad", None, RunState::Failed);
        failed.message = "x".repeat(10_000);
        failed.gpu_indices = vec![3, 3];
        let twice = failed.clone();
        let gpus = [GpuUsage {
            index: 3,
            utilization_percent: 250,
            ..GpuUsage::default()
        }];
        let report = over_the_wire(&node_report(&status, [&failed, &twice], &gpus));
        assert_eq!(
            report.jobs.len(),
            3,
            "a job reported twice is reported once"
        );
        let a = report.jobs.iter().find(|j| j.job_id == "/a").unwrap();
        assert!(a.name.len() <= MAX_NAME_LEN && a.name.starts_with('é'));
        assert_eq!((a.progress, a.growth, a.cpu_cores), (None, None, 0.0));
        assert_eq!(a.cpu_limit_cores, None);
        let b = report.jobs.iter().find(|j| j.job_id == "/b").unwrap();
        assert_eq!(b.name, "/b", "a blank name is replaced by the cgroup");
        let j9 = report.jobs.iter().find(|j| j.job_id == "j9").unwrap();
        assert_eq!(j9.message.len(), MAX_MESSAGE_LEN);
        assert_eq!(j9.gpu_indices, vec![3]);
        assert_eq!(report.gpus[0].utilization, 1.0);
    }

    #[test]
    fn capacity_lists_the_gpus() {
        let cap = node_capacity(
            &NodeResources {
                cores: 8.0,
                memory_bytes: 64 << 30,
            },
            &[GpuInfo {
                index: 0,
                uuid: "GPU-0".into(),
                model: "NVIDIA H200".into(),
                memory_bytes: 141 << 30,
            }],
        );
        assert_eq!((cap.cores, cap.memory_bytes), (8.0, 64 << 30));
        assert_eq!(cap.gpus[0].model, "NVIDIA H200");
        assert_eq!(cap.gpus[0].memory_bytes, 141 << 30);
    }

    #[test]
    fn the_agent_state_reads_well_in_status() {
        let a = "10.10.0.1:7070";
        assert_eq!(
            describe_agent(a, &AgentStatus::Connected { session: 4 }, None),
            "10.10.0.1:7070 connected (session 4)"
        );
        assert_eq!(
            describe_agent(a, &AgentStatus::Connecting { attempt: 1 }, None),
            "10.10.0.1:7070 connecting"
        );
        let waiting = AgentStatus::Waiting {
            error: "cannot reach the coordinator: connection refused".into(),
            retry_in: Duration::from_millis(1500),
        };
        assert_eq!(
            describe_agent(a, &waiting, None),
            "10.10.0.1:7070 retrying in 1.5s: cannot reach the coordinator: connection refused"
        );
        assert_eq!(
            describe_agent(a, &AgentStatus::Connecting { attempt: 3 }, Some("refused")),
            "10.10.0.1:7070 retrying (attempt 3; last error: refused)"
        );
    }
}
