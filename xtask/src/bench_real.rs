//! `cargo xtask bench-real`: real training processes on this machine's real cores, governed by
//! each node policy and by `fair` on the same arrivals, repeated.
//!
//! What it runs: TensorFlow/Keras (CPU) and scikit-learn jobs (`xtask/realjobs/*.py`), installed
//! by this command into a project-local virtual environment from PyPI (`target/bench/venv`).
//! PyTorch is left out: the PyPI wheels carry the CUDA libraries (several GB) and the CPU-only
//! index is not reachable from these machines. The jobs train on data that ships with
//! scikit-learn or is generated locally, and log through their framework's own means (Keras
//! `CSVLogger`; `print`-style lines for scikit-learn), which the daemon parses like any log.
//!
//! How a run goes (one workload, one policy, one repetition): a release `governor daemon` with
//! the policy starts with its state file and socket in the run directory; each job is started at
//! its arrival time with `governor run-job --epochs N` (its own cgroup under
//! `governor.slice/jobs`, v1 `cpu`/`cpuacct` on a hybrid host, v2 otherwise); while they run, each
//! job's cgroup CPU time is sampled every 0.5 s (the CPU-share plot); when the last one ends the
//! daemon's CPU time is read and it is stopped (it restores everything it changed).
//!
//! Per job: JCT (submission to exit), time to quality (submission until the validation loss
//! first came within 5% of its total reduction, `governor_policy::quality`), CPU-seconds (the
//! job's own `getrusage`), epochs. Per run: makespan, the daemon's CPU. Policies are compared
//! with `fair` of the same repetition (paired: the two run back to back, in alternating order),
//! and the medians over repetitions are reported with their spread (min..max).
//!
//! Output: `target/bench-real/<workload>/results.json`, `summary.md`, and SVG plots (CPU share
//! and loss over time per job, fair against each policy, first repetition).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use governor_policy::Direction;
use governor_policy::quality::time_to_quality;
use serde::{Deserialize, Serialize};
use sim::plot::{self, Panel, Series};

use crate::{calibrate, cmd};

/// PyPI packages of the benchmark's environment, pinned (the versions measured).
const PYTHON_PACKAGES: &[&str] = &[
    "tensorflow-cpu==2.21.0",
    "keras==3.15.1",
    "scikit-learn==1.9.1",
];

/// Arguments of `cargo xtask bench-real`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchRealArgs {
    /// Workloads to run (`all`, or names: mixed, sweep, quiet, threads).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub workload: Vec<String>,
    /// Node policies compared with `fair` (NAME or NAME:KEY=VALUE...). A suffix
    /// `+finish=PATIENCE:MIN_DELTA` also starts every job with `run-job --finish` (finish at
    /// convergence, opt-in); `+sweep=NAME[:ETA:FIRST_RUNG]` starts every job as a trial of one
    /// sweep (`run-job --sweep`, successive halving, opt-in); both may be given.
    #[arg(long, value_delimiter = ',', default_value = "governor")]
    pub policies: Vec<String>,
    /// Repetitions of every pair.
    #[arg(long, default_value_t = 5)]
    pub reps: u32,
    /// Output directory (default target/bench-real).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Declare each job's total epochs (`run-job --epochs`): its size is known to the policy.
    /// `--sizes unknown` runs the jobs without it.
    #[arg(long, default_value = "known")]
    pub sizes: Sizes,
    /// Only aggregate the runs already under the output directory (no new runs).
    #[arg(long)]
    pub report_only: bool,
    /// Extra daemon configuration lines (TOML), e.g. `sample_interval = "500ms"`.
    #[arg(long)]
    pub daemon_config: Vec<String>,
    /// Policies only simulated, in govsim calibrated to the runs (design exploration: every
    /// summary has a "govsim calibrated to these runs" section with fair and `--policies`).
    /// The `+finish=` and `+sweep=` suffixes are simulated too (`fair+finish=5:0.001`).
    #[arg(long, value_delimiter = ',')]
    pub sim_policies: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub(crate) enum Sizes {
    Known,
    Unknown,
}

/// A training framework the jobs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Framework {
    Keras,
    Sklearn,
}

/// One job of a workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JobPlan {
    pub name: String,
    /// Seconds after the workload's start.
    pub at: f64,
    pub framework: Framework,
    pub epochs: u32,
    /// Arguments of the training script (besides --epochs, --log, --times, --summary).
    pub args: Vec<String>,
    /// Environment (thread counts).
    pub env: Vec<(String, String)>,
}

/// A workload: jobs and their arrivals.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Workload {
    pub name: String,
    pub about: String,
    pub jobs: Vec<JobPlan>,
}

pub(crate) fn job(
    name: &str,
    at: f64,
    framework: Framework,
    epochs: u32,
    args: &[&str],
) -> JobPlan {
    JobPlan {
        name: name.into(),
        at,
        framework,
        epochs,
        args: args.iter().map(|s| (*s).to_owned()).collect(),
        env: Vec::new(),
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
        },
    ]
}

/// What one job did in one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct JobResult {
    pub name: String,
    /// Submission, seconds after the run's start.
    pub submitted: f64,
    pub jct: f64,
    /// Time to quality from submission (None: no loss was logged).
    pub ttq: Option<f64>,
    pub cpu_seconds: Option<f64>,
    pub epochs_done: u32,
    pub exit_ok: bool,
    /// (seconds since submission, loss, val_loss) per epoch.
    pub curve: Vec<(f64, f64, f64)>,
    /// (seconds since the run's start, cores) every sample.
    pub cpu_timeline: Vec<(f64, f64)>,
}

/// One run: a workload under one policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunResult {
    pub workload: String,
    pub policy: String,
    pub rep: u32,
    pub sizes: Sizes,
    pub makespan: f64,
    pub daemon_cpu_seconds: f64,
    pub jobs: Vec<JobResult>,
}

impl RunResult {
    pub(crate) fn avg_jct(&self) -> f64 {
        mean(self.jobs.iter().map(|j| j.jct))
    }
    pub(crate) fn avg_ttq(&self) -> Option<f64> {
        let v: Vec<f64> = self.jobs.iter().filter_map(|j| j.ttq).collect();
        (v.len() == self.jobs.len() && !v.is_empty()).then(|| mean(v.into_iter()))
    }
}

/// One job's figure `f` in each of `runs` (where the job has it).
pub(crate) fn job_values(
    runs: &[RunResult],
    name: &str,
    f: &dyn Fn(&JobResult) -> Option<f64>,
) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| f(r.jobs.iter().find(|x| x.name == name)?))
        .collect()
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { f64::NAN } else { s / n as f64 }
}

pub(crate) fn run(args: &BenchRealArgs) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| cmd::target_dir().join("bench-real"));
    let all = workloads();
    let chosen: Vec<Workload> = if args.workload.iter().any(|w| w == "all") {
        all
    } else {
        let mut v = Vec::new();
        for name in &args.workload {
            v.push(
                all.iter()
                    .find(|w| &w.name == name)
                    .cloned()
                    .with_context(|| {
                        format!("no workload {name:?} (mixed, sweep, quiet, threads)")
                    })?,
            );
        }
        v
    };
    if !args.report_only {
        let env = RealEnv::prepare()?;
        for w in &chosen {
            for rep in 1..=args.reps {
                // Paired and alternating: fair first in odd repetitions, last in even ones, so
                // a slow drift of the machine does not favour one side.
                let mut order: Vec<String> = std::iter::once("fair".to_owned())
                    .chain(args.policies.iter().cloned())
                    .collect();
                if rep % 2 == 0 {
                    order.reverse();
                }
                for policy in order {
                    let dir = run_dir(&out, w, &policy, args.sizes, rep);
                    if dir.join("run.json").is_file() {
                        eprintln!("== {} / {policy} / rep {rep}: done already", w.name);
                        continue;
                    }
                    eprintln!("== {} / {policy} / rep {rep}", w.name);
                    let r = env.run_once(w, &policy, args.sizes, rep, &dir, &args.daemon_config)?;
                    eprintln!(
                        "   makespan {:.1} s, avg JCT {:.1} s, avg TTQ {}, daemon CPU {:.2} s",
                        r.makespan,
                        r.avg_jct(),
                        r.avg_ttq().map_or("-".into(), |t| format!("{t:.1} s")),
                        r.daemon_cpu_seconds
                    );
                }
            }
        }
    }
    for w in &chosen {
        let report = aggregate(&out, w, &args.policies, &args.sim_policies, args.sizes)?;
        let dir = out.join(&w.name);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("summary.md"), &report.markdown)?;
        fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(&report.json)?,
        )?;
        for (name, svg) in &report.plots {
            fs::write(dir.join(name), svg)?;
        }
        println!("{}", report.markdown);
    }
    Ok(())
}

pub(crate) fn policy_dir_name(policy: &str) -> String {
    policy
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(crate) fn run_dir(out: &Path, w: &Workload, policy: &str, sizes: Sizes, rep: u32) -> PathBuf {
    let sizes = match sizes {
        Sizes::Known => "known",
        Sizes::Unknown => "unknown",
    };
    out.join(&w.name)
        .join("runs")
        .join(format!("{}-{sizes}-r{rep}", policy_dir_name(policy)))
}

/// The Python environment, the governor binary, and the host's cgroup layout.
pub(crate) struct RealEnv {
    pub python: PathBuf,
    pub governor: PathBuf,
    pub scripts: PathBuf,
    pub cgroup: CgroupLayout,
}

/// Where a job group's CPU time is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CgroupLayout {
    /// `cpuacct/<group>/cpuacct.usage` (ns): v1 or hybrid.
    V1,
    /// `<group>/cpu.stat` `usage_usec`: unified.
    V2,
}

impl RealEnv {
    /// The benchmark's environment: the Python environment and the release daemon.
    pub(crate) fn prepare() -> Result<RealEnv> {
        let python = python_env()?;
        eprintln!("== building the release daemon");
        cmd::run(cmd::cargo().args(["build", "--release", "-p", "governor"]))?;
        RealEnv::new(python, cmd::target_dir().join("release/governor"))
    }

    /// Real jobs run with `python` under the daemon binary `governor`; fails where this host
    /// cannot govern them (not root, no cgroup CPU controller).
    pub(crate) fn new(python: PathBuf, governor: PathBuf) -> Result<RealEnv> {
        if !cmd::is_root() {
            bail!("real jobs run under a root daemon that writes cgroups: run it as root");
        }
        let cgroup = if Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists() {
            CgroupLayout::V1
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            CgroupLayout::V2
        } else {
            bail!("no usable cgroup CPU controller under /sys/fs/cgroup");
        };
        Ok(RealEnv {
            python,
            governor,
            scripts: cmd::workspace_root().join("xtask/realjobs"),
            cgroup,
        })
    }

    fn job_cpu_seconds(&self, group: &str) -> Option<f64> {
        match self.cgroup {
            CgroupLayout::V1 => fs::read_to_string(format!(
                "/sys/fs/cgroup/cpuacct/governor.slice/jobs/{group}/cpuacct.usage"
            ))
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .map(|ns| ns / 1e9),
            CgroupLayout::V2 => {
                let text = fs::read_to_string(format!(
                    "/sys/fs/cgroup/governor.slice/jobs/{group}/cpu.stat"
                ))
                .ok()?;
                text.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))?
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .map(|us| us / 1e6)
            }
        }
    }

    /// Starts the daemon with `policy`; returns it once its socket answers.
    pub(crate) fn start_daemon(
        &self,
        policy: &str,
        dir: &Path,
        extra_config: &[String],
    ) -> Result<Child> {
        let policy = policy.split('+').next().unwrap_or(policy);
        let config = dir.join("governor.toml");
        let mut text = format!(
            "jobs_dir = \"{d}/jobs.d\"\nstate_file = \"{d}/state.json\"\nsocket = \"{d}/governor.sock\"\npolicy = \"{policy}\"\n",
            d = dir.display()
        );
        for line in extra_config {
            text.push_str(line);
            text.push('\n');
        }
        fs::write(&config, text)?;
        fs::create_dir_all(dir.join("jobs.d"))?;
        let log = fs::File::create(dir.join("daemon.log"))?;
        let child = Command::new(&self.governor)
            .arg("daemon")
            .arg("--config")
            .arg(&config)
            .env("GOVERNOR_LOG_LEVEL", "governor=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start the governor daemon")?;
        let socket = dir.join("governor.sock");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!(
                    "the daemon did not open its socket within 20 s; see {}",
                    dir.join("daemon.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(child)
    }

    /// The command that starts job `j` under `governor run-job`.
    pub(crate) fn job_command(
        &self,
        j: &JobPlan,
        sizes: Sizes,
        dir: &Path,
        policy: &str,
    ) -> Command {
        let script = match j.framework {
            Framework::Keras => "train_keras.py",
            Framework::Sklearn => "train_sklearn.py",
        };
        let log = dir.join(format!("{}.log", j.name));
        let mut c = Command::new(&self.governor);
        c.arg("run-job")
            .args(["--name", &j.name])
            .arg("--log")
            .arg(&log)
            .arg("--socket")
            .arg(dir.join("governor.sock"));
        if sizes == Sizes::Known {
            c.args(["--epochs", &j.epochs.to_string()]);
        }
        if let Some(rule) = policy_option(policy, "finish") {
            c.args(["--finish", rule]);
        }
        if let Some(sweep) = policy_option(policy, "sweep") {
            c.args(["--sweep", sweep]);
        }
        c.arg("--")
            .arg(&self.python)
            .arg(self.scripts.join(script))
            .args(["--epochs", &j.epochs.to_string()])
            .arg("--log")
            .arg(&log)
            .arg("--times")
            .arg(dir.join(format!("{}.times", j.name)))
            .arg("--summary")
            .arg(dir.join(format!("{}.summary.json", j.name)))
            .args(&j.args)
            .envs(j.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        c
    }

    pub(crate) fn run_once(
        &self,
        w: &Workload,
        policy: &str,
        sizes: Sizes,
        rep: u32,
        dir: &Path,
        extra_config: &[String],
    ) -> Result<RunResult> {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir)?;
        let slices_before = governor_slices();
        let mut daemon = self.start_daemon(policy, dir, extra_config)?;
        let result = self.drive(w, policy, sizes, rep, dir, &mut daemon);
        let daemon_cpu = process_cpu_seconds(daemon.id()).unwrap_or(f64::NAN);
        stop(&mut daemon);
        remove_new_empty_slices(&slices_before);
        let mut r = result?;
        r.daemon_cpu_seconds = daemon_cpu;
        fs::write(dir.join("run.json"), serde_json::to_string_pretty(&r)?)?;
        Ok(r)
    }

    fn drive(
        &self,
        w: &Workload,
        policy: &str,
        sizes: Sizes,
        rep: u32,
        dir: &Path,
        daemon: &mut Child,
    ) -> Result<RunResult> {
        let t0 = Instant::now();
        let wall0 = unix_now();
        let mut pending: Vec<&JobPlan> = w.jobs.iter().collect();
        pending.sort_by(|a, b| a.at.total_cmp(&b.at));
        let mut running: Vec<(String, Child, f64)> = Vec::new();
        let mut ended: BTreeMap<String, (f64, f64, bool)> = BTreeMap::new();
        let mut timelines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut last_cpu: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let mut next_sample = 0.0;
        let mut next_status = 0.0;
        let mut status_log = fs::File::create(dir.join("status.jsonl"))?;
        let deadline = Duration::from_secs(1800);
        loop {
            let now = t0.elapsed().as_secs_f64();
            while pending.first().is_some_and(|j| j.at <= now) {
                let j = pending.remove(0);
                let out = fs::File::create(dir.join(format!("{}.out", j.name)))?;
                let child = self
                    .job_command(j, sizes, dir, policy)
                    .stdout(out.try_clone()?)
                    .stderr(out)
                    .spawn()
                    .with_context(|| format!("cannot start job {}", j.name))?;
                running.push((j.name.clone(), child, now));
            }
            if now >= next_sample {
                for (name, _, _) in &running {
                    if let Some(c) = self.job_cpu_seconds(name) {
                        if let Some((t, c0)) = last_cpu.get(name)
                            && now > *t
                        {
                            timelines
                                .entry(name.clone())
                                .or_default()
                                .push((now, ((c - c0) / (now - t)).max(0.0)));
                        }
                        last_cpu.insert(name.clone(), (now, c));
                    }
                }
                next_sample = now + 0.5;
            }
            if now >= next_status {
                // The daemon's own view (categories, weights, reasons), for the plots and for
                // finding out why a policy did what it did.
                if let Ok(out) = Command::new(&self.governor)
                    .args(["status", "--json", "--socket"])
                    .arg(dir.join("governor.sock"))
                    .stderr(Stdio::null())
                    .output()
                    && out.status.success()
                {
                    use std::io::Write as _;
                    let _ = writeln!(
                        status_log,
                        "{{\"t\":{now:.2},\"status\":{}}}",
                        String::from_utf8_lossy(&out.stdout).trim()
                    );
                }
                next_status = now + 2.0;
            }
            let mut k = 0;
            while k < running.len() {
                if let Some(status) = running[k].1.try_wait()? {
                    let (name, _, submitted) = running.remove(k);
                    ended.insert(name, (submitted, now - submitted, status.success()));
                } else {
                    k += 1;
                }
            }
            if pending.is_empty() && running.is_empty() {
                break;
            }
            if let Some(status) = daemon.try_wait()? {
                bail!(
                    "the daemon exited during the run ({status}); see {}",
                    dir.join("daemon.log").display()
                );
            }
            if t0.elapsed() > deadline {
                for (_, c, _) in &mut running {
                    let _ = c.kill();
                }
                bail!("the workload did not finish within {deadline:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let makespan = t0.elapsed().as_secs_f64();
        let mut jobs = Vec::new();
        for j in &w.jobs {
            let (submitted, jct, ok) = ended[&j.name];
            let curve = read_times(&dir.join(format!("{}.times", j.name)), wall0 + submitted);
            let quality: Vec<(f64, f64)> = curve
                .iter()
                .map(|&(t, loss, val)| (t, if val.is_finite() { val } else { loss }))
                .collect();
            let summary: Option<serde_json::Value> =
                fs::read_to_string(dir.join(format!("{}.summary.json", j.name)))
                    .ok()
                    .and_then(|s| serde_json::from_str(&s).ok());
            jobs.push(JobResult {
                name: j.name.clone(),
                submitted,
                jct,
                ttq: time_to_quality(&quality, Direction::Minimise),
                cpu_seconds: summary.as_ref().and_then(|s| s["cpu_seconds"].as_f64()),
                epochs_done: curve.len() as u32,
                exit_ok: ok,
                curve,
                cpu_timeline: timelines.remove(&j.name).unwrap_or_default(),
            });
        }
        Ok(RunResult {
            workload: w.name.clone(),
            policy: policy.to_owned(),
            rep,
            sizes,
            makespan,
            daemon_cpu_seconds: 0.0,
            jobs,
        })
    }
}

/// The `governor.slice` groups (and their `jobs`) that exist in any hierarchy.
fn governor_slices() -> Vec<PathBuf> {
    ["", "cpu", "cpuacct", "pids", "unified"]
        .iter()
        .flat_map(|m| {
            let base = Path::new("/sys/fs/cgroup").join(m).join("governor.slice");
            [base.join("jobs"), base]
        })
        .filter(|p| p.is_dir())
        .collect()
}

/// The daemon stops with its job groups removed but leaves the empty `governor.slice/jobs` it
/// made: the benchmark removes those it created (never one that was there before its run; a
/// group that is not empty cannot be removed).
fn remove_new_empty_slices(before: &[PathBuf]) {
    for dir in governor_slices() {
        if !before.contains(&dir) {
            let _ = fs::remove_dir(&dir);
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// `epoch unix_time loss val_loss` lines as (seconds since `origin`, loss, val_loss).
fn read_times(path: &Path, origin: f64) -> Vec<(f64, f64, f64)> {
    let Ok(f) = fs::File::open(path) else {
        return Vec::new();
    };
    std::io::BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            let num = |i: usize| v.get(i).and_then(|s| s.parse::<f64>().ok());
            Some((
                num(1)? - origin,
                num(2).unwrap_or(f64::NAN),
                num(3).unwrap_or(f64::NAN),
            ))
        })
        .collect()
}

/// utime + stime of a process, seconds.
fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// SIGTERM (the daemon restores every limit), then wait.
fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The benchmark's Python environment: created and filled once, then reused (a stamp names the
/// packages installed).
pub(crate) fn python_env() -> Result<PathBuf> {
    cmd::python_venv(
        &cmd::target_dir().join("bench/venv"),
        PYTHON_PACKAGES,
        &[],
        "the real jobs",
    )
}

/// Everything `summary.md` and `results.json` say about one workload.
struct Report {
    markdown: String,
    json: serde_json::Value,
    plots: Vec<(String, String)>,
}

/// Paired comparison of one policy against fair in one repetition.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Pair {
    pub rep: u32,
    /// avg JCT(policy) / avg JCT(fair) - 1.
    pub avg_jct: f64,
    pub avg_ttq: Option<f64>,
    pub makespan: f64,
    /// The largest per-job JCT ratio policy/fair.
    pub worst_jct: f64,
    pub worst_ttq: Option<f64>,
    pub daemon_cpu: f64,
    /// The jobs' CPU-seconds, policy over fair, minus 1.
    pub cpu_seconds: Option<f64>,
    /// The jobs' best validation loss, policy over fair, minus 1 (mean over jobs): what
    /// stopping early gave up.
    pub best_loss: Option<f64>,
}

pub(crate) fn pair(fair: &RunResult, other: &RunResult) -> Pair {
    let by_name = |r: &RunResult| -> BTreeMap<String, JobResult> {
        r.jobs.iter().map(|j| (j.name.clone(), j.clone())).collect()
    };
    let (f, o) = (by_name(fair), by_name(other));
    let worst_jct = o
        .iter()
        .filter_map(|(n, j)| f.get(n).map(|fj| j.jct / fj.jct))
        .fold(0.0, f64::max);
    let ttq_ratios: Vec<f64> = o
        .iter()
        .filter_map(|(n, j)| Some(j.ttq? / f.get(n)?.ttq?))
        .collect();
    Pair {
        rep: other.rep,
        avg_jct: other.avg_jct() / fair.avg_jct() - 1.0,
        avg_ttq: match (other.avg_ttq(), fair.avg_ttq()) {
            (Some(a), Some(b)) => Some(a / b - 1.0),
            _ => None,
        },
        makespan: other.makespan / fair.makespan - 1.0,
        worst_jct,
        worst_ttq: (!ttq_ratios.is_empty()).then(|| ttq_ratios.iter().copied().fold(0.0, f64::max)),
        daemon_cpu: other.daemon_cpu_seconds,
        cpu_seconds: {
            let sum = |r: &RunResult| -> Option<f64> { r.jobs.iter().map(|j| j.cpu_seconds).sum() };
            match (sum(other), sum(fair)) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b - 1.0),
                _ => None,
            }
        },
        best_loss: {
            let rel: Vec<f64> = o
                .iter()
                .filter_map(|(n, j)| {
                    let (a, b) = (best_quality(j)?, best_quality(f.get(n)?)?);
                    (b > 0.0).then(|| a / b - 1.0)
                })
                .collect();
            (!rel.is_empty()).then(|| rel.iter().sum::<f64>() / rel.len() as f64)
        },
    }
}

/// The value of a `+KEY=VALUE` suffix of a policy (`governor+finish=5:0.001+sweep=lr`).
pub(crate) fn policy_option<'a>(policy: &'a str, key: &str) -> Option<&'a str> {
    policy
        .split('+')
        .skip(1)
        .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
}

/// A run's result as the one who launched a sweep sees it: its best job (lowest best loss), that
/// loss, and when that job reached its quality (seconds since the run's start).
pub(crate) fn sweep_result(r: &RunResult) -> Option<(String, f64, Option<f64>)> {
    r.jobs
        .iter()
        .filter_map(|j| Some((j, best_quality(j)?)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(j, loss)| (j.name.clone(), loss, j.ttq.map(|t| j.submitted + t)))
}

/// The best quality value (validation loss, else loss) a job reached.
fn best_quality(j: &JobResult) -> Option<f64> {
    j.curve
        .iter()
        .map(|&(_, l, v)| if v.is_finite() { v } else { l })
        .filter(|v| v.is_finite())
        .reduce(f64::min)
}

/// Median and range of a sample.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

pub(crate) fn spread(mut v: Vec<f64>) -> Option<Spread> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[n - 1],
        n,
    })
}

fn pct(s: Option<Spread>) -> String {
    s.map_or("-".into(), |s| {
        format!(
            "{:+.1}% ({:+.1}..{:+.1})",
            100.0 * s.median,
            100.0 * s.min,
            100.0 * s.max
        )
    })
}

fn ratio(s: Option<Spread>) -> String {
    s.map_or("-".into(), |s| {
        format!("{:.2}x ({:.2}..{:.2})", s.median, s.min, s.max)
    })
}

fn load_runs(out: &Path, w: &Workload, policy: &str, sizes: Sizes) -> Vec<RunResult> {
    let mut runs = Vec::new();
    for rep in 1..=1000 {
        let f = run_dir(out, w, policy, sizes, rep).join("run.json");
        let Ok(text) = fs::read_to_string(&f) else {
            if rep > 50 {
                break;
            }
            continue;
        };
        if let Ok(r) = serde_json::from_str::<RunResult>(&text) {
            runs.push(r);
        }
    }
    runs
}

fn aggregate(
    out: &Path,
    w: &Workload,
    policies: &[String],
    sim_policies: &[String],
    sizes: Sizes,
) -> Result<Report> {
    let fair = load_runs(out, w, "fair", sizes);
    if fair.is_empty() {
        bail!("no fair runs of {} under {}", w.name, out.display());
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### `{}`: {} (sizes {})\n",
        w.name,
        w.about,
        match sizes {
            Sizes::Known => "declared",
            Sizes::Unknown => "unknown",
        }
    );
    let _ = writeln!(
        md,
        "| policy | reps | avg JCT vs fair | avg time to quality vs fair | makespan vs fair | worst job JCT / fair | worst job TTQ / fair | jobs' CPU-s vs fair | best loss vs fair | daemon CPU (s) |"
    );
    let _ = writeln!(
        md,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let fair_jct = spread(fair.iter().map(RunResult::avg_jct).collect());
    let fair_ttq = spread(fair.iter().filter_map(RunResult::avg_ttq).collect());
    let _ = writeln!(
        md,
        "| fair | {} | {} | {} | {} | | | | | {} |",
        fair.len(),
        fair_jct.map_or("-".into(), |s| format!(
            "{:.1} s ({:.1}..{:.1})",
            s.median, s.min, s.max
        )),
        fair_ttq.map_or("-".into(), |s| format!(
            "{:.1} s ({:.1}..{:.1})",
            s.median, s.min, s.max
        )),
        spread(fair.iter().map(|r| r.makespan).collect()).map_or("-".into(), |s| format!(
            "{:.1} s ({:.1}..{:.1})",
            s.median, s.min, s.max
        )),
        spread(fair.iter().map(|r| r.daemon_cpu_seconds).collect())
            .map_or("-".into(), |s| format!("{:.2}", s.median)),
    );
    let mut json_policies = serde_json::Map::new();
    let mut plots = Vec::new();
    let mut per_job_md = String::new();
    let mut all_runs: Vec<(String, Vec<RunResult>)> = Vec::new();
    for policy in policies {
        let runs = load_runs(out, w, policy, sizes);
        all_runs.push((policy.clone(), runs.clone()));
        let pairs: Vec<Pair> = runs
            .iter()
            .filter_map(|r| fair.iter().find(|f| f.rep == r.rep).map(|f| pair(f, r)))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "| {policy} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            pairs.len(),
            pct(spread(pairs.iter().map(|p| p.avg_jct).collect())),
            pct(spread(pairs.iter().filter_map(|p| p.avg_ttq).collect())),
            pct(spread(pairs.iter().map(|p| p.makespan).collect())),
            ratio(spread(pairs.iter().map(|p| p.worst_jct).collect())),
            ratio(spread(pairs.iter().filter_map(|p| p.worst_ttq).collect())),
            pct(spread(pairs.iter().filter_map(|p| p.cpu_seconds).collect())),
            pct(spread(pairs.iter().filter_map(|p| p.best_loss).collect())),
            spread(pairs.iter().map(|p| p.daemon_cpu).collect())
                .map_or("-".into(), |s| format!("{:.2}", s.median)),
        );
        // Per job: median JCT and TTQ ratio against fair over the repetitions.
        let mut per_job = serde_json::Map::new();
        let _ = writeln!(
            per_job_md,
            "\n`{policy}` per job (fair: median over its runs; the policy: its figure over fair's in \
             the same repetition, median (min..max)):\n\n\
             | job | JCT fair | JCT / fair | TTQ fair | TTQ / fair | CPU-s fair | CPU-s / fair |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for j in &w.jobs {
            let fair_median = |f: &dyn Fn(&JobResult) -> Option<f64>| {
                spread(job_values(&fair, &j.name, f))
                    .map_or("-".into(), |s| format!("{:.1}", s.median))
            };
            // The job's figure under the policy over fair's, repetition by repetition.
            let ratios = |f: &dyn Fn(&JobResult) -> Option<f64>| -> Vec<f64> {
                runs.iter()
                    .filter_map(|r| {
                        let fr = fair.iter().find(|x| x.rep == r.rep)?;
                        let a = f(r.jobs.iter().find(|x| x.name == j.name)?)?;
                        let b = f(fr.jobs.iter().find(|x| x.name == j.name)?)?;
                        Some(a / b)
                    })
                    .collect()
            };
            let (jct, ttq, cpu) = (
                spread(ratios(&|x| Some(x.jct))),
                spread(ratios(&|x| x.ttq)),
                spread(ratios(&|x| x.cpu_seconds)),
            );
            let _ = writeln!(
                per_job_md,
                "| {} | {} s | {} | {} s | {} | {} | {} |",
                j.name,
                fair_median(&|x| Some(x.jct)),
                ratio(jct),
                fair_median(&|x| x.ttq),
                ratio(ttq),
                fair_median(&|x| x.cpu_seconds),
                ratio(cpu),
            );
            per_job.insert(
                j.name.clone(),
                serde_json::json!({ "jct_ratio": jct, "ttq_ratio": ttq, "cpu_ratio": cpu }),
            );
        }
        json_policies.insert(
            policy.clone(),
            serde_json::json!({ "pairs": pairs, "per_job": per_job, "runs": runs }),
        );
        if let (Some(f), Some(r)) = (
            fair.iter().min_by_key(|r| r.rep),
            runs.iter().min_by_key(|r| r.rep),
        ) {
            plots.push((
                format!("{}-{}.svg", w.name, policy_dir_name(policy)),
                plot_pair(w, f, r),
            ));
        }
    }
    let _ = writeln!(
        md,
        "\nChanges are medians over the paired repetitions (min..max); a ratio is a job's figure \
         under the policy over its figure under fair in the same repetition, the worst job of \
         each repetition, median (min..max)."
    );
    if w.name == "sweep" {
        md.push_str(&sweep_table(&fair, &all_runs));
    }
    md.push_str(&per_job_md);
    let cores = std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64);
    let (calibration_md, calibration) =
        calibrate::report(out, w, &fair, &all_runs, sim_policies, sizes, cores)?;
    md.push_str(&calibration_md);
    Ok(Report {
        markdown: md,
        json: serde_json::json!({
            "workload": w,
            "sizes": sizes,
            "fair": fair,
            "policies": json_policies,
            "calibration": calibration,
        }),
        plots,
    })
}

/// The sweep's result under each policy against fair, repetition by repetition: which trial is
/// best, its best loss, when it reached its quality and when the sweep ended.
fn sweep_table(fair: &[RunResult], all_runs: &[(String, Vec<RunResult>)]) -> String {
    let mut md = String::from(
        "\nThe sweep's result (its best trial, as the one who launched it picks it), against fair \
         in the same repetition, median (min..max):\n\n\
         | policy | best trial (fair / policy) | its best loss vs fair's | its time to quality vs fair's | sweep's makespan vs fair |\n\
         | --- | --- | ---: | ---: | ---: |\n",
    );
    let named = |runs: &[RunResult]| -> String {
        let mut names: Vec<String> = runs
            .iter()
            .filter_map(|r| sweep_result(r).map(|s| s.0))
            .collect();
        names.sort();
        names.dedup();
        names.join(", ")
    };
    for (policy, runs) in all_runs {
        let (mut loss, mut ttq, mut span) = (Vec::new(), Vec::new(), Vec::new());
        for r in runs {
            let Some(f) = fair.iter().find(|f| f.rep == r.rep) else {
                continue;
            };
            let (Some(a), Some(b)) = (sweep_result(r), sweep_result(f)) else {
                continue;
            };
            loss.push(a.1 / b.1 - 1.0);
            if let (Some(x), Some(y)) = (a.2, b.2) {
                ttq.push(x / y - 1.0);
            }
            span.push(r.makespan / f.makespan - 1.0);
        }
        let _ = writeln!(
            md,
            "| {policy} | {} / {} | {} | {} | {} |",
            named(fair),
            named(runs),
            pct(spread(loss)),
            pct(spread(ttq)),
            pct(spread(span)),
        );
    }
    md
}

/// CPU share and loss over time per job: fair on the left panels, the policy on the right
/// (stacked as four panels: fair CPU, policy CPU, fair loss, policy loss).
pub(crate) fn plot_pair(w: &Workload, fair: &RunResult, other: &RunResult) -> String {
    let cpu = |r: &RunResult| -> Vec<Series> {
        r.jobs
            .iter()
            .map(|j| Series {
                label: j.name.clone(),
                points: j.cpu_timeline.clone(),
            })
            .collect()
    };
    let loss = |r: &RunResult| -> Vec<Series> {
        r.jobs
            .iter()
            .map(|j| Series {
                label: j.name.clone(),
                points: j
                    .curve
                    .iter()
                    .map(|&(t, l, v)| (j.submitted + t, if v.is_finite() { v } else { l }))
                    .collect(),
            })
            .collect()
    };
    let panel = |title: String, y: &str, series: Vec<Series>, range| Panel {
        title,
        y_label: y.into(),
        series,
        y_range: range,
    };
    plot::lines(
        &format!(
            "{}: fair against {} (repetition {})",
            w.name, other.policy, other.rep
        ),
        "seconds since the workload started",
        &[
            panel(
                format!("CPU (cores) under fair, makespan {:.0} s", fair.makespan),
                "cores",
                cpu(fair),
                Some((0.0, 2.1)),
            ),
            panel(
                format!(
                    "CPU (cores) under {}, makespan {:.0} s",
                    other.policy, other.makespan
                ),
                "cores",
                cpu(other),
                Some((0.0, 2.1)),
            ),
            panel(
                "validation loss under fair".into(),
                "loss",
                loss(fair),
                None,
            ),
            panel(
                format!("validation loss under {}", other.policy),
                "loss",
                loss(other),
                None,
            ),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: &str, rep: u32, jobs: &[(&str, f64, f64)]) -> RunResult {
        RunResult {
            workload: "w".into(),
            policy: policy.into(),
            rep,
            sizes: Sizes::Known,
            makespan: jobs.iter().map(|j| j.1).fold(0.0, f64::max),
            daemon_cpu_seconds: 0.1,
            jobs: jobs
                .iter()
                .map(|&(n, jct, ttq)| JobResult {
                    name: n.into(),
                    submitted: 0.0,
                    jct,
                    ttq: Some(ttq),
                    cpu_seconds: None,
                    epochs_done: 1,
                    exit_ok: true,
                    curve: Vec::new(),
                    cpu_timeline: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn pairs_compare_averages_and_name_the_worst_job() {
        let fair = run("fair", 1, &[("a", 100.0, 50.0), ("b", 100.0, 80.0)]);
        let gov = run("governor", 1, &[("a", 60.0, 20.0), ("b", 110.0, 80.0)]);
        let p = pair(&fair, &gov);
        assert!((p.avg_jct - (-0.15)).abs() < 1e-9);
        assert!((p.avg_ttq.unwrap() - (100.0 / 130.0 - 1.0)).abs() < 1e-9);
        assert!((p.worst_jct - 1.1).abs() < 1e-9);
        assert!((p.worst_ttq.unwrap() - 1.0).abs() < 1e-9);
        assert!((p.makespan - 0.1).abs() < 1e-9);
    }

    #[test]
    fn policy_options_and_the_sweeps_result() {
        let p = "governor:probe_offer=1.5+finish=5:0.001+sweep=lr:3:5";
        assert_eq!(policy_option(p, "finish"), Some("5:0.001"));
        assert_eq!(policy_option(p, "sweep"), Some("lr:3:5"));
        assert_eq!(policy_option("governor", "sweep"), None);
        assert_eq!(
            policy_option("governor:sweep=1", "sweep"),
            None,
            "a policy parameter"
        );
        let mut r = run("governor", 1, &[("a", 100.0, 50.0), ("b", 40.0, 20.0)]);
        r.jobs[0].curve = vec![(10.0, 0.5, 0.4), (20.0, 0.3, 0.2)];
        r.jobs[1].curve = vec![(10.0, 0.5, 0.3), (20.0, 0.4, f64::NAN)];
        r.jobs[1].submitted = 5.0;
        assert_eq!(sweep_result(&r), Some(("a".into(), 0.2, Some(50.0))));
        r.jobs[1].curve.push((30.0, 0.1, f64::NAN));
        assert_eq!(sweep_result(&r), Some(("b".into(), 0.1, Some(25.0))));
    }

    #[test]
    fn spread_is_the_median_and_range() {
        let s = spread(vec![3.0, 1.0, 2.0, f64::NAN]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(spread(vec![1.0, 4.0]).unwrap().median, 2.5);
        assert!(spread(Vec::new()).is_none());
    }

    #[test]
    fn times_lines_become_curves_relative_to_submission() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("j.times");
        fs::write(&f, "1 1000.5 0.9 0.8\n2 1002.0 0.5 nan\ngarbage\n").unwrap();
        let c = read_times(&f, 1000.0);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].0, c[0].1, c[0].2), (0.5, 0.9, 0.8));
        assert!(c[1].2.is_nan());
    }

    #[test]
    fn every_workload_has_distinct_job_names() {
        for w in workloads() {
            let mut names: Vec<&str> = w.jobs.iter().map(|j| j.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), w.jobs.len(), "{}", w.name);
        }
    }
}
