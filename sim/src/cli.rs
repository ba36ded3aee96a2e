//! `govsim` subcommands.
//!
//! ```text
//! govsim node --policy governor --jobs 6 --cores 4 --seed 1        # one policy vs fair
//! govsim node --policy all --jobs 6 --cores 4 --seed 1             # every policy, same workload
//! govsim node --scenario jobs.json --policy flowcon --timeline     # a hand-written workload
//! govsim node --jobs 6 --cores 4 --seed 1 --dump-scenario          # print the generated workload
//! govsim sweep --jobs 3,6,10 --cores 2,4,8,16 --seeds 1-10 --policy all   # aggregate table
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use governor::policy::{self, NodePolicy};
use serde_json::json;

use crate::Scenario;
use crate::compare::{PolicyOutcome, compare, summarise};
use crate::node::NodeConfig;
use crate::workload::{WorkloadParams, generate};

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
    /// Policies (names or specs like `governor:floor=0.5`), comma-separated or repeated; `all`
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
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Node(args) => run_node_command(args),
        Command::Sweep(args) => run_sweep_command(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("govsim: {e:#}");
            ExitCode::FAILURE
        }
    }
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
            "| policy | workloads | avg JCT vs fair | makespan vs fair | makespan vs lower bound | worst job vs fair | workloads with no job >10% slower | best / worst avg JCT vs fair |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for r in &rows {
            println!(
                "| {} | {} | {:+.1}% | {:+.1}% | {:.2}x | {:.2}x | {:.0}% | {:+.1}% / {:+.1}% |",
                r.policy,
                r.workloads,
                (r.avg_jct_vs_fair - 1.0) * 100.0,
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
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_as_ranges_or_lists() {
        assert_eq!(parse_seeds("1-3").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_seeds("4, 7").unwrap(), vec![4, 7]);
        assert!(parse_seeds("3-1").is_err());
        assert!(parse_seeds("x").is_err());
    }

    #[test]
    fn all_expands_to_every_policy() {
        let p = expand_policies(&["all".to_owned()]);
        assert_eq!(p.len(), policy::POLICY_NAMES.len());
    }
}
