//! What `governor status` shows: typed, serialisable snapshots of the daemon's view of the node,
//! served on the control socket and rendered as a table or JSON.

use std::fmt::Write as _;

/// The snapshot types are the control socket's wire types (`governor_proto::control_socket`).
pub use governor_proto::control_socket::{JobStatus, NodeStatus};

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// Human-readable byte count (binary units).
fn human_bytes(b: u64) -> String {
    governor_proto::units::ByteSize(b).human()
}

/// Render a node status as the table `governor status` prints.
pub fn render_table(s: &NodeStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node {}  policy {}{}  cpu source {}{}  cgroup {}  capacity {:.1} cores / {}  up {:.0}s",
        s.node,
        s.policy,
        if s.dry_run { " (dry run)" } else { "" },
        s.cpu_source,
        s.cpu_source_note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default(),
        s.cgroup_mode,
        s.cores,
        human_bytes(s.memory_bytes),
        s.uptime_seconds,
    );
    if let Some(c) = &s.coordinator {
        let _ = writeln!(out, "coordinator {c}");
    }
    render_gpus(s, &mut out);
    if s.jobs.is_empty() {
        out.push_str("no governed jobs\n");
        return out;
    }
    let headers = [
        "JOB",
        "CATEGORY",
        "SIGNAL",
        "VALUE",
        "GROWTH/MIN",
        "CPU",
        "WEIGHT",
        "CPU.MAX",
        "MEMORY",
        "MEM.LIMIT",
        "CGROUP",
        "DECISION",
    ];
    let rows: Vec<[String; 12]> = s
        .jobs
        .iter()
        .map(|j| {
            [
                j.name.clone(),
                j.category.to_string(),
                j.signal.clone().unwrap_or_else(|| "-".into()),
                opt(j.signal_value, |v| format!("{v:.4}")),
                opt(j.growth_per_minute, |g| format!("{:+.2}%", g * 100.0)),
                opt(j.cpu_usage_cores, |c| format!("{c:.2}")),
                opt(j.cpu_weight, |w| w.to_string()),
                opt(j.cpu_max_cores, |c| format!("{c:.2}")),
                opt(j.memory_bytes, human_bytes),
                match (j.memory_high_bytes, j.memory_max_bytes) {
                    (None, None) => "-".into(),
                    (h, m) => format!("{}/{}", opt(h, human_bytes), opt(m, human_bytes)),
                },
                j.cgroup.clone(),
                {
                    let mut why = j.decision.clone();
                    if let Some(s) = &j.sweep {
                        why.push_str(&format!(" [sweep {s}]"));
                    }
                    if let Some(f) = &j.finish {
                        why.push_str(&format!(" [{f}]"));
                    }
                    if let Some(m) = &j.move_request {
                        why.push_str(&format!(" [move asked: {m}]"));
                    }
                    if let Some(p) = &j.log_problem {
                        why.push_str(&format!(" [log: {p}]"));
                    }
                    why
                },
            ]
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>, out: &mut String| {
        let last = cells.len() - 1;
        for (i, c) in cells.iter().enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                let _ = write!(out, "{c:<w$}  ", w = widths[i]);
            }
        }
        out.push('\n');
    };
    line(headers.to_vec(), &mut out);
    for r in &rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// One line per GPU: use, power against its limit (and the original it goes back to), energy
/// since the daemon started, and the jobs on it with their share of the energy.
fn render_gpus(s: &NodeStatus, out: &mut String) {
    for g in &s.gpus {
        let jobs: Vec<String> = g
            .jobs
            .iter()
            .map(|name| {
                let energy = s
                    .jobs
                    .iter()
                    .find(|j| &j.name == name)
                    .and_then(|j| j.gpu_energy_joules);
                let job = s.jobs.iter().find(|j| &j.name == name);
                match (energy, job.and_then(|j| j.gpu_power_watts)) {
                    (Some(e), Some(w)) => format!("{name} ({}, {w:.0} W)", joules(e)),
                    (Some(e), None) => format!("{name} ({})", joules(e)),
                    _ => name.clone(),
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "gpu {} {}  util {}%  memory {}/{}  power {} / limit {}{}  energy {}  jobs: {}{}",
            g.index,
            g.model,
            g.utilization_percent,
            human_bytes(g.memory_used_bytes),
            human_bytes(g.memory_total_bytes),
            opt(g.power_watts, |w| format!("{w:.0} W")),
            opt(g.limit_watts, |w| format!("{w:.0} W")),
            g.original_limit_watts
                .map(|w| format!(" (lowered from {w:.0} W)"))
                .unwrap_or_default(),
            opt(g.energy_joules, joules),
            if jobs.is_empty() {
                "-".to_owned()
            } else {
                jobs.join(", ")
            },
            g.note
                .as_deref()
                .map(|n| format!("  [{n}]"))
                .unwrap_or_default(),
        );
    }
}

/// Joules as kJ / MJ when large.
fn joules(j: f64) -> String {
    if j >= 1e6 {
        format!("{:.2} MJ", j / 1e6)
    } else if j >= 1e3 {
        format!("{:.1} kJ", j / 1e3)
    } else {
        format!("{j:.0} J")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Category;

    #[test]
    fn gpus_show_their_power_limit_energy_and_jobs() {
        let s = NodeStatus {
            node: "n1".into(),
            gpus: vec![governor_proto::control_socket::GpuStatus {
                index: 0,
                uuid: "GPU-1".into(),
                model: "H100".into(),
                utilization_percent: 95,
                memory_used_bytes: 2 << 30,
                memory_total_bytes: 80 << 30,
                power_watts: Some(420.0),
                limit_watts: Some(420.0),
                original_limit_watts: Some(700.0),
                energy_joules: Some(125_000.0),
                jobs: vec!["a".into()],
                note: None,
            }],
            jobs: vec![JobStatus {
                name: "a".into(),
                gpu_energy_joules: Some(125_000.0),
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = render_table(&s);
        assert!(
            t.contains("gpu 0 H100  util 95%  memory 2.0GiB/80.0GiB  power 420 W / limit 420 W (lowered from 700 W)  energy 125.0 kJ  jobs: a (125.0 kJ)"),
            "{t}"
        );
    }

    #[test]
    fn table_has_a_row_per_job_and_aligned_columns() {
        let s = NodeStatus {
            node: "n1".into(),
            policy: "shortest-left".into(),
            cpu_source: "cpu.stat".into(),
            cpu_source_note: Some("eBPF disabled".into()),
            cgroup_mode: "v2".into(),
            cores: 2.0,
            memory_bytes: 2 << 30,
            jobs: vec![
                JobStatus {
                    name: "a".into(),
                    cgroup: "/governor.slice/jobs/a".into(),
                    category: Category::Progressing,
                    signal: Some("loss".into()),
                    signal_value: Some(0.5),
                    growth_per_minute: Some(0.1),
                    cpu_usage_cores: Some(1.25),
                    cpu_weight: Some(400),
                    decision: "fast learner".into(),
                    ..Default::default()
                },
                JobStatus {
                    name: "bb".into(),
                    cgroup: "/x".into(),
                    category: Category::Converged,
                    cpu_max_cores: Some(0.2),
                    memory_bytes: Some(3 << 20),
                    memory_max_bytes: Some(1 << 30),
                    log_problem: Some("no known format".into()),
                    decision: "converged".into(),
                    move_request: Some("others progress".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let t = render_table(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[0].contains("policy shortest-left")
                && lines[0].contains("cpu source cpu.stat (eBPF disabled)")
        );
        assert!(
            lines[2].starts_with("a   ")
                && lines[2].contains("progressing")
                && lines[2].contains("+10.00%")
                && lines[2].contains("400")
        );
        assert!(
            lines[3].contains("converged")
                && lines[3].contains("0.20")
                && lines[3].contains("3.0MiB")
                && lines[3].contains("-/1.0GiB")
                && lines[3]
                    .contains("converged [move asked: others progress] [log: no known format]")
        );
        let col = lines[1].find("CATEGORY").unwrap();
        assert_eq!(lines[2].find("progressing"), Some(col));
        assert_eq!(lines[3].find("converged"), Some(col));
    }

    #[test]
    fn status_round_trips_through_json() {
        let s = NodeStatus {
            node: "n".into(),
            jobs: vec![JobStatus {
                name: "j".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let back: NodeStatus = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            render_table(&NodeStatus::default()).lines().nth(1),
            Some("no governed jobs")
        );
    }

    #[test]
    fn the_coordinator_connection_has_its_own_line() {
        let mut s = NodeStatus::default();
        assert!(
            !render_table(&s).contains("coordinator"),
            "no coordinator configured: nothing said"
        );
        s.coordinator = Some("10.10.0.1:7070 retrying in 2.0s: connection refused".into());
        let t = render_table(&s);
        assert_eq!(
            t.lines().nth(1),
            Some("coordinator 10.10.0.1:7070 retrying in 2.0s: connection refused"),
            "{t}"
        );
    }

    #[test]
    fn bytes() {
        assert_eq!(human_bytes(512), "512B");
        assert_eq!(human_bytes(1536), "1.5KiB");
        assert_eq!(human_bytes(3 << 30), "3.0GiB");
    }
}
