//! Decode throughput of the tracking back-ends' formats against the CSV and JSON-lines parsers,
//! on the same values: 100,000 training steps, each logging `loss` and `accuracy` (and every
//! 100th step `val_loss`), written as
//! - a TensorBoard event file the way PyTorch's `SummaryWriter` writes it (one event per
//!   `add_scalar`, `simple_value`),
//! - the same as Keras' callback writes it (rank-0 float tensors, the scalars plug-in named on
//!   each tag's first value),
//! - the `loss` file of MLflow's file store (`timestamp value step`),
//! - a Keras `CSVLogger`-style CSV (`epoch,loss,accuracy,val_loss`, one row a step) and JSON
//!   lines,
//!
//! each fed to a [`LogStream`] in 256 KiB appends as the watcher reads. Criterion reports bytes
//! per second in group `bytes` and logged values (scalars) per second in group `values`.
//!
//! `cargo bench -p governor-progress --bench progress_tensorboard`
//!
//! Time is the benchmark thread's CPU time, as in `progress_parse`.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, SystemTime};

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use governor_progress::tensorboard::{
    Event, PluginData, Summary, SummaryMetadata, SummaryValue, TensorProto, TensorShape, event,
    file_version_event, scalar_event, summary_value,
};
use governor_progress::tfrecord::frame;
use governor_progress::{FormatChoice, LogStream};
use nix::time::{ClockId, clock_gettime};
use prost::Message;

const STEPS: usize = 100_000;
const APPEND: usize = 256 << 10;

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

/// (step, tag, value) in logging order.
fn scalars() -> Vec<(usize, &'static str, f32)> {
    let mut v = Values(42);
    let mut out = Vec::with_capacity(STEPS * 2 + STEPS / 100);
    for step in 0..STEPS {
        out.push((step, "loss", v.next() as f32));
        out.push((step, "accuracy", (v.next() / 3.0) as f32));
        if step % 100 == 99 {
            out.push((step, "val_loss", v.next() as f32));
        }
    }
    out
}

fn tensor_event(step: usize, tag: &str, x: f32, first: bool) -> Vec<u8> {
    Event {
        wall_time: 1.7e9 + step as f64,
        step: step as i64,
        what: Some(event::What::Summary(Summary {
            value: vec![SummaryValue {
                tag: tag.to_owned(),
                metadata: first.then(|| SummaryMetadata {
                    plugin_data: Some(PluginData {
                        plugin_name: "scalars".into(),
                    }),
                }),
                value: Some(summary_value::Value::Tensor(TensorProto {
                    dtype: 1,
                    tensor_shape: Some(TensorShape { dim: vec![] }),
                    tensor_content: x.to_le_bytes().to_vec(),
                    float_val: vec![],
                    double_val: vec![],
                    half_val: vec![],
                })),
            }],
        })),
    }
    .encode_to_vec()
}

/// (name, file name, bytes, logged values).
fn inputs() -> Vec<(&'static str, &'static str, Vec<u8>, usize)> {
    let s = scalars();
    let n = s.len();
    let mut pytorch = frame(&file_version_event(1.7e9));
    for (step, tag, x) in &s {
        pytorch.extend(frame(&scalar_event(
            1.7e9 + *step as f64,
            *step as i64,
            &[(tag, *x)],
        )));
    }
    let mut keras = frame(&file_version_event(1.7e9));
    let mut seen = std::collections::HashSet::new();
    for (step, tag, x) in &s {
        keras.extend(frame(&tensor_event(*step, tag, *x, seen.insert(*tag))));
    }
    let mut csv = String::from("epoch,loss,accuracy,val_loss\n");
    let mut jsonl = String::new();
    let mut mlflow = String::new();
    let mut i = 0;
    while i < s.len() {
        let (step, _, loss) = s[i];
        let acc = s[i + 1].2;
        let val = s.get(i + 2).filter(|v| v.0 == step).map(|v| v.2);
        i += if val.is_some() { 3 } else { 2 };
        match val {
            Some(v) => {
                csv.push_str(&format!("{step},{loss},{acc},{v}\n"));
                jsonl.push_str(&format!(
                    "{{\"step\": {step}, \"loss\": {loss}, \"accuracy\": {acc}, \"val_loss\": {v}}}\n"
                ));
            }
            None => {
                csv.push_str(&format!("{step},{loss},{acc},\n"));
                jsonl.push_str(&format!(
                    "{{\"step\": {step}, \"loss\": {loss}, \"accuracy\": {acc}}}\n"
                ));
            }
        }
        mlflow.push_str(&format!(
            "{} {loss} {step}\n",
            1_732_790_112_345u64 + step as u64
        ));
    }
    vec![
        (
            "tensorboard_simple_value",
            "events.out.tfevents.1.bench",
            pytorch,
            n,
        ),
        (
            "tensorboard_tensor",
            "events.out.tfevents.2.bench",
            keras,
            n,
        ),
        ("keras_csv", "training.log", csv.into_bytes(), n),
        ("json_lines", "metrics.jsonl", jsonl.into_bytes(), n),
        (
            "mlflow_file_loss",
            "mlruns/0/0123456789abcdef0123456789abcdef/metrics/loss",
            mlflow.into_bytes(),
            STEPS,
        ),
    ]
}

fn decode(name: &str, bytes: &[u8]) -> usize {
    let mut stream = LogStream::new(Path::new(name), FormatChoice::Auto, None).unwrap();
    let mut out = Vec::with_capacity(4096);
    let now = SystemTime::UNIX_EPOCH;
    let mut values = 0;
    for chunk in bytes.chunks(APPEND) {
        stream.push(chunk, now, &mut out);
        values += out.iter().map(|r| r.metrics.len()).sum::<usize>();
        out.clear();
    }
    stream.finish(now, &mut out);
    values + out.iter().map(|r| r.metrics.len()).sum::<usize>()
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
        WALL.formatter()
    }
}

fn bench(c: &mut Criterion<ThreadCpuTime>) {
    let inputs = inputs();
    for (name, file, bytes, values) in &inputs {
        assert_eq!(decode(file, bytes), *values, "{name}: every value decoded");
        eprintln!("{name}: {} bytes, {values} values", bytes.len());
    }
    for unit in ["bytes", "values"] {
        let mut group = c.benchmark_group(unit);
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(3));
        for (name, file, bytes, values) in &inputs {
            group.throughput(if unit == "bytes" {
                Throughput::Bytes(bytes.len() as u64)
            } else {
                Throughput::Elements(*values as u64)
            });
            group.bench_function(*name, |b| b.iter(|| decode(file, black_box(bytes))));
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = bench
}
criterion_main!(benches);
