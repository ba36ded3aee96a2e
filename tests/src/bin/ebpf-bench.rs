//! `ebpf-bench`: overhead and read cost of the eBPF CPU accounting, run by `cargo xtask
//! bench-ebpf` on the host and inside the VM (root required).
//!
//! 1. Overhead per event, from the kernel's own BPF statistics (`BPF_ENABLE_STATS`, the
//!    mechanism behind `kernel.bpf_stats_enabled=1`: `run_time_ns / run_cnt` of the program), under
//!    a context-switch-heavy load: one pair per CPU, pinned to it, ping-ponging a byte through
//!    two pipes, either two threads of one process (one cgroup: the program's best case, its
//!    charges stay pending on the CPU) or two processes in two cgroups (every switch changes
//!    cgroup: the worst case, a hash map update per switch). The load's round trips per second
//!    with and without the program give the end-to-end cost. Measured for the BTF (`tp_btf`) and
//!    raw (`raw_tp`) flavours, and for `tp_btf` without run-queue wait.
//! 2. Read cost: `CpuAccounting::read` of N cgroups that all have figures (the process hops
//!    through N freshly created groups so each gets charged), every 250 ms as the daemon reads,
//!    against the cgroupfs fallback.
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
    repeat: usize,
    cgroups: usize,
    cgroup_root: PathBuf,
}

fn parse_args() -> Args {
    let mut args = Args {
        seconds: 3.0,
        repeat: 3,
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
            "--repeat" => args.repeat = value().parse().unwrap_or_else(|_| usage("--repeat")),
            "--cgroup-root" => args.cgroup_root = PathBuf::from(value()),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    args
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "ebpf-bench: {msg}\nusage: ebpf-bench [--seconds S] [--repeat R] [--cgroups N] [--cgroup-root DIR]"
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

/// The context-switch-heavy load.
enum Load {
    /// Pairs of threads of this process (one cgroup).
    SameCgroup,
    /// Pairs of processes, one in each of two cgroups.
    AcrossCgroups { a: PathBuf, b: PathBuf },
}

impl Load {
    fn name(&self) -> &'static str {
        match self {
            Load::SameCgroup => "same_cgroup",
            Load::AcrossCgroups { .. } => "across_cgroups",
        }
    }

    /// Runs the load for `d`; returns round trips per second.
    fn run(&self, d: Duration) -> f64 {
        match self {
            Load::SameCgroup => pingpong(d),
            Load::AcrossCgroups { a, b } => pingpong_across(d, a, b),
        }
    }
}

/// Pairs of processes ping-ponging, one side in cgroup `a`, the other in `b`; returns round trips
/// per second. The children only make async-signal-safe calls (the parent has threads).
fn pingpong_across(d: Duration, a: &Path, b: &Path) -> f64 {
    use std::os::unix::ffi::OsStrExt;
    let procs = |g: &Path| {
        std::ffi::CString::new(g.join("cgroup.procs").as_os_str().as_bytes()).expect("path")
    };
    let (procs_a, procs_b) = (procs(a), procs(b));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let deadline_ns = now_ns() + d.as_nanos() as u64;
    let t0 = Instant::now();
    let mut children = Vec::new();
    let mut results = Vec::new();
    for cpu in 0..cpus {
        let (ab_r, ab_w) = raw_pipe();
        let (ba_r, ba_w) = raw_pipe();
        let (res_r, res_w) = raw_pipe();
        // SAFETY: the child runs only async-signal-safe calls and `_exit`s.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: closing descriptors of this (child) process.
                unsafe {
                    libc::close(ab_r);
                    libc::close(ba_w);
                    libc::close(res_r);
                }
                child_setup(cpu, &procs_a);
                let mut n = 0u64;
                let mut byte = [0u8; 1];
                while now_ns() < deadline_ns {
                    // SAFETY: one-byte reads and writes on our pipes.
                    let ok = unsafe {
                        libc::write(ab_w, b"x".as_ptr().cast(), 1) == 1
                            && libc::read(ba_r, byte.as_mut_ptr().cast(), 1) == 1
                    };
                    if !ok {
                        break;
                    }
                    n += 1;
                }
                // SAFETY: as above; `_exit` skips destructors and atexit handlers.
                unsafe {
                    libc::write(res_w, (&raw const n).cast(), 8);
                    libc::_exit(0);
                }
            }
            pid if pid > 0 => children.push(pid),
            _ => panic!("fork failed: {}", std::io::Error::last_os_error()),
        }
        // SAFETY: as above.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: as above.
                unsafe {
                    libc::close(ab_w);
                    libc::close(ba_r);
                    libc::close(res_r);
                    libc::close(res_w);
                }
                child_setup(cpu, &procs_b);
                let mut byte = [0u8; 1];
                // SAFETY: as above.
                unsafe {
                    while libc::read(ab_r, byte.as_mut_ptr().cast(), 1) == 1 {
                        if libc::write(ba_w, b"y".as_ptr().cast(), 1) != 1 {
                            break;
                        }
                    }
                    libc::_exit(0);
                }
            }
            pid if pid > 0 => children.push(pid),
            _ => panic!("fork failed: {}", std::io::Error::last_os_error()),
        }
        // SAFETY: the parent's copies of the children's ends.
        unsafe {
            libc::close(ab_r);
            libc::close(ab_w);
            libc::close(ba_r);
            libc::close(ba_w);
            libc::close(res_w);
        }
        results.push(res_r);
    }
    let mut trips = 0u64;
    for fd in results {
        let mut n = 0u64;
        // SAFETY: reading the child's 8-byte count from our pipe, then closing it.
        unsafe {
            if libc::read(fd, (&raw mut n).cast(), 8) == 8 {
                trips += n;
            }
            libc::close(fd);
        }
    }
    for pid in children {
        // SAFETY: reaping our own children.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
    trips as f64 / t0.elapsed().as_secs_f64()
}

/// In a forked child: join the cgroup (`0` means the writer) and pin to `cpu`.
fn child_setup(cpu: usize, procs: &std::ffi::CStr) {
    // SAFETY: async-signal-safe calls on a NUL-terminated path and a local cpu set.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
        if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
            libc::_exit(3);
        }
        libc::close(fd);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn raw_pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        panic!("pipe: {}", std::io::Error::last_os_error());
    }
    (fds[0], fds[1])
}

/// CLOCK_MONOTONIC in ns (async-signal-safe).
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// (run_time_ns, run_cnt) of a loaded program.
fn prog_stats(id: u32) -> Option<(u64, u64)> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .map(|p| (p.run_time().as_nanos() as u64, p.run_count()))
}

fn overhead(
    args: &Args,
    load: &Load,
    attach: AttachMode,
    run_queue_wait: bool,
    baseline_rps: f64,
) -> Value {
    let acct = CpuAccounting::open(
        &args.cgroup_root,
        &AccountingOptions {
            attach,
            run_queue_wait,
            ..AccountingOptions::default()
        },
    );
    if acct.source() != CpuSource::Ebpf {
        return json!({"error": acct.fallback_reason()});
    }
    let family = acct.attach_kind().map_or("?", |k| k.as_str());
    let Some(id) = acct.program_id() else {
        return json!({"error": "no program id"});
    };
    let _stats_fd = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => fd,
        Err(e) => return json!({"error": format!("BPF_ENABLE_STATS failed: {e}")}),
    };
    let before = prog_stats(id);
    let t0 = Instant::now();
    let rps = load.run(Duration::from_secs_f64(args.seconds));
    let elapsed = t0.elapsed().as_secs_f64();
    let (Some((run0, cnt0)), Some((run1, cnt1))) = (before, prog_stats(id)) else {
        return json!({"error": "program statistics unavailable"});
    };
    let (dt, dc) = (run1 - run0, cnt1 - cnt0);
    let result = json!({
        "attach": family,
        "run_queue_wait": run_queue_wait,
        "seconds": elapsed,
        "sched_switch_events": dc,
        "events_per_s": dc as f64 / elapsed,
        "ns_per_event": if dc > 0 { dt as f64 / dc as f64 } else { 0.0 },
        "pingpong_round_trips_per_s": rps,
        "throughput_cost_pct": (1.0 - rps / baseline_rps) * 100.0,
    });
    eprintln!(
        "ebpf-bench: {family} (run-queue wait {run_queue_wait}), {}: {result}",
        load.name()
    );
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

impl BenchGroups {
    /// Creates `parent` and its `children` (names).
    fn create(parent: &Path, children: &[&str]) -> BenchGroups {
        std::fs::create_dir(parent)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        let mut groups = BenchGroups {
            parent: parent.to_path_buf(),
            children: Vec::new(),
            home: own_cgroup(parent.parent().expect("a parent")),
        };
        for c in children {
            let path = parent.join(c);
            std::fs::create_dir(&path)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
            groups.children.push(path);
        }
        groups
    }
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
        // As the daemon reads: every 250 ms.
        let mut samples = Vec::new();
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(250));
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

/// Median of a non-empty list.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Summary of the repeated runs of one configuration: medians, the per-run values, the minimum
/// ns/event (the least disturbed run on a shared machine).
fn summarize(runs: &[Value], baseline_rps: f64) -> Value {
    if let Some(err) = runs.iter().find(|r| r.get("error").is_some()) {
        return err.clone();
    }
    let field = |k: &str| -> Vec<f64> { runs.iter().filter_map(|r| r[k].as_f64()).collect() };
    let ns = field("ns_per_event");
    let rps = median(field("pingpong_round_trips_per_s"));
    json!({
        "attach": runs[0]["attach"],
        "run_queue_wait": runs[0]["run_queue_wait"],
        "ns_per_event_median": median(ns.clone()),
        "ns_per_event_min": ns.iter().copied().fold(f64::INFINITY, f64::min),
        "ns_per_event_runs": ns,
        "events_per_s_median": median(field("events_per_s")),
        "pingpong_round_trips_per_s_median": rps,
        "throughput_cost_pct": (1.0 - rps / baseline_rps) * 100.0,
    })
}

fn main() {
    let args = parse_args();
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "ebpf-bench: kernel {kernel}, {cpus} CPUs, {} s per run, {} runs each",
        args.seconds, args.repeat
    );
    // Two cgroups for the cross-cgroup load (removed at the end).
    let pp = BenchGroups::create(
        &args
            .cgroup_root
            .join(format!("governor-bench-pp-{}", std::process::id())),
        &["a", "b"],
    );
    let loads = [
        Load::SameCgroup,
        Load::AcrossCgroups {
            a: pp.children[0].clone(),
            b: pp.children[1].clone(),
        },
    ];
    // Interleaved, so that a burst of load elsewhere on the machine hits every configuration.
    let configs = [
        ("tp_btf", AttachMode::Btf, true),
        ("raw_tp", AttachMode::Raw, true),
        ("tp_btf_without_wait", AttachMode::Btf, false),
    ];
    let mut baselines: Vec<Vec<f64>> = vec![Vec::new(); loads.len()];
    let mut runs: Vec<Vec<Vec<Value>>> = vec![vec![Vec::new(); loads.len()]; configs.len()];
    for _ in 0..args.repeat.max(1) {
        for (l, load) in loads.iter().enumerate() {
            let baseline = load.run(Duration::from_secs_f64(args.seconds));
            eprintln!(
                "ebpf-bench: baseline {}: {baseline:.0} round trips/s",
                load.name()
            );
            baselines[l].push(baseline);
            for (c, &(_, attach, wait)) in configs.iter().enumerate() {
                runs[c][l].push(overhead(&args, load, attach, wait, baseline));
            }
        }
    }
    drop(pp);
    let baselines: Vec<f64> = baselines.into_iter().map(median).collect();
    let mut out = serde_json::Map::new();
    out.insert("kernel".into(), json!(kernel));
    out.insert("cpus".into(), json!(cpus));
    out.insert("seconds_per_run".into(), json!(args.seconds));
    out.insert("runs".into(), json!(args.repeat));
    let mut base = serde_json::Map::new();
    for (l, load) in loads.iter().enumerate() {
        base.insert(load.name().into(), json!(baselines[l]));
    }
    out.insert("baseline_round_trips_per_s".into(), Value::Object(base));
    for (c, &(name, _, _)) in configs.iter().enumerate() {
        let mut per_load = serde_json::Map::new();
        for (l, load) in loads.iter().enumerate() {
            per_load.insert(load.name().into(), summarize(&runs[c][l], baselines[l]));
        }
        out.insert(name.into(), Value::Object(per_load));
    }
    out.insert("read_cost".into(), read_cost(&args));
    println!("{}", Value::Object(out));
}
