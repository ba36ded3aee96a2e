//! The simulated cluster's shape and timings: its workers ([`WorkerSpec`]), what a move costs
//! ([`MoveDowntime`]) and the whole configuration ([`ClusterConfig`]).

use serde::{Deserialize, Serialize};

/// One worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub name: String,
    pub cores: f64,
    pub memory_bytes: u64,
    #[serde(default)]
    pub gpus: u32,
}

/// What moving a job costs in the simulated world: the job makes no progress for
/// `fixed_seconds + bytes/checkpoint + bytes/transfer + bytes/restore`. (The coordinator's
/// *estimate* of the same cost, for its payback gate, is
/// [`governor_placement::payoff::MoveCost`]; this is what the move then takes.)
///
/// Defaults: a 2 s fixed part (freeze, process tree, cgroup and mount set-up: SpeCon measured
/// under 5 s save + resume for its small models), CRIU dumping at 500 MB/s to local disk, a
/// 10 Gbit/s network (1.25 GB/s) and restoring at 1 GB/s. A 4 GiB job is down for about 18 s.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MoveDowntime {
    pub fixed_seconds: f64,
    pub checkpoint_bytes_per_second: f64,
    pub transfer_bytes_per_second: f64,
    pub restore_bytes_per_second: f64,
}

impl Default for MoveDowntime {
    fn default() -> Self {
        MoveDowntime {
            fixed_seconds: 2.0,
            checkpoint_bytes_per_second: 500e6,
            transfer_bytes_per_second: 1.25e9,
            restore_bytes_per_second: 1e9,
        }
    }
}

impl MoveDowntime {
    /// A framework-checkpoint move as `cargo xtask bench-move --framework` measured it on the
    /// development host (2026-11-26; local disk as the shared path): 0.3 s fixed (exit, start,
    /// the coordinator's report and command), the save at ~330 MB/s (write and fsync), nothing
    /// carried, the load from the page cache at ~1.5 GB/s. 64 MiB: 0.32 s lost, 1 GiB: 3.9 s.
    pub fn framework_measured() -> Self {
        MoveDowntime {
            fixed_seconds: 0.3,
            checkpoint_bytes_per_second: 330e6,
            transfer_bytes_per_second: 0.0,
            restore_bytes_per_second: 1.5e9,
        }
    }

    /// A CRIU move as `cargo xtask bench-move` measured it in the VM bed (2026-11-26, TCG:
    /// several times slower than real hardware): dump 0.7 s + 126 MB/s, restore 0.5 s +
    /// 85 MB/s, images carried over a 10 Gbit/s network. 64 MiB: 2.8 s, 1 GiB: 22 s.
    pub fn criu_measured_tcg() -> Self {
        MoveDowntime {
            fixed_seconds: 1.2,
            checkpoint_bytes_per_second: 126e6,
            transfer_bytes_per_second: 1.25e9,
            restore_bytes_per_second: 85e6,
        }
    }

    /// A named preset: `default`, `framework` or `criu-tcg`.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "default" => Some(MoveDowntime::default()),
            "framework" => Some(MoveDowntime::framework_measured()),
            "criu-tcg" => Some(MoveDowntime::criu_measured_tcg()),
            _ => None,
        }
    }

    /// The part of [`MoveDowntime::seconds`] on the node that saves: the fixed pause and the
    /// checkpoint's write (the job is off its cores from the save's start).
    pub fn save_seconds(&self, bytes: u64) -> f64 {
        self.fixed_seconds.max(0.0) + per(bytes, self.checkpoint_bytes_per_second)
    }

    /// The part on the node that starts it again: the transfer and the restore.
    pub fn restore_seconds(&self, bytes: u64) -> f64 {
        per(bytes, self.transfer_bytes_per_second) + per(bytes, self.restore_bytes_per_second)
    }

    /// Seconds a job with a checkpoint of `bytes` is down while it moves.
    pub fn seconds(&self, bytes: u64) -> f64 {
        self.save_seconds(bytes) + self.restore_seconds(bytes)
    }
}

/// The simulated cluster and the daemon's and coordinator's timings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterConfig {
    pub workers: Vec<WorkerSpec>,
    /// Seconds between usage samples and node reports (the daemon samples every second).
    pub usage_interval: f64,
    /// Seconds between a log write and the policy seeing it.
    pub progress_delay: f64,
    /// Seconds between a placement and the job running on its worker.
    pub start_delay: f64,
    pub move_cost: MoveDowntime,
    /// A job is moved at most this many times.
    pub max_moves_per_job: u32,
    /// Stop at this simulated time (jobs still running have no finish time).
    pub horizon: f64,
    /// Record each job's cores over time, per worker (for plots).
    pub record_timeline: bool,
    /// How much of the weights' order the kernel delivers, in [0, 1] (see
    /// [`crate::node::NodeConfig::enforcement`]); 1: exactly.
    #[serde(default = "exactly")]
    pub enforcement: f64,
    /// Record every decision's allocations with the policy's reasons (single-node runs).
    #[serde(default)]
    pub record_decisions: bool,
    /// Contention between co-running jobs beyond their CPU shares (caches, memory bandwidth,
    /// thread pools spinning on shared cores): a job's CPU-seconds per unit of work grow by
    /// this much for each other job running on its worker at the same time (a job counts as
    /// running while it is given more than [`ACTIVE_CORES`]). 0: none (the default). Measured
    /// on real jobs by `cargo xtask bench-real --report-only` (its "Contention" lines): -0.04
    /// to +0.10 for TensorFlow/Keras jobs, about 1.0 for a scikit-learn job whose OpenBLAS runs
    /// more threads than cores (docs/evaluation/simulator.md#contention).
    #[serde(default)]
    pub contention: f64,
    /// Seconds before a started job's CPU use shows in its worker's reports (0: at once; the
    /// daemon reports on every change). The papers' default schedulers placed on resource
    /// reports that lagged: FlowCon §6.4 shows Docker Swarm putting jobs submitted 13 s and
    /// 18 s apart on the same worker, "the latest report from workers fails to reflect the
    /// resources occupied"; ProCon §7 has Kubernetes' default place on "instant resource
    /// usage". Only placement by usage (`usage`, the `default` baseline) reads it; policies that
    /// count the coordinator's own placements do not depend on it.
    #[serde(default)]
    pub usage_lag: f64,
    /// An elastic job is resized only after running this long since its latest start (the
    /// coordinator's `resize_min_run_s`; its default for jobs of minutes, shorter where a
    /// scenario's jobs are, as bench-real's reduced runs set it).
    #[serde(default = "resize_min_run_default")]
    pub resize_min_run_s: f64,
}

fn resize_min_run_default() -> f64 {
    super::RESIZE_MIN_RUN_S
}

/// A job given fewer cores than this does not count as running for [`ClusterConfig::contention`]
/// (the threshold the real runs' fit uses to call a job active).
pub const ACTIVE_CORES: f64 = 0.05;

impl ClusterConfig {
    /// How much slower per CPU-second each job runs beside the others of its worker, given
    /// every job's cores: `1 + contention × (other running jobs)`.
    pub fn contention_factors(&self, cores: &[f64]) -> Vec<f64> {
        let c = self.contention.max(0.0);
        let running = cores.iter().filter(|&&x| x > ACTIVE_CORES).count();
        cores
            .iter()
            .map(|&x| {
                let others = running - usize::from(x > ACTIVE_CORES);
                1.0 + c * others as f64
            })
            .collect()
    }
}

fn exactly() -> f64 {
    1.0
}

impl ClusterConfig {
    /// `workers` identical workers named `w01`, `w02`, ... (zero-padded so name order is index
    /// order, which the placement policies use to break ties).
    pub fn homogeneous(workers: usize, cores: f64, memory_bytes: u64, gpus: u32) -> Self {
        let width = workers.max(1).to_string().len().max(2);
        ClusterConfig {
            workers: (1..=workers)
                .map(|i| WorkerSpec {
                    name: format!("w{i:0width$}"),
                    cores,
                    memory_bytes,
                    gpus,
                })
                .collect(),
            ..ClusterConfig::default()
        }
    }

    /// Workers of the given `(cores, memory, gpus)` shapes, named in order.
    pub fn heterogeneous(shapes: &[(f64, u64, u32)]) -> Self {
        let width = shapes.len().max(1).to_string().len().max(2);
        ClusterConfig {
            workers: shapes
                .iter()
                .enumerate()
                .map(|(i, &(cores, memory_bytes, gpus))| WorkerSpec {
                    name: format!("w{:0width$}", i + 1),
                    cores,
                    memory_bytes,
                    gpus,
                })
                .collect(),
            ..ClusterConfig::default()
        }
    }

    /// The most cores any worker has.
    pub fn max_cores(&self) -> f64 {
        self.workers.iter().map(|w| w.cores).fold(0.0, f64::max)
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            workers: Vec::new(),
            usage_interval: 1.0,
            progress_delay: 0.2,
            start_delay: 1.0,
            move_cost: MoveDowntime::default(),
            max_moves_per_job: 1,
            horizon: 30.0 * 24.0 * 3600.0,
            record_timeline: false,
            enforcement: 1.0,
            record_decisions: false,
            contention: 0.0,
            usage_lag: 0.0,
            resize_min_run_s: super::RESIZE_MIN_RUN_S,
        }
    }
}

/// Seconds to handle `bytes` at `rate` bytes per second (none at a rate of 0: not modelled).
fn per(bytes: u64, rate: f64) -> f64 {
    if rate > 0.0 { bytes as f64 / rate } else { 0.0 }
}
