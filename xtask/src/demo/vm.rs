//! The demo in the VM bed: boots the VM (a real cgroup v2 kernel, emulated cores), starts the
//! governor daemon and three CPU-bound `demo-trainer` jobs a few seconds apart (a real
//! gradient-descent loop writing a real framework's log format, launched with
//! `governor run-job`), prints the daemon's live status table while they run, then each job's
//! completion time and a plot of each job's CPU share and loss over time; first under `fair`,
//! then under the chosen policy, and compares them where the jobs ran together.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use governor_testbed::vm::{self, GuestSpec};
use governor_testbed::{cmd, setup};
use serde_json::Value;
use sim::plot::{self, Panel, Series};

use super::DemoArgs;

/// The demo's jobs: name, log format, log file name, learning rate (how fast it learns).
const JOBS: [(&str, &str, &str, &str); 3] = [
    ("resnet-keras", "keras-csv", "training.log", "0.08"),
    ("bert-hf", "hf-console", "train.out", "0.05"),
    ("gpt-lightning", "lightning-csv", "metrics.csv", "0.03"),
];

pub(crate) fn run(args: &DemoArgs) -> Result<()> {
    let bed = setup::run()?;
    eprintln!("== building the governor and the demo training job");
    cmd::run(cmd::cargo().args(["build", "-p", "governor", "--bin", "governor"]))?;
    // The dev profile builds the trainer with opt-level 3 (Cargo.toml), so one build serves.
    cmd::run(cmd::cargo().args([
        "build",
        "-p",
        "governor-integration-tests",
        "--bin",
        "demo-trainer",
    ]))?;
    let policies: Vec<&str> = if args.policy == "fair" {
        vec!["fair"]
    } else {
        vec!["fair", args.policy.as_str()]
    };
    let out_dir = cmd::target_dir().join("demo");
    fs::create_dir_all(&out_dir)?;
    for policy in &policies {
        run_one(&bed, args, policy, &out_dir)?;
    }
    print_comparison(&out_dir)?;
    Ok(())
}

/// Epochs each trainer runs: `--short` keeps the CI version to a few minutes under emulation.
fn epochs(args: &DemoArgs) -> u32 {
    if args.short { 8 } else { args.epochs }
}

fn guest_script(args: &DemoArgs, policy: &str, run_dir: &Path) -> String {
    let governor = cmd::target_dir().join("debug/governor");
    let trainer = cmd::target_dir().join("debug/demo-trainer");
    let mut jobs = String::new();
    for (i, (name, format, file, lr)) in JOBS.iter().enumerate() {
        if i > 0 {
            jobs.push_str(&format!("sleep {}\n", args.stagger));
        }
        jobs.push_str(&format!("mkdir -p /tmp/demo/{name}\n"));
        jobs.push_str(&format!(
            "( s=$(now); $G run-job --name {name} --log /tmp/demo/{name}/{file} --epochs {epochs} -- {trainer} --log /tmp/demo/{name}/{file} --format {format} --epochs {epochs} --lr {lr} --seed {seed} --threads 2 > $RUN/{name}.out 2>&1; rc=$?; echo \"{name} $s $(now) $rc\" >> $RUN/jobs.txt ) &\n",
            trainer = trainer.display(),
            epochs = epochs(args),
            seed = i + 1,
        ));
    }
    format!(
        r#"now() {{ cut -d' ' -f1 /proc/uptime; }}
G={governor}
mkdir -p /tmp/demo/jobs.d /run/governor
cat > /tmp/demo/governor.toml <<EOF
policy = "{policy}"
jobs_dir = "/tmp/demo/jobs.d"
state_file = "/run/governor/state.json"
socket = "/run/governor/governor.sock"
sample_interval = "500ms"
EOF
$G daemon --config /tmp/demo/governor.toml --log-level info > $RUN/daemon.log 2>&1 &
DAEMON=$!
for i in $(seq 100); do [ -S /run/governor/governor.sock ] && break; sleep 0.1; done
[ -S /run/governor/governor.sock ] || {{ echo "the daemon did not start:"; cat $RUN/daemon.log; exit 1; }}
echo "== governor daemon up (policy {policy}); starting {n} training jobs {stagger} s apart"
T0=$(now)
echo "demo_start $T0" > $RUN/jobs.txt
# The plot's samples: every second from the first job's start to the last job's end.
( while :; do $G status --json >> $RUN/status.jsonl 2>/dev/null; sleep 1; done ) &
SAMPLER=$!
{jobs}
sleep 1
while [ $(grep -c . $RUN/jobs.txt) -lt {total} ]; do
  echo "--- t=$(awk -v a=$(now) -v b=$T0 'BEGIN{{printf "%.0f", a-b}}')s"
  $G status 2>&1 | cut -c1-150
  sleep 2
done
echo "== all jobs finished; stopping the daemon (SIGTERM restores every limit)"
awk -v t=$(now) -v t0=$T0 '{{printf "   daemon CPU %.2f s over %.0f s (%.1f%% of one vCPU)\n", ($14+$15)/100, t-t0, 100*($14+$15)/100/(t-t0)}}' /proc/$DAEMON/stat
kill $SAMPLER 2>/dev/null; wait $SAMPLER 2>/dev/null
kill -TERM $DAEMON; wait $DAEMON
echo "daemon exit status $?"
rc=0
for d in /sys/fs/cgroup/governor.slice/jobs/*; do [ -d "$d" ] && echo "left behind: $d" && rc=1; done
"#,
        governor = governor.display(),
        n = JOBS.len(),
        stagger = args.stagger,
        total = JOBS.len() + 1,
    )
    .replace("$RUN", &run_dir.display().to_string())
}

fn run_one(bed: &setup::Bed, args: &DemoArgs, policy: &str, out_dir: &Path) -> Result<()> {
    let run_dir = vm::new_run_dir(&format!("demo-{policy}"))?;
    let name = "guest";
    let script = run_dir.join("guest.sh");
    let body = guest_script(args, policy, &run_dir);
    fs::write(
        &script,
        format!(
            "{}{body}{}",
            vm::guest_prologue(bed, &run_dir, name),
            vm::guest_epilogue()
        ),
    )?;
    eprintln!(
        "== demo with policy `{policy}`: booting the VM (2 vCPUs, TCG); run directory {}",
        run_dir.display()
    );
    let started = Instant::now();
    let mut child = vm::spawn_guest(
        bed,
        &run_dir,
        &GuestSpec {
            name: name.into(),
            cpus: 2,
            memory: "2G",
            qemu_opts: None,
            script,
        },
    )?;
    vm::wait_with_log(
        &mut child,
        &run_dir.join(format!("{name}.log")),
        Duration::from_secs(40 * 60),
    )?;
    let rc = vm::guest_rc(&run_dir, name)?;
    eprintln!(
        "== guest finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    summarise(&run_dir, policy, out_dir)?;
    if rc != 0 {
        bail!(
            "the demo guest failed (rc={rc}); see {}",
            run_dir.join("guest.log").display()
        );
    }
    Ok(())
}

/// Per-job results of one demo run.
#[derive(Debug)]
struct JobResult {
    start: f64,
    end: f64,
    rc: i32,
}

fn summarise(run_dir: &Path, policy: &str, out_dir: &Path) -> Result<()> {
    let jobs_txt = fs::read_to_string(run_dir.join("jobs.txt"))
        .with_context(|| format!("no jobs.txt in {}", run_dir.display()))?;
    let mut t0 = 0.0;
    let mut results = BTreeMap::new();
    for line in jobs_txt.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["demo_start", t] => t0 = t.parse().unwrap_or(0.0),
            [name, s, e, rc] => {
                results.insert(
                    name.to_string(),
                    JobResult {
                        start: s.parse().unwrap_or(0.0),
                        end: e.parse().unwrap_or(0.0),
                        rc: rc.parse().unwrap_or(-1),
                    },
                );
            }
            _ => {}
        }
    }
    println!("\n== completion times under `{policy}`");
    println!(
        "{:<16} {:>8} {:>8} {:>10} {:>4}",
        "JOB", "START", "END", "JCT (s)", "RC"
    );
    let mut total = 0.0;
    for (name, r) in &results {
        println!(
            "{name:<16} {:>8.1} {:>8.1} {:>10.1} {:>4}",
            r.start - t0,
            r.end - t0,
            r.end - r.start,
            r.rc
        );
        total += r.end - r.start;
    }
    let makespan = results.values().map(|r| r.end).fold(0.0, f64::max) - t0;
    let avg = if results.is_empty() {
        0.0
    } else {
        total / results.len() as f64
    };
    println!("average JCT {avg:.1} s, makespan {makespan:.1} s");
    let failed: Vec<&String> = results
        .iter()
        .filter(|(_, r)| r.rc != 0)
        .map(|(n, _)| n)
        .collect();
    if !failed.is_empty() {
        println!(
            "jobs that failed: {failed:?} (their output is in {})",
            run_dir.display()
        );
    }

    // Time series from the status snapshots.
    let mut cpu: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut loss: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let status = fs::read_to_string(run_dir.join("status.jsonl")).unwrap_or_default();
    let mut first_uptime = None;
    for line in status.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(s) = v
            .get("Status")
            .or(Some(&v))
            .filter(|s| s.get("jobs").is_some())
        else {
            continue;
        };
        let up = s["uptime_seconds"].as_f64().unwrap_or(0.0);
        let base = *first_uptime.get_or_insert(up);
        let t = up - base;
        for j in s["jobs"].as_array().into_iter().flatten() {
            let name = j["name"].as_str().unwrap_or("?").to_owned();
            if let Some(c) = j["cpu_usage_cores"].as_f64() {
                cpu.entry(name.clone()).or_default().push((t, c));
            }
            if let Some(l) = j["signal_value"].as_f64() {
                loss.entry(name).or_default().push((t, l));
            }
        }
    }
    let panels = [
        Panel {
            title: "CPU used (cores, 2 vCPUs)".into(),
            y_label: "cores".into(),
            y_range: Some((0.0, 2.1)),
            series: cpu
                .into_iter()
                .map(|(label, points)| Series { label, points })
                .collect(),
        },
        Panel {
            title: "Training loss".into(),
            y_label: "loss".into(),
            y_range: None,
            series: loss
                .into_iter()
                .map(|(label, points)| Series { label, points })
                .collect(),
        },
    ];
    let svg = plot::lines(
        &format!("Governor demo: policy {policy}"),
        "seconds since the daemon's first status",
        &panels,
    );
    let svg_path = out_dir.join(format!("demo-{policy}.svg"));
    fs::write(&svg_path, svg)?;
    let json = serde_json::json!({
        "policy": policy,
        "avg_jct": avg,
        "makespan": makespan,
        "jobs": results.iter().map(|(n, r)| serde_json::json!({"name": n, "start": r.start - t0, "end": r.end - t0, "jct": r.end - r.start, "rc": r.rc})).collect::<Vec<_>>(),
        "run_dir": run_dir,
    });
    fs::write(
        out_dir.join(format!("demo-{policy}.json")),
        serde_json::to_string_pretty(&json)?,
    )?;
    println!(
        "plot: {}  (CPU share and loss over time per job)",
        svg_path.display()
    );
    Ok(())
}

fn print_comparison(out_dir: &Path) -> Result<()> {
    let read = |p: &str| -> Option<Value> {
        serde_json::from_str(&fs::read_to_string(out_dir.join(format!("demo-{p}.json"))).ok()?).ok()
    };
    let Some(fair) = read("fair") else {
        return Ok(());
    };
    let mut rows = Vec::new();
    for entry in fs::read_dir(out_dir)?.filter_map(|e| e.ok()) {
        let n = entry.file_name().to_string_lossy().into_owned();
        if let Some(p) = n
            .strip_prefix("demo-")
            .and_then(|s| s.strip_suffix(".json"))
            && p != "fair"
            && let Some(v) = read(p)
        {
            rows.push((p.to_owned(), v));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    let intervals: Vec<(f64, f64)> = fair["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| Some((j["start"].as_f64()?, j["end"].as_f64()?)))
        .collect();
    let together = super::together_fraction(&intervals);
    if together < super::MIN_TOGETHER {
        println!(
            "\n== no comparison: under fair the trainers ran together for only {:.0}% of the run \
             (emulated cores are slow to start them); more epochs (--epochs) make them overlap",
            100.0 * together
        );
        return Ok(());
    }
    let f_avg = fair["avg_jct"].as_f64().unwrap_or(f64::NAN);
    let f_mk = fair["makespan"].as_f64().unwrap_or(f64::NAN);
    println!(
        "\n== comparison with fair sharing (last run of each policy, in {})",
        out_dir.display()
    );
    println!(
        "{:<10} {:>10} {:>10} {:>10} {:>10}",
        "POLICY", "AVG JCT", "vs fair", "MAKESPAN", "vs fair"
    );
    println!(
        "{:<10} {:>10.1} {:>10} {:>10.1} {:>10}",
        "fair", f_avg, "", f_mk, ""
    );
    for (p, v) in rows {
        let a = v["avg_jct"].as_f64().unwrap_or(f64::NAN);
        let m = v["makespan"].as_f64().unwrap_or(f64::NAN);
        println!(
            "{p:<10} {a:>10.1} {:>+9.1}% {m:>10.1} {:>+9.1}%",
            (a / f_avg - 1.0) * 100.0,
            (m / f_mk - 1.0) * 100.0
        );
    }
    Ok(())
}
