//! `bench-real --nodes N`: the seed papers' cluster experiments at reduced scale, on this
//! machine's real cores. A coordinator on loopback and N node daemons, each pinned to its own
//! share of the cores (`taskset`: every job a node starts inherits its CPUs) and declaring that
//! many cores (`[node] cores`); jobs are submitted with `govctl submit` at their arrival times and
//! placed, governed, and (for SpeCon) moved by their own Keras checkpoint, by the real binaries.
//!
//! A policy here is `NODE/PLACEMENT` (`fair/usage`, `fair/procon`, `specon/specon`,
//! `learning-first/soonest`); `fair` is `fair/spread`, the papers' Docker Swarm / Kubernetes
//! spread with kernel default shares, the baseline every other policy is paired with (as in
//! govsim's `paper` scenarios).
//!
//! The nodes share one kernel, so what they cannot show is a network between them: a move's
//! checkpoint is on the same disk (the "shared storage" case of docs/cluster.md). Each daemon
//! runs with `discovery.environment = false`, so it governs only the jobs its coordinator gave
//! it (with discovery on, each would also find the other's jobs by their `GOVERNOR_LOG`).
//!
//! Sizes come from a measurement, not constants: one epoch of the workload's model is timed on
//! one core (`train_keras.py --probe`, cached in the output directory), and each workload's
//! epochs and arrival times are set from it so that its runs keep the paper's proportions
//! (jobs per worker, arrival interval against a job's length) whatever this machine's speed.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use governor_policy::spec::SpecText;
use governor_testbed::cmd;
use serde::{Deserialize, Serialize};

use super::round::{Schedule, job_result, read_summary, remove_new_empty_slices, stop, unix_now};
use super::workload::{Framework, JobPlan, Workload, job};
use super::{JobResult, RealEnv, RunResult, Sizes};

/// Seconds one epoch of each task takes alone on one core, measured on this machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Probe {
    pub(super) epoch_seconds: BTreeMap<String, f64>,
}

/// What the probe times, each in one process on one core: a key of [`Probe::epoch_seconds`]
/// per task, and the training script's arguments.
const PROBES: &[(&[&str], &[&str])] = &[
    (
        &["digits_cnn", "digits", "teacher"],
        &["--probe", "digits_cnn,digits,teacher"],
    ),
    // The elastic workload's model: a CNN wide enough, in batches large enough, for a second
    // TensorFlow thread to pay (1.4x on this machine's two cores, 2026-11-30; the default
    // width and batch run no faster on two threads than on one).
    (
        &[WIDE_CNN],
        &[
            "--probe",
            "digits_cnn",
            "--threads",
            "1",
            "--width",
            "1024",
            "--batch",
            "256",
        ],
    ),
];

/// The elastic workload's task, as the probe names it.
const WIDE_CNN: &str = "digits_cnn_wide";

/// The node policy and the placement of a cluster benchmark policy.
pub(super) fn cluster_spec(policy: &str) -> Result<(String, String)> {
    if policy == "fair" {
        return Ok(("fair".into(), "spread".into()));
    }
    let spec: SpecText = policy
        .parse()
        .with_context(|| format!("policy {policy:?}"))?;
    let placement = spec.placement.clone().with_context(|| {
        format!("{policy:?}: a cluster policy is NODE/PLACEMENT, e.g. fair/procon")
    })?;
    Ok((spec.node, placement))
}

/// Times the workloads' tasks (once; kept in `out/probe.json`, completed when a task is new).
pub(super) fn probe(env: Option<&RealEnv>, out: &Path) -> Result<Probe> {
    let path = out.join("probe.json");
    let mut p = match fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?,
        Err(_) => Probe {
            epoch_seconds: BTreeMap::new(),
        },
    };
    for (keys, args) in PROBES {
        if keys.iter().all(|k| p.epoch_seconds.contains_key(*k)) {
            continue;
        }
        let Some(env) = env else {
            bail!(
                "no {keys:?} in {} (run without --report-only first)",
                path.display()
            );
        };
        eprintln!(
            "== timing one epoch of {} alone on one core",
            keys.join(", ")
        );
        let text = cmd::output(
            Command::new("taskset")
                .args(["-c", "0"])
                .arg(&env.python)
                .arg(env.scripts.join("train_keras.py"))
                .args(*args)
                .env("TF_CPP_MIN_LOG_LEVEL", "2"),
        )?;
        let line = text
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .context("the probe printed no JSON")?;
        let timed: BTreeMap<String, f64> =
            serde_json::from_str(line).context("the probe's JSON")?;
        // The script names a task by its `--task` name; the key says which variant it was.
        for (key, task) in keys.iter().zip(args[1].split(',')) {
            let seconds = timed
                .get(task)
                .copied()
                .with_context(|| format!("the probe did not time {task}"))?;
            p.epoch_seconds.insert((*key).to_owned(), seconds);
        }
    }
    fs::create_dir_all(out)?;
    fs::write(&path, serde_json::to_string_pretty(&p)?)?;
    Ok(p)
}

/// The cluster workloads, sized by `probe` for `nodes` nodes of `cores_per_node` cores.
pub(super) fn workloads(probe: &Probe, nodes: usize, cores_per_node: usize) -> Vec<Workload> {
    let epochs_for = |task: &str, seconds: f64| -> u32 {
        let per = probe
            .epoch_seconds
            .get(task)
            .copied()
            .unwrap_or(1.0)
            .max(0.01);
        ((seconds / per).round() as u32).clamp(3, 400)
    };
    // ProCon Fig. 2a: 15 copies of one model (VGG16), one every 60 s, on 4 workers: 3.75 jobs per
    // worker, each about 1500 s alone (6000 CPU-s on 4 vCPUs), so the interval is 4% of a job.
    let alone = 20.0;
    let procon_jobs = (nodes as f64 * 3.75).round() as usize;
    let procon = Workload {
        name: "procon".into(),
        about: format!(
            "ProCon Fig. 2a at reduced scale: {procon_jobs} copies of one model (a CNN, ~{alone:.0} s \
             alone), one every {:.1} s (4% of a job, as 60 s of 1500 s) on {nodes} nodes",
            alone * 0.04
        ),
        jobs: (0..procon_jobs)
            .map(|k| {
                job(
                    &format!("cnn{}", k + 1),
                    k as f64 * alone * 0.04,
                    Framework::Keras,
                    epochs_for("digits_cnn", alone),
                    &[
                        "--task",
                        "digits_cnn",
                        "--lr",
                        "1e-3",
                        "--seed",
                        &(k + 1).to_string(),
                    ],
                )
            })
            .collect(),
        coordinator_state: Vec::new(),
    };
    // `count` jobs cycling through `kinds` (name, task, learning rate, seconds alone), arriving
    // at a fixed scatter over [0, window] s (golden-ratio steps: every policy and repetition
    // sees the same arrivals).
    let mixed = |count: usize, kinds: &[(&str, &str, &str, f64)], window: f64| -> Vec<JobPlan> {
        (0..count)
            .map(|k| {
                let (name, task, lr, secs) = kinds[k % kinds.len()];
                let at = ((k as f64 * 0.618_034).fract() * window * 10.0).round() / 10.0;
                job(
                    &format!("{name}{}", k / kinds.len() + 1),
                    at,
                    Framework::Keras,
                    epochs_for(task, secs),
                    &["--task", task, "--lr", lr, "--seed", &(k + 1).to_string()],
                )
            })
            .collect()
    };
    // SpeCon Fig. 6: 20 jobs of mixed models at random times in [0, 300] s on 4 workers, most of
    // them converging well before their last epoch. Reduced: 3 jobs per node, mixed convergence
    // speeds, arriving over the first 12 s, about half a job's length alone.
    let specon_jobs = nodes * 3;
    let specon = Workload {
        name: "specon".into(),
        about: format!(
            "SpeCon Fig. 6 at reduced scale: {specon_jobs} jobs of three convergence speeds \
             (18-26 s alone) arriving over the first 12 s on {nodes} nodes, each \
             movable by its Keras checkpoint"
        ),
        jobs: mixed(
            specon_jobs,
            &[
                ("fast", "digits", "3e-3", 18.0),
                ("cnn", "digits_cnn", "1e-3", 22.0),
                ("slow", "teacher", "3e-4", 26.0),
            ],
            12.0,
        ),
        coordinator_state: Vec::new(),
    };
    // FlowCon Fig. 13: 20 jobs of mixed models on 4 workers, submitted over [0, 300] s, each
    // about 150-700 s alone on its worker (150-1400 CPU-s at a parallelism of 1-4): 5 jobs per
    // worker, the window about 0.85 of a mean job alone. Reduced: 5 jobs per node, three kinds
    // of 12-28 s alone, over 0.85 x 20 s.
    let flowcon_jobs = nodes * 5;
    let window = 0.85 * 20.0;
    let flowcon = Workload {
        name: "flowcon".into(),
        about: format!(
            "FlowCon Fig. 13 at reduced scale: {flowcon_jobs} jobs of three models (12-28 s \
             alone) arriving over the first {window:.0} s on {nodes} nodes (5 per node, as the \
             paper's 20 on 4)"
        ),
        jobs: mixed(
            flowcon_jobs,
            &[
                ("fast", "digits", "3e-3", 12.0),
                ("cnn", "digits_cnn", "1e-3", 20.0),
                ("slow", "teacher", "3e-4", 28.0),
            ],
            window,
        ),
        coordinator_state: Vec::new(),
    };
    let mut all = vec![procon, specon, flowcon];
    // The elastic schedulers' experiments. Kubeflow's write-up: 4 jobs at once on 3 nodes of 8
    // vCPUs, each declaring 1-2 workers and able to use up to 8 ("low resource requirements in
    // comparison to the available resource", where it says its scale-up excels); Schedulearn's:
    // 12 jobs over 600 s on 3 servers of 4 GPUs, asking for 1 or 2 and able to use 4. Reduced:
    // 4 elastic jobs per node of one model that gains from a second thread (the wide CNN), each
    // at least 1 core and at most the node's cores, 24-40 s alone on one core, arriving over
    // half a mean job. Only where a node has cores to grow into (`--nodes 1` on 2 cores).
    if cores_per_node >= 2 {
        let elastic_jobs = nodes * 4;
        let most = cores_per_node as u32;
        all.push(Workload {
            name: "elastic".into(),
            about: format!(
                "the Kubeflow and Schedulearn write-ups' elastic jobs at reduced scale: \
                 {elastic_jobs} jobs of a wide CNN (24-40 s alone on one core), each elastic \
                 from 1 to {most} cores (resized by its Keras checkpoint, as many TensorFlow \
                 threads as it is given), arriving over the first 15 s on {nodes} node(s) of \
                 {most} cores"
            ),
            jobs: (0..elastic_jobs)
                .map(|k| {
                    let secs = [32.0, 24.0, 40.0, 28.0][k % 4];
                    let lr = ["1e-3", "3e-4", "1e-3", "3e-3"][k % 4];
                    JobPlan {
                        elastic: Some((1, most)),
                        ..job(
                            &format!("cnn{}", k + 1),
                            ((k as f64 * 0.618_034).fract() * 15.0 * 10.0).round() / 10.0,
                            Framework::Keras,
                            epochs_for(WIDE_CNN, secs),
                            &[
                                "--task",
                                "digits_cnn",
                                "--width",
                                "1024",
                                "--batch",
                                "256",
                                "--threads",
                                "env",
                                "--lr",
                                lr,
                                "--seed",
                                &(k + 1).to_string(),
                            ],
                        )
                    }
                })
                .collect(),
            // A resize no sooner than a fifth of a job after a start, as the coordinator's
            // default 60 s is against jobs of minutes. DRAGON's own timers (30 s starving,
            // 60 s quiet) are the write-up's and stay.
            coordinator_state: vec!["resize_min_run_s = 6.0".into()],
        });
    }
    all
}

/// The CPUs of node `k` of `nodes` among `cpus` (contiguous, as even as they divide).
pub(super) fn node_cpus(k: usize, nodes: usize, cpus: usize) -> std::ops::Range<usize> {
    let per = cpus / nodes;
    k * per..(k + 1) * per
}

/// A coordinator and its nodes, stopped when dropped.
struct Bed {
    coordinator: Child,
    daemons: Vec<Child>,
    address: String,
    govctl: PathBuf,
}

impl Bed {
    fn govctl(&self) -> Command {
        let mut c = Command::new(&self.govctl);
        // The nodes allow root's jobs (`allow_root_jobs`): this benchmark runs as root.
        c.env("USER", "root")
            .args(["--coordinator", &self.address, "--insecure"])
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// The coordinator's jobs (`govctl --json jobs --all`), if it answers.
    fn jobs(&self) -> Option<Vec<serde_json::Value>> {
        let out = self
            .govctl()
            .args(["--json", "jobs", "--all"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()?
            .as_array()
            .cloned()
    }
}

/// Appends `value` unless it is the last one already: a job's nodes or sizes, as they change.
fn push_change<T: PartialEq>(seen: &mut Vec<T>, value: T) {
    if seen.last() != Some(&value) {
        seen.push(value);
    }
}

fn is_finished(job: &serde_json::Value) -> bool {
    matches!(
        job["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

impl Drop for Bed {
    /// A run cut short (an error, a job that failed) leaves no job behind: a node's jobs
    /// outlive its daemon by design, so they are cancelled through the coordinator first.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some(jobs) = self.jobs() {
            let open: Vec<&serde_json::Value> = jobs.iter().filter(|j| !is_finished(j)).collect();
            if open.is_empty() || Instant::now() > deadline {
                break;
            }
            for j in open {
                if let Some(id) = j["id"].as_str() {
                    let _ = self
                        .govctl()
                        .args(["cancel", id])
                        .stdout(Stdio::null())
                        .status();
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        for d in &mut self.daemons {
            stop(d);
        }
        let _ = self.coordinator.kill();
        let _ = self.coordinator.wait();
    }
}

impl RealEnv {
    #[allow(clippy::too_many_arguments)]
    fn start_bed(
        &self,
        w: &Workload,
        node_policy: &str,
        placement: &str,
        nodes: usize,
        dir: &Path,
        extra_config: &[String],
    ) -> Result<Bed> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < nodes {
            bail!("{nodes} nodes need at least {nodes} CPUs; this machine has {cpus}");
        }
        let port = cmd::free_port()?;
        let address = format!("127.0.0.1:{port}");
        let log = fs::File::create(dir.join("coordinator.log"))?;
        // Moves as govsim's cluster runs them (`sim/src/cluster/driver.rs`): a node's request
        // acted on at once, each job moved at most once, no payoff gate (a policy's own rules,
        // not the coordinator's safeguards, are what is compared).
        let coordinator_config = dir.join("coordinator.toml");
        let mut state = String::from(
            "[state]
move_after_s = 0.0
move_cooldown_s = 0.0
move_payoff = 0.0
max_auto_moves = 1
",
        );
        for line in &w.coordinator_state {
            state.push_str(line);
            state.push('\n');
        }
        fs::write(&coordinator_config, state)?;
        let coordinator = Command::new(self.governor.with_file_name("coordinator"))
            .arg("--config")
            .arg(&coordinator_config)
            .args(["--insecure", "--lost-after", "10", "--policy", placement])
            .arg("--listen")
            .arg(&address)
            .arg("--store")
            .arg(dir.join("coordinator.redb"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start the coordinator (cargo build --release -p coordinator)")?;
        let mut bed = Bed {
            coordinator,
            daemons: Vec::new(),
            address,
            govctl: self.governor.with_file_name("govctl"),
        };
        for k in 0..nodes {
            let nd = dir.join(format!("node{}", k + 1));
            fs::create_dir_all(nd.join("jobs.d"))?;
            let range = node_cpus(k, nodes, cpus);
            let mut text = format!(
                "jobs_dir = \"{d}/jobs.d\"\nstate_file = \"{d}/state.json\"\nsocket = \"{s}\"\npolicy = \"{node_policy}\"\n",
                d = nd.display(),
                s = super::round::socket_path(&nd).display()
            );
            for line in extra_config {
                text.push_str(line);
                text.push('\n');
            }
            text.push_str(&format!(
                "[node]\nname = \"node{}\"\ncores = {}\n[discovery]\nenvironment = false\n\
                 [coordinator]\naddress = \"{}\"\ninsecure = true\nallow_root_jobs = true\njob_output_dir = \"{}\"\n",
                k + 1,
                range.len(),
                bed.address,
                nd.join("job-output").display()
            ));
            let config = nd.join("governor.toml");
            fs::write(&config, text)?;
            let log = fs::File::create(nd.join("daemon.log"))?;
            let cpu_list = format!("{}-{}", range.start, range.end - 1);
            let child = Command::new("taskset")
                .args(["-c", &cpu_list])
                .arg(&self.governor)
                .arg("daemon")
                .arg("--config")
                .arg(&config)
                .env("GOVERNOR_LOG_LEVEL", "governor=info")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("cannot start a node daemon")?;
            bed.daemons.push(child);
        }
        // Every node registered.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = bed
                .govctl()
                .args(["--json", "nodes"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
                .and_then(|v| v.as_array().map(|a| a.len()))
                .unwrap_or(0);
            if ready >= nodes {
                return Ok(bed);
            }
            // A daemon that exits at its start (a bad configuration) is reported as such, with
            // its last words, not as a node that did not register in time.
            for (k, d) in bed.daemons.iter_mut().enumerate() {
                if let Some(status) = d.try_wait()? {
                    let log = dir.join(format!("node{}/daemon.log", k + 1));
                    let last = fs::read_to_string(&log)
                        .ok()
                        .and_then(|t| t.lines().last().map(str::to_owned))
                        .unwrap_or_default();
                    bail!(
                        "node{}'s daemon exited at its start ({status}): {last} (see {})",
                        k + 1,
                        log.display()
                    );
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{ready} of {nodes} nodes registered within 30 s; see {}",
                    dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One run of workload `w` under `policy` (`NODE/PLACEMENT`) on `nodes` nodes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_cluster_once(
        &self,
        w: &Workload,
        policy: &str,
        sizes: Sizes,
        rep: u32,
        dir: &Path,
        nodes: usize,
        extra_config: &[String],
    ) -> Result<RunResult> {
        let (node_policy, placement) = cluster_spec(policy)?;
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir)?;
        // The nodes take absolute paths only (a job's log, its checkpoint).
        let dir = &fs::canonicalize(dir)?;
        let slices_before = super::round::governor_slices();
        let result = self
            .start_bed(w, &node_policy, &placement, nodes, dir, extra_config)
            .and_then(|mut bed| self.drive_cluster(w, policy, sizes, rep, dir, &mut bed));
        remove_new_empty_slices(&slices_before);
        let r = result?;
        fs::write(dir.join("run.json"), serde_json::to_string_pretty(&r)?)?;
        Ok(r)
    }

    fn submit(&self, bed: &Bed, j: &JobPlan, sizes: Sizes, dir: &Path) -> Result<()> {
        let script = match j.framework {
            Framework::Keras => "train_keras.py",
            Framework::Sklearn => bail!("cluster workloads run Keras jobs"),
        };
        let log = dir.join(format!("{}.log", j.name));
        let checkpoint = dir.join(format!("{}.ckpt", j.name));
        let mut c = bed.govctl();
        // The progress signal is the validation loss, the one time to quality is measured on:
        // the training loss of these small models keeps falling by more than SpeCon's 1% an
        // interval long after they stopped generalising better, so SpeCon never saw one
        // converge on it (measured 2026-11-30).
        c.args([
            "submit", "--name", &j.name, "--user", "root", "--metric", "val_loss",
        ])
        .arg("--log")
        .arg(&log)
        .arg("--checkpoint-dir")
        .arg(&checkpoint);
        if sizes == Sizes::Known {
            c.args(["--epochs", &j.epochs.to_string()]);
        }
        if let Some((least, most)) = j.elastic {
            c.args(["--cores", &format!("{least}:{most}")]);
        }
        c.arg("--")
            .args(self.training_argv(j, script, dir))
            .arg("--checkpoint-dir")
            .arg(&checkpoint);
        cmd::output(&mut c).map(|_| ())
    }

    fn drive_cluster(
        &self,
        w: &Workload,
        policy: &str,
        sizes: Sizes,
        rep: u32,
        dir: &Path,
        bed: &mut Bed,
    ) -> Result<RunResult> {
        let mut schedule = Schedule::start(w);
        let wall0 = schedule.wall0;
        let mut submitted: BTreeMap<String, f64> = BTreeMap::new();
        let mut finished: BTreeMap<String, (String, f64)> = BTreeMap::new();
        let mut placements: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // Each job's sizes in cores as the coordinator reported them (an elastic job's resizes).
        let mut sizes_seen: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut status_log = fs::File::create(dir.join("status.jsonl"))?;
        let mut next_status = 0.0;
        loop {
            let now = schedule.now();
            while let Some(j) = schedule.next_due(now) {
                submitted.insert(j.name.clone(), unix_now() - wall0);
                self.submit(bed, j, sizes, dir)
                    .with_context(|| format!("submitting {}", j.name))?;
            }
            if now >= next_status {
                next_status = now + 1.0;
                if let Some(jobs) = bed.jobs() {
                    use std::io::Write as _;
                    let _ = writeln!(
                        status_log,
                        "{{\"t\":{now:.2},\"jobs\":{}}}",
                        serde_json::Value::Array(jobs.clone())
                    );
                    for j in &jobs {
                        let name = j["name"].as_str().unwrap_or_default().to_owned();
                        if let Some(node) = j["members"][0]["node"].as_str()
                            && !node.is_empty()
                        {
                            push_change(
                                placements.entry(name.clone()).or_default(),
                                node.to_owned(),
                            );
                        }
                        if let Some(cores) = j["cores"].as_f64()
                            && j["status"].as_str() == Some("running")
                        {
                            push_change(sizes_seen.entry(name.clone()).or_default(), cores);
                        }
                        let status = j["status"].as_str().unwrap_or_default();
                        if is_finished(j) {
                            let end = j["finished_at_unix"].as_f64().unwrap_or(wall0 + now);
                            finished
                                .entry(name)
                                .or_insert((status.to_owned(), end - wall0));
                        }
                    }
                }
            }
            if schedule.all_submitted() && finished.len() >= w.jobs.len() {
                break;
            }
            for (k, d) in bed.daemons.iter_mut().enumerate() {
                if let Some(status) = d.try_wait()? {
                    bail!(
                        "node{}'s daemon exited during the run ({status}); see {}",
                        k + 1,
                        dir.join(format!("node{}/daemon.log", k + 1)).display()
                    );
                }
            }
            if schedule.past_limit() {
                bail!("the workload did not finish within {:?}", Schedule::LIMIT);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut jobs = Vec::new();
        let mut makespan: f64 = 0.0;
        for j in &w.jobs {
            let submitted_at = submitted[&j.name];
            let (status, coordinator_end) = finished[&j.name].clone();
            let summary = read_summary(dir, &j.name);
            // The job's own clock at its exit; the coordinator's (a report later) otherwise.
            let end = summary
                .as_ref()
                .and_then(|s| s["ended_at"].as_f64())
                .map_or(coordinator_end, |t| t - wall0);
            let moved = placements
                .get(&j.name)
                .map_or(0, |p| p.len().saturating_sub(1));
            makespan = makespan.max(end);
            jobs.push(JobResult {
                // A moved job's summary covers its last stretch only.
                cpu_seconds: summary
                    .as_ref()
                    .filter(|_| moved == 0)
                    .and_then(|s| s["cpu_seconds"].as_f64()),
                ..job_result(
                    dir,
                    &j.name,
                    wall0,
                    submitted_at,
                    end - submitted_at,
                    status == "completed",
                )
            });
        }
        fs::write(
            dir.join("placements.json"),
            serde_json::to_string_pretty(&placements)?,
        )?;
        fs::write(
            dir.join("sizes.json"),
            serde_json::to_string_pretty(&sizes_seen)?,
        )?;
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

/// Where each run's jobs ran (`placements.json`): the jobs of each node, and the moves.
pub(super) fn placements_md(out: &Path, w: &Workload, policies: &[String], sizes: Sizes) -> String {
    use std::fmt::Write as _;
    let mut md = String::from(
        "\nWhere the jobs ran (each node's jobs in arrival order; a move as `job: from → to`; an \
         elastic job's sizes in cores as the coordinator reported them, `job: 2 → 1 → 2`):\n\n\
         | policy | rep | nodes | moves | sizes |\n| --- | ---: | --- | --- | --- |\n",
    );
    let arrival: Vec<&str> = {
        let mut jobs: Vec<&JobPlan> = w.jobs.iter().collect();
        jobs.sort_by(|a, b| a.at.total_cmp(&b.at));
        jobs.iter().map(|j| j.name.as_str()).collect()
    };
    for policy in policies {
        for rep in 1..=50 {
            let dir = super::run_dir(out, w, policy, sizes, rep);
            let Ok(text) = fs::read_to_string(dir.join("placements.json")) else {
                continue;
            };
            let Ok(placed) = serde_json::from_str::<BTreeMap<String, Vec<String>>>(&text) else {
                continue;
            };
            let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for job in &arrival {
                if let Some(first) = placed.get(*job).and_then(|p| p.first()) {
                    by_node.entry(first).or_default().push(job);
                }
            }
            let nodes: Vec<String> = by_node
                .iter()
                .map(|(n, jobs)| format!("{n}: {}", jobs.join(", ")))
                .collect();
            let moves: Vec<String> = placed
                .iter()
                .filter(|(_, p)| p.len() > 1)
                .map(|(j, p)| format!("{j}: {}", p.join(" → ")))
                .collect();
            let sizes: Vec<String> = fs::read_to_string(dir.join("sizes.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<BTreeMap<String, Vec<f64>>>(&t).ok())
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, s)| s.len() > 1)
                .map(|(j, s)| {
                    let s: Vec<String> = s.iter().map(|c| format!("{c}")).collect();
                    format!("{j}: {}", s.join(" → "))
                })
                .collect();
            let or_dash = |v: Vec<String>| {
                if v.is_empty() {
                    "-".to_owned()
                } else {
                    v.join("; ")
                }
            };
            let _ = writeln!(
                md,
                "| {policy} | {rep} | {} | {} | {} |",
                nodes.join("; "),
                or_dash(moves),
                or_dash(sizes)
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_is_spread_with_default_shares_and_others_name_both_halves() {
        assert_eq!(
            cluster_spec("fair").unwrap(),
            ("fair".to_owned(), "spread".to_owned())
        );
        assert_eq!(
            cluster_spec("specon/specon").unwrap(),
            ("specon".to_owned(), "specon".to_owned())
        );
        assert_eq!(
            cluster_spec("specon:interval=5/specon").unwrap(),
            ("specon:interval=5".to_owned(), "specon".to_owned())
        );
        assert!(cluster_spec("procon").is_err(), "no placement named");
    }

    #[test]
    fn a_schedule_hands_out_each_job_once_in_arrival_order_when_due() {
        let w = Workload {
            name: "w".into(),
            about: String::new(),
            jobs: vec![
                job("late", 5.0, Framework::Keras, 3, &[]),
                job("early", 1.0, Framework::Keras, 3, &[]),
                job("mid", 2.0, Framework::Keras, 3, &[]),
            ],
            coordinator_state: Vec::new(),
        };
        let mut s = Schedule::start(&w);
        assert!(s.next_due(0.5).is_none());
        let due: Vec<&str> = std::iter::from_fn(|| s.next_due(2.0))
            .map(|j| j.name.as_str())
            .collect();
        assert_eq!(due, ["early", "mid"]);
        assert!(!s.all_submitted());
        assert_eq!(s.next_due(10.0).map(|j| j.name.as_str()), Some("late"));
        assert!(s.all_submitted() && s.next_due(10.0).is_none());
    }

    #[test]
    fn the_elastic_workload_exists_only_where_a_node_has_cores_to_grow_into() {
        let probe = Probe {
            epoch_seconds: [(WIDE_CNN.to_owned(), 0.5)].into(),
        };
        let elastic = |nodes, cores| {
            workloads(&probe, nodes, cores)
                .into_iter()
                .find(|w| w.name == "elastic")
        };
        assert!(
            elastic(2, 1).is_none(),
            "one-core nodes: nothing to grow into"
        );
        let w = elastic(1, 2).expect("one node of two cores");
        assert_eq!(w.jobs.len(), 4);
        assert!(w.jobs.iter().all(|j| j.elastic == Some((1, 2))));
        assert!(
            w.jobs
                .iter()
                .all(|j| j.args.windows(2).any(|a| a == ["--threads", "env"])),
            "each job runs as many threads as the coordinator gives it"
        );
        assert!(w.jobs.iter().all(|j| (0.0..=15.0).contains(&j.at)));
        // 24-40 s alone at 0.5 s an epoch, whatever this machine's speed.
        let epochs: Vec<u32> = w.jobs.iter().map(|j| j.epochs).collect();
        assert_eq!(epochs, [64, 48, 80, 56]);
        assert_eq!(elastic(1, 4).unwrap().jobs[0].elastic, Some((1, 4)));
        assert!(
            w.coordinator_state
                .iter()
                .any(|l| l.starts_with("resize_min_run_s")),
            "resizes timed to these short jobs"
        );
    }

    #[test]
    fn nodes_get_disjoint_cpus() {
        assert_eq!(node_cpus(0, 2, 2), 0..1);
        assert_eq!(node_cpus(1, 2, 2), 1..2);
        assert_eq!(node_cpus(1, 2, 5), 2..4);
    }

    #[test]
    fn workloads_scale_with_the_measured_epoch() {
        let fast = Probe {
            epoch_seconds: [("digits_cnn".to_owned(), 0.5)].into(),
        };
        let slow = Probe {
            epoch_seconds: [("digits_cnn".to_owned(), 1.5)].into(),
        };
        let (f, s) = (&workloads(&fast, 2, 1)[0], &workloads(&slow, 2, 1)[0]);
        assert_eq!(
            f.jobs.len(),
            8,
            "3.75 jobs per node, as the paper's 15 on 4"
        );
        // A job of ~20 s alone, whatever an epoch costs.
        assert_eq!(f.jobs[0].epochs, 40);
        assert_eq!(s.jobs[0].epochs, 13);
        assert!(
            (f.jobs[1].at - 0.8).abs() < 1e-9 && (s.jobs[1].at - 0.8).abs() < 1e-9,
            "one every 4% of a job"
        );
    }

    #[test]
    fn the_flowcon_workload_has_five_jobs_per_node_within_its_window() {
        let probe = Probe {
            epoch_seconds: [
                ("digits".to_owned(), 0.5),
                ("digits_cnn".to_owned(), 0.5),
                ("teacher".to_owned(), 0.5),
            ]
            .into(),
        };
        let w = workloads(&probe, 2, 1)
            .into_iter()
            .find(|w| w.name == "flowcon")
            .unwrap();
        assert_eq!(w.jobs.len(), 10);
        assert!(w.jobs.iter().all(|j| (0.0..=17.0).contains(&j.at)));
        let names: std::collections::BTreeSet<&str> =
            w.jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names.len(), 10, "unique names");
        assert_eq!(
            w.jobs.iter().map(|j| j.epochs).collect::<Vec<_>>()[..3],
            [24, 40, 56]
        );
    }
}
