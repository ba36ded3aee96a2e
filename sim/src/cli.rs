//! `govsim` subcommands.
//!
//! ```text
//! govsim node --policy learning-first --jobs 6 --cores 4 --seed 1   # one policy vs fair
//! govsim node --policy all --jobs 6 --cores 4 --seed 1             # every policy, same workload
//! govsim node --scenario jobs.json --policy flowcon --timeline     # a hand-written workload
//! govsim node --jobs 6 --cores 4 --seed 1 --dump-scenario          # print the generated workload
//! govsim sweep --jobs 3,6,10 --cores 2,4,8,16 --seeds 1-10 --policy all   # aggregate table
//!
//! govsim trace --from-logs ../shared/fixtures/logs --jobs 20 --arrival uniform:0:300 --seed 1 > trace.json
//! govsim run --trace trace.json --policy shortest-left/soonest --workers 4 --cores 8 --seed 1
//! govsim compare --trace trace.json --workers 4 --cores 8 --plots out/
//! govsim paper flowcon                                   # a paper's setup, every policy
//! govsim hpo --seeds 1-5                                # one sweep across 3 workers
//! govsim bench --workers 1000 --jobs 10000               # simulator speed
//! ```

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use governor_policy::{self as policy, NodePolicy};
use serde_json::json;

use sim::Scenario;
use sim::cluster::{ClusterConfig, PolicySpec};
use sim::compare::{PolicyOutcome, compare, summarise};
use sim::curves;
use sim::evaluate;
use sim::node::NodeConfig;
use sim::trace::{self, Arrival, Trace, TraceParams};
use sim::workload::{WorkloadParams, generate};

/// govsim: run node policies on simulated training jobs.
#[derive(Debug, Parser)]
#[command(name = "govsim", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate one node: one or more policies on the same workload, compared with `fair`.
    Node(NodeArgs),
    /// Simulate many generated workloads and print each policy's aggregate against `fair`.
    Sweep(SweepArgs),
    /// Generate a cluster trace from real training logs (JSON on stdout).
    Trace(TraceArgs),
    /// Run one policy on a trace and compare each job with `fair` (JSON on stdout).
    Run(RunArgs),
    /// Run fair, flowcon, specon, procon, fifo and ours on a trace: a table and SVG plots.
    Compare(CompareArgs),
    /// A paper's evaluation setup, every policy: `govsim paper list` names them.
    Paper(PaperArgs),
    /// Mixed priorities on a full cluster, with and without preemption by checkpoint.
    Priority(PriorityArgs),
    /// Elastic jobs under Schedulearn's elastic FIFO, DRAGON, the Kubeflow scheduler and ours,
    /// against FIFO without elasticity: `kubeflow-4`, `kubeflow`, `schedulearn`, `priority` and
    /// `reduced` scenarios.
    Elastic(ElasticArgs),
    /// One hyperparameter sweep across 3 workers, judged by the planner's asynchronous
    /// successive halving (ranked by prediction, and by the loss seen), against the full sweep.
    Hpo(HpoArgs),
    /// GPU power by training progress on and off (`+gpu-power`): GPU energy, time to quality, JCT.
    Gpu(GpuArgs),
    /// Time the simulator on a large generated cluster.
    Bench(BenchArgs),
    /// How well the learning-curve predictors foresee the real curves of the fixtures from 25%,
    /// 50% and 75% of each run
    Predict(PredictArgs),
}

#[derive(Debug, Args)]
struct PredictArgs {
    /// Directory of real training logs [default: $GOVERNOR_FIXTURES, else the first
    /// shared/fixtures/logs in this directory or one above it].
    #[arg(long, default_value_os_t = default_logs(), hide_default_value = true)]
    logs: PathBuf,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct TraceArgs {
    /// Directory of real training logs (read recursively with the daemon's parsers).
    #[arg(long)]
    from_logs: PathBuf,
    /// Number of jobs.
    #[arg(long, default_value_t = 20)]
    jobs: usize,
    /// `uniform:START:END` or `fixed:START:INTERVAL`, seconds.
    #[arg(long, default_value = "uniform:0:300")]
    arrival: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Smallest job, CPU-seconds.
    #[arg(long, default_value_t = 300.0)]
    work_min: f64,
    /// Largest job, CPU-seconds.
    #[arg(long, default_value_t = 3000.0)]
    work_max: f64,
    /// Parallelism limits to draw from, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    parallelism: Vec<f64>,
    /// Cap on parallelism (the largest worker's cores).
    #[arg(long)]
    max_parallelism: Option<f64>,
    /// Amdahl parallel fraction range `LO-HI`.
    #[arg(long, default_value = "0.8-0.98")]
    parallel_fraction: String,
    /// Smallest job memory, GiB.
    #[arg(long, default_value_t = 0.5)]
    memory_min_gib: f64,
    /// Largest job memory, GiB.
    #[arg(long, default_value_t = 8.0)]
    memory_max_gib: f64,
    /// Probability that a job needs GPUs.
    #[arg(long, default_value_t = 0.0)]
    gpu_share: f64,
    /// Probability that a job's log says "k/N".
    #[arg(long, default_value_t = 0.5)]
    reports_total: f64,
    /// Also list the log files that gave no usable curve, and why, on stderr.
    #[arg(long)]
    verbose: bool,
}

#[derive(Clone, Debug, Args)]
struct ClusterArgs {
    /// Number of workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Cores per worker.
    #[arg(long, default_value_t = 8.0)]
    cores: f64,
    /// Memory per worker, GiB.
    #[arg(long, default_value_t = 64.0)]
    memory_gib: f64,
    /// GPUs per worker.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// Seconds between a placement and the job running.
    #[arg(long, default_value_t = 1.0)]
    start_delay: f64,
    /// Seconds between a log write and the node policy seeing it.
    #[arg(long, default_value_t = 0.2)]
    progress_delay: f64,
    /// Seconds between usage samples (the daemon's `sample_interval`).
    #[arg(long, default_value_t = 1.0)]
    usage_interval: f64,
    /// Contention beyond CPU shares: a job's CPU-seconds per unit of work grow by this much
    /// per other job running on its worker (bench-real measured up to 0.10 for Keras jobs and
    /// 1.0 for an OpenBLAS job with more threads than cores).
    #[arg(long, default_value_t = 0.0)]
    contention: f64,
    /// Seed (log noise).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Trace file (`-` for stdin).
    #[arg(long)]
    trace: PathBuf,
    /// `NODE_POLICY[/PLACEMENT][+FLAG]`, or a system name: fair, flowcon, specon, procon,
    /// fifo, ours. Flags: +no-move, +reserve, +rebalance (SpeCon's Algorithm 3), +pays,
    /// +preempt, +elastic, +least, +scratch (a saved job starts again from scratch), +gpu-power,
    /// +gpu-fixed.
    #[arg(long)]
    policy: String,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Include the jobs' workers and moves, and every move decision.
    #[arg(long)]
    verbose: bool,
}

#[derive(Debug, Args)]
struct CompareArgs {
    /// Trace file (`-` for stdin).
    #[arg(long)]
    trace: PathBuf,
    /// Policies to compare (default: fair, flowcon, specon, procon, fifo, ours).
    #[arg(long, value_delimiter = ',')]
    policy: Vec<String>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Write SVG plots (per-job JCT by policy; CPU share over time per worker) here.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Print JSON instead of a Markdown table.
    #[arg(long)]
    json: bool,
}

/// Where the real training logs are when `--logs` is not given: `GOVERNOR_FIXTURES`, else the
/// first `shared/fixtures/logs` in the current directory or one above it (a checkout beside
/// `shared/`, as the fixture tests find it), else that relative path (which then says, when it
/// is read, that it is not there).
fn default_logs() -> PathBuf {
    if let Some(dir) = std::env::var_os("GOVERNOR_FIXTURES") {
        return dir.into();
    }
    let relative = std::path::Path::new("shared/fixtures/logs");
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            cwd.ancestors()
                .map(|d| d.join(relative))
                .find(|d| d.is_dir())
        })
        .unwrap_or_else(|| relative.to_path_buf())
}

#[derive(Debug, Args)]
struct PaperArgs {
    /// Scenario name, or `list`, or `all`.
    name: String,
    /// Seeds to run (each generates its own trace): `1-5` or `1,3`.
    #[arg(long)]
    seeds: Option<String>,
    /// Directory of real training logs for the loss curves [default: $GOVERNOR_FIXTURES, else
    /// the first shared/fixtures/logs in this directory or one above it].
    #[arg(long, default_value_os_t = default_logs(), hide_default_value = true)]
    logs: PathBuf,
    /// Write each seed's trace, table and plots here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    json: bool,
    /// Also run this system (repeatable), e.g. `shortest-left:slack=0.2/soonest`.
    #[arg(long)]
    also: Vec<String>,
    /// What a move costs: `default` (2 s + 500 MB/s dump, 10 Gbit/s, 1 GB/s restore),
    /// `framework` (measured by `cargo xtask bench-move --framework`) or `criu-tcg` (measured
    /// by `cargo xtask bench-move` in the VM bed, TCG).
    #[arg(long)]
    move_cost: Option<String>,
    /// Contention beyond CPU shares: a job's CPU-seconds per unit of work grow by this much
    /// per other job running on its worker. Presets measured by bench-real on real cores:
    /// `keras` (0.10, TensorFlow/Keras jobs) and `blas` (1.0, OpenBLAS with more threads than
    /// cores); 0 (the default) models none. Several, comma-separated (`0,keras,blas`): a table
    /// of each paper's system, ours and fair against the paper's baseline under each.
    #[arg(long, default_value = "0")]
    contention: String,
    /// Seconds before a started job's CPU use shows in its node's reports, which placement by
    /// usage (the papers' `default` baseline) decides on: the papers' default schedulers read
    /// reports that lagged (FlowCon §6.4: jobs 13 s and 18 s apart stacked). 0 (the default):
    /// at once, as the daemon reports. Several, comma-separated (`0,20,40`): the table of
    /// `--contention` under each.
    #[arg(long, default_value = "0")]
    usage_lag: String,
}

#[derive(Debug, Args)]
struct PriorityArgs {
    /// Seeds to run (each generates its own trace): `1-5` or `1,3`.
    #[arg(long, default_value = "1-5")]
    seeds: String,
    /// Directory of real training logs for the loss curves [default: $GOVERNOR_FIXTURES, else
    /// the first shared/fixtures/logs in this directory or one above it].
    #[arg(long, default_value_os_t = default_logs(), hide_default_value = true)]
    logs: PathBuf,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    json: bool,
    /// What a displaced job's save and restore cost: `default`, `framework` or `criu-tcg`.
    #[arg(long)]
    move_cost: Option<String>,
}

#[derive(Debug, Args)]
struct GpuArgs {
    /// Seeds to run: `1-5` or `1,3`.
    #[arg(long, default_value = "1-5")]
    seeds: String,
    /// Directory of real training logs for the loss curves [default: $GOVERNOR_FIXTURES, else
    /// the first shared/fixtures/logs in this directory or one above it].
    #[arg(long, default_value_os_t = default_logs(), hide_default_value = true)]
    logs: PathBuf,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ElasticArgs {
    /// One scenario (kubeflow-4, kubeflow, schedulearn, priority, reduced, or reduced-xK: its jobs K times longer); default: all five.
    scenario: Option<String>,
    /// Seeds to run (each generates its own trace): `1-5` or `1,3`.
    #[arg(long, default_value = "1-5")]
    seeds: String,
    /// Directory of real training logs for the loss curves [default: $GOVERNOR_FIXTURES, else
    /// the first shared/fixtures/logs in this directory or one above it].
    #[arg(long, default_value_os_t = default_logs(), hide_default_value = true)]
    logs: PathBuf,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    json: bool,
    /// What a resize's (or displaced job's) save and restore cost: `default`, `framework` or
    /// `criu-tcg`.
    #[arg(long)]
    move_cost: Option<String>,
}

#[derive(Debug, Args)]
struct HpoArgs {
    /// Seeds to run (each draws its own best learning rate): `1-5` or `1,3`.
    #[arg(long, default_value = "1-5")]
    seeds: String,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct BenchArgs {
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    #[arg(long, default_value_t = 8.0)]
    cores: f64,
    /// Policy to time.
    #[arg(long, default_value = "ours")]
    policy: String,
    /// Directory of real training logs (synthetic curves when absent).
    #[arg(long)]
    logs: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Debug, Args)]
struct WorkloadArgs {
    /// Probability that a job's log lines carry "k/N" (how far along it is).
    #[arg(long, default_value_t = 1.0)]
    reports_total: f64,
    /// Arrivals spread over this many seconds (default: a quarter of total work / cores).
    #[arg(long)]
    arrival_window: Option<f64>,
    /// Smallest job, seconds of work on one core.
    #[arg(long, default_value_t = 300.0)]
    work_min: f64,
    /// Largest job, seconds of work on one core.
    #[arg(long, default_value_t = 3000.0)]
    work_max: f64,
    /// Amdahl parallel fraction range `LO-HI` (`1-1`: perfect scaling).
    #[arg(long, default_value = "0.8-0.98")]
    parallel_fraction: String,
    /// Seconds between a log write and the policy seeing it.
    #[arg(long, default_value_t = 0.2)]
    progress_delay: f64,
}

#[derive(Debug, Args)]
struct NodeArgs {
    /// Policies (names or specs like `shortest-left:floor=0.5`), comma-separated or repeated; `all`
    /// for every built-in policy. `fair` always runs as the reference.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    policy: Vec<String>,
    /// Number of generated jobs.
    #[arg(long, default_value_t = 6)]
    jobs: usize,
    /// Cores of the node.
    #[arg(long, default_value_t = 4.0)]
    cores: f64,
    /// Workload seed (also seeds log noise).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Read the node and jobs from a scenario JSON file instead of generating them.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Print the scenario (generated or read) as JSON and exit.
    #[arg(long)]
    dump_scenario: bool,
    /// Include each job's cores over time in the output.
    #[arg(long)]
    timeline: bool,
    /// Include every decision (weights, caps and the policy's reasons) in the output.
    #[arg(long)]
    decisions: bool,
    #[command(flatten)]
    workload: WorkloadArgs,
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// Policies, as for `node`.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    policy: Vec<String>,
    /// Job counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "3,6,10")]
    jobs: Vec<usize>,
    /// Core counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16")]
    cores: Vec<f64>,
    /// Seeds: `1-10` or `1,2,5`.
    #[arg(long, default_value = "1-10")]
    seeds: String,
    /// Print a Markdown table instead of JSON.
    #[arg(long)]
    markdown: bool,
    #[command(flatten)]
    workload: WorkloadArgs,
}

/// Entry point of the binary.
pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Node(args) => run_node_command(args),
        Command::Sweep(args) => run_sweep_command(args),
        Command::Trace(args) => trace_command(args),
        Command::Run(args) => run_command(args),
        Command::Compare(args) => compare_command(args),
        Command::Paper(args) => paper_command(args),
        Command::Priority(args) => priority_command(args),
        Command::Elastic(args) => elastic_command(args),
        Command::Hpo(args) => {
            parse_seeds(&args.seeds).and_then(|s| sim::hpo::command(s, args.json))
        }
        Command::Gpu(args) => {
            parse_seeds(&args.seeds).and_then(|s| sim::gpu::eval::command(s, &args.logs, args.json))
        }
        Command::Bench(args) => bench_command(args),
        Command::Predict(args) => sim::predict::command(&args.logs, args.json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("govsim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_range(s: &str, what: &str) -> Result<(f64, f64)> {
    let (lo, hi) = s
        .split_once('-')
        .with_context(|| format!("{what} is LO-HI"))?;
    let lo: f64 = lo.trim().parse().with_context(|| format!("{what} LO"))?;
    let hi: f64 = hi.trim().parse().with_context(|| format!("{what} HI"))?;
    if !(0.0..=1.0).contains(&lo) || !(lo..=1.0).contains(&hi) {
        bail!("{what} needs 0 <= LO <= HI <= 1");
    }
    Ok((lo, hi))
}

const GIB: f64 = (1u64 << 30) as f64;

fn trace_command(args: TraceArgs) -> Result<()> {
    let arrival: Arrival = args
        .arrival
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--arrival: {e}"))?;
    if !(args.work_min > 0.0 && args.work_max >= args.work_min) {
        bail!("--work-min and --work-max need 0 < MIN <= MAX");
    }
    if !(args.memory_min_gib > 0.0 && args.memory_max_gib >= args.memory_min_gib) {
        bail!("--memory-min-gib and --memory-max-gib need 0 < MIN <= MAX");
    }
    if args
        .parallelism
        .iter()
        .any(|p| !(p.is_finite() && *p > 0.0))
    {
        bail!("--parallelism values must be positive");
    }
    let (curves, skipped) = curves::load_dir(&args.from_logs)
        .with_context(|| format!("reading logs under {}", args.from_logs.display()))?;
    if args.verbose {
        for s in &skipped {
            eprintln!("govsim: skipped {}: {}", s.source, s.reason);
        }
    }
    if curves.is_empty() {
        bail!(
            "no usable loss curve under {} ({} files skipped; --verbose says why)",
            args.from_logs.display(),
            skipped.len()
        );
    }
    eprintln!(
        "govsim: {} loss curves from {} ({} files skipped)",
        curves.len(),
        args.from_logs.display(),
        skipped.len()
    );
    let params = TraceParams {
        jobs: args.jobs,
        arrival,
        seed: args.seed,
        work_min: args.work_min,
        work_max: args.work_max,
        parallelism: args.parallelism,
        max_parallelism: args.max_parallelism.unwrap_or(f64::INFINITY),
        parallel_fraction: parse_range(&args.parallel_fraction, "--parallel-fraction")?,
        memory_min: (args.memory_min_gib * GIB) as u64,
        memory_max: (args.memory_max_gib * GIB) as u64,
        gpu_share: args.gpu_share,
        reports_total: args.reports_total,
    };
    let trace = trace::generate(&params, &curves);
    println!("{}", serde_json::to_string_pretty(&trace)?);
    Ok(())
}

fn read_trace(path: &Path) -> Result<Trace> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the trace from stdin")?;
        let trace: Trace = serde_json::from_str(&text).context("parsing the trace from stdin")?;
        trace.validate()?;
        return Ok(trace);
    }
    Ok(Trace::read(path)?)
}

fn contention(c: f64) -> Result<f64> {
    if !(c.is_finite() && c >= 0.0) {
        bail!("--contention must be 0 or more (got {c})");
    }
    Ok(c)
}

/// `govsim paper --usage-lag`: comma-separated seconds, each 0 or more.
fn usage_lags(list: &str) -> Result<Vec<f64>> {
    list.split(',')
        .map(|s| {
            let lag: f64 = s
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("--usage-lag {s:?}: seconds"))?;
            if !(lag.is_finite() && lag >= 0.0) {
                bail!("--usage-lag must be 0 or more seconds (got {lag})");
            }
            Ok(lag)
        })
        .collect()
}

/// `govsim paper --contention`: comma-separated numbers or presets (`keras`, `blas`).
fn contentions(list: &str) -> Result<Vec<f64>> {
    list.split(',')
        .map(|c| match sim::paper::contention_preset(c.trim()) {
            Some(c) => Ok(c),
            None => contention(
                c.trim()
                    .parse()
                    .map_err(|_| anyhow::anyhow!("--contention {c:?}: a number, keras or blas"))?,
            ),
        })
        .collect()
}

fn cluster_config(args: &ClusterArgs) -> Result<ClusterConfig> {
    if args.workers == 0 {
        bail!("--workers must be at least 1");
    }
    if !(args.cores.is_finite() && args.cores > 0.0) {
        bail!("--cores must be positive");
    }
    if !(args.memory_gib.is_finite() && args.memory_gib > 0.0) {
        bail!("--memory-gib must be positive");
    }
    let mut config = ClusterConfig::homogeneous(
        args.workers,
        args.cores,
        (args.memory_gib * GIB) as u64,
        args.gpus,
    );
    config.start_delay = args.start_delay.max(0.0);
    config.progress_delay = args.progress_delay.max(0.0);
    if !(args.usage_interval.is_finite() && args.usage_interval > 0.0) {
        bail!("--usage-interval must be positive");
    }
    config.usage_interval = args.usage_interval;
    config.contention = contention(args.contention)?;
    Ok(config)
}

fn parse_spec(s: &str) -> Result<PolicySpec> {
    s.parse::<PolicySpec>()
        .map_err(|e| anyhow::anyhow!("--policy: {e}"))
}

fn run_command(args: RunArgs) -> Result<()> {
    let trace = read_trace(&args.trace)?;
    let config = cluster_config(&args.cluster)?;
    let spec = parse_spec(&args.policy)?;
    let report = evaluate::evaluate(&trace, &config, &[spec], args.cluster.seed)?
        .pop()
        .expect("one spec, one report");
    let jobs: Vec<serde_json::Value> = report
        .jobs
        .iter()
        .map(|j| {
            let mut v = json!({
                "id": j.id,
                "submit": j.submit,
                "finish": j.finish,
                "jct": j.jct,
                "slowdown_vs_fair": j.slowdown_vs_fair,
            });
            if args.verbose {
                v["worker"] = json!(j.worker);
                v["moves"] = json!(j.moves);
            }
            v
        })
        .collect();
    let mut out = json!({
        "policy": report.policy,
        "jobs": jobs,
        "avg_jct": report.avg_jct,
        "makespan": report.makespan,
        "max_slowdown_vs_fair": finite_or_null(report.max_slowdown_vs_fair),
        "avg_jct_vs_fair": report.avg_jct_vs_fair,
        "avg_ttq_vs_fair": finite_or_null(report.avg_ttq_vs_fair),
        "makespan_vs_fair": report.makespan_vs_fair,
        "unfinished": report.unfinished,
        "moves": report.moves,
    });
    if args.verbose
        && let Some(run) = &report.run
    {
        out["move_decisions"] = json!(run.moves);
        out["decisions"] = json!(run.decisions);
        out["events"] = json!(run.events);
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn finite_or_null(x: f64) -> serde_json::Value {
    if x.is_finite() { json!(x) } else { json!(null) }
}

fn compare_command(args: CompareArgs) -> Result<()> {
    let trace = read_trace(&args.trace)?;
    let mut config = cluster_config(&args.cluster)?;
    config.record_timeline = args.plots.is_some();
    let names: Vec<String> = if args.policy.is_empty() {
        sim::paper::COMPARED
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    } else {
        args.policy.clone()
    };
    let specs = names
        .iter()
        .map(|s| parse_spec(s))
        .collect::<Result<Vec<_>>>()?;
    let reports = evaluate::evaluate(&trace, &config, &specs, args.cluster.seed)?;
    if let Some(dir) = &args.plots {
        let written = sim::plot::write_report_plots(dir, "", &reports)?;
        for p in written {
            eprintln!("govsim: wrote {}", p.display());
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        println!(
            "{} jobs, {} workers x {} cores, seed {}\n",
            trace.jobs.len(),
            config.workers.len(),
            args.cluster.cores,
            args.cluster.seed
        );
        print!("{}", evaluate::markdown_table(&reports));
    }
    Ok(())
}

fn paper_command(args: PaperArgs) -> Result<()> {
    let seeds = args.seeds.as_deref().map(parse_seeds).transpose()?;
    sim::paper::command(
        &args.name,
        seeds,
        &args.logs,
        args.out.as_deref(),
        args.json,
        &args.also,
        &sim::paper::Tweaks {
            move_cost: args.move_cost.as_deref(),
            contention: &contentions(&args.contention)?,
            usage_lag: &usage_lags(&args.usage_lag)?,
        },
    )
}

fn elastic_command(args: ElasticArgs) -> Result<()> {
    sim::elastic::command(
        args.scenario.as_deref(),
        parse_seeds(&args.seeds)?,
        &args.logs,
        args.json,
        args.move_cost.as_deref(),
    )
}

fn priority_command(args: PriorityArgs) -> Result<()> {
    sim::priority::command(
        parse_seeds(&args.seeds)?,
        &args.logs,
        args.json,
        args.move_cost.as_deref(),
    )
}

fn bench_command(args: BenchArgs) -> Result<()> {
    let curves = match &args.logs {
        Some(dir) => {
            curves::load_dir(dir)
                .with_context(|| format!("reading logs under {}", dir.display()))?
                .0
        }
        None => Vec::new(),
    };
    let curves = if curves.is_empty() {
        sim::paper::synthetic_curves()
    } else {
        curves
    };
    let total_work_per_job = (300.0f64 * 3000.0).sqrt();
    // Arrivals spread so the cluster is about fully loaded: jobs x mean work / capacity.
    let span = args.jobs as f64 * total_work_per_job / (args.workers as f64 * args.cores) * 0.8;
    let params = TraceParams {
        jobs: args.jobs,
        arrival: Arrival::Uniform {
            start: 0.0,
            end: span.max(1.0),
        },
        seed: args.seed,
        max_parallelism: args.cores,
        ..TraceParams::default()
    };
    let trace = trace::generate(&params, &curves);
    let mut config = ClusterConfig::homogeneous(args.workers, args.cores, 1 << 40, 0);
    config.horizon = 1e9;
    let spec = parse_spec(&args.policy)?;
    let started = std::time::Instant::now();
    let run = sim::cluster::run_cluster(&trace, &config, &spec, args.seed)?;
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "policy": run.policy,
            "workers": args.workers,
            "cores": args.cores,
            "jobs": args.jobs,
            "wall_seconds": elapsed,
            "events": run.events,
            "decisions": run.decisions,
            "events_per_second": run.events as f64 / elapsed.max(1e-9),
            "simulated_makespan": run.makespan,
            "unfinished": run.unfinished,
            "avg_jct": run.avg_jct,
        }))?
    );
    Ok(())
}

fn make_policy(spec: &str) -> Result<Box<dyn NodePolicy>> {
    policy::by_spec(spec).map_err(anyhow::Error::from)
}

fn expand_policies(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if n == "all" {
            out.extend(policy::POLICY_NAMES.iter().map(|s| (*s).to_owned()));
        } else {
            out.push(n.clone());
        }
    }
    out.dedup();
    out
}

fn node_config(cores: f64, w: &WorkloadArgs) -> NodeConfig {
    NodeConfig {
        cores,
        progress_delay: w.progress_delay,
        ..NodeConfig::default()
    }
}

fn workload_params(jobs: usize, cores: f64, seed: u64, w: &WorkloadArgs) -> Result<WorkloadParams> {
    let (lo, hi) = w
        .parallel_fraction
        .split_once('-')
        .context("--parallel-fraction is LO-HI")?;
    let lo: f64 = lo.trim().parse().context("--parallel-fraction LO")?;
    let hi: f64 = hi.trim().parse().context("--parallel-fraction HI")?;
    if !(0.0..=1.0).contains(&lo) || !(lo..=1.0).contains(&hi) {
        bail!("--parallel-fraction needs 0 <= LO <= HI <= 1");
    }
    Ok(WorkloadParams {
        parallel_fraction: (lo, hi),
        jobs,
        cores,
        seed,
        arrival_window: w.arrival_window,
        work_min: w.work_min,
        work_max: w.work_max,
        reports_total: w.reports_total,
    })
}

fn run_node_command(args: NodeArgs) -> Result<()> {
    let mut scenario = match &args.scenario {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading scenario {}", path.display()))?;
            serde_json::from_str::<Scenario>(&text)
                .with_context(|| format!("parsing scenario {}", path.display()))?
        }
        None => Scenario {
            node: node_config(args.cores, &args.workload),
            jobs: generate(&workload_params(
                args.jobs,
                args.cores,
                args.seed,
                &args.workload,
            )?),
        },
    };
    if args.dump_scenario {
        println!("{}", serde_json::to_string_pretty(&scenario)?);
        return Ok(());
    }
    if scenario.jobs.is_empty() {
        bail!("the scenario has no jobs");
    }
    scenario.node.record_timeline = args.timeline;
    scenario.node.record_decisions = args.decisions;
    let policies = expand_policies(&args.policy);
    for p in &policies {
        make_policy(p)?;
    }
    let outcomes = compare(
        &scenario.jobs,
        &scenario.node,
        args.seed,
        &policies,
        make_policy,
        args.timeline || args.decisions,
    )?;
    let output = if outcomes.len() == 1 {
        serde_json::to_value(&outcomes[0])?
    } else {
        json!({
            "cores": scenario.node.cores,
            "jobs": scenario.jobs.len(),
            "seed": args.seed,
            "policies": outcomes,
        })
    };
    println!("{}", serde_json::to_string_pretty(&output)?);
    Ok(())
}

fn parse_seeds(s: &str) -> Result<Vec<u64>> {
    if let Some((a, b)) = s.split_once('-') {
        let a: u64 = a
            .trim()
            .parse()
            .with_context(|| format!("seed range {s:?}"))?;
        let b: u64 = b
            .trim()
            .parse()
            .with_context(|| format!("seed range {s:?}"))?;
        if b < a {
            bail!("empty seed range {s:?}");
        }
        return Ok((a..=b).collect());
    }
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<u64>()
                .with_context(|| format!("seed {x:?}"))
        })
        .collect()
}

fn run_sweep_command(args: SweepArgs) -> Result<()> {
    let policies = expand_policies(&args.policy);
    for p in &policies {
        make_policy(p)?;
    }
    let seeds = parse_seeds(&args.seeds)?;
    let mut per_workload: Vec<Vec<PolicyOutcome>> = Vec::new();
    for &jobs in &args.jobs {
        for &cores in &args.cores {
            for &seed in &seeds {
                let params = workload_params(jobs, cores, seed, &args.workload)?;
                let config = node_config(cores, &args.workload);
                let w = generate(&params);
                per_workload.push(compare(&w, &config, seed, &policies, make_policy, false)?);
            }
        }
    }
    let rows = summarise(&per_workload);
    if args.markdown {
        println!(
            "| policy | workloads | avg JCT vs fair | avg time to quality vs fair | makespan vs fair | makespan vs lower bound | worst job vs fair | workloads with no job >10% slower | best / worst avg JCT vs fair |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for r in &rows {
            println!(
                "| {} | {} | {:+.1}% | {:+.1}% | {:+.1}% | {:.2}x | {:.2}x | {:.0}% | {:+.1}% / {:+.1}% |",
                r.policy,
                r.workloads,
                (r.avg_jct_vs_fair - 1.0) * 100.0,
                (r.avg_ttq_vs_fair - 1.0) * 100.0,
                (r.makespan_vs_fair - 1.0) * 100.0,
                r.makespan_vs_lower_bound,
                r.max_slowdown_vs_fair,
                r.within_10pct * 100.0,
                (r.best_avg_jct_vs_fair - 1.0) * 100.0,
                (r.worst_avg_jct_vs_fair - 1.0) * 100.0,
            );
        }
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "jobs": args.jobs,
                "cores": args.cores,
                "seeds": seeds,
                "policies": rows,
            }))?
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;
