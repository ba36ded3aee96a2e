//! A stand-in for `governor daemon --coordinator ...` in the multi-node VM test, until the real
//! daemon exists: it runs the real [`NodeAgent`] (the library the daemon embeds) and answers the
//! coordinator's start and stop commands by really starting and stopping processes, reporting
//! their CPU, memory, exit status and the progress values they print.
//!
//! It is deliberately simple and NOT the node policy: categories come from a crude rule on the
//! relative change of the progress value (more than 5% per record: progressing, more than 0.5%:
//! watching, otherwise converged), enough to see categories move in `govctl top`.
//!
//! TODO(daemon): `tests/tests/multinode.rs` switches to `$GOVERNOR_BIN_DIR/governor daemon` once it
//! takes `--coordinator`; then this file goes away.
//!
//! Usage: `node-agent-harness --coordinator HOST:PORT --name NODE (--certs DIR | --insecure)`.
//! Each job's stdout and stderr are appended to its log path; a value is read from any line
//! containing `METRIC=FLOAT` or `METRIC: FLOAT` (METRIC defaults to `loss`).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use governor::cluster::{
    AgentConfig, JobReport, NodeAgent, NodeCapacity, NodeCommand, NodeReport, RunState, StartJob,
    TlsFiles, WireCategory,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::{mpsc, watch};

struct Job {
    start: StartJob,
    child: Option<Child>,
    report: JobReport,
    offset: u64,
    values: Vec<(Instant, f64)>,
    cpu: Option<(Instant, f64)>,
    ended_at: Option<Instant>,
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn memory_total() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn rss_bytes(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .unwrap_or(0)
        * 4096
}

fn parse_value(line: &str, metric: &str) -> Option<f64> {
    for sep in ["=", ": ", ":"] {
        let key = format!("{metric}{sep}");
        if let Some(i) = line.find(&key) {
            let rest = &line[i + key.len()..];
            let num: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | 'e' | 'E' | '+'))
                .collect();
            if let Ok(v) = num.parse::<f64>()
                && v.is_finite()
            {
                return Some(v);
            }
        }
    }
    None
}

fn start(s: &StartJob) -> Result<Child, String> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&s.log_path)
        .map_err(|e| format!("cannot open the log {}: {e}", s.log_path))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut c = Command::new(&s.argv[0]);
    c.args(&s.argv[1..])
        .envs(&s.env)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .process_group(0);
    if !s.gpu_indices.is_empty() {
        let list: Vec<String> = s.gpu_indices.iter().map(u32::to_string).collect();
        c.env("CUDA_VISIBLE_DEVICES", list.join(","));
    }
    c.spawn().map_err(|e| format!("cannot start {:?}: {e}", s.argv[0]))
}

impl Job {
    fn sample(&mut self, now: Instant) {
        // Exit status.
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            self.report.state = RunState::Exited;
            self.report.exit_code = Some(status.code().unwrap_or(-1));
            self.report.cpu_cores = 0.0;
            self.child = None;
            self.ended_at = Some(now);
        }
        if let Some(child) = &self.child {
            let pid = child.id();
            if let Some(cpu) = cpu_seconds(pid) {
                if let Some((t, prev)) = self.cpu {
                    let dt = now.duration_since(t).as_secs_f64();
                    if dt > 0.0 {
                        self.report.cpu_cores = ((cpu - prev) / dt).max(0.0);
                    }
                }
                self.cpu = Some((now, cpu));
            }
            self.report.memory_bytes = rss_bytes(pid);
        }
        // New log lines.
        let metric = if self.start.metric.is_empty() {
            "loss"
        } else {
            &self.start.metric
        };
        if let Ok(mut f) = fs::File::open(&self.start.log_path)
            && f.seek(SeekFrom::Start(self.offset)).is_ok()
        {
            let mut text = String::new();
            if f.read_to_string(&mut text).is_ok() {
                let complete = text.rfind('\n').map_or(0, |i| i + 1);
                self.offset += complete as u64;
                for line in text[..complete].lines() {
                    if let Some(v) = parse_value(line, metric) {
                        self.values.push((now, v));
                    }
                }
            }
        }
        let n = self.values.len();
        if let Some(&(_, last)) = self.values.last() {
            self.report.progress = Some(last);
        }
        if n >= 2 {
            let (t1, v1) = self.values[n - 2];
            let (t2, v2) = self.values[n - 1];
            let dt = t2.duration_since(t1).as_secs_f64().max(1e-3);
            let growth = (v2 - v1).abs() / dt;
            self.report.growth = Some(growth);
            self.report.growth_efficiency = Some(growth / self.report.cpu_cores.max(0.01));
        }
        if n >= 3 {
            let (_, prev) = self.values[n - 2];
            let (_, last) = self.values[n - 1];
            let rel = (last - prev).abs() / prev.abs().max(1e-9);
            self.report.category = if rel > 0.05 {
                WireCategory::Progressing
            } else if rel > 0.005 {
                WireCategory::Watching
            } else {
                WireCategory::Converged
            };
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let coordinator = arg(&args, "--coordinator").expect("--coordinator HOST:PORT");
    let name = arg(&args, "--name").expect("--name NODE");
    let cores = arg(&args, "--cores")
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()) as f64);
    let mut config = AgentConfig::new(
        coordinator,
        name.clone(),
        NodeCapacity::cpu_only(cores, memory_total()),
    );
    config.agent_version = "node-agent-harness".into();
    if !args.iter().any(|a| a == "--insecure") {
        let dir = PathBuf::from(arg(&args, "--certs").expect("--certs DIR or --insecure"));
        config.tls = Some(TlsFiles::in_dir(&dir, &name));
    }
    config.validate().expect("valid agent configuration");
    let (report_tx, report_rx) = watch::channel(NodeReport::default());
    let (cmd_tx, mut cmd_rx) = mpsc::channel(64);
    let _agent = NodeAgent::spawn(config, report_rx, cmd_tx);
    eprintln!("node-agent-harness: node {name} up");

    let mut jobs: BTreeMap<String, Job> = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            cmd = cmd_rx.recv() => match cmd {
                Some(NodeCommand::Start(s)) => {
                    if jobs.contains_key(&s.job_id) {
                        continue; // idempotent
                    }
                    eprintln!("node-agent-harness: start {} {:?}", s.job_id, s.argv);
                    let mut report = JobReport::running(&s.job_id, &s.name);
                    report.replica = s.replica;
                    report.gpu_indices = s.gpu_indices.clone();
                    let child = match start(&s) {
                        Ok(c) => Some(c),
                        Err(e) => {
                            report.state = RunState::Failed;
                            report.message = e;
                            None
                        }
                    };
                    let ended_at = child.is_none().then(Instant::now);
                    jobs.insert(s.job_id.clone(), Job { start: s, child, report, offset: 0, values: Vec::new(), cpu: None, ended_at });
                }
                Some(NodeCommand::Stop(s)) => {
                    if let Some(job) = jobs.get_mut(&s.job_id)
                        && let Some(mut child) = job.child.take()
                    {
                        eprintln!("node-agent-harness: stop {}: {}", s.job_id, s.reason);
                        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                        let _ = child.wait();
                        job.report.state = RunState::Failed;
                        job.report.message = format!("stopped by the coordinator: {}", s.reason);
                        job.ended_at = Some(Instant::now());
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                let now = Instant::now();
                jobs.retain(|_, j| j.ended_at.is_none_or(|t| now.duration_since(t) < Duration::from_secs(60)));
                for j in jobs.values_mut() {
                    j.sample(now);
                }
                let report = NodeReport {
                    cpu_used_cores: jobs.values().map(|j| j.report.cpu_cores).sum(),
                    memory_used_bytes: jobs.values().map(|j| j.report.memory_bytes).sum(),
                    jobs: jobs.values().map(|j| j.report.clone()).collect(),
                    ..NodeReport::default()
                };
                report_tx.send_replace(report);
            }
        }
    }
}
