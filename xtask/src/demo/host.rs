//! The demo on this machine's real cores.
//!
//! 1. **Set-up**: the eBPF build tools (if they cannot be installed, the daemon is built without
//!    its eBPF accounting and the demo goes on), the Python environment of the real jobs, the
//!    daemon (release; `--short`: the test stage's debug build).
//! 2. **Probe**: a few epochs of each training task alone, so that every job is sized to this
//!    machine (machines of this kind differ several-fold in speed; constants would make the jobs
//!    contend on one and run one after another on the next).
//! 3. **Sharing**: Keras jobs of different sizes and convergence speeds, started together, under
//!    `fair` (the kernel's sharing; the daemon only watches) and then under the policy. Where the
//!    jobs did not contend under fair (they ran together for less than half the run, or left the
//!    cores idle most of it) the demo says so instead of comparing.
//! 4. **Sweep**: a learning-rate sweep of one Keras model, every trial started together, under
//!    `fair` (every trial runs to its end, as without Governor) and then under the policy with the
//!    sweep's trial budget (`governor run-job --sweep`, successive halving): the best model under
//!    both, how much sooner it was ready, and the CPU-seconds the sweep used.
//!
//! It prints a table per part and writes `target/demo/demo.svg` (CPU share per job over time,
//! fair beside the policy; the jobs at their quality over time; the sweep's best loss so far)
//! and `target/demo/demo.json`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use governor_eval::bench_real::{
    self, Framework, JobResult, RealEnv, RunResult, Sizes, Workload, job, secs,
};
use governor_testbed::{cmd, setup};
use sim::plot::{self, Chart, Panel, Series, StepPanel};

use super::DemoArgs;
use crate::vm;

/// One job of the sharing part: name, task, learning rate, seconds it trains alone.
type SharingJob = (&'static str, &'static str, &'static str, f64);

/// Two fast learners, a slow one and a small CNN (the `mixed` workload of `bench-real`).
const SHARING: [SharingJob; 4] = [
    ("digits-fast", "digits", "3e-3", 20.0),
    ("teacher-slow", "teacher", "3e-4", 30.0),
    ("cnn", "digits_cnn", "1e-3", 25.0),
    ("digits-slow", "digits", "2e-4", 25.0),
];
const SHARING_SHORT: [SharingJob; 3] = [
    ("digits-fast", "digits", "3e-3", 6.0),
    ("teacher-slow", "teacher", "3e-4", 8.0),
    ("digits-slow", "digits", "2e-4", 6.0),
];

/// A sweep: its trials' learning rates, the seconds each trains alone, and the halving factor
/// (the budget keeps the best 1/ETA at each rung; two rungs leave one trial).
struct SweepPlan {
    learning_rates: &'static [&'static str],
    alone_seconds: f64,
    eta: u32,
}
const SWEEP: SweepPlan = SweepPlan {
    learning_rates: &["3e-2", "1e-2", "3e-3", "1e-3", "3e-4", "1e-4"],
    alone_seconds: 15.0,
    eta: 3,
};
const SWEEP_SHORT: SweepPlan = SweepPlan {
    learning_rates: &["1e-2", "3e-3", "1e-3", "1e-4"],
    alone_seconds: 6.0,
    eta: 2,
};
/// The task the sweep's trials train.
const SWEEP_TASK: &str = "digits";

/// Below this share of the cores used by the jobs under fair, they left the cores idle (or other
/// work took them) and a comparison would not show sharing.
const MIN_BUSY: f64 = 0.5;

pub(super) fn run(args: &DemoArgs) -> Result<()> {
    let started = Instant::now();
    let out = cmd::target_dir().join("demo");
    fs::create_dir_all(&out)?;
    setup::ebpf_tools_or_build_without();
    let python = bench_real::python_env()?;
    let page = !args.short && !args.no_page;
    let governor = build_binaries(args.short, page)?;
    let env = RealEnv::new(python, governor.join("governor"))?;
    let cores = std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64);

    let (sharing, sweep) = if args.short {
        (&SHARING_SHORT[..], &SWEEP_SHORT)
    } else {
        (&SHARING[..], &SWEEP)
    };
    let mut tasks: Vec<&str> = sharing.iter().map(|j| j.1).collect();
    tasks.push(SWEEP_TASK);
    tasks.sort_unstable();
    tasks.dedup();
    let per_epoch = probe(&env, &tasks)?;
    let min_epochs = if args.short { 12 } else { 27 };
    let epochs = |task: &str, alone: f64| -> u32 {
        let s = per_epoch.get(task).copied().unwrap_or(0.1).max(1e-3);
        ((alone / s).round() as u32).clamp(min_epochs, 2000)
    };
    eprintln!(
        "== this machine ({cores} cores), each task alone: {}; jobs sized to train {:.0}-{:.0} s alone",
        per_epoch
            .iter()
            .map(|(t, s)| format!("{t} {:.3} s/epoch", s))
            .collect::<Vec<_>>()
            .join(", "),
        sharing.iter().map(|j| j.3).fold(f64::MAX, f64::min),
        sharing.iter().map(|j| j.3).fold(0.0, f64::max),
    );

    let sharing_load = Workload {
        name: "sharing".into(),
        about: format!(
            "{} Keras jobs of different sizes and convergence speeds, started together",
            sharing.len()
        ),
        jobs: sharing
            .iter()
            .map(|&(name, task, lr, alone)| {
                job(
                    name,
                    0.0,
                    Framework::Keras,
                    epochs(task, alone),
                    &["--task", task, "--lr", lr],
                )
            })
            .collect(),
        coordinator_state: Vec::new(),
    };
    let trial_epochs = epochs(SWEEP_TASK, sweep.alone_seconds);
    let sweep_load = Workload {
        name: "sweep".into(),
        about: format!(
            "a learning-rate sweep: {} trials of one Keras model, started together",
            sweep.learning_rates.len()
        ),
        jobs: sweep
            .learning_rates
            .iter()
            .enumerate()
            .map(|(k, lr)| {
                job(
                    &format!("trial-lr{lr}"),
                    0.0,
                    Framework::Keras,
                    trial_epochs,
                    &["--task", SWEEP_TASK, "--lr", lr, "--seed", &k.to_string()],
                )
            })
            .collect(),
        coordinator_state: Vec::new(),
    };
    // Rungs at 1/ETA² and 1/ETA of the trials' epochs: two cuts leave the best trial.
    let first_rung = (trial_epochs / (sweep.eta * sweep.eta)).max(2);
    let budget = format!("{}+sweep=demo:{}:{first_rung}", args.policy, sweep.eta);

    let page = if page {
        Some(PageCoordinator::start(&governor, &out.join("coordinator"))?)
    } else {
        None
    };
    let run_part = |w: &Workload, policies: &[&str]| -> Result<Vec<(RunResult, Option<f64>)>> {
        let mut runs = Vec::new();
        for &p in policies {
            eprintln!(
                "== {}: {} under `{p}` (~{:.0} s)",
                w.name,
                w.about,
                expected_seconds(w, &per_epoch, cores)
            );
            let dir = out
                .join("host")
                .join(&w.name)
                .join(bench_real::policy_dir_name(p));
            let mut extra = Vec::new();
            if let Some(page) = &page {
                extra.push(page.node_config(&dir));
            }
            let before = machine_cpu();
            let r = env.run_once(w, p, Sizes::Known, 1, &dir, &extra)?;
            let busy = machine_cpu()
                .zip(before)
                .map(|((busy1, all1), (busy0, all0))| (busy1 - busy0) / (all1 - all0).max(1.0));
            if let Some(bad) = r.jobs.iter().find(|j| !j.exit_ok) {
                bail!(
                    "job {} failed under `{p}`; its output is in {}",
                    bad.name,
                    dir.join(format!("{}.out", bad.name)).display()
                );
            }
            runs.push((r, busy));
        }
        Ok(runs)
    };
    let sharing_runs = run_part(&sharing_load, &["fair", args.policy.as_str()])?;
    let sweep_runs = run_part(&sweep_load, &["fair", budget.as_str()])?;
    drop(page);

    let sharing_report = SharingReport::new(&sharing_runs[0], &sharing_runs[1].0, cores);
    let sweep_report = SweepReport::new(&sweep_runs[0], &sweep_runs[1].0, cores);
    let (sharing_runs, sweep_runs): (Vec<RunResult>, Vec<RunResult>) = (
        sharing_runs.iter().map(|r| r.0.clone()).collect(),
        sweep_runs.iter().map(|r| r.0.clone()).collect(),
    );
    println!("{}", sharing_report.text(&sharing_load));
    println!("{}", sweep_report.text(&sweep_load));
    let svg = plot(&sharing_runs, &sweep_runs, cores);
    let svg_path = out.join("demo.svg");
    fs::write(&svg_path, svg)?;
    let json = serde_json::json!({
        "cores": cores,
        "seconds_per_epoch": per_epoch,
        "sharing": { "runs": sharing_runs, "contention": sharing_report.contention },
        "sweep": { "runs": sweep_runs, "contention": sweep_report.contention, "rule": budget },
    });
    fs::write(out.join("demo.json"), serde_json::to_string_pretty(&json)?)?;
    println!(
        "plot: {}\nruns, logs and the daemon's status: {}\n\
         One run on a shared machine varies by several percent: `cargo xtask bench-real` pairs \
         and repeats them (docs/evaluation/real-jobs.md).\n\
         == demo finished in {:.0} s",
        svg_path.display(),
        out.join("host").display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Builds the daemon (and the coordinator for the cluster page); returns their directory.
fn build_binaries(short: bool, page: bool) -> Result<PathBuf> {
    if short {
        // The very build of `cargo xtask test`'s unit stage: nothing is built again after it.
        vm::build_test_binaries()?;
        return Ok(cmd::target_dir().join("debug"));
    }
    eprintln!("== building the release daemon");
    let mut build = cmd::cargo();
    build.args(["build", "--release", "-p", "governor", "--bin", "governor"]);
    if page {
        build.args(["-p", "coordinator", "--bin", "coordinator"]);
    }
    cmd::run(&mut build)?;
    Ok(cmd::target_dir().join("release"))
}

/// Seconds per epoch of each task alone on this machine (`train_keras.py --probe`).
fn probe(env: &RealEnv, tasks: &[&str]) -> Result<BTreeMap<String, f64>> {
    eprintln!(
        "== probing this machine: a few epochs of {} alone",
        tasks.join(", ")
    );
    let mut c = Command::new(&env.python);
    c.arg(env.scripts.join("train_keras.py"))
        .args(["--probe", &tasks.join(",")])
        .stdin(Stdio::null());
    let run = c
        .output()
        .with_context(|| format!("cannot start {}", env.python.display()))?;
    let out = String::from_utf8_lossy(&run.stdout);
    if !run.status.success() {
        bail!(
            "the probe of the training tasks failed ({}):\n{}",
            run.status,
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let last = out.lines().last().unwrap_or_default();
    let per_epoch: BTreeMap<String, f64> = serde_json::from_str(last)
        .with_context(|| format!("the probe printed no timings: {out:?}"))?;
    if tasks
        .iter()
        .any(|t| !per_epoch.get(*t).is_some_and(|s| *s > 0.0))
    {
        bail!("the probe did not time every task: {per_epoch:?}");
    }
    Ok(per_epoch)
}

/// A rough length of one run of `w` (its jobs' training alone over the cores, plus a start).
fn expected_seconds(w: &Workload, per_epoch: &BTreeMap<String, f64>, cores: f64) -> f64 {
    let training: f64 = w
        .jobs
        .iter()
        .map(|j| {
            let task = j
                .args
                .iter()
                .skip_while(|a| *a != "--task")
                .nth(1)
                .map_or("digits", String::as_str);
            f64::from(j.epochs) * per_epoch.get(task).copied().unwrap_or(0.1)
        })
        .sum();
    // A Keras job alone keeps about 1.3 of these cores busy; its start costs ~6 CPU-seconds.
    (training * 1.3 + 6.0 * w.jobs.len() as f64) / cores
}

/// The whole machine's CPU time so far, busy and all, in clock ticks (`/proc/stat`).
fn machine_cpu() -> Option<(f64, f64)> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy = ticks.iter().take(8).sum::<f64>() - ticks.get(3)? - ticks.get(4)?;
    Some((busy, ticks.iter().take(8).sum()))
}

/// How much the jobs of a run competed for the cores.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Contention {
    /// Share of the makespan with two or more jobs running.
    together: f64,
    /// The jobs' CPU-seconds over the makespan's core-seconds.
    jobs_use: f64,
    /// Share of the machine's CPU time busy during the run, the jobs' and any other work's.
    machine_busy: Option<f64>,
}

impl Contention {
    fn of(r: &RunResult, machine_busy: Option<f64>, cores: f64) -> Contention {
        let intervals: Vec<(f64, f64)> = r
            .jobs
            .iter()
            .map(|j| (j.submitted, j.submitted + j.jct))
            .collect();
        Contention {
            together: super::together_fraction(&intervals),
            jobs_use: total_cpu(r).unwrap_or(0.0) / (r.makespan * cores).max(1e-9),
            machine_busy,
        }
    }

    fn contended(&self) -> bool {
        self.together >= super::MIN_TOGETHER && self.jobs_use >= MIN_BUSY
    }

    /// One line on what the baseline run was like, or why there is no comparison.
    fn line(&self, cores: f64) -> String {
        let (together, used) = (100.0 * self.together, 100.0 * self.jobs_use);
        if self.contended() {
            return format!(
                "Contention: under fair the jobs ran together for {together:.0}% of the run and used {used:.0}% of the {cores} cores."
            );
        }
        let why = if self.together < super::MIN_TOGETHER {
            format!(
                "under fair the jobs ran together for only {together:.0}% of the run: they ran one after another"
            )
        } else if self.machine_busy.is_some_and(|b| b >= 0.8) {
            format!(
                "this machine was busy with other work: the jobs got only {used:.0}% of its {cores} cores, the machine {:.0}% busy",
                100.0 * self.machine_busy.unwrap_or(0.0)
            )
        } else {
            format!(
                "the jobs used only {used:.0}% of the {cores} cores: too few to contend for them"
            )
        };
        format!("No comparison: {why}, so any difference would be the machine's, not the policy's.")
    }
}

fn change(base: Option<f64>, new: Option<f64>) -> String {
    match (base, new) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:+.0}%", 100.0 * (b / a - 1.0)),
        _ => "-".into(),
    }
}

fn total_cpu(r: &RunResult) -> Option<f64> {
    r.jobs.iter().map(|j| j.cpu_seconds).sum()
}

/// The sharing part: each job under fair and under the policy.
struct SharingReport<'a> {
    fair: &'a RunResult,
    policy: &'a RunResult,
    contention: Contention,
    cores: f64,
}

impl<'a> SharingReport<'a> {
    fn new(fair: &'a (RunResult, Option<f64>), policy: &'a RunResult, cores: f64) -> Self {
        SharingReport {
            fair: &fair.0,
            policy,
            contention: Contention::of(&fair.0, fair.1, cores),
            cores,
        }
    }

    fn text(&self, w: &Workload) -> String {
        let (f, p) = (self.fair, self.policy);
        let mut s = format!(
            "\n== Part 1, sharing: {} ({} epochs)\n{}\n",
            w.about,
            w.jobs
                .iter()
                .map(|j| format!("{} {}", j.name, j.epochs))
                .collect::<Vec<_>>()
                .join(", "),
            self.contention.line(self.cores)
        );
        if !self.contention.contended() {
            return s;
        }
        s.push_str(&format!(
            "{:<14} {:>9} {:>9} {:>7}   {:>9} {:>9} {:>7}\n",
            "job", "JCT fair", &p.policy, "change", "TTQ fair", &p.policy, "change"
        ));
        for j in &f.jobs {
            let o = p.jobs.iter().find(|o| o.name == j.name);
            let (a, b) = (Some(j.jct), o.map(|o| o.jct));
            let (c, d) = (j.ttq, o.and_then(|o| o.ttq));
            s.push_str(&format!(
                "{:<14} {:>9} {:>9} {:>7}   {:>9} {:>9} {:>7}\n",
                j.name,
                secs(a),
                secs(b),
                change(a, b),
                secs(c),
                secs(d),
                change(c, d)
            ));
        }
        let (a, b) = (Some(f.avg_jct()), Some(p.avg_jct()));
        let (c, d) = (f.avg_ttq(), p.avg_ttq());
        s.push_str(&format!(
            "{:<14} {:>9} {:>9} {:>7}   {:>9} {:>9} {:>7}\n",
            "average",
            secs(a),
            secs(b),
            change(a, b),
            secs(c),
            secs(d),
            change(c, d)
        ));
        s.push_str(&format!(
            "makespan {} and {} ({}); CPU-seconds of the jobs {} and {} ({})\n\
             JCT: submission to exit. TTQ (time to quality): until the job's validation loss came \
             within 5% of its whole reduction.",
            secs(Some(f.makespan)),
            secs(Some(p.makespan)),
            change(Some(f.makespan), Some(p.makespan)),
            secs(total_cpu(f)).replace(" s", ""),
            secs(total_cpu(p)).replace(" s", ""),
            change(total_cpu(f), total_cpu(p)),
        ));
        s
    }
}

/// What the one who launched a sweep gets: its best model, and when.
#[derive(Debug, Clone, serde::Serialize)]
struct SweepOutcome {
    best_trial: String,
    best_loss: f64,
    /// Seconds from the sweep's start until the best trial ended (its model ready).
    best_ready: f64,
    /// Seconds until the best trial reached its quality.
    best_at_quality: Option<f64>,
    makespan: f64,
    cpu_seconds: Option<f64>,
    /// Trials that ran fewer epochs than planned (stopped by the budget).
    stopped: usize,
}

impl SweepOutcome {
    fn of(r: &RunResult) -> Option<SweepOutcome> {
        let (best_trial, best_loss, best_at_quality) = bench_real::sweep_result(r)?;
        let best = r.jobs.iter().find(|j| j.name == best_trial)?;
        let planned = r.jobs.iter().map(|j| j.epochs_done).max().unwrap_or(0);
        Some(SweepOutcome {
            best_ready: best.submitted + best.jct,
            best_trial,
            best_loss,
            best_at_quality,
            makespan: r.makespan,
            cpu_seconds: total_cpu(r),
            stopped: r.jobs.iter().filter(|j| j.epochs_done < planned).count(),
        })
    }
}

/// The sweep part: fair against the trial budget.
struct SweepReport {
    fair: Option<SweepOutcome>,
    budget: Option<SweepOutcome>,
    trials: usize,
    contention: Contention,
    cores: f64,
}

impl SweepReport {
    fn new(fair: &(RunResult, Option<f64>), budget: &RunResult, cores: f64) -> Self {
        SweepReport {
            fair: SweepOutcome::of(&fair.0),
            budget: SweepOutcome::of(budget),
            trials: fair.0.jobs.len(),
            contention: Contention::of(&fair.0, fair.1, cores),
            cores,
        }
    }

    fn text(&self, w: &Workload) -> String {
        let mut s = format!(
            "\n== Part 2, a sweep: {} ({} epochs each)\n{}\n",
            w.about,
            w.jobs.first().map_or(0, |j| j.epochs),
            self.contention.line(self.cores)
        );
        let (Some(f), Some(b)) = (&self.fair, &self.budget) else {
            s.push_str("No comparison: a run logged no loss.\n");
            return s;
        };
        if !self.contention.contended() {
            return s;
        }
        let same = if f.best_trial == b.best_trial {
            format!(
                "the same best model: {} (validation loss {:.4} under fair, {:.4} with the budget, {})",
                f.best_trial,
                f.best_loss,
                b.best_loss,
                change(Some(f.best_loss), Some(b.best_loss))
            )
        } else {
            format!(
                "NOT the same best model: the budget's best is {} (loss {:.4}); under fair {} won (loss {:.4}): the budget cut the better trial at a rung",
                b.best_trial, b.best_loss, f.best_trial, f.best_loss
            )
        };
        s.push_str(&format!(
            "{:<34} {:>10} {:>14} {:>7}\n",
            "", "fair", "budget", "change"
        ));
        let row = |name: &str, a: Option<f64>, c: Option<f64>| {
            format!(
                "{name:<34} {:>10} {:>14} {:>7}\n",
                secs(a),
                secs(c),
                change(a, c)
            )
        };
        s.push_str(&row(
            "best model ready",
            Some(f.best_ready),
            Some(b.best_ready),
        ));
        s.push_str(&row(
            "best model at its quality",
            f.best_at_quality,
            b.best_at_quality,
        ));
        s.push_str(&row("every trial done", Some(f.makespan), Some(b.makespan)));
        s.push_str(&format!(
            "{:<34} {:>10} {:>14} {:>7}\n",
            "CPU-seconds used by the sweep",
            f.cpu_seconds.map_or("-".into(), |c| format!("{c:.0}")),
            b.cpu_seconds.map_or("-".into(), |c| format!("{c:.0}")),
            change(f.cpu_seconds, b.cpu_seconds)
        ));
        s.push_str(&format!(
            "{:<34} {:>10} {:>14}\n",
            "trials stopped early",
            format!("{} of {}", f.stopped, self.trials),
            format!("{} of {}", b.stopped, self.trials)
        ));
        s.push_str(&format!(
            "With the budget: {same}.\nThe budget (successive halving, `governor run-job --sweep NAME`) stops the trials \
             outranked at each rung whose predicted final loss is confidently worse, and the survivors get their CPU."
        ));
        s
    }
}

/// One SVG: each job's cores over time under fair and the policy (stacked: who got the cores),
/// the jobs at their quality over time, and the sweep's best loss so far.
fn plot(sharing: &[RunResult], sweep: &[RunResult], cores: f64) -> String {
    let cpu = |r: &RunResult, part: &str| StepPanel {
        title: format!(
            "{part} under {}: each job's cores (2 s average); all done at {:.0} s",
            display_policy(&r.policy),
            r.makespan
        ),
        capacity: cores,
        jobs: r
            .jobs
            .iter()
            .map(|j| {
                let mut points = smoothed(&j.cpu_timeline, 2.0);
                // Held until the next point: the job's end brings it to none.
                points.push((j.submitted + j.jct, 0.0));
                Series {
                    label: j.name.clone(),
                    points,
                }
            })
            .collect(),
    };
    let sharing_cpu: Vec<StepPanel> = sharing.iter().map(|r| cpu(r, "Sharing")).collect();
    let sweep_cpu: Vec<StepPanel> = sweep.iter().map(|r| cpu(r, "Sweep")).collect();
    let at_quality = Panel {
        title: "Sharing: jobs at their quality (validation loss within 5% of its whole reduction)"
            .into(),
        y_label: "jobs".into(),
        y_range: Some((
            0.0,
            sharing.first().map_or(1, |r| r.jobs.len()) as f64 + 0.2,
        )),
        series: sharing
            .iter()
            .map(|r| Series {
                label: display_policy(&r.policy),
                points: quality_steps(&r.jobs),
            })
            .collect(),
    };
    let best = Panel {
        title: "Sweep: the best validation loss of any trial so far".into(),
        y_label: "loss".into(),
        y_range: None,
        series: sweep
            .iter()
            .map(|r| Series {
                label: display_policy(&r.policy),
                points: best_loss_steps(&r.jobs),
            })
            .collect(),
    };
    let mut charts: Vec<Chart<'_>> = sharing_cpu.iter().map(Chart::Stacked).collect();
    charts.push(Chart::Lines(&at_quality));
    charts.extend(sweep_cpu.iter().map(Chart::Stacked));
    charts.push(Chart::Lines(&best));
    plot::charts_svg(
        "Governor demo on this machine's real cores: fair sharing against Governor",
        "seconds since the jobs started",
        &charts,
    )
}

/// A policy as a reader knows it: `shortest-left+sweep=...` is the policy with the trial budget.
fn display_policy(policy: &str) -> String {
    let base = bench_real::node_spec(policy);
    if bench_real::policy_option(policy, "sweep").is_some() {
        format!("{base} + budget")
    } else {
        base
    }
}

/// The average of each point and those up to `window` seconds before it.
fn smoothed(points: &[(f64, f64)], window: f64) -> Vec<(f64, f64)> {
    points
        .iter()
        .enumerate()
        .map(|(i, &(t, _))| {
            let recent: Vec<f64> = points[..=i]
                .iter()
                .rev()
                .take_while(|p| t - p.0 < window)
                .map(|p| p.1)
                .collect();
            (t, recent.iter().sum::<f64>() / recent.len() as f64)
        })
        .collect()
}

/// The number of jobs at their quality over time, as steps.
fn quality_steps(jobs: &[JobResult]) -> Vec<(f64, f64)> {
    let mut at: Vec<f64> = jobs
        .iter()
        .filter_map(|j| Some(j.submitted + j.ttq?))
        .collect();
    at.sort_by(f64::total_cmp);
    let mut points = vec![(0.0, 0.0)];
    for (k, t) in at.into_iter().enumerate() {
        points.push((t, k as f64));
        points.push((t, k as f64 + 1.0));
    }
    points
}

/// The best validation loss (else loss) of any job so far, at each epoch of any job.
fn best_loss_steps(jobs: &[JobResult]) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = jobs
        .iter()
        .flat_map(|j| {
            j.curve
                .iter()
                .map(move |&(t, l, v)| (j.submitted + t, if v.is_finite() { v } else { l }))
        })
        .filter(|(_, v)| v.is_finite())
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best = f64::INFINITY;
    let mut steps = Vec::new();
    for (t, v) in points {
        if v < best {
            best = v;
            steps.push((t, v));
        }
    }
    steps
}

/// A coordinator serving the live cluster page, stopped when dropped.
struct PageCoordinator {
    child: std::process::Child,
    /// Where the node daemon connects.
    address: String,
}

impl PageCoordinator {
    /// Start the coordinator in `bin` (plain text on localhost: the demo's own node only) with
    /// its page and `/metrics` on a free port, and say where they are.
    fn start(bin: &Path, dir: &Path) -> Result<PageCoordinator> {
        fs::create_dir_all(dir)?;
        let store = dir.join("coordinator.redb");
        let _ = fs::remove_file(&store);
        let (listen, web) = (cmd::free_port()?, cmd::free_port()?);
        let log = fs::File::create(dir.join("coordinator.log"))?;
        let child = Command::new(bin.join("coordinator"))
            .args(["--insecure", "--lost-after", "5"])
            .arg("--listen")
            .arg(format!("127.0.0.1:{listen}"))
            .arg("--web")
            .arg(format!("127.0.0.1:{web}"))
            .arg("--store")
            .arg(&store)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start the coordinator")?;
        eprintln!(
            "   live cluster page: http://127.0.0.1:{web}/ while the demo runs (this node, its jobs' loss and CPU, \
             the node's decisions; log {})",
            dir.join("coordinator.log").display()
        );
        Ok(PageCoordinator {
            child,
            address: format!("127.0.0.1:{listen}"),
        })
    }

    /// The daemon's configuration that joins it to this coordinator.
    fn node_config(&self, dir: &Path) -> String {
        format!(
            "[node]\nname = \"demo\"\n[coordinator]\naddress = \"{}\"\ninsecure = true\nallow_root_jobs = true\njob_output_dir = \"{}\"",
            self.address,
            dir.join("job-output").display()
        )
    }
}

impl Drop for PageCoordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, start: f64, jct: f64, ttq: Option<f64>, cpu_seconds: f64) -> JobResult {
        JobResult {
            name: name.into(),
            submitted: start,
            jct,
            ttq,
            cpu_seconds: Some(cpu_seconds),
            epochs_done: 10,
            exit_ok: true,
            curve: vec![(1.0, 2.0, 1.5), (2.0, 1.0, 0.9), (3.0, 0.8, 1.0)],
            cpu_timeline: Vec::new(),
        }
    }

    fn run(jobs: Vec<JobResult>) -> RunResult {
        RunResult {
            workload: "w".into(),
            policy: "fair".into(),
            rep: 1,
            sizes: Sizes::Known,
            makespan: jobs.iter().map(|j| j.submitted + j.jct).fold(0.0, f64::max),
            daemon_cpu_seconds: 0.0,
            jobs,
        }
    }

    #[test]
    fn jobs_that_ran_one_after_another_are_not_compared() {
        let r = run(vec![
            job("a", 0.0, 10.0, Some(3.0), 10.0),
            job("b", 10.0, 10.0, Some(3.0), 10.0),
        ]);
        let c = Contention::of(&r, Some(0.5), 2.0);
        assert!(!c.contended(), "{c:?}");
        assert!(c.line(2.0).contains("one after another"), "{}", c.line(2.0));
    }

    #[test]
    fn jobs_that_shared_the_cores_are_compared() {
        let r = run(vec![
            job("a", 0.0, 10.0, Some(3.0), 9.0),
            job("b", 0.0, 8.0, Some(3.0), 8.0),
        ]);
        let c = Contention::of(&r, Some(0.95), 2.0);
        assert!(c.contended(), "{c:?}");
        assert!((c.together - 0.8).abs() < 1e-9);
        assert!((c.jobs_use - 0.85).abs() < 1e-9);
        assert!(c.line(2.0).starts_with("Contention"));
    }

    #[test]
    fn jobs_starved_by_other_work_or_too_few_for_the_cores_are_not_compared() {
        let r = run(vec![
            job("a", 0.0, 10.0, Some(3.0), 2.0),
            job("b", 0.0, 10.0, Some(3.0), 2.0),
        ]);
        let busy = Contention::of(&r, Some(0.95), 2.0);
        assert!(!busy.contended());
        assert!(
            busy.line(2.0).contains("busy with other work"),
            "{}",
            busy.line(2.0)
        );
        let idle = Contention::of(&r, Some(0.3), 2.0);
        assert!(!idle.contended());
        assert!(idle.line(2.0).contains("too few"), "{}", idle.line(2.0));
    }

    #[test]
    fn the_sweeps_best_loss_only_falls_and_jobs_at_quality_only_rise() {
        let jobs = vec![
            job("a", 0.0, 10.0, Some(3.0), 1.0),
            job("b", 0.5, 10.0, Some(1.0), 1.0),
        ];
        let best = best_loss_steps(&jobs);
        assert!(best.windows(2).all(|w| w[1].1 < w[0].1 && w[1].0 >= w[0].0));
        assert_eq!(best.last().unwrap().1, 0.9);
        let q = quality_steps(&jobs);
        assert_eq!(q.last().unwrap(), &(3.0, 2.0));
        assert!(q.windows(2).all(|w| w[1].1 >= w[0].1));
    }

    #[test]
    fn cpu_is_averaged_over_the_window_before_each_sample() {
        let s = smoothed(&[(0.5, 2.0), (1.0, 0.0), (1.5, 1.0), (3.0, 1.0)], 1.0);
        assert_eq!(s, vec![(0.5, 2.0), (1.0, 1.0), (1.5, 0.5), (3.0, 1.0)]);
    }
}
