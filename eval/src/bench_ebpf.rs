//! `cargo xtask bench-ebpf`: overhead of the eBPF CPU accounting per event (the kernel's own
//! BPF statistics, `run_time_ns / run_cnt` per program) under a context-switch-heavy load, and
//! the cost of reading 1,000 cgroups, on the host and in the VM.
//!
//! The measuring program is `ebpf-bench` (tests/src/bin/ebpf-bench.rs, built in release): this
//! crate (like xtask) must not depend on the governor crate, whose build needs the tools `setup`
//! installs.
//! Under TCG every instruction is emulated, so the VM's ns/event is far above the host's: both
//! are reported as measured.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use governor_testbed::{cmd, setup, vm};
use serde_json::Value;

/// Arguments of `cargo xtask bench-ebpf`.
#[derive(Debug, clap::Args)]
pub struct BenchEbpfArgs {
    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Runs of each configuration on the host (interleaved; medians are reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Runs of each configuration in the VM (under TCG one round takes minutes).
    #[arg(long, default_value_t = 1)]
    pub vm_repeat: usize,
    /// Cgroups for the read-cost measurement.
    #[arg(long, default_value_t = 1000)]
    pub cgroups: usize,
    /// Only measure on the host.
    #[arg(long, conflicts_with = "no_host")]
    pub no_vm: bool,
    /// Only measure in the VM.
    #[arg(long)]
    pub no_host: bool,
}

pub fn run(args: &BenchEbpfArgs) -> Result<()> {
    let bed = setup::run()?;
    eprintln!("== building ebpf-bench (release)");
    cmd::run(cmd::cargo().args([
        "build",
        "--release",
        "-p",
        "governor-integration-tests",
        "--bin",
        "ebpf-bench",
    ]))?;
    let bin = cmd::target_dir().join("release/ebpf-bench");
    let bench_args = |repeat: usize| {
        format!(
            "--seconds {} --repeat {repeat} --cgroups {}",
            args.seconds, args.cgroups
        )
    };
    let mut results = serde_json::Map::new();

    if !args.no_host {
        if !cmd::is_root() {
            bail!(
                "bench-ebpf loads eBPF programs and creates cgroups: run it as root (or pass --no-host)"
            );
        }
        let root = host_cgroup2_root()?;
        eprintln!(
            "== host: {} (cgroup v2 at {})",
            bin.display(),
            root.display()
        );
        let out = cmd::output(
            Command::new(&bin)
                .args(bench_args(args.repeat).split_whitespace())
                .arg("--cgroup-root")
                .arg(&root),
        )?;
        results.insert("host".into(), parse(&out, "host")?);
    }
    if !args.no_vm {
        eprintln!("== VM: {} under TCG", bed.kernel_release);
        let out = vm::run_guest_command_for(
            &bed,
            "bench-ebpf",
            &format!(
                "{} {} --cgroup-root /sys/fs/cgroup",
                bin.display(),
                bench_args(args.vm_repeat)
            ),
            Duration::from_secs(1800),
        )?;
        results.insert("vm".into(), parse(&out, "VM")?);
    }

    let report = Value::Object(results);
    print_report(&report);
    let path = cmd::target_dir().join("bench-ebpf.json");
    fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("\n== results written to {}", path.display());
    Ok(())
}

/// The host's cgroup v2 mount: `/sys/fs/cgroup` on a v2 host, `/sys/fs/cgroup/unified` on a
/// hybrid one (the development machines).
fn host_cgroup2_root() -> Result<PathBuf> {
    for dir in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        if Path::new(dir).join("cgroup.controllers").exists() {
            return Ok(PathBuf::from(dir));
        }
    }
    bail!("no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

fn parse(out: &str, place: &str) -> Result<Value> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("ebpf-bench printed no JSON on the {place}: {out}"))?;
    serde_json::from_str(line).with_context(|| format!("bad JSON from ebpf-bench on the {place}"))
}

fn print_report(report: &Value) {
    println!(
        "\neBPF CPU accounting: sched_switch program cost (kernel BPF stats: run_time_ns / run_cnt)"
    );
    println!(
        "{:<6} {:<20} {:<15} {:>12} {:>12} {:>11} {:>14}",
        "where", "program", "load", "ns/ev (med)", "ns/ev (min)", "events/s", "load cost (%)"
    );
    for (place, r) in report.as_object().into_iter().flatten() {
        for config in ["tp_btf", "raw_tp", "tp_btf_without_wait"] {
            for load in ["same_cgroup", "across_cgroups"] {
                let f = &r[config][load];
                if let Some(e) = f.get("error") {
                    println!("{place:<6} {config:<20} {load:<15} error: {e}");
                    continue;
                }
                println!(
                    "{:<6} {:<20} {:<15} {:>12.0} {:>12.0} {:>11.0} {:>14.1}",
                    place,
                    config,
                    load,
                    f["ns_per_event_median"].as_f64().unwrap_or(f64::NAN),
                    f["ns_per_event_min"].as_f64().unwrap_or(f64::NAN),
                    f["events_per_s_median"].as_f64().unwrap_or(f64::NAN),
                    f["throughput_cost_pct"].as_f64().unwrap_or(f64::NAN),
                );
            }
        }
    }
    println!("\nRead cost: CpuAccounting::read of N cgroups with map entries");
    for (place, r) in report.as_object().into_iter().flatten() {
        let rc = &r["read_cost"];
        if let Some(e) = rc.get("error") {
            println!("{place:<6} error: {e}");
            continue;
        }
        for source in ["ebpf", "cpu_stat_fallback"] {
            let s = &rc[source];
            println!(
                "{place:<6} {source:<18} {} cgroups: first {:.2} ms, mean {:.2} ms, p50 {:.2} ms, max {:.2} ms per read ({:.2}% of a CPU at 4 reads/s)",
                rc["cgroups"],
                s["first_read_ms"].as_f64().unwrap_or(f64::NAN),
                s["read_ms_mean"].as_f64().unwrap_or(f64::NAN),
                s["read_ms_p50"].as_f64().unwrap_or(f64::NAN),
                s["read_ms_max"].as_f64().unwrap_or(f64::NAN),
                s["cpu_pct_at_4_reads_per_s"].as_f64().unwrap_or(f64::NAN),
            );
        }
    }
    for (place, r) in report.as_object().into_iter().flatten() {
        println!(
            "{place}: kernel {}, {} CPUs, {} runs of {} s each; baseline round trips/s: {}",
            r["kernel"].as_str().unwrap_or("?"),
            r["cpus"],
            r["runs"],
            r["seconds_per_run"],
            r["baseline_round_trips_per_s"]
        );
    }
}
