//! Cluster traces: the jobs a cluster run replays, as documented JSON.
//!
//! # Format (version 1)
//!
//! ```json
//! {
//!   "version": 1,
//!   "description": "20 jobs from real loss curves, arrivals uniform in [0, 300] s",
//!   "generator": { ... the parameters that generated it, informative only ... },
//!   "jobs": [
//!     {
//!       "id": "job-001",
//!       "submit": 12.5,                      // seconds since the trace's origin
//!       "work": 950.0,                       // CPU-seconds: seconds alone on exactly one core
//!       "parallelism": 4.0,                  // most cores it keeps busy (threads)
//!       "speedup": {"kind": "amdahl", "parallel_fraction": 0.9},   // or linear, power
//!       "loss": {"kind": "points", "points": [[0.1, 2.3], [0.2, 1.7], ...]},
//!       "noise": 0.0,                        // relative noise added to each logged value
//!       "log_every": {"kind": "work", "fraction": 0.05},           // or {"kind":"seconds","seconds":10}
//!       "reports_total": true,               // its log lines say "k/N"
//!       "memory_bytes": 2147483648,
//!       "priority": 0,
//!       "gpus": 0,                           // whole GPUs it needs on one worker
//!       "checkpoint_bytes": 1610612736,      // what a move carries (default: memory_bytes)
//!       "curve": "keras_csv/cat-classifier_training.log"   // where the loss curve came from
//!     }
//!   ]
//! }
//! ```
//!
//! Everything but `id`, `submit`, `work`, `parallelism`, `speedup`, `loss` and `log_every` has
//! a default, so a trace is easy to write by hand (`sim/examples/demo-trace.json` is `cargo xtask
//! demo` written as a trace). The job
//! fields are [`crate::job::JobModel`]'s, the single-node simulator's job model, plus GPUs and the
//! checkpoint size.
//!
//! # Generated traces (`govsim trace --from-logs DIR`)
//!
//! Every random choice comes from one ChaCha8 stream seeded by `--seed`, drawn job by job in a
//! fixed order, so a seed and the parameters name a trace. The distributions (documented because
//! every result depends on them; each is a [`TraceParams`] field and a `govsim trace` flag):
//!
//! | quantity | distribution | default |
//! | --- | --- | --- |
//! | loss curve | uniform over the usable real curves under DIR ([`crate::curves`]) | |
//! | log granularity | the real run's own: one line per `1/n` of the work for a run that logged `n` values, `n` clamped to `[5, 100]` | |
//! | work | log-uniform in `[work_min, work_max]` CPU-seconds | 300-3000 s |
//! | parallelism | uniform over `parallelism` choices, capped at `max_parallelism` | {1, 2, 4, 8} |
//! | speed-up | Amdahl, parallel fraction uniform in `parallel_fraction` | [0.80, 0.98] |
//! | memory | log-uniform in `[memory_min, memory_max]` | 0.5-8 GiB |
//! | checkpoint | memory × uniform [0.6, 1.0] (CRIU dumps anonymous memory, not page cache) | |
//! | GPUs | 0, or with probability `gpu_share` 1, 2 or 4 (weights 6:3:1) | share 0 |
//! | "k/N" in the log | with probability `reports_total` | 0.5 |
//! | arrival | `uniform:START:END` (sorted uniform draws) or `fixed:START:INTERVAL` | |
//!
//! Job ids follow submission order (`job-001` submits first).

use std::path::Path;

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::curves::{RealCurve, round_sig};
use crate::job::{JobModel, LogEvery, LossCurve, Speedup};

/// The trace format version this code reads and writes.
pub const TRACE_VERSION: u32 = 1;

/// A job of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceJob {
    #[serde(flatten)]
    pub model: JobModel,
    /// Whole GPUs the job needs, all on one worker.
    #[serde(default)]
    pub gpus: u32,
    /// Bytes a move checkpoints, carries and restores; `None` means `memory_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_bytes: Option<u64>,
    /// Where the loss curve came from (informative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curve: Option<String>,
    /// Elastic: the fewest cores it runs with (its `parallelism` is then the most), as
    /// `govctl submit --cores MIN:MAX`. Resized under `+elastic` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cores: Option<f64>,
}

impl TraceJob {
    /// A job around a [`JobModel`], without GPUs.
    pub fn new(model: JobModel) -> Self {
        TraceJob {
            model,
            gpus: 0,
            checkpoint_bytes: None,
            curve: None,
            min_cores: None,
        }
    }

    /// What a move carries.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.checkpoint_bytes.unwrap_or(self.model.memory_bytes)
    }
}

/// A trace: the jobs a cluster run replays.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub version: u32,
    #[serde(default)]
    pub description: String,
    /// How the trace was generated (informative; `null` for hand-written traces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<serde_json::Value>,
    pub jobs: Vec<TraceJob>,
}

/// A trace that cannot be simulated.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading trace {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("parsing trace {path}: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("trace version {0} is not supported (this govsim reads version {TRACE_VERSION})")]
    Version(u32),
    #[error("job {id:?}: {problem}")]
    Job { id: String, problem: String },
}

impl Trace {
    /// Read and validate a trace file.
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let trace: Trace = serde_json::from_str(&text).map_err(|source| TraceError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        trace.validate()?;
        Ok(trace)
    }

    /// Check what the simulator relies on: a known version, unique ids, finite non-negative
    /// submit times, positive work and parallelism, a positive log granularity.
    pub fn validate(&self) -> Result<(), TraceError> {
        if self.version != TRACE_VERSION {
            return Err(TraceError::Version(self.version));
        }
        let mut ids = std::collections::BTreeSet::new();
        for j in &self.jobs {
            let m = &j.model;
            let bad = |problem: &str| TraceError::Job {
                id: m.id.clone(),
                problem: problem.to_owned(),
            };
            if !ids.insert(m.id.as_str()) {
                return Err(bad("duplicate id"));
            }
            if !(m.submit.is_finite() && m.submit >= 0.0) {
                return Err(bad(
                    "submit must be a finite, non-negative number of seconds",
                ));
            }
            if !(m.work.is_finite() && m.work > 0.0) {
                return Err(bad("work must be positive"));
            }
            if !(m.parallelism.is_finite() && m.parallelism > 0.0) {
                return Err(bad("parallelism must be positive"));
            }
            let granularity = match m.log_every {
                LogEvery::Work { fraction } => fraction,
                LogEvery::Seconds { seconds } => seconds,
            };
            if !(granularity.is_finite() && granularity > 0.0) {
                return Err(bad("log_every must be positive"));
            }
            if !(m.startup.is_finite() && m.startup >= 0.0 && m.startup < m.work) {
                return Err(bad("startup must be at least 0 and less than work"));
            }
        }
        Ok(())
    }

    /// The job models, in trace order.
    pub fn models(&self) -> Vec<JobModel> {
        self.jobs.iter().map(|j| j.model.clone()).collect()
    }
}

/// When jobs arrive.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrival {
    /// Independent uniform draws in `[start, end]`, sorted.
    Uniform { start: f64, end: f64 },
    /// `start`, `start + interval`, ...
    Fixed { start: f64, interval: f64 },
}

impl std::str::FromStr for Arrival {
    type Err = String;

    /// `uniform:START:END` or `fixed:START:INTERVAL`.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |v: &str| -> Result<f64, String> {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{v:?} is not a non-negative number in {s:?}"))
        };
        match parts.as_slice() {
            ["uniform", a, b] => {
                let (start, end) = (num(a)?, num(b)?);
                if end < start {
                    return Err(format!("{s:?}: END is before START"));
                }
                Ok(Arrival::Uniform { start, end })
            }
            ["fixed", a, b] => Ok(Arrival::Fixed {
                start: num(a)?,
                interval: num(b)?,
            }),
            _ => Err(format!(
                "{s:?}: expected uniform:START:END or fixed:START:INTERVAL"
            )),
        }
    }
}

impl Arrival {
    /// `n` submit times, sorted.
    pub fn times(&self, n: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
        match *self {
            Arrival::Uniform { start, end } => {
                let mut t: Vec<f64> = (0..n)
                    .map(|_| round_sig(start + rng.random_range(0.0..=1.0) * (end - start), 6))
                    .collect();
                t.sort_by(f64::total_cmp);
                t
            }
            Arrival::Fixed { start, interval } => {
                (0..n).map(|k| start + k as f64 * interval).collect()
            }
        }
    }
}

/// The distributions a generated trace draws from (see the module documentation).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceParams {
    pub jobs: usize,
    pub arrival: Arrival,
    pub seed: u64,
    pub work_min: f64,
    pub work_max: f64,
    pub parallelism: Vec<f64>,
    /// Parallelism never exceeds this (the largest worker's cores).
    pub max_parallelism: f64,
    pub parallel_fraction: (f64, f64),
    pub memory_min: u64,
    pub memory_max: u64,
    pub gpu_share: f64,
    pub reports_total: f64,
}

impl Default for TraceParams {
    fn default() -> Self {
        TraceParams {
            jobs: 20,
            arrival: Arrival::Uniform {
                start: 0.0,
                end: 300.0,
            },
            seed: 1,
            work_min: 300.0,
            work_max: 3000.0,
            parallelism: vec![1.0, 2.0, 4.0, 8.0],
            max_parallelism: f64::INFINITY,
            parallel_fraction: (0.80, 0.98),
            memory_min: 512 << 20,
            memory_max: 8 << 30,
            gpu_share: 0.0,
            reports_total: 0.5,
        }
    }
}

/// Fewest and most log lines a generated job writes over its run.
const LOG_LINES: (usize, usize) = (5, 100);

/// Generate a trace from real curves. Panics if `curves` is empty (the caller checks).
pub fn generate(params: &TraceParams, curves: &[RealCurve]) -> Trace {
    assert!(!curves.is_empty(), "no curves to build a trace from");
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let submits = params.arrival.times(params.jobs, &mut rng);
    let jobs = submits
        .iter()
        .enumerate()
        .map(|(i, &submit)| {
            let curve = &curves[rng.random_range(0..curves.len())];
            let work = round_sig(log_uniform(&mut rng, params.work_min, params.work_max), 4);
            let choices = if params.parallelism.is_empty() {
                &[1.0][..]
            } else {
                &params.parallelism[..]
            };
            let parallelism = choices[rng.random_range(0..choices.len())]
                .min(params.max_parallelism)
                .max(0.1);
            let (lo, hi) = params.parallel_fraction;
            let parallel_fraction =
                round_sig(lo + rng.random_range(0.0..=1.0) * (hi - lo).max(0.0), 4);
            let memory = log_uniform(
                &mut rng,
                params.memory_min as f64,
                params.memory_max.max(params.memory_min) as f64,
            );
            let memory_bytes = (memory / f64::from(1u32 << 20)).round() as u64 * (1 << 20);
            let checkpoint_bytes = (memory_bytes as f64 * rng.random_range(0.6..=1.0)
                / f64::from(1u32 << 20))
            .round() as u64
                * (1 << 20);
            let gpus = if rng.random_bool(params.gpu_share.clamp(0.0, 1.0)) {
                match rng.random_range(0..10) {
                    0..=5 => 1,
                    6..=8 => 2,
                    _ => 4,
                }
            } else {
                0
            };
            let reports_total = rng.random_bool(params.reports_total.clamp(0.0, 1.0));
            let lines = curve.logged_values.clamp(LOG_LINES.0, LOG_LINES.1);
            TraceJob {
                model: JobModel {
                    id: format!("job-{:03}", i + 1),
                    submit,
                    work,
                    parallelism,
                    speedup: Speedup::Amdahl { parallel_fraction },
                    loss: LossCurve::Points {
                        points: curve.points.clone(),
                    },
                    noise: 0.0,
                    log_every: LogEvery::Work {
                        fraction: 1.0 / lines as f64,
                    },
                    reports_total,
                    memory_bytes,
                    priority: 0,
                    startup: 0.0,
                    quiet: Vec::new(),
                    finish: None,
                    sweep: None,
                },
                gpus,
                checkpoint_bytes: Some(checkpoint_bytes),
                curve: Some(curve.source.clone()),
                min_cores: None,
            }
        })
        .collect();
    Trace {
        version: TRACE_VERSION,
        description: format!(
            "{} jobs from {} real loss curves, work {}-{} CPU-seconds, seed {}",
            params.jobs,
            curves.len(),
            params.work_min,
            params.work_max,
            params.seed
        ),
        generator: serde_json::to_value(params).ok(),
        jobs,
    }
}

fn log_uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    let (lo, hi) = (lo.max(1e-9), hi.max(lo.max(1e-9)));
    (lo.ln() + rng.random_range(0.0..=1.0) * (hi.ln() - lo.ln())).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curves() -> Vec<RealCurve> {
        vec![
            RealCurve {
                source: "a.log".into(),
                format: "keras-csv".into(),
                metric: "loss".into(),
                logged_values: 10,
                points: vec![(0.1, 2.0), (0.5, 1.0), (1.0, 0.7)],
            },
            RealCurve {
                source: "b.log".into(),
                format: "hf-console".into(),
                metric: "loss".into(),
                logged_values: 400,
                points: vec![(0.25, 3.0), (1.0, 0.1)],
            },
        ]
    }

    #[test]
    fn a_generated_trace_round_trips_through_json() {
        let params = TraceParams {
            jobs: 50,
            gpu_share: 0.3,
            ..TraceParams::default()
        };
        let trace = generate(&params, &curves());
        trace.validate().unwrap();
        let text = serde_json::to_string_pretty(&trace).unwrap();
        let back: Trace = serde_json::from_str(&text).unwrap();
        assert_eq!(back, trace, "JSON round trip changed the trace");
        assert!(text.contains("\"curve\": \"a.log\"") || text.contains("\"curve\": \"b.log\""));
    }

    #[test]
    fn a_seed_names_a_trace_and_jobs_follow_submission_order() {
        let p = TraceParams::default();
        let a = generate(&p, &curves());
        assert_eq!(a, generate(&p, &curves()));
        assert_ne!(
            a,
            generate(
                &TraceParams {
                    seed: 2,
                    ..p.clone()
                },
                &curves()
            )
        );
        for w in a.jobs.windows(2) {
            assert!(w[0].model.submit <= w[1].model.submit);
            assert!(w[0].model.id < w[1].model.id);
        }
        for j in &a.jobs {
            let m = &j.model;
            assert!((0.0..=300.0).contains(&m.submit), "{m:?}");
            assert!(m.work >= 300.0 * 0.999 && m.work <= 3000.0 * 1.001, "{m:?}");
            assert!(j.checkpoint_bytes() <= m.memory_bytes);
            // The log granularity is the real run's, clamped to 5-100 lines.
            let LogEvery::Work { fraction } = m.log_every else {
                panic!("work-based logging expected")
            };
            let lines = (1.0 / fraction).round();
            assert!(lines == 10.0 || lines == 100.0, "{lines}");
        }
    }

    #[test]
    fn parallelism_is_capped_by_the_largest_worker() {
        let p = TraceParams {
            max_parallelism: 2.0,
            ..TraceParams::default()
        };
        assert!(
            generate(&p, &curves())
                .jobs
                .iter()
                .all(|j| j.model.parallelism <= 2.0)
        );
    }

    #[test]
    fn arrivals_parse_and_fixed_schedules_are_exact() {
        assert_eq!(
            "uniform:0:300".parse::<Arrival>().unwrap(),
            Arrival::Uniform {
                start: 0.0,
                end: 300.0
            }
        );
        let fixed: Arrival = "fixed:10:60".parse().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(fixed.times(3, &mut rng), vec![10.0, 70.0, 130.0]);
        for bad in [
            "uniform:5:1",
            "uniform:1",
            "poisson:1:2",
            "fixed:-1:5",
            "uniform:a:b",
        ] {
            assert!(bad.parse::<Arrival>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn the_hand_written_demo_trace_reads_and_validates() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo-trace.json");
        let t = Trace::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ids: Vec<&str> = t.jobs.iter().map(|j| j.model.id.as_str()).collect();
        assert_eq!(ids, ["resnet-keras", "bert-hf", "gpt-lightning"]);
        // Calibrated on a VM run (docs/evaluation/simulator.md): 17 CPU-s each at 0.6 cores, 5.2 s apart.
        assert!(
            t.jobs
                .iter()
                .all(|j| j.gpus == 0 && j.model.parallelism == 0.6 && j.model.work == 17.0)
        );
        assert_eq!(t.jobs[2].model.submit, 10.6);
    }

    #[test]
    fn invalid_traces_are_rejected_with_the_job_named() {
        let mut t = generate(&TraceParams::default(), &curves());
        t.jobs[3].model.work = 0.0;
        let e = t.validate().unwrap_err().to_string();
        assert!(e.contains("job-004") && e.contains("work"), "{e}");
        let mut t = generate(&TraceParams::default(), &curves());
        t.jobs[1].model.id = t.jobs[0].model.id.clone();
        assert!(t.validate().unwrap_err().to_string().contains("duplicate"));
        let mut t = generate(&TraceParams::default(), &curves());
        t.version = 9;
        assert!(matches!(t.validate(), Err(TraceError::Version(9))));
    }
}
