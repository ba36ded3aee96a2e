//! Incremental parse throughput per format: a ~4 MiB log of each format, fed to a
//! [`LogStream`] in 256 KiB appends (what the watcher reads at a time), on one core.
//!
//! `cargo bench -p governor-progress --bench progress_parse` (criterion reports MiB/s; goal ≥ 100 MB/s
//! for the CSV and JSON-lines formats).
//!
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time: the
//! figure is the throughput of one core, and stays meaningful on a machine shared with other
//! builds (wall time there measures the scheduler more than the parser).

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, SystemTime};

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor_progress::{CustomFormat, Format, FormatChoice, LogStream};
use nix::time::{ClockId, clock_gettime};

const TARGET_BYTES: usize = 4 << 20;
const APPEND: usize = 256 << 10;

/// A deterministic stream of plausible values.
struct Values(u64);

impl Values {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 * 3.0
    }
}

/// A log of `format` of about [`TARGET_BYTES`]: a header, then lines from `line(i, values)`.
fn build(header: &str, mut line: impl FnMut(usize, &mut Values) -> String) -> Vec<u8> {
    let mut out = String::with_capacity(TARGET_BYTES + 4096);
    out.push_str(header);
    let mut v = Values(42);
    let mut i = 0;
    while out.len() < TARGET_BYTES {
        out.push_str(&line(i, &mut v));
        out.push('\n');
        i += 1;
    }
    out.into_bytes()
}

fn inputs() -> Vec<(&'static str, Format, Vec<u8>)> {
    let mut v = Vec::new();
    v.push((
        "lightning_csv",
        Format::LightningCsv,
        build(
            "epoch,step,train_loss_step,train_perplexity_step,val_loss,val_perplexity\n",
            |i, v| {
                if i % 10 == 9 {
                    format!(
                        "{},{},,,{},{}",
                        i / 100,
                        i * 50 + 49,
                        v.next(),
                        v.next() * 100.0
                    )
                } else {
                    format!(
                        "{},{},{},{},,",
                        i / 100,
                        i * 50 + 49,
                        v.next(),
                        v.next() * 1000.0
                    )
                }
            },
        ),
    ));
    v.push((
        "keras_csv",
        Format::KerasCsv,
        build("epoch,accuracy,loss,val_accuracy,val_loss\n", |i, v| {
            format!(
                "{i},{},{},{},{}",
                v.next() / 3.0,
                v.next(),
                v.next() / 3.0,
                v.next()
            )
        }),
    ));
    v.push((
        "ultralytics_csv",
        Format::UltralyticsCsv,
        build(
            "                  epoch,         train/box_loss,         train/cls_loss,         train/dfl_loss,   metrics/precision(B),      metrics/recall(B),       metrics/mAP50(B),    metrics/mAP50-95(B),           val/box_loss,           val/cls_loss,           val/dfl_loss,                 lr/pg0,                 lr/pg1,                 lr/pg2\n",
            |i, v| {
                let mut s = format!("{i:>23}");
                for _ in 0..13 {
                    s.push_str(&format!(",{:>23.5}", v.next()));
                }
                s
            },
        ),
    ));
    v.push((
        "detectron2_json",
        Format::Detectron2Json,
        build("", |i, v| {
            format!(
                "{{\"data_time\": {}, \"eta_seconds\": {}, \"fast_rcnn/cls_accuracy\": {}, \"fast_rcnn/false_negative\": {}, \"fast_rcnn/fg_cls_accuracy\": {}, \"iteration\": {}, \"loss_box_reg\": {}, \"loss_cls\": {}, \"loss_mask\": {}, \"loss_rpn_cls\": {}, \"loss_rpn_loc\": {}, \"lr\": {}, \"mask_rcnn/accuracy\": {}, \"rpn/num_neg_anchors\": {}, \"rpn/num_pos_anchors\": {}, \"time\": {}, \"total_loss\": {}}}",
                v.next() / 100.0, v.next() * 1000.0, v.next() / 3.0, v.next() / 3.0, v.next() / 3.0,
                i * 20 + 19, v.next(), v.next(), v.next(), v.next() / 10.0, v.next() / 100.0,
                v.next() * 1e-4, v.next() / 3.0, v.next() * 100.0, v.next() * 10.0, v.next(), v.next()
            )
        }),
    ));
    v.push((
        "mmengine_json",
        Format::MmengineJson,
        build("", |i, v| {
            format!(
                "{{\"lr\": {}, \"data_time\": {}, \"grad_norm\": {}, \"loss\": {}, \"loss_cls\": {}, \"loss_bbox\": {}, \"time\": {}, \"epoch\": {}, \"iter\": {}, \"memory\": 2990, \"step\": {}}}",
                v.next() * 1e-3, v.next() / 10.0, v.next() * 10.0, v.next(), v.next(), v.next(),
                v.next() / 3.0, i / 100 + 1, i * 50 + 50, i * 50 + 50
            )
        }),
    ));
    v.push((
        "deit_jsonl",
        Format::DeitJsonl,
        build("", |i, v| {
            format!(
                "{{\"train_lr\": {}, \"train_loss\": {}, \"test_loss\": {}, \"test_acc1\": {}, \"test_acc5\": {}, \"epoch\": {i}, \"n_parameters\": 5717416}}",
                v.next() * 1e-3, v.next() * 2.0, v.next() * 2.0, v.next() * 30.0, v.next() * 30.0
            )
        }),
    ));
    v.push((
        "json_lines",
        Format::JsonLines,
        build("", |i, v| {
            format!(
                "{{\"epoch\": {}, \"step\": {}, \"loss\": {}, \"accuracy\": {}, \"lr\": {}}}",
                i / 100,
                i,
                v.next(),
                v.next() / 3.0,
                v.next() * 1e-4
            )
        }),
    ));
    v.push((
        "hf_console",
        Format::HfConsole,
        build("", |i, v| {
            format!(
                "{{'loss': {:.4}, 'grad_norm': {}, 'learning_rate': {}, 'epoch': {:.2}}}",
                v.next(),
                v.next() * 3.0,
                v.next() * 1e-4,
                i as f64 / 100.0
            )
        }),
    ));
    let mut state = String::from("{\n  \"log_history\": [\n");
    let mut vals = Values(7);
    let mut i = 0;
    while state.len() < TARGET_BYTES {
        state.push_str(&format!(
            "    {{\n      \"epoch\": {:.2},\n      \"grad_norm\": {},\n      \"learning_rate\": {},\n      \"loss\": {:.4},\n      \"step\": {}\n    }},\n",
            i as f64 / 100.0,
            vals.next(),
            vals.next() * 1e-4,
            vals.next(),
            i * 20
        ));
        i += 1;
    }
    state.truncate(state.len() - 2);
    state.push_str("\n  ],\n  \"max_steps\": 100000\n}\n");
    v.push((
        "hf_trainer_state",
        Format::HfTrainerState,
        state.into_bytes(),
    ));
    v.push((
        "keras_console",
        Format::KerasConsole,
        build("", |i, v| {
            if i % 2 == 0 {
                format!("Epoch {}/100000", i / 2 + 1)
            } else {
                format!(
                    "313/313 [==============================] - 351s 1s/step - loss: {:.4} - acc: {:.4} - val_loss: {:.4} - val_acc: {:.4}",
                    v.next(),
                    v.next() / 3.0,
                    v.next(),
                    v.next() / 3.0
                )
            }
        }),
    ));
    v.push((
        "ultralytics_console",
        Format::UltralyticsConsole,
        build(
            "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n",
            |i, v| {
                format!(
                    "{:>11}      2.61G {:>10.4} {:>10.4} {:>10.4} {:>10} {:>10}: 45%|████▌     | 45/100 [00:10<00:12,  4.50it/s]",
                    format!("{}/100000", i + 1),
                    v.next(),
                    v.next(),
                    v.next(),
                    12,
                    640
                )
            },
        ),
    ));
    v.push((
        "pytorch_examples",
        Format::PytorchExamples,
        build("", |i, v| {
            format!(
                "Train Epoch: {} [{}/60000 ({}%)]\tLoss: {:.6}",
                i / 94 + 1,
                (i % 94) * 640,
                (i % 94) * 100 / 94,
                v.next()
            )
        }),
    ));
    v.push((
        "nanogpt",
        Format::Nanogpt,
        build("", |i, v| {
            format!(
                "iter {i}: loss {:.4}, time {:.2}ms, mfu {:.2}%",
                v.next(),
                v.next() * 100.0,
                v.next()
            )
        }),
    ));
    v.push((
        "caffe_glog",
        Format::CaffeGlog,
        build("", |i, v| {
            format!(
                "I0728 23:56:00.280272  4259 solver.cpp:218] Iteration {} (4.71409 iter/s, 21.213s/100 iters), loss = {:.6}",
                i * 100,
                v.next()
            )
        }),
    ));
    v.push((
        "basicsr",
        Format::Basicsr,
        build("", |i, v| {
            format!(
                "2025-02-04 22:37:09,911 INFO: [train..][epoch:{:>3}, iter:{:>8}, lr:(3.000e-05,)] [eta: 4:06:17, time (data): 1.663 (0.247)] l_pix: {:.4e} l_percep: {:.4e} ",
                i / 100,
                i * 100,
                v.next() / 100.0,
                v.next()
            )
        }),
    ));
    v.push((
        "tqdm",
        Format::Tqdm,
        build("", |i, v| {
            format!(
                "Epoch {}:  45%|████▌     | {}/1000 [00:30<00:36, 15.0it/s, loss={:.3}, v_num=0]",
                i / 1000,
                i % 1000,
                v.next()
            )
        }),
    ));
    v.push((
        "print_kv",
        Format::PrintKv,
        build("", |i, v| {
            format!(
                "2025-01-06 15:04:15,292 INFO: Epoch: {}/50, Iteration step: {}, loss: {}, acc: {:.2}%",
                i / 1000,
                i * 100,
                v.next(),
                v.next() * 30.0
            )
        }),
    ));
    v.push((
        "custom",
        Format::Custom,
        build("", |i, v| {
            format!("it={i} ep={} L={:.5}", i / 100, v.next())
        }),
    ));
    v
}

fn parse_incrementally(bytes: &[u8], choice: FormatChoice, custom: Option<&CustomFormat>) -> usize {
    let mut stream = LogStream::new(Path::new("bench"), choice, custom).unwrap();
    let mut out = Vec::with_capacity(4096);
    let mut n = 0;
    let now = SystemTime::UNIX_EPOCH;
    for chunk in bytes.chunks(APPEND) {
        stream.push(chunk, now, &mut out);
        n += out.len();
        out.clear();
    }
    stream.finish(now, &mut out);
    n + out.len()
}

/// CPU time of the calling thread.
struct ThreadCpuTime;

static WALL: WallTime = WallTime;

fn thread_cpu() -> Duration {
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).expect("thread CPU clock");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, like wall time: reuse its formatter (times and bytes per second).
        WALL.formatter()
    }
}

fn bench(c: &mut Criterion<ThreadCpuTime>) {
    let custom = CustomFormat {
        regex: r"^it=(?P<step>\d+) ep=(?P<epoch>\d+) L=(?P<loss>\S+)$".into(),
        split: None,
    };
    let mut group = c.benchmark_group("parse");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for (name, format, bytes) in inputs() {
        let custom = (format == Format::Custom).then_some(&custom);
        let records = parse_incrementally(&bytes, FormatChoice::Fixed(format), custom);
        assert!(records > 1000, "{name}: only {records} records");
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| parse_incrementally(black_box(&bytes), FormatChoice::Fixed(format), custom))
        });
        if matches!(
            format,
            Format::LightningCsv | Format::Detectron2Json | Format::Nanogpt | Format::PrintKv
        ) {
            let auto = parse_incrementally(&bytes, FormatChoice::Auto, None);
            assert_eq!(auto, records, "{name}: auto-detection parses differently");
            group.bench_function(format!("{name}/auto"), |b| {
                b.iter(|| parse_incrementally(black_box(&bytes), FormatChoice::Auto, None))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench
}
criterion_main!(benches);
