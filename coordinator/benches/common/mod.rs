//! What the coordinator's benchmarks share: the simulated node (32 cores, 256 GiB, every tenth
//! with 8 GPUs, reporting 4 jobs of its own), their command-line arguments and percentiles.

#![allow(dead_code)] // each bench uses its part

use governor_proto::node::{Category, GpuDevice, Hello, JobOrigin, JobReport, NodeCapacity};

/// The value after `--name` on the command line, or `default`.
pub(crate) fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `q` quantile of sorted values (0 for none).
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Simulated node `index`'s hello: 32 cores, 256 GiB, and 8 GPUs on every tenth node.
pub(crate) fn node_hello(name: String, index: usize) -> Hello {
    let gpus = if index.is_multiple_of(10) {
        (0..8)
            .map(|g| GpuDevice {
                index: g,
                model: "H100".into(),
                memory_bytes: 80 << 30,
            })
            .collect()
    } else {
        Vec::new()
    };
    Hello {
        node_name: name,
        capacity: NodeCapacity {
            cores: 32.0,
            memory_bytes: 256 << 30,
            gpus,
        },
        agent_version: "bench".into(),
        can_dump: false,
    }
}

/// Local job `k` of node `node` at report `t`: its stage turns every minute, its progress
/// slows, it knows its epochs.
pub(crate) fn local_job(k: usize, node: usize, t: u64) -> JobReport {
    let mut j = JobReport::running(format!("local-{k}"), format!("train-{k}"));
    j.origin = JobOrigin::Local;
    j.category = Category::ALL[(node + k + (t as usize / 60)) % 4];
    j.progress = Some(1.0 / (1.0 + t as f64 + k as f64));
    j.growth = Some(0.01);
    j.growth_efficiency = Some(0.005);
    j.cpu_cores = 2.0;
    j.memory_bytes = 4 << 30;
    j.epoch = Some(t / 30);
    j.max_epochs = Some(100);
    j.epoch_seconds = Some(30.0);
    j
}
