//! The workloads of `bench-real`: the jobs, their frameworks, sizes and arrivals.

use serde::{Deserialize, Serialize};

/// A training framework the jobs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Framework {
    Keras,
    Sklearn,
}

/// One job of a workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobPlan {
    pub name: String,
    /// Seconds after the workload's start.
    pub at: f64,
    pub framework: Framework,
    pub epochs: u32,
    /// Arguments of the training script (besides --epochs, --log, --times, --summary).
    pub args: Vec<String>,
    /// Environment (thread counts).
    pub env: Vec<(String, String)>,
    /// An elastic job's least and most cores (`govctl submit --cores MIN:MAX`): the coordinator
    /// resizes it by its checkpoint and it runs as many TensorFlow threads as it is given.
    #[serde(default)]
    pub elastic: Option<(u32, u32)>,
}

/// A workload: jobs and their arrivals.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Workload {
    pub name: String,
    pub about: String,
    pub jobs: Vec<JobPlan>,
    /// Lines for the coordinator's `[state]` in a cluster run (timers scaled to the jobs).
    #[serde(default)]
    pub coordinator_state: Vec<String>,
}

pub fn job(name: &str, at: f64, framework: Framework, epochs: u32, args: &[&str]) -> JobPlan {
    JobPlan {
        name: name.into(),
        at,
        framework,
        epochs,
        args: args.iter().map(|s| (*s).to_owned()).collect(),
        env: Vec::new(),
        elastic: None,
    }
}

/// The workloads, sized for a 2-core machine: each run takes about 1.5-2.5 minutes, most of it
/// training (a job's start, TensorFlow's import and its data, costs ~6 CPU-seconds).
pub(crate) fn workloads() -> Vec<Workload> {
    use Framework::{Keras, Sklearn};
    vec![
        Workload {
            name: "mixed".into(),
            about: "four Keras jobs of mixed convergence speeds and sizes, 8 s apart".into(),
            jobs: vec![
                job(
                    "digits-fast",
                    0.0,
                    Keras,
                    50,
                    &["--task", "digits", "--lr", "3e-3"],
                ),
                job(
                    "teacher-slow",
                    8.0,
                    Keras,
                    60,
                    &["--task", "teacher", "--lr", "3e-4"],
                ),
                job(
                    "cnn",
                    16.0,
                    Keras,
                    14,
                    &["--task", "digits_cnn", "--lr", "1e-3"],
                ),
                job(
                    "digits-slow",
                    24.0,
                    Keras,
                    30,
                    &["--task", "digits", "--lr", "2e-4"],
                ),
            ],
            coordinator_state: Vec::new(),
        },
        Workload {
            name: "sweep".into(),
            about: "a learning-rate sweep: six Keras trials at once, most plateau early".into(),
            jobs: ["3e-2", "1e-2", "3e-3", "1e-3", "3e-4", "1e-4"]
                .iter()
                .enumerate()
                .map(|(k, lr)| {
                    job(
                        &format!("trial-lr{lr}"),
                        0.0,
                        Keras,
                        45,
                        &["--task", "digits", "--lr", lr, "--seed", &k.to_string()],
                    )
                })
                .collect(),
            coordinator_state: Vec::new(),
        },
        Workload {
            name: "quiet".into(),
            about: "two busy jobs and one that is quiet for its first 15 s, then pauses 10 s \
                    mid-run (data loading, a checkpoint upload)"
                .into(),
            jobs: vec![
                job(
                    "busy-a",
                    0.0,
                    Keras,
                    50,
                    &["--task", "teacher", "--lr", "1e-3"],
                ),
                job(
                    "busy-b",
                    0.0,
                    Keras,
                    50,
                    &["--task", "digits", "--lr", "1e-3"],
                ),
                job(
                    "quiet",
                    0.0,
                    Keras,
                    50,
                    &[
                        "--task",
                        "digits",
                        "--lr",
                        "1e-3",
                        "--quiet-start",
                        "15",
                        "--pause",
                        "20:10",
                    ],
                ),
            ],
            coordinator_state: Vec::new(),
        },
        Workload {
            name: "threads".into(),
            about: "more threads than cores: a scikit-learn job with 4 BLAS threads and two \
                    Keras jobs with 4 intra-op threads each"
                .into(),
            jobs: vec![
                JobPlan {
                    env: vec![("OPENBLAS_NUM_THREADS".into(), "4".into())],
                    ..job("sklearn-mlp", 0.0, Sklearn, 40, &["--task", "digits"])
                },
                job(
                    "keras-a",
                    4.0,
                    Keras,
                    45,
                    &["--task", "teacher", "--threads", "4"],
                ),
                job(
                    "keras-b",
                    8.0,
                    Keras,
                    45,
                    &["--task", "digits", "--threads", "4"],
                ),
            ],
            coordinator_state: Vec::new(),
        },
    ]
}
