//! `ebpf-bench`: overhead and read cost of the eBPF CPU accounting, run by `cargo xtask
//! bench-ebpf` on the host and inside the VM (root required).
//!
//! 1. Overhead per event, from the kernel's own BPF statistics (`BPF_ENABLE_STATS`, the
//!    mechanism behind `kernel.bpf_stats_enabled=1`: `run_time_ns / run_cnt` per program), under
//!    a context-switch-heavy load: one pair of threads per CPU, pinned to it, ping-ponging a
//!    byte through two pipes. The load's round trips per second with and without the programs
//!    give the end-to-end cost. Measured for the BTF (`tp_btf`) and raw (`raw_tp`) families.
//! 2. Read cost: `CpuAccounting::read` of N cgroups that all have map entries (the process hops
//!    through N freshly created groups so each gets one), against the cgroupfs fallback.
//!
//! Prints one JSON object on stdout; progress on stderr.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::accounting::{AccountingOptions, AttachMode, CpuAccounting, CpuSource};
use serde_json::{Value, json};

struct Args {
    seconds: f64,
    cgroups: usize,
    cgroup_root: PathBuf,
}

fn parse_args() -> Args {
    let mut args = Args {
        seconds: 5.0,
        cgroups: 1000,
        cgroup_root: PathBuf::from("/sys/fs/cgroup"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--seconds" => args.seconds = value().parse().unwrap_or_else(|_| usage("--seconds")),
            "--cgroups" => args.cgroups = value().parse().unwrap_or_else(|_| usage("--cgroups")),
            "--cgroup-root" => args.cgroup_root = PathBuf::from(value()),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    args
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "ebpf-bench: {msg}\nusage: ebpf-bench [--seconds S] [--cgroups N] [--cgroup-root DIR]"
    );
    std::process::exit(2)
}

/// Runs the ping-pong load for `d`; returns round trips per second.
fn pingpong(d: Duration) -> f64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = Arc::new(AtomicBool::new(false));
    let trips = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for cpu in 0..cpus {
        let (mut ab_r, mut ab_w) = std::io::pipe().expect("pipe");
        let (mut ba_r, mut ba_w) = std::io::pipe().expect("pipe");
        let (stop_a, trips_a) = (stop.clone(), trips.clone());
        handles.push(std::thread::spawn(move || {
            pin(cpu);
            let mut b = [0u8; 1];
            let mut n = 0u64;
            while !stop_a.load(Ordering::Relaxed) {
                if ab_w.write_all(b"x").is_err() || ba_r.read_exact(&mut b).is_err() {
                    break;
                }
                n += 1;
            }
            trips_a.fetch_add(n, Ordering::Relaxed);
            // Dropping `ab_w` ends the partner's loop.
        }));
        handles.push(std::thread::spawn(move || {
            pin(cpu);
            let mut b = [0u8; 1];
            while ab_r.read_exact(&mut b).is_ok() {
                if ba_w.write_all(b"y").is_err() {
                    break;
                }
            }
        }));
    }
    let t0 = Instant::now();
    std::thread::sleep(d);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("load thread panicked");
    }
    trips.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// (run_time_ns, run_cnt) of a loaded program.
fn prog_stats(id: u32) -> Option<(u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .map(|p| (p.run_time().as_nanos() as u64, p.run_count()))
}

fn overhead(args: &Args, attach: AttachMode, baseline_rps: f64) -> Value {
    let acct = CpuAccounting::open(
        &args.cgroup_root,
        &AccountingOptions {
            attach,
            ..AccountingOptions::default()
        },
    );
    if acct.source() != CpuSource::Ebpf {
        return json!({"error": acct.fallback_reason()});
    }
    let family = acct.attach_kind().map(|k| k.as_str()).unwrap_or("?");
    let ids = acct.program_ids();
    let _stats_fd = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => fd,
        Err(e) => return json!({"error": format!("BPF_ENABLE_STATS failed: {e}")}),
    };
    let before: Vec<Option<(u64, u64)>> = ids.iter().map(|(_, id)| prog_stats(*id)).collect();
    let t0 = Instant::now();
    let rps = pingpong(Duration::from_secs_f64(args.seconds));
    let elapsed = t0.elapsed().as_secs_f64();
    let mut programs = serde_json::Map::new();
    for ((name, id), b) in ids.iter().zip(before) {
        let (Some((t0, c0)), Some((t1, c1))) = (b, prog_stats(*id)) else {
            continue;
        };
        let (dt, dc) = (t1 - t0, c1 - c0);
        programs.insert(
            name.clone(),
            json!({
                "events": dc,
                "events_per_s": dc as f64 / elapsed,
                "ns_per_event": if dc > 0 { dt as f64 / dc as f64 } else { 0.0 },
            }),
        );
    }
    let result = json!({
        "family": family,
        "seconds": elapsed,
        "programs": programs,
        "pingpong_round_trips_per_s": rps,
        "throughput_cost_pct": (1.0 - rps / baseline_rps) * 100.0,
    });
    eprintln!("ebpf-bench: {family}: {result}");
    result
}

/// The process's own cgroup v2 directory.
fn own_cgroup(root: &Path) -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("no cgroup v2 line in /proc/self/cgroup");
    root.join(rel.trim_start_matches('/'))
}

/// Creates `n` groups, removes them (after moving the process back) when dropped.
struct BenchGroups {
    parent: PathBuf,
    children: Vec<PathBuf>,
    home: PathBuf,
}

impl Drop for BenchGroups {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.home.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        for c in &self.children {
            let _ = std::fs::remove_dir(c);
        }
        if let Err(e) = std::fs::remove_dir(&self.parent) {
            eprintln!("ebpf-bench: cannot remove {}: {e}", self.parent.display());
        }
    }
}

fn read_cost(args: &Args) -> Value {
    let root = &args.cgroup_root;
    let mut groups = BenchGroups {
        parent: root.join(format!("governor-bench-{}", std::process::id())),
        children: Vec::new(),
        home: own_cgroup(root),
    };
    std::fs::create_dir(&groups.parent).expect("create the bench parent group");
    let mut acct = CpuAccounting::open(root, &AccountingOptions::default());
    if acct.source() != CpuSource::Ebpf {
        return json!({"error": acct.fallback_reason()});
    }
    let t0 = Instant::now();
    for i in 0..args.cgroups {
        let c = groups.parent.join(format!("g{i:05}"));
        std::fs::create_dir(&c).expect("create a bench group");
        groups.children.push(c.clone());
        // Run here for a moment: the switch-out creates the group's map entry.
        std::fs::write(c.join("cgroup.procs"), std::process::id().to_string())
            .expect("move into a bench group");
        std::thread::sleep(Duration::from_micros(20));
    }
    std::fs::write(
        groups.home.join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .expect("move back home");
    eprintln!(
        "ebpf-bench: {} groups created and visited in {:.2} s",
        args.cgroups,
        t0.elapsed().as_secs_f64()
    );
    let paths = groups.children.clone();
    let map_entries = acct.tracked_cgroup_ids().map_or(0, |v| v.len());
    let measure = |acct: &mut CpuAccounting| -> (Value, usize) {
        let first_t = Instant::now();
        let first = acct.read(&paths);
        let first_ms = first_t.elapsed().as_secs_f64() * 1e3;
        let mut samples = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let r = acct.read(&paths);
            samples.push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(r);
        }
        samples.sort_by(f64::total_cmp);
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        (
            json!({
                "first_read_ms": first_ms,
                "read_ms_mean": mean,
                "read_ms_p50": samples[samples.len() / 2],
                "read_ms_max": samples[samples.len() - 1],
                "cpu_pct_at_4_reads_per_s": mean * 4.0 / 1e3 * 100.0,
            }),
            first.len(),
        )
    };
    let (ebpf, found) = measure(&mut acct);
    let with_entries = acct
        .read(&paths)
        .iter()
        .filter(|r| r.context_switches.unwrap_or(0) > 0)
        .count();
    drop(acct);
    let mut fallback_acct = CpuAccounting::open(
        root,
        &AccountingOptions {
            disable_ebpf: true,
            ..AccountingOptions::default()
        },
    );
    let (fallback, _) = measure(&mut fallback_acct);
    let result = json!({
        "cgroups": args.cgroups,
        "map_entries": map_entries,
        "readings": found,
        "readings_with_switches": with_entries,
        "ebpf": ebpf,
        "cpu_stat_fallback": fallback,
    });
    eprintln!("ebpf-bench: read cost: {result}");
    result
}

fn main() {
    let args = parse_args();
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "ebpf-bench: kernel {kernel}, {cpus} CPUs, {} s per run",
        args.seconds
    );
    let baseline = pingpong(Duration::from_secs_f64(args.seconds));
    eprintln!("ebpf-bench: baseline ping-pong {baseline:.0} round trips/s");
    let btf = overhead(&args, AttachMode::Btf, baseline);
    let raw = overhead(&args, AttachMode::Raw, baseline);
    let read = read_cost(&args);
    let out = json!({
        "kernel": kernel,
        "cpus": cpus,
        "baseline_round_trips_per_s": baseline,
        "tp_btf": btf,
        "raw_tp": raw,
        "read_cost": read,
    });
    println!("{out}");
}
