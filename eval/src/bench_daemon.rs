//! `cargo xtask bench-daemon`: CPU and memory of the real `governor daemon` governing 1,000
//! simulated jobs.
//!
//! Everything lives in `/dev/shm/governor-bench-daemon-<pid>/` (tmpfs): a fake cgroup v2 root
//! (plain files laid out like cgroupfs, as `governor::cgroup::fake::FakeCgroupRoot` makes them:
//! the daemon never touches the real `/sys/fs/cgroup`), one declared job file per job
//! (`jobs.d/*.toml`), one Keras CSV log per job, the configuration, state file and control
//! socket. The release daemon (what a node runs) is started on it as root, then:
//!
//! 1. start-up: until `governor status` shows every job (time and CPU reported);
//! 2. idle (`--idle-seconds`): no log line written; the cgroups' `cpu.stat` and `memory.current`
//!    still advance every second, as running jobs' do;
//! 3. busy (`--seconds`): each job appends one row to its log every `--min-interval` to
//!    `--max-interval` seconds (uniformly random: 1-10 s gives ~180 lines/s for 1,000 jobs).
//!
//! With `--log-format tensorboard` each job's log is instead a TensorBoard log directory, as
//! Keras' callback writes one: `train/` and `validation/` event files, declared as the directory;
//! a "row" is one event (`epoch_loss` at the next step, `simple_value`) appended to `train/`, and
//! every tenth row one more to `validation/`: the daemon follows 2,000 event files under 1,000
//! directories.
//!
//! The daemon's CPU time (`/proc/<pid>/stat` utime + stime, all threads) is read at the phase
//! boundaries, its RSS (`VmRSS`) every second and its peak (`VmHWM`) at the end. At the end
//! `governor status --json` must show every job governed and every row written delivered as a
//! record. The daemon is stopped with SIGTERM and the directory removed, also on failure
//! (directories left by a killed run are removed by the next one).
//!
//! Prints a table and writes `target/bench/daemon.json`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use governor_testbed::cmd;
use serde_json::{Value, json};

use crate::procfs;
use bed::{Bed, remove_stale_dirs};

mod bed;

/// Arguments of `cargo xtask bench-daemon`.
#[derive(Debug, clap::Args)]
pub struct BenchDaemonArgs {
    /// Node policy the daemon runs (any name `governor daemon --policy` accepts).
    #[arg(long, default_value = "fair")]
    pub policy: String,
    /// Simulated jobs.
    #[arg(long, default_value_t = 1000)]
    pub jobs: usize,
    /// Seconds of the busy phase (log rows written).
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Seconds of the idle phase before it (no log row written); 0 skips it.
    #[arg(long, default_value_t = 30)]
    pub idle_seconds: u64,
    /// Shortest interval between two rows of one job, in seconds.
    #[arg(long, default_value_t = 1.0)]
    pub min_interval: f64,
    /// Longest interval between two rows of one job, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub max_interval: f64,
    /// Measure the dev build (target/debug) instead of the release build.
    #[arg(long)]
    pub dev: bool,
    /// Start the daemon with this soft limit on open files (systemd's default for services is
    /// 1024); default: inherit.
    #[arg(long)]
    pub nofile: Option<u64>,
    /// Run the daemon under this command, e.g. `valgrind --tool=callgrind` (profiling; the
    /// figures then describe the wrapper).
    #[arg(long)]
    pub wrap: Option<String>,
    /// What the jobs log: `csv` (a Keras CSV file each) or `tensorboard` (a log directory of
    /// event files each).
    #[arg(long, value_enum, default_value = "csv")]
    pub log_format: LogFormat,
}

/// The simulated jobs' logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Csv,
    Tensorboard,
}

pub fn run(args: &BenchDaemonArgs) -> Result<()> {
    ensure!(args.jobs > 0, "--jobs must be positive");
    ensure!(
        args.min_interval > 0.0 && args.max_interval >= args.min_interval,
        "need 0 < --min-interval <= --max-interval"
    );
    ensure!(
        cmd::is_root(),
        "run as root (the daemon needs root for the process connector and its checks)"
    );
    // Setup brings the eBPF toolchain for the daemon's build; a build without the eBPF program
    // (GOVERNOR_EBPF_BUILD=skip: the figures then leave out its accounting) needs none of it.
    if std::env::var("GOVERNOR_EBPF_BUILD").as_deref() != Ok("skip") {
        governor_testbed::setup::run()?;
    }
    let profile = if args.dev { "dev" } else { "release" };
    eprintln!("== building the governor ({profile})");
    let mut build = cmd::cargo();
    build.args(["build", "-p", "governor", "--bin", "governor"]);
    if !args.dev {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let bin = cmd::target_dir()
        .join(if args.dev { "debug" } else { "release" })
        .join("governor");

    remove_stale_dirs();
    let mut bed = Bed::create(args)?;
    let result = measure(args, &bin, &mut bed, profile);
    let stopped = bed.stop_daemon();
    let result = result.and_then(|mut r| {
        let status = stopped?;
        r["daemon_exit"] = json!(status);
        ensure!(
            status == "exit status: 0",
            "the daemon did not stop cleanly ({status}); log tail:\n{}",
            bed.log_tail()
        );
        Ok(r)
    });
    if result.is_err() {
        eprintln!("daemon log tail:\n{}", bed.log_tail());
    }
    drop(bed);
    let result = result?;
    let out = cmd::target_dir().join("bench/daemon.json");
    fs::create_dir_all(out.parent().unwrap())?;
    fs::write(&out, serde_json::to_string_pretty(&result)? + "\n")?;
    print_table(&result);
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// A small deterministic PRNG (SplitMix64): reproducible schedules without a dependency.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The daemon's cumulative CPU time (user + system, all threads).
fn cpu_seconds(pid: u32) -> Result<f64> {
    procfs::cpu_seconds(pid).with_context(|| format!("the daemon (pid {pid}) is gone"))
}

/// The daemon's `VmRSS` and `VmHWM` in KiB.
fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    procfs::memory_kib(pid).with_context(|| format!("the daemon (pid {pid}) is gone"))
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// What one phase measured.
struct Phase {
    seconds: f64,
    cpu_seconds: f64,
    rss_kib: Vec<u64>,
    rows: u64,
    load_before: String,
    load_after: String,
}

impl Phase {
    fn json(&self) -> Value {
        let mut rss = self.rss_kib.clone();
        rss.sort_unstable();
        let median = rss.get(rss.len() / 2).copied().unwrap_or(0);
        json!({
            "seconds": round(self.seconds, 2),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "cpu_percent_of_one_core": round(100.0 * self.cpu_seconds / self.seconds, 3),
            "rss_mib_median": round(median as f64 / 1024.0, 1),
            "rss_mib_max": round(rss.last().copied().unwrap_or(0) as f64 / 1024.0, 1),
            "rows_written": self.rows,
            "rows_per_second": round(self.rows as f64 / self.seconds, 1),
            "load_average_before": self.load_before,
            "load_average_after": self.load_after,
        })
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// Run one phase: rows written on the schedule if `busy`, counters advanced and RSS sampled
/// every second.
fn phase(bed: &mut Bed, pid: u32, seconds: u64, busy: Option<(f64, f64)>) -> Result<Phase> {
    let load_before = load_average();
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let cpu0 = cpu_seconds(pid)?;
    // (due, job), soonest first; first rows spread over one longest interval.
    let mut schedule = BinaryHeap::new();
    if let Some((_, max)) = busy {
        for k in 0..bed.jobs.len() {
            let due = start + Duration::from_secs_f64(max * bed.rng.unit());
            schedule.push(Reverse((due, k)));
        }
    }
    let mut rows = 0;
    let mut rss = Vec::new();
    let mut last_counters = start;
    let mut next_second = start + Duration::from_secs(1);
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        while let Some(&Reverse((due, k))) = schedule.peek() {
            if due > now {
                break;
            }
            schedule.pop();
            bed.write_row(k)?;
            rows += 1;
            let (min, max) = busy.expect("a schedule only when busy");
            let next = due + Duration::from_secs_f64(min + (max - min) * bed.rng.unit());
            schedule.push(Reverse((next, k)));
        }
        if now >= next_second {
            ensure!(bed.daemon_alive(), "the daemon exited during the run");
            bed.advance_counters(now - last_counters)?;
            last_counters = now;
            rss.push(memory_kib(pid)?.0);
            next_second += Duration::from_secs(1);
        }
        let wake = schedule
            .peek()
            .map(|Reverse((due, _))| *due)
            .unwrap_or(end)
            .min(next_second)
            .min(end);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
    let cpu1 = cpu_seconds(pid)?;
    Ok(Phase {
        seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: cpu1 - cpu0,
        rss_kib: rss,
        rows,
        load_before,
        load_after: load_average(),
    })
}

fn measure(args: &BenchDaemonArgs, bin: &Path, bed: &mut Bed, profile: &str) -> Result<Value> {
    let load_at_start = load_average();
    eprintln!(
        "== {} jobs in {}; policy {}; load average {load_at_start}",
        args.jobs,
        bed.dir.display(),
        args.policy
    );
    let started = Instant::now();
    let pid = bed.start_daemon(bin, args)?;

    // 1. Start-up: until every job is governed.
    let deadline = started + Duration::from_secs(180);
    let governed = loop {
        ensure!(
            bed.daemon_alive(),
            "the daemon exited at start-up; log tail:\n{}",
            bed.log_tail()
        );
        if let Some(s) = bed.status(bin) {
            let n = governed_jobs(&s, bed);
            if n == bed.jobs.len() {
                break n;
            }
        }
        ensure!(
            Instant::now() < deadline,
            "not every job was governed within 180 s; log tail:\n{}",
            bed.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let startup_seconds = started.elapsed().as_secs_f64();
    let startup_cpu = cpu_seconds(pid)?;
    let (startup_rss, _) = memory_kib(pid)?;
    eprintln!(
        "   {governed} jobs governed after {startup_seconds:.2} s ({startup_cpu:.2} s CPU, RSS {:.1} MiB)",
        startup_rss as f64 / 1024.0
    );
    // Let the start-up's last decisions and the status requests settle.
    std::thread::sleep(Duration::from_secs(2));

    // 2. Idle, 3. busy.
    let idle = if args.idle_seconds > 0 {
        eprintln!("== idle: {} s without log rows", args.idle_seconds);
        let p = phase(bed, pid, args.idle_seconds, None)?;
        eprintln!(
            "   CPU {:.3}% of one core",
            100.0 * p.cpu_seconds / p.seconds
        );
        Some(p)
    } else {
        None
    };
    eprintln!(
        "== busy: {} s, one row per job every {}-{} s",
        args.seconds, args.min_interval, args.max_interval
    );
    let busy = phase(
        bed,
        pid,
        args.seconds,
        Some((args.min_interval, args.max_interval)),
    )?;
    eprintln!(
        "   CPU {:.3}% of one core, {} rows",
        100.0 * busy.cpu_seconds / busy.seconds,
        busy.rows
    );
    let (rss_end, hwm) = memory_kib(pid)?;

    // Every row delivered? The watcher may still be draining the last ones.
    let rows_written: u64 = bed.jobs.iter().map(|j| j.records).sum();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, records) = loop {
        let s = bed.status(bin).context("the daemon stopped answering")?;
        let records = declared_records(&s, bed);
        if records >= rows_written || Instant::now() > deadline {
            break (s, records);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let governed = governed_jobs(&status, bed);
    let with_records = bed
        .jobs
        .iter()
        .filter(|j| job_status(&status, &j.name).is_some_and(|s| s["records"].as_u64() > Some(0)))
        .count();
    let problems: Vec<String> = status["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| {
            j["log_problem"]
                .as_str()
                .map(|p| format!("{}: {p}", j["name"]))
        })
        .take(5)
        .collect();
    ensure!(
        governed == bed.jobs.len(),
        "only {governed} of {} jobs are governed at the end",
        bed.jobs.len()
    );
    ensure!(problems.is_empty(), "log problems reported: {problems:?}");
    ensure!(
        records == rows_written,
        "{rows_written} rows written but {records} records delivered"
    );
    let jobs_with_rows = bed.jobs.iter().filter(|j| j.rows > 0).count();
    ensure!(
        with_records == jobs_with_rows,
        "{jobs_with_rows} jobs logged rows but {with_records} have records in status"
    );

    let mut result = json!({
        "command": format!("cargo xtask bench-daemon --policy {} --jobs {} --seconds {} --idle-seconds {} --min-interval {} --max-interval {}{}{}",
            args.policy, args.jobs, args.seconds, args.idle_seconds, args.min_interval, args.max_interval,
            if args.dev { " --dev" } else { "" },
            args.nofile.map(|n| format!(" --nofile {n}")).unwrap_or_default()),
        "build": profile,
        "policy": args.policy,
        "jobs": args.jobs,
        "machine": {
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "load_average_at_start": load_at_start,
            "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        },
        "startup": {
            "seconds_until_all_governed": round(startup_seconds, 2),
            "cpu_seconds": round(startup_cpu, 3),
            "rss_mib": round(startup_rss as f64 / 1024.0, 1),
        },
        "busy": busy.json(),
        "rss_mib_end": round(rss_end as f64 / 1024.0, 1),
        "rss_mib_peak": round(hwm as f64 / 1024.0, 1),
        "status": {
            "cpu_source": status["cpu_source"],
            "cpu_source_note": status["cpu_source_note"],
            "jobs_governed": governed,
            "jobs_with_records": with_records,
            "records_delivered": records,
            "rows_written": rows_written,
        },
        "goals": {
            "cpu_percent_of_one_core_below": 2.0,
            "rss_mib_below": 50.0,
        },
    });
    if let Some(idle) = idle {
        result["idle"] = idle.json();
        if busy.rows > 0 {
            let extra = busy.cpu_seconds / busy.seconds - idle.cpu_seconds / idle.seconds;
            result["busy"]["cpu_microseconds_per_row_above_idle"] =
                json!(round(1e6 * extra / (busy.rows as f64 / busy.seconds), 1));
        }
    }
    Ok(result)
}

fn job_status<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["jobs"]
        .as_array()?
        .iter()
        .find(|j| j["name"].as_str() == Some(name))
}

/// How many of the bench's jobs the status shows (the host's own GOVERNOR_LOG processes, if
/// any, are not counted).
fn governed_jobs(status: &Value, bed: &Bed) -> usize {
    let names: std::collections::HashSet<&str> = status["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j["name"].as_str())
        .collect();
    bed.jobs
        .iter()
        .filter(|j| names.contains(j.name.as_str()))
        .count()
}

fn declared_records(status: &Value, bed: &Bed) -> u64 {
    bed.jobs
        .iter()
        .filter_map(|j| job_status(status, &j.name)?["records"].as_u64())
        .sum()
}

/// A JSON value as plain text (strings unquoted), for the table.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

fn print_table(r: &Value) {
    println!();
    println!(
        "governor daemon, {} jobs, policy {}, {} build, {} CPUs, load average at start {}",
        text(&r["jobs"]),
        text(&r["policy"]),
        text(&r["build"]),
        text(&r["machine"]["cpus"]),
        text(&r["machine"]["load_average_at_start"])
    );
    println!(
        "{:<6} {:>8} {:>8} {:>13} {:>12} {:>12} {:>16}",
        "phase",
        "seconds",
        "rows/s",
        "CPU % 1 core",
        "RSS MiB med",
        "RSS MiB max",
        "load avg after"
    );
    for name in ["idle", "busy"] {
        let p = &r[name];
        if p.is_null() {
            continue;
        }
        println!(
            "{:<6} {:>8} {:>8} {:>13} {:>12} {:>12} {:>16}",
            name,
            text(&p["seconds"]),
            text(&p["rows_per_second"]),
            text(&p["cpu_percent_of_one_core"]),
            text(&p["rss_mib_median"]),
            text(&p["rss_mib_max"]),
            text(&p["load_average_after"])
        );
    }
    println!(
        "start-up: all governed after {} s, {} s CPU; RSS at end {} MiB, peak (VmHWM) {} MiB",
        text(&r["startup"]["seconds_until_all_governed"]),
        text(&r["startup"]["cpu_seconds"]),
        text(&r["rss_mib_end"]),
        text(&r["rss_mib_peak"])
    );
    if let Some(us) = r["busy"]["cpu_microseconds_per_row_above_idle"].as_f64() {
        println!("CPU per log row (busy minus idle): {us} µs");
    }
    println!(
        "status: {} jobs governed, {} with records, {} records for {} rows written",
        text(&r["status"]["jobs_governed"]),
        text(&r["status"]["jobs_with_records"]),
        text(&r["status"]["records_delivered"]),
        text(&r["status"]["rows_written"])
    );
    println!(
        "CPU source: {} {}",
        text(&r["status"]["cpu_source"]),
        text(&r["status"]["cpu_source_note"])
    );
    println!("goals: < 2% of one core, < 50 MiB RSS");
}

#[cfg(test)]
#[path = "bench_daemon_tests.rs"]
mod tests;
