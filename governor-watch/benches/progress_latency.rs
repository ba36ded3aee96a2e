//! Latency from `write()` of a log line to its record arriving on the watcher's channel, with
//! 1,000 files watched at once (goal: p99 under 2 ms).
//!
//! `cargo bench -p governor-watch --bench progress_latency`
//!
//! `write_to_record_1000_files`: each sample writes one complete line to one of the 1,000 files
//! (a different one each time, chosen pseudo-randomly; writers keep their files open like
//! training jobs do) and waits for its record. `burst_one_line_to_each_of_1000_files`: one line
//! to every file as fast as possible; each record's latency counts from its own `write()`.
//! Criterion reports mean times; the latency percentiles over all samples (hdrhistogram,
//! microsecond resolution) are printed at the end.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor_progress::FormatChoice;
use governor_watch::{WatchEvent, WatchEventKind, WatchSpec, Watcher};
use hdrhistogram::Histogram;
use tokio::sync::mpsc;

const FILES: usize = 1000;

struct Setup {
    _dir: tempfile::TempDir,
    writers: Vec<File>,
    rx: mpsc::Receiver<WatchEvent>,
    rt: tokio::runtime::Runtime,
    _handle: governor_watch::WatcherHandle,
    lcg: u64,
    line_no: u64,
}

fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < 4 * FILES as u64
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard.min(65536), hard);
    }
}

impl Setup {
    fn new() -> Self {
        raise_fd_limit();
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (handle, mut rx) = Watcher::spawn(4096).unwrap();
        let mut writers = Vec::with_capacity(FILES);
        let paths: Vec<PathBuf> = (0..FILES)
            .map(|i| dir.path().join(format!("job{i:04}.log")))
            .collect();
        for p in &paths {
            let mut w = File::options().create(true).append(true).open(p).unwrap();
            w.write_all(b"iter 0: loss 4.0, time 1.0ms, mfu 0.01%\n")
                .unwrap();
            writers.push(w);
        }
        rt.block_on(async {
            for (i, p) in paths.iter().enumerate() {
                let spec = WatchSpec {
                    paths: vec![p.clone()],
                    format: FormatChoice::Auto,
                    custom: None,
                    owner: None,
                };
                handle.add(&format!("job{i}"), spec).await.unwrap();
            }
            // Every file's first record.
            let mut seen = 0;
            while seen < FILES {
                let ev = rx.recv().await.unwrap();
                if matches!(ev.kind, WatchEventKind::Record(_)) {
                    seen += 1;
                }
            }
            let stats = handle.stats().await.unwrap();
            assert_eq!(stats.files, FILES, "{stats:?}");
        });
        Setup {
            _dir: dir,
            writers,
            rx,
            rt,
            _handle: handle,
            lcg: 1,
            line_no: 1,
        }
    }

    /// Writes one line to a pseudo-random file and returns the time until its record arrives.
    fn one(&mut self) -> Duration {
        self.lcg = self
            .lcg
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (self.lcg >> 33) as usize % FILES;
        let n = self.line_no;
        self.line_no += 1;
        let line = format!(
            "iter {n}: loss {:.4}, time 1.0ms, mfu 0.01%\n",
            1.0 / n as f64
        );
        let rx = &mut self.rx;
        let w = &mut self.writers[i];
        self.rt.block_on(async move {
            let start = Instant::now();
            w.write_all(line.as_bytes()).unwrap();
            loop {
                let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("record within 5 s")
                    .unwrap();
                if let WatchEventKind::Record(r) = ev.kind
                    && r.step == Some(n)
                {
                    return start.elapsed();
                }
            }
        })
    }
}

impl Setup {
    /// Writes one line to every file as fast as possible, then returns each record's time
    /// from its own `write()` to its delivery.
    fn burst(&mut self) -> Vec<Duration> {
        let n = self.line_no;
        self.line_no += 1;
        let line = format!(
            "iter {n}: loss {:.4}, time 1.0ms, mfu 0.01%\n",
            1.0 / n as f64
        );
        let rx = &mut self.rx;
        let writers = &mut self.writers;
        self.rt.block_on(async move {
            let mut written = Vec::with_capacity(FILES);
            for w in writers.iter_mut() {
                written.push(Instant::now());
                w.write_all(line.as_bytes()).unwrap();
            }
            let mut latencies = Vec::with_capacity(FILES);
            while latencies.len() < FILES {
                let ev = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("record within 5 s")
                    .unwrap();
                if let WatchEventKind::Record(r) = ev.kind
                    && r.step == Some(n)
                {
                    let i: usize = ev.key[3..].parse().unwrap();
                    latencies.push(written[i].elapsed());
                }
            }
            latencies
        })
    }
}

fn print_histogram(what: &str, hist: &Histogram<u64>) {
    println!(
        "{what}: {} samples: p50 {} us, p90 {} us, p99 {} us, p99.9 {} us, max {} us",
        hist.len(),
        hist.value_at_quantile(0.50),
        hist.value_at_quantile(0.90),
        hist.value_at_quantile(0.99),
        hist.value_at_quantile(0.999),
        hist.max()
    );
}

fn bench(c: &mut Criterion) {
    let mut setup = Setup::new();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).unwrap();
    let mut group = c.benchmark_group("watch");
    group.sample_size(50);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("write_to_record_1000_files", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let d = setup.one();
                hist.record(d.as_micros().max(1) as u64).unwrap();
                total += d;
            }
            total
        })
    });
    let mut burst = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).unwrap();
    group.sample_size(10);
    group.bench_function("burst_one_line_to_each_of_1000_files", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                for d in setup.burst() {
                    burst.record(d.as_micros().max(1) as u64).unwrap();
                }
                total += start.elapsed();
            }
            total
        })
    });
    group.finish();
    print_histogram(
        &format!("write->record latency, one line at a time, {FILES} files watched"),
        &hist,
    );
    print_histogram(
        &format!("write->record latency, a line to each of {FILES} files at once"),
        &burst,
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
