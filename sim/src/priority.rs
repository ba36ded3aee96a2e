//! `govsim priority`: a mixed-priority trace on a cluster whose jobs reserve their cores (the
//! setting where a high-priority job can find no room), with and without preemption by
//! checkpoint (`+preempt`), beside our default, which reserves nothing and shares cores.
//!
//! The cluster and mix are FlowCon's 40-job setup (4 workers of 4 vCPUs, real loss curves);
//! a quarter of the jobs, drawn by the seed, have priority 10, the rest 0. Every system
//! reserves each job's parallelism in cores (Schedulearn's and the Kubeflow scheduler's
//! setting: jobs queue instead of sharing), so that a high-priority arrival on a full cluster
//! waits for a departure unless something is displaced (our default shares instead). Reported per system, mean over the
//! seeds: average JCT of all jobs and of each priority, the high-priority jobs' wait from
//! arrival to first start (median and worst), how many of them started within one checkpoint
//! time (save and restore of the job displaced for them, [`MoveDowntime::seconds`] of its
//! memory: the goal), the busy share of the cores while some job had not started yet,
//! and the preemptions. No work is lost by construction: a displaced job keeps all it did.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::cluster::{ClusterConfig, ClusterRun, MoveDowntime, PolicySpec, run_cluster};
use crate::curves::RealCurve;
use crate::trace::{self, Arrival, Trace, TraceParams};

const GIB: u64 = 1 << 30;

/// The priority of the urgent quarter of the jobs.
pub const HIGH: i32 = 10;

/// The systems compared: FIFO with reserved cores (Schedulearn's), the same with preemption,
/// the Kubeflow scheduler (its weighted queue and gang step, its scale-down read as our
/// preemption by checkpoint), and our default (cores shared by the node policy, nothing
/// reserved: nothing waits for cores, so nothing is preempted).
pub const SYSTEMS: [&str; 4] = [
    "fifo",
    "fifo+preempt",
    "fair/kubeflow+reserve+preempt",
    "ours",
];

/// The cluster: 4 workers of 4 cores and 16 GiB.
pub fn cluster() -> ClusterConfig {
    let mut c = ClusterConfig::homogeneous(4, 4.0, 16 * GIB, 0);
    c.horizon = 1e7;
    c.record_timeline = true;
    c
}

/// The trace of one seed: FlowCon's 40 jobs over 20 minutes, a quarter of them urgent.
pub fn priority_trace(curves: &[RealCurve], seed: u64) -> Trace {
    let params = TraceParams {
        jobs: 40,
        arrival: Arrival::Uniform {
            start: 0.0,
            end: 1200.0,
        },
        seed,
        work_min: 600.0,
        work_max: 2400.0,
        parallelism: vec![1.0, 2.0, 4.0],
        max_parallelism: 4.0,
        memory_min: GIB / 2,
        memory_max: 4 * GIB,
        ..TraceParams::default()
    };
    let mut t = trace::generate(&params, curves);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9);
    for j in &mut t.jobs {
        if rng.random::<f64>() < 0.25 {
            j.model.priority = HIGH;
        }
    }
    t.description = format!("{} ({}% of the jobs at priority {HIGH})", t.description, 25);
    t
}

/// One system's figures on one seed.
#[derive(Clone, Debug, Serialize)]
pub struct PriorityReport {
    pub policy: String,
    pub avg_jct: f64,
    pub avg_jct_high: f64,
    pub avg_jct_low: f64,
    pub avg_ttq: f64,
    /// High-priority jobs: seconds from arrival to first start.
    pub high_wait_median: f64,
    pub high_wait_max: f64,
    /// Share of the high-priority jobs that started within one checkpoint time (plus the
    /// start delay) of their arrival.
    pub high_within_checkpoint: f64,
    /// Busy share of the cluster's cores while some submitted job had not started.
    pub utilisation_while_waiting: f64,
    pub makespan: f64,
    pub preemptions: u32,
    pub unfinished: usize,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Figures of one run.
pub fn report(run: &ClusterRun, trace: &Trace, config: &ClusterConfig) -> PriorityReport {
    let jct = |high: bool| {
        mean(
            run.jobs
                .iter()
                .filter(|j| (j.priority >= HIGH) == high)
                .filter_map(|j| j.jct),
        )
    };
    let mut waits: Vec<f64> = run
        .jobs
        .iter()
        .filter(|j| j.priority >= HIGH)
        .filter_map(|j| Some(j.start? - j.submit))
        .collect();
    waits.sort_by(f64::total_cmp);
    let median = waits.get(waits.len() / 2).copied().unwrap_or(0.0);
    let max = waits.last().copied().unwrap_or(0.0);
    // One checkpoint time: the save and restore of a typical displaced job (the mean memory
    // of the low-priority jobs), plus the start delay.
    let low_memory = mean(
        trace
            .jobs
            .iter()
            .filter(|j| j.model.priority < HIGH)
            .map(|j| j.checkpoint_bytes() as f64),
    );
    let checkpoint_s = config.move_cost.seconds(low_memory as u64) + config.start_delay;
    let within = if waits.is_empty() {
        0.0
    } else {
        waits.iter().filter(|&&w| w <= checkpoint_s + 1e-6).count() as f64 / waits.len() as f64
    };
    PriorityReport {
        policy: run.policy.clone(),
        avg_jct: run.avg_jct,
        avg_jct_high: jct(true),
        avg_jct_low: jct(false),
        avg_ttq: run.avg_ttq,
        high_wait_median: median,
        high_wait_max: max,
        high_within_checkpoint: within,
        utilisation_while_waiting: utilisation_while_waiting(run, config),
        makespan: run.makespan,
        preemptions: run.jobs.iter().map(|j| j.preemptions).sum(),
        unfinished: run.unfinished,
    }
}

/// Busy cores over total cores, integrated over the times when some submitted job had not
/// started yet (from the per-worker timelines: each job's cores, a step function).
fn utilisation_while_waiting(run: &ClusterRun, config: &ClusterConfig) -> f64 {
    let total: f64 = config.workers.iter().map(|w| w.cores).sum();
    let series: Vec<&Vec<(f64, f64)>> = run
        .timelines
        .iter()
        .flat_map(|w| w.jobs.iter().map(|(_, s)| s))
        .collect();
    let mut times: Vec<f64> = series.iter().flat_map(|s| s.iter().map(|p| p.0)).collect();
    times.extend(run.jobs.iter().map(|j| j.submit));
    times.extend(run.jobs.iter().filter_map(|j| j.start));
    times.sort_by(f64::total_cmp);
    times.dedup();
    let cores_at = |t: f64| -> f64 {
        series
            .iter()
            .map(|s| {
                let k = s.partition_point(|p| p.0 <= t);
                if k == 0 { 0.0 } else { s[k - 1].1 }
            })
            .sum()
    };
    let (mut busy, mut span) = (0.0, 0.0);
    for w in times.windows(2) {
        let (a, b) = (w[0], w[1]);
        let waiting = run
            .jobs
            .iter()
            .any(|j| j.submit <= a && j.start.is_none_or(|s| s > a));
        if waiting && b > a {
            busy += cores_at(a) * (b - a);
            span += total * (b - a);
        }
    }
    if span > 0.0 { busy / span } else { 1.0 }
}

/// Mean of each figure over the seeds, per system (same order as `per_seed[k]`).
pub fn aggregate(per_seed: &[Vec<PriorityReport>]) -> Vec<PriorityReport> {
    let Some(first) = per_seed.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|k| {
            let rows: Vec<&PriorityReport> = per_seed.iter().map(|s| &s[k]).collect();
            let m = |f: fn(&PriorityReport) -> f64| mean(rows.iter().map(|r| f(r)));
            PriorityReport {
                policy: rows[0].policy.clone(),
                avg_jct: m(|r| r.avg_jct),
                avg_jct_high: m(|r| r.avg_jct_high),
                avg_jct_low: m(|r| r.avg_jct_low),
                avg_ttq: m(|r| r.avg_ttq),
                high_wait_median: m(|r| r.high_wait_median),
                high_wait_max: rows.iter().map(|r| r.high_wait_max).fold(0.0, f64::max),
                high_within_checkpoint: m(|r| r.high_within_checkpoint),
                utilisation_while_waiting: m(|r| r.utilisation_while_waiting),
                makespan: m(|r| r.makespan),
                preemptions: rows.iter().map(|r| r.preemptions).sum(),
                unfinished: rows.iter().map(|r| r.unfinished).sum(),
            }
        })
        .collect()
}

/// A Markdown table of the aggregate.
pub fn markdown(rows: &[PriorityReport], seeds: &[u64], move_cost: &str) -> String {
    let mut out = format!(
        "Mixed priorities: 40 jobs (25% at priority {HIGH}) on 4 workers x 4 cores, cores \
         reserved; seeds {seeds:?}, move cost `{move_cost}`; means over the seeds (worst wait: \
         the worst over all).\n\n\
         | system | avg JCT | high-priority JCT | low-priority JCT | avg TTQ | high wait median | high wait worst | high started within a checkpoint time | utilisation while jobs wait | makespan | preemptions |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {:.0} s | {:.0} s | {:.0} s | {:.0} s | {:.0} s | {:.0} s | {:.0}% | {:.0}% | {:.0} s | {} |",
            r.policy,
            r.avg_jct,
            r.avg_jct_high,
            r.avg_jct_low,
            r.avg_ttq,
            r.high_wait_median,
            r.high_wait_max,
            100.0 * r.high_within_checkpoint,
            100.0 * r.utilisation_while_waiting,
            r.makespan,
            r.preemptions
        );
    }
    out
}

/// `govsim priority`: every system on each seed's trace; the table (or JSON) on stdout.
pub fn command(seeds: Vec<u64>, logs: &Path, json: bool, move_cost: Option<&str>) -> Result<()> {
    let curves = crate::paper::curves_or_synthetic(logs)?;
    let mut config = cluster();
    let cost_name = move_cost.unwrap_or("default");
    if let Some(name) = move_cost {
        config.move_cost = MoveDowntime::by_name(name)
            .with_context(|| format!("no move cost {name:?} (default, framework, criu-tcg)"))?;
    }
    let mut per_seed = Vec::new();
    for &seed in &seeds {
        let trace = priority_trace(&curves, seed);
        let mut rows = Vec::new();
        for system in SYSTEMS {
            let spec: PolicySpec = system.parse().map_err(anyhow::Error::msg)?;
            let run = run_cluster(&trace, &config, &spec, seed)?;
            rows.push(report(&run, &trace, &config));
        }
        per_seed.push(rows);
    }
    let rows = aggregate(&per_seed);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "seeds": seeds,
                "move_cost": cost_name,
                "per_seed": per_seed,
                "mean": rows,
            }))?
        );
    } else {
        print!("{}", markdown(&rows, &seeds, cost_name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemption_starts_urgent_jobs_sooner_and_loses_no_job() {
        let curves = crate::paper::synthetic_curves();
        let config = cluster();
        let trace = priority_trace(&curves, 1);
        assert!(trace.jobs.iter().any(|j| j.model.priority == HIGH));
        let run = |s: &str| {
            let spec: PolicySpec = s.parse().unwrap();
            let r = run_cluster(&trace, &config, &spec, 1).unwrap();
            assert_eq!(r.unfinished, 0, "{s}: every job finishes");
            report(&r, &trace, &config)
        };
        let fifo = run("fifo");
        let preempt = run("fifo+preempt");
        assert_eq!(fifo.preemptions, 0);
        assert!(preempt.preemptions > 0, "{preempt:?}");
        assert!(
            preempt.high_wait_median <= fifo.high_wait_median,
            "{preempt:?} vs {fifo:?}"
        );
        assert!(
            preempt.avg_jct_high < fifo.avg_jct_high,
            "{preempt:?} vs {fifo:?}"
        );
    }
}
