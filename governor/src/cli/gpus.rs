//! `governor gpus`: a read-only check of a node's GPUs through NVML, for a machine with a real
//! GPU (or the stand-in): the inventory, each compute process with its cgroup (the attribution
//! the daemon makes), and the energy counter over an interval. It never changes a device
//! setting: every call it makes is a read ([`crate::gpu::device::GpuDevices::snapshot`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::gpu::device::{GpuDevices, NvmlDevices};

/// Arguments of `governor gpus`.
#[derive(Debug, clap::Args)]
pub struct GpusArgs {
    /// The NVML library to load (default: the driver's `libnvidia-ml.so.1`).
    #[arg(long)]
    pub nvml_library: Option<PathBuf>,
    /// How long to watch the energy counters.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The cgroup of `pid` (its v2 line, else its v1 cpu controller's).
fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.is_empty() {
            return Some(path.to_owned());
        }
        if controllers.split(',').any(|c| c == "cpu") {
            v1 = Some(path.to_owned());
        }
    }
    v1
}

pub fn run(args: GpusArgs) -> ExitCode {
    let nvml = match crate::gpu::open_nvml(args.nvml_library.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("governor gpus: NVML does not load: {e}");
            return ExitCode::FAILURE;
        }
    };
    let devices = NvmlDevices(nvml);
    let count = match devices.count() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("governor gpus: NVML cannot count the GPUs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let first: Vec<_> = (0..count).map(|i| devices.snapshot(i)).collect();
    std::thread::sleep(args.interval);
    let mut out = Vec::new();
    for (i, before) in first.into_iter().enumerate() {
        let after = devices.snapshot(i as u32);
        let (before, after) = match (before, after) {
            (Ok(b), Ok(a)) => (b, a),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("gpu {i}: cannot be read: {e}");
                continue;
            }
        };
        let energy_j = match (before.energy_mj, after.energy_mj) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / 1000.0),
            _ => None,
        };
        let processes: Vec<serde_json::Value> = after
            .processes
            .iter()
            .map(|&(pid, bytes)| {
                serde_json::json!({
                    "pid": pid,
                    "gpu_memory_bytes": bytes,
                    "cgroup": cgroup_of(pid),
                })
            })
            .collect();
        out.push(serde_json::json!({
            "index": i,
            "uuid": after.uuid,
            "model": after.model,
            "mig": after.mig,
            "utilization_percent": after.utilization_percent,
            "memory_used_bytes": after.memory_used_bytes,
            "memory_total_bytes": after.memory_total_bytes,
            "power_watts": after.power_mw.map(|p| f64::from(p) / 1000.0),
            "limit_watts": after.limit_mw.map(|p| f64::from(p) / 1000.0),
            "default_limit_watts": after.default_limit_mw.map(|p| f64::from(p) / 1000.0),
            "min_limit_watts": after.min_limit_mw.map(|p| f64::from(p) / 1000.0),
            "energy_joules_over_interval": energy_j,
            "interval_s": args.interval.as_secs_f64(),
            "processes": processes,
        }));
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).unwrap_or_else(|_| "[]".into())
        );
        return ExitCode::SUCCESS;
    }
    if out.is_empty() {
        println!("no GPUs");
    }
    for g in &out {
        println!(
            "gpu {} {} ({}){}: util {}%, memory {}/{} bytes, power {} W of limit {} W (default {} W, min {} W), {} J over {:.1} s",
            g["index"],
            g["model"].as_str().unwrap_or_default(),
            g["uuid"].as_str().unwrap_or_default(),
            if g["mig"] == true { " [MIG]" } else { "" },
            g["utilization_percent"],
            g["memory_used_bytes"],
            g["memory_total_bytes"],
            g["power_watts"],
            g["limit_watts"],
            g["default_limit_watts"],
            g["min_limit_watts"],
            g["energy_joules_over_interval"],
            args.interval.as_secs_f64(),
        );
        for p in g["processes"].as_array().into_iter().flatten() {
            println!(
                "  pid {} uses {} bytes, cgroup {}",
                p["pid"],
                p["gpu_memory_bytes"],
                p["cgroup"].as_str().unwrap_or("(gone)")
            );
        }
    }
    ExitCode::SUCCESS
}
