//! Cost of `Actuator::apply` for 1,000 jobs against a fake cgroup root on tmpfs (`/dev/shm`):
//! - `unchanged`: every job gets the allocation it already has (the daemon's steady state); the
//!   actuator should make no syscall and no allocation;
//! - `all_change`: every job's four files change on every round (CPU weight, CPU cap, memory.high,
//!   memory.max), with the rate limits set to zero;
//! - `drift_check`: unchanged allocations, but the periodic drift check due on every call (the
//!   check re-reads each governed file).
//!
//! Before the timed runs it prints, per round of 1,000 applies, the read/write syscalls
//! (`/proc/self/io` syscr/syscw) and heap allocations made, and the heap the actuator holds for
//! 1,000 jobs.
//!
//! Run: `cargo bench -p governor --bench actuation`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::cgroup::fake::FakeCgroupRoot;
use governor::cgroup::{Actuator, ActuatorConfig, CgroupUsage, Hierarchy, JobCgroup, MemoryEvents};
use governor::policy::{Allocation, Category, CpuAllocation, MemoryAllocation};

/// Counts heap allocations and live bytes, to check the steady state allocates nothing.
struct CountingAlloc;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const JOBS: usize = 1000;
const MIB: u64 = 1 << 20;

fn allocation(round: u64) -> Allocation {
    let odd = round % 2 == 1;
    Allocation {
        category: Category::Progressing,
        cpu: CpuAllocation {
            weight: if odd { 300 } else { 200 },
            max_cores: Some(if odd { 2.0 } else { 1.0 }),
        },
        memory: MemoryAllocation {
            high_bytes: Some(if odd { 1536 * MIB } else { 1024 * MIB }),
            max_bytes: Some(if odd { 3072 * MIB } else { 2048 * MIB }),
        },
        reason: "bench".into(),
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    actuator: Actuator,
    jobs: Vec<JobCgroup>,
    usage: CgroupUsage,
    /// The caller's clock, advanced 1 ms per round (the actuator never reads a clock).
    clock: Instant,
}

fn setup(drift_check_interval_ms: u64) -> Setup {
    let base = if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm")
    } else {
        Path::new("/tmp")
    };
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let root = dir.path().join("cgroup");
    std::fs::create_dir(&root).unwrap();
    let fake = FakeCgroupRoot::unified(&root);
    let jobs: Vec<JobCgroup> = (0..JOBS)
        .map(|i| {
            let rel = format!("kubepods.slice/pod{i}/ctr");
            fake.add_group(&rel);
            JobCgroup::new(&rel).unwrap()
        })
        .collect();
    let config = ActuatorConfig {
        state_file: dir.path().join("state.json"),
        cpu_min_write_interval_ms: 0,
        memory_min_write_interval_ms: 0,
        drift_check_interval_ms,
        ..ActuatorConfig::default()
    };
    let actuator = Actuator::new(Hierarchy::detect(&root).unwrap(), config).unwrap();
    let usage = CgroupUsage {
        memory_current: Some(100 * MIB),
        memory_events: Some(MemoryEvents::default()),
        ..Default::default()
    };
    let mut s = Setup {
        _dir: dir,
        actuator,
        jobs,
        usage,
        clock: Instant::now(),
    };
    // Prime: originals recorded, allocation 0 in place.
    let started = Instant::now();
    round(&mut s, &allocation(0));
    eprintln!(
        "first apply of {JOBS} jobs (records {} originals): {:?}",
        s.actuator.recorded().count(),
        started.elapsed()
    );
    s
}

fn round(s: &mut Setup, alloc: &Allocation) -> usize {
    s.clock += Duration::from_millis(1);
    let now = s.clock;
    let mut written = 0;
    for job in &s.jobs {
        let out = s
            .actuator
            .apply_with_usage(job, alloc, &s.usage, now)
            .expect("apply");
        assert!(out.errors.is_empty(), "{job}: {:?}", out.errors);
        assert!(out.deferred_until.is_none(), "{job}: {out:?}");
        written += out.written.len();
    }
    written
}

fn proc_io() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("syscr:"), get("syscw:"))
}

fn report(name: &str, s: &mut Setup, alloc_for: impl Fn(u64) -> Allocation) {
    let alloc = alloc_for(1);
    let (r0, w0) = proc_io();
    let a0 = ALLOCATIONS.load(Ordering::Relaxed);
    let started = Instant::now();
    let written = round(s, &alloc);
    let took = started.elapsed();
    let a1 = ALLOCATIONS.load(Ordering::Relaxed);
    let (r1, w1) = proc_io();
    // /proc/self/io is itself read with one or two read(2) calls: subtract them.
    eprintln!(
        "{name}: one round of {JOBS} applies: {written} files written, ~{} read and {} write \
         syscalls, {} heap allocations, {took:?}",
        (r1 - r0).saturating_sub(2),
        w1 - w0,
        a1 - a0
    );
}

fn bench(c: &mut Criterion) {
    let live_before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut unchanged = setup(3_600_000);
    let live_after = LIVE_BYTES.load(Ordering::Relaxed);
    eprintln!(
        "heap held for {JOBS} governed jobs (actuator + fake-root bookkeeping): {} KiB",
        (live_after.saturating_sub(live_before)) / 1024
    );
    report("unchanged", &mut unchanged, |_| allocation(0));
    let mut all_change = setup(3_600_000);
    report("all_change", &mut all_change, allocation);
    let mut drift = setup(0);
    report("drift_check", &mut drift, |_| allocation(0));

    let mut g = c.benchmark_group("apply_1000_jobs");
    g.sample_size(20);
    g.bench_function("unchanged", |b| {
        let alloc = allocation(0);
        b.iter(|| {
            let written = round(&mut unchanged, &alloc);
            assert_eq!(written, 0);
            black_box(written)
        })
    });
    // The report left allocation 1 in place; criterion may call the outer closure more than
    // once, so the allocation in place is tracked outside it.
    let allocs = [allocation(0), allocation(1)];
    let mut in_place = 1usize;
    g.bench_function("all_change", |b| {
        b.iter(|| {
            let next = 1 - in_place;
            let written = round(&mut all_change, &allocs[next]);
            in_place = next;
            assert_eq!(written, 4 * JOBS, "a round did not change every file");
            black_box(written)
        })
    });
    g.bench_function("drift_check", |b| {
        let alloc = allocation(0);
        b.iter(|| black_box(round(&mut drift, &alloc)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
