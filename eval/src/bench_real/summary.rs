//! The report of one workload: the runs aggregated against fair (`summary.md`, `results.json`)
//! and the plots.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Result, bail};
use sim::plot::{self, Panel, Series};

use super::results::{Pair, Spread, pair};
use super::{
    JobResult, RunResult, Sizes, Workload, job_values, old_spellings, policy_dir_name, run_dir,
    spread, sweep_result,
};
use crate::calibrate;

/// Everything `summary.md` and `results.json` say about one workload.
pub(super) struct Report {
    pub(super) markdown: String,
    pub(super) json: serde_json::Value,
    pub(super) plots: Vec<(String, String)>,
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

/// The stored runs of `policy`; where there are none, those stored under an old name of its node
/// policy ([`old_spellings`]: series run before a rename still aggregate).
fn load_runs(out: &Path, w: &Workload, policy: &str, sizes: Sizes) -> Vec<RunResult> {
    let runs = load_runs_named(out, w, policy, sizes);
    if !runs.is_empty() {
        return runs;
    }
    old_spellings(policy)
        .iter()
        .map(|old| load_runs_named(out, w, old, sizes))
        .find(|runs| !runs.is_empty())
        .unwrap_or_default()
}

fn load_runs_named(out: &Path, w: &Workload, policy: &str, sizes: Sizes) -> Vec<RunResult> {
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

pub(super) fn aggregate(
    out: &Path,
    w: &Workload,
    policies: &[String],
    sim_policies: &[String],
    sizes: Sizes,
    cluster: bool,
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
    // govsim's calibration models one machine: a cluster run says where its jobs went instead.
    let calibration = if cluster {
        let policies: Vec<String> = std::iter::once("fair".to_owned())
            .chain(policies.iter().cloned())
            .collect();
        md.push_str(&super::cluster::placements_md(out, w, &policies, sizes));
        serde_json::Value::Null
    } else {
        let cores = std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64);
        let (calibration_md, calibration) =
            calibrate::report(out, w, &fair, &all_runs, sim_policies, sizes, cores)?;
        md.push_str(&calibration_md);
        calibration
    };
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
