//! `governor top`: a live per-cgroup view of CPU use and run-queue wait from the eBPF maps.
//!
//! When the daemon runs, `top` reads the maps of the programs it attached (found through the
//! kernel's list of loaded programs); otherwise it attaches its own for as long as it runs.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::accounting::{AccountingOptions, CgroupUsage, CpuAccounting, CpuSource};

/// Arguments of `governor top`.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// cgroup v2 mount to name cgroups from.
    #[arg(long, default_value = "/sys/fs/cgroup", env = "GOVERNOR_CGROUP_ROOT")]
    pub cgroup_root: PathBuf,
    /// Time between frames (e.g. `1s`, `500ms`).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print one frame (after one interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// Print frames as JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Show at most this many cgroups (busiest first).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Attach programs of its own even when the daemon's are loaded.
    #[arg(long)]
    pub own_programs: bool,
}

/// One cgroup's line of a frame.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TopRow {
    pub id: u64,
    /// Path relative to the cgroup root (`/` for the root), or `<id N>` if unknown.
    pub cgroup: String,
    /// CPU used over the interval, in % of one CPU.
    pub cpu_pct: f64,
    /// Time runnable but waiting for a CPU over the interval, in % of one CPU.
    pub wait_pct: f64,
    /// Context switches (switch-outs) per second.
    pub switches_per_s: f64,
    /// CPU seconds since accounting started.
    pub cpu_seconds_total: f64,
}

/// Rows of a frame from two samples `elapsed` apart, busiest first.
pub fn frame(
    before: &[CgroupUsage],
    after: &[CgroupUsage],
    elapsed: Duration,
    root: &Path,
) -> Vec<TopRow> {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let prev: HashMap<u64, &CgroupUsage> = before.iter().map(|u| (u.id, u)).collect();
    let mut rows: Vec<TopRow> = after
        .iter()
        .map(|u| {
            let p = prev.get(&u.id).map(|p| p.stats).unwrap_or_default();
            let d = |a: u64, b: u64| a.saturating_sub(b) as f64;
            TopRow {
                id: u.id,
                cgroup: match &u.path {
                    Some(path) => match path.strip_prefix(root) {
                        Ok(rel) if rel.as_os_str().is_empty() => "/".into(),
                        Ok(rel) => format!("/{}", rel.display()),
                        Err(_) => path.display().to_string(),
                    },
                    None => format!("<id {}>", u.id),
                },
                cpu_pct: d(u.stats.on_cpu_ns, p.on_cpu_ns) / 1e9 / secs * 100.0,
                wait_pct: d(u.stats.run_queue_wait_ns, p.run_queue_wait_ns) / 1e9 / secs * 100.0,
                switches_per_s: d(u.stats.context_switches, p.context_switches) / secs,
                cpu_seconds_total: u.stats.on_cpu_ns as f64 / 1e9,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.cpu_pct + b.wait_pct)
            .total_cmp(&(a.cpu_pct + a.wait_pct))
            .then(a.id.cmp(&b.id))
    });
    rows
}

fn render_table(out: &mut impl Write, header: &str, rows: &[TopRow]) -> std::io::Result<()> {
    writeln!(out, "{header}")?;
    writeln!(
        out,
        "{:>7} {:>7} {:>9} {:>11}  CGROUP",
        "CPU%", "WAIT%", "CSW/s", "CPU s"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:>7.1} {:>7.1} {:>9.0} {:>11.2}  {}",
            r.cpu_pct, r.wait_pct, r.switches_per_s, r.cpu_seconds_total, r.cgroup
        )?;
    }
    Ok(())
}

/// Run `governor top`.
pub fn run_top(args: TopArgs) -> ExitCode {
    let options = AccountingOptions::default();
    let mut acct = if args.own_programs {
        CpuAccounting::open(&args.cgroup_root, &options)
    } else {
        CpuAccounting::open_shared(&args.cgroup_root, &options)
    };
    if acct.source() != CpuSource::Ebpf {
        eprintln!(
            "governor top: needs the eBPF accounting programs, which are unavailable: {}",
            acct.fallback_reason().unwrap_or("unknown reason")
        );
        return ExitCode::FAILURE;
    }
    let header_base = format!("governor top: {}", acct.describe());
    let tty = std::io::stdout().is_terminal() && !args.json && !args.once;
    let mut before = acct.usage_by_cgroup();
    let mut t0 = Instant::now();
    loop {
        std::thread::sleep(args.interval);
        let after = acct.usage_by_cgroup();
        let elapsed = t0.elapsed();
        t0 = Instant::now();
        let mut rows = frame(&before, &after, elapsed, &args.cgroup_root);
        rows.truncate(args.limit);
        let mut out = std::io::stdout().lock();
        let written = if args.json {
            let line = serde_json::json!({
                "source": acct.source().as_str(),
                "describe": acct.describe(),
                "interval_s": elapsed.as_secs_f64(),
                "cgroups": rows,
            });
            writeln!(out, "{line}")
        } else {
            if tty {
                let _ = write!(out, "\x1b[H\x1b[2J");
            }
            let header = format!(
                "{header_base} | {:.2} s | CPU% and WAIT% of one CPU",
                elapsed.as_secs_f64()
            );
            render_table(&mut out, &header, &rows).and_then(|()| writeln!(out))
        };
        if written.and_then(|()| out.flush()).is_err() {
            // stdout closed (e.g. piped into `head`): stop quietly.
            return ExitCode::SUCCESS;
        }
        if args.once {
            return ExitCode::SUCCESS;
        }
        before = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::CgroupCpuStats;

    fn usage(id: u64, path: Option<&str>, on_cpu_ms: u64, wait_ms: u64, csw: u64) -> CgroupUsage {
        CgroupUsage {
            id,
            path: path.map(PathBuf::from),
            stats: CgroupCpuStats {
                on_cpu_ns: on_cpu_ms * 1_000_000,
                run_queue_wait_ns: wait_ms * 1_000_000,
                context_switches: csw,
            },
        }
    }

    #[test]
    fn frame_computes_rates_and_sorts_busiest_first() {
        let root = Path::new("/sys/fs/cgroup");
        let before = [
            usage(1, Some("/sys/fs/cgroup"), 0, 0, 0),
            usage(10, Some("/sys/fs/cgroup/job-a"), 1000, 0, 10),
            usage(11, Some("/sys/fs/cgroup/job-b"), 500, 100, 0),
        ];
        let after = [
            usage(1, Some("/sys/fs/cgroup"), 10, 0, 4),
            usage(10, Some("/sys/fs/cgroup/job-a"), 2000, 0, 30),
            usage(11, Some("/sys/fs/cgroup/job-b"), 700, 900, 10),
            usage(12, None, 100, 0, 1),
        ];
        let rows = frame(&before, &after, Duration::from_secs(2), root);
        let names: Vec<&str> = rows.iter().map(|r| r.cgroup.as_str()).collect();
        assert_eq!(names, ["/job-a", "/job-b", "<id 12>", "/"]);
        assert!((rows[0].cpu_pct - 50.0).abs() < 1e-9, "1 s of CPU in 2 s");
        assert!((rows[0].switches_per_s - 10.0).abs() < 1e-9);
        assert!((rows[1].cpu_pct - 10.0).abs() < 1e-9);
        assert!((rows[1].wait_pct - 40.0).abs() < 1e-9);
        assert!(
            (rows[2].cpu_pct - 5.0).abs() < 1e-9,
            "new cgroup: counted from zero"
        );
        assert!((rows[0].cpu_seconds_total - 2.0).abs() < 1e-9);
    }

    #[test]
    fn table_has_a_header_and_one_line_per_row() {
        let rows = frame(
            &[],
            &[usage(10, Some("/cg/job"), 1500, 250, 3)],
            Duration::from_secs(1),
            Path::new("/cg"),
        );
        let mut buf = Vec::new();
        render_table(&mut buf, "head", &rows).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].contains("CPU%") && lines[1].contains("CGROUP"));
        assert!(
            lines[2].contains("150.0") && lines[2].contains("25.0") && lines[2].ends_with("/job"),
            "{text}"
        );
    }
}
