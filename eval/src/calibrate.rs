//! govsim calibrated to the real-job benchmark.
//!
//! From a workload's `fair` runs, each job becomes a [`JobModel`] whose *parameters* are
//! measured, not its results: its CPU-seconds (the work), the CPU-seconds before its first log
//! line (the start-up: imports and data), the cores it keeps busy when offered more (its usable
//! parallelism, the 90th percentile of its sampled cores in any run, policy runs included, at
//! least one), its arrival, and its logged quality signal (validation loss where logged, else
//! training loss) one value per epoch. govsim then runs the real policy code on that model
//! (`fair` and every policy of the benchmark), and the report sets each job's simulated JCT and
//! time to quality beside the real medians: the per-job error is the calibration's figure of
//! merit (goal: within 15%).
//!
//! What the model leaves out, and so what the error contains: the cost of contention itself
//! (cache and memory bandwidth shared by co-running jobs: a job's CPU-seconds grow when it
//! shares the cores), the daemon's sampling delay of real usage, and run-to-run noise of the
//! shared machine (the real medians move by ±10% between series).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use sim::job::{JobModel, LogEvery, LossCurve, QuietPhase, Speedup};
use sim::node::{NodeConfig, NodeRun, run_node};

use crate::bench_real::{
    JobResult, RunResult, Sizes, Workload, job_values, node_spec, policy_option, run_dir, secs,
    spread,
};
use governor_policy::quality::FinishRule;
use governor_policy::sweep::SweepTrial;

/// One job's fitted parameters.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FittedJob {
    pub name: String,
    pub submit: f64,
    pub cpu_seconds: f64,
    pub startup: f64,
    pub usable_cores: f64,
    pub epochs: usize,
    pub quiet: Vec<QuietPhase>,
}

fn median(v: Vec<f64>) -> Option<f64> {
    spread(v).map(|s| s.median)
}

/// CPU-seconds a job had used when its first log line appeared.
fn startup_cpu(j: &JobResult) -> Option<f64> {
    let first = j.curve.first()?.0 + j.submitted;
    let mut cpu = 0.0;
    let mut last_t: Option<f64> = None;
    for &(t, cores) in &j.cpu_timeline {
        if t > first {
            break;
        }
        let dt = last_t.map_or(0.5, |l| (t - l).max(0.0));
        cpu += cores * dt;
        last_t = Some(t);
    }
    Some(cpu)
}

/// A job's quiet phases (at least 2 s of samples below 0.05 cores while it ran): the CPU it
/// had used when each began, and how long it lasted. A phase after the k-th log line begins
/// at that line in the model (`line`): the CPU per epoch varies, the line is what the job
/// paused after.
struct Quiet {
    phase: QuietPhase,
    /// Log lines written before it began.
    lines: usize,
}

fn quiet_phases(j: &JobResult) -> Vec<Quiet> {
    let mut phases = Vec::new();
    let (mut cpu, mut last_t) = (0.0, None::<f64>);
    let mut start: Option<(f64, f64)> = None;
    let end = j.submitted + j.jct;
    for &(t, cores) in &j.cpu_timeline {
        let dt = last_t.map_or(0.5, |l| (t - l).max(0.0));
        last_t = Some(t);
        if cores < 0.05 && t < end - 0.5 {
            // The sample covers (t - dt, t]: the phase began at its start.
            start.get_or_insert((t - dt, cpu));
        } else if let Some((s, after)) = start.take()
            && t - dt - s >= 2.0
        {
            let lines = j
                .curve
                .iter()
                .filter(|c| j.submitted + c.0 <= s + 0.25)
                .count();
            phases.push(Quiet {
                phase: QuietPhase {
                    after,
                    seconds: t - dt - s,
                },
                lines,
            });
        }
        cpu += cores * dt;
    }
    // The first sample comes ~0.5 s after the start: a phase from the first sample on is
    // from the start.
    if let Some(first) = phases.first_mut()
        && first.phase.after < 0.05
    {
        first.phase.seconds += j
            .cpu_timeline
            .first()
            .map_or(0.0, |&(t, _)| (t - j.submitted - 0.5).max(0.0));
        first.phase.after = 0.0;
    }
    phases
}

/// The 90th percentile of a job's sampled cores while it ran.
fn p90_cores(j: &JobResult) -> Option<f64> {
    let mut v: Vec<f64> = j
        .cpu_timeline
        .iter()
        .map(|&(_, c)| c)
        .filter(|c| c.is_finite())
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[(v.len() * 9 / 10).min(v.len() - 1)])
}

/// The job models of workload `w`, fitted from its fair runs (and every run for the usable
/// cores: under fair sharing a job may never have been offered more than it used).
pub(crate) fn fit(
    w: &Workload,
    fair: &[RunResult],
    every_run: &[&RunResult],
    sizes: Sizes,
) -> Result<(Vec<JobModel>, Vec<FittedJob>)> {
    let mut models = Vec::new();
    let mut fitted = Vec::new();
    for plan in &w.jobs {
        let of = |r: &RunResult| r.jobs.iter().find(|j| j.name == plan.name).cloned();
        let fair_jobs: Vec<JobResult> = fair.iter().filter_map(of).collect();
        let cpu = median(fair_jobs.iter().filter_map(|j| j.cpu_seconds).collect())
            .with_context(|| format!("{}: no CPU-seconds in the fair runs", plan.name))?;
        let startup = median(fair_jobs.iter().filter_map(startup_cpu).collect()).unwrap_or(0.0);
        // Quiet phases from the fair run of the median JCT.
        let mut by_jct = fair_jobs.clone();
        by_jct.sort_by(|a, b| a.jct.total_cmp(&b.jct));
        let quiet_seen = by_jct
            .get(by_jct.len() / 2)
            .map(quiet_phases)
            .unwrap_or_default();
        let usable = every_run
            .iter()
            .filter_map(|r| of(r))
            .filter_map(|j| p90_cores(&j))
            .fold(1.0, f64::max);
        // The logged curve of the fair run with the most epochs (training is seeded: the
        // values are the same in every run).
        let curve = fair_jobs
            .iter()
            .max_by_key(|j| j.curve.len())
            .map(|j| j.curve.clone())
            .unwrap_or_default();
        let values: Vec<f64> = curve
            .iter()
            .map(|&(_, l, v)| if v.is_finite() { v } else { l })
            .collect();
        let n = values.len().max(1);
        let startup = startup.min(0.9 * cpu);
        let quiet: Vec<QuietPhase> = quiet_seen
            .iter()
            .map(|q| QuietPhase {
                after: if q.lines == 0 {
                    q.phase.after.min(startup)
                } else {
                    startup + q.lines.min(n) as f64 / n as f64 * (cpu - startup)
                },
                seconds: q.phase.seconds,
            })
            .collect();
        let points: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(k, v)| ((k + 1) as f64 / n as f64, *v))
            .collect();
        models.push(JobModel {
            id: plan.name.clone(),
            submit: plan.at,
            work: cpu,
            parallelism: usable,
            speedup: Speedup::Linear,
            loss: LossCurve::Points { points },
            noise: 0.0,
            log_every: LogEvery::Work {
                fraction: 1.0 / n as f64,
            },
            reports_total: sizes == Sizes::Known,
            memory_bytes: 0,
            priority: 0,
            startup,
            quiet: quiet.clone(),
            finish: None,
            sweep: None,
        });
        fitted.push(FittedJob {
            name: plan.name.clone(),
            submit: plan.at,
            cpu_seconds: cpu,
            startup,
            usable_cores: usable,
            epochs: values.len(),
            quiet,
        });
    }
    Ok((models, fitted))
}

/// A fitted job's usable cores (1 for a job not fitted).
fn usable_cores(fitted: &[FittedJob], name: &str) -> f64 {
    fitted
        .iter()
        .find(|f| f.name == name)
        .map_or(1.0, |f| f.usable_cores)
}

/// The cores the jobs were actually given while they could use them: `node_cores` times the
/// median over the fair runs of the jobs' CPU-seconds over the integral of
/// `min(usable cores of the running jobs, node_cores)` over time. Below 1 on this machine
/// (about 0.9): the harness, the daemon, the other tenants of the shared host and each job's
/// start latency take their part.
pub(crate) fn effective_cores(fair: &[RunResult], fitted: &[FittedJob], node_cores: f64) -> f64 {
    let usable = |name: &str| usable_cores(fitted, name);
    let ratios: Vec<f64> = fair
        .iter()
        .filter_map(|run| {
            let cpu: f64 = run
                .jobs
                .iter()
                .map(|j| j.cpu_seconds)
                .sum::<Option<f64>>()?;
            let dt = 0.05;
            let mut capacity = 0.0;
            let mut t = 0.0;
            while t < run.makespan {
                let wanted: f64 = run
                    .jobs
                    .iter()
                    .filter(|j| j.submitted <= t && t < j.submitted + j.jct)
                    .map(|j| usable(&j.name))
                    .sum();
                capacity += wanted.min(node_cores) * dt;
                t += dt;
            }
            (capacity > 0.0).then(|| cpu / capacity)
        })
        .collect();
    node_cores * median(ratios).unwrap_or(1.0).min(1.0)
}

/// How much of its plan the kernel delivered (see [`NodeConfig::enforcement`]), fitted by
/// least squares from the daemon's status samples of the policy runs: each job's measured
/// cores against `e × planned + (1 - e) × equal share`, the plan capped at the job's usable
/// cores. Only samples with at least two jobs, and only decisions that state the cores they
/// expect (the shortest-left policy's "~X cores"). Returns the fit and the number of samples.
pub(crate) fn fit_enforcement(
    status_files: &[PathBuf],
    fitted: &[FittedJob],
    node_cores: f64,
) -> Option<(f64, usize)> {
    let usable = |name: &str| usable_cores(fitted, name);
    let (mut sxy, mut sxx, mut n) = (0.0, 0.0, 0usize);
    for file in status_files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some(jobs) = v["status"]["jobs"].as_array() else {
                continue;
            };
            if jobs.len() < 2 {
                continue;
            }
            let equal = node_cores / jobs.len() as f64;
            for j in jobs {
                let (Some(name), Some(actual), Some(decision)) = (
                    j["name"].as_str(),
                    j["cpu_usage_cores"].as_f64(),
                    j["decision"].as_str(),
                ) else {
                    continue;
                };
                let Some(planned) = decision
                    .rsplit_once('~')
                    .and_then(|(_, rest)| rest.split_once(" cores"))
                    .and_then(|(x, _)| x.parse::<f64>().ok())
                else {
                    continue;
                };
                let cap = usable(name);
                let (x, y) = (planned.min(cap) - equal.min(cap), actual - equal.min(cap));
                sxy += x * y;
                sxx += x * x;
                n += 1;
            }
        }
    }
    (n > 0 && sxx > 0.0).then(|| ((sxy / sxx).clamp(0.0, 1.0), n))
}

/// The finish rule of a benchmark policy's `+finish=PATIENCE[:MIN_DELTA]` suffix, read as
/// `run-job --finish` reads it.
fn finish_rule(policy: &str) -> Result<Option<FinishRule>> {
    policy_option(policy, "finish")
        .map(|v| {
            FinishRule::parse(&v).with_context(|| {
                format!(
                    "+finish={v}: PATIENCE[:MIN_DELTA], PATIENCE at least 1, MIN_DELTA at least 0"
                )
            })
        })
        .transpose()
}

/// The sweep of a benchmark policy's `+sweep=NAME[:ETA:FIRST_RUNG[:seen]]` suffix, read as `run-job
/// --sweep` reads it.
fn sweep_trial(policy: &str) -> Result<Option<SweepTrial>> {
    policy_option(policy, "sweep")
        .map(|v| {
            SweepTrial::parse(&v).with_context(|| {
                format!(
                    "+sweep={v}: NAME[:ETA:FIRST_RUNG[:seen]], ETA at least 2, FIRST_RUNG above 0"
                )
            })
        })
        .transpose()
}

/// Runs the fitted models under `policy` (a node policy spec, as `--policy` takes it, with
/// bench-real's `+finish=` and `+sweep=` suffixes: every job then finishes at convergence, or
/// is a trial of one sweep with a trial budget) on a node of `cores` that delivers
/// `enforcement` of the plans.
pub(crate) fn simulate(
    models: &[JobModel],
    policy: &str,
    cores: f64,
    enforcement: f64,
) -> Result<NodeRun> {
    let finish = finish_rule(policy)?;
    let sweep = sweep_trial(policy)?;
    let models: Vec<JobModel> = models
        .iter()
        .map(|m| JobModel {
            finish: finish.or(m.finish),
            sweep: sweep.clone().or_else(|| m.sweep.clone()),
            ..m.clone()
        })
        .collect();
    let models = &models[..];
    let mut p = governor_policy::by_spec(&node_spec(policy))
        .with_context(|| format!("policy {policy:?}"))?;
    let config = NodeConfig {
        cores,
        usage_interval: 1.0,
        progress_delay: 0.2,
        enforcement,
        ..NodeConfig::default()
    };
    Ok(run_node(models, &config, p.as_mut(), 1))
}

/// What any order of CPU shares could gain on these jobs ([`sim::bound`]): the fitted jobs in
/// a fluid model on the same `cores` under fair sharing, the best order known with perfect
/// knowledge (with the whole plan delivered, and with the share `delivered` the kernel gave the
/// policies' plans), and the relaxation no order can beat.
fn order_bound(models: &[JobModel], cores: f64, delivered: f64) -> (String, serde_json::Value) {
    use sim::bound::{FluidJob, FluidRun, Order, Target, run};
    let jobs: Vec<FluidJob> = models.iter().map(FluidJob::from_model).collect();
    let fair = run(&jobs, cores, Order::Fair, 1.0);
    let worst = |r: &FluidRun, of: fn(&FluidRun) -> &Vec<f64>| {
        of(r)
            .iter()
            .zip(of(&fair))
            .map(|(a, b)| a / b)
            .fold(0.0, f64::max)
    };
    let change = |x: f64, base: f64| 100.0 * (x / base - 1.0);
    let mut md = format!(
        "\nWhat any order of CPU shares could gain on these jobs ([`sim::bound`]: the jobs above \
         in a fluid model on {cores:.2} cores, each at the cores it is given up to its usable \
         cores, no cost of contention, every plan delivered whole unless the row says; fair's \
         averages there: time to quality {:.1} s, JCT {:.1} s, as in govsim's fair above):\n\n\
         | order | avg TTQ vs fair | avg JCT vs fair | worst job TTQ / fair | worst job JCT / fair |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
        fair.avg_ttq(),
        fair.avg_jct()
    );
    let mut json = Vec::new();
    // With pauses (a job that cannot run for a while) the relaxation is that order's result on
    // the fast machine, no longer a proven optimum there.
    let (relaxed_ttq, relaxed_jct) = if jobs.iter().any(|j| !j.quiet.is_empty()) {
        (
            "least CPU left to its quality point first on one machine of all the cores (jobs pause: not a proven bound)",
            "least CPU left first on one machine of all the cores (jobs pause: not a proven bound)",
        )
    } else {
        (
            "no order does better on TTQ (one machine of all the cores)",
            "no order does better on JCT (one machine of all the cores)",
        )
    };
    let as_delivered = format!(
        "the same, the kernel delivering {:.0}% of the plan as measured",
        100.0 * delivered
    );
    for (label, order, share) in [
        (
            "least CPU left to its quality point first, knowing it (best known for TTQ)",
            Order::Oracle(Target::Quality),
            None,
        ),
        (
            as_delivered.as_str(),
            Order::Oracle(Target::Quality),
            Some(delivered),
        ),
        (
            "least CPU left first, knowing it (best known for JCT)",
            Order::Oracle(Target::End),
            None,
        ),
        (relaxed_ttq, Order::Relaxed(Target::Quality), None),
        (relaxed_jct, Order::Relaxed(Target::End), None),
    ] {
        // At a share of 1 the kernel delivered the whole plan: the row would repeat the first.
        if share.is_some_and(|d| d >= 0.99) {
            continue;
        }
        let share = share.unwrap_or(1.0);
        let r = run(&jobs, cores, order, share);
        let ttq = change(r.avg_ttq(), fair.avg_ttq());
        let jct = change(r.avg_jct(), fair.avg_jct());
        let (worst_ttq, worst_jct) = (worst(&r, |r| &r.ttq), worst(&r, |r| &r.jct));
        // A relaxation bounds only the average it orders for.
        let (ttq_cell, jct_cell, worst_cells) = match order {
            Order::Relaxed(Target::Quality) => (format!("{ttq:+.1}%"), "-".into(), "- | -".into()),
            Order::Relaxed(Target::End) => ("-".into(), format!("{jct:+.1}%"), "- | -".into()),
            _ => (
                format!("{ttq:+.1}%"),
                format!("{jct:+.1}%"),
                format!("{worst_ttq:.2}x | {worst_jct:.2}x"),
            ),
        };
        let _ = writeln!(md, "| {label} | {ttq_cell} | {jct_cell} | {worst_cells} |");
        json.push(serde_json::json!({
            "order": format!("{order:?}"), "delivered": share, "ttq": ttq, "jct": jct,
            "worst_ttq": worst_ttq, "worst_jct": worst_jct,
        }));
    }
    (md, serde_json::Value::Array(json))
}

/// The calibrated trials as one sweep across a cluster (issue 32, item 3): 3 workers of one core
/// each, a core reserved per trial (3 run, the rest queue), the planner judging the trials as
/// each reaches a rung, ranked by prediction and by the loss seen, against the full sweep
/// ([`sim::hpo::compare`], the code the coordinator runs).
fn cluster_sweep(
    models: &[JobModel],
    declared: &SweepTrial,
) -> Result<(String, Vec<sim::hpo::SweepReport>)> {
    use governor_policy::sweep::Ranking;
    let ranked = |ranking| SweepTrial {
        rule: governor_policy::sweep::HalvingRule {
            ranking,
            ..declared.rule
        },
        ..declared.clone()
    };
    let systems = vec![
        ("full sweep".to_owned(), None),
        (
            "budget, predicted (default)".to_owned(),
            Some(ranked(Ranking::Predicted)),
        ),
        (
            "budget, loss seen at the rung".to_owned(),
            Some(ranked(Ranking::Seen)),
        ),
    ];
    let mut config = sim::cluster::ClusterConfig::homogeneous(3, 1.0, 8 << 30, 0);
    config.horizon = 1e6;
    let reports = sim::hpo::compare(models, &systems, &config, 1)?;
    let mut md = format!(
        "\nThe same trials as one sweep across a cluster (govsim: 3 workers of 1 core, a core reserved per trial, the planner judging each trial as it reaches a rung of `{}:{}:{}`):\n\n",
        declared.sweep, declared.rule.eta, declared.rule.first_rung
    );
    md.push_str(&sim::hpo::table(&reports, 1));
    Ok((md, reports))
}

fn err(sim: Option<f64>, real: Option<f64>) -> String {
    match (sim, real) {
        (Some(s), Some(r)) if r > 0.0 => format!("{:+.0}%", 100.0 * (s / r - 1.0)),
        _ => "-".into(),
    }
}

/// The calibration section of a workload's summary: the fitted model, per-job error of the
/// simulation against the real medians for fair and each policy run for real, and the
/// averages' change against fair, real and simulated (also for `sim_only` policies, which
/// were not run for real).
pub(crate) fn report(
    out: &Path,
    w: &Workload,
    fair: &[RunResult],
    policies: &[(String, Vec<RunResult>)],
    sim_only: &[String],
    sizes: Sizes,
    cores: f64,
) -> Result<(String, serde_json::Value)> {
    let mut every: Vec<&RunResult> = fair.iter().collect();
    for (_, runs) in policies {
        every.extend(runs.iter());
    }
    let (models, fitted) = fit(w, fair, &every, sizes)?;
    let node_cores = cores;
    let cores = effective_cores(fair, &fitted, node_cores);
    let status_files: Vec<PathBuf> = policies
        .iter()
        .flat_map(|(p, runs)| {
            runs.iter()
                .map(|r| run_dir(out, w, p, sizes, r.rep).join("status.jsonl"))
        })
        .collect();
    let enforcement = fit_enforcement(&status_files, &fitted, node_cores);
    let e = enforcement.map_or(1.0, |(e, _)| e);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n#### govsim calibrated to these runs\n\n\
         The job model fitted from the fair runs (medians; usable cores: 90th percentile of the \
         sampled cores in any run, at least 1):\n\n\
         | job | arrives | CPU-s | start-up CPU-s | usable cores | epochs | quiet phases |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for f in &fitted {
        let _ = writeln!(
            md,
            "| {} | {:.0} s | {:.1} | {:.1} | {:.2} | {} | {} |",
            f.name,
            f.submit,
            f.cpu_seconds,
            f.startup,
            f.usable_cores,
            f.epochs,
            if f.quiet.is_empty() {
                "-".to_owned()
            } else {
                f.quiet
                    .iter()
                    .map(|q| format!("{:.0} s after {:.1} CPU-s", q.seconds, q.after))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    let _ = writeln!(
        md,
        "\nThe node: {cores:.2} of its {node_cores} cores went to the jobs while they could use \
         them (fair runs, median); the simulated node has {cores:.2}. {}",
        match enforcement {
            Some((e, n)) => format!(
                "The kernel delivered {:.0}% of the policies' plans (the rest of each job's share \
                 was its equal share; least squares over {n} status samples): the simulated \
                 node delivers as much.",
                100.0 * e
            ),
            None => "No policy run stated its plan: the simulated node delivers all of it.".into(),
        }
    );
    let contention = crate::contention::fit(fair);
    if !contention.is_empty() {
        let _ = writeln!(
            md,
            "\nContention (not in the simulated node): each job's CPU-seconds per epoch against \
             the number of other jobs running beside it, `base × (1 + c × others)`, least squares \
             over every epoch of the fair runs; govsim models it with `--contention c`:\n\n\
             | job | epochs | CPU-s per epoch alone | c per other job |\n\
             | --- | ---: | ---: | ---: |"
        );
        for f in &contention {
            let _ = writeln!(
                md,
                "| {} | {} | {:.3} | {:+.3} |",
                f.name, f.epochs, f.base, f.per_other_job
            );
        }
    }
    let fair_sim = simulate(&models, "fair", cores, e)?;
    let mut rows = vec![("fair".to_owned(), fair.to_vec(), fair_sim.clone())];
    for (p, runs) in policies {
        rows.push((p.clone(), runs.clone(), simulate(&models, p, cores, e)?));
    }
    let _ = writeln!(
        md,
        "\nPer job: simulated against the real median (error = sim / real - 1):\n\n\
         | policy | job | JCT real | JCT sim | error | TTQ real | TTQ sim | error |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let mut errors_jct = Vec::new();
    let mut errors_ttq = Vec::new();
    let mut json_rows = Vec::new();
    for (p, runs, simrun) in &rows {
        for plan in &w.jobs {
            let real =
                |f: &dyn Fn(&JobResult) -> Option<f64>| median(job_values(runs, &plan.name, f));
            let (jct_real, ttq_real) = (real(&|j| Some(j.jct)), real(&|j| j.ttq));
            let s = simrun.jobs.iter().find(|j| j.id == plan.name);
            let (jct_sim, ttq_sim) = (s.and_then(|j| j.jct), s.and_then(|j| j.ttq));
            if let (Some(a), Some(b)) = (jct_sim, jct_real) {
                errors_jct.push((a / b - 1.0).abs());
            }
            if let (Some(a), Some(b)) = (ttq_sim, ttq_real) {
                errors_ttq.push((a / b - 1.0).abs());
            }
            let _ = writeln!(
                md,
                "| {p} | {} | {} | {} | {} | {} | {} | {} |",
                plan.name,
                secs(jct_real),
                secs(jct_sim),
                err(jct_sim, jct_real),
                secs(ttq_real),
                secs(ttq_sim),
                err(ttq_sim, ttq_real),
            );
            json_rows.push(serde_json::json!({
                "policy": p, "job": plan.name,
                "jct_real": jct_real, "jct_sim": jct_sim,
                "ttq_real": ttq_real, "ttq_sim": ttq_sim,
            }));
        }
    }
    let within = |v: &[f64]| v.iter().filter(|e| **e <= 0.15).count();
    let _ = writeln!(
        md,
        "\nWithin 15%: JCT {}/{} jobs (median error {:.0}%), time to quality {}/{} (median \
         error {:.0}%).",
        within(&errors_jct),
        errors_jct.len(),
        100.0 * median(errors_jct.clone()).unwrap_or(f64::NAN),
        within(&errors_ttq),
        errors_ttq.len(),
        100.0 * median(errors_ttq.clone()).unwrap_or(f64::NAN),
    );
    let _ = writeln!(
        md,
        "\nAverages against fair, real (median of the paired repetitions) and simulated:\n\n\
         | policy | avg JCT real | avg JCT sim | avg TTQ real | avg TTQ sim | worst job TTQ / fair sim |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |"
    );
    let ttq_of = |r: &NodeRun, id: &str| r.jobs.iter().find(|j| j.id == id).and_then(|j| j.ttq);
    let mut sim_rows: Vec<(String, Option<Vec<RunResult>>, NodeRun)> = rows
        .iter()
        .skip(1)
        .map(|(p, runs, s)| (p.clone(), Some(runs.clone()), s.clone()))
        .collect();
    for p in sim_only {
        sim_rows.push((
            format!("{p} (sim only)"),
            None,
            simulate(&models, p, cores, e)?,
        ));
    }
    // What the same policies would do if the kernel delivered their whole plan.
    if e < 0.99 {
        let names: Vec<String> = rows
            .iter()
            .skip(1)
            .map(|(p, _, _)| p.clone())
            .chain(sim_only.iter().cloned())
            .collect();
        for p in names {
            sim_rows.push((
                format!("{p} (sim only, whole plan delivered)"),
                None,
                simulate(&models, &p, cores, 1.0)?,
            ));
        }
    }
    let mut json_avgs = Vec::new();
    for (p, runs, s) in &sim_rows {
        let real_change = |f: &dyn Fn(&RunResult) -> Option<f64>| -> Option<f64> {
            let runs = runs.as_ref()?;
            median(
                runs.iter()
                    .filter_map(|r| {
                        let fr = fair.iter().find(|x| x.rep == r.rep)?;
                        Some(f(r)? / f(fr)? - 1.0)
                    })
                    .collect(),
            )
        };
        let jct_real = real_change(&|r| Some(r.avg_jct()).filter(|x| x.is_finite()));
        let ttq_real = real_change(&RunResult::avg_ttq);
        let jct_sim = s.avg_jct / fair_sim.avg_jct - 1.0;
        let ttq_sim = s.avg_ttq / fair_sim.avg_ttq - 1.0;
        let worst = w
            .jobs
            .iter()
            .filter_map(|j| Some(ttq_of(s, &j.name)? / ttq_of(&fair_sim, &j.name)?))
            .fold(0.0, f64::max);
        let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:+.1}%", 100.0 * v));
        let _ = writeln!(
            md,
            "| {p} | {} | {} | {} | {} | {worst:.2}x |",
            pct(jct_real),
            pct(Some(jct_sim)),
            pct(ttq_real),
            pct(Some(ttq_sim)),
        );
        json_avgs.push(serde_json::json!({
            "policy": p, "jct_real": jct_real, "jct_sim": jct_sim,
            "ttq_real": ttq_real, "ttq_sim": ttq_sim, "worst_ttq_sim": worst,
        }));
    }
    let (bound_md, bound_json) = order_bound(&models, cores, e);
    md.push_str(&bound_md);
    let mut declared = None;
    for p in policies.iter().map(|(p, _)| p).chain(sim_only) {
        declared = declared.or(sweep_trial(p)?);
    }
    let cluster_sweep = match declared {
        Some(t) => {
            let (cluster_md, reports) = cluster_sweep(&models, &t)?;
            md.push_str(&cluster_md);
            serde_json::to_value(reports)?
        }
        None => serde_json::Value::Null,
    };
    Ok((
        md,
        serde_json::json!({
            "model": fitted,
            "jobs": json_rows,
            "averages": json_avgs,
            "order_bound": bound_json,
            "cluster_sweep": cluster_sweep,
            "cores": node_cores,
            "effective_cores": cores,
            "enforcement": enforcement.map(|(e, _)| e),
            "contention": contention,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor_policy::sweep::HalvingRule;

    fn busy_then_quiet() -> JobResult {
        // 0.5 s samples: busy 5 s, quiet 4 s, busy 5 s; a log line every second of work.
        let cores = |t: f64| if (5.0..9.0).contains(&t) { 0.0 } else { 1.0 };
        let cpu_timeline: Vec<(f64, f64)> = (1..=28)
            .map(|k| {
                let t = f64::from(k) * 0.5;
                (t, cores(t - 0.25))
            })
            .collect();
        let curve = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0, 12.0, 13.0, 14.0]
            .iter()
            .map(|&t| (t, 1.0 / t, f64::NAN))
            .collect();
        JobResult {
            name: "q".into(),
            submitted: 0.0,
            jct: 14.0,
            ttq: None,
            cpu_seconds: Some(10.0),
            epochs_done: 10,
            exit_ok: true,
            curve,
            cpu_timeline,
        }
    }

    /// A job of 100 CPU-s on one core, its best (and its quality point) at half its work, flat
    /// after: a log line every tenth.
    fn best_half_way(id: &str) -> JobModel {
        JobModel {
            id: id.into(),
            submit: 0.0,
            work: 100.0,
            parallelism: 1.0,
            speedup: Speedup::Linear,
            loss: LossCurve::Points {
                points: vec![(0.0, 1.0), (0.5, 0.1), (1.0, 0.1)],
            },
            noise: 0.0,
            log_every: LogEvery::Work { fraction: 0.1 },
            reports_total: true,
            memory_bytes: 0,
            priority: 0,
            startup: 0.0,
            quiet: Vec::new(),
            finish: None,
            sweep: None,
        }
    }

    #[test]
    fn the_order_bound_reports_the_oracle_at_the_delivered_share_and_the_relaxations() {
        let models = [best_half_way("a"), best_half_way("b")];
        // One core: fair brings both to quality at 100 s, the oracle one at 50 s, one at 100 s.
        let (md, json) = order_bound(&models, 1.0, 0.5);
        let rows: Vec<&str> = md
            .lines()
            .filter(|l| l.starts_with("| ") && !l.contains("---"))
            .collect();
        assert_eq!(rows.len(), 6, "header and five orders:\n{md}");
        assert!(rows[1].contains("| -25.0% |"), "{}", rows[1]);
        assert!(rows[2].contains("delivering 50%"), "{}", rows[2]);
        assert_eq!(json.as_array().unwrap().len(), 5);
        let (whole, _) = order_bound(&models, 1.0, 1.0);
        assert!(!whole.contains("delivering"), "{whole}");
    }

    #[test]
    fn finish_and_sweep_suffixes_stop_the_simulated_jobs_as_the_daemon_would() {
        let model = best_half_way("a");
        let full = simulate(std::slice::from_ref(&model), "fair", 1.0, 1.0).unwrap();
        assert!((full.jobs[0].jct.unwrap() - 100.0).abs() < 1e-6);
        let stopped = simulate(
            std::slice::from_ref(&model),
            "fair+finish=2:0.001",
            1.0,
            1.0,
        )
        .unwrap();
        let j = &stopped.jobs[0];
        // Two lines without a new best after the one at 50%: stopped as the 70% line is read.
        assert!(
            j.stopped.is_some() && (j.jct.unwrap() - 70.2).abs() < 1e-6,
            "{j:?}"
        );
        assert_eq!(
            finish_rule("shortest-left+finish=3")
                .unwrap()
                .unwrap()
                .min_delta,
            0.0
        );
        for bad in ["fair+finish=0:0.1", "fair+finish=x", "fair+finish=2:-1"] {
            assert!(
                simulate(std::slice::from_ref(&model), bad, 1.0, 1.0).is_err(),
                "{bad}"
            );
        }
        for bad in [
            "fair+sweep=",
            "fair+sweep=lr:1:5",
            "fair+sweep=lr:3",
            "fair+sweep=lr:3:0",
        ] {
            assert!(
                simulate(std::slice::from_ref(&model), bad, 1.0, 1.0).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            sweep_trial("shortest-left+sweep=lr:2:3")
                .unwrap()
                .unwrap()
                .rule,
            HalvingRule {
                eta: 2,
                first_rung: 3.0,
                ranking: governor_policy::sweep::Ranking::Predicted,
            }
        );
        // Two trials of one sweep, one learning slower: at the first rung (3 epochs) the
        // slower one is outranked and stopped, and the other has the core to itself.
        let slow = JobModel {
            id: "b".into(),
            loss: LossCurve::Points {
                points: vec![(0.0, 1.0), (1.0, 0.5)],
            },
            ..model.clone()
        };
        let run = simulate(&[model, slow], "fair+sweep=lr:2:3:seen", 1.0, 1.0).unwrap();
        let (a, b) = (&run.jobs[0], &run.jobs[1]);
        assert_eq!(a.stopped, None);
        let why = b.stopped.as_deref().unwrap_or_default();
        assert!(
            why.starts_with("outranked in its sweep at 3 epochs"),
            "{why}"
        );
        // Both at half a core until b's 3rd epoch line (30 work each, t = 60 s) is read.
        assert!((b.jct.unwrap() - 60.2).abs() < 1e-6, "{b:?}");
        assert!((a.jct.unwrap() - 130.1).abs() < 1e-6, "{a:?}");
    }

    #[test]
    fn a_quiet_phase_is_found_with_the_lines_before_it() {
        let phases = quiet_phases(&busy_then_quiet());
        assert_eq!(phases.len(), 1);
        let q = &phases[0];
        assert!((q.phase.seconds - 4.0).abs() < 0.01, "{:?}", q.phase);
        assert!((q.phase.after - 5.0).abs() < 0.01, "{:?}", q.phase);
        assert_eq!(q.lines, 5);
    }

    #[test]
    fn enforcement_is_fitted_from_planned_and_measured_cores() {
        let dir = std::env::temp_dir().join(format!("calibrate-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("status.jsonl");
        // Two jobs on 2 cores (equal share 1 each, usable 1): a is planned 1 and gets it, b is
        // planned 0 and gets 0.6, i.e. e = 0.4 of the way from its equal share to the plan.
        let line = |a: f64, b: f64| {
            serde_json::json!({"t": 1.0, "status": {"jobs": [
                {"name": "a", "cpu_usage_cores": a, "decision": "shortest-left: #1 (in order), ~1.00 cores"},
                {"name": "b", "cpu_usage_cores": b, "decision": "shortest-left: #2 (in order), ~0.00 cores"},
            ]}})
            .to_string()
        };
        std::fs::write(&file, [line(1.0, 0.6), line(1.0, 0.6)].join("\n")).unwrap();
        let fitted = ["a", "b"].map(|n| FittedJob {
            name: n.into(),
            submit: 0.0,
            cpu_seconds: 10.0,
            startup: 0.0,
            usable_cores: 1.0,
            epochs: 10,
            quiet: Vec::new(),
        });
        let (e, n) = fit_enforcement(&[file], &fitted, 2.0).unwrap();
        // a: planned min(1, 1) - min(1, 1) = 0 says nothing; b: x = -1, y = -0.4.
        assert_eq!(n, 4);
        assert!((e - 0.4).abs() < 1e-9, "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
