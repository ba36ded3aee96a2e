//! Decision latency: from the `write()` of one log line to the cgroup write it causes, through
//! the daemon's own path, for 1, 100 and 1,000 governed jobs:
//!
//! `write(2)` of a Keras CSV row to the job's log file (tmpfs) → the real inotify [`Watcher`]
//! (a task on the same single-threaded runtime, as in the daemon) reads and parses it and
//! delivers a [`Record`] → the daemon's own handler, [`CoreShell::on_watch_event`]: the job's
//! signal and, when it moved, a decision at once or, when deciding again now would exceed the
//! decision budget of a large node, a batched decision at the handler's next wake-up
//! ([`CoreShell::on_wakeup`]) → the policy's plan applied through the real [`Actuator`] → its
//! synchronous `write(2)` of `cpu.max` in a [`FakeCgroupRoot`] on tmpfs (`/dev/shm`). The
//! benchmark checks after every timed sample (outside the timing) that the job's `cpu.max`
//! holds the new value.
//!
//! Two figures are reported apart: the end-to-end latency (`write()` → cgroup write, with any
//! wait for a batched decision) and the cost of one decision (the policy's plan and the
//! actuator's writes, [`RoundStats::took`]).
//!
//! Every second the daemon's sampling tick (`sample` + `decide_and_apply` + `poll_actuator`) runs
//! between samples, as in the daemon, so periodic work (drift re-reads) lands where it would.
//!
//! Policy: `GOVERNOR_BENCH_POLICY` (default `loss-cap`). `loss-cap` is a SYNTHETIC policy defined
//! in this file, for measuring the pipeline only: it caps each job at `latest loss` cores, so every
//! record changes that job's `cpu.max` (the `fair` policy writes nothing, by design). Any name
//! `governor::policy::by_name` knows works too (`GOVERNOR_BENCH_POLICY=shortest-left`); with a
//! real policy a record need not cause a write, and the report says how many did.
//!
//! Differences from the daemon, on purpose: the actuator's per-file rate limit (100 ms by
//! default) is 0, because the benchmark sends a record for the same job faster than a real job
//! logs (1 job: back to back); the records are received by `block_on(recv())` on the benchmark
//! thread instead of the daemon's `select!` loop (the watcher is a task on that same
//! single-threaded runtime, as in the daemon).
//!
//! Output: first, for each job count, `GOVERNOR_BENCH_SAMPLES` (default 3,000) samples paced 1 ms
//! apart, recorded in an HDR histogram: p50/p99/p99.9/max of the whole path and of its stages
//! (watcher delivery, `on_record`, `decide_and_apply`) and of the 1 s tick; then criterion's
//! estimate of the mean (back-to-back samples). `GOVERNOR_BENCH_JOBS` (default `1,100,1000`)
//! selects the job counts.
//!
//! Run: `cargo bench -p governor --bench decision_latency`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::cgroup::fake::FakeCgroupRoot;
use governor::cgroup::knob::{cores_to_quota, encode_cpu_max};
use governor::cgroup::{Actuator, ActuatorConfig, Hierarchy, JobCgroup};
use governor::daemon::node_core::{CoreSettings, CoreShell, CpuSampler, JobSource, NewJob};
use governor::policy::{
    self, Allocation, Category, CpuAllocation, JobId, JobSpec, MemoryAllocation, NodePolicy,
    NodeResources, Plan, ProgressPoint, Seconds, Usage,
};
use governor::progress::{FormatChoice, Record, SignalConfig};
use governor::watch::{WatchEvent, WatchEventKind, WatchSpec, Watcher, WatcherHandle};
use hdrhistogram::Histogram;
use tokio::sync::mpsc;

/// The synthetic policy's name.
const LOSS_CAP: &str = "loss-cap";
const CPU_PERIOD_US: u64 = 100_000;
const TICK: Duration = Duration::from_secs(1);

/// SYNTHETIC policy, for measuring the pipeline only (not a scheduling policy): every job is
/// capped at `latest loss` cores (1 core before its first value), so every new loss value changes
/// the job's `cpu.max`. Like the real policies it returns every job's allocation, with a
/// formatted reason, on every `decide`.
#[derive(Default)]
struct LossCap {
    loss: BTreeMap<JobId, Option<f64>>,
}

fn cap_for(loss: Option<f64>) -> f64 {
    loss.unwrap_or(1.0).clamp(0.01, 64.0)
}

impl NodePolicy for LossCap {
    fn name(&self) -> &'static str {
        LOSS_CAP
    }
    fn job_added(&mut self, _now: Seconds, spec: &JobSpec) {
        self.loss.insert(spec.id.clone(), None);
    }
    fn job_removed(&mut self, _now: Seconds, id: &JobId) {
        self.loss.remove(id);
    }
    fn progress(&mut self, _now: Seconds, id: &JobId, point: ProgressPoint) {
        if let Some(l) = self.loss.get_mut(id) {
            *l = Some(point.value);
        }
    }
    fn usage(&mut self, _now: Seconds, _id: &JobId, _usage: Usage) {}
    fn decide(&mut self, _now: Seconds, _node: &NodeResources) -> Plan {
        let allocations = self
            .loss
            .iter()
            .map(|(id, loss)| {
                let cores = cap_for(*loss);
                (
                    id.clone(),
                    Allocation {
                        category: Category::Progressing,
                        cpu: CpuAllocation {
                            weight: 100,
                            max_cores: Some(cores),
                        },
                        memory: MemoryAllocation::default(),
                        reason: format!("loss-cap (synthetic): cap {cores:.3} cores"),
                    },
                )
            })
            .collect();
        Plan {
            allocations,
            move_requests: Vec::new(),
            next_decision_at: None,
        }
    }
}

fn make_policy(name: &str) -> Box<dyn NodePolicy> {
    if name == LOSS_CAP {
        Box::new(LossCap::default())
    } else {
        policy::by_name(name).unwrap_or_else(|e| panic!("GOVERNOR_BENCH_POLICY: {e}"))
    }
}

/// CPU usage from the cgroup files, as the daemon does without eBPF.
struct CgroupFileCpu;

impl CpuSampler for CgroupFileCpu {
    fn name(&self) -> String {
        "cpu.stat".into()
    }
    fn cpu_seconds(&mut self, groups: &[JobCgroup]) -> Vec<Option<f64>> {
        vec![None; groups.len()]
    }
}

struct BenchJob {
    rel: String,
    key: String,
    log: File,
    epoch: u64,
}

/// Loss of job `k`'s `epoch`-th row: every row differs from the previous one by at least 0.007,
/// so the synthetic cap (and `cpu.max`) changes with every record.
/// (Three decimals, exactly what the row says: the value the parser reads back.)
fn loss_of(k: usize, epoch: u64) -> f64 {
    let thousandths = 1000 + (epoch * 7 + k as u64) % 1000;
    format!("{}.{:03}", thousandths / 1000, thousandths % 1000)
        .parse()
        .unwrap()
}

fn keras_row(epoch: u64, loss: f64) -> String {
    format!("{epoch},{loss:.3}\n")
}

/// Times of one sample, in nanoseconds.
struct Sample {
    /// `write()` until the watcher delivered the record.
    deliver: u64,
    /// The decision that wrote the job's file: the policy's plan and the actuator's writes.
    decision: u64,
    /// `write()` until that decision returned (the file written): end to end, with any wait
    /// for a batched decision.
    total: u64,
    /// The handler deferred the decision (decision budget).
    batched: bool,
    files_written: usize,
}

struct Bed {
    _dir: tempfile::TempDir,
    fake: FakeCgroupRoot,
    core: CoreShell,
    _watcher: WatcherHandle,
    events: mpsc::Receiver<WatchEvent>,
    /// Runs the watcher task while a record is awaited.
    rt: tokio::runtime::Runtime,
    jobs: Vec<BenchJob>,
    next: usize,
    last_tick: Instant,
    tick_ns: Vec<u64>,
    synthetic: bool,
}

fn tmpfs() -> &'static Path {
    if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm")
    } else {
        Path::new("/tmp")
    }
}

impl Bed {
    fn new(n: usize, policy_name: &str) -> Bed {
        let dir = tempfile::Builder::new()
            .prefix("governor-bench-latency-")
            .tempdir_in(tmpfs())
            .expect("tempdir");
        let root = dir.path().join("cgroup");
        std::fs::create_dir(&root).unwrap();
        let fake = FakeCgroupRoot::unified(&root);
        let actuator = Actuator::new(
            Hierarchy::detect(&root).expect("fake root"),
            ActuatorConfig {
                state_file: dir.path().join("state.json"),
                cpu_period_us: CPU_PERIOD_US,
                cpu_min_write_interval_ms: 0,
                ..ActuatorConfig::default()
            },
        )
        .expect("actuator");
        let settings = CoreSettings {
            node_name: "bench".into(),
            resources: NodeResources {
                cores: 64.0,
                memory_bytes: 256 << 30,
            },
            dry_run: false,
            govern_memory: false,
        };
        let now = Instant::now();
        let mut core = CoreShell::new(settings, make_policy(policy_name), actuator, now);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // As in the daemon: the watcher is a task on the same single-threaded runtime.
        let (watcher, events) = {
            let _entered = rt.enter();
            Watcher::spawn_task(4096).expect("watcher")
        };
        let mut jobs = Vec::with_capacity(n);
        for k in 0..n {
            let rel = format!("bench.slice/job{k}");
            fake.add_group(&rel);
            let cgroup = JobCgroup::new(&rel).unwrap();
            let log_dir = dir.path().join(format!("logs/job{k}"));
            std::fs::create_dir_all(&log_dir).unwrap();
            let log_path = log_dir.join("training.log");
            // The header and a first row: the watcher detects the format on the header and
            // delivers the row when it starts following the file.
            std::fs::write(
                &log_path,
                format!("epoch,loss\n{}", keras_row(0, loss_of(k, 0))),
            )
            .unwrap();
            let log = std::fs::OpenOptions::new()
                .append(true)
                .open(&log_path)
                .unwrap();
            let key = cgroup.to_string();
            assert!(core.add_job(
                now,
                NewJob {
                    cgroup: cgroup.clone(),
                    name: format!("job{k}"),
                    source: JobSource::Declared(PathBuf::from(format!("/bench/job{k}.toml"))),
                    runtime: "bench".into(),
                    spec: JobSpec::new(key.clone()),
                    signal: SignalConfig::default(),
                    epochs: None,
                    finish: None,
                    sweep: None,
                }
            ));
            rt.block_on(watcher.add(
                &key,
                WatchSpec {
                    paths: vec![log_path],
                    format: FormatChoice::Auto,
                    custom: None,
                    owner: None,
                },
            ))
            .expect("watch");
            jobs.push(BenchJob {
                rel,
                key,
                log,
                epoch: 1,
            });
        }
        let mut bed = Bed {
            _dir: dir,
            fake,
            core,
            _watcher: watcher,
            events,
            rt,
            jobs,
            next: 0,
            last_tick: Instant::now(),
            tick_ns: Vec::new(),
            synthetic: policy_name == LOSS_CAP,
        };
        // Every job's first row, then one decision: every job's cap is in place (originals
        // recorded in the state file) before anything is timed.
        let mut first_rows = 0;
        while first_rows < n {
            let ev = bed.rt.block_on(bed.events.recv()).expect("watcher stopped");
            if bed.handle_event(ev).is_some() {
                first_rows += 1;
            }
        }
        let started = Instant::now();
        let stats = bed.core.decide_and_apply(Instant::now());
        eprintln!(
            "  {n} jobs: first decision wrote {} files in {:?}",
            stats.files_written,
            started.elapsed()
        );
        if bed.synthetic {
            assert_eq!(stats.files_written, n, "the first decision caps every job");
            for k in 0..n {
                bed.check_cap(k, 0);
            }
        }
        bed
    }

    /// What the daemon's `on_watch_event` does before deciding; returns the record's job when it
    /// moved the signal.
    fn handle_event(&mut self, ev: WatchEvent) -> Option<JobCgroup> {
        match ev.kind {
            WatchEventKind::Record(record) => self.on_record(&ev.key, &record),
            WatchEventKind::Problem(m) => panic!("watcher problem for {}: {m}", ev.key),
            WatchEventKind::Format(_)
            | WatchEventKind::Opened
            | WatchEventKind::Truncated
            | WatchEventKind::Closed => None,
        }
    }

    fn on_record(&mut self, key: &Arc<str>, record: &Record) -> Option<JobCgroup> {
        let cgroup = JobCgroup::new(&**key).ok()?;
        self.core
            .on_record(Instant::now(), &cgroup, record)
            .then_some(cgroup)
    }

    /// The daemon's 1 s tick (sample, decide, poll), run between samples when due.
    fn tick_if_due(&mut self) {
        if self.last_tick.elapsed() < TICK {
            return;
        }
        let started = Instant::now();
        self.core.sample(started, &mut CgroupFileCpu);
        self.core.decide_and_apply(started);
        self.core.poll_actuator(started);
        self.tick_ns.push(started.elapsed().as_nanos() as u64);
        self.last_tick = Instant::now();
    }

    /// Job `k`'s `cpu.max` holds the synthetic cap of its `epoch`-th row.
    fn check_cap(&self, k: usize, epoch: u64) {
        let expected = encode_cpu_max(
            cores_to_quota(Some(cap_for(Some(loss_of(k, epoch)))), CPU_PERIOD_US),
            CPU_PERIOD_US,
        );
        let got = self.fake.get(&self.jobs[k].rel, "cpu.max");
        assert_eq!(
            got.trim(),
            expected,
            "job{k}: cpu.max does not hold the cap of row {epoch}"
        );
    }

    /// One log line for the next job, timed from before its `write` to the decision that
    /// wrote its cgroup file, through the daemon's own handler ([`CoreShell::on_watch_event`])
    /// and, when that batches the decision, its wake-up ([`CoreShell::on_wakeup`] at
    /// [`CoreShell::next_wakeup`], as the control loop sleeps until it).
    fn sample(&mut self) -> Sample {
        self.tick_if_due();
        let k = self.next;
        self.next = (self.next + 1) % self.jobs.len();
        let epoch = self.jobs[k].epoch;
        self.jobs[k].epoch += 1;
        let row = keras_row(epoch, loss_of(k, epoch));

        let t0 = Instant::now();
        self.jobs[k].log.write_all(row.as_bytes()).unwrap();
        let ev = loop {
            let ev = self
                .rt
                .block_on(self.events.recv())
                .expect("watcher stopped");
            if matches!(ev.kind, WatchEventKind::Record(_)) {
                break ev;
            }
            self.core.on_watch_event(Instant::now(), &ev);
        };
        let t1 = Instant::now();
        assert_eq!(&*ev.key, self.jobs[k].key, "a record for another job");
        let mut batched = false;
        let stats = match self.core.on_watch_event(t1, &ev) {
            Some(stats) => stats,
            None => {
                batched = true;
                loop {
                    let wake = self
                        .core
                        .next_wakeup()
                        .expect("a batched decision is scheduled");
                    std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                    if let Some(stats) = self.core.on_wakeup(Instant::now()) {
                        break stats;
                    }
                }
            }
        };
        let t3 = Instant::now();
        assert_eq!(stats.errors, 0, "job{k}: apply errors");
        if self.synthetic {
            assert_eq!(
                stats.files_written, 1,
                "job{k}: exactly its cpu.max changes"
            );
        }
        let ns = |d: Duration| d.as_nanos() as u64;
        Sample {
            deliver: ns(t1 - t0),
            decision: ns(stats.took),
            total: ns(t3 - t0),
            batched,
            files_written: stats.files_written,
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

fn line(name: &str, h: &Histogram<u64>) -> String {
    let us = |v: u64| v as f64 / 1000.0;
    format!(
        "    {name:<17} p50 {:>9.1} µs   p99 {:>9.1} µs   p99.9 {:>9.1} µs   max {:>9.1} µs",
        us(h.value_at_quantile(0.5)),
        us(h.value_at_quantile(0.99)),
        us(h.value_at_quantile(0.999)),
        us(h.max())
    )
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn job_counts() -> Vec<usize> {
    env_or("GOVERNOR_BENCH_JOBS", "1,100,1000")
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("GOVERNOR_BENCH_JOBS: comma-separated job counts")
        })
        .collect()
}

/// Paced samples into HDR histograms, printed.
fn report(bed: &mut Bed, n: usize, samples: usize) {
    let (mut total, mut deliver, mut decision, mut tick) =
        (histogram(), histogram(), histogram(), histogram());
    let (mut wrote, mut batched) = (0usize, 0usize);
    for _ in 0..samples {
        let s = bed.sample();
        if bed.synthetic {
            let k = (bed.next + bed.jobs.len() - 1) % bed.jobs.len();
            bed.check_cap(k, bed.jobs[k].epoch - 1);
        }
        total.record(s.total).unwrap();
        deliver.record(s.deliver).unwrap();
        decision.record(s.decision.max(1)).unwrap();
        wrote += usize::from(s.files_written > 0);
        batched += usize::from(s.batched);
        // Paced like a busy node rather than back to back (caches and the watcher thread
        // get to go cold, as between real records).
        std::thread::sleep(Duration::from_millis(1));
    }
    for t in bed.tick_ns.drain(..) {
        tick.record(t).unwrap();
    }
    println!(
        "decision latency, {n} jobs, {samples} samples, policy {}: {wrote} records caused a cgroup write, {batched} waited for a batched decision",
        bed.core.policy_name()
    );
    println!("{}", line("write→cgroup write", &total));
    println!("{}", line("  watcher delivery", &deliver));
    println!("{}", line("one decision", &decision));
    if !tick.is_empty() {
        println!("{}", line("1 s tick", &tick));
    }
}

fn bench(c: &mut Criterion) {
    let policy_name = env_or("GOVERNOR_BENCH_POLICY", LOSS_CAP);
    let samples: usize = env_or("GOVERNOR_BENCH_SAMPLES", "3000")
        .parse()
        .expect("GOVERNOR_BENCH_SAMPLES: a number");
    let counts = job_counts();
    let mut beds: Vec<(usize, Bed)> = Vec::new();
    for &n in &counts {
        let mut bed = Bed::new(n, &policy_name);
        report(&mut bed, n, samples);
        beds.push((n, bed));
    }
    let mut g = c.benchmark_group("decision_latency");
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(5));
    for (n, bed) in &mut beds {
        g.bench_function(format!("{policy_name}/{n}_jobs"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| Duration::from_nanos(bed.sample().total))
                    .sum()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
