//! `cargo xtask bench-real`: real training processes on this machine's real cores, governed by
//! each node policy and by `fair` on the same arrivals, repeated.
//!
//! What it runs: TensorFlow/Keras (CPU) and scikit-learn jobs (`eval/realjobs/*.py`), installed
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

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use governor_testbed::cmd;
use serde::{Deserialize, Serialize};

mod cluster;
mod results;
mod round;
mod summary;
mod workload;

// The demo (xtask) runs these jobs too: what it uses is `pub`.
pub use results::{
    JobResult, RunResult, node_spec, old_spellings, policy_option, secs, sweep_result,
};
pub(crate) use results::{job_values, spread};
pub use round::{CgroupLayout, RealEnv, python_env};
use summary::aggregate;
pub(crate) use workload::workloads;
pub use workload::{Framework, JobPlan, Workload, job};

/// Arguments of `cargo xtask bench-real`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchRealArgs {
    /// Workloads to run (`all`, or names: mixed, sweep, quiet, threads).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    pub workload: Vec<String>,
    /// Node policies compared with `fair` (NAME or NAME:KEY=VALUE...). A suffix
    /// `+finish=PATIENCE:MIN_DELTA` also starts every job with `run-job --finish` (finish at
    /// convergence, opt-in); `+sweep=NAME[:ETA:FIRST_RUNG[:seen]]` starts every job as a trial of one
    /// sweep (`run-job --sweep`, successive halving, opt-in); both may be given.
    #[arg(long, value_delimiter = ',', default_value = governor_policy::DEFAULT_POLICY)]
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
    /// Run a cluster: a coordinator and this many node daemons, each pinned to its share of the
    /// cores, with the papers' cluster workloads (procon, specon, flowcon, and elastic where a
    /// node has 2 cores or more: `--nodes 1` on this machine) and policies written
    /// NODE/PLACEMENT (`fair` is fair/spread). Without it: one daemon, no coordinator.
    #[arg(long)]
    pub nodes: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum Sizes {
    Known,
    Unknown,
}

pub fn run(args: &BenchRealArgs) -> Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| cmd::target_dir().join("bench-real"));
    if args.nodes == Some(0) {
        bail!("--nodes must be at least 1");
    }
    let env = if args.report_only {
        None
    } else {
        Some(RealEnv::prepare(args.nodes.is_some())?)
    };
    let all = if let Some(nodes) = args.nodes {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_node = cluster::node_cpus(0, nodes, cpus).len();
        cluster::workloads(&cluster::probe(env.as_ref(), &out)?, nodes, per_node)
    } else {
        workloads()
    };
    let names: Vec<&str> = all.iter().map(|w| w.name.as_str()).collect();
    let chosen: Vec<Workload> = if args.workload.iter().any(|w| w == "all") {
        all
    } else {
        let mut v = Vec::new();
        for name in &args.workload {
            v.push(
                all.iter()
                    .find(|w| &w.name == name)
                    .cloned()
                    .with_context(|| format!("no workload {name:?} ({})", names.join(", ")))?,
            );
        }
        v
    };
    if let Some(env) = &env {
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
                    let r = if let Some(nodes) = args.nodes {
                        env.run_cluster_once(
                            w,
                            &policy,
                            args.sizes,
                            rep,
                            &dir,
                            nodes,
                            &args.daemon_config,
                        )?
                    } else {
                        env.run_once(w, &policy, args.sizes, rep, &dir, &args.daemon_config)?
                    };
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
        let report = aggregate(
            &out,
            w,
            &args.policies,
            &args.sim_policies,
            args.sizes,
            args.nodes.is_some(),
        )?;
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

pub fn policy_dir_name(policy: &str) -> String {
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

#[cfg(test)]
#[path = "bench_real_tests.rs"]
mod tests;
