//! Text rendering for govctl: tables, durations, sparklines. Pure functions of the data.

use std::fmt::Write;

use governor_proto::control::{
    JobDetail, JobState, JobSummary, NodeState, NodeSummary, PolicyState, Stats,
};
use governor_proto::node::Category;

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// A sparkline of `values`, at most `width` characters (buckets averaged).
pub fn sparkline(values: &[f64], width: usize) -> String {
    if values.is_empty() || width == 0 {
        return String::new();
    }
    let buckets: Vec<f64> = if values.len() <= width {
        values.to_vec()
    } else {
        (0..width)
            .map(|b| {
                let from = b * values.len() / width;
                let to = ((b + 1) * values.len() / width).max(from + 1);
                values[from..to].iter().sum::<f64>() / (to - from) as f64
            })
            .collect()
    };
    let (lo, hi) = buckets
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| {
            (l.min(v), h.max(v))
        });
    buckets
        .iter()
        .map(|&v| {
            if (hi - lo).abs() < f64::EPSILON {
                BARS[3]
            } else {
                BARS[(((v - lo) / (hi - lo)) * 7.0).round() as usize]
            }
        })
        .collect()
}

/// "4s", "3m05s", "2h10m", "3d4h".
pub fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// Bytes for a table, as `governor status` shows them.
pub fn bytes(b: u64) -> String {
    governor_proto::units::ByteSize(b).human()
}

fn category_short(c: Category) -> &'static str {
    match c {
        Category::Unknown => "unk",
        Category::Progressing => "prog",
        Category::Watching => "watch",
        Category::Converged => "conv",
    }
}

/// `govctl nodes`.
pub fn nodes_table(nodes: &[NodeSummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<9} {:>11} {:>13} {:>9} {:>4}  {:<24} {:>8}  MOVES",
        "NODE", "STATUS", "CPU", "MEMORY", "GPUS", "JOBS", "CATEGORIES (u/p/w/c)", "REPORTED"
    );
    for n in nodes {
        let gpus = if n.capacity.gpus.is_empty() {
            "-".to_owned()
        } else {
            format!("{}/{} free", n.free_gpus.len(), n.capacity.gpus.len())
        };
        let [u, p, w, c] = n.category_counts;
        let _ = writeln!(
            out,
            "{:<16} {:<9} {:>11} {:>13} {:>9} {:>4}  {:<24} {:>8}  {}",
            n.name,
            n.status.to_string(),
            format!("{:.1}/{:.0}", n.cpu_used_cores, n.capacity.cores),
            format!(
                "{}/{}",
                bytes(n.memory_used_bytes),
                bytes(n.capacity.memory_bytes)
            ),
            gpus,
            n.jobs,
            format!("{u}/{p}/{w}/{c}"),
            format!("{} ago", duration(n.last_report_age_s)),
            // Jobs with a declared checkpoint move anywhere; others only between CRIU nodes.
            if n.can_dump {
                "checkpoint, criu"
            } else {
                "checkpoint"
            },
        );
    }
    if nodes.is_empty() {
        out.push_str("(no node has registered yet: start `governor daemon --coordinator ADDR` on the nodes)\n");
    }
    out
}

fn placement_of(j: &JobSummary) -> String {
    if j.members.is_empty() {
        return "-".into();
    }
    j.members
        .iter()
        .map(|m| {
            if m.gpu_indices.is_empty() {
                m.node.clone()
            } else {
                format!(
                    "{}[{}]",
                    m.node,
                    m.gpu_indices
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `govctl jobs`.
pub fn jobs_table(jobs: &[JobSummary], now: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:<18} {:<10} {:<12} {:>4} {:>5} {:>8} {:>10} {:>8}  NODE / WHY",
        "JOB", "NAME", "STATUS", "CATEGORY", "PRIO", "GPUS", "CPU", "PROGRESS", "AGE"
    );
    for j in jobs {
        let progress = j.progress.map_or("-".to_owned(), |p| format!("{p:.4}"));
        let where_ = if j.status == JobState::Queued
            || j.status == JobState::Failed
            || j.status == JobState::Unknown
        {
            let node = placement_of(j);
            if j.message.is_empty() {
                node
            } else if node == "-" {
                j.message.clone()
            } else {
                format!("{node}: {}", j.message)
            }
        } else if let Some(moving) = &j.moving {
            moving.clone()
        } else {
            match &j.move_request {
                // Running where it is, but its node would rather see it elsewhere.
                Some(_) => format!("{} (move asked)", placement_of(j)),
                None => placement_of(j),
            }
        };
        let _ = writeln!(
            out,
            "{:<14} {:<18} {:<10} {:<12} {:>4} {:>5} {:>8} {:>10} {:>8}  {}",
            j.id,
            truncate(&j.name, 18),
            j.status.to_string(),
            j.category.to_string(),
            j.priority,
            j.gpus * j.replicas.max(1),
            format!("{:.2}", j.cpu_cores),
            progress,
            duration(now - j.submitted_at_unix),
            where_
        );
    }
    if jobs.is_empty() {
        out.push_str("(no jobs; `govctl submit --name N --log PATH -- CMD...` starts one)\n");
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// `govctl job JOB`.
pub fn job_detail(d: &JobDetail, now: f64) -> String {
    let j = &d.summary;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "job {} \"{}\": {}{}",
        j.id,
        j.name,
        j.status,
        if j.local {
            " (local job found by its node)"
        } else {
            ""
        }
    );
    if !j.message.is_empty() {
        let _ = writeln!(out, "  why:        {}", j.message);
    }
    if let Some(m) = &j.move_request {
        let _ = writeln!(out, "  move asked: {m}");
    }
    if let Some(m) = &j.moving {
        let _ = writeln!(out, "  moving:     {m}");
    }
    if let Some(t) = j.time_to_quality_s {
        let _ = writeln!(
            out,
            "  quality:    reached {} after submission (its loss within 5% of its reduction so far)",
            duration(t)
        );
    }
    let _ = writeln!(
        out,
        "  category:   {}   priority {}   {} member(s) x {} GPU(s)",
        j.category, j.priority, j.replicas, j.gpus
    );
    let _ = writeln!(
        out,
        "  resources:  CPU {:.2} cores{}   memory {}",
        j.cpu_cores,
        j.cpu_limit_cores
            .map_or(String::new(), |l| format!(" (capped at {l:.2})")),
        bytes(j.memory_bytes)
    );
    if !j.decision.is_empty() {
        let _ = writeln!(out, "  node says:  {}", j.decision);
    }
    if let Some(e) = j.gpu_energy_joules {
        let _ = writeln!(
            out,
            "  gpu:        {:.1} kJ of GPU energy (its nodes' NVML counters)",
            e / 1000.0
        );
    }
    if let Some(spec) = d.spec.as_ref().filter(|s| s.is_elastic()) {
        let _ = writeln!(
            out,
            "  size:       {} cores now (elastic, {} to {}; resized by save and resume, told in GOVERNOR_CORES)",
            crate::state::cores(j.cores),
            crate::state::cores(spec.cores),
            crate::state::cores(spec.max_cores)
        );
    }
    let mut times = format!("submitted {} ago", duration(now - j.submitted_at_unix));
    if let Some(s) = j.started_at_unix {
        let _ = write!(
            times,
            ", started {} after",
            duration(s - j.submitted_at_unix)
        );
    }
    if let Some(f) = j.finished_at_unix {
        let _ = write!(times, ", finished {} ago", duration(now - f));
    }
    let _ = writeln!(out, "  time:       {times}");
    for m in &j.members {
        let _ = writeln!(
            out,
            "  member {}:   node {} GPUs {:?}  {}",
            m.replica, m.node, m.gpu_indices, m.state
        );
    }
    if let Some(spec) = &d.spec {
        let _ = writeln!(out, "  command:    {}", spec.argv.join(" "));
        let _ = writeln!(
            out,
            "  log:        {}{}",
            spec.log_path,
            if spec.metric.is_empty() {
                String::new()
            } else {
                format!(
                    " (signal {:?}{})",
                    spec.metric,
                    if spec.maximise { ", maximised" } else { "" }
                )
            }
        );
    }
    if d.progress.is_empty() {
        let _ = writeln!(out, "  progress:   no value reported yet");
    } else {
        let values: Vec<f64> = d.progress.iter().map(|p| p.value).collect();
        let first = d.progress[0];
        let last = d.progress[d.progress.len() - 1];
        let _ = writeln!(
            out,
            "  progress:   {}  {:.4} -> {:.4} over {} ({} samples)",
            sparkline(&values, 60),
            first.value,
            last.value,
            duration(last.at_unix - first.at_unix),
            values.len()
        );
    }
    if !d.categories.is_empty() {
        let history: Vec<String> = d
            .categories
            .iter()
            .map(|c| {
                format!(
                    "{} (+{})",
                    c.category,
                    duration(c.at_unix - j.submitted_at_unix)
                )
            })
            .collect();
        let _ = writeln!(out, "  categories: {}", history.join(" -> "));
    }
    if d.placements.is_empty() {
        let _ = writeln!(out, "  placement:  not placed yet");
    }
    for p in &d.placements {
        let _ = writeln!(
            out,
            "  placed:     member {} on {} GPUs {:?} by {} (+{} after submission)",
            p.replica,
            p.node,
            p.gpu_indices,
            p.policy,
            duration(p.at_unix - j.submitted_at_unix)
        );
        let _ = writeln!(out, "      why:    {}", p.reason);
        for c in &p.candidates {
            let _ = writeln!(
                out,
                "      {:<14} score {:>10.3}  {}",
                c.node, c.score, c.note
            );
        }
    }
    for m in &d.moves {
        let mut phases = format!(
            "requested +{}",
            duration(m.requested_at_unix - j.submitted_at_unix)
        );
        if let Some(s) = m.saved_at_unix {
            let _ = write!(
                phases,
                ", saved {} later",
                duration(s - m.requested_at_unix)
            );
        }
        if let Some(r) = m.running_at_unix {
            let _ = write!(
                phases,
                ", running again {} after the save",
                duration(r - m.saved_at_unix.unwrap_or(m.requested_at_unix))
            );
        }
        if let Some(p) = m.pause_s(now).filter(|_| m.running_at_unix.is_none()) {
            let _ = write!(phases, ", paused for {} so far", duration(p));
        }
        if m.bytes > 0 {
            let _ = write!(phases, ", {} carried", bytes(m.bytes));
        }
        match &m.preempted_for {
            None if m.to_cores.is_some() => {
                let place = if m.from_node == m.to_node {
                    format!("on {}", m.from_node)
                } else {
                    format!("moving {} -> {}", m.from_node, m.to_node)
                };
                let _ = writeln!(
                    out,
                    "  resized:    {} -> {} cores {place}{}: {} ({phases})",
                    crate::state::cores(m.from_cores),
                    crate::state::cores(m.to_cores),
                    m.resized_for
                        .as_deref()
                        .map(|j| format!(" to make room for {j}"))
                        .unwrap_or_default(),
                    m.phase
                );
            }
            Some(by) => {
                let resumed = if m.to_node.is_empty() {
                    String::new()
                } else {
                    format!(", resumed on {}", m.to_node)
                };
                let _ = writeln!(
                    out,
                    "  preempted:  on {} for {by}{resumed}: {} ({phases})",
                    m.from_node, m.phase
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  moved:      {} -> {}: {} ({phases})",
                    m.from_node, m.to_node, m.phase
                );
            }
        }
        let _ = writeln!(out, "      why:    {}", m.reason);
        if !m.message.is_empty() {
            let _ = writeln!(out, "      how:    {}", m.message);
        }
    }
    out
}

/// `govctl policy`.
pub fn policy(p: &PolicyState) -> String {
    let mut out = format!("current placement policy: {}\n", p.current);
    for i in &p.available {
        let mark = if i.name == p.current { "*" } else { " " };
        let _ = writeln!(out, " {mark} {:<12} {}", i.name, i.summary);
    }
    out
}

/// `govctl stats`.
pub fn stats(s: &Stats) -> String {
    format!(
        "coordinator up {}; policy {}\nnodes {} ({} ready), jobs {} ({} queued)\nreports {}, placements {}, placement latency p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms\n",
        duration(s.uptime_s),
        s.policy,
        s.nodes,
        s.ready_nodes,
        s.jobs,
        s.queued_jobs,
        s.reports,
        s.placements,
        s.placement_p50_ms,
        s.placement_p99_ms,
        s.placement_max_ms
    )
}

/// One frame of `govctl top`.
pub fn top(nodes: &[NodeSummary], jobs: &[JobSummary], policy: &str, now: f64) -> String {
    let mut out = String::new();
    let ready = nodes
        .iter()
        .filter(|n| n.status == NodeState::Ready)
        .count();
    let lost = nodes.iter().filter(|n| n.status == NodeState::Lost).count();
    let queued = jobs.iter().filter(|j| j.status == JobState::Queued).count();
    let cores: f64 = nodes.iter().map(|n| n.capacity.cores).sum();
    let used: f64 = nodes.iter().map(|n| n.cpu_used_cores).sum();
    let _ = writeln!(
        out,
        "governor cluster — {} nodes ({ready} ready, {lost} lost), {} jobs ({queued} queued), CPU {used:.1}/{cores:.0} cores, policy {policy}",
        nodes.len(),
        jobs.len()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<16} {:<9} {:<22} {:>9} {:>5}  CATEGORIES",
        "NODE", "STATUS", "CPU", "GPUS", "JOBS"
    );
    for n in nodes {
        let frac = if n.capacity.cores > 0.0 {
            (n.cpu_used_cores / n.capacity.cores).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let filled = (frac * 10.0).round() as usize;
        let bar = format!(
            "[{}{}] {:>5.1}",
            "#".repeat(filled),
            ".".repeat(10 - filled),
            n.cpu_used_cores
        );
        let cats: Vec<String> = Category::ALL
            .iter()
            .zip(n.category_counts)
            .filter(|(_, c)| *c > 0)
            .map(|(cat, c)| format!("{c} {}", category_short(*cat)))
            .collect();
        let gpus = if n.capacity.gpus.is_empty() {
            "-".to_owned()
        } else {
            format!(
                "{}/{}",
                n.capacity.gpus.len() - n.free_gpus.len(),
                n.capacity.gpus.len()
            )
        };
        let _ = writeln!(
            out,
            "{:<16} {:<9} {:<22} {:>9} {:>5}  {}",
            n.name,
            n.status.to_string(),
            bar,
            gpus,
            n.jobs,
            cats.join(", ")
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<14} {:<18} {:<10} {:<12} {:>8} {:>7} {:>10}  NODE",
        "JOB", "NAME", "STATUS", "CATEGORY", "CPU", "SHARE", "PROGRESS"
    );
    for j in jobs {
        let node_cores: f64 = j
            .members
            .iter()
            .filter_map(|m| nodes.iter().find(|n| n.name == m.node))
            .map(|n| n.capacity.cores)
            .sum();
        let share = if node_cores > 0.0 {
            format!("{:.0}%", 100.0 * j.cpu_cores / node_cores)
        } else {
            "-".into()
        };
        let _ = writeln!(
            out,
            "{:<14} {:<18} {:<10} {:<12} {:>8} {:>7} {:>10}  {}",
            j.id,
            truncate(&j.name, 18),
            j.status.to_string(),
            j.category.to_string(),
            format!("{:.2}", j.cpu_cores),
            share,
            j.progress.map_or("-".to_owned(), |p| format!("{p:.4}")),
            match &j.move_request {
                Some(_) => format!("{} (move asked)", placement_of(j)),
                None => placement_of(j),
            }
        );
    }
    let _ = now;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor_proto::control::{JobMember, JobSpec};
    use governor_proto::node::{NodeCapacity, RunState};

    #[test]
    fn sparkline_spans_the_bars_and_downsamples() {
        assert_eq!(
            sparkline(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], 8),
            "▁▂▃▄▅▆▇█"
        );
        assert_eq!(sparkline(&[3.0, 3.0], 10), "▄▄");
        let long: Vec<f64> = (0..1000).map(|i| -(i as f64)).collect();
        let s = sparkline(&long, 20);
        assert_eq!(s.chars().count(), 20);
        assert!(s.starts_with('█') && s.ends_with('▁'), "{s}");
        assert_eq!(sparkline(&[], 10), "");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(4.4), "4s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(7800.0), "2h10m");
        assert_eq!(duration(-3.0), "0s");
    }

    fn summary(status: JobState) -> JobSummary {
        JobSummary {
            id: "j7".into(),
            name: "resnet50-imagenet-long-name".into(),
            status,
            priority: 2,
            gpus: 1,
            replicas: 1,
            members: vec![JobMember {
                replica: 0,
                node: "node2".into(),
                gpu_indices: vec![3],
                state: RunState::Running,
            }],
            category: Category::Watching,
            progress: Some(0.1234),
            cpu_cores: 1.5,
            cpu_limit_cores: None,
            memory_bytes: 3 << 29,
            submitted_at_unix: 100.0,
            started_at_unix: Some(110.0),
            finished_at_unix: None,
            message: "node node2 is lost".into(),
            local: false,
            move_request: None,
            time_to_quality_s: None,
            moving: None,
            cores: None,
            gpu_energy_joules: None,
            decision: "weight 400: watching, +0.80%/min".into(),
        }
    }

    #[test]
    fn a_jobs_move_request_shows_in_the_list_and_the_detail() {
        let mut j = summary(JobState::Running);
        j.move_request = Some("node node2 asks: converged while others progress".into());
        let t = jobs_table(std::slice::from_ref(&j), 160.0);
        let row = t.lines().nth(1).unwrap();
        assert!(row.ends_with("node2[3] (move asked)"), "{row}");
        let d = job_detail(
            &JobDetail {
                summary: j,
                spec: None,
                progress: Vec::new(),
                categories: Vec::new(),
                placements: Vec::new(),
                moves: Vec::new(),
            },
            160.0,
        );
        assert!(
            d.contains("  move asked: node node2 asks: converged while others progress"),
            "{d}"
        );
        assert!(
            d.contains("  node says:  weight 400: watching, +0.80%/min"),
            "{d}"
        );
    }

    #[test]
    fn a_jobs_moves_show_with_their_phases_and_pause() {
        let mut j = summary(JobState::Running);
        j.moving = Some("restoring on node3 (from node2)".into());
        let d_summary = j.clone();
        let d = job_detail(
            &JobDetail {
                summary: j,
                spec: None,
                progress: Vec::new(),
                categories: Vec::new(),
                placements: Vec::new(),
                moves: vec![governor_proto::control::JobMove {
                    from_node: "node2".into(),
                    to_node: "node3".into(),
                    reason: "govctl move".into(),
                    phase: governor_proto::control::MovePhase::Restoring,
                    requested_at_unix: 120.0,
                    saved_at_unix: Some(125.0),
                    running_at_unix: None,
                    message: "framework checkpoint in /shared/ck".into(),
                    bytes: 0,
                    preempted_for: None,
                    from_cores: None,
                    to_cores: None,
                    resized_for: None,
                    start_sent_at_unix: None,
                }],
            },
            130.0,
        );
        assert!(
            d.contains("  moving:     restoring on node3 (from node2)"),
            "{d}"
        );
        let t = jobs_table(std::slice::from_ref(&d_summary), 130.0);
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .ends_with("restoring on node3 (from node2)"),
            "{t}"
        );
        assert!(
            d.contains("  moved:      node2 -> node3: restoring (requested +20s, saved 5s later, paused for 5s so far)"),
            "{d}"
        );
        assert!(
            d.contains("      how:    framework checkpoint in /shared/ck"),
            "{d}"
        );

        // A preemption: saved for a higher-priority job, requeued, resumed elsewhere.
        let mut j = summary(JobState::Running);
        j.moving = None;
        let d = job_detail(
            &JobDetail {
                summary: j,
                spec: None,
                progress: Vec::new(),
                categories: Vec::new(),
                placements: Vec::new(),
                moves: vec![governor_proto::control::JobMove {
                    from_node: "node2".into(),
                    to_node: "node3".into(),
                    reason: "preempted: j9 of priority 10 does not fit anywhere".into(),
                    phase: governor_proto::control::MovePhase::Done,
                    requested_at_unix: 120.0,
                    saved_at_unix: Some(125.0),
                    running_at_unix: Some(185.0),
                    message: "framework checkpoint in /shared/ck".into(),
                    bytes: 0,
                    preempted_for: Some("j9".into()),
                    from_cores: None,
                    to_cores: None,
                    resized_for: None,
                    start_sent_at_unix: None,
                }],
            },
            200.0,
        );
        assert!(
            d.contains("  preempted:  on node2 for j9, resumed on node3: done (requested +20s, saved 5s later, running again 1m00s after the save)"),
            "{d}"
        );

        // An elastic job shrunk on its node to make room.
        let mut j = summary(JobState::Running);
        j.moving = None;
        j.cores = Some(2.0);
        j.gpu_energy_joules = Some(1500.0);
        let mut spec = JobSpec::new("sweep", vec!["train".into()], "/shared/s.csv");
        spec.cores = Some(1.0);
        spec.max_cores = Some(4.0);
        let d = job_detail(
            &JobDetail {
                summary: j,
                spec: Some(spec),
                progress: Vec::new(),
                categories: Vec::new(),
                placements: Vec::new(),
                moves: vec![governor_proto::control::JobMove {
                    from_node: "node2".into(),
                    to_node: "node2".into(),
                    reason: "j9 of priority 0 does not fit anywhere; ...".into(),
                    phase: governor_proto::control::MovePhase::Done,
                    requested_at_unix: 120.0,
                    saved_at_unix: Some(121.0),
                    running_at_unix: Some(122.0),
                    message: String::new(),
                    bytes: 0,
                    preempted_for: None,
                    from_cores: Some(4.0),
                    to_cores: Some(2.0),
                    resized_for: Some("j9".into()),
                    start_sent_at_unix: None,
                }],
            },
            200.0,
        );
        assert!(
            d.contains("  gpu:        1.5 kJ of GPU energy (its nodes' NVML counters)"),
            "{d}"
        );
        assert!(
            d.contains("  size:       2 cores now (elastic, 1 to 4;"),
            "{d}"
        );
        assert!(
            d.contains("  resized:    4 -> 2 cores on node2 to make room for j9: done (requested +20s, saved 1s later, running again 1s after the save)"),
            "{d}"
        );
    }

    #[test]
    fn jobs_table_shows_where_and_why() {
        let t = jobs_table(&[summary(JobState::Unknown)], 160.0);
        let row = t.lines().nth(1).unwrap();
        assert!(row.starts_with("j7 "), "{row}");
        assert!(row.contains("resnet50-imagenet…"), "{row}");
        assert!(row.contains("watching"), "{row}");
        assert!(row.contains("node2[3]: node node2 is lost"), "{row}");
        assert!(row.contains("1m00s"), "{row}");
    }

    #[test]
    fn top_shows_nodes_categories_and_shares() {
        let node = NodeSummary {
            name: "node2".into(),
            status: NodeState::Ready,
            capacity: NodeCapacity::cpu_only(4.0, 8 << 30),
            address: String::new(),
            agent_version: String::new(),
            cpu_used_cores: 2.0,
            memory_used_bytes: 0,
            free_gpus: vec![],
            jobs: 1,
            last_report_age_s: 0.5,
            category_counts: [0, 0, 1, 0],
            can_dump: true,
        };
        let mut job = summary(JobState::Running);
        job.move_request = Some("node node2 asks: converged".into());
        let frame = top(&[node], &[job], "soonest", 0.0);
        assert!(frame.contains("1 nodes (1 ready, 0 lost)"), "{frame}");
        assert!(frame.contains("[#####.....]   2.0"), "{frame}");
        assert!(frame.contains("1 watch"), "{frame}");
        assert!(frame.contains("38%"), "{frame}");
        assert!(frame.contains("node2[3] (move asked)"), "{frame}");
    }
}
